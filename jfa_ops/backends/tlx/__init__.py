"""The TLX backend (experimental): warp-specialized Hopper (sm_90) kernels written in TLX (Triton Low-level
Extensions, ``pip install jfa_ops[tlx]``: the ``triton-utlx`` plugin for stock Triton 3.8).

What it runs: fp16/bf16 attention with head_dim 64, 128 or 256 on an sm_90 GPU (causal, windows, GQA, broadcast Q,
jagged), forward (``attn_fwd.py``) and backward (``attn_bwd.py``: v2 consumers with dQ split, ``JFA_TLX_BWD=0``
for the triton backward). Everything else is declined with a reason, so the automatic choice routes it to
``triton``: other head dims, fp32, ``deterministic=True`` (an explicit ``backend="tlx"`` refuses it), other GPUs.

Importing this module never imports triton: it only checks that the plugin is installed (else ImportError, which the
registry records: ``unavailable_reason("tlx")``). The TLX kernels import on the first CUDA problem ``supports`` sees.
The dense op is chosen automatically on sm_90 where it pays (``auto_supports``: calls of at least the triton backend's
``TMA_MIN_ROWS`` rows, not traced into a compiled graph; the rest stays on triton); ``JFA_TLX_AUTO=0`` turns that
off (then by name only: ``backend="tlx"`` or ``JFA_BACKEND=tlx``), ``JFA_TLX_AUTO=always`` takes every call it runs.

MXFP8 attention (``jfa_ops.mxfp8_attention``, family ``mxfp8_attention``, issue 12): the forward in
``mxfp8_attn_fwd.py`` (E4M3 wgmma for both matmuls, head_dim 64/128), chosen automatically since its GPU check
(``JFA_TLX_MXFP8=0``: off); bf16 inputs are quantized by the triton kernel; the backward is ``mxfp8_attn_bwd.py``
(the bf16 TLX backward with P and dS rounded to MXFP8 values, on MX-valued operands) for the calls its
``backward_reason`` takes (``configs.MXFP8_BACKWARD``, on since its GPU check; ``JFA_TLX_MXFP8_BWD=0``: off), else the
triton MXFP8 backward.

Block-sparse attention (``jfa_ops.block_sparse_attention``, family ``block_sparse``): the same forward kernel with
SPARSE (each work item walks only its Q block's selected KV blocks), head_dim 64/128, block_q a multiple of 128 and
block_kv of the key tile (128; select_kv_blocks' defaults fit); the selection (family ``select_kv_blocks``, so that
``sparse_attention(..., backend="tlx")`` runs) is the triton backend's; the backward is the TLX v2 backward with
SPARSE (each key tile walks the query tiles of the Q blocks that selected it; head_dim 64/128, block_q a multiple of
64), on since its GPU check (``configs.SPARSE_BACKWARD``; ``JFA_TLX_SPARSE_BWD=0``: the triton sparse backward).
Chosen automatically (above triton) since its GPU check; ``JFA_TLX_SPARSE=0`` turns that off (``configs.SPARSE_AUTO``).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
from typing import Optional

import torch

from ..base import AttentionParams, Backend, FamilyImpl, Problem, device_guard, unit_stride_pair
from . import configs
from .configs import fwd_config

__all__ = ["forward", "backward", "supports", "auto_supports", "block_sparse_forward", "block_sparse_supports",
           "BACKEND", "AUTO_SELECT", "AUTO_MODE"]


def _tlx_installed() -> bool:
    """The uTLX plugin (``triton-utlx``) or a Triton fork that ships TLX inside it, found without importing triton."""
    if importlib.util.find_spec("utlx_plugin") is not None:
        return True
    spec = importlib.util.find_spec("triton")
    return spec is not None and any(os.path.isdir(os.path.join(p, "language", "extra", "tlx"))
                                    for p in spec.submodule_search_locations or ())


if not _tlx_installed():
    raise ImportError("TLX is not installed (pip install 'jfa_ops[tlx]': triton==3.8.0 and triton-utlx)")

# The automatic choice and the dense op (issue 10), env JFA_TLX_AUTO read at import: "1" (the default) prefers tlx
# over triton on sm_90 where ``auto_supports`` (the size rule) takes the call; "always": every call tlx runs, small
# and traced ones too (the GPU suite's coverage setting, what "1" meant before the size rule); "0": only by name
# (``backend="tlx"``, ``JFA_BACKEND=tlx``). Its block-sparse family takes the same size rule ("always" drops it
# there too) under its own switch (JFA_TLX_SPARSE), its MXFP8 family its priority alone.
AUTO_MODE = os.environ.get("JFA_TLX_AUTO", "1")
AUTO_SELECT = AUTO_MODE != "0"
_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=None)
def _import_reason() -> Optional[str]:
    """None when the TLX language imports (with the plugin registered before triton loads), else why not."""
    try:
        if importlib.util.find_spec("_utlx_autoregister") is not None:
            reason = _plugin_too_late()
            if reason is not None:
                return reason
            import _utlx_autoregister  # noqa: F401 (pip --target installs skip the plugin's .pth file)
        import triton.language.extra.tlx  # noqa: F401
        from . import attn_fwd  # noqa: F401 (compiles nothing: kernels compile on first launch)
    except Exception as e:  # an incompatible triton raises more than ImportError
        return f"TLX does not import ({type(e).__name__}: {e})"
    return None


def _plugin_too_late() -> Optional[str]:
    """Why TLX must not be imported in this process, or None. Triton 3.8 loads the uTLX plugin only while triton
    itself is imported (``TRITON_PLUGIN_PATHS``, set by the plugin's .pth at startup, which a ``pip --target`` install
    never runs). Importing TLX after triton without it fails, and the failed import leaves triton's compiler asking
    for the plugin's passes: every later triton compile in the process raises (``no attribute
    'utlx_convert_triton_to_tritongpu'``), the triton backend's included (H200, 2026-12-03, bench/NOTES.md v20)."""
    if ("triton" not in sys.modules or "utlx" in os.environ.get("TRITON_PLUGIN_PATHS", "")
            or "utlx_plugin" in sys.modules):  # imported by the user: the plugin's documented alternative to its .pth
        return None
    return ("the TLX plugin was not registered before triton was imported (a `pip install --target` skips its "
            "utlx_plugin.pth): import _utlx_autoregister before triton, or set TRITON_PLUGIN_PATHS to "
            "utlx_plugin/libutlx.so; importing TLX now would break every later triton compile in this process")


