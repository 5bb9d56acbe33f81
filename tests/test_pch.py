"""verifier/pch.py: the precompiled torch header of C++ builds, only for flags that cannot bring their own headers,
and used by the builds after it (cpu, and the bindings of a CUDA build: compile and link only)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from test_build import _as_on_a_gpu_host
from test_nvcc_overlap import KERNEL, needs_nvcc

from musacoder.backends import get_backend
from musacoder.backends.cpu import CpuBackend
from musacoder.verifier import pch
from musacoder.verifier.build import Builder


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
    the stand-in CUDA libraries of tests/test_build.py's CUDA build."""
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
