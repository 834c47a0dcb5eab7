#!/usr/bin/env bash
# The Python package as a user gets it: a wheel built by pip from the
# source tree against PYTHON's torch (pip wheel --no-build-isolation, the
# same build as pip install --no-build-isolation .), installed into a fresh
# venv that has the same torch release and nothing of the build tree; then
# the message of an import beside another torch, and the Python tests
# marked `installed` against that copy (2-rank training runs through the
# installed ronderun among them).
# usage: check_pip_install.sh SOURCE_DIR PYTHON PIP_BUILD_DIR
set -euo pipefail
src=$1 python=$2 pip_build=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/ronde-pip-XXXXXX")
trap 'rm -rf "$work"' EXIT
log() { printf '[pip install check] %s\n' "$*"; }

torch_version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')
log "building the wheel against torch $torch_version (build directory $pip_build)"
# As a user's pip install builds it (scikit-build-core takes Ninja when
# there is one), with the compiler CXX names (the test sets the CMake
# build's); a rerun reuses PIP_BUILD_DIR.
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  "$python" -m pip wheel -q --no-build-isolation --no-deps \
    --disable-pip-version-check -w "$work/dist" \
    -C build-dir="$pip_build" "$src" > "$work/wheel.log" 2>&1 ||
  { cat "$work/wheel.log"; exit 1; }
wheel=$(ls "$work"/dist/ronde-*.whl)
log "built $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
# The wheel holds the package, its libraries and the launcher, no more.
"$python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
def has(pred, what):
    if not any(pred(n) for n in names):
        sys.exit(f"the wheel lacks {what}: {names}")
has(lambda n: n.startswith("ronde/torch/_C.") and n.endswith(".so"), "ronde/torch/_C")
has(lambda n: n == "ronde/lib/libronde.so", "ronde/lib/libronde.so")
has(lambda n: n == "ronde/lib/libronde_gloo.so", "ronde/lib/libronde_gloo.so")
has(lambda n: n == "ronde/lib/libronde_c10d.so", "ronde/lib/libronde_c10d.so")
has(lambda n: n.endswith(".data/scripts/ronderun"), "the ronderun script")
has(lambda n: n == "ronde/torch/_build_info.py", "ronde/torch/_build_info.py")
has(lambda n: n.endswith("/METADATA"), "METADATA")
bad = [n for n in names if n.startswith(("include/", "lib/", "share/"))]
if bad:
    sys.exit(f"the wheel installs outside its package: {bad}")
PY

base=$("$python" -c 'import sys; print(sys._base_executable)')
log "a fresh venv from $base with torch==$torch_version"
"$base" -m venv "$work/venv"
venv_pip=("$work/venv/bin/python" -m pip -q --disable-pip-version-check)
"${venv_pip[@]}" install "torch==$torch_version" numpy pytest matplotlib \
  > "$work/venv.log" 2>&1 || { cat "$work/venv.log"; exit 1; }
"${venv_pip[@]}" install "$wheel" > "$work/install.log" 2>&1 ||
  { cat "$work/install.log"; exit 1; }
# Run paths relative to the package, so that the site-packages can move.
site=$(echo "$work"/venv/lib/python*/site-packages)
for lib in "$site"/ronde/torch/_C.*.so "$site"/ronde/lib/libronde.so \
    "$site"/ronde/lib/libronde_c10d.so; do
  runpath=$(readelf -d "$lib" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
  case ":$runpath:" in
    *:/*) echo "$lib has an absolute run path: $runpath"; exit 1 ;;
    *'$ORIGIN/../../torch/lib'*) ;;
    *) echo "$lib does not find torch relative to itself: '$runpath'"; exit 1 ;;
  esac
done
grep -q "^Requires-Dist: torch==$torch_version\$" \
  "$site"/ronde-*.dist-info/METADATA ||
  { echo "METADATA does not pin torch==$torch_version"; exit 1; }

cd "$work"  # nothing of the source tree on sys.path
env -u PYTHONPATH -u LD_LIBRARY_PATH "$work/venv/bin/python" - "$work/venv" <<'PY'
import os, sys
import ronde.torch as rt
venv = os.path.realpath(sys.argv[1])
where = os.path.realpath(rt.__file__)
assert where.startswith(venv), f"ronde.torch came from {where}, not {venv}"
assert os.access(os.path.join(venv, "bin", "ronderun"), os.X_OK)
rt.init()
assert (rt.rank(), rt.size()) == (0, 1)
rt.shutdown()
print(f"installed ronde {rt.__version__} imports from {where}")
PY

log "importing beside another torch release"
out=$(env -u PYTHONPATH "$work/venv/bin/python" -c '
import torch
torch.__version__ = "1.0.0"
import ronde.torch' 2>&1) && { echo "an import beside torch 1.0.0 did not fail"; exit 1; }
echo "$out" | grep -q "ImportError: ronde.torch was built against torch $torch_version.*, but this Python has torch 1.0.0" ||
  { echo "unexpected message: $out"; exit 1; }

# The whole suite runs against the build tree (python.pytest); here the
# tests marked `installed`: each native library (libronde, libronde_c10d,
# the bindings), ronderun and torchrun, the Horovod names, elastic,
# sharding and ronde.plot, from the installed copy.
log "the Python tests marked 'installed' against the installed package"
env -u PYTHONPATH -u RONDE_BUILD_DIR RONDE_TEST_INSTALLED=1 \
  "$work/venv/bin/python" -m pytest -q -p no:cacheprovider --strict-markers \
    -m installed "$src/tests/python"
log "passed"
