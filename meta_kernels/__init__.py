"""Shape, dtype and argument rules of every jfa op: pure functions of tensor metadata.

Imported by the fake (meta) registrations and by input validation. No triton, no GPU, no tensor values:
everything here works on FakeTensors and symbolic shapes.
"""
from meta_kernels.attention import (
    SUPPORTED_HEAD_DIMS,
    attention_flops,
    attention_backward_shapes,
    attention_shapes,
    check_attention_args,
    check_attention_backward_args,
    check_options,
    check_window,
    deciding_checks,
    visible_pairs,
)

__all__ = ["SUPPORTED_HEAD_DIMS", "attention_flops", "visible_pairs", "attention_shapes", "attention_backward_shapes",
           "check_attention_args", "check_attention_backward_args", "check_options", "check_window", "deciding_checks"]
