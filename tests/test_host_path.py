"""The eager host path: what runs on the inference path and what the autograd backward re-checks."""
import os
import sys

import pytest
import torch

import jfa_ops
import meta_kernels
from jfa_ops.ops import attention as attention_ops
from jfa_ops.backends import Backend, get_backend, register_backend, unregister_backend
from jfa_ops.testing import AttentionCase, assert_attention_close, backward_op_args
from tests.common import coverage_as_on_one_cuda_stream

CASE = AttentionCase((3, 0, 5), (4, 2, 6), heads_q=4, heads_kv=2, dtype=torch.float32, causal=True)


def _on_stack(*path: str) -> bool:
    """Is a function of torch's file ``path`` one of the callers of this frame?"""
    frame, suffix = sys._getframe(1), os.path.join(*path)
    while frame is not None:
        if frame.f_code.co_filename.endswith(suffix):
            return True
        frame = frame.f_back
    return False


def _autograd_kernel_on_stack() -> bool:
    """torch's custom-op autograd kernel (torch/_library/autograd.py)."""
    return _on_stack("_library", "autograd.py")


@pytest.fixture(params=["direct", "op"])
def eager_path(request, monkeypatch):
    """Both eager paths (JFA_EAGER_PATH): the op's body called directly, and torch.ops.jfa.attention."""
    monkeypatch.setattr(attention_ops, "EAGER_DIRECT", request.param == "direct")
    return request.param


@pytest.fixture
def spy_backend():
    """The reference backend under the name 'spy', recording whether the autograd kernel called its forward."""
    reference = get_backend("reference")
    seen = []

    def forward(*args):
        seen.append("autograd kernel" if _autograd_kernel_on_stack() else
                    "op" if _on_stack("_library", "custom_ops.py") else "direct")
        return reference.forward(*args)

    register_backend(Backend("spy", forward=forward, backward=reference.backward, supports=reference.supports))
    yield seen
    unregister_backend("spy")


@pytest.mark.parametrize("context", ["no_grad", "inference_mode", "no_input_requires_grad"])
def test_inference_path_skips_the_autograd_kernel(spy_backend, eager_path, context):
    inputs = CASE.make_inputs(0, requires_grad=context != "no_input_requires_grad")
    guard = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(context, torch.enable_grad)
    with guard():
        out, lse = inputs.call("spy")
    assert spy_backend == [eager_path]
    want_out, want_lse = inputs.oracle()
    assert_attention_close(out, want_out, dtype=CASE.dtype, kind="forward", name="out")
    assert_attention_close(lse, want_lse, dtype=CASE.dtype, kind="lse", name="lse")
    assert not out.requires_grad


def test_training_path_records_autograd(spy_backend, eager_path):
    inputs = CASE.make_inputs(0, requires_grad=True)
    out, _ = inputs.call("spy")
    assert spy_backend == ["direct" if eager_path == "direct" else "autograd kernel"] and out.requires_grad
    assert out.grad_fn is not None


def test_both_eager_paths_give_the_same_numbers(monkeypatch):
    """The direct path runs the op's body and formula: same outputs and gradients, bit for bit (reference, fp32)."""
    case = AttentionCase((3, 0, 5, 1), (4, 2, 6, 3), heads_q=4, heads_kv=2, dtype=torch.float32, causal=True,
                         window=(3, 0))
    inputs = case.make_inputs(0, requires_grad=True)
    results = []
    for direct in (True, False):
        monkeypatch.setattr(attention_ops, "EAGER_DIRECT", direct)
        out, lse = inputs.call("reference")
        grads = torch.autograd.grad((out, lse), (inputs.q, inputs.k, inputs.v),
                                    (torch.ones_like(out), torch.ones_like(lse)))
        results.append((out, lse) + grads)
    for got, want in zip(*results):
        assert torch.equal(got, want)
    want_out, want_lse = inputs.oracle()
    assert_attention_close(results[0][0], want_out, dtype=case.dtype, kind="forward", name="out")


