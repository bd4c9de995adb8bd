"""The block-sparse family: ``jfa::select_kv_blocks`` (stage 1) and ``jfa::block_sparse_attention`` (+ backward,
stage 2): op, fake, autograd, side by side (``ops/attention.py`` is the model).

``select_kv_blocks`` is not differentiable: its outputs are integer block ids (no autograd is registered; its inputs'
gradients through it are None, as for any integer output). ``block_sparse_attention`` takes the attention options of
``jfa::attention`` (``OPTIONS_SCHEMA``) after the selection and its block sizes.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Tuple

import torch
from torch import Tensor

import meta_kernels
from jfa_ops import validation
from jfa_ops.backends import BlockSelectParams, BlockSparseParams, Problem, registry_generation, select_backend
from jfa_ops.ops import attention as _attention
from jfa_ops.ops.attention import (OPTIONS_SCHEMA, _params as _attention_params, _recall, _remember,
                                   autograd_backward_call, backward_grads, called_by_autograd, check_no_forward_ad,
                                   register_autocast)
from jfa_ops.validation import check_offset_values, validation_mode

SELECT_FAMILY = "select_kv_blocks"
SPARSE_FAMILY = "block_sparse"


# ---------------------------------------------------------------------------------------------- stage 1: selection
def _select_params(q, k, q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv, block_q=128, block_kv=128,
                   keep_ratio=0.5, top_k=-1, causal=False, window_left=-1, window_right=-1, broadcast_q=False,
                   always_local=True, backend=None) -> Tuple[BlockSelectParams, Optional[str]]:
    meta_kernels.check_select_args(q, k, q_offsets, kv_offsets, block_q, block_kv, keep_ratio, top_k, causal,
                                   (window_left, window_right), broadcast_q, always_local, max_seqlen_q,
                                   max_seqlen_kv)
    index_shape, _ = meta_kernels.select_shapes(q, k, kv_offsets, block_q, block_kv, max_seqlen_q, max_seqlen_kv,
                                                broadcast_q)
    params = BlockSelectParams(
        block_q=block_q, block_kv=block_kv, n_q_blocks=index_shape[2], n_kv_blocks=index_shape[3],
        keep_ratio=float(keep_ratio), top_k=top_k, causal=causal, window_left=window_left, window_right=window_right,
        broadcast_q=broadcast_q, always_local=always_local, max_seqlen_q=max_seqlen_q,
        max_seqlen_kv=max_seqlen_kv)
    return params, backend


def _select_problem(q, k, params: BlockSelectParams) -> Problem:
    return Problem(q.device.type, q.dtype, q.shape[-1], q.shape[1], k.shape[1], params.causal, params.window_left,
                   params.window_right, params.broadcast_q, False, device_index=q.device.index,
                   block_q=params.block_q, block_kv=params.block_kv)


@torch.library.custom_op(
    "jfa::select_kv_blocks", mutates_args=(),
    schema=("(Tensor q, Tensor k, Tensor? q_offsets, Tensor kv_offsets, SymInt max_seqlen_q, SymInt max_seqlen_kv, "
            "int block_q=128, int block_kv=128, float keep_ratio=0.5, int top_k=-1, bool causal=False, "
            "SymInt window_left=-1, SymInt window_right=-1, bool broadcast_q=False, bool always_local=True, "
            "str? backend=None) -> (Tensor, Tensor)"),
)
def select_kv_blocks(q: Tensor, k: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor,
                     *options) -> Tuple[Tensor, Tensor]:
    """Top-k KV blocks per (sequence, kv head, Q block): (kv_block_index [B, Hkv, NQB, NKB] int32,
    kv_block_count [B, Hkv, NQB] int32); see ``jfa_ops.select_kv_blocks``."""
    return select_body(q, k, q_offsets, kv_offsets, *options)


# JFA_SELECT_DIRECT (read once, at import; on since the H200 run of 2026-12-03, bench/NOTES.md v20; =0 turns it
# off): ``jfa_ops.select_kv_blocks``'s eager
# calls of plain tensors run ``select_body`` without torch's dispatcher (~110 of the call's ~280 us of Python on a
# CPU count: bench/NOTES.md "selection host path, helper selshare, stop 28"), with the call memo, and a selection
# whose backend checked the offsets covers them; the triton backend keeps its layouts (``KNOBS.sparse_select_layouts``,
# the same variable). Why: the bench's select rows timed this host path, not the GPU's work.
SELECT_DIRECT = os.environ.get("JFA_SELECT_DIRECT", "1") != "0"


def select_body(q: Tensor, k: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor, *options,
                memo: bool = False) -> Tuple[Tensor, Tensor]:
    """The op's body; ``jfa_ops.select_kv_blocks`` calls it directly under ``SELECT_DIRECT`` where
    ``attention.eager_direct`` holds (no dispatcher), with ``memo``: the checks, params and backend choice once per
    call signature (``_select_call``). Under ``SELECT_DIRECT`` a call whose backend checked the offsets on the device
    covers them (async mode, ``validation.cover``), as the attention op does: the next call with the same offsets,
    and the sparse forward after it, skip the check."""
    if memo:
        impl, params, checked = _select_call(q, k, q_offsets, kv_offsets, options)
    else:
        params, backend = _select_params(q, k, q_offsets, kv_offsets, *options)
        impl = select_backend(backend, _select_problem(q, k, params), family=SELECT_FAMILY)
        checked = None
    if check_offset_values(q, k, q_offsets, kv_offsets, *options[:2], impl.checks_offsets):  # max_seqlen_* required
        params = checked or dataclasses.replace(params, check_offsets=True)  # the backend checks them on the device
    result = impl.family(SELECT_FAMILY).forward(q, k, q_offsets, kv_offsets, params)
    if SELECT_DIRECT and params.check_offsets and validation_mode(q.device) == "async":
        validation.cover(q_offsets, kv_offsets, q.shape[0], k.shape[0], *options[:2])
    _remember_selection(*result)
    return result


# Selections (kv_block_index, kv_block_count) select_kv_blocks returned, while unmodified (their version counters):
# counts within the width and used ids ascending by construction, so block_sparse_attention's device check of those
# two (``_check_index_on_device``) skips them (sparse_attention passes every selection straight on). A table of
# ``validation.remember_unmodified``, as ``validation._COVERED``; tensor subclasses (FakeTensors) and inference tensors
# (no version counter) never count.
_SELECTIONS: dict = {}
_SELECTIONS_MAX = 16


def _selection_key(index: Tensor, count: Tensor) -> Optional[tuple]:
    if type(index) is not Tensor or type(count) is not Tensor or index.is_inference() or count.is_inference():
        return None
    return id(index), id(count)


def _remember_selection(index: Tensor, count: Tensor) -> None:
    key = _selection_key(index, count)
    if key is not None:
        validation.remember_unmodified(_SELECTIONS, _SELECTIONS_MAX, key, index, count)


def _is_selection(index: Tensor, count: Tensor) -> bool:
    """Whether (index, count) is an unmodified select_kv_blocks output."""
    key = _selection_key(index, count)
    return key is not None and validation.is_unmodified(_SELECTIONS, key, index, count)


# Memo of the direct path's metadata work per call signature, as ``attention._CALLS``: (backend, params, params with
# check_offsets). Why: the option and tensor checks, the params and the backend choice cost ~25 us of a selection's
# host path (CPU, launches stubbed: bench/NOTES.md "selection host path, helper selshare, stop 28"), and depend only
# on the key: each tensor's shape, dtype and device, the options with their types, $JFA_BACKEND and the registry.
# A call that fails a check is never stored. JFA_CALL_CACHE=0 turns it off with the attention op's.
_SELECT_CALLS: dict = {}


def _select_call(q, k, q_offsets, kv_offsets, options: tuple):
    key = None
    if _attention.CALL_CACHE:
        meta = _attention._metadata
        key = (meta(q), meta(k), meta(q_offsets), meta(kv_offsets), options, tuple(map(type, options)),
               os.environ.get("JFA_BACKEND"), registry_generation())
    call = _recall(_SELECT_CALLS, key)  # an unhashable option: a miss, and the checks say what is wrong with it
    if call is None:
        params, backend = _select_params(q, k, q_offsets, kv_offsets, *options)
        impl = select_backend(backend, _select_problem(q, k, params), family=SELECT_FAMILY)
        call = impl, params, dataclasses.replace(params, check_offsets=True)
        _remember(_SELECT_CALLS, key, call)
    return call


@select_kv_blocks.register_fake
def _select_kv_blocks_fake(q, k, q_offsets, kv_offsets, *options):
    params, _ = _select_params(q, k, q_offsets, kv_offsets, *options)
    index_shape, count_shape = meta_kernels.select_shapes(q, k, kv_offsets, params.block_q, params.block_kv,
                                                          *options[:2], params.broadcast_q)
    return (q.new_empty(index_shape, dtype=meta_kernels.INDEX_DTYPE),
            q.new_empty(count_shape, dtype=meta_kernels.INDEX_DTYPE))


# ------------------------------------------------------------------------------------- stage 2: sparse attention
_NUM_TENSOR_INPUTS = 7  # q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count


def _sparse_params(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, block_q, block_kv,
                   *options) -> Tuple[BlockSparseParams, Optional[str]]:
    """The attention op's checks and options, then the selection's metadata."""
    params, backend = _attention_params(q, k, v, q_offsets, kv_offsets, *options)
    meta_kernels.check_block_index(kv_block_index, kv_block_count, k, kv_offsets, block_q, block_kv)
    # Field by field, not dataclasses.asdict: that deep-copies, and a SymInt max_seqlen cannot be copied.
    fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    return BlockSparseParams(**fields, block_q=block_q, block_kv=block_kv), backend


INDEX_MESSAGE = ("jfa.block_sparse_attention: bad kv_block_count (past kv_block_index's width, or negative) or "
                 "kv_block_index (used ids not ascending)")


def _check_index_values(q, q_offsets, kv_offsets, kv_block_index, kv_block_count, params: BlockSparseParams):
    """Per JFA_VALIDATE: ``sync`` reads the values (``check_index_values``); the device modes check what the kernels
    rely on (``_check_index_on_device``; ids out of their sequence's range the kernels skip)."""
    mode = validation.validation_mode(q.device)
    if mode in validation.DEVICE_MODES:
        if not _is_selection(kv_block_index, kv_block_count):
            _check_index_on_device(kv_block_index, kv_block_count, mode)
        return
    if mode != "sync":
        return
    q_lengths = torch.tensor([q.shape[0]]) if params.broadcast_q else q_offsets.diff()
    check_index_values(q_lengths, kv_offsets.diff(), kv_block_index, kv_block_count, params.block_q, params.block_kv)


def _check_index_on_device(kv_block_index: Tensor, kv_block_count: Tensor, mode: str) -> None:
    """What the kernels walk a row by, checked with aten ops (no sync; ~8 launches): every count in [0, width] (a
    larger one read the next row's ids, or past the tensor), each row's used ids strictly ascending (the kernels find
    the masked blocks by the order)."""
    width = kv_block_index.shape[-1]
    ok = ((kv_block_count >= 0) & (kv_block_count <= width)).all()
    if width > 1:
        used = torch.arange(1, width, device=kv_block_index.device) < kv_block_count[..., None]
        ok = ok & ~(used & (kv_block_index[..., 1:] <= kv_block_index[..., :-1])).any()
    validation.device_flag(ok, mode, INDEX_MESSAGE)


def check_index_values(q_lengths: Tensor, kv_lengths: Tensor, kv_block_index: Tensor, kv_block_count: Tensor,
                       block_q: int, block_kv: int) -> None:
    """The selection's values on the host (a sync on CUDA): every Q block has a row of the index, counts fit, used
    ids name a block of their sequence, in ascending order. ``q_lengths``/``kv_lengths``: [B] (a broadcast q: its
    row count, once)."""
    q_lengths = q_lengths.cpu()
    needed = int(meta_kernels.num_blocks(q_lengths.max(), block_q)) if q_lengths.numel() else 0
    n_q_blocks, width = kv_block_index.shape[2], kv_block_index.shape[3]
    if needed > n_q_blocks:
        raise ValueError(f"kv_block_index has {n_q_blocks} Q blocks per sequence, but the longest q sequence needs "
                         f"{needed} of block_q={block_q}")
    count = kv_block_count.cpu()
    if ((count < 0) | (count > width)).any():
        raise ValueError(f"kv_block_count must be in [0, {width}] (kv_block_index's last dim), got "
                         f"{count.min().item()}..{count.max().item()}")
    kv_blocks = meta_kernels.num_blocks(kv_lengths.cpu(), block_kv)  # [B]
    index = kv_block_index.cpu()
    used = torch.arange(width) < count[..., None]
    bad = used & ((index < 0) | (index >= kv_blocks[:, None, None, None]))
    if bad.any():
        b, h, i, t = bad.nonzero()[0].tolist()
        raise ValueError(f"kv_block_index[{b}, {h}, {i}, {t}] = {index[b, h, i, t].item()} is not a KV block of "
                         f"sequence {b} (it has {kv_blocks[b].item()} of block_kv={block_kv})")
    # The GPU kernels find each row's masked and mask-free blocks by their order (block_sparse_fwd.py).
    unsorted = used[..., 1:] & (index[..., 1:] <= index[..., :-1])
    if unsorted.any():
        b, h, i, t = unsorted.nonzero()[0].tolist()
        raise ValueError(f"kv_block_index[{b}, {h}, {i}] must list its used ids in ascending order (as "
                         f"select_kv_blocks returns them), got {index[b, h, i, :count[b, h, i]].tolist()}")


@torch.library.custom_op(
    "jfa::block_sparse_attention", mutates_args=(),
    schema=(f"(Tensor q, Tensor k, Tensor v, Tensor? q_offsets, Tensor kv_offsets, Tensor kv_block_index, "
            f"Tensor kv_block_count, int block_q, int block_kv, {OPTIONS_SCHEMA}) -> (Tensor, Tensor)"),
)
def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor,
                           kv_block_index: Tensor, kv_block_count: Tensor, block_q: int, block_kv: int,
                           *options) -> Tuple[Tensor, Tensor]:
    """Attention restricted to the selected KV blocks: (out [T_q, Hq, D], lse [Hq, T_q] float32); see
    ``jfa_ops.block_sparse_attention``."""
    params, backend = _sparse_params(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, block_q,
                                     block_kv, *options)
    check_no_forward_ad(q, k, v)
    impl = select_backend(backend, Problem.of(q, k, params), family=SPARSE_FAMILY)
    check_offset_values(q, k, q_offsets, kv_offsets, params.max_seqlen_q, params.max_seqlen_kv)
    _check_index_values(q, q_offsets, kv_offsets, kv_block_index, kv_block_count, params)
    return impl.family(SPARSE_FAMILY).forward(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count,
                                              params)


