"""Side-by-side benchmark: KernelBench's own harness and musacoder's verifier on the same honest CUDA kernels, same GPU,
one invocation.

    python3 scripts/bench_vs_kernelbench.py --kb-repo .kb/KernelBench --kb-jsonl .kb/kernelbench.jsonl --out runs/kbbench
    python3 scripts/bench_vs_kernelbench.py --backend cpu --skip-kernelbench --out /tmp/kbb     # CPU smoke test

KernelBench (ScalingIntelligence/KernelBench, not part of this project) is read from `--kb-repo`: a checkout, or any
folder holding `src/kernelbench/`. Its package imports generation clients at import time (`kernelbench/__init__` ->
`utils` -> dotenv, openai, litellm; `eval` -> requests, pydantic). Where those are not installed (the GPU image has none
of dotenv/openai/litellm/pydantic) this script writes tiny stand-ins to `--shims` (default `.kb/bench_shims`) and puts
that folder LAST on sys.path, so a real installed package always wins. openai/litellm/dotenv are never called by the
evaluation path; the pydantic stand-in is a plain attribute container for `KernelExecResult` (defaults deep-copied).

KernelBench side: in SUBPROCESSES, one fresh `python` per evaluation, because that is what its batch evaluator does
(scripts/eval_from_generations.py runs each sample in a new `multiprocessing.Pool(spawn)` process, after pre-building
every sample's extension on CPU workers with `build_compile_cache`, kernelbench/compile.py batch_compile). A subprocess
also keeps its global side effects (TORCH_EXTENSIONS_DIR / TORCH_USE_CUDA_DSA / CUDA_VISIBLE_DEVICES written into
os.environ, the CUDA context and the caching allocator holding tens of GB for the 6 GB inputs of level-1 problems) out
of this process, whose environment musacoder's worker processes inherit. Per task:
  prebuild  `build_compile_cache(kernel, build_dir=...)` in its own process, all tasks in parallel (batch_compile)
  eval      run_and_check's static check (`validate_kernel_static`, backend cuda, fp32), then
            `eval_kernel_against_ref(measure_performance=True, timing_method="cuda_event", num_correct_trials=5,
            num_perf_trials=100, build_dir=<the prebuilt dir>, precision=fp32)` with its defaults otherwise, i.e.
            check_for_excessive_speedup=True: the reference is timed in the same process, same method, same inputs.
            KB speedup := ref_runtime / runtime (both means of 100 cuda-event trials, L2 thrashed before each).
            KB "s/eval cached" is the process's wall time (start, imports, CUDA init, cache load, checks, timing, exit).
            The in-process time of eval_kernel_against_ref alone is reported too (a lower bound for KB).
  eager     (only with --kb-eager-ref) run_and_check-style separate eager baseline,
            `timing.measure_ref_program_time(use_torch_compile=False)`, in the same process after the eval; its time
            is subtracted from the per-eval wall (eval_from_generations reads baselines from a file instead).
            Reported as a second KB speedup (`speedup_rc`).
KB's stage times (get_inputs on the CPU, host-to-device copies, correctness, each timing loop, extension load) are
taken by wrapping its module functions with perf_counter shims (no behaviour change).

musacoder side: in-process API (`get_pool`, `verify_many`, `verify`), profile `kernelbench` (task inputs and shape
only, like KB), with a cache dir under --out that is wiped at start:
  startup   get_pool + wait for the device worker (not counted per evaluation)
  cold      all tasks through verify_many on the empty cache (builds in parallel on the compile tier, baselines timed)
  warm      each task through verify() again: builds and baselines cached (steady state)
  repeat    --repeats x verify() of one candidate (--repeat-task): spread = (max - min) / median of speedup_eager.
            The baseline is cached, so by default this is the spread of the candidate's timing as users see it;
            --repeat-fresh-baseline clears the baseline table before each repeat (eager/compile re-timed too).
  built     (optional, last, skipped past --budget-s) baseline table cleared, builds cached: cost of a new task.
Our speedup := eager median / candidate median (adaptive reps, <= 2 s per timed callable, RSE target 1%).

Trial counts and time: KernelBench runs at its own defaults (5 correctness trials, 100 perf trials + 3 warm-ups, for
the candidate and again for the reference); ours at VerifyConfig defaults (5 seeds; timing adaptive, 10..200 reps, <= 2
s per timed callable). KernelBench's get_inputs builds the inputs on the CPU (torch.rand is single-threaded there:
~5 s for the 1.6e9-element ReLU/Softmax inputs, ~7 s for MSELoss's two 1.07e9 ones) and an eval calls it 7 times, so
one such eval costs ~40-60 s; matmul and GEMM take seconds. Budget for 6 tasks: KB ~60 s parallel prebuild +
~3-4 min of evals; ours ~10 s startup + ~2 min cold batch + ~1 min warm + repeats. Guards: --kb-budget-s (330: no new
KB eval after it), --budget-s (420: the optional last pass is skipped), --deadline-s (570: nothing new starts; the
summary is always written), so it fits a 600 s command. GPU memory: the level-1 problems at KernelBench's current
sizes need ~40 GB in one process (6.4 GB inputs, outputs, allclose temporaries); musacoder keeps a device worker and a
baseline worker alive, each with its allocator cache, so an 80 GB H100 is tight: prefer nvidia-h200.

Writes --out/results.json (every measurement, rewritten after each phase) and --out/summary.md (printed last).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# KernelBench problem -> honest candidate shipped with musacoder (the kernels handle general sizes).
CUDA_PAIRS = {
    "level1/19_ReLU": "musacoder/examples/cuda/honest_relu.py",
    "level1/1_Square_matrix_multiplication_": "musacoder/examples/cuda/honest_matmul.py",
    "level1/23_Softmax": "musacoder/examples/cuda/honest_softmax.py",
    "level1/100_HingeLoss": "musacoder/examples/cuda/honest_hinge_loss.py",
    "level1/94_MSELoss": "musacoder/examples/cuda/honest_mse_loss.py",
    "level2/76_Gemm_Add_ReLU": "musacoder/examples/cuda/honest_gemm_add_relu.py",
}
CPU_PAIRS = {k: v.replace("/cuda/", "/cpu/") for k, v in CUDA_PAIRS.items()}

TARGETS = {"wall_ratio": 5.0, "speedup_diff_pct": 5.0, "repeat_spread_pct": 3.0}

# Stand-ins for modules KernelBench imports but never uses on the evaluation path. Appended to sys.path (last).
SHIMS = {
    "dotenv.py": "def load_dotenv(*a, **k):  # bench shim: KernelBench calls this at import\n    return False\n",
    "openai.py": ("class OpenAI:  # bench shim: generation client, never used by evaluation\n"
                  "    def __init__(self, *a, **k):\n        raise RuntimeError('openai shim: not installed')\n"),
    "litellm.py": ("def completion(*a, **k):  # bench shim: generation client, never used by evaluation\n"
                   "    raise RuntimeError('litellm shim: not installed')\n"),
    "requests.py": ("# bench shim: kernelbench.eval imports requests but never uses it on the evaluation path\n"
                    "def _no(*a, **k):\n    raise RuntimeError('requests shim: not installed')\n"
                    "get = post = request = _no\n"),
    "pydantic.py": '''"""bench shim of pydantic.BaseModel: enough for KernelBench's KernelExecResult (fields with defaults)."""
