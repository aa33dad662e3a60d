#!/usr/bin/env python3
"""A toy inference server whose weights outlive it: killed with SIGKILL, serving again at once.

    python3 examples/engine_restart.py                                 # host backend, numpy
    python3 examples/engine_restart.py --backend cuda --framework torch --size 4G

Run it from a checkout (it starts gpumemd from the checkout, as the tests and benchmarks do,
through tests/harness.py and bench/core.py). What it does:

  1. starts its own gpumemd (`--backend host` by default) in a fresh /tmp/gpumemctl-engine-*
     directory, with its own socket and state directory;
  2. writes a toy model there, `model.safetensors`: an MLP of --layers float32 layers (a
     d x d weight and a bias each) and a d x 16 head, d chosen so the file is about --size,
     random (seeded: every run writes the same bytes), with safetensors.numpy.save_file;
  3. `gpumemctl load model.safetensors models/toy --durable`;
  4. starts a server, a child process (this script with --serve) that answers requests, one
     JSON line each on its stdin/stdout: an input made from a seed, run through the MLP, and
     the output back. First a cold server that reads the weights from the file
     (`safetensors.numpy.load_file`, or `safetensors.torch.load_file` onto the GPU on the
     cuda backend), then one that takes them from durable memory with
     `gpumemctl.tensors.load("models/toy", framework)` (zero-copy views of the allocation;
     the socket comes from $GPUMEMD_SOCKET);
  5. SIGKILLs the durable server in the middle of its work and starts a new one, --restarts
     times, timing each from the spawn to its first answer;
  6. prints a table: time to first inference of the cold start, the first durable start and
     each restart, with what each server says it spent on imports, weights and the forward
     pass.

Checks (exit status 1 when one fails): every durable server answers the same seeds with
bit-identical outputs (same weights, same memory, same code), the cold server's answers
agree with them to float32 rounding, and every server's sha256 of its weights equals that of
the arrays written to the file. After the last kill, the daemon must show the allocation
`ready` with no attach holder left. Exit status 2 for bad arguments; a traceback (and the end
of gpumemd's log) if the run itself failed.

At the end, also on an error, Ctrl-C or SIGTERM, the servers, gpumemd and its keeper are
killed and the directory removed (--keep keeps it, with gpumemd.log). On the host backend
with the defaults (256 MiB, numpy) the run takes a few seconds on a 2-core VM. Every wait on
a child is bounded (--timeout). Needs numpy and safetensors (the `weights` extra); torch for
--framework torch; the cuda backend needs torch and a GPU.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "models/toy"
HEAD_OUT = 16           # outputs of the head
BATCH = 4               # rows of each request's input
SEED = 17               # the weights' seed: every run writes the same file
REQUEST_SEEDS = (1, 2, 3)
COLD_RTOL = 1e-4        # cold vs durable outputs: float32 rounding, different buffers


# ==== the server (a child process: this script with --serve) ====================================
def weight_names(layers: int) -> list[str]:
    names = []
    for i in range(layers):
        names += [f"layers.{i}.weight", f"layers.{i}.bias"]
    return names + ["head.weight"]


class Server:
    """The toy engine: weights in a dict, a forward pass, and the loop answering requests."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.timings: dict[str, float] = {}
        t0 = time.perf_counter()
        import numpy as np
        self.np = np
        if args.framework == "torch":
            import torch
            self.torch = torch
            self.device = torch.device(f"cuda:{args.device}" if args.backend == "cuda"
                                       else "cpu")
            t1 = time.perf_counter()
            if args.backend == "cuda":
                torch.zeros(1, device=self.device)      # the CUDA context, timed on its own
                torch.cuda.synchronize(self.device)
            self.timings["cuda_init_s"] = time.perf_counter() - t1
        else:
            self.timings["cuda_init_s"] = 0.0
        self.timings["framework_s"] = time.perf_counter() - t0 - self.timings["cuda_init_s"]
        t0 = time.perf_counter()
        self.weights = self.load_weights()
        self.timings["weights_s"] = time.perf_counter() - t0
        self.layers = sum(1 for k in self.weights if k.endswith(".weight")) - 1

    def load_weights(self) -> dict:
        a = self.args
        if a.serve == "durable":
            import gpumemctl.tensors  # the socket: $GPUMEMD_SOCKET
            return gpumemctl.tensors.load(a.weights, framework=a.framework)
        if a.framework == "torch":
            import safetensors.torch
            return safetensors.torch.load_file(a.weights, device=str(self.device))
        import safetensors.numpy
        return safetensors.numpy.load_file(a.weights)

    def forward(self, seed: int) -> list[list[float]]:
        np, w = self.np, self.weights
        d = w["layers.0.weight"].shape[0]
        x = np.random.default_rng(seed).standard_normal((BATCH, d), dtype=np.float32)
        if self.args.framework == "torch":
            torch = self.torch
            with torch.no_grad():
                h = torch.from_numpy(x).to(self.device)
                for i in range(self.layers):
                    h = torch.tanh(h @ w[f"layers.{i}.weight"] + w[f"layers.{i}.bias"])
                out = (h @ w["head.weight"]).float().cpu().numpy()
        else:
            h = x
            for i in range(self.layers):
                h = np.tanh(h @ w[f"layers.{i}.weight"] + w[f"layers.{i}.bias"])
            out = h @ w["head.weight"]
        return out.astype(np.float32).tolist()

    def digest(self) -> str:
        """sha256 over the weights' bytes, in name order (the parent's weights_digest)."""
        digest = hashlib.sha256()
        for name in sorted(self.weights):
            t = self.weights[name]
            if self.args.framework == "torch":
                t = t.detach().contiguous().reshape(-1).view(self.torch.uint8).cpu().numpy()
            digest.update(name.encode())
            digest.update(memoryview(self.np.ascontiguousarray(t).reshape(-1).view("u1")))
        return digest.hexdigest()

    def serve(self, requests, replies) -> None:
        first = True
        for line in requests:
            request = json.loads(line)
            if "digest" in request:
                reply = {"digest": self.digest(), "tensors": len(self.weights)}
            else:
                t0 = time.perf_counter()
                reply = {"out": self.forward(request["seed"])}
                if first:
                    self.timings["infer_s"] = time.perf_counter() - t0
                    reply["timings"] = self.timings
                    first = False
            replies.write(json.dumps(reply) + "\n")
            replies.flush()