@pytest.mark.parametrize("context", ["flop_counter", "vmap", "autocast"])
def test_direct_path_leaves_modes_and_transforms_to_the_op(spy_backend, context):
    """A TorchDispatchMode, a functorch transform or an autocast region must see the op: the call takes it."""
    inputs = CASE.make_inputs(0)
    if context == "flop_counter":
        with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
            inputs.call("spy")
        assert counter.get_total_flops() > 0
    elif context == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inputs.call("spy")
    else:
        torch.vmap(lambda q: jfa_ops.jagged_attention(q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets,
                                                      backend="spy"))(inputs.q.unsqueeze(0))  # torch's vmap fallback
    assert "direct" not in spy_backend


@pytest.mark.parametrize("guard", [torch.no_grad, torch.enable_grad])
def test_inference_path_raises_the_same_errors(guard):
    inputs = CASE.make_inputs(0, requires_grad=True)
    bad = inputs.kv_offsets.clone()
    bad[-1] += 1
    with guard(), pytest.raises(ValueError, match=r"kv_offsets\[-1\] must equal the number of rows"):
        jfa_ops.jagged_attention(inputs.q, inputs.k, inputs.v, inputs.q_offsets, bad, backend="reference")
    with guard(), pytest.raises(ValueError, match="head_dim must be a multiple of 8"):
        jfa_ops.jagged_attention(inputs.q[..., :6], inputs.k[..., :6], inputs.v[..., :6], inputs.q_offsets,
                                 inputs.kv_offsets, backend="reference")


@pytest.fixture
def backward_checks(monkeypatch):
    """Counts the backward op's own checks (meta_kernels.check_attention_backward_args) and the forward's."""
    calls = {"backward": 0, "forward": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(meta_kernels, "check_attention_backward_args",
                        counting("backward", meta_kernels.check_attention_backward_args))
    monkeypatch.setattr(meta_kernels, "check_attention_args", counting("forward", meta_kernels.check_attention_args))
    return calls


def test_autograd_backward_does_not_check_again(backward_checks):
    inputs = CASE.make_inputs(0, requires_grad=True)
    out, lse = inputs.call("reference")
    assert backward_checks == {"backward": 0, "forward": 1}
    grads = torch.autograd.grad((out, lse), (inputs.q, inputs.k, inputs.v),
                                (torch.ones_like(out), torch.ones_like(lse)))
    assert backward_checks == {"backward": 0, "forward": 1}, "the autograd backward re-ran the checks"
    assert all(g.shape == t.shape for g, t in zip(grads, (inputs.q, inputs.k, inputs.v)))


def test_public_backward_still_checks(backward_checks):
    args, kwargs = backward_op_args(CASE.make_inputs(0), "reference")
    torch.ops.jfa.attention_backward(*args, **kwargs)
    assert backward_checks["backward"] == 1
    grad_out = args[0]
    with pytest.raises(ValueError, match="grad_out"):
        torch.ops.jfa.attention_backward(grad_out[:-1], *args[1:], **kwargs)


def test_a_failed_autograd_backward_leaves_no_trust_behind():
    """The hand-over from the autograd backward is for that one call: after a backward that fails in the backend,
    a public call with bad arguments is still checked."""
    reference = get_backend("reference")

    def failing_backward(*args):
        raise RuntimeError("backend failed")

    register_backend(Backend("failing", forward=reference.forward, backward=failing_backward,
                             supports=reference.supports))
    try:
        inputs = CASE.make_inputs(0, requires_grad=True)
        out, _ = inputs.call("failing")
        with pytest.raises(RuntimeError, match="backend failed"):
            out.sum().backward()
    finally:
        unregister_backend("failing")
    args, kwargs = backward_op_args(CASE.make_inputs(0), "reference")
    with pytest.raises(ValueError, match="grad_out"):
        torch.ops.jfa.attention_backward(args[0][:-1], *args[1:], **kwargs)


def test_call_memo_skips_the_metadata_work_on_a_repeat(spy_backend, monkeypatch):
    """The direct path checks, resolves and chooses once per call signature: a repeat (other values, same metadata)
    runs none of it; other metadata (here the row count) is a new signature and is checked."""
    monkeypatch.setattr(attention_ops, "_CALLS", {})
    x = CASE.make_inputs(0)
    jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, backend="spy")

    def no_checks(*args, **kwargs):
        raise AssertionError("checked again")

    monkeypatch.setattr(attention_ops, "_check_tensors", no_checks)
    y = CASE.make_inputs(0)  # fresh values, same metadata
    jfa_ops.jagged_attention(y.q, y.k, y.v, y.q_offsets, y.kv_offsets, causal=True, backend="spy")
    with pytest.raises(AssertionError, match="checked again"):
        jfa_ops.jagged_attention(y.q[:-1], y.k, y.v, y.q_offsets, y.kv_offsets, causal=True, backend="spy")


