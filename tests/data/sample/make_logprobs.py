#!/usr/bin/env python3
"""Reference log-softmax values and top-20 ids for the logprob outputs of
kiln/Sample (plugins/sample/sample.c), with numpy as the outside reference.
tests/unit/test_sampler.c runs the CPU layer on logits.npy and compares.
Run from this folder:
    python3 make_logprobs.py
Writes logits.npy (f32 [6, 300]: ordinary, tied, -inf masked, large, peaked
and flat rows), logsoftmax.npy (f32 [6, 300], computed in float64) and
top_ids.npy (i32 [6, 20], descending logit, lower id first on ties)."""
import numpy as np
from numpy.lib import format as npf

S, V, K = 6, 300, 20


def save(name, arr):
    with open(name, "wb") as f:
        npf.write_array(f, arr, allow_pickle=False)


rng = np.random.RandomState(2026)
x = rng.standard_normal((S, V)).astype(np.float32) * 3
x[1] = np.round(x[1] * 2) / 2  # many ties
x[2, rng.choice(V, 120, replace=False)] = -np.inf  # masked ids
x[3] = x[3] * 300 + 1000  # large logits: the max must be taken out
x[4, 17] = 40.0  # one id holds almost all the mass
x[5] = rng.uniform(-0.01, 0.01, V).astype(np.float32)
x64 = x.astype(np.float64)
m = np.max(x64, axis=1, keepdims=True)
lsm = x64 - m - np.log(np.sum(np.exp(x64 - m), axis=1, keepdims=True))
top = np.argsort(-x64, axis=1, kind="stable")[:, :K].astype(np.int32)
save("logits.npy", x.astype("<f4"))
save("logsoftmax.npy", lsm.astype("<f4"))
save("top_ids.npy", top.astype("<i4"))
