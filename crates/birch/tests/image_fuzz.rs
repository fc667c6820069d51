//! Structure-aware image fuzzer: a small valid image built by the engine
//! (files, a directory, xattrs, hard links, a symlink, inline, regular and
//! compressed extents, data checksums, and an fsync log not yet committed, so that
//! every open replays it), then, per case, one field of one node header,
//! item header, item body or superblock set to an edge value (or, one
//! case in eight, a second pointer to a child another slot names and/or a
//! node's METADATA_ITEM refs changed: pointers and counts that disagree), with every
//! checksum recomputed (the node's, its DUP mirror's, the superblock
//! copies') so the mutation gets past the checksum gate. Each case then
//! runs `birch check`'s library entry, an open with log replay, a full walk
//! (readdir, stat, read, readlink, xattrs of everything reachable) and
//! writes (a create in every directory reached, a write, an fsync, a
//! commit). Errors are the expected answer; a panic is a failure.
//!
//! `node_decode_fuzz` throws random bytes at the decoders one at a time;
//! this fuzzer keeps everything but one field valid, so the mutation
//! reaches the code that does arithmetic with decoded values (docs/CHECK.md,
//! "Hostile images").
//!
//! Replay and long runs (README, "Long modes"):
//! - `BIRCH_FUZZ_SEED=S` (default: a fixed seed) and `BIRCH_FUZZ_CASES=N`
//!   (default 1200) run cases 0..N of seed S; a failure prints both, and
//!   `BIRCH_FUZZ_CASE=I` runs case I alone.
//! - `BIRCH_FUZZ_SECONDS=T` keeps running cases until T seconds have passed
//!   (the case count is then only a floor).

use birch::check::{check_device, check_device_with, CheckOptions};
use birch::device::{BlockDevice, MemoryDevice};
use birch::format::{
    item_type, tree_id, FileType, Key, Node, NodeBody, RootItem, NODE_SIZE, SUPERBLOCK_OFFSETS,
    SUPERBLOCK_SIZE,
};
use birch::fs::{read_superblock, Filesystem, MountOptions, XattrSetMode};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const IMAGE_BYTES: u64 = 16 << 20;
const DEFAULT_SEED: u64 = 0x6269_7263_685f_667a;
const DEFAULT_CASES: u64 = 1200;

/// Node header fields (offset, width) of docs/FORMAT.md's node layout.
const NODE_HEADER_FIELDS: &[(&str, usize, usize)] = &[
    ("bytenr", 8, 8),
    ("generation", 16, 8),
    ("owner", 24, 8),
    ("nritems", 32, 4),
    ("level", 36, 1),
];
const BODY: usize = 64;
const KEY_SIZE: usize = 17;
const LEAF_ITEM_HEADER: usize = KEY_SIZE + 8;
const KEY_PTR: usize = KEY_SIZE + 16;

/// Superblock fields (offset, width) as `Superblock::encode` lays them out.
const SUPERBLOCK_FIELDS: &[(&str, usize, usize)] = &[
    ("generation", 40, 8),
    ("root_tree_bytenr", 48, 8),
    ("root_tree_level", 56, 8),
    ("total_bytes", 64, 8),
    ("bytes_used", 72, 8),
    ("log_root_bytenr", 88, 8),
    ("log_root_level", 96, 8),
    ("log_generation", 104, 8),
    ("incompat_flags", 112, 8),
    ("mirror_offset", 120, 8),
    ("log_manifest_previous_bytenr", 128, 8),
    ("log_manifest_nodes", 152, 4),
    ("backup_root_0", 256, 8),
    ("backup_root_0+8", 264, 8),
    ("backup_root_0+16", 272, 8),
    ("backup_root_0+24", 280, 8),
];

/// u64 edges, as the brief lists them, and small values.
const EDGES: &[u64] = &[
    0,
    1,
    2,
    1 << 63,
    u64::MAX,
    u64::MAX - 1,
    u64::MAX - 4095,
    u64::MAX - 16383,
    4096,
    16384,
];

/// One change to the image: `width` bytes at `at` (relative to the node or
/// superblock copy) set to the low bytes of `value`, little-endian.
#[derive(Debug, Clone)]
struct Mutation {
    /// A node's bytenr, or `None` for every superblock copy.
    node: Option<u64>,
    /// Whether the DUP mirror (or, for the superblock, the second copy)
    /// gets the same change: its copy is then as bad as the primary, and
    /// read repair or the other superblock cannot hide the mutation.
    both_copies: bool,
    what: String,
    at: usize,
    width: usize,
    value: u64,
}

impl std::fmt::Display for Mutation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.node {
            Some(b) => write!(f, "node {b}")?,
            None => f.write_str("superblock")?,
        }
        write!(
            f,
            ": {} (byte {}, {} bytes) = {:#x}{}",
            self.what,
            self.at,
            self.width,
            self.value,
            if self.both_copies {
                ""
            } else {
                " (primary copy only)"
            }
        )
    }
}

/// The image every case starts from, with the nodes it holds.
struct Base {
    bytes: Vec<u8>,
    mirror_offset: Option<u64>,
    /// Every node the superblock reaches (trees and log trees):
    /// (bytenr, decoded).
    nodes: Vec<(u64, Node)>,
}

