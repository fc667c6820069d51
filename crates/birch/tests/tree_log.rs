//! The tree-log's crash cases (docs/TREE-LOG.md), one test each, and the
//! seeds' behaviours checked through counters. Crash states are enumerated
//! from the moment an fsync returned: every flush point after it, with
//! every subset (or a seeded sample) of the writes pending there.

mod common;

use birch::device::{BlockDevice, RecordingDevice};
use birch::format::FileType;
use birch::fs::{RenameFlags, WhiteoutOwner};
use common::{ino, mount, Enumeration, GatedDevice, View};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::sync::Arc;

const IMAGE_BYTES: u64 = 32 << 20;

fn recorder() -> Arc<RecordingDevice> {
    common::recorder(IMAGE_BYTES, 5)
}

/// Asserts `property` of every crash state from flush `from` on: every
/// subset of up to 8 pending writes, else a sample seeded by `from`.
fn for_every_crash_after(
    rec: &RecordingDevice,
    from: usize,
    property: impl Fn(&View) -> Result<(), String>,
) -> usize {
    common::for_every_crash_after(rec, from, &Enumeration::sampled(from as u64), property)
}

#[test]
fn fsync_file_survives() {
    let rec = recorder();
    let fs = mount(rec.clone());
    fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap();
    fs.sync().unwrap();
    let f = fs.create(ino(&fs, "d"), b"f", 0o644, 0, 0).unwrap().ino;
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();
    fs.write_file(f, 0, &data).unwrap();
    let commits = fs.stats().commits;
    fs.fsync(f, false).unwrap();
    assert_eq!(fs.stats().commits, commits, "fsync must not commit");
    assert_eq!(fs.log_stats().log_syncs, 1);
    let synced = rec.flush_count();
    // Later, unsynced changes must not disturb what the fsync promised.
    fs.create(fs.root_ino(), b"later", 0o644, 0, 0).unwrap();
    std::mem::forget(fs);
    let states = for_every_crash_after(&rec, synced, |v| {
        if v.get("/d/f") == Some(&data) {
            Ok(())
        } else {
            Err("d/f missing or wrong".into())
        }
    });
    assert!(states >= 1);
}

#[test]
fn fsync_dir_persists_new_entries() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    fs.create(d, b"a", 0o644, 0, 0).unwrap();
    fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap();
    let flushes = fs.stats().delayed_item_flushes;
    fs.fsync(d, false).unwrap();
    assert_eq!(
        fs.stats().delayed_item_flushes,
        flushes,
        "seed 003: a directory fsync flushes no delayed items"
    );
    assert_eq!(fs.stats().commits, 0);
    let synced = rec.flush_count();
    std::mem::forget(fs);
    for_every_crash_after(&rec, synced, |v| {
        for p in ["/d", "/d/a", "/d/sub"] {
            if !v.contains_key(p) {
                return Err(format!("{p} missing"));
            }
        }
        Ok(())
    });
}

#[test]
fn symlink_in_logged_dir_keeps_its_target() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let a = fs.create(d, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write_file(a, 0, b"first").unwrap();
    fs.fsync(d, false).unwrap();
    // d is logged in this transaction, so the new name is logged at once,
    // before the symlink's target is written.
    fs.symlink(d, b"l", b"a", 0, 0).unwrap();
    fs.write_file(a, 0, b"second").unwrap();
    fs.fsync(a, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    for_every_crash_after(&rec, synced, |v| match v.get("/d/l") {
        Some(link) if link.as_slice() == b"-> a" => Ok(()),
        Some(link) => Err(format!("d/l reads {:?}", String::from_utf8_lossy(link))),
        None => Err("d/l missing: it was in the synced log".into()),
    });
}

#[test]
fn rename_of_logged_file_is_atomic() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let a = fs.create(fs.root_ino(), b"a", 0o644, 0, 0).unwrap().ino;
    fs.write_file(a, 0, b"payload").unwrap();
    fs.sync().unwrap();
    fs.fsync(a, false).unwrap();
    let from = rec.flush_count();
    let syncs = fs.log_stats().log_syncs;
    fs.rename(
        fs.root_ino(),
        b"a",
        fs.root_ino(),
        b"b",
        RenameFlags::default(),
    )
    .unwrap();
    assert_eq!(
        fs.log_stats().log_syncs,
        syncs,
        "seed 000: rename logs the new name without a log sync"
    );
    let c = fs.create(fs.root_ino(), b"c", 0o644, 0, 0).unwrap().ino;
    fs.fsync(c, false).unwrap();
    std::mem::forget(fs);
    for_every_crash_after(&rec, from, |v| match (v.get("/a"), v.get("/b")) {
        (Some(x), None) | (None, Some(x)) if x == b"payload" => Ok(()),
        (a, b) => Err(format!("a={a:?} b={b:?}: need exactly one with the data")),
    });
}

/// fstests generic/498.
#[test]
fn link_of_logged_file_then_fsync_parent() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let a = fs.mkdir(root, b"A", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(root, b"B", 0o755, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let foo = fs.create(b, b"foo", 0o644, 0, 0).unwrap().ino;
    fs.fsync(foo, false).unwrap();
    let c = fs.mkdir(a, b"C", 0o755, 0, 0).unwrap().ino;
    let syncs = fs.log_stats().log_syncs;
    fs.link(foo, c, b"foo").unwrap();
    assert_eq!(
        fs.log_stats().log_syncs,
        syncs,
        "seed 000: link logs the new name without a log sync"
    );
    fs.fsync(a, false).unwrap();
    assert_eq!(
        fs.log_stats().log_syncs,
        syncs + 1,
        "fsync of the parent is not skipped: ancestors were not marked logged"
    );
    assert_eq!(fs.stats().commits, 1);
    let from = rec.flush_count();
    std::mem::forget(fs);
    for_every_crash_after(&rec, from, |v| {
        for p in ["/A/C", "/A/C/foo", "/B/foo"] {
            if !v.contains_key(p) {
                return Err(format!("{p} missing"));
            }
        }
        Ok(())
    });
}

#[test]
fn rename_out_of_logged_dir() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let e = fs.mkdir(root, b"e", 0o755, 0, 0).unwrap().ino;
    let x = fs.create(d, b"x", 0o644, 0, 0).unwrap().ino;
    fs.write_file(x, 0, b"xdata").unwrap();
    fs.sync().unwrap();
    fs.create(d, b"y", 0o644, 0, 0).unwrap();
    fs.fsync(d, false).unwrap();
    let from = rec.flush_count();
    fs.rename(d, b"x", e, b"x", RenameFlags::default()).unwrap();
    fs.fsync(d, false).unwrap();
    std::mem::forget(fs);
    for_every_crash_after(&rec, from, |v| match (v.get("/d/x"), v.get("/e/x")) {
        (Some(_), None) | (None, Some(_)) => Ok(()),
        (a, b) => Err(format!("d/x={a:?} e/x={b:?}: x must be in exactly one")),
    });
}

