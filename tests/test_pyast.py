"""pyast.py: parsing in threads."""

import time

import pytest


def test_parsing_python_in_threads_does_not_raise_system_error():
    """CPython 3.11's AST constructor counts its recursion depth per interpreter: threads parsing at once raise
    SystemError (CI: a task failed to load under four reward threads). The same stress that breaks `ast.parse` on
    this interpreter must leave `musacoder.pyast.parse` alone: a garbage collection inside the constructor runs a
    Python `__del__`, and a tiny switch interval hands the GIL to another parser there."""
    import ast
    import gc
    import sys
    import threading

    from musacoder.pyast import parse

    src = "\n".join(f"def f{i}(x):\n    return [x + {i} for _ in range(3)] if x else {{'a': (1, 2)}}"
                    for i in range(300))

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            sum(range(50))

    def stress(fn, seconds=1.0) -> list[str]:
        errors: list[str] = []

        def work():
            end = time.monotonic() + seconds
            while time.monotonic() < end and not errors:
                for _ in range(20):
                    Cycle()
                try:
                    fn(src)
                except SystemError as e:
                    errors.append(str(e))

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return errors

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(50, 1, 1)
    try:
        if not stress(ast.parse):
            pytest.skip("this interpreter's ast.parse survived the stress: nothing to guard against")
        assert stress(parse, seconds=2.0) == []
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
