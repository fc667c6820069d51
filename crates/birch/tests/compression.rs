//! Transparent compression (docs/COMPRESSION.md): compressed extents are
//! written by writeback under `compress=` / `compress-force=`, read back
//! through decompression, split by punch, truncate, overwrite and reflink,
//! logged and replayed as they are; incompressible data is stored as it
//! is and the file gets NOCOMP (`m`); the compression property; damaged
//! compressed data is a
//! corruption error, never a panic; and the crash cases named in the doc,
//! each checked at every flush point.

mod common;

use birch::device::{BlockDevice, MemoryDevice, RecordingDevice};
use birch::error::Error;
use birch::format::{tree_id, COMPRESSION_PROPERTY_XATTR, SECTOR_SIZE};
use birch::fs::{
    inode_flags, read_superblock, CompressOption, DataChecksums, FallocateMode, Filesystem,
    MkfsOptions, MountOptions, XattrSetMode,
};
use common::{assert_clean_with_data as assert_clean, for_every_crash_mount_after, Enumeration};
use std::sync::Arc;

const IMAGE_BYTES: u64 = 64 << 20;
const BLOCK: usize = SECTOR_SIZE as usize;

fn memory_fs(checksums: DataChecksums) -> Arc<MemoryDevice> {
    let dev = Arc::new(MemoryDevice::new(IMAGE_BYTES));
    Filesystem::mkfs(
        dev.as_ref(),
        &MkfsOptions {
            fsid: Some([0xc0; 16]),
            data_checksums: checksums,
            ..Default::default()
        },
    )
    .unwrap();
    dev
}

fn options(compress: &str) -> MountOptions {
    let (value, force) = match compress.strip_prefix("force:") {
        Some(v) => (v, true),
        None => (compress, false),
    };
    MountOptions {
        compress: CompressOption::parse(value, force).unwrap(),
        ..MountOptions::deterministic()
    }
}

fn mount_with<D: BlockDevice + 'static>(dev: D, compress: &str) -> Filesystem<D> {
    Filesystem::open(dev, options(compress)).unwrap()
}

fn create<D: BlockDevice + 'static>(fs: &Filesystem<D>, name: &str, data: &[u8]) -> u64 {
    let ino = fs
        .create(fs.root_ino(), name.as_bytes(), 0o644, 0, 0)
        .unwrap()
        .ino;
    fs.write_file(ino, 0, data).unwrap();
    ino
}

fn read_all<D: BlockDevice + 'static>(fs: &Filesystem<D>, ino: u64) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    fs.read_file(ino, 0, size as usize).unwrap()
}

/// The file extent items of `ino` in the committed fs tree, as `birch
/// dump` prints them (which shows a compressed extent's algorithm and
/// lengths).
fn extents_of(dev: &MemoryDevice, ino: u64) -> Vec<String> {
    let sb = read_superblock(dev).unwrap();
    let (roots, _) = birch::check::tree_roots(dev, &sb);
    let fs_root = roots.iter().find(|r| r.tree == tree_id::FS).unwrap();
    let mut out = Vec::new();
    birch::print::tree(
        &mut out,
        dev,
        &sb.fsid,
        fs_root.tree,
        fs_root.bytenr,
        fs_root.level,
        fs_root.generation,
    )
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    let mut lines = text.lines();
    let mut extents = Vec::new();
    let wanted = format!("key ({ino} EXTENT_DATA ");
    while let Some(line) = lines.next() {
        if line.contains(&wanted) {
            extents.push(lines.next().unwrap().trim().to_string());
        }
    }
    extents
}

/// A number after `field ` in a dumped item.
fn field(item: &str, field: &str) -> u64 {
    let at = item.find(&format!("{field} ")).unwrap() + field.len() + 1;
    item[at..].split(' ').next().unwrap().parse().unwrap()
}

