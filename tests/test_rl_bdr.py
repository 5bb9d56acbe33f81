"""Buffered Dynamic Retry: FIFO order, capacity and eviction, re-issue probability, checkpointed state."""

import pytest

from musacoder.train.rl.bdr import BDRSettings, RetryBuffer, RetryItem


def item(task, code="bad", feedback="Status: compile_error"):
    return RetryItem(task=task, messages=[{"role": "user", "content": f"write {task}"}], code=code, feedback=feedback)


def test_fifo_and_eviction_oldest():
    buf = RetryBuffer(BDRSettings(capacity=2, prob=1.0))
    for t in ("a", "b", "c"):
        assert buf.add(item(t))
    assert [i.task for i in buf.items] == ["b", "c"] and buf.evicted == 1
    assert [i.task for i in buf.draw(3) if i] == ["b", "c"]  # oldest first; the third slot finds it empty
    assert len(buf) == 0 and buf.issued == 2


def test_eviction_newest_refuses():
    buf = RetryBuffer(BDRSettings(capacity=2, evict="newest"))
    assert buf.add(item("a")) and buf.add(item("b"))
    assert not buf.add(item("c"))
    assert [i.task for i in buf.items] == ["a", "b"] and buf.refused == 1


def test_unique_tasks_replaces_older_failure():
    buf = RetryBuffer(BDRSettings(capacity=4))
    buf.add(item("a", code="v1"))
    buf.add(item("b"))
    buf.add(item("a", code="v2"))
    assert [(i.task, i.code) for i in buf.items] == [("b", "bad"), ("a", "v2")]
    buf = RetryBuffer(BDRSettings(capacity=4, unique_tasks=False))
    buf.add(item("a"))
    buf.add(item("a"))
    assert len(buf) == 2


def test_probability_zero_and_rate():
    buf = RetryBuffer(BDRSettings(prob=0.0))
    buf.add(item("a"))
    assert buf.draw(50) == [None] * 50 and len(buf) == 1
    buf = RetryBuffer(BDRSettings(prob=0.25, unique_tasks=False, capacity=10_000), seed=1)
    for k in range(4000):
        buf.add(item(str(k)))
    issued = sum(x is not None for x in buf.draw(4000))
    assert 850 < issued < 1150  # binomial(4000, 0.25): mean 1000, sd 27


def test_max_uses_requeues():
    buf = RetryBuffer(BDRSettings(prob=1.0, max_uses=2))
    buf.add(item("a"))
    buf.add(item("b"))
    got = [i.task for i in buf.draw(5) if i]
    assert got == ["a", "b", "a", "b"] and len(buf) == 0


def test_state_round_trip_continues_identically(tmp_path):
    s = BDRSettings(prob=0.5, capacity=8, unique_tasks=False)
    a = RetryBuffer(s, seed=7)
    for k in range(6):
        a.add(item(str(k)))
    a.draw(3)
    a.save(tmp_path / "bdr.json")
    b = RetryBuffer(s, seed=123)
    b.load(tmp_path / "bdr.json")
    assert b.state_dict() == a.state_dict()
    assert [i and i.task for i in a.draw(6)] == [i and i.task for i in b.draw(6)]


def test_repair_messages_use_the_benchmark_feedback_turn():
    it = item("a", code="<think>plan</think>```python\nx = 1\n```", feedback="Status: incorrect")
    msgs = it.repair_messages()
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"] == "```python\nx = 1\n```"  # reasoning stripped, as in multi-turn data
    assert msgs[2]["content"].startswith("=== System Feedback for Round 1 ===\nStatus: incorrect")
    assert "Fix correctness first" in msgs[2]["content"]


def test_settings_validated():
    with pytest.raises(ValueError):
        BDRSettings(evict="random")
    with pytest.raises(ValueError):
        BDRSettings(prob=1.5)


def test_one_rule_for_a_failed_group():
    """What the TRL trainer and the verl adapter buffer (bdr.group_retry): an all-failed group's best-scoring turn,
    over every turn of every trajectory, with that turn's feedback; nothing when one passed or for a repair."""
    from musacoder.episode import Episode, Round
    from musacoder.tasks import builtin_task
    from musacoder.train.rl.bdr import group_retry, offered

    task, first = builtin_task("level1/19_ReLU"), [{"role": "user", "content": "write relu"}]

    def ep(*scores, passed=False, repair=False):
        rounds = [Round(f"answer {s}", f"feedback {s}", passed and s == scores[-1], score=s) for s in scores]
        return Episode(task, first, rounds=rounds, repair=repair)

    group = [ep(-1.0, 0.2), ep(0.5, -0.5), ep(0.1)]
    best = group_retry([(any(t.passed), offered(t)) for t in group])
    assert (best.code, best.feedback, best.score, best.messages) == ("answer 0.5", "feedback 0.5", 0.5, first)
    group.append(ep(0.0, 1.0, passed=True))
    assert group_retry([(any(t.passed), offered(t)) for t in group]) is None
    assert offered(ep(0.3, repair=True)) is None
    assert group_retry([(False, offered(ep(0.3, repair=True))), (False, offered(ep(0.2)))]) is None
