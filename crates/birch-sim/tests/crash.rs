//! Crash-state enumeration: seeded random workloads, scripted crash cases
//! (the ones docs/CRASH-TESTING.md lists), and canaries proving that the
//! oracles notice a lost write.
//!
//! `BIRCH_SEED=n` replays one seed; `BIRCH_CRASH_LONG=1` runs the long mode.

use birch::device::DeviceEvent;
use birch::format::{Superblock, NODE_MAGIC, NODE_SIZE};
use birch_sim::crash::{
    check_durable, check_guarantees, check_state, explore, explore_each, record, run_seed,
    CrashConfig, CrashStats, OpSource, StateHook, Trace,
};
use birch_sim::model::{Path, RenameFlags, View};
use birch_sim::workload::{pattern, seed_override, Op, Target};
use std::collections::BTreeMap;

fn long_mode() -> bool {
    std::env::var("BIRCH_CRASH_LONG").is_ok_and(|v| v != "0" && !v.is_empty())
}

/// Explores the seeds `ci` (`long` in the long mode; the one of
/// `BIRCH_SEED` when set), each configured by `shape`, which returns what
/// its report line adds after the seed; panics naming the seed on the
/// first failure, and checks that some crash states were judged.
fn explore_seeds(
    ci: std::ops::Range<u64>,
    long: std::ops::Range<u64>,
    shape: impl Fn(u64, &mut CrashConfig) -> String,
) -> CrashStats {
    let seeds: Vec<u64> = match seed_override() {
        Some(s) => vec![s],
        None if long_mode() => long.collect(),
        None => ci.collect(),
    };
    let mut total = CrashStats::default();
    for seed in seeds {
        let mut cfg = if long_mode() {
            CrashConfig::long(seed)
        } else {
            CrashConfig::ci(seed)
        };
        let label = shape(seed, &mut cfg);
        let stats = run_seed(&cfg).unwrap_or_else(|e| panic!("seed={seed}{label}: {e}"));
        eprintln!(
            "seed={seed}{label}: {} flush points, {} crash states (largest window {} writes, {} with compressed extents), {} guarantee facts, {:.2?}",
            stats.flush_points, stats.crash_states, stats.largest_window, stats.states_with_compressed_extents, stats.guarantee_facts, stats.elapsed
        );
        total.add(&stats);
    }
    assert!(total.crash_states > 0);
    total
}

/// The CI seeds; three in five mount with `compress=` or
/// `compress-force=` and the workloads mix in compressible writes,
/// punches, reflinks, truncates and `chattr +c` (docs/COMPRESSION.md,
/// "The explorer"), so some judged states must hold compressed extents.
#[test]
fn every_crash_state_mounts_checks_clean_and_matches_the_model() {
    let total = explore_seeds(0..60, 0..300, |_, _| String::new());
    eprintln!(
        "{} workloads ({} ops), {} flush points, {} crash states ({} with compressed extents, {} with compressed inline extents), {} guarantee facts checked, {:.2?}",
        total.workloads, total.ops, total.flush_points, total.crash_states, total.states_with_compressed_extents, total.states_with_compressed_inline, total.guarantee_facts, total.elapsed
    );
    if seed_override().is_none() {
        assert!(
            total.states_with_compressed_extents > 0,
            "no explored crash state holds a compressed extent"
        );
        assert!(
            total.states_with_compressed_inline > 0,
            "no explored crash state holds a compressed inline extent"
        );
    }
}

/// Crash workloads with renames of subvolume links among the subvolume
/// ops (docs/SNAPSHOTS.md (g)): every crash state mounts, checks clean
/// and matches the model, the link at its old or its new name, whole.
/// Seeds 1000..1006 (`BIRCH_SEED=n` replays one); each prints its seed.
#[test]
fn subvolume_rename_crash_states_match_the_model() {
    explore_seeds(1000..1006, 1000..1100, |_, cfg| {
        cfg.workload.subvolume_weight = 12;
        cfg.workload.subvolume_rename_weight = 12;
        String::new()
    });
}

