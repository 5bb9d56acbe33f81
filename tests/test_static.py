"""Static checks: whole exploit classes refused before anything runs, honest code (try/except, pass) accepted."""

import pytest

from musacoder.verifier.static import check_source
from musacoder.verifier.verdict import Status

HEAD = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"


def model_new(body: str, bases: str = "nn.Module", prelude: str = "") -> str:
    return HEAD + prelude + f"\nclass ModelNew({bases}):\n    def __init__(self):\n        super().__init__()\n" \
        + "    def forward(self, x):\n" + "\n".join("        " + ln for ln in body.splitlines()) + "\n"


def native(cpp: str) -> str:
    """A candidate whose load_inline gets `cpp` (C++ text, written as it appears inside a Python string)."""
    return model_new("return ext.f(x)", prelude=f"SRC = '{cpp}'\next = load_inline(name='e', cpp_sources=SRC)\n")


def test_honest_try_except_and_pass_are_fine():
    src = model_new("try:\n    y = ext.relu(x)\nexcept RuntimeError as e:\n    raise ValueError('bad') from e\n"
                    "if y is None:\n    pass\nreturn y", prelude="import os\nos.environ['X'] = '1'\n")
    assert check_source(src).ok, check_source(src).reason


@pytest.mark.parametrize("src, needle", [
    (HEAD + "x = 1\n", "no top-level `class ModelNew`"),
    (HEAD + "class Model(nn.Module):\n    pass\nModelNew = Model\n", "alias"),
    (model_new("return super().forward(x)", bases="Model"), "subclasses Model"),
    (model_new("return Model.forward(self, x)"), "refers to the reference class Model"),
    (model_new("return x", prelude="exec('import os')\n"), "calls exec()"),
    (model_new("return x", prelude="import threading\nthreading.Thread(target=print).start()\n"), "threading.Thread"),
    (model_new("return x", prelude="from concurrent.futures import ThreadPoolExecutor\n"), "concurrent.futures"),
    (model_new("return x", prelude="import subprocess\n"), "imports subprocess"),
    (model_new("return x", prelude="import os\nos.system('ls')\n"), "os.system"),
    (model_new("return x", prelude="import os as o\no.fork()\n"), "os.fork"),
    (model_new("return x", prelude="import ctypes\n"), "imports ctypes"),
    (model_new("return x", prelude="T = torch.Tensor\nT.__invert__ = lambda s: s\n"), "special method"),
    (model_new("return x", prelude="torch.cuda.synchronize = lambda: None\n"), "monkeypatching torch"),
    (model_new("return x", prelude="import time as t\nt.perf_counter = lambda: 0.0\n"), "monkeypatching time"),
    (model_new("return x", prelude="setattr(torch.cuda.Event, 'elapsed_time', lambda a, b: 0.001)\n"), "setattr"),
    (model_new("return x", prelude="import time\nf = getattr(time, 'perf_' + 'counter')\n"), "computed name"),
    (model_new("return x", prelude="torch.backends.cuda.matmul.allow_tf32 = True\n"), "allow_tf32"),
    (model_new("return x.__class__.__subclasses__()"), "introspection"),
    (model_new("return x", prelude="import sys\nsys._getframe(1)\n"), "sys._getframe"),
    (model_new("return x", prelude="import builtins\n"), "imports builtins"),
    (native("#include <thread>\\nvoid f(){ std::thread t([]{}); t.detach(); }"), "native thread"),
    (native('int f(){ return system(\\"rm -rf /\\"); }'), "spawns a process"),
    (native('void f(){ FILE* f = fopen(\\"x\\", \\"w\\"); }'), "touches files"),
])
def test_refused(src, needle):
    res = check_source(src)
    assert not res.ok
    assert needle in res.reason, res.reason


def test_syntax_error_is_format_error():
    res = check_source("class ModelNew(:\n")
    assert res.status is Status.FORMAT_ERROR and "syntax error" in res.reason


def test_native_comments_are_not_code():
    src = native("// no std::thread here\\n/* system( */ int f(){return 0;}")
    assert check_source(src).ok


def test_exploits_are_illegal_not_format_errors():
    res = check_source(model_new("return x", bases="Model"))
    assert res.status is Status.ILLEGAL


