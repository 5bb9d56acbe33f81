"""Legality from the binary: import allowlist, kernel names from nvcc objects, profiler-name attribution."""

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from musacoder.backends.kernel_names import own_kernel, qualified_name
from musacoder.verifier.symbols import check_imports, library_symbols

# Imports of real honest builds (load_inline, torch 2.13 CPU; nvcc 13 object against torch's c10/cuda headers),
# the PyTorch part in full plus a sample of the libc/libstdc++/Python/OpenMP/CUDA-runtime part.
HONEST_CPU = [
    "at::TensorBase::__dispatch_contiguous(c10::MemoryFormat) const",
    "at::_ops::empty_like::call(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, "
    "std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
    "at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, "
    "std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
    "at::_ops::view::call(at::Tensor const&, c10::ArrayRef<c10::SymInt>)",
    "at::_ops::zeros::call(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, "
    "std::optional<c10::Device>, std::optional<bool>)",
    "at::_ops::split_with_sizes::call(at::Tensor const&, c10::ArrayRef<c10::SymInt>, long)",
    "c10::AutogradMetaInterface::~AutogradMetaInterface()", "c10::IValue::reportToTensorTypeError() const",
    "c10::SymBool::guard_bool(char const*, long) const", "c10::SymbolicShapeMeta::init_is_contiguous() const",
    "c10::TensorImpl::decref_pyobject() const", "c10::TensorType::get()", "c10::UndefinedTensorImpl::_singleton",
    "c10::detail::infer_schema::make_function_schema(c10::ArrayRef<c10::detail::infer_schema::ArgumentDef>, "
    "c10::ArrayRef<c10::detail::infer_schema::ArgumentDef>)",
    "c10::detail::torchCheckFail(char const*, char const*, unsigned int, char const*)",
    "c10::impl::ExcludeDispatchKeyGuard::ExcludeDispatchKeyGuard(c10::DispatchKeySet)",  # inline in torch::empty
    "c10::impl::ExcludeDispatchKeyGuard::~ExcludeDispatchKeyGuard()", "c10::impl::getGlobalPyInterpreter()",
    "caffe2::TypeMeta::error_unsupported_typemeta(caffe2::TypeMeta)", "float* at::TensorBase::data_ptr<float>() const",
    "long c10::detail::maybe_wrap_dim_slow<long>(long, long, bool)",
    "pybind11::detail::type_caster<at::Tensor, void>::load(pybind11::handle, bool)",
    "torch::Library::_impl(char const*, torch::CppFunction&&, torch::_RegisterOrVerify) &",
    "torch::CppFunction::~CppFunction()", "torch::PyWarningHandler::PyWarningHandler()",
    "torch::jit::parseSchema(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&, "
    "bool)", "torch::translate_exception_to_python(std::__exception_ptr::exception_ptr const&)",
    "vtable for torch::autograd::AutogradMeta", "std::thread::hardware_concurrency()", "GOMP_parallel",
    "omp_get_num_threads", "operator new(unsigned long)", "operator delete(void*, unsigned long)",
    "std::basic_ostream<char, std::char_traits<char> >& std::operator<< <std::char_traits<char> >"
    "(std::basic_ostream<char, std::char_traits<char> >&, char const*)", "typeinfo for std::runtime_error",
    "PyEval_GetBuiltins", "PyFrame_GetBack", "PyObject_GetAttrString", "_Py_Dealloc", "__cxa_throw", "memcpy",
    "vsnprintf", "expf", "pthread_mutex_lock", "__tls_get_addr", "Sleef_expf8_u10",
]
HONEST_CUDA = HONEST_CPU + [
    "at::_ops::clone::call(at::Tensor const&, std::optional<c10::MemoryFormat>)",
    "at::cuda::getCurrentDeviceProperties()", "c10::cuda::getCurrentCUDAStream(signed char)",
    "c10::cuda::ExchangeDevice(signed char)", "c10::cuda::CUDACachingAllocator::allocator",
    "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, unsigned int, bool)",
    "c10::cuda::CUDAStream::synchronize() const", "c10::impl::device_guard_impl_registry",
    "c10::impl::GPUTrace::gpuTraceState", "c10::warn(c10::Warning const&)",
    "c10::operator<<(std::ostream&, c10::Device const&)", "float* at::TensorBase::mutable_data_ptr<float>() const",
    "__cudaRegisterFunction", "__cudaLaunchKernel", "cudaGetLastError", "cudaStreamWaitEvent",
]


