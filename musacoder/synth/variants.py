"""Stage 1c: targeted variants of existing tasks (KernelBench, generated, any task source), each checked by
clean.check_task before it is kept, with its provenance.

- `shape`: every module-level size constant (an int >= 8, or a tuple holding one, as the verifier rescales them)
  times its own factor drawn from FACTORS, rounded to keep the constant's power-of-two alignment (up to 16): other
  aspect ratios, not only other scales. Shapes computed from the constants follow; a task whose constants are tied by
  a rule the code does not compute (equal in-features and out-features written twice) breaks and is dropped.
- `dtype`: fp16 or bf16. The parameters are cast at the end of `Model.__init__`, forward casts its floating inputs
  (harnesses that feed fp32, like the cleaning check and the verifier at its default precision, still exercise the
  reduced-precision model), and `get_inputs` returns them in the dtype. Verify these with `--precision fp16/bf16`:
  the verifier's half-precision tolerance (atol 1e-2, relative L2 2e-2) applies only there; at fp32 its 1e-4
  tolerance fails correct kernels that round or accumulate in another order. Recorded in the metadata.
- `fuse`: a chain (a task's single output is another task's first input, the same shape: the second's other
  inputs become the fused task's) or, without a partner, an activation/elementwise epilogue on forward's result
  (graphs.py's operators, not the task's own last op).

Variant names are the parent's name plus the kind and a hash of the code (`19_ReLU@shape-1a2b3c`), so a variant is
made once however often it is drawn, and appended runs resume.
"""

from __future__ import annotations

import ast
import hashlib
import operator
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from musacoder.data.decontam import Renamer, Trace, TraceError, trace_task
from musacoder.data.schema import DroppedTask, TaskMeta, TaskRecord, line
from musacoder.pyast import parse
from musacoder.tasks.model import Task

KINDS = ("shape", "dtype", "fuse")
FACTORS = (0.5, 0.75, 1.5, 2.0)
MIN_SIZE = 8  # smaller ints are kernel sizes, strides, dims: the verifier's shape_min_size
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
TRIES = 8  # draws per wanted variant before giving up on one that differs from those already made
MAX_INPUT_BYTES = 2**30  # a shape variant grows its inputs up to 1 GiB; a parent already past it only shrinks


class VariantError(ValueError):
    """The variant cannot be built from this task; the message says why."""


@dataclass
class Variant:
    parent: Task
    kind: str
    code: str
    meta: dict = field(default_factory=dict)  # what was drawn: factors, dtype, partner or epilogue

    @property
    def name(self) -> str:
        tag = self.meta["dtype"] if self.kind == "dtype" else self.kind
        return f"{self.parent.name}@{tag}-{hashlib.sha256(self.code.encode()).hexdigest()[:6]}"

    def record(self, seed: int, **extra) -> TaskRecord:
        meta = TaskMeta(parent=self.parent.key, variant=self.kind, seed=seed, **self.meta, **extra)
        return TaskRecord(name=self.name, problem_id=self.parent.problem_id, level=self.parent.level, code=self.code,
                          metadata=meta)


def _parse(task: Task) -> ast.Module:
    try:
        return parse(task.code)
    except SyntaxError as e:
        raise VariantError(f"does not parse: {e}") from None


def _top(tree: ast.Module, name: str, kind=ast.FunctionDef):
    return next((n for n in tree.body if isinstance(n, kind) and n.name == name), None)


