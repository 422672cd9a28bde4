#!/bin/sh
# Megatron FSDP memory and step time on CPU ranks (issue 20's "Measured"): a GPT of ~20M parameters
# (4 layers, hidden 512, vocabulary 16384, sequence 128, f32) trained for a few iterations under
# mpirun at DP 1, 2, 4 and 8 with each --data-parallel-sharding-strategy (no_shard = DDP, optim =
# ZeRO-1, optim_grads = ZeRO-2, optim_grads_params = ZeRO-3; --overlap-grad-reduce, and
# --overlap-param-gather for ZeRO-3), plus the plain --use-distributed-optimizer (ZeRO-1) run at
# DP 4 as the step-time baseline. Global batch 8 (mbs 1), so every run sees the same samples.
# Per run, from rank 0's log: the engine's measured parameter + gradient + optimizer bytes
# (flat buffers resident at their peak + optimizer state) vs the estimate (memory_estimate.h),
# the process's peak resident set (getrusage), the mean step time of iterations 2..N, and the
# last lm loss / grad norm (equal to the DP 1 run's within f32 round-off). Two rows at DP 4 add
# --optimizer-cpu-offload (fractions 1.0 and 0.5, overlapped copies) to ZeRO-3.
# On a GPU (all ranks sharing it through the MPI backend): MG_FSDP_PLATFORM=cuda adds
# --platform cuda, MG_FSDP_DP the data-parallel sizes (default "1 2 4 8"; the ZeRO-1 and offload
# rows run at the largest); the column "mem max allocated" is the device's peak of rank 0 (the
# log line's), which CUDA virtual memory lets ZeRO-2/3 lower (MG_CUDA_VMM=0: the ordinary
# allocations, for the comparison).
# usage: benchmarks/run_fsdp_memory.sh <build dir> <out.md> [iterations (4)]
set -eu
build=$1; out=$2; iters=${3:-4}
platform=${MG_FSDP_PLATFORM:-cpu}
dps=${MG_FSDP_DP:-1 2 4 8}
top=$(echo $dps | tr ' ' '\n' | sort -n | tail -1)
bin="$build/bin/pretrain_gpt"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args="--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 128
  --max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 --train-iters $iters
  --lr 1e-4 --mock-data --tokenizer-type NullTokenizer --vocab-size 16383 --log-interval 1
  --eval-iters 0 --hidden-dropout 0 --attention-dropout 0 --seed 7 --platform $platform"
run() {  # run <log> <np> <args...>
  log=$1; n=$2; shift 2
  OMP_NUM_THREADS=1 mpirun --oversubscribe -x OMP_NUM_THREADS -np "$n" "$bin" $args "$@" \
    > "$log" 2>&1 || { tail -30 "$log"; exit 1; }
}
field() { grep -o "$2: [^ ]*" "$1" | sed "s/$2: //"; }
step_ms() { field "$1" "elapsed time per iteration (ms)" | tail -n +2 \
  | awk '{ s += $1; n++ } END { printf "%.0f", n ? s / n : 0 }'; }
row() {  # row <log> <dp> <strategy>
  chk=$(grep "^memory check:" "$1" || true)
  meas=$(echo "$chk" | sed -n 's/.*optimizer state measured \([^,]*\), predicted \([^(]*\) (ratio \([^)]*\)).*/\1|\2|\3/p')
  rss=$(echo "$chk" | sed -n 's/.*peak resident set \([^,]*\),.*/\1/p')
  printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n" "$2" "$3" "$meas" "$rss" \
    "$(field "$1" "mem max allocated (MB)" | tail -n 1)" "$(step_ms "$1")" \
    "$(field "$1" "lm loss" | tail -n 1)" "$(field "$1" "grad norm" | tail -n 1)"
}
{
  echo "# Megatron FSDP: per-rank memory and step time on $platform ranks"
  echo
  echo "Command: \`benchmarks/run_fsdp_memory.sh $build $out $iters\` ($(date -u +%F), $(nproc) cores,"
  echo "ranks oversubscribed, OMP_NUM_THREADS=1). Model: $(echo $args | tr -s ' ')."
  echo
  echo "| DP | strategy | params+grads+optimizer measured \\| predicted \\| ratio | peak RSS (rank 0) | mem max allocated (MB, rank 0) | step ms | lm loss (last) | grad norm (last) |"
  echo "|---|---|---|---|---|---|---|---|"
} > "$out"
for dp in $dps; do
  for s in no_shard optim optim_grads optim_grads_params; do
    extra="--overlap-grad-reduce"
    [ "$s" = optim_grads_params ] && extra="$extra --overlap-param-gather"
    run "$work/run.log" "$dp" --use-megatron-fsdp --data-parallel-sharding-strategy "$s" $extra
    [ "$dp$s" = "${dps%% *}no_shard" ] && grep "^memory estimate" "$work/run.log" > "$work/estimate.txt"
    cp "$work/run.log" "$work/dp${dp}_$s.log"
    row "$work/run.log" "$dp" "$s" >> "$out"
  done
done
run "$work/zero1.log" "$top" --use-distributed-optimizer --overlap-grad-reduce
# Optimizer CPU offload at DP 4 under ZeRO-3: on CPU ranks the identity (the start-up line says
# so; the row must equal ZeRO-3's); on a device the estimate's host part is printed at start-up.
for f in 1.0 0.5; do
  run "$work/offload_$f.log" "$top" --use-megatron-fsdp --data-parallel-sharding-strategy \
    optim_grads_params --overlap-grad-reduce --overlap-param-gather --optimizer-cpu-offload \
    --optimizer-offload-fraction "$f" --overlap-cpu-optimizer-d2h-h2d
  row "$work/offload_$f.log" "$top" "optim_grads_params + --optimizer-cpu-offload --optimizer-offload-fraction $f" >> "$out"
done
{
  echo
  echo "Step time at DP $top vs plain ZeRO-1 (--use-distributed-optimizer --overlap-grad-reduce):"
  echo "$(step_ms "$work/zero1.log") ms per iteration; the FSDP strategies' are in the table."
  echo
  echo "Start-up estimate of the DP ${dps%% *} run: $(cat "$work/estimate.txt")"
  echo
  echo "Offload start-up line (DP $top): $(grep -m1 "^optimizer CPU offload" "$work/offload_1.0.log")"
  echo
  echo "Engine lines at DP $top:"
  for s in optim_grads optim_grads_params; do
    echo "- $(grep "^Megatron FSDP $s" "$work/dp${top}_$s.log")"
  done
} >> "$out"
cat "$out"
