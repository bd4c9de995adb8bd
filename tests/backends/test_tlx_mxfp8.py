"""The TLX MXFP8 forward's input stage and arithmetic, on CPU (the TLX kernel itself runs only on the GPU:
``tools/tlx_check.py mxfp8``, ``tests/backends/test_tlx_gpu.py``).

- ``triton/mxfp8_rebase.py`` (portable Triton, run here under the interpreter): Q/K rows and V tile columns re-based
  to one power-of-two factor, exactly (N(0, 1) data) and within the documented loss (magnitudes spread over
  2**+-12); V stored transposed per key tile with the keys past a sequence zero.
- The fused path for high-precision inputs (``mxfp8_quantize.quantize_rebased_rows`` / ``quantize_rebased_v_tiles``:
  the quantize kernel writing the re-based layout itself) equals quantize-then-rebase bit for bit, on inputs with
  zeros, subnormals, inf, NaN, saturating blocks, jagged tails and padding tiles.
- ``jfa_ops.testing.rebased_mxfp8_attention_model`` (the kernel's arithmetic in float64: fixed-scale E4M3 P, column
  factors per tile) against the float64 MXFP8 oracle and within issue 12's error bound, on every feature case.
- ``jfa_ops.testing.mxfp8_attention_backward_model``: the arithmetic of the MXFP8 backward bench/NOTES.md "MXFP8
  backward on Hopper" proposes (no kernel yet) against the float64 MXFP8 backward oracle.
"""
from __future__ import annotations

import math

import pytest
import torch

import jfa_ops
from jfa_ops.testing import (fp8_mma_model, mx_dequantize_spec, mxfp8_attention_backward_model,
                             rebased_mxfp8_attention_model, reference_attention, reference_mxfp8_attention,
                             reference_mxfp8_attention_backward)
from tests.ops.test_mxfp8 import (ATTENTION_CASES, _oracle_opts, _rel, check_no_nan, issue_error_bound, make_case,
                                  no_nan_case)

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from jfa_ops.backends.triton.mxfp8_quantize import (quantize, quantize_rebased_key_tiles,  # noqa: E402
                                                    quantize_rebased_rows, quantize_rebased_v_tiles)
from jfa_ops.backends.triton.mxfp8_rebase import (first_column, key_factor_tiles, p_in_v_key_order,  # noqa: E402
                                                  permute_v_keys, rebase_key_tiles, rebase_rows, rebase_v_tiles,
                                                  v_key_slots, v_tiles)

BLOCK_N = 128


def _pairs(q, k, v, kv_off):
    return (jfa_ops.mxfp8_quantize(q, backend="reference"), jfa_ops.mxfp8_quantize(k, backend="reference"),
            jfa_ops.mxfp8_quantize(v, kv_off, block=(32, 1), backend="reference"))


@pytest.mark.parametrize("spread", [None, 12])
def test_rebase_rows_keeps_the_values(spread):
    """data x row factor == the MX values within 2**(e_max - 10) per element (half E4M3's subnormal step under the
    row's factor: the module's stated loss), nearly all exactly (N(0, 1): all but elements that already were
    subnormal in their block)."""
    q, _, _, _, _, _ = make_case((70, 3), (1,), heads_q=3, dim=128, spread=spread, seed=2)
    data, scale = jfa_ops.mxfp8_quantize(q, backend="reference")
    y, factors = rebase_rows(data, scale)
    assert y.dtype == torch.float8_e4m3fn and factors.shape == (3, q.shape[0])
    got = y.double() * factors.T.double()[:, :, None]
    want = mx_dequantize_spec(data, scale)
    assert ((got - want).abs() <= factors.T.double()[:, :, None] * 2.0 ** -10).all()
    assert (got != want).double().mean() <= (1e-3 if spread is None else 0.25)  # measured 0 / 0.11


def test_rebase_rows_special_scales():
    """A NaN block scale makes the row's factor NaN; a zero row (scale 2**-127) stays zero with a finite factor."""
    x = torch.randn(3, 1, 64)
    x[1] = 0.0
    data, scale = jfa_ops.mxfp8_quantize(x, backend="reference")
    scale.view(torch.uint8)[2, 0, 1] = 255
    y, factors = rebase_rows(data, scale)
    assert factors[0, 2].isnan() and torch.isfinite(factors[0, :2]).all()
    assert (y[1].float() == 0).all()


@pytest.mark.parametrize("spread", [None, 12])
def test_rebase_v_tiles_transposed_and_exact(spread):
    """Per tile of 128 keys of each sequence (tiles kv_offsets[b] // 128 + b + i): V^T columns x the tile's factors
    x 2**8 == the (32, 1) MX values within 2**(e_max - 10) (nearly all exactly); keys past the sequence zero."""
    lengths = (0, 1, 127, 128, 129, 300)
    _, _, v, _, kv_off, _ = make_case((1,) * len(lengths), lengths, dim=64, spread=spread, seed=3)
    data, scale = jfa_ops.mxfp8_quantize(v, kv_off, block=(32, 1), backend="reference")
    vt, factors = rebase_v_tiles(data, scale, kv_off.to(torch.int32), BLOCK_N)
    tiles = v_tiles(v.shape[0], len(lengths), BLOCK_N)
    assert vt.shape == (2 * 64, tiles * BLOCK_N) and factors.shape == (tiles, 2, 64)
    want = mx_dequantize_spec(data, scale, kv_off, (32, 1))
    for b, length in enumerate(lengths):
        k0 = int(kv_off[b])
        for i, n0 in enumerate(range(0, length, BLOCK_N)):
            tile = k0 // BLOCK_N + b + i
            cols = vt[:, tile * BLOCK_N:(tile + 1) * BLOCK_N].double().T.reshape(BLOCK_N, 2, 64)
            got = cols * factors[tile].double()[None] * 256
            n = min(BLOCK_N, length - n0)
            assert (got[n:] == 0).all(), "keys past the sequence must be zero"
            expect = want[k0 + n0:k0 + n0 + n]
            assert ((got[:n] - expect).abs() <= factors[tile].double()[None] * 256 * 2.0 ** -10).all()
            assert (got[:n] != expect).double().mean() <= (1e-3 if spread is None else 0.25)  # measured ~0 / 0.11


