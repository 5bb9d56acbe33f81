import os

import pytest
import torch

from musacoder.config import VerifyConfig


def pytest_collection_modifyitems(config, items):
    from musacoder.backends import musa_loaded

    skips = {"gpu": None if torch.cuda.is_available() else "needs a CUDA GPU (run on the device machine)",
             "musa": None if musa_loaded() and torch.musa.is_available() else "needs a MUSA GPU with torch_musa"}
    for item in items:
        for marker, reason in skips.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session", autouse=True)
def precompiled_headers(tmp_path_factory):
    """The builds' precompiled torch headers (verifier/pch.py) in the session's folder, not the user's: made once a
    session for each set of flags, before any compile worker starts (they inherit the environment)."""
    os.environ.setdefault("MUSACODER_PCH_DIR", str(tmp_path_factory.mktemp("pch")))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One build cache for the whole session, so each distinct extension builds once."""
    path = os.environ.get("MUSACODER_TEST_CACHE")
    return path or str(tmp_path_factory.mktemp("musacoder-cache"))


@pytest.fixture
def cpu_config(cache_dir):
    return VerifyConfig(backend="cpu", cache_dir=cache_dir, timing_enabled=False)
