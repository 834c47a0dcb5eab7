#!/usr/bin/env bash
# Unpacks what the GPU checks need and a bare GPU machine may lack (the
# system Gloo, GoogleTest, and the headers they and ronde build against)
# from Debian's packages into one folder, to be copied next to the sources:
#   tests/gpu/fetch_deps.sh [DIR]      (default: gpu-deps, git-ignored)
# run_gpu_checks.sh --deps DIR then builds against it. Needs apt-get (run
# `apt-get update` once first) but installs nothing system-wide.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$root/gpu-deps}
packages=(libgloo-dev libgloo0 libhiredis-dev libhiredis0.14 libibverbs-dev
  libibverbs1 libnl-3-200 libnl-route-3-200 libgtest-dev libgmock-dev
  zlib1g-dev zlib1g)
rm -rf "$dir"
mkdir -p "$dir/debs"
(cd "$dir/debs" && apt-get download "${packages[@]}")
for deb in "$dir"/debs/*.deb; do
  dpkg -x "$deb" "$dir"
done
rm -rf "$dir/debs" "$dir/usr/share/doc" "$dir/usr/share/man"
# Some development links are absolute (libz.so -> /lib/...), which on
# another system points at nothing or at another version: point every link
# into the folder instead.
while IFS= read -r link; do
  target=$(readlink "$link")
  if [[ $target == /* ]]; then
    ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$dir$target")" \
      "$link"
  fi
done < <(find "$dir" -type l)
# libnl-3 lives in /lib: put it beside libnl-route-3, on the library path
# that run_gpu_checks.sh sets (zlib stays where it is: every system has it).
ln -sfn ../../../lib/x86_64-linux-gnu/libnl-3.so.200 \
  "$dir/usr/lib/x86_64-linux-gnu/libnl-3.so.200"
du -sh "$dir"
