"""Stage 2a/2b: solutions from a teacher, every one verified by MooreEval (strict profile) and stored with its verdict
in solutions.jsonl; the passing ones also as SFT records in sft.jsonl.

- The compiler teacher (`solve_tasks`, teacher "inductor"): Inductor's code for the task, backends `cpu` (C++/OpenMP)
  and `triton` (a GPU); the answer is the solution as the one code block. A task already tried is not tried again.
- LLM teachers (`teach_tasks`, teacher = the model SPEC): k samples per task from a generation client (an
  OpenAI-compatible server, local transformers, replay), each an episode of the one multi-turn loop
  (`episode.run_episodes`): with `turns` > 1 a failed answer gets the verifier's feedback and another turn, and a
  repaired answer becomes a multi-turn `repair` record (earlier reasoning stripped, the last turn's kept). The SFT
  answer is the teacher's raw answer, its `<think>` reasoning included. A (task, teacher, sample) already in
  solutions.jsonl is not redone; a sample whose generation failed, or that the verifier could not judge
  (infra_error), is not written and is redone on the next run.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from musacoder.bench.clients import Client, Request
from musacoder.bench.runner import request_seed
from musacoder.candidates import ExtractionError, extract_code
from musacoder.config import VerifyConfig
from musacoder.conversation import task_messages
from musacoder.data.schema import SYNTH_TRAINING, GenerationRecord, SolutionRecord, SolveMeta, line
from musacoder.episode import Episode, run_episodes
from musacoder.synth.clean import with_families
from musacoder.synth.tasks import recorded
from musacoder.tasks.model import Task
from musacoder.verifier.pipeline import unusable
from musacoder.verifier.verdict import Status, Verdict

SOLUTIONS, SFT = "solutions.jsonl", "sft.jsonl"
NO_PROMPT = "no_prompt"  # the stage-2 prompt could not be built (the reference does not run): recorded, not redone


def solve_tasks(tasks: list[Task], out_dir: Path, cfg: VerifyConfig,
                progress: Callable[[str, int, int], None] | None = None, workers: int | None = None) -> dict:
    """The compiler teacher over `tasks`, pipelined: Inductor runs in `workers` processes (default: half the cores;
    one: in this process) and each candidate is verified as soon as it is made, so the teacher's CPU time and the
    verifier's device time overlap. Every record is written when its verdict arrives (resume loses nothing)."""
    from musacoder.pool.local import LocalPool

    out_dir.mkdir(parents=True, exist_ok=True)
    done = {k for teacher, k in recorded(out_dir / SOLUTIONS, SolutionRecord, lambda r: (r.teacher, r.task))
            if teacher == "inductor"}  # an LLM teacher's samples of the task in the same file do not count
    todo = [t for t in tasks if t.key not in done]
    workers = workers or max(1, (os.cpu_count() or 2) // 2)
    teacher, verdicts = Counter(), Counter()
    verdict_q: queue.Queue = queue.Queue()  # (task, TeacherResult, Verdict) from the pool's threads
    with open(out_dir / SOLUTIONS, "a") as sol, open(out_dir / SFT, "a") as sft, LocalPool(cfg) as pool:

        def record(t, r, v):
            verdicts[v.status.value] += 1
            _write_solution(sol, sft, t, r, v, cfg.backend)
            if progress:
                progress("verify", sum(verdicts.values()), teacher["ok"])

        # Inductor stays on this thread (it is not thread-safe to drive from another); verdicts are written
        # between teacher results, as they arrive.
        for taught, (t, r) in enumerate(_inductor(todo, cfg.backend, workers), 1):
            teacher[r.category] += 1
            if r.ok:
                try:
                    pool.submit(t, r.candidate).add_done_callback(
                        lambda f, t=t, r=r: verdict_q.put((t, r, f.result())))
                except Exception as e:  # a verdict nobody produces would leave the wait below hanging
                    verdict_q.put((t, r, pool._failed(t, e)))
            else:
                sol.write(line(SolutionRecord(task=t.key, teacher="inductor", backend=cfg.backend,
                                              status="no_solution", reason=r.reason)))
            if progress:
                progress("teacher", taught, len(todo))
            while not verdict_q.empty():
                record(*verdict_q.get())
            sol.flush()
            sft.flush()
        while sum(verdicts.values()) < teacher["ok"]:
            record(*verdict_q.get())
            sol.flush()
            sft.flush()
    return {"tried": len(todo), "skipped_existing": len(tasks) - len(todo), "teacher": dict(teacher.most_common()),
            "verdicts": dict(verdicts.most_common())}


def _inductor(tasks: list[Task], backend: str, workers: int):
    """(task, TeacherResult) as each is made: in this process, or in `workers` fresh processes (spawned: Inductor and
    the device context are not fork-safe). A crashed teacher process costs its tasks a recorded reason."""
    from musacoder.synth.inductor import TeacherResult, compile_candidate

    if workers <= 1 or len(tasks) <= 1:
        for t in tasks:
            yield t, compile_candidate(t.code, backend)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=ctx, max_tasks_per_child=64) as ex:
        futs = {ex.submit(compile_candidate, t.code, backend): t for t in tasks}
        for f in as_completed(futs):
            try:
                r = f.result()
            except Exception as e:  # the process died (a crash inside the compiler): no candidate, said why
                r = TeacherResult(None, f"teacher failed: its process died ({type(e).__name__})", backend)
            yield futs[f], r


