//! Subvolume deletion and the cleaner through the library
//! (docs/SNAPSHOTS.md (d), step 9 of (j)): what `delete` refuses, the
//! space a finished drop gives back, `birch check` on a drop in progress,
//! and the crash cases of (i) for deletion, snapshots and their sources
//! deleted among them (the Forest-level drop of shared nodes is
//! `btree/model_tests.rs` `delete_snapshot_after_source_changed`).

mod common;

use birch::check::check_device;
use birch::check::fixture::sample;
use birch::device::{BlockDevice, MemoryDevice};
use birch::error::Error;
use birch::format::{tree_id, Key, ROOT_DIR_INO, SUBVOL_RDONLY};
use birch::fs::{Filesystem, MountOptions};
use common::{crash_mount, crash_points, memory_fs, mount, recorder, Enumeration};
use std::sync::Arc;

/// Nodes the cleaner releases per transaction in these tests: small, so
/// that a drop spans several commits.
const NODES_PER_TRANSACTION: usize = 8;

fn small_steps() -> MountOptions {
    MountOptions {
        cleaner_nodes_per_transaction: NODES_PER_TRANSACTION,
        ..MountOptions::deterministic()
    }
}

/// Fills directory `dir` with `dirs` directories of `files` empty files
/// each: a subvolume tree of many leaves under one or two levels.
fn fill<D: BlockDevice + 'static>(fs: &Filesystem<D>, dir: u64, dirs: usize, files: usize) {
    for d in 0..dirs {
        let sub = fs
            .mkdir(dir, format!("dir{d}").as_bytes(), 0o755, 0, 0)
            .unwrap()
            .ino;
        for f in 0..files {
            fs.create(
                sub,
                format!("file-with-a-longer-name-{f}").as_bytes(),
                0o644,
                0,
                0,
            )
            .unwrap();
        }
    }
}

/// Runs the cleaner until no deleted subvolume is left; returns how many
/// transactions it took.
fn clean_all<D: BlockDevice + 'static>(fs: &Filesystem<D>) -> usize {
    let mut rounds = 1;
    while fs.run_cleaner().unwrap() {
        rounds += 1;
    }
    assert!(fs.deleted_subvolumes().is_empty());
    rounds
}

/// Runs the cleaner to the end and checks the free blocks are back to
/// `before` (within the 8 blocks a tree's own commits may move).
fn assert_space_back<D: BlockDevice + 'static>(fs: &Filesystem<D>, before: u64, context: &str) {
    clean_all(fs);
    let after = settled_free_blocks(fs);
    assert!(
        after + 8 >= before && after <= before,
        "{context}: free blocks {after} after the drop, {before} before the create"
    );
}

/// Free blocks once the space freed by the last commits is back: freed
/// space is held until the commit after the one that freed it is durable.
fn settled_free_blocks<D: BlockDevice + 'static>(fs: &Filesystem<D>) -> u64 {
    fs.sync().unwrap();
    fs.sync().unwrap();
    fs.statfs().unwrap().blocks_free
}

