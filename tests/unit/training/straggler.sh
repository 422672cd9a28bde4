#!/bin/sh
# --log-straggler under mpirun: a rank slowed on purpose (the test hook MG_TEST_STRAGGLER_RANK /
# MG_TEST_STRAGGLER_DELAY_MS, straggler.h) is named as the slowest, with its relative speed, in
# Megatron's MnRtt/MxRtt line; --straggler-minmax-count 2 adds Megatron's Bottom/Top lines; and
# Megatron's timers report every rank with --timing-log-option all (the slowed rank's
# forward-backward the longest) and (min, max) with the default option.
# usage: straggler.sh <pretrain_gpt> <np> <mpiexec> [mpiexec args...]   (np >= 3; CTest label mpi)
set -eu
bin=$1; np=$2; shift 2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size $((2 * np)) --train-iters 4
  --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 300 --log-interval 2
  --eval-iters 0 --seed 7 --log-straggler"
. "$(dirname "$0")/compare_logs.sh"  # expect_layout
fail() { echo "FAIL $1"; [ -z "${2:-}" ] || cat "$2"; exit 1; }

for slow in 1 $((np - 1)); do
  log="$work/slow$slow.log"
  MG_TEST_STRAGGLER_RANK=$slow MG_TEST_STRAGGLER_DELAY_MS=150 \
    "$@" -np "$np" "$bin" $args --timing-log-level 2 --timing-log-option all > "$log" 2>&1 \
    || fail "run with rank $slow slowed" "$log"
  expect_layout "$log" "$np" $args
  [ "$(grep -c "MxRtt/Rnk: [0-9.]*ms/$slow |" "$log")" -eq 2 ] \
    || fail "rank $slow is not the MxRtt rank of both reports" "$log"
  [ "$(grep -c "MnEtpt/Rnk: [0-9.]*TF/$slow |" "$log")" -eq 2 ] \
    || fail "rank $slow is not the MnEtpt rank of both reports" "$log"
  line=$(grep "^straggler: slowest rank $slow: " "$log" | tail -1)
  [ -n "$line" ] || fail "rank $slow not named" "$log"
  # Its relative speed: well below the median rank's (150 ms added to a few ms of compute).
  echo "$line" | awk '{ x = $5; sub("x", "", x); if (x + 0 >= 0.5 || x + 0 <= 0) exit 1 }' \
    || fail "relative speed in '$line'" "$log"
  # Megatron's all-ranks timer report: the slowed rank's forward-backward is the longest.
  awk -v slow="$slow" '
    /^  forward-backward:$/ { fb = 1; next }
    fb && /^     rank/ { r = $2 + 0; t = $3 + 0; if (t > best) { best = t; who = r }; n++; next }
    fb { fb = 0; if (n > 0 && who != slow) bad = 1; n = 0; best = 0; seen++ }
    END { exit (bad || seen < 2) }' "$log" || fail "forward-backward all-ranks report" "$log"
  echo "ok rank $slow of $np slowed: named ($line)"
done

log="$work/minmax.log"
MG_TEST_STRAGGLER_RANK=0 MG_TEST_STRAGGLER_DELAY_MS=150 \
  "$@" -np "$np" "$bin" $args --straggler-minmax-count 2 --timing-log-level 1 > "$log" 2>&1 \
  || fail "minmax-count run" "$log"
grep -q "^\^\^\^\^ Bottom 2 Ranks with lowest  Etpt(TF): [0-9.]*/0," "$log" || fail "Bottom 2 line" "$log"
grep -q "^\^\^\^\^ Top    2 Ranks with highest Etpt(TF):" "$log" || fail "Top 2 line" "$log"
grep -q "^straggler: slowest rank 0: " "$log" || fail "rank 0 not named" "$log"
grep -q "^(min, max) time across ranks (ms):" "$log" || fail "no (min, max) timer report" "$log"
grep -q "^    forward-backward \.*: ([0-9.]*, [0-9.]*)" "$log" || fail "forward-backward min/max" "$log"
! grep -q "^    forward-compute" "$log" || fail "a level-2 timer at --timing-log-level 1" "$log"
echo "ok --straggler-minmax-count 2 and the (min, max) timer report"
