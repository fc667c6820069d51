#!/usr/bin/env python3
"""birch benchmark harness: the seeds' experiments on kernel btrfs, ext4, xfs
(and birch, once it mounts) in one run.  See bench/README.md.

Run it through `bench/run` (as root).  Python 3 standard library only, plus
matplotlib for the plots (installed on demand).
"""

import argparse
import datetime
import fcntl
import glob
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import traceback

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)

import parsers  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

ALL_WORKLOADS = ["dbench", "dirlog", "untar", "fio", "embedded"]
DEFAULT_WORKLOADS = ALL_WORKLOADS

# dbench configurations: (config name, clients, sync dirs)
DBENCH_CONFIGS = [("1", 1, False), ("4", 4, False), ("8", 8, False), ("4-S", 4, True)]

# ----------------------------------------------------------------------------
# Filesystem table.  {target} is the loop device (device="loop") or the image
# file itself (device="file"); {mnt} the mount point; {birch} the birch binary;
# {path} a path inside the mount.  "sync" makes everything under the mount
# durable (default: syncfs through `sync -f`).
# ----------------------------------------------------------------------------
# What both birch entries share; they differ only in what {target} is.
BIRCH_COMMANDS = {
    "kind": "fuse", "fstype": "fuse",
    "mkfs": ["{birch}", "mkfs", "{target}"],
    "mount_bg": ["{birch}", "mount", "-f", "{target}", "{mnt}"],
    "umount": ["fusermount3", "-u", "{mnt}"],
    # The kernel forwards syncfs to a FUSE daemon only on fuseblk mounts,
    # which is what birch mounts as root (on a block device, or on a loop
    # device it attaches to an image file): Mounted.sync then uses `sync -f`
    # like the kernel filesystems. On a plain fuse mount, `birch sync` runs
    # syncfs, then asks birch to commit through its ioctl.
    "sync": ["{birch}", "sync", "{path}"],
    "tools": ["fusermount3"],
}

FS_TABLE = {
    "btrfs": {
        "kind": "kernel", "fstype": "btrfs", "device": "loop",
        "mkfs": ["mkfs.btrfs", "-f", "-m", "single", "-d", "single", "{target}"],
        "mount_opts": "ssd",
        "tools": ["mkfs.btrfs"],
        "default": True,
    },
    "ext4": {
        "kind": "kernel", "fstype": "ext4", "device": "loop",
        # defaults; -F only so that mke2fs never asks a question
        "mkfs": ["mkfs.ext4", "-F", "{target}"],
        "mount_opts": None,
        "tools": ["mkfs.ext4"],
        "default": True,
    },
    "xfs": {
        "kind": "kernel", "fstype": "xfs", "device": "loop",
        # defaults; -f only so that an old signature never stops mkfs
        "mkfs": ["mkfs.xfs", "-f", "{target}"],
        "mount_opts": None,
        "tools": ["mkfs.xfs"],
        "default": True,
    },
    # birch over FUSE on the same kind of direct-io loop device as the others.
    "birch": dict(BIRCH_COMMANDS, device="loop",
                  default=False),   # enabled by --fs birch or --birch-bin PATH
    # birch given the image file: as root, birch attaches it to a loop
    # device of its own (auto-clearing; direct I/O unless -o buffered).
    "birch-file": dict(BIRCH_COMMANDS, device="file", default=False),
}
BIRCH_FS = [n for n, s in FS_TABLE.items() if s["kind"] == "fuse"]

# Debian package providing each external tool.
PKG_FOR_TOOL = {
    "dbench": "dbench", "fio": "fio", "mkfs.btrfs": "btrfs-progs",
    "mkfs.xfs": "xfsprogs", "mkfs.ext4": "e2fsprogs", "losetup": "mount",
    "tar": "tar", "xz": "xz-utils", "fusermount3": "fuse3", "sync": "coreutils",
}
INSTALL_ALL = ["dbench", "fio", "btrfs-progs", "xfsprogs", "e2fsprogs", "xz-utils",
               "python3-matplotlib"]
LINUX_SOURCE_PKG = "linux-source-6.1"
LINUX_SOURCE_TARBALL = "/usr/src/linux-source-6.1.tar.xz"


class Interrupted(BaseException):
    """Raised from the signal handler; BaseException so that per-measurement
    `except Exception` blocks never swallow it."""


class CmdError(RuntimeError):
    pass


class State:
    interrupted = None
    cleaning = False
    children = set()          # running Popen objects (own process groups)
    active = []               # Mounted objects not yet torn down
    log_file = None
    cleanup_failures = []
    apt_updated = False


STATE = State()


# ----------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------

def log(msg):
    line = "[%s] %s" % (time.strftime("%H:%M:%S"), msg)
    print(line, file=sys.stderr, flush=True)
    if STATE.log_file:
        STATE.log_file.write(line + "\n")
        STATE.log_file.flush()


def _killpg(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(cmd, *, timeout=None, check=True, out_path=None, env=None, cwd=None, quiet=False):
    """Run a command in its own process group; kill the whole group on
    timeout, error or signal.  Returns (rc, stdout, stderr).  With out_path,
    stdout+stderr go to that file (and are returned as stdout)."""
    if not quiet:
        log("$ " + " ".join(shlex.quote(str(c)) for c in cmd))
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    f = open(out_path, "w") if out_path else None
    try:
        p = subprocess.Popen([str(c) for c in cmd], stdout=f or subprocess.PIPE,
                             stderr=subprocess.STDOUT if f else subprocess.PIPE,
                             stdin=subprocess.DEVNULL, start_new_session=True,
                             env=full_env, cwd=cwd, text=True)
        STATE.children.add(p)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(p)
            p.communicate()
            raise CmdError("timed out after %ss: %s" % (timeout, " ".join(map(str, cmd))))
        except BaseException:
            _killpg(p)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            raise
        finally:
            STATE.children.discard(p)
    finally:
        if f:
            f.close()
    if out_path:
        with open(out_path, errors="replace") as fh:
            out, err = fh.read(), ""
    if check and p.returncode != 0:
        tail = ((out or "") + (err or ""))[-2000:]
        raise CmdError("exit %d: %s\n%s" % (p.returncode, " ".join(map(str, cmd)), tail))
    return p.returncode, out or "", err or ""


def mountinfo():
    """[(mount point, fstype)] from /proc/self/mountinfo."""
    res = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            try:
                sep = parts.index("-")
            except ValueError:
                continue
            mp = parts[4].encode().decode("unicode_escape")
            res.append((mp, parts[sep + 1]))
    return res


def is_mounted(path):
    path = os.path.realpath(path)
    return any(mp == path for mp, _ in mountinfo())


def under(path, root):
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def loop_devices():
    """[(device, back-file)] of all attached loop devices."""
    try:
        _, out, _ = run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"],
                        quiet=True, timeout=30)
    except Exception:
        return []
    try:
        devs = json.loads(out or "{}").get("loopdevices", [])
    except ValueError:
        return []
    res = []
    for d in devs:
        bf = (d.get("back-file") or "").strip()
        if bf.endswith(" (deleted)"):
            bf = bf[: -len(" (deleted)")]
        res.append((d.get("name"), bf))
    return res


