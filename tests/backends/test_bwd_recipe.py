"""The triton backward's per-signature recipe (attn_bwd._Recipe): on CPU, with the GPU launch path stubbed so that
every launch still runs its kernel in the Triton interpreter. A recipe must give the float64 oracle's gradients,
launch exactly what the full path launches, and never serve a call whose key (strides, dtypes, knobs, options)
differs from the one it was made for."""
from __future__ import annotations

import inspect

import pytest
import torch

pytest.importorskip("triton")

from triton.runtime.jit import KernelParam  # noqa: E402

from jfa_ops.backends.base import AttentionParams, traced  # noqa: E402
from jfa_ops.backends import triton as tb  # noqa: E402
from jfa_ops.backends.triton import attn_bwd, attn_fwd, common, configs, launch  # noqa: E402
from jfa_ops.testing import assert_attention_close  # noqa: E402
from tests.backends.test_triton_kernels import make_inputs, oracle  # noqa: E402
from tests.common import comparable_launch_values  # noqa: E402

KERNELS = ("attn_bwd_delta_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel")


class _Interpreted:
    """An interpreted kernel with the parameters of a compiled JITFunction (what launch_planned reads)."""

    def __init__(self, kernel):
        self.kernel, self.fn, self.arg_names = kernel, kernel.fn, kernel.arg_names
        skip = set(kernel.kwargs.get("do_not_specialize") or ())
        self.params = [KernelParam(i, p, p.name in skip, False)
                       for i, p in enumerate(inspect.signature(kernel.fn).parameters.values())]

    def __getitem__(self, grid):
        return self.kernel[grid]


class _Compiled:  # a CompiledKernel stand-in: runs the interpreted kernel
    def __init__(self, kernel, options):
        self.kernel, self.options = kernel, options


@pytest.fixture
def gpu(monkeypatch):
    """launch_planned's GPU branch (plans, recipes) on CPU tensors, each launch run by the interpreter; NaN-filled
    outputs (an element no kernel writes fails the oracle). Returns the launches made: (kernel name, grid, values),
    and how the recipes answered (None: declined)."""
    runs, answers = [], []

    def first_launch(kernel, grid, values, spec, options, device):
        runs.append((kernel.fn.__name__, grid, values))
        kernel[grid](*values, **options)
        return _Compiled(kernel, options)

    def run(compiled, grid, values, device):
        runs.append((compiled.kernel.fn.__name__, grid, values))
        compiled.kernel[grid](*values, **compiled.options)

    for name in KERNELS:
        monkeypatch.setattr(attn_bwd, name, _Interpreted(getattr(attn_bwd, name)))
    monkeypatch.setattr(launch, "interpreting", lambda: False)
    monkeypatch.setattr(launch, "_launch_bound", first_launch)
    monkeypatch.setattr(launch, "_run", run)
    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(launch, "_COMPILED", {})
    monkeypatch.setattr(launch, "_INFO", {})
    monkeypatch.setattr(launch, "VERIFY", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 132)  # an H200's: small batches fit one wave
    monkeypatch.setattr(common, "alloc_output",
                        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device))
    real_run = attn_bwd._Recipe.run

    def spy(self, *args):
        grads = real_run(self, *args)
        answers.append(grads)
        return grads

    monkeypatch.setattr(attn_bwd._Recipe, "run", spy)
    attn_bwd._RECIPES.clear()  # none made for another test's stand-ins
    yield runs, answers
    attn_bwd._RECIPES.clear()


