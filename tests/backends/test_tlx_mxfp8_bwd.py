"""The TLX MXFP8 backward, design (D) (``tlx/mxfp8_attn_bwd.py``, on by default, env JFA_TLX_MXFP8_BWD=0: off;
bench/NOTES.md "MXFP8 backward design (D), helper mxbwdd, stop 27" and v19).

CPU (the interpreter): the host side (``jfa_ops.backends.mxfp8_bwd``) makes the MX-valued bf16 operands bit for bit
as the reference's quantize + dequantize, and with a float64 stand-in for the kernel (the kernel's arithmetic:
``mxfp8_attention_backward_model`` fed the MX-valued operands it receives and the delta of the dO its pre-pass
reads) it gives the model's gradients on every feature case: block shapes, sequence grids, broadcast Q's grids and
the unquantized dO of delta are what the model says. The kernel's constexpr compiles for sm_90:
``test_tlx_compile.py::test_mxfp8_backward_kernels_compile_within_the_ablation_budget``.

GPU (``-m gpu``): the kernel itself against the model and the float64 MXFP8 oracle, the issue's bound, the routing of
the knob and of what it declines; the one-pass operands (``KNOBS.mxfp8_bwd_one_pass``) bit for bit at size
(the default since the H200 run of 2026-12-03; ``JFA_MXFP8_BWD_ONE_PASS=0`` runs the kernel tests through the two
passes).
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import jfa_ops
from jfa_ops.testing import (mx_round_trip_spec, mxfp8_attention_backward_model, reference_attention,
                             reference_mxfp8_attention_backward)
from tests.common import knob_set
from tests.ops.test_mxfp8 import ATTENTION_CASES, _oracle_opts, _rel, make_case, quantize_inputs, wide_range_values

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from jfa_ops.backends import mxfp8_bwd  # noqa: E402
from jfa_ops.backends.triton.common import stage_bounds  # noqa: E402
from jfa_ops.backends.base import AttentionParams  # noqa: E402
from jfa_ops.backends.reference import mxfp8 as reference  # noqa: E402
from jfa_ops.backends.triton.configs import KNOBS  # noqa: E402


def _same_bits(a, b):
    return bool(((a.view(torch.int16) == b.view(torch.int16)) | (a.isnan() & b.isnan())).all())


ONE_PASS = pytest.mark.parametrize("one_pass", [False, True], ids=["two-pass", "one-pass"])


def one_pass_knob(on: bool):
    """``KNOBS.mxfp8_bwd_one_pass`` set for the block."""
    return knob_set("mxfp8_bwd_one_pass", on)


@ONE_PASS
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_mx_values_bit_exact_with_the_reference(dtype, one_pass):
    """``mx_values`` (triton quantize + the dequantize pass; one-pass: ``quantize_values``, the quantize kernel
    writing the values) == the reference's quantize + dequantize to bf16, bit for bit: (1, 32) and (32, 32) blocks,
    per-sequence row blocks (empty and length-1 sequences), one sequence, a NaN block, zero blocks, magnitudes over
    2**+-12 (bf16 and fp32: 2**+-60)."""
    g = torch.Generator().manual_seed(1)
    spread = 12 if dtype == torch.float16 else 60
    x = torch.randn(150, 3, 64, generator=g) * torch.pow(2.0, torch.empty(150, 1, 64).uniform_(-spread, spread,
                                                                                                generator=g))
    x[5, 1, 3] = math.nan
    x[64:96] = 0.0
    x = x.to(dtype)
    offsets = torch.tensor([0, 40, 40, 105, 106, 150])
    for block, offs in (((1, 32), None), ((32, 32), offsets), ((32, 32), None)):
        with one_pass_knob(one_pass):
            got = mxfp8_bwd.mx_values(x, offs, block, "rceil")
        want = reference.dequantize(*reference.quantize(x, offs, block, "rceil"), offs, block, torch.bfloat16)
        assert got.dtype == torch.bfloat16 and _same_bits(got, want), (block, offs)
        assert torch.equal(got.double().isnan(), mx_round_trip_spec(x, offs, block).isnan())


@st.composite
def _values_inputs(draw):
    """``quantize_inputs``' tensors (jagged lengths with empty and short sequences, fp32/bf16/fp16, magnitudes up
    to 2**+-140, specials, zero rows, both roundings) in the backward's block shapes: (32, 1) drawn as (1, 32) (V);
    (32, 32) per sequence or, as broadcast Q, one sequence; values in bf16 or fp16."""
    x, offsets, block, rounding = draw(quantize_inputs())
    block = (1, 32) if block == (32, 1) else block
    if block == (1, 32) or draw(st.booleans()):
        offsets = None
    return x, offsets, block, rounding, draw(st.sampled_from([torch.bfloat16, torch.float16]))


@settings(max_examples=25, deadline=None)
@given(inputs=_values_inputs())
def test_one_pass_mx_values_bit_exact_with_two_passes_and_the_reference(inputs):
    """``quantize_values`` (one pass: x read once, the values written) == ``mx_values``' two passes (the pair, then
    the dequantize pass) == the reference's quantize + dequantize (plain PyTorch), bit for bit."""
    from jfa_ops.backends.triton.mxfp8_quantize import quantize_values

    x, offsets, block, rounding, dtype = inputs
    got = quantize_values(x, offsets, block, rounding, dtype)
    two = mxfp8_bwd.mx_values(x, offsets, block, rounding, dtype, one_pass=False)
    want = reference.dequantize(*reference.quantize(x, offsets, block, rounding), offsets, block, dtype)
    assert got.dtype == dtype and got.shape == x.shape
    assert _same_bits(got, two) and _same_bits(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_one_pass_mx_values_bit_exact_on_the_gpu_at_size(dtype, rounding):
    """On the GPU (the hardware E4M3 conversion, pipelined loads): ``quantize_values`` == the two passes == the
    reference's quantize + dequantize (on CPU), bit for bit, at 1M elements a tensor: (1, 32); (32, 32) per sequence
    (an empty sequence, length 1, tails) and as one sequence; the dtype's range and the special values."""
    from jfa_ops.backends.triton.mxfp8_quantize import quantize_values

    lengths = [500, 0, 33, 1, 1023, 5, 486]
    x = wide_range_values(lengths, dtype).to(dtype)
    offsets = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    for block, offs in (((1, 32), None), ((32, 32), offsets), ((32, 32), None)):
        dev_offs = None if offs is None else offs.cuda()
        got = quantize_values(x.cuda(), dev_offs, block, rounding).cpu()
        two = mxfp8_bwd.mx_values(x.cuda(), dev_offs, block, rounding, one_pass=False).cpu()
        want = reference.dequantize(*reference.quantize(x, offs, block, rounding), offs, block, torch.bfloat16)
        assert _same_bits(got, two) and _same_bits(got, want), (block, offs is None)


def test_one_pass_knob_skips_the_pair(monkeypatch):
    """KNOBS.mxfp8_bwd_one_pass on: ``operands`` makes all four tensors without the pair (the quantize it would
    call raises), bit for bit the two-pass operands."""
    q, k, v, q_off, kv_off, opts = make_case(**ATTENTION_CASES["jagged"], seed=3, dtype=torch.bfloat16)
    params = _params(q, opts, q_off, kv_off)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with one_pass_knob(False):
        want = mxfp8_bwd.operands(grad_out, q, k, v, q_off, kv_off, params, "rceil")

    def no_pair(*args):
        raise AssertionError("the pair was made")

    monkeypatch.setattr(mxfp8_bwd, "quantize", no_pair)
    with one_pass_knob(True):
        got = mxfp8_bwd.operands(grad_out, q, k, v, q_off, kv_off, params, "rceil")
    assert all(_same_bits(a, b) for a, b in zip(got, want))


@ONE_PASS
def test_operands_read_nonfinite_dO_on_rows_without_keys_as_zero(one_pass):
    """``operands(..., empty_rows_lse=lse)`` (the tlx MXFP8 backward's host side, ``ops.mxfp8.MXFP8_BWD_EMPTY_ROWS``
    on): dO's MX values bit for bit those of dO with its NaN/inf elements on rows whose lse is -inf set to 0, in
    dO's own pass (one or two); q, k, v untouched; without it, the NaN spreads over those rows' 32 x 32 blocks."""
    q, k, v, q_off, kv_off, opts = make_case(**ATTENTION_CASES["jagged"], seed=3, dtype=torch.bfloat16)
    params = _params(q, opts, q_off, kv_off)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    lse = torch.randn(q.shape[1], q.shape[0])
    lse[:, 3:9] = -math.inf
    grad_out[3:9, :, 1] = math.nan
    grad_out[5, 0, 2] = 1e4  # finite on a row without keys: kept
    zeroed = reference.finite_grad_out_of_rows_without_keys(grad_out, lse)
    with one_pass_knob(one_pass):
        want = mxfp8_bwd.operands(zeroed, q, k, v, q_off, kv_off, params, "rceil")
        got = mxfp8_bwd.operands(grad_out, q, k, v, q_off, kv_off, params, "rceil", empty_rows_lse=lse)
        plain = mxfp8_bwd.operands(grad_out, q, k, v, q_off, kv_off, params, "rceil")
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, want))
    assert got[3].isfinite().all() and plain[3].isnan().any()