#[test]
fn log_then_commit_then_log() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, b"one").unwrap();
    fs.fsync(f, false).unwrap();
    fs.sync().unwrap();
    fs.truncate(f, 0).unwrap();
    fs.write_file(f, 0, b"two!").unwrap();
    fs.fsync(f, false).unwrap();
    let from = rec.flush_count();
    let g = fs.create(fs.root_ino(), b"g", 0o644, 0, 0).unwrap().ino;
    fs.write_file(g, 0, b"gee").unwrap();
    fs.fsync(g, false).unwrap();
    std::mem::forget(fs);
    for_every_crash_after(&rec, from, |v| {
        if v.get("/f").map(Vec::as_slice) == Some(b"two!") {
            Ok(())
        } else {
            Err(format!("f = {:?}", v.get("/f")))
        }
    });
}

/// Crash case (fstests generic/547): an fsynced directory keeps the times
/// it had at its fsync through replay. Three ways its names reach the log:
/// its own entries (`mkdir d; create d/a; fsync d`), a file's names
/// (`mkdir d; create d/f; fsync d/f; fsync d`), and a removal (`create
/// d/x; sync; mv d/x y; fsync d`). Replay adds and removes those names
/// again; doing so must not stamp the directory with the replay's time.
#[test]
fn replay_keeps_logged_directory_times() {
    type Scenario = fn(&birch::fs::Filesystem<Arc<RecordingDevice>>) -> u64;
    let scenarios: [(&str, Scenario); 3] = [
        ("entries", |fs| {
            let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
            fs.create(d, b"a", 0o644, 0, 0).unwrap();
            fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap();
            d
        }),
        ("file names", |fs| {
            let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
            let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
            fs.fsync(f, false).unwrap();
            d
        }),
        ("removal", |fs| {
            let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
            fs.create(d, b"x", 0o644, 0, 0).unwrap();
            fs.sync().unwrap();
            let root = fs.root_ino();
            fs.rename(d, b"x", root, b"y", RenameFlags::default())
                .unwrap();
            d
        }),
    ];
    for (what, scenario) in scenarios {
        let rec = recorder();
        let fs = mount(rec.clone());
        fs.sync().unwrap();
        let d = scenario(&fs);
        let want = fs.getattr(d).unwrap();
        fs.fsync(d, false).unwrap();
        let synced = rec.flush_count();
        std::mem::forget(fs);
        let points = common::crash_points(&rec, synced, &Enumeration::sampled(synced as u64));
        for point in &points {
            common::crash_mount(&rec, point, |fs| {
                let got = fs.getattr(ino(fs, "d")).unwrap();
                assert_eq!(
                    (got.mtime, got.ctime),
                    (want.mtime, want.ctime),
                    "{what}: {point:?}"
                );
            });
        }
        assert!(!points.is_empty(), "{what}");
    }
}

#[test]
fn fsync_of_unchanged_inode_does_nothing() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let flushes = rec.flush_count();
    fs.fsync(f, false).unwrap();
    assert_eq!(
        rec.flush_count(),
        flushes,
        "a committed, unchanged inode needs no I/O"
    );
    fs.write_file(f, 0, b"x").unwrap();
    fs.fsync(f, false).unwrap();
    let after_first = rec.flush_count();
    fs.fsync(f, false).unwrap();
    assert_eq!(
        rec.flush_count(),
        after_first,
        "logged and unchanged since: no second log sync"
    );
    drop(fs);
}

/// Seed 001: logging a file in full never writes its delayed inode into the
/// fs tree.
#[test]
fn full_sync_logs_from_the_in_memory_inode() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[9; 10_000]).unwrap();
    let flushes = fs.stats().delayed_item_flushes;
    fs.fsync(f, false).unwrap();
    assert_eq!(
        fs.stats().delayed_item_flushes,
        flushes,
        "the delayed inode was flushed for logging"
    );
    assert_eq!(fs.log_stats().full_logs, 1);
    fs.write_file(f, 10_000, &[8; 5000]).unwrap();
    fs.fsync(f, false).unwrap();
    assert_eq!(
        fs.log_stats().fast_logs,
        1,
        "a second fsync logs only what changed"
    );
    let from = rec.flush_count();
    std::mem::forget(fs);
    let mut want = vec![9u8; 10_000];
    want.extend([8; 5000]);
    for_every_crash_after(&rec, from, |v| {
        if v.get("/f") == Some(&want) {
            Ok(())
        } else {
            Err("f wrong".into())
        }
    });
}

/// Many fsyncs of one file, and of several files, interleaved with writes,
/// truncates, renames and commits; every crash point is checked against
/// the last fsynced content of each file.
#[test]
fn repeated_fsyncs_keep_the_latest_synced_content() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut synced: BTreeMap<String, (usize, Vec<u8>)> = BTreeMap::new();
    let mut contents: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for step in 0..60 {
        let name = format!("f{}", rng.gen_range(0..4));
        let i = match fs.lookup(root, name.as_bytes()) {
            Ok(a) => a.ino,
            Err(_) => fs.create(root, name.as_bytes(), 0o644, 0, 0).unwrap().ino,
        };
        let content = contents.entry(name.clone()).or_default();
        match rng.gen_range(0..10) {
            0 => {
                let len = rng.gen_range(0..content.len() + 1);
                fs.truncate(i, len as u64).unwrap();
                content.truncate(len);
            }
            1 if step % 7 == 0 => fs.sync().unwrap(),
            _ => {
                let off = rng.gen_range(0..12_000usize);
                let bytes: Vec<u8> = (0..rng.gen_range(1..6000)).map(|_| rng.gen()).collect();
                fs.write_file(i, off as u64, &bytes).unwrap();
                if content.len() < off + bytes.len() {
                    content.resize(off + bytes.len(), 0);
                }
                content[off..off + bytes.len()].copy_from_slice(&bytes);
            }
        }
        if rng.gen_bool(0.4) {
            fs.fsync(i, false).unwrap();
            synced.insert(name.clone(), (rec.flush_count(), content.clone()));
        }
    }
    std::mem::forget(fs);
    // From the last fsync on, every file holds at least its last synced
    // content (a later commit may have made newer content durable too).
    let from = synced.values().map(|(f, _)| *f).max().unwrap();
    for_every_crash_after(&rec, from, |v| {
        for (name, (_, want)) in &synced {
            let got = v
                .get(&format!("/{name}"))
                .ok_or(format!("{name} missing"))?;
            if got != want && got != &contents[name] {
                return Err(format!(
                    "{name}: {} bytes, neither the synced ({}) nor the latest content",
                    got.len(),
                    want.len()
                ));
            }
        }
        Ok(())
    });
}

