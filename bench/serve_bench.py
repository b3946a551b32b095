#!/usr/bin/env python3
"""Serving benchmark of `kiln serve`, reported as vLLM's benchmark_serving
reports it, with the workload of `kiln bench --throughput` (so the two can
be compared at the same load): N streaming /v1/completions requests of
random prompt ids (fixed seed), greedy, end-of-sequence ignored, each
generating exactly --output-len tokens, sent all at once or at Poisson
arrival times. Python's standard library only (the GPU machine has no
registry), one HTTP/1.1 connection per request, the requests spread over
--procs client processes (one Python event loop parses ~20k streamed chunks
a second, less than a GPU serves at saturation; the processes keep the
client from being what is measured).

    kiln serve model.engine --port 8000 &
    python3 bench/serve_bench.py --url http://127.0.0.1:8000 --vocab 128256 \
        --requests 1024 --input-len 128 --output-len 128 [--rate R] [--procs N] [--json]

Reports request, output and total (prompt + output) throughput over the
time from the first request to the last token; TTFT (request sent to first
token), TPOT ((end - first token) / (tokens - 1)) and ITL (gaps between
streamed chunks) as mean, median and p99, in ms.
"""
import argparse
import asyncio
import json
import multiprocessing
import random
import statistics
import sys
import time
import urllib.parse


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def one(host, port, path, body, out):
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode()
    writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                 b"Connection: close\r\n\r\n" % (path.encode(), host.encode(), len(data)) + data)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    times, usage, buf = [], None, b""
    while True:  # chunked transfer coding around server-sent events
        size = int((await reader.readline()).strip() or b"0", 16)
        if size == 0:
            break
        buf += await reader.readexactly(size)
        await reader.readexactly(2)
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            payload = event[len(b"data: "):]
            if payload == b"[DONE]":
                continue
            o = json.loads(payload)
            if o.get("usage"):
                usage = o["usage"]
            if o.get("choices") and o["choices"][0].get("text"):
                times.append(time.perf_counter())
    writer.close()
    out.append({"status": status, "start": t0, "times": times, "end": time.perf_counter(),
                "completion_tokens": usage["completion_tokens"] if usage else 0,
                "prompt_tokens": usage["prompt_tokens"] if usage else 0})


def request_body(args, prompt):
    """One request of the workload: greedy, exactly --output-len tokens, streamed with usage."""
    return {"prompt": prompt, "max_tokens": args.output_len, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


async def run(args, part, parts):
    """This process's share: requests part, part + parts, ... of the same
    fixed-seed workload; with --rate, arrivals at rate / parts (independent
    Poisson streams add up to one at the full rate)."""
    u = urllib.parse.urlparse(args.url)
    rng = random.Random(args.seed)
    arrivals = random.Random(args.seed * 1000003 + 1 + part)
    results, tasks, bodies = [], [], []
    for i in range(args.requests):  # made before the clock starts, as kiln bench makes its requests
        prompt = [rng.randrange(args.vocab) for _ in range(args.input_len)]
        if i % parts == part:
            bodies.append(request_body(args, prompt))
    t0 = time.perf_counter()
    for body in bodies:
        tasks.append(asyncio.create_task(one(u.hostname, u.port or 80, "/v1/completions", body, results)))
        if args.rate > 0:
            await asyncio.sleep(arrivals.expovariate(args.rate / parts))
    await asyncio.gather(*tasks)
    return t0, results


async def warm_up(args):
    """Untimed requests first, as kiln bench's --warmup: the server's first
    steps pay for lazily made GPU plans and pages touched once."""
    u = urllib.parse.urlparse(args.url)
    rng = random.Random("warm-up")  # prompts none of the timed runs send
    results = []
    await asyncio.gather(*(one(u.hostname, u.port or 80, "/v1/completions",
                               request_body(args, [rng.randrange(args.vocab) for _ in range(args.input_len)]),
                               results) for _ in range(args.warmup)))


def run_part(job):
    args, part = job
    return asyncio.run(run(args, part, args.procs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--vocab", type=int, required=True, help="the engine's vocabulary size (prompt ids are below it)")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rate", type=float, default=0, help="Poisson arrivals per second (0: all at once)")
    ap.add_argument("--seed", type=int, default=0,
                    help="the prompts' seed (default 0): a run that repeats one finds its prompts in the prefix cache")
    ap.add_argument("--warmup", type=int, default=4, help="untimed requests first (default 4, as kiln bench)")
    ap.add_argument("--procs", type=int, default=4, help="client processes sharing the requests (default 4)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.procs = max(1, min(args.procs, args.requests))
    if args.warmup > 0:
        asyncio.run(warm_up(args))
    # time.perf_counter is CLOCK_MONOTONIC on Linux: one clock for every process
    with multiprocessing.get_context("fork").Pool(args.procs) as pool:
        parts = pool.map(run_part, [(args, p) for p in range(args.procs)])
    t0 = min(p[0] for p in parts)
    res = [r for p in parts for r in p[1]]
    ok = [r for r in res if r["status"] == 200 and r["times"]]
    end = max(r["end"] for r in ok) if ok else t0
    dur = end - t0
    out_tok = sum(r["completion_tokens"] for r in ok)
    in_tok = sum(r["prompt_tokens"] for r in ok)
    ttft = [(r["times"][0] - r["start"]) * 1e3 for r in ok]
    tpot = [(r["end"] - r["times"][0]) * 1e3 / (r["completion_tokens"] - 1) for r in ok if r["completion_tokens"] > 1]
    itl = [(b - a) * 1e3 for r in ok for a, b in zip(r["times"], r["times"][1:])]
    rep = {"requests": args.requests, "completed": len(ok), "failed": len(res) - len(ok), "duration_s": dur,
           "request_throughput": len(ok) / dur if dur else 0, "output_tok_s": out_tok / dur if dur else 0,
           "total_tok_s": (in_tok + out_tok) / dur if dur else 0}
    for name, xs in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl)):
        rep[name] = {"mean": statistics.fmean(xs) if xs else float("nan"), "median": pct(xs, 50), "p99": pct(xs, 99)}
    if args.json:
        print(json.dumps(rep))
    else:
        print("completed %d of %d in %.2f s: %.2f req/s, output %.1f tok/s, total %.1f tok/s"
              % (len(ok), args.requests, dur, rep["request_throughput"], rep["output_tok_s"], rep["total_tok_s"]))
        for name in ("ttft_ms", "tpot_ms", "itl_ms"):
            print("%-8s mean %9.2f  median %9.2f  p99 %9.2f" % (name, *rep[name].values()))
    sys.exit(0 if len(ok) == args.requests else 1)


if __name__ == "__main__":
    main()
