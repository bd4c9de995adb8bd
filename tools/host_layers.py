"""Per-call host cost of each layer above a backend, on CPU, with a stub backend that returns preallocated tensors.

`PYTHONPATH=$PWD python tools/host_layers.py [--calls 2000]`. The stub does no work, so what is timed is the
wrapper, torch's custom-op dispatch, the metadata checks, the backend choice and (for the autograd rows) the
autograd node; the validation mode is forced to ``async`` with a backend that checks offsets itself (what a CUDA
call of the triton backend does on the host). Shapes: the bench's overhead case (B=4, lengths <= 64, H8, D128).
Each row is the median of 5 repeats of ``calls`` calls in microseconds per call of this thread's CPU time
(``time.thread_time``: on a shared machine, wall time mostly measures the other processes).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import jfa_ops
from jfa_ops import validation
from jfa_ops.backends import Backend, Problem, register_backend, select_backend
from jfa_ops.ops import attention as ops

LENS = (64, 17, 40, 5)
HEADS, HEAD_DIM = 8, 128


def _inputs(requires_grad: bool):
    off = torch.tensor((0,) + LENS).cumsum(0).to(torch.int32)
    t = sum(LENS)
    mk = lambda: torch.randn(t, HEADS, HEAD_DIM, requires_grad=requires_grad)  # noqa: E731
    return mk(), mk(), mk(), off


def _stub_backend(q):
    out, lse = torch.empty_like(q), torch.empty(q.shape[1], q.shape[0])
    grads = tuple(torch.empty_like(q) for _ in range(3))
    return Backend("stub", forward=lambda *a: (out, lse), backward=lambda *a: grads, supports=lambda p: None,
                   checks_offsets=True)


def per_call_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    runs = []
    for _ in range(5):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        runs.append((time.thread_time() - t0) / calls * 1e6)
    return statistics.median(runs)


def rows(calls: int):
    q, k, v, off = _inputs(False)
    qg, kg, vg, _ = _inputs(True)
    register_backend(_stub_backend(q), replace=True)
    validation.validation_mode = lambda device: "async"  # the CUDA default, on CPU tensors
    opts = dict(causal=True, backend="stub")
    params, _ = ops._params(q, k, v, off, off, causal=True, backend="stub")
    problem = Problem.of(q, k, params)
    out, lse = torch.empty_like(q), torch.empty(HEADS, q.shape[0])
    grad_out = torch.randn_like(q)

    def fwd_bwd():
        o = jfa_ops.jagged_attention(qg, kg, vg, off, off, **opts)
        torch.autograd.backward(o, grad_out)

    yield "timer floor (one attribute lookup)", lambda: torch.ops.jfa.attention
    yield "jagged_attention, no input requires grad", lambda: jfa_ops.jagged_attention(q, k, v, off, off, **opts)
    yield "jagged_attention under torch.no_grad", _no_grad(lambda: jfa_ops.jagged_attention(qg, kg, vg, off, off,
                                                                                            **opts))
    yield "jagged_attention under torch.inference_mode", _inference(
        lambda: jfa_ops.jagged_attention(q, k, v, off, off, **opts))
    yield "jagged_attention, inputs require grad (autograd node)", lambda: jfa_ops.jagged_attention(
        qg, kg, vg, off, off, **opts)
    yield "torch.ops.jfa.attention, no grad", lambda: torch.ops.jfa.attention(q, k, v, off, off, **opts)
    yield "torch.ops.jfa.attention.default below autograd", _below_autograd(
        lambda: torch.ops.jfa.attention.default(q, k, v, off, off, **opts))
    yield "  op body alone (the python function, no dispatch)", lambda: ops.attention._init_fn(
        q, k, v, off, off, -1, -1, None, True, -1, -1, False, False, "stub")
    yield "  _params (check_options + check_attention_args + AttentionParams)", lambda: ops._params(
        q, k, v, off, off, causal=True, backend="stub")
    yield "  Problem.of", lambda: Problem.of(q, k, params)
    yield "  select_backend (named)", lambda: select_backend("stub", problem)
    yield "  check_offset_values (async: decides only)", lambda: validation.check_offset_values(
        q, k, off, off, -1, -1, True)
    yield "forward + backward, inputs require grad", fwd_bwd
    yield "torch.ops.jfa.attention_backward (public: validates)", lambda: torch.ops.jfa.attention_backward(
        grad_out, None, q, k, v, out, lse, off, off, causal=True, backend="stub")


def _no_grad(fn):
    def run():
        with torch.no_grad():
            return fn()
    return run


def _inference(fn):
    def run():
        with torch.inference_mode():
            return fn()
    return run


def _below_autograd(fn):
    def run():
        with torch._C._AutoDispatchBelowAutograd():
            return fn()
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}; us of CPU time per call, median of 5 x {args.calls} calls")
    for name, fn in rows(args.calls):
        try:
            print(f"{per_call_us(fn, args.calls):9.1f}  {name}")
        except AttributeError as e:  # a row timing a private helper this version does not have
            print(f"{'n/a':>9}  {name} ({e})")


if __name__ == "__main__":
    main()