/// The `removed-directory` fallback (docs/TREE-LOG.md).
#[test]
fn removed_directory_falls_back_to_commit() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let p = fs.mkdir(fs.root_ino(), b"p", 0o755, 0, 0).unwrap().ino;
    let d = fs.mkdir(p, b"d", 0o755, 0, 0).unwrap().ino;
    let keep = fs.create(d, b"keep", 0o644, 0, 0).unwrap().ino;
    fs.create(d, b"x", 0o644, 0, 0).unwrap();
    fs.sync().unwrap();
    fs.create(p, b"new", 0o644, 0, 0).unwrap();
    fs.fsync(p, false).unwrap();
    fs.rename(d, b"keep", fs.root_ino(), b"kept", RenameFlags::default())
        .unwrap();
    fs.unlink(d, b"x").unwrap();
    fs.rmdir(p, b"d").unwrap();
    let commits = fs.stats().commits;
    fs.fsync(p, false).unwrap();
    assert_eq!(
        fs.stats().commits,
        commits + 1,
        "removing a committed directory from a logged one commits"
    );
    assert_eq!(fs.log_stats().fallback_removed_directory, 1);
    let _ = keep;
    let from = rec.flush_count();
    std::mem::forget(fs);
    for_every_crash_after(&rec, from, |v| {
        if v.contains_key("/p/d") || !v.contains_key("/kept") || !v.contains_key("/p/new") {
            return Err("expected p/new and kept, and no p/d".into());
        }
        Ok(())
    });
}

/// Seed 002: a commit writing its nodes does not block fsync. The device
/// holds the commit's first flush; meanwhile an fsync in the next
/// transaction creates, fills and writes its log (its own flush goes
/// through). Its superblock waits for the commit's, and no superblock ever
/// points at a log based on an older commit than the one before it.
#[test]
fn commit_during_log_write() {
    use std::sync::atomic::Ordering;
    let rec = recorder();
    let dev = Arc::new(GatedDevice::new(rec.clone()));
    let fs = Arc::new(mount(dev.clone()));
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
    // The commit is stuck in its node flush; transaction T+1 is running.
    let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
    fs.write_file(b, 0, &[2; 5000]).unwrap();
    let syncer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.fsync(b, false).unwrap())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while dev.log_node_writes_while_held.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the fsync's log write did not proceed while the commit was writing"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        !syncer.is_finished(),
        "the fsync returned before the commit it depends on was durable"
    );
    *dev.held.lock().unwrap() = false;
    dev.released.notify_all();
    committer.join().unwrap();
    syncer.join().unwrap();
    assert_eq!(fs.log_stats().log_syncs, 1);
    // Every superblock that points at a log carries the generation of the
    // newest commit superblock written before it.
    let mut newest_commit = 0;
    for event in rec.events() {
        if let birch::device::DeviceEvent::Write { offset, bytes } = event {
            if offset == birch::format::SUPERBLOCK_OFFSETS[0] {
                let sb = birch::format::Superblock::decode(
                    &bytes[..birch::format::SUPERBLOCK_SIZE],
                    offset,
                )
                .unwrap();
                if sb.log_root_bytenr == 0 {
                    newest_commit = newest_commit.max(sb.generation);
                } else {
                    assert_eq!(
                        sb.generation, newest_commit,
                        "a log superblock based on an older commit"
                    );
                }
            }
        }
    }
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

// ----- name conflicts and new subdirectories (docs/TREE-LOG.md, "The
// contract"). Each starts from a commit; crash states are taken from that
// commit on: before the fsync returned, everything committed must still be
// reachable (nothing durable is ever lost); after, what the fsync promised.

/// Whether some path of the view holds exactly `data`.
fn reachable(v: &common::View, data: &[u8]) -> bool {
    v.values().any(|d| d.as_slice() == data)
}

fn require_reachable(v: &common::View, what: &[(&str, &[u8])]) -> Result<(), String> {
    for (name, data) in what {
        if !reachable(v, data) {
            return Err(format!("durable {name} is gone"));
        }
    }
    Ok(())
}

fn nlink_at<D: BlockDevice + 'static>(fs: &birch::fs::Filesystem<D>, path: &str) -> u32 {
    fs.getattr(ino(fs, path)).unwrap().nlink
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ salt)
        .collect()
}

/// `mkdir a; write a/foo (16 KiB); sync; mv a/foo a/bar; write a/foo
/// (other data); fsync a/foo; <cut>` → `a/bar` keeps the old data, `a/foo`
/// has the new. Replay gives the new inode the name `foo`, which the old
/// one held in the commit: the old one's new name must be logged too.
#[test]
fn rename_away_then_reuse_name() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let a = fs.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino;
    let old = pattern(16 << 10, 1);
    let foo = fs.create(a, b"foo", 0o644, 0, 0).unwrap().ino;
    fs.write_file(foo, 0, &old).unwrap();
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.rename(a, b"foo", a, b"bar", RenameFlags::default())
        .unwrap();
    let new = pattern(5000, 2);
    let foo2 = fs.create(a, b"foo", 0o644, 0, 0).unwrap().ino;
    fs.write_file(foo2, 0, &new).unwrap();
    fs.fsync(foo2, false).unwrap();
    assert_eq!(fs.stats().commits, 1, "answered by the log");
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(7), |p, _, v| {
        require_reachable(v, &[("a/foo's 16 KiB", &old)])?;
        if p.flushes_completed >= synced {
            common::require_content(v, "/a/bar", &old)?;
            common::require_content(v, "/a/foo", &new)?;
        }
        Ok(())
    });
}

/// `mkdir -p a/x; touch a/x/p a/x/q; sync; mv a/x a/y; mkdir a/x; fsync
/// a/x; <cut>` → mounts, with `a/y/p`, `a/y/q` and an empty `a/x`.
#[test]
fn rename_dir_away_then_mkdir_same_name() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let a = fs.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino;
    let x = fs.mkdir(a, b"x", 0o755, 0, 0).unwrap().ino;
    let (p_data, q_data) = (pattern(3000, 3), pattern(100, 4));
    for (name, data) in [(b"p", &p_data), (b"q", &q_data)] {
        let f = fs.create(x, name, 0o644, 0, 0).unwrap().ino;
        fs.write_file(f, 0, data).unwrap();
    }
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.rename(a, b"x", a, b"y", RenameFlags::default()).unwrap();
    let x2 = fs.mkdir(a, b"x", 0o755, 0, 0).unwrap().ino;
    fs.fsync(x2, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(8), |p, _, v| {
        require_reachable(v, &[("a/x/p", &p_data), ("a/x/q", &q_data)])?;
        if p.flushes_completed >= synced {
            common::require_content(v, "/a/y/p", &p_data)?;
            common::require_content(v, "/a/y/q", &q_data)?;
            common::require_content(v, "/a/x", b"<dir>")?;
            if v.keys().any(|k| k.starts_with("/a/x/")) {
                return Err("the new a/x is not empty".into());
            }
        }
        Ok(())
    });
}

