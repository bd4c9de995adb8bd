"""Launch configurations of the TLX kernels (sm_90, 16-bit dtypes): one entry per head dim, no autotuning.

Shared memory per program (bytes, sm_90 allows 232448): two query half-tiles, NUM_BUFFERS_KV key and value blocks,
plus what the compiler adds; ``specializations.py`` compiles every entry and checks it (tests/backends/
test_tlx_compile.py).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

HEAD_DIMS = (64, 128, 256)
NUM_WARPS = 4  # the producer (default task); each consumer warpgroup adds 4 (async_task num_warps)


@dataclasses.dataclass(frozen=True)
class FwdConfig:
    block_m: int  # query rows per work item (two consumer half-tiles of block_m // 2)
    block_n: int  # key rows per block
    num_buffers_kv: int  # depth of the key/value ring


# D64: 2 x 8 KiB Q + 3 x (16 + 16) KiB K/V; D128: 32 + 2 x 64 KiB; D256: 64 + 2 x 64 KiB (smaller key blocks: the
# [64, 256] fp32 accumulator already takes 128 of a consumer's 232 registers).
_FWD = {64: FwdConfig(128, 128, 3), 128: FwdConfig(128, 128, 2), 256: FwdConfig(128, 64, 2)}


def fwd_config(head_dim: int) -> Optional[FwdConfig]:
    """The forward's config, None for head dims the TLX kernels do not cover (the triton backend runs those)."""
    return _FWD.get(head_dim)
