#!/usr/bin/env bash
# The README flow on the ScaleBias example: build, exec --check (latency
# figures, PASS), values through --input/--save-outputs against 2x + 0.5,
# exec --json, inspect with and without the plugin, plugins listing.
set -u
source "$(dirname "$0")/common.bash"
need_file "$EXAMPLE_LIB"
E="$TMP/sb.engine"

expect_ok "build examples/scale_bias/net.json with the example plugin" \
  "$KILN" build "$NET" -o "$E" --plugins "$EXAMPLE_LIB"
expect_stdout "build prints a one-line summary" "1 layers .*arena [0-9]+ bytes.*engine [0-9]+ bytes"
[ -s "$E" ] || fail "build wrote no engine file"

expect_ok "build --verbose logs each pass" \
  "$KILN" build "$NET" -o "$TMP/verbose.engine" --plugins "$EXAMPLE_LIB" --verbose
grep -q '^kiln: info: ' "$ERR" && PASSED=$((PASSED + 1)) || fail "--verbose logged nothing"
if command -v script >/dev/null 2>&1; then
  echo "case: build on a terminal draws a progress bar on stderr"
  script -qec "'$KILN' build '$NET' -o '$TMP/tty.engine' --plugins '$EXAMPLE_LIB'" /dev/null >"$OUT" 2>&1
  grep -q '100%' "$OUT" && PASSED=$((PASSED + 1)) || fail "no progress bar on a terminal"
  run "$KILN" build "$NET" -o "$TMP/notty.engine" --plugins "$EXAMPLE_LIB"
  grep -q '%' "$ERR" && fail "a progress bar was drawn without a terminal" || PASSED=$((PASSED + 1))
fi

expect_ok "exec --shapes input:4x1024 --check" \
  "$KILN" exec "$E" --plugins "$EXAMPLE_LIB" --shapes input:4x1024 --check
expect_stdout "exec prints latency figures" \
  "latency over 10 iterations.*min [0-9.]+ ms, median [0-9.]+ ms, p99 [0-9.]+ ms, mean [0-9.]+ ms"
expect_stdout "exec uses the given shape" "input +input +f32 +4x1024"
expect_stdout "the check passes" "check output: max abs error .*PASS"

expect_ok "exec without --shapes uses the profile's opt shape" \
  "$KILN" exec "$E" --plugins "$EXAMPLE_LIB" --iterations 3 --warmup 0
expect_stdout "opt shape 4x1024" "output +output +f32 +4x1024"
expect_stdout "3 iterations, no warm-up" "latency over 3 iterations \(0 warm-up\)"

echo "case: --input from .npy and --save-outputs give y = 2x + 0.5"
python3 - "$TMP/x.npy" <<'PY'
import struct, sys
shape = (3, 5)
vals = [(i * 0.37) - 2.0 for i in range(15)]
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), }"
hdr += " " * ((64 - (10 + len(hdr) + 1) % 64) % 64) + "\n"
with open(sys.argv[1], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
    f.write(struct.pack("<15f", *vals))
PY
expect_ok "exec --input input=x.npy --save-outputs" \
  "$KILN" exec "$E" --plugins "$EXAMPLE_LIB" --input "input=$TMP/x.npy" --save-outputs "$TMP/out" --iterations 1 --check
expect_stdout "the .npy shape is used" "input +input +f32 +3x5 +from "
if python3 - "$TMP/out/output.npy" <<'PY'
import ast, struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:6] == b"\x93NUMPY", "not an npy file"
hlen = struct.unpack("<H", data[8:10])[0]
hdr = ast.literal_eval(data[10:10 + hlen].decode())
assert hdr["descr"] == "<f4" and tuple(hdr["shape"]) == (3, 5), hdr
got = struct.unpack("<15f", data[10 + hlen:])
for i, g in enumerate(got):
    x = struct.unpack("<f", struct.pack("<f", i * 0.37 - 2.0))[0]
    want = 2.0 * x + 0.5
    assert abs(g - want) <= 1e-6 * max(1.0, abs(want)), (i, g, want)
PY
then PASSED=$((PASSED + 1)); else fail "saved output is not 2x + 0.5"; fi

expect_ok "exec --json --check" \
  "$KILN" exec "$E" --plugins "$EXAMPLE_LIB" --shapes input:2x8 --check --json
if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
lat = d["latency_ms"]
assert all(k in lat and lat[k] >= 0 for k in ("min", "median", "p99", "mean")), lat
assert lat["min"] <= lat["median"] <= lat["p99"], lat
assert d["outputs"][0]["shape"] == [2, 8], d["outputs"]
assert d["check"]["pass"] is True and d["check"]["outputs"][0]["name"] == "output"
' "$OUT"; then PASSED=$((PASSED + 1)); else fail "exec --json output is not as expected"; fi

expect_ok "inspect with the plugin" "$KILN" inspect "$E" --plugins "$EXAMPLE_LIB"
expect_stdout "inspect shows the plugin record" '"ScaleBias" version "1" namespace "" from .*libkiln_scale_bias.so, blob version 1 \(8 bytes\): registered'
expect_stdout "inspect shows the profile" "profile 0: min 1x1  opt 4x1024  max 64x1048576"

expect_ok "inspect without the plugin library still works" "$KILN" inspect "$E"
expect_stdout "the missing plugin is shown" '"ScaleBias" version "1" .*NOT REGISTERED'

expect_ok "inspect --json" "$KILN" inspect "$E" --json
if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
p = d["plugins"][0]
assert (p["name"], p["version"], p["namespace"], p["blob_version"]) == ("ScaleBias", "1", "", 1), p
assert p["resolved"] is False and "not registered" in d["load_error"]
assert d["layers"][0]["op"] == "plugin" and d["target"]["backend"] == "cpu"
assert d["memory"]["arena_bytes"] > 0
' "$OUT"; then PASSED=$((PASSED + 1)); else fail "inspect --json output is not as expected"; fi

expect_ok "plugins lists the example" "$KILN" plugins --plugins "$EXAMPLE_LIB"
expect_stdout "triple" '"ScaleBias" version "1" namespace ""'
expect_stdout "field scale" "scale +f32 +required"
expect_stdout "field bias" "bias +f32 +required"

expect_ok "plugins --json" "$KILN" plugins --plugins "$EXAMPLE_LIB" --json
if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
c = [c for c in d if c["name"] == "ScaleBias"][0]
assert c["blob_version"] == 1 and c["library"].endswith("libkiln_scale_bias.so")
assert [(f["name"], f["type"], f["count"], f["required"]) for f in c["fields"]] == [("scale", "f32", 1, True), ("bias", "f32", 1, True)]
' "$OUT"; then PASSED=$((PASSED + 1)); else fail "plugins --json output is not as expected"; fi

finish
