"""The conversation format shared by bench, RL and synth: the MusaCoder single-block prompt per backend, a one-shot
example slot, the feedback turn, and fitting a conversation into a context window.

Templates use `string.Template` (`$name`) because the code they carry is full of braces.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from string import Template

from musacoder.musa.translate import C2M, translate
from musacoder.tasks.model import Task

SYSTEM = "You are an expert in writing high-performance $device kernels for PyTorch models."

TASK = Template("""\
You replace the PyTorch operators of the architecture below with your own $lang kernels, to make it faster.

Rules (a verifier checks every one of them):
- Reason first if you like, then give the complete program in ONE ```python code block.
- $build
- Define `class ModelNew(nn.Module)` with the same constructor and forward signature as `Model`. Keep the
  reference's submodules in `__init__` (e.g. `self.conv = nn.Conv2d(...)`) so the weights match under the same
  seed, but do not call them in `forward`: pass their weights to your kernels.
- All computation in `forward` happens in your own kernels. PyTorch compute ops (matmul, conv, add, relu, sum, ...)
  are rejected there, also when called from C++; only allocation, copy and view ops are allowed (empty,
  empty_like, zeros, contiguous, view, reshape, permute, transpose, expand, ...).
- Outputs must match the reference in shape, dtype and values on random inputs, for other seeds and other input
  sizes too: do not hard-code sizes.
- No threads, processes, file access, or testing code.
$example
You are given the following architecture:
```python
$task
```
Write `ModelNew`.""")

EXAMPLE = Template("""
Example. Given this architecture:
```python
$reference
```
an answer looks like this:
```python
$solution
```
""")

FEEDBACK = Template("""\
=== System Feedback for Round $round ===
$feedback

$instruction""")
FIX = ("Your kernel was not accepted. Fix correctness first, then think about speed. "
       "Reply with the complete corrected program in one ```python block.")
OPTIMISE = ("Your kernel is correct. Optimise it for speed while keeping it correct. "
            "Reply with the complete program in one ```python block.")


@dataclass(frozen=True)
class Style:
    device: str
    lang: str
    build: str
    example: str  # solution of EXAMPLE_REFERENCE in this style


EXAMPLE_REFERENCE = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


size = 4096


def get_inputs():
    return [torch.randn(size), torch.randn(size)]


def get_init_inputs():
    return []'''

_CUDA_EXAMPLE = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

torch::Tensor elementwise_add(torch::Tensor a, torch::Tensor b) {
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    auto out = torch::empty_like(ac);
    int64_t n = ac.numel();
    const int block = 256;
    const int64_t grid = (n + block - 1) / block;
    add_kernel<<<grid, block>>>(ac.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
cpp_source = "torch::Tensor elementwise_add(torch::Tensor a, torch::Tensor b);"

ext = load_inline(name="elementwise_add", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["elementwise_add"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return ext.elementwise_add(a, b)'''

_CPU_EXAMPLE = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor elementwise_add(torch::Tensor a, torch::Tensor b) {
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    auto out = torch::empty_like(ac);
    const float* pa = ac.data_ptr<float>();
    const float* pb = bc.data_ptr<float>();
    float* po = out.data_ptr<float>();
    const int64_t n = ac.numel();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
    return out;
}
"""

ext = load_inline(name="elementwise_add", cpp_sources=cpp_source, functions=["elementwise_add"],
                  extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return ext.elementwise_add(a, b)'''

_TRITON_EXAMPLE = '''\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        out = torch.empty_like(a)
        n = a.numel()
        add_kernel[(triton.cdiv(n, 1024),)](a, b, out, n, BLOCK=1024)
        return out'''

# The CUDA example in MUSA dialect, by the project's translator (only its local variable is renamed to match)
_MUSA_EXAMPLE = translate(_CUDA_EXAMPLE, C2M).text.replace("cuda_source", "musa_source")
_MUSA = Style("MUSA (Moore Threads GPU)", "MUSA",
              "Write the kernels as MUSA C++ source strings and build them at module level with "
              "`torch_musa.utils.musa_extension.load_inline(name=..., cpp_sources=..., musa_sources=..., "
              "functions=[...])`. MUSA C++ is CUDA C++ with MUSA names (musa_runtime.h, musaStream_t, "
              "at::musa::getCurrentMUSAStream(), x.is_privateuseone(), `__mt_bfloat16` for bf16). Take the warp "
              "size from `warpSize` (128 lanes on MTT S4000), never from a literal, and give every shuffle an explicit "
              "width of at most 32. No inline PTX (`asm`), no `double` in device code (MUSA GPUs have no fp64), "
              "static `__shared__` arrays of at most 28 KB.", _MUSA_EXAMPLE)

STYLES = {
    "cuda": Style("CUDA", "CUDA", "Write the kernels as CUDA C++ source strings and build them at module level with "
                  "`torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., cuda_sources=..., "
                  "functions=[...])`.", _CUDA_EXAMPLE),
    "triton": Style("GPU", "Triton", "Write the kernels in Triton (`@triton.jit`) and launch them from `forward`.",
                    _TRITON_EXAMPLE),
    "cpu": Style("CPU", "C++", "Write the kernels as C++ source strings and build them at module level with "
                 "`torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., functions=[...])` (C++ only, no "
                 "cuda_sources). Loop over `data_ptr` yourself; OpenMP pragmas are fine.", _CPU_EXAMPLE),
    "musa": _MUSA,
    "musa-on-cuda": _MUSA,  # MUSA code, verified on an NVIDIA GPU after translation
}


def task_messages(task: Task, backend: str, one_shot: bool = True) -> list[dict]:
    """The first turn: system and user messages, with the backend's one-shot example in the example slot."""
    style = STYLES[backend]
    shot = EXAMPLE.substitute(reference=EXAMPLE_REFERENCE, solution=style.example) if one_shot else ""
    user = TASK.substitute(lang=style.lang, build=style.build, example=shot, task=task.code.strip())
    return [{"role": "system", "content": Template(SYSTEM).substitute(device=style.device)},
            {"role": "user", "content": user}]