def _write_solution(sol, sft, t: Task, r, v: Verdict, backend: str) -> None:
    sol.write(line(SolutionRecord(task=t.key, teacher="inductor", backend=backend, status=v.status.value,
                                  reason=v.reason, kernels=r.kernels, code=r.candidate, verdict=v.to_dict())))
    if v.passed:
        answer = f"```python\n{r.candidate.strip()}\n```"
        meta = SolveMeta(teacher="inductor", status=v.status.value, speedup_eager=v.speedup_eager)
        sft.write(line(GenerationRecord(
            messages=task_messages(t, backend) + [{"role": "assistant", "content": answer}], kind="generation",
            task=t.key, metadata=with_families(meta, t))))


@dataclass
class TeacherConfig:
    samples: int = 8  # per task
    temperature: float = 0.7  # bench's defaults
    top_p: float = 1.0
    max_tokens: int = 32768
    turns: int = 1  # responses per sample; > 1: feedback turns after a failure, repaired answers as repair records
    prompt: str = "bench"  # bench | stage2 (synth/prompts.py)
    one_shot: bool = True
    seed: int = 0  # base of the per-request sampling seeds (bench's request_seed)
    chunk: int = 64  # samples generated and verified together, then written: what an interruption can lose


@dataclass
class _Answer:
    """One generation as the episode keeps it (Round.sample), with the prompt sent and, once verified, the verdict."""

    text: str
    n_tokens: int
    messages: list
    finish_reason: str | None = None
    error: str | None = None  # the generation failed, or the verifier could not judge it: the sample is redone
    verdict: Verdict | None = None


@dataclass
class _Sample(Episode):
    sample: int = 0


class _Chunk:
    """run_episodes' generate and verify callbacks for one chunk of samples."""

    def __init__(self, episodes: list[_Sample], client: Client, pool, cfg: TeacherConfig):
        self.episodes, self.client, self.pool, self.cfg = episodes, client, pool, cfg
        self.live: list[_Sample] = []
        self.answers: list[_Answer] = []

    def generate(self, prompts: list[list[dict]]) -> list[_Answer]:
        # run_episodes asks, in order, for its unfinished episodes (no `fits` is given, so none is dropped)
        self.live = [e for e in self.episodes if not e.finished]
        assert len(self.live) == len(prompts)
        c = self.cfg
        reqs = [Request(e.task, e.sample, len(e.rounds) + 1, p, c.temperature, c.top_p, c.max_tokens,
                        request_seed(c.seed, e.task.key, e.sample, len(e.rounds) + 1))
                for e, p in zip(self.live, prompts)]
        got: dict[int, _Answer] = {}
        missing = "no answer (the client stopped)"
        try:
            for i, g in self.client.generate(reqs):
                got[i] = _Answer(g.text, g.completion_tokens or 0, g.messages or reqs[i].messages, g.finish_reason,
                                 g.error)
        except Exception as e:  # noqa: BLE001 -- a client bug must not lose the run: what it did not answer is redone
            missing = f"client failed: {type(e).__name__}: {e}"
        self.answers = [got.get(i) or _Answer("", 0, r.messages, error=missing) for i, r in enumerate(reqs)]
        return self.answers

    def verify(self, pairs: list[tuple[Task, str]]) -> list[Verdict]:
        todo = [i for i, a in enumerate(self.answers) if a.error is None]
        for j, v in self.pool.verify_many([pairs[i] for i in todo]):
            self.answers[todo[j]].verdict = v
            if v.status is Status.INFRA_ERROR:
                self.answers[todo[j]].error = f"infra_error: {v.reason}"
        for e, a in zip(self.live, self.answers):
            if a.error is not None:
                e.max_turns = len(e.rounds) + 1  # this round ends the episode: the sample is redone whole
                a.verdict = a.verdict or unusable(a.error, task=e.task.key, status=Status.INFRA_ERROR)
        return [a.verdict for a in self.answers]


