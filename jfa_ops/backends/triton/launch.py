"""One launch path for every GPU kernel of the package: arguments by name, compiled kernels cached per specialization
key, launched directly through the compiled kernel's launcher.

Why: ``kernel[grid](*args)`` makes Triton bind and specialize every argument on every call (tens of microseconds for
~40 arguments, most of a small call's host time). Here the first call of a *specialization key* goes through that
path (compiling if needed) and caches the ``CompiledKernel`` it returns; later calls with the same key go straight
to ``CompiledKernel.run`` (the launcher Triton itself calls at the end of ``JITFunction.run``; same signature in Triton
3.6 and 3.9: grid, stream, function, packed metadata, launch metadata, enter/exit hooks, then every argument in the
kernel's order, constexprs included).

The key is Triton's own specialization of each argument (``native_specialize_impl``, the C++ function its binder
calls: dtype and 16-byte alignment of pointers, ints == 1 / divisible by 16 / their width, descriptor types), plus
the constexpr values, the launch options and the current device; what is skipped is the rest of Triton's per-call
work (binding, option parsing, cache-key strings, global checks). ``JFA_LAUNCH_VERIFY=1`` checks every direct launch
against the binary Triton's JIT picks (the GPU suite runs with it).

Arguments are passed by name (``launch(kernel, grid, args)`` with ``args`` a dict): the names must be exactly the
kernel's parameters, so a swapped or missing stride fails with a TypeError instead of compiling. Under
``TRITON_INTERPRET=1`` every call goes through ``kernel[grid](**args)``. While a backend is traced into a
torch.compile graph (``backends.base.traced()``), ``launch`` records the kernel through ``torch.library.wrap_triton``
instead: a ``triton_kernel_wrapper`` node that Inductor compiles and launches with its own launcher.
"""
from __future__ import annotations

import collections
import os
from typing import Callable, Dict, Tuple

import torch
from triton import knobs
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

from ..base import launch_dropped, tracing
from . import ttir_compat
from .configs import interpreting

LAUNCHES: collections.Counter = collections.Counter()  # launches per kernel name through launch() (tests count them)
VERIFY = os.environ.get("JFA_LAUNCH_VERIFY", "0") == "1"


def _generated(code: str) -> dict:
    """The functions ``code`` defines. Why generated: one statement per argument, no loop in Python (a loop costs
    ~0.2 us an argument, as Triton's own generated binder knows); the names are ours (kernel parameters)."""
    namespace = {"spec": native_specialize_impl, "B": BaseBackend}
    exec(code, namespace)  # noqa: S102
    return namespace


class _KernelInfo:
    """Per kernel, built once: its parameter names and ``bind(args) -> (values in order, key)``, generated code (as
    Triton's own binder is) so that a launch costs one call and no loop in Python."""

    def __init__(self, kernel):
        self.name = kernel.fn.__name__
        self.names = tuple(kernel.arg_names)
        self.name_set = frozenset(self.names)
        params = getattr(kernel, "params", None)  # None under the interpreter: no keys there
        values = ", ".join(f"args[{n!r}]" for n in self.names)
        keys = ", ".join(
            f"args[{p.name!r}]" if p.is_constexpr else
            f"spec(B, args[{p.name!r}], False, {not p.do_not_specialize}, {not p.do_not_specialize_on_alignment})"
            for p in params or ())
        code = _generated(f"def bind(args):\n    return ({values},), ({keys}{',' if keys else ''})\n"
                          f"def order(args):\n    return ({values},), None\n")
        self._bind, self._order = code["bind"], code["order"]

    def bind(self, args: Dict[str, object], specialize: bool = True):
        """(argument values in the kernel's order, their specialization, None without ``specialize``); TypeError
        naming missing/unknown names."""
        if len(args) == len(self.names):
            try:
                return self._bind(args) if specialize else self._order(args)
            except KeyError:
                pass
        missing = [n for n in self.names if n not in args]
        unknown = [n for n in args if n not in self.name_set]
        raise TypeError(f"{self.name}: arguments do not match its parameters (missing {missing}, unknown {unknown})")