def _params(q, opts, q_off, kv_off):
    lengths = kv_off.diff().tolist()
    q_lengths = [q.shape[0]] if opts["broadcast_q"] else q_off.diff().tolist()
    left, right = opts["window"]
    return AttentionParams(scale=opts.get("scale", q.shape[-1] ** -0.5), causal=opts["causal"], window_left=left,
                           window_right=right, broadcast_q=opts["broadcast_q"], max_seqlen_q=max(q_lengths),
                           max_seqlen_kv=max(lengths))


def _stand_in(calls, opts):
    """A float64 stand-in for the TLX kernel with MXFP8 (``attn_bwd.attention_backward(..., mxfp8=True,
    delta_grad_out=...)``): the model fed the MX-valued operands it receives (their round trip is the identity in
    the same blocks), with grad_lse shifted so that its delta is that of ``delta_grad_out`` (the pre-pass's), bf16
    gradients as the kernel writes them."""
    def run(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params, delta_grad_out):
        calls.append(dict(grad_out=grad_out, q=q, k=k, v=v, delta_grad_out=delta_grad_out))
        delta = torch.einsum("ihd,ihd->hi", delta_grad_out.double(), out.double())
        if grad_lse is not None:
            delta = delta - grad_lse.double()
        shifted = torch.einsum("ihd,ihd->hi", grad_out.double(), out.double()) - delta
        grads = mxfp8_attention_backward_model(grad_out, shifted, q, k, v, out, lse, q_offsets, kv_offsets,
                                               rebased_s_dp=False, **_oracle_opts(opts))
        return tuple(g.to(torch.bfloat16) for g in grads)
    return run


