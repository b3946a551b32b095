#!/usr/bin/env bash
# Damaged engines, input shapes outside the profile, and an engine whose
# target is not available here. Every case must exit exactly 1 (a crash
# is >= 128) with one line "kiln: error: ..." naming the problem.
set -u
source "$(dirname "$0")/common.bash"
need_file "$EXAMPLE_LIB"
E="$TMP/sb.engine"
expect_ok "build the example engine" "$KILN" build "$NET" -o "$E" --plugins "$EXAMPLE_LIB"
SIZE=$(wc -c <"$E")
EXEC=("$KILN" exec --plugins "$EXAMPLE_LIB" --iterations 1 --warmup 0)

# ---- damaged files -------------------------------------------------------------------
expect_error 1 "an engine file that does not exist" 'cannot open|nothere.engine' \
  "${EXEC[@]}" "$TMP/nothere.engine"
: >"$TMP/empty.engine"
expect_error 1 "an empty engine file" 'empty.engine|empty' "${EXEC[@]}" "$TMP/empty.engine"
printf 'definitely not an engine, just some text that is long enough to hold a header ......................\n' \
  >"$TMP/text.engine"
expect_error 1 "a text file" 'text.engine' "${EXEC[@]}" "$TMP/text.engine"
for n in 7 64 96 $((SIZE / 2)) $((SIZE - 1)); do
  head -c "$n" "$E" >"$TMP/trunc.engine"
  expect_error 1 "engine truncated to $n of $SIZE bytes" 'trunc.engine' "${EXEC[@]}" "$TMP/trunc.engine"
done
head -c $((SIZE / 2)) "$E" >"$TMP/half.engine"
expect_error 1 "a truncated engine is reported as truncated" 'half.engine|truncated' \
  "${EXEC[@]}" "$TMP/half.engine"

# flip OFFSET: copies the engine with one bit of byte OFFSET flipped.
flip() {
  python3 - "$E" "$TMP/flip.engine" "$1" <<'PY'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
data[int(sys.argv[3])] ^= 0x10
open(sys.argv[2], "wb").write(data)
PY
}
for off in 0 9 20 33 72 81 100 $((SIZE / 3)) $((SIZE / 2)) $((SIZE - 1)); do
  flip "$off"
  expect_error 1 "bit flipped in byte $off" 'flip.engine' "${EXEC[@]}" "$TMP/flip.engine"
done
# Past the fixed header every byte is covered: the header checksum (the
# section table), a section checksum, or the zero-padding check.
for off in 100 $((SIZE / 2)) $((SIZE - 1)); do
  flip "$off"
  expect_error 1 "bit flipped in byte $off is reported as corruption" 'flip.engine|corrupt' \
    "${EXEC[@]}" "$TMP/flip.engine"
done
# A flip inside each section's data is that section's checksum error.
for off in $(python3 - "$E" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
n = struct.unpack_from("<I", d, 80)[0]
for i in range(n):
    _, _, off, size, _ = struct.unpack_from("<IIQQQ", d, 96 + 32 * i)
    if size:
        print(off + size // 2)
PY
); do
  flip "$off"
  expect_error 1 "bit flipped inside the section data at byte $off is a checksum error" \
    'flip.engine|checksum' "${EXEC[@]}" "$TMP/flip.engine"
done

# The section table starts at byte 96, 32 bytes per entry: id, reserved,
# offset (u64 at +8), size (u64 at +16), checksum (u64 at +24). Offsets and
# sizes pointing far outside the file must be refused, not followed.
poke_u64() {
  python3 - "$E" "$TMP/poke.engine" "$1" "$2" <<'PY'
import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
struct.pack_into("<Q", data, int(sys.argv[3]), int(sys.argv[4]))
open(sys.argv[2], "wb").write(data)
PY
}
for field in 104 112 136 144 72; do
  for value in 18446744073709551615 9223372036854775808 $((SIZE + 4096)); do
    poke_u64 "$field" "$value"
    expect_error 1 "u64 at byte $field set to $value" 'poke.engine' "${EXEC[@]}" "$TMP/poke.engine"
  done
done
expect_error 1 "inspect refuses a damaged engine too" 'poke.engine' "$KILN" inspect "$TMP/poke.engine"

# ---- shapes --------------------------------------------------------------------------
expect_error 1 "input dim above the profile max" \
  'input "input" dim 1 = 2000000 is outside profile 0 [1, 1048576]' \
  "${EXEC[@]}" "$E" --shapes input:4x2000000
expect_error 1 "input dim below the profile min" \
  'input "input" dim 0 = 0 is outside profile 0 [1, 64]' \
  "${EXEC[@]}" "$E" --shapes input:0x16
expect_error 1 "input of the wrong rank" 'input "input"|rank 2' "${EXEC[@]}" "$E" --shapes input:4x4x4
expect_error 1 "--shapes naming an input the engine lacks" 'no input named "inptu"' \
  "${EXEC[@]}" "$E" --shapes inptu:4x16
expect_error 1 "a profile index the engine lacks" 'profile 3' "${EXEC[@]}" "$E" --profile-index 3
python3 - "$TMP/i32.npy" <<'PY'
import struct, sys
hdr = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }"
hdr += " " * ((64 - (10 + len(hdr) + 1) % 64) % 64) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + struct.pack("<6i", *range(6)))
PY
expect_error 1 "an .npy input of the wrong dtype" 'input "input"|i32|f32' \
  "${EXEC[@]}" "$E" --input "input=$TMP/i32.npy"
