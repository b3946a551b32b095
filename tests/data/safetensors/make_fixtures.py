#!/usr/bin/env python3
"""Writes the tiny .safetensors fixtures read by tests/unit/test_safetensors.c
with the reference `safetensors` package (its Rust serializer) as the outside
reference. Run from this folder:
    python3 make_fixtures.py
Values are simple formulas so the C test can recompute them."""
import numpy as np
from safetensors import _safetensors_rust as st_rust
from safetensors.numpy import save_file

save_file(
    {
        "a": (np.arange(6, dtype="<f4") * 0.5 - 1).reshape(2, 3),  # i * 0.5 - 1
        "b": np.array([1.0, -2.0], dtype="<f2"),
        "c": np.array([[5]], dtype="<i8"),
        "d": np.array([0, 7, 255], dtype="u1"),
        "e": np.array([True, False, True]),
        "f": np.array(-9, dtype="<i4"),
        "g": np.array([-128, 127], dtype="i1"),
        "empty": np.zeros((0, 4), dtype="<f4"),
    },
    "small.safetensors",
    metadata={"format": "pt", "note": "kiln"},
)

# numpy has no bfloat16 or fp8: hand the Rust serializer raw bytes, as the
# torch front end does. bf16 0x3fc0 = 1.5, 0xc120 = -10; fp8 e4m3 0x38 = 1.0.
w = np.array([0x3FC0, 0xC120], dtype="<u2")
x = np.array([1.0, 2.0], dtype="<f8")
y = np.array([0x38], dtype="u1")


def spec(dtype, shape, arr):
    return st_rust.TensorSpec(dtype=dtype, shape=shape, data_ptr=arr.ctypes.data,
                              data_len=arr.nbytes)


with open("mixed.safetensors", "wb") as f:
    f.write(st_rust.serialize({"w": spec("bfloat16", [2], w), "x": spec("float64", [2], x),
                               "y": spec("float8_e4m3fn", [1], y)}, None))