/// Crash workloads where a third of the renames carry RENAME_WHITEOUT:
/// every crash state mounts, checks clean and matches the model, the
/// rename whole with its whiteout or not at all; what an fsync promised
/// (the fsync contract, docs/TREE-LOG.md "Whiteouts") holds. Seeds
/// 1100..1106 (`BIRCH_SEED=n` replays one); each prints its seed.
#[test]
fn whiteout_rename_crash_states_match_the_model() {
    explore_seeds(1100..1106, 1100..1200, |_, cfg| {
        cfg.workload.whiteout_rename_percent = 35;
        String::new()
    });
}

/// Crash workloads with one seed's mechanism switched off each
/// (docs/ABLATION.md): the "before" paths a benchmark runs must be as
/// crash-safe as the mechanisms. Seeds 1200..1205, one per switch (seed
/// % 5 picks it: 000..004); the long mode runs 1200..1300.
/// `BIRCH_SEED=n` replays one; each prints its seed and switch.
#[test]
fn ablation_crash_states_match_the_model() {
    explore_seeds(1200..1205, 1200..1300, |seed, cfg| {
        let id = birch::Ablation::SEEDS[(seed % 5) as usize];
        cfg.mount.ablation.enable(id).unwrap();
        format!(" ablate={id}")
    });
}

// ----- scripted crash cases -----

fn p(s: &str) -> Path {
    s.split('/')
        .filter(|c| !c.is_empty())
        .map(|c| c.as_bytes().to_vec())
        .collect()
}

fn tp(s: &str) -> Target {
    Target::Path(p(s))
}

fn write(path: &str, offset: u64, len: u64, fill: u64) -> Op {
    Op::Write {
        target: tp(path),
        offset,
        len,
        fill,
    }
}

fn scripted(seed: u64, ops: Vec<Op>) -> (Trace, CrashConfig) {
    let mut cfg = CrashConfig::ci(seed);
    cfg.prepopulate = 0;
    cfg.mount = birch::fs::MountOptions::deterministic();
    cfg.exhaustive_max_writes = 12;
    let trace = record(&cfg, OpSource::Script(ops)).unwrap_or_else(|e| panic!("{e}"));
    (trace, cfg)
}

/// Explores every state of a scripted trace, calling `also` on each.
fn explore_all(trace: &Trace, cfg: &CrashConfig, also: &mut StateHook<'_>) -> CrashStats {
    explore_each(trace, cfg, also).unwrap_or_else(|f| panic!("{f}"))
}

/// The page digests of `len` bytes of pattern `fill` (for `len` a multiple
/// of the page size), as the view stores them.
fn digests(fill: u64, len: usize) -> Vec<u32> {
    pattern(fill, len)
        .chunks(4096)
        .map(crc32c::crc32c)
        .collect()
}

/// mkfs; create a; write a 0..8192 (X); sync; write a 0..4096 (Y); sync.
/// Every state holds a with X, or with Y over its first page and X after;
/// a crash that drops the second commit's superblock writes leaves X.
#[test]
fn overwrite_after_sync_is_old_or_new_never_mixed() {
    let (trace, cfg) = scripted(
        1,
        vec![
            Op::Create {
                path: p("a"),
                perm: 0o644,
            },
            write("a", 0, 8192, 1),
            Op::Sync,
            write("a", 0, 4096, 2),
            Op::Sync,
        ],
    );
    let x = digests(1, 8192);
    let mut y = digests(2, 4096);
    y.push(x[1]);
    let (mut saw_old, mut saw_new) = (false, false);
    // The second sync's superblock window is the one after flush 3.
    let second_sync = &trace.ops[4];
    assert_eq!(second_sync.flushes_before, 2, "{}", trace.listing());
    explore_all(&trace, &cfg, &mut |k, kept, r| {
        if k == 3 && kept.is_empty() && r.view.entries.get(&p("a")).map(|a| &a.content) != Some(&x)
        {
            return Err(
                "power cut after flush 3 with both superblock writes dropped: a must hold X".into(),
            );
        }
        let Some(a) = r.view.entries.get(&p("a")) else {
            return Ok(());
        };
        if a.size == Some(0) {
            return Ok(()); // before the first sync: created, not written yet
        }
        if a.content == x {
            saw_old = true;
        } else if a.content == y {
            saw_new = true;
        } else {
            return Err(format!("a holds neither X nor Y-over-X: {:?}", a.content));
        }
        Ok(())
    });
    assert!(
        saw_old && saw_new,
        "both outcomes occur among the crash states"
    );
}

