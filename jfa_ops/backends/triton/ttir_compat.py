"""A version-gated fix for torch 2.11's analysis of user Triton kernels under Triton >= 3.7 (the TLX install's 3.8).

What breaks: ``wrap_triton`` (our traced path, ``JFA_COMPILE_PATH=inductor``) asks torch which tensors a kernel
writes (``identify_mutated_tensors``), which lowers the kernel to TTIR (``generate_ttir``). torch <= 2.11 passes every
non-tensor argument as an ``ASTSource`` constant (inlined, no TTIR parameter), and also passes the arguments' value
specializations as ``attrs``, among them ``tt.divisibility`` for an int divisible by 16. Triton <= 3.6's code
generator skipped the attrs of constants; Triton 3.8's (``ASTFunction.deserialize``) applies each argument's attrs at
its running TTIR-parameter cursor, constants included: a constant int divisible by 16 sets its attr on the next
parameter, or, after the last one, raises ``IndexError: Function argument index out of range``. torch catches it,
logs "assuming every input is mutated" and clones every tensor argument, and Inductor then failed our graphs ("Node
getitem_83 was invalid, but is output", H200, 2026-12-02). Our kernels take strides and sizes as plain int
arguments, so every one of them hits it. Upstream: pytorch/pytorch#170049, fixed in torch 2.12 (only constexpr
arguments and None become constants there).

The fix, while torch's ``generate_ttir`` runs: its ``ASTSource`` drops the attrs of constant arguments, which is
what Triton <= 3.6 did with them. The TTIR and the parameter order torch maps names to are those of Triton 3.6
(constants are inlined either way), so torch's analysis reads the same kernel it reads under 3.6. Installed only
where both sides need it (torch < 2.12, Triton without ``ASTFunction``'s constants argument); drop it with torch
2.11.
"""
from __future__ import annotations

import functools
import inspect

import torch
import triton.compiler.compiler as compiler


class ASTSourceWithoutConstantAttrs(compiler.ASTSource):
    """``ASTSource`` that ignores the attrs of constants, as Triton <= 3.6's code generator did."""

    def __init__(self, fn, signature, constexprs=None, attrs=None):
        super().__init__(fn, signature, constexprs, attrs)
        self.attrs = {path: a for path, a in self.attrs.items() if path not in self.constants}


def needed() -> bool:
    """torch's ``generate_ttir`` passes runtime scalars as constants (torch < 2.12) and Triton's code generator
    applies attrs to constants (Triton >= 3.7: ``ASTFunction`` no longer takes the constants)."""
    from triton.compiler.code_generator import ASTFunction

    torch_version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return torch_version < (2, 12) and "constants" not in inspect.signature(ASTFunction.__init__).parameters


def _generate_ttir_without_constant_attrs(generate_ttir):
    @functools.wraps(generate_ttir)
    def wrapper(*args, **kwargs):
        # generate_ttir imports ASTSource from this module when it runs; Triton's own JIT keeps its class
        ast_source, compiler.ASTSource = compiler.ASTSource, ASTSourceWithoutConstantAttrs
        try:
            return generate_ttir(*args, **kwargs)
        finally:
            compiler.ASTSource = ast_source

    return wrapper


@functools.lru_cache(maxsize=None)
def install() -> bool:
    """Wrap torch's ``generate_ttir`` where ``needed()`` (once per process); whether it did."""
    if not needed():
        return False
    from torch._higher_order_ops import triton_kernel_wrap
    from torch._inductor.runtime import triton_compat  # noqa: F401 (binds Triton's ASTSource now, not the swapped one)

    # identify_mutated_tensors calls it by this module global
    triton_kernel_wrap.generate_ttir = _generate_ttir_without_constant_attrs(triton_kernel_wrap.generate_ttir)
    return True
