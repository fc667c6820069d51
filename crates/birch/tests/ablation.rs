//! The benchmark-only switches that restore what each seed removed
//! (docs/ABLATION.md): each takes its "before" path (a counter moves that
//! does not move with the switch off, so a switch that did nothing fails
//! its test), and each "before" path is crash-safe (the crash cases of
//! docs/ABLATION.md, one test each, named as there).

mod common;

use birch::device::{BlockDevice, RecordingDevice};
use birch::fs::{Ablation, Filesystem, MountOptions, RenameFlags};
use common::{assert_clean, ino, Enumeration, GatedDevice, View};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const IMAGE_BYTES: u64 = 32 << 20;

fn recorder() -> Arc<RecordingDevice> {
    common::recorder(IMAGE_BYTES, 9)
}

fn mount_with<D: BlockDevice + 'static>(dev: D, ablation: Ablation) -> Filesystem<D> {
    Filesystem::open(
        dev,
        MountOptions {
            ablation,
            ..MountOptions::deterministic()
        },
    )
    .unwrap()
}

fn for_every_crash_after(
    rec: &RecordingDevice,
    from: usize,
    property: impl Fn(&View) -> Result<(), String>,
) -> usize {
    common::for_every_crash_after(rec, from, &Enumeration::sampled(from as u64), property)
}

fn seed_000() -> Ablation {
    Ablation {
        sync_log_on_new_name: true,
        ..Ablation::default()
    }
}

fn seed_001() -> Ablation {
    Ablation {
        flush_delayed_inode_on_full_log: true,
        ..Ablation::default()
    }
}

fn seed_002() -> Ablation {
    Ablation {
        log_waits_for_commit: true,
        ..Ablation::default()
    }
}

fn seed_003() -> Ablation {
    Ablation {
        flush_delayed_dir_on_log: true,
        ..Ablation::default()
    }
}

fn seed_004() -> Ablation {
    Ablation {
        reclaim_whole_inodes: true,
        ..Ablation::default()
    }
}

#[test]
fn seed_ids_parse_and_unknown_ones_are_refused() {
    let mut a = Ablation::default();
    assert!(!a.any());
    a.enable("000+003").unwrap();
    assert_eq!(a.seeds(), ["000", "003"]);
    assert!(a.sync_log_on_new_name && a.flush_delayed_dir_on_log);
    a.enable("004").unwrap();
    assert_eq!(a.seeds(), ["000", "003", "004"]);
    let err = Ablation::default().enable("001+5").unwrap_err();
    assert!(
        err.contains("'5'") && err.contains("000, 001, 002, 003, 004"),
        "{err}"
    );
    assert_eq!(Ablation::all().seeds(), Ablation::SEEDS);
}

// ----- seed 000: a link or rename of a logged inode syncs the log -----

/// The log syncs and commits a rename and a link of a logged file cost.
fn new_name_syncs(ablation: Ablation) -> (u64, u64) {
    let fs = mount_with(common::memory_fs(IMAGE_BYTES, 9), ablation);
    let root = fs.root_ino();
    fs.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    fs.sync().unwrap();
    let f = fs.create(ino(&fs, "d"), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[1; 5000]).unwrap();
    fs.fsync(f, false).unwrap();
    let (syncs, commits) = (fs.log_stats().log_syncs, fs.stats().commits);
    let d = ino(&fs, "d");
    fs.rename(d, b"f", d, b"g", RenameFlags::default()).unwrap();
    fs.link(f, root, b"h").unwrap();
    // A file never logged: no sync either way.
    let other = fs.create(d, b"other", 0o644, 0, 0).unwrap().ino;
    fs.link(other, root, b"other2").unwrap();
    // An unlink of a logged inode's name syncs nothing, and leaves nothing
    // for the next rename to sync.
    fs.unlink(root, b"h").unwrap();
    fs.rename(root, b"other2", root, b"other3", RenameFlags::default())
        .unwrap();
    (
        fs.log_stats().log_syncs - syncs,
        fs.stats().commits - commits,
    )
}

