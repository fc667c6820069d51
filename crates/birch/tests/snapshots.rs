//! Snapshots through the library (docs/SNAPSHOTS.md (c), step 8 of (j)):
//! the crash cases of (i) that make or use a snapshot, each named after
//! its case, every crash image `birch check`-clean (shared node and data
//! extent counts included) before and after its mount.
//!
//! Until every data call is routed into its subvolume (fs/mod.rs), only
//! lookup, getattr, readdir, create, mkdir and fsync act inside a
//! subvolume other than 5: most tests compare a snapshot with its source
//! by [`shape`] (names, types, sizes, link counts, times) and read data in
//! tree 5 only. The tests that read or write data inside a snapshot say
//! so.

mod common;

use birch::device::{BlockDevice, MemoryDevice};
use birch::error::Error;
use birch::format::{tree_id, FileType, ROOT_DIR_INO};
use birch::fs::{Filesystem, InoSpace};
use common::{
    assert_clean, crash_mount, crash_points, ino, memory_fs, mount, recorder, Enumeration,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Path below a directory -> what getattr says of it: enough to tell a
/// snapshot from its source without reading data.
type Shape = BTreeMap<String, String>;

fn shape<D: BlockDevice + 'static>(fs: &Filesystem<D>, dir: u64) -> Shape {
    fn walk<D: BlockDevice + 'static>(fs: &Filesystem<D>, dir: u64, prefix: &str, out: &mut Shape) {
        for e in fs.readdir(dir, 0, usize::MAX).unwrap() {
            let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
            let a = fs.getattr(e.ino).unwrap();
            out.insert(
                path.clone(),
                format!(
                    "{:?} size {} nlink {} perm {:o} mtime {:?}",
                    a.file_type, a.size, a.nlink, a.perm, a.mtime
                ),
            );
            if e.file_type == FileType::Directory {
                walk(fs, e.ino, &path, out);
            }
        }
    }
    let mut out = Shape::new();
    walk(fs, dir, "", &mut out);
    out
}

/// `shape` without the entries under `name` (the snapshot's own link,
/// which its source gained after the copy).
fn without(mut s: Shape, name: &str) -> Shape {
    let prefix = format!("/{name}");
    s.retain(|path, _| path != &prefix && !path.starts_with(&format!("{prefix}/")));
    s
}

fn lookup<D: BlockDevice + 'static>(fs: &Filesystem<D>, dir: u64, name: &str) -> Option<u64> {
    match fs.lookup(dir, name.as_bytes()) {
        Ok(a) => Some(a.ino),
        Err(Error::NotFound) => None,
        Err(e) => panic!("lookup {name}: {e}"),
    }
}

/// Data for file `i` of a test: sizes differ so that `shape` tells them
/// apart, and most are past the inline limit (shared data extents).
fn content(i: usize, round: u8) -> Vec<u8> {
    vec![round.wrapping_add(i as u8); 3000 + 97 * i]
}

/// Crash case: `subvolume create sv; write 100 files in sv; sync;
/// snapshot sv snap; <cut anywhere in the snapshot's commit>` → either no
/// `snap`, or `snap` with `sv`'s shape; the files stay in `sv`.
#[test]
fn power_cut_right_after_snapshot() {
    let rec = recorder(32 << 20, 0x81);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let sv_id = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    for d in 0..4 {
        let dir = fs
            .mkdir(sv, format!("d{d}").as_bytes(), 0o755, 0, 0)
            .unwrap()
            .ino;
        for f in 0..25 {
            let name = format!("file-with-a-long-name-{f:04}");
            fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap();
        }
    }
    fs.sync().unwrap();
    let before = shape(&fs, sv);
    assert_eq!(before.len(), 104);
    let synced = rec.flush_count();
    let snap_id = fs.create_snapshot(sv_id, root, b"snap", false).unwrap();
    assert_eq!(snap_id, sv_id + 1);
    assert_eq!(shape(&fs, lookup(&fs, root, "snap").unwrap()), before);
    drop(fs);
    let points = crash_points(&rec, synced, &Enumeration::thorough(0x81));
    let mut saw = [false; 2];
    for point in &points {
        let has = crash_mount(&rec, point, |fs| {
            let root = fs.root_ino();
            let sv = lookup(fs, root, "sv").unwrap();
            assert_eq!(shape(fs, sv), before, "{point:?}: sv");
            let snap = lookup(fs, root, "snap");
            if let Some(snap) = snap {
                assert_eq!(InoSpace::split(snap), (snap_id, ROOT_DIR_INO));
                assert_eq!(shape(fs, snap), before, "{point:?}: snap");
            }
            snap.is_some()
        });
        saw[has as usize] = true;
    }
    assert_eq!(
        saw,
        [true, true],
        "both outcomes among {} states",
        points.len()
    );
}

