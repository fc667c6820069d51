"""Subvolumes and snapshots (issue 22): birch against kernel btrfs
(`btrfs subvolume snapshot`), in the same run, on the same disk.

Four questions, one configuration each (two for the comparisons):
- `snapshot-small`, `snapshot-large`: how long a snapshot of a subvolume
  holding 1,000 and 100,000 files takes (the command, which commits, as
  `btrfs subvolume snapshot` does).  It must not grow with the file count.
- `fio-0-snapshots`, `fio-snapshots`: fio 4 KiB random writes, each
  followed by fsync, into a file of a subvolume with no snapshot and with
  100 snapshots of it: the price of copy-on-write of shared tree nodes.
- `dbench-4`, `dbench-4-bgdelete`: dbench with 4 clients beside a
  100,000-file snapshot, left alone and being deleted in the background.
- `seed003-subvolume`, `seed003-snapshot`: seed 003's workload (the
  `dirlog` workload's code) in a fresh subvolume and in a snapshot of it.

Only btrfs and `birch` run it: `birch-file` and `birch-single` differ from
`birch` in the transport and the metadata copies, which the other
workloads measure.  Files are created empty with `mknod` (one FUSE request
after the lookup), 1,000 per directory: what a snapshot costs depends on
the tree, not on file data.
"""

from __future__ import annotations

import os
import stat
import statistics
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable

from harness import parsers
from harness.procs import CmdError
from harness.setups import SETUPS
from harness.setups.base import Mounted
from harness.workloads.base import Measurement, Workload
from harness.workloads.dbench import Dbench
from harness.workloads.dirlog import FSYNC_EVERY, run_seed003

if TYPE_CHECKING:
    from harness.context import RunContext

TARGETS = ("btrfs", "birch")
FILES_PER_DIR = 1000
# Snapshots timed per source tree: the first, and the steady state.
SNAPSHOTS_TIMED = 3
DBENCH_CLIENTS = 4


@dataclass(frozen=True)
class Sizes:
    small_files: int     # files in the subvolume of `snapshot-small`
    large_files: int     # files of `snapshot-large` and of the dbench snapshot
    fio_snapshots: int   # snapshots of the fio subvolume
    fio_file_mib: int    # size of the file fio writes into
    seed003_source_files: int   # files in the subvolume seed 003 runs in (or a snapshot of)


FULL = Sizes(small_files=1000, large_files=100_000, fio_snapshots=100, fio_file_mib=64,
             seed003_source_files=1000)
QUICK = Sizes(small_files=100, large_files=2000, fio_snapshots=10, fio_file_mib=8,
              seed003_source_files=100)


