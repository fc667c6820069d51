//! Human-readable printers for trees, nodes and items, shared by `birch
//! dump` and by error messages (`birch check` quotes the same one-liners).
//!
//! Small printers return a `String`; the whole-tree and whole-block dumps
//! stream into an [`std::io::Write`] because a large tree prints megabytes.
//! Nothing here panics on damaged input: an item that does not decode prints
//! as `undecodable: <reason>` followed by a hex preview.

use crate::btree::{read_node_uncached, NodeExpectation};
use crate::device::BlockDevice;
use crate::format::node::{BODY_SIZE, HEADER_SIZE, LEAF_ITEM_HEADER_SIZE};
use crate::format::{
    tree_name, DirEntry, FileExtent, FileType, InodeItem, Item, ItemType, Key, KeyPtr, Node,
    NodeBody, RootRef, SubvolRootItem, Superblock, Timespec, NODE_MAGIC, NODE_SIZE,
};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::io;

/// A file or xattr name as printed: printable ASCII as is, everything else
/// (and `\` and `"`) escaped, so a name never breaks a report line.
pub fn name(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'"' => out.push_str("\\\""),
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out
}

/// Up to `max` bytes of `data` as an escaped string, with `...` when cut.
pub fn preview(data: &[u8], max: usize) -> String {
    let cut = data.len() > max;
    let mut s = name(&data[..data.len().min(max)]);
    if cut {
        s.push_str("...");
    }
    s
}

/// Up to `max` bytes as hex.
pub fn hex(data: &[u8], max: usize) -> String {
    let mut s = String::with_capacity(data.len().min(max) * 2 + 3);
    for b in &data[..data.len().min(max)] {
        let _ = write!(s, "{b:02x}");
    }
    if data.len() > max {
        s.push_str("...");
    }
    s
}

pub fn file_type_name(t: FileType) -> &'static str {
    match t {
        FileType::Regular => "FILE",
        FileType::Directory => "DIR",
        FileType::CharDevice => "CHR",
        FileType::BlockDevice => "BLK",
        FileType::Fifo => "FIFO",
        FileType::Socket => "SOCK",
        FileType::Symlink => "SYMLINK",
    }
}

/// A filesystem id in UUID notation.
pub fn fsid(id: &[u8; 16]) -> String {
    let h = hex(id, 16);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

pub fn timespec(t: &Timespec) -> String {
    format!("{}.{:09}", t.sec, t.nsec)
}

/// The superblock copy at `copy_bytenr`, one field per line.
pub fn superblock(sb: &Superblock, copy_bytenr: u64) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "superblock at {copy_bytenr}");
    let _ = writeln!(s, "\tmagic BIRCHFS1");
    let _ = writeln!(s, "\tfsid {}", fsid(&sb.fsid));
    let _ = writeln!(s, "\tgeneration {}", sb.generation);
    let _ = writeln!(
        s,
        "\troot_tree_bytenr {} level {}",
        sb.root_tree_bytenr, sb.root_tree_level
    );
    let _ = writeln!(s, "\ttotal_bytes {}", sb.total_bytes);
    let _ = writeln!(s, "\tbytes_used {}", sb.bytes_used);
    let _ = writeln!(
        s,
        "\tsector_size {} node_size {}",
        crate::format::SECTOR_SIZE,
        NODE_SIZE
    );
    let _ = writeln!(
        s,
        "\tlog_root_bytenr {} level {} log_generation {}",
        sb.log_root_bytenr, sb.log_root_level, sb.log_generation
    );
    if let Some(manifest) = &sb.log_manifest {
        let previous = match manifest.previous {
            Some(p) => format!(
                "previous log {} level {} log_generation {}",
                p.bytenr, p.level, p.log_generation
            ),
            None => "no previous log".to_string(),
        };
        let _ = writeln!(
            s,
            "\tlog_manifest {} nodes written with one flush (incompat_flags {:#x}), {previous}",
            manifest.nodes.len(),
            crate::format::INCOMPAT_LOG_MANIFEST
        );
    }
    let _ = writeln!(
        s,
        "\tdata_checksums {}{}",
        if sb.data_checksums { "on" } else { "off" },
        if sb.data_checksums {
            format!(
                " (incompat_flags {:#x})",
                crate::format::INCOMPAT_DATA_CSUMS
            )
        } else {
            String::new()
        }
    );
    if sb.subvolumes {
        let _ = writeln!(
            s,
            "\tsubvolumes on (incompat_flags {:#x})",
            crate::format::INCOMPAT_SUBVOLUMES
        );
    }
    if sb.compression {
        let _ = writeln!(
            s,
            "\tcompression on (incompat_flags {:#x})",
            crate::format::INCOMPAT_COMPRESSION
        );
    }
    let _ = match sb.metadata_profile {
        crate::format::MetadataProfile::Single => writeln!(s, "\tmetadata single"),
        crate::format::MetadataProfile::Dup { mirror_offset } => writeln!(
            s,
            "\tmetadata dup mirror_offset {mirror_offset} (incompat_flags {:#x})",
            crate::format::INCOMPAT_METADATA_DUP
        ),
    };
    for (slot, backup) in sb.backup_roots.iter().enumerate() {
        if backup.is_empty() {
            let _ = writeln!(s, "\tbackup_root {slot}: empty");
            continue;
        }
        let _ = writeln!(
            s,
            "\tbackup_root {slot}: generation {} root_tree_bytenr {} level {} extent_root_bytenr {} level {} gen {} fs_root_bytenr {} level {} gen {} bytes_used {}",
            backup.generation,
            backup.root_tree_bytenr,
            backup.root_tree_level,
            backup.extent_root.bytenr,
            backup.extent_root.level,
            backup.extent_root.generation,
            backup.fs_root.bytenr,
            backup.fs_root.level,
            backup.fs_root.generation,
            backup.bytes_used
        );
    }
    s
}

