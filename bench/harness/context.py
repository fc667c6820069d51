"""`RunContext`: all the state of one run, handed to every part explicitly.

One object instead of module globals, so that what a workload or a setup may
touch is visible in its signature, and so that cleanup finds every live mount
and loop device in one place (`active`) whatever raised or which signal came.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Optional, Protocol, Sequence

from harness.install import Installer
from harness.procs import Processes, RunLog

if TYPE_CHECKING:
    from harness.options import Options


class Resource(Protocol):
    """Something of the host's that a run created and must undo: a mount,
    a loop device.  `teardown` is idempotent and never raises on purpose."""

    name: str

    @property
    def image(self) -> Optional[str]: ...

    def teardown(self) -> None: ...


class RunContext:
    """Options, log, children, live resources and results of one run."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.log = RunLog()
        self.procs = Processes(self.log)
        self.installer = Installer(self.procs)
        self.workdir = opts.workdir
        self.out = ""
        self.raw_dir = ""
        # Records of this run, and those of workloads not re-run that an
        # earlier run left in the same results dir.
        self.records: list[dict] = []
        self.kept_records: list[dict] = []
        self.meta: dict = {}
        # Whether each target's loop device really did direct I/O.
        self.dio: dict[str, Optional[bool]] = {}
        self.active: list[Resource] = []
        self.cleanup_failures: list[str] = []

    # ---- results -----------------------------------------------------------

    def open_results_dir(self, out: str) -> None:
        self.out = out
        self.raw_dir = os.path.join(out, "raw")
        os.makedirs(self.raw_dir, exist_ok=True)
        self.log.attach(os.path.join(out, "run.log"))

    def save(self) -> None:
        """Rewrite results.json atomically, after every measurement, so an
        interrupted run still leaves a report-able file."""
        data = {"meta": self.meta, "records": self.kept_records + self.records}
        tmp = os.path.join(self.out, "results.json.tmp")
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(self.out, "results.json"))

    def rel(self, path: str) -> str:
        """A path as recorded in results.json: relative to the results dir."""
        return os.path.relpath(path, self.out)

    def raw_path(self, workload: str, name: str) -> str:
        d = os.path.join(self.raw_dir, workload)
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, name)

    def image_path(self, name: str) -> str:
        d = os.path.join(self.workdir, "img")
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, name)

    def note_dio(self, name: str, dio: Optional[bool]) -> None:
        if self.dio.get(name) is None:
            self.dio[name] = dio
            if dio is False:
                self.log("WARNING: loop device for %s is NOT using direct I/O" % name)

    def run(self, cmd: Sequence[object], **kw) -> tuple[int, str, str]:
        """`Processes.run` of this run's children (see there)."""
        return self.procs.run(cmd, **kw)

    # ---- live resources ----------------------------------------------------

    def track(self, res: Resource) -> None:
        self.active.append(res)

    def untrack(self, res: Resource) -> None:
        if res in self.active:
            self.active.remove(res)

    def images_in_use(self) -> set[str]:
        return {r.image for r in self.active if r.image}

    def teardown_all(self) -> None:
        """Kill the children, then undo what is still set up, newest first."""
        self.procs.kill_all()
        for r in list(reversed(self.active)):
            try:
                r.teardown()
            except BaseException as e:  # noqa: BLE001 - cleanup must go on
                self.log("cleanup of %s failed: %s" % (r.name, e))
