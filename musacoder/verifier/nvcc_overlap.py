"""nvcc with its two front ends side by side: `python -m musacoder.verifier.nvcc_overlap NVCC ARG...`.

nvcc compiles a `.cu` one step after the other: host preprocessor, cudafe++ (host front end), device preprocessor,
cicc (device front end), ptxas, fatbinary, host compiler. Against torch's headers each front end and the host compile
take about a third of the time (docs/benchmarks.md), and cicc waits for cudafe++ only to read the module id it writes:
a name made of a hash and the file's name, which cicc makes alike when asked to. So this runs the very commands nvcc
plans (`nvcc --dryrun`), each as soon as the commands that write the files it names have finished, the module id's
readers making their own; the host compile waits for all before it (it includes the stub and fatbinary by name). The
ids are compared at the end: different ones (never seen) mean the object is built again by nvcc alone. Output files are
those nvcc writes; the tools' messages are replayed in nvcc's order up to the first failing step, whose status is
returned, so a failed compile reads as nvcc's; steps after a failed one are stopped (nvcc would not have run them).
Anything else (no `-c`, a step this does not know, a fault here) is nvcc's own run. Each tool runs under the caller's
limits (the compile worker's memory cap), two at a time where nvcc ran one.

The builder puts this in torch's ninja file through PYTORCH_NVCC (CudaBackend.compiler_env). Imports no torch: it
runs once per `.cu`. MUSACODER_NVCC_TIMES=FILE appends each compile's step times (scripts/cold_build.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import string
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_OWN_FLAGS = {"--dryrun", "-dryrun", "--keep", "-keep", "--keep-dir", "-keep-dir", "--verbose", "-v", "--time",
              "-time", "--save-temps", "-save-temps"}  # they change what nvcc prints or leaves: nvcc's own run
_GEN_ID = "--gen_module_id_file"
_ID_FILE = "--module_id_file_name"


@dataclass
class Step:
    index: int
    argv: list[str]  # shell words, as nvcc --dryrun prints them
    tool: str
    files: set[str]  # intermediate files (in the keep directory) it names
    deps: set[int] = field(default_factory=set)
    id_copy: str = ""  # a module id reader made to write its own id here


def plan(nvcc: str, args: list[str], keep: Path) -> tuple[dict[str, str], list[Step]] | None:
    """nvcc's commands for `args` (the environment it sets for them, steps), or None when this is not a compile to
    run here."""
    if "-c" not in args or any(a.split("=")[0] in _OWN_FLAGS for a in args):
        return None
    dry = subprocess.run([nvcc, *args, "--dryrun", "--keep", "--keep-dir", str(keep)], capture_output=True,
                         text=True)
    if dry.returncode != 0:
        return None
    env, steps = {}, []
    for line in dry.stderr.splitlines():
        if not line.startswith("#$ "):
            return None
        line = line[3:].strip()
        if _ASSIGN.match(line):  # NAME=value lines: nvcc's environment for its tools (PATH, CICC_PATH, ...)
            name, _, value = line.partition("=")
            env[name] = " ".join(shlex.split(value))
            continue
        argv = [string.Template(w).safe_substitute({**os.environ, **env}) for w in shlex.split(line)]
        tool = os.path.basename(argv[0])
        files = set(re.findall(re.escape(str(keep)) + r"/[^\s,\"'=]+", line))
        steps.append(Step(len(steps), argv, tool, files))
    return (env, steps) if _overlap(steps) else None


def _overlap(steps: list[Step]) -> bool:
    """Dependencies by the files steps name, module id readers made independent of its writer; False for a plan
    whose shape is not the one this knows (one id writer, only nvcc's usual tools, the host compile last)."""
    host = {s.tool for s in steps if s.tool not in ("cudafe++", "cicc", "ptxas", "fatbinary")}
    writers = [s for s in steps if _GEN_ID in s.argv]
    if len(host) != 1 or len(writers) != 1 or "-c" not in steps[-1].argv or steps[-1].tool not in host:
        return False
    id_file = writers[0].argv[writers[0].argv.index(_ID_FILE) + 1]
    for s in steps:
        if s is not writers[0] and _ID_FILE in s.argv:
            if s.argv[s.argv.index(_ID_FILE) + 1] != id_file:
                return False
            s.id_copy = f"{id_file}.{s.index}"
            at = s.argv.index(_ID_FILE)
            s.argv[at:at + 2] = [_GEN_ID, _ID_FILE, s.id_copy]
            s.files = (s.files - {id_file}) | {s.id_copy}
    for s in steps:
        earlier = steps[:s.index]
        s.deps = {e.index for e in earlier} if s is steps[-1] else {e.index for e in earlier if e.files & s.files}
    return True


def run(env: dict[str, str], steps: list[Step], workers: int) -> tuple[int, list[tuple[bytes, bytes]], list[dict]]:
    """Run the steps as their dependencies allow. -> (status of the first failing step or 0, each run step's
    (stdout, stderr) up to that step, per-step times)."""
    env = {**os.environ, **env}
    results: dict[int, tuple[int, bytes, bytes, dict]] = {}
    limit = len(steps)  # no step after a failed one is started (nvcc would not have run it)
    pending = {s.index for s in steps}
    procs = _Procs()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        running = {}
        while True:
            for i in sorted(pending):
                s = steps[i]
                if i < limit and all(d in results and results[d][0] == 0 for d in s.deps):
                    pending.discard(i)
                    running[pool.submit(_run_step, env, s, procs)] = i
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                i = running.pop(f)
                results[i] = f.result()
                if results[i][0] != 0:
                    limit = min(limit, i)
                    procs.kill_after(limit)  # their work would be thrown away (the front end failed: cicc's)
    failed = [i for i, r in results.items() if r[0] != 0]
    last = min(failed) if failed else len(steps) - 1
    shown = [(results[i][1], results[i][2]) for i in range(last + 1)]
    return (results[min(failed)][0] if failed else 0), shown, [results[i][3] for i in sorted(results)]


_T0 = time.perf_counter()


class _Procs:
    """The running steps' processes, to stop those after a failed step."""

    def __init__(self):
        self.lock = threading.Lock()
        self.alive: dict[int, subprocess.Popen] = {}
        self.limit = float("inf")

    def kill_after(self, index: int) -> None:
        with self.lock:
            self.limit = min(self.limit, index)
            for i, p in self.alive.items():
                if i > index:  # os.kill, not Popen.kill: its poll would reap the child under wait4
                    os.kill(p.pid, signal.SIGKILL)


def _run_step(env: dict[str, str], s: Step, procs: _Procs) -> tuple[int, bytes, bytes, dict]:
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:  # files: no pipe to drain meanwhile
        with procs.lock:
            if s.index > procs.limit:  # a step before it failed meanwhile
                return -signal.SIGKILL, b"", b"", {"step": s.index, "tool": s.tool, "start_s": None}
            p = procs.alive[s.index] = subprocess.Popen(s.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                                        env=env)
        _, status, usage = os.wait4(p.pid, 0)
        with procs.lock:  # reaped: never signalled again
            del procs.alive[s.index]
            p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read(), err.read(), {
            "step": s.index, "tool": s.tool, "start_s": round(t0 - _T0, 3),
            "wall_s": round(time.perf_counter() - t0, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}


def main(argv: list[str]) -> int:
    nvcc, args = argv[0], argv[1:]
    with tempfile.TemporaryDirectory(prefix="nvcc-overlap-") as keep:
        try:
            planned = plan(nvcc, args, Path(keep))
            if planned is None:
                return subprocess.run([nvcc, *args]).returncode
            env, steps = planned
            status, shown, times = run(env, steps, workers=max(2, len(steps)))
            if status == 0 and len({Path(s.argv[s.argv.index(_ID_FILE) + 1]).read_bytes() for s in steps
                                     if _ID_FILE in s.argv}) != 1:
                return subprocess.run([nvcc, *args]).returncode  # the readers' ids are not the writer's: nvcc alone
        except Exception:  # a fault here must never read as the candidate's compile error: nvcc alone
            return subprocess.run([nvcc, *args]).returncode
        for out, err in shown:
            sys.stdout.buffer.write(out)
            sys.stderr.buffer.write(err)
        if os.environ.get("MUSACODER_NVCC_TIMES"):  # per-step times, for scripts/cold_build.py
            with open(os.environ["MUSACODER_NVCC_TIMES"], "a") as f:
                f.write(json.dumps({"source": args[args.index("-c") + 1], "status": status, "steps": times,
                                    "wall_s": round(time.perf_counter() - _T0, 3)}) + "\n")
        return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
