"""birch 1 GiB incompressible: writes and closing fsync timed apart, a
fresh filesystem each, the codecs rotated every round (`none`: no mount
option, else `-o compress=CODEC`); one JSON line per measurement. As root:
    python3 ab.py 3 none,zstd BIRCH; python3 ab.py 4 none,zstd BIRCH   (results.jsonl's first 14 lines)
    python3 ab.py 3 none,no,zstd BIRCH                                  (its last 9)"""
import os, sys, time, json
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
from harness import options
from harness.context import RunContext
from harness.setups import SETUPS
from harness.workloads.compress import WRITE_SIZE
from harness.host import GiB

argv = ["--fs", "birch", "--birch-bin", sys.argv[3], "--workdir", "/tmp/cbench-ab/work"]
ctx = RunContext(options.resolve(options.parse_args(argv), argv))
ctx.open_results_dir("/tmp/cbench-ab/out")
pool = os.urandom(16 << 20)
view = memoryview(pool)
res = []
try:
    for i in range(int(sys.argv[1])):
        codecs = sys.argv[2].split(",")
        k = i % len(codecs)
        for codec in codecs[len(codecs) - k:] + codecs[:len(codecs) - k]:
            setup = SETUPS["birch"] if codec == "none" else SETUPS["birch"].with_mount_option("compress=" + codec)
            with setup.open(ctx, 4 * GiB, "ab-" + codec) as m:
                fd = os.open(os.path.join(m.mnt, "r.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
                t0 = time.perf_counter(); done = 0
                while done < GiB:
                    s = done % len(pool)
                    done += os.write(fd, view[s:s + WRITE_SIZE])
                t1 = time.perf_counter(); os.fsync(fd); t2 = time.perf_counter(); os.close(fd)
                m.sync(); t3 = time.perf_counter()
                c = m.counters() or {}
                r = dict(rep=i, codec=codec, write_s=round(t1 - t0, 2), fsync_s=round(t2 - t1, 3),
                         sync_s=round(t3 - t2, 3), total=round(t3 - t0, 2),
                         tried=c.get("compress_attempts_failed"), load=os.getloadavg()[0])
                print(json.dumps(r), flush=True); res.append(r)
finally:
    ctx.teardown_all()
