"""Extraction, task loading, comparison, reward and verdict decisions: pure pieces with exact expectations."""

import json
import os
import signal
import time

import pytest
import torch

from musacoder.candidates import ExtractionError, extract_code
from musacoder.config import VerifyConfig
from musacoder.tasks import TaskLoadError, builtin_tasks, load_tasks
from musacoder.verifier import inputs as inp
from musacoder.verifier.correctness import compare, inputs_unchanged
from musacoder.verifier.pipeline import decide
from musacoder.verifier.protocol import Facts
from musacoder.verifier.reward import reward
from musacoder.verifier.static import StaticResult
from musacoder.verifier.verdict import Status, Verdict

TASK = "import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n        return x\n" \
       "def get_inputs():\n    return [torch.rand(4)]\ndef get_init_inputs():\n    return []\n"


def test_extract_last_python_block_after_think():
    raw = ("<think>```python\nclass ModelNew: wrong\n```</think>Here:\n```python\nA = 1\n```\ntext\n"
           "```python\nclass ModelNew: pass\n```\n```\nplain\n```")
    assert extract_code(raw).strip() == "class ModelNew: pass"


def test_extract_plain_source_and_errors():
    assert extract_code("class ModelNew: pass\n").startswith("class ModelNew")
    with pytest.raises(ExtractionError):
        extract_code("<think>```python\nclass ModelNew: pass\n```</think> sorry, no code")
    with pytest.raises(ExtractionError):
        extract_code("```python\nclass ModelNew: pass\n")  # unterminated


def test_load_tasks_py_dir_jsonl(tmp_path):
    d = tmp_path / "level1"
    d.mkdir()
    (d / "7_Id.py").write_text(TASK)
    (tmp_path / "t.jsonl").write_text(json.dumps({"level": 2, "problem_id": 3, "name": "3_X", "code": TASK}) + "\n")
    [t] = load_tasks(tmp_path, levels=[1])
    assert (t.level, t.problem_id, t.key) == (1, 7, "level1/7_Id")
    [j] = load_tasks(tmp_path / "t.jsonl")
    assert j.key == "level2/3_X"
    assert len(builtin_tasks()) >= 5


def test_bad_tasks_name_the_task(tmp_path):
    (tmp_path / "9_Broken.py").write_text("class Model:\n    pass\n")
    with pytest.raises(TaskLoadError, match="9_Broken.*missing get_inputs"):
        load_tasks(tmp_path / "9_Broken.py")
    (tmp_path / "b.jsonl").write_text('{"name": "ok", "code": 1}\n')
    with pytest.raises(TaskLoadError, match="ok"):
        load_tasks(tmp_path / "b.jsonl")
    (tmp_path / "c.jsonl").write_text("{not json\n")
    with pytest.raises(TaskLoadError, match="line 1"):
        load_tasks(tmp_path / "c.jsonl")


def test_compare_structure_and_values():
    r = torch.tensor([1.0, -2.0, 3.0])
    assert compare(r.clone(), r, 1e-4).ok
    assert "shape" in compare(r[:2], r, 1e-4).reason
    assert "dtype" in compare(r.double(), r, 1e-4).reason
    assert "all zeros" in compare(torch.zeros(3), r, 1e-4).reason
    assert "NaN" in compare(torch.tensor([1.0, float("nan"), 3.0]), r, 1e-4).reason
    bad = compare(torch.tensor([1.0, -2.0, 3.01]), r, 1e-4)
    assert not bad.ok and bad.where == "index (2,)" and abs(bad.max_abs - 0.01) < 1e-6

    class Lying(torch.Tensor):
        pass

    assert "not a plain torch.Tensor" in compare(r.clone().as_subclass(Lying), r, 1e-4).reason
    assert "2 values" in compare((r, r), r, 1e-4).reason or "values" in compare((r, r), r, 1e-4).reason


def test_inputs_unchanged():
    a = [torch.ones(3)]
    b = [torch.ones(3)]
    assert inputs_unchanged(a, b) is None
    b[0][1] = 0
    assert "input #0" in inputs_unchanged(a, b)


