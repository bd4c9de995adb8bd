"""Where a small call's host time goes on a GPU machine: wall time per call of each layer, then cProfile tables.

`PYTHONPATH=$PWD python tools/host_profile.py [--calls 2000]` on a CUDA machine. The case is the bench's overhead
case (B=4, lengths <= 64, H8, D128, causal, bf16). tools/host_layers.py measures the layers above the backend on CPU
with a stub backend; tools/profile_host.py profiles public entry points only (GPU activities, CUDA API calls); this
times the private layers one by one (torch's custom-op floor, our checks, the triton backend's host path), since
cProfile charges everything below torch's custom-op ``backend_impl`` to that frame. Wall time (perf_counter) is right here: the lent machine runs nothing else. The GPU work of
one call (~9 us) is far below its host time, so the launch queue never fills and host time is what is measured.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from typing import Optional, Tuple

import torch

import jfa_ops
from jfa_ops.ops import attention as ops

LENS = (64, 17, 40, 5)
HEADS, HEAD_DIM = 8, 128


def per_call_us(fn, calls: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(runs)


def profile(fn, calls: int, title: str, top: int) -> None:
    for _ in range(20):
        fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    print(f"\n=== cProfile {title}: {calls} calls, sorted by own time (us per call = tottime / {calls} * 1e6)")
    print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[-6000:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--top", type=int, default=28)
    args = parser.parse_args()
    dev = "cuda"
    off = torch.tensor((0,) + LENS).cumsum(0).to(torch.int32).to(dev)
    t = sum(LENS)
    mk = lambda g: torch.randn(t, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16, requires_grad=g)  # noqa: E731
    q, k, v = mk(False), mk(False), mk(False)
    qg, kg, vg = mk(True), mk(True), mk(True)
    grad_out = torch.randn_like(q)
    opts = dict(causal=True, backend="triton")
    params, _ = ops._params(q, k, v, off, off, max_seqlen_q=64, max_seqlen_kv=64, causal=True)
    from jfa_ops.backends.triton import attn_bwd, attn_fwd
    import dataclasses
    import meta_kernels
    from jfa_ops.backends import Problem, select_backend
    from jfa_ops.backends.base import device_guard
    from jfa_ops.validation import check_offset_values
    checked = dataclasses.replace(params, check_offsets=True)
    fwd_out = attn_fwd.attention_forward(q, k, v, off, off, params)
    flag = torch.ones(1, dtype=torch.int32, device=dev)
    rows = []

    def no_grad(fn):
        def run():
            with torch.no_grad():
                return fn()
        return run

    def fwd_bwd():  # autograd.grad as the bench (bench/timing.py): no .grad accumulation (3 add_ a call)
        o = jfa_ops.jagged_attention(qg, kg, vg, off, off, **opts)
        torch.autograd.grad(o, (qg, kg, vg), grad_out)

    kept = jfa_ops.jagged_attention(qg, kg, vg, off, off, **opts)  # a graph the backward rows run again and again
    floor = _NoopAttention.apply(qg, kg, vg, off, off, None, None, None)

    try:
        from torch.nn.attention.varlen import varlen_attn
        rows.append(("torch varlen_attn, no grad (host-speed calibration)", no_grad(
            lambda: varlen_attn(q, k, v, off, off, 64, 64))))
    except Exception as e:  # noqa: BLE001 (older torch)
        print("varlen_attn unavailable:", e)
    rows += [
        ("trivial torch.library.custom_op (5 tensors, 9 scalars -> 2 empties)", no_grad(
            lambda: _trivial_op(q, k, v, off, off, -1, -1, None, True, -1, -1, False, False, "triton"))),
        ("a torch._dynamo.disable'd no-op function", lambda: _disabled_noop(q)),
        ("op body alone (the python function, no dispatch)", lambda: ops.attention._init_fn(
            q, k, v, off, off, -1, -1, None, True, -1, -1, False, False, "triton")),
        ("  _params", lambda: ops._params(q, k, v, off, off, causal=True)),
        ("torch.empty x2 (allocation floor)", lambda: (torch.empty_like(q), torch.empty(8, t, device=dev))),
        ("torch.empty(q.shape, dtype=, device=) x2: a positional size", lambda: [
            torch.empty(q.shape, dtype=q.dtype, device=dev) for _ in range(2)]),
        ("  the same with size= by keyword (common.alloc_output)", lambda: [
            torch.empty(size=q.shape, dtype=q.dtype, device=dev) for _ in range(2)]),
        ("jagged_attention no grad", no_grad(lambda: jfa_ops.jagged_attention(q, k, v, off, off, **opts))),
        ("jagged_attention no grad, max_seqlen given", no_grad(lambda: jfa_ops.jagged_attention(
            q, k, v, off, off, max_seqlen_q=64, max_seqlen_kv=64, **opts))),
        ("torch.ops.jfa.attention.default below autograd", lambda: _below(lambda: torch.ops.jfa.attention.default(
            q, k, v, off, off, -1, -1, None, True, -1, -1, False, False, "triton"))),
        ("triton attention_forward alone (backend host path + launches)",
         lambda: attn_fwd.attention_forward(q, k, v, off, off, params)),
        ("triton attention_forward, offsets checked on the device (the real call's params)",
         lambda: attn_fwd.attention_forward(q, k, v, off, off, checked)),
        ("  the same without its replays (launch.REPLAYS_ENABLED = False: A/B in one run)",
         _no_replays(lambda: attn_fwd.attention_forward(q, k, v, off, off, checked))),
        ("  the same without launch plans (launch.PLANS_ENABLED = False: A/B in one run)",
         _no_plans(lambda: attn_fwd.attention_forward(q, k, v, off, off, checked))),
        ("jagged_attention no grad, every call's offsets checked (validation.covered off: A/B)", _uncovered(no_grad(
            lambda: jfa_ops.jagged_attention(q, k, v, off, off, **opts)))),
        ("jagged_attention no grad, without the forward's replays", _no_replays(no_grad(
            lambda: jfa_ops.jagged_attention(q, k, v, off, off, **opts)))),
        ("jagged_attention no grad, without the fast path and call memo (ops.attention.CALL_CACHE = False: A/B)",
         _no_memo(no_grad(
            lambda: jfa_ops.jagged_attention(q, k, v, off, off, **opts)))),
        ("jagged_attention no grad, without launch plans", _no_plans(no_grad(
            lambda: jfa_ops.jagged_attention(q, k, v, off, off, **opts)))),
        ("triton attention_backward alone (3 launches: delta, dK/dV, dQ)",
         lambda: attn_bwd.attention_backward(grad_out, None, q, k, v, *fwd_out, off, off, params)),
        ("  the same without the backward recipe (attn_bwd.RECIPES_ENABLED = False: A/B)", _no_recipes(
            lambda: attn_bwd.attention_backward(grad_out, None, q, k, v, *fwd_out, off, off, params))),
        ("  check_attention_args", lambda: meta_kernels.check_attention_args(q, k, v, off, off, (-1, -1), False)),
        ("  check_options", lambda: meta_kernels.check_options(None, True, (-1, -1), False, False, -1, -1)),
        ("  select_backend + Problem.of", lambda: select_backend("triton", Problem.of(q, k, params))),
        ("  check_offset_values (async, backend checks)", lambda: check_offset_values(q, k, off, off, -1, -1, True)),
        ("  check_no_forward_ad", lambda: ops.check_no_forward_ad(q, k, v)),
        ("  eager_direct", lambda: ops.eager_direct(q, k, v, off, off)),
        ("  torch._assert_async(flag, msg)", lambda: torch._assert_async(flag.reshape(()), "m")),
        ("  torch._assert_async(flag)", lambda: torch._assert_async(flag.reshape(()))),
        ("  device_guard(q.device)", lambda: _enter(device_guard(q.device))),
        ("forward + backward, inputs require grad", fwd_bwd),
        ("  forward alone, inputs require grad (graph dropped: forward + node teardown)",
         lambda: jfa_ops.jagged_attention(qg, kg, vg, off, off, **opts)),
        ("  forward + backward, the backward on the calling thread (autograd multithreading off: A/B of the "
         "engine's hand-off to its CUDA thread)", _one_thread(fwd_bwd)),
        ("  backward alone through autograd (autograd.grad on a kept graph: engine + _DirectAttentionBackward)",
         lambda: torch.autograd.grad(kept, (qg, kg, vg), grad_out, retain_graph=True)),
        ("  the same on the calling thread (autograd multithreading off)", _one_thread(
            lambda: torch.autograd.grad(kept, (qg, kg, vg), grad_out, retain_graph=True))),
        ("  torch's floor: a no-op autograd.Function (same inputs, saved tensors), forward + backward",
         lambda: torch.autograd.grad(_NoopAttention.apply(qg, kg, vg, off, off, None, None, None)[0], (qg, kg, vg),
                                     grad_out)),
        ("  torch's floor, backward alone (kept graph)",
         lambda: torch.autograd.grad(floor[0], (qg, kg, vg), grad_out, retain_graph=True)),
        ("  torch's floor, forward + backward on the calling thread (autograd multithreading off)", _one_thread(
            lambda: torch.autograd.grad(_NoopAttention.apply(qg, kg, vg, off, off, None, None, None)[0],
                                        (qg, kg, vg), grad_out))),
        ("forward + backward, without the backward recipe", _no_recipes(fwd_bwd)),
        ("jagged_attention no grad, op path (JFA_EAGER_PATH=op)", _op_path(no_grad(
            lambda: jfa_ops.jagged_attention(q, k, v, off, off, **opts)))),
        ("forward + backward, op path", _op_path(fwd_bwd)),
    ]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; wall us per call, median of 5 x {args.calls}")
    for name, fn in rows:
        try:
            print(f"{per_call_us(fn, args.calls):9.1f}  {name}")
        except Exception as e:  # noqa: BLE001 (report and go on)
            print(f"{'failed':>9}  {name}: {type(e).__name__}: {e}")
    profile(no_grad(lambda: jfa_ops.jagged_attention(q, k, v, off, off, **opts)), args.calls,
            "jagged_attention no grad", args.top)
    profile(fwd_bwd, max(args.calls // 4, 100), "forward + backward", args.top)
    torch_profile(fwd_bwd, 200, "forward + backward", args.top)


def torch_profile(fn, calls: int, title: str, top: int) -> None:
    """torch.profiler's CPU-side table (aten ops, autograd nodes, the engine's own events) of ``calls`` calls: where
    the host time of forward + backward goes below Python (cProfile stops at the autograd engine's C++)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    print(f"\n=== torch.profiler {title}: {calls} calls, sorted by self CPU time (totals over all calls)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=60))


@torch.library.custom_op("jfa_profile::trivial", mutates_args=())
def _trivial_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo: torch.Tensor, ko: torch.Tensor, mq: int,
                mk: int, scale: Optional[float], causal: bool, wl: int, wr: int, bq: bool, det: bool,
                backend: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty(q.shape[1], q.shape[0], device=q.device)


class _NoopAttention(torch.autograd.Function):
    """``ops.attention._DirectAttention``'s autograd shape with no work: the same inputs and saved tensors, two
    fresh outputs, and a backward that returns fixed gradients (torch's own cost of a Function's forward + backward)."""

    @staticmethod
    def forward(ctx, q, k, v, q_offsets, kv_offsets, impl, params, options):
        out, lse = torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, *_ = ctx.saved_tensors
        return (q, k, v) + (None,) * 5


def _disabled_noop(x):
    return _DISABLED(x)


def _noop(x):
    return x


_DISABLED = torch._disable_dynamo(_noop)


def _enter(ctx):
    with ctx:
        pass


def with_setting(module, name, value, fn):
    """fn run with ``module.name`` set to value, the previous value restored after (an A/B of one switch in the same
    process; tools/tlx_check.py's knob columns too)."""
    def run():
        before = getattr(module, name)
        setattr(module, name, value)
        try:
            return fn()
        finally:
            setattr(module, name, before)
    return run


def _switched_off(module, flag, fn):
    """fn run with ``module.flag`` False."""
    return with_setting(module, flag, False, fn)


def _one_thread(fn):
    """fn with the autograd engine's device threads off: a CUDA backward runs on the calling thread instead of being
    handed to the engine's thread for that GPU and back (two thread wake-ups, and our backward's Python running on
    another core than the forward's)."""
    def run():
        with torch.autograd.set_multithreading_enabled(False):
            return fn()
    return run


def _op_path(fn):
    return _switched_off(ops, "EAGER_DIRECT", fn)


def _no_memo(fn):
    return _switched_off(ops, "CALL_CACHE", fn)


def _no_plans(fn):
    from jfa_ops.backends.triton import launch

    return _switched_off(launch, "PLANS_ENABLED", fn)


def _uncovered(fn):
    """fn with every call's offsets checked on the device (as for a new offsets tensor each call)."""
    from jfa_ops import validation

    def run():
        covered = validation.covered
        validation.covered = lambda *args: False
        try:
            return fn()
        finally:
            validation.covered = covered
    return run


def _no_replays(fn):
    from jfa_ops.backends.triton import launch

    return _switched_off(launch, "REPLAYS_ENABLED", fn)


def _no_recipes(fn):
    from jfa_ops.backends.triton import attn_bwd

    return _switched_off(attn_bwd, "RECIPES_ENABLED", fn)


def _below(fn):
    with torch._C._AutoDispatchBelowAutograd():
        return fn()


if __name__ == "__main__":
    main()
