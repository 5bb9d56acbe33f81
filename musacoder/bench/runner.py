"""`run_bench`: generate, extract, verify, store; resumable; metrics and report at the end.

Each turn is a pipeline: a thread generates (streaming results into the store) while this thread verifies whatever
has been generated so far through the verifier's batch API, so the model server and the verifier work at once
(`overlap=False`, and local generation, generate the whole turn first). Turn t+1 of a sample is asked only once
turn t has its verdict, with that verdict's feedback.

Ctrl-C: the first stops generation and asks for nothing more, says how many verifications are in flight and waits
for them (their verdicts are stored); a second exits at once. Either way a rerun resumes from what was stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import sys
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, TaskID

from musacoder import conversation
from musacoder.api import verify_many
from musacoder.bench.clients.base import Client, Generation, Request
from musacoder.bench.metrics import FAST_PS, compute_metrics
from musacoder.bench.store import GENERATED, GENERATION_ERROR, Row, RunMismatch, Store
from musacoder.candidates import ExtractionError, extract_code
from musacoder.config import VerifyConfig
from musacoder.episode import Episode, Round
from musacoder.progress import LoggedProgress
from musacoder.tasks.model import Task

RETRY_VERDICTS = {"infra_error"}  # the verifier failed, not the candidate: verify again on the next run


@dataclass
class BenchConfig:
    samples: int = 8  # per task and turn (the paper: 8)
    temperature: float = 0.7  # the paper's evaluation temperature
    top_p: float = 1.0  # not published for evaluation; 1.0 leaves sampling to the temperature
    max_tokens: int = 32768  # the paper's response limit
    turns: int = 1  # responses per sample; > 1 adds verifier-feedback turns (the paper: up to 3)
    stop_on_success: bool = True  # no further turn once one passes (the paper); False: ask to optimise instead
    backend: str = "auto"  # prompt style and verifier backend: auto (cuda if available, else cpu) | cpu | cuda | triton
    one_shot: bool = True  # include the built-in one-shot example (an elementwise add) in the prompt
    faster_threshold: float = 1.1  # Faster Rate counts correct samples with speedup above this
    fast_ps: tuple[float, ...] = FAST_PS
    seed: int = 0  # base of the per-request sampling seeds
    # Verify while generating. Off (and always off for local generation): each turn is generated in full first,
    # so a model sharing the device does not disturb the timings.
    overlap: bool = True


class Interrupts:
    """SIGINT while a run is under way (installed from the main thread only). The first Ctrl-C calls `on_stop`
    (generation ends at once) and, with verifications in flight, lets them finish so their verdicts are stored,
    saying how many it waits for; the runner then raises KeyboardInterrupt. A second exits at once, without waiting
    for the verifier's workers to drain (they die with this process)."""

    def __init__(self):
        self.stopping = False
        self.in_flight = 0  # verifications submitted and not yet stored
        self.on_stop = lambda: None
        self._old = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)

    def _handle(self, signum, frame):
        if self.stopping:
            sys.stderr.write(f"interrupted again: exiting now; {self.in_flight} verification(s) not stored (a rerun "
                             "does them)\n")
            sys.stderr.flush()
            os._exit(130)
        self.stopping = True
        self.on_stop()
        if not self.in_flight:
            raise KeyboardInterrupt
        sys.stderr.write(f"interrupted: nothing new is generated or verified; waiting for the {self.in_flight} "
                         "verification(s) in flight, whose verdicts are stored (Ctrl-C again to exit now)\n")
        sys.stderr.flush()

    def check(self) -> None:
        """Raise KeyboardInterrupt once a first Ctrl-C came and nothing is in flight any more."""
        if self.stopping and not self.in_flight:
            raise KeyboardInterrupt


def resolve_backend(backend: str) -> str:
    if backend == "auto":
        from musacoder.backends import resolve  # torch imported there, not here: `--help` must stay fast

        return resolve(backend)
    if backend not in conversation.STYLES:
        raise ValueError(f"backend must be auto, {', '.join(conversation.STYLES)}; not {backend!r}")
    return backend