def test_compare_in_chunks_matches_whole_and_leaves_buffers_alone(monkeypatch):
    """The judge compares SLICE elements at a time in work copies it modifies in place: the result is the
    whole-tensor one, and neither tensor (float64 ones included, whose .double() is themselves) is touched."""

    g = torch.Generator().manual_seed(0)
    r = torch.randn(7, 13, generator=g, dtype=torch.float64)
    o = r + 1e-3 * torch.randn(7, 13, generator=g, dtype=torch.float64)
    o[3, 5], r[4, 1], o[4, 1] = 0.5, float("inf"), float("inf")
    o0, r0 = o.clone(), r.clone()
    small = 1e-5 * torch.randn(7, 13, generator=g, dtype=torch.float64)  # every element within atol, all wrong
    whole, whole_rel = compare(o, r, 1e-4), compare(2 * small, small, 1e-4, 1e-3)
    monkeypatch.setattr(inp, "SLICE", 5)
    chunked, chunked_rel = compare(o, r, 1e-4), compare(2 * small, small, 1e-4, 1e-3)
    assert torch.equal(o, o0) and torch.equal(r, r0)
    assert not chunked.ok and chunked.reason == whole.reason and chunked.where == "index (3, 5)"
    assert not chunked_rel.ok and "relative error" in chunked_rel.reason
    assert chunked_rel.reason.split(" is over")[0] == whole_rel.reason.split(" is over")[0]
    # elements over atol: the mismatch is what is reported, never "every element is within atol"
    assert compare(o, r, 1e-4, 1e-3).reason == whole.reason
    assert compare(r.clone(), r, 1e-4, 1e-3).ok
    nan_late = r.clone()
    nan_late[6, 12] = float("nan")
    assert "NaN" in compare(nan_late, r, 1e-4).reason


def test_compare_counts_like_isclose_in_float64_and_squares_past_float32(monkeypatch):
    """Values are compared in float32 for float32/16/bf16 outputs: the elements counted over tolerance are
    isclose's in float64 (random values, a tenth of them near the bound); an L2 whose squares overflow float32
    is computed again in float64 instead of passing against an infinite reference norm."""
    from musacoder.verifier import correctness

    g = torch.Generator().manual_seed(1)
    r = torch.randn(4099, generator=g)
    o = r + 1e-4 * (1 + r.abs()) * (0.9 + 0.2 * torch.rand(4099, generator=g))
    monkeypatch.setattr(inp, "SLICE", 1000)
    want = int((~torch.isclose(o.double(), r.double(), rtol=1e-4, atol=1e-4)).sum())
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        oo, rr = o.to(dtype), r.to(dtype)
        n = int((~torch.isclose(oo.double(), rr.double(), rtol=1e-4, atol=1e-4)).sum()) if dtype != torch.float32 else want
        res = compare(oo, rr, 1e-4)
        assert 0 < n < 4099 and f" {n}/4099 elements" in res.reason, (dtype, n, res.reason)
    # the lean pass (every difference finite) and the exact one (NaN/Inf present) count the same on finite values
    lean = correctness._lean_stats(o, r, 1e-4, True, 1000, torch.float32)
    assert lean == correctness._exact_stats(o, r, 1e-4, True, 1000, torch.float32) and lean[2] == want
    assert correctness._lean_stats(torch.tensor([1.0, float("inf")]), torch.ones(2), 1e-4, False, 1000,
                                   torch.float32) is None
    big = torch.full((4,), 1e20)
    assert compare(big * 1.01, big, 0.1).ok  # every element within atol + rtol * |ref|
    res = compare(big * 1.01, big, 0.1, 1e-3)
    assert not res.ok and "relative error 0.01" in res.reason


def test_inputs_unchanged_nan_aware_and_chunked(monkeypatch):

    monkeypatch.setattr(inp, "SLICE", 4)
    a = torch.tensor([1.0, float("nan"), 0.0, 2.0, float("inf"), 3.0, 4.0, 5.0, 6.0])
    assert inputs_unchanged([a], [a.clone()]) is None  # NaN where it was: unchanged
    for i, v in [(2, float("nan")), (4, torch.finfo(torch.float32).max), (8, 6.5)]:
        b = a.clone()
        b[i] = v
        assert "input #0" in inputs_unchanged([a], [b]), (i, v)  # 0 -> NaN and inf -> max were missed before
    assert "input #1" in inputs_unchanged([1, torch.arange(9)], [1, torch.arange(9).flip(0)])