def loop_dio(dev):
    try:
        with open("/sys/block/%s/loop/dio" % os.path.basename(dev)) as f:
            return f.read().strip() == "1"
    except OSError:
        return None


def syncfs(path, quiet=True, timeout=1800):
    run(["sync", "-f", path], quiet=quiet, timeout=timeout)


def fmt_bytes(n):
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div:
            return "%.1f %s" % (n / div, unit)
    return "%d B" % n


def umount_path(mp, fstype="", attempts=20):
    """Unmount with retries; returns True when it is gone."""
    for i in range(attempts):
        if not is_mounted(mp):
            return True
        cmd = ["fusermount3", "-u", mp] if fstype.startswith("fuse") and shutil.which("fusermount3") \
            else ["umount", mp]
        try:
            run(cmd, timeout=600, quiet=i > 0)
        except Exception as e:
            if i == 0:
                log("umount %s failed (%s); retrying" % (mp, str(e).splitlines()[0]))
            time.sleep(0.5)
    if is_mounted(mp):
        # last resort: lazy unmount so nothing new can use it
        try:
            run(["umount", "-l", mp], timeout=60)
        except Exception:
            pass
    return not is_mounted(mp)


def detach_loop(dev, attempts=10):
    for i in range(attempts):
        try:
            run(["losetup", "-d", dev], timeout=60, quiet=i > 0)
        except Exception:
            time.sleep(0.5)
            continue
        # losetup -d on a busy device only sets autoclear: check it is gone
        for _ in range(20):
            if not any(d == dev for d, _ in loop_devices()):
                return True
            time.sleep(0.25)
    return not any(d == dev for d, _ in loop_devices())


def sweep(workdir):
    """Unmount everything mounted under workdir and detach every loop device
    backed by a file under workdir.  Returns a list of what is left."""
    left = []
    for mp, fstype in sorted(mountinfo(), key=lambda x: -len(x[0])):
        if under(mp, workdir) and os.path.realpath(mp) != os.path.realpath(workdir):
            log("cleanup: unmounting leftover %s (%s)" % (mp, fstype))
            if not umount_path(mp, fstype):
                left.append("mount %s" % mp)
    for dev, bf in loop_devices():
        if bf and under(bf, workdir):
            log("cleanup: detaching leftover %s (%s)" % (dev, bf))
            if not detach_loop(dev):
                left.append("loop %s -> %s" % (dev, bf))
    if not left:
        # stale images and mount points of interrupted runs (sparse, but why keep them)
        for p in glob.glob(os.path.join(workdir, "img", "*")):
            if not any(a.img == p for a in STATE.active if hasattr(a, "img")):
                try:
                    os.unlink(p)
                except OSError:
                    pass
        for p in glob.glob(os.path.join(workdir, "mnt", "*")):
            try:
                os.rmdir(p)
            except OSError:
                pass
    return left


# ----------------------------------------------------------------------------
# signals and cleanup
# ----------------------------------------------------------------------------

def _on_signal(signum, frame):
    if STATE.cleaning or STATE.interrupted:
        log("signal %d ignored: cleaning up, please wait" % signum)
        return
    STATE.interrupted = signum
    log("signal %d: stopping and cleaning up" % signum)
    raise Interrupted(signum)


def install_signal_handlers():
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, _on_signal)


def cleanup_all(workdir):
    STATE.cleaning = True
    for p in list(STATE.children):
        _killpg(p)
    for m in list(reversed(STATE.active)):
        try:
            m.teardown()
        except BaseException as e:  # noqa: BLE001 - cleanup must go on
            log("cleanup of %s failed: %s" % (m.name, e))
    left = sweep(workdir)
    STATE.cleanup_failures.extend(left)
    return left


# ----------------------------------------------------------------------------
# package installation
# ----------------------------------------------------------------------------

def apt_install(pkgs):
    pkgs = sorted(set(pkgs))
    if not pkgs:
        return
    if not shutil.which("apt-get"):
        raise CmdError("apt-get not available; install by hand: %s" % " ".join(pkgs))
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    if not STATE.apt_updated:
        run(["apt-get", "update"], timeout=900, env=env)
        STATE.apt_updated = True
    run(["apt-get", "install", "-y", "--no-install-recommends"] + pkgs, timeout=1800, env=env)


def ensure_tools(tools, force=False):
    missing = [t for t in tools if not shutil.which(t)]
    pkgs = sorted({PKG_FOR_TOOL.get(t, t) for t in missing})
    if force:
        pkgs = sorted(set(pkgs) | set(INSTALL_ALL))
    if pkgs:
        log("installing: %s" % " ".join(pkgs))
        apt_install(pkgs)
    still = [t for t in tools if not shutil.which(t)]
    if still:
        raise CmdError("tools still missing after install: %s" % " ".join(still))


def ensure_matplotlib():
    """Import matplotlib (Agg); install python3-matplotlib or pip matplotlib
    if needed.  Returns None on success, else a reason string."""
    import importlib

    def try_import():
        try:
            importlib.invalidate_caches()
            import matplotlib  # noqa: F401
            return True
        except ImportError:
            return False

    if try_import():
        return None
    try:
        apt_install(["python3-matplotlib"])
    except Exception as e:
        log("apt install python3-matplotlib failed: %s" % e)
    if try_import():
        return None
    try:
        run([sys.executable, "-m", "pip", "install", "matplotlib"], timeout=900)
    except Exception as e:
        log("pip install matplotlib failed: %s" % e)
    if try_import():
        return None
    return "matplotlib not importable by %s" % sys.executable


def find_client_txt():
    cands = []
    try:
        _, out, _ = run(["dpkg", "-L", "dbench"], quiet=True, timeout=30)
        cands += [line.strip() for line in out.splitlines() if line.strip().endswith("/client.txt")]
    except Exception:
        pass
    cands += ["/usr/share/dbench/client.txt", "/usr/share/doc/dbench/loadfiles/client.txt",
              "/usr/local/share/client.txt", "/usr/share/dbench/loadfiles/client.txt"]
    for c in cands:
        if os.path.isfile(c):
            return c
    raise CmdError("dbench loadfile client.txt not found (dpkg -L dbench)")


