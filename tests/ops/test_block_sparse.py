"""The block-sparse family (``jfa::select_kv_blocks``, ``jfa::block_sparse_attention`` + backward) on the
reference backend, against the float64 oracles of ``jfa_ops.testing``; opcheck; torch.compile; validation.
The triton kernels' tests are tests/backends/test_block_sparse_triton.py."""
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch._dynamo.testing import CompileCounterWithBackend

import jfa_ops
from jfa_ops.backends import Problem, get_backend
from jfa_ops.testing import (AttentionCase, BlockSparseCase, assert_attention_close, attention_cases,
                             check_block_sparse_case, reference_block_selection)
from tests.common import device_backend_params, dtypes_for, head_dims_for

seeds = st.integers(0, 2**31 - 1)


def sparse_cases(*, block_sizes=(2, 3, 4, 8), dtypes=(torch.float32,), max_total=48, max_len=17, **kw):
    """BlockSparseCase strategy: ``attention_cases`` (jagged with empties and length 1, GQA, causal/window,
    broadcast-Q) plus block sizes, keep_ratio or top_k (or a random selection), always_local."""
    @st.composite
    def cases(draw):
        case = draw(attention_cases(dtypes=dtypes, max_total=max_total, max_len=max_len, head_dims=(8, 16), **kw))
        how = draw(st.sampled_from(["ratio", "top_k", "random"]))
        return BlockSparseCase(
            case, block_q=draw(st.sampled_from(block_sizes)), block_kv=draw(st.sampled_from(block_sizes)),
            keep_ratio={"ratio": draw(st.sampled_from([0.2, 0.3, 0.5, 0.75, 1.0])), "top_k": 0.5,
                        "random": None}[how],
            top_k=draw(st.integers(1, 3)) if how == "top_k" else None, always_local=draw(st.booleans()))
    return cases()


@given(case=sparse_cases(), seed=seeds)
def test_reference_matches_the_oracles(case, seed):
    """Selection == the float64 loop oracle exactly; attention (out, lse, dq, dk, dv) == the float64 oracle with
    the selection's block mask."""
    check_block_sparse_case(case, "reference", seed=seed)


@pytest.mark.parametrize("name,case", [
    ("jagged_empty_len1_gqa", BlockSparseCase(AttentionCase((9, 0, 1, 13), (11, 0, 1, 13), heads_q=4, heads_kv=2),
                                              block_q=4, block_kv=4, keep_ratio=0.5)),
    ("causal_window", BlockSparseCase(AttentionCase((14, 7), (14, 10), causal=True, window=(5, -1)), 4, 3, 0.3)),
    ("broadcast_q", BlockSparseCase(AttentionCase((6,), (9, 0, 17), broadcast_q=True, heads_q=2, heads_kv=1), 2, 4,
                                    top_k=2)),
    ("no_local", BlockSparseCase(AttentionCase((12,), (12,), causal=True), 4, 4, 0.25, always_local=False)),
])
def test_reference_feature_cases(name, case):
    check_block_sparse_case(case, "reference", seed=3)


def test_keep_ratio_rounding_is_exact_in_decimal():
    """0.3 * 10 is 3.0000000000000004 in float64: a plain ceil would keep 4 of 10 visible blocks."""
    case = AttentionCase((10,), (10,))
    inputs = case.make_inputs(0)
    index, count = jfa_ops.select_kv_blocks(inputs.q, inputs.k, inputs.q_offsets, inputs.kv_offsets, 10, 10,
                                            block_q=1, block_kv=1, keep_ratio=0.3)
    assert count.unique().tolist() == [3]