#[test]
fn seed_000_switch_syncs_the_log_at_each_new_name_of_a_logged_inode() {
    assert_eq!(new_name_syncs(Ablation::default()), (0, 0));
    assert_eq!(new_name_syncs(seed_000()), (2, 0));
}

/// When the log cannot be synced as it is (here: a committed directory
/// was removed from a logged one, `force_commit`), the switch commits.
#[test]
fn seed_000_switch_commits_when_the_log_cannot_be_synced() {
    let fs = mount_with(common::memory_fs(IMAGE_BYTES, 9), seed_000());
    let root = fs.root_ino();
    fs.mkdir(root, b"p", 0o755, 0, 0).unwrap();
    let p = ino(&fs, "p");
    fs.mkdir(p, b"sub", 0o755, 0, 0).unwrap();
    fs.sync().unwrap();
    let f = fs.create(p, b"f", 0o644, 0, 0).unwrap().ino;
    fs.fsync(p, false).unwrap();
    fs.rmdir(p, b"sub").unwrap();
    let commits = fs.stats().commits;
    fs.rename(p, b"f", root, b"g", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.stats().commits, commits + 1);
    assert_eq!(fs.lookup(root, b"g").unwrap().ino, f);
}

/// `mkdir d; sync; create d/f; write d/f; fsync d/f; mv d/f d/g; <cut>`
/// with seed 000 switched off: the rename is durable once it returned (it
/// synced the log), and the file is whole under exactly one name before.
#[test]
fn rename_of_logged_file_is_durable_with_seed_000_off() {
    let rec = recorder();
    let fs = mount_with(rec.clone(), seed_000());
    fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap();
    fs.sync().unwrap();
    let d = ino(&fs, "d");
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[3; 7000]).unwrap();
    fs.fsync(f, false).unwrap();
    let fsynced = rec.flush_count();
    fs.rename(d, b"f", d, b"g", RenameFlags::default()).unwrap();
    let renamed = rec.flush_count();
    assert!(renamed > fsynced, "the rename wrote no log");
    std::mem::forget(fs);
    let want = vec![3u8; 7000];
    for_every_crash_after(&rec, fsynced, |v| match (v.get("/d/f"), v.get("/d/g")) {
        (Some(x), None) | (None, Some(x)) if *x == want => Ok(()),
        _ => Err("d/f or d/g: not exactly one, or not whole".into()),
    });
    let states = for_every_crash_after(&rec, renamed, |v| {
        if v.get("/d/g") == Some(&want) && !v.contains_key("/d/f") {
            Ok(())
        } else {
            Err("the rename was not durable once it returned".into())
        }
    });
    assert!(states >= 1);
}

// ----- seed 001: a full-sync fsync flushes the delayed inode -----

fn delayed_flushes_of_first_fsync(ablation: Ablation) -> u64 {
    let fs = mount_with(common::memory_fs(IMAGE_BYTES, 9), ablation);
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[9; 10_000]).unwrap();
    let flushes = fs.stats().delayed_item_flushes;
    fs.fsync(f, false).unwrap();
    assert_eq!(fs.log_stats().full_logs, 1);
    fs.stats().delayed_item_flushes - flushes
}

#[test]
fn seed_001_switch_flushes_the_delayed_inode_at_a_full_log() {
    assert_eq!(delayed_flushes_of_first_fsync(Ablation::default()), 0);
    assert_eq!(delayed_flushes_of_first_fsync(seed_001()), 1);
}

