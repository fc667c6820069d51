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
    assert_only(&report, &[FaultId::SubvolLinkDangling]);
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