@pytest.mark.parametrize("transform, precision", [("", "fp32"), ("scale8", "fp32"), ("", "fp16"), ("sign", "fp32"),
                                                  ("negfew", "fp32"), ("posfew", "bf16")])
def test_fill_inputs_writes_make_inputs_values_in_slices(monkeypatch, transform, precision):

    mod = type("M", (), {"get_inputs": staticmethod(lambda: [torch.randn(6, 5), 3, torch.randn(5, 6).t(),
                                                              torch.randn(4, 3, 5)])})
    cpu = torch.device("cpu")
    want = inp.make_inputs(mod, inp.Shape(), 11, cpu, precision, transform)
    monkeypatch.setattr(inp, "SLICE", 7)
    raw = inp.raw_inputs(mod, inp.Shape(), 11, cpu)
    dst = [torch.empty(6, 5, dtype=want[0].dtype), 3, torch.empty(6, 5, dtype=want[2].dtype),
           torch.empty(4, 3, 5, dtype=want[3].dtype)]
    inp.fill_inputs(dst, raw, 11, cpu, precision, transform)
    for d, w in [(dst[0], want[0]), (dst[2], want[2]), (dst[3], want[3])]:
        if transform == "sign":  # signs are drawn slice by slice: the same magnitudes, random signs
            assert torch.equal(d.abs(), w.abs())
        else:
            assert torch.equal(d, w)


def test_few_lines_trial_puts_all_one_sign_lines_where_no_probe_finds_them():
    """Every line (first and last index fixed) is all one sign: a few negative ones of magnitude >= 1 among lines
    of the input's own positive values, never the first line; so a max initialised with 0 is off by 1 or more
    there, and a kernel that looks at its first value to spot the negative trial (cpu/exploit_44) takes the 0 path.
    Secret: another seed puts them elsewhere."""
    mod = type("M", (), {"get_inputs": staticmethod(lambda: [torch.rand(8, 5, 6), torch.rand(7, 3), torch.rand(4)])})
    cpu = torch.device("cpu")
    raw = inp.raw_inputs(mod, inp.Shape(), 3, cpu)[0]
    x, m, v = inp.make_inputs(mod, inp.Shape(), 3, cpu, "fp32", "negfew")
    lines = (x < 0).all(dim=1)  # (8, 6): per first and last index, all of the middle dimension negative
    assert torch.equal(lines, (x < 0).any(dim=1)) and not lines[0, 0] and x[0, 0, 0] > 0
    assert lines.sum() == 48 // 16 and (m < 0).all(dim=1).sum() == 1 and (m < 0).any(dim=1).sum() == 1
    assert (x[x < 0] <= -1).all() and torch.equal(x[x > 0], raw[x > 0])  # the rest: the input's own values
    zero_init = torch.maximum(x.amax(dim=1), torch.zeros(()))  # max over the middle dimension, initialised with 0
    assert ((zero_init - x.amax(dim=1)) >= 1).sum() == 3
    other = inp.make_inputs(mod, inp.Shape(), 4, cpu, "fp32", "negfew")[0]
    assert not torch.equal((other < 0).all(dim=1), lines)
    p = inp.make_inputs(mod, inp.Shape(), 3, cpu, "fp32", "posfew")[0]
    assert torch.equal(p > 0, x < 0) and torch.equal(p, -x)  # the mirror, for a min initialised with 0


def test_prefix_view_and_poison(tmp_path):
    from musacoder.verifier import buffers

    t, ref = buffers.alloc([4, 6], torch.float32, torch.device("cpu"), tmp_path)
    v, vref = buffers.prefix_view(t, ref, [2, 5], torch.float32)
    assert vref.path == ref.path and vref.shape == [2, 5] and v.data_ptr() == t.data_ptr()
    buffers.open_ref(vref).copy_(torch.arange(10.0).view(2, 5))  # a subject writing the smaller shape
    assert torch.equal(t.view(-1)[:10], torch.arange(10.0))
    assert buffers.prefix_view(t, ref, [5, 5], torch.float32) is None  # does not fit
    assert buffers.prefix_view(t, ref, [2, 2], torch.float64) is None  # another dtype
    buffers.poison(t, 1)
    assert bool(t.isnan().all())
    n, nref = buffers.alloc([1000], torch.int64, torch.device("cpu"), tmp_path)
    buffers.poison(n, 2)
    assert int((n != 0).sum()) > 990