/// `touch t/f1 t/f2 (foo, hello); sync; mv t/f1 t/f3; mv t/f2 t/f4; ln
/// t/f3 t/f2; touch t/f1; fsync t/f1; <cut>` → f1 new; f2 and f3 one inode
/// holding "foo"; f4 "hello". Each name the logged inode took brings the
/// inode that held it, and so on through the chain.
#[test]
fn swap_names_through_links() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let t = fs.mkdir(fs.root_ino(), b"t", 0o755, 0, 0).unwrap().ino;
    for (name, data) in [(b"f1", b"foo".as_slice()), (b"f2", b"hello")] {
        let f = fs.create(t, name, 0o644, 0, 0).unwrap().ino;
        fs.write_file(f, 0, data).unwrap();
    }
    fs.sync().unwrap();
    let start = rec.flush_count();
    let plain = RenameFlags::default();
    fs.rename(t, b"f1", t, b"f3", plain).unwrap();
    fs.rename(t, b"f2", t, b"f4", plain).unwrap();
    fs.link(ino(&fs, "t/f3"), t, b"f2").unwrap();
    let f1 = fs.create(t, b"f1", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f1, 0, b"new").unwrap();
    fs.fsync(f1, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(9), |p, fs, v| {
        require_reachable(v, &[("t/f1", b"foo"), ("t/f2", b"hello")])?;
        if p.flushes_completed >= synced {
            common::require_content(v, "/t/f1", b"new")?;
            common::require_content(v, "/t/f2", b"foo")?;
            common::require_content(v, "/t/f3", b"foo")?;
            common::require_content(v, "/t/f4", b"hello")?;
            if ino(fs, "t/f2") != ino(fs, "t/f3") || nlink_at(fs, "t/f3") != 2 {
                return Err("f2 and f3 are not one inode with two links".into());
            }
        }
        Ok(())
    });
}

/// `touch t/foo; ln t/foo t/bar; sync; mv t/foo t/qwerty; mv t/bar t/foo;
/// touch t/bar; fsync t/bar; <cut>` → qwerty and foo (one inode, the
/// data), bar new.
#[test]
fn rename_chain_over_hard_link() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let t = fs.mkdir(fs.root_ino(), b"t", 0o755, 0, 0).unwrap().ino;
    let data = pattern(9000, 5);
    let foo = fs.create(t, b"foo", 0o644, 0, 0).unwrap().ino;
    fs.write_file(foo, 0, &data).unwrap();
    fs.link(foo, t, b"bar").unwrap();
    fs.sync().unwrap();
    let start = rec.flush_count();
    let plain = RenameFlags::default();
    fs.rename(t, b"foo", t, b"qwerty", plain).unwrap();
    fs.rename(t, b"bar", t, b"foo", plain).unwrap();
    let bar = fs.create(t, b"bar", 0o644, 0, 0).unwrap().ino;
    fs.fsync(bar, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(10), |p, fs, v| {
        require_reachable(v, &[("t/foo", &data)])?;
        if p.flushes_completed >= synced {
            common::require_content(v, "/t/qwerty", &data)?;
            common::require_content(v, "/t/foo", &data)?;
            common::require_content(v, "/t/bar", b"")?;
            if nlink_at(fs, "t/qwerty") != 2 {
                return Err("qwerty and foo are not one inode with two links".into());
            }
        }
        Ok(())
    });
}

/// `touch dir/foo; sync; mv dir/foo dir/bar; touch dir/foo; fsync
/// dir/bar; <cut>` → bar (the data) and the new, empty foo: the inode that
/// now holds the name the logged one gave up is logged too.
#[test]
fn fsync_renamed_keeps_new_owner_of_old_name() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let dir = fs.mkdir(fs.root_ino(), b"dir", 0o755, 0, 0).unwrap().ino;
    let data = pattern(4096, 6);
    let foo = fs.create(dir, b"foo", 0o644, 0, 0).unwrap().ino;
    fs.write_file(foo, 0, &data).unwrap();
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.rename(dir, b"foo", dir, b"bar", RenameFlags::default())
        .unwrap();
    fs.create(dir, b"foo", 0o644, 0, 0).unwrap();
    fs.fsync(foo, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(11), |p, _, v| {
        require_reachable(v, &[("dir/foo", &data)])?;
        if p.flushes_completed >= synced {
            common::require_content(v, "/dir/bar", &data)?;
            common::require_content(v, "/dir/foo", b"")?;
        }
        Ok(())
    });
}

/// `write foo (8 KiB); mkdir d; sync; ln foo d/l1; ln foo d/l2; mkdir -p
/// d/x/y/z; ln foo d/x/y/l3; ln foo d/x/y/z/l4; touch d/x/y/z/qwerty;
/// fsync d; <cut>` → the whole new subtree, and foo with 5 links.
#[test]
fn dir_fsync_logs_new_subdirectory_tree() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let data = pattern(8192, 7);
    let foo = fs.create(root, b"foo", 0o644, 0, 0).unwrap().ino;
    fs.write_file(foo, 0, &data).unwrap();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.link(foo, d, b"l1").unwrap();
    fs.link(foo, d, b"l2").unwrap();
    let x = fs.mkdir(d, b"x", 0o755, 0, 0).unwrap().ino;
    let y = fs.mkdir(x, b"y", 0o755, 0, 0).unwrap().ino;
    let z = fs.mkdir(y, b"z", 0o755, 0, 0).unwrap().ino;
    fs.link(foo, y, b"l3").unwrap();
    fs.link(foo, z, b"l4").unwrap();
    fs.create(z, b"qwerty", 0o644, 0, 0).unwrap();
    fs.fsync(d, false).unwrap();
    assert_eq!(fs.stats().commits, 1, "answered by the log");
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(12), |p, fs, v| {
        common::require_content(v, "/foo", &data)?;
        if p.flushes_completed >= synced {
            for path in ["/d/l1", "/d/l2", "/d/x/y/l3", "/d/x/y/z/l4"] {
                common::require_content(v, path, &data)?;
            }
            common::require_content(v, "/d/x/y/z/qwerty", b"")?;
            let links = nlink_at(fs, "foo");
            if links != 5 {
                return Err(format!("foo has {links} links, not 5"));
            }
        }
        Ok(())
    });
}

/// `touch kept; sync; touch g; fsync g; <damage the log>; mount` → the
/// mount succeeds with the last commit (`kept`, no `g`), says it threw the
/// log away, and leaves a clean image without a log. Replay is total: a
/// log it cannot apply never keeps a filesystem from mounting.
#[test]
fn unreplayable_log_is_discarded_and_last_commit_mounts() {
    // Without data checksums the log is written with two flushes and has
    // no manifest, so damage to it is damage, not an incomplete sync (that
    // case: tests/log_flush.rs).
    let dev = Arc::new(birch::device::MemoryDevice::new(IMAGE_BYTES));
    birch::fs::Filesystem::mkfs(
        dev.as_ref(),
        &birch::fs::MkfsOptions {
            fsid: Some([5; 16]),
            data_checksums: birch::fs::DataChecksums::Off,
            ..Default::default()
        },
    )
    .unwrap();
    let fs = mount(dev.clone());
    fs.create(fs.root_ino(), b"kept", 0o644, 0, 0).unwrap();
    fs.sync().unwrap();
    let g = fs.create(fs.root_ino(), b"g", 0o644, 0, 0).unwrap().ino;
    fs.fsync(g, false).unwrap();
    std::mem::forget(fs);
    let sb = birch::fs::read_superblock(dev.as_ref()).unwrap();
    assert_ne!(sb.log_root_bytenr, 0, "the fsync wrote a log");
    // Garbage over the log root tree's node (both copies under DUP
    // metadata, or read repair would serve the good one): its checksum
    // fails.
    let copies = std::iter::once(sb.log_root_bytenr)
        .chain(sb.metadata_profile.mirror_of(sb.log_root_bytenr));
    for copy in copies {
        dev.write_at(&[0x5a; 64], copy + 100).unwrap();
    }
    let fs = mount(dev.clone());
    match fs.replay_outcome() {
        Some(birch::fs::ReplayOutcome::Discarded(why)) => {
            assert!(why.contains("checksum"), "reason names the damage: {why}")
        }
        other => panic!("expected the log to be discarded, got {other:?}"),
    }
    let v = common::view(&fs);
    assert!(v.contains_key("/kept") && !v.contains_key("/g"), "{v:?}");
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the mount that discarded the log");
    assert_eq!(
        birch::fs::read_superblock(dev.as_ref())
            .unwrap()
            .log_root_bytenr,
        0,
        "the mount's commit supersedes the discarded log"
    );
}

