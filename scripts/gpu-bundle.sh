#!/bin/sh
# Builds .gpu/ (git-ignored): what a GPU machine WITHOUT network access needs, beside its own
# CUDA Python stack, to run this checkout's GPU tests and benchmarks (docs/gpu.md).
# Run it here, on a machine with network access and the GPU machine's CPU architecture:
#
#   scripts/gpu-bundle.sh [PACKAGE...]          # PACKAGE: more wheels to bring, e.g. typer==0.25.1
#   GPU_PYTHON=python3.12 scripts/gpu-bundle.sh # the GPU machine's Python minor version (default:
#                                               # python3); pyfuse3 is compiled with it, so this
#                                               # machine needs its headers and libfuse3-dev
#
# .gpu/ then holds whl/ (pyfuse3 built here, trio, textual, reedsolo and their small
# dependencies, as wheels), deb/ (fuse3, libfuse3-3 and attr from this machine's apt) and
# env.sh. Copy the checkout with .gpu/ to the GPU machine; there, in its root:
#   . .gpu/env.sh
# which unpacks the debs under /tmp/gpumem-fuse, installs the wheels into /tmp/gpumem-site
# (nothing system-wide) and puts both, and the checkout itself, on the search paths.
set -eu
cd "$(dirname "$0")/.."
PYTHON=${GPU_PYTHON:-python3}

# What a CUDA image with cuda-python, nvidia-ml-py, numpy and pytest usually lacks.
# typer and click as pyproject.toml pins them: a GPU image's own newer typer builds a
# different command tree (typer 0.26+ no longer hands back click's Group).
WHEELS="pyfuse3 trio outcome sniffio sortedcontainers attrs idna
        textual markdown-it-py mdurl platformdirs linkify-it-py uc-micro-py reedsolo
        typer<0.26 click shellingham"

rm -rf .gpu
mkdir -p .gpu/whl .gpu/deb
# --no-deps: bring exactly these; the GPU machine's own packages (numpy, cuda-python, rich,
# typing_extensions, pytest...) stay the ones its image was tested with.
# shellcheck disable=SC2086 # WHEELS is a list of words
"$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps -w .gpu/whl $WHEELS "$@"
(cd .gpu/deb && apt-get download -qq fuse3 libfuse3-3 attr)

cat > .gpu/env.sh <<'EOF'
# Source this in the checkout's root on the GPU machine: . .gpu/env.sh (made by
# scripts/gpu-bundle.sh; docs/gpu.md).
gpumem_root=/tmp/gpumem-fuse
mkdir -p $gpumem_root
for deb in .gpu/deb/*.deb; do dpkg -x "$deb" $gpumem_root; done
export PATH=$gpumem_root/bin:$gpumem_root/usr/bin:$gpumem_root/sbin:$PATH
gpumem_lib=lib/$(uname -m)-linux-gnu
gpumem_libs=$gpumem_root/$gpumem_lib:$gpumem_root/usr/$gpumem_lib
export LD_LIBRARY_PATH=$gpumem_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset gpumem_root gpumem_lib gpumem_libs
python3 -m pip install -q --disable-pip-version-check --no-index --no-deps --upgrade \
    --target /tmp/gpumem-site .gpu/whl/*.whl
export PYTHONPATH=$PWD:/tmp/gpumem-site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
EOF
ls .gpu/whl .gpu/deb
du -sh .gpu