/// Crash case: `write f A; fsync f; snapshot -r 5 snap; write f B; fsync
/// f; <cut>` → `snap/f` = A, `f` = B; writing `snap/f` is EROFS. Reads
/// and writes `snap/f`: passes once data calls are routed into
/// subvolumes.
#[test]
fn snapshot_is_its_source_at_the_commit() {
    let rec = recorder(32 << 20, 0x82);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    let (a, b) = (content(1, b'A'), content(2, b'B'));
    fs.write_file(f, 0, &a).unwrap();
    fs.fsync(f, false).unwrap();
    fs.create_snapshot(tree_id::FS, root, b"snap", true)
        .unwrap();
    fs.write_file(f, 0, &b).unwrap();
    fs.fsync(f, false).unwrap();
    let snap_f = ino(&fs, "snap/f");
    assert_eq!(fs.read_file(snap_f, 0, 1 << 20).unwrap(), a);
    assert!(matches!(
        fs.write_file(snap_f, 0, b"x"),
        Err(Error::ReadOnly)
    ));
    let synced = rec.flush_count();
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::thorough(0x82)) {
        crash_mount(&rec, &point, |fs| {
            assert_eq!(
                fs.read_file(ino(fs, "f"), 0, 1 << 20).unwrap(),
                b,
                "{point:?}"
            );
            let snap_f = ino(fs, "snap/f");
            assert_eq!(fs.read_file(snap_f, 0, 1 << 20).unwrap(), a, "{point:?}");
            assert!(matches!(
                fs.write_file(snap_f, 0, b"x"),
                Err(Error::ReadOnly)
            ));
        });
    }
}

