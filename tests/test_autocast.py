"""Autocast: under ``torch.autocast(device, dtype)`` fp32 q/k/v run in the region's dtype, like SDPA: the dense op,
the block-sparse selection and attention, and MXFP8 attention alike (one autocast kernel, ``ops.attention.
register_autocast``)."""
import dataclasses

import pytest
import torch

import jfa_ops
from jfa_ops.testing import (AttentionCase, BlockSparseCase, assert_attention_close, block_sparse_masks,
                             reference_attention, reference_mxfp8_attention, reference_mxfp8_attention_backward,
                             tolerance)
from tests.ops.test_mxfp8 import ATTENTION_CASES as MX_CASES, _oracle_opts, make_case as make_mx_case


def _inputs(device):
    return AttentionCase((3, 0, 5), (4, 2, 6), heads_q=4, heads_kv=2, causal=True, device=device,
                         dtype=torch.float32).make_inputs(0, requires_grad=True)


def _check_autocast(device, dtype, backend):
    inputs = _inputs(device)
    dense = inputs.q[:4].detach()[None].transpose(1, 2)  # [1, H, L, D]
    with torch.autocast(device, dtype=dtype):
        sdpa_dtype = torch.nn.functional.scaled_dot_product_attention(dense, dense, dense).dtype
        out, lse = jfa_ops.jagged_attention(inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets,
                                            causal=True, return_lse=True, backend=backend)
    assert sdpa_dtype == dtype  # the behaviour to match
    assert out.dtype == dtype and lse.dtype == torch.float32
    # the oracle on the inputs rounded to the autocast dtype, as the op saw them
    ref_out, ref_lse = reference_attention(*(t.detach().to(dtype) for t in (inputs.q, inputs.k, inputs.v)),
                                           inputs.q_offsets, inputs.kv_offsets, causal=True)
    assert_attention_close(out, ref_out, dtype=dtype, kind="forward", name="out")
    out.float().sum().backward()  # gradients reach the fp32 leaves in fp32
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in (inputs.q, inputs.k, inputs.v))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_autocast_casts_to_the_region_dtype(dtype):
    _check_autocast("cpu", dtype, "reference")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_autocast_casts_to_the_region_dtype(dtype):
    _check_autocast("cuda", dtype, None)


