"""jfa_ops: jagged flash attention as ``torch.library`` ops (namespace ``jfa``)."""
from jfa_ops import ops  # noqa: F401  (registers torch.ops.jfa.*)
from jfa_ops.api import (block_sparse_attention, jagged_attention, mxfp8_attention, mxfp8_dequantize, mxfp8_quantize,
                         select_kv_blocks, sparse_attention)
from jfa_ops.backends import available_backends, register_backend, registered_backends
from jfa_ops.validation import check_pending
from jfa_ops import nn  # noqa: F401  (jfa_ops.nn.JaggedSelfAttention / SeedPooling, as the README uses them)

__all__ = ["jagged_attention", "select_kv_blocks", "block_sparse_attention", "sparse_attention", "mxfp8_quantize",
           "mxfp8_dequantize", "mxfp8_attention", "available_backends", "register_backend", "registered_backends",
           "check_pending"]
__version__ = "0.1.0"
