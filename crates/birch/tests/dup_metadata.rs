//! DUP metadata and read repair (docs/DUP.md): every tree node has a second
//! copy; a read that finds one copy bad serves the other and rewrites the
//! bad one. Each node of a populated image is damaged in turn, one copy at
//! a time, and the filesystem must read back exactly what was written,
//! count the repair, and check clean afterwards.

mod common;

use birch::check::{check_device, tree_nodes, tree_roots};
use birch::device::{BlockDevice, MemoryDevice, RecordingDevice};
use birch::format::{tree_id, MetadataProfile, Superblock, NODE_SIZE};
use birch::fs::{
    read_superblock, Filesystem, MetadataCopies, MkfsOptions, MountOptions, XattrSetMode,
};
use birch::Error;
use common::{view, Enumeration, View};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::sync::Arc;

const IMAGE_BYTES: u64 = 32 << 20;

/// Path -> sorted (xattr name, value) pairs.
type Xattrs = BTreeMap<String, Vec<(Vec<u8>, Vec<u8>)>>;

fn mkfs(metadata: MetadataCopies) -> Arc<MemoryDevice> {
    let dev = Arc::new(MemoryDevice::new(IMAGE_BYTES));
    Filesystem::mkfs(
        dev.as_ref(),
        &MkfsOptions {
            fsid: Some([0xd2; 16]),
            metadata,
            ..Default::default()
        },
    )
    .unwrap();
    dev
}

