"""Prompt templates: per-backend build rules, the one-shot slot, and the multi-turn feedback turns."""

import pytest

from musacoder.conversation import (
    CUT,
    EXAMPLE_REFERENCE,
    FIX,
    OPTIMISE,
    STYLES,
    BudgetError,
    conversation,
    cut_middle,
    estimate_tokens,
    fit_prompt,
    task_messages,
)
from musacoder.tasks import builtin_task


@pytest.mark.parametrize("backend,must,must_not", [
    ("cuda", "cuda_sources=...", "@triton.jit\ndef"),
    ("cpu", "C++ only, no cuda_sources", "__global__"),
    ("triton", "@triton.jit", "load_inline(name="),
])
def test_task_prompt_per_backend(backend, must, must_not):
    task = builtin_task("level1/19_ReLU")
    system, user = task_messages(task, backend)
    assert system["role"] == "system" and user["role"] == "user"
    content = user["content"]
    assert must in content and must_not not in content
    assert task.code.strip() in content and content.endswith("Write `ModelNew`.")
    assert EXAMPLE_REFERENCE in content and STYLES[backend].example in content
    assert "ModelNew" in content and "$" not in content.replace(task.code, "")  # every template slot filled
    zero = task_messages(task, backend, one_shot=False)[1]["content"]
    assert EXAMPLE_REFERENCE not in zero and "Example." not in zero and task.code.strip() in zero


def test_conversation_feeds_back_each_round():
    first = task_messages(builtin_task("level1/19_ReLU"), "cuda")
    msgs = conversation(first, [("<think>long reasoning</think>attempt 1", "Status: incorrect\nReason: x", False),
                                ("attempt 2", "Status: ok\nReason: correct", True)])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[2]["content"] == "attempt 1"  # earlier reasoning is stripped
    assert msgs[3]["content"] == f"=== System Feedback for Round 1 ===\nStatus: incorrect\nReason: x\n\n{FIX}"
    assert msgs[5]["content"].startswith("=== System Feedback for Round 2 ===") and msgs[5]["content"].endswith(OPTIMISE)
    assert conversation(first, []) == first


def msg(role, n, ch="x"):
    return {"role": role, "content": ch * n}


def test_estimate_and_cut_middle():
    assert estimate_tokens([msg("user", 25)]) == 10 + 8 + 8  # 2.5 chars a token, 8 per message, 8 per prompt
    assert estimate_tokens([msg("user", 26), msg("system", 0)]) == 11 + 8 + 0 + 8 + 8
    assert cut_middle("abcdefghij", 4) == "ab" + CUT.format(n=6) + "ij"
    assert cut_middle("abcdefghij", 3) == "ab" + CUT.format(n=7) + "j"
    assert cut_middle("abcdefghij", 0) == CUT.format(n=10)
    assert cut_middle("abc", 3) == cut_middle("abc", 99) == "abc"


def test_fit_prompt_leaves_what_fits_to_the_answer():
    msgs = [msg("system", 25), msg("user", 250)]  # 18 + 108 + 8 = 134 tokens
    assert fit_prompt(msgs, 1000, 2000) == (msgs, 866)
    assert fit_prompt(msgs, 1000, 500) == (msgs, 500)
    with pytest.raises(BudgetError, match="the prompt is 134 tokens; the model's context of 160 tokens then leaves "
                                          "fewer than 40 for the answer"):
        fit_prompt(msgs, 160, 2000)  # a task alone that leaves less than a quarter of the context is refused


def test_fit_prompt_cuts_earlier_answers_never_the_task_or_latest_feedback():
    system, task, answer, feedback = msg("system", 25), msg("user", 250, "t"), msg("assistant", 2500, "a"), \
        msg("user", 250, "f")
    msgs = [system, task, answer, feedback]  # 18 + 108 + 1008 + 108 + 8 = 1250 tokens
    fitted, max_tokens = fit_prompt(msgs, 1000, 2000)  # the prompt may keep 750 tokens: the answer 500, 1250 chars
    keep = 1250 - len(CUT.format(n=1000))  # the marker takes its share
    assert fitted[2]["content"] == cut_middle(answer["content"], keep) and len(fitted[2]["content"]) == 1250
    assert fitted[:2] == [system, task] and fitted[3] == feedback and msgs[2] == answer  # the input is untouched
    assert estimate_tokens(fitted) == 750 and max_tokens == 250

    # Three turns: the oldest answer goes first; what is left of the budget keeps the latest answer whole.
    older, newer = msg("assistant", 5000, "o"), msg("assistant", 500, "n")
    fitted, max_tokens = fit_prompt([system, task, older, feedback, newer, feedback], 1000, 2000)
    assert fitted[4] == newer and fitted[3] == feedback == fitted[5]  # 558 tokens besides the oldest answer
    assert fitted[2]["content"] == cut_middle(older["content"], 460 - len(CUT.format(n=1000)))  # 184 tokens left
    assert estimate_tokens(fitted) == 750 and max_tokens == 250

    with pytest.raises(BudgetError, match="with every earlier answer cut"):
        fit_prompt([system, msg("user", 1800), answer, feedback], 1000, 2000)
