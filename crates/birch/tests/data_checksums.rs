//! Data checksums (docs/DATA-CHECKSUMS.md): a damaged data block is never
//! served, the checksum tree follows extents through commits, fsync's log
//! and replay, and its crash cases (one test each, named as in the doc).
//! Every crash state is `birch check`ed, whose `data-csums` pass verifies
//! the checksum tree, and read whole, which verifies every block.

mod common;

use birch::device::{BlockDevice, DeviceEvent, MemoryDevice, RecordingDevice};
use birch::error::Error;
use birch::format::{NODE_SIZE, SECTOR_SIZE};
use birch::fs::{DataChecksums, Filesystem, MetadataCopies, MkfsOptions};
use common::{
    assert_clean, for_every_crash_after, for_every_crash_mount_after, mount, Enumeration,
};
use std::sync::Arc;

const IMAGE_BYTES: u64 = 32 << 20;
const BLOCK: usize = SECTOR_SIZE as usize;

fn memory_fs(checksums: DataChecksums, metadata: MetadataCopies) -> Arc<MemoryDevice> {
    let dev = Arc::new(MemoryDevice::new(IMAGE_BYTES));
    Filesystem::mkfs(
        dev.as_ref(),
        &MkfsOptions {
            fsid: Some([0x0c; 16]),
            metadata,
            data_checksums: checksums,
            ..Default::default()
        },
    )
    .unwrap();
    dev
}

fn recorder(checksums: DataChecksums) -> Arc<RecordingDevice> {
    let dev = memory_fs(checksums, MetadataCopies::default());
    Arc::new(RecordingDevice::new(dev.snapshot()))
}

/// `blocks` blocks, each different from every other block of every
/// pattern (so a block can be found on the device by its content).
fn pattern(seed: u8, blocks: usize) -> Vec<u8> {
    (0..blocks * BLOCK)
        .map(|i| {
            let (block, at) = (i / BLOCK, i % BLOCK);
            (at as u8) ^ (block as u8).wrapping_mul(31) ^ seed.wrapping_mul(97) ^ (at >> 8) as u8
        })
        .collect()
}

/// Where on the device the block with this content is.
fn find_block(image: &[u8], block: &[u8]) -> u64 {
    image
        .chunks(BLOCK)
        .position(|b| b == block)
        .map(|i| (i * BLOCK) as u64)
        .expect("block not on the device")
}

fn create<D: BlockDevice + 'static>(fs: &Filesystem<D>, name: &str, data: &[u8]) -> u64 {
    let ino = fs
        .create(fs.root_ino(), name.as_bytes(), 0o644, 0, 0)
        .unwrap()
        .ino;
    fs.write_file(ino, 0, data).unwrap();
    ino
}

fn content_is(v: &common::View, path: &str, wanted: &[&[u8]]) -> Result<(), String> {
    match v.get(path) {
        Some(d) if wanted.contains(&d.as_slice()) => Ok(()),
        None if wanted.is_empty() => Ok(()),
        Some(d) => Err(format!("{path}: {} bytes of unexpected content", d.len())),
        None => Err(format!("{path} missing")),
    }
}

