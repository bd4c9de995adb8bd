"""The GPU suite's record across device calls: tests/device_record.py's pieces, and tools/device_tests.sh end to end
on CPU (a copy of the script and tests/conftest.py in a scratch repo whose few tests pass, fail, xfail or kill
their own process, selected with ``-m "not gpu"``: on CPU the real suite's ``-m gpu`` tests are all skipped)."""
import json
import os
import shutil
import subprocess
import sys
import types

import pytest

from tests import device_record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _report(nodeid, when, outcome="passed", duration=0.5, wasxfail=None):
    report = types.SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, duration=duration,
                                   failed=outcome == "failed", skipped=outcome == "skipped")
    if wasxfail is not None:
        report.wasxfail = wasxfail
    return report


def _lines(path):
    with open(path) as record:
        return [json.loads(text) for text in record]


@pytest.mark.parametrize("phases, expected", [
    ({"setup": "passed", "call": "passed", "teardown": "passed"}, "passed"),
    ({"setup": "passed", "call": "failed", "teardown": "passed"}, "failed"),
    ({"setup": "failed", "teardown": "passed"}, "error"),
    ({"setup": "passed", "call": "passed", "teardown": "failed"}, "error"),
    ({"setup": "skipped", "teardown": "passed"}, "skipped"),
    ({"setup": "passed", "call": ("skipped", "xfail"), "teardown": "passed"}, "xfailed"),
    ({"setup": "passed", "call": ("passed", "xfail"), "teardown": "passed"}, "xpassed"),
], ids=["passed", "failed", "setup-error", "teardown-error", "skipped", "xfailed", "xpassed"])
def test_recorder_writes_each_test_once_its_teardown_is_reported(tmp_path, phases, expected):
    path = str(tmp_path / "record.jsonl")
    recorder = device_record.Recorder(path)
    for when, outcome in phases.items():
        outcome, wasxfail = outcome if isinstance(outcome, tuple) else (outcome, None)
        assert not os.path.exists(path)  # nothing before the teardown: a test in flight has no line
        recorder.add(_report("tests/t.py::f[a-1]", when, outcome, duration=0.25, wasxfail=wasxfail))
    assert _lines(path) == [{"nodeid": "tests/t.py::f[a-1]", "outcome": expected, "s": 0.25 * len(phases)}]


def test_recorders_of_several_processes_append_to_one_record(tmp_path):
    path = str(tmp_path / "record.jsonl")
    first, second = device_record.Recorder(path), device_record.Recorder(path)
    first.add(_report("t::a", "setup"))
    second.add(_report("t::b", "setup"))
    second.add(_report("t::b", "call", "failed"))
    second.add(_report("t::b", "teardown"))  # b's line goes out while a is still in flight
    first.add(_report("t::a", "call"))
    first.add(_report("t::a", "teardown"))
    assert [(line["nodeid"], line["outcome"]) for line in _lines(path)] == [("t::b", "failed"), ("t::a", "passed")]


def test_read_takes_the_last_line_of_a_test_and_skips_a_cut_line(tmp_path):
    path = tmp_path / "record.jsonl"
    path.write_text('{"nodeid": "t::a", "outcome": "failed", "s": 3.0}\n'
                    '{"nodeid": "t::b", "outcome": "passed", "s": 2.0}\n'
                    '{"nodeid": "t::c", "outcome": "xfailed"}\n'
                    '{"nodeid": "t::d", "outcome": "skipped", "s": 0.0}\n'
                    '{"nodeid": "t::a", "outcome": "passed", "s": 1.5}\n'
                    '{"nodeid": "t::e", "outc')
    lines = device_record.read(str(path))
    assert sorted(lines) == ["t::a", "t::b", "t::c", "t::d"]
    assert device_record.done(lines) == {"t::a", "t::b", "t::c"}  # skipped runs again
    assert device_record.durations(lines) == {"t::a": 1.5, "t::b": 2.0, "t::d": 0.0}
    assert device_record.summary(str(path)).startswith(f"record {path}: 4 tests (2 passed, 1 skipped, 1 xfailed)")


def test_read_of_a_missing_record_names_the_path(tmp_path):
    with pytest.raises(ValueError, match="record '.*nowhere.jsonl': no such file"):
        device_record.read(str(tmp_path / "nowhere.jsonl"))


