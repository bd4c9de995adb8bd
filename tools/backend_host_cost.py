"""Per-call wall time of a small call on each backend given, one process: `PYTHONPATH=$PWD python
tools/backend_host_cost.py [--backends tlx,triton,auto] [--calls 300]` on a CUDA machine (with TLX on the path for
tlx; ``auto``: the automatic choice, ``backend=None``).

The bench's overhead case (B=4, lengths <= 64, H8, D128, causal, bf16; tools/host_profile.py): `jagged_attention`
under no_grad, and forward + backward through `torch.autograd.grad`. Decides whether an automatic backend choice
costs small calls host time (the GPU work of one call is ~10 us, far below its host time); first it prints what the
automatic choice takes for this call and for a large one (``jfa_ops.backends.explain_choice``).

Then, per backend, where the time goes (bench/NOTES.md "tlx host path"): the backend's forward and backward called
directly (no op layer, no autograd), the same with its kept launches off (forward replays, backward recipes:
``launch.REPLAYS_ENABLED``), and the GPU's own time per forward + backward (torch.profiler's kernel times over 20
calls): a row above that is host time; a row near it is the GPU's (the launch queue fills and the host waits)."""
from __future__ import annotations

try:  # the TLX plugin registers before anything imports triton (torch does), as tools/tlx_compile.py
    import _utlx_autoregister  # noqa: F401
except ImportError:
    pass
import argparse

import torch

import jfa_ops
from host_profile import HEAD_DIM, HEADS, LENS, per_call_us, profile  # tools/ is on the path of a script run from it


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="tlx,triton,auto")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--profile", type=int, default=0, metavar="TOP",
                        help="also cProfile each backend's no_grad call (own time, TOP rows), and time the no_grad "
                             "rows once more in the reverse backend order (an order effect shows there)")
    args = parser.parse_args()
    off = torch.tensor((0,) + LENS).cumsum(0).to(torch.int32).cuda()
    mk = lambda g: torch.randn(sum(LENS), HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                               requires_grad=g)
    q, k, v = mk(False), mk(False), mk(False)
    qg, kg, vg = mk(True), mk(True), mk(True)
    grad_out = torch.randn_like(q)
    explain_automatic_choice(q, k, off)
    print(f"{'backend':10s} {'no_grad fwd us':>15s} {'fwd+bwd us':>11s}")
    for name in args.backends.split(","):
        backend = _named(name)

        def fwd():
            with torch.no_grad():
                jfa_ops.jagged_attention(q, k, v, off, off, causal=True, backend=backend)

        def fwd_bwd():
            o = jfa_ops.jagged_attention(qg, kg, vg, off, off, causal=True, backend=backend)
            torch.autograd.grad(o, (qg, kg, vg), grad_out)

        try:
            print(f"{name:10s} {per_call_us(fwd, args.calls):15.1f} {per_call_us(fwd_bwd, args.calls):11.1f}",
                  flush=True)
        except Exception as e:  # noqa: BLE001 (a backend that cannot run here)
            print(f"{name:10s} skipped: {type(e).__name__}: {e}"[:200], flush=True)
    if args.profile:
        for name in reversed(args.backends.split(",")):
            fwd = lambda: _no_grad_call(q, k, v, off, _named(name))  # noqa: E731
            print(f"{name:10s} {per_call_us(fwd, args.calls):15.1f} (no_grad again, reverse order)", flush=True)
        for name in args.backends.split(","):
            profile(lambda: _no_grad_call(q, k, v, off, _named(name)), args.calls,  # noqa: B023
                    f"{name}: no_grad jagged_attention", args.profile)
    for backend in args.backends.split(","):
        if backend == "auto":  # the backend explain_automatic_choice named: its own split row says the rest
            continue
        try:
            split(backend, q, k, v, off, grad_out, args.calls)
        except Exception as e:  # noqa: BLE001
            print(f"{backend}: no split: {type(e).__name__}: {e}"[:200], flush=True)


def _named(name: str):
    """The ``backend`` argument of a --backends entry (``auto``: None, the automatic choice)."""
    return None if name == "auto" else name


def explain_automatic_choice(q, k, off) -> None:
    """What the automatic choice takes for this small call and for a large one (B4 x 4096 rows, same heads)."""
    from jfa_ops.backends import Problem, explain_choice
    from jfa_ops.ops.attention import _params

    params, _ = _params(q, k, q, off, off, causal=True)
    large = q.new_empty(4 * 4096, *q.shape[1:])
    for what, x in (("this call", q), ("B4 x 4096 rows", large)):
        try:
            print(f"automatic choice, {what} ({x.shape[0]} rows): {explain_choice(Problem.of(x, x, params))}",
                  flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"automatic choice, {what}: {type(e).__name__}: {e}"[:300], flush=True)


def _no_grad_call(q, k, v, off, backend):
    with torch.no_grad():
        jfa_ops.jagged_attention(q, k, v, off, off, causal=True, backend=backend)


def split(backend: str, q, k, v, off, grad_out, calls: int) -> None:
    """The backend's forward and backward alone (kept launches on, then off), and the GPU's time per call."""
    from jfa_ops.backends import Problem, select_backend
    from jfa_ops.backends.triton import launch
    from jfa_ops.ops.attention import _params

    params, _ = _params(q, k, v, off, off, causal=True)
    impl = select_backend(backend, Problem.of(q, k, params))
    out, lse = impl.forward(q, k, v, off, off, params)
    rows = dict(forward=lambda: impl.forward(q, k, v, off, off, params),
                backward=lambda: impl.backward(grad_out, None, q, k, v, out, lse, off, off, params))
    for name, fn in rows.items():
        kept = per_call_us(fn, calls)
        launch.REPLAYS_ENABLED = False
        try:
            full = per_call_us(fn, calls)
        finally:
            launch.REPLAYS_ENABLED = True
        print(f"{backend:10s} backend {name} alone {kept:7.1f} us (kept launches off: {full:7.1f})", flush=True)
    both = lambda: (rows["forward"](), rows["backward"]())  # noqa: E731
    both()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            both()
        torch.cuda.synchronize()
    device_us = sum(e.self_device_time_total for e in prof.key_averages()) / 20
    print(f"{backend:10s} GPU time per backend forward + backward: {device_us:7.1f} us", flush=True)
    if backend == "tlx":  # what Triton's launcher does per TMA descriptor argument (3 per forward, 5 per backward)
        from triton.backends.nvidia.driver import make_tensordesc_arg

        from jfa_ops.backends.triton.attn_fwd import rows_descriptor

        descriptor = rows_descriptor(q, 64)
        meta = dict(swizzle=3, elem_size=2, elem_type=10, block_size=[64, 64], fp4_padded=False, is_im2col=False)
        print(f"{backend:10s} launcher work per TMA descriptor (make_tensordesc_arg: cuTensorMapEncodeTiled): "
              f"{per_call_us(lambda: make_tensordesc_arg(descriptor, meta, None), calls * 10):7.2f} us", flush=True)


if __name__ == "__main__":
    main()
