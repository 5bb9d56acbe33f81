"""First verdict for a new CUDA candidate, alone: before and after the builder's cold-build levers.

Shipped honest CUDA kernels, each made new for every verification (a unique constant added to its CUDA source, so no
cache anywhere has it), are verified one at a time by a warm pool (one compile worker, one judge; default strict
profile, timing on) with a fresh cache per mode:
- before: MUSACODER_PLAIN_BUILDS=1, torch's loader as it is (the `.cu` with its own headers, plain nvcc);
- after: the builder as shipped (the light `.cu` first, nvcc's front ends side by side; docs/verifier.md).
Prints per kernel and mode the wall time from submission to verdict, the compile stage, the verdict and which build
the library is (light / own); for `after`, the median seconds of each nvcc step of the `.cu` builds. Exits non-zero
when a verdict is not the catalog's or a mode fails. Needs no network (Python 3.12, torch + CUDA, nvcc on PATH).

    python scripts/cold_build.py                                   # both modes, 3 kernels, once each
    python scripts/cold_build.py --modes after --kernels honest_relu,honest_softmax --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from musacoder.config import VerifyConfig
from musacoder.examples_catalog import load_catalog
from musacoder.pool.local import LocalPool
from musacoder.tasks import builtin_task

UMBRELLA = "#include <torch/extension.h>"
DEFAULT_KERNELS = "honest_relu,honest_softmax,honest_gemm_add_relu"
WARMUP = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n" \
         "        return torch.relu(x)\n"  # no native code: starts both tiers without building anything


def fresh(code: str) -> str:
    """The candidate with a constant no other source has, on the line after its CUDA source's umbrella include."""
    if UMBRELLA not in code:
        raise SystemExit(f"error: a chosen kernel has no `{UMBRELLA}` line to add its unique constant after")
    return code.replace(UMBRELLA, f"{UMBRELLA}\nstatic const int cold_build_{uuid.uuid4().hex} = 1;", 1)


def run_mode(mode: str, examples, repeats: int) -> list[dict]:
    if mode == "before":
        os.environ["MUSACODER_PLAIN_BUILDS"] = "1"  # read by the compile worker the pool starts
    else:
        os.environ.pop("MUSACODER_PLAIN_BUILDS", None)
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"cold-{mode}-") as cache:
        times = Path(cache) / "nvcc-steps.jsonl"
        os.environ["MUSACODER_NVCC_TIMES"] = str(times)
        cfg = VerifyConfig(backend="cuda", cache_dir=cache)
        with LocalPool(cfg, compile_workers=1, devices=1) as pool:
            list(pool.verify_many([(builtin_task("level1/19_ReLU"), WARMUP)]))
            time.sleep(10)  # the compile worker's own start (its subjects' zygote) is not the candidate's
            for r in range(repeats):
                for e in examples:
                    t0 = time.perf_counter()
                    [(_, v)] = list(pool.verify_many([(builtin_task(e.task), fresh(e.code))]))
                    wall = time.perf_counter() - t0
                    keys = [b.get("key") for b in v.details.get("builds", []) if b.get("key")]
                    light = [(Path(cache) / "ext" / k / "light").exists() for k in keys]
                    rows.append({"mode": mode, "kernel": e.name, "repeat": r, "wall_s": wall,
                                 "compile_s": v.stage_seconds.get("compile", float("nan")), "status": v.status.value,
                                 "expected": e.accepted, "build": "light" if all(light) and light else "own",
                                 "reason": (v.reason or "")[:200]})
                    print(json.dumps(rows[-1], default=str), file=sys.stderr, flush=True)
        steps = [json.loads(line) for line in times.read_text().splitlines()] if times.exists() else []
    for row in rows:
        row["nvcc_steps"] = steps
    return rows


def step_table(steps: list[dict]) -> str:
    steps = [r for r in steps if r["status"] == 0]  # compiled objects (a light build that failed is not one)
    by_tool: dict[str, list[tuple[float, float]]] = {}
    for record in steps:
        for s in record["steps"]:
            by_tool.setdefault(f'{s["step"]} {s["tool"]}', []).append((s["wall_s"], s["cpu_s"]))
    lines = ["| nvcc step | wall s (median) | cpu s (median) | n |", "|---|---:|---:|---:|"]
    for name, vals in sorted(by_tool.items(), key=lambda kv: int(kv[0].split()[0])):
        lines.append(f"| {name} | {statistics.median(w for w, _ in vals):.1f} | "
                     f"{statistics.median(c for _, c in vals):.1f} | {len(vals)} |")
    walls = [r["wall_s"] for r in steps]
    lines.append(f"| whole `.cu` (wrapper) | {statistics.median(walls):.1f} | | {len(walls)} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", default=DEFAULT_KERNELS, help="comma-separated names of shipped honest CUDA kernels")
    ap.add_argument("--modes", default="before,after")
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    catalog = {e.name: e for e in load_catalog("cuda") if e.honest}
    names = a.kernels.split(",")
    unknown = [n for n in names if n not in catalog]
    if unknown:
        print(f"error: not a shipped honest CUDA kernel: {', '.join(unknown)} (choose from {', '.join(catalog)})",
              file=sys.stderr)
        return 2
    modes = a.modes.split(",")
    if not set(modes) <= {"before", "after"}:
        print("error: --modes takes before, after or both", file=sys.stderr)
        return 2
    examples = [catalog[n] for n in names]
    host = f"{os.cpu_count()} cores"
    rows = [row for mode in modes for row in run_mode(mode, examples, a.repeats)]

    print(f"first verdict for a new CUDA candidate, alone ({host}, {time.strftime('%Y-%m-%d')}; medians of "
          f"{a.repeats} run(s) a kernel)\n")
    print("| kernel | " + " | ".join(f"{m}: first verdict | {m}: compile stage | {m}: build" for m in modes) + " |")
    print("|---|" + "---:|---:|---|" * len(modes))
    for e in examples:
        cells = []
        for m in modes:
            mine = [r for r in rows if r["mode"] == m and r["kernel"] == e.name]
            cells += [f'{statistics.median(r["wall_s"] for r in mine):.1f} s',
                      f'{statistics.median(r["compile_s"] for r in mine):.1f} s',
                      "/".join(sorted({r["build"] for r in mine}))]
        print(f"| {e.name} | " + " | ".join(cells) + " |")
    for m in modes:
        walls = [r["wall_s"] for r in rows if r["mode"] == m]
        print(f"\n{m}: median first verdict {statistics.median(walls):.1f} s (max {max(walls):.1f} s)")
    after = [r for r in rows if r["mode"] == "after"]
    if after and after[0]["nvcc_steps"]:
        print("\nafter: nvcc steps of the `.cu` builds (verifier/nvcc_overlap.py; the front ends run side by side)\n")
        print(step_table(after[0]["nvcc_steps"]))
    wrong = [r for r in rows if r["status"] not in r["expected"]]
    for r in wrong:
        print(f"error: {r['kernel']} ({r['mode']}): {r['status']}, expected {'/'.join(r['expected'])}: {r['reason']}",
              file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
