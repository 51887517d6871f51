"""`python -m streamrl.cli ARGS` for the tests, forked from one interpreter that has
already imported the CLI, torch and transformers (a zygote per pytest-xdist worker).

A new interpreter spends most of a short CLI call, and several CPU-seconds of a
`streamrl run`, importing; the suite makes a few hundred such calls (docs/benchmarks.md,
"A zygote for the tests' CLI calls"). `CliPopen` is a `subprocess.Popen` whose child is
forked by the zygote instead of executed: it gets the caller's standard streams (pipes
included), working directory and environment, its own session when asked, and its
command line in `ps` (`pgrep -f` finds it), and its exit status comes back through the
zygote, which is its parent. `STREAMRL_TEST_ZYGOTE=0` makes every call a new
interpreter again.

    python tests/cli_zygote.py ADDRESS   # the zygote; `CliPopen` starts it on first use
"""

from __future__ import annotations

import atexit
import gc
import inspect
import io
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from streamrl.supervise import exit_as_interpreter, forking_supported, set_process_title

REPO = Path(__file__).resolve().parents[1]
SIGNALS_TO_RESET = (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)  # SIGPIPE stays ignored, as Python starts


def enabled() -> bool:
    return os.environ.get("STREAMRL_TEST_ZYGOTE", "1") != "0" and forking_supported()


# -- the zygote ---------------------------------------------------------------------------


def serve(address: str) -> None:
    """Fork a CLI call for each request; report its wait status when it ends."""
    import typer

    from streamrl import orchestrate
    from streamrl.cli import app
    from streamrl.cli.common import forked_main
    from streamrl.supervise import ends_with_parent

    arm = ends_with_parent(os.getppid())
    if arm is not None:
        arm()  # the zygote ends with the pytest worker that started it
    orchestrate.preload_for_children()
    command = typer.main.get_command(app)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind("\0" + address)
    listener.listen(64)
    # Frozen, the zygote's objects are never collected in a child, whose collector would
    # otherwise run their finalizers there (closing the zygote's files and sockets).
    gc.collect()
    gc.freeze()
    print("ready", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    while True:
        for key, _ in selector.select():
            if key.data is None:
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                if not message:
                    conn.close()
                    continue
                waiting = [k for k in selector.get_map().values() if k.data]
                inherited = [listener, selector, conn, *(k.data[1] for k in waiting)]
                pid = fork_call(json.loads(message), fds, command, forked_main, inherited, [k.fd for k in waiting])
                try:
                    conn.send(str(pid).encode())
                except OSError:
                    pass  # the caller is gone; the child is still reaped below
                selector.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, conn))
            else:
                pid, conn = key.data
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                try:
                    conn.send(str(status).encode())
                except OSError:
                    pass  # the caller stopped waiting
                conn.close()


def fork_call(request: dict, fds: list[int], command, forked_main, inherited: list, pidfds: list[int]) -> int:
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid

    def child() -> int:
        for thing in inherited:  # the zygote's sockets are not the child's
            thing.close()
        for fd in pidfds:
            os.close(fd)
        if request["new_session"]:
            os.setsid()
        for signum in SIGNALS_TO_RESET:
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        args = request["args"]
        set_process_title(" ".join([sys.executable, "-m", "streamrl.cli", *args]))  # before the environment changes
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = request["cwd"]  # `python -m` puts the working directory first
        fresh_stdio(bool(os.environ.get("PYTHONUNBUFFERED")))
        atexit._clear()  # type: ignore[attr-defined]
        sys.argv = ["streamrl", *args]
        return forked_main(command, args)

    exit_as_interpreter(child)


def fresh_stdio(unbuffered: bool) -> None:
    """Standard streams on the new fds 0-2, buffered as a new interpreter's would be."""

    def writer(fd: int, errors: str) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        tty = raw.isatty()
        stream = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(stream, encoding="utf-8", errors=errors, line_buffering=tty, write_through=unbuffered)  # type: ignore[arg-type]

    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
    sys.stdout = writer(1, "strict")
    sys.stderr = writer(2, "backslashreplace")
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