def test_call_memo_never_stores_a_bad_call(monkeypatch):
    """A call that fails a check raises every time (nothing is remembered from it), and a good call's entry does not
    cover a bad call that differs only in an option's type (causal=1 vs True)."""
    monkeypatch.setattr(attention_ops, "_CALLS", {})
    x = CASE.make_inputs(0)
    jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, backend="reference")
    for _ in range(2):
        with pytest.raises(TypeError, match="causal must be a bool"):
            jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=1, backend="reference")
        with pytest.raises(TypeError, match="k must have q's dtype"):
            jfa_ops.jagged_attention(x.q, x.k.double(), x.v.double(), x.q_offsets, x.kv_offsets, backend="reference")


def test_call_memo_helpers_bound_and_unhashable_keys():
    """``_recall`` / ``_remember``, the memos' one pair (``_CALLS``, ``_FAST``, ``block_sparse._SELECT_CALLS``): a
    None key is the memo off; an unhashable key misses and is neither kept nor clears the table; a full table
    (``_CALLS_MAX``) is cleared before the next entry."""
    table, bound = {}, attention_ops._CALLS_MAX
    attention_ops._remember(table, None, "off")
    assert table == {} and attention_ops._recall(table, None) is None
    for n in range(bound):
        attention_ops._remember(table, (n,), n)
    assert len(table) == bound and attention_ops._recall(table, (3,)) == 3
    attention_ops._remember(table, ([1],), "unhashable")
    assert len(table) == bound and attention_ops._recall(table, ([1],)) is None
    attention_ops._remember(table, ("next",), "next")
    assert table == {("next",): "next"}


def test_call_memo_follows_the_registry_env_and_determinism(monkeypatch):
    """What the backend choice and the params read besides the tensors' metadata is in the key: registering a backend,
    $JFA_BACKEND and torch.use_deterministic_algorithms each change what a repeat of the same call gets."""
    monkeypatch.setattr(attention_ops, "_CALLS", {})
    x = CASE.make_inputs(0)
    seen = []

    def record(name):
        def forward(q, k, v, q_offsets, kv_offsets, params):
            seen.append((name, params.deterministic))
            return get_backend("reference").forward(q, k, v, q_offsets, kv_offsets, params)
        return forward

    def call():
        return jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True)

    ref = get_backend("reference")
    try:
        register_backend(Backend("memo_a", forward=record("a"), backward=ref.backward, supports=lambda p: None,
                                 priority=10 ** 6))
        call()
        register_backend(Backend("memo_b", forward=record("b"), backward=ref.backward, supports=lambda p: None,
                                 priority=10 ** 6 + 1))
        call()
        monkeypatch.setenv("JFA_BACKEND", "memo_a")
        call()
        torch.use_deterministic_algorithms(True)
        try:
            call()
        finally:
            torch.use_deterministic_algorithms(False)
    finally:
        unregister_backend("memo_a")
        unregister_backend("memo_b")
    assert seen == [("a", False), ("b", False), ("a", False), ("a", True)]


_FAIL_NEXT: list = []  # fast_path's backend raises the message it pops (a forward that fails before its launches)