#[test]
fn corrupt_data_block_read_fails_with_eio_and_is_counted() {
    let dev = memory_fs(DataChecksums::On, MetadataCopies::Dup);
    let fs = mount(dev.clone());
    let data = pattern(1, 16);
    let ino = create(&fs, "f", &data);
    fs.close().unwrap();
    let bytenr = find_block(&dev.snapshot(), &data[3 * BLOCK..4 * BLOCK]);
    dev.write_at(&[0xa5; 64], bytenr + 100).unwrap();
    // The metadata is untouched: check stays clean.
    assert_clean(dev.as_ref(), "after damaging a data block");

    let fs = mount(dev.clone());
    let err = fs.read_file(ino, 0, data.len()).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    let Error::BadData(what) = &err else {
        panic!("expected a data checksum error, got {err}");
    };
    assert!(
        what.contains(&format!(
            "inode {ino} file offset {} disk bytenr {bytenr}",
            3 * BLOCK
        )),
        "{what}"
    );
    assert_eq!(fs.stats().data_csum_errors, 1);
    // Blocks around it read, the bad one never.
    assert_eq!(fs.read_file(ino, 0, 3 * BLOCK).unwrap(), data[..3 * BLOCK]);
    assert_eq!(
        fs.read_file(ino, 4 * BLOCK as u64, data.len()).unwrap(),
        data[4 * BLOCK..]
    );
    assert!(fs.read_file(ino, 3 * BLOCK as u64 + 10, 1).is_err());
    assert_eq!(fs.stats().data_csum_errors, 2);
    // A partial write of the bad block needs its old content: EIO too,
    // and the filesystem stays writable.
    assert_eq!(
        fs.write_file(ino, 3 * BLOCK as u64 + 1, b"x")
            .unwrap_err()
            .errno(),
        libc::EIO
    );
    // Overwriting the whole block replaces it.
    let fresh = pattern(2, 1);
    fs.write_file(ino, 3 * BLOCK as u64, &fresh).unwrap();
    fs.sync().unwrap();
    let mut expected = data.clone();
    expected[3 * BLOCK..4 * BLOCK].copy_from_slice(&fresh);
    assert_eq!(fs.read_file(ino, 0, data.len()).unwrap(), expected);
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after rewriting the bad block");
}

#[test]
fn image_without_data_checksums_mounts_and_reads_unverified() {
    let dev = memory_fs(DataChecksums::Off, MetadataCopies::Single);
    assert!(
        !birch::fs::read_superblock(dev.as_ref())
            .unwrap()
            .data_checksums
    );
    let fs = mount(dev.clone());
    let data = pattern(3, 4);
    let ino = create(&fs, "f", &data);
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "image without data checksums");
    let bytenr = find_block(&dev.snapshot(), &data[..BLOCK]);
    dev.write_at(&[0xa5; 8], bytenr).unwrap();
    let fs = mount(dev.clone());
    // Nothing to verify against: the damage is read back (the reason the
    // default is `on`).
    let got = fs.read_file(ino, 0, data.len()).unwrap();
    assert_eq!(&got[..8], &[0xa5; 8]);
    assert_eq!(fs.stats().data_csum_errors, 0);
    fs.write_file(ino, 0, &data).unwrap();
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "image without data checksums, rewritten");
}

#[test]
fn csum_commit_crash() {
    let rec = recorder(DataChecksums::On);
    let fs = mount(rec.clone());
    fs.sync().unwrap();
    let from = rec.flush_count();
    let data = pattern(4, 16);
    create(&fs, "f", &data);
    fs.sync().unwrap();
    std::mem::forget(fs);
    let states = for_every_crash_after(&rec, from, &Enumeration::thorough(1), |v| {
        content_is(v, "/f", &[&data]).or_else(|_| content_is(v, "/f", &[]))
    });
    assert!(states > 4);
}

