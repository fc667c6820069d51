"""The filesystem-setup interface: how every measurement gets a fresh
filesystem, and how it is undone.

Every measurement gets a fresh sparse image file, (for most setups) a fresh
direct-io loop device over it, a fresh mkfs and a fresh mount: no
measurement inherits another's fragmentation, caches or logs.  What differs
between filesystems (mkfs and mount commands, how to make data durable, how a
FUSE daemon is started and stopped) is a `Setup`; the lifecycle common to all
of them is `Mounted`.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from harness import host
from harness.procs import CmdError

if TYPE_CHECKING:
    from harness.context import RunContext


def fresh_sparse_file(path: str, size: int) -> None:
    """A new sparse file of `size` bytes (any old one is replaced)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)
    with open(path, "wb") as f:
        f.truncate(size)


@dataclass(frozen=True)
class SubvolumeCommands:
    """A filesystem's subvolume commands, as argv templates ({birch} the
    birch binary; {path}, {src}, {dst} paths on the mount; {mnt} the mount
    point).  `delete` commits after the deletion, so that its cleaner
    starts at once instead of at the next periodic commit; `sync` waits
    until every deleted subvolume's space is freed."""

    create: list[str]
    snapshot: list[str]
    delete: list[str]
    sync: list[str]
    # Send and receive (issue 26; the `send` workload): a read-only
    # snapshot, a full and an incremental stream of one into {out}, and a
    # stream {stream} received under {dir}.
    snapshot_ro: list[str]
    send: list[str]
    send_incremental: list[str]
    receive: list[str]


class Setup(ABC):
    """One filesystem configuration under test (a column of the report).

    `mkfs` is an argv template: {target} is the loop device (uses_loop) or
    the image file itself; {birch} the birch binary.  `subvolumes`: its
    subvolume and snapshot commands (None: it has none).
    """

    kind = ""              # "kernel" or "fuse", recorded in results.json

    def __init__(self, name: str, fstype: str, mkfs: list[str], tools: list[str],
                 uses_loop: bool = True, subvolumes: Optional[SubvolumeCommands] = None) -> None:
        self.name = name
        self.fstype = fstype
        self.mkfs = mkfs
        self.tools = tools
        self.uses_loop = uses_loop
        self.subvolumes = subvolumes

    def format_argv(self, ctx: RunContext, argv: list[str], **fields: str) -> list[str]:
        return [a.format(birch=ctx.opts.birch_bin or "birch", **fields) for a in argv]

    def describe(self) -> dict:
        """What results.json records of this setup (meta.fs_table), so a
        report can say what each column was."""
        d = {"kind": self.kind, "fstype": self.fstype,
             "device": "loop" if self.uses_loop else "file",
             "mkfs": list(self.mkfs), "tools": list(self.tools)}
        if self.subvolumes is not None:
            d["subvolumes"] = dict(vars(self.subvolumes))
        return d

    def with_mount_option(self, option: str) -> "Setup":
        """This setup with one more mount option (`compress=zstd`); the
        column keeps its name. Setups that take no options refuse."""
        raise CmdError("%s takes no extra mount options" % self.name)

    @abstractmethod
    def open(self, ctx: RunContext, size: int, tag: str) -> "Mounted":
        """A fresh filesystem of `size` bytes, set up on `with`."""