_INFO: Dict[int, _KernelInfo] = {}  # by id(kernel): kernels live as long as their modules
_COMPILED: Dict[tuple, object] = {}


def _info(kernel) -> _KernelInfo:
    info = _INFO.get(id(kernel))  # by id: a JITFunction's own __hash__ goes through its source hash
    if info is None:
        info = _INFO[id(kernel)] = _KernelInfo(kernel)
    return info


def _cache_key(kernel, device: int, options: Dict[str, object], spec: tuple) -> tuple:
    return id(kernel), device, tuple(options.items()), spec


def specialization_key(kernel, args: Dict[str, object], options: Dict[str, object], device: int = 0):
    """(cache key, argument values in order) of one launch, as ``launch`` computes them (public for tests)."""
    values, spec = _info(kernel).bind(args)
    return _cache_key(kernel, device, options, spec), values


def launch(kernel, grid: Tuple[int, ...], args: Dict[str, object], **options) -> None:
    """Launch ``kernel`` (a ``triton.jit`` function) on ``grid`` with ``args`` by name and launch ``options``
    (num_warps, num_stages, ...), on the current CUDA device and stream."""
    info = _info(kernel)
    if tracing():  # recorded as a graph node (torch.compile): Inductor compiles and launches the kernel itself
        if launch_dropped():  # the split path's dry run keeps only the offset-derived values (base.hoisting)
            return
        LAUNCHES[info.name] += 1
        from torch.library import wrap_triton

        ttir_compat.install()  # torch 2.11 under Triton 3.8: its analysis of what the kernel writes needs it
        values, _ = info.bind(args, specialize=False)  # FakeTensors have no data pointers to specialize on
        wrap_triton(kernel)[grid](*values, **options)
        return
    LAUNCHES[info.name] += 1
    values, spec = info.bind(args)
    if interpreting():
        kernel[grid](*values, **options)
        return
    _launch_bound(kernel, grid, values, spec, options, torch.cuda.current_device())


def _launch_bound(kernel, grid, values, spec, options, device):
    """Launch bound arguments (``values`` in the kernel's order, their specialization ``spec``) with the compiled
    kernel cached for them; returns it (None when Triton gave no ``CompiledKernel`` to cache)."""
    key = _cache_key(kernel, device, options, spec)
    compiled = _COMPILED.get(key)
    if compiled is None:  # first call of this key: Triton binds, specializes, compiles (or loads) and launches
        compiled = kernel[grid](*values, **options)
        if not hasattr(compiled, "packed_metadata"):
            return None
        _COMPILED[key] = compiled
        return compiled
    if VERIFY:
        _verify(kernel, compiled, grid, values, options)
    _run(compiled, grid, values, device)
    return compiled


class _Plan:
    """One call site's launch with its static arguments bound: the argument list in the kernel's order (the dynamic
    slots refilled per call), where each dynamic argument goes, and the specialization it had when the plan was
    made (a call whose dynamic arguments specialize otherwise, e.g. a misaligned tensor, takes ``launch``).
    ``refill(values, dynamic)`` writes the dynamic arguments into their slots and returns their specialization
    (generated code)."""

    __slots__ = ("compiled", "values", "slots", "spec", "refill")

    def __init__(self, compiled, values, slots, spec):
        self.compiled, self.values, self.slots, self.spec = compiled, values, slots, tuple(spec)
        fills = "".join(f"    values[{index}] = dynamic[{name!r}]\n" for name, (index, _, _) in slots.items())
        specs = ", ".join(f"spec(B, values[{index}], False, {specialize}, {align})"
                          for index, specialize, align in slots.values())
        self.refill = _generated(f"def refill(values, dynamic):\n{fills}    return ({specs}{',' if specs else ''})\n"
                                 )["refill"]


