"""tools/triton_cache_pack.py (helper tcache42): the manifest handling, the archive's group files and the device's hit
report on CPU; the whole round trip (a JIT launch with fake tensors, build, a hit) where the device's Triton package
is unpacked at /tmp/t38 and a python3.12 runs it (tools/triton_cache_pack.py's setup)."""
import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import time
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON312 = "/root/.pyenv/versions/3.12.1/bin/python3.12"


def _tool():
    spec = importlib.util.spec_from_file_location("triton_cache_pack", os.path.join(ROOT, "tools",
                                                                                    "triton_cache_pack.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line(fn="m:k", key="K1", num_warps=4, env=None, hash_=None):
    return dict(fn=fn, hash=hash_, pid=1, env=env or {},
                data={"name": fn, "key": key, "options": {"num_warps": num_warps}, "signature": {}})


def _write(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_read_manifests_keeps_one_line_per_kernel_key_and_options(tmp_path):
    tool = _tool()
    a = _write(tmp_path / "a.jsonl", [_line(key="K1"), _line(key="K2"), _line(key="K1")])
    b = _write(tmp_path / "b.jsonl", [_line(key="K1", num_warps=8), _line(fn="m:other", key="K1"), _line(key="K2")])
    got = [(line["fn"], line["data"]["key"], line["data"]["options"]["num_warps"])
           for line in tool.read_manifests([a, b])]
    assert got == [("m:k", "K1", 4), ("m:k", "K2", 4), ("m:k", "K1", 8), ("m:other", "K1", 4)]


def test_groups_by_env_split_on_knobs_not_on_the_manifest_or_cache_path():
    tool = _tool()
    lines = [_line(key="A", env={"JFA_TRITON_MANIFEST": "/out/1.jsonl", "TRITON_CACHE_DIR": "/x", "HOME": "/r"}),
             _line(key="B", env={"JFA_TRITON_MANIFEST": "/out/2.jsonl"}),
             _line(key="C", env={"JFA_TLX_FWD_ZIGZAG": "1"}),
             _line(key="D", env={"TRITON_PLUGIN_PATHS": "/tmp/t38/utlx_plugin/libutlx.so"}),
             _line(key="E", env={"JFA_TEST_SHARD": "3/6", "JFA_TEST_RESUME": "/r.jsonl"})]
    groups = {json.dumps(env, sort_keys=True): [line["data"]["key"] for line in group]
              for env, group in tool._groups_by_env(lines)}
    assert groups == {"{}": ["A", "B", "E"], '{"JFA_TLX_FWD_ZIGZAG": "1"}': ["C"],
                      '{"TRITON_PLUGIN_PATHS": "/tmp/t38/utlx_plugin/libutlx.so"}': ["D"]}


def test_pack_keeps_the_chosen_stages_and_lists_only_them(tmp_path, monkeypatch):
    tool = _tool()
    cache = tmp_path / "cache"
    entry = cache / "ENTRY"
    entry.mkdir(parents=True)
    children = {}
    for name in ("k.source", "k.ttir", "k.ttgir", "k.llir", "k.ptx", "k.cubin", "k.json"):
        (entry / name).write_bytes(name.encode())
        children[name] = str(entry / name)
    (entry / "__grp__k.json").write_text(json.dumps({"child_paths": children}))
    monkeypatch.setattr(tool, "CACHE_DIR", str(cache))
    archive = tool.pack(str(tmp_path / "out"), (".json", ".cubin"))
    unpacked = tmp_path / "unpacked"
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["ENTRY/__grp__k.json", "ENTRY/k.cubin", "ENTRY/k.json"]
        tar.extractall(unpacked, filter="data")
    assert (unpacked / "ENTRY" / "k.cubin").read_bytes() == b"k.cubin"
    # a hit reads every child the group file lists: only the kept ones, at the cache's own (absolute) paths
    assert json.loads((unpacked / "ENTRY" / "__grp__k.json").read_text()) == {
        "child_paths": {"k.cubin": str(entry / "k.cubin"), "k.json": str(entry / "k.json")}}


def test_report_counts_the_carried_entries_among_the_calls_builds(tmp_path, capsys):
    tool = _tool()
    hashes = [hashlib.sha256(f"kernel {i}".encode()).hexdigest() for i in range(3)]
    # Triton's cache directory name of a key hash (triton.runtime.cache._base32), written out here
    dirs = [base64.b32encode(bytes.fromhex(h)).decode().rstrip("=") for h in hashes]
    manifest = _write(tmp_path / "m.jsonl", [_line(key=str(i), hash_=h) for i, h in enumerate(hashes)])
    carried = tmp_path / "carried.txt"
    carried.write_text(f"{dirs[0]}\n{dirs[2]}\nOTHER\n")
    assert tool.report([manifest], str(carried)) == 0
    assert capsys.readouterr().out.strip() == ("tcache: 3 kernels JIT-built in this call, 2 from the carried cache "
                                               "(3 entries), 1 compiled here")


@pytest.mark.skipif(not (os.path.exists(PYTHON312) and os.path.isdir("/tmp/t38/triton/_C")),
                    reason="needs the device's Triton package at /tmp/t38 and a python3.12 (the tool's setup)")
def test_selfcheck_round_trip_hits(tmp_path):
    """A JIT launch (fake tensors, sm_90 stand-in driver) compiles and records; build rebuilds the entry under the
    recorded key; a second launch over the unpacked archive finds it (Triton's listener: cache_hit True)."""
    if os.path.exists("/tmp/tcache") and os.listdir("/tmp/tcache"):
        pytest.skip("/tmp/tcache holds entries (a build in progress?): the selfcheck empties it")
    out = subprocess.run([PYTHON312, "tools/triton_cache_pack.py", "selfcheck", "--spec", "bwd-d64-bf16-causal-v2",
                          "--scratch", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": f"/tmp/t38:{ROOT}"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "= the device's" in out.stdout
    assert out.stdout.count("cache_hit=[False]") == 1 and out.stdout.count("cache_hit=[True]") == 1, out.stdout


def test_recorder_waits_for_the_scripts_own_triton_import(tmp_path):
    """sitecustomize's hook imports no triton at start-up (a script may set TRITON_INTERPRET first); the recorder
    is in place once the script imports triton."""
    manifest = str(tmp_path / "m.jsonl")
    code = (f"import sys; sys.path.insert(0, {os.path.join(ROOT, 'tools')!r}); import triton_cache_pack as T\n"
            f"T.record_after_triton_import({manifest!r}); print('before', 'triton' in sys.modules)\n"
            "import triton; from triton import knobs\n"
            "print('after', getattr(knobs.runtime.jit_post_compile_hook, 'jfa_manifest', None))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["before False", f"after {manifest}"]


def test_pack_takes_only_the_given_keys_entries(tmp_path, monkeypatch):
    tool = _tool()
    keys = [hashlib.sha256(f"kernel {i}".encode()).hexdigest() for i in range(2)]
    for key in keys:
        entry = tmp_path / "cache" / base64.b32encode(bytes.fromhex(key)).decode().rstrip("=")
        entry.mkdir(parents=True)
        (entry / "k.cubin").write_bytes(b"x")
        (entry / "__grp__k.json").write_text(json.dumps({"child_paths": {"k.cubin": str(entry / "k.cubin")}}))
    monkeypatch.setattr(tool, "CACHE_DIR", str(tmp_path / "cache"))
    with tarfile.open(tool.pack(str(tmp_path / "out"), (".cubin",), {keys[1]})) as tar:
        names = tar.getnames()
    kept = base64.b32encode(bytes.fromhex(keys[1])).decode().rstrip("=")
    assert sorted(names) == [f"{kept}/__grp__k.json", f"{kept}/k.cubin"]


def test_recorder_names_the_test_that_first_used_each_kernel(tmp_path, monkeypatch):
    """A manifest line says which test's first use compiled (or loaded) the kernel, and when: the GPU suite's
    shardings can then be priced in kernels per shard (tests/device_record.py)."""
    from triton import knobs

    tool = _tool()
    manifest = str(tmp_path / "m.jsonl")
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    tool.install_recorder(manifest)
    jit = types.SimpleNamespace(module="jfa_ops.k", fn=types.SimpleNamespace(__qualname__="kernel"),
                                device_caches={0: [{"KEY": types.SimpleNamespace(hash="ab12")}]})
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/t.py::test_a[bf16] (call)")
    knobs.runtime.jit_post_compile_hook(key="KEY", repr="", fn=types.SimpleNamespace(jit_function=jit),
                                        compile={"device": 0, "specialization_data": "{}"},
                                        is_manual_warmup=False, already_compiled=False)
    with open(manifest) as f:
        (line,) = [json.loads(text) for text in f]
    assert (line["fn"], line["hash"], line["test"]) == ("jfa_ops.k:kernel", "ab12", "tests/t.py::test_a[bf16] (call)")
    assert abs(line["t"] - time.time()) < 60
