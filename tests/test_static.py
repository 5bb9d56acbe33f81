"""Static checks: whole exploit classes refused before anything runs, honest code (try/except, pass) accepted."""

import pytest

from musacoder.verifier.static import check_source
from musacoder.verifier.verdict import Status

HEAD = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"


def model_new(body: str, bases: str = "nn.Module", prelude: str = "") -> str:
    return HEAD + prelude + f"\nclass ModelNew({bases}):\n    def __init__(self):\n        super().__init__()\n" \
        + "    def forward(self, x):\n" + "\n".join("        " + ln for ln in body.splitlines()) + "\n"


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
    (model_new("return x", prelude="import threading\n"), "imports threading"),
    (model_new("return x", prelude="from concurrent.futures import ThreadPoolExecutor\n"), "imports concurrent"),
    (model_new("return x", prelude="import subprocess\n"), "imports subprocess"),
    (model_new("return x", prelude="import os\nos.system('ls')\n"), "os.system"),
    (model_new("return x", prelude="import os as o\no.fork()\n"), "os.fork"),
    (model_new("return x", prelude="f = open('/tmp/x', 'w')\n"), "opens a file for writing"),
    (model_new("return x", prelude="import ctypes\n"), "imports ctypes"),
    (model_new("return x", prelude="torch.cuda.synchronize = lambda: None\n"), "monkeypatching torch"),
    (model_new("return x", prelude="import time as t\nt.perf_counter = lambda: 0.0\n"), "monkeypatching time"),
    (model_new("return x", prelude="setattr(torch.cuda.Event, 'elapsed_time', lambda a, b: 0.001)\n"), "setattr"),
    (model_new("return x", prelude="import time\nf = getattr(time, 'perf_' + 'counter')\n"), "computed name"),
    (model_new("return x", prelude="torch.backends.cuda.matmul.allow_tf32 = True\n"), "allow_tf32"),
    (model_new("return x.__class__.__subclasses__()"), "introspection"),
    (model_new("return x", prelude="import sys\nsys._getframe(1)\n"), "sys._getframe"),
    (model_new("return x", prelude="import builtins\n"), "imports builtins"),
    (model_new("return x", prelude="SRC = '#include <thread>\\nvoid f(){ std::thread t([]{}); t.detach(); }'\n"),
     "native thread"),
    (model_new("return x", prelude="SRC = 'int f(){ return system(\"rm -rf /\"); }'\n"), "spawns a process"),
    (model_new("return x", prelude="SRC = 'void f(){ FILE* f = fopen(\"x\", \"w\"); }'\n"), "touches files"),
])
def test_refused(src, needle):
    res = check_source(src)
    assert not res.ok
    assert needle in res.reason, res.reason


def test_syntax_error_is_format_error():
    res = check_source("class ModelNew(:\n")
    assert res.status is Status.FORMAT_ERROR and "syntax error" in res.reason


def test_native_comments_are_not_code():
    src = model_new("return ext.f(x)", prelude="SRC = '// no std::thread here\\n/* system( */ int f(){return 0;}'\n")
    assert check_source(src).ok


def test_exploits_are_illegal_not_format_errors():
    res = check_source(model_new("return x", bases="Model"))
    assert res.status is Status.ILLEGAL