@pytest.mark.parametrize("device,backend", device_backend_params(smoke=True))
@pytest.mark.parametrize("always_local", [False, True])
def test_a_tiny_keep_ratio_keeps_one_block(device, backend, always_local):
    """keep_ratio in (0, 1e-9]: ceil(keep_ratio * n) is 1 for every n >= 1, but the float64 rounding margin made it 0,
    so every Q block kept nothing and its rows attended to no key (out 0), silently."""
    if not get_backend(backend).implements("select_kv_blocks"):
        pytest.skip(f"{backend} has no selection")
    dtype, head_dim = dtypes_for(device, backend)[0], head_dims_for(device, backend)[0]
    x = AttentionCase((40, 17, 0), (40, 33, 5), heads_q=2, heads_kv=1, causal=True, dtype=dtype, head_dim=head_dim,
                      device=device).make_inputs(0)
    index, count = jfa_ops.select_kv_blocks(x.q, x.k, x.q_offsets, x.kv_offsets, 40, 40, block_q=16, block_kv=16,
                                            causal=True, keep_ratio=1e-12, always_local=always_local,
                                            backend=backend)
    want_index, want_count = reference_block_selection(
        x.q.cpu(), x.k.cpu(), x.q_offsets.cpu(), x.kv_offsets.cpu(), block_q=16, block_kv=16, n_q_blocks=3,
        n_kv_blocks=3, keep_ratio=1e-12, causal=True, always_local=always_local)
    assert torch.equal(count.cpu(), want_count) and torch.equal(index.cpu(), want_index)
    # Q blocks 0-2 of sequence 0, 0-1 of sequence 1 (17 rows), none of sequence 2 (no q rows): one block each
    assert count[:, 0].tolist() == [[1, 1, 1], [1, 1, 0], [0, 0, 0]]


@pytest.mark.parametrize("device,backend", device_backend_params(smoke=True))
def test_a_top_k_past_int32_keeps_every_visible_block(device, backend):
    """min(top_k, n) is n: a top_k past int32 failed to convert in the keep table (the triton backend's), or not."""
    if not get_backend(backend).implements("select_kv_blocks"):
        pytest.skip(f"{backend} has no selection")
    x = AttentionCase((40, 17), (40, 33), heads_q=2, heads_kv=1, causal=True, dtype=dtypes_for(device, backend)[0],
                      head_dim=head_dims_for(device, backend)[0], device=device).make_inputs(0)
    select = lambda **kw: jfa_ops.select_kv_blocks(x.q, x.k, x.q_offsets, x.kv_offsets, 40, 40,  # noqa: E731
                                                  block_q=16, block_kv=16, causal=True, backend=backend, **kw)
    for got, want in zip(select(top_k=2**40), select(keep_ratio=1.0)):
        assert torch.equal(got, want)


def test_selection_picks_the_best_scored_blocks_and_breaks_ties_low():
    """A hand-made problem: q = one vector, keys of block j = j * that vector, so scores grow with j; equal keys
    tie toward the lower index."""
    d = 8
    e = torch.zeros(d)
    e[0] = 1.0
    q = e.expand(4, 1, d).clone()
    k = torch.cat([e * s for s in (1.0, 3.0, 2.0, 3.0)]).reshape(4, 1, d)
    off = torch.tensor([0, 4])
    select = lambda **kw: jfa_ops.select_kv_blocks(q, k, off, off, 4, 4, block_q=4, block_kv=1, **kw)  # noqa: E731
    index, count = select(top_k=2, always_local=False)
    assert index.tolist() == [[[[1, 3, -1, -1]]]] and count.tolist() == [[[2]]]
    index, _ = select(top_k=1, always_local=False)
    assert index.tolist() == [[[[1, -1, -1, -1]]]]  # 1 and 3 tie: the lower index
    # always_local: the diagonal key of the Q block's last row (key 3) is kept first, then the best
    index, _ = select(top_k=2, always_local=True, causal=True)
    assert index.tolist() == [[[[1, 3, -1, -1]]]]
    index, _ = select(top_k=1, always_local=True)
    assert index.tolist() == [[[[3, -1, -1, -1]]]]
    q[:2] = -q[:2]  # pooled q is 0 now: every score ties, the lower indices win after the local block
    index, _ = select(top_k=3, always_local=True)
    assert index.tolist() == [[[[0, 1, 3, -1]]]]


