#!/bin/sh
# Installs what gpumemctl needs on a Debian/Ubuntu machine, idempotently:
#   system packages (fuse3, libfuse3-dev, pkg-config, python3-venv, attr; for tests/ops: zsh,
#   fish, mandoc, systemd for systemd-analyze) with apt-get, as root;
#   a virtual environment in $VENV (default .venv) with the project and its test extra.
# Used by `make run` and `make test`; safe to run again (it skips what is done).
set -eu
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

need=""
pkg-config --exists fuse3 2>/dev/null || need="$need libfuse3-dev pkg-config"
command -v fusermount3 >/dev/null 2>&1 || need="$need fuse3"
command -v setfattr >/dev/null 2>&1 || need="$need attr"     # setfattr/getfattr: mount docs
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || need="$need python3-venv"
# tests/ops: completions sourced in real shells, man pages linted, units verified
command -v zsh >/dev/null 2>&1 || need="$need zsh"
command -v fish >/dev/null 2>&1 || need="$need fish"
command -v mandoc >/dev/null 2>&1 || need="$need mandoc"
command -v systemd-analyze >/dev/null 2>&1 || need="$need systemd"
command -v tmux >/dev/null 2>&1 || need="$need tmux"             # the `gpumemctl top` smoke test
if [ -n "$need" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "bootstrap: missing system packages:$need; run: sudo apt-get install -y$need" >&2
        exit 1
    fi
    echo "bootstrap: installing$need" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq $need >/dev/null
fi

stamp="$VENV/.bootstrap-$(cat pyproject.toml | cksum | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
    echo "bootstrap: installing gpumemctl and its dependencies into $VENV" >&2
    # compat mode: a plain .pth path entry; the default finder hook costs ~14 ms per start.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
        --config-settings editable_mode=compat -e ".[test]"
    rm -f "$VENV"/.bootstrap-*
    touch "$stamp"
fi
