"""The ops' schemas (expecttest) and the fakes' signatures against their ops."""
import inspect

import torch
from expecttest import TestCase

from jfa_ops.ops import attention as attention_ops

OPS = {
    "attention": (attention_ops.attention, attention_ops._attention_fake),
    "attention_backward": (attention_ops.attention_backward, attention_ops._attention_backward_fake),
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
