# Two commands (README): `make run` starts gpumemd in the foreground, `make test` runs the
# whole test suite. Each bootstraps what it needs first, and only that (scripts/bootstrap.sh
# run: the daemon's system packages and the project; test: also the test extra and the
# programs the tests drive).
VENV ?= .venv
GPUMEMD_ARGS ?=
# The mount point (docs/mount.md); `make run MOUNT=` runs without a mount.
MOUNT ?= $(if $(filter 0,$(shell id -u)),/mnt/gpumem,$(or $(XDG_RUNTIME_DIR),/run/user/$(shell id -u))/gpumem)
PYTEST_ARGS ?=

# `make install`: the files pip/pipx cannot put in standard places (docs/operations.md):
# shell completions, man pages and systemd units. The programs themselves come from
# `pipx install '.[all]'` (or pip); BINDIR is where they are, written into the units' ExecStart.
PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
MANDIR ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/site-functions
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
UNITS = gpumemd.service gpumemd-scrub.service gpumemd-scrub.timer

.PHONY: run test lint bootstrap bootstrap-test bench generated install uninstall

bootstrap:
	@VENV=$(VENV) sh scripts/bootstrap.sh run

bootstrap-test:
	@VENV=$(VENV) sh scripts/bootstrap.sh test

run: bootstrap
	$(VENV)/bin/gpumemd --backend auto $(if $(MOUNT),--mount $(MOUNT)) $(GPUMEMD_ARGS)

test: bootstrap-test
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# The gates CI runs before the tests (.ci/run), configured in pyproject.toml: ruff's rule set,
# mypy with no error on daemon/, gpumemctl/ and tui/, and the import contracts that hold the
# dependency direction of docs/design.md, then the size limits of docs/architecture.md ("Limits
# that keep it so": no module over 500 lines, no daemon class over 25 public methods). The tools
# come with the test bootstrap (extra `lint`).
lint: bootstrap-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/python scripts/check_limits.py

bench: bootstrap
	$(VENV)/bin/python bench/core.py

# Completions and man pages are generated from the live command definitions (never edit
# them); tests/ops/test_generated.py fails when the committed ones are stale.
generated: bootstrap
	$(VENV)/bin/python scripts/gen-completions.py completions
	$(VENV)/bin/python scripts/gen-man.py man

install:
	install -D -m 644 completions/bash/gpumemctl $(DESTDIR)$(BASHCOMPDIR)/gpumemctl
	install -D -m 644 completions/zsh/_gpumemctl $(DESTDIR)$(ZSHCOMPDIR)/_gpumemctl
	install -D -m 644 completions/fish/gpumemctl.fish $(DESTDIR)$(FISHCOMPDIR)/gpumemctl.fish
	install -D -m 644 man/gpumemctl.1 $(DESTDIR)$(MANDIR)/man1/gpumemctl.1
	install -D -m 644 man/gpumemd.8 $(DESTDIR)$(MANDIR)/man8/gpumemd.8
	install -D -m 644 man/gpumemd.conf.5 $(DESTDIR)$(MANDIR)/man5/gpumemd.conf.5
	install -d $(DESTDIR)$(SYSTEMDUNITDIR)
	for unit in $(UNITS); do \
	    sed 's#/usr/bin/gpumem#$(BINDIR)/gpumem#g' systemd/$$unit \
	        > $(DESTDIR)$(SYSTEMDUNITDIR)/$$unit && \
	    chmod 644 $(DESTDIR)$(SYSTEMDUNITDIR)/$$unit || exit 1; \
	done

uninstall:
	rm -f $(DESTDIR)$(BASHCOMPDIR)/gpumemctl $(DESTDIR)$(ZSHCOMPDIR)/_gpumemctl \
	    $(DESTDIR)$(FISHCOMPDIR)/gpumemctl.fish $(DESTDIR)$(MANDIR)/man1/gpumemctl.1 \
	    $(DESTDIR)$(MANDIR)/man8/gpumemd.8 $(DESTDIR)$(MANDIR)/man5/gpumemd.conf.5 \
	    $(addprefix $(DESTDIR)$(SYSTEMDUNITDIR)/,$(UNITS))