@ONE_PASS
@pytest.mark.parametrize("name", list(ATTENTION_CASES))
@pytest.mark.parametrize("spread", [None, 12])
def test_host_path_with_a_stand_in_kernel_gives_the_model(name, spread, one_pass, monkeypatch):
    """``mxfp8_bwd.backward`` (what the tlx backend runs with JFA_TLX_MXFP8_BWD=1) with the float64 stand-in kernel:
    the kernel receives Q, K, dO as their (32, 32) MX values (Q per q sequence or, broadcast, one sequence; dO per
    output sequence; K per kv sequence) and V as its (1, 32) values, all bf16, and the caller's dO for delta; the
    gradients equal ``mxfp8_attention_backward_model(rebased_s_dp=False)`` on the original inputs (up to the bf16
    output rounding) in the inputs' dtype. bf16 inputs, N(0, 1) and 2**+-12 per row and column."""
    q, k, v, q_off, kv_off, opts = make_case(**ATTENTION_CASES[name], seed=3, spread=spread, dtype=torch.bfloat16)
    out, lse = jfa_ops.mxfp8_attention(q, k, v, q_off, kv_off, return_lse=True, backend="reference", **opts)
    g = torch.Generator().manual_seed(4)
    grad_out = torch.randn(out.shape, generator=g).to(torch.bfloat16)
    grad_lse = torch.randn(lse.shape, generator=g)
    calls = []
    monkeypatch.setattr(KNOBS, "mxfp8_bwd_one_pass", one_pass)  # on: the operands in one pass each
    got = mxfp8_bwd.backward(_stand_in(calls, opts), grad_out, grad_lse, q, k, v, out, lse, q_off, kv_off,
                             _params(q, opts, q_off, kv_off), "rceil")
    (seen,) = calls
    out_grid = (torch.arange(len(kv_off)) * q.shape[0]) if opts["broadcast_q"] else q_off
    for key, x, offs, block in (("q", q, None if opts["broadcast_q"] else q_off, (32, 32)),
                                ("k", k, kv_off, (32, 32)), ("v", v, None, (1, 32)),
                                ("grad_out", grad_out, out_grid, (32, 32))):
        assert seen[key].dtype == torch.bfloat16
        assert torch.equal(seen[key].double(), mx_round_trip_spec(x, offs, block)), key
    assert seen["delta_grad_out"] is grad_out
    want = mxfp8_attention_backward_model(grad_out, grad_lse, q, k, v, out, lse, q_off, kv_off, rebased_s_dp=False,
                                          **_oracle_opts(opts))
    for name_, a, w in zip("qkv", got, want):
        assert a.dtype == torch.bfloat16
        assert _rel(a, w) <= 4e-3, f"d{name_}: {_rel(a, w)}"  # bf16 outputs: ~2e-3


