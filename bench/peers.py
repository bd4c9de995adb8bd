"""One small adapter per implementation measured: every jfa_ops backend, and the peers.

Uniform interface: ``peer.unavailable(device)`` says why it cannot run here (None if it can), and
``peer.prepare(case, inputs)`` returns a ``Prepared``: a forward callable over the peer's own leaf tensors (laid out
the way that peer wants them, built outside the timed region), or raises ``Skip`` with a one-line reason.

Peers that take no broadcast Q get Q materialized per sequence ([B*Lq] rows, q offsets b*Lq). SDPA gets tensors
padded to the longest sequence, unmasked: its time is an upper bound on speed and its output is not compared
(``exact=False``); FLOPs still count only useful pairs, so padding shows as a low ratio.
"""
from __future__ import annotations

import dataclasses
import os
import inspect
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F

from bench.suites import Case, Inputs
from jfa_ops.ops.attention import default_compile_path, triton_pin_mismatch
from jfa_ops.testing import reference_attention

REFERENCE_MAX_WORK = 1 << 20  # visible pairs x query heads above which the jfa reference backend is skipped
SDPA_MAX_PADDED_FLOPS = 1e14  # padded forward work above which SDPA is skipped (~0.2 s a call)
SDPA_MAX_PADDED_BYTES = 24 * 2**30  # padded q, k, v above which SDPA is skipped


class Skip(Exception):
    """This peer cannot run this case; the message is the one-line reason."""


@dataclasses.dataclass
class Prepared:
    fn: Callable[[], torch.Tensor]  # forward; returns the output in the peer's layout
    leaves: List[torch.Tensor]  # the tensors the backward differentiates (requires_grad)
    to_jagged: Callable[[torch.Tensor], torch.Tensor]  # output -> [T_q (B*Lq), Hq, D]
    exact: bool = True  # False: computes a different function on purpose (unmasked padding)
    note: str = ""
    no_backward: str = ""  # why the backward cannot run here ("" when it can)
    tolerance: Optional[float] = None  # output check tolerance when not the default (MXFP8: a lossy format)
    bytes_moved: int = 0  # > 0: a memory-bound kernel (quantize): the record gets GB/s instead of TFLOP/s
    # fn timed as a CUDA graph replay (the GPU's time, not the host's: the quantize rows, whose ~0.2 ms of kernels
    # on the 67M-element batches are less than the eager calls' Python); eager_fn also timed eagerly (eager_ms)
    graph: bool = False
    eager_fn: Optional[Callable[[], object]] = None
    # (attend, q): fn() is attend(q) up to the output's layout, and attend(x) takes a q-shaped x and returns its
    # output in q's layout, so calls chain as a model's layers do (the overhead suite's per-layer compiled columns)
    layer: Optional[Tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]] = None


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _need_cuda(device) -> Optional[str]:
    return None if torch.device(device).type == "cuda" else "needs CUDA"


def one_line(e: BaseException, limit: int = 160) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------------------------------
# jfa_ops backends


def import_jfa_ops():
    """jfa_ops, or SystemExit with a clear message when the package is not importable yet."""
    try:
        import jfa_ops
    except Exception as e:  # noqa: BLE001 - any import failure means the same thing here
        raise SystemExit(f"bench: cannot import jfa_ops ({one_line(e)}); run from the repository root "
                         f"(or pip install -e .) once the package exists") from e
    if not hasattr(jfa_ops, "jagged_attention"):
        raise SystemExit("bench: jfa_ops has no jagged_attention yet")
    return jfa_ops


def jfa_available_backends(device) -> List[str]:
    jfa_ops = import_jfa_ops()
    names = getattr(jfa_ops, "available_backends", lambda: ["reference", "triton"])()
    names = list(names() if callable(names) else names)
    if torch.device(device).type != "cuda":
        names = [n for n in names if n == "reference"]  # the GPU backends only run in an interpreter on the CPU
    return names


def split_compile_path(backend: str) -> Tuple[str, str]:
    """``triton@opaque`` -> (``triton``, ``opaque``); a plain name -> (name, the library's default:
    ``default_compile_path()``, ``inductor``, or ``split`` under the TLX install): the backend and the compile path
    (``JFA_COMPILE_PATH``) its compiled graphs are traced with, so one run compares paths."""
    name, _, path = backend.partition("@")
    return name, path or default_compile_path()


AUTO = "auto"  # a backend name of the bench's: the library's automatic choice (backend=None), whatever it picks


def library_backend(name: str) -> Optional[str]:
    """The ``backend=`` argument for a bench backend name: None for ``auto``, else the name."""
    return None if name == AUTO else name


def use_compile_path(path: str) -> None:
    """Set ``JFA_COMPILE_PATH`` for the graphs compiled next (read when a graph is traced; the bench resets Dynamo
    before each compile, so no graph of the other path is reused)."""
    os.environ["JFA_COMPILE_PATH"] = path


class JfaBackend:
    """A jfa_ops backend: ``jagged_attention``, or on sparse cases ``sparse_attention`` (both stages, selection
    included). ``variant`` "dense": our dense kernel on a sparse case's batch; "select": the selection alone."""

    handles_sparse = True

    def __init__(self, backend: str, variant: str = ""):
        self.backend, self.compile_path = split_compile_path(backend)
        self.variant = variant
        self.name = f"jfa:{backend}" + (f" {variant}" if variant else "")

    def unavailable(self, device) -> Optional[str]:
        return None

    def prepare(self, case: Case, inp: Inputs) -> Prepared:
        jfa_ops = import_jfa_ops()
        if self.variant and case.keep_ratio is None:
            raise Skip(f"the {self.variant} row is for sparse cases only")
        if case.keep_ratio is not None and self.variant != "dense" and self.backend != AUTO:
            from jfa_ops.backends import get_backend
            if not get_backend(self.backend).implements("block_sparse"):
                raise Skip(f"backend {self.backend!r} has no block-sparse family")
        use_compile_path(self.compile_path)
        if self.backend == "reference" and case.pairs() * case.num_heads_q > REFERENCE_MAX_WORK:
            raise Skip(f"reference backend skipped above {REFERENCE_MAX_WORK} visible pairs x heads")
        q, k, v = _leaf(inp.q), _leaf(inp.k), _leaf(inp.v)
        kw = dict(causal=case.causal, window=tuple(case.window), broadcast_q=case.broadcast_q,
                  backend=library_backend(self.backend))
        if self.variant == "select":
            def select():
                return jfa_ops.select_kv_blocks(q.detach(), k.detach(), inp.q_offsets, inp.kv_offsets, case.max_q,
                                                case.max_kv, **sparse_kw(case), **kw)[0]

            # timed as a CUDA graph replay (the GPU's time, as a sparse forward pays it behind the caller's queued
            # work), and eagerly (eager_ms): alone, an eager call's host path (~0.3 ms of Python before the GPU
            # gets its work: bench/NOTES.md "selection host path, helper selshare, stop 28") is the timed part
            return Prepared(select, [q, k, v], lambda o: o, exact=False, note="selection only",
                            no_backward="the selection has no backward", graph=True, eager_fn=select)
        if case.keep_ratio is not None and self.variant != "dense":
            def attend(x):
                return _first(jfa_ops.sparse_attention(x, k, v, inp.q_offsets, inp.kv_offsets, case.max_q,
                                                       case.max_kv, **sparse_kw(case), **kw))
        else:
            def attend(x):
                return _first(jfa_ops.jagged_attention(x, k, v, inp.q_offsets, inp.kv_offsets, case.max_q,
                                                       case.max_kv, **kw))

        return Prepared(lambda: attend(q), [q, k, v], lambda o: o, exact=self.variant != "dense", layer=(attend, q))


