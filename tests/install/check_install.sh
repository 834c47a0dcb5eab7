#!/usr/bin/env bash
# Installs the built tree into a fresh prefix, builds the consumer project
# against it with find_package(ronde), and runs it on 1 and 2 ranks with the
# installed ronderun; compiles every C++ block of README.md and docs/guide
# there too (tests/docs/snippets.py), and runs each `cpp program` block on 2
# ranks.
# usage: check_install.sh BUILD_DIR SOURCE_DIR TORCH_CMAKE_PREFIX [-DVAR=...]
# (the -D arguments go to the consumer's configure: LibTorch's CUDA hints)
set -euo pipefail
build=$1 src=$2 torch_prefix=$3
shift 3
work=$(mktemp -d "${TMPDIR:-/tmp}/ronde-install-XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
for f in include/ronde/ronde.h include/ronde/version.h bin/ronderun; do
  [ -e "$work/prefix/$f" ] || { echo "missing after install: $f"; exit 1; }
done
ls "$work"/prefix/lib*/libronde_gloo.so "$work"/prefix/lib*/libronde_c10d.so > /dev/null
"${PYTHON:-python3}" "$src/tests/docs/snippets.py" cpp "$work/snippets"
launcher=
command -v ccache > /dev/null && launcher=-DCMAKE_CXX_COMPILER_LAUNCHER=ccache
cmake -S "$src/tests/install/consumer" -B "$work/build" $launcher \
  -DCMAKE_PREFIX_PATH="$work/prefix;$torch_prefix" "$@" \
  -DRONDE_DOC_SNIPPETS_DIR="$work/snippets" \
  -DRONDE_DOC_HARNESS_DIR="$src/tests/docs" \
  > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j 2 > "$work/build.log" ||
  { cat "$work/build.log"; exit 1; }
env -u RONDE_RANK -u RONDE_SIZE "$work/build/consumer"
env -u RONDE_RANK -u RONDE_SIZE "$work/build/consumer_c10d"
"$work/prefix/bin/ronderun" -np 2 --timeout 60 -- "$work/build/consumer"
for source in "$work"/snippets/program_*.cpp; do
  name=$(basename "$source" .cpp)
  echo "the docs' program at $(head -1 "$source" | cut -c4-), on 2 ranks"
  "$work/prefix/bin/ronderun" -np 2 --timeout 60 -- "$work/build/doc_$name"
done
echo "install check passed"
