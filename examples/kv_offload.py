#!/usr/bin/env python3
"""A KV-cache offload loop through gpumemd's batch API: thousands of small chunks created,
written, read back and evicted a batch at a time (docs/engines.md, docs/protocol.md "Many
objects at once").

    gpumemd --backend auto &                                     # or a running gpumemd
    python3 examples/kv_offload.py                               # 2,000 chunks of 64 KiB
    python3 examples/kv_offload.py --chunks 500 --chunk-size 16K --durable --socket /tmp/g.sock

An inference engine that runs out of KV-cache memory offloads the blocks of sequences it
will come back to, and takes them again when a sequence resumes; a block is tens of KiB.
One request per block would be thousands of round trips a second; the batch calls of
`gpumemctl.Client` carry many in one request and one answer. Each round:

  1. offload: `create_many` of a batch of chunks under --prefix (transient by default: a
     cache need not outlive gpumemd; --durable keeps them across its restarts), then
     `write_many` of their bytes (made from --seed and the chunk's number: every run writes
     the same bytes);
  2. fetch: `read_many` of the same chunks, every byte compared with what was written;
  3. evict: `remove_many` of the batch.

--rounds rounds of --chunks chunks, --batch chunks per call. Prints, per phase, chunks/s and
MB/s over all rounds, and checks that every chunk read back equal and that nothing is left
under --prefix. Exit status 0 when all checks pass, 1 when one fails (or a call fails: its
error is printed), 2 for bad arguments. Needs only gpumemctl (the client library). The
socket: --socket, else $GPUMEMD_SOCKET, else gpumemd's default.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time


def chunk_bytes(seed: int, n: int, size: int) -> bytes:
    """Chunk n's bytes: a SHAKE-128 stream of (seed, n), the same in every run."""
    return hashlib.shake_128(f"kv-offload {seed} {n}".encode()).digest(size)


def first_error(results: list, what: str) -> None:
    from gpumemctl.protocol import GpumemError
    errors = [r for r in results if isinstance(r, GpumemError)]
    if errors:
        raise Failed(f"{what}: {len(errors)} of {len(results)} item(s) failed, the first: "
                     f"{errors[0]}")


class Failed(RuntimeError):
    """A call failed: its message is printed, exit 1."""


def offload_round(c, a: argparse.Namespace, rnd: int, times: dict) -> list[str]:
    """One round: offload, fetch and compare, evict, a batch at a time; the problems."""
    problems = []
    for start in range(0, a.chunks, a.batch):
        numbers = range(start, min(start + a.batch, a.chunks))
        paths = [f"{a.prefix}/r{rnd}-{n:06d}" for n in numbers]
        data = [chunk_bytes(a.seed + rnd, n, a.chunk_size) for n in numbers]

        t0 = time.perf_counter()
        first_error(c.create_many([(p, a.chunk_size) for p in paths], durable=a.durable),
                    "create_many")
        t1 = time.perf_counter()
        written = c.write_many(list(zip(paths, data, strict=True)))
        first_error(written, "write_many")
        t2 = time.perf_counter()
        back = c.read_many(paths)
        first_error(back, "read_many")
        t3 = time.perf_counter()
        removed = c.remove_many(paths)
        first_error(removed, "remove_many")
        t4 = time.perf_counter()
        for name, seconds in (("create_many", t1 - t0), ("write_many", t2 - t1),
                              ("read_many", t3 - t2), ("remove_many", t4 - t3)):
            times[name] += seconds
        if written != [a.chunk_size] * len(paths):
            problems.append(f"round {rnd}: write_many wrote {sorted(set(written))} bytes "
                            f"per chunk, not {a.chunk_size}")
        bad = [p for p, want, got in zip(paths, data, back, strict=True) if got != want]
        if bad:
            problems.append(f"round {rnd}: {len(bad)} chunk(s) read back different, the "
                            f"first {bad[0]}")
    return problems


def run(a: argparse.Namespace) -> int:
    from gpumemctl import Client
    from gpumemctl.protocol import GpumemError
    from gpumemctl.protocol.sizes import format_size
    times = {"create_many": 0.0, "write_many": 0.0, "read_many": 0.0, "remove_many": 0.0}
    problems: list[str] = []
    with Client(a.socket, client_name="kv_offload") as c:
        backend = c.hello.get("backend", "?")
        parent = a.prefix.rpartition("/")[0]
        try:
            if parent:
                c.mkdir(parent, parents=True)
            c.mkdir(a.prefix)           # a new directory: the one removed at the end
        except GpumemError as exc:
            raise Failed(f"cannot make {a.prefix} (it must not exist): {exc}") from None
        try:
            for rnd in range(a.rounds):
                problems += offload_round(c, a, rnd, times)
            left = [e["path"] for e in c.ls(a.prefix, recursive=True)]
        finally:
            c.remove(a.prefix, recursive=True, force=True)
    if left:
        problems.append(f"{len(left)} chunk(s) left under {a.prefix} after eviction")
    total = a.chunks * a.rounds
    print(f"kv_offload: {a.rounds} round(s) of {a.chunks} chunks of "
          f"{format_size(a.chunk_size)} ({'durable' if a.durable else 'transient'}), "
          f"{a.batch} a call, gpumemd backend {backend}")
    for name, seconds in times.items():
        rate = total / seconds if seconds else float("inf")
        mbs = "" if name in ("create_many", "remove_many") else \
            f", {total * a.chunk_size / seconds / 1e6:8.1f} MB/s"
        print(f"  {name:<12} {seconds:8.3f} s  {rate:10.0f} chunks/s{mbs}")
    whole = sum(times.values())
    print(f"  {'round trip':<12} {whole:8.3f} s  {total / whole:10.0f} chunks/s "
          "(offload, fetch, evict)")
    print("checks: " + ("all passed" if not problems else "FAILED: " + "; ".join(problems)))
    return 1 if problems else 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", default=None,
                   help="gpumemd's socket (default: $GPUMEMD_SOCKET, else gpumemd's default)")
    p.add_argument("--chunks", type=int, default=2000, help="chunks a round (default 2000)")
    p.add_argument("--chunk-size", default="64K", help="bytes a chunk (default 64K)")
    p.add_argument("--batch", type=int, default=256, help="chunks a call (default 256)")
    p.add_argument("--rounds", type=int, default=1, help="rounds (default 1)")
    p.add_argument("--durable", action="store_true",
                   help="durable chunks (default transient: a cache)")
    p.add_argument("--prefix", default=f"kv-offload-{os.getpid()}",
                   help="a new directory for the chunks, removed at the end "
                        "(default kv-offload-PID)")
    p.add_argument("--seed", type=int, default=7, help="the chunks' bytes (default 7)")
    a = p.parse_args(argv)
    from gpumemctl.protocol import UsageError
    from gpumemctl.protocol.sizes import parse_size
    try:
        a.chunk_size = parse_size(a.chunk_size)
    except UsageError as exc:
        p.error(str(exc))
    if a.chunks < 1 or a.batch < 1 or a.rounds < 1 or a.chunk_size < 1:
        p.error("--chunks, --batch, --rounds and --chunk-size must be at least 1")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    from gpumemctl.protocol import GpumemError
    try:
        return run(a)
    except (Failed, GpumemError) as exc:
        print(f"kv_offload: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
