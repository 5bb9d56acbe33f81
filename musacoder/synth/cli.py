"""`musacoder synth`: build training data (the method's step 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from musacoder.cli_base import App, Backend, err, fail
from musacoder.progress import LoggedProgress
from musacoder.tasks.select import IdsOpt, LevelsOpt, NamesOpt, TasksOpt

synth_app = App(add_completion=False, no_args_is_help=True, help="Synthesize tasks and verified solutions.")


@synth_app.command("tasks")
def tasks(out: Path = typer.Option(..., help="JSONL of kept tasks (KernelBench records); dropped.jsonl beside it"),
          source: Literal["graphs", "harvest"] = typer.Option(
              "graphs", help="graphs (random operator graphs) or harvest (real modules of torch.nn, "
                             "torch.nn.functional, transformers, torchvision, timm)"),
          n: int | None = typer.Option(None, min=1, help="graphs to generate (default 100); harvest: the first N "
                                                         "origins (default all)"),
          seed: int = typer.Option(0, help="first seed; seeds seed..seed+n-1, each reproducible (harvest: draws "
                                           "every origin's sizes)"),
          libs: str | None = typer.Option(None, help="harvest: comma-separated sources among nn, functional, "
                                                     "transformers, torchvision, timm (default: all)"),
          match: str | None = typer.Option(None, help="harvest: comma-separated glob patterns over the origin or "
                                                      "its last name, e.g. 'Conv*,torch.nn.functional.*'"),
          min_ops: int = typer.Option(2, min=1), max_ops: int = typer.Option(5, min=1),
          families: str | None = typer.Option(None, help="comma-separated operator families (default: all)"),
          fusion_depth: int = typer.Option(1, min=0, help="binary merges of earlier branches per graph, at most"),
          size: float = typer.Option(1.0, min=0.01, help="multiplies the drawn tensor sizes"),
          check_scale: float = typer.Option(1.0, min=0.01, max=1.0,
                                            help="run the cleaning checks at these sizes (cheaper)")):
    """Random operator graphs over KernelBench's families (or, with --source harvest, real modules of the installed
    libraries) as tasks, checked and cleaned. Resumable (appends)."""

    from musacoder.synth.graphs import FAMILIES, GraphSpec
    from musacoder.synth.tasks import synth_tasks

    if source == "harvest":
        return _harvest(out, n, seed, size, check_scale, libs, match)
    n = 100 if n is None else n
    try:
        fams = tuple(f.strip() for f in families.split(",") if f.strip()) if families else FAMILIES
        spec = GraphSpec(min_ops=min_ops, max_ops=max_ops, families=fams, fusion_depth=fusion_depth, size=size)
    except ValueError as e:
        fail(e)
    if out.exists() and out.is_dir():
        fail(f"{out} is a directory; give a .jsonl file")
    with LoggedProgress(console=err, transient=True) as bar:
        job = bar.add_task("generating and checking", total=n)
        summary = synth_tasks(out, n, seed, spec, check_scale, lambda i, total: bar.update(job, completed=i,
                                                                                           total=total))
    _report(summary, out)


def _report(summary: dict, out: Path):
    err.print(f"{summary['kept']} kept, {summary['generated'] - summary['kept']} dropped"
              + (f", {summary['skipped_existing']} already done" if summary["skipped_existing"] else "")
              + f"  ->  {out}")
    for reason, count in summary["dropped"].items():
        err.print(f"  dropped {count}: {reason}")
    if summary["families"]:
        err.print("  families of kept tasks: " + ", ".join(f"{k} {v}" for k, v in summary["families"].items()))


def _csv(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def _harvest(out: Path, n: int | None, seed: int, size: float, check_scale: float, libs: str | None,
             match: str | None):
    """`synth tasks --source harvest`: real modules of the installed libraries (synth/harvest.py)."""

    from musacoder.synth.harvest import LIBS, HarvestSpec, harvest_tasks

    if out.exists() and out.is_dir():
        fail(f"{out} is a directory; give a .jsonl file")
    with LoggedProgress(console=err, transient=True) as bar:
        job = bar.add_task("harvesting and checking", total=None)
        try:
            spec = HarvestSpec(seed=seed, size=size, libs=_csv(libs) if libs else LIBS, match=_csv(match or ""))
            summary = harvest_tasks(out, spec, check_scale, n, lambda i, total: bar.update(job, completed=i,
                                                                                           total=total))
        except ValueError as e:  # a bad source name, or nothing to harvest
            fail(e)
    _report(summary, out)
    for src, counts in summary["sources"].items():
        err.print(f"  {src}: {counts.get('kept', 0)} kept, {counts.get('dropped', 0)} dropped")
    for what, why in summary["unavailable"].items():
        err.print(f"  not harvested: {what}: {why}")


@synth_app.command("solve")
def solve(out: Path = typer.Option(..., help="directory: solutions.jsonl (every try, with its verdict), sft.jsonl"),
          tasks: TasksOpt = None, levels: LevelsOpt = None, ids: IdsOpt = None, names: NamesOpt = None,
          teacher: str = typer.Option("inductor", help="inductor (the compiler teacher) or a model SPEC: "
                                      "openai:MODEL@URL, hf:PATH or replay:PATH, as in `bench run --model`"),
          backend: str = typer.Option("cpu", help="inductor: cpu (its C++) or triton (its Triton, a GPU); a model "
                                                  "teacher: also cuda (the prompt style and the verifier)"),
          limit: int | None = typer.Option(None, min=1, help="the first N tasks only"),
          workers: int | None = typer.Option(None, min=1, help="inductor: processes running the compiler teacher "
                                                              "(default: half the cores)"),
          samples: int = typer.Option(8, min=1, help="samples per task (model teachers)"),
          temperature: float = typer.Option(0.7, min=0.0),
          top_p: float = typer.Option(1.0, min=0.0, max=1.0),
          max_tokens: int = typer.Option(32768, min=1, help="response token limit"),
          turns: int = typer.Option(1, "--turns", "--rounds", min=1,
                                    help="responses per sample; > 1 gives a failed answer the verifier's feedback "
                                         "and another turn, and a repaired answer becomes a multi-turn repair record"),
          prompt: Literal["bench", "stage2"] = typer.Option(
              "bench", help="bench (the benchmark's prompt) or stage2 (plus measured tensor metadata and the six-step "
                            "reasoning template, answered in <think>; model teachers)"),
          set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE",
                                         help="a verifier setting, YAML value; repeatable (devices=[0,0]: two device "
                                              "workers on GPU 0)")):
    """Teacher solutions for the selected tasks (`synth tasks` output, KernelBench, ...), each verified by MooreEval
    (strict); the passing ones as SFT records. The compiler teacher tries each task once; a model teacher answers
    --samples times per task (kept with its reasoning). Resumable; exit 1 when samples are left unfinished (a failed
    generation, a dead server): rerun the same command to retry them."""
    from rich.markup import escape

    from musacoder.config import VerifyConfig
    from musacoder.conversation import STYLES
    from musacoder.synth.solve import SFT, SOLUTIONS, TeacherConfig, solve_tasks, teach_tasks
    from musacoder.tasks import TaskLoadError
    from musacoder.tasks.select import select_tasks

    if teacher == "inductor" and backend not in ("cpu", "triton"):
        fail(f"--backend must be cpu or triton (the compiler teacher's), not {backend!r}")
    if teacher == "inductor" and prompt != "bench":
        fail("--prompt stage2 asks for reasoning the compiler teacher does not write; use it with a model teacher")
    if backend not in STYLES:
        fail(f"--backend must be one of {', '.join(STYLES)}, not {backend!r}")
    if out.exists() and not out.is_dir():
        fail(f"{out} is a file; give a directory")
    try:
        found = select_tasks(tasks, levels, ids, names)[:limit]
    except (TaskLoadError, OSError) as e:
        fail(e)
    if teacher != "inductor":
        from musacoder.bench.clients import make_client

        try:
            client = make_client(teacher)
        except (ValueError, OSError) as e:  # an unknown spec, a missing replay file or checkpoint
            fail(f"--teacher: {e}")
        cfg = TeacherConfig(samples=samples, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                            turns=turns, prompt=prompt)
    try:
        vcfg = VerifyConfig.from_options({"backend": backend}, set_)
    except ValueError as e:
        fail(f"--set: {e}")
    with LoggedProgress(console=err, transient=True) as bar:
        job = bar.add_task("teacher", total=len(found))

        def update(stage, i, n):
            bar.update(job, description=stage, completed=i, total=n)

        summary = solve_tasks(found, out, vcfg, update, workers) if teacher == "inductor" else \
            teach_tasks(found, out, vcfg, client, teacher, cfg, update)
    err.print(f"{summary['tried']} tried"
              + (f", {summary['skipped_existing']} already done" if summary["skipped_existing"] else "")
              + f"; teacher: {summary['teacher']}; verdicts: {summary['verdicts']}")
    err.print(f"  -> {out / SOLUTIONS}, passing ones in {out / SFT}")
    if summary.get("unfinished") and summary["fatal"]:
        fail(f"{summary['fatal']}; {summary['unfinished']} samples unfinished, the rest are kept in {out}: rerun the "
             "same command once the server is up", 1)
    if summary.get("unfinished"):
        err.print(f"[yellow]{summary['unfinished']} samples unfinished[/yellow] (first: "
                  f"{escape(summary['first_error'] or '')}); "
                  "run the same command again to retry them")
        raise typer.Exit(1)


@synth_app.command("repair")
def repair(solutions: Path = typer.Option(..., help="solutions.jsonl of `synth solve`, or its directory"),
           out: Path = typer.Option(..., help="directory: repair.jsonl, reviewer.jsonl, mutants.jsonl (every "
                                              "mutant with its verdict or why it was dropped)"),
           tasks: TasksOpt = None,
           per_solution: int = typer.Option(3, min=1, help="mutants per solution, each by another operator"),
           seed: int = typer.Option(0, help="picks the operators and where they inject the bug"),
           backend: str = typer.Option("cpu", help="cpu, cuda, triton, musa or musa-on-cuda: the solutions of this "
                                                   "backend, verified on it"),
           operators: str | None = typer.Option(None, help="comma-separated mutation operators (default: all)"),
           set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE",
                                          help="a verifier setting, YAML value; repeatable (devices=[0,0]: two device "
                                               "workers on GPU 0)")):
    """Stage 3a: inject realistic bugs into verified solutions, verify each mutant with MooreEval, and write the
    failing ones as repair (with the verifier's real feedback) and reviewer records. --tasks: the tasks `synth
    solve` ran on (default: the shipped ones). Resumable."""

    from musacoder.config import VerifyConfig
    from musacoder.synth.mutate import OPERATORS
    from musacoder.synth.repair import (
        MUTANTS,
        REPAIR,
        REVIEWER,
        STILL_PASSES,
        SolutionsError,
        load_solutions,
        repair_records,
    )
    from musacoder.tasks import TaskLoadError
    from musacoder.tasks.select import select_tasks

    if backend not in ("cpu", "cuda", "triton", "musa", "musa-on-cuda"):
        fail(f"--backend must be cpu, cuda, triton, musa or musa-on-cuda, not {backend!r}")
    ops = [o.strip() for o in operators.split(",") if o.strip()] if operators else None
    unknown = [o for o in ops or [] if o not in OPERATORS]
    if unknown:
        fail(f"unknown operator(s) {', '.join(unknown)}; known: {', '.join(OPERATORS)}")
    if out.exists() and not out.is_dir():
        fail(f"{out} is a file; give a directory")
    try:
        loaded = load_solutions(solutions, select_tasks(tasks), backend)
    except (SolutionsError, TaskLoadError, OSError) as e:
        fail(e)
    try:  # correctness only: a mutant's verdict is its feedback
        vcfg = VerifyConfig.from_options({"backend": backend, "timing_enabled": False}, set_)
    except ValueError as e:
        fail(f"--set: {e}")
    _usable(loaded, str(solutions), f"status ok, backend {backend}, a known task")
    with LoggedProgress(console=err, transient=True) as bar:
        job = bar.add_task("verifying mutants", total=None)
        summary = repair_records(loaded.solutions, out, vcfg,
                                 per_solution, seed, lambda stage, i, n: bar.update(job, completed=i, total=n), ops)
    still = summary["dropped"].get(STILL_PASSES, 0)
    other = sum(summary["dropped"].values()) - still
    err.print(f"{summary['tried']} mutants tried on {summary['solutions']} solutions: {summary['kept']} failing "
              f"(kept), {still} still passing (dropped)" + (f", {other} not judged (dropped)" if other else "")
              + (f", {summary['skipped_existing']} already done" if summary["skipped_existing"] else "")
              + (f", {summary['duplicates']} duplicates" if summary["duplicates"] else ""))
    if summary["operators"]:
        err.print("  per operator (tried/kept/dropped): " + ", ".join(
            f"{op} {c.get('tried', 0)}/{c.get('kept', 0)}/{c.get('dropped', 0)}"
            for op, c in summary["operators"].items()))
    if summary["verdicts"]:
        err.print(f"  verdicts: {summary['verdicts']}")
    err.print(f"  -> {out / REPAIR}, {out / REVIEWER}; every mutant in {out / MUTANTS}")


@synth_app.command("decontam")
def decontam(input_: Path = typer.Option(..., "--input", help="JSONL of task records (code) or SFT records (messages)"),
             against: list[str] = typer.Option(..., help="eval tasks: a KernelBench tree, .jsonl/.parquet, .py, "
                                                       "FILE#N, or 'builtin' (the shipped tasks); repeatable"),
             out: Path = typer.Option(..., help="JSONL of kept records; decontam_report.json, decontam_summary.txt "
                                                "beside it"),
             threshold: float = typer.Option(0.8, min=0.01, max=1.0, help="MinHash: shingle Jaccard of a near copy"),
             detectors: str = typer.Option("ast,opgraph,minhash", help="comma-separated detectors to apply")):
    """Remove records whose task is an eval task: the same program (ast), the same computation at any rank, size or
    spelling (opgraph), or a near copy of the text (minhash). Each removal is reported with its reason and eval
    task."""
    import json

    from musacoder.data.decontam import DecontamSettings, run, summary
    from musacoder.tasks.loaders import _read_jsonl
    from musacoder.tasks.select import select_tasks

    _offline()
    if not input_.is_file():
        fail(f"--input {input_} is not a file")
    if out.resolve() == input_.resolve():
        fail("--out must differ from --input (the input is kept as it is)")
    try:
        settings = DecontamSettings(threshold=threshold,
                                    detectors=tuple(d.strip() for d in detectors.split(",") if d.strip()))
        records = _read_jsonl(input_)
        if bad := [i for i, r in enumerate(records) if not isinstance(r, dict)]:
            fail(f"{input_}: record {bad[0]} is not a JSON object")
        eval_tasks = [t for src in against for t in select_tasks(
            None if src == "builtin" and not Path(src).exists() else src)]
    except (ValueError, OSError) as e:  # TaskLoadError is a ValueError
        fail(e)
    err.print(f"indexing {len(eval_tasks)} eval tasks, checking {len(records)} records ...")
    res = run(records, eval_tasks, settings)
    report = {"input": str(input_), "against": against, **res.report(settings)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in res.kept))
    (out.parent / "decontam_report.json").write_text(json.dumps(report, indent=1) + "\n")
    text = summary(report)
    (out.parent / "decontam_summary.txt").write_text(text + "\n")
    err.print(text)
    err.print(f"  -> {out}; report {out.parent / 'decontam_report.json'}")


@synth_app.command("variants")
def variants(out: Path = typer.Option(..., help="JSONL of kept variants (KernelBench records); OUT.dropped.jsonl "
                                                "beside it"),
             tasks: TasksOpt = None, levels: LevelsOpt = None, ids: IdsOpt = None, names: NamesOpt = None,
             kinds: str = typer.Option("shape,dtype,fuse", help="comma-separated: shape, dtype, fuse"),
             per_task: int = typer.Option(1, min=1, help="variants of each kind per task, at most"),
             seed: int = typer.Option(0, help="draws are reproducible per seed"),
             check_scale: float = typer.Option(1.0, min=0.01, max=1.0,
                                               help="run the cleaning checks at these sizes (cheaper)"),
             limit: int | None = typer.Option(None, min=1, help="the first N tasks only")):
    """Shape, dtype (fp16/bf16) and fused variants of the selected tasks, each checked like `synth tasks` output and
    kept with its parent and what was drawn. Appends and resumes."""

    from musacoder.synth.variants import VariantError, dropped_path, synth_variants
    from musacoder.tasks import TaskLoadError
    from musacoder.tasks.select import select_tasks

    if out.exists() and out.is_dir():
        fail(f"{out} is a directory; give a .jsonl file")
    try:
        found = select_tasks(tasks, levels, ids, names)[:limit]
        with LoggedProgress(console=err, transient=True) as bar:
            job = bar.add_task("drawing and checking", total=None)
            summary = synth_variants(found, out, tuple(k.strip() for k in kinds.split(",") if k.strip()), per_task,
                                     seed, check_scale, lambda i, n: bar.update(job, completed=i, total=n))
    except (TaskLoadError, VariantError, OSError) as e:
        fail(e)
    err.print(f"{summary['kept']} kept ({', '.join(f'{k} {v}' for k, v in summary['kept_per_kind'].items()) or '-'}), "
              f"{summary['dropped']} dropped"
              + (f", {summary['skipped_existing']} already done" if summary["skipped_existing"] else "")
              + f"  ->  {out}, dropped ones in {dropped_path(out)}")
    for reason, count in summary["reasons"].items():
        err.print(f"  dropped {count}: {reason}")


def _usable(loaded, where: str, wanted: str, *, required: bool = True, unit: str = "") -> list:
    """Say what was skipped (counted in `unit`) and which lines were unusable; `fail` when no solution is left and
    one is `required`."""
    for reason, count in loaded.skipped.items():
        err.print(f"  skipped {count}{unit}: {reason}")
    for p in loaded.problems[:10]:
        err.print(f"  unusable: {p}")
    if len(loaded.problems) > 10:
        err.print(f"  ... and {len(loaded.problems) - 10} more unusable lines")
    if required and not loaded.solutions:
        fail(f"no usable solution in {where} ({wanted})")
    return loaded.solutions


def _passing(solutions: list[Path], out: Path, tasks, backend: str):
    """The passing solutions of `backend` in the given files and in --out's own solutions.jsonl, with what was
    skipped or unusable printed; `fail` on bad input."""
    from musacoder.synth.repair import SolutionsError
    from musacoder.synth.rewrite import load_passing, with_output
    from musacoder.tasks import TaskLoadError
    from musacoder.tasks.select import select_tasks

    if backend not in ("cpu", "cuda", "triton"):
        fail(f"--backend must be cpu, cuda or triton, not {backend!r}")
    if out.exists() and not out.is_dir():
        fail(f"{out} is a file; give a directory")
    try:
        loaded = load_passing(with_output(solutions, out), select_tasks(tasks), backend)
    except (SolutionsError, TaskLoadError, OSError) as e:
        fail(e)
    return _usable(loaded, ", ".join(map(str, solutions)), f"status ok with a verdict, backend {backend}, a known task")


@synth_app.command("rewrite")
def rewrite(solutions: list[Path] = typer.Option(..., help="solutions.jsonl of `synth solve` (any teacher), or its "
                                                           "directory; repeatable"),
            out: Path = typer.Option(..., help="directory: rewrite.jsonl, rewrite_pairs.jsonl (every pair judged), "
                                               "solutions.jsonl (the slow teacher's solutions, read again on reruns)"),
            tasks: TasksOpt = None,
            backend: str = typer.Option("cpu", help="cpu, cuda or triton: the solutions of this backend; the slow "
                                                    "teacher verifies on it (cpu and triton only)"),
            slow_teacher: bool = typer.Option(True, "--slow-teacher/--no-slow-teacher",
                                              help="a second, slower Inductor solution of each task the compiler "
                                                   "teacher solved, so that each can give a pair"),
            min_speedup: float = typer.Option(1.1, min=1.0, help="a pair's speedup is at least this"),
            sigmas: float = typer.Option(3.0, min=0.0, help="and over 1 + SIGMAS x the combined timing noise (the "
                                                            "verdicts' relative standard errors)")):
    """Stage 3b: slower -> faster pairs of verified solutions of the same task, with MooreEval's measured speedup,
    as rewrite records; pairs within the timing noise are dropped and counted. --tasks: the tasks `synth solve` ran
    on (default: the shipped ones). Resumable."""
    from rich.markup import escape

    from musacoder.config import VerifyConfig
    from musacoder.synth.rewrite import PAIRS, REWRITE, NoiseRule, rewrite_records

    found = _passing(solutions, out, tasks, backend)
    with LoggedProgress(console=err, transient=True) as bar:
        job = bar.add_task("slow teacher", total=None)
        summary = rewrite_records(found, out, VerifyConfig(backend=backend), NoiseRule(min_speedup, sigmas),
                                  slow_teacher, lambda stage, i, n: bar.update(job, description=stage, completed=i,
                                                                               total=n))
    dropped = summary["dropped"]
    err.print(f"{summary['kept']} pairs kept, {sum(dropped.values())} dropped"
              + (f", {summary['skipped_existing']} already judged" if summary["skipped_existing"] else "")
              + f" (from {summary['solutions']} passing solutions)")
    for reason, count in dropped.items():
        err.print(f"  dropped {count}: {escape(reason)}")
    for reason, count in summary["unpaired"].items():
        err.print(f"  unpaired: {count} {reason}")
    slow = summary["slow_teacher"]
    if slow is not None:
        err.print(f"  slow teacher: {slow['tried']} tried"
                  + (f", {slow['skipped_existing']} already done" if slow["skipped_existing"] else "")
                  + f"; teacher: {slow['teacher']}; verdicts: {slow['verdicts']}")
    elif slow_teacher:
        err.print(f"  slow teacher: not run (Inductor has no {backend} backend)")
    err.print(f"  -> {out / REWRITE}; every pair in {out / PAIRS}")


@synth_app.command("profile")
def profile(solutions: list[Path] = typer.Option(..., help="solutions.jsonl (any teacher), or its directory; "
                                                           "repeatable"),
            out: Path = typer.Option(..., help="directory: profiling.jsonl, profiles.jsonl (every program with its "
                                               "table or why it has none)"),
            tasks: TasksOpt = None,
            backend: str = typer.Option("cpu", help="cpu, cuda or triton: the solutions of this backend, run on it"),
            rewrites: Path | None = typer.Option(None, help="rewrite_pairs.jsonl of `synth rewrite`, or its "
                                                            "directory (default: --out's, when there)"),
            iterations: int = typer.Option(10, min=1, help="profiled forwards per program"),
            timeout: float = typer.Option(60.0, min=1.0, help="seconds the profiled forwards of one program may take"),
            limit: int | None = typer.Option(None, min=1, help="the first N programs only"),
            nsight: bool = typer.Option(True, help="also measure one forward's kernels with Nsight Compute (GPU "
                                                   "backends, where ncu is on PATH)")):
    """Stage 3c: run each verified program under torch.profiler (and Nsight Compute) in a sandboxed process, name
    its bottleneck, and write profiling records (with the faster rewrite where `synth rewrite` kept one).
    Resumable."""

    from musacoder.config import VerifyConfig
    from musacoder.synth.profiling import PROFILES, PROFILING, load_rewrites, profiling_records
    from musacoder.synth.rewrite import PAIRS

    found = _passing(solutions, out, tasks, backend)[:limit]
    if rewrites is not None and not (rewrites / PAIRS if rewrites.is_dir() else rewrites).is_file():
        fail(f"--rewrites {rewrites}: no {PAIRS} there (run `musacoder synth rewrite` first)")
    pairs = load_rewrites(rewrites or out)
    with LoggedProgress(console=err, transient=True) as bar:
        job = bar.add_task("profiling", total=len(found))
        summary = profiling_records(found, out, VerifyConfig(backend=backend), pairs, iterations, timeout,
                                    lambda stage, i, n: bar.update(job, completed=i, total=n), nsight)
    failed = {k: v for k, v in summary["statuses"].items() if k != "ok"}
    err.print(f"{summary['records']} profiling records ({summary['with_rewrite']} with a faster rewrite) of "
              f"{summary['tried']} programs"
              + (f", {sum(failed.values())} without a profile ({', '.join(f'{k} {v}' for k, v in failed.items())})"
                 if failed else "")
              + (f", {summary['skipped_existing']} already done" if summary["skipped_existing"] else ""))
    if summary["categories"]:
        err.print("  bottlenecks: " + ", ".join(f"{k} {v}" for k, v in summary["categories"].items()))
    measured = summary["nsight_statuses"]
    err.print(f"  Nsight Compute: {summary['nsight_compute']}"
              + (f"; {', '.join(f'{k} {v}' for k, v in measured.items())}" if measured else ""))
    err.print(f"  -> {out / PROFILING}; every program in {out / PROFILES}")


@synth_app.command("card")
def card(paths: list[Path] = typer.Argument(..., metavar="DIR...", help="directories of synth output (searched "
                                                                         "recursively), or single files"),
         out: Path = typer.Option(..., help="directory: card.md and its PNG plots"),
         eval_: list[str] = typer.Option([], "--eval", help="an eval set (any task source, 'builtin'): count the "
                                                            "training records and tasks that copy its tasks; "
                                                            "repeatable"),
         as_json: bool = typer.Option(False, "--json", help="also print the counts as JSON on stdout")):
    """A data card of synth output: counts per stage, record kind, operator family, source and backend, verifier
    pass rates, drop reasons, decontamination and provenance, all computed from the files; with --eval, the training
    records and tasks that are eval twins. Lines that cannot be read (one cut by an interrupted run) and files a stage
    writes that are missing are reported in the card."""
    import json

    from musacoder.synth.card import CardError, collect, counts, eval_twins, write_card

    if out.exists() and not out.is_dir():
        fail(f"{out} is a file; give a directory")
    try:
        scans = collect(paths)
    except (CardError, OSError) as e:
        fail(e)
    c = counts(scans)
    if eval_:
        _offline()
        c["eval_twins"] = _heldout_error(lambda: eval_twins(scans, eval_))
    written = write_card(out, c, [str(p) for p in paths])
    unread = sum(p["lines"] for f in c["files"] for p in f["not_read"].values())
    err.print(f"{len(c['files'])} files read, {unread} lines not read, {len(c['missing'])} expected files missing; "
              "stages: " + (", ".join(f"{k} {v['kept']}/{v['records']} kept" for k, v in c["stages"].items()) or "-"))
    for t in c.get("eval_twins", []):
        err.print(f"  eval twins of {t['eval']}: {t['twins']} of {t['records']} training records and tasks, copying "
                  f"{len(t['eval_tasks_copied'])} of its {t['eval_tasks']} tasks")
    err.print(f"  -> {out / written[0]}" + (f", plots {', '.join(written[1:])}" if written[1:] else ""))
    if as_json:
        print(json.dumps(c, indent=1))


@synth_app.command("qa")
def qa(out: Path = typer.Option(..., help="directory: qa.jsonl (the records), qa_answers.jsonl (every question "
                                          "asked, with the answer, kept or why it was dropped)"),
       model: str = typer.Option(..., "--model", help="the teacher: openai:MODEL@URL, hf:PATH or replay:PATH, as in "
                                                     "`bench run --model`"),
       tasks: TasksOpt = None, levels: LevelsOpt = None, ids: IdsOpt = None, names: NamesOpt = None,
       solutions: Path | None = typer.Option(None, help="solutions.jsonl of `synth solve` (or its directory): "
                                                        "questions about each passing solution of --backend too"),
       task_questions: bool = typer.Option(True, "--task-questions/--no-task-questions",
                                           help="questions about each selected task itself"),
       backend: str = typer.Option("cuda", help="the kernels the questions are about (cuda, triton, cpu, musa); "
                                                "with --solutions, the solutions of this backend"),
       per_task: int = typer.Option(3, min=1, help="questions per task (and per solution), templates in a seeded "
                                                   "order"),
       seed: int = typer.Option(0, help="picks the templates; the base of the sampling seeds"),
       limit: int | None = typer.Option(None, min=1, help="the first N tasks only"),
       temperature: float = typer.Option(0.7, min=0.0),
       top_p: float = typer.Option(1.0, min=0.0, max=1.0),
       max_tokens: int = typer.Option(8192, min=1, help="response token limit (an answer cut there is dropped)")):
    """Stage 3d: questions built from the selected tasks (operator families, measured shapes and dtypes, backend)
    and their verified solutions (the kernel code), answered by an LLM teacher, as qa records marked unverified
    (no executable check of prose exists). Empty, truncated and refusing answers are dropped and counted. Resumable;
    exit 1 when questions are left unanswered (a failed generation), 2 when nothing could be produced."""
    from rich.markup import escape

    from musacoder.synth.qa import ANSWERS, DEVICES, QA, Material, QAConfig, qa_records
    from musacoder.synth.repair import SolutionsError, load_solutions
    from musacoder.tasks import TaskLoadError
    from musacoder.tasks.select import select_tasks

    if backend not in DEVICES:
        fail(f"--backend must be one of {', '.join(DEVICES)}, not {backend!r}")
    if not task_questions and solutions is None:
        fail("--no-task-questions leaves nothing to ask about: give --solutions")
    if out.exists() and not out.is_dir():
        fail(f"{out} is a file; give a directory")
    try:
        found = select_tasks(tasks, levels, ids, names)[:limit]
        loaded = load_solutions(solutions, select_tasks(tasks), backend) if solutions is not None else None
    except (SolutionsError, TaskLoadError, OSError) as e:
        fail(e)
    materials = [Material(t) for t in found] if task_questions else []
    if loaded is not None:
        keys = {t.key for t in found}
        wanted = f"status ok, backend {backend}, a selected task"
        # not required here: the task filter below may still leave none, and the task questions need no solution
        usable = _usable(loaded, str(solutions), wanted, required=False, unit=" solutions")
        chosen = [Material(t, code) for t, code in usable if t.key in keys]
        if len(chosen) < len(usable):
            err.print(f"  skipped {len(usable) - len(chosen)} solutions: task not selected")
        if not chosen and not task_questions:
            fail(f"no usable solution in {solutions} ({wanted})")
        materials += chosen
    from musacoder.bench.clients import make_client

    try:
        client = make_client(model)
    except (ValueError, OSError) as e:  # an unknown spec, a missing replay file or checkpoint
        fail(f"--model: {e}")
    cfg = QAConfig(per_task=per_task, seed=seed, temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    with LoggedProgress(console=err, transient=True) as bar:
        job = bar.add_task("asking the teacher", total=None)
        summary = qa_records(materials, out, client, model, backend, cfg,
                             lambda i, n: bar.update(job, completed=i, total=n))
    dropped = summary["dropped"]
    failed = summary["generation_failed"] + summary["not_asked"]
    err.print(f"{summary['asked']} questions asked about {len(materials)} tasks and solutions: {summary['kept']} "
              f"kept, {sum(dropped.values())} dropped"
              + (f", {failed} without an answer" if failed else "")
              + (f", {summary['skipped_existing']} already done" if summary["skipped_existing"] else ""))
    for reason, count in dropped.items():
        err.print(f"  dropped {count}: {reason}")
    if summary["templates"]:
        err.print("  templates: " + ", ".join(f"{k} {v}" for k, v in summary["templates"].items()))
    err.print(f"  -> {out / QA} (kind qa, metadata verified: false); every question in {out / ANSWERS}")
    if failed and not summary["kept"]:
        fail(f"{summary['fatal'] or summary['first_error']}; no qa record produced: {failed} questions without an "
             "answer, asked again by the next run")
    if failed:
        err.print(f"[yellow]{failed} questions without an answer[/yellow] (first: "
                  f"{escape(summary['first_error'] or summary['fatal'] or '')}); run the same command again to ask "
                  "them")
        raise typer.Exit(1)


@synth_app.command("diagnose")
def diagnose(model: str = typer.Option(..., help="the base model: openai:MODEL@URL, hf:PATH or replay:PATH, as in "
                                                 "`bench run --model`"),
             out: Path = typer.Option(..., help="directory: the bench run (samples.sqlite, metrics.json, report.md) "
                                                "and families.json; an existing run there is resumed"),
             tasks: TasksOpt = None, levels: LevelsOpt = None, ids: IdsOpt = None, names: NamesOpt = None,
             limit: int | None = typer.Option(None, min=1, help="the first N tasks only"),
             samples: int = typer.Option(4, min=1, help="samples per task"),
             backend: Backend = typer.Option("auto", help="prompt style and verifier"),
             temperature: float = typer.Option(0.7, min=0.0),
             max_tokens: int = typer.Option(32768, min=1, help="response token limit"),
             no_timing: bool = typer.Option(False, "--no-timing", help="skip timing: no fast_1, the score is the mean "
                                                                        "of compile and correct"),
             min_samples: int = typer.Option(8, min=1, help="a family with fewer finished samples keeps weight 1"),
             min_weight: float = typer.Option(0.25, min=0.0, max=1.0, help="the easiest family's weight, at least"),
             max_weight: float = typer.Option(4.0, min=1.0, help="the weakest family's weight, at most"),
             concurrency: int = typer.Option(16, min=1, help="requests in flight (openai)")):
    """Measure a base model per operator family with the bench runner (compile rate, correctness, fast_1) and write
    families.json: weights that upsample the families it is weak at and downsample easy ones, for SFT's
    `family_weights`. Resumable (the bench run is); exit 1 when samples are left unfinished (rerun to retry)."""
    from rich.markup import escape

    from musacoder.bench.clients import make_client
    from musacoder.bench.runner import BenchConfig
    from musacoder.bench.store import RunMismatch
    from musacoder.config import VerifyConfig
    from musacoder.synth.diagnose import FAMILIES_JSON, NoSamples, WeightRule, table
    from musacoder.synth.diagnose import diagnose as run_diagnosis
    from musacoder.tasks import TaskLoadError
    from musacoder.tasks.select import select_tasks

    if out.exists() and not out.is_dir():
        fail(f"{out} is a file; give a directory")
    try:
        found = select_tasks(tasks, levels, ids, names)[:limit]
        rule = WeightRule(w_min=min_weight, w_max=max_weight, min_samples=min_samples)
    except (TaskLoadError, ValueError, OSError) as e:
        fail(e)
    try:
        client = make_client(model, concurrency=concurrency)
    except (ValueError, OSError) as e:  # an unknown spec, a missing replay file or checkpoint
        fail(f"--model: {e}")
    err.print(f"{len(found)} tasks x {samples} samples, model [bold]{escape(model)}[/bold] -> {out}")
    try:
        res = run_diagnosis(found, client, out, model, BenchConfig(samples=samples, temperature=temperature,
                                                                   max_tokens=max_tokens, backend=backend),
                            VerifyConfig(timing_enabled=not no_timing), rule, console=err)
    except (NoSamples, RunMismatch) as e:
        fail(e)
    err.print(table(res))
    for key, why in res["unmeasured_tasks"].items():
        err.print(f"  families not measured (its samples count nowhere): {key}: {escape(why)}")
    if few := [f for f, s in res["per_family"].items() if s["few_samples"]]:
        err.print(f"  weight 1 for {len(few)} families with fewer than {min_samples} samples: {', '.join(few)}")
    err.print(f"  -> {out / FAMILIES_JSON}; the run's report {out / 'report.md'}")
    if res["unfinished"]:
        err.print(f"[yellow]{res['unfinished']} samples unfinished[/yellow]"
                  + (f" ({escape(client.fatal)})" if client.fatal else "")
                  + ": the weights are from the finished ones; run the same command again to retry the rest")
        raise typer.Exit(1)


def _heldout_error(fn):
    """Run fn; a HeldoutError or TaskLoadError (bad input) becomes one `error:` line."""
    from musacoder.synth.heldout import HeldoutError
    from musacoder.tasks import TaskLoadError

    try:
        return fn()
    except (HeldoutError, TaskLoadError, OSError) as e:
        fail(e)


def _offline():
    """Tracing runs task code: KernelBench level 4 would download Hugging Face models (and retry offline)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@synth_app.command("dedupe")
def dedupe(input_: Path = typer.Option(..., "--input", help="JSONL of task records (code) or SFT records (messages)"),
           out: Path = typer.Option(..., help="JSONL of kept records; OUT.dedupe.json (what was dropped) beside it"),
           per_key: int = typer.Option(1, "--per-key", min=1, help="records kept per computation, at most: 1 is one "
                                                                  "task per op sequence, 4 at most four"),
           key: str = typer.Option("graph", help="graph: the canonical op graph (the same computation at any rank, "
                                                 "size or spelling); ops: the generator's op sequence "
                                                 "(metadata.ops of `synth tasks` records)")):
    """Keep at most --per-key records per computation, the first ones in file order (a rerun keeps the same ones).
    Records without a key (no task in them, untraceable) are kept and listed."""
    import json

    from musacoder.data.keys import Keys
    from musacoder.synth.heldout import KEYS, cap, read_records, write_jsonl

    _offline()
    if key not in KEYS:
        fail(f"--key must be one of {', '.join(KEYS)}, not {key!r}")
    if out.resolve() == input_.resolve():
        fail("--out must differ from --input (the input is kept as it is)")
    records = _heldout_error(lambda: read_records(input_))
    res = _heldout_error(lambda: cap(records, per_key, key, Keys()))
    write_jsonl(out, res.kept)
    report = {"input": str(input_), "key": key, "per_key": per_key, "records": len(records), "kept": len(res.kept),
              "distinct_keys": res.keys, "dropped": res.dropped, "unkeyed": res.unkeyed}
    out.with_suffix(".dedupe.json").write_text(json.dumps(report, indent=1) + "\n")
    err.print(f"{len(records)} records, {res.keys} distinct {key} keys: kept {len(res.kept)}, dropped "
              f"{len(res.dropped)} over {per_key} per key"
              + (f"; {len(res.unkeyed)} without a key (kept; first: {res.unkeyed[0]['name']}: "
                 f"{res.unkeyed[0]['problem']})" if res.unkeyed else ""))
    err.print(f"  -> {out}; report {out.with_suffix('.dedupe.json')}")


@synth_app.command("split")
def split_cmd(input_: Path = typer.Option(..., "--input", help="JSONL of task records (or SFT records)"),
              out: Path = typer.Option(..., help="directory: train.jsonl, eval.jsonl, split.json"),
              by: str = typer.Option("family", help="the unit held out whole: family (an operator family: every "
                                                    "task with it goes to eval), ops (a generator op sequence) or "
                                                    "graph (a computation)"),
              fraction: float = typer.Option(0.1, min=0.001, max=0.999, help="about this share of the records held "
                                                                            "out (families: at most this share)"),
              seed: int = typer.Option(0, help="draws the held-out units; the same seed gives the same split"),
              hold_out: str | None = typer.Option(None, help="comma-separated units to hold out instead of drawing "
                                                             "them (family names, op sequences as 'relu -> abs')")):
    """Split tasks into train and eval by whole operator families, op sequences or computations (not by seeds), then
    drop from train every record still the same computation or program as an eval task. Reproducible from --seed."""
    import json

    from musacoder.data.keys import Keys
    from musacoder.synth.heldout import SPLIT_BY, read_records, split, write_jsonl

    _offline()
    if by not in SPLIT_BY:
        fail(f"--by must be one of {', '.join(SPLIT_BY)}, not {by!r}")
    if out.exists() and not out.is_dir():
        fail(f"{out} is a file; give a directory")
    records = _heldout_error(lambda: read_records(input_))
    held = [h.strip() for h in hold_out.split(",") if h.strip()] if hold_out else None
    res = _heldout_error(lambda: split(records, by, fraction, seed, Keys(), held))
    write_jsonl(out / "train.jsonl", res.train)
    write_jsonl(out / "eval.jsonl", res.eval)
    manifest = {"input": str(input_), **res.manifest()}
    (out / "split.json").write_text(json.dumps(manifest, indent=1) + "\n")
    err.print(f"{manifest['records']} records by {by}: train {len(res.train)}, eval {len(res.eval)} "
              f"({len(res.eval) / max(manifest['records'], 1):.1%}); held out {len(res.held)}: "
              + ", ".join(res.held[:8]) + (" ..." if len(res.held) > 8 else ""))
    if res.twins_dropped:
        err.print(f"  dropped from train as eval twins: {len(res.twins_dropped)} (the same computation or program "
                  "under another unit)")
    if res.unkeyed:
        err.print(f"  in neither set (nothing to split them by): {len(res.unkeyed)}; first: "
                  f"{res.unkeyed[0]['name']}: {res.unkeyed[0]['problem']}")
    err.print(f"  -> {out / 'train.jsonl'}, {out / 'eval.jsonl'}, {out / 'split.json'}")


@synth_app.command("twins")
def twins(train: list[Path] = typer.Option(..., help="training data: JSONL of task or SFT records, or a directory "
                                                     "of them; repeatable"),
          eval_: list[str] = typer.Option(..., "--eval", help="an eval set: any task source (KernelBench .jsonl, "
                                                              "generated tasks, a directory, 'builtin'); repeatable"),
          out: Path = typer.Option(..., help="directory: twins.json, twins.md, and per eval set its tasks with and "
                                             "without a twin (NAME.twin.jsonl, NAME.no_twin.jsonl) to bench apart")):
    """How held out each eval set is: per eval task, its twins among the training records (the same computation,
    program or generator op sequence, at the same rank or another) and its nearest training task by text."""
    import json

    from musacoder.data.keys import Keys
    from musacoder.synth.heldout import read_records, write_jsonl
    from musacoder.synth.twins import EvalSet, analyse, counts_line, eval_records, markdown, split_by_twin

    _offline()
    if out.exists() and not out.is_dir():
        fail(f"{out} is a file; give a directory")
    records = [r for p in train for r in _heldout_error(lambda p=p: read_records(p))]
    evals = [EvalSet(src, _heldout_error(lambda src=src: eval_records(src))) for src in eval_]
    err.print(f"tracing {len(records)} training records and {sum(len(e.records) for e in evals)} eval tasks ...")
    report = analyse(records, evals, Keys())
    report["train"] = [str(p) for p in train]
    out.mkdir(parents=True, exist_ok=True)
    (out / "twins.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "twins.md").write_text(markdown(report))
    for es, s in zip(evals, report["sets"]):
        stem = Path(es.name).stem if es.name != "builtin" else "builtin"
        twin, alone = split_by_twin(es, s["rows"])
        write_jsonl(out / f"{stem}.twin.jsonl", twin)
        write_jsonl(out / f"{stem}.no_twin.jsonl", alone)
    for line in counts_line(report):
        err.print(line)
    err.print(f"  -> {out / 'twins.md'}, {out / 'twins.json'}; eval tasks with and without a twin in "
              f"{out}/*.twin.jsonl, *.no_twin.jsonl")


@synth_app.command("hidden")
def hidden(out: Path = typer.Option(..., help="directory (keep it out of the repository): tasks.jsonl, "
                                              "manifest.json, generated.jsonl"),
           rotation: str = typer.Option(..., help="the rotation's label, e.g. 2026-12: each label is another set"),
           n: int = typer.Option(100, min=1, help="tasks in the set"),
           against: list[str] = typer.Option([], help="eval twins to exclude with every detector: KernelBench "
                                                      "(.jsonl or tree), 'builtin'; repeatable"),
           against_generated: list[str] = typer.Option([], help="training data of the same generator (task or SFT "
                                                                "records): excluded by ast and opgraph only; "
                                                                "repeatable"),
           secret_env: str = typer.Option("MUSACODER_HIDDEN_SECRET", help="environment variable holding the secret"),
           secret_file: Path | None = typer.Option(None, help="or a file holding it"),
           min_ops: int = typer.Option(1, min=1), max_ops: int = typer.Option(3, min=1),
           families: str | None = typer.Option(None, help="comma-separated operator families (default: all)"),
           fusion_depth: int = typer.Option(1, min=0),
           size: float = typer.Option(1.0, min=0.01),
           check_scale: float = typer.Option(1.0, min=0.01, max=1.0),
           oversample: float = typer.Option(2.0, min=1.0, help="generate this many times --n, for the drops")):
    """A rotating hidden evaluation set: operator-graph tasks generated from seeds keyed by a secret (never stored in
    the repository) and the rotation label, cleaned, decontaminated against KernelBench and the training data, one
    task per computation; judge it with `bench run --profile strict` (metrics.json has Pass@k with its interval)."""
    from musacoder.data.keys import Keys
    from musacoder.synth.graphs import FAMILIES, GraphSpec
    from musacoder.synth.heldout import hidden_set, read_records, read_secret, tracked_by_git
    from musacoder.synth.twins import eval_records
    from musacoder.tasks.model import Task

    _offline()
    secret = _heldout_error(lambda: read_secret(secret_env, secret_file))
    if out.exists() and not out.is_dir():
        fail(f"{out} is a file; give a directory")
    try:
        fams = tuple(f.strip() for f in families.split(",") if f.strip()) if families else FAMILIES
        spec = GraphSpec(min_ops=min_ops, max_ops=max_ops, families=fams, fusion_depth=fusion_depth, size=size)
    except ValueError as e:
        fail(e)
    if tracked_by_git(out):
        err.print(f"[yellow]warning:[/yellow] {out} is inside a git work tree and not ignored: do not commit the "
                  "hidden set")

    def tasks_of(records: list[dict], origin: str) -> list[Task]:
        from musacoder.data.decontam import record_name, task_code

        return [Task(name=record_name(r, i), code=c, source=f"{origin}#{i}") for i, r in enumerate(records)
                if (c := task_code(r)) is not None]

    kb = [t for src in against for t in tasks_of(_heldout_error(lambda src=src: eval_records(src)), src)]
    gen = [t for src in against_generated for t in tasks_of(_heldout_error(lambda src=src: read_records(src)), src)]
    with LoggedProgress(console=err, transient=True) as bar:
        job = bar.add_task("generating and checking", total=None)
        res = hidden_set(out, secret, rotation, n, spec, kb, gen, Keys(), check_scale, oversample,
                         lambda i, total: bar.update(job, completed=i, total=total))
    m = res.manifest
    err.print(f"rotation {rotation} (secret {m['secret_fingerprint']}): {m['tasks']} of {n} tasks; generated "
              f"{m['generated']}, {m['kept_by_cleaning']} kept by cleaning, dropped as eval twins "
              f"{m['dropped_as_eval_twins'] or 0}, as the same computation {m['dropped_same_computation']}")
    if m["tasks"] < n:
        err.print(f"[yellow]warning:[/yellow] only {m['tasks']} of {n} tasks: raise --oversample")
    err.print(f"  -> {out / 'tasks.jsonl'}, {out / 'manifest.json'}; judge with: {m['judge_with']}")
