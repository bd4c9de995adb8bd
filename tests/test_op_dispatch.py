"""The dispatched op path a compiled graph calls when it keeps the op opaque: the lean autograd-key kernel and the op
bodies' memo (ops.attention ``LEAN_DISPATCH``, ``CALL_CACHE``) change host work only, never results or launches."""
import os
import sys

import pytest
import torch

from jfa_ops.ops import attention as ops
from jfa_ops.testing import AttentionCase, assert_attention_close, backward_op_args
from tests.common import RecordOps

CASE = AttentionCase((3, 0, 5), (4, 2, 6), heads_q=4, heads_kv=2, dtype=torch.float32, causal=True)


def _generated_kernel_on_stack() -> bool:
    """torch.library's generated autograd kernel (torch/_library/autograd.py) is a caller of this frame."""
    frame, suffix = sys._getframe(1), os.path.join("_library", "autograd.py")
    while frame is not None:
        if frame.f_code.co_filename.endswith(suffix):
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def spy(monkeypatch):
    """Backend "dispatch_spy": the reference backend, whose forward/backward append the params they got to
    ``spy.params`` and whether torch.library's generated autograd kernel is a caller to ``spy.generated``."""
    from jfa_ops.backends import Backend, get_backend, register_backend, unregister_backend
    reference = get_backend("reference")

    class Spy:
        params, generated = [], []

    def forward(q, k, v, q_offsets, kv_offsets, params):
        Spy.params.append(params)
        Spy.generated.append(_generated_kernel_on_stack())
        return reference.forward(q, k, v, q_offsets, kv_offsets, params)

    register_backend(Backend("dispatch_spy", forward=forward, backward=reference.backward,
                             supports=reference.supports), replace=True)
    yield Spy
    unregister_backend("dispatch_spy")


@pytest.fixture(params=["lean+memo", "custom_op"])
def op_path(request, monkeypatch):
    """The op path as now (lean dispatch, body memo) and as before (both off)."""
    on = request.param == "lean+memo"
    monkeypatch.setattr(ops, "LEAN_DISPATCH", on)
    monkeypatch.setattr(ops, "CALL_CACHE", on)
    monkeypatch.setattr(ops, "_CALLS", {})
    return on


def _forward_and_backward(x, backend="reference"):
    """out, lse, dq, dk, dv through ``torch.ops.jfa.<op>.default`` under no_grad (as a compiled graph calls them)."""
    with torch.no_grad():
        out, lse = torch.ops.jfa.attention.default(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True,
                                                   backend=backend)
        grad_out = torch.randn_like(out)
        grads = torch.ops.jfa.attention_backward.default(grad_out, None, x.q, x.k, x.v, out, lse, x.q_offsets,
                                                         x.kv_offsets, causal=True, backend=backend)
    return (out, lse, *grads), grad_out


def test_both_paths_give_the_reference_and_each_other_bit_for_bit(monkeypatch):
    """Same body, same arguments: the lean path's results equal the custom_op path's bit for bit, and both match
    the float64 reference (``assert_attention_close`` against jfa_ops.testing's oracle)."""
    results = {}
    for on in (True, False):
        monkeypatch.setattr(ops, "LEAN_DISPATCH", on)
        monkeypatch.setattr(ops, "CALL_CACHE", on)
        torch.manual_seed(0)
        results[on], grad_out = _forward_and_backward(CASE.make_inputs(0))
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b)
    x = CASE.make_inputs(0, requires_grad=True)
    want_out, want_lse = x.oracle()
    want_grads = torch.autograd.grad(want_out, (x.q, x.k, x.v), grad_out.to(torch.float64))
    names = ("out", "lse", "dq", "dk", "dv")
    kinds = ("forward", "lse", "grad", "grad", "grad")
    for got, want, kind, name in zip(results[True], (want_out, want_lse, *want_grads), kinds, names):
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got)), name
        assert_attention_close(got[finite], want[finite], dtype=CASE.dtype, kind=kind, name=name)


