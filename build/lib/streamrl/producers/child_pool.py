"""Calls run in child processes with a time limit, from any thread.

A library that enforces its own time limit with `signal.alarm` (math-verify does) works
only on the main thread; evaluators run on worker threads. So the call runs in a child
process without that limit, and the limit is the parent's: a call past it kills its
child (the next call gets a new one) and raises TimeoutError, which the evaluator
records as an error rather than a silent reward of 0. A child's start-up (spawning and
importing) is waited for apart, so it never counts against a call's limit."""

from __future__ import annotations

import multiprocessing
import queue
from multiprocessing.connection import Connection

# How long a new child may take to start and import what it runs (a spawned Python
# importing sympy and math-verify takes seconds, more on a loaded machine): not counted
# against a call's limit.
STARTUP_S = 120.0


def _serve(fn, connection: Connection) -> None:
    connection.send(("ready", None))  # `fn` and its module are loaded: calls are timed from here
    while True:
        args = connection.recv()
        try:
            connection.send((True, fn(*args)))
        except Exception as exc:  # the caller re-raises it
            connection.send((False, exc))


class _Child:
    def __init__(self, fn):
        context = multiprocessing.get_context("spawn")  # no fork of a threaded parent
        self.connection, child_end = context.Pipe()
        self.process = context.Process(target=_serve, args=(fn, child_end), daemon=True)
        self.process.start()
        if not self.connection.poll(STARTUP_S):
            self.kill()
            raise RuntimeError(f"a child process did not start within {STARTUP_S:g} s")
        self.connection.recv()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.connection.close()


class ChildPool:
    """`pool(*args)` is `fn(*args)` computed in one of `size` child processes (started
    when first needed), or TimeoutError after `timeout_s`."""

    def __init__(self, fn, size: int = 2, timeout_s: float = 10.0):
        self.fn, self.timeout_s = fn, timeout_s
        self._idle: queue.Queue[_Child | None] = queue.Queue()
        for _ in range(size):
            self._idle.put(None)  # a slot; its child starts on first use

    def __call__(self, *args):
        child = self._idle.get()
        timed_out = False
        try:
            if child is None or not child.process.is_alive():
                child = _Child(self.fn)
            child.connection.send(args)
            if child.connection.poll(self.timeout_s):
                ok, value = child.connection.recv()
            else:
                timed_out = True
        except (EOFError, BrokenPipeError, ConnectionError) as exc:  # the child died mid-call
            child.kill()
            child = None
            raise RuntimeError(f"the child process died: {exc!r}") from None
        finally:
            if timed_out:
                child.kill()
                child = None
            self._idle.put(child)
        if timed_out:
            raise TimeoutError(f"took more than {self.timeout_s:g} s")
        if not ok:
            raise value
        return value
