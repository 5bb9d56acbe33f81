"""The one multi-turn episode loop (bench, RL and synth use it) against the real verifier (cpu backend). The engine is
scripted: a tiny model cannot be made to write a given kernel on a given turn, so the test stands in for the model
(only for it)."""

import pytest

from musacoder.api import get_verifier
from musacoder.conversation import task_messages
from musacoder.episode import ELIDED, Episode, Round, run_episodes
from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.tasks import builtin_task
from musacoder.train.rl.algos import primeecho_reward
from musacoder.train.rl.engines import Sample

RELU = builtin_task("level1/19_ReLU")
NO_CODE = "<think>hmm</think>I would use a loop."
HONEST = "```python\n" + (EXAMPLES_DIR / "cpu/honest_relu.py").read_text() + "\n```"


class Scripted:
    """Answers per conversation from a script keyed by the number of assistant turns already in it."""

    def __init__(self, by_round):
        self.by_round, self.seen = by_round, []

    def encode(self, messages):
        return list(range(sum(len(m["content"]) for m in messages) // 10))

    def generate(self, conversations):
        self.seen.append(conversations)
        out = []
        for conv in conversations:
            text = self.by_round[sum(m["role"] == "assistant" for m in conv)]
            out.append(Sample(self.encode(conv), [1] * len(text.split()), [-0.5] * len(text.split()), text, False))
        return out


def play(episodes, eng, verifier, max_prompt_tokens=None):
    fits = (lambda m: len(eng.encode(m)) <= max_prompt_tokens) if max_prompt_tokens else None
    return episodes, run_episodes(episodes, eng.generate, verifier.verdicts, fits)


def test_failing_turns_feed_back_and_stop_at_max_turns(cpu_config):
    eng = Scripted({0: NO_CODE, 1: NO_CODE, 2: NO_CODE})
    first = task_messages(RELU, "cpu", one_shot=False)
    trajs, st = play([Episode(RELU, first), Episode(RELU, first)], eng, get_verifier(cpu_config))
    assert [len(t.rounds) for t in trajs] == [3, 3] and st.responses == 6 and st.tokens == 6 * 5
    assert all(t.status == "format_error" and t.score == -1.0 and not t.passed for t in trajs[0].rounds)
    assert trajs[0].first_success is None
    turn2 = eng.seen[1][0]
    assert turn2[:2] == first and turn2[2] == {"role": "assistant", "content": "I would use a loop."}
    assert turn2[3]["content"].startswith("=== System Feedback for Round 1 ===\nStatus: format_error")
    assert eng.seen[2][0][5]["content"].startswith("=== System Feedback for Round 2 ===")
    assert trajs[0].rounds[0].sample.text == NO_CODE  # the sample trained on is the first response
    assert st.compiled == 0 and st.compile_s_max == 0.0  # no code, nothing built


def test_single_turn_mode_and_repair_numbering(cpu_config):
    eng = Scripted({0: NO_CODE, 1: NO_CODE, 2: NO_CODE})
    first = task_messages(RELU, "cpu", one_shot=False)
    trajs, _ = play([Episode(RELU, first, max_turns=1)], eng, get_verifier(cpu_config))
    assert len(trajs[0].rounds) == 1 and len(eng.seen) == 1
    eng = Scripted({1: NO_CODE, 2: NO_CODE})
    repair = Episode(RELU, first, [Round("old answer", "Status: incorrect", False)], repair=True, max_turns=2)
    trajs, _ = play([repair], eng, get_verifier(cpu_config))
    assert eng.seen[0][0][3]["content"].startswith("=== System Feedback for Round 1 ===\nStatus: incorrect")
    assert eng.seen[1][0][5]["content"].startswith("=== System Feedback for Round 2 ===")
    assert len(trajs[0].rounds) == 2  # the repair response is the trajectory's first turn


def test_long_conversations_stop(cpu_config):
    eng = Scripted({0: NO_CODE, 1: NO_CODE})
    first = task_messages(RELU, "cpu", one_shot=False)
    limit = len(eng.encode(first)) + 5  # the first prompt fits, the one carrying feedback does not
    trajs, st = play([Episode(RELU, first)], eng, get_verifier(cpu_config), max_prompt_tokens=limit)
    assert len(trajs[0].rounds) == 1 and st.stopped_long == 1


@pytest.mark.slow  # CI time (a build in a fresh cache): tests/test_bench_runner.py repairs on turn two through it too
def test_repaired_on_turn_two_by_the_real_verifier(cpu_config, tmp_path):
    from dataclasses import replace

    eng = Scripted({0: NO_CODE, 1: HONEST, 2: NO_CODE})
    fresh = replace(cpu_config, cache_dir=str(tmp_path))  # the answer is built here, not found built
    trajs, st = play([Episode(RELU, task_messages(RELU, "cpu", one_shot=False))], eng, get_verifier(fresh))
    t = trajs[0]
    assert [x.status for x in t.rounds] == ["format_error", "ok"] and t.first_success == 2
    assert t.scores == [-1.0, 1.0]  # timing off: a correct kernel scores exactly 1
    assert primeecho_reward(t.scores, t.passed) == pytest.approx(-0.4)
    assert len(eng.seen) == 2 and st.verify_s > 0
    assert st.compiled == 1 and 0 < st.compile_s_max <= st.verify_s  # the build the step waited for


def test_elisions_keep_the_task_the_latest_answer_and_every_feedback():
    first = task_messages(RELU, "cpu", one_shot=False)
    ep = Episode(RELU, first, [Round("a0", "f0", False)], rounds=[Round("a1", "f1", False), Round("a2", "f2", True)])
    assert ep.finished  # the last round passed
    shapes = [[m["content"] for m in msgs if m["role"] == "assistant"] for msgs in ep.elisions()]
    assert shapes == [["a0", "a1", "a2"], [ELIDED, "a1", "a2"], [ELIDED, ELIDED, "a2"]]
    assert all(msgs[:2] == first and sum("f2" in m["content"] for m in msgs) == 1 for msgs in ep.elisions())
    assert not Episode(RELU, first, rounds=[Round("a", "f", True)], stop_on_success=False).finished


def test_early_verification_starts_while_the_batch_generates_and_keeps_every_verdict():
    """Answer 0 ends first and is verified while generation goes on; answer 1's early text is superseded by its
    final one, which is verified again; answer 2 is only known at the end. The verifier here records calls (it
    stands in for MooreEval only to see when each call starts)."""
    import threading
    import time

    from musacoder.verifier.verdict import Status, Verdict

    calls, generating = [], threading.Event()

    def verify(pairs):
        calls.append(([t for _, t in pairs], generating.is_set()))
        return [Verdict(status=Status.OK if t == "good" else Status.INCORRECT, reason=t, task=k.key, backend="cpu")
                for k, t in pairs]

    def generate(prompts, on_text=None):
        generating.set()
        on_text(0, "good")
        on_text(1, "draft")
        time.sleep(0.2)  # the rest of the batch still generating
        generating.clear()
        return [Sample([], [1], [0.0], t, False) for t in ("good", "final", "bad")]

    eps = [Episode(RELU, task_messages(RELU, "cpu"), max_turns=1) for _ in range(3)]
    stats = run_episodes(eps, generate, verify, early=True)
    assert [e.rounds[0].status for e in eps] == ["ok", "incorrect", "incorrect"]
    assert [e.rounds[0].text for e in eps] == ["good", "final", "bad"]
    assert (["good"], True) in calls and (["draft"], True) in calls  # started during generation
    assert (["final", "bad"], False) in calls  # the superseded draft and the late answer, after it
    assert stats.verified_early == 1 and stats.responses == 3
