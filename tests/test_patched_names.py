"""Every knob a test patches by name exists in the code: ``monkeypatch.setattr(module, "NAME", ...)`` fails with an
AttributeError only when the test runs, and GPU tests never run in CI, so a culled knob's GPU test used to stay
behind until a device call (stop 43: ``BACKWARD_KV_PREFETCH``, culled in stop 40, five GPU test cases failing on the
H100). Source text only: no GPU, no TLX, no import of the modules."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
# an UPPER_CASE attribute patched by name, the module given by a (dotted) name
PATCHED = re.compile(r'setattr\(\s*[A-Za-z_][\w.]*\s*,\s*"([A-Z][A-Z0-9_]*)"')


def _defined_names() -> set:
    """Every identifier written in the package, the shape rules, the tools and the bench (assigned, imported or
    read: a knob patched by a test is assigned somewhere there)."""
    words = set()
    for folder in ("jfa_ops", "meta_kernels", "tools", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            words.update(re.findall(r"\b[A-Za-z_]\w*\b", path.read_text()))
    return words


def patched_names(text: str) -> set:
    return set(PATCHED.findall(text))


def test_patched_knobs_exist():
    defined = _defined_names()
    missing = sorted(f"{path.relative_to(ROOT)}: {name}" for path in (ROOT / "tests").rglob("*.py")
                     if path.name != pathlib.Path(__file__).name  # (this file's own example)
                     for name in patched_names(path.read_text()) if name not in defined)
    assert not missing, missing


def test_patched_names_finds_a_missing_knob():
    """The scan reads the forms the tests use (a module alias, a dotted module, keyword spacing)."""
    text = ('monkeypatch.setattr(configs, "BACKWARD_KV_PREFETCH", True)\n'
            'monkeypatch.setattr(jfa_ops.backends.tlx.configs,  "FORWARD_STORE_TMA", 1)\n'
            'monkeypatch.setattr(block_sparse_select, "capturing", lambda device: True)\n')
    assert patched_names(text) == {"BACKWARD_KV_PREFETCH", "FORWARD_STORE_TMA"}
    assert "BACKWARD_KV_PREFETCH" not in _defined_names()
