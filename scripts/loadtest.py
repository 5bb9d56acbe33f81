"""Bounded load test of the reward service on loopback (cpu backend).

Starts `musacoder serve` as a subprocess, builds the honest ReLU kernel once (warm-up), then for --duration seconds
runs --clients closed-loop clients on instantly-judged candidates (unique format errors and illegal imports, plus
repeats answered by idempotency) and --kernel-clients clients on the real kernel (a unique Python comment each time:
a new job through the compile tier, whose build is a cache hit, and the device tier). Reports throughput, p50/p99
latency, each tier's busy fraction over the window (from /metrics), lost requests, and the server's RSS.

    .venv/bin/python scripts/loadtest.py --duration 180 --clients 32 --kernel-clients 2 --out loadtest.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from musacoder.service.client import AsyncVerifierClient  # noqa: E402
from musacoder.tasks import builtin_task  # noqa: E402

KERNEL = (ROOT / "musacoder/examples/cpu/honest_relu.py").read_text()
REPEATS = [f"I cannot write kernel #{i}." for i in range(8)]  # the same 8 answers again and again


def instant_candidate() -> tuple[str, str]:
    r, nonce = random.random(), secrets.token_hex(8)
    if r < 0.2:
        return "repeat", random.choice(REPEATS)
    if r < 0.6:
        return "illegal", f"```python\nimport subprocess  # {nonce}\nclass ModelNew:\n    pass\n```"
    return "format_error", f"Sorry, no kernel this time ({nonce})."


def rss_mb(pid: int) -> tuple[float, float]:
    """RSS of the process, and of its whole tree (the pool's worker processes), in MiB."""
    def rss(p):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def tree(p):  # children are listed per thread, and the pool starts workers from its threads
        kids = []
        for f in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                kids += f.read_text().split()
            except OSError:
                pass
        return [p] + [q for k in kids for q in tree(int(k))]
    return rss(pid), sum(rss(p) for p in tree(pid))


def scrape(url: str, token: str) -> dict:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else (xs or [0.0])[0]


async def load(url, token, task, clients, kernel_clients, duration) -> tuple[list, list]:
    done, errors = [], []
    deadline = time.monotonic() + duration

    async def worker(kernel: bool):
        while time.monotonic() < deadline:  # no new request after the deadline; the ones in flight finish
            kind, cand = ("kernel", f"{KERNEL}\n# variant {secrets.token_hex(8)}\n") if kernel else instant_candidate()
            t = time.monotonic()
            try:
                v = await client.verify(task, cand)
                done.append((kind, time.monotonic() - t, v.status.value))
            except Exception as e:  # a lost request: counted, reported
                errors.append((kind, repr(e)))

    async with AsyncVerifierClient(url, token=token, concurrency=clients + kernel_clients) as client:
        await asyncio.gather(*[worker(False) for _ in range(clients)], *[worker(True) for _ in range(kernel_clients)])
    return done, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=180)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--kernel-clients", type=int, default=2)
    ap.add_argument("--cache-dir", default="/tmp/musacoder-loadtest-cache", help="kept between runs: warm builds")
    ap.add_argument("--out", help="also write the figures here as JSON")
    args = ap.parse_args()

    token = secrets.token_hex(16)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    for f in Path(args.cache_dir).glob("service.sqlite*"):  # a fresh verdict store: every unique job really runs
        f.unlink()
    Path(args.cache_dir).mkdir(parents=True, exist_ok=True)
    log = open(Path(args.cache_dir) / "loadtest-server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "musacoder.cli", "serve", "--backend", "cpu", "--no-timing",
                               "--port", str(port), "--cache-dir", args.cache_dir, "--log-level", "warning"],
                              env={**os.environ, "MUSACODER_TOKEN": token, "PYTHONPATH": str(ROOT)},
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while not _ready(url):
            if server.poll() is not None or time.monotonic() - t0 > 180:
                sys.exit(f"the server did not become ready (see {log.name})")
            time.sleep(0.5)
        task = builtin_task("level1/19_ReLU")
        t = time.monotonic()
        warm = asyncio.run(_one(url, token, task, KERNEL))
        warmup_s = time.monotonic() - t
        print(f"ready in {t - t0:.1f}s; warm-up kernel {warm} in {warmup_s:.1f}s", flush=True)

        samples, stop = [], threading.Event()

        def sample():
            while not stop.wait(1.0):
                samples.append(rss_mb(server.pid))
        threading.Thread(target=sample, daemon=True).start()
        samples.append(rss_mb(server.pid))
        m0, w0 = scrape(url, token), time.monotonic()
        done, errors = asyncio.run(load(url, token, task, args.clients, args.kernel_clients, args.duration))
        m1, window = scrape(url, token), time.monotonic() - w0
        stop.set()
        samples.append(rss_mb(server.pid))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)

    report = {"duration_s": round(window, 1), "clients": args.clients, "kernel_clients": args.kernel_clients,
              "server_ready_s": round(t - t0, 1), "warmup_kernel_s": round(warmup_s, 1),
              "requests": len(done) + len(errors), "verdicts": len(done), "lost": len(errors),
              "errors": errors[:5], "throughput_per_s": round(len(done) / window, 1), "kinds": {}}
    for kind in ("format_error", "illegal", "repeat", "kernel"):
        lat = [d for k, d, _ in done if k == kind]
        statuses = sorted({s for k, _, s in done if k == kind})
        report["kinds"][kind] = {"n": len(lat), "per_s": round(len(lat) / window, 2), "statuses": statuses,
                                 "p50_ms": round(1000 * pct(lat, 50), 1), "p99_ms": round(1000 * pct(lat, 99), 1)}
    lat = [d for _, d, _ in done]
    report["all"] = {"p50_ms": round(1000 * pct(lat, 50), 1), "p99_ms": round(1000 * pct(lat, 99), 1)}
    for tier in ("compile", "device"):
        key = ("musacoder_tier_busy_seconds_total", (("tier", tier),))
        workers = m1[("musacoder_tier_workers", (("tier", tier),))]
        report[f"{tier}_busy_fraction"] = round((m1[key] - m0[key]) / (window * workers), 3)
    jobs = lambda m, e: m[("musacoder_pool_jobs_total", (("event", e),))]  # noqa: E731
    verdicts = sum(v for (n, _), v in m1.items() if n == "musacoder_verdicts_total")
    hits = m1[("musacoder_idempotent_hits_total", ())]
    report["server"] = {"pool_submitted": jobs(m1, "submitted"), "pool_completed": jobs(m1, "completed"),
                        "queue_length_at_end": m1[("musacoder_queue_length", ())],
                        "verdicts_total": verdicts, "idempotent_hits": hits,
                        # every verification the clients asked for (warm-up included) is one or the other
                        "accounted": verdicts + hits == len(done) + len(errors) + 1}
    server_rss, tree_rss = [s for s, _ in samples], [t for _, t in samples]
    report["rss_mb"] = {"server": {"start": round(server_rss[0]), "end": round(server_rss[-1]),
                                   "max": round(max(server_rss))},
                        "server_and_workers": {"start": round(tree_rss[0]), "end": round(tree_rss[-1]),
                                               "max": round(max(tree_rss))}, "samples": len(samples),
                        # ten points across the run, to tell a plateau from a slope
                        "server_series": [round(server_rss[i * (len(samples) - 1) // 9]) for i in range(10)]}
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


async def _one(url, token, task, candidate) -> str:
    async with AsyncVerifierClient(url, token=token) as client:
        return (await client.verify(task, candidate)).status.value


if __name__ == "__main__":
    main()
