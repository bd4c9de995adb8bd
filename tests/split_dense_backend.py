"""A traceable pure-torch CPU backend for the split-path tests (dense masked attention, fixed-shape ops only)."""
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from jfa_ops.backends import Backend
from jfa_ops.backends.base import per_trace

CALLS = {"forward": 0, "backward": 0}  # eager (run-time) calls: the opaque branch ran


def _eager(t):
    return type(t) is torch.Tensor


def _positions(offsets, rows):
    """(sequence, position in it) of each row: derived from the offsets alone, so built once per graph
    (``per_trace``), as the triton backend's tile lists are: the split path hoists it out of its cond."""
    seg = torch.searchsorted(offsets, torch.arange(rows, device=offsets.device, dtype=offsets.dtype), right=True)
    return seg, torch.arange(rows, device=offsets.device) - offsets[seg - 1]


def _probs(q, k, q_offsets, kv_offsets, params):
    tq, tk = q.shape[0], k.shape[0]
    qo = kv_offsets if q_offsets is None else q_offsets
    seg_q, pos_q = per_trace(_positions, qo, tq)
    seg_k, pos_k = per_trace(_positions, kv_offsets, tk)
    mask = seg_q[:, None] == seg_k[None, :]
    if params.causal:
        mask = mask & (pos_k[None, :] <= pos_q[:, None])
    group = q.shape[1] // k.shape[1]
    kr = k.repeat_interleave(group, dim=1).float()
    s = torch.einsum("qhd,khd->hqk", q.float(), kr) * params.scale
    s = s.masked_fill(~mask, float("-inf"))
    return s, mask, group


def forward(q, k, v, q_offsets, kv_offsets, params):
    if _eager(q):
        CALLS["forward"] += 1
    s, mask, group = _probs(q, k, q_offsets, kv_offsets, params)
    lse = torch.logsumexp(s, dim=-1)  # [H, Tq]
    p = torch.exp(s - lse[..., None])
    vr = v.repeat_interleave(group, dim=1).float()
    out = torch.einsum("hqk,khd->qhd", p, vr).to(q.dtype)
    return out.contiguous(), lse.float().contiguous()  # the op's layout (its fake's)


def backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params):
    if _eager(q):
        CALLS["backward"] += 1
    s, mask, group = _probs(q, k, q_offsets, kv_offsets, params)
    p = torch.exp(s - lse[..., None])
    do, o = grad_out.float(), out.float()
    vr = v.repeat_interleave(group, dim=1).float()
    kr = k.repeat_interleave(group, dim=1).float()
    dv = torch.einsum("hqk,qhd->khd", p, do)
    dp = torch.einsum("qhd,khd->hqk", do, vr)
    delta = (do * o).sum(-1).transpose(0, 1)  # [H, Tq]
    ds = p * (dp - delta[..., None])
    if grad_lse is not None:
        ds = ds + p * grad_lse.float()[..., None]
    dq = torch.einsum("hqk,khd->qhd", ds, kr) * params.scale
    dk = torch.einsum("hqk,qhd->khd", ds, q.float()) * params.scale
    tk, hkv, d = k.shape
    dk = dk.reshape(tk, hkv, group, d).sum(2)
    dv = dv.reshape(tk, hkv, group, d).sum(2)
    return dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype).contiguous()


BACKEND = Backend(name="traced_dense", forward=forward, backward=backward, supports=lambda problem: None,
                  auto_devices=(), traceable=True)
