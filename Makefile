# Two commands (README): `make run` starts gpumemd in the foreground, `make test` runs the
# whole test suite. Each bootstraps what it needs first (scripts/bootstrap.sh).
VENV ?= .venv
GPUMEMD_ARGS ?=
# The mount point (docs/mount.md); `make run MOUNT=` runs without a mount.
MOUNT ?= $(if $(filter 0,$(shell id -u)),/mnt/gpumem,$(or $(XDG_RUNTIME_DIR),/run/user/$(shell id -u))/gpumem)
PYTEST_ARGS ?=

.PHONY: run test bootstrap bench

bootstrap:
	@VENV=$(VENV) sh scripts/bootstrap.sh

run: bootstrap
	$(VENV)/bin/gpumemd --backend auto $(if $(MOUNT),--mount $(MOUNT)) $(GPUMEMD_ARGS)

test: bootstrap
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

bench: bootstrap
	$(VENV)/bin/python bench/core.py