def test_balance_puts_longest_first_into_the_least_loaded_shard():
    nodeids = ["t::a[0]", "t::a[1]", "t::b", "t::c[0]", "t::c[1]", "t::c[2]", "t::d"]
    seconds = {"t::a[0]": 4.0, "t::a[1]": 4.0, "t::b": 5.0, "t::c[0]": 1.0, "t::c[1]": 1.0, "t::c[2]": 1.0}
    # By hand: d weighs the median 2.5, the total 18.5, so pieces weigh <= 18.5 / 2 / 4 = 2.31 unless one case is
    # heavier: [a0] 4, [a1] 4, [b] 5, [c0 c1] 2, [c2] 1, [d] 2.5. Heaviest first into the lighter shard:
    # b -> 0 (5), a0 -> 1 (4), a1 -> 1 (8), d -> 0 (7.5), c0 c1 -> 0 (9.5), c2 -> 1 (9).
    assert device_record.balance(nodeids, 2, seconds) == [1, 1, 0, 0, 0, 1, 0]
    assert device_record.balance(nodeids, 1, seconds) == [0] * 7


def test_balance_without_durations_keeps_a_functions_cases_together_by_count():
    nodeids = [f"t::f[{n}]" for n in range(6)] + [f"t::g[{n}]" for n in range(2)] + ["t::h", "t::i"]
    shard_of = device_record.balance(nodeids, 3, {})  # cap 10 / 3 / 4 = 0.83: every case its own piece
    assert sorted(shard_of.count(shard) for shard in range(3)) == [3, 3, 4]
    shard_of = device_record.balance(nodeids, 2, {})  # cap 1.25: one case a piece again
    assert sorted(shard_of.count(shard) for shard in range(2)) == [5, 5]
    wide = [f"t::f[{n}]" for n in range(8)] + [f"t::g[{n}]" for n in range(8)]
    shard_of = device_record.balance(wide, 2, {})  # cap 2: pieces of two consecutive cases of one function
    assert all(shard_of[n] == shard_of[n + 1] for n in range(0, 16, 2))
    assert sorted(shard_of.count(shard) for shard in range(2)) == [8, 8]
    with pytest.raises(ValueError, match="shards must be >= 1"):
        device_record.balance(wide, 0, {})


def test_conftest_names_the_variable_of_a_bad_shard_or_record(tmp_path):
    from tests import conftest

    assert conftest._parse_shard("2/6") == (2, 6)
    for bad in ("6/6", "3", "-1/4", "a/b", "1/0"):
        with pytest.raises(pytest.UsageError, match="JFA_TEST_SHARD must be i/n with 0 <= i < n"):
            conftest._parse_shard(bad)
    with pytest.raises(pytest.UsageError, match="JFA_TEST_RESUME: record .* no such file"):
        conftest._read_record("JFA_TEST_RESUME", str(tmp_path / "nowhere.jsonl"))


def test_kernel_repeats_counts_the_kernels_several_processes_used_by_who_used_them(tmp_path):
    manifest = tmp_path / "triton_manifest.jsonl"
    uses = [("k1", 1, "tests/a.py::test_f[0] (call)"), ("k1", 2, "tests/a.py::test_f[1] (call)"),
            ("k1", 3, "tests/a.py::test_f[7] (setup)"),  # one function in 3 processes: 2 repeats a grouping saves
            ("k2", 1, "tests/a.py::test_f[0] (call)"), ("k2", 2, "tests/b.py::test_g (call)"),  # 1 shared repeat
            ("k3", 2, None), ("k3", 3, None),  # outside any test: 1 shared repeat
            ("k4", 3, "tests/b.py::test_g (call)")]  # one process: no repeat
    manifest.write_text("".join(json.dumps({"fn": "m:k", "hash": kernel, "pid": pid, "test": test}) + "\n"
                                for kernel, pid, test in uses))
    assert device_record.kernel_repeats(str(manifest)) == (
        f"manifest {manifest}: 8 kernel first uses in 3 processes, 4 kernels, 4 repeats of a kernel another process "
        "used: 2 of kernels one test function alone used (one shard per function saves them), 2 of kernels several "
        "functions (or no test) used")
    manifest.write_text(json.dumps({"hash": "k1", "pid": 1}) + "\n" + json.dumps({"hash": "k1", "pid": 2}) + "\n")
    assert device_record.kernel_repeats(str(manifest)).endswith(
        "1 kernels, 1 repeats of a kernel another process used (no test names in this manifest: written before "
        "stop 44)")


