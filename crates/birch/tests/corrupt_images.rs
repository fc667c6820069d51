//! `birch check` against damaged images: each damage must produce a fault
//! naming the right pass, block/key and reason, and nothing may panic.
//!
//! Images come from `birch::check::fixture` (hand-built, exactly known
//! layout) and, for the clean baselines, from the engine's own mkfs.

use birch::check::fixture::{sample, Fixture, FsBuilder};
use birch::check::{check_device, pass_id, CheckReport, Fault, FaultId};
use birch::device::MemoryDevice;
use birch::format::{
    item_type, tree_id, ExtentItem, InodeItem, Key, KeyPtr, LeafItem, Node, NodeBody, RootItem,
    FIRST_ALLOCATABLE_BYTE, NODE_SIZE, ROOT_DIR_INO, SUPERBLOCK_OFFSETS,
};
use birch::fs::{Filesystem, MkfsOptions, MountOptions};
use std::sync::Arc;

// Inode numbers of `fixture::sample()`.
const A: u64 = 257;
const D: u64 = 258;
const B: u64 = 259;
const L: u64 = 260;
const ORPHAN: u64 = 261;

fn check(fx: &Fixture) -> CheckReport {
    check_device(&fx.device())
}

/// Finds a fault `id` satisfying `pred`, or fails showing the report.
fn expect_fault(report: &CheckReport, id: FaultId, pred: impl Fn(&Fault) -> bool) -> &Fault {
    assert!(
        !report.is_clean(),
        "expected a [{id}] fault, got a clean report:\n{report}"
    );
    report
        .faults_with(id)
        .find(|f| pred(f))
        .unwrap_or_else(|| panic!("no matching [{id}] fault in:\n{report}"))
}

/// Whether the report warns `id` about the superblock copy at `copy`.
fn warns_about_copy(report: &CheckReport, id: FaultId, copy: u64) -> bool {
    let copy = copy.to_string();
    report.warnings_with(id).any(|w| {
        w.reason
            .strip_prefix("superblock copy at ")
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            == Some(copy.as_str())
    })
}

fn assert_clean(report: &CheckReport) {
    assert!(report.is_clean(), "expected clean:\n{report}");
}

fn leaf_with(fx: &Fixture, tree: u64, key: Key) -> (u64, usize) {
    fx.find_item(tree, key)
        .unwrap_or_else(|| panic!("fixture has no {key} in tree {tree}"))
}

// ----- clean baselines -----

#[test]
fn sample_fixture_is_clean() {
    let fx = sample().build();
    let report = check(&fx);
    assert_clean(&report);
    assert!(report.warnings.is_empty(), "{report}");
    let s = &report.summary;
    assert_eq!(
        (s.inodes, s.directories, s.regular_files, s.symlinks),
        (6, 2, 3, 1)
    );
    assert_eq!(s.data_extents, 2);
    assert_eq!(s.bytes_used_counted, s.bytes_used_recorded);
    assert_eq!(
        s.free_bytes,
        s.total_bytes - FIRST_ALLOCATABLE_BYTE - s.bytes_used_counted
    );
    let text = report.to_string();
    assert!(text.contains("result: clean"), "{text}");
}

#[test]
fn deep_fixture_is_clean() {
    let mut b = sample();
    for i in 0..300 {
        let ino = b.create(ROOT_DIR_INO, format!("file-{i:04}").as_bytes());
        b.write_inline(ino, format!("content {i}").as_bytes());
    }
    b.leaf_items_max = 7;
    b.ptrs_max = 4;
    let fx = b.build();
    let report = check(&fx);
    assert_clean(&report);
    let fs = report
        .summary
        .trees
        .iter()
        .find(|t| t.id == tree_id::FS)
        .expect("fs tree summary");
    assert!(fs.level >= 3, "{report}");
}

#[test]
fn mkfs_image_is_clean() {
    let dev = MemoryDevice::new(16 << 20);
    Filesystem::mkfs(&dev, &MkfsOptions::default()).expect("mkfs");
    let report = check_device(&dev);
    assert_clean(&report);
    assert!(report.warnings.is_empty(), "{report}");
    assert_eq!(report.summary.inodes, 1);
}

#[test]
fn engine_image_after_a_workload_is_clean() {
    let dev = Arc::new(MemoryDevice::new(32 << 20));
    Filesystem::mkfs(&dev, &MkfsOptions::default()).expect("mkfs");
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).expect("open");
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"dir", 0o755, 0, 0).unwrap();
    let f = fs.create(d.ino, b"file", 0o644, 0, 0).unwrap();
    fs.write_file(f.ino, 0, &vec![7u8; 50_000]).unwrap();
    fs.create(root, b"small", 0o644, 0, 0).unwrap();
    fs.symlink(root, b"link", b"dir/file", 0, 0).unwrap();
    fs.link(f.ino, root, b"hard").unwrap();
    for i in 0..300 {
        fs.create(d.ino, format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
    }
    fs.sync().unwrap();
    assert_clean(&check_device(dev.as_ref()));
    for i in (0..300).step_by(3) {
        fs.unlink(d.ino, format!("f{i}").as_bytes()).unwrap();
    }
    fs.close().unwrap();
    let report = check_device(dev.as_ref());
    assert_clean(&report);
    assert_eq!(report.summary.inodes, 1 + 1 + 1 + 1 + 1 + 200);
}

