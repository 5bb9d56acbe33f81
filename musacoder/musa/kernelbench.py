"""`musacoder port kernelbench SRC OUT`: a KernelBench tree (level dirs of .py tasks) or JSONL in the MUSA variant the
MusaCoder paper evaluates on. Each task keeps its structure; its device code moves to MUSA through the project's
translator (`.cuda()` -> `.musa()`, `device="cuda"` -> `"musa"`, `torch.cuda.*` -> `torch.musa.*`), with
`import torch_musa` added after the torch import where anything changed. Tasks that need no change are kept as they
are and counted as such.

No MUSA device is needed to re-verify a task: its MUSA text must load (the task loader accepts it), translate back
to the original exactly, and use nothing without a MUSA counterpart; then its reference runs twice on the device at
hand, as the original and as the round-tripped text, on equal seeds, and the outputs must be equal. Where no CUDA GPU
exists, the CUDA device references of both are pointed at the cpu first (`retarget`); a task too big for the size
budget runs at a smaller size scale (`scale_task`), recorded per task. References run in a worker process, so a task
that hangs or runs out of memory is dropped with its reason instead of stopping the port.
"""

from __future__ import annotations

import ast
import io
import json
import multiprocessing
import operator
import os
import re
import tempfile
import time
import tokenize
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from musacoder.musa.translate import C2M, M2C, Result, translate_python
from musacoder.pyast import parse
from musacoder.tasks.model import Task, TaskLoadError

# The torch.musa API torch_musa documents (torch_musa/core/device.py, stream.py, random.py, memory.py): a
# `torch.cuda.X` outside it is taken as CUDA-only, since translating it would name something torch_musa lacks.
TORCH_MUSA_API = frozenset({
    "is_available", "device_count", "current_device", "set_device", "synchronize", "Event", "Stream",
    "current_stream", "stream", "manual_seed", "manual_seed_all", "get_rng_state", "set_rng_state",
    "memory_allocated", "max_memory_allocated", "empty_cache", "mem_get_info", "get_device_name",
    "get_device_capability", "get_device_properties", "get_arch_list", "is_bf16_supported"})
CUDA_ONLY_PACKAGES = frozenset({"cupy", "pycuda", "cuda", "nvidia", "apex", "flash_attn", "tensorrt"})
NO_COUNTERPART_RULES = frozenset({"ptx", "nvrtc"})  # portability rules whose construct MUSA lacks outright
SCALES = (1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625)
IMPORT_LINE = "import torch_musa"
CONVERTED, UNCHANGED, DROPPED = "converted", "unchanged", "dropped"


def _imports_torch_musa(tree: ast.Module) -> bool:
    for n in tree.body:
        names = [a.name for a in n.names] if isinstance(n, ast.Import) else \
            [n.module or ""] if isinstance(n, ast.ImportFrom) else []
        if any(x.split(".")[0] == "torch_musa" for x in names):
            return True
    return False


