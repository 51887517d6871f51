"""Running model-written code: a subprocess with time, memory, process and file limits.

The program runs in `python -I` (isolated: no user site, no PYTHON* variables) in an
empty temporary folder, in its own session, under rlimits set before exec:

    RLIMIT_CPU     cpu seconds      every process it starts inherits it, so even a process
                                    that escapes the session dies within this budget
    RLIMIT_AS      memory           an allocation beyond it fails (MemoryError)
    RLIMIT_NPROC   processes        a fork bomb's forks fail
    RLIMIT_FSIZE   bytes written    no filling the disk
    RLIMIT_CORE    0

and a wall-clock limit: when it passes, the whole session is SIGKILLed. RLIMIT_NPROC
counts the processes of a user id and is not enforced for root, so when the run is
root the program runs as an unprivileged user (nobody) instead, with an interpreter that
user can run (this one if its path is open to everyone, else the system's python3).

This is containment for a training run (a hanging or forking program cannot stall or
starve it), not a security boundary against hostile code: use a container or a VM
service for that.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import psutil

NOBODY = 65534


@dataclass
class SandboxLimits:
    wall_seconds: float = 5.0
    cpu_seconds: int = 5
    memory_mb: int = 512
    max_processes: int = 16
    max_output_bytes: int = 64_000
    max_file_bytes: int = 1_000_000


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def status(self) -> str:
        if self.timed_out or self.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
            return "timeout"  # the wall-clock limit, or the CPU limit (SIGXCPU, then SIGKILL at the hard limit)
        if self.returncode is not None and self.returncode < 0:
            return f"killed by signal {signal.Signals(-self.returncode).name}"
        if "MemoryError" in self.stderr:
            return "out of memory"
        return "ok" if self.returncode == 0 else f"exit {self.returncode}"


def _everyone_can_run(path: str) -> bool:
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    for i in range(2, len(parts)):
        if not os.stat(os.sep.join(parts[:i])).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(real).st_mode & stat.S_IXOTH)


def interpreter_for(run_as: int | None) -> str:
    if run_as is None or _everyone_can_run(sys.executable):
        return sys.executable
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3") or ""):
        if candidate and os.path.exists(candidate) and _everyone_can_run(candidate):
            return candidate
    raise RuntimeError(
        "the code sandbox runs programs as user nobody when the run is root, and no Python "
        f"interpreter is open to that user ({sys.executable} is not): install python3 system-wide"
    )


def _process_count(uid: int) -> int:
    """Processes whose real user is `uid`: what RLIMIT_NPROC counts."""
    return sum(
        1 for process in psutil.process_iter(["uids"]) if process.info["uids"] is not None and process.info["uids"].real == uid
    )


def _limit_child(limits: SandboxLimits, run_as: int | None, nproc: int):
    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
        memory = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if run_as is not None:
            os.setgroups([])
            os.setgid(run_as)
            os.setuid(run_as)
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return apply


def _kill_session(session_id: int) -> None:
    """SIGKILL every process whose session is `session_id` (the program and its children)."""
    try:
        os.killpg(session_id, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in psutil.pids():  # one that left the group but not the session
        try:
            if os.getsid(pid) == session_id:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` with Python under the limits; never raises for what the program does."""
    limits = limits or SandboxLimits()
    run_as = NOBODY if os.geteuid() == 0 else None
    # Not root: the limit counts every process of this user, so allow for those running now.
    nproc = limits.max_processes if run_as is not None else _process_count(os.geteuid()) + limits.max_processes
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="streamrl-sandbox-") as folder:
        os.chmod(folder, 0o777)
        program = os.path.join(folder, "program.py")
        with open(program, "w") as handle:
            handle.write(code)
        os.chmod(program, 0o644)
        process = subprocess.Popen(
            [interpreter_for(run_as), "-I", "-S", program],
            cwd=folder,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "HOME": folder, "LANG": "C.UTF-8"},
            start_new_session=True,
            preexec_fn=_limit_child(limits, run_as, nproc),
        )
        timed_out = False
        try:
            stdout, stderr = process.communicate(stdin.encode(), timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_session(process.pid)
            try:
                stdout, stderr = process.communicate(timeout=2)
            except subprocess.TimeoutExpired:  # an escaped process still holds the pipes
                process.kill()
                stdout, stderr = b"", b"(output lost: a process outside the session kept the pipes open)"
                process.wait()
        finally:
            _kill_session(process.pid)  # children left behind by a program that exited
    cap = limits.max_output_bytes
    return SandboxResult(
        process.returncode,
        stdout[:cap].decode(errors="replace"),
        stderr[-cap:].decode(errors="replace"),
        timed_out,
        time.monotonic() - started,
    )