@pytest.mark.parametrize("backend, imports", [("cpu", HONEST_CPU), ("cuda", HONEST_CUDA)])
def test_honest_imports_pass(backend, imports):
    assert check_imports(imports, backend, traced=False) == [] and check_imports(imports, backend, traced=True) == []


@pytest.mark.parametrize("symbol, why", [
    ("at::_ops::relu::call(at::Tensor const&)", "aten::relu"),  # at::relu(x) / x.relu()
    ("at::_ops::addmm::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::Scalar const&, "
     "c10::Scalar const&)", "aten::addmm"),
    ("at::_ops::split_copy_Tensor::call(at::Tensor const&, c10::SymInt, long)", "split_copy"),  # a copy, not a view
    ("at::cpu::relu(at::Tensor const&)", "below the dispatcher"),
    ("at::native::relu(at::Tensor const&)", "below the dispatcher"),
    ("at::meta::relu(at::Tensor const&)", "below the dispatcher"),
    ("at::compositeexplicitautograd::relu(at::Tensor const&)", "below the dispatcher"),
    ("void at::cuda::blas::gemm<float>(char, char, long, long, long, float, float const*, long, float const*, long, "
     "float, float*, long)", "below the dispatcher"),
    ("at::cuda::getCurrentCUDABlasHandle()", "outside the allowlist"),
    ("at::detail::getCUDAHooks()", "outside the allowlist"),
    ("sgemm_", "BLAS"), ("dgemm_", "BLAS"), ("SGEMM_", "BLAS"), ("cblas_sgemm", "BLAS"), ("mkl_blas_sgemm", "BLAS"),
    ("vsExp", "BLAS"), ("spotrf_", "BLAS"),
    ("cublasSgemm_v2", "vendor"), ("cublasLtMatmul", "vendor"), ("cudnnConvolutionForward", "vendor"),
    ("cufftExecC2C", "vendor"), ("cusparseSpMM", "vendor"), ("cusolverDnSgetrf", "vendor"),
    ("dnnl_primitive_execute", "vendor"), ("xnn_run_operator", "vendor"),
    ("cutlass::library::Handle::gemm(int, int, int)", "vendor"), ("fbgemm::fbgemmPacked(int)", "vendor"),
    ("aoti_torch_cpu_relu", "stable C shim"), ("aoti_torch_call_dispatcher", "stable C shim"),
    ("dlopen", "at run time"), ("dlsym", "at run time"), ("dlvsym", "at run time"), ("dlmopen", "at run time"),
    ("c10::impl::IncludeDispatchKeyGuard::IncludeDispatchKeyGuard(c10::DispatchKeySet)", "dispatch state"),
    ("c10::impl::tls_set_dispatch_key_excluded(c10::DispatchKey, bool)", "dispatch state"),
    ("c10::impl::TorchDispatchModeTLS::pop_stack()", "dispatch state"),
    ("c10::Dispatcher::singleton()", "dispatch state"),
    ("PyEval_SetTrace", "Python"), ("PyEval_SetProfile", "Python"), ("_PyEval_SetProfile", "Python"),
    ("PySys_SetObject", "Python"), ("PyThreadState_SetAsyncExc", "Python"), ("PyRun_SimpleString", "Python"),
    ("PyImport_ImportModule", "Python"),
    ("at::globalContext()", "outside the allowlist"), ("c10::cuda::getCurrentCUDAStream(signed char)", "allowlist"),
    ("gloo::allreduce(int)", "vendor"), ("somelib::compute(float*)", "outside the allowlist"),
])
def test_refused_imports(symbol, why):
    problems = check_imports(["memcpy", symbol + "@GLIBC_2.2.5" if "::" not in symbol else symbol], "cpu", traced=False)
    assert len(problems) == 1 and problems[0].startswith(f"imports {symbol}: "), problems
    assert why in problems[0], problems


RELU_CALL = "at::_ops::relu::call(at::Tensor const&)"


