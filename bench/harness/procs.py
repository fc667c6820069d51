"""Running external commands so that a run can always be stopped cleanly.

Every child runs in its own process group and is registered while it runs,
so that a timeout, an exception or a signal kills the child *and* whatever it
started (dbench clients, fio jobs), and cleanup never waits on an orphan.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from typing import IO, Mapping, Optional, Sequence


class Interrupted(BaseException):
    """Raised from the signal handler; a BaseException so that the
    per-measurement `except Exception` blocks never swallow it."""


class CmdError(RuntimeError):
    """A command failed, timed out or printed something unusable."""


class RunLog:
    """Timestamped progress lines on stderr and, once a results directory
    exists, in its run.log (so a finished run says what it ran and when)."""

    def __init__(self) -> None:
        self._file: Optional[IO[str]] = None

    def attach(self, path: str) -> None:
        self._file = open(path, "a")

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None

    def __call__(self, msg: str) -> None:
        line = "[%s] %s" % (time.strftime("%H:%M:%S"), msg)
        print(line, file=sys.stderr, flush=True)
        if self._file:
            self._file.write(line + "\n")
            self._file.flush()


def kill_group(p: subprocess.Popen) -> None:
    """SIGKILL a child's whole process group (it was started in its own)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Processes:
    """The children of one run and its signal state.

    `interrupted` is the signal that stopped the run; once `cleaning` is set
    further signals are ignored, so a second Ctrl-C cannot abandon a mount.
    """

    def __init__(self, log: RunLog) -> None:
        self.log = log
        self.children: set[subprocess.Popen] = set()
        self.interrupted: Optional[int] = None
        self.cleaning = False

    def on_signal(self, signum: int, _frame: object) -> None:
        if self.cleaning or self.interrupted:
            self.log("signal %d ignored: cleaning up, please wait" % signum)
            return
        self.interrupted = signum
        self.log("signal %d: stopping and cleaning up" % signum)
        raise Interrupted(signum)

    def install_signal_handlers(self) -> None:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(s, self.on_signal)

    def kill_all(self) -> None:
        for p in list(self.children):
            kill_group(p)

    def run(self, cmd: Sequence[object], *, timeout: Optional[float] = None, check: bool = True,
            out_path: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
            cwd: Optional[str] = None, quiet: bool = False) -> tuple[int, str, str]:
        """Run a command in its own process group; kill the whole group on
        timeout, error or signal.  Returns (rc, stdout, stderr).  With
        out_path, stdout+stderr go to that file (and are returned as stdout)."""
        argv = [str(c) for c in cmd]
        if not quiet:
            self.log("$ " + " ".join(shlex.quote(a) for a in argv))
        full_env = None
        if env:
            full_env = dict(os.environ)
            full_env.update(env)
        f = open(out_path, "w") if out_path else None
        try:
            p = subprocess.Popen(argv, stdout=f or subprocess.PIPE,
                                 stderr=subprocess.STDOUT if f else subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 env=full_env, cwd=cwd, text=True)
            self.children.add(p)
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_group(p)
                p.communicate()
                raise CmdError("timed out after %ss: %s" % (timeout, " ".join(argv))) from None
            except BaseException:
                kill_group(p)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
                raise
            finally:
                self.children.discard(p)
        finally:
            if f:
                f.close()
        if out_path:
            with open(out_path, errors="replace") as fh:
                out, err = fh.read(), ""
        if check and p.returncode != 0:
            tail = ((out or "") + (err or ""))[-2000:]
            raise CmdError("exit %d: %s\n%s" % (p.returncode, " ".join(argv), tail))
        return p.returncode, out or "", err or ""

    def pipe_to_file(self, cmd: Sequence[str], out: IO[bytes], timeout: float) -> None:
        """Run `cmd` with stdout into `out` (binary; e.g. a decompressor),
        killed with its group if anything goes wrong."""
        p = subprocess.Popen(list(cmd), stdout=out, start_new_session=True)
        self.children.add(p)
        try:
            if p.wait(timeout=timeout) != 0:
                raise CmdError("%s failed" % cmd[0])
        except BaseException:
            kill_group(p)
            raise
        finally:
            self.children.discard(p)
