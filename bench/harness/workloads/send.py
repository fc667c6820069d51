"""Send and receive (issue 26): birch against kernel btrfs's `btrfs send` and
`btrfs receive`, in the same run, on the same disk.

One measurement per filesystem and repetition, on a fresh filesystem:
- the untar workload's tree (linux-source-6.1; in quick mode the small tree)
  untarred into a subvolume, synced, snapshotted read-only (s1);
- `full`: the full stream of s1, sent to /dev/null (timed), then again into
  a file for the receive (not timed);
- `incremental-10`: 10 files changed (4 KiB appended to each), snapshot s2,
  the stream of s2 against s1;
- `incremental-untar`: a second copy of the tree untarred beside the first,
  snapshot s3, the stream of s3 against s2;
- the three streams received in that order into a directory of the same
  filesystem (the receive, then the filesystem's sync, timed together).

Each filesystem sends and receives its own streams: what is compared is the
work, not stream interchange (the mount tests check that). birch's send
prints how many tree nodes it read; that count must grow with the change,
not with the tree (`incremental-10` reads a few nodes of a tree whose full
send reads all of them).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from functools import partial
from typing import TYPE_CHECKING, Optional

from harness.host import GiB
from harness.procs import CmdError
from harness.setups import SETUPS
from harness.setups.base import Mounted
from harness.workloads.base import Measurement, Workload
from harness.workloads.untar import Untar, warm

if TYPE_CHECKING:
    from harness.context import RunContext

TARGETS = ("btrfs", "birch")
CHANGED_FILES = 10
APPENDED_BYTES = 4096
# (stage, metric prefix), in the order they run.
STAGES = (("full", "full"), ("incremental-10", "incremental_10"), ("incremental-untar", "incremental_untar"))
NODES_READ = re.compile(r"(\d+) tree nodes read")


def append_to_files(root: str, count: int, nbytes: int) -> list[str]:
    """Append `nbytes` to the first `count` non-empty regular files under
    `root` (sorted walk: the same files on every filesystem); their paths."""
    changed = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            p = os.path.join(dirpath, fn)
            if os.path.islink(p) or not os.path.isfile(p) or os.path.getsize(p) == 0:
                continue
            with open(p, "ab") as f:
                f.write(b"s" * nbytes)
            changed.append(p)
            if len(changed) == count:
                return changed
    raise CmdError("only %d non-empty files under %s, %d wanted" % (len(changed), root, count))


def nodes_read(output: str) -> Optional[int]:
    """The tree nodes `birch send` says it read (None: not birch)."""
    m = NODES_READ.search(output)
    return int(m.group(1)) if m else None


class Send(Workload):
    name = "send"
    key_metric = "full_send_s"
    tools = ("tar",)

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.untar = Untar(ctx)

    def prepare(self) -> None:
        self.untar.prepare()

    def targets(self) -> list[str]:
        return [f for f in self.ctx.opts.fs_list if f in TARGETS]

    def measurements(self) -> list[Measurement]:
        return [Measurement("send", fs, partial(self.run_one, fs)) for fs in self.targets()]

    def fs_size(self) -> int:
        """Room for four copies of the tree (two in the subvolume, two
        received) and their metadata: 5 × its 4 KiB-rounded size + 1 GiB,
        at least the run's main size (linux-source: 8 GiB, sparse)."""
        need = 5 * self.untar.stats["est_4k_bytes"] + GiB
        return max(self.ctx.opts.main_size, need)

    def _untar(self, dest: str) -> None:
        os.makedirs(dest, exist_ok=True)
        warm(self.untar.tarball)
        self.ctx.run(["tar", "xf", self.untar.tarball, "-C", dest], timeout=3600)

    def _send(self, m: Mounted, fs: str, rep: int, prefix: str, snap: str, parent: Optional[str],
              stream: str, rec: dict, res: dict) -> None:
        """One stage's stream: to /dev/null (timed), then into `stream`."""
        ctx = self.ctx
        command = "send_incremental" if parent else "send"
        paths = {"snap": snap, "parent": parent} if parent else {"snap": snap}
        out = ctx.raw_path("send", "%s-r%d-%s-send.txt" % (fs, rep, prefix))
        rec["raw"].append(ctx.rel(out))
        res[prefix + "_send_s"] = m.subvolume(command, out_path=out, out="/dev/null", **paths)
        with open(out, errors="replace") as f:
            nodes = nodes_read(f.read())
        if nodes is not None:
            res[prefix + "_nodes_read"] = nodes
        m.subvolume(command, out_path=out + ".kept", out=stream, **paths)
        os.unlink(out + ".kept")
        res[prefix + "_stream_bytes"] = os.path.getsize(stream)

    def run_one(self, fs: str, rep: int, rec: dict) -> dict:
        ctx = self.ctx
        streams = os.path.join(ctx.workdir, "streams")
        shutil.rmtree(streams, ignore_errors=True)
        os.makedirs(streams)
        res: dict = {"tree_files": self.untar.stats["files"], "tree_bytes": self.untar.stats["bytes"],
                     "changed_files": CHANGED_FILES}
        try:
            with SETUPS[fs].open(ctx, self.fs_size(), "send") as m:
                sv = os.path.join(m.mnt, "sv")
                m.subvolume("create", path=sv)
                self._untar(sv)
                m.sync()
                snaps = [os.path.join(m.mnt, "s%d" % i) for i in (1, 2, 3)]
                files = {prefix: os.path.join(streams, stage + ".stream") for stage, prefix in STAGES}
                m.subvolume("snapshot_ro", src=sv, dst=snaps[0])
                self._send(m, fs, rep, "full", snaps[0], None, files["full"], rec, res)
                append_to_files(sv, CHANGED_FILES, APPENDED_BYTES)
                m.sync()
                m.subvolume("snapshot_ro", src=sv, dst=snaps[1])
                self._send(m, fs, rep, "incremental_10", snaps[1], snaps[0], files["incremental_10"], rec, res)
                self._untar(os.path.join(sv, "second"))
                m.sync()
                m.subvolume("snapshot_ro", src=sv, dst=snaps[2])
                self._send(m, fs, rep, "incremental_untar", snaps[2], snaps[1], files["incremental_untar"],
                           rec, res)
                into = os.path.join(m.mnt, "received")
                os.mkdir(into)
                for _, prefix in STAGES:
                    out = ctx.raw_path("send", "%s-r%d-%s-receive.txt" % (fs, rep, prefix))
                    rec["raw"].append(ctx.rel(out))
                    t0 = time.perf_counter()
                    m.subvolume("receive", out_path=out, stream=files[prefix], dir=into)
                    m.sync()
                    res[prefix + "_receive_s"] = time.perf_counter() - t0
        finally:
            shutil.rmtree(streams, ignore_errors=True)
        return res
