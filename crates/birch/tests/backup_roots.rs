//! Backup roots (docs/BACKUP-ROOTS.md): the superblock keeps the roots of
//! the last commits, the commit before the newest is never overwritten
//! while the newest is current, and `Rescue::UseBackupRoot` mounts the
//! newest older commit that loads when the newest one's roots are
//! unreadable. Each crash case of the design doc is a test of the same
//! name here.

mod common;

use birch::check::fixture::corrupt_node;
use birch::check::{check_device, tree_nodes, FaultId, TreeRootRef};
use birch::device::{BlockDevice, DeviceEvent, MemoryDevice, RecordingDevice};
use birch::error::Error;
use birch::format::{
    item_type, tree_id, BackupRoot, NodeBody, Superblock, BACKUP_ROOT_COUNT, NODE_SIZE,
    SUPERBLOCK_OFFSETS, SUPERBLOCK_SIZE,
};
use birch::fs::{read_superblock, AtimeUpdates, BackupRootUsed, Filesystem, MountOptions, Rescue};
use common::{assert_clean, crash_points, memory_fs, view, Enumeration, View};
use std::sync::Arc;

const DEVICE_BYTES: u64 = 64 << 20;

/// Which tree's root node of the newest commit to damage.
#[derive(Debug, Clone, Copy)]
enum DamagedRoot {
    Root,
    Extent,
    Fs,
}

/// The block of `which` root node of the commit in backup slot `slot`.
fn root_block(backup: &BackupRoot, which: DamagedRoot) -> u64 {
    match which {
        DamagedRoot::Root => backup.root_tree_bytenr,
        DamagedRoot::Extent => backup.extent_root.bytenr,
        DamagedRoot::Fs => backup.fs_root.bytenr,
    }
}

/// Damages `which` root node of the newest commit on `dev`.
fn corrupt_newest_root(dev: &dyn BlockDevice, which: DamagedRoot) -> u64 {
    let sb = read_superblock(dev).unwrap();
    let newest = sb.backup_roots[0];
    assert_eq!(
        newest.generation, sb.generation,
        "slot 0 is the newest commit"
    );
    let block = root_block(&newest, which);
    corrupt_node(dev, block);
    block
}

/// No background threads, and no atime updates: reading a view must not
/// dirty inodes, so that each commit of a test is one it asked for.
fn deterministic() -> MountOptions {
    MountOptions {
        atime: AtimeUpdates::Never,
        ..MountOptions::deterministic()
    }
}

fn rescue(writable: bool) -> MountOptions {
    MountOptions {
        rescue: Rescue::UseBackupRoot { writable },
        ..deterministic()
    }
}

/// Compares two views, naming the paths that differ (not their bytes).
#[track_caller]
fn assert_same(found: &View, expected: &View, when: &str) {
    let differing: Vec<&String> = found
        .keys()
        .chain(expected.keys())
        .filter(|p| found.get(*p) != expected.get(*p))
        .collect();
    assert!(
        differing.is_empty(),
        "{when}: these paths differ: {differing:?}"
    );
}

fn open(
    dev: &Arc<MemoryDevice>,
    options: MountOptions,
) -> Result<Filesystem<Arc<MemoryDevice>>, Error> {
    Filesystem::open(dev.clone(), options)
}

fn write_file<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    dir: u64,
    name: &str,
    data: &[u8],
) -> u64 {
    let ino = match fs.lookup(dir, name.as_bytes()) {
        Ok(attr) => attr.ino,
        Err(_) => fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap().ino,
    };
    fs.truncate(ino, 0).unwrap();
    assert_eq!(fs.write_file(ino, 0, data).unwrap(), data.len());
    ino
}

/// Content that differs by file and by commit, so that a block of one
/// commit read in place of another's shows.
fn content(tag: &str, i: usize, len: usize) -> Vec<u8> {
    let seed = format!("{tag}:{i}:");
    seed.bytes().cycle().take(len).collect()
}