/// `write t/a t/b; sync; mv --exchange t/a t/b; fsync t/a; <cut>` → each
/// name holds the other's old data: the fsynced inode took a committed name
/// of the other, so the other's names are logged too.
#[test]
fn rename_exchange_then_fsync() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let t = fs.mkdir(fs.root_ino(), b"t", 0o755, 0, 0).unwrap().ino;
    let (first, second) = (pattern(4000, 18), pattern(7000, 19));
    for (name, data) in [(b"a", &first), (b"b", &second)] {
        let f = fs.create(t, name, 0o644, 0, 0).unwrap().ino;
        fs.write_file(f, 0, data).unwrap();
    }
    fs.sync().unwrap();
    let start = rec.flush_count();
    let exchange = RenameFlags {
        exchange: true,
        ..RenameFlags::default()
    };
    fs.rename(t, b"a", t, b"b", exchange).unwrap();
    fs.fsync(ino(&fs, "t/a"), false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(13), |p, _, v| {
        require_reachable(v, &[("t/a", &first), ("t/b", &second)])?;
        if p.flushes_completed >= synced {
            common::require_content(v, "/t/a", &second)?;
            common::require_content(v, "/t/b", &first)?;
        }
        Ok(())
    });
}

/// `write dir/a dir/b; sync; mv dir/a dir/b; fsync dir/b; <cut>` → only
/// `b`, with a's data; the replaced inode is freed (`birch check` finds no
/// leftover).
#[test]
fn rename_over_existing_then_fsync() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let dir = fs.mkdir(fs.root_ino(), b"dir", 0o755, 0, 0).unwrap().ino;
    let (source, replaced) = (pattern(9000, 15), pattern(11_000, 16));
    for (name, data) in [(b"a", &source), (b"b", &replaced)] {
        let f = fs.create(dir, name, 0o644, 0, 0).unwrap().ino;
        fs.write_file(f, 0, data).unwrap();
    }
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.rename(dir, b"a", dir, b"b", RenameFlags::default())
        .unwrap();
    fs.fsync(ino(&fs, "dir/b"), false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(14), |p, _, v| {
        require_reachable(v, &[("dir/a", &source)])?;
        if p.flushes_completed >= synced {
            common::require_content(v, "/dir/b", &source)?;
            if v.contains_key("/dir/a") {
                return Err("dir/a is back".into());
            }
        }
        Ok(())
    });
}

/// `write f; mkdir d; sync; ln f d/link_0 .. d/link_2999; fsync f; <cut>`
/// → every name, and 3001 links. Past the first ~800 names in `d` the
/// names live in extended refs (INODE_EXTREF), which the log copies with
/// the INODE_REF items; removing them afterwards leaves a clean tree.
#[test]
fn many_links_in_one_directory_survive_fsync() {
    const LINKS: usize = 3000;
    let rec = recorder();
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let data = pattern(3000, 21);
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &data).unwrap();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let start = rec.flush_count();
    for i in 0..LINKS {
        fs.link(f, d, format!("link_{i}").as_bytes()).unwrap();
    }
    fs.fsync(f, false).unwrap();
    let synced = rec.flush_count();
    // The names come back out of both kinds of item, and the commit after
    // that is clean (checked by the crash mounts' `birch check` below too).
    let before_commit = rec.flush_count();
    for i in (0..LINKS).step_by(3) {
        fs.unlink(d, format!("link_{i}").as_bytes()).unwrap();
    }
    fs.rename(d, b"link_1", root, b"moved", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().nlink as usize, LINKS + 1 - LINKS / 3);
    fs.sync().unwrap();
    common::assert_clean(rec.as_ref(), "after unlinking extended refs");
    std::mem::forget(fs);
    let how = Enumeration::budgeted(40, 22);
    common::for_every_crash_mount_after(&rec, start, &how, |p, fs, v| {
        common::require_content(v, "/f", &data)?;
        let links = fs.getattr(ino(fs, "f")).unwrap().nlink as usize;
        let listed = v.keys().filter(|k| k.starts_with("/d/")).count();
        if listed + 1 + usize::from(v.contains_key("/moved")) != links {
            return Err(format!("{listed} names in d but {links} links"));
        }
        // Until the commit's first flush, the fsync's log is the newest
        // durable state.
        let logged = (synced..=before_commit).contains(&p.flushes_completed);
        if logged && links != LINKS + 1 {
            return Err(format!("{links} links after the fsync, not {}", LINKS + 1));
        }
        Ok(())
    });
}

/// `write f; setfattr 1500 xattrs on f; sync; remove every other one, set
/// 600 new ones and change one; fsync f; <cut>` → exactly the new set of
/// names and values: the log copies all of f's xattr items and replay
/// replaces the committed ones.
#[test]
fn many_xattrs_survive_fsync() {
    use birch::fs::XattrSetMode;
    use std::collections::BTreeMap;
    let rec = recorder();
    let fs = mount(rec.clone());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, b"has many xattrs").unwrap();
    let mut want: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for i in 0..1500 {
        let (name, value) = (format!("user.attr_{i:05}"), format!("value {i}"));
        fs.setxattr(
            f,
            name.as_bytes(),
            value.as_bytes(),
            XattrSetMode::default(),
        )
        .unwrap();
        want.insert(name.into_bytes(), value.into_bytes());
    }
    fs.sync().unwrap();
    let committed = want.clone();
    let start = rec.flush_count();
    for i in (0..1500).step_by(2) {
        let name = format!("user.attr_{i:05}");
        fs.removexattr(f, name.as_bytes()).unwrap();
        want.remove(name.as_bytes());
    }
    for i in 0..600 {
        let (name, value) = (format!("user.new_{i:04}"), vec![b'n'; i % 200 + 1]);
        fs.setxattr(f, name.as_bytes(), &value, XattrSetMode::default())
            .unwrap();
        want.insert(name.into_bytes(), value);
    }
    fs.setxattr(f, b"user.attr_00001", b"changed", XattrSetMode::default())
        .unwrap();
    want.insert(b"user.attr_00001".to_vec(), b"changed".to_vec());
    fs.fsync(f, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    let read_all = |fs: &birch::fs::Filesystem<_>| -> BTreeMap<Vec<u8>, Vec<u8>> {
        let f = ino(fs, "f");
        fs.listxattr(f)
            .unwrap()
            .into_iter()
            .map(|name| {
                let value = fs.getxattr(f, &name).unwrap();
                (name, value)
            })
            .collect()
    };
    let how = Enumeration::budgeted(60, 23);
    common::for_every_crash_mount_after(&rec, start, &how, |p, fs, _| {
        let got = read_all(fs);
        let expected = if p.flushes_completed >= synced {
            &want
        } else if got == committed {
            return Ok(());
        } else {
            &want
        };
        if &got != expected {
            return Err(format!(
                "{} xattrs, not the {} {}",
                got.len(),
                expected.len(),
                if p.flushes_completed >= synced {
                    "fsynced"
                } else {
                    "committed or fsynced"
                }
            ));
        }
        Ok(())
    });
}

