"""Prompt templates: per-backend build rules, the one-shot slot, and the multi-turn feedback turns."""

import pytest

from musacoder.bench.prompts import EXAMPLE_REFERENCE, FIX, OPTIMISE, STYLES, conversation, task_messages
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
