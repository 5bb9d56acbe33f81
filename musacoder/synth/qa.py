"""Stage 3d: `qa` records, questions about real tasks and kernels answered by an LLM teacher, marked unverified.

Questions are built from material, not taken from a fixed list: each selected task (its reference program, its
operator families, its input/parameter/output shapes and dtypes measured by running the reference once on the cpu
as `prompts.tensor_metadata` does, and the backend the kernel is for) and, optionally, each verified solution of
`synth solve` (the same facts plus the kernel's code). Every material item gets `per_task` questions from the
templates that fit it (TASK_TEMPLATES / SOLUTION_TEMPLATES), in a seeded order; past the number of templates the
order repeats with the next sample index (another answer to the same question).

The teacher is any generation client (`bench.clients.make_client`: an OpenAI-compatible server, local transformers,
replay). A request's task is the question (`Task(name=question id)`), so a replay file answers a question by its id
(`level1/19_ReLU#bound`, or `level1/19_ReLU#<solution hash>#access`) and sample. An answer that is empty (nothing
after its reasoning), truncated (finish_reason "length", or reasoning never closed) or a refusal is dropped with that
reason. A kept answer becomes a record {"messages": [system, question, answer], "kind": "qa", "task": ...,
"metadata": {"verified": false, ...}}, validated as training reads it (`records.validated`) before it is written.

The records are not verified: nothing executes prose, so no check of the answer's correctness exists here (unlike
generation, repair and rewrite records, whose programs MooreEval ran). The metadata says so, and names the teacher.

Written to the output directory: qa.jsonl (the records) and qa_answers.jsonl (every question asked, kept or dropped
with the reason, and the answer). Appends and resumes by (task, source, template, sample, teacher): a question with
an answer (kept or dropped) or without material is not asked again; one whose generation failed (a dead server) is
recorded with the error and asked again by the next run. A line cut by an interrupted run is skipped and redone.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from musacoder.bench.clients import Client, Request
from musacoder.bench.runner import request_seed
from musacoder.conversation import STYLES, SYSTEM
from musacoder.data.records import RecordError, validated
from musacoder.data.schema import QAAnswer, QAMeta, QARecord, line
from musacoder.synth.tasks import recorded
from musacoder.tasks.model import Task

QA, ANSWERS = "qa.jsonl", "qa_answers.jsonl"
# what the questions name as the target, per backend (conversation.STYLES)
DEVICES = {"cuda": "a CUDA GPU", "triton": "a GPU (Triton)", "musa": "a Moore Threads GPU (MUSA)",
           "musa-on-cuda": "a Moore Threads GPU (MUSA)", "cpu": "a multi-core CPU"}

# Drop reasons (qa_answers.jsonl "dropped", the summary's counts)
EMPTY = "empty answer"
TRUNCATED = "truncated answer"
REFUSED = "refusal"
INVALID = "invalid record"
NO_MATERIAL = "no material"  # the reference does not run on the cpu: no measured shapes to ask about
GENERATION = "generation failed"  # redone by the next run

# An answer that opens by declining (after its reasoning). Only the opening is looked at: an answer that later says
# "I cannot see the launch config" is not a refusal.
_REFUSAL = re.compile(
    r"^\W*(?:i'?m sorry|i am sorry|sorry,|as an ai\b|i (?:can ?not|can't|won't|am unable to|'m unable to|am not able "
    r"to|must decline|do not feel comfortable)\b[^.\n]{0,40}\b(?:help|assist|answer|provide|comply|do that|fulfil))",
    re.IGNORECASE)


@dataclass(frozen=True)
class QTemplate:
    id: str
    text: str  # string.Template over: device, lang, families, units, access (see _fill)


# Questions about a task (the reference program and its measured tensors)
TASK_TEMPLATES = (
    QTemplate("bound", "What bounds this operator at these shapes on $device, memory bandwidth or compute? Estimate "
                       "the bytes it must move and the floating-point operations it performs (show the arithmetic "
                       "from the shapes and dtypes above) and say which one dominates."),
    QTemplate("boundaries", "What boundary conditions must a $lang kernel for this task handle? Consider sizes that "
                            "are not a multiple of the block, size-1 and broadcast dimensions, non-contiguous inputs, "
                            "other input sizes than these, the dtypes above and index overflow."),
    QTemplate("fusion", "Break forward into its operators (families: $families). Which of them can one $lang kernel "
                        "fuse, which intermediates then never reach memory, and what is the formula for one output "
                        "element?"),
    QTemplate("numerics", "Which numerical pitfalls does this computation have at these dtypes (overflow, "
                          "cancellation, accumulation precision, a numerically stable form), and how should a $lang "
                          "kernel avoid each?"),
    QTemplate("parallel", "How would you split this computation over $units? Say which dimension each unit of work "
                          "covers, how a reduction (if any) is combined, and how large the grid is at these shapes."),
)
# Questions about a verified solution (its kernel code, with the task's facts)
SOLUTION_TEMPLATES = (
    QTemplate("access", "Which memory access pattern does this kernel use, and is it $access? Point to the lines "
                        "that decide it."),
    QTemplate("explain", "Explain what this kernel does line by line, and name one risk it carries (an input that "
                         "could break it or make it slow)."),
    QTemplate("speed", "Where does this kernel spend its time at these shapes, and which one change would most "
                       "likely make it faster? Say why."),
    QTemplate("review", "Does this kernel handle every boundary condition of the task (tails that are not a multiple "
                        "of the block, size-1 dimensions, non-contiguous inputs, other input sizes)? Point to the "
                        "lines that do, or say what is missing."),
)
TEMPLATES = {t.id: t for t in TASK_TEMPLATES + SOLUTION_TEMPLATES}

QUESTION = Template("""\
The task: the PyTorch reference program below, to be replaced by $lang kernels for $device.
Operator families: $families.
```python
$task
```
$tensors
$solution
Question: $question""")

SOLUTION = Template("""
A $lang solution of it that MooreEval verified (correct on its tests):
```python
$code
```
""")


@dataclass
class QAConfig:
    per_task: int = 3  # questions per material item (task or solution)
    seed: int = 0  # the template order, and the base of the per-request sampling seeds
    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 8192
    precision: str = "fp32"  # the dtype the tensors are measured at
    chunk: int = 64  # questions generated together, then written: what an interruption can lose


@dataclass(frozen=True)
class Material:
    """What questions are asked about: a task, or a verified solution of it."""

    task: Task
    code: str | None = None  # the solution's program; None: the task itself

    @property
    def source(self) -> str:
        return "task" if self.code is None else f"solution:{code_hash(self.code)}"

    @property
    def templates(self) -> tuple[QTemplate, ...]:
        return TASK_TEMPLATES if self.code is None else SOLUTION_TEMPLATES

    def question_id(self, template: str) -> str:
        return "#".join([self.task.key, *([] if self.code is None else [code_hash(self.code)]), template])


@dataclass
class Facts:
    families: list[str]
    tensors: str | None  # the measured metadata section; None when the reference does not run
    problem: str | None = None


@dataclass
class _Question:
    material: Material
    template: QTemplate
    sample: int
    messages: list[dict] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.material.question_id(self.template.id)


def code_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan(material: Material, per_task: int, seed: int) -> list[tuple[QTemplate, int]]:
    """(template, sample) of the `per_task` questions of one item: its templates in a seeded order, repeated with the
    next sample index past their number."""
    order = list(material.templates)
    random.Random(f"{seed}:{material.task.key}:{material.source}").shuffle(order)
    return [(order[j % len(order)], j // len(order)) for j in range(per_task)]


def task_families(task: Task) -> list[str]:
    """The task's operator families: those its record came with (`synth tasks`, `synth variants`), else the
    families of the aten ops one eager forward on the cpu dispatches (clean.py's tracer and table)."""
    from musacoder.synth.clean import known_families, measure_families

    return known_families(task) or measure_families(task.code)


def task_facts(task: Task, precision: str = "fp32") -> Facts:
    """The measured facts of a task; `problem` says why there are none (its reference does not run on the cpu)."""
    from musacoder.synth.prompts import MetadataError, tensor_metadata

    try:
        meta = tensor_metadata(task, precision)
        families = task_families(task)
    except MetadataError as e:
        return Facts([], None, str(e))
    except Exception as e:  # noqa: BLE001 -- the task's own code failed: no material, said why
        return Facts([], None, f"the reference of {task.key} does not run on the cpu: {type(e).__name__}: {e}"[:500])
    lines = ["Its tensors, measured by running `Model` once on the cpu at these sizes:", "forward inputs:",
             *(i.describe() for i in meta.inputs)]
    if meta.weights:
        lines += ["parameters and buffers of `Model`:", *(i.describe() for i in meta.weights)]
    lines += ["forward output:", *(i.describe() for i in meta.outputs)]
    return Facts(families, "\n".join(lines))


def _fill(q: _Question, facts: Facts, backend: str) -> list[dict]:
    style, device = STYLES[backend], DEVICES[backend]
    gpu = backend != "cpu"
    families = ", ".join(facts.families) or "none recorded"
    question = Template(q.template.text).substitute(
        device=device, lang=style.lang, families=families,
        units="thread blocks and threads" if gpu else "cores (OpenMP threads) and SIMD lanes",
        access="coalesced" if gpu else "contiguous and friendly to the cache and vector units")
    solution = "" if q.material.code is None else SOLUTION.substitute(lang=style.lang, code=q.material.code.strip())
    user = QUESTION.substitute(question=question, lang=style.lang, device=device, families=families,
                               task=q.material.task.code.strip(), tensors=facts.tensors, solution=solution)
    return [{"role": "system", "content": Template(SYSTEM).substitute(device=style.device)},
            {"role": "user", "content": user}]


def judge_answer(text: str, finish_reason: str | None) -> str | None:
    """Why an answer is dropped (EMPTY, TRUNCATED, REFUSED), or None to keep it."""
    if finish_reason == "length":
        return TRUNCATED
    if text.count("<think>") > text.count("</think>"):
        return TRUNCATED  # the reasoning never ended: the answer was cut (or never given)
    answer = text.rsplit("</think>", 1)[-1].strip()
    if not answer:
        return EMPTY
    if _REFUSAL.match(answer[:200]):
        return REFUSED
    return None


def _key(rec: QAAnswer | QARecord) -> tuple:
    """The resume key of a qa_answers.jsonl line, or of a qa record (its metadata holds the same fields)."""
    at = rec.metadata if isinstance(rec, QARecord) else rec
    return rec.task, at.source, at.template, at.sample, at.teacher


def _append(path: Path):
    """`path` opened to append, after a newline if a run cut off mid-line left none: the cut line stays one bad line
    (skipped by `recorded`, redone), and the next record does not stick to it."""
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, 2)
            cut = f.read(1) != b"\n"
        if cut:
            with open(path, "a") as f:
                f.write("\n")
    return open(path, "a")


