"""torch.library registrations: one op family per file. Importing this package registers the ``jfa`` ops."""
from jfa_ops.ops import attention  # noqa: F401  (registers jfa::attention and jfa::attention_backward)
from jfa_ops.ops import mxfp8  # noqa: F401  (registers jfa::mxfp8_quantize, _dequantize, _attention, ...)
from jfa_ops.ops import block_sparse  # noqa: F401,E402  (registers jfa::select_kv_blocks, jfa::block_sparse_attention*)
