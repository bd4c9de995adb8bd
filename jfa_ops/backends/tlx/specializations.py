"""Every TLX kernel specialization the backend ships, compiled ahead of time for sm_90 without a GPU.

``python tools/tlx_compile.py [--jobs N] [name substrings]`` (with triton 3.8 + triton-utlx importable) compiles each
for ``GPUTarget("cuda", 90, 32)`` and prints one JSON line per kernel: shared memory, registers and spills read from
the ptxas log (``compiled.n_regs`` exists only after loading on a GPU), and the setmaxnreg values in the PTX.
``tests/backends/test_tlx_compile.py`` runs it in the TLX venv and checks the numbers. The signatures mirror the launch
in ``attn_fwd.py`` (``attention_forward``); a drift shows up as a compile error there.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import sys
import tempfile
from typing import Dict, Iterator

from ..triton.specializations import exp2_of_fma_count
from .configs import (BACKWARD_ABLATION_RUNS, CAUSAL_ORDER_MIN_HEAD_DIM, MXFP8_ABLATION_RUNS, NUM_WARPS,
                      backward_ablation_mask, backward_ablation_names, bwd_config_v2, fwd_choices,
                      fwd_config, mxfp8_ablation_mask, mxfp8_ablation_names, mxfp8_fwd_config)

SM90_SHARED_MEMORY = 232448
_DTYPES = {"fp16": "fp16", "bf16": "bf16"}


@dataclasses.dataclass
class Specialization:
    name: str
    kernel: str  # attribute of the module below
    module: str
    signature: Dict[str, str]
    constexprs: Dict[str, object]
    attrs: Dict[tuple, list]
    num_warps: int
    num_stages: int


def _signature_attrs(names, types: Dict[str, str], constexprs: Dict[str, object], no_divisibility=()) -> tuple:
    """(signature, attrs) of a kernel with arguments ``names``: "constexpr" for those in ``constexprs``, else their
    type in ``types`` ("i32" if absent); divisibility by 16 (as the JIT infers it at launch) for the pointers and the
    strides, but for the strides named in ``no_divisibility``."""
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if signature[n].startswith("*") or (n.startswith("stride") and n not in no_divisibility)}
    return signature, attrs


def fwd_specialization(head_dim: int, dtype: str, causal: bool, has_left: bool = False, broadcast_q: bool = False,
                       from_offsets: bool = False, fma_softmax: bool = True, pipeline=None, kv_major=None,
                       uniform: bool = False, one_loop=None, sparse: bool = False, block_q: int = 128,
                       block_kv: int = 128, uniform_walk: bool = False, zigzag: bool = False,
                       walk_ahead: bool = False, dynamic: bool = False, sparse_ablate: int = 0,
                       sparse_peel: bool = False,
                       store_tma=None, first_unmasked=None) -> Specialization:
    """pipeline/kv_major/one_loop None: as ``configs.fwd_choices`` picks for this call (``uniform``: a dense
    batch). ``sparse``: the block-sparse forward (``attn_fwd.block_sparse_forward``: SPARSE, the v4 consumers) for a
    selection of block_q x block_kv blocks; ``uniform_walk`` its walk's bounds in uniform registers
    (``configs.SPARSE_FORWARD_UNIFORM_WALK``), ``walk_ahead`` the producer's walk one item ahead
    (``configs.SPARSE_FORWARD_WALK_AHEAD``). ``zigzag``: ``configs.FORWARD_ZIGZAG``'s work order (KV_MAJOR False,
    as ``attention_forward`` launches it). ``dynamic``: ``configs.FORWARD_DYNAMIC``'s items from the atomic counter
    (ATOMIC_WORK; the v3 consumers). ``sparse_ablate``: ``configs.SPARSE_FORWARD_ABLATE``
    (timing only). ``sparse_peel``: ``configs.SPARSE_FORWARD_PEEL`` (the consumers' walk peeled: SPARSE_PEEL).
    ``first_unmasked``: ``configs.SPARSE_FORWARD_FIRST_UNMASKED`` (each item's first block masked only where its tile
    needs it: FIRST_UNMASKED); None: as the launch picks (``configs.on_for_call``: causal or windowed sparse calls
    by default since stop 57; never under ``sparse_ablate``).
    ``store_tma``: out through the Q slot and a TMA store (STORE_TMA, desc_o); None: as the launch picks
    (``attn_fwd.store_tma``: ``configs.FORWARD_STORE_TMA`` on the v4 consumers), False: the pointer-store epilogue
    (``JFA_TLX_FWD_STORE_TMA=0``, ``store_tma_off_specializations``)."""
    from . import configs
    from .attn_fwd import NO_SELECTION, attn_fwd_tlx_kernel, store_tma as launch_store_tma

    cfg = fwd_config(head_dim)
    chosen = fwd_choices(cfg, causal or has_left, broadcast_q, uniform)
    pipeline = chosen[0] if pipeline is None else pipeline
    kv_major = False if zigzag else chosen[1] if kv_major is None else kv_major
    one_loop = True if sparse else chosen[2] if one_loop is None else one_loop
    store_tma = launch_store_tma(one_loop) if store_tma is None else store_tma
    if first_unmasked is None:
        first_unmasked = sparse and not sparse_ablate and configs.on_for_call(
            configs.SPARSE_FORWARD_FIRST_UNMASKED, causal or has_left)
    names = list(attn_fwd_tlx_kernel.arg_names)
    types = {"desc_q": f"tensordesc<{dtype}[{cfg.block_m // 2},{head_dim}]>",
             "desc_k": f"tensordesc<{dtype}[{cfg.block_n},{head_dim}]>",
             "desc_v": f"tensordesc<{dtype}[{cfg.block_n},{head_dim}]>",
             "Out": f"*{dtype}", "Lse": "*fp32", "Q_OFF": "*i32", "KV_OFF": "*i32", "TILE_SEQ": "*i32",
             "TILE_START": "*i32", "TILE_COUNT": "*i32", "WORK_COUNTER": "*i32", "qk_scale": "fp32",
             "desc_o": f"tensordesc<{dtype}[{cfg.block_m // 2},{head_dim}]>"}
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      NUM_BUFFERS_KV=cfg.num_buffers_kv, NUM_BUFFERS_Q=cfg.num_buffers_q, KV_MAJOR=kv_major,
                      HAS_LEFT=has_left, HAS_RIGHT=causal,
                      BROADCAST_Q=broadcast_q, FMA_SOFTMAX=fma_softmax, PIPELINE=pipeline, ATOMIC_WORK=dynamic,
                      TILES_FROM_OFFSETS=from_offsets, ONE_LOOP=one_loop, ZIGZAG=zigzag,
                      STORE_TMA=store_tma, **({} if store_tma else {"desc_o": None}))
    if sparse:
        constexprs.update(SPARSE=True, BLOCK_Q=block_q, BLOCK_KV=block_kv, UNIFORM_WALK=uniform_walk,
                          WALK_AHEAD=walk_ahead, SPARSE_ABLATE=sparse_ablate, SPARSE_PEEL=sparse_peel,
                          FIRST_UNMASKED=first_unmasked)
        types.update(BLOCK_INDEX="*i32", BLOCK_COUNT="*i32")
    else:
        constexprs.update({n: v for n, v in NO_SELECTION.items() if n.isupper()})  # BLOCK_INDEX=None, ..., SPARSE
    # the selection's strides are its widths (n_kv_blocks, ...): no divisibility to assume
    signature, attrs = _signature_attrs(names, types, constexprs, NO_SELECTION)
    name = f"{'sparse-' if sparse else ''}" \
           f"fwd-d{head_dim}-{dtype}-{'causal' if causal else 'full'}{'-left' if has_left else ''}" \
           f"{'-bcast' if broadcast_q else ''}{'-fromoffsets' if from_offsets else ''}" \
           f"{'' if fma_softmax else '-nofma'}{'-oneloop' if one_loop else '-pipelined' if pipeline else '-simple'}" \
           f"{'-storetma' if store_tma else ''}{'-zigzag' if zigzag else '' if kv_major else '-tilemajor'}" \
           f"{'-uniform' if uniform_walk else ''}" \
           f"{'-walkahead' if walk_ahead else ''}{'-dynamic' if dynamic else ''}" \
           f"{f'-ablate-nomask' if sparse_ablate == 1 else ''}{'-peel' if sparse_peel else ''}" \
           f"{'-firstunmasked' if first_unmasked else ''}" \
           f"{f'-blocks{block_q}x{block_kv}' if sparse and (block_q, block_kv) != (128, 128) else ''}"
    return Specialization(name, "attn_fwd_tlx_kernel", "jfa_ops.backends.tlx.attn_fwd", signature, constexprs, attrs,
                          NUM_WARPS, 1)


def mxfp8_fwd_specialization(head_dim: int, causal: bool, has_left: bool = False, broadcast_q: bool = False,
                             from_offsets: bool = False, kv_major: bool = True, out_dtype: str = "bf16",
                             fma_softmax: bool = True, qk_chunks: int = 1, ablate: int = 0,
                             factors_tma: bool = False, permuted_v_keys: bool = False,
                             rowsum_one_column: bool = False) -> Specialization:
    """The MXFP8 forward (``mxfp8_attn_fwd.attention_forward``): E4M3 descriptors, fp32 factors; ``qk_chunks``:
    ``configs.MXFP8_QK_CHUNKS``; ``ablate``: ``configs.MXFP8_ABLATE`` (timing only: wrong results);
    ``factors_tma``: ``configs.MXFP8_FACTORS_TMA`` (the factors by the producer's TMA: fp32 descriptors);
    ``permuted_v_keys``: ``configs.MXFP8_PERMUTED_V_KEYS`` (P into P V's wgmma without a layout conversion)."""
    from .mxfp8_attn_fwd import mxfp8_attn_fwd_tlx_kernel

    cfg = mxfp8_fwd_config(head_dim)
    names = list(mxfp8_attn_fwd_tlx_kernel.arg_names)
    types = {"desc_q": f"tensordesc<fp8e4nv[{cfg.block_m // 2},{head_dim}]>",
             "desc_k": f"tensordesc<fp8e4nv[{cfg.block_n},{head_dim}]>",
             "desc_vt": f"tensordesc<fp8e4nv[{head_dim},{cfg.block_n}]>",
             "QF": "*fp32", "KF": "*fp32", "VF": "*fp32", "Out": f"*{out_dtype}", "Lse": "*fp32", "Q_OFF": "*i32",
             "KV_OFF": "*i32", "TILE_SEQ": "*i32", "TILE_START": "*i32", "TILE_COUNT": "*i32",
             "WORK_COUNTER": "*i32", "qk_scale": "fp32"}
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      NUM_BUFFERS_KV=cfg.num_buffers_kv, NUM_BUFFERS_Q=cfg.num_buffers_q, HAS_LEFT=has_left,
                      HAS_RIGHT=causal, KV_MAJOR=kv_major, BROADCAST_Q=broadcast_q, FMA_SOFTMAX=fma_softmax,
                      ATOMIC_WORK=False,
                      TILES_FROM_OFFSETS=from_offsets, QK_CHUNKS=qk_chunks, ABLATE=ablate,
                      FACTORS_TMA=factors_tma, PERMUTED_V_KEYS=permuted_v_keys,
                      ROWSUM_ONE_COLUMN=rowsum_one_column)
    if factors_tma:
        types.update(desc_kf=f"tensordesc<fp32[1,{cfg.block_n}]>", desc_vf=f"tensordesc<fp32[1,{head_dim}]>")
    else:
        constexprs.update(desc_kf=None, desc_vf=None)
    signature, attrs = _signature_attrs(names, types, constexprs)
    name = f"mxfp8-fwd-d{head_dim}-{out_dtype}-{'causal' if causal else 'full'}{'-left' if has_left else ''}" \
           f"{'-bcast' if broadcast_q else ''}{'-fromoffsets' if from_offsets else ''}" \
           f"{'' if fma_softmax else '-nofma'}{'' if kv_major else '-tilemajor'}" \
           f"{f'-qk{qk_chunks}' if qk_chunks > 1 else ''}" \
           f"{'-ablate-' + mxfp8_ablation_names(ablate).replace(',', '-') if ablate else ''}" \
           f"{'-factorstma' if factors_tma else ''}{'-permkeys' if permuted_v_keys else ''}" \
           f"{'-onecolumn' if rowsum_one_column else ''}"
    return Specialization(name, "mxfp8_attn_fwd_tlx_kernel", "jfa_ops.backends.tlx.mxfp8_attn_fwd", signature,
                          constexprs, attrs, NUM_WARPS, 1)


def bwd_specialization(head_dim: int, dtype: str, causal: bool, has_left: bool = False,
                       broadcast_q: bool = False, from_offsets: bool = False,
                       dq_shared: bool = False, sparse: bool = False, block_q: int = 128,
                       block_kv: int = 128, stats_ahead: bool = False,
                       head_grouped: bool = False,
                       uniform_walk: bool = False, item_order: bool = False,
                       causal_order: bool = False, ablate: int = 0,
                       group_split: int = 1,
                       mxfp8: bool = False, kv_early: bool = False, peel: bool = False,
                       stats_smem: bool = False, store_tma: bool = False) -> Specialization:
    """``sparse``: the block-sparse backward (``attn_bwd.block_sparse_backward``: SPARSE on the v2 consumers) for a
    selection of block_q x block_kv blocks; stats_ahead: the lse/delta prefetch on the dense default
    (``configs.stats_ahead``); head_grouped, uniform_walk, item_order: helper sparsebwd2's
    (``configs.BACKWARD_HEAD_GROUP``, ``configs.SPARSE_BACKWARD_UNIFORM_WALK``, ``BACKWARD_ITEM_ORDER``: SNAKE, and
    ITEM_LIST when sparse); causal_order: helper tlxbwdcausal's dense per-item list (``configs.BACKWARD_CAUSAL_ORDER``:
    ITEM_LIST and SNAKE); ablate: ``configs.BACKWARD_ABLATE`` (timing only: wrong results); group_split: helper gqabwd's
    GQA groups in that many parts per kv head (``configs.BACKWARD_GQA_SPLIT``: GROUP_SPLIT, dK/dV as fp32 accumulators);
    mxfp8: the MXFP8 backward's kernel (``mxfp8_attn_bwd.py``, ``configs.MXFP8_BACKWARD``: P and dS rounded to MXFP8
    values); kv_early: helper window31's K/V freed before the dK/dV epilogue (``configs.BACKWARD_KV_EARLY``); peel:
    helper peel37's block loop peeled by stage, the mask-free bulk's loop without mask code (``configs.BACKWARD_PEEL``);
    stats_smem: helper lsedelta40's lse and delta loaded by the producer into shared memory with each Q/dO block
    (``configs.BACKWARD_STATS_SMEM``); store_tma: helper dkvtma40's dK/dV half-tiles by TMA stores
    (``configs.BACKWARD_STORE_TMA``, with kv_early)."""
    from .attn_bwd import NO_SELECTION, attn_bwd_tlx_kernel

    cfg = bwd_config_v2(head_dim, dq_shared)
    names = list(attn_bwd_tlx_kernel.arg_names)
    types = {"desc_q": f"tensordesc<{dtype}[{cfg.block_m},{head_dim}]>",
             "desc_do": f"tensordesc<{dtype}[{cfg.block_m},{head_dim}]>",
             "desc_k": f"tensordesc<{dtype}[{cfg.block_n // 2},{head_dim}]>",
             "desc_v": f"tensordesc<{dtype}[{cfg.block_n // 2},{head_dim}]>",
             "desc_dq": f"tensordesc<fp32[{cfg.block_m},{head_dim // cfg.dq_split}]>",
             "Lse": "*fp32", "Delta": "*fp32", "DK": f"*{dtype if group_split == 1 else 'fp32'}",
             "DV": f"*{dtype if group_split == 1 else 'fp32'}", "Q_OFF": "*i32",
             "KV_OFF": "*i32", "TILE_SEQ": "*i32", "TILE_START": "*i32", "TILE_COUNT": "*i32",
             "WORK_COUNTER": "*i32", "scale": "fp32", "qk_scale": "fp32"}
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, NUM_BUFFERS_Q=cfg.num_buffers_q,
                      NUM_BUFFERS_DQ=cfg.num_buffers_dq, DQ_SPLIT=cfg.dq_split, HAS_LEFT=has_left, HAS_RIGHT=causal,
                      BROADCAST_Q=broadcast_q, ATOMIC_WORK=False, TILES_FROM_OFFSETS=from_offsets,
                      DQ_SHARED=dq_shared, STATS_AHEAD=stats_ahead, HEAD_GROUPED=head_grouped,
                      UNIFORM_WALK=uniform_walk,
                      ITEM_LIST=(item_order and sparse) or causal_order, SNAKE=item_order or causal_order,
                      ABLATE=ablate, GROUP_SPLIT=group_split)
    constexprs["MXFP8"] = mxfp8
    constexprs["KV_EARLY"] = kv_early
    constexprs["PEEL"] = peel
    constexprs["STATS_SMEM"] = stats_smem
    if stats_smem:
        types.update(desc_lse=f"tensordesc<fp32[1,{cfg.block_m}]>", desc_delta=f"tensordesc<fp32[1,{cfg.block_m}]>")
    else:
        constexprs.update(desc_lse=None, desc_delta=None)
    constexprs["STORE_TMA"] = store_tma
    if store_tma:
        types.update(desc_dk=f"tensordesc<{dtype}[{cfg.block_n // 2},{head_dim}]>",
                     desc_dv=f"tensordesc<{dtype}[{cfg.block_n // 2},{head_dim}]>")
    else:
        constexprs.update(desc_dk=None, desc_dv=None)
    if constexprs["ITEM_LIST"]:
        types["TILE_HEAD"] = "*i32"
    else:
        constexprs["TILE_HEAD"] = None
    if sparse:
        constexprs.update(SPARSE=True, BLOCK_Q=block_q, BLOCK_KV=block_kv)
        types.update(Q_BLOCK_INDEX="*i32", Q_BLOCK_COUNT="*i32")
    else:
        constexprs.update({n: v for n, v in NO_SELECTION.items() if n.isupper()})  # Q_BLOCK_INDEX=None, ..., SPARSE
    # the transposed selection's strides are its widths (n_q_blocks, ...): no divisibility to assume
    signature, attrs = _signature_attrs(names, types, constexprs, NO_SELECTION)
    name = f"{'sparse-' if sparse else ''}" \
           f"bwd-d{head_dim}-{dtype}-{'causal' if causal else 'full'}{'-left' if has_left else ''}" \
           f"{'-bcast' if broadcast_q else ''}{'-fromoffsets' if from_offsets else ''}-v2" \
           f"{'-dqshared' if dq_shared else ''}{'-statsahead' if stats_ahead else ''}" \
           f"{'-headgroup' if head_grouped else ''}" \
           f"{'-uniform' if uniform_walk else ''}" \
           f"{'-itemorder' if item_order else ''}" \
           f"{'-causalorder' if causal_order else ''}" \
           f"{f'-split{group_split}' if group_split > 1 else ''}" \
           f"{f'-blocks{block_q}x{block_kv}' if sparse and (block_q, block_kv) != (128, 128) else ''}" \
           f"{'-ablate-' + backward_ablation_names(ablate).replace(',', '-') if ablate else ''}" \
           f"{'-mxfp8' if mxfp8 else ''}{'-kvearly' if kv_early else ''}{'-peel' if peel else ''}" \
           f"{'-statssmem' if stats_smem else ''}{'-storetma' if store_tma else ''}"
    return Specialization(name, "attn_bwd_tlx_kernel", "jfa_ops.backends.tlx.attn_bwd", signature, constexprs, attrs,
                          NUM_WARPS, 1)


def shipped_specializations() -> Iterator[Specialization]:
    """Every compiled variant the backend can launch, once each (by name: the variant lists below overlap where the
    per-call choices already pick a variant)."""
    seen = set()
    for spec in _specializations():
        if spec.name not in seen:
            seen.add(spec.name)
            yield spec


# The MXFP8 forward's exact options as the defaults set them (configs.MXFP8_ROWSUM_ONE_COLUMN: lq from one column, on
# since stop 51; MXFP8_PERMUTED_V_KEYS: V^T's keys permuted, off again since stop 53), for every shipped or ablated
# MXFP8 forward
MXFP8_EXACT_OPTIONS = dict(permuted_v_keys=False, rowsum_one_column=True)


def mxfp8_ablation_specializations() -> Iterator[Specialization]:
    """The MXFP8 forward's ablations (``configs.MXFP8_ABLATION_RUNS``; TIMING ONLY, wrong results) on the shapes
    tools/tlx_check.py mxfp8-ablation times: dense (kv-major) and broadcast-Q, with the default's factors by TMA and
    exact options (what that tool launches). Not shipped (CI does not compile them): ``tools/tlx_compile.py ablate``
    does."""
    for names in MXFP8_ABLATION_RUNS[1:]:
        mask = mxfp8_ablation_mask(names)
        yield mxfp8_fwd_specialization(128, False, ablate=mask, factors_tma=True, **MXFP8_EXACT_OPTIONS)
        yield mxfp8_fwd_specialization(128, False, broadcast_q=True, kv_major=False, ablate=mask, factors_tma=True,
                                       **MXFP8_EXACT_OPTIONS)


def backward_ablation_specializations() -> Iterator[Specialization]:
    """The TLX backward's ablations (``configs.BACKWARD_ABLATION_RUNS``; TIMING ONLY, wrong results) on the kernels
    tools/tlx_check.py backward-ablation times (D128 bf16, the default consumers): dense full, dense causal (the
    causal order's list) and jagged causal (tile-major). Not shipped: ``tools/tlx_compile.py bwd-ablate`` compiles
    them."""
    default = dict(dq_shared=True)
    for names in BACKWARD_ABLATION_RUNS[1:]:
        mask = backward_ablation_mask(names)
        yield bwd_specialization(128, "bf16", False, ablate=mask, **default)
        yield bwd_specialization(128, "bf16", True, causal_order=True, ablate=mask, **default)
        yield bwd_specialization(128, "bf16", True, ablate=mask, **default)


def sparse_ablation_specializations() -> Iterator[Specialization]:
    """The block-sparse forward's ablation (``configs.SPARSE_FORWARD_ABLATE`` = 1: the masked branch never taken;
    TIMING ONLY, wrong results) on the kernels tools/tlx_check.py sparse-ablation times (D128 bf16, the default walk
    and zigzag order, no walk ahead: the default since stop 38). Not shipped: ``tools/tlx_compile.py ablate``
    compiles them."""
    for causal in (False, True):
        yield fwd_specialization(128, "bf16", causal, sparse=True, uniform_walk=True, zigzag=True, sparse_ablate=1)


def sparse_peel_specializations() -> Iterator[Specialization]:
    """The block-sparse forward with its consumers' walk peeled (``configs.SPARSE_FORWARD_PEEL``, helper
    peeldiag38), beside the kernels tools/tlx_check.py sparse-ablation times (D128 bf16, the default walk and zigzag
    order; causal with and without the walk ahead, full without) and a left window (fp16, the two-round peel). Off by
    default, so not shipped: ``test_tlx_compile.py`` compiles them once."""
    return _sparse_knob_family(sparse_peel=True)


# The four block-sparse forwards an opt-in forward knob is compiled on (D128 bf16 with the default walk and zigzag
# order: full and causal, causal with the walk ahead; fp16 causal with a left window)
SPARSE_KNOB_KERNELS = (dict(head_dim=128, dtype="bf16", causal=False), dict(head_dim=128, dtype="bf16", causal=True),
                       dict(head_dim=128, dtype="bf16", causal=True, walk_ahead=True),
                       dict(head_dim=128, dtype="fp16", causal=True, has_left=True))


def _sparse_knob_family(**knob) -> Iterator[Specialization]:
    """``SPARSE_KNOB_KERNELS`` with ``knob`` (its ``fwd_specialization`` argument)."""
    for kernel in SPARSE_KNOB_KERNELS:
        yield fwd_specialization(**kernel, sparse=True, uniform_walk=True, zigzag=True, **knob)


def sparse_first_unmasked_specializations() -> Iterator[Specialization]:
    """``configs.SPARSE_FORWARD_FIRST_UNMASKED`` (helper itemcost, stop 56; "masked" by default since stop 57: the
    shipped causal and windowed block-sparse forwards carry FIRST_UNMASKED) the other way on ``SPARSE_KNOB_KERNELS``:
    on in the full one (``=1``), off in the three masked ones (``=0``). Not shipped: ``test_tlx_compile.py``
    compiles them once beside their shipped twins."""
    for kernel in SPARSE_KNOB_KERNELS:
        masked = kernel["causal"] or kernel.get("has_left", False)
        yield fwd_specialization(**kernel, sparse=True, uniform_walk=True, zigzag=True, first_unmasked=not masked)


# The v4 kernels with STORE_TMA off (JFA_TLX_FWD_STORE_TMA=0, the default before stop 40): the bench's dense D128
# kernel, D128 causal (tile-major), D64 causal (zigzag) and the block-sparse causal kernel (zigzag, uniform walk).
STORE_TMA_OFF_CASES = (dict(head_dim=128, dtype="bf16", causal=False, uniform=True),
                       dict(head_dim=128, dtype="bf16", causal=True),
                       dict(head_dim=64, dtype="bf16", causal=True, zigzag=True),
                       dict(head_dim=128, dtype="bf16", causal=True, sparse=True, zigzag=True, uniform_walk=True))


def store_tma_off_specializations() -> Iterator[Specialization]:
    """The off switch's kernels (``configs.FORWARD_STORE_TMA`` False, ``STORE_TMA_OFF_CASES``): not shipped (the
    default launches their "-storetma" twins), so ``test_tlx_compile.py`` compiles them once beside those, and they
    cannot rot."""
    for case in STORE_TMA_OFF_CASES:
        yield fwd_specialization(**case, store_tma=False)


def mxfp8_backward_specializations() -> Iterator[Specialization]:
    """The MXFP8 backward's kernels (``mxfp8_attn_bwd.py``, on by default since stop 28: ``configs.MXFP8_BACKWARD``,
    env JFA_TLX_MXFP8_BWD=0 for off) as the default configs launch them: D128 dense full, dense causal (the causal
    order's list), jagged causal (tile-major), broadcast-Q, fp16-free (the MX values are bf16); D64 causal (stats
    ahead). Kept out of ``shipped_specializations`` so CI compiles them once, in
    ``test_tlx_compile.py::test_mxfp8_backward_kernels_compile_within_the_ablation_budget`` (with their spill and
    instruction budgets); ``tools/tlx_compile.py mxfp8`` (any argument naming "mxfp8") compiles them."""
    default = dict(dq_shared=True, mxfp8=True)
    yield bwd_specialization(128, "bf16", False, **default)
    yield bwd_specialization(128, "bf16", True, causal_order=True, **default)
    yield bwd_specialization(128, "bf16", True, **default)
    yield bwd_specialization(128, "bf16", False, broadcast_q=True, **default)
    yield bwd_specialization(64, "bf16", True, stats_ahead=True, **default)


def _specializations() -> Iterator[Specialization]:
    for head_dim in (64, 128, 256):
        for causal in (False, True):
            yield fwd_specialization(head_dim, "bf16", causal)
    yield fwd_specialization(128, "fp16", True)
    yield fwd_specialization(128, "bf16", True, has_left=True)
    yield fwd_specialization(128, "bf16", False, has_left=True)
    yield fwd_specialization(128, "bf16", False, broadcast_q=True)
    yield fwd_specialization(128, "bf16", True, from_offsets=True)
    yield fwd_specialization(128, "bf16", False, fma_softmax=False)
    yield fwd_specialization(128, "bf16", True, uniform=True)  # dense causal: kv-major
    yield fwd_specialization(128, "bf16", False, pipeline=True, one_loop=False)  # configs.PIPELINE = True (tools)
    # The v3 consumers (configs.ONE_LOOP = False: broadcast-Q's default, JFA_TLX_FWD_ONE_LOOP=0) where the calls above
    # pick v4; the block-sparse forward (SPARSE, on the v4 consumers) for the same features, 128 x 128 blocks
    # (select_kv_blocks' default), and with its walk's bounds uniform (configs.SPARSE_FORWARD_UNIFORM_WALK)
    for variant in (dict(one_loop=False), dict(sparse=True), dict(sparse=True, uniform_walk=True)):
        for head_dim in (64, 128):
            for causal in (False, True):
                yield fwd_specialization(head_dim, "bf16", causal, **variant)
        yield fwd_specialization(128, "fp16", True, has_left=True, **variant)
        yield fwd_specialization(128, "bf16", False, broadcast_q=True, **variant)
        yield fwd_specialization(128, "bf16", True, from_offsets=True, fma_softmax=False, **variant)
        yield fwd_specialization(128, "bf16", True, uniform=True, **variant)  # kv-major
    for uniform_walk in (False, True):  # blocks of several tiles
        yield fwd_specialization(128, "bf16", True, sparse=True, block_q=256, block_kv=256, uniform_walk=uniform_walk)
    # helper sparsefwd's order for the block-sparse forward (configs.SPARSE_FORWARD_ZIGZAG) on its default walk, and
    # the producer's walk one item ahead (configs.SPARSE_FORWARD_WALK_AHEAD) in either order
    for head_dim in (64, 128):
        for causal in (False, True):
            yield fwd_specialization(head_dim, "bf16", causal, sparse=True, uniform_walk=True, zigzag=True)
            for zigzag in (False, True):
                yield fwd_specialization(head_dim, "bf16", causal, sparse=True, uniform_walk=True, zigzag=zigzag,
                                         walk_ahead=True)
    yield fwd_specialization(128, "fp16", True, has_left=True, sparse=True, uniform_walk=True, walk_ahead=True)
    # the default zigzag order with a left window, without and with the walk ahead (configs.sparse_walk_ahead's
    # "masked", helper sparse38; off by default since stop 38's H200 ablation)
    for walk_ahead in (False, True):
        yield fwd_specialization(128, "fp16", True, has_left=True, sparse=True, uniform_walk=True, zigzag=True,
                                 walk_ahead=walk_ahead)
    # helper tlxcausal's work order (configs.FORWARD_ZIGZAG: masked or jagged calls by default; D64/D128): the v4
    # consumers, and v3 for broadcast-Q
    # (GQA and the head group are runtime values: no kernel of their own)
    for head_dim in (64, 128):
        for causal in (False, True):
            yield fwd_specialization(head_dim, "bf16", causal, zigzag=True)
    yield fwd_specialization(128, "bf16", True, has_left=True, zigzag=True)
    yield fwd_specialization(128, "bf16", False, broadcast_q=True, zigzag=True)
    # helper bcast31's items from an atomic counter (configs.forward_dynamic: D256 by default since stop 33; the v3
    # consumers, tile list order): broadcast-Q (its pipelined v2 consumers), the unpipelined v3 with the masks (D128
    # fp16 causal + left window, JFA_TLX_FWD_ONE_LOOP=0), D256 causal and not
    yield fwd_specialization(128, "bf16", False, broadcast_q=True, dynamic=True)
    yield fwd_specialization(128, "fp16", True, has_left=True, one_loop=False, dynamic=True)
    yield fwd_specialization(256, "bf16", True, dynamic=True)
    yield fwd_specialization(256, "bf16", False, dynamic=True)
    # the MXFP8 forward (backend="tlx" for jfa_ops.mxfp8_attention): dense kv-major, masked/jagged tile-major; the
    # factors by the producer's TMA (configs.MXFP8_FACTORS_TMA, on since stop 49) and by global loads (its env off);
    # the default's exact options (MXFP8_EXACT_OPTIONS) with either
    exact = MXFP8_EXACT_OPTIONS
    for factors_tma in (True, False):
        for head_dim in (64, 128):
            yield mxfp8_fwd_specialization(head_dim, False, factors_tma=factors_tma, **exact)
            yield mxfp8_fwd_specialization(head_dim, True, kv_major=False, factors_tma=factors_tma, **exact)
        yield mxfp8_fwd_specialization(128, True, has_left=True, kv_major=False, out_dtype="fp16",
                                       factors_tma=factors_tma, **exact)
        yield mxfp8_fwd_specialization(128, False, broadcast_q=True, kv_major=False, factors_tma=factors_tma,
                                       **exact)
        yield mxfp8_fwd_specialization(128, True, from_offsets=True, kv_major=False, out_dtype="fp32",
                                       fma_softmax=False, factors_tma=factors_tma, **exact)
    # configs.MXFP8_QK_CHUNKS 2: S over the halves of head_dim promoted to fp32 (off by default; with a left window
    # D128 spills 1044 / 1004 B, not shipped as a check), with the default's factors by TMA and exact options
    for head_dim in (64, 128):
        yield mxfp8_fwd_specialization(head_dim, False, qk_chunks=2, factors_tma=True, **exact)
    yield mxfp8_fwd_specialization(128, True, kv_major=False, qk_chunks=2, factors_tma=True, **exact)
    # the backward (its v2 consumers: "-v2"), and with dQ split between them (configs.BACKWARD_DQ_SHARED)
    for variant in (dict(), dict(dq_shared=True)):
        for head_dim in (64, 128):
            for causal in (False, True):
                yield bwd_specialization(head_dim, "bf16", causal, **variant)
        yield bwd_specialization(128, "fp16", True, has_left=True, **variant)
        yield bwd_specialization(128, "bf16", False, broadcast_q=True, **variant)
        yield bwd_specialization(128, "bf16", True, from_offsets=True, **variant)
    # the block-sparse backward (SPARSE on the v2 consumers; dQ split as configs.BACKWARD_DQ_SHARED's default, and
    # one without), 128 x 128 blocks (select_kv_blocks' default) and blocks of several tiles
    for head_dim in (64, 128):
        for causal in (False, True):
            yield bwd_specialization(head_dim, "bf16", causal, dq_shared=True, sparse=True)
    yield bwd_specialization(128, "fp16", True, has_left=True, dq_shared=True, sparse=True)
    yield bwd_specialization(128, "bf16", False, broadcast_q=True, dq_shared=True, sparse=True)
    yield bwd_specialization(128, "bf16", True, from_offsets=True, dq_shared=True, sparse=True)
    yield bwd_specialization(128, "bf16", True, dq_shared=True, sparse=True, block_q=256, block_kv=256)
    yield bwd_specialization(128, "bf16", True, sparse=True)
    # helper sparsebwd2's experiments on the default (v2 + dQ split): configs.BACKWARD_HEAD_GROUP (dense and
    # block-sparse) and SPARSE_BACKWARD_UNIFORM_WALK (block-sparse; head groups ride on the uniform walk there:
    # attention_backward)
    sparse_v2 = dict(dq_shared=True, sparse=True)
    dense_v2 = {d: dict(dq_shared=True, stats_ahead=d <= 64) for d in (64, 128)}  # configs.stats_ahead
    for head_dim in (64, 128):
        for causal in (False, True):
            yield bwd_specialization(head_dim, "bf16", causal, **dense_v2[head_dim], head_grouped=True)
            for knobs in (dict(uniform_walk=True), dict(head_grouped=True, uniform_walk=True)):
                yield bwd_specialization(head_dim, "bf16", causal, **sparse_v2, **knobs)
    for head_dim in (64, 128):
        for causal in (False, True):
            yield bwd_specialization(head_dim, "bf16", causal, **dense_v2[head_dim], item_order=True)
            yield bwd_specialization(head_dim, "bf16", causal, **sparse_v2, uniform_walk=True, item_order=True)
    # helper tlxbwdcausal's dense per-item list (configs.BACKWARD_CAUSAL_ORDER: masked dense calls of head dims >=
    # CAUSAL_ORDER_MIN_HEAD_DIM)
    for head_dim in (64, 128):
        if head_dim >= CAUSAL_ORDER_MIN_HEAD_DIM:
            yield bwd_specialization(head_dim, "bf16", True, **dense_v2[head_dim], causal_order=True)
    yield bwd_specialization(128, "fp16", True, has_left=True, **dense_v2[128], causal_order=True)
    # helper gqabwd's GQA groups in parts (configs.BACKWARD_GQA_SPLIT, under the snake): the bench's Hq16:Hkv2 causal
    # row takes 4 parts
    yield bwd_specialization(128, "bf16", True, **dense_v2[128], item_order=True, group_split=4)
    # helper gqarule's rule (JFA_TLX_BWD_GQA_SPLIT=auto) also splits D64 calls (the bench's GQA batch at D64: 4 parts)
    yield bwd_specialization(64, "bf16", True, **dense_v2[64], item_order=True, group_split=4)
    # helper window31's K/V freed before the dK/dV epilogue (configs.BACKWARD_KV_EARLY, dense): the default's kernels
    # at D64/D128, the causal order's, its feature case with a left window (the bench's window row), broadcast-Q,
    # from offsets; the same set again with helper dkvtma40's dK/dV half-tiles by TMA stores (configs.
    # BACKWARD_STORE_TMA, on KV_EARLY's epilogue; broadcast-Q its target)
    for tma in (dict(), dict(store_tma=True)):
        for head_dim in (64, 128):
            for causal in (False, True):
                yield bwd_specialization(head_dim, "bf16", causal, **dense_v2[head_dim], kv_early=True, **tma)
        yield bwd_specialization(128, "bf16", True, **dense_v2[128], causal_order=True, kv_early=True, **tma)
        yield bwd_specialization(128, "fp16", True, has_left=True, **dense_v2[128], causal_order=True, kv_early=True,
                                 **tma)
        yield bwd_specialization(128, "bf16", False, broadcast_q=True, **dense_v2[128], kv_early=True, **tma)
        yield bwd_specialization(128, "bf16", True, from_offsets=True, **dense_v2[128], kv_early=True, **tma)
    # helper peel37's block loop peeled per stage (configs.BACKWARD_PEEL, dense): the default's kernels (KV_EARLY on)
    # at D64/D128, the causal order's and its feature case with a left window (masked lead and tail blocks)
    for head_dim in (64, 128):
        for causal in (False, True):
            yield bwd_specialization(head_dim, "bf16", causal, **dense_v2[head_dim], kv_early=True, peel=True)
    yield bwd_specialization(128, "bf16", True, **dense_v2[128], causal_order=True, kv_early=True, peel=True)
    yield bwd_specialization(128, "fp16", True, has_left=True, **dense_v2[128], causal_order=True, kv_early=True,
                             peel=True)
    # helper lsedelta40's lse / delta through shared memory (configs.BACKWARD_STATS_SMEM, dense; instead of STATS_AHEAD):
    # the default's kernels (KV_EARLY on) at D64/D128, the causal order's and its feature case with a left window
    for head_dim in (64, 128):
        for causal in (False, True):
            yield bwd_specialization(head_dim, "bf16", causal, dq_shared=True, kv_early=True, stats_smem=True)
    yield bwd_specialization(128, "bf16", True, dq_shared=True, causal_order=True, kv_early=True, stats_smem=True)
    yield bwd_specialization(128, "fp16", True, has_left=True, dq_shared=True, causal_order=True, kv_early=True,
                             stats_smem=True)
    default = dict(head_grouped=True, uniform_walk=True)  # the block-sparse default (configs): the feature cases
    yield bwd_specialization(128, "fp16", True, has_left=True, **sparse_v2, **default)
    yield bwd_specialization(128, "bf16", False, broadcast_q=True, **sparse_v2, **default)
    yield bwd_specialization(128, "bf16", True, from_offsets=True, **sparse_v2, **default)
    # the block-sparse default's kernel (the group order's: the uniform walk under the item order) on 256 blocks
    yield bwd_specialization(128, "bf16", True, **sparse_v2, block_q=256, block_kv=256, uniform_walk=True,
                             item_order=True)
    # helper sparsebwd45's KV_EARLY on the block-sparse default's kernel (configs.SPARSE_BACKWARD_KV_EARLY; STORE_TMA
    # rides on it as on the dense path)
    for tma in (dict(), dict(store_tma=True)):
        for head_dim in (64, 128):
            for causal in (False, True):
                yield bwd_specialization(head_dim, "bf16", causal, **sparse_v2, uniform_walk=True, item_order=True,
                                         kv_early=True, **tma)
    # STATS_AHEAD forced at D128 (configs.BACKWARD_STATS_AHEAD=True) and at D64 without KV_EARLY
    lab = dict(dq_shared=True)
    for causal in (False, True):
        yield bwd_specialization(128, "bf16", causal, stats_ahead=True, **lab)
    yield bwd_specialization(64, "bf16", True, stats_ahead=True, **lab)


def compile_sm90(spec: Specialization, loop_counts: bool = False) -> dict:
    """Compile for sm_90 (no GPU needed) and report shared memory, registers, spills and setmaxnreg values; the
    SASS block loops' counts (``block_loop_counts``) for block-sparse, ablation and delta-early backward kernels,
    or any kernel with ``loop_counts``."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = getattr(importlib.import_module(spec.module), spec.kernel)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # the ptxas log (-v) is printed when dump_ptxas_log is on
        compiled = triton.compile(ASTSource(fn=kernel, signature=spec.signature,
                                            constexprs=spec.constexprs, attrs=spec.attrs),
                                  target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
    text = log.getvalue()
    regs = re.search(r"Used (\d+) registers", text)
    spill_stores = re.search(r"(\d+) bytes spill stores", text)
    spill_loads = re.search(r"(\d+) bytes spill loads", text)
    ptx = compiled.asm["ptx"]
    return dict(name=spec.name, shared=compiled.metadata.shared, num_warps=compiled.metadata.num_warps,
                registers=int(regs.group(1)) if regs else None,
                spill_stores=int(spill_stores.group(1)) if spill_stores else None,
                spill_loads=int(spill_loads.group(1)) if spill_loads else None,
                setmaxnreg=sorted(set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx))),
                target=re.search(r"\.target (\S+)", ptx).group(1), wgmma_overlap=wgmma_overlap(ptx),
                named_barrier_arrives=len(re.findall(r"\bbar\.arrive\b", ptx)),
                wgmma_register_a=len(re.findall(r"wgmma\.mma_async[^;]*\},\s*\{", ptx)),  # A from registers
                **(dict(e4m3_mma_counts(sass_of(compiled.asm["cubin"])), exp2_of_fma=exp2_of_fma_count(ptx))
                   if "mxfp8" in spec.name else {}),
                **(block_loop_counts(sass_of(compiled.asm["cubin"]))
                   if loop_counts or spec.name.startswith("sparse-") or spec.name.startswith("bwd-") and (
                       "-ablate-" in spec.name or "-split" in spec.name
                       or "-mxfp8" in spec.name) else {}),
                # GROUP_SPLIT's partial dK/dV adds (per consumer thread: 2 x [64, D] / 128 threads each)
                **({"red_f32": len(re.findall(r"red\.[a-z.]*global\.add\.f32", ptx))} if "-split" in spec.name
                   else {}))


def sass_of(cubin: bytes) -> str:
    """The SASS of a cubin (``nvdisasm -c`` from triton's bundled CUDA tools)."""
    import os
    import subprocess

    import triton.backends.nvidia as nvidia

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([os.path.join(os.path.dirname(nvidia.__file__), "bin", "nvdisasm"), "-c", f.name],
                              capture_output=True, text=True, check=True).stdout


def innermost_loops(sass: str, loop_ops: tuple) -> tuple:
    """``(insts, loops)``: the SASS's instructions ``[(opcode, operands)]`` and its innermost loops (a backward branch
    to a label above it) holding an opcode that starts with one of ``loop_ops``, in code order, each ``(first, last,
    skipped)``: ``skipped`` the indices a forward branch inside the loop jumps over (the masked branch), so the rest
    is the loop's straight path. The branches after the last EXIT (out-of-line waits jumping back) are no loops."""
    labels, insts = {}, []  # label -> index of the next instruction; (opcode, text)
    for line in sass.splitlines():
        m = re.match(r"(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(insts)
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?(\S+)(.*?);", line)
        if m:
            insts.append((m.group(1), m.group(2)))
    last_exit = max((i for i, (op, _) in enumerate(insts) if op == "EXIT"), default=len(insts))

    def target(i):
        m = re.search(r"`\((\.L_x_\d+)\)", insts[i][1]) if insts[i][0].startswith("BRA") else None
        return labels.get(m.group(1)) if m else None

    loops = [(target(i), i) for i in range(last_exit) if target(i) is not None and target(i) <= i]
    loops = [(a, b) for a, b in loops if any(op.startswith(loop_ops) for op, _ in insts[a:b])]
    loops = sorted((a, b) for a, b in loops if not any(a <= a2 and b2 <= b and (a2, b2) != (a, b) for a2, b2 in loops))
    return insts, [(a, b, {j for i in range(a, b) if target(i) is not None and i < target(i) <= b
                           for j in range(i + 1, target(i))}) for a, b in loops]


def block_loop_counts(sass: str) -> dict:
    """The consumers' block loops in the SASS: the innermost loops (a backward branch to a label above it) that
    hold wgmma, one per consumer warpgroup, in code order. Per loop: its instructions, those of its straight path
    (skipping what a forward branch inside the loop jumps over: the masked branch), R2UR (a value moved from a vector
    to a uniform register: a wgmma descriptor built per lane) and spill instructions (STL/LDL); and R2UR in the
    whole kernel; wgmma (HGMMA), MUFU, SHFL (cross-lane row reductions) and PRMT (byte permutes) of the straight
    path; global loads (LDG: lse, delta) of the straight path after its first wgmma wait (S's), whose latency then
    lands on the block's path, and its spill instructions; FSEL of the straight path (the masked blocks' dS guard,
    if-converted, issues there: helper peel37), its integer ALU instructions (helper desc38) and its global or
    generic loads (LDG, LD: lse and delta in the default backward; helper lsedelta40). The branches after
    the last EXIT (out-of-line waits jumping back) are no loops."""
    insts, loops = innermost_loops(sass, ("HGMMA", "QGMMA"))
    counts = dict(block_loop_instructions=[], block_loop_path=[], block_loop_r2ur=[], block_loop_spill_ops=[],
                  block_loop_hgmma=[], block_loop_mufu=[], block_loop_shfl=[], block_loop_prmt=[],
                  block_loop_ldg_after_wait=[], block_loop_path_spill_ops=[], block_loop_path_fsel=[],
                  block_loop_path_int_alu=[], block_loop_path_ldg=[])
    for a, b, skipped in loops:
        body = insts[a:b + 1]
        counts["block_loop_instructions"].append(len(body))
        counts["block_loop_path"].append(b + 1 - a - len(skipped))
        counts["block_loop_r2ur"].append(sum(op.startswith("R2UR") for op, _ in body))
        counts["block_loop_spill_ops"].append(sum(op.startswith(("STL", "LDL")) for op, _ in body))
        path = [op for j, (op, _) in enumerate(body, a) if j not in skipped]
        counts["block_loop_hgmma"].append(sum(op.startswith("HGMMA") for op in path))
        counts["block_loop_mufu"].append(sum(op.startswith("MUFU") for op in path))
        counts["block_loop_shfl"].append(sum(op.startswith("SHFL") for op in path))
        counts["block_loop_prmt"].append(sum(op.startswith("PRMT") for op in path))
        first_wait = next((i for i, op in enumerate(path) if op.startswith("WARPGROUP.DEPBAR")), len(path))
        counts["block_loop_ldg_after_wait"].append(sum(op.startswith("LDG") for op in path[first_wait:]))
        counts["block_loop_path_spill_ops"].append(sum(op.startswith(("STL", "LDL")) for op in path))
        # global and generic loads (long-scoreboard waits: helper lsedelta40, tools/sass_loads.py)
        counts["block_loop_path_ldg"].append(sum(op.startswith("LDG") or op == "LD" or op.startswith("LD.")
                                                 for op in path))
        counts["block_loop_path_fsel"].append(sum(op.startswith("FSEL") for op in path))
        # integer ALU on the vector datapath (tools/sass_mix.py's class): descriptors built per lane land here
        counts["block_loop_path_int_alu"].append(sum(bool(re.match(
            r"IMAD|IADD|LEA|LOP|SHF|IMNMX|SEL|MOV|IABS|VIADD|VIMNMX|SGXT|BMSK", op)) for op in path))
    return dict(counts, sass_r2ur=sum(op.startswith("R2UR") for op, _ in insts))


def e4m3_mma_counts(sass: str) -> dict:
    """SASS of an MXFP8 kernel: E4M3 x E4M3 wgmma (``QGMMA``) with the A operand from shared memory (S = Q K^T)
    and from registers (P V), and spill instructions (STL/LDL)."""
    return dict(qgmma_e4m3_smem_a=len(re.findall(r"QGMMA\.\S+\.E4M3\.E4M3 R\d+, gdesc", sass)),
                qgmma_e4m3_reg_a=len(re.findall(r"QGMMA\.\S+\.E4M3\.E4M3 R\d+, R\d+, gdesc", sass)),
                sass_spill_ops=len(re.findall(r"\b(?:STL|LDL)\b", sass)))


def wgmma_overlap(ptx: str) -> bool:
    """Whether some wgmma group is issued while an earlier one is still in flight (a commit followed by another
    wgmma before any wait): the intra-warpgroup pipelining. Triton's pipeliner (asyncLaunchDots) puts a wait 0 right
    after every dot of a loop whose result is not only its loop-carried accumulator, undoing it (the TLX tutorial's
    Hopper FA included) unless the loop has num_stages=0."""
    committed = False
    for op in re.findall(r"wgmma\.(commit_group|wait_group|mma_async)", ptx):
        if op == "mma_async" and committed:
            return True
        committed = op == "commit_group" or (committed and op != "wait_group")
    return False


# ``main``'s opt-in sets: a name filter containing the word adds these off-by-default specializations (in this order)
OPT_IN_SETS = {"ablate": (mxfp8_ablation_specializations, backward_ablation_specializations,
                          sparse_ablation_specializations),
               "mxfp8": (mxfp8_backward_specializations,),
               "peel": (sparse_peel_specializations,),
               "firstunmasked": (sparse_first_unmasked_specializations,)}


def _candidates(words=()) -> list:
    """The specializations ``main`` picks from: the shipped ones, then the opt-in sets (``OPT_IN_SETS``) of
    ``words``, in that table's order."""
    specs = list(shipped_specializations())
    for word, sets in OPT_IN_SETS.items():
        if word in words:
            specs += [spec for make in sets for spec in make()]
    return specs


def _compile_index(index: int, words=()) -> dict:
    """Worker: compile ``_candidates(words)[index]`` in a fresh cache (so ptxas runs and logs)."""
    import triton

    triton.knobs.nvidia.dump_ptxas_log = True
    spec = _candidates(words)[index]
    with tempfile.TemporaryDirectory() as cache:
        triton.knobs.cache.dir = cache
        try:
            return compile_sm90(spec)
        except Exception as e:  # report and go on: one line per kernel
            return dict(name=spec.name, error=f"{type(e).__name__}: {str(e)[-2000:]}")


def main(argv=None) -> int:
    """One JSON line per specialization (``--jobs N`` compiles N at a time; other arguments: substrings of the names
    to compile, or a whole name with a "$" after it; one containing a word of ``OPT_IN_SETS`` adds its sets:
    "ablate" the ablations, "mxfp8" the MXFP8 backward's kernels, "peel" the peeled block-sparse forwards,
    "firstunmasked" the block-sparse forwards with the first block's mask the other way than the default); exit 1
    if any failed to compile (the error is in its line)."""
    import functools
    from concurrent.futures import ProcessPoolExecutor

    args = list(sys.argv[1:] if argv is None else argv)
    jobs = 1
    if "--jobs" in args:
        i = args.index("--jobs")
        jobs = int(args[i + 1])
        del args[i:i + 2]
    words = tuple(w for w in OPT_IN_SETS if any(w in a for a in args))
    names = [s.name for s in _candidates(words)]
    indices = [i for i, n in enumerate(names) if not args or any(n == a[:-1] if a.endswith("$") else a in n
                                                                 for a in args)]
    failed = 0
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for row in pool.map(functools.partial(_compile_index, words=words), indices):
            failed += "error" in row
            print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
