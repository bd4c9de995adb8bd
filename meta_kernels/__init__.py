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
from meta_kernels.block_sparse import (
    INDEX_DTYPE,
    block_visible,
    check_block_index,
    check_block_sizes,
    check_select_args,
    check_select_options,
    keep_count,
    local_block,
    num_blocks,
    select_shapes,
)

__all__ = ["INDEX_DTYPE", "block_visible", "check_block_index", "check_block_sizes", "check_select_args",
           "check_select_options",
           "keep_count", "local_block", "num_blocks", "select_shapes",
           "SUPPORTED_HEAD_DIMS", "attention_flops", "visible_pairs", "attention_shapes", "attention_backward_shapes",
           "check_attention_args", "check_attention_backward_args", "check_options", "check_window", "deciding_checks"]