def _prompt_version(backend: str) -> str:
    c = conversation
    parts = [c.SYSTEM, c.TASK.template, c.EXAMPLE.template, c.FEEDBACK.template, c.FIX, c.OPTIMISE,
             c.EXAMPLE_REFERENCE, *asdict(c.STYLES[backend]).values()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def identity(cfg: BenchConfig, client: Client, vcfg: VerifyConfig) -> dict:
    """What a run's numbers depend on; a resumed run must match it (samples and turns may grow)."""
    return {"model": client.model_id, "backend": vcfg.backend, "prompt": _prompt_version(vcfg.backend),
            "temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": cfg.max_tokens,
            "seed": cfg.seed, "one_shot": cfg.one_shot, "stop_on_success": cfg.stop_on_success,
            "profile": vcfg.profile, "precision": vcfg.precision, "timing": vcfg.timing_enabled}


def request_seed(base: int, task: str, sample: int, turn: int) -> int:
    return int(hashlib.sha256(f"{base}|{task}|{sample}|{turn}".encode()).hexdigest()[:8], 16)


def plan(tasks: list[Task], rows: list[Row], cfg: BenchConfig, backend: str, turn: int
         ) -> tuple[list[Request], list[Row]]:
    """What turn `turn` still needs: requests to generate, and generated rows to verify."""
    have = {(r.task, r.sample, r.turn): r for r in rows}
    gen, ver = [], []
    for task in tasks:
        first = conversation.task_messages(task, backend, cfg.one_shot)
        for s in range(cfg.samples):
            prev = [have.get((task.key, s, k)) for k in range(1, turn)]
            if not all(p is not None and p.verified for p in prev):
                continue  # an earlier turn is unfinished: it comes first
            ep = Episode(task, first, max_turns=cfg.turns, stop_on_success=cfg.stop_on_success,
                         rounds=[Round(p.raw, p.verdict["feedback"], p.passed) for p in prev])
            if ep.finished:
                continue
            row = have.get((task.key, s, turn))
            if row is None or row.status == GENERATION_ERROR:
                gen.append(Request(task, s, turn, ep.messages(), cfg.temperature, cfg.top_p, cfg.max_tokens,
                                   request_seed(cfg.seed, task.key, s, turn)))
            elif row.status == GENERATED or row.status in RETRY_VERDICTS:
                ver.append(row)
    return gen, ver


def unfinished(tasks: list[Task], rows: list[Row], cfg: BenchConfig, backend: str) -> int:
    """Samples with a step still to do (never generated, failed generation, unverified, a turn missing)."""
    todo = set()
    for turn in range(1, cfg.turns + 1):
        gen, ver = plan(tasks, rows, cfg, backend, turn)
        todo |= {(r.task.key, r.sample) for r in gen} | {(r.task, r.sample) for r in ver}
    return len(todo)


def _code(text: str) -> str | None:
    try:
        return extract_code(text)
    except ExtractionError:
        return None


def identical_samples(texts: dict[str, list[str]], temperature: float) -> str | None:
    """A warning when a task's samples came back identical although sampled: the server ignores temperature (as
    `transformers serve` does for a checkpoint without `do_sample`), which makes Pass@k meaningless."""
    same = sorted(k for k, t in texts.items() if len(t) > 1 and len(set(t)) == 1)
    if temperature <= 0 or not same:
        return None
    return (f"the samples of {len(same)} task(s) came back identical at temperature {temperature:g} "
            f"({', '.join(same[:3])}{', ...' if len(same) > 3 else ''}): does the server ignore temperature? "
            "Pass@k is then meaningless")


class _Generation:
    """One turn's generation (on a thread of its own when it overlaps verification): each answer stored, those to
    verify put on `ready`, then None."""

    def __init__(self, turn: int, gen: list[Request], client: Client, store: Store, progress: Progress, gbar: TaskID,
                 vbar: TaskID, to_verify: int):
        self.turn, self.gen, self.client, self.store = turn, gen, client, store
        self.progress, self.gbar, self.vbar = progress, gbar, vbar
        self.ready: queue.Queue = queue.Queue()  # (task, sample, raw) waiting for verification; None: generation ended
        self.stop = threading.Event()
        self.failures, self.to_verify = 0, to_verify
        self.texts: dict[str, list[str]] = {}  # task -> this turn's answers, to spot a server that ignores temperature

    def run(self) -> None:
        left = set(range(len(self.gen)))
        try:
            for i, g in self.client.generate(self.gen):
                if self.stop.is_set():
                    return
                r = self.gen[i]
                self.store.put_generation(r.task.key, r.task.level, r.sample, self.turn, g.messages or r.messages, g,
                                          None if g.error else _code(g.text))
                left.discard(i)
                self.answered(r, g)
            if warning := identical_samples(self.texts, self.gen[0].temperature):
                self.progress.console.print(f"[yellow]warning:[/yellow] {warning}")
        except Exception as e:  # noqa: BLE001 -- a client bug must not lose the run: what it did not answer is recorded as failed
            if not self.stop.is_set():
                self.unanswered(left, e)
        finally:
            self.ready.put(None)

    def answered(self, r: Request, g: Generation) -> None:
        """A stored answer counted, and queued for verification unless its generation failed."""
        self.failures += bool(g.error)
        self.progress.update(self.gbar, advance=1, description=f"turn {self.turn}: generate"
                             + (f" [red]({self.failures} failed)[/red]" if self.failures else ""))
        if g.error:
            return
        self.texts.setdefault(r.task.key, []).append(g.text)
        self.to_verify += 1
        self.progress.update(self.vbar, total=self.to_verify)
        self.ready.put((r.task, r.sample, g.text))

    def unanswered(self, left: set[int], e: Exception) -> None:
        """The requests the client did not answer, stored as failed (the next run asks them again)."""
        for i in left:
            r = self.gen[i]
            self.store.put_generation(r.task.key, r.task.level, r.sample, self.turn, r.messages,
                                      Generation(error=f"client failed: {type(e).__name__}: {e}"), None)

    def stop_generating(self) -> None:
        self.stop.set()
        self.client.cancel()


def _run_turn(turn: int, gen: list[Request], ver: list[Row], by_key: dict[str, Task], client: Client, store: Store,
              vcfg: VerifyConfig, progress: Progress, overlap: bool, interrupts: Interrupts) -> None:
    gbar = progress.add_task(f"turn {turn}: generate", total=len(gen))
    vbar = progress.add_task(f"turn {turn}: verify", total=len(ver))
    generation = _Generation(turn, gen, client, store, progress, gbar, vbar, len(ver))
    ready = generation.ready
    interrupts.on_stop = generation.stop_generating
    items = [(by_key[r.task], r.sample, r.raw) for r in ver]
    generating = bool(gen)
    if generating and overlap:
        threading.Thread(target=generation.run, daemon=True, name="bench-generate").start()
    elif generating:
        generation.run()
    try:
        while items or generating:
            block = not items  # nothing to verify: wait for one generation, then take all that are there
            while generating and (block or not ready.empty()):
                item, block = ready.get(), False
                generating = item is not None
                items += [item] if item else []
            interrupts.check()
            batch, items = items, []
            interrupts.in_flight = len(batch)
            for i, v in verify_many([(t, raw) for t, _, raw in batch], vcfg) if batch else ():
                task, sample, _ = batch[i]
                store.put_verdict(task.key, sample, turn, v)
                interrupts.in_flight -= 1
                progress.update(vbar, advance=1)
            interrupts.check()
    finally:
        interrupts.in_flight = 0
        generation.stop_generating()  # Ctrl-C: stop waiting on the server now, not when its answers arrive


def check_subset(rows: list[Row], cfg: BenchConfig, force: bool) -> None:
    """Fewer samples or turns than the directory holds would rewrite metrics.json and report.md over a subset."""
    have_s = max((r.sample for r in rows), default=-1) + 1
    have_t = max((r.turn for r in rows), default=0)
    if not force and (cfg.samples < have_s or cfg.turns < have_t):
        raise RunMismatch(f"this run holds {have_s} samples and {have_t} turn(s) per task; --samples {cfg.samples} "
                          f"--turns {cfg.turns} would rewrite metrics.json and report.md over a subset. Rerun with "
                          "the stored numbers, or pass --force to report the subset")


def run_bench(tasks: list[Task], client: Client, out_dir: str | Path, config: BenchConfig | None = None,
              verify: VerifyConfig | None = None, console: Console | None = None, force: bool = False,
              **overrides) -> dict:
    """Run (or resume) a benchmark into `out_dir`; return the metrics also written to `out_dir/metrics.json`.

    `overrides` are BenchConfig fields, e.g. `run_bench(tasks, client, out, samples=8, turns=3)`. `force` allows
    reporting fewer samples/turns than the directory holds (refused otherwise: `RunMismatch`).
    """
    from musacoder.bench.report import write_report

    cfg = replace(config or BenchConfig(), **overrides)
    vcfg = replace(verify or VerifyConfig(), backend=resolve_backend(cfg.backend))
    out = Path(out_dir)
    store = Store(out / "samples.sqlite")
    try:
        ident = identity(cfg, client, vcfg)
        store.check_identity(ident)
        stored = store.rows()
        check_subset(stored, cfg, force)
        by_key = {t.key: t for t in tasks}
        if stored and console is not None:
            total = len(tasks) * cfg.samples
            mine = [r for r in stored if r.task in by_key and r.sample < cfg.samples and r.turn <= cfg.turns]
            console.print(f"resuming: {total - unfinished(tasks, mine, cfg, vcfg.backend)} of {total} samples done")
        with LoggedProgress(console=console, transient=False) as progress, Interrupts() as interrupts:
            for turn in range(1, cfg.turns + 1):
                gen, ver = plan(tasks, store.rows(), cfg, vcfg.backend, turn)
                if gen or ver:
                    _run_turn(turn, gen, ver, by_key, client, store, vcfg, progress, cfg.overlap and not client.local,
                              interrupts)
        rows = [r for r in store.rows() if r.task in by_key and r.sample < cfg.samples and r.turn <= cfg.turns]
        metrics = compute_metrics(rows, cfg.faster_threshold, cfg.fast_ps, multi_turn=cfg.turns > 1)
        metrics["unfinished"] = unfinished(tasks, rows, cfg, vcfg.backend)
        metrics["run"] = {**ident, "samples": cfg.samples, "turns": cfg.turns, "tasks": len(tasks)}
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
        write_report(out, metrics, rows)
        return metrics
    finally:
        store.close()
