"""Self-test of the benchmark harness's pieces that need neither root nor
time: the parsers against recorded outputs, option parsing, the measurement
plan, the setups' commands, and the report built from recorded results.

Runs without root and without dbench/fio installed:
    python3 -m pytest bench/test_parse.py      (or)
    python3 bench/test_parse.py

The samples in bench/testdata/ were captured from real runs of bench/run on
the project's machine (dbench 4.00, fio 3.33), plus one table copied from
seed 001, whose rows are wrapped and padded with non-breaking spaces;
report-*/ hold the results.json of real runs (and, for one, the report.md
that run wrote).
"""

import json
import os
import statistics
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import floor, fusetrace, options, parsers, report, runner  # noqa: E402
from harness.context import RunContext  # noqa: E402
from harness.procs import CmdError  # noqa: E402
from harness.setups import SETUPS  # noqa: E402
from harness.workloads import WORKLOADS  # noqa: E402
from harness.workloads import snapshots  # noqa: E402
from harness.workloads.embedded import parse_phase_times  # noqa: E402

DATA = os.path.join(HERE, "testdata")
DBENCH_OPS = ["NTCreateX", "Close", "Rename", "Unlink", "Deltree", "Mkdir", "Qpathinfo",
              "Qfileinfo", "Qfsinfo", "Sfileinfo", "Find", "WriteX", "ReadX", "LockX",
              "UnlockX", "Flush"]