def _todo(materials: Iterable[Material], cfg: QAConfig, teacher: str, done: set) -> tuple[list[_Question], int, int]:
    """The questions still to ask; how many were planned; how many of them were done already."""
    todo, skipped, planned = [], 0, 0
    for m in materials:
        for tpl, s in plan(m, cfg.per_task, cfg.seed):
            planned += 1
            if (m.task.key, m.source, tpl.id, s, teacher) in done:
                skipped += 1
            else:
                todo.append(_Question(m, tpl, s))
    return todo, skipped, planned


class _Answers:
    """What becomes of each question: its qa_answers.jsonl line, the qa record of a kept answer, and the counts."""

    def __init__(self, ans, qa, base: dict):
        self.ans, self.qa, self.base = ans, qa, base
        self.dropped, self.stats = Counter(), Counter()
        self.first_error: str | None = None

    def write(self, q: _Question, **kw) -> None:
        self.ans.write(line(QAAnswer(task=q.material.task.key, source=q.material.source, template=q.template.id,
                                     sample=q.sample, question=q.id, **self.base, **kw)))

    def no_material(self, q: _Question, f: Facts) -> None:
        self.dropped[NO_MATERIAL] += 1
        self.write(q, kept=False, dropped=NO_MATERIAL, reason=f.problem)

    def failed(self, q: _Question, error: str) -> None:
        self.stats["generation_failed"] += 1
        self.first_error = self.first_error or error
        self.write(q, kept=False, dropped=GENERATION, reason=error[:500])

    def answered(self, q: _Question, g, families: list[str]) -> None:
        """A generated answer: kept as a qa record, or dropped with the reason."""
        why = judge_answer(g.text, g.finish_reason)
        meta = QAMeta(verified=False, **self.base, template=q.template.id, families=families,
                      source=q.material.source, sample=q.sample, question=q.id, finish_reason=g.finish_reason,
                      tokens=g.completion_tokens)
        rec, reason = None, None
        if why is None:
            try:  # the client's messages as training would read them
                rec = validated(QARecord, {"messages": (g.messages or q.messages) + [{"role": "assistant",
                                                                                      "content": g.text}],
                                           "kind": "qa", "task": q.material.task.key, "metadata": meta})
            except RecordError as e:
                why, reason = INVALID, str(e)
        if why is not None:
            self.dropped[why] += 1
            self.write(q, kept=False, dropped=why, reason=reason, answer=g.text, finish_reason=g.finish_reason)
            return
        self.stats["kept"] += 1
        self.qa.write(line(rec))
        self.write(q, kept=True, dropped=None, answer=g.text, finish_reason=g.finish_reason)

    def flush(self) -> None:
        self.qa.flush()  # the records first: a kept answer whose qa_answers line is lost is still not asked again
        self.ans.flush()


