"""The machine's mounts and loop devices, as the harness needs to see them.

Everything here reads the kernel's own view (/proc/self/mountinfo, `losetup
--json`, /sys) rather than trusting what the harness believes it created, so
that cleanup also undoes what an interrupted earlier run left behind.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
from typing import Collection

from harness.procs import CmdError, Processes

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def mountinfo() -> list[tuple[str, str]]:
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


def is_mounted(path: str) -> bool:
    path = os.path.realpath(path)
    return any(mp == path for mp, _ in mountinfo())


def fstype_of(path: str) -> str:
    """The type /proc/self/mountinfo lists for a mount point ("" if none)."""
    return next((t for mp, t in mountinfo() if mp == path), "")


def under(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def loop_devices(procs: Processes) -> list[tuple[str, str]]:
    """[(device, back-file)] of all attached loop devices."""
    try:
        _, out, _ = procs.run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"],
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


def loop_dio(dev: str) -> bool | None:
    """Whether a loop device really does direct I/O (None: cannot tell);
    without it every filesystem would measure the host's page cache."""
    try:
        with open("/sys/block/%s/loop/dio" % os.path.basename(dev)) as f:
            return f.read().strip() == "1"
    except OSError:
        return None


def attach_loop(procs: Processes, image: str) -> str:
    """A new direct-io loop device over `image`; returns /dev/loopN."""
    _, out, _ = procs.run(["losetup", "--direct-io=on", "--find", "--show", image], timeout=60)
    dev = out.strip()
    if not dev.startswith("/dev/"):
        raise CmdError("losetup printed %r" % out)
    return dev


def syncfs(procs: Processes, path: str, quiet: bool = True, timeout: float = 1800) -> None:
    """syncfs of the filesystem holding `path` only, so that other work on
    a shared machine is not flushed inside a timing."""
    procs.run(["sync", "-f", path], quiet=quiet, timeout=timeout)


def drop_caches(procs: Processes) -> None:
    """Drop the host's clean page cache, dentries and inodes (root only),
    so that a read-back reads from the device."""
    procs.run(["sh", "-c", "echo 3 > /proc/sys/vm/drop_caches"], quiet=True, timeout=120)


def fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div:
            return "%.1f %s" % (n / div, unit)
    return "%d B" % n


def umount_path(procs: Processes, mp: str, fstype: str = "", attempts: int = 20) -> bool:
    """Unmount with retries; returns True when it is gone."""
    for i in range(attempts):
        if not is_mounted(mp):
            return True
        cmd = ["fusermount3", "-u", mp] if fstype.startswith("fuse") and shutil.which("fusermount3") \
            else ["umount", mp]
        try:
            procs.run(cmd, timeout=600, quiet=i > 0)
        except Exception as e:
            if i == 0:
                procs.log("umount %s failed (%s); retrying" % (mp, str(e).splitlines()[0]))
            time.sleep(0.5)
    if is_mounted(mp):
        # last resort: lazy unmount so nothing new can use it
        try:
            procs.run(["umount", "-l", mp], timeout=60)
        except Exception:
            pass
    return not is_mounted(mp)


def detach_loop(procs: Processes, dev: str, attempts: int = 10) -> bool:
    """`losetup -d` until the device is really gone (returns whether it is)."""
    for i in range(attempts):
        try:
            procs.run(["losetup", "-d", dev], timeout=60, quiet=i > 0)
        except Exception:
            time.sleep(0.5)
            continue
        # losetup -d on a busy device only sets autoclear: check it is gone
        for _ in range(20):
            if not any(d == dev for d, _ in loop_devices(procs)):
                return True
            time.sleep(0.25)
    return not any(d == dev for d, _ in loop_devices(procs))


def leftovers(procs: Processes, workdir: str) -> list[str]:
    """Mount points and loop devices of the work dir that still exist."""
    left = [mp for mp, _ in mountinfo() if under(mp, workdir)]
    left += [d for d, bf in loop_devices(procs) if bf and under(bf, workdir)]
    return left


def sweep(procs: Processes, workdir: str, images_in_use: Collection[str] = ()) -> list[str]:
    """Unmount everything mounted under workdir and detach every loop device
    backed by a file under workdir.  Returns a list of what is left."""
    left = []
    for mp, fstype in sorted(mountinfo(), key=lambda x: -len(x[0])):
        if under(mp, workdir) and os.path.realpath(mp) != os.path.realpath(workdir):
            procs.log("cleanup: unmounting leftover %s (%s)" % (mp, fstype))
            if not umount_path(procs, mp, fstype):
                left.append("mount %s" % mp)
    for dev, bf in loop_devices(procs):
        if bf and under(bf, workdir):
            procs.log("cleanup: detaching leftover %s (%s)" % (dev, bf))
            if not detach_loop(procs, dev):
                left.append("loop %s -> %s" % (dev, bf))
    if not left:
        # stale images and mount points of interrupted runs (sparse, but why keep them)
        for p in glob.glob(os.path.join(workdir, "img", "*")):
            if p not in images_in_use:
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