@pytest.mark.parametrize("symbol, why", [
    (RELU_CALL, None),  # at::relu(x): the dispatcher trace sees it run, or it never runs
    ("at::_ops::addmm::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::Scalar const&, "
     "c10::Scalar const&)", None),
    ("at::_ops::relu::redispatch(c10::DispatchKeySet, at::Tensor const&)", "redispatch"),
    ("at::_ops::empty_like::redispatch(c10::DispatchKeySet, at::Tensor const&, std::optional<c10::ScalarType>, "
     "std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
     "redispatch"),  # allowlisted or not, a redispatch skips the trace
    ("at::enableRecordFunction(bool)", "RecordFunction"),  # DisableRecordFunctionGuard, RecordFunctionGuard(false)
    ("typeinfo for at::RecordFunctionGuard", "RecordFunction"),
    ("at::removeCallback(unsigned long)", "RecordFunction"), ("at::clearCallbacks()", "RecordFunction"),
    ("at::disableCallback(unsigned long)", "RecordFunction"),
    ("at::addGlobalCallback(at::RecordFunctionCallback)", "RecordFunction"),
    ("at::set_record_function_tls_(at::RecordFunctionTLS const&)", "RecordFunction"),
    ("at::ObservedOperators::getUnobservedOperatorList[abi:cxx11]()", "RecordFunction"),
    ("at::ThreadLocalStateGuard::ThreadLocalStateGuard(at::ThreadLocalState const&)", "dispatch state"),
    ("c10::Dispatcher::singleton()", "dispatch state"), ("at::cpu::relu(at::Tensor const&)", "below the dispatcher"),
    ("at::native::relu(at::Tensor const&)", "below the dispatcher"), ("sgemm_", "BLAS"),
    ("musacoder_optrace_stop", "op tracer"),
    ("at::RecordFunction::before(std::variant<std::basic_string_view<char, std::char_traits<char> >, "
     "std::reference_wrapper<c10::FunctionSchema const> >, long)", None),  # RECORD_FUNCTION labels
])
def test_imports_where_the_dispatcher_is_traced(symbol, why):
    """Dispatcher calls are fine once the trace sees them (a fallback that never runs costs nothing); what skips or
    blinds the trace, and compute below the dispatcher, stays refused."""
    problems = check_imports([symbol], "cpu", traced=True)
    assert (problems == []) if why is None else (len(problems) == 1 and why in problems[0]), problems


def test_traced_follows_the_environment(monkeypatch, tmp_path):
    from musacoder.verifier import legality, symbols

    monkeypatch.delenv(legality.TRACER_ENV, raising=False)
    untraced = symbols.policy()
    assert check_imports([RELU_CALL], "cpu")
    lib = tmp_path / "optrace.so"
    lib.touch()
    monkeypatch.setenv(legality.TRACER_ENV, str(lib))
    assert check_imports([RELU_CALL], "cpu") == []
    assert symbols.policy() != untraced  # records made untraced are judged again
    from musacoder.verifier.symbols import POLICY
    assert POLICY == symbols.policy()


def test_cuda_helpers_allowed_only_on_gpu_backends():
    sym = "c10::cuda::getCurrentCUDAStream(signed char)"
    assert check_imports([sym], "cuda") == [] and check_imports([sym], "cpu")


@pytest.mark.parametrize("sym, name", [
    ("float* at::TensorBase::data_ptr<float>() const", "at::TensorBase::data_ptr<float>"),
    ("void mine::k<float, 2>(at::Acc<float, 2, at::R>)", "mine::k<float,2>"),
    ("std::basic_ostream<char>& std::operator<< <std::char_traits<char> >(std::ostream&, char const*)",
     "std::operator__<std::char_traits<char>>"),
    ("(anonymous namespace)::kern(float*)", "{anon}::kern"),
    ("vtable for torch::autograd::AutogradMeta", "torch::autograd::AutogradMeta"),
    ("relu_kernel", "relu_kernel"),
])
def test_qualified_name(sym, name):
    assert qualified_name(sym) == name


KERNELS = [
    "mine::relu_kernel(float const*, float*, int)", "plain_c_kernel(float*)",
    "void mine::acc_kernel<float>(at::PackedTensorAccessor32<float, 2, at::RestrictPtrTraits>)",
]


@pytest.mark.parametrize("profiled, mine", [
    ("mine::relu_kernel(float const*, float*, int)", True),
    ("plain_c_kernel", True),  # extern "C": the profiler shows the bare name
    ("void mine::acc_kernel<float>(at::PackedTensorAccessor32<float, 2, at::RestrictPtrTraits>)", True),
    ("void mine::acc_kernel<float>(at::PackedTensorAccessor32<float,2,at::RestrictPtrTraits>)", True),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar"
     "(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()"
     "() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, float, "
     "std::array<char*, 2ul>)", False),
    ("ampere_sgemm_128x64_nn", False), ("Memcpy DtoD (Device -> Device)", False), ("relu_kernel", False),
])
def test_own_kernel(profiled, mine):
    assert own_kernel(profiled, KERNELS) is mine


