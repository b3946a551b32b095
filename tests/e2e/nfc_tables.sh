#!/usr/bin/env bash
# src/llm/tokenizer_nfc_data.c is what tools/gen_nfc_tables.py writes from
# the pinned Unicode Character Database (Debian's unicode-data package,
# installed by tools/setup.sh): regenerate it and compare byte for byte.
set -euo pipefail
src=${KILN_SOURCE_DIR:?KILN_SOURCE_DIR is not set}
build=${KILN_BUILD_DIR:?KILN_BUILD_DIR is not set}
ucd=/usr/share/unicode
[[ -f $ucd/UnicodeData.txt && -f $ucd/DerivedNormalizationProps.txt ]] ||
  { echo "FAIL: $ucd has no UnicodeData.txt / DerivedNormalizationProps.txt (tools/setup.sh installs unicode-data)"; exit 1; }
out=$build/tokenizer_nfc_data.c
python3 "$src/tools/gen_nfc_tables.py" "$ucd" >"$out"
if ! cmp "$out" "$src/src/llm/tokenizer_nfc_data.c"; then
  echo "FAIL: the generated tables differ from src/llm/tokenizer_nfc_data.c ($(head -2 "$out" | tail -1 | cut -c4-))"
  diff "$out" "$src/src/llm/tokenizer_nfc_data.c" | head -20
  exit 1
fi
echo "ok: src/llm/tokenizer_nfc_data.c equals the tables generated from $ucd ($(sed -n 2p "$out" | cut -c4-12))"
