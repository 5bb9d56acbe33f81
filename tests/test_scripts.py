"""scripts/: the command lines the issue-44 GPU script builds, read without a GPU. The musacoder CLI is replaced by a
recorder of its arguments (what cannot run here is the Triton bench or RL itself); the script is the real one."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _issue44_gpu(tmp_path, data: Path, work: Path, step: str, **env) -> list[list[str]]:
    """Run scripts/issue44_gpu.sh's `step` on one GPU slot with the CLI recorded: each call's arguments."""
    calls = tmp_path / "calls.jsonl"
    recorder = tmp_path / "recorder.py"
    recorder.write_text(f"import json, sys\nopen({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    env = {**os.environ, "MUSACODER": f"{sys.executable} {recorder}", "BACKEND": "triton", "GPUS": "0", **env,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # the script's `python`
    out = subprocess.run(["bash", str(ROOT / "scripts/issue44_gpu.sh"), str(data), str(work),
                          str(tmp_path / "none.gguf"), step], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    return [json.loads(line) for line in calls.read_text().splitlines()]


def _settings(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]


def test_issue44_benches_get_one_devices_word_and_share_one_gpu_in_turn(tmp_path):
    """On one GPU the judges' device list reached `bench run` as four words ("devices=[0," "0," ...), which it
    refused (H200, 2026-11-29), and the two baselines ran beside each other there and ran out of its memory."""
    data = tmp_path / "data"
    (data / "twins").mkdir(parents=True)
    for name in ("eval.no_twin", "kb_l1_19_32.no_twin"):
        (data / "twins" / f"{name}.jsonl").write_text('{"name": "t"}\n')
    (data / "twins" / "eval.twin.jsonl").write_text("")  # empty: left out
    runs = _issue44_gpu(tmp_path, data, tmp_path / "work", "bench")
    assert len(runs) == 4, runs  # two baselines x two non-empty sets; no SFT model yet
    for argv in runs:
        assert argv[:2] == ["bench", "run"]
        assert argv[argv.index("--batch-size") + 1] == "128"
        kb = "kb_l1" in argv[argv.index("--tasks") + 1]  # KernelBench's 6 GiB inputs: 2 judges; 8 elsewhere
        assert _settings(argv) == [f"devices=[{','.join('0' * (2 if kb else 8))}]"], argv
    models = [argv[argv.index("--model") + 1].split(":")[0] for argv in runs]
    assert models == ["retrieval", "retrieval", "fewshot", "fewshot"]  # one after the other on the one GPU


def test_issue44_rl_arms_each_get_their_one_setting(tmp_path):
    """The four RL arms from the SFT model: the full run and each of PrimeEcho, BDR and MirrorPop off, one setting
    word each, each marked done."""
    data, work = tmp_path / "data", tmp_path / "work"
    (data / "twins").mkdir(parents=True)
    (work / "done").mkdir(parents=True)
    (work / "done" / "sft").touch()
    runs = _issue44_gpu(tmp_path, data, work, "rl", RL_STEPS="3")
    assert [argv[0] for argv in runs] == ["rl"] * 4
    sets = [_settings(argv) for argv in runs]
    assert all("max_steps=3" in s and f"model={work}/sft/final" in s for s in sets)
    assert [s[6:] for s in sets] == [[], ["primeecho.enabled=false"], ["bdr.enabled=false"], ["mirrorpop.mode=off"]]
    assert sorted(p.name for p in (work / "done").iterdir()) == ["rl-full", "rl-no-bdr", "rl-no-mirrorpop",
                                                                  "rl-no-primeecho", "sft"]


def test_issue44_rl_arms_can_be_one(tmp_path):
    """RL_ARMS picks arms: one full run, to time a step before the others are sized."""
    data, work = tmp_path / "data", tmp_path / "work"
    (data / "twins").mkdir(parents=True)
    (work / "done").mkdir(parents=True)
    (work / "done" / "sft").touch()
    runs = _issue44_gpu(tmp_path, data, work, "rl", RL_ARMS="full")
    assert len(runs) == 1 and f"output_dir={work}/rl/full" in _settings(runs[0])


def test_issue44_sft_learns_the_second_turn_from_repair_records(tmp_path):
    """`repair` runs `synth repair` on the teacher's answers with the GPUs' judges, and SFT then trains on its repair
    conversations beside the answers (RL's second turns were format errors 85% of the time on an H200 without them);
    where repair did not finish, SFT trains on the answers alone."""
    data, work = tmp_path / "data", tmp_path / "work"
    (data / "twins").mkdir(parents=True)
    (work / "done").mkdir(parents=True)
    (work / "done" / "solve").touch()
    runs = _issue44_gpu(tmp_path, data, work, "repair")
    assert [argv[:2] for argv in runs] == [["synth", "repair"]]
    assert runs[0][runs[0].index("--solutions") + 1] == f"{work}/solve" and _settings(runs[0]) == ["devices=[0,0,0,0,0,0]"]
    assert (work / "done" / "repair").exists()
    sft = _issue44_gpu(tmp_path, data, work, "sft")[-1]
    assert f"data=[{{path: {work}/solve/sft.jsonl}}, {{path: {work}/repair/repair.jsonl}}]" in _settings(sft)
    (work / "done" / "repair").unlink()
    (work / "done" / "sft").unlink()
    sft = _issue44_gpu(tmp_path, data, work, "sft")[-1]
    assert f"data=[{{path: {work}/solve/sft.jsonl}}]" in _settings(sft)


def test_rl_ablation_counts_the_failed_first_turns_a_second_turn_repaired(tmp_path):
    """scripts/rl_ablation.py's report: of the fresh trajectories whose first turn failed and that took a second turn,
    how many the second passed (BDR's retries, which start from an earlier answer, left out)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rl_ablation", ROOT / "scripts" / "rl_ablation.py")
    abl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(abl)
    run = tmp_path / "full-s0"
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text("{}")
    step = {"rl/reward_mean": 0.5, "rl/first_turn_pass": 0.25, "rl/best_turn_pass": 0.75, "rl/mean_turns": 1.75}
    (run / "metrics.jsonl").write_text(json.dumps(step) + "\n")
    turns = [[{"status": "ok"}], [{"status": "illegal"}, {"status": "ok"}], [{"status": "incorrect"},
             {"status": "format_error"}]]
    rows = [{"step": 1, "repair": False, "turns": t} for t in turns]
    rows.append({"step": 1, "repair": True, "turns": turns[1]})  # a BDR retry
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert abl.repaired(run) == (1, 2)
    abl.report(tmp_path, ["full"], [0], last=1)
    assert "| 1 of 2 (50%) |" in (tmp_path / "ablation.md").read_text()
