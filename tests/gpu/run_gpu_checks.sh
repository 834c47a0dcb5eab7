#!/usr/bin/env bash
# The GPU checks in one run: build ronde with NCCL against the machine's own
# CUDA LibTorch, run the CUDA benchmarks: plain LibTorch training against
# DistributedOptimizer at world size 1 (target: at most 2% step-time
# overhead; one more run writes a timeline), and the bucket pack/unpack
# throughput against a device-to-device copy of the same bytes (target: at
# least 80%); then the GPU suite (tests/gpu) in the time left.
#
# --out gets four files, whatever happens: steps.log (what ran, with times
# and the results), gpu_tests.log (the suite's output), summary.json, and
# logs.tar.gz (every log and JSON file, refreshed after each phase, so that
# a run stopped from outside still brings back what it did).
#
#   tests/gpu/run_gpu_checks.sh [--python PY] [--deps DIR] [--build DIR]
#                               [--out DIR] [--build-only] [--jobs N]
#                               [--shards N] [--suite-seconds S]
#                               [--bench-seconds S]
#
#   --python  interpreter whose torch (a CUDA build) provides LibTorch
#             (default: $RONDE_PYTHON, else python3)
#   --deps    a folder from tests/gpu/fetch_deps.sh, for a machine without
#             the system Gloo and GoogleTest
#   --build-only  configure and build, then run the suite (which skips
#             without a device) and stop: the compile-and-link check of the
#             NCCL path on a machine without a GPU
#   --shards  run the suite as N processes at once (default 4; the tests
#             spawn their own ranks, each on a free port)
#   --suite-seconds  stop the suite after S seconds (default 240), so that
#             the run ends in a known time; a stopped shard is reported
#   --bench-seconds  time for all the benchmarks (default 150); runs that
#             would start later are skipped, and each run gets at most 60 s
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
shards=4
suite_seconds=240
bench_seconds=150
while [[ $# -gt 0 ]]; do
  case $1 in
    --python) py=$2; shift 2 ;;
    --deps) deps=$(cd "$2" && pwd); shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --suite-seconds) suite_seconds=$2; shift 2 ;;
    --bench-seconds) bench_seconds=$2; shift 2 ;;
    *) echo "run_gpu_checks.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
out=${out:-$build/checks}
mkdir -p "$out" "$build"
out=$(cd "$out" && pwd)
build=$(cd "$build" && pwd)
# Every detailed file goes to $work; $out keeps the four files above.
work=$build/check-logs
rm -rf "$work"
mkdir -p "$work"
: > "$out/steps.log"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$out/steps.log"; }
bundle() {
  cp "$out/steps.log" "$work/" 2>/dev/null || true
  tar -czf "$out/logs.tar.gz.part" -C "$work" . 2>/dev/null \
    && mv "$out/logs.tar.gz.part" "$out/logs.tar.gz"
}
trap bundle EXIT

py=$(command -v "$py")
# Python runs with the library path it was given, not the one below that
# adds the deps folder.
base_ld=${LD_LIBRARY_PATH:-}
pyrun() { LD_LIBRARY_PATH=$base_ld "$py" "$@"; }
log "torch: $(pyrun -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())')"
log "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader 2>&1 | head -1 || true)"

torch_cmake=$(pyrun -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cmake_args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
  -DTorch_DIR="$torch_cmake/Torch"
  -DRONDE_PYTHON="$py" -DRONDE_WITH_NCCL=ON -DRONDE_BUILD_EXAMPLES=OFF
  -DRONDE_BUILD_PYTHON=OFF -DRONDE_BUILD_BENCHMARKS=ON -DRONDE_BUILD_TESTS=ON
  # CMake 4 refuses package files that ask for policies older than 3.5
  # (some of Debian's do); earlier CMake ignores this.
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5)
# Ninja where there is one (it overlaps the targets' compilations); a build
# directory keeps the generator it was made with.
if command -v ninja > /dev/null && [[ ! -f $build/CMakeCache.txt ]]; then
  cmake_args+=(-G Ninja)