# -- the caller's side --------------------------------------------------------------------

_zygote: dict = {}  # in each pytest worker: its zygote's address and process
_start_lock = threading.Lock()


def zygote_address() -> str:
    with _start_lock:
        process = _zygote.get("process")
        if process is None or process.poll() is not None:
            address = f"streamrl-test-zygote-{uuid.uuid4().hex}"  # abstract (bound as NUL + it): no file to remove
            process = subprocess.Popen(
                [sys.executable, __file__, address],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                text=True,
            )
            line = process.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"the CLI zygote did not start (exit {process.wait()}): {line}")
            _zygote.update(process=process, address=address)
        return _zygote["address"]


_EXECUTE_CHILD = inspect.signature(subprocess.Popen._execute_child)  # type: ignore[attr-defined]


class CliPopen(subprocess.Popen):
    """`subprocess.Popen([sys.executable, "-m", "streamrl.cli", *args], ...)`, the child
    forked by the zygote (see the module's docstring). Its `args` must start that way."""

    _conn: socket.socket | None = None

    def _execute_child(self, *params):  # type: ignore[override]
        given = _EXECUTE_CHILD.bind(self, *params).arguments
        args = list(given["args"])
        if args[:3] != [sys.executable, "-m", "streamrl.cli"] or given["preexec_fn"] or given["shell"]:
            raise ValueError(f"CliPopen runs `python -m streamrl.cli ARGS` only, not {args}")
        env = given["env"]
        request = {
            "args": [os.fsdecode(a) for a in args[3:]],
            "cwd": os.fsdecode(given["cwd"]) if given["cwd"] is not None else os.getcwd(),
            "env": {os.fsdecode(k): os.fsdecode(v) for k, v in (env if env is not None else os.environ).items()},
            "new_session": bool(given["start_new_session"]),
        }
        streams = [given["p2cread"], given["c2pwrite"], given["errwrite"]]
        fds = [fd if fd != -1 else inherited for fd, inherited in zip(streams, (0, 1, 2))]
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect("\0" + zygote_address())
            socket.send_fds(conn, [json.dumps(request).encode()], fds)
            reply = conn.recv(64)
            if not reply:
                raise RuntimeError("the CLI zygote ended before forking")
            self.pid = int(reply)
            self._child_created = True
            self._conn = conn
        except BaseException:
            conn.close()
            raise
        finally:
            self._close_pipe_fds(
                given["p2cread"],
                given["p2cwrite"],
                given["c2pread"],
                given["c2pwrite"],
                given["errread"],
                given["errwrite"],
            )

    def _status(self, timeout: float | None) -> bool:
        """Read the child's wait status from the zygote; False if `timeout` passes first."""
        if self.returncode is not None:
            return True
        if self._conn is None:
            return False
        self._conn.settimeout(timeout)
        try:
            reply = self._conn.recv(64)
        except (TimeoutError, BlockingIOError):
            return False
        self._conn.close()
        self._conn = None
        if not reply:
            raise RuntimeError(f"the CLI zygote ended before its child {self.pid} did")
        self.returncode = os.waitstatus_to_exitcode(int(reply))
        return True

    def _internal_poll(self, *args, **kwargs):  # type: ignore[override]
        self._status(0)
        return self.returncode

    def _wait(self, timeout):  # type: ignore[override]
        if not self._status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


def cli_popen(command: list[str], **popen_kwargs) -> subprocess.Popen:
    """`subprocess.Popen(command, **popen_kwargs)` for a `command` that starts
    `sys.executable, "-m", "streamrl.cli"`: forked by the zygote unless
    STREAMRL_TEST_ZYGOTE=0."""
    return (CliPopen if enabled() else subprocess.Popen)(command, **popen_kwargs)


if __name__ == "__main__":
    serve(sys.argv[1])