def serve_main(args: argparse.Namespace) -> int:
    Server(args).serve(sys.stdin, sys.stdout)
    return 0


# ==== the driver ================================================================================
class Failed(RuntimeError):
    """The run itself failed (not a check)."""


def model_dims(size: int, layers: int) -> int:
    """d, a multiple of 64, such that `layers` d x d float32 weights take about `size`."""
    d = int((size / 4 / layers) ** 0.5) // 64 * 64
    return max(64, d)


def make_model(path: str, layers: int, d: int) -> tuple[int, str]:
    """The toy model's file; its size and the sha256 of its weights (Server.digest's)."""
    import numpy as np
    import safetensors.numpy
    rng = np.random.default_rng(SEED)
    tensors = {}
    for i in range(layers):
        w = rng.standard_normal((d, d), dtype=np.float32)
        w *= np.float32(1.5 / d ** 0.5)                 # keep tanh out of saturation
        tensors[f"layers.{i}.weight"] = w
        tensors[f"layers.{i}.bias"] = rng.standard_normal(d, dtype=np.float32) * \
            np.float32(0.1)
    head = rng.standard_normal((d, HEAD_OUT), dtype=np.float32)
    head *= np.float32(1 / d ** 0.5)
    tensors["head.weight"] = head
    safetensors.numpy.save_file(tensors, path, metadata={"model": "engine_restart toy MLP"})
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(memoryview(tensors[name].reshape(-1).view("u1")))
    return os.path.getsize(path), digest.hexdigest()