/// create a (data); sync; rename a b; sync: in every state exactly one of
/// a and b exists, and it holds the data.
#[test]
fn rename_is_atomic() {
    let (trace, cfg) = scripted(
        2,
        vec![
            Op::Create {
                path: p("a"),
                perm: 0o644,
            },
            write("a", 0, 5000, 3),
            Op::Sync,
            Op::Rename {
                from: p("a"),
                to: p("b"),
                flags: RenameFlags::default(),
            },
            Op::Sync,
        ],
    );
    let data = pattern(3, 5000);
    let want: Vec<u32> = data.chunks(4096).map(crc32c::crc32c).collect();
    explore_all(&trace, &cfg, &mut |_, _, r| {
        let a = r.view.entries.get(&p("a"));
        let b = r.view.entries.get(&p("b"));
        match (a, b) {
            (None, None) if r.generation == trace.initial_generation => Ok(()),
            (Some(e), None) | (None, Some(e)) if e.content == want || e.size == Some(0) => Ok(()),
            (a, b) => Err(format!(
                "a: {:?}, b: {:?}",
                a.map(|e| e.size),
                b.map(|e| e.size)
            )),
        }
    });
}

/// sync; mkdir l; mkdir l/e; fsync-dir /; create l/e/a; fsync-dir l;
/// <power cut anywhere> → l/e/a may be missing after the second fsync:
/// the first logged l and l/e as a new subtree, l has not changed since,
/// so its fsync returns at once, as btrfs's (the fsync-dir oracle takes
/// l's subtree from the first fsync; it expected l/e/a before, which the
/// widened explorer's seed 1100 found).
#[test]
fn fsync_of_a_directory_its_parents_fsync_logged_returns_at_once() {
    let (trace, cfg) = scripted(
        8,
        vec![
            Op::Sync,
            Op::Mkdir {
                path: p("l"),
                perm: 0o755,
            },
            Op::Mkdir {
                path: p("l/e"),
                perm: 0o755,
            },
            Op::FsyncDir { target: tp("") },
            Op::Create {
                path: p("l/e/a"),
                perm: 0o644,
            },
            Op::FsyncDir { target: tp("l") },
        ],
    );
    let second = trace
        .ops
        .iter()
        .rfind(|r| matches!(r.op, Op::FsyncDir { .. }))
        .expect("the fsync of l");
    assert_eq!(
        second.flushes_before, second.flushes_after,
        "the fsync of an unchanged, logged directory writes nothing"
    );
    let stats = explore_all(&trace, &cfg, &mut |_, _, _| Ok(()));
    assert!(stats.crash_states > 0);
}

/// mkdir d; create d/f; write d/f; fsync d/f: every state after the fsync's
/// last flush has d/f with its data (today fsync commits; with the tree
/// log it writes a log, and this must still hold).
#[test]
fn fsync_makes_the_file_durable() {
    let (trace, cfg) = scripted(
        3,
        vec![
            Op::Mkdir {
                path: p("d"),
                perm: 0o755,
            },
            Op::Create {
                path: p("d/f"),
                perm: 0o644,
            },
            write("d/f", 0, 10000, 4),
            Op::Fsync {
                target: tp("d/f"),
                datasync: false,
            },
            write("d/f", 10000, 100, 5),
        ],
    );
    let fsync = trace
        .ops
        .iter()
        .find(|r| matches!(r.op, Op::Fsync { .. }))
        .expect("the fsync");
    let want = trace.ops[2].view_after.entries[&p("d/f")].clone();
    let mut after = 0;
    explore_all(&trace, &cfg, &mut |k, _, r| {
        if k >= fsync.flushes_after {
            after += 1;
            let f = r
                .view
                .entries
                .get(&p("d/f"))
                .ok_or("d/f is missing after its fsync")?;
            if f.content[..2] != want.content[..2] {
                return Err("d/f lost data written before its fsync".into());
            }
        }
        Ok(())
    });
    assert!(after > 0);
}

