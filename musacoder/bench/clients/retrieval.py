"""Honest baselines a learning claim is set against (issue 44): nearest-training-answer retrieval, and a model
prompted with its nearest training examples.

`retrieval:TRAIN` (a JSONL of SFT records, or a directory of them) answers each task with the training answer of its
nearest training task, renamed to the task's names: no model at all, so whatever it solves, training data alone
solves. Nearest: a training task that is the same computation (the canonical op graph of data/opgraph.py, the
`opgraph` detector's key) comes first, then the highest shingle Jaccard of the normalised task code (the `minhash`
detector's measure); sample s takes the (s+1)-th nearest, so Pass@k is "one of the k nearest answers passes". It
does not read feedback: a later turn repeats the first answer.

Renaming: the answer's `ModelNew.__init__` becomes the task's own `Model.__init__` (its parameters, under the
verifier's seed, are then the reference's), the answer's forward arguments and the attributes `__init__` assigns are
renamed position by position to the task's, and module-level constants the answer shares with its training task
take the task's values.

`fewshot:K:TRAIN:SPEC` wraps another client (`hf:PATH`, `openai:...`): each request gets the K nearest training
examples (task, then answer) as earlier user and assistant turns before the benchmark prompt, so a base model is
measured few-shot rather than on a format it has never seen.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

from musacoder.bench.clients.base import Client, Generation, Request
from musacoder.data.decontam import Renamer

ANSWER_KINDS = ("generation", "repair")  # records whose last turn is a program for the task of their first turn


@dataclasses.dataclass(frozen=True)
class Example:
    task: str  # the training task's code
    answer: str  # the program of its answer
    origin: str  # file:line


class TrainingIndex:
    """The (task, answer) pairs of SFT records, with each task's computation key and text shingles."""

    def __init__(self, path: str | Path):
        from musacoder.candidates import ExtractionError, extract_code
        from musacoder.data.decontam import task_code, task_shingles
        from musacoder.data.keys import Keys
        from musacoder.data.records import DataError, load_records

        self.path = Path(path)
        try:
            records, _ = load_records(self.path)
        except DataError as e:
            raise ValueError(str(e)) from e
        self.examples: list[Example] = []
        for r in records:
            task = task_code(r.to_dict()) if r.kind in ANSWER_KINDS else None
            if task is None:
                continue
            try:
                answer = extract_code(r.messages[-1]["content"])
            except ExtractionError:
                continue
            self.examples.append(Example(task, answer, r.origin))
        if not self.examples:
            raise ValueError(f"{self.path}: no training record with a task and a program answer (kinds "
                             f"{', '.join(ANSWER_KINDS)})")
        self.keys = Keys()
        self.graphs = [self.keys.facts(e.task).graph for e in self.examples]
        self.shingles = [task_shingles(e.task) for e in self.examples]

    def nearest(self, code: str) -> list[tuple[Example, str]]:
        """Every example, nearest first, with why: ('same computation' or 'Jaccard 0.83')."""
        from musacoder.data.decontam import task_shingles
        from musacoder.data.diversity import jaccard

        graph = self.keys.facts(code).graph
        sh = task_shingles(code)
        scored = [(graph is not None and g == graph, jaccard(sh, s), i)
                  for i, (g, s) in enumerate(zip(self.graphs, self.shingles))]
        scored.sort(key=lambda x: (-x[0], -x[1], x[2]))
        return [(self.examples[i], "same computation" if same else f"Jaccard {j:.2f}") for same, j, i in scored]


# ---- renaming a training answer to the task's names ------------------------------------------------------------------

def _model(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == name), None)


def _method(cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
    if cls is None:
        return None
    return next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == name), None)


def _args(fn: ast.FunctionDef | None) -> list[str]:
    return [a.arg for a in fn.args.args[1:]] if fn is not None else []


