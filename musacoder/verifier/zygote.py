"""The fork server for subject processes: `python -m musacoder.verifier.zygote --fd N` (its plumbing:
`proc.zygote`).

Starting a candidate process from scratch costs the import of Python, torch and the harness (~1.5 s of CPU; ~10 s
with the CUDA runtime on an H200 host); a judge needs one per candidate. The zygote imports all of that once, creates
no device context and runs no candidate code, and forks one child per request (~20 ms; the way torch's own DataLoader
workers start). The child applies its environment and its sandbox before anything else runs, then becomes a subject
(`subject.main`), which creates its own device context. A candidate's child forks once more
(`sandbox.own_namespace`): the subject runs as PID 1 of a PID namespace of its own, and the zygote's child stays
behind as its waiter, ending as it ended, so the exit the zygote records is the subject's; the judge's handle moves
to the subject once it says its pid (`proc.process.UnderWaiter`).
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from musacoder.proc.zygote import Zygote, serve


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    args = ap.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    from musacoder.proc.process import adopt_orphans_and_follow_parent

    adopt_orphans_and_follow_parent()
    # torch.cuda.is_available() (cpp_extension calls it on import) initialises the CUDA driver unless told to ask NVML,
    # and a child forked after that cannot use the device ("Cannot re-initialize CUDA in forked subprocess")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    # what every subject imports, loaded once here (no device context: a CUDA context does not survive a fork)
    import torch

    import musacoder.backends  # noqa: F401
    import musacoder.verifier.buffers  # noqa: F401
    import musacoder.verifier.build  # noqa: F401
    import musacoder.verifier.inputs  # noqa: F401
    import musacoder.verifier.legality  # noqa: F401
    import musacoder.verifier.protocol  # noqa: F401
    from musacoder.backends import get_backend
    from musacoder.verifier import legality, subject
    from musacoder.verifier.capture import keep_alive_warmed

    # warm torch's Python dispatch machinery once (the first traced call costs ~0.7 s of CPU), on the CPU only, and
    # a capture's keep-alive where subjects may capture (its first use imports torch._dynamo: ~1 s more)
    cuda = torch.device("cuda") if torch.cuda.is_available() else None  # NVML's answer: no context made
    with torch.no_grad(), legality.OpTrace(get_backend("cpu").torch_namespaces), keep_alive_warmed(cuda):
        torch.ones(2).clone().view(2, 1)

    serve(sock, subject.main, {"device_fork": _children_can_use_the_device(torch)})


def _children_can_use_the_device(torch) -> bool:
    """Whether a child forked now could still initialise the device: torch marks it "in bad fork" when anything
    imported here initialised CUDA."""
    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


class SubjectZygote(Zygote):
    """The judge's handle on its fork server."""

    def __init__(self, env: dict, log_path: Path):
        super().__init__("musacoder.verifier.zygote", env, log_path)

    def device_fork(self) -> bool:
        """Whether its children can use the device (started if it is not running)."""
        return bool(self.running().get("device_fork"))


if __name__ == "__main__":
    main()
