//! Workloads in the style of ACE (CrashMonkey, OSDI'18): every sequence of
//! one or two core operations over a small fixed set of files and
//! directories, each op followed by a persistence point.
//!
//! The setup ([`setup`]) makes directories `A`, `A/C`, `B` and files `foo`
//! (8 KiB), `bar` (100 bytes, inline), `A/foo` (5000 bytes), `A/bar`
//! (empty) and `B/foo` (20000 bytes), then syncs, so every op has
//! something to act on. The core ops ([`core_ops`]) are creat, mkdir,
//! write (append, overwrite, unaligned, inline growing past the inline
//! limit), truncate (shrink, extend: birch has no fallocate), link, unlink,
//! rename (file and directory, within and across directories, onto a new
//! name and over an existing one), rmdir and setxattr. Each is followed by
//! one of its persistence points ([`persistence_points`]): fsync and
//! fdatasync of the file it touched, fsync of each directory it touched
//! (the parents of its names, or the directory itself), or sync.
//!
//! A workload is kept only when it is valid by construction: every op
//! succeeds on the model (run from the setup state) and every fsync target
//! exists when it runs. Equal op lists are kept once. Each workload has an
//! id (`seq1:N`, `seq2:N`, its index in the enumeration) that replays it.
//!
//! Each workload is recorded and every crash state after the setup's sync
//! is judged by the oracles of [`crate::crash`] (mount + `birch check`,
//! generation, exact state without a log, the persistence guarantees,
//! nothing invented) plus [`check_renames`]: a rename leaves the old or the
//! new name, never neither, and never both for a file with one link.

use crate::crash::{
    explore_each, record, Covered, CrashConfig, CrashStats, OpSource, StateReport, Trace,
};
use crate::exec::Executor;
use crate::model::{show_path, Kind, Model, Path, RenameFlags, View, XattrMode};
use crate::workload::{Op, Persist, Target};
use std::collections::BTreeSet;
use std::time::Instant;

fn p(s: &str) -> Path {
    s.split('/')
        .filter(|c| !c.is_empty())
        .map(|c| c.as_bytes().to_vec())
        .collect()
}

fn write(path: &str, offset: u64, len: u64, fill: u64) -> Op {
    Op::Write {
        target: Target::Path(p(path)),
        offset,
        len,
        fill,
    }
}

fn create(path: &str) -> Op {
    Op::Create {
        path: p(path),
        perm: 0o644,
    }
}

fn mkdir(path: &str) -> Op {
    Op::Mkdir {
        path: p(path),
        perm: 0o755,
    }
}

fn rename(from: &str, to: &str) -> Op {
    Op::Rename {
        from: p(from),
        to: p(to),
        flags: RenameFlags::default(),
    }
}

/// The setup every workload starts from (ends with a sync).
pub fn setup() -> Vec<Op> {
    vec![
        mkdir("A"),
        mkdir("A/C"),
        mkdir("B"),
        create("foo"),
        create("bar"),
        create("A/foo"),
        create("A/bar"),
        create("B/foo"),
        write("foo", 0, 8192, 1),
        write("bar", 0, 100, 2),
        write("A/foo", 0, 5000, 3),
        write("B/foo", 0, 20000, 4),
        Op::Sync,
    ]
}

