"""Kernel xfs with its defaults."""

from harness.setups.kernel import KernelSetup

# -f only so that an old signature never stops mkfs.
XFS = KernelSetup("xfs", ["mkfs.xfs", "-f", "{target}"], tool="mkfs.xfs")
