# Shared by the example scripts (sourced). Megatron's examples launch with torchrun; here the
# launcher is mpirun (or srun). LAUNCHER is the command before the rank count (default
# "mpirun -np"), e.g. LAUNCHER="srun -n" or, as root in a container,
# LAUNCHER="mpirun --allow-run-as-root --oversubscribe -np". One-rank runs take no launcher.
#   MG_BIN  folder of the built binaries (default: <repo>/build/bin)
#   WORK    scratch folder for checkpoints, data and logs (default: a new temporary folder)
#   TOY=1   the same flags at a size that runs in seconds on a CPU (what `make test` runs)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MG_BIN=${MG_BIN:-$here/../build/bin}
TOY=${TOY:-0}
if [ -z "${WORK:-}" ]; then
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK"
# launch NP BINARY ARGS...: BINARY under the launcher with NP ranks (one rank: no launcher).
launch() {
  local np=$1
  shift
  if [ "$np" -eq 1 ]; then
    "$@"
  else
    ${LAUNCHER:-mpirun -np} "$np" "$@"
  fi
}
