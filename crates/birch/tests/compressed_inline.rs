//! Compressed inline extents (docs/COMPRESSION.md, "Compressed inline
//! extents"): under compression a file of at most a page whose data
//! compresses into the inline limit is kept in its tree leaf compressed;
//! it reads back (dirty, written back, after a remount without the
//! option), the choice follows the file's compression (mount option, `c`,
//! `m`), reflink, truncate, punch, fallocate and appends turn it into what
//! they need, a damaged algorithm or length is a corruption report naming
//! the inode and offset, `birch check --verify-data` decompresses it, and
//! the crash cases named in the doc, each at every flush point.

mod common;

use birch::check::{check_device_with, CheckOptions, FaultId};
use birch::device::{MemoryDevice, RecordingDevice};
use birch::error::Error;
use birch::format::{item_type, tree_id, FileExtent, Key, SECTOR_SIZE};
use birch::fs::{
    inode_flags, read_superblock, CompressOption, DataChecksums, FallocateMode, Filesystem,
    MkfsOptions, MountOptions,
};
use common::{assert_clean_with_data as assert_clean, for_every_crash_mount_after, Enumeration};
use std::sync::Arc;

const IMAGE_BYTES: u64 = 64 << 20;
const PAGE: u64 = SECTOR_SIZE;
/// Where a compressed inline item's fields lie in its body (docs/FORMAT.md).
const RAM_BYTES_AT: usize = 1;
const ALGORITHM_AT: usize = 9;

fn memory_fs() -> Arc<MemoryDevice> {
    let dev = Arc::new(MemoryDevice::new(IMAGE_BYTES));
    Filesystem::mkfs(
        dev.as_ref(),
        &MkfsOptions {
            fsid: Some([0xc1; 16]),
            data_checksums: DataChecksums::On,
            ..Default::default()
        },
    )
    .unwrap();
    dev
}

fn mount_with<D: birch::device::BlockDevice + 'static>(dev: D, compress: &str) -> Filesystem<D> {
    let options = MountOptions {
        compress: CompressOption::parse(compress, false).unwrap(),
        ..MountOptions::deterministic()
    };
    Filesystem::open(dev, options).unwrap()
}

fn create<D: birch::device::BlockDevice + 'static>(
    fs: &Filesystem<D>,
    name: &str,
    data: &[u8],
) -> u64 {
    let ino = fs
        .create(fs.root_ino(), name.as_bytes(), 0o644, 0, 0)
        .unwrap()
        .ino;
    fs.write_file(ino, 0, data).unwrap();
    ino
}

fn read_all<D: birch::device::BlockDevice + 'static>(fs: &Filesystem<D>, ino: u64) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    fs.read_file(ino, 0, size as usize).unwrap()
}

/// The file extent items of `ino` in the committed fs tree, decoded.
fn extents_of(dev: &MemoryDevice, ino: u64) -> Vec<(u64, FileExtent)> {
    let sb = read_superblock(dev).unwrap();
    let (roots, _) = birch::check::tree_roots(dev, &sb);
    let root = roots.into_iter().find(|r| r.tree == tree_id::FS).unwrap();
    let (nodes, problems) = birch::check::tree_nodes(dev, &sb.fsid, root);
    assert!(problems.is_empty(), "{problems:?}");
    let mut out = Vec::new();
    for (_, node) in nodes {
        if let birch::format::NodeBody::Leaf(items) = node.body {
            for i in items {
                if i.key.objectid == ino && i.key.item_type == item_type::EXTENT_DATA {
                    out.push((i.key.offset, FileExtent::decode(&i.data).unwrap()));
                }
            }
        }
    }
    out.sort_by_key(|(o, _)| *o);
    out
}

/// What kind of extent holds the file: "compressed inline ALG", "inline",
/// "regular", or the list when there are several.
fn kind_of(dev: &MemoryDevice, ino: u64) -> String {
    let kinds: Vec<String> = extents_of(dev, ino)
        .into_iter()
        .map(|(_, e)| match e {
            FileExtent::InlineCompressed { compression, .. } => {
                format!("compressed inline {compression}")
            }
            FileExtent::Inline { .. } => "inline".into(),
            FileExtent::Regular { .. } => "regular".into(),
            FileExtent::Prealloc { .. } => "prealloc".into(),
            FileExtent::Compressed { .. } => "compressed".into(),
        })
        .collect();
    kinds.join(",")
}

/// The dump line of `ino`'s first extent item (`birch dump`'s format).
fn dumped_extent(dev: &MemoryDevice, ino: u64) -> String {
    let (_, extent) = extents_of(dev, ino).remove(0);
    birch::print::file_extent(&extent)
}

