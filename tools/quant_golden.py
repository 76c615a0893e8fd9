#!/usr/bin/env python3
"""Generate dequantization golden vectors for damascus-quant from gguf-py.

Oracle: `gguf.quants.dequantize` (gguf-py, tested with gguf 0.19 + numpy 2.4).
Output:  crates/quant/tests/fixtures/dequant_golden.bin (small; committed).

Not run in CI. Re-run with:  python3 tools/quant_golden.py

File format (all little-endian):
    b"DQG1", u32 n_records, then per record:
        u32 ggml type id, u32 n_blocks, u32 n_full, u32 block_size, u32 type_size,
        raw      n_blocks * type_size bytes (the quantized input),
        full     n_full * block_size f32 (expected output of the first n_full blocks, bits),
        digests  n_blocks * 8 bytes (first 8 bytes of sha256 of each block's expected f32 LE bytes)
    then per "all patterns" record for F16 and BF16:
        u32 ggml type id, 32-byte sha256 of the expected f32 LE bytes of all 65536 inputs 0..=0xFFFF
        (the Rust test enumerates the inputs itself).

Blocks: block 0 is all zero bytes, block 1 all 0xFF; the rest are random bytes whose f16 scale
fields are overwritten, cycling through special values (0, -0, subnormals, max, +-Inf, quiet and
signalling NaN, 1.0), typical weight scales, or left random (random f16 bits cover huge / NaN
exponents too).
"""
import hashlib
import os
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "quant", "tests", "fixtures",
                   "dequant_golden.bin")

# Byte offsets of the f16 scale fields inside each block (ggml-common.h layouts).
SCALE_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
SPECIAL_F16 = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
               0x7E00, 0xFE00, 0x7C01, 0xFD55, 0x7FFF, 0x3C00, 0xBC00]
N_BLOCKS = 64
N_FULL = 4


def make_blocks(qtype, rng):
    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = bytearray(rng.integers(0, 256, size=N_BLOCKS * type_size, dtype=np.uint8).tobytes())
    raw[0:type_size] = bytes(type_size)
    raw[type_size:2 * type_size] = b"\xff" * type_size
    for k in range(2, N_BLOCKS):
        for fi, off in enumerate(SCALE_FIELDS[qtype]):
            mode = (k + 7 * fi) % 4
            if mode == 0:
                bits = SPECIAL_F16[(k * 3 + fi * 5) % len(SPECIAL_F16)]
            elif mode in (1, 2):
                v = np.float16(rng.normal(0.0, 0.05 if fi == 0 else 0.5))
                bits = int(np.array([v]).view(np.uint16)[0])
            else:
                continue
            struct.pack_into("<H", raw, k * type_size + off, bits)
    return bytes(raw)


def main():
    rng = np.random.default_rng(20261202)
    records = []
    np.seterr(all="ignore")
    for qtype in SCALE_FIELDS:
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        raw = make_blocks(qtype, rng)
        arr = np.frombuffer(raw, dtype=np.uint8).reshape(N_BLOCKS, type_size)
        out = dequantize(arr, qtype).astype(np.float32, copy=False).reshape(N_BLOCKS, block_size)
        assert out.dtype == np.float32
        rec = struct.pack("<5I", int(qtype), N_BLOCKS, N_FULL, block_size, type_size)
        rec += raw
        rec += out[:N_FULL].tobytes()
        rec += b"".join(hashlib.sha256(out[i].tobytes()).digest()[:8] for i in range(N_BLOCKS))
        records.append(rec)
    data = b"DQG1" + struct.pack("<I", len(records)) + b"".join(records)
    for qtype in (T.F16, T.BF16):
        allbits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        out = dequantize(allbits.view(np.uint8), qtype).astype(np.float32, copy=False)
        data += struct.pack("<I", int(qtype)) + hashlib.sha256(out.tobytes()).digest()
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(data)
    print(f"wrote {OUT} ({len(data)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
