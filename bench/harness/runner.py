"""One run of `bench/run`: options → lock and sweep the work dir → measure
every workload → clean up → report → check that every planned measurement
produced numbers.

Exit status: 0 every requested measurement produced numbers; 1 some did not
(or the harness failed); 2 bad usage; 3 the work dir is locked or has
leftovers that could not be cleaned; 4 something could not be cleaned up at
the end; 128+N on signal N.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import IO, Callable, Iterable, Optional

from harness import floor, fusetrace, host, meta, options, report
from harness.context import RunContext
from harness.paths import BENCH_DIR
from harness.procs import Interrupted
from harness.setups import OPTIONAL_SETUPS, SETUPS
from harness.workloads import WORKLOADS, Measurement, Workload

# Tools every run needs, whatever it measures.
BASE_TOOLS = ["losetup", "mount", "umount", "sync", "tar"]


@dataclass(frozen=True)
class Planned:
    """A measurement the run promises: every repetition of it must produce
    `key_metric` (what `missing_numbers` checks)."""

    workload: str
    config: str
    target: str
    key_metric: str


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def plan(workloads: Iterable[Workload]) -> list[Planned]:
    return [Planned(w.name, m.config, m.target, m.key_metric or w.key_metric)
            for w in workloads if w.not_run_reason() is None for m in w.measurements()]


def missing_numbers(planned: Iterable[Planned], records: list[dict], repeat: int) -> list[str]:
    """What did not produce numbers: every repetition of every planned
    measurement must have succeeded with a numeric key metric."""
    missing = []
    for p in planned:
        rs = [r for r in records if (r["workload"], r["config"], r["fs"]) == (p.workload, p.config, p.target)]
        good = [r for r in rs if r.get("ok")
                and isinstance((r.get("metrics") or {}).get(p.key_metric), (int, float))]
        if len(good) < repeat:
            errs = "; ".join(sorted({(r.get("error") or "").splitlines()[0][:200]
                                     for r in rs if not r.get("ok") and r.get("error")}))
            missing.append("%s %s on %s: %d of %d repetitions produced numbers%s" % (
                p.workload, p.config, p.target, len(good), repeat, (" (" + errs + ")") if errs else ""))
    return missing


def measure(ctx: RunContext, workload: str, m: Measurement, rep: int) -> dict:
    """Run one measurement and record its metrics or its error; an error
    does not stop the run, an interruption does (after recording it)."""
    rec = {"workload": workload, "config": m.config, "fs": m.target, "rep": rep,
           "ok": False, "error": None, "metrics": None, "raw": [],
           "start": now_utc(), "loadavg_before": os.getloadavg()[0]}
    ctx.log("== %s %s on %s (rep %d)" % (workload, m.config, m.target, rep))
    t0 = time.perf_counter()
    try:
        rec["metrics"] = m.run(rep, rec)
        rec["ok"] = True
    except Interrupted:
        rec["error"] = "interrupted"
        ctx.records.append(rec)
        raise
    except Exception as e:  # noqa: BLE001 - recorded, run continues
        rec["error"] = str(e).strip()[:4000]
        ctx.log("FAILED %s %s on %s: %s" % (workload, m.config, m.target,
                                            str(e).splitlines()[0] if str(e) else repr(e)))
        ctx.log(traceback.format_exc())
    rec["wall_s"] = round(time.perf_counter() - t0, 3)
    rec["loadavg_after"] = os.getloadavg()[0]
    ctx.records.append(rec)
    ctx.save()
    return rec


def record_not_run(ctx: RunContext, w: Workload, reason: str) -> None:
    """A workload that cannot run here shows in the report as not run,
    not as failed."""
    for m in w.measurements():
        ctx.records.append({"workload": w.name, "config": m.config, "fs": m.target, "rep": 1,
                            "ok": None, "error": reason, "metrics": None, "raw": []})
    ctx.save()


def lock_workdir(ctx: RunContext) -> Optional[IO[str]]:
    """An exclusive lock on the work dir (kept open for the whole run), or
    None when another run holds it."""
    os.makedirs(ctx.workdir, exist_ok=True)
    lock = open(os.path.join(ctx.workdir, ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return None
    return lock


def open_results(ctx: RunContext) -> None:
    """Create the results dir; keep the records of workloads not re-run
    that an earlier run left in it, so the report covers both runs."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%MZ")
    out = os.path.realpath(ctx.opts.out or os.path.join(
        BENCH_DIR, "results", "%s-%s" % (stamp, socket.gethostname())))
    os.makedirs(out, exist_ok=True)
    ctx.open_results_dir(out)
    prev = os.path.join(out, "results.json")
    if os.path.exists(prev):
        with open(prev) as f:
            old = json.load(f)
        ctx.kept_records = [r for r in old.get("records", []) if r["workload"] not in ctx.opts.workloads]
        old_meta = old.get("meta", {})
        ctx.meta["previous_runs"] = old_meta.get("previous_runs", []) + [
            {k: old_meta.get(k) for k in ("command", "started", "finished", "workloads")}]
        ctx.log("keeping %d records of workloads not re-run from %s" % (len(ctx.kept_records), prev))


def needed_tools(ctx: RunContext, workloads: list[Workload]) -> list[str]:
    tools = list(BASE_TOOLS)
    for f in ctx.opts.fs_list:
        tools += SETUPS[f].tools
    for w in workloads:
        tools += w.tools
    return list(dict.fromkeys(tools))