# ----------------------------------------------------------------------------
# mounted filesystem (context manager)
# ----------------------------------------------------------------------------

class Mounted:
    """One freshly created image + (loop device) + mkfs + mount.  Everything
    is undone by teardown(), which is idempotent."""

    def __init__(self, name, spec, size, tag, ctx):
        self.name, self.spec, self.size, self.tag, self.ctx = name, spec, size, tag, ctx
        self.img = os.path.join(ctx.workdir, "img", "%s-%s.img" % (name, tag))
        self.mnt = os.path.join(ctx.workdir, "mnt", "%s-%s" % (name, tag))
        # How FUSE requests reach birch, as its stats say (None: kernel fs).
        self.transport = None
        self.dev = None
        self.proc = None
        self.proc_log = None
        self.mounted = False
        self.torn_down = False

    def _fmt(self, argv, path=None):
        target = self.dev if self.spec["device"] == "loop" else self.img
        return [a.format(target=target, mnt=self.mnt, birch=self.ctx.birch_bin or "birch",
                         path=path or self.mnt) for a in argv]

    def sync(self, path=None, quiet=True, timeout=1800):
        """Makes everything under the mount durable, the way its filesystem
        needs (see FS_TABLE's "sync")."""
        if "sync" in self.spec and not self.fstype().startswith("fuseblk"):
            run(self._fmt(self.spec["sync"], path), quiet=quiet, timeout=timeout)
        else:
            syncfs(path or self.mnt, quiet=quiet, timeout=timeout)

    def fuse_requests(self):
        """birch's count of the FUSE requests this mount received so far, by
        opcode (`birch stats --json`); None for kernel filesystems."""
        if self.spec["kind"] == "kernel" or not self.ctx.birch_bin:
            return None
        try:
            _, out, _ = run([self.ctx.birch_bin, "stats", "--json", self.mnt], quiet=True, timeout=60)
        except CmdError:
            return None
        self.transport = parsers.parse_birch_transport(out)
        return parsers.parse_birch_requests(out)

    def requests_since(self, before):
        """The requests received since `before` (a fuse_requests() result),
        without zeros; None for kernel filesystems."""
        after = self.fuse_requests()
        if before is None or after is None:
            return None
        delta = {k: n - before.get(k, 0) for k, n in after.items()}
        return {k: n for k, n in delta.items() if n > 0}

    def fstype(self):
        """The type /proc/self/mountinfo lists for the mount ("" if none)."""
        return next((t for mp, t in mountinfo() if mp == self.mnt), "")

    def __enter__(self):
        STATE.active.append(self)
        try:
            self.setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False

    def setup(self):
        os.makedirs(os.path.dirname(self.img), exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        if is_mounted(self.mnt):
            raise CmdError("%s is already mounted" % self.mnt)
        if os.path.exists(self.img):
            os.unlink(self.img)
        with open(self.img, "wb") as f:   # sparse image file on the work disk
            f.truncate(self.size)
        if self.spec["device"] == "loop":
            _, out, _ = run(["losetup", "--direct-io=on", "--find", "--show", self.img], timeout=60)
            self.dev = out.strip()
            if not self.dev.startswith("/dev/"):
                raise CmdError("losetup printed %r" % out)
            dio = loop_dio(self.dev)
            self.ctx.note_dio(self.name, dio)
        mkfs_log = os.path.join(self.ctx.raw_dir, "mkfs", "%s-%s.txt" % (self.name, self.tag))
        os.makedirs(os.path.dirname(mkfs_log), exist_ok=True)
        run(self._fmt(self.spec["mkfs"]), out_path=mkfs_log, timeout=600)
        if self.spec["kind"] == "kernel":
            cmd = ["mount", "-t", self.spec["fstype"]]
            if self.spec.get("mount_opts"):
                cmd += ["-o", self.spec["mount_opts"]]
            run(cmd + [self.dev, self.mnt], timeout=120)
            self.mounted = True
        else:
            self.proc_log = open(os.path.join(self.ctx.raw_dir, "mkfs", "%s-%s-mount.log" % (self.name, self.tag)), "w")
            cmd = self._fmt(self.spec["mount_bg"])
            log("$ %s &" % " ".join(map(shlex.quote, cmd)))
            self.proc = subprocess.Popen(cmd, stdout=self.proc_log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = time.time() + 60
            while time.time() < deadline:
                if is_mounted(self.mnt):
                    self.mounted = True
                    break
                if self.proc.poll() is not None:
                    raise CmdError("%s exited with %s before mounting (see %s)" % (
                        cmd[0], self.proc.returncode, self.proc_log.name))
                time.sleep(0.1)
            else:
                raise CmdError("%s did not mount %s within 60 s" % (cmd[0], self.mnt))
        # measure everything from a clean, settled state
        self.sync()

    def unmount_timed(self):
        """Unmount now (FUSE: until the daemon has exited) and return the
        seconds it took; teardown() then only detaches and deletes."""
        t0 = time.perf_counter()
        self._unmount()
        return time.perf_counter() - t0

    def _unmount(self):
        ok = True
        if self.spec["kind"] == "fuse":
            if is_mounted(self.mnt):
                try:
                    run(self._fmt(self.spec["umount"]), timeout=300)
                except Exception as e:
                    log("fuse unmount failed: %s" % e)
                ok = umount_path(self.mnt, "fuse") and ok
            if self.proc is not None and self.proc.poll() is None:
                try:
                    self.proc.wait(timeout=600)
                except subprocess.TimeoutExpired:
                    log("%s still running after unmount: terminating" % self.name)
                    self.proc.terminate()
                    try:
                        self.proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        _killpg(self.proc)
                        self.proc.wait()
            if self.proc_log and not self.proc_log.closed:
                self.proc_log.close()
        else:
            ok = umount_path(self.mnt, self.spec["fstype"]) and ok
        return ok

    def teardown(self):
        if self.torn_down:
            return
        ok = self._unmount()
        if self.dev:
            if detach_loop(self.dev):
                self.dev = None
            else:
                ok = False
        if ok:
            try:
                if os.path.exists(self.img):
                    os.unlink(self.img)
                os.rmdir(self.mnt)
            except OSError:
                pass
        else:
            STATE.cleanup_failures.append("%s-%s" % (self.name, self.tag))
        self.torn_down = True
        if self in STATE.active:
            STATE.active.remove(self)


class LoopOnly:
    """A raw image on a direct-io loop device, no filesystem (fio floor)."""

    def __init__(self, ctx, size):
        self.ctx, self.size = ctx, size
        self.name = "raw-loop"
        self.img = os.path.join(ctx.workdir, "img", "raw-floor.img")
        self.dev = None

    def __enter__(self):
        STATE.active.append(self)
        try:
            os.makedirs(os.path.dirname(self.img), exist_ok=True)
            if os.path.exists(self.img):
                os.unlink(self.img)
            with open(self.img, "wb") as f:
                f.truncate(self.size)
            _, out, _ = run(["losetup", "--direct-io=on", "--find", "--show", self.img], timeout=60)
            self.dev = out.strip()
            self.ctx.note_dio(self.name, loop_dio(self.dev))
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False

    def teardown(self):
        if self.dev and not detach_loop(self.dev):
            STATE.cleanup_failures.append(self.dev)
        else:
            self.dev = None
            if os.path.exists(self.img):
                os.unlink(self.img)
        if self in STATE.active:
            STATE.active.remove(self)


# ----------------------------------------------------------------------------
# the run context
# ----------------------------------------------------------------------------

class Ctx:
    def __init__(self, args):
        self.args = args
        self.workdir = os.path.realpath(args.workdir)
        self.out = None
        self.raw_dir = None
        self.birch_bin = args.birch_bin
        self.records = []
        self.kept_records = []
        self.meta = {}
        self.dio = {}

    def note_dio(self, name, dio):
        if self.dio.get(name) is None:
            self.dio[name] = dio
            if dio is False:
                log("WARNING: loop device for %s is NOT using direct I/O" % name)

    def save(self):
        data = {"meta": self.meta, "records": self.kept_records + self.records}
        tmp = os.path.join(self.out, "results.json.tmp")
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(self.out, "results.json"))

    def rel(self, path):
        return os.path.relpath(path, self.out)


def measure(ctx, workload, config, fs, rep, fn):
    rec = {"workload": workload, "config": config, "fs": fs, "rep": rep,
           "ok": False, "error": None, "metrics": None, "raw": [],
           "start": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "loadavg_before": os.getloadavg()[0]}
    log("== %s %s on %s (rep %d)" % (workload, config, fs, rep))
    t0 = time.perf_counter()
    try:
        metrics = fn(rec)
        rec["metrics"] = metrics
        rec["ok"] = True
    except Interrupted:
        rec["error"] = "interrupted"
        ctx.records.append(rec)
        raise
    except Exception as e:  # noqa: BLE001 - recorded, run continues
        rec["error"] = str(e).strip()[:4000]
        log("FAILED %s %s on %s: %s" % (workload, config, fs, str(e).splitlines()[0] if str(e) else repr(e)))
        log(traceback.format_exc())
    rec["wall_s"] = round(time.perf_counter() - t0, 3)
    rec["loadavg_after"] = os.getloadavg()[0]
    ctx.records.append(rec)
    ctx.save()
    return rec


def raw_path(ctx, workload, name):
    d = os.path.join(ctx.raw_dir, workload)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)


