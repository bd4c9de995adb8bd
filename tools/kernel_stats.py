"""Static sm_90 statistics of shipped Triton kernel specializations, no GPU needed (bench/NOTES.md "MXFP8 v3").

`PYTHONPATH=/work/t36:$PWD python tools/kernel_stats.py REGEX...` (Triton 3.6 as on the H200; ptxas from CUDA on
PATH or /usr/local/bin) compiles every specialization of ``specializations.shipped_specializations(quick=True)``,
``mxfp8_specializations()`` and ``block_sparse_specializations()`` whose name matches a REGEX for
``GPUTarget("cuda", 90, 32)`` and prints one JSON line each: warps, stages, shared memory, registers and spill bytes (``ptxas -v``), Hopper (wgmma) and Ampere
(mma.sync) dots, E4M3 wgmmas, layout conversions, async copies (cp.async) and TMA loads in the TTGIR, vectorized
global loads, and per innermost loop of the PTX its instruction count split into ALU, conversions, MUFU, shared,
global, barrier and wgmma instructions (per thread per iteration: divide by the elements a thread holds).
"""
from __future__ import annotations

import collections
import importlib
import json
import re
import shutil
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget

from jfa_ops.backends.triton import specializations

_LABEL = re.compile(r"^(\$L__BB\d+_\d+):")
_INSTR = re.compile(r"^\s+(@!?%p\d+\s+)?[a-z]")


def _kind(op: str) -> str:
    if op.startswith("wgmma"):
        return "wgmma"
    if op.startswith("ex2"):
        return "mufu"
    if op.startswith("cvt"):
        return "cvt"
    if ".shared" in op or op.startswith(("ldmatrix", "stmatrix")):
        return "smem"
    if ".global" in op or op.startswith("cp.async"):
        return "gmem"
    if op.startswith(("bar", "mbarrier", "fence")):
        return "sync"
    return "alu"


def loop_mix(ptx: str):
    """Instruction counts of each innermost loop: from its header label to the branch back to it."""
    lines = ptx.splitlines()
    loops = []
    for i, line in enumerate(lines):
        if "Inner Loop Header" not in line:
            continue
        k = i
        while k >= 0 and not _LABEL.match(lines[k]):
            k -= 1
        label = _LABEL.match(lines[k]).group(1)
        back = re.compile(r"bra(\.uni)?\s+" + re.escape(label) + ";")
        end = next((j for j in range(i, len(lines)) if back.search(lines[j])), None)
        if end is None:  # the header's block is not the one the back edge targets (a branch inside the loop)
            continue
        ops = [re.sub(r"^@!?%p\d+\s+", "", l.strip()).split()[0] for l in lines[k:end] if _INSTR.match(l)]
        loops.append(dict(collections.Counter(_kind(op) for op in ops), total=len(ops)))
    return loops


def stats(spec, ptxas: str):
    fn = getattr(importlib.import_module(spec.module), spec.kernel)
    k = triton.compile(triton.compiler.ASTSource(fn=fn, signature=spec.signature, constexprs=spec.constexprs,
                                                 attrs=spec.attrs),
                       target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
    ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        log = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True,
                             text=True).stderr
    return dict(name=spec.name, warps=spec.num_warps, stages=spec.num_stages, shared=k.metadata.shared,
                registers=[int(x) for x in re.findall(r"Used (\d+) registers", log)],
                spill_bytes=[int(x) for x in re.findall(r"(\d+) bytes spill stores", log)],
                wgmma=ttgir.count("warp_group_dot "), mma_sync=len(re.findall(r"\bmma\.sync", ptx)),
                e4m3_wgmma=len(re.findall(r"wgmma\.mma_async[^\n]*e4m3", ptx)),
                convert_layout=ttgir.count("convert_layout"), async_copy=ttgir.count("async_copy_global_to_local"),
                tma_load=ttgir.count("async_tma_copy_global_to_local"),
                ld_global_v4=len(re.findall(r"ld\.global[^\n]*\.v4", ptx)), loops=loop_mix(ptx))


def main(patterns) -> int:
    ptxas = shutil.which("ptxas") or "/usr/local/bin/ptxas"
    specs = (list(specializations.shipped_specializations(quick=True)) + list(specializations.mxfp8_specializations())
             + list(specializations.block_sparse_specializations()))
    for spec in specs:
        if any(re.search(p, spec.name) for p in patterns):
            print(json.dumps(stats(spec, ptxas)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["^mxfp8-"]))