@pytest.fixture
def fast_path(monkeypatch):
    """The eager fast path on CPU: offsets "checked on the device" (validation mode async, a backend with
    checks_offsets; the reference backend computes), so calls are kept; yields the params each call's backend got."""
    from jfa_ops import validation

    monkeypatch.setattr(attention_ops, "_FAST", {})
    monkeypatch.setattr(attention_ops, "_CALLS", {})
    monkeypatch.setattr(validation, "validation_mode", lambda device: "async")
    reference, seen = get_backend("reference"), []

    def forward(q, k, v, q_offsets, kv_offsets, params):
        seen.append(params)
        if _FAIL_NEXT:
            raise RuntimeError(_FAIL_NEXT.pop())
        return reference.forward(q, k, v, q_offsets, kv_offsets, params)

    register_backend(Backend("fastspy", forward=forward, backward=reference.backward, supports=reference.supports,
                             checks_offsets=True))
    yield seen
    unregister_backend("fastspy")


def _oracle_out(x, **options):
    from jfa_ops.testing import reference_attention
    return reference_attention(*(t.double() for t in (x.q, x.k, x.v)), x.q_offsets, x.kv_offsets, **options)[0]


def test_fast_path_runs_no_checks_on_a_repeat(fast_path, monkeypatch):
    """A repeated signature goes straight to the backend (no option or tensor checks, no backend choice) with the
    params the first call resolved, and computes on its own inputs (vs the float64 oracle); inputs that require grad
    get gradients through the same formula; another signature (one row fewer) takes the full path again."""
    x = CASE.make_inputs(0)
    jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, backend="fastspy")

    def checked(*args, **kwargs):
        raise AssertionError("checked again")

    monkeypatch.setattr(meta_kernels, "check_options", checked)
    monkeypatch.setattr(attention_ops, "_check_tensors", checked)
    for seed in (1, 2):
        y = CASE.make_inputs(seed)  # fresh values, same signature
        out = jfa_ops.jagged_attention(y.q, y.k, y.v, y.q_offsets, y.kv_offsets, causal=True, backend="fastspy")
        assert_attention_close(out, _oracle_out(y, causal=True), dtype=y.q.dtype, kind="forward", name="out")
    assert len(fast_path) == 3 and fast_path[1] is fast_path[0] and fast_path[0].check_offsets
    g = CASE.make_inputs(3)
    q, k, v = (t.clone().requires_grad_() for t in (g.q, g.k, g.v))
    jfa_ops.jagged_attention(q, k, v, g.q_offsets, g.kv_offsets, causal=True, backend="fastspy").sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (g.q, g.k, g.v))
    from jfa_ops.testing import reference_attention
    reference_attention(q64, k64, v64, g.q_offsets, g.kv_offsets, causal=True)[0].sum().backward()
    for name, got, want in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert_attention_close(got, want, dtype=g.q.dtype, kind="grad", name=name)
    with pytest.raises(AssertionError, match="checked again"):
        jfa_ops.jagged_attention(x.q[:-1], x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, backend="fastspy")


def test_fast_path_never_covers_a_bad_call(fast_path):
    """What the key holds beyond the metadata: an option's type (causal=1, a float window end) and a list window
    (unhashable: the full path, which accepts it) each get the full path's checks, every time; bad calls are never
    kept."""
    x = CASE.make_inputs(0)
    call = lambda **kw: jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets,  # noqa: E731
                                                 backend="fastspy", **kw)
    call(causal=True, window=(2, 0))
    for _ in range(2):
        with pytest.raises(TypeError, match="causal must be a bool"):
            call(causal=1, window=(2, 0))
        with pytest.raises(TypeError, match="window"):
            call(causal=True, window=(2.0, 0))
        call(causal=True, window=[2, 0])
        with pytest.raises(TypeError, match="k must have q's dtype"):
            jfa_ops.jagged_attention(x.q, x.k.double(), x.v.double(), x.q_offsets, x.kv_offsets, causal=True,
                                     window=(2, 0), backend="fastspy")
    assert len(attention_ops._FAST) == 1


