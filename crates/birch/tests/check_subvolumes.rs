//! `birch check` on hand-built images with subvolume items
//! (docs/SNAPSHOTS.md (a), invariants S5, S6, S8, S9, S10): a clean image
//! with every kind of subvolume item passes, each damage is found under
//! its fault id, and an image without `INCOMPAT_SUBVOLUMES` checks as
//! before (any subvolume item on it is a fault).

use birch::check::fixture::{sample, Fixture, FsBuilder};
use birch::check::{check_device, pass_id, CheckReport, FaultId};
use birch::format::{
    encode_dir_items, item_type, tree_id, DirEntry, FileType, InodeItem, Key, LeafItem, Node,
    NodeBody, RootItem, RootRef, NODE_SIZE, ROOT_DIR_INO,
};
use birch::fs::{Filesystem, MountOptions};

/// Directory `/d` of `fixture::sample()`.
const D: u64 = 258;

fn check(fx: &Fixture) -> CheckReport {
    check_device(&fx.device())
}

fn assert_clean(report: &CheckReport) {
    assert!(report.is_clean(), "expected clean:\n{report}");
    assert!(report.warnings.is_empty(), "{report}");
}

/// The report has a fault `id` (and says so in its text).
fn assert_finds(report: &CheckReport, id: FaultId) {
    assert!(
        report.faults_with(id).next().is_some(),
        "no [{id}] fault in:\n{report}"
    );
    assert!(report.to_string().contains(&format!("[{id}]")));
}

/// Every fault of the report is one of `ids`.
fn assert_only(report: &CheckReport, ids: &[FaultId]) {
    for f in &report.faults {
        assert!(ids.contains(&f.id), "unexpected fault {f} in:\n{report}");
    }
}

/// `sample()` with subvolumes:
///
/// ```text
/// 5    /sv (256), /d/sv2 (257); default subvolume 256
/// 256  /nested (258)
/// 259  dead (refs 0, orphan-root item)
/// ```
fn with_subvolumes() -> FsBuilder {
    let mut b = sample();
    b.enable_subvolumes();
    let sv = b.subvolume(tree_id::FS, ROOT_DIR_INO, b"sv");
    b.subvolume(tree_id::FS, D, b"sv2");
    b.subvolume(sv, ROOT_DIR_INO, b"nested");
    b.dead_subvolume();
    b.set_default_subvolume(sv);
    b
}

#[test]
fn clean_image_with_subvolume_items_passes() {
    let fx = with_subvolumes().build();
    let report = check(&fx);
    assert_clean(&report);
    assert!(report
        .passes
        .iter()
        .any(|(id, _)| *id == pass_id::SUBVOLUMES));
    for id in [256, 257, 258, 259] {
        assert!(
            report.summary.trees.iter().any(|t| t.id == id),
            "tree {id} walked:\n{report}"
        );
    }
    assert!(report.to_string().contains("subvol(258)"), "{report}");
    // The dump prints every new item.
    let mut dump = Vec::new();
    birch::print::tree(
        &mut dump,
        &fx.device(),
        &fx.fsid(),
        tree_id::ROOT,
        fx.superblock.root_tree_bytenr,
        fx.superblock.root_tree_level,
        Some(fx.superblock.generation),
    )
    .expect("dump of the root tree");
    let dump = String::from_utf8(dump).expect("utf-8 dump");
    for want in [
        "ROOT_REF",
        "ROOT_BACKREF",
        "root ref dirid 256 index",
        "root backref dirid 258 index",
        "refs 0 flags 0x0",
        "uuid ",
        "ORPHAN_ITEM 259",
        "location ino 256 type DIR namelen 7 name: default",
    ] {
        assert!(dump.contains(want), "{want:?} not in:\n{dump}");
    }
}

#[test]
fn images_without_the_flag_check_as_before() {
    // The sample without subvolumes: clean, and nothing of the pass fires.
    assert_clean(&check(&sample().build()));
    // A subvolume item on such an image is a fault.
    let mut b = sample();
    let rr = RootRef {
        dirid: ROOT_DIR_INO,
        index: 9,
        name: b"x".to_vec(),
    };
    b.root_tree_items_mut()
        .insert(Key::root_ref(tree_id::FS, 256), rr.encode());
    let report = check(&b.build());
    assert_finds(&report, FaultId::SubvolWithoutFlag);
    assert_only(&report, &[FaultId::SubvolWithoutFlag]);
}