/// Crash case: `write 300 files; sync; snapshot 5 snap; rewrite, truncate,
/// unlink and create files in 5, fsync some; <cut at every log sync and
/// commit after the snapshot>` → `snap` keeps the shape 5 had, 5 has
/// every fsynced change; the counts of shared nodes and data extents stay
/// right in every state (check).
#[test]
fn source_changes_after_snapshot_do_not_reach_it() {
    const FILES: usize = 300;
    let rec = recorder(64 << 20, 0x83);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let files: Vec<u64> = (0..FILES)
        .map(|i| {
            let f = fs
                .create(root, format!("f{i:03}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino;
            fs.write_file(f, 0, &content(i % 40, 1)).unwrap();
            f
        })
        .collect();
    fs.sync().unwrap();
    let at_snapshot = shape(&fs, root);
    fs.create_snapshot(tree_id::FS, root, b"snap", false)
        .unwrap();
    let synced = rec.flush_count();
    // Per file: its content before and after the change (None: no such
    // file), and the flush count once the fsync that made the change
    // durable returned.
    let mut expect: BTreeMap<String, FileChange> = BTreeMap::new();
    let mut unlinked = Vec::new();
    for (i, &f) in files.iter().enumerate() {
        let name = format!("f{i:03}");
        let old = Some(content(i % 40, 1));
        match i % 6 {
            0 => {
                let data = content(i % 40, 2);
                fs.write_file(f, 0, &data).unwrap();
                fs.fsync(f, false).unwrap();
                expect.insert(name, (old, Some(data), rec.flush_count()));
            }
            1 => {
                fs.truncate(f, 100).unwrap();
                fs.fsync(f, false).unwrap();
                let cut = content(i % 40, 1)[..100].to_vec();
                expect.insert(name, (old, Some(cut), rec.flush_count()));
            }
            2 => {
                fs.unlink(root, name.as_bytes()).unwrap();
                unlinked.push((name, old));
            }
            _ => {}
        }
    }
    fs.fsync(root, false).unwrap();
    for (name, old) in unlinked {
        expect.insert(name, (old, None, rec.flush_count()));
    }
    let g = fs.create(root, b"new", 0o644, 0, 0).unwrap().ino;
    fs.write_file(g, 0, &content(7, 3)).unwrap();
    fs.fsync(g, false).unwrap();
    expect.insert("new".into(), (None, Some(content(7, 3)), rec.flush_count()));
    source_and_snapshot_are(&fs, &at_snapshot, &expect, usize::MAX, "before the cut");
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::budgeted(300, 0x83)) {
        crash_mount(&rec, &point, |fs| {
            let when = format!("{point:?}");
            source_and_snapshot_are(fs, &at_snapshot, &expect, point.flushes_completed, &when)
        });
    }
}

/// A file's content before a change, after it, and the flush count from
/// which the change is durable.
type FileChange = (Option<Vec<u8>>, Option<Vec<u8>>, usize);

/// `snap` has the shape `at_snapshot`; each of tree 5's files in `expect`
/// holds its old or new content, the new one once `flushes` reached the
/// fsync that made it durable.
fn source_and_snapshot_are<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    at_snapshot: &Shape,
    expect: &BTreeMap<String, FileChange>,
    flushes: usize,
    when: &str,
) {
    let root = fs.root_ino();
    let snap = lookup(fs, root, "snap").expect("snap");
    assert!(shape(fs, snap) == *at_snapshot, "{when}: snap changed");
    for (name, (old, new, durable_at)) in expect {
        let found = lookup(fs, root, name).map(|f| fs.read_file(f, 0, 1 << 20).unwrap());
        let ok = found == *new || (flushes < *durable_at && found == *old);
        let len = |d: &Option<Vec<u8>>| d.as_ref().map(Vec::len);
        assert!(
            ok,
            "{when}: {name}: found {:?} bytes, old {:?}, new {:?} (durable from flush {durable_at})",
            len(&found),
            len(old),
            len(new)
        );
    }
}

/// Crash case: `snapshot sv sv/snaps/s1; <cut anywhere in its commit>` →
/// `sv/snaps/s1` exists or not; when it does, `sv/snaps/s1/snaps` is
/// empty (the link went in after the copy) and `s1` is `sv` without it.
#[test]
fn snapshot_inside_its_source() {
    let rec = recorder(32 << 20, 0x84);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let sv_id = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = lookup(&fs, root, "sv").unwrap();
    let snaps = fs.mkdir(sv, b"snaps", 0o755, 0, 0).unwrap().ino;
    for i in 0..10 {
        fs.mkdir(sv, format!("d{i}").as_bytes(), 0o700, 0, 0)
            .unwrap();
    }
    fs.sync().unwrap();
    let before = shape(&fs, sv);
    let synced = rec.flush_count();
    fs.create_snapshot(sv_id, snaps, b"s1", false).unwrap();
    drop(fs);
    let mut saw = [false; 2];
    for point in crash_points(&rec, synced, &Enumeration::thorough(0x84)) {
        let has = crash_mount(&rec, &point, |fs| {
            let sv = ino(fs, "sv");
            let snaps = ino(fs, "sv/snaps");
            let Some(s1) = lookup(fs, snaps, "s1") else {
                assert_eq!(shape(fs, sv), before, "{point:?}");
                return false;
            };
            let copy = shape(fs, s1);
            assert!(
                fs.readdir(ino(fs, "sv/snaps/s1/snaps"), 0, 10)
                    .unwrap()
                    .is_empty(),
                "{point:?}: the snapshot contains itself: {copy:?}"
            );
            // The source gained the link (and its directory's size and
            // times changed); everything else is as copied.
            assert_eq!(without(copy, "snaps"), without(before.clone(), "snaps"));
            true
        });
        saw[has as usize] = true;
    }
    assert_eq!(saw, [true, true]);
}

