#!/usr/bin/env python3
"""An outside reference for the quantized formats of issue 10, written
without kiln's code: the GGUF's weights dequantized by the `gguf` package,
each format simulated in numpy from its definition (FP8 E4M3 rounding by
`ml_dtypes`), a Llama forward pass in numpy, and teacher-forced perplexity,
argmax agreement and KL against the unquantized model.

    .venv-ref/bin/python bench/quant_reference.py GGUF IDS [options]

IDS holds the windows to score, one sequence of token ids a line (what
`kiln perplexity --ids` reads; bench/quant_quality.sh writes it). Needs
numpy, gguf and ml_dtypes (pip install numpy gguf ml_dtypes).

Formats (--formats, comma-separated; the first is the reference the others
are compared with, default f32):
  f32        the GGUF dequantized to f32 (kiln's --dtype f32 engine)
  bf16       weights and every layer's output rounded to bf16, sums in f32
             (what a bf16 engine on the GPU computes, up to summation order)
  int8       weight-only, symmetric, a scale per output channel: s = max|w|/127,
             q = round(w / s) in [-127, 127]
  int8-g128  the same with a scale per 128 inputs (int8-gN, int4-gN: per N)
  int4       weight-only, asymmetric, groups of 128 inputs (96 where 128 does not
             divide the input size, as kiln does): lo = min(w, 0), hi = max(w, 0),
             s = (hi - lo) / 15, z = round(-lo / s), q = clamp(round(w / s) + z, 0, 15)
  fp8        W8A8 E4M3: weights with a scale per output channel (max|w| / 448),
             activations with a scale per token (max|x| / 448), both rounded to
             the nearest E4M3 value (ties to even, saturating at 448)
  kv-fp8     f32 weights, the KV cache in E4M3: every key (after RoPE) and value
             rounded to the nearest E4M3 value with a scale of 1, saturating at
             448 (kiln build --kv-dtype fp8); attention in f32
  kv-fp8-rows  the same with a scale per token and kv head (max|row| / 448), a
             design kiln does not build: what a dynamic scale would change
A suffix picks the variants a format can take: `+mse` searches each
row's/group's clipping for the least weight error (still round-to-nearest),
`+lm` quantizes the output projection too (otherwise kept unquantized),
`+keep=A:B` keeps the matmuls named unquantized (attn_v, L3 for a layer,
L3.attn_v) and `+only=A:B` quantizes only those, fp8's `+wonly` / `+aonly`
quantize only the weights / only the activations, and `@bf16` runs the
format with bf16 rounding as in `bf16`.

--engine FMT=PATH compares kiln's quantized constants in an engine file
(read as docs/engine-format.md defines it) element by element with this
script's quantization of the same weights and prints the mismatches.
"""
import argparse
import json
import math
import struct
import sys

import gguf
import ml_dtypes
import numpy as np

F32 = np.float32
E4M3_MAX = 448.0

# ---- checkpoint ---------------------------------------------------------------------------


def load_gguf(path):
    """The tensors dequantized to f32, [rows, cols] as ggml lays them
    (q/k rows in llama.cpp's permuted order), and the config."""
    r = gguf.GGUFReader(path)
    w = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(F32)
        w[t.name] = a.reshape([int(d) for d in reversed(t.shape)])

    def field(name):
        f = r.fields[name]
        return f.parts[f.data[0]][0]

    cfg = {
        "layers": int(field("llama.block_count")),
        "heads": int(field("llama.attention.head_count")),
        "kv_heads": int(field("llama.attention.head_count_kv")),
        "eps": float(field("llama.attention.layer_norm_rms_epsilon")),
        "theta": float(field("llama.rope.freq_base")),
    }
    return w, cfg


# ---- the formats, from their definitions --------------------------------------------------


def round_half_away(x):
    """C's roundf: halves away from zero (numpy's round goes to even); the
    half added in f64, where it is exact for any f32."""
    return (np.sign(x) * np.floor(np.abs(x).astype(np.float64) + 0.5)).astype(F32)


def group_of(k, group):
    while k % group:
        group -= 32
    return group


