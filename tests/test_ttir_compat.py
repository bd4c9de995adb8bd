"""``backends.triton.ttir_compat``: torch 2.11's kernel analysis under Triton >= 3.7 (the TLX install's 3.8).

torch 2.11 itself is not on CI (torch 2.13 there passes only constexprs as constants); what runs here is Triton's
half: the ``ASTSource`` torch 2.11 builds for a kernel whose last runtime argument is an int divisible by 16 (as our
attention kernels' head and row strides are) fails Triton's code generator ("Function argument index out of range")
where Triton applies attrs to constants, and compiles with the attrs of constants dropped. torch 2.11's whole path:
tools/inductor_compile_cpu.py (bench/NOTES.md "Traced path under Triton 3.8").
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from jfa_ops.backends.triton import ttir_compat  # noqa: E402


@triton.jit
def scalar_after_pointers_kernel(X, Y, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < N), mask=i < N)


# JIT kernels (not the interpreter's) and an sm_90 target without a GPU: in a subprocess without TRITON_INTERPRET
_COMPILE = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from jfa_ops.backends.triton.ttir_compat import ASTSourceWithoutConstantAttrs
from tests.test_ttir_compat import scalar_after_pointers_kernel

# what torch 2.11's generate_ttir passes for N=4096: every non-tensor a constant, and N's divisibility as an attr
source = dict(signature={"X": "*fp32", "Y": "*fp32", "N": "i32", "BLOCK": "constexpr"},
              constexprs={"N": 4096, "BLOCK": 64},
              attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]})
out = {}
for name, cls in (("plain", triton.compiler.ASTSource), ("compat", ASTSourceWithoutConstantAttrs)):
    try:
        triton.compile(cls(fn=scalar_after_pointers_kernel, **source), target=GPUTarget("cuda", 90, 32))
        out[name] = "ok"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"[-300:]
print(json.dumps(out))
"""


def _triton_applies_constant_attrs() -> bool:
    import inspect

    from triton.compiler.code_generator import ASTFunction

    return "constants" not in inspect.signature(ASTFunction.__init__).parameters


def test_constants_attrs_break_triton_and_the_compat_source_compiles():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _COMPILE], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["compat"] == "ok", out
    if _triton_applies_constant_attrs():  # the break the compat source is for (Triton 3.8, 3.9)
        assert "Function argument index out of range" in out["plain"], out
    else:  # Triton <= 3.6 skipped the attrs of constants itself
        assert out["plain"] == "ok", out


@pytest.mark.parametrize("torch_version", ["2.11.0+cu130", "2.12.0", "2.13.0+cpu"])
def test_installed_only_for_torch_before_2_12_under_such_a_triton(monkeypatch, torch_version):
    """The wrapper swaps in the compat source only while torch's generate_ttir runs (Triton's own JIT keeps the
    plain one), and only where ``needed``."""
    import triton.compiler.compiler as compiler
    from torch._higher_order_ops import triton_kernel_wrap

    plain = compiler.ASTSource
    seen = []
    monkeypatch.setattr(torch, "__version__", torch_version)
    monkeypatch.setattr(triton_kernel_wrap, "generate_ttir", lambda *args: seen.append(compiler.ASTSource) or args)
    expected = torch_version.startswith("2.11") and _triton_applies_constant_attrs()
    assert ttir_compat.needed() == expected
    assert ttir_compat.install.__wrapped__() == expected  # not the cached process-wide answer
    assert triton_kernel_wrap.generate_ttir("kernel") == ("kernel",)
    assert seen == [ttir_compat.ASTSourceWithoutConstantAttrs if expected else plain]
    assert compiler.ASTSource is plain
