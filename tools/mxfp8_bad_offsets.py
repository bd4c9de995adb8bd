"""Bad offset values through every MXFP8 entry under ``JFA_VALIDATE=deferred`` on the GPU: each call must stay inside
its tensors (the process and CUDA context survive) and ``check_pending`` must report each batch.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 JFA_VALIDATE=deferred PYTHONPATH=. \\
        compute-sanitizer --tool memcheck --error-exitcode 1 python tools/mxfp8_bad_offsets.py [attention backend]

(no caching allocator: memcheck sees each tensor's own allocation, so an access past it is an error, not a write
into a neighbour in the same pool block). The attention backend defaults to ``triton`` (``tlx`` under the TLX
install). ``DEV=cpu TRITON_INTERPRET=1``: the same calls under the interpreter (validation patched to deferred).
"""
import os
import sys

import torch

import jfa_ops

dev = os.environ.get("DEV", "cuda")
backend = sys.argv[1] if len(sys.argv) > 1 else "triton"
if dev == "cpu":  # CPU tensors are always checked eagerly: let them reach the kernels as CUDA ones do
    from jfa_ops import validation
    validation.validation_mode = lambda device: "deferred"
T, H, D = 50, 2, 64
x = [torch.randn(T, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3)]
missed = 0
for offs in ([0, 300, T], [0, T, -200, T], [0, -1000, T], [0, -15, T], [0, 40, 10**6], [5, 20, T], [0, 2**31 - 1, T]):
    o = torch.tensor(offs, dtype=torch.int32, device=dev)
    good = torch.tensor([0] * (len(offs) - 1) + [T], dtype=torch.int32, device=dev)  # the pairs' shapes
    for block in ((32, 1), (32, 32)):
        jfa_ops.mxfp8_quantize(x[0], o, block=block, backend="triton")
        jfa_ops.mxfp8_dequantize(*jfa_ops.mxfp8_quantize(x[0], good, block=block), o, block=block, backend="triton")
    q, k, v = (t.clone().requires_grad_() for t in x)
    jfa_ops.mxfp8_attention(q, k, v, o, o, causal=True, backend=backend).float().sum().backward()
    pairs = [jfa_ops.mxfp8_quantize(x[0]), jfa_ops.mxfp8_quantize(x[1]),
             jfa_ops.mxfp8_quantize(x[2], good, block=(32, 1))]
    jfa_ops.mxfp8_attention(*pairs, o, o, causal=True, backend=backend)
    if dev == "cuda":
        torch.cuda.synchronize()
    try:
        jfa_ops.check_pending()
        print(offs, "NO PENDING ERROR")
        missed += 1
    except ValueError:
        print(offs, "pending ValueError, as expected")
print("done" if not missed else f"{missed} batches not reported")
sys.exit(1 if missed else 0)