@ONE_PASS
def test_host_path_fp16_inputs_and_no_grad_lse(one_pass, monkeypatch):
    """fp16 inputs (their MX values are exact in bf16) and grad_lse None: gradients in fp16, the model's."""
    monkeypatch.setattr(KNOBS, "mxfp8_bwd_one_pass", one_pass)
    q, k, v, q_off, kv_off, opts = make_case(**ATTENTION_CASES["causal_gqa"], seed=5, dtype=torch.float16)
    out, lse = jfa_ops.mxfp8_attention(q, k, v, q_off, kv_off, return_lse=True, backend="reference", **opts)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(6)).to(torch.float16)
    got = mxfp8_bwd.backward(_stand_in([], opts), grad_out, None, q, k, v, out, lse, q_off, kv_off,
                             _params(q, opts, q_off, kv_off), "rceil")
    want = mxfp8_attention_backward_model(grad_out, None, q, k, v, out, lse, q_off, kv_off, rebased_s_dp=False,
                                          **_oracle_opts(opts))
    for a, w in zip(got, want):
        assert a.dtype == torch.float16 and _rel(a, w) <= 4e-3, _rel(a, w)


@triton.jit
def _bounds_kernel(OUT, s0, len_s, len_o, lo_off, hi_off, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,
                   BLOCK_S: tl.constexpr, BLOCK_O: tl.constexpr):
    """The TLX backward's ``common.stage_bounds`` (what its work items walk), its six values into OUT."""
    a, b, c, d, e, f = stage_bounds(s0, len_s, len_o, lo_off, hi_off, HAS_LO, HAS_HI, BLOCK_S, BLOCK_O)
    tl.store(OUT + 0, a)
    tl.store(OUT + 1, b)
    tl.store(OUT + 2, c)
    tl.store(OUT + 3, d)
    tl.store(OUT + 4, e)
    tl.store(OUT + 5, f)


def _stage_bounds(n0, len_k, len_q, causal, window, block_n=128, block_m=64):
    """(lead_begin, lead_end, bulk_begin, bulk_end, tail_begin, tail_end) of the key tile at n0, from
    ``common.stage_bounds`` run in a one-program kernel (the interpreter), with the kernel's arguments
    (``attn_bwd._bwd_item``: -right, window_left, HAS_RIGHT, HAS_LEFT)."""
    from jfa_ops.backends.triton.common import window_bounds

    has_left, window_left, has_right, right = window_bounds(causal, *window)
    out = torch.zeros(6, dtype=torch.int32)
    _bounds_kernel[(1,)](out, n0, len_k, len_q, -right, window_left, HAS_LO=has_right, HAS_HI=has_left,
                         BLOCK_S=block_n, BLOCK_O=block_m)
    return out.tolist()


