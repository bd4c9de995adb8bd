"""Host cost of the opaque op path that a compiled graph calls, on CPU with the triton backend's launches stubbed.

`PYTHONPATH=$PWD python tools/opaque_host_cpu.py [--calls 1000] [--no-compiled]` (also on the GPU machine's host). Where
torch pins another triton than the installed one (a TLX install: ``triton_pin_mismatch``), compiled graphs keep
``torch.ops.jfa.attention`` one opaque node: its forward graph calls the op with grad mode off, its backward graph
``torch.ops.jfa.attention_backward``, per layer and step, through the dispatcher (bench/NOTES.md "opaque op host
path"). Rows, us of this thread's CPU time per call (median of 5 repeats), each in one process:

- the backend's forward / backward alone (the floor: what the op body must run), the op body without dispatch, and
  ``torch.ops.jfa.<op>.default`` under no_grad (what the compiled graph calls) as it is now and with the lean
  dispatch (``ops.attention.LEAN_DISPATCH``) and the body memo (``ops.attention.CALL_CACHE``) switched off, and with
  the overloads' direct call switched on (``ops.attention.DIRECT_OP_CALL``, JFA_OP_CALL=direct) (A/B);
- unless ``--no-compiled``: a chain of 1 and 4 attention calls (each output the next q), compiled with
  ``torch.compile(dynamic=True)`` (aot_eager: the op is one node, and Inductor's wrapper adds no per-node work on
  CPU, bench/NOTES.md "compiled per-layer cost"), forward + backward (q requires grad), per further layer
  ((W4 - W1) / 3), as now, with the direct call and with both switched off.

The case: the bench's overhead case (B=4, lengths <= 64, H8, D128, causal), fp16 (the interpreter's bf16 dot is
wrong, so the triton backend declines bf16 on CPU; the host path is the same). The launches are stubbed as in
tools/host_backend_cpu.py, so every line of Python a CUDA call runs on the host is timed.
"""
from __future__ import annotations

try:  # under Triton 3.8 + TLX (/tmp/t38 first on PYTHONPATH): the TLX plugin registers before triton is imported
    import _utlx_autoregister  # noqa: F401
except ImportError:
    pass
import argparse

import torch
from host_backend_cpu import HEAD_DIM, HEADS, LENS, stub_gpu  # this script's directory is on sys.path
from host_layers import per_call_us
from host_profile import with_setting

from jfa_ops.backends import Problem, select_backend
from jfa_ops.ops import attention as ops


def _before(fn):
    """fn as the op path ran before the lean dispatch and the op body memo (both off)."""
    return with_setting(ops, "LEAN_DISPATCH", False, with_setting(ops, "CALL_CACHE", False, fn))


def _direct(fn):
    """fn with the overloads' direct call on (``ops.DIRECT_OP_CALL``, JFA_OP_CALL=direct)."""
    return with_setting(ops, "DIRECT_OP_CALL", True, fn)


def _chain(layers: int, off: torch.Tensor, backend):
    def step(q, k, v, grad):
        x = q
        for _ in range(layers):
            x = torch.ops.jfa.attention(x, k, v, off, off, causal=True, backend=backend)[0]
        return torch.autograd.grad(x, q, grad)  # dk, dv not summed over layers: no adds of stub (garbage) values
    return torch.compile(step, dynamic=True, backend="aot_eager")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--no-compiled", action="store_true")
    args = parser.parse_args()
    stub_gpu()
    ops.install_direct_call()  # switched per row by ops.DIRECT_OP_CALL (off: the overloads call the dispatcher)
    backend = "triton"  # named: on CPU tensors the automatic choice would take the reference backend
    off = torch.tensor((0,) + LENS).cumsum(0).to(torch.int32)
    q, k, v = (torch.randn(sum(LENS), HEADS, HEAD_DIM, dtype=torch.float16) for _ in range(3))
    options = (-1, -1, None, True, -1, -1, False, False, backend)
    params, _ = ops._params(q, k, v, off, off, *options)
    impl = select_backend(backend, Problem.of(q, k, params))
    out, lse = torch.ops.jfa.attention.default(q, k, v, off, off, *options)
    grad = torch.randn_like(q)
    bwd_args = (grad, None, q, k, v, out, lse, off, off) + options
    fwd_op = lambda: torch.ops.jfa.attention.default(q, k, v, off, off, *options)  # noqa: E731
    bwd_op = lambda: torch.ops.jfa.attention_backward.default(*bwd_args)  # noqa: E731
    rows = [
        (f"{impl.name} forward alone (the floor)", lambda: impl.forward(q, k, v, off, off, params)),
        ("op body (attention._init_fn, no dispatch)", lambda: ops.attention._init_fn(q, k, v, off, off, *options)),
        ("torch.ops.jfa.attention.default (what the graph calls)", fwd_op),
        ("  with JFA_OP_CALL=direct (no dispatcher round trip)", _direct(fwd_op)),
        ("  without the lean dispatch (LEAN_DISPATCH off)", with_setting(ops, "LEAN_DISPATCH", False, fwd_op)),
        ("  without the body memo (CALL_CACHE off)", with_setting(ops, "CALL_CACHE", False, fwd_op)),
        ("  before: both off", _before(fwd_op)),
        (f"{impl.name} backward alone (the floor)", lambda: impl.backward(*bwd_args[:9], params)),
        ("op body (attention_backward._init_fn)", lambda: ops.attention_backward._init_fn(*bwd_args)),
        ("torch.ops.jfa.attention_backward.default (what the graph calls)", bwd_op),
        ("  with JFA_OP_CALL=direct", _direct(bwd_op)),
        ("  without the lean dispatch", with_setting(ops, "LEAN_DISPATCH", False, bwd_op)),
        ("  without the body memo", with_setting(ops, "CALL_CACHE", False, bwd_op)),
        ("  before: both off", _before(bwd_op)),
    ]
    print(f"torch {torch.__version__}, backend {impl.name}; us of CPU time per call (launches "
          f"stubbed), median of 5 x {args.calls}")
    with torch.no_grad():
        for name, fn in rows:
            print(f"{per_call_us(fn, args.calls):9.1f}  {name}", flush=True)
    if args.no_compiled:
        return
    qg = q.clone().requires_grad_()
    chains = {n: _chain(n, off, backend) for n in (1, 4)}
    calls = max(args.calls // 10, 20)
    for name, wrap in (("now", lambda fn: fn), ("with JFA_OP_CALL=direct", _direct), ("before (both off)", _before)):
        walls = {n: per_call_us(wrap(lambda c=c: c(qg, k, v, grad)), calls) for n, c in chains.items()}
        print(f"{(walls[4] - walls[1]) / 3:9.1f}  compiled fwd+bwd per further layer, {name} (1 call {walls[1]:.1f}, "
              f"4 calls {walls[4]:.1f})", flush=True)


if __name__ == "__main__":
    main()