@pytest.mark.parametrize("status, q, nu, expected", [
    (Status.OK, 1.0, 3.0, 2.0),  # 1 + 0.5 * min(2, 4)
    (Status.OK, 1.0, 20.0, 3.0),  # capped at nu_max = 4
    (Status.OK, 1.0, 0.5, 1.0),  # slower than the baseline: no bonus, no penalty
    (Status.INCORRECT, 0.6, None, -0.2),
    (Status.INCORRECT, 0.0, None, -1.0),
    (Status.ILLEGAL, 1.0, 5.0, -1.0),
    (Status.COMPILE_ERROR, 0.0, None, -1.0),
])
def test_reward_eq2(status, q, nu, expected):
    assert reward(status, q, nu) == pytest.approx(expected)


def _decide(facts):
    return decide(VerifyConfig(), StaticResult(), None, Facts.model_validate(facts))


def test_decide_orders_legality_before_correctness():
    trial_ok = {"kind": "seed", "passed": True, "max_abs": 0.0, "mean_abs": 0.0}
    v = _decide({"trials": [trial_ok], "illegal_ops": ["aten::relu"], "ops": {"aten::relu": 2}, "launches": 1})
    assert v.status is Status.ILLEGAL and "aten::relu x2" in v.reason and v.reward == -1
    v = _decide({"trials": [trial_ok], "launches": 0})
    assert v.status is Status.ILLEGAL and "decoy" in v.reason
    bad = {"kind": "sign-symmetric inputs", "passed": False, "reason": "mismatch", "max_abs": 1.0, "mean_abs": 0.5}
    v = _decide({"trials": [trial_ok, bad], "launches": 3})
    assert v.status is Status.INCORRECT and v.correctness == 0.5 and v.reward == pytest.approx(-0.25)
    timing = {"candidate_ms": 1.0, "reference_ms": 2.0, "compile_ms": 1.5, "speedup": 2.0, "speedup_low": 1.8,
              "speedup_high": 2.2, "compile_speedup": 1.5, "rse": 0.01, "reps": 10, "floor_ms": 0.05}
    v = _decide({"trials": [trial_ok], "launches": 3, "timing": timing, "bytes": 4e9, "flops": 0,
                 "rates": {"bytes_per_s": 1e12, "flops_per_s": 1e12}})
    assert v.status is Status.OK and v.speedup_eager == 2.0 and v.speedup_compile == 1.5 and v.reward == 1.5
    assert v.sol_flag and "speed-of-light" in v.reason  # 1 ms < 0.5 * 4 ms floor
    # a speedup whose interval includes 1 earns no bonus, and the reason says it is noise
    v = _decide({"trials": [trial_ok], "launches": 3, "timing": {**timing, "speedup_low": 0.7, "speedup_high": 3.1}})
    assert v.status is Status.OK and v.speedup_eager == 2.0 and v.reward == 1.0 and "within noise" in v.reason
    v = _decide({"trials": [trial_ok], "launches": 3, "spot_check": "timed iteration 4: mismatch"})
    assert v.status is Status.INCORRECT and v.correctness == 0.5
    v = _decide({"trials": [{"kind": "seed", "passed": False, "reason": "RuntimeError: x", "error": "tb"}]})
    assert v.status is Status.RUNTIME_ERROR
    v = _decide({"integrity": ["time.perf_counter"], "trials": []})
    assert v.status is Status.ILLEGAL and "time.perf_counter" in v.reason
    v = _decide({"symbol_problems": ["imports at::native::relu(at::Tensor const&): ATen compute"], "trials": []})
    assert v.status is Status.ILLEGAL and "native code imports at::native::relu" in v.reason
    v = _decide({"busy_after_return": "the candidate process used 0.5s of CPU after forward returned",
                 "trials": [trial_ok], "launches": 1})
    assert v.status is Status.ILLEGAL and "after forward returned" in v.reason