#[test]
fn delete_refuses_what_btrfs_refuses() {
    let dev = memory_fs(32 << 20, 0x71);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let a_root = fs.lookup(root, b"a").unwrap().ino;
    fs.create_subvolume(a_root, b"inner", 0, 0).unwrap();
    fs.create_subvolume(root, b"b", 0, 0).unwrap();
    fs.mkdir(root, b"plain", 0o755, 0, 0).unwrap();
    let errno = |r: birch::error::Result<u64>| r.unwrap_err().errno();
    assert_eq!(errno(fs.delete_subvolume(root, b"a")), libc::ENOTEMPTY);
    assert_eq!(errno(fs.delete_subvolume(root, b"plain")), libc::EINVAL);
    assert_eq!(errno(fs.delete_subvolume(root, b"none")), libc::ENOENT);
    let plain = fs.lookup(root, b"plain").unwrap().ino;
    fs.create_subvolume(plain, b"held", 0, 0).unwrap();
    fs.set_flags(plain, birch::fs::inode_flags::IMMUTABLE)
        .unwrap();
    assert_eq!(errno(fs.delete_subvolume(plain, b"held")), libc::EPERM);
    fs.set_flags(plain, 0).unwrap();
    fs.delete_subvolume(plain, b"held").unwrap();
    let b = fs.lookup(root, b"b").unwrap().ino;
    let b_id = birch::fs::InoSpace::split(b).0;
    fs.set_default_subvolume(b_id).unwrap();
    assert_eq!(errno(fs.delete_subvolume(root, b"b")), libc::EPERM);
    fs.set_default_subvolume(tree_id::FS).unwrap();
    // rmdir deletes an empty subvolume (btrfs since 4.18), refuses a full
    // one (which `delete` takes).
    fs.create_subvolume(root, b"c", 0, 0).unwrap();
    let c = fs.lookup(root, b"c").unwrap().ino;
    fs.mkdir(c, b"x", 0o755, 0, 0).unwrap();
    assert_eq!(fs.rmdir(root, b"c").unwrap_err().errno(), libc::ENOTEMPTY);
    fs.delete_subvolume(root, b"c").unwrap();
    fs.rmdir(root, b"b").unwrap();
    assert_eq!(fs.lookup(root, b"b").unwrap_err().errno(), libc::ENOENT);
    assert!(
        matches!(fs.getattr(b), Err(Error::NotFound)),
        "a deleted subvolume's inodes are gone"
    );
    assert_eq!(fs.deleted_subvolumes().len(), 3);
    // Inner first, then the outer one.
    fs.delete_subvolume(a_root, b"inner").unwrap();
    fs.delete_subvolume(root, b"a").unwrap();
    let listed: Vec<u64> = fs.list_subvolumes().unwrap().iter().map(|i| i.id).collect();
    assert_eq!(listed, vec![tree_id::FS]);
    fs.sync().unwrap();
    common::assert_clean(dev.as_ref(), "deleted, not dropped");
    clean_all(&fs);
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "dropped");
    let fs = mount(dev);
    assert!(fs.deleted_subvolumes().is_empty());
    assert_eq!(fs.readdir(fs.root_ino(), 0, 100).unwrap().len(), 1);
}

/// A subvolume in a read-only subvolume cannot be deleted (EROFS).
#[test]
fn delete_in_read_only_parent_is_erofs() {
    let mut b = sample();
    b.enable_subvolumes();
    let sv = b.subvolume(tree_id::FS, ROOT_DIR_INO, b"sv");
    b.subvolume(sv, ROOT_DIR_INO, b"inner");
    b.subvol_item_mut(sv).flags = SUBVOL_RDONLY;
    let dev = Arc::new(b.build().device());
    let fs = Filesystem::open(dev, MountOptions::deterministic()).unwrap();
    let sv_root = fs.lookup(fs.root_ino(), b"sv").unwrap().ino;
    assert!(matches!(
        fs.delete_subvolume(sv_root, b"inner"),
        Err(Error::ReadOnly)
    ));
}

/// Deleting a subvolume and letting the cleaner finish gives back every
/// block it used: the free space is what it was before it was created,
/// but for the few nodes the root and extent trees kept from growing.
#[test]
fn delete_frees_the_space() {
    let dev = memory_fs(64 << 20, 0x72);
    let fs = Filesystem::open(dev.clone(), small_steps()).unwrap();
    let root = fs.root_ino();
    let before = settled_free_blocks(&fs);
    fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    fill(&fs, sv, 20, 60);
    let full = settled_free_blocks(&fs);
    assert!(
        before - full > 40,
        "the subvolume uses space ({before} -> {full})"
    );
    fs.delete_subvolume(root, b"sv").unwrap();
    fs.sync().unwrap();
    let rounds = clean_all(&fs);
    assert!(rounds > 3, "the drop spans several commits ({rounds})");
    let after = settled_free_blocks(&fs);
    assert!(
        after + 8 >= before && after <= before,
        "free blocks back: {before} before create, {full} full, {after} after the drop"
    );
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the drop");
}