/// `leaf 1048576 items 5 free 16000 generation 7 owner fs(5)` (or `node`
/// for an internal node, with its level).
pub fn node_header(node: &Node) -> String {
    let free = BODY_SIZE.saturating_sub(node.used_bytes());
    let kind = if node.is_leaf() {
        "leaf".to_string()
    } else {
        format!("node level {}", node.level)
    };
    format!(
        "{kind} {} items {} free {free} generation {} owner {}",
        node.bytenr,
        node.nritems(),
        node.generation,
        tree_name(node.owner)
    )
}

/// One item's payload, decoded by its key type. Multi-entry items (refs,
/// dir items, xattrs) print one entry per line, joined by `\n\t\t`.
pub fn item_body(key: &Key, data: &[u8]) -> String {
    let raw = || format!("{} bytes: {}", data.len(), hex(data, 32));
    let item_type = match ItemType::of(key) {
        Ok(t) => t,
        Err(unknown) => return format!("{unknown} ({})", raw()),
    };
    let item = match Item::decode(item_type, data) {
        Ok(item) => item,
        Err(e) => return format!("undecodable: {e} (raw {})", raw()),
    };
    // Markers carry no payload; one that has bytes shows them.
    let marker = |text: String| {
        if data.is_empty() {
            text
        } else {
            format!(
                "{text} (unexpected {} payload bytes: {})",
                data.len(),
                hex(data, 32)
            )
        }
    };
    let lines = |lines: Vec<String>| lines.join("\n\t\t");
    match item {
        Item::Inode(i) => inode(&i),
        Item::InodeRefs(refs) => lines(
            refs.iter()
                .map(|r| {
                    format!(
                        "inode ref index {} namelen {} name: {}",
                        r.index,
                        r.name.len(),
                        name(&r.name)
                    )
                })
                .collect(),
        ),
        Item::InodeExtrefs(refs) => lines(
            refs.iter()
                .map(|r| {
                    format!(
                        "inode extref parent {} index {} namelen {} name: {}",
                        r.parent,
                        r.index,
                        r.name.len(),
                        name(&r.name)
                    )
                })
                .collect(),
        ),
        Item::DirItems(entries) => lines(entries.iter().map(dir_entry).collect()),
        Item::DirIndex(e) => dir_entry(&e),
        Item::Xattrs(xs) => lines(xs.iter().map(xattr).collect()),
        Item::Csums(sums) => csums(key, &sums),
        Item::FileExtent(e) => file_extent(&e),
        Item::Root(r) => format!(
            "root bytenr {} generation {} level {}",
            r.bytenr, r.generation, r.level
        ),
        Item::SubvolRoot(r) => subvol_root(&r),
        Item::RootBackref(r) => root_ref("root backref", &r),
        Item::RootRef(r) => root_ref("root ref", &r),
        Item::DataExtent(e) => format!(
            "extent data refs {} generation {} owner ino {}",
            e.refs, e.generation, e.owner
        ),
        Item::MetadataExtent(e) => format!(
            "extent metadata refs {} generation {} owner {}",
            e.refs,
            e.generation,
            tree_name(e.owner)
        ),
        // The same key shape names an inode in an fs tree and a dead
        // subvolume in the root tree; the item does not know its tree.
        Item::Orphan => marker(format!(
            "orphan {}: an inode with no names, or in the root tree a dead subvolume",
            key.offset
        )),
        Item::DirLogIndex => marker(format!("dir log index: entry {} removed", key.offset)),
        Item::LogFullExtents => marker("log full extents: the logged extents are complete".into()),
        Item::LogUnlinked => marker("log unlinked: every name is gone".into()),
    }
}