@pytest.mark.parametrize("src, needle", [
    (model_new("return x", prelude="from torch.utils._python_dispatch import TorchDispatchMode\n"), "_python_dispatch"),
    (model_new("return x", prelude="import torch.utils._python_dispatch as pd\n"), "_python_dispatch"),
    (model_new("return torch.utils._python_dispatch._get_current_dispatch_mode()"), "_python_dispatch"),
    (model_new("return x", prelude="m = torch._C._get_dispatch_mode(None)\n"), "torch._C"),
    (model_new("return x", prelude="from torch._C import _get_torch_dispatch_mode\n"), "torch._C"),
    (model_new("return x", prelude="on = torch.autograd.profiler._profiler_enabled\n"), "torch.autograd.profiler"),
    (model_new("return x", prelude="from torch.profiler import profile\n"), "torch.profiler"),
    (model_new("return x", prelude="import torch.profiler as p\n"), "torch.profiler"),
    (model_new("return x", prelude="s = torch._C._autograd._profiler_enabled()\n"), "torch._C"),
    (model_new("return x", prelude="from some.where import _get_current_dispatch_mode_stack\n"),
     "_get_current_dispatch_mode_stack"),
    (model_new("return x", prelude="f = mod._profiler_enabled\n"), "_profiler_enabled"),
    (model_new("return x", prelude="import sys as s\nf = s._getframe(1)\n"), "sys._getframe"),
    (model_new("return x", prelude="import traceback\nfs = traceback.walk_stack(None)\n"), "walks stack frames"),
    (model_new("return x", prelude="import torch.utils.cpp_extension as ce\nce._jit_compile\n"),
     "torch.utils.cpp_extension"),
    (model_new("return x", prelude="f = getattr(frame, 'f_locals')\n"), "getattr() of f_locals"),
    (model_new("return x", prelude="c = getattr(torch, '_C')\n"), "getattr() of _C"),
    (model_new("return x", prelude="c = getattr(torch.utils, '_python_dispatch')\n"), "getattr() of _python_dispatch"),
    (model_new("return x", prelude="c = getattr(torch.autograd, 'profiler')\n"), "torch.autograd.profiler"),
    (native("void f(){ std::jthread t([]{}); }"), "native thread"),
    (native("auto f = std::async(std::launch::async, []{});"), "native thread"),
    (native("std::vector<std::thread> pool;"), "native thread"),
])
def test_refused_harness_internals(src, needle):
    res = check_source(src)
    assert not res.ok and needle in res.reason, res.reason


@pytest.mark.parametrize("prelude, body", [
    ("SRC = 'int n = (int)std::thread::hardware_concurrency(); std::thread::id me;'\n", "return ext.f(x)"),
    ("torch.ops.load_library('x.so')\next = torch.utils.cpp_extension.load_inline(name='e', cpp_sources='')\n"
     "from torch.utils.cpp_extension import load\n", "return ext.f(x, x.data_ptr(), torch.empty_like(x))"),
    ("import triton\nimport triton.language as tl\n\n@triton.jit\ndef k(p):\n    tl.store(p, 1.0)\n",
     "k[(1,)](x)\nreturn x"),
    ("", "y = getattr(self, 'weight')\nreturn x.split_with_sizes([1, 1])[0].unfold(0, 1, 1).diagonal()"),
    # sources written to a private temporary directory for cpp_extension.load (the process is sandboxed)
    ("import tempfile\nd = tempfile.mkdtemp()\nwith open(d + '/k.cpp', 'w') as f:\n    f.write('int x;')\n", "return x"),
])
def test_honest_torch_use_passes(prelude, body):
    res = check_source(model_new(body, prelude=prelude))
    assert res.ok, res.reason


def test_view_ops_allowed_and_compute_is_not():
    from musacoder.verifier.legality import ALLOWED_OPS

    views = {"split_with_sizes", "unfold", "diagonal", "view_as_real", "view_as_complex", "movedim", "swapaxes",
             "swapdims", "unflatten"}
    assert views <= ALLOWED_OPS
    assert not {"relu", "mm", "addmm", "split_copy", "diagonal_copy", "unfold_copy", "sum", "mul", "cat"} & ALLOWED_OPS


