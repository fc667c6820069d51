"""The report builder: a results directory's results.json into report.md
and plots/*.png.

Separate from the harness so that a report can be rebuilt (and the report
format changed) from recorded results, without root and without running
anything: `python3 bench/report.py bench/results/<run>/`.
"""

import json
import os
import sys

from harness import parsers

FLOORS_FIO = ["raw-loop", "host-file"]
DBENCH_CFGS = ["1", "4", "8", "4-S"]
DBENCH_CFG_LABEL = {"1": "1 client", "4": "4 clients", "8": "8 clients", "4-S": "4 clients -S (sync dirs)"}
# stable colours per target across all plots
COLOURS = {"btrfs": "#1f77b4", "ext4": "#2ca02c", "xfs": "#ff7f0e", "birch": "#d62728",
           "birch-file": "#9467bd", "raw-loop": "#7f7f7f", "host-file": "#bcbd22",
           "tmpfs-floor": "#c7c7c7", "birch-embedded": "#8c564b", "birch-single": "#e377c2",
           "fuse2fs": "#17becf"}


# ----------------------------------------------------------------------------
# data access
# ----------------------------------------------------------------------------

class Data:
    def __init__(self, results):
        self.meta = results.get("meta", {})
        self.records = results.get("records", [])
        order = list(self.meta.get("fs") or [])
        for r in self.records:
            if r["fs"] not in order and r["fs"] not in FLOORS_FIO + ["tmpfs-floor", "birch-embedded"]:
                order.append(r["fs"])
        self.fs = order
        self.base = "btrfs" if "btrfs" in order else (order[0] if order else None)

    def recs(self, workload, config=None, fs=None, ok=True):
        return [r for r in self.records if r["workload"] == workload
                and (config is None or r["config"] == config)
                and (fs is None or r["fs"] == fs)
                and (ok is None or r.get("ok") is ok)]

    def stat(self, workload, config, fs, key):
        vals = [r["metrics"].get(key) for r in self.recs(workload, config, fs) if r.get("metrics")]
        return parsers.summarize(vals)

    def load(self, workload, config, fs):
        """Median 1-minute load average around the measurement(s)."""
        vals = []
        for x in self.recs(workload, config, fs):
            lv = [v for v in (x.get("loadavg_before"), x.get("loadavg_after")) if v is not None]
            if lv:
                vals.append(sum(lv) / len(lv))
        s = parsers.summarize(vals)
        return s["median"] if s else None

    def dbench_ops(self, config, fs):
        """Per-operation medians over repetitions, in dbench's op order."""
        rs = [r["metrics"] for r in self.recs("dbench", config, fs) if r.get("metrics")]
        if not rs:
            return None
        order = []
        for m in rs:
            for n in m.get("op_order") or m["ops"]:
                if n not in order:
                    order.append(n)
        ops = {}
        for n in order:
            row = {}
            for k in ("count", "avg_ms", "max_ms"):
                s = parsers.summarize([m["ops"][n][k] for m in rs if n in m["ops"]])
                row[k] = s["median"] if s else 0
            ops[n] = row
        return {"ops": ops, "op_order": order,
                "throughput_mb_s": parsers.summarize([m["throughput_mb_s"] for m in rs])["median"],
                "max_latency_ms": parsers.summarize([m["max_latency_ms"] for m in rs])["median"],
                "clients": rs[0]["clients"], "procs": rs[0]["procs"], "sync_dirs": rs[0]["sync_dirs"]}


def fmt_num(v, digits=None):
    if v is None:
        return "—"
    if digits is None:
        a = abs(v)
        digits = 0 if a >= 1000 else 1 if a >= 100 else 2 if a >= 1 else 3
    return "%.*f" % (digits, v)


def fmt_stat(s, digits=None):
    if not s:
        return "—"
    if s["n"] == 1:
        return fmt_num(s["median"], digits)
    return "%s (%s–%s)" % (fmt_num(s["median"], digits), fmt_num(s["min"], digits), fmt_num(s["max"], digits))


def ratio(s, b):
    if not s or not b or not b["median"]:
        return None
    return s["median"] / b["median"]


def fmt_ratio(r):
    return "—" if r is None else "×%.2f" % r


def md_table(header, rows, align=None):
    align = align or ["---"] + ["--:"] * (len(header) - 1)
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


# ----------------------------------------------------------------------------
# plots
# ----------------------------------------------------------------------------

