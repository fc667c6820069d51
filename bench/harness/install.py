"""Installing what a run lacks, with apt-get, so that `bench/run` works on a
fresh Debian machine without a separate setup step."""

from __future__ import annotations

import importlib
import shutil
import sys
from typing import Iterable, Optional

from harness.procs import CmdError, Processes

# Debian package providing each external tool.
PKG_FOR_TOOL = {
    "dbench": "dbench", "fio": "fio", "mkfs.btrfs": "btrfs-progs",
    "mkfs.xfs": "xfsprogs", "mkfs.ext4": "e2fsprogs", "losetup": "mount",
    "tar": "tar", "xz": "xz-utils", "fusermount3": "fuse3", "sync": "coreutils",
    "fuse2fs": "fuse2fs", "lsattr": "e2fsprogs",
}
# What `--install` installs up front.
INSTALL_ALL = ["dbench", "fio", "btrfs-progs", "xfsprogs", "e2fsprogs", "xz-utils",
               "python3-matplotlib"]


class Installer:
    """apt-get for one run; `apt-get update` runs at most once per run."""

    def __init__(self, procs: Processes) -> None:
        self.procs = procs
        self.updated = False

    def apt_install(self, pkgs: Iterable[str]) -> None:
        pkgs = sorted(set(pkgs))
        if not pkgs:
            return
        if not shutil.which("apt-get"):
            raise CmdError("apt-get not available; install by hand: %s" % " ".join(pkgs))
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        if not self.updated:
            self.procs.run(["apt-get", "update"], timeout=900, env=env)
            self.updated = True
        self.procs.run(["apt-get", "install", "-y", "--no-install-recommends"] + pkgs,
                       timeout=1800, env=env)

    def ensure_tools(self, tools: Iterable[str], force: bool = False) -> None:
        """Install the packages of the missing tools (of all of INSTALL_ALL
        with `force`); fail if a tool is still missing afterwards."""
        tools = list(tools)
        missing = [t for t in tools if not shutil.which(t)]
        pkgs = {PKG_FOR_TOOL.get(t, t) for t in missing}
        if force:
            pkgs |= set(INSTALL_ALL)
        if pkgs:
            self.procs.log("installing: %s" % " ".join(sorted(pkgs)))
            self.apt_install(pkgs)
        still = [t for t in tools if not shutil.which(t)]
        if still:
            raise CmdError("tools still missing after install: %s" % " ".join(still))

    def ensure_matplotlib(self) -> Optional[str]:
        """Import matplotlib; install python3-matplotlib or pip matplotlib if
        needed.  Returns None on success, else why there are no plots."""

        def importable() -> bool:
            try:
                importlib.invalidate_caches()
                importlib.import_module("matplotlib")
                return True
            except ImportError:
                return False

        if importable():
            return None
        try:
            self.apt_install(["python3-matplotlib"])
        except Exception as e:
            self.procs.log("apt install python3-matplotlib failed: %s" % e)
        if importable():
            return None
        try:
            self.procs.run([sys.executable, "-m", "pip", "install", "matplotlib"], timeout=900)
        except Exception as e:
            self.procs.log("pip install matplotlib failed: %s" % e)
        if importable():
            return None
        return "matplotlib not importable by %s" % sys.executable
