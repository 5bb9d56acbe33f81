"""The run's SQLite store: one row per (task, sample, turn), written as soon as each step finishes.

A row's status is `generated` (waiting for its verdict), `generation_error` (retried on the next run) or a verdict
status. The primary key makes resuming idempotent: a step redone overwrites its row, never duplicates it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from musacoder.bench.clients.base import Generation
from musacoder.verifier.verdict import Verdict

GENERATED = "generated"
GENERATION_ERROR = "generation_error"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    task TEXT NOT NULL, level INTEGER, sample INTEGER NOT NULL, turn INTEGER NOT NULL,
    status TEXT NOT NULL, messages TEXT NOT NULL, raw TEXT, code TEXT, error TEXT, verdict TEXT,
    prompt_tokens INTEGER, completion_tokens INTEGER, finish_reason TEXT, gen_seconds REAL, verify_seconds REAL,
    attempts INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL,
    PRIMARY KEY (task, sample, turn));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class RunMismatch(ValueError):
    """The directory holds a run made with other settings; mixing them would corrupt its numbers."""


@dataclass
class Row:
    task: str
    level: int | None
    sample: int
    turn: int
    status: str
    messages: list
    raw: str | None
    code: str | None
    error: str | None
    verdict: dict | None
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None  # "length": the answer was cut at max_tokens
    gen_seconds: float | None
    verify_seconds: float | None
    attempts: int
    updated: float

    @property
    def verified(self) -> bool:
        return self.verdict is not None

    @property
    def passed(self) -> bool:
        return self.status == "ok"


class Store:
    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # The generation thread and the verifying thread both write; one connection behind a lock is enough.
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def close(self):
        with self._lock:
            self.db.close()

    def check_identity(self, identity: dict) -> None:
        """Record the settings that define the run's numbers, or refuse if the directory holds another run."""
        with self._lock:
            row = self.db.execute("SELECT value FROM meta WHERE key = 'identity'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES ('identity', ?)", (json.dumps(identity, sort_keys=True),))
                return
        old = json.loads(row[0])
        diff = {k: (old.get(k), v) for k, v in identity.items() if old.get(k) != v}
        if diff:
            changes = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
            raise RunMismatch(f"this directory holds a run with other settings ({changes}); use another --out")

    def identity(self) -> dict:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'identity'").fetchone()
        return json.loads(row[0]) if row else {}

    def put_generation(self, task: str, level: int | None, sample: int, turn: int, messages: list,
                       gen: Generation, code: str | None) -> None:
        status = GENERATION_ERROR if gen.error else GENERATED
        with self._lock:
            self.db.execute(
                """INSERT INTO samples (task, level, sample, turn, status, messages, raw, code, error, verdict,
                       prompt_tokens, completion_tokens, finish_reason, gen_seconds, verify_seconds, attempts, updated)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, NULL, 1, ?)
                   ON CONFLICT (task, sample, turn) DO UPDATE SET status = excluded.status,
                       messages = excluded.messages, raw = excluded.raw, code = excluded.code, error = excluded.error,
                       verdict = NULL, prompt_tokens = excluded.prompt_tokens,
                       completion_tokens = excluded.completion_tokens, finish_reason = excluded.finish_reason,
                       gen_seconds = excluded.gen_seconds,
                       verify_seconds = NULL, attempts = samples.attempts + 1, updated = excluded.updated""",
                (task, level, sample, turn, status, json.dumps(messages), None if gen.error else gen.text, code,
                 gen.error, gen.prompt_tokens, gen.completion_tokens, gen.finish_reason, gen.seconds, time.time()))

    def put_verdict(self, task: str, sample: int, turn: int, verdict: Verdict) -> None:
        with self._lock:
            self.db.execute("UPDATE samples SET status = ?, verdict = ?, verify_seconds = ?, updated = ? "
                            "WHERE task = ? AND sample = ? AND turn = ?",
                            (verdict.status.value, verdict.to_json(), verdict.stage_seconds.get("total"), time.time(),
                             task, sample, turn))

    def rows(self) -> list[Row]:
        with self._lock:
            cur = self.db.execute("SELECT * FROM samples ORDER BY task, sample, turn")
            names = [d[0] for d in cur.description]
            out = []
            for values in cur.fetchall():
                d = dict(zip(names, values))
                d["messages"] = json.loads(d["messages"])
                d["verdict"] = json.loads(d["verdict"]) if d["verdict"] else None
                out.append(Row(**d))
        return out
