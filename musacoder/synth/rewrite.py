"""Stage 3b: `rewrite` records, a slower verified kernel and a faster verified kernel of the same task, with the
speedup MooreEval measured.

Pairs come from passing solutions (status ok, one backend, any teacher) in one or more solutions.jsonl files. Per
task, every timed solution is paired with the task's fastest one (slower -> fastest). A pair is kept when

    slow_ms / fast_ms >= max(min_speedup, 1 + sigmas * sqrt(rse_slow**2 + rse_fast**2))

(`candidate_ms`, a median, and `timing_rse`, the relative standard error of that median, of each verdict; defaults
min_speedup 1.1, sigmas 3), and the order also holds relative to each verification's own eager time
(fast.speedup_eager > slow.speedup_eager), because the two times may come from two runs and a change of load between
them must not make a pair. Anything else is dropped and counted with its reason: within noise, order not confirmed
against eager, no timing in a verdict.

So that every task the compiler teacher solves can give a pair without a model, a slow teacher makes a second
solution: Inductor with a slower configuration (`SLOW_CONFIGS`: on the cpu scalar code, `cpp.simdlen = 1`, and one
thread, `cpp.threads = 1`; on Triton no fusion, `max_fusion_size = 1`), verified like any solution and appended to
the output's solutions.jsonl as teacher `inductor-slow`. It runs on tasks with a passing `inductor` solution; a
slow program identical to the fast one is recorded as no solution.

Written to the output directory: rewrite.jsonl (kind `rewrite`: the task prompt, the slower program and the
instruction to make it faster; the answer is the faster program in one python block; metadata: both measured
times, the speedup, the threshold and where each program came from) and rewrite_pairs.jsonl (every pair judged,
kept or dropped with the reason, with both programs). Resumable: a task already tried by the slow teacher and a
(task, slower, faster) pair already judged are not redone.
"""

from __future__ import annotations

import hashlib
import math
import queue
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from string import Template

from musacoder.config import VerifyConfig
from musacoder.conversation import task_messages
from musacoder.data.schema import Provenance, RewriteMeta, RewritePair, RewriteRecord, SolutionRecord, line
from musacoder.synth.clean import with_families
from musacoder.synth.repair import Loaded, SolutionsError, passing_records
from musacoder.synth.solve import SOLUTIONS
from musacoder.synth.tasks import recorded
from musacoder.tasks.model import Task

REWRITE, PAIRS = "rewrite.jsonl", "rewrite_pairs.jsonl"
SLOW_TEACHER = "inductor-slow"
# Real torch._inductor.config knobs. cpu: scalar loops (no at::vec) in one thread instead of vectorised OpenMP loops;
# triton: every node its own kernel, so intermediates round-trip through global memory.
SLOW_CONFIGS = {"cpu": {"cpp.simdlen": 1, "cpp.threads": 1}, "triton": {"max_fusion_size": 1}}
WITHIN_NOISE = "within timing noise"
EAGER_DISAGREES = "not confirmed against eager (the order differs relative to each run's eager time)"
NO_TIMING = "no timing in a verdict"
SAME_PROGRAM = "same program: the slow configuration changed nothing"
UNPAIRED = "tasks with fewer than two timed solutions"
UNTIMED = "solutions without timing"

PROMPT = Template("""\
$task

A correct program for it is below. MooreEval verified it, and it runs in $ms ms per forward$eager.
```python
$code
```
Make it faster while keeping it correct: the rules above still hold. Reply with the complete program in ONE \
```python code block.""")


@dataclass(frozen=True)
class Solution:
    task: Task
    code: str
    teacher: str
    verdict: dict
    origin: str  # "file:line"

    @property
    def hash(self) -> str:
        return code_hash(self.code)

    @property
    def ms(self) -> float | None:
        return self.verdict.get("candidate_ms")

    def provenance(self) -> Provenance:
        v = self.verdict
        return Provenance(solution=self.hash, teacher=self.teacher, origin=self.origin, ms=v.get("candidate_ms"),
                          rse=v.get("timing_rse"), reps=v.get("timing_reps"), eager_ms=v.get("eager_ms"),
                          speedup_eager=v.get("speedup_eager"))


def code_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_passing(paths: Iterable[Path], tasks: Iterable[Task], backend: str) -> Loaded:
    """Passing solutions of `backend` (status ok, with code and verdict) in solutions.jsonl files (or directories
    holding one), each with its task; the same (task, program) once, as first seen. A missing file is an error."""
    by_key = {t.key: t for t in tasks}
    out, seen = Loaded(), set()
    for path in paths:
        file = path / SOLUTIONS if path.is_dir() else path
        if not file.is_file():
            raise SolutionsError(f"{file} does not exist")
        for rec, where in passing_records(file, by_key, backend, out, str(file), need_verdict=True):
            if (rec.task, rec.code) not in seen:
                seen.add((rec.task, rec.code))
                out.solutions.append(Solution(by_key[rec.task], rec.code, rec.teacher or "?", rec.verdict, where))
    return out


