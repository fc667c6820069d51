//! `birch check --verify-data` (docs/CHECK.md, "Verifying the data"): on
//! an image with compressed (zstd and lz4), uncompressed, reflinked and
//! snapshot-shared extents, every data extent is read once and the image
//! is clean; one damaged byte of a compressed extent is a checksum fault;
//! a valid compressed stream of another length, its checksums made to
//! match, is a length fault; a damaged algorithm byte or length field is
//! a fault, never a panic or a large allocation.

mod common;

use birch::check::{check_device, check_device_with, CheckOptions, CheckReport, FaultId};
use birch::device::{BlockDevice, MemoryDevice};
use birch::format::{
    block_csum, item_type, tree_id, CompressedRef, DiskRef, FileExtent, Key, NodeBody,
    COMPRESSION_PROPERTY_XATTR, SECTOR_SIZE,
};
use birch::fs::{
    read_superblock, CompressOption, DataChecksums, Filesystem, MkfsOptions, MountOptions,
    XattrSetMode,
};
use std::sync::Arc;

const IMAGE_BYTES: u64 = 64 << 20;
const BLOCK: u64 = SECTOR_SIZE;
/// Offsets in a compressed file extent item's body.
const RAM_BYTES_AT: usize = 33;
const ALGORITHM_AT: usize = 49;

/// The test image and where its files are.
struct Image {
    dev: Arc<MemoryDevice>,
    /// The subvolume holding the files (snapshotted as `snap`).
    subvol: u64,
    /// A file of three zstd extents (mount option `compress=zstd`), by
    /// its inode number in the subvolume (its items' objectid).
    zstd_file: u64,
    /// A file of two lz4 extents (its compression property).
    lz4_file: u64,
}

/// An inode number as the subvolume's items key it (the engine's inode
/// numbers carry the subvolume id above bit 40).
fn in_tree(ino: u64) -> u64 {
    ino & ((1 << 40) - 1)
}

