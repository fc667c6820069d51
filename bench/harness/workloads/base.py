"""The workload interface: what the runner needs from every benchmark.

A workload names its measurements (a configuration on a target, e.g. "4
clients on xfs") in the order they run within one repetition; the runner
repeats that list, records each measurement's metrics or error, and checks
at the end that every planned measurement produced its key metric.  The
order (workload → repetition → configuration → filesystem) interleaves the
filesystems, so numbers that are compared were taken minutes apart under the
same machine load.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Optional

if TYPE_CHECKING:
    from harness.context import RunContext


@dataclass(frozen=True)
class Measurement:
    """One configuration of a workload on one target, measured once per
    repetition: `run(rep, record)` returns the metrics (and may add raw
    file names to record["raw"]); raising records the error instead.
    `key_metric`: the metric it must produce, when its configurations
    measure different things (None: the workload's)."""

    config: str
    target: str
    run: Callable[[int, dict], dict]
    key_metric: Optional[str] = None


class Workload(ABC):
    """One benchmark; an instance lives for one run (so whatever it
    prepares, a tarball or a loadfile, is its own state, not a global)."""

    name: ClassVar[str]
    # The metric a measurement must produce to count as done.
    key_metric: ClassVar[str]
    # External tools it needs, installed when missing.
    tools: ClassVar[tuple[str, ...]] = ()

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def prepare(self) -> None:
        """Once before the first measurement (find inputs, build things)."""

    def not_run_reason(self) -> Optional[str]:
        """Why this workload cannot run at all in this run (None: it can);
        the report then says so instead of failing."""
        return None

    @abstractmethod
    def measurements(self) -> list[Measurement]:
        """One repetition's measurements, in the order they run."""