// ----- superblock -----

#[test]
fn truncated_device() {
    let fx = sample().build();
    // Both superblock copies survive, every tree node is gone.
    let cut = 512 * 1024;
    let report = check_device(&MemoryDevice::from_bytes(fx.image[..cut].to_vec()));
    assert!(report.found_filesystem());
    expect_fault(&report, FaultId::FilesystemPastDeviceEnd, |_| true);
    let root = fx.superblock.root_tree_bytenr;
    expect_fault(&report, FaultId::NodeOutsideDevice, |f| {
        f.block == Some(root) && f.tree == Some(tree_id::ROOT)
    });

    // Cut inside the metadata: the nodes past the end are named.
    let cut = FIRST_ALLOCATABLE_BYTE as usize + 2 * NODE_SIZE;
    let report = check_device(&MemoryDevice::from_bytes(fx.image[..cut].to_vec()));
    let fs_root = fx.root_of(tree_id::FS).bytenr;
    expect_fault(&report, FaultId::NodeOutsideDevice, |f| {
        f.block == Some(fs_root)
    });

    // Cut before the second superblock copy: a warning for it, faults for the rest.
    let report = check_device(&MemoryDevice::from_bytes(fx.image[..100 * 1024].to_vec()));
    assert!(
        warns_about_copy(
            &report,
            FaultId::SuperblockPastDeviceEnd,
            SUPERBLOCK_OFFSETS[1]
        ),
        "{report}"
    );
    assert!(!report.is_clean());

    // Nothing left at all.
    for len in [0, 1000, 65536 + 10] {
        let report = check_device(&MemoryDevice::from_bytes(fx.image[..len].to_vec()));
        assert!(!report.found_filesystem() && !report.is_clean());
        assert!(report.unreadable_reason().is_some());
        expect_fault(&report, FaultId::SuperblockPastDeviceEnd, |_| true);
    }
}

#[test]
fn wrong_magic_in_both_copies() {
    let mut fx = sample().build();
    for off in SUPERBLOCK_OFFSETS {
        fx.image[off as usize + 8] ^= 0xff;
    }
    let report = check(&fx);
    assert!(!report.found_filesystem());
    for off in SUPERBLOCK_OFFSETS {
        expect_fault(&report, FaultId::SuperblockMagic, |f| {
            f.reason.starts_with(&format!("superblock copy at {off}:"))
        });
    }
    assert!(report.unreadable_reason().is_some());
    // The later passes say why they did not run.
    assert!(report
        .passes
        .iter()
        .any(|(id, s)| *id == pass_id::NAMESPACE
            && matches!(s, birch::check::PassStatus::Skipped(_))));
}

#[test]
fn bad_checksum_in_one_superblock_copy_falls_back_and_warns() {
    let mut fx = sample().build();
    fx.image[SUPERBLOCK_OFFSETS[0] as usize + 200] ^= 1;
    let report = check(&fx);
    assert_clean(&report);
    assert_eq!(report.summary.superblock_copy, Some(SUPERBLOCK_OFFSETS[1]));
    assert!(
        warns_about_copy(&report, FaultId::SuperblockChecksum, SUPERBLOCK_OFFSETS[0]),
        "{report}"
    );
}

#[test]
fn stale_superblock_copy_warns_and_newest_wins() {
    let mut fx = sample().build();
    let mut old = fx.superblock.clone();
    old.generation -= 1;
    let bytes = old.encode(SUPERBLOCK_OFFSETS[1]);
    let off = SUPERBLOCK_OFFSETS[1] as usize;
    fx.image[off..off + bytes.len()].copy_from_slice(&bytes);
    let report = check(&fx);
    assert_clean(&report);
    assert_eq!(report.summary.superblock_copy, Some(SUPERBLOCK_OFFSETS[0]));
    assert!(
        warns_about_copy(&report, FaultId::SuperblockStale, SUPERBLOCK_OFFSETS[1]),
        "{report}"
    );
}

// ----- tree structure -----

#[test]
fn bad_checksum_in_a_node() {
    let mut fx = sample().build();
    let (block, _) = leaf_with(&fx, tree_id::FS, Key::new(A, item_type::INODE_ITEM, 0));
    fx.image[block as usize + 5000] ^= 0x40;
    let report = check(&fx);
    let f = expect_fault(&report, FaultId::NodeChecksum, |f| f.block == Some(block));
    assert_eq!(f.tree, Some(tree_id::FS));
    assert_eq!(f.pass, pass_id::TREE_STRUCTURE);
    assert!(
        f.to_string().starts_with(&format!(
            "[node-checksum] corrupt node: tree=fs(5) block={block}:"
        )),
        "{f}"
    );
}

#[test]
fn keys_out_of_order_within_a_node() {
    let mut fx = sample().build();
    let (block, _) = leaf_with(&fx, tree_id::FS, Key::new(A, item_type::INODE_ITEM, 0));
    fx.modify_node(block, |n| {
        if let NodeBody::Leaf(items) = &mut n.body {
            items.swap(3, 4);
        }
    });
    let report = check(&fx);
    let f = expect_fault(&report, FaultId::NodeKeyOrder, |f| {
        f.block == Some(block) && f.slot == Some(4)
    });
    assert!(!f.reason.starts_with("slot="), "slot printed twice: {f}");
}

