"""The op trace at the dispatcher (legality.OpTrace over optrace.cpp): what it counts, what it sees that the Python
dispatch mode did not, and that native code cannot blind it. In-process: the tracer is built once per session into
the session's cache (legality.ensure_tracer) and named through MUSACODER_OPTRACE_LIB, as the judge names it."""

import importlib.util
import threading
from pathlib import Path

import pytest
import torch

from musacoder.backends import get_backend
from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.verifier import legality
from musacoder.verifier.legality import ALLOWED_OPS, OpTrace

NS = get_backend("cpu").torch_namespaces


@pytest.fixture(scope="session")
def tracer_lib(cache_dir):
    return legality.ensure_tracer(cache_dir)


@pytest.fixture
def dispatcher(tracer_lib, monkeypatch):
    monkeypatch.setenv(legality.TRACER_ENV, tracer_lib)


def traced(fn, *args):
    """(ops the dispatcher trace counts, ops the Python dispatch mode counts) for one call, under no_grad as forward."""
    out = []
    for env in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            if not env:
                mp.delenv(legality.TRACER_ENV, raising=False)
            with torch.no_grad(), OpTrace(NS) as t:
                fn(*args)
            out.append(dict(t.ops))
    return out


X = torch.randn(16, 32)
# Honest uses of allowlisted ops: the dispatcher trace names them as the Python mode did (decompositions included),
# and what they run inside themselves (zeros -> empty, zero_; randn -> normal_) is not counted.
HONEST = {
    "zeros": lambda: torch.zeros(4), "empty_like": lambda: torch.empty_like(X), "full_like": lambda: torch.full_like(X, 2),
    "rand": lambda: torch.rand(4), "randn": lambda: torch.randn(4), "randint": lambda: torch.randint(0, 9, (4,)),
    "arange": lambda: torch.arange(0, 1, 0.1), "clone": lambda: X.clone(), "copy_": lambda: torch.empty_like(X).copy_(X),
    "transpose_contiguous": lambda: X.T.contiguous(), "reshape_copy": lambda: X.t().reshape(-1),
    "to_double": lambda: X.to(torch.float64), "item": lambda: X[0, 0].item(), "split": lambda: X.split(4),
    "chunk": lambda: X.chunk(3, dim=1), "unbind": lambda: X.unbind(0), "view_as_real": lambda: torch.view_as_real(X.cfloat()),
    "new_zeros": lambda: X.new_zeros(3), "movedim": lambda: X.movedim(0, 1), "unflatten": lambda: X.unflatten(1, (4, 8)),
    "dropout_eval": lambda: torch.nn.functional.dropout(X, 0.5, False),
}


@pytest.mark.parametrize("name", HONEST)
def test_allowlisted_ops_are_named_as_the_python_mode_named_them(name, dispatcher):
    native, mode = traced(HONEST[name])
    assert native == mode and not OpTrace.illegal_names(native, NS), (native, mode)
    assert all(op.partition("::")[2] in ALLOWED_OPS for op in native)


def test_tensor_literals_stay_legal(dispatcher):
    """torch.tensor builds its tensor under a guard the Python mode could not see through; the dispatcher trace sees
    empty and detach_ there (both allowlisted)."""
    native, mode = traced(lambda: torch.tensor([1.0, 2.0]))
    assert mode == {"aten::lift_fresh": 1}
    assert native == {"aten::empty": 1, "aten::lift_fresh": 1, "aten::detach_": 1}
    assert not OpTrace.illegal_names(native, NS)


def test_compute_ops_and_composites(dispatcher):
    """A composite op is seen as what it decomposes into (matmul -> mm); a helper of allowlisted ops called by forward
    itself is refused."""
    assert traced(torch.matmul, X, X.T) == [{"aten::mm": 1}] * 2
    native, _ = traced(lambda: torch.empty(4).uniform_())
    assert OpTrace.illegal_names(native, NS) == ["aten::uniform_"]


def test_allclose_is_judged_by_what_it_runs(dispatcher):
    """An allowlisted op whose kernel computes through other ops (allclose -> isclose's arithmetic) is judged by them."""
    native, mode = traced(torch.allclose, X, X)
    assert mode == {"aten::allclose": 1}
    assert {"aten::abs", "aten::sub", "aten::le"} <= set(OpTrace.illegal_names(native, NS))


