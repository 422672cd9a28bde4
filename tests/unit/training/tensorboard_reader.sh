#!/bin/sh
# TensorBoard event files written by pretrain_gpt under mpirun open in the real reader (the
# `tensorboard` Python package's EventAccumulator): one file, from the last rank; Megatron's scalar
# names; lm loss per iteration equal (as f32) to the log line's; the validation loss and ppl; the
# timers; the flags as text. Exits 77 (CTest SKIP) with the reason when the package is missing.
# usage: tensorboard_reader.sh <pretrain_gpt> <np> <mpiexec> [mpiexec args...]
set -eu
bin=$1; np=$2; shift 2
python3 -c "import tensorboard" 2>/dev/null || {
  echo "SKIP: the tensorboard Python package is not installed (pip install tensorboard)"; exit 77; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 8 --train-iters 6
  --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 300 --log-interval 1
  --eval-iters 1 --eval-interval 3 --seed 7 --tensorboard-dir $work/tb --log-timers-to-tensorboard
  --timing-log-level 1 --log-validation-ppl-to-tensorboard --log-memory-to-tensorboard
  --log-world-size-to-tensorboard --log-batch-size-to-tensorboard"
. "$(dirname "$0")/compare_logs.sh"  # expect_layout
"$@" -np "$np" "$bin" $args > "$work/run.log" 2>&1 || { cat "$work/run.log"; exit 1; }
expect_layout "$work/run.log" "$np" $args
grep -o 'lm loss: [^ ]*' "$work/run.log" | sed 's/lm loss: //' > "$work/losses"
grep -o 'validation loss at iteration [0-9]* | lm loss value: [^ ]*' "$work/run.log" \
  | sed 's/.*value: //' > "$work/valid"
WORK=$work NP=$np python3 - <<'PY'
import glob, math, os, sys
from tensorboard.backend.event_processing import event_accumulator as ea
work, np_ = os.environ["WORK"], int(os.environ["NP"])
files = glob.glob(os.path.join(work, "tb", "events.out.tfevents.*"))
assert len(files) == 1, f"want one event file (the last rank's), got {files}"
acc = ea.EventAccumulator(os.path.join(work, "tb"), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
want = {"lm loss", "lm loss vs samples", "learning-rate", "learning-rate vs samples",
        "batch-size", "loss-scale", "world-size", "grad-norm", "mem-allocated-bytes",
        "mem-max-allocated-bytes", "mem-reserved-bytes", "iteration-time", "forward-backward-time",
        "optimizer-time", "lm loss validation", "lm loss validation ppl", "lm loss test"}
missing = want - tags
assert not missing, f"missing scalars {sorted(missing)}; have {sorted(tags)}"
def f32(x):
    import struct
    return struct.unpack("f", struct.pack("f", x))[0]
logged = [float(x) for x in open(os.path.join(work, "losses")).read().split()]
tb = [(e.step, e.value) for e in acc.Scalars("lm loss")]
assert [s for s, _ in tb] == list(range(1, 7)), tb
for (step, v), want_v in zip(tb, logged):
    # the log prints 7 significant digits of the same value TensorBoard holds as f32
    assert abs(v - want_v) <= 5e-7 * abs(want_v), (step, v, want_v)
valid = [float(x) for x in open(os.path.join(work, "valid")).read().split()]
tv = [(e.step, e.value) for e in acc.Scalars("lm loss validation")]
assert [s for s, _ in tv] == [3, 6], tv
for (_, v), w in zip(tv, valid):
    assert abs(v - w) <= 5e-7 * abs(w), (v, w)
ppl = acc.Scalars("lm loss validation ppl")
assert abs(ppl[0].value - math.exp(valid[0])) <= 1e-5 * math.exp(valid[0]), (ppl[0].value, valid[0])
ws = acc.Scalars("world-size")
assert all(e.value == np_ for e in ws), ws
samples = [e.step for e in acc.Scalars("lm loss vs samples")]
assert samples == [8 * i for i in range(1, 7)], samples
text = acc.Tensors("tensorboard_dir")[0].tensor_proto.string_val[0].decode()
assert text == os.path.join(work, "tb"), text
print(f"ok TensorBoard {ea.__name__.split('.')[0]} reader: {len(tags)} scalar tags, "
      f"lm loss {len(tb)} steps equal to the log, validation + ppl, world-size {np_}")
PY
