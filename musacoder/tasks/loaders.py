"""Load tasks from a .py file, a KernelBench-layout directory, a JSONL/Parquet file, or a Hugging Face dataset."""

from __future__ import annotations

import json
import re
from pathlib import Path

from musacoder.tasks.model import Task, TaskLoadError

BUILTIN_DIR = Path(__file__).parent / "builtin"
_NAME_RE = re.compile(r"^(\d+)_")
_LEVEL_RE = re.compile(r"level[_-]?(\d+)$", re.IGNORECASE)


def _from_file(path: Path, level: int | None = None) -> Task:
    m = _NAME_RE.match(path.stem)
    if level is None:
        lm = _LEVEL_RE.match(path.parent.name)
        level = int(lm.group(1)) if lm else None
    try:
        code = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TaskLoadError(f"task {path.stem} ({path}): cannot read: {e}") from e
    return Task(name=path.stem, code=code, level=level, problem_id=int(m.group(1)) if m else None,
                source=str(path)).validate()


def _from_records(records: list[dict], source: str) -> list[Task]:
    tasks = []
    for i, r in enumerate(records):
        name = r.get("name") or f"record{i}"
        if not isinstance(r.get("code"), str):
            raise TaskLoadError(f"task {name} ({source} record {i}): no 'code' string")
        level = r.get("level")
        pid = r.get("problem_id")
        meta = r.get("metadata")
        # the operator families of `synth tasks` records (for mixing by family), and nothing else of a file's
        # metadata: Task.metadata has keys with a meaning to the verifier (verifier.admission.TASK_CONFIG)
        fams = meta.get("families") if isinstance(meta, dict) else None
        tasks.append(Task(name=str(name), code=r["code"], level=int(level) if level is not None else None,
                          problem_id=int(pid) if pid is not None else None, source=f"{source}#{i}",
                          metadata={"families": [str(f) for f in fams]} if isinstance(fams, list) else {}
                          ).validate())
    return tasks


def _read_jsonl(path: Path) -> list[dict]:
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise TaskLoadError(f"task file {path} line {n}: invalid JSON: {e}") from e
    return records


def _read_parquet(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # optional dependency
        raise TaskLoadError(f"task file {path}: reading Parquet needs pyarrow (pip install pyarrow)") from e
    return pq.read_table(path).to_pylist()


def _from_rows(rows) -> list[Task]:
    """A `datasets.Dataset` (e.g. the KernelBench dataset's split: columns code, level, name, problem_id) or a list
    of such rows. The dataset's names may carry the file's `.py`."""
    source = getattr(getattr(rows, "info", None), "dataset_name", None) or type(rows).__name__
    records = [{**r, "name": str(r["name"]).removesuffix(".py")} if r.get("name") else r for r in map(dict, rows)]
    return _from_records(records, str(source))


def load_tasks(path, levels: list[int] | None = None, names: list[str] | None = None) -> list[Task]:
    """Load every task under `path` (a path, a `datasets.Dataset` or a list of row dicts), optionally keeping some
    levels or names (substring or 'level1/19_ReLU')."""
    if not isinstance(path, (str, Path)):
        if not (hasattr(path, "column_names") or isinstance(path, (list, tuple))):
            raise TaskLoadError(f"load_tasks takes a path, a datasets.Dataset or a list of rows, not "
                                f"{type(path).__name__}")
        return _select(_from_rows(path), levels, names)
    path = Path(path)
    if not path.exists():
        raise TaskLoadError(f"task path {path} does not exist")
    if path.is_dir():
        tasks = [_from_file(p) for p in sorted(path.rglob("*.py")) if not p.name.startswith("_")]
    elif path.suffix == ".py":
        tasks = [_from_file(path)]
    elif path.suffix in (".jsonl", ".json"):
        tasks = _from_records(_read_jsonl(path), str(path))
    elif path.suffix == ".parquet":
        tasks = _from_records(_read_parquet(path), str(path))
    else:
        raise TaskLoadError(f"task path {path}: expected a .py file, a directory, .jsonl or .parquet")
    return _select(tasks, levels, names)


def _select(tasks: list[Task], levels: list[int] | None, names: list[str] | None) -> list[Task]:
    if levels:
        tasks = [t for t in tasks if t.level in levels]
    if names:
        tasks = [t for t in tasks if any(n == t.key or n in t.name for n in names)]
    tasks.sort(key=lambda t: (t.level or 0, t.problem_id or 0, t.name))
    return tasks


def builtin_tasks() -> list[Task]:
    """The small tasks the project ships for tests and the demo."""
    return load_tasks(BUILTIN_DIR)


def builtin_task(key: str) -> Task:
    for t in builtin_tasks():
        if t.key == key or t.name == key:
            return t
    raise TaskLoadError(f"no built-in task {key!r}")
