"""Compile every shipped Triton kernel specialization for sm_90 (Hopper) on a machine without a GPU.

Catches what the CPU interpreter cannot: kernels that fail to lower for the GPU, shared memory over the sm_90 budget
(227 KiB per program), loops that stopped being software-pipelined, missing tensor-core (wgmma) code.

TRITON_INTERPRET=1 (set for the interpreter tests of this same pytest process) makes ``@triton.jit`` build
interpreter objects at import time, so the compiles run in a subprocess with that variable removed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from jfa_ops.backends.triton.configs import SM90_SHARED_MEMORY_LIMIT  # noqa: E402

_WORKER = r"""
import importlib, json, sys, time
from concurrent.futures import ProcessPoolExecutor

def compile_one(index):
    import triton
    from triton.backends.compiler import GPUTarget
    from jfa_ops.backends.triton.specializations import shipped_specializations
    s = list(shipped_specializations())[index]
    fn = getattr(importlib.import_module(s.module), s.kernel)
    t0 = time.time()
    try:
        k = triton.compile(triton.compiler.ASTSource(fn=fn, signature=s.signature, constexprs=s.constexprs,
                                                     attrs=s.attrs),
                           target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": s.num_warps, "num_stages": s.num_stages})
    except Exception as e:  # reported per specialization
        return {"name": s.name, "error": f"{type(e).__name__}: {e}"[:2000]}
    ttgir = k.asm["ttgir"]
    return {"name": s.name, "shared": k.metadata.shared, "seconds": round(time.time() - t0, 2),
            "wgmma": ttgir.count("warp_group_dot "), "async_copies": ttgir.count("copy_global_to_local"),
            "num_stages": s.num_stages, "kernel": s.kernel}

if __name__ == "__main__":
    from jfa_ops.backends.triton.specializations import shipped_specializations
    n = len(list(shipped_specializations()))
    with ProcessPoolExecutor(max_workers=int(sys.argv[1])) as pool:
        print(json.dumps(list(pool.map(compile_one, range(n)))))
"""


def _names():
    from jfa_ops.backends.triton.specializations import shipped_specializations

    return [s.name for s in shipped_specializations()]


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    workers = str(max(1, min(4, os.cpu_count() or 1)))
    proc = subprocess.run([sys.executable, "-c", _WORKER, workers], env=env, cwd=root, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {r["name"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("name", _names())
def test_compiles_for_sm90(name, compiled):
    r = compiled[name]
    assert "error" not in r, r["error"]
    assert r["shared"] <= SM90_SHARED_MEMORY_LIMIT, f"{name}: {r['shared']} bytes of shared memory"
    elementwise = ("attn_bwd_delta_kernel", "attn_bwd_dq_finalize_kernel", "tile_slots_kernel",  # no matmuls
                   "offsets_ok_kernel")
    if r["kernel"] not in elementwise and "fp32" not in name:  # fp32 uses exact FMA dots, no wgmma
        assert r["wgmma"] > 0, f"{name}: no Hopper tensor-core (wgmma) ops"
        if r["num_stages"] > 1:
            assert r["async_copies"] > 0, f"{name}: inner loops not software-pipelined"
