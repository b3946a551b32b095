#!/usr/bin/env bash
# Every plugin error of the issue, through the CLI: each exits 1 with one
# line "kiln: error: ..." naming what is wrong.
#  - an engine loaded without its plugin library
#  - name / version / namespace mismatches (engine and network side)
#  - unknown, missing and mistyped plugin fields
#  - plugin blob schema versions older and newer than the plugin reads
set -u
source "$(dirname "$0")/common.bash"
need_file "$EXAMPLE_LIB"
V2="$TEST_PLUGINS/libtest_scale_bias_v2.so"
NS="$TEST_PLUGINS/libtest_scale_bias_ns.so"
BLOB0="$TEST_PLUGINS/libtest_blob_v0.so"
BLOB2="$TEST_PLUGINS/libtest_blob_v2.so"
for lib in "$V2" "$NS" "$BLOB0" "$BLOB2"; do need_file "$lib"; done
E="$TMP/sb.engine"

expect_ok "build the example engine" "$KILN" build "$NET" -o "$E" --plugins "$EXAMPLE_LIB"

# ---- missing library --------------------------------------------------------------
expect_error 1 "exec an engine without its plugin library" \
  'not registered|"ScaleBias" version "1" namespace ""|libkiln_scale_bias.so|--plugins' \
  "$KILN" exec "$E"

# ---- version and namespace mismatches ---------------------------------------------
expect_error 1 "exec with only a ScaleBias version 2 library: version mismatch, near miss named" \
  'not registered|"ScaleBias" version "1"|near misses: ScaleBias 2|libtest_scale_bias_v2.so' \
  "$KILN" exec "$E" --plugins "$V2"
expect_error 1 "exec with only a ScaleBias namespace \"test\" library: namespace mismatch" \
  'not registered|namespace ""|near misses|namespace "test"|libtest_scale_bias_ns.so' \
  "$KILN" exec "$E" --plugins "$NS"
expect_error 1 "exec with a library of another plugin name" \
  'not registered|"ScaleBias" version "1"' \
  "$KILN" exec "$E" --plugins "$TEST_PLUGINS/libtest_workspace.so"

sed 's/"version": "1"/"version": "2"/' "$NET" >"$TMP/v2.json"
sed 's/"namespace": ""/"namespace": "test"/' "$NET" >"$TMP/ns.json"
sed 's/"name": "ScaleBias"/"name": "ScaleBiass"/' "$NET" >"$TMP/name.json"
expect_error 1 "build a network asking for ScaleBias version 2 with only version 1 loaded" \
  'v2.json|scale_bias|ScaleBias 2|not registered' \
  "$KILN" build "$TMP/v2.json" -o "$TMP/x.engine" --plugins "$EXAMPLE_LIB"
expect_error 1 "build a network asking for namespace \"test\" with only \"\" loaded" \
  'ns.json|namespace "test"|not registered' \
  "$KILN" build "$TMP/ns.json" -o "$TMP/x.engine" --plugins "$EXAMPLE_LIB"
expect_error 1 "build a network asking for a misspelled plugin name" \
  'name.json|ScaleBiass|not registered' \
  "$KILN" build "$TMP/name.json" -o "$TMP/x.engine" --plugins "$EXAMPLE_LIB"
expect_ok "build the version 2 network with the version 2 library" \
  "$KILN" build "$TMP/v2.json" -o "$TMP/v2.engine" --plugins "$V2"
expect_error 1 "exec the version 2 engine with only version 1 loaded" \
  '"ScaleBias" version "2"|libtest_scale_bias_v2.so|near misses: ScaleBias 1' \
  "$KILN" exec "$TMP/v2.engine" --plugins "$EXAMPLE_LIB"
expect_ok "exec the version 2 engine with its library" \
  "$KILN" exec "$TMP/v2.engine" --plugins "$V2" --shapes input:2x16 --check
expect_ok "build the namespace network with the namespace library" \
  "$KILN" build "$TMP/ns.json" -o "$TMP/ns.engine" --plugins "$NS"
