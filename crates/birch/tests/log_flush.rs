//! The one-flush log sync's crash cases (docs/LOG-FLUSH.md), one test
//! each: a log sync writes its data, nodes and superblocks before one
//! flush, and the mount validates the newest log against the superblock's
//! manifest, falling back to the log durable before it.

mod common;

use birch::device::{BlockDevice, CrashPoint, DeviceEvent, MemoryDevice, RecordingDevice};
use birch::format::{tree_id, Node, NODE_MAGIC, NODE_SIZE, SUPERBLOCK_OFFSETS};
use birch::fs::{
    read_superblock, DataChecksums, Filesystem, MkfsOptions, MountOptions, ReplayOutcome,
};
use common::{mount, Enumeration, View};
use std::sync::Arc;

const IMAGE_BYTES: u64 = 32 << 20;
const FSID: [u8; 16] = [9; 16];

fn recorder() -> Arc<RecordingDevice> {
    common::recorder(IMAGE_BYTES, FSID[0])
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// What one write of a log sync's window is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    Superblock,
    /// A run of log nodes starting with a node of this tree and level.
    LogNodes {
        tree: u64,
        level: u8,
    },
    /// Anything else: file data (a log sync writes nothing else).
    Data,
}

/// The writes of window `k` (after flush k, before flush k + 1), in order.
fn window(rec: &RecordingDevice, k: usize) -> Vec<(u64, Vec<u8>)> {
    let mut flushes = 0;
    let mut out = Vec::new();
    for event in rec.events() {
        match event {
            DeviceEvent::Flush => flushes += 1,
            DeviceEvent::Write { offset, bytes } if flushes == k => out.push((offset, bytes)),
            DeviceEvent::Write { .. } => {}
        }
    }
    out
}

fn kind(offset: u64, bytes: &[u8]) -> WriteKind {
    if SUPERBLOCK_OFFSETS.contains(&offset) {
        return WriteKind::Superblock;
    }
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let is_node = bytes.len() >= NODE_SIZE && bytes[4..8] == NODE_MAGIC.to_le_bytes();
    if is_node && matches!(word(24), tree_id::LOG | tree_id::LOG_ROOT) {
        WriteKind::LogNodes {
            tree: word(24),
            level: bytes[36],
        }
    } else {
        WriteKind::Data
    }
}

/// The crash image keeping every write up to flush `k` and the writes of
/// window `k` that `keep` accepts.
fn crash_image(
    rec: &RecordingDevice,
    k: usize,
    keep: impl Fn(u64, &[u8]) -> bool,
) -> Arc<MemoryDevice> {
    let kept_writes = window(rec, k)
        .iter()
        .enumerate()
        .filter(|(_, (offset, bytes))| keep(*offset, bytes))
        .map(|(i, _)| i)
        .collect();
    let point = CrashPoint {
        flushes_completed: k,
        kept_writes,
    };
    Arc::new(MemoryDevice::from_bytes(rec.crash_image(&point)))
}

/// Opens `dev`, requiring `birch check` to be clean before and after, and
/// returns the replay outcome and the tree it shows.
fn checked_mount(dev: &Arc<MemoryDevice>, options: MountOptions) -> (ReplayOutcome, View) {
    common::assert_clean(dev.as_ref(), "the crash image");
    let fs = Filesystem::open(dev.clone(), options).unwrap();
    let outcome = fs.replay_outcome().expect("the image has a log");
    let v = common::view(&fs);
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the mount");
    (outcome, v)
}

fn newest_log_incomplete(outcome: &ReplayOutcome) -> bool {
    match outcome {
        ReplayOutcome::Replayed(report) => report.newest_log_incomplete,
        ReplayOutcome::Discarded(why) => panic!("the log was discarded: {why}"),
    }
}

