"""Seed 003, directory logging: create, sync, rename in one directory, the
directory fsynced every 100 operations; each phase timed, and every
directory fsync individually.

Python (`os.open` with `dir_fd`, `os.fsync` on a directory fd) rather than
the seed's shell loop, which spends its time forking `mv` and `xfs_io`:
Python adds about 0.5 µs per operation, and the `tmpfs-floor` row (the same
code on tmpfs, where fsync is a no-op) keeps that overhead in the report.
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from typing import Callable

from harness import host
from harness.setups import SETUPS
from harness.workloads.base import Measurement, Workload

FLOOR = "tmpfs-floor"
FSYNC_EVERY = 100


def run_seed003(root: str, nfiles: int, every: int, sync: Callable[[str], object]) -> dict:
    """Seed 003's script without the shell: create `nfiles` empty files in
    one directory, fsync the directory every `every` creations, sync, then
    rename every file in place (same dir), fsync the directory every `every`
    renames.  `sync(path)` is the filesystem's sync.  Returns phase times
    and fsync statistics (the individual latencies under
    "_fsync_latencies_s", for the raw file only)."""
    d = os.path.join(root, "testdir")
    os.mkdir(d)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    pc = time.perf_counter
    fsync_lat: dict[str, list[float]] = {"create": [], "rename": []}
    try:
        t0 = pc()
        for i in range(1, nfiles + 1):
            fd = os.open("file_%d" % i, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dfd)
            os.close(fd)
            if i % every == 0:
                a = pc()
                os.fsync(dfd)
                fsync_lat["create"].append(pc() - a)
        t1 = pc()
        sync(d)
        t2 = pc()
        for i in range(1, nfiles + 1):
            os.rename("file_%d" % i, "file_%d.renamed" % i, src_dir_fd=dfd, dst_dir_fd=dfd)
            if i % every == 0:
                a = pc()
                os.fsync(dfd)
                fsync_lat["rename"].append(pc() - a)
        t3 = pc()
    finally:
        os.close(dfd)
    allf = fsync_lat["create"] + fsync_lat["rename"]
    return {
        "files": nfiles, "fsync_every": every,
        "create_s": t1 - t0, "sync_s": t2 - t1, "rename_s": t3 - t2, "total_s": t3 - t0,
        "create_fsync_s": sum(fsync_lat["create"]), "rename_fsync_s": sum(fsync_lat["rename"]),
        "fsyncs": len(allf),
        "fsync_mean_ms": 1000 * sum(allf) / len(allf) if allf else None,
        "fsync_max_ms": 1000 * max(allf) if allf else None,
        "_fsync_latencies_s": fsync_lat,
    }


class Dirlog(Workload):
    name = "dirlog"
    key_metric = "total_s"

    def measurements(self) -> list[Measurement]:
        return [Measurement("seed003", fs, partial(self.run_one, fs))
                for fs in [FLOOR] + self.ctx.opts.fs_list]

    def run_one(self, fs: str, rep: int, rec: dict) -> dict:
        ctx = self.ctx
        raw = ctx.raw_path("dirlog", "%s-r%d.json" % (fs, rep))
        rec["raw"].append(ctx.rel(raw))
        if fs == FLOOR:
            res = self._on_tmpfs()
        else:
            with SETUPS[fs].open(ctx, ctx.opts.main_size, "main") as m:
                before = m.fuse_requests()
                res = run_seed003(m.mnt, ctx.opts.dirlog_files, FSYNC_EVERY, m.sync)
                requests = m.requests_since(before)
            if requests:
                res["fuse_requests"] = requests
                res["fuse_transport"] = m.transport
        with open(raw, "w") as f:
            json.dump(res, f, indent=1)
        res.pop("_fsync_latencies_s")
        return res

    def _on_tmpfs(self) -> dict:
        """The same code on tmpfs (fsync is a no-op there): the harness's
        own Python overhead, i.e. the floor under every filesystem's number."""
        ctx = self.ctx
        base = os.path.join(ctx.workdir, "mnt", FLOOR)
        os.makedirs(base, exist_ok=True)
        ctx.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", base], timeout=60)
        try:
            return run_seed003(base, ctx.opts.dirlog_files, FSYNC_EVERY,
                               partial(host.syncfs, ctx.procs))
        finally:
            host.umount_path(ctx.procs, base, "tmpfs")
            os.rmdir(base)