#[test]
fn keys_out_of_order_across_nodes() {
    let mut b = sample();
    b.leaf_items_max = 4;
    let mut fx = b.build();
    // The second fs leaf gets a first key below its parent's key (its own
    // items stay sorted, the checksum is valid).
    let leaves: Vec<u64> = fx
        .nodes
        .iter()
        .filter(|n| n.tree == tree_id::FS && n.level == 0)
        .map(|n| n.bytenr)
        .collect();
    let victim = leaves[1];
    fx.modify_node(victim, |n| {
        if let NodeBody::Leaf(items) = &mut n.body {
            items[0].key = Key::new(ROOT_DIR_INO, 0, 0);
        }
    });
    let report = check(&fx);
    expect_fault(&report, FaultId::NodeFirstKey, |f| {
        f.block == Some(victim) && f.slot == Some(0)
    });
}

#[test]
fn child_pointer_to_a_block_of_another_tree() {
    let mut b = sample();
    b.leaf_items_max = 4;
    let mut fx = b.build();
    let fs_root = fx.root_of(tree_id::FS);
    assert!(fs_root.level >= 1);
    let ext_leaf = fx
        .nodes
        .iter()
        .find(|n| n.tree == tree_id::EXTENT && n.level == 0)
        .copied()
        .unwrap();
    let gen = fx.superblock.generation;
    fx.modify_node(fs_root.bytenr, |n| {
        if let NodeBody::Internal(ptrs) = &mut n.body {
            ptrs[1].blockptr = ext_leaf.bytenr;
            ptrs[1].generation = gen;
        }
    });
    let report = check(&fx);
    let f = expect_fault(&report, FaultId::NodeCrossTree, |f| {
        f.block == Some(ext_leaf.bytenr) && f.tree == Some(tree_id::FS)
    });
    // The fault names the pointer that led there.
    assert!(
        f.reason
            .contains(&format!("block {} slot 1", fs_root.bytenr)),
        "{f}"
    );
}

#[test]
fn child_pointer_into_a_foreign_unvisited_block() {
    // The fs tree's root item points at the extent tree's root, which the
    // walk of the extent tree reached first.
    let mut fx = sample().build();
    let ext_root = fx.root_of(tree_id::EXTENT).bytenr;
    let fs_root = fx.root_of(tree_id::FS);
    let gen = fx.superblock.generation;
    fx.modify_item(
        tree_id::ROOT,
        Key::new(tree_id::FS, item_type::ROOT_ITEM, 0),
        |d| {
            *d = RootItem {
                bytenr: ext_root,
                generation: gen,
                level: fs_root.level,
            }
            .encode();
        },
    );
    let report = check(&fx);
    expect_fault(&report, FaultId::NodeCrossTree, |f| {
        f.block == Some(ext_root) && f.tree == Some(tree_id::FS)
    });
    // The fs tree could not be read: its passes say so instead of flooding.
    assert!(
        report
            .passes
            .iter()
            .any(|(id, s)| *id == pass_id::NLINK
                && matches!(s, birch::check::PassStatus::Skipped(_))),
        "{report}"
    );
}

#[test]
fn cycle_in_a_tree_terminates() {
    let mut b = sample();
    b.leaf_items_max = 3;
    b.ptrs_max = 3;
    let mut fx = b.build();
    let fs_root = fx.root_of(tree_id::FS);
    assert!(fs_root.level >= 2);
    let child = fx.node(fs_root.bytenr).key_ptrs()[0];
    // A level-1 node pointing back at... itself, claiming level 0: the
    // level check or the visited set stops it; either way it ends.
    fx.modify_node(child.blockptr, |n| {
        let gen = n.generation;
        let me = n.bytenr;
        if let NodeBody::Internal(ptrs) = &mut n.body {
            ptrs[0] = KeyPtr {
                key: ptrs[0].key,
                blockptr: me,
                generation: gen,
            };
        }
    });
    let report = check(&fx);
    assert!(
        report.faults.iter().any(|f| f.block == Some(child.blockptr)
            && matches!(f.id, FaultId::NodeLevel | FaultId::NodeReachedTwice)),
        "{report}"
    );
}

#[test]
fn node_newer_than_the_superblock() {
    let mut fx = sample().build();
    let mut sb = fx.superblock.clone();
    sb.generation -= 1;
    fx.write_superblock(&sb);
    let report = check(&fx);
    expect_fault(&report, FaultId::NodeGeneration, |f| {
        f.tree == Some(tree_id::ROOT)
    });
}

#[test]
fn missing_root_item() {
    let mut fx = sample().build();
    let root = fx.root_of(tree_id::ROOT).bytenr;
    fx.modify_node(root, |n| {
        if let NodeBody::Leaf(items) = &mut n.body {
            items.retain(|i| i.key.objectid != tree_id::FS);
        }
    });
    let report = check(&fx);
    expect_fault(&report, FaultId::RootItemMissing, |f| {
        f.key == Some(Key::new(tree_id::FS, item_type::ROOT_ITEM, 0))
    });
}

#[test]
fn undecodable_item_names_its_key() {
    let mut fx = sample().build();
    let key = Key::new(B, item_type::INODE_ITEM, 0);
    let (block, slot) = fx.modify_item(tree_id::FS, key, |d| d.truncate(10));
    let report = check(&fx);
    let f = expect_fault(&report, FaultId::ItemUndecodable, |f| f.key == Some(key));
    assert_eq!((f.block, f.slot), (Some(block), Some(slot)));
}

