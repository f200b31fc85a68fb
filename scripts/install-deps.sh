#!/usr/bin/env bash
# Installs every Debian 12 package that xfuser's build, tests, benchmarks and fast CPU math need.
# Idempotent: when everything is present it prints nothing and exits 0.
# Usage: scripts/install-deps.sh [--with-fuzz] [--with-python]   (as root or with sudo available)
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git clang-format-14
  # math: libtorch (CPU) and a fast BLAS (without it libtorch uses reference BLAS, ~10x slower)
  libtorch-dev libopenblas0-pthread
  # distributed
  openmpi-bin libopenmpi-dev
  # libraries the code uses
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libpng-dev libjpeg62-turbo-dev
  libavcodec-dev libavformat-dev libavutil-dev libswscale-dev
  libsentencepiece-dev sentencepiece libicu-dev
  # `xfuser serve`: HTTP server
  libcpp-httplib-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev jq
  # two simulated hosts for the multi-node test (network namespaces: scripts/two-hosts-mpirun.sh)
  iproute2 util-linux
)
for arg in "$@"; do
  case "$arg" in
    --with-fuzz) PACKAGES+=(clang-14 libclang-rt-14-dev) ;;
    # scripts/cuda-libtorch.sh (PyPI's CUDA torch in a venv) and the fixture generator
    --with-python) PACKAGES+=(python3 python3-venv) ;;
    *) echo "install-deps: unknown option $arg (--with-fuzz, --with-python)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
