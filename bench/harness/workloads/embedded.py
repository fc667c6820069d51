"""birch embedded seed 003: the same workload as `dirlog`, through birch's
library API with no FUSE in between, so that the difference to the
`birch-file` row is what FUSE costs.

By default the `seed003_embedded` example of this checkout, built here (so
the numbers come from the source the run measures); `--birch-embedded-cmd`
runs another command, with /bin/sh -c and the environment BENCH_IMAGE (a
fresh sparse image), BENCH_FILES, BENCH_FSYNC_EVERY and BENCH_OUT.  A command
reports its phase times as JSON in $BENCH_OUT or as `create_s=… sync_s=…
rename_s=…` on stdout; otherwise only its wall time is recorded.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from typing import TYPE_CHECKING, Optional

from harness.paths import REPO_DIR
from harness.setups.base import fresh_sparse_file
from harness.workloads.base import Measurement, Workload
from harness.workloads.dirlog import FSYNC_EVERY

if TYPE_CHECKING:
    from harness.context import RunContext

EXAMPLE = "seed003_embedded"
TARGET = "birch-embedded"


def parse_phase_times(text: str) -> Optional[dict]:
    """`key=value` tokens of a command's stdout (create_s=1.23 sync_s=0.1
    rename_s=2.0) as numbers; None unless create_s and rename_s are there."""
    kv = {}
    for tok in text.split():
        if "=" in tok:
            k, _, v = tok.partition("=")
            try:
                kv[k] = float(v)
            except ValueError:
                pass
    return kv if "create_s" in kv and "rename_s" in kv else None


class Embedded(Workload):
    name = "embedded"
    key_metric = "total_s"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.cmd = ctx.opts.birch_embedded_cmd

    def prepare(self) -> None:
        if not self.cmd and self.ctx.opts.birch_bin:
            self.cmd = self._build_example()

    def not_run_reason(self) -> Optional[str]:
        if self.cmd or self.ctx.opts.birch_bin:
            return None
        return "not run: no birch binary (--birch-bin) and no --birch-embedded-cmd"

    def _build_example(self) -> str:
        """Build crates/birch/examples/seed003_embedded.rs from this checkout
        (a no-op when it is up to date) and return the command running it.
        Without cargo the workload fails with the reason in the report."""
        exe = os.path.join(REPO_DIR, "target", "release", "examples", EXAMPLE)
        cargo = shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
        if not os.path.exists(os.path.join(REPO_DIR, "Cargo.toml")) or not os.access(cargo, os.X_OK):
            return "echo 'cannot build the %s example: no cargo or no birch checkout' >&2; exit 1" % EXAMPLE
        try:
            self.ctx.run([cargo, "build", "--quiet", "--release", "-p", "birch", "--example", EXAMPLE],
                         cwd=REPO_DIR, timeout=1800)
        except Exception as e:
            return "echo %s >&2; exit 1" % shlex.quote("building the %s example failed: %s" % (EXAMPLE, e))
        return shlex.quote(exe)

    def measurements(self) -> list[Measurement]:
        return [Measurement("seed003", TARGET, self.run_one)]

    def run_one(self, rep: int, rec: dict) -> dict:
        ctx = self.ctx
        raw = ctx.raw_path("embedded", "%s-r%d.txt" % (TARGET, rep))
        out_json = ctx.raw_path("embedded", "%s-r%d.json" % (TARGET, rep))
        rec["raw"] += [ctx.rel(raw)]
        img = ctx.image_path("%s.img" % TARGET)
        fresh_sparse_file(img, ctx.opts.main_size)
        env = {"BENCH_IMAGE": img, "BENCH_FILES": str(ctx.opts.dirlog_files),
               "BENCH_FSYNC_EVERY": str(FSYNC_EVERY), "BENCH_OUT": out_json}
        try:
            t0 = time.perf_counter()
            ctx.run(["/bin/sh", "-c", self.cmd], out_path=raw, env=env, timeout=3600)
            wall = time.perf_counter() - t0
        finally:
            if os.path.exists(img):
                os.unlink(img)
        if os.path.exists(out_json):
            rec["raw"].append(ctx.rel(out_json))
            with open(out_json) as f:
                res = json.load(f)
        else:
            with open(raw, errors="replace") as f:
                res = parse_phase_times(f.read())
        if res is None:
            res = {"total_s": wall, "note": "command printed no phase times; total_s is its wall time"}
        res.setdefault("total_s", sum(res.get(k, 0) for k in ("create_s", "sync_s", "rename_s")))
        res.setdefault("files", ctx.opts.dirlog_files)
        return res
