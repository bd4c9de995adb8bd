"""Shape rules and argument checks of the MXFP8 ops (``jfa::mxfp8_quantize``, ``jfa::mxfp8_dequantize``,
``jfa::mxfp8_attention`` and its backward): metadata only, like ``meta_kernels.attention``.

MXFP8 (OCP Microscaling spec v1.0): FP8 E4M3 elements (``torch.float8_e4m3fn``) and one E8M0 power-of-two scale
(``torch.float8_e8m0fnu``, value ``2 ** (bits - 127)``, bits 0xFF = NaN) per block of 32 elements. A tensor
``x [T, H, D]`` (``D`` a multiple of 32) is quantized in one of three block shapes (rows x head_dim columns):

    block     data            scale                      blocks run
    (1, 32)   [T, H, D] e4m3  [T, H, D/32] e8m0          along head_dim (Q, K for Q K^T)
    (32, 1)   [T, H, D] e4m3  [T//32 + B, H, D] e8m0     along the rows of each sequence (V for P V)
    (32, 32)  [T, H, D] e4m3  [T//32 + B, H, D/32] e8m0  32 rows x 32 columns (backward operands: one copy serves
                                                           x and x^T)

Row blocks (``(32, 1)``, ``(32, 32)``) never straddle two sequences: sequence ``b`` (rows ``offsets[b]`` to
``offsets[b+1]``) owns the row blocks ``offsets[b] // 32 + b + i`` for ``i < ceil(len_b / 32)``; its last block is
padded with zeros (not stored in ``data``). That layout fits in ``T // 32 + B`` row blocks whatever the lengths,
so the shapes depend on ``T`` and ``B`` only (no host sync, no recompile); row blocks no sequence owns hold scale
bits 0. ``offsets`` None: the whole tensor is one sequence (``B = 1``).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from meta_kernels.attention import _check_offsets, _fails, dtype_names

MX_BLOCK = 32  # elements per scale block (OCP MX)
BLOCKS = ((1, 32), (32, 1), (32, 32))
ROUNDINGS = ("rceil", "floor")
QUANTIZE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DEQUANTIZE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
E4M3_MAX = 448.0  # largest finite float8_e4m3fn
E4M3_EMAX = 8  # exponent of E4M3's largest normal (448 = 1.75 * 2**8): the spec's emax_elem
SCALE_BIAS = 127  # E8M0: value 2 ** (bits - 127)
SCALE_MIN_EXP, SCALE_MAX_EXP = -127, 127  # E8M0's finite range (bits 0..254)
SCALE_NAN_BITS = 0xFF


def check_block(block) -> Tuple[int, int]:
    """``block`` as a tuple, one of ``BLOCKS``; TypeError/ValueError naming ``block`` otherwise."""
    if not isinstance(block, (tuple, list)) or len(block) != 2 or not all(
            isinstance(b, int) and not isinstance(b, bool) for b in block):
        raise TypeError(f"block must be a pair of ints, one of {list(BLOCKS)}, got {block!r}")
    block = (int(block[0]), int(block[1]))
    if block not in BLOCKS:
        raise ValueError(f"block must be one of {list(BLOCKS)} (rows, head_dim columns), got {block}")
    return block


def check_rounding(rounding) -> None:
    if not isinstance(rounding, str):
        raise TypeError(f"rounding must be a str, one of {list(ROUNDINGS)}, got {type(rounding).__name__}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {list(ROUNDINGS)}, got {rounding!r}")


def _check_head_dim(name: str, t: torch.Tensor) -> None:
    if _fails((t.shape[2] % MX_BLOCK != 0) | (t.shape[2] < MX_BLOCK)):
        raise ValueError(f"{name}'s head_dim must be a positive multiple of {MX_BLOCK} for MXFP8 (one scale per "
                         f"{MX_BLOCK} elements), got {t.shape[2]}")


def _num_seqs(offsets: Optional[torch.Tensor]):
    return 1 if offsets is None else offsets.shape[0] - 1


def scale_shape(rows, heads, head_dim, offsets: Optional[torch.Tensor], block: Sequence[int]):
    """The scale tensor's shape for ``data [rows, heads, head_dim]`` (see the module's table)."""
    block_rows, block_cols = block
    scale_rows = rows if block_rows == 1 else rows // MX_BLOCK + _num_seqs(offsets)
    return (scale_rows, heads, head_dim // block_cols)


def check_quantize_args(x: torch.Tensor, offsets: Optional[torch.Tensor], block, rounding) -> Tuple[int, int]:
    """Check ``jfa::mxfp8_quantize``'s arguments; returns the block as a tuple."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in QUANTIZE_DTYPES:
        raise TypeError(f"x must be {dtype_names(QUANTIZE_DTYPES)}, got {x.dtype}")
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D [rows, heads, head_dim], got shape {tuple(x.shape)}")
    _check_head_dim("x", x)
    block = check_block(block)
    check_rounding(rounding)
    if offsets is not None:
        _check_offsets("offsets", offsets, x.device, "x")
    return block


