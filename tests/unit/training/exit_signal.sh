#!/bin/sh
# The three ways a run stops early, under mpirun, each saving a checkpoint every rank exits 0 from
# and that a resumed run continues from:
#   1. --exit-signal-handler: SIGTERM sent to every rank mid-run (as SLURM does at the end of a
#      job's time): the ranks finish the iteration, save, exit 0; the resumed run's lm loss and
#      grad norm lines equal an uninterrupted run's, digit for digit, and so do the interrupted
#      run's own lines before the signal;
#   2. --exit-duration-in-mins: every rank stops at the same iteration (the decision is all-reduced)
#      and saves it;
#   3. --exit-interval: stops and saves at the multiple.
# usage: exit_signal.sh <pretrain_gpt> <np> <mpiexec> [mpiexec args...]   (CTest label `mpi`)
set -eu
bin=$1; np=$2; shift 2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 8 --train-iters 3000
  --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 300 --log-interval 1
  --eval-iters 0 --hidden-dropout 0 --attention-dropout 0 --seed 7"
. "$(dirname "$0")/compare_logs.sh"  # expect_layout
fail() { echo "FAIL $1"; [ -z "${2:-}" ] || cat "$2"; exit 1; }
# "<iteration> <lm loss> <grad norm>" per log line
steps() { sed -n 's/.* iteration *\([0-9]*\)\/.*lm loss: \([^ ]*\) .*grad norm: \([^ ]*\) .*/\1 \2 \3/p' "$1"; }
latest() { cat "$1/latest_checkpointed_iteration.txt"; }

# ---- 1. SIGTERM to every rank ----
"$@" -np "$np" "$bin" $args --exit-signal-handler --save "$work/sig" > "$work/sig.log" 2>&1 &
mpi=$!
i=0
until grep -q "iteration *5/" "$work/sig.log" 2>/dev/null; do
  i=$((i + 1)); [ "$i" -lt 1200 ] || { kill "$mpi"; fail "no iteration 5 within 120 s" "$work/sig.log"; }
  kill -0 "$mpi" 2>/dev/null || fail "the run ended before the signal" "$work/sig.log"
  sleep 0.1
done
ranks=$(pgrep -P "$mpi" || true)
[ "$(echo "$ranks" | wc -w)" -eq "$np" ] || fail "found ranks '$ranks' under mpirun $mpi, want $np" "$work/sig.log"
kill -TERM $ranks
rc=0; wait "$mpi" || rc=$?
[ "$rc" -eq 0 ] || fail "mpirun exited $rc after SIGTERM to every rank" "$work/sig.log"
expect_layout "$work/sig.log" "$np" $args
grep -q "received SIGTERM (--exit-signal-handler)" "$work/sig.log" || fail "no signal line" "$work/sig.log"
k=$(latest "$work/sig")
grep -q "exiting program at iteration $k (signal)" "$work/sig.log" \
  || fail "the checkpoint ($k) is not the iteration the run stopped at" "$work/sig.log"
[ "$k" -lt 3000 ] || fail "the signal arrived after the last iteration" "$work/sig.log"
! grep -q "validation loss\|test loss" "$work/sig.log" || fail "evaluated after the signal" "$work/sig.log"
echo "ok SIGTERM to $np ranks: saved and stopped at iteration $k, exit 0"
stop=$((k + 3))
"$@" -np "$np" "$bin" $args --load "$work/sig" --exit-interval "$stop" > "$work/resume.log" 2>&1 \
  || fail "resume" "$work/resume.log"
grep -q "successfully loaded checkpoint from $work/sig at iteration $k" "$work/resume.log" \
  || fail "resume did not load iteration $k" "$work/resume.log"
"$@" -np "$np" "$bin" $args --exit-interval "$stop" > "$work/ref.log" 2>&1 || fail "reference" "$work/ref.log"
steps "$work/ref.log" > "$work/ref.steps"
{ steps "$work/sig.log"; steps "$work/resume.log"; } > "$work/joined.steps"
[ "$(wc -l < "$work/ref.steps")" -eq "$stop" ] || fail "reference printed $(wc -l < "$work/ref.steps") steps, want $stop" "$work/ref.log"
cmp "$work/ref.steps" "$work/joined.steps" > /dev/null || {
  echo "FAIL the interrupted + resumed run differs from the uninterrupted one:"
  diff "$work/ref.steps" "$work/joined.steps" | head -20; exit 1; }
echo "ok resumed from $k to $stop: all $stop lm loss and grad norm values equal the uninterrupted run's"

# ---- 2. --exit-duration-in-mins (1.2 s after the start, start-up included as in Megatron) ----
"$@" -np "$np" "$bin" $args --exit-duration-in-mins 0.02 --save "$work/dur" \
  > "$work/dur.log" 2>&1 || fail "exit-duration run" "$work/dur.log"
k=$(latest "$work/dur")
grep -q "exiting program at iteration $k (exit-duration)" "$work/dur.log" || fail "exit-duration line" "$work/dur.log"
[ "$k" -lt 3000 ] || fail "exit-duration never triggered" "$work/dur.log"
"$@" -np "$np" "$bin" $args --load "$work/dur" --exit-interval $((k + 1)) \
  > "$work/dur2.log" 2>&1 || fail "resume after exit-duration" "$work/dur2.log"
grep -q "iteration *$((k + 1))/" "$work/dur2.log" || fail "resume after exit-duration did not run iteration $((k + 1))" "$work/dur2.log"
echo "ok --exit-duration-in-mins: every rank stopped and saved at iteration $k; resumed at $((k + 1))"

# ---- 3. --exit-interval ----
"$@" -np "$np" "$bin" $args --exit-interval 4 --save "$work/int" > "$work/int.log" 2>&1 \
  || fail "exit-interval run" "$work/int.log"
[ "$(latest "$work/int")" -eq 4 ] || fail "exit-interval saved $(latest "$work/int"), want 4" "$work/int.log"
grep -q "exiting program at iteration 4 (exit-interval)" "$work/int.log" || fail "exit-interval line" "$work/int.log"
"$@" -np "$np" "$bin" $args --load "$work/int" --exit-interval 6 > "$work/int2.log" 2>&1 \
  || fail "resume after exit-interval" "$work/int2.log"
{ steps "$work/int.log"; steps "$work/int2.log"; } > "$work/int.steps"
head -6 "$work/ref.steps" | cmp - "$work/int.steps" > /dev/null \
  || { echo "FAIL exit-interval 4 + resume to 6 differs:"; diff "$work/int.steps" "$work/ref.steps" | head; exit 1; }
echo "ok --exit-interval: saved at 4, resumed to 6 with the uninterrupted run's values"