def test_paired_speedup_interval():
    import random

    from musacoder.verifier.timing import paired_speedup, reward_speedup

    ref = [2.0, 2.1, 1.9, 2.0, 2.05, 1.95] * 5
    cand = [1.0, 1.05, 0.95, 1.0, 1.02, 0.98] * 5
    sp, lo, hi = paired_speedup(ref, cand, random.Random(0))
    assert sp == pytest.approx(2.0) and 1.8 < lo <= sp <= hi < 2.2
    noisy = [0.5, 4.0] * 15  # a load spike on half the candidate's calls: the interval straddles 1
    sp, lo, hi = paired_speedup([1.0] * 30, noisy, random.Random(0))
    assert lo < 1.0 < hi and reward_speedup(sp, lo, hi) == 1.0
    assert reward_speedup(2.0, 1.5, 2.5) == 2.0 and reward_speedup(0.5, 0.4, 0.6) == 0.5


def test_the_stop_rule_reads_the_median():
    import random

    from musacoder.verifier.timing import rse

    rng = random.Random(0)
    calls = [10.0 * (1 + 0.003 * rng.gauss(0, 1)) for _ in range(20)]
    assert rse(calls) < 0.005  # twenty steady calls reach the 0.5% target...
    assert rse(calls[:19] + [60.0]) < 0.005  # ...and one 6x slow call among them does not undo it (a mean's would)
    assert rse([10.0 * (1 + 0.1 * rng.gauss(0, 1)) for _ in range(20)]) > 0.01  # 10% jitter on every call does
    assert rse([10.0]) == float("inf") and rse([0.0, 0.0]) == float("inf")


def test_verdict_json_roundtrip():
    v = _decide({"trials": [{"kind": "seed", "passed": True, "max_abs": 0.0, "mean_abs": 0.0}], "launches": 1})
    d = json.loads(v.to_json())
    assert d["status"] == "ok" and Verdict.from_dict(d).status is Status.OK


def test_device_worker_recycles_on_its_own_gpu_memory_only():
    from musacoder.pool.worker import GIB, gpu_holds_memory

    total = 80 * GIB
    # an RL trainer on the same GPU holds 64 GB: the worker (1 GB of its own) is not recycled
    assert not gpu_holds_memory(allocated=0, own=1 * GIB, reserved=0, free=15 * GIB, total=total)
    # a candidate's raw cudaMalloc leak, invisible to torch, shows in the worker's own NVML usage
    assert gpu_holds_memory(allocated=0, own=60 * GIB, reserved=0, free=19 * GIB, total=total)
    # torch's own cache is not a leak; a tensor kept alive past the job is
    assert not gpu_holds_memory(allocated=0, own=5 * GIB, reserved=3 * GIB, free=70 * GIB, total=total)
    assert gpu_holds_memory(allocated=3 * GIB, own=4 * GIB, reserved=3 * GIB, free=70 * GIB, total=total)
    # without NVML only free memory can tell
    assert gpu_holds_memory(allocated=0, own=None, reserved=0, free=15 * GIB, total=total)
    assert not gpu_holds_memory(allocated=0, own=None, reserved=0, free=70 * GIB, total=total)


def test_recycle_reason_names_the_live_device_tensors():
    """A judge recycled for memory says which device tensors outlived the job and what holds them (a meta tensor
    stands in for a GPU one here)."""
    from musacoder.pool.worker import _live_device_tensors

    class Holder:
        pass

    import weakref

    h = Holder()
    h.big = torch.empty(4096, 393216, device="meta")
    gone = Holder()
    dead = weakref.proxy(gone)  # a dead proxy among gc's objects must not break the scan (CI run 23)
    del gone
    said = _live_device_tensors()
    assert "(4096, 393216) torch.float32 held by ['Holder']" in said
    del h
    assert "4096" not in _live_device_tensors()
    del dead


def test_device_workers_go_where_verify_devices_says(tmp_path):
    """`verify.devices` places one device worker per entry (a GPU may take several); a device the host lacks is an
    error before anything starts. The pool is not started here (its workers start with the first job)."""
    from types import SimpleNamespace

    from musacoder.pool.local import LocalPool
    from musacoder.train.sft import one_gpu

    with LocalPool(VerifyConfig(backend="cpu", devices=(0, 0), cache_dir=tmp_path)) as pool:
        assert pool.n_devices == 2 and pool.stats()["devices"] == 2
    with LocalPool(VerifyConfig(backend="cpu", cache_dir=tmp_path)) as pool:
        assert pool.n_devices == 1
    with pytest.raises(ValueError, match="does not have"):
        LocalPool(VerifyConfig(backend="cpu", devices=(1,), cache_dir=tmp_path))
    with pytest.raises(ValueError, match="indices"):
        VerifyConfig(devices=(-1,))
    # one process with two GPUs visible trains on the first (the verifier takes the other), not nn.DataParallel
    args = SimpleNamespace(n_gpu=2, _n_gpu=2)
    assert one_gpu(args, "")._n_gpu == 1


