"""Compile FlashAttention-4's sm_90a block-sparse kernels for the bench's ``sparse`` peers on a machine without a GPU.

The ``fa4`` / ``fa4 padded`` rows (bench/peers.py) hand FA4 our selection through ``fa4_varlen_block_sparse`` /
``fa4_padded_block_sparse``. This script builds those tensors for the sparse suite's shapes (a synthetic selection:
compiling depends on shapes and dtypes only), then calls FA4's public ``flash_attn_varlen_func`` / ``flash_attn_func``
(and the padded row's backward) on fake CUDA tensors (torch FakeTensorMode): FA4 then runs everything up to the
launch, i.e. its argument checks, normalization and ``cute.compile`` down to an sm_90a cubin, and launches nothing.
A failure prints the exception with FA4's frames (stop 25: "TypeError: 'NoneType' object is not subscriptable" at
flash_attn/cute/block_sparse_utils.py:158 for full lists given as None).

Needs FA4 importable, i.e. Python 3.12 (the CuTe DSL's MLIR libraries are cp312 wheels) with torch and the wheels
of bench/README.md's FA4 carry (``.whlA/part.aa`` + ``.whlB/part.ab`` concatenated are
nvidia_cutlass_dsl_libs_cu13-4.8.1; then ``pip install --no-deps`` them with ``.whlB/*.whl``, plus
``pip install torch einops cuda-bindings``). From the repo root:
``PYTHONPATH=. python3.12 tools/fa4_sparse_compile.py [--size quick|full] [--heads-q 16 --heads-kv 16]``
(~5-10 s per kernel on one core).
"""
import argparse
import contextlib
import dataclasses
import sys
import time
import traceback
import warnings

import torch


@contextlib.contextmanager
def _as_sm90(interface):
    """FA4's two device queries (compute capability, SM count) answer sm_90 (H100/H200) and 132 SMs, and the CuTe
    DSL targets sm_90a (its CUTE_DSL_ARCH, read once when cutlass is imported); all restored after."""
    from cutlass.cutlass_dsl import BaseDSL

    envar = BaseDSL._get_dsl().envar
    saved = interface._get_device_arch, interface.get_num_sms_for_selection, envar._arch
    interface._get_device_arch, interface.get_num_sms_for_selection = (lambda: 90), (lambda *args, **kwargs: 132)
    envar.arch = "sm_90a"
    try:
        yield
    finally:
        interface._get_device_arch, interface.get_num_sms_for_selection, envar.arch = saved


def _synthetic_selection(case):
    """A selection of the case's shapes ([B, Hkv, NQB, NKB] ids, [B, Hkv, NQB] counts): the first count blocks."""
    nqb, nkb = -(-case.max_q // case.block), -(-case.max_kv // case.block)
    count = torch.randint(1, nkb + 1, (case.batch, case.num_heads_kv, nqb), dtype=torch.int32,
                          generator=torch.Generator().manual_seed(0))
    return torch.arange(nkb, dtype=torch.int32).expand(*count.shape, nkb).contiguous(), count


def compile_case(case, padded: bool) -> str:
    """Compile the row's FA4 kernels for this case; '' when they compile, else the error and FA4's frames."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from flash_attn.cute import interface
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    from bench.peers import FlashAttention4, fa4_padded_block_sparse, fa4_varlen_block_sparse

    index, count = _synthetic_selection(case)
    blocks = dict(num_heads_q=case.num_heads_q, block_q=case.block, block_kv=case.block)
    offsets = torch.tensor([0, *case.q_lens]).cumsum(0).to(torch.int32)
    fields = ([fa4_varlen_block_sparse(index, count, offsets, offsets, **blocks)] if not padded
              else list(fa4_padded_block_sparse(index, count, **blocks)))
    d, dtype = case.head_dim, torch.bfloat16
    try:
        # FA4 reads data pointers (fake: torch warns) where it would launch
        with _as_sm90(interface), FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sparse = [BlockSparseTensorsTorch(**{k: torch.empty_like(v, device="cuda") if torch.is_tensor(v) else v
                                                 for k, v in f.items()}) for f in fields]
            if not padded:
                q = torch.empty(case.total_q, case.num_heads_q, d, dtype=dtype, device="cuda")
                k, v = (torch.empty(case.total_kv, case.num_heads_kv, d, dtype=dtype, device="cuda") for _ in "kv")
                cu = torch.empty(case.batch + 1, dtype=torch.int32, device="cuda")
                kw = FlashAttention4._call_kwargs(interface.flash_attn_varlen_func, case, cu_seqlens_q=cu,
                                                  cu_seqlens_k=cu, max_seqlen_q=case.max_q,
                                                  max_seqlen_k=case.max_kv, block_sparse_tensors=sparse[0])
                interface.flash_attn_varlen_func(q, k, v, **kw)
            else:
                q = torch.empty(case.batch, case.max_q, case.num_heads_q, d, dtype=dtype, device="cuda",
                                requires_grad=True)
                k, v = (torch.empty(case.batch, case.max_kv, case.num_heads_kv, d, dtype=dtype, device="cuda",
                                    requires_grad=True) for _ in "kv")
                kw = FlashAttention4._call_kwargs(interface.flash_attn_func, case, block_sparse_tensors=sparse[0],
                                                  block_sparse_tensors_bwd=sparse[1])
                out = interface.flash_attn_func(q, k, v, **kw)[0]
                # FA4's own backward glue (FlashAttnFunc.backward) called directly: the autograd engine wants a
                # CUDA device for CUDA tensors, fake or not
                out.grad_fn.apply(torch.empty_like(out), None)
    except Exception as e:  # noqa: BLE001 (report any failure with where it happened)
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "flash_attn" in f.filename][-6:]
        where = "".join(f"\n    {f.filename.split('site-packages/')[-1]}:{f.lineno} {f.line}" for f in frames)
        return f"{type(e).__name__}: {e}{where}"
    return ""


def main(argv=None) -> int:
    from bench import suites

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="quick", choices=("quick", "full"))
    p.add_argument("--heads-q", type=int, default=None, help="override the suite's query heads (e.g. 4 for GQA)")
    p.add_argument("--heads-kv", type=int, default=None)
    args = p.parse_args(argv)
    failed = 0
    for case in suites.build_cases(["sparse"], [128], args.size):
        case = dataclasses.replace(case, num_heads_q=args.heads_q or case.num_heads_q,
                                   num_heads_kv=args.heads_kv or case.num_heads_kv)
        for padded in (False, True):
            start = time.perf_counter()
            error = compile_case(case, padded)
            failed += bool(error)
            row = "fa4 padded (fwd+bwd)" if padded else "fa4 (varlen fwd)"
            print(f"{case.name} H{case.num_heads_q}:{case.num_heads_kv} {row}: "
                  f"{error or 'compiled for sm_90a'} ({time.perf_counter() - start:.1f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
