#!/usr/bin/env bash
# Numerics fingerprint of a build, for refactors that must keep the numbers bit-identical: runs the
# demo's training and every multi-rank training script of CTest (pretrain_gpt_{dp,tp,pp,cp,moe,
# fsdp,moe_layouts,moe_etp}, deterministic_mode, checkpoint_reshard) with pretrain_gpt behind a
# wrapper that records, per command line (temporary paths removed) and rank, every printed
# "lm loss", "grad norm", "num zeros", "validation loss", MoE "load_balancing_loss" / "z_loss"
# value and per-layer "tokens per expert" list, exactly as printed. Two fingerprints are compared with
# diff: any difference in any printed digit shows.
#   usage: scripts/loss_parity.sh <build-dir> <out-dir>     (writes <out-dir>/fingerprint.txt)
#   e.g.   scripts/loss_parity.sh build /tmp/after && diff /tmp/before/fingerprint.txt /tmp/after/fingerprint.txt
# The build must have been configured with tests (ctest -N lists the commands). Takes a few minutes.
set -euo pipefail
build=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
rm -rf "$out/runs" && mkdir -p "$out/runs"

# A build folder whose pretrain_gpt is a wrapper that runs the real binary and keeps its output
# under a name derived from its arguments; every other program is a link to the real one (the
# scripts find preprocess_data etc. beside pretrain_gpt).
wrapped="$out/build"
rm -rf "$wrapped" && mkdir -p "$wrapped/bin"
for f in "$build"/bin/*; do ln -s "$f" "$wrapped/bin/"; done
ln -s "$build/lib" "$wrapped/lib"
rm "$wrapped/bin/pretrain_gpt"
wrap="$wrapped/bin"
cat > "$wrap/pretrain_gpt" <<EOF
#!/usr/bin/env bash
key=\$(printf '%s\n' "\$@" | sed -E 's#/tmp/tmp\.[A-Za-z0-9]+##g; s#$out##g' | md5sum | cut -c1-12)
rank=\${OMPI_COMM_WORLD_RANK:-0}
log="$out/runs/\$key.r\$rank"
{ printf '%s ' "\$@" | sed -E 's#/tmp/tmp\.[A-Za-z0-9]+##g'; echo; } >> "\$log.cmd"
"$build/bin/pretrain_gpt" "\$@" 2>&1 | tee -a "\$log.out"
exit \${PIPESTATUS[0]}
EOF
chmod +x "$wrap/pretrain_gpt"

# The multi-rank scripts, with the command lines CTest would run, pretrain_gpt swapped for the wrapper.
# (The *_cuda tests are the same scripts on the CUDA platform: not CPU numerics, skipped here.)
ctest --test-dir "$build" -N -V -R 'pretrain_gpt_(dp|tp|pp|cp|moe|fsdp|moe_layouts)_np|pretrain_gpt_moe_etp|deterministic_mode_np|checkpoint_reshard' \
  -E '_cuda$' \
  | sed -n 's/^.*Test command: //p' > "$out/commands.txt"
# The environment CTest gives the mpi tests (tests/CMakeLists.txt).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
n=0
while IFS= read -r cmd; do
  cmd=${cmd//"$build/bin/pretrain_gpt"/"$wrap/pretrain_gpt"}
  n=$((n + 1))
  echo "loss_parity: [$n] ${cmd:0:160}"
  (cd "$build/tests" && eval "$cmd") < /dev/null > "$out/script_$n.log" 2>&1 || { echo "loss_parity: FAILED: $cmd"; tail -30 "$out/script_$n.log"; exit 1; }
done < "$out/commands.txt"

# The demo's training (its tokenizer, data and flags), through the same wrapper.
echo "loss_parity: demo"
bash "$(dirname "$0")/demo.sh" "$wrapped" > "$out/demo.log" 2>&1 || { tail -30 "$out/demo.log"; exit 1; }

# One line per (command, rank, value): the values as printed.
{
  for f in "$out"/runs/*.out; do
    k=$(basename "$f" .out)
    grep -oE '(lm loss|grad norm|num zeros|lm loss value|load_balancing_loss|z_loss): [^ |]+|tokens per expert: \[[^]]*\]' "$f" \
      | sed "s#^#$k #" || true
  done
} | LC_ALL=C sort -s -k1,1 > "$out/fingerprint.txt"
echo "loss_parity: $(wc -l < "$out/fingerprint.txt") values from $(ls "$out"/runs/*.out | wc -l) rank logs -> $out/fingerprint.txt"
