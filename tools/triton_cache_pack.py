"""Build on this CPU machine the Triton file-cache entries the device's JIT will look up, so a device call skips its
first-use compiles (helper tcache42, stop 42; bench/NOTES.md "Triton cache carried to the device").

Triton's file-cache key (``triton.compiler.compile``) is sha256 of ``triton_key()`` (hash of triton's .py files AND
``_C/libtriton.so``: a cp311 build and the device's stripped cp312 build differ), ``src.hash()`` (kernel source and
its specialization), ``backend.hash()`` (ptxas version + sm_90), ``options.hash()``, the set cache-invalidating env
vars (here ``TRITON_PLUGIN_PATHS``=/tmp/t38/utlx_plugin/libutlx.so: the path, so the install path matters) and the
uTLX stages hook's key (its custom_stages.py text). So the entries are built by the device's own package: .t38
unpacked to /tmp/t38 exactly as tools/tlx_device.sh does, run by python3.12 (pyenv 3.12.1 here). The group files
name their children by absolute path, so both sides use TRITON_CACHE_DIR=/tmp/tcache.

Setup here (once per machine; .t38 is the lead's ignored folder, built by shared/device/tlx-triton38.sh):
  mkdir -p /tmp/t38 && tar xJf .t38/triton38.tar.xz -C /tmp/t38 && /root/.pyenv/versions/3.12.1/bin/python3.12 -m pip \
    install -q --no-index --no-deps --no-compile --target /tmp/t38 .t38/triton_utlx-*.whl
and run this tool as ``PYTHONPATH=/tmp/t38:$PWD /root/.pyenv/versions/3.12.1/bin/python3.12 tools/triton_cache_pack.py``.

The steps:

* record (device): with JFA_TRITON_MANIFEST set (tools/tlx_device.sh sets $OUT/triton_manifest.jsonl),
  tools/t38_site/sitecustomize.py calls ``install_recorder``: one JSON line per kernel the JIT compiles (Triton's own
  ``specialization_data``: signature, constexprs, attrs, options, target; the kernel's module:qualname; the file-cache
  hash the device used; the JFA_/TRITON_ env), through ``knobs.runtime.jit_post_compile_hook``.
* ``build MANIFEST... [--out .tcache]`` (here, no GPU): replays each line with ``JITFunction.preload`` (the JIT's own
  deserialize-then-``_do_compile`` path) under a stand-in driver whose target is GPUTarget("cuda", 90, 32), into
  /tmp/tcache, one process per recorded env; prints per kernel whether its key equals the device's recorded hash (the
  key check needs no device call); then packs OUT/tcache.tar.xz (json, cubin, ptx, ttgir per kernel: --stages).
  torch is not installed for 3.12 here: the kernel modules are imported with a do-nothing torch and without the
  jfa_ops package __init__s (the key hashes the kernels' source, not torch; a constant derived from torch would show
  as a key mismatch).
* device: tools/tlx_device.sh unpacks a carried .tcache/tcache.tar.xz into /tmp/tcache (``tcache``: only that, a call
  of its own) and at the end prints ``report``: how many of the call's JIT builds the carried cache held.

``selfcheck``: the round trip on CPU for one kernel (a JIT launch with fake tensors records and compiles, build,
unpack, a second launch must hit). ``keys MANIFEST``: each line's key hash, without compiling.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import tarfile
import time
import types

CACHE_DIR = "/tmp/tcache"  # the same absolute path on both sides: group files list their children by full path
MANIFEST_ENV = "JFA_TRITON_MANIFEST"
# files a cache hit needs: the group file names the rest; CompiledKernel reads every child (json, cubin, and the
# text stages that device tools read from kernel.asm: ptx, ttgir)
KEEP_SUFFIXES = (".json", ".cubin", ".ptx", ".ttgir")


def install_recorder(path: str) -> None:
    """Append the JIT's specialization data of every kernel compiled in this process to ``path`` (JSON lines)."""
    from triton import knobs

    previous = knobs.runtime.jit_post_compile_hook
    if getattr(previous, "jfa_manifest", None) == path:
        return  # sitecustomize installed it already

    def record(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002 (Triton's names)
        try:  # never stop a compile for its manifest line (Inductor's workers, another Triton's hook layout)
            jit = fn.jit_function
            compiled = jit.device_caches[compile["device"]][0].get(key)  # stored just before this hook runs
            # test, t: which test first used the kernel in this process, and when (the GPU suite's shards: which
            # kernels each test function needs, so a sharding can be priced in compiles; tests/device_record.py)
            line = dict(fn=f"{jit.module}:{jit.fn.__qualname__}", hash=getattr(compiled, "hash", None),
                        pid=os.getpid(), data=json.loads(compile["specialization_data"]), env=_knob_env(),
                        test=os.environ.get("PYTEST_CURRENT_TEST"), t=round(time.time(), 3))
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")
        except Exception as e:  # noqa: BLE001
            print(f"triton_cache_pack: no manifest line ({type(e).__name__}: {e})", file=sys.stderr)
        return previous(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup,
                        already_compiled=already_compiled) if previous else None

    record.jfa_manifest = path
    knobs.runtime.jit_post_compile_hook = record


class _AfterTritonImport(importlib.abc.MetaPathFinder):
    """Runs ``install_recorder`` right after ``import triton`` completes, so interpreter start-up (sitecustomize)
    imports no triton: a script may still set TRITON_INTERPRET before its own import."""

    def __init__(self, path: str):
        self.path = path

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "triton":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module, manifest = spec.loader.exec_module, self.path

        def exec_then_record(module):
            exec_module(module)
            try:
                install_recorder(manifest)
            except Exception as e:  # never stop a run for its manifest
                print(f"triton_cache_pack: no manifest ({type(e).__name__}: {e})", file=sys.stderr)

        spec.loader.exec_module = exec_then_record
        return spec


def record_after_triton_import(path: str) -> None:
    """``install_recorder(path)`` once triton is imported (now, if it is)."""
    if "triton" in sys.modules:
        install_recorder(path)
    elif not any(isinstance(f, _AfterTritonImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTritonImport(path))


def _knob_env() -> dict:
    """The env vars that may change a kernel's source-level constants (read at import) or Triton's key."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(("JFA_", "TRITON_"))}


class _Anything(type):
    """A do-nothing torch: any attribute, call, index or arithmetic gives another do-nothing value."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _AnyValue

    def __getitem__(cls, item):
        return _AnyValue

    def __or__(cls, other):
        return _AnyValue

    __ror__ = __or__


class _AnyValue(metaclass=_Anything):
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _AnyValue()

    def _any(self, *args, **kwargs):
        return _AnyValue()

    __call__ = __getitem__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _any
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __pow__ = __or__ = __ror__ = _any
    __and__ = __neg__ = _any

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __int__(self):
        return 0

    __index__ = __int__

    def __float__(self):
        return 0.0

    def __hash__(self):
        return 0

    def __eq__(self, other):
        return False

    def __lt__(self, other):
        return False

    __gt__ = __le__ = __ge__ = __lt__

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _StubTorch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch" or fullname.startswith("torch."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda name: _AnyValue  # PEP 562
        return module

    def exec_module(self, module):
        pass


def import_kernels_without_torch(root: str) -> None:
    """Make ``jfa_ops.*`` kernel modules importable where torch is not installed: a do-nothing torch, and the
    packages registered bare (their __init__s register torch ops)."""
    try:
        import torch  # noqa: F401
        return  # a real torch: import as usual
    except ImportError:
        pass
    sys.meta_path.insert(0, _StubTorch())
    for name in ("jfa_ops", "jfa_ops.backends", "jfa_ops.backends.tlx", "jfa_ops.backends.triton", "jfa_ops.ops"):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = package


def use_sm90_driver():
    """Triton's active driver replaced by one that reports an sm_90 device and compiles nothing itself."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    class Sm90Driver:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_active_torch_device(self):
            raise RuntimeError("no GPU here")

        def __getattr__(self, name):
            raise AttributeError(f"Sm90Driver has no {name}: nothing may run here")

    driver.set_active(Sm90Driver())


def kernel_of(fn: str):
    module, qualname = fn.split(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def read_manifests(paths) -> list:
    """Unique lines (by the JIT's key and kernel), in first-seen order."""
    seen, lines = set(), []
    for path in paths:
        with open(path) as f:
            for text in f:
                if not text.strip():
                    continue
                line = json.loads(text)
                ident = (line["fn"], json.dumps(line["data"]["key"]), json.dumps(line["data"]["options"]))
                if ident not in seen:
                    seen.add(ident)
                    lines.append(line)
    return lines


def cache_key_of(kernel, data: dict) -> str:
    """The file-cache directory name ``triton.compile`` would use for this line, computed without compiling (the
    same decoding as ``JITFunction.preload``, whose body this mirrors up to the compile)."""
    import hashlib

    from triton import knobs
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler import ASTSource, make_backend
    from triton.backends.compiler import GPUTarget
    from triton.runtime.cache import get_cache_key

    captured = {}

    def capture(*, compile, **_):  # noqa: A002 (Triton's name)
        captured.update(signature=compile["signature"], constants=compile["constants"], attrs=compile["configs"][0])
        return True  # skip the compile

    previous, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, capture
    try:
        kernel.preload(json.dumps(data))
    finally:
        knobs.runtime.jit_cache_hook = previous
    src = ASTSource(kernel, captured["signature"], captured["constants"], captured["attrs"])
    backend = make_backend(GPUTarget("cuda", 90, 32))
    options = backend.parse_options({k: tuple(v) if isinstance(v, list) else v for k, v in data["options"].items()})
    key = get_cache_key(src, backend, options, get_cache_invalidating_env_vars())
    if knobs.runtime.add_stages_inspection_hook is not None:
        key += knobs.runtime.add_stages_inspection_hook()[0]
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _triton_for_device() -> None:
    os.environ["TRITON_INTERPRET"] = "0"  # as on the device (the CPU test environment sets 1)
    os.environ.setdefault("TRITON_CACHE_DIR", CACHE_DIR)
    if os.environ["TRITON_CACHE_DIR"] != CACHE_DIR:
        raise SystemExit(f"TRITON_CACHE_DIR must be {CACHE_DIR} (the device's): group files hold absolute paths")
    import _utlx_autoregister  # noqa: F401 (TRITON_PLUGIN_PATHS: part of the key)
    import triton

    if not triton.__file__.startswith("/tmp/t38/"):
        raise SystemExit(f"triton from {triton.__file__}: the key hashes libtriton.so, so build with the device's "
                         "package: python3.12 with PYTHONPATH=/tmp/t38 (unpacked from .t38 as tools/tlx_device.sh)")
    import_kernels_without_torch(os.getcwd())
    use_sm90_driver()


def _compile_lines(lines, keys_out=None) -> int:
    """Compile each line into CACHE_DIR (this process's env is the lines' recorded one), appending each key to
    ``keys_out``; 0 unless a line failed."""
    _triton_for_device()
    bad = 0
    for n, line in enumerate(lines, 1):
        start = time.perf_counter()
        try:
            kernel = kernel_of(line["fn"])
        except (ImportError, AttributeError) as e:  # e.g. an Inductor kernel from a file of the device's
            print(f"[{n}/{len(lines)}] {line['fn']} skipped (not importable here: {e})", flush=True)
            continue
        try:
            key = cache_key_of(kernel, line["data"])
            kernel.preload(json.dumps(line["data"]))
            if keys_out:
                with open(keys_out, "a") as f:
                    f.write(key + "\n")
        except Exception as e:  # the kernel's source changed since the record and no longer takes these arguments
            bad += 1
            print(f"[{n}/{len(lines)}] {line['fn']} FAILED: {type(e).__name__}: {e}", flush=True)
            continue
        recorded = line.get("hash")
        same = "no recorded hash" if recorded is None else "= the device's" if recorded == key else \
            f"!= the device's {recorded[:12]} (source changed since, or a torch-derived constant)"
        print(f"[{n}/{len(lines)}] {line['fn']} {key[:12]} {same} {time.perf_counter() - start:.1f} s", flush=True)
    return 1 if bad else 0


def _groups_by_env(lines) -> list:
    groups = {}
    for line in lines:
        # JFA_ knobs (read at import: module constants the key may hash) and TRITON_ vars (some are in the key);
        # not the test harness's JFA_TEST_ vars (a shard's index, records: no kernel reads them)
        env = {k: v for k, v in line.get("env", {}).items() if k.startswith(("JFA_", "TRITON_"))
               and not k.startswith("JFA_TEST_") and k not in (MANIFEST_ENV, "TRITON_CACHE_DIR")}
        groups.setdefault(json.dumps(env, sort_keys=True), []).append(line)
    return [(json.loads(env), group) for env, group in groups.items()]


def pack(out: str, stages=KEEP_SUFFIXES, keys=None) -> str:
    """CACHE_DIR's entries (those of ``keys``, the key hashes, when given: not older builds' left there) into
    OUT/tcache.tar.xz, each keeping its metadata and the ``stages`` files (the group file rewritten to list those
    only: a hit reads every child it lists)."""
    import base64
    import io

    os.makedirs(out, exist_ok=True)
    archive = os.path.join(out, "tcache.tar.xz")
    with tarfile.open(archive, "w:xz") as tar:
        wanted = None if keys is None else {base64.b32encode(bytes.fromhex(k)).decode().rstrip("=") for k in keys}
        for entry in sorted(e for e in os.listdir(CACHE_DIR) if wanted is None or e in wanted):
            directory = os.path.join(CACHE_DIR, entry)
            for group_name in sorted(n for n in os.listdir(directory) if n.startswith("__grp__")):
                with open(os.path.join(directory, group_name)) as f:
                    children = json.load(f)["child_paths"]
                kept = {name: path for name, path in children.items() if name.endswith(stages)}
                for name, path in sorted(kept.items()):
                    tar.add(path, arcname=f"{entry}/{name}")
                text = json.dumps({"child_paths": kept}).encode()
                info = tarfile.TarInfo(f"{entry}/{group_name}")
                info.size, info.mtime = len(text), int(time.time())
                tar.addfile(info, io.BytesIO(text))
    return archive


def build(manifests, out: str, stages) -> int:
    """Each group of lines recorded under one set of JFA_* env vars compiled in a process of its own with those
    vars (knobs read at import may set module-level constants the key hashes), then CACHE_DIR packed."""
    import subprocess
    import tempfile

    rc = 0
    keys_out = tempfile.NamedTemporaryFile(suffix=".keys", delete=False).name
    for env, lines in _groups_by_env(read_manifests(manifests)):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("JFA_")}
        child_env["TRITON_CACHE_DIR"] = CACHE_DIR
        print(f"{len(lines)} kernels with {env or 'no JFA_ vars'}", flush=True)
        rc |= subprocess.call([sys.executable, os.path.abspath(__file__), "compile", f.name, "--keys-out", keys_out],
                              env={**child_env, **env})
        os.unlink(f.name)
    with open(keys_out) as f:
        keys = set(f.read().split())
    os.unlink(keys_out)
    archive = pack(out, tuple(f".{s}" for s in stages), keys)
    print(f"{archive}: {os.path.getsize(archive) / 2**20:.2f} MiB, {len(keys)} kernels")
    return rc


def keys(manifests) -> int:
    _triton_for_device()
    for line in read_manifests(manifests):
        print(cache_key_of(kernel_of(line["fn"]), line["data"]), line["fn"])
    return 0


class _FakeDtype:
    """What Triton's specialization reads of a torch dtype: str() and itemsize."""

    def __init__(self, name: str, itemsize: int):
        self.name, self.itemsize = name, itemsize

    def __str__(self):
        return f"torch.{self.name}"

    __repr__ = __str__

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return isinstance(other, _FakeDtype) and other.name == self.name


class _FakeTensor:
    """A 16-byte aligned 'tensor' for the JIT's binder: data_ptr and dtype are all it reads."""

    def __init__(self, name: str, itemsize: int):
        self.dtype = _FakeDtype(name, itemsize)

    def data_ptr(self):
        return 1 << 20


def _launch_like_the_device(spec_name: str) -> float:
    """``kernel[grid](...)`` through the real JIT for one shipped specialization, with fake tensors under the sm_90
    stand-in driver: the JIT specializes, looks up / fills the file cache, then the launch fails (no GPU).
    Returns the seconds it took; the recorder (JFA_TRITON_MANIFEST) logs the kernel."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from jfa_ops.backends.tlx import specializations as S

    spec = next(sp for sp in S.shipped_specializations() if sp.name == spec_name)
    kernel = kernel_of(f"{spec.module}:{spec.kernel}")
    dtypes = {"bf16": ("bfloat16", 2), "fp16": ("float16", 2), "fp32": ("float32", 4), "i32": ("int32", 4),
              "fp8e4nv": ("float8_e4m3fn", 1), "u8": ("uint8", 1), "i8": ("int8", 1)}
    args = {}
    for i, name in enumerate(kernel.arg_names):
        ty = spec.signature[name]
        if ty == "constexpr":
            args[name] = spec.constexprs[name]
        elif ty.startswith("tensordesc"):
            dtype, block = ty[len("tensordesc<"):-1].split("[")
            block = [int(x) for x in block.rstrip("]").split(",")]
            args[name] = TensorDescriptor(_FakeTensor(*dtypes[dtype]), [4096, block[1]], [block[1], 1], block)
        elif ty.startswith("*"):
            args[name] = _FakeTensor(*dtypes[ty[1:]])
        elif ty.startswith("fp"):
            args[name] = 0.125
        else:  # divisible by 16 where specializations.py says the JIT infers it
            args[name] = 4096 if (i,) in spec.attrs else 1000
    start = time.perf_counter()
    try:
        kernel[(132, 1, 1)](**args, num_warps=spec.num_warps, num_stages=spec.num_stages)
    except AttributeError as e:  # the stand-in driver has no launcher: the compile (or cache hit) is done by then
        if "Sm90Driver" not in str(e):
            raise
    return time.perf_counter() - start


def selfcheck(spec_name: str, scratch: str) -> int:
    """On CPU, the whole round trip for one kernel, each step a fresh process like the device's calls:
    1. a 'device' run compiles through the JIT into an empty cache elsewhere and records the manifest;
    2. ``build`` rebuilds the entry from the manifest into CACHE_DIR and packs it (its key == the recorded one);
    3. a second 'device' run, CACHE_DIR emptied and the archive unpacked into it, must hit: no new entry, and
       Triton's compilation listener reports cache_hit."""
    import shutil
    import subprocess

    os.makedirs(scratch, exist_ok=True)
    manifest = os.path.join(scratch, "manifest.jsonl")
    if os.path.exists(manifest):
        os.unlink(manifest)
    me = [sys.executable, os.path.abspath(__file__)]
    first = os.path.join(scratch, "device-first-run")
    shutil.rmtree(first, ignore_errors=True)
    env = {**os.environ, MANIFEST_ENV: manifest, "TRITON_INTERPRET": "0"}  # sitecustomize imports triton at start
    subprocess.check_call(me + ["device-run", spec_name, first], env=env)
    shutil.rmtree(CACHE_DIR, ignore_errors=True)
    subprocess.check_call(me + ["build", manifest, "--out", scratch], env={**env, MANIFEST_ENV: ""})
    shutil.rmtree(CACHE_DIR)
    os.makedirs(CACHE_DIR)
    with tarfile.open(os.path.join(scratch, "tcache.tar.xz")) as tar:
        tar.extractall(CACHE_DIR, filter="data")
    before = sorted(os.listdir(CACHE_DIR))
    subprocess.check_call(me + ["device-run", spec_name, CACHE_DIR], env=env)
    after = sorted(os.listdir(CACHE_DIR))
    print(f"first run's entry {os.listdir(first)}, unpacked {before}, after the second run {after}")
    return 0 if before == after == sorted(os.listdir(first)) else 1


def _device_run(spec_name: str, cache_dir: str) -> int:
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    os.environ["TRITON_INTERPRET"] = "0"
    import _utlx_autoregister  # noqa: F401
    from triton import knobs

    import_kernels_without_torch(os.getcwd())
    use_sm90_driver()
    if os.environ.get(MANIFEST_ENV):
        install_recorder(os.environ[MANIFEST_ENV])
    hits = []
    knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    seconds = _launch_like_the_device(spec_name)
    print(f"device-run {spec_name}: {seconds:.2f} s, cache_hit={hits}", flush=True)
    return 0


def report(manifests, carried_listing: str) -> int:
    """How many of the kernels a device call's JIT asked for the carried cache held (its entries listed in
    ``carried_listing`` at unpack time, one directory name a line): a hit is a line whose key is among them."""
    import base64

    with open(carried_listing) as f:
        carried = set(f.read().split())
    lines = [line for line in read_manifests(manifests) if line.get("hash")]
    dirs = {base64.b32encode(bytes.fromhex(line["hash"])).decode().rstrip("=") for line in lines}
    hits = len(dirs & carried)
    print(f"tcache: {len(dirs)} kernels JIT-built in this call, {hits} from the carried cache "
          f"({len(carried)} entries), {len(dirs) - hits} compiled here")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("manifests", nargs="+")
    b.add_argument("--out", default=".tcache")
    b.add_argument("--stages", default="json,cubin,ptx,ttgir",
                   help="files kept per kernel (json and cubin are what a launch needs; device tools read ptx/ttgir)")
    c = sub.add_parser("compile", help="(build's worker) compile a manifest's lines into the cache, no packing")
    c.add_argument("manifests", nargs="+")
    c.add_argument("--keys-out", help="append each compiled line's key hash to this file")
    k = sub.add_parser("keys")
    k.add_argument("manifests", nargs="+")
    sc = sub.add_parser("selfcheck", help="the whole round trip on CPU for one shipped kernel (see selfcheck)")
    sc.add_argument("--spec", default="fwd-d128-bf16-causal-oneloop-storetma-tilemajor")
    sc.add_argument("--scratch", default="/tmp/tcache-selfcheck")
    dr = sub.add_parser("device-run", help="(selfcheck's worker) one JIT launch as on the device, no GPU")
    dr.add_argument("spec")
    dr.add_argument("cache_dir")
    r = sub.add_parser("report", help="(device) the carried cache's hits in this call's manifest")
    r.add_argument("manifests", nargs="+")
    r.add_argument("--carried", required=True, help="the cache's directory names at unpack time, one a line")
    args = parser.parse_args(argv)
    if args.cmd == "report":
        return report(args.manifests, args.carried)
    if args.cmd == "selfcheck":
        return selfcheck(args.spec, args.scratch)
    if args.cmd == "device-run":
        return _device_run(args.spec, args.cache_dir)
    if args.cmd == "build":
        return build(args.manifests, args.out, args.stages.split(","))
    if args.cmd == "compile":
        return _compile_lines(read_manifests(args.manifests), args.keys_out)
    return keys(args.manifests)


if __name__ == "__main__":
    sys.exit(main())