def _block_walk(q, k, v, grad_out, out, lse, grad_lse, causal, window, straddle_masked=True):
    """A float64 port of the TLX backward's consumer loop with MXFP8 (``attn_bwd._consume_rows_v2``) for one sequence
    and head: per key tile (128 keys from the sequence's start) and consumer (64 keys), the query blocks of 64 rows
    ``stage_bounds`` gives, masked (lead, tail; with MXFP8 also every block of a consumer whose keys run past the
    sequence's end: ``straddle_masked``) or not (the bulk); Q/dO rows past the end are a neighbour's (random) unless
    a masked block zeroes them, K/V rows past the end are zero; P = exp2(min(S scale - lse, 0)), masked blocks zero P
    outside the visible keys and rows and dS where P is 0; dV's P at the fixed scale, dS in 32 x 32 blocks of the
    [64, 64] block; dK, dV stored for the sequence's keys, dQ for its rows. Operands: the host's MX values."""
    from jfa_ops.testing import _mx_round_trip_square, e4m3_round_spec, visible_mask

    lq, lk, dim = q.shape[0], k.shape[0], q.shape[-1]
    scale = dim ** -0.5
    offs_q, offs_k = torch.tensor([0, lq]), torch.tensor([0, lk])
    g = torch.Generator().manual_seed(11)
    neighbour = lambda: torch.randn(256, dim, generator=g, dtype=torch.float64) * 5  # noqa: E731
    Q = torch.cat([mx_round_trip_spec(q, offs_q, (32, 32))[:, 0], neighbour()])
    DO = torch.cat([mx_round_trip_spec(grad_out, offs_q, (32, 32))[:, 0], neighbour()])
    zeros = torch.zeros(256, dim, dtype=torch.float64)
    K = torch.cat([mx_round_trip_spec(k, offs_k, (32, 32))[:, 0], zeros])
    V = torch.cat([mx_round_trip_spec(v, None, (1, 32))[:, 0], zeros])
    delta = (grad_out.double() * out.double()).sum(-1)[:, 0] - grad_lse[0].double()
    lse64 = lse[0].double()
    visible = torch.zeros(lq + 64, lk + 128, dtype=torch.bool)
    visible[:lq, :lk] = visible_mask(lq, lk, causal, window)
    dq, dk, dv = (torch.zeros(n, dim, dtype=torch.float64) for n in (lq, lk, lk))
    for n0 in range(0, lk, 128):
        lead_begin, lead_end, bulk_begin, bulk_end, tail_begin, tail_end = _stage_bounds(n0, lk, lq, causal, window)
        n_lead = max(0, -(-(lead_end - lead_begin) // 64))
        n_unmasked = n_lead + max(0, -(-(bulk_end - bulk_begin) // 64))
        n_all = n_unmasked + max(0, -(-(tail_end - tail_begin) // 64))
        for k0 in (n0, n0 + 64):
            for j in range(n_all):
                masked = j < n_lead or j >= n_unmasked or (straddle_masked and k0 + 64 > lk)
                m0 = (lead_begin + j * 64 if j < n_lead else bulk_begin + (j - n_lead) * 64 if j < n_unmasked
                      else tail_begin + (j - n_unmasked) * 64)
                assert m0 % 64 == 0 and k0 % 64 == 0  # the 32 x 32 blocks start at the sequence's starts
                qb, dob = Q[m0:m0 + 64].clone(), DO[m0:m0 + 64].clone()
                if masked and m0 + 64 > lq:
                    qb[max(lq - m0, 0):] = 0.0
                    dob[max(lq - m0, 0):] = 0.0
                rows = slice(m0, m0 + 64)
                lse2 = torch.zeros(64, dtype=torch.float64)
                dl = torch.zeros(64, dtype=torch.float64)
                n_rows = max(0, min(64, lq - m0))
                lse2[:n_rows], dl[:n_rows] = lse64[m0:m0 + n_rows], delta[m0:m0 + n_rows]
                lse2 = torch.where(lse2 == -math.inf, math.inf, lse2)
                p = torch.exp(torch.clamp(qb @ K[k0:k0 + 64].T * scale - lse2[:, None], max=0.0))
                if masked:
                    p = torch.where(visible[rows, k0:k0 + 64], p, 0.0)
                ds = p * (dob @ V[k0:k0 + 64].T - dl[:, None])
                if masked:
                    ds = torch.where(p == 0, 0.0, ds)
                ds = _mx_round_trip_square(ds[None])[0]
                n_keys = max(0, min(64, lk - k0))
                dv[k0:k0 + n_keys] += ((e4m3_round_spec(p * 256.0) / 256.0).T @ dob)[:n_keys]
                dk[k0:k0 + n_keys] += scale * (ds.T @ qb)[:n_keys]
                dq[m0:m0 + n_rows] += scale * (ds @ K[k0:k0 + 64])[:n_rows]
    return dq, dk, dv


@pytest.mark.parametrize("lq, lk, causal, window", [(50, 50, False, (-1, -1)), (70, 100, False, (-1, -1)),
                                                    (300, 200, False, (-1, -1)), (200, 300, True, (-1, -1)),
                                                    (300, 300, True, (-1, -1)), (257, 190, False, (40, 10)),
                                                    (129, 129, False, (-1, -1)), (64, 33, False, (-1, -1))])
def test_kernel_block_walk_gives_the_model(lq, lk, causal, window):
    """The TLX kernel's MXFP8 block walk (``_block_walk``: its work items' query blocks from ``stage_bounds``, the
    masked and mask-free blocks, P, dS and their roundings per consumer block, neighbour rows past the sequence's end)
    equals ``mxfp8_attention_backward_model(rebased_s_dp=False)`` exactly: every product is of MX values, so the
    float64 sums are exact whatever their order, and any block the walk missed, any 32 x 32 block misaligned or any
    value leaking into a block's maximum would show."""
    g = torch.Generator().manual_seed(lq + lk)
    q, k, v, grad_out = (torch.randn(n, 1, 64, generator=g) for n in (lq, lk, lk, lq))
    out = torch.randn(lq, 1, 64, generator=g) * 0.3
    s = (q[:, 0] @ k[:, 0].T).double() / 8
    from jfa_ops.testing import visible_mask

    lse = (torch.logsumexp(s.masked_fill(~visible_mask(lq, lk, causal, window), -math.inf), -1) + 0.05).float()[None]
    grad_lse = torch.randn(1, lq, generator=g)
    want = mxfp8_attention_backward_model(grad_out, grad_lse, q, k, v, out, lse, torch.tensor([0, lq]),
                                          torch.tensor([0, lk]), causal=causal, window=window, rebased_s_dp=False)
    got = _block_walk(q, k, v, grad_out, out, lse, grad_lse, causal, window)
    for a, w in zip(got, want):
        assert torch.equal(a, w[:, 0].double())


def test_kernel_block_walk_needs_the_straddling_tiles_masked():
    """Why MXFP8 masks every block of a consumer whose keys run past the sequence's end: in a mask-free block those
    keys (K, V rows zero) get dS = -P delta, which enters the maximum of the 32 x 32 block they share with the
    sequence's last keys. A case where it matters (the last keys' scores far below the others', so their dS is the
    smaller): the walk without the rule leaves the model, with it equals it."""
    g = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(n, 1, 64, generator=g) for n in (64, 33, 33, 64))
    q[:, :, 0] = q[:, :, 0].abs() + 3.0
    k[32:] = 0.0
    k[32:, :, 0] = -20.0  # key 32 (alone in its 32-key block) scores far below the others
    out = torch.randn(64, 1, 64, generator=g) * 5.0
    lse = (torch.logsumexp((q[:, 0] @ k[:, 0].T).double() / 8, -1) + 0.05).float()[None]
    grad_lse = torch.randn(1, 64, generator=g)
    want = mxfp8_attention_backward_model(grad_out, grad_lse, q, k, v, out, lse, torch.tensor([0, 64]),
                                          torch.tensor([0, 33]), rebased_s_dp=False)
    with_rule = _block_walk(q, k, v, grad_out, out, lse, grad_lse, False, (-1, -1))
    without = _block_walk(q, k, v, grad_out, out, lse, grad_lse, False, (-1, -1), straddle_masked=False)
    assert all(torch.equal(a, w[:, 0].double()) for a, w in zip(with_rule, want))
    assert not torch.equal(without[0], want[0][:, 0].double()) and not torch.equal(without[1], want[1][:, 0].double())


_ROUTING_CODE = """
import _utlx_autoregister, torch
from jfa_ops.backends import tlx, triton as triton_backend
from jfa_ops.backends.base import AttentionParams
from jfa_ops.backends.tlx import configs, mxfp8_attn_bwd
mxfp8_attn_bwd.attention_backward = lambda *a, **kw: 'tlx'
triton_backend.mxfp8_attention_backward = lambda *a, **kw: 'triton'
backward = tlx.BACKEND.family('mxfp8_attention').backward
def route(knob, dtype=torch.bfloat16, dim=128, heads=(4, 2), **params):
    configs.MXFP8_BACKWARD = knob
    q, k = torch.zeros(8, heads[0], dim, dtype=dtype), torch.zeros(8, heads[1], dim, dtype=dtype)
    return backward(None, None, q, k, k, None, None, None, None, AttentionParams(scale=1.0, **params), 'rceil')
assert configs.MXFP8_BACKWARD is True  # on by default
print(route(False), route(True), route(True, torch.float16), route(True, dim=64), route(True, torch.float32),
      route(True, dim=256), route(True, deterministic=True))
"""


def test_knob_routes_the_tlx_mxfp8_backward():
    """The tlx backend's MXFP8 family backward (CPU, TLX importable in a subprocess: ``JFA_TLX_SITE`` or ``.ci-tlx``,
    as test_tlx_compile.py): on by default (configs.MXFP8_BACKWARD, env JFA_TLX_MXFP8_BWD unset); off: the
    triton MXFP8 backward; on: the TLX MXFP8 backward for fp16/bf16 inputs at head_dim 64/128, triton's for fp32
    inputs, head_dim 256 and deterministic=True (``mxfp8_attn_bwd.backward_reason``)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    site = os.environ.get("JFA_TLX_SITE") or os.path.join(root, ".ci-tlx")
    if not os.path.isdir(os.path.join(site, "utlx_plugin")):
        pytest.skip(f"no triton 3.8 + triton-utlx at {site} (set JFA_TLX_SITE)")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "JFA_TLX_MXFP8_BWD")}
    env["PYTHONPATH"] = os.pathsep.join([site, root])
    proc = subprocess.run([sys.executable, "-c", _ROUTING_CODE], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["triton", "tlx", "tlx", "tlx", "triton", "triton", "triton"], proc.stdout


# ------------------------------------------------------------------------------------------------------------ GPU
# Cases at GPU tile sizes (64-row query blocks, 128-key tiles): the CPU cases (empty sequences, length 1, GQA,
# windows, broadcast Q, fully masked rows) and longer jagged ones that reach the mask-free bulk.
GPU_CASES = {**ATTENTION_CASES,
             "long_jagged_causal": dict(q_lengths=(0, 1, 300, 513, 129), kv_lengths=(3, 1, 300, 513, 200),
                                        heads_q=4, heads_kv=2, causal=True),
             "long_window": dict(q_lengths=(700, 64), kv_lengths=(700, 90), window=(100, 30)),
             "long_broadcast": dict(q_lengths=(200,), kv_lengths=(300, 0, 1, 129), broadcast_q=True, heads_q=4)}


def _tlx_mxfp8_backward_or_skip(dim, dtype, heads_q, heads_kv):
    from jfa_ops.backends import unavailable_reason

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    problem = jfa_ops.backends.Problem("cuda", dtype, dim, heads_q, heads_kv, False, -1, -1, False, False)
    reason = unavailable_reason("tlx", problem, family="mxfp8_attention")
    if reason is not None:
        pytest.skip(f"tlx: {reason}")
    from jfa_ops.backends.tlx import configs, mxfp8_attn_bwd

    return configs, mxfp8_attn_bwd


def _spy(monkeypatch, module, name):
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def _gpu_grads(case, dtype, dim, seed=7):
    """(inputs on CPU, the tlx op's gradients through out and lse, grad_out, grad_lse, out, lse) on the GPU."""
    q, k, v, q_off, kv_off, opts = make_case(**{**case, "dim": dim}, dtype=dtype, seed=seed)
    dev = [None if t is None else t.cuda() for t in (q, k, v, q_off, kv_off)]
    leaves = [t.requires_grad_() for t in dev[:3]]
    out, lse = jfa_ops.mxfp8_attention(*leaves, dev[3], dev[4], return_lse=True, backend="tlx", **opts)
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, generator=g).to(dtype)
    grad_lse = torch.randn(lse.shape, generator=g)
    grads = torch.autograd.grad((out, lse), leaves, (grad_out.cuda(), grad_lse.cuda()))
    return (q, k, v, q_off, kv_off, opts), [t.cpu() for t in grads], grad_out, grad_lse, out.detach().cpu(), \
        lse.detach().cpu()


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_CASES))
@pytest.mark.parametrize("dim", [64, 128])
def test_tlx_mxfp8_backward_matches_the_model(name, dim, monkeypatch):
    """JFA_TLX_MXFP8_BWD on (configs.MXFP8_BACKWARD): the TLX MXFP8 backward runs (spied) and its dq, dk, dv equal
    ``mxfp8_attention_backward_model(rebased_s_dp=False)`` on the tlx forward's out/lse to bf16 output rounding
    (the model: the same products, exact in bf16 MMAs, summed in fp32; rare E4M3 rounding flips of P or dS from
    fp32 scores), the float64 MXFP8 oracle to 2e-2, and float64 attention on the originals within issue 12's
    backward bound (0.15, tests/ops/test_mxfp8.py); outputs from a NaN-poisoned allocator (every row written)."""
    from jfa_ops.testing import _poison_allocator

    case = GPU_CASES[name]
    configs, module = _tlx_mxfp8_backward_or_skip(dim, torch.bfloat16, case.get("heads_q", 2),
                                                  case.get("heads_kv", 2))
    monkeypatch.setattr(configs, "MXFP8_BACKWARD", True)
    calls = _spy(monkeypatch, module, "attention_backward")
    _poison_allocator("cuda", 4 * 1024 * 1024)
    (q, k, v, q_off, kv_off, opts), grads, grad_out, grad_lse, out, lse = _gpu_grads(case, torch.bfloat16, dim)
    assert calls, "the TLX MXFP8 backward did not run"
    args = (grad_out, grad_lse, q, k, v, out, lse, q_off, kv_off)
    model = mxfp8_attention_backward_model(*args, rebased_s_dp=False, **_oracle_opts(opts))
    oracle = reference_mxfp8_attention_backward(*args, **_oracle_opts(opts))
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    exact = torch.autograd.grad(reference_attention(q64, k64, v64, q_off, kv_off, **_oracle_opts(opts)),
                                (q64, k64, v64), (grad_out.double(), grad_lse.double()), allow_unused=True)
    for n, got, m, o, e in zip("qkv", grads, model, oracle, exact):
        assert got.dtype == torch.bfloat16 and torch.isfinite(got).all(), n
        assert _rel(got, m) <= 1e-2, f"d{n} vs model {_rel(got, m):.2e}"
        assert _rel(got, o) <= 2e-2, f"d{n} vs oracle {_rel(got, o):.2e}"
        if e is not None and e.norm() > 0:  # MXFP8's own error vs float64 attention (0.02-0.15 on these cases,
            # measured on the H200): the kernel adds at most 10% of it (measured: <= 0.5%; stop 28)
            assert _rel(got, e) <= 1.1 * _rel(o, e) + 1e-3, f"d{n} vs float64 attention {_rel(got, e):.2e}, the " \
                f"oracle's {_rel(o, e):.2e}"


@pytest.mark.gpu
def test_tlx_mxfp8_backward_fp16_inputs(monkeypatch):
    """fp16 inputs: MX values in bf16 (exact), gradients cast to fp16, the model's."""
    configs, module = _tlx_mxfp8_backward_or_skip(128, torch.float16, 4, 2)
    monkeypatch.setattr(configs, "MXFP8_BACKWARD", True)
    calls = _spy(monkeypatch, module, "attention_backward")
    (q, k, v, q_off, kv_off, opts), grads, grad_out, grad_lse, out, lse = _gpu_grads(
        GPU_CASES["long_jagged_causal"], torch.float16, 128)
    assert calls
    model = mxfp8_attention_backward_model(grad_out, grad_lse, q, k, v, out, lse, q_off, kv_off, rebased_s_dp=False,
                                           **_oracle_opts(opts))
    for got, m in zip(grads, model):
        assert got.dtype == torch.float16 and _rel(got, m) <= 1e-2, _rel(got, m)


@pytest.mark.gpu
@pytest.mark.parametrize("knob, dtype, expect_tlx", [(False, torch.bfloat16, False), (True, torch.float32, False),
                                                     (True, torch.bfloat16, True)])
def test_tlx_mxfp8_backward_routing(knob, dtype, expect_tlx, monkeypatch):
    """Off (the default): the triton MXFP8 backward; on: the TLX one for fp16/bf16, fp32 inputs still triton's
    (``mxfp8_attn_bwd.backward_reason``); each within 2e-2 of the float64 MXFP8 oracle."""
    configs, module = _tlx_mxfp8_backward_or_skip(128, dtype, 2, 2)
    from jfa_ops.backends import triton as triton_backend

    monkeypatch.setattr(configs, "MXFP8_BACKWARD", knob)
    tlx_calls = _spy(monkeypatch, module, "attention_backward")
    triton_calls = _spy(monkeypatch, triton_backend, "mxfp8_attention_backward")
    (q, k, v, q_off, kv_off, opts), grads, grad_out, grad_lse, out, lse = _gpu_grads(GPU_CASES["jagged"], dtype, 128)
    assert (bool(tlx_calls), bool(triton_calls)) == (expect_tlx, not expect_tlx)
    want = reference_mxfp8_attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_off, kv_off,
                                              **_oracle_opts(opts))
    for got, w in zip(grads, want):
        assert got.dtype == dtype and _rel(got, w) <= 2e-2, _rel(got, w)


@pytest.mark.gpu
def test_tlx_mxfp8_backward_no_nan_at_wide_range(monkeypatch):
    """Issue 12's no-NaN case (empty sequences, fully masked rows, zero blocks, magnitudes over 2**+-30) at GPU
    tile sizes through the TLX MXFP8 backward: finite gradients (P <= 1 by the clamp)."""
    from tests.ops.test_mxfp8 import no_nan_case

    configs, module = _tlx_mxfp8_backward_or_skip(128, torch.bfloat16, 2, 2)
    monkeypatch.setattr(configs, "MXFP8_BACKWARD", True)
    calls = _spy(monkeypatch, module, "attention_backward")
    q, k, v, q_off, kv_off, opts = no_nan_case(dim=128, dtype=torch.bfloat16, scale_lengths=8)
    leaves = [t.cuda().requires_grad_() for t in (q, k, v)]
    out, lse = jfa_ops.mxfp8_attention(*leaves, q_off.cuda(), kv_off.cuda(), return_lse=True, backend="tlx", **opts)
    grads = torch.autograd.grad(out.float().sum(), leaves)
    assert calls and all(torch.isfinite(g).all() for g in grads)
