"""Stage 3a: repair and reviewer data by mutation. A verified solution gets a realistic bug (synth/mutate.py), the
mutant is verified by MooreEval for real, and a failing mutant becomes

- a `repair` record: the task prompt, the buggy answer, the verifier's feedback turn exactly as a multi-turn run
  builds it (`feedback_message(1, feedback_text(verdict), ...)`), then the original verified answer;
- a `reviewer` record: the buggy program with the instruction to find and fix the bug, answered by the operator's
  description of the bug and the original program.

A mutant that still passes (the bug does not show on the verifier's inputs, or the edit changed nothing that
matters) is dropped, as is one the verifier could not judge (infra_error); mutants.jsonl keeps every mutant with
its verdict or the reason it was dropped, and its provenance. Appends and resumes: a (task, solution, operator,
seed) already in mutants.jsonl is not tried again.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from pydantic import ValidationError

from musacoder.config import VerifyConfig
from musacoder.conversation import STYLES, feedback_message, task_messages
from musacoder.data.schema import (
    MutantRecord,
    MutationMeta,
    RepairRecord,
    ReviewerRecord,
    SolutionRecord,
    brief,
    line,
    parse,
)
from musacoder.synth.clean import with_families
from musacoder.synth.mutate import OPERATORS, Mutant, mutate
from musacoder.synth.solve import SOLUTIONS
from musacoder.synth.tasks import recorded
from musacoder.tasks.model import Task

MUTANTS, REPAIR, REVIEWER = "mutants.jsonl", "repair.jsonl", "reviewer.jsonl"
STILL_PASSES = "still passes MooreEval"
INFRA = "the verifier could not judge it (infra_error)"

REVIEW = Template("""\
The program below is meant to replace the PyTorch architecture that follows it with its own $lang kernels, but it \
has a bug. Find the bug, state it in one sentence, then give the complete corrected program in ONE ```python code \
block.

Program:
```python
$code
```

Architecture it must match:
```python
$task
```""")


class SolutionsError(ValueError):
    """The solutions cannot be read at all (no such file)."""


@dataclass
class Loaded:
    solutions: list[tuple[Task, str]] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # usable records left out, by reason (status, backend)
    problems: list[str] = field(default_factory=list)  # "file:line: what" for lines that cannot be used


def passing_records(file: Path, by_key: dict[str, Task], backend: str, out: Loaded, label: str,
                    need_verdict: bool = False) -> Iterator[tuple[SolutionRecord, str]]:
    """(record, "label:line") of each usable passing solution in `file`: status ok, of `backend`, with code (and a
    verdict when asked), of a task in `by_key`; every other line is counted in `out.skipped` or `out.problems`."""
    for n, text in enumerate(file.read_text(errors="replace").splitlines(), 1):  # a bad byte spoils one line
        where = f"{label}:{n}"
        if not text.strip():
            continue
        try:
            rec = parse(SolutionRecord, json.loads(text))
        except json.JSONDecodeError:
            out.problems.append(f"{where}: not JSON")
            continue
        except ValidationError as e:
            out.problems.append(f"{where}: not a solution record ({brief(e)})")
            continue
        if rec.status != "ok":
            out.skipped[f"status {rec.status}"] += 1
        elif rec.backend not in (None, backend):  # a hand-made file may leave the backend out
            out.skipped[f"backend {rec.backend}, not {backend}"] += 1
        elif not (rec.code or "").strip():
            out.problems.append(f"{where}: status ok but no code")
        elif need_verdict and rec.verdict is None:
            out.problems.append(f"{where}: status ok but no verdict")
        elif rec.task not in by_key:
            out.problems.append(f"{where}: task {rec.task} is not among the given tasks (pass the tasks that "
                                "`synth solve` ran on)")
        else:
            yield rec, where


def load_solutions(path: Path, tasks: Iterable[Task], backend: str) -> Loaded:
    """The passing solutions (status ok, with code) of `backend` in a `synth solve` solutions.jsonl (or the
    directory holding it), each with its task from `tasks` (solutions.jsonl stores only the task's key)."""
    file = path / SOLUTIONS if path.is_dir() else path
    if not file.is_file():
        raise SolutionsError(f"{file} does not exist" + (" (run `musacoder synth solve` first)" if path.is_dir()
                                                         else ""))
    by_key = {t.key: t for t in tasks}
    out, seen = Loaded(), set()
    for rec, _ in passing_records(file, by_key, backend, out, file.name):
        if (rec.task, rec.code) not in seen:
            seen.add((rec.task, rec.code))
            out.solutions.append((by_key[rec.task], rec.code))
    return out


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _answer(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


def plan_mutants(task: Task, code: str, k: int, seed: int,
                 operators: Iterable[str] | None = None) -> tuple[list[Mutant], list[str]]:
    """Up to k mutants of one solution, each from another operator (of `operators`, default all, tried in a seeded
    order), and the operators tried that did not apply."""
    order = [op for op in OPERATORS if operators is None or op in operators]
    random.Random(f"{seed}:{task.key}:{_hash(code)}").shuffle(order)
    mutants, missed = [], []
    for op in order:
        if len(mutants) == k:
            break
        m = mutate(op, code, seed, task.code)
        if m is None:
            missed.append(op)
        elif all(m.code != x.code for x in mutants):
            mutants.append(m)
    return mutants, missed


def reviewer_messages(task: Task, backend: str, buggy: str) -> list[dict]:
    system = task_messages(task, backend, one_shot=False)[0]
    user = REVIEW.substitute(lang=STYLES[backend].lang, code=buggy.strip(), task=task.code.strip())
    return [system, {"role": "user", "content": user}]


def _key(rec: MutantRecord) -> tuple:
    return rec.task, rec.solution, rec.operator, rec.seed


def repair_records(solutions: Iterable[tuple[Task, str]], out_dir: Path, cfg: VerifyConfig,
                   mutants_per_solution: int = 3, seed: int = 0,
                   progress: Callable[[str, int, int], None] | None = None,
                   operators: Iterable[str] | None = None) -> dict:
    """Mutate, verify (in parallel, through the process's pool for `cfg`) and write repair.jsonl, reviewer.jsonl
    and mutants.jsonl under out_dir; return the summary."""
    from musacoder.api import resolved, verify_many
    from musacoder.verifier.feedback import feedback_text
    from musacoder.verifier.verdict import Status

    cfg = resolved(cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    done = recorded(out_dir / MUTANTS, MutantRecord, _key)
    seen = recorded(out_dir / MUTANTS, MutantRecord, lambda r: r.mutant)  # the same mutant is not verified twice
    pending, skipped, duplicates, not_applicable, n_solutions = [], 0, 0, Counter(), 0
    for task, code in solutions:
        n_solutions += 1
        sol = _hash(code)
        mutants, missed = plan_mutants(task, code, mutants_per_solution, seed, operators)
        not_applicable.update(missed)
        for m in mutants:
            if (task.key, sol, m.operator, seed) in done:
                skipped += 1
            elif _hash(m.code) in seen:
                duplicates += 1
            else:
                seen.add(_hash(m.code))
                pending.append((task, code, sol, m))
    kept, dropped, verdicts = 0, Counter(), Counter()
    per_op: dict[str, Counter] = defaultdict(Counter)
    if progress:
        progress("verify", 0, len(pending))
    with open(out_dir / MUTANTS, "a") as mut, open(out_dir / REPAIR, "a") as rep, \
            open(out_dir / REVIEWER, "a") as rev:
        for n, (i, v) in enumerate(verify_many(((t, m.code) for t, _, _, m in pending), cfg), 1):
            task, code, sol, m = pending[i]
            verdicts[v.status.value] += 1
            why = STILL_PASSES if v.passed else INFRA if v.status is Status.INFRA_ERROR else None
            meta = with_families(MutationMeta(source="mutation", operator=m.operator, seed=seed, solution=sol,
                                              mutant=_hash(m.code), status=v.status.value, bug=m.description), task)
            per_op[m.operator]["tried"] += 1
            if why:
                dropped[why] += 1
                per_op[m.operator]["dropped"] += 1
            else:
                kept += 1
                per_op[m.operator]["kept"] += 1
                fix = {"role": "assistant", "content": _answer(code)}
                messages = task_messages(task, cfg.backend) + [
                    {"role": "assistant", "content": _answer(m.code)},
                    feedback_message(1, feedback_text(v), v.passed), fix]
                rep.write(line(RepairRecord(messages=messages, kind="repair", task=task.key, metadata=meta)))
                answer = {"role": "assistant", "content": f"Bug: {m.description}.\n\n{_answer(code)}"}
                rev.write(line(ReviewerRecord(messages=reviewer_messages(task, cfg.backend, m.code) + [answer],
                                              kind="reviewer", task=task.key, metadata=meta)))
                rep.flush()
                rev.flush()
            # the mutant's line is written last: it is the resume point
            mut.write(line(MutantRecord(task=task.key, solution=sol, operator=m.operator, seed=seed,
                                        mutant=meta.mutant, description=m.description, code=m.code,
                                        status=v.status.value, reason=v.reason, kept=why is None, dropped=why,
                                        verdict=v.to_dict())))
            mut.flush()
            if progress:
                progress("verify", n, len(pending))
    return {"solutions": n_solutions, "tried": len(pending), "skipped_existing": skipped, "duplicates": duplicates,
            "kept": kept, "dropped": dict(dropped.most_common()), "verdicts": dict(verdicts.most_common()),
            "operators": {op: dict(c) for op, c in sorted(per_op.items())},
            "not_applicable": dict(not_applicable.most_common())}
