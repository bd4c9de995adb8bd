"""The ops' schemas (expecttest) and the fakes' signatures against their ops."""
import inspect

import torch
from expecttest import TestCase

from jfa_ops.ops import attention as attention_ops
from jfa_ops.ops import mxfp8 as mxfp8_ops

OPS = {
    "attention": (attention_ops.attention, attention_ops._attention_fake),
    "attention_backward": (attention_ops.attention_backward, attention_ops._attention_backward_fake),
    "mxfp8_quantize": (mxfp8_ops.mxfp8_quantize, mxfp8_ops._quantize_fake),
    "mxfp8_dequantize": (mxfp8_ops.mxfp8_dequantize, mxfp8_ops._dequantize_fake),
    "mxfp8_attention": (mxfp8_ops.mxfp8_attention, mxfp8_ops._mxfp8_attention_fake),
    "mxfp8_attention_backward": (mxfp8_ops.mxfp8_attention_backward, mxfp8_ops._mxfp8_attention_backward_fake),
    "mxfp8_attention_quantized": (mxfp8_ops.mxfp8_attention_quantized,
                                  mxfp8_ops._mxfp8_attention_quantized_fake),
}


def _one_per_line(schema) -> str:
    head, returns = str(schema).rsplit(") -> ", 1)
    name, args = head.split("(", 1)
    return name + "(\n    " + args.replace(", ", ",\n    ") + "\n) -> " + returns


class TestSchema(TestCase):
    def test_attention_schema(self):
        self.assertExpectedInline(_one_per_line(torch.ops.jfa.attention.default._schema), """\
jfa::attention(
    Tensor q,
    Tensor k,
    Tensor v,
    Tensor? q_offsets,
    Tensor kv_offsets,
    SymInt max_seqlen_q=-1,
    SymInt max_seqlen_kv=-1,
    float? scale=None,
    bool causal=False,
    SymInt window_left=-1,
    SymInt window_right=-1,
    bool broadcast_q=False,
    bool deterministic=False,
    str? backend=None
) -> (Tensor, Tensor)""")

    def test_attention_backward_schema(self):
        self.assertExpectedInline(_one_per_line(torch.ops.jfa.attention_backward.default._schema), """\
jfa::attention_backward(
    Tensor grad_out,
    Tensor? grad_lse,
    Tensor q,
    Tensor k,
    Tensor v,
    Tensor out,
    Tensor lse,
    Tensor? q_offsets,
    Tensor kv_offsets,
    SymInt max_seqlen_q=-1,
    SymInt max_seqlen_kv=-1,
    float? scale=None,
    bool causal=False,
    SymInt window_left=-1,
    SymInt window_right=-1,
    bool broadcast_q=False,
    bool deterministic=False,
    str? backend=None
) -> (Tensor, Tensor, Tensor)""")

    def test_mxfp8_schemas(self):
        self.assertExpectedInline("\n".join(str(getattr(torch.ops.jfa, name).default._schema) for name in (
            "mxfp8_quantize", "mxfp8_dequantize")), """\
jfa::mxfp8_quantize(Tensor x, Tensor? offsets=None, int[] block=[1, 32], str rounding="rceil", str? backend=None) -> (Tensor, Tensor)
jfa::mxfp8_dequantize(Tensor data, Tensor scale, Tensor? offsets=None, int[] block=[1, 32], ScalarType? dtype=None, str? backend=None) -> Tensor""")

    def test_mxfp8_attention_options_extend_attention(self):
        """mxfp8_attention (and its backward) take jfa::attention's options, then rounding; the pre-quantized op
        takes them, then out_dtype."""
        options = [(a.name, str(a.type), a.default_value) for a in
                   torch.ops.jfa.attention.default._schema.arguments[attention_ops._NUM_TENSOR_INPUTS:]]
        for name, extra in (("mxfp8_attention", "rounding"), ("mxfp8_attention_backward", "rounding"),
                            ("mxfp8_attention_quantized", "out_dtype")):
            args = getattr(torch.ops.jfa, name).default._schema.arguments
            got = [(a.name, str(a.type), a.default_value) for a in args[len(args) - len(options) - 1:-1]]
            self.assertEqual(got, options, name)
            self.assertEqual(args[-1].name, extra)

    def test_ops_are_functional(self):
        for name in OPS:
            schema = getattr(torch.ops.jfa, name).default._schema
            self.assertFalse(schema.is_mutable, f"jfa::{name} must not mutate its inputs")
            self.assertEqual([a.alias_info for a in schema.returns], [None] * len(schema.returns))

    def test_options_are_shared(self):
        """Both ops take the same options after their tensors (the autograd glue forwards them verbatim)."""
        fwd = torch.ops.jfa.attention.default._schema.arguments
        bwd = torch.ops.jfa.attention_backward.default._schema.arguments
        options = [(a.name, str(a.type), a.default_value) for a in fwd[attention_ops._NUM_TENSOR_INPUTS:]]
        self.assertEqual(options, [(a.name, str(a.type), a.default_value) for a in bwd[len(bwd) - len(options):]])
        self.assertEqual([a.name for a in bwd[:len(bwd) - len(options)]],
                         ["grad_out", "grad_lse", "q", "k", "v", "out", "lse", "q_offsets", "kv_offsets"])


def _params(fn):
    return list(inspect.signature(fn).parameters.values())


def test_fake_signatures_match_ops():
    """Each fake takes its op's parameters: the same names, kinds and defaults, or the same leading names then
    ``*args`` (the options, whose names live in the schema alone: they cannot drift)."""
    for name, (op, fake) in OPS.items():
        op_params, fake_params = _params(op._init_fn), _params(fake)
        var = [p for p in fake_params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        named = [p for p in fake_params if p not in var]
        if var:
            assert [p.kind for p in var] in ([inspect.Parameter.VAR_POSITIONAL],
                                             [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]), name
            op_params = op_params[:len(named)]
        assert [(p.name, p.default) for p in named] == [(p.name, p.default) for p in op_params], (
            f"fake of jfa::{name} takes {[p.name for p in named]}, the op {[p.name for p in op_params]}")
