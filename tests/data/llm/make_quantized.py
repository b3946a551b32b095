#!/usr/bin/env python3
"""Writes tiny AWQ-format and GPTQ-format checkpoints from the tiny Llama of
tests/data/llm/llama, and beside them their dequantized f32 equivalent, for
the import tests (tests/e2e/llm_quantized.sh).

    .venv/bin/python tests/data/llm/make_quantized.py [OUT_DIR]

Writes OUT_DIR/awq, OUT_DIR/gptq and OUT_DIR/dequantized
(default: beside this script). Needs numpy and safetensors. Deterministic.

Every q/k/v/o/gate/up/down projection is quantized to 4 bits in groups of
32 inputs by round-to-nearest over the group's range (min and max widened
to hold 0: s = (max - min) / 15, z = round(-min / s), q = clamp(round(w /
s) + z, 0, 15)), the scales stored in f16, and packed as each format
defines it:

- AWQ (AutoAWQ "GEMM" version, quant_method "awq"): qweight int32 [in,
  out / 8] and qzeros int32 [in / group, out / 8], eight output columns
  per word, column 8c + ORDER[i] in bits 4i..4i+3 with ORDER = 0, 2, 4, 6,
  1, 3, 5, 7; scales f16 [in / group, out].
- GPTQ (quant_method "gptq", checkpoint_format "gptq", the original
  layout): qweight int32 [in / 8, out] packed along the inputs (input 8r +
  j in bits 4j of row r), qzeros int32 [in / group, out / 8] packed along
  the outputs in order and holding z - 1, scales f16 [in / group, out],
  g_idx int32 [in] = input // group (desc_act false).

Both dequantize as w[o, i] = s[g, o] * (q[o, i] - z[g, o]); the
dequantized checkpoint holds exactly that product in f32 (the f16 scale widened, one
f32 multiply) in place of each projection, every other tensor and file as
the source has it.
"""
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else HERE
SRC = os.path.join(HERE, "llama")
GROUP = 32
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize(w):
    """w [out, in] f32 -> q [out, in] (0..15), z [out, in/G], s16 [out, in/G]."""
    out_f, in_f = w.shape
    g = w.reshape(out_f, in_f // GROUP, GROUP)
    lo = np.minimum(g.min(axis=2), 0)
    hi = np.maximum(g.max(axis=2), 0)
    s = ((hi - lo) / 15).astype(np.float32)
    s16 = s.astype(np.float16)
    s = s16.astype(np.float32)
    inv = np.where(s > 0, 1 / np.where(s > 0, s, 1), 0)
    z = np.clip(np.round(-lo * inv), 1, 15).astype(np.int64)  # >= 1: GPTQ v1 stores z - 1
    q = np.clip(np.round(g * inv[:, :, None]) + z[:, :, None], 0, 15).astype(np.int64)
    return q.reshape(out_f, in_f), z, s16


def dequantize(q, z, s16):
    out_f, in_f = q.shape
    s = s16.astype(np.float32)
    d = (q.reshape(out_f, in_f // GROUP, GROUP) - z[:, :, None]).astype(np.float32) * s[:, :, None]
    return d.reshape(out_f, in_f).astype(np.float32)


def pack_words(nibbles):
    """nibbles [..., 8] (0..15) -> int32 [...], nibble j in bits 4j."""
    v = np.zeros(nibbles.shape[:-1], dtype=np.uint32)
    for j in range(8):
        v |= nibbles[..., j].astype(np.uint32) << np.uint32(4 * j)
    return v.view(np.int32)


def awq_tensors(q, z, s16):
    out_f, in_f = q.shape
    qt = q.T.reshape(in_f, out_f // 8, 8)[:, :, AWQ_ORDER]  # word c, nibble i: column 8c + ORDER[i]
    zt = z.T.reshape(in_f // GROUP, out_f // 8, 8)[:, :, AWQ_ORDER]
    return {"qweight": pack_words(qt), "qzeros": pack_words(zt), "scales": np.ascontiguousarray(s16.T)}


def gptq_tensors(q, z, s16):
    out_f, in_f = q.shape
    qt = q.T.reshape(in_f // 8, 8, out_f).transpose(0, 2, 1)  # row r, column o, nibble j: input 8r + j
    zt = (z.T - 1).reshape(in_f // GROUP, out_f // 8, 8)
    return {"qweight": pack_words(qt), "qzeros": pack_words(zt), "scales": np.ascontiguousarray(s16.T),
            "g_idx": (np.arange(in_f) // GROUP).astype(np.int32)}


def write(name, tensors, quant_config):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(SRC):
        if f.endswith(".json") and f != "refs.json":
            shutil.copy(os.path.join(SRC, f), os.path.join(d, f))
    if quant_config:
        with open(os.path.join(SRC, "config.json")) as f:
            cfg = json.load(f)
        cfg["quantization_config"] = quant_config
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
    save_file(tensors, os.path.join(d, "model.safetensors"))


def main():
    src = load_file(os.path.join(SRC, "model.safetensors"))
    plain, awq, gptq = {}, {}, {}
    for name, t in sorted(src.items()):
        base = name[: -len(".weight")]
        if name.endswith(".weight") and base.split(".")[-1] in PROJ:
            q, z, s16 = quantize(t.astype(np.float32))
            plain[name] = dequantize(q, z, s16)
            for k, v in awq_tensors(q, z, s16).items():
                awq[base + "." + k] = v
            for k, v in gptq_tensors(q, z, s16).items():
                gptq[base + "." + k] = v
        else:
            plain[name] = awq[name] = gptq[name] = t
    write("awq", awq, {"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm",
                       "zero_point": True})
    write("gptq", gptq, {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
                         "sym": False, "checkpoint_format": "gptq"})
    write("dequantized", plain, None)


if __name__ == "__main__":
    main()