/// A device reached only through a read-only open (an image its user
/// cannot write): reads work, `writable` says no, and a write would fail.
struct OpenedReadOnly(Arc<birch::device::MemoryDevice>);

impl BlockDevice for OpenedReadOnly {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::EBADF))
    }
    fn flush(&self) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::EBADF))
    }
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn writable(&self) -> bool {
        false
    }
}

fn read_only() -> birch::fs::MountOptions {
    birch::fs::MountOptions {
        read_only: true,
        ..birch::fs::MountOptions::deterministic()
    }
}

/// A device whose superblock points at a log holding `/g` (fsynced after
/// the last commit, which holds `/kept`).
fn image_with_a_log() -> Arc<birch::device::MemoryDevice> {
    let dev = common::memory_fs(IMAGE_BYTES, 5);
    let fs = mount(dev.clone());
    fs.create(fs.root_ino(), b"kept", 0o644, 0, 0).unwrap();
    fs.sync().unwrap();
    let g = fs.create(fs.root_ino(), b"g", 0o644, 0, 0).unwrap().ino;
    fs.write_file(g, 0, b"logged").unwrap();
    fs.fsync(g, false).unwrap();
    std::mem::forget(fs);
    dev
}

/// `mount -o ro` of an image with a log, then `remount,rw`: the read-only
/// open shows the log's content from memory and writes nothing; the switch
/// commits it, exactly as a read-write open would have.
#[test]
fn read_only_open_replays_in_memory_and_remount_read_write_commits_it() {
    let dev = image_with_a_log();
    let before = dev.snapshot();
    let fs = birch::fs::Filesystem::open(dev.clone(), read_only()).unwrap();
    assert!(fs.is_read_only());
    assert_eq!(
        common::view(&fs).get("/g").map(Vec::as_slice),
        Some(&b"logged"[..])
    );
    assert!(matches!(
        fs.create(fs.root_ino(), b"refused", 0o644, 0, 0),
        Err(birch::Error::ReadOnly)
    ));
    assert!(
        dev.snapshot() == before,
        "a read-only open wrote to the device"
    );

    fs.remount_read_write().unwrap();
    assert!(!fs.is_read_only());
    assert_eq!(
        birch::fs::read_superblock(dev.as_ref())
            .unwrap()
            .log_root_bytenr,
        0,
        "the switch commits the log it replayed"
    );
    // A second switch has nothing to do.
    let commits = fs.stats().commits;
    fs.remount_read_write().unwrap();
    assert_eq!(fs.stats().commits, commits);
    fs.create(fs.root_ino(), b"after", 0o644, 0, 0).unwrap();
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the switched mount");
    let fs = mount(dev.clone());
    assert!(fs.replay_outcome().is_none(), "no log left to replay");
    let v = common::view(&fs);
    assert_eq!(v.get("/g").map(Vec::as_slice), Some(&b"logged"[..]));
    assert!(v.contains_key("/kept") && v.contains_key("/after"), "{v:?}");
}

/// On a device opened read-only the switch is refused, and the mount goes
/// on read-only, still serving what it replayed.
#[test]
fn remount_read_write_refuses_a_device_opened_read_only() {
    let dev = image_with_a_log();
    let fs = birch::fs::Filesystem::open(OpenedReadOnly(dev.clone()), read_only()).unwrap();
    assert!(matches!(
        fs.remount_read_write(),
        Err(birch::Error::DeviceReadOnly)
    ));
    assert!(fs.is_read_only());
    assert!(common::view(&fs).contains_key("/g"));
    fs.close().unwrap();
    assert_ne!(
        birch::fs::read_superblock(dev.as_ref())
            .unwrap()
            .log_root_bytenr,
        0,
        "nothing was written: the log is still there for a read-write mount"
    );
}

/// `mkdir d; sync; touch d/f; fsync d; mkdir -p d/x/y; touch d/x/q
/// d/x/y/r; fsync d; <cut>` → `d/x/q` and `d/x/y/r`. After the first
/// fsync `d`'s additions go to the log at once, `d/x` with them; the
/// second fsync must still log what `d/x` (and its new `y`) gained since.
/// Found by the crash explorer (birch-sim's fixed workload of the same
/// name).
#[test]
fn dir_fsync_after_earlier_log_keeps_new_subtree() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.create(d, b"f", 0o644, 0, 0).unwrap();
    fs.fsync(d, false).unwrap();
    let x = fs.mkdir(d, b"x", 0o755, 0, 0).unwrap().ino;
    let y = fs.mkdir(x, b"y", 0o755, 0, 0).unwrap().ino;
    fs.create(x, b"q", 0o644, 0, 0).unwrap();
    fs.create(y, b"r", 0o644, 0, 0).unwrap();
    fs.fsync(d, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(24), |p, _, v| {
        common::require_content(v, "/d", b"<dir>")?;
        if p.flushes_completed >= synced {
            for path in ["/d/f", "/d/x/q", "/d/x/y/r"] {
                common::require_content(v, path, b"")?;
            }
        }
        Ok(())
    });
}

/// A commit frees every node of the log it drops, the leaves (which it
/// frees by address, without reading them) included: the free space after
/// the commit is what a new mount of the image counts.
#[test]
fn commit_frees_every_log_node() {
    let rec = recorder();
    let fs = mount(rec.clone());
    fs.sync().unwrap();
    let block = vec![0x5a; 4096];
    for i in 0..300 {
        let f = fs
            .create(fs.root_ino(), format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        fs.write_file(f, 0, &block).unwrap();
        fs.fsync(f, false).unwrap();
    }
    assert!(
        fs.log_stats().log_syncs >= 300,
        "every fsync went through the log"
    );
    // The second commit releases what the first one held.
    fs.sync().unwrap();
    fs.sync().unwrap();
    let free = fs.statfs().unwrap().blocks_free;
    fs.close().unwrap();
    let remounted = mount(rec.clone());
    assert_eq!(
        remounted.statfs().unwrap().blocks_free,
        free,
        "free blocks in memory after the commit differ from the image's"
    );
}

// ----- the fsync cases fstests caught (issue 21; docs/TREE-LOG.md, "The
// contract"). Each starts from a commit; crash states are taken from that
// commit on, at every flush point: before the fsync returned the committed
// state must mount (and check clean), after it what the fsync promised.

/// The xattr `user.a` of the inode at `path`, if it has one.
fn xattr_a<D: BlockDevice + 'static>(fs: &birch::fs::Filesystem<D>, path: &str) -> Option<Vec<u8>> {
    fs.getxattr(ino(fs, path), b"user.a").ok()
}