# ----------------------------------------------------------------------------
# workload 1: dbench
# ----------------------------------------------------------------------------

def w_dbench(ctx, fs, cfg, clients, sync_dirs, rep, rec):
    spec = FS_TABLE[fs]
    with Mounted(fs, spec, ctx.main_size, "main", ctx) as m:
        raw = raw_path(ctx, "dbench", "%s-%s-r%d.txt" % (fs, cfg, rep))
        rec["raw"].append(ctx.rel(raw))
        cmd = ["dbench", "-c", ctx.client_txt, "-D", m.mnt, "-t", str(ctx.duration)]
        if sync_dirs:
            cmd.append("-S")
        cmd.append(str(clients))
        before = m.fuse_requests()
        run(cmd, out_path=raw, timeout=ctx.duration * 3 + 600)
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


# ----------------------------------------------------------------------------
# workload 2: seed 003 directory logging (Python, dir fd fsync)
# ----------------------------------------------------------------------------

def dirlog_workload(root, nfiles, every, sync):
    """Seed 003's script without the shell: create `nfiles` empty files in
    one directory, fsync the directory every `every` creations, sync, then
    rename every file in place (same dir), fsync the directory every `every`
    renames.  `sync(path)` is the filesystem's sync.  Returns phase times
    and fsync statistics."""
    d = os.path.join(root, "testdir")
    os.mkdir(d)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    pc = time.perf_counter
    fsync_lat = {"create": [], "rename": []}
    try:
        t0 = pc()
        for i in range(1, nfiles + 1):
            fd = os.open("file_%d" % i, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dfd)
            os.close(fd)
            if i % every == 0:
                a = pc()
                os.fsync(dfd)
                fsync_lat["create"].append(pc() - a)
        t1 = pc()
        sync(d)
        t2 = pc()
        for i in range(1, nfiles + 1):
            os.rename("file_%d" % i, "file_%d.renamed" % i, src_dir_fd=dfd, dst_dir_fd=dfd)
            if i % every == 0:
                a = pc()
                os.fsync(dfd)
                fsync_lat["rename"].append(pc() - a)
        t3 = pc()
    finally:
        os.close(dfd)
    allf = fsync_lat["create"] + fsync_lat["rename"]
    return {
        "files": nfiles, "fsync_every": every,
        "create_s": t1 - t0, "sync_s": t2 - t1, "rename_s": t3 - t2, "total_s": t3 - t0,
        "create_fsync_s": sum(fsync_lat["create"]), "rename_fsync_s": sum(fsync_lat["rename"]),
        "fsyncs": len(allf),
        "fsync_mean_ms": 1000 * sum(allf) / len(allf) if allf else None,
        "fsync_max_ms": 1000 * max(allf) if allf else None,
        "_fsync_latencies_s": fsync_lat,
    }


def w_dirlog(ctx, fs, rep, rec):
    raw = raw_path(ctx, "dirlog", "%s-r%d.json" % (fs, rep))
    rec["raw"].append(ctx.rel(raw))
    if fs == "tmpfs-floor":
        # Same code on tmpfs (fsync is a no-op there): the harness's own
        # Python overhead, i.e. the floor under every filesystem's number.
        base = os.path.join(ctx.workdir, "mnt", "tmpfs-floor")
        os.makedirs(base, exist_ok=True)
        run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", base], timeout=60)
        try:
            res = dirlog_workload(base, ctx.dirlog_files, 100, syncfs)
        finally:
            umount_path(base, "tmpfs")
            os.rmdir(base)
    else:
        with Mounted(fs, FS_TABLE[fs], ctx.main_size, "main", ctx) as m:
            before = m.fuse_requests()
            res = dirlog_workload(m.mnt, ctx.dirlog_files, 100, m.sync)
            requests = m.requests_since(before)
        if requests:
            res["fuse_requests"] = requests
            res["fuse_transport"] = m.transport
    with open(raw, "w") as f:
        json.dump(res, f, indent=1)
    res.pop("_fsync_latencies_s")
    return res


