"""Does a candidate subject in a PID namespace of its own still use the GPU and the judge's CUDA IPC buffers?

A candidate subject runs as PID 1 of its own PID namespace (`verifier/sandbox.py::own_namespace`); the judge, which
allocates the buffers it maps (CUDA IPC, `verifier/buffers.py`), stays in the host's. Legacy CUDA IPC handles are
reported not to open across PID namespaces between containers (both sides namespaced); here only the importer is.

1. probe: this process allocates a buffer as the judge does and fills it; a child sandboxed as a candidate is (own
   namespace, Landlock with /dev/shm and its /proc entry writable) opens it, checks its values and writes its output
   buffer; once in a namespace of its own, once without (the control).
2. verdicts: `cuda/honest_relu.py` and the exploits 50 and 51 through a LocalPool, against the catalog.

  python scripts/pidns_cuda_check.py              # both
  python scripts/pidns_cuda_check.py --probe-only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

CHILD = """
import json, os, sys
from musacoder.verifier.sandbox import own_namespace, restrict_writes

private, refs, namespaced = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
pid, isolated, tmp = own_namespace(private) if namespaced else (os.getpid(), "no namespace (control)", [])
sandbox = restrict_writes(private, ["/dev/shm", os.path.realpath("/proc/self")] + tmp) + "; " + isolated
import torch
from musacoder.verifier.buffers import open_ref
from musacoder.verifier.protocol import TensorRef
try:
    x, out = (open_ref(TensorRef.model_validate(r)) for r in refs)
    out.copy_(x * 2)
    torch.cuda.synchronize()
    print(json.dumps({"ok": True, "sum": float(x.sum()), "sandbox": sandbox}), flush=True)
except Exception as e:
    print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}", "sandbox": sandbox}), flush=True)
"""


def probe(namespaced: bool) -> bool:
    import torch

    from musacoder.verifier import buffers

    device = torch.device("cuda")
    pool = buffers.new_pool(device)
    x, xref = buffers.alloc([1 << 20], torch.float32, device, None, pool)
    out, oref = buffers.alloc([1 << 20], torch.float32, device, None, pool)
    x.copy_(torch.arange(1 << 20, device=device, dtype=torch.float32))
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory(prefix="musacoder-pidns-") as private:
        r = subprocess.run([sys.executable, "-c", CHILD, private, json.dumps([xref.model_dump(), oref.model_dump()]),
                            "1" if namespaced else "0"], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    got = json.loads(lines[-1]) if lines else {"ok": False, "error": f"exit {r.returncode}: {r.stderr[-1500:]}"}
    good = got["ok"] and got["sum"] == float(x.sum()) and torch.equal(out, x * 2)
    print(f"{'namespaced' if namespaced else 'control'}: {'PASS' if good else 'FAIL'} {got}")
    return good


def verdicts() -> bool:
    from musacoder.config import VerifyConfig
    from musacoder.examples_catalog import load_catalog
    from musacoder.pool.local import LocalPool
    from musacoder.tasks import builtin_task

    names = ("cuda/honest_relu.py", "cuda/exploit_50_signal_reference.py", "cuda/exploit_51_escaped_helper.py")
    examples = [e for e in load_catalog("cuda") if e.file in names]
    cfg = VerifyConfig(backend="cuda", cache_dir=tempfile.mkdtemp(prefix="musacoder-pidns-cache-"))
    cfg.timing.baselines = ("eager",)
    good = True
    with LocalPool(cfg) as pool:
        got = dict(pool.verify_many((builtin_task(e.task), e.code) for e in examples))
        for i, e in enumerate(examples):
            v = got[i]
            match = v.status.value in e.accepted and e.reason_matches(v.reason)
            good &= match
            print(f"{e.file}: {v.status.value} ({'as' if match else 'NOT as'} the catalog: {e.expect}, '{e.reason}')"
                  f" | {v.reason} | speedup {v.speedup_eager} | sandbox: {v.details.get('sandbox')}")
    return good


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe-only", action="store_true")
    args = ap.parse_args()
    good = probe(False) & probe(True)
    if not args.probe_only:
        good &= verdicts()
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