def test_one_settings_loader_for_every_config(tmp_path):
    """Verification, SFT, RFT and RL settings load through one typed loader: nested settings from their type hints,
    lists to declared tuples, unknown keys refused with their path."""
    from musacoder.settings import Settings
    from musacoder.train.rft import RFTConfig
    from musacoder.train.rl.config import RLConfig
    from musacoder.train.sft import SFTConfig

    assert all(issubclass(c, Settings) for c in (VerifyConfig, SFTConfig, RFTConfig, RLConfig))
    v = VerifyConfig.from_dict({"correctness": {"rescale_factors": [2, 4]}, "timing": {"max_reps": 9}})
    assert v.correctness.rescale_factors == (2, 4) and v.timing.max_reps == 9
    assert VerifyConfig.from_dict(v.to_dict()).to_dict() == v.to_dict()
    with pytest.raises(ValueError, match="under timing: \\['max_rep'\\]"):
        VerifyConfig.from_dict({"timing": {"max_rep": 9}})
    p = tmp_path / "sft.yaml"
    p.write_text("output_dir: out\ndata: [x.jsonl]\ninit: {}\nlora: {enabled: true, r: 4}\n")
    cfg = SFTConfig.from_yaml(p, output_dir="elsewhere")
    assert cfg.lora.r == 4 and cfg.lora.enabled and cfg.output_dir == "elsewhere"
    with pytest.raises(ValueError, match="unknown SFTConfig setting"):
        SFTConfig.from_yaml(p, learning_rat=1e-5)


def test_progress_prints_lines_where_rich_draws_no_bars():
    """On a pipe or log file rich shows nothing until the end; a run killed early must still say how far it got."""
    import io

    from rich.console import Console

    from musacoder.progress import LoggedProgress

    log = io.StringIO()
    with LoggedProgress(console=Console(file=log, force_terminal=False, width=100), every=3600) as bar:
        job = bar.add_task("generate", total=3)
        for _ in range(3):
            bar.advance(job)
        bar.update(job, total=5)  # a bar whose total grows prints again when it completes again
        bar.update(job, completed=5)
    lines = [ln for ln in log.getvalue().splitlines() if ln.startswith("generate:")]
    assert [ln.split(" (")[0] for ln in lines][:3] == ["generate: 1/3", "generate: 3/3", "generate: 5/5"]
    tty = io.StringIO()
    with LoggedProgress(console=Console(file=tty, force_terminal=True, width=100), transient=True) as bar:
        bar.advance(bar.add_task("generate", total=1))
    assert "generate: 1/1" not in tty.getvalue()


def test_parsing_python_in_threads_does_not_raise_system_error():
    """CPython 3.11's AST constructor counts its recursion depth per interpreter: threads parsing at once raise
    SystemError (CI: a task failed to load under four reward threads). The same stress that breaks `ast.parse` on
    this interpreter must leave `musacoder.pyast.parse` alone: a garbage collection inside the constructor runs a
    Python `__del__`, and a tiny switch interval hands the GIL to another parser there."""
    import ast
    import gc
    import sys
    import threading

    from musacoder.pyast import parse

    src = "\n".join(f"def f{i}(x):\n    return [x + {i} for _ in range(3)] if x else {{'a': (1, 2)}}"
                    for i in range(300))

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            sum(range(50))

    def stress(fn, seconds=1.0) -> list[str]:
        errors: list[str] = []

        def work():
            end = time.monotonic() + seconds
            while time.monotonic() < end and not errors:
                for _ in range(20):
                    Cycle()
                try:
                    fn(src)
                except SystemError as e:
                    errors.append(str(e))

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return errors

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(50, 1, 1)
    try:
        if not stress(ast.parse):
            pytest.skip("this interpreter's ast.parse survived the stress: nothing to guard against")
        assert stress(parse, seconds=2.0) == []
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)