def _attrs(fn: ast.FunctionDef | None) -> list[str]:
    """The self.<name>s __init__ assigns, in order (register_buffer's names too)."""
    out = []
    for node in ast.walk(fn) if fn is not None else ():
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) \
                and node.value.id == "self":
            out.append(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "register_buffer" and node.args and isinstance(node.args[0], ast.Constant):
            out.append(str(node.args[0].value))
    return list(dict.fromkeys(out))


def _constants(tree: ast.Module) -> dict[str, ast.expr]:
    return {t.id: s.value for s in tree.body if isinstance(s, ast.Assign) for t in s.targets
            if isinstance(t, ast.Name)}


def adapt(answer: str, train_task: str, task: str) -> str:
    """The training answer with the task's __init__, argument and attribute names and constants (module docstring).
    The answer unchanged where a piece does not parse or has no ModelNew."""
    from musacoder.pyast import parse

    try:
        a, t, e = parse(answer), parse(train_task), parse(task)
    except SyntaxError:
        return answer
    new = _model(a, "ModelNew")
    t_model, e_model = _model(t, "Model"), _model(e, "Model")
    if new is None or e_model is None:
        return answer
    t_init, e_init = _method(t_model, "__init__"), _method(e_model, "__init__")
    names = dict(zip(_args(_method(t_model, "forward")), _args(_method(e_model, "forward"))))
    attrs = dict(zip(_attrs(t_init), _attrs(e_init)))
    body = []
    for s in new.body:
        if isinstance(s, ast.FunctionDef) and s.name == "__init__" and e_init is not None:
            body.append(e_init)
        elif isinstance(s, ast.FunctionDef) and s.name == "forward":
            body.append(Renamer(names, attrs).visit(s))
        else:
            body.append(s)
    new.body = body
    ours, theirs = _constants(t), _constants(e)
    for s in a.body:
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                and s.targets[0].id in ours and s.targets[0].id in theirs:
            s.value = theirs[s.targets[0].id]
    for node in ast.walk(new):  # the task's __init__ may say super(Model, self): ModelNew is not Model
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
            node.args = []
    return ast.unparse(ast.fix_missing_locations(a)) + "\n"


class RetrievalClient(Client):
    """`retrieval:TRAIN`: the nearest training answer, renamed (module docstring)."""

    def __init__(self, path: str | Path):
        self.index = TrainingIndex(path)
        self.model_id = f"retrieval:{self.index.path.resolve()}"

    def generate(self, requests: Sequence[Request]) -> Iterator[tuple[int, Generation]]:
        for i, r in enumerate(requests):
            ranked = self.index.nearest(r.task.code)
            ex, why = ranked[min(r.sample, len(ranked) - 1)]
            program = adapt(ex.answer, ex.task, r.task.code)
            yield i, Generation(text=f"Nearest training answer ({why}): {ex.origin}\n```python\n{program}```\n",
                                finish_reason="stop")


def _example_turns(examples: list[Example]) -> list[dict]:
    turns = []
    for ex in examples:
        turns += [{"role": "user", "content": f"Write `ModelNew` for this architecture:\n```python\n"
                                              f"{ex.task.strip()}\n```"},
                  {"role": "assistant", "content": f"```python\n{ex.answer.strip()}\n```"}]
    return turns


class FewShotClient(Client):
    """`fewshot:K:TRAIN:SPEC`: the inner client, each prompt led by the task's K nearest training examples."""

    def __init__(self, inner: Client, path: str | Path, k: int):
        if k < 1:
            raise ValueError(f"fewshot: K must be at least 1, not {k}")
        self.inner, self.k = inner, k
        self.index = TrainingIndex(path)
        self.model_id = f"fewshot:{k}:{self.index.path.resolve()}:{inner.model_id}"
        self.local = inner.local

    @property
    def fatal(self) -> str | None:
        return self.inner.fatal

    def cancel(self) -> None:
        self.inner.cancel()

    def prompt(self, r: Request) -> list[dict]:
        """The task's K nearest training examples before it, as many as leave the request's max_tokens of the inner
        model's context, the farthest dropped first (four shots of issue 44's answers took up to 8,882 tokens:
        SmolLM2's context is 8,192); all K where the inner client knows no context."""
        nearest = [ex for ex, _ in self.index.nearest(r.task.code)[:self.k]]
        head = 1 if r.messages and r.messages[0]["role"] == "system" else 0
        for n in range(len(nearest), -1, -1):
            msgs = r.messages[:head] + _example_turns(nearest[:n]) + r.messages[head:]
            if not self.inner.context_len or self.inner.prompt_tokens(msgs) + r.max_tokens <= self.inner.context_len:
                break
        return msgs  # with no shot fitting: the task alone, which the inner client fits or refuses

    def generate(self, requests: Sequence[Request]) -> Iterator[tuple[int, Generation]]:
        shown = [dataclasses.replace(r, messages=self.prompt(r)) for r in requests]
        for i, g in self.inner.generate(shown):
            g.messages = g.messages or shown[i].messages  # the store keeps what the model saw
            yield i, g


def from_spec(kind: str, rest: str, make) -> Client:
    """`retrieval:TRAIN` or `fewshot:K:TRAIN:SPEC`; `make(SPEC)` builds the inner client."""
    if kind == "retrieval":
        return RetrievalClient(rest)
    k, _, more = rest.partition(":")
    path, _, inner = more.partition(":")
    if not k.isdigit() or not path or not inner:
        raise ValueError(f"model spec fewshot:{rest}: expected fewshot:K:TRAIN.jsonl:SPEC, e.g. "
                         "fewshot:4:data/sft.jsonl:hf:runs/smollm2")
    return FewShotClient(make(inner), path, int(k))
