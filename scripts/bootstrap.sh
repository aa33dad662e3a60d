#!/bin/sh
# Installs what gpumemctl needs on a Debian/Ubuntu machine, idempotently, for one purpose:
#
#   scripts/bootstrap.sh run     what `make run` needs: fuse3 (fusermount3, the mount), and to
#                                build pyfuse3 libfuse3-dev, pkg-config, gcc and the Python
#                                headers; python3-venv; a virtual environment in $VENV
#                                (default .venv) with the project and its extras daemon, tui
#                                and cuda (pyproject.toml's `all`)
#   scripts/bootstrap.sh test    what `make test` needs: all of the above, the project's test
#                                and lint extras in $VENV, and the programs the tests drive: attr
#                                (setfattr/getfattr), jq (the README's examples), zsh and fish
#                                (completions), mandoc (man page lint), systemd
#                                (systemd-analyze verifies the units), tmux (the monitor),
#                                rsync (the mount keeps what `rsync -a` sets)
#
# System packages come from apt-get as root; as another user it prints the one
# `sudo apt-get install` line to run and exits 1. A stamp file in $VENV,
# .bootstrap-<checksum of pyproject.toml>-<run|test>, records what the environment holds: a
# `test` environment serves `run` as well, and a changed pyproject.toml installs again.
set -eu
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
purpose=${1:-test}
case "$purpose" in
    run|test) ;;
    *) echo "bootstrap: unknown purpose '$purpose': expected run or test" >&2; exit 2 ;;
esac

have() { command -v "$1" >/dev/null 2>&1; }

# Packages `run` needs, as "apt-package" words for whatever is missing.
missing_for_run() {
    pkg-config --exists fuse3 2>/dev/null || echo libfuse3-dev pkg-config
    have fusermount3 || echo fuse3
    have cc || echo gcc
    "$PYTHON" -c 'import sysconfig, os, sys
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        2>/dev/null || echo python3-dev
    "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || echo python3-venv
}

# Programs the tests drive (each test that needs one skips without it, naming it).
missing_for_test() {
    have setfattr || echo attr
    have jq || echo jq
    have zsh || echo zsh
    have fish || echo fish
    have mandoc || echo mandoc
    have systemd-analyze || echo systemd
    have tmux || echo tmux
    have rsync || echo rsync
    have g++ || echo g++           # the snapshot block-hash kernel, emulated on the CPU
}

need=$(missing_for_run)
[ "$purpose" = run ] || need="$need $(missing_for_test)"
need=$(echo $need)           # one line, single spaces
if [ -n "$need" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "bootstrap: missing system packages: $need; run: sudo apt-get install -y $need" >&2
        exit 1
    fi
    echo "bootstrap: installing $need" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq $need >/dev/null
fi

sum=$(cksum < pyproject.toml | cut -d' ' -f1)
[ -f "$VENV/.bootstrap-$sum-test" ] && exit 0          # a test environment serves both
[ "$purpose" = run ] && [ -f "$VENV/.bootstrap-$sum-run" ] && exit 0

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
# The base install is the client alone (docs/operations.md); a machine that runs gpumemd takes
# every extra (cuda-python's wheels install without a GPU too), the tests add theirs and lint's.
target=".[all]"
[ "$purpose" = test ] && target=".[all,test,lint]"
echo "bootstrap: installing gpumemctl ($target) and its dependencies into $VENV" >&2
# compat mode: a plain .pth path entry; the default finder hook costs ~14 ms per start.
# pip's and setuptools' own output (its banner about that mode) goes to a log, shown only
# when the install fails: one line per step on the terminal.
log="$VENV/.bootstrap.log"
if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
        --config-settings editable_mode=compat -e "$target" >"$log" 2>&1; then
    cat "$log" >&2
    echo "bootstrap: installing gpumemctl failed (the output above is in $log)" >&2
    exit 1
fi
rm -f "$VENV"/.bootstrap-*
touch "$VENV/.bootstrap-$sum-$purpose"
