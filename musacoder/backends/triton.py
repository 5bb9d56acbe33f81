"""Triton backend: candidates launch @triton.jit kernels; launches are counted through JITFunction.run."""

from __future__ import annotations

from musacoder.backends.cuda import CudaBackend


class TritonBackend(CudaBackend):
    name = "triton"

    def install_launch_hook(self, counter) -> None:
        """Count launches of every Triton kernel (installed by the harness before any candidate is imported)."""
        from triton.runtime.jit import JITFunction

        real_run = JITFunction.run

        def run(self_, *args, **kwargs):
            counter.launches += 1
            counter.names.add(getattr(self_, "__name__", "triton_kernel"))
            return real_run(self_, *args, **kwargs)

        JITFunction.run = run