#[test]
fn compressed_files_read_back_after_remount_and_use_fewer_blocks() {
    for algorithm in ["zstd", "zstd:9", "lz4"] {
        let dev = memory_fs(DataChecksums::On);
        let fs = mount_with(dev.clone(), algorithm);
        let plain = common::compressible_text(1, 1 << 20);
        let random = common::incompressible_noise(2, 1 << 20);
        let a = create(&fs, "text", &plain);
        let b = create(&fs, "noise", &random);
        fs.sync().unwrap();
        let stats = fs.stats();
        assert_eq!(stats.compressed_bytes_in, 1 << 20, "{algorithm}");
        assert!(
            stats.compressed_bytes_out < (1 << 20) / 2,
            "{algorithm}: {stats:?}"
        );
        assert!(stats.compress_attempts_failed > 0, "{algorithm}");
        // du: the compressed file's blocks are what it takes on disk.
        let blocks = fs.getattr(a).unwrap().blocks;
        assert_eq!(blocks * 512, stats.compressed_bytes_out, "{algorithm}");
        assert_eq!(fs.getattr(b).unwrap().blocks * 512, 1 << 20, "{algorithm}");
        assert_eq!(read_all(&fs, a), plain);
        assert_eq!(read_all(&fs, b), random);
        fs.close().unwrap();
        assert_clean(dev.as_ref(), algorithm);
        assert!(read_superblock(dev.as_ref()).unwrap().compression);
        let extents = extents_of(&dev, a);
        assert_eq!(extents.len(), 8, "{algorithm}: 128 KiB chunks: {extents:?}");
        let name = algorithm.split(':').next().unwrap();
        for e in &extents {
            assert!(
                e.starts_with(&format!("extent compressed {name} ")),
                "{algorithm}: {e}"
            );
            assert_eq!(field(e, "ram_bytes"), 128 << 10, "{e}");
            assert!(
                field(e, "compressed_len") <= field(e, "disk_num_bytes"),
                "{e}"
            );
        }
        assert!(extents_of(&dev, b)
            .iter()
            .all(|e| e.starts_with("extent regular ")));
        // Read back by a mount without the option (reading needs none).
        let fs = common::mount(dev.clone());
        assert_eq!(read_all(&fs, a), plain);
        assert_eq!(read_all(&fs, b), random);
        // A read in the middle decompresses one chunk.
        assert_eq!(
            fs.read_file(a, 300_000, 5000).unwrap(),
            plain[300_000..305_000]
        );
        fs.close().unwrap();
    }
}

#[test]
fn image_without_compression_keeps_its_flag_clear() {
    let dev = memory_fs(DataChecksums::On);
    let fs = mount_with(dev.clone(), "zstd");
    create(&fs, "small", &common::incompressible_noise(3, 256 << 10));
    fs.sync().unwrap();
    fs.close().unwrap();
    // Nothing shrank: no compressed extent, no flag, as before.
    assert!(!read_superblock(dev.as_ref()).unwrap().compression);
    assert_clean(dev.as_ref(), "incompressible only");
}

/// btrfs's heuristic, kept: a chunk that does not shrink gives the file
/// `m` (NOCOMP) in its inode item, so neither a remount nor a truncate
/// makes writeback try it again; `chattr -m` does; `compress-force` tries
/// anyway and marks nothing.
#[test]
fn incompressible_file_gets_nocomp_and_keeps_it() {
    let dev = memory_fs(DataChecksums::On);
    let fs = mount_with(dev.clone(), "zstd");
    let ino = create(&fs, "f", &common::incompressible_noise(4, 512 << 10));
    fs.sync().unwrap();
    // Four chunks of 128 KiB in one writeback: the first does not shrink
    // and ends the tries (the file gives up on compression).
    assert_eq!(
        fs.stats().compress_attempts_failed,
        1,
        "only the first chunk is tried"
    );
    assert_ne!(fs.get_flags(ino).unwrap() & inode_flags::NOCOMP, 0);
    fs.close().unwrap();

    let fs = mount_with(dev.clone(), "zstd");
    let ino = fs.lookup(fs.root_ino(), b"f").unwrap().ino;
    assert_ne!(fs.get_flags(ino).unwrap() & inode_flags::NOCOMP, 0);
    // Truncated and rewritten with text: still not tried (btrfs keeps
    // NOCOMPRESS until the flags or the property change).
    fs.truncate(ino, 0).unwrap();
    fs.write_file(ino, 0, &common::compressible_text(6, 256 << 10))
        .unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.stats().compressed_bytes_in, 0);
    assert_eq!(fs.stats().compress_attempts_failed, 0);
    // chattr -m: tried again.
    let flags = fs.get_flags(ino).unwrap();
    fs.set_flags(ino, flags & !inode_flags::NOCOMP).unwrap();
    fs.write_file(ino, 0, &common::compressible_text(7, 256 << 10))
        .unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.stats().compressed_bytes_in, 256 << 10);
    fs.close().unwrap();

    // compress-force tries every writeback, and beats `m`.
    let fs = mount_with(dev.clone(), "force:zstd");
    let ino = create(&fs, "g", &common::incompressible_noise(7, 256 << 10));
    fs.sync().unwrap();
    assert_eq!(fs.get_flags(ino).unwrap() & inode_flags::NOCOMP, 0);
    assert_eq!(
        fs.stats().compress_attempts_failed,
        2,
        "compress-force tries both chunks"
    );
    let flags = fs.get_flags(ino).unwrap();
    fs.set_flags(ino, flags | inode_flags::NOCOMP).unwrap();
    fs.write_file(ino, 256 << 10, &common::compressible_text(8, 256 << 10))
        .unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.stats().compressed_bytes_in, 256 << 10);
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after force");
}

fn property_of<D: BlockDevice + 'static>(fs: &Filesystem<D>, ino: u64) -> Option<Vec<u8>> {
    match fs.getxattr(ino, COMPRESSION_PROPERTY_XATTR) {
        Ok(v) => Some(v),
        Err(Error::NoData) => None,
        Err(e) => panic!("getxattr: {e}"),
    }
}