_PLANS: Dict[tuple, _Plan] = {}
PLANS_ENABLED = True  # False: every launch_planned call takes launch (tools/host_profile.py's A/B)
_PLANS_MAX = 256  # a bound, not a tuning: keys hold no sizes that vary per batch


def launch_planned(kernel, plan_key: tuple, grid: Tuple[int, ...], dynamic: Dict[str, object],
                   static: Callable[[], Dict[str, object]], **options) -> None:
    """``launch(kernel, grid, {**static(), **dynamic}, **options)``, cheaper when called again with ``plan_key``.

    Why: a small call's host time is mostly Python per launch (building ~45 arguments, binding and specializing each;
    bench/NOTES.md v7-v8). ``plan_key`` must determine every value ``static()`` returns (dtypes, heads, head_dim,
    strides, options, schedule kind, device); ``dynamic`` holds what changes between batches (tensors, row counts).
    The first call of a key binds everything and keeps the argument list; later calls refill only the dynamic slots,
    specialize only them, and launch the compiled kernel directly. ``JFA_LAUNCH_VERIFY=1`` also checks that
    ``static()`` still gives the bound values (a key that misses something fails loudly)."""
    if tracing() or interpreting() or not PLANS_ENABLED:
        launch(kernel, grid, {**static(), **dynamic}, **options)
        return
    device = torch.cuda.current_device()
    key = (id(kernel), device, plan_key, tuple(options.items()))
    plan = _PLANS.get(key)
    if plan is not None:
        values = plan.values.copy()
        if plan.refill(values, dynamic) == plan.spec:
            info = _INFO[id(kernel)]
            LAUNCHES[info.name] += 1
            if VERIFY:
                _verify_plan(kernel, plan, grid, {**static(), **dynamic}, options)
            _run(plan.compiled, grid, values, device)
            return
    info = _info(kernel)  # no plan, or this call specializes otherwise: bind everything once, launch, plan
    LAUNCHES[info.name] += 1
    values, spec = info.bind({**static(), **dynamic})
    compiled = _launch_bound(kernel, grid, values, spec, options, device)
    if compiled is None:
        return
    names = info.names
    slots = {}
    for name in dynamic:
        index = names.index(name)
        param = kernel.params[index]
        if param.is_constexpr:  # its value is part of the compiled kernel: it belongs in plan_key and static()
            raise TypeError(f"{kernel.fn.__name__}: constexpr {name} passed as a dynamic argument")
        slots[name] = (index, not param.do_not_specialize, not param.do_not_specialize_on_alignment)
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    # the template keeps no argument of this call (each call refills its dynamic slots): holding them kept the first
    # batch's tensors alive for as long as the plan, and a plan made inside a CUDA-graph tree's warm-up or recording
    # kept tensors of its memory pool that are no outputs (torch.compile mode="reduce-overhead" failed on the H200
    # with the op opaque: "tensors in the cudagraph pool not tracked as outputs", bench/NOTES.md v24)
    template = list(values)
    for index, _, _ in slots.values():
        template[index] = None
    _PLANS[key] = _Plan(compiled, template, slots, [spec[i] for i, _, _ in slots.values()])


REPLAYS_ENABLED = True  # False: no PlanGroup kept or used, callers take their full path (tools/host_profile.py's A/B)


def replays_enabled() -> bool:
    """PlanGroups (forward replays, backward recipes) apply: CUDA launches through plans (not the interpreter, not
    traced)."""
    return REPLAYS_ENABLED and PLANS_ENABLED and not tracing() and not interpreting()


def _run(compiled, grid, values, device) -> None:
    """``CompiledKernel.run`` on the current stream: what ``JITFunction.run`` ends with, less the launch hooks'
    work when no hook is installed. Why: Triton's hooks are ``HookChain``s, never None, so its ``launch_metadata``
    builds a dict for every launch and its launcher calls both (empty) chains: ~2 us a launch for nobody (CPU,
    triton 3.9); None for the metadata and the hooks is what the launcher takes for "no hook"."""
    stream = torch._C._cuda_getCurrentRawStream(device)
    grid_1 = grid[1] if len(grid) > 1 else 1
    grid_2 = grid[2] if len(grid) > 2 else 1
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if _hooked(enter) or _hooked(leave):
        metadata = compiled.launch_metadata(grid, stream, *values)
    else:
        metadata = enter = leave = None
    compiled.run(grid[0], grid_1, grid_2, stream, compiled.function, compiled.packed_metadata, metadata, enter, leave,
                 *values)