@dataclass(frozen=True)
class NoiseRule:
    """When a measured difference is a speedup and not timing noise (the module docstring states the rule)."""

    min_speedup: float = 1.1
    sigmas: float = 3.0

    def threshold(self, slow: dict, fast: dict) -> float:
        noise = math.hypot(slow.get("timing_rse") or 0.0, fast.get("timing_rse") or 0.0)
        return max(self.min_speedup, 1.0 + self.sigmas * noise)

    def judge(self, slow: dict, fast: dict) -> tuple[float | None, str | None]:
        """(speedup slow_ms / fast_ms, None when kept or the reason it is dropped) for two verdict dicts."""
        if not all(v.get("candidate_ms") and v.get("timing_rse") is not None for v in (slow, fast)):
            return None, NO_TIMING
        speedup = slow["candidate_ms"] / fast["candidate_ms"]
        if speedup < self.threshold(slow, fast):
            return speedup, WITHIN_NOISE
        se, fe = slow.get("speedup_eager"), fast.get("speedup_eager")
        if se and fe and fe <= se:
            return speedup, EAGER_DISAGREES
        return speedup, None


def rewrite_messages(task: Task, backend: str, slow: Solution) -> list[dict]:
    system, user = task_messages(task, backend)
    v = slow.verdict
    eager = f" (PyTorch eager: {v['eager_ms']:.4g} ms)" if v.get("eager_ms") else ""
    return [system, {"role": "user", "content": PROMPT.substitute(task=user["content"], ms=f"{v['candidate_ms']:.4g}",
                                                                   eager=eager, code=slow.code.strip())}]


def _pair_key(rec: RewritePair) -> tuple:
    return rec.task, rec.slow.solution, rec.fast.solution


def write_pairs(solutions: list[Solution], out_dir: Path, backend: str, rule: NoiseRule) -> dict:
    """Judge slower -> fastest pairs per task and append them to rewrite_pairs.jsonl, the kept ones as records to
    rewrite.jsonl. No verification here: the verdicts are the ones recorded with the solutions."""
    done = recorded(out_dir / PAIRS, RewritePair, _pair_key)
    by_task: dict[str, list[Solution]] = defaultdict(list)
    for s in solutions:
        by_task[s.task.key].append(s)
    kept, skipped, dropped, unpaired = 0, 0, Counter(), Counter()
    with open(out_dir / PAIRS, "a") as pairs, open(out_dir / REWRITE, "a") as rw:
        for key, group in by_task.items():
            timed = sorted((s for s in group if s.ms), key=lambda s: s.ms)
            unpaired[UNTIMED] += len(group) - len(timed)
            if len(timed) < 2:
                unpaired[UNPAIRED] += 1
                continue
            fast = timed[0]
            for slow in timed[1:]:
                if (key, slow.hash, fast.hash) in done:
                    skipped += 1
                    continue
                speedup, why = rule.judge(slow.verdict, fast.verdict)
                pair = {"source": "timed pair", "backend": backend, "speedup": speedup,
                        "threshold": rule.threshold(slow.verdict, fast.verdict),
                        "slow": slow.provenance(), "fast": fast.provenance()}
                if why is None:
                    kept += 1
                    answer = {"role": "assistant", "content": f"```python\n{fast.code.strip()}\n```"}
                    rw.write(line(RewriteRecord(messages=rewrite_messages(slow.task, backend, slow) + [answer],
                                                kind="rewrite", task=key,
                                                metadata=with_families(RewriteMeta(**pair), slow.task))))
                    rw.flush()
                else:
                    dropped[why] += 1
                # the pair's line is written last: it is the resume point
                pairs.write(line(RewritePair(**pair, task=key, kept=why is None, dropped=why, slow_code=slow.code,
                                             fast_code=fast.code)))
                pairs.flush()
    return {"kept": kept, "dropped": dict(dropped.most_common()), "skipped_existing": skipped,
            "unpaired": {k: v for k, v in unpaired.items() if v}}


def slow_candidate(task_code: str, backend: str):
    """The compiler teacher's candidate under SLOW_CONFIGS[backend] (a TeacherResult)."""
    from contextlib import ExitStack
    from unittest import mock

    import torch
    from torch._inductor import cpu_vec_isa

    from musacoder.synth.inductor import compile_candidate

    with ExitStack() as stack:
        stack.enter_context(torch._inductor.config.patch(SLOW_CONFIGS[backend]))
        # scalar code is "no vector ISA", whose one macro is "": inductor._cpu_flags would pass it on as a bare -D,
        # which the compiler refuses (Inductor's own builds skip that ISA's macros)
        stack.enter_context(mock.patch.object(cpu_vec_isa.InvalidVecISA, "_macro", []))
        return compile_candidate(task_code, backend)


