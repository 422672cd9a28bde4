#!/usr/bin/env bash
# `make demo`: for now, show what this build is and what it runs on (the training demo arrives with
# the model issue).
set -euo pipefail
build=${1:-build}
"$build/bin/megatron_info"