def _hooked(hook) -> bool:
    """A launch hook that does something: not None, and not an empty ``HookChain`` (a plain function counts)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _verify_plan(kernel, plan, grid, args, options) -> None:
    values, _ = _info(kernel).bind(args, specialize=False)
    wrong = [name for name, a, b in zip(_info(kernel).names, values, plan.values)
             if name not in plan.slots and not (a is b or a == b)]
    if wrong:
        raise RuntimeError(f"launch plan of {kernel.fn.__name__}: its key misses what sets {wrong}")
    _verify(kernel, plan.compiled, grid, values, options)


def _verify(kernel, compiled, grid, values, options) -> None:
    """The binary Triton's JIT would pick for these arguments must be the cached one."""
    expected = kernel.warmup(*values, grid=grid, **options)
    if getattr(expected, "hash", None) != compiled.hash:
        raise RuntimeError(f"launch cache picked {compiled.hash} for {kernel.fn.__name__}, Triton picks "
                           f"{getattr(expected, 'hash', None)}: the specialization key misses something")


def clear_cache() -> None:
    _COMPILED.clear()
    _PLANS.clear()
    for clear in CLEAR_HOOKS:
        clear()


CLEAR_HOOKS: list = []  # callers' memos built on plans (replays, recipes: PlanGroups): cleared with them


# ------------------------------------------------- per call signature: plans launched together (replays, recipes)


def plan_group(launches, order=None, trusted=()) -> "PlanGroup | None":
    """The ``PlanGroup`` of launches a call just made through ``launch_planned`` on the current device:
    ``(kernel, plan_key, sources, options)`` each, as those calls had them (``sources``, ``order`` and ``trusted`` as
    ``PlanGroup`` takes them). None where a launch kept no plan (Triton gave no ``CompiledKernel``) or its constants
    specialize otherwise than its plan (a plan another call made): the caller keeps no reuse and takes its full
    path."""
    device, plans = torch.cuda.current_device(), []
    for kernel, plan_key, sources, options in launches:
        plan = _PLANS.get((id(kernel), device, plan_key, tuple(options.items())))
        if plan is None:
            return None
        plans.append((kernel, plan, sources, options))
    try:
        return PlanGroup(plans, order, trusted)
    except ValueError:
        return None


