#!/usr/bin/env bash
# Packs a CUDA build for the lent GPU machine, which has the CUDA driver but none of our Debian
# libraries (OpenBLAS, libgomp, GoogleTest, ...): the binaries, our libraries, and every shared
# library they load except glibc's own, the driver and the CUDA toolkit (cudart, cuBLAS: the device
# image has CUDA 13), into .gpu_bundle/ (git-ignored; pass it in
# the device tool's `carry`). On the device: bash scripts/gpu_run_tests.sh
#   bash scripts/gpu_bundle.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/lib/libmegatron_cuda.so" ] || { echo "gpu_bundle: $build has no CUDA platform (configure with MG_CUDA=ON)" >&2; exit 1; }
dest=.gpu_bundle
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib"
cp -a "$build"/bin/* "$dest/bin/"
cp -a "$build"/lib/*.so "$dest/lib/"
for f in "$dest"/bin/* "$dest"/lib/*.so; do
  ldd "$f" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt)\.so' |
  while read -r lib; do
    [ -e "$dest/lib/$(basename "$lib")" ] || cp -L "$lib" "$dest/lib/"
  done
# Tests carry absolute paths of this checkout (plugins, fixtures): record them for gpu_run_tests.sh.
echo "$PWD $(cd "$build" && pwd)" > "$dest/paths"
echo "gpu_bundle: $(du -sh "$dest" | cut -f1) in $dest"
