"""Launch configurations of the TLX kernels (sm_90, 16-bit dtypes): one entry per head dim, no autotuning.

Shared memory per program (bytes, sm_90 allows 232448): two query half-tiles, NUM_BUFFERS_KV key and value blocks,
plus what the compiler adds; ``specializations.py`` compiles every entry and checks it (tests/backends/
test_tlx_compile.py).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

HEAD_DIMS = (64, 128, 256)
# Override of FwdConfig.pipeline for every head dim (None: the table's; tools/tlx_check.py times both).
PIPELINE: Optional[bool] = None
# Work order (triton.common.work_item): tile-major, all heads of the longest tile first. The static persistent striding
# then hands items out longest-first over the whole list; kv-head-major (the triton backend's grid default) restarts
# the longest-first order per kv head, so a program could meet a long tile in the last round (first GPU run: jagged
# 478 vs dense 554 TFLOP/s with it).
KV_MAJOR = False
NUM_WARPS = 4  # the producer (default task); each consumer warpgroup adds 4 (async_task num_warps)


@dataclasses.dataclass(frozen=True)
class FwdConfig:
    block_m: int  # query rows per work item (two consumer half-tiles of block_m // 2)
    block_n: int  # key rows per block
    num_buffers_kv: int  # depth of the key/value ring
    # Consumers software-pipelined: block j's QK^T issued before block j-1's PV (FA3's order), else each block's
    # QK^T, softmax and PV in turn. Costs a [64, block_n] probability tile of registers: at D256 (128 registers of
    # accumulator) ptxas spilled ~900 B per thread, so D256 runs unpipelined (no spills).
    pipeline: bool = True
    num_buffers_q: int = 2  # query half-tile pairs: 2 = the next item's Q loads while this one finishes


# D64: 2 x 8 KiB Q + 3 x (16 + 16) KiB K/V; D128: 32 + 2 x 64 KiB; D256: 64 + 2 x 64 KiB (smaller key blocks: the
# [64, 256] fp32 accumulator already takes 128 of a consumer's 232 registers). Compiled for sm_90 (ptxas, spill
# bytes stores/loads per thread): D64 0; D128 pipelined 88-172 / 108-228 (unpipelined 0); D256 unpipelined 88-108.
_FWD = {64: FwdConfig(128, 128, 3), 128: FwdConfig(128, 128, 2),
        256: FwdConfig(128, 64, 2, pipeline=False, num_buffers_q=1)}


def fwd_config(head_dim: int) -> Optional[FwdConfig]:
    """The forward's config, None for head dims the TLX kernels do not cover (the triton backend runs those)."""
    cfg = _FWD.get(head_dim)
    if cfg is not None and PIPELINE is not None:
        cfg = dataclasses.replace(cfg, pipeline=PIPELINE)
    return cfg
