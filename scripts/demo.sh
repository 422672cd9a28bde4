#!/usr/bin/env bash
# `make demo`: for now, show what this build is and what it runs on (the training demo arrives with
# the model issue): the full megatron_info report, then the same with the in-tree example plugin
# loaded, to show an out-of-tree override taking a slot.
set -euo pipefail
build=${1:-build}
"$build/bin/megatron_info"
plugin="$build/lib/libmg_example_plugin.so"
echo
echo "== With MG_PLUGINS=$plugin =="
MG_PLUGINS="$plugin" "$build/bin/megatron_info" | grep -E "^Plugins|^  example|plugin:"
