#!/usr/bin/env bash
# Numbers on the command line: one past a limit (or past 64 bits) is a
# usage error that names the limit, never clamped or wrapped and never
# "expects a non-negative integer" when the number is one.
set -u
source "$(dirname "$0")/common.bash"
LLM="$KILN_SOURCE_DIR/tests/data/llm/llama"
E="$TMP/llama.engine"
expect_ok "build an LLM engine" "$KILN" build "$LLM" -o "$E"

expect_error 2 "--seed past 64 bits" '--seed 99999999999999999999999|0..18446744073709551615' \
  "$KILN" run "$E" -p hi --seed 99999999999999999999999
expect_ok "--seed at 2^64-1" "$KILN" run "$E" -p hi -n 2 --seed 18446744073709551615
expect_error 2 "--seed negative" '--seed expects an integer' "$KILN" run "$E" -p hi --seed -1
expect_error 2 "-n past its limit" '-n 1000000000000|0..100000000' "$KILN" run "$E" -p hi -n 1000000000000
expect_error 2 "-n past 64 bits" '-n 99999999999999999999|0..100000000' \
  "$KILN" run "$E" -p hi -n 99999999999999999999
expect_error 2 "--top-k past int32" '--top-k 99999999999|0..2147483647' \
  "$KILN" run "$E" -p hi --top-k 99999999999
expect_error 2 "chat -n past its limit" '-n 1000000000000|0..100000000' \
  "$KILN" chat "$E" -n 1000000000000
expect_error 2 "--max-seq-len past its limit" '--max-seq-len 99999999999|1..16777216' \
  "$KILN" build "$LLM" -o "$TMP/x.engine" --max-seq-len 99999999999
expect_error 2 "--max-batch 0" '--max-batch 0|1..16777216' \
  "$KILN" build "$LLM" -o "$TMP/x.engine" --max-batch 0
expect_error 2 "a token id past int32" 'token id 99999999999|0..2147483647' \
  "$KILN" detokenize "$E" 99999999999
expect_error 2 "exec --iterations not an integer" '--iterations expects an integer, got "1e9"' \
  "$KILN" exec "$E" --iterations 1e9
expect_error 2 "exec --warmup past its limit" '--warmup 100000001|0..100000000' \
  "$KILN" exec "$E" --warmup 100000001

finish