def _prepared(todo: list[_Question], facts: dict[str, Facts], cfg: QAConfig, backend: str,
              answers: _Answers) -> list[_Question]:
    """The questions to ask, with their messages: those whose task has material (its facts, measured once per task
    into `facts`); the others are recorded as NO_MATERIAL."""
    asked = []
    for q in todo:
        key = q.material.task.key
        if key not in facts:
            facts[key] = task_facts(q.material.task, cfg.precision)
        f = facts[key]
        if f.tensors is None:
            answers.no_material(q, f)
            continue
        q.messages = _fill(q, f, backend)
        asked.append(q)
    return asked


def _generate(client: Client, chunk: list[_Question], cfg: QAConfig) -> tuple[dict, str]:
    """The teacher's answers by index in `chunk`, and the error that the questions without one get."""
    reqs = [Request(Task(q.id, q.material.task.code, source=q.material.task.source), q.sample, 1, q.messages,
                    cfg.temperature, cfg.top_p, cfg.max_tokens, request_seed(cfg.seed, q.id, q.sample, 1))
            for q in chunk]
    got = {}
    missing = "no answer (the client stopped)"
    try:
        for i, g in client.generate(reqs):
            got[i] = g
    except Exception as e:  # noqa: BLE001 -- a client bug must not lose the run: what it did not answer is redone
        missing = f"client failed: {type(e).__name__}: {e}"
    return got, missing


