"""fio: the cost of one durable 4 KiB write (write + fsync), against the
device's own write + flush.

`fio --rw=write --bs=4k --ioengine=sync --fsync=1` on a new file (buffered)
on each filesystem.  The floors are the same job with `--direct=1` on a bare
direct-io loop device (`raw-loop`: write + flush through the same loop
driver the filesystems use) and on a plain file of the host filesystem
(`host-file`), so the report can say how many device round trips an fsync
costs on each filesystem.  The job's runner (`run_fsync_job`) also serves
the `compress` workload, on a filesystem mounted with compression.
"""

from __future__ import annotations

import os
from functools import partial
from typing import TYPE_CHECKING, Sequence

from harness import parsers
from harness.host import GiB
from harness.setups import SETUPS
from harness.setups.raw import RawLoop
from harness.workloads.base import Measurement, Workload

if TYPE_CHECKING:
    from harness.context import RunContext
    from harness.options import Options

CONFIG = "4k-write-fsync"
RAW_LOOP, HOST_FILE = "raw-loop", "host-file"
FLOORS = [RAW_LOOP, HOST_FILE]


def fsync_job_cmd(opts: Options, filename: str, direct: bool, size: str, out_json: str,
                  extra: Sequence[str] = ()) -> list[str]:
    """The 4 KiB write + fsync job (`--rw=` the run's `--fio-rw`), for
    `--runtime` the run's duration; `extra`: more fio options (the
    `compress` workload's compressible buffers)."""
    return ["fio", "--name=fsync4k", "--filename=" + filename,
            "--rw=" + opts.fio_rw, "--bs=4k", "--ioengine=sync", "--fsync=1",
            "--direct=%d" % direct, "--size=%s" % size, "--runtime=%d" % opts.duration,
            "--fallocate=none", "--lat_percentiles=1", "--percentile_list=50:90:99:99.9",
            *extra, "--output-format=json", "--output=" + out_json]


def run_fsync_job(ctx: RunContext, filename: str, direct: bool, size: str, raw_json: str, rec: dict,
                  extra: Sequence[str] = ()) -> dict:
    """Run the job on `filename`, its JSON into `raw_json` (and fio's other
    output beside it, both recorded in rec["raw"]); returns parse_fio's
    metrics."""
    log = raw_json[: -len(".json")] + ".log"
    rec["raw"] += [ctx.rel(raw_json), ctx.rel(log)]
    ctx.run(fsync_job_cmd(ctx.opts, filename, direct, size, raw_json, extra), out_path=log,
            timeout=ctx.opts.duration * 2 + 600)
    with open(raw_json, errors="replace") as f:
        return parsers.parse_fio(f.read())


class Fio(Workload):
    name = "fio"
    key_metric = "fsync_p50_us"
    tools = ("fio",)

    def measurements(self) -> list[Measurement]:
        return [Measurement(CONFIG, t, partial(self.run_one, t)) for t in FLOORS + self.ctx.opts.fs_list]

    def run_one(self, target: str, rep: int, rec: dict) -> dict:
        ctx = self.ctx
        raw_json = ctx.raw_path("fio", "%s-r%d.json" % (target, rep))
        if target == RAW_LOOP:
            with RawLoop(ctx, 2 * GiB) as lo:
                return run_fsync_job(ctx, lo.dev, True, "1g", raw_json, rec)
        if target == HOST_FILE:
            path = ctx.image_path("host-floor.dat")
            if os.path.exists(path):
                os.unlink(path)
            try:
                return run_fsync_job(ctx, path, True, "1g", raw_json, rec)
            finally:
                if os.path.exists(path):
                    os.unlink(path)
        with SETUPS[target].open(ctx, ctx.opts.main_size, "main") as m:
            return run_fsync_job(ctx, os.path.join(m.mnt, "fio.dat"), False, "2g", raw_json, rec)
