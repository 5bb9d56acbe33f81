"""Issue 16, "the first hour": bad input ends in `error:` and exit 2 before anything starts, the cache is visible,
tasks are selected one way everywhere, memory is estimated up front, bench says why samples failed, help is fast.
Cheap: the verifier is replaced by a fake where a verdict's content is what is tested; bench runs replay
format-error answers (decided statically)."""

import io
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from musacoder import cli
from musacoder.backends import available_bytes
from musacoder.bench.cli import bench_app
from musacoder.bench.report import within_noise
from musacoder.cache_admin import cache_info, clear_cache
from musacoder.tasks import builtin_task
from musacoder.tasks.loaders import BUILTIN_DIR
from musacoder.tasks.select import (
    estimate_bytes,
    memory_problem,
    scale_task,
    select_tasks,
)
from musacoder.verifier.verdict import Status, Verdict

RELU_PY = BUILTIN_DIR / "level1" / "19_ReLU.py"
ROOT = Path(__file__).resolve().parents[1]


def call(app, *args):
    """Run a CLI app in-process as the console script does; return its exit code."""
    with pytest.raises(SystemExit) as e:
        app([str(a) for a in args], prog_name="musacoder")
    return e.value.code


@pytest.fixture
def fake_verify(monkeypatch):
    """Replace the verifier: record the config, return the verdict the test sets."""
    seen = {"verdict": Verdict(Status.FORMAT_ERROR, "no top-level `class ModelNew` in the candidate", device="cpu")}

    def fake(task, raw, cfg):
        seen.update(task=task, raw=raw, cfg=cfg)
        return seen["verdict"]

    monkeypatch.setattr("musacoder.api.verify", fake)
    return seen


@pytest.fixture
def cand(tmp_path):
    p = tmp_path / "cand.py"
    p.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n")
    return p


# 1. choices validated before anything starts --------------------------------------------------------------------
@pytest.mark.parametrize("args", [["verify", "--backend", "foo"], ["verify", "--profile", "foo"],
                                  ["verify", "--precision", "fp8"], ["demo", "--backend", "foo"],
                                  ["serve", "--backend", "foo"], ["serve", "--log-level", "loud"]])
def test_bad_choice_is_error_exit_2(args, capsys, tmp_path):
    rest = ["--tasks", RELU_PY, "--candidate", tmp_path / "c.py"] if args[0] == "verify" else []
    assert call(cli.app, *args, *rest) == 2
    e = capsys.readouterr().err
    assert e.startswith("error:") and "not one of" in e and "Traceback" not in e


def test_bench_bad_choice_and_missing_option(capsys, tmp_path):
    assert call(bench_app, "run", "--tasks", BUILTIN_DIR, "--model", "replay:x", "--out", tmp_path,
                "--backend", "rocm") == 2
    assert call(bench_app, "run", "--tasks", BUILTIN_DIR) == 2
    e = capsys.readouterr().err
    assert "error: Invalid value for '--backend'" in e and "error: Missing option" in e


def test_bench_set_reaches_the_verifier_and_a_typo_fails_first(capsys, tmp_path, monkeypatch):
    seen = {}

    def fake_run(tasks, client, out, cfg, vcfg, **kw):
        seen["vcfg"] = vcfg
        raise KeyboardInterrupt  # stop here: nothing to generate

    monkeypatch.setattr("musacoder.bench.runner.run_bench", fake_run)
    (tmp_path / "replay.jsonl").write_text("")
    base = ["run", "--tasks", BUILTIN_DIR, "--model", f"replay:{tmp_path / 'replay.jsonl'}", "--out", tmp_path / "run",
            "--no-timing"]
    assert call(bench_app, *base, "--set", "devices=[0,0,0,0]", "--set", "correctness.seeds=2") == 130
    v = seen["vcfg"]
    assert v.devices == (0, 0, 0, 0) and v.correctness.seeds == 2 and not v.timing_enabled
    seen.clear()
    assert call(bench_app, *base, "--set", "judges=4") == 2  # before the model is loaded or a task read
    assert call(bench_app, *base, "--set", "profile=kernelbench") == 2  # --profile's: it would be dropped
    e = capsys.readouterr().err
    assert "error: --set: unknown VerifyConfig setting" in e and "profile: this command sets it" in e and not seen


