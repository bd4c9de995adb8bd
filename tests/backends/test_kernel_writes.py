"""What torch's analysis of a user Triton kernel says each attention kernel writes (the analysis
``torch.compile``/``wrap_triton`` uses to decide which graph inputs a kernel node mutates): exactly the outputs, never
q, k, v, dO, out or lse. A kernel found writing an input would make Inductor copy that input around every call (and
would be a real bug if true).

Known imprecision, documented in bench/NOTES.md v10: the analysis follows a ``tt.call`` result back to every argument
of the call, so the offsets (and the tile-list placeholders that alias them) count as written because the tile
helpers (``scheduling.slot_tile``, ``first_work``) return values that feed store addresses; hence
``common.int32_offsets`` copies them in traced graphs. They are excluded here.

The analysis needs JIT kernels (not the interpreter's) and a CUDA target: it runs in a subprocess without
TRITON_INTERPRET, with the GPU launches stubbed (tools/host_backend_cpu.py) and Triton's driver answering sm_90.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_WORKER = r"""
import json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
sys.path.insert(0, "tools"); sys.argv = ["worker"]
import host_backend_cpu
host_backend_cpu.stub_gpu()
from jfa_ops.backends import AttentionParams
from jfa_ops.backends.triton import attn_bwd, attn_fwd
from torch._higher_order_ops.triton_kernel_wrap import identify_accessed_tensors

launches = []
def record(kernel, plan_key, grid, dynamic, static, **options):
    launches.append((kernel, {**static(), **dynamic}))
attn_fwd.launch_planned = attn_bwd.launch_planned = record

class Sm90:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

off = torch.tensor([0, 30, 35, 35, 64], dtype=torch.int32)
results = {}
for broadcast in (False, True):
    rows_q = 24 if broadcast else 64
    q = torch.randn(rows_q, 4, 64, dtype=torch.float16)
    k, v = (torch.randn(64, 2, 64, dtype=torch.float16) for _ in range(2))
    params = AttentionParams(scale=0.125, causal=True, broadcast_q=broadcast, check_offsets=True)
    q_off = None if broadcast else off
    out, lse = attn_fwd.attention_forward(q, k, v, q_off, off, params)
    attn_bwd.attention_backward(torch.randn_like(out), None, q, k, v, out, lse, q_off, off, params)
triton.runtime.driver.set_active(Sm90())
for kernel, kwargs in launches:
    tensors = {n for n, a in kwargs.items() if isinstance(a, torch.Tensor)}
    writes = sorted(d.name for d in identify_accessed_tensors(kernel, dict(kwargs), {}).read_writes.writes)
    results.setdefault(kernel.fn.__name__, []).append({"writes": writes, "tensors": sorted(tensors)})
print(json.dumps(results))
"""

OFFSET_ALIASES = {"Q_OFF", "KV_OFF", "TILE_SEQ", "TILE_START", "TILE_COUNT", "WORK_COUNTER"}  # see the docstring
OUTPUTS = {"attn_fwd_kernel": {"Out", "Lse", "FLAG"}, "attn_bwd_delta_kernel": {"Delta", "ZEROED"},
           "attn_bwd_dkdv_kernel": {"DK", "DV", "DQ"}, "attn_bwd_dq_kernel": {"DQ"}}
INPUTS = {"Q", "K", "V", "DOut", "Out", "Lse"}


@pytest.fixture(scope="module")
def kernel_writes():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = root
    done = subprocess.run([sys.executable, "-c", _WORKER], cwd=root, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kernel", sorted(OUTPUTS))
def test_kernels_write_only_their_outputs(kernel_writes, kernel):
    calls = kernel_writes[kernel]
    assert calls, f"{kernel} was not launched"
    for call in calls:
        writes = set(call["writes"]) - OFFSET_ALIASES
        inputs = INPUTS & set(call["tensors"]) - OUTPUTS[kernel]
        assert not writes & inputs, f"{kernel} writes its inputs {sorted(writes & inputs)}"
        assert writes <= OUTPUTS[kernel], f"{kernel} writes {sorted(writes - OUTPUTS[kernel])}"
        assert writes, f"{kernel}: the analysis found no write at all (it failed and would copy every input)"
