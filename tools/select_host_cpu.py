"""A selection call's host path on CPU, the GPU launches stubbed: Python time per call and GPU work items per call.

`PYTHONPATH=$PWD python tools/select_host_cpu.py [--calls 500]`. Runs the CUDA branch of the launch path on CPU
tensors (``host_backend_cpu.stub_gpu``: a launch stops where ``CompiledKernel.run`` would start the kernel; device
flags not asserted), so what is timed is every line of Python an eager CUDA ``jfa_ops.select_kv_blocks`` runs on the
host, less what the CUDA calls themselves cost (the launcher, ``cuLaunchKernel``, the allocator, ~5-10 us per GPU
work item on the H200's host). Case: the bench's sparse batch's structure (22 sequences of whole 128-blocks, H16,
D128, causal, keep 0.5) at small lengths (the host path does not depend on them; fp16: the interpreter guard
refuses bf16 on CPU). Rows (bench/NOTES.md "selection host path, helper selshare, stop 28"):

- the public call with JFA_SELECT_DIRECT's path (``ops.block_sparse.SELECT_DIRECT``: the op's body without the
  dispatcher, a call memo; ``KNOBS.sparse_select_layouts``: the triton layouts), then with one of the two off, then
  both off (JFA_SELECT_DIRECT=0: through ``torch.ops.jfa.select_kv_blocks``, every launch argument derived per
  call; the public call's path, both on, is the default since 2026-12-03);
- the triton backend's function alone, offsets checked and not;
- the GPU work items of one backend call (Triton launches, and aten ops that launch a kernel on a GPU; a dispatch
  mode sends the public call through the op, so the backend is counted); on CUDA the public call's offsets are
  covered after its first call (async mode): later calls run the unchecked path.

Times: this thread's CPU time (``time.thread_time``), median of 5 repeats.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
from unittest import mock

import torch
from host_backend_cpu import stub_gpu  # this script's directory is on sys.path
from host_layers import per_call_us

LENS = tuple(128 * ((7 * i) % 5 + 1) for i in range(22))
HEADS, HEAD_DIM = 16, 128


def work_items(fn) -> dict:
    """{name: count} of the Triton launches and the aten ops that launch a GPU kernel during ``fn()``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from jfa_ops.backends.triton.launch import LAUNCHES
    no_kernel = ("empty", "empty_strided", "view", "unbind", "select", "slice", "alias", "_reshape_alias",
                 "as_strided", "detach", "t", "expand", "unsqueeze", "squeeze", "lift_fresh")
    items: dict = {}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name not in no_kernel:
                items[name] = items.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    LAUNCHES.clear()
    with Count():
        fn()
    items.update(LAUNCHES)
    return items


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    stub_gpu()
    import jfa_ops
    from jfa_ops import validation
    from jfa_ops.backends.triton import block_sparse_select, configs
    from jfa_ops.ops import block_sparse

    validation.cover = lambda *a: None  # CPU offsets are never covered: the rows below time the checked path
    off = torch.tensor((0,) + LENS).cumsum(0).to(torch.int32)
    q, k = (torch.randn(sum(LENS), HEADS, HEAD_DIM, dtype=torch.float16) for _ in range(2))
    mx = max(LENS)
    opts = dict(block_q=128, block_kv=128, keep_ratio=0.5, causal=True, backend="triton")

    def public():
        return jfa_ops.select_kv_blocks(q, k, off, off, mx, mx, **opts)

    params, _ = block_sparse._select_params(q, k, off, off, mx, mx, 128, 128, 0.5, -1, True)
    checked = dataclasses.replace(params, check_offsets=True)
    direct, layouts = (block_sparse, "SELECT_DIRECT"), (configs.KNOBS, "sparse_select_layouts")
    rows = [("public select_kv_blocks, JFA_SELECT_DIRECT's path (offsets checked: CPU ones are never covered)",
             public, ((direct, True), (layouts, True))),
            ("  without the layouts (KNOBS.sparse_select_layouts off)", public, ((direct, True), (layouts, False))),
            ("  through torch.ops.jfa.select_kv_blocks (SELECT_DIRECT off)", public, ((direct, False), (layouts, True))),
            ("  both off (JFA_SELECT_DIRECT=0)", public, ((direct, False), (layouts, False))),
            ("triton backend select_kv_blocks with layouts, offsets checked", lambda: block_sparse_select.select_kv_blocks(
                q, k, off, off, checked), ((layouts, True),)),
            ("  unchecked (covered offsets)", lambda: block_sparse_select.select_kv_blocks(q, k, off, off, params),
             ((layouts, True),)),
            ("  without layouts, unchecked", lambda: block_sparse_select.select_kv_blocks(q, k, off, off, params),
             ((layouts, False),))]
    print(f"torch {torch.__version__}; us of CPU time per call (launches stubbed), median of 5 x {args.calls}")
    for name, fn, switches in rows:
        with contextlib.ExitStack() as stack:
            for (module, attr), value in switches:
                stack.enter_context(mock.patch.object(module, attr, value))
            print(f"{per_call_us(fn, args.calls):9.1f}  {name}", flush=True)
    for name, fn in (("checked: + the check's assert, stubbed here", lambda: block_sparse_select.select_kv_blocks(
            q, k, off, off, checked)),
                     ("unchecked", lambda: block_sparse_select.select_kv_blocks(q, k, off, off, params))):
        fn()
        items = work_items(fn)
        print(f"GPU work per backend call ({name}): {sum(items.values())} = {items}")


if __name__ == "__main__":
    main()