/// `create f; write f A; fsync f; create g; write g B; fsync g`, recorded:
/// returns the recording and the flush after which the second log sync's
/// window starts.
fn two_log_syncs(rec: &Arc<RecordingDevice>, second_rewrites_f: bool) -> (usize, Vec<u8>, Vec<u8>) {
    let fs = mount(rec.clone());
    let a = pattern(12_288, 1);
    let b = pattern(8_192, 2);
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &a).unwrap();
    fs.fsync(f, false).unwrap();
    let second_window = rec.flush_count();
    if second_rewrites_f {
        fs.write_file(f, 0, &b).unwrap();
        fs.fsync(f, false).unwrap();
    } else {
        let g = fs.create(fs.root_ino(), b"g", 0o644, 0, 0).unwrap().ino;
        fs.write_file(g, 0, &b).unwrap();
        fs.fsync(g, false).unwrap();
    }
    assert_eq!(
        rec.flush_count(),
        second_window + 1,
        "one flush per log sync"
    );
    assert_eq!(fs.log_stats().log_syncs, 2);
    std::mem::forget(fs);
    (second_window, a, b)
}

#[test]
fn one_flush_log_sync_survives() {
    let rec = recorder();
    let fs = mount(rec.clone());
    fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap();
    fs.sync().unwrap();
    let data = pattern(12_288, 7);
    let f = fs
        .create(common::ino(&fs, "d"), b"f", 0o644, 0, 0)
        .unwrap()
        .ino;
    fs.write_file(f, 0, &data).unwrap();
    let before = rec.flush_count();
    fs.fsync(f, false).unwrap();
    assert_eq!(rec.flush_count(), before + 1, "the log sync flushed once");
    let sb = read_superblock(rec.as_ref()).unwrap();
    let manifest = sb.log_manifest.expect("a one-flush log sync's superblock");
    assert_eq!(manifest.previous, None, "the commit before had no log");
    std::mem::forget(fs);
    let states = common::for_every_crash_mount_after(
        &rec,
        before,
        &Enumeration::thorough(0),
        |point, _, v| {
            if v.get("/d/f") == Some(&data) {
                Ok(())
            } else if point.flushes_completed == before && !v.contains_key("/d/f") {
                // Cut before the flush: the fsync had not returned.
                Ok(())
            } else {
                Err("d/f missing or partial".into())
            }
        },
    );
    assert!(states >= 16, "{states} crash states");
}

#[test]
fn log_sync_window_holds_data_nodes_and_superblocks() {
    let rec = recorder();
    let (k, _, _) = two_log_syncs(&rec, false);
    let writes = window(&rec, k);
    let kinds: Vec<WriteKind> = writes.iter().map(|(o, b)| kind(*o, b)).collect();
    let count = |want: fn(&WriteKind) -> bool| kinds.iter().filter(|k| want(k)).count();
    assert_eq!(count(|k| *k == WriteKind::Superblock), 2, "{kinds:?}");
    assert!(count(|k| *k == WriteKind::Data) >= 1, "{kinds:?}");
    // DUP (the default): every node run is written twice.
    let nodes = count(|k| matches!(k, WriteKind::LogNodes { .. }));
    assert!(nodes >= 2 && nodes % 2 == 0, "{kinds:?}");
    // The explorers build every subset of a window this small.
    assert!(writes.len() <= 10, "{kinds:?}");
    let points = common::crash_points(&rec, k, &Enumeration::thorough(0));
    let in_window = points.iter().filter(|p| p.flushes_completed == k).count();
    assert_eq!(in_window, 1 << writes.len());
}

#[test]
fn lost_log_node_falls_back_to_previous_log() {
    let rec = recorder();
    let (k, a, _) = two_log_syncs(&rec, false);
    // Every write of the second sync but its log tree leaf (both copies).
    let dev = crash_image(&rec, k, |offset, bytes| {
        let leaf = WriteKind::LogNodes {
            tree: tree_id::LOG,
            level: 0,
        };
        SUPERBLOCK_OFFSETS.contains(&offset) || kind(offset, bytes) != leaf
    });
    let sb = read_superblock(dev.as_ref()).unwrap();
    assert_eq!(sb.log_generation, 2, "the second sync's superblock is kept");
    let (outcome, v) = checked_mount(&dev, MountOptions::deterministic());
    assert!(newest_log_incomplete(&outcome), "{outcome:?}");
    assert_eq!(v.get("/f"), Some(&a));
    assert!(!v.contains_key("/g"), "{v:?}");
}