def test_view_ops_trace_legal():
    """The honest wrapper's zero-copy views dispatch only allowlisted ops (aten names after decomposition)."""
    import torch

    from musacoder.backends import get_backend
    from musacoder.verifier.legality import OpTrace

    x = torch.rand(4, 8)
    # the cpu backend's namespaces: a process configures the dispatcher tracer once (test_tracer.py shares this one)
    with OpTrace(get_backend("cpu").torch_namespaces) as tr:
        y = torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2)))).flatten(-2)
        y.split_with_sizes([2, 2]), y.unfold(1, 2, 2), y.diagonal(), y.movedim(0, 1), y.swapaxes(0, 1)
        torch.swapdims(y, 0, 1), torch.tensor_split(y, 2)
    assert tr.illegal() == [], tr.ops
    assert torch.equal(y, x)


EXT = "ext = load_inline(name='e', cpp_sources='int x;')\n"


@pytest.mark.parametrize("prelude, body", [
    # a lock (and friends) around a lazy build
    ("import threading\n_lock = threading.Lock()\n_ev, _l = threading.Event(), threading.local()\n", "return x"),
    ("from threading import RLock as R\nimport _thread\n_a, _b = R(), _thread.allocate_lock()\n", "return x"),
    # deleting its own temporary files
    ("import os\nimport shutil\nimport tempfile\nd = tempfile.mkdtemp()\nos.remove(d + '/a')\nos.unlink(d + '/b')\n"
     "shutil.rmtree(d, ignore_errors=True)\n", "return x"),
    # printing a build failure
    ("import sys\nimport traceback\ntry:\n    " + EXT + "except RuntimeError:\n    traceback.print_exc()\n"
     "    sys.stderr.write(traceback.format_exc())\n    raise\n", "return x"),
    # its own attribute, its own extension by a computed name
    ("", "self.tmp = x\ndelattr(self, 'tmp')\nreturn getattr(ext, 'f' + '')(x)"),
    ("", "self.e = load_inline(name='e', cpp_sources='int x;')\nreturn getattr(self.e, self.__module__)(x)"),
    # picks algorithms, not precision
    ("torch.backends.cudnn.benchmark = True\ntorch.backends.cudnn.deterministic = True\n"
     "torch.set_float32_matmul_precision('highest')\n", "return x"),
])
def test_honest_idioms_pass(prelude, body):
    res = check_source(model_new(body, prelude=EXT + prelude))
    assert res.ok, res.reason


@pytest.mark.parametrize("prelude, needle", [
    # a thread, however it is spelled: the reason says a lock is fine
    ("import threading as th\nclass W(th.Thread):\n    pass\n", "threading.Thread"),
    ("from threading import Timer\n", "threading.Timer"),
    ("import threading\nt = threading\nT = getattr(t, 'Thr' + 'ead')\n", "threading module as a value"),
    ("import threading\nT = getattr(threading, 'Thread')\n", "threading.Thread"),
    ("from threading import *\n", "imports * from threading"),
    ("from _thread import start_new_thread as go\n", "_thread.start_new_thread"),
    ("import concurrent.futures as cf\nex = cf.ThreadPoolExecutor(1)\n", "concurrent.futures"),
    ("import threading\nthreading._start_new_thread(print, ())\n", "threading._start_new_thread"),
    ("t = torch.cuda.threading.Thread(target=print)\n", "reaches the threading module through another module"),
    # other processes, and what the sandbox does not confine
    ("import os\nos.setpriority(os.PRIO_PROCESS, 1, 19)\n", "reaches other processes"),
    ("import os\no = os\no.kill(1, 9)\n", "os module as a value"),
    ("import os\ngetattr(os, 'kill')(1, 9)\n", "os.kill"),
    ("torch.cuda.os.kill(1, 9)\n", "reaches the os module"),
    ("import shutil\nshutil.copymode('a', 'b')\n", "permissions"),
    ("import os\nos.chmod('a', 0)\n", "permissions"),
    # frames
    ("import traceback\nfor f in traceback.walk_tb(None):\n    pass\n", "walks stack frames"),
    ("import traceback\ne = traceback.TracebackException(None, None, None, capture_locals=True)\n", "capture_locals"),
    ("async def a():\n    yield 1\nb = a().ag_frame\n", "ag_frame"),
    # attributes of what is not the candidate's
    ("delattr(torch.cuda, 'synchronize')\n", "delattr() on torch.cuda"),
    ("def f(self):\n    delattr(self, 'relu')\nf(torch)\n", "delattr() on self"),
    ("f = getattr(torch, 'r' + 'elu')\n", "computed name on torch"),
    ("ext = torch\nf = getattr(ext, 'r' + 'elu')\n", "computed name on ext"),
    ("def load_inline(**k):\n    return torch\nmine = load_inline()\nf = getattr(mine, 'r' + 'elu')\n", "computed name"),
    ("g = getattr\nf = g(torch, 'relu')\n", "getattr as a value"),
    ("import operator\nf = operator.attrgetter('_C')(torch)\n", "operator.attrgetter"),
    ("c = torch.__getattribute__('_C')\n", "__getattribute__"),
    # numerics against the reference
    ("torch.backends.cudnn.allow_tf32 = True\n", "TF32"),
    ("import torch.backends.cuda as bc\nbc.matmul.allow_bf16_reduced_precision_reduction = True\n", "reduced precision"),
    ("torch.set_float32_matmul_precision('high')\n", "set_float32_matmul_precision"),
    ("torch.set_flush_denormal(True)\n", "denormals"),
    ("with torch.backends.cudnn.flags(enabled=True, benchmark=True):\n    pass\n", "allow_tf32=False"),
])
def test_refused_with_a_reason(prelude, needle):
    res = check_source(model_new("return x", prelude=EXT + prelude))
    assert res.status is Status.ILLEGAL and needle in res.reason, res.reason


