"""Per-stage seconds of a verification (Facts.stage_seconds), as the judge and the timing window record them."""

from __future__ import annotations

import time
from contextlib import contextmanager

from musacoder.verifier.protocol import Facts


@contextmanager
def stage(facts: Facts, name: str):
    """Seconds spent in `name`, summed when it is entered again (the trials' parts, once per trial)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        facts.stage_seconds[name] = round(facts.stage_seconds.get(name, 0.0) + time.perf_counter() - t0, 4)