/// The core operations (each valid on the setup state).
pub fn core_ops() -> Vec<Op> {
    let xattr = |path: &str, name: &str, len: usize, fill: u64| Op::SetXattr {
        target: Target::Path(p(path)),
        name: name.as_bytes().to_vec(),
        value_len: len,
        fill,
        mode: XattrMode::Any,
    };
    let truncate = |path: &str, size: u64| Op::Truncate {
        target: Target::Path(p(path)),
        size,
    };
    let link = |from: &str, to: &str| Op::Link {
        from: p(from),
        to: p(to),
    };
    vec![
        create("baz"),
        create("A/baz"),
        mkdir("D"),
        mkdir("A/D"),
        write("foo", 8192, 4096, 11),   // append, aligned
        write("foo", 0, 4096, 12),      // overwrite, aligned
        write("foo", 3000, 4000, 13),   // overwrite, unaligned, across pages
        write("A/foo", 5000, 100, 14),  // append, unaligned
        write("bar", 100, 2900, 15),    // inline file grows past the inline limit
        write("A/bar", 0, 1000, 16),    // first data of an empty file
        write("B/foo", 30000, 500, 17), // sparse append
        truncate("foo", 3000),          // shrink, unaligned
        truncate("foo", 20000),         // extend (birch's stand-in for falloc)
        truncate("A/foo", 0),
        link("foo", "baz"),
        link("foo", "A/baz"),
        link("A/foo", "B/baz"),
        Op::Unlink { path: p("foo") },
        Op::Unlink { path: p("A/bar") },
        rename("foo", "baz"),     // file, within a dir, new name
        rename("foo", "bar"),     // file, within a dir, over an existing file
        rename("foo", "A/baz"),   // file, across dirs
        rename("A/foo", "B/foo"), // file, across dirs, over an existing file
        rename("A/C", "B/C"),     // empty dir, across dirs
        rename("A/C", "D"),       // empty dir, to the root
        rename("B", "D"),         // non-empty dir, within the root
        rename("A", "B/A"),       // dir with a subtree, into a sibling
        Op::Rmdir { path: p("A/C") },
        xattr("foo", "user.a", 17, 21),
        xattr("A", "user.a", 100, 22),
        xattr("A/foo", "user.b", 1000, 23),
    ]
}

fn parent(path: &Path) -> Path {
    path[..path.len().saturating_sub(1)].to_vec()
}

/// The persistence points that can follow `op`: fsync and fdatasync of the
/// file it leaves behind, fsync of every directory it touched (parents of
/// its names; the directory itself for mkdir, a directory rename or an
/// xattr on a directory), and sync.
pub fn persistence_points(before: &Model, op: &Op) -> Vec<Op> {
    let is_dir = |path: &Path| {
        before
            .resolve(path)
            .ok()
            .and_then(|i| before.inode(i))
            .is_some_and(|n| n.kind == Kind::Dir)
    };
    // (files to fsync, directories to fsync)
    let (files, dirs): (Vec<Path>, Vec<Path>) = match op {
        Op::Create { path, .. } => (vec![path.clone()], vec![parent(path)]),
        Op::Mkdir { path, .. } => (vec![], vec![path.clone(), parent(path)]),
        Op::Write {
            target: Target::Path(path),
            ..
        }
        | Op::Truncate {
            target: Target::Path(path),
            ..
        } => (vec![path.clone()], vec![]),
        Op::Link { from, to } => (vec![to.clone()], vec![parent(to), parent(from)]),
        Op::Unlink { path } | Op::Rmdir { path } => (vec![], vec![parent(path)]),
        Op::Rename { from, to, .. } if is_dir(from) => {
            (vec![], vec![to.clone(), parent(to), parent(from)])
        }
        Op::Rename { from, to, .. } => (vec![to.clone()], vec![parent(to), parent(from)]),
        Op::SetXattr {
            target: Target::Path(path),
            ..
        } if is_dir(path) => (vec![], vec![path.clone()]),
        Op::SetXattr {
            target: Target::Path(path),
            ..
        } => (vec![path.clone()], vec![]),
        _ => (vec![], vec![]),
    };
    let mut out = Vec::new();
    for f in files {
        out.push(Op::Fsync {
            target: Target::Path(f.clone()),
            datasync: false,
        });
        out.push(Op::Fsync {
            target: Target::Path(f),
            datasync: true,
        });
    }
    let mut seen = BTreeSet::new();
    for d in dirs {
        if seen.insert(d.clone()) {
            out.push(Op::FsyncDir {
                target: Target::Path(d),
            });
        }
    }
    out.push(Op::Sync);
    out
}