def _insert_import(text: str) -> str:
    """`import torch_musa` after the first top-level torch import (after `from __future__` imports if none)."""
    tree = parse(text)
    if _imports_torch_musa(tree):
        return text
    after = 0
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and n.module == "__future__":
            after = n.end_lineno
        elif (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "torch" for a in n.names)) or \
                (isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").split(".")[0] == "torch"):
            after = n.end_lineno
            break
    lines = text.splitlines(keepends=True)
    return "".join(lines[:after] + [IMPORT_LINE + "\n"] + lines[after:])


def _drop_import(text: str) -> str:
    """The text without the `import torch_musa` line `to_musa` adds (the first such top-level line, exactly)."""
    lines = text.splitlines(keepends=True)
    for n in parse(text).body:
        if isinstance(n, ast.Import) and n.lineno == n.end_lineno and lines[n.lineno - 1].rstrip("\r\n") == IMPORT_LINE:
            return "".join(lines[:n.lineno - 1] + lines[n.lineno:])
    return text


def to_musa(code: str) -> Result:
    """A task's MUSA text: the translator's c2m, plus `import torch_musa` where anything changed."""
    warnings: list[str] = []
    text = translate_python(code, C2M, warnings)
    return Result(_insert_import(text) if text != code else text, warnings)


def to_cuda(code: str) -> Result:
    """The inverse of `to_musa`: the added import dropped, then m2c."""
    warnings: list[str] = []
    return Result(translate_python(_drop_import(code), M2C, warnings), warnings)


def _torch_musa_lacks(dotted: str) -> list[str]:
    """The member of torch.musa or torch.backends that a dotted name reaches, when torch_musa lacks it."""
    parts = dotted.split(".")
    if parts[:2] == ["torch", "musa"] and len(parts) > 2 and parts[2] not in TORCH_MUSA_API:
        return [f"torch.cuda.{parts[2]} (torch.musa has no {parts[2]})"]
    if parts[:2] == ["torch", "backends"] and len(parts) > 2 and parts[2] in ("musa", "cudnn"):
        return [f"torch.backends.{'cuda' if parts[2] == 'musa' else 'cudnn'} (no torch_musa counterpart)"]
    return []


def _cuda_package(name: str) -> list[str]:
    return [f"imports {name} (CUDA-only package)"] if name.split(".")[0] in CUDA_ONLY_PACKAGES else []


def _imports_lacking(node: ast.Import | ast.ImportFrom) -> list[str]:
    """What an import brings in without a MUSA counterpart: torch.musa members, CUDA-only packages."""
    if isinstance(node, ast.Import):
        return [x for a in node.names for x in (*_torch_musa_lacks(a.name), *_cuda_package(a.name))]
    if not node.module or node.level:
        return []
    return [*(x for a in node.names for x in _torch_musa_lacks(f"{node.module}.{a.name}")),
            *_cuda_package(node.module)]


def _cuda_literal(node: ast.AST, docstrings: set[int]) -> list[str]:
    """A CUDA device f-string, or a CUDA environment variable's name (outside docstrings)."""
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
            and re.match(r"cuda\b", str(node.values[0].value)):
        return [f"a CUDA device f-string at line {node.lineno}"]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
            and re.fullmatch(r"CUDA_\w+", node.value):
        return [f"{node.value!r} (a CUDA environment variable)"]
    return []


def cuda_only(musa: str) -> list[str]:
    """What the MUSA text still uses that has no MUSA counterpart (empty: nothing)."""
    from musacoder.musa.portability import check
    from musacoder.verifier.static import dotted_name

    tree = parse(musa)
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            found += _torch_musa_lacks(dotted_name(node) or "")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found += _imports_lacking(node)
        else:
            found += _cuda_literal(node, docstrings)
    found += [f"line {f.line}: {f.reason}" for f in check(musa) if f.rule in NO_COUNTERPART_RULES]
    return list(dict.fromkeys(found))  # each once, in the order found


_DEVICE_LITERAL = re.compile(r"(?s)([rbuRBU]*)(['\"])cuda(?::\d+)?\2")


def retarget(code: str, device: str) -> str:
    """A CUDA task's device references pointed at `device` (cpu, or meta to estimate its size), so its reference
    runs where no CUDA GPU is: `x.cuda()` -> `x.to("cpu")`, `torch.cuda.X` -> `torch.cpu.X`, `"cuda:0"` -> `"cpu"`,
    `t.is_cuda` -> `t.is_cpu`. Unchanged for cuda."""
    if device == "cuda":
        return code
    lines = code.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    toks = [t for t in tokenize.generate_tokens(io.StringIO(code).readline)
            if t.type not in (tokenize.NL, tokenize.COMMENT)]
    edits: list[tuple[int, int, str]] = []
    for i, tok in enumerate(toks):
        a, b = starts[tok.start[0] - 1] + tok.start[1], starts[tok.end[0] - 1] + tok.end[1]
        after_dot = i > 0 and toks[i - 1].string == "."
        if tok.type == tokenize.NAME and tok.string == "cuda" and after_dot:
            if i > 1 and toks[i - 2].string == "torch":
                edits.append((a, b, "cpu"))  # torch.cpu mirrors torch.cuda's synchronize, streams, events
            elif i + 1 < len(toks) and toks[i + 1].string == "(":
                empty = i + 2 < len(toks) and toks[i + 2].string == ")"
                edits.append((a, starts[toks[i + 1].end[0] - 1] + toks[i + 1].end[1],
                              f'to("{device}"' + ("" if empty else ", ")))
        elif tok.type == tokenize.NAME and tok.string == "is_cuda" and after_dot:
            edits.append((a, b, f"is_{device}"))
        elif tok.type == tokenize.STRING and _DEVICE_LITERAL.fullmatch(tok.string):
            m = _DEVICE_LITERAL.fullmatch(tok.string)
            edits.append((a, b, f"{m.group(1)}{m.group(2)}{device}{m.group(2)}"))
    out, last = [], 0
    for a, b, new in edits:
        out += [code[last:a], new]
        last = b
    return "".join(out) + code[last:]


# --- reference runs, in a worker process -------------------------------------------------------------------------

_FOLD = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
         ast.Pow: operator.pow, ast.LShift: operator.lshift}