def _case(lengths, dtype=torch.float16, heads=(4, 2), head_dim=32, offsets_dtype=torch.int32, seed=0,
          with_grad_lse=False, fused=False, scale=None, kv_lengths=None, **options):
    """(backward arguments, params, oracle gradients) of one batch; out and lse from the oracle. ``fused``: q, k, v
    as slices of one [T, Hq + 2 Hkv, D] projection (row stride (Hq + 2 Hkv) D)."""
    q, k, v, q_off, kv_off = make_inputs(lengths, lengths if kv_lengths is None else kv_lengths, *heads, head_dim,
                                         dtype, "cpu", offsets_dtype=offsets_dtype, seed=seed)
    if fused:
        assert kv_lengths is None
        qkv = torch.cat([q, k, v], dim=1)
        q, k, v = qkv.split([heads[0], heads[1], heads[1]], dim=1)
    params = AttentionParams(scale=head_dim ** -0.5 if scale is None else scale, **options)
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(q.shape, generator=g).to(dtype)
    grad_lse = torch.randn((heads[0], q.shape[0]), generator=g) if with_grad_lse else None
    window = (params.window_left, params.window_right)
    if q.shape[0] == 0:  # no rows: zero gradients (the oracle has nothing to differentiate)
        empty = torch.empty(0, heads[0], head_dim, dtype=dtype)
        args = (grad_out, grad_lse, q, k, v, empty, torch.empty(heads[0], 0), q_off, kv_off)
        return args, params, (torch.zeros(q.shape), torch.zeros(k.shape), torch.zeros(v.shape))
    out64, lse64, *grads = oracle(q, k, v, q_off, kv_off, params.scale, params.causal, *window, grad_out=grad_out,
                                  grad_lse=grad_lse)
    args = (grad_out, grad_lse, q, k, v, out64.to(dtype), lse64.float(), q_off, kv_off)
    return args, params, grads


def _check(args, params, expected, dtype):
    dq, dk, dv = tb.backward(*args, params)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), expected):
        assert_attention_close(got, want, dtype=dtype, kind="grad", name=name)


def _emulate_tma(monkeypatch):
    """attn_fwd.use_tma as on an sm_90 GPU (the interpreter runs tensor descriptors; conftest lets every size use
    them)."""
    monkeypatch.setattr(attn_fwd, "_tma_device", lambda t: True)


@pytest.mark.parametrize("dtype, tma", [(torch.float16, False), (torch.float16, True), (torch.float32, False)],
                         ids=["fp16", "fp16-tma", "fp32"])
@pytest.mark.parametrize("options", [dict(causal=True), dict(window_left=5, window_right=0), dict()],
                         ids=["causal", "window", "full"])
def test_recipe_gradients_match_the_oracle(gpu, monkeypatch, dtype, tma, options):
    """Batches of one signature (other lengths, batch sizes, totals): the first call makes the recipe, the later ones
    are served by it, and every gradient matches the float64 oracle (TMA descriptors for Q/dO and K/V included)."""
    _, answers = gpu
    if tma:
        _emulate_tma(monkeypatch)
    batches = (([30, 5, 0, 29], [12, 40, 3, 29]), ([1, 40, 2], [50, 1, 2]), ([7] * 9, [3] * 9), ([64], [20]))
    for seed, (lengths, kv_lengths) in enumerate(batches):
        args, params, expected = _case(lengths, dtype, seed=seed, kv_lengths=kv_lengths, **options)
        _check(args, params, expected, dtype)
    assert len(answers) == 3 and all(a is not None for a in answers), answers


def _launches(runs, inputs):
    """Launch values comparable across calls (``comparable_launch_values``)."""
    return [(name, grid, comparable_launch_values(values, inputs)) for name, grid, values in runs]