def strip_reasoning(raw: str) -> str:
    """Earlier turns go back to the model without their reasoning, as in the paper's multi-turn data."""
    return raw.rsplit("</think>", 1)[-1].strip()


def feedback_message(round_no: int, feedback: str, passed: bool) -> dict:
    """The user turn after round `round_no`: the verifier's feedback, then fix-first or optimise."""
    text = FEEDBACK.substitute(round=round_no, feedback=feedback.strip(), instruction=OPTIMISE if passed else FIX)
    return {"role": "user", "content": text}


def conversation(first: list[dict], history: list[tuple[str, str, bool]]) -> list[dict]:
    """Messages for the next turn: the first turn, then per earlier round (raw output, feedback, passed)."""
    msgs = list(first)
    for n, (raw, feedback, passed) in enumerate(history, 1):
        msgs.append({"role": "assistant", "content": strip_reasoning(raw)})
        msgs.append(feedback_message(n, feedback, passed))
    return msgs


# --- Fitting a request into the model's context (vLLM refuses any request whose prompt + max_tokens exceeds it) ---

CHARS_PER_TOKEN = 2.5  # below what BPE tokenizers average on code and English (3-4): over-counting costs some answer
MESSAGE_TOKENS = 8  # room, under-counting gets the request refused. Per message: the chat template's role markers.
CUT = "\n[... {n} characters of this earlier answer cut to fit the model's context ...]\n"


class BudgetError(ValueError):
    """The prompt does not fit the context even with every earlier answer cut."""


def estimate_tokens(messages: list[dict]) -> int:
    """A conservative token count when the server's tokenizer is not at hand."""
    return sum(math.ceil(len(m["content"]) / CHARS_PER_TOKEN) + MESSAGE_TOKENS for m in messages) + MESSAGE_TOKENS


def answer_reserve(context_len: int, max_tokens: int) -> int:
    """Tokens a prompt must leave for the answer before earlier answers are cut: max_tokens, at most a quarter."""
    return min(max_tokens, context_len // 4)


def cut_middle(text: str, keep: int) -> str:
    """`text` with all but `keep` characters cut from its middle, the cut marked (the head and the tail stay)."""
    if keep >= len(text):
        return text
    head = keep - keep // 2
    return text[:head] + CUT.format(n=len(text) - keep) + text[len(text) - keep // 2:]


def fit_prompt(messages: list[dict], context_len: int, max_tokens: int,
               count: Callable[[list[dict]], int] = estimate_tokens) -> tuple[list[dict], int]:
    """(messages, max_tokens) that fit `context_len` tokens: when the prompt leaves less than `answer_reserve`, the
    messages between the task and the latest one (earlier answers and feedback, oldest first) are cut in the middle,
    each as little as needed; the system prompt, the task and the latest feedback are never cut. max_tokens is then
    what the prompt leaves, at most the one asked. BudgetError when even that does not fit."""
    limit = context_len - answer_reserve(context_len, max_tokens)
    msgs = [dict(m) for m in messages]
    task = next((i for i, m in enumerate(msgs) if m["role"] == "user"), len(msgs))
    for i in range(task + 1, len(msgs) - 1):
        if count(msgs) <= limit:
            break
        text, lo, hi = messages[i]["content"], 0, len(messages[i]["content"])
        while lo < hi:  # the longest part of this message that fits (count grows with what is kept)
            mid = (lo + hi + 1) // 2
            msgs[i]["content"] = cut_middle(text, mid)
            lo, hi = (mid, hi) if count(msgs) <= limit else (lo, mid - 1)
        msgs[i]["content"] = cut_middle(text, lo)
    n = count(msgs)
    if n > limit:
        cut = " with every earlier answer cut" if len(msgs) > task + 2 else ""
        raise BudgetError(f"the prompt is {n} tokens{cut}; the model's context of {context_len} tokens then leaves "
                          f"fewer than {context_len - limit} for the answer")
    return msgs, min(max_tokens, context_len - n)