/// `xattr namelen 9 valuelen 5 name: user.note value: "value"`
fn xattr(x: &crate::format::Xattr) -> String {
    format!(
        "xattr namelen {} valuelen {} name: {} value: \"{}\"",
        x.name.len(),
        x.value.len(),
        name(&x.name),
        preview(&x.value, 64)
    )
}

/// `csums 3 blocks [S, E): 0x... ...` (the first 8 shown).
fn csums(key: &Key, sums: &[u32]) -> String {
    let shown: Vec<String> = sums.iter().take(8).map(|c| format!("{c:#010x}")).collect();
    let span = sums.len() as u64 * crate::format::SECTOR_SIZE;
    format!(
        "csums {} blocks [{}, {}): {}{}",
        sums.len(),
        key.offset,
        key.offset.saturating_add(span),
        shown.join(" "),
        if sums.len() > 8 { " ..." } else { "" }
    )
}

/// `inode generation 3 transid 7 size 10 nbytes 4096 nlink 1 uid 0 gid 0 mode 100644 ...`
pub fn inode(i: &InodeItem) -> String {
    format!(
        "inode generation {} transid {} size {} nbytes {} nlink {} uid {} gid {} mode {:o} rdev {} flags {:#x}\n\t\tatime {} mtime {} ctime {} otime {}",
        i.generation,
        i.transid,
        i.size,
        i.nbytes,
        i.nlink,
        i.uid,
        i.gid,
        i.mode,
        i.rdev,
        i.flags,
        timespec(&i.atime),
        timespec(&i.mtime),
        timespec(&i.ctime),
        timespec(&i.otime)
    )
}

/// `location ino 257 type FILE namelen 3 name: foo`; a subvolume link
/// `location subvol(257) type SUBVOL namelen 4 name: snap`.
pub fn dir_entry(e: &DirEntry) -> String {
    let (location, kind) = if e.subvolume {
        (tree_name(e.ino), "SUBVOL")
    } else {
        (format!("ino {}", e.ino), file_type_name(e.file_type))
    };
    format!(
        "location {location} type {kind} namelen {} name: {}",
        e.name.len(),
        name(&e.name)
    )
}

/// A subvolume's long root item, one group of fields per line.
pub fn subvol_root(r: &SubvolRootItem) -> String {
    let uuid = |u: &[u8; 16]| {
        if u.iter().all(|&b| b == 0) {
            "-".to_string()
        } else {
            fsid(u)
        }
    };
    format!(
        "root bytenr {} generation {} level {} refs {} flags {:#x}{} last_snapshot {}\n\t\tdrop_progress {}\n\t\tuuid {} parent_uuid {} received_uuid {}\n\t\tctransid {} otransid {} stransid {} rtransid {}\n\t\tctime {} otime {} stime {} rtime {}",
        r.root.bytenr,
        r.root.generation,
        r.root.level,
        r.refs,
        r.flags,
        if r.is_readonly() { " (RDONLY)" } else { "" },
        r.last_snapshot,
        r.drop_progress,
        uuid(&r.uuid),
        uuid(&r.parent_uuid),
        uuid(&r.received_uuid),
        r.ctransid,
        r.otransid,
        r.stransid,
        r.rtransid,
        timespec(&r.ctime),
        timespec(&r.otime),
        timespec(&r.stime),
        timespec(&r.rtime)
    )
}

