"""The triton backend's host path on CPU, with the GPU launches stubbed: Python time per call of each layer.

`PYTHONPATH=$PWD python tools/host_backend_cpu.py [--calls 2000] [--profile] [--backend tlx]`. Runs the CUDA branch of
``launch.launch_planned`` on CPU tensors (as tests/backends/test_launch.py's ``_fake_gpu`` does): the first call of a
plan key "compiles" (a stand-in), later calls go through the plan and stop where ``CompiledKernel.run`` would launch.
Device flags are not asserted (``validation.device_flag`` stubbed). What remains is every line of Python a CUDA call
of the backend runs on the host, so it can be profiled (``--profile``: cProfile, own time) and optimised without a
GPU; tools/host_profile.py gives the real wall time on the H200. Case: the bench's overhead case (B=4, lengths
<= 64, H8, D128, causal, fp16). Times: this thread's CPU time (``time.thread_time``), median of 5 repeats.
"""
from __future__ import annotations

try:  # --backend tlx: the TLX plugin registers before anything imports triton (TLX's site first on PYTHONPATH)
    import _utlx_autoregister  # noqa: F401
except ImportError:
    pass
import argparse
import cProfile
import io
import pstats

import torch
from host_layers import per_call_us  # this script's directory is on sys.path
from host_profile import _NoopAttention, _switched_off

import jfa_ops
from jfa_ops import validation
from jfa_ops.backends.triton import attn_bwd, attn_fwd, launch
from jfa_ops.ops import attention as ops

LENS = (64, 17, 40, 5)
HEADS, HEAD_DIM = 8, 128


def stub_gpu():
    """launch_planned's CUDA branch on CPU tensors; no device asserts."""
    from jfa_ops.backends.triton import configs
    launch.interpreting = lambda: False
    configs.interpreting = lambda: False
    configs._shared_memory_limit = lambda index: 232448  # an H100/H200's opt-in maximum
    configs.INTERPRETER_NUM_SMS = 132  # an H100/H200's SMs (one-wave choices as on the GPU)
    import jfa_ops.backends.triton as triton_backend
    triton_backend._interpreting = lambda: True  # supports(): CPU tensors accepted
    launch._launch_bound = lambda kernel, grid, values, spec, options, device: object()
    launch._run = lambda compiled, grid, values, device: None
    torch.cuda.current_device = lambda: 0
    validation.device_flag = lambda ok, mode: None
    validation.validation_mode = lambda device: "async"  # CPU tensors would be checked in sync mode


