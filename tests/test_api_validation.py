"""Every validation error: the right exception type, and a message that names the argument.

Base call: q [7, 4, 16], k/v [9, 2, 16], q_offsets [0, 3, 7], kv_offsets [0, 5, 9]. Each entry changes one thing.
Metadata errors are raised by ``meta_kernels`` (eager and fake alike), offset values by ``jfa_ops.validation``,
option types by the wrapper.
"""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import jfa_ops
from jfa_ops import validation
from tests.common import coverage_as_on_one_cuda_stream


def _base():
    g = torch.Generator().manual_seed(0)
    return dict(q=torch.randn(7, 4, 16, generator=g), k=torch.randn(9, 2, 16, generator=g),
                v=torch.randn(9, 2, 16, generator=g), q_offsets=torch.tensor([0, 3, 7]),
                kv_offsets=torch.tensor([0, 5, 9]))


def _njt(values, offsets):
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def _with_holes(heads, lengths):
    """An NJT [B, j, heads, 16] with holes: sequence b keeps the first lengths[b] of 6 rows (torch.nested.narrow)."""
    lengths = torch.tensor(lengths)
    padded = torch.randn(len(lengths), 6, heads, 16)
    return torch.nested.narrow(padded, 1, torch.zeros_like(lengths), lengths, layout=torch.jagged)