import copy


class BaseModel:
    def __init__(self, **data):
        for cls in reversed(type(self).__mro__):
            for name in getattr(cls, "__annotations__", {}):
                if name not in data and name in cls.__dict__:
                    setattr(self, name, copy.deepcopy(cls.__dict__[name]))
        for k, v in data.items():
            setattr(self, k, v)

    def model_dump(self, *a, **k):
        return dict(self.__dict__)

    dict = model_dump

    def __repr__(self):
        return type(self).__name__ + "(" + ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items()) + ")"

    __str__ = __repr__
''',
}

T0 = time.perf_counter()

# Default task for the repeats: compute-bound, ms-scale, cheap inputs (then the first that passed).
REPEAT_PREFERENCE = ("level1/1_Square_matrix_multiplication_", "level2/76_Gemm_Add_ReLU")


def _elapsed() -> float:
    return time.perf_counter() - T0


def log(msg: str):
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def slug(key: str) -> str:
    return key.replace("/", "__")


def write_shims(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in SHIMS.items():
        p = folder / name
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
    return folder


def kb_src_dir(kb_repo: Path) -> Path:
    for cand in (kb_repo / "src", kb_repo):
        if (cand / "kernelbench" / "eval.py").exists():
            return cand.resolve()
    raise FileNotFoundError(f"no src/kernelbench/eval.py under {kb_repo}")


# =====================================================================================================================
# KernelBench child process (`--kb-child JOB.json`): runs KernelBench's own functions, writes JSON, exits.
# =====================================================================================================================

def _jsonable(obj):
    try:
        json.dumps(obj)
        return obj
    except (TypeError, ValueError):
        if isinstance(obj, dict):
            return {str(k): _jsonable(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [_jsonable(v) for v in obj]
        return repr(obj) if isinstance(obj, BaseException) else str(obj)


def kb_child(job_path: str) -> int:
    t_start = time.time()
    job = json.loads(Path(job_path).read_text())
    out: dict = {"mode": job["mode"], "t_child_start": t_start, "stages": {}, "calls": {}}

    def save():
        Path(job["result_path"]).write_text(json.dumps(_jsonable(out), indent=1))

    try:
        sys.path.insert(0, job["kb_src"])
        sys.path.append(job["shims"])  # last: real packages win
        t = time.perf_counter()
        import torch

        out["stages"]["import_torch"] = time.perf_counter() - t
        t = time.perf_counter()
        from kernelbench import eval as kb_eval  # noqa: E402  (kernelbench/__init__ imports utils too)
        from kernelbench import timing as kb_timing
        from kernelbench import utils as kb_utils
        from kernelbench.kernel_static_checker import validate_kernel_static

        out["stages"]["import_kernelbench_and_cuda_init"] = time.perf_counter() - t
        out["shimmed"] = sorted(m for m in ("dotenv", "openai", "litellm", "requests", "pydantic")
                                if getattr(sys.modules.get(m), "__file__", "") and
                                str(sys.modules[m].__file__).startswith(job["shims"]))
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            arch = {7: "Volta" if minor == 0 else "Turing", 8: "Ada" if minor == 9 else "Ampere", 9: "Hopper"}.get(
                major, "Blackwell" if major >= 10 else None)
            if arch:
                kb_utils.set_gpu_arch([arch])  # what its scripts do (config.gpu_arch)
            out["gpu_arch"] = arch
            out["device"] = torch.cuda.get_device_name(0)
        out["torch"] = torch.__version__

        if job["mode"] == "build":
            t = time.perf_counter()
            ok, stdout, err = kb_eval.build_compile_cache(job["kernel_src"], verbose=False, build_dir=job["build_dir"])
            out["stages"]["build_compile_cache"] = time.perf_counter() - t
            out.update(compiled=bool(ok), error=err, log_tail=(stdout or "")[-3000:])
            out["t_done"] = time.time()
            save()
            return 0

        # ---- eval: instrument KB's own functions (timing wrappers only) ----
        calls: dict[str, list[float]] = {}

        def wrap(mod, name, label, post=None):
            orig = getattr(mod, name)

            def w(*a, **k):
                t0 = time.perf_counter()
                try:
                    r = orig(*a, **k)
                finally:
                    calls.setdefault(label, []).append(time.perf_counter() - t0)
                return post(r) if post else r

            setattr(mod, name, w)

        def wrap_inputs(r):  # load_original_model_and_inputs -> (Model, get_init_inputs, get_inputs)
            if not r:
                return r
            model, gi_init, gi = r

            def timed_get_inputs(*a, **k):
                t0 = time.perf_counter()
                try:
                    return gi(*a, **k)
                finally:
                    calls.setdefault("get_inputs (CPU)", []).append(time.perf_counter() - t0)

            return model, gi_init, timed_get_inputs

        wrap(kb_eval, "load_original_model_and_inputs", "load reference", wrap_inputs)
        wrap(kb_eval, "load_custom_model", "load custom model (exec + load_inline from build dir)")
        wrap(kb_eval, "_process_input_tensor", "inputs .to(device)")
        wrap(kb_eval, "run_and_check_correctness", "correctness (all trials)")
        wrap(kb_eval, "graceful_eval_cleanup", "cleanup")
        wrap(kb_timing, "time_execution_with_cuda_event", "timing loop (cuda_event)")
        wrap(kb_timing, "clear_l2_cache", "clear_l2_cache")

        t = time.perf_counter()
        ok, errors, warnings = validate_kernel_static(job["kernel_src"], backend="cuda", precision="fp32")
        out["stages"]["static_check"] = time.perf_counter() - t
        out["static"] = {"valid": ok, "errors": errors, "warnings": warnings}

        device = torch.device("cuda:0")
        t = time.perf_counter()
        out["t_eval_start"] = time.time()
        try:
            res = kb_eval.eval_kernel_against_ref(
                original_model_src=job["ref_src"], custom_model_src=job["kernel_src"],
                measure_performance=True, timing_method="cuda_event", verbose=False,
                num_correct_trials=job["num_correct_trials"], num_perf_trials=job["num_perf_trials"],
                build_dir=job["build_dir"], device=device, backend="cuda", precision=torch.float32)
        except Exception as e:  # run_and_check's "last level catch"
            res = None
            out["eval_exception"] = f"{type(e).__name__}: {e}"[:2000]
        out["stages"]["eval_kernel_against_ref"] = time.perf_counter() - t
        out["t_eval_end"] = time.time()
        out["calls"] = {k: {"n": len(v), "s": sum(v), "each": [round(x, 4) for x in v[:12]]} for k, v in calls.items()}
        if res is not None:
            d = res.model_dump() if hasattr(res, "model_dump") else dict(res.__dict__)
            out["result"] = _jsonable(d)
        else:
            out["result"] = None
        save()

        if job.get("eager_ref") and res is not None and getattr(res, "correctness", False):
            t = time.perf_counter()
            stats = kb_timing.measure_ref_program_time(
                ref_arch_name=job["task"], ref_arch_src=job["ref_src"], num_trials=job["num_perf_trials"],
                use_torch_compile=False, timing_method="cuda_event", device=device, verbose=False, precision="fp32")
            out["stages"]["eager_ref_run_and_check_style"] = time.perf_counter() - t
            out["eager_ref"] = stats
        out["t_done"] = time.time()
        save()
        return 0
    except BaseException as e:
        out["child_exception"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]
        out["t_done"] = time.time()
        save()
        return 1


# =====================================================================================================================
# KernelBench side, parent
# =====================================================================================================================

def _run_children(jobs: list[dict], parallel: int, timeout: float, log_dir: Path) -> list[dict]:
    """Run `--kb-child` processes, at most `parallel` at once. Returns per job: wall, rc, the child's JSON."""
    pending = list(enumerate(jobs))
    running: dict[int, tuple] = {}
    results: list[dict] = [{} for _ in jobs]
    while pending or running:
        while pending and len(running) < parallel:
            i, job = pending.pop(0)
            jp = log_dir / f"{job['name']}.job.json"
            job["result_path"] = str(log_dir / f"{job['name']}.result.json")
            jp.write_text(json.dumps(job))
            logf = open(log_dir / f"{job['name']}.log", "wb")
            t_popen = time.time()
            p = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--kb-child", str(jp)],
                                 stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=str(ROOT), start_new_session=True)
            running[i] = (p, t_popen, logf, job)
        time.sleep(0.05)
        for i in list(running):
            p, t_popen, logf, job = running[i]
            rc = p.poll()
            timed_out = rc is None and time.time() - t_popen > timeout
            if rc is None and not timed_out:
                continue
            if timed_out:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # the child and its compilers (own session)
                except ProcessLookupError:
                    pass
                p.wait()
            t_exit = time.time()
            logf.close()
            del running[i]
            r = {"wall_s": t_exit - t_popen, "rc": p.returncode, "timed_out": timed_out, "t_popen": t_popen}
            try:
                r["child"] = json.loads(Path(job["result_path"]).read_text())
            except (OSError, ValueError) as e:
                r["child"] = None
                r["error"] = f"no result from child: {e}"
            try:
                r["log_tail"] = (log_dir / f"{job['name']}.log").read_bytes()[-1500:].decode(errors="replace")
            except OSError:
                pass
            results[i] = r
    return results


def kb_verdict(r: dict) -> str:
    if r.get("timed_out"):
        return "timeout"
    c = r.get("child")
    if not c or c.get("child_exception") or c.get("eval_exception"):
        return "harness_error"
    if c.get("static") and not c["static"].get("valid", True):
        return "static_fail"
    res = c.get("result")
    if res is None:
        return "retry (lock error)"
    if not res.get("compiled"):
        return "compile_error"
    if not res.get("correctness"):
        md = res.get("metadata") or {}
        return "runtime_error" if any(k.startswith("runtime_error") for k in md) else "incorrect"
    return "ok"


def run_kernelbench(pairs: list[dict], args, out: dict, save):
    kb_src = str(kb_src_dir(Path(args.kb_repo)))
    shims = str(write_shims(Path(args.shims).resolve()))
    log_dir = Path(args.out) / "kb_logs"
    build_root = Path(args.out) / "kb_build"
    shutil.rmtree(build_root, ignore_errors=True)
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    kb = out["kernelbench"] = {"kb_src": kb_src, "shims": shims, "num_correct_trials": args.kb_correct_trials,
                               "num_perf_trials": args.kb_perf_trials, "timing_method": "cuda_event", "tasks": {}}
    live = [p for p in pairs if p.get("task_code") and p.get("cand_code")]
    for p in live:
        kb["tasks"][p["key"]] = {"candidate": p["cand_path"]}

    # -- prebuild pass, parallel like compile.batch_compile --
    jobs = [{"name": f"build_{slug(p['key'])}", "mode": "build", "kb_src": kb_src, "shims": shims, "task": p["key"],
             "kernel_src": p["cand_code"], "build_dir": str((build_root / slug(p["key"])).resolve())} for p in live]
    par = max(1, min(len(jobs), (os.cpu_count() or 2) - 1, args.kb_build_workers))
    log(f"[kb] prebuild: {len(jobs)} candidates with build_compile_cache, {par} in parallel")
    t = time.perf_counter()
    try:
        builds = _run_children(jobs, par, args.kb_timeout, log_dir)
    except Exception as e:
        builds = [{"error": f"{type(e).__name__}: {e}"} for _ in jobs]
    kb["prebuild_batch_wall_s"] = time.perf_counter() - t
    for p, b in zip(live, builds):
        c = b.get("child") or {}
        kb["tasks"][p["key"]]["prebuild"] = {"wall_s": b.get("wall_s"), "compiled": c.get("compiled"),
                                             "stages": c.get("stages"), "error": b.get("error") or c.get("error")
                                             or c.get("child_exception"), "shimmed": c.get("shimmed"),
                                             "log_tail": None if c.get("compiled") else b.get("log_tail")}
        log(f"[kb] prebuild {p['key']}: {'ok' if c.get('compiled') else 'FAILED'} in {b.get('wall_s') or 0:.1f}s")
    log(f"[kb] prebuild batch wall {kb['prebuild_batch_wall_s']:.1f}s")
    save()

    # -- evaluations, one process each, sequential (one GPU) --
    for p in live:
        rec = kb["tasks"][p["key"]]
        if _elapsed() > min(args.kb_budget_s, args.deadline_s):
            rec["verdict"], rec["error"] = "skipped", f"over --kb-budget-s {args.kb_budget_s:.0f}s"
            log(f"[kb] skip {p['key']}: {rec['error']}")
            continue
        job = {"name": f"eval_{slug(p['key'])}", "mode": "eval", "kb_src": kb_src, "shims": shims, "task": p["key"],
               "ref_src": p["task_code"], "kernel_src": p["cand_code"],
               "build_dir": str((build_root / slug(p["key"])).resolve()),
               "num_correct_trials": args.kb_correct_trials, "num_perf_trials": args.kb_perf_trials,
               "eager_ref": args.kb_eager_ref}
        log(f"[kb] eval {p['key']} ...")
        try:
            r = _run_children([job], 1, max(30.0, min(args.kb_timeout, args.deadline_s + 25 - _elapsed())), log_dir)[0]
        except Exception as e:
            r = {"error": f"{type(e).__name__}: {e}", "child": None}
        c = r.get("child") or {}
        res = c.get("result") or {}
        stages = c.get("stages") or {}
        eager_s = stages.get("eager_ref_run_and_check_style", 0.0)
        rec["verdict"] = kb_verdict(r)
        rec["eval_process_wall_s"] = r.get("wall_s")
        rec["eval_wall_s"] = (r["wall_s"] - eager_s) if r.get("wall_s") is not None else None
        rec["eval_inprocess_s"] = stages.get("eval_kernel_against_ref")
        if r.get("t_popen") and c.get("t_child_start"):
            stages["interpreter_start"] = c["t_child_start"] - r["t_popen"]
        if c.get("t_done") and r.get("t_popen") and r.get("wall_s") is not None:
            stages["process_exit"] = r["t_popen"] + r["wall_s"] - c["t_done"]
        rec["stages"] = stages
        rec["calls"] = c.get("calls")
        rec["static"] = c.get("static")
        rec["device"] = c.get("device")
        rec["runtime_ms"] = res.get("runtime")
        rec["ref_runtime_ms"] = res.get("ref_runtime")
        rec["runtime_stats"] = res.get("runtime_stats")
        rec["ref_runtime_stats"] = res.get("ref_runtime_stats")
        rec["metadata"] = res.get("metadata")
        rec["speedup"] = (res["ref_runtime"] / res["runtime"]
                          if (res.get("runtime") or 0) > 0 and (res.get("ref_runtime") or 0) > 0 else None)
        eager = c.get("eager_ref") or {}
        rec["eager_ref_stats"] = eager or None
        rec["speedup_rc"] = (eager["mean"] / res["runtime"]
                             if eager.get("mean") and (res.get("runtime") or 0) > 0 else None)
        if rec["verdict"] in ("harness_error", "timeout"):
            rec["error"] = (r.get("error") or c.get("child_exception") or c.get("eval_exception")
                            or r.get("log_tail") or "")[-3000:]
        ev = rec["eval_wall_s"]
        log(f"[kb] eval {p['key']}: {rec['verdict']}, {ev if ev is not None else float('nan'):.1f}s/eval "
            f"(in-process {rec['eval_inprocess_s'] or float('nan'):.1f}s), "
            f"speedup {_fmt(rec['speedup'], '.3f')} (run_and_check-style {_fmt(rec['speedup_rc'], '.3f')})")
        if rec.get("error"):
            log(f"[kb]   error: {rec['error'].strip().splitlines()[-1][:300] if rec['error'].strip() else '?'}")
        save()


# =====================================================================================================================
# musacoder side
# =====================================================================================================================

def _verdict_record(v, wall: float | None) -> dict:
    d = v.to_dict() if hasattr(v, "to_dict") else dict(v.__dict__)
    keep = ("status", "reason", "speedup_eager", "speedup_compile", "candidate_ms", "eager_ms", "compile_ms",
            "timing_rse", "timing_reps", "stage_seconds", "trials_passed", "trials_total", "max_abs_err",
            "kernel_launches", "kernel_time_share", "sol_ms", "sol_flag", "device")
    r = {k: d.get(k) for k in keep}
    if r["status"] is not None and not isinstance(r["status"], str):
        r["status"] = getattr(r["status"], "value", str(r["status"]))
    r["wall_s"] = wall
    if d.get("compile_log") and r["status"] != "ok":
        r["compile_log_tail"] = d["compile_log"][-1500:]
    return r


def _clear_baselines(cache_dir: Path) -> str | None:
    try:
        db = sqlite3.connect(str(cache_dir / "musacoder.sqlite"), timeout=60)
        with db:
            n = db.execute("DELETE FROM baseline").rowcount
        db.close()
        return f"cleared {n} baseline rows"
    except Exception as e:
        return f"could not clear baselines: {type(e).__name__}: {e}"


def run_ours(pairs: list[dict], args, out: dict, save):
    from musacoder import VerifyConfig, verify
    from musacoder.verifier.api import get_pool

    live = [p for p in pairs if p.get("task_obj") is not None and p.get("cand_code")]
    cache_dir = (Path(args.out) / "mc_cache").resolve()
    shutil.rmtree(cache_dir, ignore_errors=True)
    cfg = VerifyConfig(backend=args.backend, profile=args.profile, cache_dir=cache_dir)
    ours = out["musacoder"] = {"config": cfg.to_dict(), "tasks": {p["key"]: {"candidate": p["cand_path"]}
                                                                  for p in live}}

    def one(p, phase):
        if _elapsed() > args.deadline_s:
            log(f"[ours] skip {phase} {p['key']}: over --deadline-s {args.deadline_s:.0f}s")
            return {"status": "skipped", "wall_s": None, "error": f"over --deadline-s {args.deadline_s:.0f}s"}
        t = time.perf_counter()
        try:
            v = verify(p["task_obj"], p["cand_code"], cfg)
            rec = _verdict_record(v, time.perf_counter() - t)
        except Exception as e:
            rec = {"status": "bench_error", "wall_s": time.perf_counter() - t,
                   "error": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]}
        log(f"[ours] {phase} {p['key']}: {rec.get('status')} in {rec['wall_s']:.1f}s, speedup "
            f"{_fmt(rec.get('speedup_eager'), '.3f')} ({rec.get('reason') or rec.get('error', '')[-200:]})"[:400])
        return rec

    # -- startup --
    t = time.perf_counter()
    try:
        pool = get_pool(cfg)
        hello = pool.wait_ready() if hasattr(pool, "wait_ready") else (pool._device_ready.wait(600), None)[1]
        ours["device"] = (hello or {}).get("device") if isinstance(hello, dict) else None
    except Exception as e:
        ours["startup_error"] = f"{type(e).__name__}: {e}"
        log(f"[ours] pool failed to start: {ours['startup_error']}")
        save()
        return
    ours["pool_startup_s"] = time.perf_counter() - t
    log(f"[ours] pool up in {ours['pool_startup_s']:.1f}s (device worker ready)")

    # -- cold: empty build + baseline caches, the whole batch through verify_many --
    log(f"[ours] cold pass: {len(live)} candidates through verify_many on an empty cache")
    t = time.perf_counter()
    try:
        from musacoder import verify_many

        for i, v in verify_many([(p["task_obj"], p["cand_code"]) for p in live], cfg):
            p = live[i]
            rec = _verdict_record(v, (v.stage_seconds or {}).get("total"))
            rec["done_at_s"] = time.perf_counter() - t
            ours["tasks"][p["key"]]["cold"] = rec
            log(f"[ours] cold {p['key']}: {rec['status']} at +{rec['done_at_s']:.1f}s (verdict total "
                f"{_fmt(rec['wall_s'], '.1f')}s, compile {_fmt((rec['stage_seconds'] or {}).get('compile'), '.1f')}s)")
    except Exception as e:
        ours["cold_error"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]
        log(f"[ours] cold pass failed: {type(e).__name__}: {e}")
    ours["cold_batch_wall_s"] = time.perf_counter() - t
    log(f"[ours] cold batch wall {ours['cold_batch_wall_s']:.1f}s")
    save()

    # -- warm: everything cached --
    for p in live:
        ours["tasks"][p["key"]]["warm"] = one(p, "warm")
        save()

    # -- repeats on one candidate --
    passed = [p["key"] for p in live if (ours["tasks"][p["key"]].get("warm") or {}).get("status") == "ok"]
    rep_key = args.repeat_task or next((k for k in REPEAT_PREFERENCE if k in passed), None) or \
        (passed[0] if passed else (live[0]["key"] if live else None))
    rp = next((p for p in live if p["key"] == rep_key), None)
    if rp is not None and args.repeats > 0:
        reps = []
        for i in range(args.repeats):
            note = _clear_baselines(cache_dir) if args.repeat_fresh_baseline else None
            r = one(rp, f"repeat {i + 1}/{args.repeats}")
            r["baseline_note"] = note
            reps.append(r)
        ours["repeats"] = {"task": rep_key, "fresh_baseline": args.repeat_fresh_baseline, "runs": reps,
                           **spread([r.get("speedup_eager") for r in reps], "speedup"),
                           **spread([r.get("candidate_ms") for r in reps], "candidate_ms"),
                           **spread([r.get("eager_ms") for r in reps], "eager_ms")}
        log(f"[ours] repeat spread of speedup on {rep_key}: {_fmt(ours['repeats'].get('speedup_spread_pct'), '.2f')}%")
        save()

    # -- built: builds cached, baselines cleared (what a new task costs), if time remains --
    if args.no_built_pass:
        ours["built_skipped"] = "--no-built-pass"
    elif time.perf_counter() - T0 > args.budget_s:
        ours["built_skipped"] = f"over --budget-s {args.budget_s:.0f}s"
        log(f"[ours] skipping the cached-build/cold-baseline pass: {ours['built_skipped']}")
    else:
        ours["built_note"] = _clear_baselines(cache_dir)
        for p in live:
            ours["tasks"][p["key"]]["built"] = one(p, "built (cold baseline)")
            save()


def spread(values, name: str) -> dict:
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(vals) < 2:
        return {f"{name}_values": vals}
    med = statistics.median(vals)
    return {f"{name}_values": vals, f"{name}_median": med,
            f"{name}_spread_pct": 100 * (max(vals) - min(vals)) / med if med else None,
            f"{name}_cv_pct": 100 * statistics.stdev(vals) / statistics.fmean(vals) if statistics.fmean(vals) else None}


# =====================================================================================================================
# Report
# =====================================================================================================================

def _fmt(x, spec=".2f", none="—"):
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else none


def _med(xs):
    xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return statistics.median(xs) if xs else None


KB_NOT_RUN = ("harness_error", "timeout", "retry (lock error)", "skipped")


def summarize(out: dict) -> str:
    kb = (out.get("kernelbench") or {}).get("tasks", {})
    ours = (out.get("musacoder") or {}).get("tasks", {})
    keys = [p["key"] for p in out["pairs"] if not p.get("skip")]
    rows, agree, n_both, sp_ok, n_sp, not_comparable = [], 0, 0, 0, 0, []
    kb_cached, kb_inproc, our_warm, our_cold, our_built, kb_cold = [], [], [], [], [], []
    for k in keys:
        a, b = kb.get(k, {}), ours.get(k, {})
        w, c, bl = b.get("warm") or {}, b.get("cold") or {}, b.get("built") or {}
        kv, ov = a.get("verdict"), w.get("status") or c.get("status")
        ks, osp = a.get("speedup"), w.get("speedup_eager")
        diff = 100 * (osp - ks) / ks if isinstance(ks, float) and isinstance(osp, float) and ks else None
        kb_ran = kv is not None and kv not in KB_NOT_RUN
        if kb_ran and ov and ov not in ("bench_error", "skipped"):
            n_both += 1
            agree += (kv == "ok") == (ov == "ok")
        elif kv or ov:
            not_comparable.append(k)
        if diff is not None:
            n_sp += 1
            sp_ok += abs(diff) <= TARGETS["speedup_diff_pct"]
        pre = (a.get("prebuild") or {}).get("wall_s")
        kcold = (pre + a["eval_wall_s"]) if pre is not None and a.get("eval_wall_s") is not None else None
        if kb_ran:
            kb_cached.append(a.get("eval_wall_s"))
            kb_inproc.append(a.get("eval_inprocess_s"))
            kb_cold.append(kcold)
        our_warm.append(w.get("wall_s"))
        our_cold.append(c.get("wall_s"))
        our_built.append(bl.get("wall_s"))
        rows.append(f"| {k} | {kv or '—'} | {ov or '—'} | {_fmt(a.get('eval_wall_s'), '.1f')} "
                    f"({_fmt(a.get('eval_inprocess_s'), '.1f')}) | {_fmt(kcold, '.1f')} | {_fmt(w.get('wall_s'), '.1f')} "
                    f"| {_fmt(bl.get('wall_s'), '.1f')} | {_fmt(c.get('wall_s'), '.1f')} / "
                    f"{_fmt((c.get('stage_seconds') or {}).get('compile'), '.1f')} | {_fmt(ks, '.3f')} "
                    f"| {_fmt(a.get('speedup_rc'), '.3f')} | {_fmt(osp, '.3f')} | {_fmt(diff, '+.1f')} |")
    lines = [
        "# KernelBench harness vs musacoder verifier",
        "",
        f"device: {_device(out)}; tasks: {len(keys)}; KB: {out.get('kernelbench', {}).get('num_correct_trials', '—')} "
        f"correctness trials, {out.get('kernelbench', {}).get('num_perf_trials', '—')} perf trials (cuda_event); "
        f"ours: profile `{out['args']['profile']}`, backend `{out['args']['backend']}`",
        "",
        "| task | KB verdict | ours verdict | KB s/eval cached (in-proc) | KB s/eval cold | ours s/eval cached "
        "| ours cached build, cold baseline | ours cold in batch: total / compile | KB speedup | KB speedup (eager ref) "
        "| ours speedup | diff % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Columns: KB s/eval = one fresh process running eval_kernel_against_ref with its build cached (in brackets: the "
        "call alone); KB cold = its prebuild process + that. Ours cached = verify() with build and baseline cached; "
        "ours cold = the verdict's own total (and its compile stage) in one verify_many batch on an empty cache, "
        "queueing behind the other candidates included. KB speedup = ref_runtime/runtime (means, same process); "
        "KB speedup (eager ref) = run_and_check's separate eager measurement / runtime (with --kb-eager-ref); "
        "ours = eager median / candidate median; diff % = ours vs KB speedup.",
        "",
    ]
    kbm, om, kbim = _med(kb_cached), _med(our_warm), _med(kb_inproc)
    ratio = kbm / om if kbm and om else None
    ratio_in = kbim / om if kbim and om else None
    okb = out.get("kernelbench", {})
    omc = out.get("musacoder", {})
    n_k = len([x for x in kb_cold if x is not None]) or None
    kb_amort = ((okb.get("prebuild_batch_wall_s") or 0) + sum(x for x in kb_cached if x)) / n_k if n_k else None
    n_o = len([x for x in our_cold if x is not None]) or None
    our_amort = omc.get("cold_batch_wall_s") / n_o if n_o and omc.get("cold_batch_wall_s") else None
    rep = omc.get("repeats") or {}
    lines += [
        f"- median wall per evaluation, cached: KB {_fmt(kbm, '.2f')} s (in-process call only {_fmt(kbim, '.2f')} s), "
        f"ours {_fmt(om, '.2f')} s -> ratio KB/ours **{_fmt(ratio, '.1f')}x** ({_fmt(ratio_in, '.1f')}x against KB's "
        f"in-process time); median ours with a cold baseline: {_fmt(_med(our_built), '.2f')} s",
        f"- cold, amortised over the batch: KB {_fmt(kb_amort, '.2f')} s/eval (prebuild batch "
        f"{_fmt(okb.get('prebuild_batch_wall_s'), '.1f')} s in parallel + evals), ours {_fmt(our_amort, '.2f')} s/eval "
        f"(verify_many batch {_fmt(omc.get('cold_batch_wall_s'), '.1f')} s) -> ratio "
        f"{_fmt(kb_amort / our_amort if kb_amort and our_amort else None, '.1f')}x",
        f"- musacoder pool startup (once per process, not per evaluation): {_fmt(omc.get('pool_startup_s'), '.1f')} s",
        f"- verdict agreement (ok vs not ok): {agree}/{n_both}"
        + (f" (not comparable, a side did not run: {', '.join(not_comparable)})" if not_comparable else "")
        + f"; speedups within {TARGETS['speedup_diff_pct']:g}%: {sp_ok}/{n_sp}",
        f"- repeat spread on {rep.get('task', '—')} ({len(rep.get('runs', []))} runs, baseline "
        f"{'re-timed each run' if rep.get('fresh_baseline') else 'cached'}): speedup (max-min)/median "
        f"**{_fmt(rep.get('speedup_spread_pct'), '.2f')}%** (CV {_fmt(rep.get('speedup_cv_pct'), '.2f')}%), "
        f"speedups {', '.join(_fmt(x, '.3f') for x in rep.get('speedup_values', [])) or '—'}; candidate ms spread "
        f"{_fmt(rep.get('candidate_ms_spread_pct'), '.2f')}%",
        "",
        "Targets: "
        + "; ".join([
            f"wall ratio >= {TARGETS['wall_ratio']:g}x: {_pf(ratio is not None and ratio >= TARGETS['wall_ratio'], ratio)}",
            f"verdicts agree: {_pf(agree == n_both, n_both or None)}",
            f"speedups within {TARGETS['speedup_diff_pct']:g}%: {_pf(sp_ok == n_sp, n_sp or None)}",
            f"repeat spread < {TARGETS['repeat_spread_pct']:g}%: "
            f"{_pf((rep.get('speedup_spread_pct') or 1e9) < TARGETS['repeat_spread_pct'], rep.get('speedup_spread_pct'))}",
        ]),
    ]
    brk = _kb_breakdown({k: v for k, v in kb.items() if v.get("verdict") not in KB_NOT_RUN})
    if brk:
        lines += ["", "Where KernelBench's per-eval time goes (median over tasks, seconds): " + brk]
    errs = [f"- {k}: KB: {(kb.get(k) or {}).get('error', '')[-300:].strip()}" for k in keys if (kb.get(k) or {}).get("error")]
    errs += [f"- {k}: ours {ph}: {(ours.get(k) or {}).get(ph, {}).get('error', '')[-300:].strip()}"
             for k in keys for ph in ("cold", "warm", "built") if ((ours.get(k) or {}).get(ph) or {}).get("error")]
    for name, msg in (("kb", okb.get("error")), ("ours startup", omc.get("startup_error")),
                      ("ours cold", omc.get("cold_error"))):
        if msg:
            errs.append(f"- {name}: {str(msg)[-300:].strip()}")
    if errs:
        lines += ["", "Errors:", *errs]
    skipped = [p for p in out["pairs"] if p.get("skip")]
    if skipped:
        lines += ["", "Skipped pairs:", *[f"- {p['key']}: {p['skip']}" for p in skipped]]
    return "\n".join(lines) + "\n"


def _pf(ok: bool, value) -> str:
    return "n/a" if value is None else ("PASS" if ok else "FAIL")


def _device(out):
    for t in (out.get("kernelbench") or {}).get("tasks", {}).values():
        if t.get("device"):
            return t["device"]
    return (out.get("musacoder") or {}).get("device") or out["args"]["backend"]


def _kb_breakdown(kb: dict) -> str:
    parts: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    for t in kb.values():
        st = t.get("stages") or {}
        for name in ("interpreter_start", "import_torch", "import_kernelbench_and_cuda_init", "process_exit"):
            if st.get(name) is not None:
                parts.setdefault(name, []).append(st[name])
        for name, c in (t.get("calls") or {}).items():
            if name != "clear_l2_cache":
                parts.setdefault(name, []).append(c["s"])
                counts.setdefault(name, []).append(c["n"])
    return ", ".join(f"{k}{' x%g' % _med(counts[k]) if k in counts else ''} {_fmt(_med(v), '.2f')}"
                     for k, v in parts.items())


# =====================================================================================================================
# main
# =====================================================================================================================

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb-repo", default=str(ROOT / ".kb" / "KernelBench"),
                    help="KernelBench checkout (or any folder holding src/kernelbench)")
    ap.add_argument("--kb-jsonl", default=None,
                    help="tasks: KernelBench jsonl (default ../shared/kernelbench/kernelbench.jsonl, else "
                         ".kb/kernelbench.jsonl); with --backend cpu the shipped musacoder/tasks/builtin")
    ap.add_argument("--out", required=True, help="output folder (results.json, summary.md, caches, logs)")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--profile", default="kernelbench", choices=["kernelbench", "strict"])
    ap.add_argument("--pairs", nargs="*", default=None, metavar="TASK=CANDIDATE",
                    help="task_key=candidate_path items (replace the built-in mapping)")
    ap.add_argument("--only", nargs="*", default=None, help="keep these task keys (or name substrings)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--repeat-task", default=None, help="task key for the repeats (default: first that passed)")
    ap.add_argument("--repeat-fresh-baseline", action="store_true",
                    help="clear the baseline cache before each repeat (eager and compile re-timed every run)")
    ap.add_argument("--skip-kernelbench", action="store_true")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--kb-correct-trials", type=int, default=5, help="KernelBench num_correct_trials (its default 5)")
    ap.add_argument("--kb-perf-trials", type=int, default=100, help="KernelBench num_perf_trials (its default 100)")
    ap.add_argument("--kb-eager-ref", action="store_true",
                    help="also run run_and_check's separate eager measurement (one more input generation + 105 "
                         "timed runs per task; its time is not counted per eval)")
    ap.add_argument("--kb-timeout", type=float, default=300.0, help="per KernelBench process (run_and_check: 300)")
    ap.add_argument("--kb-build-workers", type=int, default=20, help="parallel prebuilds (eval_from_generations: 20)")
    ap.add_argument("--shims", default=str(ROOT / ".kb" / "bench_shims"))
    ap.add_argument("--no-built-pass", action="store_true", help="skip ours' cached-build/cold-baseline pass")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="skip the optional last pass (ours, cached build + cold baseline) once the run took this long")
    ap.add_argument("--kb-budget-s", type=float, default=330.0,
                    help="start no new KernelBench evaluation after this many seconds (leaves time for ours)")
    ap.add_argument("--deadline-s", type=float, default=570.0,
                    help="start no new evaluation of either side after this many seconds; summary still written")
    args = ap.parse_args(argv)
    if args.kb_jsonl is None:
        if args.backend == "cpu":
            args.kb_jsonl = str(ROOT / "musacoder" / "tasks" / "builtin")
        else:
            shared = ROOT.parent / "shared" / "kernelbench" / "kernelbench.jsonl"
            args.kb_jsonl = str(shared if shared.exists() else ROOT / ".kb" / "kernelbench.jsonl")
    return args


def resolve_pairs(args) -> list[dict]:
    from musacoder.tasks import load_tasks

    if args.pairs:
        mapping = {}
        for item in args.pairs:
            if "=" not in item:
                raise SystemExit(f"--pairs item {item!r}: expected task_key=candidate_path")
            k, v = item.split("=", 1)
            mapping[k.strip()] = v.strip()
    else:
        mapping = dict(CPU_PAIRS if args.backend == "cpu" else CUDA_PAIRS)
    if args.only:
        mapping = {k: v for k, v in mapping.items() if any(o == k or o in k for o in args.only)}
    tasks = {t.key: t for t in load_tasks(args.kb_jsonl)}
    pairs = []
    for key, cand in mapping.items():
        p = {"key": key, "cand_path": cand}
        path = Path(cand) if Path(cand).is_absolute() else (Path.cwd() / cand if (Path.cwd() / cand).exists()
                                                            else ROOT / cand)
        t = tasks.get(key) or next((t for t in tasks.values() if t.name == key), None)
        if t is None:
            p["skip"] = f"no task {key!r} in {args.kb_jsonl}"
        elif not path.exists():
            p["skip"] = f"candidate {cand} not found"
        else:
            p.update(task_obj=t, task_code=t.code, cand_code=path.read_text(), cand_path=str(path))
        if p.get("skip"):
            log(f"skip {key}: {p['skip']}")
        pairs.append(p)
    return pairs


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))  # musacoder importable without installing, here and in its worker processes
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [x for x in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if x])
    pairs = resolve_pairs(args)
    out = {"args": vars(args), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
           "pairs": [{k: v for k, v in p.items() if k in ("key", "cand_path", "skip")} for p in pairs]}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda_available"] = torch.cuda.is_available()
    except Exception as e:  # noqa: BLE001
        out["torch"] = f"import failed: {e}"
    log(f"{len([p for p in pairs if not p.get('skip')])} task/candidate pairs; tasks from {args.kb_jsonl}; "
        f"out {out_dir}")

    def save():
        out["elapsed_s"] = time.perf_counter() - T0
        (out_dir / "results.json").write_text(json.dumps(_jsonable(out), indent=1))
        (out_dir / "summary.md").write_text(summarize(out))

    if args.skip_kernelbench:
        out["kernelbench"] = {"skipped": True}
    else:
        try:
            run_kernelbench(pairs, args, out, save)
        except Exception as e:
            out.setdefault("kernelbench", {})["error"] = "".join(
                traceback.format_exception(type(e), e, e.__traceback__))[-3000:]
            log(f"[kb] side failed: {type(e).__name__}: {e}")
    save()
    if args.skip_ours:
        out["musacoder"] = {"skipped": True}
    else:
        try:
            run_ours(pairs, args, out, save)
        except Exception as e:
            out.setdefault("musacoder", {})["error"] = "".join(
                traceback.format_exception(type(e), e, e.__traceback__))[-3000:]
            log(f"[ours] side failed: {type(e).__name__}: {e}")
    save()
    log(f"done in {time.perf_counter() - T0:.1f}s; wrote {out_dir / 'results.json'} and {out_dir / 'summary.md'}")
    print()
    print((out_dir / "summary.md").read_text(), flush=True)
    try:  # workers hold the GPU; shut them down before the interpreter exits
        from musacoder.verifier.api import close_pools

        close_pools()
    except Exception:
        pass
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--kb-child":
        sys.exit(kb_child(sys.argv[2]))
    sys.exit(main())
