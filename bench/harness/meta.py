"""What results.json records about the run itself: machine, kernel, tool
versions, settings and the exact source measured, so a report read months
later says what its numbers came from."""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import socket
import sys
from typing import TYPE_CHECKING, Sequence

from harness.host import GiB
from harness.paths import REPO_DIR
from harness.setups import SETUPS

if TYPE_CHECKING:
    from harness.context import RunContext


def _first_line(ctx: RunContext, cmd: Sequence[str]) -> str:
    """First line a command prints ("" if it fails or prints nothing)."""
    try:
        _, o, e = ctx.run(cmd, check=False, quiet=True, timeout=30)
    except Exception:
        return ""
    text = (o + e).strip()
    return text.splitlines()[0] if text else ""


def _tool_version(ctx: RunContext, tool: str, cmd: Sequence[str]) -> str:
    return _first_line(ctx, cmd) if shutil.which(tool) else ""


def _git_source(ctx: RunContext) -> str:
    """Which source the birch binary was measured at; "-dirty" marks
    uncommitted changes in the tree it was run from."""
    try:
        rc, o, _ = ctx.run(["git", "-C", REPO_DIR, "describe", "--always", "--dirty", "--abbrev=12"],
                           check=False, quiet=True, timeout=30)
    except Exception:
        return ""
    return o.strip() if rc == 0 else ""


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def collect(ctx: RunContext) -> None:
    """Fill ctx.meta with the machine, the settings and the versions."""
    o = ctx.opts
    ctx.meta.update({
        "host": socket.gethostname(), "kernel": platform.release(),
        "cpu": _cpu_model(), "cpus": os.cpu_count(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB, 1),
        "python": sys.version.split()[0],
        "command": "bench/run " + " ".join(shlex.quote(a) for a in o.argv),
        "quick": o.quick, "duration_s": o.duration, "repeat": o.repeat,
        "fs": o.fs_list, "workloads": o.workloads, "dirlog_files": o.dirlog_files,
        "main_size": o.main_size, "roomy_size": o.roomy_size, "tight_size": o.tight_size,
        "tight_fill_pct": o.tight_fill, "fio_rw": o.fio_rw,
        "workdir": o.workdir,
        "fs_table": {n: SETUPS[n].describe() for n in o.fs_list},
        "versions": {
            "dbench": _tool_version(ctx, "dbench", ["dbench", "--help"]),
            "fio": _tool_version(ctx, "fio", ["fio", "--version"]),
            "btrfs-progs": _tool_version(ctx, "mkfs.btrfs", ["mkfs.btrfs", "--version"]),
            "xfsprogs": _tool_version(ctx, "mkfs.xfs", ["mkfs.xfs", "-V"]),
            "e2fsprogs": _tool_version(ctx, "mke2fs", ["mke2fs", "-V"]),
            "tar": _first_line(ctx, ["tar", "--version"]),
            "birch": _first_line(ctx, [o.birch_bin, "--version"]) if o.birch_bin else "",
            # fuse2fs -V prints its own version on stderr, fusermount's on stdout.
            "fuse2fs": _tool_version(ctx, "fuse2fs", ["sh", "-c", "fuse2fs -V 2>&1 >/dev/null"])
            if "fuse2fs" in o.fs_list else "",
        },
        "workdir_fs": _first_line(ctx, ["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", o.workdir]),
        "source": _git_source(ctx),
    })
