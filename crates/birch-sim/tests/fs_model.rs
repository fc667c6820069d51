//! The engine against the reference model: seeded random op sequences
//! (results compared after every op, whole views every 25 ops and at the
//! end, remounts with `birch check` after each close), plus large
//! directories and large files.
//!
//! `BIRCH_SEED=n` replays one seed of the random tests.

use birch_sim::harness::Sim;
use birch_sim::model::{Path, RenameFlags};
use birch_sim::runner::{fresh_device, run_model, ModelRun, ModelStats};
use birch_sim::workload::{seed_override, Op, Target, WorkloadConfig};
use std::time::Instant;

fn seeds(default: std::ops::Range<u64>) -> Vec<u64> {
    match seed_override() {
        Some(s) => vec![s],
        None => default.collect(),
    }
}

fn report(name: &str, runs: &[ModelStats], start: Instant) {
    let ops: usize = runs.iter().map(|s| s.ops).sum();
    let commits: u64 = runs.iter().map(|s| s.commits).sum();
    let remounts: usize = runs.iter().map(|s| s.remounts).sum();
    let mut tolerated: Vec<&String> = runs.iter().flat_map(|s| &s.tolerated).collect();
    tolerated.sort();
    tolerated.dedup();
    eprintln!(
        "{name}: {} seeds, {ops} ops, {commits} commits, {remounts} remounts, {:.2?}",
        runs.len(),
        start.elapsed()
    );
    if !tolerated.is_empty() {
        eprintln!(
            "  {} known engine bugs tolerated, e.g. {}",
            tolerated.len(),
            tolerated[0]
        );
    }
}