/// Commit "A": a directory tree with inline, small and multi-extent files.
fn commit_a<D: BlockDevice + 'static>(fs: &Filesystem<D>) -> View {
    let root = fs.root_ino();
    let dir = fs.mkdir(root, b"dir", 0o755, 0, 0).unwrap().ino;
    for i in 0..40 {
        let len = [100, 5000, 70_000, 300_000][i % 4];
        write_file(
            fs,
            if i % 2 == 0 { root } else { dir },
            &format!("a{i}"),
            &content("A", i, len),
        );
    }
    fs.symlink(dir, b"link", b"../a0", 0, 0).unwrap();
    fs.sync().unwrap();
    view(fs)
}

/// Commit "B": rewrites every file of A, removes some, adds others, so
/// that most of A's blocks are freed by B.
fn commit_b<D: BlockDevice + 'static>(fs: &Filesystem<D>) -> View {
    let root = fs.root_ino();
    let dir = fs.lookup(root, b"dir").unwrap().ino;
    for i in 0..40 {
        let parent = if i % 2 == 0 { root } else { dir };
        if i % 5 == 0 {
            fs.unlink(parent, format!("a{i}").as_bytes()).unwrap();
        } else {
            write_file(
                fs,
                parent,
                &format!("a{i}"),
                &content("B", i, 20_000 + i * 1000),
            );
        }
    }
    for i in 0..20 {
        write_file(fs, dir, &format!("b{i}"), &content("B-new", i, 50_000));
    }
    fs.sync().unwrap();
    view(fs)
}

/// A fresh filesystem with commits A and B; returns it with A's view.
fn two_commits() -> (Arc<MemoryDevice>, View, u64, u64) {
    let dev = memory_fs(DEVICE_BYTES, 0xB7);
    let fs = open(&dev, deterministic()).unwrap();
    let view_a = commit_a(&fs);
    let gen_a = fs.generation();
    commit_b(&fs);
    let gen_b = fs.generation();
    fs.close().unwrap();
    (dev, view_a, gen_a, gen_b)
}

/// The extents (data and nodes) the commit of `backup` uses, from its
/// extent tree on `image`.
fn extents_of(image: Vec<u8>, backup: &BackupRoot, fsid: [u8; 16]) -> Vec<(u64, u64)> {
    extents_on(Arc::new(MemoryDevice::from_bytes(image)), backup, fsid)
}

/// [`extents_of`] on a device.
fn extents_on(dev: Arc<MemoryDevice>, backup: &BackupRoot, fsid: [u8; 16]) -> Vec<(u64, u64)> {
    let profile = read_superblock(dev.as_ref()).unwrap().metadata_profile;
    let extent_root = TreeRootRef {
        tree: tree_id::EXTENT,
        subvolume: None,
        bytenr: backup.extent_root.bytenr,
        level: backup.extent_root.level,
        generation: Some(backup.extent_root.generation),
    };
    let (nodes, problems) = tree_nodes(dev.as_ref(), &fsid, extent_root);
    assert!(problems.is_empty(), "{problems:?}");
    let mut extents = Vec::new();
    for (_, node) in nodes {
        let NodeBody::Leaf(items) = node.body else {
            continue;
        };
        for k in items.iter().map(|i| i.key) {
            let len = match k.item_type {
                item_type::METADATA_ITEM => NODE_SIZE as u64,
                _ => k.offset,
            };
            extents.push((k.objectid, len));
            // A node's DUP mirror belongs to the commit as much as the node.
            if let Some(mirror) = profile
                .mirror_of(k.objectid)
                .filter(|_| k.item_type == item_type::METADATA_ITEM)
            {
                extents.push((mirror, len));
            }
        }
    }
    extents
}

