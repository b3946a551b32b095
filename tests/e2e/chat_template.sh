#!/usr/bin/env bash
# The checkpoint's own chat template: an engine built from a checkpoint
# whose tokenizer_config.json carries Zephyr's template (one no built-in
# format writes) renders `kiln run --chat` with it: its prompt ids are those
# of the text transformers' render_jinja_template made for the same turn
# (tests/data/chat/reference.json). A template that raises refuses the
# conversation with its message; one kiln cannot parse fails the build
# naming the construct and line.
set -u
source "$(dirname "$0")/common.bash"

D="$KILN_SOURCE_DIR/tests/data"
need_file "$D/llm/tinyllama/config.json"
need_file "$D/chat/reference.json"

# with_template NAME DIR: a copy of the tinyllama checkpoint whose
# tokenizer_config.json has templates.json's NAME (or, for NAME "macro", a
# template using a macro, which kiln does not support).
with_template() {
  cp -r "$D/llm/tinyllama" "$2"
  python3 - "$D/chat/templates.json" "$1" "$2/tokenizer_config.json" <<'PY'
import json, sys
templates = {t["name"]: t["template"] for t in json.load(open(sys.argv[1]))["templates"]}
templates["macro"] = "{{ bos_token }}\n{% macro turn(m) %}{{ m.content }}{% endmacro %}"
cfg = json.load(open(sys.argv[3]))
cfg["chat_template"] = templates[sys.argv[2]]
json.dump(cfg, open(sys.argv[3], "w"))
PY
}

with_template zephyr "$TMP/zephyr"
expect_ok "build with Zephyr's template" "$KILN" build "$TMP/zephyr" -o "$TMP/zephyr.engine" --max-seq-len 96
expect_ok "run --chat with it" "$KILN" run "$TMP/zephyr.engine" --chat -p "Hello!" -n 1 --temperature 0 --json
cp "$OUT" "$TMP/run.json"
echo "case: prompt ids are those of transformers' rendering, tokenized by the engine"
if python3 - "$D/chat/reference.json" "$KILN" "$TMP/zephyr.engine" "$TMP/run.json" <<'PY'
import json, subprocess, sys
ref, kiln, engine, run = sys.argv[1:]
text = next(c["output"] for c in json.load(open(ref))["cases"]
            if c["template"] == "zephyr" and c["conversation"] == "user" and c["add_generation_prompt"])
want = json.loads(subprocess.run([kiln, "tokenize", engine, text], capture_output=True, check=True).stdout)
got = json.load(open(run))["prompt_ids"]
# kiln tokenize adds BOS as tokenizer.encode does; a chat prompt is only what the template wrote
if want[:1] != got[:1]:
    want = want[1:]
print("  got  %s\n  want %s" % (got, want))
sys.exit(0 if got == want else 1)
PY
then PASSED=$((PASSED + 1)); else fail "prompt ids differ from transformers' rendering"; fi

with_template mistral-v0.1 "$TMP/mistral"
expect_ok "build with Mistral v0.1's template" "$KILN" build "$TMP/mistral" -o "$TMP/mistral.engine" --max-seq-len 96
expect_error 1 "a system turn refused by the template" "roles must alternate" \
  "$KILN" run "$TMP/mistral.engine" --chat --system "Be terse." -p "Hi" -n 1

with_template macro "$TMP/macro"
expect_error 1 "a template kiln cannot parse fails the build" "chat_template|line 2|unsupported tag 'macro'" \
  "$KILN" build "$TMP/macro" -o "$TMP/macro.engine"

finish
