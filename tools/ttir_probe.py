"""Does torch's analysis of user Triton kernels (what ``JFA_COMPILE_PATH=inductor`` needs) work with the installed
triton? `PYTHONPATH=[/tmp/t38:]$PWD python3 tools/ttir_probe.py` (CPU only: an sm_90 target is set by hand).

``wrap_triton`` lowers each traced kernel to TTIR to find the tensors it writes
(``torch._higher_order_ops.triton_kernel_wrap.generate_ttir``); torch 2.11 (pinned to triton 3.6) under triton 3.8
failed there on every one of our kernels ("Function argument index out of range", bench/NOTES.md), so compiled
graphs keep the op opaque (``ops.attention.triton_pin_mismatch``). This prints, for a plain pointer kernel and one
taking a host TensorDescriptor (TMA: torch counts the arguments a descriptor expands to), ``ok`` with the TTIR's
argument names, or the error and where it was raised: where a torch/triton pair breaks, without a GPU. With
``backends.triton.ttir_compat`` installed (what the traced path does; ``--plain``: without it), torch 2.11 under
triton 3.8 passes (bench/NOTES.md "Traced path under Triton 3.8").
"""
from __future__ import annotations

try:  # under Triton 3.8 + TLX (/tmp/t38 first on PYTHONPATH): the TLX plugin registers before triton is imported
    import _utlx_autoregister  # noqa: F401
except ImportError:
    pass
import sys
import traceback

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from jfa_ops.backends.triton import ttir_compat


class _H100Driver:  # only the compile target is asked for
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


@triton.jit
def _copy_kernel(X, Y, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < N), mask=i < N)


@triton.jit
def _desc_kernel(X_desc, Y, N, BLOCK: tl.constexpr):
    x = X_desc.load([tl.program_id(0) * BLOCK, 0])
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i[:, None] * 16 + tl.arange(0, 16)[None, :], x)


def main():
    from torch._higher_order_ops import triton_kernel_wrap as wrap

    triton.runtime.driver.set_active(_H100Driver())
    compat = "" if "--plain" in sys.argv else f", ttir_compat installed: {ttir_compat.install()}"
    print(f"torch {torch.__version__}, triton {triton.__version__}{compat}")
    x, y = torch.empty(256, 16), torch.empty(256, 16)
    cases = [("pointer kernel", _copy_kernel, {"X": x, "Y": y, "N": 4096, "BLOCK": 64}, {})]
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
        # as in a traced graph: the descriptor's base tensor, and its block shape in the metadata
        cases.append(("TensorDescriptor kernel", _desc_kernel, {"X_desc": x, "Y": y, "N": 4096, "BLOCK": 64},
                      {"X_desc": ("stable", ([64, 16],))}))
    except Exception as e:  # noqa: BLE001 (an older triton: no host descriptors)
        print(f"no TensorDescriptor case: {type(e).__name__}: {e}")
    for name, kernel, kwargs, tma in cases:
        try:
            try:
                ttir, names = wrap.generate_ttir(kernel, kwargs, tma)
            except TypeError:  # a torch without the descriptor-metadata argument
                ttir, names = wrap.generate_ttir(kernel, kwargs)
            print(f"ok     {name}: TTIR verified, arguments {names}")
        except Exception as e:  # noqa: BLE001 (report where it broke)
            frames = traceback.extract_tb(e.__traceback__)[-3:]
            where = "; ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in frames)
            print(f"FAILED {name}: {type(e).__name__}: {str(e)[:300]} (at {where})")


if __name__ == "__main__":
    main()