/// Fails if any write `rec` recorded from event `from` on overlaps one of
/// `extents`.
fn assert_no_write_touches(rec: &RecordingDevice, from: usize, extents: &[(u64, u64)]) {
    let mut writes = 0;
    for event in &rec.events()[from..] {
        let DeviceEvent::Write { offset, bytes } = event else {
            continue;
        };
        writes += 1;
        let end = offset + bytes.len() as u64;
        if let Some(hit) = extents.iter().find(|&&(s, l)| *offset < s + l && s < end) {
            panic!("a write to [{offset}, {end}) overwrote the previous commit's extent {hit:?}");
        }
    }
    assert!(writes > 0, "the workload wrote nothing");
}

/// What every rescue test checks once `which` root of commit B is
/// damaged: a plain mount fails naming the block and suggesting the
/// rescue; a read-only rescue shows A exactly and changes nothing; a
/// writable rescue commits A as the newest, which checks clean and mounts
/// plainly.
fn rescue_after_damage(which: DamagedRoot) {
    let (dev, view_a, gen_a, gen_b) = two_commits();
    let block = corrupt_newest_root(dev.as_ref(), which);

    let err = open(&dev, deterministic())
        .err()
        .expect("the damaged commit must not mount");
    let text = err.to_string();
    assert!(matches!(err, Error::Corrupt(_)), "{text}");
    assert!(text.contains(&format!("block={block}")), "{text}");
    assert!(text.contains("-o rescue=usebackuproot"), "{text}");

    let before = dev.snapshot();
    let fs = open(&dev, rescue(false)).unwrap();
    assert!(
        fs.is_read_only(),
        "a rollback is read-only unless asked otherwise"
    );
    assert_eq!(fs.generation(), gen_a);
    let used = fs.backup_root_used().expect("the mount fell back");
    assert_eq!(
        (
            used.mounted_generation,
            used.newest_generation,
            used.commits_rolled_back
        ),
        (gen_a, gen_b, 1)
    );
    assert_eq!(used.rejected.len(), 1);
    assert!(
        used.rejected[0].1.contains(&format!("block={block}")),
        "{used}"
    );
    assert!(used.to_string().contains("1 commit rolled back"), "{used}");
    assert_same(&view(&fs), &view_a, "mounted");
    assert!(matches!(
        fs.create(fs.root_ino(), b"new", 0o644, 0, 0),
        Err(Error::ReadOnly)
    ));
    fs.close().unwrap();
    assert!(
        dev.snapshot() == before,
        "a read-only rescue wrote to the device"
    );

    let fs = open(&dev, rescue(true)).unwrap();
    assert!(!fs.is_read_only());
    assert_same(&view(&fs), &view_a, "mounted");
    let rolled_back = fs.generation();
    assert!(
        rolled_back > gen_b,
        "the rollback commit continues after the abandoned generations"
    );
    write_file(&fs, fs.root_ino(), "after", b"written after the rollback");
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after a writable rescue");

    let fs = open(&dev, deterministic()).unwrap();
    assert!(fs.backup_root_used().is_none());
    let mut expected = view_a;
    expected.insert("/after".into(), b"written after the rollback".to_vec());
    assert_same(&view(&fs), &expected, "mounted");
    fs.close().unwrap();
}

#[test]
fn unreadable_root_tree_root_mounts_previous_commit() {
    rescue_after_damage(DamagedRoot::Root);
}

#[test]
fn unreadable_extent_tree_root_mounts_previous_commit() {
    rescue_after_damage(DamagedRoot::Extent);
}

#[test]
fn unreadable_fs_tree_root_mounts_previous_commit() {
    rescue_after_damage(DamagedRoot::Fs);
}

#[test]
fn commits_fill_the_backup_slots_newest_first() {
    let dev = memory_fs(DEVICE_BYTES, 0xB1);
    let fs = open(&dev, deterministic()).unwrap();
    let mut generations = vec![fs.generation()];
    for i in 0..5 {
        write_file(&fs, fs.root_ino(), "f", &content("slots", i, 1000));
        fs.sync().unwrap();
        generations.push(fs.generation());
    }
    fs.close().unwrap();
    let sb = read_superblock(dev.as_ref()).unwrap();
    let slots: Vec<u64> = sb.backup_roots.iter().map(|b| b.generation).collect();
    let newest: Vec<u64> = generations
        .iter()
        .rev()
        .take(BACKUP_ROOT_COUNT)
        .copied()
        .collect();
    assert_eq!(slots, newest);
    assert_eq!(sb.backup_roots[0].root_tree_bytenr, sb.root_tree_bytenr);
    assert_eq!(sb.backup_roots[0].bytes_used, sb.bytes_used);
}