def test_lean_path_skips_the_generated_kernel_only_where_nothing_else_must_run(op_path, spy):
    """No autograd to record: the body runs from the lean kernel (torch's generated kernel is not on the stack);
    inputs requiring grad under grad mode: the generated kernel records the node, and the gradient flows."""
    x = CASE.make_inputs(0, requires_grad=True)
    with torch.no_grad():
        torch.ops.jfa.attention.default(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True,
                                        backend="dispatch_spy")
    out, _ = torch.ops.jfa.attention.default(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True,
                                             backend="dispatch_spy")
    assert spy.generated == [not op_path, True]
    assert out.grad_fn is not None
    out.sum().backward()
    assert x.q.grad is not None and x.k.grad is not None


def test_dispatch_modes_and_fake_tensors_still_see_the_op(op_path):
    """A TorchDispatchMode (FlopCounterMode, SchemaCheckMode, ...) must see jfa.attention itself, and FakeTensors
    take the fake: any key between autograd and the backend sends the call the generated kernel's way."""
    x = CASE.make_inputs(0)
    with torch.no_grad(), RecordOps() as mode:
        torch.ops.jfa.attention.default(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, backend="reference")
    assert mode.ops[0] == "jfa.attention.default", mode.ops[:3]
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    with FakeTensorMode() as fake, torch.no_grad():
        q, k, v, q_off, kv_off = (fake.from_tensor(t) for t in (x.q, x.k, x.v, x.q_offsets, x.kv_offsets))
        out, lse = torch.ops.jfa.attention.default(q, k, v, q_off, kv_off, causal=True, backend="reference")
    assert isinstance(out, FakeTensor) and tuple(out.shape) == tuple(x.q.shape)


def test_a_plain_cuda_tensor_call_takes_the_lean_path():
    """The lean kernel's test on the keyset: what a plain CUDA tensor's call has below ADInplaceOrView (its keyset
    as torch builds it: dense CUDA, ADInplaceOrView, AutogradCUDA, AutocastCUDA) is one of ``_DENSE_KEYSETS``;
    with the Python key (a subclass or mode) it is not. On a GPU, a real tensor's keyset too."""
    keys = torch._C.DispatchKey
    below = torch._C._after_ADInplaceOrView_keyset
    cuda = torch._C.DispatchKeySet(keys.CUDA)
    for key in (keys.ADInplaceOrView, keys.AutogradCUDA, keys.AutocastCUDA):
        cuda = cuda.add(key)
    assert (cuda & below) in ops._DENSE_KEYSETS
    assert (cuda.add(keys.Python) & below) not in ops._DENSE_KEYSETS
    assert (torch._C._dispatch_keys(torch.ones(1)) & below) in ops._DENSE_KEYSETS
    if torch.cuda.is_available():
        assert (torch._C._dispatch_keys(torch.ones(1, device="cuda")) & below) in ops._DENSE_KEYSETS


@pytest.mark.parametrize("op", ["forward", "backward"])
def test_op_body_memo_checks_once_per_signature_and_never_keeps_a_bad_call(op, monkeypatch):
    """The op bodies check and choose once per signature (tensor metadata, options and their types): a repeat with
    other values runs none of the checks; other metadata is checked; a call that fails a check is never kept, and a
    good call's entry does not cover one that differs only in an option's type (causal=1 vs True)."""
    monkeypatch.setattr(ops, "_CALLS", {})
    x = CASE.make_inputs(0)
    args, kwargs = backward_op_args(x, "reference")
    if op == "forward":
        body, check = ops.attention._init_fn, "_params"
        positional = (x.q, x.k, x.v, x.q_offsets, x.kv_offsets)
    else:
        body, check = ops.attention_backward._init_fn, "_backward_params"
        positional = tuple(args[:9])
    options = (-1, -1, None, True, -1, -1, False, False, "reference")
    body(*positional, *options)
    real = getattr(ops, check)

    def no_checks(*a, **k):
        raise AssertionError("checked again")

    monkeypatch.setattr(ops, check, no_checks)
    y = CASE.make_inputs(1)  # other values, same metadata
    y_positional = ((y.q, y.k, y.v, y.q_offsets, y.kv_offsets) if op == "forward"
                    else tuple(backward_op_args(y, "reference")[0][:9]))
    body(*y_positional, *options)
    with pytest.raises(AssertionError, match="checked again"):
        body(*y_positional, -1, -1, 0.5, True, -1, -1, False, False, "reference")  # another scale: checked
    monkeypatch.setattr(ops, check, real)
    for _ in range(2):
        with pytest.raises(TypeError, match="causal must be a bool"):
            body(*positional, -1, -1, None, 1, -1, -1, False, False, "reference")