#[test]
fn check_finds_dangling_root_ref() {
    let mut b = with_subvolumes();
    let rr = RootRef {
        dirid: ROOT_DIR_INO,
        index: 40,
        name: b"gone".to_vec(),
    };
    // A pair for subvolume 400, which has no root item.
    b.root_tree_items_mut()
        .insert(Key::root_ref(tree_id::FS, 400), rr.encode());
    b.root_tree_items_mut()
        .insert(Key::root_backref(400, tree_id::FS), rr.encode());
    let report = check(&b.build());
    assert_finds(&report, FaultId::RootRefDangling);
    assert_only(&report, &[FaultId::RootRefDangling]);
}

#[test]
fn check_finds_root_ref_missing() {
    let mut b = with_subvolumes();
    b.root_tree_items_mut()
        .remove(&Key::root_ref(tree_id::FS, 256));
    let report = check(&b.build());
    assert_finds(&report, FaultId::RootRefMissing);
    assert_only(&report, &[FaultId::RootRefMissing]);
}

#[test]
fn check_finds_root_backref_missing() {
    let mut b = with_subvolumes();
    b.root_tree_items_mut()
        .remove(&Key::root_backref(257, tree_id::FS));
    let report = check(&b.build());
    assert_finds(&report, FaultId::RootBackrefMissing);
}

#[test]
fn check_finds_root_ref_mismatch() {
    let mut b = with_subvolumes();
    let key = Key::root_backref(256, tree_id::FS);
    let mut rr = RootRef::decode(&b.root_tree_items_mut()[&key]).expect("backref");
    rr.name = b"other".to_vec();
    b.root_tree_items_mut().insert(key, rr.encode());
    let report = check(&b.build());
    assert_finds(&report, FaultId::RootRefMismatch);
}

#[test]
fn check_finds_subvol_link_missing() {
    let mut b = with_subvolumes();
    // The DIR_INDEX half of 258's link in the root directory of 256.
    let index = Key::new(ROOT_DIR_INO, item_type::DIR_INDEX, 2);
    assert!(b.subvol_items_mut(256).remove(&index).is_some());
    let report = check(&b.build());
    assert_finds(&report, FaultId::SubvolLinkMissing);
    assert_only(&report, &[FaultId::SubvolLinkMissing]);
}

#[test]
fn check_finds_subvol_link_dangling() {
    let mut b = with_subvolumes();
    // A link entry in the root directory of 256 to the dead 259.
    let link = DirEntry {
        ino: 259,
        file_type: FileType::Directory,
        name: b"ghost".to_vec(),
        subvolume: true,
    };
    b.subvol_items_mut(256).insert(
        Key::new(ROOT_DIR_INO, item_type::DIR_INDEX, 30),
        link.encode(),
    );
    let report = check(&b.build());
    assert_finds(&report, FaultId::SubvolLinkDangling);
    // The entry is a name of 256's root directory that its size and
    // nlink do not count (S7).
    assert_only(
        &report,
        &[
            FaultId::SubvolLinkDangling,
            FaultId::DirSize,
            FaultId::DirNlink,
        ],
    );
}

#[test]
fn check_finds_subvol_link_cycle() {
    let mut b = sample();
    b.enable_subvolumes();
    let a = b.new_subvolume(1);
    let c = b.new_subvolume(1);
    b.link_subvolume(a, ROOT_DIR_INO, b"c", c);
    b.link_subvolume(c, ROOT_DIR_INO, b"a", a);
    let report = check(&b.build());
    assert_finds(&report, FaultId::SubvolLinkCycle);
    assert_only(&report, &[FaultId::SubvolLinkCycle]);
    assert_eq!(report.faults_with(FaultId::SubvolLinkCycle).count(), 2);
    // Linked inside itself; and one hanging below a cycle is not itself
    // in it (it is unreachable through the cycle's members).
    let mut b = sample();
    b.enable_subvolumes();
    let a = b.new_subvolume(1);
    b.link_subvolume(a, ROOT_DIR_INO, b"self", a);
    b.subvolume(a, ROOT_DIR_INO, b"below");
    let report = check(&b.build());
    assert_only(&report, &[FaultId::SubvolLinkCycle]);
    assert_eq!(report.faults_with(FaultId::SubvolLinkCycle).count(), 1);
}