def test_fast_path_follows_the_validation_mode_and_env(fast_path, monkeypatch):
    """A kept call's offsets were left to the device; when the validation mode becomes sync, the same signature
    with bad offsets raises on the host, every time (sync calls are not kept); $JFA_BACKEND changes the backend a
    repeat gets."""
    from jfa_ops import validation

    x = CASE.make_inputs(0)
    bad = x.kv_offsets.clone()
    bad[-1] += 1  # last != rows
    jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, backend="fastspy")
    assert len(attention_ops._FAST) == 1  # kept: bad offsets of this signature would be the device's to find
    monkeypatch.setattr(validation, "validation_mode", lambda device: "sync")
    for _ in range(2):
        with pytest.raises(ValueError, match="kv_offsets"):
            jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, bad, causal=True, backend="fastspy")
    monkeypatch.setattr(validation, "validation_mode", lambda device: "async")
    monkeypatch.setenv("JFA_BACKEND", "fastspy")
    for _ in range(2):
        jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True)
    before = len(fast_path)
    monkeypatch.setenv("JFA_BACKEND", "reference")
    jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True)
    assert len(fast_path) == before  # the reference backend, not fastspy


def test_fast_path_checks_new_offsets_and_covers_repeats(fast_path, monkeypatch):
    """In async mode a repeat with the same offsets tensors (a model's layers share them) skips its check (the
    backend gets check_offsets=False); new offsets, or the same ones modified in place, are checked again; deferred
    mode checks every call."""
    from jfa_ops import validation

    coverage_as_on_one_cuda_stream(monkeypatch)
    x = CASE.make_inputs(0)

    def checks(q_offsets, kv_offsets, calls=1):
        before = len(fast_path)
        for _ in range(calls):
            jfa_ops.jagged_attention(x.q, x.k, x.v, q_offsets, kv_offsets, causal=True, backend="fastspy")
        return [p.check_offsets for p in fast_path[before:]]

    assert checks(x.q_offsets, x.kv_offsets, 3) == [True, False, False]  # full path, then the fast path
    fresh = x.kv_offsets.clone()
    assert checks(x.q_offsets, fresh, 2) == [True, False]
    fresh.add_(0)
    assert checks(x.q_offsets, fresh) == [True]
    monkeypatch.setattr(validation, "validation_mode", lambda device: "deferred")
    assert checks(x.q_offsets, fresh, 2) == [True, True]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_offsets_checked_once_per_tensor_gpu(monkeypatch):
    """On the GPU in async mode: the first call with an offsets tensor checks it (one device flag), repeats with the
    same tensor do not, a new tensor is checked, and a call captured into a CUDA graph keeps its check; every output
    matches the float64 oracle."""
    from jfa_ops import validation
    from jfa_ops.testing import reference_attention

    monkeypatch.delenv("JFA_VALIDATE", raising=False)
    monkeypatch.setattr(validation, "_COVERED", {})
    flags = []
    real = validation.device_flag
    monkeypatch.setattr(validation, "device_flag", lambda ok, mode: flags.append(mode) or real(ok, mode))
    off = torch.tensor([0, 40, 41, 97], device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(97, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    want = reference_attention(q.double().cpu(), k.double().cpu(), v.double().cpu(), off.cpu(), off.cpu(),
                               causal=True)[0]

    def call(offsets):
        out = jfa_ops.jagged_attention(q, k, v, offsets, offsets, causal=True, backend="triton")
        assert_attention_close(out.cpu(), want, dtype=q.dtype, kind="forward", name="out")
        return out

    for _ in range(3):
        call(off)
    assert len(flags) == 1
    call(off.clone())
    assert len(flags) == 2
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            jfa_ops.jagged_attention(q, k, v, off, off, causal=True, backend="triton")
    torch.cuda.current_stream().wait_stream(stream)
    assert len(flags) == 3  # the captured call kept its own check


def test_a_failed_call_covers_nothing(fast_path, monkeypatch):
    """A call whose backend fails before enqueueing its check leaves its offsets uncovered: the next call checks."""
    from jfa_ops import validation

    coverage_as_on_one_cuda_stream(monkeypatch)
    x = CASE.make_inputs(0)
    for expect_failure in (True, False):  # the full path, then the fast path
        _FAIL_NEXT.append("out of memory")
        with pytest.raises(RuntimeError, match="out of memory"):
            jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, backend="fastspy")
        jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, backend="fastspy")
        assert [p.check_offsets for p in fast_path[-2:]] == [True, True]
        monkeypatch.setattr(validation, "_COVERED", {})