def _int_value(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _FOLD:
        a, b = _int_value(node.left), _int_value(node.right)
        if a is not None and b is not None and not (isinstance(node.op, ast.FloorDiv) and b == 0) \
                and not (isinstance(node.op, (ast.Pow, ast.LShift)) and not 0 <= b <= 64):
            return _FOLD[type(node.op)](a, b)
    return None


def fold_sizes(code: str) -> str:
    """Module-level size constants written as arithmetic (`N = 2048 * 2`, KernelBench's way) as literals, which is
    what `scale_task` scales."""
    tree = parse(code)
    changed = False
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            elts = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            values = [_int_value(e) for e in elts]
            if None not in values and any(isinstance(e, ast.BinOp) for e in elts):
                consts = [ast.Constant(v) for v in values]
                node.value = ast.Tuple(consts, ast.Load()) if isinstance(node.value, ast.Tuple) else consts[0]
                changed = True
    return ast.unparse(tree) if changed else code


def runnable(code: str, name: str, device: str) -> Task:
    """The reference as it runs on `device`: retargeted, sizes folded."""
    return Task(name=name, code=fold_sizes(retarget(code, device)))


def _estimate(task: Task) -> int | None:
    from musacoder.tasks.select import estimate_bytes

    try:
        return estimate_bytes(task)[1]
    except Exception:  # noqa: BLE001 - a task the meta device cannot build (.item(), imports): the real run decides
        return None


def pick_scale(code: str, name: str, budget: int) -> tuple[float, dict] | str:
    """The largest size scale at which the task's estimated peak memory fits `budget` bytes and the constants it
    changes; or why it cannot run within the budget."""
    from musacoder.tasks.select import scale_task

    meta = runnable(code, name, "meta")
    need = None
    for factor in SCALES:
        try:
            scaled = scale_task(meta, factor)
        except TaskLoadError:  # no size constants
            need = _estimate(meta)
            if need is not None and need > budget:
                return (f"too big for the size budget: about {need / 2**20:.0f} MiB at its own size (budget "
                        f"{budget / 2**20:.0f} MiB) and no module-level size constants to scale")
            return 1.0, {}
        need = _estimate(scaled)
        if need is None or need <= budget:
            return factor, scaled.metadata.get("scaled_constants", {})
    return (f"too big for the size budget: about {need / 2**20:.0f} MiB even at size scale {SCALES[-1]:g} (budget "
            f"{budget / 2**20:.0f} MiB)")


def _outputs(task: Task, device: str, tmp: Path, seed: int = 0):
    import torch

    from musacoder.verifier.inputs import Shape, init_inputs, load_module, make_inputs

    module = load_module(task.code, "kb_reference", tmp)
    torch.manual_seed(seed)
    model = module.Model(*init_inputs(module, Shape()))
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
    inputs = make_inputs(module, Shape(), seed, torch.device(device), "fp32")
    torch.manual_seed(seed)  # a forward that draws random numbers draws the same ones in both runs
    with torch.no_grad():
        return model(*inputs)


def check_reference(original: str, back: str, name: str, device: str, budget: int) -> dict:
    """Run the original and the round-tripped reference on `device` at one size scale; equal outputs or why not."""
    import torch

    from musacoder.tasks.select import scale_task

    picked = pick_scale(original, name, budget)
    if isinstance(picked, str):
        return {"error": picked}
    factor, constants = picked
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        outs = []
        for code in (original, back):
            run = scale_task(runnable(code, name, device), factor)
            try:
                outs.append(_outputs(run, device, Path(tmp)))
            except Exception as e:  # noqa: BLE001 - the task's own failure, reported with the task
                at = f" (size scale {factor:g})" if factor != 1.0 else ""
                return {"error": f"reference fails on {device}{at}: {type(e).__name__}: {str(e)[:300]}",
                        "size_scale": factor, "scaled_constants": constants}
    result = {"size_scale": factor, "scaled_constants": constants, "seconds": round(time.perf_counter() - started, 3)}
    try:
        torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0, equal_nan=True)
    except (AssertionError, TypeError, ValueError) as e:
        result["error"] = "reference differs: " + " ".join(str(e).split())[:300]
    return result


