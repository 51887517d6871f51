"""Supervision of a run's processes on this machine: what a cluster scheduler does for
a crashed pod, done by `streamrl run` for its children.

A child that exits when it should not (a crash, a SIGKILL, an unexpected clean exit) is
started again after a delay that doubles with each crash in the window (1 s, 2 s, 4 s,
... up to `max_backoff_s`). Each process resumes by its own rules: workers and the
processor from their committed offsets (they commit only after their output), the sink
from its offsets in PostgreSQL, the learner from its checkpoint, the publisher with
`--resume` (tasks already done are skipped). Nothing is lost or duplicated because every
event id is deterministic and every consumer keeps the first copy.

Two kinds of exit are not retried, since a restart cannot fix them: bad usage or input
(exit 2: the recipe or the run's config) and a lost service (exit 3: the process has
already waited for the broker or PostgreSQL as long as it was told to). More than
`max_restarts` crashes of one process within `window_s` also ends the run, with the
child's last log lines: something is wrong that restarting will not cure. Except for an
optional child (the experiment trackers' feed): training does not need it, so where it
would end the run it is left stopped, with one sentence saying how to make up for it.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import gc
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

EXIT_USAGE = 2  # the CLI's codes (streamrl.cli.common), repeated here to keep the CLI unimported
EXIT_SERVICE = 3
NOT_RETRIED = {EXIT_USAGE: "bad usage or input", EXIT_SERVICE: "a service it needs was lost"}


class RunFailed(RuntimeError):
    pass


PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None


def ends_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A child's pre-exec step: SIGTERM to the child when this process dies.

    The children run in sessions of their own (a terminal's Ctrl-C reaches only
    `streamrl run`, which stops them in order), so nothing else would stop them if
    `streamrl run` itself were killed (SIGKILL, the OOM killer, a test's timeout): they
    would train on, unsupervised, beside the run's next `--resume`."""
    if _LIBC is None:
        return None

    def arm() -> None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # it died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5  # crashes of one process tolerated within the window; 0: no restarts
    window_s: float = 600.0
    backoff_s: float = 1.0  # the first delay, doubled for each further crash in the window
    max_backoff_s: float = 30.0

    def delay_s(self, crashes_in_window: int) -> float:
        """backoff_s doubled for each further crash, at most max_backoff_s. No jitter: one
        supervisor restarts its own children, so there is no herd of clients to spread,
        and the delay it prints is the delay it waits."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** max(0, crashes_in_window - 1))


class ForkedProcess:
    """A child forked from this process, seen through what the supervisor uses of a
    `subprocess.Popen`: poll, wait, send_signal, kill. Its exit is awaited on a pidfd."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            readable, _, _ = select.select([self._pidfd], [], [], timeout)
            if not readable:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            self._reap(0)  # it has exited: this returns at once
        assert self.returncode is not None
        return self.returncode

    def _reap(self, flags: int) -> None:
        pid, status = os.waitpid(self.pid, flags)
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)
            os.close(self._pidfd)

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def forking_supported() -> bool:
    """Linux, where a forked child's exit can be awaited on a pidfd; elsewhere every child
    is a new interpreter."""
    return sys.platform == "linux" and hasattr(os, "pidfd_open")


def fork_child(entry: Callable[[list[str]], int], args: list[str], log_path: Path, env: dict) -> ForkedProcess:
    """`entry(args)` in a forked copy of this process, as `python -m streamrl.cli ARGS`
    would run it: its own session, stdout and stderr to `log_path`, `env` as its
    environment, its command line in `ps`, SIGTERM when this process dies. The copy
    keeps this process's imported modules (torch and transformers: most of a child's
    start), so this is only safe from a process with one thread (no lock held by a
    thread the copy does not have): `Supervisor` checks that."""
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    # Frozen, this process's objects are never collected in the child, whose collector
    # would otherwise run their finalizers there (closing this process's files and sockets).
    gc.collect()
    gc.freeze()
    pid = os.fork()
    if pid:
        gc.unfreeze()
        return ForkedProcess(pid)

    def child() -> int:
        os.setsid()
        arm = ends_with_parent(parent)
        if arm is not None:
            arm()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        command = [sys.executable, "-m", "streamrl.cli", *args]
        set_process_title(" ".join(command))  # before the environment changes: it moves it
        os.environ.clear()
        os.environ.update(env)
        atexit._clear()  # this process's exit handlers are not the child's  # type: ignore[attr-defined]
        sys.argv = ["streamrl", *args]
        return entry(args)

    exit_as_interpreter(child)


def exit_as_interpreter(body: Callable[[], int]) -> NoReturn:
    """`body()` in a forked child, then the child's end as an interpreter's, as
    multiprocessing ends a forked child: SystemExit's code (a traceback and 1 for another
    exception), its threads joined, its own exit handlers run, its streams flushed; never
    the parent's finalizers (os._exit)."""
    code = 1
    try:
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            threading._shutdown()  # type: ignore[attr-defined]
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    raise AssertionError("unreachable")


def set_process_title(title: str) -> None:
    """What `ps` and /proc/PID/cmdline show for this process (a forked child would show
    its parent's command line)."""
    import setproctitle

    setproctitle.setproctitle(title)


