#!/usr/bin/env python3
"""Summarize a kernel timeline written by a -DKILN_CUDA_TIMELINE=ON build
(src/backend/cuda/timeline.cuh): `KILN_TIMELINE=FILE kiln bench ...`, then

    tools/timeline.py FILE [--steps N] [--launches N] [--blocks NAME] [--src DIR]

Blocks are grouped into launches (a kernel's blocks, one after another in
time), launches are put in order, and for each launch it prints when it
started, when the first block's wait on the previous kernel returned
(programmatic dependent launch), when its last block ended, and what it
added to the chain: its end minus the previous launch's end. The summary
groups launches by kernel (name, its KTL_SCOPE discriminator, its grid) and
gives the medians over the last N steps. A step is taken to begin at each
launch of the kernel that recurs least often among the last launches
(the first of those to appear, on a tie)."""
import argparse
import os
import re
import statistics
import sys
from collections import defaultdict


def kernel_name(module, line, src, cache={}):
    """The kernel's name from the source: the identifier before '(' after the
    __global__ that precedes line `line` of the module's file."""
    key = (module, line)
    if key in cache:
        return cache[key]
    base = os.path.basename(module)
    name = "%s:%d" % (base, line)
    for root, _, files in os.walk(src):
        if base in files:
            text = open(os.path.join(root, base)).read().split("\n")[: line - 1]
            chunk = "\n".join(text)
            at = chunk.rfind("__global__")
            if at >= 0:
                sig = chunk[at:]
                m = re.findall(r"([A-Za-z_]\w*)\s*\(", sig)
                m = [x for x in m if x not in ("__launch_bounds__", "__global__")]
                if m:
                    name = m[0]
            break
    cache[key] = name
    return name


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--steps", type=int, default=8, help="steps the summary takes (the last ones)")
    ap.add_argument("--launches", type=int, default=0, help="also list the last N launches one by one")
    ap.add_argument("--blocks", default="", help="list the blocks of the last two launches of the kernel so named "
                    "(those that reached a ktl_mark, if any did)")
    ap.add_argument("--src", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()

    by_tag = defaultdict(list)
    for ln in open(args.file):
        f = ln.split()
        if len(f) not in (8, 12):
            continue
        module, tag, block, smid, grid, t0, wait, end = f[0], *map(int, f[1:8])
        marks = tuple(map(int, f[8:]))
        by_tag[(module, tag, grid)].append((t0, wait, end, block, smid, marks))

    launches = []
    for (module, tag, grid), recs in by_tag.items():
        recs.sort()
        cur, cur_end = [], -1
        for r in recs:
            if cur and r[0] > cur_end + 500:
                launches.append((module, tag, grid, cur))
                cur, cur_end = [], -1
            cur.append(r)
            cur_end = max(cur_end, r[0] + r[2])
        if cur:
            launches.append((module, tag, grid, cur))

    rows = []
    for module, tag, grid, recs in launches:
        if len(recs) < grid:  # cut by the ring's start
            continue
        name = "%s/%d" % (kernel_name(module, tag >> 16, args.src), tag & 0xFFFF)
        start = min(r[0] for r in recs)
        waits = sorted(r[0] + r[1] for r in recs if r[1])
        end = max(r[0] + r[2] for r in recs)
        rows.append(
            {
                "name": name,
                "grid": grid,
                "start": start,
                "wait": waits[0] if waits else None,
                "wait_med": waits[len(waits) // 2] if waits else None,
                "end": end,
                "sms": len(set(r[4] for r in recs)),
                "recs": recs,
            }
        )
    rows.sort(key=lambda r: r["start"])
    if not rows:
        sys.exit("timeline: no complete launch in %s" % args.file)
    for i, r in enumerate(rows):
        r["adds"] = r["end"] - rows[i - 1]["end"] if i else 0
        r["handoff"] = r["wait"] - rows[i - 1]["end"] if i and r["wait"] is not None else None

    # steps: at each launch of the kernel that recurs least often among the last launches
    tail = rows[-400:]
    counts = defaultdict(int)
    for r in tail:
        counts[(r["name"], r["grid"])] += 1
    first_seen = {}
    for i, r in enumerate(tail):
        first_seen.setdefault((r["name"], r["grid"]), i)
    first = min(counts, key=lambda k: (counts[k], first_seen[k]))
    starts = [i for i, r in enumerate(rows) if (r["name"], r["grid"]) == first]
    steps = [(a, b) for a, b in zip(starts, starts[1:])][-args.steps :]
    print("steps begin at %s (grid %d); %d complete steps in the file, summarizing the last %d" %
          (first[0], first[1], max(len(starts) - 1, 0), len(steps)))

    if args.launches:
        t_ref = rows[-args.launches]["start"]
        print("\n%-34s %6s %4s %9s %9s %9s %9s %8s %8s" %
              ("launch", "grid", "SMs", "start", "wait0", "waitmed", "end", "adds", "handoff"))
        for r in rows[-args.launches :]:
            us = lambda t: "%9.2f" % ((t - t_ref) / 1000) if t is not None else "%9s" % "-"
            print("%-34s %6d %4d %s %s %s %s %8.2f %8s" % (
                r["name"][:34], r["grid"], r["sms"], us(r["start"]), us(r["wait"]), us(r["wait_med"]),
                us(r["end"]), r["adds"] / 1000, "%.2f" % (r["handoff"] / 1000) if r["handoff"] is not None else "-"))

    if args.blocks:
        mine = [r for r in rows if r["name"].split("/")[0] == args.blocks][-2:]
        for r in mine:
            recs = sorted(r["recs"])
            marked = [x for x in recs if any(x[5])]
            print("\nblocks of %s (grid %d), us from its first block's start; marks where reached" % (r["name"], r["grid"]))
            print("%6s %4s %8s %8s %8s %8s %8s %8s %8s" % ("block", "SM", "start", "wait", "mark0", "mark1", "mark2",
                                                            "mark3", "end"))
            rel = lambda x, d: "%8.2f" % ((x[0] + d - r["start"]) / 1000) if d else "%8s" % "-"
            for x in (marked or recs)[:48]:
                mk = list(x[5]) + [0] * (4 - len(x[5]))
                print("%6d %4d %s %s %s %s %s %s %s" % (x[3], x[4], rel(x, 1e-9), rel(x, x[1]), rel(x, mk[0]),
                      rel(x, mk[1]), rel(x, mk[2]), rel(x, mk[3]), rel(x, x[2])))

    if not steps:
        return
    per = defaultdict(lambda: defaultdict(list))
    step_us = []
    for a, b in steps:
        step_us.append((rows[b]["end"] - rows[a]["end"]) / 1000)
        seen = defaultdict(int)
        for r in rows[a + 1 : b + 1]:
            key = (r["name"], r["grid"])
            seen[key] += 1
            d = per[key]
            d["adds"].append(r["adds"] / 1000)
            d["run"].append((r["end"] - (r["wait"] if r["wait"] is not None else r["start"])) / 1000)
            if r["handoff"] is not None:
                d["handoff"].append(r["handoff"] / 1000)
            d["early"].append(((r["wait"] if r["wait"] is not None else r["start"]) - r["start"]) / 1000)
        for k, v in seen.items():
            per[k]["count"].append(v)
    med = lambda x: statistics.median(x) if x else float("nan")
    print("\nstep: median %.1f us (min %.1f, max %.1f) over %d steps" %
          (med(step_us), min(step_us), max(step_us), len(step_us)))
    print("\nper kernel, medians over the launches of those steps (us): adds = its end minus the previous launch's")
    print("end (its share of the step), handoff = first wait return minus the previous end, run = last end")
    print("minus first wait return, early = first wait return minus first block start")
    print("%-40s %6s %7s %8s %9s %8s %8s %8s" % ("kernel/discriminator", "grid", "a step", "adds", "adds*n", "handoff", "run", "early"))
    tot = 0.0
    for key, d in sorted(per.items(), key=lambda kv: -sum(kv[1]["adds"])):
        n = med(d["count"])
        tot += sum(d["adds"]) / len(steps)
        print("%-40s %6d %7.0f %8.2f %9.1f %8.2f %8.2f %8.2f" % (
            key[0][:40], key[1], n, med(d["adds"]), sum(d["adds"]) / len(steps), med(d["handoff"]), med(d["run"]),
            med(d["early"])))
    print("%-40s %6s %7s %8s %9.1f" % ("(sum)", "", "", "", tot))


if __name__ == "__main__":
    main()