#[test]
fn csum_log_sync_crash() {
    let rec = recorder(DataChecksums::On);
    let fs = mount(rec.clone());
    let old = pattern(5, 4);
    let ino = create(&fs, "f", &old);
    fs.sync().unwrap();
    let from = rec.flush_count();
    let more = pattern(6, 4);
    fs.write_file(ino, old.len() as u64, &more).unwrap();
    fs.fsync(ino, false).unwrap();
    let fsynced = rec.flush_count();
    std::mem::forget(fs);
    let new = [old.clone(), more].concat();
    let replayed = std::sync::atomic::AtomicUsize::new(0);
    let states =
        for_every_crash_mount_after(&rec, from, &Enumeration::thorough(2), |point, fs, v| {
            if fs.replay_outcome().is_some() {
                replayed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if point.flushes_completed >= fsynced {
                content_is(v, "/f", &[&new])
            } else {
                content_is(v, "/f", &[&old, &new])
            }
        });
    assert!(states > 4);
    assert!(
        replayed.into_inner() > 0,
        "no crash state replayed the log: the new extent's checksums were not tested"
    );
}

#[test]
fn csum_rewrite_between_fsyncs_crash() {
    let rec = recorder(DataChecksums::On);
    let fs = mount(rec.clone());
    let ino = create(&fs, "f", &pattern(7, 4));
    fs.sync().unwrap();
    let from = rec.flush_count();
    fs.write_file(ino, 0, &pattern(8, 4)).unwrap();
    fs.fsync(ino, false).unwrap();
    // The extent the first fsync logged (with its checksums) is replaced
    // and freed; its checksum items stay in the log.
    let last = pattern(9, 4);
    fs.write_file(ino, 0, &last).unwrap();
    fs.fsync(ino, false).unwrap();
    let fsynced = rec.flush_count();
    std::mem::forget(fs);
    let states = for_every_crash_after(&rec, fsynced, &Enumeration::thorough(3), |v| {
        content_is(v, "/f", &[&last])
    });
    assert!(states >= 1);
    // And every state from the first rewrite on is clean and readable.
    for_every_crash_after(&rec, from, &Enumeration::sampled(3), |_| Ok(()));
}

#[test]
fn csum_free_crash() {
    let rec = recorder(DataChecksums::On);
    let fs = mount(rec.clone());
    let data = pattern(10, 8);
    create(&fs, "f", &data);
    fs.sync().unwrap();
    let from = rec.flush_count();
    fs.unlink(fs.root_ino(), b"f").unwrap();
    fs.sync().unwrap();
    std::mem::forget(fs);
    let states = for_every_crash_after(&rec, from, &Enumeration::thorough(4), |v| {
        content_is(v, "/f", &[&data]).or_else(|_| content_is(v, "/f", &[]))
    });
    assert!(states > 4);
}

#[test]
fn csum_written_and_freed_before_commit_crash() {
    let rec = recorder(DataChecksums::On);
    let fs = mount(rec.clone());
    fs.sync().unwrap();
    let from = rec.flush_count();
    // Both extents are allocated in the running transaction, logged with
    // their checksums, and released before the commit: f's by the unlink,
    // g's by the truncate. Their space is pinned and their checksums are
    // deleted at once; the commit has no delayed ref left for them.
    let (f_data, g_data) = (pattern(11, 8), pattern(12, 8));
    let f = create(&fs, "f", &f_data);
    fs.fsync(f, false).unwrap();
    let g = create(&fs, "g", &g_data);
    fs.fsync(g, false).unwrap();
    fs.unlink(fs.root_ino(), b"f").unwrap();
    fs.truncate(g, 0).unwrap();
    fs.sync().unwrap();
    std::mem::forget(fs);
    let states = for_every_crash_after(&rec, from, &Enumeration::thorough(5), |v| {
        content_is(v, "/f", &[&f_data]).or_else(|_| content_is(v, "/f", &[]))?;
        content_is(v, "/g", &[&g_data, &[]]).or_else(|_| content_is(v, "/g", &[]))
    });
    assert!(states > 4);
}

/// Bytes and writes a recording saw from event `from` on.
fn written_since(rec: &RecordingDevice, from: usize) -> (u64, u64) {
    rec.events()[from..]
        .iter()
        .filter_map(|e| match e {
            DeviceEvent::Write { bytes, .. } => Some(bytes.len() as u64),
            DeviceEvent::Flush => None,
        })
        .fold((0, 0), |(b, n), len| (b + len, n + 1))
}

/// What a 4 KiB append costs the device: averaged over `ROUNDS` appends,
/// (bytes, writes) of a write + fsync (a log sync), and of a write +
/// commit.
fn append_costs(checksums: DataChecksums) -> ((u64, u64), (u64, u64)) {
    const ROUNDS: u64 = 16;
    let rec = recorder(checksums);
    let fs = mount(rec.clone());
    let ino = create(&fs, "f", &pattern(11, 64));
    fs.sync().unwrap();
    let mut log_sync = (0, 0);
    let mut commit = (0, 0);
    for round in 0..ROUNDS {
        let at = (64 + 2 * round) * SECTOR_SIZE;
        let from = rec.events().len();
        fs.write_file(ino, at, &pattern(12, 1)).unwrap();
        fs.fsync(ino, false).unwrap();
        let (b, n) = written_since(&rec, from);
        log_sync = (log_sync.0 + b, log_sync.1 + n);
        fs.sync().unwrap();
        let from = rec.events().len();
        fs.write_file(ino, at + SECTOR_SIZE, &pattern(13, 1))
            .unwrap();
        fs.sync().unwrap();
        let (b, n) = written_since(&rec, from);
        commit = (commit.0 + b, commit.1 + n);
    }
    assert_eq!(fs.log_stats().log_syncs, ROUNDS, "each fsync a log sync");
    fs.close().unwrap();
    (
        (log_sync.0 / ROUNDS, log_sync.1 / ROUNDS),
        (commit.0 / ROUNDS, commit.1 / ROUNDS),
    )
}

/// The cost of checksums in device bytes (not time: `cargo test -p birch
/// --test data_checksums checksum_cost -- --nocapture` prints it). A log
/// sync of a 4 KiB append carries its checksum in a log leaf it writes
/// anyway; a commit CoWs the checksum tree's path: one more node (and its
/// DUP mirror) per commit.
#[test]
fn checksum_cost() {
    let (log_on, commit_on) = append_costs(DataChecksums::On);
    let (log_off, commit_off) = append_costs(DataChecksums::Off);
    println!("4 KiB append, averaged (DUP metadata):");
    println!(
        "  write + fsync (log sync): checksums on {} bytes in {} writes, off {} bytes in {} writes",
        log_on.0, log_on.1, log_off.0, log_off.1
    );
    println!(
        "  write + commit:           checksums on {} bytes in {} writes, off {} bytes in {} writes",
        commit_on.0, commit_on.1, commit_off.0, commit_off.1
    );
    let node_copies = 2 * NODE_SIZE as u64;
    assert!(
        log_on.0 <= log_off.0 + node_copies,
        "a log sync with checksums writes more than one extra node"
    );
    assert!(
        commit_on.0 <= commit_off.0 + 2 * node_copies,
        "a commit with checksums writes more than the checksum tree's leaf and the root tree's extra path"
    );
}

#[test]
fn scrub_names_a_bad_data_block_by_path_and_offset() {
    let dev = memory_fs(DataChecksums::On, MetadataCopies::Dup);
    let fs = mount(dev.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    let data = pattern(14, 16);
    let ino = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(ino, 0, &data).unwrap();
    create(&fs, "g", &pattern(15, 4));
    fs.close().unwrap();
    let clean = birch::scrub::scrub_device(dev.as_ref()).unwrap();
    assert!(clean.is_clean(), "{clean}");
    assert_eq!(
        (
            clean.data_extents,
            clean.data_blocks_verified,
            clean.data_blocks_not_verified
        ),
        (2, 20, 0),
        "{clean}"
    );

    let bytenr = find_block(&dev.snapshot(), &data[5 * BLOCK..6 * BLOCK]);
    dev.write_at(&[0x5a; 16], bytenr + 4000).unwrap();
    let report = birch::scrub::scrub_device(dev.as_ref()).unwrap();
    assert!(!report.is_clean(), "{report}");
    assert_eq!(
        (report.data_blocks_bad, report.data_blocks_verified),
        (1, 19),
        "{report}"
    );
    assert_eq!(report.unrepaired.len(), 1, "{report}");
    assert!(
        report.unrepaired[0].contains(&format!("data block {bytenr}: checksum"))
            && report.unrepaired[0].contains(&format!("/d/f offset {} (inode {ino})", 5 * BLOCK)),
        "{report}"
    );
    // Scrub cannot repair data and does not touch it; metadata stays clean.
    assert!(dev.snapshot()[bytenr as usize + 4000..][..16]
        .iter()
        .all(|&b| b == 0x5a));
    assert_clean(dev.as_ref(), "after scrubbing a bad data block");
}

#[test]
fn scrub_counts_data_without_checksums_as_not_verified() {
    let dev = memory_fs(DataChecksums::Off, MetadataCopies::Single);
    let fs = mount(dev.clone());
    create(&fs, "f", &pattern(16, 8));
    fs.close().unwrap();
    let report = birch::scrub::scrub_device(dev.as_ref()).unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        (
            report.data_extents,
            report.data_blocks_verified,
            report.data_blocks_not_verified
        ),
        (1, 0, 8),
        "{report}"
    );
}