/// The nodes reachable from the superblock: the root tree, every tree it
/// names, the log root tree and every log it names.
fn live_nodes(bytes: &[u8], sb: &birch::format::Superblock) -> Vec<(u64, Node)> {
    let mut stack = vec![sb.root_tree_bytenr];
    if sb.log_root_bytenr != 0 {
        stack.push(sb.log_root_bytenr);
    }
    let mut nodes: Vec<(u64, Node)> = Vec::new();
    while let Some(bytenr) = stack.pop() {
        if nodes.iter().any(|(b, _)| *b == bytenr) {
            continue;
        }
        let block = &bytes[bytenr as usize..bytenr as usize + NODE_SIZE];
        let node = Node::decode(block, bytenr, &sb.fsid).expect("the base image's nodes decode");
        match &node.body {
            NodeBody::Internal(ptrs) => stack.extend(ptrs.iter().map(|p| p.blockptr)),
            NodeBody::Leaf(items) => stack.extend(
                items
                    .iter()
                    .filter(|i| i.key.item_type == item_type::ROOT_ITEM)
                    .map(|i| RootItem::decode(&i.data).expect("root item").bytenr),
            ),
        }
        nodes.push((bytenr, node));
    }
    nodes.sort_by_key(|(b, _)| *b);
    nodes
}