def _t(*values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


# id -> (changes to the base call, exception type, regex the message must match: names the argument).
# ``api_only``: the wrapper's own checks (option types, NJT); the rest also go through torch.ops.jfa.attention.
CASES = {
    # dtypes
    "q_int": (lambda a: a.update(q=a["q"].int()), TypeError, r"^q must be float16, bfloat16, float32 or float64"),
    "k_dtype_differs": (lambda a: a.update(k=a["k"].double()), TypeError, r"^k must have q's dtype"),
    "v_dtype_differs": (lambda a: a.update(v=a["v"].half()), TypeError, r"^v must have q's dtype"),
    "q_offsets_float": (lambda a: a.update(q_offsets=a["q_offsets"].float()), TypeError, r"^q_offsets must be int32"),
    "kv_offsets_int16": (lambda a: a.update(kv_offsets=a["kv_offsets"].short()), TypeError,
                         r"^kv_offsets must be int32 or int64"),
    # types
    "q_not_tensor": (lambda a: a.update(q=a["q"].tolist()), TypeError, r"^q must be a torch.Tensor"),
    "kv_offsets_list": (lambda a: a.update(kv_offsets=[0, 5, 9]), TypeError, r"^kv_offsets must be a torch.Tensor"),
    "q_offsets_list": (lambda a: a.update(q_offsets=[0, 3, 7]), TypeError, r"^q_offsets must be a torch.Tensor"),
    "kv_offsets_none": (lambda a: a.update(kv_offsets=None), TypeError, r"^kv_offsets must be a torch.Tensor"),
    # devices (meta stands in for a second device on CPU-only machines)
    "k_other_device": (lambda a: a.update(k=a["k"].to("meta")), ValueError, r"^k must be on q's device"),
    "v_other_device": (lambda a: a.update(v=a["v"].to("meta")), ValueError, r"^v must be on q's device"),
    "q_offsets_other_device": (lambda a: a.update(q_offsets=a["q_offsets"].to("meta")), ValueError,
                               r"^q_offsets must be on q's device"),
    "kv_offsets_other_device": (lambda a: a.update(kv_offsets=a["kv_offsets"].to("meta")), ValueError,
                                r"^kv_offsets must be on q's device"),
    # shapes
    "q_2d": (lambda a: a.update(q=a["q"][:, 0]), ValueError, r"^q must be 3-D"),
    "k_4d": (lambda a: a.update(k=a["k"][None]), ValueError, r"^k must be 3-D"),
    "k_v_shapes_differ": (lambda a: a.update(v=a["v"][:, :1]), ValueError, r"^k and v must have the same shape"),
    "head_dim_mismatch": (lambda a: a.update(k=a["k"][..., :8], v=a["v"][..., :8]), ValueError,
                          r"^k's head_dim 8 must equal q's head_dim 16"),
    "head_dim_12": (lambda a: a.update(q=a["q"][..., :12], k=a["k"][..., :12], v=a["v"][..., :12]), ValueError,
                    r"^head_dim must be a multiple of 8 from 8 to 256, got 12"),
    "head_dim_0": (lambda a: a.update(q=a["q"][..., :0], k=a["k"][..., :0], v=a["v"][..., :0]), ValueError,
                   r"^head_dim must be a multiple of 8 from 8 to 256, got 0"),
    "head_dim_264": (lambda a: a.update(q=torch.randn(7, 4, 264), k=torch.randn(9, 2, 264), v=torch.randn(9, 2, 264)),
                     ValueError, r"^head_dim .* got 264"),
    "hq_not_multiple_of_hkv": (lambda a: a.update(q=a["q"][:, :3]), ValueError,
                               r"^q heads \(3\) must be a positive multiple of k/v heads \(2\)"),
    "zero_kv_heads": (lambda a: a.update(k=a["k"][:, :0], v=a["v"][:, :0]), ValueError, r"^q heads .* k/v heads \(0\)"),
    # offsets: metadata
    "q_offsets_2d": (lambda a: a.update(q_offsets=a["q_offsets"][None]), ValueError, r"^q_offsets must be 1-D"),
    "kv_offsets_2d": (lambda a: a.update(kv_offsets=a["kv_offsets"][:, None]), ValueError, r"^kv_offsets must be 1-D"),
    "kv_offsets_empty": (lambda a: a.update(kv_offsets=a["kv_offsets"][:0]), ValueError,
                         r"^kv_offsets must have at least one element"),
    "offsets_lengths_differ": (lambda a: a.update(q_offsets=_t(0, 3, 5, 7)), ValueError,
                               r"^q_offsets and kv_offsets must both be \[B\+1\]"),
    "q_offsets_missing": (lambda a: a.update(q_offsets=None), ValueError, r"^q_offsets is required"),
    # offsets: values
    "q_offsets_first_not_0": (lambda a: a.update(q_offsets=_t(1, 3, 7)), ValueError, r"^q_offsets\[0\] must be 0"),
    "kv_offsets_first_not_0": (lambda a: a.update(kv_offsets=_t(2, 5, 9)), ValueError, r"^kv_offsets\[0\] must be 0"),
    "q_offsets_last_not_rows": (lambda a: a.update(q_offsets=_t(0, 3, 6)), ValueError,
                                r"^q_offsets\[-1\] must equal the number of rows \(7\)"),
    "kv_offsets_last_not_rows": (lambda a: a.update(kv_offsets=_t(0, 5, 10)), ValueError,
                                 r"^kv_offsets\[-1\] must equal the number of rows \(9\)"),
    "q_offsets_decreasing": (lambda a: a.update(q_offsets=_t(0, 5, 3, 7), kv_offsets=_t(0, 2, 5, 9)), ValueError,
                             r"^q_offsets must be non-decreasing"),
    "kv_offsets_decreasing": (lambda a: a.update(kv_offsets=_t(0, 6, 4, 9), q_offsets=_t(0, 2, 3, 7)), ValueError,
                              r"^kv_offsets must be non-decreasing"),
    "int32_offsets_last_not_rows": (lambda a: a.update(q_offsets=_t(0, 3, 8, dtype=torch.int32)), ValueError,
                                    r"^q_offsets\[-1\]"),
    # max_seqlen
    "max_seqlen_q_too_small": (lambda a: a.update(max_seqlen_q=3), ValueError,
                               r"^max_seqlen for q_offsets is 3, smaller than the longest sequence 4"),
    "max_seqlen_kv_too_small": (lambda a: a.update(max_seqlen_kv=4), ValueError,
                                r"^max_seqlen for kv_offsets is 4, smaller than the longest sequence 5"),
    "max_seqlen_q_too_small_broadcast": (
        lambda a: a.update(q=a["q"][:5], q_offsets=None, broadcast_q=True, max_seqlen_q=4), ValueError,
        r"^max_seqlen_q \(4\) is smaller than broadcast q's rows \(5\)"),
    "max_seqlen_below_minus_1": (lambda a: a.update(max_seqlen_q=-3), ValueError,
                                 r"^max_seqlen_q must be >= 0, or -1 \(None in the wrapper\) for not given, got -3"),
    # scale
    "scale_nan": (lambda a: a.update(scale=float("nan")), ValueError, r"^scale must be finite, got nan"),
    "scale_inf": (lambda a: a.update(scale=float("-inf")), ValueError, r"^scale must be finite, got -inf"),
    # finite in Python, inf in the kernels' float32: NaN out (reference, triton) or an overflow RuntimeError (cpu)
    "scale_past_float32": (lambda a: a.update(scale=1e300), ValueError,
                           r"^scale must be finite, got 1e\+300 \(past float32's range"),
    # window
    "window_below_minus_1": (lambda a: a.update(window=(-2, 0)), ValueError, r"^window entries must be >= 0, or -1"),
    # broadcast_q
    "broadcast_q_with_q_offsets": (lambda a: a.update(broadcast_q=True), ValueError,
                                   r"^q_offsets must be None with broadcast_q=True"),
    "broadcast_q_head_mismatch": (lambda a: a.update(q=a["q"][:5, :3], q_offsets=None, broadcast_q=True), ValueError,
                                  r"^q heads \(3\)"),
    # backend
    "unknown_backend": (lambda a: a.update(backend="no_such_backend"), ValueError,
                        r"^backend: unknown backend 'no_such_backend'; registered: \["),
}
API_ONLY = {
    "max_seqlen_float": (lambda a: a.update(max_seqlen_kv=5.0), TypeError, r"^max_seqlen_kv must be an int or None"),
    "max_seqlen_bool": (lambda a: a.update(max_seqlen_q=True), TypeError, r"^max_seqlen_q must be an int or None"),
    "window_one_entry": (lambda a: a.update(window=(1,)), TypeError, r"^window must be a pair of ints"),
    "window_float": (lambda a: a.update(window=(1.5, 2)), TypeError, r"^window must be a pair of ints"),
    "window_bool": (lambda a: a.update(window=(True, 2)), TypeError, r"^window must be a pair of ints"),
    "scale_str": (lambda a: a.update(scale="0.5"), TypeError, r"^scale must be a float or None"),
    "scale_bool": (lambda a: a.update(scale=True), TypeError, r"^scale must be a float or None"),
    "causal_str": (lambda a: a.update(causal="False"), TypeError, r"^causal must be a bool, got str 'False'"),
    "broadcast_q_int": (lambda a: a.update(broadcast_q=0), TypeError, r"^broadcast_q must be a bool, got int"),
    "deterministic_str": (lambda a: a.update(deterministic="False"), TypeError, r"^deterministic must be a bool"),
    "window_numpy_float": (lambda a: a.update(window=(2, torch.tensor(1.0))), TypeError,
                           r"^window must be a pair of ints"),
    "backend_not_str": (lambda a: a.update(backend=3), TypeError, r"^backend must be a str or None, got int"),
    "njt_with_offsets": (lambda a: a.update(q=_njt(a["q"], a["q_offsets"]), k=_njt(a["k"], a["kv_offsets"]),
                                            v=_njt(a["v"], a["kv_offsets"])),
                         ValueError, r"^q_offsets and kv_offsets must be None when q/k/v are nested"),
    "njt_q_dense_kv": (lambda a: a.update(q=_njt(a["q"], a["q_offsets"]), q_offsets=None, kv_offsets=None),
                       TypeError, r"^k and v must both be nested jagged tensors"),
    "dense_q_njt_kv": (lambda a: a.update(k=_njt(a["k"], a["kv_offsets"]), v=_njt(a["v"], a["kv_offsets"]),
                                          q_offsets=None, kv_offsets=None),
                       TypeError, r"^q must be a nested jagged tensor"),
    "njt_q_with_broadcast_q": (lambda a: a.update(q=_njt(a["q"], a["q_offsets"]), k=_njt(a["k"], a["kv_offsets"]),
                                                  v=_njt(a["v"], a["kv_offsets"]), q_offsets=None, kv_offsets=None,
                                                  broadcast_q=True),
                               TypeError, r"^q must be a dense \[L_q, Hq, D\] tensor with broadcast_q=True"),
    # v's own offsets were ignored (k's used for both): attention over the wrong value rows
    "njt_v_other_offsets": (lambda a: a.update(q=_njt(a["q"], a["q_offsets"]), k=_njt(a["k"], a["kv_offsets"]),
                                               v=_njt(a["v"], _t(0, 4, 9)), q_offsets=None, kv_offsets=None),
                            ValueError, r"^v's offsets must equal k's \(the same kv sequences\), got \[0, 4, 9\] and "
                                        r"\[0, 5, 9\]"),
    "njt_v_other_batch": (lambda a: a.update(q=_njt(a["q"], a["q_offsets"]), k=_njt(a["k"], a["kv_offsets"]),
                                             v=_njt(a["v"], _t(0, 2, 5, 9)), q_offsets=None, kv_offsets=None),
                          ValueError, r"^v's offsets must equal k's \(the same kv sequences\), got shape \(4,\) "
                                      r"and \(3,\)"),
    "njt_with_holes": (lambda a: a.update(q=_with_holes(4, (3, 4)), k=_with_holes(2, (5, 4)),
                                          v=_with_holes(2, (5, 4)), q_offsets=None, kv_offsets=None),
                       ValueError, r"^q is a nested jagged tensor with holes .* call q.contiguous\(\) first"),
    "njt_sdpa_layout": (lambda a: a.update(q=_njt(a["q"], a["q_offsets"]).transpose(1, 2),
                                           k=_njt(a["k"], a["kv_offsets"]).transpose(1, 2),
                                           v=_njt(a["v"], a["kv_offsets"]).transpose(1, 2),
                                           q_offsets=None, kv_offsets=None),
                        ValueError, r"^q must be a nested jagged tensor laid out \[B, j, H, D\] \(ragged dim 1\), "
                                    r"got 4-D with ragged dim 2 \(an SDPA-layout \[B, H, j, D\] tensor needs "
                                    r"\.transpose\(1, 2\) first\)"),
}


def _call_api(a):
    return jfa_ops.jagged_attention(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("q_offsets"), a.pop("kv_offsets"), **a)


def _call_op(a):
    window = a.pop("window", (-1, -1))
    a.setdefault("max_seqlen_q", -1)
    a.setdefault("max_seqlen_kv", -1)
    return torch.ops.jfa.attention(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("q_offsets"), a.pop("kv_offsets"),
                                   window_left=window[0], window_right=window[1], **a)


@pytest.mark.parametrize("name", list(CASES) + list(API_ONLY))
def test_api_error(name):
    change, exc, pattern = {**CASES, **API_ONLY}[name]
    args = _base()
    change(args)
    with pytest.raises(exc, match=pattern):
        _call_api(args)


OP_CASES = [n for n in CASES if n not in ("q_not_tensor", "kv_offsets_list", "q_offsets_list")]  # schema-typed


@pytest.mark.parametrize("name", OP_CASES)
def test_op_error(name):
    change, exc, pattern = CASES[name]
    args = _base()
    change(args)
    with pytest.raises(exc, match=pattern):
        _call_op(args)


METADATA_CASES = [n for n in OP_CASES if not any(s in n for s in ("offsets_first", "offsets_last", "decreasing",
                                                                   "max_seqlen", "backend", "other_device"))]


@pytest.mark.parametrize("name", METADATA_CASES)
def test_fake_raises_same_metadata_error(name):
    """The fake runs the metadata checks too, so torch.compile reports bad shapes at trace time."""
    change, exc, pattern = CASES[name]
    args = _base()
    change(args)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        args = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
        with pytest.raises(exc, match=pattern):
            _call_op(args)


def test_valid_base_call_passes():
    out = _call_api(_base())
    assert out.shape == (7, 4, 16)


def test_non_tensor_inputs_through_the_op_name_the_argument():
    a = _base()
    with pytest.raises(RuntimeError, match="argument 'kv_offsets'"):  # the dispatcher's own schema check
        torch.ops.jfa.attention(a["q"], a["k"], a["v"], a["q_offsets"], [0, 5, 9])


# JFA_VALIDATE ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["off", "async", "sync", "bogus"])
def test_cpu_always_validates_synchronously(monkeypatch, mode):
    monkeypatch.setenv("JFA_VALIDATE", mode)
    assert validation.validation_mode(torch.device("cpu")) == "sync"
    a = _base()
    a["q_offsets"] = _t(0, 3, 6)
    with pytest.raises(ValueError, match=r"^q_offsets\[-1\]"):
        _call_api(a)


@pytest.mark.parametrize("env,expected", [(None, "async"), ("sync", "sync"), ("async", "async"), ("off", "off")])
def test_validation_mode_on_cuda_follows_env(monkeypatch, env, expected):
    if env is None:
        monkeypatch.delenv("JFA_VALIDATE", raising=False)
    else:
        monkeypatch.setenv("JFA_VALIDATE", env)
    assert validation.validation_mode(torch.device("cuda", 0)) == expected


def test_bad_validation_mode_names_the_variable(monkeypatch):
    monkeypatch.setenv("JFA_VALIDATE", "sometimes")
    with pytest.raises(ValueError, match=r"^JFA_VALIDATE must be one of \('sync', 'async', 'deferred', 'off'\), "
                                         r"got 'sometimes'"):
        validation.validation_mode(torch.device("cuda", 0))


@pytest.mark.parametrize("offsets,rows,max_seqlen", [
    ([1, 3, 7], 7, -1), ([0, 3, 6], 7, -1), ([0, 5, 3, 7], 7, -1), ([0, 3, 7], 7, 3)])
def test_async_checks_assert_on_bad_offsets(offsets, rows, max_seqlen):
    """The async (device-side) checks, run on CPU tensors where torch._assert_async raises at once."""
    with pytest.raises(RuntimeError, match="bad kv_offsets or q_offsets"):
        validation.device_check(torch.tensor(offsets), rows, max_seqlen, torch.tensor([0, 2]), 2, -1, "async")


@pytest.mark.parametrize("offsets", [[0, 3, 7], [0], [0, 0, 7, 7]])
def test_async_checks_pass_good_offsets(offsets):
    validation.device_check(torch.tensor(offsets), offsets[-1], 7, torch.tensor([0, 2]), 2, -1, "async")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["sync", "off"])
