#!/usr/bin/env bash
# Fails when a tracked C++ source is not formatted with the repository's .clang-format
# (Debian's clang-format 14). Fix with: scripts/check-format.sh --fix
set -euo pipefail
cd "$(dirname "$0")/.."
CF="${CLANG_FORMAT:-clang-format-14}"
command -v "$CF" >/dev/null || CF=clang-format
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.hpp' '*.cc')
[[ ${#files[@]} -eq 0 ]] && exit 0
if [[ "${1:-}" == "--fix" ]]; then
  "$CF" -i "${files[@]}"
  exit 0
fi
if ! "$CF" --dry-run --Werror "${files[@]}" 2>/tmp/xfuser-format.log; then
  grep -E "^[^ ].*: (error|warning):" /tmp/xfuser-format.log | cut -d: -f1 | sort -u |
    sed 's/^/not formatted: /'
  echo "run scripts/check-format.sh --fix (clang-format 14)" >&2
  exit 1
fi
