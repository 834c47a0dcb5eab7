#!/usr/bin/env bash
# One entry point for developers and CI: installs what ronde needs (Debian
# packages, a venv with the pinned LibTorch wheel), builds, and runs the
# example or the tests. Every step is skipped when already done.
#
#   scripts/dev.sh example   set up, build the library, ronderun and the
#                            example only, run it on 2 ranks
#   scripts/dev.sh test      set up, build, run the whole test suite
#   scripts/dev.sh setup     only install dependencies
#   scripts/dev.sh build     set up and build
#   scripts/dev.sh bench     set up, build, run the benchmark report
#                            (benchmarks/run_all.py; pass --quick for a smoke run)
#   scripts/dev.sh sanitize address|thread [ctest args]
#                            build the unit and multirank tests under
#                            AddressSanitizer (+UBSan) or ThreadSanitizer in
#                            build-asan/ or build-tsan/ and run them
#   scripts/dev.sh fuzz [--seconds N] [target...]
#                            build the libFuzzer targets (tests/fuzz) with
#                            clang in build-fuzz/ and run each N seconds
#                            (default 60) on its corpus; see scripts/fuzz.sh
#   scripts/dev.sh cuda      compile and link the NCCL path: a second venv
#                            (.venv-cuda) with the CUDA build of torch, the
#                            CUDA toolkit at /usr/local/cuda, build-gpu/;
#                            runs the GPU suite, which skips without a GPU
#                            (tests/gpu/run_gpu_checks.sh; about 5.5 GB)
#   scripts/dev.sh format    format every C++ file with clang-format
#   scripts/dev.sh check-format
#                            fail on any C++ file clang-format would change
#   scripts/dev.sh check-commits
#                            fail on a commit subject over 72 characters
#   scripts/dev.sh ci        what CI runs (.ci/run): the commit and format
#                            checks, the CUDA compile and link, the build,
#                            ThreadSanitizer on the unit tests and the core
#                            multirank tests, and the test command
#   scripts/dev.sh ci-extra  what did not fit in CI's time: AddressSanitizer
#                            with UBSan on the same tests
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${RONDE_BUILD_DIR:-$ROOT/build}
VENV=${RONDE_VENV:-$ROOT/.venv}
JOBS=${RONDE_JOBS:-2}
TORCH_VERSION=2.13.0
# The CUDA build of torch the NCCL path is compiled against (scripts/dev.sh
# cuda); its wheel brings nccl.h and libnccl.
CUDA_VENV=${RONDE_CUDA_VENV:-$ROOT/.venv-cuda}
CUDA_TORCH_VERSION=2.14.1
SCIKIT_BUILD_CORE_VERSION=1.1.2
# ccache keys on paths relative to the checkout and not on the build
# directory, so that the pip build (in build-pip, beside build) reuses the
# CMake build's compilations.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}

# What configuring the build and running the example need.
APT_PACKAGES=(g++ cmake make ninja-build ccache libgloo-dev libgtest-dev libgmock-dev iproute2
  zlib1g-dev libssl-dev python3-dev dataset-fashion-mnist)
# Only for the tests: clang and its runtime for the libFuzzer targets
# (scripts/fuzz.sh), which the test suite runs for a few seconds each;
# procps: ps, in a security test.
# clang-format: the format check (Debian's, version 14: another version
# formats differently).
APT_TEST_PACKAGES=(clang libclang-rt-14-dev procps clang-format)
# Only for the benchmarks: Open MPI, the peer that run_allreduce.py measures
# ronde's shared memory against.
APT_BENCH_PACKAGES=(openmpi-bin libopenmpi-dev)

log() { printf '\033[1m[ronde]\033[0m %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs the Debian packages named in $@ that are missing.
setup_apt() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    missing+=(python3-venv)
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    as_root apt-get update -q
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q \
      --no-install-recommends "${missing[@]}"
  fi
}

# A venv at $1 with torch==$2 (pinned: a looser spec pulls another build).
ensure_torch_venv() {
  local venv=$1 version=$2 have
  if [ ! -x "$venv/bin/python" ]; then
    log "creating the venv at $venv"
    python3 -m venv "$venv"
  fi
  have=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
  if [[ "$have" != "$version"* ]]; then
    log "installing torch==$version into $venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "torch==$version"
  fi
}

setup_venv() {
  # The CPU build of this release.
  ensure_torch_venv "$VENV" "$TORCH_VERSION"
}

