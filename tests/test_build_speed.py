"""Cold builds (docs/verifier.md "Cold builds"): the light `.cu` build and its fallback in the Builder, nvcc with
its two front ends side by side (verifier/nvcc_overlap.py), and the precompiled torch header of C++ builds
(verifier/pch.py). Compile-only: nvcc builds objects here, nothing runs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch.utils.cpp_extension as cpp_extension

import musacoder
from musacoder.backends import get_backend
from musacoder.backends.cpu import CpuBackend
from musacoder.backends.cuda import LIGHT_HEADERS, light_cuda_sources, lightest_fits
from musacoder.verifier import nvcc_overlap, pch
from musacoder.verifier.build import Builder

CUDA_EXAMPLES = sorted((Path(musacoder.__file__).parent / "examples" / "cuda").glob("*.py"))
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc")
KERNEL = """#include <cuda_runtime.h>
__global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
void launch(float* x, float a, int n) { scale<<<(n + 255) / 256, 256>>>(x, a, n); }
"""


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


# ---- the Builder: light first, the candidate's own build when it does not compile ---------------------------------
class _Light(CpuBackend):
    """The cpu backend with a light build made of `light(cpp_sources)` (the mechanism is the backend's own)."""

    def __init__(self, light):
        self.light, self.tried = light, 0

    def light_build(self, arguments):
        self.tried += 1
        return {**arguments, "cpp_sources": self.light(arguments["cpp_sources"])}


def _request(source: str) -> dict:
    return {"name": "x", "cpp_sources": source, "no_implicit_headers": True, "is_python_module": False,
            "_kind": "inline", "_api": "torch"}


def test_builder_falls_back_to_the_candidates_own_sources_and_reports_their_errors(tmp_path):
    broken = _Light(lambda s: "#error the light build\n" + s)
    builder = Builder(tmp_path, broken)
    good = builder.build(_request("int f() { return 1; }\n"))
    assert not good.error and Path(good.path).exists() and broken.tried == 1
    assert not (Path(good.path).parent / "light").exists()  # the library is the candidate's own build
    bad = builder.build(_request("int f() {\n  return undefined_name;\n}\n"))
    assert "main.cpp:2" in bad.error and "undefined_name" in bad.error and "light build" not in bad.error
    assert (tmp_path / "ext" / bad.key / "failed").read_text() == bad.error  # cached as the candidate's failure

    fine = _Light(lambda s: s + "// light\n")
    reply = Builder(tmp_path, fine).build(_request("int g() { return 2; }\n"))
    assert not reply.error and (Path(reply.path).parent / "light").exists() and fine.tried == 1
    again = Builder(tmp_path, fine).build(_request("int g() { return 2; }\n"))
    assert again.cached and again.key == reply.key and fine.tried == 1  # same sources: same key, nothing rebuilt

    refused = _Light(lambda s: s + "// light\n")
    refused.light_library_problem = lambda library, light: "imports what torch does not define"
    reply = Builder(tmp_path, refused).build(_request("int h() { return 3; }\n"))
    assert not reply.error and not (Path(reply.path).parent / "light").exists() and refused.tried == 1


# ---- nvcc_overlap ---------------------------------------------------------------------------------------------------
def _section(obj: Path, name: str) -> bytes:
    out = obj.with_suffix(f".{name.strip('.')}")
    subprocess.run(["objcopy", "-O", "binary", "-j", name, str(obj), str(out)], check=True)
    return out.read_bytes()


def _symbols(obj: Path) -> list[str]:  # the FILE symbol names nvcc's temporary file: left out
    nm = subprocess.run(["nm", "-P", str(obj)], capture_output=True, text=True, check=True).stdout
    return sorted(line for line in nm.splitlines() if "cudafe1" not in line)


def _overlap(args, tmp_path, monkeypatch) -> subprocess.CompletedProcess:
    monkeypatch.setenv("MUSACODER_NVCC_TIMES", str(tmp_path / "times.jsonl"))
    return subprocess.run([sys.executable, "-m", "musacoder.verifier.nvcc_overlap", NVCC, *args],
                          capture_output=True, text=True)


ARCH = ["-gencode=arch=compute_90,code=sm_90", "-O3", "--compiler-options", "-fPIC"]


def _plan(src: Path, tmp_path: Path) -> list[nvcc_overlap.Step]:
    planned = nvcc_overlap.plan(NVCC, ["-c", str(src), "-o", str(tmp_path / "p.o"), *ARCH], tmp_path / "keep")
    assert planned is not None
    return planned[1]


@needs_nvcc
def test_nvcc_overlap_fails_as_nvcc_does_and_runs_the_front_ends_side_by_side(tmp_path, monkeypatch):
    src = tmp_path / "bad.cu"
    src.write_text(KERNEL + "int broken() {\n  return undefined_name;\n}\n")
    steps = _plan(src, tmp_path)
    front = {s.tool: s for s in steps if s.tool in ("cudafe++", "cicc")}
    assert front["cudafe++"].index not in front["cicc"].deps and front["cicc"].id_copy  # cicc makes its own id
    assert steps[-1].deps == set(range(len(steps) - 1))  # the host compile waits for all

    ours = _overlap(["-c", str(src), "-o", str(tmp_path / "ours.o")], tmp_path, monkeypatch)
    theirs = subprocess.run([NVCC, "-c", str(src), "-o", str(tmp_path / "nvcc.o")], capture_output=True, text=True)
    assert theirs.returncode != 0 and f"{src}(8): error" in theirs.stderr
    assert (ours.returncode, ours.stdout, ours.stderr) == (theirs.returncode, theirs.stdout, theirs.stderr)
    # anything but a plain compile is nvcc's own run
    assert nvcc_overlap.plan(NVCC, ["--version"], tmp_path) is None
    assert nvcc_overlap.plan(NVCC, ["-c", str(src), "--dryrun"], tmp_path) is None
    version = _overlap(["--version"], tmp_path, monkeypatch)
    assert version.returncode == 0 and "Cuda compilation tools" in version.stdout


@needs_nvcc
@pytest.mark.slow
def test_nvcc_overlap_builds_what_nvcc_builds(tmp_path, monkeypatch):
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    steps = _plan(src, tmp_path)
    ours = _overlap(["-c", str(src), "-o", str(tmp_path / "ours.o"), *ARCH], tmp_path, monkeypatch)
    subprocess.run([NVCC, "-c", str(src), "-o", str(tmp_path / "nvcc.o"), *ARCH], check=True)
    assert ours.returncode == 0 and ours.stdout == ours.stderr == ""
    for section in (".text", ".nv_fatbin", ".data", ".rodata"):
        assert _section(tmp_path / "ours.o", section) == _section(tmp_path / "nvcc.o", section), section
    assert _symbols(tmp_path / "ours.o") == _symbols(tmp_path / "nvcc.o")
    record = json.loads((tmp_path / "times.jsonl").read_text())
    assert record["status"] == 0 and [s["tool"] for s in record["steps"]] == [s.tool for s in steps]


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


# ---- the whole path: torch's loader and ninja, the light build failing, nvcc_overlap in the ninja file ------------
def _as_on_a_gpu_host(tmp_path, monkeypatch) -> Path:
    """torch's loader set up to build for sm_90 with the nvcc here; a folder of empty stand-ins for the CUDA libraries
    the link names, which this machine's CPU torch lacks (nothing is loaded or run)."""
    # the toolkit's root as nvcc names it (the nvcc on PATH may be a script that calls it)
    nvcc_home = Path(subprocess.run([NVCC, "--dryrun", "-c", "x.cu"], capture_output=True, text=True).stderr
                     .split("TOP=")[1].split()[0]).resolve()
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(nvcc_home))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.delenv("PYTORCH_NVCC", raising=False)
    stand_ins = tmp_path / "lib"
    stand_ins.mkdir()
    for lib in ("c10_cuda", "torch_cuda"):
        subprocess.run(["cc", "-shared", "-x", "c", "/dev/null", "-o", str(stand_ins / f"lib{lib}.so")], check=True)
    return stand_ins