def test_direct_training_call_skips_the_python_layer_of_function_apply(spy_backend, monkeypatch):
    """The direct path records autograd through torch's C ``apply``: ``torch.autograd.Function.apply``'s Python layer
    (default binding, functorch routing, ~6-12 us a call) has nothing to do there (``eager_direct``)."""
    calls = []
    python_apply = torch.autograd.Function.apply.__func__

    def counting_apply(cls, *args, **kwargs):
        calls.append(cls.__name__)
        return python_apply(cls, *args, **kwargs)

    monkeypatch.setattr(torch.autograd.Function, "apply", classmethod(counting_apply))
    inputs = CASE.make_inputs(0, requires_grad=True)
    out, lse = inputs.call("spy")
    grads = torch.autograd.grad((out * torch.randn_like(out)).sum(), (inputs.q, inputs.k, inputs.v))
    assert spy_backend == ["direct"] and calls == []
    assert out.grad_fn is not None and all(g is not None for g in grads)


def test_direct_path_unwraps_a_dead_functorch_wrapper():
    """A tensor that outlived its functorch transform (captured inside ``torch.func.grad``) is a plain Tensor to
    ``eager_direct``; as ``Function.apply`` does, the direct path unwraps it, so gradients reach the tensor it wraps."""
    inputs = CASE.make_inputs(0, requires_grad=True)
    captured = []
    torch.func.grad(lambda x: captured.append(x) or x.sum())(inputs.q)
    dead = captured[0]
    assert torch._C._functorch.is_functorch_wrapped_tensor(dead) and attention_ops.eager_direct(dead)
    out = jfa_ops.jagged_attention(dead, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets, **inputs.kwargs,
                                   backend="reference")
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad((out * grad_out).sum(), (inputs.q, inputs.k, inputs.v))
    want = torch.autograd.grad((inputs.oracle()[0] * grad_out).sum(), (inputs.q, inputs.k, inputs.v))
    for name, g, w in zip("qkv", got, want):
        assert_attention_close(g, w, dtype=CASE.dtype, kind="grad", name=f"d{name}")


def _count_environment_reads(monkeypatch) -> list:
    """The names of the environment variables read from now on (``os.environ[...]``, ``.get``)."""
    reads, read = [], type(os.environ).__getitem__

    def counting(self, name):
        reads.append(name)
        return read(self, name)

    monkeypatch.setattr(type(os.environ), "__getitem__", counting)
    return reads


def test_fast_path_repeat_with_a_named_backend_reads_no_environment(fast_path, monkeypatch):
    """$JFA_BACKEND matters only when no backend is named, so a repeat that names its backend reads no environment
    variable (a read costs ~1-3 us on the host); one that names none still reads it (and follows it: the test
    above)."""
    x = CASE.make_inputs(0)
    monkeypatch.setenv("JFA_BACKEND", "fastspy")
    reads = _count_environment_reads(monkeypatch)
    for backend in ("fastspy", None):
        jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, backend=backend)  # kept
        reads.clear()
        jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, backend=backend)
        assert reads == ([] if backend else ["JFA_BACKEND"]), backend
    assert len(fast_path) == 4