@pytest.mark.parametrize("with_grad_lse", [False, True])
@pytest.mark.parametrize("schedule", ["static", "grid", "atomic"])
@pytest.mark.parametrize("tma", [False, True])
def test_recipe_launches_what_the_full_path_launches(gpu, monkeypatch, schedule, with_grad_lse, tma):
    """The recipe's launches (kernels, grids, every argument) equal the full path's for the same call, launch
    counters included."""
    runs, answers = gpu
    monkeypatch.setattr(configs.KNOBS, "bwd_schedule", schedule)
    if tma:
        _emulate_tma(monkeypatch)
    _case_args = [_case(lengths, seed=seed, with_grad_lse=with_grad_lse, causal=True, kv_lengths=kv_lengths)
                  for seed, (lengths, kv_lengths) in enumerate((([30, 5, 0, 29], [12, 40, 3, 29]),
                                                                ([1, 40, 2, 3, 3], [50, 1, 2, 9, 0])))]
    tb.backward(*_case_args[0][0], _case_args[0][1])  # makes the recipe
    args, params, expected = _case_args[1]
    runs.clear()
    before = launch.LAUNCHES.copy()
    _check(args, params, expected, torch.float16)
    by_recipe, counted = _launches(runs, args), launch.LAUNCHES - before
    assert answers and answers[-1] is not None
    runs.clear()
    monkeypatch.setattr(attn_bwd, "RECIPES_ENABLED", False)
    before = launch.LAUNCHES.copy()
    _check(args, params, expected, torch.float16)
    assert _launches(runs, args) == by_recipe
    assert launch.LAUNCHES - before == counted == {name: 1 for name in KERNELS}


# What differs in the second call: _case arguments, or a knob / the TMA choice set before it
CHANGES = {
    "row stride": dict(fused=True),  # q, k, v sliced out of one fused projection
    "dtype": dict(dtype=torch.float32),
    "causal": dict(causal=False),
    "window": dict(window_left=3),
    "scale": dict(scale=0.3),
    "grad_lse": dict(with_grad_lse=True),
    "knob bwd_kv_major": {},
    "knob bwd_schedule": {},
    "TMA choice": {},  # TMA descriptors for the first signature, pointers for the second
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_recipe_is_not_used_when_its_key_changes(gpu, monkeypatch, change):
    """A call that differs from the recipe's signature in something its key holds takes the full path (and makes its
    own recipe), and its gradients match the oracle. A key that missed it would launch the first signature's plans
    (wrong strides, scale, masking, precision or argument kinds)."""
    _, answers = gpu
    if change == "TMA choice":
        _emulate_tma(monkeypatch)
    args, params, expected = _case([30, 5, 0, 29], causal=True, seed=0)
    _check(args, params, expected, torch.float16)  # makes the recipe
    if change == "knob bwd_kv_major":
        monkeypatch.setattr(configs.KNOBS, "bwd_kv_major", not configs.KNOBS.bwd_kv_major)
    elif change == "knob bwd_schedule":
        monkeypatch.setattr(configs.KNOBS, "bwd_schedule", "grid")
    elif change == "TMA choice":
        monkeypatch.setattr(attn_fwd, "TMA_MIN_ROWS", 4096)
    options = dict(dict(causal=True), **CHANGES[change])
    args, params, expected = _case([1, 40, 2], seed=1, **options)
    answers.clear()
    _check(args, params, expected, options.get("dtype", torch.float16))
    assert not answers  # no recipe of the first signature was asked
    _check(args, params, expected, options.get("dtype", torch.float16))
    assert len(answers) == 1 and answers[0] is not None  # the new signature's own recipe


def test_int64_offsets_are_converted_by_the_recipe(gpu):
    """The key holds no offsets dtype: the recipe converts offsets per call as the full path does (int64 offsets
    after int32 ones; two offsets tensors, then one for both sides)."""
    _, answers = gpu
    args, params, expected = _case([30, 5, 0, 29], causal=True)
    _check(args, params, expected, torch.float16)
    args, params, expected = _case([1, 40, 2], causal=True, seed=1, offsets_dtype=torch.int64)
    _check(args, params, expected, torch.float16)
    _check(args[:7] + (args[8], args[8]), params, expected, torch.float16)
    assert len(answers) == 2 and all(a is not None for a in answers)


@pytest.mark.parametrize("schedule", ["static", "atomic"])
def test_recipe_derives_again_only_when_the_sizes_change(gpu, monkeypatch, schedule):
    """A recipe keeps what it derived from its last call's sizes (slots, programs, search steps: ~5 us of host time a
    call): a repeat of those sizes derives nothing again (atomic schedules excepted: their work counters are fresh
    zeros per call); other lengths, batch sizes or SM counts are derived again, and every call launches what the
    full path launches."""
    runs, answers = gpu
    monkeypatch.setattr(configs.KNOBS, "bwd_schedule", schedule)
    derived, derive = [], attn_bwd._Recipe._sized
    monkeypatch.setattr(attn_bwd._Recipe, "_sized", lambda self, *sizes: derived.append(sizes) or derive(self, *sizes))
    batches = (([30, 5, 0, 29], [12, 40, 3, 29]), ([1, 40, 2, 3], [50, 1, 2, 9]))  # one batch size: rows differ
    cases = [_case(lengths, seed=seed, causal=True, kv_lengths=kv_lengths)
             for seed, (lengths, kv_lengths) in enumerate(batches)]
    tb.backward(*cases[0][0], cases[0][1])  # makes the recipe
    order = (0, 1, 1)
    for n in order:
        args, params, expected = cases[n]
        _assert_recipe_launches_the_full_path(runs, monkeypatch, args, params, expected)
    assert len(answers) == len(order) and all(a is not None for a in answers)
    sizes = [(len(kv_lengths), sum(lengths), sum(kv_lengths)) for lengths, kv_lengths in batches]
    assert derived == [sizes[n] for n in (order if schedule == "atomic" else (0, 1))]
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)  # the same sizes no longer fit one wave
    _check(*cases[1], torch.float16)
    assert answers[-1] is None


