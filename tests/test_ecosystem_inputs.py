"""Nothing hangs on any input type: every odd task or candidate either gives a verdict or raises TypeError/ValueError
from `verify`, and is that item's format_error verdict in `verify_many`. Each call runs in a thread with a deadline.
The only build is the shipped honest ReLU (shared with the other ecosystem tests through the session cache)."""

import threading
from pathlib import Path

import pytest

from musacoder import api
from musacoder.api import as_candidate_text, as_task, verify, verify_many
from musacoder.config import VerifyConfig
from musacoder.tasks import builtin_task

EXAMPLES = Path(api.__file__).parent / "examples" / "cpu"
RELU = builtin_task("level1/19_ReLU")
HONEST = (EXAMPLES / "honest_relu.py").read_text()
NO_CODE = "I would loop over the elements."
DEADLINE_S = 240  # a cold honest build on 2 shared cores takes ~40 s


def within(fn, *args):
    """fn(*args) in a thread: its result, or its exception re-raised; fails if it is still running at the deadline."""
    out = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(DEADLINE_S)
    assert not t.is_alive(), f"{fn.__name__} still running after {DEADLINE_S}s"
    if "error" in out:
        raise out["error"]
    return out["value"]


GOOD_TASKS = [
    RELU,
    {"code": RELU.code, "key": "level1/19_ReLU"},
    {"code": RELU.code, "name": "19_ReLU.py", "level": 1, "problem_id": 19},  # a KernelBench dataset row
    RELU.code,
    Path(RELU.source),
]
BAD_TASKS = [None, 3, {"name": "no code"}, "class Foo:\n    pass\n", ["list"]]
GOOD_CANDIDATES = [  # all without code: judged by the static check
    NO_CODE,
    NO_CODE.encode(),
    {"role": "assistant", "content": NO_CODE},
    [{"role": "assistant", "content": NO_CODE}],  # TRL's conversational completion
    [{"role": "user", "content": "write relu"}, {"role": "assistant", "content": NO_CODE}],
    [{"role": "assistant", "content": [{"type": "text", "text": NO_CODE}]}],
    {"role": "assistant", "content": None},
]
BAD_CANDIDATES = [None, 42, [], [1, 2], {"text": NO_CODE}, [{"role": "assistant", "content": 7}], object()]


def test_normalisers():
    for t in GOOD_TASKS:
        task = as_task(t)
        assert task.code == RELU.code
    assert as_task(GOOD_TASKS[1]).key == as_task(GOOD_TASKS[2]).key == "level1/19_ReLU"
    for c in GOOD_CANDIDATES[:-2]:
        assert as_candidate_text(c) == NO_CODE
    for t in BAD_TASKS:
        with pytest.raises((TypeError, ValueError)):
            as_task(t)
    for c in BAD_CANDIDATES:
        with pytest.raises((TypeError, ValueError)):
            as_candidate_text(c)


def test_every_input_type_answers_within_the_deadline(cpu_config):
    for t in GOOD_TASKS:
        for c in GOOD_CANDIDATES:
            v = within(verify, t, c, cpu_config)
            assert v.status.value == "format_error", (t, c, v.reason)
            assert v.task.endswith("19_ReLU") or v.task.startswith("task_")
    for bad in [(t, NO_CODE) for t in BAD_TASKS] + [(RELU, c) for c in BAD_CANDIDATES]:
        with pytest.raises((TypeError, ValueError)):
            within(verify, *bad, cpu_config)
    v = within(verify, RELU, EXAMPLES / "honest_relu.py", cpu_config)  # a Path candidate, built and run
    assert v.passed, v.reason


def test_verify_many_answers_every_index(cpu_config):
    pairs = ([(t, NO_CODE) for t in BAD_TASKS] + [(RELU, c) for c in BAD_CANDIDATES]
             + [(RELU, [{"role": "assistant", "content": f"```python\n{HONEST}```"}]), "not a pair", (RELU, NO_CODE)])
    got = dict(within(lambda: list(verify_many(pairs, cpu_config))))
    assert sorted(got) == list(range(len(pairs)))
    for i, v in got.items():
        if i == len(pairs) - 3:
            assert v.passed, v.reason  # the conversational honest answer
        else:
            assert v.status.value == "format_error" and v.reward == -1.0 and v.feedback, (i, v.reason)
    assert "unusable input" in got[0].reason


def test_auto_backend_shares_the_resolved_pool(cache_dir):
    auto = VerifyConfig(backend="auto", cache_dir=cache_dir, timing_enabled=False)
    explicit = VerifyConfig(backend=api.resolved(auto).backend, cache_dir=cache_dir, timing_enabled=False)
    assert api.get_pool(auto) is api.get_pool(VerifyConfig(backend="auto", cache_dir=cache_dir, timing_enabled=False))
    assert api.get_pool(auto) is api.get_pool(explicit)
    assert auto.backend == "auto"  # the caller's config is not changed
