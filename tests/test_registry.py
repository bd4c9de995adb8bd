"""The backend registry: a third party's backend in a few lines, choice by name / env / priority, errors."""
import dataclasses
import warnings

import pytest
import torch

import jfa_ops
from jfa_ops.backends import (Backend, FamilyImpl, Problem, get_backend, register_backend, registered_backends,
                              select_backend, unavailable_reason, unregister_backend)
from jfa_ops.backends import reference
from jfa_ops.testing import AttentionCase, check_attention_case


class CountingBackend:
    """A toy third-party backend: the reference math, counting its calls; refuses windows."""

    def __init__(self, name="counting", priority=1000):
        self.calls = {"forward": 0, "backward": 0}
        self.backend = Backend(name, forward=self.forward, backward=self.backward, supports=self.supports,
                               priority=priority)

    def forward(self, *args):
        self.calls["forward"] += 1
        return reference.forward(*args)

    def backward(self, *args):
        self.calls["backward"] += 1
        return reference.backward(*args)

    @staticmethod
    def supports(problem: Problem):
        if problem.window_left != -1 or problem.window_right != -1:
            return "sliding windows are not implemented"
        return None


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.delenv("JFA_BACKEND", raising=False)
    toy = CountingBackend()
    register_backend(toy.backend)
    yield toy
    unregister_backend(toy.backend.name)
    assert "counting" not in registered_backends()


def _inputs(**kw):
    return AttentionCase((3, 0, 5), (4, 2, 6), **kw).make_inputs(0, requires_grad=True)


def _run(inputs, **kw):
    out, lse = inputs.call(**kw)
    (out.sum() + lse.clamp_min(-1e4).sum()).backward()


def test_select_by_name(toy, monkeypatch):
    monkeypatch.setenv("JFA_BACKEND", "reference")  # the argument wins over the env
    _run(_inputs(), backend="counting")
    assert toy.calls == {"forward": 1, "backward": 1}


def test_select_by_env(toy, monkeypatch):
    monkeypatch.setenv("JFA_BACKEND", "counting")
    _run(_inputs())
    assert toy.calls == {"forward": 1, "backward": 1}
    monkeypatch.setenv("JFA_BACKEND", "reference")
    _run(_inputs())
    assert toy.calls == {"forward": 1, "backward": 1}


def test_select_by_priority(toy):
    assert registered_backends()[0] == "counting"
    _run(_inputs())
    assert toy.calls == {"forward": 1, "backward": 1}
    # a problem it does not support falls through to the next backend
    _run(_inputs(window=(2, 0)))
    assert toy.calls == {"forward": 1, "backward": 1}


def test_third_party_backend_passes_the_oracle_checks(toy):
    check_attention_case(AttentionCase((3, 0, 5), (4, 2, 6), heads_q=4, heads_kv=2, causal=True), "counting")
    assert toy.calls["forward"] == 1 and toy.calls["backward"] == 3


def test_unsupported_problem_names_the_reason(toy):
    with pytest.raises(ValueError, match=r"backend 'counting' cannot run this call: sliding windows are not"):
        _inputs(window=(2, 0)).call("counting")
    assert unavailable_reason("counting", Problem("cpu", torch.float32, 16, 2, 2, False, 3, -1, False, False)) \
        == "sliding windows are not implemented"