def test_backend_foo_subprocess_does_not_hang(tmp_path):
    args = ["verify", "--tasks", str(RELU_PY), "--candidate", str(tmp_path / "c.py"), "--backend", "foo"]
    r = subprocess.run([sys.executable, "-m", "musacoder.cli", *args], check=False, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error:") and "Traceback" not in r.stderr


# 2. cache info / clear, cache flags in the output ----------------------------------------------------------------
def _fake_cache(root: Path):
    (root / "builds" / "a1").mkdir(parents=True)
    (root / "builds" / "a1" / "ext.so").write_bytes(b"x" * 5000)
    (root / "builds" / "b2").mkdir()
    con = sqlite3.connect(root / "musacoder.sqlite")
    con.executescript("CREATE TABLE prebuild (key TEXT PRIMARY KEY, result TEXT);"
                      "CREATE TABLE baseline (key TEXT PRIMARY KEY, result TEXT, updated REAL);")
    con.executemany("INSERT INTO baseline VALUES (?, '{}', ?)", [("k1", time.time() - 7200), ("k2", time.time())])
    con.commit()
    con.close()


def test_cache_info_and_clear(tmp_path, capsys):
    _fake_cache(tmp_path)
    kinds = {k.name: k for k in cache_info(tmp_path)}
    assert kinds["builds"].entries == 2 and kinds["builds"].size >= 5000
    assert kinds["musacoder.sqlite:baseline"].entries == 2 and kinds["musacoder.sqlite:prebuild"].entries == 0
    assert kinds["musacoder.sqlite:baseline"].newest - kinds["musacoder.sqlite:baseline"].oldest > 7000
    assert call(cli.app, "cache", "info", "--cache-dir", tmp_path) == 0
    out = capsys.readouterr().out
    assert "builds" in out and "musacoder.sqlite:baseline" in out and "2h" in out
    assert call(cli.app, "cache", "clear", "--kind", "musacoder.sqlite:baseline", "--cache-dir", tmp_path) == 0
    assert {k.name: k.entries for k in cache_info(tmp_path)}["musacoder.sqlite:baseline"] == 0
    assert call(cli.app, "cache", "clear", "--kind", "nope", "--cache-dir", tmp_path) == 2
    assert "error: no cache kind 'nope'" in capsys.readouterr().err
    assert clear_cache(tmp_path) and cache_info(tmp_path) == []


def test_verify_says_what_came_from_the_cache_and_which_backend_auto_chose(fake_verify, cand, capsys):
    fake_verify["verdict"] = Verdict(Status.OK, "correct", device="cpu", trials_passed=5, trials_total=5,
                                     reward=0.5, details={"build_cached": True, "baseline_cached": True})
    assert call(cli.app, "verify", "--tasks", RELU_PY, "--candidate", cand) == 0
    out = capsys.readouterr().out
    assert "from the cache: build, baseline" in out and "backend cpu (auto: no GPU found)" in out
    assert fake_verify["cfg"].backend == "cpu"  # auto resolved once, before the pool


# 3. one task selection -------------------------------------------------------------------------------------------
def _jsonl(tmp_path) -> Path:
    p = tmp_path / "kb.jsonl"
    recs = [{"name": n, "level": lv, "problem_id": int(n.split("_")[0]), "code": (BUILTIN_DIR / f"level{lv}" /
             f"{n}.py").read_text()} for lv, n in ((1, "19_ReLU"), (1, "23_Softmax"), (2, "76_Gemm_Add_ReLU"))]
    p.write_text("\n".join(map(json.dumps, recs)) + "\n")
    return p


def test_tasks_prints_sources_that_verify_accepts(tmp_path, fake_verify, cand, capsys):
    kb = _jsonl(tmp_path)
    assert call(cli.app, "tasks", kb) == 0
    out = capsys.readouterr().out
    assert f"{kb}#1" in out and "level1/23_Softmax  id 23" in out
    assert call(cli.app, "verify", "--tasks", f"{kb}#1", "--candidate", cand, "--backend", "cpu") == 0
    assert fake_verify["task"].key == "level1/23_Softmax"
    assert call(cli.app, "verify", "--task", kb, "--ids", "19", "--candidate", cand, "--backend", "cpu") == 0
    assert fake_verify["task"].key == "level1/19_ReLU"
    assert call(cli.app, "verify", "--tasks", kb, "--levels", "1", "--candidate", cand) == 2
    assert "selects 2 tasks" in capsys.readouterr().err


def test_select_tasks_filters(tmp_path):
    kb = _jsonl(tmp_path)
    assert [t.key for t in select_tasks(kb, levels="2")] == ["level2/76_Gemm_Add_ReLU"]
    assert [t.key for t in select_tasks(kb, names="Softmax,level1/19_ReLU")] == ["level1/19_ReLU",
                                                                                 "level1/23_Softmax"]
    assert [t.key for t in select_tasks(None, ids="19")] == ["level1/19_ReLU"]
    with pytest.raises(ValueError, match="no task"):
        select_tasks(kb, ids="99")
    with pytest.raises(ValueError, match="integers"):
        select_tasks(kb, ids="x")


# 4. unusable input -----------------------------------------------------------------------------------------------
def test_unusable_input_is_error_exit_2(tmp_path, capsys):
    binary = tmp_path / "bin.py"
    binary.write_bytes(b"\x7fELF\x00\x01\xff\xfe")
    latin = tmp_path / "latin.py"
    latin.write_bytes("caf\xe9 = 1".encode("latin-1"))
    assert call(cli.app, "verify", "--tasks", RELU_PY, "--candidate", binary) == 2
    assert call(cli.app, "verify", "--tasks", RELU_PY, "--candidate", latin) == 2
    assert call(cli.app, "verify", "--tasks", RELU_PY, "--candidate", tmp_path / "missing.py") == 2
    assert call(cli.app, "tasks", tmp_path / "nope") == 2
    e = capsys.readouterr().err
    assert "binary file" in e and "not UTF-8" in e and "cannot read" in e and "does not exist" in e
    assert "Traceback" not in e


def test_py_candidate_without_modelnew_says_so(tmp_path):
    from musacoder.candidates import extract_code
    from musacoder.verifier.static import check_source

    p = tmp_path / "c.py"
    p.write_text("import torch\n\nclass Foo(torch.nn.Module):\n    pass\n")
    res = check_source(extract_code(cli.read_candidate(p)))
    assert res.status is Status.FORMAT_ERROR and "class ModelNew" in " ".join(res.reasons)


def test_compile_error_shows_the_compilers_first_error_line(fake_verify, cand, capsys):
    log = "[1/2] c++ -c main.cpp\nmain.cpp: In function 'f':\nmain.cpp:12:5: error: 'foo' was not declared\n" \
          "main.cpp:13:1: error: second\n"
    fake_verify["verdict"] = Verdict(Status.COMPILE_ERROR, "build failed", compile_log=log, device="cpu")
    assert call(cli.app, "verify", "--tasks", RELU_PY, "--candidate", cand, "--backend", "cpu") == 0
    out = capsys.readouterr().out
    assert "compiler: main.cpp:12:5: error: 'foo' was not declared" in out and "second" not in out


# 5. memory estimate, --size-scale, limits ------------------------------------------------------------------------
BIG = RELU_PY.read_text().replace("batch_size = 16", "batch_size = 1048576")  # 64 GiB of inputs


def test_size_scale_rewrites_constants_and_key():
    t = scale_task(builtin_task("level1/19_ReLU"), 0.25)
    assert t.key == "level1/19_ReLU@size0.25" and "dim = 4096" in t.code and "batch_size = 4" in t.code
    assert t.metadata["scaled_constants"] == {"batch_size": 4, "dim": 4096}
    assert estimate_bytes(t)[0] == 4 * 4096 * 4


def test_memory_estimated_up_front(tmp_path, fake_verify, cand, capsys):
    big = tmp_path / "19_ReLU.py"
    big.write_text(BIG)
    from musacoder.tasks import load_tasks

    msg = memory_problem(load_tasks(big)[0], available_bytes("cpu"), "cpu")
    assert msg and "--size-scale" in msg and "GiB" in msg
    assert call(cli.app, "verify", "--tasks", big, "--candidate", cand, "--backend", "cpu") == 2
    assert "error: task 19_ReLU needs about" in capsys.readouterr().err and "task" not in fake_verify
    assert call(cli.app, "verify", "--tasks", big, "--candidate", cand, "--backend", "cpu", "--size-scale",
                "0.0001", "--run-timeout", "30", "--worker-mem-gb", "2") == 0
    cfg = fake_verify["cfg"]
    assert fake_verify["task"].key == "19_ReLU@size0.0001" and cfg.run_timeout_s == 30 and cfg.worker_mem_gb == 2


# 6. bench: reasons, per-task table, subset refusal, resume, interrupt, noise ------------------------------------
def _replay(tmp_path, samples=2) -> Path:
    p = tmp_path / "answers.jsonl"
    p.write_text("".join(json.dumps({"task": k, "sample": s, "output": "I cannot write this kernel."}) + "\n"
                         for k in ("level1/19_ReLU", "level1/23_Softmax") for s in range(samples)))
    return p


def _bench(tmp_path, out, *extra):
    return call(bench_app, "run", "--tasks", BUILTIN_DIR, "--names", "19_ReLU,23_Softmax", "--model",
                f"replay:{_replay(tmp_path)}", "--out", out, "--backend", "cpu", "--no-timing", *extra)


def test_bench_reasons_tasks_subset_and_resume(tmp_path, cache_dir, monkeypatch, capsys):
    monkeypatch.setenv("MUSACODER_CACHE", cache_dir)
    out = tmp_path / "run"
    assert _bench(tmp_path, out, "--samples", "2") == 0
    o = capsys.readouterr().out
    assert "Failure reasons" in o and "no python code block found" in o and "level1/19_ReLU" in o
    report = (out / "report.md").read_text()
    assert "## Failure reasons" in report and "## Per task" in report
    assert "| level1/23_Softmax | format_error 2 | - | format_error: no python code block" in report
    assert _bench(tmp_path, out, "--samples", "1") == 2
    assert "error: this run holds 2 samples" in capsys.readouterr().err
    assert _bench(tmp_path, out, "--samples", "1", "--force") == 0
    assert "resuming: 2 of 2 samples done" in capsys.readouterr().out


def test_bench_interrupt_message(tmp_path, monkeypatch, capsys):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("musacoder.bench.runner.run_bench", interrupted)
    assert _bench(tmp_path, tmp_path / "run") == 130
    assert "interrupted; rerun the same command to resume" in capsys.readouterr().err


def test_compare_marks_noise(tmp_path):
    assert within_noise(0.5, 16, 0.6, 16) and not within_noise(0.1, 1000, 0.9, 1000)
    assert within_noise(0.0, 0, 1.0, 0)
    from musacoder.bench.report import compare

    base = {"run": {"model": "m", "samples": 8, "turns": 1}, "levels": {}}
    blk = {"tasks": 10, "samples": 80, "pass_at_k": {"1": 0.5, "8": 0.9}, "avg": 0.5, "faster_rate_eager": 0.1,
           "faster_rate_compile": 0.0, "compile_rate": 1.0, "fast_p": {}, "geomean_speedup_eager": None}
    for name, avg in (("a", 0.5), ("b", 0.55)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps({**base, "overall": {**blk, "avg": avg}}))
    assert "| Avg@8 | 50.0 | 55.0 | +5.0 | within noise |" in compare(tmp_path / "a", tmp_path / "b")


# 7. fast --help, progress ----------------------------------------------------------------------------------------
def test_help_does_not_import_torch():
    code = "import sys, musacoder.cli; print(sorted(m for m in ('torch', 'musacoder.pool.local') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "musacoder.cli", "--help"], check=False, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and time.perf_counter() - t0 < 5  # ~0.6 s here; generous for a loaded CI box


def test_verify_shows_progress_on_stderr(fake_verify, cand, monkeypatch):
    labels = []
    monkeypatch.setattr(cli, "_run_with_spinner", lambda label, fn: (labels.append(label), fn())[1])
    assert call(cli.app, "verify", "--tasks", RELU_PY, "--candidate", cand, "--backend", "cpu") == 0
    assert labels == ["verifying level1/19_ReLU on cpu"]


# 8. help text, --version, demo table width, rft model directory -------------------------------------------------
def test_help_texts_and_version(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert call(bench_app, "run", "--help") == 0
    out = capsys.readouterr().out
    assert "openai:NAME@http://host:port/v1" in out
    assert call(cli.app, "verify", "--help") == 0
    assert "<bool>" not in capsys.readouterr().out
    assert call(cli.app, "--version") == 0
    assert capsys.readouterr().out.startswith("musacoder ")


def test_demo_table_fits_100_columns():
    from musacoder.examples_catalog import load_catalog

    examples = load_catalog("cpu")[:6]
    verdicts = {i: Verdict(Status.ILLEGAL, "forward dispatches aten::relu, which is not on the allowlist " * 3,
                           device="cpu", speedup_eager=1.234, speedup_compile=0.5) for i in range(len(examples))}
    c = Console(width=100, record=True, file=io.StringIO())
    c.print(cli.demo_table(examples, verdicts, "cpu"))
    lines = c.export_text().splitlines()
    assert max(map(len, lines)) <= 100 and any("1.23" in ln for ln in lines)
    assert any("ILLEGAL".lower() in ln for ln in lines)


def test_rft_missing_model_directory(tmp_path, capsys):
    cfg = tmp_path / "rft.yaml"
    cfg.write_text(f"model: hf:{tmp_path}/no-such-model\noutput_dir: {tmp_path}/out\n")
    assert call(cli.app, "rft", "--config", cfg) == 2
    assert f"error: model directory {tmp_path}/no-such-model not found" in capsys.readouterr().err


@pytest.mark.parametrize("command,config,module,function", [
    ("sft", "sft-tiny.yaml", "musacoder.train.sft", "train_sft"),
    ("rl", "rl-tiny-cpu.yaml", "musacoder.train.rl.trainer", "train_rl")])
def test_training_out_of_device_memory_is_an_error_line(tmp_path, capsys, monkeypatch, command, config, module,
                                                       function):
    """SFT on 646 records ran out of an H100's memory at step 38 and printed a traceback (2026-11-26). The
    out-of-memory error is raised by a stand-in for the trainer: there is no GPU here to exhaust."""
    import importlib

    def oom(cfg):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a total capacity\n"
                                     "of 79.19 GiB ...")

    monkeypatch.setattr(importlib.import_module(module), function, oom)
    assert call(cli.app, command, "--config", ROOT / "configs" / config, "--output-dir", tmp_path / "out") == 1
    e = capsys.readouterr().err
    assert "error: CUDA out of memory. Tried to allocate 12.00 GiB" in e and "Traceback" not in e
    assert "resumes from the newest checkpoint" in e


def test_bench_missing_model_directory(tmp_path, capsys):
    """An SFT run that died left no `final/`; benching it printed transformers' Hub-id traceback (H100, 2026-11-26)."""
    assert call(cli.app, "bench", "run", "--model", f"hf:{tmp_path}/final", "--tasks", RELU_PY,
                "--out", tmp_path / "b") == 2
    assert f"error: model directory {tmp_path}/final not found" in capsys.readouterr().err


# 9. setup says what it installs ----------------------------------------------------------------------------------
def test_setup_plan_says_which_torch_and_why(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "--plan"], check=False, capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin", "VENV": str(tmp_path / "venv")}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "no GPU found: installing the CPU build of torch from https://download.pytorch.org/whl/cpu" in r.stderr
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "bogus"], check=False, capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr.startswith("error:")


