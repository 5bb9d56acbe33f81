"""pool/: device workers (recycling, placement, cores) and a malformed worker answer."""

import os
import time

import pytest
import torch

from musacoder.config import VerifyConfig


def test_device_worker_recycles_on_its_own_gpu_memory_only():
    from musacoder.pool.worker import GIB, gpu_holds_memory

    total = 80 * GIB
    # an RL trainer on the same GPU holds 64 GB: the worker (1 GB of its own) is not recycled
    assert not gpu_holds_memory(allocated=0, own=1 * GIB, reserved=0, free=15 * GIB, total=total)
    # a candidate's raw cudaMalloc leak, invisible to torch, shows in the worker's own NVML usage
    assert gpu_holds_memory(allocated=0, own=60 * GIB, reserved=0, free=19 * GIB, total=total)
    # torch's own cache is not a leak; a tensor kept alive past the job is
    assert not gpu_holds_memory(allocated=0, own=5 * GIB, reserved=3 * GIB, free=70 * GIB, total=total)
    assert gpu_holds_memory(allocated=3 * GIB, own=4 * GIB, reserved=3 * GIB, free=70 * GIB, total=total)
    # without NVML only free memory can tell
    assert gpu_holds_memory(allocated=0, own=None, reserved=0, free=15 * GIB, total=total)
    assert not gpu_holds_memory(allocated=0, own=None, reserved=0, free=70 * GIB, total=total)


def test_recycle_reason_names_the_live_device_tensors():
    """A judge recycled for memory says which device tensors outlived the job and what holds them (a meta tensor
    stands in for a GPU one here)."""
    from musacoder.pool.worker import _live_device_tensors

    class Holder:
        pass

    import weakref

    h = Holder()
    h.big = torch.empty(4096, 393216, device="meta")
    gone = Holder()
    dead = weakref.proxy(gone)  # a dead proxy among gc's objects must not break the scan (CI run 23)
    del gone
    said = _live_device_tensors()
    assert "(4096, 393216) torch.float32 held by ['Holder']" in said
    del h
    assert "4096" not in _live_device_tensors()
    del dead


def test_device_workers_go_where_verify_devices_says(tmp_path):
    """`verify.devices` places one device worker per entry (a GPU may take several); a device the host lacks is an
    error before anything starts. The pool is not started here (its workers start with the first job)."""
    from types import SimpleNamespace

    from musacoder.pool.local import LocalPool
    from musacoder.train.sft import one_gpu

    with LocalPool(VerifyConfig(backend="cpu", devices=(0, 0), cache_dir=tmp_path)) as pool:
        assert pool.n_devices == 2 and pool.stats()["devices"] == 2
    with LocalPool(VerifyConfig(backend="cpu", cache_dir=tmp_path)) as pool:
        assert pool.n_devices == 1
    with pytest.raises(ValueError, match="does not have"):
        LocalPool(VerifyConfig(backend="cpu", devices=(1,), cache_dir=tmp_path))
    with pytest.raises(ValueError, match="indices"):
        VerifyConfig(devices=(-1,))
    # one process with two GPUs visible trains on the first (the verifier takes the other), not nn.DataParallel
    args = SimpleNamespace(n_gpu=2, _n_gpu=2)
    assert one_gpu(args, "")._n_gpu == 1


