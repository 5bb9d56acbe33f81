"""Cold builds (docs/verifier.md "Cold builds"): which `.cu` sources get the light build (backends/cuda.py and its
light_headers/) and that it builds the same kernels as the candidate's own. Compile-only: nvcc builds objects here,
nothing runs. The Builder's fallback: tests/test_build.py; nvcc_overlap and the precompiled header: their own files."""

from __future__ import annotations

import re
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch.utils.cpp_extension as cpp_extension
from test_nvcc_overlap import _overlap, _section, needs_nvcc

import musacoder
from musacoder.backends import get_backend
from musacoder.backends.cuda import LIGHT_HEADERS, light_cuda_sources, lightest_fits

CUDA_EXAMPLES = sorted((Path(musacoder.__file__).parent / "examples" / "cuda").glob("*.py"))


class _Stop(Exception):
    pass


def _load_inline_calls(path: Path, monkeypatch) -> list[dict]:
    """The load_inline arguments a shipped candidate passes (its module run up to its first build)."""
    calls = []

    def record(*args, **kwargs):
        calls.append(kwargs)
        raise _Stop

    monkeypatch.setattr(cpp_extension, "load_inline", record)
    with pytest.raises(_Stop):
        exec(compile(path.read_text(), str(path), "exec"), {"__name__": "candidate"})
    return calls


# ---- which sources get the light build --------------------------------------------------------------------------
def test_shipped_cuda_candidates_get_the_light_build_line_for_line(monkeypatch):
    lightened = set()
    for path in CUDA_EXAMPLES:
        for call in _load_inline_calls(path, monkeypatch):
            sources = [call["cuda_sources"]] if isinstance(call["cuda_sources"], str) else call["cuda_sources"]
            light = light_cuda_sources(sources)
            if light is None:
                continue
            lightened.add(path.name)
            for own, lit in zip(sources, light, strict=True):  # only the umbrella line changed: errors keep their lines
                changed = [(a, b) for a, b in zip(own.split("\n"), lit.split("\n"), strict=True) if a != b]
                assert changed == [("#include <torch/extension.h>", "#include <torch/types.h>")], path.name
    honest = {p.name for p in CUDA_EXAMPLES if p.name.startswith("honest_")}
    assert len(honest) >= 8 and honest <= lightened  # every honest one (exploits using Python's API are not)


def test_no_light_build_where_the_umbrella_header_could_matter():
    base = "#include <torch/extension.h>\n__global__ void k(float* x) {}\n"
    assert light_cuda_sources([base]) == ["#include <torch/types.h>\n__global__ void k(float* x) {}\n"]
    for extra in ("#include <pybind11/numpy.h>", "PYBIND11_MODULE(m, m) {}", "py::object o;",
                  "auto s = torch::cuda::getCurrentCUDAStream();",  # at::cuda's without the umbrella: no error
                  "namespace F = torch::nn::functional;", "#if TORCH_VERSION_MAJOR >= 2\n#endif",
                  "#ifdef PYBIND11_VERSION_MAJOR\n#endif", "#if defined(USE_ROCM) && X\n#endif"):
        assert light_cuda_sources([base + extra]) is None, extra
    # what the candidate defines itself, the compiler's and CUDA's own macros: still light
    ok = base + ("#ifndef CHECK_CUDA\n#define CHECK_CUDA(x) x\n#endif\n#if __CUDA_ARCH__ >= 800 || CUDART_VERSION > 12000"
                 "\n#endif\n")
    assert light_cuda_sources([ok]) is not None
    assert light_cuda_sources([base + 'printf("//"); auto s = torch::cuda::getCurrentCUDAStream();']) is None
    assert light_cuda_sources(["#include <ATen/ATen.h>\n"]) is None  # no umbrella: nothing to gain
    request = {"name": "k", "cpp_sources": "torch::Tensor f(torch::Tensor x);", "cuda_sources": base, "functions": ["f"]}
    assert get_backend("cuda").light_build(request) == {**request, "cuda_sources": [light_cuda_sources([base])[0]],
                                                        "extra_cuda_cflags": [f"-I{LIGHT_HEADERS}"]}  # and lightest
    assert get_backend("cuda").light_build({"name": "k", "cpp_sources": base}) is None  # no .cu
    assert get_backend("cpu").light_build(request) is None


def test_the_lightest_header_only_where_the_source_names_what_it_declares(monkeypatch):
    base = "#include <torch/extension.h>\n__global__ void k(float* x) {}\n"
    honest = base + "torch::Tensor f(torch::Tensor x) { TORCH_CHECK(x.scalar_type() == torch::kFloat32);\n" \
                    "  auto y = torch::empty_like(x); at::cuda::getCurrentCUDAStream(); return y; }\n"
    assert lightest_fits([honest])
    for extra in ("auto z = torch::matmul(x, x);", "auto z = at::native::relu(x);",  # declared only by ATen.h
                  "#include <torch/csrc/autograd/variable.h>", "auto t = torch :: arange(3);"):
        assert not lightest_fits([honest + extra]), extra
    request = {"name": "k", "cpp_sources": "torch::Tensor f(torch::Tensor x);", "cuda_sources": honest,
               "functions": ["f"], "extra_cuda_cflags": ["-O3"]}
    monkeypatch.delenv("MUSACODER_LIGHTEST", raising=False)
    flags = get_backend("cuda").light_build(request)["extra_cuda_cflags"]
    assert flags == ["-O3", f"-I{LIGHT_HEADERS}"] and (LIGHT_HEADERS / "torch" / "types.h").is_file()
    assert request["extra_cuda_cflags"] == ["-O3"]  # the candidate's own flags untouched
    request["cuda_sources"] = honest + "auto z = torch::matmul(x, x);"
    assert get_backend("cuda").light_build(request)["extra_cuda_cflags"] == ["-O3"]
    monkeypatch.setenv("MUSACODER_LIGHTEST", "0")  # on unless turned off
    request["cuda_sources"] = honest
    assert get_backend("cuda").light_build(request)["extra_cuda_cflags"] == ["-O3"]


