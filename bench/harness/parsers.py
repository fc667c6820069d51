"""Parsers for the raw outputs the benchmark harness collects.

Pure functions, no root and no third-party modules needed, so that
`bench/test_parse.py` can check them against recorded outputs anywhere.
"""

import json
import re
import statistics

__all__ = [
    "ParseError",
    "parse_dbench",
    "format_dbench_table",
    "parse_fio",
    "parse_birch_requests",
    "parse_birch_transport",
    "summarize",
]


class ParseError(ValueError):
    """Raised when a tool's output does not contain what we need."""


# ----------------------------------------------------------------------------
# dbench
# ----------------------------------------------------------------------------

_DBENCH_HEADER = re.compile(r"^\s*Operation\s+Count\s+AvgLat\s+MaxLat\s*$", re.M)
# One row of the per-operation table. `\s+` (not ` +`) on purpose: some copies
# of dbench tables (e.g. the seeds' commit messages) wrap a row after the
# operation name, and the parser must still read them.
_DBENCH_ROW = re.compile(r"([A-Za-z][A-Za-z0-9_]*)\s+(\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)")
_DBENCH_TPUT = re.compile(
    r"Throughput\s+(?P<mbs>\d+(?:\.\d+)?)\s+MB/sec"
    r"(?P<sync>\s+\(sync dirs\))?"
    r"\s+(?P<clients>\d+)\s+clients"
    r"\s+(?P<procs>\d+)\s+procs"
    r"\s+max_latency=(?P<maxlat>\d+(?:\.\d+)?)\s+ms"
)


def parse_dbench(text):
    """Parse the final report of `dbench` (version 4.x).

    Returns a dict:
      {"ops": {name: {"count": int, "avg_ms": float, "max_ms": float}},  # in table order
       "op_order": [names...],
       "throughput_mb_s": float, "clients": int, "procs": int,
       "sync_dirs": bool, "max_latency_ms": float}
    Raises ParseError if the throughput line or the operation table is missing.
    """
    tputs = list(_DBENCH_TPUT.finditer(text))
    if not tputs:
        raise ParseError("dbench output has no 'Throughput ... max_latency=' line")
    tput = tputs[-1]
    # The op table is the last "Operation Count AvgLat MaxLat" header before
    # the throughput line.
    headers = [m for m in _DBENCH_HEADER.finditer(text) if m.end() <= tput.start()]
    if not headers:
        raise ParseError("dbench output has no 'Operation Count AvgLat MaxLat' table")
    block = text[headers[-1].end():tput.start()]
    ops = {}
    order = []
    for m in _DBENCH_ROW.finditer(block):
        name = m.group(1)
        ops[name] = {
            "count": int(m.group(2)),
            "avg_ms": float(m.group(3)),
            "max_ms": float(m.group(4)),
        }
        if name not in order:
            order.append(name)
    if not ops:
        raise ParseError("dbench operation table is empty")
    return {
        "ops": ops,
        "op_order": order,
        "throughput_mb_s": float(tput.group("mbs")),
        "clients": int(tput.group("clients")),
        "procs": int(tput.group("procs")),
        "sync_dirs": bool(tput.group("sync")),
        "max_latency_ms": float(tput.group("maxlat")),
    }


def format_dbench_table(parsed):
    """Render a parsed (or aggregated) dbench result in dbench's own layout,
    i.e. the layout the seeds quote."""
    lines = [" Operation      Count    AvgLat    MaxLat",
             " ----------------------------------------"]
    for name in parsed.get("op_order") or list(parsed["ops"]):
        op = parsed["ops"].get(name)
        if op is None:
            continue
        lines.append(" %-12s %9d %9.3f %9.3f" % (name, round(op["count"]), op["avg_ms"], op["max_ms"]))
    lines.append("")
    lines.append("Throughput %g MB/sec%s  %d clients  %d procs  max_latency=%.3f ms" % (
        round(parsed["throughput_mb_s"], 3),
        " (sync dirs)" if parsed.get("sync_dirs") else "",
        parsed.get("clients", 0), parsed.get("procs", parsed.get("clients", 0)),
        parsed["max_latency_ms"]))
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# fio
# ----------------------------------------------------------------------------

def _load_fio_json(text_or_obj):
    if isinstance(text_or_obj, dict):
        return text_or_obj
    text = text_or_obj
    # fio may print warnings ("fio: ...") before the JSON document on stdout.
    start = text.find("{")
    if start < 0:
        raise ParseError("no JSON object in fio output")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError as e:
        raise ParseError("fio output is not valid JSON: %s" % e) from None
    return obj


