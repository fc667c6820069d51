"""Workloads by name (the names `--workloads` takes), in the order they run."""

from harness.workloads.base import Measurement, Workload
from harness.workloads.dbench import Dbench
from harness.workloads.dirlog import Dirlog
from harness.workloads.embedded import Embedded
from harness.workloads.fio import Fio
from harness.workloads.snapshots import Snapshots
from harness.workloads.untar import Untar

WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (Dbench, Dirlog, Untar, Fio, Embedded, Snapshots)}
WORKLOAD_NAMES = list(WORKLOADS)

__all__ = ["Measurement", "Workload", "WORKLOADS", "WORKLOAD_NAMES"]