/// `birch check` on an image whose drop was interrupted: clean (the
/// released part of the dead tree is not walked, its counts agree), and
/// the summary names the deleted subvolume and its progress.
#[test]
fn check_reports_interrupted_deletion() {
    let dev = memory_fs(32 << 20, 0x73);
    let fs = Filesystem::open(dev.clone(), small_steps()).unwrap();
    let root = fs.root_ino();
    let id = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    fill(&fs, sv, 20, 60);
    fs.delete_subvolume(root, b"sv").unwrap();
    fs.sync().unwrap();
    let report = check_device(dev.as_ref());
    assert!(report.is_clean(), "deleted, not started:\n{report}");
    assert_eq!(report.summary.deleted_subvolumes, vec![(id, Key::MIN)]);
    assert!(fs.run_cleaner().unwrap());
    assert!(fs.run_cleaner().unwrap());
    fs.shut_down();
    let report = check_device(dev.as_ref());
    assert!(report.is_clean(), "interrupted:\n{report}");
    let [(got, progress)] = report.summary.deleted_subvolumes[..] else {
        panic!("one deleted subvolume: {report}");
    };
    assert_eq!(got, id);
    assert!(progress > Key::MIN, "progress recorded: {report}");
    assert!(
        report
            .to_string()
            .contains(&format!("deleted subvolume {id}: being dropped")),
        "{report}"
    );
}

/// Crash case: `subvolume create sv; <fill sv>; sync; delete -c sv; <cut
/// at every flush point of the cleaner's first three commits>` → the
/// image is check-clean (a dead root with progress, not a fault), `sv` is
/// gone, the mount resumes the drop, which finishes check-clean with the
/// space of `sv` back.
#[test]
fn crash_mid_deletion_resumes() {
    let rec = recorder(64 << 20, 0x74);
    let fs = Filesystem::open(rec.clone(), small_steps()).unwrap();
    let root = fs.root_ino();
    let before = settled_free_blocks(&fs);
    let id = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    fill(&fs, sv, 20, 60);
    fs.sync().unwrap();
    fs.delete_subvolume(root, b"sv").unwrap();
    fs.commit().unwrap();
    let deleted = rec.flush_count();
    for _ in 0..3 {
        assert!(
            fs.run_cleaner().unwrap(),
            "the drop takes more than three commits"
        );
    }
    fs.shut_down();
    drop(fs);
    let points = crash_points(&rec, deleted, &Enumeration::budgeted(40, 0x74));
    let mut resumed_mid_drop = 0;
    for point in &points {
        crash_mount(&rec, point, |fs| {
            assert_eq!(
                fs.lookup(fs.root_ino(), b"sv").unwrap_err().errno(),
                libc::ENOENT,
                "{point:?}"
            );
            assert_eq!(fs.deleted_subvolumes(), vec![id], "{point:?}");
            assert_space_back(fs, before, &format!("{point:?}"));
        });
        let image = MemoryDevice::from_bytes(rec.crash_image(point));
        let report = check_device(&image);
        if report
            .summary
            .deleted_subvolumes
            .iter()
            .any(|&(_, p)| p > Key::MIN)
        {
            resumed_mid_drop += 1;
        }
    }
    assert!(
        resumed_mid_drop > 0,
        "some of the {} states are mid-drop",
        points.len()
    );
}

/// Crash case: `subvolume create sv; <write into sv>; sync; delete sv;
/// <cut before the next commit>` → `sv` is there with its content
/// (nothing of that transaction was durable); with `delete -c`, `sv` is
/// gone at every state after the commit's superblock.
#[test]
fn delete_then_crash_before_commit_keeps_subvolume() {
    for commit_after in [false, true] {
        let rec = recorder(32 << 20, 0x75);
        let fs = mount(rec.clone());
        let root = fs.root_ino();
        fs.create_subvolume(root, b"sv", 0, 0).unwrap();
        let sv = fs.lookup(root, b"sv").unwrap().ino;
        fs.mkdir(sv, b"d", 0o755, 0, 0).unwrap();
        fs.sync().unwrap();
        let synced = rec.flush_count();
        fs.delete_subvolume(root, b"sv").unwrap();
        if commit_after {
            fs.commit().unwrap();
        }
        let committed = rec.flush_count();
        fs.shut_down();
        drop(fs);
        let mut saw = [false; 2];
        for point in crash_points(&rec, synced, &Enumeration::thorough(0x75)) {
            let view = common::crash_view(&rec, &point);
            let kept = view.contains_key("/sv");
            if kept {
                assert!(view.contains_key("/sv/d"), "{point:?}: {view:?}");
            }
            if !commit_after || point.flushes_completed < committed {
                assert!(kept || commit_after, "{point:?}: {view:?}");
            } else {
                assert!(!kept, "{point:?}: after the commit: {view:?}");
            }
            saw[kept as usize] = true;
        }
        assert!(
            saw[1],
            "sv kept in some state (commit_after {commit_after})"
        );
        assert_eq!(saw[0], commit_after, "sv gone only after a commit");
    }
}