# ----------------------------------------------------------------------------
# workload 3: seed 004 untar (roomy and nearly full)
# ----------------------------------------------------------------------------

def _tar_stats(path):
    n_files = n_dirs = n_other = 0
    nbytes = est = 0
    with tarfile.open(path, "r:") as t:
        for m in t:
            if m.isfile():
                n_files += 1
                nbytes += m.size
                est += (m.size + 4095) // 4096 * 4096
            elif m.isdir():
                n_dirs += 1
                est += 4096
            else:
                n_other += 1
    return {"files": n_files, "dirs": n_dirs, "other": n_other,
            "bytes": nbytes, "est_4k_bytes": est}


def _build_quick_tar(dest, max_files=3000, max_bytes=48 * MiB):
    """A small real tree from what every Debian machine has: python3
    libraries and /usr/share/doc.  Deterministic for a given machine."""
    roots = ["/usr/lib/python3", "/usr/share/doc", "/usr/include", "/usr/share"]
    files = nbytes = 0
    tmp = dest + ".tmp"
    with tarfile.open(tmp, "w:", format=tarfile.GNU_FORMAT) as t:
        for root in roots:
            if not os.path.isdir(root):
                continue
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                if files >= max_files or nbytes >= max_bytes:
                    break
                t.add(dirpath, arcname="tree" + dirpath, recursive=False)
                for fn in sorted(filenames):
                    p = os.path.join(dirpath, fn)
                    try:
                        st = os.lstat(p)
                    except OSError:
                        continue
                    if not (os.path.islink(p) or (os.path.isfile(p) and st.st_size <= 4 * MiB)):
                        continue
                    try:
                        t.add(p, arcname="tree" + p, recursive=False)
                    except OSError:
                        continue
                    files += 1
                    nbytes += st.st_size if not os.path.islink(p) else 0
                    if files >= max_files or nbytes >= max_bytes:
                        break
    os.replace(tmp, dest)


def prepare_tarball(ctx):
    cache = os.path.join(ctx.workdir, "cache")
    os.makedirs(cache, exist_ok=True)
    a = ctx.args
    if a.untar_tarball:
        src = os.path.realpath(a.untar_tarball)
    elif ctx.quick:
        src = os.path.join(cache, "quick-tree.tar")
        if not os.path.exists(src):
            log("building the quick-mode tarball %s" % src)
            _build_quick_tar(src)
    else:
        src = LINUX_SOURCE_TARBALL
        if not os.path.exists(src):
            cands = sorted(glob.glob("/usr/src/linux-source-*.tar.xz"))
            if cands:
                src = cands[-1]
            else:
                log("installing %s for the untar workload" % LINUX_SOURCE_PKG)
                apt_install([LINUX_SOURCE_PKG])
                if not os.path.exists(src):
                    raise CmdError("%s did not provide %s" % (LINUX_SOURCE_PKG, src))
    if not os.path.exists(src):
        raise CmdError("tarball %s not found" % src)
    st = os.stat(src)
    base = os.path.basename(src)
    comp = None
    for ext, tool in ((".xz", ["xz", "-dc"]), (".gz", ["gzip", "-dc"]), (".zst", ["zstd", "-dc"]),
                      (".bz2", ["bzip2", "-dc"])):
        if base.endswith(ext):
            comp, base = tool, base[: -len(ext)]
    stamp_path = os.path.join(cache, base + ".stamp.json")
    stamp_key = {"src": src, "size": st.st_size, "mtime": int(st.st_mtime)}
    tar_path = os.path.join(cache, base) if comp else src
    stamp = None
    if os.path.exists(stamp_path) and os.path.exists(tar_path):
        with open(stamp_path) as f:
            stamp = json.load(f)
        if stamp.get("key") != stamp_key:
            stamp = None
    if stamp is None:
        if comp:
            log("decompressing %s once into %s" % (src, tar_path))
            ensure_tools([comp[0]])
            t0 = time.perf_counter()
            tmp = tar_path + ".tmp"
            with open(tmp, "wb") as out:
                p = subprocess.Popen(comp + [src], stdout=out, start_new_session=True)
                STATE.children.add(p)
                try:
                    if p.wait(timeout=3600) != 0:
                        raise CmdError("%s failed" % comp[0])
                except BaseException:
                    _killpg(p)
                    raise
                finally:
                    STATE.children.discard(p)
            os.replace(tmp, tar_path)
            log("decompressed in %.1f s" % (time.perf_counter() - t0))
        stats = _tar_stats(tar_path)
        stamp = {"key": stamp_key, "tar": tar_path, "stats": stats}
        with open(stamp_path, "w") as f:
            json.dump(stamp, f, indent=1)
    ctx.tarball = tar_path
    ctx.tar_stats = stamp["stats"]
    ctx.meta["untar_source"] = {"source": src, "tar": tar_path, **stamp["stats"]}
    log("untar tree: %(files)d files, %(dirs)d dirs, %(bytes)d bytes" % stamp["stats"])


def _warm(path):
    """Read the tarball through so that every filesystem untars from the page
    cache and the host disk's read speed is not part of the measurement."""
    with open(path, "rb", buffering=0) as f:
        while f.read(8 * MiB):
            pass


