"""Every kernel specialization the backend ships, as (kernel, signature, constexprs, options) for ahead-of-time
compilation for one GPU architecture (``tests/backends/test_arch_compile.py`` compiles them for sm_80, sm_86, sm_89
and sm_90 on a machine without a GPU). Each uses the launch config ``configs.table_config`` picks for that
architecture's shared-memory limit, and TMA (tensor descriptors) only on sm_90, as ``attn_fwd.use_tma`` decides.

The signatures mirror the launch sites in ``attn_fwd.py`` / ``attn_bwd.py``; a drift shows up as a compile error.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterator, List
from unittest import mock

import torch

from .configs import KNOBS, SHARED_MEMORY_LIMITS, KernelConfig, head_dim_bucket, table_config

_TRITON_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclasses.dataclass
class Specialization:
    name: str  # human-readable id
    kernel: str  # attribute of the module below
    module: str
    signature: Dict[str, str]
    constexprs: Dict[str, object]
    attrs: Dict[tuple, list]  # what a real launch infers: 16-byte aligned pointers, strides divisible by 16
    num_warps: int
    num_stages: int


def _sig(names: List[str], types: Dict[str, str]) -> Dict[str, str]:
    return {n: types.get(n, "i32") for n in names}


def _signature(fn, types: Dict[str, str], constexprs: Dict[str, object], strides: bool = False, odd_strides=()):
    """(signature, attrs) of kernel ``fn`` as a launch specializes it: each argument typed by ``types`` (i32 where it
    is absent), the constexprs marked; pointers divisible by 16, and with ``strides`` the strides too, except
    ``odd_strides``."""
    names = list(fn.arg_names)
    sig = _sig(names, types)
    sig.update({c: "constexpr" for c in constexprs})
    odd = set(odd_strides)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or (strides and n.startswith("stride") and n not in odd)}
    return sig, attrs


def _attn_constexprs(head_dim, cfg: KernelConfig, has_left, has_right, broadcast_q, dtype):
    block_d = head_dim_bucket(head_dim)
    return dict(HEAD_DIM=head_dim, BLOCK_D=block_d, PAD_D=block_d != head_dim, BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, HAS_LEFT=has_left, HAS_RIGHT=has_right, BROADCAST_Q=broadcast_q,
                DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32")


def specialization(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool, has_left: bool = False,
                   broadcast_q: bool = False, atomic: bool = False, fused_dq=None, atomic_work=None,
                   from_offsets: bool = False, check: bool = False, cc: int = 90) -> Specialization:
    """fused_dq (dkdv only): the pass with dQ atomics (TMA reductions where attn_fwd.use_tma holds on sm_90), else
    the one that leaves dQ to the dq kernel; None: what non-deterministic mode runs (configs.KNOBS).
    atomic_work: work items from an atomic counter (schedule "atomic"); None: as configs.KNOBS says.
    from_offsets (fwd, dkdv, dq): the one-wave schedule (work items mapped to slots in the kernel); check (fwd): with
    the folded offset check. cc: the target architecture (80, 86, 89 or 90: configs.SHARED_MEMORY_LIMITS)."""
    if fused_dq is None:
        fused_dq = KNOBS.bcast_fused_dq if broadcast_q else KNOBS.bwd_fused_dq
    from . import attn_bwd, attn_fwd

    dt = _TRITON_DTYPE[dtype]
    bucket = head_dim_bucket(head_dim)
    ptr = {"Q": f"*{dt}", "K": f"*{dt}", "V": f"*{dt}", "Out": f"*{dt}", "DOut": f"*{dt}", "DK": f"*{dt}",
           "DV": f"*{dt}", "Lse": "*fp32", "Delta": "*fp32", "GradLse": "*fp32", "Q_OFF": "*i32", "KV_OFF": "*i32",
           "TILE_SEQ": "*i32", "TILE_START": "*i32", "TILE_COUNT": "*i32", "qk_scale": "fp32", "scale": "fp32",
           "DQ": "*fp32" if broadcast_q else f"*{dt}", "WORK_COUNTER": "*i32", "FLAG": "*i32", "ZEROED": "*fp32"}
    name = f"{kernel}-d{head_dim}-{dt}-{'causal' if causal else 'full'}{'-left' if has_left else ''}" \
           f"{'-bcast' if broadcast_q else ''}{'-atomic' if atomic else ''}" \
           f"{'-fuseddq' if kernel == 'dkdv' and fused_dq else ''}{'-atomicwork' if atomic_work else ''}" \
           f"{'-fromoffsets' if from_offsets else ''}{'-check' if check else ''}"
    if kernel == "finalize":
        fn = attn_bwd.attn_bwd_dq_finalize_kernel
        ptr.update(DQ_ACC="*fp32", DQ=f"*{dt}")
        constexprs = dict(BLOCK=attn_bwd.FINALIZE_BLOCK)
        module, attr, warps, stages = attn_bwd.__name__, "attn_bwd_dq_finalize_kernel", attn_bwd.FINALIZE_WARPS, 1
    elif kernel == "delta":
        fn = attn_bwd.attn_bwd_delta_kernel
        constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=bucket, PAD_D=bucket != head_dim,
                          BLOCK_T=attn_bwd.DELTA_BLOCK_T, HAS_GRAD_LSE=True, ZERO=broadcast_q)
        module, attr, warps, stages = attn_bwd.__name__, "attn_bwd_delta_kernel", 4, 1
    else:
        cfg = table_config(kernel, head_dim, dtype, causal, SHARED_MEMORY_LIMITS[cc])
        constexprs = _attn_constexprs(head_dim, cfg, has_left, causal, broadcast_q, dtype)
        if atomic_work is None:
            atomic_work = (KNOBS.fwd_schedule if kernel == "fwd" else KNOBS.bwd_schedule) == "atomic"
        constexprs["ATOMIC_WORK"] = atomic_work
        constexprs["TILES_FROM_OFFSETS"] = from_offsets
        # as attn_fwd.use_tma decides (sm_90+ only)
        use_tma = (cc >= 90 and dtype != torch.float32 and not constexprs["PAD_D"]
                   and head_dim <= attn_fwd.TMA_MAX_HEAD_DIM)
        if kernel == "fwd":
            fn, module, attr = attn_fwd.attn_fwd_kernel, attn_fwd.__name__, "attn_fwd_kernel"
            constexprs["USE_TMA"] = use_tma
            if constexprs["USE_TMA"]:
                ptr["K"] = ptr["V"] = f"tensordesc<{dt}[{cfg.block_n},{head_dim}]>"
            constexprs.update(FMA_SOFTMAX=True, KV_MAJOR=KNOBS.fwd_kv_major, CHECK_OFFSETS=check)
        elif kernel == "dkdv":
            fn, module, attr = attn_bwd.attn_bwd_dkdv_kernel, attn_bwd.__name__, "attn_bwd_dkdv_kernel"
            tma = fused_dq and KNOBS.bwd_dq_tma and use_tma
            qdo_tma = KNOBS.bwd_tma and use_tma
            constexprs.update(FUSE_DQ=fused_dq, DQ_TMA=tma, KV_MAJOR=KNOBS.bwd_kv_major, QDO_TMA=qdo_tma,)
            if qdo_tma:
                ptr["Q"] = ptr["DOut"] = f"tensordesc<{dt}[{cfg.block_m},{head_dim}]>"
            ptr["DQ"] = f"tensordesc<fp32[{cfg.block_m},{head_dim}]>" if tma else (
                "*fp32" if fused_dq else f"*{dt}")  # unfused: a dummy pointer (dk)
        else:
            fn, module, attr = attn_bwd.attn_bwd_dq_kernel, attn_bwd.__name__, "attn_bwd_dq_kernel"
            constexprs.update(ATOMIC=atomic, KV_TMA=KNOBS.bwd_tma and use_tma)
            if constexprs["KV_TMA"]:
                ptr["K"] = ptr["V"] = f"tensordesc<{dt}[{cfg.block_n},{head_dim}]>"
        warps, stages = cfg.num_warps, cfg.num_stages
    sig, attrs = _signature(fn, ptr, constexprs, strides=True)
    return Specialization(name, attr, module, sig, constexprs, attrs, warps, stages)


def tile_specialization(block: int, has_lo: bool, has_hi: bool, selected_block: int = 0) -> Specialization:
    """The tile-list kernel (scheduling.tile_slots_kernel) as build_tiles launches it; selected_block > 0: with a
    block-sparse selection's cost (``build_tiles``' ``selected``)."""
    from . import scheduling

    fn = scheduling.tile_slots_kernel
    constexprs = dict(BLOCK=block, HAS_LO=has_lo, HAS_HI=has_hi, CHECK=has_hi, CHUNK=scheduling.SLOT_CHUNK,
                      SEL_BLOCK=selected_block)
    sig, attrs = _signature(fn, {"OFF_S": "*i32", "OFF_O": "*i32", "SLOTS": "*i32", "COST": "*i64",
                                 "TILE_COUNT": "*i32", "FLAG": "*i32", "SEL_COUNT": "*i32"}, constexprs)
    name = f"tiles-b{block}{'-lo' if has_lo else ''}{'-hi' if has_hi else ''}" \
           f"{f'-selected{selected_block}' if selected_block else ''}"
    return Specialization(name, "tile_slots_kernel", scheduling.__name__, sig, constexprs, attrs, 4, 1)


def transpose_specialization(width: int = 128) -> Specialization:
    """The selection transpose of the block-sparse backward (block_sparse_bwd.transpose_selection_kernel)."""
    from . import block_sparse_bwd

    fn = block_sparse_bwd.transpose_selection_kernel
    constexprs = dict(BLOCK_J=block_sparse_bwd.TRANSPOSE_BLOCK_J, BLOCK_W=width)
    sig, attrs = _signature(fn, {n: "*i32" for n in ("INDEX", "COUNT", "Q_INDEX", "Q_COUNT")}, constexprs)
    return Specialization(f"bs_transpose-w{width}", "transpose_selection_kernel", block_sparse_bwd.__name__, sig,
                          constexprs, attrs, 4, 1)


def transpose_scatter_specializations() -> Iterator[Specialization]:
    """The scatter transpose's two kernels (``KNOBS.sparse_transpose_scatter``: block_sparse_bwd.transpose_mark_kernel
    and transpose_lists_kernel) as transpose_selection_scatter launches them; no dots, any architecture."""
    from . import block_sparse_bwd as bwd

    constexprs = dict(ROWS=bwd.SCATTER_ROWS, BLOCK_W=bwd.SCATTER_W)
    sig, attrs = _signature(bwd.transpose_mark_kernel, {n: "*i32" for n in ("INDEX", "COUNT")} | {"MARK": "*i8"},
                            constexprs)
    yield Specialization("bs_transpose-scatter-mark", "transpose_mark_kernel", bwd.__name__, sig, constexprs, attrs,
                         4, 1)
    constexprs = dict(BLOCK_J=bwd.LISTS_J, CHUNK=bwd.LISTS_CHUNK)
    sig, attrs = _signature(bwd.transpose_lists_kernel, {"MARK": "*i8", "Q_INDEX": "*i32", "Q_COUNT": "*i32"},
                            constexprs)
    yield Specialization("bs_transpose-scatter-lists", "transpose_lists_kernel", bwd.__name__, sig, constexprs, attrs,
                         4, 1)


def rank_specialization() -> Specialization:
    """The list-ordering kernel (scheduling.rank_tiles_kernel) as build_tiles launches it."""
    from . import scheduling

    fn = scheduling.rank_tiles_kernel
    constexprs = dict(BLOCK=scheduling.RANK_BLOCK, CHUNK=scheduling.RANK_CHUNK)
    sig, attrs = _signature(fn, {"SLOTS": "*i32", "COST": "*i64", "ORDERED": "*i32"}, constexprs)
    return Specialization("rank-tiles", "rank_tiles_kernel", scheduling.__name__, sig, constexprs, attrs, 4, 1)


def causal_list_specializations() -> Iterator[Specialization]:
    """The causal order's device-built list (``block_sparse_bwd.causal_item_list_device``, tlx
    ``configs.BACKWARD_CAUSAL_ORDER_JAGGED``) as it launches its two kernels (16 kv heads)."""
    from . import block_sparse_bwd as bsb

    for kernel, pointers, constexprs in (
            ("causal_streams_kernel", ("Q_OFF", "OUT"),
             dict(BLOCK=bsb.CAUSAL_STREAMS_BLOCK, CHUNK=bsb.CAUSAL_STREAMS_CHUNK, HEADS=16)),
            ("causal_items_kernel", ("TILE_SEQ", "TILE_START", "OUT"),
             dict(BLOCK=bsb.CAUSAL_ITEMS_BLOCK, CHUNK=bsb.CAUSAL_ITEMS_CHUNK))):
        fn = getattr(bsb, kernel)
        sig, attrs = _signature(fn, {n: "*i32" for n in pointers}, constexprs)
        yield Specialization(f"causal-list-{kernel.split('_')[1]}", kernel, bsb.__name__, sig, constexprs, attrs, 4,
                             1)


def sectioned_list_specializations() -> Iterator[Specialization]:
    """The sectioned sparse list built on the device (``block_sparse_bwd.sectioned_item_list_device``, tlx
    ``configs.SPARSE_BACKWARD_SECTIONS_DEVICE``) as it launches its two kernels, with 32-bit keys (the bench's
    batch) and 64-bit ones."""
    from . import block_sparse_bwd as bsb

    for kernel, pointers, block, chunk in (
            ("section_keys_kernel", ("TILE_SEQ", "TILE_START", "Q_OFF", "Q_COUNT", "OUT"), bsb.SECTION_KEYS_BLOCK,
             bsb.SECTION_KEYS_CHUNK),
            ("section_places_kernel", ("TILE_SEQ", "TILE_START", "OUT"), bsb.SECTION_PLACES_BLOCK,
             bsb.SECTION_PLACES_CHUNK)):
        for wide in (False, True):
            constexprs = dict(BLOCK=block, CHUNK=chunk, WIDE=wide)
            fn = getattr(bsb, kernel)
            sig, attrs = _signature(fn, {n: "*i32" for n in pointers}, constexprs)
            yield Specialization(f"sectioned-list-{kernel.split('_')[1]}-{64 if wide else 32}", kernel, bsb.__name__,
                                 sig, constexprs, attrs, 4, 1)


_BLOCK_SPARSE_KERNELS = {
    "bs_fwd": ("block_sparse_fwd", "block_sparse_fwd_kernel", "fwd"),
    "bs_dkdv": ("block_sparse_bwd", "block_sparse_dkdv_kernel", "dkdv"),
    "bs_dq": ("block_sparse_bwd", "block_sparse_dq_kernel", "dq"),
    "bs_pool": ("block_sparse_select", "block_pool_kernel", None),
    "bs_pool_pair": ("block_sparse_select", "block_pool_pair_kernel", None),
    "bs_pool_pair_skip": ("block_sparse_select", "block_pool_pair_skip_kernel", None),
    "bs_select": ("block_sparse_select", "block_select_kernel", None),
    "bs_select_overlap": ("block_sparse_select", "block_select_overlap_kernel", None),
    "bs_select_overlap_skip": ("block_sparse_select", "block_select_overlap_kernel", None),
}


def block_sparse_specialization(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool,
                                broadcast_q: bool = False, block_q: int = 128, block_kv: int = 128,
                                from_offsets: bool = False, tma=None, wide=None, stages3=None, select_rows=False,
                                pool_fanout=False, one_pass=None, pool_whole_block=False, select_visible=False,
                                select_grouped=False, fp32_rn=False, pool_stream=False, select_radix=False,
                                select_fill: int = 0, cc: int = 90) -> Specialization:
    """A block-sparse kernel (``_BLOCK_SPARSE_KERNELS``) as its launch site in block_sparse_*.py launches it: the
    dense kernel's config for the attention kernels, tiles clamped to the blocks, the work schedule of
    ``configs.KNOBS``; from_offsets: the one-wave schedule (no sorted list); tma: TMA where it applies (None: as
    ``KNOBS.sparse_tma`` says); wide: the causal forward on the non-causal config (None: as
    ``KNOBS.sparse_causal_fwd_wide`` says); stages3: the dK/dV pass with 3 stages (None: as
    ``KNOBS.sparse_dkdv_stages3`` says; ``block_sparse_bwd.dkdv_stages``); select_rows: the selection's rows in registers
    (``KNOBS.sparse_select_rows``); pool_fanout: the pooling's 64-ary slot search
    (``KNOBS.sparse_pool_fanout``); pool_whole_block: a block's whole tile per load
    (``KNOBS.sparse_pool_whole_block``); pool_stream: POOL_STREAM_HEADS kv heads per pooling program
    (``KNOBS.sparse_pool_stream``; kernel "bs_pool_pair": Q and K in one launch, ``KNOBS.sparse_pool_one_launch``);
    select_visible: the select kernel over a row's visible blocks only (``KNOBS.sparse_select_visible``);
    select_grouped: 4 Q blocks per select program (``KNOBS.sparse_select_grouped``, with select_rows); fp32_rn:
    fp32 scores with mul.rn products (``KNOBS.sparse_select_fp32_rn``); select_radix: the top-k of a row of 128
    blocks by a radix select (``KNOBS.sparse_select_radix``, scratch rows); one_pass:
    both stage split points in one pass over the ids (None: as ``KNOBS.sparse_one_pass_split`` says); select_fill:
    the select kernel's FILL (``KNOBS.sparse_select_fill``: 1, 2 with the offsets check's flag)."""
    import importlib

    from . import block_sparse_select

    module_name, attr, config_kernel = _BLOCK_SPARSE_KERNELS[kernel]
    module = importlib.import_module(f"{__package__}.{module_name}")
    fn = getattr(module, attr)
    dt = _TRITON_DTYPE[dtype]
    bucket = head_dim_bucket(head_dim)
    hd = dict(HEAD_DIM=head_dim, BLOCK_D=bucket, PAD_D=bucket != head_dim)
    ptr = {n: f"*{dt}" for n in ("Q", "K", "V", "Out", "DOut", "DK", "DV", "DQ", "X", "XK")}
    ptr.update({n: "*i32" for n in ("Q_OFF", "KV_OFF", "OFFSETS", "BLOCK_INDEX", "BLOCK_COUNT", "Q_BLOCK_INDEX",
                                    "Q_BLOCK_COUNT", "KEEP", "Count", "Index", "TILE_SEQ", "TILE_START", "TILE_COUNT",
                                    "WORK_COUNTER", "Q_SLOT_SEQ", "SLOT_SEQ", "FLAG", "OFF",
                                    "OTHER_OFF")})
    ptr.update({n: "*fp32" for n in ("Lse", "Delta", "Pooled", "PooledK", "PQ", "PK", "Scores")})
    ptr.update(qk_scale="fp32", scale="fp32")
    warps, stages = 4, 1
    if kernel in ("bs_pool", "bs_pool_pair", "bs_pool_pair_skip"):
        constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=bucket, BLOCK=block_q, ROWS=block_sparse_select.POOL_ROWS,
                          CHECK=True, SEARCH_STEPS=1 if pool_fanout else 0, WHOLE_BLOCK=pool_whole_block,
                          HEADS=block_sparse_select.POOL_STREAM_HEADS if pool_stream else 1)
        if kernel == "bs_pool":
            constexprs["WRITE_SEQ"] = True
        else:
            constexprs.update(BLOCK_KV=block_kv, KV_SEARCH_STEPS=constexprs["SEARCH_STEPS"],
                              KV_WHOLE_BLOCK=pool_whole_block)
        if kernel == "bs_pool_pair_skip":  # KNOBS.sparse_pool_skip: the select kernel's geometry
            constexprs.update(HAS_LEFT=False, HAS_RIGHT=causal, ALWAYS_LOCAL=True)
    elif kernel in ("bs_select_overlap", "bs_select_overlap_skip"):  # KNOBS.sparse_select_overlap (SKIP: pool skip)
        pool = block_sparse_specialization("bs_pool_pair", head_dim, dtype, causal, broadcast_q, block_q, block_kv,
                                           pool_fanout=pool_fanout, pool_stream=pool_stream, cc=cc)
        select = block_sparse_specialization("bs_select", head_dim, dtype, causal, broadcast_q, block_q, block_kv,
                                             select_visible=select_visible, fp32_rn=fp32_rn,
                                             select_radix=select_radix, select_fill=select_fill, cc=cc)
        constexprs = dict(pool.constexprs)
        from .block_sparse_select import OVERLAP_SELECT_RENAMES

        for name, value in select.constexprs.items():  # the overlap kernel's names for the select's own
            constexprs[OVERLAP_SELECT_RENAMES.get(name, name)] = value
        constexprs["SKIP"] = kernel.endswith("_skip")
        constexprs["ORDER"] = False  # KNOBS.sparse_select_overlap_tail, off
        ptr.update(STATE="*i64", FLAGS="*i32")
        if select.signature["Scores"] == "*fp64":
            ptr["Scores"] = "*fp64"
    elif kernel == "bs_select":
        if not (select_rows or fp32_rn):  # fp64 scores in the scratch row (rows in registers: pooled_q, untouched)
            ptr["Scores"] = "*fp64"
        constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=bucket, BLOCK_Q=block_q, BLOCK_KV=block_kv,
                          BLOCK_J=block_sparse_select.SELECT_BLOCK_J, BLOCK_C=block_sparse_select.SELECT_BLOCK_C,
                          HAS_LEFT=False, HAS_RIGHT=causal, ALWAYS_LOCAL=True, BROADCAST_Q=broadcast_q,
                          ROW_IN_REGISTERS=select_rows, BLOCK_DC=block_sparse_select.SELECT_BLOCK_DC,
                          VISIBLE_RANGE=select_visible,
                          GROUP=block_sparse_select.SELECT_GROUP if select_grouped else 1,
                          SEARCH_STEPS=1 if select_grouped and not broadcast_q else 0,
                          SCORES=(block_sparse_select.SCORES_FP32_RN if fp32_rn
                                  else block_sparse_select.SCORES_FP64).value,
                          RADIX_WIDTH=block_sparse_select.SELECT_BLOCK_C if select_radix else 0,
                          HEADS=block_sparse_select.SELECT_RADIX_HEADS.value if select_radix else 1,
                          FILL=select_fill)
    else:
        wide = (KNOBS.sparse_causal_fwd_wide if wide is None else wide) and kernel == "bs_fwd" and causal
        cfg = table_config(config_kernel, head_dim, dtype, causal and not wide, SHARED_MEMORY_LIMITS[cc])
        constexprs = dict(**hd, BLOCK_M=min(cfg.block_m, block_q), BLOCK_N=min(cfg.block_n, block_kv),
                          BLOCK_Q=block_q, BLOCK_KV=block_kv, HAS_LEFT=False, HAS_RIGHT=causal,
                          BROADCAST_Q=broadcast_q, DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32")
        schedule = KNOBS.fwd_schedule if kernel == "bs_fwd" else KNOBS.bwd_schedule
        from . import attn_fwd  # TMA as block_sparse_*.py decide it (attn_fwd.use_tma: sm_90+ only)
        tma = ((KNOBS.sparse_tma if tma is None else tma) and cc >= 90 and dtype != torch.float32
               and not hd["PAD_D"] and head_dim <= attn_fwd.TMA_MAX_HEAD_DIM)
        rows = constexprs["BLOCK_M"] if kernel == "bs_dkdv" else constexprs["BLOCK_N"]
        for name in (("Q", "DOut") if kernel == "bs_dkdv" else ("K", "V")) if tma else ():
            ptr[name] = f"tensordesc<{dt}[{rows},{head_dim}]>"
        if kernel == "bs_fwd":
            constexprs.update(FMA_SOFTMAX=True, KV_MAJOR=KNOBS.fwd_kv_major, USE_TMA=tma)
        elif kernel == "bs_dkdv":
            constexprs.update(KV_MAJOR=KNOBS.bwd_kv_major, QDO_TMA=tma)
        else:
            constexprs["KV_TMA"] = tma
        constexprs.update(ATOMIC_WORK=schedule == "atomic", TILES_FROM_OFFSETS=from_offsets,
                          ONE_PASS_SPLIT=KNOBS.sparse_one_pass_split if one_pass is None else one_pass)
        warps, stages = cfg.num_warps, cfg.num_stages
        if ((KNOBS.sparse_dkdv_stages3 if stages3 is None else stages3) and kernel == "bs_dkdv"
                and dtype != torch.float32 and bucket <= 128 and cc >= 90):
            stages = 3
    sig, attrs = _signature(fn, ptr, constexprs, strides=True)
    name = f"{kernel}-d{head_dim}-{dt}-{'causal' if causal else 'full'}{'-bcast' if broadcast_q else ''}" \
           f"-b{block_q}x{block_kv}{'-fromoffsets' if from_offsets else ''}{'-wide' if wide else ''}" \
           f"{'-tma' if constexprs.get('USE_TMA', constexprs.get('QDO_TMA', constexprs.get('KV_TMA'))) else ''}" \
           f"{'-stages3' if kernel == 'bs_dkdv' and stages == 3 else ''}{'-rows' if select_rows else ''}" \
           f"{'-fanout' if pool_fanout else ''}{'-onepass' if constexprs.get('ONE_PASS_SPLIT') else ''}" \
           f"{'-whole' if pool_whole_block else ''}{'-visible' if select_visible else ''}" \
           f"{'-grouped' if select_grouped else ''}{'-fp32rn' if fp32_rn else ''}{'-stream' if pool_stream else ''}" \
           f"{'-radix' if select_radix else ''}{f'-fill{select_fill}' if select_fill else ''}"
    return Specialization(name, attr, module.__name__, sig, constexprs, attrs, warps, stages)


def block_sparse_specializations() -> Iterator[Specialization]:
    """The block-sparse kernels CI compiles for sm_90: bf16 head_dim 128 (the bench's problem), causal and not,
    broadcast Q, a padded head dim and 64-row blocks; the selection kernels."""
    for kernel in ("bs_fwd", "bs_dkdv", "bs_dq"):
        for causal in (False, True):
            yield block_sparse_specialization(kernel, 128, torch.bfloat16, causal)
        yield block_sparse_specialization(kernel, 128, torch.bfloat16, False, broadcast_q=True)
        yield block_sparse_specialization(kernel, 72, torch.float16, True, block_q=64, block_kv=64)
        yield block_sparse_specialization(kernel, 128, torch.bfloat16, True, from_offsets=True)
        yield block_sparse_specialization(kernel, 128, torch.bfloat16, True, tma=True)  # KNOBS.sparse_tma
    yield block_sparse_specialization("bs_fwd", 128, torch.bfloat16, True, wide=True)  # KNOBS.sparse_causal_fwd_wide
    for kernel in ("bs_fwd", "bs_dkdv", "bs_dq"):  # KNOBS.sparse_one_pass_split
        yield block_sparse_specialization(kernel, 128, torch.bfloat16, True, one_pass=True)
    for causal in (False, True):  # KNOBS.sparse_dkdv_stages3
        yield block_sparse_specialization("bs_dkdv", 128, torch.bfloat16, causal, stages3=True)
    yield tile_specialization(128, False, True, selected_block=128)  # the block-sparse lists' cost
    yield transpose_specialization(128)
    yield transpose_specialization(256)
    yield from transpose_scatter_specializations()  # KNOBS.sparse_transpose_scatter
    for kernel in ("bs_pool", "bs_select"):
        yield block_sparse_specialization(kernel, 128, torch.bfloat16, True)
    yield block_sparse_specialization("bs_pool", 128, torch.bfloat16, True, pool_fanout=True)
    yield block_sparse_specialization("bs_select", 128, torch.bfloat16, False, broadcast_q=True)
    for causal in (False, True):  # KNOBS.sparse_select_rows
        yield block_sparse_specialization("bs_select", 128, torch.bfloat16, causal, select_rows=True)
    # KNOBS.sparse_pool_whole_block, KNOBS.sparse_select_visible (selection v5)
    yield block_sparse_specialization("bs_pool", 128, torch.bfloat16, True, pool_fanout=True, pool_whole_block=True)
    for rows in (False, True):
        yield block_sparse_specialization("bs_select", 128, torch.bfloat16, True, select_rows=rows, select_visible=True)
    for causal, bcast in ((False, False), (True, False), (False, True)):  # KNOBS.sparse_select_grouped
        yield block_sparse_specialization("bs_select", 128, torch.bfloat16, causal, broadcast_q=bcast,
                                          select_rows=True, select_visible=True, select_grouped=True)
    for rows in (False, True):  # KNOBS.sparse_select_fp32_rn
        yield block_sparse_specialization("bs_select", 128, torch.bfloat16, True, select_rows=rows, fp32_rn=True)
    yield block_sparse_specialization("bs_select", 128, torch.bfloat16, True, select_rows=True, select_visible=True,
                                      select_grouped=True, fp32_rn=True)
    # the default select kernel since 2026-12-03 (bench/NOTES.md v20): the visible range with fp32 mul.rn scores
    for causal, bcast in ((False, False), (True, False), (False, True)):
        yield block_sparse_specialization("bs_select", 128, torch.bfloat16, causal, broadcast_q=bcast,
                                          select_visible=True, fp32_rn=True)
    # KNOBS.sparse_select_radix on the default select kernel (fp32 mul.rn scores, the visible range)
    for causal, bcast in ((False, False), (True, False), (False, True)):
        yield block_sparse_specialization("bs_select", 128, torch.bfloat16, causal, broadcast_q=bcast,
                                          select_visible=True, fp32_rn=True, select_radix=True)
    # KNOBS.sparse_select_fill on the default select kernel: 2 where the call checks its offsets (jagged)
    for causal, bcast, fill in ((True, False, 1), (True, False, 2), (False, False, 1), (False, True, 1)):
        yield block_sparse_specialization("bs_select", 128, torch.bfloat16, causal, broadcast_q=bcast,
                                          select_visible=True, fp32_rn=True, select_radix=True, select_fill=fill)
    # selection pool v6: KNOBS.sparse_pool_stream, KNOBS.sparse_pool_one_launch (alone and with the stream)
    yield block_sparse_specialization("bs_pool", 128, torch.bfloat16, True, pool_fanout=True, pool_stream=True)
    for stream in (False, True):
        yield block_sparse_specialization("bs_pool_pair", 128, torch.bfloat16, True, pool_fanout=True,
                                          pool_stream=stream)
    for causal in (False, True):  # KNOBS.sparse_pool_skip (on the streaming one-launch pooling)
        yield block_sparse_specialization("bs_pool_pair_skip", 128, torch.bfloat16, causal, pool_fanout=True,
                                          pool_stream=True)
    yield from select_overlap_specializations()


def select_overlap_specializations(cc: int = 90) -> Iterator[Specialization]:
    """KNOBS.sparse_select_overlap's one launch (pools and select) on the default pooling and select kernels: causal
    and not, with the pool skip, FILL 2 (jagged, the offsets checked), broadcast Q (FILL 1)."""
    for kernel, causal, bcast in (("bs_select_overlap", True, False), ("bs_select_overlap", False, False),
                                  ("bs_select_overlap_skip", True, False), ("bs_select_overlap_skip", False, False),
                                  ("bs_select_overlap", False, True)):
        spec = block_sparse_specialization(kernel, 128, torch.bfloat16, causal, broadcast_q=bcast, pool_fanout=True,
                                           pool_stream=True, select_visible=True, fp32_rn=True, select_radix=True,
                                           select_fill=1 if bcast else 2, cc=cc)
        yield spec
        if kernel.endswith("_skip"):  # KNOBS.sparse_select_overlap_tail's longest-first order (off)
            yield dataclasses.replace(spec, name=spec.name + "-order", constexprs={**spec.constexprs, "ORDER": True})


def arch_specializations(cc: int) -> Iterator[Specialization]:
    """What CI compiles for architecture ``cc``: everything shipped for sm_90 (``shipped_specializations``); for
    sm_8x (no TMA, no warp specialization) a representative subset to keep CI time down: each distinct 16-bit
    launch config (kernel x head-dim bucket x causal, compiled in fp16; bf16 has the same tiles), the broadcast-Q
    variants (fused dQ by red.global atomics) and, on sm_86 (the smallest budget, like sm_89's), the fp32 entries."""
    if cc >= 90:
        yield from shipped_specializations()
        yield from mxfp8_specializations()
        return
    seen = set()
    for kernel in ("fwd", "dkdv", "dq"):
        for d in (16, 64, 128, 256):
            for causal in (False, True):
                spec = specialization(kernel, d, torch.float16, causal, cc=cc)
                key = (kernel, d, spec.constexprs["BLOCK_M"], spec.constexprs["BLOCK_N"], spec.num_warps,
                       spec.num_stages)
                if key not in seen:  # causal changes no buffer, only the masked stages
                    seen.add(key)
                    yield spec
        for d in (128, 256):  # broadcast-Q: dK/dV with the fused dQ tile, dQ by atomics
            yield specialization(kernel, d, torch.bfloat16, False, broadcast_q=True, atomic=kernel == "dq", cc=cc)
        if cc == 86:
            yield specialization(kernel, 128, torch.float32, False, cc=cc)
    yield from transpose_scatter_specializations()  # no dots: the same code on every architecture


def shipped_specializations(quick: bool = False) -> Iterator[Specialization]:
    """Each config-table entry for 16-bit dtypes (bucket x causal), the bf16/fp32 variants of the big buckets, and
    the extra flag combinations (windows, broadcast Q, atomics, head-dim padding)."""
    kernels = ("fwd", "dkdv", "dq")
    head_dims = (16, 64, 128, 256) if not quick else (128,)
    for kernel in kernels:
        for d in head_dims:
            for causal in (False, True):
                yield specialization(kernel, d, torch.float16, causal)
        yield specialization(kernel, 128, torch.bfloat16, True)
        yield specialization(kernel, 72, torch.bfloat16, True, has_left=True)  # padded head dim, window
        yield specialization(kernel, 128, torch.bfloat16, False, broadcast_q=True, atomic=kernel == "dq")
        if not quick:
            yield specialization(kernel, 128, torch.float32, False)
    yield specialization("dq", 128, torch.bfloat16, True, broadcast_q=True, atomic=False)
    for causal in (False, True):  # opt-in fused dQ without broadcast (KNOBS.bwd_fused_dq), TMA and red.global
        yield specialization("dkdv", 128, torch.bfloat16, causal, fused_dq=True)
    yield specialization("dkdv", 72, torch.float16, False, fused_dq=True)
    yield specialization("dkdv", 128, torch.bfloat16, False, broadcast_q=True, fused_dq=False)  # deterministic
    yield specialization("finalize", 128, torch.bfloat16, False)
    yield specialization("delta", 128, torch.bfloat16, False)
    yield specialization("delta", 40, torch.float16, False)
    yield specialization("delta", 128, torch.bfloat16, False, broadcast_q=True)  # zeroes the fp32 dQ accumulator
    for has_lo, has_hi in ((False, False), (False, True), (True, False), (True, True)):  # full, causal q/kv, window
        yield tile_specialization(128, has_lo, has_hi)
    yield tile_specialization(64, False, True)
    yield rank_specialization()
    yield from causal_list_specializations()
    yield from sectioned_list_specializations()
    for kernel in ("fwd", "dkdv", "dq"):  # the one-wave schedule (no sorted list), the forward with its check
        yield specialization(kernel, 128, torch.bfloat16, True, from_offsets=True, check=kernel == "fwd")
    for kernel in ("fwd", "dkdv", "dq"):  # the "atomic" work schedule (configs.KNOBS.fwd_schedule / bwd_schedule)
        yield specialization(kernel, 128, torch.bfloat16, True, atomic_work=True)
    if not quick:
        yield from block_sparse_specializations()


def mxfp8_specializations() -> Iterator[Specialization]:
    """The MXFP8 kernels as ``mxfp8_quantize.quantize``, ``mxfp8_attn_fwd.attention_forward`` and
    ``mxfp8_attn_bwd.attention_backward`` launch them (sm_89+: E4M3 operands): quantize per block shape (bf16 read as
    int16 bits), the forward and both backward kernels per head dim, causal or not; the TLX forward's re-basing and
    the TLX MXFP8 backward's dequantize to bf16 (``jfa_ops.backends.mxfp8_bwd``), or its one-pass MX values."""
    from . import attn_fwd, mxfp8_attn_fwd, mxfp8_quantize

    fn = mxfp8_quantize.mxfp8_quantize_kernel
    for block, dtype in (((1, 32), torch.bfloat16), ((32, 1), torch.float16), ((32, 32), torch.float32)):
        x_type = {torch.bfloat16: "*i16", torch.float16: "*fp16", torch.float32: "*fp32"}[dtype]
        # configs.KNOBS.mxfp8_quant_pipelined off (v3's geometry) and on ("-pipelined", the default)
        for pipelined in (False, True):
            hp = mxfp8_quantize.heads_per_program(16, 128) if pipelined else 1
            constexprs = dict(HEAD_DIM=128, BLOCK_D=128, HEADS_PER_PROGRAM=hp, ROW_BLOCKS=block[0] > 1,
                              SQUARE=block == (32, 32), RCEIL=True, BLOCK_R=mxfp8_quantize.QUANT_BLOCK_R,
                              SEARCH_STEPS=2, X_BF16_BITS=dtype == torch.bfloat16, HW_CVT=True,
                              GROUPS=(mxfp8_quantize.head_groups(block, mxfp8_quantize.PAIR) if pipelined
                                      else mxfp8_quantize.V3_GROUPS),
                              STAGES=mxfp8_quantize.QUANT_STAGES if pipelined else 1,
                              REBASE=mxfp8_quantize.PAIR.value, HEAD_CHUNKS=1,
                              COL_VEC=0, EMPTY_ROWS=False)
            warps = mxfp8_quantize.quantize_warps(block, 128) if pipelined else 4
            name = f"mxfp8-quantize-{block[0]}x{block[1]}-{_TRITON_DTYPE[dtype]}{'-pipelined' if pipelined else ''}"
            yield _mxfp8_spec(name, fn, mxfp8_quantize,
                              {"X": x_type, "DATA": "*u8", "SCALE": "*u8", "OFFSETS": "*i32", "F": "*u8"},
                              constexprs, warps, odd_strides=() if block == (32, 1) else ("stride_sh",))
    # configs.KNOBS.mxfp8_quant_v_columns 64: (32, 1) pairs in 64-column iterations, bf16 D128 as the bench's V; the
    # constexprs and warps as the launch derives them (16 heads, 2 sequences)
    x = torch.empty(64, 16, 128, dtype=torch.bfloat16)
    bits = torch.empty(x.shape, dtype=torch.uint8)
    with mock.patch.object(KNOBS, "mxfp8_quant_pipelined", True), mock.patch.object(KNOBS, "mxfp8_quant_v_columns", 64):
        _, static, options = mxfp8_quantize._launch_geometry(
            x, bits, bits, 2, (32, 1), "rceil", mxfp8_quantize.PAIR, mxfp8_quantize.QUANT_BLOCK_R, 0)
    constexprs = {n: v for n, v in static.items() if n.isupper()}
    yield _mxfp8_spec("mxfp8-quantize-32x1-bf16-cols64-pipelined", fn, mxfp8_quantize,
                      {"X": "*i16", "DATA": "*u8", "SCALE": "*u8", "OFFSETS": "*i32", "F": "*u8"},
                      {**constexprs, "HW_CVT": True}, options["num_warps"])
    # configs.KNOBS.mxfp8_quant_v_layout "column": the same V with whole columns a thread
    with mock.patch.object(KNOBS, "mxfp8_quant_pipelined", True), mock.patch.object(KNOBS, "mxfp8_quant_v_layout",
                                                                                    "column"):
        _, static, options = mxfp8_quantize._launch_geometry(
            x, bits, bits, 2, (32, 1), "rceil", mxfp8_quantize.PAIR, mxfp8_quantize.QUANT_BLOCK_R, 0)
    yield _mxfp8_spec("mxfp8-quantize-32x1-bf16-column-pipelined", fn, mxfp8_quantize,
                      {"X": "*i16", "DATA": "*u8", "SCALE": "*u8", "OFFSETS": "*i32", "F": "*u8"},
                      {**{n: v for n, v in static.items() if n.isupper()}, "HW_CVT": True}, options["num_warps"])
    # the TLX MXFP8 forward's operands written by the quantize kernel itself (quantize_rebased_rows / _v_tiles)
    for rebase, block, block_r in ((mxfp8_quantize.REBASED_ROWS, (1, 32), mxfp8_quantize.QUANT_BLOCK_R),
                                   (mxfp8_quantize.REBASED_V_TILES, (32, 1), 128)):
        for head_dim in (64, 128):
            hp = mxfp8_quantize.heads_per_program(16, head_dim)
            constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=head_dim, HEADS_PER_PROGRAM=hp, ROW_BLOCKS=block[0] > 1,
                              SQUARE=False, RCEIL=True, BLOCK_R=block_r, SEARCH_STEPS=2, X_BF16_BITS=True,
                              HW_CVT=True, GROUPS=mxfp8_quantize.QUANT_GROUPS, STAGES=mxfp8_quantize.QUANT_STAGES,
                              REBASE=rebase.value, HEAD_CHUNKS=1,
                              COL_VEC=0, EMPTY_ROWS=False)
            kind = "rows" if block == (1, 32) else "v-tiles"
            yield _mxfp8_spec(f"mxfp8-quantize-rebased-{kind}-d{head_dim}-bf16-pipelined", fn, mxfp8_quantize,
                              {"X": "*i16", "DATA": "*u8", "SCALE": "*u8", "OFFSETS": "*i32", "F": "*fp32"},
                              constexprs, mxfp8_quantize.quantize_warps(block, hp * head_dim, block_r),
                              odd_strides=("stride_sh",))
            if block == (1, 32):  # K's rows by key tile, factors tiled (tlx configs.MXFP8_TILED_KEY_FACTORS)
                yield _mxfp8_spec(f"mxfp8-quantize-rebased-key-tiles-d{head_dim}-bf16-pipelined", fn,
                                  mxfp8_quantize,
                                  {"X": "*i16", "DATA": "*u8", "SCALE": "*u8", "OFFSETS": "*i32", "F": "*fp32"},
                                  {**constexprs, "SEARCH_STEPS": 5, "KEY_TILE": 128},
                                  mxfp8_quantize.quantize_warps(block, hp * head_dim, block_r),
                                  odd_strides=("stride_sh",))
    # the TLX MXFP8 backward's MX-valued operands written by the quantize kernel (quantize_values,
    # KNOBS.mxfp8_bwd_one_pass): V's (1, 32), Q / K / dO's (32, 32) per sequence; bf16 or fp16 in, bf16 out
    for block, dtype in (((1, 32), torch.bfloat16), ((32, 32), torch.bfloat16), ((32, 32), torch.float16)):
        hp = mxfp8_quantize.heads_per_program(16, 128)
        constexprs = dict(HEAD_DIM=128, BLOCK_D=128, HEADS_PER_PROGRAM=hp, ROW_BLOCKS=block[0] > 1,
                          SQUARE=block == (32, 32), RCEIL=True, BLOCK_R=mxfp8_quantize.QUANT_BLOCK_R, SEARCH_STEPS=2,
                          X_BF16_BITS=dtype == torch.bfloat16, HW_CVT=True, GROUPS=mxfp8_quantize.QUANT_GROUPS,
                          STAGES=mxfp8_quantize.QUANT_STAGES, REBASE=mxfp8_quantize.MX_VALUES.value, HEAD_CHUNKS=1,
                          COL_VEC=0, EMPTY_ROWS=False)
        x_type = "*i16" if dtype == torch.bfloat16 else "*fp16"
        name = f"mxfp8-quantize-values-{block[0]}x{block[1]}-{_TRITON_DTYPE[dtype]}"
        yield _mxfp8_spec(f"{name}-pipelined", fn, mxfp8_quantize, {"X": x_type, "DATA": "*bf16", "SCALE": "*bf16",
                                                     "OFFSETS": "*i32", "F": "*bf16"},
                          constexprs, mxfp8_quantize.quantize_warps(block, hp * 128), odd_strides=("stride_sh",))
        if block == (32, 32):  # dO's: NaN/inf on rows that see no key read as 0, F the forward's lse (EMPTY_ROWS)
            yield _mxfp8_spec(f"{name}-empty-rows-pipelined", fn, mxfp8_quantize,
                              {"X": x_type, "DATA": "*bf16", "SCALE": "*bf16", "OFFSETS": "*i32", "F": "*fp32"},
                              {**constexprs, "EMPTY_ROWS": True}, mxfp8_quantize.quantize_warps(block, hp * 128),
                              odd_strides=("stride_sh",))
    # the triton MXFP8 backward's dO pair (mxfp8_attn_bwd: quantize(..., empty_rows_lse=lse)), bf16 D128 and D64
    # (two heads an iteration), and without EMPTY_ROWS (JFA_MXFP8_BWD_EMPTY_ROWS=0) for a
    # count against it
    for head_dim, empty_rows in ((128, False), (128, True), (64, False), (64, True)):
        hp = mxfp8_quantize.heads_per_program(16, head_dim)
        constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=head_dim, HEADS_PER_PROGRAM=hp, ROW_BLOCKS=True, SQUARE=True,
                          RCEIL=True, BLOCK_R=mxfp8_quantize.QUANT_BLOCK_R, SEARCH_STEPS=2, X_BF16_BITS=True,
                          HW_CVT=True, GROUPS=mxfp8_quantize.QUANT_GROUPS, STAGES=mxfp8_quantize.QUANT_STAGES,
                          REBASE=mxfp8_quantize.PAIR.value, HEAD_CHUNKS=1, COL_VEC=0, EMPTY_ROWS=empty_rows)
        yield _mxfp8_spec(f"mxfp8-quantize-32x32-bf16-d{head_dim}{'-empty-rows' if empty_rows else ''}-pipelined",
                          fn, mxfp8_quantize,
                          {"X": "*i16", "DATA": "*u8", "SCALE": "*u8", "OFFSETS": "*i32",
                           "F": "*fp32" if empty_rows else "*u8"},
                          constexprs, mxfp8_quantize.quantize_warps((32, 32), hp * head_dim),
                          odd_strides=("stride_sh",))
    fn = mxfp8_attn_fwd.mxfp8_attn_fwd_kernel
    for variant in mxfp8_attn_fwd.VARIANTS:
        for head_dim, causal, broadcast_q in ((32, True, False), (64, False, False), (128, False, False),
                                              (128, True, False), (128, False, True), (256, False, False)):
            cfg = mxfp8_attn_fwd.launch_config(variant, head_dim, interpreter=False)
            tma = head_dim <= attn_fwd.TMA_MAX_HEAD_DIM  # as attention_forward decides on sm_90 (use_tma)
            constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HAS_LEFT=False,
                              HAS_RIGHT=causal, BROADCAST_Q=broadcast_q, SEARCH_STEPS=5, VARIANT=variant,
                              HW_CVT=True, DOT_FP16=False, USE_TMA=tma, NAN_ROWS=KNOBS.mxfp8_nan_rows)
            kv = f"tensordesc<fp8e4nv[{cfg.block_n},{head_dim}]>" if tma else "*fp8e4nv"
            types = {"Q": "*fp8e4nv", "K": kv, "V": kv, "QS": "*u8", "KS": "*u8", "VS": "*u8",
                     "Out": "*bf16", "Lse": "*fp32", "Q_OFF": "*i32", "OUT_OFF": "*i32", "KV_OFF": "*i32",
                     "qk_scale": "fp32"}
            name = f"mxfp8-fwd-{variant}-d{head_dim}-{'causal' if causal else 'full'}{'-bcast' if broadcast_q else ''}"
            yield _mxfp8_spec(name, fn, mxfp8_attn_fwd, types, constexprs, cfg.num_warps, cfg.num_stages,
                              odd_strides=("stride_qsh", "stride_ksh"))
    from . import mxfp8_attn_bwd

    for kernel, variant in ((k, v) for k in (mxfp8_attn_bwd.mxfp8_attn_bwd_dkdv_kernel,
                                             mxfp8_attn_bwd.mxfp8_attn_bwd_dq_kernel)
                            for v in mxfp8_attn_fwd.VARIANTS if v != "f16row"):  # f16row: bf16smem's
        short = "dkdv" if "dkdv" in kernel.fn.__name__ else "dq"
        cfg = mxfp8_attn_bwd.BWD_LAUNCH[short]
        for head_dim, causal in ((64, True), (128, False)):
            constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HAS_LEFT=False,
                              HAS_RIGHT=causal, BROADCAST_Q=False, SEARCH_STEPS=5, VARIANT=variant, HW_CVT=True,
                              DOT_FP16=False)
            types = {"Q": "*fp8e4nv", "K": "*fp8e4nv", "V": "*fp8e4nv", "DO": "*fp8e4nv", "QS": "*u8", "KS": "*u8",
                     "VS": "*u8", "DOS": "*u8", "LSE": "*fp32", "DELTA": "*fp32", "DK": "*bf16", "DV": "*bf16",
                     "DQ": "*fp32", "Q_OFF": "*i32", "OUT_OFF": "*i32", "KV_OFF": "*i32", "qk_scale": "fp32",
                     "scale": "fp32"}
            yield _mxfp8_spec(f"mxfp8-bwd-{short}-{variant}-d{head_dim}-{'causal' if causal else 'full'}", kernel,
                              mxfp8_attn_bwd, types, constexprs, cfg.num_warps, cfg.num_stages,
                              odd_strides=("stride_qsh", "stride_ksh", "stride_vsh", "stride_dosh"))
    from . import mxfp8_rebase  # the tlx MXFP8 forward's operand stage (tlx/mxfp8_attn_fwd.rebase_operands)

    for head_dim in (64, 128):
        yield _mxfp8_spec(f"mxfp8-rebase-rows-d{head_dim}", mxfp8_rebase.rebase_rows_kernel, mxfp8_rebase,
                          {"X": "*fp8e4nv", "XS": "*u8", "Y": "*fp8e4nv", "F": "*fp32"},
                          dict(HEAD_DIM=head_dim, ROWS=mxfp8_rebase.ROWS, HW_CVT=True), odd_strides=("stride_sh",))
        yield _mxfp8_spec(f"mxfp8-rebase-key-tiles-d{head_dim}", mxfp8_rebase.rebase_key_tiles_kernel, mxfp8_rebase,
                          {"X": "*fp8e4nv", "XS": "*u8", "Y": "*fp8e4nv", "KFT": "*fp32", "KV_OFF": "*i32"},
                          dict(HEAD_DIM=head_dim, ROWS=mxfp8_rebase.ROWS, BLOCK_N=128, SEARCH_STEPS=5, HW_CVT=True),
                          odd_strides=("stride_sh",))  # tlx configs.MXFP8_TILED_KEY_FACTORS' K launch
        for permuted in (False, True):  # tlx configs.MXFP8_PERMUTED_V_KEYS' order too
            yield _mxfp8_spec(f"mxfp8-rebase-v-tiles-d{head_dim}{'-permkeys' if permuted else ''}",
                              mxfp8_rebase.rebase_v_tiles_kernel, mxfp8_rebase,
                              {"V": "*fp8e4nv", "VS": "*u8", "KV_OFF": "*i32", "VT": "*fp8e4nv", "VF": "*fp32"},
                              dict(HEAD_DIM=head_dim, BLOCK_N=128, SEARCH_STEPS=5, HW_CVT=True,
                                   PERMUTED_KEYS=permuted))
    from .. import mxfp8_bwd  # the tlx MXFP8 backward's operands: MX values in bf16 (mxfp8_bwd.mx_values)

    for square in (False, True):  # (1, 32) blocks; (32, 32) blocks in per-sequence row blocks
        yield _mxfp8_spec(f"mxfp8-values-{'32x32' if square else '1x32'}-bf16", mxfp8_bwd._mx_values_kernel,
                          mxfp8_bwd, {"DATA": "*fp8e4nv", "SCALE": "*u8", "OFFSETS": "*i32", "OUT": "*bf16"},
                          dict(COLS=16 * 128, SQUARE=square, HAS_OFFSETS=square, BLOCK_R=mxfp8_bwd.VALUES_BLOCK_R,
                               BLOCK_C=mxfp8_bwd.VALUES_BLOCK_C))


