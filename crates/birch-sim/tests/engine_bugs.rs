//! Minimal reproductions of engine bugs found by the simulation tests, kept
//! as regression tests once fixed.
//!
//! A test of a bug still open is marked `#[ignore = "engine bug: ..."]`, so
//! CI stays green while the bug is open; run those with
//! `cargo test -p birch-sim --test engine_bugs -- --ignored`. When a bug is
//! fixed, drop its `#[ignore]` (and its entry in
//! `harness::known_divergence` or `harness::KNOWN_CHECK_FAULTS`, if any).

use birch::device::MemoryDevice;
use birch::fs::{Filesystem, MountOptions, RenameFlags};
use birch_sim::runner::fresh_device;
use std::sync::Arc;

fn open(dev: &Arc<MemoryDevice>) -> Filesystem<Arc<MemoryDevice>> {
    Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap()
}

fn assert_clean(dev: &Arc<MemoryDevice>) {
    let report = birch::check::check_device(&**dev);
    assert!(report.is_clean(), "{report}");
}

/// The scripted crash regressions: a workload written out op by op,
/// recorded on the crash device with deterministic mounts, and judged by
/// every oracle in the one crash state where the power goes right after a
/// chosen op returned (its flushes done, before the unmount's commit).
mod scripted {
    use birch::fs::MountOptions;
    use birch_sim::crash::{check_state, record, CrashConfig, OpSource, StateReport};
    use birch_sim::model::RenameFlags;
    pub use birch_sim::workload::{Op, Target};

    /// `"a/b"` as path components; `""` is the root.
    pub fn path(s: &str) -> Vec<Vec<u8>> {
        s.split('/')
            .filter(|c| !c.is_empty())
            .map(|c| c.as_bytes().to_vec())
            .collect()
    }

    pub fn mkdir(s: &str) -> Op {
        Op::Mkdir {
            path: path(s),
            perm: 0o755,
        }
    }

    pub fn create(s: &str) -> Op {
        Op::Create {
            path: path(s),
            perm: 0o644,
        }
    }

    pub fn fsync_dir(s: &str) -> Op {
        Op::FsyncDir {
            target: Target::Path(path(s)),
        }
    }

    pub fn rename(from: &str, to: &str) -> Op {
        Op::Rename {
            from: path(from),
            to: path(to),
            flags: RenameFlags::default(),
        }
    }

    /// renameat2(RENAME_EXCHANGE).
    pub fn exchange(a: &str, b: &str) -> Op {
        Op::Rename {
            from: path(a),
            to: path(b),
            flags: RenameFlags {
                exchange: true,
                ..RenameFlags::default()
            },
        }
    }

    /// Records `script` and judges the power cut right after op `after`
    /// (an index into `script`) returned; panics with the oracles' finding.
    pub fn power_cut_after(script: Vec<Op>, after: usize) -> StateReport {
        let mut cfg = CrashConfig::ci(0);
        cfg.mount = MountOptions::deterministic();
        let trace = record(&cfg, OpSource::Script(script)).unwrap();
        let k = trace.ops[after].flushes_after;
        check_state(&trace, k, &[], trace.crash_image(k, &[])).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Fixed. A small (inline) file that grows past the inline limit through a write
/// that does not touch its first page keeps its inline extent next to the
/// new regular extent; `birch check` rejects the image ("inline extent is
/// not the file's only extent"). writeback_inode (fs/file.rs) converts
/// inline data to a regular extent only when page 0 is dirty.
#[test]
fn inline_file_grown_by_a_write_past_page_0_fails_check() {
    let dev = fresh_device(32 << 20);
    let fs = open(&dev);
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[1u8; 100]).unwrap();
    fs.sync().unwrap();
    fs.write_file(f, 8192, &[2u8; 10]).unwrap();
    fs.close().unwrap();
    assert_clean(&dev);
}

/// Fixed. link(2) of a directory onto an existing name: the kernel says EEXIST
/// (filename_create() runs before vfs_link()'s EPERM); the engine says
/// EPERM (fs/namespace.rs `link` checks the type before the name).
#[test]
fn link_of_a_directory_onto_an_existing_name_is_eexist() {
    let dev = fresh_device(32 << 20);
    let fs = open(&dev);
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    fs.create(root, b"f", 0o644, 0, 0).unwrap();
    assert_eq!(fs.link(d, root, b"f").unwrap_err().errno(), libc::EEXIST);
}

/// Fixed. renameat2(RENAME_NOREPLACE) of a directory onto an existing entry inside
/// itself: the kernel says EEXIST (checked before the subtree trap); the
/// engine says EINVAL.
#[test]
fn rename_noreplace_into_own_subtree_onto_existing_is_eexist() {
    let dev = fresh_device(32 << 20);
    let fs = open(&dev);
    let root = fs.root_ino();
    let a = fs.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino;
    fs.mkdir(a, b"b", 0o755, 0, 0).unwrap();
    let err = fs
        .rename(
            root,
            b"a",
            a,
            b"b",
            RenameFlags {
                no_replace: true,
                exchange: false,
                whiteout: None,
            },
        )
        .unwrap_err();
    assert_eq!(err.errno(), libc::EEXIST);
}

/// Fixed. rename of a file onto a directory that is an ancestor of the file: the
/// kernel says ENOTEMPTY (lock_rename's trap), the engine EISDIR.
#[test]
fn rename_onto_an_ancestor_is_enotempty() {
    let dev = fresh_device(32 << 20);
    let fs = open(&dev);
    let root = fs.root_ino();
    let a = fs.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino;
    fs.create(a, b"f", 0o644, 0, 0).unwrap();
    assert_eq!(
        fs.rename(a, b"f", root, b"a", RenameFlags::default())
            .unwrap_err()
            .errno(),
        libc::ENOTEMPTY
    );
}

/// Fixed. rename of a missing name to a 256-byte name: the kernel looks the source
/// up first (ENOENT); the engine validates the new name first
/// (ENAMETOOLONG).
#[test]
fn rename_of_a_missing_name_to_a_too_long_name_is_enoent() {
    let dev = fresh_device(32 << 20);
    let fs = open(&dev);
    let root = fs.root_ino();
    assert_eq!(
        fs.rename(root, b"missing", root, &[b'x'; 256], RenameFlags::default())
            .unwrap_err()
            .errno(),
        libc::ENOENT
    );
}

/// Fixed. With the tree log (fsync writes a log instead of committing): writing
/// to a file after its fsync makes the next commit fail with "extent item
/// ... to update does not exist" (the data extent logged by the fsync has
/// its reference dropped twice, or never recorded).
#[test]
fn write_after_fsync_then_commit() {
    let dev = fresh_device(32 << 20);
    let fs = open(&dev);
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[7u8; 10000]).unwrap();
    fs.fsync(f, false).unwrap();
    fs.write_file(f, 10000, &[8u8; 100]).unwrap();
    fs.close().unwrap();
    assert_clean(&dev);
}

