"""Static checks on candidate source, on the AST (never regexes on Python), before anything runs.

Cheap first pass: catches structure problems and whole exploit classes (inheritance/alias bypass, threads,
processes, monkeypatching, introspection) before compile. Fallbacks are caught at run time by the op trace, so honest
`try`/`except` and `pass` are fine here. Whatever the sandbox confines (sandbox.py: the candidate process writes,
deletes and renames files only in its own temporary directory) is allowed: file writes, `os.remove`, `shutil`.
What reaches past the candidate's own process or state is refused, each with a reason a model can act on:

- threads: a lock, event or thread-local from `threading` is fine; starting a thread (`Thread`, `Timer`,
  `_thread.start_new_thread`, `concurrent.futures` executors) is not, however it is spelled;
- other processes (signals, priorities, process groups, new processes) and file permissions or owners (Landlock
  confines writes, not `chmod`/`chown`);
- frames (`traceback.walk_stack`, `sys._getframe`, `inspect`, `f_locals`): printing a traceback is fine;
- attributes changed or read by a computed name: only on the candidate's own objects (`self` in its methods, and
  names bound only to its own `load_inline`/`load` extension), never on torch, builtins, os, sys or the harness;
- settings that change numerics against the reference (TF32, reduced-precision reductions, float32 matmul
  precision, flushed denormals); `torch.backends.cudnn.benchmark` and `.deterministic` are fine.

Modules the rules above look inside (os, sys, shutil, threading, ...) must be used through their attributes
(`os.remove(...)`), never bound to another name, passed on or reached through another module (`torch.cuda.os`):
an alias would hide which member is used. Native sources are scanned for threads, processes and file I/O after
stripping comments (there is no Python AST for C++); only strings that reach `load_inline`'s sources or are written
to files are read, so Python text (docstrings, messages) is not taken for C++. Where a string handed to those cannot
be traced to literals, every string of the module is read.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass, field

from musacoder.pyast import parse
from musacoder.verifier.verdict import Status

BANNED_MODULES = {
    "subprocess", "multiprocessing", "asyncio", "ctypes", "cffi", "gc", "inspect", "importlib", "builtins", "socket",
    "signal", "pty", "pickle", "marshal", "torch.multiprocessing", "musacoder",  # the harness itself
}
# Ways to run an op from Python below the dispatcher's RecordFunction, where the op trace sees nothing:
# OpOverload.redispatch / _op_dk / _handle.redispatch_boxed with a DispatchKeySet of one's choosing
BANNED_DISPATCH = {"redispatch", "redispatch_boxed", "_op_dk", "_handle", "DispatchKey", "DispatchKeySet"}
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
BANNED_CALLS = {"exec", "eval", "compile", "__import__", "globals", "vars", "breakpoint"}
BANNED_DUNDERS = {
    "__globals__", "__code__", "__closure__", "__subclasses__", "__builtins__", "__bases__", "__mro__",
    "__setattr__", "__delattr__", "__getattribute__", "__dict__", "__class__", "__import__", "__loader__", "__spec__",
    "f_back", "f_globals", "f_locals", "f_builtins", "gi_frame", "tb_frame", "cr_frame", "ag_frame",
}
ALLOWED_BASES = {"nn.Module", "torch.nn.Module", "Module", "torch.nn.modules.module.Module"}

_PROCESSES = "reaches other processes (signals, priorities, process groups, new processes): a candidate only computes"
_METADATA = ("changes file permissions or owners, which the sandbox does not confine (it confines writes); deleting "
             "or renaming the candidate's own temporary files is fine")
_RAW_FD = "writes through a raw file descriptor (the verifier's channel is one): use open() on a file in a temp dir"
BANNED_OS = {
    **dict.fromkeys(("system", "popen", "fork", "forkpty", "kill", "killpg", "posix_spawn", "posix_spawnp", "setsid",
                     "setpgid", "setpgrp", "tcsetpgrp", "pidfd_open", "setpriority", "sched_setaffinity",
                     "sched_setscheduler", "sched_setparam", "register_at_fork"), _PROCESSES),
    **dict.fromkeys(("chmod", "lchmod", "fchmod", "chown", "lchown", "fchown", "chflags", "lchflags", "utime",
                     "setxattr", "removexattr"), _METADATA),
    **dict.fromkeys(("write", "open", "fdopen", "dup2", "truncate"), _RAW_FD),
    **dict.fromkeys(("symlink", "link"), "links files (the sandbox confines writes, a link reaches elsewhere)"),
    "putenv": "changes the environment below Python (set os.environ instead)",
}
BANNED_SHUTIL = dict.fromkeys(("chown", "copymode", "copystat", "copytree"), _METADATA)
_FRAMES = ("walks stack frames, which reach the harness's state; printing a traceback (traceback.print_exc, "
           "format_exc) is fine")
BANNED_TRACEBACK = dict.fromkeys(("walk_stack", "walk_tb"), _FRAMES)

# Thread modules: only these members may be used; the rest start threads or hand out Thread objects.
THREAD_MODULES = {
    "threading": {"Lock", "RLock", "Event", "Condition", "Semaphore", "BoundedSemaphore", "Barrier",
                  "BrokenBarrierError", "local", "get_ident", "get_native_id", "TIMEOUT_MAX"},
    "_thread": {"allocate_lock", "LockType", "RLock", "get_ident", "get_native_id", "error", "TIMEOUT_MAX"},
    "concurrent": set(),  # concurrent.futures: executors
}
_THREADS = ("a thread of the candidate's own is refused, since work left running after forward returns is not "
            "timed; a lock, event or thread-local from threading (Lock, RLock, Event, Condition, Semaphore, Barrier, "
            "local) is fine, and so are OpenMP threads inside native code")
# Modules used only through their attributes; reaching one through another module (torch.cuda.os) is refused.
ATTRIBUTE_ONLY = {"os", "sys", "shutil", "traceback", "operator", *THREAD_MODULES, *BANNED_MODULES}
TORCH_SUBMODULES = {"torch.signal"}  # torch's own modules named like one of those

# Settings a candidate may assign: they pick algorithms, not precision.
SAFE_SETTINGS = {"torch.backends.cudnn.benchmark", "torch.backends.cudnn.deterministic",
                 "torch.backends.cudnn.benchmark_limit"}
_TF32 = "TF32 keeps 10 of float32's 23 mantissa bits"
NUMERICS_SETTINGS = {  # last name of a torch.backends.* setting -> why it changes numerics
    "allow_tf32": _TF32, "fp32_precision": _TF32,
    "allow_fp16_reduced_precision_reduction": "half-precision matmuls reduce in reduced precision",
    "allow_bf16_reduced_precision_reduction": "bfloat16 matmuls reduce in reduced precision",
    "allow_fp16_accumulation": "half-precision matmuls accumulate in half precision",
}
# Calls that change numerics unless given the default.
NUMERICS_CALLS = {"torch.set_float32_matmul_precision": ("highest", _TF32 + " ('high', 'medium')"),
                  "torch.set_flush_denormal": (False, "denormals become zero")}

BUILD_FUNCS = {f"{m}.{f}" for m in ("torch.utils.cpp_extension", "torch_musa.utils.musa_extension")
               for f in ("load_inline", "load")}
_ATTR_BUILTINS = {"getattr", "setattr", "delattr"}
_STR_METHODS = {"join", "format", "format_map", "replace", "strip", "lstrip", "rstrip", "encode", "decode", "dedent",
                "upper", "lower"}
_WRITE_METHODS = {"write", "write_text", "write_bytes", "writelines"}

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


def _other_binding(n: ast.AST) -> str | None:
    """The name a definition, parameter, `except ... as` or match capture binds; None for any other node."""
    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return n.name
    if isinstance(n, ast.arg):
        return n.arg
    if isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
        return n.name or None
    if isinstance(n, ast.MatchMapping):
        return n.rest or None
    return None


class _Module:
    """What the whole module binds, whatever the scope (one set per name: an over-approximation, never less)."""

    def __init__(self, tree: ast.AST):
        self.imported: dict[str, str] = {}  # local name -> module or object path it is bound to
        self.values: dict[str, list[ast.expr]] = defaultdict(list)  # name -> every value assigned to it
        self.kinds: dict[str, set[str]] = defaultdict(set)  # name -> "assign", "import", "other"
        self.parent: dict[ast.AST, ast.AST] = {}
        for n in ast.walk(tree):
            for c in ast.iter_child_nodes(n):
                self.parent[c] = n
        assigned = set()  # the Name targets _bind_assign recorded
        for n in ast.walk(tree):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                self._bind_import(n)
            elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and n.value is not None:
                self._bind_assign(n, assigned)
            else:
                name = _other_binding(n)
                if name is not None:
                    self.kinds[name].add("other")
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load) and n not in assigned:
                self.kinds[n.id].add("other")  # loop targets, unpacking, with ... as, del
        self.self_trusted = self._self_is_own_instance(tree)
        self.extensions = {name for name, vals in self.values.items()
                           if self.kinds.get(name) == {"assign"} and all(self.is_build_call(v) for v in vals)}
        self.self_extensions = self._self_extensions(tree)

    def _bind_import(self, n: ast.Import | ast.ImportFrom) -> None:
        for a in n.names:
            if a.name == "*":
                continue
            local = a.asname or a.name.split(".")[0]
            if isinstance(n, ast.Import):
                self.imported[local] = a.name if a.asname else local
            else:
                self.imported[local] = f"{n.module or ''}.{a.name}"
            self.kinds[local].add("import")

    def _bind_assign(self, n: ast.Assign | ast.AnnAssign | ast.AugAssign | ast.NamedExpr, assigned: set) -> None:
        for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
            if isinstance(t, ast.Name):
                self.values[t.id].append(n.value)
                self.kinds[t.id].add("assign")
                assigned.add(t)

    def resolve(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        base = self.imported.get(head, head)
        return f"{base}.{rest}" if rest else base

    def is_build_call(self, node: ast.AST) -> bool:
        """A call of the real cpp_extension (or musa_extension) load_inline/load, through names only imports bind."""
        name = isinstance(node, ast.Call) and dotted_name(node.func)
        return bool(name) and self.kinds.get(name.split(".")[0]) == {"import"} and self.resolve(name) in BUILD_FUNCS

    @staticmethod
    def _self_is_own_instance(tree: ast.AST) -> bool:
        """Whether every `self` is the instance parameter of a method of a class the candidate defines: a function
        of its own whose parameter is called self could be handed torch (`patch(torch.cuda)`)."""
        methods = set()
        for c in ast.walk(tree):
            if isinstance(c, ast.ClassDef):
                for f in c.body:
                    plain = not any(dotted_name(d) in ("staticmethod", "classmethod") for d in f.decorator_list) \
                        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) else False
                    params = [*f.args.posonlyargs, *f.args.args] if plain else []
                    if params and params[0].arg == "self":
                        methods.add(params[0])
        return all(n in methods for n in ast.walk(tree) if isinstance(n, ast.arg) and n.arg == "self") and not any(
            isinstance(n, ast.Name) and n.id == "self" and not isinstance(n.ctx, ast.Load) for n in ast.walk(tree))

    def _self_extensions(self, tree: ast.AST) -> set[str]:
        """Attributes `self.X` bound only to the candidate's extension (`self.ext = load_inline(...)`)."""
        good, bad = set(), set()
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Load):
                p = self.parent.get(n)
                ok = isinstance(p, ast.Assign) and p.targets == [n] and isinstance(n.value, ast.Name) \
                    and n.value.id == "self" and self.is_build_call(p.value)
                (good if ok else bad).add(n.attr)
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _ATTR_BUILTINS - {"getattr"}:
                attr = n.args[1] if len(n.args) > 1 else None
                if not (isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
                    return set()  # setattr(self, name, ...) could rebind any of them
                bad.add(attr.value)
        return good - bad if self.self_trusted else set()


class _Checker(ast.NodeVisitor):
    def __init__(self, mod: _Module):
        self.m = mod
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
        elif last in BANNED_DISPATCH:
            self.bad(node, f"uses {last}: runs an op past the dispatcher's op trace (call the op itself)")

    def _check_ref(self, node, full: str) -> None:
        """Every rule on what a resolved dotted path (an import, an attribute, a constant getattr) reaches."""
        self._check_path(node, full)
        parts = full.split(".")
        for i, part in enumerate(parts[1:], 1):
            if part in ATTRIBUTE_ONLY and ".".join(parts[:i + 1]) not in TORCH_SUBMODULES:
                # torch.cuda imports os and threading: torch.cuda.os.kill is os.kill
                self.bad(node, f"uses {'.'.join(parts[:i + 1])}: reaches the {part} module through another "
                               f"module; import {part} itself and name what it uses")
                return
        mod, member = parts[0], parts[1] if len(parts) > 1 else ""
        if mod in BANNED_MODULES or ".".join(parts[:2]) in BANNED_MODULES:
            return  # reported at its import
        why = {"os": BANNED_OS, "shutil": BANNED_SHUTIL, "traceback": BANNED_TRACEBACK}.get(mod, {}).get(member)
        if mod == "os" and member.startswith(("exec", "spawn")):
            why = _PROCESSES
        if mod in THREAD_MODULES and member and member not in THREAD_MODULES[mod]:
            why = _THREADS
        if mod == "operator" and member in ("attrgetter", "methodcaller"):
            why = "reaches attributes by a name the check cannot see; name the attribute (or getattr on self)"
        if why:
            self.bad(node, f"uses {mod}.{member}: {why}")

    # imports
    def _check_module(self, node, name: str):
        for banned in BANNED_MODULES:
            if name == banned or name.startswith(banned + "."):
                self.bad(node, f"imports {name}")
                return
        self._check_ref(node, name)

    def visit_Import(self, node: ast.Import):
        for a in node.names:
            self._check_module(node, a.name)

    def visit_ImportFrom(self, node: ast.ImportFrom):
        mod = node.module or ""
        self._check_module(node, mod)
        for a in node.names:
            if a.name == "*":
                if mod.split(".")[0] in ATTRIBUTE_ONLY or mod.startswith("torch"):
                    self.bad(node, f"imports * from {mod}: import the names it uses, so the check can see them")
                continue
            self._check_module(node, f"{mod}.{a.name}")

    # calls
    def visit_Call(self, node: ast.Call):
        name = dotted_name(node.func)
        if isinstance(node.func, ast.Name) and node.func.id in BANNED_CALLS:
            self.bad(node, f"calls {node.func.id}()")
        if name:
            full = self.m.resolve(name)
            if full in _ATTR_BUILTINS or full == "object.__setattr__":
                self._check_attr_call(node, full)
            if full in NUMERICS_CALLS:
                default, why = NUMERICS_CALLS[full]
                arg = node.args[0] if node.args else None
                if not (isinstance(arg, ast.Constant) and arg.value == default):
                    self.bad(node, f"calls {full}: changes numerics against the reference, which runs with "
                                   f"PyTorch's defaults ({why}); leave it at its default")
            if full == "torch.backends.cudnn.flags":
                tf32 = next((k.value for k in node.keywords if k.arg == "allow_tf32"), None)
                if not (isinstance(tf32, ast.Constant) and tf32.value is False):
                    self.bad(node, f"calls {full} without allow_tf32=False: it turns TF32 on for convolutions, which "
                                   f"changes numerics against the reference ({_TF32})")
        for k in node.keywords:
            if k.arg == "capture_locals" and not (isinstance(k.value, ast.Constant) and not k.value.value):
                self.bad(node, f"passes capture_locals: {_FRAMES}")
        self.generic_visit(node)

    def _own(self, t: ast.AST | None) -> bool:
        """The candidate's own objects: self in its methods, its extension module (a name or self.X bound only to
        load_inline/load)."""
        if isinstance(t, ast.Name):
            return (t.id == "self" and self.m.self_trusted) or t.id in self.m.extensions
        return isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" \
            and t.attr in self.m.self_extensions

    def _check_attr_call(self, node: ast.Call, fn: str):
        target = node.args[0] if node.args else None
        shown = ast.unparse(target) if target is not None else "?"
        if fn != "getattr":
            if not self._own(target):
                self.bad(node, f"{fn}() on {shown} (monkeypatching): only the candidate's own objects may be changed "
                               "this way (self in its methods, its own extension module)")
            return
        attr = node.args[1] if len(node.args) > 1 else None
        if isinstance(attr, ast.Constant) and isinstance(attr.value, str):
            name = attr.value
            if name in BANNED_DUNDERS or name in BANNED_PRIVATE or name.startswith(BANNED_NAME_PREFIXES):
                self.bad(node, f"getattr() of {name} (introspection)")
            elif target is not None and dotted_name(target):
                self._check_ref(node, f"{self.m.resolve(dotted_name(target))}.{name}")
        elif not self._own(target):
            self.bad(node, f"getattr() with a computed name on {shown}: allowed only on the candidate's own objects "
                           "(self in its methods, a name bound only to its load_inline/load extension); elsewhere "
                           "name the attribute")

    # writes to module attributes (monkeypatching torch, time, builtins...)
    def _check_target(self, t: ast.AST, assign: bool = False):
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self._check_target(e)
            return
        if isinstance(t, ast.Attribute):
            root = _root(t)
            full = self.m.resolve(dotted_name(t)) if dotted_name(t) else ""
            if full.startswith("torch.backends.") and full.rsplit(".", 1)[-1] in NUMERICS_SETTINGS:
                self.bad(t, f"sets {full}: changes numerics against the reference, which runs with PyTorch's "
                            f"defaults ({NUMERICS_SETTINGS[full.rsplit('.', 1)[-1]]}); leave it at its default "
                            "(torch.backends.cudnn.benchmark is fine)")
            elif assign and full in SAFE_SETTINGS:
                pass  # picks algorithms, not precision
            elif isinstance(root, ast.Name) and root.id in self.m.imported:
                self.bad(t, f"assigns {ast.unparse(t)} (monkeypatching {self.m.imported[root.id]})")
            elif t.attr.startswith("__") and t.attr.endswith("__"):  # e.g. an alias of torch.Tensor
                self.bad(t, f"assigns {ast.unparse(t)} (monkeypatching a special method)")
        if isinstance(t, ast.Subscript):
            root = _root(t)
            if isinstance(root, ast.Name) and root.id in self.m.imported and dotted_name(t.value) != "os.environ":
                self.bad(t, f"assigns into {ast.unparse(t.value)}")

    def visit_Assign(self, node: ast.Assign):
        for t in node.targets:
            self._check_target(t, assign=True)
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
            self._check_ref(node, self.m.resolve(dotted))
        elif node.attr.startswith(BANNED_NAME_PREFIXES):
            self.bad(node, f"uses {node.attr} (harness internals)")
        elif node.attr in BANNED_DISPATCH:
            self.bad(node, f"uses {node.attr}: runs an op past the dispatcher's op trace (call the op itself)")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name):
        if node.id in ("__builtins__", "__loader__"):
            self.bad(node, f"uses {node.id}")
        if not isinstance(node.ctx, ast.Load):
            return
        parent = self.m.parent.get(node)
        mod = self.m.imported.get(node.id)
        if mod in ATTRIBUTE_ONLY and not (isinstance(parent, ast.Attribute) and parent.value is node):
            hint = f"; {_THREADS}" if mod in THREAD_MODULES else ""
            self.bad(node, f"uses the {mod} module as a value (an alias, an argument, getattr): name its members "
                           f"directly ({mod}.name) so the check can see which{hint}")
        if node.id in _ATTR_BUILTINS and not self.m.kinds.get(node.id) and not (
                isinstance(parent, ast.Call) and parent.func is node):
            self.bad(node, f"uses {node.id} as a value: call it directly, so the check can see what it reaches")