/// create f; write f; open f; unlink f; sync; <crash>: the orphan is
/// finished at mount and the image checks clean.
#[test]
fn unlinked_open_file_is_cleaned_up_after_a_crash() {
    let (trace, cfg) = scripted(
        4,
        vec![
            Op::Create {
                path: p("f"),
                perm: 0o644,
            },
            write("f", 0, 20000, 6),
            Op::Sync,
            Op::Open {
                path: p("f"),
                slot: 0,
            },
            Op::Unlink { path: p("f") },
            Op::Sync,
            write("f", 0, 100, 7),
            Op::Write {
                target: Target::Handle(0),
                offset: 0,
                len: 4096,
                fill: 8,
            },
            Op::Fsync {
                target: Target::Handle(0),
                datasync: false,
            },
        ],
    );
    explore_all(&trace, &cfg, &mut |_, _, r| {
        if r.generation > trace.ops[2].generation_after && r.view.entries.contains_key(&p("f")) {
            return Err("f is back after its unlink was committed".into());
        }
        Ok(())
    });
}

/// write 0..100000; sync; truncate to 5000; write far away (sparse); sync:
/// either the long file or the short sparse one, nothing between.
#[test]
fn truncate_and_sparse_write_commit_together() {
    let (trace, cfg) = scripted(
        5,
        vec![
            Op::Create {
                path: p("s"),
                perm: 0o644,
            },
            write("s", 0, 100_000, 9),
            Op::Sync,
            Op::Truncate {
                target: tp("s"),
                size: 5000,
            },
            write("s", 1 << 20, 3000, 10),
            Op::Sync,
        ],
    );
    explore_all(
        &trace,
        &cfg,
        &mut |_, _, r| match r.view.entries.get(&p("s")).and_then(|e| e.size) {
            None | Some(0) | Some(100_000) | Some(1_051_576) => Ok(()),
            other => Err(format!("s has size {other:?}")),
        },
    );
}

/// The superblock has two copies; a crash that keeps only one of the new
/// generation's copies still mounts the new generation.
#[test]
fn one_new_superblock_copy_is_enough() {
    let (trace, cfg) = scripted(
        6,
        vec![
            Op::Mkdir {
                path: p("d"),
                perm: 0o755,
            },
            Op::Sync,
            Op::Create {
                path: p("d/x"),
                perm: 0o644,
            },
            Op::Sync,
        ],
    );
    let last = trace.sb_writes.last().expect("superblock writes").clone();
    let mut seen = 0;
    explore_all(&trace, &cfg, &mut |k, kept, r| {
        let kept_copies: Vec<_> = trace
            .sb_writes
            .iter()
            .filter(|w| w.window == k && kept.contains(&w.pos))
            .collect();
        if k == last.window && kept_copies.len() == 1 {
            seen += 1;
            if r.generation != last.generation || !r.view.entries.contains_key(&p("d/x")) {
                return Err(format!(
                    "one copy of generation {} kept, mounted generation {}",
                    last.generation, r.generation
                ));
            }
        }
        Ok(())
    });
    assert_eq!(seen, 2, "each copy alone");
}

