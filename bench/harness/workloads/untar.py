"""Seed 004: untar onto a roomy and onto a nearly full filesystem.

`tar xf` then the filesystem's sync, timed together, from a page-cache-warm
tarball.  To make "nearly full" the same for every filesystem, a filler file
is written (and synced, untimed) first so that the filesystem is about
`--tight-fill` % used after the untar.  This is seed 004's scenario: delayed
allocation and space reservation under pressure.  The unmount is timed
separately, since a FUSE filesystem may only finish its work there.
"""

from __future__ import annotations

import glob
import json
import os
import tarfile
import time
from functools import partial
from typing import TYPE_CHECKING, Optional

from harness.host import MiB
from harness.procs import CmdError
from harness.setups import SETUPS
from harness.setups.base import Mounted
from harness.workloads.base import Measurement, Workload

if TYPE_CHECKING:
    from harness.context import RunContext

LINUX_SOURCE_PKG = "linux-source-6.1"
LINUX_SOURCE_TARBALL = "/usr/src/linux-source-6.1.tar.xz"
DECOMPRESSORS = ((".xz", ["xz", "-dc"]), (".gz", ["gzip", "-dc"]), (".zst", ["zstd", "-dc"]),
                 (".bz2", ["bzip2", "-dc"]))
SIZES = ("roomy", "tight")


def tar_stats(path: str) -> dict:
    """Files, directories and bytes of a tarball; `est_4k_bytes` is what it
    takes on a filesystem of 4 KiB blocks (to size the filler)."""
    n_files = n_dirs = n_other = 0
    nbytes = est = 0
    with tarfile.open(path, "r:") as t:
        for m in t:
            if m.isfile():
                n_files += 1
                nbytes += m.size
                est += (m.size + 4095) // 4096 * 4096
            elif m.isdir():
                n_dirs += 1
                est += 4096
            else:
                n_other += 1
    return {"files": n_files, "dirs": n_dirs, "other": n_other,
            "bytes": nbytes, "est_4k_bytes": est}


def build_quick_tar(dest: str, max_files: int = 3000, max_bytes: int = 48 * MiB) -> None:
    """A small real tree from what every Debian machine has: python3
    libraries and /usr/share/doc.  Deterministic for a given machine."""
    roots = ["/usr/lib/python3", "/usr/share/doc", "/usr/include", "/usr/share"]
    files = nbytes = 0
    tmp = dest + ".tmp"
    with tarfile.open(tmp, "w:", format=tarfile.GNU_FORMAT) as t:
        for root in roots:
            if not os.path.isdir(root):
                continue
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                if files >= max_files or nbytes >= max_bytes:
                    break
                t.add(dirpath, arcname="tree" + dirpath, recursive=False)
                for fn in sorted(filenames):
                    p = os.path.join(dirpath, fn)
                    try:
                        st = os.lstat(p)
                    except OSError:
                        continue
                    if not (os.path.islink(p) or (os.path.isfile(p) and st.st_size <= 4 * MiB)):
                        continue
                    try:
                        t.add(p, arcname="tree" + p, recursive=False)
                    except OSError:
                        continue
                    files += 1
                    nbytes += st.st_size if not os.path.islink(p) else 0
                    if files >= max_files or nbytes >= max_bytes:
                        break
    os.replace(tmp, dest)


def warm(path: str) -> None:
    """Read the tarball through so that every filesystem untars from the page
    cache and the host disk's read speed is not part of the measurement."""
    with open(path, "rb", buffering=0) as f:
        while f.read(8 * MiB):
            pass