@functools.lru_cache(maxsize=None)
def _capability(device_index: int):
    return torch.cuda.get_device_capability(device_index)


def supports(problem: Problem) -> Optional[str]:
    """None when the tlx backend can run ``problem``, else the reason (those calls go to ``triton``)."""
    if problem.device_type != "cuda":
        return f"needs a CUDA sm_90 GPU, got {problem.device_type}"
    if torch.version.cuda is None:
        return "needs an NVIDIA (CUDA) build of torch"
    if problem.dtype not in _SUPPORTED_DTYPES:
        return f"dtype {problem.dtype} not supported (fp16, bf16)"
    if fwd_config(problem.head_dim) is None:
        return f"head_dim {problem.head_dim} not supported (64, 128, 256)"
    if problem.deterministic:
        return "deterministic=True is not implemented (the triton backend runs it)"
    if problem.num_heads_kv <= 0 or problem.num_heads_q % problem.num_heads_kv != 0:
        return f"num_heads_q {problem.num_heads_q} must be a multiple of num_heads_kv {problem.num_heads_kv}"
    index = problem.device_index if problem.device_index is not None else torch.cuda.current_device()
    if _capability(index) != (9, 0):
        return f"the kernels are sm_90a (Hopper) code; cuda:{index} is sm_{''.join(map(str, _capability(index)))}"
    return _import_reason()