def test_verifier_processes_run_on_the_cores_they_are_given(tmp_path):
    """`verify.cpus` keeps judges, compile workers and the processes they start off the caller's cores (an RL
    trainer's generate loop); a core the host lacks is refused up front. `verify.spares` sets how many candidate
    processes a judge keeps ready."""
    import os

    import psutil

    from musacoder.pool.local import LocalPool
    from musacoder.pool.slots import compile_env

    core = max(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="this host's cores are"):
        VerifyConfig(backend="cpu", cpus=(os.cpu_count(),))

    def ours(since: float) -> dict[int, tuple[str, list[int], int]]:
        """The pool's processes (started since `since`), their cores and their parents."""
        out = {}
        for k in psutil.Process().children(recursive=True):
            try:
                if k.create_time() >= since and "musacoder." in " ".join(k.cmdline()):
                    out[k.pid] = (" ".join(k.cmdline()), k.cpu_affinity(), k.ppid())
            except psutil.Error:  # gone meanwhile
                pass
        return out

    since = time.time() - 1
    cfg = VerifyConfig(backend="cpu", cache_dir=tmp_path, cpus=(core,), spares=3)
    with LocalPool(cfg) as pool:
        assert pool.wait_ready(timeout=120)["cpus"] == [core]
        procs = ours(since)
    assert len(procs) >= 2, procs  # the judge and what it started (zygote, spare candidate subjects)
    assert all(cpus == [core] for _, cpus, _ in procs.values()), procs
    # `verify.spares`: the fork server and the three spares it forked (a child keeps the server's command line; each
    # spare's subject runs below it, as PID 1 of its own namespace)
    servers = [p for p, (cmd, _, parent) in procs.items() if "musacoder.verifier.zygote" in cmd
               and "musacoder.verifier.zygote" not in procs.get(parent, ("",))[0]]
    assert len(servers) == 1 and sum(parent == servers[0] for _, _, parent in procs.values()) == 3, procs
    # compile workers start with their first job, through the same variable
    assert compile_env("cpu", cfg, {})["MUSACODER_WORKER_CPUS"] == str(core)


def test_a_malformed_worker_answer_is_an_infra_error_not_a_crash(tmp_path):
    """Pool <-> worker messages are typed: a compile worker's answer that is not a PrebuildResult, or a device
    worker's hello that is not a WorkerHello, ends as a recorded error (no worker process is started here)."""
    from musacoder.pool.slots import CompileSlot, DeviceSlot

    cfg = VerifyConfig(backend="cpu", cache_dir=tmp_path)
    slot = CompileSlot("cpu", cfg, tmp_path, {})
    slot.worker.call = lambda job, timeout: {"builds": "not a list"}
    res, failure, _ = slot.run("import torch")
    assert failure is None and res["infra_error"].startswith("malformed answer from the compile worker"), res
    slot.worker.call = lambda job, timeout: {"builds": [], "kernels": ["k"], "seconds": 1.5}
    assert slot.run("import torch")[0]["kernels"] == ["k"]
    dev = DeviceSlot("cpu", cfg, tmp_path, 0)
    dev.dev.start = lambda: {"type": "hello", "pid": 1}  # no role
    assert "role" in dev.start()["error"]


def test_the_fork_server_says_when_its_children_could_not_use_the_device():
    """Anything that initialised CUDA in the fork server leaves its children "in bad fork" (torch's flag): a forked
    child reports the flag and the judge then starts device subjects from scratch. The flag is faked (no GPU here);
    the fork and the report are real."""
    from types import SimpleNamespace

    from musacoder.verifier.zygote import _children_can_use_the_device

    def torch_with(bad: bool):
        return SimpleNamespace(cuda=SimpleNamespace(_is_in_bad_fork=lambda: bad))

    assert _children_can_use_the_device(torch_with(False))
    assert not _children_can_use_the_device(torch_with(True))


def test_a_fork_server_slow_to_reap_survives_a_judge_that_stopped_waiting(tmp_path):
    """On a loaded host (16 judges on 64 cores, 2026-11-26) the fork server reaped a killed candidate after the judge
    had given up waiting and removed the candidate's directory; writing the exit record there raised inside its SIGCHLD
    handler and killed it, and with it every spare it had forked: "no candidate process could be started (SIGKILL)"
    verdicts. The slow reap is made certain by stopping the server while the judge closes the candidate."""
    from musacoder.backends import get_backend
    from musacoder.verifier.judge import Subject
    from musacoder.verifier.zygote import Zygote

    zygote = Zygote({}, tmp_path / "logs" / "zygote.log")
    backend = get_backend("cpu")
    try:
        zygote.device_fork()  # started
        spare = Subject(backend, tmp_path, "cand", False, 1, zygote).ready()
        cand = Subject(backend, tmp_path, "cand", False, 1, zygote).ready()
        os.kill(zygote.proc.pid, signal.SIGSTOP)
        cand.close()  # kills it, waits 0.5 s for the exit record, removes its directory
        os.kill(zygote.proc.pid, signal.SIGCONT)
        time.sleep(1.0)
        assert zygote.proc.poll() is None and spare.proc.alive
        spare.close()
    finally:
        zygote.close()


