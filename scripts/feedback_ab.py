"""A/B of the profiler facts in the repair turns (issue 44, F), on one set of turn-1 samples.

Turn 1 is generated and verified once (OUT/turn1); its run is copied into OUT/on and OUT/off. Then, turn by turn,
OUT/off's stored feedback loses its `Bottleneck: ...` line (what the verifier wrote before this change) while OUT/on
keeps it, and `bench run` resumes both with one more turn: the two arms differ only in that line. The verifier
profiles only passing candidates, so the line reaches a model only in the turns after a correct one: use
`--optimise-after-success` (the default `--stop-on-success` ends those samples) and keep timing on.

    python scripts/feedback_ab.py OUT --turns 3 -- --tasks T.jsonl --levels all --backend triton \\
        --model hf:runs/sft --samples 8 --temperature 0.7 --max-tokens 1536 --optimise-after-success

Writes OUT/compare.md (`bench compare OUT/off OUT/on`: Pass@k, Faster Rate, fast_p with their noise) and
OUT/ab.json (per arm: how many samples were correct at each turn, and their mean speedup over eager).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path


def bench(out: Path, turns: int, options: list[str]) -> None:
    cmd = ["musacoder", "bench", "run", *options, "--turns", str(turns), "--out", str(out)]
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode not in (0, 1):  # 1: samples unfinished, kept for the next resume
        sys.exit(f"error: {' '.join(cmd)} failed")


def strip_bottleneck(run: Path) -> int:
    """Remove the `Bottleneck:` line from every stored feedback of `run`; returns the lines removed."""
    db = sqlite3.connect(run / "samples.sqlite")
    removed = 0
    with db:
        for key, text in db.execute("SELECT rowid, verdict FROM samples WHERE verdict IS NOT NULL").fetchall():
            v = json.loads(text)
            lines = v.get("feedback", "").splitlines()
            kept = [ln for ln in lines if not ln.startswith("Bottleneck: ")]
            if len(kept) < len(lines):
                removed += len(lines) - len(kept)
                v["feedback"] = "\n".join(kept)
                db.execute("UPDATE samples SET verdict = ? WHERE rowid = ?", (json.dumps(v), key))
    db.close()
    return removed


def per_turn(run: Path) -> dict:
    db = sqlite3.connect(run / "samples.sqlite")
    out: dict = {}
    for turn, text in db.execute("SELECT turn, verdict FROM samples WHERE verdict IS NOT NULL"):
        v = json.loads(text)
        t = out.setdefault(str(turn), {"verified": 0, "ok": 0, "speedups": []})
        t["verified"] += 1
        if v["status"] == "ok":
            t["ok"] += 1
            if v.get("speedup_eager"):
                t["speedups"].append(v["speedup_eager"])
    db.close()
    return {k: {"verified": t["verified"], "ok": t["ok"],
                "mean_speedup_eager": sum(t["speedups"]) / len(t["speedups"]) if t["speedups"] else None}
            for k, t in sorted(out.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 usage="%(prog)s OUT [--turns N] -- BENCH_OPTIONS")
    ap.add_argument("out", type=Path)
    ap.add_argument("--turns", type=int, default=3)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a, options = ap.parse_args(argv[:cut]), argv[cut + 1:]
    if a.turns < 2 or not options or "--out" in options or "--turns" in options:
        sys.exit("error: give --turns 2 or more, then -- and the `bench run` options (without --out or --turns)")
    first, on, off = a.out / "turn1", a.out / "on", a.out / "off"
    bench(first, 1, options)
    for arm in (on, off):
        if not arm.exists():
            shutil.copytree(first, arm)
    for turn in range(2, a.turns + 1):
        print(f"turn {turn}: {strip_bottleneck(off)} Bottleneck lines removed from the off arm", flush=True)
        for arm in (off, on):
            bench(arm, turn, options)
    (a.out / "ab.json").write_text(json.dumps({"on": per_turn(on), "off": per_turn(off)}, indent=1) + "\n")
    text = subprocess.run(["musacoder", "bench", "compare", str(off), str(on)], capture_output=True, text=True).stdout
    (a.out / "compare.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