/// A subvolume `sv` with a zstd file, an lz4 file (property), an
/// incompressible file and a file reflinking ranges of both; a snapshot
/// of it; everything committed.
fn build() -> Image {
    let dev = Arc::new(MemoryDevice::new(IMAGE_BYTES));
    Filesystem::mkfs(
        dev.as_ref(),
        &MkfsOptions {
            fsid: Some([0x7d; 16]),
            data_checksums: DataChecksums::On,
            ..Default::default()
        },
    )
    .unwrap();
    let options = MountOptions {
        compress: CompressOption::parse("zstd", false).unwrap(),
        ..MountOptions::deterministic()
    };
    let fs = Filesystem::open(dev.clone(), options).unwrap();
    let root = fs.root_ino();
    let subvol = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = common::ino(&fs, "sv");
    let create = |name: &str| fs.create(sv, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
    let zstd_file = create("z");
    fs.write_file(zstd_file, 0, &common::compressible_text(1, 300 << 10))
        .unwrap();
    let lz4_file = create("l");
    fs.setxattr(
        lz4_file,
        COMPRESSION_PROPERTY_XATTR,
        b"lz4",
        XattrSetMode::Create,
    )
    .unwrap();
    fs.write_file(lz4_file, 0, &common::compressible_text(2, 200 << 10))
        .unwrap();
    let plain = create("n");
    fs.write_file(plain, 0, &common::incompressible_noise(3, 96 << 10))
        .unwrap();
    fs.sync().unwrap();
    let copy = create("r");
    // copy_file_range may copy less than asked: call until done.
    let reflink = |from: u64, from_at: u64, to_at: u64, len: u64| {
        let mut done = 0;
        while done < len {
            let n = fs
                .copy_file_range(from, from_at + done, copy, to_at + done, len - done)
                .unwrap();
            assert!(n > 0);
            done += n;
        }
    };
    reflink(zstd_file, 20 * BLOCK, 0, 50 * BLOCK);
    reflink(plain, 0, 50 * BLOCK, 8 * BLOCK);
    fs.sync().unwrap();
    fs.create_snapshot(subvol, root, b"snap", false).unwrap();
    fs.close().unwrap();
    Image {
        dev,
        subvol,
        zstd_file: in_tree(zstd_file),
        lz4_file: in_tree(lz4_file),
    }
}

fn verify(dev: &MemoryDevice) -> CheckReport {
    check_device_with(dev, CheckOptions { verify_data: true })
}

/// The first file extent item of `ino` in subvolume `tree`: (where, the
/// disk extent, its compression).
fn first_extent(
    dev: &MemoryDevice,
    tree: u64,
    ino: u64,
) -> ((u64, usize), DiskRef, Option<CompressedRef>) {
    let key = Key::new(ino, item_type::EXTENT_DATA, 0);
    let (bytenr, slot, data) = common::leaf_with(dev, tree, key);
    let extent = FileExtent::decode(&data).unwrap();
    (
        (bytenr, slot),
        extent.disk_ref().unwrap(),
        extent.compressed_ref(),
    )
}

/// Sets the checksums of the blocks of `[start, start + len)` to what
/// the device now holds there.
fn fix_checksums(dev: &MemoryDevice, start: u64, len: u64) {
    let sb = read_superblock(dev).unwrap();
    let (roots, _) = birch::check::tree_roots(dev, &sb);
    let root = roots.into_iter().find(|r| r.tree == tree_id::CSUM).unwrap();
    let (nodes, _) = birch::check::tree_nodes(dev, &sb.fsid, root);
    for block in (start..start + len).step_by(BLOCK as usize) {
        let mut data = vec![0u8; BLOCK as usize];
        dev.read_at(&mut data, block).unwrap();
        let sum = block_csum(&data).to_le_bytes();
        let (bytenr, slot, index) = nodes
            .iter()
            .find_map(|(bytenr, node)| match &node.body {
                NodeBody::Leaf(items) => items.iter().enumerate().find_map(|(slot, i)| {
                    let count = (i.data.len() / 4) as u64;
                    let first = i.key.offset;
                    (first <= block && block < first + count * BLOCK)
                        .then(|| (*bytenr, slot, ((block - first) / BLOCK) as usize))
                }),
                NodeBody::Internal(_) => None,
            })
            .unwrap_or_else(|| panic!("no checksum of block {block}"));
        common::patch_item(dev, bytenr, slot, |body| {
            body[index * 4..index * 4 + 4].copy_from_slice(&sum)
        });
    }
}

fn fault_ids(report: &CheckReport) -> Vec<FaultId> {
    report.faults.iter().map(|f| f.id).collect()
}

#[test]
fn clean_image_reads_every_data_extent_once() {
    let img = build();
    let report = verify(&img.dev);
    assert!(report.is_clean(), "{report}");
    let s = &report.summary;
    let verified = s.data_verified.expect("pass data ran");
    // Every data extent has checksums or is compressed: each is read,
    // once, although reflinks and the snapshot share them.
    assert_eq!(verified.extents, s.data_extents, "{report}");
    assert_eq!(verified.bytes, s.data_extent_bytes, "{report}");
    // Three zstd chunks and two lz4 ones, the reflinked ones among them.
    assert_eq!(verified.decompressed, 5, "{report}");
    assert!(s.compressed_extent_items > 5, "{report}");
    assert!(
        report.to_string().contains("data: read "),
        "the summary says what was read:\n{report}"
    );
    // Without the option, no data is read.
    assert_eq!(check_device(img.dev.as_ref()).summary.data_verified, None);
}

#[test]
fn a_damaged_byte_of_a_compressed_extent_is_a_checksum_fault() {
    let img = build();
    let (_, disk, compressed) = first_extent(&img.dev, img.subvol, img.zstd_file);
    assert!(compressed.is_some(), "z is compressed");
    let at = disk.disk_bytenr + 100;
    let mut byte = [0u8];
    img.dev.read_at(&mut byte, at).unwrap();
    img.dev.write_at(&[byte[0] ^ 0x20], at).unwrap();
    // The metadata is intact: only reading the data finds it.
    assert!(check_device(img.dev.as_ref()).is_clean());
    let report = verify(&img.dev);
    assert_eq!(fault_ids(&report), [FaultId::DataCsumMismatch], "{report}");
    let fault = report.faults[0].to_string();
    assert!(
        fault.contains(&format!(
            "data extent {}+{}",
            disk.disk_bytenr, disk.disk_num_bytes
        )) && fault.contains(&format!("block {}", disk.disk_bytenr)),
        "{fault}"
    );
    // The item that names it: the file's, at offset 0, in the subvolume
    // (the snapshot shares the leaf) or in the reflinking file's tree.
    assert_eq!(report.faults[0].tree, Some(img.subvol), "{fault}");
}

/// A zstd stream of `data` padded with a skippable frame to exactly
/// `len` bytes: valid, with another length than the extent records.
fn zstd_stream_of_length(data: &[u8], len: usize) -> Vec<u8> {
    let mut out = zstd::bulk::compress(data, 3).unwrap();
    let pad = len - out.len() - 8;
    out.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
    out.extend_from_slice(&(pad as u32).to_le_bytes());
    out.resize(len, 0);
    out
}

#[test]
fn a_valid_stream_of_another_length_is_a_length_fault() {
    let img = build();
    let (_, disk, compressed) = first_extent(&img.dev, img.subvol, img.zstd_file);
    let compressed = compressed.unwrap();
    assert_eq!(compressed.ram_bytes, 128 << 10);
    // Half the recorded length, in exactly the recorded compressed bytes.
    let stream = zstd_stream_of_length(&[b'x'; 64 << 10], compressed.compressed_len as usize);
    let mut on_disk = vec![0u8; disk.disk_num_bytes as usize];
    on_disk[..stream.len()].copy_from_slice(&stream);
    img.dev.write_at(&on_disk, disk.disk_bytenr).unwrap();
    fix_checksums(&img.dev, disk.disk_bytenr, disk.disk_num_bytes);
    assert!(check_device(img.dev.as_ref()).is_clean());
    let report = verify(&img.dev);
    assert_eq!(fault_ids(&report), [FaultId::CompressedLength], "{report}");
    let fault = report.faults[0].to_string();
    assert!(
        fault.contains("decompresses to 65536 bytes") && fault.contains("decompress to 131072"),
        "{fault}"
    );

    // lz4 (block format, read to its end): a block of literals only,
    // exactly the recorded compressed length, gives fewer bytes than the
    // item records.
    let (_, disk, compressed) = first_extent(&img.dev, img.subvol, img.lz4_file);
    let compressed = compressed.unwrap();
    let block = lz4_literals_of_length(compressed.compressed_len as usize);
    let mut on_disk = vec![0u8; disk.disk_num_bytes as usize];
    on_disk[..block.len()].copy_from_slice(&block);
    img.dev.write_at(&on_disk, disk.disk_bytenr).unwrap();
    fix_checksums(&img.dev, disk.disk_bytenr, disk.disk_num_bytes);
    let report = verify(&img.dev);
    assert_eq!(
        fault_ids(&report),
        [FaultId::CompressedLength, FaultId::CompressedLength],
        "{report}"
    );
}

/// An lz4 block of `len` bytes holding only literals (a token, its
/// length bytes, the literals), so it decompresses to fewer bytes.
fn lz4_literals_of_length(len: usize) -> Vec<u8> {
    let encode = |literals: usize| {
        let mut out = vec![0xf0u8];
        let mut rest = literals - 15;
        while rest >= 255 {
            out.push(255);
            rest -= 255;
        }
        out.push(rest as u8);
        out.resize(out.len() + literals, b'z');
        out
    };
    (15..len)
        .rev()
        .map(encode)
        .find(|b| b.len() == len)
        .unwrap_or_else(|| panic!("no literal block of exactly {len} bytes"))
}

#[test]
fn damaged_algorithm_and_length_fields_are_faults_not_panics() {
    let base = build();
    let (item, disk, compressed) = first_extent(&base.dev, base.subvol, base.zstd_file);
    assert!(compressed.is_some());
    let image = base.dev.snapshot();
    // Another known algorithm: the item decodes, its bytes do not.
    let dev = MemoryDevice::from_bytes(image.clone());
    common::patch_item(&dev, item.0, item.1, |body| body[ALGORITHM_AT] = 2);
    assert!(check_device(&dev).is_clean());
    let report = verify(&dev);
    assert_eq!(report.fault_count(), 1, "{report}");
    assert!(
        matches!(
            report.faults[0].id,
            FaultId::CompressedUndecodable | FaultId::CompressedLength
        ),
        "{report}"
    );
    assert!(
        report.faults[0]
            .to_string()
            .contains(&format!("data extent {}", disk.disk_bytenr)),
        "{report}"
    );
    // Unknown algorithms and lengths past the 128 KiB chunk limit do not
    // decode: item faults, and nothing is allocated or decompressed.
    for (at, value) in [
        (ALGORITHM_AT, 0u64),
        (ALGORITHM_AT, 3),
        (ALGORITHM_AT, 0xff),
        (RAM_BYTES_AT, (128 << 10) + 4096),
        (RAM_BYTES_AT, u64::MAX - 4095),
        (RAM_BYTES_AT, u64::MAX),
    ] {
        let dev = MemoryDevice::from_bytes(image.clone());
        common::patch_item(&dev, item.0, item.1, |body| {
            let width = if at == ALGORITHM_AT { 1 } else { 8 };
            body[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
        });
        let report = verify(&dev);
        assert!(
            report.faults_with(FaultId::ItemUndecodable).count() > 0,
            "byte {at} = {value:#x}:\n{report}"
        );
    }
}