/// Fixed. Tree log: fsync of a directory that gained a symlink logs the new entry
/// and inode but not the symlink's target (its inline extent item); after a
/// power cut once the fsync returned, replay yields a symlink with no
/// target ("symlink N has no target item"). Found by crash seed 17.
#[test]
fn fsync_dir_logs_a_new_symlinks_target() {
    use scripted::*;
    let script = vec![
        mkdir("p"),
        Op::Sync,
        Op::Symlink {
            path: path("p/c"),
            target: b"x".to_vec(),
        },
        fsync_dir("p"),
    ];
    power_cut_after(script, 3);
}

/// Tree log: an xattr of a directory, committed by a sync, is lost when a
/// later fsync of the directory is replayed (the replayed directory inode
/// comes back without the xattrs the log did not carry). Found by crash
/// seed 115.
#[test]
fn fsync_dir_replay_keeps_committed_xattrs() {
    use scripted::*;
    let script = vec![
        mkdir("d"),
        Op::SetXattr {
            target: Target::Path(path("d")),
            name: b"user.x".to_vec(),
            value_len: 10,
            fill: 1,
            mode: Default::default(),
        },
        create("d/f"),
        Op::Sync,
        Op::Unlink { path: path("d/f") },
        fsync_dir("d"),
    ];
    power_cut_after(script, 5);
}

/// A device whose writes panic once armed (a stand-in for any engine bug
/// that panics while the engine holds one of its locks).
struct PanickingWrites {
    inner: Arc<MemoryDevice>,
    armed: std::sync::atomic::AtomicBool,
}

impl birch::device::BlockDevice for PanickingWrites {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        assert!(
            !self.armed.load(std::sync::atomic::Ordering::SeqCst),
            "simulated engine bug"
        );
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// A panic inside the engine (here: in a commit's device write) poisons its
/// locks; dropping the `Filesystem` afterwards commits again, panics on the
/// poisoned lock while unwinding, and the process aborts — so a crash test
/// that meets any engine panic loses its report (and a FUSE daemon dies
/// instead of failing the one request). `Drop`/`shut_down` in fs/mod.rs
/// should give up quietly on a poisoned lock. Runs itself in a child
/// process, since the bug is an abort.
#[test]
fn an_engine_panic_does_not_abort_the_process() {
    use birch::device::BlockDevice;
    if std::env::var_os("BIRCH_SIM_CHILD").is_some() {
        let dev = Arc::new(PanickingWrites {
            inner: fresh_device(32 << 20),
            armed: false.into(),
        });
        let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
        fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap();
        dev.armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fs.sync()));
        assert!(r.is_err(), "the armed device panics");
        drop(fs);
        let _ = dev.size_bytes();
        return;
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "an_engine_panic_does_not_abort_the_process",
            "--exact",
            "--include-ignored",
            "--nocapture",
        ])
        .env("BIRCH_SIM_CHILD", "1")
        .status()
        .unwrap();
    assert!(status.success(), "the child died: {status}");
}