def test_unknown_backend(monkeypatch):
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; registered: \["):
        _inputs().call("nope")
    monkeypatch.setenv("JFA_BACKEND", "nope")
    with pytest.raises(ValueError, match=r"unknown backend 'nope'"):
        _inputs().call()
    with pytest.raises(ValueError, match=r"unknown backend 'nope'"):
        get_backend("nope")


def test_register_twice_needs_replace(toy):
    with pytest.raises(ValueError, match="already registered"):
        register_backend(toy.backend)
    replaced = dataclasses.replace(toy.backend, priority=-5)
    register_backend(replaced, replace=True)
    assert get_backend("counting") is replaced


def test_register_rejects_non_backend():
    with pytest.raises(TypeError, match="backend must be a jfa_ops.backends.Backend"):
        register_backend(object())


def test_no_backend_supports_the_problem(monkeypatch):
    monkeypatch.delenv("JFA_BACKEND", raising=False)
    never = Backend("never", forward=None, backward=None, supports=lambda p: "never", priority=0)
    monkeypatch.setattr("jfa_ops.backends._REGISTRY", {"never": never})
    monkeypatch.setattr("jfa_ops.backends._BUILTIN_MODULES", {})
    with pytest.raises(ValueError, match="no registered backend supports Problem"):
        select_backend(None, Problem("cpu", torch.float32, 16, 2, 2, False, -1, -1, False, False))


def test_auto_devices_limits_automatic_choice(monkeypatch):
    monkeypatch.delenv("JFA_BACKEND", raising=False)
    gpu_only = CountingBackend("gpu_only", priority=2000)
    register_backend(dataclasses.replace(gpu_only.backend, auto_devices=("cuda",)))
    try:
        _run(_inputs())  # CPU call: never picked automatically ...
        assert gpu_only.calls["forward"] == 0
        _run(_inputs(), backend="gpu_only")  # ... but runs when asked by name
        assert gpu_only.calls == {"forward": 1, "backward": 1}
    finally:
        unregister_backend("gpu_only")


def test_builtin_backends_listed_with_reasons():
    assert "reference" in registered_backends()
    assert unavailable_reason("reference") is None
    for name in ("reference", "triton"):
        reason = unavailable_reason(name)
        assert reason is None or name in reason  # importable, or says why (e.g. triton missing)
    assert "reference" in jfa_ops.available_backends("cpu")


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.delenv("JFA_BACKEND", raising=False)
    monkeypatch.setattr("jfa_ops.backends._WARNED", set())


def _cuda_problem(dtype):
    return Problem("cuda", dtype, 64, 2, 2, False, -1, -1, False, False)


def test_reference_on_cuda_warns_once_per_reason(fresh_warnings):
    """fp64 on CUDA runs on the slow, host-syncing reference: say so once, and why."""
    with pytest.warns(UserWarning, match=r"'reference' backend .* CUDA-graph .*float64"):
        assert select_backend(None, _cuda_problem(torch.float64)).name == "reference"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert select_backend(None, _cuda_problem(torch.float64)).name == "reference"  # same reason: silent
        assert select_backend("reference", _cuda_problem(torch.float32)).name == "reference"  # asked by name
        select_backend(None, Problem("cpu", torch.float64, 64, 2, 2, False, -1, -1, False, False))  # CPU: no warning
    with pytest.warns(UserWarning, match="head_dim 12"):  # another reason: warned again
        p = dataclasses.replace(_cuda_problem(torch.float16), head_dim=12)
        assert select_backend(None, p).name == "reference"


def test_reference_on_cuda_warns_when_triton_is_missing(fresh_warnings, monkeypatch):
    monkeypatch.setattr("jfa_ops.backends._REGISTRY", {"reference": reference.BACKEND})
    monkeypatch.setattr("jfa_ops.backends._BUILTIN_MODULES", {"reference": "jfa_ops.backends.reference"})
    monkeypatch.setattr("jfa_ops.backends._IMPORT_ERRORS", {"triton": "ModuleNotFoundError: No module named 'triton'"})
    with pytest.warns(UserWarning, match=r"because triton could not be imported \(ModuleNotFoundError"):
        assert select_backend(None, _cuda_problem(torch.float16)).name == "reference"


def test_triton_is_the_automatic_choice_on_cuda(fresh_warnings):
    pytest.importorskip("triton")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            assert select_backend(None, _cuda_problem(dtype)).name == "triton"


# --- op families: a backend implements some families and not others ---------------------------------------------

def _toy_family_problem(**kw):
    return Problem("cpu", torch.float32, 16, 2, 2, False, -1, -1, False, False, **kw)


@pytest.fixture
def family_backends(monkeypatch):
    """Two toy backends: 'both' implements attention and 'toy_family' (refusing block_q 64), priority 2000;
    'attn_only' implements only attention, priority 3000 (so it is tried first and skipped for the family)."""
    from jfa_ops.backends import FamilyImpl

    monkeypatch.delenv("JFA_BACKEND", raising=False)
    family = FamilyImpl(forward=lambda *a: "family forward",
                        supports=lambda p: "block_q 64 is not implemented" if p.block_q == 64 else None)
    both = Backend("both", forward=None, backward=None, supports=lambda p: None, priority=2000,
                   families={"toy_family": family})
    attn_only = Backend("attn_only", forward=None, backward=None, supports=lambda p: None, priority=3000)
    for b in (both, attn_only):
        register_backend(b)
    yield both, attn_only
    for b in (both, attn_only):
        unregister_backend(b.name)


def test_family_chooses_only_backends_that_implement_it(family_backends):
    both, attn_only = family_backends
    assert select_backend(None, _toy_family_problem()).name == "attn_only"  # attention: the default family
    chosen = select_backend(None, _toy_family_problem(), family="toy_family")
    assert chosen is both and chosen.family("toy_family").forward() == "family forward"
    # the family's own supports declines: fall through to the next backend with the family (none here)
    with pytest.raises(ValueError, match="no registered backend supports Problem.* in the 'toy_family' op family"):
        select_backend(None, _toy_family_problem(block_q=64), family="toy_family")


def test_family_requested_backend_lacking_it_names_it(family_backends, monkeypatch):
    with pytest.raises(ValueError, match=r"backend 'attn_only' does not implement the 'toy_family' op family; "
                                         r"backends that do: \['both'\]"):
        select_backend("attn_only", _toy_family_problem(), family="toy_family")
    monkeypatch.setenv("JFA_BACKEND", "attn_only")  # the env names a backend the same way
    with pytest.raises(ValueError, match="'attn_only' does not implement the 'toy_family'"):
        select_backend(None, _toy_family_problem(), family="toy_family")
    with pytest.raises(ValueError, match="'both' cannot run this call: block_q 64 is not implemented"):
        select_backend("both", _toy_family_problem(block_q=64), family="toy_family")
    assert unavailable_reason("attn_only", _toy_family_problem(), "toy_family") \
        == "it does not implement the 'toy_family' op family"
    assert unavailable_reason("both", _toy_family_problem(), "toy_family") is None


def test_family_without_supports_uses_the_backends(family_backends):
    from jfa_ops.backends import FamilyImpl

    b = Backend("b", forward=None, backward=None, supports=lambda p: "no" if p.head_dim == 8 else None,
                families={"f": FamilyImpl(forward=print)})
    assert b.family_supports("f", _toy_family_problem()) is None
    assert b.family_supports("f", dataclasses.replace(_toy_family_problem(), head_dim=8)) == "no"
    assert b.family("attention").forward is None and b.family("f").backward is None
    with pytest.raises(ValueError, match=r"backend 'b' does not implement the 'g' op family \(it implements: "
                                         r"\['attention', 'f'\]\)"):
        b.family("g")
    hash(b)  # still usable as a key (families is left out of the hash)


def test_tlx_missing_on_sm90_is_logged_once_per_gpu(monkeypatch, caplog):
    """On an sm_90 GPU the automatic choice says once (logger jfa_ops, INFO) why the tlx backend is not used; other
    GPUs and later calls stay quiet."""
    import logging

    import jfa_ops.backends as backends

    capability = {0: (9, 0), 1: (8, 0)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: capability[i])
    monkeypatch.setattr(backends, "_IMPORT_ERRORS", {"tlx": "ImportError: TLX is not installed"})
    monkeypatch.setattr(backends, "_TLX_CHECKED", set())
    problem = Problem("cuda", torch.bfloat16, 128, 2, 2, False, -1, -1, False, False, device_index=0)
    with caplog.at_level(logging.INFO, logger="jfa_ops"):
        backends._log_tlx_unavailable(problem)
        backends._log_tlx_unavailable(problem)
        backends._log_tlx_unavailable(dataclasses.replace(problem, device_index=1))
    messages = [r.getMessage() for r in caplog.records if r.name == "jfa_ops"]
    assert len(messages) == 1 and "cuda:0" in messages[0] and "TLX is not installed" in messages[0]


def test_family_priority_ranks_a_backend_apart_for_that_family(monkeypatch):
    """``FamilyImpl.priority``: a backend that leads the attention family can rank below another for one family
    (the tlx backend's block-sparse forward until its GPU check), and the family's rank decides there only."""
    monkeypatch.delenv("JFA_BACKEND", raising=False)
    impl = FamilyImpl(forward=None, supports=lambda p: None)
    ok = lambda p: None  # noqa: E731
    high = Backend("high", forward=None, backward=None, supports=ok, priority=20, families={
        "fam": dataclasses.replace(impl, priority=5)})
    mid = Backend("mid", forward=None, backward=None, supports=ok, priority=10, families={"fam": impl})
    monkeypatch.setattr("jfa_ops.backends._REGISTRY", {"high": high, "mid": mid})
    monkeypatch.setattr("jfa_ops.backends._BUILTIN_MODULES", {})
    problem = Problem("cpu", torch.float32, 16, 2, 2, False, -1, -1, False, False)
    assert select_backend(None, problem).name == "high"
    assert select_backend(None, problem, family="fam").name == "mid"
    assert select_backend("high", problem, family="fam").name == "high"  # by name it runs regardless
    assert (high.family_priority("fam"), high.family_priority("other"), mid.family_priority("fam")) == (5, 20, 10)


def test_no_backend_function_is_shadowed_by_a_submodule():
    """A backend package's top-level function must not share a name with one of its submodules: importing the
    submodule rebinds the package attribute to the module, and code that looks the function up by name (the tlx
    backend lends the triton backend's MXFP8 quantize so) then calls a module. Found on the H200: the tlx MXFP8 op
    failed with "'module' object is not callable" once ``triton/mxfp8_quantize.py`` had been imported."""
    import ast
    from pathlib import Path

    root = Path(jfa_ops.__file__).parent / "backends"
    for package in sorted(p.parent for p in root.glob("*/__init__.py")):
        functions = {node.name for node in ast.parse((package / "__init__.py").read_text()).body
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        submodules = {p.stem for p in package.glob("*.py")} | {p.parent.name for p in package.glob("*/__init__.py")}
        assert not functions & submodules, f"{package.name}: functions named as submodules: {functions & submodules}"