# 10. one override syntax for every training command, typed -----------------------------------------------------
def test_set_overrides_are_typed_and_validated(tmp_path, capsys):
    from musacoder.settings import check_passthrough, parse_overrides
    from musacoder.train.sft import SFTConfig

    assert parse_overrides(["lora.r=16", "learning_rate=2.0e-5", "data=[a.jsonl, b.jsonl]", "model="]) == {
        "lora": {"r": 16}, "learning_rate": 2e-5, "data": ["a.jsonl", "b.jsonl"], "model": ""}
    p = tmp_path / "sft.yaml"
    p.write_text("data: [x.jsonl]\ninit: {}\nlora: {enabled: true, r: 4, alpha: 8}\n")
    cfg = SFTConfig.from_yaml(p, ["lora.r=16", "max_steps=7", "learning_rate=2e-5"])
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.enabled, cfg.max_steps) == (16, 8, True, 7)  # merged, not replaced
    assert cfg.learning_rate == 2e-5  # YAML reads 2e-5 as a string; a float setting takes the number
    for bad, said in [("learning_rate=fast", "setting learning_rate: input should be a valid number, got 'fast'"),
                      ("max_steps=true", "setting max_steps: input should be a valid integer, got True"),
                      ("lora.r=x", "setting lora.r: input should be a valid integer"), ("nope=1", "unknown SFTConfig setting"),
                      ("oops", "expected KEY=VALUE")]:
        with pytest.raises(ValueError, match=said):
            SFTConfig.from_yaml(p, [bad])
    from musacoder.config import VerifyConfig
    for bad, said in [({"devices": "oops"}, "setting devices: input should be a list, got 'oops'"),
                      ({"devices": [0, "a"]}, r"setting devices\[1\]: input should be a valid integer, got 'a'")]:
        with pytest.raises(ValueError, match=said):  # not a tuple of characters that fails deep in the pool
            VerifyConfig.from_dict(bad)
    assert VerifyConfig.from_dict({"devices": [0, 0]}).devices == (0, 0)
    # options and --set together: a setting an option gives cannot also come from --set (one would be dropped)
    opts = {"profile": "strict", "correctness": {"seeds": 5}}
    v = VerifyConfig.from_options(opts, ["correctness.shape_variants=false", "devices=[1]"])
    assert (v.profile, v.correctness.seeds, v.correctness.shape_variants, v.devices) == ("strict", 5, False, (1,))
    for clash in ("profile=kernelbench", "correctness.seeds=2", "correctness={seeds: 2}"):
        with pytest.raises(ValueError, match="sets it with an option of its own"):
            VerifyConfig.from_options(opts, [clash])
    assert call(cli.app, "serve", "--set", "judges=2") == 2  # before anything is started
    assert "error: --set: unknown VerifyConfig setting(s): ['judges']" in capsys.readouterr().err
    # the command line says it as an error line, before any model or data is touched
    (tmp_path / "empty.yaml").write_text("{}\n")
    for command in ("sft", "rft", "rl"):
        assert call(cli.app, command, "--config", tmp_path / "empty.yaml", "--set", "seed=many") == 2
        assert "error: setting seed: input should be a valid integer, got 'many'" in capsys.readouterr().err

    trl = pytest.importorskip("trl")
    check_passthrough({"report_to": "none"}, trl.SFTConfig, {"output_dir"})
    with pytest.raises(ValueError, match=r"\['num_epochz'\] not field\(s\) of trl"):
        check_passthrough({"num_epochz": 1}, trl.SFTConfig, set())
    with pytest.raises(ValueError, match="set by musacoder's own settings"):
        check_passthrough({"output_dir": "x"}, trl.SFTConfig, {"output_dir"})