/// Tree log: a new directory created in a directory that was renamed (here:
/// exchanged) in the same transaction, then fsynced, is replayed under the
/// parent's *committed* name: after a power cut once the fsync returned,
/// `/a/b` is missing and `/d/b` exists, a path that never existed (the
/// first thing the oracle sees: `/d` has nlink 3, which no state had). The
/// log records the new directory's name in its parent but not the
/// parent's rename; btrfs-style, such a fsync must log the renamed
/// ancestor or fall back to a full commit. Found by crash seed 85.
#[test]
fn fsync_of_a_new_dir_under_a_renamed_parent() {
    use scripted::*;
    let script = vec![
        mkdir("a"),
        mkdir("d"),
        Op::Sync,
        exchange("a", "d"),
        mkdir("a/b"),
        fsync_dir("a/b"),
    ];
    power_cut_after(script, 5);
}

/// Tree log: RENAME_EXCHANGE of a logged new file with a committed file in
/// another directory, then fsync of that other directory: after a power
/// cut once the second fsync returned, the first directory's entry is gone
/// — neither inode is at `/d` (a rename must leave the old or the new name,
/// never neither; `/d` was made durable by the first fsync). Found by long
/// crash seeds 34 and 35.
#[test]
fn exchange_after_fsync_keeps_both_names() {
    use scripted::*;
    let script = vec![
        mkdir("p"),
        create("p/f"),
        Op::Sync,
        create("d"),
        fsync_dir(""),
        exchange("p/f", "d"),
        fsync_dir("p"),
    ];
    power_cut_after(script, 6);
}

/// Tree log: a rename that replaces an entry of an already-logged
/// directory, followed by a log sync of another directory: after a power
/// cut once that sync returned, the replaced name is gone (neither the old
/// nor the new inode is at `/b/x`). Found by long crash seed 133.
#[test]
fn rename_over_an_entry_of_a_logged_directory() {
    use scripted::*;
    let script = vec![
        mkdir("b"),
        create("b/x"),
        fsync_dir("b"),
        create("c"),
        rename("c", "b/x"),
        fsync_dir(""),
    ];
    power_cut_after(script, 5);
}

/// Tree log: a directory renamed onto a new name and fsynced (`rename A/C
/// D; fsync D`), then replaced by another directory renamed over it
/// (`rename B D; fsync D`), in one transaction: after a power cut once the
/// second fsync returned, replay brings the first directory back under its
/// old name A/C — the rename its fsync made durable is undone, and A/C and
/// D both exist. Found by the ACE workload seq2:7857 (tests/ace.rs).
#[test]
fn fsynced_dir_rename_survives_replacing_the_dir() {
    use scripted::*;
    let script = vec![
        mkdir("A"),
        mkdir("A/C"),
        mkdir("B"),
        Op::Sync,
        rename("A/C", "D"),
        fsync_dir("D"),
        rename("B", "D"),
        fsync_dir("D"),
    ];
    let report = power_cut_after(script, 7);
    let names: Vec<String> = report
        .view
        .entries
        .keys()
        .map(|k| birch_sim::model::show_path(k))
        .collect();
    assert!(
        !report.view.entries.contains_key(&path("A/C")),
        "A/C came back: {names:?}"
    );
    assert!(
        !report.view.entries.contains_key(&path("B")),
        "B came back: {names:?}"
    );
}

/// Found by `fs_model` `subvolume_sequences_match_the_model` (seed 3037,
/// 400 ops of snapshots of the top level, rmdir of empty subvolumes,
/// deletes, cleaner runs and remounts): after the final close `birch
/// check` finds a live subvolume tree (refs 1) whose root node is an empty
/// level-1 node: `root-dir-missing` and `root-dir-without-ref` in
/// subvol(259). The tree was whole: `birch check` did not read a
/// subvolume's namespace through the leaves it shared with a snapshot
/// (fixed in check/walk.rs `record_shared_subtree`).
#[test]
fn subvolume_seed_3037_keeps_every_root_directory() {
    let mut run = birch_sim::runner::ModelRun::new(3037, 400);
    run.cfg.subvolume_weight = 6;
    run.mount.cleaner_nodes_per_transaction = 2;
    run.compare_every = 10;
    birch_sim::runner::run_model("engine_bugs", &run).unwrap_or_else(|e| panic!("{e}"));
}

/// Found by the crash explorer (seed 16 of `tests/crash.rs`, CI size):
/// the commit of `subvolume snapshot / /d/L…` (op #227, after 100
/// prepopulated files in /p and a sync) writes a snapshot tree that
/// `birch check` finds broken in the crash state right after that
/// commit's first superblock copy (flush 7, keeping write 0 of 2): in
/// subvol(256) the root directory 256 and /p (257) are missing, and the
/// leaf at block 1458176 holds /p's other entries with no parent. The
/// snapshot was whole: check read only the leaves the snapshot did not
/// share (fixed in check/walk.rs `record_shared_subtree`).
#[test]
fn crash_seed_16_snapshot_commit_keeps_the_snapshot_whole() {
    birch_sim::crash::run_seed(&birch_sim::crash::CrashConfig::ci(16))
        .unwrap_or_else(|e| panic!("{e}"));
}
