"""The CLI as a user runs it: a real subprocess, JSON on stdout, exit code 0 whatever the verdict."""

import json
import subprocess
import sys

from musacoder.examples_catalog import load_catalog
from musacoder.tasks.loaders import BUILTIN_DIR


def run_cli(*args, cache):
    return subprocess.run([sys.executable, "-m", "musacoder.cli", *args], capture_output=True, text=True,
                          env={**__import__("os").environ, "MUSACODER_CACHE": cache}, timeout=900)


def test_verify_json_for_an_illegal_candidate(cache_dir):
    ex = next(e for e in load_catalog("cpu") if e.threat == 1)
    task = BUILTIN_DIR / f"{ex.task}.py"
    r = run_cli("verify", "--task", str(task), "--candidate", str(ex.path), "--backend", "cpu", "--json",
                "--no-timing", cache=cache_dir)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in ("status", "reason", "correctness", "speedup_eager", "speedup_compile", "reward", "feedback"):
        assert key in d
    assert d["status"] == "illegal" and d["reward"] == -1.0


def test_verify_missing_task_is_a_clear_error(tmp_path, cache_dir):
    r = run_cli("verify", "--task", str(tmp_path / "nope.py"), "--candidate", str(tmp_path / "c.py"),
                cache=cache_dir)
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_tasks_lists_shipped_tasks(cache_dir):
    r = run_cli("tasks", cache=cache_dir)
    assert r.returncode == 0 and "level1/19_ReLU" in r.stdout


def test_console_errors_are_one_line_with_exit_2(tmp_path, cache_dir):
    """Through the real entry point: a malformed config names its file, line and column; an output path that
    cannot be written names the path; neither prints a traceback."""
    bad = tmp_path / "rl.yaml"
    bad.write_text("names: [19_ReLU\noutput_dir: out\n")
    r = run_cli("rl", "--config", str(bad), cache=cache_dir)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {bad}:") and "invalid YAML" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "file").write_text("")
    r = run_cli("port", "c2m", str(BUILTIN_DIR / "level1" / "19_ReLU.py"), "--out", str(tmp_path / "file" / "x.mu"),
                cache=cache_dir)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {tmp_path / 'file' / 'x.mu'}: Not a directory")
    assert "Traceback" not in r.stderr
