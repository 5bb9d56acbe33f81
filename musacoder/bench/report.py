"""report.md with the paper's table and per-level details, PNG plots, and a side-by-side comparison of two runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tabulate import tabulate

from musacoder.bench.metrics import by_sample, faster, outcome, task_mean
from musacoder.bench.store import Row


def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown (pipe) table of cells already formatted: no number parsing, no padding (one row a line, as
    written, so a row can be found in report.md as it reads)."""
    return tabulate(rows, header, tablefmt="pipe", disable_numparse=True, colalign=[None] * len(header))


def _blocks(m: dict) -> list[tuple[str, dict]]:
    return [("overall", m["overall"]), *m["levels"].items()]


def paper_table(m: dict) -> str:
    """The MusaCoder paper's columns, in percent: Pass@n, Avg@n, Faster Rate vs eager and vs torch.compile."""
    n = m["run"]["samples"]
    rows = [[name, pct(b["pass_at_k"].get(str(n))), pct(b["avg"], 2), pct(b["faster_rate_eager"]),
             pct(b["faster_rate_compile"])] for name, b in _blocks(m)]
    return _table(["", f"Pass@{n}", f"Avg@{n}", "Faster vs eager", "Faster vs compile"], rows)


def detail_table(m: dict) -> str:
    n = m["run"]["samples"]
    ps = list(m["overall"]["fast_p"])
    header = ["", "tasks", "samples", "Pass@1", f"Pass@{n}", f"Pass@{n} 95% CI", f"Avg@{n}", "compiled"] \
        + [f"fast_{p}" for p in ps] + ["geomean vs eager", "geomean vs compile"]
    rows = [[name, str(b["tasks"]), str(b["samples"]), pct(b["pass_at_k"].get("1")), pct(b["pass_at_k"].get(str(n))),
             _interval(b.get("pass_at_k_ci", {}).get(str(n))), pct(b["avg"], 2), pct(b["compile_rate"])]
            + [pct(b["fast_p"][p]) for p in ps]
            + [_x(b["geomean_speedup_eager"]), _x(b["geomean_speedup_compile"])] for name, b in _blocks(m)]
    return _table(header, rows)


def _interval(ci) -> str:
    """A Wilson interval over tasks (metrics.py), as percentages."""
    return f"{pct(ci[0])}-{pct(ci[1])}" if ci else "-"


def multi_turn_table(m: dict) -> str:
    turns = [str(t) for t in range(1, m["run"]["turns"] + 1)]
    rows = []
    for name, b in _blocks(m):
        mt = b["multi_turn"]
        rows.append([name, pct(mt["first_turn_accuracy"]), pct(mt["best_turn_accuracy"])]
                    + [str(mt["turns_to_success"].get(t, 0)) for t in turns + ["never"]])
    return _table(["", "first-turn accuracy", "best-turn accuracy"] + [f"solved at turn {t}" for t in turns]
                  + ["never solved"], rows)


def status_table(m: dict) -> str:
    blocks = _blocks(m)
    names = sorted({s for _, b in blocks for s in b["status"]})
    return _table(["status"] + [n for n, _ in blocks], [[s] + [str(b["status"].get(s, 0)) for _, b in blocks]
                                                       for s in names])


def _cell(text: str, n: int = 90) -> str:
    text = " ".join(str(text).split())  # one line, and no pipe to break the markdown table
    return (text[: n - 1] + "…" if len(text) > n else text).replace("|", "/")


def failure_table(m: dict) -> str:
    """Most frequent failure reasons (generation errors included), so a dead server is visible at once."""
    return _table(["count", "status", "reason"], [[str(n), st, _cell(why)] for n, st, why in m.get("failures", [])])


def task_table(m: dict, limit: int | None = None) -> str:
    """Per task: status counts, best speedup vs eager, first failing reason."""
    items = list(m.get("per_task", {}).items())[:limit]
    rows = [[t, ", ".join(f"{s} {n}" for s, n in d["status"].items()), _x(d["best_speedup"]),
             _cell(d["first_failure"] or "", 70)] for t, d in items]
    return _table(["task", "status", "best vs eager", "first failure"], rows)


