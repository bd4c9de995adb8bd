"""The backend registry: named implementations of the op families (``jfa::attention``, ...) behind one dispatcher.

Built-in backends are imported lazily (the triton one needs triton; the reference needs nothing). A third party
registers its own in a few lines::

    from jfa_ops.backends import Backend, register_backend
    register_backend(Backend("mine", forward=my_fwd, backward=my_bwd, supports=lambda problem: None, priority=50))

Choice order: the op's ``backend`` argument, else env ``JFA_BACKEND``, else the highest-priority backend whose
``supports(problem)`` returns None (a family may rank its backend apart: ``FamilyImpl.priority``) and whose
``auto_supports(problem)`` rule (``FamilyImpl.auto_supports`` per family; e.g. the tlx backend's size rule) does not
pass it over; ``explain_choice(problem)`` says which and why. An automatic choice of ``reference`` for CUDA tensors
warns once per reason.

A backend may implement some op families and not others (``Backend.families``, keyed by family name; ``attention``
is the backend's own forward/backward/supports). ``select_backend(..., family=...)`` chooses only among backends
that implement that family.
"""
from __future__ import annotations

import importlib
import logging
import os
import warnings
from typing import Dict, List, Optional, Set

from jfa_ops.backends.base import (ATTENTION, AttentionParams, Backend, BlockSelectParams, BlockSparseParams,
                                   FamilyImpl, Problem)

__all__ = ["AttentionParams", "Backend", "BlockSelectParams", "BlockSparseParams", "FamilyImpl", "Problem",
           "register_backend", "unregister_backend", "get_backend",
           "select_backend", "explain_choice", "registered_backends", "available_backends", "unavailable_reason"]

_BUILTIN_MODULES = {"reference": "jfa_ops.backends.reference", "cpu": "jfa_ops.backends.cpu",
                    "triton": "jfa_ops.backends.triton", "tlx": "jfa_ops.backends.tlx"}
_REGISTRY: Dict[str, Backend] = {}
_IMPORT_ERRORS: Dict[str, str] = {}
_WARNED: Set[str] = set()  # reasons already warned about (the reference-on-CUDA fallback)
_TLX_CHECKED: Set[int] = set()  # CUDA devices already told why tlx is not used there
_EXPLAINED: Set[str] = set()  # DEBUG messages already logged (a backend passed over by its automatic rule)
_LOG = logging.getLogger("jfa_ops")
_GENERATION = [0]  # bumped by every (un)registration: callers that memoize a choice key it on this


def registry_generation() -> int:
    """A number that changes whenever the set of registered backends does (memoized choices key on it)."""
    return _GENERATION[0]


def register_backend(backend: Backend, *, replace: bool = False) -> Backend:
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a jfa_ops.backends.Backend, got {type(backend).__name__}")
    if backend.name in _REGISTRY and not replace:
        raise ValueError(f"backend {backend.name!r} is already registered (pass replace=True to override it)")
    _REGISTRY[backend.name] = backend
    _GENERATION[0] += 1
    return backend


def unregister_backend(name: str) -> None:
    _REGISTRY.pop(name, None)
    _GENERATION[0] += 1


def _load_builtins() -> None:
    for name, module in _BUILTIN_MODULES.items():
        if name in _REGISTRY or name in _IMPORT_ERRORS:
            continue
        try:
            register_backend(importlib.import_module(module).BACKEND)
        except (ImportError, AttributeError) as e:  # e.g. no triton: say why once, never alias another backend
            _IMPORT_ERRORS[name] = f"{type(e).__name__}: {e}"


def registered_backends() -> List[str]:
    _load_builtins()
    return sorted(_REGISTRY, key=lambda n: -_REGISTRY[n].priority)


def unavailable_reason(name: str, problem: Optional[Problem] = None, family: str = ATTENTION) -> Optional[str]:
    """None when ``name`` can run ``problem`` of ``family`` (or is importable, without a problem), else why not."""
    _load_builtins()
    if name in _IMPORT_ERRORS:
        return f"backend {name!r} could not be imported ({_IMPORT_ERRORS[name]})"
    if name not in _REGISTRY:
        return f"unknown backend {name!r}; registered: {registered_backends()}"
    return None if problem is None else _REGISTRY[name].family_supports(family, problem)


def available_backends(device_type: Optional[str] = None) -> List[str]:
    """Registered backends that import, optionally only those that run some fp16 problem on ``device_type``."""
    import torch

    names = [n for n in registered_backends() if unavailable_reason(n) is None]
    if device_type is None:
        return names
    probe = Problem(device_type, torch.float16, 64, 1, 1, False, -1, -1, False, False)
    return [n for n in names if _REGISTRY[n].supports(probe) is None]


def get_backend(name: str) -> Backend:
    reason = unavailable_reason(name)
    if reason is not None:
        raise ValueError(f"backend: {reason}")
    return _REGISTRY[name]