def _serve(conn, device: str, mem_gb: float):
    """Worker loop: one reference check per request until None. Its stdout/stderr are silenced (task prints and
    library warnings would tear the progress bar); results and errors go back through the pipe."""
    if mem_gb > 0 and device == "cpu":  # a task bigger than its estimate fails inside, not the machine
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (int(mem_gb * 2**30), int(mem_gb * 2**30)))
    import torch  # noqa: F401 - imported before the first task's clock starts

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        try:
            conn.send(check_reference(**job, device=device))
        except Exception as e:  # noqa: BLE001 - e.g. an unpicklable output; the task is dropped, the worker lives on
            conn.send({"error": f"reference check failed: {type(e).__name__}: {str(e)[:300]}"})


class ReferenceRunner:
    """A spawned worker (fresh torch, no forked CUDA or OpenMP state) that runs reference checks with a time limit;
    a worker that hangs or dies is replaced and the task is dropped with the reason."""

    def __init__(self, device: str, timeout: float, mem_gb: float = 0.0):
        self.device, self.timeout, self.mem_gb = device, timeout, mem_gb
        self._ctx = multiprocessing.get_context("spawn")
        self._proc = None

    def _start(self):
        self._conn, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child, self.device, self.mem_gb), daemon=True)
        self._proc.start()
        child.close()
        self._conn.recv()  # "ready": the time limit counts the task, not the worker's start

    def check(self, **job) -> dict:
        if self._proc is None or not self._proc.is_alive():
            try:
                self._start()
            except EOFError:
                self._proc = None
                return {"error": "reference worker did not start (python -c 'import torch' works here?)"}
        self._conn.send(job)
        if not self._conn.poll(self.timeout):
            self.close(kill=True)
            return {"error": f"reference timed out after {self.timeout:g} s on {self.device}"}
        try:
            return self._conn.recv()
        except EOFError:  # the worker died mid-task
            self._proc.join(5)
            code = self._proc.exitcode
            self._proc = None
            why = "killed (out of memory?)" if code is not None and code < 0 else f"exit code {code}"
            return {"error": f"reference worker died: {why}"}

    def close(self, kill: bool = False):
        if self._proc is None:
            return
        if not kill and self._proc.is_alive():
            self._conn.send(None)
            self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._proc = None


# --- the port ----------------------------------------------------------------------------------------------------

@dataclass
class Entry:
    key: str
    source: str
    level: int | None = None
    status: str = DROPPED
    reason: str = ""
    size_scale: float | None = None
    scaled_constants: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    seconds: float | None = None


@dataclass
class _Item:
    """One task of the input: where it came from, and how to write its MUSA text back in the input's form."""

    entry: Entry
    task: Task | None = None
    record: dict | None = None  # JSONL: the record, written back with its code replaced
    relpath: Path | None = None  # tree: the file's path under SRC and OUT


