"""Static checks on candidate source, on the AST (never regexes on Python), before anything runs.

Cheap first pass: catches structure problems and whole exploit classes (inheritance/alias bypass, threads,
processes, monkeypatching, introspection) before compile. Fallbacks are caught at run time by the op trace, so honest
`try`/`except` and `pass` are fine here. Python file writes are allowed: the candidate process is sandboxed to its own
temporary directory (sandbox.py), and writing sources there for `cpp_extension.load` is common. Native sources
embedded as strings are scanned for threads, processes and file I/O after stripping comments (there is no Python
AST for C++).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from musacoder.pyast import parse
from musacoder.verifier.verdict import Status

BANNED_MODULES = {
    "subprocess", "multiprocessing", "threading", "_thread", "concurrent", "asyncio", "ctypes", "cffi", "gc",
    "inspect", "importlib", "builtins", "socket", "signal", "pty", "shutil", "pickle", "marshal",
    "torch.multiprocessing", "traceback",
}
# Torch internals that let candidate Python watch or edit the harness: dispatch/function modes (see which ops the
# harness runs, i.e. detect checking vs timing), profilers, private C bindings, the build cache's internals. Dotted
# paths after import aliases are resolved; a path ending in "_" or "." is a prefix (torch._C._anything).
BANNED_PATHS = (
    "torch.utils._python_dispatch", "torch._C._", "torch.autograd.profiler", "torch.profiler", "torch.overrides",
    "torch.utils.cpp_extension._", "sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
    "sys.monitoring", "sys.modules",
    "torch_musa.utils.musa_extension._", "torch_musa._MUSAC",  # the MUSA twins of cpp_extension's and torch._C's
)
# Names that read the dispatch-mode stack or the profiler state, wherever they are reached from.
BANNED_NAME_PREFIXES = ("_get_current_dispatch_mode", "_get_dispatch_mode", "_push_on_torch_dispatch_stack",
                        "_pop_torch_dispatch_stack", "_profiler_enabled", "_is_torch_function_mode_enabled")
# Private names that must not be reached through getattr with a constant either (getattr(torch, "_C")).
BANNED_PRIVATE = {"_C", "_getframe", "_current_frames", "_python_dispatch"}
BANNED_CALLS = {"exec", "eval", "compile", "__import__", "globals", "vars", "breakpoint", "delattr"}
BANNED_OS = {
    "system", "popen", "fork", "forkpty", "kill", "killpg", "remove", "unlink", "rmdir", "removedirs", "rename",
    "renames", "replace", "chmod", "chown", "write", "truncate", "symlink", "link", "open", "fdopen", "putenv",
    "posix_spawn", "posix_spawnp", "setsid", "dup2",
}
BANNED_DUNDERS = {
    "__globals__", "__code__", "__closure__", "__subclasses__", "__builtins__", "__bases__", "__mro__",
    "__setattr__", "__delattr__", "__dict__", "__class__", "__import__", "__loader__", "__spec__",
    "f_back", "f_globals", "f_locals", "gi_frame", "tb_frame", "cr_frame",
}
ALLOWED_BASES = {"nn.Module", "torch.nn.Module", "Module", "torch.nn.modules.module.Module"}
_NATIVE_BANNED = [
    # constructing std::thread/jthread or calling std::async spawns; std::thread::hardware_concurrency() does not
    (re.compile(r"\bstd\s*::\s*(thread|jthread|async)\b(?!\s*::)"), "spawns a native thread"),
    (re.compile(r"\bpthread_create\b"), "spawns a native thread"),
    (re.compile(r"(?<![\w.])(system|popen|fork|vfork|execv|execvp|execl|execle|posix_spawn)\s*\("), "spawns a process"),
    (re.compile(r"\b(fopen|freopen|ofstream|fstream|open\s*\(|creat\s*\()"), "touches files"),
    (re.compile(r"\b(dlopen|dlsym|ptrace|mprotect)\b"), "loads code or patches memory"),
]
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


@dataclass
class StaticResult:
    status: Status | None = None  # None: passed
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status is None

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def dotted_name(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


class _Checker(ast.NodeVisitor):
    def __init__(self):
        self.imported: dict[str, str] = {}  # local name -> module or object path it is bound to
        self.problems: list[str] = []

    def bad(self, node: ast.AST, msg: str):
        msg = f"line {getattr(node, 'lineno', '?')}: {msg}"
        if msg not in self.problems:  # nested attribute chains report the same path once
            self.problems.append(msg)

    def _check_path(self, node, full: str) -> None:
        for p in BANNED_PATHS:
            if full.startswith(p) if p.endswith(("_", ".")) else full == p or full.startswith(p + "."):
                self.bad(node, f"uses {p.rstrip('._')} (harness internals)")
                return
        last = full.rsplit(".", 1)[-1]
        if last.startswith(BANNED_NAME_PREFIXES):
            self.bad(node, f"uses {last} (harness internals)")

    # imports
    def _check_module(self, node, name: str):
        for banned in BANNED_MODULES:
            if name == banned or name.startswith(banned + "."):
                self.bad(node, f"imports {name}")
                return
        self._check_path(node, name)

    def visit_Import(self, node: ast.Import):
        for a in node.names:
            self._check_module(node, a.name)
            self.imported[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom):
        mod = node.module or ""
        self._check_module(node, mod)
        for a in node.names:
            self._check_module(node, f"{mod}.{a.name}")
            self.imported[a.asname or a.name] = f"{mod}.{a.name}"
            if mod == "os" and a.name in BANNED_OS:
                self.bad(node, f"imports os.{a.name}")

    # calls
    def visit_Call(self, node: ast.Call):
        name = dotted_name(node.func)
        if isinstance(node.func, ast.Name) and node.func.id in BANNED_CALLS:
            self.bad(node, f"calls {node.func.id}()")
        if name:
            full = self._resolve(name)
            if full.startswith("os.") and full.split(".")[1] in BANNED_OS or full.startswith(("os.exec", "os.spawn")):
                self.bad(node, f"calls {full}()")
            if full in ("setattr", "getattr", "object.__setattr__"):
                self._check_attr_call(node, full)
        self.generic_visit(node)

    def _check_attr_call(self, node: ast.Call, fn: str):
        target = node.args[0] if node.args else None
        is_self = isinstance(target, ast.Name) and target.id == "self"
        if fn != "getattr":
            if not is_self:
                self.bad(node, f"{fn}() on {ast.unparse(target) if target is not None else '?'} (monkeypatching)")
            return
        attr = node.args[1] if len(node.args) > 1 else None
        if isinstance(attr, ast.Constant) and isinstance(attr.value, str):
            name = attr.value
            if name in BANNED_DUNDERS or name in BANNED_PRIVATE or name.startswith(BANNED_NAME_PREFIXES):
                self.bad(node, f"getattr() of {name} (introspection)")
            elif target is not None and dotted_name(target):
                self._check_path(node, f"{self._resolve(dotted_name(target))}.{name}")
        if not is_self and not (isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
            self.bad(node, f"getattr() with a computed name on {ast.unparse(target) if target is not None else '?'}")

    def _resolve(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        base = self.imported.get(head, head)
        return f"{base}.{rest}" if rest else base

    # writes to module attributes (monkeypatching torch, time, builtins...)
    def _check_target(self, t: ast.AST):
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self._check_target(e)
            return
        if isinstance(t, ast.Attribute):
            root = _root(t)
            if isinstance(root, ast.Name) and root.id in self.imported:
                self.bad(t, f"assigns {ast.unparse(t)} (monkeypatching {self.imported[root.id]})")
            elif t.attr.startswith("__") and t.attr.endswith("__"):  # e.g. an alias of torch.Tensor
                self.bad(t, f"assigns {ast.unparse(t)} (monkeypatching a special method)")
        if isinstance(t, ast.Subscript):
            root = _root(t)
            if isinstance(root, ast.Name) and root.id in self.imported and dotted_name(t.value) != "os.environ":
                self.bad(t, f"assigns into {ast.unparse(t.value)}")

    def visit_Assign(self, node: ast.Assign):
        for t in node.targets:
            self._check_target(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign):
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete):
        for t in node.targets:
            self._check_target(t)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute):
        if node.attr in BANNED_DUNDERS:
            self.bad(node, f"uses {node.attr} (introspection)")
        dotted = dotted_name(node)
        if dotted:
            self._check_path(node, self._resolve(dotted))
        elif node.attr.startswith(BANNED_NAME_PREFIXES):
            self.bad(node, f"uses {node.attr} (harness internals)")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name):
        if node.id in ("__builtins__", "__loader__"):
            self.bad(node, f"uses {node.id}")


def _native_sources(tree: ast.AST) -> list[str]:
    """String constants that look like C/C++/CUDA source."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and ("{" in n.value or ";" in n.value):
            out.append(n.value)
    return out


def check_native(tree: ast.AST) -> list[str]:
    problems = []
    for src in _native_sources(tree):
        code = _COMMENT_RE.sub("", src)
        for pat, what in _NATIVE_BANNED:
            m = pat.search(code)
            if m:
                problems.append(f"native source {what} ({m.group(0).strip()})")
    return sorted(set(problems))


def _check_modelnew(tree: ast.Module, res: StaticResult) -> None:
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"]
    aliases = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
               and any(isinstance(t, ast.Name) and t.id == "ModelNew"
                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    if aliases:
        res.status = Status.ILLEGAL
        res.reasons.append(f"line {aliases[0].lineno}: ModelNew is bound by assignment (alias), not defined as a class")
        return
    if not classes:
        res.status = Status.FORMAT_ERROR
        res.reasons.append("no top-level `class ModelNew` in the candidate")
        return
    cls = classes[-1]
    for b in cls.bases:
        name = dotted_name(b) or ast.unparse(b)
        if name not in ALLOWED_BASES:
            res.reasons.append(f"line {cls.lineno}: ModelNew subclasses {name} (must subclass nn.Module only)")
    for n in ast.walk(cls):
        if isinstance(n, ast.Name) and n.id == "Model":
            res.reasons.append(f"line {n.lineno}: ModelNew refers to the reference class Model")
            break
    for n in tree.body:  # module-level aliases of the reference, e.g. `Base = Model`
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id == "Model":
            res.reasons.append(f"line {n.lineno}: aliases the reference class Model")


def check_source(code: str) -> StaticResult:
    res = StaticResult()
    try:
        tree = parse(code)
    except SyntaxError as e:
        return StaticResult(Status.FORMAT_ERROR, [f"syntax error line {e.lineno}: {e.msg}"])
    _check_modelnew(tree, res)
    if res.status is Status.FORMAT_ERROR:
        return res
    checker = _Checker()
    checker.visit(tree)
    res.reasons.extend(checker.problems)
    res.reasons.extend(check_native(tree))
    if res.reasons:
        res.status = Status.ILLEGAL
    return res


_BUILD_NAMES = {"load_inline", "load", "cpp_extension", "load_library"}


def needs_build(code: str) -> bool:
    """Whether importing the candidate may build native code (it names a cpp_extension loader): others skip the
    compile tier."""
    try:
        tree = parse(code)
    except SyntaxError:
        return True
    return any((isinstance(n, ast.Name) and n.id in _BUILD_NAMES) or (isinstance(n, ast.Attribute) and n.attr in
               _BUILD_NAMES) or (isinstance(n, ast.alias) and n.name.split(".")[-1] in _BUILD_NAMES)
               for n in ast.walk(tree))