fn set_property<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    ino: u64,
    value: &[u8],
) -> birch::Result<()> {
    fs.setxattr(
        ino,
        COMPRESSION_PROPERTY_XATTR,
        value,
        XattrSetMode::CreateOrReplace,
    )
}

/// The compression property (docs/COMPRESSION.md, "The property"), as
/// btrfs's: `lz4` on a directory sets its `c`, passes to a new file with
/// the property, and beats `compress=zstd` (the file's extents are lz4)
/// and the heuristic (incompressible data does not mark it); `none` sets
/// `m` and beats `compress=zstd`, passes on as the flag only; `zlib`,
/// `lzo` and junk are EINVAL and change nothing; `""` and removexattr
/// drop it and both flags; `chattr -c` drops it; all of it survives a
/// remount.
#[test]
fn compression_property_sets_flags_inherits_and_beats_the_mount_option() {
    let dev = memory_fs(DataChecksums::On);
    let fs = mount_with(dev.clone(), "zstd");
    let root = fs.root_ino();
    let fast = fs.mkdir(root, b"fast", 0o755, 0, 0).unwrap().ino;
    set_property(&fs, fast, b"lz4").unwrap();
    assert_eq!(property_of(&fs, fast).as_deref(), Some(&b"lz4"[..]));
    assert_eq!(
        fs.get_flags(fast).unwrap() & inode_flags::COMPR,
        inode_flags::COMPR
    );
    let f = fs.create(fast, b"f", 0o644, 0, 0).unwrap().ino;
    assert_eq!(property_of(&fs, f).as_deref(), Some(&b"lz4"[..]));
    fs.write_file(f, 0, &common::compressible_text(20, 256 << 10))
        .unwrap();
    let noisy = fs.create(fast, b"noise", 0o644, 0, 0).unwrap().ino;
    fs.write_file(noisy, 0, &common::incompressible_noise(21, 256 << 10))
        .unwrap();

    let never = fs.mkdir(root, b"never", 0o755, 0, 0).unwrap().ino;
    set_property(&fs, never, b"none").unwrap();
    let flags = fs.get_flags(never).unwrap();
    assert_eq!(
        flags & (inode_flags::COMPR | inode_flags::NOCOMP),
        inode_flags::NOCOMP
    );
    let g = fs.create(never, b"g", 0o644, 0, 0).unwrap().ino;
    assert_eq!(
        property_of(&fs, g),
        None,
        "`none` passes on as the flag only"
    );
    assert_ne!(fs.get_flags(g).unwrap() & inode_flags::NOCOMP, 0);
    fs.write_file(g, 0, &common::compressible_text(22, 256 << 10))
        .unwrap();

    for bad in [&b"zlib"[..], b"lzo", b"zstd:3", b"fast"] {
        let e = set_property(&fs, fast, bad).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{bad:?}");
    }
    assert_eq!(property_of(&fs, fast).as_deref(), Some(&b"lz4"[..]));
    fs.sync().unwrap();
    let f_extents = extents_of(&dev, f);
    assert!(
        !f_extents.is_empty() && f_extents.iter().all(|e| e.contains("compressed lz4")),
        "{f_extents:?}"
    );
    assert!(extents_of(&dev, g)
        .iter()
        .all(|e| !e.contains("compressed")));
    assert_eq!(
        fs.get_flags(noisy).unwrap() & inode_flags::NOCOMP,
        0,
        "a file with a property is not marked"
    );

    // "" and removexattr drop it and both flags; chattr -c drops it.
    set_property(&fs, never, b"").unwrap();
    assert_eq!(property_of(&fs, never), None);
    assert_eq!(
        fs.get_flags(never).unwrap() & (inode_flags::COMPR | inode_flags::NOCOMP),
        0
    );
    set_property(&fs, never, b"").unwrap();
    fs.removexattr(f, COMPRESSION_PROPERTY_XATTR).unwrap();
    assert_eq!(fs.get_flags(f).unwrap() & inode_flags::COMPR, 0);
    assert_eq!(
        fs.removexattr(f, COMPRESSION_PROPERTY_XATTR)
            .unwrap_err()
            .errno(),
        libc::ENODATA
    );
    let flags = fs.get_flags(noisy).unwrap();
    fs.set_flags(noisy, flags & !inode_flags::COMPR).unwrap();
    assert_eq!(property_of(&fs, noisy), None);
    fs.close().unwrap();

    let fs = mount_with(dev.clone(), "zstd");
    let fast = fs.lookup(fs.root_ino(), b"fast").unwrap().ino;
    assert_eq!(property_of(&fs, fast).as_deref(), Some(&b"lz4"[..]));
    let g = fs.lookup(never_dir(&fs), b"g").unwrap().ino;
    assert_ne!(fs.get_flags(g).unwrap() & inode_flags::NOCOMP, 0);
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after the property");
}

