"""``nn.Module`` layers over ``jfa_ops.jagged_attention``: jagged self-attention and seed (broadcast-Q) pooling.

Shapes legend: ``T`` total rows of the packed batch, ``B`` sequences, ``E`` embed_dim, ``Hq``/``Hkv`` query and
key/value heads, ``D`` head_dim, ``Ls`` num_seeds. Offsets are ``[B+1]`` int32/int64 prefix sums of the lengths.

Both layers are plain tensor code around one ``torch.ops.jfa.attention`` call: no data-dependent Python control
flow and no ``.item()``, so they trace whole under ``torch.compile(fullgraph=True, dynamic=True)``.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

import meta_kernels
from jfa_ops.api import _check_backend, _is_njt, check_njt_layout, jagged_attention, sparse_attention

__all__ = ["JaggedSelfAttention", "SeedPooling"]


def _check_positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _head_shapes(embed_dim: int, num_heads: int, num_kv_heads: Optional[int], head_dim: Optional[int]):
    """Resolve (Hq, Hkv, D) with the defaults Hkv = Hq and D = E // Hq, and check them (in ``__init__``: a bad layer
    fails where it is built, not at its first batch)."""
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        _check_positive_int(name, value)
    if head_dim is not None:
        _check_positive_int("head_dim", head_dim)
    if head_dim is None:
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}), "
                             "or pass head_dim")
        head_dim = embed_dim // num_heads
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
    if head_dim not in meta_kernels.SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim (embed_dim // num_heads unless given) must be a multiple of 8 from 8 to 256, "
                         f"got {head_dim}")
    return num_heads, num_kv_heads, head_dim


def _check_rows(x, embed_dim: int) -> None:
    """x (an NJT's values) must be [T, embed_dim]: the projections would split another shape into q/k/v of the
    wrong shape (an error about q or k), or fail in a matmul."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[1] != embed_dim:
        raise ValueError(f"x must be [T, embed_dim={embed_dim}] (or an NJT [B, j, embed_dim]), got shape "
                         f"{tuple(x.shape)}")


def _unpack_njt_rows(x: Tensor, offsets: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """An NJT [B, j, E] -> (packed rows [T, E], offsets)."""
    if offsets is not None:
        raise ValueError("offsets must be None when x is a nested (NJT) tensor")
    check_njt_layout("x", x, "[B, j, E]")
    return x.values(), x.offsets()


class JaggedSelfAttention(nn.Module):
    """Multi-head self-attention over packed variable-length sequences (MHA, GQA or MQA).

    One fused input projection ``E -> (Hq + 2 Hkv) * D`` split into q, k, v; ``jagged_attention`` per sequence;
    an output projection ``Hq * D -> E``. Sequences never attend across their boundaries.

    Shapes::

        x        [T, E]           packed rows of all sequences (or an NJT [B, j, E], layout=torch.jagged)
        offsets  [B+1] int32/int64  prefix sums of the lengths (None for an NJT x)
        returns  [T, E]           (an NJT [B, j, E] for an NJT x)

    ``causal`` and ``window=(left, right)`` are the mask of ``jagged_attention`` (bottom-right aligned, -1 for
    unbounded). ``max_seqlen`` is an optional hint (a Python int, or None); ``backend`` picks a backend by name.

    ``keep_ratio`` (a float in (0, 1]) makes the layer block-sparse: ``jfa_ops.sparse_attention`` with blocks of
    ``block_size`` rows keeps the top ``ceil(keep_ratio * visible)`` KV blocks per Q block. ``max_seqlen`` is then
    required (it sizes the selection; an NJT input that knows its longest sequence supplies it).

    Example::

        >>> layer = JaggedSelfAttention(32, num_heads=4, num_kv_heads=2, causal=True)
        >>> x = torch.randn(10, 32); offsets = torch.tensor([0, 3, 3, 10])
        >>> layer(x, offsets).shape
        torch.Size([10, 32])
    """

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: Optional[int] = None,
                 head_dim: Optional[int] = None, *, causal: bool = False, window: Sequence[int] = (-1, -1),
                 bias: bool = False, backend: Optional[str] = None, keep_ratio: Optional[float] = None,
                 block_size: int = 128):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = _head_shapes(embed_dim, num_heads, num_kv_heads, head_dim)
        if keep_ratio is not None:
            meta_kernels.check_select_options(block_size, block_size, keep_ratio, -1, causal, window, False, True,
                                              0, 0)
        self.keep_ratio = keep_ratio
        self.block_size = block_size
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
        meta_kernels.check_window(window)
        _check_backend(backend)
        self.embed_dim = embed_dim
        self.causal = causal
        self.window: Tuple[int, int] = (int(window[0]), int(window[1]))
        self.backend = backend
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(embed_dim, q_dim + 2 * kv_dim, bias=bias)
        self.out_proj = nn.Linear(q_dim, embed_dim, bias=bias)

    def forward(self, x: Tensor, offsets: Optional[Tensor] = None, max_seqlen: Optional[int] = None) -> Tensor:
        njt_offsets = None
        if _is_njt(x):
            if max_seqlen is None and self.keep_ratio is not None:
                max_seqlen = x._maybe_max_seqlen
            x, offsets = _unpack_njt_rows(x, offsets)
            njt_offsets = offsets
        elif offsets is None:
            raise ValueError("offsets is required when x is a dense [T, E] tensor")
        _check_rows(x, self.embed_dim)
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split([q_dim, kv_dim, kv_dim], dim=-1)
        q = q.unflatten(-1, (self.num_heads, self.head_dim))
        k = k.unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        if self.keep_ratio is None:
            out = jagged_attention(q, k, v, offsets, offsets, max_seqlen, max_seqlen, causal=self.causal,
                                   window=self.window, backend=self.backend)
        else:
            out = sparse_attention(q, k, v, offsets, offsets, max_seqlen, max_seqlen, keep_ratio=self.keep_ratio,
                                   block_q=self.block_size, block_kv=self.block_size, causal=self.causal,
                                   window=self.window, backend=self.backend)
        out = self.out_proj(out.flatten(-2))
        if njt_offsets is not None:
            out = torch.nested.nested_tensor_from_jagged(out, njt_offsets)
        return out

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, causal={self.causal}, window={self.window}, backend={self.backend!r}"
                + ("" if self.keep_ratio is None else f", keep_ratio={self.keep_ratio}, block_size={self.block_size}"))