class Mounted(ABC):
    """One freshly created image + (loop device) + mkfs + mount, as a
    context manager.  Everything is undone by teardown(), which is
    idempotent; the run context tracks it so that a signal or an exception
    anywhere still undoes it."""

    def __init__(self, setup: Setup, ctx: RunContext, size: int, tag: str) -> None:
        self.setup, self.ctx, self.size, self.tag = setup, ctx, size, tag
        self.name = setup.name
        self.image = ctx.image_path("%s-%s.img" % (self.name, tag))
        self.mnt = os.path.join(ctx.workdir, "mnt", "%s-%s" % (self.name, tag))
        self.dev: Optional[str] = None
        # How FUSE requests reach birch, as its stats say (None: kernel fs).
        self.transport: Optional[str] = None
        self.torn_down = False

    @property
    def target(self) -> str:
        """What mkfs and mount are given: the loop device or the image."""
        return self.dev if self.setup.uses_loop and self.dev else self.image

    def __enter__(self) -> "Mounted":
        self.ctx.track(self)
        try:
            self._create()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def _create(self) -> None:
        os.makedirs(self.mnt, exist_ok=True)
        if host.is_mounted(self.mnt):
            raise CmdError("%s is already mounted" % self.mnt)
        fresh_sparse_file(self.image, self.size)
        if self.setup.uses_loop:
            self.dev = host.attach_loop(self.ctx.procs, self.image)
            self.ctx.note_dio(self.name, host.loop_dio(self.dev))
        self.ctx.run(self.setup.format_argv(self.ctx, self.setup.mkfs, target=self.target),
                     out_path=self.log_path(".txt"), timeout=600)
        self._mount()
        # measure everything from a clean, settled state
        self.sync()

    def log_path(self, suffix: str) -> str:
        """raw/mkfs/NAME-TAGSUFFIX: mkfs output and FUSE daemon logs."""
        d = os.path.join(self.ctx.raw_dir, "mkfs")
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, "%s-%s%s" % (self.name, self.tag, suffix))

    @abstractmethod
    def _mount(self) -> None:
        """Mount self.target on self.mnt."""

    @abstractmethod
    def _unmount(self) -> bool:
        """Unmount (for FUSE: until the daemon has exited); True if gone."""

    def sync(self, path: Optional[str] = None, quiet: bool = True, timeout: float = 1800) -> None:
        """Make everything under the mount durable, the way its filesystem
        needs: syncfs unless a setup knows better."""
        host.syncfs(self.ctx.procs, path or self.mnt, quiet=quiet, timeout=timeout)

    def counters(self) -> Optional[dict]:
        """The filesystem's own counters now, by name (birch's `birch
        stats`); None where it keeps none (kernel filesystems)."""
        return None

    def fuse_requests(self) -> Optional[dict]:
        """The FUSE requests the mount received so far, by opcode; None
        where the filesystem does not count them (kernel filesystems)."""
        return None

    def requests_since(self, before: Optional[dict]) -> Optional[dict]:
        """The requests received since `before` (a fuse_requests() result),
        without zeros; None for kernel filesystems."""
        after = self.fuse_requests()
        if before is None or after is None:
            return None
        delta = {k: n - before.get(k, 0) for k, n in after.items()}
        return {k: n for k, n in delta.items() if n > 0}

    def subvolume(self, command: str, out_path: Optional[str] = None, **paths: str) -> float:
        """Run the setup's subvolume command `command` (a field of
        SubvolumeCommands: "create", "snapshot", "send", …) with the given
        paths and return its wall time in seconds; with `out_path`, its
        output goes there."""
        if self.setup.subvolumes is None:
            raise CmdError("%s has no subvolumes" % self.name)
        template = getattr(self.setup.subvolumes, command)
        argv = self.setup.format_argv(self.ctx, template, mnt=self.mnt, **paths)
        t0 = time.perf_counter()
        self.ctx.run(argv, timeout=3600, out_path=out_path)
        return time.perf_counter() - t0

    def remount(self) -> None:
        """Unmount and mount the same filesystem again (a FUSE daemon
        restarts): a read afterwards finds no cache of the filesystem's."""
        if not self._unmount():
            raise CmdError("could not unmount %s to remount it" % self.mnt)
        self._mount()

    def unmount_timed(self) -> float:
        """Unmount now and return the seconds it took; teardown() then only
        detaches and deletes."""
        t0 = time.perf_counter()
        self._unmount()
        return time.perf_counter() - t0

    def teardown(self) -> None:
        if self.torn_down:
            return
        ok = self._unmount()
        if self.dev:
            if host.detach_loop(self.ctx.procs, self.dev):
                self.dev = None
            else:
                ok = False
        if ok:
            try:
                if os.path.exists(self.image):
                    os.unlink(self.image)
                os.rmdir(self.mnt)
            except OSError:
                pass
        else:
            self.ctx.cleanup_failures.append("%s-%s" % (self.name, self.tag))
        self.torn_down = True
        self.ctx.untrack(self)
