#!/usr/bin/env python3
"""Rewrites a kiln engine the way a hostile user would: edits the plan
JSON (or drops/replaces extra sections) and recomputes every checksum, so
that only the reader's semantic checks stand between the file and the
runtime. Layout: docs/engine-format.md.

usage: engine_edit.py IN OUT EXPR [SECTION=FILE ...]
  EXPR is Python run with `plan` bound to the parsed plan (a dict) and
  `sections` to the list of [id, bytes] extra sections, e.g.
  'plan["profiles"] = []'. SECTION=FILE replaces the extra section SECTION
  with FILE's bytes.
"""
import json
import struct
import sys

M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def _round(acc, lane):
    acc = (acc + lane * P2) & M
    return (_rotl(acc, 31) * P1) & M


def _merge(acc, v):
    acc ^= _round(0, v)
    return (acc * P1 + P4) & M


def xxh64(data, seed=0):
    """XXH64 as specified in xxHash's doc/xxhash_spec.md."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed & M, (seed - P1) & M]
        while i + 32 <= n:
            for k in range(4):
                v[k] = _round(v[k], struct.unpack_from("<Q", data, i + 8 * k)[0])
            i += 32
        acc = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M
        for k in range(4):
            acc = _merge(acc, v[k])
    else:
        acc = (seed + P5) & M
    acc = (acc + n) & M
    while i + 8 <= n:
        acc ^= _round(0, struct.unpack_from("<Q", data, i)[0])
        acc = (_rotl(acc, 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        acc ^= (struct.unpack_from("<I", data, i)[0] * P1) & M
        acc = (_rotl(acc, 23) * P2 + P3) & M
        i += 4
    while i < n:
        acc ^= (data[i] * P5) & M
        acc = (_rotl(acc, 11) * P1) & M
        i += 1
    acc ^= acc >> 33
    acc = (acc * P2) & M
    acc ^= acc >> 29
    acc = (acc * P3) & M
    acc ^= acc >> 32
    return acc


def read(path):
    d = open(path, "rb").read()
    n = struct.unpack_from("<I", d, 80)[0]
    secs = []
    for i in range(n):
        sid, _, off, size, _ = struct.unpack_from("<4sIQQQ", d, 96 + 32 * i)
        secs.append([sid.decode("latin-1"), d[off:off + size]])
    return d[:96], secs


def write(path, header, secs):
    """Lays the sections out as the writer does (8-aligned, WGHT on a page)."""
    header = bytearray(header)
    n = len(secs)
    pos = 96 + 32 * n
    offs = []
    for sid, data in secs:
        pos = (pos + 4095) // 4096 * 4096 if sid == "WGHT" else (pos + 7) // 8 * 8
        offs.append(pos)
        pos += len(data)
    img = bytearray(pos)
    for (sid, data), off in zip(secs, offs):
        img[off:off + len(data)] = data
    struct.pack_into("<Q", header, 72, pos)
    struct.pack_into("<I", header, 80, n)
    img[:96] = header
    for i, ((sid, data), off) in enumerate(zip(secs, offs)):
        struct.pack_into("<4sIQQQ", img, 96 + 32 * i, sid.encode("latin-1"), 0, off, len(data),
                         xxh64(bytes(data)))
    struct.pack_into("<Q", img, 88, 0)
    struct.pack_into("<Q", img, 88, xxh64(bytes(img[:96 + 32 * n])))
    open(path, "wb").write(img)


def main():
    src, dst, expr = sys.argv[1:4]
    header, secs = read(src)
    plan_i = next(i for i, s in enumerate(secs) if s[0] == "PLAN")
    plan = json.loads(secs[plan_i][1])
    extra = [s for s in secs if s[0] not in ("PLAN", "BLOB", "WGHT")]
    exec(expr, {"plan": plan, "sections": extra})
    for arg in sys.argv[4:]:
        sid, path = arg.split("=", 1)
        for s in extra:
            if s[0] == sid:
                s[1] = open(path, "rb").read()
    secs[plan_i][1] = json.dumps(plan, separators=(",", ":")).encode()
    keep = {id(s) for s in extra}
    secs = [s for s in secs if s[0] in ("PLAN", "BLOB", "WGHT") or id(s) in keep]
    write(dst, header, secs)


if __name__ == "__main__":
    main()