def test_cuda_validation_modes(monkeypatch, mode):
    monkeypatch.setenv("JFA_VALIDATE", mode)
    a = {k: v.cuda() for k, v in _base().items()}
    a.update(max_seqlen_q=3, backend="reference")  # too small: only the sync mode reads the offsets to say so
    if mode == "sync":
        with pytest.raises(ValueError, match=r"^max_seqlen for q_offsets is 3"):
            _call_api(a)
    else:
        assert _call_api(a).shape == (7, 4, 16)


@pytest.mark.gpu
def test_cuda_async_validation_accepts_good_offsets(monkeypatch):
    monkeypatch.setenv("JFA_VALIDATE", "async")
    a = {k: v.cuda() for k, v in _base().items()}
    out = _call_api(a)
    torch.cuda.synchronize()
    assert out.shape == (7, 4, 16)


# JFA_VALIDATE=deferred: device checks (here on CPU tensors, the triton backend under the interpreter) that raise
# at check_pending() or at the next sync-mode call instead of killing the CUDA context.
@pytest.fixture
def deferred(monkeypatch):
    monkeypatch.setattr(validation, "validation_mode", lambda device: "deferred")
    validation._pending.clear()
    yield
    validation._pending.clear()


@pytest.mark.parametrize("backend", ["triton", "reference"])  # folded into the kernels / the aten device check
def test_deferred_mode_raises_at_check_pending(deferred, monkeypatch, backend):
    if backend == "triton":
        pytest.importorskip("triton")
    a = {k: v.half() if v.is_floating_point() else v.int() for k, v in _base().items()}
    a["backend"] = backend
    _call_api(dict(a))  # good offsets
    jfa_ops.check_pending()  # nothing to raise
    _call_api(dict(a, max_seqlen_q=2))  # no error here: the flag waits on the device
    if backend == "triton":  # a sequence past the rows: the kernels skip it (no out-of-bounds access)
        _call_api(dict(a, q_offsets=_t(0, 9, 7, dtype=torch.int32)))
    _call_api(dict(a))
    with pytest.raises(ValueError, match="bad kv_offsets or q_offsets.*JFA_VALIDATE=deferred"):
        jfa_ops.check_pending()
    jfa_ops.check_pending()  # raised once, then cleared