def test_a_call_under_an_exclude_guard_is_seen(dispatcher):
    """The hole of issue 43 in Python: torch.relu with the Python dispatch keys excluded."""
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Python) | torch._C.DispatchKeySet(
        torch._C.DispatchKey.PythonTLSSnapshot)

    def hidden(x):
        with torch._C._ExcludeDispatchKeyGuard(keys):
            return torch.relu(x)

    native, mode = traced(hidden, X)
    assert mode == {} and native == {"aten::relu": 1}


def _example(name, monkeypatch):
    """An example's ModelNew, its own extension stood in for by one that computes nothing (no build here)."""
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "load_inline", lambda **kw: type("Ext", (), {"relu": staticmethod(len)}))
    spec = importlib.util.spec_from_file_location(f"mc_example_{name}", EXAMPLES_DIR / "cpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ModelNew()


@pytest.mark.parametrize("name", ["exploit_29_torch_dispatch_subclass", "exploit_29_aten_kernel_replaced"])
def test_compute_inside_an_allowlisted_op_is_seen(name, dispatcher, monkeypatch):
    """Candidate code running inside aten::clone (a tensor subclass's handler, a kernel it registered for the length
    of forward): the Python mode saw only the clone, the dispatcher trace sees the ReLU it runs."""
    model = _example(name, monkeypatch)
    native, mode = traced(model, X)
    assert mode == {"aten::slice": 1, "aten::clone": 1}  # the slice: the row its own kernel gets
    assert native == {**mode, "aten::relu": 1}
    assert torch.equal(model(X), torch.relu(X)) and torch.equal(X.clone(), X)  # it worked, and the kernel is back


def test_own_ops_count_and_so_does_what_they_call(dispatcher):
    lib = torch.library.Library("mc_tracer_py", "DEF")
    lib.define("f(Tensor x) -> Tensor")
    lib.impl("f", lambda x: torch.relu(torch.zeros_like(x)), "CompositeExplicitAutograd")
    try:
        with torch.no_grad(), OpTrace(NS) as t:
            torch.ops.mc_tracer_py.f(X)
    finally:
        lib._destroy()
    assert dict(t.ops) == {"mc_tracer_py::f": 1, "aten::zeros_like": 1, "aten::relu": 1}
    assert t.own_ops() == 1 and t.illegal() == ["aten::relu"]


def test_ops_on_other_threads_count(dispatcher):
    with torch.no_grad(), OpTrace(NS) as t:
        worker = threading.Thread(target=torch.relu, args=(X,))
        worker.start()
        worker.join()
    assert dict(t.ops) == {"aten::relu": 1}


def test_a_label_is_not_an_op_and_hides_nothing(dispatcher):
    from torch.autograd.profiler import record_function

    with torch.no_grad(), OpTrace(NS) as t, record_function("aten::clone"):
        torch.relu(X)
    assert dict(t.ops) == {"aten::relu": 1}


def test_a_window_is_closed_and_read_only_with_its_token(dispatcher):
    """Code that reaches the library (the candidate's own process) cannot close, read, restart or reconfigure the
    harness's window."""
    trace = OpTrace(NS)
    lib = trace._lib
    with torch.no_grad(), trace:
        assert lib.musacoder_optrace_stop(trace._token ^ 2) == -1
        assert lib.musacoder_optrace_read(trace._token, None, 0) == -1
        assert lib.musacoder_optrace_start(12345) == -1
        assert lib.musacoder_optrace_configure(b"", b"") == -1
        torch.relu(X)
    assert dict(trace.ops) == {"aten::relu": 1}


def test_without_the_library_the_python_mode_traces(monkeypatch):
    monkeypatch.delenv(legality.TRACER_ENV, raising=False)
    assert legality.tracer_kind() == "python dispatch mode" and not legality.dispatcher_traced()
    with torch.no_grad(), OpTrace(NS) as t:
        torch.relu(X)
    assert dict(t.ops) == {"aten::relu": 1}


def test_the_library_is_built_once(tracer_lib, cache_dir):
    assert legality.ensure_tracer(cache_dir) == tracer_lib and Path(tracer_lib).is_file()


def test_no_compiler_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    with pytest.raises(legality.TracerUnavailable, match="no C\\+\\+ compiler"):
        legality.ensure_tracer(tmp_path)


# --- native code (slow: one extension build) --------------------------------------------------------------------

NATIVE = r"""
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>

static c10::DispatchKeySet python_keys() {
    return c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot});
}
torch::Tensor callback_hidden(torch::Tensor x, py::object fn) {
    c10::impl::ExcludeDispatchKeyGuard g(python_keys());
    return fn(x).cast<torch::Tensor>();
}
torch::Tensor aten_hidden(torch::Tensor x) {
    c10::impl::ExcludeDispatchKeyGuard g(python_keys());
    return at::relu(x);
}
torch::Tensor clone_replaced(torch::Tensor x) {  // aten::clone's CPU kernel is a ReLU while this runs
    torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__, __LINE__);
    lib.impl("clone", [](const at::Tensor& t, std::optional<at::MemoryFormat>) { return at::relu(t); });
    return x.clone();
}
torch::Tensor forged(torch::Tensor x) {  // a RecordFunction posing as aten::clone around a ReLU
    static const c10::FunctionSchema schema = torch::jit::parseSchema("aten::clone(Tensor self) -> Tensor");
    at::RecordFunction rf(at::RecordScope::FUNCTION);
    rf.before(std::cref(schema));
    return at::relu(x);
}
torch::Tensor labelled(torch::Tensor x) {
    RECORD_FUNCTION("aten::clone", std::vector<c10::IValue>());
    return at::relu(x);
}
torch::Tensor on_threads(torch::Tensor x) {
    auto y = torch::empty({4, x.numel()}, x.options());
    #pragma omp parallel for num_threads(4)
    for (int i = 0; i < 4; i++) y.select(0, i).copy_(at::relu(x.reshape({-1})));
    return y;
}
at::Tensor own_relu(const at::Tensor& x) { return at::relu(x); }
at::Tensor own_zeros(const at::Tensor& x) { return at::zeros_like(x); }
TORCH_LIBRARY(mc_tracer_cpp, m) {
    m.def("relu(Tensor x) -> Tensor");
    m.def("zeros(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(mc_tracer_cpp, CPU, m) {
    m.impl("relu", &own_relu);
    m.impl("zeros", &own_zeros);
}
"""


@pytest.mark.slow  # one extension build (~40 s of CI's 2 cores); the exploit suite builds exploit_29 in CI
def test_native_code_cannot_hide_an_op(cache_dir, dispatcher):
    from torch.utils.cpp_extension import load_inline

    root = Path(cache_dir) / "tracer" / "mc_tracer_native"
    root.mkdir(parents=True, exist_ok=True)
    ext = load_inline(name="mc_tracer_native", cpp_sources=NATIVE, build_directory=str(root),
                      functions=["callback_hidden", "aten_hidden", "clone_replaced", "forged", "labelled", "on_threads"],
                      extra_cflags=["-O2", "-fopenmp"], extra_ldflags=["-fopenmp"])
    relu = {"aten::relu": 1}
    cases = {  # call -> (dispatcher trace, Python mode)
        "callback_hidden": (lambda: ext.callback_hidden(X, torch.relu), relu, {}),
        "aten_hidden": (lambda: ext.aten_hidden(X), relu, {}),
        "clone_replaced": (lambda: ext.clone_replaced(X), {"aten::clone": 1, **relu}, {"aten::clone": 1}),
        "forged": (lambda: ext.forged(X), {"aten::<forged aten::clone>": 1, **relu}, relu),
        "labelled": (lambda: ext.labelled(X), relu, relu),
        "own_relu": (lambda: torch.ops.mc_tracer_cpp.relu(X), {"mc_tracer_cpp::relu": 1, **relu},
                     {"mc_tracer_cpp::relu": 1}),
        "own_zeros": (lambda: torch.ops.mc_tracer_cpp.zeros(X), {"mc_tracer_cpp::zeros": 1, "aten::zeros_like": 1},
                      {"mc_tracer_cpp::zeros": 1}),
    }
    for name, (call, want_native, want_mode) in cases.items():
        assert traced(call) == [want_native, want_mode], name
    native, _ = traced(ext.on_threads, X)  # OpenMP workers start with an empty op stack of their own
    assert native["aten::relu"] == 4 and not set(OpTrace.illegal_names(native, NS)) - {"aten::relu"}
    assert torch.equal(ext.clone_replaced(X), torch.relu(X)) and torch.equal(X.clone(), X)


# --- GPU: what allowlisted ops run inside themselves on a device ----------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", HONEST)
def test_allowlisted_ops_on_cuda(name, dispatcher, monkeypatch):
    monkeypatch.setitem(globals(), "X", X.cuda())
    with torch.device("cuda"):
        native, mode = traced(HONEST[name])
    assert not OpTrace.illegal_names(native, NS), (native, mode)