def auto_supports(problem: Problem) -> Optional[str]:
    """The automatic choice's rule for the dense op and the block-sparse family (shapes only, never a sync): None
    where tlx pays, else why the call stays on triton. Eager dense calls choose once per call signature
    (``ops.attention._direct_call``), so the rule costs nothing per call (the op paths: a few comparisons).

    Small calls: when q and k both have fewer rows than the triton backend's ``TMA_MIN_ROWS`` (4096), triton runs
    its pointer path, which builds no TMA descriptor, while the tlx kernels take three (q/k/v) rebuilt and encoded
    on every call: H200 (bench/NOTES.md "automatic choice"), B4 lengths <= 64 H8 D128 causal bf16, no_grad forward
    63.7 us on tlx vs 49.3 on triton (forward + backward 400 vs 386) for ~10 us of GPU work: the host path decides
    such calls. From TMA_MIN_ROWS rows on, triton takes K/V descriptors too (the host gap shrinks by those two, to
    ~5-9 us, hidden wherever the GPU is the bottleneck), and the GPU work of a call that large can outlast the host
    path (one causal 4096-row sequence at H8 D128: ~78 us of triton forward at 440 TFLOP/s), where the tlx kernels
    are 1.07-1.35x triton's forward and 1.24-1.34x its backward. One threshold for both, so that when descriptors
    get cheaper (TMA_MIN_ROWS lowered) the rule follows. The block-sparse forward pays the same (three descriptors,
    a full path per call: 38.0 vs 26.8 us of CPU per small forward with launches stubbed), and triton's sparse
    kernels take TMA from the same TMA_MIN_ROWS.

    Traced calls (torch.compile, export): triton, which traces into the graph (Inductor launches its kernels, no op
    dispatch per call, CUDA graphs capture them, AOTInductor packages run them without Python), while tlx would
    stay an opaque op. Deciding on static sizes instead would make a model's backend flip when torch.compile
    recompiles it with dynamic sizes (the second batch shape), and symbolic sizes cannot be read without a guard.
    ``backend="tlx"`` runs it opaque."""
    if AUTO_MODE == "always":
        return None
    if problem.traced:
        return ("a traced call (torch.compile, export): the triton backend's kernels trace into the graph, tlx "
                "would stay an opaque op (backend='tlx' runs it so)")
    if problem.rows_q is None or problem.rows_kv is None:
        return "its row counts are not known (symbolic or not given): the size rule takes tlx from known sizes only"
    min_rows = auto_min_rows()
    if max(problem.rows_q, problem.rows_kv) < min_rows:
        return (f"a small call (q {problem.rows_q} and k {problem.rows_kv} rows, below the triton backend's "
                f"TMA_MIN_ROWS {min_rows}): the host path decides its time, and triton's is shorter")
    return None


def auto_min_rows() -> int:
    """Rows (q or k) from which the automatic rule takes tlx: the triton backend's ``TMA_MIN_ROWS``. The compile
    path ``split`` (``ops.attention._split``) keeps the op opaque from the same count."""
    return _triton_attn_fwd().TMA_MIN_ROWS


@functools.lru_cache(maxsize=None)
def _triton_attn_fwd():
    """The triton forward module (its ``TMA_MIN_ROWS`` is read per choice: tests and devcheck change it)."""
    from ..triton import attn_fwd

    return attn_fwd


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: Optional[torch.Tensor],
            kv_offsets: torch.Tensor, params: AttentionParams):
    """(out [T_q, Hq, D], lse [Hq, T_q] float32); see ``jfa_ops.backends.base``."""
    q_offsets, kv_offsets = unit_stride_pair(q_offsets, kv_offsets)  # the kernels read them with unit stride
    from .attn_fwd import attention_forward

    with device_guard(q.device):
        return attention_forward(q, k, v, q_offsets, kv_offsets, params)


def backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params: AttentionParams):
    """The TLX backward (``attn_bwd.py``: D64/D128) when ``configs.BACKWARD`` is on (the default; env
    ``JFA_TLX_BWD=0`` turns it off; the consumers' dQ split by default, ``configs.BACKWARD_DQ_SHARED``), else the
    triton backend's, which reads the same (out, lse) the TLX forward writes."""
    q_offsets, kv_offsets = unit_stride_pair(q_offsets, kv_offsets)  # the kernels read them with unit stride
    if configs.BACKWARD and configs.bwd_config_v2(q.shape[-1]) is not None:
        from .attn_bwd import attention_backward

        with device_guard(q.device):
            return attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params,
                                      **configs.backward_options(q.shape[-1], k.shape[1]))
    from ..triton import backward as triton_backward

    return triton_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params)


def mxfp8_attention_supports(problem: Problem) -> Optional[str]:
    """The MXFP8 forward (``mxfp8_attn_fwd.py``): this backend's device rules, head_dim 64/128, the triton MXFP8
    family's rules (its quantize kernel and backward serve this family)."""
    from ..triton import mxfp8_attention_supports as triton_rules

    if problem.device_type != "cuda":
        return f"needs a CUDA sm_90 GPU, got {problem.device_type}"
    if configs.mxfp8_fwd_config(problem.head_dim) is None:
        return f"head_dim {problem.head_dim}: the TLX MXFP8 forward runs head_dim 64 and 128"
    reason = triton_rules(problem)
    if reason is None and torch.version.cuda is not None:
        index = problem.device_index if problem.device_index is not None else torch.cuda.current_device()
        if _capability(index) != (9, 0):
            reason = f"the kernels are sm_90a (Hopper) code; cuda:{index} is sm_{''.join(map(str, _capability(index)))}"
    return reason or _import_reason()


