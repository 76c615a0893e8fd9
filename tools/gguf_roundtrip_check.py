#!/usr/bin/env python3
"""Check that GGUF files written by damascus-gguf are read back identically by other readers.

For each input (synthetic files written here with gguf-py's GGUFWriter, plus the real default
model if present) this runs `cargo run -p damascus-gguf --example gguf_copy IN OUT`, then
compares IN and OUT as seen by gguf-py's GGUFReader (every field's types and values, every
tensor's name, type, shape and bytes). If llama.cpp's `llama-gguf` is available (LLAMA_GGUF env
var or the vendored build), it also reads both and compares its listing (kv keys, tensor names,
sizes, offsets, types). Nested arrays are only given to gguf-py: llama.cpp rejects them.

Dev tool, not run in CI. Usage: python3 tools/gguf_roundtrip_check.py [MODEL.gguf ...]
"""

import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGUFValueType as VT, GGMLQuantizationType as QT

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = "/tmp/dev/SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_GGUF = os.environ.get(
    "LLAMA_GGUF",
    "/opt/llama/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-gguf",
)


def make_synthetic(path: str, nested: bool) -> None:
    """Every scalar type, typed arrays, optional nested arrays, several tensor types."""
    w = GGUFWriter(path, "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1.5e-5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo wörld ✓")
    w.add_uint64("t.u64", 2**64 - 2)
    w.add_int64("t.i64", -(2**63) + 1)
    w.add_float64("t.f64", 3.141592653589793)
    w.add_key_value("t.arr.u8", [1, 2, 255], VT.ARRAY, sub_type=VT.UINT8)
    w.add_key_value("t.arr.i16", [-1, 2], VT.ARRAY, sub_type=VT.INT16)
    w.add_key_value("t.arr.u64", [2**63], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("t.arr.f64", [0.5, -1e300], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_array("t.arr.i32", [-1, 0, 7])
    w.add_array("t.arr.f32", [0.25, -2.0])
    w.add_array("t.arr.bool", [True, False, True])
    w.add_array("t.arr.str", ["a", "Ġthe", "✓"])
    if nested:
        w.add_array("t.arr.nested", [[1, 2], [3], [4, 5, 6]])
        w.add_array("t.arr.nested_str", [["x", "y"], ["z"]])
    rng = np.random.default_rng(0)
    w.add_tensor("a.f32", rng.standard_normal((3, 8)).astype(np.float32))
    w.add_tensor("b.f16", rng.standard_normal((5,)).astype(np.float16))
    w.add_tensor("c.i32", np.arange(7, dtype=np.int32))
    for name, qt, ne0, rows in [("d.q4_0", QT.Q4_0, 64, 2), ("e.q4_k", QT.Q4_K, 256, 3),
                                ("f.q6_k", QT.Q6_K, 512, 1), ("g.iq2_xxs", QT.IQ2_XXS, 256, 1)]:
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, size=(rows, ne0 // bs * ts), dtype=np.uint8)
        w.add_tensor(name, raw, raw_dtype=qt)  # shape inferred from the byte shape
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def rust_copy(src: str, dst: str) -> None:
    subprocess.run(
        ["cargo", "run", "-q", "--release", "-p", "damascus-gguf", "--example", "gguf_copy",
         "--", src, dst],
        cwd=REPO, check=True)


def field_view(f):
    return ([int(t) for t in f.types], repr(f.contents()))


def compare_gguf_py(a: str, b: str) -> list[str]:
    ra, rb = GGUFReader(a), GGUFReader(b)
    errs = []
    ka, kb = list(ra.fields), list(rb.fields)
    if ka != kb:
        errs.append(f"field keys differ: {ka} vs {kb}")
    for k in ka:
        if k in rb.fields and field_view(ra.fields[k]) != field_view(rb.fields[k]):
            errs.append(f"field {k}: {field_view(ra.fields[k])} != {field_view(rb.fields[k])}")
    if len(ra.tensors) != len(rb.tensors):
        errs.append(f"tensor count {len(ra.tensors)} vs {len(rb.tensors)}")
    for ta, tb in zip(ra.tensors, rb.tensors):
        same = (ta.name == tb.name and ta.tensor_type == tb.tensor_type
                and list(ta.shape) == list(tb.shape)
                and ta.data.tobytes() == tb.data.tobytes())
        if not same:
            errs.append(f"tensor {ta.name} differs")
    return errs


def llama_gguf_listing(path: str) -> list[str] | None:
    if not os.path.exists(LLAMA_GGUF):
        return None
    p = subprocess.run([LLAMA_GGUF, path, "r", "n"], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"llama-gguf failed on {path}: {p.stderr[-2000:]}")
    # Drop host pointers ("data = 0x7f..."), which differ between runs.
    return [re.sub(r"data = 0x[0-9a-f]+", "data = <ptr>", l) for l in p.stdout.splitlines()
            if "kv[" in l or "tensor[" in l or "n_kv" in l or "n_tensors" in l]


def raw_parts(field) -> list[int]:
    return [int(v) for p in field.parts[2:] for v in p.tolist()]


def check_demo(tmp: str) -> list[str]:
    """A file only our writer makes (alignment 64, empty + nested arrays), read by gguf-py."""
    path = os.path.join(tmp, "demo.gguf")
    subprocess.run(["cargo", "run", "-q", "--release", "-p", "damascus-gguf", "--example",
                    "gguf_copy", "--", "--demo", path], cwd=REPO, check=True)
    r = GGUFReader(path)
    f = r.fields
    got = {
        "arch": f["general.architecture"].contents(),
        "align": f["general.alignment"].contents(),
        # gguf-py's `types`/`contents()` cannot express an empty array's element type or
        # heterogeneous nested arrays, so check its raw parts (after the key).
        "empty": raw_parts(f["demo.empty"]),
        "nested": raw_parts(f["demo.nested"]),
        "i64": f["demo.i64"].contents(),
        "x": r.tensors[0].data.tolist(),
        "y": (r.tensors[1].tensor_type.name, r.tensors[1].data.tobytes() == bytes(range(68)),
              int(r.tensors[1].data_offset) % 64),
    }
    want = {"arch": "llama", "align": 64, "empty": [9, 6, 0],
            # ARRAY of ARRAY x2: [INT16 x2: 1, -2], [STRING x1: len 1, "x"]
            "nested": [9, 9, 2, 3, 2, 1, -2, 8, 1, 1, ord("x")], "i64": -5, "x": [1.0, 2.0, 3.0],
            "y": ("Q8_0", True, 0)}
    return [f"demo {k}: got {got[k]!r}, want {want[k]!r}" for k in want if got[k] != want[k]]


def main() -> int:
    models = sys.argv[1:] or ([DEFAULT_MODEL] if os.path.exists(DEFAULT_MODEL) else [])
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for nested in (False, True):
            p = os.path.join(tmp, f"synthetic{'_nested' if nested else ''}.gguf")
            make_synthetic(p, nested)
            cases.append((p, not nested))
        cases += [(m, True) for m in models]
        for src, check_llama in cases:
            dst = os.path.join(tmp, os.path.basename(src) + ".copy.gguf")
            rust_copy(src, dst)
            errs = compare_gguf_py(src, dst)
            status = "OK" if not errs else "FAIL"
            note = ""
            if check_llama:
                la, lb = llama_gguf_listing(src), llama_gguf_listing(dst)
                if la is None:
                    note = " (llama-gguf not found, skipped)"
                elif la != lb:
                    errs.append("llama-gguf listings differ")
                    status = "FAIL"
                else:
                    note = f" + llama-gguf identical ({len(la)} lines)"
            with open(src, "rb") as fa, open(dst, "rb") as fb:
                ident = fa.read() == fb.read()
            print(f"{status}: {os.path.basename(src)}: gguf-py reads the damascus copy identically"
                  f"{note}; byte-identical file: {ident}")
            for e in errs[:20]:
                print("   ", e)
            failures += bool(errs)
        errs = check_demo(tmp)
        print(("OK" if not errs else "FAIL") + ": demo.gguf (written by damascus: alignment 64, "
              "empty + nested arrays) read by gguf-py with the expected values")
        for e in errs:
            print("   ", e)
        failures += bool(errs)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
