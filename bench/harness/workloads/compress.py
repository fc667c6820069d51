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
"""

from __future__ import annotations

import os
import time
from functools import partial
from typing import TYPE_CHECKING

from harness import host
from harness.host import GiB, MiB
from harness.procs import CmdError
from harness.setups import SETUPS
from harness.setups.base import Setup
from harness.workloads.base import Measurement, Workload
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


def du_bytes(out: str) -> int:
    """The byte count of `du -s -B1 PATH`'s output."""
    try:
        return int(out.split()[0])
    except (IndexError, ValueError):
        raise CmdError("unexpected du output: %r" % out[:200])


class Compress(Workload):
    name = "compress"
    key_metric = "copy_s"
    tools = ("tar", "du")

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.untar = Untar(ctx)

    def prepare(self) -> None:
        self.untar.prepare()

    def targets(self) -> list[str]:
        return [f for f in self.ctx.opts.fs_list if f in TARGETS]

    def measurements(self) -> list[Measurement]:
        return [Measurement(config, fs, partial(self.run_one, fs, config))
                for config in CODEC_NAMES for fs in self.targets()]

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
            st = os.statvfs(m.mnt)
            used0 = (st.f_blocks - st.f_bfree) * st.f_frsize
            warm(self.untar.tarball)
            dest = os.path.join(m.mnt, "tree")
            os.mkdir(dest)
            t0 = time.perf_counter()
            ctx.run(["tar", "xf", self.untar.tarball, "-C", dest], out_path=raw, timeout=3600)
            m.sync(dest, quiet=False, timeout=3600)
            res["copy_s"] = time.perf_counter() - t0
            st = os.statvfs(m.mnt)
            res["used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize - used0
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
