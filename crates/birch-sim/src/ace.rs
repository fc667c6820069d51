//! Workloads in the style of ACE (CrashMonkey, OSDI'18): every sequence of
//! one or two core operations over a small fixed set of files and
//! directories, each followed by a persistence point; and the fixed
//! workloads of the fsync contract ([`fixed`]).
//!
//! The setup ([`setup`]) makes directories `A`, `A/C`, `B` and files `foo`
//! (8 KiB), `bar` (100 bytes, inline), `A/foo` (5000 bytes), `A/bar`
//! (empty, one xattr) and `B/foo` (20000 bytes, second name `B/bar`), then
//! syncs, so every op has something to act on. The core ops
//! ([`core_ops`]) are creat, mkdir, write (append, overwrite, unaligned,
//! inline growing past the inline limit), truncate (shrink, extend: birch
//! has no fallocate), link, unlink, rename (file and directory, within and
//! across directories, onto a new name, over an existing one, exchange),
//! rmdir, setxattr and removexattr; and short sequences a program runs
//! without a persistence point in between: a name reused after a rename
//! (file and directory), swaps through a third name and through links, a
//! rename chain over a hard link, links over new and old directories, a
//! deep new subtree with links. Each is followed by one of its persistence
//! points ([`persistence_points`]): fsync and fdatasync of each file it
//! leaves (so also of an inode other than the renamed one), fsync of each
//! directory it touched (the parents of its names, or the directory
//! itself), or sync.
//!
//! A workload is kept only when it is valid by construction: every op
//! succeeds on the model (run from the setup state through the shared
//! [`Executor`]) and every fsync target exists when it runs. Equal op lists
//! are kept once. Each workload has an id (`seq1:N`, `seq2:N`, its index in
//! the enumeration; a fixed workload's name) that replays it.
//!
//! Each workload is recorded and every crash state after the setup's sync
//! is judged by the oracles of [`crate::crash`] (mount + `birch check`,
//! generation, exact state without a log, the persistence guarantees,
//! nothing durable lost, nothing invented) plus [`check_renames`] (a
//! rename leaves the old or the new name, never neither, and never both for
//! a file with one link) and, for a fixed workload, [`check_expected`].

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

fn link(from: &str, to: &str) -> Op {
    Op::Link {
        from: p(from),
        to: p(to),
    }
}

fn xattr(path: &str, name: &str, len: usize, fill: u64) -> Op {
    Op::SetXattr {
        target: Target::Path(p(path)),
        name: name.as_bytes().to_vec(),
        value_len: len,
        fill,
        mode: XattrMode::Any,
    }
}

fn fsync(path: &str) -> Op {
    Op::Fsync {
        target: Target::Path(p(path)),
        datasync: false,
    }
}

fn fsync_dir(path: &str) -> Op {
    Op::FsyncDir {
        target: Target::Path(p(path)),
    }
}

/// The setup every workload starts from (ends with a sync). `B/bar` is a
/// second name of `B/foo`, and `A/bar` carries an xattr, so single core
/// ops can rename over hard links and remove xattrs.
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
        link("B/foo", "B/bar"),
        xattr("A/bar", "user.x", 40, 5),
        Op::Sync,
    ]
}

