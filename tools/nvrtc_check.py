#!/usr/bin/env python3
"""Compile-checks the CUDA kernels (crates/cuda/kernels/*.cu, in the order the crate
concatenates them) with NVRTC on a machine without a GPU. Dev tool, not run in CI.

NVRTC comes from the PyPI wheel `nvidia-cuda-nvrtc==13.0.88` (unzip it; point --lib at its
nvidia/cu13/lib). Exit 0 and "ok" when the source compiles to PTX for --arch (default
compute_90), else the compiler log and exit 1.

  python3 tools/nvrtc_check.py --lib /work/nvrtc
"""
import argparse
import ctypes
import os
import re
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=os.environ.get("NVRTC_LIB", "/work/nvrtc"))
ap.add_argument("--arch", default="compute_90")
ap.add_argument("--ptx", help="write the PTX here")
a = ap.parse_args()

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
mod_rs = open(os.path.join(root, "crates/cuda/src/gpu/mod.rs")).read()
files = re.findall(r'include_str!\("\.\./\.\./kernels/([a-z_0-9]+\.cu)"\)', mod_rs)
src = "".join(open(os.path.join(root, "crates/cuda/kernels", f)).read() for f in files)

ctypes.CDLL(os.path.join(a.lib, "libnvrtc-builtins.so.13.0"), mode=ctypes.RTLD_GLOBAL)
nv = ctypes.CDLL(os.path.join(a.lib, "libnvrtc.so.13"))
prog = ctypes.c_void_p()
rc = nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"damascus.cu", 0, None, None)
assert rc == 0, f"nvrtcCreateProgram {rc}"
opts = [f"--gpu-architecture={a.arch}".encode(), b"--std=c++17"]
arr = (ctypes.c_char_p * len(opts))(*opts)
rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
n = ctypes.c_size_t()
nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value)
nv.nvrtcGetProgramLog(prog, log)
text = log.value.decode(errors="replace").strip()
if rc != 0:
    print(text)
    print(f"FAILED ({', '.join(files)})")
    sys.exit(1)
if text:
    print(text)
if a.ptx:
    nv.nvrtcGetPTXSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    nv.nvrtcGetPTX(prog, buf)
    open(a.ptx, "wb").write(buf.value)
print(f"ok: {', '.join(files)} compile for {a.arch}")
