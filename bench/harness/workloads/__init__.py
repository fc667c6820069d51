"""Workloads by name (the names `--workloads` takes), in the order they run.
`ablation` runs only when asked for (`--ablation`, or by name): it is birch
against itself with one seed's mechanism switched off (docs/ABLATION.md)."""

from harness.workloads.ablation import Ablation
from harness.workloads.base import Measurement, Workload
from harness.workloads.compress import Compress
from harness.workloads.dbench import Dbench
from harness.workloads.dirlog import Dirlog
from harness.workloads.embedded import Embedded
from harness.workloads.fio import Fio
from harness.workloads.send import Send
from harness.workloads.snapshots import Snapshots
from harness.workloads.untar import Untar

WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (Dbench, Dirlog, Untar, Fio, Embedded, Snapshots,
                                                              Send, Compress, Ablation)}
# The default list (every workload but `ablation`).
WORKLOAD_NAMES = [name for name in WORKLOADS if name != Ablation.name]

__all__ = ["Measurement", "Workload", "WORKLOADS", "WORKLOAD_NAMES"]