#[test]
fn check_finds_dead_root_without_orphan() {
    let mut b = with_subvolumes();
    b.root_tree_items_mut().remove(&Key::orphan_root(259));
    let report = check(&b.build());
    assert_finds(&report, FaultId::DeadRootWithoutOrphan);
    assert_only(&report, &[FaultId::DeadRootWithoutOrphan]);
}

#[test]
fn check_finds_orphan_root_live() {
    let mut b = with_subvolumes();
    b.root_tree_items_mut()
        .insert(Key::orphan_root(257), Vec::new());
    let report = check(&b.build());
    assert_finds(&report, FaultId::OrphanRootLive);
    assert_only(&report, &[FaultId::OrphanRootLive]);
}

#[test]
fn check_finds_orphan_root_dangling() {
    let mut b = with_subvolumes();
    b.root_tree_items_mut()
        .insert(Key::orphan_root(300), Vec::new());
    let report = check(&b.build());
    assert_finds(&report, FaultId::OrphanRootDangling);
    assert_only(&report, &[FaultId::OrphanRootDangling]);
}

#[test]
fn check_finds_default_subvol_dangling() {
    let mut b = with_subvolumes();
    b.set_default_subvolume(259);
    let report = check(&b.build());
    assert_finds(&report, FaultId::DefaultSubvolDangling);
    assert_only(&report, &[FaultId::DefaultSubvolDangling]);
    // The top level is always a valid default.
    let mut b = with_subvolumes();
    b.set_default_subvolume(tree_id::FS);
    assert_clean(&check(&b.build()));
}

#[test]
fn check_finds_default_subvol_malformed() {
    let mut b = with_subvolumes();
    let two = [b"default".as_slice(), b"other"].map(|n| DirEntry {
        ino: 256,
        file_type: FileType::Directory,
        name: n.to_vec(),
        subvolume: false,
    });
    b.root_tree_items_mut()
        .insert(Key::default_subvol(), encode_dir_items(&two));
    let report = check(&b.build());
    assert_finds(&report, FaultId::DefaultSubvolMalformed);
}

#[test]
fn check_finds_root_item_short() {
    let mut fx = with_subvolumes().build();
    fx.modify_item(tree_id::ROOT, Key::new(257, item_type::ROOT_ITEM, 0), |d| {
        d.truncate(17)
    });
    let report = check(&fx);
    assert_finds(&report, FaultId::RootItemShort);
    assert_only(&report, &[FaultId::RootItemShort]);
    // Tree 5's too.
    let mut fx = with_subvolumes().build();
    fx.modify_item(tree_id::ROOT, Key::new(5, item_type::ROOT_ITEM, 0), |d| {
        d.truncate(17)
    });
    assert_finds(&check(&fx), FaultId::RootItemShort);
}

/// One damage to a fixture's builder.
type Damage = fn(&mut FsBuilder);

#[test]
fn check_finds_root_item_fields() {
    let cases: [(&str, Damage); 4] = [
        ("ctransid past generation", |b| {
            b.subvol_item_mut(256).ctransid = 100
        }),
        ("otransid past ctransid", |b| {
            b.subvol_item_mut(257).otransid = 5_000
        }),
        ("zero uuid", |b| b.subvol_item_mut(258).uuid = [0; 16]),
        ("drop progress on a live root", |b| {
            b.subvol_item_mut(256).drop_progress = Key::new(300, 1, 0)
        }),
    ];
    for (what, damage) in cases {
        let mut b = with_subvolumes();
        damage(&mut b);
        let report = check(&b.build());
        assert!(
            report.faults_with(FaultId::RootItemFields).next().is_some(),
            "{what}: {report}"
        );
        assert_only(&report, &[FaultId::RootItemFields]);
    }
    // A long root item for the extent tree.
    let mut fx = with_subvolumes().build();
    let long = fx
        .find_item(tree_id::ROOT, Key::new(5, item_type::ROOT_ITEM, 0))
        .map(|(block, slot)| match fx.node(block).body {
            NodeBody::Leaf(items) => items[slot].data.clone(),
            NodeBody::Internal(_) => unreachable!("items live in leaves"),
        })
        .expect("tree 5's root item");
    let extent_key = Key::new(tree_id::EXTENT, item_type::ROOT_ITEM, 0);
    fx.modify_item(tree_id::ROOT, extent_key, |d| {
        let short = d[..17].to_vec();
        *d = long.clone();
        d[..17].copy_from_slice(&short);
    });
    assert_finds(&check(&fx), FaultId::RootItemFields);
}