/// Applies `op` to the model through the shared executor; false if the
/// workload is invalid: the op fails, an fsync names a missing file (or a
/// directory: fsync-dir is its own persistence point), a write or
/// truncate targets a non-file, or a rename names one inode twice (a
/// no-op that succeeds: equivalent to no op at all, so not a workload of
/// its own).
fn model_apply(m: &mut Model, op: &Op) -> bool {
    let kind = |m: &Model, t: &Target| match t {
        Target::Path(path) => m
            .resolve(path)
            .ok()
            .and_then(|i| m.inode(i))
            .map(|n| n.kind),
        Target::Handle(_) => None,
    };
    let valid = match op {
        Op::Rename { from, to, .. } => !matches!(
            (m.resolve(from), m.resolve(to)),
            (Ok(a), Ok(b)) if a == b
        ),
        Op::Write { target, .. } | Op::Truncate { target, .. } => {
            kind(m, target) == Some(Kind::File)
        }
        Op::Fsync { target, .. } => kind(m, target).is_some_and(|k| k != Kind::Dir),
        Op::FsyncDir { target } => kind(m, target) == Some(Kind::Dir),
        Op::SetXattr { target, .. } | Op::RemoveXattr { target, .. } => kind(m, target).is_some(),
        Op::Create { .. }
        | Op::Mkdir { .. }
        | Op::Link { .. }
        | Op::Unlink { .. }
        | Op::Rmdir { .. }
        | Op::Sync => true,
        _ => false,
    };
    if !valid {
        return false;
    }
    // No handle slots: ACE ops name paths.
    let mut exec = Executor::new(std::mem::take(m), 0);
    let ok = exec.apply(op).is_ok_and(|o| o.is_ok());
    *m = exec.backend;
    ok
}

/// One ACE workload: the ops after the setup (core op, persistence point,
/// core op, persistence point, ...).
#[derive(Clone, Debug)]
pub struct AceWorkload {
    /// `seq1:N` or `seq2:N`.
    pub id: String,
    pub ops: Vec<Op>,
}

impl AceWorkload {
    /// The whole script: setup, then the workload.
    pub fn script(&self) -> Vec<Op> {
        let mut s = setup();
        s.extend(self.ops.iter().cloned());
        s
    }

    /// The ops on one line, `; `-separated.
    pub fn describe(&self) -> String {
        let ops: Vec<String> = self.ops.iter().map(|o| o.to_string()).collect();
        format!("{}: {}", self.id, ops.join("; "))
    }
}

fn setup_model() -> Model {
    let mut m = Model::new();
    for op in setup() {
        assert!(model_apply(&mut m, &op), "setup op `{op}` fails");
    }
    m
}

/// Every valid sequence of `len` (core op, persistence point) pairs, in a
/// fixed order, equal op lists kept once.
pub fn enumerate(len: usize) -> Vec<AceWorkload> {
    let core = core_ops();
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    let mut prefix: Vec<(Model, Vec<Op>)> = vec![(setup_model(), Vec::new())];
    for _ in 0..len {
        let mut next = Vec::new();
        for (model, ops) in &prefix {
            for op in &core {
                let mut m = model.clone();
                if !model_apply(&mut m, op) {
                    continue;
                }
                for pp in &persistence_points(model, op) {
                    let mut m2 = m.clone();
                    if !model_apply(&mut m2, pp) {
                        continue;
                    }
                    let mut o = ops.clone();
                    o.push(op.clone());
                    o.push(pp.clone());
                    next.push((m2, o));
                }
            }
        }
        prefix = next;
    }
    for (_, ops) in prefix {
        let key: Vec<String> = ops.iter().map(|o| o.to_string()).collect();
        if seen.insert(key) {
            out.push(AceWorkload {
                id: format!("seq{len}:{}", out.len()),
                ops,
            });
        }
    }
    out
}

