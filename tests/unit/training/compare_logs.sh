# Shared by the multi-rank training scripts (sourced, not run): compare the values one field of
# Megatron's log line takes in a reference run and in a candidate run, line by line.
#   values <log> <field>        the values printed after "<field>: ", one per line
#   compare_one <reference> <candidate> <what> <field> <relative tol> <absolute tol>
#                               fails (printing the candidate log) unless the candidate printed as
#                               many values as the reference, each within abs + rel * |reference|
# Needs $work (a scratch directory). $min_lines (default 2): the reference must print at least so
# many values, so that an empty or truncated log never passes.
#   use_test_platform           MG_TEST_PLATFORM=cuda (the *_cuda CTest tests, scripts/
#                               gpu_multirank.sh): replaces $bin by a wrapper that adds
#                               `--platform cuda` to every run, and `--distributed-backend mpi` to
#                               the runs under mpirun, so the ranks share GPU 0 through the MPI
#                               backend (device tensors staged through pinned host memory) and
#                               the one-rank reference runs on the same GPU; expect_layout then
#                               also checks the "platform: cuda" start-up line. Without a usable
#                               CUDA platform it exits 77 (CTest SKIP) printing why. Unset or cpu:
#                               nothing changes. Needs $bin and $work.
values() { grep -o "$2: [^ ]*" "$1" | sed "s/$2: //"; }
use_test_platform() {
  case "${MG_TEST_PLATFORM:-cpu}" in
    cpu) return 0 ;;
    cuda) ;;
    *) echo "FAIL: MG_TEST_PLATFORM must be cpu or cuda, got '$MG_TEST_PLATFORM'"; exit 1 ;;
  esac
  _tp_info="$(dirname "$bin")/megatron_info"
  [ -x "$_tp_info" ] || { echo "FAIL: MG_TEST_PLATFORM=cuda needs $_tp_info (build megatron_info)"; exit 1; }
  if ! "$_tp_info" --platform cuda > "$work/platform.txt" 2>&1; then
    echo "SKIP: MG_TEST_PLATFORM=cuda but the CUDA platform is not usable here:"
    grep -i "cuda" "$work/platform.txt" | head -n 5
    exit 77
  fi
  cat > "$work/pretrain_gpt_cuda" <<EOF_WRAPPER
#!/bin/sh
if [ -n "\${OMPI_COMM_WORLD_SIZE:-}\${PMI_SIZE:-}" ]; then
  exec "$bin" "\$@" --platform cuda --distributed-backend mpi
fi
exec "$bin" "\$@" --platform cuda
EOF_WRAPPER
  chmod +x "$work/pretrain_gpt_cuda"
  bin="$work/pretrain_gpt_cuda"
  echo "CUDA mode: every run with --platform cuda (ranks: --distributed-backend mpi, sharing GPU 0)"
}
compare_one() {
  values "$1" "$4" > "$work/a"; values "$2" "$4" > "$work/b"
  n=$(wc -l < "$work/a")
  [ "$n" -ge "${min_lines:-2}" ] || { echo "FAIL $3: reference printed $n $4 lines"; cat "$1"; exit 1; }
  paste "$work/a" "$work/b" | awk -v what="$3 $4" -v n="$n" -v rel="$5" -v abs="$6" '
    { a = $1 + 0; b = $2 + 0; d = a - b; if (d < 0) d = -d;
      if ($2 == "" || d > rel * (a < 0 ? -a : a) + abs) { print "FAIL " what ": line " NR ": " $1 " vs " $2; bad = 1 } }
    END { if (NR != n) bad = 1; if (bad) exit 1; print "ok " what ": " NR " values agree" }' \
    || { echo "--- $2:"; cat "$2"; exit 1; }
}