def int8_quant(w, group, scale_of=None):
    """-> (q int8 [n, k], scales f32 [n, k / group])."""
    n, k = w.shape
    x = w.reshape(n, k // group, group)
    amax = np.abs(x).max(-1, keepdims=True)
    s = (amax / F32(127)).astype(F32) if scale_of is None else scale_of(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, round_half_away(x / s), 0)
    q = np.clip(q, -127, 127).astype(np.int8)
    return q.reshape(n, k), s.reshape(n, k // group)


def int8_dequant(q, s):
    n, k = q.shape
    g = k // s.shape[1]
    return (q.reshape(n, -1, g).astype(F32) * s[:, :, None]).reshape(n, k)


def int4_quant(w, group, range_of=None):
    """-> (q uint8 [n, k] in 0..15, scales f32 [n, k / group], zeros uint8)."""
    n, k = w.shape
    x = w.reshape(n, k // group, group)
    if range_of is None:
        lo = np.minimum(x.min(-1, keepdims=True), 0)
        hi = np.maximum(x.max(-1, keepdims=True), 0)
    else:
        lo, hi = range_of(x)
    s = ((hi - lo) / F32(15)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.clip(np.where(s > 0, round_half_away(-lo / s), 0), 0, 15)
        q = np.clip(np.where(s > 0, round_half_away(x / s), 0) + z, 0, 15)
    return q.astype(np.uint8).reshape(n, k), s.reshape(n, -1), z.astype(np.uint8).reshape(n, -1)


def int4_dequant(q, s, z):
    n, k = q.shape
    g = k // s.shape[1]
    return ((q.reshape(n, -1, g).astype(F32) - z[:, :, None].astype(F32)) * s[:, :, None]).reshape(n, k)


def e4m3(x):
    """x rounded to E4M3 (ties to even), saturating at ±448, as codes."""
    return np.clip(x, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)


def fp8_quant_rows(x):
    """Each row scaled by 448 / max|row| -> (codes as float8, scale f32 [rows, 1])."""
    a = np.abs(x).max(-1, keepdims=True).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(a > 0, F32(E4M3_MAX) / a, 0).astype(F32)
    return e4m3(x * inv), (a / F32(E4M3_MAX)).astype(F32)


def fp8_dequant_rows(x):
    c, s = fp8_quant_rows(x)
    return c.astype(F32) * s


# Clipping search ("+mse"): each row's or group's range shrunk by the factor
# in CLIP_GRID that gives the least squared weight error after
# round-to-nearest (the scale search of AWQ/llama.cpp's make_qx_quants
# without activation statistics). 1.0 is the plain RTN range.
CLIP_GRID = np.linspace(1.0, 0.5, 51).astype(F32)


def best_clip(x, quant_err):
    """x [n, g, group] -> per-(n, g) best factor from CLIP_GRID."""
    best = np.full(x.shape[:2] + (1,), np.inf, F32)
    fac = np.ones(x.shape[:2] + (1,), F32)
    for c in CLIP_GRID:
        e = quant_err(x, c)
        better = e < best
        best = np.where(better, e, best)
        fac = np.where(better, c, fac)
    return fac


def int8_mse_scale(x):
    amax = np.abs(x).max(-1, keepdims=True)

    def err(x, c):
        s = (amax * c / F32(127)).astype(F32)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.clip(np.where(s > 0, round_half_away(x / s), 0), -127, 127)
        return ((q * s - x) ** 2).sum(-1, keepdims=True)

    return (amax * best_clip(x, err) / F32(127)).astype(F32)


def int4_mse_range(x):
    lo0 = np.minimum(x.min(-1, keepdims=True), 0)
    hi0 = np.maximum(x.max(-1, keepdims=True), 0)

    def err(x, c):
        lo, hi = lo0 * c, hi0 * c
        s = ((hi - lo) / F32(15)).astype(F32)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.clip(np.where(s > 0, round_half_away(-lo / s), 0), 0, 15)
            q = np.clip(np.where(s > 0, round_half_away(x / s), 0) + z, 0, 15)
        return (((q - z) * s - x) ** 2).sum(-1, keepdims=True)

    c = best_clip(x, err)
    return lo0 * c, hi0 * c


def parse_format(spec):
    base, _, acts = spec.partition("@")
    parts = base.split("+")
    keep = [p[5:].split(":") for p in parts[1:] if p.startswith("keep=")]
    only = [p[5:].split(":") for p in parts[1:] if p.startswith("only=")]
    return {"name": spec, "kind": parts[0], "mse": "mse" in parts[1:], "lm": "lm" in parts[1:],
            "fp8_w": "aonly" not in parts[1:], "fp8_a": "wonly" not in parts[1:],
            "bf16": acts == "bf16" or parts[0] == "bf16", "keep": keep[0] if keep else [],
            "only": only[0] if only else []}


def is_quantized(fmt, layer, matmul):
    """`+keep=A:B` keeps the matmuls named (attn_v, L3 for a layer, L3.attn_v)
    unquantized; `+only=A:B` quantizes only those."""
    names = (matmul, f"L{layer}", f"L{layer}.{matmul}")
    if fmt["only"] and not any(n in fmt["only"] for n in names):
        return False
    return not any(n in fmt["keep"] for n in names)


def quantize_weight(fmt, w):
    """The weight as the format's matmul sees it (dequantized, f32)."""
    kind, k = fmt["kind"], w.shape[1]
    if kind == "int8":
        return int8_dequant(*int8_quant(w, k, int8_mse_scale if fmt["mse"] else None))
    if kind.startswith("int8-g"):
        return int8_dequant(*int8_quant(w, group_of(k, int(kind[6:])), int8_mse_scale if fmt["mse"] else None))
    if kind.startswith("int4"):
        group = group_of(k, int(kind[6:]) if kind.startswith("int4-g") else 128)
        return int4_dequant(*int4_quant(w, group, int4_mse_range if fmt["mse"] else None))
    if kind == "fp8":
        return fp8_dequant_rows(w) if fmt["fp8_w"] else w
    if kind == "bf16":
        return w.astype(ml_dtypes.bfloat16).astype(F32)
    return w


# ---- the model ---------------------------------------------------------------------------

MATMULS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


class Model:
    def __init__(self, w, cfg, fmt):
        self.cfg, self.fmt = cfg, fmt
        self.bf16 = fmt["bf16"]
        rw = (lambda a: a.astype(ml_dtypes.bfloat16).astype(F32)) if self.bf16 else (lambda a: a)
        self.emb = rw(w["token_embd.weight"])
        out = w.get("output.weight", w["token_embd.weight"])
        self.lm = quantize_weight(fmt, out) if fmt["lm"] else rw(out)
        self.norm = w["output_norm.weight"]
        self.layers = []
        for i in range(cfg["layers"]):
            L = {"attn_norm": w[f"blk.{i}.attn_norm.weight"], "ffn_norm": w[f"blk.{i}.ffn_norm.weight"]}
            for m in MATMULS:
                q = is_quantized(fmt, i, m)
                L[m] = np.ascontiguousarray((quantize_weight(fmt, w[f"blk.{i}.{m}.weight"]) if q else
                                             rw(w[f"blk.{i}.{m}.weight"])).T)
                L[m + ".fp8"] = q and fmt["kind"] == "fp8" and fmt["fp8_a"]
            self.layers.append(L)

    def r(self, x):
        """A layer's output as the engine stores it."""
        return x.astype(ml_dtypes.bfloat16).astype(F32) if self.bf16 else x

    def mm(self, x, L, m):
        if L[m + ".fp8"]:
            x = fp8_dequant_rows(x)
        return self.r(x @ L[m])

    def rms(self, x, g):
        v = np.mean(x.astype(np.float64) ** 2, -1, keepdims=True)
        return self.r((x / np.sqrt(v + self.cfg["eps"])).astype(F32) * g)

    def logits(self, ids):
        c = self.cfg
        T, H, KV = len(ids), c["heads"], c["kv_heads"]
        x = self.emb[ids]
        d = x.shape[1] // H
        # llama.cpp's rotation of adjacent pairs (the GGUF's q/k rows are
        # permuted for it)
        inv = 1.0 / c["theta"] ** (np.arange(0, d, 2) / d)
        ang = np.arange(T)[:, None] * inv[None, :]
        cos, sin = np.cos(ang).astype(F32), np.sin(ang).astype(F32)

        def rope(t):  # [T, heads, d]
            a, b = t[..., 0::2], t[..., 1::2]
            o = np.empty_like(t)
            o[..., 0::2] = a * cos[:, None] - b * sin[:, None]
            o[..., 1::2] = a * sin[:, None] + b * cos[:, None]
            return self.r(o)

        mask = np.triu(np.full((T, T), -np.inf, F32), 1)
        for L in self.layers:
            h = self.rms(x, L["attn_norm"])
            q = rope(self.mm(h, L, "attn_q").reshape(T, H, d))
            k = rope(self.mm(h, L, "attn_k").reshape(T, KV, d))
            v = self.mm(h, L, "attn_v").reshape(T, KV, d)
            if self.fmt["kind"] == "kv-fp8":
                k, v = e4m3(k).astype(F32), e4m3(v).astype(F32)
            elif self.fmt["kind"] == "kv-fp8-rows":
                k, v = fp8_dequant_rows(k), fp8_dequant_rows(v)
            k, v = np.repeat(k, H // KV, 1), np.repeat(v, H // KV, 1)
            s = q.transpose(1, 0, 2) @ k.transpose(1, 2, 0) / F32(math.sqrt(d)) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            p = s / s.sum(-1, keepdims=True)
            a = self.r((p @ v.transpose(1, 0, 2)).transpose(1, 0, 2).reshape(T, H * d))
            x = self.r(x + self.mm(a, L, "attn_output"))
            h = self.rms(x, L["ffn_norm"])
            g, u = self.mm(h, L, "ffn_gate"), self.mm(h, L, "ffn_up")
            m = self.r(g / (1 + np.exp(-g)) * u)
            x = self.r(x + self.mm(m, L, "ffn_down"))
        h = self.rms(x, self.norm)
        return h @ self.lm.T  # the logits are f32 in every engine


def log_softmax(z):
    z = z.astype(np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


# ---- kiln's engine file (docs/engine-format.md) -------------------------------------------

DTYPES = {0: F32, 4: np.uint8}


def engine_constants(path):
    """name -> numpy array of every f32/u8 constant in an engine file."""
    raw = np.memmap(path, np.uint8, "r")
    if bytes(raw[:8]) != b"KILNENG\0":
        sys.exit(f"{path}: not a kiln engine")
    n_sections = struct.unpack_from("<I", raw, 80)[0]
    sections = {}
    for i in range(n_sections):
        sid, _, off, size, _ = struct.unpack_from("<4sIQQQ", raw, 96 + 32 * i)
        sections[sid] = (off, size)
    off, size = sections[b"PLAN"]
    plan = json.loads(bytes(raw[off:off + size]))
    wbase = sections[b"WGHT"][0]
    exprs = plan["exprs"]
    out = {}
    for t in plan["tensors"]:
        if "data" not in t or t["dtype"] not in DTYPES:
            continue
        dims = [exprs[e][3] for e in t["dims"]]
        o, n = t["data"]
        out[t["name"]] = np.frombuffer(raw[wbase + o:wbase + o + n], DTYPES[t["dtype"]]).reshape(dims)
    return out


def stacked(w, i, parts):
    return np.concatenate([w[f"blk.{i}.{p}.weight"] for p in parts])


GROUPS = {"self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"), "self_attn.o_proj": ("attn_output",),
          "mlp.gate_up_proj": ("ffn_gate", "ffn_up"), "mlp.down_proj": ("ffn_down",)}


def compare_engine(fmt, path, w, cfg):
    """Counts of elements where kiln's constants differ from this script's."""
    c = engine_constants(path)
    kind = parse_format(fmt)["kind"]
    total = {"elements": 0, "q_mismatch": 0, "q_off_by_more_than_1": 0, "scale_mismatch": 0, "zero_mismatch": 0,
             "scale_max_rel_err": 0.0}
    for i in range(cfg["layers"]):
        for hf, parts in GROUPS.items():
            name = f"model.layers.{i}.{hf}.weight"
            if name not in c:
                sys.exit(f"{path}: no constant {name} (is it a {fmt} engine?)")
            src = stacked(w, i, parts)
            n, k = src.shape
            if kind in ("int8", "int8-g128"):
                group = k if kind == "int8" else group_of(k, 128)
                q, s = int8_quant(src, group)
                kq, ks = c[name].view(np.int8), c[name + ".scales"]
            elif kind == "int4":
                q, s, z = int4_quant(src, group_of(k, 128))
                b = c[name]
                kq = np.empty((n, k), np.uint8)
                kq[:, 0::2], kq[:, 1::2] = b & 0x0F, b >> 4
                ks, kz = c[name + ".scales"], c[name + ".zeros"]
                total["zero_mismatch"] += int((kz != z).sum())
            elif kind == "fp8":
                qc, s = fp8_quant_rows(src)
                q, kq = qc.view(np.uint8), c[name]
                ks, s = c[name + ".scale"], s[:, 0]
            else:
                sys.exit(f"--engine: no quantized constants to compare for {fmt}")
            d = np.abs(kq.astype(np.int32) - q.astype(np.int32))
            if kind == "fp8":  # neighbouring codes of one sign differ by 1
                d = np.where((kq ^ q) & 0x80, 255, d)
            total["elements"] += q.size
            total["q_mismatch"] += int((d != 0).sum())
            total["q_off_by_more_than_1"] += int((d > 1).sum())
            total["scale_mismatch"] += int((ks != s).sum())
            rel = np.abs(ks.astype(np.float64) - s) / np.maximum(np.abs(s), 1e-30)
            total["scale_max_rel_err"] = max(total["scale_max_rel_err"], float(rel.max()))
    return total


# ---- main --------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("ids")
    ap.add_argument("--formats", default="f32,bf16,int8,int8-g128,int4,fp8")
    ap.add_argument("--engine", action="append", default=[], metavar="FMT=PATH")
    ap.add_argument("--json", action="store_true", help="one JSON object a line")
    a = ap.parse_args()
    w, cfg = load_gguf(a.gguf)
    for spec in a.engine:
        fmt, _, path = spec.partition("=")
        r = compare_engine(fmt, path, w, cfg)
        print(json.dumps({"engine": path, "format": fmt, **r}) if a.json else
              f"kiln {fmt} constants vs reference: {r}", flush=True)
    windows = [[int(t) for t in line.replace(",", " ").replace("[", " ").replace("]", " ").split()]
               for line in open(a.ids) if line.strip()]
    formats = [parse_format(f) for f in a.formats.split(",") if f]  # --formats "": only --engine
    ref, ref_lp = None, []
    for fmt in formats:
        model = Model(w, cfg, fmt)
        nll, agree, kl, n = 0.0, 0, 0.0, 0
        for wi, ids in enumerate(windows):
            lp = log_softmax(model.logits(np.array(ids)))[:-1]
            tgt = np.array(ids[1:])
            nll += -lp[np.arange(len(tgt)), tgt].sum()
            n += len(tgt)
            if ref is None:
                ref_lp.append(lp)
            else:
                rlp = ref_lp[wi]
                agree += int((lp.argmax(-1) == rlp.argmax(-1)).sum())
                kl += float((np.exp(rlp) * (rlp - lp)).sum())
        ppl = math.exp(nll / n)
        row = {"format": fmt["name"], "tokens": n, "perplexity": ppl}
        if ref is None:
            ref = row
        else:
            row.update(delta_pct=(ppl / ref["perplexity"] - 1) * 100, argmax_agreement=agree / n, kl_mean=kl / n,
                       reference=ref["format"])
        if a.json:
            print(json.dumps(row), flush=True)
        elif "delta_pct" in row:
            print(f"{row['format']:<16} ppl {ppl:9.4f}  {row['delta_pct']:+7.2f}%  argmax {row['argmax_agreement']:.4f}"
                  f"  KL {row['kl_mean']:.5f}", flush=True)
        else:
            print(f"{row['format']:<16} ppl {ppl:9.4f}  (reference, {n} tokens)", flush=True)


if __name__ == "__main__":
    main()
