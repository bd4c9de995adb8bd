"""The portable Triton backend: jagged flash attention forward and backward (fp16, bf16, fp32; head_dim 8..256).

Importing this module never imports triton (the registry imports it lazily, and ``meta_kernels``/reference must work
without triton); the kernels load on the first call. On CPU it runs only under ``TRITON_INTERPRET=1`` (tests), where
bf16 is refused: the interpreter multiplies bf16 ``tl.dot`` operands as raw uint16.

Files: ``attn_fwd.py`` (forward kernel), ``attn_bwd.py`` (delta, dK/dV, dQ kernels), ``scheduling.py`` (device-side
longest-first tile lists for the persistent grids), ``configs.py`` (pre-tuned block sizes per shared-memory budget,
no autotuning),
``common.py`` (shared masks, stage bounds, loads).
"""
from __future__ import annotations

import functools
import importlib.util
import os
from typing import Optional

import torch

from ..base import (AttentionParams, Backend, FamilyImpl, Problem, device_guard, on_device, unit_stride,
                    unit_stride_pair)
from . import configs

__all__ = ["forward", "backward", "supports", "BACKEND"]

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def supports(problem: Problem) -> Optional[str]:
    """None when the triton backend can run ``problem``, else the reason."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if problem.device_type != "cuda" and not (problem.device_type == "cpu" and _interpreting()):
        return f"needs a CUDA device (or CPU tensors under TRITON_INTERPRET=1), got {problem.device_type}"
    if problem.dtype not in _SUPPORTED_DTYPES:
        return f"dtype {problem.dtype} not supported (fp16, bf16, fp32)"
    if problem.device_type == "cpu" and problem.dtype == torch.bfloat16:
        return "bf16 under the Triton interpreter is wrong (tl.dot multiplies bf16 operands as raw uint16)"
    if problem.head_dim % 8 != 0 or not 8 <= problem.head_dim <= 256:
        return f"head_dim {problem.head_dim} must be a multiple of 8 in [8, 256]"
    if problem.num_heads_kv <= 0 or problem.num_heads_q % problem.num_heads_kv != 0:
        return f"num_heads_q {problem.num_heads_q} must be a multiple of num_heads_kv {problem.num_heads_kv}"
    if problem.device_type == "cuda":
        index = problem.device_index
        if index is None:  # a Problem made by hand: the current GPU, if there is one
            if not torch.cuda.is_available():
                return None
            index = torch.cuda.current_device()
        return _device_reason(index, problem.head_dim, problem.dtype, problem.causal)
    return None


@functools.lru_cache(maxsize=None)
def _device_reason(device_index: int, head_dim: int, dtype: torch.dtype, causal: bool) -> Optional[str]:
    """Why this GPU cannot run the kernels (None: it can): no launch config fits its shared memory (cached: one
    lookup per call)."""
    limit = configs.shared_memory_limit(torch.device("cuda", device_index))
    for kernel in ("fwd", "dkdv", "dq"):
        if configs.table_config(kernel, head_dim, dtype, causal, limit) is None:
            return (f"cuda:{device_index} allows {limit} bytes of shared memory per block; the {kernel} kernel's "
                    f"smallest launch config needs {min(configs.SHARED_MEMORY_LIMITS.values())} (sm_86/sm_89)")
    return None


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: Optional[torch.Tensor],
            kv_offsets: torch.Tensor, params: AttentionParams):
    """(out [T_q, Hq, D], lse [Hq, T_q] float32); see ``jfa_ops.backends.base``."""
    # Triton launches on the current device; the kernels read offsets with unit stride
    q_offsets, kv_offsets = unit_stride_pair(q_offsets, kv_offsets)
    return on_device(q.device, _kernels("attn_fwd").attention_forward, q, k, v, q_offsets, kv_offsets, params)


def backward(grad_out: torch.Tensor, grad_lse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, q_offsets: Optional[torch.Tensor],
             kv_offsets: torch.Tensor, params: AttentionParams):
    """(dq, dk, dv); grad_lse may be None. Deterministic mode only changes broadcast-Q dQ (a fixed-order chunked sum;
    otherwise broadcast-Q dQ is fused into the dK/dV pass with fp32 atomics)."""
    q_offsets, kv_offsets = unit_stride_pair(q_offsets, kv_offsets)
    return on_device(q.device, _kernels("attn_bwd").attention_backward, grad_out, grad_lse, q, k, v, out, lse,
                     q_offsets, kv_offsets, params)


@functools.lru_cache(maxsize=None)
def _kernels(module: str):
    """A kernel module of this backend, imported on first use (importing the backend never imports triton); cached
    because an import statement costs ~1-2 us per call on the host path."""
    return importlib.import_module(f"{__name__}.{module}")


MXFP8_HEAD_DIMS = (32, 64, 128, 256)  # the MXFP8 attention kernel's tiles span head_dim (a power of two)


def mxfp8_supports(problem: Problem) -> Optional[str]:
    """The MXFP8 families: fp16/bf16/fp32 inputs (or E4M3 data), head_dim a multiple of 32; on CPU only under the
    interpreter (where bf16 is fine: no bf16 dot runs, the dots take E4M3)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if problem.device_type != "cuda" and not (problem.device_type == "cpu" and _interpreting()):
        return f"needs a CUDA device (or CPU tensors under TRITON_INTERPRET=1), got {problem.device_type}"
    if problem.dtype not in _SUPPORTED_DTYPES + (torch.float8_e4m3fn,):
        return f"dtype {problem.dtype} not supported (fp16, bf16, fp32)"
    if problem.head_dim % 32 != 0 or not 32 <= problem.head_dim <= 256:
        return f"head_dim {problem.head_dim} must be a multiple of 32 in [32, 256]"
    return None


