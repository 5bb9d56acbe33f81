"""Service settings. The verifier config is not here: it is the pool's, fixed for the life of the service."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ServiceSettings:
    # Bearer token required on every endpoint but /healthz; None leaves the service open (loopback use only).
    token: str | None = None
    # Accepted-but-unfinished jobs; past this, submissions get 429. An RL step of 512 x 3 turns fits with room.
    max_queue: int = 4096
    # Request bodies over this get 413. A task plus a candidate is tens of KiB; 16 MiB fits a batch of hundreds.
    max_body_mb: float = 16.0
    # Seconds a 429 asks the client to wait (Retry-After).
    retry_after_s: int = 2
    # Cap on a long poll (`?wait=`), kept under the usual 60 s idle timeout of proxies.
    max_wait_s: float = 50.0
    # Threads that hand jobs to the pool: pool.submit blocks under backpressure, and a few threads keep
    # instantly-judged candidates from waiting behind a blocked one.
    dispatch_threads: int = 4
    # SQLite file of finished verdicts; None puts `service.sqlite` in the verifier's cache directory.
    db_path: Path | None = None

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)
