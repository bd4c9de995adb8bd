"""``jfa_ops.nn``: shapes, gradients, per-sequence float64 oracles, the NJT path and torch.compile."""
import pytest
import torch
import torch.nn.functional as F

from jfa_ops.nn import JaggedSelfAttention, SeedPooling

E = 32
OFFSETS = [0, 3, 3, 10, 11, 17]  # lengths 3, 0, 7, 1, 6: an empty and a single-row sequence


def _batch(offsets=OFFSETS, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(offsets[-1], E, generator=gen, dtype=dtype, requires_grad=True)
    return x, torch.tensor(offsets)


def _self_attention_oracle(layer: JaggedSelfAttention, x, offsets):
    """Per sequence: the same projections, then dense attention with an explicit bottom-right mask."""
    hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    q_all, k_all, v_all = layer.qkv_proj(x).split([hq * d, hkv * d, hkv * d], dim=-1)
    outs = []
    for a, b in zip(offsets.tolist(), offsets.tolist()[1:]):
        n = b - a
        q = q_all[a:b].view(n, hq, d).transpose(0, 1)  # [Hq, n, D]
        k = k_all[a:b].view(n, hkv, d).transpose(0, 1).repeat_interleave(hq // hkv, dim=0)
        v = v_all[a:b].view(n, hkv, d).transpose(0, 1).repeat_interleave(hq // hkv, dim=0)
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        visible = torch.ones(n, n, dtype=torch.bool)
        if layer.causal:
            visible &= j <= i
        if layer.window[0] >= 0:
            visible &= j >= i - layer.window[0]
        if layer.window[1] >= 0:
            visible &= j <= i + layer.window[1]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)  # every row sees itself: no empty row
        outs.append(o.transpose(0, 1).reshape(n, hq * d))
    return layer.out_proj(torch.cat(outs))


def _seed_pooling_oracle(pool: SeedPooling, x, offsets):
    """Per history: softmax(seeds . k^T / sqrt(D)) v, written out; an empty history pools to zeros."""
    hq, hkv, d, ls = pool.num_heads, pool.num_kv_heads, pool.head_dim, pool.num_seeds
    w_k, w_v = pool.kv_proj.weight.chunk(2, dim=0)  # the fused projection: k rows first, then v rows
    outs = []
    for a, b in zip(offsets.tolist(), offsets.tolist()[1:]):
        if b == a:
            outs.append(x.new_zeros(ls, E))
            continue
        k = (x[a:b] @ w_k.T).view(b - a, hkv, d).repeat_interleave(hq // hkv, dim=1)
        v = (x[a:b] @ w_v.T).view(b - a, hkv, d).repeat_interleave(hq // hkv, dim=1)
        scores = torch.einsum("shd,khd->hsk", pool.seeds, k) * d ** -0.5
        pooled = torch.einsum("hsk,khd->shd", scores.softmax(dim=-1), v)
        outs.append(pool.out_proj(pooled.reshape(ls, hq * d)))
    return torch.stack(outs)


def _grads(module, x, out):
    """d(sum(out * w))/d(x, params) for a fixed random w (compared at float64 tolerance)."""
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    return torch.autograd.grad((out * w).sum(), [x, *module.parameters()])


@pytest.mark.parametrize("kwargs", [
    dict(num_heads=4),
    dict(num_heads=4, num_kv_heads=2, causal=True),
    dict(num_heads=4, num_kv_heads=1, window=(2, 0), bias=True),
    dict(num_heads=2, head_dim=8, window=(1, 1)),
], ids=["mha", "gqa-causal", "mqa-window-bias", "head_dim-window"])
def test_self_attention_matches_per_sequence_oracle(kwargs):
    torch.manual_seed(0)
    layer = JaggedSelfAttention(E, **kwargs).double()
    x, offsets = _batch()
    out = layer(x, offsets, max_seqlen=7)
    expected = _self_attention_oracle(layer, x, offsets)
    assert out.shape == (x.shape[0], E) and out.dtype == torch.float64
    torch.testing.assert_close(out, expected)
    for got, want in zip(_grads(layer, x, out), _grads(layer, x, expected)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("num_kv_heads", [None, 2, 1], ids=["mha", "gqa", "mqa"])
def test_seed_pooling_matches_per_sequence_oracle(num_kv_heads):
    torch.manual_seed(0)
    pool = SeedPooling(E, num_heads=4, num_seeds=5, num_kv_heads=num_kv_heads).double()
    x, offsets = _batch()
    out = pool(x, offsets)
    expected = _seed_pooling_oracle(pool, x, offsets)
    assert out.shape == (len(OFFSETS) - 1, 5, E)
    torch.testing.assert_close(out, expected)
    assert torch.equal(out[1], torch.zeros(5, E, dtype=torch.float64))  # the empty history
    for got, want in zip(_grads(pool, x, out), _grads(pool, x, expected)):
        torch.testing.assert_close(got, want)


def test_gradients_reach_every_parameter():
    torch.manual_seed(0)
    layer = JaggedSelfAttention(E, 4, 2, causal=True, bias=True)
    pool = SeedPooling(E, 4, num_seeds=3, num_kv_heads=2)
    x, offsets = _batch(dtype=torch.float32)
    pool(layer(x, offsets), offsets).square().sum().backward()
    for name, p in [*layer.named_parameters(), *pool.named_parameters()]:
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_seed_pooling_edge_batches():
    pool = SeedPooling(E, 4, num_seeds=3)
    assert pool(torch.randn(0, E), torch.zeros(1, dtype=torch.int64)).shape == (0, 3, E)  # B = 0
    out = pool(torch.randn(0, E), torch.zeros(3, dtype=torch.int32))  # B = 2, both empty, int32 offsets
    assert torch.equal(out, torch.zeros(2, 3, E))


def test_self_attention_njt_matches_dense():
    torch.manual_seed(0)
    layer = JaggedSelfAttention(E, 4, 2, causal=True)
    x, offsets = _batch(dtype=torch.float32)
    njt = torch.nested.nested_tensor_from_jagged(x, offsets)
    out = layer(njt)
    assert out.is_nested and out.layout == torch.jagged and out.shape[0] == len(OFFSETS) - 1 and out.shape[2] == E
    assert torch.equal(out.offsets(), offsets)
    torch.testing.assert_close(out.values(), layer(x, offsets))
    out.values().sum().backward()
    assert x.grad is not None and layer.qkv_proj.weight.grad is not None


def test_argument_errors():
    with pytest.raises(ValueError, match="divisible"):
        JaggedSelfAttention(30, 4)
    with pytest.raises(ValueError, match="multiple"):
        SeedPooling(E, 4, num_seeds=2, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_seeds"):
        SeedPooling(E, 4, num_seeds=0)
    layer = JaggedSelfAttention(E, 4)
    with pytest.raises(ValueError, match="offsets is required"):
        layer(torch.randn(4, E))
    njt = torch.nested.nested_tensor_from_jagged(torch.randn(4, E), torch.tensor([0, 1, 4]))
    with pytest.raises(ValueError, match="must be None"):
        layer(njt, torch.tensor([0, 1, 4]))


@pytest.mark.parametrize("layer", [JaggedSelfAttention(E, 4), JaggedSelfAttention(E, 4, keep_ratio=0.5, block_size=4),
                                   SeedPooling(E, 4, num_seeds=2)], ids=["dense", "sparse", "seeds"])
@pytest.mark.parametrize("x, pattern", [
    (torch.randn(1, 4, E), r"^x must be \[T, embed_dim=32\] \(or an NJT \[B, j, embed_dim\]\), got shape \(1, 4, 32\)"),
    (torch.randn(4, E // 2), r"^x must be \[T, embed_dim=32\] .*got shape \(4, 16\)"),
    (torch.randn(4 * E), r"^x must be \[T, embed_dim=32\] .*got shape \(128,\)"),
], ids=["3d", "other_embed_dim", "1d"])
def test_x_shape_is_named(layer, x, pattern):
    """A dense x that is not [T, E] was split by the projections into q/k/v of another shape: an error about q or k
    (or a matmul's), not x."""
    with pytest.raises(ValueError, match=pattern):
        layer(x, torch.tensor([0, 4]), max_seqlen=4)


CONSTRUCTOR_ERRORS = [
    (JaggedSelfAttention, (E, 0), {}, ValueError, r"^num_heads must be >= 1, got 0"),
    (JaggedSelfAttention, (E, 4.0), {}, TypeError, r"^num_heads must be an int, got float"),
    (JaggedSelfAttention, (-32, 4), {}, ValueError, r"^embed_dim must be >= 1, got -32"),
    (JaggedSelfAttention, (E, 4, 0), {}, ValueError, r"^num_kv_heads must be >= 1, got 0"),
    (JaggedSelfAttention, (E, 4), dict(head_dim=12), ValueError, r"^head_dim .* multiple of 8 .* got 12"),
    (JaggedSelfAttention, (48, 4), {}, ValueError, r"^head_dim .* got 12"),  # 48 // 4
    (JaggedSelfAttention, (E, 4), dict(causal="False"), TypeError, r"^causal must be a bool"),
    (JaggedSelfAttention, (E, 4), dict(window=(2.5, 0)), TypeError, r"^window must be a pair of ints"),
    (JaggedSelfAttention, (E, 4), dict(window=(-2, 0)), ValueError, r"^window entries must be >= 0"),
    (JaggedSelfAttention, (E, 4), dict(backend=1), TypeError, r"^backend must be a str or None"),
    (SeedPooling, (E, 4, 2.5), {}, TypeError, r"^num_seeds must be an int, got float"),
    (SeedPooling, (E, True, 2), {}, TypeError, r"^num_heads must be an int, got bool"),
    (SeedPooling, (E, 3, 2), {}, ValueError, r"divisible by num_heads"),
    (SeedPooling, (E, 4, 2), dict(backend=["triton"]), TypeError, r"^backend must be a str or None"),
]


@pytest.mark.parametrize("cls,args,kwargs,exc,pattern", CONSTRUCTOR_ERRORS)
def test_constructor_validates_its_arguments(cls, args, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        cls(*args, **kwargs)


def test_njt_with_holes_is_rejected():
    lengths = torch.tensor([2, 3])
    holes = torch.nested.narrow(torch.randn(2, 4, E), 1, torch.zeros_like(lengths), lengths, layout=torch.jagged)
    for layer in (JaggedSelfAttention(E, 4), SeedPooling(E, 4, num_seeds=2)):
        with pytest.raises(ValueError, match=r"^x is a nested jagged tensor with holes"):
            layer(holes)


def test_seed_pooling_njt_matches_dense():
    torch.manual_seed(0)
    pool = SeedPooling(E, 4, num_seeds=3, num_kv_heads=2)
    x, offsets = _batch(dtype=torch.float32)
    torch.testing.assert_close(pool(torch.nested.nested_tensor_from_jagged(x, offsets)), pool(x, offsets))


def test_seed_pooling_exports_with_a_batch_range_that_includes_1():
    """torch.export with a dynamic B whose range includes 1 (strict mode: non-strict export adds a B != 1 guard for
    any size derived from the offsets' B + 1, see README)."""
    torch.manual_seed(0)
    pool = SeedPooling(E, 4, num_seeds=3)
    x, offsets = _batch(dtype=torch.float32)
    batch, rows = torch.export.Dim("B", min=1, max=4096), torch.export.Dim("T", min=0, max=1 << 20)
    exported = torch.export.export(pool, (x, offsets), dynamic_shapes=({0: rows}, {0: batch + 1}), strict=True)
    for lengths in ([5], [0], [3, 0, 4, 1, 6]):
        x, offsets = _batch([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.float32)
        torch.testing.assert_close(exported.module()(x, offsets), pool(x, offsets))


def _varying_batches():
    """(offsets, max_seqlen): totals, max lengths and empties change every time; never 0/1, never equal sizes."""
    return [([0, 5, 5, 12, 20], 8), ([0, 2, 13, 13, 30], 17), ([0, 0, 9, 11, 14], 9), ([0, 25, 26, 26, 40], 25)]


def test_compiled_modules_match_eager_without_recompiling():
    torch.manual_seed(0)
    layer = JaggedSelfAttention(E, 4, 2, causal=True)
    pool = SeedPooling(E, 4, num_seeds=3, num_kv_heads=2)

    def model(x, offsets, max_seqlen):
        return pool(layer(x, offsets, max_seqlen), offsets, max_seqlen)

    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    counters = torch._dynamo.utils.counters["stats"]
    graphs_before = counters["unique_graphs"]
    for i, (offsets, max_seqlen) in enumerate(_varying_batches()):
        x, offsets = _batch(offsets, dtype=torch.float32, seed=i)
        out = compiled(x, offsets, max_seqlen)
        (grad_x,) = torch.autograd.grad(out.sum(), x)
        expected = model(x, offsets, max_seqlen)
        (expected_grad_x,) = torch.autograd.grad(expected.sum(), x)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(grad_x, expected_grad_x)
    assert counters["unique_graphs"] - graphs_before == 1


def test_compiled_njt_self_attention():
    torch.manual_seed(0)
    layer = JaggedSelfAttention(E, 4)
    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend="aot_eager")
    for i, (offsets, _) in enumerate(_varying_batches()[:2]):
        x, offsets = _batch(offsets, dtype=torch.float32, seed=i)
        njt = torch.nested.nested_tensor_from_jagged(x.detach(), offsets)
        out = compiled(njt)
        assert out.is_nested
        torch.testing.assert_close(out.values(), layer(x.detach(), offsets))
