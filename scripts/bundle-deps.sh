#!/usr/bin/env bash
# Gathers the Debian packages xfuser's build needs, besides PyTorch, a C++ compiler, CMake and
# ninja, into one folder: the -dev packages and every library they depend on, minus the base
# system (packages of priority required or important). scripts/build-offline.sh builds xfuser
# from that folder on a host with no network and no root (an air-gapped GPU cluster).
#
# Usage: scripts/bundle-deps.sh [folder] [--no-ffmpeg] [--no-tests] [--slim]
#   folder        where the .deb files go (default: bundle)
#   --no-ffmpeg   leave out FFmpeg (its closure is most of the bundle; MP4 output is then off)
#   --no-tests    leave out GoogleTest and Google Benchmark
#   --slim        repack each package without what a build never reads: documentation, manual
#                 pages, and the static archives of libraries the same package also ships as
#                 shared objects (ICU's are most of the bundle); archives with no shared twin
#                 (GoogleTest's) stay. The repacked .deb files are for build-offline.sh, not dpkg -i
# Runs on a Debian 12 (bookworm) x86-64 machine with network where scripts/install-deps.sh has
# installed the build's packages; needs no root (apt-get download).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=bundle
FFMPEG=1
TESTS=1
SLIM=0
for arg in "$@"; do
  case "$arg" in
    --no-ffmpeg) FFMPEG=0 ;;
    --no-tests) TESTS=0 ;;
    --slim) SLIM=1 ;;
    -*) echo "bundle-deps.sh: unknown option $arg" >&2; exit 2 ;;
    *) OUT="$arg" ;;
  esac
done

PKGS=(libopenmpi-dev openmpi-bin libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
      libpng-dev zlib1g-dev libjpeg62-turbo-dev libsentencepiece-dev libicu-dev pkg-config
      libcpp-httplib-dev)
((TESTS)) && PKGS+=(libgtest-dev libgmock-dev libbenchmark-dev)
((FFMPEG)) && PKGS+=(libavcodec-dev libavformat-dev libavutil-dev libswscale-dev)

# The installed packages and their priorities, in one call: apt chose one package of each
# "a | b" alternative when scripts/install-deps.sh ran, and the bundle follows that choice.
declare -A prio
while read -r name priority status; do
  [[ "$status" == installed ]] && prio[$name]=$priority
done < <(dpkg-query -W -f='${Package} ${Priority} ${db:Status-Status}\n')
for p in "${PKGS[@]}"; do
  [[ -n "${prio[$p]:-}" ]] || { echo "bundle-deps.sh: $p is not installed here: run scripts/install-deps.sh first" >&2; exit 1; }
done
# Not bundled, and not followed further: the base system every host has (priority required or
# important, the C library); the toolchain and its runtime (libstdc++, libgcc), which the build
# host brings itself (an older bundled libstdc++ would shadow the host's, libtorch's included;
# Open MPI's -dev package asks for a Fortran compiler); what only a multi-node launch uses (ssh).
SKIP='^(libstdc\+\+6|libgcc-s1|libatomic1|libjs-|gcc|g\+\+|cpp|gfortran|flang|clang|llvm|binutils|lib(llvm|clang|mlir|flang)|lib(gfortran|gcc|stdc\+\+|objc)-[0-9]+-dev|libc6|libc-|linux-libc-dev|libcrypt|libnsl|libtirpc|rpcsvc-proto|make$|cmake|ninja-build|perl|libperl|openssh|libssl3|libgssapi|libkrb|libk5crypto|libkeyutils|libselinux)'
skip() {
  [[ "${prio[$1]}" == required || "${prio[$1]}" == important ]] && return 0
  [[ "$1" =~ $SKIP ]]
}
# The dependency closure (Depends and Pre-Depends), walked from the packages asked for.
declare -A seen
queue=("${PKGS[@]}")
wanted=()
for p in "${PKGS[@]}"; do seen[$p]=1; done
while ((${#queue[@]})); do
  p=${queue[0]}
  queue=("${queue[@]:1}")
  wanted+=("$p")
  while read -r dep; do
    [[ -z "$dep" || -n "${seen[$dep]:-}" || -z "${prio[$dep]:-}" ]] && continue
    seen[$dep]=1
    skip "$dep" && continue
    queue+=("$dep")
  done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
             --no-replaces --no-enhances "$p" 2>/dev/null |
           sed -n 's/^ *|\?\(Pre\)\?Depends: \([^<][^ ]*\)$/\2/p' | sed 's/:any$//')
done

mkdir -p "$OUT"
(cd "$OUT" && apt-get download "${wanted[@]}" 2>&1 | grep -v "unsandboxed as root" >&2 || true)
if ((SLIM)); then
  # dpkg-deb -R keeps the control files, so the result is still a .deb that dpkg-deb -x (and
  # build-offline.sh's ar + tar fallback) unpacks; xz at its highest preset packs it smallest.
  for deb in "$OUT"/*.deb; do
    tmp=$(mktemp -d)
    dpkg-deb -R "$deb" "$tmp/pkg"
    rm -rf "$tmp/pkg/usr/share/doc" "$tmp/pkg/usr/share/man" "$tmp/pkg/usr/share/info"
    while IFS= read -r archive; do
      stem=${archive%.a}
      if compgen -G "$stem.so*" >/dev/null; then rm -f "$archive"; fi
    done < <(find "$tmp/pkg" -name 'lib*.a')
    dpkg-deb --root-owner-group -Zxz -z9 -b "$tmp/pkg" "$deb" >/dev/null
    rm -rf "$tmp"
  done
fi
{
  echo "# xfuser offline dependency bundle: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# ffmpeg=$FFMPEG tests=$TESTS slim=$SLIM; $(. /etc/os-release && echo "$PRETTY_NAME") $(dpkg --print-architecture)"
  printf '%s\n' "${PKGS[@]}" | sed 's/^/requested: /'
} >"$OUT/MANIFEST"
n=$(ls "$OUT"/*.deb | wc -l)
echo "bundle-deps.sh: $n packages ($(du -sh "$OUT" | cut -f1)) in $OUT"
