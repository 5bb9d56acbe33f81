import os

import pytest
import torch

from musacoder.config import VerifyConfig


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One build cache for the whole session, so each distinct extension builds once."""
    path = os.environ.get("MUSACODER_TEST_CACHE")
    return path or str(tmp_path_factory.mktemp("musacoder-cache"))


@pytest.fixture
def cpu_config(cache_dir):
    return VerifyConfig(backend="cpu", cache_dir=cache_dir, timing_enabled=False)
