#!/usr/bin/env bash
# Packs a CUDA build for the lent GPU machine, which has the CUDA driver but none of our Debian
# libraries (OpenBLAS, libgomp, GoogleTest, ...): the binaries, our libraries, and every shared
# library they load except glibc's own, the driver and the CUDA toolkit (cudart, cuBLAS: the device
# image has CUDA 13), as one xz tarball .gpu_bundle/bundle.tar.xz (git-ignored; pass .gpu_bundle
# in the device tool's `carry`). Unpacked the bundle is ~190 MiB (OpenBLAS 35, ICU data 31, the
# test binaries 70), far over the 64 MiB a device call may carry; gzip packs it into 66 MiB (too
# much), xz into ~36 MiB (~45 s on 2 cores). scripts/gpu_env.sh unpacks it (tar -J, or Python's
# tarfile where the device has no xz).
# On the device: bash scripts/gpu_run_tests.sh, or everything at once: bash scripts/gpu_session.sh
# (from another checkout than this one: cp -r .gpu_bundle/overlay/. . first)
# (build the `benchmarks` target too so that the kernel benchmarks travel).
#   bash scripts/gpu_bundle.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/lib/libmegatron_cuda.so" ] || { echo "gpu_bundle: $build has no CUDA platform (configure with MG_CUDA=ON)" >&2; exit 1; }
# The kernel benchmarks are EXCLUDE_FROM_ALL (`make bench`): built here, so that none travels stale
# (session 27: a fused_kernels_bench built before an op-table change called adamw_step for
# init_normal and crashed on the GPU).
benches_built=1
cmake --build "$build" --target benchmarks > /dev/null 2>&1 || benches_built=0
dest=.gpu_bundle
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/tools"
cp -a "$build"/bin/* "$stage/bin/"
if [ "$benches_built" = 0 ]; then
  echo "gpu_bundle: the benchmarks target did not build (Google Benchmark missing?): no *_bench travels" >&2
  rm -f "$stage"/bin/*_bench
fi
cp -a "$build"/lib/*.so "$stage/lib/"
# Command-line tools the tests run that the device image lacks (preprocess_data_test: zstd);
# gpu_run_tests.sh appends tools/ to PATH, so the device's own copies win.
for tool in zstd; do
  if command -v "$tool" >/dev/null; then cp -L "$(command -v "$tool")" "$stage/tools/"; fi
done
# OpenMPI's launcher (orterun / mpirun, orted, its components and help files) for the multi-rank
# runs (scripts/gpu_multirank.sh): the device image has no MPI. Packed under mpi/usr as Debian lays
# it out below /usr; gpu_env.sh sets OPAL_PREFIX to it (OpenMPI then finds its components, help
# files and orted there) and puts its bin/ on PATH after the device's own.
mpi_files=()
if command -v orterun > /dev/null && [ -d /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 ]; then
  m=$stage/mpi/usr
  mkdir -p "$m/bin" "$m/lib/x86_64-linux-gnu/openmpi/lib" "$m/share" "$m/lib/x86_64-linux-gnu/pmix2/lib"
  cp -L "$(command -v orterun)" "$(command -v orted)" "$m/bin/"
  ln -s orterun "$m/bin/mpirun"
  ln -s orterun "$m/bin/mpiexec"
  cp -a /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 "$m/lib/x86_64-linux-gnu/openmpi/lib/"
  cp -a /usr/share/openmpi "$m/share/"
  [ -d /usr/share/pmix ] && cp -a /usr/share/pmix "$m/share/"
  [ -d /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix ] &&
    cp -a /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix "$m/lib/x86_64-linux-gnu/pmix2/lib/"
  mapfile -t mpi_files < <(find "$m" -type f \( -name '*.so' -o -perm -u+x \))
else
  echo "gpu_bundle: no OpenMPI launcher here (orterun); the bundle cannot run multi-rank tests" >&2
fi
for f in "$stage"/bin/* "$stage"/lib/*.so "$stage"/tools/* "${mpi_files[@]}"; do
  ldd "$f" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn[a-z_]*)\.so' |
  while read -r lib; do
    [ -e "$stage/lib/$(basename "$lib")" ] || cp -L "$lib" "$stage/lib/"
  done
# NCCL (~200 MB) is left out: the device image has it (PyPI nvidia-nccl-cu13; gpu_env.sh finds it).
# So is cuDNN (~1 GB with its engines; libcudnn.so.9 only dispatches to them): the device image's
# PyPI nvidia-cudnn-cu13 (gpu_env.sh), any cuDNN 9.
# Tests carry absolute paths of this checkout (plugins, fixtures): record them for gpu_run_tests.sh.
echo "$PWD $(cd "$build" && pwd)" > "$stage/paths"
# The commit the binaries were built from (the device's copy of the tree has no .git): results.
dirty=""
[ -n "$(git status --porcelain -- megatron benchmarks pretrain_gpt.cpp tools 2>/dev/null | grep -v '^??' || true)" ] &&
  dirty="+dirty"
echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$dirty" > "$stage/commit"
rm -rf "$dest"
mkdir -p "$dest"
tar -C "$stage" -cf - . | xz -T0 -6 > "$dest/bundle.tar.xz"
# The scripts the device runs, as of this checkout: the device tool sends the checkout its session
# started in, which may be another branch than the one built here (a helper's worktree). A device
# command that starts with `cp -r .gpu_bundle/overlay/. .` runs these instead of that tree's.
mkdir -p "$dest/overlay/scripts" "$dest/overlay/benchmarks"
cp -a scripts/gpu_*.sh "$dest/overlay/scripts/"
cp -a benchmarks/*.py benchmarks/*.sh "$dest/overlay/benchmarks/"
echo "gpu_bundle: $(du -sh "$stage" | cut -f1) packed into $(du -sh "$dest/bundle.tar.xz" | cut -f1) $dest/bundle.tar.xz"
