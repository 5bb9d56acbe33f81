"""SQLite caches shared by the pool: prebuild outcomes per candidate and baseline timings per task shape."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS prebuild (key TEXT PRIMARY KEY, result TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS baseline (key TEXT PRIMARY KEY, result TEXT NOT NULL);
"""


class Cache:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, timeout=60)
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def get(self, table: str, key: str) -> dict | None:
        with self._lock:
            row = self._db.execute(f"SELECT result FROM {table} WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, table: str, key: str, value: dict) -> None:
        with self._lock, self._db:
            self._db.execute(f"INSERT OR REPLACE INTO {table} VALUES (?, ?)", (key, json.dumps(value)))

    def clear(self, table: str) -> None:
        with self._lock, self._db:
            self._db.execute(f"DELETE FROM {table}")

    def close(self):
        self._db.close()