/// An fsync of the directory that lost a subvolume link commits (a log
/// cannot carry the root-tree items, seed 000): after `touch x; fsync .;
/// delete sv; fsync .; <cut>`, `sv` is gone and `x` is there.
#[test]
fn fsync_of_dir_whose_subvolume_was_deleted_commits() {
    let rec = recorder(32 << 20, 0x76);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    fs.sync().unwrap();
    fs.create(root, b"x", 0o644, 0, 0).unwrap();
    fs.fsync(root, false).unwrap();
    fs.delete_subvolume(root, b"sv").unwrap();
    let commits = fs.stats().commits;
    fs.fsync(root, false).unwrap();
    assert_eq!(fs.stats().commits, commits + 1, "the fsync committed");
    let synced = rec.flush_count();
    fs.shut_down();
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::thorough(0x76)) {
        let view = common::crash_view(&rec, &point);
        assert!(!view.contains_key("/sv"), "{point:?}: {view:?}");
        assert!(view.contains_key("/x"), "{point:?}: {view:?}");
    }
}

/// A full filesystem with a deleted subvolume not yet dropped: a write
/// that needs the subvolume's space gets it, because space reclaim runs
/// the cleaner before it answers ENOSPC (docs/SNAPSHOTS.md (d), "Space").
#[test]
fn reclaim_drops_deleted_subvolumes_before_enospc() {
    let dev = memory_fs(32 << 20, 0x77);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    fill(&fs, sv, 40, 100);
    fs.sync().unwrap();
    // Fill what is left with data in tree 5, until a write is refused.
    let chunk = vec![0x5au8; 64 * 1024];
    let f = fs.create(root, b"big", 0o644, 0, 0).unwrap().ino;
    let g = fs.create(root, b"more", 0o644, 0, 0).unwrap().ino;
    let mut size = 0u64;
    loop {
        match fs.write_file(f, size, &chunk) {
            Ok(n) if n == chunk.len() => size += n as u64,
            Ok(_) | Err(Error::NoSpace) => break,
            Err(e) => panic!("write: {e}"),
        }
    }
    fs.sync().unwrap();
    assert!(
        matches!(fs.write_file(g, 0, &chunk), Err(Error::NoSpace)),
        "full"
    );
    fs.delete_subvolume(root, b"sv").unwrap();
    // The subvolume's ~1 MiB of nodes are enough for the next writes.
    for i in 0..8u64 {
        fs.write_file(g, i * chunk.len() as u64, &chunk)
            .unwrap_or_else(|e| panic!("write {i} after the delete: {e}"));
    }
    fs.sync().unwrap();
    assert!(fs.deleted_subvolumes().is_empty(), "dropped by reclaim");
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after reclaim");
}

/// The background worker runs the cleaner: a deleted subvolume is dropped
/// without any call, a bounded transaction at a time.
#[test]
fn background_worker_drops_deleted_subvolumes() {
    let dev = memory_fs(32 << 20, 0x78);
    let options = MountOptions {
        commit_interval: Some(std::time::Duration::from_millis(20)),
        ..small_steps()
    };
    let fs = Filesystem::open(dev.clone(), options).unwrap();
    let root = fs.root_ino();
    fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    fill(&fs, sv, 20, 60);
    fs.delete_subvolume(root, b"sv").unwrap();
    let commits = fs.stats().commits;
    // Waits for the worker (a liveness bound, not a timing assertion).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !fs.deleted_subvolumes().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never dropped it"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(fs.stats().commits > commits + 3, "in several transactions");
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the worker's drop");
}

/// Files with `count` blocks of data each in directory `dir`; their pages
/// stay dirty until the next commit.
fn write_files<D: BlockDevice + 'static>(fs: &Filesystem<D>, dir: u64, files: usize, fill: u8) {
    for f in 0..files {
        let ino = fs
            .create(dir, format!("data{f}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        fs.write_file(ino, 0, &vec![fill ^ f as u8; 3 * 4096])
            .unwrap();
    }
}

/// Contents of file `data{f}` in directory `dir`.
fn read_data<D: BlockDevice + 'static>(fs: &Filesystem<D>, dir: u64, f: usize) -> Vec<u8> {
    let ino = fs.lookup(dir, format!("data{f}").as_bytes()).unwrap().ino;
    fs.read_file(ino, 0, 3 * 4096).unwrap()
}

