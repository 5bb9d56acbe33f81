"""Decontamination: remove training records whose task is an evaluation task (KernelBench or any other set), by three
detectors, each match recorded with its reason.

- `ast` (exact program): the same Python syntax tree once docstrings, comments, formatting and type annotations are
  dropped, `super(Model, self)` is read as `super()`, and every name the file binds (imports' aliases, module-level
  constants, functions, classes, arguments, locals, `self.<attribute>`s it assigns) is renamed by order of first
  appearance. Literal values count: the same file with other size constants is not an `ast` match (`opgraph` finds
  it). Required names (`Model`, `forward`, `get_inputs`, ...), attributes of other objects (`torch.relu`) and
  keyword names (`dim=1`) stay as written.
- `opgraph` (the same computation at any rank, size or spelling): the canonical op graph of one forward
  (data/opgraph.py): the aten ops with their data flow, composite ops decomposed to their formulas, views, casts,
  ranks, sizes, integer and float arguments, argument order and names left out, boolean arguments kept (a transposed
  convolution is not a standard one). Traced on the meta device (no memory, no compute; the cpu at the task's own
  sizes when an op needs real data), capped at `max_trace_ops` top-level ops (an unrolled RNN runs tens of thousands;
  the prefix then stands for it). By this rule ReLU on a rank-3 input is ReLU, KernelBench's SELU and ELU are one
  problem, and so are its square and tall-skinny matmuls, its 1-d and 2-d poolings, and a dtype variant of a task.
  Recomputed, not read from `metadata.aten_ops`, which holds first occurrences without arguments.
- `minhash` (near copy of the text): 5-token shingles of the code normalised by `data.diversity.normalise`
  (comments and docstrings dropped, numbers and the author's names folded) keeping the names of torch's operators,
  candidates from `datasketch.MinHashLSH` at `threshold`, each confirmed by the exact Jaccard similarity of the two
  shingle sets. Candidates the exact Jaccard rejects are reported as near misses, to review.

A record is a task record (`code`) or an SFT record (`messages`: the task is the last KernelBench-format ```python
block of the first user turn, after any one-shot example). Records with neither are kept and counted as unchecked.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import time
import types
import warnings
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from functools import cache

from musacoder.data.diversity import jaccard, shingles
from musacoder.data.opgraph import graph_key
from musacoder.pyast import parse
from musacoder.settings import Settings
from musacoder.tasks.model import Task, TaskLoadError

DETECTORS = ("ast", "opgraph", "minhash")  # strongest first: a dropped record's reason is its first match
WHY = {"ast": "identical program up to names, comments, docstrings, annotations and formatting",
       "opgraph": "same canonical op graph (the same computation at any rank, size or spelling)",
       "minhash": "near copy: normalised-code shingle Jaccard at or above the threshold"}
LSH_MAX = 0.9  # LSH only proposes candidates (the exact Jaccard decides); above this it has too few bands
REQUIRED_NAMES = frozenset({"Model", "get_inputs", "get_init_inputs", "forward", "__init__", "self"})


@dataclass
class DecontamSettings(Settings):
    threshold: float = 0.8  # shingle Jaccard at or above which a record is a near copy of an eval task
    num_perm: int = 128  # MinHash permutations
    shingle: int = 5  # tokens per shingle
    max_trace_ops: int = 4096  # aten ops recorded per forward, at most
    detectors: tuple[str, ...] = DETECTORS

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], not {self.threshold}")
        if self.num_perm < 32:
            raise ValueError(f"num_perm must be at least 32, not {self.num_perm}")
        if unknown := sorted(set(self.detectors) - set(DETECTORS)):
            raise ValueError(f"unknown detectors {unknown}; known: {', '.join(DETECTORS)}")
        if not self.detectors:
            raise ValueError("no detector selected")


# ---- detector 2: the canonical syntax tree -------------------------------------------------------------------------

def _drop_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                            and isinstance(s.value.value, str))]
            node.body = kept or [ast.Pass()]


def _bound_names(tree: ast.AST) -> tuple[list[str], list[str]]:
    """(names the file binds, attributes it assigns on self), each in order of first appearance."""
    names, attrs = [], []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [a.asname or a.name.split(".")[0] for a in node.names]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.arg):
            names.append(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.append(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            attrs.append(node.attr)
    return list(dict.fromkeys(names)), list(dict.fromkeys(attrs))


class Renamer(ast.NodeTransformer):
    """Renames names, arguments and `self.` attributes (the retrieval baseline adapts a training answer with it)."""

    def __init__(self, names: dict[str, str], attrs: dict[str, str]):
        self.names, self.attrs = names, attrs

    def visit_Name(self, node):
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_arg(self, node):
        node.arg = self.names.get(node.arg, node.arg)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = self.attrs.get(node.attr, node.attr)
        return node


class _Canonical(Renamer):
    """Also imports, definitions, and no annotations: one spelling of a program."""

    def visit_arg(self, node):
        node.annotation = None
        return super().visit_arg(node)

    def visit_alias(self, node):  # `import torch as th` and `import torch` alike: bound under its canonical name
        bound = node.asname or node.name.split(".")[0]
        node.asname = self.names.get(bound, bound)
        return node

    def _named(self, node):
        node.name = self.names.get(node.name, node.name)
        if hasattr(node, "returns"):
            node.returns = None
        return self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _named

    def visit_AnnAssign(self, node):
        self.generic_visit(node)
        return ast.Assign([node.target], node.value) if node.value is not None else None

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            node.args = []  # super(Model, self) is super()
        return node


def canonical_form(code: str) -> str:
    """The canonical syntax tree (`ast.dump`) the `ast` detector compares. SyntaxError when the code does not parse."""
    tree = parse(code)
    _drop_docstrings(tree)
    names, attrs = _bound_names(tree)
    rename = {n: f"v{i}" for i, n in enumerate(n for n in names if n not in REQUIRED_NAMES)}
    tree = _Canonical(rename, {a: f"a{i}" for i, a in enumerate(attrs)}).visit(tree)
    return ast.dump(tree, annotate_fields=False)


def canonical_hash(code: str) -> str:
    return hashlib.sha256(canonical_form(code).encode()).hexdigest()


# ---- detector 3: the canonical op graph ----------------------------------------------------------------------------

class TraceError(Exception):
    """The task could not be traced (does not load, or forward fails on the meta device and on the cpu)."""


@dataclass
class Trace:
    ops: tuple[str, ...]  # top-level aten ops in execution order, boolean arguments in brackets; casts and views out
    graph: str  # the canonical op graph (data/opgraph.py): no ranks, sizes, names or argument order
    truncated: bool  # forward ran more than max_trace_ops ops; ops and graph are its prefix
    input_ranks: tuple  # per get_inputs() entry: a tensor's rank, else its type's name
    input_shapes: list  # per entry: a tensor's shape, else None
    input_floating: list[bool]
    outputs: list | None  # shapes of the tensor outputs (None when truncated or not all outputs are tensors)
    output_dtypes: list[str]
    n_init: int  # len(get_init_inputs())
    device: str  # where it was traced: meta, or cpu

    @property
    def signature(self) -> str:
        """What the `opgraph` detector compares: the same computation at any rank, size or spelling."""
        return graph_key(self.graph)

    @property
    def sequence_signature(self) -> str:
        """The former `opgraph` key, the op sequence over the same input ranks (kept for `synth twins`, which shows
        what keying on ranks missed)."""
        return hashlib.sha256(json.dumps([self.ops, self.truncated, self.input_ranks]).encode()).hexdigest()


def _trace_on(code: str, device: str, max_ops: int) -> Trace:
    import torch

    from musacoder.data.opgraph import IGNORED_OPS, LimitReached, recorder_cls

    module = types.ModuleType("musacoder_trace_" + hashlib.sha256(code.encode()).hexdigest()[:12])
    with warnings.catch_warnings(), torch.device(device):
        warnings.simplefilter("ignore")  # the tasks' own deprecation warnings are not ours to print
        exec(compile(code, module.__name__, "exec"), module.__dict__)  # noqa: S102 - tasks the caller chose to read
        torch.manual_seed(0)
        init = list(module.get_init_inputs())
        model = module.Model(*init)
        inputs = list(module.get_inputs())
        mode = recorder_cls()(max_ops, frozenset(IGNORED_OPS))
        for t in [*model.parameters(), *model.buffers()]:
            mode.leaf(t, weight=True)
        out = None
        try:
            with torch.no_grad(), mode:
                out = model(*inputs)
            mode.graph.outputs = mode.output_refs(out)
        except LimitReached:
            pass
    outs = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (list, tuple)) else None
    tensors = outs is not None and all(isinstance(o, torch.Tensor) for o in outs)
    is_t = [isinstance(x, torch.Tensor) for x in inputs]
    return Trace(ops=tuple(mode.ops), graph=mode.graph.canonical(), truncated=mode.graph.truncated,
                 input_ranks=tuple(x.dim() if t else type(x).__name__ for x, t in zip(inputs, is_t)),
                 input_shapes=[tuple(x.shape) if t else None for x, t in zip(inputs, is_t)],
                 input_floating=[t and x.is_floating_point() for x, t in zip(inputs, is_t)],
                 outputs=[tuple(o.shape) for o in outs] if tensors else None,
                 output_dtypes=[str(o.dtype).removeprefix("torch.") for o in outs] if tensors else [],
                 n_init=len(init), device=device)


def trace_task(code: str, max_ops: int = 4096) -> Trace:
    """One forward on the meta device; on the cpu at the task's own sizes when the meta device cannot run an op."""
    try:
        return _trace_on(code, "meta", max_ops)
    except Exception as e:  # noqa: BLE001 - any failure of foreign code is a reason, not a crash
        if "meta" not in str(e).lower():  # the same failure on any device: do not run it again for real
            raise TraceError(f"{type(e).__name__}: {e}"[:300]) from e
    try:
        return _trace_on(code, "cpu", max_ops)
    except Exception as e:  # noqa: BLE001
        raise TraceError(f"meta device unsupported, then on the cpu: {type(e).__name__}: {e}"[:300]) from e


