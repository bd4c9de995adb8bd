"""Pre-tuned launch configurations: a small table, no autotuning.

Keys are static facts only (kernel, head-dim bucket, dtype, causal/window, interpreter): never sequence lengths or
totals, so one compiled specialization serves every batch and no call has to time candidates.

Shared-memory budget on sm_90 is 227 KiB per program; ``tests/backends/test_sm90_compile.py`` compiles every entry
(``specializations.py`` lists them) for sm_90 and checks that the budget holds.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import torch

SM90_SHARED_MEMORY_LIMIT = 232448  # bytes per block (227 KiB opt-in maximum on H100/H200)


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    num_warps: int
    num_stages: int  # software-pipelining depth of the inner loops
    programs_per_sm: int = 1  # persistent grid size = programs_per_sm * #SMs


@dataclasses.dataclass
class Knobs:
    """Code-path switches (not block sizes); ``devcheck --variants`` flips them to compare in the same run.
    Defaults from the H200 run in bench/NOTES.md (dense B8 H16 S4096 D128 bf16, TFLOP/s)."""
    fwd_fma_softmax: bool = True  # max over raw scores, then exp2(s * scale - m) as one FMA (scale > 0): neutral
    fwd_kv_major: bool = True  # work order kv head -> tile -> q head (common.work_item): dense fwd 439 -> 459
    # How work items reach programs (common.launch_schedule): "grid" one program per item (the hardware hands the next
    # to whichever SM frees up), "static" persistent grid with striding, "atomic" persistent grid taking the next
    # item from a device counter. Forward: grid beat static (jagged 366 -> 394; was `fwd_persistent=False`).
    fwd_schedule: str = "grid"
    bwd_schedule: str = "static"  # dK/dV and dQ passes; grid and atomic not yet measured
    bwd_fused_dq: bool = False  # dQ by fp32 atomics inside the dK/dV pass: slower here (dense 320 -> 309, jagged
    #                             275 -> 248: the dK/dV kernel already spills at 255 registers), so off
    bcast_fused_dq: bool = True  # broadcast Q, non-deterministic: fused dQ into bcast_dq_slabs fp32 slabs: 130 -> 211
    bcast_dq_slabs: int = 1  # slab p % n for program p; 1 slab (L2-resident) beat one slab per program (174)
    bwd_dq_tma: bool = True  # fused dQ atomics as TMA bulk reductions (sm_90, 16-bit, unpadded D), else red.global
    # (The warp-specialized forward, which hung on the H200, and the slower warp-specialized dQ pass live at the git
    # tag experiment/warp-specialize: bench/NOTES.md v5.)
    one_wave_unsorted: bool = True  # no sorted tile list when every work item runs at once (scheduling.one_wave)
    bwd_tma: bool = True  # backward Q/dO (dK/dV pass) and K/V (dQ pass) through TMA where attn_fwd.use_tma holds:
    #                       dK/dV pointer tensors cost registers at the cap (ptxas D128: 556 B spills -> see NOTES)
    bwd_kv_major: bool = False  # dK/dV work order kv head -> key tile (neutral: dense +2%, jagged -2%), else tile-major


KNOBS = Knobs()


@functools.lru_cache(maxsize=1)
def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (decided before triton is imported, so read once: the
    environment lookup cost ~5 us per launch)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Tiny tiles keep the CPU interpreter fast; tests still get several KV blocks per sequence with lengths ~40.
INTERPRETER_CONFIG = KernelConfig(block_m=16, block_n=16, num_warps=1, num_stages=1, programs_per_sm=1)
INTERPRETER_NUM_SMS = 3  # an odd program count makes the persistent striding visit tiles out of order


def head_dim_bucket(head_dim: int) -> int:
    """Padded head dim inside the kernels: next power of two, at least 16 (the smallest tl.dot K)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def _fwd(bucket: int, itemsize: int, causal: bool) -> KernelConfig:
    if itemsize == 4:  # fp32: twice the bytes per tile, ieee dots; correctness path, not a speed path
        return KernelConfig(64, 32, 4, 2) if bucket <= 128 else KernelConfig(32, 32, 4, 1)
    if bucket <= 64:
        return KernelConfig(128, 64, 4, 3, programs_per_sm=2)
    if bucket <= 128:
        # H200, dense B8 H16 S4096 D128 bf16 with TMA: 437 TFLOP/s (causal 350); causal BLOCK_N 128 gave 353 (noise).
        return KernelConfig(128, 128 if not causal else 64, 8, 3)
    return KernelConfig(128, 64, 8, 2)


def _dkdv(bucket: int, itemsize: int) -> KernelConfig:
    # KV-stationary: block_n keys stay in registers (k, v, dk, dv accumulators), block_m query rows stream.
    if itemsize == 4:
        return KernelConfig(32, 64, 4, 1) if bucket <= 128 else KernelConfig(16, 32, 4, 1)
    if bucket <= 64:
        return KernelConfig(64, 128, 8, 2)
    if bucket <= 128:
        # H200 D128 bf16: 3 stages 304 TFLOP/s whole-backward non-causal but 203 causal (vs 286 / 237); 128x128: 129.
        return KernelConfig(64, 128, 8, 2)
    return KernelConfig(32, 64, 8, 2)


def _dq(bucket: int, itemsize: int) -> KernelConfig:
    # Query-stationary: q, dO, dq accumulator in registers, keys stream.
    if itemsize == 4:
        return KernelConfig(64, 32, 4, 1) if bucket <= 128 else KernelConfig(32, 16, 4, 1)
    if bucket <= 64:
        return KernelConfig(128, 64, 8, 2)
    if bucket <= 128:
        # H200, dense B8 H16 S4096 D128 bf16, whole backward: 3 stages 320 TFLOP/s (causal 264) vs 2 stages 286 (237).
        return KernelConfig(128, 64, 8, 3)
    return KernelConfig(64, 64, 8, 2)


def get_config(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool) -> KernelConfig:
    """kernel: 'fwd', 'dkdv' or 'dq'."""
    if interpreting():
        return INTERPRETER_CONFIG
    bucket, itemsize = head_dim_bucket(head_dim), dtype.itemsize
    if kernel == "fwd":
        return _fwd(bucket, itemsize, causal)
    if kernel == "dkdv":
        return _dkdv(bucket, itemsize)
    if kernel == "dq":
        return _dq(bucket, itemsize)
    raise ValueError(f"unknown kernel {kernel!r}")
