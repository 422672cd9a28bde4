#!/usr/bin/env bash
# Installs the Debian packages Megatron-CPP builds against, and only those that are missing.
# Idempotent; runs as root or through sudo; says what it installs. The CUDA toolkit is not installed
# here: when it is present (nvcc on PATH or /usr/local/cuda) the CUDA platform is built too, and
# the header-only cuDNN frontend (PyPI nvidia-cudnn-frontend, pinned below) is unpacked into
# .deps/cudnn-frontend/include (git-ignored; CMake's MG_CUDNN_FRONTEND_DIR) for the cuDNN fused
# attention provider, which also needs the toolkit's cuDNN 9 (cudnn.h, libcudnn).
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
  python3-pip                 # fetches the cuDNN frontend headers (below)
)
CUDNN_FRONTEND_VERSION=1.16.0  # headers compile with nvcc 13.0 / g++ 12 against cuDNN 9.19

# The cuDNN frontend's headers into .deps/cudnn-frontend/include, once per pinned version, when a
# CUDA toolkit is there (the wheel's include/ only; nothing vendored into the repository).
install_cudnn_frontend() {
  local root dest stamp
  root="$(cd "$(dirname "$0")/.." && pwd)"
  dest="$root/.deps/cudnn-frontend"
  stamp="$dest/VERSION"
  if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "install_deps: no CUDA toolkit, cuDNN frontend not fetched"
    return 0
  fi
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$CUDNN_FRONTEND_VERSION" ]; then
    echo "install_deps: cuDNN frontend $CUDNN_FRONTEND_VERSION present in $dest"
    return 0
  fi
  local tmp
  tmp=$(mktemp -d)
  # Optional: without it (no network, no pip) the build has our attention kernels only.
  if ! python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" \
    "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION"; then
    echo "install_deps: WARNING: could not fetch nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION;" \
      "the CUDA build will have no cuDNN fused attention" >&2
    rm -rf "$tmp"
    return 0
  fi
  rm -rf "$dest"
  mkdir -p "$dest"
  python3 - "$tmp"/nvidia_cudnn_frontend-*.whl "$dest" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    if not any(n.endswith("/cudnn_frontend.h") or n == "include/cudnn_frontend.h" for n in names):
        sys.exit("install_deps: the wheel has no include/cudnn_frontend.h")
    z.extractall(sys.argv[2], names)
PY
  echo "$CUDNN_FRONTEND_VERSION" > "$stamp"
  rm -rf "$tmp"
  echo "install_deps: cuDNN frontend $CUDNN_FRONTEND_VERSION headers in $dest/include"
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  install_cudnn_frontend
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
install_cudnn_frontend
echo "install_deps: done"
