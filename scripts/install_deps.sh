#!/usr/bin/env bash
# Installs the Debian packages Megatron-CPP builds against, and only those that are missing.
# Idempotent; runs as root or through sudo; says what it installs. The CUDA toolkit is not installed
# here: when it is present (nvcc on PATH or /usr/local/cuda) the CUDA platform is built too.
set -euo pipefail

packages=(
  cmake ninja-build g++ ccache pkg-config
  libopenblas-dev     # CPU GEMM (cblas_sgemm/dgemm/sbgemm)
  libopenmpi-dev openmpi-bin  # MPI process groups (distributed issues)
  libgtest-dev libgmock-dev   # unit tests
  libbenchmark-dev            # benchmarks/
  nlohmann-json3-dev          # JSON (configs, checkpoint metadata, tokenizer.json)
  libcli11-dev                # command-line flags
  libyaml-cpp-dev             # --yaml-cfg (pretrain_gpt)
  libpcre2-dev                # tokenizer pre-tokenization regexes
  libsentencepiece-dev        # SentencePieceTokenizer
  libicu-dev                  # HuggingFaceTokenizer: NFC/NFKC normalizers, Unicode properties
  libssl-dev                  # HuggingFaceTokenizer: base64 of the Precompiled normalizer (libcrypto)
  zlib1g-dev libzstd-dev      # preprocess_data: .gz / .zst inputs
  libxxhash-dev               # checkpoint checksums (XXH3-64 per tensor)
  gzip zstd                   # tests write compressed inputs with them
  bible-kjv                   # the demo corpus (make demo; pretrain_gpt_fp8's 300-iteration track)
  clang-format                # make format / the format check of make test (Debian 12: 14)
  protobuf-compiler libprotobuf-dev  # TensorBoard event files (--tensorboard-dir): Event/Summary
  procps                      # pgrep: tests/unit/training/exit_signal.sh signals every rank
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_deps: done"
