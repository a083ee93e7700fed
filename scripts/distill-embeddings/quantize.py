#!/usr/bin/env python3
"""Turns table.f32 (30522 x 384, from `cargo run`) into host/search/data/minilm-static-128.bin:
the rows projected on their first 128 principal components (centred), then int8 per row with
an f32 scale. Layout: 30522 little-endian f32 scales, then 30522 x 128 int8."""
import pathlib

import numpy as np

here = pathlib.Path(__file__).resolve().parent
table = np.fromfile(here / "table.f32", dtype="<f4").reshape(-1, 384)
centred = table - table.mean(0)
_, _, vt = np.linalg.svd(centred, full_matrices=False)
projected = (centred @ vt[:128].T).astype(np.float32)
scale = np.abs(projected).max(1) / 127.0
scale[scale == 0] = 1
quantized = np.round(projected / scale[:, None]).astype(np.int8)
data = here.parent.parent / "host/search/data"
with open(data / "minilm-static-128.bin", "wb") as out:
    out.write(scale.astype("<f4").tobytes())
    out.write(quantized.tobytes())
(data / "minilm-vocab.txt").write_bytes((here / "vocab.txt").read_bytes())
print(f"wrote {data}/minilm-static-128.bin: {quantized.shape}")
