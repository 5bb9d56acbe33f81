"""Stage 2a: solutions from the compiler teacher, every one verified by MooreEval (strict profile) and stored with
its verdict; the passing ones also as SFT records (the run's prompt, the solution as the one code block).

Teacher backends: `cpu` (Inductor's C++/OpenMP) and `triton` (Inductor's Triton, needs a GPU). Appends and resumes:
a task already in solutions.jsonl is not tried again. LLM teachers (2b) will write the same records."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from musacoder.config import VerifyConfig
from musacoder.conversation import task_messages
from musacoder.synth.tasks import recorded
from musacoder.tasks.model import Task

SOLUTIONS, SFT = "solutions.jsonl", "sft.jsonl"


def solve_tasks(tasks: list[Task], out_dir: Path, cfg: VerifyConfig,
                progress: Callable[[str, int, int], None] | None = None) -> dict:
    from musacoder.pool.local import LocalPool
    from musacoder.synth.inductor import compile_candidate

    out_dir.mkdir(parents=True, exist_ok=True)
    done = recorded(out_dir / SOLUTIONS, lambda r: r["task"])
    todo = [t for t in tasks if t.key not in done]
    teacher = Counter()
    with open(out_dir / SOLUTIONS, "a") as sol, open(out_dir / SFT, "a") as sft:
        pending = []
        for i, t in enumerate(todo):
            r = compile_candidate(t.code, cfg.backend)
            teacher[r.category] += 1
            if r.ok:
                pending.append((t, r))
            else:
                sol.write(json.dumps({"task": t.key, "teacher": "inductor", "backend": cfg.backend,
                                      "status": "no_solution", "reason": r.reason}) + "\n")
            if progress:
                progress("teacher", i + 1, len(todo))
        verdicts = Counter()
        with LocalPool(cfg) as pool:
            for n, (i, v) in enumerate(pool.verify_many((t, r.candidate) for t, r in pending), 1):
                t, r = pending[i]
                verdicts[v.status.value] += 1
                sol.write(json.dumps({"task": t.key, "teacher": "inductor", "backend": cfg.backend,
                                      "status": v.status.value, "reason": v.reason, "kernels": r.kernels,
                                      "code": r.candidate, "verdict": v.to_dict()}) + "\n")
                if v.passed:
                    answer = f"```python\n{r.candidate.strip()}\n```"
                    rec = {"messages": task_messages(t, cfg.backend) + [{"role": "assistant", "content": answer}],
                           "kind": "generation", "task": t.key,
                           "metadata": {"teacher": "inductor", "status": v.status.value,
                                        "speedup_eager": v.speedup_eager}}
                    sft.write(json.dumps(rec) + "\n")
                sol.flush()
                sft.flush()
                if progress:
                    progress("verify", n, len(pending))
    return {"tried": len(todo), "skipped_existing": len(tasks) - len(todo), "teacher": dict(teacher.most_common()),
            "verdicts": dict(verdicts.most_common())}