#[test]
fn check_finds_uuid_twice() {
    let mut b = with_subvolumes();
    let uuid = b.subvol_item_mut(256).uuid;
    b.subvol_item_mut(257).uuid = uuid;
    let report = check(&b.build());
    assert_finds(&report, FaultId::UuidTwice);
    assert_only(&report, &[FaultId::UuidTwice]);
}

#[test]
fn check_finds_subvol_id_out_of_range() {
    let mut b = with_subvolumes();
    b.root_tree_items_mut()
        .insert(Key::orphan_root(100), Vec::new());
    let report = check(&b.build());
    assert_finds(&report, FaultId::SubvolIdOutOfRange);
}

/// Adds a log root tree logging subvolume `subvol` with one leaf of
/// `items` (two nodes in free space) and points the superblock at it.
fn add_log(fx: &mut Fixture, subvol: u64, items: Vec<LeafItem>) {
    let gen = fx.superblock.generation + 1;
    let leaf_at = 4 << 20;
    let root_at = leaf_at + NODE_SIZE as u64;
    fx.write_node(&Node {
        bytenr: leaf_at,
        generation: gen,
        owner: tree_id::LOG,
        level: 0,
        body: NodeBody::Leaf(items),
    });
    fx.write_node(&Node {
        bytenr: root_at,
        generation: gen,
        owner: tree_id::LOG_ROOT,
        level: 0,
        body: NodeBody::Leaf(vec![LeafItem {
            key: Key::new(tree_id::LOG, item_type::ROOT_ITEM, subvol),
            data: RootItem {
                bytenr: leaf_at,
                generation: gen,
                level: 0,
            }
            .encode(),
        }]),
    });
    let mut sb = fx.superblock.clone();
    sb.log_root_bytenr = root_at;
    sb.log_root_level = 0;
    sb.log_generation = gen;
    fx.write_superblock(&sb);
}

fn inode_in_log(gen: u64) -> LeafItem {
    let inode = InodeItem {
        mode: libc::S_IFDIR | 0o755,
        nlink: 2,
        generation: 1,
        transid: gen,
        ..Default::default()
    };
    LeafItem {
        key: Key::new(ROOT_DIR_INO, item_type::INODE_ITEM, 0),
        data: inode.encode(),
    }
}

#[test]
fn check_finds_log_subvolume_link() {
    let mut fx = with_subvolumes().build();
    let gen = fx.superblock.generation + 1;
    let link = DirEntry {
        ino: 256,
        file_type: FileType::Directory,
        name: b"sv".to_vec(),
        subvolume: true,
    };
    let items = vec![
        inode_in_log(gen),
        LeafItem {
            key: Key::new(ROOT_DIR_INO, item_type::DIR_INDEX, 2),
            data: link.encode(),
        },
    ];
    add_log(&mut fx, tree_id::FS, items);
    let report = check(&fx);
    assert_finds(&report, FaultId::LogSubvolumeLink);
    assert_only(&report, &[FaultId::LogSubvolumeLink]);
}

/// Replay refuses a log holding a subvolume link: the log is thrown away
/// (the mount says why) rather than naming another tree's inode in tree 5.
#[test]
fn replay_refuses_log_subvolume_link() {
    let mut fx = with_subvolumes().build();
    let gen = fx.superblock.generation + 1;
    let link = DirEntry {
        ino: 256,
        file_type: FileType::Directory,
        name: b"logged".to_vec(),
        subvolume: true,
    };
    let items = vec![
        inode_in_log(gen),
        LeafItem {
            key: Key::new(ROOT_DIR_INO, item_type::DIR_INDEX, 50),
            data: link.encode(),
        },
    ];
    add_log(&mut fx, tree_id::FS, items);
    let dev = std::sync::Arc::new(fx.device());
    let fs = Filesystem::open(dev, MountOptions::deterministic()).unwrap();
    match fs.replay_outcome() {
        Some(birch::fs::ReplayOutcome::Discarded(why)) => {
            assert!(why.contains("link to subvolume"), "{why}")
        }
        other => panic!("replay accepted a subvolume link: {other:?}"),
    }
    assert!(fs.lookup(fs.root_ino(), b"logged").is_err());
}