/// mkdir d; create d/f; write d/f (X); fsync d/f; create d/g; write d/g
/// (Y); fsync d/g; <power cut in the second log sync's one window: every
/// subset of its data, log nodes, mirrors and superblock copies> → a state
/// whose superblock names the second log but lacks some of its writes
/// mounts the first log (d/f with X, no d/g); every state passes every
/// oracle (docs/LOG-FLUSH.md).
#[test]
fn incomplete_log_sync_falls_back_to_the_previous_log() {
    let (trace, cfg) = scripted(
        7,
        vec![
            Op::Mkdir {
                path: p("d"),
                perm: 0o755,
            },
            Op::Create {
                path: p("d/f"),
                perm: 0o644,
            },
            write("d/f", 0, 10000, 4),
            Op::Fsync {
                target: tp("d/f"),
                datasync: false,
            },
            Op::Create {
                path: p("d/g"),
                perm: 0o644,
            },
            write("d/g", 0, 8192, 5),
            Op::Fsync {
                target: tp("d/g"),
                datasync: false,
            },
        ],
    );
    let second = trace.ops[6].flushes_after;
    let window = second - 1;
    assert_eq!(trace.ops[3].flushes_after, window, "one flush per log sync");
    let copies: Vec<usize> = trace
        .sb_writes
        .iter()
        .filter(|w| w.window == window && w.has_log)
        .map(|w| w.pos)
        .collect();
    assert_eq!(copies.len(), 2, "both superblock copies in the window");
    // The window's node runs (each with its DUP mirror's position) and
    // data writes: the second log is whole when every data write and one
    // copy of every node run reached the media.
    let win = trace.window(window);
    let (sb_at, sb_bytes) = win[copies[0]];
    let profile = Superblock::decode(sb_bytes, sb_at)
        .unwrap()
        .metadata_profile;
    let is_node = |b: &[u8]| b.len() >= NODE_SIZE && b[4..8] == NODE_MAGIC.to_le_bytes();
    let position = |offset: u64| win.iter().position(|&(o, _)| o == offset);
    let mut runs = Vec::new();
    let mut data = Vec::new();
    for (i, &(offset, bytes)) in win.iter().enumerate() {
        if copies.contains(&i) {
            continue;
        }
        if !is_node(bytes) {
            data.push(i);
        } else if let Some(mirror) = profile.mirror_of(offset).and_then(position) {
            runs.push((i, mirror));
        }
    }
    assert!(!data.is_empty() && !runs.is_empty(), "{} writes", win.len());
    let want_f = trace.ops[2].view_after.entries[&p("d/f")].clone();
    let (mut fallbacks, mut whole) = (0, 0);
    explore_all(&trace, &cfg, &mut |k, kept, r| {
        if k != window || !copies.iter().all(|c| kept.contains(c)) {
            return Ok(());
        }
        let second_whole = data.iter().all(|d| kept.contains(d))
            && runs
                .iter()
                .all(|(p, m)| kept.contains(p) || kept.contains(m));
        if r.view.entries.contains_key(&p("d/g")) != second_whole {
            return Err(format!(
                "second log whole: {second_whole}, but d/g is not so"
            ));
        }
        if second_whole {
            whole += 1;
        } else {
            fallbacks += 1;
        }
        let f = r.view.entries.get(&p("d/f")).ok_or("d/f lost")?;
        if f.content != want_f.content {
            return Err("d/f is not what its fsync made durable".into());
        }
        Ok(())
    });
    assert!(
        whole > 1 && fallbacks > 1,
        "{whole} whole, {fallbacks} fell back"
    );
}

// ----- canaries: the oracles must notice lost writes -----

fn canary_trace() -> Trace {
    scripted(
        7,
        vec![
            Op::Mkdir {
                path: p("d"),
                perm: 0o755,
            },
            Op::Create {
                path: p("d/a"),
                perm: 0o644,
            },
            write("d/a", 0, 65536, 11),
            Op::Sync,
            write("d/a", 0, 4096, 12),
            Op::Create {
                path: p("d/b"),
                perm: 0o644,
            },
            Op::Sync,
        ],
    )
    .0
}

/// Dropping the flushed superblock writes of the last commit leaves a
/// mountable, clean image of the previous generation: only the generation
/// oracle can tell, and it must.
#[test]
fn canary_dropped_superblock_writes_are_detected() {
    let trace = canary_trace();
    let k = trace.flush_count();
    // Sanity: the intact image passes.
    check_state(&trace, k, &[], trace.crash_image(k, &[]))
        .unwrap_or_else(|e| panic!("intact image fails: {e}"));
    let newest = trace.sb_writes.iter().map(|w| w.generation).max().unwrap();
    let dropped: Vec<usize> = trace
        .sb_writes
        .iter()
        .filter(|w| w.generation == newest)
        .map(|w| w.event)
        .collect();
    assert_eq!(dropped.len(), 2);
    let err = check_state(&trace, k, &[], trace.image_without(&dropped))
        .expect_err("a lost flushed superblock must be detected");
    assert!(err.contains("a flushed commit was lost"), "{err}");
}