class PlanGroup:
    """The one reuse mechanism above plans: a call signature's launches, all or none, their per-call arguments
    named by *sources* shared between slots (one tensor feeding six slots of three kernels is one source). A caller
    keeps one per signature after its full path launched (``plan_group``): the forward's replays (attn_fwd._Replay:
    one launch, its ints constants of the signature) and the backward's recipes (attn_bwd._Recipe: three launches,
    ints per call). What a later call of the signature skips: everything its caller derives from the signature
    (configs, strides, schedules, argument dicts, plan keys) and binding the static arguments.

    ``launch(grids, *values, **sources)`` fills every plan's dynamic slots, specializes each source once and, when
    every source specializes as when the plans were made (dtype, 16-byte alignment, int width: Triton's key),
    launches the plans in order and returns True; else it launches nothing and returns False (the caller takes its
    full path, whose ``launch_planned`` calls re-plan). ``launches``: ``(kernel, plan, {slot name: source name or
    constant}, options)`` per kernel (``options``: the launch options the plan was made with), covering each plan's
    dynamic slots; a constant (not a str) is written into the plan's argument list once, here. A source specializes
    as each of its slots does (``do_not_specialize`` differs between kernels: one specialization per distinct way);
    ``launch`` ignores sources no slot names. Under ``JFA_LAUNCH_VERIFY=1`` each launch is checked against Triton's
    own choice of binary. Generated code, as ``_Plan.refill``.

    ``order``: source names in the order ``launch`` takes them positionally (every source a slot names among them;
    others are accepted and ignored): a positional call costs less than ~25 keywords (tiny calls, bench/NOTES.md
    "tiny-call backend host floor"). ``trusted``: sources whose specialization the caller vouches for on a call made
    with ``launch(..., trusted=True)`` (their slots are filled, not specialized): ints a caller derived from sizes it
    checked with a full ``launch`` before, fresh allocations of a dtype the caller's key fixes (the allocators
    align to >= 64 bytes). ``launch(..., trusted=False)`` (the default) specializes every source."""

    def __init__(self, launches, order=None, trusted=()):
        self.launches = [(kernel, _info(kernel).name, plan, options) for kernel, plan, _, options in launches]
        self.plans = [plan for _, plan, _, _ in launches]
        self._values = [plan.values.copy() for plan in self.plans]
        trusted = frozenset(trusted)
        sources, fills, specs, expected = [], [], {}, []
        for n, (kernel, plan, names, _) in enumerate(launches):
            if set(names) != set(plan.slots):
                raise ValueError(f"{_info(kernel).name}: sources {sorted(names)} do not name the plan's dynamic "
                                 f"slots {sorted(plan.slots)}")
            for position, (slot, (index, specialize, align)) in enumerate(plan.slots.items()):
                source = names[slot]
                if not isinstance(source, str):  # a constant: its specialization is checked once, here
                    if native_specialize_impl(BaseBackend, source, False, specialize, align) != plan.spec[position]:
                        raise ValueError(f"{_info(kernel).name}: constant {slot}={source!r} specializes otherwise "
                                         f"than the plan's")
                    self._values[n][index] = source
                    continue
                if source not in sources:
                    sources.append(source)
                fills.append(f"    v{n}[{index}] = {source}\n")
                way = (source, specialize, align)
                if way not in specs:
                    specs[way] = f"spec(B, {source}, False, {specialize}, {align})"
                    expected.append(plan.spec[position])
                elif expected[list(specs).index(way)] != plan.spec[position]:
                    raise ValueError(f"source {source} specialized two ways by plans of one signature")
        if order is not None:
            missing = [source for source in sources if source not in order]
            if missing or len(set(order)) != len(order):
                raise ValueError(f"order {order} must name each source once (missing {missing})")
            sources = list(order)
        self.expected = tuple(expected)
        ways = list(specs)
        self.expected_untrusted = tuple(e for way, e in zip(ways, expected) if way[0] not in trusted)
        copies = "".join(f"    v{n} = templates[{n}].copy()\n" for n in range(len(launches)))
        params = "".join(f"{source}, " for source in sources)
        body = f"{copies}{''.join(fills)}    return ({', '.join(f'v{n}' for n in range(len(launches)))},), "

        def fill(name, ways_):
            checks = [specs[way] for way in ways_]
            return _generated(f"def {name}(templates, {params}**unused):\n{body}"
                              f"({', '.join(checks)}{',' if checks else ''})\n")[name]

        self._fill = fill("fill", ways)
        self._fill_trusted = fill("fill_trusted", [way for way in ways if way[0] not in trusted])

    def launch(self, grids, *values, trusted: bool = False, **sources) -> bool:
        if trusted:
            values, spec = self._fill_trusted(self._values, *values, **sources)
            expected = self.expected_untrusted
        else:
            values, spec = self._fill(self._values, *values, **sources)
            expected = self.expected
        if spec != expected:
            return False
        device = torch.cuda.current_device()
        for (kernel, name, plan, options), grid, plan_values in zip(self.launches, grids, values):
            LAUNCHES[name] += 1
            if VERIFY:
                _verify(kernel, plan.compiled, grid, plan_values, options)
            _run(plan.compiled, grid, plan_values, device)
        return True
