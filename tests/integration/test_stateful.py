"""A stateful (model-based) test of the allocation lifecycle against a real gpumemd.

Hypothesis drives create / write / read / durable / transient / rm / restart (kill -9 and
SIGTERM) through `gpumemctl.Client`, and an in-memory model predicts every answer. The model
follows daemon/verbs/ exactly:

- `create NAME` makes missing parent directories (mode 0755, like `mkdir -p`). Those
  directories are namespace entries in their own right: they stay when their allocations go
  (rm, or a transient dropped at restart), and a later `create` of the directory's own name is
  `Exists` (exit 5).
- `create a/b` where `a` is an allocation is `NotFound` (exit 4: "'a' is an allocation, not a
  directory"); `create` of an existing allocation or directory name is `Exists`.
- `rm` of a missing name (or of a name under an allocation) is `NotFound`; `rm` of a directory
  without `recursive` is a `UsageError` (exit 2); `rm -r` removes the subtree.
- `open` of a directory is a `UsageError`; `durable` / `transient` of a directory set its
  durable default (issue 27), which allocations and directories created in it from then on
  take; of a missing name `NotFound`. Marking with the flag it already has is a no-op.
- After ANY restart of the daemon (kill -9 or SIGTERM) transient allocations are gone and
  durable ones keep their exact bytes; bytes never written read as zero. Directories persist.

Invariants after every step: `ls("", recursive=True)` equals the model (directories, and the
allocations' paths, sizes, durable flags, state `ready`), and `check()` is clean.

One daemon (and its keeper) per Hypothesis example, built from tests/harness.py's `Daemon` class
directly (fixtures do not mix with Hypothesis' per-example lifecycle) and torn down in
`teardown()`.
"""
from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpumemctl.protocol import Exists, GpumemError, NotFound, UsageError
from tests.harness import Daemon, make_base_dir

pytestmark = pytest.mark.slow

MiB = 1 << 20
# Nested names exercise the implicit directories and the "parent is an allocation" errors.
NAMES = ["x", "a", "a/b", "a/c", "a/b/c"]
# 1 byte .. 3 MiB; capacity is rounded up to 2 MiB, so these cover 1 and 2 granules.
SIZES = [1, 4096, 1 * MiB, 2 * MiB + 1, 3 * MiB]
MAX_RESTARTS = 4        # per example, hard and clean together


