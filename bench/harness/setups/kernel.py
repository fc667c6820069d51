"""Kernel filesystems on a direct-io loop device: the common part of the
btrfs, ext4 and xfs setups (each has its own module for its options)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Optional

from harness import host
from harness.setups.base import Mounted, Setup, SubvolumeCommands

if TYPE_CHECKING:
    from harness.context import RunContext


class KernelSetup(Setup):
    """`mkfs` on a fresh loop device, then `mount -t FSTYPE [-o OPTS]`."""

    kind = "kernel"

    def __init__(self, name: str, mkfs: list[str], tool: str, mount_opts: Optional[str] = None,
                 subvolumes: Optional[SubvolumeCommands] = None) -> None:
        super().__init__(name, fstype=name, mkfs=mkfs, tools=[tool], subvolumes=subvolumes)
        self.mount_opts = mount_opts

    def describe(self) -> dict:
        return dict(super().describe(), mount_opts=self.mount_opts)

    def with_mount_option(self, option: str) -> Setup:
        other = copy.copy(self)
        other.mount_opts = ",".join(o for o in (self.mount_opts, option) if o)
        return other

    def open(self, ctx: RunContext, size: int, tag: str) -> Mounted:
        return KernelMount(self, ctx, size, tag)


class KernelMount(Mounted):
    setup: KernelSetup

    def _mount(self) -> None:
        cmd = ["mount", "-t", self.setup.fstype]
        if self.setup.mount_opts:
            cmd += ["-o", self.setup.mount_opts]
        self.ctx.run(cmd + [self.target, self.mnt], timeout=120)

    def _unmount(self) -> bool:
        return host.umount_path(self.ctx.procs, self.mnt, self.setup.fstype)
