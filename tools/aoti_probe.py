"""Why does no AOTInductor package load on the lent H200 image? One call's worth of probes, no jfa_ops involved.

`python tools/aoti_probe.py [--device cuda|cpu] [--dir DIR]`. Issue 9's serving check (tools/aoti_package.py) is
blocked there: since 2026-12-01 ``torch._inductor.aoti_load_package`` exits -11 (SIGSEGV) in a fresh process for
every package, the op-free control included (bench/NOTES.md, v20). This script packages that control (``relu(2x) +
1``, one dynamic dim) and loads it in fresh processes in several ways, so one device call says which layer fails:

- ``package``: ``aoti_load_package`` with CUDA initialised first (the input made before the load);
- ``package_load_first``: the load before anything touches CUDA, as aoti_package.py's child does (the failing
  baseline);
- ``package_single_threaded``: the same with ``run_single_threaded=True`` (no runner pool);
- ``loader``: ``torch._C._aoti.AOTIModelPackageLoader`` directly (Python's wrapper skipped);
- ``runner``: the package unzipped by hand and its model ``.so`` loaded by ``AOTIModelContainerRunnerCuda`` (or
  ``...Cpu``) directly (no package loader: the shared object and its CUDA init alone);
- ``fresh_dirs``: ``package`` with a new ``TMPDIR`` and ``TORCHINDUCTOR_CACHE_DIR`` (stale extraction dirs);
- ``cpu_package`` (with ``--device cuda``): a CPU package of the same model (is it CUDA's side?);
- ``in_process``: the package loaded by the process that built it;
- ``gdb``: ``package`` under ``cuda-gdb -batch`` (it debugs host code on that image), for the native backtrace of
  the fault.

Prints one JSON object: per probe its exit status, whether the output matched, and the tail of its stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import torch

CHECK = r"""
y = y[0] if isinstance(y, (list, tuple)) else y
print("probe ok" if torch.allclose(y, torch.relu(x * 2) + 1) else "probe wrong", flush=True)
"""

LOADERS = {
    "package": "model = torch._inductor.aoti_load_package(path)\ny = model(x)",
    "package_load_first": "model = torch._inductor.aoti_load_package(path)\nx = torch.randn(777, device=DEVICE)\ny = model(x)",
    "package_single_threaded": "model = torch._inductor.aoti_load_package(path, run_single_threaded=True)\ny = model(x)",
    "loader": ("loader = torch._C._aoti.AOTIModelPackageLoader(path, 'model', False, 1, -1)\n"
               "y = loader.run([x])"),
    "runner": ("import glob, os\n"
               "so = [f for f in glob.glob(os.path.join(path, '**', '*.so'), recursive=True)][0]\n"
               "if DEVICE == 'cuda':\n"
               "    runner = torch._C._aoti.AOTIModelContainerRunnerCuda(so, 1, 'cuda', os.path.dirname(so))\n"
               "else:\n"
               "    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(so, 1)\n"
               "y = runner.run([x])"),
}


class Control(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


def build(directory: str, device: str) -> str:
    x = torch.randn(1000, device=device)
    program = torch.export.export(Control(), (x,), dynamic_shapes=({0: torch.export.Dim("n", min=2)},))
    return torch._inductor.aoti_compile_and_package(
        program, package_path=os.path.join(directory, f"control_{device}.pt2"))


def child_code(loader: str, device: str) -> str:
    make_input = "" if loader == "package_load_first" else "x = torch.randn(777, device=DEVICE)\n"
    return f"import sys, torch\nDEVICE = {device!r}\npath = sys.argv[1]\n{make_input}{LOADERS[loader]}\n{CHECK}"


def fresh_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JFA_COMPILE_PATH")}
    env.update(extra)
    return env


def run(argv, env, timeout=300) -> dict:
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return {"rc": "timeout"}
    return {"rc": done.returncode, "ok": "probe ok" in done.stdout,
            "stdout": done.stdout.strip()[-400:], "stderr": done.stderr.strip()[-1200:]}


def probe(loader: str, path: str, device: str, env=None) -> dict:
    return run([sys.executable, "-X", "faulthandler", "-c", child_code(loader, device), path], env or fresh_env())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    result = {"torch": torch.__version__, "device": args.device}
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.dir or tmp
        package = build(directory, args.device)
        unzipped = os.path.join(directory, "unzipped")
        with zipfile.ZipFile(package) as archive:
            archive.extractall(unzipped)
        result["files"] = sorted(os.path.relpath(os.path.join(r, f), unzipped)
                                 for r, _, fs in os.walk(unzipped) for f in fs)[:20]
        for loader in ("package", "package_load_first", "package_single_threaded", "loader"):
            result[loader] = probe(loader, package, args.device)
        result["runner"] = probe("runner", unzipped, args.device)
        scratch = tempfile.mkdtemp(dir=directory)
        result["fresh_dirs"] = probe("package", package, args.device, fresh_env(
            TMPDIR=scratch, TORCHINDUCTOR_CACHE_DIR=os.path.join(scratch, "inductor")))
        if args.device == "cuda":
            result["cpu_package"] = probe("package", build(directory, "cpu"), "cpu")
        try:
            x = torch.randn(777, device=args.device)
            y = torch._inductor.aoti_load_package(package)(x)
            y = y[0] if isinstance(y, (list, tuple)) else y
            result["in_process"] = {"ok": bool(torch.allclose(y, torch.relu(x * 2) + 1))}
        except Exception as e:  # reported, not raised: the probes above are the point
            result["in_process"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
        gdb = shutil.which("cuda-gdb")
        if gdb and not result["package_load_first"].get("ok"):
            traced = subprocess.run([gdb, "-batch", "-ex", "run", "-ex", "bt 40", "--args", sys.executable, "-c",
                                     child_code("package_load_first", args.device), package], env=fresh_env(),
                                    capture_output=True, text=True, timeout=400, cwd=tempfile.gettempdir())
            result["gdb"] = {"rc": traced.returncode, "tail": traced.stdout.strip()[-600:],
                             "backtrace": [line for line in traced.stdout.splitlines() if line.startswith("#")][:40]}
    print(json.dumps(result, indent=1))
    return 0 if result["package_load_first"].get("ok") else 3


if __name__ == "__main__":
    sys.exit(main())