/// `snapshot -r 5 ro`: every namespace change inside `ro` is EROFS, also
/// after a remount; a read-write snapshot of it is writable.
#[test]
fn readonly_snapshot_refuses_changes() {
    let dev = memory_fs(32 << 20, 0x85);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    fs.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    let ro_id = fs.create_snapshot(tree_id::FS, root, b"ro", true).unwrap();
    let refuses = |fs: &Filesystem<Arc<MemoryDevice>>| {
        let ro = ino(fs, "ro");
        let d = ino(fs, "ro/d");
        let erofs = |r: Result<(), Error>, what: &str| {
            assert!(matches!(r, Err(Error::ReadOnly)), "{what}: {r:?}")
        };
        erofs(fs.create(ro, b"f", 0o644, 0, 0).map(|_| ()), "create");
        erofs(fs.mkdir(d, b"e", 0o755, 0, 0).map(|_| ()), "mkdir");
        erofs(
            fs.create_subvolume(ro, b"sv", 0, 0).map(|_| ()),
            "subvolume",
        );
        erofs(
            fs.create_snapshot(tree_id::FS, d, b"s", false).map(|_| ()),
            "snapshot into it",
        );
    };
    refuses(&fs);
    let rw_id = fs.create_snapshot(ro_id, root, b"rw", false).unwrap();
    fs.mkdir(ino(&fs, "rw/d"), b"e", 0o755, 0, 0).unwrap();
    drop(fs);
    assert_clean(dev.as_ref(), "after the snapshots");
    let fs = mount(dev.clone());
    refuses(&fs);
    let listed: Vec<(u64, bool)> = fs
        .list_subvolumes()
        .unwrap()
        .iter()
        .map(|i| (i.id, i.readonly))
        .collect();
    assert_eq!(
        listed,
        vec![(tree_id::FS, false), (ro_id, true), (rw_id, false)]
    );
    assert!(lookup(&fs, ino(&fs, "rw/d"), "e").is_some());
    assert!(lookup(&fs, ino(&fs, "ro/d"), "e").is_none());
}

/// `snapshot -r 5 ro`: writing, truncating or unlinking a file in `ro`
/// is EROFS. Passes once data calls are routed into subvolumes.
#[test]
fn readonly_snapshot_refuses_data_changes() {
    let dev = memory_fs(32 << 20, 0x86);
    let fs = mount(dev);
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, b"kept").unwrap();
    fs.create_snapshot(tree_id::FS, root, b"ro", true).unwrap();
    let ro = ino(&fs, "ro");
    let ro_f = ino(&fs, "ro/f");
    assert!(matches!(fs.write_file(ro_f, 0, b"x"), Err(Error::ReadOnly)));
    assert!(matches!(fs.truncate(ro_f, 0), Err(Error::ReadOnly)));
    assert!(matches!(fs.unlink(ro, b"f"), Err(Error::ReadOnly)));
    assert_eq!(fs.read_file(ro_f, 0, 100).unwrap(), b"kept");
}

/// Crash case: `snapshot 5 s; write s/f X; fsync s/f; <cut>` → `s/f` = X,
/// `f` unchanged. The fsync logs into the snapshot's own log.
#[test]
fn fsync_inside_snapshot_survives() {
    let rec = recorder(32 << 20, 0x87);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &content(3, 1)).unwrap();
    fs.create_snapshot(tree_id::FS, root, b"s", false).unwrap();
    let s_f = ino(&fs, "s/f");
    fs.write_file(s_f, 0, &content(5, 9)).unwrap();
    fs.fsync(s_f, false).unwrap();
    let synced = rec.flush_count();
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::thorough(0x87)) {
        crash_mount(&rec, &point, |fs| {
            let f = ino(fs, "f");
            assert_eq!(
                fs.read_file(f, 0, 1 << 20).unwrap(),
                content(3, 1),
                "{point:?}"
            );
            let s_f = ino(fs, "s/f");
            assert_eq!(
                fs.read_file(s_f, 0, 1 << 20).unwrap(),
                content(5, 9),
                "{point:?}"
            );
        });
    }
}