def test_rl_and_rft_select_tasks_like_verify_and_bench(tmp_path, capsys):
    from musacoder.train.rft import RFTConfig
    from musacoder.train.rft import _tasks as rft_tasks
    from musacoder.train.rl.config import RLConfig
    from musacoder.train.rl.trainer import _tasks as rl_tasks

    assert [t.key for t in rl_tasks(RLConfig(model="m", ids=[19, 23]))] == ["level1/19_ReLU", "level1/23_Softmax"]
    assert [t.key for t in rft_tasks(RFTConfig(model="replay:x", levels="2"))] == ["level2/76_Gemm_Add_ReLU"]
    cfg = tmp_path / "rl.yaml"
    cfg.write_text(f"model: {tmp_path}/m\noutput_dir: {tmp_path}/out\n")
    assert call(cli.app, "rl", "--config", cfg, "--names", "nope") == 2
    assert "error: no task in the shipped tasks matches --names nope" in capsys.readouterr().err


# 11. issue 46, round 2: every failure a newcomer meets is one `error:` line ---------------------------------------
def test_cuda_backend_without_a_device_is_an_error_line_before_anything_runs(fake_verify, cand, capsys):
    """Without a GPU, `--backend cuda` gave every candidate a compile_error verdict (CUDA_HOME not set), reward -1,
    exit 0: a wrong setting that looked like a bad kernel."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    for backend in ("cuda", "triton"):
        assert call(cli.app, "verify", "--tasks", RELU_PY, "--candidate", cand, "--backend", backend) == 2
        assert capsys.readouterr().err.startswith("error: no CUDA device: use --backend cpu")
    assert "task" not in fake_verify  # decided before any verification
    assert call(bench_app, "run", "--tasks", RELU_PY, "--model", "replay:x", "--out", "unused", "--backend",
                "cuda") == 2
    assert "error: no CUDA device: use --backend cpu" in capsys.readouterr().err


def test_kernelbench_shim_says_no_cuda_device_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    from musacoder.kernelbench import eval_kernel_against_ref

    r = eval_kernel_against_ref(RELU_PY.read_text(), "class ModelNew: pass", backend="cuda")
    assert not r.compiled and not r.correctness
    assert r.metadata["reason"].startswith("no CUDA device") and "\n" not in r.metadata["reason"]


@pytest.mark.parametrize("argv,modules,extra", [
    (["serve"], ["fastapi"], "serve"),
    (["bench", "run", "--tasks", RELU_PY, "--model", "openai:m@http://127.0.0.1:9/v1", "--out", "OUT",
      "--backend", "cpu"], ["openai"], "bench"),
    (["sft", "--config", ROOT / "configs" / "sft-tiny.yaml", "--output-dir", "OUT"], ["trl"], "train"),
    (["rl", "--config", ROOT / "configs" / "rl-tiny-cpu.yaml", "--output-dir", "OUT"], ["trl"], "train")])
def test_a_missing_extra_says_which_to_install(argv, modules, extra, monkeypatch, capsys, tmp_path):
    """Simulated: the module is blocked in sys.modules (an import of it fails as if it were not installed) and the
    modules that import it are dropped, so they are imported again."""
    for name in list(sys.modules):
        if name.split(".")[0] in modules or name in ("musacoder.service.app", "musacoder.bench.clients.openai",
                                                      "musacoder.train.sft", "musacoder.train.rl.trainer"):
            monkeypatch.delitem(sys.modules, name)
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)
    argv = [tmp_path / "out" if a == "OUT" else a for a in argv]
    assert call(cli.app, *argv) == 2
    e = capsys.readouterr().err
    assert f"needs the {extra} extra" in e and f"pip install 'musacoder[{extra}]'" in e
    assert "Traceback" not in e and len(e.strip().splitlines()) == 1


def test_malformed_yaml_is_one_line_with_file_line_and_column(tmp_path, capsys):
    bad = tmp_path / "rl.yaml"
    bad.write_text("model: m\nmax_steps: 3\n  group_size: [8\n")
    for command in ("sft", "rft", "rl"):
        assert call(cli.app, command, "--config", bad) == 2
        e = capsys.readouterr().err
        assert e.startswith(f"error: {bad}:3:") and "invalid YAML" in e and len(e.strip().splitlines()) == 1


def test_config_values_are_range_checked_before_anything_is_created(tmp_path, capsys):
    cfg = tmp_path / "rft.yaml"
    cfg.write_text("model: replay:answers.jsonl\noutput_dir: out\n")
    assert call(cli.app, "rft", "--config", cfg, "--set", "samples=-1") == 2
    assert "error: setting samples: input should be greater than or equal to 1, got -1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    from musacoder.config import VerifyConfig

    with pytest.raises(ValueError, match="setting correctness.seeds: input should be greater than or equal to 1"):
        VerifyConfig.from_dict({"correctness": {"seeds": 0}})
    with pytest.raises(ValueError, match=r"setting correctness.rescale_factors\[1\]: input should be greater than 0"):
        VerifyConfig.from_dict({"correctness": {"rescale_factors": [2, -1]}})
    with pytest.raises(ValueError, match="setting spares: input should be greater than or equal to 0"):
        VerifyConfig(spares=-1)  # built in Python: the same ranges


def test_relative_paths_in_a_config_are_relative_to_its_folder(tmp_path, monkeypatch):
    from musacoder.train.rft import RFTConfig
    from musacoder.train.sft import SFTConfig

    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "sft.yaml").write_text(
        "data: [{path: data/a.jsonl, weight: 2}, b.jsonl]\noutput_dir: ../runs/x\nmodel: ../models/m\n"
        "tokenizer: org/tok\n")
    (tmp_path / "cfg" / "rft.yaml").write_text("model: replay:answers.jsonl\ntasks: /abs/tasks\n")
    monkeypatch.chdir("/")
    c = SFTConfig.from_yaml(tmp_path / "cfg" / "sft.yaml", ["output_dir=here"])
    assert [s.path for s in c.data] == [str(tmp_path / "cfg" / "data" / "a.jsonl"), str(tmp_path / "cfg" / "b.jsonl")]
    assert c.data[0].weight == 2 and c.model == str(tmp_path / "models" / "m")
    assert c.output_dir == "here"  # the command line's own values stay relative to the current directory
    assert c.tokenizer == "org/tok"  # no such directory next to the config: a hub id
    r = RFTConfig.from_yaml(tmp_path / "cfg" / "rft.yaml")
    assert r.model == f"replay:{tmp_path / 'cfg' / 'answers.jsonl'}" and r.tasks == "/abs/tasks"
    # the shipped configs: the same files whichever directory a command runs from
    shipped = SFTConfig.from_yaml(ROOT / "configs" / "sft-tiny.yaml")
    assert all(Path(s.path).is_file() for s in shipped.data)
    assert Path(shipped.output_dir) == ROOT / "runs" / "sft-tiny"


def test_unwritable_paths_are_one_error_line(tmp_path, cand, monkeypatch, capsys):
    """A file where a directory should be makes a path unwritable for every user, root included (CI runs as root,
    so a read-only mode bit would not do)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("MUSACODER_CACHE", str(blocker / "cache"))
    assert call(cli.app, "verify", "--tasks", RELU_PY, "--candidate", cand, "--backend", "cpu") == 2
    assert capsys.readouterr().err.startswith(f"error: cache (MUSACODER_CACHE) {blocker / 'cache'}: cannot write")
    monkeypatch.setenv("MUSACODER_CACHE", str(tmp_path / "cache"))
    assert _bench(tmp_path, blocker / "run") == 2
    assert capsys.readouterr().err.startswith(f"error: --out {blocker / 'run'}: cannot write there")
    assert call(cli.app, "port", "c2m", cand, "--out", blocker / "x.mu") == 2
    e = capsys.readouterr().err
    assert e.startswith("error: ") and str(blocker) in e and "Traceback" not in e


