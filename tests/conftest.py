"""Shared pytest setup: Triton interpreter on CPU, the ``gpu`` marker, hypothesis profiles."""
import os

import torch

# Before anything imports triton: without CUDA, the triton backend's tests run under the Triton interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tiny shapes: intra-op threads only add hand-off cost (measured: a 4x6x16 einsum takes 5 ms with 2 threads on a
# busy 2-core box, 0.02 ms with 1), so the suites run single-threaded.
torch.set_num_threads(1)

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from tests import device_record  # noqa: E402

# "ci": few examples, no deadline (first calls compile/warm up). "dev": many more. Pick with HYPOTHESIS_PROFILE.
settings.register_profile("ci", max_examples=40, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=300, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_RECORDER = device_record.Recorder(os.environ["JFA_TEST_RECORD"]) if os.environ.get("JFA_TEST_RECORD") else None
_SHARDING = {}  # what resuming and balancing did, for the terminal summary


def pytest_terminal_summary(terminalreporter):
    """Say what a resumed or balanced shard left out and why (the device script prints these lines per shard)."""
    if "record" in _SHARDING:
        terminalreporter.write_line(f"resume: {_SHARDING['deselected']} of {_SHARDING['selected']} selected tests "
                                    f"deselected as already passed in {_SHARDING['record']}")
    if "balanced_by" in _SHARDING:
        weights = (f"the durations in {_SHARDING['balanced_by']} ({_SHARDING['known']} of this call's tests "
                   "recorded, the rest at their median)" if _SHARDING["balanced_by"] else "count (no record)")
        terminalreporter.write_line(f"shards: test functions' cases balanced by {weights}")


def pytest_runtest_logreport(report):
    """JFA_TEST_LOG_FAILURES=1 (the device script sets it): name each failing test the moment it fails, so a shard
    cut by its time limit (no summary printed) still says which tests failed and why, in one line each.
    JFA_TEST_RECORD=path: one line per finished test appended to that record (tests/device_record.py)."""
    if report.failed and os.environ.get("JFA_TEST_LOG_FAILURES") == "1":
        why = str(getattr(report.longrepr, "reprcrash", None) and report.longrepr.reprcrash.message or "")
        print(f"\nFAILED-NOW {report.nodeid} ({report.when}): {why.splitlines()[0][:200] if why else ''}", flush=True)
    if _RECORDER is not None:
        _RECORDER.add(report)


def _read_record(variable: str, path: str) -> dict:
    try:
        return device_record.read(path)
    except ValueError as error:
        raise pytest.UsageError(f"{variable}: {error}") from None


def _parse_shard(text: str) -> tuple:
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise pytest.UsageError(f"JFA_TEST_SHARD must be i/n with 0 <= i < n, got {text!r}")
    return int(index), int(count)


@pytest.hookimpl(trylast=True)  # after -m/-k deselected theirs: shards split what is left to run
def pytest_collection_modifyitems(config, items):
    # JFA_TEST_RESUME=record: deselect what passed there (an earlier device call's; tests/device_record.py).
    # JFA_TEST_SHARD=i/n: the i-th of n shards (the device script runs n pytest processes side by side: kernel
    # compiles dominate the GPU suites and use one CPU core each). JFA_TEST_SHARD_BY=functions (the default when
    # a record gives durations: JFA_TEST_DURATIONS, else the resumed one) balances test functions' cases by those
    # durations (device_record.balance); modulo (the default without a record) keeps every n-th test from the i-th.
    resume = os.environ.get("JFA_TEST_RESUME")
    resumed = _read_record("JFA_TEST_RESUME", resume) if resume else None
    durations_from = os.environ.get("JFA_TEST_DURATIONS") or resume
    if resume:
        passed = device_record.done(resumed)
        skip_passed = [item for item in items if item.nodeid in passed]
        _SHARDING.update(record=resume, selected=len(items), deselected=len(skip_passed))
        if skip_passed:
            config.hook.pytest_deselected(items=skip_passed)
            items[:] = [item for item in items if item.nodeid not in passed]
    shard = os.environ.get("JFA_TEST_SHARD")
    if shard:
        index, count = _parse_shard(shard)
        by = os.environ.get("JFA_TEST_SHARD_BY") or ("functions" if durations_from else "modulo")
        if by == "functions":
            timed = (_read_record("JFA_TEST_DURATIONS", durations_from) if os.environ.get("JFA_TEST_DURATIONS")
                     else resumed)  # the resumed record, already read (None: no record)
            seconds = device_record.durations(timed) if timed else {}
            shard_of = device_record.balance([item.nodeid for item in items], count, seconds)
            _SHARDING.update(balanced_by=durations_from, known=sum(item.nodeid in seconds for item in items))
        elif by == "modulo":
            shard_of = [n % count for n in range(len(items))]
        else:
            raise pytest.UsageError(f"JFA_TEST_SHARD_BY must be 'functions' or 'modulo', got {by!r}")
        keep = [item for item, of in zip(items, shard_of) if of == index]
        config.hook.pytest_deselected(items=[item for item, of in zip(items, shard_of) if of != index])
        items[:] = keep
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def shard_returns_cached_gpu_memory():
    """Sharded GPU runs (JFA_TEST_SHARD: n pytest processes on one GPU) hand each test's cached blocks back to the
    driver once a process caches more than 2 GiB: the caching allocator otherwise keeps a large test's memory for the
    rest of the process, and on stop 43's 78 GiB H100, 16 and 8 such processes ran each other out of memory (the
    H200's 139 GiB had hidden it). ``empty_cache`` frees only unused cached blocks (~ms; a test's own are in use)."""
    yield
    if os.environ.get("JFA_TEST_SHARD") and torch.cuda.is_available() and torch.cuda.is_initialized():
        if torch.cuda.memory_reserved() > (2 << 30):
            torch.cuda.empty_cache()


def _patchable_state() -> dict:
    """What tests patch for a block and must restore: every module-level function and class of the loaded jfa_ops
    modules, the interpreter builder's methods and the triton backend's knob values (by identity/value)."""
    import sys

    state = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("jfa_ops") and module is not None:
            for attr, value in list(vars(module).items()):
                if callable(value) and not attr.startswith("__"):
                    state[name, attr] = id(value)
    interpreter = sys.modules.get("triton.runtime.interpreter")
    if interpreter is not None:
        for attr, value in vars(interpreter.InterpreterBuilder).items():
            state["InterpreterBuilder", attr] = id(value)
    configs = sys.modules.get("jfa_ops.backends.triton.configs")
    if configs is not None:
        for attr, value in vars(configs.KNOBS).items():
            state["KNOBS", attr] = value
    return state


@pytest.fixture(autouse=True)
def nothing_left_patched():
    """A test must leave no function, interpreter method or knob patched. Why: two patch scopes of one attribute
    that close out of order (the ``monkeypatch`` fixture, set up first by ``tma_at_test_sizes``, and a test's own
    patching context closed before it) restore the inner patch for good, and a later test on the same pytest worker
    then runs patched code: stop 40's landing CI computed bf16 dots as raw bits that way. Declared before every
    other autouse fixture and requesting none, it is torn down after all of them."""
    before = _patchable_state()
    yield
    after = _patchable_state()
    left = sorted(str(key) for key in before.keys() & after.keys() if before[key] != after[key])
    assert not left, f"left patched by this test: {left}"


@pytest.fixture(autouse=True)
def tma_at_test_sizes(monkeypatch):
    """Tests use small batches: let them reach the TMA paths (on sm_90, or where a test emulates it) as large calls
    do; the size rule itself (attn_fwd.TMA_MIN_ROWS) has its own test."""
    try:
        from jfa_ops.backends.triton import attn_fwd
    except ImportError:  # no triton
        return
    monkeypatch.setattr(attn_fwd, "TMA_MIN_ROWS", 0)