#[test]
fn small_compressible_files_go_inline_compressed_and_read_back() {
    for algorithm in ["zstd", "zstd:15", "lz4"] {
        let name = algorithm.split(':').next().unwrap();
        let dev = memory_fs();
        let fs = mount_with(dev.clone(), algorithm);
        let sizes = [300usize, 2048, 3000, 4096];
        let mut files = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let data = common::compressible_text(i as u8, len);
            let ino = create(&fs, &format!("text-{len}"), &data);
            assert!(read_all(&fs, ino) == data, "{algorithm} {len}: dirty");
            files.push((ino, data));
        }
        // Does not shrink (random), or grows (a few bytes): as without
        // compression, plain inline up to 2048 bytes, else a block.
        let noise = create(&fs, "noise", &common::incompressible_noise(7, 3000));
        let tiny = create(&fs, "tiny", b"tiny");
        fs.sync().unwrap();
        let stats = fs.stats();
        assert_eq!(stats.compressed_inline_extents, 4, "{algorithm}: {stats:?}");
        assert!(
            stats.compressed_bytes_out < stats.compressed_bytes_in / 2,
            "{algorithm}: {stats:?}"
        );
        for (ino, data) in &files {
            assert!(read_all(&fs, *ino) == *data, "{algorithm}: written back");
            // stat's blocks count the data as for an inline extent.
            let blocks = fs.getattr(*ino).unwrap().blocks;
            assert_eq!(blocks, (data.len() as u64).div_ceil(512), "{algorithm}");
        }
        assert_eq!(fs.getattr(noise).unwrap().blocks, 8, "{algorithm}");
        fs.close().unwrap();
        assert!(read_superblock(dev.as_ref()).unwrap().compression);
        for (ino, data) in &files {
            assert_eq!(
                kind_of(&dev, *ino),
                format!("compressed inline {name}"),
                "{algorithm}"
            );
            let line = dumped_extent(&dev, *ino);
            assert!(
                line.starts_with(&format!(
                    "extent inline compressed {name} ram_bytes {} compressed_len ",
                    data.len()
                )),
                "{line}"
            );
        }
        assert_eq!(kind_of(&dev, noise), "regular", "{algorithm}");
        assert_eq!(kind_of(&dev, tiny), "inline", "{algorithm}");
        assert_clean(dev.as_ref(), algorithm);
        let report = check_device_with(dev.as_ref(), CheckOptions { verify_data: true });
        assert_eq!(report.summary.compressed_inline_items, 4, "{report}");
        assert_eq!(
            report.summary.data_verified.unwrap().inline_decompressed,
            4,
            "{report}"
        );

        // Read back on a mount without the option.
        let fs = common::mount(dev.clone());
        for (ino, data) in &files {
            assert!(read_all(&fs, *ino) == *data, "{algorithm}: remounted");
            assert!(fs.read_file(*ino, 100, 50).unwrap() == data[100..150]);
        }
        fs.close().unwrap();
    }
}

#[test]
fn inline_compression_follows_the_files_compression_setting() {
    use inode_flags::{COMPR, NOCOMP};
    let data = common::compressible_text(3, 3000);
    let small = common::compressible_text(4, 1500);
    // No option: plain inline up to 2048 bytes, a block above; `+c` files
    // are compressed.
    let dev = memory_fs();
    let fs = common::mount(dev.clone());
    let plain = create(&fs, "plain", &data);
    let plain_small = create(&fs, "plain-small", &small);
    let flagged = create(&fs, "flagged", b"");
    fs.set_flags(flagged, COMPR).unwrap();
    fs.write_file(flagged, 0, &data).unwrap();
    fs.close().unwrap();
    assert_eq!(kind_of(&dev, plain), "regular");
    assert_eq!(kind_of(&dev, plain_small), "inline");
    assert_eq!(kind_of(&dev, flagged), "compressed inline zstd");
    assert_clean(dev.as_ref(), "no option");

    // compress=zstd, but `m` (chattr +m, the property none): as without.
    let dev = memory_fs();
    let fs = mount_with(dev.clone(), "zstd");
    let never = create(&fs, "never", b"");
    fs.set_flags(never, NOCOMP).unwrap();
    fs.write_file(never, 0, &data).unwrap();
    let never_small = create(&fs, "never-small", b"");
    fs.set_flags(never_small, NOCOMP).unwrap();
    fs.write_file(never_small, 0, &small).unwrap();
    fs.close().unwrap();
    assert_eq!(kind_of(&dev, never), "regular");
    assert_eq!(kind_of(&dev, never_small), "inline");
    assert!(!read_superblock(dev.as_ref()).unwrap().compression);
    assert_clean(dev.as_ref(), "m");
}

