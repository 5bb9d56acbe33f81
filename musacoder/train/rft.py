"""Diversity-preserving rejection fine-tuning data: `run_rft(RFTConfig.from_yaml(path))`.

Sampling and verification are the benchmark runner's (`run_bench`: n samples per task through a generation client,
the verifier's batch API, every verdict stored in SQLite as it arrives, so an interrupted run resumes where it
stopped). Then each task's passing candidates (correct and legal) are clustered by structure and written as one
pool: records sharing metadata "pool", each with its "cluster", from which SFT draws a target every epoch.
`best.jsonl` holds the best-only alternative (one answer per task), and the report compares the two.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

from musacoder.bench.clients import Client, make_client
from musacoder.bench.runner import BenchConfig, run_bench
from musacoder.bench.store import Row, Store
from musacoder.config import AtLeast1, NonNegative, VerifyConfig
from musacoder.data.diversity import ClusterSettings, cluster, mean_pairwise_distance
from musacoder.data.records import Record, write_records
from musacoder.settings import ConfigPath, Field, Settings
from musacoder.tasks import Task
from musacoder.tasks.select import select_tasks
from musacoder.train.data import draw


@dataclass
class RFTVerifyConfig(VerifyConfig):
    """RFT's `verify:`. Timing is off unless it says otherwise: RFT keeps correct and legal candidates, whatever their
    speed; with timing on, the best-only baseline picks the highest reward (the fastest) instead of the first pass."""

    timing_enabled: bool = False


@dataclass
class RFTConfig(Settings):
    model: Annotated[str, ConfigPath("spec")] = ""  # generation client: hf:PATH | openai:MODEL[@URL] | replay:PATH
    output_dir: Annotated[str, ConfigPath()] = "runs/rft"
    tasks: Annotated[str | None, ConfigPath()] = None  # task file or directory; None: the shipped tasks
    # the same selection as the command line's --levels/--ids/--names: lists, or comma-separated strings
    levels: list[int] | str | None = None
    ids: list[int] | str | None = None
    names: list[str] | str | None = None  # substring of a name, or a key such as "level1/19_ReLU"
    samples: AtLeast1 = 8  # candidates per task
    temperature: NonNegative = 0.9  # RFT's sampling settings were not published; these are the paper's RL ones
    top_p: Annotated[float, Field(gt=0, le=1)] = 0.95
    max_tokens: AtLeast1 = 32768
    backend: str = "auto"  # prompt style and verifier backend: auto | cpu | cuda | triton
    one_shot: bool = True
    seed: int = 0  # sampling seeds and the draw preview
    concurrency: AtLeast1 = 16  # openai: requests in flight
    batch_size: AtLeast1 = 8  # hf: sequences generated together
    verify: RFTVerifyConfig = field(default_factory=RFTVerifyConfig)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    preview_epochs: AtLeast1 = 3  # epochs of pool draws simulated for the diversity comparison
    pool_draw: str = "cluster"  # as SFT's pool_draw, for the preview

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.cluster, dict):
            self.cluster = ClusterSettings(**self.cluster)
        if isinstance(self.verify, dict):  # built in Python from a mapping
            self.verify = RFTVerifyConfig.from_dict(self.verify, "verify.")
        if not self.model:
            raise ValueError("`model` (a generation client spec: hf:PATH, openai:MODEL[@URL], replay:PATH) is needed")

    def to_dict(self) -> dict:
        return {**super().to_dict(), "verify": self.verify.to_dict()}  # VerifyConfig's own: cache_dir a string



def _tasks(cfg: RFTConfig) -> list[Task]:
    return select_tasks(cfg.tasks, cfg.levels, cfg.ids, cfg.names)


def _record(row: Row, cluster_id: int, model_id: str) -> Record:
    v = row.verdict
    return Record(messages=row.messages + [{"role": "assistant", "content": row.raw}], kind="generation",
                  task=row.task, metadata={"pool": row.task, "cluster": cluster_id, "sample": row.sample,
                                           "reward": v["reward"], "speedup_eager": v.get("speedup_eager"),
                                           "source": "rft", "model": model_id})


def _best(rows: list[Row]) -> Row:
    return max(rows, key=lambda r: (r.verdict["reward"], -r.sample))


def compare_diversity(pools: dict[str, list[Record]], epochs: int, seed: int, by_cluster: bool) -> dict:
    """Pooled data against best-only selection, over the tasks with a pool: clusters and distinct targets a model
    is trained on across `epochs` epochs, and the mean pairwise Jaccard distance of the targets of a task."""
    def code(r: Record) -> str:
        return r.messages[-1]["content"]

    drawn_targets = drawn_clusters = 0
    dist_pool, dist_drawn = [], []
    for task, pool in pools.items():
        clusters = [r.metadata["cluster"] for r in pool]
        picks = [draw(clusters, random.Random(f"{seed}|{e}|{task}"), by_cluster) for e in range(epochs)]
        drawn_targets += len(set(picks))
        drawn_clusters += len({clusters[k] for k in picks})
        dist_pool.append(mean_pairwise_distance([code(r) for r in pool]))
        dist_drawn.append(mean_pairwise_distance([code(pool[k]) for k in picks]))
    n = max(len(pools), 1)
    return {
        "tasks": len(pools), "epochs": epochs,
        "pooled": {"targets": sum(map(len, pools.values())),
                   "clusters": sum(len({r.metadata["cluster"] for r in p}) for p in pools.values()),
                   "mean_pairwise_distance": sum(dist_pool) / n,
                   "distinct_targets_trained": drawn_targets, "distinct_clusters_trained": drawn_clusters,
                   "mean_pairwise_distance_trained": sum(dist_drawn) / n},
        "best_only": {"targets": len(pools), "clusters": len(pools), "mean_pairwise_distance": 0.0,
                      "distinct_targets_trained": len(pools), "distinct_clusters_trained": len(pools),
                      "mean_pairwise_distance_trained": 0.0},
    }


def _markdown(report: dict) -> str:
    d = report["diversity"]
    lines = [f"# RFT: {report['model']}", "",
             f"{report['tasks_with_pass']}/{report['tasks']} tasks with at least one pass; "
             f"{report['passed']}/{report['samples']} samples passed; unfinished samples: {report['unfinished']}.", "",
             "| task | samples | passed | pool | clusters | cluster sizes | statuses |",
             "|---|---:|---:|---:|---:|---|---|"]
    for t in report["per_task"]:
        lines.append(f"| {t['task']} | {t['samples']} | {t['passed']} | {t['pool']} | {t['clusters']} | "
                     f"{t['cluster_sizes']} | {', '.join(f'{k} {v}' for k, v in t['statuses'].items())} |")
    lines += ["", f"Diversity over the {d['tasks']} tasks with a pool, {d['epochs']} epochs of draws:", "",
              "| selection | targets | clusters | mean pairwise distance | distinct targets trained | "
              "distinct clusters trained | mean pairwise distance trained |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in ("pooled", "best_only"):
        s = d[name]
        lines.append(f"| {name} | {s['targets']} | {s['clusters']} | {s['mean_pairwise_distance']:.3f} | "
                     f"{s['distinct_targets_trained']} | {s['distinct_clusters_trained']} | "
                     f"{s['mean_pairwise_distance_trained']:.3f} |")
    return "\n".join(lines) + "\n"


def run_rft(cfg: RFTConfig, client: Client | None = None, console=None) -> dict:
    """Sample, verify, cluster and write the RFT data into cfg.output_dir (resuming what is there); return the
    report also written to `rft_report.json` / `.md`. Files: rft.jsonl (the pools), best.jsonl (best-only),
    samples/samples.sqlite (every sample and verdict)."""
    out = Path(cfg.output_dir)
    tasks = _tasks(cfg)
    client = client or make_client(cfg.model, cfg.concurrency, cfg.batch_size)
    bench = BenchConfig(samples=cfg.samples, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens,
                        turns=1, backend=cfg.backend, one_shot=cfg.one_shot, seed=cfg.seed)
    metrics = run_bench(tasks, client, out / "samples", bench, verify=cfg.verify, console=console)

    store = Store(out / "samples" / "samples.sqlite")
    try:
        rows = [r for r in store.rows() if r.turn == 1 and r.sample < cfg.samples]
    finally:
        store.close()
    pools: dict[str, list[Record]] = {}
    best: list[Record] = []
    per_task = []
    for task in tasks:
        mine = [r for r in rows if r.task == task.key]
        ok = [r for r in mine if r.passed and r.code]
        ids = cluster([r.code for r in ok], cfg.cluster) if ok else []
        if ok:
            pools[task.key] = [_record(r, c, client.model_id) for r, c in zip(ok, ids)]
            b = _best(ok)
            best.append(pools[task.key][ok.index(b)])
        per_task.append({"task": task.key, "samples": len(mine), "passed": len(ok), "pool": len(ok),
                         "clusters": len(set(ids)), "cluster_sizes": sorted(Counter(ids).values(), reverse=True),
                         "statuses": dict(Counter(r.status for r in mine).most_common())})
    write_records(out / "rft.jsonl", (r for pool in pools.values() for r in pool))
    write_records(out / "best.jsonl", ({**r.to_dict(), "metadata": {k: v for k, v in r.metadata.items()
                                                                     if k != "pool"}} for r in best))
    report = {"model": client.model_id, "tasks": len(tasks), "tasks_with_pass": len(pools),
              "samples": sum(t["samples"] for t in per_task), "passed": sum(t["passed"] for t in per_task),
              "unfinished": metrics["unfinished"], "pass_at_k": metrics["overall"]["pass_at_k"],
              "cluster": asdict(cfg.cluster), "per_task": per_task,
              "diversity": compare_diversity(pools, cfg.preview_epochs, cfg.seed, cfg.pool_draw == "cluster")}
    (out / "rft_report.json").write_text(json.dumps(report, indent=2))
    (out / "rft_report.md").write_text(_markdown(report))
    return report
