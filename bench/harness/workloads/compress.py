"""Transparent compression (issue 25): birch's `-o compress=` against kernel
btrfs's, in the same run, on the same disk.

Three codecs per filesystem, each measured on a fresh filesystem:
- `none`: no mount option (the baseline of the space saved);
- `zstd`: `-o compress=zstd` on both (level 3 on both);
- `fast`: the fast codec each has, `-o compress=lz4` on birch and
  `-o compress=lzo` on btrfs (btrfs has no lz4; lzo is its fast one).

Per measurement: the untar workload's tree (linux-source-6.1; in quick mode
the small tree) untarred into the filesystem and synced (timed together,
from a page-cache-warm tarball); the space it took (`df`'s used before and
after, and `du -s` of the tree: birch's `du` counts the compressed blocks,
btrfs's the uncompressed size, so `df` is what compares); then the
filesystem is unmounted and mounted again (cold caches on both: birch's
daemon restarts, btrfs drops its inodes; then drop_caches) and every file
of the tree is read back (timed).

Issue 25's two other benchmarks, each on a fresh filesystem without
compression (`none`, the default of both: `compress=no`) and with
`compress=zstd`:
- `fio-none`, `fio-zstd`: the `fio` workload's 4 KiB write + fsync job
  (its runner), on data fio makes compressible to about half
  (`--buffer_compress_percentage=50`): the log path must not get slower
  with compression on. fsync p50/p99 as in the `fio` workload.
- `incompressible-none`, `incompressible-zstd`: 1 GiB (quick: 128 MiB) of
  random data written to one file in 1 MiB writes, fsynced and the
  filesystem synced, timed together; the space it took (`df`, `du`). The
  heuristic (a chunk that does not shrink stops compression of the file)
  must keep `zstd` within 5 % of `none`. lsattr's flags of the file show
  whether the filesystem marked it `m` (NOCOMPRESS).
On birch both record the compression counters of `birch stats`
(compressed bytes in and out, chunks tried that did not shrink).
"""

from __future__ import annotations

import os
import re
import time
from functools import partial
from typing import TYPE_CHECKING, Optional

from harness import host
from harness.host import GiB, MiB
from harness.procs import CmdError
from harness.setups import SETUPS
from harness.setups.base import Mounted, Setup
from harness.workloads.base import Measurement, Workload
from harness.workloads.fio import run_fsync_job
from harness.workloads.untar import Untar, warm

if TYPE_CHECKING:
    from harness.context import RunContext

TARGETS = ("btrfs", "birch")
# Codec configurations, in the order they run: (config, mount option per
# filesystem; None: no option).
CODECS = (("none", {"btrfs": None, "birch": None}),
          ("zstd", {"btrfs": "compress=zstd", "birch": "compress=zstd"}),
          ("fast", {"btrfs": "compress=lzo", "birch": "compress=lz4"}))
CODEC_NAMES = [c for c, _ in CODECS]
# The codecs of the fio and incompressible-write configurations: off and
# zstd (the claims are about compression on against off).
ON_OFF = ("none", "zstd")
FIO, INCOMPRESSIBLE = "fio", "incompressible"
# fio's data: compressible to about half, so that compression has
# something to do (fio's default buffers are random).
FIO_COMPRESSIBLE = ("--buffer_compress_percentage=50",)
# birch's counters of compression (`birch stats`), recorded as deltas.
COUNTERS = ("compressed_bytes_in", "compressed_bytes_out", "compress_attempts_failed", "data_bytes_written")
# Random bytes the incompressible file is written from, cycled: each
# 128 KiB chunk a filesystem compresses is random whatever the cycle.
RANDOM_POOL = 16 * MiB
WRITE_SIZE = MiB


def compress_option(config: str, fs: str):
    """The mount option of codec configuration `config` on `fs` (None: none)."""
    return dict(CODECS)[config][fs]