/// A few directories of files (inline and extent-backed), xattrs, hard
/// links and a symlink: enough items for multi-leaf fs and extent trees.
fn populate(fs: &Filesystem<Arc<MemoryDevice>>) {
    let root = fs.root_ino();
    let mut first_file = None;
    for d in 0..6u32 {
        let dir = fs
            .mkdir(root, format!("dir{d}").as_bytes(), 0o755, 0, 0)
            .unwrap()
            .ino;
        for f in 0..30u32 {
            let file = fs
                .create(dir, format!("file{f}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino;
            // Every third file is inline, the others get a data extent.
            let len = if f % 3 == 0 {
                700
            } else {
                5000 + 97 * f as usize
            };
            let data: Vec<u8> = (0..len)
                .map(|i| (i as u32 * 7 + f + d * 31) as u8)
                .collect();
            fs.write_file(file, 0, &data).unwrap();
            if f % 4 == 0 {
                let value = format!("value of {d}/{f}").repeat(f as usize % 5 + 1);
                fs.setxattr(
                    file,
                    b"user.note",
                    value.as_bytes(),
                    XattrSetMode::CreateOrReplace,
                )
                .unwrap();
            }
            first_file.get_or_insert(file);
        }
        fs.setxattr(
            dir,
            b"user.dir",
            format!("dir {d}").as_bytes(),
            XattrSetMode::Create,
        )
        .unwrap();
    }
    let first = first_file.unwrap();
    fs.link(first, root, b"hardlink").unwrap();
    fs.link(first, common::ino(fs, "dir5"), b"another-link")
        .unwrap();
    fs.symlink(root, b"sym", b"dir1/file4", 0, 0).unwrap();
}

fn xattrs(fs: &Filesystem<Arc<MemoryDevice>>, v: &View) -> Xattrs {
    v.keys()
        .filter(|p| !v[*p].starts_with(b"-> "))
        .map(|p| {
            let ino = common::ino(fs, p);
            let mut pairs: Vec<_> = fs
                .listxattr(ino)
                .unwrap()
                .into_iter()
                .map(|name| {
                    let value = fs.getxattr(ino, &name).unwrap();
                    (name, value)
                })
                .collect();
            pairs.sort();
            (p.clone(), pairs)
        })
        .collect()
}

/// A populated, committed DUP (or single) image and what it holds.
struct Image {
    bytes: Vec<u8>,
    view: View,
    xattrs: Xattrs,
}

fn populated_image(metadata: MetadataCopies) -> Image {
    let dev = mkfs(metadata);
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    populate(&fs);
    fs.sync().unwrap();
    let v = view(&fs);
    let x = xattrs(&fs, &v);
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "the populated image");
    Image {
        bytes: dev.snapshot(),
        view: v,
        xattrs: x,
    }
}

/// One tree node: where it lives and which tree it belongs to.
#[derive(Debug, Clone, Copy)]
struct NodeAt {
    bytenr: u64,
    tree: u64,
    is_root: bool,
}

/// Every node of every tree the superblock reaches: the root tree, each
/// tree a root item names, and the log root tree with its log trees.
fn every_node(dev: &MemoryDevice) -> Vec<NodeAt> {
    let sb = read_superblock(dev).unwrap();
    let (roots, problems) = tree_roots(dev, &sb);
    assert!(problems.is_empty(), "{problems:?}");
    let mut out = Vec::new();
    for root in roots {
        let (nodes, problems) = tree_nodes(dev, &sb.fsid, root);
        assert!(problems.is_empty(), "{problems:?}");
        out.extend(nodes.into_iter().map(|(bytenr, _)| NodeAt {
            bytenr,
            tree: root.tree,
            is_root: bytenr == root.bytenr,
        }));
    }
    out.sort_by_key(|n| n.bytenr);
    out
}

fn superblock(dev: &MemoryDevice) -> Superblock {
    read_superblock(dev).unwrap()
}

fn mirror_offset(dev: &MemoryDevice) -> u64 {
    match superblock(dev).metadata_profile {
        MetadataProfile::Dup { mirror_offset } => mirror_offset,
        MetadataProfile::Single => panic!("not a DUP image"),
    }
}

/// Overwrites 64 bytes at a random place of the node copy at `offset`.
fn damage(dev: &MemoryDevice, offset: u64, rng: &mut ChaCha8Rng) {
    let at = rng.gen_range(0..NODE_SIZE as u64 - 64);
    let junk: Vec<u8> = (0..64).map(|_| rng.gen()).collect();
    dev.write_at(&junk, offset + at).unwrap();
}

fn node_bytes(dev: &MemoryDevice, offset: u64) -> Vec<u8> {
    let mut buf = vec![0; NODE_SIZE];
    dev.read_at(&mut buf, offset).unwrap();
    buf
}

/// Mounts `dev`, requires it to hold `image`'s files, dirs and xattrs,
/// returns the repair counters, and closes it.
fn mount_and_compare(
    dev: &Arc<MemoryDevice>,
    image: &Image,
    what: &str,
    read_only: bool,
) -> birch::fs::FsStats {
    let options = MountOptions {
        read_only,
        ..MountOptions::deterministic()
    };
    let fs =
        Filesystem::open(dev.clone(), options).unwrap_or_else(|e| panic!("{what}: mount: {e}"));
    let v = view(&fs);
    assert_eq!(v, image.view, "{what}: files and dirs differ");
    assert_eq!(xattrs(&fs, &v), image.xattrs, "{what}: xattrs differ");
    let stats = fs.stats();
    fs.close().unwrap();
    stats
}

/// The test: each node of every tree, one copy at a time.
fn every_node_survives_damage_to(copy: usize) {
    let image = populated_image(MetadataCopies::Dup);
    let pristine = MemoryDevice::from_bytes(image.bytes.clone());
    let offset = mirror_offset(&pristine);
    let nodes = every_node(&pristine);
    let trees: std::collections::BTreeSet<u64> = nodes.iter().map(|n| n.tree).collect();
    assert!(
        trees.contains(&tree_id::ROOT)
            && trees.contains(&tree_id::EXTENT)
            && trees.contains(&tree_id::FS),
        "{trees:?}"
    );
    assert!(
        nodes.len() >= 10,
        "too small an image to be interesting: {nodes:?}"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(13 + copy as u64);
    for node in &nodes {
        let dev = Arc::new(MemoryDevice::from_bytes(image.bytes.clone()));
        let bad = node.bytenr + if copy == 0 { 0 } else { offset };
        let what = format!(
            "node {} of tree {}, copy {copy} at {bad}",
            node.bytenr, node.tree
        );
        damage(&dev, bad, &mut rng);
        let report = check_device(dev.as_ref());
        let copy_name = if copy == 0 {
            "primary copy"
        } else {
            "mirror copy"
        };
        assert!(
            report.fault_count() == 1
                && report
                    .to_string()
                    .contains(&format!("block={}", node.bytenr))
                && report
                    .to_string()
                    .contains(&format!("{copy_name} at {bad}")),
            "{what}: check must report exactly the bad copy:\n{report}"
        );
        // The repair happens on the read: the copy holds the good bytes
        // again before anything is written.
        let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
        let v = view(&fs);
        assert_eq!(v, image.view, "{what}: files and dirs differ");
        assert_eq!(xattrs(&fs, &v), image.xattrs, "{what}: xattrs differ");
        let stats = fs.stats();
        assert_eq!(
            (
                stats.metadata_bad_copies,
                stats.metadata_repairs,
                stats.metadata_unrepairable
            ),
            (1, 1, 0),
            "{what}"
        );
        assert_eq!(
            node_bytes(&dev, bad),
            node_bytes(&pristine, bad),
            "{what}: not repaired"
        );
        fs.close().unwrap();
        let report = check_device(dev.as_ref());
        assert!(report.is_clean(), "{what}: after the repair:\n{report}");
    }
    eprintln!("damaged and repaired copy {copy} of {} nodes", nodes.len());
}

#[test]
fn every_node_survives_a_damaged_primary_copy() {
    every_node_survives_damage_to(0);
}

#[test]
fn every_node_survives_a_damaged_mirror_copy() {
    every_node_survives_damage_to(1);
}

#[test]
fn both_copies_damaged_is_a_clear_error_naming_the_block() {
    let image = populated_image(MetadataCopies::Dup);
    let pristine = MemoryDevice::from_bytes(image.bytes.clone());
    let offset = mirror_offset(&pristine);
    let mut rng = ChaCha8Rng::seed_from_u64(7);

    // The fs tree's root: the mount itself fails, naming the block.
    let nodes = every_node(&pristine);
    let fs_root = nodes
        .iter()
        .find(|n| n.tree == tree_id::FS && n.is_root)
        .unwrap()
        .bytenr;
    let dev = Arc::new(MemoryDevice::from_bytes(image.bytes.clone()));
    damage(&dev, fs_root, &mut rng);
    damage(&dev, fs_root + offset, &mut rng);
    let err = Filesystem::open(dev.clone(), MountOptions::deterministic())
        .err()
        .expect("a tree root with no good copy cannot mount");
    let msg = err.to_string();
    assert!(matches!(err, Error::Corrupt(_)), "{msg}");
    assert!(
        msg.contains(&format!("block={fs_root}")) && msg.contains("mirror copy at"),
        "{msg}"
    );
    let report = check_device(dev.as_ref());
    assert!(report.fault_count() >= 2, "{report}");

    // A leaf below the root: the mount works, reading through the leaf
    // fails with the corruption, never with wrong data.
    let leaf = nodes
        .iter()
        .find(|n| n.tree == tree_id::FS && !n.is_root)
        .expect("the fs tree has more than one node");
    let dev = Arc::new(MemoryDevice::from_bytes(image.bytes.clone()));
    damage(&dev, leaf.bytenr, &mut rng);
    damage(&dev, leaf.bytenr + offset, &mut rng);
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let mut first_error = None;
    for path in image.view.keys() {
        let walked = (|| -> birch::Result<Vec<u8>> {
            let mut cur = fs.root_ino();
            for part in path.split('/').filter(|p| !p.is_empty()) {
                cur = fs.lookup(cur, part.as_bytes())?.ino;
            }
            let attr = fs.getattr(cur)?;
            if attr.file_type == birch::format::FileType::Regular {
                return fs.read_file(cur, 0, attr.size as usize);
            }
            Ok(image.view[path].clone())
        })();
        match walked {
            Ok(data) => assert_eq!(data, image.view[path], "{path}: wrong data"),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let err = first_error.expect("some path lives in the damaged leaf");
    assert!(
        err.to_string().contains(&format!("block={}", leaf.bytenr)),
        "{err}"
    );
    assert!(fs.stats().metadata_unrepairable >= 1);
    drop(fs);
}

#[test]
fn read_only_mount_serves_the_good_copy_without_writing() {
    let image = populated_image(MetadataCopies::Dup);
    let pristine = MemoryDevice::from_bytes(image.bytes.clone());
    let node = every_node(&pristine)[0];
    let dev = Arc::new(MemoryDevice::from_bytes(image.bytes.clone()));
    damage(&dev, node.bytenr, &mut ChaCha8Rng::seed_from_u64(3));
    let damaged = node_bytes(&dev, node.bytenr);
    let stats = mount_and_compare(&dev, &image, "read-only", true);
    assert_eq!((stats.metadata_bad_copies, stats.metadata_repairs), (1, 0));
    assert_eq!(
        node_bytes(&dev, node.bytenr),
        damaged,
        "a read-only mount wrote"
    );
    // A read-write mount then repairs it.
    let stats = mount_and_compare(&dev, &image, "read-write", false);
    assert_eq!(stats.metadata_repairs, 1);
    common::assert_clean(dev.as_ref(), "after the read-write mount");
}

#[test]
fn log_tree_nodes_are_mirrored_and_repaired_at_replay() {
    let dev = mkfs(MetadataCopies::Dup);
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let root = fs.root_ino();
    fs.sync().unwrap();
    let mut files = Vec::new();
    for i in 0..40u32 {
        let ino = fs
            .create(root, format!("logged{i}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        fs.write_file(ino, 0, &vec![i as u8; 3000]).unwrap();
        files.push(ino);
    }
    for &ino in &files {
        fs.fsync(ino, false).unwrap();
    }
    // The power cut: the image as the last log sync left it.
    let crashed = dev.snapshot();
    drop(fs);
    let pristine = MemoryDevice::from_bytes(crashed.clone());
    let offset = mirror_offset(&pristine);
    let log_nodes: Vec<NodeAt> = every_node(&pristine)
        .into_iter()
        .filter(|n| n.tree == tree_id::LOG || n.tree == tree_id::LOG_ROOT)
        .collect();
    assert!(log_nodes.len() >= 2, "{log_nodes:?}");
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for node in &log_nodes {
        for bad in [node.bytenr, node.bytenr + offset] {
            let dev = Arc::new(MemoryDevice::from_bytes(crashed.clone()));
            damage(&dev, bad, &mut rng);
            let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
            assert!(
                matches!(
                    fs.replay_outcome(),
                    Some(birch::fs::ReplayOutcome::Replayed(_))
                ),
                "log node {} copy at {bad}: {:?}",
                node.bytenr,
                fs.replay_outcome()
            );
            let v = view(&fs);
            for i in 0..40u32 {
                common::require_content(&v, &format!("/logged{i}"), &vec![i as u8; 3000]).unwrap();
            }
            assert_eq!(
                fs.stats().metadata_repairs,
                1,
                "log node {} copy at {bad}",
                node.bytenr
            );
            fs.close().unwrap();
            common::assert_clean(dev.as_ref(), "after replay with a repaired log node");
        }
    }
}

#[test]
fn single_images_keep_one_copy_and_zero_new_superblock_bytes() {
    let image = populated_image(MetadataCopies::Single);
    let dev = Arc::new(MemoryDevice::from_bytes(image.bytes.clone()));
    assert_eq!(superblock(&dev).metadata_profile, MetadataProfile::Single);
    let mut raw = vec![0u8; 4096];
    dev.read_at(&mut raw, 65536).unwrap();
    // Its only incompat flag is data checksums' (mkfs's default).
    assert_eq!(
        raw[112..120],
        birch::format::INCOMPAT_DATA_CSUMS.to_le_bytes(),
        "a single image's incompat flags"
    );
    assert!(
        raw[120..256].iter().all(|&b| b == 0),
        "a single image sets new superblock bytes"
    );
    // Without a second copy a damaged node is an error naming it.
    let node = every_node(&dev)[0];
    damage(&dev, node.bytenr, &mut ChaCha8Rng::seed_from_u64(5));
    let report = check_device(dev.as_ref());
    assert!(
        report
            .to_string()
            .contains(&format!("block={}", node.bytenr)),
        "{report}"
    );
}

#[test]
fn dup_costs_one_mirror_per_node_in_bytes_used() {
    let dup = populated_image(MetadataCopies::Dup);
    let single = populated_image(MetadataCopies::Single);
    let used = |bytes: &[u8]| superblock(&MemoryDevice::from_bytes(bytes.to_vec())).bytes_used;
    let nodes = |bytes: &[u8]| every_node(&MemoryDevice::from_bytes(bytes.to_vec())).len() as u64;
    let (dup_used, single_used) = (used(&dup.bytes), used(&single.bytes));
    // Both images hold the same data; the DUP one counts every node twice.
    let data = single_used - nodes(&single.bytes) * NODE_SIZE as u64;
    assert_eq!(dup_used, data + 2 * nodes(&dup.bytes) * NODE_SIZE as u64);
    eprintln!(
        "sample image: {} nodes; bytes_used single {single_used}, dup {dup_used} (+{})",
        nodes(&dup.bytes),
        dup_used - single_used
    );
}

/// The mirror writes are ordinary writes before the commit's first flush:
/// every crash state of a commit has both copies of every node the durable
/// superblock reaches (`birch check`, run on each state, verifies both).
#[test]
fn dup_mirror_writes_are_covered_by_commit_flush() {
    let rec = Arc::new(RecordingDevice::new(mkfs(MetadataCopies::Dup).snapshot()));
    let fs = Filesystem::open(rec.clone(), MountOptions::deterministic()).unwrap();
    let root = fs.root_ino();
    for i in 0..20u32 {
        let ino = fs
            .create(root, format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        fs.write_file(ino, 0, &vec![b'a' + i as u8; 6000]).unwrap();
    }
    let from = rec.flush_count();
    fs.sync().unwrap();
    drop(fs);
    let states =
        common::for_every_crash_after(&rec, from, &Enumeration::sampled(17), |v| match v.len() {
            0 => Ok(()),
            20 => (0..20u32).try_for_each(|i| {
                common::require_content(v, &format!("/f{i}"), &vec![b'a' + i as u8; 6000])
            }),
            n => Err(format!("{n} files: neither before nor after the commit")),
        });
    assert!(states > 2);
}

/// `birch scrub` on an image: every copy of every node is read; bad copies
/// anywhere are rewritten in one pass; a node with no good copy is
/// reported, never "repaired".
#[test]
fn scrub_repairs_every_bad_copy_and_reports_what_it_cannot() {
    let image = populated_image(MetadataCopies::Dup);
    let pristine = MemoryDevice::from_bytes(image.bytes.clone());
    let offset = mirror_offset(&pristine);
    let nodes = every_node(&pristine);
    let dev = Arc::new(MemoryDevice::from_bytes(image.bytes.clone()));
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    // Alternate copies over every node: one bad copy each.
    for (i, node) in nodes.iter().enumerate() {
        damage(
            &dev,
            node.bytenr + if i % 2 == 0 { 0 } else { offset },
            &mut rng,
        );
    }
    let report = birch::scrub::scrub_device(dev.as_ref()).unwrap();
    assert_eq!(
        (report.nodes, report.copies, report.repaired.len()),
        (nodes.len() as u64, 2 * nodes.len() as u64, nodes.len()),
        "{report}"
    );
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        dev.snapshot(),
        image.bytes,
        "scrub must restore the image exactly"
    );
    let again = birch::scrub::scrub_device(dev.as_ref()).unwrap();
    assert!(again.repaired.is_empty() && again.is_clean(), "{again}");

    // Both copies of a leaf: unrepaired, named, and its bytes left alone.
    let leaf = nodes
        .iter()
        .find(|n| n.tree == tree_id::FS && !n.is_root)
        .unwrap();
    damage(&dev, leaf.bytenr, &mut rng);
    damage(&dev, leaf.bytenr + offset, &mut rng);
    let damaged = dev.snapshot();
    let report = birch::scrub::scrub_device(dev.as_ref()).unwrap();
    assert!(!report.is_clean(), "{report}");
    assert!(
        report.unrepaired[0].contains(&format!(
            "block {} of tree fs(5): no good copy",
            leaf.bytenr
        )),
        "{report}"
    );
    assert_eq!(
        dev.snapshot(),
        damaged,
        "scrub wrote over a node with no good copy"
    );
}

/// `scrub::scrub_filesystem` on an open filesystem: one bad copy of every node
/// of the durable commit, damaged while it is open, is repaired in one
/// pass while an fsync goes on through the log; the scrub counters show
/// the nodes it read; a second scrub finds nothing.
#[test]
fn mounted_scrub_repairs_the_durable_commit_while_it_is_open() {
    let image = populated_image(MetadataCopies::Dup);
    let pristine = MemoryDevice::from_bytes(image.bytes.clone());
    let offset = mirror_offset(&pristine);
    let nodes = every_node(&pristine);
    let dev = Arc::new(MemoryDevice::from_bytes(image.bytes.clone()));
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(34);
    for (i, node) in nodes.iter().enumerate() {
        damage(
            &dev,
            node.bytenr + if i % 2 == 0 { 0 } else { offset },
            &mut rng,
        );
    }
    // A change made durable through the log writes new blocks only (the
    // nodes it reads that were not cached are repaired by those reads).
    let ino = fs
        .create(fs.root_ino(), b"logged", 0o644, 0, 0)
        .unwrap()
        .ino;
    fs.write_file(ino, 0, &[7; 5000]).unwrap();
    fs.fsync(ino, false).unwrap();
    let read_repairs = fs.stats().metadata_repairs;
    let report = birch::scrub::scrub_filesystem(&fs).unwrap();
    assert_eq!(
        (report.nodes, report.copies),
        (nodes.len() as u64, 2 * nodes.len() as u64),
        "{report}"
    );
    assert_eq!(
        report.repaired.len() as u64 + read_repairs,
        nodes.len() as u64,
        "every damaged copy is repaired once, by the scrub or a read: {report}"
    );
    assert!(report.repaired.len() as u64 > read_repairs, "{report}");
    assert!(report.is_clean(), "{report}");
    for node in &nodes {
        let good = node_bytes(&pristine, node.bytenr);
        assert_eq!(node_bytes(&dev, node.bytenr), good, "{node:?}");
        assert_eq!(node_bytes(&dev, node.bytenr + offset), good, "{node:?}");
    }
    assert_eq!(fs.stats().scrub_nodes, nodes.len() as u64);
    let again = birch::scrub::scrub_filesystem(&fs).unwrap();
    assert!(again.repaired.is_empty() && again.is_clean(), "{again}");
    assert_eq!(fs.stats().scrub_nodes, 2 * nodes.len() as u64);
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the mounted scrubs");
}

/// A read-only filesystem's scrub verifies and writes nothing: a bad copy
/// is reported as not rewritten, and the scrub is not clean.
#[test]
fn mounted_scrub_of_a_read_only_filesystem_writes_nothing() {
    let image = populated_image(MetadataCopies::Dup);
    let dev = Arc::new(MemoryDevice::from_bytes(image.bytes.clone()));
    let options = MountOptions {
        read_only: true,
        ..MountOptions::deterministic()
    };
    let fs = Filesystem::open(dev.clone(), options).unwrap();
    let node = superblock(&dev).root_tree_bytenr;
    damage(&dev, node, &mut ChaCha8Rng::seed_from_u64(35));
    let damaged = dev.snapshot();
    let report = birch::scrub::scrub_filesystem(&fs).unwrap();
    assert!(!report.is_clean() && report.repaired.is_empty(), "{report}");
    assert_eq!(report.unrepaired.len(), 1, "{report}");
    assert!(
        report.unrepaired[0].contains(&format!("block {node} of tree root(1): primary copy"))
            && report.unrepaired[0].ends_with("not rewritten: the filesystem is mounted read-only"),
        "{report}"
    );
    assert!(dev.snapshot() == damaged, "a read-only scrub wrote");
}

/// Fills directory `dir` with `dirs` directories of `files` files each,
/// every file with a data extent of its own: many leaves under an
/// internal root.
fn fill_subvolume(fs: &Filesystem<Arc<MemoryDevice>>, dir: u64, dirs: u32, files: u32) {
    for d in 0..dirs {
        let sub = fs
            .mkdir(dir, format!("dir{d}").as_bytes(), 0o755, 0, 0)
            .unwrap()
            .ino;
        for f in 0..files {
            let file = fs
                .create(sub, format!("file-{f:04}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino;
            fs.write_file(file, 0, &vec![(d * 7 + f) as u8; 5000])
                .unwrap();
        }
    }
}

/// A DUP image holding subvolume `sv` (id 256), its snapshots `s1` (257,
/// writable, then changed: a file rewritten and one created, so part of
/// its tree is its own) and `s2` (258, read-only), and subvolume `other`
/// (259, no snapshots). `sv/dir1/shared` holds 0xab bytes, the changed
/// `s1/dir2/file-0007` 0xee bytes, no other file either. Returns the
/// image's bytes.
fn snapshot_family_image() -> Vec<u8> {
    let dev = mkfs(MetadataCopies::Dup);
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let root = fs.root_ino();
    let sv = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    fill_subvolume(&fs, common::ino(&fs, "sv"), 4, 40);
    let shared = fs
        .create(common::ino(&fs, "sv/dir1"), b"shared", 0o644, 0, 0)
        .unwrap()
        .ino;
    fs.write_file(shared, 0, &[0xab; 8192]).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.create_snapshot(sv, root, b"s1", false).unwrap(), 257);
    assert_eq!(fs.create_snapshot(sv, root, b"s2", true).unwrap(), 258);
    let changed = common::ino(&fs, "s1/dir2/file-0007");
    fs.write_file(changed, 0, &[0xee; 9000]).unwrap();
    fs.create(common::ino(&fs, "s1/dir3"), b"new", 0o644, 0, 0)
        .unwrap();
    assert_eq!(fs.create_subvolume(root, b"other", 0, 0).unwrap(), 259);
    fill_subvolume(&fs, common::ino(&fs, "other"), 6, 40);
    fs.sync().unwrap();
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "the snapshot family image");
    dev.snapshot()
}

/// Each tree's nodes, by tree id (a node shared by snapshots is listed
/// under each tree that reaches it).
fn nodes_by_tree(dev: &MemoryDevice) -> BTreeMap<u64, std::collections::BTreeSet<u64>> {
    let sb = read_superblock(dev).unwrap();
    let (roots, problems) = tree_roots(dev, &sb);
    assert!(problems.is_empty(), "{problems:?}");
    let mut out: BTreeMap<u64, std::collections::BTreeSet<u64>> = BTreeMap::new();
    for root in roots {
        let (nodes, problems) = tree_nodes(dev, &sb.fsid, root);
        assert!(problems.is_empty(), "{problems:?}");
        out.entry(root.tree)
            .or_default()
            .extend(nodes.into_iter().map(|(bytenr, _)| bytenr));
    }
    out
}

/// `birch scrub` of subvolumes and their snapshots (docs/SNAPSHOTS.md,
/// step 10): every subvolume's tree is covered, a node shared by
/// snapshots is read once (the node count is the number of distinct
/// nodes, which the extent tree also counts, not nodes × trees), and a
/// bad copy of a node only the changed snapshot reaches is repaired.
#[test]
fn scrub_reads_each_shared_node_once_and_repairs_a_snapshot_only_node() {
    let image = snapshot_family_image();
    let pristine = MemoryDevice::from_bytes(image.clone());
    let offset = mirror_offset(&pristine);
    let by_tree = nodes_by_tree(&pristine);
    let distinct: std::collections::BTreeSet<u64> = by_tree.values().flatten().copied().collect();
    let per_tree: usize = by_tree.values().map(|n| n.len()).sum();
    assert!(
        per_tree > distinct.len(),
        "the snapshots share nodes: {per_tree} per tree, {} distinct",
        distinct.len()
    );
    let summary = check_device(&pristine).summary;
    assert_eq!(summary.metadata_extents, distinct.len() as u64);
    // A node of s1 no other tree reaches.
    let only_s1 = by_tree[&257]
        .iter()
        .copied()
        .find(|b| by_tree.iter().all(|(t, n)| *t == 257 || !n.contains(b)))
        .expect("s1 has nodes of its own");
    assert!(by_tree[&256].len() > 1 && by_tree[&258].len() > 1);

    let dev = Arc::new(MemoryDevice::from_bytes(image.clone()));
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    damage(&dev, only_s1 + offset, &mut rng);
    let report = birch::scrub::scrub_device(dev.as_ref()).unwrap();
    assert_eq!(
        (report.nodes, report.copies),
        (distinct.len() as u64, 2 * distinct.len() as u64),
        "{report}"
    );
    assert_eq!(report.repaired.len(), 1, "{report}");
    assert!(
        report.repaired[0]
            .starts_with(&format!("block {only_s1} of tree subvol(257): mirror copy")),
        "{report}"
    );
    assert!(report.is_clean(), "{report}");
    assert!(
        dev.snapshot() == image,
        "scrub must restore the image exactly"
    );
    // The data extents are the extent tree's: each read once, however
    // many snapshots share it.
    assert_eq!(report.data_extents, summary.data_extents, "{report}");

    // A bad data block is named in every subvolume that shares it, and
    // only there.
    for (byte, users) in [(0xab, &[256, 257, 258][..]), (0xee, &[257])] {
        let dev = MemoryDevice::from_bytes(image.clone());
        let block = image
            .chunks(4096)
            .position(|b| b.iter().all(|&x| x == byte))
            .expect("the file's block") as u64
            * 4096;
        dev.write_at(&[0x5a; 16], block + 100).unwrap();
        let report = birch::scrub::scrub_device(&dev).unwrap();
        assert_eq!(report.data_blocks_bad, 1, "{report}");
        let line = &report.unrepaired[0];
        assert!(
            line.starts_with(&format!("data block {block}: checksum")),
            "{line}"
        );
        for tree in [256, 257, 258, 259] {
            let path = if byte == 0xab {
                "/dir1/shared offset 0"
            } else {
                "/dir2/file-0007 offset 0"
            };
            assert_eq!(
                line.contains(&format!("subvolume {tree} {path}")),
                users.contains(&tree),
                "subvolume {tree}: {line}"
            );
        }
    }
}

/// A deleted subvolume whose drop was interrupted: scrub walks its tree
/// only right of the drop's progress (docs/SNAPSHOTS.md (d)). What the
/// cleaner released is free space, which a later commit may reuse: read
/// through the dead root it is not a node of any tree (and "repairing" it
/// would write over whatever reused it).
#[test]
fn scrub_skips_what_the_cleaner_released() {
    let dev = Arc::new(MemoryDevice::from_bytes(snapshot_family_image()));
    let options = MountOptions {
        cleaner_nodes_per_transaction: 1,
        ..MountOptions::deterministic()
    };
    let fs = Filesystem::open(dev.clone(), options).unwrap();
    let root = fs.root_ino();
    fs.delete_subvolume(root, b"other").unwrap();
    fs.delete_subvolume(root, b"s1").unwrap();
    fs.commit().unwrap();
    for _ in 0..3 {
        assert!(fs.run_cleaner().unwrap(), "the drops take more steps");
    }
    fs.shut_down();
    drop(fs);
    let check = check_device(dev.as_ref());
    assert!(check.is_clean(), "{check}");
    assert!(
        check
            .summary
            .deleted_subvolumes
            .iter()
            .any(|&(_, progress)| progress > birch::format::Key::MIN),
        "a drop in progress: {check}"
    );
    let report = birch::scrub::scrub_device(dev.as_ref()).unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        report.nodes,
        check.summary.metadata_extents + check.summary.log_nodes,
        "{report}"
    );
}
