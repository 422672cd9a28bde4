#!/bin/sh
# Sharded checkpoints reshard: a checkpoint saved at iteration 2 by TP 2 x DP 2 (4 ranks, SwiGLU,
# sequence parallel; with or without the distributed optimizer) is loaded in other layouts, and the
# next 3 iterations print the lm losses of the uninterrupted single-rank run (f32 round-off of a
# different summation order: 2e-6 relative); the same layout resumes exactly (the printed values
# equal those of the saving run, which goes on uninterrupted to iteration 5; its later
# checkpoints are then skipped by pointing the tracker back at iteration 2). The vocabulary (301) pads to 304 for TP 1, 2 and 4 alike (--make-vocab-size-divisible-by
# 4), so the loss does not depend on TP.
# usage: checkpoint_reshard.sh <pretrain_gpt> <source: dopt|nodopt|pp|crash|ep|epdopt|etp|cp|fsdp>
#        <mpiexec> [args...]
#   dopt:   save TP2xDP2 + distributed optimizer; load TP1, TP4, DP4 (replicated optimizer),
#           TP2xDP2 (replicated) and TP2xDP2 (distributed, exact)
#   nodopt: save TP2xDP2 replicated optimizer; load TP1, TP4, DP4 + distributed optimizer,
#           TP2xDP2 + distributed optimizer, TP2xDP2 (exact)
#   pp:     save TP2xPP2 + distributed optimizer (the last stage's tied embedding copy is not
#           saved); load TP1xPP1, TP4, TP1xPP4, TP2xDP2 + distributed optimizer, PP2 x virtual 2,
#           TP2xPP2 (exact)
#   crash:  a rank dies in the middle of saving iteration 4 (MG_CHECKPOINT_FAULT_INJECT): the
#           tracker still names iteration 2, which loads and resumes with the reference losses
#   ep:     MoE (8 experts, top-2; expert keys per global expert index) saved at EP2 x DP2; load
#           EP1, EP4, TP2 + SP with EP2, expert TP 2 x EP2, EP2 x DP2 (exact)
#   epdopt: the same MoE saved at EP2 x DP2 + distributed optimizer (expert state sharded over
#           expert-DP); load EP1, EP1 x DP4 + distributed optimizer, TP2 + SP x EP2 + distributed
#           optimizer, EP2 x DP2 + distributed optimizer (exact); and back: saved at EP1 x DP4 +
#           distributed optimizer, loaded at EP2 x DP2 + distributed optimizer
#   etp:    MoE with biases (the experts' linear_fc{1,2}.bias) saved at expert TP 2 x EP2 (fc1 and
#           its bias split on dim 0, fc2 on dim 1); load EP1, EP2 x DP2, TP2 + SP x EP2 (expert TP
#           2 by default), ETP2 x EP2 (exact)
#   cp:     saved at CP2 x TP2 + SP; load CP1, CP2, CP4, CP2 x TP2 (exact)
#   fsdp:   saved at TP2 x DP2 + FSDP optim_grads_params; load TP1, DP4 + FSDP optim_grads,
#           TP2 x PP2 + distributed optimizer, TP2 x DP2 + FSDP optim_grads_params (exact); the
#           dopt source also loads its checkpoint into DP4 + FSDP optim_grads_params
# (CTest label `mpi`; tests/CMakeLists.txt.)
set -eu
bin=$1; source=$2; mpi=$3; shift 3; mpi_args="$*"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args="--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 8 --train-iters 5
  --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 301 --swiglu
  --make-vocab-size-divisible-by 4 --log-interval 1 --eval-iters 0 --hidden-dropout 0
  --attention-dropout 0 --seed 7"