# the mangled name of at::_ops::empty_like::call, which torch's libraries define (the CPU wheel's too)
EMPTY_LIKE = "_ZN2at4_ops10empty_like4callERKNS_6TensorESt8optionalIN3c1010ScalarTypeEES5_INS6_6LayoutEES5_INS6_6" \
             "DeviceEES5_IbES5_INS6_12MemoryFormatEE"


def _library_importing(tmp_path: Path, name: str) -> Path:
    src, lib = tmp_path / f"{len(name)}.c", tmp_path / f"lib{len(name)}.so"
    src.write_text(f"extern void {name}(void);\nvoid use(void) {{ {name}(); }}\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    return lib


def test_a_lightest_library_must_import_only_what_torch_defines(tmp_path):
    """A declaration of light_headers that differed from torch's would compile and fail only at load: such a library
    is not used (the builder then builds the candidate's own sources)."""
    cuda = get_backend("cuda")
    lightest = {"extra_cuda_cflags": ["-O3", f"-I{LIGHT_HEADERS}"]}
    assert cuda.light_library_problem(_library_importing(tmp_path, EMPTY_LIKE), lightest) is None
    wrong = EMPTY_LIKE.replace("4callE", "4callEi")  # one more parameter than torch's
    problem = cuda.light_library_problem(_library_importing(tmp_path, wrong), lightest)
    assert problem and wrong in problem
    assert cuda.light_library_problem(_library_importing(tmp_path, wrong), {"extra_cuda_cflags": ["-O3"]}) is None


# ---- a real candidate's .cu against torch's headers, both ways (slow: ~2 min of nvcc on 2 cores) -------------------
@needs_nvcc
@pytest.mark.slow
def test_light_and_own_cuda_units_build_the_same_kernels(tmp_path, monkeypatch):
    import cxxfilt

    from musacoder.musa.compile_check import STUB_HEADERS
    from musacoder.verifier.symbols import check_imports

    torch_inc = Path(cpp_extension.include_paths()[0])
    stubs = tmp_path / "stubs"  # CUDA library headers a CPU torch wheel lacks (ATen/cuda/CUDAContext.h needs them)
    for rel, text in STUB_HEADERS.items():
        if not (torch_inc / rel).exists():
            (stubs / rel).parent.mkdir(parents=True, exist_ok=True)
            (stubs / rel).write_text(text)
    (call,) = _load_inline_calls(Path(musacoder.__file__).parent / "examples" / "cuda" / "honest_relu.py",
                                 monkeypatch)
    prefix = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"  # load_inline's own
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]  # Python.h: the umbrella's
    flags = [f"-I{stubs}", *(w for p in includes for w in ("-isystem", p)), "-DTORCH_EXTENSION_NAME=x",
             "-DTORCH_API_INCLUDE_EXTENSION_H", *cpp_extension.COMMON_NVCC_FLAGS, "--expt-relaxed-constexpr",
             "-gencode=arch=compute_90,code=sm_90", "--compiler-options", "-fPIC", "-O3", "-std=c++20"]
    objects = {}
    for how, text in (("own", call["cuda_sources"]), ("light", light_cuda_sources([call["cuda_sources"]])[0])):
        (tmp_path / how).mkdir()
        (tmp_path / how / "cuda.cu").write_text(prefix + text)
        r = _overlap([*flags, "-c", str(tmp_path / how / "cuda.cu"), "-o", str(tmp_path / how / "cuda.o")], tmp_path,
                     monkeypatch)
        assert r.returncode == 0, r.stderr[-2000:]
        objects[how] = tmp_path / how / "cuda.o"
    # the same device code: the fatbinaries differ only in the hash naming the file's internal-linkage symbols
    fatbins = [re.sub(rb"[0-9a-f]{8}(?=_\d+_cuda_cu_)", b"ID", _section(objects[h], ".nv_fatbin")) for h in objects]
    assert fatbins[0] == fatbins[1]
    # the host code may inline differently (a smaller unit), but imports the same torch symbols, and passes the checks
    imports = {h: {cxxfilt.demangle(line.split()[0]) for line in subprocess.run(
        ["nm", "-P", "--undefined-only", str(o)], capture_output=True, text=True, check=True).stdout.splitlines()}
        for h, o in objects.items()}
    torch_level = [{i for i in imports[h] if re.search(r"\b(at|c10|torch)::", i)} for h in objects]
    assert torch_level[0] == torch_level[1] and torch_level[0]
    assert check_imports(sorted(imports["light"]), "cuda") == check_imports(sorted(imports["own"]), "cuda") == []