def select_backend(requested: Optional[str], problem: Problem, family: str = ATTENTION) -> Backend:
    """The backend to run ``problem`` of op family ``family``: the requested one (argument or $JFA_BACKEND), else
    the best that implements the family and supports the problem. ``backend.family(family)`` gives its functions."""
    requested = requested or os.environ.get("JFA_BACKEND") or None
    if requested is not None:
        backend = get_backend(requested)
        if not backend.implements(family):
            raise ValueError(f"backend {requested!r} does not implement the {family!r} op family; backends that do: "
                             f"{[n for n in registered_backends() if _REGISTRY[n].implements(family)]}")
        reason = backend.family_supports(family, problem)
        if reason is not None:
            raise ValueError(f"backend {requested!r} cannot run this call: {reason}")
        return backend
    if problem.device_type == "cuda":
        _log_tlx_unavailable(problem)
    backend, declined = _automatic_choice(problem, family)
    if backend.name == "reference" and problem.device_type == "cuda":
        _warn_reference_on_cuda("; ".join(declined))
    return backend


def explain_choice(problem: Problem, family: str = ATTENTION) -> str:
    """Which backend the automatic choice takes for ``problem`` of ``family``, and why it passed over the ones
    ranked above it (``"triton (passed over: tlx: a small call ...)"``); raises as ``select_backend`` does when
    none runs it. The same text is logged (logger ``jfa_ops``, DEBUG) the first time a choice passes over a
    backend that runs the call (its ``auto_supports`` rule)."""
    backend, declined = _automatic_choice(problem, family)
    return backend.name + (f" (passed over: {'; '.join(declined)})" if declined else "")


def _automatic_choice(problem: Problem, family: str):
    """(the highest-ranked backend that runs the call and whose ``auto_supports`` rule for the family takes it, the
    reasons of those passed over)."""
    declined = [f"{name} could not be imported ({error})" for name, error in _IMPORT_ERRORS.items()]
    for name in sorted(registered_backends(), key=lambda n: -_REGISTRY[n].family_priority(family)):  # stable
        backend = _REGISTRY[name]
        if not backend.implements(family) or (
                backend.auto_devices is not None and problem.device_type not in backend.auto_devices):
            continue
        reason = backend.family_supports(family, problem)
        rule = backend.auto_supports if family == ATTENTION else backend.families[family].auto_supports
        if reason is None and rule is not None:
            reason = rule(problem)  # it runs the call: does its automatic rule take it?
            if reason is not None:
                _log_passed_over(name, reason, problem, family)
        if reason is None:
            return backend, declined
        declined.append(f"{name}: {reason}")
    raise ValueError(f"no registered backend supports {problem}" +
                     ("" if family == ATTENTION else f" in the {family!r} op family"))


def _log_passed_over(name: str, reason: str, problem: Problem, family: str) -> None:
    """DEBUG, once per distinct message (a bounded set: row counts vary per batch): a backend that runs the call
    was passed over by its automatic rule (e.g. tlx on a small call). Eager calls choose once per signature."""
    if not _LOG.isEnabledFor(logging.DEBUG):
        return
    message = f"jfa_ops: automatic choice passed over {name!r} for {family} on {problem}: {reason}"
    if message in _EXPLAINED:
        return
    if len(_EXPLAINED) >= 256:
        _EXPLAINED.clear()
    _EXPLAINED.add(message)
    _LOG.debug("%s", message)


def _warn_reference_on_cuda(why: str) -> None:
    """Once per reason: the exact reference backend loops over sequences in Python and reads offsets on the host,
    so on CUDA it is slow, syncs, and cannot be captured in a CUDA graph."""
    if why in _WARNED:
        return
    _WARNED.add(why)
    warnings.warn(f"jfa_ops: this CUDA call runs on the 'reference' backend (slow: a Python loop that syncs the host "
                  f"and breaks CUDA-graph capture) because {why or 'no faster backend is registered'}. Pass "
                  f"backend='reference' to choose it explicitly.", stacklevel=2)


def _log_tlx_unavailable(problem: Problem) -> None:
    """Once per GPU: on an sm_90 GPU, say why the tlx backend (written for it) is not installed or does not import."""
    import torch

    if not torch.cuda.is_available():  # a Problem made by hand on a machine without a GPU
        return
    index = problem.device_index if problem.device_index is not None else torch.cuda.current_device()
    if index in _TLX_CHECKED:
        return
    _TLX_CHECKED.add(index)
    if torch.cuda.get_device_capability(index) != (9, 0):
        return
    reason = _IMPORT_ERRORS.get("tlx")
    if reason is None and "tlx" in _REGISTRY:
        reason = _REGISTRY["tlx"].supports(problem)
        if reason is None or not reason.startswith("TLX does not import"):
            return
    if reason is not None:
        _LOG.info("jfa_ops: the tlx backend (warp-specialized sm_90 kernels) is not used on cuda:%d: %s; calls run on "
                  "the next backend", index, reason)