#[test]
fn previous_commit_is_not_overwritten_by_the_next_transaction() {
    let dev = memory_fs(DEVICE_BYTES, 0xB2);
    let rec = Arc::new(RecordingDevice::new(dev.snapshot()));
    let fs = Filesystem::open(rec.clone(), deterministic()).unwrap();
    commit_a(&fs);
    let after_a = rec.snapshot();
    let sb_a = read_superblock(rec.as_ref()).unwrap();
    commit_b(&fs);
    let b_durable = rec.events().len();
    // Transaction C: rewrites, deletes, writeback and log syncs, no commit.
    let root = fs.root_ino();
    let dir = fs.lookup(root, b"dir").unwrap().ino;
    for i in 0..20 {
        let ino = write_file(&fs, dir, &format!("b{i}"), &content("C", i, 80_000));
        fs.fsync(ino, false).unwrap();
    }
    for i in 0..10 {
        let ino = write_file(&fs, root, &format!("c{i}"), &content("C-new", i, 200_000));
        fs.flush_range(ino, 0, u64::MAX).unwrap();
    }
    assert_eq!(fs.generation(), sb_a.generation + 1, "C must not commit");
    let extents_a = extents_of(after_a, &sb_a.backup_roots[0], sb_a.fsid);
    assert_no_write_touches(&rec, b_durable, &extents_a);
    fs.shut_down();
    drop(fs);
}

#[test]
fn previous_commit_survives_remount_and_new_writes() {
    let (dev, view_a, gen_a, _) = two_commits();
    let sb = read_superblock(dev.as_ref()).unwrap();
    // A's extents, from its extent tree, while they are still intact.
    let extents_a = extents_of(dev.snapshot(), &sb.backup_roots[1], sb.fsid);
    assert_eq!(sb.backup_roots[1].generation, gen_a);
    // A fresh mount knows nothing of what commit B freed: it must find it.
    let rec = Arc::new(RecordingDevice::new(dev.snapshot()));
    let fs = Filesystem::open(rec.clone(), deterministic()).unwrap();
    let root = fs.root_ino();
    for i in 0..10 {
        let ino = write_file(&fs, root, &format!("c{i}"), &content("C", i, 200_000));
        fs.fsync(ino, false).unwrap();
    }
    assert_no_write_touches(&rec, 0, &extents_a);
    fs.shut_down();
    drop(fs);

    // The power cut left B (and a log): with B's root gone, A is whole.
    let dev = Arc::new(MemoryDevice::from_bytes(rec.snapshot()));
    corrupt_newest_root(dev.as_ref(), DamagedRoot::Fs);
    let fs = open(&dev, rescue(false)).unwrap();
    assert_eq!(fs.generation(), gen_a);
    assert_same(&view(&fs), &view_a, "mounted");
    assert!(
        fs.replay_outcome().is_none(),
        "B's log must not be replayed onto A"
    );
    fs.close().unwrap();
}

#[test]
fn abandoned_log_is_not_replayed_onto_a_backup_root() {
    let (dev, view_a, gen_a, _) = two_commits();
    let fs = open(&dev, deterministic()).unwrap();
    let ino = write_file(&fs, fs.root_ino(), "logged", b"fsynced after B");
    fs.fsync(ino, false).unwrap();
    fs.shut_down();
    drop(fs);
    assert_ne!(read_superblock(dev.as_ref()).unwrap().log_root_bytenr, 0);
    corrupt_newest_root(dev.as_ref(), DamagedRoot::Root);
    let fs = open(&dev, rescue(true)).unwrap();
    assert!(fs.replay_outcome().is_none());
    assert_same(&view(&fs), &view_a, "mounted");
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after rolling back past a log");
    let sb = read_superblock(dev.as_ref()).unwrap();
    assert_eq!(sb.log_root_bytenr, 0);
    assert_eq!(sb.backup_roots[1].generation, gen_a);
}