. "$(dirname "$0")/compare_logs.sh"  # expect_layout (its values() is replaced below)
use_test_platform  # MG_TEST_PLATFORM=cuda: every run on the GPU (compare_logs.sh)
values() { grep -o "lm loss: [^ ]*" "$1" | sed "s/lm loss: //"; }
run() {  # run <log> <np> <extra args...>: also checks the layout of its start-up lines
  log=$1; n=$2; shift 2
  if [ "$n" -eq 1 ]; then
    "$bin" $args "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
  else
    "$mpi" $mpi_args -np "$n" "$bin" $args "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
  fi
  expect_layout "$log" "$n" $args "$@"
}
# check <log> <what> <relative tolerance> <reference log>: its lm losses equal the reference's
# iterations 3..5.
check() {
  values "$4" | tail -n 3 > "$work/a"; values "$1" > "$work/all"; tail -n 3 "$work/all" > "$work/b"
  [ "$(wc -l < "$work/all")" -ge 3 ] || { echo "FAIL $2: printed $(wc -l < "$work/all") losses"; cat "$1"; exit 1; }
  paste "$work/a" "$work/b" | awk -v what="$2" -v rel="$3" '
    { a = $1 + 0; b = $2 + 0; d = a - b; if (d < 0) d = -d;
      if (d > rel * (a < 0 ? -a : a)) { print "FAIL " what ": " $1 " vs " $2; bad = 1 } }
    END { if (bad) exit 1; print "ok " what ": 3 losses agree" }' || { cat "$1"; exit 1; }
}
# load <np> <what> <tolerance> <layout args...>: resume from $ck to iteration 5; tolerance 0
# compares with the saving run (same layout), else with the single-rank run.
load() {
  n=$1; what=$2; tol=$3; shift 3
  run "$work/load.log" "$n" "$@" --load "$ck"
  grep -q "successfully loaded checkpoint .* at iteration 2 \[sharded" "$work/load.log" \
    || { echo "FAIL $what: no load line"; cat "$work/load.log"; exit 1; }
  if [ "$tol" = 0 ]; then ref="$work/save.log"; else ref="$work/single.log"; fi
  check "$work/load.log" "$what" "$tol" "$ref"
}
# save <np> <layout args...>: train to 5 saving at 2 and 4, then point the tracker at 2.
save() {
  n=$1; shift
  run "$work/save.log" "$n" "$@" --save "$ck" --save-interval 2
  grep -q "successfully saved checkpoint from iteration       2 .* GB/s" "$work/save.log" \
    || { cat "$work/save.log"; exit 1; }
  check "$work/save.log" "saving run $*" 2e-6 "$work/single.log"
  printf 2 > "$ck/latest_checkpointed_iteration.txt"
}

if [ "$source" = ep ] || [ "$source" = epdopt ]; then
  args="$args --disable-bias-linear --num-experts 8 --moe-router-topk 2"
fi
if [ "$source" = etp ]; then
  args="$args --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 24"
