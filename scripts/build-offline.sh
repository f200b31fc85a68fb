#!/usr/bin/env bash
# Builds xfuser from a dependency bundle (scripts/bundle-deps.sh) and an existing PyTorch, on a
# host with no network and no root, as on an air-gapped GPU cluster.
#
# Usage: scripts/build-offline.sh BUNDLE [BUILD_DIR] [extra cmake arguments...]
#   BUNDLE      the folder of .deb files bundle-deps.sh made
#   BUILD_DIR   default build-offline; the packages are unpacked into BUILD_DIR/deps
#   PYTHON=...  the Python whose PyTorch to build against (default python3): its libtorch is
#               Torch_DIR, and its CUDA runtime and NCCL are the ones xfuser links
#   TARGETS=... what to build (default: everything)
# Needs: a C++17 compiler, CMake >= 3.22, ninja or make, dpkg-deb (or ar and tar), readelf.
# Writes BUILD_DIR/xfuser-env.sh: source it to run the binaries and the bundle's mpirun.
# The binaries carry an RPATH into BUILD_DIR/deps, so they run without it too (mpirun needs it).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { sed -n '2,13p' "$0"; exit 2; }
BUNDLE=$(realpath "$1")
BUILD=${2:-build-offline}
shift $(($# >= 2 ? 2 : 1))
PYTHON=${PYTHON:-python3}
ls "$BUNDLE"/*.deb >/dev/null 2>&1 || { echo "build-offline.sh: no .deb files in $BUNDLE" >&2; exit 1; }
TORCH_DIR=$("$PYTHON" -c 'import torch, os; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))') ||
  { echo "build-offline.sh: $PYTHON cannot import torch (set PYTHON=...)" >&2; exit 1; }

mkdir -p "$BUILD"
PREFIX=$(realpath "$BUILD")/deps
if [[ ! -f "$PREFIX/.unpacked" ]]; then
  rm -rf "$PREFIX"
  mkdir -p "$PREFIX"
  for deb in "$BUNDLE"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$PREFIX"
    else  # a .deb is an ar archive holding data.tar.*
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$PREFIX")
      rm -rf "$tmp"
    fi
  done
  # Absolute links point into the host's /: point them into the prefix instead.
  while IFS= read -r link; do
    target=$(readlink "$link")
    if [[ "$target" == /* && -e "$PREFIX$target" ]]; then ln -sfn "$PREFIX$target" "$link"; fi
  done < <(find "$PREFIX" -type l)
  # update-alternatives' names, made by the packages' install scripts (not in the .debs).
  for tool in mpirun mpiexec mpicc mpicxx mpic++; do
    [[ -e "$PREFIX/usr/bin/$tool.openmpi" ]] && ln -sfn "$tool.openmpi" "$PREFIX/usr/bin/$tool"
  done
  touch "$PREFIX/.unpacked"
fi

ARCH_LIB=$PREFIX/usr/lib/x86_64-linux-gnu
ENV_FILE=$(realpath "$BUILD")/xfuser-env.sh
cat >"$ENV_FILE" <<EOF
# Source this to use the bundle's Open MPI (mpirun) and libraries with the xfuser in $BUILD.
export OPAL_PREFIX="$PREFIX/usr"
export PMIX_MCA_mca_base_component_path="$ARCH_LIB/pmix2/lib/pmix"
export PATH="$PREFIX/usr/bin:$(realpath "$BUILD")/bin:\$PATH"
export LD_LIBRARY_PATH="$ARCH_LIB:$ARCH_LIB/openmpi/lib:$ARCH_LIB/pmix2/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$ARCH_LIB/pkgconfig:$PREFIX/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$PREFIX"
EOF
cat >>"$ENV_FILE" <<'EOF'
# Open MPI 4.1 refuses to start (mpirun, and MPI_Init without mpirun) when neither ssh nor rsh is
# on the PATH, even on one node: without them, launch on this node only.
if [[ -z "${OMPI_MCA_plm:-}" ]] && ! command -v ssh >/dev/null 2>&1 &&
  ! command -v rsh >/dev/null 2>&1; then
  export OMPI_MCA_plm='^rsh'
fi
EOF
# shellcheck disable=SC1090
source "$ENV_FILE"

GEN=()
command -v ninja >/dev/null && [[ ! -f "$BUILD/CMakeCache.txt" ]] && GEN=(-G Ninja)
FFMPEG=OFF
ls "$BUNDLE"/libavcodec-dev_*.deb >/dev/null 2>&1 && FFMPEG=ON
# The .pc files say prefix=/usr: PKG_CONFIG_SYSROOT_DIR moves their paths into the prefix. Open
# MPI's compiler wrapper finds its data under OPAL_PREFIX. RPATH (not RUNPATH) so the bundle's
# libraries resolve the libraries they need themselves.
cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DTorch_DIR="$TORCH_DIR" \
  -DCMAKE_PREFIX_PATH="$PREFIX/usr" \
  -DMPI_CXX_COMPILER="$PREFIX/usr/bin/mpicxx.openmpi" \
  -DMPIEXEC_EXECUTABLE="$PREFIX/usr/bin/mpirun.openmpi" \
  -DXFUSER_WITH_FFMPEG=$FFMPEG \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags" \
  -DCMAKE_SHARED_LINKER_FLAGS="-Wl,--disable-new-dtags" \
  -DCMAKE_BUILD_RPATH="$ARCH_LIB;$ARCH_LIB/openmpi/lib" \
  "$@"
if [[ -n "${TARGETS:-}" ]]; then
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j "$(nproc)" --target $TARGETS
else
  cmake --build "$BUILD" -j "$(nproc)"
fi
echo "build-offline.sh: built in $BUILD against $TORCH_DIR; source $ENV_FILE to run"