def slow_teacher(solutions: list[Solution], out_dir: Path, cfg: VerifyConfig,
                 progress: Callable[[str, int, int], None] | None = None) -> tuple[list[Solution], dict]:
    """Second, slower Inductor solutions of the tasks whose `inductor` solution passed, verified (timed) and appended
    to out_dir/solutions.jsonl as they land; returns the passing ones and the summary."""
    from musacoder.api import unusable
    from musacoder.pool.local import LocalPool
    from musacoder.verifier.verdict import Status

    file = out_dir / SOLUTIONS
    done = {k for teacher, k in recorded(file, SolutionRecord, lambda r: (r.teacher, r.task))
            if teacher == SLOW_TEACHER}
    fast = {s.task.key: s for s in solutions if s.teacher == "inductor"}
    todo = [s for k, s in fast.items() if k not in done]
    teacher, verdicts, passing = Counter(), Counter(), []
    landed: queue.Queue = queue.Queue()  # (fast solution, TeacherResult, Verdict) from the pool's threads
    base = {"teacher": SLOW_TEACHER, "backend": cfg.backend, "config": SLOW_CONFIGS[cfg.backend]}
    written = len(file.read_text().splitlines()) if file.exists() else 0  # lines: where the next record lands

    def land(s: Solution, r, f):
        try:
            v = f.result()
        except Exception as e:  # noqa: BLE001 -- a verdict nobody produces would leave the wait below hanging
            v = unusable(f"the verifier failed: {e!r}", cfg, s.task.key, Status.INFRA_ERROR, cfg.backend)
        landed.put((s, r, v))

    with open(file, "a") as sol, LocalPool(cfg) as pool:

        def write(rec: SolutionRecord) -> str:
            nonlocal written
            sol.write(line(rec))
            sol.flush()
            written += 1
            return f"{file}:{written}"

        def record(s: Solution, r, v):
            verdicts[v.status.value] += 1
            where = write(SolutionRecord(task=s.task.key, **base, status=v.status.value, reason=v.reason,
                                         kernels=r.kernels, code=r.candidate, verdict=v.to_dict()))
            if v.passed:
                passing.append(Solution(s.task, r.candidate, SLOW_TEACHER, v.to_dict(), where))
            if progress:
                progress("verify", sum(verdicts.values()), teacher["ok"])

        for i, s in enumerate(todo, 1):
            r = slow_candidate(s.task.code, cfg.backend)
            if r.ok and r.candidate == s.code:
                r.candidate, r.reason = None, SAME_PROGRAM
            teacher[r.category] += 1
            if r.ok:
                try:
                    pool.submit(s.task, r.candidate).add_done_callback(lambda f, s=s, r=r: land(s, r, f))
                except Exception as e:  # noqa: BLE001 -- as in land()
                    landed.put((s, r, unusable(f"the pool refused the job: {e!r}", cfg, s.task.key,
                                               Status.INFRA_ERROR, cfg.backend)))
            else:
                write(SolutionRecord(task=s.task.key, **base, status="no_solution", reason=r.reason))
            if progress:
                progress("slow teacher", i, len(todo))
            while not landed.empty():
                record(*landed.get())
        while sum(verdicts.values()) < teacher["ok"]:
            record(*landed.get())
    return passing, {"tried": len(todo), "skipped_existing": len(fast) - len(todo),
                     "teacher": dict(teacher.most_common()), "verdicts": dict(verdicts.most_common())}


def with_output(paths: Iterable[Path], out_dir: Path) -> list[Path]:
    """The solutions files to read: those given, and the output's own solutions.jsonl (the slow teacher's earlier
    solutions) when it exists and is not among them."""
    files = [p / SOLUTIONS if p.is_dir() else p for p in paths]
    own = out_dir / SOLUTIONS
    if own.is_file() and own.resolve() not in {f.resolve() for f in files if f.exists()}:
        files.append(own)
    return files


def rewrite_records(solutions: list[Solution], out_dir: Path, cfg: VerifyConfig, rule: NoiseRule | None = None,
                    slow: bool = True, progress: Callable[[str, int, int], None] | None = None) -> dict:
    """The slow teacher (when `slow` and the backend is one of Inductor's), then the pairs; see the module doc."""
    from musacoder.synth.inductor import BACKENDS

    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {"solutions": len(solutions), "slow_teacher": None}
    pool = list(solutions)
    if slow and cfg.backend in BACKENDS:
        known = {(s.task.key, s.code) for s in pool}
        more, summary["slow_teacher"] = slow_teacher(solutions, out_dir, cfg, progress)
        pool += [s for s in more if (s.task.key, s.code) not in known]
    return {**summary, **write_pairs(pool, out_dir, cfg.backend, rule or NoiseRule())}
