"""First verdict for a new CUDA candidate, alone: before and after the builder's cold-build levers.

Shipped honest CUDA kernels, each made new for every verification (a unique constant added to its CUDA source, so no
cache anywhere has it), are verified one at a time by a warm pool (one compile worker, one judge; default strict
profile, timing on) with a fresh cache per mode:
- before: MUSACODER_PLAIN_BUILDS=1, torch's loader as it is (the `.cu` with its own headers, plain nvcc);
- after: the builder's `.cu` levers (the light `.cu` first, nvcc's front ends side by side; docs/verifier.md), no
  precompiled header (MUSACODER_PCH=0), not the lightest `.cu` (MUSACODER_LIGHTEST=0): a host's very first build;
- pch: after, once the precompiled torch header for the bindings' flags exists (verifier/pch.py): one unmeasured
  verification first, then a wait for its PCH, in a fresh PCH folder;
- lightest: as shipped, pch with the lightest `.cu` (musacoder's own lighter torch/types.h where it fits).
Prints per kernel and mode the wall time from submission to verdict, the compile stage, the verdict and which build
the library is (light / own, +pch); for `after`, the median seconds of each nvcc step of the `.cu` builds. Exits
non-zero when a verdict is not the catalog's or a mode fails. Needs no network (Python 3.12, torch + CUDA, nvcc).

    python scripts/cold_build.py                                   # all four modes, 3 kernels, once each
    python scripts/cold_build.py --modes pch --kernels honest_relu,honest_softmax --repeats 2
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
    # read by the compile worker the pool starts
    os.environ.pop("MUSACODER_PLAIN_BUILDS", None)
    os.environ.pop("MUSACODER_PCH", None)
    os.environ["MUSACODER_LIGHTEST"] = "0"
    if mode == "before":
        os.environ["MUSACODER_PLAIN_BUILDS"] = "1"
    elif mode == "after":
        os.environ["MUSACODER_PCH"] = "0"
    elif mode == "lightest":
        os.environ.pop("MUSACODER_LIGHTEST")  # as shipped
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"cold-{mode}-") as cache:
        times = Path(cache) / "nvcc-steps.jsonl"
        os.environ["MUSACODER_NVCC_TIMES"] = str(times)
        os.environ["MUSACODER_PCH_DIR"] = str(Path(cache) / "pch")
        cfg = VerifyConfig(backend="cuda", cache_dir=cache)
        with LocalPool(cfg, compile_workers=1, devices=1) as pool:
            list(pool.verify_many([(builtin_task("level1/19_ReLU"), WARMUP)]))
            if mode in ("pch", "lightest"):
                list(pool.verify_many([(builtin_task(examples[0].task), fresh(examples[0].code))]))
                deadline = time.monotonic() + 300
                while not _pch_made(Path(cache) / "pch") and time.monotonic() < deadline:
                    time.sleep(1)
                print(f"pch: made = {_pch_made(Path(cache) / 'pch')}", file=sys.stderr, flush=True)
                times.unlink(missing_ok=True)  # the priming build's nvcc steps are not the measured ones
            time.sleep(10)  # the compile worker's own start (its subjects' zygote) is not the candidate's
            for r in range(repeats):
                for e in examples:
                    t0 = time.perf_counter()
                    [(_, v)] = list(pool.verify_many([(builtin_task(e.task), fresh(e.code))]))
                    wall = time.perf_counter() - t0
                    keys = [b.get("key") for b in v.details.get("builds", []) if b.get("key")]
                    light = [(Path(cache) / "ext" / k / "light").exists() for k in keys]
                    ninja = [(Path(cache) / "ext" / k / "build.ninja").read_text() for k in keys
                             if (Path(cache) / "ext" / k / "build.ninja").exists()]
                    with_pch = any(str(Path(cache) / "pch") in n for n in ninja)
                    lightest = any("light_headers" in n for n in ninja)
                    rows.append({"mode": mode, "kernel": e.name, "repeat": r, "wall_s": wall,
                                 "compile_s": v.stage_seconds.get("compile", float("nan")), "status": v.status.value,
                                 "expected": e.accepted,
                                 "build": ("lightest" if lightest and all(light) and light else
                                           "light" if all(light) and light else "own") + ("+pch" if with_pch else ""),
                                 "reason": (v.reason or "")[:200]})
                    print(json.dumps(rows[-1], default=str), file=sys.stderr, flush=True)
        steps = [json.loads(line) for line in times.read_text().splitlines()] if times.exists() else []
    for row in rows:
        row["nvcc_steps"] = steps
    return rows


def _pch_made(folder: Path) -> bool:
    """A PCH is in the folder and none is still being made."""
    return any(folder.glob("*/torch/extension.h.gch")) and not any(folder.glob("*.lock"))


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
    ap.add_argument("--modes", default="before,after,pch,lightest")
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
    if not set(modes) <= {"before", "after", "pch", "lightest"}:
        print("error: --modes takes one or more of before, after, pch, lightest", file=sys.stderr)
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
    for m in ("after", "pch"):
        mine = [r for r in rows if r["mode"] == m]
        if mine and mine[0]["nvcc_steps"]:
            print(f"\n{m}: nvcc steps of the `.cu` builds (verifier/nvcc_overlap.py; the front ends side by side)\n")
            print(step_table(mine[0]["nvcc_steps"]))
    wrong = [r for r in rows if r["status"] not in r["expected"]]
    for r in wrong:
        print(f"error: {r['kernel']} ({r['mode']}): {r['status']}, expected {'/'.join(r['expected'])}: {r['reason']}",
              file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