def _code(text: str) -> str | None:
    try:
        return extract_code(text)
    except ExtractionError:
        return None


def teach_tasks(tasks: list[Task], out_dir: Path, vcfg: VerifyConfig, client: Client, teacher: str,
                cfg: TeacherConfig | None = None, progress: Callable[[str, int, int], None] | None = None) -> dict:
    """k samples per task from `client` (teacher: its model spec, recorded), verified and written; returns the
    summary. `unfinished` samples (failed generation, infra_error, a dead server) are redone by the next run."""
    from musacoder.pool.local import LocalPool
    from musacoder.synth.prompts import MetadataError, prompt_messages

    cfg = cfg or TeacherConfig()
    out_dir.mkdir(parents=True, exist_ok=True)
    done = recorded(out_dir / SOLUTIONS, SolutionRecord, lambda r: (r.task, r.teacher, r.sample))
    todo = [(t, s) for t in tasks for s in range(cfg.samples) if (t.key, teacher, s) not in done]
    base = {"teacher": teacher, "backend": vcfg.backend, "prompt": cfg.prompt}
    stats, verdicts = Counter(), Counter()
    episodes, firsts, first_error = [], {}, None
    with open(out_dir / SOLUTIONS, "a") as sol, open(out_dir / SFT, "a") as sft:
        for t, s in todo:
            if t.key not in firsts:
                try:
                    firsts[t.key] = prompt_messages(t, vcfg.backend, cfg.prompt, cfg.one_shot, vcfg.precision)
                except MetadataError as e:
                    firsts[t.key] = str(e)
            if isinstance(firsts[t.key], str):
                stats[NO_PROMPT] += 1
                sol.write(line(SolutionRecord(task=t.key, **base, sample=s, status=NO_PROMPT, reason=firsts[t.key])))
            else:
                episodes.append(_Sample(t, firsts[t.key], max_turns=cfg.turns, sample=s))
        sol.flush()
        with LocalPool(vcfg) as pool:
            for start in range(0, len(episodes), cfg.chunk):
                if client.fatal:  # the server is gone: the rest stays unfinished
                    break
                chunk = _Chunk(episodes[start:start + cfg.chunk], client, pool, cfg)
                run_episodes(chunk.episodes, chunk.generate, chunk.verify)
                for e in chunk.episodes:
                    failed = next((r.sample.error for r in e.rounds if r.sample.error), None)
                    if failed:
                        stats["infra_error" if failed.startswith("infra_error") else "generation_error"] += 1
                        first_error = first_error or failed
                        continue
                    stats["answered"] += 1
                    for turn, r in enumerate(e.rounds, 1):
                        v = r.sample.verdict
                        verdicts[v.status.value] += 1
                        sol.write(line(SolutionRecord(
                            task=e.task.key, **base, sample=e.sample, turn=turn, status=v.status.value,
                            reason=v.reason, code=_code(r.text), raw=r.text, tokens=r.tokens,
                            finish_reason=r.sample.finish_reason, verdict=v.to_dict())))
                    last = e.rounds[-1]
                    if last.passed:
                        stats["sft"] += 1
                        meta = SolveMeta(**base, sample=e.sample, turns=len(e.rounds), status=last.status,
                                         speedup_eager=last.sample.verdict.speedup_eager)
                        # one turn: a generation record; more: a repair record (the answer repaired after the
                        # verifier's feedback); the kind picks the model
                        sft.write(line(SYNTH_TRAINING.validate_python({
                            "messages": last.sample.messages + [{"role": "assistant", "content": last.text}],
                            "kind": "generation" if len(e.rounds) == 1 else "repair", "task": e.task.key,
                            "metadata": with_families(meta, e.task)})))
                sol.flush()
                sft.flush()
                if progress:
                    progress("samples", start + len(chunk.episodes), len(episodes))
    unfinished = len(episodes) - stats["answered"]
    return {"tried": len(todo), "skipped_existing": len(tasks) * cfg.samples - len(todo),
            "teacher": {k: stats[k] for k in ("answered", NO_PROMPT, "generation_error", "infra_error") if stats[k]},
            "verdicts": dict(verdicts.most_common()), "sft": stats["sft"], "unfinished": unfinished,
            "first_error": first_error, "fatal": client.fatal}