class Untar(Workload):
    name = "untar"
    key_metric = "total_s"
    tools = ("tar",)

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.tarball = ""
        self.stats: dict = {}

    def prepare(self) -> None:
        """Find the tarball, decompress it once into the cache (kept across
        runs, keyed on the source's size and mtime) and count its tree."""
        ctx = self.ctx
        cache = os.path.join(ctx.workdir, "cache")
        os.makedirs(cache, exist_ok=True)
        src = self._source(cache)
        st = os.stat(src)
        base = os.path.basename(src)
        comp = None
        for ext, tool in DECOMPRESSORS:
            if base.endswith(ext):
                comp, base = tool, base[: -len(ext)]
        stamp_path = os.path.join(cache, base + ".stamp.json")
        stamp_key = {"src": src, "size": st.st_size, "mtime": int(st.st_mtime)}
        tar_path = os.path.join(cache, base) if comp else src
        stamp = None
        if os.path.exists(stamp_path) and os.path.exists(tar_path):
            with open(stamp_path) as f:
                stamp = json.load(f)
            if stamp.get("key") != stamp_key:
                stamp = None
        if stamp is None:
            if comp:
                self._decompress(comp, src, tar_path)
            stamp = {"key": stamp_key, "tar": tar_path, "stats": tar_stats(tar_path)}
            with open(stamp_path, "w") as f:
                json.dump(stamp, f, indent=1)
        self.tarball = tar_path
        self.stats = stamp["stats"]
        ctx.meta["untar_source"] = {"source": src, "tar": tar_path, **stamp["stats"]}
        ctx.log("untar tree: %(files)d files, %(dirs)d dirs, %(bytes)d bytes" % stamp["stats"])

    def _source(self, cache: str) -> str:
        """--untar-tarball, the quick tree, or linux-source (installed)."""
        opts = self.ctx.opts
        if opts.untar_tarball:
            src = os.path.realpath(opts.untar_tarball)
        elif opts.quick:
            src = os.path.join(cache, "quick-tree.tar")
            if not os.path.exists(src):
                self.ctx.log("building the quick-mode tarball %s" % src)
                build_quick_tar(src)
        else:
            src = LINUX_SOURCE_TARBALL
            if not os.path.exists(src):
                cands = sorted(glob.glob("/usr/src/linux-source-*.tar.xz"))
                if cands:
                    src = cands[-1]
                else:
                    self.ctx.log("installing %s for the untar workload" % LINUX_SOURCE_PKG)
                    self.ctx.installer.apt_install([LINUX_SOURCE_PKG])
                    if not os.path.exists(src):
                        raise CmdError("%s did not provide %s" % (LINUX_SOURCE_PKG, src))
        if not os.path.exists(src):
            raise CmdError("tarball %s not found" % src)
        return src

    def _decompress(self, comp: list[str], src: str, tar_path: str) -> None:
        ctx = self.ctx
        ctx.log("decompressing %s once into %s" % (src, tar_path))
        ctx.installer.ensure_tools([comp[0]])
        t0 = time.perf_counter()
        tmp = tar_path + ".tmp"
        with open(tmp, "wb") as out:
            ctx.procs.pipe_to_file(comp + [src], out, timeout=3600)
        os.replace(tmp, tar_path)
        ctx.log("decompressed in %.1f s" % (time.perf_counter() - t0))

    def measurements(self) -> list[Measurement]:
        return [Measurement(which, fs, partial(self.run_one, fs, which))
                for which in SIZES for fs in self.ctx.opts.fs_list]

    def _fill(self, m: Mounted, total: int, used0: int) -> int:
        """Write (and sync) a filler file so that the fs is ~tight_fill %
        used once the tree is in; returns its size (0: none needed)."""
        want = int(self.ctx.opts.tight_fill / 100.0 * total) - used0 - self.stats["est_4k_bytes"]
        if want <= 16 * MiB:
            return 0
        filler = want // MiB * MiB
        buf = b"\0" * MiB
        fd = os.open(os.path.join(m.mnt, "filler.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for _ in range(filler // MiB):
                os.write(fd, buf)
            os.fsync(fd)
        finally:
            os.close(fd)
        m.sync()
        return filler

    def run_one(self, fs: str, which: str, rep: int, rec: dict, counter_names: tuple[str, ...] = ()) -> dict:
        """Untar onto the roomy or the nearly full (`which`) filesystem and
        sync; with `counter_names`, also the deltas of those birch counters
        over the untar and its sync (`res["counters"]`)."""
        ctx = self.ctx
        size = ctx.opts.roomy_size if which == "roomy" else ctx.opts.tight_size
        raw = ctx.raw_path("untar", "%s-%s-r%d.txt" % (fs, which, rep))
        rec["raw"].append(ctx.rel(raw))
        with SETUPS[fs].open(ctx, size, which) as m:
            st = os.statvfs(m.mnt)
            total = st.f_blocks * st.f_frsize
            used0 = (st.f_blocks - st.f_bfree) * st.f_frsize
            filler = self._fill(m, total, used0) if which == "tight" and ctx.opts.tight_fill else 0
            warm(self.tarball)
            dest = os.path.join(m.mnt, "untar")
            os.mkdir(dest)
            before = m.fuse_requests()
            counters0 = m.counters() if counter_names else None
            t0 = time.perf_counter()
            ctx.run(["tar", "xf", self.tarball, "-C", dest], out_path=raw, timeout=3600)
            t1 = time.perf_counter()
            m.sync(dest, quiet=False, timeout=3600)
            t2 = time.perf_counter()
            requests: Optional[dict] = m.requests_since(before)
            counters1 = m.counters() if counters0 is not None else None
            st = os.statvfs(m.mnt)
            used1 = (st.f_blocks - st.f_bfree) * st.f_frsize
            # not part of total_s: a FUSE filesystem may only make everything
            # durable at unmount, so show what the unmount costs everywhere
            umount_s = m.unmount_timed()
            res = {"tar_s": t1 - t0, "sync_s": t2 - t1, "total_s": t2 - t0, "umount_s": umount_s,
                   "fs_bytes": total, "used_before_bytes": used0, "filler_bytes": filler,
                   "used_after_bytes": used1, "used_after_pct": 100.0 * used1 / total if total else None,
                   "tree_files": self.stats["files"], "tree_bytes": self.stats["bytes"]}
            if counters0 is not None and counters1 is not None:
                res["counters"] = {k: counters1.get(k, 0) - counters0.get(k, 0)
                                   for k in counter_names if k in counters1}
            if requests:
                res["fuse_requests"] = requests
                res["fuse_transport"] = m.transport
        with open(raw, "a") as f:
            f.write("\n# tar xf + sync timing\n" + json.dumps(res, indent=1) + "\n")
        return res
