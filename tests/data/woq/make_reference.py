#!/usr/bin/env python3
"""Weights and their quantized forms computed by numpy (and ml_dtypes for
E4M3) from the formats' definitions, for tests/unit/test_woq.c: kiln's
build-time quantizers (src/llm/woq.c) must give these bytes exactly.

    .venv-ref/bin/python tests/data/woq/make_reference.py [OUT_DIR]

Needs numpy, gguf and ml_dtypes (the definitions are those of
bench/quant_reference.py, which also checks kiln's engines). Deterministic.

w.npy is f32 [8, 384]: rows 0-3 random (normal, uniform, heavy-tailed,
mostly small with one outlier); row 4 has max = -min in every group, so
int4's zero point -min / s is 7.5 or within a rounding of it; row 5 holds values that
are exactly k + 0.5 steps of its int8 scale (ties); row 6 is all positive;
row 7 all zero. Written beside it:
  int8.q (i1 [8, 384]), int8.s (f4 [8, 1])             a scale a row
  int8g.q, int8g.s (f4 [8, 3])                         a scale per 128 inputs
  int4.q (u1 [8, 384], one value a byte), int4.s (f4 [8, 3]), int4.z (u1 [8, 3])
  fp8.q (u1 [8, 384], E4M3 codes), fp8.s (f4 [8])
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))
import quant_reference as ref  # noqa: E402


def weights():
    rng = np.random.default_rng(10)
    n, k = 8, 384
    w = np.zeros((n, k), np.float32)
    w[0] = rng.normal(0, 0.05, k)
    w[1] = rng.uniform(-0.3, 0.1, k)
    w[2] = rng.standard_t(2, k) * 0.02
    w[3] = rng.normal(0, 0.01, k)
    w[3, 77] = 1.5
    x = np.clip(rng.normal(0, 0.1, k), -0.2, 0.2).astype(np.float32)
    for g, m in enumerate((0.234375, 0.25, 0.3)):  # max = -min: -min / s is 7.5 or a rounding of it
        x[g * 128], x[g * 128 + 1] = m, -m
    w[4] = x
    s = np.float32(0.5) / np.float32(127)  # max 0.5; then values at (j + 0.5) steps
    w[5] = (rng.integers(-126, 126, k) + 0.5).astype(np.float32) * s
    w[5, 0] = 0.5
    w[6] = rng.uniform(0.01, 0.2, k)
    return w.astype(np.float32)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else HERE
    w = weights()
    k = w.shape[1]
    files = {"w": w}
    files["int8.q"], files["int8.s"] = ref.int8_quant(w, k)
    files["int8g.q"], files["int8g.s"] = ref.int8_quant(w, 128)
    files["int4.q"], files["int4.s"], files["int4.z"] = ref.int4_quant(w, 128)
    codes, s = ref.fp8_quant_rows(w)
    files["fp8.q"], files["fp8.s"] = codes.view(np.uint8), s[:, 0]
    ties = np.abs(w[5] / files["int8.s"][5] % 1 - 0.5) == 0
    z = -np.minimum(w[4].reshape(3, 128).min(-1), 0) / files["int4.s"][4]
    assert ties.sum() > 300 and (np.abs(z - 7.5) < 1e-6).all(), "the tie rows lost their ties"
    for name, a in files.items():
        np.save(os.path.join(out, name + ".npy"), np.ascontiguousarray(a))


if __name__ == "__main__":
    main()