fn never_dir<D: BlockDevice + 'static>(fs: &Filesystem<D>) -> u64 {
    fs.lookup(fs.root_ino(), b"never").unwrap().ino
}

/// Punch, truncate into, overwrite part of, reflink from, preallocate
/// beside and zero part of compressed extents: every result against a
/// model of the file, then after a remount, `birch check` clean.
#[test]
fn punch_truncate_overwrite_reflink_and_fallocate_on_compressed_extents() {
    let dev = memory_fs(DataChecksums::On);
    let fs = mount_with(dev.clone(), "zstd");
    let mut model = common::compressible_text(9, 512 << 10);
    let a = create(&fs, "a", &model);
    fs.sync().unwrap();
    // Punch a hole inside the first chunk.
    fs.fallocate(
        a,
        8 * BLOCK as u64,
        3 * BLOCK as u64,
        FallocateMode::PunchHole,
    )
    .unwrap();
    model[8 * BLOCK..11 * BLOCK].fill(0);
    // Overwrite part of the second chunk, unaligned.
    let patch = b"overwritten in the middle of a compressed extent";
    let at = (128 << 10) + 1000;
    fs.write_file(a, at as u64, patch).unwrap();
    model[at..at + patch.len()].copy_from_slice(patch);
    // Zero a range across the second and third chunks.
    let (z0, z1) = (250 << 10, 270 << 10);
    fs.fallocate(
        a,
        z0 as u64,
        (z1 - z0) as u64,
        FallocateMode::ZeroRangeKeepSize,
    )
    .unwrap();
    model[z0..z1].fill(0);
    assert!(read_all(&fs, a) == model, "a after punch, overwrite, zero");
    fs.sync().unwrap();
    assert!(read_all(&fs, a) == model, "a after the sync");
    // Reflink a range that starts and ends inside compressed extents.
    let b = create(&fs, "b", b"");
    let (r0, r1) = (20 * BLOCK, 90 * BLOCK);
    assert_eq!(
        fs.copy_file_range(a, r0 as u64, b, 0, (r1 - r0) as u64)
            .unwrap(),
        (r1 - r0) as u64
    );
    let b_model = model[r0..r1].to_vec();
    assert!(read_all(&fs, b) == b_model, "b after the reflink");
    // Truncate into the third compressed chunk, then grow again.
    let cut = (300 << 10) + 123;
    fs.truncate(a, cut as u64).unwrap();
    model.truncate(cut);
    fs.fallocate(a, cut as u64, 64 << 10, FallocateMode::Allocate)
        .unwrap();
    model.resize(cut + (64 << 10), 0);
    assert!(read_all(&fs, a) == model, "a after truncate and fallocate");
    fs.sync().unwrap();
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after the changes");

    let fs = common::mount(dev.clone());
    assert!(read_all(&fs, a) == model, "a after the remount");
    assert!(read_all(&fs, b) == b_model, "b after the remount");
    fs.close().unwrap();
}

#[test]
fn damaged_compressed_data_is_a_corruption_naming_the_extent() {
    // Without data checksums the damage reaches the decompressor.
    let dev = memory_fs(DataChecksums::Off);
    let fs = mount_with(dev.clone(), "zstd");
    let ino = create(&fs, "f", &common::compressible_text(10, 128 << 10));
    fs.close().unwrap();
    let extents = extents_of(&dev, ino);
    assert!(extents[0].starts_with("extent compressed"), "{extents:?}");
    let disk_bytenr = field(&extents[0], "disk_bytenr");
    dev.write_at(&[0xa5; 64], disk_bytenr).unwrap();
    let fs = common::mount(dev.clone());
    let err = fs.read_file(ino, 4096, 10).unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    let what = err.to_string();
    assert!(
        what.contains(&format!(
            "inode {ino} file offset 4096 disk bytenr {disk_bytenr}"
        )),
        "{what}"
    );
    fs.close().unwrap();

    // With them, a bad block is EIO before decompression, as for any extent.
    let dev = memory_fs(DataChecksums::On);
    let fs = mount_with(dev.clone(), "lz4");
    let ino = create(&fs, "f", &common::compressible_text(11, 128 << 10));
    fs.close().unwrap();
    let extents = extents_of(&dev, ino);
    assert!(extents[0].starts_with("extent compressed"), "{extents:?}");
    let disk_bytenr = field(&extents[0], "disk_bytenr");
    dev.write_at(&[0xa5; 64], disk_bytenr).unwrap();
    let fs = common::mount(dev.clone());
    let err = fs.read_file(ino, 0, 10).unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert_eq!(fs.stats().data_csum_errors, 1);
    fs.close().unwrap();
}

fn recorder() -> Arc<RecordingDevice> {
    Arc::new(RecordingDevice::new(
        memory_fs(DataChecksums::On).snapshot(),
    ))
}

