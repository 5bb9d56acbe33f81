VENV ?= .venv

.PHONY: demo test test-all setup
setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/musacoder demo

test:
	bash scripts/setup.sh test
	$(VENV)/bin/python -m pytest -q -ra -m "not slow" --durations=20

test-all:  # adds the heavy sweeps (tests marked slow)
	bash scripts/setup.sh test
	$(VENV)/bin/python -m pytest -q -ra