/// A subvolume deleted while its files have dirty pages: the pages go
/// with it (their reservations too), the next commit succeeds without
/// writing them, and the drop gives every block back.
#[test]
fn delete_with_dirty_pages_discards_them() {
    let dev = memory_fs(64 << 20, 0x74);
    let fs = Filesystem::open(dev.clone(), small_steps()).unwrap();
    let root = fs.root_ino();
    let before = settled_free_blocks(&fs);
    fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    write_files(&fs, sv, 40, 0x5a);
    fs.delete_subvolume(root, b"sv").unwrap();
    fs.sync().unwrap();
    assert_space_back(&fs, before, "sv");
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the drop");
}

/// A snapshot deleted after its source changed: the drop releases only
/// what the snapshot alone held (shared nodes lose one reference, data
/// extents still in the source stay), the source reads as before, and
/// the space the snapshot pinned comes back.
#[test]
fn delete_snapshot_after_source_changed() {
    let dev = memory_fs(64 << 20, 0x75);
    let fs = Filesystem::open(dev.clone(), small_steps()).unwrap();
    let root = fs.root_ino();
    let id = fs.create_subvolume(root, b"src", 0, 0).unwrap();
    let src = fs.lookup(root, b"src").unwrap().ino;
    fill(&fs, src, 6, 40);
    write_files(&fs, src, 30, 0x11);
    fs.sync().unwrap();
    let before = settled_free_blocks(&fs);
    fs.create_snapshot(id, root, b"snap", true).unwrap();
    // The source changes: half its files rewritten, a third removed.
    for f in 0..15 {
        let ino = fs.lookup(src, format!("data{f}").as_bytes()).unwrap().ino;
        fs.write_file(ino, 0, &vec![0xee; 3 * 4096]).unwrap();
    }
    for f in 20..30 {
        fs.unlink(src, format!("data{f}").as_bytes()).unwrap();
    }
    let snap = fs.lookup(root, b"snap").unwrap().ino;
    assert_eq!(read_data(&fs, snap, 25), vec![0x11 ^ 25; 3 * 4096]);
    fs.sync().unwrap();
    common::assert_clean(dev.as_ref(), "snapshot and changed source");
    fs.delete_subvolume(root, b"snap").unwrap();
    fs.sync().unwrap();
    clean_all(&fs);
    for f in 0..20 {
        let want = if f < 15 { 0xee } else { 0x11 ^ f as u8 };
        assert_eq!(read_data(&fs, src, f), vec![want; 3 * 4096], "data{f}");
    }
    let after = settled_free_blocks(&fs);
    // The source dropped 10 files and rewrote 15 since `before`: 25 files
    // of 3 blocks the snapshot held are free again, the 15 rewrites are
    // new blocks.
    assert!(
        after + 8 >= before + 10 * 3 && after <= before + 10 * 3 + 8,
        "free blocks: {before} before the snapshot, {after} after its drop"
    );
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the snapshot's drop");
}

/// The source of a snapshot deleted: the snapshot keeps every name and
/// byte (the drop only decrements what it shares).
#[test]
fn delete_source_keeps_its_snapshot() {
    let dev = memory_fs(64 << 20, 0x76);
    let fs = Filesystem::open(dev.clone(), small_steps()).unwrap();
    let root = fs.root_ino();
    let id = fs.create_subvolume(root, b"src", 0, 0).unwrap();
    let src = fs.lookup(root, b"src").unwrap().ino;
    fill(&fs, src, 6, 40);
    write_files(&fs, src, 30, 0x22);
    fs.create_snapshot(id, root, b"snap", false).unwrap();
    fs.delete_subvolume(root, b"src").unwrap();
    fs.sync().unwrap();
    clean_all(&fs);
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the source's drop");
    let fs = mount(dev.clone());
    let snap = fs.lookup(fs.root_ino(), b"snap").unwrap().ino;
    for f in 0..30 {
        assert_eq!(read_data(&fs, snap, f), vec![0x22 ^ f as u8; 3 * 4096]);
    }
    let dir5 = fs.lookup(snap, b"dir5").unwrap().ino;
    assert!(fs.lookup(dir5, b"file-with-a-longer-name-39").is_ok());
}