def w_untar(ctx, fs, which, rep, rec):
    size = ctx.roomy_size if which == "roomy" else ctx.tight_size
    spec = FS_TABLE[fs]
    raw = raw_path(ctx, "untar", "%s-%s-r%d.txt" % (fs, which, rep))
    rec["raw"].append(ctx.rel(raw))
    with Mounted(fs, spec, size, which, ctx) as m:
        st = os.statvfs(m.mnt)
        total = st.f_blocks * st.f_frsize
        used0 = (st.f_blocks - st.f_bfree) * st.f_frsize
        filler = 0
        if which == "tight" and ctx.tight_fill:
            # fill so that the fs is ~tight_fill% used once the tree is in
            want = int(ctx.tight_fill / 100.0 * total) - used0 - ctx.tar_stats["est_4k_bytes"]
            if want > 16 * MiB:
                filler = want // MiB * MiB
                buf = b"\0" * MiB
                fd = os.open(os.path.join(m.mnt, "filler.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    for _ in range(filler // MiB):
                        os.write(fd, buf)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                m.sync()
        _warm(ctx.tarball)
        dest = os.path.join(m.mnt, "untar")
        os.mkdir(dest)
        before = m.fuse_requests()
        t0 = time.perf_counter()
        run(["tar", "xf", ctx.tarball, "-C", dest], out_path=raw, timeout=3600)
        t1 = time.perf_counter()
        m.sync(dest, quiet=False, timeout=3600)
        t2 = time.perf_counter()
        requests = m.requests_since(before)
        st = os.statvfs(m.mnt)
        used1 = (st.f_blocks - st.f_bfree) * st.f_frsize
        # not part of total_s: a FUSE filesystem may only make everything
        # durable at unmount, so show what the unmount costs everywhere
        umount_s = m.unmount_timed()
        res = {"tar_s": t1 - t0, "sync_s": t2 - t1, "total_s": t2 - t0, "umount_s": umount_s,
               "fs_bytes": total, "used_before_bytes": used0, "filler_bytes": filler,
               "used_after_bytes": used1, "used_after_pct": 100.0 * used1 / total if total else None,
               "tree_files": ctx.tar_stats["files"], "tree_bytes": ctx.tar_stats["bytes"]}
        if requests:
            res["fuse_requests"] = requests
            res["fuse_transport"] = m.transport
    with open(raw, "a") as f:
        f.write("\n# tar xf + sync timing\n" + json.dumps(res, indent=1) + "\n")
    return res


# ----------------------------------------------------------------------------
# workload 4: fio 4 KiB write + fsync latency, and the physical floor
# ----------------------------------------------------------------------------

def _fio_cmd(ctx, filename, direct, size, out_json):
    return ["fio", "--name=fsync4k", "--filename=" + filename,
            "--rw=" + ctx.args.fio_rw, "--bs=4k", "--ioengine=sync", "--fsync=1",
            "--direct=%d" % direct, "--size=%s" % size, "--runtime=%d" % ctx.duration,
            "--fallocate=none", "--lat_percentiles=1", "--percentile_list=50:90:99:99.9",
            "--output-format=json", "--output=" + out_json]


def _fio_run(ctx, cmd, raw_json, rec):
    rec["raw"] += [ctx.rel(raw_json), ctx.rel(raw_json[:-5] + ".log")]
    run(cmd, out_path=raw_json[:-5] + ".log", timeout=ctx.duration * 2 + 600)
    with open(raw_json, errors="replace") as f:
        return parsers.parse_fio(f.read())


def w_fio(ctx, fs, rep, rec):
    raw_json = raw_path(ctx, "fio", "%s-r%d.json" % (fs, rep))
    if fs == "raw-loop":
        with LoopOnly(ctx, 2 * GiB) as lo:
            return _fio_run(ctx, _fio_cmd(ctx, lo.dev, 1, "1g", raw_json), raw_json, rec)
    if fs == "host-file":
        path = os.path.join(ctx.workdir, "img", "host-floor.dat")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        try:
            return _fio_run(ctx, _fio_cmd(ctx, path, 1, "1g", raw_json), raw_json, rec)
        finally:
            if os.path.exists(path):
                os.unlink(path)
    with Mounted(fs, FS_TABLE[fs], ctx.main_size, "main", ctx) as m:
        return _fio_run(ctx, _fio_cmd(ctx, os.path.join(m.mnt, "fio.dat"), 0, "2g", raw_json), raw_json, rec)


# ----------------------------------------------------------------------------
# workload 5: birch embedded seed-003 (the library API, no FUSE)
# ----------------------------------------------------------------------------

EMBEDDED_EXAMPLE = "seed003_embedded"


def build_embedded_example():
    """Builds crates/birch/examples/seed003_embedded.rs from this checkout
    (a no-op when it is up to date) and returns the command running it; so
    the embedded numbers always come from the source the run measures.
    Without cargo the workload fails with the reason in the report."""
    exe = os.path.join(REPO_DIR, "target", "release", "examples", EMBEDDED_EXAMPLE)
    cargo = shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
    if not os.path.exists(os.path.join(REPO_DIR, "Cargo.toml")) or not os.access(cargo, os.X_OK):
        return "echo 'cannot build the %s example: no cargo or no birch checkout' >&2; exit 1" % EMBEDDED_EXAMPLE
    try:
        run([cargo, "build", "--quiet", "--release", "-p", "birch", "--example", EMBEDDED_EXAMPLE],
            cwd=REPO_DIR, timeout=1800)
    except Exception as e:
        return "echo %s >&2; exit 1" % shlex.quote("building the %s example failed: %s" % (EMBEDDED_EXAMPLE, e))
    return shlex.quote(exe)

def w_embedded(ctx, rep, rec):
    cmd = ctx.args.birch_embedded_cmd
    raw = raw_path(ctx, "embedded", "birch-embedded-r%d.txt" % rep)
    out_json = raw_path(ctx, "embedded", "birch-embedded-r%d.json" % rep)
    rec["raw"] += [ctx.rel(raw)]
    img = os.path.join(ctx.workdir, "img", "birch-embedded.img")
    os.makedirs(os.path.dirname(img), exist_ok=True)
    if os.path.exists(img):
        os.unlink(img)
    with open(img, "wb") as f:
        f.truncate(ctx.main_size)
    env = {"BENCH_IMAGE": img, "BENCH_FILES": str(ctx.dirlog_files), "BENCH_FSYNC_EVERY": "100",
           "BENCH_OUT": out_json}
    try:
        t0 = time.perf_counter()
        run(["/bin/sh", "-c", cmd], out_path=raw, env=env, timeout=3600)
        wall = time.perf_counter() - t0
    finally:
        if os.path.exists(img):
            os.unlink(img)
    res = None
    if os.path.exists(out_json):
        rec["raw"].append(ctx.rel(out_json))
        with open(out_json) as f:
            res = json.load(f)
    else:
        # key=value lines on stdout (create_s=1.23 sync_s=0.1 rename_s=2.0)
        kv = {}
        with open(raw, errors="replace") as f:
            for tok in f.read().split():
                if "=" in tok:
                    k, _, v = tok.partition("=")
                    try:
                        kv[k] = float(v)
                    except ValueError:
                        pass
        if "create_s" in kv and "rename_s" in kv:
            res = kv
    if res is None:
        res = {"total_s": wall, "note": "command printed no phase times; total_s is its wall time"}
    res.setdefault("total_s", sum(res.get(k, 0) for k in ("create_s", "sync_s", "rename_s")))
    res.setdefault("files", ctx.dirlog_files)
    return res


# ----------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="bench/run",
        description="Run the seeds' benchmarks on kernel btrfs/ext4/xfs (and birch) side by side.")
    p.add_argument("--fs", default=None,
                   help="comma list from: %s (default: btrfs,ext4,xfs; plus birch,birch-file "
                        "when --birch-bin is given)" % ",".join(FS_TABLE))
    p.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                   help="comma list from: %s (default: all)" % ",".join(ALL_WORKLOADS))
    p.add_argument("--duration", type=int, default=None,
                   help="seconds per dbench run and per fio run (default 60; quick 4)")
    p.add_argument("--repeat", type=int, default=None, help="repetitions (default 3; quick 1)")
    p.add_argument("--out", default=None,
                   help="results dir (default bench/results/<UTC date>-<host>/). If it already "
                        "holds results.json, results of workloads not run now are kept and the "
                        "report covers both")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke test: short runs, 1,000 files, small tarball, 1 repeat")
    p.add_argument("--install", action="store_true", help="apt-get install all needed packages first")
    p.add_argument("--birch-bin", default=None, help="path of the birch binary (enables birch)")
    p.add_argument("--birch-embedded-cmd", default=None,
                   help="shell command running seed 003 through birch's library API "
                        "(env: BENCH_IMAGE, BENCH_FILES, BENCH_FSYNC_EVERY, BENCH_OUT)")
    p.add_argument("--workdir", default=os.path.join(BENCH_DIR, "work"),
                   help="where images, mounts and caches live (default bench/work)")
    p.add_argument("--dirlog-files", type=int, default=None,
                   help="files for the seed-003 workload (default 10000; quick 1000)")
    p.add_argument("--untar-tarball", default=None,
                   help="tarball to untar (default: linux-source-6.1; quick: a small tree)")
    p.add_argument("--untar-sizes", default=None,
                   help="roomy,tight filesystem sizes in MiB (default 4096,1843; quick 1024,512)")
    p.add_argument("--tight-fill", type=float, default=83.0,
                   help="target %% used of the tight fs after the untar; a filler file is "
                        "written first when the tree alone would not get there (0 = never)")
    p.add_argument("--fio-rw", default="write", choices=["write", "randwrite"],
                   help="fio pattern (default write: sequential appends)")
    return p.parse_args(argv)