def quantize_shapes(x: torch.Tensor, offsets: Optional[torch.Tensor], block) -> Tuple[tuple, tuple]:
    """(data shape, scale shape) of ``jfa::mxfp8_quantize``."""
    return tuple(x.shape), scale_shape(x.shape[0], x.shape[1], x.shape[2], offsets, block)


def check_mx_pair(name: str, data: torch.Tensor, scale: torch.Tensor, offsets: Optional[torch.Tensor],
                  block: Sequence[int]) -> None:
    """A quantized (data, scale) pair: dtypes, ranks, device and the scale's shape for ``block``. Errors name
    ``{name}_data``/``{name}_scale`` (``name`` empty: ``data``/``scale``, ``mxfp8_dequantize``'s arguments)."""
    data_name, scale_name = (f"{name}_data", f"{name}_scale") if name else ("data", "scale")
    for what, t, dtype in ((data_name, data, torch.float8_e4m3fn), (scale_name, scale, torch.float8_e8m0fnu)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise TypeError(f"{what} must be {dtype}, got {t.dtype}")
        if t.dim() != 3:
            raise ValueError(f"{what} must be 3-D, got shape {tuple(t.shape)}")
    if scale.device != data.device:
        raise ValueError(f"{scale_name} must be on {data_name}'s device {data.device}, got {scale.device}")
    _check_head_dim(data_name, data)
    expected = scale_shape(data.shape[0], data.shape[1], data.shape[2], offsets, block)
    if any(_fails(a != b) for a, b in zip(scale.shape, expected)):
        raise ValueError(f"{scale_name} must have shape {tuple(expected)} for {data_name} {tuple(data.shape)} and "
                         f"block {tuple(block)}, got {tuple(scale.shape)}")


def check_dequantize_args(data, scale, offsets, block, dtype) -> Tuple[int, int]:
    block = check_block(block)
    if offsets is not None:
        _check_offsets("offsets", offsets, data.device if isinstance(data, torch.Tensor) else None, "data")
    check_mx_pair("", data, scale, offsets, block)
    if dtype not in DEQUANTIZE_DTYPES:
        raise TypeError(f"dtype must be {dtype_names(DEQUANTIZE_DTYPES)}, got {dtype}")
    return block


# The attention ops: q/k/v high precision, quantized inside; the pre-quantized op takes these blocks.
Q_BLOCK = (1, 32)  # along head_dim: the Q K^T contraction
K_BLOCK = (1, 32)
V_BLOCK = (32, 1)  # along the keys of each sequence: the P V contraction
GRAD_BLOCK = (32, 32)  # backward operands Q, K, dO, dS (and P for dV)


def check_mxfp8_attention_args(q, k, v, rounding) -> None:
    """What MXFP8 attention adds to ``check_attention_args`` (called with ``dtypes=QUANTIZE_DTYPES``): head_dim a
    multiple of 32 and a known rounding."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_head_dim(name, t)
    check_rounding(rounding)