/// Crash case: `subvolume create sv; write sv/f; sync; open sv/f; delete
/// sv; write f; fsync f; write f; fsync f; sync; write g; fsync g; close
/// f; <cut>` → `sv` gone at every state from the first fsync's return
/// (it committed the delete: `fallback_subvolume`), `g` has its data
/// once its fsync returned, check clean, and the mount's cleaner drops
/// the tree and gives its space back. The second fsync neither commits
/// nor logs: the deletion is durable, and a log naming a root that is
/// not live in its base commit would make replay discard every root's
/// log, `g`'s with it. The `sync` commits the open file's new data into
/// the deleted tree, which check must find whole.
#[test]
fn fsync_in_deleted_subvolume_is_a_no_op() {
    let rec = recorder(32 << 20, 0x78);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let before = settled_free_blocks(&fs);
    let id = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    let f = fs.create(sv, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[1; 8192]).unwrap();
    let g = fs.create(root, b"g", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    fs.open_inode(f).unwrap();
    fs.delete_subvolume(root, b"sv").unwrap();
    fs.write_file(f, 0, b"after the delete").unwrap();
    let commits = fs.stats().commits;
    fs.fsync(f, false).unwrap();
    assert_eq!(fs.stats().commits, commits + 1, "the first fsync committed");
    let deleted = rec.flush_count();
    fs.write_file(f, 8192, &[2; 8192]).unwrap();
    let log_syncs = fs.log_stats().log_syncs;
    let noop_fsyncs = fs.log_stats().noop_fsyncs;
    fs.fsync(f, false).unwrap();
    assert_eq!(fs.stats().commits, commits + 1, "the second did not commit");
    assert_eq!(fs.log_stats().log_syncs, log_syncs, "nor log");
    assert_eq!(fs.log_stats().noop_fsyncs, noop_fsyncs + 1);
    fs.sync().unwrap();
    let mut expected = b"after the delete".to_vec();
    expected.resize(8192, 1);
    expected.extend_from_slice(&[2; 8192]);
    assert_eq!(fs.read_file(f, 0, 1 << 20).unwrap(), expected);
    fs.write_file(g, 0, b"g's data").unwrap();
    let commits = fs.stats().commits;
    fs.fsync(g, false).unwrap();
    assert_eq!(fs.stats().commits, commits, "g's fsync logged");
    let synced = rec.flush_count();
    fs.release(f).unwrap();
    fs.shut_down();
    drop(fs);
    for point in crash_points(&rec, deleted, &Enumeration::thorough(0x78)) {
        crash_mount(&rec, &point, |fs| {
            let root = fs.root_ino();
            assert_eq!(
                fs.lookup(root, b"sv").unwrap_err().errno(),
                libc::ENOENT,
                "{point:?}"
            );
            assert_eq!(fs.deleted_subvolumes(), [id], "{point:?}");
            if point.flushes_completed >= synced {
                let g = fs.lookup(root, b"g").unwrap().ino;
                assert_eq!(fs.read_file(g, 0, 100).unwrap(), b"g's data", "{point:?}");
            }
            assert_space_back(fs, before, &format!("{point:?}"));
        });
    }
}

/// Crash case: `subvolume create sv; fill sv; sync; open sv/f; delete sv
/// -c; write f; close f; <the cleaner's first two transactions>; <cut at
/// every flush point from the delete's commit>` → `sv` gone in every
/// state, check clean (the tree as the delete left it, with what the
/// open file wrote into it once committed, or a drop in progress), and
/// the mount's cleaner finishes the drop and gives the space back: the
/// last close hands the tree to the cleaner with its delayed items
/// flushed and the file's dirty pages discarded.
#[test]
fn power_cut_after_last_close_of_deleted_subvolume() {
    let rec = recorder(64 << 20, 0x7d);
    let fs = Filesystem::open(rec.clone(), small_steps()).unwrap();
    let root = fs.root_ino();
    let before = settled_free_blocks(&fs);
    let id = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    fill(&fs, sv, 20, 60);
    let f = fs.create(sv, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[0x44; 4 * 4096]).unwrap();
    fs.sync().unwrap();
    fs.open_inode(f).unwrap();
    fs.delete_subvolume(root, b"sv").unwrap();
    fs.commit().unwrap();
    let deleted = rec.flush_count();
    fs.write_file(f, 4 * 4096, &[0x55; 4 * 4096]).unwrap();
    fs.sync().unwrap();
    fs.write_file(f, 0, &[0x66; 4096]).unwrap();
    assert_eq!(fs.deleted_subvolumes(), [id]);
    assert!(!fs.run_cleaner().unwrap(), "held: nothing to drop");
    fs.release(f).unwrap();
    for _ in 0..2 {
        assert!(
            fs.run_cleaner().unwrap(),
            "the drop takes more than two commits"
        );
    }
    fs.shut_down();
    drop(fs);
    let points = crash_points(&rec, deleted, &Enumeration::budgeted(40, 0x7d));
    for point in &points {
        crash_mount(&rec, point, |fs| {
            assert_eq!(
                fs.lookup(fs.root_ino(), b"sv").unwrap_err().errno(),
                libc::ENOENT,
                "{point:?}"
            );
            assert_eq!(fs.deleted_subvolumes(), vec![id], "{point:?}");
            assert_space_back(fs, before, &format!("{point:?}"));
        });
    }
}

/// What btrfs keeps of a subvolume deleted while inodes of it are held
/// (docs/SNAPSHOTS.md (d) step 3): the held inodes keep reading and
/// writing, its other directories keep working, its root directory is a
/// removed one (ENOENT), nothing new links into it, the cleaner leaves it
/// alone; the last release hands it to the cleaner, which gives its space
/// back, and `birch check` is clean.
#[test]
fn open_files_of_deleted_subvolume_stay_usable() {
    let dev = memory_fs(64 << 20, 0x7b);
    let fs = Filesystem::open(dev.clone(), small_steps()).unwrap();
    let root = fs.root_ino();
    let before = settled_free_blocks(&fs);
    let id = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    fill(&fs, sv, 4, 60);
    let d = fs.mkdir(sv, b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[0x11; 3 * 4096]).unwrap();
    let u = fs.create(d, b"u", 0o644, 0, 0).unwrap().ino;
    fs.write_file(u, 0, &[0x22; 4096]).unwrap();
    fs.sync().unwrap();
    for ino in [d, f, u] {
        fs.open_inode(ino).unwrap();
    }
    fs.delete_subvolume(root, b"sv").unwrap();
    assert_eq!(fs.deleted_subvolumes(), [id]);
    let enoent = |what: &str, r: birch::error::Result<()>| {
        assert_eq!(r.map_err(|e| e.errno()), Err(libc::ENOENT), "{what}");
    };
    enoent("lookup of the link", fs.lookup(root, b"sv").map(drop));
    enoent("lookup in its root", fs.lookup(sv, b"d").map(drop));
    enoent("readdir of its root", fs.readdir(sv, 0, 10).map(drop));
    enoent(
        "create in its root",
        fs.create(sv, b"x", 0o644, 0, 0).map(drop),
    );
    // The held inodes, and what is reached through them, work.
    assert_eq!(fs.read_file(f, 0, 4).unwrap(), [0x11; 4]);
    fs.write_file(f, 4096, b"written after the delete").unwrap();
    fs.truncate(f, 2 * 4096).unwrap();
    fs.setxattr(f, b"user.k", b"v", birch::fs::XattrSetMode::CreateOrReplace)
        .unwrap();
    assert_eq!(fs.getxattr(f, b"user.k").unwrap(), b"v");
    assert_eq!(fs.getattr(f).unwrap().size, 2 * 4096);
    assert_eq!(fs.lookup(d, b"f").unwrap().ino, f);
    let g = fs.create(d, b"g", 0o644, 0, 0).unwrap().ino;
    fs.write_file(g, 0, b"new in a deleted subvolume").unwrap();
    fs.rename(d, b"g", d, b"h", Default::default()).unwrap();
    fs.unlink(d, b"u").unwrap();
    assert_eq!(fs.read_file(u, 0, 4).unwrap(), [0x22; 4]);
    fs.fsync(f, false).unwrap();
    fs.sync().unwrap();
    assert_eq!(
        &fs.read_file(f, 4096, 24).unwrap()[..],
        b"written after the delete"
    );
    // Nothing new links into it, nor is it a snapshot's source.
    enoent(
        "subvolume in it",
        fs.create_subvolume(d, b"s", 0, 0).map(drop),
    );
    enoent(
        "snapshot into it",
        fs.create_snapshot(5, d, b"s", false).map(drop),
    );
    enoent(
        "snapshot of it",
        fs.create_snapshot(id, root, b"s", false).map(drop),
    );
    // The cleaner waits for the last hold.
    assert!(!fs.run_cleaner().unwrap(), "nothing it may drop yet");
    assert_eq!(fs.deleted_subvolumes(), [id]);
    assert!(fs.getattr(f).is_ok());
    fs.release(u).unwrap();
    fs.forget(d, 1).unwrap();
    assert_eq!(fs.deleted_subvolumes(), [id]);
    assert!(fs.getattr(f).is_ok(), "f is held still");
    fs.release(f).unwrap();
    enoent("getattr after the last release", fs.getattr(f).map(drop));
    assert_eq!(fs.deleted_subvolumes(), [id], "the cleaner has it now");
    assert_space_back(&fs, before, "sv");
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the drop");
}

/// A subvolume deleted while an inode of it is held, then the mount
/// closed before the last release (an unmount with a file open in it, a
/// crash): the next mount finds it deleted, the cleaner drops it, and its
/// space comes back. `birch check` is clean in between.
#[test]
fn deleted_subvolume_held_at_unmount_is_dropped_at_next_mount() {
    let dev = memory_fs(64 << 20, 0x7c);
    let fs = Filesystem::open(dev.clone(), small_steps()).unwrap();
    let root = fs.root_ino();
    let before = settled_free_blocks(&fs);
    let id = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    fill(&fs, sv, 4, 60);
    let f = fs.create(sv, b"f", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    fs.open_inode(f).unwrap();
    fs.delete_subvolume(root, b"sv").unwrap();
    fs.write_file(f, 0, &[0x33; 5 * 4096]).unwrap();
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "closed with the deleted subvolume held");
    let fs = Filesystem::open(dev.clone(), small_steps()).unwrap();
    assert_eq!(fs.deleted_subvolumes(), [id]);
    enoent_lookup(&fs, b"sv");
    assert_space_back(&fs, before, "sv");
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the drop");
}

fn enoent_lookup<D: BlockDevice + 'static>(fs: &Filesystem<D>, name: &[u8]) {
    assert_eq!(
        fs.lookup(fs.root_ino(), name).unwrap_err().errno(),
        libc::ENOENT
    );
}