def _assert_recipe_launches_the_full_path(runs, monkeypatch, args, params, expected):
    """The call launches through its recipe exactly what the full path (recipes off) launches for it."""
    runs.clear()
    _check(args, params, expected, torch.float16)
    by_recipe = _launches(runs, args)
    runs.clear()
    monkeypatch.setattr(attn_bwd, "RECIPES_ENABLED", False)
    _check(args, params, expected, torch.float16)
    monkeypatch.setattr(attn_bwd, "RECIPES_ENABLED", True)
    assert _launches(runs, args) == by_recipe


def _misaligned_grad_out(args):
    """``args`` with grad_out copied to a pointer 2 bytes off 16-byte alignment (Triton specializes it otherwise)."""
    grad_out = args[0]
    shifted = torch.empty(grad_out.numel() + 1, dtype=grad_out.dtype)[1:].view(grad_out.shape)
    shifted.copy_(grad_out)
    return (shifted,) + args[1:]


@pytest.mark.parametrize("why", ["not one wave", "misaligned tensor", "empty batch", "no rows"])
def test_recipe_declines_calls_outside_its_path(gpu, monkeypatch, why):
    """Sizes that take another path (sorted work lists, early returns) or specialize otherwise (a misaligned pointer)
    make the recipe decline before any launch: the full path runs (three launches, not six) and the gradients are
    right."""
    runs, answers = gpu
    args, params, expected = _case([30, 5, 0, 29], causal=True)
    _check(args, params, expected, torch.float16)
    args, params, expected = _case([1, 40, 2], causal=True, seed=1)
    if why == "not one wave":
        monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)
    elif why == "misaligned tensor":
        args = _misaligned_grad_out(args)
    elif why == "empty batch":
        args, params, expected = _case([], causal=True, seed=1)
    elif why == "no rows":
        args, params, expected = _case([0, 0], causal=True, seed=1)
    answers.clear()
    before = launch.LAUNCHES.copy()
    _check(args, params, expected, torch.float16)
    assert answers == [None]
    if why == "misaligned tensor":
        assert launch.LAUNCHES - before == {name: 1 for name in KERNELS}


