"""Counting the FUSE requests the kernel sends one mount, by opcode, for a
daemon that does not count them itself (fuse2fs).

The kernel's fuse:fuse_request_send tracepoint fires once per request with
the connection (the mount's device number) and the opcode.  Each counter
gets a tracefs instance of its own (`instances/NAME`: its own ring buffer,
event switch and filter), so it neither sees other FUSE mounts on the
machine nor disturbs anyone using the global trace buffer (such as
shared/tools/fuse-request-mix).  A thread drains the instance's trace_pipe
while the workload runs, so a long run cannot overflow the ring buffer;
`counts()` drains what is left first, so a count taken right after a
workload includes all of its requests.  Events the ring buffer dropped
anyway are reported as "LOST".
"""

from __future__ import annotations

import errno
import os
import re
import threading
from collections import Counter
from typing import Optional

TRACEFS = "/sys/kernel/tracing"
EVENT = "events/fuse/fuse_request_send"
OPCODE = re.compile(rb"opcode \d+ \(FUSE_([A-Z_0-9]+)\)")
# Per CPU; only the thread's lag needs to fit.
BUFFER_KB = 16384


def tracefs_root() -> Optional[str]:
    """tracefs's mount point, mounting it if needed; None if the kernel
    has no fuse tracepoint."""
    if not os.path.isdir(os.path.join(TRACEFS, "events")):
        os.system("mount -t tracefs nodev %s 2>/dev/null" % TRACEFS)
    return TRACEFS if os.path.isdir(os.path.join(TRACEFS, EVENT)) else None


def connection_of(path: str) -> int:
    """The tracepoint's `connection` of the FUSE mount at `path`: the
    superblock's device number in the kernel's encoding (major << 20 | minor)."""
    dev = os.stat(path).st_dev
    return (os.major(dev) << 20) | os.minor(dev)


INSTANCE_PREFIX = "birch-bench-"


def instance_name(label: str) -> str:
    """The tracefs instance of one counter of this process."""
    return "%s%d-%s" % (INSTANCE_PREFIX, os.getpid(), label)


def sweep_instances() -> None:
    """Remove the instances an interrupted run left (their ring buffers
    hold kernel memory until removed)."""
    inst = os.path.join(TRACEFS, "instances")
    if not os.path.isdir(inst):
        return
    for name in os.listdir(inst):
        if name.startswith(INSTANCE_PREFIX):
            try:
                os.rmdir(os.path.join(inst, name))
            except OSError:
                pass


class RequestTrace:
    """The requests one FUSE mount receives from now on, by opcode name
    (as birch names them: GETATTR, WRITE, …), "total" included."""

    def __init__(self, name: str, mountpoint: str) -> None:
        root = tracefs_root()
        if root is None:
            raise OSError("no fuse:fuse_request_send tracepoint (tracefs or kernel too old)")
        self.dir = os.path.join(root, "instances", name)
        if os.path.isdir(self.dir):
            os.rmdir(self.dir)          # left by an interrupted run
        os.mkdir(self.dir)
        self.counts_so_far: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.pipe: Optional[int] = None
        try:
            self._write("buffer_size_kb", str(BUFFER_KB))
            self._write(EVENT + "/filter", "connection == %d" % connection_of(mountpoint))
            self._write(EVENT + "/enable", "1")
            self.pipe = os.open(os.path.join(self.dir, "trace_pipe"), os.O_RDONLY | os.O_NONBLOCK)
        except BaseException:
            self.close()
            raise
        self.partial = b""
        self.thread = threading.Thread(target=self._drain_until_closed, daemon=True)
        self.thread.start()

    def _write(self, rel: str, text: str) -> None:
        with open(os.path.join(self.dir, rel), "w") as f:
            f.write(text)

    def _drain(self) -> None:
        """Read and count everything the ring buffer holds now."""
        assert self.pipe is not None
        while True:
            try:
                chunk = os.read(self.pipe, 1 << 20)
            except OSError as e:
                if e.errno == errno.EAGAIN:
                    return
                raise
            if not chunk:
                return
            data = self.partial + chunk
            cut = data.rfind(b"\n") + 1
            self.partial = data[cut:]
            self.counts_so_far.update(m.decode() for m in OPCODE.findall(data, 0, cut))

    def _drain_until_closed(self) -> None:
        while not self.stopping.wait(0.05):
            with self.lock:
                if self.pipe is not None:
                    self._drain()

    def lost(self) -> int:
        """Events the ring buffer dropped (overrun) since it was created."""
        n = 0
        for cpu in os.listdir(os.path.join(self.dir, "per_cpu")):
            with open(os.path.join(self.dir, "per_cpu", cpu, "stats")) as f:
                n += sum(int(line.split()[1]) for line in f if line.startswith("overrun:"))
        return n

    def counts(self) -> dict:
        with self.lock:
            self._drain()
            res = dict(self.counts_so_far)
        res["total"] = sum(res.values())
        lost = self.lost()
        if lost:
            res["LOST"] = lost
        return res

    def close(self) -> None:
        """Stop tracing and remove the instance (idempotent)."""
        self.stopping.set()
        if getattr(self, "thread", None) is not None and self.thread is not threading.current_thread():
            self.thread.join()
        with self.lock:
            if self.pipe is not None:
                os.close(self.pipe)
                self.pipe = None
        if os.path.isdir(self.dir):
            try:
                self._write(EVENT + "/enable", "0")
            except OSError:
                pass
            os.rmdir(self.dir)