/// Builds the base image through the engine: a committed part, then
/// changes made durable only by an fsync's log (the snapshot is taken
/// before any commit, so every open replays that log).
fn build_base() -> Base {
    let dev = std::sync::Arc::new(MemoryDevice::new(IMAGE_BYTES));
    Filesystem::mkfs(
        dev.as_ref(),
        &birch::fs::MkfsOptions {
            fsid: Some([0x5a; 16]),
            ..Default::default()
        },
    )
    .expect("mkfs");
    // compress=zstd: runs of two pages or more become compressed extents
    // (docs/COMPRESSION.md), single pages stay regular.
    let options = MountOptions {
        compress: birch::fs::CompressOption::parse("zstd", false).unwrap(),
        ..MountOptions::deterministic()
    };
    let fs = Filesystem::open(dev.clone(), options).expect("open");
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let small = fs.create(d, b"small", 0o644, 0, 0).unwrap().ino;
    fs.write_file(small, 0, b"inline data").unwrap();
    // Small text: a compressed inline extent (docs/COMPRESSION.md).
    let text = fs.create(d, b"text", 0o644, 0, 0).unwrap().ino;
    fs.write_file(text, 0, &small_text(3000)).unwrap();
    let big = fs.create(root, b"big", 0o644, 0, 0).unwrap().ino;
    fs.write_file(big, 0, &vec![0xb1; 12288]).unwrap();
    fs.setxattr(big, b"user.a", b"1", XattrSetMode::Create)
        .unwrap();
    fs.link(big, d, b"big-link").unwrap();
    fs.symlink(d, b"sym", b"../big", 0, 0).unwrap();
    // Enough names for an fs tree of two levels.
    let many = fs.mkdir(root, b"many", 0o755, 0, 0).unwrap().ino;
    for i in 0..150 {
        fs.create(many, format!("empty-{i:03}").as_bytes(), 0o644, 0, 0)
            .unwrap();
    }
    for i in 0..12 {
        let f = fs
            .create(d, format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.write_file(f.ino, 0, format!("file {i}").as_bytes())
            .unwrap();
    }
    fs.sync().expect("commit");
    // Logged, not committed.
    let logged = fs.create(d, b"logged", 0o644, 0, 0).unwrap().ino;
    fs.write_file(logged, 0, &vec![0x10; 8192]).unwrap();
    fs.setxattr(logged, b"user.b", b"2", XattrSetMode::Create)
        .unwrap();
    fs.link(logged, root, b"logged-link").unwrap();
    fs.write_file(big, 4096, &vec![0xb2; 4096]).unwrap();
    let logged_text = fs.create(d, b"logged-text", 0o644, 0, 0).unwrap().ino;
    fs.write_file(logged_text, 0, &small_text(2500)).unwrap();
    fs.fsync(logged_text, false).unwrap();
    fs.fsync(logged, false).unwrap();
    fs.fsync(big, false).unwrap();
    let bytes = dev.snapshot();
    drop(fs);
    let sb = read_superblock(&MemoryDevice::from_bytes(bytes.clone())).expect("superblock");
    assert_ne!(sb.log_root_bytenr, 0, "the base image has an fsync log");
    assert!(sb.compression, "the base image has compressed extents");
    let nodes = live_nodes(&bytes, &sb);
    for tree in [tree_id::FS, tree_id::LOG] {
        assert!(
            nodes.iter().any(|(_, n)| n.owner == tree
                && matches!(&n.body, NodeBody::Leaf(items) if items.iter().any(|i| {
                    i.key.item_type == item_type::EXTENT_DATA && i.data.first() == Some(&4)
                }))),
            "the base image's tree {tree} has a compressed inline extent"
        );
    }
    assert!(
        nodes
            .iter()
            .any(|(_, n)| n.owner == tree_id::FS && n.level > 0),
        "the base image's fs tree has internal nodes"
    );
    Base {
        mirror_offset: sb.metadata_profile.mirror_offset(),
        bytes,
        nodes,
    }
}

/// `len` bytes of text that compress well.
fn small_text(len: usize) -> Vec<u8> {
    b"a small text file, compressed inline. "
        .iter()
        .cycle()
        .take(len)
        .copied()
        .collect()
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(build_base)
}

fn seal(block: &mut [u8]) {
    let c = crc32c::crc32c(&block[4..]);
    block[0..4].copy_from_slice(&c.to_le_bytes());
}

fn put(block: &mut [u8], at: usize, width: usize, value: u64) {
    block[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
}

/// The image with `m` applied and every checksum it touches recomputed.
fn apply(base: &Base, m: &Mutation) -> Vec<u8> {
    let mut img = base.bytes.clone();
    let copies: Vec<u64> = match m.node {
        None if m.both_copies => SUPERBLOCK_OFFSETS.to_vec(),
        None => vec![SUPERBLOCK_OFFSETS[0]],
        Some(b) => std::iter::once(b)
            .chain(
                base.mirror_offset
                    .filter(|_| m.both_copies)
                    .map(|off| b + off),
            )
            .collect(),
    };
    let len = if m.node.is_some() {
        NODE_SIZE
    } else {
        SUPERBLOCK_SIZE
    };
    for start in copies {
        let block = &mut img[start as usize..start as usize + len];
        let old_crc = block[0..4].to_vec();
        put(block, m.at, m.width, m.value);
        seal(block);
        let new_crc = block[0..4].to_vec();
        if let Some(bytenr) = m.node.filter(|&b| b == start) {
            relist(&mut img, bytenr, &old_crc, &new_crc);
        }
    }
    img
}

/// A log node the superblock's log manifest lists by checksum
/// (docs/LOG-FLUSH.md) is listed with its new one, or the mount would take
/// the mutation for a torn log sync and never decode it.
fn relist(img: &mut [u8], bytenr: u64, old_crc: &[u8], new_crc: &[u8]) {
    let entry: Vec<u8> = [&bytenr.to_le_bytes()[..], old_crc].concat();
    for sb in SUPERBLOCK_OFFSETS {
        let block = &mut img[sb as usize..sb as usize + SUPERBLOCK_SIZE];
        if let Some(at) = block
            .windows(entry.len())
            .position(|w| w == entry.as_slice())
        {
            block[at + 8..at + 12].copy_from_slice(new_crc);
            seal(block);
        }
    }
}

/// A value for a field of `width` bytes whose current value is `old`.
fn edge_value(rng: &mut ChaCha8Rng, width: usize, old: u64) -> u64 {
    let mask = if width == 8 {
        u64::MAX
    } else {
        (1u64 << (width * 8)) - 1
    };
    let v = match rng.gen_range(0..10) {
        0..=5 => EDGES[rng.gen_range(0..EDGES.len())],
        6 => old.wrapping_add(rng.gen_range(1..=3)),
        7 => old.wrapping_sub(rng.gen_range(1..=3)),
        8 => old ^ (1 << rng.gen_range(0..width * 8)),
        _ => rng.gen(),
    };
    v & mask
}

fn read_field(block: &[u8], at: usize, width: usize) -> u64 {
    let mut b = [0u8; 8];
    b[..width].copy_from_slice(&block[at..at + width]);
    u64::from_le_bytes(b)
}

/// Fields of an item body by type (offset, width), as the encoders in
/// format/items.rs lay them out; other types get one random field.
fn item_body_fields(
    rng: &mut ChaCha8Rng,
    key: &Key,
    data: &[u8],
) -> Vec<(&'static str, usize, usize)> {
    let len = data.len();
    let fields: &[(&'static str, usize, usize)] = match key.item_type {
        // A compressed inline extent's fields (type 4): its length, its
        // algorithm and the first bytes of its compressed stream.
        item_type::EXTENT_DATA if data.first() == Some(&4) => &[
            ("extent.kind", 0, 1),
            ("extent.inline_ram_bytes", 1, 8),
            ("extent.inline_algorithm", 9, 1),
            ("extent.inline_stream", 10, 8),
        ],
        item_type::INODE_ITEM => &[
            ("inode.generation", 0, 8),
            ("inode.transid", 8, 8),
            ("inode.size", 16, 8),
            ("inode.nbytes", 24, 8),
            ("inode.nlink", 32, 4),
            ("inode.mode", 44, 4),
            ("inode.flags", 56, 8),
        ],
        item_type::INODE_REF => &[("ref.index", 0, 8), ("ref.name_len", 8, 2)],
        item_type::DIR_ITEM | item_type::DIR_INDEX => &[
            ("dir.ino", 0, 8),
            ("dir.type", 8, 1),
            ("dir.name_len", 9, 2),
        ],
        item_type::XATTR_ITEM => &[("xattr.name_len", 0, 2), ("xattr.value_len", 2, 4)],
        item_type::EXTENT_DATA => &[
            ("extent.kind", 0, 1),
            ("extent.disk_bytenr", 1, 8),
            ("extent.disk_num_bytes", 9, 8),
            ("extent.offset", 17, 8),
            ("extent.num_bytes", 25, 8),
            // A compressed extent's own fields (type 3).
            ("extent.ram_bytes", 33, 8),
            ("extent.compressed_len", 41, 8),
            ("extent.algorithm", 49, 1),
        ],
        item_type::ROOT_ITEM => &[
            ("root.bytenr", 0, 8),
            ("root.generation", 8, 8),
            ("root.level", 16, 1),
        ],
        item_type::EXTENT_ITEM | item_type::METADATA_ITEM => &[
            ("extent_item.refs", 0, 8),
            ("extent_item.generation", 8, 8),
            ("extent_item.owner", 16, 8),
        ],
        _ => &[],
    };
    let fitting: Vec<_> = fields
        .iter()
        .copied()
        .filter(|f| f.1 + f.2 <= len)
        .collect();
    if !fitting.is_empty() {
        return fitting;
    }
    let width = [1, 2, 4, 8][rng.gen_range(0..4)].min(len.max(1));
    if len < width {
        return Vec::new();
    }
    vec![("body", rng.gen_range(0..=len - width), width)]
}

/// One case's mutations: mostly one field ([`random_mutation`]); one case
/// in eight makes pointers and reference counts disagree
/// ([`count_mutations`]).
fn random_case(rng: &mut ChaCha8Rng, base: &Base) -> Vec<Mutation> {
    if rng.gen_bool(0.125) {
        count_mutations(rng, base)
    } else {
        vec![random_mutation(rng, base)]
    }
}

/// Pointers that disagree with the counts (docs/SNAPSHOTS.md (b)): a
/// second pointer in an internal node to a child another slot names (two
/// parent slots, one reference), and/or a tree node's METADATA_ITEM refs
/// set to an edge value. Each is several fields, all valid on their own.
fn count_mutations(rng: &mut ChaCha8Rng, base: &Base) -> Vec<Mutation> {
    let mut ms = Vec::new();
    let internal: Vec<(u64, usize)> = base
        .nodes
        .iter()
        .filter(|(_, n)| n.level > 0 && n.key_ptrs().len() >= 2)
        .map(|(b, n)| (*b, n.key_ptrs().len()))
        .collect();
    let dup = !internal.is_empty() && rng.gen_bool(0.75);
    if dup {
        let (bytenr, n) = internal[rng.gen_range(0..internal.len())];
        let from = rng.gen_range(0..n);
        let to = (from + rng.gen_range(1..n)) % n;
        ms.extend(duplicate_pointer(base, bytenr, from, to));
    }
    let metadata_items: Vec<(u64, usize)> = base
        .nodes
        .iter()
        .flat_map(|(b, n)| match &n.body {
            NodeBody::Leaf(items) => items
                .iter()
                .enumerate()
                .filter(|(_, i)| i.key.item_type == item_type::METADATA_ITEM)
                .map(|(slot, _)| (*b, slot))
                .collect(),
            NodeBody::Internal(_) => Vec::new(),
        })
        .collect();
    if !metadata_items.is_empty() && (!dup || rng.gen_bool(0.5)) {
        let (bytenr, slot) = metadata_items[rng.gen_range(0..metadata_items.len())];
        let at = item_body_at(base, bytenr, slot);
        let block = &base.bytes[bytenr as usize..bytenr as usize + NODE_SIZE];
        let old = read_field(block, at, 8);
        ms.push(Mutation {
            node: Some(bytenr),
            both_copies: true,
            what: format!("extent slot {slot} METADATA_ITEM refs"),
            at,
            width: 8,
            value: [0, 2, 3, u64::MAX, old.wrapping_add(1)][rng.gen_range(0..5)],
        });
    }
    ms
}

/// Picks one field of one node (or of the superblock) and a new value.
fn random_mutation(rng: &mut ChaCha8Rng, base: &Base) -> Mutation {
    let both_copies = !rng.gen_bool(0.1);
    if rng.gen_bool(0.1) {
        let (name, at, width) = SUPERBLOCK_FIELDS[rng.gen_range(0..SUPERBLOCK_FIELDS.len())];
        let old = read_field(&base.bytes[SUPERBLOCK_OFFSETS[0] as usize..], at, width);
        return Mutation {
            node: None,
            both_copies,
            what: name.into(),
            at,
            width,
            value: edge_value(rng, width, old),
        };
    }
    let (bytenr, node) = &base.nodes[rng.gen_range(0..base.nodes.len())];
    let block = &base.bytes[*bytenr as usize..*bytenr as usize + NODE_SIZE];
    let nritems = read_field(block, 32, 4) as usize;
    let roll = if nritems == 0 {
        0
    } else {
        rng.gen_range(0..10)
    };
    let (what, at, width): (String, usize, usize) = match (roll, &node.body) {
        (0..=1, _) => {
            let (n, at, w) = NODE_HEADER_FIELDS[rng.gen_range(0..NODE_HEADER_FIELDS.len())];
            (format!("header.{n}"), at, w)
        }
        (2..=4, _) => {
            // A key field of a random slot.
            let slot = rng.gen_range(0..nritems);
            let stride = if node.level == 0 {
                LEAF_ITEM_HEADER
            } else {
                KEY_PTR
            };
            let start = BODY + slot * stride;
            let (n, at, w) =
                [("objectid", 0, 8), ("type", 8, 1), ("offset", 9, 8)][rng.gen_range(0..3)];
            (format!("slot {slot} key.{n}"), start + at, w)
        }
        (5..=6, NodeBody::Leaf(_)) => {
            let slot = rng.gen_range(0..nritems);
            let start = BODY + slot * LEAF_ITEM_HEADER + KEY_SIZE;
            let (n, at) = [("data_offset", 0), ("data_size", 4)][rng.gen_range(0..2)];
            (format!("slot {slot} item.{n}"), start + at, 4)
        }
        (5..=6, NodeBody::Internal(_)) => {
            let slot = rng.gen_range(0..nritems);
            let start = BODY + slot * KEY_PTR + KEY_SIZE;
            let (n, at) = [("blockptr", 0), ("generation", 8)][rng.gen_range(0..2)];
            (format!("slot {slot} ptr.{n}"), start + at, 8)
        }
        (_, NodeBody::Leaf(items)) => {
            let slot = rng.gen_range(0..items.len());
            let item = &items[slot];
            let header = BODY + slot * LEAF_ITEM_HEADER + KEY_SIZE;
            let data_offset = read_field(block, header, 4) as usize;
            let fields = item_body_fields(rng, &item.key, &item.data);
            if fields.is_empty() {
                (format!("slot {slot} item.data_size"), header + 4, 4)
            } else {
                let (n, at, w) = fields[rng.gen_range(0..fields.len())];
                (
                    format!("slot {slot} {} {n}", item.key),
                    BODY + data_offset + at,
                    w,
                )
            }
        }
        (_, NodeBody::Internal(_)) => {
            let slot = rng.gen_range(0..nritems);
            (
                format!("slot {slot} ptr.blockptr"),
                BODY + slot * KEY_PTR + KEY_SIZE,
                8,
            )
        }
    };
    let old = read_field(block, at, width);
    Mutation {
        node: Some(*bytenr),
        both_copies,
        what: format!("{} {what}", birch::format::tree_name(node.owner)),
        at,
        width,
        value: edge_value(rng, width, old),
    }
}

/// Most directories, entries and bytes a walk visits (a crafted image may
/// hold a directory cycle or a huge size).
const WALK_DIRS: usize = 32;
const WALK_ENTRIES: usize = 2000;
const READ_BYTES: usize = 64 << 10;

/// Everything a user can reach, read through the library; returns the
/// directories seen.
fn walk<D: BlockDevice + 'static>(fs: &Filesystem<D>) -> Vec<u64> {
    let mut dirs = vec![fs.root_ino()];
    let mut seen = 0;
    let mut i = 0;
    while i < dirs.len() && i < WALK_DIRS {
        let dir = dirs[i];
        i += 1;
        let _ = fs.getattr(dir);
        let _ = fs.listxattr(dir);
        let mut offset = 0;
        while let Ok(entries) = fs.readdir(dir, offset, 64) {
            let Some(last) = entries.last() else { break };
            if last.next_offset <= offset {
                break;
            }
            offset = last.next_offset;
            for e in &entries {
                seen += 1;
                let _ = fs.lookup(dir, &e.name);
                let _ = fs.getattr(e.ino);
                if let Ok(names) = fs.listxattr(e.ino) {
                    for n in names {
                        let _ = fs.getxattr(e.ino, &n);
                    }
                }
                match e.file_type {
                    FileType::Directory if !dirs.contains(&e.ino) => dirs.push(e.ino),
                    FileType::Regular => {
                        let _ = fs.read_file(e.ino, 0, READ_BYTES);
                        let _ = fs.read_file(e.ino, 4096, READ_BYTES);
                    }
                    FileType::Symlink => {
                        let _ = fs.readlink(e.ino);
                    }
                    _ => {}
                }
            }
            if seen > WALK_ENTRIES {
                return dirs;
            }
        }
    }
    dirs
}

/// A create, a write, an fsync in every directory walked, then a commit.
fn write<D: BlockDevice + 'static>(fs: &Filesystem<D>, dirs: &[u64]) {
    for &dir in dirs.iter().take(WALK_DIRS) {
        if let Ok(attr) = fs.create(dir, b"fuzz-new", 0o644, 0, 0) {
            let _ = fs.write_file(attr.ino, 0, &[0xf0; 5000]);
            let _ = fs.setxattr(attr.ino, b"user.fuzz", b"v", XattrSetMode::CreateOrReplace);
            let _ = fs.fsync(attr.ino, false);
        }
        let _ = fs.mkdir(dir, b"fuzz-dir", 0o755, 0, 0);
    }
    let _ = fs.commit();
}

thread_local! {
    /// Where the last panic on this thread happened.
    static PANIC_AT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    /// Set while a case runs: its panics are caught and reported at the end.
    static IN_CASE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Panics are expected to be caught here: keep their place for the report
/// instead of printing each one.
fn record_panic_locations() {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_CASE.with(|c| c.get()) {
                return default(info);
            }
            let at = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            PANIC_AT.with(|p| *p.borrow_mut() = at);
        }))
    });
}

