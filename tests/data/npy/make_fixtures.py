#!/usr/bin/env python3
"""Writes the tiny .npy fixtures read by tests/unit/test_npy.c, with numpy
itself as the outside reference. Run from this folder:
    python3 make_fixtures.py
The values are simple formulas so the C test can recompute them."""
import numpy as np
from numpy.lib import format as npf


def save(name, arr, version=None):
    with open(name, "wb") as f:
        npf.write_array(f, arr, version=version, allow_pickle=False)


# element i (C order) is i * 0.5 - 1
save("f32_2x3.npy", (np.arange(6, dtype="<f4") * 0.5 - 1).reshape(2, 3))
save("f16_4.npy", np.array([1.0, -2.0, 0.5, 65504.0], dtype="<f2"))
save("i32_3.npy", np.array([-7, 0, 2147483647], dtype="<i4"))
save("i64_2x2.npy", np.array([[-1, 2**40], [3, -(2**62)]], dtype="<i8"))
save("i8_3.npy", np.array([-128, 0, 127], dtype="i1"))
save("u8_3.npy", np.array([0, 1, 255], dtype="u1"))
save("bool_4.npy", np.array([True, False, False, True]))
save("f32_scalar.npy", np.array(3.25, dtype="<f4"))
save("f32_0x3.npy", np.zeros((0, 3), dtype="<f4"))
save("f32_v2.npy", np.arange(4, dtype="<f4"), version=(2, 0))
save("f32_v3.npy", np.arange(4, dtype="<f4"), version=(3, 0))
# refused by kiln
save("fortran_2x3.npy", np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3)))
save("f64_2.npy", np.array([1.0, 2.0], dtype="<f8"))
save("f32_be_2.npy", np.array([1.0, 2.0], dtype=">f4"))