def fill(root: str, nfiles: int, per_dir: int = FILES_PER_DIR) -> float:
    """Create `nfiles` empty files under `root`, `per_dir` to a directory
    (d0000/f0 …); returns the seconds it took."""
    t0 = time.perf_counter()
    for d in range((nfiles + per_dir - 1) // per_dir):
        path = os.path.join(root, "d%04d" % d)
        os.mkdir(path)
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(min(per_dir, nfiles - d * per_dir)):
                os.mknod("f%d" % i, 0o644 | stat.S_IFREG, dir_fd=dfd)
        finally:
            os.close(dfd)
    return time.perf_counter() - t0


def timed_snapshots(m: Mounted, src: str, count: int) -> list[float]:
    """`count` snapshots of `src` (snap-1 …) next to it, one after the
    other; the seconds each command took."""
    return [m.subvolume("snapshot", src=src, dst=os.path.join(m.mnt, "snap-%d" % i))
            for i in range(1, count + 1)]


class Snapshots(Workload):
    name = "snapshots"
    key_metric = "snapshot_s"
    tools = ("fio", "dbench")

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.sizes = QUICK if ctx.opts.quick else FULL
        self.dbench = Dbench(ctx)

    def prepare(self) -> None:
        self.dbench.prepare()
        self.ctx.meta["snapshot_sizes"] = dict(vars(self.sizes))

    def targets(self) -> list[str]:
        return [f for f in self.ctx.opts.fs_list if f in TARGETS]

    def measurements(self) -> list[Measurement]:
        s = self.sizes
        configs: list[tuple[str, str, Callable[..., dict]]] = [
            ("snapshot-small", "snapshot_s", partial(self.snapshot_time, s.small_files)),
            ("snapshot-large", "snapshot_s", partial(self.snapshot_time, s.large_files)),
            ("fio-0-snapshots", "fsync_p50_us", partial(self.fio, 0)),
            ("fio-snapshots", "fsync_p50_us", partial(self.fio, s.fio_snapshots)),
            ("dbench-4", "throughput_mb_s", partial(self.dbench_beside_snapshot, False)),
            ("dbench-4-bgdelete", "throughput_mb_s", partial(self.dbench_beside_snapshot, True)),
            ("seed003-subvolume", "total_s", partial(self.seed003, False)),
            ("seed003-snapshot", "total_s", partial(self.seed003, True)),
        ]
        return [Measurement(cfg, fs, partial(run, fs, cfg), key)
                for cfg, key, run in configs for fs in self.targets()]

    def _mount(self, fs: str) -> Mounted:
        return SETUPS[fs].open(self.ctx, self.ctx.opts.main_size, "snap")

    def _subvolume_with_files(self, m: Mounted, name: str, nfiles: int) -> tuple[str, float]:
        """A new subvolume MNT/name holding `nfiles` files, synced; its
        path and the seconds the files took."""
        sv = os.path.join(m.mnt, name)
        m.subvolume("create", path=sv)
        fill_s = fill(sv, nfiles)
        m.sync()
        return sv, fill_s

    def snapshot_time(self, nfiles: int, fs: str, cfg: str, rep: int, rec: dict) -> dict:
        with self._mount(fs) as m:
            sv, fill_s = self._subvolume_with_files(m, "sv", nfiles)
            times = timed_snapshots(m, sv, SNAPSHOTS_TIMED)
        return {"files": nfiles, "fill_s": fill_s, "snapshot_s": statistics.median(times),
                "snapshot_first_s": times[0], "snapshot_max_s": max(times), "snapshots_s": times}

    def _fio_cmd(self, filename: str, out_json: str, layout_only: bool) -> list[str]:
        cmd = ["fio", "--name=randwrite4k", "--filename=" + filename, "--rw=randwrite", "--bs=4k",
               "--ioengine=sync", "--fsync=1", "--size=%dm" % self.sizes.fio_file_mib,
               "--fallocate=none", "--randrepeat=1"]
        if layout_only:
            return cmd + ["--create_only=1"]
        return cmd + ["--time_based=1", "--runtime=%d" % self.ctx.opts.duration,
                      "--lat_percentiles=1", "--percentile_list=50:90:99:99.9",
                      "--output-format=json", "--output=" + out_json]

    def fio(self, snapshots: int, fs: str, cfg: str, rep: int, rec: dict) -> dict:
        """fio's file is written out whole and synced before the snapshots,
        so that every block of it is shared with each of them."""
        ctx = self.ctx
        raw_json = ctx.raw_path("snapshots", "%s-%s-r%d.json" % (fs, cfg, rep))
        log = raw_json[: -len(".json")] + ".log"
        rec["raw"] += [ctx.rel(raw_json), ctx.rel(log)]
        with self._mount(fs) as m:
            sv = os.path.join(m.mnt, "sv")
            m.subvolume("create", path=sv)
            data = os.path.join(sv, "fio.dat")
            ctx.run(self._fio_cmd(data, raw_json, layout_only=True), out_path=log, timeout=600)
            m.sync()
            times = timed_snapshots(m, sv, snapshots)
            m.sync()
            ctx.run(self._fio_cmd(data, raw_json, layout_only=False), out_path=log,
                    timeout=ctx.opts.duration * 2 + 600)
        with open(raw_json, errors="replace") as f:
            res = parsers.parse_fio(f.read())
        res["snapshots"] = snapshots
        res["snapshots_total_s"] = sum(times)
        # The job's parameters, for a report that merges runs (--out reused).
        res["file_mib"] = self.sizes.fio_file_mib
        res["runtime_s"] = ctx.opts.duration
        return res

    def dbench_beside_snapshot(self, delete: bool, fs: str, cfg: str, rep: int, rec: dict) -> dict:
        """dbench beside a snapshot of `large_files` files that owns its
        tree alone: the snapshot's source is deleted (and its deletion
        waited for) first.  Deleting a snapshot whose source still exists
        only drops the references of its root's children, on btrfs and on
        birch alike: nothing to do in the background.  `subvolume sync`
        waits for the cleaner on btrfs but runs it on birch (to the end,
        transaction by transaction), and birch cannot list deleted
        subvolumes not yet dropped (btrfs's `subvolume list -d`), so the
        background deletion's own duration is not observed: what the
        cleaner still had to do after dbench is (`cleaner_after_s`), and
        the idle configuration deletes the snapshot after its dbench with
        nothing else running (`drop_alone_s`), which is the deletion's
        size."""
        ctx = self.ctx
        raw = ctx.raw_path("snapshots", "%s-%s-r%d.txt" % (fs, cfg, rep))
        rec["raw"].append(ctx.rel(raw))
        nfiles = self.sizes.large_files
        res: dict = {"files": nfiles, "duration_s": ctx.opts.duration}
        with self._mount(fs) as m:
            src, res["fill_s"] = self._subvolume_with_files(m, "src", nfiles)
            snap = os.path.join(m.mnt, "snap")
            m.subvolume("snapshot", src=src, dst=snap)
            m.subvolume("delete", path=src)
            m.subvolume("sync")
            m.sync()
            work = os.path.join(m.mnt, "dbench")
            os.mkdir(work)
            cmd = ["dbench", "-c", self.dbench.client_txt, "-D", work, "-t", str(ctx.opts.duration),
                   str(DBENCH_CLIENTS)]
            if delete:
                res["delete_s"] = m.subvolume("delete", path=snap)
            ctx.run(cmd, out_path=raw, timeout=ctx.opts.duration * 3 + 600)
            if delete:
                # What the cleaner still had to do once dbench ended.
                res["cleaner_after_s"] = m.subvolume("sync")
            else:
                # The same deletion with nothing else running: its size.
                res["drop_alone_s"] = m.subvolume("delete", path=snap) + m.subvolume("sync")
        with open(raw, errors="replace") as f:
            parsed = parsers.parse_dbench(f.read())
        if parsed["clients"] != DBENCH_CLIENTS:
            raise CmdError("dbench reported %s clients, expected %d" % (parsed["clients"], DBENCH_CLIENTS))
        res.update(parsed)
        return res

    def seed003(self, in_snapshot: bool, fs: str, cfg: str, rep: int, rec: dict) -> dict:
        """Seed 003's workload in a subvolume holding `seed003_source_files`
        files, or in a snapshot of such a subvolume (whose every tree node
        is shared with its source when the workload starts)."""
        ctx = self.ctx
        with self._mount(fs) as m:
            where, _ = self._subvolume_with_files(m, "sv", self.sizes.seed003_source_files)
            if in_snapshot:
                snap = os.path.join(m.mnt, "snap")
                m.subvolume("snapshot", src=where, dst=snap)
                where = snap
            res = run_seed003(where, ctx.opts.dirlog_files, FSYNC_EVERY, m.sync)
        res.pop("_fsync_latencies_s")
        res["source_files"] = self.sizes.seed003_source_files
        return res