#[test]
fn older_backup_root_is_used_when_the_previous_one_is_damaged_too() {
    let dev = memory_fs(DEVICE_BYTES, 0xB3);
    let fs = open(&dev, deterministic()).unwrap();
    let view_a = commit_a(&fs);
    let gen_a = fs.generation();
    commit_b(&fs);
    write_file(&fs, fs.root_ino(), "c", b"commit C");
    fs.sync().unwrap();
    let gen_c = fs.generation();
    fs.close().unwrap();
    let sb = read_superblock(dev.as_ref()).unwrap();
    corrupt_node(dev.as_ref(), sb.backup_roots[0].root_tree_bytenr);
    corrupt_node(dev.as_ref(), sb.backup_roots[1].extent_root.bytenr);
    let fs = open(&dev, rescue(false)).unwrap();
    let used: BackupRootUsed = fs.backup_root_used().unwrap();
    assert_eq!(
        (
            used.mounted_generation,
            used.newest_generation,
            used.commits_rolled_back
        ),
        (gen_a, gen_c, 2)
    );
    assert_eq!(
        used.rejected.iter().map(|(g, _)| *g).collect::<Vec<_>>(),
        vec![gen_c, gen_c - 1]
    );
    assert_same(&view(&fs), &view_a, "mounted");
    fs.close().unwrap();
}

#[test]
fn every_recorded_commit_unreadable_fails_clearly() {
    let dev = memory_fs(DEVICE_BYTES, 0xB4);
    let fs = open(&dev, deterministic()).unwrap();
    for i in 0..4 {
        write_file(&fs, fs.root_ino(), "f", &content("all", i, 3000));
        fs.sync().unwrap();
    }
    fs.close().unwrap();
    let sb = read_superblock(dev.as_ref()).unwrap();
    for backup in &sb.backup_roots {
        corrupt_node(dev.as_ref(), backup.root_tree_bytenr);
    }
    let text = open(&dev, rescue(false)).err().unwrap().to_string();
    assert!(text.contains("no older commit loads either"), "{text}");
    for backup in &sb.backup_roots[1..] {
        assert!(
            text.contains(&format!("generation {}:", backup.generation)),
            "{text}"
        );
    }
}

/// Rewrites both superblock copies with every backup slot zeroed, as a
/// birch from before backup roots left them.
fn zero_backup_slots(dev: &dyn BlockDevice) {
    let mut sb: Superblock = read_superblock(dev).unwrap();
    sb.backup_roots = [BackupRoot::EMPTY; BACKUP_ROOT_COUNT];
    for offset in SUPERBLOCK_OFFSETS {
        let bytes = sb.encode(offset);
        assert_eq!(bytes.len(), SUPERBLOCK_SIZE);
        dev.write_at(&bytes, offset).unwrap();
    }
}

#[test]
fn image_without_backup_roots_mounts_and_fails_without_a_hint() {
    let (dev, view_a, _, _) = two_commits();
    let view_b = {
        let fs = open(&dev, deterministic()).unwrap();
        let v = view(&fs);
        fs.close().unwrap();
        v
    };
    assert_ne!(view_a, view_b);
    zero_backup_slots(dev.as_ref());
    assert_clean(dev.as_ref(), "zeroed slots");
    // Zeroed slots are no backups: the image mounts as before, and its
    // first commit records itself.
    let fs = open(&dev, deterministic()).unwrap();
    assert_same(&view(&fs), &view_b, "mounted");
    write_file(&fs, fs.root_ino(), "x", b"x");
    fs.close().unwrap();
    let sb = read_superblock(dev.as_ref()).unwrap();
    assert_eq!(sb.backup_roots[0].generation, sb.generation);
    assert!(sb.backup_roots[1].is_empty());

    corrupt_newest_root(dev.as_ref(), DamagedRoot::Root);
    let text = open(&dev, deterministic()).err().unwrap().to_string();
    assert!(!text.contains("rescue"), "no backup, no hint: {text}");
    let text = open(&dev, rescue(false)).err().unwrap().to_string();
    assert!(text.contains("records no older commit"), "{text}");
}