def test_verifier_processes_run_on_the_cores_they_are_given(tmp_path):
    """`verify.cpus` keeps judges, compile workers and the processes they start off the caller's cores (an RL
    trainer's generate loop); a core the host lacks is refused up front. `verify.spares` sets how many candidate
    processes a judge keeps ready."""

    import psutil

    from musacoder.pool.local import LocalPool
    from musacoder.pool.slots import compile_env

    core = max(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="this host's cores are"):
        VerifyConfig(backend="cpu", cpus=(os.cpu_count(),))

    def ours(since: float) -> dict[int, tuple[str, list[int], int]]:
        """The pool's processes (started since `since`), their cores and their parents."""
        out = {}
        for k in psutil.Process().children(recursive=True):
            try:
                if k.create_time() >= since and "musacoder." in " ".join(k.cmdline()):
                    out[k.pid] = (" ".join(k.cmdline()), k.cpu_affinity(), k.ppid())
            except psutil.Error:  # gone meanwhile
                pass
        return out

    since = time.time() - 1
    cfg = VerifyConfig(backend="cpu", cache_dir=tmp_path, cpus=(core,), spares=3)
    with LocalPool(cfg) as pool:
        assert pool.wait_ready(timeout=120).cpus == [core]
        procs = ours(since)
    assert len(procs) >= 2, procs  # the judge and what it started (zygote, spare candidate subjects)
    assert all(cpus == [core] for _, cpus, _ in procs.values()), procs
    # `verify.spares`: the fork server and the three spares it forked (a child keeps the server's command line; each
    # spare's subject runs below it, as PID 1 of its own namespace)
    servers = [p for p, (cmd, _, parent) in procs.items() if "musacoder.verifier.zygote" in cmd
               and "musacoder.verifier.zygote" not in procs.get(parent, ("",))[0]]
    assert len(servers) == 1 and sum(parent == servers[0] for _, _, parent in procs.values()) == 3, procs
    # compile workers start with their first job, through the same variable
    assert compile_env("cpu", cfg, {})["MUSACODER_WORKER_CPUS"] == str(core)


def test_a_malformed_worker_answer_is_an_infra_error_not_a_crash(tmp_path):
    """Pool <-> worker messages are typed: a compile worker's answer that is not a PrebuildResult, or a device
    worker's hello that is not a WorkerHello, ends as a recorded error (no worker process is started here)."""
    from musacoder.pool.slots import CompileSlot, DeviceSlot

    cfg = VerifyConfig(backend="cpu", cache_dir=tmp_path)
    slot = CompileSlot("cpu", cfg, tmp_path, {})
    slot.worker.call = lambda job, timeout: {"builds": "not a list"}
    res, failure, _ = slot.run("import torch")
    assert failure is None and res.infra_error.startswith("malformed answer from the compile worker"), res
    slot.worker.call = lambda job, timeout: {"builds": [], "kernels": ["k"], "seconds": 1.5}
    assert slot.run("import torch")[0].kernels == ["k"]
    dev = DeviceSlot("cpu", cfg, tmp_path, 0)
    dev.dev.start = lambda: {"type": "hello", "pid": 1}  # no role
    assert "role" in dev.start().error


def test_every_index_is_answered_when_submitting_or_verifying_fails(cpu_config):
    """pool.verify_many (the stream the api's verify_many uses too): a job the pool refuses and a job whose verification
    raised are those indices' infra_error verdicts, complete (reward, feedback), never a hang or a lost index."""
    from concurrent.futures import Future

    from musacoder.pool.local import LocalPool
    from musacoder.tasks import builtin_task

    relu = builtin_task("level1/19_ReLU")

    def submit(task, candidate, index=0):
        if index == 0:
            raise RuntimeError("queue closed")
        f = Future()
        f.set_exception(OSError("judge lost"))
        return f

    with LocalPool(cpu_config) as pool:  # the session's cache: its op tracer is built once
        pool.submit = submit  # no worker starts: nothing reaches a tier
        got = dict(pool.verify_many([(relu, "a"), (relu, "b")]))
    assert sorted(got) == [0, 1] and all(v.status.value == "infra_error" and v.reward == -1.0 for v in got.values())
    assert got[0].reason.startswith("the pool refused the job: RuntimeError: queue closed")
    assert got[1].reason.startswith("the verifier failed: OSError: judge lost") and got[1].feedback


def test_an_infra_errors_reason_is_the_errors_own_line():
    """A CUDA error's message ends in advice; the verdict's reason (the last line) was that advice (H200, 2026-11-29:
    'verifier error: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.')."""
    from musacoder.pool.worker import infra_error
    from musacoder.verifier.pipeline import _first_line

    try:
        raise RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported\n"
                           "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
    except RuntimeError as e:
        text = infra_error(e)
    assert _first_line(text) == "RuntimeError: CUDA error: out of memory"
    assert "Traceback" in text and "TORCH_USE_CUDA_DSA" in text  # the whole story stays in the facts