def test_v_key_slots_permute_within_each_16_keys():
    """``v_key_slots`` (configs.MXFP8_PERMUTED_V_KEYS' V^T order) is a permutation of each 16 keys onto themselves
    (so of each 32-key k-step of the wgmma), the accumulator's pairs (2t, 2t + 1) and (8 + 2t, 9 + 2t) of quad
    thread t landing on the A operand's 4t..4t + 3."""
    slots = v_key_slots(128)
    assert sorted(slots.tolist()) == list(range(128))
    assert ((slots // 16) == (torch.arange(128) // 16)).all()
    for t in range(4):
        for base in (0, 16, 112):
            keys = [base + 2 * t, base + 2 * t + 1, base + 8 + 2 * t, base + 9 + 2 * t]
            assert slots[keys].tolist() == [base + 4 * t + i for i in range(4)]


@pytest.mark.parametrize("spread", [None, 12])
def test_rebase_v_tiles_permuted_keys(spread):
    """``rebase_v_tiles(..., permuted_keys=True)`` (configs.MXFP8_PERMUTED_V_KEYS): per tile, key k of the natural
    V^T at column ``v_key_slots[k]``, bit for bit (``permute_v_keys`` of the natural one), the factors unchanged;
    jagged tails (keys past a sequence: zero columns, moved as the rest)."""
    lengths = (0, 1, 127, 128, 129, 300)
    _, _, v, _, kv_off, _ = make_case((1,) * len(lengths), lengths, dim=64, spread=spread, seed=3)
    data, scale = jfa_ops.mxfp8_quantize(v, kv_off, block=(32, 1), backend="reference")
    off = kv_off.to(torch.int32)
    vt, factors = rebase_v_tiles(data, scale, off, BLOCK_N)
    vt_p, factors_p = rebase_v_tiles(data, scale, off, BLOCK_N, permuted_keys=True)
    bits, bits_p = vt.view(torch.uint8), vt_p.view(torch.uint8)
    slots = v_key_slots(BLOCK_N)
    for b, length in enumerate(lengths):  # the tiles sequences own (padding tiles are never written nor read)
        for i in range(-(-length // BLOCK_N)):
            tile = int(kv_off[b]) // BLOCK_N + b + i
            assert torch.equal(factors[tile], factors_p[tile])
            nat = bits[:, tile * BLOCK_N:(tile + 1) * BLOCK_N]
            got = bits_p[:, tile * BLOCK_N:(tile + 1) * BLOCK_N]
            assert torch.equal(got[:, slots], nat)
            assert torch.equal(permute_v_keys(vt, BLOCK_N).view(torch.uint8)[:, tile * BLOCK_N:(tile + 1) * BLOCK_N],
                               got)
            if length - i * BLOCK_N > 2:  # key 2 moves to column 4 (keys 0, 1 stay)
                assert not torch.equal(got, nat)


@triton.jit
def _p_in_v_key_order_kernel(P, OUT, ROWS: tl.constexpr, N: tl.constexpr):
    offs = tl.arange(0, ROWS)[:, None] * N + tl.arange(0, N)[None, :]
    tl.store(OUT + offs, p_in_v_key_order(tl.load(P + offs)))


def test_p_in_v_key_order_matches_the_v_key_slots():
    """The kernel's renaming of P's columns (``p_in_v_key_order``, under the interpreter) puts key k's probability
    at column ``v_key_slots[k]``, V^T's column of key k under ``permuted_keys``: P' V' == P V exactly (float64 of
    E4M3 values: P' V' sums the same products), and the row sums (P x ones) the same."""
    g = torch.Generator().manual_seed(4)
    p = torch.rand(64, BLOCK_N, generator=g).to(torch.float8_e4m3fn).float()
    out = torch.empty_like(p)
    _p_in_v_key_order_kernel[(1,)](p, out, ROWS=64, N=BLOCK_N)
    slots = v_key_slots(BLOCK_N)
    assert torch.equal(out[:, slots], p)
    v = torch.randn(BLOCK_N, 64, generator=g).to(torch.float8_e4m3fn).double()
    vt_p = torch.empty(64, BLOCK_N, dtype=torch.float64)
    vt_p[:, slots] = v.T
    assert torch.equal(out.double() @ vt_p.T, p.double() @ v)
    assert torch.equal(out.double().sum(1), p.double().sum(1))
    # and bit for bit as Hopper's FP8 wgmma sums them (``fp8_mma_model``, k-steps of 16 as calibrated for this
    # kernel: each step's products aligned to their largest exponent and added exactly, so an order within a step
    # does not matter, and the permutation keeps every key in its 16): P V and the ones' row sums
    ones = torch.ones(BLOCK_N, 32, dtype=torch.float64)
    for rhs, rhs_p in ((v, vt_p.T), (ones, ones)):
        assert torch.equal(fp8_mma_model(out.double(), rhs_p, group=16), fp8_mma_model(p.double(), rhs, group=16))


@triton.jit
def _row_terms_kernel(X, FIRST, MAX, ROWS: tl.constexpr, N: tl.constexpr):
    rows = tl.arange(0, ROWS)
    x = tl.load(X + rows[:, None] * N + tl.arange(0, N)[None, :])
    tl.store(FIRST + rows, first_column(x))
    tl.store(MAX + rows, tl.max(x, 1))


def _rowsum_tile(seed):
    """P x ones [64, 32] as Hopper's FP8 wgmma sums it (``fp8_mma_model``, k-steps of 16 as calibrated for this
    kernel), of P x 2**8 in E4M3 with P = U(0, 1) x 2**U(-20, 0) (a spread over which the model's truncation
    bites), one empty row."""
    g = torch.Generator().manual_seed(seed)
    p = (torch.rand(64, BLOCK_N, generator=g) * torch.exp2(torch.empty(64, BLOCK_N).uniform_(-20, 0, generator=g))
         * 256).to(torch.float8_e4m3fn).double()
    p[5] = 0.0
    return fp8_mma_model(p, torch.ones(BLOCK_N, 32, dtype=torch.float64), group=16), p


def test_first_column_is_the_row_max_of_p_times_ones():
    """``configs.MXFP8_ROWSUM_ONE_COLUMN`` (helper mxexact50): lq's block term as ``first_column`` of P x ones
    instead of its row max. Exact: the ones' 32 columns are equal, so the wgmma's (``fp8_mma_model``: the same
    products in the same k-steps per column) are equal bit for bit, and so each is the row max; the interpreter's
    ``first_column`` gives it (and on a tile whose columns differ, column 0: one element read, nothing combined)."""
    lq_t, p = _rowsum_tile(6)
    assert torch.equal(lq_t, lq_t[:, :1].expand(-1, 32))  # every column the same bits
    assert (lq_t[:, 0] != p.sum(1)).any()  # the model's truncation differs from the exact sum (a real wgmma sum)
    x = lq_t.float()  # the kernel's fp32 accumulator
    first, biggest = torch.empty(64), torch.empty(64)
    _row_terms_kernel[(1,)](x, first, biggest, ROWS=64, N=32)
    assert torch.equal(first, biggest) and torch.equal(first, x.amax(1))
    spread = x * torch.arange(1, 33, dtype=torch.float32)  # columns that differ: column 0 comes back
    _row_terms_kernel[(1,)](spread, first, biggest, ROWS=64, N=32)
    assert torch.equal(first, spread[:, 0]) and torch.equal(biggest, spread[:, 31])


@pytest.mark.parametrize("block_n", [128, 64])
def test_key_factor_tiles_in_v_tile_layout(block_n):
    """``key_factor_tiles`` (configs.MXFP8_FACTORS_TMA's K factors): tile kv_offsets[b] // block_n + b + i of head h
    holds K's factors [h, k0 + i * block_n ...] of sequence b, zeros past its end and in the padding tiles (what the
    knob-off kernel's masked load gives), and row tile x Hkv + h of the [tiles x Hkv, block_n] view the producer's
    TMA box reads is that tile (each row 16-byte aligned); ``tiled_key_factors``-style tiling of sequences at
    offsets that are no multiple of 4 (a [Hkv, T] box there would fault). Brute force per sequence here."""
    lengths = (0, 1, 127, 128, 129, 300, 3, 0, 257)
    heads = 3
    kv_off = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = int(kv_off[-1])
    factors = torch.pow(2.0, torch.randint(-20, 20, (heads, total), generator=torch.Generator().manual_seed(4)))
    tiles = key_factor_tiles(factors, kv_off, block_n)
    assert tiles.shape == (v_tiles(total, len(lengths), block_n), heads, block_n) and tiles.is_contiguous()
    want = torch.zeros_like(tiles)
    for b, length in enumerate(lengths):
        k0 = int(kv_off[b])
        for i, n0 in enumerate(range(0, length, block_n)):
            n = min(block_n, length - n0)
            want[k0 // block_n + b + i, :, :n] = factors[:, k0 + n0:k0 + n0 + n]
    assert torch.equal(tiles, want)
    rows = tiles.view(-1, block_n)
    assert rows.stride(0) * 4 % 16 == 0
    for tile in range(tiles.shape[0]):
        for h in range(heads):
            assert torch.equal(rows[tile * heads + h], tiles[tile, h])


def _special_inputs(rows, heads, dim, dtype, seed):
    """N(0, 1) with magnitudes spread over 2**+-12, plus what the spec treats specially: all-zero rows and blocks,
    subnormals of the input dtype, +-inf, NaN, blocks at the dtype's largest values (scales clamped at 2**127,
    data saturating to 448 under "floor"), values whose block rounds up (significand > 1.75)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, heads, dim, generator=g) * torch.pow(2.0, torch.empty(rows, 1, dim).uniform_(-12, 12,
                                                                                                    generator=g))
    x = x.to(dtype)
    info = torch.finfo(dtype)
    pick = lambda n: torch.randint(0, rows * heads * dim, (n,), generator=g)  # noqa: E731
    flat = x.view(-1)
    flat[pick(max(1, rows // 8))] = float("inf")
    flat[pick(max(1, rows // 8))] = float("-inf")
    flat[pick(max(1, rows // 8))] = float("nan")
    flat[pick(rows * 4)] = info.tiny * torch.rand(rows * 4, generator=g).to(dtype)  # subnormals (and zeros)
    x[rows // 3] = 0.0  # a zero row
    x[: rows // 2, 0, :32] = (info.tiny / 4) * torch.randn(rows // 2, 32, generator=g).to(dtype)  # subnormal blocks
    x[1::7, -1, 32:64] = info.max * torch.rand(len(range(1, rows, 7)), 32, generator=g).to(dtype)  # huge blocks
    x[2::5, 0, -32:] = 1.875 * torch.sign(torch.randn(len(range(2, rows, 5)), 32, generator=g)).to(dtype)  # round up
    return x


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("dim, heads", [(64, 3), (128, 2)])
def test_fused_quantize_rebased_rows_equal_quantize_then_rebase(dtype, rounding, dim, heads):
    """Q/K: the quantize kernel writing re-based rows and their factors == rebase_rows(quantize(x)), bit for bit
    (NaN factors included), with a row tail (T not a multiple of the 32-row tile)."""
    x = _special_inputs(77, heads, dim, dtype, seed=dim + heads)
    want_y, want_f = rebase_rows(*quantize(x, None, (1, 32), rounding))
    got_y, got_f = quantize_rebased_rows(x, rounding)
    assert torch.equal(_bits(got_y), _bits(want_y))
    assert torch.equal(_bits(got_f), _bits(want_f))
    assert want_f.isnan().any()  # the specials reached the output


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("dim, heads", [(64, 3), (128, 1)])
def test_fused_quantize_rebased_v_tiles_equal_quantize_then_rebase(dtype, rounding, dim, heads):
    """V: the quantize kernel writing V^T tiles and their column factors == rebase_v_tiles(quantize(v)), bit for bit,
    on every tile a sequence owns (tails of 1, 31, 33, 127, 129, 300 keys: keys past the end zero, also in a
    column whose block is NaN; an empty sequence); padding tiles are written by neither."""
    lengths = (0, 1, 31, 32, 33, 127, 128, 129, 300)
    kv_off = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    v = _special_inputs(int(kv_off[-1]), heads, dim, dtype, seed=dim + heads + 1)
    v[int(kv_off[2]) + 30, 0, 3] = float("nan")  # the last key of a 31-key sequence: its block's padding rows
    want_vt, want_f = rebase_v_tiles(*quantize(v, kv_off, (32, 1), rounding), kv_off, BLOCK_N)
    got_vt, got_f = quantize_rebased_v_tiles(v, kv_off, BLOCK_N, rounding)
    assert got_vt.shape == want_vt.shape and got_f.shape == want_f.shape
    owned = [int(kv_off[b]) // BLOCK_N + b + i for b, n in enumerate(lengths) for i in range(-(-n // BLOCK_N))]
    for tile in owned:
        cols = slice(tile * BLOCK_N, (tile + 1) * BLOCK_N)
        assert torch.equal(_bits(got_vt[:, cols]), _bits(want_vt[:, cols])), tile
        assert torch.equal(_bits(got_f[tile]), _bits(want_f[tile])), tile
    assert want_f.isnan().any()


def _model(q, k, v, q_off, kv_off, opts):
    (qd, qs), (kd, ks), (vd, vs) = _pairs(q, k, v, kv_off)
    rebased = (*rebase_rows(qd, qs), *rebase_rows(kd, ks), *rebase_v_tiles(vd, vs, kv_off.to(torch.int32), BLOCK_N))
    return rebased_mxfp8_attention_model(rebased, q_off, kv_off, block_n=BLOCK_N, **_oracle_opts(opts))


@pytest.mark.parametrize("spread", [None, 12])
@pytest.mark.parametrize("name", list(ATTENTION_CASES))
def test_kernel_arithmetic_against_the_mxfp8_oracle(name, spread):
    """The TLX kernel's arithmetic against the float64 MXFP8 oracle: the same result. P x 2**8 rounded to E4M3
    under one fixed scale equals the reference's 32-key block quantization wherever it is an E4M3 normal (E4M3's
    relative rounding does not depend on the scale), i.e. for P >= 2**-14; the re-based operands are the MX values
    but for subnormal bits (magnitudes spread over 2**+-12: measured 3-4e-6)."""
    q, k, v, q_off, kv_off, opts = make_case(**ATTENTION_CASES[name], seed=4, spread=spread)
    out, lse = _model(q, k, v, q_off, kv_off, opts)
    want_out, want_lse = reference_mxfp8_attention(q, k, v, q_off, kv_off, **_oracle_opts(opts))
    assert not out.isnan().any() and torch.equal(lse == -math.inf, want_lse == -math.inf)
    finite = want_lse > -math.inf
    assert _rel(lse[finite], want_lse[finite]) <= (1e-12 if spread is None else 1e-5)  # measured 1.4e-6 (spread)
    assert _rel(out, want_out) <= (1e-12 if spread is None else 2e-5)  # measured 3e-16 / 4.3e-6


@pytest.mark.parametrize("name, spread", [("jagged", None), ("causal_gqa", None), ("window", 12),
                                          ("broadcast_q", 12)])
def test_kernel_arithmetic_within_the_issue_bound(name, spread):
    q, k, v, q_off, kv_off, opts = make_case(**ATTENTION_CASES[name], spread=spread, seed=1)
    out, _ = _model(q, k, v, q_off, kv_off, opts)
    err, bound = issue_error_bound(q, k, v, q_off, kv_off, opts, out)
    assert err <= bound, (err, bound)


@pytest.mark.parametrize("dim", [64, 128])
def test_kernel_arithmetic_no_nan_at_wide_range(dim):
    """Issue 12's no-NaN case (empty sequences, fully masked rows, all-zero blocks, 2**+-30 magnitudes) through the
    kernel's arithmetic: finite, the oracle's -inf rows, the oracle's out (re-basing drops the bits of blocks far
    under their row's largest: measured 3.5e-6 / 5.1e-6)."""
    q, k, v, q_off, kv_off, opts = no_nan_case(dim=dim)
    out, lse = _model(q, k, v, q_off, kv_off, opts)
    want_out, want_lse = reference_mxfp8_attention(q, k, v, q_off, kv_off, **_oracle_opts(opts))
    assert torch.isfinite(out).all() and not lse.isnan().any()
    assert torch.equal(lse == -math.inf, want_lse == -math.inf)
    assert _rel(out, want_out) <= 1e-4


@pytest.mark.parametrize("name", list(ATTENTION_CASES))
@pytest.mark.parametrize("spread", [None, 4, 12])
def test_backward_model_against_the_oracle(name, spread):
    """The proposed MXFP8 backward's arithmetic (``mxfp8_attention_backward_model``; bench/NOTES.md "MXFP8 backward
    on Hopper, helper mxbwd"): P enters dV at one fixed scale; S and dP on the MX values (design D, bf16 MMAs) or on
    operands re-based per 32-row / 32-key block over head_dim (design B, E4M3 S and dP). D: the oracle's gradients
    but for dV's P below 2**-14 (measured <= 1e-5). B: the same at N(0, 1) and 2**+-4 per row and column (re-basing
    exact there but for subnormal bits); at 2**+-12 (~4% of Q's and ~21% of V's elements lose bits) its gradients are
    no farther from float64 attention than the oracle's own by more than 1.3x (both far: scores that large make the
    gradients cancellation noise, the oracle's dq/dk 20-130x off float64; measured ratio <= 1.21). ~1 s each."""
    q, k, v, q_off, kv_off, opts = make_case(**ATTENTION_CASES[name], seed=3, spread=spread)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = jfa_ops.mxfp8_attention(q, k, v, q_off, kv_off, return_lse=True, backend="reference", **opts)
    g = torch.Generator().manual_seed(4)
    args = (torch.randn(out.shape, generator=g), torch.randn(lse.shape, generator=g), q, k, v, out, lse, q_off,
            kv_off)
    want = reference_mxfp8_attention_backward(*args, **_oracle_opts(opts))
    bf16_mma = mxfp8_attention_backward_model(*args, **_oracle_opts(opts), rebased_s_dp=False)
    rebased = mxfp8_attention_backward_model(*args, **_oracle_opts(opts))
    for got, w in zip(bf16_mma, want):
        assert torch.isfinite(got).all() and _rel(got, w) <= 2e-5, _rel(got, w)
    if spread != 12:
        for got, w in zip(rebased, want):
            assert _rel(got, w) <= 2e-5, _rel(got, w)
        return
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    exact = torch.autograd.grad(reference_attention(q64, k64, v64, q_off, kv_off, **_oracle_opts(opts)),
                                (q64, k64, v64), (args[0].double(), args[1].double()))
    for got, w, e in zip(rebased, want, exact):
        assert torch.isfinite(got).all() and _rel(got, e) <= 1.3 * _rel(w, e), (_rel(got, e), _rel(w, e))


# ------------------------------------------------------------------------------------------------------------ GPU
def _skip_unless_tlx_runs(dim, q, k):
    """Skip (with the reason) where the tlx backend does not run MXFP8 attention on pre-quantized pairs."""
    from jfa_ops.backends import unavailable_reason

    problem = jfa_ops.backends.Problem("cuda", torch.float8_e4m3fn, dim, q.shape[1], k.shape[1], False, -1, -1,
                                       False, False)
    reason = unavailable_reason("tlx", problem, family="mxfp8_attention")
    if reason is not None:
        pytest.skip(f"tlx: {reason}")


def _assert_near_the_oracle(q, k, v, q_off, kv_off, opts, out, lse):
    """Every row written (no NaN from the poisoned allocator), the empty rows' lse -inf as the float64 MXFP8
    oracle's; out and lse within the FP8 wgmma's accumulation precision of it (looser than the CPU model's
    agreement on Hopper) and the issue's bound."""
    want, want_lse = reference_mxfp8_attention(q, k, v, q_off, kv_off, **_oracle_opts(opts))
    assert not out.isnan().any() and torch.equal(lse.cpu() == -math.inf, want_lse == -math.inf)
    finite = want_lse > -math.inf
    # lse: 3e-4, the FP8 wgmma's accumulation on rows that see 1-3 keys (no averaging over keys): 1.13e-4 measured on
    # fully_masked_rows D128 seed 11 (6 finite rows, 5e-4 at most; H100, stop 49), <= 1e-4 on the other cases
    assert _rel(out, want) <= 1e-2 and _rel(lse.cpu()[finite], want_lse[finite]) <= 3e-4
    err, bound = issue_error_bound(q, k, v, q_off, kv_off, opts, out.cpu())
    assert err <= bound, (err, bound)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ATTENTION_CASES))
@pytest.mark.parametrize("dim", [64, 128])
def test_tlx_kernel_on_the_gpu(name, dim):
    """The TLX MXFP8 forward (backend="tlx") on pre-quantized pairs: the float64 MXFP8 oracle and the kernel's model
    to the FP8 wgmma's accumulation precision, the issue's bound; outputs from a NaN-filled allocator (every row written)."""
    from jfa_ops.testing import _poison_allocator

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    q, k, v, q_off, kv_off, opts = make_case(**{**ATTENTION_CASES[name], "dim": dim}, dtype=torch.bfloat16, seed=9)
    dev = [None if t is None else t.cuda() for t in (q, k, v, q_off, kv_off)]
    pairs = _pairs(*dev[:3], dev[4])
    _skip_unless_tlx_runs(dim, q, k)
    _poison_allocator("cuda", 4 * 1024 * 1024)
    out, lse = jfa_ops.mxfp8_attention(*pairs, dev[3], dev[4], out_dtype=torch.float32, return_lse=True,
                                       backend="tlx", **opts)
    _assert_near_the_oracle(q, k, v, q_off, kv_off, opts, out, lse)


# broadcast-Q as the bench's row has it, smaller: many sequences whose first keys sit at offsets no multiple of 4 (a
# TMA box of K's factors in their [Hkv, T] layout would start off 16 bytes there and fault)
FACTORS_TMA_CASES = {**ATTENTION_CASES,
                     "broadcast_q_many": dict(q_lengths=(128,), kv_lengths=tuple(1 + (i * 97) % 613 for i in range(40)),
                                              broadcast_q=True, heads_q=4, heads_kv=4)}


def _knob_twin_case(name, dim):
    """A knob twin's case (skips without a GPU or where tlx does not run it): the CPU inputs and options, the
    inputs on the GPU, and their MX pairs."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    q, k, v, q_off, kv_off, opts = make_case(**{**FACTORS_TMA_CASES[name], "dim": dim}, dtype=torch.bfloat16,
                                             seed=11)
    _skip_unless_tlx_runs(dim, q, k)
    dev = [None if t is None else t.cuda() for t in (q, k, v, q_off, kv_off)]
    return q, k, v, q_off, kv_off, opts, dev, _pairs(*dev[:3], dev[4])


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FACTORS_TMA_CASES))
@pytest.mark.parametrize("dim", [64, 128])
def test_tlx_factors_tma_equals_the_factor_loads_kernel(name, dim):
    """``configs.MXFP8_FACTORS_TMA`` (helper mxbcast48, on since stop 49: the key and column factors by the
    producer's TMA): out and lse equal the knob-off kernel's (the factors by global loads) bit for bit (the same
    values, the same arithmetic), on pre-quantized pairs and on bf16 inputs (the fused quantize), and so within
    1e-2 / 3e-4 of the float64 MXFP8 oracle and the issue's bound (as ``test_tlx_kernel_on_the_gpu``); outputs from
    a NaN-filled allocator."""
    from jfa_ops.backends.tlx import configs
    from jfa_ops.testing import _poison_allocator

    q, k, v, q_off, kv_off, opts, dev, pairs = _knob_twin_case(name, dim)
    results, before = {}, configs.MXFP8_FACTORS_TMA
    for on in (False, True):
        configs.MXFP8_FACTORS_TMA = on
        _poison_allocator("cuda", 16 * 1024 * 1024)  # each setting's outputs from NaN-filled memory
        try:
            results[on] = (jfa_ops.mxfp8_attention(*pairs, dev[3], dev[4], out_dtype=torch.float32, return_lse=True,
                                                   backend="tlx", **opts),
                           jfa_ops.mxfp8_attention(*dev, return_lse=True, backend="tlx", **opts))
        finally:
            configs.MXFP8_FACTORS_TMA = before
    for (out0, lse0), (out1, lse1) in zip(results[False], results[True]):  # pre-quantized, bf16 in
        assert torch.equal(out0, out1) and torch.equal(lse0, lse1)
    out, lse = results[True][0]
    _assert_near_the_oracle(q, k, v, q_off, kv_off, opts, out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FACTORS_TMA_CASES))
@pytest.mark.parametrize("dim", [64, 128])
def test_tlx_permuted_v_keys_equal_the_natural_order(name, dim):
    """``configs.MXFP8_PERMUTED_V_KEYS`` (helper mxfmul49, on in stops 51-52, off since 53: V^T's keys in the
    accumulator's register order, P renamed to it, no layout conversion of P): out and lse within 1e-2 / 3e-4 of the
    float64 MXFP8 oracle and the issue's bound (``_assert_near_the_oracle``, the contract), on pre-quantized pairs
    and on bf16 inputs (both V paths: quantize + ``rebase_v_tiles``, and MXFP8_FUSED_V's kernel +
    ``permute_v_keys``); and equal to the natural key order's kernel (the knob off) bit for bit, the prediction (P V
    and P x ones sum the same products within each 16-key k-step, and Hopper's FP8 MMA aligns a step's products to
    one exponent: ``fp8_mma_model``, ``test_p_in_v_key_order_matches_the_v_key_slots``); outputs from a NaN-filled
    allocator."""
    from jfa_ops.backends.tlx import configs
    from jfa_ops.testing import _poison_allocator

    q, k, v, q_off, kv_off, opts, dev, pairs = _knob_twin_case(name, dim)
    results, before = {}, (configs.MXFP8_PERMUTED_V_KEYS, configs.MXFP8_FUSED_V)
    for on in (False, True):
        configs.MXFP8_PERMUTED_V_KEYS = on
        _poison_allocator("cuda", 16 * 1024 * 1024)  # each setting's outputs from NaN-filled memory
        try:
            results[on] = [jfa_ops.mxfp8_attention(*pairs, dev[3], dev[4], out_dtype=torch.float32, return_lse=True,
                                                   backend="tlx", **opts),
                           jfa_ops.mxfp8_attention(*dev, return_lse=True, backend="tlx", **opts)]
            configs.MXFP8_FUSED_V = True
            results[on].append(jfa_ops.mxfp8_attention(*dev, return_lse=True, backend="tlx", **opts))
        finally:
            configs.MXFP8_PERMUTED_V_KEYS, configs.MXFP8_FUSED_V = before
    out, lse = results[True][0]
    _assert_near_the_oracle(q, k, v, q_off, kv_off, opts, out, lse)
    for (out0, lse0), (out1, lse1) in zip(results[False], results[True]):  # pre-quantized, bf16 in, bf16 fused V
        assert torch.equal(out0, out1) and torch.equal(lse0, lse1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FACTORS_TMA_CASES))
@pytest.mark.parametrize("dim", [64, 128])
def test_tlx_rowsum_one_column_equals_the_row_max(name, dim):
    """``configs.MXFP8_ROWSUM_ONE_COLUMN`` (helper mxexact50, on since stop 51: lq's block term from one column of P x
    ones, not their row max): equal to the row max's out and lse (the knob off) bit for bit (every column of the ones'
    wgmma the same sum, ``test_first_column_is_the_row_max_of_p_times_ones``; an assert failing here says Hopper's
    wgmma gives equal columns different bits), with PERMUTED_V_KEYS off and on (each against the kernel with that
    setting), on pre-quantized pairs and bf16 inputs; within 1e-2 / 3e-4 of the float64 MXFP8 oracle and the
    issue's bound; outputs from a NaN-filled allocator."""
    from jfa_ops.backends.tlx import configs
    from jfa_ops.testing import _poison_allocator

    q, k, v, q_off, kv_off, opts, dev, pairs = _knob_twin_case(name, dim)
    before = (configs.MXFP8_ROWSUM_ONE_COLUMN, configs.MXFP8_PERMUTED_V_KEYS)
    for keys in (False, True):
        results = {}
        for on in (False, True):
            configs.MXFP8_ROWSUM_ONE_COLUMN, configs.MXFP8_PERMUTED_V_KEYS = on, keys
            _poison_allocator("cuda", 16 * 1024 * 1024)  # each setting's outputs from NaN-filled memory
            try:
                results[on] = (jfa_ops.mxfp8_attention(*pairs, dev[3], dev[4], out_dtype=torch.float32,
                                                       return_lse=True, backend="tlx", **opts),
                               jfa_ops.mxfp8_attention(*dev, return_lse=True, backend="tlx", **opts))
            finally:
                configs.MXFP8_ROWSUM_ONE_COLUMN, configs.MXFP8_PERMUTED_V_KEYS = before
        out, lse = results[True][0]
        _assert_near_the_oracle(q, k, v, q_off, kv_off, opts, out, lse)
        for (out0, lse0), (out1, lse1) in zip(results[False], results[True]):  # pre-quantized, bf16 in
            assert torch.equal(out0, out1) and torch.equal(lse0, lse1), keys


@pytest.mark.gpu
def test_tlx_no_nan_at_wide_range_on_the_gpu():
    """Issue 12's no-NaN case at GPU tile sizes (bf16, head_dim 128) through the TLX forward (fused quantize) and
    the family's backward (triton's, bf16smem); FP8 wgmma accumulation: out within 1e-2 of the oracle outside the
    rows whose largest score the wgmma's truncating sum may give to another key (one flips on the H200: 0.0295)."""
    from jfa_ops.backends import unavailable_reason

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    problem = jfa_ops.backends.Problem("cuda", torch.bfloat16, 128, 2, 2, True, -1, -1, False, False)
    reason = unavailable_reason("tlx", problem, family="mxfp8_attention")
    if reason is not None:
        pytest.skip(f"tlx: {reason}")
    check_no_nan(no_nan_case(dim=128, dtype=torch.bfloat16, scale_lengths=8), "tlx", device="cuda", out_tol=1e-2,
                 fp8_mma=True)  # S on the FP8 wgmma: its near-tied rows are the hardware's call (check_no_nan)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_quantize_on_the_gpu_equals_the_two_passes(dtype):
    """On the GPU (the hardware E4M3 conversion in both paths): quantize_rebased_rows / _v_tiles == rebase_rows /
    rebase_v_tiles of quantize's pairs, bit for bit, at a size with many programs per SM and every special value."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    lengths = (0, 1, 31, 33, 127, 128, 129, 300, 4096, 1000)
    kv_off = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32).cuda()
    for dim, heads in ((64, 5), (128, 4)):
        x = _special_inputs(int(kv_off[-1]), heads, dim, dtype, seed=dim).cuda()
        for rounding in ("rceil", "floor"):
            want_y, want_f = rebase_rows(*quantize(x, None, (1, 32), rounding))
            got_y, got_f = quantize_rebased_rows(x, rounding)
            assert torch.equal(_bits(got_y), _bits(want_y)) and torch.equal(_bits(got_f), _bits(want_f))
            want_vt, want_vf = rebase_v_tiles(*quantize(x, kv_off, (32, 1), rounding), kv_off, BLOCK_N)
            got_vt, got_vf = quantize_rebased_v_tiles(x, kv_off, BLOCK_N, rounding)
            owned = torch.tensor([int(kv_off[b]) // BLOCK_N + b + i for b, n in enumerate(lengths)
                                  for i in range(-(-n // BLOCK_N))], device="cuda")
            cols = (owned[:, None] * BLOCK_N + torch.arange(BLOCK_N, device="cuda")).reshape(-1)
            assert torch.equal(_bits(got_vt)[:, cols], _bits(want_vt)[:, cols])
            assert torch.equal(_bits(got_vf)[owned], _bits(want_vf)[owned])


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ATTENTION_CASES))
def test_tlx_bf16_inputs_fused_equals_two_passes(name):
    """mxfp8_attention(bf16 q, k, v, backend="tlx"): the fused quantize (configs.MXFP8_FUSED_QUANTIZE, with and
    without MXFP8_FUSED_V) gives the two passes' out and lse bit for bit (the same operands, the same kernel), within
    the issue's bound."""
    from jfa_ops.backends import unavailable_reason

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    q, k, v, q_off, kv_off, opts = make_case(**{**ATTENTION_CASES[name], "dim": 128}, dtype=torch.bfloat16, seed=5)
    problem = jfa_ops.backends.Problem("cuda", torch.bfloat16, 128, q.shape[1], k.shape[1], False, -1, -1, False,
                                       False)
    if unavailable_reason("tlx", problem, family="mxfp8_attention") is not None:
        pytest.skip("tlx unavailable")
    from jfa_ops.backends.tlx import configs

    dev = [None if t is None else t.cuda() for t in (q, k, v, q_off, kv_off)]
    results = []
    before = configs.MXFP8_FUSED_QUANTIZE, configs.MXFP8_FUSED_V
    for fused, fused_v in ((True, True), (True, False), (False, True)):  # all fused, V two-pass, all two-pass
        configs.MXFP8_FUSED_QUANTIZE, configs.MXFP8_FUSED_V = fused, fused_v
        try:
            results.append(jfa_ops.mxfp8_attention(*dev, return_lse=True, backend="tlx", **opts))
        finally:
            configs.MXFP8_FUSED_QUANTIZE, configs.MXFP8_FUSED_V = before
    out, lse = results[0]
    for out2, lse2 in results[1:]:
        assert torch.equal(out, out2) and torch.equal(lse, lse2)
    err, bound = issue_error_bound(q, k, v, q_off, kv_off, opts, out.float().cpu())
    assert err <= bound, (err, bound)


# ---------------------------------------------------------------------- configs.MXFP8_TILED_KEY_FACTORS (kfold50)
# sequences of 0 keys (first, middle, last), 1, shorter than a 32-key program, one program, shorter than a tile, a
# whole tile, a tile and one key, several tiles with a tail: tails, padding tiles and programs past every end
KEY_TILE_LENGTHS = (0, 1, 31, 32, 33, 127, 128, 129, 0, 300, 257, 5, 0)


def _key_tile_offsets(lengths=KEY_TILE_LENGTHS):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _special_k_pair(rows, heads, dim, seed):
    """K's (1, 32) pair of ``_special_inputs`` (NaN and 2**-127 block scales among them) by the reference quantize."""
    return jfa_ops.mxfp8_quantize(_special_inputs(rows, heads, dim, torch.float32, seed), backend="reference")


@pytest.mark.parametrize("block_n", [128, 64])
@pytest.mark.parametrize("dim, heads", [(64, 3), (128, 2)])
def test_rebase_key_tiles_equals_rebase_rows_then_key_factor_tiles(block_n, dim, heads):
    """``rebase_key_tiles`` (one launch, ``configs.MXFP8_TILED_KEY_FACTORS``) == ``rebase_rows`` then
    ``key_factor_tiles`` (today's two launches), bit for bit: the re-based K data and the tiled factors, NaN factors,
    zeros in tails and padding tiles and tiles of empty sequences included; every position of the tiled layout
    written (its memory NaN-filled before)."""
    kv_off = _key_tile_offsets()
    data, scale = _special_k_pair(int(kv_off[-1]), heads, dim, seed=dim + heads)
    want_y, want_f = rebase_rows(data, scale)
    want_t = key_factor_tiles(want_f, kv_off, block_n)
    with _nan_filled_empty():
        got_y, got_t = rebase_key_tiles(data, scale, kv_off, block_n)
    assert got_t.shape == want_t.shape == (v_tiles(int(kv_off[-1]), len(KEY_TILE_LENGTHS), block_n), heads, block_n)
    assert torch.equal(_bits(got_y), _bits(want_y)) and torch.equal(_bits(got_t), _bits(want_t))
    assert want_t.isnan().any() and (want_t == 0).any()  # the specials and the zeros reached the output


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("dim, heads", [(64, 3), (128, 2)])
def test_quantize_rebased_key_tiles_equals_two_launches(dtype, rounding, dim, heads):
    """bf16 in: ``quantize_rebased_key_tiles`` (the quantize kernel with KEY_TILE, one launch) ==
    ``quantize_rebased_rows`` then ``key_factor_tiles``, bit for bit, on inputs with zeros, subnormals, inf, NaN
    and saturating blocks, 3 heads (a padded head group); the tiled layout NaN-filled before."""
    kv_off = _key_tile_offsets()
    x = _special_inputs(int(kv_off[-1]), heads, dim, dtype, seed=dim + heads)
    want_y, want_f = quantize_rebased_rows(x, rounding)
    want_t = key_factor_tiles(want_f, kv_off, BLOCK_N)
    with _nan_filled_empty():
        got_y, got_t = quantize_rebased_key_tiles(x, kv_off, BLOCK_N, rounding)
    assert torch.equal(_bits(got_y), _bits(want_y)) and torch.equal(_bits(got_t), _bits(want_t))
    assert want_t.isnan().any() and (want_t == 0).any()


@pytest.mark.parametrize("lengths", [(0,), (0, 0, 0), (5,), (3, 0)])
def test_key_tiles_short_and_empty_batches(lengths):
    """Batches with no key, only empty sequences, or one sequence shorter than a 32-key program: both one-launch
    forms equal the two launches (all-zero tiles where no key is); no sequence at all (B = 0): zeros, no launch."""
    kv_off = _key_tile_offsets(lengths)
    rows = int(kv_off[-1])
    x = _special_inputs(max(rows, 1), 2, 64, torch.float32, seed=3)[:rows]
    data, scale = jfa_ops.mxfp8_quantize(x, backend="reference")
    want_y, want_f = rebase_rows(data, scale)
    want_t = key_factor_tiles(want_f, kv_off, BLOCK_N)
    with _nan_filled_empty():
        for got_y, got_t in (rebase_key_tiles(data, scale, kv_off, BLOCK_N),
                             quantize_rebased_key_tiles(x, kv_off, BLOCK_N, "rceil")):
            assert torch.equal(_bits(got_t), _bits(want_t)) and torch.equal(_bits(got_y), _bits(want_y))
    no_seq = torch.zeros(1, dtype=torch.int32)
    x = torch.randn(200, 2, 64)
    for got_y, got_t in (rebase_key_tiles(*jfa_ops.mxfp8_quantize(x, backend="reference"), no_seq, BLOCK_N),
                         quantize_rebased_key_tiles(x, no_seq, BLOCK_N, "rceil")):
        assert got_t.shape == (1, 2, BLOCK_N) and (got_t == 0).all()


@pytest.mark.parametrize("offsets", [[0, 300, 60], [0, 60, -200, 90], [0, -1000, 90], [5, 20, 90], [0, 40, 10**6],
                                     [0, 2**31 - 1, 90], [200, 250], [130, 90]])
def test_key_tiles_bad_offsets_stay_inside(offsets):
    """JFA_VALIDATE=deferred lets bad offsets reach the kernels: both one-launch forms read and write only inside
    their tensors (K's pair / x, the data and the tiled factors all views into NaN-guarded buffers: a read outside
    would bring a NaN factor in, a write outside would change a guard) and equal the two launches wherever
    ``key_factor_tiles`` itself stays inside; where it does not (first offset >= a tile past the rows, the search's
    fallback to sequence 0 with a negative key start: ``test_key_factor_tiles_reads_outside_on_a_far_first_offset``)
    they write zeros."""
    rows, heads, dim, guard = 90, 2, 64, 4096
    kv_off = torch.tensor(offsets, dtype=torch.int32)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, heads, dim, generator=g)
    data, scale = jfa_ops.mxfp8_quantize(x, backend="reference")
    # the inputs in the middle of buffers whose other bytes are NaN (data 0x7F, scale 255: a NaN factor if read)
    data_buf = torch.full((guard + data.numel() + guard,), 0x7F, dtype=torch.uint8)
    data_in = data_buf[guard:guard + data.numel()].view(data.shape)
    data_in.copy_(data.view(torch.uint8))
    scale_buf = torch.full((guard + scale.numel() + guard,), 255, dtype=torch.uint8)
    scale_in = scale_buf[guard:guard + scale.numel()].view(scale.shape)
    scale_in.copy_(scale.view(torch.uint8))
    x_buf = torch.full((guard + x.numel() + guard,), float("nan"))
    x_in = x_buf[guard:guard + x.numel()].view(x.shape)
    x_in.copy_(x)
    want_f = rebase_rows(data, scale)[1]
    want_t = key_factor_tiles(want_f, kv_off, BLOCK_N) if offsets[0] < BLOCK_N else None
    outs = []
    for make in (lambda: rebase_key_tiles(data_in.view(torch.float8_e4m3fn), scale_in.view(torch.float8_e8m0fnu),
                                          kv_off, BLOCK_N),
                 lambda: quantize_rebased_key_tiles(x_in, kv_off, BLOCK_N, "rceil")):
        with _guarded_empty(guard) as guards:
            outs.append(make())
        assert all(bool((g == 0x5A).all()) for g in guards), "a write outside the outputs"
    for y, t in outs:
        assert not t.isnan().any(), "a read outside the inputs"
        if want_t is not None:
            assert torch.equal(_bits(t), _bits(want_t))
        else:
            assert (t == 0).all()


def test_key_factor_tiles_reads_outside_on_a_far_first_offset():
    """A first offset past the rows (possible under JFA_VALIDATE=deferred) sends the tile search to sequence 0 with
    a negative key start: ``key_factor_tiles_kernel`` must mask keys < 0 too, or it reads up to block_n floats
    outside the factors (NaN here). Found by kfold50; fixed in stop 50."""
    heads, rows = 2, 100
    flat = torch.full((heads * rows + 4096,), float("nan"))
    kf = flat[:heads * rows].view(heads, rows)
    kf.fill_(1.0)
    tiles = key_factor_tiles(kf, torch.tensor([200, 250], dtype=torch.int32), BLOCK_N)
    assert not tiles.isnan().any()


class _nan_filled_empty:
    """torch.empty (float32 / uint8, as the one-launch forms allocate) NaN-filled: a position the kernel leaves
    unwritten shows."""

    def __enter__(self):
        self._empty = torch.empty

        def empty(*shape, dtype=None, device=None, **kw):
            t = self._empty(*shape, dtype=dtype, device=device, **kw)
            if t.dtype.is_floating_point and t.element_size() == 4:
                t.fill_(float("nan"))
            elif t.element_size() == 1:
                t.view(torch.uint8).fill_(0x7F)
            return t
        torch.empty = empty
        return self

    def __exit__(self, *exc):
        torch.empty = self._empty


class _guarded_empty:
    """torch.empty as views into the middle of buffers whose ``guard`` bytes either side are 0x5A; ``__enter__``
    gives the list of guards (filled as tensors are made) to check after the kernel."""

    def __init__(self, guard):
        self.guard, self.guards = guard, []

    def __enter__(self):
        self._empty = torch.empty

        def empty(*shape, dtype=None, device=None, **kw):
            shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
            dtype = dtype or torch.get_default_dtype()
            nbytes = math.prod(shape) * torch.tensor([], dtype=dtype).element_size()
            buf = self._empty(self.guard + nbytes + self.guard, dtype=torch.uint8)
            buf.fill_(0x5A)
            self.guards += [buf[:self.guard], buf[self.guard + nbytes:]]
            return buf[self.guard:self.guard + nbytes].view(dtype).view(shape)
        torch.empty = empty
        return self.guards

    def __exit__(self, *exc):
        torch.empty = self._empty


@pytest.mark.gpu
def test_key_tiles_on_the_gpu_equal_two_launches():
    """On the GPU (the hardware E4M3 conversion): ``rebase_key_tiles`` == ``rebase_rows`` then ``key_factor_tiles``
    and ``quantize_rebased_key_tiles`` == ``quantize_rebased_rows`` then ``key_factor_tiles``, bit for bit (data and
    tiled factors), at a size with many programs per SM, every special value, tails, padding and empty sequences."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    kv_off = _key_tile_offsets((*KEY_TILE_LENGTHS, 4096, 1000, 0, 77)).cuda()
    rows = int(kv_off[-1])
    for dim, heads in ((64, 5), (128, 4)):
        for dtype in (torch.bfloat16, torch.float32):
            x = _special_inputs(rows, heads, dim, dtype, seed=dim).cuda()
            for rounding in ("rceil", "floor"):
                want_y, want_f = quantize_rebased_rows(x, rounding)
                got_y, got_t = quantize_rebased_key_tiles(x, kv_off, BLOCK_N, rounding)
                assert torch.equal(_bits(got_y), _bits(want_y))
                assert torch.equal(_bits(got_t), _bits(key_factor_tiles(want_f, kv_off, BLOCK_N)))
            data, scale = quantize(x, None, (1, 32), "rceil")
            want_y, want_f = rebase_rows(data, scale)
            got_y, got_t = rebase_key_tiles(data, scale, kv_off, BLOCK_N)
            assert torch.equal(_bits(got_y), _bits(want_y))
            assert torch.equal(_bits(got_t), _bits(key_factor_tiles(want_f, kv_off, BLOCK_N)))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FACTORS_TMA_CASES))
@pytest.mark.parametrize("dim", [64, 128])
def test_tlx_tiled_key_factors_equals_the_shipped_path(name, dim):
    """``configs.MXFP8_TILED_KEY_FACTORS`` (helper kfold50, off by default: K's factors tiled by K's own re-basing
    launch, no ``key_factor_tiles``): out and lse equal the shipped path's bit for bit (the same operands bit for
    bit, ``test_key_tiles_on_the_gpu_equal_two_launches``, the same kernel), on pre-quantized pairs and bf16 in
    (fused quantize; with MXFP8_FUSED_V; with MXFP8_FUSED_QUANTIZE off, through the pairs), FACTORS_TMA on; within
    1e-2 / 3e-4 of the float64 MXFP8 oracle and the issue's bound; outputs from a NaN-filled allocator."""
    from jfa_ops.backends.tlx import configs
    from jfa_ops.testing import _poison_allocator

    q, k, v, q_off, kv_off, opts, dev, pairs = _knob_twin_case(name, dim)
    names = ("MXFP8_TILED_KEY_FACTORS", "MXFP8_FACTORS_TMA", "MXFP8_FUSED_V", "MXFP8_FUSED_QUANTIZE")
    before = {n: getattr(configs, n) for n in names}
    results = {}
    for on in (False, True):
        results[on] = []
        try:
            for i, (fused_v, fused) in enumerate(((False, True), (True, True), (False, False))):
                for n, value in zip(names, (on, True, fused_v, fused)):
                    setattr(configs, n, value)
                _poison_allocator("cuda", 16 * 1024 * 1024)  # each setting's outputs from NaN-filled memory
                if i == 0:  # pre-quantized once
                    results[on].append(jfa_ops.mxfp8_attention(*pairs, dev[3], dev[4], out_dtype=torch.float32,
                                                               return_lse=True, backend="tlx", **opts))
                results[on].append(jfa_ops.mxfp8_attention(*dev, return_lse=True, backend="tlx", **opts))
        finally:
            for n, value in before.items():
                setattr(configs, n, value)
    out, lse = results[True][0]
    _assert_near_the_oracle(q, k, v, q_off, kv_off, opts, out, lse)
    assert len(results[True]) == len(results[False]) == 4
    for (out0, lse0), (out1, lse1) in zip(results[False], results[True]):  # pairs, bf16: fused, fused V, 2 passes
        assert torch.equal(out0, out1) and torch.equal(lse0, lse1)


