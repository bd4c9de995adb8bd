"""Does this Triton warp-specialize a flash-attention loop for sm_90? Compiles for Hopper without a GPU.

    python tools/probe_warp_specialize.py

Prints, per (warp_specialize, num_warps): whether the TTGIR has warp-specialized partitions, or the compile error.
A plain TMA matmul loop is the control (Triton's docs: automatic warp specialization "only works on simple matmul
loops"). Triton 3.6 (2026-11-30): the matmul partitions (4 -> 12 warps); the attention loop crashes the Hopper
pass at 4 warps (WSLowerToken.cpp assertion) and is left unpartitioned at 8. Rerun when Triton changes.
The kernels' warp-specialized variants built on this (a forward that hung on the H200, a slower dQ pass) were taken
off the production path; they are kept at the git tag experiment/warp-specialize (bench/NOTES.md, v5).
"""
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget


@triton.jit
def matmul_loop(A, B, C, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(A, [BM, K], [K, 1], [BM, BK])
    b_desc = tl.make_tensor_descriptor(B, [K, BN], [BN, 1], [BK, BN])
    acc = tl.zeros([BM, BN], tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=WS):
        acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, 0]), acc)
    tl.store(C + tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :], acc)


@triton.jit
def attention_loop(Q, K, V, O, T, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, WS: tl.constexpr):
    k_desc = tl.make_tensor_descriptor(K, [T, D], [D, 1], [BN, D])
    v_desc = tl.make_tensor_descriptor(V, [T, D], [D, 1], [BN, D])
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    q = tl.load(Q + rows[:, None] * D + tl.arange(0, D)[None, :])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for n0 in tl.range(0, T, BN, warp_specialize=WS):
        s = tl.dot(q, tl.trans(k_desc.load([n0, 0])))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(tl.bfloat16), v_desc.load([n0, 0]), acc * alpha[:, None])
        m_i = m_new
    tl.store(O + rows[:, None] * D + tl.arange(0, D)[None, :], (acc / l_i[:, None]).to(tl.bfloat16))


def probe(fn, signature, constexprs, ws, warps):
    sig = dict(signature, **{c: "constexpr" for c in constexprs}, WS="constexpr")
    try:
        k = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=dict(constexprs, WS=ws)),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 3})
    except Exception as e:  # the pass asserts or fails: report, go on
        return f"compile error: {str(e).splitlines()[0][:120]}"
    ir = k.asm["ttgir"]
    return f"partitioned={'ttg.warp_specialize' in ir} warps={k.metadata.num_warps}"


if __name__ == "__main__":
    print("triton", triton.__version__)
    cases = [("matmul", matmul_loop, {"A": "*bf16", "B": "*bf16", "C": "*fp32", "K": "i32"},
              dict(BM=128, BN=128, BK=64)),
             ("attention", attention_loop, {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "T": "i32"},
              dict(BM=128, BN=128, D=128))]
    for name, fn, sig, consts in cases:
        for ws in (False, True):
            for warps in (4, 8):
                print(f"{name:9s} warp_specialize={ws!s:5s} num_warps={warps}: {probe(fn, sig, consts, ws, warps)}")
