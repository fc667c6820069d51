"""Kernel ext4 with its defaults (so it keeps its lazy inode table
initialisation; on a loop device that is zeroed with cheap write-zeroes)."""

from harness.setups.kernel import KernelSetup

# -F only so that mke2fs never asks a question.
EXT4 = KernelSetup("ext4", ["mkfs.ext4", "-F", "{target}"], tool="mkfs.ext4")