def sparse_kw(case: Case) -> dict:
    return dict(keep_ratio=case.keep_ratio, block_q=case.block, block_kv=case.block)


def sparse_selection(case: Case, inp: Inputs, backend: Optional[str] = None):
    """The selection of a sparse case's inputs (what the jfa rows compute; FlexAttention gets it as its BlockMask)."""
    import jfa_ops

    return jfa_ops.select_kv_blocks(inp.q, inp.k, inp.q_offsets, inp.kv_offsets, case.max_q, case.max_kv,
                                    causal=case.causal, window=tuple(case.window), backend=backend, **sparse_kw(case))


MXFP8_TOLERANCE = 0.1  # MXFP8 vs float64 on the originals: measured 0.045-0.06 on N(0, 1) inputs (README)
MXFP8_KINDS = ("mxfp8", "mxfp8-prequant", "mxfp8-quantize")


def mxfp8_variants(backend: str, kind: str, all_variants: bool = False) -> list:
    """The forward variants to run as their own rows: [None] (the backend's default), or with ``all_variants``
    (``--mxfp8-variants``: each row multiplies the suite's time) all of ``mxfp8_attn_fwd.VARIANTS`` for the triton
    backend's attention kinds."""
    if not all_variants or backend.split("@")[0] != "triton" or kind == "mxfp8-quantize":
        return [None]
    from jfa_ops.backends.triton.mxfp8_attn_fwd import VARIANTS

    return list(VARIANTS)


def _quantize_bytes(inputs, outputs) -> int:
    """The useful bytes of quantizing ``inputs`` into ``outputs``: each input read once and written once as E4M3
    (one byte an element), plus the scales / re-basing factors (the outputs that are not E4M3 data). Padding in the
    outputs and intermediate round trips (tlx: V's MX pair before its re-basing, unless JFA_TLX_MXFP8_FUSED_V=1)
    are not counted, so the GB/s are effective ones: a lower bound on what the kernels move."""
    return sum(t.numel() * (t.element_size() + 1) for t in inputs) + sum(
        t.numel() * t.element_size() for t in outputs if t.dtype != torch.float8_e4m3fn)


def tlx_mxfp8_backward() -> bool:
    """Whether the tlx backend runs its own MXFP8 backward (``tlx.configs.MXFP8_BACKWARD``, default on; env
    JFA_TLX_MXFP8_BWD=0: the triton backend's). Without TLX there are no tlx rows to time: False."""
    try:
        from jfa_ops.backends.tlx import configs
    except ImportError:
        return False
    return configs.MXFP8_BACKWARD


class JfaMxfp8:
    """``jfa_ops.mxfp8_attention`` on one backend, in the ``mxfp8`` suite only. kind "mxfp8": bf16 q/k/v in,
    quantization counted; "mxfp8-prequant": pre-quantized pairs in (forward only); "mxfp8-quantize": the quantize
    work the "mxfp8" row's forward does (GB/s): triton's three quantize calls, or on tlx the fused quantize that
    writes the TLX forward's re-based operands (``tlx.mxfp8_attn_fwd.quantize_operands``). variant: the triton
    forward's way of using the MX operands (``mxfp8_attn_fwd.VARIANTS``, set through ``configs.KNOBS.mxfp8_variant``
    for this peer's calls), named in the peer as ``jfa:mxfp8[variant]:triton``; None: the default.
    ``backward_row``: the peer whose backward this one's is (with ``JFA_TLX_MXFP8_BWD=0`` the tlx backend's MXFP8
    backward is the triton backend's): its bwd is not timed twice."""

    only_suite = "mxfp8"

    def __init__(self, backend: str, kind: str, variant: Optional[str] = None, backward_row: str = ""):
        self.backend, self.kind, self.variant = backend, kind, variant
        self.backward_row = backward_row
        self.name = f"jfa:{kind}{f'[{variant}]' if variant else ''}:{backend}"

    def _with_variant(self, fn):
        if self.variant is None:
            return fn
        from jfa_ops.backends.triton.configs import KNOBS

        def call():
            before, KNOBS.mxfp8_variant = KNOBS.mxfp8_variant, self.variant
            try:
                return fn()
            finally:
                KNOBS.mxfp8_variant = before
        return call

    def unavailable(self, device) -> Optional[str]:
        return None

    def _quantize_fn(self, jfa_ops, inp: Inputs):
        """(the quantize work of the bf16-in forward, as the forward calls it; the same eagerly as a user calls it;
        a note). Timed as a CUDA graph replay: the eager calls' host time exceeds the kernels' on the 67M-element
        batches (three ``jfa_ops.mxfp8_quantize`` calls ~0.45-0.65 ms on the H200's host against ~0.2 ms of GPU
        work: bench/NOTES.md "MXFP8 quantize bandwidth, helper mxquantbw, stop 27")."""
        graphed = "replayed from a CUDA graph (the kernels' time; eager_gbps: "
        if self.backend.split("@")[0] == "tlx":
            from jfa_ops.backends.tlx import configs as tlx_configs
            if not tlx_configs.MXFP8_FUSED_QUANTIZE:
                raise Skip("JFA_TLX_MXFP8_FUSED_QUANTIZE=0: the tlx forward quantizes with the triton kernel "
                           "(the triton row)")
            from jfa_ops.backends.tlx.mxfp8_attn_fwd import quantize_operands

            fused = lambda: quantize_operands(inp.q, inp.k, inp.v, inp.kv_offsets, "rceil")  # noqa: E731
            return (fused, fused, "GB/s of the fused quantize writing the TLX forward's re-based operands, "
                    + graphed + "the same eagerly)")
        from jfa_ops.backends import select_backend
        from jfa_ops.ops import mxfp8 as mxfp8_ops
        import meta_kernels.mxfp8 as mx

        # the function the bf16-in forward calls (ops.mxfp8._quantizer: the backend's, no op dispatch, no checks)
        quantize = mxfp8_ops._quantizer(select_backend(self.backend, mxfp8_ops._x_problem(inp.q),
                                                       family=mxfp8_ops.QUANTIZE))

        def forward_calls():
            return (quantize(inp.q, None, mx.Q_BLOCK, "rceil"), quantize(inp.k, None, mx.K_BLOCK, "rceil"),
                    quantize(inp.v, inp.kv_offsets, mx.V_BLOCK, "rceil"))
        return (forward_calls, lambda: self._mx_pairs(jfa_ops, inp), "GB/s of the forward's three quantize calls, "
                + graphed + "three jfa_ops.mxfp8_quantize calls eagerly)")

    def _mx_pairs(self, jfa_ops, inp: Inputs):
        """The (data, scale) pairs of q, k ((1, 32) blocks) and v ((32, 1) blocks along each sequence): the three
        quantize calls the bf16-in forward makes."""
        return (jfa_ops.mxfp8_quantize(inp.q, backend=self.backend),
                jfa_ops.mxfp8_quantize(inp.k, backend=self.backend),
                jfa_ops.mxfp8_quantize(inp.v, inp.kv_offsets, block=(32, 1), backend=self.backend))

    def prepare(self, case: Case, inp: Inputs) -> Prepared:
        jfa_ops = import_jfa_ops()
        if case.suite != "mxfp8":
            raise Skip("MXFP8: the mxfp8 suite only")
        kw = dict(causal=case.causal, window=tuple(case.window), broadcast_q=case.broadcast_q, backend=self.backend)
        if self.kind == "mxfp8":
            q, k, v = _leaf(inp.q), _leaf(inp.k), _leaf(inp.v)

            def fn():
                return jfa_ops.mxfp8_attention(q, k, v, inp.q_offsets, inp.kv_offsets, case.max_q, case.max_kv, **kw)

            no_backward = f"the same backward as {self.backward_row}'s (timed there)" if self.backward_row else ""
            return Prepared(self._with_variant(fn), [q, k, v], lambda o: o, tolerance=MXFP8_TOLERANCE,
                            no_backward=no_backward)
        if self.kind == "mxfp8-quantize":
            quantize, eager, note = self._quantize_fn(jfa_ops, inp)
            outputs = [t for t in _flatten(quantize()) if isinstance(t, torch.Tensor)]  # sized once, untimed
            return Prepared(lambda: _flatten(quantize())[0], [], lambda o: o, exact=False,
                            bytes_moved=_quantize_bytes((inp.q, inp.k, inp.v), outputs),
                            no_backward="a quantize kernel", note=note, graph=True,
                            eager_fn=lambda: _flatten(eager())[0])
        pairs = self._mx_pairs(jfa_ops, inp)

        def fn():
            return jfa_ops.mxfp8_attention(*pairs, inp.q_offsets, inp.kv_offsets, case.max_q, case.max_kv,
                                           out_dtype=inp.q.dtype, **kw)

        return Prepared(self._with_variant(fn), [], lambda o: o, tolerance=MXFP8_TOLERANCE,
                        no_backward="pre-quantized: no gradients")