def drop_unavailable_setups(ctx: RunContext) -> None:
    """Install the tools of the optional setups asked for (fuse2fs); a setup
    whose tools cannot be installed is dropped from the run, with the
    reason in the log and the report, instead of failing the run."""
    for name in [f for f in ctx.opts.fs_list if f in OPTIONAL_SETUPS]:
        try:
            ctx.installer.ensure_tools(SETUPS[name].tools)
        except Exception as e:  # noqa: BLE001 - recorded, run continues without it
            reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else repr(e)
            ctx.log("SKIPPING %s: its tools are unavailable (%s)" % (name, reason))
            ctx.meta.setdefault("skipped_setups", {})[name] = reason
            ctx.opts.fs_list.remove(name)


def run_workloads(ctx: RunContext, workloads: list[Workload]) -> None:
    """Tools, metadata, preparation, then every measurement.  Order:
    workload → repetition → configuration → filesystem, so that every
    filesystem sees the same machine conditions at nearly the same time."""
    o = ctx.opts
    ctx.installer.ensure_tools(needed_tools(ctx, workloads), force=o.install)
    meta.collect(ctx)
    floor.measure(ctx, "start")
    ctx.log("results -> %s" % ctx.out)
    ctx.log("filesystems: %s; workloads: %s; duration %d s; repeat %d; dirlog files %d" % (
        ",".join(o.fs_list), ",".join(o.workloads), o.duration, o.repeat, o.dirlog_files))
    runnable = []
    for w in workloads:
        reason = w.not_run_reason()
        if reason:
            record_not_run(ctx, w, reason)
        else:
            w.prepare()
            runnable.append(w)
    ctx.save()
    for w in runnable:
        for rep in range(1, o.repeat + 1):
            for m in w.measurements():
                measure(ctx, w.name, m, rep)
    floor.measure(ctx, "end")


def guarded(ctx: RunContext, body: Callable[[], None]) -> int:
    """Run `body`, then always clean up; the exit status so far."""
    rc = 0
    try:
        body()
    except Interrupted as e:
        ctx.log("interrupted by signal %s" % e.args[0])
        rc = 128 + int(e.args[0])
    except Exception as e:  # noqa: BLE001
        ctx.log("harness error: %s" % e)
        ctx.log(traceback.format_exc())
        rc = 1
    finally:
        ctx.procs.cleaning = True    # stays set: later signals are ignored
        ctx.teardown_all()
        left = host.sweep(ctx.procs, ctx.workdir, ctx.images_in_use())
        ctx.cleanup_failures.extend(left)
        if left:
            ctx.log("WARNING: could not clean: %s" % ", ".join(left))
            rc = rc or 4
    return rc


def write_report(ctx: RunContext) -> int:
    why = ctx.installer.ensure_matplotlib()
    try:
        report.write_report(ctx.out, plots=why is None, no_plots_reason=why)
        ctx.log("report: %s" % os.path.join(ctx.out, "report.md"))
    except Exception as e:  # noqa: BLE001
        ctx.log("report generation failed: %s" % e)
        ctx.log(traceback.format_exc())
        return 1
    return 0


def finish(ctx: RunContext, planned: list[Planned], t_start: float, rc: int) -> int:
    """Final metadata, the report, and the checks that decide the exit
    status: every planned measurement produced numbers, nothing is left."""
    ctx.meta["finished"] = now_utc()
    ctx.meta["elapsed_s"] = round(time.time() - t_start, 1)
    ctx.meta["loop_direct_io"] = ctx.dio
    ctx.meta["cleanup_failures"] = ctx.cleanup_failures
    ctx.save()
    report_rc = write_report(ctx)
    rc = rc or report_rc
    missing = missing_numbers(planned, ctx.records, ctx.opts.repeat)
    if missing:
        ctx.log("MISSING RESULTS:\n  " + "\n  ".join(missing))
        rc = rc or 1
    elif rc == 0:
        ctx.log("all %d measurements produced numbers (%.0f s)" % (
            sum(1 for r in ctx.records if r.get("ok")), time.time() - t_start))
    left = host.leftovers(ctx.procs, ctx.workdir)
    if left:
        ctx.log("LEFTOVERS: %s" % left)
        rc = rc or 4
    return rc


def main(argv: list[str]) -> int:
    args = options.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/run must run as root (it makes loop devices and mounts)", file=sys.stderr)
        return 2
    try:
        opts = options.resolve(args, argv)
    except options.UsageError as e:
        print(e, file=sys.stderr)
        return 2
    ctx = RunContext(opts)
    lock = lock_workdir(ctx)
    if lock is None:
        print("another bench/run is using %s" % ctx.workdir, file=sys.stderr)
        return 3
    try:
        ctx.procs.install_signal_handlers()
        fusetrace.sweep_instances()
        left = host.sweep(ctx.procs, ctx.workdir)
        if left:
            print("refusing to start: leftovers in %s could not be cleaned:\n  %s" % (
                ctx.workdir, "\n  ".join(left)), file=sys.stderr)
            return 3
        open_results(ctx)
        drop_unavailable_setups(ctx)
        workloads = [WORKLOADS[name](ctx) for name in opts.workloads]
        planned = plan(workloads)
        t_start = time.time()
        ctx.meta["started"] = now_utc()
        rc = guarded(ctx, lambda: run_workloads(ctx, workloads))
        return finish(ctx, planned, t_start, rc)
    finally:
        ctx.log.close()
        lock.close()