def _run(cmd, cwd):
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_gpp_library_imports(tmp_path):
    """A plain shared object: dlsym and a hand-declared sgemm_ are undefined dynamic symbols, and refused."""
    (tmp_path / "x.cpp").write_text(textwrap.dedent("""
        #include <dlfcn.h>
        #include <cmath>
        extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
                               const float*, const int*, const float*, const int*, const float*, float*, const int*);
        extern "C" void* find(const char* s) { return dlsym(RTLD_DEFAULT, s); }
        extern "C" void mm(const float* a, float* c, int n) {
            float one = 1.f; sgemm_("N", "N", &n, &n, &n, &one, a, &n, a, &n, &one, c, &n); c[0] = std::exp(c[0]);
        }
    """))
    _run(["g++", "-shared", "-fPIC", "-O2", "-o", "x.so", "x.cpp"], tmp_path)
    syms = library_symbols(tmp_path / "x.so")
    assert {"dlsym", "sgemm_"} <= set(syms.imported) and {"find", "mm"} <= set(syms.defined)
    problems = check_imports(syms.imported, "cpu")
    assert sorted(p.split(":")[0] for p in problems) == ["imports dlsym", "imports sgemm_"], problems


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_nvcc_kernels(tmp_path):
    """__global__ names from a real nvcc object, at -O3 too (the stubs may be inlined, their statics survive)."""
    (tmp_path / "k.cu").write_text(textwrap.dedent("""
        namespace at {
        struct RestrictPtrTraits {};
        template <typename T, int N, typename P> struct PackedTensorAccessor32 { T* data; int sizes[N]; };
        }
        namespace mine {
        __global__ void relu_kernel(const float* in, float* out, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = in[i] > 0.f ? in[i] : 0.f;
        }
        template <typename T>
        __global__ void acc_kernel(at::PackedTensorAccessor32<T, 2, at::RestrictPtrTraits> a) { a.data[0] = T(0); }
        }
        extern "C" __global__ void plain_c_kernel(float* x) { x[0] = 1.f; }
        __device__ float helper(float x) { return 2 * x; }
        void launch(float* a, float* b, int n) {
            mine::relu_kernel<<<1, 32>>>(a, b, n);
            mine::acc_kernel<float><<<1, 32>>>(at::PackedTensorAccessor32<float, 2, at::RestrictPtrTraits>{});
            plain_c_kernel<<<1, 1>>>(a);
        }
    """))
    _run(["nvcc", "-shared", "-O3", "-Xcompiler", "-fPIC,-O3", "-o", "k.so", "k.cu"], tmp_path)
    syms = library_symbols(tmp_path / "k.so")
    assert syms.kernels == sorted(KERNELS), syms.kernels
    assert own_kernel("void mine::acc_kernel<float>(at::PackedTensorAccessor32<float, 2, at::RestrictPtrTraits>)",
                      syms.kernels)
    assert not any("helper" in k or "launch" in k for k in syms.kernels)


# --- real torch extensions (slow: two builds) ---------------------------------------------------------------------

HONEST_EXT = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <thread>

