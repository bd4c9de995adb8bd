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

# "ci": few examples, no deadline (first calls compile/warm up). "dev": many more. Pick with HYPOTHESIS_PROFILE.
settings.register_profile("ci", max_examples=40, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=300, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_runtest_logreport(report):
    """JFA_TEST_LOG_FAILURES=1 (the device script sets it): name each failing test the moment it fails, so a shard
    cut by its time limit (no summary printed) still says which tests failed and why, in one line each."""
    if report.failed and os.environ.get("JFA_TEST_LOG_FAILURES") == "1":
        why = str(getattr(report.longrepr, "reprcrash", None) and report.longrepr.reprcrash.message or "")
        print(f"\nFAILED-NOW {report.nodeid} ({report.when}): {why.splitlines()[0][:200] if why else ''}", flush=True)


def pytest_collection_modifyitems(config, items):
    # JFA_TEST_SHARD=i/n keeps every n-th test from the i-th: the device script runs n pytest processes side by side
    # (kernel compiles dominate the GPU suites and use one CPU core each).
    shard = os.environ.get("JFA_TEST_SHARD")
    if shard:
        index, count = map(int, shard.split("/"))
        keep = [item for n, item in enumerate(items) if n % count == index]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def tma_at_test_sizes(monkeypatch):
    """Tests use small batches: let them reach the TMA paths (on sm_90, or where a test emulates it) as large calls
    do; the size rule itself (attn_fwd.TMA_MIN_ROWS) has its own test."""
    try:
        from jfa_ops.backends.triton import attn_fwd
    except ImportError:  # no triton
        return
    monkeypatch.setattr(attn_fwd, "TMA_MIN_ROWS", 0)
