"""Parametrization shared by the suites: every (device, backend) pair the suites run on."""
from typing import List, Tuple
from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from jfa_ops.backends import Problem, available_backends, get_backend

DEVICES = ("cpu", "cuda")

# Backends that run on CPU only through an interpreter: slow, so CPU runs them in a small fp16 smoke subset only.
# fp16, not bf16: the Triton interpreter computes bf16 tl.dot wrongly (a measured interpreter bug on triton 3.6: it
# multiplies bf16 operands as raw uint16), so bf16 results there say nothing about the kernel (the triton backend's
# supports() refuses bf16 on CPU for that reason); fp32 would only add interpreter time.
INTERPRETED_ON_CPU = frozenset({"triton"})


def device_backends(*, smoke: bool = False) -> List[Tuple[str, str, list]]:
    """(device, backend, marks) for every backend available on every device; CUDA ones marked ``gpu``.

    ``smoke=False``: the full suites, which leave out backends interpreted on CPU. ``smoke=True``: includes them.
    """
    out = []
    for device in DEVICES:
        for name in available_backends(device):
            if device == "cpu" and name in INTERPRETED_ON_CPU and not smoke:
                continue
            out.append((device, name, [pytest.mark.gpu] if device == "cuda" else []))
    return out


def device_backend_params(*, smoke: bool = False) -> List:
    """``device_backends`` as pytest.param(device, backend) with ids like ``cpu-reference``."""
    return [pytest.param(d, b, id=f"{d}-{b}", marks=m) for d, b, m in device_backends(smoke=smoke)]


def is_interpreted(device: str, backend: str) -> bool:
    return device == "cpu" and backend in INTERPRETED_ON_CPU


def dtypes_for(device: str, backend: str):
    """The dtypes a (device, backend) runs in the suites: those the backend supports (some fp16 problem probe)."""
    if device == "cpu" and backend in INTERPRETED_ON_CPU:
        return (torch.float16,)  # see INTERPRETED_ON_CPU
    dtypes = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
    return tuple(d for d in dtypes if get_backend(backend).supports(
        Problem(device, d, 64, 2, 2, False, -1, -1, False, False)) is None)


def head_dims_for(device: str, backend: str, wanted=(16,)) -> tuple:
    """The head dims of ``wanted`` that (device, backend) runs, else the smallest it runs: a backend with few head
    dims (tlx: 64, 128, 256) still runs every suite, on a shape it supports, instead of refusing the call (an
    explicit ``backend=`` never reroutes) or filtering out every drawn case."""
    dtype = dtypes_for(device, backend)[-1]

    def runs(d):
        return get_backend(backend).supports(Problem(device, dtype, d, 2, 2, False, -1, -1, False, False)) is None

    return tuple(d for d in wanted if runs(d)) or next((d,) for d in (16, 32, 64, 128, 256) if runs(d))


def deterministic_reason(device: str, backend: str, dtype, head_dim: int):
    """Why (device, backend) declines ``deterministic=True`` (tlx: the triton backend runs it), else None. An
    explicit ``backend=`` never reroutes, so such a backend must refuse the call with a ValueError naming it."""
    return get_backend(backend).supports(Problem(device, dtype, head_dim, 4, 2, False, -1, -1, False, True))


def comparable_launch_values(values, inputs) -> list:
    """Launch arguments comparable across calls (a kept launch against the full path's): the call's inputs by
    identity, fresh buffers by shape/strides/dtype and which of the launch's fresh buffers they are (numbered as
    the launch first passes them: a descriptor over out must be over this launch's Out, not over another buffer of
    out's shape), TMA descriptors by their base and layout."""
    fresh = {}

    def norm(x):
        for n, t in enumerate(inputs):
            if x is t:
                return ("input", n)
        if isinstance(x, torch.Tensor):
            return (x.shape, x.stride(), x.dtype, fresh.setdefault(id(x), len(fresh)))
        if hasattr(x, "block_shape"):  # a TensorDescriptor
            return ("descriptor", norm(x.base), list(x.shape), list(x.strides), list(x.block_shape),
                    getattr(x, "padding", None))
        return x
    return [norm(x) for x in values]


def count_op_calls(monkeypatch, name: str) -> list:
    """``torch.ops.jfa.<name>`` replaced by a wrapper that appends to the returned list on each call (torch's machinery
    looks up the packet's overloads: forwarded to the real op)."""
    calls = []
    real = getattr(torch.ops.jfa, name)

    class Counting:
        def __call__(self, *args, **kwargs):
            calls.append(1)
            return real(*args, **kwargs)

        def __getattr__(self, attr):
            return getattr(real, attr)

    monkeypatch.setattr(torch.ops.jfa, name, Counting())
    return calls


def knob_set(name: str, value):
    """``configs.KNOBS.<name>`` set for the block (hypothesis tests take no function fixtures, so no monkeypatch)."""
    from jfa_ops.backends.triton.configs import KNOBS

    return mock.patch.object(KNOBS, name, value)


class RecordOps(TorchDispatchMode):
    """A dispatch mode that records the name of every op it sees (``.ops``) and runs it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def captured_after_warm_up(call):
    """``call()`` eagerly on a side stream, then captured into a CUDA graph on that same stream (as CUDA graph trees
    warm up and record on one stream): what the warm-up kept per stream (replays, layouts) is what the capture
    meets; on ``torch.cuda.graph``'s own capture stream it would meet nothing. Returns (graph, the captured result)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up torch.cuda.graph wants
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        result = call()
    return graph, result


def coverage_as_on_one_cuda_stream(monkeypatch) -> None:
    """``validation``'s memo of offsets checked on the device, from empty, treating CPU offsets as CUDA ones on one
    stream outside any capture (the memo is CUDA-only: CPU tests of what it covers)."""
    from jfa_ops import validation

    monkeypatch.setattr(validation, "_COVERED", {})
    monkeypatch.setattr(validation, "_on_cuda", lambda offsets: True)
    monkeypatch.setattr(validation, "capturing", lambda device: False)
    monkeypatch.setattr(validation, "stream_key", lambda device: 0)
