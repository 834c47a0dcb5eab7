#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang and runs each for a
# bounded time on its corpus (tests/fuzz/corpus/<target>, read only; new
# inputs go to the build directory). A crash, a leak, undefined behaviour,
# a timeout or an out-of-memory fails the run and leaves its input under
# <build>/artifacts/.
#
#   scripts/fuzz.sh [--seconds N] [--build DIR] [--python P] [target...]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SECONDS_EACH=60
BUILD=$ROOT/build-fuzz
PYTHON=${RONDE_VENV:-$ROOT/.venv}/bin/python
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    -*) echo "usage: scripts/fuzz.sh [--seconds N] [--build DIR] [--python P] [target...]" >&2; exit 2 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
ALL=(fuzz_descriptor fuzz_checkpoint_file fuzz_launch_env fuzz_idx fuzz_store_values)
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL[@]}")

for tool in clang clang++; do
  command -v "$tool" >/dev/null || {
    echo "scripts/fuzz.sh: $tool not found (Debian: apt-get install clang libclang-rt-14-dev)" >&2
    exit 1
  }
done
TORCH_PREFIX=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__))')

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT/tests/fuzz" -B "$BUILD" -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DTORCH_PREFIX="$TORCH_PREFIX" >/dev/null
fi
cmake --build "$BUILD" -j "${RONDE_JOBS:-2}" --target "${TARGETS[@]}"

mkdir -p "$BUILD/artifacts"
# LibTorch's c10 is not instrumented and keeps allocations for the process
# lifetime: leaks are looked for, those of its static state are not ours.
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
failed=()
for t in "${TARGETS[@]}"; do
  seeds=$ROOT/tests/fuzz/corpus/${t#fuzz_}
  found=$BUILD/corpus/${t#fuzz_}
  mkdir -p "$found"
  echo "[fuzz] $t for ${SECONDS_EACH} s (seeds: tests/fuzz/corpus/${t#fuzz_})" >&2
  if ! "$BUILD/$t" -max_total_time="$SECONDS_EACH" -timeout=10 \
      -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
      -artifact_prefix="$BUILD/artifacts/$t-" "$found" "$seeds" \
      >"$BUILD/$t.log" 2>&1; then
    failed+=("$t")
    tail -40 "$BUILD/$t.log" >&2
  else
    grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$BUILD/$t.log" |
      sed "s/^/[fuzz] $t: /" >&2 || true
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "[fuzz] failed: ${failed[*]} (inputs under $BUILD/artifacts/)" >&2
  exit 1
fi
echo "[fuzz] ${#TARGETS[@]} target(s) ran ${SECONDS_EACH} s each without a finding" >&2