expect_error 1 "exec the namespace engine with only namespace \"\" loaded" \
  'namespace "test"|libtest_scale_bias_ns.so|near misses' \
  "$KILN" exec "$TMP/ns.engine" --plugins "$EXAMPLE_LIB"

echo "case: all missing plugins are reported in one error"
python3 - "$NET" "$TMP/two.json" <<'PY'
import json, sys
n = json.load(open(sys.argv[1]))
l2 = json.loads(json.dumps(n["layers"][0]))
l2["name"] = "scale_bias_v2"
l2["inputs"] = ["scale_bias"]
l2["plugin"]["version"] = "2"
n["layers"].append(l2)
n["outputs"] = [{"tensor": "scale_bias_v2", "name": "output"}]
json.dump(n, open(sys.argv[2], "w"))
PY
expect_ok "build a network with ScaleBias 1 and ScaleBias 2" \
  "$KILN" build "$TMP/two.json" -o "$TMP/two.engine" --plugins "$EXAMPLE_LIB" --plugins "$V2"
expect_error 1 "exec it with neither library: both triples named, with their libraries" \
  'engine needs 2 plugins that are not registered|"ScaleBias" version "1"|"ScaleBias" version "2"|libkiln_scale_bias.so|libtest_scale_bias_v2.so' \
  "$KILN" exec "$TMP/two.engine"

# ---- fields --------------------------------------------------------------------------
python3 - "$NET" "$TMP" <<'PY'
import json, sys
base = json.load(open(sys.argv[1]))
def variant(name, edit):
    n = json.loads(json.dumps(base))
    edit(n["layers"][0]["fields"])
    json.dump(n, open(f"{sys.argv[2]}/{name}.json", "w"))
variant("unknown", lambda f: f.__setitem__("gain", {"type": "f32", "data": 1.0}))
variant("missing", lambda f: f.pop("bias"))
variant("mistyped", lambda f: f.__setitem__("bias", {"type": "i32", "data": 1}))
variant("miscounted", lambda f: f.__setitem__("scale", {"type": "f32", "data": [1.0, 2.0]}))
PY
expect_error 1 "unknown plugin field" 'unknown.json|scale_bias|ScaleBias|unknown field "gain"' \
  "$KILN" build "$TMP/unknown.json" -o "$TMP/x.engine" --plugins "$EXAMPLE_LIB"
expect_error 1 "missing required plugin field" 'missing.json|ScaleBias|missing required field "bias"' \
  "$KILN" build "$TMP/missing.json" -o "$TMP/x.engine" --plugins "$EXAMPLE_LIB"
expect_error 1 "mistyped plugin field" 'mistyped.json|ScaleBias|field "bias"|i32|f32' \
  "$KILN" build "$TMP/mistyped.json" -o "$TMP/x.engine" --plugins "$EXAMPLE_LIB"
expect_error 1 "plugin field with the wrong count" 'miscounted.json|ScaleBias|field "scale"|2' \
  "$KILN" build "$TMP/miscounted.json" -o "$TMP/x.engine" --plugins "$EXAMPLE_LIB"
[ -e "$TMP/x.engine" ] && fail "a failed build left an engine file behind"

# ---- blob schema versions ----------------------------------------------------------------
expect_ok "build with a ScaleBias that writes blob version 0" \
  "$KILN" build "$NET" -o "$TMP/b0.engine" --plugins "$BLOB0"
expect_error 1 "exec it with the example (reads version 1): older blob refused, both versions named" \
  'layer "scale_bias"|blob|version 0|older|(1)' \
  "$KILN" exec "$TMP/b0.engine" --plugins "$EXAMPLE_LIB"
expect_ok "build with a ScaleBias that writes blob version 2" \
  "$KILN" build "$NET" -o "$TMP/b2.engine" --plugins "$BLOB2"
expect_error 1 "exec it with the example (reads version 1): newer blob refused, both versions named" \
  'layer "scale_bias"|blob|version 2|newer|(1)' \
  "$KILN" exec "$TMP/b2.engine" --plugins "$EXAMPLE_LIB"

finish