// ----- extent refs -----

#[test]
fn extent_item_with_wrong_refs() {
    let fx0 = sample().build();
    let (a_extent, _) = leaf_with(&fx0, tree_id::FS, Key::new(A, item_type::EXTENT_DATA, 0));
    let disk = match birch::format::FileExtent::decode(
        &fx0.node(a_extent)
            .leaf_items()
            .iter()
            .find(|i| i.key == Key::new(A, item_type::EXTENT_DATA, 0))
            .unwrap()
            .data,
    )
    .unwrap()
    {
        birch::format::FileExtent::Regular { disk_bytenr, .. } => disk_bytenr,
        other => panic!("{other:?}"),
    };
    let mut fx = fx0.clone();
    let key = Key::new(disk, item_type::EXTENT_ITEM, 12288);
    let (block, slot) = fx.modify_item(tree_id::EXTENT, key, |d| {
        let mut e = ExtentItem::decode(d).unwrap();
        assert_eq!(e.refs, 2, "the split extent has two references");
        e.refs = 1;
        *d = e.encode();
    });
    let report = check(&fx);
    let f = expect_fault(&report, FaultId::DataExtentRefs, |f| f.key == Some(key));
    assert_eq!(
        (f.tree, f.block, f.slot),
        (Some(tree_id::EXTENT), Some(block), Some(slot))
    );
    assert_eq!(report.faults.len(), 1, "{report}");
}

#[test]
fn leaked_extent() {
    let mut b = sample();
    let leaked = b.leak_data_extent(8192);
    let fx = b.build();
    let report = check(&fx);
    let key = Key::new(leaked, item_type::EXTENT_ITEM, 8192);
    let (block, slot) = leaf_with(&fx, tree_id::EXTENT, key);
    let f = expect_fault(&report, FaultId::DataExtentLeaked, |f| f.key == Some(key));
    assert_eq!((f.block, f.slot), (Some(block), Some(slot)));
    assert_eq!(report.faults.len(), 1, "{report}");
}

#[test]
fn node_without_metadata_item_and_bytes_used() {
    let mut fx = sample().build();
    let fs_root = fx.root_of(tree_id::FS);
    let key = Key::new(
        fs_root.bytenr,
        item_type::METADATA_ITEM,
        u64::from(fs_root.level),
    );
    let (block, _) = leaf_with(&fx, tree_id::EXTENT, key);
    fx.modify_node(block, |n| {
        if let NodeBody::Leaf(items) = &mut n.body {
            items.retain(|i| i.key != key);
        }
    });
    let report = check(&fx);
    expect_fault(&report, FaultId::NodeWithoutMetadataItem, |f| {
        f.key == Some(key)
    });
    expect_fault(&report, FaultId::BytesUsedMismatch, |_| true);
}

#[test]
fn overlapping_extents() {
    let mut b = sample();
    let ino = b.create(ROOT_DIR_INO, b"big");
    let disk = b.write_extent(ino, 0, 8192);
    let fx0 = b.build();
    // A second extent item starting inside the first one.
    let mut fx = fx0.clone();
    let key = Key::new(disk, item_type::EXTENT_ITEM, 8192);
    let (block, _) = leaf_with(&fx, tree_id::EXTENT, key);
    fx.modify_node(block, |n| {
        if let NodeBody::Leaf(items) = &mut n.body {
            let gen = fx0.superblock.generation;
            let pos = items.iter().position(|i| i.key == key).unwrap();
            items.insert(
                pos + 1,
                LeafItem {
                    key: Key::new(disk + 4096, item_type::EXTENT_ITEM, 4096),
                    data: ExtentItem {
                        refs: 1,
                        generation: gen,
                        owner: ino,
                    }
                    .encode(),
                },
            );
        }
    });
    let report = check(&fx);
    expect_fault(&report, FaultId::ExtentOverlap, |f| {
        f.key == Some(Key::new(disk + 4096, item_type::EXTENT_ITEM, 4096))
    });
}

#[test]
fn file_extent_without_extent_item() {
    let mut b = sample();
    let ino = b.create(ROOT_DIR_INO, b"x");
    b.write_extent(ino, 0, 4096);
    let key = Key::new(ino, item_type::EXTENT_DATA, 0);
    let data = b.items_mut()[&key].clone();
    let mut e = birch::format::FileExtent::decode(&data).unwrap();
    if let birch::format::FileExtent::Regular { disk_bytenr, .. } = &mut e {
        *disk_bytenr += 1 << 20;
    }
    b.items_mut().insert(key, e.encode());
    let fx = b.build();
    let report = check(&fx);
    expect_fault(&report, FaultId::FileExtentWithoutExtentItem, |f| {
        f.key == Some(key)
    });
    expect_fault(&report, FaultId::DataExtentLeaked, |_| true);
}

// ----- namespace and nlink -----

#[test]
fn missing_dir_index() {
    let mut b = sample();
    // "a2" is D's second entry: index 3.
    let key = Key::new(D, item_type::DIR_INDEX, 3);
    assert!(b.items_mut().remove(&key).is_some());
    let fx = b.build();
    let report = check(&fx);
    let f = expect_fault(&report, FaultId::DirIndexMissing, |f| f.key == Some(key));
    // The fault names the INODE_REF that holds the name.
    assert!(f.reason.contains(&format!("({A} INODE_REF {D})")), "{f}");
    assert_eq!(report.faults.len(), 1, "{report}");
}

