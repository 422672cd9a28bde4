#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: every unit test binary of .gpu_bundle/
# (scripts/gpu_bundle.sh) with the CUDA platform available, writing one log per binary and a
# summary under ${OUT:-/tmp/gpu_out}. The tests were compiled with this checkout's and build's
# absolute paths (plugins, fixtures, megatron_info); where those do not exist here they are made
# as links to the bundle and to this checkout.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
read -r src_root build_dir < .gpu_bundle/paths
if [ ! -e "$build_dir" ]; then mkdir -p "$(dirname "$build_dir")" && ln -s "$PWD/.gpu_bundle" "$build_dir"; fi
if [ ! -e "$src_root/tests" ]; then mkdir -p "$src_root" && ln -s "$PWD/tests" "$src_root/tests"; fi
cuda_lib=$(dirname "$(dirname "$(command -v nvcc)")")/lib64
export LD_LIBRARY_PATH="$PWD/.gpu_bundle/lib:$cuda_lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/device.txt" 2>&1
.gpu_bundle/bin/megatron_info --all-platforms > "$out/megatron_info.txt" 2>&1
summary="$out/summary.txt"
: > "$summary"
for t in .gpu_bundle/bin/*_test; do
  name=$(basename "$t")
  "$t" --gtest_brief=1 > "$out/$name.log" 2>&1
  echo "$name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')" | tee -a "$summary"
done
