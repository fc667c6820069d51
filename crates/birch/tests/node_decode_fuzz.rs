//! Property test: every decoder, and `check_device`, on random bytes and on
//! random mutations of valid nodes, superblocks, items and images. Each must
//! return Ok or Err (or a report), never panic.
//!
//! Seeded: a failure prints `BIRCH_SEED=<seed>`; set that variable to replay.
//! `BIRCH_FUZZ_SCALE=<n>` multiplies the iteration counts (default 1).

use birch::check::check_device;
use birch::check::fixture::{sample, Fixture, FsBuilder};
use birch::device::MemoryDevice;
use birch::format::{
    decode_dir_items, decode_inode_refs, decode_xattrs, tree_id, BackupRoot, DirEntry, ExtentItem,
    FileExtent, InodeItem, Key, MetadataProfile, Node, NodeBody, RootItem, RootRef, SubvolRootItem,
    Superblock, BACKUP_ROOT_COUNT, NODE_MAGIC, NODE_SIZE, ROOT_DIR_INO, SUPERBLOCK_MAGIC,
    SUPERBLOCK_OFFSETS, SUPERBLOCK_SIZE,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cell::RefCell;

/// Prints the seed and the case being run if the test panics.
struct Replay {
    test: &'static str,
    seed: u64,
    case: RefCell<String>,
}

impl Replay {
    fn new(test: &'static str) -> (Replay, ChaCha8Rng) {
        let seed = match std::env::var("BIRCH_SEED") {
            Ok(s) => s
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("BIRCH_SEED={s} is not a u64")),
            Err(_) => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                t ^ u64::from(std::process::id()).rotate_left(32)
            }
        };
        (
            Replay {
                test,
                seed,
                case: RefCell::new(String::new()),
            },
            ChaCha8Rng::seed_from_u64(seed),
        )
    }

    fn case(&self, what: impl Into<String>) {
        *self.case.borrow_mut() = what.into();
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{} failed during case: {}\nreplay with: BIRCH_SEED={} cargo test -p birch --test node_decode_fuzz {}", self.test, self.case.borrow(), self.seed, self.test);
        }
    }
}

