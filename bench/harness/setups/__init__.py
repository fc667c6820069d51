"""Filesystem setups by name (the names `--fs` takes and the report's
columns), in the order the report shows them."""

from harness.setups.base import Setup
from harness.setups.birch import BIRCH, BIRCH_ABLATED, BIRCH_FILE, BIRCH_SINGLE
from harness.setups.btrfs import BTRFS
from harness.setups.ext4 import EXT4
from harness.setups.fuse2fs import FUSE2FS
from harness.setups.xfs import XFS

SETUPS: dict[str, Setup] = {s.name: s for s in (BTRFS, EXT4, XFS, BIRCH, BIRCH_FILE, BIRCH_SINGLE, FUSE2FS,
                                                *BIRCH_ABLATED.values())}
# Run when --fs is not given.
DEFAULT_SETUPS = [s.name for s in (BTRFS, EXT4, XFS)]
# Added to the default list by --birch-bin; they need the birch binary.
BIRCH_SETUPS = [s.name for s in (BIRCH, BIRCH_FILE, BIRCH_SINGLE)]
# Also added by --birch-bin: a peer FUSE filesystem, so that every report
# with birch in it shows birch against another FUSE filesystem too.
PEER_FUSE_SETUPS = [FUSE2FS.name]
# Skipped (with the reason in the report) rather than failing the run when
# their tools cannot be installed: they are comparisons, not the subject.
OPTIONAL_SETUPS = [FUSE2FS.name]
# birch with one seed's mechanism switched off: `bench/run --ablation` only.
ABLATED_SETUPS = [s.name for s in BIRCH_ABLATED.values()]