/// The core operations. Most are one op; some are short sequences that
/// real programs run without a persistence point in between (a name
/// reused after a rename, swaps through a third name, links spread over
/// new directories): the shapes in which a crash loses what was durable
/// (docs/CRASH-TESTING.md). Each is valid on the setup state.
pub fn core_ops() -> Vec<Vec<Op>> {
    let truncate = |path: &str, size: u64| Op::Truncate {
        target: Target::Path(p(path)),
        size,
    };
    let single = vec![
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
        Op::Unlink { path: p("B/bar") }, // one of two names
        rename("foo", "baz"),            // file, within a dir, new name
        rename("foo", "bar"),            // file, within a dir, over an existing file
        rename("foo", "A/baz"),          // file, across dirs
        rename("A/foo", "B/foo"),        // file, across dirs, over a hard-linked file
        rename("B/bar", "A/bar"),        // a second name, over an existing file
        Op::Rename {
            from: p("A/foo"),
            to: p("B/foo"),
            flags: RenameFlags {
                no_replace: false,
                exchange: true,
                whiteout: false,
            },
        },
        rename("A/C", "B/C"), // empty dir, across dirs
        rename("A/C", "D"),   // empty dir, to the root
        rename("B", "D"),     // non-empty dir, within the root
        rename("A", "B/A"),   // dir with a subtree, into a sibling
        Op::Rmdir { path: p("A/C") },
        xattr("foo", "user.a", 17, 21),
        xattr("A", "user.a", 100, 22),
        xattr("A/foo", "user.b", 1000, 23),
        Op::RemoveXattr {
            target: Target::Path(p("A/bar")),
            name: b"user.x".to_vec(),
        },
    ];
    let mut out: Vec<Vec<Op>> = single.into_iter().map(|op| vec![op]).collect();
    out.extend([
        // A name reused after a rename: file with data, in the root.
        vec![
            rename("foo", "baz"),
            create("foo"),
            write("foo", 0, 4096, 31),
        ],
        // ... an empty file, in a directory (the other inode is fsynced).
        vec![rename("A/foo", "A/baz"), create("A/foo")],
        // ... across directories.
        vec![rename("A/foo", "B/baz"), create("A/foo")],
        // ... after a rename over an existing name.
        vec![rename("foo", "bar"), create("foo")],
        // A directory's name reused: with a subtree, and empty.
        vec![rename("A", "D"), mkdir("A")],
        vec![rename("A/C", "A/E"), mkdir("A/C")],
        // Two names swapped through a third.
        vec![
            rename("foo", "baz"),
            rename("bar", "foo"),
            rename("baz", "bar"),
        ],
        // Swapped through new names and a hard link, one name reused.
        vec![
            rename("foo", "baz"),
            rename("bar", "qux"),
            link("baz", "bar"),
            create("foo"),
        ],
        // A rename chain over a hard link: foo -> qux, its second name
        // bar -> foo, and bar reused.
        vec![
            rename("B/foo", "B/qux"),
            rename("B/bar", "B/foo"),
            create("B/bar"),
        ],
        // Hard links over a new and two old directories.
        vec![
            mkdir("D"),
            link("A/foo", "D/l"),
            link("A/foo", "B/l"),
            link("A/foo", "l"),
        ],
        // A deep new subtree holding links of an old file and a new file.
        vec![
            link("foo", "B/l1"),
            mkdir("B/x"),
            mkdir("B/x/y"),
            mkdir("B/x/y/z"),
            link("foo", "B/x/y/l2"),
            link("foo", "B/x/y/z/l3"),
            create("B/x/y/z/new"),
        ],
        // An xattr set and removed again on a renamed file.
        vec![
            rename("A/foo", "A/baz"),
            xattr("A/baz", "user.b", 60, 32),
            Op::RemoveXattr {
                target: Target::Path(p("A/baz")),
                name: b"user.b".to_vec(),
            },
        ],
    ]);
    out
}

fn parent(path: &Path) -> Path {
    path[..path.len().saturating_sub(1)].to_vec()
}

