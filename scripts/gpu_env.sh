# Sourced (from the repository root) by the scripts that run on the lent GPU machine: unpacks
# .gpu_bundle/bundle.tar.xz (scripts/gpu_bundle.sh) once, links the absolute paths the binaries
# were built with (this checkout's tests/, the build dir) to this copy where they do not exist, and
# exports LD_LIBRARY_PATH (the bundle's libraries, then the CUDA toolkit's runtime and cuBLAS, next
# to nvcc or in /usr/local/cuda) and PATH (+ the bundle's tools, after the device's own; + its
# OpenMPI launcher with OPAL_PREFIX when the device has no mpirun).
if [ -f .gpu_bundle/bundle.tar.xz ]; then
  if command -v xz > /dev/null; then
    tar -C .gpu_bundle -xJf .gpu_bundle/bundle.tar.xz && rm .gpu_bundle/bundle.tar.xz
  else
    python3 -c 'import tarfile; tarfile.open(".gpu_bundle/bundle.tar.xz").extractall(".gpu_bundle")' &&
      rm .gpu_bundle/bundle.tar.xz
  fi
fi
read -r src_root build_dir < .gpu_bundle/paths
if [ ! -e "$build_dir" ]; then mkdir -p "$(dirname "$build_dir")" && ln -s "$PWD/.gpu_bundle" "$build_dir"; fi
if [ ! -e "$src_root/tests" ]; then mkdir -p "$src_root" && ln -s "$PWD/tests" "$src_root/tests"; fi
cuda_libs=""
for d in "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")" /usr/local/cuda; do
  for l in lib64 lib targets/x86_64-linux/lib; do
    case ":$cuda_libs:" in *":$d/$l:"*) ;; *) [ -d "$d/$l" ] && cuda_libs="$cuda_libs:$d/$l" ;; esac
  done
done
# NCCL is not in the bundle (gpu_bundle.sh): use the toolkit's, else the device image's PyPI wheel.
nccl_dir=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0] + "/lib")' 2>/dev/null || true)
[ -n "$nccl_dir" ] && [ -d "$nccl_dir" ] && cuda_libs="$cuda_libs:$nccl_dir"
# cuDNN (the cuDNN fused attention provider links libcudnn.so.9): the image's PyPI nvidia-cudnn-cu13.
cudnn_dir=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0] + "/lib")' 2>/dev/null || true)
[ -n "$cudnn_dir" ] && [ -d "$cudnn_dir" ] && cuda_libs="$cuda_libs:$cudnn_dir"
export LD_LIBRARY_PATH="$PWD/.gpu_bundle/lib$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PATH:$PWD/.gpu_bundle/tools"
# OpenMPI's launcher from the bundle (gpu_bundle.sh), first on PATH even where the device has an
# mpirun of its own: the binaries load the bundle's libmpi/libopen-pal/libpmix (LD_LIBRARY_PATH),
# and a device mpirun of the same OpenMPI release then loads the device's components against the
# bundle's libraries ("mca_pmix_ext3x.so: undefined symbol: PMIx_Info_create", H200 image of
# 2026-11-26). OPAL_PREFIX relocates OpenMPI's install paths into the bundle; the component paths
# of OpenMPI and PMIx are set explicitly too, so nothing of the device's installation is mixed in.
if [ -x .gpu_bundle/mpi/usr/bin/orterun ]; then
  export OPAL_PREFIX="$PWD/.gpu_bundle/mpi/usr"
  export PATH="$OPAL_PREFIX/bin:$PATH"
  export PMIX_INSTALL_PREFIX="$OPAL_PREFIX"
  export OMPI_MCA_mca_base_component_path="$OPAL_PREFIX/lib/x86_64-linux-gnu/openmpi/lib/openmpi3"
  [ -d "$OPAL_PREFIX/lib/x86_64-linux-gnu/pmix2/lib/pmix" ] &&
    export PMIX_MCA_mca_base_component_path="$OPAL_PREFIX/lib/x86_64-linux-gnu/pmix2/lib/pmix"
fi