fn scale() -> usize {
    std::env::var("BIRCH_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

fn seal_node(bytes: &mut [u8]) {
    let c = crc32c::crc32c(&bytes[4..]);
    bytes[0..4].copy_from_slice(&c.to_le_bytes());
}

fn seal_superblock(bytes: &mut [u8]) {
    seal_node(bytes);
}

/// Feeds `data` to every item decoder (whatever its real type).
fn decode_as_every_item(data: &[u8]) {
    let _ = InodeItem::decode(data);
    let _ = decode_inode_refs(data);
    let _ = decode_dir_items(data);
    let _ = DirEntry::decode(data);
    let _ = decode_xattrs(data);
    let _ = FileExtent::decode(data);
    let _ = RootItem::decode(data);
    let _ = RootItem::decode_either(data);
    let _ = SubvolRootItem::decode(data);
    let _ = RootRef::decode(data);
    let _ = ExtentItem::decode(data);
    for t in 0..=255u8 {
        let _ = birch::print::item_body(&Key::new(257, t, 0), data);
    }
}

/// Decodes a node and, when it decodes, prints it and decodes its items.
fn exercise_node(bytes: &[u8], bytenr: u64, fsid: &[u8; 16]) {
    let _ = birch::print::raw_node_header(bytes);
    let _ = birch::print::raw_leaf_offsets(bytes);
    if let Ok(node) = Node::decode(bytes, bytenr, fsid) {
        let _ = birch::print::node(&node, Some(bytes));
        let _ = birch::print::node(&node, None);
        if let NodeBody::Leaf(items) = &node.body {
            for item in items {
                let _ = birch::print::item_body(&item.key, &item.data);
            }
        }
    }
}

fn mutate(rng: &mut ChaCha8Rng, bytes: &mut [u8]) -> String {
    if bytes.is_empty() {
        return "nothing to mutate".into();
    }
    let at = rng.gen_range(0..bytes.len());
    if rng.gen_bool(0.5) {
        let bit = rng.gen_range(0..8);
        bytes[at] ^= 1 << bit;
        format!("flip bit {bit} of byte {at}")
    } else {
        let v: u8 = rng.gen();
        bytes[at] = v;
        format!("set byte {at} to {v:#04x}")
    }
}

/// Mutates mostly where the structure is (headers, item headers) so that
/// the interesting checks are reached, sometimes anywhere.
fn mutate_node(rng: &mut ChaCha8Rng, bytes: &mut [u8]) -> String {
    if rng.gen_bool(0.6) {
        let end = 64 + rng.gen_range(0..400);
        let at = rng.gen_range(4..end);
        let v: u8 = rng.gen();
        bytes[at] = v;
        format!("set structural byte {at} to {v:#04x}")
    } else {
        mutate(rng, bytes)
    }
}

/// The sample with 40 more files; `with_subvolumes`: also
/// `INCOMPAT_SUBVOLUMES`, two linked subvolumes (one nested), a dead one
/// and a default, so that long root items, root refs, links, orphan-root
/// and default items are among what is damaged.
fn fixture(with_subvolumes: bool) -> Fixture {
    let mut b = sample();
    if with_subvolumes {
        b.enable_subvolumes();
        let sv = b.subvolume(tree_id::FS, ROOT_DIR_INO, b"sv");
        b.subvolume(sv, ROOT_DIR_INO, b"nested");
        b.dead_subvolume();
        b.set_default_subvolume(sv);
    }
    for i in 0..40 {
        let ino = b.create(ROOT_DIR_INO, format!("f{i}").as_bytes());
        if i % 2 == 0 {
            b.write_inline(ino, b"data");
        } else {
            b.write_extent(ino, 0, 4096);
        }
    }
    b.leaf_items_max = 6;
    b.ptrs_max = 4;
    b.build()
}

fn block(fx: &Fixture, bytenr: u64) -> Vec<u8> {
    fx.image[bytenr as usize..bytenr as usize + NODE_SIZE].to_vec()
}

#[test]
fn random_bytes_to_every_decoder() {
    let (replay, mut rng) = Replay::new("random_bytes_to_every_decoder");
    let fsid = [9u8; 16];
    for i in 0..300 * scale() {
        let len = rng.gen_range(0..200);
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        replay.case(format!("item bytes #{i}: {data:02x?}"));
        decode_as_every_item(&data);

        // A random node, made to pass the checksum and magic (and often the
        // bytenr/fsid) so the body parser sees random headers.
        let mut node: Vec<u8> = (0..NODE_SIZE).map(|_| rng.gen()).collect();
        node[4..8].copy_from_slice(&NODE_MAGIC.to_le_bytes());
        let bytenr = 1u64 << 20;
        if rng.gen_bool(0.8) {
            node[8..16].copy_from_slice(&bytenr.to_le_bytes());
            node[40..56].copy_from_slice(&fsid);
        }
        if rng.gen_bool(0.8) {
            let nritems: u32 = rng.gen_range(0..700);
            node[32..36].copy_from_slice(&nritems.to_le_bytes());
            node[36] = rng.gen_range(0..3);
        }
        seal_node(&mut node);
        replay.case(format!("random node #{i}"));
        exercise_node(&node, bytenr, &fsid);

        let mut sb: Vec<u8> = (0..SUPERBLOCK_SIZE).map(|_| rng.gen()).collect();
        sb[8..16].copy_from_slice(&SUPERBLOCK_MAGIC.to_le_bytes());
        if rng.gen_bool(0.7) {
            sb[16..24].copy_from_slice(&SUPERBLOCK_OFFSETS[0].to_le_bytes());
        }
        seal_superblock(&mut sb);
        replay.case(format!("random superblock #{i}"));
        let _ = Superblock::decode(&sb, SUPERBLOCK_OFFSETS[0]);
    }
}

#[test]
fn mutated_nodes_and_items() {
    let (replay, mut rng) = Replay::new("mutated_nodes_and_items");
    let fixtures = [fixture(false), fixture(true)];
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    for fx in &fixtures {
        for n in &fx.nodes {
            if let NodeBody::Leaf(items) = &fx.node(n.bytenr).body {
                payloads.extend(items.iter().map(|i| i.data.clone()));
            }
        }
    }
    for i in 0..2000 * scale() {
        let fx = &fixtures[i % 2];
        let fsid = fx.fsid();
        let n = fx.nodes[rng.gen_range(0..fx.nodes.len())];
        let mut bytes = block(fx, n.bytenr);
        let mut what = Vec::new();
        for _ in 0..rng.gen_range(1..=3) {
            what.push(mutate_node(&mut rng, &mut bytes));
        }
        let sealed = rng.gen_bool(0.8);
        if sealed {
            seal_node(&mut bytes);
        }
        replay.case(format!(
            "node #{i} {} of {}: {} (resealed: {sealed})",
            n.bytenr,
            birch::format::tree_name(n.tree),
            what.join(", ")
        ));
        exercise_node(&bytes, n.bytenr, &fsid);

        let mut data = payloads[rng.gen_range(0..payloads.len())].clone();
        let what = match rng.gen_range(0..4) {
            0 if !data.is_empty() => {
                let cut = rng.gen_range(0..data.len());
                data.truncate(cut);
                format!("truncate to {cut}")
            }
            1 => {
                let extra = rng.gen_range(1..8);
                data.extend((0..extra).map(|_| rng.gen::<u8>()));
                format!("append {extra} bytes")
            }
            _ => mutate(&mut rng, &mut data),
        };
        replay.case(format!("item #{i}: {what}: {data:02x?}"));
        decode_as_every_item(&data);
    }
}

#[test]
fn mutated_superblocks() {
    let (replay, mut rng) = Replay::new("mutated_superblocks");
    let fx = fixture(true);
    let off = SUPERBLOCK_OFFSETS[0] as usize;
    let valid = fx.image[off..off + SUPERBLOCK_SIZE].to_vec();
    assert!(Superblock::decode(&valid, SUPERBLOCK_OFFSETS[0]).is_ok());
    for i in 0..2000 * scale() {
        let mut sb = valid.clone();
        let what = if rng.gen_bool(0.7) {
            // Mostly the fields.
            let at = rng.gen_range(4..128);
            let v: u8 = rng.gen();
            sb[at] = v;
            format!("set byte {at} to {v:#04x}")
        } else {
            mutate(&mut rng, &mut sb)
        };
        let sealed = rng.gen_bool(0.8);
        if sealed {
            seal_superblock(&mut sb);
        }
        replay.case(format!("superblock #{i}: {what} (resealed: {sealed})"));
        if let Ok(decoded) = Superblock::decode(&sb, SUPERBLOCK_OFFSETS[0]) {
            let _ = birch::print::superblock(&decoded, SUPERBLOCK_OFFSETS[0]);
        }
    }
}

/// One random damage to an image.
fn damage_image(rng: &mut ChaCha8Rng, fx: &Fixture, image: &mut [u8]) -> String {
    let pick = |rng: &mut ChaCha8Rng| fx.nodes[rng.gen_range(0..fx.nodes.len())];
    match rng.gen_range(0..9) {
        0..=4 => {
            let n = pick(rng);
            let b = n.bytenr as usize;
            let what = mutate_node(rng, &mut image[b..b + NODE_SIZE]);
            let sealed = rng.gen_bool(0.85);
            if sealed {
                seal_node(&mut image[b..b + NODE_SIZE]);
            }
            format!(
                "node {} of {}: {what} (resealed: {sealed})",
                n.bytenr,
                birch::format::tree_name(n.tree)
            )
        }
        5 => {
            let off = SUPERBLOCK_OFFSETS[rng.gen_range(0..2)] as usize;
            let at = rng.gen_range(16..128);
            let v: u8 = rng.gen();
            image[off + at] = v;
            seal_superblock(&mut image[off..off + SUPERBLOCK_SIZE]);
            format!("superblock at {off}: byte {at} = {v:#04x} (resealed)")
        }
        6 => {
            let n = pick(rng);
            image[n.bytenr as usize..n.bytenr as usize + NODE_SIZE].fill(0);
            format!("zero node {}", n.bytenr)
        }
        7 => {
            // Copy one node over another, fixing its bytenr so it decodes:
            // a misdirected write.
            let (a, b) = (pick(rng), pick(rng));
            let src = image[a.bytenr as usize..a.bytenr as usize + NODE_SIZE].to_vec();
            let dst = &mut image[b.bytenr as usize..b.bytenr as usize + NODE_SIZE];
            dst.copy_from_slice(&src);
            dst[8..16].copy_from_slice(&b.bytenr.to_le_bytes());
            seal_node(dst);
            format!("node {} copied over node {}", a.bytenr, b.bytenr)
        }
        8 => {
            // A pointer in an internal node (or a root item) aimed elsewhere.
            let n = pick(rng);
            let b = n.bytenr as usize;
            let target = fx.nodes[rng.gen_range(0..fx.nodes.len())].bytenr
                + if rng.gen_bool(0.2) { 4096 } else { 0 };
            let slot = rng.gen_range(0..4);
            let at = b + 64 + slot * 33 + 17;
            if n.level > 0 && at + 8 <= b + NODE_SIZE {
                image[at..at + 8].copy_from_slice(&target.to_le_bytes());
                seal_node(&mut image[b..b + NODE_SIZE]);
                format!("pointer slot {slot} of node {} -> {target}", n.bytenr)
            } else {
                "no-op (leaf picked for pointer damage)".into()
            }
        }
        _ => {
            // A pointer in a root item aimed elsewhere.
            let root = fx.superblock.root_tree_bytenr as usize;
            let target = fx.nodes[rng.gen_range(0..fx.nodes.len())].bytenr;
            let node = Node::decode(&image[root..root + NODE_SIZE], root as u64, &fx.fsid());
            match node {
                Ok(mut node) => {
                    if let NodeBody::Leaf(items) = &mut node.body {
                        if let Some(item) = items.first_mut() {
                            if let Ok(mut r) = RootItem::decode(&item.data) {
                                r.bytenr = target;
                                item.data = r.encode();
                            }
                        }
                    }
                    image[root..root + NODE_SIZE].copy_from_slice(&node.encode(&fx.fsid()));
                    format!("first root item -> {target}")
                }
                Err(_) => "no-op (root tree already damaged)".into(),
            }
        }
    }
}

#[test]
fn check_device_on_mutated_images() {
    let (replay, mut rng) = Replay::new("check_device_on_mutated_images");
    let fixtures = [fixture(false), fixture(true)];
    for fx in &fixtures {
        assert!(check_device(&fx.device()).is_clean());
    }
    let mut noticed = 0;
    let iterations = 250 * scale();
    for i in 0..iterations {
        let fx = &fixtures[i % 2];
        let mut image = fx.image.clone();
        let mut what = Vec::new();
        for _ in 0..rng.gen_range(1..=3) {
            what.push(damage_image(&mut rng, fx, &mut image));
        }
        if rng.gen_bool(0.1) {
            let len = rng.gen_range(0..image.len());
            image.truncate(len);
            what.push(format!("truncate to {len}"));
        }
        replay.case(format!(
            "image #{i} (subvolumes: {}): {}",
            i % 2 == 1,
            what.join("; ")
        ));
        let dev = MemoryDevice::from_bytes(image);
        let report = check_device(&dev);
        let _ = report.to_string();
        if !report.is_clean() {
            noticed += 1;
        }
        // The dump printers walk the same damage.
        let mut sink = std::io::sink();
        let _ = birch::print::tree(
            &mut sink,
            &dev,
            &fx.fsid(),
            tree_id::FS,
            fx.root_of(tree_id::FS).bytenr,
            fx.root_of(tree_id::FS).level,
            None,
        );
        let _ = birch::print::block(
            &mut sink,
            &dev,
            &fx.fsid(),
            fx.nodes[i % fx.nodes.len()].bytenr,
        );
    }
    // Most damage is visible (a mutation of unused node space, or of a
    // superblock copy that is then not used, may not be).
    assert!(
        noticed * 2 > iterations,
        "only {noticed} of {iterations} damaged images had faults"
    );
}

#[test]
fn check_device_on_random_images() {
    let (replay, mut rng) = Replay::new("check_device_on_random_images");
    for i in 0..20 * scale() {
        let len = rng.gen_range(0..(2usize << 20));
        let mut image: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        // Sometimes a valid-looking superblock pointing into the garbage.
        if rng.gen_bool(0.7) && len > SUPERBLOCK_OFFSETS[0] as usize + SUPERBLOCK_SIZE {
            let sb = Superblock {
                fsid: [1; 16],
                generation: rng.gen_range(0..10),
                root_tree_bytenr: rng.gen_range(0..len as u64 / 4096) * 4096,
                root_tree_level: rng.gen_range(0..3),
                total_bytes: len as u64,
                bytes_used: rng.gen(),
                log_root_bytenr: if rng.gen_bool(0.3) {
                    rng.gen_range(0..len as u64 / 4096) * 4096
                } else {
                    0
                },
                log_root_level: 0,
                log_generation: 0,
                backup_roots: [BackupRoot::EMPTY; BACKUP_ROOT_COUNT],
                metadata_profile: if rng.gen_bool(0.5) {
                    MetadataProfile::dup_for(len as u64)
                } else {
                    MetadataProfile::Single
                },
                data_checksums: rng.gen_bool(0.5),
                log_manifest: None,
                subvolumes: rng.gen_bool(0.5),
                compression: rng.gen_bool(0.5),
            };
            let off = SUPERBLOCK_OFFSETS[0] as usize;
            image[off..off + SUPERBLOCK_SIZE].copy_from_slice(&sb.encode(SUPERBLOCK_OFFSETS[0]));
        }
        replay.case(format!("random image #{i} of {len} bytes"));
        let report = check_device(&MemoryDevice::from_bytes(image));
        assert!(
            !report.is_clean(),
            "a random image checked clean:\n{report}"
        );
    }
    // An all-empty fixture filesystem is fine; garbage after it does not matter.
    let fx = FsBuilder::new(4 << 20).build();
    assert!(check_device(&fx.device()).is_clean());
}