/// The persistence points that can follow the core op `ops` (run from
/// `before`): fsync and fdatasync of each file it leaves behind (one path
/// per inode), fsync of every directory it touched (parents of its names;
/// the directory itself for mkdir, a directory rename or an xattr on a
/// directory), and sync. Points whose target is gone by the end are
/// dropped by the enumeration's validity check.
pub fn persistence_points(before: &Model, ops: &[Op]) -> Vec<Op> {
    let mut model = before.clone();
    let mut files: Vec<Path> = Vec::new();
    let mut dirs: Vec<Path> = Vec::new();
    for op in ops {
        let is_dir = |path: &Path| {
            model
                .resolve(path)
                .ok()
                .and_then(|i| model.inode(i))
                .is_some_and(|n| n.kind == Kind::Dir)
        };
        let (f, d): (Vec<Path>, Vec<Path>) = match op {
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
            Op::Rename { from, to, flags } if flags.exchange => (
                vec![to.clone(), from.clone()],
                vec![parent(to), parent(from)],
            ),
            Op::Rename { from, to, .. } => (vec![to.clone()], vec![parent(to), parent(from)]),
            Op::SetXattr {
                target: Target::Path(path),
                ..
            }
            | Op::RemoveXattr {
                target: Target::Path(path),
                ..
            } if is_dir(path) => (vec![], vec![path.clone()]),
            Op::SetXattr {
                target: Target::Path(path),
                ..
            }
            | Op::RemoveXattr {
                target: Target::Path(path),
                ..
            } => (vec![path.clone()], vec![]),
            _ => (vec![], vec![]),
        };
        files.extend(f);
        dirs.extend(d);
        model_apply(&mut model, op);
    }
    let mut out = Vec::new();
    let mut inodes = BTreeSet::new();
    for f in files {
        // One path per inode that is still a file at the end.
        let Ok(ino) = model.resolve(&f) else { continue };
        if model.inode(ino).is_none_or(|n| n.kind == Kind::Dir) || !inodes.insert(ino) {
            continue;
        }
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

/// One ACE workload: a setup (ending with a sync) and the ops after it
/// (core op, persistence point, core op, persistence point, ... for the
/// enumerated ones).
#[derive(Clone, Debug)]
pub struct AceWorkload {
    /// `seq1:N`, `seq2:N`, or the name of a fixed workload.
    pub id: String,
    pub setup: Vec<Op>,
    pub ops: Vec<Op>,
    /// Subtrees (and files) that must be exactly as the model has them at
    /// the end in every crash state after the last op completed (the
    /// fixed workloads' own promise; empty for enumerated ones).
    pub expect: Vec<Path>,
}

impl AceWorkload {
    /// The whole script: setup, then the workload.
    pub fn script(&self) -> Vec<Op> {
        let mut s = self.setup.clone();
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
    // (the model after the ops: kept only while another step follows, as
    // tens of thousands of models of the last step would take gigabytes)
    let mut prefix: Vec<(Option<Model>, Vec<Op>)> = vec![(Some(setup_model()), Vec::new())];
    for step in 0..len {
        let last = step + 1 == len;
        let mut next = Vec::new();
        for (model, ops) in &prefix {
            let model = model.as_ref().expect("a model for every prefix");
            for core_op in &core {
                let mut m = model.clone();
                if !core_op.iter().all(|op| model_apply(&mut m, op)) {
                    continue;
                }
                for pp in &persistence_points(model, core_op) {
                    let mut m2 = m.clone();
                    if !model_apply(&mut m2, pp) {
                        continue;
                    }
                    let mut o = ops.clone();
                    o.extend(core_op.iter().cloned());
                    o.push(pp.clone());
                    next.push(((!last).then_some(m2), o));
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
                setup: setup(),
                ops,
                expect: Vec::new(),
            });
        }
    }
    out
}

/// The fixed workloads: the six sequences of issue 10 ("fsync contract")
/// in which a power cut after the last fsync lost what was durable before,
/// and the ones the explorer found after them; each with its own setup and
/// the paths that must come back exactly as the model has them.
pub fn fixed() -> Vec<AceWorkload> {
    let named = |id: &str, setup: Vec<Op>, ops: Vec<Op>, expect: &[&str]| AceWorkload {
        id: id.into(),
        setup,
        ops,
        expect: expect.iter().map(|e| p(e)).collect(),
    };
    vec![
        named(
            "rename_away_then_reuse_name",
            vec![
                mkdir("a"),
                create("a/foo"),
                write("a/foo", 0, 16384, 1),
                Op::Sync,
            ],
            vec![
                rename("a/foo", "a/bar"),
                create("a/foo"),
                write("a/foo", 0, 5000, 2),
                fsync("a/foo"),
            ],
            &["a"],
        ),
        named(
            "rename_dir_away_then_mkdir_same_name",
            vec![
                mkdir("a"),
                mkdir("a/x"),
                create("a/x/f1"),
                write("a/x/f1", 0, 3000, 3),
                create("a/x/f2"),
                write("a/x/f2", 0, 9000, 4),
                Op::Sync,
            ],
            vec![rename("a/x", "a/y"), mkdir("a/x"), fsync_dir("a/x")],
            &["a"],
        ),
        named(
            "swap_names_through_links",
            vec![
                mkdir("t"),
                create("t/f1"),
                write("t/f1", 0, 3, 5),
                create("t/f2"),
                write("t/f2", 0, 5, 6),
                Op::Sync,
            ],
            vec![
                rename("t/f1", "t/f3"),
                rename("t/f2", "t/f4"),
                link("t/f3", "t/f2"),
                create("t/f1"),
                fsync("t/f1"),
            ],
            &["t"],
        ),
        named(
            "rename_chain_over_hard_link",
            vec![
                mkdir("t"),
                create("t/foo"),
                write("t/foo", 0, 4096, 7),
                link("t/foo", "t/bar"),
                Op::Sync,
            ],
            vec![
                rename("t/foo", "t/qwerty"),
                rename("t/bar", "t/foo"),
                create("t/bar"),
                fsync("t/bar"),
            ],
            &["t"],
        ),
        named(
            "fsync_renamed_keeps_new_owner_of_old_name",
            vec![
                mkdir("dir"),
                create("dir/foo"),
                write("dir/foo", 0, 2000, 8),
                Op::Sync,
            ],
            vec![
                rename("dir/foo", "dir/bar"),
                create("dir/foo"),
                fsync("dir/bar"),
            ],
            &["dir"],
        ),
        named(
            "dir_fsync_logs_new_subdirectory_tree",
            vec![
                create("foo"),
                write("foo", 0, 8192, 9),
                mkdir("d"),
                Op::Sync,
            ],
            vec![
                link("foo", "d/l1"),
                link("foo", "d/l2"),
                mkdir("d/x"),
                mkdir("d/x/y"),
                mkdir("d/x/y/z"),
                link("foo", "d/x/y/l3"),
                link("foo", "d/x/y/z/l4"),
                create("d/x/y/z/qwerty"),
                fsync_dir("d"),
            ],
            &["d", "foo"],
        ),
        // Found by the explorer once the six above passed (crash seeds 15,
        // 28 and 44): a directory logged earlier in the transaction, then
        // given a new subdirectory with an entry, and fsynced again.
        named(
            "dir_fsync_after_earlier_log_keeps_new_subtree",
            vec![mkdir("d"), Op::Sync],
            vec![
                create("d/f"),
                fsync_dir("d"),
                mkdir("d/x"),
                create("d/x/q"),
                fsync_dir("d"),
            ],
            &["d"],
        ),
        // The fsync cases fstests caught (issue 21; docs/TREE-LOG.md).
        named(
            "generic_066_xattr_removal_persists_with_link",
            vec![create("f"), xattr("f", "user.a", 1, 10), Op::Sync],
            vec![
                write("f", 0, 2, 11),
                fsync("f"),
                Op::RemoveXattr {
                    target: Target::Path(p("f")),
                    name: b"user.a".to_vec(),
                },
                link("f", "f_link"),
                create("g"),
                fsync("g"),
            ],
            &["f", "f_link", "g"],
        ),
        named(
            "generic_104_fsync_logs_other_new_links_in_the_directory",
            vec![mkdir("d"), create("d/foo"), create("d/bar"), Op::Sync],
            vec![
                link("d/bar", "d/bar_link"),
                link("d/foo", "d/foo_link"),
                fsync("d/bar"),
            ],
            &["d"],
        ),
        named(
            "generic_336_move_out_of_old_parent_persists",
            vec![
                mkdir("a"),
                mkdir("b"),
                mkdir("c"),
                create("a/foo"),
                link("a/foo", "b/foo_link"),
                create("b/bar"),
                write("b/bar", 0, 3000, 12),
                Op::Sync,
            ],
            vec![
                Op::Unlink {
                    path: p("b/foo_link"),
                },
                rename("b/bar", "c/bar"),
                fsync("a/foo"),
            ],
            &["a", "b", "c"],
        ),
        named(
            "generic_343_moves_into_dir_of_new_link_persist",
            vec![
                mkdir("x"),
                mkdir("y"),
                mkdir("y/z"),
                create("x/foo"),
                create("y/foo2"),
                write("y/foo2", 0, 2000, 13),
                Op::Sync,
            ],
            vec![
                link("x/foo", "x/bar"),
                rename("y/z", "x/z"),
                rename("y/foo2", "x/foo2"),
                fsync("x/bar"),
            ],
            &["x", "y"],
        ),
        named(
            "generic_764_fsync_of_unlinked_open_file_persists_deletion",
            vec![
                mkdir("d"),
                create("d/foo"),
                Op::Open {
                    path: p("d/foo"),
                    slot: 0,
                },
                Op::Sync,
            ],
            vec![
                Op::Unlink { path: p("d/foo") },
                Op::Fsync {
                    target: Target::Handle(0),
                    datasync: false,
                },
            ],
            &["d"],
        ),
    ]
}

/// A workload by id (`seq1:N`, `seq2:N`, a fixed workload's name); `setup`
/// is the setup alone.
pub fn by_id(id: &str) -> Option<AceWorkload> {
    if id == "setup" {
        return Some(AceWorkload {
            id: id.into(),
            setup: setup(),
            ops: Vec::new(),
            expect: Vec::new(),
        });
    }
    if let Some(w) = fixed().into_iter().find(|w| w.id == id) {
        return Some(w);
    }
    let (seq, n) = id.split_once(':')?;
    let len: usize = seq.strip_prefix("seq")?.parse().ok()?;
    let n: usize = n.parse().ok()?;
    if !(1..=2).contains(&len) {
        return None;
    }
    enumerate(len).into_iter().nth(n)
}

/// The fixed workloads' promise: once the last op completed (all its
/// flushes among the first k), every expected path's subtree is exactly
/// the model's at the end: the same paths, each with the same kind, size,
/// content, link count, xattrs and link group.
pub fn check_expected(
    w: &AceWorkload,
    trace: &Trace,
    k: usize,
    recovered: &View,
) -> Result<usize, String> {
    let last = trace.ops.len() - 2; // the last op before the unmount
    if w.expect.is_empty() || trace.ops[last].flushes_after > k {
        return Ok(0);
    }
    let want = &trace.ops[last].view_after;
    let mut judged = 0;
    for top in &w.expect {
        let under = |v: &View| -> Vec<Path> {
            v.entries
                .keys()
                .filter(|q| q.starts_with(top))
                .cloned()
                .collect()
        };
        for path in under(want) {
            judged += 1;
            let Some(got) = recovered.entries.get(&path) else {
                return Err(format!(
                    "`{}` completed, but {} is missing",
                    trace.ops[last].op,
                    show_path(&path)
                ));
            };
            if let Some(d) = crate::model::diff_entry(&want.entries[&path], got) {
                return Err(format!(
                    "`{}` completed, but {} differs: {d}",
                    trace.ops[last].op,
                    show_path(&path)
                ));
            }
        }
        if let Some(extra) = under(recovered)
            .into_iter()
            .find(|q| !want.entries.contains_key(q))
        {
            return Err(format!(
                "`{}` completed, but {} exists",
                trace.ops[last].op,
                show_path(&extra)
            ));
        }
    }
    Ok(judged)
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
        // Both names are wrong only if no state the crash may have
        // recovered had both: from the sync that made the source durable
        // on, the file had one link (a second name, dropped later in the
        // transaction, may still be there: the last commit had it) and the
        // new name did not hold the same data already (a replaced target
        // alike in content, e.g. two empty files: the views compare data,
        // not inodes), or the directory's new name was free.
        let exclusive = trace.ops[sync..i].iter().all(|r| {
            if is_dir {
                !r.view_after.entries.contains_key(to)
            } else {
                r.view_after.entries.get(from).is_some_and(|e| e.nlink == 1)
                    && !matches(r.view_after.entries.get(to))
            }
        });
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
    /// Paths a fixed workload's promise judged, over all states.
    pub expected_judged: u64,
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
        cfg.first_flush = trace.ops[w.setup.len() - 1].flushes_after;
    }
    let (mut renames, mut with_log, mut expected) = (0u64, 0u64, 0u64);
    let crash = explore_each(&trace, &cfg, &mut |k, _, r: &StateReport| {
        renames += check_renames(&trace, k, &r.view)? as u64;
        expected += check_expected(w, &trace, k, &r.view)? as u64;
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
        expected_judged: expected,
    })
}
