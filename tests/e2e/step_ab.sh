#!/usr/bin/env bash
# bench/step_ab (decode steps of two variants alternated in one process) on
# a CPU engine of the tiny "llama" checkpoint: in both modes every decode
# step after the first of each request is timed and counted, the figures
# are positive, and bad options are refused with one line and status 2.
set -u
source "$(dirname "$0")/common.bash"

AB="$KILN_BUILD_DIR/bin/step_ab"
E=$TMP/llama.engine
expect_ok "step_ab --help" "$AB" --help
expect_ok "build llama f32" "$KILN" build "$KILN_SOURCE_DIR/tests/data/llm/llama" -o "$E" --max-seq-len 128

# 3 requests of 20 tokens: 20 steps each (the prompt's, then 19 decodes),
# the first two not counted
expect_ok "one engine, the variable set before each step" \
  "$AB" "$E" --env KILN_STEP_AB_TEST=a,b --prompt-len 12 --gen-len 20 --requests 3 --block 2 --json
check_json "counts and ratios (one engine)" "r['steps'] == 3 * 18" "r['instances'] == 0" "r['step_ms_a'] > 0" \
  "r['step_ms_b'] > 0" "0 < r['block_ratio_p25'] <= r['block_ratio_median'] <= r['block_ratio_p75']" \
  "r['variable'] == 'KILN_STEP_AB_TEST' and r['a'] == 'a' and r['b'] == 'b'"
expect_ok "two instances" "$AB" "$E" --env KILN_STEP_AB_TEST=a,b --prompt-len 12 --gen-len 20 --requests 3 --instances --json
check_json "counts (two instances)" "r['steps'] == 2 * 3 * 18" "r['instances'] == 1" "r['blocks'] > 0"

bad() { # WHAT KEYWORD ARGS...: status 2, stderr's first line "step_ab: error:" with KEYWORD
  local what=$1 key=$2
  shift 2
  echo "case: $what"
  run "$AB" "$@"
  if [ "$RC" -eq 2 ] && head -n 1 "$ERR" | grep -q "^step_ab: error: .*$key"; then
    PASSED=$((PASSED + 1))
  else
    fail "$what: exit $RC; stderr: $(cat "$ERR")"
  fi
}
bad "no --env" "--env NAME=A,B is required" "$E"
bad "--env without two values" "--env NAME=A,B is required" "$E" --env KILN_X=1
bad "a zero block" "--block takes a whole number" "$E" --env KILN_X=1,2 --block 0
bad "an unknown option" "unknown or incomplete option" "$E" --env KILN_X=1,2 --fast
finish
