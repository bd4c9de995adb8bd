"""torch.utils.flop_counter counts jfa ops exactly: 4*D per visible pair per q head forward, 2.5x backward."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import jfa_ops
from jfa_ops.testing import visible_mask


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (2, 1)), (True, (1, -1))])
def test_flop_counter_counts_visible_pairs(causal, window):
    q_lens, kv_lens, heads_q, head_dim = [3, 0, 4, 6], [5, 2, 4, 3], 4, 16
    q = torch.randn(sum(q_lens), heads_q, head_dim, requires_grad=True)
    k = torch.randn(sum(kv_lens), 2, head_dim, requires_grad=True)
    v = torch.randn(sum(kv_lens), 2, head_dim, requires_grad=True)
    q_off = torch.tensor([0] + q_lens).cumsum(0)
    kv_off = torch.tensor([0] + kv_lens).cumsum(0)
    with FlopCounterMode(display=False) as counter:
        jfa_ops.jagged_attention(q, k, v, q_off, kv_off, causal=causal, window=window).sum().backward()
    # Brute force: count the visible (query, key) pairs of the oracle's explicit mask, not the closed form under test.
    pairs = sum(int(visible_mask(lq, lk, causal, window).sum()) for lq, lk in zip(q_lens, kv_lens))
    forward = 4 * head_dim * heads_q * pairs
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert counts == {"jfa.attention": forward, "jfa.attention_backward": int(2.5 * forward)}


def test_flop_counter_counts_mxfp8_attention_like_attention():
    q_lens, kv_lens = [3, 0, 40], [5, 2, 33]
    q = torch.randn(sum(q_lens), 4, 32, requires_grad=True)
    k = torch.randn(sum(kv_lens), 2, 32, requires_grad=True)
    v = torch.randn(sum(kv_lens), 2, 32, requires_grad=True)
    q_off, kv_off = torch.tensor([0] + q_lens).cumsum(0), torch.tensor([0] + kv_lens).cumsum(0)
    with FlopCounterMode(display=False) as counter:
        jfa_ops.mxfp8_attention(q, k, v, q_off, kv_off, causal=True, rounding="floor").sum().backward()
    pairs = sum(int(visible_mask(lq, lk, True).sum()) for lq, lk in zip(q_lens, kv_lens))
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert counts == {"jfa.mxfp8_attention": 4 * 32 * 4 * pairs, "jfa.mxfp8_attention_backward": 10 * 32 * 4 * pairs}
