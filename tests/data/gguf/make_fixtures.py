"""Writes tests/data/gguf/types.gguf and its expected dequantized values with
the `gguf` package (the ggml project's own Python reader/writer), so kiln's
GGUF reader and dequantization are checked against code nobody here wrote.

    python3 tests/data/gguf/make_fixtures.py   # needs: pip install gguf numpy
"""
import os

import gguf
import numpy as np
from gguf import quants

here = os.path.dirname(os.path.abspath(__file__))
T = gguf.GGMLQuantizationType
rng = np.random.default_rng(1234)

w = gguf.GGUFWriter(os.path.join(here, "types.gguf"), "llama")
w.add_uint32("test.u32", 4294967295)
w.add_int32("test.i32", -7)
w.add_float32("test.f32", 0.25)
w.add_uint64("test.u64", 1 << 40)
w.add_bool("test.bool", True)
w.add_string("test.string", "héllo ✓")
w.add_array("test.strings", ["a", "", "ünï", "<0x0A>"])
w.add_array("test.ints", [3, -1, 2])

expected = {}
rows, cols = 2, 512
for qtype in [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q6_K, T.Q5_0, T.Q5_1, T.Q5_K]:
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        # gguf cannot quantize these: random block bytes with sane f16 scales.
        raw = rng.integers(0, 256, size=(rows, cols // block * nbytes), dtype=np.uint8)
        blocks = raw.reshape(rows, cols // block, nbytes)
        scale_pos = [208] if qtype == T.Q6_K else [0, 2]
        for p in scale_pos:
            blocks[:, :, p:p + 2] = np.float16(rng.uniform(0.001, 0.05, size=blocks.shape[:2])).view(np.uint8).reshape(rows, cols // block, 2)
        data = raw
    else:
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        data = quants.quantize(x, qtype) if qtype != T.F32 else x
    name = "t." + qtype.name.lower()
    w.add_tensor(name, data, raw_dtype=qtype)
    expected[name] = quants.dequantize(data, qtype).astype(np.float32).reshape(rows, cols)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
for name, v in expected.items():
    v.tofile(os.path.join(here, name + ".f32"))