fn content_is(v: &common::View, path: &str, wanted: &[&[u8]]) -> Result<(), String> {
    match v.get(path) {
        Some(d) if wanted.contains(&d.as_slice()) => Ok(()),
        None if wanted.is_empty() => Ok(()),
        Some(d) => Err(format!("{path}: {} bytes of unexpected content", d.len())),
        None => Err(format!("{path} missing")),
    }
}

/// Crash case `compressed_write_commit_crash`.
#[test]
fn compressed_write_commit_crash() {
    let rec = recorder();
    let fs = mount_with(rec.clone(), "zstd");
    fs.sync().unwrap();
    let from = rec.flush_count();
    let data = common::compressible_text(12, 300 << 10);
    create(&fs, "f", &data);
    fs.sync().unwrap();
    assert!(fs.stats().compressed_bytes_in > 0);
    std::mem::forget(fs);
    let states = for_every_crash_mount_after(&rec, from, &Enumeration::thorough(21), |_, _, v| {
        content_is(v, "/f", &[&data]).or_else(|_| content_is(v, "/f", &[]))
    });
    assert!(states > 4);
}

/// Crash case `compressed_fsync_crash`: the log copies the compressed
/// extent (and its checksums) as it is; replay puts it back.
#[test]
fn compressed_fsync_crash() {
    let rec = recorder();
    let fs = mount_with(rec.clone(), "lz4");
    let old = common::compressible_text(13, 256 << 10);
    let ino = create(&fs, "f", &old);
    fs.sync().unwrap();
    let from = rec.flush_count();
    let more = common::compressible_text(14, 200 << 10);
    fs.write_file(ino, 100 << 10, &more).unwrap();
    fs.fsync(ino, false).unwrap();
    let fsynced = rec.flush_count();
    assert!(fs.stats().compressed_bytes_in > 256 << 10);
    std::mem::forget(fs);
    let mut new = old.clone();
    new.resize(300 << 10, 0);
    new[100 << 10..].copy_from_slice(&more);
    let replayed = std::sync::atomic::AtomicUsize::new(0);
    let states =
        for_every_crash_mount_after(&rec, from, &Enumeration::thorough(22), |point, fs, v| {
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
    assert!(replayed.into_inner() > 0, "no crash state replayed the log");
}

/// Crash case `first_compressed_extent_in_a_log_sync_crash`: the first
/// compressed extent of the image is published by an fsync, so the log
/// sync's superblock is the first to carry INCOMPAT_COMPRESSION; a crash
/// between its two copies leaves one copy with the flag and the new log,
/// the other with neither, at one generation (the crash explorer found
/// `birch check` calling that `superblock-copies-differ`).
#[test]
fn first_compressed_extent_in_a_log_sync_crash() {
    let rec = recorder();
    let fs = mount_with(rec.clone(), "zstd");
    let ino = create(&fs, "f", b"");
    fs.sync().unwrap();
    let from = rec.flush_count();
    let data = common::compressible_text(16, 200 << 10);
    fs.write_file(ino, 0, &data).unwrap();
    fs.fsync(ino, false).unwrap();
    let fsynced = rec.flush_count();
    assert!(fs.stats().compressed_bytes_in > 0);
    std::mem::forget(fs);
    assert!(read_superblock(rec.as_ref()).unwrap().compression);
    let states =
        for_every_crash_mount_after(&rec, from, &Enumeration::thorough(24), |point, _, v| {
            if point.flushes_completed >= fsynced {
                content_is(v, "/f", &[&data])
            } else {
                content_is(v, "/f", &[b"", &data])
            }
        });
    assert!(states > 4);
}

/// Crash case `compressed_truncate_and_punch_fsync_crash`: a truncate
/// into a compressed extent and a punch inside one, fsynced: the log
/// holds the pieces, each a range of the same compressed extent.
#[test]
fn compressed_truncate_and_punch_fsync_crash() {
    let rec = recorder();
    let fs = mount_with(rec.clone(), "zstd");
    let old = common::compressible_text(15, 384 << 10);
    let ino = create(&fs, "f", &old);
    fs.sync().unwrap();
    let from = rec.flush_count();
    fs.fallocate(ino, 40 << 10, 8 << 10, FallocateMode::PunchHole)
        .unwrap();
    fs.truncate(ino, (200 << 10) + 77).unwrap();
    fs.fsync(ino, false).unwrap();
    let fsynced = rec.flush_count();
    std::mem::forget(fs);
    let mut new = old.clone();
    new[40 << 10..48 << 10].fill(0);
    new.truncate((200 << 10) + 77);
    let states =
        for_every_crash_mount_after(&rec, from, &Enumeration::thorough(23), |point, _, v| {
            if point.flushes_completed >= fsynced {
                content_is(v, "/f", &[&new])
            } else {
                content_is(v, "/f", &[&old, &new])
            }
        });
    assert!(states > 2);
}

/// `chattr +c` (FS_COMPR_FL) on a mount without `compress=`: the file is
/// compressed (zstd), a `+c` directory passes the flag to what is created
/// in it, and other files stay as written.
#[test]
fn chattr_c_compresses_and_new_files_in_a_c_directory_inherit_it() {
    use birch::fs::inode_flags::COMPR;
    let dev = memory_fs(DataChecksums::On);
    let fs = common::mount(dev.clone());
    let root = fs.root_ino();
    let plain = create(&fs, "plain", &common::compressible_text(16, 256 << 10));
    let flagged = create(&fs, "flagged", b"");
    fs.set_flags(flagged, COMPR).unwrap();
    fs.write_file(flagged, 0, &common::compressible_text(17, 256 << 10))
        .unwrap();
    let dir = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    fs.set_flags(dir, COMPR).unwrap();
    let child = fs.create(dir, b"child", 0o644, 0, 0).unwrap().ino;
    let subdir = fs.mkdir(dir, b"sub", 0o755, 0, 0).unwrap().ino;
    assert_eq!(fs.get_flags(child).unwrap(), COMPR);
    assert_eq!(fs.get_flags(subdir).unwrap(), COMPR);
    fs.write_file(child, 0, &common::compressible_text(18, 256 << 10))
        .unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.stats().compressed_bytes_in, 512 << 10);
    fs.close().unwrap();
    assert!(extents_of(&dev, plain)
        .iter()
        .all(|e| e.starts_with("extent regular ")));
    for ino in [flagged, child] {
        let extents = extents_of(&dev, ino);
        assert!(
            extents
                .iter()
                .all(|e| e.starts_with("extent compressed zstd ")),
            "{extents:?}"
        );
    }
    assert_clean(dev.as_ref(), "after chattr +c");
}

/// Crash case `compression_property_fsync_crash`: the property `none`
/// set on a file, the file written, fsynced: after the fsync's flush the
/// recovered file has the property and its `m` flag (the xattr item and
/// the inode item's flags go through the log as any).
#[test]
fn compression_property_fsync_crash() {
    let rec = recorder();
    let fs = mount_with(rec.clone(), "zstd");
    let ino = create(&fs, "f", b"");
    fs.sync().unwrap();
    let from = rec.flush_count();
    set_property(&fs, ino, b"none").unwrap();
    let data = common::compressible_text(17, 200 << 10);
    fs.write_file(ino, 0, &data).unwrap();
    fs.fsync(ino, false).unwrap();
    let fsynced = rec.flush_count();
    assert_eq!(fs.stats().compressed_bytes_in, 0);
    std::mem::forget(fs);
    let states =
        for_every_crash_mount_after(&rec, from, &Enumeration::thorough(25), |point, fs, v| {
            if point.flushes_completed < fsynced {
                return content_is(v, "/f", &[b"", &data]);
            }
            content_is(v, "/f", &[&data])?;
            let f = fs.lookup(fs.root_ino(), b"f").unwrap().ino;
            if property_of(fs, f).as_deref() != Some(&b"none"[..]) {
                return Err("the property was lost".into());
            }
            if fs.get_flags(f).unwrap() & inode_flags::NOCOMP == 0 {
                return Err("the m flag was lost".into());
            }
            Ok(())
        });
    assert!(states > 2);
}

// ---- Metadata for compressed chunks (docs/COMPRESSION.md) ----

/// Fallocates a new file `filler` until what an ordinary change may still
/// reserve (`SpaceUsage::available`) is below `high` bytes, never below
/// `low`. Returns the filler's inode.
fn fill_until_available<D: BlockDevice + 'static>(fs: &Filesystem<D>, low: u64, high: u64) -> u64 {
    let filler = create(fs, "filler", b"");
    let target = (low + high) / 2;
    let mut size = 0;
    loop {
        let available = fs.space_usage().available;
        assert!(
            available >= low as i64,
            "the filler overshot: {:?}",
            fs.space_usage()
        );
        if available < high as i64 {
            return filler;
        }
        // A fallocate also costs its items (a few nodes): aim below the
        // middle by that much, and step by a sector at least.
        let len = (available as u64)
            .saturating_sub(target + (high - low) / 4)
            .max(SECTOR_SIZE)
            / SECTOR_SIZE
            * SECTOR_SIZE;
        fs.fallocate(filler, size, len, FallocateMode::Allocate)
            .unwrap();
        size += len;
    }
}