def read(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return f.read()


class BirchRequests(unittest.TestCase):
    # `birch stats --json`, shortened.
    STATS = ('{\n  "uptime_seconds": 2.187,\n  "commits": 1,\n  "fuse_requests_total": 7,\n'
             '  "fuse_requests": {\n    "LOOKUP": 3,\n    "GETATTR": 4,\n    "READ": 0,\n'
             '    "other": 0\n  }\n}\n')

    def test_parse(self):
        self.assertEqual(parsers.parse_birch_requests(self.STATS),
                         {"total": 7, "GETATTR": 4, "LOOKUP": 3})
        # The Debug text of a birch from before --json.
        self.assertIsNone(parsers.parse_birch_requests("SpaceStats {\n}\n"))
        self.assertIsNone(parsers.parse_birch_requests('{"commits": 1}'))

    def test_report_rows(self):
        rec = {"workload": "dirlog", "config": "seed003", "fs": "birch", "ok": True,
               "metrics": {"files": 10, "fuse_requests": {"total": 40, "LOOKUP": 20, "GETATTR": 20}}}
        d = report.Data({"meta": {}, "records": [rec, dict(rec)]})
        rows = report.requests_rows(d)
        self.assertEqual(len(rows), 1)
        self.assertEqual(rows[0][:4], ["dirlog seed003", "birch", "40", "2.00"])
        self.assertIn("LOOKUP 20 (1.00)", rows[0][4])


class RequestFloor(unittest.TestCase):
    # bench/request-floor's output on this machine (2026-11-25).
    OUTPUT = ("devfuse  stat on birch 33.9 us, on the host fs 1.3 us: one GETATTR round trip 16.3 us\n"
              "         requests during the loop: 40000\n"
              "uring    stat on birch 25.0 us, on the host fs 1.2 us: one GETATTR round trip 11.9 us\n"
              "         requests during the loop: 40000\n")

    def test_parse(self):
        self.assertEqual(floor.parse_request_floor(self.OUTPUT), {"devfuse": 16.3, "uring": 11.9})
        self.assertEqual(floor.parse_request_floor("birch did not mount\n"), {})

    def test_mean_of_start_and_end(self):
        runs = [{"when": "start", "devfuse": 16.0, "uring": 12.0}, {"when": "end", "devfuse": 35.0}]
        self.assertEqual(floor.mean_floor(runs), {"devfuse": 25.5, "uring": 12.0})

    def test_times_floor_per_transport(self):
        def rec(fs, rep, total_s, requests, transport):
            return {"workload": "untar", "config": "roomy", "fs": fs, "rep": rep, "ok": True,
                    "metrics": {"total_s": total_s, "tree_files": 10, "fuse_transport": transport,
                                "fuse_requests": {"total": requests, "WRITE": requests}}}
        d = report.Data({"meta": {"request_floor_us": {"devfuse": 20.0, "uring": 10.0}}, "records": [
            rec("birch", 1, 2.0, 50000, "io_uring (2 queues x 16 entries)"),
            rec("birch", 2, 3.0, 50000, "io_uring (2 queues x 16 entries)"),
            rec("fuse2fs", 1, 4.0, 100000, "/dev/fuse"),
            # dbench's clients overlap: no floor ratio
            {"workload": "dbench", "config": "1", "fs": "birch", "rep": 1, "ok": True,
             "metrics": {"throughput_mb_s": 1.0, "fuse_requests": {"total": 5}}}]})
        rows = {r[1]: r for r in report.floor_rows(d)}
        self.assertEqual(sorted(rows), ["birch", "fuse2fs"])
        # 2.0 s / 50,000 = 40 µs per request, 10 µs on io_uring: ×4; 3.0 s: ×6; median ×5
        self.assertEqual(rows["birch"][2], "uring")
        self.assertEqual(rows["birch"][7], "×5.00")
        # 4.0 s / 100,000 = 40 µs against 20 µs on /dev/fuse
        self.assertEqual(rows["fuse2fs"][2:], ["devfuse", "4.00", "100000", "40.0", "20.0", "×2.00"])

    def test_no_floor_no_ratio(self):
        d = report.Data({"meta": {"request_floor_error": "no birch"}, "records": [
            {"workload": "dirlog", "config": "seed003", "fs": "fuse2fs", "rep": 1, "ok": True,
             "metrics": {"total_s": 1.0, "fuse_requests": {"total": 1000}}}]})
        self.assertEqual(report.floor_rows(d)[0][7], "—")
        self.assertIn("not measured: no birch", report.build_report({"meta": d.meta, "records": d.records}, "t"))


class OptionalSetups(unittest.TestCase):
    def test_fuse2fs_is_skipped_when_it_cannot_be_installed(self):
        ctx = RunContext(resolve("--birch-bin", sys.executable))
        self.assertIn("fuse2fs", ctx.opts.fs_list)

        def no_apt(tools, force=False):
            raise CmdError("apt-get not available; install by hand: fuse2fs")
        ctx.installer.ensure_tools = no_apt
        runner.drop_unavailable_setups(ctx)
        self.assertNotIn("fuse2fs", ctx.opts.fs_list)
        self.assertIn("birch", ctx.opts.fs_list)
        self.assertEqual(ctx.meta["skipped_setups"], {"fuse2fs": "apt-get not available; install by hand: fuse2fs"})
        self.assertEqual([p.target for p in runner.plan([WORKLOADS["dirlog"](ctx)])],
                         ["tmpfs-floor", "btrfs", "ext4", "xfs", "birch", "birch-file", "birch-single"])


class FuseTrace(unittest.TestCase):
    def test_opcode_of_a_trace_line(self):
        line = (b"  tar-10988   [001] ...1. 11153.496763: fuse_request_send: connection 39 req 8 "
                b"opcode 22 (FUSE_GETXATTR) len 56 \n")
        self.assertEqual(fusetrace.OPCODE.findall(line), [b"GETXATTR"])


class DbenchParser(unittest.TestCase):
    def test_plain_run(self):
        p = parsers.parse_dbench(read("dbench-btrfs-4clients.txt"))
        self.assertEqual(p["clients"], 4)
        self.assertEqual(p["procs"], 4)
        self.assertFalse(p["sync_dirs"])
        self.assertAlmostEqual(p["throughput_mb_s"], 514.19)
        self.assertAlmostEqual(p["max_latency_ms"], 24.809)
        self.assertEqual(p["op_order"], DBENCH_OPS)
        self.assertEqual(p["ops"]["NTCreateX"], {"count": 61238, "avg_ms": 0.021, "max_ms": 8.074})
        self.assertEqual(p["ops"]["Flush"], {"count": 4309, "avg_ms": 2.372, "max_ms": 24.806})
        # the progress lines ("   4  12345  500.00 MB/sec  execute ...") are not ops
        self.assertNotIn("execute", p["ops"])

    def test_sync_dirs_run(self):
        p = parsers.parse_dbench(read("dbench-xfs-4clients-sync-dirs.txt"))
        self.assertTrue(p["sync_dirs"])
        self.assertEqual(p["clients"], 4)
        self.assertAlmostEqual(p["throughput_mb_s"], 494.042)
        self.assertAlmostEqual(p["max_latency_ms"], 4.319)
        self.assertEqual(len(p["ops"]), 16)

    def test_seed_table_with_wrapped_rows_and_nbsp(self):
        p = parsers.parse_dbench(read("dbench-seed001-wrapped-rows.txt"))
        self.assertEqual(p["op_order"], DBENCH_OPS)
        self.assertEqual(p["ops"]["NTCreateX"], {"count": 4113896, "avg_ms": 0.009, "max_ms": 238.665})
        self.assertEqual(p["ops"]["ReadX"]["count"], 6449786)
        self.assertEqual(p["clients"], 8)
        self.assertAlmostEqual(p["throughput_mb_s"], 1075.73)
        self.assertAlmostEqual(p["max_latency_ms"], 245.52)

    def test_run_beside_a_background_deletion(self):
        # the snapshots workload's dbench-4-bgdelete on birch (a --quick run)
        p = parsers.parse_dbench(read("dbench-birch-4clients-bgdelete.txt"))
        self.assertEqual((p["clients"], p["sync_dirs"]), (4, False))
        self.assertAlmostEqual(p["throughput_mb_s"], 66.8036)
        self.assertAlmostEqual(p["max_latency_ms"], 312.627)
        self.assertEqual(p["ops"]["Flush"], {"count": 508, "avg_ms": 14.843, "max_ms": 60.088})

    def test_roundtrip_through_seed_layout(self):
        p = parsers.parse_dbench(read("dbench-btrfs-4clients.txt"))
        q = parsers.parse_dbench(parsers.format_dbench_table(p))
        self.assertEqual(p["ops"], q["ops"])
        self.assertEqual(p["throughput_mb_s"], q["throughput_mb_s"])
        s = parsers.parse_dbench(parsers.format_dbench_table(
            parsers.parse_dbench(read("dbench-xfs-4clients-sync-dirs.txt"))))
        self.assertTrue(s["sync_dirs"])

    def test_truncated_output_is_an_error(self):
        text = read("dbench-btrfs-4clients.txt")
        with self.assertRaises(parsers.ParseError):
            parsers.parse_dbench(text.split("Throughput")[0])
        with self.assertRaises(parsers.ParseError):
            parsers.parse_dbench("Throughput 1.0 MB/sec  1 clients  1 procs  max_latency=1.000 ms\n")


class FioParser(unittest.TestCase):
    def test_filesystem_write_fsync(self):
        p = parsers.parse_fio(read("fio-btrfs-write-fsync.json"))
        self.assertEqual(p["ios"], 5181)
        self.assertEqual(p["fsync_count"], 5181)
        self.assertAlmostEqual(p["fsync_p50_us"], 724.992)
        self.assertAlmostEqual(p["fsync_p99_us"], 1155.072)
        self.assertAlmostEqual(p["fsync_max_us"], 3692.285)
        self.assertAlmostEqual(p["write_p50_us"], 10.304)
        self.assertAlmostEqual(p["write_p99_us"], 24.96)
        self.assertGreater(p["iops"], 0)
        self.assertAlmostEqual(p["op_mean_us"], p["write_mean_us"] + p["fsync_mean_us"])

    def test_raw_device_floor(self):
        p = parsers.parse_fio(read("fio-raw-loop-direct-fsync.json"))
        self.assertGreater(p["ios"], 1000)
        self.assertLess(p["fsync_p50_us"], p["fsync_p99_us"])
        self.assertLessEqual(p["fsync_p99_us"], p["fsync_max_us"])
        self.assertEqual(p["fsync_count"], p["ios"])

    def test_random_write_in_a_subvolume_with_snapshots(self):
        # the snapshots workload's job: --rw=randwrite --time_based, on birch
        # with 10 snapshots of the subvolume (a --quick run)
        p = parsers.parse_fio(read("fio-birch-randwrite-10-snapshots.json"))
        self.assertEqual((p["ios"], p["fsync_count"]), (206, 206))
        self.assertAlmostEqual(p["fsync_p50_us"], 20054.016)
        self.assertAlmostEqual(p["fsync_p99_us"], 32112.64)
        self.assertAlmostEqual(p["write_p50_us"], 81.408)

    def test_leading_noise_and_dict_input(self):
        text = read("fio-btrfs-write-fsync.json")
        noisy = "fio: some warning printed before the JSON\n" + text
        self.assertEqual(parsers.parse_fio(noisy), parsers.parse_fio(text))
        self.assertEqual(parsers.parse_fio(json.loads(text)), parsers.parse_fio(text))

    def test_no_fsync_is_an_error(self):
        d = json.loads(read("fio-btrfs-write-fsync.json"))
        d["jobs"][0]["sync"] = {"total_ios": 0, "lat_ns": {}}
        with self.assertRaises(parsers.ParseError):
            parsers.parse_fio(d)
        with self.assertRaises(parsers.ParseError):
            parsers.parse_fio("not json")


class Aggregation(unittest.TestCase):
    def test_summarize(self):
        self.assertEqual(parsers.summarize([3, 1, 2]), {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3})
        self.assertEqual(parsers.summarize([None, 4])["median"], 4.0)
        self.assertIsNone(parsers.summarize([]))

    def test_missing_numbers(self):
        planned = [runner.Planned("fio", "4k-write-fsync", f, "fsync_p50_us")
                   for f in ("raw-loop", "host-file", "btrfs")]
        recs = [{"workload": "fio", "config": "4k-write-fsync", "fs": f, "ok": True,
                 "metrics": {"fsync_p50_us": 1.0}} for f in ("raw-loop", "host-file", "btrfs")]
        self.assertEqual(runner.missing_numbers(planned, recs, 1), [])
        recs[2]["ok"] = False
        recs[2]["error"] = "boom\nmore"
        missing = runner.missing_numbers(planned, recs, 1)
        self.assertEqual(missing, ["fio 4k-write-fsync on btrfs: 0 of 1 repetitions produced numbers (boom)"])
        # two repetitions asked for, one done
        self.assertEqual(len(runner.missing_numbers(planned[:1], recs[:1], 2)), 1)
        # a record without its key metric does not count
        recs[0]["metrics"] = {"fsync_p50_us": None}
        self.assertEqual(len(runner.missing_numbers(planned[:1], recs[:1], 1)), 1)


def resolve(*argv, repo_dir=None):
    """Options as bench/run would resolve them (repo_dir: where to look for a
    birch build when --fs asks for birch without --birch-bin)."""
    return options.resolve(options.parse_args(argv), list(argv), repo_dir or HERE)


def executable(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(path, 0o755)
    return path


class Options(unittest.TestCase):
    def test_full_and_quick_defaults(self):
        full = resolve()
        self.assertEqual((full.duration, full.repeat, full.dirlog_files), (60, 3, 10000))
        self.assertEqual((full.roomy_size, full.tight_size), (4096 << 20, 1843 << 20))
        self.assertEqual(full.fs_list, ["btrfs", "ext4", "xfs"])
        self.assertEqual(full.workloads, ["dbench", "dirlog", "untar", "fio", "embedded", "snapshots", "send",
                                          "compress"])
        self.assertIsNone(full.birch_bin)
        quick = resolve("--quick", "--repeat", "2")
        self.assertEqual((quick.duration, quick.repeat, quick.dirlog_files), (4, 2, 1000))
        self.assertEqual((quick.roomy_size, quick.tight_size), (1024 << 20, 512 << 20))
        self.assertEqual(resolve("--untar-sizes", "300,200").tight_size, 200 << 20)

    def test_birch_bin_adds_every_birch_setup(self):
        with tempfile.TemporaryDirectory() as tmp:
            birch = executable(os.path.join(tmp, "birch"))
            o = resolve("--quick", "--birch-bin", birch)
            self.assertEqual(o.birch_bin, os.path.realpath(birch))
            self.assertEqual(o.fs_list, ["btrfs", "ext4", "xfs", "birch", "birch-file", "birch-single",
                                         "fuse2fs"])
            # an explicit list is taken as given
            self.assertEqual(resolve("--birch-bin", birch, "--fs", "birch-single,btrfs").fs_list,
                             ["birch-single", "btrfs"])

    def test_birch_without_birch_bin_uses_a_build_of_the_checkout(self):
        with tempfile.TemporaryDirectory() as repo:
            path = os.environ["PATH"]
            os.environ["PATH"] = repo          # no `birch` on PATH
            try:
                with self.assertRaisesRegex(options.UsageError, "no birch binary found"):
                    resolve("--fs", "birch", repo_dir=repo)
                built = executable(os.path.join(repo, "target", "debug", "birch"))
                self.assertEqual(resolve("--fs", "birch", repo_dir=repo).birch_bin, os.path.realpath(built))
            finally:
                os.environ["PATH"] = path

    def test_bad_usage(self):
        for argv, msg in ((["--fs", "btrfs,zfs"], "unknown filesystem.*zfs"),
                          (["--workloads", "dbench,bonnie"], "unknown workload.*bonnie"),
                          (["--birch-bin", "/nonexistent/birch"], "not an executable file"),
                          (["--untar-sizes", "300"], "ROOMY,TIGHT")):
            with self.assertRaisesRegex(options.UsageError, msg):
                resolve(*argv)


class Plan(unittest.TestCase):
    def plan(self, *argv):
        ctx = RunContext(resolve(*argv))
        return [(p.workload, p.config, p.target) for p in
                runner.plan(WORKLOADS[w](ctx) for w in ctx.opts.workloads)]

    def test_order_and_floors(self):
        # workloads in the order asked for; filesystems interleaved inside
        p = self.plan("--fs", "xfs,btrfs", "--workloads", "dirlog,fio,untar")
        self.assertEqual(p, [("dirlog", "seed003", "tmpfs-floor"), ("dirlog", "seed003", "xfs"),
                             ("dirlog", "seed003", "btrfs"),
                             ("fio", "4k-write-fsync", "raw-loop"), ("fio", "4k-write-fsync", "host-file"),
                             ("fio", "4k-write-fsync", "xfs"), ("fio", "4k-write-fsync", "btrfs"),
                             ("untar", "roomy", "xfs"), ("untar", "roomy", "btrfs"),
                             ("untar", "tight", "xfs"), ("untar", "tight", "btrfs")])
        dbench = self.plan("--fs", "ext4", "--workloads", "dbench")
        self.assertEqual([c for _, c, _ in dbench], ["1", "4", "8", "4-S"])

    def test_embedded_only_with_birch_or_a_command(self):
        self.assertEqual(self.plan("--workloads", "embedded"), [])
        self.assertEqual(self.plan("--workloads", "embedded", "--birch-embedded-cmd", "true"),
                         [("embedded", "seed003", "birch-embedded")])

    def test_snapshots_run_on_btrfs_and_birch_only(self):
        ctx = RunContext(resolve("--workloads", "snapshots", "--fs", "ext4,birch,btrfs,birch-file",
                                 "--birch-bin", sys.executable))
        planned = runner.plan([WORKLOADS["snapshots"](ctx)])
        configs = ["snapshot-small", "snapshot-large", "fio-0-snapshots", "fio-snapshots",
                   "dbench-4", "dbench-4-bgdelete", "seed003-subvolume", "seed003-snapshot"]
        self.assertEqual([(p.config, p.target) for p in planned],
                         [(c, f) for c in configs for f in ("birch", "btrfs")])
        # each configuration names the metric it must produce
        self.assertEqual({p.config: p.key_metric for p in planned},
                         {"snapshot-small": "snapshot_s", "snapshot-large": "snapshot_s",
                          "fio-0-snapshots": "fsync_p50_us", "fio-snapshots": "fsync_p50_us",
                          "dbench-4": "throughput_mb_s", "dbench-4-bgdelete": "throughput_mb_s",
                          "seed003-subvolume": "total_s", "seed003-snapshot": "total_s"})
        self.assertEqual(self.plan("--workloads", "snapshots", "--fs", "ext4,xfs"), [])

    def test_compress_plan(self):
        """The tree per codec, then fio and the incompressible write each
        without and with zstd (zstd first every other repetition), on btrfs
        and birch only; each configuration names the metric it must
        produce; quick mode writes less."""
        ctx = RunContext(resolve("--workloads", "compress", "--fs", "ext4,btrfs,birch", "--birch-bin", sys.executable))
        planned = runner.plan([WORKLOADS["compress"](ctx)])
        configs = [("none", "copy_s"), ("zstd", "copy_s"), ("fast", "copy_s"),
                   ("fio-none", "fsync_p50_us"), ("fio-zstd", "fsync_p50_us"),
                   ("incompressible-none", "write_sync_s"), ("incompressible-zstd", "write_sync_s")]
        self.assertEqual([(p.config, p.target, p.key_metric) for p in planned],
                         [(c, f, k) for c, k in configs for f in ("btrfs", "birch")])
        # the next repetition measures zstd first, then none
        w = WORKLOADS["compress"](ctx)
        w.measurements()
        self.assertEqual([(m.config, m.target) for m in w.measurements()][6:],
                         [(c, f) for c in ("fio-zstd", "fio-none", "incompressible-zstd", "incompressible-none")
                          for f in ("btrfs", "birch")])
        self.assertEqual(w.incompressible_bytes, 1 << 30)
        self.assertLess(WORKLOADS["compress"](RunContext(resolve("--quick"))).incompressible_bytes, 1 << 30)

    def test_snapshot_sizes_full_and_quick(self):
        full = WORKLOADS["snapshots"](RunContext(resolve())).sizes
        self.assertEqual((full.small_files, full.large_files, full.fio_snapshots), (1000, 100_000, 100))
        quick = WORKLOADS["snapshots"](RunContext(resolve("--quick"))).sizes
        self.assertEqual(quick, snapshots.QUICK)
        self.assertLess(quick.large_files, full.large_files)

    def test_fill_makes_empty_files_a_thousand_to_a_directory(self):
        with tempfile.TemporaryDirectory() as tmp:
            snapshots.fill(tmp, 2500)
            self.assertEqual(sorted(os.listdir(tmp)), ["d0000", "d0001", "d0002"])
            self.assertEqual([len(os.listdir(os.path.join(tmp, d))) for d in sorted(os.listdir(tmp))],
                             [1000, 1000, 500])
            self.assertEqual(os.path.getsize(os.path.join(tmp, "d0002", "f499")), 0)

    def test_phase_times_on_stdout(self):
        self.assertEqual(parse_phase_times("note\ncreate_s=1.5 sync_s=0.25 rename_s=2 x=y\n"),
                         {"create_s": 1.5, "sync_s": 0.25, "rename_s": 2.0})
        self.assertIsNone(parse_phase_times("create_s=1.5 only"))


class Setups(unittest.TestCase):
    def test_mkfs_commands(self):
        ctx = RunContext(resolve("--birch-bin", sys.executable))
        mkfs = {name: s.format_argv(ctx, s.mkfs, target="/dev/loop9") for name, s in SETUPS.items()}
        self.assertEqual(mkfs["btrfs"], ["mkfs.btrfs", "-f", "-m", "single", "-d", "single", "/dev/loop9"])
        self.assertEqual(mkfs["birch"], [ctx.opts.birch_bin, "mkfs", "/dev/loop9", "--metadata", "dup"])
        self.assertEqual(mkfs["birch-single"][-2:], ["--metadata", "single"])
        self.assertFalse(SETUPS["birch-file"].uses_loop)
        self.assertTrue(SETUPS["birch-single"].uses_loop)
        self.assertEqual(mkfs["fuse2fs"], ["mkfs.ext4", "-F", "/dev/loop9"])
        self.assertEqual(SETUPS["fuse2fs"].kind, "fuse")
        self.assertTrue(SETUPS["fuse2fs"].uses_loop)

    def test_subvolume_commands(self):
        ctx = RunContext(resolve("--birch-bin", sys.executable))
        snap = {name: s.format_argv(ctx, s.subvolumes.snapshot, src="/m/sv", dst="/m/snap-1")
                for name, s in SETUPS.items() if s.subvolumes}
        self.assertEqual(snap, {
            "btrfs": ["btrfs", "subvolume", "snapshot", "/m/sv", "/m/snap-1"],
            "birch": [ctx.opts.birch_bin, "subvolume", "snapshot", "/m/sv", "/m/snap-1"],
            "birch-file": [ctx.opts.birch_bin, "subvolume", "snapshot", "/m/sv", "/m/snap-1"],
            "birch-single": [ctx.opts.birch_bin, "subvolume", "snapshot", "/m/sv", "/m/snap-1"]})
        # deleting commits, so that the cleaner starts at once on both
        self.assertEqual(SETUPS["btrfs"].subvolumes.delete[-2:], ["-c", "{path}"])
        self.assertEqual(SETUPS["birch"].subvolumes.delete[-2:], ["-c", "{path}"])
        self.assertIsNone(SETUPS["ext4"].subvolumes)

    def test_send_commands(self):
        """The send workload runs the same command line on both, but for
        the binary: btrfs-progs' options, which birch's send takes."""
        ctx = RunContext(resolve("--birch-bin", sys.executable))
        for name, tool in (("btrfs", "btrfs"), ("birch", ctx.opts.birch_bin)):
            s = SETUPS[name]
            self.assertEqual(s.format_argv(ctx, s.subvolumes.send_incremental, parent="/m/s1", out="/dev/null",
                                           snap="/m/s2"),
                             [tool, "send", "-p", "/m/s1", "-f", "/dev/null", "/m/s2"])
            self.assertEqual(s.format_argv(ctx, s.subvolumes.receive, stream="/w/full.stream", dir="/m/r"),
                             [tool, "receive", "-f", "/w/full.stream", "/m/r"])
            self.assertEqual(s.format_argv(ctx, s.subvolumes.snapshot_ro, src="/m/sv", dst="/m/s1"),
                             [tool, "subvolume", "snapshot", "-r", "/m/sv", "/m/s1"])

    def test_send_workload_helpers(self):
        from harness.workloads import send
        self.assertEqual(send.nodes_read("At subvol /m/s2\n0.0 MiB, 10 inodes, 52 commands, 7 tree nodes read\n"), 7)
        self.assertIsNone(send.nodes_read("At subvol /m/s2\n"))
        with tempfile.TemporaryDirectory() as tmp:
            for d, names in (("b", ["z", "y"]), ("a", ["empty", "x"])):
                os.mkdir(os.path.join(tmp, d))
                for n in names:
                    with open(os.path.join(tmp, d, n), "w") as f:
                        f.write("" if n == "empty" else "data")
            # sorted walk, empty files skipped: a/x, then b/y
            self.assertEqual(send.append_to_files(tmp, 2, 3), [os.path.join(tmp, "a", "x"), os.path.join(tmp, "b", "y")])
            with open(os.path.join(tmp, "a", "x")) as f:
                self.assertEqual(f.read(), "datasss")
            with self.assertRaisesRegex(Exception, "only 3 non-empty files"):
                send.append_to_files(tmp, 5, 1)

    def test_descriptions_pair_dup_with_single(self):
        table = {n: s.describe() for n, s in SETUPS.items()}
        d = report.Data({"meta": {"fs": list(SETUPS), "fs_table": table}, "records": []})
        self.assertEqual(report.dup_pairs(d), [("birch", "birch-single")])
        self.assertEqual(table["btrfs"]["mount_opts"], "ssd")


def load_results(name):
    with open(os.path.join(DATA, name, "results.json"), encoding="utf-8") as f:
        return json.load(f)


class Report(unittest.TestCase):
    def test_recorded_run_rebuilds_its_report(self):
        """The report format is unchanged: a real run's results.json gives
        back, byte for byte, the report.md that run wrote."""
        results = load_results("report-direct-io")
        made = ["dbench_throughput.png", "dbench_max_latency.png", "fio_fsync_latency.png"]
        text = report.build_report(results, "2026-11-21T1108Z-vm-direct-io", made)
        self.assertEqual(text, read(os.path.join("report-direct-io", "report.md")))

    def test_dup_cost_section(self):
        results = load_results("report-quick-dup")
        text = report.build_report(results, "quick", plot_err="test")
        self.assertIn("## DUP metadata: birch against birch-single", text)
        d = report.Data(results)

        def median(fs, workload, config, key):
            return statistics.median(r["metrics"][key] for r in results["records"]
                                     if (r["workload"], r["config"], r["fs"]) == (workload, config, fs)
                                     and r["ok"])
        for label, workload, config, key in (
                ("seed 003 create + dir fsync, s", "dirlog", "seed003", "create_s"),
                ("untar + sync, nearly full fs, s", "untar", "tight", "total_s"),
                ("fio fsync p50, µs", "fio", "4k-write-fsync", "fsync_p50_us")):
            dup, single = median("birch", workload, config, key), median("birch-single", workload, config, key)
            row = next(r for r in report.dup_rows(d, "birch", "birch-single") if r[0] == label)
            self.assertEqual(row[2:], [report.fmt_num(dup), report.fmt_num(single), "×%.2f" % (dup / single)])
            self.assertIn("| %s |" % " | ".join(row), text)

    def test_no_dup_section_without_recorded_metadata(self):
        # results from before birch-single existed: birch has no "metadata"
        results = load_results("report-direct-io")
        self.assertEqual(report.dup_pairs(report.Data(results)), [])
        self.assertNotIn("DUP metadata", report.build_report(results, "old"))

    def test_every_section_of_a_quick_run(self):
        results = load_results("report-quick-dup")
        text = report.build_report(results, "quick", plot_err="test")
        for heading in ("## Headline", "## 1. dbench", "## 2. Seed 003", "## 3. Seed 004", "## 4. fio",
                        "## 5. birch embedded", "## DUP metadata", "## Failures"):
            self.assertIn(heading, text)
        # every setup of the run is a column of the headline
        self.assertIn("| metric | better | %s |" % " | ".join(results["meta"]["fs"]), text)

    def test_snapshots_section(self):
        """Section 6 from a --quick run of the snapshots workload: every cell
        is the median of its records, every ratio theirs."""
        results = load_results("report-snapshots-quick")
        text = report.build_report(results, "quick", plot_err="test")
        self.assertIn("## 6. Subvolumes and snapshots", text)
        self.assertIn("| fs | 100 files: s | × btrfs | 2,000 files: s |", text)
        self.assertIn("p50, 10 snapshots", text)
        # the job's parameters come from the records, not from the run's
        # meta (which a later run into the same --out replaces)
        self.assertIn("--time_based --runtime=4 --size=8m", text)
        self.assertIn("`dbench -c client.txt -t 4 4`", text)
        self.assertIn("1,000 files created, sync, renamed", text)
        self.assertIn("a fresh subvolume holding 100 files", text)
        results["meta"] = {"fs": results["meta"]["fs"]}
        self.assertIn("--time_based --runtime=4 --size=8m", report.build_report(results, "q"))
        rows = report.snapshot_rows(report.Data(results))

        def metric(fs, config, key):
            return statistics.median(r["metrics"][key] for r in results["records"]
                                     if (r["workload"], r["config"], r["fs"]) == ("snapshots", config, fs))

        birch = {name: next(r for r in t if r[0] == "birch") for name, t in rows.items()}
        small, large = metric("birch", "snapshot-small", "snapshot_s"), metric("birch", "snapshot-large", "snapshot_s")
        self.assertEqual(birch["snapshot"][1:6], [
            report.fmt_num(small, 3), "×%.2f" % (small / metric("btrfs", "snapshot-small", "snapshot_s")),
            report.fmt_num(large, 3), "×%.2f" % (large / metric("btrfs", "snapshot-large", "snapshot_s")),
            "×%.2f" % (large / small)])
        p50_0, p50_n = metric("birch", "fio-0-snapshots", "fsync_p50_us"), metric("birch", "fio-snapshots", "fsync_p50_us")
        self.assertEqual(birch["fio"][1], report.fmt_num(p50_0, 0))
        self.assertEqual(birch["fio"][9], "×%.2f" % (p50_n / p50_0))
        idle, deleting = (metric("birch", c, "throughput_mb_s") for c in ("dbench-4", "dbench-4-bgdelete"))
        self.assertEqual(birch["dbench"][5], "×%.2f" % (deleting / idle))
        self.assertEqual(birch["dbench"][12], report.fmt_num(metric("birch", "dbench-4", "drop_alone_s"), 3))
        self.assertEqual(birch["seed003"][3], report.fmt_num(metric("birch", "seed003-snapshot", "total_s"), 3))
        for t in rows.values():
            self.assertEqual([r[0] for r in t], ["btrfs", "birch"])
            for r in t:
                self.assertIn("| %s |" % " | ".join(r), text)

    def test_send_section(self):
        """Section 7 from a --quick run of the send workload: every cell is
        the median of its records, every ratio against btrfs theirs."""
        results = load_results("report-send-quick")
        text = report.build_report(results, "quick", plot_err="test")
        self.assertIn("## 7. Send and receive (issue 26)", text)
        self.assertIn("a tree of 2,029 files", text)
        rows = report.send_rows(report.Data(results))

        def metric(fs, key):
            return statistics.median(r["metrics"][key] for r in results["records"]
                                     if (r["workload"], r["fs"]) == ("send", fs))

        birch = {name: next(r for r in t if r[0] == "birch") for name, t in rows.items()}
        full, full_b = metric("birch", "full_send_s"), metric("btrfs", "full_send_s")
        self.assertEqual(birch["send"][1:5], [report.fmt_num(full, 2), "×%.2f" % (full / full_b),
                                              report.fmt_num(metric("birch", "full_stream_bytes") / 2.0 ** 20, 2),
                                              report.fmt_num(metric("birch", "full_nodes_read"), 0)])
        # btrfs says nothing of the nodes it read
        self.assertEqual(next(r for r in rows["send"] if r[0] == "btrfs")[4], "—")
        # the incremental send after 10 changed files reads few nodes
        self.assertLess(metric("birch", "incremental_10_nodes_read"), metric("birch", "full_nodes_read") / 10)
        rec, rec_b = metric("birch", "incremental_untar_receive_s"), metric("btrfs", "incremental_untar_receive_s")
        self.assertEqual(birch["receive"][5:7], [report.fmt_num(rec, 2), "×%.2f" % (rec / rec_b)])
        for t in rows.values():
            self.assertEqual([r[0] for r in t], ["btrfs", "birch"])
            for r in t:
                self.assertIn("| %s |" % " | ".join(r), text)
        self.assertNotIn("Send and receive", report.build_report(load_results("report-quick-dup"), "q"))

    def test_compress_section(self):
        """Section 8 from a --quick run of the compress workload: every
        cell is the median of its records, the space saved against the
        same filesystem without compression, every ratio against btrfs
        with the same codec."""
        results = load_results("report-compress-quick")
        text = report.build_report(results, "quick", plot_err="test")
        self.assertIn("## 8. Transparent compression (issue 25)", text)
        rows = report.compress_rows(report.Data(results))

        def metric(fs, config, key):
            return statistics.median(r["metrics"][key] for r in results["records"]
                                     if (r["workload"], r["config"], r["fs"]) == ("compress", config, fs))
        self.assertEqual([(r[0], r[1]) for r in rows],
                         [(fs, c) for fs in ("btrfs", "birch") for c in ("none", "zstd", "fast")])
        row = next(r for r in rows if r[:2] == ["birch", "zstd"])
        copy, copy_b = metric("birch", "zstd", "copy_s"), metric("btrfs", "zstd", "copy_s")
        used, used_none = metric("birch", "zstd", "used_bytes"), metric("birch", "none", "used_bytes")
        read, read_b = metric("birch", "zstd", "read_s"), metric("btrfs", "zstd", "read_s")
        self.assertEqual(row[2:10], ["`-o compress=zstd`", report.fmt_num(copy, 2), "×%.2f" % (copy / copy_b),
                                     report.fmt_num(used / 2.0 ** 20, 1), "%.0f %%" % (100 * (1 - used / used_none)),
                                     report.fmt_num(metric("birch", "zstd", "du_bytes") / 2.0 ** 20, 1),
                                     report.fmt_num(read, 2), "×%.2f" % (read / read_b)])
        # the fast codecs are each filesystem's own, compared with each other
        self.assertEqual(next(r for r in rows if r[:2] == ["btrfs", "fast"])[2], "`-o compress=lzo`")
        self.assertEqual(next(r for r in rows if r[:2] == ["birch", "fast"])[2:5],
                         ["`-o compress=lz4`", report.fmt_num(metric("birch", "fast", "copy_s"), 2),
                          "×%.2f" % (metric("birch", "fast", "copy_s") / metric("btrfs", "fast", "copy_s"))])
        # no compression saves nothing; compression saves space on both
        for fs in ("btrfs", "birch"):
            self.assertEqual(next(r for r in rows if r[:2] == [fs, "none"])[6], "—")
            self.assertLess(metric(fs, "zstd", "used_bytes"), metric(fs, "none", "used_bytes"))
        for r in rows:
            self.assertIn("| %s |" % " | ".join(r), text)
        self.assertNotIn("Transparent compression", report.build_report(load_results("report-quick-dup"), "q"))

    def test_compress_fio_and_incompressible_rows(self):
        """Section 8's fio and incompressible-write tables from a --quick
        run of the compress workload: every cell the median of its
        records, `× none` against the same filesystem without compression,
        `× btrfs` against btrfs with the same codec, birch's counters
        where birch has them."""
        results = load_results("report-compress-onoff-quick")
        text = report.build_report(results, "quick", plot_err="test")
        d = report.Data(results)

        def metric(fs, config, key):
            return statistics.median(r["metrics"][key] for r in results["records"]
                                     if (r["workload"], r["config"], r["fs"]) == ("compress", config, fs))

        def times(fs, kind, codec, key):
            """The cell, × none and × btrfs of one metric."""
            v = metric(fs, "%s-%s" % (kind, codec), key)
            return ["×%.2f" % (v / metric(fs, kind + "-none", key)),
                    "×%.2f" % (v / metric("btrfs", "%s-%s" % (kind, codec), key))]
        fio = report.compress_fio_rows(d)
        self.assertEqual([r[:3] for r in fio], [["btrfs", "none", "—"], ["btrfs", "zstd", "`-o compress=zstd`"],
                                                ["birch", "none", "—"], ["birch", "zstd", "`-o compress=zstd`"]])
        row = fio[3]
        self.assertEqual(row[3:11], [report.fmt_num(metric("birch", "fio-zstd", "write_p50_us"), 1),
                                     report.fmt_num(metric("birch", "fio-zstd", "fsync_p50_us"), 1)]
                         + times("birch", "fio", "zstd", "fsync_p50_us")
                         + [report.fmt_num(metric("birch", "fio-zstd", "fsync_p99_us"), 1)]
                         + times("birch", "fio", "zstd", "fsync_p99_us")
                         + [report.fmt_num(metric("birch", "fio-zstd", "iops"), 0)])
        self.assertEqual(row[11], report.fmt_num(metric("birch", "fio-zstd", "compressed_bytes_in") / 2.0 ** 20, 1))
        self.assertEqual(fio[1][11], "—")      # btrfs has no counters
        inc = report.compress_incompressible_rows(d)
        self.assertEqual([r[:2] for r in inc], [[fs, c] for fs in ("btrfs", "birch") for c in ("none", "zstd")])
        row = inc[3]
        self.assertEqual(row[3:8], [report.fmt_num(metric("birch", "incompressible-zstd", "write_sync_s"), 2)]
                         + times("birch", "incompressible", "zstd", "write_sync_s")
                         + [report.fmt_num(metric("birch", "incompressible-zstd", key) / 2.0 ** 20, 1)
                            for key in ("used_bytes", "du_bytes")])
        self.assertEqual(row[8], report.fmt_num(metric("birch", "incompressible-zstd", "compress_attempts_failed"), 0))
        # incompressible data takes its whole size with compression too,
        # and birch marks the file never to be compressed again
        for fs in ("btrfs", "birch"):
            self.assertGreaterEqual(metric(fs, "incompressible-zstd", "used_bytes"),
                                    metric(fs, "incompressible-zstd", "file_bytes"))
        self.assertEqual(row[10], "m")
        self.assertEqual(inc[2][10], "none")
        for r in fio + inc:
            self.assertIn("| %s |" % " | ".join(r), text)
        self.assertIn("%d MiB of random data" % (int(metric("birch", "incompressible-zstd", "file_bytes")) >> 20), text)
        self.assertNotIn("fio's 4 KiB write + fsync job", report.build_report(load_results("report-compress-quick"), "q"))

    def test_compress_workload_helpers(self):
        from harness.workloads import compress
        self.assertEqual(compress.compress_option("fast", "birch"), "compress=lz4")
        self.assertEqual(compress.compress_option("fast", "btrfs"), "compress=lzo")
        self.assertIsNone(compress.compress_option("none", "birch"))
        self.assertEqual(compress.du_bytes("123456\t/m/tree\n"), 123456)
        with self.assertRaises(CmdError):
            compress.du_bytes("du: cannot access")
        # the option is added to a copy: the shared setups keep theirs
        btrfs = SETUPS["btrfs"].with_mount_option("compress=zstd")
        self.assertEqual((btrfs.mount_opts, SETUPS["btrfs"].mount_opts), ("ssd,compress=zstd", "ssd"))
        birch = SETUPS["birch"].with_mount_option("compress=lz4")
        self.assertEqual(birch.mount_bg[-2:], ["-o", "compress=lz4"])
        self.assertNotIn("compress=lz4", SETUPS["birch"].mount_bg)
        self.assertEqual(compress.lsattr_flags("--------------m------- /m/random.bin\n"), "--------------m-------")
        with self.assertRaises(CmdError):
            compress.lsattr_flags("lsattr: Operation not supported")
        with tempfile.TemporaryDirectory() as tmp:
            # the pool is taken in turn, 1 MiB a write, to the last byte
            pool = bytes(range(256)) * (2 * compress.WRITE_SIZE // 256)
            path = os.path.join(tmp, "random.bin")
            compress.write_from_pool(path, 5 * compress.WRITE_SIZE + 7, pool)
            with open(path, "rb") as f:
                self.assertEqual(f.read(), pool * 2 + pool[:compress.WRITE_SIZE + 7])
            os.unlink(path)
            os.makedirs(os.path.join(tmp, "d"))
            with open(os.path.join(tmp, "d", "f"), "wb") as f:
                f.write(b"x" * 3000)
            with open(os.path.join(tmp, "g"), "wb"):
                pass
            os.symlink("g", os.path.join(tmp, "link"))
            self.assertEqual(compress.read_tree(tmp), (2, 3000))

    def test_no_snapshots_section_without_its_records(self):
        self.assertNotIn("Subvolumes and snapshots", report.build_report(load_results("report-quick-dup"), "q"))


class Ablation(unittest.TestCase):
    """`bench/run --ablation` (docs/ABLATION.md): options, the alternated
    plan, the setups' mount commands and the seeds' tables."""

    def birch(self, tmp):
        return executable(os.path.join(tmp, "birch"))

    def test_options(self):
        with tempfile.TemporaryDirectory() as tmp:
            o = resolve("--ablation", "--birch-bin", self.birch(tmp))
            self.assertEqual((o.fs_list, o.workloads), (["birch"], ["ablation"]))
            self.assertEqual(o.ablation_seeds, ["000", "001", "002", "003", "004"])
            self.assertEqual(resolve("--ablation", "003,000", "--birch-bin", self.birch(tmp)).ablation_seeds,
                             ["003", "000"])
            for argv, msg in ((["--ablation", "000,007"], "unknown seed id.*007"),
                              (["--ablation", "--fs", "btrfs"], "leave out --fs and --workloads")):
                with self.assertRaisesRegex(options.UsageError, msg):
                    resolve(*argv, "--birch-bin", self.birch(tmp))
        # never part of a default run
        self.assertNotIn("ablation", resolve().workloads)

    def test_plan_pairs_each_config_and_flips_the_order(self):
        with tempfile.TemporaryDirectory() as tmp:
            ctx = RunContext(resolve("--ablation", "003,004", "--birch-bin", self.birch(tmp)))
            w = WORKLOADS["ablation"](ctx)
            first = [(m.config, m.target, m.key_metric) for m in w.measurements()]
            self.assertEqual(first, [
                ("003-dirlog", "birch", "logging_s"), ("003-dirlog", "birch-ablate-003", "logging_s"),
                ("003-dbench-S", "birch", "throughput_mb_s"),
                ("003-dbench-S", "birch-ablate-003", "throughput_mb_s"),
                ("004-untar-roomy", "birch", "total_s"), ("004-untar-roomy", "birch-ablate-004", "total_s"),
                ("004-untar-tight", "birch", "total_s"), ("004-untar-tight", "birch-ablate-004", "total_s")])
            second = [(m.config, m.target) for m in w.measurements()]
            self.assertEqual(second[:2], [("003-dirlog", "birch-ablate-003"), ("003-dirlog", "birch")])

    def test_mount_commands(self):
        ctx = RunContext(resolve("--birch-bin", sys.executable))
        for seed in ("000", "004"):
            s = SETUPS["birch-ablate-" + seed]
            self.assertEqual(s.format_argv(ctx, s.mount_bg, target="/dev/loop9", mnt="/m")[-2:],
                             ["-o", "ablate=" + seed])
            self.assertIsNone(s.subvolumes)
        self.assertNotIn("-o", SETUPS["birch"].mount_bg)

    def test_birch_counters(self):
        counters = parsers.parse_birch_counters(
            '{"uptime_seconds": 1.5, "transport": "/dev/fuse", "read_only": false, "commits": 3, '
            '"logging_nanos": 2000000000, "fuse_requests": {"LOOKUP": 2}}')
        self.assertEqual(counters, {"uptime_seconds": 1.5, "commits": 3, "logging_nanos": 2000000000})
        self.assertIsNone(parsers.parse_birch_counters("not json"))

    def test_seeds_tables(self):
        def rec(config, fs, rep, metrics):
            return {"workload": "ablation", "config": config, "fs": fs, "rep": rep, "ok": True,
                    "metrics": metrics}

        def dbench(tput, max_lat, rename_avg, log_syncs):
            return {"throughput_mb_s": tput, "max_latency_ms": max_lat,
                    "ops": {"Rename": {"count": 10, "avg_ms": rename_avg, "max_ms": 5.0}},
                    "counters": {"log_syncs": log_syncs}}
        records = [rec("000-dbench-16", "birch-ablate-000", 1, dbench(100.0, 50.0, 4.0, 900)),
                   rec("000-dbench-16", "birch", 1, dbench(110.0, 40.0, 1.0, 300)),
                   rec("000-dbench-16", "birch", 2, dbench(120.0, 30.0, 2.0, 310)),
                   rec("000-dbench-16", "birch-ablate-000", 2, dbench(100.0, 50.0, 4.0, 1100)),
                   rec("004-untar-roomy", "birch-ablate-004", 1, {"total_s": 10.0}),
                   rec("004-untar-tight", "birch-ablate-004", 1, {"total_s": 60.0}),
                   rec("004-untar-roomy", "birch", 1, {"total_s": 10.0}),
                   rec("004-untar-tight", "birch", 1, {"total_s": 11.0})]
        results = {"meta": {"fs": ["birch"], "command": "bench/run --ablation 000,004"}, "records": records}
        text = report.build_report(results, "ablation", plot_err="test")
        self.assertIn("## The seeds' tables", text)
        # medians: before 100, after 115 (+15 %); max latency 50 -> 35; rename 4 -> 1.5
        self.assertIn("| 000 | throughput | +6.5% | 100.0 (100.0–100.0) | 115.0 (110.0–120.0) | +15.0% | "
                      "log_syncs: 1000 / 305 |", text)
        self.assertIn("| 000 | max latency | -29.4% | 50.00 (50.00–50.00) | 35.00 (30.00–40.00) | -30.0% |", text)
        self.assertIn("| 000 | rename latency (avg) | -75.8% | 4.00 (4.00–4.00) | 1.50 (1.00–2.00) | -62.5% |",
                      text)
        self.assertIn("| 004 | untar + sync, nearly full | — | 60.00 | 11.00 | -81.7% | — |", text)
        self.assertIn("before ×6.00, after ×1.10", text)
        self.assertNotIn("| 001 |", text)
        # an ablation-only run has no kernel filesystem to hold ratios against
        self.assertNotIn("## Headline", text)
        # without ablation records, no such section
        self.assertNotIn("The seeds' tables", report.build_report(load_results("report-quick-dup"), "q"))


if __name__ == "__main__":
    unittest.main()