/// `create f; write f; fsync f; write f; truncate f; fsync f; <cut>` with
/// seed 001 switched off: every state after the second fsync shows f as
/// it was then (the second is a full log too: truncate sets full sync).
#[test]
fn full_fsync_after_delayed_inode_flush_survives() {
    let rec = recorder();
    let fs = mount_with(rec.clone(), seed_001());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[9; 10_000]).unwrap();
    fs.fsync(f, false).unwrap();
    fs.write_file(f, 10_000, &[8; 5000]).unwrap();
    fs.setattr(
        f,
        &birch::fs::SetAttr {
            size: Some(12_000),
            ..Default::default()
        },
    )
    .unwrap();
    let flushes = fs.stats().delayed_item_flushes;
    fs.fsync(f, false).unwrap();
    assert_eq!(fs.log_stats().full_logs, 2);
    assert_eq!(fs.stats().delayed_item_flushes, flushes + 1);
    let from = rec.flush_count();
    std::mem::forget(fs);
    let mut want = vec![9u8; 10_000];
    want.extend([8; 2000]);
    for_every_crash_after(&rec, from, |v| {
        if v.get("/f") == Some(&want) {
            Ok(())
        } else {
            Err("f wrong".into())
        }
    });
}

// ----- seed 002: an fsync waits for the whole commit in flight -----

/// `write a; commit (held in its node flush); create b; write b; fsync b;
/// <release>; <cut>` with seed 002 switched off: the fsync logs nothing
/// while the commit writes (no log node written, nothing logged), then
/// logs, and both files survive every crash state after it returned.
#[test]
fn fsync_waits_for_the_commit_with_seed_002_off() {
    let rec = recorder();
    let dev = Arc::new(GatedDevice::new(rec.clone()));
    let fs = Arc::new(mount_with(dev.clone(), seed_002()));
    let a = fs.create(fs.root_ino(), b"a", 0o644, 0, 0).unwrap().ino;
    fs.write_file(a, 0, &[1; 9000]).unwrap();
    dev.armed.store(true, Ordering::SeqCst);
    let committer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.commit().unwrap())
    };
    while !*dev.held.lock().unwrap() {
        std::thread::yield_now();
    }
    let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
    fs.write_file(b, 0, &[2; 5000]).unwrap();
    let syncer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.fsync(b, false).unwrap())
    };
    // Give the fsync time to log if it were going to (with the switch
    // off it does at once: `commit_during_log_write`); a slow machine
    // only makes this check weaker, never wrong.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!syncer.is_finished());
    assert_eq!(
        fs.log_stats().logged_fsyncs,
        0,
        "the fsync logged while the commit was writing"
    );
    *dev.held.lock().unwrap() = false;
    dev.released.notify_all();
    committer.join().unwrap();
    syncer.join().unwrap();
    assert_eq!(dev.log_node_writes_while_held.load(Ordering::SeqCst), 0);
    let stats = fs.log_stats();
    assert_eq!((stats.logged_fsyncs, stats.log_syncs), (1, 1));
    assert!(stats.log_base_wait_nanos > 0);
    let from = rec.flush_count();
    std::mem::forget(fs);
    for_every_crash_after(&rec, from, |v| {
        if v.get("/b").map(Vec::len) == Some(5000) && v.get("/a").map(Vec::len) == Some(9000) {
            Ok(())
        } else {
            Err("a or b lost".into())
        }
    });
}

// ----- seed 003: a directory fsync flushes its delayed items -----

/// Delayed-item flushes of three directory fsyncs, each after ten new
/// entries (seed 003's example), and the fsync's view of the entries.
fn delayed_flushes_of_dir_fsyncs(ablation: Ablation) -> u64 {
    let fs = mount_with(common::memory_fs(IMAGE_BYTES, 9), ablation);
    fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap();
    fs.sync().unwrap();
    let d = ino(&fs, "d");
    let flushes = fs.stats().delayed_item_flushes;
    for round in 0..3 {
        for i in 0..10 {
            fs.create(d, format!("f{round}_{i}").as_bytes(), 0o644, 0, 0)
                .unwrap();
        }
        fs.fsync(d, false).unwrap();
    }
    assert_eq!(fs.log_stats().dir_logs, 3);
    fs.stats().delayed_item_flushes - flushes
}

