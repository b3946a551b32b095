#!/usr/bin/env bash
# The SASS size of each kernel of one .cu file, largest first, on any machine
# with nvcc (no GPU needed): a kernel whose code runs once a decode step is
# fetched from L2 each time, and kat_pipe at 120 KB spent a quarter of its
# stalls on instruction fetch (bench/README.md, fourteenth session).
#
#   bash tools/cuda_code_size.sh plugins/attention/attention_cuda.cu [REGEX]
#
# Prints bytes, instructions (16 bytes each on sm_90) and the mangled name of
# every kernel whose name matches REGEX (default: all).
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help || $# -lt 1 ]] && { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
src=$1 pattern=${2:-.}
[[ -f $src ]] || { echo "cuda_code_size: no file $src" >&2; exit 2; }
export PATH="/usr/local/cuda/bin:$PATH"
cubin=$(mktemp --suffix=.cubin)
trap 'rm -f "$cubin"' EXIT
nvcc -arch=sm_90 -O3 -std=c++17 -Iinclude -Isrc -Iplugins -DKILN_HAVE_CUDA=1 --expt-relaxed-constexpr -cubin \
    -o "$cubin" "$src"
readelf -S -W "$cubin" 2>/dev/null | awk '$2 ~ /^\.text\./ { print $6, substr($2, 7) }' |
    while read -r size name; do echo "$((16#$size)) $name"; done |
    grep -E -- "$pattern" | sort -rn | awk '{ printf "%8d bytes %6d instructions  %s\n", $1, $1 / 16, $2 }'
