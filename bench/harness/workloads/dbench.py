"""dbench (seeds 000–003): `dbench -c client.txt -D MNT -t DURATION N`.

dbench's mix of creates, renames, unlinks and Flush (fsync) is how every
seed measured its fsync and rename changes; the whole per-operation table is
kept, in dbench's own layout too, so numbers can be set beside the seeds'.
"""

from __future__ import annotations

import os
from functools import partial
from typing import TYPE_CHECKING

from harness import parsers
from harness.procs import CmdError
from harness.setups import SETUPS
from harness.workloads.base import Measurement, Workload

if TYPE_CHECKING:
    from harness.context import RunContext

# (config name, clients, sync dirs)
CONFIGS = [("1", 1, False), ("4", 4, False), ("8", 8, False), ("4-S", 4, True)]
LOADFILE_CANDIDATES = ["/usr/share/dbench/client.txt", "/usr/share/doc/dbench/loadfiles/client.txt",
                       "/usr/local/share/client.txt", "/usr/share/dbench/loadfiles/client.txt"]


class Dbench(Workload):
    name = "dbench"
    key_metric = "throughput_mb_s"
    tools = ("dbench",)

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.client_txt = ""

    def prepare(self) -> None:
        self.client_txt = self._find_client_txt()
        self.ctx.meta["dbench_loadfile"] = self.client_txt

    def _find_client_txt(self) -> str:
        """dbench's loadfile: where the package put it (`dpkg -L`), or a
        usual place."""
        cands = []
        try:
            _, out, _ = self.ctx.run(["dpkg", "-L", "dbench"], quiet=True, timeout=30)
            cands += [line.strip() for line in out.splitlines() if line.strip().endswith("/client.txt")]
        except Exception:
            pass
        for c in cands + LOADFILE_CANDIDATES:
            if os.path.isfile(c):
                return c
        raise CmdError("dbench loadfile client.txt not found (dpkg -L dbench)")

    def measurements(self) -> list[Measurement]:
        return [Measurement(cfg, fs, partial(self.run_one, fs, cfg, clients, sync_dirs))
                for cfg, clients, sync_dirs in CONFIGS for fs in self.ctx.opts.fs_list]

    def run_one(self, fs: str, cfg: str, clients: int, sync_dirs: bool, rep: int, rec: dict) -> dict:
        ctx = self.ctx
        with SETUPS[fs].open(ctx, ctx.opts.main_size, "main") as m:
            raw = ctx.raw_path("dbench", "%s-%s-r%d.txt" % (fs, cfg, rep))
            rec["raw"].append(ctx.rel(raw))
            cmd = ["dbench", "-c", self.client_txt, "-D", m.mnt, "-t", str(ctx.opts.duration)]
            if sync_dirs:
                cmd.append("-S")
            cmd.append(str(clients))
            before = m.fuse_requests()
            ctx.run(cmd, out_path=raw, timeout=ctx.opts.duration * 3 + 600)
            requests = m.requests_since(before)
            with open(raw, errors="replace") as f:
                parsed = parsers.parse_dbench(f.read())
        if parsed["clients"] != clients or parsed["sync_dirs"] != sync_dirs:
            raise CmdError("dbench reported %s clients sync=%s, expected %s sync=%s" % (
                parsed["clients"], parsed["sync_dirs"], clients, sync_dirs))
        if requests:
            parsed["fuse_requests"] = requests
            parsed["fuse_transport"] = m.transport
        return parsed