def _method(cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
    return _top(cls, name) if cls is not None else None


def _returns(fn: ast.FunctionDef) -> list[ast.Return]:
    """The return statements of `fn` itself (not of functions or lambdas defined inside it)."""
    out, todo = [], list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            out.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo += list(ast.iter_child_nodes(node))
    return out


def _stmts(src: str) -> list[ast.stmt]:
    return parse(src).body


# ---- shape ----------------------------------------------------------------------------------------------------------

def _resize(v: int, f: float) -> int:
    """v * f, a multiple of the power of two v is a multiple of (up to 16) where the result is large enough."""
    g = min(v & -v, 16)
    while g > 1 and v * f < 2 * g:
        g //= 2
    return max(g, round(v * f / g) * g)


_INT_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _int_value(node: ast.expr) -> int | None:
    """An int written as a literal or as arithmetic over literals (KernelBench writes `N = 2048 * 2`), else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _INT_OPS:
        a, b = _int_value(node.left), _int_value(node.right)
        if a is not None and b is not None and not (isinstance(node.op, ast.FloorDiv) and b == 0):
            return _INT_OPS[type(node.op)](a, b)
    return None


def input_bytes(task: Task) -> int | None:
    """Bytes of get_inputs(), built on the meta device; None when that fails (the check will say why)."""
    from musacoder.tasks.select import estimate_bytes

    try:
        return estimate_bytes(task)[0]
    except Exception:  # noqa: BLE001 - foreign code: no estimate, no limit
        return None


def shape_variant(task: Task, rng: random.Random, grow: bool = True) -> Variant:
    """Every size constant times its own drawn factor; `grow=False` draws only factors under 1."""
    choices = FACTORS if grow else tuple(f for f in FACTORS if f < 1)
    tree = _parse(task)
    factors, constants = {}, {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets)):
            continue
        name = "=".join(t.id for t in node.targets)  # `height = width = 256`: one constant
        elts = node.value.elts if isinstance(node.value, ast.Tuple) else None
        ints = [_int_value(e) for e in (elts if elts is not None else [node.value])]
        if not ints or None in ints or not any(v >= MIN_SIZE for v in ints):
            continue
        f = rng.choice(choices)
        new = [_resize(v, f) if v >= MIN_SIZE else v for v in ints]
        node.value = ast.Tuple([ast.Constant(v) for v in new], ast.Load()) if elts is not None else ast.Constant(new[0])
        factors[name] = f
        constants[name] = tuple(new) if elts is not None else new[0]
    if not factors:
        raise VariantError("no module-level size constants (ints >= 8) to scale")
    return Variant(task, "shape", ast.unparse(tree), {"factors": factors, "constants": constants})


# ---- dtype ----------------------------------------------------------------------------------------------------------

def dtype_variant(task: Task, dtype: str) -> Variant:
    from musacoder.config import CorrectnessConfig

    torch_dtype = f"torch.{DTYPES[dtype]}"
    tree = _parse(task)
    model = _top(tree, "Model", ast.ClassDef)
    init, forward, get_inputs = _method(model, "__init__"), _method(model, "forward"), _top(tree, "get_inputs")
    if init is None or forward is None or get_inputs is None:
        raise VariantError("needs Model.__init__, Model.forward and get_inputs to cast")
    helper = _stmts(f'''def _to_dtype(t):
    """Floating-point tensors to this task's dtype ({torch_dtype}); anything else as it is."""
    return t.to({torch_dtype}) if isinstance(t, torch.Tensor) and t.is_floating_point() else t''')
    last_import = max((i for i, n in enumerate(tree.body) if isinstance(n, (ast.Import, ast.ImportFrom))), default=-1)
    tree.body[last_import + 1:last_import + 1] = helper
    init.body += _stmts(f"self.to({torch_dtype})")
    args = forward.args
    casts = [f"{a.arg} = _to_dtype({a.arg})" for a in (args.posonlyargs + args.args)[1:]]
    if args.vararg:
        casts.append(f"{args.vararg.arg} = tuple(_to_dtype(a) for a in {args.vararg.arg})")
    first = 1 if forward.body and isinstance(forward.body[0], ast.Expr) \
        and isinstance(forward.body[0].value, ast.Constant) else 0  # after a docstring
    forward.body[first:first] = _stmts("\n".join(casts)) if casts else []
    for ret in _returns(get_inputs):
        ret.value = ast.ListComp(parse("_to_dtype(t)", mode="eval").body, [ast.comprehension(
            ast.Name("t", ast.Store()), ret.value or ast.List([], ast.Load()), [], 0)])
    cfg = CorrectnessConfig()
    return Variant(task, "dtype", ast.unparse(ast.fix_missing_locations(tree)),
                   {"dtype": dtype, "verify_precision": dtype, "atol": cfg.atol_half, "rel_l2": cfg.rel_l2_half,
                    "note": f"verify with --precision {dtype}: at fp32 the verifier's tolerance "
                            f"({cfg.atol_fp32:g}) fails correct {dtype} kernels"})


# ---- fuse -----------------------------------------------------------------------------------------------------------

def _epilogues() -> dict[str, str]:
    from musacoder.synth.graphs import _ACT, _ELT

    # graphs.py's templates with F spelled out: a task need not import torch.nn.functional as F
    return {k: v.replace("F.", "torch.nn.functional.") for k, v in {**_ACT, **_ELT}.items()}


def epilogue_variant(task: Task, epilogue: str) -> Variant:
    tree = _parse(task)
    forward = _method(_top(tree, "Model", ast.ClassDef), "forward")
    returns = _returns(forward) if forward is not None else []
    if not returns or any(r.value is None for r in returns):
        raise VariantError("Model.forward has no result to append an epilogue to")
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    out = next(f"out{i or ''}" for i in range(len(used) + 1) if f"out{i or ''}" not in used)
    _Epilogue(out, _epilogues()[epilogue].format(x=out)).generic_visit(forward)
    return Variant(task, "fuse", ast.unparse(ast.fix_missing_locations(tree)),
                   {"fusion": "epilogue", "epilogue": epilogue})


class _Epilogue(ast.NodeTransformer):
    """`return X` becomes `out = X; return epilogue(out)` (X evaluated once); functions defined inside keep theirs."""

    def __init__(self, out: str, expr: str):
        self.out, self.expr = out, expr

    def visit_Return(self, node):
        return [ast.Assign([ast.Name(self.out, ast.Store())], node.value),
                ast.Return(parse(self.expr, mode="eval").body)]

    def _inner(self, node):
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _inner


class _Rename(Renamer):
    """Also the functions and classes it defines."""

    def __init__(self, names: dict[str, str]):
        super().__init__(names, {})

    def _def(self, node):
        node.name = self.names.get(node.name, node.name)
        return self.generic_visit(node)

    visit_FunctionDef = visit_ClassDef = _def


def _bound(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
        stmt, (ast.AnnAssign, ast.AugAssign)) else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def chain_variant(first: Task, second: Task, first_trace: Trace, second_trace: Trace) -> Variant:
    """`second(first(inputs...), second's other inputs...)` as one task; module-level names of the two renamed apart
    (a constant both define with the same value is shared)."""
    a, b = _parse(first), _parse(second)
    imports = [s for s in a.body + b.body if isinstance(s, (ast.Import, ast.ImportFrom))]
    imports = list({ast.unparse(s): s for s in imports}.values())
    a_rest = [s for s in a.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
    b_rest = [s for s in b.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
    a_text = {n: ast.unparse(s) for s in a_rest for n in _bound(s)}
    shared = {ast.unparse(s) for s in b_rest if isinstance(s, ast.Assign)
              and all(a_text.get(n) == ast.unparse(s) for n in _bound(s))}
    b_rest = [s for s in b_rest if ast.unparse(s) not in shared]
    own = ("Model", "get_inputs", "get_init_inputs")
    _Rename({n: f"{n}_1" for n in own}).visit(ast.Module(a_rest, []))
    clash = {n for s in b_rest for n in _bound(s)} & set(a_text)
    _Rename({n: f"{n}_2" for n in set(own) | clash}).visit(ast.Module(b_rest, []))
    k, n = len(first_trace.input_ranks), first_trace.n_init
    glue = _stmts(f'''class Model(torch.nn.Module):
    """{first.key}, its output fed to {second.key} (fused)."""

    def __init__(self, *init_inputs):
        super().__init__()
        self.first = Model_1(*init_inputs[:{n}])
        self.second = Model_2(*init_inputs[{n}:])

    def forward(self, *inputs):
        return self.second(self.first(*inputs[:{k}]), *inputs[{k}:])


def get_inputs():
    return list(get_inputs_1()) + list(get_inputs_2())[1:]


def get_init_inputs():
    return list(get_init_inputs_1()) + list(get_init_inputs_2())''')
    tree = ast.fix_missing_locations(ast.Module(imports + a_rest + b_rest + glue, []))
    return Variant(first, "fuse", ast.unparse(tree), {"fusion": "chain", "second": second.key})


def chain_partners(tasks: list[Task], traces: dict[str, Trace | None]) -> dict[str, list[Task]]:
    """Per task key, the other tasks whose first input is a floating tensor of exactly its single output's shape."""
    out: dict[str, list[Task]] = {}
    for a in tasks:
        ta = traces.get(a.key)
        if ta is None or ta.outputs is None or len(ta.outputs) != 1:
            continue
        out[a.key] = [b for b in tasks if b.key != a.key and (tb := traces.get(b.key)) is not None
                      and tb.input_shapes and tb.input_shapes[0] == ta.outputs[0] and tb.input_floating[0]]
    return out


# ---- drawing and checking -------------------------------------------------------------------------------------------

def _safe_trace(task: Task) -> Trace | None:
    try:
        return trace_task(task.code)
    except TraceError:
        return None


def _candidates(task: Task, kind: str, rng: random.Random, per_task: int, traces: dict[str, Trace | None],
                partners: dict[str, list[Task]]) -> Iterator[Variant]:
    """Variants of one kind of one task, in draw order (VariantError when the task has none of this kind)."""
    if kind == "dtype":
        yield from (dtype_variant(task, d) for d in rng.sample(sorted(DTYPES), len(DTYPES)))
    elif kind == "shape":
        grow = (input_bytes(task) or 0) <= MAX_INPUT_BYTES
        yield from (shape_variant(task, rng, grow) for _ in range(per_task * TRIES))
    else:  # chains and epilogues in turn, chains first
        own = traces.get(task.key)
        last = own.ops[-1].split("[")[0] if own and own.ops else None
        epis = [e for e in sorted(_epilogues()) if e != last]  # relu after relu would change nothing
        mates = partners.get(task.key, [])
        epis, mates = rng.sample(epis, len(epis)), rng.sample(mates, len(mates))
        for i in range(max(len(epis), len(mates))):
            if i < len(mates):
                yield chain_variant(task, mates[i], own, traces[mates[i].key])
            if i < len(epis):
                yield epilogue_variant(task, epis[i])


def draw(tasks: list[Task], kinds: tuple[str, ...], per_task: int, seed: int
         ) -> list[tuple[Task, str, Variant | None, str]]:
    """Up to `per_task` distinct variants of each kind per task: (parent, kind, variant or None, why not)."""
    if unknown := sorted(set(kinds) - set(KINDS)):
        raise VariantError(f"unknown variant kinds {unknown}; known: {', '.join(KINDS)}")
    traces = {t.key: _safe_trace(t) for t in tasks} if "fuse" in kinds else {}
    partners = chain_partners(tasks, traces)
    out = []
    for task in tasks:
        for kind in kinds:
            rng = random.Random(f"{seed}:{task.key}:{kind}")  # a task's draws do not depend on the others'
            made: dict[str, Variant] = {}
            try:
                for v in _candidates(task, kind, rng, per_task, traces, partners):
                    made.setdefault(v.code, v)
                    if len(made) == per_task:
                        break
            except VariantError as e:
                out.append((task, kind, None, str(e)))
            out += [(task, kind, v, "") for v in made.values()]
    return out


def check_variant(v: Variant, check_scale: float = 1.0) -> tuple[list[str], dict]:
    """(reasons to drop it, the check's aten ops and families)."""
    from musacoder.synth.clean import check_task

    if v.kind == "shape" and (size := input_bytes(Task(v.name, v.code))) is not None \
            and size > max(MAX_INPUT_BYTES, input_bytes(v.parent) or 0):
        return [f"too large: inputs grow to {size / 2**30:.1f} GiB, over the {MAX_INPUT_BYTES / 2**30:g} GiB a "
                f"shape variant may grow to"], {"aten_ops": [], "families": []}
    rep = check_task(v.code, check_scale)
    problems = list(rep.problems)
    if not problems and v.kind == "dtype":
        want = DTYPES[v.meta["dtype"]]
        try:
            got = [d for d in trace_task(v.code).output_dtypes if d.startswith(("float", "bfloat"))]
        except TraceError as e:
            got, problems = [], [f"cannot trace: {e}"]
        if any(d != want for d in got):
            problems.append(f"outputs are {', '.join(got)}, not {want}: forward leaves the variant's dtype")
    return problems, {"aten_ops": rep.aten_ops, "families": rep.families}


def dropped_path(out: Path) -> Path:
    return out.with_name(f"{out.stem}.dropped.jsonl")


def synth_variants(tasks: list[Task], out: Path, kinds: tuple[str, ...] = KINDS, per_task: int = 1, seed: int = 0,
                   check_scale: float = 1.0, progress: Callable[[int, int], None] | None = None) -> dict:
    """Draw, check and append variants to `out` (kept) and its .dropped.jsonl sibling; return the summary.
    A variant already in either file (same name: same parent, kind and code) is not checked again."""
    from musacoder.synth.tasks import recorded

    drawn = draw(tasks, kinds, per_task, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = recorded(out, TaskRecord, lambda r: r.name) | recorded(dropped_path(out), DroppedTask, lambda r: r.name)
    kept, dropped, skipped, reasons, per_kind = 0, 0, 0, Counter(), Counter()
    with open(out, "a") as keep, open(dropped_path(out), "a") as drop:
        for i, (parent, kind, v, why) in enumerate(drawn):
            name = v.name if v is not None else f"{parent.name}@{kind}"
            if name in done:
                skipped += 1
            elif v is None:
                drop.write(line(DroppedTask(name=name, metadata=TaskMeta(parent=parent.key, variant=kind, seed=seed),
                                            problems=[why])))
                reasons[why.split(":")[0]] += 1
                dropped += 1
            else:
                problems, checked = check_variant(v, check_scale)
                rec = v.record(seed, **checked)
                if problems:
                    drop.write(line(rec.dropped(problems)))
                    reasons.update(p.split(":")[0] for p in problems)
                    dropped += 1
                else:
                    keep.write(line(rec))
                    kept += 1
                    per_kind[kind] += 1
            done.add(name)
            keep.flush()
            drop.flush()
            if progress:
                progress(i + 1, len(drawn))
    return {"drawn": len(drawn), "kept": kept, "dropped": dropped, "skipped_existing": skipped,
            "kept_per_kind": dict(per_kind), "reasons": dict(reasons.most_common())}
