"""MUSA backend (Moore Threads GPUs through torch_musa): `torch.musa` events, streams and memory, builds through
`torch_musa.utils.musa_extension`. Nothing here has run on MUSA hardware (see docs/musa.md).

torch_musa is imported only when a device-side method needs it, never at import: the pool's process uses this backend
for `prepare` alone (translate c2m, portability review), which must work where torch_musa is not installed.
Candidates are verified in MUSA dialect: a CUDA-dialect one is translated c2m first (Python and embedded C++), and a
build that still reaches torch's own `load_inline` (a form the source translation missed) is translated again, so
`cuda_sources` builds with mcc as `musa_sources`.
"""

from __future__ import annotations

import tokenize

import torch

from musacoder.backends.base import DEVICE_FATAL, GpuBackend, Prepared
from musacoder.musa.translate import C2M, translate, translate_cpp

# Kernel-name fragments of PyTorch's and the MUSA libraries' own kernels (muDNN, muBLAS, MUTLASS), for the profile
# heuristic used when the built library's kernel names are unknown; inferred from the CUDA list, not from a trace.
LIBRARY_KERNELS = ("at::", "at_musa_detail", "c10::", "mudnn", "mublas", "mutlass", "mufft", "murand", "Memcpy",
                   "Memset", "triton_poi", "triton_red", "triton_per", "triton_tem")
# torch.utils.cpp_extension's argument names -> torch_musa.utils.musa_extension's
_TORCH_TO_MUSA = {"cuda_sources": "musa_sources", "extra_cuda_cflags": "extra_musa_cflags", "with_cuda": "with_musa"}
# nvcc flags as candidates write them; mcc is clang-based (docs/musa.md 4), so the nvcc spelling would be refused.
# Target flags are dropped: the architecture comes from TORCH_MUSA_ARCH_LIST. Unverified with a real mcc.
_NVCC_RENAMED = {"--use_fast_math": "-ffast-math", "-use_fast_math": "-ffast-math"}
_NVCC_ONLY = ("-arch", "--gpu-architecture", "-gencode", "--generate-code", "--expt-", "-Xptxas", "--ptxas-options",
              "-lineinfo", "-maxrregcount", "--maxrregcount", "-Xcompiler", "--compiler-options")


def translated(code: str, direction: str) -> tuple[str, list[str]]:
    """A candidate in the other dialect, with the translator's warnings; unparsable code is left to the static
    check, which reports it."""
    try:
        res = translate(code, direction)
    except (SyntaxError, tokenize.TokenError):
        return code, []
    return res.text, res.warnings


def review(code: str) -> tuple[list[str], str]:
    """MUSA portability findings of a candidate (either dialect) as feedback lines, and the refusal when one of them
    cannot compile for MUSA (musa.portability.FATAL_RULES)."""
    from musacoder.musa.portability import FATAL_RULES, check

    findings = check(code)
    fatal = [str(f) for f in findings if f.rule in FATAL_RULES]
    return [str(f) for f in findings], ("cannot build for MUSA: " + "; ".join(fatal) if fatal else "")


def mcc_flags(flags) -> list[str]:
    flags = [flags] if isinstance(flags, str) else list(flags or [])
    return [_NVCC_RENAMED.get(f, f) for f in flags if not f.startswith(_NVCC_ONLY)]


def _c2m_sources(sources):
    return translate_cpp(sources, C2M) if isinstance(sources, str) else [translate_cpp(s, C2M) for s in sources]


def _torch_module():
    import torch_musa  # noqa: F401  (registers torch.musa and the "musa" device)

    return torch.musa


class MusaBackend(GpuBackend):
    name = "musa"
    device_type = "musa"
    visible_devices_var = "MUSA_VISIBLE_DEVICES"
    arch_env_var = "TORCH_MUSA_ARCH_LIST"
    extension_apis = ("torch", "musa")
    fatal_errors = (*DEVICE_FATAL, "MUSA error: unknown error")
    # torch_musa registers its own compute under `musa::` (torch.ops.musa.flash_attn_varlen_forward, fused optimisers):
    # PyTorch's side, so calling it from forward is a fallback, never the candidate's own kernel
    torch_namespaces = (*GpuBackend.torch_namespaces, "musa", "mudnn")

    @property
    def rt(self):
        return _torch_module()

    def device(self, index: int = 0) -> torch.device:
        _torch_module()  # the "musa" device type exists once torch_musa is loaded
        return super().device(index)

    def arch_name(self, capability: str) -> str:
        """torch.musa capability "2.2" -> "22", the TORCH_MUSA_ARCH_LIST entry musa_extension turns into
        --offload-arch=mp_22 (accepted: 10, 21, 22, 31, 32)."""
        return capability.replace(".", "")

    def prepare(self, code: str) -> Prepared:
        musa, warnings = translated(code, C2M)
        notes, refusal = review(code)
        return Prepared(musa, notes + warnings, refusal)

    def build_arguments(self, api: str, arguments: dict) -> dict:
        args = dict(arguments)
        if api == "torch":  # torch's loader was called: its CUDA sources and arguments, in MUSA terms
            args = {_TORCH_TO_MUSA.get(k, k): v for k, v in args.items()}
            for k in ("cpp_sources", "musa_sources"):
                if args.get(k):
                    args[k] = _c2m_sources(args[k])
            if "files" in args:  # `load`: musa_extension compiles only .mu files with mcc
                args["files"] = [[n[:-3] + ".mu" if n.endswith(".cu") else n, _c2m_sources(t)]
                                 for n, t in args["files"]]
        if "extra_musa_cflags" in args:
            args["extra_musa_cflags"] = mcc_flags(args["extra_musa_cflags"])
        return args

    def disable_tf32(self) -> None:
        super().disable_tf32()
        mudnn = getattr(torch.backends, "mudnn", None)  # torch_musa's switch (matmul and conv on S4000)
        if mudnn is not None:
            mudnn.allow_tf32 = False

    def versions(self) -> dict[str, str]:
        import torch_musa

        return {**super().versions(), "musa": str(getattr(torch.version, "musa", None)),
                "torch_musa": str(getattr(torch_musa, "__version__", "?"))}

    def kernel_profile(self, fn, args, own_kernels: list[str] | None = None) -> dict | None:
        """None where torch.profiler has no MUSA activity, or recorded no MUSA device event (no evidence: a
        Kineto without MUSA support must not make every candidate look kernel-less)."""
        from torch.profiler import ProfilerActivity, profile

        activity = getattr(ProfilerActivity, "MUSA", None) or getattr(ProfilerActivity, "PrivateUse1", None)
        if activity is None:
            return None
        prof, seen = self.profile_kernels(fn, args, own_kernels, profile(activities=[ProfilerActivity.CPU, activity]),
                                          lambda t: getattr(t, "name", str(t)).upper() in ("PRIVATEUSE1", "MUSA"),
                                          LIBRARY_KERNELS)
        return prof if seen else None
