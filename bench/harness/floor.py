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


def measure(ctx: RunContext) -> None:
    """Record meta["request_floor_us"] (or meta["request_floor_error"]).
    request-floor needs birch: its stat loop runs on a birch mount with
    attr_ttl=0, the cheapest request birch answers."""
    if not any(SETUPS[f].kind == "fuse" for f in ctx.opts.fs_list):
        return
    if not ctx.opts.birch_bin:
        ctx.meta["request_floor_error"] = "bench/request-floor needs a birch binary (--birch-bin)"
        return
    raw = ctx.raw_path("floor", "request-floor.txt")
    try:
        ctx.run([os.path.join(BENCH_DIR, "request-floor"), ctx.opts.birch_bin], out_path=raw, timeout=600)
        with open(raw) as f:
            floor = parse_request_floor(f.read())
    except Exception as e:  # noqa: BLE001 - the run goes on without "× floor"
        ctx.meta["request_floor_error"] = str(e).splitlines()[0][:300] if str(e) else repr(e)
        ctx.log("request floor not measured: %s" % ctx.meta["request_floor_error"])
        return
    if floor:
        ctx.meta["request_floor_us"] = floor
        ctx.log("request floor: %s" % ", ".join("%s %.1f us" % kv for kv in sorted(floor.items())))
    else:
        ctx.meta["request_floor_error"] = "no round trip in bench/request-floor's output (%s)" % ctx.rel(raw)