/// `root ref dirid 256 index 2 namelen 4 name: snap`
pub fn root_ref(what: &str, r: &RootRef) -> String {
    format!(
        "{what} dirid {} index {} namelen {} name: {}",
        r.dirid,
        r.index,
        r.name.len(),
        name(&r.name)
    )
}

pub fn file_extent(e: &FileExtent) -> String {
    match e {
        FileExtent::Inline { data } => format!(
            "extent inline len {} data \"{}\"",
            data.len(),
            preview(data, 64)
        ),
        FileExtent::InlineCompressed {
            compressed,
            ram_bytes,
            compression,
        } => format!(
            "extent inline compressed {compression} ram_bytes {ram_bytes} compressed_len {}",
            compressed.len()
        ),
        FileExtent::Regular {
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        } => {
            format!("extent regular disk_bytenr {disk_bytenr} disk_num_bytes {disk_num_bytes} offset {offset} num_bytes {num_bytes}")
        }
        FileExtent::Prealloc {
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        } => {
            format!("extent prealloc disk_bytenr {disk_bytenr} disk_num_bytes {disk_num_bytes} offset {offset} num_bytes {num_bytes}")
        }
        FileExtent::Compressed {
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
            ram_bytes,
            compressed_len,
            compression,
        } => {
            format!("extent compressed {compression} disk_bytenr {disk_bytenr} disk_num_bytes {disk_num_bytes} compressed_len {compressed_len} ram_bytes {ram_bytes} offset {offset} num_bytes {num_bytes}")
        }
    }
}

/// `\titem 3 key (257 INODE_ITEM 0) itemoff 16123 itemsize 96\n\t\t<body>`
pub fn leaf_item(slot: usize, key: &Key, itemoff: usize, data: &[u8]) -> String {
    format!(
        "\titem {slot} key {key} itemoff {itemoff} itemsize {}\n\t\t{}",
        data.len(),
        item_body(key, data)
    )
}

/// `\tkey (256 INODE_ITEM 0) block 1064960 gen 7`
pub fn key_ptr(slot: usize, p: &KeyPtr) -> String {
    format!(
        "\tptr {slot} key {} block {} gen {}",
        p.key, p.blockptr, p.generation
    )
}

/// The `(data_offset, data_size)` of each item as stored in the raw leaf
/// header area (what `itemoff` prints). Empty when `raw` is not a leaf.
pub fn raw_leaf_offsets(raw: &[u8]) -> Vec<(usize, usize)> {
    if raw.len() < NODE_SIZE || raw[36] != 0 {
        return Vec::new();
    }
    let nritems = u32::from_le_bytes([raw[32], raw[33], raw[34], raw[35]]) as usize;
    let max = BODY_SIZE / LEAF_ITEM_HEADER_SIZE;
    let mut out = Vec::with_capacity(nritems.min(max));
    for slot in 0..nritems.min(max) {
        let at = HEADER_SIZE + slot * LEAF_ITEM_HEADER_SIZE + crate::format::Key::ENCODED_SIZE;
        let off = u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]) as usize;
        let size =
            u32::from_le_bytes([raw[at + 4], raw[at + 5], raw[at + 6], raw[at + 7]]) as usize;
        out.push((off, size));
    }
    out
}

/// A whole node: header line, then one entry per item or pointer. With the
/// raw bytes, `itemoff` is what is stored; without, what the encoder would
/// store.
pub fn node(node: &Node, raw: Option<&[u8]>) -> String {
    let mut s = node_header(node);
    s.push('\n');
    match &node.body {
        NodeBody::Leaf(items) => {
            let stored = raw.map(raw_leaf_offsets).unwrap_or_default();
            let mut end = BODY_SIZE;
            for (slot, item) in items.iter().enumerate() {
                end = end.saturating_sub(item.data.len());
                let itemoff = stored.get(slot).map_or(end, |&(off, _)| off);
                s.push_str(&leaf_item(slot, &item.key, itemoff, &item.data));
                s.push('\n');
            }
        }
        NodeBody::Internal(ptrs) => {
            for (slot, p) in ptrs.iter().enumerate() {
                s.push_str(&key_ptr(slot, p));
                s.push('\n');
            }
        }
    }
    s
}