def test_fp64_and_disabled_regions_are_left_alone():
    inputs = AttentionCase((3, 4), (5, 2), dtype=torch.float64).make_inputs(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert inputs.call("reference")[0].dtype == torch.float64  # autocast never touches fp64
    inputs = _inputs("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert inputs.call("reference")[0].dtype == torch.float32


def test_compiled_autocast_region():
    inputs = _inputs("cpu")

    def fn(q, k, v):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return jfa_ops.jagged_attention(q, k, v, inputs.q_offsets, inputs.kv_offsets, causal=True)

    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(inputs.q, inputs.k, inputs.v)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, fn(inputs.q, inputs.k, inputs.v))


# ------------------------------------------------------------------------ block-sparse and MXFP8 under autocast
# Relative error norms against the float64 oracle of the inputs cast to the region's dtype (what the op saw), CPU
# backends (reference; triton under the interpreter in fp16), measured over 4 seeds x 2 cases (bench/NOTES.md
# "Autocast for every attention op, helper api40"). (out, gradients), per region dtype: the output's rounding to the
# region's dtype, and gradients computed on the cast inputs. lse is float32 from fp32 scores of the cast inputs:
# measured <= 6e-8 (against the oracle of the uncast fp32 inputs it is 1e-3..2e-3, so it tells which inputs the op
# saw). On the GPU the kernels' own rounding adds more: the suite's tolerances (``jfa_ops.testing.tolerance``).
SPARSE_TOLERANCES = {torch.bfloat16: (2.5e-3, 4e-3),  # measured <= 1.8e-3 / 3.1e-3
                     torch.float16: (4e-4, 6e-4)}  # measured <= 2.6e-4 / 4.3e-4 (reference and triton)
MX_TOLERANCES = {torch.bfloat16: (2.5e-3, 2.5e-3),  # measured <= 1.7e-3 / 1.7e-3 (against the fp32 inputs' MXFP8
                 torch.float16: (3e-4, 3e-4)}  # oracle: 3e-2 / 1e-2); measured <= 2.1e-4 / 2.1e-4
CPU_LSE_TOLERANCE = 5e-7
# The GPU's MXFP8 kernels against the MXFP8 oracle: the bounds of tests/backends/test_tlx_mxfp8.py (out 1e-2, lse 1e-4)
# and test_tlx_mxfp8_bwd.py (gradients 2e-2).
MX_GPU_TOLERANCES = (1e-2, 2e-2, 1e-4)


def _rel(actual, expected) -> float:
    """Relative error norm over the oracle's finite entries; infinities (lse -inf) must sit where the oracle's do."""
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    assert torch.equal(torch.isinf(a), torch.isinf(e)) and not a.isnan().any()
    finite = torch.isfinite(e)
    return ((a - e)[finite].norm() / e[finite].norm().clamp_min(1e-300)).item()


def _tolerances(device, dtype, table, gpu=None):
    """(out, gradients, lse) tolerances: ``table``'s on CPU; ``gpu`` (else the suite's) on CUDA."""
    if device == "cpu":
        return (*table[dtype], CPU_LSE_TOLERANCE)
    return gpu or (tolerance(dtype, "forward"), tolerance(dtype, "grad"), tolerance(dtype, "lse"))


SPARSE_CASES = {  # block 4 (reference); the triton backend's blocks are >= 16, so its lengths are 4x
    "jagged_gqa_causal": dict(q=(9, 0, 1, 13), kv=(11, 0, 1, 13), heads_q=4, heads_kv=2, causal=True),
    "broadcast_q": dict(q=(6,), kv=(9, 0, 17), broadcast_q=True, heads_q=2, heads_kv=1),
}


def _sparse_case(name, device, block=4):
    case = dict(SPARSE_CASES[name])
    q, kv = (tuple(n * block // 4 for n in case.pop(key)) for key in ("q", "kv"))
    attention = AttentionCase(q, kv, dtype=torch.float32, device=device, **case)
    return BlockSparseCase(attention, block_q=block, block_kv=block, keep_ratio=0.5)


def check_block_sparse_autocast(case: BlockSparseCase, dtype, backend=None, *, seed=0):
    """Under ``torch.autocast(device, dtype)`` with fp32 leaves: the selection is the oracle's on the cast q, k
    (exactly); out is ``dtype`` and matches the float64 oracle of the cast q, k, v under that selection, lse float32;
    gradients through the region reach the leaves in fp32 and match the oracle's."""
    c, device = case.case, case.case.device
    inputs = c.make_inputs(seed, requires_grad=True)
    kw = inputs.kwargs
    with torch.autocast(device, dtype=dtype):
        index, count = case.select(inputs, backend)
        out, lse = jfa_ops.block_sparse_attention(
            inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets, index, count, *case.max_seqlens(),
            block_q=case.block_q, block_kv=case.block_kv, causal=c.causal, broadcast_q=c.broadcast_q,
            return_lse=True, backend=backend)
    cast = [t.detach().to(dtype) for t in (inputs.q, inputs.k, inputs.v)]  # the inputs as the ops saw them
    want_index, want_count = case.oracle_selection(dataclasses.replace(inputs, q=cast[0], k=cast[1], v=cast[2]))
    assert torch.equal(index.cpu(), want_index) and torch.equal(count.cpu(), want_count)
    assert out.dtype == dtype and lse.dtype == torch.float32
    masks = block_sparse_masks(index, count, inputs.q_offsets, inputs.kv_offsets, block_q=case.block_q,
                               block_kv=case.block_kv, broadcast_q=c.broadcast_q, q_rows=inputs.q.shape[0])
    primals64 = [t.cpu().double().requires_grad_() for t in cast]
    want_out, want_lse = reference_attention(*primals64, inputs.q_offsets.cpu() if inputs.q_offsets is not None
                                             else None, inputs.kv_offsets.cpu(), causal=c.causal,
                                             broadcast_q=c.broadcast_q, block_masks=masks)
    out_tol, grad_tol, lse_tol = _tolerances(device, dtype, SPARSE_TOLERANCES)
    assert _rel(out, want_out) <= out_tol, _rel(out, want_out)
    assert _rel(lse, want_lse) <= lse_tol, _rel(lse, want_lse)
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grad_lse = torch.where(torch.isfinite(want_lse.detach()), torch.randn(lse.shape, generator=g, dtype=torch.float64),
                           0)  # -inf rows: no lse gradient
    grads = torch.autograd.grad((out, lse), (inputs.q, inputs.k, inputs.v),
                                (grad_out.to(out), grad_lse.to(device=lse.device, dtype=lse.dtype)))
    want = torch.autograd.grad((want_out, want_lse), primals64, (grad_out, grad_lse), allow_unused=True)
    for name, got, w in zip(("dq", "dk", "dv"), grads, want):
        assert got.dtype == torch.float32
        assert _rel(got, w) <= grad_tol, f"{name}: {_rel(got, w)}"


@pytest.mark.parametrize("name", SPARSE_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_block_sparse_autocast_casts_to_the_region_dtype(name, dtype):
    # seed 1's jagged case: the fp32 inputs' selection differs from the cast inputs' (one block of one row), so the
    # exact selection check tells which the scoring saw
    check_block_sparse_autocast(_sparse_case(name, "cpu"), dtype, "reference", seed=1)


def test_block_sparse_autocast_triton_interpreter():
    """The triton kernels under the interpreter: fp16 regions only (its bf16 tl.dot is wrong, tests/common.py)."""
    check_block_sparse_autocast(_sparse_case("jagged_gqa_causal", "cpu", block=16), torch.float16, "triton")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", SPARSE_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_block_sparse_autocast(name, dtype):
    """The automatic backend (tlx on sm_90, else triton: bf16/fp16 only for tlx, so fp32 leaves now reach it)."""
    check_block_sparse_autocast(_sparse_case(name, "cuda", block=64), dtype, seed=1)


def test_sparse_attention_under_autocast_is_the_call_on_cast_inputs():
    """One region: ``sparse_attention`` of fp32 leaves gives bit for bit the call on q, k, v cast first (selection
    and attention alike), and fp32 gradients."""
    case = _sparse_case("jagged_gqa_causal", "cpu")
    inputs = case.case.make_inputs(1, requires_grad=True)
    kw = dict(block_q=4, block_kv=4, causal=True, backend="reference")

    def call(q, k, v):
        return jfa_ops.sparse_attention(q, k, v, inputs.q_offsets, inputs.kv_offsets, *case.max_seqlens(), **kw)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = call(inputs.q, inputs.k, inputs.v)
    assert out.dtype == torch.bfloat16 and torch.equal(out, call(*(t.bfloat16() for t in (inputs.q, inputs.k,
                                                                                              inputs.v))))
    out.float().sum().backward()
    assert all(t.grad.dtype == torch.float32 and t.grad.abs().sum() > 0 for t in (inputs.q, inputs.k, inputs.v))


def check_mxfp8_autocast(name, device, dtype, backend=None, *, seed=3):
    """Under ``torch.autocast(device, dtype)`` with fp32 leaves: out is ``dtype`` and matches the float64 MXFP8
    oracle of the cast q, k, v (quantized from them), lse float32; gradients through the region reach the leaves in
    fp32 and match the MXFP8 backward oracle of the cast inputs."""
    q, k, v, q_off, kv_off, opts = make_mx_case(**MX_CASES[name], seed=seed)
    q, k, v = (t.to(device).requires_grad_() for t in (q, k, v))
    q_off, kv_off = (None if t is None else t.to(device) for t in (q_off, kv_off))
    with torch.autocast(device, dtype=dtype):
        out, lse = jfa_ops.mxfp8_attention(q, k, v, q_off, kv_off, return_lse=True, backend=backend, **opts)
    assert out.dtype == dtype and lse.dtype == torch.float32
    cast = [t.detach().to(dtype).cpu() for t in (q, k, v)]
    q_off, kv_off = (None if t is None else t.cpu() for t in (q_off, kv_off))
    want_out, want_lse = reference_mxfp8_attention(*cast, q_off, kv_off, **_oracle_opts(opts))
    out_tol, grad_tol, lse_tol = _tolerances(device, dtype, MX_TOLERANCES, MX_GPU_TOLERANCES)
    assert _rel(out, want_out) <= out_tol, _rel(out, want_out)
    assert _rel(lse, want_lse) <= lse_tol, _rel(lse, want_lse)
    g = torch.Generator().manual_seed(4)
    grad_out, grad_lse = torch.randn(out.shape, generator=g).to(dtype), torch.randn(lse.shape, generator=g)
    grads = torch.autograd.grad((out, lse), (q, k, v), (grad_out.to(device), grad_lse.to(device)))
    want = reference_mxfp8_attention_backward(grad_out, grad_lse, *cast, out.cpu(), lse.cpu(), q_off, kv_off,
                                              **_oracle_opts(opts))
    for name_, got, w in zip("qkv", grads, want):
        assert got.dtype == torch.float32
        assert _rel(got, w) <= grad_tol, f"d{name_}: {_rel(got, w)}"


@pytest.mark.parametrize("name", ["causal_gqa", "broadcast_q"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mxfp8_autocast_casts_to_the_region_dtype(name, dtype):
    check_mxfp8_autocast(name, "cpu", dtype, "reference")


def test_mxfp8_autocast_triton_interpreter():
    check_mxfp8_autocast("causal_gqa", "cpu", torch.float16, "triton")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["causal_gqa", "broadcast_q"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_mxfp8_autocast(name, dtype):
    check_mxfp8_autocast(name, "cuda", dtype)


def test_mxfp8_under_autocast_is_the_call_on_cast_inputs():
    """The contract of jagged_attention: autocast is the call on inputs cast first (bit for bit), pre-quantized
    inputs untouched (float8 in, ``out_dtype`` as given)."""
    q, k, v, q_off, kv_off, opts = make_mx_case(**MX_CASES["causal_gqa"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = jfa_ops.mxfp8_attention(q, k, v, q_off, kv_off, **opts)
        pairs = (jfa_ops.mxfp8_quantize(q), jfa_ops.mxfp8_quantize(k), jfa_ops.mxfp8_quantize(v, kv_off, block=(32, 1)))
        assert pairs[0][0].dtype == torch.float8_e4m3fn
        quantized = jfa_ops.mxfp8_attention(*pairs, q_off, kv_off, out_dtype=torch.float16, **opts)
    assert torch.equal(out, jfa_ops.mxfp8_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), q_off, kv_off, **opts))
    assert quantized.dtype == torch.float16
    assert torch.equal(quantized, jfa_ops.mxfp8_attention(*pairs, q_off, kv_off, out_dtype=torch.float16, **opts))


def test_fp64_left_alone_by_every_op():
    """Autocast never touches fp64 (as for SDPA): the block-sparse ops compute and return fp64; MXFP8 refuses fp64
    inside a region as outside."""
    case = BlockSparseCase(AttentionCase((9, 5), (11, 6), heads_q=2, heads_kv=1, causal=True, dtype=torch.float64),
                           block_q=4, block_kv=4)
    inputs = case.case.make_inputs(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        index, count = case.select(inputs, "reference")
        out = jfa_ops.sparse_attention(inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets,
                                       *case.max_seqlens(), block_q=4, block_kv=4, causal=True, backend="reference")
        with pytest.raises(TypeError, match="float16"):
            jfa_ops.mxfp8_attention(*(torch.randn(4, 1, 32, dtype=torch.float64) for _ in range(3)),
                                    torch.tensor([0, 4]), torch.tensor([0, 4]))
    assert out.dtype == torch.float64
    assert torch.equal(index, case.oracle_selection(inputs)[0])
    assert torch.equal(out, jfa_ops.sparse_attention(inputs.q, inputs.k, inputs.v, inputs.q_offsets,
                                                     inputs.kv_offsets, *case.max_seqlens(), block_q=4, block_kv=4,
                                                     causal=True, backend="reference"))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_refused_inside_a_region_as_outside(dtype):
    """float8 q/k/v (e.g. a pre-quantized pair's data without its scale) are refused with the same TypeError inside a
    region as outside, by every op the autocast kernel serves: the region casts only fp32/fp16/bf16 (casting float8
    to bf16 ran MXFP8 attention on unscaled data, silently; helper review41)."""
    case = BlockSparseCase(AttentionCase((9, 5), (11, 6), heads_q=2, heads_kv=1, head_dim=32, causal=True),
                           block_q=4, block_kv=4)
    x = case.case.make_inputs(0)
    q, k, v = (t.to(dtype) for t in (x.q, x.k, x.v))
    calls = {
        "jagged_attention": lambda: jfa_ops.jagged_attention(q, k, v, x.q_offsets, x.kv_offsets, causal=True,
                                                             backend="reference"),
        "sparse_attention": lambda: jfa_ops.sparse_attention(q, k, v, x.q_offsets, x.kv_offsets, *case.max_seqlens(),
                                                             block_q=4, block_kv=4, causal=True,
                                                             backend="reference"),
        "mxfp8_attention": lambda: jfa_ops.mxfp8_attention(q, k, v, x.q_offsets, x.kv_offsets, causal=True,
                                                           backend="reference"),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match="float16") as outside:
            call()
        with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TypeError, match="float16") as inside:
            call()
        assert str(inside.value) == str(outside.value), name


def test_compiled_autocast_region_of_every_op():
    """fullgraph (no graph break) under an autocast region: select + sparse attention and MXFP8 attention in the
    region's dtype, equal to eager, gradients to the fp32 leaves."""
    case = _sparse_case("jagged_gqa_causal", "cpu")
    inputs = case.case.make_inputs(1, requires_grad=True)
    mx_q, mx_k, mx_v, mx_q_off, mx_kv_off, mx_opts = make_mx_case(**MX_CASES["causal_gqa"])
    mx = [t.requires_grad_() for t in (mx_q, mx_k, mx_v)]

    def fn(q, k, v, mq, mk, mv):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            sparse = jfa_ops.sparse_attention(q, k, v, inputs.q_offsets, inputs.kv_offsets, *case.max_seqlens(),
                                              block_q=4, block_kv=4, causal=True, backend="reference")
            mxfp8 = jfa_ops.mxfp8_attention(mq, mk, mv, mx_q_off, mx_kv_off, backend="reference", **mx_opts)
        return sparse, mxfp8

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    args = (inputs.q, inputs.k, inputs.v, *mx)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    eager = fn(*args)
    assert not torch._dynamo.utils.counters["graph_break"]
    for got, want in zip(compiled, eager):
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    grads = torch.autograd.grad(sum(t.float().sum() for t in compiled), args)
    assert all(g.dtype == torch.float32 for g in grads)
    for got, want in zip(grads, torch.autograd.grad(sum(t.float().sum() for t in eager), args)):
        torch.testing.assert_close(got, want)  # the same kernels eagerly


# The backward ops have no autocast kernel (autograd hands them what the forward saved); when one runs inside a
# region (a backward called there, on tensors of a forward outside it), the reference backend still computes at its
# own precision (``backends.reference.exact``: its fp32 einsums ran in bf16 before, ~2e-2 against the float64 oracle).
@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_reference_block_sparse_backward_exact_inside_a_region(device):
    case = _sparse_case("jagged_gqa_causal", device)
    inputs = case.case.make_inputs(3, requires_grad=True)
    index, count = case.select(inputs, "reference")
    out, lse = jfa_ops.block_sparse_attention(inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets,
                                              index, count, *case.max_seqlens(), block_q=4, block_kv=4, causal=True,
                                              return_lse=True, backend="reference")
    masks = block_sparse_masks(index, count, inputs.q_offsets, inputs.kv_offsets, block_q=4, block_kv=4)
    primals64 = [t.detach().cpu().double().requires_grad_() for t in (inputs.q, inputs.k, inputs.v)]
    want_out, want_lse = reference_attention(*primals64, inputs.q_offsets.cpu(), inputs.kv_offsets.cpu(),
                                             causal=True, block_masks=masks)
    g = torch.Generator().manual_seed(4)
    grad_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grad_lse = torch.where(torch.isfinite(want_lse.detach()), torch.randn(lse.shape, generator=g, dtype=torch.float64),
                           0)
    with torch.autocast(device, dtype=torch.bfloat16):
        grads = torch.autograd.grad((out, lse), (inputs.q, inputs.k, inputs.v),
                                    (grad_out.to(out), grad_lse.to(lse)))
    want = torch.autograd.grad((want_out, want_lse), primals64, (grad_out, grad_lse))
    for name, got, w in zip(("dq", "dk", "dv"), grads, want):
        assert_attention_close(got, w, dtype=torch.float32, kind="grad", name=name)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_reference_mxfp8_backward_exact_inside_a_region(device):
    q, k, v, q_off, kv_off, opts = make_mx_case(**MX_CASES["causal_gqa"], seed=3)
    q, k, v = (t.to(device).requires_grad_() for t in (q, k, v))
    q_off, kv_off = q_off.to(device), kv_off.to(device)
    out, lse = jfa_ops.mxfp8_attention(q, k, v, q_off, kv_off, return_lse=True, backend="reference", **opts)
    g = torch.Generator().manual_seed(4)
    grad_out, grad_lse = (torch.randn(t.shape, generator=g).to(device) for t in (out, lse))
    with torch.autocast(device, dtype=torch.bfloat16):
        grads = torch.autograd.grad((out, lse), (q, k, v), (grad_out, grad_lse))
    want = reference_mxfp8_attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_off, kv_off,
                                              **_oracle_opts(opts))
    for name, got, w in zip("qkv", grads, want):
        assert got.dtype == torch.float32
        assert _rel(got, w) <= 1e-5, f"d{name}: {_rel(got, w)}"  # the fp32 bound of tests/ops/test_mxfp8.py
