"""Turn a model's raw output (or a .py file) into candidate source."""

from __future__ import annotations

import hashlib
import re

_BLOCK_RE = re.compile(r"```[ \t]*(python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


class ExtractionError(ValueError):
    pass


def extract_code(raw: str) -> str:
    """The last complete python code block after any `</think>`; plain source passes through unchanged."""
    text = raw.rsplit("</think>", 1)[-1]
    if "```" not in text:
        if "ModelNew" in text:
            return text
        raise ExtractionError("no python code block found in the model output")
    blocks = _BLOCK_RE.findall(text)
    if not blocks:
        raise ExtractionError("no complete ``` code block found (is the last block unterminated?)")
    tagged = [code for lang, code in blocks if lang]
    return (tagged or [code for _, code in blocks])[-1]


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()[:16]
