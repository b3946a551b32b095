#!/usr/bin/env python3
"""Writes the weight side files of the example networks in this folder with
numpy and the reference `safetensors` package. Run from this folder:
    python3 make_weights.py
Values are simple formulas so tests/unit/test_network_json.c can recompute
them."""
import numpy as np
from safetensors.numpy import save_file

# fc1.weight[i] = i * 0.25 (C order), F32 [4, 4]; norm.weight = 1, 2, 3, 4
save_file({"fc1.weight": (np.arange(16, dtype="<f4") * 0.25).reshape(4, 4),
           "norm.weight": np.arange(1, 5, dtype="<f4")},
          "mlp_weights.safetensors", metadata={"format": "kiln-test"})
# w2[i] = (i - 6) / 4 (C order), f32 [4, 3]; exact in f16 too
np.save("mlp_w2.npy", ((np.arange(12, dtype="<f4") - 6) / 4).reshape(4, 3))
