"""The llama.cpp peer for bench/llm_cpu.sh: prompt and generation speed of
llama.cpp itself (through llama-cpp-python, .venv-ref) on the same GGUF,
the same prompt token ids kiln ran and the same number of greedy tokens,
with THREADS threads (llm_cpu.sh passes kiln's count). Timed like `kiln
bench`: prompt tok/s = prompt tokens / time until the first token is
chosen; generation tok/s = tokens after the first / time from the first to
the last. The context holds the prompt and the generated tokens, as kiln's
KV cache does for them.

usage: llamacpp_peer.py GGUF PROMPT_IDS_JSON N_GEN RUNS THREADS
prints one JSON object: version, threads, prompt_tokens, prompt_tok_s and
generate_tok_s (medians of RUNS), peak_rss_mb (the process's peak resident
memory, the Python interpreter and numpy included) and base_rss_mb (its
resident memory before the model was loaded: what the interpreter and the
imports alone hold).
"""
import json
import resource
import statistics
import sys
import time

import numpy as np
import llama_cpp


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def last_logits(llm):
    # Llama.eval keeps no logits unless logits_all; read the context's own
    # (the last token of every batch has its logits computed)
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def main():
    gguf, ids_path, n_gen, runs, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    ids = json.load(open(ids_path))
    base = rss_mb()
    # n_batch covers the whole prompt, so prefill is one batch as in kiln
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=len(ids) + n_gen, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=False, seed=0, verbose=False)
    pp, tg = [], []
    for _ in range(runs + 1):  # the first run warms caches and page-ins the weights; not counted
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        tok = int(np.argmax(last_logits(llm)))
        t1 = time.perf_counter()
        for _ in range(n_gen - 1):  # EOS ignored, as kiln bench does
            llm.eval([tok])
            tok = int(np.argmax(last_logits(llm)))
        t2 = time.perf_counter()
        pp.append(len(ids) / (t1 - t0))
        tg.append((n_gen - 1) / (t2 - t1))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"version": llama_cpp.__version__, "threads": threads, "prompt_tokens": len(ids),
                      "prompt_tok_s": statistics.median(pp[1:]), "generate_tok_s": statistics.median(tg[1:]),
                      "peak_rss_mb": peak, "base_rss_mb": base}))


if __name__ == "__main__":
    main()