#[test]
fn dir_item_without_inode_ref() {
    let mut b = sample();
    let key = Key::new(B, item_type::INODE_REF, D);
    assert!(b.items_mut().remove(&key).is_some());
    let fx = b.build();
    let report = check(&fx);
    let item_key = Key::new(D, item_type::DIR_ITEM, birch::format::name_hash(b"b"));
    let (block, slot) = leaf_with(&fx, tree_id::FS, item_key);
    let f = expect_fault(&report, FaultId::DirItemWithoutRef, |f| {
        f.key == Some(item_key)
    });
    assert_eq!((f.block, f.slot), (Some(block), Some(slot)));
    expect_fault(&report, FaultId::Nlink, |f| {
        f.key == Some(Key::new(B, item_type::INODE_ITEM, 0))
    });
}

#[test]
fn wrong_nlink() {
    let mut b = sample();
    b.inode_mut(A).nlink = 3;
    let fx = b.build();
    let report = check(&fx);
    let key = Key::new(A, item_type::INODE_ITEM, 0);
    let (block, slot) = leaf_with(&fx, tree_id::FS, key);
    let f = expect_fault(&report, FaultId::Nlink, |f| f.key == Some(key));
    assert_eq!(
        (f.tree, f.block, f.slot),
        (Some(tree_id::FS), Some(block), Some(slot))
    );
    assert_eq!(report.faults.len(), 1, "{report}");
}

#[test]
fn wrong_directory_nlink_and_size() {
    let mut b = sample();
    b.inode_mut(ROOT_DIR_INO).nlink = 2; // has one subdirectory: 3
    b.inode_mut(D).size = 99;
    let fx = b.build();
    let report = check(&fx);
    expect_fault(&report, FaultId::DirNlink, |f| {
        f.key == Some(Key::new(ROOT_DIR_INO, item_type::INODE_ITEM, 0))
    });
    expect_fault(&report, FaultId::DirSize, |f| {
        f.key == Some(Key::new(D, item_type::INODE_ITEM, 0))
    });
}

#[test]
fn unlinked_inode_without_orphan_item() {
    let mut b = sample();
    assert!(b
        .items_mut()
        .remove(&Key::new(
            birch::format::ORPHAN_OBJECTID,
            item_type::ORPHAN_ITEM,
            ORPHAN
        ))
        .is_some());
    let fx = b.build();
    let report = check(&fx);
    expect_fault(&report, FaultId::UnlinkedWithoutOrphan, |f| {
        f.key == Some(Key::new(ORPHAN, item_type::INODE_ITEM, 0))
    });
}

#[test]
fn unreachable_directory_cycle_and_missing_inode() {
    let mut b = sample();
    // Two directories naming each other, hanging off nothing.
    let x = b.mkdir(D, b"x");
    let y = b.mkdir(x, b"y");
    // Re-parent x under y by editing the raw items: x's ref and D's entries.
    let items = b.items_mut();
    let xref = items.remove(&Key::new(x, item_type::INODE_REF, D)).unwrap();
    items.insert(Key::new(x, item_type::INODE_REF, y), xref);
    let ditem_key = Key::new(D, item_type::DIR_ITEM, birch::format::name_hash(b"x"));
    let ditem = items.remove(&ditem_key).unwrap();
    items.insert(
        Key::new(y, item_type::DIR_ITEM, birch::format::name_hash(b"x")),
        ditem,
    );
    let dindex = items.remove(&Key::new(D, item_type::DIR_INDEX, 4)).unwrap();
    items.insert(Key::new(y, item_type::DIR_INDEX, 3), dindex);
    // Fix the counts so only reachability is wrong.
    let x_ref =
        birch::format::decode_inode_refs(&b.items_mut()[&Key::new(x, item_type::INODE_REF, y)])
            .unwrap();
    let mut fixed = x_ref.clone();
    fixed[0].index = 3;
    b.items_mut().insert(
        Key::new(x, item_type::INODE_REF, y),
        birch::format::encode_inode_refs(&fixed),
    );
    b.inode_mut(D).nlink -= 1;
    b.inode_mut(D).size -= 1;
    b.inode_mut(y).nlink += 1;
    b.inode_mut(y).size += 1;
    // And an item for an inode that does not exist.
    b.xattr(999, b"user.ghost", b"");
    let fx = b.build();
    let report = check(&fx);
    for ino in [x, y] {
        expect_fault(&report, FaultId::InodeUnreachable, |f| {
            f.key == Some(Key::new(ino, item_type::INODE_ITEM, 0))
        });
    }
    expect_fault(&report, FaultId::ItemsWithoutInode, |f| {
        f.key.is_some_and(|k| k.objectid == 999)
    });
    assert_eq!(report.faults.len(), 3, "{report}");
}