def mxfp8_attention_forward(q_mx, k_mx, v_mx, q_offsets, kv_offsets, params, out_dtype):
    """(out, lse) of MXFP8 attention from (data, scale) pairs: the TLX MXFP8 forward."""
    q_offsets, kv_offsets = unit_stride_pair(q_offsets, kv_offsets)  # the kernels read them with unit stride
    from ..triton.common import packed_mx_pair
    from .mxfp8_attn_fwd import attention_forward

    q_mx, k_mx, v_mx = packed_mx_pair(q_mx), packed_mx_pair(k_mx), packed_mx_pair(v_mx)  # pairs of any layout
    with device_guard(q_mx[0].device):
        return attention_forward(q_mx, k_mx, v_mx, q_offsets, kv_offsets, params, out_dtype)


def mxfp8_attention_quantizing(q, k, v, q_offsets, kv_offsets, params, rounding):
    """(out, lse) of MXFP8 attention from high-precision q, k, v: the quantize kernel writes the TLX forward's
    re-based operands directly (``configs.MXFP8_FUSED_QUANTIZE``), else the MX pairs then the re-basing stage."""
    q_offsets, kv_offsets = unit_stride_pair(q_offsets, kv_offsets)  # the kernels read them with unit stride
    from .mxfp8_attn_fwd import attention_forward_quantizing

    if not configs.MXFP8_FUSED_QUANTIZE:
        from .. import triton as triton_backend
        import meta_kernels.mxfp8 as mx

        pairs = [triton_backend.quantize_mxfp8(x, offs, block, rounding)
                 for x, offs, block in ((q, None, mx.Q_BLOCK), (k, None, mx.K_BLOCK), (v, kv_offsets, mx.V_BLOCK))]
        return mxfp8_attention_forward(*pairs, q_offsets, kv_offsets, params, q.dtype)
    with device_guard(q.device):
        return attention_forward_quantizing(q, k, v, q_offsets, kv_offsets, params, rounding)


def _mxfp8_attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params, rounding,
                              empty_rows=True):
    """(dq, dk, dv) of ``jfa::mxfp8_attention``: the TLX MXFP8 backward (``mxfp8_attn_bwd.py``) where
    ``configs.MXFP8_BACKWARD`` is on (the default; env JFA_TLX_MXFP8_BWD=0: off) and it takes the call, else the triton MXFP8 backward."""
    q_offsets, kv_offsets = unit_stride_pair(q_offsets, kv_offsets)  # the kernels read them with unit stride
    if configs.MXFP8_BACKWARD:
        from . import mxfp8_attn_bwd

        if mxfp8_attn_bwd.backward_reason(q, k, params) is None:
            return mxfp8_attn_bwd.attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets,
                                                     params, rounding, empty_rows=empty_rows)
    from .. import triton as triton_backend

    return triton_backend.mxfp8_attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets,
                                                   params, rounding, empty_rows=empty_rows)


def _mxfp8_triton(name: str):
    """The triton backend's function ``name`` (its MXFP8 quantize kernel and backward serve this backend too)."""
    def run(*args):
        from .. import triton as triton_backend

        return getattr(triton_backend, name)(*args)

    run.__name__ = name
    return run


def block_sparse_supports(problem: Problem) -> Optional[str]:
    """None when the block-sparse forward runs ``problem``, else why not: this backend's rules, the kernel's
    (``configs.sparse_reason``: head_dim 64/128, blocks of whole tiles), the triton backend's block-size rules."""
    from ..triton import block_sparse_supports as triton_rules

    return supports(problem) or configs.sparse_reason(problem.head_dim, problem.block_q, problem.block_kv) \
        or triton_rules(problem)


def block_sparse_forward(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, params):
    """(out, lse) of ``jfa::block_sparse_attention``: the TLX forward walking the selected blocks only."""
    q_offsets, kv_offsets = unit_stride_pair(q_offsets, kv_offsets)  # the kernels read them with unit stride
    from .attn_fwd import block_sparse_forward as run

    with device_guard(q.device):
        return run(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, params)


