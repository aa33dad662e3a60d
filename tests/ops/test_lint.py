"""The import contracts of `make lint` hold the dependency rule of docs/design.md: on a copy of
the packages, each import the rule forbids (made lazily, inside a function, where the start-up
tests cannot see it) fails `lint-imports` and names the contract; the copy as it is passes."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINT_IMPORTS = shutil.which("lint-imports", path=os.path.join(ROOT, ".venv", "bin")) or \
    shutil.which("lint-imports")

pytestmark = pytest.mark.skipif(LINT_IMPORTS is None,
                                reason="lint-imports is not installed (the `lint` extra)")

# (module file to append to, the forbidden import, the contract that must catch it)
VIOLATIONS = [
    ("tui/model.py", "from daemon import nodes", "the monitor (tui) imports nothing of the daemon"),
    ("gpumemctl/formats.py", "from daemon import nodes",
     "the client side (gpumemctl) imports nothing of the daemon"),
    ("gpumemctl/output.py", "import tui", "the client side (gpumemctl) imports nothing"),
    # The library (and the monitor) never import the CLI.
    ("gpumemctl/client.py", "from .cli import context",
     "the client library never imports the CLI (gpumemctl.cli)"),
    ("gpumemctl/snapshots/engine.py", "from ..cli.snapshot import snapshot",
     "the client library never imports the CLI (gpumemctl.cli)"),
    ("tui/source.py", "from gpumemctl.cli.plain import parse",
     "the client library never imports the CLI (gpumemctl.cli)"),
    ("daemon/core/quotas.py", "from gpumemctl.client import Client",
     "the daemon imports from gpumemctl only gpumemctl.protocol and gpumemctl.cudadrv"),
    ("daemon/core/quotas.py", "from gpumemctl import attach",
     "the daemon imports from gpumemctl only gpumemctl.protocol and gpumemctl.cudadrv"),
    ("daemon/core/quotas.py", "from gpumemctl import Client",      # the package's lazy names
     "the daemon imports from gpumemctl only gpumemctl.protocol and gpumemctl.cudadrv"),
    ("gpumemctl/protocol/names.py", "from ..formats import duration",
     "gpumemctl.protocol and gpumemctl.cudadrv import nothing else of gpumemctl"),
    ("gpumemctl/cudadrv/staging.py", "from ..memory import HostMapping",
     "gpumemctl.protocol and gpumemctl.cudadrv import nothing else of gpumemctl"),
    # The daemon's layers (docs/architecture.md): none reaches up, nor sideways.
    ("daemon/core/namespace/tree.py", "from .. import custody",
     "the daemon's core: each layer imports only those below it"),
    ("daemon/core/journal.py", "from .namespace import Namespace",
     "the daemon's core: each layer imports only those below it"),
    ("daemon/core/holders.py", "from .custody import Custody",
     "the daemon's core: each layer imports only those below it"),
    # The namespace's parts (daemon/core/namespace/) reach each other through the namespace.
    ("daemon/core/namespace/hardlinks.py", "from .renames import Renames",
     "the namespace's parts: the tree composes them, and none imports another"),
    ("daemon/core/namespace/rules.py", "from .tree import Namespace",
     "the namespace's parts: the tree composes them, and none imports another"),
    ("daemon/core/integrity.py", "from .lifecycle import Lifecycle",
     "the daemon's core: each layer imports only those below it"),
    ("daemon/core/custody.py", "from ..verbs.names import NameVerbs",
     "the daemon's core: each layer imports only those below it"),
    ("daemon/registry/nodes.py", "from ..core import journal",
     "the daemon's core: each layer imports only those below it"),
    # The adapters call verbs; they never reach past them into the core's units.
    ("daemon/server/ops.py", "from ..core.custody import Custody",
     "the adapters (server, mount) reach the core only through verbs"),
    ("daemon/fs/operations.py", "from ..core import integrity",
     "the adapters (server, mount) reach the core only through verbs"),
    ("daemon/fs/mount.py", "from ..registry import Registry",
     "the adapters (server, mount) reach the core only through verbs"),
    ("daemon/server/status.py", "from ..keeper.link import KeeperGone",
     "the adapters (server, mount) reach the core only through verbs"),
    # The core is synchronous and knows nothing above it.
    ("daemon/core/quotas.py", "import trio",
     "the core and the registry import no adapter, no service, no verb and not trio"),
    ("daemon/core/nodes.py", "from ..server import call",
     "the core and the registry import no adapter, no service, no verb and not trio"),
    ("daemon/registry/store.py", "from ..services import scrub",
     "the core and the registry import no adapter, no service, no verb and not trio"),
    # The keeper starts fast and outlives the daemon: it imports almost nothing.
    ("daemon/keeper/process.py", "from ..registry import Registry",
     "the keeper process imports nothing of the daemon but paths and the fd limit"),
    ("daemon/keeper/process.py", "import trio",
     "the keeper process imports nothing of the daemon but paths and the fd limit"),
    # The verb groups (daemon/verbs/): none imports another.
    ("daemon/verbs/handles.py", "from .data import DataVerbs",
     "verb modules are independent of each other"),
]


def copy_of_the_packages(dest) -> str:
    for name in ("gpumemctl", "daemon", "tui"):
        shutil.copytree(os.path.join(ROOT, name), dest / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), dest / "pyproject.toml")
    return str(dest)


def lint_imports(tree: str) -> subprocess.CompletedProcess:
    # The copy comes first on the path, before the editable install of the real tree.
    env = dict(os.environ, PYTHONPATH=tree)
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_tree_as_it_is_keeps_every_contract(tmp_path):
    proc = lint_imports(copy_of_the_packages(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize("path,statement,contract", VIOLATIONS,
                         ids=[f"{p}: {s}" for p, s, _ in VIOLATIONS])
def test_a_forbidden_import_breaks_its_contract(tmp_path, path, statement, contract):
    tree = copy_of_the_packages(tmp_path)
    with open(os.path.join(tree, path), "a") as f:
        f.write(f"\n\ndef _forbidden():\n    {statement}\n")
    proc = lint_imports(tree)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    broken = proc.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, proc.stdout[-3000:]
