"""`bench/run`'s command line, resolved into the settings of one run.

Kept apart from everything that needs root, so that the defaults (quick and
full mode), the filesystem and workload lists and the checks of bad usage can
be tested anywhere (bench/test_parse.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import dataclass
from typing import Optional, Sequence

from harness.host import GiB, MiB
from harness.paths import BENCH_DIR, REPO_DIR
from harness.setups import ABLATED_SETUPS, BIRCH_SETUPS, DEFAULT_SETUPS, PEER_FUSE_SETUPS, SETUPS
from harness.setups.birch import SEED_IDS
from harness.workloads import WORKLOAD_NAMES, WORKLOADS


class UsageError(ValueError):
    """Bad usage: `bench/run` prints the message and exits with status 2."""


@dataclass
class Options:
    """Everything a run was asked to do, defaults filled in."""

    argv: list[str]
    quick: bool
    duration: int                     # seconds per dbench run and per fio run
    repeat: int
    dirlog_files: int
    main_size: int                    # bytes of the dbench/dirlog/fio filesystems
    roomy_size: int                   # bytes of the untar filesystems
    tight_size: int
    tight_fill: float                 # % used of the tight fs after the untar
    fio_rw: str
    fs_list: list[str]
    workloads: list[str]
    workdir: str
    out: Optional[str]                # None: bench/results/<UTC date>-<host>/
    install: bool
    untar_tarball: Optional[str]
    birch_bin: Optional[str]
    birch_embedded_cmd: Optional[str]
    # `--ablation [IDS]`: the seeds whose benchmarks run with and without
    # their mechanism (docs/ABLATION.md); None: no ablation run.
    ablation_seeds: Optional[list[str]] = None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/run",
        description="Run the seeds' benchmarks on kernel btrfs/ext4/xfs (and birch) side by side.")
    p.add_argument("--fs", default=None,
                   help="comma list from: %s (default: %s; plus %s when --birch-bin is given)" % (
                       ",".join(SETUPS), ",".join(DEFAULT_SETUPS), ",".join(BIRCH_SETUPS + PEER_FUSE_SETUPS)))
    p.add_argument("--workloads", default=",".join(WORKLOAD_NAMES),
                   help="comma list from: %s (default: all)" % ",".join(WORKLOAD_NAMES))
    p.add_argument("--ablation", nargs="?", const=",".join(SEED_IDS), default=None, metavar="IDS",
                   help="each seed's own benchmark on birch with and without that seed's mechanism "
                        "(-o ablate=ID, docs/ABLATION.md), alternated; IDS: comma list from %s "
                        "(default all). Runs only the ablation workload on birch" % ",".join(SEED_IDS))
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
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """argparse only (exits on --help and malformed options, as before)."""
    return parser().parse_args(list(argv))


def _comma_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _executable(path: Optional[str]) -> bool:
    return path is not None and os.path.isfile(path) and os.access(path, os.X_OK)


def find_birch(repo_dir: str = REPO_DIR) -> Optional[str]:
    """The birch binary `--fs birch` uses without `--birch-bin`: PATH, then
    this checkout's release and debug builds."""
    for c in (shutil.which("birch"), os.path.join(repo_dir, "target", "release", "birch"),
              os.path.join(repo_dir, "target", "debug", "birch")):
        if c is not None and _executable(c):
            return os.path.realpath(c)
    return None


def _untar_sizes(args: argparse.Namespace) -> tuple[int, int]:
    if args.untar_sizes:
        try:
            roomy, tight = (int(x) for x in args.untar_sizes.split(","))
        except ValueError:
            raise UsageError("--untar-sizes %s: want two sizes in MiB, ROOMY,TIGHT" % args.untar_sizes) from None
        return roomy * MiB, tight * MiB
    if args.quick:
        return 1024 * MiB, 512 * MiB
    return 4096 * MiB, 1843 * MiB   # 4 GiB, 1.8 GiB


def resolve(args: argparse.Namespace, argv: Sequence[str], repo_dir: str = REPO_DIR) -> Options:
    """Fill in the defaults and check the lists; raises UsageError."""
    birch_bin = None
    if args.birch_bin:
        birch_bin = os.path.realpath(args.birch_bin)
        if not _executable(birch_bin):
            raise UsageError("--birch-bin %s is not an executable file" % birch_bin)
    ablation_seeds = None
    if args.ablation is not None:
        ablation_seeds = _comma_list(args.ablation)
        bad = [s for s in ablation_seeds if s not in SEED_IDS]
        if bad or not ablation_seeds:
            raise UsageError("--ablation %s: unknown seed id(s) %s (known: %s)" % (
                args.ablation, ",".join(bad) or "(none given)", ",".join(SEED_IDS)))
        if args.fs or args.workloads != ",".join(WORKLOAD_NAMES):
            raise UsageError("--ablation runs its own workload on birch: leave out --fs and --workloads")
        args.fs = "birch"
        args.workloads = "ablation"
    if args.fs:
        fs_list = _comma_list(args.fs)
    else:
        fs_list = list(DEFAULT_SETUPS) + (list(BIRCH_SETUPS) + list(PEER_FUSE_SETUPS) if birch_bin else [])
    bad = [f for f in fs_list if f not in SETUPS]
    if bad:
        raise UsageError("unknown filesystem(s): %s (known: %s)" % (",".join(bad), ",".join(SETUPS)))
    if any(f in BIRCH_SETUPS + ABLATED_SETUPS for f in fs_list) and not birch_bin:
        birch_bin = find_birch(repo_dir)
        if not birch_bin:
            raise UsageError("--fs birch asked for but no birch binary found (give --birch-bin PATH "
                             "or build it: cargo build --release -p birch-cli)")
    workloads = _comma_list(args.workloads)
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        raise UsageError("unknown workload(s): %s (known: %s)" % (",".join(bad), ",".join(WORKLOADS)))
    roomy, tight = _untar_sizes(args)
    quick = args.quick
    return Options(
        argv=list(argv), quick=quick,
        duration=args.duration or (4 if quick else 60),
        repeat=args.repeat or (1 if quick else 3),
        dirlog_files=args.dirlog_files or (1000 if quick else 10000),
        main_size=4 * GiB, roomy_size=roomy, tight_size=tight, tight_fill=args.tight_fill,
        fio_rw=args.fio_rw, fs_list=fs_list, workloads=workloads,
        workdir=os.path.realpath(args.workdir), out=args.out, install=args.install,
        untar_tarball=args.untar_tarball, birch_bin=birch_bin,
        birch_embedded_cmd=args.birch_embedded_cmd, ablation_seeds=ablation_seeds)
