"""The triton backend on every CUDA GPU: launch configs from the device's shared memory, supports() per device,
TMA only on NVIDIA sm_90+, and launches on the tensors' GPU (not the current one).

No GPU here: the device facts are monkeypatched. The shared-memory budgets themselves are checked by compiling for
each architecture (test_arch_compile.py); the two-GPU test runs on a machine with two GPUs.
"""
import contextlib
import types

import pytest
import torch

import jfa_ops
from jfa_ops.backends import Problem, base, select_backend
from jfa_ops.backends.triton import configs
from jfa_ops.testing import AttentionCase, check_attention_case

triton_backend = pytest.importorskip("jfa_ops.backends.triton")

SM86 = configs.SHARED_MEMORY_LIMITS[86]
SM90 = configs.SHARED_MEMORY_LIMITS[90]


@pytest.fixture
def gpu_with(monkeypatch):
    """Pretend to be a CUDA machine whose GPU has ``limit`` bytes of shared memory per block (not interpreting)."""
    def pretend(limit):
        monkeypatch.setattr(configs, "interpreting", lambda: False)
        monkeypatch.setattr(configs, "_shared_memory_limit", lambda index: limit)
        triton_backend._device_reason.cache_clear()
    yield pretend
    triton_backend._device_reason.cache_clear()


def test_config_follows_the_devices_shared_memory(gpu_with):
    """The H200 entries on a 227 KiB GPU; smaller ones (fewer stages / smaller blocks) on a 99 KiB one, e.g. the
    head_dim-256 forward that needs 147,456 B on sm_89 with the H200 entry."""
    gpu_with(SM90)
    big = configs.get_config("fwd", 256, torch.float16, False, torch.device("cuda", 1))
    assert big == configs.table_config("fwd", 256, torch.float16, False, SM90)
    gpu_with(SM86)
    small = configs.get_config("fwd", 256, torch.float16, False, torch.device("cuda", 1))
    assert small == configs.table_config("fwd", 256, torch.float16, False, SM86)
    assert small.block_m * small.block_n < big.block_m * big.block_n


def test_interpreter_config_whatever_the_device(monkeypatch):
    monkeypatch.setattr(configs, "interpreting", lambda: True)
    assert configs.get_config("dkdv", 128, torch.float16, True, torch.device("cpu")) is configs.INTERPRETER_CONFIG


def test_supports_refuses_a_gpu_no_config_fits(gpu_with, monkeypatch):
    """A GPU with 64 KiB per block (e.g. sm_75): triton says why, and the automatic choice takes the reference."""
    monkeypatch.delenv("JFA_BACKEND", raising=False)
    problem = Problem("cuda", torch.float16, 128, 4, 4, True, -1, -1, False, False, device_index=0)
    gpu_with(65536)
    reason = triton_backend.supports(problem)
    assert reason is not None and "65536 bytes of shared memory" in reason and "cuda:0" in reason
    with pytest.warns(UserWarning, match="shared memory"):
        assert select_backend(None, problem).name == "reference"
    gpu_with(SM86)
    assert triton_backend.supports(problem) is None
    assert select_backend(None, problem).name == "triton"


def test_problem_records_the_device_index():
    p = Problem.of(torch.empty(3, 2, 16), torch.empty(3, 2, 16), base.AttentionParams(scale=1.0))
    assert p.device_index is None  # CPU tensors have no index
    assert Problem("cuda", torch.float16, 64, 1, 1, False, -1, -1, False, False).device_index is None


@pytest.mark.parametrize("cuda, hip, capability, expected", [
    ("12.8", None, (9, 0), True),  # H100/H200
    ("12.8", None, (8, 9), False),  # L4/L40S: no TMA
    (None, "6.4.0", (9, 4), False),  # AMD MI300 on ROCm reports 9.4: no TMA
])
def test_tma_only_on_nvidia_sm90(monkeypatch, cuda, hip, capability, expected):
    from jfa_ops.backends.triton import attn_fwd

    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(attn_fwd, "_capability", lambda index: capability)
    fake = types.SimpleNamespace(device=torch.device("cuda", 0))  # only its device is read
    assert attn_fwd._tma_device(fake) is expected


# ------------------------------------------------------------------------------------------------- device guard
def test_device_guard_switches_only_when_the_index_differs(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert isinstance(base.device_guard(torch.device("cuda", 0)), contextlib.nullcontext)
    assert isinstance(base.device_guard(torch.device("cpu")), contextlib.nullcontext)
    guard = base.device_guard(torch.device("cuda", 1))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1


@pytest.fixture
def guard_log(monkeypatch):
    """Replace device_guard in the launch paths by one that records the device it was entered with (the backend's
    own, and base's, which ``base.on_device`` calls for the attention entry points)."""
    log = []

    @contextlib.contextmanager
    def recording(device):
        log.append(device)
        yield

    monkeypatch.setattr(triton_backend, "device_guard", recording)
    monkeypatch.setattr(base, "device_guard", recording)
    return log


def test_triton_entry_points_enter_the_guard(guard_log):
    inputs = AttentionCase((5, 3), (4, 6), dtype=torch.float16).make_inputs(0, requires_grad=True)
    out, lse = inputs.call("triton")
    assert guard_log == [inputs.q.device]
    out.float().sum().backward()
    assert guard_log == [inputs.q.device] * 2


# The device-side offset check needs no guard of its own: the triton backend folds it into a kernel launched inside
# the guard above, and the aten fallback (validation.device_check) runs on the offsets' device whatever is current.


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("validate", ["async", "sync"])
def test_runs_on_the_tensors_gpu_not_the_current_one(monkeypatch, validate):
    """Tensors on cuda:1 while cuda:0 is current: offsets check, forward and backward all run on cuda:1."""
    monkeypatch.setenv("JFA_VALIDATE", validate)
    case = AttentionCase((37, 0, 130), (50, 3, 129), heads_q=4, heads_kv=2, head_dim=64, dtype=torch.float16,
                         device="cuda:1", causal=True)
    with torch.cuda.device(0):
        check_attention_case(case, "triton")
        check_attention_case(case.replace(broadcast_q=True, q_lengths=(20,)), "triton")
        assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    assert jfa_ops.available_backends("cuda")[0] in ("triton", "tlx")  # tlx ranks first once auto-selected