#[test]
fn dir_item_hash_and_type_mismatch() {
    let mut b = sample();
    let key = Key::new(
        ROOT_DIR_INO,
        item_type::DIR_ITEM,
        birch::format::name_hash(b"l"),
    );
    let mut entries = birch::format::decode_dir_items(&b.items_mut()[&key]).unwrap();
    entries[0].file_type = birch::format::FileType::Regular;
    b.items_mut()
        .insert(key, birch::format::encode_dir_items(&entries));
    let moved = b
        .items_mut()
        .remove(&Key::new(
            ROOT_DIR_INO,
            item_type::DIR_ITEM,
            birch::format::name_hash(b"a"),
        ))
        .unwrap();
    let wrong_hash = Key::new(ROOT_DIR_INO, item_type::DIR_ITEM, 12345);
    b.items_mut().insert(wrong_hash, moved);
    let fx = b.build();
    let report = check(&fx);
    expect_fault(&report, FaultId::DirItemWrongType, |f| f.key == Some(key));
    expect_fault(&report, FaultId::DirItemHash, |f| f.key == Some(wrong_hash));
}

#[test]
fn root_directory_problems() {
    let mut b = sample();
    b.items_mut()
        .remove(&Key::new(ROOT_DIR_INO, item_type::INODE_REF, ROOT_DIR_INO));
    let report = check(&b.build());
    expect_fault(&report, FaultId::RootDirWithoutRef, |f| {
        f.key == Some(Key::new(ROOT_DIR_INO, item_type::INODE_REF, ROOT_DIR_INO))
    });

    let mut b = sample();
    b.remove_inode(ROOT_DIR_INO);
    let report = check(&b.build());
    expect_fault(&report, FaultId::RootDirMissing, |f| {
        f.key == Some(Key::new(ROOT_DIR_INO, item_type::INODE_ITEM, 0))
    });
}

// ----- file extents -----

#[test]
fn file_extent_rules() {
    let mut b = sample();
    b.inode_mut(L).size = 5; // target "a" is 1 byte
    let late = b.create(ROOT_DIR_INO, b"late");
    b.write_extent(late, 8192, 4096);
    b.inode_mut(late).size = 100; // regular extent beyond i_size
    let inl = b.create(ROOT_DIR_INO, b"inl");
    b.write_inline(inl, b"xyz");
    b.inode_mut(inl).nbytes = 7;
    let fx = b.build();
    let report = check(&fx);
    expect_fault(&report, FaultId::SymlinkTargetSize, |f| {
        f.key == Some(Key::new(L, item_type::EXTENT_DATA, 0))
    });
    expect_fault(&report, FaultId::RegularPastEof, |f| {
        f.key == Some(Key::new(late, item_type::EXTENT_DATA, 8192))
    });
    expect_fault(&report, FaultId::Nbytes, |f| {
        f.key == Some(Key::new(inl, item_type::INODE_ITEM, 0))
    });
}

#[test]
fn overlapping_file_extents_and_inline_not_alone() {
    let mut b = FsBuilder::new(16 << 20);
    let f = b.create(ROOT_DIR_INO, b"f");
    b.write_extent(f, 0, 8192);
    b.write_extent(f, 4096, 4096);
    let g = b.create(ROOT_DIR_INO, b"g");
    b.write_inline(g, b"abc");
    b.write_extent(g, 4096, 4096);
    let report = check(&b.build());
    expect_fault(&report, FaultId::FileExtentOverlap, |x| {
        x.key == Some(Key::new(f, item_type::EXTENT_DATA, 4096))
    });
    expect_fault(&report, FaultId::InlineNotAlone, |x| {
        x.key == Some(Key::new(g, item_type::EXTENT_DATA, 0))
    });
}

/// Compressed inline extents (docs/COMPRESSION.md, "Compressed inline
/// extents") follow the inline rules with their uncompressed length, and
/// need the compression flag.
#[test]
fn compressed_inline_extent_rules() {
    let text: Vec<u8> = b"compressed inline text. "
        .iter()
        .cycle()
        .take(3000)
        .copied()
        .collect();
    let mut b = FsBuilder::new(16 << 20);
    let ok = b.create(ROOT_DIR_INO, b"ok");
    b.write_inline_compressed(ok, &text);
    let short = b.create(ROOT_DIR_INO, b"short");
    b.write_inline_compressed(short, &text);
    b.inode_mut(short).size = 2000; // its data is 3000 bytes
    let beside = b.create(ROOT_DIR_INO, b"beside");
    b.write_inline_compressed(beside, &text);
    b.write_extent(beside, 4096, 4096);
    let mut fx = b.build();
    // Without the flag: each item is reported.
    let report = check(&fx);
    for ino in [ok, short, beside] {
        expect_fault(&report, FaultId::CompressedWithoutFeature, |f| {
            f.key == Some(Key::new(ino, item_type::EXTENT_DATA, 0))
        });
    }
    let mut sb = fx.superblock.clone();
    sb.compression = true;
    fx.write_superblock(&sb);
    let report = check(&fx);
    assert_eq!(
        report
            .faults_with(FaultId::CompressedWithoutFeature)
            .count(),
        0,
        "{report}"
    );
    expect_fault(&report, FaultId::InlinePastEof, |f| {
        f.key == Some(Key::new(short, item_type::EXTENT_DATA, 0))
    });
    expect_fault(&report, FaultId::InlineNotAlone, |f| {
        f.key == Some(Key::new(beside, item_type::EXTENT_DATA, 0))
    });
    // 3000 bytes of data within the compressed limit (4096), not the
    // plain one (2048); and no other fault names the good file.
    assert_eq!(
        report.faults_with(FaultId::InlineTooLong).count(),
        0,
        "{report}"
    );
    assert!(
        report
            .faults
            .iter()
            .all(|f| f.key.is_none_or(|k| k.objectid != ok)),
        "{report}"
    );
    assert_eq!(report.summary.compressed_inline_items, 3, "{report}");
}

