#!/usr/bin/env bash
# The format gate of `make test` (`make format-check`): every tracked C++/CUDA file
# (git ls-files *.cpp *.h *.cu *.cuh) must already be formatted by clang-format with the repo's
# .clang-format. Changes nothing: lists the files that are not, and fails; `make format` fixes them.
# The reference clang-format is Debian 12's (version 14, installed by scripts/install_deps.sh);
# another major version may format a few constructs differently, so it says which one it ran.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || {
  echo "check_format: clang-format not found (scripts/install_deps.sh installs it)" >&2
  exit 1
}
version=$(clang-format --version)
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || {
  echo "check_format: not a git checkout, nothing to list: skipped" >&2
  exit 0
}
# One clang-format process over all files (per-file runs take a minute on a busy machine); its
# diagnostics ("<file>:<line>:<col>: error: code should be clang-formatted") name the files.
out=$(git ls-files -z '*.cpp' '*.h' '*.cu' '*.cuh' | xargs -0 clang-format --dry-run -Werror 2>&1) \
  && rc=0 || rc=$?
mapfile -t bad < <(printf '%s\n' "$out" | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: .*/\1/p' | sort -u)
if [ "$rc" -ne 0 ] && [ ${#bad[@]} -eq 0 ]; then
  printf '%s\n' "$out" >&2
  echo "check_format: clang-format failed (exit $rc)" >&2
  exit 1
fi
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: ${#bad[@]} file(s) not formatted ($version; run \`make format\`):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: all $(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | wc -l) C++/CUDA files formatted ($version)"
