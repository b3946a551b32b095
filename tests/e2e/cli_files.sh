#!/usr/bin/env bash
# Files that are not files, and outputs that cannot be written: every
# command that opens or writes a path refuses a FIFO, a device or a
# directory by name before anything can block on it or replace it; build
# write errors give the system's reason; a stale <out>.tmp is never
# touched; a write error on standard output (> /dev/full) fails the
# command with one line. Each case exits 1 or 2 with one line.
set -u
source "$(dirname "$0")/common.bash"
need_file "$EXAMPLE_LIB"
LLM="$KILN_SOURCE_DIR/tests/data/llm/llama"
E="$TMP/llama.engine"
SB="$TMP/sb.engine"
expect_ok "build an LLM engine" "$KILN" build "$LLM" -o "$E"
expect_ok "build the example engine" "$KILN" build "$NET" -o "$SB" --plugins "$EXAMPLE_LIB"
mkfifo "$TMP/fifo"
mkdir "$TMP/dir"

# ---- -o onto what is not a regular file ------------------------------------------------
for target in "$TMP/fifo" "$TMP/dir" /dev/null; do
  expect_error 1 "network build -o $target" "$target|kiln writes only to a regular file or a new path" \
    timeout 20 "$KILN" build "$NET" -o "$target" --plugins "$EXAMPLE_LIB"
  expect_error 1 "LLM build -o $target" "$target|kiln writes only to a regular file or a new path" \
    timeout 20 "$KILN" build "$LLM" -o "$target"
done
[ -p "$TMP/fifo" ] || fail "the FIFO was replaced"
[ -c /dev/null ] || fail "/dev/null was replaced"
expect_error 2 "network build -o ''" "-o needs a file name" "$KILN" build "$NET" -o '' --plugins "$EXAMPLE_LIB"
expect_error 2 "LLM build -o ''" "-o needs a file name" "$KILN" build "$LLM" -o ''
expect_error 1 "network build into a missing directory" "cannot write|No such file or directory" \
  "$KILN" build "$NET" -o "$TMP/missing/x.engine" --plugins "$EXAMPLE_LIB"
expect_error 1 "LLM build into a missing directory" "cannot write|No such file or directory" \
  "$KILN" build "$LLM" -o "$TMP/missing/x.engine"
expect_error 1 "LLM build past the file-size limit" "cannot write|File too large" \
  bash -c "ulimit -f 64; exec \"\$0\" build \"\$1\" -o \"\$2\"" "$KILN" "$LLM" "$TMP/big.engine"
ls "$TMP"/big.engine* >/dev/null 2>&1 && fail "a failed build left files behind: $(ls "$TMP"/big.engine*)"

# ---- a stale <out>.tmp belongs to someone else ---------------------------------------------
echo "not mine" >"$TMP/new.engine.tmp"
expect_ok "LLM build beside an existing <out>.tmp" "$KILN" build "$LLM" -o "$TMP/new.engine"
[ "$(cat "$TMP/new.engine.tmp")" = "not mine" ] || fail "the build touched <out>.tmp"

# ---- reading a FIFO, a directory, a device --------------------------------------------------
for input in "$TMP/fifo" "$TMP/dir" /dev/null; do
  expect_error 1 "inspect $input" "$input|not a regular file" timeout 20 "$KILN" inspect "$input"
  expect_error 1 "run $input" "$input|not a regular file" timeout 20 "$KILN" run "$input" -p hi
  expect_error 1 "exec $input" "$input|not a regular file" \
    timeout 20 "$KILN" exec "$input" --plugins "$EXAMPLE_LIB"
  expect_error 1 "tokenize $input" "$input|not a regular file" timeout 20 "$KILN" tokenize "$input" hi
  expect_error 1 "detokenize $input" "$input|not a regular file" timeout 20 "$KILN" detokenize "$input" 1
  expect_error 1 "chat $input" "$input|not a regular file" timeout 20 "$KILN" chat "$input" </dev/null
done
for input in "$TMP/fifo" /dev/null; do
  expect_error 1 "build from $input" "$input|not a regular file" \
    timeout 20 "$KILN" build "$input" -o "$TMP/y.engine" --plugins "$EXAMPLE_LIB"
done
mkfifo "$TMP/ck.bin" "$TMP/ck.gguf"
expect_error 1 "LLM build from a FIFO llama2.c checkpoint" "ck.bin|not a regular file" \
  timeout 20 "$KILN" build "$TMP/ck.bin" -o "$TMP/y.engine" --tokenizer "$TMP/fifo"
expect_error 1 "LLM build from a FIFO GGUF" "ck.gguf|not a regular file" \
  timeout 20 "$KILN" build "$TMP/ck.gguf" -o "$TMP/y.engine"

# ---- standard output that cannot be written ---------------------------------------------------
full() {
  local what=$1
  shift
  echo "case: $what > /dev/full"
  "$@" >/dev/full 2>"$ERR"
  local rc=$?
  if [ "$rc" -ne 1 ]; then
    fail "$what > /dev/full: exit $rc, expected 1"
  elif ! grep -q '^kiln: error: writing standard output: No space left on device$' "$ERR" ||
       [ "$(grep -c '^kiln: error:' "$ERR")" -ne 1 ]; then
    fail "$what > /dev/full: stderr was $(cat "$ERR")"
  else
    PASSED=$((PASSED + 1))
  fi
}
full "run" "$KILN" run "$E" -p hi -n 3
full "run --json" "$KILN" run "$E" -p hi -n 3 --json
expect_ok "build an LLM engine with a chat template" "$KILN" build "$KILN_SOURCE_DIR/tests/data/llm/smollm" \
  -o "$TMP/chat.engine"
full "chat" bash -c 'echo hi | "$0" chat "$1" -n 3' "$KILN" "$TMP/chat.engine"
full "inspect" "$KILN" inspect "$E"
full "inspect --json" "$KILN" inspect "$E" --json
full "tokenize" "$KILN" tokenize "$E" hello
full "detokenize" "$KILN" detokenize "$E" 5 6
full "exec" "$KILN" exec "$SB" --plugins "$EXAMPLE_LIB" --iterations 1 --warmup 0
full "plugins" "$KILN" plugins
full "build" "$KILN" build "$NET" -o "$TMP/z.engine" --plugins "$EXAMPLE_LIB"
full "--help" "$KILN" --help
full "--version" "$KILN" --version
full "build --help" "$KILN" build --help

finish
