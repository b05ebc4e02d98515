"""Start vLLM servers for a run on this machine:
`python -m launch.vllm_servers --config C [--num 2] [--base-port 8100] [overrides] [-- command ...]`.

Each server is vLLM's OpenAI server for the run's base model with the run's engine arguments
(grpo/rollout/vllm_server.py `serve_command`, the environment `SERVER_ENV`); its log goes to
`<run dir>/vllm-server-<port>.log`. Without a command the URLs are printed and the servers run
until interrupted; with one (after `--`), the command runs with `vllm_server.urls=[...]` appended
(an override of `launch.train`), and the servers stop when it ends:

    python -m launch.vllm_servers --config configs/vllm_servers.yaml --num 2 -- \\
        python -m launch.train --config configs/vllm_servers.yaml

On a CPU the servers split the cores between them (`VLLM_CPU_OMP_THREADS_BIND`): by default each
vLLM CPU server binds its threads to core 0 and leaves the rest, so two would share one core.
Servers on other machines: run this there with `--host 0.0.0.0` and no command, and list their
URLs in `vllm_server.urls` (with `vllm_server.weights_dir` on a filesystem they all read).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from grpo.config import load_config
from grpo.models.source import resolve_model_dir
from grpo.rollout.vllm_server import SERVER_ENV, serve_command
from launch.interrupt import stops_cleanly_on_interrupt


class ServerStartError(RuntimeError):
    """A server exited or did not become healthy; the message holds its log's tail."""


def cpu_binding(index: int, count: int, cores: int) -> str:
    """The cores server `index` of `count` binds its threads to: an even, contiguous share
    (`"0"`, `"1"` for two servers on two cores; a server gets at least one core)."""
    share = max(1, cores // count)
    first = (index * share) % cores
    return str(first) if share == 1 else f"{first}-{first + share - 1}"


@dataclass
class RunningServer:
    url: str
    process: subprocess.Popen
    log_path: Path

    def kill(self) -> None:
        """SIGKILL the server and its engine process (they share a process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self, wait_s: float = 20.0) -> None:
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _wait_healthy(server: RunningServer, deadline: float) -> None:
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ServerStartError(f"vLLM server {server.url} exited with {server.process.returncode}:\n"
                                   f"{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + "/health", timeout=5.0).status_code == 200:
                return
        time.sleep(1.0)
    raise ServerStartError(f"vLLM server {server.url} not healthy in time:\n{server.log_tail()}")


@contextlib.contextmanager
def running_servers(config, model_dir: str | Path, ports: list[int], *, log_dir: str | Path,
                    host: str = "127.0.0.1", device: str = "cpu",
                    startup_timeout_s: float = 900.0) -> Iterator[list[RunningServer]]:
    """Start one server per port (all at once), wait until every one answers /health, yield
    them, and stop them afterwards."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    servers: list[RunningServer] = []
    try:
        for index, port in enumerate(ports):
            env = dict(os.environ, **SERVER_ENV, PYTHONUNBUFFERED="1")
            if device == "cpu":
                env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_binding(index, len(ports), os.cpu_count() or 1))
            log_path = log_dir / f"vllm-server-{port}.log"
            with open(log_path, "w") as log_file:
                process = subprocess.Popen(
                    serve_command(config, model_dir, port=port, host=host, device=device),
                    env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
            url_host = "127.0.0.1" if host == "0.0.0.0" else host
            servers.append(RunningServer(f"http://{url_host}:{port}", process, log_path))
        deadline = time.monotonic() + startup_timeout_s
        for server in servers:
            _wait_healthy(server, deadline)
        yield servers
    finally:
        for server in servers:
            server.stop()


@stops_cleanly_on_interrupt
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML run config (see configs/)")
    parser.add_argument("--num", type=int, default=2, help="how many servers")
    parser.add_argument("--base-port", type=int, default=8100, help="ports base-port, base-port + 1, ...")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the run config")
    args = parser.parse_args(own)
    config = load_config(args.config, args.overrides)
    model_dir = resolve_model_dir(config.model.name_or_path, config.model.cache_dir)
    if model_dir is None:
        parser.error(f"model {config.model.name_or_path!r} has no directory to serve; use a saved model")
    ports = [args.base_port + i for i in range(args.num)]
    with running_servers(config, model_dir, ports, log_dir=config.run_dir, host=args.host,
                         device=args.device) as servers:
        urls = [s.url for s in servers]
        print("vLLM servers ready:", " ".join(urls), flush=True)
        if not command:
            with contextlib.suppress(KeyboardInterrupt):
                while all(s.process.poll() is None for s in servers):
                    time.sleep(1.0)
            return 0
        return subprocess.call([*command, f"vllm_server.urls=[{','.join(urls)}]"])


if __name__ == "__main__":
    sys.exit(main())
