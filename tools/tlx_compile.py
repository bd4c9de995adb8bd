"""Compile every TLX kernel specialization for sm_90 without a GPU; one JSON line each (see
``jfa_ops.backends.tlx.specializations``). Run with triton 3.8 + triton-utlx importable, e.g.
``PYTHONPATH=.ci-tlx:. python tools/tlx_compile.py --jobs 2`` after ``pip install --target .ci-tlx triton==3.8.0
triton-utlx==3.8.0.post16``.

The plugin must register before anything imports triton (torch does, at import), hence this script: it imports
``_utlx_autoregister`` first (a ``pip --target`` install skips the plugin's .pth file that would do it).
"""
import os
import sys

try:
    import _utlx_autoregister  # noqa: F401
except ImportError:
    pass
os.environ.pop("TRITON_INTERPRET", None)  # compiling, not interpreting
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jfa_ops.backends.tlx.specializations import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
