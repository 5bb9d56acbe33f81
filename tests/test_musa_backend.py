"""The musa backend and the musa-on-cuda mode, on a machine without MUSA.

Faked here, because it cannot exist on this machine: torch_musa (its device module `torch.musa` with events and
device properties, and `torch_musa.utils.musa_extension`, whose load_inline would run mcc). Everything else is the
project's real code: translation, portability review, the admission stage of the pool, the trusted Builder, the
subject-side RemoteLoader, the prompts. Tests that need a MUSA GPU are marked `musa`, those that need an NVIDIA GPU
`gpu` (musa-on-cuda end to end); both are skipped elsewhere.
"""

import importlib.abc
import importlib.util
import os
import re
import subprocess
import sys
import types

import pytest
import torch
import torch.utils.cpp_extension as cpp_extension

from musacoder.backends import BackendError, get_backend, resolve
from musacoder.backends.musa import MusaBackend, mcc_flags
from musacoder.backends.musa_on_cuda import MusaOnCudaBackend
from musacoder.config import VerifyConfig
from musacoder.examples_catalog import EXAMPLES_DIR, load_catalog
from musacoder.musa.translate import C2M, M2C, translate, translate_cpp
from musacoder.pool.base import PoolBase
from musacoder.verifier import build
from musacoder.verifier.build import Builder, BuildError, LaunchCounter, RemoteLoader
from musacoder.verifier.verdict import Status, Verdict

CUDA_EXAMPLES = sorted((EXAMPLES_DIR / "cuda").glob("*.py"))
RELU = (EXAMPLES_DIR / "cuda" / "honest_relu.py").read_text()
RELU_SRC = RELU.split('RELU_SRC = r"""', 1)[1].split('"""', 1)[0]
NO_TORCH_MUSA = importlib.util.find_spec("torch_musa") is None
PTX_RELU = RELU.replace("y[i] = x[i] > 0.f ? x[i] : 0.f;",
                        'float v; asm("max.f32 %0, %1, 0f00000000;" : "=f"(v) : "f"(x[i])); y[i] = v;')


# ---- the fake torch_musa --------------------------------------------------------------------------------------
class FakeMusaExtension(types.ModuleType):
    """torch_musa.utils.musa_extension with its real signatures; load_inline records the call and fails the way a
    compiler error does (nothing can be compiled for MUSA here)."""

    def __init__(self):
        super().__init__("torch_musa.utils.musa_extension")
        self.calls = []

    def _import_module_from_library(self, *a, **k):
        raise AssertionError("the builder must never import what it built")

    def load_inline(self, name, cpp_sources, musa_sources=None, sycl_sources=None, functions=None, extra_cflags=None,
                    extra_musa_cflags=None, extra_sycl_cflags=None, extra_ldflags=None, extra_include_paths=None,
                    build_directory=None, verbose=False, with_musa=None, with_sycl=None, is_python_module=True,
                    with_pytorch_error_handling=True, keep_intermediates=True, use_pch=False):
        call = {k: v for k, v in locals().items() if k != "self"}
        call["arch_list"] = os.environ.get("TORCH_MUSA_ARCH_LIST")
        call["import_replaced"] = self._import_module_from_library != FakeMusaExtension._import_module_from_library
        self.calls.append(call)
        raise RuntimeError(f"Error building extension '{name}': fake mcc, nothing compiles for MUSA here")

    def load(self, name, sources, extra_cflags=None, extra_musa_cflags=None, extra_sycl_cflags=None,
             extra_ldflags=None, extra_include_paths=None, build_directory=None, verbose=False, with_musa=None,
             with_sycl=None, is_python_module=True, is_standalone=False, keep_intermediates=True):
        self.calls.append({"name": name, "sources": [open(s).read() for s in sources],
                           "files": [os.path.basename(s) for s in sources]})
        raise RuntimeError(f"Error building extension '{name}': fake mcc")


class FakeEvent:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        FakeRuntime.clock += 1.5
        self.t = FakeRuntime.clock

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return end.t - self.t


class FakeRuntime(types.SimpleNamespace):
    """torch.musa on an MTT S4000, as far as the backend uses it."""

    clock = 0.0
    Event = FakeEvent

    def __init__(self, sticky: bool = False):
        super().__init__(syncs=0, sticky=sticky)

    def is_available(self):
        return True

    def device_count(self):
        return 2

    def synchronize(self, device=None):
        self.syncs += 1
        if self.sticky:
            raise RuntimeError("MUSA error: an illegal memory access was encountered")

    def get_device_name(self, i=0):
        return "MTT S4000"

    def get_device_capability(self, i=0):
        return (2, 2)

    def mem_get_info(self, device=None):
        return 40 * 2**30, 48 * 2**30  # free, total: an S4000's 48 GB