def _mxfp8_spec(name, fn, module, types, constexprs, num_warps=4, num_stages=1,
                odd_strides=()) -> Specialization:
    # as a real launch specializes them: pointers and strides divisible by 16, except ``odd_strides`` (the head
    # stride of (1, 32) and (32, 32) scales, D / 32 = 4 at D128); without this every load compiles unvectorized
    if "KEY_TILE" in fn.arg_names and "KEY_TILE" not in constexprs:  # the quantize kernel's defaulted constexpr
        constexprs = {**constexprs, "KEY_TILE": 0}
    sig, attrs = _signature(fn, types, constexprs, strides=True, odd_strides=odd_strides)
    return Specialization(name, fn.fn.__name__, module.__name__, sig, constexprs, attrs, num_warps, num_stages)


def exp2_of_fma_count(ptx: str) -> int:
    """``ex2`` instructions of ``ptx`` whose operand an ``fma`` wrote (PTX writes each virtual register once): an
    exp2 of a fused, unrounded product. The MXFP8 forwards must have none: their exp2(s - m) must read the rounded
    scores the running maximum m came from (``mxfp8_attn_fwd._scores``; bench/NOTES.md "MXFP8 NaN on the GPU")."""
    import re

    writer = {reg: op for op, reg in re.findall(r"^\s*([a-z][\w.]*)\s+(%\w+)\s*,", ptx, re.M)}
    return sum(writer.get(reg, "").startswith("fma")
               for reg in re.findall(r"^\s*ex2\.approx[\w.]*\s+%\w+\s*,\s*(%\w+)", ptx, re.M))