def test_synth_unwritable_output_is_one_error_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert call(cli.app, "synth", "tasks", "--out", blocker / "tasks.jsonl", "--n", "1") == 2
    e = capsys.readouterr().err.strip()
    assert e.startswith("error: ") and str(blocker) in e and "Traceback" not in e and len(e.splitlines()) == 1


def _slow_verifier(delay: float, started=None):
    from musacoder.verifier.verdict import Status, Verdict

    def slow(pairs, cfg):
        pairs = list(pairs)
        if started is not None:
            started.set()
        for i, _ in enumerate(pairs):
            time.sleep(delay)
            yield i, Verdict(Status.FORMAT_ERROR, "a stand-in verdict", device="cpu")
    return slow


def _verdicts(out: Path) -> int:
    from musacoder.bench.store import Store

    store = Store(out / "samples.sqlite")
    try:
        return sum(r.verified for r in store.rows())
    finally:
        store.close()


def test_first_ctrl_c_in_bench_says_what_it_waits_for_and_stores_it(tmp_path, monkeypatch, capsys, cache_dir):
    """The verifier is a stand-in that takes 0.5 s a candidate; SIGINT comes while three are in flight."""
    import os
    import signal
    import threading

    monkeypatch.setenv("MUSACODER_CACHE", cache_dir)
    started = threading.Event()
    monkeypatch.setattr("musacoder.bench.runner.verify_many", _slow_verifier(0.5, started))
    threading.Thread(target=lambda: started.wait(30) and os.kill(os.getpid(), signal.SIGINT), daemon=True).start()
    out = tmp_path / "run"
    t0 = time.perf_counter()
    assert call(bench_app, "run", "--tasks", RELU_PY, "--model", f"replay:{_replay(tmp_path, samples=3)}", "--out",
                out, "--samples", "3", "--backend", "cpu", "--no-timing", "--no-overlap") == 130
    e = capsys.readouterr().err
    assert "waiting for the 3 verification(s) in flight" in e and "rerun the same command to resume" in e
    assert _verdicts(out) == 3 and time.perf_counter() - t0 < 20
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the run's handler is gone