/// The node L1 wrote for the log tree's leaf, re-encoded as the node at
/// `bytenr`: what a block L1 released and L3 reused holds when L3's write
/// of it is lost (same owner, level and transaction; a valid checksum).
fn stale_leaf_at(rec: &RecordingDevice, first_window: usize, bytenr: u64) -> Vec<u8> {
    let (offset, bytes) = window(rec, first_window)
        .into_iter()
        .find(|(o, b)| {
            kind(*o, b)
                == WriteKind::LogNodes {
                    tree: tree_id::LOG,
                    level: 0,
                }
        })
        .expect("the first sync wrote a log leaf");
    let mut node = Node::decode(&bytes[..NODE_SIZE], offset, &FSID).unwrap();
    node.bytenr = bytenr;
    node.encode(&FSID)
}

/// The second sync's log leaf: its block, and its mirror's.
fn second_leaf(rec: &RecordingDevice, k: usize) -> (u64, Option<u64>) {
    let sb = read_superblock(rec).unwrap();
    let leaf = |(o, b): &(u64, Vec<u8>)| {
        kind(*o, b)
            == WriteKind::LogNodes {
                tree: tree_id::LOG,
                level: 0,
            }
    };
    let writes = window(rec, k);
    let mut leaves = writes.iter().filter(|w| leaf(w)).map(|(o, _)| *o);
    let primary = leaves.next().expect("the second sync wrote a log leaf");
    (primary, sb.metadata_profile.mirror_of(primary))
}

#[test]
fn stale_log_node_of_the_same_transaction_is_rejected() {
    let rec = recorder();
    let (k, a, _) = two_log_syncs(&rec, true);
    let (leaf, mirror) = second_leaf(&rec, k);
    let dev = crash_image(&rec, k, |_, _| true);
    let stale = stale_leaf_at(&rec, k - 1, leaf);
    for copy in std::iter::once(leaf).chain(mirror) {
        dev.write_at(&stale, copy).unwrap();
    }
    let (outcome, v) = checked_mount(&dev, MountOptions::deterministic());
    assert!(newest_log_incomplete(&outcome), "{outcome:?}");
    assert_eq!(v.get("/f"), Some(&a), "the first fsync's content");
}

#[test]
fn good_mirror_of_a_stale_log_node_is_served() {
    let rec = recorder();
    let (k, _, b) = two_log_syncs(&rec, true);
    let (leaf, mirror) = second_leaf(&rec, k);
    assert!(mirror.is_some(), "DUP metadata is the default");
    let expected = {
        let mut f = pattern(12_288, 1);
        f[..b.len()].copy_from_slice(&b);
        f
    };
    let read_only = MountOptions {
        read_only: true,
        ..MountOptions::deterministic()
    };
    for options in [read_only, MountOptions::deterministic()] {
        let dev = crash_image(&rec, k, |_, _| true);
        dev.write_at(&stale_leaf_at(&rec, k - 1, leaf), leaf)
            .unwrap();
        let read_only = options.read_only;
        // The stale primary beside a good mirror is a crash state: a
        // warning for the check, not a fault.
        common::assert_clean(dev.as_ref(), "the crash image");
        let fs = Filesystem::open(dev.clone(), options).unwrap();
        let outcome = fs.replay_outcome().expect("a log");
        assert!(!newest_log_incomplete(&outcome), "{outcome:?}");
        assert_eq!(common::view(&fs).get("/f"), Some(&expected));
        let repairs = fs.stats().metadata_repairs;
        assert_eq!(repairs, u64::from(!read_only), "read repair of the primary");
        fs.close().unwrap();
        common::assert_clean(dev.as_ref(), "after the mount");
    }
}

#[test]
fn lost_logged_data_falls_back_to_previous_log() {
    let rec = recorder();
    let (k, a, _) = two_log_syncs(&rec, false);
    let dev = crash_image(&rec, k, |offset, bytes| {
        kind(offset, bytes) != WriteKind::Data
    });
    let (outcome, v) = checked_mount(&dev, MountOptions::deterministic());
    assert!(newest_log_incomplete(&outcome), "{outcome:?}");
    assert_eq!(v.get("/f"), Some(&a));
    assert!(!v.contains_key("/g"), "{v:?}");
}