#[test]
fn logs_of_live_subvolumes_only() {
    // A log of live subvolume 257: walked, clean.
    let mut fx = with_subvolumes().build();
    let gen = fx.superblock.generation + 1;
    add_log(&mut fx, 257, vec![inode_in_log(gen)]);
    let report = check(&fx);
    assert_clean(&report);
    assert!(report
        .summary
        .trees
        .iter()
        .any(|t| t.id == tree_id::LOG && t.subvolume == Some(257)));
    // Of dead 259, or on an image without the flag: unknown.
    for (mut fx, subvol) in [(with_subvolumes().build(), 259), (sample().build(), 256)] {
        add_log(&mut fx, subvol, vec![inode_in_log(gen)]);
        let report = check(&fx);
        assert_finds(&report, FaultId::LogOfUnknownSubvolume);
        assert_only(&report, &[FaultId::LogOfUnknownSubvolume]);
    }
}

/// Until the engine creates subvolumes (docs/SNAPSHOTS.md (j), step 6) it
/// must not open an image with them: it would rewrite tree 5's long root
/// item short and ignore the other trees. Its root item decoder refuses
/// the long form by name.
/// The engine mounts an image with subvolumes, changes tree 5 and commits
/// it: the seal writes tree 5's root item back in the long form (the image
/// still checks clean, and a second mount reads it).
#[test]
fn image_with_subvolumes_mounts() {
    let fx = with_subvolumes().build();
    let dev = std::sync::Arc::new(fx.device());
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    fs.create(fs.root_ino(), b"new", 0o644, 0, 0).unwrap();
    fs.sync().unwrap();
    drop(fs);
    assert_clean(&check_device(dev.as_ref()));
    let fs = Filesystem::open(dev, MountOptions::deterministic()).unwrap();
    assert!(fs.lookup(fs.root_ino(), b"new").is_ok());
}

/// A read-only top-level subvolume refuses a change with EROFS: every
/// change resolves its root through `FsState::writable`.
#[test]
fn read_only_top_level_subvolume_refuses_changes() {
    let mut b = with_subvolumes();
    b.subvol_item_mut(tree_id::FS).flags = birch::format::SUBVOL_RDONLY;
    let dev = std::sync::Arc::new(b.build().device());
    let fs = Filesystem::open(dev, MountOptions::deterministic()).unwrap();
    let root = fs.root_ino();
    let erofs = |r: birch::error::Result<()>| {
        assert!(matches!(r, Err(birch::error::Error::ReadOnly)), "{r:?}")
    };
    erofs(fs.create(root, b"f", 0o644, 0, 0).map(|_| ()));
    erofs(fs.mkdir(root, b"dir", 0o755, 0, 0).map(|_| ()));
    erofs(fs.rename(root, b"d", root, b"e", Default::default()));
    assert!(fs.lookup(root, b"d").is_ok(), "reads still work");
}

// ----- each subvolume tree's own namespace (S7), S2 and S3 -----

/// `with_subvolumes()` with a file `f` in subvolume 256. Returns the
/// builder and the file's inode number in tree 256.
fn with_subvolume_file() -> (FsBuilder, u64) {
    let mut b = with_subvolumes();
    let f = b.subvol_create(256, b"f");
    (b, f)
}

/// The report has a fault `id` located in tree `tree`.
fn assert_finds_in(report: &CheckReport, id: FaultId, tree: u64) {
    assert!(
        report.faults_with(id).any(|f| f.tree == Some(tree)),
        "no [{id}] fault in tree {tree}:\n{report}"
    );
}

/// An inode of subvolume `sv`'s tree rewritten by `f`.
fn modify_subvol_inode(b: &mut FsBuilder, sv: u64, ino: u64, f: impl FnOnce(&mut InodeItem)) {
    let key = Key::new(ino, item_type::INODE_ITEM, 0);
    let items = b.subvol_items_mut(sv);
    let mut inode = InodeItem::decode(&items[&key]).unwrap();
    f(&mut inode);
    items.insert(key, inode.encode());
}