/// What a case did that it must not: (phase, panic message and place).
fn run_case(img: Vec<u8>) -> Option<(&'static str, String)> {
    let message = |p: Box<dyn std::any::Any + Send>| {
        let text = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(no message)".into());
        format!("{text} at {}", PANIC_AT.with(|p| p.borrow().clone()))
    };
    let check_dev = MemoryDevice::from_bytes(img.clone());
    // With --verify-data: the mutated lengths and algorithm bytes of
    // compressed extents reach the decompression.
    let verify_data = CheckOptions { verify_data: true };
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| {
        check_device_with(&check_dev, verify_data)
    })) {
        return Some(("check", message(p)));
    }
    let opened = catch_unwind(AssertUnwindSafe(|| {
        Filesystem::open(MemoryDevice::from_bytes(img), MountOptions::deterministic())
    }));
    let fs = match opened {
        Err(p) => return Some(("open (log replay)", message(p))),
        Ok(Err(_)) => return None,
        Ok(Ok(fs)) => fs,
    };
    let dirs = match catch_unwind(AssertUnwindSafe(|| walk(&fs))) {
        Err(p) => return Some(("walk", message(p))),
        Ok(dirs) => dirs,
    };
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| write(&fs, &dirs))) {
        return Some(("write", message(p)));
    }
    if let Err(p) = catch_unwind(AssertUnwindSafe(move || fs.close())) {
        return Some(("close", message(p)));
    }
    None
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|s| {
        s.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={s} is not a number"))
    })
}