/// A workload by id (`seq1:N`, `seq2:N`); `setup` is the setup alone.
pub fn by_id(id: &str) -> Option<AceWorkload> {
    if id == "setup" {
        return Some(AceWorkload {
            id: id.into(),
            ops: Vec::new(),
        });
    }
    let (seq, n) = id.split_once(':')?;
    let len: usize = seq.strip_prefix("seq")?.parse().ok()?;
    let n: usize = n.parse().ok()?;
    if !(1..=2).contains(&len) {
        return None;
    }
    enumerate(len).into_iter().nth(n)
}

/// The crash configuration of ACE workloads: every subset of windows of up
/// to `exhaustive` writes, else the structured subsets and `samples`
/// random ones.
pub fn config(exhaustive: usize, samples: usize) -> CrashConfig {
    let mut cfg = CrashConfig::ci(0);
    cfg.prepopulate = 0;
    cfg.split_writes = None;
    cfg.mount = birch::fs::MountOptions::deterministic();
    // Small images: the workloads hold under 100 KiB of data.
    cfg.device_bytes = 16 << 20;
    cfg.exhaustive_max_writes = exhaustive;
    cfg.sample_subsets = samples;
    cfg.max_structured = Some(samples);
    cfg
}

fn same_data(a: &crate::model::Entry, b: &crate::model::Entry) -> bool {
    a.kind == b.kind && a.size == b.size && a.content == b.content
}

/// The rename oracle. For every rename (op p) whose source was durable (at
/// the last sync before it, completed before the crash, the source had the
/// same data) and whose outcome no later op that may have reached the
/// media changes: the recovered view has the source's data at the old name
/// or at the new name (directories: a directory), and — for a file with
/// one link, or a directory renamed onto a new name — not at both. And
/// once a completed sync, or an fsync of the renamed inode at its new name,
/// made the rename durable, the old name does not come back (unless a later
/// op recreated it). Returns the number of renames judged.
pub fn check_renames(trace: &Trace, k: usize, recovered: &View) -> Result<usize, String> {
    let end = trace
        .flush_events
        .get(k)
        .copied()
        .unwrap_or(trace.events.len());
    let reach = trace
        .ops
        .iter()
        .rposition(|r| r.events_before < end)
        .map_or(0, |i| i + 1);
    let mut judged = 0;
    for (i, rec) in trace.ops.iter().enumerate() {
        let Op::Rename { from, to, .. } = &rec.op else {
            continue;
        };
        if i == 0 || !rec.ok {
            continue;
        }
        let before = &trace.ops[i - 1].view_after;
        let Some(src) = before.entries.get(from) else {
            continue;
        };
        // The source was durable: the last completed sync before saw it.
        let Some(sync) = trace.ops[..i].iter().rposition(|r| {
            r.ok && matches!(r.persist, Some((Persist::Sync, _))) && r.flushes_after <= k
        }) else {
            continue;
        };
        let is_dir = src.kind == Kind::Dir;
        let matches = |e: Option<&crate::model::Entry>| {
            e.is_some_and(|e| {
                if is_dir {
                    e.kind == Kind::Dir
                } else {
                    same_data(e, src)
                }
            })
        };
        let durable = trace.ops[sync..i]
            .iter()
            .all(|r| matches(r.view_after.entries.get(from)));
        if !durable {
            continue;
        }
        // The old name stays gone in every state that may have reached
        // the media.
        let gone = trace.ops[i..reach.max(i)]
            .iter()
            .all(|r| !r.view_after.entries.contains_key(from));
        // Made durable by a later completed sync, or fsync of the renamed
        // inode under its new name: then the old name never comes back.
        let persisted = trace.ops[i + 1..].iter().enumerate().find(|(_, r)| {
            r.ok && r.flushes_after <= k
                && match &r.persist {
                    Some((_, Covered::All)) => true,
                    Some((_, Covered::Inode { paths, .. })) => paths.contains(to),
                    None => false,
                }
        });
        if let Some((q, by)) = persisted {
            if gone && recovered.entries.contains_key(from) {
                return Err(format!(
                    "`{}` (op #{i}) was made durable by `{}` (op #{}), but {} is back",
                    rec.op,
                    by.op,
                    i + 1 + q,
                    show_path(from)
                ));
            }
        }
        // Nothing later changes the outcome: the new name keeps the data
        // (for a directory: nothing is renamed onto it or removed).
        let stable = gone
            && trace.ops[i..reach.max(i)]
                .iter()
                .all(|r| matches(r.view_after.entries.get(to)))
            && trace.ops[i + 1..reach.max(i + 1)].iter().all(|r| {
                !matches!(&r.op, Op::Rename { to: t, .. } if t == to)
                    && !matches!(&r.op, Op::Rmdir { path } if path == to)
            });
        if !stable {
            continue;
        }
        judged += 1;
        let (old, new) = (
            matches(recovered.entries.get(from)),
            matches(recovered.entries.get(to)),
        );
        if !old && !new {
            return Err(format!(
                "`{}` (op #{i}): neither {} nor {} holds the renamed {}",
                rec.op,
                show_path(from),
                show_path(to),
                if is_dir { "directory" } else { "file" }
            ));
        }
        let exclusive = if is_dir {
            !before.entries.contains_key(to)
        } else {
            src.nlink == 1
        };
        if old && new && exclusive {
            return Err(format!(
                "`{}` (op #{i}): both {} and {} hold the renamed {}",
                rec.op,
                show_path(from),
                show_path(to),
                if is_dir { "directory" } else { "file" }
            ));
        }
    }
    Ok(judged)
}