def test_keep_ratio_one_equals_jagged_attention():
    """Every visible block kept: the same numbers as jagged_attention (same reference math, fp32 rounding)."""
    case = AttentionCase((13, 0, 1, 29), (17, 0, 1, 29), heads_q=4, heads_kv=2, causal=True, window=(9, -1))
    x = case.make_inputs(1, requires_grad=True)
    out = jfa_ops.sparse_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, 29, 29, keep_ratio=1.0, block_q=4,
                                   block_kv=8, causal=True, window=(9, -1), backend="reference")
    dense = jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, window=(9, -1),
                                     backend="reference")
    torch.testing.assert_close(out, dense, rtol=0, atol=1e-6)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x.q, x.k, x.v), g)
    dense_grads = torch.autograd.grad(dense, (x.q, x.k, x.v), g)
    for a, b in zip(grads, dense_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_sequences_shorter_than_a_block_equal_dense():
    """One Q block and one KV block per sequence: the only visible block is the local one, always kept."""
    case = AttentionCase((5, 1, 0, 7), (6, 2, 3, 7), heads_q=2, heads_kv=1, causal=True)
    x = case.make_inputs(2, requires_grad=True)
    out = jfa_ops.sparse_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, 7, 7, keep_ratio=0.1, block_q=8,
                                   block_kv=8, causal=True)
    ref_out, _ = x.oracle()
    assert_attention_close(out, ref_out, dtype=torch.float32, kind="forward", name="out")


def test_sparse_attention_njt_in_and_out():
    lengths = [5, 0, 11]
    q, k, v = (torch.nested.nested_tensor([torch.randn(n, 2, 8) for n in lengths], layout=torch.jagged)
               for _ in range(3))
    out = jfa_ops.sparse_attention(q, k, v, keep_ratio=0.5, block_q=4, block_kv=4, max_seqlen_q=11,
                                   max_seqlen_kv=11, causal=True)
    assert out.is_nested and torch.equal(out.offsets(), q.offsets())
    dense = jfa_ops.sparse_attention(q.values(), k.values(), v.values(), q.offsets(), k.offsets(), 11, 11,
                                     keep_ratio=0.5, block_q=4, block_kv=4, causal=True)
    assert torch.equal(out.values(), dense)


def _op_inputs(requires_grad=False):
    case = AttentionCase((9, 0, 6), (7, 2, 12), heads_q=4, heads_kv=2, causal=True)
    x = case.make_inputs(0, requires_grad=requires_grad)
    index, count = jfa_ops.select_kv_blocks(x.q.detach(), x.k.detach(), x.q_offsets, x.kv_offsets, 9, 12, block_q=4,
                                            block_kv=4, keep_ratio=0.5, causal=True)
    return x, index, count


def test_opcheck_every_op():
    x, index, count = _op_inputs(requires_grad=True)
    torch.library.opcheck(torch.ops.jfa.select_kv_blocks.default,
                          (x.q.detach(), x.k.detach(), x.q_offsets, x.kv_offsets, 9, 12),
                          dict(block_q=4, block_kv=4, keep_ratio=0.5, causal=True))
    args = (x.q, x.k, x.v, x.q_offsets, x.kv_offsets, index, count, 4, 4)
    torch.library.opcheck(torch.ops.jfa.block_sparse_attention.default, args, dict(causal=True))
    with torch.no_grad():
        out, lse = torch.ops.jfa.block_sparse_attention(*args, causal=True)
    plain = [t.detach() if isinstance(t, torch.Tensor) else t for t in args]
    torch.library.opcheck(torch.ops.jfa.block_sparse_attention_backward.default,
                          (torch.randn_like(out), torch.randn_like(lse), *plain[:3], out, lse, *plain[3:]),
                          dict(causal=True))


