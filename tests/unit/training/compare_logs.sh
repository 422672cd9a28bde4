# Shared by the pretrain_gpt_*.sh mpi tests (sourced, not run): compare the values one field of
# Megatron's log line takes in a reference run and in a candidate run, line by line.
#   values <log> <field>        the values printed after "<field>: ", one per line
#   compare_one <reference> <candidate> <what> <field> <relative tol> <absolute tol>
#                               fails (printing the candidate log) unless the candidate printed as
#                               many values as the reference, each within abs + rel * |reference|
# Needs $work (a scratch directory). $min_lines (default 2): the reference must print at least so
# many values, so that an empty or truncated log never passes.
values() { grep -o "$2: [^ ]*" "$1" | sed "s/$2: //"; }
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