def collect_meta(ctx, argv):
    def out(cmd):
        try:
            rc, o, e = run(cmd, check=False, quiet=True, timeout=30)
            return (o + e).strip().splitlines()[0] if (o + e).strip() else ""
        except Exception:
            return ""
    def git_source():
        try:
            rc, o, _ = run(["git", "-C", REPO_DIR, "describe", "--always", "--dirty", "--abbrev=12"],
                           check=False, quiet=True, timeout=30)
        except Exception:
            return ""
        return o.strip() if rc == 0 else ""

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    m = ctx.meta
    m.update({
        "host": socket.gethostname(), "kernel": platform.release(),
        "cpu": cpu, "cpus": os.cpu_count(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB, 1),
        "python": sys.version.split()[0],
        "command": "bench/run " + " ".join(shlex.quote(a) for a in argv),
        "quick": ctx.quick, "duration_s": ctx.duration, "repeat": ctx.repeat,
        "fs": ctx.fs_list, "workloads": ctx.workloads, "dirlog_files": ctx.dirlog_files,
        "main_size": ctx.main_size, "roomy_size": ctx.roomy_size, "tight_size": ctx.tight_size,
        "tight_fill_pct": ctx.tight_fill, "fio_rw": ctx.args.fio_rw,
        "workdir": ctx.workdir,
        "fs_table": {n: {k: v for k, v in FS_TABLE[n].items() if k != "default"} for n in ctx.fs_list},
        "versions": {
            "dbench": out(["dbench", "--help"]) if shutil.which("dbench") else "",
            "fio": out(["fio", "--version"]) if shutil.which("fio") else "",
            "btrfs-progs": out(["mkfs.btrfs", "--version"]) if shutil.which("mkfs.btrfs") else "",
            "xfsprogs": out(["mkfs.xfs", "-V"]) if shutil.which("mkfs.xfs") else "",
            "e2fsprogs": out(["mke2fs", "-V"]) if shutil.which("mke2fs") else "",
            "tar": out(["tar", "--version"]),
            "birch": out([ctx.birch_bin, "--version"]) if ctx.birch_bin else "",
        },
        "workdir_fs": out(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", ctx.workdir]),
        # Which source the birch binary was measured at; "-dirty" marks
        # uncommitted changes in the tree it was run from.
        "source": git_source(),
    })


def main(argv):
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench/run must run as root (it makes loop devices and mounts)", file=sys.stderr)
        return 2
    quick = args.quick
    ctx = Ctx(args)
    ctx.quick = quick
    ctx.duration = args.duration or (4 if quick else 60)
    ctx.repeat = args.repeat or (1 if quick else 3)
    ctx.dirlog_files = args.dirlog_files or (1000 if quick else 10000)
    ctx.main_size = 4 * GiB
    if args.untar_sizes:
        r, t = args.untar_sizes.split(",")
        ctx.roomy_size, ctx.tight_size = int(r) * MiB, int(t) * MiB
    elif quick:
        ctx.roomy_size, ctx.tight_size = 1024 * MiB, 512 * MiB
    else:
        ctx.roomy_size, ctx.tight_size = 4096 * MiB, 1843 * MiB   # 4 GiB, 1.8 GiB
    ctx.tight_fill = args.tight_fill

    # ---- which filesystems ------------------------------------------------
    if args.birch_bin:
        args.birch_bin = os.path.realpath(args.birch_bin)
        if not (os.path.isfile(args.birch_bin) and os.access(args.birch_bin, os.X_OK)):
            print("--birch-bin %s is not an executable file" % args.birch_bin, file=sys.stderr)
            return 2
        ctx.birch_bin = args.birch_bin
    if args.fs:
        fs_list = [f.strip() for f in args.fs.split(",") if f.strip()]
    else:
        fs_list = [n for n, s in FS_TABLE.items() if s["default"]]
        if ctx.birch_bin:
            fs_list += BIRCH_FS
    bad = [f for f in fs_list if f not in FS_TABLE]
    if bad:
        print("unknown filesystem(s): %s (known: %s)" % (",".join(bad), ",".join(FS_TABLE)), file=sys.stderr)
        return 2
    if any(f in BIRCH_FS for f in fs_list) and not ctx.birch_bin:
        cands = [shutil.which("birch"), os.path.join(REPO_DIR, "target", "release", "birch"),
                 os.path.join(REPO_DIR, "target", "debug", "birch")]
        found = [c for c in cands if c and os.path.isfile(c) and os.access(c, os.X_OK)]
        if not found:
            print("--fs birch asked for but no birch binary found (give --birch-bin PATH "
                  "or build it: cargo build --release -p birch-cli)", file=sys.stderr)
            return 2
        ctx.birch_bin = os.path.realpath(found[0])
    ctx.fs_list = fs_list
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    bad = [w for w in workloads if w not in ALL_WORKLOADS]
    if bad:
        print("unknown workload(s): %s (known: %s)" % (",".join(bad), ",".join(ALL_WORKLOADS)), file=sys.stderr)
        return 2
    ctx.workloads = workloads
    if "embedded" in workloads and ctx.birch_bin and not args.birch_embedded_cmd:
        args.birch_embedded_cmd = build_embedded_example()

    # ---- work dir: lock, sweep leftovers, refuse if any remain ---------------
    os.makedirs(ctx.workdir, exist_ok=True)
    lock = open(os.path.join(ctx.workdir, ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("another bench/run is using %s" % ctx.workdir, file=sys.stderr)
        return 3
    install_signal_handlers()
    left = sweep(ctx.workdir)
    if left:
        print("refusing to start: leftovers in %s could not be cleaned:\n  %s" % (
            ctx.workdir, "\n  ".join(left)), file=sys.stderr)
        return 3

    # ---- results dir ---------------------------------------------------------
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%MZ")
    ctx.out = os.path.realpath(args.out or os.path.join(
        BENCH_DIR, "results", "%s-%s" % (stamp, socket.gethostname())))
    os.makedirs(ctx.out, exist_ok=True)
    ctx.raw_dir = os.path.join(ctx.out, "raw")
    os.makedirs(ctx.raw_dir, exist_ok=True)
    STATE.log_file = open(os.path.join(ctx.out, "run.log"), "a")
    prev = os.path.join(ctx.out, "results.json")
    if os.path.exists(prev):
        with open(prev) as f:
            old = json.load(f)
        ctx.kept_records = [r for r in old.get("records", []) if r["workload"] not in workloads]
        ctx.meta["previous_runs"] = old.get("meta", {}).get("previous_runs", []) + [
            {k: old.get("meta", {}).get(k) for k in ("command", "started", "finished", "workloads")}]
        log("keeping %d records of workloads not re-run from %s" % (len(ctx.kept_records), prev))

    t_start = time.time()
    ctx.meta["started"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rc = 0
    try:
        # ---- tools -----------------------------------------------------------
        tools = ["losetup", "mount", "umount", "sync", "tar"]
        for f in fs_list:
            tools += FS_TABLE[f]["tools"]
        if "dbench" in workloads:
            tools.append("dbench")
        if "fio" in workloads:
            tools.append("fio")
        ensure_tools(tools, force=args.install)
        if "dbench" in workloads:
            ctx.client_txt = find_client_txt()
            ctx.meta["dbench_loadfile"] = ctx.client_txt
        collect_meta(ctx, argv)
        log("results -> %s" % ctx.out)
        log("filesystems: %s; workloads: %s; duration %d s; repeat %d; dirlog files %d" % (
            ",".join(fs_list), ",".join(workloads), ctx.duration, ctx.repeat, ctx.dirlog_files))
        if "untar" in workloads:
            prepare_tarball(ctx)
        ctx.save()

        # Order: workload -> config -> repetition -> filesystem, so that every
        # filesystem sees the same machine conditions at nearly the same time.
        for w in workloads:
            for rep in range(1, ctx.repeat + 1):
                if w == "dirlog":
                    for fs in ["tmpfs-floor"] + fs_list:
                        measure(ctx, "dirlog", "seed003", fs, rep, lambda rec, fs=fs: w_dirlog(ctx, fs, rep, rec))
                elif w == "fio":
                    for fs in ["raw-loop", "host-file"] + fs_list:
                        measure(ctx, "fio", "4k-write-fsync", fs, rep, lambda rec, fs=fs: w_fio(ctx, fs, rep, rec))
                elif w == "embedded":
                    if args.birch_embedded_cmd:
                        measure(ctx, "embedded", "seed003", "birch-embedded", rep,
                                lambda rec: w_embedded(ctx, rep, rec))
                    elif rep == 1:
                        ctx.records.append({"workload": "embedded", "config": "seed003",
                                            "fs": "birch-embedded", "rep": 1, "ok": None,
                                            "error": "not run: no birch binary (--birch-bin) and no --birch-embedded-cmd",
                                            "metrics": None, "raw": []})
                        ctx.save()
                elif w == "untar":
                    for which in ("roomy", "tight"):
                        for fs in fs_list:
                            measure(ctx, "untar", which, fs, rep,
                                    lambda rec, fs=fs, which=which: w_untar(ctx, fs, which, rep, rec))
                elif w == "dbench":
                    for cfg, clients, sync_dirs in DBENCH_CONFIGS:
                        for fs in fs_list:
                            measure(ctx, "dbench", cfg, fs, rep,
                                    lambda rec, fs=fs, c=clients, s=sync_dirs, cfg=cfg:
                                    w_dbench(ctx, fs, cfg, c, s, rep, rec))
    except Interrupted as e:
        log("interrupted by signal %s" % e.args[0])
        rc = 128 + int(e.args[0])
    except Exception as e:  # noqa: BLE001
        log("harness error: %s" % e)
        log(traceback.format_exc())
        rc = 1
    finally:
        left = cleanup_all(ctx.workdir)   # STATE.cleaning stays set: later signals are ignored
        if left:
            log("WARNING: could not clean: %s" % ", ".join(left))
            rc = rc or 4

    ctx.meta["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    ctx.meta["elapsed_s"] = round(time.time() - t_start, 1)
    ctx.meta["loop_direct_io"] = ctx.dio
    ctx.meta["cleanup_failures"] = STATE.cleanup_failures
    ctx.save()

    # ---- report --------------------------------------------------------------
    import report
    why = ensure_matplotlib()
    try:
        report.write_report(ctx.out, plots=why is None, no_plots_reason=why)
        log("report: %s" % os.path.join(ctx.out, "report.md"))
    except Exception as e:  # noqa: BLE001
        log("report generation failed: %s" % e)
        log(traceback.format_exc())
        rc = rc or 1

    # ---- assertion: every requested workload produced numbers ----------------
    missing = report.missing_numbers(ctx.meta, ctx.records)
    if missing:
        log("MISSING RESULTS:\n  " + "\n  ".join(missing))
        rc = rc or 1
    elif rc == 0:
        log("all %d measurements produced numbers (%.0f s)" % (
            sum(1 for r in ctx.records if r.get("ok")), time.time() - t_start))
    leftovers = [mp for mp, _ in mountinfo() if under(mp, ctx.workdir)]
    leftovers += [d for d, bf in loop_devices() if bf and under(bf, ctx.workdir)]
    if leftovers:
        log("LEFTOVERS: %s" % leftovers)
        rc = rc or 4
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