def qa_records(materials: Iterable[Material], out_dir: Path, client: Client, teacher: str, backend: str,
               cfg: QAConfig | None = None, progress: Callable[[int, int], None] | None = None) -> dict:
    """Ask the teacher `cfg.per_task` questions about each material item and write the kept answers as qa records;
    returns the summary (asked, kept, dropped by reason, generation failures, what was already done)."""
    cfg = cfg or QAConfig()
    if backend not in DEVICES:
        raise ValueError(f"backend must be one of {', '.join(DEVICES)}, not {backend!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    # answered (kept or dropped) or without material; a qa record counts too, in case its answers line was cut
    done = (recorded(out_dir / ANSWERS, QAAnswer, lambda r: _key(r) if r.dropped != GENERATION else None)
            | recorded(out_dir / QA, QARecord, _key)) - {None}
    todo, skipped, planned = _todo(materials, cfg, teacher, done)
    facts: dict[str, Facts] = {}
    with _append(out_dir / ANSWERS) as ans, _append(out_dir / QA) as qa:
        answers = _Answers(ans, qa, {"teacher": teacher, "backend": backend, "seed": cfg.seed})
        asked = _prepared(todo, facts, cfg, backend, answers)
        ans.flush()
        for start in range(0, len(asked), cfg.chunk):
            if client.fatal:  # the server is gone: the rest is asked by the next run
                answers.stats["not_asked"] += len(asked) - start
                break
            chunk = asked[start:start + cfg.chunk]
            got, missing = _generate(client, chunk, cfg)
            for i, q in enumerate(chunk):
                g = got.get(i)
                error = missing if g is None else g.error
                if error is not None:
                    answers.failed(q, error)
                else:
                    answers.answered(q, g, facts[q.material.task.key].families)
            answers.flush()
            if progress:
                progress(start + len(chunk), len(asked))
    return {"planned": planned, "skipped_existing": skipped, "asked": len(asked), "kept": answers.stats["kept"],
            "dropped": dict(answers.dropped.most_common()), "generation_failed": answers.stats["generation_failed"],
            "not_asked": answers.stats["not_asked"], "first_error": answers.first_error, "fatal": client.fatal,
            "templates": dict(Counter(q.template.id for q in asked).most_common())}