# The start-up lines of a pretrain_gpt run show the layout the run asked for, so that a run that
# silently fell back to another layout (fewer ranks, no TP, no CP, ...) cannot pass on its losses:
#   expect_line <log> <what> <regex>   some line of the log matches the extended regex
#   expect_no_line <log> <what> <regex> no line does
#   expect_layout <log> <np> <pretrain_gpt args...>
#       from the arguments (--tensor/--pipeline/--context/--expert-model-parallel-size,
#       --virtual-pipeline-model-parallel-size or --num-layers-per-virtual-pipeline-stage,
#       --sequence-parallel, --use-distributed-optimizer, --use-megatron-fsdp with
#       --data-parallel-sharding-strategy, --use-torch-fsdp2, --cp-comm-type, --num-experts) and <np>:
#       "tensor parallel: TP ranks, sequence parallel on|off", "pipeline parallel: PP p [x VP v]:"
#       with its schedule, "context parallel: CP ranks (type), data-parallel size DP", "data
#       parallel: DPxCP ranks" (the gradient reduce group) with the distributed optimizer and the
#       FSDP strategy when asked for, "mixture of experts: ... expert parallel EP (E/EP experts per rank), expert
#       data parallel EDP"; and no tensor / pipeline / context parallel line for size 1.
# Fails printing the log's start-up summary. Its variables start with _el_ (the scripts are sh).
expect_line() {
  if grep -Eq -- "$3" "$1"; then [ -n "${_el_quiet:-}" ] || echo "ok layout $2: /$3/"; return 0; fi
  echo "FAIL layout $2: no line matches /$3/; the start-up lines of $1:"
  sed -n '/^-* Megatron-CPP/,/^> building/p' "$1"
  exit 1
}
expect_no_line() {
  if ! grep -Eq -- "$3" "$1"; then return 0; fi
  echo "FAIL layout $2: a line matches /$3/:"; grep -E -- "$3" "$1"
  exit 1
}
expect_layout() {
  _el_log=$1; _el_np=$2; shift 2; _el_quiet=1
  _el_tp=1 _el_pp=1 _el_cp=1 _el_ep=1 _el_vp="" _el_sp=off _el_dopt="" _el_comm=p2p _el_experts=0
  _el_overlap="" _el_fsdp="" _el_strategy=no_shard _el_etp=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --tensor-model-parallel-size) _el_tp=$2; shift ;;
      --pipeline-model-parallel-size) _el_pp=$2; shift ;;
      --context-parallel-size) _el_cp=$2; shift ;;
      --expert-model-parallel-size) _el_ep=$2; shift ;;
      --expert-tensor-parallel-size) _el_etp=$2; shift ;;
      --virtual-pipeline-model-parallel-size) _el_vp=" x VP $2"; shift ;;
      --num-layers-per-virtual-pipeline-stage) _el_vp=" x VP [0-9]+"; shift ;;
      --cp-comm-type) _el_comm=$2; shift ;;
      --num-experts) _el_experts=$2; shift ;;
      --sequence-parallel) _el_sp=on ;;
      --use-distributed-optimizer) _el_dopt=".*, distributed optimizer" ;;
      --overlap-grad-reduce) _el_overlap=1 ;;
      --use-megatron-fsdp) _el_fsdp=1 ;;
      --use-torch-fsdp2) _el_fsdp=1 _el_strategy=optim_grads_params ;;
      --data-parallel-sharding-strategy) _el_strategy=$2; shift ;;
    esac
    shift
  done
  if [ -n "$_el_fsdp" ]; then  # FSDP: its strategy on the data-parallel line (dist-opt above no_shard)
    if [ "$_el_strategy" = no_shard ]; then _el_dopt=".*, Megatron FSDP no_shard"
    else _el_dopt=".*, distributed optimizer, Megatron FSDP $_el_strategy([ ,]|\$)"; fi
  fi
  [ "$_el_tp" -gt 1 ] || _el_sp=off
  _el_dp=$((_el_np / (_el_tp * _el_pp * _el_cp)))
  _el_what="np $_el_np = TP $_el_tp x PP $_el_pp x CP $_el_cp x DP $_el_dp"
  [ $((_el_dp * _el_tp * _el_pp * _el_cp)) -eq "$_el_np" ] \
    || { echo "FAIL layout $_el_what: np is not a multiple of TP x PP x CP"; exit 1; }
  if [ "$_el_tp" -gt 1 ]; then
    expect_line "$_el_log" "$_el_what" \
      "^tensor parallel: $_el_tp ranks, sequence parallel $_el_sp,"
  else
    expect_no_line "$_el_log" "$_el_what" "^tensor parallel:"
  fi
  if [ "$_el_pp" -gt 1 ]; then
    if [ -n "$_el_vp" ]; then _el_sched="interleaved 1F1B"; else _el_sched="; 1F1B"; fi
    expect_line "$_el_log" "$_el_what" "^pipeline parallel: PP $_el_pp$_el_vp:.*$_el_sched schedule"
  else
    expect_no_line "$_el_log" "$_el_what" "^pipeline parallel:"
  fi
  if [ "$_el_cp" -gt 1 ]; then
    expect_line "$_el_log" "$_el_what" \
      "^context parallel: $_el_cp ranks \($_el_comm\), data-parallel size $_el_dp\$"
  else
    expect_no_line "$_el_log" "$_el_what" "^context parallel:"
  fi
  if [ $((_el_dp * _el_cp)) -gt 1 ] || [ -n "$_el_dopt$_el_overlap" ]; then
    expect_line "$_el_log" "$_el_what" "^data parallel: $((_el_dp * _el_cp)) ranks $_el_dopt"
  fi
  [ -n "$_el_dopt" ] || expect_no_line "$_el_log" "$_el_what" "^data parallel: .*distributed optimizer"
  [ -n "$_el_fsdp" ] || expect_no_line "$_el_log" "$_el_what" "^data parallel: .*Megatron FSDP"
  if [ "$_el_experts" -gt 0 ]; then
    [ -n "$_el_etp" ] || _el_etp=$_el_tp  # Megatron's default: ETP = TP
    if [ "$_el_ep" -gt 1 ] || [ "$_el_tp" -gt 1 ] || [ "$_el_etp" -gt 1 ]; then
      _el_edp=$((_el_np / (_el_etp * _el_ep * _el_pp)))
    else
      _el_edp=$((_el_dp * _el_cp))
    fi
    expect_line "$_el_log" "$_el_what x EP $_el_ep x ETP $_el_etp" "^mixture of experts: $_el_experts experts,.*\
 expert parallel $_el_ep \($((_el_experts / _el_ep)) experts per rank\), expert data parallel\
 $_el_edp, expert tensor parallel $_el_etp[ ,]"
  fi
  if [ "${MG_TEST_PLATFORM:-cpu}" = cuda ]; then
    expect_line "$_el_log" "$_el_what" "^platform: cuda, device"
  fi
  _el_quiet=""
  echo "ok layout $_el_what$([ "$_el_experts" -gt 0 ] && echo " x EP $_el_ep x ETP $_el_etp"): start-up lines agree"
}