#[test]
fn seed_003_switch_flushes_the_directory_before_logging_it() {
    assert_eq!(delayed_flushes_of_dir_fsyncs(Ablation::default()), 0);
    assert_eq!(delayed_flushes_of_dir_fsyncs(seed_003()), 3);
}

/// `mkdir d; create d/a..d/e; sync; create d/n1..d/n5; fsync d; mv d/a
/// d/a2; rm d/b; fsync d; <cut>` with seed 003 switched off (entries
/// logged from the fs tree after a flush): every state after the second
/// fsync shows exactly d's entries then.
#[test]
fn dir_fsync_from_flushed_tree_survives() {
    let rec = recorder();
    let fs = mount_with(rec.clone(), seed_003());
    fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap();
    let d = ino(&fs, "d");
    for name in ["a", "b", "c", "e"] {
        fs.create(d, name.as_bytes(), 0o644, 0, 0).unwrap();
    }
    fs.sync().unwrap();
    for i in 1..=5 {
        fs.create(d, format!("n{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
    }
    fs.fsync(d, false).unwrap();
    fs.rename(d, b"a", d, b"a2", RenameFlags::default())
        .unwrap();
    fs.unlink(d, b"b").unwrap();
    fs.fsync(d, false).unwrap();
    let from = rec.flush_count();
    let want: Vec<String> = {
        let mut names: Vec<String> = ["a2", "c", "e", "n1", "n2", "n3", "n4", "n5"]
            .iter()
            .map(|n| format!("/d/{n}"))
            .collect();
        names.sort();
        names
    };
    std::mem::forget(fs);
    for_every_crash_after(&rec, from, |v| {
        let names: Vec<String> = v.keys().filter(|k| k.starts_with("/d/")).cloned().collect();
        if names == want {
            Ok(())
        } else {
            Err(format!("d holds {names:?}"))
        }
    });
}

// ----- seed 004: reclaim writes back whole inodes -----

/// The largest reclaim request (pages) when writers overrun the space
/// with 64 older files of 128 dirty pages each waiting; checks the image
/// and the files afterwards.
fn largest_reclaim_request(ablation: Ablation) -> u64 {
    const FILE_BYTES: usize = 512 * 1024;
    let dev = common::memory_fs(48 << 20, 9);
    let fs = mount_with(dev.clone(), ablation);
    let root = fs.root_ino();
    let mut old = Vec::new();
    for i in 0..64u64 {
        let f = fs
            .create(root, format!("old{i}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        fs.write_file(f, 0, &vec![i as u8; FILE_BYTES]).unwrap();
        old.push(f);
    }
    let mut n = 0u64;
    while fs.space_stats().reclaim_requests == 0 {
        let f = fs
            .create(root, format!("w{n}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        fs.write_file(f, 0, &[7; 256 * 1024]).unwrap();
        n += 1;
        assert!(n < 1000, "no reclaim happened");
    }
    let largest = fs.space_stats().reclaim_pages_max;
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after reclaim");
    let fs = mount_with(dev, Ablation::default());
    for (i, &f) in old.iter().enumerate() {
        assert_eq!(
            fs.read_file(f, 0, FILE_BYTES).unwrap(),
            vec![i as u8; FILE_BYTES]
        );
    }
    largest
}

#[test]
fn seed_004_switch_reclaims_whole_inodes() {
    let pages = largest_reclaim_request(Ablation::default());
    let whole = largest_reclaim_request(seed_004());
    eprintln!("largest reclaim request: {pages} pages; with whole inodes {whole}");
    // Whole inodes: at least as many inodes as the page budget (16 or
    // more), each 128 pages.
    assert!(whole >= 16 * 128, "{whole} pages");
    assert!(pages < whole, "{pages} pages page-bounded, {whole} whole");
}