def _pct(lat, key):
    """Percentile `key` (e.g. '50.000000') from a fio *_ns dict, in µs."""
    pct = (lat or {}).get("percentile") or {}
    for k, v in pct.items():
        if abs(float(k) - float(key)) < 1e-9:
            return v / 1000.0
    return None


def parse_fio(text_or_obj):
    """Parse fio's `--output-format=json` output of a single write job that
    fsyncs after every write (`--fsync=1`).

    All latencies are returned in microseconds:
      write_*  : latency of the write() call (fio's completion latency; with
                 the synchronous engines submission is part of it),
      fsync_*  : latency of the fsync() that follows each write
                 (fio's "sync" section),
      op_mean_us: mean write + mean fsync (one durable 4 KiB write).
    """
    d = _load_fio_json(text_or_obj)
    jobs = d.get("jobs") or []
    if not jobs:
        raise ParseError("fio JSON has no jobs")
    j = jobs[0]
    if j.get("error"):
        raise ParseError("fio job reported error %s" % j.get("error"))
    w = j.get("write") or {}
    if not w.get("total_ios"):
        raise ParseError("fio job did no writes")
    # Prefer total latency (lat_ns, needs --lat_percentiles=1) and fall back
    # to completion latency (clat_ns, always has percentiles).
    wl = w.get("lat_ns") if (w.get("lat_ns") or {}).get("percentile") else w.get("clat_ns")
    s = j.get("sync") or {}
    sl = s.get("lat_ns") or {}
    out = {
        "ios": int(w["total_ios"]),
        "iops": float(w.get("iops", 0.0)),
        "bw_kib_s": float(w.get("bw", 0.0)),
        "runtime_ms": int(w.get("runtime", j.get("job_runtime", 0))),
        "write_p50_us": _pct(wl, "50"),
        "write_p99_us": _pct(wl, "99"),
        "write_max_us": (wl.get("max") or 0) / 1000.0,
        "write_mean_us": (wl.get("mean") or 0) / 1000.0,
        "fsync_count": int(s.get("total_ios", 0) or 0),
        "fsync_p50_us": _pct(sl, "50"),
        "fsync_p99_us": _pct(sl, "99"),
        "fsync_max_us": (sl.get("max") or 0) / 1000.0 if sl else None,
        "fsync_mean_us": (sl.get("mean") or 0) / 1000.0 if sl else None,
    }
    if out["fsync_count"] == 0 or out["fsync_p50_us"] is None:
        raise ParseError("fio JSON has no fsync latencies (was --fsync=1 given?)")
    out["op_mean_us"] = out["write_mean_us"] + out["fsync_mean_us"]
    return out


# ----------------------------------------------------------------------------
# aggregation
# ----------------------------------------------------------------------------

def summarize(values):
    """Median and spread of repeated measurements; ignores None."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


# ----------------------------------------------------------------------------
# birch stats: FUSE requests by opcode
# ----------------------------------------------------------------------------

def parse_birch_requests(text):
    """The FUSE requests of `birch stats --json`: {opcode name: count} for
    the opcodes received, "total" included. None if the output is not that
    JSON (an older birch) or has no request counts."""
    try:
        stats = json.loads(text)
    except ValueError:
        return None
    if not isinstance(stats, dict) or "fuse_requests" not in stats:
        return None
    counts = {k: n for k, n in stats["fuse_requests"].items() if n > 0}
    counts["total"] = stats["fuse_requests_total"]
    return counts


def parse_birch_transport(text):
    """How the kernel's FUSE requests reach birch, from `birch stats
    --json`: "io_uring (N queues x M entries)" or "/dev/fuse (why)"; None
    if the output does not say."""
    try:
        stats = json.loads(text)
    except ValueError:
        return None
    transport = stats.get("transport") if isinstance(stats, dict) else None
    return transport if isinstance(transport, str) else None


def parse_birch_counters(text):
    """Every numeric counter of `birch stats --json`, by name (the lines of
    crates/birch-fuse/src/stats.rs: `commits`, `log_syncs`,
    `logging_nanos`, ...). None if the output is not that JSON."""
    try:
        stats = json.loads(text)
    except ValueError:
        return None
    if not isinstance(stats, dict):
        return None
    return {k: v for k, v in stats.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