def test_mx_prequant_passes_counts_the_tiled_key_factors():
    """``tools/mx_prequant_passes.py``'s table for MXFP8_TILED_KEY_FACTORS (kfold50's counts): with FACTORS_TMA, the
    knob drops ``key_factor_tiles`` (5 -> 4 launches) and K's launch writes the tiled layout instead of [Hkv, T]:
    the call moves 2 x Hkv x T x 4 bytes fewer (17.07 MB on the bench's broadcast-Q row); without FACTORS_TMA the
    knob changes nothing."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "mx_prequant_passes.py")
    spec = importlib.util.spec_from_file_location("mx_prequant_passes", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    c = tool.case()
    total = lambda steps: sum(r + w for _, r, w in steps)  # noqa: E731
    loads, tma, tiled = (tool.passes(c, f, t)[0] for f, t in ((False, False), (True, False), (True, True)))
    assert tool.passes(c, False, True)[0] == loads
    assert [n for n, _, _ in tma] == ["rebase_rows(Q)", "rebase_rows(K)", "rebase_v_tiles(V)", "key_factor_tiles",
                                      "mxfp8_attn_fwd_tlx_kernel"]
    assert [n for n, _, _ in tiled] == ["rebase_rows(Q)", "rebase_key_tiles(K)", "rebase_v_tiles(V)",
                                        "mxfp8_attn_fwd_tlx_kernel"]
    k_factors = sum(c.kv_lens) * c.num_heads_kv * 4
    assert total(tma) - total(tiled) == 2 * k_factors
    assert round((total(tma) - total(tiled)) / 1e6, 2) == 17.07