/// The header fields of a raw block, read without validation (for blocks
/// that fail to decode).
pub fn raw_node_header(raw: &[u8]) -> String {
    if raw.len() < HEADER_SIZE {
        return format!("short block ({} bytes)", raw.len());
    }
    let u32_at = |at: usize| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&raw[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let magic = u32_at(4);
    format!(
        "raw header: csum {:#010x} magic {:#010x}{} bytenr {} generation {} owner {} nritems {} level {}",
        u32_at(0),
        magic,
        if magic == NODE_MAGIC { " (BNOD)" } else { " (not BNOD)" },
        u64_at(8),
        u64_at(16),
        tree_name(u64_at(24)),
        u32_at(32),
        raw[36]
    )
}

/// Dumps the block at `bytenr` decoded, when it is a valid node of this
/// filesystem. Otherwise prints its raw header (when it can be read) and
/// returns why it is not a node as the inner error: a dump that shows
/// nothing of what was asked must not look like a success.
pub fn block<D: BlockDevice + ?Sized>(
    out: &mut dyn io::Write,
    dev: &D,
    fsid: &[u8; 16],
    bytenr: u64,
) -> io::Result<crate::Result<()>> {
    match read_node_uncached(dev, fsid, bytenr, None) {
        Ok(n) => {
            let mut raw = vec![0u8; NODE_SIZE];
            let raw = dev.read_at(&mut raw, bytenr).ok().map(|_| raw);
            out.write_all(node(&n, raw.as_deref()).as_bytes())?;
            Ok(Ok(()))
        }
        Err(e) => {
            let mut raw = vec![0u8; NODE_SIZE];
            if bytenr
                .checked_add(NODE_SIZE as u64)
                .is_some_and(|end| end <= dev.size_bytes())
                && dev.read_at(&mut raw, bytenr).is_ok()
            {
                writeln!(out, "block {bytenr}: {}", raw_node_header(&raw))?;
            }
            Ok(Err(e))
        }
    }
}

/// Dumps a whole tree depth-first from its root. Nodes that fail to read
/// print their error in place; a block reached twice prints once.
/// `generation` is what the root pointer promises (None: not checked).
pub fn tree<D: BlockDevice + ?Sized>(
    out: &mut dyn io::Write,
    dev: &D,
    fsid: &[u8; 16],
    tree: u64,
    bytenr: u64,
    level: u8,
    generation: Option<u64>,
) -> io::Result<()> {
    writeln!(out, "tree {} root {bytenr} level {level}", tree_name(tree))?;
    let mut seen = HashSet::new();
    // (bytenr, expected level, expected generation)
    let mut stack = vec![(bytenr, level, generation)];
    while let Some((bytenr, level, generation)) = stack.pop() {
        if !seen.insert(bytenr) {
            writeln!(out, "block {bytenr}: already printed (reached twice)")?;
            continue;
        }
        let expect = generation.map(|generation| NodeExpectation {
            tree,
            level,
            generation,
        });
        let n = match read_node_uncached(dev, fsid, bytenr, expect) {
            Ok(n) => n,
            Err(e) => {
                writeln!(out, "{e}")?;
                continue;
            }
        };
        if expect.is_none() && (n.owner != tree || n.level != level) {
            writeln!(
                out,
                "block {bytenr}: owner {} level {} but expected {} level {level}",
                tree_name(n.owner),
                n.level,
                tree_name(tree)
            )?;
            continue;
        }
        let mut raw = vec![0u8; NODE_SIZE];
        let raw = dev.read_at(&mut raw, bytenr).ok().map(|_| raw);
        out.write_all(node(&n, raw.as_deref()).as_bytes())?;
        if let NodeBody::Internal(ptrs) = &n.body {
            if n.level > 0 {
                for p in ptrs.iter().rev() {
                    stack.push((p.blockptr, n.level - 1, Some(p.generation)));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{item_type, LeafItem};

    #[test]
    fn items_print_decoded_and_damaged() {
        let i = InodeItem {
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            size: 10,
            nbytes: 4096,
            generation: 3,
            transid: 7,
            ..Default::default()
        };
        let s = item_body(&Key::new(257, item_type::INODE_ITEM, 0), &i.encode());
        assert!(
            s.starts_with(
                "inode generation 3 transid 7 size 10 nbytes 4096 nlink 1 uid 0 gid 0 mode 100644"
            ),
            "{s}"
        );
        let s = item_body(&Key::new(257, item_type::INODE_ITEM, 0), &[1, 2, 3]);
        assert!(s.starts_with("undecodable: "), "{s}");
        let s = item_body(&Key::new(257, 200, 0), &[1, 2, 3]);
        assert_eq!(s, "unknown item type 200 (3 bytes: 010203)");
        let s = item_body(&Key::new(257, item_type::LOG_UNLINKED, 0), &[]);
        assert_eq!(s, "log unlinked: every name is gone");
        assert_eq!(name(b"a\"\\\n\xff"), "a\\\"\\\\\\x0a\\xff");
        let n = Node {
            bytenr: 1 << 20,
            generation: 1,
            owner: 5,
            level: 0,
            body: NodeBody::Leaf(vec![LeafItem {
                key: Key::new(257, 1, 0),
                data: i.encode(),
            }]),
        };
        let raw = n.encode(&[0; 16]);
        let printed = node(&n, Some(&raw));
        assert!(
            printed.contains(&format!(
                "item 0 key (257 INODE_ITEM 0) itemoff {} itemsize {}",
                BODY_SIZE - InodeItem::ENCODED_SIZE,
                InodeItem::ENCODED_SIZE
            )),
            "{printed}"
        );
        assert_eq!(printed, node(&n, None));
    }

    /// A hostile checksum key near 2^64: the printed range saturates
    /// instead of overflowing (the dump shows what the check reports).
    #[test]
    fn csum_item_keyed_near_2_pow_64_prints() {
        let key = Key::new(
            crate::format::EXTENT_CSUM_OBJECTID,
            item_type::EXTENT_CSUM,
            u64::MAX - 4095,
        );
        let s = item_body(&key, &[0; 8]);
        assert!(s.starts_with("csums 2 blocks ["), "{s}");
    }

    #[test]
    fn subvolume_items_print() {
        let rr = RootRef {
            dirid: 256,
            index: 2,
            name: b"snap".to_vec(),
        };
        let s = item_body(&Key::root_ref(5, 257), &rr.encode());
        assert_eq!(s, "root ref dirid 256 index 2 namelen 4 name: snap");
        let s = item_body(&Key::root_backref(257, 5), &rr.encode());
        assert_eq!(s, "root backref dirid 256 index 2 namelen 4 name: snap");
        let item = SubvolRootItem {
            refs: 1,
            flags: crate::format::SUBVOL_RDONLY,
            uuid: [7; 16],
            ..Default::default()
        };
        let s = item_body(&Key::new(257, item_type::ROOT_ITEM, 0), &item.encode());
        assert!(
            s.starts_with("root bytenr 0 generation 0 level 0 refs 1 flags 0x1 (RDONLY)"),
            "{s}"
        );
        assert!(s.contains("parent_uuid - received_uuid -"), "{s}");
        let link = DirEntry {
            ino: 257,
            file_type: FileType::Directory,
            name: b"snap".to_vec(),
            subvolume: true,
        };
        let s = item_body(&Key::new(256, item_type::DIR_INDEX, 2), &link.encode());
        assert_eq!(s, "location subvol(257) type SUBVOL namelen 4 name: snap");
        let sb = Superblock {
            fsid: [1; 16],
            generation: 3,
            root_tree_bytenr: 1 << 20,
            root_tree_level: 0,
            total_bytes: 16 << 20,
            bytes_used: 65536,
            log_root_bytenr: 0,
            log_root_level: 0,
            log_generation: 0,
            backup_roots: [crate::format::BackupRoot::EMPTY; crate::format::BACKUP_ROOT_COUNT],
            metadata_profile: crate::format::MetadataProfile::Single,
            data_checksums: false,
            log_manifest: None,
            subvolumes: true,
            compression: false,
        };
        assert!(superblock(&sb, 65536).contains("subvolumes on (incompat_flags 0x8)"));
    }
}