@pytest.fixture
def fake_musa(monkeypatch):
    ext = FakeMusaExtension()
    pkg, utils = types.ModuleType("torch_musa"), types.ModuleType("torch_musa.utils")
    pkg.__version__, pkg.utils, utils.musa_extension = "2.7.1-fake", utils, ext
    for name, mod in (("torch_musa", pkg), ("torch_musa.utils", utils), ("torch_musa.utils.musa_extension", ext)):
        monkeypatch.setitem(sys.modules, name, mod)
    rt = FakeRuntime()
    monkeypatch.setattr(torch, "musa", rt, raising=False)
    monkeypatch.setattr(torch.version, "musa", "4.0.0-fake", raising=False)
    for fn in ("load_inline", "load"):  # a RemoteLoader installed here replaces them: put torch's back afterwards
        monkeypatch.setattr(cpp_extension, fn, getattr(cpp_extension, fn))
    build.extension_api.cache_clear()  # capture the fake loader, and forget it afterwards
    yield types.SimpleNamespace(ext=ext, rt=rt)
    build.extension_api.cache_clear()


# ---- backend choice ---------------------------------------------------------------------------------------------
class _RecordImports(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.asked = []

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch_musa":
            self.asked.append(name)
        return None


def test_auto_never_imports_torch_musa(monkeypatch):
    finder = _RecordImports()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    for name in [m for m in sys.modules if m.split(".")[0] == "torch_musa"]:
        monkeypatch.delitem(sys.modules, name)
    assert resolve("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert finder.asked == [] and "torch_musa" not in sys.modules


def test_auto_picks_musa_when_torch_musa_is_loaded_with_a_device(fake_musa, monkeypatch):
    assert resolve("auto") == "musa"
    monkeypatch.setattr(fake_musa.rt, "is_available", lambda: False)
    assert resolve("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(not NO_TORCH_MUSA, reason="torch_musa is installed here")
def test_unknown_or_unavailable_backend_is_a_clear_error(tmp_path):
    with pytest.raises(BackendError, match="unknown backend 'rocm'"):
        resolve("rocm")
    with pytest.raises(BackendError, match="needs torch_musa.*musa-on-cuda"):
        get_backend("musa")
    cand = tmp_path / "relu_musa.py"
    cand.write_text(translate(RELU, C2M).text)
    task = EXAMPLES_DIR.parent / "tasks" / "builtin" / "level1" / "19_ReLU.py"
    for backend, words in (("musa", "needs torch_musa"), ("rocm", "'rocm' is not one of")):
        r = subprocess.run([sys.executable, "-m", "musacoder.cli", "verify", "--candidate", str(cand), "--tasks",
                            str(task), "--backend", backend], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "error:" in r.stderr and words in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


# ---- the device side, over the fake torch.musa ------------------------------------------------------------------
def test_musa_device_hooks(fake_musa, monkeypatch):
    from musacoder.backends import available_bytes
    from musacoder.pool.slots import compile_env, device_env
    from musacoder.verifier.judge import auto_spares
    from musacoder.verifier.legality import OpTrace

    b = get_backend("musa")
    assert isinstance(b, MusaBackend) and b.device_type == "musa" and b.device_count() == 2
    t = b.timer()
    t.start()
    assert t.stop() == 1.5 and fake_musa.rt.syncs == 2  # events after a device-wide sync at both ends
    assert b.device_name() == "MTT S4000"
    v = b.versions()
    assert v["capability"] == "2.2" and v["musa"] == "4.0.0-fake" and v["torch_musa"] == "2.7.1-fake"
    assert b.build_env() == {"MUSA_VISIBLE_DEVICES": ""}
    assert available_bytes("musa") == 40 * 2**30  # the task-size check asks the device, not host RAM
    cfg = VerifyConfig(backend="musa")
    assert compile_env("musa", cfg, {"TORCH_MUSA_ARCH_LIST": "22"})["MUSA_VISIBLE_DEVICES"] == ""
    monkeypatch.setenv("MUSA_VISIBLE_DEVICES", "4,5")
    assert device_env("musa", cfg, 1) == {"MUSA_VISIBLE_DEVICES": "5"}
    # eight judges on one device split the automatic spares (each a device context) instead of 8 each
    assert device_env("musa", cfg, 1, sharing=8) == {"MUSA_VISIBLE_DEVICES": "5", "MUSACODER_JUDGES_SHARING": "8"}
    assert [auto_spares(64, 1), auto_spares(64, 8), auto_spares(16, 1), auto_spares(16, 2), auto_spares(2, 1)] == \
        [8, 1, 4, 2, 1]
    assert OpTrace.illegal_names({"musa::flash_attn_varlen_forward": 1}, b.torch_namespaces)  # torch_musa's compute
    assert b.is_fatal(RuntimeError("MUSA error: unknown error")) and not b.is_fatal(ValueError("shape mismatch"))
    monkeypatch.setattr(fake_musa.rt, "sticky", True)  # nothing in the message, but the next sync fails
    assert b.is_fatal(ValueError("shape mismatch"))


def test_arch_list_from_capability(monkeypatch):
    monkeypatch.delenv("TORCH_MUSA_ARCH_LIST", raising=False)
    b = MusaBackend()
    assert b.arch_env(["2.2"]) == {"TORCH_MUSA_ARCH_LIST": "22"}
    assert b.arch_env(["2.1", "3.1"]) == {"TORCH_MUSA_ARCH_LIST": "21;31"}
    assert b.arch_env([]) == {}
    monkeypatch.setenv("TORCH_MUSA_ARCH_LIST", "31")  # the user's own setting wins
    assert b.arch_env(["2.2"]) == {}
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert get_backend("cuda").arch_env(["9.0"]) == {"TORCH_CUDA_ARCH_LIST": "9.0"}


# ---- builds ------------------------------------------------------------------------------------------------------
def _subject_build_request(code: str, apis) -> dict:
    """Run a candidate's module level as a subject does and return the build request its load_inline sends."""
    sent = []

    def request_build(arguments):
        sent.append(arguments)
        return build.BuildReply(error="stop here")

    RemoteLoader(request_build, LaunchCounter(), apis).install()
    with pytest.raises(BuildError):
        exec(compile(code, "candidate", "exec"), {"__name__": "candidate"})
    return sent[0]


def test_exact_build_call_of_a_cuda_candidate_on_musa(fake_musa, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_MUSA_ARCH_LIST", MusaBackend().arch_env(["2.2"])["TORCH_MUSA_ARCH_LIST"])
    backend = MusaBackend()
    prepared = backend.prepare(RELU)
    assert "from torch_musa.utils.musa_extension import load_inline" in prepared.code and not prepared.notes
    request = _subject_build_request(prepared.code, backend.extension_apis)
    assert request["_api"] == "musa" and "cuda_sources" not in request

    builder = Builder(tmp_path, backend)
    reply = builder.build(dict(request))
    assert "fake mcc" in reply.error and len(fake_musa.ext.calls) == 1
    call = fake_musa.ext.calls[0]
    assert call["musa_sources"] == translate_cpp(RELU_SRC, C2M)
    assert "at::musa::getCurrentMUSAStream()" in call["musa_sources"] and "x.is_privateuseone()" in call["musa_sources"]
    assert "#include <torch_musa/csrc/aten/musa/MUSAContext.h>" in call["musa_sources"]
    assert call["cpp_sources"] == "torch::Tensor relu(torch::Tensor x);" and call["functions"] == ["relu"]
    assert call["extra_musa_cflags"] == ["-O3"] and call["arch_list"] == "22" and call["import_replaced"]
    assert call["name"] == f"mc_{reply.key}" and call["build_directory"] == str(tmp_path / "ext" / reply.key)
    assert fake_musa.ext._import_module_from_library.__func__ is FakeMusaExtension._import_module_from_library

    # the same kernel sent through torch's own load_inline (a form the source translation missed): translated at the
    # build, so it is the same build, found in the cache as the known compiler failure
    torch_request = {"name": "relu_ext", "cpp_sources": "torch::Tensor relu(torch::Tensor x);", "cuda_sources": RELU_SRC,
                     "functions": ["relu"], "extra_cuda_cflags": ["-O3"], "_kind": "inline", "_api": "torch"}
    again = builder.build(torch_request)
    assert again.key == reply.key and again.cached and len(fake_musa.ext.calls) == 1


def test_torch_api_requests_are_translated_for_mcc(fake_musa, tmp_path):
    builder = Builder(tmp_path, MusaBackend())
    builder.build({"name": "k", "cpp_sources": ["#include <ATen/cuda/CUDAContext.h>"], "cuda_sources": RELU_SRC,
                   "with_cuda": True, "extra_cuda_cflags": ["-O3", "--use_fast_math", "-arch=sm_90", "--expt-relaxed-constexpr"],
                   "_kind": "inline", "_api": "torch"})
    call = fake_musa.ext.calls[-1]
    assert call["cpp_sources"] == ["#include <torch_musa/csrc/aten/musa/MUSAContext.h>"] and call["with_musa"]
    assert call["extra_musa_cflags"] == ["-O3", "-ffast-math"] and "getCurrentMUSAStream" in call["musa_sources"]
    builder.build({"name": "f", "files": [["k.cu", RELU_SRC], ["k.cpp", "#include <cuda_runtime.h>"]],
                   "_kind": "files", "_api": "torch"})
    call = fake_musa.ext.calls[-1]
    assert call["files"] == ["k.mu", "k.cpp"] and call["sources"][1] == "#include <musa_runtime.h>"
    assert mcc_flags("-O2") == ["-O2"]


def test_cuda_builds_are_unchanged(tmp_path):
    """cuda's Builder still calls torch's loader with the arguments as sent (nothing translated)."""
    b = get_backend("cuda")
    args = {"name": "x", "cpp_sources": "int f();", "cuda_sources": RELU_SRC, "_api": "torch"}
    assert b.build_arguments("torch", dict(args)) == args
    assert build.extension_api(b.extension_apis[-1]).module is cpp_extension


# ---- admission: translation hook, portability review, verdict ------------------------------------------------------
class _AdmitOnly(PoolBase):
    """The pool's admission stage alone: a job that passes it is recorded and finished as if its build failed."""

    n_compile = n_devices = 0

    def __init__(self, backend, cache_dir):
        super().__init__(VerifyConfig(backend=backend, cache_dir=cache_dir))
        self.backend = backend
        self._device_ready.set()
        self.admitted = []

    def close(self):
        self.cache.close()

    def _to_compile(self, job):
        self.admitted.append(job.case.code)
        self._compiled(job, None, (Status.COMPILE_ERROR, "not built in this test"), 0.0)

    def _to_device(self, job):
        raise AssertionError("every candidate here builds native code")

    def _queue_depths(self):
        return {}


def _admit(backend: str, code: str, tmp_path) -> tuple[Verdict, list[str]]:
    with _AdmitOnly(backend, tmp_path) as pool:
        v = pool.submit(builtin_task("level1/94_MSELoss"), f"```python\n{code}\n```").result(timeout=30)
        return v, pool.admitted


def builtin_task(key):
    from musacoder.tasks import builtin_task as task

    return task(key)


def test_musa_on_cuda_turns_c2m_examples_back_into_the_originals(tmp_path):
    b = MusaOnCudaBackend()
    for path in CUDA_EXAMPLES:
        src = path.read_text()
        prepared = b.prepare(translate(src, C2M).text)
        assert prepared.code == src, path.name
        assert not prepared.refusal
    mse = (EXAMPLES_DIR / "cuda" / "honest_mse_loss.py").read_text()
    v, admitted = _admit("musa-on-cuda", translate(mse, C2M).text, tmp_path)
    assert [a.strip() for a in admitted] == [mse.strip()]  # what reaches the compile tier is the CUDA original
    assert v.emulated and v.backend == "musa-on-cuda" and v.portability
    assert all("[fp64]" in n for n in v.portability)
    assert "MUSA portability" in v.feedback and v.portability[0] in v.feedback and "Emulated" in v.feedback
    assert Verdict.from_dict(v.to_dict()).portability == v.portability and '"emulated": true' in v.to_json()


def test_musa_backends_get_the_cuda_examples_in_musa_dialect():
    """`demo --backend musa` and the RL warm start read the catalog: the CUDA examples, translated c2m."""
    from musacoder.conversation import task_messages
    from musacoder.train.rl.trainer import warm_start_records

    cuda = load_catalog("cuda")
    for backend in ("musa", "musa-on-cuda"):
        musa = load_catalog(backend)
        assert [e.file for e in musa] == [e.file for e in cuda] and {e.backend for e in musa} == {backend}
        for m, c in zip(musa, cuda, strict=True):
            assert m.code == translate(c.code, C2M).text and translate(m.code, M2C).text == c.code
        relu = next(e for e in musa if e.name == "honest_relu")
        assert "musa_sources" in relu.code and "cuda_sources" not in relu.code
    task = builtin_task("level1/19_ReLU")
    records = warm_start_records([task], "musa-on-cuda", False, ["cuda/honest_relu.py"])
    assert len(records) == 1 and "musa_sources" in records[0]["messages"][-1]["content"]
    assert records[0]["messages"][:-1] == task_messages(task, "musa-on-cuda", False)


def test_musa_feedback_carries_findings_and_ptx_is_refused_before_building(fake_musa, tmp_path):
    v, admitted = _admit("musa", PTX_RELU, tmp_path)
    assert admitted == [] and v.status is Status.COMPILE_ERROR and not v.emulated
    assert v.reason.startswith("cannot build for MUSA: line") and "[ptx]" in v.reason
    assert any("[ptx]" in n for n in v.portability) and "[ptx]" in v.feedback
    v, admitted = _admit("musa-on-cuda", translate(PTX_RELU, C2M).text, tmp_path)
    assert admitted == [] and v.status is Status.COMPILE_ERROR and v.emulated  # nvcc would build it: refused anyway
    v, admitted = _admit("musa", RELU, tmp_path)  # a clean CUDA candidate: translated c2m, no notes
    assert [a.strip() for a in admitted] == [translate(RELU, C2M).text.strip()] and v.portability == [] and "MUSA portability" not in v.feedback
    v, _ = _admit("cuda", PTX_RELU, tmp_path)  # other backends: no review, no translation
    assert v.portability == [] and not v.emulated and v.status is Status.COMPILE_ERROR
    assert v.reason == "not built in this test"


def test_static_check_covers_torch_musa_internals():
    from musacoder.verifier.static import check_source

    res = check_source("import torch_musa.utils.musa_extension as me\nimport torch.nn as nn\n"
                       "me._jit_compile('x')\nclass ModelNew(nn.Module):\n    pass\n")
    assert res.status is Status.ILLEGAL and "harness internals" in res.reason


# ---- prompts ---------------------------------------------------------------------------------------------------
def test_musa_prompt():
    from musacoder.conversation import _CUDA_EXAMPLE, STYLES, task_messages
    from musacoder.musa.portability import check

    task = builtin_task("level1/19_ReLU")
    system, user = task_messages(task, "musa")
    text = system["content"] + user["content"]
    assert "MUSA" in system["content"] and "musa_sources=musa_source" in text and "warpSize" in text
    assert "cuda_sources" not in text and "torch.utils.cpp_extension" not in text and "__mt_bfloat16" in text
    assert not re.search(r"&\s*31\b|>>\s*5\b|%\s*32\b|/\s*32\b|\b32[- ](lanes|threads)|warp size (of|is) 32", text)
    example = STYLES["musa"].example
    assert check(example) == []
    assert translate(example, M2C).text.replace("musa_source", "cuda_source") == _CUDA_EXAMPLE  # derived, not copied
    assert task_messages(task, "musa-on-cuda") == [system, user]


# ---- end to end --------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_musa_on_cuda_gives_the_cuda_verdicts(cache_dir):
    """Every shipped CUDA example, translated c2m and verified with musa-on-cuda, gets its original's status. Timing
    off, to keep it short: the musa-on-cuda pass builds every example again (the backend is part of the build key),
    and both passes with timing took over 190 s on an H200 (2026-11-26)."""
    from musacoder.api import verify_many

    examples = load_catalog("cuda")
    cuda = dict(verify_many([(builtin_task(e.task), e.code) for e in examples],
                            VerifyConfig(backend="cuda", cache_dir=cache_dir, timing_enabled=False)))
    musa = dict(verify_many([(builtin_task(e.task), e.code) for e in load_catalog("musa-on-cuda")],
                            VerifyConfig(backend="musa-on-cuda", cache_dir=cache_dir, timing_enabled=False)))
    for i, e in enumerate(examples):
        assert musa[i].emulated and not cuda[i].emulated
        if e.expect == "ok_timed":  # caught or not depending on timing, in either run
            assert {cuda[i].status.value, musa[i].status.value} <= {"ok", "incorrect"}, e.file
        else:
            assert musa[i].status == cuda[i].status, (e.file, cuda[i].reason, musa[i].reason)


@pytest.mark.musa
def test_musa_verifies_a_translated_kernel_on_the_device(cache_dir):
    from musacoder.api import verify

    v = verify(builtin_task("level1/19_ReLU"), translate(RELU, C2M).text,
               VerifyConfig(backend="musa", cache_dir=cache_dir, timing_enabled=False))
    assert v.status is Status.OK, (v.reason, v.compile_log[-2000:])
    assert v.versions.get("musa") and v.device
