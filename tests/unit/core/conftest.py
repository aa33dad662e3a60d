"""Fixtures of the core's own tests: each layer of daemon/core/ built directly, on a registry
in a temp file, the host backend and the in-process keeper double (no compose.build, no
verbs). Helpers are in tests/unit/core/parts.py."""
from __future__ import annotations

import pytest

from daemon.backends.packed import PackedBackend
from daemon.core.arenas import Arenas
from daemon.core.custody import Custody
from daemon.core.holders import Holders
from daemon.core.integrity import Integrity
from daemon.core.journal import Journal
from daemon.core.namespace import Namespace
from daemon.core.slabs import Slabs
from daemon.registry import Registry
from tests.sizes import MiB
from tests.unit.keeper_double import InProcessKeeper, KeptFds

from .parts import TrackedHostBackend


@pytest.fixture
def registry(tmp_path):
    """A new registry file, at the current schema, with its root row."""
    reg = Registry(str(tmp_path / "r.sqlite"))
    reg.migrate()
    yield reg
    reg.close()


@pytest.fixture
def journal(registry):
    return Journal(registry)


@pytest.fixture
def backend():
    """The host backend with 64 MiB to hand out, under the packing layer with packing off
    (every allocation memory of its own, as these tests were written for; slabs have
    tests of their own, tests/unit/core/test_slabs.py); what a test leaves is freed after
    it."""
    b = TrackedHostBackend(limit=64 * MiB)
    yield PackedBackend(b, slabs=False)
    b.free_all()


@pytest.fixture
def kept():
    """What the keeper process holds: it outlives every link to it."""
    holdings = KeptFds()
    yield holdings
    holdings.stop()


@pytest.fixture
def keeper(kept):
    """A link to a running in-process keeper."""
    link = InProcessKeeper(kept)
    link.ensure_running()
    return link


@pytest.fixture
def ns(registry, journal):
    """The namespace, loaded from the registry (the root only, at first)."""
    namespace = Namespace(registry, journal)
    namespace.load()
    return namespace


@pytest.fixture
def integrity(registry, journal, backend):
    return Integrity(registry, journal, backend)


@pytest.fixture
def holders(registry, journal):
    return Holders(registry, journal)


@pytest.fixture
def custody(registry, journal, backend, keeper, ns, integrity):
    return Custody(registry, journal, backend, keeper, ns, integrity.parity,
                   Slabs(registry, journal, backend, keeper),
                   Arenas(registry, journal, backend, keeper, enabled=False))
