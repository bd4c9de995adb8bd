"""Copied into /tmp/t38 by tools/tlx_device.sh: what the TLX plugin's utlx_plugin.pth does in a real install.

The device installs Triton 3.8 + triton-utlx with ``pip install --target /tmp/t38`` and puts /tmp/t38 on PYTHONPATH;
Python runs .pth files only in site directories, so a fresh interpreter there has no TLX plugin. The bench and our
tools import ``_utlx_autoregister`` themselves, but Inductor's compile workers (fresh interpreters given the
parent's sys.path as PYTHONPATH) do not, and the kernel modules Inductor writes import ``triton.language.extra.tlx``
when the parent could: every compile in a worker failed (``ModuleNotFoundError``), hence
``TORCHINDUCTOR_COMPILE_THREADS=1`` so far. Python imports ``sitecustomize`` from sys.path at startup, workers
included. A real install (site-packages) runs the .pth itself and needs none of this.
"""
import importlib.machinery
import importlib.util
import os
import sys

try:
    import _utlx_autoregister  # noqa: F401 (the plugin's path for triton, the finder for triton.language.extra.tlx)
except ImportError:
    pass

# JFA_TRITON_MANIFEST (tools/tlx_device.sh sets it to $OUT/triton_manifest.jsonl): every kernel the JIT compiles in
# this process is appended there (tools/triton_cache_pack.py's record step; its build step replays them on CPU into
# the file cache that a later call carries as .tcache/), hooked in when the process imports triton (none imported
# here). The repo root is on PYTHONPATH: tools is a namespace package.
if os.environ.get("JFA_TRITON_MANIFEST"):
    try:
        from tools.triton_cache_pack import record_after_triton_import

        record_after_triton_import(os.environ["JFA_TRITON_MANIFEST"])
    except Exception as e:  # never stop a run for its manifest
        print(f"sitecustomize: no Triton manifest ({type(e).__name__}: {e})", file=sys.stderr)

# then the sitecustomize this one shadows, if the interpreter has one (e.g. a distribution's)
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