#[test]
fn power_cut_during_the_rollback_commit_leaves_a_mountable_image() {
    let (dev, view_a, gen_a, _) = two_commits();
    corrupt_newest_root(dev.as_ref(), DamagedRoot::Root);
    let rec = Arc::new(RecordingDevice::new(dev.snapshot()));
    let fs = Filesystem::open(rec.clone(), rescue(true)).unwrap();
    fs.close().unwrap();
    let points = crash_points(&rec, 0, &Enumeration::sampled(0xB5));
    assert!(points.len() > 2);
    let mut rolled_back = 0;
    for point in &points {
        let image = Arc::new(MemoryDevice::from_bytes(rec.crash_image(point)));
        // Either the rollback is durable (a plain mount shows A and the
        // image checks clean), or the damaged commit is still the newest
        // (the rescue shows A again).
        let fs = match open(&image, deterministic()) {
            Ok(fs) => {
                rolled_back += 1;
                let report = check_device(image.as_ref());
                assert!(report.is_clean(), "{point:?}:\n{report}");
                fs
            }
            Err(_) => open(&image, rescue(false))
                .unwrap_or_else(|e| panic!("{point:?}: rescue failed: {e}")),
        };
        assert_same(&view(&fs), &view_a, &format!("{point:?}"));
        assert!(fs.generation() >= gen_a);
        fs.close().unwrap();
    }
    assert!(rolled_back > 0, "no crash point kept the rollback commit");
}

#[test]
fn held_space_returns_after_the_next_commit() {
    let dev = memory_fs(32 << 20, 0xB6);
    let fs = open(&dev, deterministic()).unwrap();
    let root = fs.root_ino();
    // Fill, empty, fill again: the emptied space is held for one commit
    // and must come back through reclaim commits, not as ENOSPC.
    let fill = |tag: &str| -> u64 {
        let mut accepted = 0u64;
        for i in 0.. {
            let ino = match fs.create(root, format!("{tag}{i}").as_bytes(), 0o644, 0, 0) {
                Ok(attr) => attr.ino,
                Err(Error::NoSpace) => break,
                Err(e) => panic!("{e}"),
            };
            match fs.write_file(ino, 0, &content(tag, i, 1 << 20)) {
                Ok(n) => accepted += n as u64,
                Err(Error::NoSpace) => break,
                Err(e) => panic!("{e}"),
            }
        }
        accepted
    };
    let first = fill("x");
    fs.sync().unwrap();
    for e in fs.readdir(root, 0, usize::MAX).unwrap() {
        fs.unlink(root, &e.name).unwrap();
    }
    let second = fill("y");
    assert!(
        second + (1 << 20) >= first,
        "the refill got {second} bytes where the first fill got {first}"
    );
    fs.sync().unwrap();
    // The engine's accounting agrees with what check counts on disk: what
    // is neither free nor in use is held for the previous commit.
    let usage = fs.space_usage();
    fs.close().unwrap();
    let report = check_device(dev.as_ref());
    assert!(report.is_clean(), "{report}");
    assert_eq!(usage.free + usage.pinned, report.summary.free_bytes);
}

#[test]
fn check_rejects_backup_slots_out_of_order() {
    let (dev, _, _, _) = two_commits();
    assert_clean(dev.as_ref(), "two commits");
    let mut sb = read_superblock(dev.as_ref()).unwrap();
    sb.backup_roots.swap(0, 1);
    for offset in SUPERBLOCK_OFFSETS {
        dev.write_at(&sb.encode(offset), offset).unwrap();
    }
    let report = check_device(dev.as_ref());
    assert!(
        report
            .faults_with(FaultId::BackupRootOrder)
            .any(|f| f.reason.starts_with("backup root slot 1 ")),
        "{report}"
    );
}