@pytest.mark.parametrize("repeat_ok", [False, True])
def test_repeated_sizes_skip_only_what_they_fixed(gpu, monkeypatch, repeat_ok):
    """A call whose sizes equal the recipe's last call's launches ``trusted`` (the ints derived from the sizes and
    the fresh outputs are not specialized again): it launches what the full path launches, and an input that
    specializes otherwise (a misaligned dO) still makes it decline before any launch. Only a launched call keeps
    its sizes: after a declined one (``repeat_ok`` False) the full path re-plans for the misaligned tensor, its
    recipe declines the next aligned call, and the recipe made then specializes everything once more."""
    runs, answers = gpu
    args, params, expected = _case([30, 5, 0, 29], causal=True)
    _check(args, params, expected, torch.float16)  # makes the recipe
    args, params, expected = _case([1, 40, 2], causal=True, seed=1)
    misaligned = _misaligned_grad_out(args)
    trusted, launch_group = [], launch.PlanGroup.launch
    monkeypatch.setattr(launch.PlanGroup, "launch",
                        lambda self, *a, **k: trusted.append(k.get("trusted")) or launch_group(self, *a, **k))
    answers.clear()
    if not repeat_ok:
        _check(misaligned, params, expected, torch.float16)
    for _ in range(3):
        _check(args, params, expected, torch.float16)
    assert trusted == ([False, True, True] if repeat_ok else [False, False, False, True])
    assert all(a is not None for a in answers[-2:])  # the last two served by the recipe
    _assert_recipe_launches_the_full_path(runs, monkeypatch, args, params, expected)
    answers.clear()
    before = launch.LAUNCHES.copy()
    _check(misaligned, params, expected, torch.float16)  # the memo's sizes: trusted, but dO is still specialized
    assert answers == [None] and trusted[-1] is True
    assert launch.LAUNCHES - before == {name: 1 for name in KERNELS}  # the full path's three, none of the recipe's


@pytest.mark.parametrize("where", ["interpreter", "tracing", "plans off", "replays off", "switched off",
                                   "broadcast Q"])
def test_no_recipe_where_the_full_path_must_run(gpu, monkeypatch, where):
    """No recipe is looked up or made under the interpreter, tracing, launch plans or replays off, RECIPES_ENABLED
    off, or for broadcast Q."""
    args, params, _ = _case([30, 5, 0, 29], causal=True)
    if where == "broadcast Q":
        params = AttentionParams(scale=params.scale, broadcast_q=True)
    setting = {"interpreter": (launch, "interpreting", lambda: True),
               "plans off": (launch, "PLANS_ENABLED", False), "replays off": (launch, "REPLAYS_ENABLED", False),
               "switched off": (attn_bwd, "RECIPES_ENABLED", False)}
    if where in setting:
        monkeypatch.setattr(*setting[where])
    if where == "tracing":
        with traced():
            assert attn_bwd._recipe_key(args[0], args[1], *args[2:6], params) is None
    else:
        assert attn_bwd._recipe_key(args[0], args[1], *args[2:6], params) is None


def test_recipe_launches_are_verified_under_launch_verify(gpu, monkeypatch):
    """JFA_LAUNCH_VERIFY=1 (the GPU suite): recipes still serve, and each of their launches is checked against
    Triton's own choice of binary (launch._verify: a stand-in here) with the arguments it launches."""
    runs, answers = gpu
    monkeypatch.setattr(launch, "VERIFY", True)
    checked = []
    monkeypatch.setattr(launch, "_verify", lambda kernel, compiled, grid, values, options: checked.append(
        (kernel.fn.__name__, grid, values, options)))
    args, params, expected = _case([30, 5, 0, 29], causal=True)
    _check(args, params, expected, torch.float16)
    args, params, expected = _case([1, 40, 2], causal=True, seed=1)
    checked.clear()
    runs.clear()
    _check(args, params, expected, torch.float16)
    assert len(answers) == 1 and answers[0] is not None
    assert [name for name, *_ in checked] == list(KERNELS)
    assert all(c[1] == r[1] and c[2] is r[2] for c, r in zip(checked, runs))  # the grids and values launched
    assert checked[1][3] == dict(num_warps=1, num_stages=1)  # the interpreter config's options