def _block_sparse_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, kv_block_index,
                           kv_block_count, params: AttentionParams):
    """(dq, dk, dv) of ``jfa::block_sparse_attention``: the TLX block-sparse backward (``attn_bwd.py``, the v2
    backward with SPARSE) when ``configs.SPARSE_BACKWARD`` is on (the default since its GPU check; env
    ``JFA_TLX_SPARSE_BWD=0``: off) and it runs the call (``attn_bwd.block_sparse_backward_reason``), else the triton backend's (it reads the
    same out/lse)."""
    q_offsets, kv_offsets = unit_stride_pair(q_offsets, kv_offsets)  # the kernels read them with unit stride
    args = (grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, kv_block_index, kv_block_count, params)
    if configs.SPARSE_BACKWARD:
        from .attn_bwd import block_sparse_backward, block_sparse_backward_reason

        if block_sparse_backward_reason(q, k, kv_block_index, params) is None:
            with device_guard(q.device):
                return block_sparse_backward(*args, dq_shared=configs.BACKWARD_DQ_SHARED,
                                             head_group=_sparse_head_group(q, k, kv_offsets, kv_block_index,
                                                                           params),
                                             uniform_walk=configs.SPARSE_BACKWARD_UNIFORM_WALK,
                                             item_order=configs.BACKWARD_ITEM_ORDER,
                                             group_order=configs.BACKWARD_GROUP_ORDER,
                                             kv_early=configs.SPARSE_BACKWARD_KV_EARLY,
                                             store_tma=configs.BACKWARD_STORE_TMA)
    from ..triton import block_sparse_backward as triton_backward

    return triton_backward(*args)


def _sparse_head_group(q, k, kv_offsets, kv_block_index, params) -> int:
    """The block-sparse backward's head group: ``configs.head_group``'s (JFA_TLX_BWD_HEAD_GROUP, else
    SPARSE_HEAD_GROUP), or with ``configs.SPARSE_BACKWARD_AUTO_GROUP`` and no explicit group the shape rule's
    (``configs.sparse_auto_head_group``: host values only, no sync; the longest sequence from max_seqlen_kv or, not
    given, the selection's key-block extent, which follows from it)."""
    from ..triton import common

    heads_kv = k.shape[1]
    if not configs.SPARSE_BACKWARD_AUTO_GROUP or configs.BACKWARD_HEAD_GROUP is not None:
        return configs.head_group(heads_kv, sparse=True)
    max_kv = params.max_seqlen_kv if params.max_seqlen_kv >= 0 else kv_block_index.shape[3] * params.block_kv
    num_seqs = kv_offsets.numel() - 1
    q_rows = q.shape[0] * num_seqs if params.broadcast_q else q.shape[0]
    group = configs.sparse_auto_head_group(heads_kv, q.shape[1] // heads_kv, q.shape[2], q_rows, k.shape[0], num_seqs,
                                           max_kv, params.causal, common.num_sms(q.device),
                                           configs.AUTO_GROUP_L2_BYTES or common.l2_bytes(q.device))
    return configs.head_group(heads_kv, group, sparse=True)


def _select_kv_blocks(*args):
    """The triton backend's selection (stage 1), so that ``sparse_attention(..., backend="tlx")`` runs both stages."""
    from ..triton import select_kv_blocks

    return select_kv_blocks(*args)


def _select_supports(problem: Problem) -> Optional[str]:
    from ..triton import block_sparse_supports as triton_rules

    return supports(problem) or triton_rules(problem)


BACKEND = Backend(name="tlx", forward=forward, backward=backward, supports=supports,
                  priority=20 if AUTO_SELECT else 5, auto_devices=("cuda",), checks_offsets=True,
                  auto_supports=auto_supports, families={
                      # automatic choice ranks it above triton (10) unless JFA_TLX_SPARSE=0 (configs.SPARSE_AUTO)
                      # with the dense op's size rule: a small call pays the same descriptor host cost
                      "block_sparse": FamilyImpl(block_sparse_forward, _block_sparse_backward,
                                                 supports=block_sparse_supports,
                                                 priority=20 if configs.SPARSE_AUTO else 5,
                                                 auto_supports=auto_supports),
                      # by name only: the automatic choice runs the selection on triton itself
                      "select_kv_blocks": FamilyImpl(_select_kv_blocks, supports=_select_supports, priority=5),
                      # MXFP8 (issue 12): the TLX forward, automatic since its GPU check unless JFA_TLX_MXFP8=0
                      # (configs.MXFP8_AUTO); the quantize kernel (bf16 inputs) is triton's, the backward too unless
                      # configs.MXFP8_BACKWARD (default on): mxfp8_attn_bwd.py
                      "mxfp8_attention": FamilyImpl(mxfp8_attention_forward, _mxfp8_attention_backward,
                                                    supports=mxfp8_attention_supports,
                                                    priority=20 if configs.MXFP8_AUTO else 5),
                      # bf16 inputs of mxfp8_attention when this backend runs it: one fused quantize pass
                      "mxfp8_attention_quantizing": FamilyImpl(mxfp8_attention_quantizing,
                                                               supports=mxfp8_attention_supports, priority=5),
                      "mxfp8_quantize": FamilyImpl(_mxfp8_triton("quantize_mxfp8"),
                                                   supports=_mxfp8_triton("mxfp8_supports"), priority=5)})
