"""birch through FUSE: `birch mkfs`, then `birch mount -f` in the background.

Three setups, so one run shows both what FUSE-over-a-loop-device costs and
what DUP metadata costs (issue 13):
- `birch`: the image on a direct-io loop device like the kernel
  filesystems, metadata `dup` (birch's default: every tree node written
  twice, half the device apart);
- `birch-file`: the image file itself; as root `birch mount` attaches it to
  a loop device of its own (auto-clearing; direct I/O unless -o buffered);
- `birch-single`: as `birch`, but `--metadata single`, one copy of each
  node; `birch` against `birch-single` is the price of DUP.

The metadata mode is always passed to mkfs, so the report says what was
measured even if birch's default changes.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from typing import IO, TYPE_CHECKING, Optional

from harness import host, parsers
from harness.procs import CmdError, kill_group
from harness.setups.base import Mounted, Setup

if TYPE_CHECKING:
    from harness.context import RunContext

MOUNT_BG = ["{birch}", "mount", "-f", "{target}", "{mnt}"]
UMOUNT = ["fusermount3", "-u", "{mnt}"]
# The kernel forwards syncfs to a FUSE daemon only on fuseblk mounts, which
# is what birch mounts as root (on a block device, or on a loop device it
# attaches to an image file): there `sync -f` works as on the kernel
# filesystems. On a plain fuse mount, `birch sync` runs syncfs, then asks
# birch to commit through its ioctl.
SYNC = ["{birch}", "sync", "{path}"]
MOUNT_TIMEOUT_S = 60


class BirchSetup(Setup):
    kind = "fuse"

    def __init__(self, name: str, uses_loop: bool, metadata: str) -> None:
        super().__init__(name, fstype="fuse",
                         mkfs=["{birch}", "mkfs", "{target}", "--metadata", metadata],
                         tools=["fusermount3"], uses_loop=uses_loop)
        self.metadata = metadata

    def describe(self) -> dict:
        return dict(super().describe(), mount_bg=MOUNT_BG, umount=UMOUNT, sync=SYNC,
                    metadata=self.metadata)

    def open(self, ctx: RunContext, size: int, tag: str) -> Mounted:
        return FuseMount(self, ctx, size, tag)


class FuseMount(Mounted):
    """A `birch mount -f` daemon; mounted once its mount point shows up in
    /proc/self/mountinfo, unmounted once the daemon has exited (birch
    commits at unmount, so the unmount time is part of what is measured)."""

    setup: BirchSetup

    def __init__(self, setup: BirchSetup, ctx: RunContext, size: int, tag: str) -> None:
        super().__init__(setup, ctx, size, tag)
        self.daemon: Optional[subprocess.Popen] = None
        self.daemon_log: Optional[IO[str]] = None

    def _argv(self, template: list[str], path: Optional[str] = None) -> list[str]:
        return self.setup.format_argv(self.ctx, template, target=self.target, mnt=self.mnt,
                                      path=path or self.mnt)

    def _mount(self) -> None:
        self.daemon_log = open(self.log_path("-mount.log"), "w")
        cmd = self._argv(MOUNT_BG)
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
                self.ctx.run(self._argv(UMOUNT), timeout=300)
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

    def sync(self, path: Optional[str] = None, quiet: bool = True, timeout: float = 1800) -> None:
        if host.fstype_of(self.mnt).startswith("fuseblk"):
            super().sync(path, quiet=quiet, timeout=timeout)
        else:
            self.ctx.run(self._argv(SYNC, path), quiet=quiet, timeout=timeout)

    def fuse_requests(self) -> Optional[dict]:
        """birch's count of the FUSE requests this mount received so far,
        by opcode (`birch stats --json`); None if birch cannot say."""
        try:
            _, out, _ = self.ctx.run([self.ctx.opts.birch_bin, "stats", "--json", self.mnt],
                                     quiet=True, timeout=60)
        except CmdError:
            return None
        self.transport = parsers.parse_birch_transport(out)
        return parsers.parse_birch_requests(out)


BIRCH = BirchSetup("birch", uses_loop=True, metadata="dup")
BIRCH_FILE = BirchSetup("birch-file", uses_loop=False, metadata="dup")
BIRCH_SINGLE = BirchSetup("birch-single", uses_loop=True, metadata="single")