class Child:
    """A server process and the JSON lines it answers, each wait bounded."""

    def __init__(self, argv: list[str], env: dict, log: str, timeout: float):
        self.timeout, self.log = timeout, log
        self._buf = b""
        with open(log, "ab") as err:
            self.spawned = time.perf_counter()
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, env=env)

    def send(self, request: dict) -> None:
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()

    def reply(self) -> dict:
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Failed(f"the server gave no answer within {self.timeout:g} s "
                             f"(--timeout){self.stderr_tail()}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    code = self.proc.wait(self.timeout)
                    raise Failed(f"the server exited with status {code} before answering"
                                 f"{self.stderr_tail()}")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def ask(self, request: dict) -> dict:
        self.send(request)
        return self.reply()

    def stderr_tail(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                text = f.read()[-3000:]
        except OSError:
            return ""
        return f"; its stderr ({self.log}) ends:\n{text}" if text.strip() else ""

    def close(self) -> int:
        """End of input: the server's loop ends and it exits."""
        self.proc.stdin.close()
        try:
            return self.proc.wait(self.timeout)
        except subprocess.TimeoutExpired:
            raise Failed(f"the server did not exit within {self.timeout:g} s of the end of "
                         f"its input{self.stderr_tail()}") from None

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(self.timeout)
        self.proc.stdin.close()
        self.proc.stdout.close()

    def reap(self) -> None:
        """For the finally: kill the process if it still runs (by its own pid)."""
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except (OSError, ValueError):
                pass


def start_server(run: dict, kind: str, weights: str, label: str) -> dict:
    """Spawn a server, ask for the first inference at once; the time to its answer."""
    a = run["args"]
    argv = [sys.executable, os.path.abspath(__file__), "--serve", kind, "--weights", weights,
            "--framework", a.framework, "--backend", a.backend, "--device", str(a.device)]
    child = Child(argv, run["env"], os.path.join(run["base"], f"server-{len(run['children'])}"
                                                  ".stderr"), a.timeout)
    run["children"].append(child)
    child.send({"seed": REQUEST_SEEDS[0]})
    first = child.reply()
    ready_s = time.perf_counter() - child.spawned
    outs = [first["out"]] + [child.ask({"seed": s})["out"] for s in REQUEST_SEEDS[1:]]
    digest = child.ask({"digest": True})
    return {"label": label, "kind": kind, "child": child, "first_s": ready_s,
            "timings": first["timings"], "outs": outs, "digest": digest["digest"],
            "tensors": digest["tensors"]}


def gpumemctl(run: dict, *args: str) -> dict:
    """`gpumemctl --socket S ARGS --json` from the checkout; its JSON. A failure names the
    command and shows its stderr."""
    import core  # bench/core.py
    d = run["daemon"]
    argv = core.console_script("gpumemctl") + ["--socket", d.socket, *args, "--json"]
    try:
        proc = subprocess.run(argv, capture_output=True, env=run["env"], timeout=600,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise Failed(f"gpumemctl {' '.join(args)} did not finish in 600 s") from None
    if proc.returncode != 0:
        raise Failed(f"gpumemctl {' '.join(args)} exited {proc.returncode}:\n"
                     f"{proc.stderr.decode(errors='replace')[-3000:]}")
    return json.loads(proc.stdout)


def wait_released(run: dict, timeout: float) -> dict:
    """info of the model once no attach holder is left (a killed server's connection is
    closed by the kernel; the daemon ends its session)."""
    deadline = time.monotonic() + timeout
    with run["daemon"].client() as c:
        while True:
            info = c.info(MODEL)
            held = [h for h in info.get("holders", []) if str(h.get("kind", "")).startswith(
                "attach")]
            if not held or time.monotonic() > deadline:
                return {**info, "attach_holders": len(held)}
            time.sleep(0.01)


def drive(run: dict) -> list[str]:
    """The whole scenario; the problems found (empty: all checks passed)."""
    a, d = run["args"], run["daemon"]
    from gpumemctl.protocol.sizes import format_size
    dim = model_dims(a.size, a.layers)
    path = os.path.join(run["base"], "model.safetensors")
    say(f"writing the toy model: {a.layers} layers of {dim}x{dim} float32 + a head -> {path}")
    file_bytes, want = make_model(path, a.layers, dim)
    run["model"] = {"dim": dim, "layers": a.layers, "file_bytes": file_bytes,
                    "tensors": 2 * a.layers + 1}
    say(f"starting gpumemd --backend {a.backend} in {run['base']}")
    try:
        d.start(timeout=120)
    except AssertionError as exc:      # the harness's: gpumemd exited, or never served
        raise Failed(f"gpumemd --backend {a.backend} did not start: {exc}") from None
    say(f"gpumemctl load {path} {MODEL} --durable")
    load_args = ["load", path, MODEL, "--durable"]
    if a.backend == "cuda":
        load_args += ["--device", str(a.device)]
    run["load"] = gpumemctl(run, *load_args)
    say(f"loaded {format_size(run['load']['bytes'])} in {run['load']['seconds']:.3f} s")

    results = run["results"]
    say("cold start: a server that reads the weights from the file")
    cold = start_server(run, "file", path, "cold start: weights from the file (safetensors "
                        + ("torch, to the GPU)" if a.framework == "torch" and a.backend == "cuda"
                           else f"{a.framework})"))
    results.append(cold)
    if cold["child"].close() != 0:
        raise Failed(f"the cold server exited with an error{cold['child'].stderr_tail()}")
    say("durable start: a server that takes the weights from gpumemd")
    results.append(start_server(run, "durable", MODEL,
                                "durable: first start (gpumemctl.tensors.load)"))
    for n in range(a.restarts):
        say(f"SIGKILL the server (pid {results[-1]['child'].proc.pid}) with a request in "
            f"flight, start a new one ({n + 1}/{a.restarts})")
        results[-1]["child"].send({"seed": REQUEST_SEEDS[-1]})
        results[-1]["child"].kill9()
        results.append(start_server(run, "durable", MODEL,
                                    f"durable: restart {n + 1} after SIGKILL"))
    results[-1]["child"].send({"seed": REQUEST_SEEDS[-1]})
    results[-1]["child"].kill9()
    run["after"] = wait_released(run, a.timeout)
    return check(run, want)


def check(run: dict, want: str) -> list[str]:
    import numpy as np
    problems = []
    results = run["results"]
    reference = results[1]          # the first durable start
    for r in results:
        r["same_weights"] = r["digest"] == want
        if not r["same_weights"]:
            problems.append(f"{r['label']}: the weights' sha256 is {r['digest']}, the file's "
                            f"arrays' {want}")
        if r is reference:
            r["same_answer"] = True
        elif r["kind"] == "durable":
            r["same_answer"] = r["outs"] == reference["outs"]
            if not r["same_answer"]:
                problems.append(f"{r['label']}: the answers differ from the first durable "
                                "start's")
        else:
            got, ref = np.asarray(r["outs"]), np.asarray(reference["outs"])
            r["max_diff"] = float(np.max(np.abs(got - ref)))
            r["same_answer"] = bool(np.allclose(got, ref, rtol=COLD_RTOL, atol=COLD_RTOL))
            if not r["same_answer"]:
                problems.append(f"{r['label']}: the answers differ from the durable server's "
                                f"by up to {r['max_diff']:g}")
    after = run["after"]
    if after.get("state") != "ready" or after["attach_holders"]:
        problems.append(f"after the last SIGKILL, {MODEL} is '{after.get('state')}' with "
                        f"{after['attach_holders']} attach holder(s); expected ready and none")
    return problems


# ==== the report ================================================================================
def print_table(run: dict, problems: list[str]) -> None:
    from gpumemctl.protocol.sizes import format_size
    a, m, ld = run["args"], run["model"], run["load"]
    print(f"engine_restart - toy MLP: {m['layers']} layers of {m['dim']}x{m['dim']} float32 "
          f"+ a {m['dim']}x{HEAD_OUT} head ({m['tensors']} tensors, "
          f"{format_size(m['file_bytes'])} file); framework {a.framework}; gpumemd "
          f"--backend {a.backend}")
    print(f"gpumemctl load --durable: {format_size(ld['bytes'])} in {ld['seconds']:.3f} s"
          + (f" (io {ld['io']})" if ld.get("io") else ""))
    headers = ["server start", "first answer", "imports", "cuda init", "weights", "inference",
               "same answer", "same weights"]
    ms = lambda s: f"{s * 1e3:.1f} ms"      # noqa: E731
    yes = lambda v: "yes" if v else "NO"    # noqa: E731
    rows = []
    for r in run["results"]:
        t = r["timings"]
        same = yes(r["same_answer"])
        if r is run["results"][1]:
            same = "(reference)"
        elif "max_diff" in r:
            same += f" (max diff {r['max_diff']:.1e})"
        rows.append([r["label"], ms(r["first_s"]), ms(t["framework_s"]), ms(t["cuda_init_s"]),
                     ms(t["weights_s"]), ms(t["infer_s"]), same, yes(r["same_weights"])])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in
                                             zip(row[1:6], widths[1:6], strict=True)]
        cells += [c.ljust(w) for c, w in zip(row[6:], widths[6:], strict=True)]
        print("  ".join(cells).rstrip())
    cold = run["results"][0]["first_s"]
    restarts = [r["first_s"] for r in run["results"][2:]]
    median = statistics.median(restarts)
    print(f"time to first inference after a restart (median of {len(restarts)}): "
          f"{median * 1e3:.1f} ms, against {cold * 1e3:.1f} ms for a cold start from the file "
          f"({cold / median:.1f}x)")
    after = run["after"]
    print(f"after the last SIGKILL: {MODEL} is {after.get('state')}, "
          f"{after['attach_holders']} attach holder(s) left")
    print("'first answer': from spawning the server to reading its first answer (interpreter "
          "start-up included); the other columns are the server's own account")
    print("checks: " + ("all passed" if not problems else "FAILED: " + "; ".join(problems)))


# ==== main ======================================================================================
def say(message: str) -> None:
    print(f"[engine_restart] {message}", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("host", "cuda"), default="host",
                   help="gpumemd's backend (default host)")
    p.add_argument("--size", default="256M", help="about how big the model is (default 256M)")
    p.add_argument("--framework", choices=("numpy", "torch"), default=None,
                   help="the servers' framework (default numpy on host, torch on cuda)")
    p.add_argument("--layers", type=int, default=4, help="layers of the MLP (default 4)")
    p.add_argument("--restarts", type=int, default=2,
                   help="SIGKILLs and restarts of the durable server (default 2)")
    p.add_argument("--device", type=int, default=0, help="CUDA device (cuda backend)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for any one answer of a server (default 120)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (gpumemd.log)")
    # The server's side (this script as a child process).
    p.add_argument("--serve", choices=("file", "durable"), help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.framework is None:
        args.framework = "torch" if args.backend == "cuda" else "numpy"
    if args.serve:
        return args
    if args.backend == "cuda" and args.framework == "numpy":
        p.error("numpy cannot hold GPU memory: use --framework torch with --backend cuda")
    if args.layers < 1 or args.restarts < 1 or args.timeout <= 0:
        p.error("--layers and --restarts must be at least 1, --timeout positive")
    for path in (ROOT, os.path.join(ROOT, "bench")):
        if path not in sys.path:
            sys.path.insert(0, path)
    import importlib.util
    for module in ("numpy", "safetensors", "gpumemctl", args.framework):
        if importlib.util.find_spec(module) is None:     # found, not imported (torch: slow)
            p.error(f"{sys.executable} has no module {module}: this example needs numpy, "
                    "safetensors and gpumemctl's dependencies (pip install -e "
                    "'.[weights]'), and torch for --framework torch")
    from gpumemctl.protocol import UsageError
    from gpumemctl.protocol.sizes import parse_size
    try:
        args.size = parse_size(args.size)
    except UsageError as exc:
        p.error(str(exc))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.serve:
        return serve_main(args)
    import core  # bench/core.py: tests/harness.py's Daemon, as the benchmarks run it

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # cleans up in finally
    base = tempfile.mkdtemp(prefix="gpumemctl-engine-", dir="/tmp")
    d = core.Daemon(base, backend=args.backend)
    env = core.clean_env()
    env["GPUMEMD_SOCKET"] = d.socket          # gpumemctl.tensors.load finds the daemon here
    run: dict = {"args": args, "base": base, "daemon": d, "env": env, "children": [],
                 "results": []}
    try:
        problems = drive(run)
    except KeyboardInterrupt:
        say("interrupted; stopping the servers and gpumemd")
        return 130
    except Failed as exc:
        core.show_log_tail(d)
        say(f"error: {exc}")
        return 1
    except Exception:
        core.show_log_tail(d)
        raise
    finally:
        for child in run["children"]:
            child.reap()
        d.cleanup()
        if args.keep:
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print_table(run, problems)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
