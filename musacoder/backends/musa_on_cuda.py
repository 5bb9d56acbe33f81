"""`musa-on-cuda`: MUSA-dialect candidates verified on an NVIDIA GPU. The candidate is translated m2c (Python and
embedded C++) where the static checks run, before it reaches a subject; from there it is verified exactly as a
`cuda` candidate, against the same CUDA/KernelBench reference. Verdicts are marked emulated: 128-lane warps, the
28 KB static shared-memory cap and MUSA timing are not exercised here; the portability review reports them."""

from __future__ import annotations

from musacoder.backends.base import Prepared
from musacoder.backends.cuda import CudaBackend
from musacoder.backends.musa import review, translated
from musacoder.musa.translate import M2C


class MusaOnCudaBackend(CudaBackend):
    name = "musa-on-cuda"
    emulated = True

    def prepare(self, code: str) -> Prepared:
        cuda, warnings = translated(code, M2C)
        notes, refusal = review(code)  # line numbers of the MUSA text the model wrote
        return Prepared(cuda, notes + warnings, refusal)
