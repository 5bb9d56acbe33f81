"""Legality from the binary: what a built extension imports, and which device kernels it defines.

Native code can reach PyTorch's (or a vendor's) compute without the dispatcher: `at::cpu::relu`, `at::native::*`,
BLAS symbols that libtorch exports (`sgemm_`), `at::_ops::X::redispatch`, which skips the dispatcher's RecordFunction;
and it can turn the op trace off (`at::enableRecordFunction`, removing callbacks). All of these leave an undefined
dynamic symbol in the candidate's shared object, which is read here with pyelftools (no shelling out) and judged
against an allowlist: PyTorch infrastructure (allocation, metadata, errors, registration, streams, guards) is fine;
any other `at::`/`c10::`/`torch::` symbol is refused. A dispatcher call (`at::_ops::X::call`, what `at::relu` and
`x.relu()` compile to) is fine where the op trace runs at the dispatcher (legality.py), which sees it run whatever
dispatch keys a guard excludes: a fallback that never runs costs nothing, one that runs is refused by name. Where the
trace is the Python dispatch mode, only allowlisted ops may be imported (the mode does not see a call made under an
ExcludeDispatchKeyGuard). C-level names (libc, libm, Python C API, CUDA runtime, OpenMP) are allowed unless a
denylist names them: the system libraries are too large to allowlist, and what they export is not kernel compute
(except BLAS/LAPACK, listed).

Residual risks: compute reached without an import (function pointers found through vtables of allowed objects, raw
syscalls, hand-written ELF walking) is not seen; a kernel the candidate defines under the exact name of a library
kernel would be attributed to the candidate by `backends.kernel_names.own_kernel`.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import cxxfilt
from elftools.elf.elffile import ELFFile

from musacoder.backends.kernel_names import qualified_name
from musacoder.verifier import legality
from musacoder.verifier.legality import ALLOWED_OPS

_LISTS = hashlib.sha256(Path(__file__).read_bytes() + Path(legality.__file__).read_bytes()).hexdigest()[:16]


def policy() -> str:
    """Which policy judges a library: these lists, and whether dispatcher calls are seen (legality.dispatcher_traced).
    A record made under another policy is judged again."""
    return _LISTS + ("-dispatcher" if legality.dispatcher_traced() else "")


def __getattr__(name: str):  # POLICY as it is when imported: build.py imports it each time it judges a library
    if name == "POLICY":
        return policy()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- refused C-level names (exact or by pattern), each with why -------------------------------------------------
# Loading code or resolving symbols at run time hides the real import from this check.
DYNAMIC_LOADING = {"dlopen", "dlsym", "dlvsym", "dlmopen", "dl_iterate_phdr", "_dl_sym", "_dl_vsym", "__libc_dlsym",
                   "__libc_dlopen_mode", "__libc_dlvsym"}
# Hooks that watch or steer the harness's Python code (tracing, async exceptions, exec of unchecked Python source).
PYTHON_HOOKS = {
    "PyEval_SetTrace", "PyEval_SetProfile", "_PyEval_SetTrace", "_PyEval_SetProfile", "PyEval_SetTraceAllThreads",
    "PyEval_SetProfileAllThreads", "PySys_SetObject", "PyThreadState_SetAsyncExc", "PySys_AddAuditHook",
    "_PyInterpreterState_SetEvalFrameFunc", "PyEval_GetGlobals", "PyEval_GetLocals", "PyEval_GetFrame",
    "PyFrame_GetLocals", "PyFrame_GetGlobals", "PyFrame_LocalsToFast", "PyFrame_FastToLocals",
    "PyFrame_FastToLocalsWithError",
}
# Running Python source the static check never saw, or importing modules from native code (torch.relu called from
# C++ under a dispatch-key guard is hidden from the Python-mode trace; the dispatcher trace sees it).
PYTHON_EXEC_PREFIXES = ("PyRun_", "Py_CompileString", "PyEval_EvalCode", "PyImport_Import", "PyImport_AddModule",
                        "PyImport_GetModule", "PyImport_ExecCode")
# Fortran BLAS/LAPACK names (sgemm_, dgesv_, isamax_...) and the C/vendor BLAS families that libtorch exports (MKL).
BLAS_RE = re.compile(r"^(?:[sdczi][a-z0-9]{2,9}_(?:64_)?|[A-Z][A-Z0-9]{3,12}_(?:64_)?|xerbla_)$")
BLAS_PREFIXES = ("cblas_", "LAPACKE_", "lapack_", "mkl_", "MKL_", "openblas_", "goto_", "bli_", "dfti", "Dfti")
VML_RE = re.compile(r"^v(?:ms|md|mc|mz|s|d|c|z)[A-Z][A-Za-z0-9]*$")  # MKL vector math (vsExp, vmdLn), not vsnprintf
# Vendor compute libraries (GPU BLAS/DNN/FFT/sparse/solver/RNG/tensor contractions/collectives) and the CPU ones
# bundled into libtorch (oneDNN, XNNPACK, QNNPACK, NNPACK).
VENDOR_PREFIXES = ("cublas", "cudnn", "cufft", "cusparse", "cusolver", "curand", "cutensor", "nccl", "nvjet",
                   "dnnl_", "mkldnn_", "xnn_", "pytorch_qnnp_", "qnnp_", "nnp_")
VENDOR_NAMESPACES = ("cutlass", "fbgemm", "dnnl", "ideep", "mkldnn", "xnnpack", "qnnpack", "c10d", "gloo",
                     "cublasLt", "cudnn_frontend", "tensorpipe")
# The stable-ABI C shim: tensor metadata and allocation are fine; `aoti_torch_cpu_relu`-style ops and
# `aoti_torch_call_dispatcher` are compute by another name.
AOTI_ALLOWED_RE = re.compile(r"^aoti_torch_(?:get_|dtype_|device_type_|layout_|empty_strided|new_tensor_handle|"
                             r"delete_tensor_object|create_tensor_from_blob|new_uninitialized_tensor|grad_mode_|"
                             r"is_|item_)")

# The op tracer's own entry points (loaded privately into each subject; a library naming them reaches for it).
TRACER_PREFIX = "musacoder_"

# --- refused PyTorch namespaces ---------------------------------------------------------------------------------
# Kernels called directly, below the dispatcher: invisible to the op trace.
KERNEL_NAMESPACES = ("at::native::", "at::cpu::", "at::cuda::blas::", "at::cuda::sparse::", "at::cuda::solver::",
                     "at::meta::", "at::compositeexplicitautograd", "at::compositeimplicitautograd",
                     "at::compositeexplicitautogradnonfunctional", "at::vec::", "at::functionalization::")
# Changing which dispatch keys are live, or popping the harness's mode, hides later ops from the Python-mode trace;
# reaching kernels through the dispatcher's internals (an OperatorHandle, a KernelFunction from it) skips
# RecordFunction.
# Not here: ExcludeDispatchKeyGuard and _force_tls_local_dispatch_key_set, because honest code imports them through
# inline headers (torch::empty/zeros use at::AutoDispatchBelowADInplaceOrView; c10::InferenceMode); the dispatcher
# trace sees every call under them, and where the trace is the Python mode, whatever such a guard could hide must
# itself be imported (an at::_ops op, refused unless allowlisted) or be a Python call (see PYTHON_HOOKS).
DISPATCH_STATE = ("c10::impl::IncludeDispatchKeyGuard", "c10::impl::ForceDispatchKeyGuard",
                  "c10::impl::tls_set_dispatch_key_excluded", "c10::impl::tls_set_dispatch_key_included",
                  "c10::impl::tls_local_dispatch_key_set", "c10::impl::TorchDispatchModeTLS",
                  "c10::impl::PythonDispatcherTLS", "c10::impl::PythonTorchFunctionTLS", "c10::impl::tls_",
                  "c10::Dispatcher", "c10::OperatorHandle", "at::impl::", "at::ThreadLocalState",
                  "c10::ThreadLocalDebugInfo")
# Turning RecordFunction off on a thread, or removing, disabling or replacing its callbacks, blinds the op trace; so do
# the operator-observation list and the thread-local state that carries these settings. (RECORD_FUNCTION labels stay
# fine: at::RecordFunction:: below; a label cannot hide an op, and one forged with a schema is refused at run time.)
RECORD_FUNCTION_STATE = ("at::enableRecordFunction", "at::isRecordFunctionEnabled",  # the guards set and restore it
                         "at::RecordFunctionGuard", "at::DisableRecordFunctionGuard",
                         "at::RecordFunctionTLS", "at::set_record_function_tls_", "at::get_record_function_tls_",
                         "at::addGlobalCallback", "at::addThreadLocalCallback", "at::removeCallback",
                         "at::disableCallback", "at::reenableCallback", "at::clearCallbacks",
                         "at::clearGlobalCallbacks", "at::clearThreadLocalCallbacks",
                         "at::set_record_function_seed_for_testing", "at::ObservedOperators")
# Used by honest inline RAII guards (see above).
DISPATCH_GUARDS_ALLOWED = ("c10::impl::ExcludeDispatchKeyGuard", "c10::impl::_force_tls_local_dispatch_key_set")

# --- allowed PyTorch infrastructure (prefixes of the qualified name, template arguments removed) -------------------
TORCH_ALLOWED = (
    # tensor metadata and data access (compute they might do goes through at::_ops, checked separately)
    "at::TensorBase::", "at::Tensor::", "at::TensorOptions", "at::TensorMaker::", "at::OptionalTensorRef",
    "at::TensorIteratorBase::", "at::TensorIterator::", "at::TensorIteratorConfig::",  # strides/shapes helper only
    "at::detail::empty_", "at::detail::computeStorageNbytes", "at::empty_cpu", "at::getCPUAllocator",
    "at::get_num_threads", "at::get_thread_num", "at::in_parallel_region", "at::init_num_threads",
    "at::internal::invoke_parallel", "at::internal::lazy_init_num_threads",  # at::parallel_for runs own code
    "at::internal::set_thread_num", "c10::ParallelGuard",  # ... through these (inline in ATen/Parallel.h)
    "at::RecordFunction::", "at::shouldRunRecordFunction",  # RECORD_FUNCTION labels
    "at::toString", "at::print", "at::NoGradGuard", "at::AutoGradMode",
    # c10 core: errors, refcounting, scalar types, devices, allocators, symbolic sizes, IValue/type plumbing
    "c10::Error", "c10::ValueError", "c10::TypeError", "c10::IndexError", "c10::NotImplementedError",
    "c10::OutOfMemoryError", "c10::LinAlgError", "c10::Warning", "c10::warn", "c10::WarningHandler",
    "c10::WarningUtils::", "c10::detail::", "c10::intrusive_ptr", "c10::weak_intrusive_ptr",
    "c10::TensorImpl::", "c10::StorageImpl::", "c10::UndefinedTensorImpl::", "c10::AutogradMetaInterface",
    "c10::SmallVectorBase",  # sizes/strides containers (seen in CUDA extension builds)
    "c10::throw",  # error helpers behind TORCH_CHECK and data_ptr checks (c10::throwNullDataPtrError)
    "c10::SymInt", "c10::SymBool", "c10::SymFloat", "c10::SymNodeImpl", "c10::SymbolicShapeMeta::",
    "c10::ScalarType", "c10::toString", "c10::Device", "c10::DeviceType", "c10::Stream", "c10::Storage",
    "c10::Allocator", "c10::GetAllocator", "c10::GetCPUAllocator", "c10::GetDefaultCPUAllocator",
    "c10::SetAllocator", "c10::alloc_cpu", "c10::free_cpu", "c10::DataPtr", "c10::deleteNothing",
    "c10::TensorOptions", "c10::MemoryFormat", "c10::Layout", "c10::Scalar", "c10::Half", "c10::BFloat16",
    "c10::complex", "c10::IValue::", "c10::ivalue::", "c10::Type", "c10::TensorType::", "c10::ListType",
    "c10::DictType", "c10::TupleType", "c10::OptionalType", "c10::getTypePtr", "c10::FunctionSchema",
    "c10::Argument", "c10::OperatorName", "c10::Symbol", "c10::SourceLocation", "c10::get_backtrace",
    "c10::impl::getGlobalPyInterpreter", "c10::impl::PyInterpreter", "c10::impl::cow::", "c10::impl::GPUTrace",
    "c10::impl::device_guard_impl_registry", "c10::impl::DeviceGuardImplRegistrar", "c10::impl::VirtualGuardImpl",
    "c10::impl::DeviceGuardImplInterface", "c10::DispatchKeySet", *DISPATCH_GUARDS_ALLOWED, "c10::isValidDeviceType",
    "c10::typeMetaToScalarType",
    "c10::RegisterOperators", "c10::KernelFunction", "c10::BoxedKernel", "c10::ArrayRef", "c10::str", "c10::Join",
    "c10::operator", "at::operator", "c10::demangle", "c10::ThreadPool",  # operator<< prints devices/tensors
    "c10::FatalSignalHandler", "c10::GetExceptionString",
    "caffe2::TypeMeta", "caffe2::detail::_typeMetaData",
    # op registration and the Python binding layer
    "torch::Library", "torch::CppFunction", "torch::jit::parseSchema", "torch::PyWarningHandler",
    "torch::translate_exception_to_python", "torch::autograd::AutogradMeta", "torch::detail::TorchLibraryInit",
    "torch::CustomClassHolder", "torch::headeronly::",
)
# CUDA streams, guards, device properties and the caching allocator (not compute), on GPU backends only.
TORCH_ALLOWED_CUDA = (
    "c10::cuda::", "at::cuda::getCurrentCUDAStream", "at::cuda::getStreamFromPool", "at::cuda::getDefaultCUDAStream",
    "at::cuda::setCurrentCUDAStream", "at::cuda::getCurrentDeviceProperties", "at::cuda::getDeviceProperties",
    "at::cuda::warp_size", "at::cuda::is_available", "at::cuda::device_count", "at::cuda::getNumGPUs",
    "at::cuda::getCachingHostAllocator", "at::cuda::CachingHostAllocator", "at::cuda::getPinnedMemoryAllocator",
    "at::cuda::CUDAEvent", "at::cuda::detail::empty_cuda", "at::detail::empty_cuda", "at::cuda::CUDAStream",
)
TORCH_NAMESPACES = {"at", "c10", "torch", "caffe2", "aten"}
OTHER_ALLOWED_NAMESPACES = {"std", "__gnu_cxx", "__cxxabiv1", "pybind11", "__gthread", "__pstl"}


@dataclass
class LibrarySymbols:
    imported: list[str] = field(default_factory=list)  # demangled undefined dynamic symbols
    defined: list[str] = field(default_factory=list)  # demangled defined symbols (.dynsym and .symtab)
    kernels: list[str] = field(default_factory=list)  # demangled names of the __global__ kernels it defines


def demangle(name: str) -> str:
    name = name.split("@")[0]  # `sgemm_@GLIBC...` as nm prints versioned names
    if not name.startswith("_Z"):
        return name
    try:
        return cxxfilt.demangle(name)
    except cxxfilt.InvalidName:
        return name


# nvcc emits, for every kernel, a host stub `__device_stub__<mangled kernel name minus its leading _>`; at -O3 the
# stub itself may be inlined, but its static locals (`__device_stub__...::__f`, `::__handle`) survive. The number in
# front of `__device_stub__` is the identifier's length in the mangling, which delimits the kernel's name.
_STUB_RE = re.compile(r"(\d+)__device_stub__")


def _stub_kernel(raw: str) -> str | None:
    m = _STUB_RE.search(raw)
    if not m:
        return None
    ident = raw[m.end(1): m.end(1) + int(m.group(1))]
    inner = ident[len("__device_stub_"):]  # "_Z14plain_c_kernelPf", "_ZN4mine11relu_kernelEPKfPfi"
    return demangle(inner) if inner.startswith("_Z") else inner.lstrip("_")


def library_symbols(path) -> LibrarySymbols:
    imported, defined, kernels = set(), set(), set()
    with open(path, "rb") as f:
        elf = ELFFile(f)
        # a shared object imports through .dynsym; a relocatable object (.o, tests) only has .symtab
        import_table = ".symtab" if elf["e_type"] == "ET_REL" else ".dynsym"
        for secname in (".dynsym", ".symtab"):
            sec = elf.get_section_by_name(secname)
            if sec is None:
                continue
            for sym in sec.iter_symbols():
                raw = sym.name
                if not raw or sym["st_info"]["type"] in ("STT_SECTION", "STT_FILE"):
                    continue
                if sym["st_shndx"] == "SHN_UNDEF":
                    if secname == import_table:
                        imported.add(demangle(raw))
                    continue
                defined.add(demangle(raw))
                if "__device_stub__" in raw:
                    k = _stub_kernel(raw)
                    if k:
                        kernels.add(k)
    return LibrarySymbols(sorted(imported), sorted(defined), sorted(kernels))


@functools.cache
def allowed_op_structs() -> frozenset[str]:
    """`at::_ops` struct names of the allowlisted aten ops: `<op>` for the default overload, else `<op>_<overload>`."""
    import torch

    out = set()
    for op in ALLOWED_OPS:
        packet = getattr(torch.ops.aten, op, None)
        overloads = packet.overloads() if packet is not None else ["default"]
        out.update(op if o == "default" else f"{op}_{o}" for o in overloads)
    return frozenset(out)


def _c_level_problem(q: str) -> str | None:
    if q in DYNAMIC_LOADING:
        return "loads code or resolves symbols at run time"
    if q.startswith(TRACER_PREFIX):
        return "reaches for the verifier's op tracer"
    if q in PYTHON_HOOKS or q.startswith(PYTHON_EXEC_PREFIXES):
        return "hooks or runs Python code behind the harness"
    if q.startswith("aoti_torch_"):
        return None if AOTI_ALLOWED_RE.match(q) else "calls a PyTorch op through the stable C shim"
    if q.startswith(VENDOR_PREFIXES):
        return "calls a vendor compute library"
    if BLAS_RE.match(q) or VML_RE.match(q) or q.startswith(BLAS_PREFIXES):
        return "calls BLAS/LAPACK/vector-math library compute"
    return None


def _torch_problem(q: str, backend: str, traced: bool) -> str | None:
    if q.startswith("at::_ops::"):
        parts = q.split("::")
        op = parts[2] if len(parts) > 2 else "?"
        if len(parts) > 3 and parts[3].startswith("redispatch"):
            return f"calls the PyTorch op aten::{op} by redispatch, which skips the dispatcher's op trace"
        if traced or op in allowed_op_structs():
            return None
        return f"calls the PyTorch op aten::{op}, outside the allowlist"
    if q.startswith(KERNEL_NAMESPACES):
        return "calls a PyTorch kernel directly, below the dispatcher"
    if q.startswith(DISPATCH_STATE):
        return "changes or bypasses dispatch state, which hides ops from the op trace"
    if q.startswith(RECORD_FUNCTION_STATE):
        return "turns off or removes RecordFunction callbacks, which hides ops from the op trace"
    if q.startswith(TORCH_ALLOWED) or backend != "cpu" and q.startswith(TORCH_ALLOWED_CUDA):
        return None
    return "PyTorch internals outside the allowlist of infrastructure symbols"


def symbol_problem(sym: str, backend: str = "cpu", traced: bool | None = None) -> str | None:
    """Why an imported (demangled) symbol is refused, or None. `traced`: whether subjects trace ops at the dispatcher
    (default: as this process's environment says, legality.dispatcher_traced)."""
    q = qualified_name(sym, templates=False)
    top = q.split("::")[0] if "::" in q else ""
    if not top:
        return _c_level_problem(q)
    if top in TORCH_NAMESPACES:
        return _torch_problem(q, backend, legality.dispatcher_traced() if traced is None else traced)
    if top in OTHER_ALLOWED_NAMESPACES:
        return None
    if top in VENDOR_NAMESPACES or q.startswith(VENDOR_NAMESPACES):
        return "calls a vendor compute library"
    return "C++ symbol from a library outside the allowlist"


def check_imports(imported: list[str], backend: str, traced: bool | None = None) -> list[str]:
    """Problems with a library's imports, each `imports <symbol>: <why>`; empty when all are allowed."""
    if traced is None:
        traced = legality.dispatcher_traced()
    out = []
    for sym in dict.fromkeys(s.split("@")[0] for s in imported):
        why = symbol_problem(sym, backend, traced)
        if why:
            out.append(f"imports {sym}: {why}")
    return out


if __name__ == "__main__":  # python -m musacoder.verifier.symbols BACKEND LIB.so...: what the verifier would refuse
    import sys

    for lib in sys.argv[2:]:
        syms = library_symbols(lib)
        print(f"{lib}: {len(syms.imported)} imports, kernels {syms.kernels}")
        for p in check_imports(syms.imported, sys.argv[1]):
            print("  " + p)
