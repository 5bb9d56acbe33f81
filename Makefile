VENV ?= .venv

.PHONY: demo lint test test-all setup
setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/musacoder demo

lint:  # style and complexity (ruff), and the floors import only downward (import-linter: pyproject.toml)
	$(VENV)/bin/ruff check musacoder tests scripts
	$(VENV)/bin/lint-imports

test:
	bash scripts/setup.sh test
	$(MAKE) --no-print-directory lint
	$(VENV)/bin/python -m pytest -q -ra -m "not slow" --durations=20

test-all:  # adds the heavy sweeps (tests marked slow)
	bash scripts/setup.sh test
	$(VENV)/bin/python -m pytest -q -ra