#[test]
fn clean_subvolume_namespace_passes() {
    let (b, _) = with_subvolume_file();
    let report = check(&b.build());
    assert_clean(&report);
    // Every live tree's inodes are counted: tree 5's 6, the root
    // directories of 256, 257 and 258, and the file; not the dead 259's.
    assert_eq!(report.summary.inodes, 6 + 3 + 1, "{report}");
}

#[test]
fn check_finds_namespace_faults_in_a_subvolume() {
    let (mut b, f) = with_subvolume_file();
    // The file's DIR_INDEX: the newest in the root directory (after the
    // link of 258).
    let index_key = *b
        .subvol_items_mut(256)
        .keys()
        .rev()
        .find(|k| k.item_type == item_type::DIR_INDEX && k.objectid == ROOT_DIR_INO)
        .unwrap();
    b.subvol_items_mut(256).remove(&index_key);
    let report = check(&b.build());
    assert_finds_in(&report, FaultId::DirIndexMissing, 256);
    // The fault names the subvolume, not tree 5.
    assert!(report.to_string().contains("tree=subvol(256)"), "{report}");
    assert_only(&report, &[FaultId::DirIndexMissing]);
    // An unnamed inode of a subvolume: unreachable, nlink wrong.
    let (mut b, _) = with_subvolume_file();
    b.subvol_items_mut(256)
        .remove(&Key::new(f, item_type::INODE_REF, ROOT_DIR_INO));
    let report = check(&b.build());
    assert_finds_in(&report, FaultId::DirItemWithoutRef, 256);
    assert_finds_in(&report, FaultId::InodeUnreachable, 256);
    assert_finds_in(&report, FaultId::Nlink, 256);
}

#[test]
fn check_finds_nlink_and_orphan_faults_in_a_subvolume() {
    let (mut b, f) = with_subvolume_file();
    modify_subvol_inode(&mut b, 256, f, |i| i.nlink = 2);
    let report = check(&b.build());
    assert_finds_in(&report, FaultId::Nlink, 256);
    assert_only(&report, &[FaultId::Nlink]);
    // An unlinked inode without its orphan item.
    let mut b = with_subvolumes();
    let g = b.subvol_create(258, b"g");
    let items = b.subvol_items_mut(258);
    items.retain(|k, _| k.objectid == g || k.objectid == ROOT_DIR_INO);
    items.retain(|k, _| !(k.objectid == ROOT_DIR_INO && k.item_type != item_type::INODE_REF));
    items.remove(&Key::new(g, item_type::INODE_REF, ROOT_DIR_INO));
    modify_subvol_inode(&mut b, 258, g, |i| i.nlink = 0);
    let report = check(&b.build());
    assert_finds_in(&report, FaultId::UnlinkedWithoutOrphan, 258);
}

#[test]
fn check_finds_root_dir_fault_in_a_subvolume() {
    let mut b = with_subvolumes();
    b.subvol_items_mut(258)
        .remove(&Key::new(ROOT_DIR_INO, item_type::INODE_REF, ROOT_DIR_INO));
    let report = check(&b.build());
    assert_finds_in(&report, FaultId::RootDirWithoutRef, 258);
    assert_only(&report, &[FaultId::RootDirWithoutRef]);
}

/// A dead root is being taken apart by the cleaner: its namespace is not
/// checked (its nodes and file extents still are, for the extent tree).
#[test]
fn dead_subvolume_namespace_is_not_checked() {
    let mut b = with_subvolumes();
    b.subvol_items_mut(259)
        .remove(&Key::new(ROOT_DIR_INO, item_type::INODE_REF, ROOT_DIR_INO));
    assert_clean(&check(&b.build()));
}

#[test]
fn check_finds_file_extent_faults_in_a_subvolume() {
    let (mut b, f) = with_subvolume_file();
    modify_subvol_inode(&mut b, 256, f, |i| i.nbytes = 4096);
    let report = check(&b.build());
    assert_finds_in(&report, FaultId::Nbytes, 256);
    assert_only(&report, &[FaultId::Nbytes]);
}