def read_tree(root: str) -> tuple[int, int]:
    """Read every regular file under `root` through (1 MiB reads); returns
    (files, bytes) read."""
    files = nbytes = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            p = os.path.join(dirpath, fn)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            with open(p, "rb", buffering=0) as f:
                while True:
                    chunk = f.read(MiB)
                    if not chunk:
                        break
                    nbytes += len(chunk)
            files += 1
    return files, nbytes


def write_from_pool(path: str, nbytes: int, pool: bytes) -> None:
    """Write `nbytes` to a new file at `path` in WRITE_SIZE writes taken
    from `pool` in turn (its length a multiple of WRITE_SIZE), then fsync."""
    view = memoryview(pool)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        while done < nbytes:
            start = done % len(pool)
            done += os.write(fd, view[start:start + min(WRITE_SIZE, nbytes - done)])
        os.fsync(fd)
    finally:
        os.close(fd)


def lsattr_flags(out: str) -> str:
    """The flags column of `lsattr FILE`'s output ("--------------m------ f")."""
    parts = out.split()
    if len(parts) < 2 or not re.fullmatch(r"[-A-Za-z]+", parts[0]):
        raise CmdError("unexpected lsattr output: %r" % out[:200])
    return parts[0]


def used_bytes(mnt: str) -> int:
    """What `df` shows used on the filesystem mounted at `mnt`."""
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def du_bytes(out: str) -> int:
    """The byte count of `du -s -B1 PATH`'s output."""
    try:
        return int(out.split()[0])
    except (IndexError, ValueError):
        raise CmdError("unexpected du output: %r" % out[:200])


