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
                        sync=["btrfs", "subvolume", "sync", "{mnt}"],
                        snapshot_ro=["btrfs", "subvolume", "snapshot", "-r", "{src}", "{dst}"],
                        send=["btrfs", "send", "-f", "{out}", "{snap}"],
                        send_incremental=["btrfs", "send", "-p", "{parent}", "-f", "{out}", "{snap}"],
                        receive=["btrfs", "receive", "-f", "{stream}", "{dir}"]))