/// Many short sequences: 400 ops each.
#[test]
fn random_sequences_match_the_model() {
    let start = Instant::now();
    let runs: Vec<ModelStats> = seeds(0..300)
        .into_iter()
        .map(|seed| {
            run_model("fs_model", &ModelRun::new(seed, 400)).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    report("short sequences", &runs, start);
}

/// Fewer, long sequences (deeper trees, more history per inode), with
/// remounts now and then.
#[test]
fn long_random_sequences_match_the_model() {
    let start = Instant::now();
    let runs: Vec<ModelStats> = seeds(1000..1024)
        .into_iter()
        .map(|seed| {
            let mut run = ModelRun::new(seed, 2500);
            run.compare_every = 100;
            run_model("fs_model", &run).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    report("long sequences", &runs, start);
}

/// Sequences with subvolume ops mixed in (create, snapshots rw and ro of
/// the top level and of subvolumes, delete, cleaner runs), with remounts:
/// file ops reach into subvolumes and snapshots through their links, and
/// meet EROFS, EXDEV and the links' own rules.
#[test]
fn subvolume_sequences_match_the_model() {
    let start = Instant::now();
    let runs: Vec<ModelStats> = seeds(3000..3040)
        .into_iter()
        .map(|seed| {
            let mut run = ModelRun::new(seed, 400);
            run.cfg.subvolume_weight = 6;
            run.mount.cleaner_nodes_per_transaction = 1 + (seed % 3) as usize;
            run.compare_every = 10;
            run_model("fs_model", &run).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    report("subvolume sequences", &runs, start);
}

/// Subvolume sequences with renames of subvolume links mixed in (to a
/// new name, over an existing one, into another subvolume): the link
/// moves with its subvolume whole, as btrfs (docs/SNAPSHOTS.md (g)).
#[test]
fn subvolume_rename_sequences_match_the_model() {
    let start = Instant::now();
    let runs: Vec<ModelStats> = seeds(3100..3120)
        .into_iter()
        .map(|seed| {
            let mut run = ModelRun::new(seed, 400);
            run.cfg.subvolume_weight = 8;
            run.cfg.subvolume_rename_weight = 10;
            run.mount.cleaner_nodes_per_transaction = 1 + (seed % 3) as usize;
            run.compare_every = 10;
            run_model("fs_model", &run).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    report("subvolume rename sequences", &runs, start);
}

/// Sequences where a third of the renames carry RENAME_WHITEOUT
/// (docs/FUSE.md "Whiteouts and overlayfs"): the source's name becomes a
/// whiteout in the same change, the whiteout is unlinked, renamed and
/// replaced like any special file; with RENAME_EXCHANGE it is EINVAL, and
/// on a subvolume link EOPNOTSUPP.
#[test]
fn whiteout_rename_sequences_match_the_model() {
    let start = Instant::now();
    let runs: Vec<ModelStats> = seeds(3200..3212)
        .into_iter()
        .map(|seed| {
            let mut run = ModelRun::new(seed, 400);
            run.cfg.whiteout_rename_percent = 35;
            run.cfg.subvolume_weight = 4;
            run.cfg.subvolume_rename_weight = 10;
            run.compare_every = 10;
            run_model("fs_model", &run).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    report("whiteout rename sequences", &runs, start);
}

/// Write-heavy sequences with big writes: multi-extent files, sparse
/// writes at large offsets, a small dirty limit so commits land in the
/// middle of the workload.
#[test]
fn write_heavy_sequences_match_the_model() {
    let start = Instant::now();
    let runs: Vec<ModelStats> = seeds(2000..2012)
        .into_iter()
        .map(|seed| {
            let mut run = ModelRun::new(seed, 600);
            run.cfg = WorkloadConfig {
                max_write: 3 << 20,
                max_sparse_offset: 64 << 20,
                max_live_bytes: 40 << 20,
                ..WorkloadConfig::default()
            };
            run.mount.dirty_limit_bytes = 4 << 20;
            run.compare_every = 50;
            run_model("fs_model", &run).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    report("write-heavy sequences", &runs, start);
}

fn p(s: &str) -> Path {
    s.split('/')
        .filter(|c| !c.is_empty())
        .map(|c| c.as_bytes().to_vec())
        .collect()
}

fn step<D: birch::device::BlockDevice + 'static>(sim: &mut Sim<D>, op: Op) {
    if let Err(e) = sim.step(&op) {
        panic!("{e}");
    }
}

/// The fs tree's shape on the device (after a sync).
fn fs_tree<D: birch::device::BlockDevice + 'static>(sim: &Sim<D>) -> birch::check::TreeSummary {
    let report = birch::check::check_device(&**sim.device());
    report
        .summary
        .trees
        .iter()
        .find(|t| t.id == birch::format::tree_id::FS)
        .cloned()
        .expect("an fs tree")
}

/// Thousands of entries in one directory: leaves split as they fill and
/// merge as they empty; readdir pages through them; names collide in
/// nothing but their hash buckets. A tiny node cache makes every step
/// reload nodes from the device.
#[test]
fn thousands_of_files_in_one_directory() {
    const N: usize = 10_000;
    let start = Instant::now();
    let mut mount = birch::fs::MountOptions::deterministic();
    mount.cache_nodes = 32;
    let mut sim = Sim::open(fresh_device(128 << 20), mount, 2).unwrap();
    step(
        &mut sim,
        Op::Mkdir {
            path: p("big"),
            perm: 0o755,
        },
    );
    for i in 0..N {
        let path = p(&format!("big/entry-{i:05}-{}", "x".repeat(i % 40)));
        step(
            &mut sim,
            Op::Create {
                path: path.clone(),
                perm: 0o644,
            },
        );
        if i % 7 == 0 {
            step(
                &mut sim,
                Op::Write {
                    target: Target::Path(path.clone()),
                    offset: (i as u64 % 3) * 3000,
                    len: 100 + (i as u64 % 5000),
                    fill: i as u64,
                },
            );
        }
        if i % 11 == 0 {
            step(
                &mut sim,
                Op::SetXattr {
                    target: Target::Path(path),
                    name: b"user.i".to_vec(),
                    value_len: i % 300,
                    fill: i as u64,
                    mode: Default::default(),
                },
            );
        }
        if i % 997 == 0 {
            step(&mut sim, Op::Sync);
        }
    }
    sim.compare_views()
        .unwrap_or_else(|e| panic!("after creating {N}: {e}"));
    step(&mut sim, Op::Sync);
    let full = fs_tree(&sim);
    assert!(
        full.level >= 1 && full.leaves > 50,
        "{N} entries should need a tall fs tree: {full:?}"
    );
    // Rename every third into a second directory, hard-link every fifth.
    step(
        &mut sim,
        Op::Mkdir {
            path: p("other"),
            perm: 0o755,
        },
    );
    for i in (0..N).step_by(3) {
        let from = p(&format!("big/entry-{i:05}-{}", "x".repeat(i % 40)));
        step(
            &mut sim,
            Op::Rename {
                from,
                to: p(&format!("other/r{i}")),
                flags: RenameFlags::default(),
            },
        );
    }
    for i in (1..N).step_by(5) {
        if i % 3 != 0 {
            let from = p(&format!("big/entry-{i:05}-{}", "x".repeat(i % 40)));
            step(
                &mut sim,
                Op::Link {
                    from,
                    to: p(&format!("other/l{i}")),
                },
            );
        }
    }
    sim.remount()
        .unwrap_or_else(|e| panic!("remount after renames: {e}"));
    // Delete most of the first directory: leaves empty out and merge.
    for i in 0..N {
        if i % 3 != 0 && i % 10 != 1 {
            step(
                &mut sim,
                Op::Unlink {
                    path: p(&format!("big/entry-{i:05}-{}", "x".repeat(i % 40))),
                },
            );
        }
    }
    step(&mut sim, Op::Readdir { path: p("big") });
    sim.compare_views()
        .unwrap_or_else(|e| panic!("after unlinking: {e}"));
    step(&mut sim, Op::Sync);
    let emptied = fs_tree(&sim);
    assert!(
        emptied.leaves < full.leaves,
        "deleting most entries merges leaves: {full:?} -> {emptied:?}"
    );
    sim.remount()
        .unwrap_or_else(|e| panic!("final remount: {e}"));
    let dev = sim.close().unwrap();
    if let Err(r) = birch_sim::harness::check_image(&*dev) {
        panic!("check after close: {r}");
    }
    eprintln!("{N} entries: {:.2?}", start.elapsed());
}

/// Files of several MiB written in pieces that cross extent and page
/// boundaries, overwritten in the middle, shrunk and grown, with holes;
/// read back after remount.
#[test]
fn big_multi_extent_files() {
    let start = Instant::now();
    let mut mount = birch::fs::MountOptions::deterministic();
    mount.dirty_limit_bytes = 3 << 20;
    let mut sim = Sim::open(fresh_device(256 << 20), mount, 2).unwrap();
    let f = Target::Path(p("big1"));
    let g = Target::Path(p("big2"));
    step(
        &mut sim,
        Op::Create {
            path: p("big1"),
            perm: 0o644,
        },
    );
    step(
        &mut sim,
        Op::Create {
            path: p("big2"),
            perm: 0o600,
        },
    );
    // 8 MiB in 1 MiB + 3 byte pieces (no piece is page aligned).
    let mut off = 0;
    for i in 0..8u64 {
        step(
            &mut sim,
            Op::Write {
                target: f.clone(),
                offset: off,
                len: (1 << 20) + 3,
                fill: 100 + i,
            },
        );
        off += (1 << 20) + 3;
    }
    step(&mut sim, Op::Sync);
    // Interleave writes to two files so their extents interleave on disk.
    for i in 0..24u64 {
        step(
            &mut sim,
            Op::Write {
                target: g.clone(),
                offset: i * 300_000,
                len: 200_000 + i * 1000,
                fill: 200 + i,
            },
        );
        step(
            &mut sim,
            Op::Write {
                target: f.clone(),
                offset: i * 333_333 + 17,
                len: 4096 * (i + 1) + 1,
                fill: 300 + i,
            },
        );
        if i % 6 == 5 {
            step(
                &mut sim,
                Op::Fsync {
                    target: f.clone(),
                    datasync: i % 2 == 0,
                },
            );
        }
    }
    sim.compare_views().unwrap_or_else(|e| panic!("{e}"));
    // Shrink into the middle of an extent, grow with a hole, write far out.
    step(
        &mut sim,
        Op::Truncate {
            target: f.clone(),
            size: 5_000_001,
        },
    );
    step(
        &mut sim,
        Op::Truncate {
            target: f.clone(),
            size: 9_999_999,
        },
    );
    step(
        &mut sim,
        Op::Write {
            target: f.clone(),
            offset: 40 << 20,
            len: 70_000,
            fill: 400,
        },
    );
    step(
        &mut sim,
        Op::Read {
            target: f.clone(),
            offset: 4_999_000,
            len: 10_000,
        },
    );
    step(
        &mut sim,
        Op::Truncate {
            target: g.clone(),
            size: 2047,
        },
    );
    step(
        &mut sim,
        Op::Write {
            target: g.clone(),
            offset: 2040,
            len: 20,
            fill: 401,
        },
    );
    sim.remount().unwrap_or_else(|e| panic!("remount: {e}"));
    let summary = birch::check::check_device(&**sim.device()).summary;
    assert!(
        summary.file_extent_items >= 20 && summary.data_extent_bytes > 5 << 20,
        "multi-extent files: {summary:?}"
    );
    eprintln!(
        "{} file extent items over {} data extents",
        summary.file_extent_items, summary.data_extents
    );
    step(
        &mut sim,
        Op::Read {
            target: f.clone(),
            offset: (40 << 20) - 5,
            len: 100,
        },
    );
    step(
        &mut sim,
        Op::Truncate {
            target: f.clone(),
            size: 0,
        },
    );
    step(
        &mut sim,
        Op::Write {
            target: f,
            offset: 12345,
            len: 3 << 20,
            fill: 402,
        },
    );
    sim.remount()
        .unwrap_or_else(|e| panic!("final remount: {e}"));
    let dev = sim.close().unwrap();
    if let Err(r) = birch_sim::harness::check_image(&*dev) {
        panic!("check after close: {r}");
    }
    eprintln!("big files: {:.2?}", start.elapsed());
}

/// The comparison notices a difference (a harness that compares nothing
/// would pass everything): change the model behind the engine's back.
#[test]
fn canary_view_comparison_notices_a_difference() {
    let mut sim = Sim::open(
        fresh_device(32 << 20),
        birch::fs::MountOptions::deterministic(),
        1,
    )
    .unwrap();
    step(
        &mut sim,
        Op::Create {
            path: p("f"),
            perm: 0o644,
        },
    );
    step(
        &mut sim,
        Op::Write {
            target: Target::Path(p("f")),
            offset: 0,
            len: 10_000,
            fill: 1,
        },
    );
    sim.compare_views().unwrap();
    let ino = sim.model().resolve(&p("f")).unwrap();
    sim.model_mut().write(ino, 5000, b"!").unwrap();
    let err = sim
        .compare_views()
        .expect_err("a changed byte must be noticed");
    assert!(err.contains("/f: content: first differing page 1"), "{err}");
    // And per-op results: the model now reads something else.
    let err = sim
        .step(&Op::Read {
            target: Target::Path(p("f")),
            offset: 4999,
            len: 3,
        })
        .expect_err("a read of the changed byte must differ");
    assert!(err.contains("read /f"), "{err}");
    sim.model_mut().mkdir(&p("ghost"), 0o755, 0, 0).unwrap();
    let err = sim
        .compare_views()
        .expect_err("a missing directory must be noticed");
    assert!(err.contains("at /: nlink: expected 3, found 2"), "{err}");
}