def test_deferred_error_raised_by_the_next_sync_call(deferred, monkeypatch):
    pytest.importorskip("triton")
    a = {k: v.half() if v.is_floating_point() else v.int() for k, v in _base().items()}
    _call_api(dict(a, backend="triton", kv_offsets=_t(0, 5, 8, dtype=torch.int32)))  # last != rows
    monkeypatch.setattr(validation, "validation_mode", lambda device: "sync")
    with pytest.raises(ValueError, match="JFA_VALIDATE=deferred"):
        _call_api(dict(a, backend="triton"))
    _call_api(dict(a, backend="triton"))  # cleared


def test_deferred_flags_fold_without_growing(deferred):
    for i in range(validation._FOLD_PENDING_AT * 2 + 3):
        validation.device_flag(torch.tensor([i != 5]), "deferred")
    assert len(validation._pending) < validation._FOLD_PENDING_AT
    with pytest.raises(ValueError):
        validation.check_pending()


def _good_offsets_still_work(q, k, v, good) -> None:
    """After a bad call under deferred validation: good offsets give the reference's out, nothing is pending."""
    out = jfa_ops.jagged_attention(q, k, v, good, good, causal=True, backend="triton")
    ref = jfa_ops.jagged_attention(q, k, v, good, good, causal=True, backend="reference")
    assert (out.float() - ref.float()).norm() <= 2e-2 * ref.float().norm()
    jfa_ops.check_pending()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [7, 4000])  # one wave (check in the forward kernel), sorted lists (tile kernel)