# ---- detector 1: MinHash over normalised code -----------------------------------------------------------------------

@cache
def torch_names() -> frozenset[str]:
    """Public names of torch's operator namespaces, kept by the normaliser: `torch.relu` and `torch.tanh` differ.
    One-letter names (`t`, `e`, `T`) are too often a variable's."""
    import torch
    import torch.nn.functional as F

    return frozenset(n for m in (torch, torch.nn, F, torch.Tensor) for n in dir(m)
                     if not n.startswith("_") and len(n) > 1)


def task_shingles(code: str, k: int = 5) -> set[str]:
    return shingles(code, k, torch_names())


# ---- records --------------------------------------------------------------------------------------------------------

_BLOCK_RE = re.compile(r"```python[^\n]*\n(.*?)```", re.DOTALL)


def task_code(record: dict) -> str | None:
    """The task a record is about: `code`, or the last KernelBench-format ```python block of the first user message
    (the task follows the prompt's one-shot example). None when there is none."""
    if isinstance(record.get("code"), str):
        return record["code"]
    messages = record.get("messages")
    if not isinstance(messages, list):
        return None
    first = next((m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
    if not isinstance(first, str):
        return None
    for block in reversed(_BLOCK_RE.findall(first)):
        try:
            Task(name="block", code=block).validate()
        except TaskLoadError:
            continue
        return block
    return None


def record_name(record: dict, index: int) -> str:
    return str(record.get("name") or record.get("task") or f"record{index}")


@dataclass
class Match:
    detector: str
    eval_task: str  # the eval task's key
    score: float = 1.0  # the exact Jaccard for minhash


@dataclass
class Result:
    kept: list[dict]
    dropped: list[dict]  # {"index", "name", "reason", "matches": [Match as dict], "record"}
    unchecked: list[dict] = field(default_factory=list)  # {"index", "name"}: records with no task in them
    near_misses: list[dict] = field(default_factory=list)  # {"index", "name", "eval_task", "jaccard"}
    problems: list[dict] = field(default_factory=list)  # {"index", "name", "detector", "problem"}: not applied
    eval_problems: list[dict] = field(default_factory=list)  # {"eval_task", "detector", "problem"}
    n_eval: int = 0
    seconds: float = 0.0

    def report(self, settings: DecontamSettings) -> dict:
        per_detector, first, per_eval = Counter(), Counter(), defaultdict(Counter)
        for d in self.dropped:
            first[d["reason"]] += 1
            for det in dict.fromkeys(m["detector"] for m in d["matches"]):
                per_detector[det] += 1
            for m in d["matches"]:
                per_eval[m["eval_task"]][m["detector"]] += 1
        return {"records": len(self.kept) + len(self.dropped), "kept": len(self.kept), "dropped": len(self.dropped),
                "unchecked": len(self.unchecked), "eval_tasks": self.n_eval, "seconds": round(self.seconds, 2),
                "settings": settings.to_dict(), "detectors": {d: WHY[d] for d in settings.detectors},
                "matched_by_detector": {d: per_detector[d] for d in settings.detectors},
                "dropped_by_first_detector": {d: first[d] for d in settings.detectors},
                "per_eval_task": {k: dict(v) for k, v in sorted(per_eval.items())},
                "dropped_records": [{k: v for k, v in d.items() if k != "record"} for d in self.dropped],
                "near_misses": self.near_misses, "unchecked_records": self.unchecked,
                "record_problems": self.problems, "eval_problems": self.eval_problems}


def summary(report: dict) -> str:
    """The report as a few readable lines."""
    lines = [f"{report['records']} records against {report['eval_tasks']} eval tasks: kept {report['kept']}, "
             f"dropped {report['dropped']}, no task in {report['unchecked']} (kept)  [{report['seconds']} s]"]
    for det, why in report["detectors"].items():
        lines.append(f"  {det:8} matched {report['matched_by_detector'][det]:5}, first reason for "
                     f"{report['dropped_by_first_detector'][det]:5}  ({why})")
    if report["per_eval_task"]:
        lines.append("  per matched eval task:")
        lines += [f"    {k}: " + ", ".join(f"{d} {n}" for d, n in v.items())
                  for k, v in report["per_eval_task"].items()]
    if report["near_misses"]:
        lines.append(f"  near misses (LSH candidates under the threshold, kept; review): {len(report['near_misses'])}")
    for what, key in (("records", "record_problems"), ("eval tasks", "eval_problems")):
        if report[key]:
            counts = Counter(p["detector"] for p in report[key])
            lines.append(f"  {what} a detector could not be applied to: "
                         + ", ".join(f"{d} {n}" for d, n in counts.items()) + f" (see {key} in the report)")
    return "\n".join(lines)


class EvalIndex:
    """The eval tasks, indexed once for every detector."""

    def __init__(self, eval_tasks: list[Task], settings: DecontamSettings | None = None):
        from datasketch import MinHashLSH

        self.s = settings or DecontamSettings()
        self.tasks = eval_tasks
        self.problems: list[dict] = []
        self.by_hash: dict[str, list[str]] = defaultdict(list)
        self.by_signature: dict[str, list[str]] = defaultdict(list)
        self.shingle_sets: list[set[str]] = []
        self.lsh = MinHashLSH(threshold=min(self.s.threshold, LSH_MAX), num_perm=self.s.num_perm)
        for i, t in enumerate(eval_tasks):
            if "ast" in self.s.detectors:
                try:
                    self.by_hash[canonical_hash(t.code)].append(t.key)
                except SyntaxError as e:
                    self.problems.append({"eval_task": t.key, "detector": "ast", "problem": f"SyntaxError: {e}"})
            if "opgraph" in self.s.detectors:
                try:
                    self.by_signature[trace_task(t.code, self.s.max_trace_ops).signature].append(t.key)
                except TraceError as e:
                    self.problems.append({"eval_task": t.key, "detector": "opgraph", "problem": str(e)})
            if "minhash" in self.s.detectors:
                sh = task_shingles(t.code, self.s.shingle)
                self.shingle_sets.append(sh)
                self.lsh.insert(i, self._minhash(sh))

    def _minhash(self, sh: set[str]):
        from datasketch import MinHash

        m = MinHash(num_perm=self.s.num_perm, seed=1)
        m.update_batch([x.encode() for x in sh])
        return m

    def matches(self, code: str) -> tuple[list[Match], list[tuple[str, float]], list[tuple[str, str]]]:
        """(matches, near misses as (eval key, Jaccard), problems as (detector, message)) of one task's code."""
        found, near, problems = [], [], []
        if "ast" in self.s.detectors:
            try:
                found += [Match("ast", k) for k in self.by_hash.get(canonical_hash(code), [])]
            except SyntaxError as e:
                problems.append(("ast", f"SyntaxError: {e}"))
        if "opgraph" in self.s.detectors:
            try:
                found += [Match("opgraph", k)
                          for k in self.by_signature.get(trace_task(code, self.s.max_trace_ops).signature, [])]
            except TraceError as e:
                problems.append(("opgraph", str(e)))
        if "minhash" in self.s.detectors:
            sh = task_shingles(code, self.s.shingle)
            for i in sorted(self.lsh.query(self._minhash(sh))):
                j = round(jaccard(sh, self.shingle_sets[i]), 4)
                if j >= self.s.threshold:
                    found.append(Match("minhash", self.tasks[i].key, j))
                else:
                    near.append((self.tasks[i].key, j))
        return found, near, problems


def run(records: list[dict], eval_tasks: list[Task], settings: DecontamSettings | None = None) -> Result:
    """Decontaminate `records` against `eval_tasks`, with everything the report needs."""
    start = time.perf_counter()
    s = settings or DecontamSettings()
    index = EvalIndex(eval_tasks, s)
    res = Result(kept=[], dropped=[], eval_problems=index.problems, n_eval=len(eval_tasks))
    for i, rec in enumerate(records):
        name = record_name(rec, i)
        code = task_code(rec)
        if code is None:
            res.unchecked.append({"index": i, "name": name})
            res.kept.append(rec)
            continue
        found, near, problems = index.matches(code)
        res.near_misses += [{"index": i, "name": name, "eval_task": k, "jaccard": j} for k, j in near]
        res.problems += [{"index": i, "name": name, "detector": d, "problem": p} for d, p in problems]
        if found:
            reason = min((m.detector for m in found), key=DETECTORS.index)
            res.dropped.append({"index": i, "name": name, "reason": reason, "matches": [asdict(m) for m in found],
                                "record": rec})
        else:
            res.kept.append(rec)
    res.seconds = time.perf_counter() - start
    return res


def decontaminate(records: list[dict], eval_tasks: list[Task], settings: DecontamSettings | None = None
                  ) -> tuple[list[dict], list[dict]]:
    """(kept records, dropped ones as {"index", "name", "reason", "matches", "record"}); `run` for the report."""
    res = run(records, eval_tasks, settings)
    return res.kept, res.dropped
