"""Kernel btrfs, the baseline every ratio in the report is taken against."""

from harness.setups.base import SubvolumeCommands
from harness.setups.kernel import KernelSetup

# Single data and metadata and `-o ssd`, as the seeds measured it: the seeds'
# numbers are what birch is compared with.
BTRFS = KernelSetup("btrfs", ["mkfs.btrfs", "-f", "-m", "single", "-d", "single", "{target}"],
                    tool="mkfs.btrfs", mount_opts="ssd",
                    subvolumes=SubvolumeCommands(
                        create=["btrfs", "subvolume", "create", "{path}"],
                        snapshot=["btrfs", "subvolume", "snapshot", "{src}", "{dst}"],
                        delete=["btrfs", "subvolume", "delete", "-c", "{path}"],
                        sync=["btrfs", "subvolume", "sync", "{mnt}"]))