// ----- log trees -----

/// Adds a log root tree and one log tree (two leaves in free space) to a
/// fixture, and points the superblock at it.
fn add_log(fx: &mut Fixture, log_leaf_at: u64) {
    let gen = fx.superblock.generation + 1;
    let log_root_at = log_leaf_at + NODE_SIZE as u64;
    let inode = InodeItem {
        mode: libc::S_IFREG | 0o644,
        nlink: 1,
        generation: gen,
        transid: gen,
        ..Default::default()
    };
    fx.write_node(&Node {
        bytenr: log_leaf_at,
        generation: gen,
        owner: tree_id::LOG,
        level: 0,
        body: NodeBody::Leaf(vec![LeafItem {
            key: Key::new(A, item_type::INODE_ITEM, 0),
            data: inode.encode(),
        }]),
    });
    fx.write_node(&Node {
        bytenr: log_root_at,
        generation: gen,
        owner: tree_id::LOG_ROOT,
        level: 0,
        body: NodeBody::Leaf(vec![LeafItem {
            key: Key::new(tree_id::LOG, item_type::ROOT_ITEM, tree_id::FS),
            data: RootItem {
                bytenr: log_leaf_at,
                generation: gen,
                level: 0,
            }
            .encode(),
        }]),
    });
    let mut sb = fx.superblock.clone();
    sb.log_root_bytenr = log_root_at;
    sb.log_root_level = 0;
    sb.log_generation = gen;
    fx.write_superblock(&sb);
}

#[test]
fn log_trees_are_walked_and_kept_out_of_extents() {
    let mut fx = sample().build();
    add_log(&mut fx, 4 << 20);
    let report = check(&fx);
    assert_clean(&report);
    assert_eq!(report.summary.log_nodes, 2);
    assert!(report
        .summary
        .trees
        .iter()
        .any(|t| t.id == tree_id::LOG && t.subvolume == Some(tree_id::FS)));

    // A log node on top of an allocated extent.
    let mut fx = sample().build();
    let used = fx.root_of(tree_id::FS).bytenr;
    add_log(&mut fx, used);
    let report = check(&fx);
    assert!(!report.is_clean(), "{report}");

    // Log node with a bad checksum.
    let mut fx = sample().build();
    add_log(&mut fx, 4 << 20);
    fx.image[(4 << 20) + 300] ^= 1;
    let report = check(&fx);
    expect_fault(&report, FaultId::NodeChecksum, |f| {
        f.block == Some(4 << 20) && f.tree == Some(tree_id::LOG)
    });
}

// ----- the canary -----

/// A checker that always says "clean" must fail this suite: every damage
/// below must be reported.
#[test]
fn canary_checker_reports_damage() {
    let base = sample().build();
    type Damage = Box<dyn Fn(&mut Fixture)>;
    let damages: Vec<(&str, Damage)> = vec![
        (
            "zeroed image",
            Box::new(|fx: &mut Fixture| fx.image.iter_mut().for_each(|b| *b = 0)),
        ),
        (
            "flipped node byte",
            Box::new(|fx: &mut Fixture| {
                let b = fx.root_of(tree_id::FS).bytenr as usize;
                fx.image[b + 100] ^= 1;
            }),
        ),
        (
            "wrong nlink",
            Box::new(|fx: &mut Fixture| {
                fx.modify_item(tree_id::FS, Key::new(B, item_type::INODE_ITEM, 0), |d| {
                    let mut i = InodeItem::decode(d).unwrap();
                    i.nlink += 1;
                    *d = i.encode();
                });
            }),
        ),
        (
            "bytes_used off by one sector",
            Box::new(|fx: &mut Fixture| {
                let mut sb = fx.superblock.clone();
                sb.bytes_used += 4096;
                fx.write_superblock(&sb);
            }),
        ),
    ];
    for (what, damage) in damages {
        let mut fx = base.clone();
        damage(&mut fx);
        let report = check(&fx);
        assert!(
            !report.is_clean(),
            "damage '{what}' went unnoticed:\n{report}"
        );
        assert!(report.to_string().contains("fault"), "{what}");
    }
}

// ----- shared tree blocks (docs/SNAPSHOTS.md S1, S2, S4) -----

/// The sample with a deep fs tree and a snapshot of it as tree 256
/// (deleted, not yet dropped: see `Fixture::snapshot_fs_tree`).
fn shared_sample() -> (Fixture, u64) {
    let mut b = sample();
    b.leaf_items_max = 4;
    b.enable_subvolumes();
    let mut fx = b.build();
    let snapshot_root = fx.snapshot_fs_tree(256);
    (fx, snapshot_root)
}

#[test]
fn a_snapshot_sharing_the_fs_tree_is_clean() {
    let (fx, _) = shared_sample();
    let report = check(&fx);
    assert_clean(&report);
    // The shared nodes were read once: tree 256 adds only its root.
    let nodes_of = |id| {
        report
            .summary
            .trees
            .iter()
            .find(|t| t.id == id)
            .unwrap()
            .nodes
    };
    assert_eq!(nodes_of(256), 1, "{report}");
    assert!(nodes_of(tree_id::FS) > 1);
}