def test_clear_cache_drops_the_recipes(gpu):
    """Recipes hold launch plans: launch.clear_cache() drops both, and the next call binds anew."""
    runs, answers = gpu
    args, params, expected = _case([30, 5, 0, 29], causal=True)
    _check(args, params, expected, torch.float16)
    launch.clear_cache()
    answers.clear()
    _check(args, params, expected, torch.float16)
    assert not answers and launch._PLANS


def test_plan_group_sources_must_name_every_dynamic_slot(gpu):
    """launch.PlanGroup refuses sources that miss a plan's dynamic slot or name one it does not have (a slot left
    unfilled would launch the previous call's tensor), and constants that specialize otherwise than the plan's."""
    args, params, expected = _case([30, 5, 0, 29], causal=True)
    _check(args, params, expected, torch.float16)
    recipe, = attn_bwd._RECIPES.values()
    kernel = attn_bwd.attn_bwd_delta_kernel
    plan = recipe.group.plans[0]
    missing = {name: source for name, source in attn_bwd._DELTA_SOURCES.items() if name != "GradLse"}
    with pytest.raises(ValueError, match="GradLse"):
        launch.PlanGroup([(kernel, plan, missing, {})])
    with pytest.raises(ValueError, match="stride_ot"):
        launch.PlanGroup([(kernel, plan, dict(attn_bwd._DELTA_SOURCES, stride_ot="out"), {})])
    with pytest.raises(ValueError, match="constant zero_rows="):  # a constant must specialize as the plan's
        launch.PlanGroup([(kernel, plan, dict(attn_bwd._DELTA_SOURCES, zero_rows=2 ** 40 + 7), {})])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim, heads", [(128, (8, 8)), (64, (4, 2))])
@pytest.mark.parametrize("tma_min_rows", [0, 4096], ids=["tma", "pointers"])
def test_recipe_matches_the_full_path_gpu(monkeypatch, dtype, head_dim, heads, tma_min_rows):
    """On the GPU (under JFA_LAUNCH_VERIFY=1 in the suite: each recipe launch verified): the recipe serves the later
    batches of a signature and its gradients equal the full path's bit for bit (same kernels, same arguments, no
    atomics on this path; TMA descriptors on sm_90 where TMA_MIN_ROWS allows), and match the oracle."""
    monkeypatch.setattr(attn_fwd, "TMA_MIN_ROWS", tma_min_rows)  # conftest lowers it to 0 for every test
    answers = []
    real_run = attn_bwd._Recipe.run

    def spy(self, *args):
        answers.append(real_run(self, *args))
        return answers[-1]

    monkeypatch.setattr(attn_bwd._Recipe, "run", spy)
    for seed, lengths in enumerate(([30, 5, 0, 29], [1, 64, 2], [17] * 7)):
        q, k, v, q_off, kv_off = make_inputs(lengths, lengths[::-1], *heads, head_dim, dtype, "cuda", seed=seed)
        params = AttentionParams(scale=head_dim ** -0.5, causal=True)
        out, lse = tb.forward(q, k, v, q_off, kv_off, params)
        grad_out = torch.randn_like(out)
        grads = tb.backward(grad_out, None, q, k, v, out, lse, q_off, kv_off, params)
        monkeypatch.setattr(attn_bwd, "RECIPES_ENABLED", False)
        full = tb.backward(grad_out, None, q, k, v, out, lse, q_off, kv_off, params)
        monkeypatch.setattr(attn_bwd, "RECIPES_ENABLED", True)
        for name, got, want in zip(("dq", "dk", "dv"), grads, full):
            assert torch.equal(got, want), name
        expected = oracle(q, k, v, q_off, kv_off, params.scale, True, grad_out=grad_out)[2:]
        for name, got, want in zip(("dq", "dk", "dv"), grads, expected):
            assert_attention_close(got, want, dtype=dtype, kind="grad", name=name)
    assert len(answers) == 2 and all(a is not None for a in answers), answers
