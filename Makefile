VENV ?= .venv

.PHONY: demo test setup
setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/musacoder demo

test:
	bash scripts/setup.sh test
	$(VENV)/bin/python -m pytest -q -ra