def test_a_forked_subject_whose_end_went_unrecorded_says_so(tmp_path):
    """A forked subject's exit code comes from a record its fork server writes; when none came, the error said
    "signal SIGKILL" (a guess), which sent two sessions looking for a killer."""
    import socket
    import subprocess
    from multiprocessing.connection import Connection

    from musacoder.proc.process import WorkerDied, WorkerProcess
    from musacoder.verifier.zygote import Forked

    gone = subprocess.Popen(["true"], start_new_session=True)  # left a zombie: its pid stays ours, never reused
    while open(f"/proc/{gone.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    try:
        proc = Forked(gone.pid, tmp_path / "exit")
        assert proc.poll() is not None and not proc.recorded
        worker = WorkerProcess("subject-cand", "cpu", tmp_path, ["musacoder.verifier.subject"])
        ours, _theirs = socket.socketpair()
        worker.proc, worker.conn = Forked(gone.pid, tmp_path / "exit"), Connection(ours.detach())
        with pytest.raises(WorkerDied, match="exit status not recorded"):
            worker._recv(5)
    finally:
        gone.wait()


def test_left_running_reads_the_quiet_gates_waits():
    """Work the candidate left on the device shows as waits after its replies only; another process's load shows
    after both (not refused) unless the device went quiet once the candidate's process was gone."""
    from musacoder.verifier.timing import left_running

    quiet, busy = [0.02] * 20, [9.0] * 20
    assert left_running(quiet, quiet) == ""
    assert "GPU work left running" in left_running(busy, quiet)
    assert left_running(busy[:4] + quiet[4:], quiet) == ""  # a few slow drains: noise, not a pattern
    assert left_running(busy, busy) == "" and left_running(busy, busy, quiet_after_kill=False) == ""
    assert "quiet once its process was gone" in left_running(busy, busy, quiet_after_kill=True)
    assert left_running([], []) == ""


def test_quiet_gate_keeps_the_lowest_idle_latency_and_waits_out_a_busy_device(monkeypatch):
    """The gate's logic on the cpu, its device faked by a synchronise that takes long while 'busy' (the real probe is
    a one-element kernel on the GPU, run there by the exploit suite): a busy device at one job's start cannot raise
    the threshold, and a wait lasts until a probe answers at the idle latency."""
    import time

    from musacoder.verifier import quiet

    monkeypatch.setattr(quiet, "_IDLE_MS", {})
    cpu = torch.device("cpu")
    idle = quiet.calibrate(cpu, lambda: None)
    assert quiet.calibrate(cpu, lambda: time.sleep(0.005)) == idle < 1.0
    busy = iter([True] * 4)
    gate = quiet.QuietGate(0, cpu, lambda: time.sleep(0.004) if next(busy, False) else None)
    assert gate.quiet_ms < 3.0
    assert gate.wait("cand") >= 12.0 and gate.wait("ref") < 3.0
    assert gate.waits["cand"][0] >= 12.0 and len(gate.waits["ref"]) == 1


def test_cuda_flush_resets_persisting_l2_lines_first(monkeypatch):
    """The judge's L2 flush makes persisting lines normal before it writes its buffer, or a candidate's persisting
    access-policy window could keep its data cached through it. Faked: the driver entry point and the device buffer
    (no GPU here); the order is the CUDA backend's own."""
    from musacoder.backends import cuda

    order = []

    class Buffer:
        def zero_(self):
            order.append("flush")

    monkeypatch.setattr(cuda, "_reset_persisting_l2", lambda: lambda: order.append("reset"))
    b = cuda.CudaBackend()
    b._flush_buf = Buffer()
    b.flush_cache()
    assert order == ["reset", "flush"]
