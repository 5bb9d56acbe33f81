"""verifier/nvcc_overlap.py: nvcc with its two front ends side by side fails as nvcc does and builds what nvcc
builds. Compile-only: nvcc builds objects here, nothing runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from musacoder.verifier import nvcc_overlap

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc")
KERNEL = """#include <cuda_runtime.h>
__global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
void launch(float* x, float a, int n) { scale<<<(n + 255) / 256, 256>>>(x, a, n); }
"""


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
