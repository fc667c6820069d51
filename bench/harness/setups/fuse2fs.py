"""fuse2fs: an ext4 image served through FUSE by e2fsprogs' fuse2fs (Debian
package `fuse2fs`), the peer FUSE filesystem every report sets birch
against.

Same arrangement as the kernel filesystems and `birch`: a fresh image on a
direct-io loop device, `mkfs.ext4` with its defaults, then `fuse2fs -f
/dev/loopN MNT` in the background with fuse2fs's default options (libfuse 2,
/dev/fuse; a plain `fuse` mount, so the kernel does not forward syncfs to
it and the seeds' `sync -f` only writes back the kernel's dirty pages).
Unavailable tools skip the setup (runner.drop_unavailable_setups) rather
than fail the run: it is a comparison, not the subject.  fuse2fs does not count
its requests; the harness counts them with the kernel's
fuse:fuse_request_send tracepoint (harness/fusetrace.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from harness.fusetrace import RequestTrace, instance_name
from harness.setups.base import Mounted
from harness.setups.fuse import DaemonMount, FuseSetup

if TYPE_CHECKING:
    from harness.context import RunContext

# The transport fuse2fs (libfuse 2) always uses, named as birch names its own.
TRANSPORT = "/dev/fuse"


class Fuse2fsSetup(FuseSetup):
    def open(self, ctx: RunContext, size: int, tag: str) -> Mounted:
        return Fuse2fsMount(self, ctx, size, tag)


class Fuse2fsMount(DaemonMount):
    setup: Fuse2fsSetup

    def __init__(self, setup: Fuse2fsSetup, ctx: RunContext, size: int, tag: str) -> None:
        super().__init__(setup, ctx, size, tag)
        self.trace: Optional[RequestTrace] = None
        self.transport = TRANSPORT

    def _mount(self) -> None:
        super()._mount()
        try:
            self.trace = RequestTrace(instance_name("%s-%s" % (self.name, self.tag)), self.mnt)
        except OSError as e:
            self.ctx.log("fuse2fs requests not counted: %s" % e)

    def fuse_requests(self) -> Optional[dict]:
        return self.trace.counts() if self.trace else None

    def _unmount(self) -> bool:
        if self.trace:
            self.trace.close()
            self.trace = None
        return super()._unmount()


FUSE2FS = Fuse2fsSetup("fuse2fs", mkfs=["mkfs.ext4", "-F", "{target}"], tools=["fuse2fs", "mkfs.ext4"],
                       uses_loop=True, mount_bg=["fuse2fs", "-f", "{target}", "{mnt}"],
                       umount=["umount", "{mnt}"])