def test_op_body_memo_keeps_the_params_a_full_call_gets(spy, monkeypatch):
    """A memo hit hands the backend the same params as a call without the memo."""
    monkeypatch.setattr(ops, "_CALLS", {})
    x = CASE.make_inputs(0)
    for memo in (False, True, True):
        monkeypatch.setattr(ops, "CALL_CACHE", memo)
        ops.attention._init_fn(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, -1, -1, None, True, -1, -1, False, False,
                               "dispatch_spy")
    assert len(spy.params) == 3 and spy.params[0] == spy.params[1] == spy.params[2]


def test_a_forward_reads_the_validation_mode_once(monkeypatch):
    """The op's forward and the eager direct path read ``JFA_VALIDATE`` (``validation_mode``) once per call and hand
    that answer to both the offset check and the coverage record: the backend still gets the checked params (async
    mode, a backend that checks offsets on the device)."""
    from jfa_ops import validation
    from jfa_ops.backends import Backend, get_backend, register_backend, unregister_backend
    reference, got, reads = get_backend("reference"), [], []

    def forward(q, k, v, q_offsets, kv_offsets, params):
        got.append(params.check_offsets)
        return reference.forward(q, k, v, q_offsets, kv_offsets, params)

    def async_mode(device):
        reads.append(device)
        return "async"

    register_backend(Backend("mode_spy", forward=forward, backward=reference.backward, supports=reference.supports,
                             checks_offsets=True), replace=True)
    try:
        monkeypatch.setattr(validation, "validation_mode", async_mode)
        x = CASE.make_inputs(0)
        options = (-1, -1, None, True, -1, -1, False, False, "mode_spy")
        with torch.no_grad():
            torch.ops.jfa.attention.default(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, *options)
        assert (len(reads), got) == (1, [True])
        ops.attention_direct(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, *options)
        assert (len(reads), got) == (2, [True, True])
    finally:
        unregister_backend("mode_spy")


@pytest.fixture
def direct_call(monkeypatch, spy):
    """JFA_OP_CALL=direct for this test (both overloads' class restored after; backend "dispatch_spy" unregistered
    after, whatever the test registers under that name)."""
    for op_def in (ops.attention, ops.attention_backward):
        monkeypatch.setattr(op_def._opoverload, "__class__", op_def._opoverload.__class__)
        monkeypatch.setattr(op_def._opoverload, "_jfa_direct", None, raising=False)
    ops.install_direct_call()
    monkeypatch.setattr(ops, "DIRECT_OP_CALL", True)
    return spy