def _no_memo(fn):
    return _switched_off(ops, "CALL_CACHE", fn)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime", help="--profile's pstats order (tottime, cumulative, ...)")
    parser.add_argument("--case", default="overhead", choices=("overhead", "large"),
                        help="tlx rows: large = the model suite's large batch (T32768 lognormal, H4; lists built)")
    parser.add_argument("--backend", default="triton", choices=("triton", "tlx"),
                        help="tlx: its forward and backward beside triton's (bf16; TLX on the path)")
    args = parser.parse_args()
    stub_gpu()
    if args.backend == "tlx":
        return tlx_rows(args)
    off = torch.tensor((0,) + LENS).cumsum(0).to(torch.int32)
    t = sum(LENS)
    q, k, v = (torch.randn(t, HEADS, HEAD_DIM, dtype=torch.float16) for _ in range(3))
    params, _ = ops._params(q, k, v, off, off, causal=True)
    import dataclasses
    checked = dataclasses.replace(params, check_offsets=True)
    out, lse = attn_fwd.attention_forward(q, k, v, off, off, checked)
    grad_out = torch.randn_like(q)

    def backward():
        return attn_bwd.attention_backward(grad_out, None, q, k, v, out, lse, off, off, params)

    rows = [
        ("triton attention_forward (checked offsets)", lambda: attn_fwd.attention_forward(q, k, v, off, off, checked)),
        ("triton attention_backward", backward),
        ("  the same without the backward recipe (attn_bwd.RECIPES_ENABLED = False)",
         _switched_off(attn_bwd, "RECIPES_ENABLED", backward)),
        ("jagged_attention no grad (backend triton)", lambda: jfa_ops.jagged_attention(q, k, v, off, off, causal=True,
                                                                                     backend="triton")),
        ("  the same without the call memo (ops.attention.CALL_CACHE = False: A/B)", _no_memo(
            lambda: jfa_ops.jagged_attention(q, k, v, off, off, causal=True, backend="triton"))),
    ]
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def fwd_bwd():
        o = jfa_ops.jagged_attention(qg, kg, vg, off, off, causal=True, backend="triton")
        torch.autograd.grad(o, (qg, kg, vg), grad_out)  # no .grad accumulation: CPU fp16 adds are not host time

    kept = jfa_ops.jagged_attention(qg, kg, vg, off, off, causal=True, backend="triton")
    floor = _NoopAttention.apply(qg, kg, vg, off, off, None, None, None)
    grad_rows = [
        ("forward + backward, inputs require grad (autograd.grad; --calls / 4)", fwd_bwd),
        ("  the same without the backward recipe", _switched_off(attn_bwd, "RECIPES_ENABLED", fwd_bwd)),
        ("  forward alone, inputs require grad (graph dropped: forward + node teardown)",
         lambda: jfa_ops.jagged_attention(qg, kg, vg, off, off, causal=True, backend="triton")),
        ("  backward alone through autograd (kept graph: engine + _DirectAttentionBackward)",
         lambda: torch.autograd.grad(kept, (qg, kg, vg), grad_out, retain_graph=True)),
        ("  torch's floor: a no-op autograd.Function (same inputs, saved tensors), forward + backward",
         lambda: torch.autograd.grad(_NoopAttention.apply(qg, kg, vg, off, off, None, None, None)[0],
                                     (qg, kg, vg), grad_out)),
        ("  torch's floor, backward alone (kept graph)",
         lambda: torch.autograd.grad(floor[0], (qg, kg, vg), grad_out, retain_graph=True)),
    ]
    rows = [(name, fn, args.calls, torch.no_grad) for name, fn in rows]
    rows += [(name, fn, max(args.calls // 4, 100), torch.enable_grad) for name, fn in grad_rows]
    print(f"torch {torch.__version__}; us of CPU time per call (launches stubbed), median of 5 x {args.calls}")
    for name, fn, calls, mode in rows:
        with mode():
            print(f"{per_call_us(fn, calls):9.1f}  {name}")
    if args.profile:
        for name, fn, calls, mode in rows:
            with mode():
                print_profile(name, fn, calls, args.sort)


def tlx_rows(args):
    """The tlx backend's forward and backward beside the triton backend's (bf16, unchecked offsets: the steady state
    of a model's layers once ``validation.covered``), each with its kept launches (replays, recipes) on and off (the
    large case: past one wave, where the full path runs either way). What this leaves out on the GPU: the launcher's work per TMA descriptor (``make_tensordesc_arg``: a
    ``cuTensorMapEncodeTiled`` each; 3 per tlx forward, 5 per tlx backward, none on triton's small-call path)."""
    from jfa_ops.backends import tlx
    from jfa_ops.backends.tlx import attn_fwd as tlx_fwd  # noqa: F401 (imports the TLX kernels)

    lens, heads = LENS, HEADS
    if args.case == "large":  # the model suite's large batch: many tiles a head, so the sorted lists are built
        import sys
        sys.path.insert(0, __file__.rsplit("/tools/", 1)[0])
        from bench import model as bm
        lens, heads = bm.batch_kinds("quick")[1].lengths(0), bm.ModelConfig().num_heads
    off = torch.tensor((0,) + tuple(lens)).cumsum(0).to(torch.int32)
    q, k, v = (torch.randn(sum(lens), heads, HEAD_DIM, dtype=torch.bfloat16) for _ in range(3))
    params, _ = ops._params(q, k, v, off, off, causal=True)
    out, lse = attn_fwd.attention_forward(q, k, v, off, off, params)
    grad_out = torch.randn_like(q)
    no_replays = lambda fn: _switched_off(launch, "REPLAYS_ENABLED", fn)  # noqa: E731
    rows = []
    for name, fwd, bwd in (("triton", attn_fwd.attention_forward, attn_bwd.attention_backward),
                           ("tlx", tlx.forward, tlx.backward)):
        def forward(fwd=fwd):
            return fwd(q, k, v, off, off, params)

        def backward(bwd=bwd):
            return bwd(grad_out, None, q, k, v, out, lse, off, off, params)

        rows += [(f"{name} forward (replay)", forward), ("  the same without replays", no_replays(forward)),
                 (f"{name} backward (recipe)", backward), ("  the same without recipes", no_replays(backward))]
    print(f"torch {torch.__version__}; us of CPU time per call (launches stubbed), median of 5 x {args.calls}")
    with torch.no_grad():
        for name, fn in rows:
            print(f"{per_call_us(fn, args.calls):9.1f}  {name}", flush=True)
        if args.profile:
            for name, fn in rows:
                if not name.startswith("  "):  # the A/B rows' switched-off variants: timed above, not profiled
                    print_profile(name, fn, args.calls, args.sort)


def print_profile(name: str, fn, calls: int, sort: str, lines: int = 22) -> None:
    """cProfile of ``calls`` calls of ``fn``: the ``lines`` functions first by ``sort`` (pstats' key)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats(sort).print_stats(lines)
    print(f"\n=== {name}: {sort}, {calls} calls")
    print("\n".join(line for line in buf.getvalue().splitlines()[6:] if line.strip()))


if __name__ == "__main__":
    main()
