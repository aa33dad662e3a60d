# Two commands (README): `make run` starts gpumemd in the foreground, `make test` runs the
# whole test suite. Each bootstraps what it needs first (scripts/bootstrap.sh).
VENV ?= .venv
GPUMEMD_ARGS ?=
PYTEST_ARGS ?=

.PHONY: run test bootstrap bench

bootstrap:
	@VENV=$(VENV) sh scripts/bootstrap.sh

run: bootstrap
	$(VENV)/bin/gpumemd --backend auto $(GPUMEMD_ARGS)

test: bootstrap
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

bench: bootstrap
	$(VENV)/bin/python bench/core.py