fi
# A compiler-only CUDA toolkit has no libnvrtc, which LibTorch's CMake
# config asks for: take the one from the nvidia wheels beside torch.
nvrtc=$(pyrun - <<'PY'
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
  # Debian's Gloo names its library by absolute path: point it at the copy
  # (also when an earlier run pointed it at the folder somewhere else).
  sed -i -E "s|\"[^\"]*/usr/lib/libgloo|\"$deps/usr/lib/libgloo|g" \
    "$deps"/usr/share/cmake/Gloo/GlooTargets-*.cmake
  cmake_args+=(-DCMAKE_PREFIX_PATH="$deps/usr"
    -DZLIB_ROOT="$deps/usr")
fi
log "configure"
# Configure runs Python (torch's and NCCL's paths): with the plain path.
cmake "${cmake_args[@]}" > "$work/configure.log" 2>&1 \
  || { log "configure failed"; tail -40 "$work/configure.log"; exit 1; }
if [[ -n $deps ]]; then
  # Linking and running need the folder's libraries (Gloo and its own).
  export LD_LIBRARY_PATH="$deps/usr/lib:$deps/usr/lib/x86_64-linux-gnu${base_ld:+:$base_ld}"
fi
log "build"
targets=(ronde ronde_gloo ronderun ronde_gpu_worker ronde_gpu_tests
  train_bench pack_bench)
cmake --build "$build" -j"$jobs" --target "${targets[@]}" \
  > "$work/build.log" 2>&1 || {
  log "build failed"
  grep -m20 -B2 -A8 "error" "$work/build.log"
  exit 1
}
log "built: $(ls "$build/bin" | tr '\n' ' ')"
bundle

# The suite, as $shards gtest shards at once under --suite-seconds.
suite_rc=0
run_suite() {
  log "GPU suite: $shards shards at once, at most ${suite_seconds} s"
  local pids=() i rc
  for ((i = 0; i < shards; i++)); do
    (cd "$build" && GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i \
      timeout -k 10 "$suite_seconds" "$build/bin/ronde_gpu_tests" \
      --gtest_output=json:"$work/gpu_tests_$i.json") \
      > "$work/gpu_tests_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    if [[ $rc != 0 ]]; then
      suite_rc=$rc
      log "suite shard $i: exit $rc$([[ $rc == 124 || $rc == 137 ]] && echo ' (stopped at the time limit)')"
    fi
  done
  cat "$work"/gpu_tests_*.log > "$out/gpu_tests.log"
  grep -h -E '^\[  (PASSED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \]' \
    "$work"/gpu_tests_*.log | sort | uniq -c | tee -a "$out/steps.log" || true
  bundle
}
if [[ $build_only == 1 ]]; then
  run_suite
  log "build only: done (suite exit $suite_rc)"
  exit $suite_rc
fi
if ! pyrun -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  run_suite
  log "no CUDA device: benchmarks not run"
  exit $suite_rc
fi

# The benchmarks first: they are short and bounded, and the suite then
# gets the time that is left.
bench_deadline=$((SECONDS + bench_seconds))
# Seconds the next benchmark run may take (at most 60), or 0 once the
# benchmarks' time is used up.
bench_limit() {
  local left=$((bench_deadline - SECONDS))
  ((left > 60)) && left=60
  ((left > 0)) || left=0
  echo $left
}
# bench_run NAME COMMAND...: runs COMMAND within bench_limit, or skips it
# once the time is used up; a failure is logged under NAME, not fatal.
bench_run() {
  local name=$1 limit
  shift
  limit=$(bench_limit)
  if [[ $limit == 0 ]]; then
    log "$name: skipped (time used up)"
    return 0
  fi
  timeout -k 5 "$limit" "$@" || log "$name: exit $?"
}
log "train benchmark: plain LibTorch vs DistributedOptimizer (NCCL, 1 rank)"
export RONDE_CUDA_BACKEND=nccl
for round in 1 2 3; do
  for workload in mlp cnn; do
    batch=$([[ $workload == mlp ]] && echo 256 || echo 128)
    for mode in local ronde; do
      bench_run "train_bench $workload $mode round $round" \
        "$build/bin/train_bench" --device cuda --workload $workload \
        --mode $mode --batch $batch --steps 20 --warmup 10 --windows 7 \
        --json "$work/train_${workload}_${mode}_${round}.json" \
        >> "$work/train.log" 2>&1
    done
  done
  bundle
done
tail -12 "$work/train.log" | tee -a "$out/steps.log"

log "pack benchmark"
# The pack benchmark gets its own minute on top, so that slow training runs
# cannot crowd it out.
bench_deadline=$((bench_deadline + 60))
# 25 MB again with a 10-element tensor first: no segment after it starts on
# a 16-byte boundary, as in models with small odd-sized layers.
for run in 25 256 25odd; do
  mb=${run%odd}
  odd=()
  if [[ $run == *odd ]]; then odd=(--odd); fi
  bench_run "pack_bench $run MB" "$build/bin/pack_bench" --device cuda \
    --mb "$mb" "${odd[@]}" --repeats 21 \
    --json "$work/pack_${run}mb.json" >> "$work/pack.log" 2>&1
done
grep -h -A1 '^pack_bench on' "$work/pack.log" | tee -a "$out/steps.log" || true
# One more ronde run with the timeline on: where a step's host time goes.
bench_run "train_bench cnn ronde timeline" env \
  RONDE_TIMELINE="$work/timeline_cnn.json" "$build/bin/train_bench" \
  --device cuda --workload cnn --mode ronde --batch 128 --steps 20 \
  --warmup 10 --windows 2 >> "$work/train.log" 2>&1
bundle

run_suite

pyrun - "$work" "$suite_rc" <<'PY' | tee "$out/summary.json.part" >> "$out/steps.log"
import glob, json, os, statistics, sys
out, suite_rc = sys.argv[1], int(sys.argv[2])
suite = {"exit": suite_rc, "passed": 0, "failed": [], "skipped": 0,
         "shards_without_result": []}
for log in sorted(glob.glob(os.path.join(out, "gpu_tests_*.log"))):
    j = log[:-4] + ".json"
    if not os.path.exists(j):
        suite["shards_without_result"].append(os.path.basename(log))
        continue
    for ts in json.load(open(j)).get("testsuites", []):
        for t in ts.get("testsuite", []):
            name = ts["name"] + "." + t["name"]
            if t.get("failures"):
                suite["failed"].append(name)
            elif t.get("result") == "SKIPPED":
                suite["skipped"] += 1
            else:
                suite["passed"] += 1
summary = {"gpu_suite": suite, "train": {}, "pack": {}}
for workload in ("mlp", "cnn"):
    step, wait = {}, {}
    for mode in ("local", "ronde"):
        runs = [json.load(open(f)) for f in
                sorted(glob.glob(os.path.join(out, f"train_{workload}_{mode}_*.json")))]
        step[mode] = statistics.median(r["step_s"] for r in runs) if runs else None
        wait[mode] = statistics.median(r["wait_s"] for r in runs) if runs else None
    if step["local"] and step["ronde"]:
        summary["train"][workload] = {
            "local_step_ms": step["local"] * 1e3,
            "ronde_step_ms": step["ronde"] * 1e3,
            "overhead": step["ronde"] / step["local"] - 1,
            "ronde_host_wait_ms": wait["ronde"] * 1e3,
            "target_max_overhead": 0.02}
for f in sorted(glob.glob(os.path.join(out, "pack_*mb.json"))):
    r = json.load(open(f))
    summary["pack"][os.path.basename(f)[5:-5]] = {
        "copy_gb_s": r["copy_gb_s"], "pack_vs_copy": r["pack_vs_copy"],
        "unpack_vs_copy": r["unpack_vs_copy"],
        "engine_way": r.get("engine_way"),
        "whole_pack_vs_copy": r.get("whole_pack_vs_copy"),
        "whole_unpack_vs_copy": r.get("whole_unpack_vs_copy"),
        "foreach_pack_vs_copy": r.get("foreach_pack_vs_copy"),
        "foreach_unpack_vs_copy": r.get("foreach_unpack_vs_copy"),
        "target_min": 0.8}
print(json.dumps(summary, indent=1))
PY
mv "$out/summary.json.part" "$out/summary.json"
cat "$out/summary.json"
exit $suite_rc
