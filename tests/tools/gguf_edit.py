#!/usr/bin/env python3
"""Rewrites one metadata value of a GGUF file (layout: the GGUF spec in
ggml's docs/gguf.md), keeping every tensor as it was, so that a test can
feed kiln values a hostile or careless converter might write.

usage: gguf_edit.py IN OUT KEY TYPE VALUE
  TYPE is a GGUF value type name (u8 i8 u16 i16 u32 i32 f32 bool string
  u64 i64 f64) or "array:<type>"; VALUE is Python (e.g. '[1e30] * 320' or
  'float("nan")'), and may use `old`, the key's current value.
"""
import struct
import sys

TYPES = {"u8": (0, "<B"), "i8": (1, "<b"), "u16": (2, "<H"), "i16": (3, "<h"), "u32": (4, "<I"),
         "i32": (5, "<i"), "f32": (6, "<f"), "bool": (7, "<?"), "string": (8, None), "array": (9, None),
         "u64": (10, "<Q"), "i64": (11, "<q"), "f64": (12, "<d")}
BY_ID = {v[0]: (k, v[1]) for k, v in TYPES.items()}


class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.p)[0]
        self.p += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.d[self.p:self.p + n]
        self.p += n
        return s

    def value(self, t):
        name, fmt = BY_ID[t]
        if name == "string":
            return self.string()
        if name == "array":
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(fmt)


def pack_value(t, v):
    name, fmt = BY_ID[t]
    if name == "string":
        v = v.encode() if isinstance(v, str) else v
        return struct.pack("<Q", len(v)) + v
    if name == "array":
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(pack_value(et, x) for x in items)
    return struct.pack(fmt, v)


def main():
    src, dst, key, tname, expr = sys.argv[1:6]
    d = open(src, "rb").read()
    r = Reader(d)
    magic, version, n_tensors, n_kv = r.take("<4s"), r.take("<I"), r.take("<Q"), r.take("<Q")
    kvs = []
    for _ in range(n_kv):
        k = r.string()
        t = r.take("<I")
        kvs.append([k, t, r.value(t)])
    infos_start = r.p
    for _ in range(n_tensors):
        r.string()
        nd = r.take("<I")
        r.p += 8 * nd + 4 + 8
    infos = d[infos_start:r.p]
    align = next((v for k, t, v in kvs if k == b"general.alignment"), 32)
    data_start = (r.p + align - 1) // align * align
    for kv in kvs:
        if kv[0] == key.encode():
            old = kv[2][1] if kv[1] == 9 else kv[2]
            new = eval(expr, {"old": old})
            if tname.startswith("array:"):
                kv[1], kv[2] = 9, (TYPES[tname[6:]][0], new)
            else:
                kv[1], kv[2] = TYPES[tname][0], new
            break
    else:
        sys.exit("key %s not found" % key)
    out = struct.pack("<4sIQQ", magic, version, n_tensors, n_kv)
    for k, t, v in kvs:
        out += struct.pack("<Q", len(k)) + k + struct.pack("<I", t) + pack_value(t, v)
    out += infos
    out += b"\0" * ((len(out) + align - 1) // align * align - len(out))
    out += d[data_start:]
    open(dst, "wb").write(out)


if __name__ == "__main__":
    main()