# ------------------------------------------------------------------------------------------ eager reuse of lists
@pytest.fixture
def eager_reuse(monkeypatch):
    """``base`` eager reuse on CPU tensors too (the default keeps it to CUDA), a clean memo before and after."""
    from jfa_ops.backends import base

    monkeypatch.setattr(base, "EAGER_REUSE", True)
    monkeypatch.setattr(base, "EAGER_REUSE_DEVICES", ("cpu", "cuda"))
    monkeypatch.setattr(base, "_EAGER_REUSABLE", set(base._EAGER_REUSABLE))
    base.clear_eager_reuse()
    yield base
    base.clear_eager_reuse()


def test_eager_reuse_only_for_the_same_live_tensor_at_its_version(eager_reuse, monkeypatch):
    """``base.reusable_in_eager``: an eager ``per_trace`` call reuses a result only for the same live tensor at
    the same version (not for an equal other tensor, not after an in-place write, not for a new tensor at a dead
    one's id); a call with unkeyed arguments runs and serves the next; inference tensors, other devices, the switch
    off and a full memo all build again. Fails if any of those reuses a stale value."""
    base = eager_reuse
    calls = []

    def build(t, n, flag=None):
        calls.append((n, flag))
        return [n]

    base.reusable_in_eager(build)
    t = torch.zeros(3)
    first = base.per_trace(build, t, 1)
    assert base.per_trace(build, t, 1) is first and len(calls) == 1
    assert base.per_trace(build, torch.zeros(3), 1) is not first  # equal values, another tensor
    assert base.per_trace(build, t, 2) is not first
    checked = base.per_trace(build, t, 3, flag="flag")  # its side effect must happen: runs, then serves
    assert base.per_trace(build, t, 3) is checked and calls.count((3, "flag")) == 1
    nested = base.per_trace(build, (t, 2.5), 9)  # tensors inside a tuple (the general walk): the same rule
    assert base.per_trace(build, (t, 2.5), 9) is nested
    t.add_(0)  # in place: another value as far as anyone can tell
    assert base.per_trace(build, t, 1) is not first
    assert base.per_trace(build, (t, 2.5), 9) is not nested
    dead = torch.zeros(3)
    kept = base.per_trace(build, dead, 4)
    del dead
    for _ in range(100):  # a new tensor, possibly at the dead one's id and version 0: never its value
        assert base.per_trace(build, torch.zeros(3), 4) is not kept
    with torch.inference_mode():
        inf = torch.zeros(3)
    assert base.per_trace(build, inf, 5) is not base.per_trace(build, inf, 5)
    monkeypatch.setattr(base, "EAGER_REUSE_DEVICES", ("cuda",))
    assert base.per_trace(build, t, 6) is not base.per_trace(build, t, 6)
    monkeypatch.setattr(base, "EAGER_REUSE_DEVICES", ("cpu",))
    monkeypatch.setattr(base, "EAGER_REUSE", False)
    assert base.per_trace(build, t, 7) is not base.per_trace(build, t, 7)
    monkeypatch.setattr(base, "EAGER_REUSE", True)
    old = base.per_trace(build, t, 8)
    for n in range(100, 100 + base.EAGER_REUSE_ENTRIES):  # the memo keeps the latest entries only
        base.per_trace(build, t, n)
    assert base.per_trace(build, t, 8) is not old
    other = []
    assert base.per_trace(lambda x: other.append(x) or x, t) is not None and other  # unmarked: always runs


def _count_list_builds(monkeypatch) -> list:
    """Launches that build a list: tile lists (``tile_slots_kernel``) and the tlx backward's causal item lists
    (``causal_streams_kernel``)."""
    from jfa_ops.backends.triton import block_sparse_bwd, scheduling

    builds, launch, launch_planned = [], scheduling.launch, block_sparse_bwd.launch_planned

    def counting(kernel, *args, **kwargs):
        if kernel is scheduling.tile_slots_kernel:
            builds.append(kernel)
        return launch(kernel, *args, **kwargs)

    def counting_planned(kernel, *args, **kwargs):
        if kernel is block_sparse_bwd.causal_streams_kernel:
            builds.append(kernel)
        return launch_planned(kernel, *args, **kwargs)

    monkeypatch.setattr(scheduling, "launch", counting)
    monkeypatch.setattr(block_sparse_bwd, "launch_planned", counting_planned)
    return builds


