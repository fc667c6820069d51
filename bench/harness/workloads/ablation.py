"""`bench/run --ablation`: each seed's own benchmark on birch with and
without that seed's mechanism (docs/ABLATION.md), alternated in one run.

The "with" side is the `birch` setup; the "without" side is
`birch-ablate-ID` (`birch mount -o ablate=ID`), the same binary with the
behaviour the seed removed restored.  Within a repetition each pair runs
back to back, and the order of the pair flips every repetition, so both
sides see the same machine load.  The benchmarks are the seeds' scripts
scaled to this machine:

- 000: dbench, 16 clients (the seed: 16, 300 s);
- 001: dbench, 8 clients (the seed: 8 and 16, 120 s);
- 002: dbench, 64 clients (the seed: 64, 300 s);
- 003: the create/rename script with the time birch spent logging inodes
  (`logging_nanos` of `birch stats`, the seed's bpftrace figure), and
  dbench -S with one client per CPU (the seed: `nproc`, 120 s);
- 004: untar onto a roomy and a nearly full filesystem (the seed: firefox's
  tree; here the untar workload's tarball).

dbench runs `--duration` seconds; the create/rename script `--dirlog-files`
files.  Each measurement records the birch counters that show the switch
took its path (docs/ABLATION.md, "A switch takes its path").
"""

from __future__ import annotations

import os
from functools import partial
from typing import TYPE_CHECKING, Optional

from harness import parsers
from harness.procs import CmdError
from harness.setups import SETUPS
from harness.setups.birch import BIRCH_ABLATED, SEED_IDS
from harness.workloads.base import Measurement, Workload
from harness.workloads.dbench import Dbench
from harness.workloads.dirlog import FSYNC_EVERY, run_seed003
from harness.workloads.untar import Untar

if TYPE_CHECKING:
    from harness.context import RunContext

WITH = "birch"
# Counters recorded around each run (deltas), per seed: the ones its switch
# moves (docs/ABLATION.md) and the context to read them by.
COUNTERS = ("fsyncs", "commits", "log_syncs", "logged_fsyncs", "delayed_item_flushes",
            "logging_nanos", "log_base_wait_nanos", "reclaim_requests", "reclaim_pages", "reclaim_commits")
def seed_configs(seed: str, cpus: int) -> list[tuple[str, str, Optional[tuple[int, bool]]]]:
    """(config, key metric, dbench (clients, sync dirs) or None) of one
    seed's benchmark, in the order they run."""
    return {
        "000": [("000-dbench-16", "throughput_mb_s", (16, False))],
        "001": [("001-dbench-8", "throughput_mb_s", (8, False))],
        "002": [("002-dbench-64", "throughput_mb_s", (64, False))],
        "003": [("003-dirlog", "logging_s", None), ("003-dbench-S", "throughput_mb_s", (cpus, True))],
        "004": [("004-untar-roomy", "total_s", None), ("004-untar-tight", "total_s", None)],
    }[seed]


class Ablation(Workload):
    name = "ablation"
    key_metric = "throughput_mb_s"
    tools = ("dbench", "tar")

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.dbench = Dbench(ctx)
        self.untar = Untar(ctx)
        self.reps_planned = 0
        self.cpus = os.cpu_count() or 1

    def seeds(self) -> list[str]:
        return list(self.ctx.opts.ablation_seeds or SEED_IDS)

    def prepare(self) -> None:
        self.dbench.prepare()
        if "004" in self.seeds():
            self.untar.prepare()
        self.ctx.meta["ablation_seeds"] = self.seeds()

    def measurements(self) -> list[Measurement]:
        """One repetition: each seed's configurations, each with the
        mechanism (`birch`) and without (`birch-ablate-ID`) back to back,
        the pair's order flipped every repetition."""
        self.reps_planned += 1
        out = []
        for seed in self.seeds():
            pair = [WITH, BIRCH_ABLATED[seed].name]
            if self.reps_planned % 2 == 0:
                pair.reverse()
            for cfg, key, dbench in seed_configs(seed, self.cpus):
                for fs in pair:
                    out.append(Measurement(cfg, fs, partial(self.run_one, fs, cfg, dbench), key_metric=key))
        return out

    def run_one(self, fs: str, cfg: str, dbench: Optional[tuple[int, bool]], rep: int, rec: dict) -> dict:
        if cfg.startswith("004-untar-"):
            return self.untar.run_one(fs, cfg[len("004-untar-"):], rep, rec, counter_names=COUNTERS)
        ctx = self.ctx
        with SETUPS[fs].open(ctx, ctx.opts.main_size, "main") as m:
            before = m.counters()
            if dbench is None:
                res = run_seed003(m.mnt, ctx.opts.dirlog_files, FSYNC_EVERY, m.sync)
                res.pop("_fsync_latencies_s")
            else:
                res = self._dbench(m.mnt, fs, cfg, dbench, rep, rec)
            after = m.counters()
        if before is not None and after is not None:
            res["counters"] = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS if k in after}
            if "logging_nanos" in res["counters"]:
                res["logging_s"] = res["counters"]["logging_nanos"] / 1e9
        if dbench is None and "logging_s" not in res:
            raise CmdError("birch stats gave no logging_nanos: cannot measure seed 003's figure")
        return res

    def _dbench(self, mnt: str, fs: str, cfg: str, dbench: tuple[int, bool], rep: int, rec: dict) -> dict:
        ctx = self.ctx
        clients, sync_dirs = dbench
        raw = ctx.raw_path("ablation", "%s-%s-r%d.txt" % (fs, cfg, rep))
        rec["raw"].append(ctx.rel(raw))
        cmd = ["dbench", "-c", self.dbench.client_txt, "-D", mnt, "-t", str(ctx.opts.duration)]
        if sync_dirs:
            cmd.append("-S")
        cmd.append(str(clients))
        ctx.run(cmd, out_path=raw, timeout=ctx.opts.duration * 3 + 600)
        with open(raw, errors="replace") as f:
            parsed = parsers.parse_dbench(f.read())
        if parsed["clients"] != clients or parsed["sync_dirs"] != sync_dirs:
            raise CmdError("dbench reported %s clients sync=%s, expected %s sync=%s" % (
                parsed["clients"], parsed["sync_dirs"], clients, sync_dirs))
        return parsed