def test_selection_is_not_differentiable_and_double_backward_raises():
    x, index, count = _op_inputs(requires_grad=True)
    sel = torch.ops.jfa.select_kv_blocks(x.q, x.k, x.q_offsets, x.kv_offsets, 9, 12, block_q=4, block_kv=4)
    assert not sel[0].requires_grad and not sel[1].requires_grad
    out, _ = torch.ops.jfa.block_sparse_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, index, count, 4, 4)
    (dq,) = torch.autograd.grad(out.sum(), x.q, create_graph=True)
    with pytest.raises(RuntimeError, match="does not support double backward"):
        torch.autograd.grad(dq.sum(), x.q)


def _offsets(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())


@pytest.mark.parametrize("device,backend,block,scatter", [
    pytest.param("cpu", "reference", 4, False, id="cpu-reference"),
    pytest.param("cuda", "triton", 16, False, id="cuda-triton", marks=[
        pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
    pytest.param("cuda", "triton", 16, True, id="cuda-triton-transpose-scatter", marks=[
        pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
])
def test_compile_once_over_varying_jagged_batches(device, backend, block, scatter, monkeypatch):
    """fullgraph, dynamic: both stages and the backward in one graph, no recompile as B, totals and max lengths
    change (first batch's sizes pairwise distinct and >= 2; see tests/test_compile.py). ``scatter``: the triton
    backward's transposed selection by ``KNOBS.sparse_transpose_scatter`` (three launches traced, not one)."""
    if scatter:
        from jfa_ops.backends.triton import configs

        monkeypatch.setattr(configs.KNOBS, "sparse_transpose_scatter", True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()

    def fn(q, k, v, off, max_len):
        out = jfa_ops.sparse_attention(q, k, v, off, off, max_len, max_len, keep_ratio=0.5, block_q=block,
                                       block_kv=block, causal=True, backend=backend)
        return out.float().sum(), out

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=counter)
    g = torch.Generator().manual_seed(0)
    batches = [[11, 0, 7, 3, 8]] + [[int(n) for n in torch.randint(0, 15, (2 + i % 4,), generator=g)] + [3 + i]
                                    for i in range(8)]
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    for i, lengths in enumerate(batches):
        lengths = [n * block // 4 for n in lengths]  # several blocks per sequence whatever the block size
        off = _offsets(lengths).to(device)
        q, k, v = (torch.randn(int(off[-1]), h, 16, generator=g).to(device, dtype).requires_grad_()
                   for h in (4, 2, 2))
        loss, out = compiled(q, k, v, off, max(lengths))
        grads = torch.autograd.grad(loss, (q, k, v))
        ref_loss, ref_out = fn(q, k, v, off, max(lengths))
        assert torch.equal(out, ref_out)
        for a, b in zip(grads, torch.autograd.grad(ref_loss, (q, k, v))):
            torch.testing.assert_close(a, b)  # the same kernels eagerly: deterministic
    assert counter.frame_count == 1, f"compiled {counter.frame_count} times"
    assert sum(torch._dynamo.utils.counters["recompiles"].values()) == 0
    assert not torch._dynamo.utils.counters["graph_break"]


# ------------------------------------------------------------------------------------------------- validation
def test_select_validation_names_the_argument():
    x, index, count = _op_inputs()
    call = lambda *a, **kw: jfa_ops.select_kv_blocks(x.q, x.k, x.q_offsets, x.kv_offsets, *a, **kw)  # noqa: E731
    with pytest.raises(ValueError, match="max_seqlen_q is required"):
        call()
    with pytest.raises(ValueError, match="max_seqlen_kv is required"):
        call(9)
    with pytest.raises(ValueError, match=r"keep_ratio must be in \(0, 1\]"):
        call(9, 12, keep_ratio=0.0)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        call(9, 12, top_k=0)
    with pytest.raises(TypeError, match="block_q must be an int"):
        call(9, 12, block_q=4.0)
    with pytest.raises(ValueError, match="block_kv must be >= 1"):
        call(9, 12, block_kv=0)
    with pytest.raises(ValueError, match=r"^block_kv must be < 2\*\*31 \(the kernels' int32\), got 2147483648"):
        call(9, 12, block_kv=2**31)  # was an allocation of 512 GiB (reference) or the interpreter's int32 error
    with pytest.raises(ValueError, match="max_seqlen for kv_offsets is 5, smaller than the longest sequence 12"):
        call(9, 5)


def test_block_sparse_validation_names_the_argument():
    x, index, count = _op_inputs()
    def call(index=index, count=count, **kw):
        kw = dict(dict(block_q=4, block_kv=4), **kw)
        return jfa_ops.block_sparse_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, index, count, **kw)
    with pytest.raises(TypeError, match="kv_block_index must be int32"):
        call(index=index.long())
    with pytest.raises(TypeError, match=r"^kv_block_index must be a torch.Tensor, got list"):  # not the dispatcher's
        call(index=index.tolist())
    with pytest.raises(ValueError, match=r"kv_block_count must be kv_block_index's \[B, Hkv, NQB\]"):
        call(count=count[:, :, :1])
    with pytest.raises(ValueError, match=r"kv_block_index must be \[B, Hkv, NQB, NKB\]"):
        call(index=index[:, :1], count=count[:, :1])
    with pytest.raises(ValueError, match="kv_block_index has 3 Q blocks per sequence, but the longest q sequence "
                                         "needs 5 of block_q=2"):
        call(block_q=2)
    bad = index.clone()
    bad[2, 0, 0, 0] = 3  # sequence 2 has 12 keys: 3 blocks of 4, ids 0..2
    with pytest.raises(ValueError, match=r"kv_block_index\[2, 0, 0, 0\] = 3 is not a KV block of sequence 2"):
        call(index=bad)
    with pytest.raises(ValueError, match=r"kv_block_count must be in \[0, 3\]"):
        call(count=count + 5)
    swapped = index.clone()
    swapped[2, 0, 1, :2] = swapped[2, 0, 1, :2].flip(0)  # Q block 1 of sequence 2 keeps blocks 0 and 2: now 2, 0
    with pytest.raises(ValueError, match=r"kv_block_index\[2, 0, 1\] must list its used ids in ascending order"):
        call(index=swapped)


def test_family_backend_lacking_it_is_named():
    x, index, count = _op_inputs()
    with pytest.raises(ValueError, match="backend 'cpu' does not implement the 'block_sparse' op family"):
        jfa_ops.block_sparse_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, index, count, block_q=4,
                                       block_kv=4, backend="cpu")


# ---------------------------------------------------------------------------------------------- nn and interop
def test_nn_layer_keep_ratio_option():
    """JaggedSelfAttention(keep_ratio=...) runs sparse_attention: keep_ratio 1.0 equals the dense layer."""
    torch.manual_seed(0)
    dense = jfa_ops.nn.JaggedSelfAttention(32, num_heads=4, num_kv_heads=2, causal=True)
    sparse = jfa_ops.nn.JaggedSelfAttention(32, num_heads=4, num_kv_heads=2, causal=True, keep_ratio=1.0,
                                            block_size=4)
    sparse.load_state_dict(dense.state_dict())
    x, off = torch.randn(19, 32), torch.tensor([0, 7, 7, 19])
    torch.testing.assert_close(sparse(x, off, max_seqlen=12), dense(x, off), rtol=0, atol=1e-6)
    half = jfa_ops.nn.JaggedSelfAttention(32, num_heads=4, num_kv_heads=2, causal=True, keep_ratio=0.25,
                                          block_size=4)
    half.load_state_dict(dense.state_dict())
    assert not torch.allclose(half(x, off, max_seqlen=12), dense(x, off))
    assert "keep_ratio=0.25, block_size=4" in repr(half)
    with pytest.raises(ValueError, match="max_seqlen_q is required"):
        half(x, off)
    with pytest.raises(ValueError, match=r"keep_ratio must be in \(0, 1\]"):
        jfa_ops.nn.JaggedSelfAttention(32, num_heads=4, keep_ratio=1.5)


def test_flex_block_mask_is_a_second_oracle():
    """FlexAttention (eager, on CPU) given the selection as a BlockMask computes the same attention."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from jfa_ops.interop import flex_packed_attention, to_flex_block_mask

    case = AttentionCase((40, 0, 1, 70), (50, 0, 3, 70), heads_q=4, heads_kv=2, causal=True, window=(30, -1))
    x = case.make_inputs(0)
    index, count = jfa_ops.select_kv_blocks(x.q, x.k, x.q_offsets, x.kv_offsets, 70, 70, block_q=16, block_kv=16,
                                            causal=True, window=(30, -1), keep_ratio=0.5)
    mask = to_flex_block_mask(index, count, x.q_offsets, x.kv_offsets, num_heads_q=4, block_q=16, block_kv=16,
                              causal=True, window=(30, -1))
    with warnings.catch_warnings():  # eager FlexAttention says it is unfused: expected on the CPU
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        flex = flex_packed_attention(x.q, x.k, x.v, mask)
    ours = jfa_ops.block_sparse_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, index, count, block_q=16,
                                          block_kv=16, causal=True, window=(30, -1))
    assert_attention_close(flex, ours, dtype=torch.float32, kind="forward", name="flex vs ours")


def _flex_selection():
    q, k = torch.randn(53, 4, 16), torch.randn(35, 2, 16)
    q_offsets, kv_offsets = torch.tensor([0, 20, 20, 53]), torch.tensor([0, 25, 32, 35])
    index, count = jfa_ops.select_kv_blocks(q, k, q_offsets, kv_offsets, 33, 25, block_q=16, block_kv=16,
                                            causal=True, keep_ratio=0.5)
    return dict(kv_block_index=index, kv_block_count=count, q_offsets=q_offsets, kv_offsets=kv_offsets,
                num_heads_q=4, block_q=16, block_kv=16, causal=True)


# A selection the mask cannot describe was dropped silently (Q blocks past the index: no key; ids past a sequence:
# clamped away; bad offsets: rows of another sequence): the block-sparse op's rules, raised by name.
FLEX_CASES = {
    "too_few_q_blocks": (lambda a: a.update(kv_block_index=a["kv_block_index"][:, :, :1],
                                            kv_block_count=a["kv_block_count"][:, :, :1]), ValueError,
                         r"^kv_block_index has 1 Q blocks per sequence, but the longest q sequence needs 3"),
    "id_past_the_sequence": (lambda a: a["kv_block_index"].__setitem__((0, 0, 0, 0), 7), ValueError,
                             r"^kv_block_index\[0, 0, 0, 0\] = 7 is not a KV block of sequence 0"),
    "count_past_the_width": (lambda a: a["kv_block_count"].__setitem__((0, 0, 1), 9), ValueError,
                             r"^kv_block_count must be in \[0, 2\]"),
    "other_batch": (lambda a: a.update(kv_block_index=a["kv_block_index"][:2], kv_block_count=a["kv_block_count"][:2]),
                    ValueError, r"^kv_block_index must be \[B, Hkv, NQB, NKB\] with B, Hkv = \(3, 2\)"),
    "heads_not_a_multiple": (lambda a: a.update(num_heads_q=3), ValueError,
                             r"^num_heads_q \(3\) must be a positive multiple of kv_block_index's kv heads \(2\)"),
    "q_offsets_decreasing": (lambda a: a.update(q_offsets=torch.tensor([0, 30, 20, 53])), ValueError,
                             r"^q_offsets must be non-decreasing"),
    "kv_offsets_other_batch": (lambda a: a.update(kv_offsets=torch.tensor([0, 35])), ValueError,
                               r"^q_offsets and kv_offsets must both be \[B\+1\]"),
    "block_q_zero": (lambda a: a.update(block_q=0), ValueError, r"^block_q must be >= 1"),
    # the mask's own options: a window below -1 made a nonsense mask silently, a bad pair failed to unpack
    "window_below_minus_1": (lambda a: a.update(window=(-2, 0)), ValueError, r"^window entries must be >= 0, or -1"),
    "window_not_a_pair": (lambda a: a.update(window=5), TypeError, r"^window must be a pair of ints"),
    "causal_str": (lambda a: a.update(causal="False"), TypeError, r"^causal must be a bool, got str"),
    "num_heads_q_float": (lambda a: a.update(num_heads_q=4.0), TypeError, r"^num_heads_q must be an int, got float"),
    "offsets_other_device": (lambda a: a.update(kv_offsets=a["kv_offsets"].to("meta")), ValueError,
                             r"^kv_offsets must be on kv_block_index's device cpu, got meta"),
    # FlexAttention cannot mask an empty packed sequence (an IndexError from inside create_block_mask before)
    "no_q_rows": (lambda a: a.update(q_offsets=torch.tensor([0, 0, 0, 0])), ValueError,
                  r"^to_flex_block_mask needs at least one q row and one kv row"),
    "no_kv_rows": (lambda a: a.update(kv_offsets=torch.tensor([0, 0, 0, 0])), ValueError,
                   r"^to_flex_block_mask needs at least one q row and one kv row"),
}


@pytest.mark.parametrize("name", FLEX_CASES)
def test_flex_block_mask_rejects_what_it_cannot_describe(name):
    pytest.importorskip("torch.nn.attention.flex_attention")
    from jfa_ops.interop import to_flex_block_mask

    change, exc, pattern = FLEX_CASES[name]
    args = _flex_selection()
    to_flex_block_mask(**args)  # the selection as made passes
    change(args)
    with pytest.raises(exc, match=pattern):
        to_flex_block_mask(**args)


@pytest.mark.parametrize("device,backend", device_backend_params(smoke=True))
def test_deterministic_gradients_are_bitwise_reproducible(device, backend):
    """``deterministic=True`` (issue 11: ``jagged_attention``'s contract): three runs give bit-equal out, lse and
    gradients (dQ of a query block sums the visits of several key tiles, the order an atomic path would vary); a
    backend that declines it (tlx) refuses the named request with a ValueError naming it."""
    impl = get_backend(backend)
    if not impl.implements("block_sparse"):
        pytest.skip(f"{backend} has no block-sparse family")
    dtype, head_dim = dtypes_for(device, backend)[-1], head_dims_for(device, backend, (16, 64))[0]
    case = BlockSparseCase(AttentionCase((70, 0, 33), (67, 5, 64), heads_q=4, heads_kv=2, causal=True, device=device,
                                         dtype=dtype, head_dim=head_dim), block_q=16, block_kv=16, keep_ratio=0.5)
    inputs = case.case.make_inputs(0, requires_grad=True)
    index, count = case.select(inputs)
    kw = inputs.kwargs

    def call():
        return jfa_ops.block_sparse_attention(
            inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets, index, count, kw["max_seqlen_q"],
            kw["max_seqlen_kv"], block_q=16, block_kv=16, causal=True, return_lse=True, deterministic=True,
            backend=backend)

    problem = Problem(device, dtype, head_dim, 4, 2, True, -1, -1, False, True, block_q=16, block_kv=16)
    if impl.family("block_sparse").supports(problem) is not None:
        with pytest.raises(ValueError, match="deterministic"):
            call()
        return
    runs = []
    for _ in range(3):
        out, lse = call()
        runs.append((out, lse) + torch.autograd.grad((out, lse), (inputs.q, inputs.k, inputs.v),
                                                     (torch.ones_like(out), torch.ones_like(lse))))
    for run in runs[1:]:
        for a, b, name in zip(runs[0], run, ("out", "lse", "dq", "dk", "dv")):
            assert torch.equal(a, b), f"{name} differs between deterministic runs"