@needs_nvcc
def test_cuda_builder_runs_nvcc_overlap_through_torchs_ninja_and_falls_back(tmp_path, monkeypatch):
    """A small CUDA extension built by the cuda backend's Builder as on a GPU host. This machine's CPU torch lacks the
    CUDA libraries the link names: empty stand-ins are linked instead (nothing is loaded or run)."""
    stand_ins = _as_on_a_gpu_host(tmp_path, monkeypatch)
    monkeypatch.setenv("MUSACODER_NVCC_TIMES", str(tmp_path / "times.jsonl"))
    backend = get_backend("cuda")
    monkeypatch.setattr(backend, "light_build", lambda a: {**a, "cuda_sources": "#error the light build\n"})
    request = {"name": "k", "cpp_sources": "void launch(float* x, float a, int n);", "cuda_sources": KERNEL,
               "no_implicit_headers": True, "is_python_module": False, "extra_ldflags": [f"-L{stand_ins}"],
               "_kind": "inline", "_api": "torch"}
    reply = Builder(tmp_path / "cache", backend).build(request)
    assert not reply.error, reply.error[-1500:]
    assert Path(reply.path).exists() and not (Path(reply.path).parent / "light").exists()
    ninja = (Path(reply.path).parent / "build.ninja").read_text()
    assert "musacoder.verifier.nvcc_overlap" in ninja and "PYTORCH_NVCC" not in os.environ  # set only meanwhile
    assert ninja.count("-lc10_cuda") == 1  # the own build's arguments are the request's (the loader extends lists)
    log = (Path(reply.path).parent / ".ninja_log").read_text()
    assert log.count("\tmain.o\t") == 1  # the bindings compiled once: for the light build, kept for the own
    compiles = [json.loads(line) for line in (tmp_path / "times.jsonl").read_text().splitlines()]
    assert [c["status"] != 0 for c in compiles] == [True, False]  # the light `.cu` (#error), then the own
    assert reply.kernels == ["scale"] or any("scale" in k for k in reply.kernels)


