"""Does importing FlashAttention-4 slow every implementation's small calls, and is it the garbage collector?

`PYTHONPATH=$PWD python tools/host_heap_probe.py [--peers sdpa_flash,varlen,cudnn] [--calls 300] [--backend triton]`
on a CUDA machine, with FA4 on the path (bench/device_run.sh's /tmp/fa4) for the import phases. One process, the
bench's overhead case and columns (``bench.timing.eager_calls``: eager fwd, fwd+bwd, no_grad fwd; and fwd+bwd with the
backward on the calling thread, ``fwdbwd 1 thread``; ``timing.wall_us``, the bench's median of 3 windows), per
implementation (jfa:<backend> and the peers given), in phases:

1. ``fresh``: before FA4 is imported; 2. ``fresh again``: the same (the run-to-run spread of one process);
3. ``imported``: after ``import flash_attn.cute.interface`` (``--imports``; the bench's ``fa4`` peer imports it before
   anything is timed); 4. ``imported, heap frozen``: after ``gc.collect(); gc.freeze()`` (what the bench now does per
   implementation); 5. ``imported, gc off``: ``gc.disable()`` (the most the collector could cost).

Each row has the garbage collections per generation per 1000 calls and the time spent in them (``gc.callbacks``);
each phase the host's state: ``timing.host_reference_us`` (a fixed loop: the host's speed), load, threads, tracked
objects, and what an import could have installed process-wide (torch function / dispatch modes, a profile or trace
function, autograd's threading, the switch interval). Reading (bench/NOTES.md "Host cost vs heap size, stop 25"):
phase 3 slower than 1-2 while 4 is back at 1-2: the collector (heap size); 3 and 4 both slower with a global hook
listed: that hook; all phases equal: the import is innocent and two runs differ by their hosts (compare their
``host`` header lines)."""
from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
from bench import suites, timing  # noqa: E402
from bench.peers import JfaBackend, make_peer  # noqa: E402

COLUMNS = ("fwd", "fwdbwd", "fwdbwd 1 thread", "nograd")


class GcMeter:
    """Collections per generation and seconds spent in them, from ``gc.callbacks``."""

    def __init__(self):
        self.counts, self.seconds, self._t0 = [0, 0, 0], 0.0, 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.counts[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._t0

    def reset(self):
        self.counts, self.seconds = [0, 0, 0], 0.0


def one_thread(call):
    """``call`` with autograd's device threads off: the engine runs a CUDA backward on the calling thread (no hand-off
    to the device thread and back: two thread wake-ups per backward; bench/NOTES.md "host fwd+bwd")."""
    def run():
        with torch.autograd.set_multithreading_enabled(False):
            return call()
    return run


def process_state(device) -> str:
    """``timing.host_state`` (the bench header's) and what an import could have installed process-wide."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    return (f"{timing.host_state(device)} (frozen {gc.get_freeze_count() / 1e6:.2f} M), gc "
            f"{'on' if gc.isenabled() else 'off'} {gc.get_threshold()}; function modes "
            f"{torch._C._len_torch_function_stack()}, dispatch modes {len(_get_current_dispatch_mode_stack())}, "
            f"profile {sys.getprofile()}, trace {sys.gettrace()}, autograd threads "
            f"{torch.autograd.is_multithreading_enabled()}, switch interval {sys.getswitchinterval()}, "
            f"torch threads {torch.get_num_threads()}, excepthook {getattr(sys.excepthook, '__module__', '?')}")


def measure(phase: str, preps: dict, device, calls: int, meter: GcMeter) -> None:
    print(f"\n== {phase}: {process_state(device)}", flush=True)
    for name, prep in preps.items():
        cells = []
        calls_of = timing.eager_calls(prep)
        calls_of["fwdbwd 1 thread"] = one_thread(calls_of["fwdbwd"])
        for column, call in calls_of.items():
            if column not in COLUMNS:
                continue
            meter.reset()
            us = timing.wall_us(call, device, calls, windows=timing.EAGER_WINDOWS)
            n = timing.EAGER_WINDOWS * calls + 10  # wall_us's warm-up calls included
            cells.append(f"{column} {us:7.1f} us (gc {[round(c * 1000 / n, 1) for c in meter.counts]}/1000 calls, "
                         f"{meter.seconds / n * 1e6:.1f} us/call)")
        print(f"  {name:11s} " + "; ".join(cells), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default="sdpa_flash,varlen,cudnn")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--backend", default="triton", help="the jfa_ops backend (reference: a CPU smoke run)")
    parser.add_argument("--imports", default="flash_attn.cute.interface",
                        help="the module imported between phases 2 and 3 (the bench's fa4 peer imports the default)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    case = suites.build_cases(["overhead"], [128], "quick")[0]
    inputs = suites.make_inputs(case, device)
    impls = [JfaBackend(args.backend)] + [make_peer(p) for p in args.peers.split(",") if p]
    preps = {}
    for impl in impls:
        why = impl.unavailable(device)
        if why:
            print(f"{impl.name}: skipped ({why})")
            continue
        preps[impl.name] = impl.prepare(case, inputs)
    meter = GcMeter()
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {case.name}; wall us per call (bench "
          f"columns), median of {timing.EAGER_WINDOWS} x {args.calls}")
    measure("fresh", preps, device, args.calls, meter)
    measure("fresh again", preps, device, args.calls, meter)
    t0, modules = time.perf_counter(), len(sys.modules)
    try:
        importlib.import_module(args.imports)
    except Exception as e:  # noqa: BLE001
        print(f"\n{args.imports} not importable ({type(e).__name__}: {str(e)[:120]}): the import phases are skipped")
        return
    print(f"\nimported {args.imports} in {time.perf_counter() - t0:.1f} s: {len(sys.modules) - modules} new modules")
    measure("imported", preps, device, args.calls, meter)
    gc.collect()
    gc.freeze()
    measure("imported, heap frozen", preps, device, args.calls, meter)
    gc.unfreeze()
    gc.disable()
    measure("imported, gc off", preps, device, args.calls, meter)
    gc.enable()


if __name__ == "__main__":
    main()
