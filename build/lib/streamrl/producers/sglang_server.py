"""Managed SGLang servers: launched from the recipe's model, health-checked, restarted.

A rollout worker with `service.inference_service.backend: sglang` and no `url` starts
`num_servers` servers of its own and stops them when it stops. SGLang runs from its own
Python environment (`STREAMRL_SGLANG_PYTHON`, default the one `make sglang-env` builds):
it pins its own torch and CUDA packages, and StreamRL only speaks HTTP to it.

On `trainer.device: cpu` the server runs SGLang's CPU engine with the plain-torch kernel
stand-in in `contrib/sglang_cpu` and the launch options small dense models need there,
in float32 (SGLang's `dtype: auto` would serve a float32 model in float16, which is not
what the learner trains); a recipe's `server_args` come last and win.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from streamrl.producers.inference import InferenceUnavailable
from streamrl.runtime.device import resolve_device

log = logging.getLogger("streamrl.sglang")

CPU_KERNEL_SHIM = Path(__file__).resolve().parents[1] / "contrib" / "sglang_cpu"
CPU_SERVER_ARGS = {
    "device": "cpu",
    "dtype": "float32",
    "attention-backend": "torch_native",
    "sampling-backend": "pytorch",
    "disable-cuda-graph": True,
    "disable-overlap-schedule": True,
    "max-total-tokens": 8192,
}


class InferenceServerError(InferenceUnavailable):
    """An inference server cannot be started, reached or updated (the message says which and why)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_flags(options: dict) -> list[str]:
    """`{"mem-fraction-static": 0.8, "enable-metrics": True}` -> SGLang's command-line flags
    (true: the bare flag; false or null: left out; lists: repeated values)."""
    flags: list[str] = []
    for key, value in options.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            flags += [flag, *(str(v) for v in value)]
        else:
            flags += [flag, str(value)]
    return flags


def launch_options(model_path: str, port: int, device: str, server_args: dict) -> dict:
    # sleep-on-idle: an idle scheduler waits on its sockets instead of polling them, which
    # held a whole core per server while it had nothing to do (in sync mode, while the
    # learner trains beside it); a request wakes it at once.
    options = {"model-path": str(model_path), "host": "127.0.0.1", "port": port, "sleep-on-idle": True}
    if resolve_device(device).type == "cpu":
        options.update(CPU_SERVER_ARGS)
    options.update({str(k).replace("_", "-"): v for k, v in server_args.items()})
    return options


def check_sglang_python(python: Path) -> Path:
    if not python.exists():
        raise InferenceServerError(
            f"no SGLang environment at {python}: run `make sglang-env` (builds it once per machine, "
            "about 11 GB) or set STREAMRL_SGLANG_PYTHON to the python of an environment with sglang"
        )
    return python


class ManagedServer:
    """One SGLang server process owned by this worker."""

    def __init__(
        self, python: Path, model_path: str, device: str, server_args: dict, log_path: Path, startup_timeout_s: float = 300.0
    ):
        self.python = check_sglang_python(python)
        self.model_path = model_path
        self.device = device
        self.server_args = dict(server_args)
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.port = int(self.server_args.pop("port", 0)) or free_port()
        self.process: subprocess.Popen | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        options = launch_options(self.model_path, self.port, self.device, self.server_args)
        return [str(self.python), "-m", "sglang.launch_server", *server_flags(options)]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
        if resolve_device(self.device).type == "cpu":
            # One OpenMP thread: several would oversubscribe the cores the worker shares.
            env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS=os.environ.get("STREAMRL_SGLANG_THREADS", "1"))
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CPU_KERNEL_SHIM), env.get("PYTHONPATH")]))
        return env

    def start(self) -> ManagedServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, env=self.environment(), start_new_session=True
            )
        log.info("starting SGLang on port %d, pid %d (log: %s)", self.port, self.process.pid, self.log_path)
        self.wait_healthy()
        log.info("SGLang on port %d is up after %.0f s", self.port, time.monotonic() - started)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise InferenceServerError(
                    f"the SGLang server on port {self.port} exited with code "
                    f"{self.process and self.process.returncode} while starting:\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise InferenceServerError(
            f"the SGLang server on port {self.port} did not answer /health within "
            f"{self.startup_timeout_s:.0f} s (service.inference_service.startup_timeout_s); "
            f"its log, {self.log_path}, ends:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        log.warning("restarting the SGLang server on port %d (restart %d)", self.port, self.restarts)
        self.start()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        # SIGTERM to the launch process's group stops its scheduler and detokenizer too.
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=10)
        # The port may take a few seconds to free; the next start binds the same one.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) != 0:
                    break
            time.sleep(0.3)