/// A device that, once armed, stops the first write it gets until
/// released: a writeback held between its plan and its publish, with its
/// extents in flight.
struct PauseFirstWrite {
    inner: Arc<MemoryDevice>,
    armed: std::sync::atomic::AtomicBool,
    paused: std::sync::Mutex<std::sync::mpsc::SyncSender<()>>,
    resume: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl PauseFirstWrite {
    fn new(
        inner: Arc<MemoryDevice>,
    ) -> (
        Arc<Self>,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (paused_tx, paused_rx) = std::sync::mpsc::sync_channel(1);
        let (resume_tx, resume_rx) = std::sync::mpsc::channel();
        let dev = Arc::new(PauseFirstWrite {
            inner,
            armed: Default::default(),
            paused: std::sync::Mutex::new(paused_tx),
            resume: std::sync::Mutex::new(resume_rx),
        });
        (dev, paused_rx, resume_tx)
    }
}

impl BlockDevice for PauseFirstWrite {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.paused.lock().unwrap().send(()).unwrap();
            self.resume.lock().unwrap().recv().unwrap();
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// A long run to compress becomes an extent per 128 KiB, but its writes
/// reserved one. With room, its writeback compresses it; near full it has
/// no room for the other extents, and writes the run as it is (one
/// extent): while its data write is in flight the reservations still fit
/// the free space (`free >= reserved`, the global reserve untouched).
/// Before, the plan took the extra extents unchecked: 192 extents of
/// 64 KiB (DUP) in flight where the run had reserved one, `available`
/// −11.4 MiB, 3.5 MiB past the 8 MiB global reserve.
#[test]
fn compressed_writeback_near_full_stays_within_its_reservation() {
    let (dev, paused_rx, resume_tx) = PauseFirstWrite::new(memory_fs(DataChecksums::On));
    let fs = mount_with(dev.clone(), "zstd");
    // With room: compressed, an extent per 128 KiB.
    let roomy = common::compressible_text(40, 1 << 20);
    let g = create(&fs, "g", &roomy);
    fs.fsync(g, false).unwrap();
    assert_eq!(fs.stats().compressed_bytes_in, 1 << 20);
    assert_eq!(fs.stats().compress_fallback_runs, 0);
    // Near full: 24 MiB dirty in one run (192 chunks), and the rest of
    // the free space preallocated but for less than 16 extents' room.
    let data = common::compressible_text(41, 24 << 20);
    let f = create(&fs, "f", &data);
    let per_extent = fs.space_usage().delalloc_metadata;
    fill_until_available(&fs, 4 * per_extent, 16 * per_extent);
    dev.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let during = std::thread::scope(|scope| {
        let fsync = scope.spawn(|| fs.fsync(f, false));
        paused_rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("the fsync's data write never reached the device");
        let during = fs.space_usage();
        resume_tx.send(()).unwrap();
        fsync.join().unwrap().expect("the fsync near full");
        during
    });
    assert!(
        during.available + during.global_reserve as i64 >= 0,
        "the writeback in flight reserved more than is free: {during:?}"
    );
    let stats = fs.stats();
    assert_eq!(stats.compress_fallback_runs, 1, "{stats:?}");
    assert_eq!(stats.compressed_bytes_in, 1 << 20, "{stats:?}");
    assert_eq!(fs.space_stats().writeback_extents_unreserved, 0);
    assert_eq!(fs.failure(), None);
    assert!(read_all(&fs, f) == data);
    fs.close().unwrap();
    let image = dev.inner.clone();
    assert_clean(image.as_ref(), "after the near-full fsync");
    assert!(extents_of(&image, f)
        .iter()
        .all(|e| e.starts_with("extent regular ")));
    assert_eq!(extents_of(&image, g).len(), 8);
    let fs = common::mount(image);
    assert!(read_all(&fs, f) == data);
    assert_eq!(read_all(&fs, g), roomy);
    fs.close().unwrap();
}

/// Bytes that compress to about half: each 4 KiB alternates 2 KiB of
/// text and 2 KiB of noise.
fn half_compressible(seed: u8, len: usize) -> Vec<u8> {
    let text = common::compressible_text(seed, len);
    let noise = common::incompressible_noise(u64::from(seed) + 1000, len);
    (0..len)
        .map(|i| if i % 4096 < 2048 { text[i] } else { noise[i] })
        .collect()
}

/// Near full under `compress=zstd`, ENOSPC is an answer (docs/DELALLOC.md
/// invariant 8): a 32 MiB image holding 400 small files (inline data and
/// xattrs: metadata) is filled with half-compressible files of 6 MiB
/// written 1 MiB at a time, an fsync every third write (runs of up to
/// 3 MiB: 24 chunks) and a sync every tenth, until writes are refused 16
/// times in a row. Every call answers Ok or
/// ENOSPC, the filesystem never turns read-only, no extent was made
/// without room for it, and after a sync and a remount every
/// acknowledged byte reads back and `birch check --verify-data` is clean.
#[test]
fn compressed_long_runs_to_enospc_answer_enospc_and_keep_every_byte() {
    let dev = Arc::new(MemoryDevice::new(32 << 20));
    Filesystem::mkfs(
        dev.as_ref(),
        &MkfsOptions {
            fsid: Some([0xc5; 16]),
            ..Default::default()
        },
    )
    .unwrap();
    let fs = mount_with(dev.clone(), "zstd");
    let root = fs.root_ino();
    let small = common::incompressible_noise(7, 2000);
    for i in 0..400 {
        let ino = create(&fs, &format!("small{i}"), &small);
        fs.setxattr(
            ino,
            b"user.pad",
            &[b'x'; 200],
            XattrSetMode::CreateOrReplace,
        )
        .unwrap();
    }
    fs.sync().unwrap();
    let ok_or_enospc = |what: &str, r: birch::error::Result<()>| match r {
        Ok(()) | Err(Error::NoSpace) => {}
        Err(e) => panic!("{what}: {e} (failure: {:?})", fs.failure()),
    };
    const FILE: usize = 6 << 20;
    const WRITE: usize = 1 << 20;
    // (inode, its data, bytes acknowledged)
    let mut files: Vec<(u64, Vec<u8>, usize)> = Vec::new();
    let (mut refused_in_a_row, mut writes) = (0, 0u64);
    while refused_in_a_row < 16 {
        if files.last().is_none_or(|(_, _, acked)| *acked >= FILE) {
            let name = format!("w{}", files.len());
            match fs.create(root, name.as_bytes(), 0o644, 0, 0) {
                Ok(attr) => {
                    let seed = files.len() as u8;
                    files.push((attr.ino, half_compressible(seed, FILE), 0));
                }
                Err(Error::NoSpace) => {
                    refused_in_a_row += 1;
                    continue;
                }
                Err(e) => panic!("create: {e} (failure: {:?})", fs.failure()),
            }
        }
        let (ino, data, acked) = files.last_mut().unwrap();
        writes += 1;
        let end = (*acked + WRITE).min(FILE);
        match fs.write_file(*ino, *acked as u64, &data[*acked..end]) {
            Ok(n) => {
                // A short write accepted what had room: the rest is asked
                // for again.
                refused_in_a_row = if *acked + n < end {
                    refused_in_a_row + 1
                } else {
                    0
                };
                *acked += n;
            }
            Err(Error::NoSpace) => refused_in_a_row += 1,
            Err(e) => panic!("write: {e} (failure: {:?})", fs.failure()),
        }
        if writes % 3 == 0 {
            ok_or_enospc("fsync", fs.fsync(*ino, false));
        }
        if writes % 10 == 0 {
            ok_or_enospc("sync", fs.sync());
        }
        assert_eq!(fs.failure(), None, "the filesystem turned read-only");
        assert!(writes < 2000, "never got full: {:?}", fs.space_usage());
    }
    let stats = fs.stats();
    let space = fs.space_stats();
    eprintln!(
        "{} files, {writes} writes; {stats:?}; {space:?}",
        files.len()
    );
    assert!(space.tickets_queued > 0, "never near full: tests nothing");
    assert!(stats.compressed_bytes_in > 0, "{stats:?}");
    assert!(stats.compress_fallback_runs > 0, "{stats:?}");
    assert_eq!(space.writeback_extents_unreserved, 0, "{space:?}");
    fs.sync().unwrap();
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "filled to ENOSPC under compress=zstd");
    let fs = common::mount(dev.clone());
    for (i, (ino, data, acked)) in files.iter().enumerate() {
        assert_eq!(fs.getattr(*ino).unwrap().size, *acked as u64, "w{i}");
        assert!(read_all(&fs, *ino) == data[..*acked], "w{i}: other bytes");
    }
    fs.close().unwrap();
}

/// Crash case `near_full_compressed_fsync_falls_back_crash`: near full,
/// the fsync's writeback has no room for a 2 MiB run's 16 extents and
/// writes it as it is; the log carries the one regular extent.
#[test]
fn near_full_compressed_fsync_falls_back_crash() {
    let rec = recorder();
    let fs = mount_with(rec.clone(), "zstd");
    let ino = create(&fs, "f", b"");
    fs.sync().unwrap();
    let from = rec.flush_count();
    let data = common::compressible_text(42, 2 << 20);
    fs.write_file(ino, 0, &data).unwrap();
    let per_extent = fs.space_usage().delalloc_metadata;
    fill_until_available(&fs, 2 * per_extent, 8 * per_extent);
    fs.fsync(ino, false).unwrap();
    let fsynced = rec.flush_count();
    let stats = fs.stats();
    assert_eq!(stats.compress_fallback_runs, 1, "{stats:?}");
    assert_eq!(stats.compressed_bytes_in, 0, "{stats:?}");
    std::mem::forget(fs);
    let states =
        for_every_crash_mount_after(&rec, from, &Enumeration::thorough(26), |point, _, v| {
            if point.flushes_completed >= fsynced {
                content_is(v, "/f", &[&data])
            } else {
                content_is(v, "/f", &[b"", &data])
            }
        });
    assert!(states > 2);
}