FAKE_TESTS = '''
import os
import signal

import pytest


@pytest.mark.parametrize("case", range(4))
def test_passes(case):
    pass


def test_fails_until_fixed():
    assert os.environ.get("FAKE_FIXED") == "1"


@pytest.mark.xfail(strict=True)
def test_xfails():
    assert False


def test_killed_in_flight():  # a shard cut by its time limit, as a kill of the process mid-test
    if os.environ.get("FAKE_KILL") == "1":
        os.kill(os.getpid(), signal.SIGKILL)
'''


def _scratch_repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    (repo / "tests").mkdir()
    shutil.copy(os.path.join(ROOT, "tools", "device_tests.sh"), repo / "tools")
    for name in ("conftest.py", "device_record.py", "__init__.py"):
        shutil.copy(os.path.join(ROOT, "tests", name), repo / "tests")
    (repo / "tests" / "test_fake.py").write_text(FAKE_TESTS)
    (repo / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a CUDA device\n")
    return repo


def _device_tests(repo, out, **env):
    # python3 of this venv: the script calls python3, and the scratch repo's conftest imports torch and hypothesis
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    environ = {**os.environ, "PATH": path, "OUT": str(out), "SHARD_TIMEOUT_S": "120", **env}
    for name in ("PYTHONPATH", "RESUME", "DURATIONS", "RECORD", "SHARD_BY", "JFA_TEST_SHARD", "JFA_TEST_RECORD",
                 "JFA_TEST_RESUME", "JFA_TEST_DURATIONS", "JFA_TEST_SHARD_BY"):
        if name not in env:
            environ.pop(name, None)
    out.mkdir()
    return subprocess.run(["bash", "tools/device_tests.sh", "2", "-m", "not gpu"], cwd=repo,
                          env=environ, capture_output=True, text=True, timeout=300)


def _outcomes(path):
    return {nodeid.split("::")[1]: line["outcome"] for nodeid, line in device_record.read(str(path)).items()}


def test_device_tests_records_resumes_and_finishes_across_calls(tmp_path):
    repo = _scratch_repo(tmp_path)
    first = _device_tests(repo, tmp_path / "out1", FAKE_KILL="1")
    assert first.returncode == 1, first.stdout + first.stderr
    # every test but the one in flight when its shard died has its line; the killed shard's log came back
    assert _outcomes(tmp_path / "out1" / "gpu_record.jsonl") == {
        "test_passes[0]": "passed", "test_passes[1]": "passed", "test_passes[2]": "passed",
        "test_passes[3]": "passed", "test_fails_until_fixed": "failed", "test_xfails": "xfailed"}
    assert (tmp_path / "out1" / "failed_shards.tgz").exists()
    assert "6 tests (4 passed, 1 failed, 1 xfailed); 5 need not run again" in first.stdout

    # call 2: the lead carries the record in the checkout (a path relative to the repo root)
    (repo / ".gpu_record").mkdir()
    shutil.copy(tmp_path / "out1" / "gpu_record.jsonl", repo / ".gpu_record" / "record.jsonl")
    second = _device_tests(repo, tmp_path / "out2", FAKE_FIXED="1", RESUME=".gpu_record/record.jsonl")
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.count("resume: 5 of 7 selected tests deselected as already passed in "
                               f"{repo}/.gpu_record/record.jsonl") == 2
    assert second.stdout.count("shards: test functions' cases balanced by the durations in ") == 2
    assert second.stdout.count("1 passed") == 2  # the two left, one a shard (two functions, two pieces)
    assert set(_outcomes(tmp_path / "out2" / "gpu_record.jsonl").values()) == {"passed", "xfailed"}
    assert len(_outcomes(tmp_path / "out2" / "gpu_record.jsonl")) == 7  # both calls in one record
    assert "7 tests (6 passed, 1 xfailed); 7 need not run again" in second.stdout

    # call 3 from the complete record: nothing left, which is no failure
    third = _device_tests(repo, tmp_path / "out3", RESUME=str(tmp_path / "out2" / "gpu_record.jsonl"))
    assert third.returncode == 0, third.stdout + third.stderr
    assert third.stdout.count("resume: 7 of 7 selected tests deselected") == 2

    missing = _device_tests(repo, tmp_path / "out4", RESUME="nowhere.jsonl")
    assert missing.returncode == 2 and f"RESUME={repo}/nowhere.jsonl: no such file" in missing.stdout
