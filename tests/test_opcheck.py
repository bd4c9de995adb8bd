"""opcheck of both ops on every (device, backend), generated from one table: FEATURE_MATRIX x ops x test utils.

FBGEMM's ``generate_opcheck_tests`` idea: one test per (case, op, util) so a failure names exactly what broke.
Known failures live in ``XFAILS`` with a required reason; they run as strict xfails, so a known failure that starts
passing fails the suite (then delete its entry). gradcheck is separate (tests/test_properties.py).
"""
from typing import Dict, Tuple

import pytest
import torch

from jfa_ops.testing import FEATURE_MATRIX, OPCHECK_UTILS, check_opcheck
from tests.common import device_backends, head_dims_for, is_interpreted

OPS = ("attention", "attention_backward")

# Cases the interpreted (slow) backends run on CPU: one per feature family.
SMOKE_CASES = ("jagged_empty_len1", "gqa", "causal_window", "broadcast_q_causal_gqa", "empty_kv")

# (case, backend or "*", op, util) -> why it fails. Empty today: every generated opcheck passes.
XFAILS: Dict[Tuple[str, str, str, str], str] = {}


def _dtype(device: str, backend: str) -> torch.dtype:
    # fp16 for kernels (their main dtype; the only one the CPU interpreter runs right), fp32 for the reference on CPU.
    return torch.float32 if device == "cpu" and not is_interpreted(device, backend) else torch.float16


def _params(xfails=XFAILS):
    for device, backend, marks in device_backends(smoke=True):
        for case_name in FEATURE_MATRIX:
            if is_interpreted(device, backend) and case_name not in SMOKE_CASES:
                continue
            for op in OPS:
                for util in OPCHECK_UTILS:
                    reason = xfails.get((case_name, backend, op, util)) or xfails.get((case_name, "*", op, util))
                    xfail = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                    yield pytest.param(device, backend, case_name, op, util, marks=marks + xfail,
                                       id=f"{device}-{backend}-{case_name}-{op}-{util}")


@pytest.mark.parametrize("device,backend,case_name,op,util", list(_params()))
def test_opcheck(device, backend, case_name, op, util):
    case = FEATURE_MATRIX[case_name].replace(device=device, dtype=_dtype(device, backend))
    if case.unsupported_reason(backend) is not None:  # a backend with few head dims (tlx) checks the case at one
        case = case.replace(head_dim=head_dims_for(device, backend, (case.head_dim,))[0])
    reason = case.unsupported_reason(backend)
    if reason is not None:
        pytest.skip(f"{backend} does not support {case_name}: {reason}")
    check_opcheck(case, backend, test_utils=(util,), ops=(op,))


def test_xfail_registry_is_well_formed():
    for (case_name, backend, op, util), reason in XFAILS.items():
        key = (case_name, backend, op, util)
        assert isinstance(reason, str) and reason.strip(), f"XFAILS entry {key} needs a reason"
        assert case_name in FEATURE_MATRIX, f"XFAILS names unknown case {case_name!r}"
        assert op in OPS and util in OPCHECK_UTILS, f"XFAILS names unknown op/util {(op, util)}"


def test_matrix_covers_every_feature():
    cases = FEATURE_MATRIX.values()
    assert any(c.broadcast_q for c in cases)
    assert any(c.heads_q != c.heads_kv for c in cases)
    assert any(c.causal for c in cases)
    assert any(c.window != (-1, -1) for c in cases)
    assert any(0 in c.q_lengths and 0 in c.kv_lengths for c in cases)
    assert any(sum(c.kv_lengths) == 0 and sum(c.q_lengths) > 0 for c in cases)
    assert any(1 in c.q_lengths for c in cases)
    assert any(c.q_lengths != c.kv_lengths for c in cases)


def test_xfail_entries_become_strict_xfails():
    """A registry entry turns its test into a strict xfail (an unexpected pass fails the run); others are plain."""
    params = list(_params({("gqa", "*", "attention", "test_faketensor"): "example reason"}))
    marked = {p.id: [m for m in p.marks if m.name == "xfail"] for p in params}
    (mark,) = marked["cpu-reference-gqa-attention-test_faketensor"]
    assert mark.kwargs == {"strict": True, "reason": "example reason"}
    assert sum(bool(m) for m in marked.values()) == sum(1 for p in params if "-gqa-attention-test_faketensor" in p.id)