/// Each case's own generator: case I of seed S replays alone.
fn case_rng(seed: u64, case: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed ^ case.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Mutations of the base image: none may panic anything the case runs.
#[test]
fn mutated_images_never_panic() {
    record_panic_locations();
    let base = base();
    let seed = env_u64("BIRCH_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let only = env_u64("BIRCH_FUZZ_CASE");
    let cases = env_u64("BIRCH_FUZZ_CASES").unwrap_or(DEFAULT_CASES);
    let deadline = env_u64("BIRCH_FUZZ_SECONDS").map(|s| Instant::now() + Duration::from_secs(s));
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut case = only.unwrap_or(0);
    let mut ran = 0u64;
    loop {
        let more = match (only, deadline) {
            (Some(_), _) => ran == 0,
            (None, Some(end)) => Instant::now() < end || case < cases,
            (None, None) => case < cases,
        };
        if !more {
            break;
        }
        let ms = random_case(&mut case_rng(seed, case), base);
        IN_CASE.with(|c| c.set(true));
        let outcome = run_case(apply_all(base, &ms));
        IN_CASE.with(|c| c.set(false));
        if let Some((phase, msg)) = outcome {
            let m = describe(&ms);
            failures.push(format!(
                "case {case} ({m}): panic in {phase}: {msg}\n  replay: BIRCH_FUZZ_SEED={seed} BIRCH_FUZZ_CASE={case} cargo test -p birch --test image_fuzz mutated_images_never_panic"
            ));
        }
        case += 1;
        ran += 1;
    }
    eprintln!(
        "image_fuzz: seed {seed}: {ran} cases over {} nodes in {:.1} s, {} panics",
        base.nodes.len(),
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {ran} cases panicked (BIRCH_FUZZ_SEED={seed} BIRCH_FUZZ_CASES={cases}):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ----- the panics issue 21 found, as fixed mutations -----

/// The live leaf of tree `owner` holding an item that `pred` picks, and
/// that item's slot.
fn find_item(base: &Base, owner: u64, pred: impl Fn(&Key) -> bool) -> (u64, usize, Key) {
    base.nodes
        .iter()
        .filter(|(_, n)| n.owner == owner)
        .find_map(|(b, n)| match &n.body {
            NodeBody::Leaf(items) => items
                .iter()
                .enumerate()
                .filter(|(_, i)| pred(&i.key))
                .last()
                .map(|(slot, i)| (*b, slot, i.key)),
            NodeBody::Internal(_) => None,
        })
        .unwrap_or_else(|| panic!("the base image has no such item in tree {owner}"))
}

/// The byte where the body of item `slot` of the node at `bytenr` starts.
fn item_body_at(base: &Base, bytenr: u64, slot: usize) -> usize {
    let block = &base.bytes[bytenr as usize..bytenr as usize + NODE_SIZE];
    BODY + read_field(block, BODY + slot * LEAF_ITEM_HEADER + KEY_SIZE, 4) as usize
}

fn key_offset_mutation(bytenr: u64, slot: usize, key: Key, value: u64) -> Mutation {
    Mutation {
        node: Some(bytenr),
        both_copies: true,
        what: format!("slot {slot} ({key}) key.offset"),
        at: BODY + slot * LEAF_ITEM_HEADER + 9,
        width: 8,
        value,
    }
}

fn assert_no_panic(img: Vec<u8>, m: &Mutation) {
    record_panic_locations();
    IN_CASE.with(|c| c.set(true));
    let outcome = run_case(img);
    IN_CASE.with(|c| c.set(false));
    if let Some((phase, msg)) = outcome {
        panic!("{m}: panic in {phase}: {msg}");
    }
}

/// The log root tree's item for the fs tree's log pointing at
/// 0xFFFFFFFFFFFFC000: its DUP mirror would lie past 2^64 (`mirror_of`
/// panicked in check and at mount). Check names the pointer; the mount
/// takes the log it cannot read for a torn log sync and replays the one
/// before it (docs/LOG-FLUSH.md).
#[test]
fn log_root_item_pointing_near_2_pow_64() {
    let base = base();
    let (bytenr, slot, key) = find_item(base, tree_id::LOG_ROOT, |k| {
        k.item_type == item_type::ROOT_ITEM
    });
    let m = Mutation {
        node: Some(bytenr),
        both_copies: true,
        what: format!("slot {slot} ({key}) root.bytenr"),
        at: item_body_at(base, bytenr, slot),
        width: 8,
        value: 0xFFFF_FFFF_FFFF_C000,
    };
    let img = apply(base, &m);
    // A log that cannot be read is what a torn log sync leaves: check
    // warns, naming the pointer, and checks the log before it.
    let report = check_device(&MemoryDevice::from_bytes(img.clone())).to_string();
    assert!(
        report.contains(&format!(
            "block={}: block pointer outside the device",
            m.value
        )),
        "{m}: check does not name the pointer:\n{report}"
    );
    let fs = Filesystem::open(
        MemoryDevice::from_bytes(img.clone()),
        MountOptions::deterministic(),
    )
    .expect("the last commit mounts");
    assert!(
        matches!(
            fs.replay_outcome(),
            Some(birch::fs::ReplayOutcome::Replayed(r)) if r.newest_log_incomplete
        ),
        "{m}: {:?}",
        fs.replay_outcome()
    );
    drop(fs);
    assert_no_panic(img, &m);
}

/// The last DIR_INDEX of directory `d` at 2^64-1 or 2^64-2: the next
/// index does not fit (`peek_dir_index`/`next_dir_index` panicked in the
/// log's replay at mount and at the first create in `d`). Replay fails and
/// the log is discarded; a create, link or rename into `d` is EOVERFLOW
/// and changes nothing; the rest of the filesystem takes changes.
#[test]
fn dir_index_near_2_pow_64_refuses_new_names() {
    let base = base();
    let d = {
        let fs = Filesystem::open(
            MemoryDevice::from_bytes(base.bytes.clone()),
            MountOptions::deterministic(),
        )
        .unwrap();
        fs.lookup(fs.root_ino(), b"d").unwrap().ino
    };
    let (bytenr, slot, key) = find_item(base, tree_id::FS, |k| {
        k.objectid == d && k.item_type == item_type::DIR_INDEX
    });
    for value in [u64::MAX, u64::MAX - 1] {
        let m = key_offset_mutation(bytenr, slot, key, value);
        let img = apply(base, &m);
        let fs = Filesystem::open(
            MemoryDevice::from_bytes(img.clone()),
            MountOptions::deterministic(),
        )
        .expect("mounts");
        assert!(
            matches!(
                fs.replay_outcome(),
                Some(birch::fs::ReplayOutcome::Discarded(_))
            ),
            "{m}: {:?}",
            fs.replay_outcome()
        );
        let refused = fs.create(d, b"new", 0o644, 0, 0).map(|a| a.ino);
        assert_eq!(
            refused.as_ref().map_err(|e| e.errno()),
            Err(libc::EOVERFLOW),
            "{m}: create in d: {refused:?}"
        );
        // A link or rename into d is refused before it changes anything.
        let root = fs.root_ino();
        let big = fs.lookup(root, b"big").unwrap().ino;
        let link = fs.link(big, d, b"big-link-2").map(|a| a.ino);
        assert_eq!(
            link.map_err(|e| e.errno()),
            Err(libc::EOVERFLOW),
            "{m}: link"
        );
        let moved = fs.rename(root, b"big", d, b"moved", Default::default());
        assert_eq!(
            moved.map_err(|e| e.errno()),
            Err(libc::EOVERFLOW),
            "{m}: rename"
        );
        assert_eq!(
            fs.lookup(root, b"big").map(|a| a.ino).ok(),
            Some(big),
            "{m}"
        );
        assert_eq!(fs.getattr(big).unwrap().nlink, 2, "{m}: big's links");
        assert!(fs.readdir(d, 0, usize::MAX).is_ok(), "{m}: readdir of d");
        fs.create(fs.root_ino(), b"elsewhere", 0o644, 0, 0)
            .unwrap_or_else(|e| panic!("{m}: create elsewhere: {e}"));
        fs.commit().unwrap_or_else(|e| panic!("{m}: commit: {e}"));
        drop(fs);
        assert_no_panic(img, &m);
    }
}

/// The checksum tree's last item keyed at 2^64-4096: its range ends past
/// 2^64 (`birch check` panicked adding its length). Check reports it.
#[test]
fn csum_item_keyed_near_2_pow_64() {
    let base = base();
    let (bytenr, slot, key) = find_item(base, tree_id::CSUM, |k| {
        k.item_type == item_type::EXTENT_CSUM
    });
    let m = key_offset_mutation(bytenr, slot, key, u64::MAX - 4095);
    let img = apply(base, &m);
    let report = check_device(&MemoryDevice::from_bytes(img.clone()));
    assert!(
        report.faults_with(birch::check::FaultId::CsumKey).count() > 0,
        "{m}: no csum-key fault:\n{report}"
    );
    assert_no_panic(img, &m);
}

/// Every file extent and checksum item of the base image, its key offset
/// set to each edge in turn: readers add the key offset to the item's
/// length (file reads, fsync's log, checksum lookups, scrub), so the
/// decoders refuse one that would end past the largest file or 2^64; and
/// off its block by 1 and by 128 (seed 4's cases 550 and 4162 found reads
/// and the log check indexing blocks by an unaligned offset).
#[test]
fn extent_and_checksum_key_offsets_at_edges() {
    let base = base();
    let mut failures = Vec::new();
    for (bytenr, node) in &base.nodes {
        let NodeBody::Leaf(items) = &node.body else {
            continue;
        };
        for (slot, item) in items.iter().enumerate() {
            if !matches!(
                item.key.item_type,
                item_type::EXTENT_DATA | item_type::EXTENT_CSUM
            ) {
                continue;
            }
            let off = item.key.offset;
            for value in [
                u64::MAX,
                u64::MAX - 4095,
                1 << 63,
                (1 << 63) - 4096,
                off + 1,
                off + 128,
            ] {
                let m = key_offset_mutation(*bytenr, slot, item.key, value);
                record_panic_locations();
                IN_CASE.with(|c| c.set(true));
                let outcome = run_case(apply(base, &m));
                IN_CASE.with(|c| c.set(false));
                if let Some((phase, msg)) = outcome {
                    failures.push(format!("{m}: panic in {phase}: {msg}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every field of every item of the log trees (what replay applies at
/// every open), and each item's key objectid and offset, set to each u64
/// edge in turn: a sweep, since random cases reach one log item's field
/// at one edge only about once in a few thousand.
#[test]
fn log_item_fields_at_edges() {
    let base = base();
    let mut failures = Vec::new();
    let mut cases = 0;
    for (bytenr, node) in &base.nodes {
        let NodeBody::Leaf(items) = &node.body else {
            continue;
        };
        if node.owner != tree_id::LOG && node.owner != tree_id::LOG_ROOT {
            continue;
        }
        for (slot, item) in items.iter().enumerate() {
            let body = item_body_at(base, *bytenr, slot);
            let key_at = BODY + slot * LEAF_ITEM_HEADER;
            let mut fields = vec![
                ("key.objectid".to_string(), key_at, 8),
                ("key.offset".to_string(), key_at + 9, 8),
            ];
            let mut rng = case_rng(0, 0);
            fields.extend(
                item_body_fields(&mut rng, &item.key, &item.data)
                    .into_iter()
                    .map(|(n, at, w)| (n.to_string(), body + at, w)),
            );
            for (name, at, width) in fields {
                for value in [u64::MAX, u64::MAX - 1, u64::MAX - 4095, 1 << 63, 0] {
                    let m = Mutation {
                        node: Some(*bytenr),
                        both_copies: true,
                        what: format!("slot {slot} ({}) {name}", item.key),
                        at,
                        width,
                        value: if width == 8 {
                            value
                        } else {
                            value & ((1 << (width * 8)) - 1)
                        },
                    };
                    cases += 1;
                    record_panic_locations();
                    IN_CASE.with(|c| c.set(true));
                    let outcome = run_case(apply(base, &m));
                    IN_CASE.with(|c| c.set(false));
                    if let Some((phase, msg)) = outcome {
                        failures.push(format!("{m}: panic in {phase}: {msg}"));
                    }
                }
            }
        }
    }
    eprintln!("log_item_fields_at_edges: {cases} cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Panics the random cases found (seed 1, cases 1564 and 1961 before the
/// fixes), kept as fixed cases: a superblock generation of 2^64 - 1 (the
/// log check computed `generation + 1`) and an inode size of 2^64 - 1
/// (stat rounded it up to whole blocks).
#[test]
fn generation_and_inode_size_at_2_pow_64() {
    let base = base();
    let generation = Mutation {
        node: None,
        both_copies: true,
        what: "generation".into(),
        at: 40,
        width: 8,
        value: u64::MAX,
    };
    let (bytenr, slot, key) = find_item(base, tree_id::FS, |k| {
        k.item_type == item_type::INODE_ITEM && k.objectid > 256
    });
    let size = Mutation {
        node: Some(bytenr),
        both_copies: false,
        what: format!("slot {slot} ({key}) inode.size"),
        at: item_body_at(base, bytenr, slot) + 16,
        width: 8,
        value: u64::MAX,
    };
    for m in [generation, size] {
        assert_no_panic(apply(base, &m), &m);
    }
}

// ----- pointers that disagree with reference counts (docs/SNAPSHOTS.md (b)) -----

/// The writes that make pointer `to` of internal node `bytenr` a second
/// pointer to the child pointer `from` names (block and generation), so
/// that two parent slots reach one node counted once.
fn duplicate_pointer(base: &Base, bytenr: u64, from: usize, to: usize) -> Vec<Mutation> {
    let node = &base
        .nodes
        .iter()
        .find(|(b, _)| *b == bytenr)
        .expect("node")
        .1;
    let source = node.key_ptrs()[from];
    let field = |name: &str, at: usize, value: u64| Mutation {
        node: Some(bytenr),
        both_copies: true,
        what: format!(
            "{} slot {to} ptr.{name} = slot {from}'s",
            birch::format::tree_name(node.owner)
        ),
        at: BODY + to * KEY_PTR + KEY_SIZE + at,
        width: 8,
        value,
    };
    vec![
        field("blockptr", 0, source.blockptr),
        field("generation", 8, source.generation),
    ]
}

/// `ms` applied one after the other.
fn apply_all(base: &Base, ms: &[Mutation]) -> Vec<u8> {
    let mut img = base.bytes.clone();
    for m in ms {
        let next = Base {
            bytes: img,
            mirror_offset: base.mirror_offset,
            nodes: Vec::new(),
        };
        img = apply(&next, m);
    }
    img
}

/// The mutations of one fuzz case, printed on one line.
fn describe(ms: &[Mutation]) -> String {
    ms.iter()
        .map(|m| m.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// A committed image without a log (so that the open replays nothing):
/// a root directory of 150 files, an fs tree of two levels.
fn committed_base() -> Base {
    let dev = std::sync::Arc::new(MemoryDevice::new(IMAGE_BYTES));
    Filesystem::mkfs(dev.as_ref(), &Default::default()).expect("mkfs");
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).expect("open");
    for i in 0..150 {
        fs.create(
            fs.root_ino(),
            format!("file-{i:03}").as_bytes(),
            0o644,
            0,
            0,
        )
        .unwrap();
    }
    fs.close().expect("close");
    let bytes = dev.snapshot();
    let sb = read_superblock(&MemoryDevice::from_bytes(bytes.clone())).expect("superblock");
    assert_eq!(sb.log_root_bytenr, 0, "no log");
    Base {
        mirror_offset: sb.metadata_profile.mirror_offset(),
        nodes: live_nodes(&bytes, &sb),
        bytes,
    }
}

/// Every slot of the fs tree's root points at its first leaf, whose count
/// is 1. A create changes the root directory's inode (first slot), its
/// last DIR_INDEX and a new inode past the last one (later slots): the
/// first change copies the leaf and frees it, the next one through
/// another slot copies and frees it a second time. `free_node` asserted
/// "freed twice" and the daemon panicked; now the change fails with a
/// corruption error naming the leaf, and nothing panics.
#[test]
fn duplicate_child_pointer_cow_is_an_error_not_a_panic() {
    let base = committed_base();
    let (root, node) = base
        .nodes
        .iter()
        .find(|(_, n)| n.owner == tree_id::FS && n.level == 1)
        .expect("the fs tree has two levels");
    let last = node.key_ptrs().len() - 1;
    assert!(last >= 1, "the fs tree root has two children");
    let shared_leaf = node.key_ptrs()[0].blockptr;
    let ms: Vec<Mutation> = (1..=last)
        .flat_map(|slot| duplicate_pointer(&base, *root, 0, slot))
        .collect();
    let img = apply_all(&base, &ms);
    record_panic_locations();
    IN_CASE.with(|c| c.set(true));
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let fs = Filesystem::open(MemoryDevice::from_bytes(img), MountOptions::deterministic())
            .expect("the image mounts: nothing reads the second pointer yet");
        let root = fs.root_ino();
        let result = fs
            .create(root, b"new", 0o644, 0, 0)
            .and_then(|_| fs.commit());
        // The transaction is abandoned: the filesystem refuses changes.
        let after = fs.create(root, b"after", 0o644, 0, 0).map(|_| ());
        (result, fs.failure(), after)
    }));
    IN_CASE.with(|c| c.set(false));
    let (result, failure, after) = match outcome {
        Ok(outcome) => outcome,
        Err(p) => panic!(
            "{}: a panic, not an error: {:?} at {}",
            describe(&ms),
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())),
            PANIC_AT.with(|p| p.borrow().clone())
        ),
    };
    match result {
        Err(birch::error::Error::Corrupt(c)) => {
            assert_eq!(c.block, Some(shared_leaf), "{}: {c}", describe(&ms));
            assert!(c.reason.contains("freed twice"), "{}: {c}", describe(&ms));
        }
        other => panic!(
            "{}: expected a corruption error, got {other:?}",
            describe(&ms)
        ),
    }
    assert!(failure.is_some(), "the failed change marks the filesystem");
    assert!(after.is_err(), "no change after it: {after:?}");
}