def _grouped_bars(ax, groups, series, values, errs=None, log=False):
    import numpy as np
    n = max(1, len(series))
    width = 0.8 / n
    x = np.arange(len(groups))
    for i, s in enumerate(series):
        vals = [values[s].get(g) for g in groups]
        heights = [v if v is not None else 0 for v in vals]
        yerr = None
        if errs:
            lo = [max(0.0, (values[s].get(g) or 0) - (errs[s].get(g, (0, 0))[0] or 0)) for g in groups]
            hi = [max(0.0, (errs[s].get(g, (0, 0))[1] or 0) - (values[s].get(g) or 0)) for g in groups]
            yerr = [lo, hi]
        ax.bar(x + (i - (n - 1) / 2) * width, heights, width, label=s, color=COLOURS.get(s),
               yerr=yerr, capsize=2 if yerr else 0)
    ax.set_xticks(x)
    ax.set_xticklabels(groups)
    if log:
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "%g" % v))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def make_plots(d, plot_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(plot_dir, exist_ok=True)
    made = []
    title_sfx = " — %s, %s" % (d.meta.get("host", ""), (d.meta.get("started") or "")[:10])

    def stat_maps(workload, configs, targets, key, scale=1.0):
        vals, errs = {}, {}
        for t in targets:
            vals[t], errs[t] = {}, {}
            for c in configs:
                s = d.stat(workload, c, t, key)
                if s:
                    vals[t][c] = s["median"] * scale
                    errs[t][c] = (s["min"] * scale, s["max"] * scale)
        return vals, errs

    # dbench throughput / max latency by clients
    if d.recs("dbench"):
        labels = {"1": "1", "4": "4", "8": "8", "4-S": "4 (-S)"}
        for key, fname, ylabel, log in (
                ("throughput_mb_s", "dbench_throughput.png", "throughput (MB/s)", False),
                ("max_latency_ms", "dbench_max_latency.png", "max latency (ms)", True)):
            vals, errs = stat_maps("dbench", DBENCH_CFGS, d.fs, key)
            vals = {t: {labels[c]: v for c, v in vv.items()} for t, vv in vals.items()}
            errs = {t: {labels[c]: v for c, v in vv.items()} for t, vv in errs.items()}
            fig, ax = plt.subplots(figsize=(8, 4.5))
            _grouped_bars(ax, [labels[c] for c in DBENCH_CFGS], d.fs, vals, errs, log=log)
            ax.set_xlabel("dbench clients (client.txt loadfile)")
            ax.set_ylabel(ylabel)
            ax.set_title("dbench %s by clients%s" % (ylabel.split(" (")[0], title_sfx), fontsize=10)
            fig.tight_layout()
            fig.savefig(os.path.join(plot_dir, fname), dpi=110)
            plt.close(fig)
            made.append(fname)

    # fio fsync latency percentiles
    if d.recs("fio"):
        targets = [t for t in FLOORS_FIO + d.fs if d.recs("fio", fs=t)]
        groups = ["p50", "p99", "max"]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        for ax, prefix, what in ((axes[0], "fsync", "fsync() after a 4 KiB write"),
                                 (axes[1], "write", "the 4 KiB write() itself")):
            vals, errs = {}, {}
            for t in targets:
                vals[t], errs[t] = {}, {}
                for g in groups:
                    s = d.stat("fio", "4k-write-fsync", t, "%s_%s_us" % (prefix, g))
                    if s:
                        vals[t][g], errs[t][g] = s["median"], (s["min"], s["max"])
            _grouped_bars(ax, groups, targets, vals, errs, log=True)
            ax.set_ylabel("latency (µs, log)")
            ax.set_title(what, fontsize=10)
        fig.suptitle("fio 4 KiB write + fsync latency percentiles (raw-loop/host-file = O_DIRECT floor)%s"
                     % title_sfx, fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(plot_dir, "fio_fsync_latency.png"), dpi=110)
        plt.close(fig)
        made.append("fio_fsync_latency.png")

    # untar times
    if d.recs("untar"):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        vals, errs = stat_maps("untar", ["roomy", "tight"], d.fs, "total_s")
        _grouped_bars(ax, ["roomy", "tight"], d.fs, vals, errs)
        ax.set_ylabel("tar xf + sync (s)")
        sz = "%.1f GiB / %.1f GiB" % ((d.meta.get("roomy_size") or 0) / 2**30, (d.meta.get("tight_size") or 0) / 2**30)
        ax.set_title("untar onto a roomy and a nearly full filesystem (%s)%s" % (sz, title_sfx), fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(plot_dir, "untar_times.png"), dpi=110)
        plt.close(fig)
        made.append("untar_times.png")

    # seed 003 phases (stacked)
    if d.recs("dirlog"):
        targets = [t for t in ["tmpfs-floor"] + d.fs if d.recs("dirlog", fs=t)]
        if d.recs("embedded"):
            targets.append("birch-embedded")
        fig, ax = plt.subplots(figsize=(8, 4.5))
        bottom = [0.0] * len(targets)
        for key, label, col in (("create_s", "create + fsync dir", "#4c72b0"),
                                ("sync_s", "sync", "#dd8452"),
                                ("rename_s", "rename + fsync dir", "#55a868")):
            hs = []
            for t in targets:
                w = "embedded" if t == "birch-embedded" else "dirlog"
                s = d.stat(w, "seed003", t, key)
                hs.append(s["median"] if s else 0)
            ax.bar(targets, hs, bottom=bottom, label=label, color=col)
            bottom = [b + h for b, h in zip(bottom, hs)]
        ax.set_ylabel("seconds (median)")
        ax.set_title("seed 003: %s files, dir fsync every 100%s" % (d.meta.get("dirlog_files"), title_sfx), fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(plot_dir, "dirlog_phases.png"), dpi=110)
        plt.close(fig)
        made.append("dirlog_phases.png")

    # the seeds' tables: the seed's claimed change beside birch's
    rows = [r for r in ablation_changes(d) if r[3] is not None]
    if rows:
        fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
        ys = range(len(rows))
        ax.barh([y + 0.2 for y in ys], [r[2] or 0 for r in rows], height=0.4, color="#7f7f7f",
                label="the seed's claim")
        ax.barh([y - 0.2 for y in ys], [r[3] for r in rows], height=0.4, color=COLOURS["birch"],
                label="birch (median, same run)")
        ax.set_yticks(list(ys))
        ax.set_yticklabels(["%s %s" % (r[0], r[1]) for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel("change with the seed's mechanism against without it (%)")
        ax.set_title("the seeds' tables%s" % title_sfx, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(plot_dir, "ablation_changes.png"), dpi=110)
        plt.close(fig)
        made.append("ablation_changes.png")
    return made


# ----------------------------------------------------------------------------
# report.md
# ----------------------------------------------------------------------------

def _headline(d):
    rows = []
    b = d.base

    def row(label, workload, config, key, digits=None, better="lower"):
        cells = []
        bs = d.stat(workload, config, b, key)
        anyv = False
        for f in d.fs:
            s = d.stat(workload, config, f, key)
            anyv = anyv or bool(s)
            if not s:
                cells.append("—")
            elif f == b:
                cells.append(fmt_num(s["median"], digits))
            else:
                cells.append("%s (%s)" % (fmt_num(s["median"], digits), fmt_ratio(ratio(s, bs))))
        if anyv:
            rows.append([label, better] + cells)

    for c in DBENCH_CFGS:
        row("dbench %s throughput, MB/s" % DBENCH_CFG_LABEL[c], "dbench", c, "throughput_mb_s", better="higher")
    for c in ("8", "4-S"):
        row("dbench %s max latency, ms" % DBENCH_CFG_LABEL[c], "dbench", c, "max_latency_ms")
    row("seed 003 create + dir fsync, s", "dirlog", "seed003", "create_s")
    row("seed 003 rename + dir fsync, s", "dirlog", "seed003", "rename_s")
    row("untar + sync, roomy fs, s", "untar", "roomy", "total_s")
    row("untar + sync, nearly full fs, s", "untar", "tight", "total_s")
    # seed 004's point: how much slower the nearly full filesystem is
    cells, anyv = [], False
    for f in d.fs:
        ro, ti = d.stat("untar", "roomy", f, "total_s"), d.stat("untar", "tight", f, "total_s")
        if ro and ti and ro["median"]:
            anyv = True
            cells.append("×%.2f" % (ti["median"] / ro["median"]))
        else:
            cells.append("—")
    if anyv:
        rows.append(["untar slowdown, nearly full / roomy", "lower"] + cells)
    row("fio fsync p50, µs", "fio", "4k-write-fsync", "fsync_p50_us")
    row("fio fsync p99, µs", "fio", "4k-write-fsync", "fsync_p99_us")
    row("fio durable 4 KiB writes/s", "fio", "4k-write-fsync", "iops", better="higher")
    return rows


def _reps(d):
    """Repetitions per workload, from the records themselves (a results
    folder may merge runs made with different --repeat)."""
    per = {}
    for x in d.records:
        if x.get("ok") is not None:
            per.setdefault(x["workload"], set()).add(x.get("rep", 1))
    if not per:
        return str(d.meta.get("repeat"))
    counts = {w: len(v) for w, v in per.items()}
    if len(set(counts.values())) == 1:
        return str(next(iter(counts.values())))
    return ", ".join("%s %d" % (w, n) for w, n in counts.items())


def transports_text(d):
    """The FUSE transports birch's measurements ran on (metrics
    "fuse_transport"), or what an older results.json implies."""
    seen = sorted({(r.get("metrics") or {}).get("fuse_transport") for r in d.records} - {None})
    return "; ".join(seen) if seen else "/dev/fuse (not recorded)"


def requests_rows(d):
    """One row per (workload, config, fs) whose records carry birch's
    request counts (metrics["fuse_requests"])."""
    rows = []
    seen = set()
    for r in d.records:
        counts = (r.get("metrics") or {}).get("fuse_requests")
        key = (r["workload"], r["config"], r["fs"])
        if not counts or key in seen:
            continue
        seen.add(key)
        met = r["metrics"]
        units = {"dirlog": 2 * (met.get("files") or 0), "untar": met.get("tree_files")}.get(r["workload"])
        total = counts.get("total") or sum(counts.values())
        per = (lambda n: "%.2f" % (n / units)) if units else (lambda n: "—")
        mix = ", ".join("%s %d (%s)" % (k, n, per(n)) for k, n in
                        sorted(counts.items(), key=lambda kv: -kv[1]) if k != "total")
        rows.append(["%s %s" % key[:2], key[2], str(total), per(total), mix])
    return rows

# Workloads whose wall time is one client's chain of requests, so that
# wall time ÷ (requests × one round trip) says how close a FUSE filesystem
# comes to what FUSE allows. dbench runs several clients at once for a fixed
# time (its requests overlap), so it has no such ratio.
FLOOR_WALL_METRIC = {"dirlog": "total_s", "untar": "total_s"}


def floor_transport(transport):
    """The request-floor key ("devfuse" or "uring") of a measurement's
    FUSE transport as recorded (birch's `birch stats` text, fuse2fs's
    "/dev/fuse")."""
    return "uring" if (transport or "").startswith("io_uring") else "devfuse"


def floor_rows(d):
    """One row per (workload, config, FUSE fs) with request counts: wall
    time, requests, µs per request, the round trip measured in the same run
    on that transport, and "× floor" = wall ÷ (requests × round trip); each a
    median over repetitions."""
    floor = d.meta.get("request_floor_us") or {}
    groups = {}
    for r in d.records:
        met = r.get("metrics") or {}
        wall_key = FLOOR_WALL_METRIC.get(r["workload"])
        counts = met.get("fuse_requests")
        if not r.get("ok") or not wall_key or not counts or not isinstance(met.get(wall_key), (int, float)):
            continue
        total = counts.get("total") or sum(n for k, n in counts.items() if k != "LOST")
        if not total:
            continue
        wall = met[wall_key]
        rt = floor.get(floor_transport(met.get("fuse_transport")))
        g = groups.setdefault((r["workload"], r["config"], r["fs"]), {"wall": [], "n": [], "us": [], "x": []})
        g["transport"] = floor_transport(met.get("fuse_transport"))
        g["wall"].append(wall)
        g["n"].append(total)
        g["us"].append(1e6 * wall / total)
        if rt:
            g["x"].append(1e6 * wall / total / rt)
    rows = []
    for (workload, config, fs), g in groups.items():
        xs = parsers.summarize(g["x"])
        rows.append(["%s %s" % (workload, config), fs, g["transport"], fmt_stat(parsers.summarize(g["wall"])),
                     fmt_stat(parsers.summarize(g["n"]), 0), fmt_stat(parsers.summarize(g["us"]), 1),
                     fmt_num(floor.get(g["transport"]), 1), ("×%.2f" % xs["median"]) if xs else "—"])
    return rows


def _header(d, title):
    """The run's settings, machine and tools, and how to read the numbers."""
    L = []
    add = L.append
    m = d.meta
    add("# birch benchmark report — %s" % title)
    add("")
    add("| | |\n|---|---|")
    for k, v in (("host", "%s, %s CPUs (%s), %s GiB RAM" % (m.get("host"), m.get("cpus"), m.get("cpu"), m.get("mem_gib"))),
                 ("kernel", m.get("kernel")),
                 ("source", "`%s`" % m.get("source") if m.get("source") else "—"),
                 ("command", "`%s`" % m.get("command")),
                 ("mode", "quick (CI smoke test — numbers are not meaningful)" if m.get("quick") else "full"),
                 ("started / finished", "%s / %s (%s s)" % (m.get("started"), m.get("finished"), m.get("elapsed_s"))),
                 ("filesystems", ", ".join(d.fs) + "".join(
                     "; %s skipped: %s" % kv for kv in sorted((m.get("skipped_setups") or {}).items()))),
                 ("repetitions", "%s (cells: median, and (min–max) when more than one)" % _reps(d)),
                 ("duration per dbench / fio run", "%s s" % m.get("duration_s")),
                 ("work dir (images)", "%s on %s" % (m.get("workdir"), m.get("workdir_fs"))),
                 ("loop devices direct I/O", ", ".join("%s=%s" % kv for kv in sorted((m.get("loop_direct_io") or {}).items())) or "—"),
                 ("tools", "; ".join("%s" % v for v in (m.get("versions") or {}).values() if v))):
        add("| %s | %s |" % (k, str(v).replace("|", "\\|")))
    for pr in m.get("previous_runs") or []:
        add("| earlier run in this folder | `%s` (%s; its records of workloads re-run later were replaced) |" % (
            pr.get("command"), pr.get("started")))
    add("")
    loads = [v for x in d.records for v in (x.get("loadavg_before"), x.get("loadavg_after")) if v is not None]
    if loads and m.get("cpus") and max(loads) > 1.5 * m["cpus"]:
        add("> **Noisy machine**: the 1-minute load average reached %.1f (median %.1f) on %s CPUs during "
            "this run, so other work competed with the benchmarks; single-repetition numbers can be off "
            "by a factor of 2 or more. Compare ratios, prefer runs with `--repeat 3`, and check the "
            "`load avg` columns." % (max(loads), sorted(loads)[len(loads) // 2], m["cpus"]))
        add("")
    add("Every measurement runs on a freshly created image, loop device (`losetup --direct-io=on`), "
        "mkfs and mount, all on the same disk. Filesystems are interleaved inside each "
        "repetition, so the ratios compare numbers taken under the same machine load. "
        "The machine is shared and noisy: **ratios against kernel btrfs from the same run are the "
        "headline**, absolute numbers are not.")
    add("")
    return L


def _headline_section(d, made, plot_err):
    """One row per key metric, one column per filesystem, ratios to the base."""
    L = []
    add = L.append
    if d.records and all(r["workload"] == "ablation" for r in d.records):
        # birch against itself: "The seeds' tables" is the headline
        return L
    add("## Headline: ratios against %s measured in the same run" % d.base)
    add("")
    add("Cell = median (×ratio to %s). `better` says which direction is better." % d.base)
    add("")
    add(md_table(["metric", "better"] + d.fs, _headline(d), ["---", ":-:"] + ["--:"] * len(d.fs)))
    add("")
    if made:
        add(" ".join("![%s](plots/%s)" % (p[:-4], p) for p in made))
        add("")
    if plot_err:
        add("_No plots: %s._" % plot_err)
        add("")
    return L


def _dbench_section(d):
    """dbench summary, then per configuration the per-operation tables."""
    L = []
    add = L.append
    m = d.meta
    if d.recs("dbench", ok=None):
        add("## 1. dbench (seeds 000, 001, 002, 003)")
        add("")
        add("`dbench -c %s -D MNT -t %s N` (and `-S` for sync dirs) on a fresh %s GiB filesystem per run." % (
            m.get("dbench_loadfile", "client.txt"), m.get("duration_s"), (m.get("main_size") or 0) // 2**30))
        add("Latencies in ms as dbench reports them.")
        add("")
        rows = []
        for c in DBENCH_CFGS:
            bt = d.stat("dbench", c, d.base, "throughput_mb_s")
            bl = d.stat("dbench", c, d.base, "max_latency_ms")
            for f in d.fs:
                t = d.stat("dbench", c, f, "throughput_mb_s")
                lat = d.stat("dbench", c, f, "max_latency_ms")
                if not t and not d.recs("dbench", c, f, ok=False):
                    continue
                rows.append([DBENCH_CFG_LABEL[c], f, fmt_stat(t, 2), fmt_ratio(ratio(t, bt)),
                             fmt_stat(lat, 3), fmt_ratio(ratio(lat, bl)), fmt_num(d.load("dbench", c, f), 1)])
        add(md_table(["config", "fs", "Throughput MB/sec", "× %s" % d.base, "max_latency ms", "× %s" % d.base,
                      "load avg"], rows, ["---", "---", "--:", "--:", "--:", "--:", "--:"]))
        add("")
        add("`load avg`: the machine's 1-minute load average around the run (%s CPUs); "
            "a high value means other work competed with this measurement." % m.get("cpus"))
        add("")
        for c in DBENCH_CFGS:
            per = {f: d.dbench_ops(c, f) for f in d.fs}
            per = {f: v for f, v in per.items() if v}
            if not per:
                continue
            add("### dbench, %s — per operation (median over repetitions)" % DBENCH_CFG_LABEL[c])
            add("")
            order = []
            for v in per.values():
                for n in v["op_order"]:
                    if n not in order:
                        order.append(n)
            hdr = ["Operation"]
            for f in per:
                hdr += ["%s Count" % f, "AvgLat", "MaxLat"]
            rows = []
            for n in order:
                row = [n]
                for f, v in per.items():
                    op = v["ops"].get(n)
                    row += ["%d" % round(op["count"]), "%.3f" % op["avg_ms"], "%.3f" % op["max_ms"]] if op else ["—"] * 3
                rows.append(row)
            row = ["**Throughput** MB/sec / max_latency"]
            for f, v in per.items():
                row += ["**%.2f**" % v["throughput_mb_s"], "", "**%.3f**" % v["max_latency_ms"]]
            rows.append(row)
            add(md_table(hdr, rows, ["---"] + ["--:"] * (len(hdr) - 1)))
            add("")
            add("<details><summary>the same in dbench's own layout (as the seeds quote it)</summary>")
            add("")
            for f, v in per.items():
                add("%s, %s:" % (f, DBENCH_CFG_LABEL[c]))
                add("")
                add("```")
                add(parsers.format_dbench_table(v))
                add("```")
                add("")
            add("</details>")
            add("")
    return L


def _dirlog_section(d):
    """Seed 003 phase times and directory fsync latency (with the embedded row)."""
    L = []
    add = L.append
    m = d.meta
    if d.recs("dirlog", ok=None):
        add("## 2. Seed 003: directory logging (create / sync / rename, dir fsync every 100)")
        add("")
        add("%s empty files created in one directory (`os.open(O_CREAT)`), the directory fsynced "
            "(`fsync` on a directory fd) every 100 creations; `sync -f` (`birch sync` on birch, whose "
            "commit syncfs does not reach); every file renamed in the "
            "same directory, the directory fsynced every 100 renames. Python; `tmpfs-floor` is the "
            "same code on tmpfs (fsync is a no-op there), i.e. the harness's own overhead." % m.get("dirlog_files"))
        add("")
        rows = []
        bt = d.stat("dirlog", "seed003", d.base, "total_s")
        bc = d.stat("dirlog", "seed003", d.base, "create_s")
        br = d.stat("dirlog", "seed003", d.base, "rename_s")
        targets = [("dirlog", t) for t in ["tmpfs-floor"] + d.fs] + [("embedded", "birch-embedded")]
        for w, f in targets:
            if not d.recs(w, "seed003", f, ok=None):
                continue
            st = {k: d.stat(w, "seed003", f, k) for k in ("create_s", "sync_s", "rename_s", "total_s",
                                                          "fsync_mean_ms", "fsync_max_ms")}
            if not st["total_s"]:
                errs = [r.get("error") for r in d.recs(w, "seed003", f, ok=None) if r.get("error")]
                rows.append([f, "—", "—", "—", "—", "—", "—", "—", "—", "—", (errs[0] if errs else "failed").splitlines()[0]])
                continue
            rows.append([f, fmt_stat(st["create_s"]), fmt_ratio(ratio(st["create_s"], bc)),
                         fmt_stat(st["sync_s"]), fmt_stat(st["rename_s"]), fmt_ratio(ratio(st["rename_s"], br)),
                         fmt_stat(st["total_s"]), fmt_ratio(ratio(st["total_s"], bt)),
                         "%s / %s" % (fmt_num((st["fsync_mean_ms"] or {}).get("median")),
                                      fmt_num((st["fsync_max_ms"] or {}).get("median"))),
                         fmt_num(d.load(w, "seed003", f), 1), ""])
        add(md_table(["fs", "create+fsync s", "×", "sync s", "rename+fsync s", "×", "total s", "×",
                      "dir fsync mean / max ms", "load avg", "note"], rows,
                     ["---"] + ["--:"] * 9 + ["---"]))
        add("")
    return L


def _untar_section(d):
    """Seed 004: untar times on a roomy and a nearly full filesystem."""
    L = []
    add = L.append
    m = d.meta
    if d.recs("untar", ok=None):
        src = m.get("untar_source") or {}
        add("## 3. Seed 004: untar onto a roomy and a nearly full filesystem")
        add("")
        add("`tar xf %s -C MNT/untar` then `sync -f` (`birch sync` on birch), timed together, from a page-cache-warm tarball "
            "(%s files, %s dirs, %.2f GB; source %s). Roomy = %.2f GiB filesystem, nearly full = %.2f GiB "
            "with a filler file written first when needed so that it is ~%s%% used afterwards. "
            "The unmount that follows is timed separately (not in `total`): a FUSE filesystem may "
            "only finish its work there." % (
                os.path.basename(src.get("tar", "?")), src.get("files"), src.get("dirs"),
                (src.get("bytes") or 0) / 1e9, src.get("source"),
                (m.get("roomy_size") or 0) / 2**30, (m.get("tight_size") or 0) / 2**30, m.get("tight_fill_pct")))
        add("")
        rows = []
        br = d.stat("untar", "roomy", d.base, "total_s")
        bt = d.stat("untar", "tight", d.base, "total_s")
        for f in d.fs:
            r = {k: d.stat("untar", "roomy", f, k) for k in ("tar_s", "sync_s", "total_s")}
            t = {k: d.stat("untar", "tight", f, k) for k in ("tar_s", "sync_s", "total_s", "used_after_pct",
                                                              "filler_bytes", "umount_s")}
            r["umount_s"] = d.stat("untar", "roomy", f, "umount_s")
            errs = [x.get("error").splitlines()[0][:120] for x in d.recs("untar", None, f, ok=False) if x.get("error")]
            slow = (t["total_s"]["median"] / r["total_s"]["median"]) if (t["total_s"] and r["total_s"]) else None
            rows.append([f, fmt_stat(r["tar_s"]), fmt_stat(r["sync_s"]), fmt_stat(r["total_s"]),
                         fmt_ratio(ratio(r["total_s"], br)),
                         fmt_stat(t["tar_s"]), fmt_stat(t["sync_s"]), fmt_stat(t["total_s"]),
                         fmt_ratio(ratio(t["total_s"], bt)), fmt_ratio(slow),
                         "%s / %s" % (fmt_stat(r["umount_s"]), fmt_stat(t["umount_s"])),
                         "%s / %s" % (fmt_num(d.load("untar", "roomy", f), 1), fmt_num(d.load("untar", "tight", f), 1)),
                         "%s%% (filler %s MiB)" % (fmt_num((t["used_after_pct"] or {}).get("median"), 1),
                                                   fmt_num(((t["filler_bytes"] or {}).get("median") or 0) / 2**20, 0)),
                         "; ".join(errs)])
        add(md_table(["fs", "roomy tar s", "sync s", "total s", "×", "nearly full tar s", "sync s", "total s", "×",
                      "full / roomy", "unmount s (roomy / full)", "load avg", "used after", "errors"], rows,
                     ["---"] + ["--:"] * 12 + ["---"]))
        add("")
    return L


def _fio_section(d):
    """fio write + fsync percentiles against the device's floors."""
    L = []
    add = L.append
    m = d.meta
    if d.recs("fio", ok=None):
        add("## 4. fio: one durable 4 KiB write (write + fsync) against the device's write+flush floor")
        add("")
        add("`fio --rw=%s --bs=4k --ioengine=sync --fsync=1 --fallocate=none --runtime=%s` on a new file "
            "(buffered) on each filesystem. Floors: `raw-loop` = the same job with `--direct=1` on a bare "
            "direct-io loop device over an image file on the same disk (write + flush of the loop device); "
            "`host-file` = `--direct=1` on a plain file of the host filesystem. Latencies in µs. "
            "`write+fsync mean` is the mean cost of one durable 4 KiB write; its ratio to `raw-loop` "
            "is how far each filesystem is above the device's own write+flush." % (
                m.get("fio_rw", "write"), m.get("duration_s")))
        add("")
        rows = []
        bf = {k: d.stat("fio", "4k-write-fsync", d.base, k) for k in ("fsync_p50_us", "fsync_p99_us")}
        floor = d.stat("fio", "4k-write-fsync", "raw-loop", "op_mean_us")
        for f in FLOORS_FIO + d.fs:
            if not d.recs("fio", None, f, ok=None):
                continue
            s = {k: d.stat("fio", "4k-write-fsync", f, k) for k in (
                "write_p50_us", "write_p99_us", "write_max_us", "fsync_p50_us", "fsync_p99_us",
                "fsync_max_us", "iops", "ios", "op_mean_us")}
            if not s["fsync_p50_us"]:
                errs = [x.get("error") for x in d.recs("fio", None, f, ok=False) if x.get("error")]
                rows.append([f] + ["—"] * 13 + [(errs[0] if errs else "failed").splitlines()[0]])
                continue
            rows.append([f, fmt_stat(s["write_p50_us"], 1), fmt_stat(s["write_p99_us"], 1), fmt_stat(s["write_max_us"], 0),
                         fmt_stat(s["fsync_p50_us"], 1), fmt_ratio(ratio(s["fsync_p50_us"], bf["fsync_p50_us"])),
                         fmt_stat(s["fsync_p99_us"], 1), fmt_ratio(ratio(s["fsync_p99_us"], bf["fsync_p99_us"])),
                         fmt_stat(s["fsync_max_us"], 0), fmt_stat(s["op_mean_us"], 1),
                         fmt_ratio(ratio(s["op_mean_us"], floor)),
                         fmt_stat(s["iops"], 0), fmt_stat(s["ios"], 0), fmt_num(d.load("fio", "4k-write-fsync", f), 1), ""])
        add(md_table(["target", "write p50", "write p99", "write max", "fsync p50", "× %s" % d.base,
                      "fsync p99", "× %s" % d.base, "fsync max", "write+fsync mean", "× raw-loop",
                      "writes/s", "writes", "load avg", "note"],
                     rows, ["---"] + ["--:"] * 13 + ["---"]))
        add("")
    return L


def _embedded_section(d):
    """Whether the embedded seed 003 ran (its numbers are in section 2)."""
    L = []
    add = L.append
    add("## 5. birch embedded seed 003 (library API, no FUSE)")
    add("")
    er = d.recs("embedded", ok=None)
    if not er or all(r.get("ok") is None for r in er):
        add("Not run: it needs birch (`--birch-bin PATH`, which builds the `seed003_embedded` "
            "example) or `--birch-embedded-cmd CMD` (see bench/README.md for the protocol).")
    else:
        add("Shown as the `birch-embedded` row of section 2.")
        for r in er:
            if r.get("ok") is False:
                add("")
                add("- rep %s failed: %s" % (r["rep"], (r.get("error") or "").splitlines()[0]))
    add("")
    return L


def dup_pairs(d):
    """(dup, single) pairs of birch setups that differ only in their
    metadata mode, from the setups results.json describes (meta.fs_table);
    results from before the metadata was recorded have none."""
    table = d.meta.get("fs_table") or {}
    pairs = []
    for single in d.fs:
        desc = table.get(single) or {}
        if desc.get("metadata") != "single":
            continue
        for dup in d.fs:
            other = table.get(dup) or {}
            if (other.get("metadata") == "dup" and other.get("device") == desc.get("device")
                    and not other.get("ablate")):
                pairs.append((dup, single))
                break
    return pairs


# (label, workload, config, key, better, scale): the benchmarks issue 13 asks
# DUP's cost on, seed 003, untar and fio fsync, plus the space it takes.
DUP_ROWS = [
    ("seed 003 create + dir fsync, s", "dirlog", "seed003", "create_s", "lower", 1),
    ("seed 003 rename + dir fsync, s", "dirlog", "seed003", "rename_s", "lower", 1),
    ("seed 003 total, s", "dirlog", "seed003", "total_s", "lower", 1),
    ("seed 003 dir fsync mean, ms", "dirlog", "seed003", "fsync_mean_ms", "lower", 1),
    ("untar + sync, roomy fs, s", "untar", "roomy", "total_s", "lower", 1),
    ("untar + sync, nearly full fs, s", "untar", "tight", "total_s", "lower", 1),
    ("used after the untar, roomy fs, MiB", "untar", "roomy", "used_after_bytes", "lower", 1 / 2**20),
    ("fio fsync p50, µs", "fio", "4k-write-fsync", "fsync_p50_us", "lower", 1),
    ("fio fsync p99, µs", "fio", "4k-write-fsync", "fsync_p99_us", "lower", 1),
    ("fio write + fsync mean, µs", "fio", "4k-write-fsync", "op_mean_us", "lower", 1),
    ("fio durable 4 KiB writes/s", "fio", "4k-write-fsync", "iops", "higher", 1),
]


def dup_rows(d, dup, single):
    """One row per DUP_ROWS metric both setups have: median of each and
    their ratio (dup / single: above 1 on a time is what DUP costs)."""
    rows = []
    for label, workload, config, key, better, scale in DUP_ROWS:
        a, b = d.stat(workload, config, dup, key), d.stat(workload, config, single, key)
        if not a or not b:
            continue
        rows.append([label, better, fmt_num(a["median"] * scale), fmt_num(b["median"] * scale),
                     fmt_ratio(ratio(a, b))])
    return rows


def _dup_section(d):
    """What DUP metadata costs: birch with `--metadata dup` against the same
    setup with `--metadata single`, measured in the same run."""
    L = []
    add = L.append
    for dup, single in dup_pairs(d):
        rows = dup_rows(d, dup, single)
        if not rows:
            continue
        add("## DUP metadata: %s against %s" % (dup, single))
        add("")
        add("`%s` is `birch mkfs --metadata dup` (birch's default: every tree node is written twice, "
            "half the device apart, both copies covered by the same commit and log flushes); `%s` is "
            "the same setup with `--metadata single`. Cell = median; `dup / single` above ×1.00 on a "
            "time or on space is what the second copy costs." % (dup, single))
        add("")
        add(md_table(["metric", "better", "%s (dup)" % dup, "%s (single)" % single, "dup / single"], rows,
                     ["---", ":-:", "--:", "--:", "--:"]))
        add("")
    return L


def _requests_section(d):
    """birch's FUSE requests per workload."""
    L = []
    add = L.append
    req_rows = requests_rows(d)
    if req_rows:
        add("## Requests per operation (FUSE setups)")
        add("")
        add("FUSE requests the kernel sent each FUSE filesystem during each workload, by opcode: as birch "
            "counts them (`birch stats --json`, fuse_requests), for fuse2fs from the kernel's "
            "fuse:fuse_request_send tracepoint; first repetition. Per unit: per file for the untar "
            "(tree files), per create or rename for seed 003; dbench runs for a fixed time, so its "
            "counts are totals. docs/FUSE.md explains each request and which ones birch avoids. "
            "FUSE transport (`birch stats`): %s." % transports_text(d))
        add("")
        add(md_table(["workload", "fs", "total", "per unit", "mix (count, per unit)"], req_rows,
                     ["---", "---", "--:", "--:", "---"]))
        add("")
    return L


def _floor_section(d):
    """Each FUSE setup's wall time against the request floor."""
    L = []
    add = L.append
    rows = floor_rows(d)
    if not rows:
        return L
    floor = d.meta.get("request_floor_us") or {}
    add("## Time against the FUSE request floor")
    add("")
    runs = d.meta.get("request_floor_runs") or []
    add("`× floor` = wall time ÷ (requests × one GETATTR round trip), the round trip measured by "
        "`bench/request-floor` in this run on the same transport, the mean of its measurements at "
        "the start and at the end of the run (%s%s). ×1.00 would be a "
        "filesystem whose every request costs what the kernel and the transport alone cost; what "
        "is above is the daemon's own time (and the device's). Seed 003 and the untar only: dbench's "
        "clients overlap their requests. Cells: median (min–max) over repetitions." % (
            "; ".join("%s %.1f µs" % (k, v) for k, v in sorted(floor.items()) if isinstance(v, (int, float)))
            or "not measured: %s" % (d.meta.get("request_floor_error") or "no FUSE setup with birch"),
            "".join("; at the %s: %s" % (r.get("when"), ", ".join(
                "%s %.1f µs" % (k, v) for k, v in sorted(r.items()) if k != "when")) for r in runs)))
    add("")
    add(md_table(["workload", "fs", "transport", "wall s", "requests", "µs / request", "floor µs", "× floor"],
                 rows, ["---", "---", "---", "--:", "--:", "--:", "--:", "--:"]))
    add("")
    return L


def _snap_cell(d, config, fs, key, digits=None, base=True):
    """A snapshots-workload cell: median (spread), and its ratio to the
    base filesystem's when `base`."""
    st = d.stat("snapshots", config, fs, key)
    cells = [fmt_stat(st, digits)]
    if base:
        cells.append(fmt_ratio(ratio(st, d.stat("snapshots", config, d.base, key))))
    return cells


def _snap_ratio(d, fs, config_a, config_b, key):
    """Median of `config_a` over median of `config_b` on one filesystem."""
    return fmt_ratio(ratio(d.stat("snapshots", config_a, fs, key), d.stat("snapshots", config_b, fs, key)))


def _snap_first(d, config, key):
    """A metric every record of `config` carries (file and snapshot counts,
    durations: per record, so that a report merging runs stays right),
    from the first record that has it."""
    for r in d.recs("snapshots", config):
        if (r.get("metrics") or {}).get(key) is not None:
            return r["metrics"][key]
    return None


def _snap_load(d, fs, configs):
    return "/".join(fmt_num(d.load("snapshots", c, fs), 1) for c in configs)


def snapshot_rows(d):
    """The four tables of the snapshots section, as {name: rows}, one row
    per filesystem that ran the workload (pure, for the tests)."""
    fss = [f for f in d.fs if d.recs("snapshots", fs=f, ok=None)]
    t = {"snapshot": [], "fio": [], "dbench": [], "seed003": []}
    for f in fss:
        t["snapshot"].append(
            [f] + _snap_cell(d, "snapshot-small", f, "snapshot_s", 3)
            + _snap_cell(d, "snapshot-large", f, "snapshot_s", 3)
            + [_snap_ratio(d, f, "snapshot-large", "snapshot-small", "snapshot_s"),
               "%s / %s" % (fmt_stat(d.stat("snapshots", "snapshot-small", f, "snapshot_first_s"), 3),
                            fmt_stat(d.stat("snapshots", "snapshot-large", f, "snapshot_first_s"), 3)),
               "%s / %s" % (fmt_stat(d.stat("snapshots", "snapshot-small", f, "fill_s")),
                            fmt_stat(d.stat("snapshots", "snapshot-large", f, "fill_s"))),
               _snap_load(d, f, ("snapshot-small", "snapshot-large"))])
        t["fio"].append(
            [f] + _snap_cell(d, "fio-0-snapshots", f, "fsync_p50_us", 0)
            + _snap_cell(d, "fio-0-snapshots", f, "fsync_p99_us", 0)
            + _snap_cell(d, "fio-snapshots", f, "fsync_p50_us", 0)
            + _snap_cell(d, "fio-snapshots", f, "fsync_p99_us", 0)
            + [_snap_ratio(d, f, "fio-snapshots", "fio-0-snapshots", "fsync_p50_us"),
               _snap_ratio(d, f, "fio-snapshots", "fio-0-snapshots", "fsync_p99_us"),
               "%s / %s" % (fmt_stat(d.stat("snapshots", "fio-0-snapshots", f, "write_p50_us"), 1),
                            fmt_stat(d.stat("snapshots", "fio-snapshots", f, "write_p50_us"), 1)),
               "%s / %s" % (fmt_stat(d.stat("snapshots", "fio-0-snapshots", f, "iops"), 0),
                            fmt_stat(d.stat("snapshots", "fio-snapshots", f, "iops"), 0)),
               fmt_stat(d.stat("snapshots", "fio-snapshots", f, "snapshots_total_s"), 1),
               _snap_load(d, f, ("fio-0-snapshots", "fio-snapshots"))])
        t["dbench"].append(
            [f] + _snap_cell(d, "dbench-4", f, "throughput_mb_s", 1)
            + _snap_cell(d, "dbench-4-bgdelete", f, "throughput_mb_s", 1)
            + [_snap_ratio(d, f, "dbench-4-bgdelete", "dbench-4", "throughput_mb_s")]
            + _snap_cell(d, "dbench-4", f, "max_latency_ms", 1)
            + _snap_cell(d, "dbench-4-bgdelete", f, "max_latency_ms", 1)
            + [fmt_stat(d.stat("snapshots", "dbench-4-bgdelete", f, "delete_s"), 3),
               fmt_stat(d.stat("snapshots", "dbench-4-bgdelete", f, "cleaner_after_s"), 3),
               fmt_stat(d.stat("snapshots", "dbench-4", f, "drop_alone_s"), 3),
               _snap_load(d, f, ("dbench-4", "dbench-4-bgdelete"))])
        t["seed003"].append(
            [f] + _snap_cell(d, "seed003-subvolume", f, "total_s", 3)
            + _snap_cell(d, "seed003-snapshot", f, "total_s", 3)
            + [_snap_ratio(d, f, "seed003-snapshot", "seed003-subvolume", "total_s")]
            + ["%s / %s" % (fmt_num((d.stat("snapshots", c, f, "fsync_mean_ms") or {}).get("median")),
                            fmt_num((d.stat("snapshots", c, f, "fsync_max_ms") or {}).get("median")))
               for c in ("seed003-subvolume", "seed003-snapshot")]
            + [_snap_load(d, f, ("seed003-subvolume", "seed003-snapshot"))])
    return t


def _snapshots_section(d):
    """Issue 22's benchmarks: snapshot time against the file count, fsync
    beside 100 snapshots, dbench during a background deletion, seed 003
    inside a snapshot; birch against btrfs."""
    L = []
    add = L.append
    if not d.recs("snapshots", ok=None):
        return L
    b = d.base
    add("## 6. Subvolumes and snapshots (issue 22)")
    add("")
    add("Each configuration on a fresh filesystem; `btrfs subvolume …` on btrfs, `birch subvolume …` "
        "(the same commands, through the mounted daemon) on birch. Files are empty, created with "
        "`mknod`, 1,000 per directory. Cells: median (min–max over repetitions) and × %s. "
        "Load: 1-minute load average around the measurements." % b)
    add("")
    t = snapshot_rows(d)
    small, large = _snap_first(d, "snapshot-small", "files"), _snap_first(d, "snapshot-large", "files")
    add("**Snapshot time** (the snapshot command, which commits; median of %s snapshots of the same "
        "subvolume, taken one after the other after a sync). It must not grow with the file count: "
        "`large / small` near ×1." % _snapshots_timed(d))
    add("")
    add(md_table(["fs", "%s files: s" % fmt_count(small), "× %s" % b, "%s files: s" % fmt_count(large),
                  "× %s" % b, "large / small", "first snapshot s (small / large)",
                  "creating the files s (small / large)", "load"], t["snapshot"]))
    add("")
    nsnap = _snap_first(d, "fio-snapshots", "snapshots")
    add("**fio 4 KiB random write + fsync** (`fio --rw=randwrite --bs=4k --ioengine=sync --fsync=1 "
        "--time_based --runtime=%s --size=%sm --randrepeat=1` on a file of a subvolume, written out "
        "whole and synced before the snapshots, so every block starts shared), fsync latency in µs, "
        "with 0 and %s snapshots of the subvolume." % (
            _snap_first(d, "fio-snapshots", "runtime_s"), _snap_first(d, "fio-snapshots", "file_mib"), nsnap))
    add("")
    add(md_table(["fs", "p50, 0 snapshots", "× %s" % b, "p99, 0", "× %s" % b,
                  "p50, %s snapshots" % nsnap, "× %s" % b, "p99, %s" % nsnap, "× %s" % b,
                  "p50 %s / 0" % nsnap, "p99 %s / 0" % nsnap, "write p50 µs (0 / %s)" % nsnap,
                  "writes/s (0 / %s)" % nsnap, "taking the %s snapshots s" % nsnap, "load"], t["fio"]))
    add("")
    add("**dbench, 4 clients** (`dbench -c client.txt -t %s 4` in a directory of the top level) beside a "
        "%s-file snapshot that owns its tree alone (its source deleted and cleaned first): left alone, "
        "and deleted (`subvolume delete -c`) just before dbench starts, its cleaner running in the "
        "background. `cleaner after` = how long `subvolume sync` then took once dbench ended (btrfs: "
        "waiting for its cleaner; birch: running the rest of the drop); `drop alone` = the same "
        "deletion after the idle run's dbench, with nothing else running (delete + sync): the size "
        "of the work done in the background." % (
            _snap_first(d, "dbench-4", "duration_s"), fmt_count(_snap_first(d, "dbench-4", "files"))))
    add("")
    add(md_table(["fs", "MB/s, idle snapshot", "× %s" % b, "MB/s, deleting", "× %s" % b, "deleting / idle",
                  "max latency ms, idle", "× %s" % b, "max latency ms, deleting", "× %s" % b,
                  "delete command s", "cleaner after s", "drop alone s", "load"], t["dbench"]))
    add("")
    add("**Seed 003 inside a snapshot** (the `dirlog` workload: %s files created, sync, renamed, the "
        "directory fsynced every 100) in a fresh subvolume holding %s files, and in a snapshot of such "
        "a subvolume (its tree wholly shared with the source when the workload starts)." % (
            fmt_count(_snap_first(d, "seed003-snapshot", "files")),
            fmt_count(_snap_first(d, "seed003-snapshot", "source_files"))))
    add("")
    add(md_table(["fs", "total s, subvolume", "× %s" % b, "total s, snapshot", "× %s" % b,
                  "snapshot / subvolume", "dir fsync mean / max ms, subvolume", "snapshot", "load"],
                 t["seed003"]))
    add("")
    return L


SEND_STAGES = (("full", "full"), ("incremental_10", "10 files changed"),
               ("incremental_untar", "a second tree untarred"))


def _send_first(d, key):
    for r in d.recs("send", "send"):
        v = (r.get("metrics") or {}).get(key)
        if v is not None:
            return v
    return None


def send_rows(d):
    """The send section's two tables, as {name: rows}: send (seconds, × the
    base filesystem, stream MiB, tree nodes read where the filesystem says)
    and receive (seconds, × base), one row per filesystem."""
    fss = [f for f in d.fs if d.recs("send", fs=f, ok=None)]
    b = d.base
    rows = {"send": [], "receive": []}
    for f in fss:
        send = [f]
        receive = [f]
        for prefix, _ in SEND_STAGES:
            st = d.stat("send", "send", f, prefix + "_send_s")
            send += [fmt_stat(st, 2), fmt_ratio(ratio(st, d.stat("send", "send", b, prefix + "_send_s"))),
                     fmt_num(((d.stat("send", "send", f, prefix + "_stream_bytes") or {}).get("median") or 0)
                             / float(1 << 20), 2),
                     fmt_stat(d.stat("send", "send", f, prefix + "_nodes_read"), 0)]
            rt = d.stat("send", "send", f, prefix + "_receive_s")
            receive += [fmt_stat(rt, 2), fmt_ratio(ratio(rt, d.stat("send", "send", b, prefix + "_receive_s")))]
        rows["send"].append(send + [fmt_num(d.load("send", "send", f), 1)])
        rows["receive"].append(receive + [fmt_num(d.load("send", "send", f), 1)])
    return rows


def _send_section(d):
    """Issue 26's benchmarks: full and incremental send and receive, birch
    against btrfs."""
    L = []
    add = L.append
    if not d.recs("send", ok=None):
        return L
    b = d.base
    add("## 7. Send and receive (issue 26)")
    add("")
    add("On a fresh filesystem: a tree of %s files (%s MiB) untarred into a subvolume and snapshotted "
        "read-only; its **full** stream; then %s files changed (4 KiB appended to each) and the "
        "stream of the new snapshot against the first; then **a second tree untarred** beside the "
        "first and the stream against the second snapshot. Each send is timed to /dev/null "
        "(`btrfs send` / `birch send -f /dev/null`); the streams, kept, are then received in order "
        "into a directory of the same filesystem (receive + sync, timed). `nodes` = tree nodes "
        "the send read (birch reports it; btrfs does not): it must grow with the change, not with "
        "the tree. Cells: median (min–max over repetitions) and × %s." % (
            fmt_count(_send_first(d, "tree_files")),
            fmt_num((_send_first(d, "tree_bytes") or 0) / float(1 << 20), 0),
            fmt_count(_send_first(d, "changed_files")), b))
    add("")
    t = send_rows(d)
    header = ["fs"]
    for _, label in SEND_STAGES:
        header += ["send s, %s" % label, "× %s" % b, "stream MiB", "nodes"]
    add(md_table(header + ["load"], t["send"]))
    add("")
    header = ["fs"]
    for _, label in SEND_STAGES:
        header += ["receive s, %s" % label, "× %s" % b]
    add(md_table(header + ["load"], t["receive"]))
    add("")
    return L


COMPRESS_CODECS = (("none", "none"), ("zstd", "zstd"), ("fast", "fast (birch lz4, btrfs lzo)"))


def _compress_first(d, key):
    for r in d.recs("compress"):
        v = (r.get("metrics") or {}).get(key)
        if v is not None:
            return v
    return None


def compress_rows(d):
    """The compression section's table: one row per filesystem and codec:
    the mount option, copy + sync seconds and × the base filesystem with
    the same codec, space used (df) and what the codec saved against the
    same filesystem without one, `du -s`, read-back seconds and × base."""
    fss = [f for f in d.fs if d.recs("compress", fs=f, ok=None)]
    b = d.base
    mib = float(1 << 20)
    rows = []
    for f in fss:
        none_used = d.stat("compress", "none", f, "used_bytes")
        for config, label in COMPRESS_CODECS:
            if not d.recs("compress", config, f, ok=None):
                continue
            option = next((r["metrics"].get("mount_option") for r in d.recs("compress", config, f)
                           if r.get("metrics")), None)
            copy = d.stat("compress", config, f, "copy_s")
            used = d.stat("compress", config, f, "used_bytes")
            du = d.stat("compress", config, f, "du_bytes")
            read = d.stat("compress", config, f, "read_s")
            saved = None if config == "none" or not used or not none_used or not none_used["median"] \
                else 100.0 * (1 - used["median"] / none_used["median"])
            rows.append([f, label.split(" (")[0], "`-o %s`" % option if option else "—",
                         fmt_stat(copy, 2), fmt_ratio(ratio(copy, d.stat("compress", config, b, "copy_s"))),
                         fmt_num(used["median"] / mib, 1) if used else "—",
                         "—" if saved is None else "%.0f %%" % saved,
                         fmt_num(du["median"] / mib, 1) if du else "—",
                         fmt_stat(read, 2), fmt_ratio(ratio(read, d.stat("compress", config, b, "read_s"))),
                         fmt_num(d.load("compress", config, f), 1)])
    return rows


def _compress_on_off(d, kind):
    """The filesystems with records of `kind`-none or `kind`-zstd, and per
    filesystem and codec: the config, the mount option and the ratio of a
    metric's median to the same filesystem's without compression and to
    the base filesystem's with the same codec."""
    b = d.base
    for f in d.fs:
        for codec in ("none", "zstd"):
            config = "%s-%s" % (kind, codec)
            if not d.recs("compress", config, f, ok=None):
                continue
            option = next((r["metrics"].get("mount_option") for r in d.recs("compress", config, f)
                           if r.get("metrics")), None)

            def cells(key, digits, config=config, f=f):
                s = d.stat("compress", config, f, key)
                return [fmt_stat(s, digits),
                        fmt_ratio(ratio(s, d.stat("compress", "%s-none" % kind, f, key))),
                        fmt_ratio(ratio(s, d.stat("compress", config, b, key)))]
            yield f, codec, config, "`-o %s`" % option if option else "—", cells


def _mib(d, config, f, key):
    s = d.stat("compress", config, f, key)
    return fmt_num(s["median"] / float(1 << 20), 1) if s else "—"


def compress_fio_rows(d):
    """fio 4 KiB write + fsync with and without compression: per
    filesystem and codec, write p50, fsync p50 and p99 (each × the same
    filesystem without compression and × base with the same codec),
    writes/s, the data birch compressed, load."""
    rows = []
    for f, codec, config, option, cells in _compress_on_off(d, "fio"):
        rows.append([f, codec, option, fmt_stat(d.stat("compress", config, f, "write_p50_us"), 1)]
                    + cells("fsync_p50_us", 1) + cells("fsync_p99_us", 1)
                    + [fmt_stat(d.stat("compress", config, f, "iops"), 0),
                       _mib(d, config, f, "compressed_bytes_in"),
                       fmt_num(d.load("compress", config, f), 1)])
    return rows


def file_flags(d, config, f):
    """The lsattr flags set on the files of `config` on `f` (letters;
    `none` for none), each different set once."""
    sets = []
    for r in d.recs("compress", config, f):
        flags = (r.get("metrics") or {}).get("flags")
        if flags is not None:
            letters = "".join(c for c in flags if c != "-") or "none"
            if letters not in sets:
                sets.append(letters)
    return " / ".join(sets) or "—"


def compress_incompressible_rows(d):
    """Incompressible data with and without compression: per filesystem
    and codec, write + sync seconds (× the same filesystem without
    compression, × base with the same codec), space (df) and du MiB, the
    chunks birch tried that did not shrink and the data it compressed, the
    file's flags, load."""
    rows = []
    for f, codec, config, option, cells in _compress_on_off(d, "incompressible"):
        rows.append([f, codec, option] + cells("write_sync_s", 2)
                    + [_mib(d, config, f, "used_bytes"), _mib(d, config, f, "du_bytes"),
                       fmt_stat(d.stat("compress", config, f, "compress_attempts_failed"), 0),
                       _mib(d, config, f, "compressed_bytes_in"), file_flags(d, config, f),
                       fmt_num(d.load("compress", config, f), 1)])
    return rows


def _compress_section(d):
    """Issue 25's benchmarks, birch against btrfs: a tree copied with each
    codec, fio's write + fsync and incompressible data each without and
    with zstd (the last two tables only when the run has them)."""
    L = []
    add = L.append
    if not d.recs("compress", ok=None):
        return L
    b = d.base
    add("## 8. Transparent compression (issue 25)")
    add("")
    tables = [
        ("On a fresh filesystem per codec: a tree of %s files (%s MiB) untarred and synced (`copy + "
         "sync`, timed together from a warm tarball); `space` = `df` used after minus before; `saved` = "
         "against the same filesystem without compression; `du` = `du -s` of the tree (birch's counts "
         "the compressed blocks, btrfs's the uncompressed size); then unmount, mount, drop_caches and "
         "every file read back (`read`). `fast` is birch's `compress=lz4` against btrfs's "
         "`compress=lzo` (btrfs has no lz4). Cells: median (min–max over repetitions); × %s with the "
         "same codec." % (fmt_count(_compress_first(d, "tree_files")),
                          fmt_num((_compress_first(d, "tree_bytes") or 0) / float(1 << 20), 0), b),
         ["fs", "codec", "mount option", "copy + sync s", "× %s" % b, "space MiB", "saved",
          "du MiB", "read s", "× %s" % b, "load"], compress_rows(d), ["--:"] * 8),
        ("fio's 4 KiB write + fsync job (section 4's) on a fresh filesystem without compression and "
         "with `compress=zstd`, on data fio makes compressible to about half "
         "(`--buffer_compress_percentage=50`): the log path must not get slower with compression on "
         "(`× none`: the same filesystem without compression). Latencies in µs; `compressed MiB`: "
         "what birch's writeback compressed (`birch stats`).",
         ["fs", "codec", "mount option", "write p50", "fsync p50", "× none", "× %s" % b,
          "fsync p99", "× none", "× %s" % b, "writes/s", "compressed MiB", "load"], compress_fio_rows(d),
         ["--:"] * 10),
        ("%s MiB of random data written to one file (1 MiB writes), fsynced and the filesystem "
         "synced, timed together, without compression and with `compress=zstd`: the heuristic "
         "(a chunk that does not shrink stops compression of the file) must keep `zstd` within 5 %% "
         "of `none` (`× none`). `space` = `df` used after minus before; `tried, not shrunk` and "
         "`compressed MiB`: birch's counts of chunks compression was tried on that did not shrink, "
         "and of data it compressed; `flags`: lsattr's of the file (`m`: never compressed again)." % (
             fmt_num((_compress_first(d, "file_bytes") or 0) / float(1 << 20), 0)),
         ["fs", "codec", "mount option", "write + sync s", "× none", "× %s" % b, "space MiB",
          "du MiB", "tried, not shrunk", "compressed MiB", "flags", "load"], compress_incompressible_rows(d),
         ["--:"] * 7 + ["---", "--:"])]
    for intro, header, rows, align in tables:
        if rows:
            add(intro)
            add("")
            add(md_table(header, rows, ["---", "---", "---"] + align))
            add("")
    return L


def _snapshots_timed(d):
    for r in d.recs("snapshots", "snapshot-small"):
        if (r.get("metrics") or {}).get("snapshots_s"):
            return len(r["metrics"]["snapshots_s"])
    return "—"


def fmt_count(n):
    return "—" if n is None else "{:,}".format(int(n))


def _failures_section(d):
    """Everything that produced no numbers, and where the raw outputs are."""
    L = []
    add = L.append
    m = d.meta
    fails = [r for r in d.records if r.get("ok") is False]
    add("## Failures")
    add("")
    if not fails:
        add("None: every measurement produced numbers.")
    else:
        for r in fails:
            add("- %s %s on %s, rep %s: %s" % (r["workload"], r["config"], r["fs"], r["rep"],
                                                (r.get("error") or "").splitlines()[0][:300]))
    if m.get("cleanup_failures"):
        add("- cleanup problems: %s" % ", ".join(m["cleanup_failures"]))
    add("")
    add("## Raw outputs")
    add("")
    add("`results.json` holds every parsed number; `raw/` every dbench, fio (JSON), timing and mkfs "
        "output; `run.log` the commands run. Per-measurement load average (before/after) is in results.json.")
    add("")
    return L


# `bench/run --ablation` (docs/ABLATION.md): what each seed claims (its change
# log) and the metrics that show it here: (claim, [(config, metric, label, the
# seed's change in %, None where it gives no number)]). A metric `op:NAME:KEY`
# is a dbench operation's column.
ABLATION_CLAIMS = {
    "000": ("dbench, 16 clients: +6.5% throughput, -29.4% max latency, -75.8% rename latency", [
        ("000-dbench-16", "throughput_mb_s", "throughput", 6.5),
        ("000-dbench-16", "max_latency_ms", "max latency", -29.4),
        ("000-dbench-16", "op:Rename:avg_ms", "rename latency (avg)", -75.8)]),
    "001": ("dbench, 8 clients: rename max latency 238.7 -> 4.4 ms, unlink 238.6 -> 66.1 ms, "
            "+2.7% throughput", [
                ("001-dbench-8", "op:Rename:max_ms", "rename max latency", -98.1),
                ("001-dbench-8", "op:Unlink:max_ms", "unlink max latency", -72.3),
                ("001-dbench-8", "throughput_mb_s", "throughput", 2.7)]),
    "002": ("dbench, 64 clients: +12.7% throughput, -8.2% max latency", [
        ("002-dbench-64", "throughput_mb_s", "throughput", 12.7),
        ("002-dbench-64", "max_latency_ms", "max latency", -8.2)]),
    "003": ("create/rename script: -43.1% time logging inodes; dbench -S: +25.2% throughput, "
            "-21.5% max latency", [
                ("003-dirlog", "logging_s", "time logging inodes", -43.1),
                ("003-dirlog", "total_s", "script wall time", None),
                ("003-dbench-S", "throughput_mb_s", "dbench -S throughput", 25.2),
                ("003-dbench-S", "max_latency_ms", "dbench -S max latency", -21.5)]),
    "004": ("untar onto a nearly full filesystem no longer 5-20x slower than onto a roomy one", [
        ("004-untar-tight", "total_s", "untar + sync, nearly full", None),
        ("004-untar-roomy", "total_s", "untar + sync, roomy", None)]),
}


def ablation_metric(metrics, key):
    """A metric of an ablation record: a top-level number, or
    `op:NAME:KEY`, one column of a dbench operation."""
    if not metrics:
        return None
    if key.startswith("op:"):
        _, op, col = key.split(":")
        return ((metrics.get("ops") or {}).get(op) or {}).get(col)
    return metrics.get(key)


def ablation_changes(d):
    """(seed, label, the seed's change in % or None, birch's change in % or
    None, before, after, config, before setup) per claimed number of a
    seed that ran: birch with the seed's mechanism switched off ("before")
    and on ("after"), medians over repetitions."""
    out = []
    for seed, (_, metrics) in ABLATION_CLAIMS.items():
        before_fs = "birch-ablate-" + seed
        if not d.recs("ablation", fs=before_fs):
            continue
        for config, key, label, claimed in metrics:
            b, a = (parsers.summarize([ablation_metric(r["metrics"], key)
                                       for r in d.recs("ablation", config, fs)])
                    for fs in (before_fs, "birch"))
            delta = None
            if a and b and b["median"]:
                delta = 100.0 * (a["median"] - b["median"]) / b["median"]
            out.append((seed, label, claimed, delta, b, a, config, before_fs))
    return out


def ablation_rows(d):
    """The rows of the seeds' tables: seed, metric, the seed's claim,
    birch before and after, birch's change, the switch's counter."""
    return [[seed, label, "—" if claimed is None else "%+.1f%%" % claimed, fmt_stat(b), fmt_stat(a),
             "—" if delta is None else "%+.1f%%" % delta, ablation_evidence(d, config, before_fs)]
            for seed, label, claimed, delta, b, a, config, before_fs in ablation_changes(d)]


# The counter that shows each seed's switch took its path (docs/ABLATION.md).
ABLATION_EVIDENCE = {"000": "log_syncs", "001": "delayed_item_flushes", "002": "log_base_wait_nanos",
                     "003": "delayed_item_flushes", "004": "reclaim_pages"}


def ablation_evidence(d, config, before_fs):
    """`counter: before / after` (medians per run) of the seed's counter."""
    seed = before_fs[len("birch-ablate-"):]
    name = ABLATION_EVIDENCE.get(seed)
    cells = []
    for fs in (before_fs, "birch"):
        s = parsers.summarize([((r.get("metrics") or {}).get("counters") or {}).get(name)
                               for r in d.recs("ablation", config, fs)])
        cells.append(fmt_num(s["median"], 0) if s else "—")
    if cells == ["—", "—"]:
        return "—"
    return "%s: %s / %s" % (name, cells[0], cells[1])


def ablation_full_over_roomy(d):
    """Seed 004's figure: untar time nearly full / roomy, before and after."""
    out = []
    for fs in ("birch-ablate-004", "birch"):
        tight = d.stat("ablation", "004-untar-tight", fs, "total_s")
        roomy = d.stat("ablation", "004-untar-roomy", fs, "total_s")
        out.append(ratio(tight, roomy))
    return out


def _ablation_section(d, made):
    """`bench/run --ablation`: the seeds' tables beside birch's deltas."""
    L = []
    add = L.append
    rows = ablation_rows(d)
    if not rows:
        return L
    add("## The seeds' tables: each seed's mechanism switched off in birch (`bench/run --ablation`)")
    add("")
    add("Each seed's own benchmark on `birch` (the mechanism, \"after\") and on `birch-ablate-ID` "
        "(`-o ablate=ID`: the behaviour the seed removed, \"before\"; docs/ABLATION.md), back to back "
        "in every repetition, the pair's order flipped each repetition. `birch's change` = after against "
        "before, as the seeds state theirs; cells are medians (min–max). The last column is the counter "
        "that shows the switch took its path (median per run, before / after).")
    add("")
    add(md_table(["seed", "metric", "seed's claim", "birch before", "birch after", "birch's change",
                  "switch's counter"], rows, ["---", "---"] + ["--:"] * 4 + ["---"]))
    add("")
    if "ablation_changes.png" in made:
        add("![ablation_changes](plots/ablation_changes.png)")
        add("")
    before, after = ablation_full_over_roomy(d)
    if before is not None or after is not None:
        add("Seed 004's figure, untar time nearly full / roomy: before %s, after %s (the seed: 5–20× "
            "before, about ×1 after)." % (fmt_ratio(before), fmt_ratio(after)))
        add("")
    for seed, (claim, _) in ABLATION_CLAIMS.items():
        if d.recs("ablation", fs="birch-ablate-" + seed):
            add("- %s: %s." % (seed, claim))
    add("")
    return L


def build_report(results, title, made=(), plot_err=None):
    """report.md's text from a results.json document (pure: no files, so
    it can be tested on recorded results).  `made`: the plot files to show;
    `plot_err`: why there are none."""
    d = Data(results)
    sections = (_header(d, title), _headline_section(d, made, plot_err), _ablation_section(d, made), _dbench_section(d),
                _dirlog_section(d), _untar_section(d), _fio_section(d), _embedded_section(d),
                _snapshots_section(d), _send_section(d), _compress_section(d), _dup_section(d),
                _requests_section(d), _floor_section(d), _failures_section(d))
    return "\n".join(line for s in sections for line in s) + "\n"


def write_report(out_dir, plots=True, no_plots_reason=None):
    """Write OUT_DIR/report.md (and OUT_DIR/plots/) from OUT_DIR/results.json."""
    with open(os.path.join(out_dir, "results.json")) as f:
        results = json.load(f)
    made = []
    plot_err = None
    if plots:
        try:
            made = make_plots(Data(results), os.path.join(out_dir, "plots"))
        except Exception as e:  # noqa: BLE001
            plot_err = "plotting failed: %s" % e
    else:
        plot_err = no_plots_reason or "plots disabled"
    text = build_report(results, os.path.basename(os.path.normpath(out_dir)), made, plot_err)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(text)
    return os.path.join(out_dir, "report.md")


def main(argv):
    """`bench/report.py RESULTS_DIR`: rebuild a run's report and plots."""
    if len(argv) != 1:
        print("usage: report.py RESULTS_DIR", file=sys.stderr)
        return 2
    print(write_report(argv[0]))
    return 0