def _tlx_missing() -> bool:
    from jfa_ops.backends import unavailable_reason
    from jfa_ops.backends.base import Problem

    if not torch.cuda.is_available():
        return True
    return unavailable_reason("tlx", Problem("cuda", torch.bfloat16, 64, 2, 2, True, -1, -1, False, False)) is not None


@pytest.mark.parametrize("device,backend", [
    pytest.param("cpu", "triton", marks=pytest.mark.skipif(torch.cuda.is_available(),
                                                           reason="the interpreter is off with CUDA")),
    pytest.param("cuda", "triton", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                              reason="needs a CUDA device")]),
    pytest.param("cuda", "tlx", marks=[pytest.mark.gpu, pytest.mark.skipif(_tlx_missing(),
                                                                           reason="needs the tlx backend")])])
def test_eager_layers_share_one_tile_list_per_offsets_tensor(eager_reuse, monkeypatch, device, backend):
    """Three eager layers (sorted lists forced) with one offsets tensor build the forward list once and the
    backward's lists once (the tlx backward's causal item list too), not per layer, and every output and gradient
    still matches the float64 oracle; a write into the offsets (new lengths) and a new tensor each build again, with
    the right numbers. Fails if a reused list is stale (wrong rows: the oracle) or if lists are built per layer (the
    count). The backward runs on autograd's device thread on CUDA, so it keeps its own lists there."""
    from jfa_ops.backends.triton.configs import KNOBS
    from jfa_ops.testing import reference_attention

    monkeypatch.setattr(KNOBS, "one_wave_unsorted", False)  # lists even for these few tiles
    builds = _count_list_builds(monkeypatch)
    dtype = torch.float16 if device == "cpu" else torch.bfloat16  # the interpreter's bf16 dot is wrong (README)
    heads, dim = 2, 16 if backend == "triton" else 64

    def offsets(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)

    def run(off, layers):
        x0 = torch.randn(int(off[-1]), heads, dim, device=device, dtype=dtype, requires_grad=True)
        k, v = (torch.randn_like(x0) for _ in range(2))
        x, got = x0, []
        for _ in range(layers):
            x = jfa_ops.jagged_attention(x, k, v, off, off, causal=True, backend=backend)
            got.append(x)
        grad = torch.autograd.grad(x.float().square().sum(), x0)[0]
        ref = x0.detach().double().requires_grad_()
        y = ref
        for layer in range(layers):
            y = reference_attention(y, k, v, off, off, causal=True)[0]
            assert_attention_close(got[layer], y.detach(), dtype=dtype, kind="forward", name=f"layer {layer}")
        want = torch.autograd.grad(y.square().sum(), ref)[0]
        assert_attention_close(grad, want, dtype=dtype, kind="grad", name="dx0")

    off = offsets([37, 0, 5, 70])
    monkeypatch.setattr(eager_reuse, "EAGER_REUSE", False)
    run(off, 3)
    per_layer, rest = divmod(len(builds), 3)  # each layer's forward, dK/dV and dQ (or causal item) lists
    assert per_layer >= 2 and rest == 0, builds
    monkeypatch.setattr(eager_reuse, "EAGER_REUSE", True)
    builds.clear()
    run(off, 3)
    reused = len(builds)  # one list per kind and thread (on CPU the dQ list is the forward's: same arguments)
    assert 1 <= reused <= per_layer, (reused, per_layer)
    builds.clear()
    run(off, 3)  # the same offsets tensor again: every list already built
    assert len(builds) == 0, builds
    off.copy_(offsets([5, 70, 37, 0]))  # same tensor, new lengths: built again
    builds.clear()
    run(off, 2)
    assert len(builds) == reused
    builds.clear()
    run(offsets([5, 70, 37, 0]), 2)  # equal values, another tensor: built again
    assert len(builds) == reused
