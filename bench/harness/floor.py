"""The FUSE request floor of this run: what one GETATTR round trip costs on
each transport, measured by `bench/request-floor` at the start of the run,
so that the report's "× floor" compares every FUSE setup's time with what
FUSE itself allows under the same machine load."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from harness.paths import BENCH_DIR
from harness.setups import SETUPS

if TYPE_CHECKING:
    from harness.context import RunContext

# request-floor's line per transport, e.g.
# "devfuse  stat on birch 41.2 us, on the host fs 1.1 us: one GETATTR round trip 20.0 us"
ROUND_TRIP = re.compile(r"^(\w+)\s+stat on birch .*one GETATTR round trip (-?[\d.]+) us", re.M)


def parse_request_floor(text: str) -> dict:
    """{transport: µs per GETATTR round trip} from request-floor's output."""
    return {t: float(us) for t, us in ROUND_TRIP.findall(text)}


def mean_floor(runs: list[dict]) -> dict:
    """Per transport, the mean round trip of the measurements that have
    it (one transport may be missing from one, when io_uring could not be
    turned on)."""
    transports = sorted({t for r in runs for t in r if t != "when"})
    return {t: round(sum(r[t] for r in runs if t in r) / sum(1 for r in runs if t in r), 2)
            for t in transports}


def measure(ctx: RunContext, when: str) -> None:
    """Measure the floor now (`when`: "start" or "end" of the run) and
    record meta["request_floor_us"], per transport the mean of every
    measurement so far (or meta["request_floor_error"]). Measured at both
    ends of the run because a busy machine moves the round trip as much as
    it moves the workloads (15 µs idle, 35 µs at load 10 on this machine).
    request-floor needs birch: its stat loop runs on a birch mount with
    attr_ttl=0, the cheapest request birch answers."""
    if not any(SETUPS[f].kind == "fuse" for f in ctx.opts.fs_list):
        return
    if not ctx.opts.birch_bin:
        ctx.meta["request_floor_error"] = "bench/request-floor needs a birch binary (--birch-bin)"
        return
    raw = ctx.raw_path("floor", "request-floor-%s.txt" % when)
    try:
        ctx.run([os.path.join(BENCH_DIR, "request-floor"), ctx.opts.birch_bin], out_path=raw, timeout=600)
        with open(raw) as f:
            floor = parse_request_floor(f.read())
    except Exception as e:  # noqa: BLE001 - the run goes on without "× floor"
        ctx.log("request floor not measured at the %s: %s" % (when, str(e).splitlines()[0] if str(e) else repr(e)))
        floor = {}
    if not floor:
        ctx.meta.setdefault("request_floor_error", "bench/request-floor gave no round trip at the %s (%s)" % (
            when, ctx.rel(raw)))
        return
    runs = ctx.meta.setdefault("request_floor_runs", [])
    runs.append(dict(floor, when=when))
    ctx.meta["request_floor_us"] = mean_floor(runs)
    ctx.log("request floor at the %s: %s" % (when, ", ".join("%s %.1f us" % kv for kv in sorted(floor.items()))))
