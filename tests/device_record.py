"""The GPU suite's record across device calls (tools/device_tests.sh; tests/conftest.py's hooks use this module).

No call of the lent machine (600 s) finishes the whole GPU suite: kernel compiles dominate. So each shard writes one
JSON line per finished test, ``{"nodeid", "outcome", "s"}``, to one record file shared by all shards (appended and
flushed line by line, so a shard killed by its time limit leaves every line it finished), and a later call
resumes from that record: the tests that passed there are deselected, and the rest are balanced over the shards by
the durations recorded (longest first into the least-loaded shard, one test function's cases together so that one
process compiles its kernels).

``python3 tests/device_record.py summary RECORD`` prints the record's counts per outcome (the device script does);
``kernel-repeats MANIFEST`` counts the kernels several shards first-used (the price of splitting a function).
Plain Python: no torch, no pytest.
"""
import collections
import json
import os
import statistics
import sys

# Outcomes a later call need not repeat: xfailed is the expected result of a strict or plain xfail. Skipped tests
# run again (a skip costs nothing, and a record made without a GPU skips every GPU test).
DONE = ("passed", "xfailed")


def read(path: str) -> dict:
    """nodeid -> its last line in the record at ``path``: a later line wins (a test that failed in call 1 and passed
    in call 2, both appended to one record, counts as passed). A line that does not parse (cut by a kill) is
    skipped."""
    if not os.path.isfile(path):
        raise ValueError(f"record {path!r}: no such file (give the path of an earlier call's gpu_record.jsonl, "
                         "carried in the checkout)")
    lines = {}
    with open(path) as record:
        for text in record:
            try:
                line = json.loads(text)
                lines[line["nodeid"]] = line
            except (ValueError, KeyError, TypeError):
                continue
    return lines


def done(lines: dict) -> set:
    """The nodeids a resumed call deselects."""
    return {nodeid for nodeid, line in lines.items() if line.get("outcome") in DONE}


def durations(lines: dict) -> dict:
    """nodeid -> seconds (setup + call + teardown), for the tests whose line has a duration."""
    return {nodeid: float(line["s"]) for nodeid, line in lines.items() if isinstance(line.get("s"), (int, float))}


def outcome(phases: dict) -> str:
    """One test's outcome from its phases' reports (``when`` -> report): a failed setup or teardown is "error";
    the call's xfail/xpass as pytest's summary names them."""
    for when in ("setup", "call", "teardown"):
        report = phases.get(when)
        if report is not None and report.failed:
            return "failed" if when == "call" else "error"
    call = phases.get("call")
    if call is None:
        return "skipped"  # skipped at setup (a skip mark or a fixture's skip)
    if hasattr(call, "wasxfail"):
        return "xfailed" if call.skipped else "xpassed"
    return call.outcome


class Recorder:
    """Appends one line per finished test to ``path``; several processes may share the file. Each line goes out in
    one ``os.write`` on an ``O_APPEND`` descriptor: the kernel places each write whole at the end, so lines of
    side-by-side shards do not interleave, and a kill loses at most the test in flight."""

    def __init__(self, path: str):
        self.path = path
        self._phases = {}  # nodeid -> {when: report} of the test in flight

    def add(self, report) -> None:
        phases = self._phases.setdefault(report.nodeid, {})
        phases[report.when] = report
        if report.when != "teardown":
            return
        del self._phases[report.nodeid]
        seconds = sum(getattr(phase, "duration", 0.0) for phase in phases.values())
        line = json.dumps({"nodeid": report.nodeid, "outcome": outcome(phases), "s": round(seconds, 3)}) + "\n"
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line.encode())
        finally:
            os.close(descriptor)


def function_of(nodeid: str) -> str:
    """A test's function (its nodeid without the parametrize id): its cases share most kernel specializations."""
    return nodeid.split("[", 1)[0]


def balance(nodeids: list, shards: int, seconds: dict) -> list:
    """Shard index of each nodeid (in order): longest-processing-time first over the test functions' groups of
    cases, each into the least-loaded shard. A test without a recorded duration weighs the median of the recorded
    ones. A group heavier than a quarter of one shard's share is cut into consecutive runs of cases no heavier
    than that (LPT's makespan is at most the mean plus the largest piece: <= 1.25x the mean); keeping a function's
    cases in one process lets it compile their common kernels once instead of once per shard."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    default = statistics.median(seconds.values()) if seconds else 1.0
    weights = [seconds.get(nodeid, default) for nodeid in nodeids]
    cap = sum(weights) / shards / 4
    pieces = []  # (weight, [indices]) in collection order
    last_function = None
    for index, (nodeid, weight) in enumerate(zip(nodeids, weights)):
        function = function_of(nodeid)
        if function != last_function or pieces[-1][0] + weight > cap:
            pieces.append([0.0, []])
        pieces[-1][0] += weight
        pieces[-1][1].append(index)
        last_function = function
    load = [0.0] * shards
    shard_of = [0] * len(nodeids)
    # heaviest first; ties by collection order, so every shard's process computes the same assignment
    for weight, indices in sorted(pieces, key=lambda piece: (-piece[0], piece[1][0])):
        target = min(range(shards), key=lambda shard: (load[shard], shard))
        load[target] += weight
        for index in indices:
            shard_of[index] = target
    return shard_of


def summary(path: str) -> str:
    """The record's counts per outcome, for the device script's last line."""
    lines = read(path)
    counts = collections.Counter(str(line.get("outcome")) for line in lines.values())
    by_count = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    listed = ", ".join(f"{count} {name}" for name, count in by_count)
    return f"record {path}: {len(lines)} tests ({listed}); {len(done(lines))} need not run again (RESUME={path})"


def kernel_repeats(manifest: str) -> str:
    """How many of a sharded call's kernel first uses (tools/triton_cache_pack.py's manifest: one line per kernel a
    process compiled or loaded from the disk cache) repeat a kernel another process also used, and how many of
    those repeats are of kernels one test function alone first used (its lines' ``test``, since stop 44): the
    repeats that keeping each function's cases in one shard removes (when the function is not cut). An upper
    bound: a function that used a kernel after another had loaded it in the same process goes unnamed."""
    processes, functions = {}, {}
    with open(manifest) as lines:
        for text in lines:
            line = json.loads(text)
            processes.setdefault(line["hash"], set()).add(line["pid"])
            test = line.get("test")  # "tests/x.py::test_f[case] (call)"; None outside a test
            functions.setdefault(line["hash"], set()).add(function_of(test.rsplit(" (", 1)[0]) if test else None)
    first_uses = sum(len(pids) for pids in processes.values())
    repeats = first_uses - len(processes)
    local = sum(len(processes[kernel]) - 1 for kernel, names in functions.items()
                if len(names) == 1 and None not in names)
    named = any(names != {None} for names in functions.values())
    return (f"manifest {manifest}: {first_uses} kernel first uses in {len(set().union(*processes.values()))} "
            f"processes, {len(processes)} kernels, {repeats} repeats of a kernel another process used"
            + (f": {local} of kernels one test function alone used (one shard per function saves them), "
               f"{repeats - local} of kernels several functions (or no test) used" if named else
               " (no test names in this manifest: written before stop 44)"))


if __name__ == "__main__":
    commands = {"summary": summary, "kernel-repeats": kernel_repeats}
    if len(sys.argv) != 3 or sys.argv[1] not in commands:
        sys.exit("usage: python3 tests/device_record.py summary RECORD | kernel-repeats MANIFEST")
    print(commands[sys.argv[1]](sys.argv[2]))
