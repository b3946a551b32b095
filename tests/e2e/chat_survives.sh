#!/usr/bin/env bash
# `kiln chat` survives what one message can do wrong: a line that is not
# UTF-8, a line longer than the engine's context (or than 1 MiB), and a
# conversation that outgrows the context. Each is reported in one warning
# line and the session goes on to answer the next message; exit 0.
set -u
source "$(dirname "$0")/common.bash"
E="$TMP/chat.engine"
expect_ok "build an LLM engine with a chat template" "$KILN" build "$KILN_SOURCE_DIR/tests/data/llm/smollm" -o "$E"

# chat_case WHAT INPUT_FILE WARNING: the session ends with exit 0, warns
# once with WARNING, and answers the last line ("hello") after it.
chat_case() {
  echo "case: $1"
  "$KILN" chat "$E" -n 3 --seed 1 <"$2" >"$OUT" 2>"$ERR"
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    fail "$1: exit $rc, expected 0; stderr: $(head -c 500 "$ERR")"
  elif ! grep -qF -- "$3" "$ERR"; then
    fail "$1: stderr lacks \"$3\": $(head -c 500 "$ERR")"
  elif [ "$(grep -c '^prompt:' "$ERR")" -lt 1 ]; then
    fail "$1: no message was answered after the bad one"
  elif grep -q '^kiln: error' "$ERR"; then
    fail "$1: the session reported an error: $(grep '^kiln: error' "$ERR")"
  else
    PASSED=$((PASSED + 1))
  fi
}

printf '\377\376 not utf-8\nhello\n' >"$TMP/bad-utf8.txt"
chat_case "a line that is not UTF-8" "$TMP/bad-utf8.txt" "line 1 skipped: not valid UTF-8 at byte 0"
printf 'caf\303\251 \355\240\200 surrogate\nhello\n' >"$TMP/surrogate.txt"
chat_case "a line with an encoded surrogate" "$TMP/surrogate.txt" "line 1 skipped: not valid UTF-8 at byte 6"
python3 -c 'print("word " * 2000); print("hello")' >"$TMP/long.txt"
chat_case "a line longer than the context" "$TMP/long.txt" "line 1 skipped: the message takes"
python3 -c 'print("x" * (2 << 20)); print("hello")' >"$TMP/huge.txt"
chat_case "a line longer than 1 MiB" "$TMP/huge.txt" "line 1 skipped: longer than 1048576 bytes"
python3 -c '
for i in range(40):
    print("message number %d with a few more words in it" % i)
print("hello")' >"$TMP/many.txt"
chat_case "a conversation that outgrows the context" "$TMP/many.txt" \
  "the conversation no longer fit in 256 tokens: dropped the oldest turn"
n=$(grep -c '^prompt:' "$ERR")
[ "$n" -eq 41 ] || fail "every one of the 41 messages is answered (got $n)"

finish
