"""verifier/build.py: the Builder builds the backend's light sources first and the candidate's own when they do not
compile (reporting the own build's errors), on the cpu and, compile and link only, through torch's ninja with nvcc."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch.utils.cpp_extension as cpp_extension
from test_nvcc_overlap import KERNEL, NVCC, needs_nvcc

from musacoder.backends import get_backend
from musacoder.backends.cpu import CpuBackend
from musacoder.verifier.build import Builder


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
