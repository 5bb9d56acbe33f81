"""candidates.py: extracting the program from a model's answer."""


import pytest

from musacoder.candidates import ExtractionError, extract_code


def test_extract_last_python_block_after_think():
    raw = ("<think>```python\nclass ModelNew: wrong\n```</think>Here:\n```python\nA = 1\n```\ntext\n"
           "```python\nclass ModelNew: pass\n```\n```\nplain\n```")
    assert extract_code(raw).strip() == "class ModelNew: pass"


def test_extract_plain_source_and_errors():
    assert extract_code("class ModelNew: pass\n").startswith("class ModelNew")
    with pytest.raises(ExtractionError):
        extract_code("<think>```python\nclass ModelNew: pass\n```</think> sorry, no code")
    with pytest.raises(ExtractionError):
        extract_code("```python\nclass ModelNew: pass\n")  # unterminated