#[test]
fn check_finds_xattr_and_acl_faults_in_a_subvolume() {
    let (mut b, f) = with_subvolume_file();
    let x = birch::format::Xattr {
        name: b"system.posix_acl_access".to_vec(),
        value: vec![1, 2, 3],
    };
    b.subvol_items_mut(256).insert(
        Key::new(f, item_type::XATTR_ITEM, birch::format::name_hash(&x.name)),
        birch::format::encode_xattrs(&[x]),
    );
    let report = check(&b.build());
    assert_finds_in(&report, FaultId::AclMalformed, 256);
    assert_only(&report, &[FaultId::AclMalformed]);
}

#[test]
fn check_finds_ino_out_of_range() {
    let (mut b, f) = with_subvolume_file();
    let items = b.subvol_items_mut(256);
    let inode = items[&Key::new(f, item_type::INODE_ITEM, 0)].clone();
    let big = birch::format::MAX_SUBVOL_INO;
    items.insert(Key::new(big, item_type::INODE_ITEM, 0), inode);
    let report = check(&b.build());
    assert_finds_in(&report, FaultId::InoOutOfRange, 256);
}

/// S2 over subvolumes: a data extent shared by a file of tree 5 and one
/// of subvolume 256 has refs 2; counting only tree 5's is a fault.
#[test]
fn check_finds_data_extent_refs_shared_by_a_subvolume() {
    let (mut b, f) = with_subvolume_file();
    let g = b.create(ROOT_DIR_INO, b"shared");
    let bytenr = b.write_extent(g, 0, 4096);
    let extent = birch::format::FileExtent::Regular {
        disk_bytenr: bytenr,
        disk_num_bytes: 4096,
        offset: 0,
        num_bytes: 4096,
    };
    b.subvol_items_mut(256)
        .insert(Key::new(f, item_type::EXTENT_DATA, 0), extent.encode());
    modify_subvol_inode(&mut b, 256, f, |i| {
        i.size = 4096;
        i.nbytes = 4096;
    });
    let mut fx = b.build();
    assert_clean(&check(&fx));
    fx.modify_item(
        tree_id::EXTENT,
        Key::new(bytenr, item_type::EXTENT_ITEM, 4096),
        |d| {
            let mut item = birch::format::ExtentItem::decode(d).unwrap();
            item.refs = 1;
            *d = item.encode();
        },
    );
    let report = check(&fx);
    assert_finds(&report, FaultId::DataExtentRefs);
    assert_only(&report, &[FaultId::DataExtentRefs]);
}

/// S3: tree 5 shares its children with a snapshot; they are not newer
/// than tree 5's last snapshot, else its CoW would change them in place.
#[test]
fn check_finds_shared_node_after_last_snapshot() {
    let mut b = sample();
    b.leaf_items_max = 4;
    b.enable_subvolumes();
    let mut fx = b.build();
    fx.snapshot_fs_tree(256);
    assert_clean(&check(&fx));
    let root_key = Key::new(tree_id::FS, item_type::ROOT_ITEM, 0);
    fx.modify_item(tree_id::ROOT, root_key, |d| {
        let mut item = birch::format::SubvolRootItem::decode(d).unwrap();
        item.last_snapshot -= 1;
        *d = item.encode();
    });
    let report = check(&fx);
    assert_finds_in(&report, FaultId::SharedNodeAfterLastSnapshot, tree_id::FS);
    assert_only(&report, &[FaultId::SharedNodeAfterLastSnapshot]);
}

/// Subvolumes the engine makes, with names and files in them, check
/// clean, every tree's inodes counted.
#[test]
fn engine_subvolumes_check_clean() {
    let dev = std::sync::Arc::new(birch::device::MemoryDevice::new(32 << 20));
    Filesystem::mkfs(dev.as_ref(), &Default::default()).unwrap();
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let root = fs.root_ino();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let a = fs.lookup(root, b"a").unwrap().ino;
    let d = fs.mkdir(a, b"d", 0o755, 0, 0).unwrap().ino;
    fs.create(d, b"f", 0o644, 0, 0).unwrap();
    fs.create(a, b"g", 0o644, 0, 0).unwrap();
    fs.create_subvolume(d, b"nested", 0, 0).unwrap();
    fs.sync().unwrap();
    drop(fs);
    let report = check_device(dev.as_ref());
    assert_clean(&report);
    // Tree 5's root; a's root, d, f, g; nested's root.
    assert_eq!(report.summary.inodes, 1 + 4 + 1, "{report}");
}