#[test]
fn reflink_truncate_punch_fallocate_and_append_on_compressed_inline_files() {
    let dev = memory_fs();
    let fs = mount_with(dev.clone(), "zstd");
    let mut model = common::compressible_text(5, 3900);
    let a = create(&fs, "a", &model);
    let b = create(&fs, "b", &common::compressible_text(6, PAGE as usize));
    let c = create(&fs, "c", &common::compressible_text(7, 3500));
    let d = create(&fs, "d", &common::compressible_text(8, 3200));
    fs.sync().unwrap();
    for ino in [a, b, c, d] {
        assert_eq!(kind_of(&dev, ino), "compressed inline zstd", "{ino}");
    }
    // Truncate down inside it, then up: the page is rewritten.
    fs.truncate(a, 2500).unwrap();
    model.truncate(2500);
    assert!(read_all(&fs, a) == model, "a after truncate down");
    fs.truncate(a, 3333).unwrap();
    model.resize(3333, 0);
    assert!(read_all(&fs, a) == model, "a after truncate up");
    // Punch a hole inside it (keeps the size; zeros read back).
    fs.fallocate(a, 100, 700, FallocateMode::PunchHole).unwrap();
    model[100..800].fill(0);
    assert!(read_all(&fs, a) == model, "a after the punch");
    fs.sync().unwrap();
    assert!(read_all(&fs, a) == model, "a after its writeback");
    assert_eq!(kind_of(&dev, a), "compressed inline zstd");

    // Reflink b's whole page (its inline extent is made regular to be
    // shared) into a new file e.
    let b_data = read_all(&fs, b);
    let e = create(&fs, "e", b"");
    assert_eq!(fs.copy_file_range(b, 0, e, 0, PAGE).unwrap(), PAGE);
    assert!(read_all(&fs, e) == b_data, "e after the reflink");
    assert!(read_all(&fs, b) == b_data, "b after the reflink");
    // A reflink into c, whose inline extent goes out as a regular one.
    let c_data = read_all(&fs, c);
    let mut c_model = c_data.clone();
    c_model.resize(2 * PAGE as usize, 0);
    c_model.extend_from_slice(&b_data);
    fs.copy_file_range(b, 0, c, 2 * PAGE, PAGE).unwrap();
    assert!(read_all(&fs, c) == c_model, "c after the reflink into it");
    // Preallocating beside d and appending past its page: no inline
    // extent beside others.
    let d_data = read_all(&fs, d);
    fs.fallocate(d, 2 * PAGE, PAGE, FallocateMode::AllocateKeepSize)
        .unwrap();
    let mut d_model = d_data.clone();
    let tail = common::compressible_text(9, 5000);
    fs.write_file(d, 3200, &tail).unwrap();
    d_model.extend_from_slice(&tail);
    assert!(read_all(&fs, d) == d_model, "d after fallocate and append");
    fs.sync().unwrap();
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after the changes");
    assert!(!kind_of(&dev, b).contains("inline"), "{}", kind_of(&dev, b));
    assert!(!kind_of(&dev, d).contains("inline"), "{}", kind_of(&dev, d));

    let fs = common::mount(dev.clone());
    assert!(read_all(&fs, a) == model, "a after the remount");
    assert!(read_all(&fs, b) == b_data, "b after the remount");
    assert!(read_all(&fs, c) == c_model, "c after the remount");
    assert!(read_all(&fs, d) == d_model, "d after the remount");
    assert!(read_all(&fs, e) == b_data, "e after the remount");
    fs.close().unwrap();
}