/// Crash case: `snapshot 5 s; mkdir s/d; fsync s/d; <cut>` → `s/d`: a
/// change made inside a snapshot is durable after its fsync (logged into
/// the snapshot's own log), and the source does not see it.
#[test]
fn fsync_of_new_directory_inside_snapshot_survives() {
    let rec = recorder(32 << 20, 0x88);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    fs.mkdir(root, b"a", 0o755, 0, 0).unwrap();
    fs.create_snapshot(tree_id::FS, root, b"s", false).unwrap();
    let s_a = ino(&fs, "s/a");
    let d = fs.mkdir(s_a, b"d", 0o755, 0, 0).unwrap().ino;
    let before = fs.log_stats();
    fs.fsync(d, false).unwrap();
    let after = fs.log_stats();
    assert_eq!(after.fallback_subvolume, before.fallback_subvolume);
    assert_eq!(after.logged_fsyncs, before.logged_fsyncs + 1);
    let synced = rec.flush_count();
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::thorough(0x88)) {
        crash_mount(&rec, &point, |fs| {
            assert!(lookup(fs, ino(fs, "s/a"), "d").is_some(), "{point:?}");
            assert!(lookup(fs, ino(fs, "a"), "d").is_none(), "{point:?}");
        });
    }
}

/// Crash case (seed 000's `btrfs_record_snapshot_destroy`): `snapshot sv
/// sv/d/s; sync; touch sv/d/x; fsync sv/d; delete sv/d/s; fsync sv/d;
/// <cut>` → the second fsync committed (`fallback_subvolume` counted),
/// since a log never copies a link: `s` is gone, `x` present, and
/// `birch check` clean. Variant without the first fsync: the same.
#[test]
fn fsync_of_dir_whose_snapshot_was_deleted_commits() {
    for (seed, first_fsync) in [(0x8a_u8, true), (0x8b, false)] {
        let rec = recorder(32 << 20, seed);
        let fs = mount(rec.clone());
        let root = fs.root_ino();
        let sv_id = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
        let sv = lookup(&fs, root, "sv").unwrap();
        let d = fs.mkdir(sv, b"d", 0o755, 0, 0).unwrap().ino;
        fs.create_snapshot(sv_id, d, b"s", false).unwrap();
        fs.sync().unwrap();
        fs.create(d, b"x", 0o644, 0, 0).unwrap();
        if first_fsync {
            fs.fsync(d, false).unwrap();
        }
        fs.delete_subvolume(d, b"s").unwrap();
        let before = fs.log_stats();
        fs.fsync(d, false).unwrap();
        let after = fs.log_stats();
        assert_eq!(
            after.fallback_subvolume,
            before.fallback_subvolume + 1,
            "first fsync {first_fsync}: the fsync after the delete commits"
        );
        let synced = rec.flush_count();
        drop(fs);
        for point in crash_points(&rec, synced, &Enumeration::thorough(seed.into())) {
            crash_mount(&rec, &point, |fs| {
                let d = ino(fs, "sv/d");
                assert!(lookup(fs, d, "x").is_some(), "{point:?}: x");
                assert!(lookup(fs, d, "s").is_none(), "{point:?}: s");
            });
        }
    }
}

/// A snapshot of a subvolume holding another subvolume's link does not
/// hold that link (it would have no ROOT_REF pair); the source keeps it.
/// Snapshots of snapshots keep their parent uuid chain clean.
#[test]
fn snapshot_leaves_out_nested_subvolumes() {
    let dev = memory_fs(32 << 20, 0x89);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    fs.create_subvolume(d, b"inner", 0, 0).unwrap();
    fs.mkdir(d, b"plain", 0o755, 0, 0).unwrap();
    let s1 = fs.create_snapshot(tree_id::FS, root, b"s1", false).unwrap();
    let s2 = fs.create_snapshot(s1, root, b"s2", true).unwrap();
    for snap in ["s1", "s2"] {
        let sd = ino(&fs, &format!("{snap}/d"));
        let names: Vec<Vec<u8>> = fs
            .readdir(sd, 0, 100)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec![b"plain".to_vec()], "{snap}");
        let a = fs.getattr(sd).unwrap();
        assert_eq!((a.nlink, a.size), (3, 5), "{snap}/d counts only plain");
    }
    assert!(lookup(&fs, d, "inner").is_some());
    assert_eq!(s2, s1 + 1);
    drop(fs);
    assert_clean(
        dev.as_ref(),
        "after snapshots of a tree with a nested subvolume",
    );
}