def mxfp8_attention_supports(problem: Problem) -> Optional[str]:
    reason = mxfp8_supports(problem)
    if reason is None and problem.head_dim not in MXFP8_HEAD_DIMS:
        reason = f"head_dim {problem.head_dim} not in {MXFP8_HEAD_DIMS} (the MXFP8 attention kernel's tile)"
    if reason is None and problem.device_type == "cuda" and torch.cuda.is_available():
        index = problem.device_index if problem.device_index is not None else torch.cuda.current_device()
        if _capability(index) < (8, 9):
            reason = f"cuda:{index} is sm_{''.join(map(str, _capability(index)))}: E4M3 dots need sm_89 or newer"
    return reason


@functools.lru_cache(maxsize=None)
def _capability(index: int):
    return torch.cuda.get_device_capability(index)


def quantize_mxfp8(x, offsets, block, rounding):  # not "mxfp8_quantize": that submodule, once imported, shadows it
    from .mxfp8_quantize import quantize

    with device_guard(x.device):
        return quantize(x, unit_stride(offsets), block, rounding)


def mxfp8_attention_forward(q_mx, k_mx, v_mx, q_offsets, kv_offsets, params, out_dtype):
    from .common import packed_mx_pair
    from .mxfp8_attn_fwd import attention_forward

    q_mx, k_mx, v_mx = packed_mx_pair(q_mx), packed_mx_pair(k_mx), packed_mx_pair(v_mx)  # pairs of any layout
    with device_guard(q_mx[0].device):
        return attention_forward(q_mx, k_mx, v_mx, *unit_stride_pair(q_offsets, kv_offsets), params, out_dtype)


def mxfp8_attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params, rounding,
                             empty_rows=True):
    from .mxfp8_attn_bwd import attention_backward

    with device_guard(q.device):
        return attention_backward(grad_out, grad_lse, q, k, v, out, lse, *unit_stride_pair(q_offsets, kv_offsets),
                                  params, rounding, empty_rows=empty_rows)


def _mxfp8_families():
    from ..reference import mxfp8 as reference

    return {
        "mxfp8_quantize": FamilyImpl(quantize_mxfp8, supports=mxfp8_supports),
        # dequantize is elementwise PyTorch on the device (no host sync): the reference's function serves both
        "mxfp8_dequantize": FamilyImpl(reference.dequantize, supports=mxfp8_supports),
        "mxfp8_attention": FamilyImpl(mxfp8_attention_forward, mxfp8_attention_backward,
                                      supports=mxfp8_attention_supports),
    }


def block_sparse_supports(problem: Problem) -> Optional[str]:
    """The attention kernels' rules, plus block sizes that are powers of two >= 16 (tiles of tl.dot)."""
    for name, block in (("block_q", problem.block_q), ("block_kv", problem.block_kv)):
        if block < 16 or block & (block - 1):
            return f"{name} {block} must be a power of two >= 16"
    return supports(problem)


# The block-sparse kernels address one sequence's index rows as kv head x head stride in int32 (``selected_blocks``,
# the select's fill): a sequence's index past 2**31 - 1 entries would wrap (helper review47, stop 47). Refused here,
# before any kernel, as the tlx kernels refuse theirs.
_INDEX_ENTRIES_LIMIT = 2 ** 31 - 1


def _check_index_entries(heads_kv: int, n_q_blocks: int, n_kv_blocks: int, name: str) -> None:
    if not all(type(n) is int for n in (heads_kv, n_q_blocks, n_kv_blocks)):
        return  # symbolic sizes (traced with dynamic shapes): a comparison would add a guard; eager calls check
    entries = heads_kv * n_q_blocks * n_kv_blocks
    if entries > _INDEX_ENTRIES_LIMIT:
        raise ValueError(f"{name}: {heads_kv} kv heads x {n_q_blocks} x {n_kv_blocks} blocks = {entries} entries a "
                         f"sequence, past the triton block-sparse kernels' int32 offsets ({_INDEX_ENTRIES_LIMIT}); "
                         f"use larger blocks or backend='reference'")


def select_kv_blocks(q, k, q_offsets, kv_offsets, params):
    """Stage 1 (block pooling, then scores and the top-k by rank, in Triton: no sort); no host sync."""
    from .block_sparse_select import select_kv_blocks as select

    _check_index_entries(k.shape[1], params.n_q_blocks, params.n_kv_blocks, "select_kv_blocks' kv_block_index")
    with device_guard(q.device):
        return select(q, k, *unit_stride_pair(q_offsets, kv_offsets), params)


def block_sparse_forward(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, params):
    from .block_sparse_fwd import block_sparse_forward as run

    _check_index_entries(*kv_block_index.shape[1:], "kv_block_index")
    with device_guard(q.device):
        return run(q, k, v, *unit_stride_pair(q_offsets, kv_offsets), kv_block_index, kv_block_count, params)


def block_sparse_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, kv_block_index,
                          kv_block_count, params):
    from .block_sparse_bwd import block_sparse_backward as run

    _check_index_entries(*kv_block_index.shape[1:], "kv_block_index")
    with device_guard(q.device):
        return run(grad_out, grad_lse, q, k, v, out, lse, *unit_stride_pair(q_offsets, kv_offsets), kv_block_index,
                   kv_block_count, params)


BACKEND = Backend(name="triton", forward=forward, backward=backward, supports=supports, priority=10,
                  auto_devices=("cuda",), checks_offsets=True, traceable=True, families={
                      "select_kv_blocks": FamilyImpl(select_kv_blocks, supports=block_sparse_supports),
                      "block_sparse": FamilyImpl(block_sparse_forward, block_sparse_backward,
                                                 supports=block_sparse_supports),
                      **_mxfp8_families()})