def _flatten(x) -> list:
    """Nested tuples/lists of tensors -> a flat list."""
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _flatten(item)]
    return [x]


# --------------------------------------------------------------------------------------------------------------------
# Our selection in FlashAttention-4's block-sparse format (pure tensor logic: tested on the CPU)


def _per_q_head(t: torch.Tensor, num_heads_q: int) -> torch.Tensor:
    """[B, Hkv, ...] -> [B, Hq, ...]: FA4 reads its block lists per query head (q head h uses kv head h // group,
    as FA4's GQA does); our selection is per kv head."""
    return t.repeat_interleave(num_heads_q // t.shape[1], dim=1)


FA4_FULL_LIST_FIELDS = ("full_block_cnt", "full_block_idx")


def _with_empty_full_lists(**fields) -> dict:
    """``BlockSparseTensorsTorch`` fields with FA4's "full" (unmasked) block lists present and empty: zero counts,
    zero ids, the mask lists' shapes (what a FlexAttention BlockMask always carries). FA4 4.0.0b36's sm_90 forward
    cannot take them as None: the CuTe DSL traces both sides of every runtime ``if``, and with no full list
    ``produce_block_sparse_loads`` (flash_attn/cute/block_sparse_utils.py:325, "if mask_empty:") traces
    ``load_block_list(None, Int32(0), ...)``, which subscripts the None list at block_sparse_utils.py:158
    (``block_indices[sparse_offset]``; the consumer at :510 likewise): "TypeError: 'NoneType' object is not
    subscriptable" while compiling, on every call. Empty lists cost the kernel one count load per tile."""
    cnt, idx = fields["mask_block_cnt"], fields["mask_block_idx"]
    return dict(fields, full_block_cnt=torch.zeros_like(cnt), full_block_idx=torch.zeros_like(idx))


def fa4_varlen_block_sparse(kv_block_index: torch.Tensor, kv_block_count: torch.Tensor, q_offsets: torch.Tensor,
                            kv_offsets: torch.Tensor, *, num_heads_q: int, block_q: int, block_kv: int) -> dict:
    """The fields of FA4's varlen ``BlockSparseTensorsTorch`` (flash_attn.cute.block_sparsity, 4.0.0b36) for our
    selection: every selected block as a "mask" block (FA4 applies causal/window inside mask blocks; we have no
    separate list of unmasked "full" blocks).

    FA4's varlen layout (block_sparse_utils._get_curr_blocksparse_tensors_varlen, seqlen_info.SeqlenInfoQK):
    ``mask_block_cnt`` [Hq, total_m_blocks], sequence b's Q blocks from ``cu_total_m_blocks[b]``;
    ``mask_block_idx`` [Hq, sum_b m_b * n_b], sequence b's rows of n_b = ceil(len_k / block_kv) entries from
    ``cu_block_idx_offsets[b]`` (Q block m's list at offset + m * n_b), ascending KV block ids local to the sequence,
    only the first count entries read (the padding is 0 here, never -1). The blocks must be FA4's tiles:
    ``block_size`` = (block_q, block_kv) = (tile_m, tile_n) (sm90, D128: 128x128). The "full" lists are given
    empty (``_with_empty_full_lists``)."""
    q_len = q_offsets.long().diff().tolist()  # setup time: host reads are fine here
    kv_len = kv_offsets.long().diff().tolist()
    index = _per_q_head(kv_block_index, num_heads_q).clamp(min=0).int()
    count = _per_q_head(kv_block_count, num_heads_q).int()
    m_blocks = [-(-n // block_q) for n in q_len]
    n_blocks = [-(-n // block_kv) for n in kv_len]
    counts = [count[b, :, :m] for b, m in enumerate(m_blocks)]
    rows = [index[b, :, :m, :n].reshape(num_heads_q, m * n) for b, (m, n) in enumerate(zip(m_blocks, n_blocks))]

    def cumulative(sizes):
        return torch.tensor([0] + sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(index.device)

    return _with_empty_full_lists(mask_block_cnt=torch.cat(counts, 1).contiguous(),
                                  mask_block_idx=torch.cat(rows, 1).contiguous(),
                                  cu_total_m_blocks=cumulative(m_blocks),
                                  cu_block_idx_offsets=cumulative([m * n for m, n in zip(m_blocks, n_blocks)]),
                                  block_size=(block_q, block_kv))


def fa4_padded_block_sparse(kv_block_index: torch.Tensor, kv_block_count: torch.Tensor, *,
                            num_heads_q: int, block_q: int, block_kv: int) -> Tuple[dict, dict]:
    """The forward and backward ``BlockSparseTensorsTorch`` fields for FA4's padded-batch call (``flash_attn_func``
    on [B, max_len, H, D], block b's rows the sequence's own: our blocks already start at each sequence's start).
    Forward: [B, Hq, NQB] counts and [B, Hq, NQB, NKB] ascending KV block ids. Backward (Q-direction, what FA4's
    ``block_sparse_tensors_bwd`` takes): [B, Hq, NKB] counts and [B, Hq, NKB, NQB] ascending Q block ids, the
    transpose of the same pairs. Each with empty "full" lists (``_with_empty_full_lists``)."""
    index = _per_q_head(kv_block_index, num_heads_q).long()
    count = _per_q_head(kv_block_count, num_heads_q)
    batch, heads, nqb, nkb = index.shape
    used = torch.arange(nkb, device=index.device) < count[..., None]
    pairs = torch.zeros(batch, heads, nqb, nkb + 1, dtype=torch.bool, device=index.device)
    pairs.scatter_(3, torch.where(used, index.clamp(min=0), nkb), True)  # unused entries go to the spare column
    by_kv = pairs[..., :nkb].transpose(2, 3)  # [B, Hq, NKB, NQB]
    q_ids = torch.arange(nqb, device=index.device)
    q_sorted = torch.where(by_kv, q_ids, nqb).sort(dim=-1).values  # selected Q blocks first, ascending
    fwd = _with_empty_full_lists(mask_block_cnt=count.int().contiguous(),
                                 mask_block_idx=index.clamp(min=0).int().contiguous(), block_size=(block_q, block_kv))
    bwd = _with_empty_full_lists(mask_block_cnt=by_kv.sum(-1).int().contiguous(),
                                 mask_block_idx=torch.where(q_sorted < nqb, q_sorted, 0).int().contiguous(),
                                 block_size=(block_q, block_kv))
    return fwd, bwd


# --------------------------------------------------------------------------------------------------------------------
# FlashAttention-4 (CuTe DSL): flash_attn_func for dense cases, flash_attn_varlen_func for jagged ones; on sparse
# cases its block-sparse path given our selection (varlen forward; "fa4 padded": padded batch, forward + backward)


class FlashAttention4:
    """``padded``: the sparse suite's second FA4 row, the padded-batch block-sparse call (FA4 b36's varlen autograd
    drops the block lists in its backward, and its varlen backward refuses them: the padded call is FA4's only
    block-sparse backward)."""

    handles_sparse = True  # its block-sparse path, given our selection

    def __init__(self, padded: bool = False):
        self._mod = None
        self.padded = padded
        self.name = "fa4 padded" if padded else "fa4"
        if padded:
            self.only_suite = "sparse"

    def _interface(self):
        if self._mod is None:
            from flash_attn.cute import interface  # noqa: WPS433
            self._mod = interface
        return self._mod

    def unavailable(self, device) -> Optional[str]:
        if _need_cuda(device):
            return _need_cuda(device)
        try:
            self._interface()
        except Exception as e:  # noqa: BLE001
            return f"flash_attn.cute not importable ({one_line(e, 100)}); see bench/README.md for the FA4 carry"
        return None

    @staticmethod
    def _call_kwargs(func, case: Case, **extra) -> dict:
        params = inspect.signature(func).parameters
        left, right = case.window
        kw = dict(softmax_scale=case.head_dim ** -0.5, causal=case.causal, **extra)
        if (left, right) != (-1, -1):
            if "window_size" not in params:
                raise Skip("this flash_attn.cute has no window_size")
            kw["window_size"] = (None if left < 0 else left, None if right < 0 else right)
        missing = [n for n in kw if n not in params]
        if missing:
            raise Skip(f"flash_attn.cute signature lacks {missing}")
        return kw

    def _block_sparse_class(self, func, *params):
        """FA4's ``BlockSparseTensorsTorch``, or Skip("unavailable: <why>") when this FA4 lacks what we pass."""
        missing = [p for p in params if p not in inspect.signature(func).parameters]
        if missing:
            raise Skip(f"unavailable: this flash_attn.cute's {func.__name__} has no {', '.join(missing)}")
        try:
            from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
        except Exception as e:  # noqa: BLE001 (an optional feature: any failure is the reason)
            raise Skip(f"unavailable: no flash_attn.cute.block_sparsity.BlockSparseTensorsTorch ({one_line(e, 100)})")
        need = ("mask_block_cnt", "mask_block_idx", *FA4_FULL_LIST_FIELDS, "block_size") + (() if self.padded else (
            "cu_total_m_blocks", "cu_block_idx_offsets"))
        lacking = [f for f in need if f not in getattr(BlockSparseTensorsTorch, "_fields", ())]
        if lacking:
            raise Skip(f"unavailable: this BlockSparseTensorsTorch has no {', '.join(lacking)}")
        return BlockSparseTensorsTorch

    def _prepare_sparse(self, fa, case: Case, inp: Inputs) -> Prepared:
        """FA4's block-sparse path given our selection of these inputs (what the flex row gets as its BlockMask),
        built before timing. The padded row takes causal only with Lq == Lk per sequence (FA4 aligns the causal
        mask to the padded lengths)."""
        if case.broadcast_q:
            raise Skip("block-sparse FA4: no broadcast Q")
        index, count = sparse_selection(case, inp)
        blocks = dict(num_heads_q=case.num_heads_q, block_q=case.block, block_kv=case.block)
        if not self.padded:
            tensors_cls = self._block_sparse_class(fa.flash_attn_varlen_func, "block_sparse_tensors")
            sparse = tensors_cls(**fa4_varlen_block_sparse(index, count, inp.q_offsets, inp.kv_offsets, **blocks))
            q, k, v = _leaf(inp.q), _leaf(inp.k), _leaf(inp.v)
            kw = self._call_kwargs(fa.flash_attn_varlen_func, case, cu_seqlens_q=inp.q_offsets,
                                   cu_seqlens_k=inp.kv_offsets, max_seqlen_q=case.max_q, max_seqlen_k=case.max_kv,
                                   block_sparse_tensors=sparse)
            attend = lambda x: _first(fa.flash_attn_varlen_func(x, k, v, **kw))  # noqa: E731
            return Prepared(lambda: attend(q), [q, k, v], lambda o: o, layer=(attend, q),
                            no_backward="FA4's varlen backward takes no block lists (b36: dense gradients); "
                                        "see the fa4 padded row", note="varlen, our selection as mask blocks")
        if case.causal and tuple(case.q_lens) != tuple(case.kv_lens):
            raise Skip("padded FA4: causal needs Lq == Lk per sequence (padding shifts its alignment)")
        tensors_cls = self._block_sparse_class(fa.flash_attn_func, "block_sparse_tensors", "block_sparse_tensors_bwd")
        fwd, bwd = fa4_padded_block_sparse(index, count, **blocks)
        q, k, v = (_leaf(_pad(t, lens, m)) for t, lens, m in ((inp.q, case.q_lens, case.max_q),
                                                               (inp.k, case.kv_lens, case.max_kv),
                                                               (inp.v, case.kv_lens, case.max_kv)))
        kw = self._call_kwargs(fa.flash_attn_func, case, block_sparse_tensors=tensors_cls(**fwd),
                               block_sparse_tensors_bwd=tensors_cls(**bwd))
        attend = lambda x: _first(fa.flash_attn_func(x, k, v, **kw))  # noqa: E731
        index_rows = _pad_index(case.q_lens, case.max_q, inp.q.device)
        pad_frac = 1 - case.total_q / (case.batch * case.max_q)
        # a selected tail block that is not whole would let the padding's zero keys into the softmax (the bench
        # rounds lengths to whole blocks)
        whole = all(n % case.block == 0 for n in case.kv_lens)
        return Prepared(lambda: attend(q), [q, k, v], lambda o: o.reshape(-1, *o.shape[2:])[index_rows],
                        exact=whole, note=f"padded batch ({pad_frac:.0%} rows padding, no blocks selected there)")

    def prepare(self, case: Case, inp: Inputs) -> Prepared:
        fa = self._interface()
        if case.keep_ratio is not None:
            return self._prepare_sparse(fa, case, inp)
        if case.dense:
            b, s = case.batch, case.q_lens[0]
            shape = lambda t: t.view(b, s, *t.shape[1:])  # noqa: E731
            q, k, v = _leaf(shape(inp.q)), _leaf(shape(inp.k)), _leaf(shape(inp.v))
            kw = self._call_kwargs(fa.flash_attn_func, case)
            dense = lambda x: _first(fa.flash_attn_func(x, k, v, **kw))  # noqa: E731
            return Prepared(lambda: dense(q), [q, k, v], lambda o: o.reshape(-1, *o.shape[2:]), layer=(dense, q))
        q, k, v = _leaf(inp.q_materialized(case)), _leaf(inp.k), _leaf(inp.v)
        kw = self._call_kwargs(fa.flash_attn_varlen_func, case, cu_seqlens_q=inp.q_offsets_materialized,
                               cu_seqlens_k=inp.kv_offsets, max_seqlen_q=case.max_q, max_seqlen_k=case.max_kv)
        jagged = lambda x: _first(fa.flash_attn_varlen_func(x, k, v, **kw))  # noqa: E731
        return Prepared(lambda: jagged(q), [q, k, v], lambda o: o, layer=(jagged, q))


E4M3_MAX = 448.0  # float8_e4m3fn's largest finite value


def per_tensor_fp8(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(x as E4M3 scaled by one factor for the whole tensor, its descale: a float32 scalar tensor, amax / 448), in
    four eager torch passes and no host sync: amax (one read, ``aminmax``), the multiply in x's dtype (a 0-dim
    float32 factor keeps bf16), the clamp (rounding can step past 448) and the cast. x = fp8 * descale up to E4M3's
    rounding (and bf16's, 2**-9, before it)."""
    low, high = torch.aminmax(x)
    descale = torch.maximum(-low, high).float().clamp_min(1e-12) / E4M3_MAX
    return (x * (1.0 / descale)).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), descale


def _quantized_call(quantize, attend, prequant: bool) -> Callable[[], torch.Tensor]:
    """The FP8 peers' timed call: ``attend(*quantize())``, quantizing in every call, or once here (``prequant``)."""
    if prequant:
        operands = quantize()
        return lambda: attend(*operands)
    return lambda: attend(*quantize())


FA4_FP8_MAJOR = 10  # FA4 4.0.0b36's _flash_attn_fwd: "FP8 is only supported on SM100 (compute capability 10.x)"


class FlashAttention4Fp8(FlashAttention4):
    """Per-tensor FP8 attention from a peer (issue 12: "compare with per-tensor FP8 attention from any peer that
    imports"): FA4's FP8 forward (``flash_attn.cute.interface._flash_attn_fwd``: E4M3 q/k/v with q/k/v descales; the
    public ``flash_attn_func`` / ``flash_attn_varlen_func`` take no descales in b36), each tensor scaled by
    amax / 448 over the whole tensor (``per_tensor_fp8``), the descales given as FA4's [B, Hkv] float32 tensors (all
    entries that one value). ``prequant``: quantized before timing ("fa4 fp8 prequant"); else the amax and cast are
    timed with the attention ("fa4 fp8", as our ``jfa:mxfp8`` rows count their quantization). Forward only (FA4
    refuses FP8 with gradients). Dense cases as [B, S, H, D], the rest varlen; broadcast Q materialized. FA4 b36 runs
    FP8 on SM100 only: unavailable, with that reason, on the H200 (sm_90)."""

    handles_sparse = False
    only_suite = "mxfp8"

    def __init__(self, prequant: bool = False):
        super().__init__()
        self.prequant = prequant
        self.name = "fa4 fp8 prequant" if prequant else "fa4 fp8"

    def unavailable(self, device) -> Optional[str]:
        reason = super().unavailable(device)
        if reason:
            return reason
        if "q_descale" not in inspect.signature(self._interface()._flash_attn_fwd).parameters:
            return "this flash_attn.cute's _flash_attn_fwd takes no q_descale (no FP8 forward)"
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        if major != FA4_FP8_MAJOR:
            return (f"FA4's FP8 forward runs on SM100 only (flash_attn/cute/interface.py asserts compute capability "
                    f"10.x); this GPU is sm_{major}{minor}")
        return None

    def fp8_call(self, fa, case: Case, inp: Inputs):
        """(forward callable, output -> jagged): FA4's FP8 call on this case's inputs (``fa``: FA4's interface
        module; a fake in the CPU tests)."""
        if case.keep_ratio is not None:
            raise Skip("FP8 FA4: not with block sparsity here")
        left, right = case.window
        kw = dict(softmax_scale=case.head_dim ** -0.5, causal=case.causal,
                  window_size_left=None if left < 0 else left, window_size_right=None if right < 0 else right)
        if case.dense:
            b, s = case.batch, case.q_lens[0]
            shape = lambda t: t.view(b, s, *t.shape[1:])  # noqa: E731
            src = [shape(inp.q), shape(inp.k), shape(inp.v)]
            to_jagged = lambda o: o.reshape(-1, *o.shape[2:])  # noqa: E731
        else:
            src = [inp.q_materialized(case), inp.k, inp.v]
            kw.update(cu_seqlens_q=inp.q_offsets_materialized, cu_seqlens_k=inp.kv_offsets, max_seqlen_q=case.max_q,
                      max_seqlen_k=case.max_kv)
            to_jagged = lambda o: o  # noqa: E731
        batch, heads_kv = case.batch, case.num_heads_kv

        def descales(scalars):  # FA4 takes one descale per (sequence, kv head): the tensor's one value in each
            return {f"{n}_descale": d.reshape(1, 1).expand(batch, heads_kv).contiguous()
                    for n, d in zip("qkv", scalars)}

        def quantized():
            pairs = [per_tensor_fp8(t) for t in src]
            return [p[0] for p in pairs], descales([p[1] for p in pairs])

        def attend(data, scales):
            return _first(fa._flash_attn_fwd(*data, **kw, **scales))

        return _quantized_call(quantized, attend, self.prequant), to_jagged

    def prepare(self, case: Case, inp: Inputs) -> Prepared:
        fn, to_jagged = self.fp8_call(self._interface(), case, inp)
        note = "E4M3, one scale per tensor (amax / 448), " + (
            "quantized before timing" if self.prequant else "amax + cast (torch ops) timed with the attention")
        return Prepared(fn, [], to_jagged, tolerance=MXFP8_TOLERANCE, note=note,
                        no_backward="forward only (FA4 refuses FP8 inputs that require grad)")


# --------------------------------------------------------------------------------------------------------------------
# SDPA (cuDNN, flash) on padded dense tensors


def _pad_index(lens, max_len, device) -> torch.Tensor:
    """Rows of a [B*max_len] padded block that hold the jagged rows, in jagged order."""
    return torch.cat([b * max_len + torch.arange(n, device=device) for b, n in enumerate(lens)])


def _pad(x: torch.Tensor, lens, max_len) -> torch.Tensor:
    """Jagged [T, H, D] -> [B, max_len, H, D], zeros in the padding."""
    out = x.new_zeros(len(lens) * max_len, *x.shape[1:])
    out[_pad_index(lens, max_len, x.device)] = x
    return out.view(len(lens), max_len, *x.shape[1:])


class Sdpa:
    def __init__(self, name: str, backend_name: str):
        self.name = name
        self.backend_name = backend_name  # a torch.nn.attention.SDPBackend member name

    def unavailable(self, device) -> Optional[str]:
        if _need_cuda(device) and self.backend_name != "MATH":
            return _need_cuda(device)
        from torch.nn.attention import SDPBackend
        if not hasattr(SDPBackend, self.backend_name):
            return f"this torch has no SDPBackend.{self.backend_name}"
        return None

    def prepare(self, case: Case, inp: Inputs) -> Prepared:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if case.window != (-1, -1):
            raise Skip("SDPA has no sliding window")
        if case.causal and tuple(case.q_lens) != tuple(case.kv_lens):
            raise Skip("SDPA's is_causal is top-left aligned; this case has Lq != Lk")
        padded_flops = 4.0 * case.batch * case.max_q * case.max_kv * case.num_heads_q * case.head_dim
        if padded_flops > SDPA_MAX_PADDED_FLOPS:
            raise Skip(f"padding to the longest sequence makes {padded_flops / 1e12:.0f} TFLOP per forward "
                       f"(cap {SDPA_MAX_PADDED_FLOPS / 1e12:.0f})")
        padded_bytes = inp.k.element_size() * case.batch * case.head_dim * (
            case.max_q * case.num_heads_q + 2 * case.max_kv * case.num_heads_kv)
        if padded_bytes > SDPA_MAX_PADDED_BYTES:
            raise Skip(f"padded q, k, v would take {padded_bytes / 2**30:.0f} GiB, their gradients as much again "
                       f"(cap {SDPA_MAX_PADDED_BYTES / 2**30:.0f} GiB)")
        backend = getattr(SDPBackend, self.backend_name)
        q_src = inp.q_materialized(case)
        q = _leaf(_pad(q_src, case.q_lens, case.max_q))
        k, v = _leaf(_pad(inp.k, case.kv_lens, case.max_kv)), _leaf(_pad(inp.v, case.kv_lens, case.max_kv))
        gqa = case.num_heads_q != case.num_heads_kv
        kw = dict(is_causal=case.causal, scale=case.head_dim ** -0.5)
        if gqa:
            kw["enable_gqa"] = True

        def attend(x):  # [B, S, H, D] -> [B, H, S, D]
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(x.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kw)

        index = _pad_index(case.q_lens, case.max_q, q.device)
        padded = len(set(case.kv_lens)) > 1 or len(set(case.q_lens)) > 1
        # causal with Lq == Lk: the padding keys sit after every real query's last visible key, so the real rows
        # come out right; otherwise the zero keys take part in the softmax
        exact = not padded or (case.causal and tuple(case.q_lens) == tuple(case.kv_lens))
        pad_frac = 1 - case.total_kv / (case.batch * case.max_kv)
        note = f"padded to the longest sequence ({pad_frac:.0%} of keys padding), no key mask" if padded else ""
        return Prepared(lambda: attend(q), [q, k, v],
                        lambda o: o.transpose(1, 2).reshape(-1, *o.shape[1:2], o.shape[-1])[index], exact=exact,
                        note=note, layer=(lambda x: attend(x).transpose(1, 2), q))


class SdpaFp8:
    """Per-head-scaled FP8 attention from a peer (issue 12: "compare with per-tensor FP8 attention from any peer that
    imports"): torch's experimental ``_scaled_dot_product_attention_quantized`` (E4M3 q/k/v, one float32 descale per
    (sequence, kv head), FlashAttention-3 kernels registered into SDPA; forward only), on inputs padded to the
    longest sequence and quantized before timing (as our prequantized MXFP8 rows). Unavailable, with the reason,
    where FA3 (``flash_attn_interface``) does not import or the GPU is not sm_90."""

    name = "sdpa_fp8"

    def unavailable(self, device) -> Optional[str]:
        if _need_cuda(device):
            return _need_cuda(device)
        try:
            from torch.nn.attention import _fa3
            from torch.nn.attention.experimental import _scaled_dot_product_attention_quantized  # noqa: F401
            if not hasattr(self, "_fa3_handle"):
                self._fa3_handle = _fa3.register_flash_attention_fa3()
        except Exception as e:  # noqa: BLE001 (an optional peer: any failure is a reason)
            return f"FA3 per-head FP8 SDPA unavailable ({one_line(e, 120)})"
        return None

    def prepare(self, case: Case, inp: Inputs) -> Prepared:
        from torch.nn.attention.experimental._scaled_dot_product_attention_quantized import (
            _scaled_dot_product_attention_quantized as sdpa_fp8)
        if case.window != (-1, -1) or case.num_heads_q != case.num_heads_kv:
            raise Skip("per-head FP8 SDPA: no sliding window, no GQA here")
        if case.causal and tuple(case.q_lens) != tuple(case.kv_lens):
            raise Skip("SDPA's is_causal is top-left aligned; this case has Lq != Lk")
        q, k, v = (_pad(t, lens, m).transpose(1, 2) for t, lens, m in (
            (inp.q_materialized(case), case.q_lens, case.max_q), (inp.k, case.kv_lens, case.max_kv),
            (inp.v, case.kv_lens, case.max_kv)))

        def quantize(t):  # one descale per (sequence, head): amax / 448 (E4M3's largest finite value)
            descale = t.float().abs().amax(dim=(2, 3)).clamp_min(1e-12) / 448.0
            return (t.float() / descale[:, :, None, None]).to(torch.float8_e4m3fn), descale

        (q8, dq), (k8, dk), (v8, dv) = quantize(q), quantize(k), quantize(v)
        kw = dict(is_causal=case.causal, scale=case.head_dim ** -0.5, q_descale=dq, k_descale=dk, v_descale=dv)

        def fn():
            return sdpa_fp8(q8, k8, v8, **kw)

        index = _pad_index(case.q_lens, case.max_q, inp.k.device)
        padded = len(set(case.kv_lens)) > 1 or len(set(case.q_lens)) > 1
        exact = not padded or (case.causal and tuple(case.q_lens) == tuple(case.kv_lens))
        return Prepared(fn, [], lambda o: o.transpose(1, 2).reshape(-1, *o.shape[1:2], o.shape[-1])[index],
                        exact=exact, no_backward="forward only (torch's quantized SDPA has no backward)",
                        tolerance=MXFP8_TOLERANCE,
                        note="E4M3 with one descale per (sequence, head), padded, quantized before timing")


# --------------------------------------------------------------------------------------------------------------------
# FlexAttention (compiled) with a document mask over the packed sequences


class FlexAttention:
    name = "flex"
    handles_sparse = True  # given our selection as its BlockMask

    def __init__(self, compile_kernel: bool = True):
        self.compile_kernel = compile_kernel
        self._flex = None
        self._masks = {}

    def unavailable(self, device) -> Optional[str]:
        try:
            from torch.nn.attention import flex_attention  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return f"no FlexAttention in this torch ({one_line(e, 100)})"
        return None

    def _kernel(self, device):
        if self._flex is None:
            from torch.nn.attention.flex_attention import flex_attention
            on_cuda = torch.device(device).type == "cuda"
            if self.compile_kernel and on_cuda:
                import torch._dynamo.config as dynamo_config
                for knob in ("recompile_limit", "cache_size_limit"):  # one compile per head dim x GQA x mode
                    if hasattr(dynamo_config, knob):
                        setattr(dynamo_config, knob, max(64, getattr(dynamo_config, knob)))
                # the bwd mode times the backward alone through a retained graph, which compiled backwards with
                # donated buffers refuse; donation only saves memory
                import torch._functorch.config as functorch_config
                functorch_config.donated_buffer = False
                self._flex = torch.compile(flex_attention)
            else:  # eager: materializes the scores; fine for the small CPU cases it is used on
                import warnings
                warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
                self._flex = flex_attention
        return self._flex

    def _block_mask(self, case: Case, device):
        key = (case.q_lens, case.kv_lens, case.causal, case.window, case.dense, str(device))
        if key not in self._masks:
            self._masks[key] = self._make_block_mask(case, torch.device(device))
        return self._masks[key]

    @staticmethod
    def _make_block_mask(case: Case, device):
        """A document mask over packed sequences (dense: one document per batch entry), or None when nothing is masked.

        Every bound is a tensor, never a Python constant, so one compiled kernel serves all cases of a head dim:
        only shapes change between cases (Dynamo makes them dynamic after the second), not the mask's code.
        """
        from torch.nn.attention.flex_attention import create_block_mask
        left, right = case.window
        if case.causal:
            right = 0 if right < 0 else min(right, 0)
        if case.dense and (left, right) == (-1, -1):
            return None
        unbounded = 1 << 30
        lo_t = torch.tensor(left if left >= 0 else unbounded, device=device)
        hi_t = torch.tensor(right if right >= 0 else unbounded, device=device)
        q_lens = torch.tensor(case.q_lens[:1] if case.dense else case.q_lens, device=device)
        kv_lens = torch.tensor(case.kv_lens[:1] if case.dense else case.kv_lens, device=device)
        docs = torch.arange(len(q_lens), device=device)
        q_doc = torch.repeat_interleave(docs, q_lens)
        kv_doc = torch.repeat_interleave(docs, kv_lens)
        q_start = torch.cumsum(q_lens, 0) - q_lens
        kv_start = torch.cumsum(kv_lens, 0) - kv_lens
        # each query's position on its own sequence's key axis (bottom-right alignment), each key's position
        q_center = torch.arange(len(q_doc), device=device) - q_start[q_doc] + (kv_lens - q_lens)[q_doc]
        kv_pos = torch.arange(len(kv_doc), device=device) - kv_start[kv_doc]

        def mask_mod(b, h, qi, ki):
            c, j = q_center[qi], kv_pos[ki]
            return (q_doc[qi] == kv_doc[ki]) & (j >= c - lo_t) & (j <= c + hi_t)

        return create_block_mask(mask_mod, None, None, len(q_doc), len(kv_doc), device=device,
                                 _compile=device.type == "cuda")

    def prepare(self, case: Case, inp: Inputs) -> Prepared:
        flex = self._kernel(inp.k.device)
        if case.keep_ratio is not None:  # the same blocks as ours: our selection of these inputs as the BlockMask
            from jfa_ops.interop import to_flex_block_mask
            index, count = sparse_selection(case, inp)
            block_mask = to_flex_block_mask(index, count, inp.q_offsets, inp.kv_offsets,
                                            num_heads_q=case.num_heads_q, block_q=case.block, block_kv=case.block,
                                            causal=case.causal, window=tuple(case.window),
                                            _compile=inp.k.device.type == "cuda")
        else:
            block_mask = self._block_mask(case, inp.k.device)
        if case.dense:
            b, s = case.batch, case.q_lens[0]
            shape = lambda t: t.view(b, s, *t.shape[1:])  # noqa: E731
            q, k, v = shape(inp.q), shape(inp.k), shape(inp.v)
        else:  # one batch of T packed tokens
            q, k, v = inp.q_materialized(case)[None], inp.k[None], inp.v[None]
        on_cuda = inp.k.device.type == "cuda"
        q, k, v = (_leaf(t) if on_cuda else t.clone() for t in (q, k, v))  # no FlexAttention backward on the CPU
        kw = dict(block_mask=block_mask, scale=case.head_dim ** -0.5)
        if case.num_heads_q != case.num_heads_kv:
            kw["enable_gqa"] = True

        def attend(x):  # [B, S, H, D] -> [B, H, S, D]
            return flex(x.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kw)

        return Prepared(lambda: attend(q), [q, k, v],
                        lambda o: o.transpose(1, 2).reshape(-1, *o.shape[1:2], o.shape[-1]),
                        no_backward="" if on_cuda else "FlexAttention has no backward on the CPU",
                        layer=(lambda x: attend(x).transpose(1, 2), q))


_FP8_SCORE_SCALES = {}


def _fp8_score_scale(device) -> tuple:
    """(a float32 device scalar, a score_mod multiplying the scores by it), one pair per device: every FP8 flex call
    passes the same function reading the same tensor (written in place with q's descale x k's), so Dynamo's guards
    on the score_mod hold across cases and rows and FlexAttention compiles once per shape and mask, not per call."""
    key = str(torch.device(device))
    if key not in _FP8_SCORE_SCALES:
        qk_descale = torch.ones((), dtype=torch.float32, device=device)

        def score_mod(score, b, h, q_idx, kv_idx):
            return score * qk_descale

        _FP8_SCORE_SCALES[key] = (qk_descale, score_mod)
    return _FP8_SCORE_SCALES[key]


class FlexFp8(FlexAttention):
    """Per-tensor FP8 attention on sm_90 from a peer: compiled FlexAttention on E4M3 q/k/v (torch's FP8 path since
    2.8: Triton FP8 dots, V given column-major as ``_enforce_mem_layouts`` wants), each tensor scaled by amax / 448
    (``per_tensor_fp8``), q and k's descales applied to the scores by a ``score_mod`` that reads a device scalar (no
    host sync, no recompile when it changes), V's to the output, which FlexAttention returns in E4M3 (the peer casts
    it to bf16). ``prequant``: quantized before timing ("flex fp8 prequant"); else the amax, casts and V's
    column-major copy are timed with the attention ("flex fp8"). Forward only; the document mask of the bf16 flex row.
    Inductor cannot compile FlexAttention under the TLX Triton (3.8): run it in a stock-triton process."""

    handles_sparse = False
    only_suite = "mxfp8"

    def __init__(self, prequant: bool = False, compile_kernel: bool = True):
        super().__init__(compile_kernel)
        self.prequant = prequant
        self.name = "flex fp8 prequant" if prequant else "flex fp8"

    def unavailable(self, device) -> Optional[str]:
        reason = _need_cuda(device) or super().unavailable(device)
        if reason:
            return reason
        if triton_pin_mismatch():  # Inductor's FlexAttention failed to compile under triton 3.8 (NOTES v12, v16)
            return ("Inductor's FlexAttention needs the triton torch pins; this process has another (the TLX "
                    "install): run flex_fp8 in a stock-triton process")
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        return None if (major, minor) >= (8, 9) else f"FP8 dots need sm_89 or later; this GPU is sm_{major}{minor}"

    def fp8_call(self, flex, block_mask, case: Case, inp: Inputs):
        """(forward callable, output -> jagged) of ``flex`` (FlexAttention, or a fake in the CPU tests) on this
        case's E4M3 inputs."""
        heads, dim = case.num_heads_q, case.head_dim
        if case.dense:
            b, s = case.batch, case.q_lens[0]
            src = [t.view(b, s, *t.shape[1:]) for t in (inp.q, inp.k, inp.v)]
        else:  # one batch of T packed tokens
            src = [inp.q_materialized(case)[None], inp.k[None], inp.v[None]]
        kw = dict(block_mask=block_mask, scale=dim ** -0.5)
        if case.num_heads_q != case.num_heads_kv:
            kw["enable_gqa"] = True
        qk_descale, score_mod = _fp8_score_scale(inp.k.device)

        def quantized():  # [B, S, H, D] -> [B, H, S, D] E4M3; V column-major (the layout FP8 flex wants)
            (q8, dq), (k8, dk), (v8, dv) = (per_tensor_fp8(t) for t in src)
            return (q8.transpose(1, 2), k8.transpose(1, 2), v8.permute(0, 2, 3, 1).contiguous().transpose(-2, -1),
                    dq * dk, dv)

        def attend(q8, k8, v8, scores_descale, dv):
            qk_descale.copy_(scores_descale)  # the shared scalar this call's score_mod reads (a 4-byte copy)
            return flex(q8, k8, v8, score_mod=score_mod, **kw).to(torch.bfloat16) * dv

        return _quantized_call(quantized, attend, self.prequant), lambda o: o.transpose(1, 2).reshape(-1, heads, dim)

    def prepare(self, case: Case, inp: Inputs) -> Prepared:
        if case.keep_ratio is not None:
            raise Skip("FP8 flex: not with block sparsity here")
        fn, to_jagged = self.fp8_call(self._kernel(inp.k.device), self._block_mask(case, inp.k.device), case, inp)
        note = "E4M3, one scale per tensor (amax / 448), E4M3 output, " + (
            "quantized before timing" if self.prequant else "amax + casts (torch ops) timed with the attention")
        return Prepared(fn, [], to_jagged, tolerance=MXFP8_TOLERANCE, note=note,
                        no_backward="forward only (the FP8 peer row)")


# --------------------------------------------------------------------------------------------------------------------
# torch.nn.attention.varlen.varlen_attn (FlashAttention-2 underneath)


class VarlenAttn:
    name = "varlen"

    def unavailable(self, device) -> Optional[str]:
        if _need_cuda(device):
            return _need_cuda(device)
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return f"no torch.nn.attention.varlen.varlen_attn ({one_line(e, 100)})"
        return None

    def prepare(self, case: Case, inp: Inputs) -> Prepared:
        from torch.nn.attention.varlen import varlen_attn
        params = inspect.signature(varlen_attn).parameters
        left, right = case.window
        kw = dict(scale=case.head_dim ** -0.5)
        note = ""
        if "is_causal" in params:
            kw["is_causal"] = case.causal
            window = (left, right)
        else:  # causal is the window's right edge at 0
            window = (left, 0 if right < 0 else min(right, 0)) if case.causal else (left, right)
        if window != (-1, -1):
            if "window_size" not in params:
                raise Skip("this varlen_attn has neither window_size nor is_causal")
            kw["window_size"] = window
        k_src, v_src = inp.k, inp.v
        if case.num_heads_q != case.num_heads_kv:
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                group = case.num_heads_q // case.num_heads_kv
                k_src, v_src = k_src.repeat_interleave(group, 1), v_src.repeat_interleave(group, 1)
                note = "no enable_gqa: K/V heads expanded before timing"
        q, k, v = _leaf(inp.q_materialized(case)), _leaf(k_src), _leaf(v_src)
        qo, ko = inp.q_offsets_materialized, inp.kv_offsets

        def attend(x):
            return _first(varlen_attn(x, k, v, qo, ko, case.max_q, case.max_kv, **kw))

        return Prepared(lambda: attend(q), [q, k, v], lambda o: o, note=note, layer=(attend, q))


# --------------------------------------------------------------------------------------------------------------------
# The oracle: jfa_ops.testing's (float64, one sequence at a time), small cases only

ORACLE_MAX_WORK = 1 << 24


def oracle_output(case: Case, inp: Inputs) -> Optional[torch.Tensor]:
    """``jfa_ops.testing.reference_attention`` of the case, [T_q (B*Lq), Hq, D] float64; None when too large."""
    if case.pairs() * case.num_heads_q > ORACLE_MAX_WORK:
        return None
    masks = None
    if case.keep_ratio is not None:  # the float64 selection, then the block-sparse oracle
        from jfa_ops.testing import block_sparse_masks
        index, count = sparse_selection(case, inp, backend="reference")
        masks = block_sparse_masks(index, count, inp.q_offsets, inp.kv_offsets, block_q=case.block,
                                   block_kv=case.block)
    out, _ = reference_attention(inp.q_materialized(case), inp.k, inp.v, inp.q_offsets_materialized, inp.kv_offsets,
                                 causal=case.causal, window=case.window, block_masks=masks)
    return out


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.detach().float()
    if out.shape != ref.shape:
        return float("nan")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


# --------------------------------------------------------------------------------------------------------------------

PEER_ORDER = ("fa4", "cudnn", "sdpa_flash", "flex", "varlen")
# not measured by default: SDPA's math backend (runs on the CPU: tests the padding); the mxfp8 suite's FP8 peers:
# per-head FP8 SDPA (FA3), FA4's and FlexAttention's per-tensor FP8 forwards (two rows each: quantization timed,
# and before timing)
EXTRA_PEERS = ("sdpa_math", "sdpa_fp8", "fa4_fp8", "flex_fp8")


def make_peers(name: str, flex_compile: bool = True) -> list:
    """The peers a ``--peers`` name stands for (one, but ``fa4_fp8``: its two rows)."""
    if name == "fa4_fp8":
        return [FlashAttention4Fp8(), FlashAttention4Fp8(prequant=True)]
    if name == "flex_fp8":
        return [FlexFp8(compile_kernel=flex_compile), FlexFp8(prequant=True, compile_kernel=flex_compile)]
    return [make_peer(name, flex_compile)]


def make_peer(name: str, flex_compile: bool = True):
    if name == "fa4":
        return FlashAttention4()
    if name == "cudnn":
        return Sdpa("cudnn", "CUDNN_ATTENTION")
    if name == "sdpa_flash":
        return Sdpa("sdpa_flash", "FLASH_ATTENTION")
    if name == "sdpa_math":
        return Sdpa("sdpa_math", "MATH")
    if name == "flex":
        return FlexAttention(compile_kernel=flex_compile)
    if name == "varlen":
        return VarlenAttn()
    if name == "sdpa_fp8":
        return SdpaFp8()
    if name == "fa4_fp8":  # its quantization-timed row (make_peers gives both)
        return FlashAttention4Fp8()
    if name == "flex_fp8":
        return FlexFp8(compile_kernel=flex_compile)
    raise SystemExit(f"unknown peer {name!r}; choose from {', '.join(PEER_ORDER + EXTRA_PEERS)}")