#[test]
fn no_write_touches_the_two_newest_commits_of_a_nearly_full_filesystem() {
    // Under DUP metadata (the default) nodes and the metadata reserves
    // take twice the space: 20 MiB of files nearly fill 32 MiB.
    const FILLED: usize = 20;
    const REWRITTEN: usize = 4;
    let initial = memory_fs(32 << 20, 0xB8).snapshot();
    let rec = Arc::new(RecordingDevice::new(initial.clone()));
    let fs = Filesystem::open(rec.clone(), deterministic()).unwrap();
    let root = fs.root_ino();
    // Nearly full, then rewrites, fsyncs and deletes with a commit after
    // each round: space is short, so freed space is reused as soon as the
    // allocator may reuse it (ENOSPC on the way is allowed).
    let write = |name: &str, data: &[u8]| -> Option<u64> {
        let ino = match fs.lookup(root, name.as_bytes()) {
            Ok(attr) => attr.ino,
            Err(_) => fs.create(root, name.as_bytes(), 0o644, 0, 0).ok()?.ino,
        };
        fs.write_file(ino, 0, data).ok().map(|_| ino)
    };
    for i in 0..FILLED {
        write(&format!("f{i}"), &content("fill", i, 1 << 20));
    }
    fs.sync().unwrap();
    for round in 0..12 {
        for k in 0..REWRITTEN {
            let i = (round * REWRITTEN + k) % FILLED;
            if let Some(ino) = write(&format!("f{i}"), &content("round", round * 10 + k, 1 << 20)) {
                let _ = fs.fsync(ino, false);
            }
        }
        let _ = fs.unlink(root, format!("s{}", round % 3).as_bytes());
        write(&format!("s{}", round % 3), &content("small", round, 60_000));
        let _ = fs.sync();
    }
    assert_eq!(fs.space_stats().enospc, 0);
    fs.close().unwrap();
    assert!(fs_commits(&rec) > 12);

    // Replay the recording: from each superblock on, the commits of its
    // slots 0 and 1 are protected until the next superblock.
    let image = Arc::new(MemoryDevice::from_bytes(initial));
    let protected_by = |image: &Arc<MemoryDevice>| -> Vec<(u64, u64)> {
        let sb = read_superblock(image.as_ref()).unwrap();
        sb.backup_roots[..2]
            .iter()
            .filter(|b| !b.is_empty())
            .flat_map(|b| extents_on(image.clone(), b, sb.fsid))
            .collect()
    };
    let mut protected = protected_by(&image);
    for (at, event) in rec.events().iter().enumerate() {
        let DeviceEvent::Write { offset, bytes } = event else {
            continue;
        };
        let end = offset + bytes.len() as u64;
        if SUPERBLOCK_OFFSETS.contains(offset) {
            image.write_at(bytes, *offset).unwrap();
            protected = protected_by(&image);
            continue;
        }
        if let Some(hit) = protected.iter().find(|&&(s, l)| *offset < s + l && s < end) {
            panic!("write {at} to [{offset}, {end}) overwrote {hit:?}, used by one of the two newest commits");
        }
        image.write_at(bytes, *offset).unwrap();
    }
}

/// Commits a recording holds: superblock writes to the first copy with a
/// new generation.
fn fs_commits(rec: &RecordingDevice) -> usize {
    let mut generations = std::collections::BTreeSet::new();
    for event in rec.events() {
        if let DeviceEvent::Write { offset, bytes } = event {
            if offset == SUPERBLOCK_OFFSETS[0] {
                if let Ok(sb) = Superblock::decode(&bytes, offset) {
                    generations.insert(sb.generation);
                }
            }
        }
    }
    generations.len()
}