def _read_tree(src: Path) -> list[_Item]:
    from musacoder.tasks.loaders import _LEVEL_RE, load_tasks

    items = []
    for path in sorted(p for p in src.rglob("*.py") if not p.name.startswith("_")):
        rel = path.relative_to(src)
        try:
            (task,) = load_tasks(path)
        except TaskLoadError as e:
            level = _LEVEL_RE.match(rel.parent.name)
            items.append(_Item(Entry(rel.with_suffix("").as_posix(), str(path), int(level.group(1)) if level else None,
                                     reason=f"does not load: {e}"), relpath=rel))
            continue
        items.append(_Item(Entry(task.key, str(path), task.level), task, relpath=rel))
    return items


def _read_jsonl(src: Path) -> list[_Item]:
    from musacoder.tasks.loaders import load_tasks

    items = []
    for n, line in enumerate(src.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where, record = f"{src}:{n}", None
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise TaskLoadError("a record must be a JSON object")
            (task,) = load_tasks([record])
        except (json.JSONDecodeError, TaskLoadError) as e:
            fields = record if isinstance(record, dict) else {}
            level = fields.get("level") if isinstance(fields.get("level"), int) else None
            why = str(e).replace(" (list#0)", "")  # the loader names the one-record list it was given
            items.append(_Item(Entry(str(fields.get("name") or f"line{n}"), where, level,
                                     reason=f"does not load: {why}")))
            continue
        items.append(_Item(Entry(task.key, where, task.level), task, record=record))
    return items


def read_source(src: Path) -> tuple[str, list[_Item]]:
    """('tree' | 'jsonl', the items); TaskLoadError when SRC is neither a directory nor a .jsonl file."""
    if not src.exists():
        raise TaskLoadError(f"{src}: no such file or directory")
    if src.is_dir():
        items = _read_tree(src)
        if not items:
            raise TaskLoadError(f"{src}: no .py tasks under it (expected a KernelBench tree: level1/19_ReLU.py ...)")
        return "tree", items
    if src.suffix in (".jsonl", ".json"):
        try:
            return "jsonl", _read_jsonl(src)
        except UnicodeDecodeError as e:
            raise TaskLoadError(f"{src}: not a text file ({e.reason})") from e
    raise TaskLoadError(f"{src}: neither a KernelBench tree (a directory of level dirs) nor a .jsonl file")


def port_task(task: Task, entry: Entry, runner: ReferenceRunner | None, budget: int) -> str | None:
    """Fill `entry` for one task; the MUSA text to write, or None when the task is dropped."""
    from musacoder.tasks.loaders import load_tasks

    musa = to_musa(task.code)
    entry.warnings = list(musa.warnings)
    changed = musa.text != task.code
    try:
        load_tasks([{"name": task.name, "level": task.level, "problem_id": task.problem_id, "code": musa.text}])
    except TaskLoadError as e:
        entry.reason = f"MUSA text does not load: {e}"
        return None
    missing = cuda_only(musa.text)
    if missing:
        entry.reason = "CUDA-only API, no MUSA counterpart: " + "; ".join(missing)
        return None
    back = to_cuda(musa.text).text
    if back != task.code:
        n = next(i for i, (a, b) in enumerate(zip(back.splitlines() + [""], task.code.splitlines() + [""]), 1)
                 if a != b)
        entry.reason = f"round trip differs from the original: first at line {n}"
        return None
    if runner is not None:
        res = runner.check(original=task.code, back=back, name=task.name, budget=budget)
        entry.size_scale, entry.scaled_constants = res.get("size_scale"), res.get("scaled_constants", {})
        entry.seconds = res.get("seconds")
        if "error" in res:
            entry.reason = res["error"]
            return None
    entry.status = CONVERTED if changed else UNCHANGED
    return musa.text


def reason_kind(reason: str) -> str:
    """The reason without its particulars, for counting: 'reference fails on cpu', 'CUDA-only API, ...'."""
    return re.sub(r" \(.*?\)", "", reason.split(":")[0])


def summarize(entries: list[Entry]) -> dict:
    counts = Counter(e.status for e in entries)
    levels: dict[str, Counter] = {}
    for e in entries:
        levels.setdefault(str(e.level) if e.level is not None else "none", Counter())[e.status] += 1
    return {"counts": {s: counts.get(s, 0) for s in (CONVERTED, UNCHANGED, DROPPED)} | {"total": len(entries)},
            "levels": {k: {s: c.get(s, 0) for s in (CONVERTED, UNCHANGED, DROPPED)} for k, c in sorted(levels.items())},
            "reasons": dict(Counter(reason_kind(e.reason) for e in entries if e.status == DROPPED).most_common())}


def render_markdown(report: dict) -> str:
    c = report["counts"]
    lines = [f"# KernelBench -> MUSA port of `{report['source']}`", "",
             f"{c['total']} tasks: {c['converted']} converted, {c['unchanged']} unchanged (no CUDA device code), "
             f"{c['dropped']} dropped, in {report['seconds']:.0f} s.", "",
             "Each kept task loads, translates back (m2c) to its original text exactly and uses nothing without a "
             "MUSA counterpart; "
             + (f"its reference, run on {report['device']} as the original and as the round-tripped text on equal "
                "seeds, gave equal outputs (at the size scale shown; 1 = the task's own sizes)."
                if report["reference_runs"] else "references were not run (--no-run)."), "",
             "| level | converted | unchanged | dropped |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['converted']} | {v['unchanged']} | {v['dropped']} |" for k, v in report["levels"].items()]
    if report["reasons"]:
        lines += ["", "| why dropped | tasks |", "|---|---|"] + [f"| {k} | {n} |" for k, n in report["reasons"].items()]
    lines += ["", "| task | status | size scale | reason / warnings |", "|---|---|---|---|"]
    for e in report["tasks"]:
        note = (e["reason"] or "; ".join(e["warnings"])).replace("|", "\\|")
        lines.append(f"| {e['key']} | {e['status']} | {e['size_scale'] if e['size_scale'] is not None else ''} "
                     f"| {note} |")
    return "\n".join(lines) + "\n"


def port(src: Path, out: Path, device: str = "cpu", run: bool = True, timeout: float = 300.0,
         budget: int = 2**30, mem_gb: float = 8.0, progress=None) -> dict:
    """Port SRC into OUT (created; must not hold anything yet) and write report.json and report.md there. `progress`
    is called with (done, total, key of the task being ported) before each task. TaskLoadError for an unusable SRC
    or OUT."""
    from musacoder.tasks.loaders import load_tasks

    form, items = read_source(src)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TaskLoadError(f"{out}: exists and is not an empty directory (the port writes a fresh tree or JSONL)")
    started = time.perf_counter()
    runner = ReferenceRunner(device, timeout, mem_gb) if run else None
    kept: list[tuple[_Item, str]] = []
    try:
        for i, item in enumerate(items):
            if progress:
                progress(i, len(items), item.entry.key)
            if item.task is not None:
                musa = port_task(item.task, item.entry, runner, budget)
                if musa is not None:
                    kept.append((item, musa))
    finally:
        if runner is not None:
            runner.close()
    out.mkdir(parents=True, exist_ok=True)
    if form == "tree":
        for item, musa in kept:
            (out / item.relpath).parent.mkdir(parents=True, exist_ok=True)
            (out / item.relpath).write_text(musa)
        written = out
    else:
        written = out / src.name
        written.write_text("".join(json.dumps({**item.record, "code": musa}) + "\n" for item, musa in kept))
    reloaded = len(load_tasks(written)) if kept else 0  # the output, read back by the task loader
    entries = [item.entry for item in items]
    report = {"source": str(src), "out": str(written), "form": form, "device": device, "reference_runs": run,
              "size_budget_bytes": budget, "worker_mem_gb": mem_gb,
              "seconds": round(time.perf_counter() - started, 1), "reloaded": reloaded,
              **summarize(entries), "tasks": [asdict(e) for e in entries]}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    return report