class _NativeSources:
    """The strings that become native code: load_inline's sources and what is written to files (which `load`
    builds), traced through names, concatenation, f-strings and string methods. `complete` is False where one
    could not be traced (a parameter, a file read, `__doc__`, load_inline reached under another name)."""

    def __init__(self, tree: ast.AST, mod: _Module):
        self.m = mod
        self.strings: list[str] = []
        self.complete = True
        for n in ast.walk(tree):
            for arg in self._sink_args(n):
                got = self._strings(arg, ())
                if got is None:
                    self.complete = False
                else:
                    self.strings += got
            if self._loader_ref(n) and not (isinstance(self.m.parent.get(n), ast.Call)
                                            and self.m.parent[n].func is n):
                self.complete = False  # load_inline bound to another name or passed on: its calls are not seen
            if isinstance(n, ast.Constant) and n.value == "load_inline":
                self.complete = False  # getattr(cpp_extension, "load_inline")

    def _loader_ref(self, n: ast.AST) -> bool:
        if isinstance(n, ast.Name):
            return self.m.resolve(n.id).rsplit(".", 1)[-1] == "load_inline"
        return isinstance(n, ast.Attribute) and n.attr == "load_inline"

    def _sink_args(self, n: ast.AST) -> list[ast.expr]:
        if not isinstance(n, ast.Call):
            return []
        func, kw = n.func, n.keywords
        if self._loader_ref(func):
            return [*n.args[1:3], *(k.value for k in kw if k.arg is None or k.arg.endswith("_sources"))]
        if isinstance(func, ast.Attribute) and func.attr in _WRITE_METHODS:
            return [] if self._console(func.value) else [*n.args, *(k.value for k in kw)]
        name = dotted_name(func) or ""
        file = next((k.value for k in kw if k.arg == "file"), None)
        if name == "print" and file is not None and not self._console(file) \
                or name.rsplit(".", 1)[-1] in ("StringIO", "BytesIO"):
            return list(n.args)
        return []

    def _console(self, node: ast.AST) -> bool:
        """sys.stdout / sys.stderr: messages, not files a build reads."""
        return self.m.resolve(dotted_name(node) or "") in ("sys.stdout", "sys.stderr")

    def _strings(self, node: ast.AST, seen: tuple) -> list[str] | None:
        """The string constants `node` may be built from; None when that cannot be told."""
        if isinstance(node, ast.Constant):
            v = node.value
            return [v] if isinstance(v, str) else [v.decode("latin-1")] if isinstance(v, bytes) else []
        if isinstance(node, ast.Name):  # every value a name bound only by assignment gets
            if node.id in seen:
                return []  # already being traced
            if self.m.kinds.get(node.id) != {"assign"}:
                return None
            return self._each(self.m.values[node.id], (*seen, node.id))
        if isinstance(node, ast.Starred):
            return self._strings(node.value, seen)
        parts = self._string_parts(node)
        return None if parts is None else self._each(parts, seen)

    def _each(self, nodes, seen: tuple) -> list[str] | None:
        """The strings of all of `nodes`; None when those of one cannot be told."""
        out = []
        for x in nodes:
            got = self._strings(x, seen)
            if got is None:
                return None
            out += got
        return out

    def _string_parts(self, node: ast.AST) -> list[ast.AST] | None:
        """The expressions a string-building node (f-string, concatenation, container, conditional, string method)
        is made of; None for any other node."""
        if isinstance(node, ast.JoinedStr):
            return node.values
        if isinstance(node, ast.FormattedValue):
            return [node.value] + ([node.format_spec] if node.format_spec else [])
        if isinstance(node, ast.BinOp):
            return [node.left, node.right]
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return node.elts
        if isinstance(node, ast.Dict):
            return node.values
        if isinstance(node, ast.IfExp):
            return [node.body, node.orelse]
        if isinstance(node, ast.Call):
            return self._call_parts(node)
        return None

    def _call_parts(self, node: ast.Call) -> list[ast.AST] | None:
        """A string method's receiver and arguments (only the arguments where the receiver is an imported module:
        `textwrap.dedent(SRC)`), or str()/bytes()/dedent()'s arguments; None for any other call."""
        func = node.func
        args = [*node.args, *(k.value for k in node.keywords)]
        if isinstance(func, ast.Attribute) and func.attr in _STR_METHODS:
            receiver = func.value
            if isinstance(receiver, ast.Name) and self.m.kinds.get(receiver.id) == {"import"}:
                return args
            return [receiver, *args]
        if isinstance(func, ast.Name) and func.id in ("str", "bytes", "dedent"):
            return args
        return None


def check_native(tree: ast.AST, mod: _Module) -> list[str]:
    sources = _NativeSources(tree, mod)
    strings = sources.strings
    note = ""
    if not sources.complete:  # read every string, Python text included
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and ("{" in n.value or ";" in n.value)]
        note = (" (every string of the module was read, Python text included: the strings given to load_inline or "
                "written to files could not all be traced to literals or module-level names)")
    problems = []
    for src in strings:
        code = _COMMENT_RE.sub("", src)
        for pat, what in _NATIVE_BANNED:
            m = pat.search(code)
            if m:
                problems.append(f"native source {what} (`{m.group(0).strip()}`){note}")
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
    mod = _Module(tree)
    checker = _Checker(mod)
    checker.visit(tree)
    res.reasons.extend(checker.problems)
    res.reasons.extend(check_native(tree, mod))
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