# The Python packages of the tests and benchmarks.
setup_venv_tools() {
  # matplotlib: the benchmark report's figures (benchmarks/run_all.py).
  if ! "$VENV/bin/python" -c 'import numpy, matplotlib' >/dev/null 2>&1; then
    "$VENV/bin/pip" install -q --disable-pip-version-check numpy matplotlib
  fi
  # The Python bindings' tests; pytest does not depend on torch.
  if ! "$VENV/bin/python" -c 'import pytest' >/dev/null 2>&1; then
    "$VENV/bin/pip" install -q --disable-pip-version-check pytest
  fi
  # The build backend of pyproject.toml, for pip install --no-build-isolation
  # (the python.pip_install test builds a wheel with it).
  if ! "$VENV/bin/python" -c 'import scikit_build_core' >/dev/null 2>&1; then
    "$VENV/bin/pip" install -q --disable-pip-version-check \
      "scikit-build-core==$SCIKIT_BUILD_CORE_VERSION"
  fi
}

setup() {
  setup_apt "${APT_PACKAGES[@]}" "${APT_TEST_PACKAGES[@]}"
  setup_venv
  setup_venv_tools
}

# What the example needs: the build's packages and LibTorch.
setup_example() {
  setup_apt "${APT_PACKAGES[@]}"
  setup_venv
}

# Configures $BUILD once and builds the given targets (default: all of
# them: the tests, the benchmarks and the Python package too).
build() {
  # Ninja: a program's units compile while the library they link is still
  # being built (Make waits for the whole library first).
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DRONDE_PYTHON="$VENV/bin/python" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo
  fi
  if [ $# -gt 0 ]; then
    cmake --build "$BUILD" -j "$JOBS" --target "$@"
  else
    cmake --build "$BUILD" -j "$JOBS"
  fi
}

# What run_example needs and nothing more: the library (which builds the
# Gloo module it opens), the launcher and the example.
EXAMPLE_TARGETS=(ronde ronde_gloo ronderun fashion_mnist)

run_example() {
  "$BUILD/bin/ronderun" -np 2 -- "$BUILD/bin/fashion_mnist" "$@"
}

run_tests() {
  # Multirank tests are marked RUN_SERIAL; the rest share the two cores.
  ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" "$@"
}

# Sanitizer runs: the CMake presets asan and tsan (CMakePresets.json), only
# the unit and multirank tests. LibTorch, Gloo and libstdc++ are not
# instrumented: the races TSan reports inside them are suppressed in
# scripts/tsan.supp (ASan needs none).
sanitize() {
  local kind=${1:-}
  shift || true
  local preset dir
  case "$kind" in
    address) preset=asan ;;
    thread) preset=tsan ;;
    *) echo "usage: scripts/dev.sh sanitize address|thread [ctest args]" >&2; exit 2 ;;
  esac
  dir=$ROOT/build-$preset
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    (cd "$ROOT" && cmake --preset "$preset" -DRONDE_PYTHON="$VENV/bin/python")
  fi
  cmake --build "$dir" -j "$JOBS" --target ronde_unit_tests ronderun_test \
    ronderun_units_test ronde_multirank_tests ronde_test_worker
  # A report fails the test: the process exits non-zero (ASan/UBSan at
  # once, TSan at exit with every race it saw).
  export ASAN_OPTIONS="detect_leaks=1:strict_init_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
  # scripts/tsan.supp: races inside uninstrumented libraries (Gloo,
  # libstdc++), each explained there.
  export TSAN_OPTIONS="second_deadlock_stack=1:suppressions=$ROOT/scripts/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
  ctest --test-dir "$dir" --output-on-failure -j "$JOBS" "$@"
}

