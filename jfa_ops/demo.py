"""Train a small compiled seed-pooling model on synthetic jagged histories: ``python -m jfa_ops.demo``.

The task: each history is a sequence of token ids (lengths lognormal, some empty); the label says whether the
marker token 0 occurs in it. The model embeds the tokens, runs one ``JaggedSelfAttention`` layer, pools every
history into ``Ls`` vectors with ``SeedPooling`` (the broadcast-Q use of ``jfa.attention``) and classifies them.

Every batch has a different total length ``T`` and a different longest history, yet the model is compiled once:
``torch.compile(model, fullgraph=True, dynamic=True)`` sees ``T``, ``B+1`` and ``max_seqlen`` as symbols. Two
dynamo habits would break that, and the batches avoid both:

- sizes 0 and 1 are specialized (a batch with ``T`` in {0, 1} would compile again): ``T >= 2``;
- "duck sizing" gives sizes that are equal at the first compile one symbol, and a later batch where they differ
  compiles again (``T == B+1`` does that): ``T`` and ``B+1`` are kept different. The Python-int ``max_seqlen`` is
  kept >= 2 and different from both too, a cheap precaution.

Prints the loss (first vs last average), steps/s and how many times dynamo compiled (recompiles = compiles - 1).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor, nn

try:
    from tqdm import tqdm
except ImportError:  # tqdm comes with the `demo` extra; without it the loss goes to stderr every 10 steps instead
    tqdm = None

from jfa_ops.nn import JaggedSelfAttention, SeedPooling

MARKER = 0  # the token whose presence is the label


class SeedPoolingClassifier(nn.Module):
    """tokens [T] int64, offsets [B+1] -> logits [B]: embed, self-attend, pool into Ls seeds, classify."""

    def __init__(self, vocab: int, embed_dim: int = 32, num_heads: int = 4, num_seeds: int = 8,
                 backend: Optional[str] = None):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed_dim)
        self.norm = nn.LayerNorm(embed_dim)
        self.encoder = JaggedSelfAttention(embed_dim, num_heads, num_kv_heads=num_heads // 2, backend=backend)
        self.pool = SeedPooling(embed_dim, num_heads, num_seeds, num_kv_heads=num_heads // 2, backend=backend)
        self.head = nn.Linear(num_seeds * embed_dim, 1)

    def forward(self, tokens: Tensor, offsets: Tensor, max_seqlen: Optional[int] = None) -> Tensor:
        h = self.embed(tokens)
        h = h + self.encoder(self.norm(h), offsets, max_seqlen)
        pooled = self.pool(h, offsets, max_seqlen)  # [B, Ls, E]; zeros for an empty history
        return self.head(pooled.flatten(1)).squeeze(-1)


def make_batch(gen: torch.Generator, batch: int, vocab: int, max_len: int, median_len: float = 12.0):
    """One synthetic batch: (tokens [T], offsets [B+1], max_seqlen int, labels [B] float).

    Lengths are lognormal (skewed: many short histories, a few long ones), about 10% are empty, capped at
    ``max_len``. Half the non-empty histories get the marker at a random position; the rest never contain it.
    """
    while True:
        lengths = torch.empty(batch).log_normal_(math.log(median_len), 1.0, generator=gen).long().clamp_(max=max_len)
        lengths[torch.rand(batch, generator=gen) < 0.1] = 0
        total, longest = int(lengths.sum()), int(lengths.max())
        # Sizes dynamo would specialize (0/1) or duck-size together (equal): draw again (see the module docstring).
        if longest >= 2 and len({total, longest, batch + 1}) == 3:
            break
    offsets = torch.zeros(batch + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    tokens = torch.randint(1, vocab, (total,), generator=gen)
    labels = (torch.rand(batch, generator=gen) < 0.5) & (lengths > 0)
    position = offsets[:-1] + (torch.rand(batch, generator=gen) * lengths).long()
    tokens[position[labels]] = MARKER
    return tokens, offsets, longest, labels.float()


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jfa_ops.demo", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--batch", type=int, default=32, help="histories per batch, >= 2 (default 32)")
    p.add_argument("--max-len", type=int, default=64, help="longest history (default 64)")
    p.add_argument("--device", default="auto", help="auto (cuda when present, else cpu), cpu, cuda, ...")
    p.add_argument("--backend", default=None, help="jfa backend name (default: automatic choice)")
    p.add_argument("--no-compile", action="store_true", help="run eagerly")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch < 2 or args.max_len < 2:
        p.error("need --steps >= 1, --batch >= 2 and --max-len >= 2")
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    """Run the demo; returns its numbers (first_loss, last_loss, steps_per_s, compiles, recompiles, ...)."""
    args = _parse(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    vocab = 16
    model = SeedPoolingClassifier(vocab, backend=args.backend).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    step_fn = model if args.no_compile else torch.compile(model, fullgraph=True, dynamic=True)
    loss_fn = nn.BCEWithLogitsLoss()

    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    losses: List[float] = []
    first_step_s = 0.0
    start = time.perf_counter()
    bar = (tqdm(range(args.steps), desc="train", unit="step", dynamic_ncols=True) if tqdm is not None
           else _ProgressLines(args.steps))
    for step in bar:
        tokens, offsets, max_seqlen, labels = make_batch(gen, args.batch, vocab, args.max_len)
        tokens, offsets, labels = tokens.to(device), offsets.to(device), labels.to(device)
        loss = loss_fn(step_fn(tokens, offsets, max_seqlen), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step == 0:
            first_step_s = time.perf_counter() - start
        if step % 10 == 0 or step == args.steps - 1:
            bar.set_postfix(loss=f"{losses[-1]:.3f}", T=tokens.shape[0], max_len=max_seqlen)
    bar.close()
    total_s = time.perf_counter() - start

    window = max(1, min(20, args.steps // 5))
    compiles = 0 if args.no_compile else torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before
    result = {
        "first_loss": sum(losses[:window]) / window,
        "last_loss": sum(losses[-window:]) / window,
        "steps_per_s": (args.steps - 1) / max(total_s - first_step_s, 1e-9) if args.steps > 1 else float("nan"),
        "first_step_s": first_step_s,
        "total_s": total_s,
        "compiles": compiles,
        "recompiles": max(0, compiles - 1),
    }
    print(f"device={device} backend={args.backend or 'auto'} compiled={not args.no_compile} "
          f"steps={args.steps} batch={args.batch}")
    print(f"loss: first {window} steps avg {result['first_loss']:.4f} -> last {window} steps avg "
          f"{result['last_loss']:.4f}")
    print(f"speed: {result['steps_per_s']:.1f} steps/s after the first step "
          f"(first step incl. compile {first_step_s:.1f} s, total {total_s:.1f} s)")
    reused = " (reused a graph compiled earlier in this process)" if compiles == 0 and not args.no_compile else ""
    print(f"dynamo: {result['compiles']} compile(s), {result['recompiles']} recompile(s){reused}")
    return result


class _ProgressLines:
    """What the demo uses of a tqdm bar, as plain lines on stderr (stdout keeps the summary)."""

    def __init__(self, steps: int):
        self.steps = steps

    def __iter__(self):
        return iter(range(self.steps))

    def set_postfix(self, **values):
        print("train " + " ".join(f"{k}={v}" for k, v in values.items()), file=sys.stderr, flush=True)

    def close(self):
        pass


if __name__ == "__main__":
    main()