/// What a snapshot request is refused for, before anything changes.
#[test]
fn snapshot_arguments_are_checked() {
    let dev = memory_fs(32 << 20, 0x8a);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    let errno = |r: Result<u64, Error>| r.unwrap_err().errno();
    assert_eq!(
        errno(fs.create_snapshot(tree_id::FS, root, b"f", false)),
        libc::EEXIST
    );
    assert_eq!(
        errno(fs.create_snapshot(tree_id::FS, root, b"..", false)),
        libc::EEXIST
    );
    assert_eq!(
        errno(fs.create_snapshot(tree_id::FS, f, b"s", false)),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(fs.create_snapshot(999, root, b"s", false)),
        libc::ENOENT
    );
    assert_eq!(
        errno(fs.create_snapshot(tree_id::EXTENT, root, b"s", false)),
        libc::ENOENT
    );
    assert_eq!(
        errno(fs.create_snapshot(tree_id::FS, 1 << 40 | 256, b"s", false)),
        libc::ENOENT
    );
    assert_eq!(fs.list_subvolumes().unwrap().len(), 1);
    drop(fs);
    assert_clean(dev.as_ref(), "after refused snapshots");
}

/// `write 60 files; snapshot 5 snap` with no commit between: the seal
/// writes the pages back, so the data extents and the leaves naming them
/// are created in the transaction that shares them (their counts start
/// above 1). Every state of the commit is check-clean, and so is the image
/// after the source rewrote every file.
#[test]
fn snapshot_shares_data_written_in_its_own_transaction() {
    let rec = recorder(32 << 20, 0x8b);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    fs.sync().unwrap();
    let files: Vec<u64> = (0..60)
        .map(|i| {
            let f = fs
                .create(root, format!("f{i:02}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino;
            fs.write_file(f, 0, &content(i, 1)).unwrap();
            f
        })
        .collect();
    let synced = rec.flush_count();
    fs.create_snapshot(tree_id::FS, root, b"snap", false)
        .unwrap();
    let at_snapshot = without(shape(&fs, root), "snap");
    assert_eq!(shape(&fs, ino(&fs, "snap")), at_snapshot);
    for (i, &f) in files.iter().enumerate() {
        fs.write_file(f, 0, &content(i, 2)).unwrap();
    }
    fs.sync().unwrap();
    for (i, &f) in files.iter().enumerate() {
        assert_eq!(fs.read_file(f, 0, 1 << 20).unwrap(), content(i, 2));
    }
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::budgeted(200, 0x8b)) {
        crash_mount(&rec, &point, |fs| {
            if let Some(snap) = lookup(fs, fs.root_ino(), "snap") {
                assert!(shape(fs, snap) == at_snapshot, "{point:?}: snap");
            }
        });
    }
}

/// Crash case: one thread `write f; fsync f` in a loop (each iteration
/// its own content, each longer than the last), another `snapshot 5 snap`
/// meanwhile; `<cut at every flush point>` → every fsync that returned is
/// in `f`; `snap/f` holds one of the contents written around the snapshot
/// (told apart by size until data reads are routed into subvolumes).
#[test]
fn snapshot_during_fsynced_writes() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    const ROUNDS: usize = 40;
    let rec = recorder(32 << 20, 0x8c);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &content(0, 5)).unwrap();
    fs.sync().unwrap();
    let synced = rec.flush_count();
    let started = AtomicUsize::new(0);
    let written = AtomicUsize::new(0);
    // (round, flush count once its fsync returned)
    let durable = Mutex::new(vec![(0, synced)]);
    let (lo, hi, snap_durable) = std::thread::scope(|s| {
        s.spawn(|| {
            for i in 1..ROUNDS {
                started.store(i, Ordering::SeqCst);
                fs.write_file(f, 0, &content(i, 5)).unwrap();
                written.store(i, Ordering::SeqCst);
                fs.fsync(f, false).unwrap();
                durable.lock().unwrap().push((i, rec.flush_count()));
            }
        });
        while written.load(Ordering::SeqCst) < 5 {
            std::thread::yield_now();
        }
        let lo = written.load(Ordering::SeqCst);
        fs.create_snapshot(tree_id::FS, root, b"snap", false)
            .unwrap();
        (lo, started.load(Ordering::SeqCst), rec.flush_count())
    });
    let durable = durable.into_inner().unwrap();
    let size_of = |i: usize| content(i, 5).len() as u64;
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::budgeted(300, 0x8c)) {
        crash_mount(&rec, &point, |fs| {
            let at_least = durable
                .iter()
                .filter(|&&(_, at)| at <= point.flushes_completed)
                .map(|&(i, _)| i)
                .max()
                .unwrap_or(0);
            let data = fs.read_file(ino(fs, "f"), 0, 1 << 20).unwrap();
            let round = (0..ROUNDS).find(|&i| data == content(i, 5));
            assert!(
                round.is_some_and(|r| r >= at_least),
                "{point:?}: f is round {round:?} ({} bytes), fsynced round {at_least} was durable",
                data.len()
            );
            let snap = lookup(fs, fs.root_ino(), "snap");
            assert!(
                snap.is_some() || point.flushes_completed < snap_durable,
                "{point:?}: the snapshot returned but is gone"
            );
            if let Some(snap) = snap {
                let size = fs.getattr(lookup(fs, snap, "f").unwrap()).unwrap().size;
                assert!(
                    (lo..=hi).any(|i| size_of(i) == size),
                    "{point:?}: snap/f has {size} bytes, not one of rounds {lo}..={hi}"
                );
            }
        });
    }
}