SLOW_BENCH = """
import sys, time
import musacoder.bench.runner as runner
from musacoder.verifier.verdict import Status, Verdict

def slow(pairs, cfg):
    pairs = list(pairs)
    print("verifying", len(pairs), file=sys.stderr, flush=True)
    for i, _ in enumerate(pairs):
        time.sleep(30)
        yield i, Verdict(Status.FORMAT_ERROR, "never", device="cpu")

runner.verify_many = slow
from musacoder.cli import app
app()
"""


def test_second_ctrl_c_in_bench_exits_at_once_and_a_rerun_resumes(tmp_path, monkeypatch, capsys, cache_dir):
    """A real `musacoder bench run` process (its verifier a stand-in that never answers in time) gets SIGINT
    twice: it exits 130 at once, the generations it stored stay, and the same command then only verifies."""
    import signal

    out = tmp_path / "run"
    args = ["bench", "run", "--tasks", str(RELU_PY), "--model", f"replay:{_replay(tmp_path, samples=3)}", "--out",
            str(out), "--samples", "3", "--backend", "cpu", "--no-timing", "--no-overlap"]
    p = subprocess.Popen([sys.executable, "-c", SLOW_BENCH, *args], stderr=subprocess.PIPE, text=True,
                         env={**__import__("os").environ, "MUSACODER_CACHE": cache_dir})
    try:
        assert p.stderr.readline().startswith("verifying 3")
        p.send_signal(signal.SIGINT)
        assert "waiting for the 3 verification(s) in flight" in p.stderr.readline()
        t0 = time.perf_counter()
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == 130 and time.perf_counter() - t0 < 5
        assert "interrupted again: exiting now" in p.stderr.read()
    finally:
        p.kill()
        p.wait()
    monkeypatch.setenv("MUSACODER_CACHE", cache_dir)
    monkeypatch.setattr("musacoder.bench.runner.verify_many", _slow_verifier(0.0))
    assert call(bench_app, *args[1:]) == 0
    assert "resuming: 0 of 3 samples done" in capsys.readouterr().out and _verdicts(out) == 3


def test_demo_tours_one_honest_kernel_a_task_and_one_exploit_a_threat_class():
    from musacoder.examples_catalog import load_catalog, tour

    for backend in ("cpu", "cuda"):
        catalog = load_catalog(backend)
        share = tour(catalog)
        assert len(share) < len(catalog) and [e for e in catalog if e in share] == share  # catalog order
        assert {e.task for e in share if e.honest} == {e.task for e in catalog if e.honest}
        assert {e.threat for e in share if not e.honest} == {e.threat for e in catalog if not e.honest}
        assert len({e.threat for e in share if not e.honest}) == sum(not e.honest for e in share)  # one each