cuda_check() {
  ensure_torch_venv "$CUDA_VENV" "$CUDA_TORCH_VERSION"
  if [ -d /usr/local/cuda/bin ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
    export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  fi
  "$ROOT/tests/gpu/run_gpu_checks.sh" --python "$CUDA_VENV/bin/python" \
    --build "${RONDE_CUDA_BUILD_DIR:-$ROOT/build-gpu}" --jobs "$JOBS" \
    --build-only "$@"
}

# The C++ files under version control, for clang-format (.clang-format).
cxx_files() {
  git -C "$ROOT" ls-files -- '*.cpp' '*.h' '*.cc' '*.hpp'
}

check_format() {
  local report
  # --dry-run -Werror reports each place it would change, with the file.
  if ! report=$(cd "$ROOT" && cxx_files |
      xargs clang-format --dry-run -Werror --style=file 2>&1); then
    echo "$report" | head -40 >&2
    log "format: clang-format would change $(echo "$report" | grep -c 'error:') places (above); run scripts/dev.sh format"
    return 1
  fi
  log "format: $(cxx_files | wc -l) files as clang-format writes them"
}

# The subject rule holds from the commit after this one on; older history
# is as it was.
COMMIT_RULE_BASE=a61605ca72f28850dbbed14dc43d44b3d129f2c1
check_commits() {
  local range=HEAD bad
  if git -C "$ROOT" cat-file -e "$COMMIT_RULE_BASE^{commit}" 2>/dev/null; then
    range=$COMMIT_RULE_BASE..HEAD
  elif [ "$(git -C "$ROOT" rev-parse --is-shallow-repository)" != true ]; then
    log "check-commits: COMMIT_RULE_BASE $COMMIT_RULE_BASE is not in this history"
    return 1
  fi
  # (A shallow clone may lack the base: then every commit it has is checked.)
  bad=$(git -C "$ROOT" log --format='%h %s' "$range" |
    awk '{ s = $0; sub(/^[^ ]+ /, "", s) } length(s) > 72')
  if [ -n "$bad" ]; then
    echo "$bad" >&2
    log "commit subjects over 72 characters (above)"
    return 1
  fi
  log "commit subjects: $(git -C "$ROOT" rev-list --count "$range") checked"
}

# The multirank tests the sanitizers run beside every unit test: the
# shared-memory transport, the engine (buckets, hooks, autotune), sharding,
# elastic recovery, join and the c10d backend, with two of the
# optimizer-equivalence variants and two of the sharded ones.
SANITIZER_MULTIRANK='^(SharedMemory|Collectives|DistributedOptimizer|Sharding|Elastic|Join|C10dBackend)\.|^Variants/OptimizerEquivalence\..*/adam_(bpps2|unused)_np2$|^Variants/ShardedEquivalence\..*/adam_(bpps2|unused)_np3$'

# One stage of ci: its name, its time, and a stop at its failure.
CI_TIMES=()
ci_stage() {
  local name=$1 start=$SECONDS
  shift
  log "ci: $name"
  if ! "$@"; then
    log "ci: FAILED: $name (after $((SECONDS - start)) s)"
    exit 1
  fi
  CI_TIMES+=("$(printf '%6d s  %s' $((SECONDS - start)) "$name")")
}

ci_sanitize() {
  sanitize "$1" -L unit && sanitize "$1" -R "$SANITIZER_MULTIRANK"
}

# CI starts with an empty cache, where ccache only costs: each miss is a
# preprocessing pass and a store, about a third more per unit. A machine
# that reruns CI keeps it with RONDE_CI_CCACHE=1.
ci_ccache() {
  if [ "${RONDE_CI_CCACHE:-0}" != 1 ]; then
    export CCACHE_DISABLE=1
  fi
}

# Cheapest first, so that a failure is found soonest: the whole test
# suite, the longest stage, comes last.
ci() {
  local start=$SECONDS
  ci_ccache
  setup
  ci_stage "commit subjects" check_commits
  ci_stage "format" check_format
  ci_stage "CUDA compile and link" cuda_check
  ci_stage "build" build
  ci_stage "ThreadSanitizer" ci_sanitize thread
  ci_stage "tests" run_tests
  printf '%s\n' "${CI_TIMES[@]}" >&2
  log "ci: passed in $((SECONDS - start)) s"
}

# What did not fit in CI's 45 minutes: AddressSanitizer with UBSan on the
# same tests (about 11 minutes: a third instrumented build, then the run).
# ThreadSanitizer stayed in CI: a race passes every ordinary test, while
# most memory errors still fail one. Run this before merging a change to
# memory the engine or the transports share.
ci_extra() {
  local start=$SECONDS
  ci_ccache
  setup
  ci_stage "AddressSanitizer+UBSan" ci_sanitize address
  printf '%s\n' "${CI_TIMES[@]}" >&2
  log "ci-extra: passed in $((SECONDS - start)) s"
}

cmd=${1:-test}
shift || true
case "$cmd" in
  setup) setup ;;
  build) setup; build ;;
  example) setup_example; build "${EXAMPLE_TARGETS[@]}"; run_example "$@" ;;
  test) setup; build; run_tests "$@" ;;
  bench) setup; setup_apt "${APT_BENCH_PACKAGES[@]}"; build; "$VENV/bin/python" "$ROOT/benchmarks/run_all.py" --build "$BUILD" "$@" ;;
  sanitize) setup; sanitize "$@" ;;
  cuda) setup; cuda_check "$@" ;;
  fuzz) setup; "$ROOT/scripts/fuzz.sh" --python "$VENV/bin/python" "$@" ;;
  format) setup_apt clang-format; cxx_files | (cd "$ROOT" && xargs clang-format -i --style=file) ;;
  check-format) setup_apt clang-format; check_format ;;
  check-commits) check_commits ;;
  ci) ci ;;
  ci-extra) ci_extra ;;
  *) echo "usage: scripts/dev.sh {example|test|bench|sanitize|fuzz|cuda|format|check-format|check-commits|ci|ci-extra|setup|build} [args...]" >&2; exit 2 ;;
esac