@dataclass
class Child:
    name: str
    args: list[str]  # after `python -m streamrl.cli`
    log_path: Path
    process: subprocess.Popen | ForkedProcess | None = None
    may_finish: bool = False  # a clean exit is the end of its work (publisher, learner), not a crash
    restart_args: list[str] | None = None  # how it resumes, when that differs from how it started
    restarts: int = 0
    crashes: deque = field(default_factory=deque)  # monotonic times of recent crashes
    restart_at: float | None = None

    def exit_code(self) -> int | None:
        """The process's exit code; None while it runs (or before it first starts)."""
        return self.process.poll() if self.process is not None else None

    optional: str | None = None  # not needed by the run: what to do if it is given up (said once)
    given_up: bool = False

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def failure(self, code: int) -> str:
        return f"{self.name} exited with code {code}; last lines of {self.log_path}:\n{self.tail()}"


class Supervisor:
    """Starts children as `python -m streamrl.cli ARGS` in their own sessions, restarts
    crashed ones by the policy, and stops them all.

    With `fork_entry` (the CLI's entry point), a child is forked from this process while
    it has one thread, so it starts with this process's imports; later (a restart, once
    threads run) it is started as a new interpreter."""

    def __init__(
        self,
        logs: Path,
        env: dict,
        policy: RestartPolicy,
        say: Callable[[str], None],
        fork_entry: Callable[[list[str]], int] | None = None,
    ):
        self.logs, self.env, self.policy, self.say = logs, env, policy, say
        self.fork_entry = fork_entry
        self.children: list[Child] = []

    def spawn(
        self,
        name: str,
        args: list[str],
        may_finish: bool = False,
        restart_args: list[str] | None = None,
        optional: str | None = None,
    ) -> Child:
        child = Child(name, args, self.logs / f"{name}.log", may_finish=may_finish, restart_args=restart_args, optional=optional)
        self._start(child, args)
        self.children.append(child)
        return child

    def _start(self, child: Child, args: list[str]) -> None:
        if self.fork_entry is not None and threading.active_count() == 1:
            child.process = fork_child(self.fork_entry, args, child.log_path, self.env)
            return
        with open(child.log_path, "ab") as handle:
            child.process = subprocess.Popen(
                [sys.executable, "-m", "streamrl.cli", *args],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=ends_with_parent(os.getpid()),
            )

    def check(self) -> None:
        """Notice exits, schedule and perform restarts; RunFailed when one must not go on."""
        now = time.monotonic()
        for child in self.children:
            if child.given_up:
                continue
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restart_at = None
                    child.restarts += 1
                    with open(child.log_path, "a") as log:
                        log.write(f"\n--- restarted by streamrl run (restart {child.restarts}) ---\n")
                    self._start(child, child.restart_args or child.args)
                continue
            code = child.exit_code()
            if code is None or (code == 0 and child.may_finish):
                continue
            if code in NOT_RETRIED or self.policy.max_restarts <= 0:
                self._fail(child, child.failure(code))
                continue
            self._crashed(child, code, now)

    def _fail(self, child: Child, why: str) -> None:
        """End the run, or, for an optional child, go on without it."""
        if child.optional is None:
            raise RunFailed(why)
        child.given_up, child.restart_at = True, None
        self.say(f"{child.name} is stopped and the run goes on without it: {child.optional}; {why.splitlines()[0]}")

    def _crashed(self, child: Child, code: int, now: float) -> None:
        child.crashes.append(now)
        while child.crashes and now - child.crashes[0] > self.policy.window_s:
            child.crashes.popleft()
        if len(child.crashes) > self.policy.max_restarts:
            return self._fail(
                child,
                f"{child.name} crashed {len(child.crashes)} times within "
                f"{self.policy.window_s:.0f} s (at most {self.policy.max_restarts} restarts "
                f"allowed): giving up. " + child.failure(code),
            )
        delay = self.policy.delay_s(len(child.crashes))
        child.restart_at = now + delay
        how = f"signal {-code}" if code < 0 else f"code {code}"
        self.say(
            f"{child.name} exited with {how}; restarting it in {delay:.3g} s "
            f"(crash {len(child.crashes)} of at most {self.policy.max_restarts + 1} in "
            f"{self.policy.window_s:.0f} s; log {child.log_path})"
        )

    def finished(self, child: Child) -> bool:
        return child.restart_at is None and child.exit_code() == 0

    @property
    def restarts(self) -> dict[str, int]:
        return {child.name: child.restarts for child in self.children if child.restarts}

    def restarts_text(self) -> str:
        counts = self.restarts
        return ", ".join(f"{name} {n}" for name, n in counts.items()) if counts else "none"

    def stop(self, timeout_s: float = 30.0, last: tuple[str, ...] = ("sink",)) -> None:
        """SIGTERM every process, those named in `last` once the others have exited: the
        ledger sink then writes what they published while stopping."""
        first = [child for child in self.children if child.name not in last]
        self._stop_group(first, timeout_s)
        self._stop_group([child for child in self.children if child.name in last], timeout_s)

    @staticmethod
    def _stop_group(children: list, timeout_s: float) -> None:
        for child in children:
            child.restart_at = None
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in children:
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