/// What one workload's exploration checked.
#[derive(Clone, Debug, Default)]
pub struct AceStats {
    pub crash: CrashStats,
    pub renames_judged: u64,
    /// Crash states whose superblock pointed at a log tree to replay.
    pub states_with_log: u64,
}

/// Records `w` (setup + ops) and judges every crash state after the
/// setup's sync. The error names the workload, its ops, the crash state and
/// how to replay it.
pub fn run(w: &AceWorkload, cfg: &CrashConfig) -> Result<AceStats, String> {
    let start = Instant::now();
    let mut cfg = cfg.clone();
    // A distinct, fixed seed per workload (for the random subsets).
    cfg.seed = w.id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let replay = format!(
        "replay: cargo run --release -p birch-sim --bin birch-crash -- --ace-workload {}\n    or: BIRCH_ACE_WORKLOAD={} cargo test -p birch-sim --test ace -- --nocapture\n",
        w.id, w.id
    );
    let trace = record(&cfg, OpSource::Script(w.script()))
        .map_err(|e| format!("ACE workload {}\n{e}{replay}", w.describe()))?;
    if let Some(bad) = trace.ops.iter().position(|r| !r.ok) {
        return Err(format!(
            "ACE workload {}: op #{bad} `{}` failed on the engine, though the model ran it\n{}{replay}",
            w.describe(),
            trace.ops[bad].op,
            trace.listing()
        ));
    }
    // The setup's windows are judged by the `setup` workload alone.
    if !w.ops.is_empty() {
        cfg.first_flush = trace.ops[setup().len() - 1].flushes_after;
    }
    let (mut renames, mut with_log) = (0u64, 0u64);
    let crash = explore_each(&trace, &cfg, &mut |k, _, r: &StateReport| {
        renames += check_renames(&trace, k, &r.view)? as u64;
        with_log += u64::from(r.has_log);
        Ok(())
    })
    .map_err(|f| {
        format!(
            "ACE workload {}\ncrash after flush {} keeping writes {:?} of the {} in its window: {}\n{}{replay}",
            w.describe(),
            f.flush,
            f.kept,
            f.window_len,
            f.message,
            f.context
        )
    })?;
    let mut crash = crash;
    crash.elapsed = start.elapsed();
    Ok(AceStats {
        crash,
        renames_judged: renames,
        states_with_log: with_log,
    })
}
