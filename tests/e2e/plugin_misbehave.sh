#!/usr/bin/env bash
# A plugin library that misbehaves in every way the ABI allows
# (tests/plugins/test_misbehave.c, test_duplicate_triple.c): failures with
# and without a message in every call, outputs and dtypes it cannot have,
# huge workspaces, serialize sizes that lie, a triple registered twice, and
# an engine whose plugin layer was rewritten (checksums recomputed) so that
# it no longer matches what the plugin says. Each must give exit 1 and one
# line naming the problem, at build, load or run, never a crash.
set -u
source "$(dirname "$0")/common.bash"
LIB="$TEST_PLUGINS/libtest_misbehave.so"
TWICE="$TEST_PLUGINS/libtest_duplicate_triple.so"
need_file "$LIB"
need_file "$TWICE"
EDIT="$KILN_SOURCE_DIR/tests/tools/engine_edit.py"

net() {
  cat >"$TMP/mb.json" <<JSON
{"kiln_network": 1, "inputs": [{"name": "x", "dtype": "f32", "dims": [2, 3]}],
 "layers": [{"name": "mb", "op": "plugin",
             "plugin": {"name": "Misbehave", "version": "1", "namespace": "kiln.test"},
             "inputs": ["x"], "fields": {"fail": {"type": "string", "data": "$1"}}}],
 "outputs": [{"tensor": "mb", "name": "y"}]}
JSON
}
BUILD=("$KILN" build "$TMP/mb.json" -o "$TMP/mb.engine" --plugins "$LIB")
EXEC=("$KILN" exec "$TMP/mb.engine" --plugins "$LIB" --iterations 1 --warmup 0)

net none
expect_ok "a well-behaved instance builds" "${BUILD[@]}"
expect_ok "and runs" "${EXEC[@]}"

# ---- build-time failures ------------------------------------------------------------
while IFS='|' read -r mode keys; do
  net "$mode"
  expect_error 1 "fails at build: $mode" "$keys" "${BUILD[@]}"
done <<'CASES'
create|refusing to be created|mb
create-silent|create failed with KILN_ERROR_INVALID_ARGUMENT and gave no message
shapes-silent|output_shapes failed with KILN_ERROR_SHAPE and gave no message|mb
dtypes-silent|output_dtypes failed with KILN_ERROR_UNSUPPORTED and gave no message|mb
shapes-rank|rank 99
shapes-expr|not a valid shape expression
dtypes-bad|unusable dtype 1234
supports-none|does not support dtypes
outputs-0|0 outputs
outputs-many|1000000 outputs
workspace-huge|too large
workspace-max|too large
serialize-silent|serialize|failed with KILN_ERROR_FORMAT and gave no message
serialize-grows|wrote 115 bytes into a 15-byte
clone-silent|clone failed with KILN_ERROR_OUT_OF_MEMORY and gave no message
CASES

# ---- load- and run-time failures ----------------------------------------------------
net enqueue
expect_ok "build: enqueue" "${BUILD[@]}"
expect_error 1 "enqueue fails with a message" 'layer "mb"|enqueue failed, as asked' "${EXEC[@]}"
net enqueue-silent
expect_ok "build: enqueue-silent" "${BUILD[@]}"
expect_error 1 "enqueue fails without a message" \
  'layer "mb"|enqueue failed with KILN_ERROR_BACKEND and gave no message' "${EXEC[@]}"
net deserialize-silent
expect_ok "build: deserialize-silent" "${BUILD[@]}"
expect_error 1 "deserialize fails without a message" \
  'layer "mb"|refused its blob|gave no message' "${EXEC[@]}"

# ---- a triple registered twice ------------------------------------------------------------
expect_error 1 "one library registers a triple twice (kiln plugins)" \
  'Twice|registered twice|libtest_duplicate_triple.so' "$KILN" plugins --plugins "$TWICE"
expect_error 1 "one library registers a triple twice, after another library" \
  'Twice|registered twice|libtest_duplicate_triple.so' \
  "$KILN" build "$TMP/mb.json" -o "$TMP/x.engine" --plugins "$LIB" --plugins "$TWICE"

# ---- an engine whose plugin layer no longer matches the plugin ------------------------------
net none
expect_ok "build the engine to rewrite" "${BUILD[@]}"
python3 "$EDIT" "$TMP/mb.engine" "$TMP/dtype.engine" '
for t in plan["tensors"]:
    if t["name"] == "y":
        t["dtype"] = 1' || fail "engine_edit.py failed"
expect_error 1 "a plugin output whose dtype was rewritten" 'layer "mb"|output "y"|is not what plugin Misbehave 1 gives' \
  "$KILN" exec "$TMP/dtype.engine" --plugins "$LIB" --iterations 1 --warmup 0
python3 "$EDIT" "$TMP/mb.engine" "$TMP/shape.engine" '
one = len(plan["exprs"])
plan["exprs"].append([7, -1, -1, 1])
for t in plan["tensors"]:
    if t["name"] == "y":
        t["dims"] = [one, one]' || fail "engine_edit.py failed"
expect_error 1 "a plugin output whose shape was shrunk" 'layer "mb"|output "y"|is not what plugin Misbehave 1 gives' \
  "$KILN" exec "$TMP/shape.engine" --plugins "$LIB" --iterations 1 --warmup 0
python3 "$EDIT" "$TMP/mb.engine" "$TMP/in.engine" '
for t in plan["tensors"]:
    if t["name"] == "x":
        t["dtype"] = 5' || fail "engine_edit.py failed"
expect_error 1 "a plugin input whose dtype was rewritten" 'layer "mb"|output "y"|is not what plugin Misbehave 1 gives' \
  "$KILN" exec "$TMP/in.engine" --plugins "$LIB" --iterations 1 --warmup 0

finish