/// fstests generic/066: `touch f; setfattr -n user.a -v 1 f; sync; echo
/// x >>f; fsync f; setfattr -x user.a f; ln f f_link; touch g; fsync g;
/// <cut>` → once `f_link` is there, `user.a` is gone from `f`: the link
/// logs `f` again (its names, kept current since its fsync), and its
/// xattrs go with it.
#[test]
fn generic_066_xattr_removal_persists_with_link() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.setxattr(f, b"user.a", b"1", birch::fs::XattrSetMode::default())
        .unwrap();
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.write_file(f, 0, b"x\n").unwrap();
    fs.fsync(f, false).unwrap();
    fs.removexattr(f, b"user.a").unwrap();
    fs.link(f, root, b"f_link").unwrap();
    let g = fs.create(root, b"g", 0o644, 0, 0).unwrap().ino;
    fs.fsync(g, false).unwrap();
    assert_eq!(fs.stats().commits, 1, "answered by the log");
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(25), |p, fs, v| {
        if !v.contains_key("/f") {
            return Err("committed f is gone".into());
        }
        if v.contains_key("/f_link") && xattr_a(fs, "f").is_some() {
            return Err("f_link exists but the removed user.a is back on f".into());
        }
        if p.flushes_completed >= synced {
            common::require_content(v, "/f_link", b"x\n")?;
            common::require_content(v, "/g", b"")?;
        }
        Ok(())
    });
}

/// fstests generic/104: `mkdir d; touch d/foo d/bar; sync; ln d/bar
/// d/bar_link; ln d/foo d/foo_link; fsync d/bar; <cut>` → both links. An
/// fsync of a file that gained a name in this transaction logs the
/// directories it gained it in (btrfs commits instead).
#[test]
fn generic_104_fsync_logs_other_new_links_in_the_directory() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    let foo = fs.create(d, b"foo", 0o644, 0, 0).unwrap().ino;
    let bar = fs.create(d, b"bar", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.link(bar, d, b"bar_link").unwrap();
    fs.link(foo, d, b"foo_link").unwrap();
    fs.fsync(bar, false).unwrap();
    assert_eq!(fs.stats().commits, 1, "answered by the log");
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(26), |p, fs, v| {
        for path in ["/d/foo", "/d/bar"] {
            common::require_content(v, path, b"")?;
        }
        if p.flushes_completed >= synced {
            for path in ["/d/bar_link", "/d/foo_link"] {
                common::require_content(v, path, b"")?;
            }
            if nlink_at(fs, "d/foo") != 2 || ino(fs, "d/foo") != ino(fs, "d/foo_link") {
                return Err("foo and foo_link are not one inode with two links".into());
            }
        }
        Ok(())
    });
}

/// fstests generic/336: `mkdir a b c; touch a/foo; ln a/foo b/foo_link;
/// touch b/bar; sync; unlink b/foo_link; mv b/bar c/; fsync a/foo; <cut>`
/// → `c/bar`, and `b` empty. Replay removes `b/foo_link` (the log has
/// `foo`'s names): the fsync logs `b`, the directory `foo` lost a name
/// in, with its other changes, as btrfs does (it then commits, since
/// something was renamed out of `b`; birch logs `bar`'s new name).
#[test]
fn generic_336_move_out_of_old_parent_persists() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let a = fs.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(root, b"b", 0o755, 0, 0).unwrap().ino;
    let c = fs.mkdir(root, b"c", 0o755, 0, 0).unwrap().ino;
    let foo = fs.create(a, b"foo", 0o644, 0, 0).unwrap().ino;
    fs.link(foo, b, b"foo_link").unwrap();
    let bar = pattern(3000, 9);
    let bar_ino = fs.create(b, b"bar", 0o644, 0, 0).unwrap().ino;
    fs.write_file(bar_ino, 0, &bar).unwrap();
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.unlink(b, b"foo_link").unwrap();
    fs.rename(b, b"bar", c, b"bar", RenameFlags::default())
        .unwrap();
    fs.fsync(foo, false).unwrap();
    assert_eq!(fs.stats().commits, 1, "answered by the log");
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(27), |p, _, v| {
        require_reachable(v, &[("b/bar", &bar)])?;
        common::require_content(v, "/a/foo", b"")?;
        if p.flushes_completed >= synced {
            common::require_content(v, "/c/bar", &bar)?;
            if v.keys().any(|k| k.starts_with("/b/")) {
                return Err("b is not empty".into());
            }
        }
        Ok(())
    });
}

/// fstests generic/343: `mkdir x y y/z; touch x/foo y/foo2; sync; ln x/foo
/// x/bar; mv y/z x/; mv y/foo2 x/; fsync x/bar; <cut>` → `z` and `foo2`
/// in `x`, `y` empty: `x`, where the fsynced file gained a name, is logged
/// with the entries moved into it.
#[test]
fn generic_343_moves_into_dir_of_new_link_persist() {
    for move_dir in [true, false] {
        let rec = recorder();
        let fs = mount(rec.clone());
        let root = fs.root_ino();
        let x = fs.mkdir(root, b"x", 0o755, 0, 0).unwrap().ino;
        let y = fs.mkdir(root, b"y", 0o755, 0, 0).unwrap().ino;
        if move_dir {
            fs.mkdir(y, b"z", 0o755, 0, 0).unwrap();
        }
        let foo = fs.create(x, b"foo", 0o644, 0, 0).unwrap().ino;
        let foo2 = pattern(2000, 10);
        let foo2_ino = fs.create(y, b"foo2", 0o644, 0, 0).unwrap().ino;
        fs.write_file(foo2_ino, 0, &foo2).unwrap();
        fs.sync().unwrap();
        let start = rec.flush_count();
        fs.link(foo, x, b"bar").unwrap();
        if move_dir {
            fs.rename(y, b"z", x, b"z", RenameFlags::default()).unwrap();
        }
        fs.rename(y, b"foo2", x, b"foo2", RenameFlags::default())
            .unwrap();
        fs.fsync(foo, false).unwrap();
        assert_eq!(fs.stats().commits, 1, "answered by the log");
        let synced = rec.flush_count();
        std::mem::forget(fs);
        let seed = 28 + move_dir as u64;
        common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(seed), |p, _, v| {
            require_reachable(v, &[("y/foo2", &foo2)])?;
            if p.flushes_completed >= synced {
                common::require_content(v, "/x/bar", b"")?;
                common::require_content(v, "/x/foo2", &foo2)?;
                if move_dir {
                    common::require_content(v, "/x/z", b"<dir>")?;
                }
                if v.keys().any(|k| k.starts_with("/y/")) {
                    return Err(format!("y is not empty (z moved: {move_dir})"));
                }
            }
            Ok(())
        });
    }
}