fi
run "$work/single.log" 1
ck="$work/ckpt"
save="--tensor-model-parallel-size 2 --sequence-parallel"
dopt="--use-distributed-optimizer"
fsdp="--use-megatron-fsdp --data-parallel-sharding-strategy"
case "$source" in
  dopt)
    save 4 $save $dopt
    load 1 "TP2xDP2 dist-opt -> TP1" 2e-6
    load 4 "TP2xDP2 dist-opt -> TP4" 2e-6 --tensor-model-parallel-size 4
    load 4 "TP2xDP2 dist-opt -> DP4" 2e-6
    load 4 "TP2xDP2 dist-opt -> TP2xDP2" 2e-6 --tensor-model-parallel-size 2
    load 4 "TP2xDP2 dist-opt -> DP4 FSDP optim_grads_params" 2e-6 $fsdp optim_grads_params
    load 4 "TP2xDP2 dist-opt -> TP2xDP2 dist-opt (same layout, exact)" 0 $save $dopt
    ;;
  nodopt)
    save 4 $save
    load 1 "TP2xDP2 -> TP1" 2e-6
    load 4 "TP2xDP2 -> TP4 + SP" 2e-6 --tensor-model-parallel-size 4 --sequence-parallel
    load 4 "TP2xDP2 -> DP4 dist-opt" 2e-6 $dopt
    load 4 "TP2xDP2 -> TP2xDP2 dist-opt" 2e-6 $save $dopt
    load 4 "TP2xDP2 -> TP2xDP2 (same layout, exact)" 0 $save
    ;;
  pp)
    pp2="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"
    save 4 $pp2 $dopt
    load 1 "TP2xPP2 -> TP1xPP1" 2e-6
    load 4 "TP2xPP2 -> TP4" 2e-6 --tensor-model-parallel-size 4
    load 4 "TP2xPP2 -> TP1xPP4" 2e-6 --pipeline-model-parallel-size 4
    load 4 "TP2xPP2 -> TP2xDP2 dist-opt" 2e-6 $save $dopt
    load 2 "TP2xPP2 -> PP2 x VP2" 2e-6 --pipeline-model-parallel-size 2 \
      --num-layers-per-virtual-pipeline-stage 1
    load 4 "TP2xPP2 -> TP2xPP2 (same layout, exact)" 0 $pp2 $dopt
    ;;
  crash)
    # Saves at 2 and 4; rank 1 dies after writing its file of iteration 4, before metadata.json.
    if MG_CHECKPOINT_FAULT_INJECT=1:4 "$mpi" $mpi_args -x MG_CHECKPOINT_FAULT_INJECT -np 4 \
      "$bin" $args $save $dopt --save "$ck" --save-interval 2 > "$work/crash.out" 2>&1; then
      echo "FAIL: the run with a rank killed mid-save succeeded"; cat "$work/crash.out"; exit 1
    fi
    grep -q "fault injection" "$work/crash.out" || { cat "$work/crash.out"; exit 1; }
    expect_layout "$work/crash.out" 4 $args $save $dopt
    [ "$(cat "$ck/latest_checkpointed_iteration.txt")" = 2 ] \
      || { echo "FAIL: the tracker moved: $(cat "$ck/latest_checkpointed_iteration.txt")"; exit 1; }
    [ ! -e "$ck/iter_0000004" ] || { echo "FAIL: iter_0000004 exists"; ls -R "$ck"; exit 1; }
    echo "ok a rank killed mid-save left the tracker at iteration 2"
    load 4 "after the crash: TP2xDP2 dist-opt -> TP2xDP2 dist-opt" 2e-6 $save $dopt
    ;;
  ep)
    ep2="--expert-model-parallel-size 2"
    save 4 $ep2
    load 1 "EP2xDP2 -> EP1" 2e-6
    load 4 "EP2xDP2 -> EP4" 2e-6 --expert-model-parallel-size 4
    load 4 "EP2xDP2 -> TP2 + SP x EP2" 2e-6 --tensor-model-parallel-size 2 --sequence-parallel \
      --expert-tensor-parallel-size 1 $ep2
    load 4 "EP2xDP2 -> ETP2 x EP2" 2e-6 --expert-tensor-parallel-size 2 $ep2
    load 4 "EP2xDP2 -> EP2xDP2 (same layout, exact)" 0 $ep2
    ;;
  epdopt)
    ep2="--expert-model-parallel-size 2"
    save 4 $ep2 $dopt
    load 1 "EP2xDP2 dist-opt -> EP1" 2e-6
    load 4 "EP2xDP2 dist-opt -> EP1xDP4 dist-opt" 2e-6 $dopt
    load 4 "EP2xDP2 dist-opt -> TP2 + SP x EP2 dist-opt" 2e-6 --tensor-model-parallel-size 2 \
      --sequence-parallel --expert-tensor-parallel-size 1 $ep2 $dopt
    load 4 "EP2xDP2 dist-opt -> EP2xDP2 dist-opt (same layout, exact)" 0 $ep2 $dopt
    # and back: saved at EP1 x DP4 with the distributed optimizer, loaded at EP2 x DP2.
    rm -rf "$ck"
    save 4 $dopt
    load 4 "EP1xDP4 dist-opt -> EP2xDP2 dist-opt" 2e-6 $ep2 $dopt
    ;;
  etp)
    etp2="--expert-tensor-parallel-size 2 --expert-model-parallel-size 2"
    save 4 $etp2
    load 1 "ETP2xEP2 -> EP1" 2e-6
    load 4 "ETP2xEP2 -> EP2xDP2" 2e-6 --expert-model-parallel-size 2
    load 4 "ETP2xEP2 -> TP2 + SP x EP2 (ETP 2)" 2e-6 --tensor-model-parallel-size 2 \
      --sequence-parallel --expert-model-parallel-size 2
    load 4 "ETP2xEP2 -> ETP2xEP2 (same layout, exact)" 0 $etp2
    ;;
  cp)
    cp2="--context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel"
    save 4 $cp2
    load 1 "CP2xTP2 -> CP1" 2e-6
    load 2 "CP2xTP2 -> CP2" 2e-6 --context-parallel-size 2
    load 4 "CP2xTP2 -> CP4 (allgather)" 2e-6 --context-parallel-size 4 --cp-comm-type allgather
    load 4 "CP2xTP2 -> CP2xTP2 (same layout, exact)" 0 $cp2
    ;;
  fsdp)
    save 4 $save $fsdp optim_grads_params
    load 1 "TP2xDP2 FSDP optim_grads_params -> TP1" 2e-6
    load 4 "TP2xDP2 FSDP optim_grads_params -> DP4 FSDP optim_grads" 2e-6 $fsdp optim_grads
    load 4 "TP2xDP2 FSDP optim_grads_params -> TP2xPP2 dist-opt" 2e-6 \
      --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 $dopt
    load 4 "TP2xDP2 FSDP optim_grads_params -> TP2xDP2 FSDP (same layout, exact)" 0 $save \
      $fsdp optim_grads_params
    ;;
  *) echo "unknown source '$source' (dopt, nodopt, pp, crash, ep, epdopt, etp, cp, fsdp)"; exit 2 ;;
esac
