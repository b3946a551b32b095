#!/usr/bin/env bash
# examples/llm_scheduler, the request-level scheduler from a program: it
# includes <kiln/kiln.h> (and libc) only and links libkiln alone; the
# requests it submits together from the tiny SmolLM checkpoint each get
# exactly the greedy tokens transformers gives their prompt alone
# (tests/data/llm/smollm/refs.json, make_references.py), a first logprob
# that is a log-probability, and the one it cancels at once ends
# cancelled before its 32 tokens.
source "$(dirname "$0")/common.bash"

EX="$KILN_BUILD_DIR/bin/llm_scheduler"
SRC="$KILN_SOURCE_DIR/examples/llm_scheduler/llm_scheduler.c"
D="$KILN_SOURCE_DIR/tests/data/llm/smollm"
need_file "$D/refs.json"
if [ ! -x "$EX" ]; then
  echo "SKIP: $EX is not built"
  exit 77
fi

echo "case: includes <kiln/kiln.h> and libc headers only"
if grep -E '^#include' "$SRC" | grep -v -E '^#include <(kiln/kiln\.h|pthread\.h|stdio\.h|stdlib\.h|string\.h)>$' | grep .; then
  fail "other includes in $SRC"
else
  PASSED=$((PASSED + 1))
fi

echo "case: links libkiln.so and no other library"
needed=$(readelf -d "$EX" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' |
  grep -v -E '^(libc|libm|libgcc_s|libpthread|libdl|librt|libstdc\+\+)\.so' | sort | tr '\n' ' ')
if [ "$needed" = "libkiln.so " ]; then
  PASSED=$((PASSED + 1))
else
  fail "NEEDED: $needed"
fi

prompts=()
for i in 1 6 3; do
  prompts+=("$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])]["text"])' \
    "$D/refs.json" "$i")")
done
expect_ok "three requests together and a cancelled one" "$EX" "$D" "$TMP/smollm.engine" 32 "${prompts[@]}"
python3 - "$D/refs.json" "$ERR" <<'PY' && PASSED=$((PASSED + 1)) || fail "the requests' tokens differ from transformers'"
import json, math, re, sys
refs = json.load(open(sys.argv[1]))["prompts"]
lines = [l for l in open(sys.argv[2]).read().splitlines() if l.startswith("request ")]
got = {}
for l in lines:
    m = re.match(r"request (\d+): prompt_ids:([\d ]*); generated_ids:([\d ]*); first_logprob: (\S+); finish: (\w+)", l)
    got[int(m.group(1))] = ([int(x) for x in m.group(2).split()], [int(x) for x in m.group(3).split()],
                            float(m.group(4)), m.group(5))
ok = len(got) == 4
for k, i in enumerate([1, 6, 3]):
    prompt, gen, lp, finish = got[k]
    if not (prompt == refs[i]["ids"] and gen == refs[i]["greedy"] and finish == "length" and -50 < lp <= 0):
        print("request", k, "kiln", prompt, gen, lp, finish, file=sys.stderr)
        print("  ref", refs[i]["ids"], refs[i]["greedy"], file=sys.stderr)
        ok = False
prompt, gen, lp, finish = got[3]
# Cancelled at the next step boundary: at most a few tokens got out.
ok = ok and prompt == refs[1]["ids"] and gen == refs[1]["greedy"][:len(gen)] and len(gen) < 32 and finish == "cancelled"
sys.exit(0 if ok else 1)
PY
if grep -q "finished: 3; cancelled: 1" "$ERR"; then PASSED=$((PASSED + 1)); else fail "stats: $(tail -1 "$ERR")"; fi
finish