def test_cuda_deferred_mode_keeps_the_context(monkeypatch, rows):
    """JFA_VALIDATE=deferred on the GPU: bad offsets (a sequence past the rows) give no device assert and no
    illegal address; check_pending raises once; the CUDA context keeps working."""
    monkeypatch.setenv("JFA_VALIDATE", "deferred")
    validation._pending.clear()
    q, k, v = (torch.randn(rows, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bad = torch.tensor([0, rows + 100, rows], device="cuda", dtype=torch.int32)
    good = torch.tensor([0, rows // 2, rows], device="cuda", dtype=torch.int32)
    jfa_ops.jagged_attention(q, k, v, bad, bad, causal=True, backend="triton")
    torch.cuda.synchronize()  # no device assert, no illegal address
    with pytest.raises(ValueError, match="JFA_VALIDATE=deferred"):
        jfa_ops.check_pending()
    _good_offsets_still_work(q, k, v, good)


# torch.ops.jfa.attention_backward is public: it checks its inputs like the forward ----------------------------

def _backward_base():
    a = _base()
    out, lse = _call_op(dict(a))
    return dict(grad_out=torch.randn_like(out), grad_lse=torch.randn_like(lse), q=a["q"], k=a["k"], v=a["v"],
                out=out, lse=lse, q_offsets=a["q_offsets"], kv_offsets=a["kv_offsets"])


BACKWARD_CASES = {
    "grad_out_rows": (lambda a: a.update(grad_out=a["grad_out"][:6]), ValueError,
                      r"^grad_out must have shape \(7, 4, 16\) \(from q and the offsets\), got \(6, 4, 16\)"),
    "grad_out_2d": (lambda a: a.update(grad_out=a["grad_out"][:, 0]), ValueError, r"^grad_out must have shape"),
    "grad_out_dtype": (lambda a: a.update(grad_out=a["grad_out"].double()), TypeError,
                       r"^grad_out must be torch.float32, got torch.float64"),
    "grad_out_other_device": (lambda a: a.update(grad_out=a["grad_out"].to("meta")), ValueError,
                              r"^grad_out must be on q's device"),
    "out_heads": (lambda a: a.update(out=a["out"][:, :2]), ValueError, r"^out must have shape \(7, 4, 16\)"),
    "lse_transposed": (lambda a: a.update(lse=a["lse"].t()), ValueError, r"^lse must have shape \(4, 7\)"),
    "lse_half": (lambda a: a.update(lse=a["lse"].half()), TypeError, r"^lse must be torch.float32"),
    "grad_lse_shape": (lambda a: a.update(grad_lse=a["grad_lse"][:, :3]), ValueError, r"^grad_lse must have shape"),
    "q_heads_forward_rule": (lambda a: a.update(q=a["q"][:, :3]), ValueError, r"^q heads \(3\) must be a positive"),
    "max_seqlen_below_minus_1": (lambda a: a.update(max_seqlen_kv=-2), ValueError, r"^max_seqlen_kv must be >= 0"),
    "scale_nan": (lambda a: a.update(scale=float("nan")), ValueError, r"^scale must be finite"),
}


@pytest.mark.parametrize("name", BACKWARD_CASES)
def test_backward_op_error(name):
    change, exc, pattern = BACKWARD_CASES[name]
    args = _backward_base()
    change(args)
    tensors = [args.pop(n) for n in ("grad_out", "grad_lse", "q", "k", "v", "out", "lse", "q_offsets", "kv_offsets")]
    with pytest.raises(exc, match=pattern):
        torch.ops.jfa.attention_backward(*tensors, **args)


def test_backward_op_accepts_its_forward_outputs():
    a = _backward_base()
    dq, dk, dv = torch.ops.jfa.attention_backward(*a.values())
    assert (dq.shape, dk.shape, dv.shape) == (a["q"].shape, a["k"].shape, a["v"].shape)
    torch.ops.jfa.attention_backward(*{**a, "grad_lse": None}.values())


# The three public backward ops check offset values (and the block-sparse one its index) like their forwards: called
# directly, with offsets their forward never saw, they computed gradients from bad offsets (reference: garbage rows,
# triton: NaN from reads past the sequences). Only autograd's own calls skip it (their forward checked the same,
# unmodified tensors).
def _sparse_backward_call(a, index_change=None):
    """block_q 2, block_kv 4: every Q block keeps every visible KV block (sequence 0's Q block 1: ids [0, 1])."""
    index, count = jfa_ops.select_kv_blocks(a["q"], a["k"], a["q_offsets"], a["kv_offsets"], 4, 5, block_q=2,
                                            block_kv=4, keep_ratio=1.0)
    options = dict(max_seqlen_q=a.pop("max_seqlen_q", -1), max_seqlen_kv=a.pop("max_seqlen_kv", -1))
    out, lse = torch.ops.jfa.block_sparse_attention(a["q"], a["k"], a["v"], a["q_offsets"], a["kv_offsets"], index,
                                                     count, 2, 4)
    if index_change is not None:
        index_change(index, count)
    return torch.ops.jfa.block_sparse_attention_backward(torch.ones_like(out), None, a["q"], a["k"], a["v"], out,
                                                         lse, a.pop("bad_q_offsets", a["q_offsets"]),
                                                         a.pop("bad_kv_offsets", a["kv_offsets"]), index, count, 2, 4,
                                                         **options)


def _dense_backward_call(op, a):
    options = dict(max_seqlen_q=a.pop("max_seqlen_q", -1), max_seqlen_kv=a.pop("max_seqlen_kv", -1))
    forward = {"attention_backward": torch.ops.jfa.attention,
               "mxfp8_attention_backward": torch.ops.jfa.mxfp8_attention}[op]
    if op == "mxfp8_attention_backward":
        a.update({n: torch.randn(a[n].shape[0], a[n].shape[1], 32) for n in ("q", "k", "v")})
    out, lse = forward(a["q"], a["k"], a["v"], a["q_offsets"], a["kv_offsets"])
    return getattr(torch.ops.jfa, op)(torch.ones_like(out), None, a["q"], a["k"], a["v"], out, lse,
                                      a.pop("bad_q_offsets", a["q_offsets"]), a.pop("bad_kv_offsets", a["kv_offsets"]),
                                      **options)


BACKWARD_OPS = {"attention_backward": lambda a: _dense_backward_call("attention_backward", a),
                "mxfp8_attention_backward": lambda a: _dense_backward_call("mxfp8_attention_backward", a),
                "block_sparse_attention_backward": _sparse_backward_call}
BACKWARD_VALUE_CASES = {
    "q_offsets_decreasing": (dict(bad_q_offsets=_t(0, 8, 7)), r"^q_offsets must be non-decreasing, got \[0, 8, 7\]"),
    "q_offsets_last": (dict(bad_q_offsets=_t(0, 3, 6)), r"^q_offsets\[-1\] must equal the number of rows \(7\)"),
    "kv_offsets_first": (dict(bad_kv_offsets=_t(1, 5, 9)), r"^kv_offsets\[0\] must be 0, got 1"),
    "max_seqlen_q_too_small": (dict(max_seqlen_q=3), r"^max_seqlen for q_offsets is 3, smaller than the longest "
                                                     r"sequence 4"),
}


@pytest.mark.parametrize("case", BACKWARD_VALUE_CASES)
@pytest.mark.parametrize("op", BACKWARD_OPS)
def test_backward_ops_check_offset_values(op, case):
    change, pattern = BACKWARD_VALUE_CASES[case]
    with pytest.raises(ValueError, match=pattern):
        BACKWARD_OPS[op](dict(_base(), **change))
    dq, dk, dv = BACKWARD_OPS[op](_base())  # the same call with its forward's offsets passes
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()


@pytest.mark.parametrize("change,pattern", [
    (lambda index, count: index.__setitem__((0, 0, 1, 1), 5), r"^kv_block_index\[0, 0, 1, 1\] = 5 is not a KV block"),
    (lambda index, count: count.__setitem__((1, 1, 0), 3), r"^kv_block_count must be in \[0, 2\]"),
    (lambda index, count: index.__setitem__((0, 0, 1, 1), 0), r"^kv_block_index\[0, 0, 1\] must list its used ids "
                                                               r"in ascending order"),
])
def test_block_sparse_backward_op_checks_the_index(change, pattern):
    with pytest.raises(ValueError, match=pattern):
        _sparse_backward_call(_base(), change)


def test_wrapper_and_op_accept_the_same_max_seqlen_values():
    """-1 means "not given" in both (the wrapper also takes None); anything below -1 is an error in both."""
    a = _base()
    expected = _call_api(dict(a))
    for max_seqlen in (None, -1, 4):
        assert torch.equal(_call_api(dict(a, max_seqlen_q=max_seqlen)), expected)
    for max_seqlen in (-1, 4):
        assert torch.equal(_call_op(dict(a, max_seqlen_q=max_seqlen))[0], expected)


# Under torch.compile(fullgraph=True, dynamic=True) the same exception types and concrete values as eagerly ------

COMPILE_CASES = {
    "head_dim_12": (lambda a: a.update(q=a["q"][..., :12], k=a["k"][..., :12], v=a["v"][..., :12]), ValueError,
                    r"^head_dim must be a multiple of 8 from 8 to 256, got 12$"),
    "max_seqlen_minus_3": (lambda a: a.update(max_seqlen_q=-3), ValueError, r"^max_seqlen_q must be >= 0.*got -3$"),
    "max_seqlen_too_small": (lambda a: a.update(max_seqlen_kv=4), ValueError,
                             r"^max_seqlen for kv_offsets is 4, smaller than the longest sequence 5"),
    "hq_not_multiple_of_hkv": (lambda a: a.update(q=a["q"][:, :3]), ValueError,
                               r"^q heads \(3\) must be a positive multiple of k/v heads \(2\)"),
    "k_v_shapes_differ": (lambda a: a.update(v=a["v"][:8]), ValueError,
                          r"^k and v must have the same shape, got k \(9, 2, 16\) and v \(8, 2, 16\)"),
    "njt_gqa_heads": (lambda a: a.update(q=_njt(a["q"][:, :3], a["q_offsets"]), k=_njt(a["k"], a["kv_offsets"]),
                                         v=_njt(a["v"], a["kv_offsets"]), q_offsets=None, kv_offsets=None),
                      ValueError, r"^q heads \(3\) must be a positive multiple of k/v heads \(2\)"),
}


@pytest.mark.parametrize("name", COMPILE_CASES)
def test_compiled_call_raises_the_eager_error(name):
    """Shape checks that involve symbolic sizes are left to the op's body when they cannot be decided without a
    guard, so the compiled call raises the eager exception (not Dynamo's TorchRuntimeError with symbols)."""
    change, exc, pattern = COMPILE_CASES[name]
    args = _base()
    change(args)
    with pytest.raises(exc, match=pattern):
        _call_api(dict(args))
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: _call_api(a), fullgraph=True, dynamic=True, backend="aot_eager")
    with pytest.raises(exc, match=pattern):
        compiled(args)


# block_sparse_attention's index under the device modes: the triton kernels walk a row's ids by its count and
# rely on their order (a count past the width read the next row's ids, or past the tensor's end; unsorted ids gave
# 15% error in the interpreter). Checked on the device unless the pair is select_kv_blocks' own output, unmodified.
def _selection_call(change=None):
    a = _base()
    index, count = jfa_ops.select_kv_blocks(a["q"], a["k"], a["q_offsets"], a["kv_offsets"], 4, 5, block_q=2,
                                            block_kv=4, keep_ratio=1.0)
    if change is not None:
        change(index, count)
    return jfa_ops.block_sparse_attention(a["q"], a["k"], a["v"], a["q_offsets"], a["kv_offsets"], index, count,
                                          block_q=2, block_kv=4)


SELECTION_CHANGES = {
    "count_past_width": lambda index, count: count.__setitem__((0, 0, 1), 3),
    "count_negative": lambda index, count: count.__setitem__((0, 0, 1), -1),
    "ids_descending": lambda index, count: index[0, 0, 1].copy_(torch.tensor([1, 0])),
}


@pytest.mark.parametrize("change", SELECTION_CHANGES)
def test_selection_checked_on_the_device_in_deferred_mode(deferred, change):
    _selection_call()  # select_kv_blocks' own output: no index check (the offsets' flags only)
    flags = len(validation._pending)
    validation._pending.clear()
    _selection_call(lambda index, count: index.add_(0))  # modified in place (same values): checked, and passes
    assert len(validation._pending) == flags + 1
    jfa_ops.check_pending()
    _selection_call(SELECTION_CHANGES[change])  # no error here: the flag waits on the device
    with pytest.raises(ValueError, match="JFA_VALIDATE=deferred"):
        jfa_ops.check_pending()


@pytest.mark.parametrize("change", SELECTION_CHANGES)
def test_selection_checked_on_the_device_in_async_mode(monkeypatch, change):
    monkeypatch.setattr(validation, "validation_mode", lambda device: "async")
    _selection_call()
    with pytest.raises(RuntimeError, match=r"kv_block_count past kv_block_index's width|used ids not ascending"):
        _selection_call(SELECTION_CHANGES[change])  # a CPU tensor's assert raises at once


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_deferred_selection_check(monkeypatch):
    """On the GPU (triton kernels): a count past the index's width and unsorted ids are flagged for check_pending
    (no illegal address: the kernels run on the bad index before the flag is read); select_kv_blocks' own output
    adds no index flag and matches the reference backend."""
    monkeypatch.setenv("JFA_VALIDATE", "deferred")
    validation._pending.clear()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(300, 4, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    offsets = torch.tensor([0, 100, 300], device="cuda", dtype=torch.int32)
    index, count = jfa_ops.select_kv_blocks(q, k, offsets, offsets, 200, 200, block_q=64, block_kv=64, causal=True)
    args = (q, k, v, offsets, offsets)
    out = jfa_ops.block_sparse_attention(*args, index, count, 200, 200, block_q=64, block_kv=64, causal=True)
    ref = jfa_ops.block_sparse_attention(*args, index, count, 200, 200, block_q=64, block_kv=64, causal=True,
                                         backend="reference")
    assert (out.float() - ref.float()).norm() <= 2e-2 * ref.float().norm()
    jfa_ops.check_pending()
    for change in (lambda i, c: c.fill_(index.shape[-1] + 5), lambda i, c: i.copy_(i.flip(-1))):
        bad_index, bad_count = index.clone(), count.clone()
        change(bad_index, bad_count)
        jfa_ops.block_sparse_attention(*args, bad_index, bad_count, 200, 200, block_q=64, block_kv=64, causal=True)
        torch.cuda.synchronize()
        with pytest.raises(ValueError, match="JFA_VALIDATE=deferred"):
            jfa_ops.check_pending()


def test_njt_v_offsets_checked_under_compile():
    """v's NJT offsets against k's in a compiled graph: equal values (a ragged dim of its own) pass, other values
    fail on the device (a traced call cannot read them on the host)."""
    a = _base()
    q, k = _njt(a["q"], a["q_offsets"]), _njt(a["k"], a["kv_offsets"])
    v_same, v_bad = _njt(a["v"], a["kv_offsets"].clone()), _njt(a["v"], _t(0, 4, 9))
    torch._dynamo.reset()
    compiled = torch.compile(jfa_ops.jagged_attention, fullgraph=True, dynamic=True, backend="aot_eager")
    assert torch.equal(compiled(q, k, v_same).values(), _call_api(dict(a)))
    with pytest.raises(RuntimeError, match=r"v's offsets must equal k's"):
        compiled(q, k, v_bad)


@pytest.fixture
def coverage(monkeypatch):
    """validation.covered on CPU tensors (as if CUDA, one stream, not capturing), from an empty record."""
    coverage_as_on_one_cuda_stream(monkeypatch)


def test_a_device_check_covers_only_the_same_unmodified_offsets(coverage):
    """A repeat needs no check only for the same tensors, unmodified, against the same rows and max_seqlen: a new
    tensor with equal values, an in-place change, other rows or hints, an inference tensor, or a CUDA graph capture
    each get a check (covered() False until cover() records one)."""
    q_off, kv_off = _t(0, 3, 8, dtype=torch.int32), _t(0, 5, 9, dtype=torch.int32)
    args = (8, 9, -1, -1)
    assert not validation.covered(q_off, kv_off, *args)
    validation.cover(q_off, kv_off, *args)
    assert validation.covered(q_off, kv_off, *args)
    assert not validation.covered(q_off, kv_off.clone(), *args)  # equal values, another tensor
    assert not validation.covered(q_off, kv_off, 8, 9, -1, 5) and not validation.covered(q_off, kv_off, 7, 9, -1, -1)
    kv_off.add_(0)  # in place: the version counter moves
    assert not validation.covered(q_off, kv_off, *args)
    validation.cover(q_off, kv_off, *args)
    assert validation.covered(q_off, kv_off, *args)
    assert not validation.covered(None, kv_off, *args)  # broadcast Q: its own entry
    validation.cover(None, kv_off, *args)
    assert validation.covered(None, kv_off, *args)
    with torch.inference_mode():
        frozen = _t(0, 5, 9, dtype=torch.int32)
    validation.cover(q_off, frozen, *args)
    assert not validation.covered(q_off, frozen, *args)


def test_coverage_off_while_capturing_and_outside_async(coverage, monkeypatch):
    """No coverage during a CUDA graph capture; deferred mode neither asks nor records it; async mode's own aten
    check (a backend that does not check offsets itself) records it once enqueued."""
    q_off, kv_off = _t(0, 3, 8, dtype=torch.int32), _t(0, 5, 9, dtype=torch.int32)
    validation.cover(q_off, kv_off, 8, 9, -1, -1)
    monkeypatch.setattr(validation, "capturing", lambda device: True)
    assert not validation.covered(q_off, kv_off, 8, 9, -1, -1)
    monkeypatch.setattr(validation, "capturing", lambda device: False)
    monkeypatch.setattr(validation, "validation_mode", lambda device: "deferred")
    q = torch.zeros(8, 1, 8)
    k = torch.zeros(9, 1, 8)
    assert validation.check_offset_values(q, k, q_off, kv_off, -1, -1, backend_checks=True)  # the backend checks
    assert validation.check_offset_values(q, k, q_off, kv_off, -1, -1, backend_checks=True)
    monkeypatch.setattr(validation, "validation_mode", lambda device: "async")
    assert not validation.check_offset_values(q, k, q_off, kv_off, -1, -1, backend_checks=True)  # covered
    fresh = kv_off.clone()
    checks = []
    monkeypatch.setattr(validation, "device_check", lambda *args: checks.append(args))
    for _ in range(2):
        validation.check_offset_values(q, k, q_off, fresh, -1, -1)  # no backend check: the aten check, once
    assert len(checks) == 1


# int64 offsets past int32's range whose low 32 bits look valid (e.g. 2**32 + 3 is 3 in int32) -----------------
# The backends that check offsets inside their own kernels (triton, tlx) read the int32 copy: a plain conversion
# wraps such values into a valid-looking batch, and the call ran silently on other rows (and, in async mode,
# covered the offsets for later calls). Every mode must treat them as the bad offsets they are.
_WRAP = 2 ** 32
WRAPPED = {  # name -> (q_offsets, kv_offsets) of the base call (q 7 rows, k/v 9 rows); None: one tensor for both
    "q_inner": (_t(0, 3 + _WRAP, 7), _t(0, 5, 9)),
    "kv_inner_negative": (_t(0, 3, 7), _t(0, 5 - _WRAP, 9)),
    "q_last": (_t(0, 3, 7 + _WRAP), _t(0, 5, 9)),
    "kv_first": (_t(0, 3, 7), _t(_WRAP, 5, 9)),
    "shared": (_t(0, 4 + 3 * _WRAP, 9), None),
}


def _wrapped_call(name, **extra):
    a = {k: v.half() if v.is_floating_point() else v for k, v in _base().items()}
    q_off, kv_off = WRAPPED[name]
    if kv_off is None:  # self-attention over k's rows, one offsets tensor
        a.update(q=a["k"].repeat(1, 2, 1), q_offsets=q_off, kv_offsets=q_off)
    else:
        a.update(q_offsets=q_off, kv_offsets=kv_off)
    a.update({"backend": "triton", **extra})
    return a


@pytest.mark.parametrize("name", WRAPPED)
def test_wrapped_int64_offsets_fail_the_sync_check_by_name(name):
    """Host checks read the int64 values: a ValueError naming the argument (CPU tensors are always checked so)."""
    a = _wrapped_call(name, backend="reference")
    with pytest.raises(ValueError, match=r"^(q|kv)_offsets"):
        _call_api(a)


@pytest.mark.parametrize("path", ["direct", "op", "compiled"])
@pytest.mark.parametrize("name", WRAPPED)
def test_wrapped_int64_offsets_fail_the_deferred_device_check(deferred, monkeypatch, name, path):
    """JFA_VALIDATE=deferred, the triton backend (its check folded into its kernels): check_pending raises."""
    pytest.importorskip("triton")
    from jfa_ops.ops import attention as attention_ops

    monkeypatch.setattr(attention_ops, "EAGER_DIRECT", path == "direct")
    a = _wrapped_call(name)
    if path == "compiled":
        torch._dynamo.reset()
        torch.compile(lambda a: _call_api(a), fullgraph=True, backend="aot_eager")(a)
    else:
        _call_api(a)
    with pytest.raises(ValueError, match="bad kv_offsets or q_offsets.*JFA_VALIDATE=deferred"):
        jfa_ops.check_pending()


@pytest.mark.parametrize("name", WRAPPED)
def test_wrapped_int64_offsets_fail_the_async_device_check(monkeypatch, name):
    """JFA_VALIDATE=async on CPU tensors (torch._assert_async raises at once): the first call asserts, and nothing is
    covered for a second call."""
    pytest.importorskip("triton")
    monkeypatch.setattr(validation, "validation_mode", lambda device: "async")
    a = _wrapped_call(name)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="bad kv_offsets or q_offsets"):
            _call_api(dict(a))


@pytest.mark.parametrize("mode", ["deferred", "async"])
def test_wrapped_int64_offsets_fail_the_selection_check(monkeypatch, mode):
    """The triton selection folds the check into its pooling kernel (which reads the int32 copy); in async mode an
    unnoticed wrap also covered the offsets for the sparse attention after it."""
    pytest.importorskip("triton")
    from jfa_ops.ops import block_sparse as sparse_ops

    for module in (validation, sparse_ops):  # the sparse op's index checks read the mode too (sync only)
        monkeypatch.setattr(module, "validation_mode", lambda device: mode)
    validation._pending.clear()
    q = torch.randn(40, 2, 16).half()
    for bad in (_t(0, 17 + _WRAP, 40), _t(0, 17, 40 - _WRAP), _t(-_WRAP, 17, 40)):
        if mode == "async":
            with pytest.raises(RuntimeError, match="bad kv_offsets or q_offsets"):
                jfa_ops.select_kv_blocks(q, q, bad, bad, 23, 23, block_q=16, block_kv=16, backend="triton")
            continue
        index, count = jfa_ops.select_kv_blocks(q, q, bad, bad, 23, 23, block_q=16, block_kv=16, backend="triton")
        jfa_ops.block_sparse_attention(q, q, q, bad, bad, index, count, 23, 23, block_q=16, block_kv=16,
                                       backend="triton")
        with pytest.raises(ValueError, match="JFA_VALIDATE=deferred"):
            jfa_ops.check_pending()
    validation._pending.clear()


@pytest.mark.parametrize("mode", ["deferred", "async"])
def test_wrapped_int64_offsets_fail_the_mxfp8_checks(monkeypatch, mode):
    """MXFP8 quantize and attention (triton) check the offsets with aten ops on the int64 values."""
    pytest.importorskip("triton")
    monkeypatch.setattr(validation, "validation_mode", lambda device: mode)
    validation._pending.clear()
    x = torch.randn(40, 2, 32).half()
    bad = _t(0, 17 + _WRAP, 40)
    calls = (lambda: jfa_ops.mxfp8_quantize(x, bad, backend="triton"),
             lambda: jfa_ops.mxfp8_attention(x, x, x, bad, bad, backend="triton"))
    for call in calls:
        if mode == "async":
            with pytest.raises(RuntimeError, match="bad kv_offsets or q_offsets"):
                call()
            continue
        call()
        with pytest.raises(ValueError, match="JFA_VALIDATE=deferred"):
            jfa_ops.check_pending()
    validation._pending.clear()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [7, 4000])  # one wave (check in the forward kernel), sorted lists (tile kernel)
def test_cuda_wrapped_int64_offsets(monkeypatch, rows):
    """On the GPU (the saturating copy's clamp with device-tensor bounds): wrapped int64 offsets raise at
    check_pending under deferred; good int64 offsets give the reference's out (their copy unchanged)."""
    monkeypatch.setenv("JFA_VALIDATE", "deferred")
    validation._pending.clear()
    q, k, v = (torch.randn(rows, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    good = torch.tensor([0, rows // 2, rows], device="cuda")
    for bad in (good + torch.tensor([0, _WRAP, 0], device="cuda"), good - torch.tensor([_WRAP, 0, 0], device="cuda")):
        jfa_ops.jagged_attention(q, k, v, bad, bad, causal=True, backend="triton")
        torch.cuda.synchronize()
        with pytest.raises(ValueError, match="JFA_VALIDATE=deferred"):
            jfa_ops.check_pending()
    _good_offsets_still_work(q, k, v, good)