class Compress(Workload):
    name = "compress"
    key_metric = "copy_s"
    tools = ("tar", "du", "fio", "lsattr")

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.untar = Untar(ctx)
        self.incompressible_bytes = 128 * MiB if ctx.opts.quick else GiB
        self.pool = b""
        self.reps_listed = 0

    def prepare(self) -> None:
        self.untar.prepare()
        self.pool = os.urandom(RANDOM_POOL)

    def targets(self) -> list[str]:
        return [f for f in self.ctx.opts.fs_list if f in TARGETS]

    def measurements(self) -> list[Measurement]:
        """The tree per codec, then fio, then the incompressible write, each
        with compression off and on, in turn first (every other list, so
        that neither always follows the same measurement); filesystems
        interleaved."""
        self.reps_listed += 1
        on_off = ON_OFF if self.reps_listed % 2 else ON_OFF[::-1]
        fss = self.targets()
        return ([Measurement(config, fs, partial(self.run_one, fs, config))
                 for config in CODEC_NAMES for fs in fss]
                + [Measurement("%s-%s" % (FIO, codec), fs, partial(self.run_fio, fs, codec),
                               key_metric="fsync_p50_us") for codec in on_off for fs in fss]
                + [Measurement("%s-%s" % (INCOMPRESSIBLE, codec), fs, partial(self.run_incompressible, fs, codec),
                               key_metric="write_sync_s") for codec in on_off for fs in fss])

    def fs_size(self) -> int:
        """Room for the tree uncompressed twice over and 1 GiB, at least the
        run's main size."""
        need = 2 * self.untar.stats["est_4k_bytes"] + GiB
        return max(self.ctx.opts.main_size, need)

    def setup_for(self, fs: str, config: str) -> Setup:
        option = compress_option(config, fs)
        base = SETUPS[fs]
        return base.with_mount_option(option) if option else base

    def run_one(self, fs: str, config: str, rep: int, rec: dict) -> dict:
        ctx = self.ctx
        raw = ctx.raw_path("compress", "%s-%s-r%d.txt" % (fs, config, rep))
        rec["raw"].append(ctx.rel(raw))
        res: dict = {"mount_option": compress_option(config, fs) or "",
                     "tree_files": self.untar.stats["files"], "tree_bytes": self.untar.stats["bytes"]}
        with self.setup_for(fs, config).open(ctx, self.fs_size(), "compress-" + config) as m:
            used0 = used_bytes(m.mnt)
            warm(self.untar.tarball)
            dest = os.path.join(m.mnt, "tree")
            os.mkdir(dest)
            t0 = time.perf_counter()
            ctx.run(["tar", "xf", self.untar.tarball, "-C", dest], out_path=raw, timeout=3600)
            m.sync(dest, quiet=False, timeout=3600)
            res["copy_s"] = time.perf_counter() - t0
            res["used_bytes"] = used_bytes(m.mnt) - used0
            _, out, _ = ctx.run(["du", "-s", "-B1", dest], quiet=True, timeout=600)
            res["du_bytes"] = du_bytes(out)
            m.remount()
            host.drop_caches(ctx.procs)
            t0 = time.perf_counter()
            files, nbytes = read_tree(dest)
            res["read_s"] = time.perf_counter() - t0
            if files != self.untar.stats["files"]:
                raise CmdError("read back %d files of %d" % (files, self.untar.stats["files"]))
            res["read_bytes"] = nbytes
        with open(raw, "a") as f:
            f.write("\n# %s %s: %r\n" % (fs, config, res))
        return res

    def counted(self, m: Mounted, before: Optional[dict], res: dict) -> dict:
        """`res` with birch's compression counters (COUNTERS) since
        `before`, a counters() result; nothing added where the filesystem
        keeps none."""
        after = m.counters()
        if before is not None and after is not None:
            res.update({k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS if k in after})
        return res

    def run_fio(self, fs: str, codec: str, rep: int, rec: dict) -> dict:
        """The fio workload's write + fsync job on compressible data, on a
        fresh filesystem with codec `codec`."""
        ctx = self.ctx
        config = "%s-%s" % (FIO, codec)
        raw_json = ctx.raw_path("compress", "%s-%s-r%d.json" % (fs, config, rep))
        with self.setup_for(fs, codec).open(ctx, ctx.opts.main_size, "compress-" + config) as m:
            before = m.counters()
            res = run_fsync_job(ctx, os.path.join(m.mnt, "fio.dat"), False, "2g", raw_json, rec,
                                extra=FIO_COMPRESSIBLE)
            res["mount_option"] = compress_option(codec, fs) or ""
            return self.counted(m, before, res)

    def run_incompressible(self, fs: str, codec: str, rep: int, rec: dict) -> dict:
        """Random data written to one file, fsynced and synced (timed), on
        a fresh filesystem with codec `codec`; space and flags after."""
        ctx = self.ctx
        config = "%s-%s" % (INCOMPRESSIBLE, codec)
        raw = ctx.raw_path("compress", "%s-%s-r%d.txt" % (fs, config, rep))
        rec["raw"].append(ctx.rel(raw))
        res: dict = {"mount_option": compress_option(codec, fs) or "", "file_bytes": self.incompressible_bytes}
        with self.setup_for(fs, codec).open(ctx, ctx.opts.main_size, "compress-" + config) as m:
            used0 = used_bytes(m.mnt)
            path = os.path.join(m.mnt, "random.bin")
            before = m.counters()
            t0 = time.perf_counter()
            write_from_pool(path, self.incompressible_bytes, self.pool)
            t1 = time.perf_counter()
            m.sync(quiet=False)
            t2 = time.perf_counter()
            res.update(write_fsync_s=t1 - t0, sync_s=t2 - t1, write_sync_s=t2 - t0,
                       used_bytes=used_bytes(m.mnt) - used0)
            _, out, _ = ctx.run(["du", "-s", "-B1", path], quiet=True, timeout=600)
            res["du_bytes"] = du_bytes(out)
            _, out, _ = ctx.run(["lsattr", path], quiet=True, timeout=60)
            res["flags"] = lsattr_flags(out)
            self.counted(m, before, res)
        with open(raw, "w") as f:
            f.write("# %s %s: %r\n" % (fs, config, res))
        return res
