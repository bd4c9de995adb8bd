"""``meta_kernels`` shape rules (expecttest), on concrete, meta and symbolic shapes."""
import sympy
import torch
from expecttest import TestCase
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import meta_kernels


def _symbolic(**named_shapes):
    """Fake tensors with symbolic sizes, plus a printer that writes the symbols by their names."""
    mode = FakeTensorMode(shape_env=ShapeEnv())
    tensors, names = {}, {}
    for name, (shape, dims) in named_shapes.items():
        dtype = torch.int64 if "offsets" in name else torch.float32
        t = mode.from_tensor(torch.empty(shape, dtype=dtype))
        tensors[name] = t
        for size, dim_name in zip(t.shape, dims):
            if isinstance(size, torch.SymInt):
                names[size.node.expr] = sympy.Symbol(dim_name)

    def show(shapes):
        return str(tuple(tuple(str(s.node.expr.xreplace(names)) if isinstance(s, torch.SymInt) else str(s)
                               for s in shape) for shape in shapes)).replace("'", "")

    return tensors, show


class TestShapeRules(TestCase):
    def test_supported_head_dims(self):
        self.assertExpectedInline(str(meta_kernels.SUPPORTED_HEAD_DIMS), """(8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160, 168, 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256)""")

    def test_concrete_shapes(self):
        q, k = torch.empty(7, 4, 16, device="meta"), torch.empty(9, 2, 16, device="meta")
        kv_offsets = torch.empty(3, dtype=torch.int64, device="meta")
        self.assertExpectedInline(str(meta_kernels.attention_shapes(q, kv_offsets, False)), """((7, 4, 16), (4, 7))""")
        self.assertExpectedInline(str(meta_kernels.attention_shapes(q[:5], kv_offsets, True)), """((10, 4, 16), (4, 10))""")
        self.assertExpectedInline(str(meta_kernels.attention_backward_shapes(q, k, k)), """((7, 4, 16), (9, 2, 16), (9, 2, 16))""")

    def test_symbolic_shapes(self):
        t, show = _symbolic(q=((7, 4, 24), ("T_q", "Hq", "D")), k=((9, 2, 24), ("T_kv", "Hkv", "D")),
                            kv_offsets=((3,), ("B_plus_1",)))
        self.assertExpectedInline(show(meta_kernels.attention_shapes(t["q"], t["kv_offsets"], False)), """((T_q, Hq, D), (Hq, T_q))""")
        self.assertExpectedInline(show(meta_kernels.attention_shapes(t["q"], t["kv_offsets"], True)), """((T_q*(B_plus_1 - 1), Hq, D), (Hq, T_q*(B_plus_1 - 1)))""")
        self.assertExpectedInline(show(meta_kernels.attention_backward_shapes(t["q"], t["k"], t["k"])), """((T_q, Hq, D), (T_kv, Hkv, D), (T_kv, Hkv, D))""")

    def test_checks_run_on_meta_tensors(self):
        q, k = torch.empty(5, 4, 16, device="meta"), torch.empty(9, 2, 16, device="meta")
        offsets = torch.empty(3, dtype=torch.int32, device="meta")
        meta_kernels.check_attention_args(q, k, k, offsets, offsets, (-1, -1), False)
        meta_kernels.check_attention_args(q, k, k, None, offsets, (3, 0), True)
        with self.assertRaisesRegex(ValueError, "head_dim must be a multiple of 8"):
            meta_kernels.check_attention_args(q[..., :4], k[..., :4], k[..., :4], offsets, offsets, (-1, -1), False)

    def test_fake_outputs(self):
        """The op's fake under FakeTensorMode: shapes from meta_kernels, out in q's dtype, lse float32."""
        with FakeTensorMode():
            q, k = torch.empty(5, 4, 16, dtype=torch.bfloat16), torch.empty(9, 2, 16, dtype=torch.bfloat16)
            offsets = torch.zeros(4, dtype=torch.int32)
            out, lse = torch.ops.jfa.attention(q, k, k, None, offsets, broadcast_q=True)
            grads = torch.ops.jfa.attention_backward(out, lse, q, k, k, out, lse, None, offsets, broadcast_q=True)
        shown = "\n".join(f"{n}: {tuple(t.shape)} {t.dtype}" for n, t in zip(("out", "lse", "dq", "dk", "dv"),
                                                                              (out, lse, *grads)))
        self.assertExpectedInline(shown, """\
out: (15, 4, 16) torch.bfloat16
lse: (4, 15) torch.float32
dq: (5, 4, 16) torch.bfloat16
dk: (9, 2, 16) torch.bfloat16
dv: (9, 2, 16) torch.bfloat16""")