/// Random changes in tree 5 (files written, rewritten, truncated, removed,
/// renamed; directories made) and in read-write snapshots (entries made),
/// with snapshots of 5 and of snapshots, read-only or not, taken between
/// them: after every step each snapshot keeps the shape it had when its
/// last own change was made, and at the end the image is check-clean and
/// shows the same after a remount. `BIRCH_SEED=N` replays a seed; every
/// failure names it.
#[test]
fn random_changes_never_reach_another_tree() {
    use rand::{Rng, SeedableRng};
    let seed = std::env::var("BIRCH_SEED")
        .map(|s| s.trim().parse::<u64>().expect("BIRCH_SEED is a u64"))
        .unwrap_or(0x5eed_0008);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let dev = memory_fs(64 << 20, 0x8d);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    // Snapshot name -> (id, read-only, expected shape).
    let mut snaps: BTreeMap<String, (u64, bool, Shape)> = BTreeMap::new();
    let top_shape = |fs: &Filesystem<Arc<MemoryDevice>>, snaps: &BTreeMap<String, _>| {
        let mut s = shape(fs, fs.root_ino());
        for name in snaps.keys() {
            s = without(s, name);
        }
        s
    };
    let mut files: Vec<String> = Vec::new();
    for step in 0..160 {
        let when = format!("BIRCH_SEED={seed} step {step}");
        match rng.gen_range(0..10) {
            0..=2 => {
                let name = format!("f{step}");
                let f = fs.create(root, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
                fs.write_file(f, 0, &content(rng.gen_range(0..60), step as u8))
                    .unwrap();
                files.push(name);
            }
            3 if !files.is_empty() => {
                let name = &files[rng.gen_range(0..files.len())];
                let f = ino(&fs, name);
                let off = rng.gen_range(0..4000);
                fs.write_file(f, off, &content(rng.gen_range(0..60), step as u8))
                    .unwrap();
            }
            4 if !files.is_empty() => {
                let name = &files[rng.gen_range(0..files.len())];
                fs.truncate(ino(&fs, name), rng.gen_range(0..5000)).unwrap();
            }
            5 if !files.is_empty() => {
                let name = files.swap_remove(rng.gen_range(0..files.len()));
                if rng.gen_bool(0.5) {
                    fs.unlink(root, name.as_bytes()).unwrap();
                } else {
                    let new = format!("r{step}");
                    let d = fs
                        .mkdir(root, format!("d{step}").as_bytes(), 0o755, 0, 0)
                        .unwrap()
                        .ino;
                    fs.rename(root, name.as_bytes(), d, new.as_bytes(), Default::default())
                        .unwrap();
                }
            }
            6 | 7 => {
                let sources: Vec<(u64, Option<String>)> = std::iter::once((tree_id::FS, None))
                    .chain(snaps.iter().map(|(n, &(id, _, _))| (id, Some(n.clone()))))
                    .collect();
                let (source, source_name) = sources[rng.gen_range(0..sources.len())].clone();
                let readonly = rng.gen_bool(0.4);
                let name = format!("snap{step}");
                let expected = match &source_name {
                    None => top_shape(&fs, &snaps),
                    Some(n) => snaps[n].2.clone(),
                };
                let id = fs
                    .create_snapshot(source, root, name.as_bytes(), readonly)
                    .unwrap();
                snaps.insert(name, (id, readonly, expected));
            }
            _ => {
                let rw: Vec<String> = snaps
                    .iter()
                    .filter(|(_, s)| !s.1)
                    .map(|(n, _)| n.clone())
                    .collect();
                if let Some(name) = rw.get(rng.gen_range(0..rw.len().max(1))) {
                    let dir = ino(&fs, name);
                    fs.mkdir(dir, format!("m{step}").as_bytes(), 0o700, 0, 0)
                        .unwrap();
                    fs.create(dir, format!("c{step}").as_bytes(), 0o600, 0, 0)
                        .unwrap();
                    let s = shape(&fs, dir);
                    snaps.get_mut(name).unwrap().2 = s;
                }
            }
        }
        for (name, (_, _, expected)) in &snaps {
            assert!(
                shape(&fs, ino(&fs, name)) == *expected,
                "{when}: {name} changed"
            );
        }
        if rng.gen_range(0..20) == 0 {
            fs.sync().unwrap();
        }
    }
    let top = top_shape(&fs, &snaps);
    drop(fs);
    assert_clean(
        dev.as_ref(),
        &format!("BIRCH_SEED={seed}: after the changes"),
    );
    let fs = mount(dev);
    assert!(
        top_shape(&fs, &snaps) == top,
        "BIRCH_SEED={seed}: tree 5 after a remount"
    );
    for (name, (id, readonly, expected)) in &snaps {
        let dir = ino(&fs, name);
        assert_eq!(InoSpace::split(dir).0, *id);
        assert!(
            shape(&fs, dir) == *expected,
            "BIRCH_SEED={seed}: {name} after a remount"
        );
        let made = fs.mkdir(dir, b"after", 0o755, 0, 0);
        assert_eq!(
            made.is_err(),
            *readonly,
            "BIRCH_SEED={seed}: {name}: {made:?}"
        );
    }
}

/// A snapshot of a subvolume whose tree has several levels: its root node
/// is a copy, every leaf is shared with the source. `birch check` reads
/// each subvolume's namespace through the shared leaves (S7) and counts
/// each shared leaf's data references once (S2): clean after the
/// snapshot, and after the source has copied some leaves on write.
#[test]
fn snapshot_of_a_multi_level_tree_checks_clean() {
    let dev = memory_fs(64 << 20, 0x8a);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let id = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    for i in 0..150 {
        let f = fs
            .create(sv, format!("file-{i:03}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        fs.write_file(f, 0, &content(i, b'S')).unwrap();
    }
    fs.sync().unwrap();
    fs.create_snapshot(id, root, b"snap", false).unwrap();
    assert_clean(dev.as_ref(), "right after the snapshot");
    for i in (0..150).step_by(7) {
        let f = lookup(&fs, sv, &format!("file-{i:03}")).unwrap();
        fs.write_file(f, 0, &content(i, b'T')).unwrap();
    }
    fs.unlink(sv, b"file-001").unwrap();
    fs.sync().unwrap();
    assert_clean(dev.as_ref(), "after the source changed");
    let snap = fs.lookup(root, b"snap").unwrap().ino;
    let f = lookup(&fs, snap, "file-001").unwrap();
    assert_eq!(fs.read_file(f, 0, 1 << 20).unwrap(), content(1, b'S'));
}