#[test]
fn damaged_previous_log_is_reported() {
    let rec = recorder();
    let (k, _, _) = two_log_syncs(&rec, false);
    let leaf = WriteKind::LogNodes {
        tree: tree_id::LOG,
        level: 0,
    };
    let dev = crash_image(&rec, k, |offset, bytes| kind(offset, bytes) != leaf);
    // The first sync's leaf, durable, damaged in both copies.
    let (first_leaf, _) = window(&rec, k - 1)
        .into_iter()
        .find(|(o, b)| kind(*o, b) == leaf)
        .unwrap();
    let sb = read_superblock(dev.as_ref()).unwrap();
    for copy in std::iter::once(first_leaf).chain(sb.metadata_profile.mirror_of(first_leaf)) {
        dev.write_at(&[0x5a; 64], copy + 100).unwrap();
    }
    let fs = mount(dev.clone());
    match fs.replay_outcome() {
        Some(ReplayOutcome::Discarded(why)) => {
            assert!(
                why.contains(&format!("block={first_leaf}")) && why.contains("damaged"),
                "the reason names the damaged block: {why}"
            )
        }
        other => panic!("expected the damaged log to be discarded, got {other:?}"),
    }
    let v = common::view(&fs);
    assert!(!v.contains_key("/f") && !v.contains_key("/g"), "{v:?}");
    fs.close().unwrap();
}

#[test]
fn checksums_off_keeps_two_flushes() {
    for (checksums, flushes) in [(DataChecksums::Off, 2), (DataChecksums::On, 1)] {
        let dev = Arc::new(MemoryDevice::new(IMAGE_BYTES));
        let options = MkfsOptions {
            fsid: Some(FSID),
            data_checksums: checksums,
            ..Default::default()
        };
        Filesystem::mkfs(dev.as_ref(), &options).unwrap();
        let rec = Arc::new(RecordingDevice::new(dev.snapshot()));
        let fs = mount(rec.clone());
        let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
        fs.write_file(f, 0, &pattern(5000, 3)).unwrap();
        let before = rec.flush_count();
        fs.fsync(f, false).unwrap();
        assert_eq!(rec.flush_count() - before, flushes, "{checksums:?}");
        let sb = read_superblock(rec.as_ref()).unwrap();
        assert_eq!(sb.log_manifest.is_some(), flushes == 1, "{checksums:?}");
        fs.close().unwrap();
    }
}

#[test]
fn large_log_sync_keeps_two_flushes() {
    use birch::format::MAX_LOG_MANIFEST_NODES;
    use birch::fs::XattrSetMode;
    let rec = common::recorder(128 << 20, FSID[0]);
    let fs = mount(rec.clone());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    // One 9000-byte xattr fills a leaf: the log gets a leaf for each.
    let count = MAX_LOG_MANIFEST_NODES + 20;
    for i in 0..count {
        let name = format!("user.big_{i:04}");
        let value = pattern(9000, i as u8);
        fs.setxattr(f, name.as_bytes(), &value, XattrSetMode::default())
            .unwrap();
    }
    let before = rec.flush_count();
    fs.fsync(f, false).unwrap();
    assert_eq!(
        rec.flush_count() - before,
        2,
        "too many nodes for a manifest"
    );
    let sb = read_superblock(rec.as_ref()).unwrap();
    assert!(sb.log_root_bytenr != 0 && sb.log_manifest.is_none());
    std::mem::forget(fs);
    let point = CrashPoint {
        flushes_completed: rec.flush_count(),
        kept_writes: vec![],
    };
    common::crash_mount(&rec, &point, |fs| {
        let f = common::ino(fs, "f");
        assert_eq!(fs.listxattr(f).unwrap().len(), count);
        let last = format!("user.big_{:04}", count - 1);
        let value = fs.getxattr(f, last.as_bytes()).unwrap();
        assert_eq!(value, pattern(9000, (count - 1) as u8));
    });
}
