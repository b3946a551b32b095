#!/usr/bin/env bash
# src/llm/tokenizer_nfc_data.c is what tools/gen_nfc_tables.py writes from
# the pinned Unicode Character Database (Debian's unicode-data package,
# installed by tools/setup.sh): regenerate it and compare byte for byte.
set -euo pipefail
src=${KILN_SOURCE_DIR:?KILN_SOURCE_DIR is not set}
build=${KILN_BUILD_DIR:?KILN_BUILD_DIR is not set}
ucd=/usr/share/unicode
[[ -f $ucd/UnicodeData.txt && -f $ucd/DerivedNormalizationProps.txt ]] ||
  { echo "SKIP: $ucd has no UnicodeData.txt / DerivedNormalizationProps.txt (tools/setup.sh installs Debian's unicode-data; the GPU machine lacks it)"; exit 77; }
version() { sed -n 's/^ \* \([0-9][0-9.]*\) (Debian.*/\1/p' "$1"; } # the UCD version a generated file names
out=$build/tokenizer_nfc_data.c
python3 "$src/tools/gen_nfc_tables.py" "$ucd" >"$out"
if ! cmp "$out" "$src/src/llm/tokenizer_nfc_data.c"; then
  echo "FAIL: the tables generated from the UCD $(version "$out") differ from src/llm/tokenizer_nfc_data.c (UCD $(version "$src/src/llm/tokenizer_nfc_data.c"))"
  diff "$out" "$src/src/llm/tokenizer_nfc_data.c" | head -20
  exit 1
fi
echo "ok: src/llm/tokenizer_nfc_data.c equals the tables generated from the UCD $(version "$out") in $ucd"
