"""``python -m jfa_ops.demo``: a short run trains (the loss falls) and compiles once for batches of varying sizes."""
import subprocess
import sys

import torch

from jfa_ops import demo


def test_make_batch_is_jagged_skewed_and_dynamo_friendly():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        tokens, offsets, max_seqlen, labels = demo.make_batch(gen, batch=16, vocab=16, max_len=64)
        lengths = offsets.diff()
        assert offsets[0] == 0 and offsets[-1] == tokens.shape[0] and (lengths >= 0).all()
        assert max_seqlen == int(lengths.max()) and 2 <= max_seqlen <= 64
        assert len({tokens.shape[0], max_seqlen, offsets.shape[0]}) == 3  # no 0/1, no equal sizes
        has_marker = torch.stack([(tokens[a:b] == demo.MARKER).any() for a, b in zip(offsets[:-1], offsets[1:])])
        assert torch.equal(has_marker.float(), labels)
        assert labels[lengths == 0].eq(0).all()


def test_demo_trains_without_recompiling(capsys):
    result = demo.main(["--steps", "30", "--device", "cpu", "--backend", "reference"])
    assert result["last_loss"] < 0.8 * result["first_loss"], result
    assert result["recompiles"] == 0 and result["compiles"] <= 1, result  # 0: reused an earlier compile in-process
    printed = capsys.readouterr().out
    assert "loss: first" in printed and "steps/s" in printed and "recompile" in printed


def test_demo_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "jfa_ops.demo", "--steps", "5", "--no-compile", "--batch", "8"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "0 recompile(s)" in proc.stdout
