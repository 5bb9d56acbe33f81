"""Stage-2 prompts (the method's step 1, stage 2): the benchmark's first turn (`conversation.task_messages`) with one
extra section: the task's tensor metadata (shape, stride and dtype of every input, parameter, buffer and output) and
the six-step reasoning template, the teacher asked to reason in `<think>...</think>` before its answer.

The metadata is measured, not inferred: the reference runs once on the cpu at the task's own sizes, its inputs and
model built the way the verifier builds them (`verifier.inputs`, the same seed handling, precision cast and eval
mode), so what the prompt states is what the kernel will see (the data's quality bar "reasoning consistency")."""

from __future__ import annotations

import inspect
import tempfile
from dataclasses import dataclass
from pathlib import Path

from musacoder.conversation import task_messages
from musacoder.tasks.model import Task

PROMPTS = ("bench", "stage2")  # `synth solve --prompt`: the benchmark's prompt, or it plus the section below

STEPS = (
    ("Semantic decomposition", "what forward computes, operator by operator, and which operators one kernel fuses"),
    ("Scalar math", "the formula for one output element, its constants, a numerically stable form (e.g. subtract "
                    "the maximum before exp) and the accumulation dtype"),
    ("Shape computation", "the shape of every intermediate and of the output, as expressions in the input sizes"),
    ("Index mapping", "how an output index maps to input, weight and output offsets through the strides, and how "
                      "the work is split over threads or blocks"),
    ("Boundary handling", "tails that are not a multiple of the block, masks, padding, size-1 and broadcast "
                          "dimensions"),
    ("Error pre-analysis", "the mistakes this kernel is prone to (off-by-one, a stride assumed contiguous, int32 "
                           "index overflow, precision, races) and how the code avoids each"),
)


class MetadataError(ValueError):
    """The reference could not be run to measure its tensors (the message says why)."""


@dataclass(frozen=True)
class Item:
    """One input, parameter, buffer or output: a tensor's shape/stride/dtype, or a plain value."""

    name: str
    shape: tuple[int, ...] | None = None
    stride: tuple[int, ...] | None = None
    dtype: str | None = None
    value: str | None = None  # repr of a non-tensor

    def describe(self) -> str:
        if self.shape is None:
            return f"- {self.name}: {self.value}"
        return f"- {self.name}: shape {self.shape}, stride {self.stride}, dtype {self.dtype}"


@dataclass(frozen=True)
class Metadata:
    inputs: list[Item]
    weights: list[Item]  # the model's parameters and buffers
    outputs: list[Item]


def _items(name: str, obj) -> list[Item]:
    import torch

    if isinstance(obj, torch.Tensor):
        return [Item(name, tuple(obj.shape), tuple(obj.stride()), str(obj.dtype))]
    if isinstance(obj, (list, tuple)):
        return [it for i, o in enumerate(obj) for it in _items(f"{name}[{i}]", o)]
    return [Item(name, value=repr(obj))]


def _arg_names(model, n: int) -> list[str]:
    """forward's parameter names for n positional inputs; `inputs[i]` where they cannot be told (*args)."""
    params = list(inspect.signature(model.forward).parameters.values())
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names[:n] if len(names) >= n else [f"inputs[{i}]" for i in range(n)]


def tensor_metadata(task: Task, precision: str = "fp32") -> Metadata:
    """Run the reference once on the cpu at the task's own sizes and record its tensors; MetadataError if it cannot
    run (it fails, or would not fit in memory)."""
    import torch

    from musacoder.backends import available_bytes
    from musacoder.tasks.select import memory_problem
    from musacoder.verifier.inputs import DTYPES, Shape, init_inputs, load_module, make_inputs

    if problem := memory_problem(task, available_bytes("cpu"), "cpu"):
        raise MetadataError(problem)
    cpu = torch.device("cpu")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            module = load_module(task.code, "meta_task", Path(tmp))
            inputs = make_inputs(module, Shape(), 0, cpu, precision)
            torch.manual_seed(0)
            model = module.Model(*init_inputs(module, Shape()))
            if precision != "fp32":
                model = model.to(DTYPES[precision])
            model = model.eval()
            with torch.no_grad():
                out = model(*inputs)
    except Exception as e:  # noqa: BLE001 -- any failure of the task's own code: reported, the run goes on
        raise MetadataError(f"the reference of {task.key} does not run on the cpu: {type(e).__name__}: {e}"[:500]) \
            from e
    names = _arg_names(model, len(inputs))
    weights = [*model.named_parameters(), *model.named_buffers()]
    return Metadata(inputs=[it for n, x in zip(names, inputs) for it in _items(n, x)],
                    weights=[it for n, w in weights for it in _items(f"self.{n}", w)],
                    outputs=_items("output", out))


def stage2_section(meta: Metadata) -> str:
    lines = ["Tensor metadata, measured by running `Model` once at the sizes above (the verifier also runs other "
             "sizes: take sizes and strides from the tensors at run time, do not hard-code them):",
             "forward inputs:", *(i.describe() for i in meta.inputs)]
    if meta.weights:
        lines += ["parameters and buffers of `Model`:", *(i.describe() for i in meta.weights)]
    lines += ["forward output:", *(i.describe() for i in meta.outputs), "",
              "Before the code, reason inside <think>...</think> in these six steps, each headed by its name:"]
    lines += [f"{n}. {name}: {what}." for n, (name, what) in enumerate(STEPS, 1)]
    lines.append("After </think>, give the complete program in ONE ```python code block.")
    return "\n".join(lines)


def prompt_messages(task: Task, backend: str, prompt: str = "bench", one_shot: bool = True,
                    precision: str = "fp32") -> list[dict]:
    """The first turn for `prompt` (PROMPTS): the benchmark's, or it with the stage-2 section after the task."""
    messages = task_messages(task, backend, one_shot)
    if prompt == "bench":
        return messages
    if prompt != "stage2":
        raise ValueError(f"prompt must be one of {', '.join(PROMPTS)}, not {prompt!r}")
    section = stage2_section(tensor_metadata(task, precision))
    return messages[:-1] + [{**messages[-1], "content": f"{messages[-1]['content']}\n\n{section}"}]