/// A time later than the workload's end in a recovered inode is what a
/// mount that stamps inodes with its own clock leaves (generic/547's
/// replay bug): oracle 7 must reject it. Moving the end before the
/// workload's own changes makes every real time "later".
#[test]
fn canary_time_oracle_notices_a_stamped_inode() {
    let mut trace = canary_trace();
    let k = trace.flush_count();
    check_state(&trace, k, &[], trace.crash_image(k, &[]))
        .unwrap_or_else(|e| panic!("intact image fails: {e}"));
    trace.ended_at = birch::format::Timespec { sec: 1, nsec: 0 };
    let err = check_state(&trace, k, &[], trace.crash_image(k, &[]))
        .expect_err("an inode time after the workload's end must be detected");
    assert!(err.contains("the mount stamped it"), "{err}");
}

/// Zeroing a flushed node of the newest tree must fail `birch check` (and
/// the mount).
#[test]
fn canary_zeroed_node_is_detected() {
    let trace = canary_trace();
    let k = trace.flush_count();
    let mut image = trace.crash_image(k, &[]);
    let sb = Superblock::decode(&image[65536..65536 + 4096], 65536).unwrap();
    let root = sb.root_tree_bytenr as usize;
    image[root..root + NODE_SIZE].fill(0);
    let err = check_state(&trace, k, &[], image).expect_err("a zeroed root node must be detected");
    assert!(err.contains("birch check"), "{err}");
}

/// Dropping a flushed data write leaves an image whose metadata checks
/// clean and that mounts; `birch check --verify-data`, which the explorer
/// runs on every state, must tell: the block fails its data checksum
/// (docs/CHECK.md "Verifying the data"; reading the file would fail the
/// same way, docs/DATA-CHECKSUMS.md; on an image without checksums only
/// the comparison with the model could tell).
#[test]
fn canary_lost_data_write_is_detected() {
    let trace = canary_trace();
    let k = trace.flush_count();
    let second = pattern(12, 4096);
    let data_write = trace
        .events
        .iter()
        .position(|e| matches!(e, DeviceEvent::Write { bytes, .. } if bytes.starts_with(&second)))
        .expect("the data write of the second commit");
    let err = check_state(&trace, k, &[], trace.image_without(&[data_write]))
        .expect_err("a lost data write must be detected");
    assert!(
        err.contains("birch check") && err.contains("[data-csum-mismatch]"),
        "{err}"
    );
}

/// The persistence-guarantee oracle on its own: a recovered state of an
/// older commit breaks the promise of the last sync.
#[test]
fn canary_guarantee_oracle_notices_a_lost_sync() {
    let trace = canary_trace();
    let k = trace.flush_count();
    // The state of the first sync (op #3), before d/b existed.
    let older = &trace.snapshots[&trace.ops[3].generation_after];
    let err = check_guarantees(&trace, k, older)
        .expect_err("an older state breaks the last sync's promise");
    assert!(err.contains("/d/"), "{err}");
    let newest = &trace.snapshots[&trace.issued_generation(k)];
    assert!(check_guarantees(&trace, k, newest).unwrap() > 0);
}

/// The exploration as a whole fails on a trace whose recording lost a
/// flushed write (an always-passing oracle would not).
#[test]
fn canary_explore_fails_when_the_device_loses_a_flushed_write() {
    let mut trace = canary_trace();
    let cfg = CrashConfig::ci(7);
    explore(&trace, &cfg).unwrap_or_else(|f| panic!("intact trace fails: {f}"));
    // Make the newest superblock writes vanish from the recording: every
    // state after them now lacks a commit the trace says is durable.
    let newest = trace.sb_writes.iter().map(|w| w.generation).max().unwrap();
    let gone: Vec<usize> = trace
        .sb_writes
        .iter()
        .filter(|w| w.generation == newest)
        .map(|w| w.event)
        .collect();
    for &i in &gone {
        if let DeviceEvent::Write { offset, bytes } = &trace.events[i] {
            let old = trace.initial[*offset as usize..*offset as usize + bytes.len()].to_vec();
            // The first superblock of the trace (an older generation) stands in.
            let older = trace.events.iter().find_map(|e| match e {
                DeviceEvent::Write {
                    offset: o,
                    bytes: b,
                } if o == offset && b != bytes => Some(b.clone()),
                _ => None,
            });
            trace.events[i] = DeviceEvent::Write {
                offset: *offset,
                bytes: older.unwrap_or(old),
            };
        }
    }
    let failure = explore(&trace, &cfg).expect_err("exploring a trace with lost writes must fail");
    assert!(failure.message.contains("generation"), "{failure}");
    assert!(failure.to_string().contains("seed=7"));
}

