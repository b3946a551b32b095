#!/usr/bin/env bash
# Formats every C and CUDA file of the repository with .clang-format (the
# style most of the code was written in; docs/design.md §4). Generated
# files turn formatting off at their top ("clang-format off").
#   bash tools/format.sh          rewrite the files in place
#   bash tools/format.sh --check  list the files that would change; exit 1 if any
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || bash tools/setup.sh
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
if [[ ${1:-} == --check ]]; then
  changed=0
  for f in "${files[@]}"; do
    if ! clang-format --style=file "$f" | cmp -s - "$f"; then
      echo "$f"
      changed=1
    fi
  done
  exit "$changed"
fi
clang-format --style=file -i "${files[@]}"