def test_a_precompiled_header_only_for_flags_that_cannot_bring_their_own_headers(monkeypatch):
    plain = {"cpp_sources": "int x;", "extra_cflags": ["-O3", "-fopenmp"]}
    name = pch.key(plain, "inline")
    assert name and name == pch.key(dict(plain, cpp_sources="int y;"), "inline")  # the flags name it, not the code
    assert name != pch.key(dict(plain, extra_cflags=["-O2"]), "inline")
    for bad in (["-include", "/tmp/x.h"], ["-I/tmp"], ["-isystem", "/tmp"], ["-fplugin=/tmp/p.so"], ["@/tmp/flags"],
                ["-Wp,-include,/tmp/x.h"], ["-Xpreprocessor", "-include"]):
        assert pch.key(dict(plain, extra_cflags=bad), "inline") is None, bad
    assert pch.key(dict(plain, extra_include_paths=["/tmp"]), "inline") is None
    cuda = pch.key(dict(plain, cuda_sources="__global__ void k() {}"), "inline")
    assert cuda and cuda != name  # the bindings of a CUDA build have CUDA's include paths: a PCH of their own
    assert pch.key(dict(plain, cuda_sources="k", no_implicit_headers=True), "inline") is None
    assert pch.key(dict(plain, musa_sources="k"), "inline") is None
    assert pch.key(plain, "files") is None
    monkeypatch.setenv("MUSACODER_PCH", "0")
    assert pch.key(plain, "inline") is None


@pytest.mark.slow  # three builds and the PCH: ~2.5 min of CI's 2 cores (every later CI build uses the session's PCH)
def test_a_build_after_the_precompiled_header_uses_it_and_builds_the_same(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("MUSACODER_PCH_DIR", str(tmp_path / "pch"))
    builder = Builder(tmp_path / "cache", CpuBackend())
    src = "torch::Tensor twice(torch::Tensor x) { return x * %d; }"

    def build(n):
        t0 = time.perf_counter()
        r = builder.build({"name": "e", "cpp_sources": src % n, "functions": ["twice"], "extra_cflags": ["-O2"]})
        assert not r.error, r.error
        return r, time.perf_counter() - t0

    first, cold = build(2)
    deadline = time.monotonic() + 300
    while pch.ready(pch.key({"extra_cflags": ["-O2"]}, "inline")) is None and time.monotonic() < deadline:
        time.sleep(1)
    second, warm = build(3)
    ninja = (Path(second.path).parent / "build.ninja").read_text()
    assert str(tmp_path / "pch") in ninja and str(tmp_path / "pch") not in (Path(first.path).parent / "build.ninja").read_text()
    assert warm < 0.8 * cold, (cold, warm)
    spec = importlib.util.spec_from_file_location(Path(second.path).stem, second.path)
    import torch

    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert torch.equal(mod.twice(torch.ones(3)), torch.full((3,), 3.0))


@needs_nvcc
@pytest.mark.slow  # two CUDA builds and the PCH: ~3 min of 2 cores
def test_a_cuda_builds_bindings_use_the_precompiled_header(tmp_path, monkeypatch):
    """The C++ side of a CUDA build (`main.cpp`, torch's umbrella header and the bindings) compiles from the PCH made
    after the first build with those flags, and the `.cu` (same `-I` folder) still builds. Compile and link only, with
    the stand-in CUDA libraries of the test above."""
    import time

    stand_ins = _as_on_a_gpu_host(tmp_path, monkeypatch)
    monkeypatch.setenv("MUSACODER_PCH_DIR", str(tmp_path / "pch"))
    builder = Builder(tmp_path / "cache", get_backend("cuda"))
    cuda = KERNEL + "torch::Tensor twice(torch::Tensor x) { launch(x.data_ptr<float>(), %d.f, x.numel()); return x; }\n"

    def build(n):
        reply = builder.build({"name": "k", "cpp_sources": "torch::Tensor twice(torch::Tensor x);",
                               "cuda_sources": cuda % n, "functions": ["twice"], "extra_ldflags": [f"-L{stand_ins}"],
                               "_kind": "inline", "_api": "torch"})
        assert not reply.error, reply.error[-1500:]
        folder = Path(reply.path).parent
        start, end = next(line.split("\t")[:2] for line in (folder / ".ninja_log").read_text().splitlines()
                          if line.endswith(("\tmain.o", "\tmain.o\t")) or "\tmain.o\t" in line)
        return folder, int(end) - int(start)

    first, cold = build(2)
    name = pch.key({"cuda_sources": "x"}, "inline")
    deadline = time.monotonic() + 400
    while pch.ready(name) is None and time.monotonic() < deadline:
        time.sleep(1)
    assert pch.ready(name), (tmp_path / "pch" / f"{name}.log").read_text()[-2000:]
    second, warm = build(3)
    ninja = (second / "build.ninja").read_text()
    assert str(tmp_path / "pch") in ninja and str(tmp_path / "pch") not in (first / "build.ninja").read_text()
    assert warm < 0.7 * cold, (cold, warm)  # main.o in ms, from ninja's own log