/// A damaged algorithm or length of a compressed inline extent: a
/// corruption error naming the inode and offset on read, a fault from
/// `birch check` (the decode, or `--verify-data`'s decompression), never a
/// panic.
#[test]
fn damaged_compressed_inline_fields_are_corruption_reports() {
    let dev = memory_fs();
    let fs = mount_with(dev.clone(), "zstd");
    let ino = create(&fs, "f", &common::compressible_text(10, 3000));
    fs.close().unwrap();
    let key = Key::new(ino, item_type::EXTENT_DATA, 0);
    let (leaf, slot, body) = common::leaf_with(&dev, tree_id::FS, key);
    assert_eq!(body[0], 4, "a compressed inline item");
    let image = dev.snapshot();
    let verify = |dev: &MemoryDevice| check_device_with(dev, CheckOptions { verify_data: true });
    // Fields that decode but do not give the data back: the other
    // algorithm, and another length the decode accepts.
    for (at, value, width) in [
        (ALGORITHM_AT, 2u64, 1),
        (RAM_BYTES_AT, 4096, 8),
        (RAM_BYTES_AT, 2999, 8),
    ] {
        let dev = Arc::new(MemoryDevice::from_bytes(image.clone()));
        common::patch_item(&dev, leaf, slot, |body| {
            body[at..at + width].copy_from_slice(&value.to_le_bytes()[..width])
        });
        let report = verify(&dev);
        assert!(
            report.faults_with(FaultId::CompressedUndecodable).count()
                + report.faults_with(FaultId::CompressedLength).count()
                > 0,
            "byte {at} = {value}:\n{report}"
        );
        let fs = common::mount(dev.clone());
        let err = fs.read_file(ino, 0, 10).unwrap_err();
        assert!(matches!(err, Error::Corrupt(_)), "{err}");
        let what = err.to_string();
        assert!(
            what.contains(&format!(
                "inode {ino} file offset 0 compressed inline extent"
            )),
            "{what}"
        );
        fs.close().unwrap();
    }
    // Fields the decode refuses: an item fault, and a read error.
    for (at, value, width) in [
        (ALGORITHM_AT, 0u64, 1),
        (ALGORITHM_AT, 0xff, 1),
        (RAM_BYTES_AT, 4097, 8),
        (RAM_BYTES_AT, u64::MAX, 8),
        (RAM_BYTES_AT, 0, 8),
        (RAM_BYTES_AT, 10, 8),
    ] {
        let dev = Arc::new(MemoryDevice::from_bytes(image.clone()));
        common::patch_item(&dev, leaf, slot, |body| {
            body[at..at + width].copy_from_slice(&value.to_le_bytes()[..width])
        });
        let report = verify(&dev);
        assert!(
            report.faults_with(FaultId::ItemUndecodable).count() > 0,
            "byte {at} = {value}:\n{report}"
        );
        let fs = common::mount(dev.clone());
        let err = fs.read_file(ino, 0, 10).unwrap_err();
        assert!(matches!(err, Error::Corrupt(_)), "{err}");
        fs.close().unwrap();
    }
}

fn recorder() -> Arc<RecordingDevice> {
    Arc::new(RecordingDevice::new(memory_fs().snapshot()))
}

fn content_is(v: &common::View, path: &str, wanted: &[&[u8]]) -> Result<(), String> {
    match v.get(path) {
        Some(d) if wanted.contains(&d.as_slice()) => Ok(()),
        Some(d) => Err(format!("{path}: {} bytes of unexpected content", d.len())),
        None => Err(format!("{path} missing")),
    }
}

/// Crash case `compressed_inline_fsync_crash`: the log copies the
/// compressed inline item as it is (and the superblock flag its log sync
/// writes); replay puts it back.
#[test]
fn compressed_inline_fsync_crash() {
    let rec = recorder();
    let fs = mount_with(rec.clone(), "zstd");
    let ino = create(&fs, "f", b"");
    fs.sync().unwrap();
    let from = rec.flush_count();
    let data = common::compressible_text(11, 3000);
    fs.write_file(ino, 0, &data).unwrap();
    fs.fsync(ino, false).unwrap();
    let fsynced = rec.flush_count();
    assert_eq!(fs.stats().compressed_inline_extents, 1);
    std::mem::forget(fs);
    let replayed = std::sync::atomic::AtomicUsize::new(0);
    let states =
        for_every_crash_mount_after(&rec, from, &Enumeration::thorough(31), |point, fs, v| {
            if fs.replay_outcome().is_some() {
                replayed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if point.flushes_completed >= fsynced {
                content_is(v, "/f", &[&data])
            } else {
                content_is(v, "/f", &[b"", &data])
            }
        });
    assert!(states > 2);
    assert!(replayed.into_inner() > 0, "no crash state replayed the log");
}

/// Crash case `compressed_inline_truncate_fsync_crash`: a committed
/// compressed inline file truncated into its data and fsynced: the log
/// holds the rewritten (smaller) inline item.
#[test]
fn compressed_inline_truncate_fsync_crash() {
    let rec = recorder();
    let fs = mount_with(rec.clone(), "lz4");
    let old = common::compressible_text(12, 4000);
    let ino = create(&fs, "f", &old);
    fs.sync().unwrap();
    let from = rec.flush_count();
    fs.truncate(ino, 1234).unwrap();
    fs.fsync(ino, false).unwrap();
    let fsynced = rec.flush_count();
    std::mem::forget(fs);
    let new = old[..1234].to_vec();
    let states =
        for_every_crash_mount_after(&rec, from, &Enumeration::thorough(32), |point, _, v| {
            if point.flushes_completed >= fsynced {
                content_is(v, "/f", &[&new])
            } else {
                content_is(v, "/f", &[&old, &new])
            }
        });
    assert!(states > 2);
}
