"""Decoding with Hugging Face `generate`: the attention kernels to leave out while the sequence grows a token a step."""

from __future__ import annotations

from contextlib import AbstractContextManager


def decoding_attention() -> AbstractContextManager:
    """Scaled-dot-product attention without the cuDNN backend, which torch picks for bf16/fp16 on Hopper and which
    builds an execution plan for every new sequence length: decoding meets a new length every token. Measured on an
    H100 (31M Llama, batch 32, 256 new tokens under bf16 autocast): 368 tokens/s at unseen lengths, 3,190 at lengths
    seen before, 3,315 at unseen lengths without cuDNN attention (docs/benchmarks.md)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