/// A deleted subvolume none of whose inodes is held goes to the cleaner
/// at once (docs/SNAPSHOTS.md (d) step 3): a number nobody holds (a file
/// handle, a number the kernel forgot) answers ENOENT for getattr,
/// lookup, listing, open, read and write from the delete on, before the
/// cleaner has dropped a node; a forget finds nothing (ENOENT, which the
/// FUSE adapter ignores).
#[test]
fn deleted_subvolume_inodes_are_enoent_at_once() {
    let dev = memory_fs(32 << 20, 0x7a);
    let fs = mount(dev);
    let root = fs.root_ino();
    fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv_root = fs.lookup(root, b"sv").unwrap().ino;
    let d = fs.mkdir(sv_root, b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, b"data").unwrap();
    fs.sync().unwrap();
    fs.delete_subvolume(root, b"sv").unwrap();
    let enoent = |what: &str, r: birch::error::Result<()>| {
        assert_eq!(r.map_err(|e| e.errno()), Err(libc::ENOENT), "{what}");
    };
    for ino in [sv_root, d, f] {
        enoent("getattr", fs.getattr(ino).map(drop));
        enoent("open", fs.open_inode(ino));
    }
    enoent("lookup", fs.lookup(d, b"f").map(drop));
    enoent("lookup ..", fs.lookup(sv_root, b"..").map(drop));
    enoent("readdir", fs.readdir(d, 0, 10).map(drop));
    enoent("read", fs.read_file(f, 0, 4).map(drop));
    enoent("write", fs.write_file(f, 0, b"x").map(drop));
    enoent("create", fs.create(d, b"g", 0o644, 0, 0).map(drop));
    enoent("forget", fs.forget(f, 1));
    assert_eq!(fs.deleted_subvolumes().len(), 1);
    clean_all(&fs);
    enoent("getattr after the drop", fs.getattr(f).map(drop));
}