/// The model's state after op `at` with the engine's inode numbers, as a
/// crash state recovered exactly there would read.
fn state_after(trace: &Trace, at: usize) -> (View, BTreeMap<Path, u64>) {
    let engine: BTreeMap<_, _> = trace.engine_inos.iter().map(|(e, m)| (*m, *e)).collect();
    let r = &trace.ops[at];
    let inos = r
        .inos_after
        .iter()
        .map(|(path, m)| (path.clone(), engine[m]))
        .collect();
    (r.view_after.clone(), inos)
}

/// The no-loss oracle on its own: a durable file renamed away and its name
/// reused, then lost (the engine bug of `fsync_contract`), or back with
/// data it never held since it was synced, fails; a durable file whose
/// unlink may have reached the media may be gone, one whose unlink cannot
/// have may not.
#[test]
fn canary_durable_oracle_notices_a_lost_inode() {
    let (trace, _) = scripted(
        8,
        vec![
            Op::Mkdir {
                path: p("d"),
                perm: 0o755,
            },
            Op::Create {
                path: p("d/a"),
                perm: 0o644,
            },
            write("d/a", 0, 9000, 21),
            Op::Create {
                path: p("d/u"),
                perm: 0o644,
            },
            Op::Sync,
            Op::Rename {
                from: p("d/a"),
                to: p("d/b"),
                flags: RenameFlags::default(),
            },
            Op::Create {
                path: p("d/a"),
                perm: 0o644,
            },
            Op::Unlink { path: p("d/u") },
            Op::Fsync {
                target: tp("d/a"),
                datasync: false,
            },
        ],
    );
    let fsync = 8;
    let k = trace.ops[fsync].flushes_after;
    let (view, inos) = state_after(&trace, fsync);
    // d, the renamed file, d/u (its unlink may be on the media: still judged,
    // allowed to be gone) and the fsynced new file.
    assert_eq!(check_durable(&trace, k, &[], &view, &inos), Ok(4));
    // The renamed file is gone; the new d/a took its name.
    let (mut lost, mut lost_inos) = (view.clone(), inos.clone());
    lost.entries.remove(&p("d/b"));
    lost_inos.remove(&p("d/b"));
    let e = check_durable(&trace, k, &[], &lost, &lost_inos).unwrap_err();
    assert!(e.contains("is lost") && e.contains("/d/b"), "{e}");
    // It is there, but with the new file's (empty) data.
    let mut wrong = view.clone();
    let empty = view.entries[&p("d/a")].clone();
    let b = wrong.entries.get_mut(&p("d/b")).unwrap();
    (b.size, b.content) = (empty.size, empty.content);
    let e = check_durable(&trace, k, &[], &wrong, &inos).unwrap_err();
    assert!(e.contains("never held"), "{e}");
    // d/u was unlinked before the fsync wrote anything: its removal may
    // be on the media after the fsync, not after the sync alone.
    let synced = trace.ops[4].flushes_after;
    let (at_sync, at_sync_inos) = state_after(&trace, 4);
    assert_eq!(
        check_durable(&trace, synced, &[], &at_sync, &at_sync_inos),
        Ok(3)
    );
    let (mut no_u, mut no_u_inos) = (at_sync.clone(), at_sync_inos.clone());
    no_u.entries.remove(&p("d/u"));
    no_u_inos.remove(&p("d/u"));
    let e = check_durable(&trace, synced, &[], &no_u, &no_u_inos).unwrap_err();
    assert!(e.contains("is lost"), "{e}");
}