def _dispatched() -> bool:
    """``_lean_autograd_kernel``'s kernel (the dispatcher's way into the body) is a caller of this frame."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "kernel" and frame.f_code.co_filename == ops.__file__:
            return True
        frame = frame.f_back
    return False


def test_direct_op_call_runs_the_body_only_where_the_dispatcher_would(direct_call, monkeypatch):
    """JFA_OP_CALL=direct: a plain no-grad call runs the body from the overload's call, bit for bit what the
    dispatcher's path gives (forward and backward); a call the dispatcher must see (keywords, grad mode on, an int
    for the float scale, a dispatch mode, fake tensors, the profiler) goes through the dispatcher, with the same
    results where it has results."""
    from jfa_ops.backends import Backend, get_backend, register_backend
    reference, direct = get_backend("reference"), []

    def forward(q, k, v, q_offsets, kv_offsets, params):
        direct.append(not _dispatched())
        return reference.forward(q, k, v, q_offsets, kv_offsets, params)

    register_backend(Backend("dispatch_spy", forward=forward, backward=reference.backward,
                             supports=reference.supports), replace=True)
    x = CASE.make_inputs(0)
    positional = (x.q, x.k, x.v, x.q_offsets, x.kv_offsets, -1, -1, None, True, -1, -1, False, False, "dispatch_spy")
    results = {}
    for on in (True, False):
        monkeypatch.setattr(ops, "DIRECT_OP_CALL", on)
        with torch.no_grad():
            out, lse = torch.ops.jfa.attention.default(*positional)
            grad_out = torch.ones_like(out)
            grads = torch.ops.jfa.attention_backward.default(grad_out, None, *positional[:3], out, lse,
                                                             *positional[3:])
        results[on] = (out, lse, *grads)
    assert direct == [True, False]
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b)
    monkeypatch.setattr(ops, "DIRECT_OP_CALL", True)
    scale_int = positional[:7] + (1,) + positional[8:]
    with torch.no_grad():
        torch.ops.jfa.attention.default(*positional[:5], causal=True, backend="dispatch_spy")  # keywords
        got_int = torch.ops.jfa.attention.default(*scale_int)[0]
        want_float = torch.ops.jfa.attention.default(*positional[:7], 1.0, *positional[8:])[0]
        with RecordOps() as mode:
            torch.ops.jfa.attention.default(*positional)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            torch.ops.jfa.attention.default(*positional)
    torch.ops.jfa.attention.default(*positional)  # grad mode on
    assert direct[2:] == [False, False, True, False, False, False]
    assert torch.equal(got_int, want_float)
    assert mode.ops[0] == "jfa.attention.default"
    assert any(e.name == "jfa::attention" for e in prof.events())
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    with FakeTensorMode() as fake, torch.no_grad():
        fakes = tuple(fake.from_tensor(t) for t in positional[:5])
        assert isinstance(torch.ops.jfa.attention.default(*fakes, *positional[5:])[0], FakeTensor)


def test_direct_op_call_keeps_the_op_in_compiled_graphs(direct_call):
    """Dynamo still records the overload as the op (one node; same result as eager), with JFA_OP_CALL=direct."""
    x = CASE.make_inputs(0)

    def f(q, k, v, q_off, kv_off):
        return torch.ops.jfa.attention.default(q, k, v, q_off, kv_off, -1, -1, None, True, -1, -1, False, False,
                                               "reference")[0]

    targets = []

    def record(gm, example_inputs):
        targets.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm

    args = (x.q, x.k, x.v, x.q_offsets, x.kv_offsets)
    for backend in (record, "aot_eager"):
        torch._dynamo.reset()
        with torch.no_grad():
            assert torch.equal(torch.compile(f, fullgraph=True, backend=backend)(*args), f(*args))
    assert targets.count(torch.ops.jfa.attention.default) == 1


@pytest.mark.parametrize("direct", [False, True])
def test_the_body_runs_below_autograd_only_under_grad_mode(direct, monkeypatch, spy):
    """A lean (or direct) call without grad mode runs the body with the autograd keys included (no op of it can
    record: excluding them only cost host time); one under grad mode with no input requiring grad runs it below
    autograd, as torch.library's backend wrapper does."""
    if direct:
        monkeypatch.setattr(ops.attention._opoverload, "__class__", ops.attention._opoverload.__class__)
        ops.install_direct_call()
        monkeypatch.setattr(ops, "DIRECT_OP_CALL", True)
    excluded = []
    from jfa_ops.backends import Backend, get_backend, register_backend
    reference = get_backend("reference")

    def forward(*args):
        excluded.append(torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.AutogradFunctionality))
        return reference.forward(*args)

    register_backend(Backend("dispatch_spy", forward=forward, backward=reference.backward,
                             supports=reference.supports), replace=True)
    x = CASE.make_inputs(0)
    positional = (x.q, x.k, x.v, x.q_offsets, x.kv_offsets, -1, -1, None, True, -1, -1, False, False, "dispatch_spy")
    with torch.no_grad():
        torch.ops.jfa.attention.default(*positional)
    torch.ops.jfa.attention.default(*positional)
    assert excluded == [False, True]
