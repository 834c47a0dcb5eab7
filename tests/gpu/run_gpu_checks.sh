#!/usr/bin/env bash
# The GPU checks in one run: build ronde with NCCL against the machine's own
# CUDA LibTorch, run the GPU suite (tests/gpu), then the CUDA benchmarks:
# plain LibTorch training against DistributedOptimizer at world size 1
# (target: at most 2% step-time overhead), and the bucket pack/unpack
# throughput against a device-to-device copy of the same bytes (target: at
# least 80%). Logs, JSON and summary.json go to --out.
#
#   tests/gpu/run_gpu_checks.sh [--python PY] [--deps DIR] [--build DIR]
#                               [--out DIR] [--build-only] [--jobs N]
#
#   --python  interpreter whose torch (a CUDA build) provides LibTorch
#             (default: $RONDE_PYTHON, else python3)
#   --deps    a folder from tests/gpu/fetch_deps.sh, for a machine without
#             the system Gloo and GoogleTest
#   --build-only  configure and build, then run the suite (which skips
#             without a device) and stop: the compile-and-link check of the
#             NCCL path on a machine without a GPU
#
# On a machine without a GPU the suite skips and the benchmarks are not run.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${RONDE_PYTHON:-python3}
deps=""
build=$root/build-gpu
out=""
build_only=0
jobs=$(nproc)
while [[ $# -gt 0 ]]; do
  case $1 in
    --python) py=$2; shift 2 ;;
    --deps) deps=$(cd "$2" && pwd); shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    *) echo "run_gpu_checks.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
out=${out:-$build/checks}
mkdir -p "$out"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$out/steps.log"; }

log "torch: $("$py" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv \
  > "$out/nvidia-smi.txt" 2>&1 || true

cmake_args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
  -DRONDE_PYTHON="$py" -DRONDE_WITH_NCCL=ON -DRONDE_BUILD_EXAMPLES=OFF
  -DRONDE_BUILD_PYTHON=OFF -DRONDE_BUILD_BENCHMARKS=ON -DRONDE_BUILD_TESTS=ON)
# A compiler-only CUDA toolkit has no libnvrtc, which LibTorch's CMake
# config asks for: take the one from the nvidia wheels beside torch.
nvrtc=$("$py" - <<'PY'
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
for p in nvidia.__path__:
    for f in sorted(glob.glob(os.path.join(p, "*", "lib", "libnvrtc.so.*"))):
        print(f)
        raise SystemExit
PY
)
# LibTorch before 2.14 finds CUDA through CMake's old FindCUDA, which takes
# the toolkit's root from where `nvcc` is on the PATH: a wrapper script in
# /usr/local/bin then points it at /usr/local. Name the root: $CUDA_HOME,
# /usr/local/cuda, or where nvcc itself says it lives.
cuda_root=${CUDA_HOME:-/usr/local/cuda}
if [[ ! -x $cuda_root/bin/nvcc ]] && command -v nvcc > /dev/null; then
  top=$(nvcc --dryrun -c -x cu /dev/null -o /dev/null 2>&1 \
    | sed -n 's/^#\$ TOP=//p' | head -1) || true
  if [[ -n $top && -d $top ]]; then cuda_root=$(cd "$top" && pwd); fi
fi
if [[ -x $cuda_root/bin/nvcc ]]; then
  cmake_args+=(-DCUDA_TOOLKIT_ROOT_DIR="$cuda_root"
    -DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc")
fi
if [[ -n $nvrtc ]] && ! compgen -G "$cuda_root/lib64/libnvrtc.so*" > /dev/null; then
  cmake_args+=(-DCUDA_nvrtc_LIBRARY="$nvrtc")
fi
if [[ -n $deps ]]; then
  # Debian's Gloo names its library by absolute path: point it at the copy.
  sed -i "s|\"/usr/lib/libgloo|\"$deps/usr/lib/libgloo|g" \
    "$deps"/usr/share/cmake/Gloo/GlooTargets-*.cmake
  cmake_args+=(-DCMAKE_PREFIX_PATH="$deps/usr"
    -DZLIB_ROOT="$deps/usr")
  export LD_LIBRARY_PATH="$deps/usr/lib:$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
log "configure"
cmake "${cmake_args[@]}" > "$out/configure.log" 2>&1 \
  || { tail -40 "$out/configure.log"; exit 1; }
log "build"
targets=(ronde ronde_gloo ronderun ronde_gpu_worker ronde_gpu_tests
  train_bench pack_bench)
cmake --build "$build" -j"$jobs" --target "${targets[@]}" \
  > "$out/build.log" 2>&1 || { grep -m20 -B2 -A8 "error" "$out/build.log"; exit 1; }
log "built: $(ls "$build/bin" | tr '\n' ' ')"

log "GPU suite"
suite_rc=0
(cd "$build" && "$build/bin/ronde_gpu_tests" \
    --gtest_output=json:"$out/gpu_tests.json") > "$out/gpu_tests.log" 2>&1 \
  || suite_rc=$?
tail -5 "$out/gpu_tests.log" | tee -a "$out/steps.log"
if [[ $build_only == 1 ]]; then
  log "build only: done (suite exit $suite_rc)"
  exit $suite_rc
fi
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  log "no CUDA device: benchmarks not run"
  exit $suite_rc
fi

log "train benchmark: plain LibTorch vs DistributedOptimizer (NCCL, 1 rank)"
export RONDE_CUDA_BACKEND=nccl
for round in 1 2 3; do
  for workload in mlp cnn; do
    batch=$([[ $workload == mlp ]] && echo 256 || echo 128)
    for mode in local ronde; do
      "$build/bin/train_bench" --device cuda --workload $workload \
        --mode $mode --batch $batch --steps 20 --warmup 10 --windows 7 \
        --json "$out/train_${workload}_${mode}_${round}.json" \
        >> "$out/train.log" 2>&1
    done
  done
done
tail -12 "$out/train.log" | tee -a "$out/steps.log"

log "pack benchmark"
for mb in 25 256; do
  "$build/bin/pack_bench" --device cuda --mb $mb --repeats 21 \
    --json "$out/pack_${mb}mb.json" | tee -a "$out/steps.log"
done

"$py" - "$out" "$suite_rc" <<'PY' | tee -a "$out/steps.log"
import glob, json, os, statistics, sys
out, suite_rc = sys.argv[1], int(sys.argv[2])
summary = {"gpu_suite_exit": suite_rc, "train": {}, "pack": {}}
for workload in ("mlp", "cnn"):
    step = {}
    for mode in ("local", "ronde"):
        runs = [json.load(open(f))["step_s"] for f in
                sorted(glob.glob(os.path.join(out, f"train_{workload}_{mode}_*.json")))]
        step[mode] = statistics.median(runs) if runs else None
    if step["local"] and step["ronde"]:
        summary["train"][workload] = {
            "local_step_ms": step["local"] * 1e3,
            "ronde_step_ms": step["ronde"] * 1e3,
            "overhead": step["ronde"] / step["local"] - 1,
            "target_max_overhead": 0.02}
for f in sorted(glob.glob(os.path.join(out, "pack_*mb.json"))):
    r = json.load(open(f))
    summary["pack"][os.path.basename(f)[5:-5]] = {
        "copy_gb_s": r["copy_gb_s"], "pack_vs_copy": r["pack_vs_copy"],
        "unpack_vs_copy": r["unpack_vs_copy"], "target_min": 0.8}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
exit $suite_rc
