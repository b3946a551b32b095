#!/usr/bin/env bash
# Engines rewritten the way a hostile user would, with every checksum
# recomputed (tests/tools/engine_edit.py), so that only the reader's plan
# checks stand between the file and the runtime: a weight named as a
# layer's output, the profiles removed, an arena offset unaligned or past
# the arena, a tensor smaller than its shapes, dtypes and ranks against a
# layer's rules, layers out of order. `kiln inspect` and `kiln run` must
# both refuse each with exit 1 and one line, never crash or run.
set -u
source "$(dirname "$0")/common.bash"
EDIT="$KILN_SOURCE_DIR/tests/tools/engine_edit.py"
E="$TMP/llama.engine"
expect_ok "build the tiny llama engine" "$KILN" build "$KILN_SOURCE_DIR/tests/data/llm/llama" -o "$E"
python3 "$EDIT" "$E" "$TMP/same.engine" 'pass' || fail "engine_edit.py failed"
expect_ok "a rewritten but unchanged engine runs" "$KILN" run "$TMP/same.engine" -p hi -n 2

# rewrite NAME 'PYTHON' 'KEYWORDS': edits the plan, then expects inspect and
# run to refuse it naming KEYWORDS.
rewrite() {
  python3 "$EDIT" "$E" "$TMP/$1.engine" "$2" || fail "engine_edit.py failed on $1"
  expect_error 1 "inspect: $1" "$3" "$KILN" inspect "$TMP/$1.engine"
  expect_error 1 "run: $1" "$3" "$KILN" run "$TMP/$1.engine" -p hi -n 2
}

rewrite weight-output '
l = next(l for l in plan["layers"] if l["name"].endswith("mlp.swiglu"))
l["outputs"][0] = next(i for i, t in enumerate(plan["tensors"]) if t["flags"] & 4)' \
  'mlp.swiglu|writes the constant|outputs are activations'
rewrite input-output '
l = next(l for l in plan["layers"] if l["name"].endswith("mlp.swiglu"))
l["outputs"][0] = plan["inputs"][0]' 'writes the input'
rewrite no-profile 'plan["profiles"] = []' 'is dynamic but there is no optimization profile'
rewrite unaligned '
t = [t for t in plan["tensors"] if t["arena_offset"] > 0][3]
t["arena_offset"] += 2
plan["arena_size"] += 256' 'is not aligned to 256 bytes'
rewrite past-arena '
t = [t for t in plan["tensors"] if t["arena_offset"] > 0][3]
t["arena_offset"] = plan["arena_size"]' 'exceeds the'
rewrite too-small '
t = next(t for t in plan["tensors"] if t["name"].endswith("mlp.swiglu"))
t["max_bytes"] = 256' 'mlp.swiglu|needs|bytes but the plan gives it 256'
rewrite matmul-dtype '
l = next(l for l in plan["layers"] if l["op"] == 1)
plan["tensors"][l["outputs"][0]]["dtype"] = 2' 'matmul output|is bf16, its rules give f32'
rewrite gather-rank '
l = next(l for l in plan["layers"] if l["op"] == 9)
plan["tensors"][l["outputs"][0]]["dims"].pop()' 'gather output|has rank 1, its rules give 2'
rewrite order '
L = plan["layers"]
L[1], L[2] = L[2], L[1]
for i in (1, 2):
    for t in L[i]["outputs"]:
        plan["tensors"][t]["producer"] = i' 'reads tensor|before layer'
rewrite producer '
t = next(t for t in plan["tensors"] if t["producer"] == 3)
t["producer"] = 4' 'whose producer is layer 4'
rewrite flags '
plan["tensors"][plan["outputs"][0]]["flags"] = 0' 'input/output flags disagree'
rewrite overlap '
T = plan["tensors"]
l = next(l for l in plan["layers"] if l["op"] == 1 and T[l["inputs"][0]]["flags"] == 0)
x, y = T[l["inputs"][0]], T[l["outputs"][0]]
y["arena_offset"] = x["arena_offset"]' 'share arena bytes while both are live'
rewrite io-overlap '
l = next(l for l in plan["layers"] if l["op"] == 1)
y = plan["tensors"][l["outputs"][0]]
io = max(plan["inputs"] + plan["outputs"], key=lambda t: plan["tensors"][t]["max_bytes"])
y["arena_offset"] = plan["tensors"][io]["arena_offset"]' 'share arena bytes while both are live'
rewrite workspace 'plan["workspace_size"] = 100' 'workspace_size 100 is not a multiple of 256'

finish
