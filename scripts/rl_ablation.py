"""RL ablations with seeds: `musacoder rl` once per arm and seed, the arms of one seed sharing its warm start, then a
table of each arm's first-turn pass rate and reward over the last steps (mean over seeds, 95% t-interval), each
ablation's difference from the full run with its Welch interval, and the mean curves in one plot. A run whose
final model exists is not run again, so an interrupted ablation resumes.

    python scripts/rl_ablation.py --config configs/rl-tiny-cpu.yaml --out runs/ablation --seeds 0,1,2 \\
        --arms full,no-bdr,no-mirrorpop
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

ARMS = {"full": [], "no-primeecho": ["primeecho.enabled=false"], "no-bdr": ["bdr.enabled=false"],
        "no-mirrorpop": ["mirrorpop.mode=off"]}
T95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and its 95% t-interval (the mean alone for one value)."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, m, m
    h = T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - h, m + h


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Difference of means a - b and its 95% Welch interval."""
    d = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return d, d, d
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va ** 2 / (len(a) - 1) if va else 0) + (vb ** 2 / (len(b) - 1) if vb else 0) or 1)
    h = T95.get(max(1, round(df)), 1.96) * se
    return d, d - h, d + h


def steps(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not (run / "final" / "config.json").exists() or not path.exists():
        return []  # not run, or not to its end
    return [r for r in map(json.loads, path.read_text().splitlines()) if "rl/reward_mean" in r]


def repaired(run: Path) -> tuple[int, int]:
    """A run's fresh trajectories whose first turn failed and that took a second: (those the second turn passed, all
    of them); BDR's retries, which start from an earlier answer, left out."""
    path = run / "rollouts.jsonl"
    rows = [r for r in map(json.loads, path.read_text().splitlines())] if path.exists() else []
    second = [r["turns"][1] for r in rows if not r.get("repair") and len(r["turns"]) > 1
              and r["turns"][0]["status"] != "ok"]
    return sum(t["status"] == "ok" for t in second), len(second)


def _sampled(recs: list[dict]) -> list[tuple]:
    """What a run's policy did each step, apart from how its arm scores it (PrimeEcho's reward differs by design)."""
    return [(r["rl/first_turn_pass"], r["rl/best_turn_pass"], r["rl/mean_turns"]) for r in recs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}")
    ap.add_argument("--last", type=int, default=4, help="steps at the end each run is scored on")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="further settings, every run; {seed} stands for the run's seed")
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    seeds = [int(s) for s in a.seeds.split(",")]
    arms = a.arms.split(",")
    if bad := [x for x in arms if x not in ARMS]:
        sys.exit(f"error: unknown arms {bad}: expected some of {', '.join(ARMS)}")
    for seed in seeds if not a.report_only else ():
        for arm in arms:
            run = out / f"{arm}-s{seed}"
            if (run / "final" / "config.json").exists():
                continue
            sets = [f"seed={seed}", f"output_dir={run}", f"warm_start.output_dir={out / f'warm-start-s{seed}'}",
                    *ARMS[arm], *(o.format(seed=seed) for o in a.overrides)]
            print(f"== {arm}, seed {seed}", flush=True)
            cmd = [sys.executable, "-m", "musacoder.cli", "rl", "--config", a.config]
            for s in sets:
                cmd += ["--set", s]
            out.mkdir(parents=True, exist_ok=True)
            with open(out / f"{arm}-s{seed}.log", "w") as log:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
            if rc:
                print(f"   failed (exit {rc}): {out / f'{arm}-s{seed}.log'}", flush=True)
    report(out, arms, seeds, a.last)


def _share(k: int, n: int) -> str:
    return f"{k} of {n} ({k / n:.0%})" if n else "- (one turn)"


def report(out: Path, arms: list[str], seeds: list[int], last: int) -> None:
    score: dict[str, dict[str, list[float]]] = {}
    curves: dict[str, list[list[float]]] = {}
    same: dict[str, int] = {}  # seeds whose policy sampled as the full arm's did, step for step: its switch did nothing
    for arm in arms:
        score[arm] = {"first_turn_pass": [], "reward": [], "bdr_retries": [], "mirrorpop_drop": [],
                      "turn2_repaired": [], "turn2_tried": []}
        for seed in seeds:
            recs = steps(out / f"{arm}-s{seed}")
            if not recs:
                continue
            tail = recs[-last:]
            score[arm]["first_turn_pass"].append(statistics.fmean(r["rl/first_turn_pass"] for r in tail))
            score[arm]["reward"].append(statistics.fmean(r["rl/reward_mean"] for r in tail))
            score[arm]["bdr_retries"].append(recs[-1].get("bdr/retries_total") or 0)
            score[arm]["mirrorpop_drop"].append(statistics.fmean(r.get("mirrorpop/drop_frac") or 0 for r in recs))
            curves.setdefault(arm, []).append([r["rl/first_turn_pass"] for r in recs])
            k, n = repaired(out / f"{arm}-s{seed}")
            score[arm]["turn2_repaired"].append(k)
            score[arm]["turn2_tried"].append(n)
            full = steps(out / f"full-s{seed}")
            same[arm] = same.get(arm, 0) + (arm != "full" and bool(full) and _sampled(full) == _sampled(recs))
    lines = [f"| arm | runs | first-turn pass, last {last} steps [95%] | vs full [95%] | reward [95%] | "
             "runs identical to full | BDR retries a run | MirrorPop's masked share | failed first turns a second "
             "turn repaired |",
             "|---|---:|---|---|---|---:|---:|---:|---|"]
    base = score.get("full", {}).get("first_turn_pass", [])
    for arm, s in score.items():
        if not s["first_turn_pass"]:
            continue
        m, lo, hi = interval(s["first_turn_pass"])
        rm, rlo, rhi = interval(s["reward"])
        vs = "-"
        if arm != "full" and base:
            vs = "{:+.3f} [{:+.3f}, {:+.3f}]".format(*welch(s["first_turn_pass"], base))
        lines.append(f"| {arm} | {len(s['reward'])} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {vs} | "
                     f"{rm:.3f} [{rlo:.3f}, {rhi:.3f}] | {'-' if arm == 'full' else same.get(arm, 0)} | "
                     f"{statistics.fmean(s['bdr_retries']):.1f} | {statistics.fmean(s['mirrorpop_drop']):.4f} | "
                     f"{_share(sum(s['turn2_repaired']), sum(s['turn2_tried']))} |")
    table = "\n".join(lines)
    print(table)
    (out / "ablation.md").write_text(table + "\n")
    (out / "ablation.json").write_text(json.dumps(score, indent=1))
    if curves:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        for arm, runs in curves.items():
            n = min(map(len, runs))
            ax.plot(range(1, n + 1), [statistics.fmean(r[i] for r in runs) for i in range(n)], marker=".",
                    label=f"{arm} ({len(runs)} seeds)")
        ax.set(xlabel="RL step", ylabel="first-turn pass rate (mean over seeds)", ylim=(-0.02, 1.02))
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "ablation.png", dpi=100)


if __name__ == "__main__":
    main()
