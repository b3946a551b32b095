#!/usr/bin/env bash
# examples/llm_generate, the program that uses the LLM API from outside:
# it includes <kiln/kiln.h> and no other kiln header, it needs libkiln.so
# and nothing else of kiln's, and the engine it builds from the tiny SmolLM
# checkpoint generates exactly the greedy tokens transformers does
# (tests/data/llm/smollm/refs.json, written by make_references.py).
source "$(dirname "$0")/common.bash"

EX="$KILN_BUILD_DIR/bin/llm_generate"
SRC="$KILN_SOURCE_DIR/examples/llm_generate/llm_generate.c"
D="$KILN_SOURCE_DIR/tests/data/llm/smollm"
need_file "$D/refs.json"
if [ ! -x "$EX" ]; then
  echo "SKIP: $EX is not built"
  exit 77
fi

echo "case: includes <kiln/kiln.h> and no other kiln header"
if grep -E '^#include' "$SRC" | grep -v -E '^#include <(kiln/kiln\.h|stdio\.h|stdlib\.h|string\.h)>$' | grep .; then
  fail "other includes in $SRC"
else
  PASSED=$((PASSED + 1))
fi

# The C runtime's own libraries (a sanitizer build adds libm, libgcc_s,
# ...) aside, libkiln is the only library it needs.
echo "case: links libkiln.so and no other library"
needed=$(readelf -d "$EX" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' |
  grep -v -E '^(libc|libm|libgcc_s|libpthread|libdl|librt|libstdc\+\+)\.so' | sort | tr '\n' ' ')
if [ "$needed" = "libkiln.so " ]; then
  PASSED=$((PASSED + 1))
else
  fail "NEEDED: $needed"
fi

for i in 1 6; do
  prompt=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])]["text"])' \
    "$D/refs.json" "$i")
  expect_ok "build and generate: $prompt" "$EX" "$D" "$TMP/smollm.engine" "$prompt" 32
  python3 - "$D/refs.json" "$i" "$ERR" <<'PY' && PASSED=$((PASSED + 1)) || fail "tokens of prompt $i differ from transformers'"
import json, sys
ref = json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])]
lines = dict(l.split(":", 1) for l in open(sys.argv[3]).read().splitlines() if ":" in l)
prompt = [int(x) for x in lines["prompt_ids"].split()]
gen = [int(x) for x in lines["generated_ids"].split()]
ok = prompt == ref["ids"] and len(gen) == 32 and gen == ref["greedy"] and lines["finish"].strip() == "length"
if not ok:
    print("kiln prompt", prompt, "generated", gen, file=sys.stderr)
    print("ref   prompt", ref["ids"], "greedy", ref["greedy"], file=sys.stderr)
sys.exit(0 if ok else 1)
PY
done

expect_error_example() {
  echo "case: $1"
  run "${@:2}"
  if [ "$RC" -eq 1 ] && grep -q "llm_generate: build: .*not a checkpoint" "$ERR"; then
    PASSED=$((PASSED + 1))
  else
    fail "$1: exit $RC, stderr: $(cat "$ERR")"
  fi
}
expect_error_example "a file that is no checkpoint" "$EX" "$SRC" "$TMP/x.engine" "hi"

finish