expect_error 1 "an .npy input that does not exist" 'missing.npy' \
  "${EXEC[@]}" "$E" --input "input=$TMP/missing.npy"

# ---- target ----------------------------------------------------------------------------
cat >"$TMP/native.json" <<'JSON'
{
  "kiln_network": 1,
  "inputs": [{"name": "x", "dtype": "f32", "dims": [-1, 16]}],
  "profiles": [{"x": {"min": [1, 16], "opt": [2, 16], "max": [8, 16]}}],
  "layers": [{"name": "act", "op": "unary", "kind": "relu", "inputs": ["x"]}],
  "outputs": [{"tensor": "act", "name": "y"}]
}
JSON
expect_ok "build a native network for the cpu" "$KILN" build "$TMP/native.json" -o "$TMP/cpu.engine"
expect_ok "it runs and checks here" "$KILN" exec "$TMP/cpu.engine" --check
if expect_ok "build it with --backend cuda" "$KILN" build "$TMP/native.json" -o "$TMP/cuda.engine" --backend cuda; then
  expect_stdout "the summary says cuda" "target cuda"
  # Where a GPU is, the engine runs (tests/e2e/cuda_cli.sh checks that).
  if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    expect_error 1 "exec a cuda engine on this kiln" 'engine targets cuda (sm_' \
      "$KILN" exec "$TMP/cuda.engine"
    grep -qE "but no CUDA GPU is available|but this kiln was built without CUDA" "$ERR" ||
      fail "exec a cuda engine on this kiln: the error does not say why: $(cat "$ERR")"
  fi
  expect_ok "inspect still describes the cuda engine" "$KILN" inspect "$TMP/cuda.engine"
  expect_stdout "inspect names the target" "target cuda"
fi

# ---- --check verdicts ----------------------------------------------------------------------
# f32 matmuls summed in f32 (fast path) and in f64 (reference) differ in the
# last bits: within the default tolerance, beyond a zero one.
python3 - "$TMP/mlp.json" <<'PY'
import json, math, sys
k = 256
w = [math.sin(i * 0.37) * 0.05 for i in range(k * k)]
json.dump({"kiln_network": 1,
           "inputs": [{"name": "x", "dtype": "f32", "dims": [-1, k]}],
           "profiles": [{"x": {"min": [1, k], "opt": [16, k], "max": [16, k]}}],
           "layers": [{"name": "w", "op": "constant", "dtype": "f32", "dims": [k, k], "data": w},
                      {"name": "fc", "op": "matmul", "inputs": ["x", "w"]},
                      {"name": "fc2", "op": "matmul", "inputs": ["fc", "w"]}],
           "outputs": [{"tensor": "fc2", "name": "y"}]}, open(sys.argv[1], "w"))
PY
expect_ok "build a two-matmul network" "$KILN" build "$TMP/mlp.json" -o "$TMP/mlp.engine"
expect_ok "its check passes at the default f32 tolerance" "$KILN" exec "$TMP/mlp.engine" --check
expect_stdout "PASS with atol 1e-05, rtol 0.0001" "check y: .*\(atol 1e-05, rtol 0.0001\): PASS"
expect_error 1 "its check fails at zero tolerance" 'check failed: output "y"' \
  "$KILN" exec "$TMP/mlp.engine" --check --atol 0 --rtol 0
expect_stdout "FAIL is printed" "check y: .*: FAIL"

finish