def _prefixes(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class AllocationLifecycle(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        # model
        self.allocs: dict[str, dict] = {}   # path -> {"size", "durable", "data": bytearray}
        self.dirs: set[str] = set()
        self.dir_durable: dict[str, bool] = {}     # a directory's durable default
        # Restarts cost a daemon start (~0.25 s) each; a budget per example keeps the run
        # short without starving the other rules (Hypothesis' mutator likes to repeat them).
        self.restarts_left = MAX_RESTARTS
        # the real thing
        # --slabs off: the model asserts capacities of whole granules (memory of its own).
        self.daemon = Daemon(make_base_dir(), extra_args=["--slabs", "off",
                                                            "--parity-arenas", "off"])
        self.client = None
        try:
            self.daemon.start()
            self.client = self.daemon.client()
        except BaseException:
            self._cleanup()
            raise

    # ---- helpers ------------------------------------------------------------------------
    def _expect(self, error: type[GpumemError] | None, call, *args, **kw):
        """Run a client call; it must succeed (error None) or fail with exactly `error`."""
        try:
            result = call(*args, **kw)
        except GpumemError as exc:
            if error is None:
                raise AssertionError(f"{call.__name__}{args} {kw} failed unexpectedly: "
                                     f"{type(exc).__name__} (code {exc.code}): {exc}") from exc
            assert exc.code == error.code, (
                f"{call.__name__}{args} {kw}: wanted {error.__name__} (code {error.code}), "
                f"got {type(exc).__name__} (code {exc.code}): {exc}")
            return None
        assert error is None, (f"{call.__name__}{args} {kw} succeeded, wanted "
                               f"{error.__name__} (code {error.code})")
        return result

    def _lookup_error(self, path: str) -> type[GpumemError] | None:
        """What Queries.lookup() raises for `path` (None when it resolves)."""
        for prefix in _prefixes(path):
            if prefix not in self.dirs:      # missing, or an allocation: both NotFound
                return NotFound
        if path not in self.dirs and path not in self.allocs:
            return NotFound
        return None

    def _alloc_error(self, path: str) -> type[GpumemError] | None:
        """What lookup_allocation() raises (directories are a usage error)."""
        error = self._lookup_error(path)
        if error is None and path in self.dirs:
            return UsageError
        return error

    def _verify_contents(self, path: str) -> None:
        model = self.allocs[path]
        got = self.client.read(path)
        assert len(got) == model["size"], f"{path}: read {len(got)} bytes, size {model['size']}"
        if got != model["data"]:
            first = next(i for i, (x, y) in enumerate(zip(got, model["data"], strict=True))
                         if x != y)
            raise AssertionError(f"{path}: contents differ from byte {first} "
                                 f"(got {got[first:first + 16].hex()}, "
                                 f"want {bytes(model['data'][first:first + 16]).hex()})")

    def _after_restart(self) -> None:
        self.restarts_left -= 1
        self.client = self.daemon.client()
        self.allocs = {p: a for p, a in self.allocs.items() if a["durable"]}
        for path in sorted(self.allocs):
            self._verify_contents(path)

    # ---- rules --------------------------------------------------------------------------
    @rule(path=st.sampled_from(NAMES), size=st.sampled_from(SIZES), durable=st.booleans())
    def create(self, path, size, durable):
        error = None
        for prefix in _prefixes(path):
            if prefix in self.allocs:
                error = NotFound             # "'a' is an allocation, not a directory"
                break
            if prefix not in self.dirs:      # the rest of the chain is created
                break
        if error is None and (path in self.allocs or path in self.dirs):
            error = Exists
        info = self._expect(error, self.client.create, path, size, durable=durable)
        if error is None:
            for prefix in _prefixes(path):       # a directory made takes its parent's default
                if prefix not in self.dirs:
                    self.dirs.add(prefix)
                    self.dir_durable[prefix] = self._default_of(prefix)
            durable = durable or self._default_of(path)
            assert info["path"] == path and info["size"] == size
            assert info["durable"] is durable and info["state"] == "ready"
            assert info["capacity"] >= size and info["capacity"] % (2 * MiB) == 0
            self.allocs[path] = {"size": size, "durable": durable, "data": bytearray(size)}

    def _default_of(self, path: str) -> bool:
        """The durable default of the directory `path` is made in (the top's: none)."""
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        return self.dir_durable.get(parent, False)

    @precondition(lambda self: self.allocs)
    @rule(data=st.data(), chunk=st.binary(min_size=1, max_size=64),
          repeat=st.sampled_from([1, 7, 4096]))
    def write(self, data, chunk, repeat):
        path = data.draw(st.sampled_from(sorted(self.allocs)), label="path")
        model = self.allocs[path]
        payload = (chunk * repeat)[:model["size"]]
        room = model["size"] - len(payload)
        offset = data.draw(st.one_of(st.just(0), st.just(room), st.integers(0, room),
                                     st.sampled_from([o for o in (4095, 4096, MiB - 1, 2 * MiB)
                                                      if o <= room] or [0])),
                           label="offset")
        self.client.write(path, payload, offset)
        model["data"][offset:offset + len(payload)] = payload

    @rule(path=st.sampled_from(NAMES))
    def read_back(self, path):
        error = self._alloc_error(path)
        if error is None:
            self._verify_contents(path)
        else:
            self._expect(error, self.client.read, path)

    @rule(path=st.sampled_from(NAMES), durable=st.booleans())
    def set_durable(self, path, durable):
        error = self._lookup_error(path)
        info = self._expect(error, self.client.set_durable, path, durable)
        if error is None:
            assert info["durable"] is durable
            if path in self.dirs:
                self.dir_durable[path] = durable
            else:
                self.allocs[path]["durable"] = durable

    @rule(path=st.sampled_from(NAMES), recursive=st.booleans())
    def rm(self, path, recursive):
        error = self._lookup_error(path)
        if error is None and path in self.dirs and not recursive:
            error = UsageError
        removed = self._expect(error, self.client.remove, path, recursive=recursive)
        if error is None:
            gone = {p for p in (*self.allocs, *self.dirs)
                    if p == path or p.startswith(path + "/")}
            assert set(removed) == gone
            for p in gone:
                self.allocs.pop(p, None)
                self.dirs.discard(p)
                self.dir_durable.pop(p, None)

    @precondition(lambda self: self.restarts_left > 0)
    @rule()
    def restart_hard(self):
        self.client.close()
        self.daemon.kill9()
        self.daemon.start()
        self._after_restart()

    @precondition(lambda self: self.restarts_left > 0)
    @rule()
    def restart_clean(self):
        self.client.close()
        assert self.daemon.stop() == 0, self.daemon.log()[-3000:]
        self.daemon.start()
        self._after_restart()

    # ---- invariants ---------------------------------------------------------------------
    @invariant()
    def listing_matches_model(self):
        entries = self.client.ls("", recursive=True)
        dirs = {e["path"] for e in entries if e["type"] == "directory"}
        allocs = {e["path"]: (e["size"], e["durable"], e["state"])
                  for e in entries if e["type"] == "allocation"}
        assert dirs == self.dirs
        assert allocs == {p: (a["size"], a["durable"], "ready") for p, a in self.allocs.items()}

    @invariant()
    def check_is_clean(self):
        report = self.client.check()
        assert report["clean"] is True, report["problems"]

    # ---- teardown -----------------------------------------------------------------------
    def _cleanup(self) -> None:
        if self.client is not None:
            self.client.close()
        self.daemon.cleanup()            # kills the daemon and its keeper
        shutil.rmtree(self.daemon.base, ignore_errors=True)

    def teardown(self):
        log = self.daemon.log()
        self._cleanup()
        assert "Traceback" not in log and " ERROR: " not in log, log[-4000:]


# Shrinking replays the machine hundreds of times, each with daemon starts and restarts: it
# would take minutes (past pytest's 300 s timeout). A failure is reported unshrunk, as the
# full step sequence; set GPUMEMCTL_TEST_SHRINK=1 to shrink it while debugging (and run with
# `-p no:timeout` or `--timeout 0`). A failing example is stored in .hypothesis/ and replayed
# first on the next run.
PHASES = tuple(Phase) if os.environ.get("GPUMEMCTL_TEST_SHRINK") else \
    tuple(p for p in Phase if p is not Phase.shrink)

TestAllocationLifecycle = AllocationLifecycle.TestCase
TestAllocationLifecycle.settings = settings(
    max_examples=15, stateful_step_count=25, deadline=None, phases=PHASES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
