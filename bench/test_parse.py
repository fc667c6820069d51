"""Self-test of the benchmark harness's parsers against recorded outputs.

Runs without root and without dbench/fio installed:
    python3 -m pytest bench/test_parse.py      (or)
    python3 bench/test_parse.py

The samples in bench/testdata/ were captured from real runs of bench/run on
the project's machine (dbench 4.00, fio 3.33), plus one table copied from
seed 001, whose rows are wrapped and padded with non-breaking spaces.
"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import parsers  # noqa: E402
import report  # noqa: E402

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
        meta = {"fs": ["btrfs"], "workloads": ["fio"], "repeat": 1}
        recs = [{"workload": "fio", "config": "4k-write-fsync", "fs": f, "ok": True,
                 "metrics": {"fsync_p50_us": 1.0}} for f in ("raw-loop", "host-file", "btrfs")]
        self.assertEqual(report.missing_numbers(meta, recs), [])
        recs[2]["ok"] = False
        recs[2]["error"] = "boom"
        self.assertEqual(len(report.missing_numbers(meta, recs)), 1)


if __name__ == "__main__":
    unittest.main()
