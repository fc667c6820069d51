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

import copy
from typing import TYPE_CHECKING, Optional

from harness import host, parsers
from harness.procs import CmdError
from harness.setups.base import Mounted, SubvolumeCommands
from harness.setups.fuse import DaemonMount, FuseSetup

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
# The same commands and options as btrfs-progs' (docs/SNAPSHOTS.md (g)),
# sent to the mounted daemon through its ioctl.
SUBVOLUMES = SubvolumeCommands(
    create=["{birch}", "subvolume", "create", "{path}"],
    snapshot=["{birch}", "subvolume", "snapshot", "{src}", "{dst}"],
    delete=["{birch}", "subvolume", "delete", "-c", "{path}"],
    sync=["{birch}", "subvolume", "sync", "{mnt}"],
    snapshot_ro=["{birch}", "subvolume", "snapshot", "-r", "{src}", "{dst}"],
    send=["{birch}", "send", "-f", "{out}", "{snap}"],
    send_incremental=["{birch}", "send", "-p", "{parent}", "-f", "{out}", "{snap}"],
    receive=["{birch}", "receive", "-f", "{stream}", "{dir}"])


class BirchSetup(FuseSetup):
    def __init__(self, name: str, uses_loop: bool, metadata: str, ablate: Optional[str] = None) -> None:
        mount_bg = MOUNT_BG + (["-o", "ablate=" + ablate] if ablate else [])
        super().__init__(name, mkfs=["{birch}", "mkfs", "{target}", "--metadata", metadata],
                         tools=["fusermount3"], uses_loop=uses_loop, mount_bg=mount_bg, umount=UMOUNT,
                         subvolumes=None if ablate else SUBVOLUMES)
        self.metadata = metadata
        self.ablate = ablate

    def describe(self) -> dict:
        return dict(super().describe(), sync=SYNC, metadata=self.metadata, ablate=self.ablate)

    def with_mount_option(self, option: str) -> "BirchSetup":
        other = copy.copy(self)
        other.mount_bg = self.mount_bg + ["-o", option]
        return other

    def open(self, ctx: RunContext, size: int, tag: str) -> Mounted:
        return FuseMount(self, ctx, size, tag)


class FuseMount(DaemonMount):
    """A `birch mount -f` daemon, which counts its own requests."""

    setup: BirchSetup

    def sync(self, path: Optional[str] = None, quiet: bool = True, timeout: float = 1800) -> None:
        if host.fstype_of(self.mnt).startswith("fuseblk"):
            super().sync(path, quiet=quiet, timeout=timeout)
        else:
            self.ctx.run(self._argv(SYNC, path), quiet=quiet, timeout=timeout)

    def counters(self) -> Optional[dict]:
        """birch's counters now (`birch stats --json`), by name; None if
        birch cannot say."""
        try:
            _, out, _ = self.ctx.run([self.ctx.opts.birch_bin, "stats", "--json", self.mnt],
                                     quiet=True, timeout=60)
        except CmdError:
            return None
        return parsers.parse_birch_counters(out)

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
# `birch` with one seed's mechanism switched off (`-o ablate=ID`,
# docs/ABLATION.md): the "before" side of `bench/run --ablation`. Never in a
# default run.
SEED_IDS = ("000", "001", "002", "003", "004")
BIRCH_ABLATED = {seed: BirchSetup("birch-ablate-" + seed, uses_loop=True, metadata="dup", ablate=seed)
                 for seed in SEED_IDS}