@block_sparse_attention.register_fake
def _block_sparse_attention_fake(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, block_q, block_kv,
                                 *options):
    params, _ = _sparse_params(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, block_q, block_kv,
                               *options)
    out_shape, lse_shape = meta_kernels.attention_shapes(q, kv_offsets, params.broadcast_q)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op(
    "jfa::block_sparse_attention_backward", mutates_args=(),
    schema=(f"(Tensor grad_out, Tensor? grad_lse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
            f"Tensor? q_offsets, Tensor kv_offsets, Tensor kv_block_index, Tensor kv_block_count, int block_q, "
            f"int block_kv, {OPTIONS_SCHEMA}) -> (Tensor, Tensor, Tensor)"),
)
def block_sparse_attention_backward(grad_out: Tensor, grad_lse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor,
                                    out: Tensor, lse: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor,
                                    kv_block_index: Tensor, kv_block_count: Tensor, block_q: int, block_kv: int,
                                    *options) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv) of ``jfa::block_sparse_attention``; ``grad_lse`` None means lse was not used."""
    from_autograd = called_by_autograd(grad_out, q)
    params, backend = _sparse_backward_params(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets,
                                              kv_block_index, kv_block_count, block_q, block_kv, options)
    impl = select_backend(backend, Problem.of(q, k, params), family=SPARSE_FAMILY)
    if not from_autograd:  # offsets and an index its forward may never have seen: checked as the forward does
        check_offset_values(q, k, q_offsets, kv_offsets, params.max_seqlen_q, params.max_seqlen_kv)
        _check_index_values(q, q_offsets, kv_offsets, kv_block_index, kv_block_count, params)
    return impl.family(SPARSE_FAMILY).backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets,
                                               kv_block_index, kv_block_count, params)


def _sparse_backward_params(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, kv_block_index,
                            kv_block_count, block_q, block_kv, options):
    params, backend = _sparse_params(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, block_q,
                                     block_kv, *options)
    meta_kernels.check_attention_backward_args(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets,
                                               (params.window_left, params.window_right), params.broadcast_q)
    return params, backend


@block_sparse_attention_backward.register_fake
def _block_sparse_attention_backward_fake(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets,
                                          kv_block_index, kv_block_count, block_q, block_kv, *options):
    _sparse_backward_params(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, kv_block_index,
                            kv_block_count, block_q, block_kv, options)
    dq_shape, dk_shape, dv_shape = meta_kernels.attention_backward_shapes(q, k, v)
    return q.new_empty(dq_shape), k.new_empty(dk_shape), v.new_empty(dv_shape)


def _setup_context(ctx, inputs, output):
    q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count = inputs[:_NUM_TENSOR_INPUTS]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets, kv_block_index, kv_block_count)
    ctx.options = inputs[_NUM_TENSOR_INPUTS:]  # block_q, block_kv, then the attention options
    ctx.set_materialize_grads(False)  # grad_lse stays None when lse is unused: the backward skips that term


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, q_offsets, kv_offsets, kv_block_index, kv_block_count = ctx.saved_tensors
    grad_out, grad_lse = backward_grads(out, lse, grad_out, grad_lse)
    with autograd_backward_call(grad_out, q):
        dq, dk, dv = torch.ops.jfa.block_sparse_attention_backward(
            grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, kv_block_index, kv_block_count,
            *ctx.options)
    return (dq, dk, dv) + (None,) * (_NUM_TENSOR_INPUTS - 3 + len(ctx.options))


def _double_backward(ctx, *grads):
    raise RuntimeError("jfa.block_sparse_attention does not support double backward (gradients of its gradients)")


def _setup_backward_context(ctx, inputs, output):
    pass


block_sparse_attention.register_autograd(_backward, setup_context=_setup_context)
block_sparse_attention_backward.register_autograd(_double_backward, setup_context=_setup_backward_context)
# Under torch.autocast both stages see q/k (and v) in the region's dtype, as jfa::attention does: the selection scores
# the very inputs the sparse attention then attends over, so one region gives the selection and attention of a caller
# who cast first (sparse_attention included), and the GPU's selection reads half the bytes.
register_autocast("select_kv_blocks", num_inputs=2)
register_autocast("block_sparse_attention")