class SeedPooling(nn.Module):
    """Pool each variable-length history into ``Ls`` vectors: learned seed queries attend over the history.

    The seeds are one dense ``[Ls, Hq, D]`` parameter shared by every sequence (``broadcast_q=True``: no copy per
    sequence). k and v come from one fused projection ``E -> 2 Hkv * D``; the pooled heads go through an output
    projection ``Hq * D -> E``. All projections are bias-free, so an empty history pools to exact zeros (the op
    gives 0 for a query row that sees no key).

    Shapes::

        x        [T, E]           packed rows of all histories (or an NJT [B, j, E], layout=torch.jagged)
        offsets  [B+1] int32/int64  prefix sums of the history lengths (B >= 0; lengths may be 0; None for an NJT x)
        seeds    [Ls, Hq, D]      the learned queries (parameter)
        returns  [B, Ls, E]

    Example::

        >>> pool = SeedPooling(32, num_heads=4, num_seeds=8)
        >>> x = torch.randn(10, 32); offsets = torch.tensor([0, 3, 3, 10])
        >>> pool(x, offsets).shape
        torch.Size([3, 8, 32])
    """

    def __init__(self, embed_dim: int, num_heads: int, num_seeds: int, num_kv_heads: Optional[int] = None,
                 head_dim: Optional[int] = None, *, backend: Optional[str] = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = _head_shapes(embed_dim, num_heads, num_kv_heads, head_dim)
        _check_positive_int("num_seeds", num_seeds)
        _check_backend(backend)
        self.embed_dim, self.num_seeds, self.backend = embed_dim, num_seeds, backend
        self.seeds = nn.Parameter(torch.randn(num_seeds, self.num_heads, self.head_dim))
        self.kv_proj = nn.Linear(embed_dim, 2 * self.num_kv_heads * self.head_dim, bias=False)
        self.out_proj = nn.Linear(self.num_heads * self.head_dim, embed_dim, bias=False)

    def forward(self, x: Tensor, offsets: Optional[Tensor] = None, max_seqlen: Optional[int] = None) -> Tensor:
        if _is_njt(x):
            x, offsets = _unpack_njt_rows(x, offsets)
        elif offsets is None:
            raise ValueError("offsets is required when x is a dense [T, E] tensor")
        _check_rows(x, self.embed_dim)
        k, v = self.kv_proj(x).unflatten(-1, (2 * self.num_kv_heads, self.head_dim)).chunk(2, dim=1)
        seeds = self.seeds.to(k.dtype)
        out = jagged_attention(seeds, k, v, None, offsets, self.num_seeds, max_seqlen,
                               broadcast_q=True, backend=self.backend)  # [B*Ls, Hq, D], row b*Ls + i
        return self.out_proj(out.flatten(-2)).unflatten(0, (-1, self.num_seeds))

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_seeds={self.num_seeds}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, backend={self.backend!r}")
