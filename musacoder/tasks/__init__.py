"""KernelBench-style tasks: the task model and its loaders."""

from musacoder.tasks.model import Task, TaskLoadError
from musacoder.tasks.loaders import builtin_tasks, builtin_task, load_tasks

__all__ = ["Task", "TaskLoadError", "load_tasks", "builtin_tasks", "builtin_task"]
