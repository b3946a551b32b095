#!/usr/bin/env bash
# The CUDA paths of the command line on any machine: `kiln build --backend
# cuda` records the target (the architectures --gpu-arch names) and,
# without a GPU, says it used heuristic tactics; `kiln inspect` shows the architectures and tactics; `kiln exec`
# of a cuda engine refuses in one line where no GPU is (and where one is,
# runs it with --cuda-graph --check); --cuda-graph on a CPU engine is an
# error; --profile reports every layer; an FP8 LLM engine for cuda
# calibrates (--calibrate) with or without a GPU.
source "$(dirname "$0")/common.bash"

cat >"$TMP/net.json" <<'JSON'
{
  "kiln_network": 1,
  "inputs": [{"name": "x", "dtype": "f32", "dims": [-1, 8]}],
  "profiles": [{"x": {"min": [1, 8], "opt": [4, 8], "max": [16, 8]}}],
  "layers": [
    {"name": "w", "op": "constant", "dtype": "f32", "dims": [8, 2],
     "data": [1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1]},
    {"name": "mm", "op": "matmul", "inputs": ["x", "w"]},
    {"name": "act", "op": "unary", "kind": "tanh", "inputs": ["mm"]}
  ],
  "outputs": ["act"]
}
JSON

expect_ok "build for cuda" "$KILN" build "$TMP/net.json" --backend cuda -o "$TMP/cuda.engine"
expect_stdout "build reports the cuda target" 'target cuda'

gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu=1
fi
if [ "$gpu" -eq 0 ]; then
  echo "case: build without a GPU says heuristic tactics"
  if grep -q "no CUDA GPU here: using heuristic tactics" "$ERR"; then
    PASSED=$((PASSED + 1))
  else
    fail "build without a GPU: stderr lacks the heuristic-tactics line: $(cat "$ERR")"
  fi
fi

expect_ok "build for named GPU architectures" "$KILN" build "$TMP/net.json" --backend cuda \
  --gpu-arch sm_80,90 -o "$TMP/cuda_archs.engine"
expect_ok "inspect the named architectures" "$KILN" inspect "$TMP/cuda_archs.engine"
expect_stdout "inspect shows both architectures" 'target cuda \(sm_80, sm_90\)'
expect_error 2 "a bad --gpu-arch" '--gpu-arch|sm_90' \
  "$KILN" build "$TMP/net.json" --backend cuda --gpu-arch ampere -o "$TMP/bad.engine"

expect_ok "inspect a cuda engine" "$KILN" inspect "$TMP/cuda.engine"
expect_stdout "inspect shows the architecture" 'target cuda.*sm_[0-9]+|target cuda.*[0-9]{2}'
expect_stdout "inspect shows the matmul's tactic" 'mm .*tactic (heuristic|[0-9]+)'

if [ "$gpu" -eq 0 ]; then
  expect_error 1 "exec of a cuda engine without a GPU" \
    'engine targets cuda|cuda.engine' "$KILN" exec "$TMP/cuda.engine"
  if ! grep -qE "no CUDA GPU is available|built without CUDA" "$ERR"; then
    fail "exec without a GPU: the error does not say why: $(cat "$ERR")"
  fi
else
  expect_ok "exec a cuda engine with --cuda-graph --check" \
    "$KILN" exec "$TMP/cuda.engine" --shapes x:13x8 --cuda-graph --check --json
  expect_stdout "exec reports GPU time" '"gpu_ms"'
  expect_stdout "exec check passes" '"pass": true'
fi

expect_ok "build for the cpu" "$KILN" build "$TMP/net.json" -o "$TMP/cpu.engine"
expect_error 1 "--cuda-graph on a cpu engine" '--cuda-graph|cuda' \
  "$KILN" exec "$TMP/cpu.engine" --cuda-graph
expect_ok "exec --profile on the cpu" "$KILN" exec "$TMP/cpu.engine" --profile --json
expect_stdout "profile lists the matmul" '"name": "mm"'
expect_stdout "profile lists the tanh" '"name": "act"'
expect_ok "exec --profile text" "$KILN" exec "$TMP/cpu.engine" --profile
expect_stdout "profile table" 'per-layer host time'

# an FP8 engine for cuda with static activation scales builds here too:
# without a GPU the calibration runs the unquantized model on the CPU
# (where kiln was built with its CUDA plugins: an LLM engine needs them)
llama=$KILN_SOURCE_DIR/tests/data/llm/llama
if "$KILN" build "$llama" --backend cuda -o "$TMP/llama.engine" >/dev/null 2>&1; then
  expect_ok "calibrated fp8 build for cuda" "$KILN" build "$llama" --backend cuda --dtype fp8 \
    --calibrate "$KILN_SOURCE_DIR/tests/data/text/declaration_of_independence.txt" -o "$TMP/fp8c.engine"
  expect_stdout "calibrated for cuda" 'for cuda: .*matmul weights fp8 \(activation scales from 256 calibration tokens\)'
else
  echo "SKIP: calibrated fp8 build for cuda: this kiln has no CUDA plugins ($("$KILN" build "$llama" --backend cuda \
    -o "$TMP/llama.engine" 2>&1 | tail -n 1))"
fi

finish