def plot(out: Path, m: dict, rows: list[Row]) -> list[str]:
    """fast_p curves, per-level bars, status breakdown; returns the PNG names written."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    outcomes = [o for o in map(outcome, by_sample(rows)) if o]
    ps = [i / 20 for i in range(61)]
    fig, ax = plt.subplots(figsize=(6, 4))
    for attr, label in (("speedup_eager", "vs eager"), ("speedup_compile", "vs torch.compile")):
        ys = [task_mean(outcomes, lambda o, p=p, a=attr: faster(o.correct, getattr(o, a), p)) or 0.0 for p in ps]
        ax.plot(ps, [100 * y for y in ys], label=label)
    ax.set(xlabel="speedup threshold p", ylabel="fast_p (%)", ylim=(0, 100), title="fast_p: correct and faster than p")
    ax.legend()
    fig.savefig(out / "fast_p.png", dpi=120, bbox_inches="tight")
    plt.close(fig)

    n = m["run"]["samples"]
    levels = list(m["levels"].items())
    series = [(f"Pass@{n}", lambda b: b["pass_at_k"].get(str(n))), (f"Avg@{n}", lambda b: b["avg"]),
              ("Faster vs eager", lambda b: b["faster_rate_eager"])]
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / len(series)
    for j, (label, get) in enumerate(series):
        ax.bar([i + j * width for i in range(len(levels))], [100 * (get(b) or 0) for _, b in levels], width,
               label=label)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(levels))], [name for name, _ in levels])
    ax.set(ylabel="%", ylim=(0, 100), title="per level")
    ax.legend()
    fig.savefig(out / "levels.png", dpi=120, bbox_inches="tight")
    plt.close(fig)

    status = m["overall"]["status"]
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(status) + 1))
    ax.barh(list(status), list(status.values()))
    ax.set(xlabel="samples", title="status breakdown")
    fig.savefig(out / "status.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return ["fast_p.png", "levels.png", "status.png"]


def write_report(out: Path, m: dict, rows: list[Row]) -> None:
    r = m["run"]
    parts = [f"# Benchmark: {r['model']}", "",
             (f"{r['tasks']} tasks, {r['samples']} samples per task, temperature {r['temperature']}, "
             f"{r['turns']} turn(s), backend {r['backend']}, profile {r['profile']}, precision {r['precision']}, "
             f"timing {'on' if r['timing'] else 'off'}; Faster Rate threshold {m['threshold']}x."), ""]
    if m["unfinished"]:
        parts += [(f"**{m['unfinished']} samples are unfinished** (failed generation or missing steps): run the same "
                  "command again to finish them."), ""]
    parts += ["## Results (%)", "", paper_table(m), "", "## Details (%)", "", detail_table(m), ""]
    if r["turns"] > 1:
        parts += ["## Multi-turn", "", multi_turn_table(m), ""]
    parts += ["## Status breakdown (samples)", "", status_table(m), ""]
    if m.get("failures"):
        parts += ["## Failure reasons (steps)", "", failure_table(m), ""]
    if m.get("per_task"):
        parts += ["## Per task", "", task_table(m), ""]
    try:
        parts += ["## Plots", ""] + [f"![{p}]({p})" for p in plot(out, m, rows)] + [""]
    except ImportError:
        parts += ["(plots skipped: matplotlib is not installed)", ""]
    tok, sec = m["tokens"], m["seconds"]
    parts += [(f"Tokens: {tok['prompt']} prompt, {tok['completion']} completion; {m['truncated']} answers cut at "
              f"max_tokens. Summed over samples: {sec['generation']:.0f} s generating, {sec['verification']:.0f} s "
              "verifying."), ""]
    (out / "report.md").write_text("\n".join(parts))


def load_metrics(run_dir: str | Path) -> dict:
    path = Path(run_dir) / "metrics.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: finish the run with `musacoder bench run` first")
    return json.loads(path.read_text())


def within_noise(pa: float, na: int, pb: float, nb: int, z: float = 1.96, se_a: float | None = None,
                 se_b: float | None = None) -> bool:
    """True when B - A is inside the 95% interval of the difference. With each run's standard error over tasks
    (metrics.json's `se`: tasks are the independent units), that interval; without (older runs), a two-proportion
    normal approximation over `na` / `nb` units."""
    if se_a is not None and se_b is not None:
        se = math.sqrt(se_a ** 2 + se_b ** 2)
    elif not na or not nb:
        return True
    else:
        se = math.sqrt(pa * (1 - pa) / na + pb * (1 - pb) / nb)
    return abs(pb - pa) <= z * se if se > 0 else pb == pa


def _rate(block: dict, key: str) -> float | None:
    """A rate of a metrics.json block by its `se` key: pass@K, fast_P or the block's own key."""
    if key.startswith("pass@"):
        return block["pass_at_k"].get(key[5:])
    if key.startswith("fast_"):
        return block["fast_p"][key[5:]]
    return block[key]


def compare(run_a: str | Path, run_b: str | Path) -> str:
    """Markdown with two runs side by side (percent, B - A in points) for the overall and each shared level."""
    a, b = load_metrics(run_a), load_metrics(run_b)
    na, nb = a["run"]["samples"], b["run"]["samples"]
    ps = [p for p in a["overall"]["fast_p"] if p in b["overall"]["fast_p"]]
    n_label = str(na) if na == nb else "n"
    # (label, the rate's key in a block's `se`; {n}: the run's sample count)
    metrics = [("Pass@1", "pass@1"), (f"Pass@{n_label}", "pass@{n}"), (f"Avg@{n_label}", "avg"),
               ("Faster vs eager", "faster_rate_eager"), ("Faster vs compile", "faster_rate_compile"),
               ("compiled", "compile_rate")] + [(f"fast_{p}", f"fast_{p}") for p in ps]
    parts = [f"# {Path(run_a).name} vs {Path(run_b).name}", "",
             f"- A: `{a['run']['model']}` ({run_a}), n = {na}", f"- B: `{b['run']['model']}` ({run_b}), n = {nb}"]
    skip = {"model", "tasks"}
    diff = {k: (a["run"].get(k), v) for k, v in b["run"].items() if k not in skip and a["run"].get(k) != v}
    if diff:
        parts.append("- settings differ: " + ", ".join(f"{k} {x!r} vs {y!r}" for k, (x, y) in diff.items()))
    blocks = [("overall", a["overall"], b["overall"])] + \
        [(lv, a["levels"][lv], b["levels"][lv]) for lv in a["levels"] if lv in b["levels"]]
    for name, xa, xb in blocks:
        rows = []
        for label, key in metrics:
            ka, kb = key.format(n=na), key.format(n=nb)
            va, vb = _rate(xa, ka), _rate(xb, kb)
            delta = "-" if va is None or vb is None else f"{100 * (vb - va):+.1f}"
            noise = ""
            if va is not None and vb is not None and va != vb:
                quiet = within_noise(va, xa["tasks"], vb, xb["tasks"], se_a=xa.get("se", {}).get(ka),
                                     se_b=xb.get("se", {}).get(kb))
                noise = "within noise" if quiet else "beyond noise"
            rows.append([label, pct(va), pct(vb), delta, noise])
        rows.append(["geomean vs eager", _x(xa["geomean_speedup_eager"]), _x(xb["geomean_speedup_eager"]), "", ""])
        rows.append(["tasks / samples", f"{xa['tasks']} / {xa['samples']}", f"{xb['tasks']} / {xb['samples']}", "",
                     ""])
        parts += ["", f"## {name} (%)", "", _table(["metric", "A", "B", "B - A", "noise"], rows)]
    parts += ["", ("noise: whether B - A is inside the 95% interval of the difference, from each rate's standard error "
              "over tasks (a task's samples are not independent: the task is the unit).")]
    return "\n".join(parts) + "\n"