DOC = '"""Streams once through the memory system; starts no process (system(), fork()), no std::thread, fopen()."""\n'


def test_python_text_is_not_native_source():
    """Docstrings and messages mention processes, threads and files; only strings that reach a build are C++."""
    src = DOC + model_new("return ext.f(x)", prelude="SRC = 'int f(){ return 0; }'\nMSG = 'cannot open (x); fork ('\n"
                          "ext = load_inline(name='e', cpp_sources=[SRC])\n")
    assert check_source(src).ok, check_source(src).reason


@pytest.mark.parametrize("prelude", [
    # traced through names, f-strings, joins, +=, and files written for cpp_extension.load
    "N = 4\nA = 'int f(){{ return system(\"ls\") + {N}; }}'\nSRC = f'{A}'\next = load_inline('e', SRC)\n",
    "A = 'int g();'\nA += '\\nint f(){ return system(\"ls\"); }'\next = load_inline('e', '\\n'.join([A]))\n",
    "SRC = 'int f(){ return system(\"ls\"); }'\nwith open('k.cpp', 'w') as f:\n    f.write(SRC)\n",
    # untraceable sources: every string is read, the docstring included
    "ext = load_inline(name='e', cpp_sources=ModelNew.__doc__)\n",
    "li = load_inline\next = li('e', ModelNew.__doc__)\n",
    "def build(src):\n    return load_inline('e', src)\n",
])
def test_native_sources_are_traced(prelude):
    doc = '"""int f(){ return system(\\"ls\\"); }"""\n' if "system" not in prelude else ""
    res = check_source(doc + model_new("return x", prelude=prelude))
    assert res.status is Status.ILLEGAL and "spawns a process" in res.reason, res.reason
    assert ("every string of the module was read" in res.reason) == bool(doc), res.reason


@pytest.mark.parametrize("expr", [
    "torch.ops.aten.mm.default.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), a, b)",
    "torch.ops.aten.mm.default._op_dk(1, a, b)",
    "(lambda op: op._handle.redispatch_boxed)(torch.ops.aten.mm.default)",
])
def test_running_an_op_past_the_dispatchers_trace_is_refused(expr):
    src = f"import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n        return {expr}\n"
    r = check_source(src)
    assert not r.ok and "past the dispatcher's op trace" in r.reason, r.reason


def test_importing_the_harness_is_refused():
    r = check_source("import musacoder.verifier.legality as L\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                     "    def forward(self, x):\n        return x\n")
    assert not r.ok and "imports musacoder" in r.reason, r.reason