#[test]
fn check_finds_wrong_metadata_refs() {
    let (mut fx, snapshot_root) = shared_sample();
    let shared = fx.node(snapshot_root).key_ptrs().to_vec();
    let level = u64::from(fx.root_of(tree_id::FS).level - 1);
    let item_key = |p: &KeyPtr| Key::new(p.blockptr, item_type::METADATA_ITEM, level);
    let set_refs = |fx: &mut Fixture, key: Key, refs: u64| {
        fx.modify_item(tree_id::EXTENT, key, |d| {
            let mut item = ExtentItem::decode(d).unwrap();
            item.refs = refs;
            *d = item.encode();
        })
    };
    // A shared child counted once (as before sharing), another three times.
    let (block_a, slot_a) = set_refs(&mut fx, item_key(&shared[0]), 1);
    let (block_b, slot_b) = set_refs(&mut fx, item_key(&shared[1]), 3);
    // An unshared node (the snapshot's own root) counted twice.
    let (block_c, slot_c) = set_refs(
        &mut fx,
        Key::new(snapshot_root, item_type::METADATA_ITEM, level + 1),
        2,
    );
    let report = check(&fx);
    for (block, slot, reason) in [
        (block_a, slot_a, "refs 1 but 2 pointers"),
        (block_b, slot_b, "refs 3 but 2 pointers"),
        (block_c, slot_c, "refs 2 but 1 pointer "),
    ] {
        let f = expect_fault(&report, FaultId::MetadataRefs, |f| {
            f.block == Some(block) && f.slot == Some(slot)
        });
        assert!(f.reason.contains(reason), "{f}");
    }
    assert_eq!(
        report.faults_with(FaultId::MetadataRefs).count(),
        3,
        "{report}"
    );
}

#[test]
fn a_shared_root_node_is_a_fault() {
    // Tree 256's root item names the fs tree's root node itself.
    let (mut fx, _) = shared_sample();
    let fs_root = fx.root_of(tree_id::FS);
    let gen = fx.superblock.generation;
    fx.modify_item(tree_id::ROOT, Key::new(256, item_type::ROOT_ITEM, 0), |d| {
        *d = RootItem {
            bytenr: fs_root.bytenr,
            generation: gen,
            level: fs_root.level,
        }
        .encode();
    });
    let report = check(&fx);
    expect_fault(&report, FaultId::RootNodeShared, |f| {
        f.block == Some(fs_root.bytenr) && f.tree == Some(256)
    });
}

#[test]
fn a_pointer_to_a_shared_node_must_agree_with_it() {
    // The snapshot's pointer promises another generation than the shared
    // child has: the walk, which does not read the child again, catches it.
    let (mut fx, snapshot_root) = shared_sample();
    let child = fx.node(snapshot_root).key_ptrs()[1].blockptr;
    fx.modify_node(snapshot_root, |n| {
        if let NodeBody::Internal(ptrs) = &mut n.body {
            ptrs[1].generation -= 1;
        }
    });
    let report = check(&fx);
    let f = expect_fault(&report, FaultId::NodeGeneration, |f| {
        f.block == Some(child) && f.tree == Some(256)
    });
    assert!(f.reason.contains("shared node of fs(5)"), "{f}");
}

/// A POSIX ACL xattr the kernel could not parse (here: a named user with
/// no mask entry, and a truncated one) is a fault naming the xattr, not a
/// panic; a valid one is clean.
#[test]
fn malformed_acl_xattr() {
    use birch::format::{Acl, AclEntry, ACL_ACCESS_XATTR, ACL_DEFAULT_XATTR};
    let entry = |tag, perm, id| AclEntry { tag, perm, id };
    let no_mask = Acl {
        entries: vec![
            entry(birch::format::ACL_USER_OBJ, 6, 0),
            entry(birch::format::ACL_USER, 4, 65534),
            entry(birch::format::ACL_GROUP_OBJ, 4, 0),
            entry(birch::format::ACL_OTHER, 0, 0),
        ],
    }
    .encode();
    let valid = Acl::from_mode(0o644).encode();
    let mut b = sample();
    b.xattr(A, ACL_ACCESS_XATTR, &no_mask);
    b.xattr(D, ACL_DEFAULT_XATTR, &valid[..valid.len() - 3]);
    b.xattr(B, ACL_ACCESS_XATTR, &valid);
    let report = check(&b.build());
    for (ino, why) in [(A, "mask"), (D, "bytes")] {
        expect_fault(&report, FaultId::AclMalformed, |f| {
            f.key.is_some_and(|k| k.objectid == ino) && f.reason.contains(why)
        });
    }
    assert_eq!(report.faults.len(), 2, "{report}");
}

/// An inode flag bit birch never sets (FS_NOCOW_FL here) is a fault naming
/// the inode; the chattr flags birch has (`SiadADc`) are clean.
#[test]
fn unknown_inode_flag_bits() {
    use birch::fs::inode_flags;
    let mut b = sample();
    b.inode_mut(A).flags = u64::from(inode_flags::SYNC | 0x0080_0000);
    b.inode_mut(D).flags = u64::from(inode_flags::SUPPORTED);
    let report = check(&b.build());
    let f = expect_fault(&report, FaultId::InodeFlagsUnknown, |f| {
        f.key == Some(Key::new(A, item_type::INODE_ITEM, 0))
    });
    assert!(f.reason.contains("0x800000"), "{report}");
    assert_eq!(report.faults.len(), 1, "{report}");
}
