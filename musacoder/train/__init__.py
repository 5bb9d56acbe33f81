"""Training: the record format and mixing (`data`), multi-task SFT (`sft`), diversity-preserving RFT (`rft`,
`diversity`). Heavy libraries (trl, peft, datasets, datasketch) are imported by the modules that need them, so
`musacoder.train.data` loads with the core dependencies alone."""


def bf16_mixed(flag: bool | None) -> bool:
    """Whether a trainer computes in bf16: `flag` as set, or (None) where the device supports it. One rule for SFT
    and RL, decided when the trainer is made."""
    if flag is not None:
        return flag
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
