"""Progress bars that also work in a log file.

rich draws bars only on a terminal; on a pipe (`nohup`, a batch job, `| tee`) it prints nothing until the run ends,
and a run killed before then leaves no trace of how far it got. On such a console this prints one plain line per
task every `every` seconds and when the task completes; on a terminal it is rich's `Progress` unchanged."""

from __future__ import annotations

import time

from rich.progress import Progress, TaskID


class LoggedProgress(Progress):
    def __init__(self, *columns, every: float = 30.0, **kwargs):
        super().__init__(*columns, **kwargs)
        self._every = every
        self._last: dict[TaskID, tuple[float, float, float | None]] = {}  # (time, completed, total) of the last line

    def update(self, task_id: TaskID, **kwargs) -> None:
        super().update(task_id, **kwargs)
        self._log(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log(task_id)

    def _log(self, task_id: TaskID) -> None:
        if self.console.is_terminal:
            return
        with self._lock:
            task = self._tasks[task_id]
            completed, total, description, elapsed = task.completed, task.total, task.description, task.elapsed
        then, *shown = self._last.get(task_id, (float("-inf"), None, None))
        now = time.monotonic()
        done = total is not None and completed >= total
        if [completed, total] == shown or not (done or now - then >= self._every):
            return  # a bar whose total grows (bench's verify bar) gets a new line when it completes again
        self._last[task_id] = (now, completed, total)
        of = f"/{total:g}" if total is not None else ""
        self.console.print(f"{description}: {completed:g}{of}" + (f" ({elapsed:.0f} s)" if elapsed else ""),
                           highlight=False)