torch::Tensor relu_own(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 only");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    auto z = torch::zeros({xc.size(0)}, xc.options());
    auto w = torch::empty({2, 3}, torch::TensorOptions().dtype(torch::kFloat32));
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const int hw = (int)std::thread::hardware_concurrency();
    #pragma omp parallel for num_threads(hw > 0 ? hw : 1)
    for (int64_t i = 0; i < xc.numel(); i++) out[i] = in[i] > 0.f ? in[i] : 0.f;
    at::parallel_for(0, z.numel(), 1024, [&](int64_t b, int64_t e) { float* pz = z.data_ptr<float>(); for (int64_t i = b; i < e; i++) pz[i] = 0.f; });
    return y.view(xc.sizes());
}
at::Tensor myrelu(const at::Tensor& x) { return relu_own(x); }
TORCH_LIBRARY(mc_sym_honest, m) { m.def("myrelu(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(mc_sym_honest, CPU, m) { m.impl("myrelu", &myrelu); }
"""

# One function per refused class, each through a symbol no other function imports.
EXPLOIT_EXT = r"""
#include <torch/extension.h>
#include <ATen/ops/relu_cpu_dispatch.h>
#include <ATen/ops/relu_native.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/record_function.h>
#include <dlfcn.h>
extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                       const int*, const float*, const int*, const float*, float*, const int*);

torch::Tensor aten_api(torch::Tensor x) { return x.relu(); }
torch::Tensor cpu_ns(torch::Tensor x) { return at::cpu::relu(x); }
torch::Tensor native_ns(torch::Tensor x) { return at::native::relu(x); }
torch::Tensor blas(torch::Tensor a) {
    auto c = torch::empty_like(a); int n = a.size(0); float one = 1.f;
    sgemm_("N", "N", &n, &n, &n, &one, a.data_ptr<float>(), &n, a.data_ptr<float>(), &n, &one, c.data_ptr<float>(), &n);
    return c;
}
torch::Tensor exclude(torch::Tensor x) {
    c10::impl::ExcludeDispatchKeyGuard g(c10::DispatchKeySet({c10::DispatchKey::Python}));
    return at::tanh(x);
}
torch::Tensor dl(torch::Tensor x) {
    auto f = (at::Tensor (*)(const at::Tensor&))dlsym(RTLD_DEFAULT, "_ZN2at3cpu4reluERKNS_6TensorE");
    return f(x);
}
torch::Tensor rf_off(torch::Tensor x) {
    at::DisableRecordFunctionGuard quiet;
    return at::exp(x);
}
torch::Tensor redisp(torch::Tensor x) { return at::_ops::log::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), x); }
at::Tensor op_body(const at::Tensor& x) { return at::sigmoid(x); }
TORCH_LIBRARY(mc_sym_exploit, m) { m.def("f(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(mc_sym_exploit, CPU, m) { m.impl("f", &op_body); }
"""


def _build(cache_dir: str, name: str, src: str, functions) -> Path:
    from torch.utils.cpp_extension import load_inline

    # the session's cache, never a fixed /tmp path: a build killed in an earlier run leaves torch's lock file
    # behind there, and load_inline then waits on it forever (CI timed out on that)
    root = Path(cache_dir) / "symbols" / name
    root.mkdir(parents=True, exist_ok=True)
    mod = load_inline(name=name, cpp_sources=src, functions=functions, build_directory=str(root),
                      extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)
    return Path(mod.__file__)


@pytest.mark.slow  # two extension builds (~100 s of CI); CI builds one of the class in the exploit suite (exploit_21)
def test_real_extensions(cache_dir):
    honest = library_symbols(_build(cache_dir, "mc_sym_honest", HONEST_EXT, ["relu_own"]))
    assert "std::thread::hardware_concurrency()" in honest.imported
    assert check_imports(honest.imported, "cpu") == []
    bad = library_symbols(_build(cache_dir, "mc_sym_exploit", EXPLOIT_EXT, ["aten_api", "cpu_ns", "native_ns", "blas",
                                                                  "exclude", "dl", "rf_off", "redisp"]))
    problems = check_imports(bad.imported, "cpu", traced=False)
    expected = {  # class -> the symbol its function (and only it) imports
        "ATen C++ API (x.relu())": "imports at::_ops::relu::call(",
        "at::cpu kernel": "imports at::cpu::relu(",
        "at::native kernel": "imports at::native::relu(",
        "libtorch BLAS": "imports sgemm_:",
        "at:: call under ExcludeDispatchKeyGuard": "imports at::_ops::tanh::call(",
        "dlsym lookup": "imports dlsym:",
        "TORCH_LIBRARY op body": "imports at::_ops::sigmoid::call(",
        "at:: call with RecordFunction off": "imports at::enableRecordFunction(",
        "redispatch": "imports at::_ops::log::redispatch(",
    }
    dispatcher_calls = {"ATen C++ API (x.relu())", "at:: call under ExcludeDispatchKeyGuard", "TORCH_LIBRARY op body"}
    for cls, start in expected.items():
        assert sum(p.startswith(start) for p in problems) == 1, (cls, problems)
    # rf_off's guard also reads the setting it restores, and its at::exp is a dispatcher call
    extra = ("imports at::isRecordFunctionEnabled(", "imports at::_ops::exp::call(")
    assert len(problems) == len(expected) + 2 and all(any(p.startswith(x) for p in problems) for x in extra), problems
    traced = check_imports(bad.imported, "cpu", traced=True)
    assert sorted(traced) == sorted(p for p in problems if not p.startswith(
        tuple(expected[c] for c in dispatcher_calls) + extra[1:])), traced