/// fstests generic/764: `fd = open(d/foo, O_CREAT); syncfs; unlink d/foo;
/// fsync fd; <cut>` (and the same with `close fd; touch g; fsync g`
/// before the cut) → no `d/foo`. An fsync of a file with no names left
/// logs that it has none (btrfs 6.16: "fix fsync of files with no hard
/// links not persisting deletion").
#[test]
fn generic_764_fsync_of_unlinked_open_file_persists_deletion() {
    for close_before_cut in [false, true] {
        let rec = recorder();
        let fs = mount(rec.clone());
        let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
        let foo = fs.create(d, b"foo", 0o644, 0, 0).unwrap().ino;
        fs.open_inode(foo).unwrap();
        fs.sync().unwrap();
        let start = rec.flush_count();
        fs.unlink(d, b"foo").unwrap();
        fs.fsync(foo, false).unwrap();
        assert_eq!(fs.stats().commits, 1, "answered by the log");
        let synced = rec.flush_count();
        if close_before_cut {
            fs.release(foo).unwrap();
            let g = fs.create(d, b"g", 0o644, 0, 0).unwrap().ino;
            fs.fsync(g, false).unwrap();
        }
        std::mem::forget(fs);
        let seed = 30 + close_before_cut as u64;
        common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(seed), |p, _, v| {
            common::require_content(v, "/d", b"<dir>")?;
            if p.flushes_completed >= synced && v.contains_key("/d/foo") {
                return Err(format!(
                    "d/foo is back though its unlink was fsynced (closed: {close_before_cut})"
                ));
            }
            Ok(())
        });
    }
}

/// Found by the crash explorer (seed 51) once oracle 6 judged generic/104's
/// promise: `mkdir d; touch d/foo; sync; ln d/foo d/l; fsync d/foo; touch
/// d/new; fsync d/foo; <cut>` → `d/new`. The second fsync finds `foo`
/// unchanged since its log, but its directory changed since, and `foo`
/// gained a link in this transaction: the directory's changes go with it.
#[test]
fn linked_file_fsync_again_logs_its_directory() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    let foo = fs.create(d, b"foo", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.link(foo, d, b"l").unwrap();
    fs.fsync(foo, false).unwrap();
    fs.create(d, b"new", 0o644, 0, 0).unwrap();
    fs.fsync(foo, false).unwrap();
    assert_eq!(fs.stats().commits, 1, "answered by the log");
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(32), |p, _, v| {
        common::require_content(v, "/d/foo", b"")?;
        if p.flushes_completed >= synced {
            for path in ["/d/l", "/d/new"] {
                common::require_content(v, path, b"")?;
            }
        }
        Ok(())
    });
}

/// RENAME_WHITEOUT with the owner root.
fn whiteout() -> RenameFlags {
    RenameFlags {
        whiteout: Some(WhiteoutOwner { uid: 0, gid: 0 }),
        ..RenameFlags::default()
    }
}

/// Whether `path` is a whiteout (a character device 0:0, mode 0).
fn is_whiteout<D: BlockDevice + 'static>(fs: &birch::fs::Filesystem<D>, path: &str) -> bool {
    let (dir, name) = path.rsplit_once('/').expect("a path with a directory");
    fs.lookup(ino(fs, dir), name.as_bytes())
        .is_ok_and(|a| a.file_type == FileType::CharDevice && a.rdev == 0 && a.perm == 0)
}

/// The whiteout rename `from` → `to` of a file holding `data`, seen in one
/// crash state: not yet (`from` is the file, no `to`) or whole (`to` is
/// the file, `from` a whiteout), never half; whole once `synced`.
fn require_whiteout_rename<D: BlockDevice + 'static>(
    fs: &birch::fs::Filesystem<D>,
    v: &View,
    (from, to): (&str, &str),
    data: &[u8],
    synced: bool,
) -> Result<(), String> {
    let (from_key, to_key) = (format!("/{from}"), format!("/{to}"));
    if v.get(&to_key).is_some_and(|d| d.as_slice() == data) {
        if !is_whiteout(fs, from) {
            return Err(format!("{to} is renamed but {from} is no whiteout"));
        }
        Ok(())
    } else if synced {
        Err(format!("the fsynced rename to {to} is gone"))
    } else if v.contains_key(&to_key) {
        Err(format!("{to} exists without the renamed data"))
    } else {
        common::require_content(v, &from_key, data)
    }
}

/// `mkdir d e; write d/a; sync; mv --whiteout d/a e/a; fsync e/a; <cut>`
/// → the rename and its whiteout are one change: `e/a` with the data and
/// `d/a` a whiteout, or neither; both once the fsync returned (it logs
/// `d`, where the file lost a committed name, with the whiteout's entry
/// and inode).
#[test]
fn whiteout_rename_then_fsync_file() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    let e = fs.mkdir(fs.root_ino(), b"e", 0o755, 0, 0).unwrap().ino;
    let data = pattern(6000, 40);
    let a = fs.create(d, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write_file(a, 0, &data).unwrap();
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.rename(d, b"a", e, b"a", whiteout()).unwrap();
    fs.fsync(a, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(40), |p, fs, v| {
        require_whiteout_rename(fs, v, ("d/a", "e/a"), &data, p.flushes_completed >= synced)
    });
}

/// `mkdir d; write d/a; sync; mv --whiteout d/a d/b; fsync d; <cut>` →
/// `d/b` with the data and `d/a` a whiteout once the fsync returned (the
/// directory's log adds the whiteout as a new inode), never one without
/// the other.
#[test]
fn whiteout_rename_then_fsync_dir() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    let data = pattern(5000, 41);
    let a = fs.create(d, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write_file(a, 0, &data).unwrap();
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.rename(d, b"a", d, b"b", whiteout()).unwrap();
    fs.fsync(d, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(41), |p, fs, v| {
        require_whiteout_rename(fs, v, ("d/a", "d/b"), &data, p.flushes_completed >= synced)
    });
}

/// overlayfs's directory rename with redirect_dir: `mkdir d d/sub; write
/// d/sub/x; sync; mv --whiteout d/sub e; fsync e; <cut>` → `e/x` with
/// the data and `d/sub` a whiteout once the fsync returned, never one
/// without the other.
#[test]
fn whiteout_rename_of_directory_then_fsync() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    let sub = fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap().ino;
    let data = pattern(3000, 42);
    let x = fs.create(sub, b"x", 0o644, 0, 0).unwrap().ino;
    fs.write_file(x, 0, &data).unwrap();
    fs.sync().unwrap();
    let start = rec.flush_count();
    fs.rename(d, b"sub", fs.root_ino(), b"e", whiteout())
        .unwrap();
    fs.fsync(sub, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(42), |p, fs, v| {
        if v.contains_key("/e") {
            common::require_content(v, "/e/x", &data)?;
            if !is_whiteout(fs, "d/sub") {
                return Err("e is renamed but d/sub is no whiteout".into());
            }
            Ok(())
        } else if p.flushes_completed >= synced {
            Err("the fsynced rename to e is gone".into())
        } else {
            common::require_content(v, "/d/sub/x", &data)
        }
    });
}
