"""FUSE filesystems served by a daemon the harness starts in the foreground
(`birch mount -f`, `fuse2fs -f`): the lifecycle common to them.

The daemon runs in the background in its own session; the filesystem is
mounted once its mount point shows up in /proc/self/mountinfo, and
unmounted once the daemon has exited (a daemon may commit at unmount, so
the unmount time is part of what is measured).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from typing import IO, TYPE_CHECKING, Optional

from harness import host
from harness.procs import CmdError, kill_group
from harness.setups.base import Mounted, Setup, SubvolumeCommands

if TYPE_CHECKING:
    from harness.context import RunContext

MOUNT_TIMEOUT_S = 60


class FuseSetup(Setup):
    """A FUSE daemon: `mount_bg` starts it in the foreground (argv template
    with {target} and {mnt}), `umount` unmounts it."""

    kind = "fuse"

    def __init__(self, name: str, mkfs: list[str], tools: list[str], uses_loop: bool,
                 mount_bg: list[str], umount: list[str],
                 subvolumes: Optional[SubvolumeCommands] = None) -> None:
        super().__init__(name, fstype="fuse", mkfs=mkfs, tools=tools, uses_loop=uses_loop,
                         subvolumes=subvolumes)
        self.mount_bg = mount_bg
        self.umount = umount

    def describe(self) -> dict:
        return dict(super().describe(), mount_bg=self.mount_bg, umount=self.umount)


class DaemonMount(Mounted):
    """One FUSE daemon serving a fresh filesystem."""

    setup: FuseSetup

    def __init__(self, setup: FuseSetup, ctx: RunContext, size: int, tag: str) -> None:
        super().__init__(setup, ctx, size, tag)
        self.daemon: Optional[subprocess.Popen] = None
        self.daemon_log: Optional[IO[str]] = None

    def _argv(self, template: list[str], path: Optional[str] = None) -> list[str]:
        return self.setup.format_argv(self.ctx, template, target=self.target, mnt=self.mnt,
                                      path=path or self.mnt)

    def _mount(self) -> None:
        self.daemon_log = open(self.log_path("-mount.log"), "w")
        cmd = self._argv(self.setup.mount_bg)
        self.ctx.log("$ %s &" % " ".join(map(shlex.quote, cmd)))
        self.daemon = subprocess.Popen(cmd, stdout=self.daemon_log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + MOUNT_TIMEOUT_S
        while time.time() < deadline:
            if host.is_mounted(self.mnt):
                return
            if self.daemon.poll() is not None:
                raise CmdError("%s exited with %s before mounting (see %s)" % (
                    cmd[0], self.daemon.returncode, self.daemon_log.name))
            time.sleep(0.1)
        raise CmdError("%s did not mount %s within %d s" % (cmd[0], self.mnt, MOUNT_TIMEOUT_S))

    def _unmount(self) -> bool:
        ok = True
        if host.is_mounted(self.mnt):
            try:
                self.ctx.run(self._argv(self.setup.umount), timeout=300)
            except Exception as e:
                self.ctx.log("fuse unmount failed: %s" % e)
            ok = host.umount_path(self.ctx.procs, self.mnt, "fuse")
        if self.daemon is not None and self.daemon.poll() is None:
            try:
                self.daemon.wait(timeout=600)
            except subprocess.TimeoutExpired:
                self.ctx.log("%s still running after unmount: terminating" % self.name)
                self.daemon.terminate()
                try:
                    self.daemon.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    kill_group(self.daemon)
                    self.daemon.wait()
        if self.daemon_log and not self.daemon_log.closed:
            self.daemon_log.close()
        return ok
