//! `birch check`: verifies every invariant of every tree of an image.
//!
//! The check is a table of passes ([`PASSES`]) run in order over one shared
//! state, in the style of bcachefs's recovery passes. Each pass has a stable
//! id that names every fault it reports; docs/CHECK.md lists them and what
//! each fault means.
//!
//! ```text
//! superblock      pick the newest valid copy; sizes
//! tree-structure  walk every tree once (each node read once): checksum,
//!                 header, owner/level/generation, key order and parent
//!                 keys, no block reached twice; decode every leaf item
//!                 into compact records (decode faults name `items`)
//! items           per-item rules on the records (key offsets, generations)
//! extent-refs     extent tree <-> nodes and file extents; overlaps, range,
//!                 bytes_used, free space, log nodes outside extents
//! namespace       root dir, INODE_REF <-> DIR_ITEM <-> DIR_INDEX, hashes,
//!                 reachability, orphans, directory size
//! nlink           link counts, orphan items for unlinked inodes
//! file-extents    per-file extent layout, inline rules, nbytes
//! data-csums      checksums of the data extents in use
//! subvolumes      root items, root refs, links, orphan roots, default
//! data            (--verify-data only) every referenced data extent read
//!                 once: checksums, compressed extents decompress
//! ```
//!
//! The check never writes and never panics: a device it cannot make sense
//! of yields faults. Work is bounded: every node is read at most once per
//! pointer to it (nodes already reached are never descended into again), and
//! levels strictly decrease down a tree, so a cyclic or hostile image
//! terminates.

mod csums;
mod data;
mod extents;
mod fault_id;
mod files;
#[doc(hidden)]
pub mod fixture;
mod namespace;
mod node_read;
mod roots;
mod subvols;
mod superblock;
mod walk;

pub use fault_id::FaultId;
pub use roots::{tree_nodes, tree_roots, TreeRootRef};
pub use superblock::{
    newest_valid_copy, read_superblock_copies, SuperblockCopy, SuperblockCopyError,
};

use crate::device::BlockDevice;
use crate::error::Corruption;
use crate::format::tree_name;
use crate::format::{tree_id, Key, Superblock};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::io;

/// One pass of the check.
pub struct Pass {
    /// Stable id, printed in every fault the pass reports.
    pub id: &'static str,
    pub description: &'static str,
    run: fn(&mut Checker<'_>) -> PassStatus,
}

/// The passes, in the order they run.
pub const PASSES: &[Pass] = &[
    Pass { id: "superblock", description: "superblock copies: magic, checksum, location; picks the newest valid copy; sizes fit the device", run: superblock::run },
    Pass {
        id: "tree-structure",
        description: "every node of every tree: checksum, header, owner, level, generation, key order within and across nodes, parent keys, no empty non-root node, no block reached twice, no overlapping nodes; root items",
        run: walk::run,
    },
    Pass { id: "items", description: "every item decodes for its type, is a type its tree may hold, and has valid key offsets and generations", run: walk::run_items },
    Pass {
        id: "extent-refs",
        description: "extent tree: one metadata item per tree node, data refs equal the file extents pointing in, no overlap, in range and aligned, bytes_used, free space; log nodes outside extents",
        run: extents::run,
    },
    Pass {
        id: "namespace",
        description: "root directory; INODE_REF, DIR_ITEM and DIR_INDEX agree; name hashes; every inode reachable; items name existing inodes; orphan items; directory sizes",
        run: namespace::run_namespace,
    },
    Pass { id: "nlink", description: "link counts; directories have one name; unlinked inodes have orphan items", run: namespace::run_nlink },
    Pass { id: "file-extents", description: "file extents: aligned, ordered, no overlap, inline rules, symlinks, below i_size, nbytes", run: files::run },
    Pass { id: "data-csums", description: "data checksums: every block of every data extent a regular file extent uses has one, none covers anything else, no overlaps (docs/DATA-CHECKSUMS.md)", run: csums::run },
    Pass {
        id: "subvolumes",
        description: "subvolume root items (long form, fields, uuids), ROOT_REF / ROOT_BACKREF pairs and their links, no link cycle, orphan roots, the default subvolume; none of them without INCOMPAT_SUBVOLUMES (docs/SNAPSHOTS.md)",
        run: subvols::run,
    },
    Pass {
        id: "data",
        description: "with --verify-data: every data extent a subvolume tree references is read once, its blocks match their checksums, and a compressed one decompresses to the length its items record",
        run: data::run,
    },
];

/// Pass ids, for callers that filter faults.
pub mod pass_id {
    pub const SUPERBLOCK: &str = "superblock";
    pub const TREE_STRUCTURE: &str = "tree-structure";
    pub const ITEMS: &str = "items";
    pub const EXTENT_REFS: &str = "extent-refs";
    pub const NAMESPACE: &str = "namespace";
    pub const NLINK: &str = "nlink";
    pub const FILE_EXTENTS: &str = "file-extents";
    pub const DATA_CSUMS: &str = "data-csums";
    pub const SUBVOLUMES: &str = "subvolumes";
    pub const DATA: &str = "data";
}

/// What [`check_device_with`] does beyond the metadata.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckOptions {
    /// Also run pass `data` (`birch check --verify-data`): read every
    /// referenced data extent once, compare its checksums and decompress
    /// it if compressed. Keeps the checksum tree's checksums in memory
    /// (4 bytes per 4 KiB of data).
    pub verify_data: bool,
}

/// What a pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassStatus {
    Ran,
    /// Not run, and why (e.g. the tree it reads could not be read at all).
    Skipped(String),
}

/// One problem found: what ([`FaultId`], which also names the pass),
/// where (tree, block, slot, key, each when known) and why. Prints in the
/// project's one report format, prefixed by its id:
/// `[nlink] corrupt node: tree=fs(5) block=1064960 slot=4: key (257 INODE_ITEM 0): nlink 2 but 1 name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub id: FaultId,
    /// The pass that reported it (`id.pass()`).
    pub pass: &'static str,
    pub tree: Option<u64>,
    pub block: Option<u64>,
    pub slot: Option<usize>,
    pub key: Option<Key>,
    pub reason: String,
}

impl Fault {
    /// The fault as a [`Corruption`] (the key, when known, leads the reason).
    pub fn corruption(&self) -> Corruption {
        let reason = match self.key {
            Some(key) => format!("key {key}: {}", self.reason),
            None => self.reason.clone(),
        };
        Corruption {
            tree: self.tree,
            block: self.block,
            slot: self.slot,
            reason,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.corruption();
        if c.tree.is_none() && c.block.is_none() && c.slot.is_none() {
            // Nothing to locate: `corrupt: reason`.
            write!(f, "[{}] corrupt: {}", self.id, c.reason)
        } else {
            write!(f, "[{}] {c}", self.id)
        }
    }
}

/// Per-tree counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeSummary {
    pub id: u64,
    /// For log trees: the subvolume logged.
    pub subvolume: Option<u64>,
    pub root: u64,
    pub level: u8,
    pub nodes: u64,
    pub leaves: u64,
    pub items: u64,
}

/// What the check saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub device_bytes: u64,
    /// The superblock copy used (None: no valid copy).
    pub superblock_copy: Option<u64>,
    pub fsid: [u8; 16],
    pub generation: u64,
    pub total_bytes: u64,
    /// Copies of each tree node (docs/DUP.md).
    pub metadata_profile: crate::format::MetadataProfile,
    /// bytes_used as the superblock records it.
    pub bytes_used_recorded: u64,
    /// Bytes the extent items cover.
    pub bytes_used_counted: u64,
    /// Bytes of [FIRST_ALLOCATABLE_BYTE, total_bytes) no extent item covers.
    pub free_bytes: u64,
    pub trees: Vec<TreeSummary>,
    pub inodes: u64,
    pub directories: u64,
    pub regular_files: u64,
    pub symlinks: u64,
    pub special_files: u64,
    pub names: u64,
    pub xattrs: u64,
    pub orphans: u64,
    pub metadata_extents: u64,
    pub data_extents: u64,
    pub data_extent_bytes: u64,
    pub file_extent_items: u64,
    /// Of those, compressed ones (docs/COMPRESSION.md; the crash explorer
    /// counts states holding any).
    pub compressed_extent_items: u64,
    /// Compressed inline extents (docs/COMPRESSION.md, "Compressed inline
    /// extents"), among the file extent items but not the compressed ones.
    pub compressed_inline_items: u64,
    /// Nodes of log trees (outside the extent tree).
    pub log_nodes: u64,
    /// What pass `data` read (`None`: it did not run).
    pub data_verified: Option<DataVerified>,
    /// Deleted subvolumes whose drop has not finished (refs 0, an
    /// orphan-root item), with how far it got (`Key::MIN`: not started).
    /// An interrupted deletion is reported here, not as a fault: the next
    /// read-write mount resumes it.
    pub deleted_subvolumes: Vec<(u64, crate::format::Key)>,
}

/// What pass `data` read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataVerified {
    /// Disk extents read (each once, however many items share it).
    pub extents: u64,
    pub bytes: u64,
    /// Compressed extents decompressed (once per compression their items
    /// record).
    pub decompressed: u64,
    /// Compressed inline extents decompressed (each item: its data is its
    /// own).
    pub inline_decompressed: u64,
}

/// The result of [`check_device`].
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    pub faults: Vec<Fault>,
    pub warnings: Vec<Fault>,
    /// Faults found but not stored, past [`MAX_STORED_FAULTS`].
    pub faults_not_stored: u64,
    pub passes: Vec<(&'static str, PassStatus)>,
    pub summary: Summary,
}

/// Cap on stored faults (a hostile image could otherwise produce millions).
pub const MAX_STORED_FAULTS: usize = 100_000;

impl CheckReport {
    /// No faults (warnings allowed).
    pub fn is_clean(&self) -> bool {
        self.faults.is_empty() && self.faults_not_stored == 0
    }

    /// A valid superblock was found (the device holds a birch filesystem,
    /// however damaged).
    pub fn found_filesystem(&self) -> bool {
        self.summary.superblock_copy.is_some()
    }

    pub fn fault_count(&self) -> u64 {
        self.faults.len() as u64 + self.faults_not_stored
    }

    pub fn faults_of<'a>(&'a self, pass: &'a str) -> impl Iterator<Item = &'a Fault> + 'a {
        self.faults.iter().filter(move |f| f.pass == pass)
    }

    /// The faults of one kind.
    pub fn faults_with(&self, id: FaultId) -> impl Iterator<Item = &Fault> + '_ {
        self.faults.iter().filter(move |f| f.id == id)
    }

    /// The warnings of one kind.
    pub fn warnings_with(&self, id: FaultId) -> impl Iterator<Item = &Fault> + '_ {
        self.warnings.iter().filter(move |f| f.id == id)
    }

    /// One line naming why nothing could be checked, when no superblock
    /// copy is valid.
    pub fn unreadable_reason(&self) -> Option<String> {
        if self.found_filesystem() {
            return None;
        }
        let reasons: Vec<String> = self
            .faults_of(pass_id::SUPERBLOCK)
            .map(|f| f.reason.clone())
            .collect();
        Some(if reasons.is_empty() {
            "no valid superblock".to_string()
        } else {
            reasons.join("; ")
        })
    }
}

impl CheckReport {
    /// The summary part of the report: what the check saw.
    fn fmt_summary(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.summary;
        match s.superblock_copy {
            Some(copy) => writeln!(
                f,
                "filesystem {} generation {} (superblock copy at {copy})",
                crate::print::fsid(&s.fsid),
                s.generation
            )?,
            None => writeln!(f, "no valid superblock")?,
        }
        writeln!(
            f,
            "device {} bytes, filesystem {} bytes",
            s.device_bytes, s.total_bytes
        )?;
        if !s.trees.is_empty() {
            writeln!(f, "trees:")?;
            for t in &s.trees {
                let name = match t.subvolume {
                    Some(sub) => format!("{} of {}", tree_name(t.id), tree_name(sub)),
                    None => tree_name(t.id),
                };
                writeln!(
                    f,
                    "  {name:<16} root {:<12} level {} nodes {} leaves {} items {}",
                    t.root, t.level, t.nodes, t.leaves, t.items
                )?;
            }
        }
        for (id, progress) in &s.deleted_subvolumes {
            writeln!(
                f,
                "deleted subvolume {id}: being dropped, released up to {progress}"
            )?;
        }
        if s.superblock_copy.is_some() {
            writeln!(
                f,
                "inodes {}: {} directories, {} regular files, {} symlinks, {} special; {} names, {} xattrs, {} orphans",
                s.inodes, s.directories, s.regular_files, s.symlinks, s.special_files, s.names, s.xattrs, s.orphans
            )?;
            let node_bytes = s
                .metadata_extents
                .saturating_mul(crate::format::NODE_SIZE as u64);
            let mirrors = match s.metadata_profile {
                crate::format::MetadataProfile::Single => String::new(),
                crate::format::MetadataProfile::Dup { mirror_offset } => {
                    format!(" + as many in DUP mirrors at +{mirror_offset}")
                }
            };
            writeln!(
                f,
                "extents: {} tree nodes ({node_bytes} bytes{mirrors}), {} data extents ({} bytes) behind {} file extent items ({} compressed, {} compressed inline)",
                s.metadata_extents,
                s.data_extents,
                s.data_extent_bytes,
                s.file_extent_items,
                s.compressed_extent_items,
                s.compressed_inline_items
            )?;
            if let Some(d) = s.data_verified {
                writeln!(
                    f,
                    "data: read {} extents ({} bytes), decompressed {} compressed extents and {} compressed inline extents",
                    d.extents, d.bytes, d.decompressed, d.inline_decompressed
                )?;
            }
            if s.log_nodes > 0 {
                writeln!(f, "log trees: {} nodes", s.log_nodes)?;
            }
            writeln!(
                f,
                "space: used {} bytes (superblock records {}), free {} bytes",
                s.bytes_used_counted, s.bytes_used_recorded, s.free_bytes
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_summary(f)?;
        writeln!(f, "passes:")?;
        for (id, status) in &self.passes {
            let n = self.faults_of(id).count();
            match status {
                PassStatus::Ran if n == 0 => writeln!(f, "  {id:<15} ok")?,
                PassStatus::Ran => {
                    writeln!(f, "  {id:<15} {n} fault{}", if n == 1 { "" } else { "s" })?
                }
                PassStatus::Skipped(why) => writeln!(f, "  {id:<15} skipped: {why}")?,
            }
        }
        if !self.warnings.is_empty() {
            writeln!(f, "warnings:")?;
            for w in &self.warnings {
                writeln!(f, "  {w}")?;
            }
        }
        if !self.faults.is_empty() {
            writeln!(f, "faults:")?;
            for fault in &self.faults {
                writeln!(f, "  {fault}")?;
            }
        }
        if self.faults_not_stored > 0 {
            writeln!(
                f,
                "  ... and {} more faults not shown",
                self.faults_not_stored
            )?;
        }
        if self.is_clean() {
            writeln!(f, "result: clean")
        } else {
            writeln!(
                f,
                "result: {} fault{}",
                self.fault_count(),
                if self.fault_count() == 1 { "" } else { "s" }
            )
        }
    }
}

/// Checks the filesystem on `dev` without writing to it: its metadata
/// (every pass but `data`).
pub fn check_device<D: BlockDevice + ?Sized>(dev: &D) -> CheckReport {
    check_device_with(dev, CheckOptions::default())
}

/// [`check_device`], with the data too when `options` asks for it.
pub fn check_device_with<D: BlockDevice + ?Sized>(dev: &D, options: CheckOptions) -> CheckReport {
    let reader = ReadOnly(dev);
    let mut c = Checker::new(&reader, options);
    for pass in PASSES {
        if pass.id == pass_id::DATA && !options.verify_data {
            continue;
        }
        let status = (pass.run)(&mut c);
        c.report.passes.push((pass.id, status));
    }
    c.report
}

/// A read-only view of the device: the check can never write.
struct ReadOnly<'a, D: ?Sized>(&'a D);

impl<D: BlockDevice + ?Sized> BlockDevice for ReadOnly<'_, D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "birch check never writes",
        ))
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
}

// ----- shared state of the passes -----

/// Where an item lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub tree: u64,
    pub block: u64,
    pub slot: u32,
    pub key: Key,
}

/// A node reached by the walk.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeRec {
    /// The tree the walk first reached it from.
    pub tree: u64,
    /// Its header's owner: the tree, or for a node of a subvolume tree
    /// the subvolume that allocated it.
    pub owner: u64,
    pub level: u8,
    pub generation: u64,
    /// What a second pointer to it (from a tree sharing it) must agree
    /// with, since the walk does not read it again.
    pub first_key: Option<Key>,
    pub last_key: Option<Key>,
    /// Reached as a tree's root, not through a parent.
    pub is_root: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtentKind {
    Data,
    Metadata {
        level: u64,
    },
    /// The DUP mirror of the node a metadata item records (not an item of
    /// its own: the extent-refs pass adds one per metadata item).
    Mirror,
}

/// One extent tree item.
#[derive(Debug, Clone)]
pub(crate) struct ExtentRec {
    pub bytenr: u64,
    pub len: u64,
    pub kind: ExtentKind,
    /// None when the payload did not decode (reported by `items`).
    pub item: Option<crate::format::ExtentItem>,
    pub loc: Loc,
}

#[derive(Debug, Clone)]
pub(crate) struct InodeRec {
    pub item: crate::format::InodeItem,
    pub loc: Loc,
}

/// One name from an INODE_REF item.
#[derive(Debug, Clone)]
pub(crate) struct RefRec {
    pub ino: u64,
    pub parent: u64,
    pub index: u64,
    pub name: Vec<u8>,
    pub loc: Loc,
}

/// One entry of a DIR_ITEM or a DIR_INDEX item.
#[derive(Debug, Clone)]
pub(crate) struct EntryRec {
    pub ino: u64,
    pub file_type: crate::format::FileType,
    pub name: Vec<u8>,
    pub loc: Loc,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum FileExtentKind {
    /// Inline data of `len` file bytes; `compression` for a compressed
    /// inline extent (`len` is what it decompresses to).
    Inline {
        len: u64,
        compression: Option<crate::format::Compression>,
    },
    Regular(crate::format::DiskRef),
    Prealloc(crate::format::DiskRef),
    Compressed(crate::format::DiskRef, crate::format::CompressedRef),
}

impl FileExtentKind {
    /// The disk extent range, of any but an inline extent.
    pub fn disk(&self) -> Option<crate::format::DiskRef> {
        match *self {
            FileExtentKind::Inline { .. } => None,
            FileExtentKind::Regular(d)
            | FileExtentKind::Prealloc(d)
            | FileExtentKind::Compressed(d, _) => Some(d),
        }
    }

    /// What the item adds to `nbytes` (`FileExtent::nbytes`).
    pub fn nbytes(&self) -> u64 {
        match *self {
            FileExtentKind::Inline { len, .. } => len,
            FileExtentKind::Regular(d) | FileExtentKind::Prealloc(d) => d.num_bytes,
            FileExtentKind::Compressed(d, c) => {
                crate::format::compressed_share(d.disk_num_bytes, d.num_bytes, c.ram_bytes)
            }
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct FileExtentRec {
    pub ino: u64,
    pub file_offset: u64,
    pub kind: FileExtentKind,
    pub loc: Loc,
    /// Recorded for a second subvolume through a shared leaf: its tree's
    /// passes see it, the data-extent count (one per leaf, S2) does not.
    pub in_shared_copy: bool,
}

/// One subvolume tree's items, decoded into what the semantic passes
/// need.
#[derive(Debug, Default)]
pub(crate) struct FsRecords {
    /// The subvolume tree they are from (5 or 256..): faults about an item
    /// that is missing name it.
    pub tree: u64,
    pub inodes: BTreeMap<u64, InodeRec>,
    pub refs: Vec<RefRec>,
    /// (dir, name) -> entry
    pub dir_items: HashMap<(u64, Vec<u8>), EntryRec>,
    /// (dir, index) -> entry
    pub dir_index: BTreeMap<(u64, u64), EntryRec>,
    pub file_extents: Vec<FileExtentRec>,
    /// (ino named by the orphan item, where)
    pub orphans: Vec<(u64, Loc)>,
    /// Every objectid that has items (but ORPHAN_OBJECTID), with its first item.
    pub objectids: BTreeMap<u64, Loc>,
}

/// What the passes share.
pub(crate) struct Checker<'a> {
    dev: &'a dyn BlockDevice,
    options: CheckOptions,
    report: CheckReport,
    sb: Option<Superblock>,
    /// Trees whose root node could be read.
    readable: HashMap<u64, bool>,
    /// Every node reached, by bytenr (log trees included).
    nodes: HashMap<u64, NodeRec>,
    /// The pointers to each node: from distinct parent nodes, plus 1 for
    /// the root item or superblock naming a root (what its metadata item's
    /// refs must be, docs/SNAPSHOTS.md S1).
    node_refs: HashMap<u64, u64>,
    /// (node, subvolume tree) pairs for the nodes subvolumes share: one
    /// tree may reach a node only once.
    shared_reached: HashSet<(u64, u64)>,
    /// Set while the items of a shared subtree are recorded again for a
    /// second subvolume ([`Self::record_shared_subtree`]): its faults and
    /// counts were taken by the first walk, so none are taken twice.
    recording_shared_copy: bool,
    /// `(tree id) -> (root item, where)` from the root tree.
    roots: BTreeMap<u64, (crate::format::RootItem, Loc)>,
    /// `(subvolume) -> (root item, where)` from the log root tree.
    log_roots: BTreeMap<u64, (crate::format::RootItem, Loc)>,
    /// The superblock's log manifest, when the log checked is the newest
    /// (docs/LOG-FLUSH.md): a copy of a listed block with another
    /// checksum is not the node.
    log_manifest: HashMap<u64, u32>,
    extents: Vec<ExtentRec>,
    /// Every subvolume tree's records, by tree id (dead ones included:
    /// their file extents still reference data extents).
    fs: BTreeMap<u64, FsRecords>,
    csums: csums::CsumRecords,
    subvols: subvols::SubvolRecords,
    /// With `--verify-data`: what decompressing each compressed inline
    /// extent gave, found by the walk (the data is the item's), reported
    /// by pass `data`.
    inline_decompressions: Vec<InlineDecompression>,
}

/// One compressed inline extent decompressed by the walk.
pub(crate) struct InlineDecompression {
    pub loc: Loc,
    pub compression: crate::format::Compression,
    /// Its compressed bytes.
    pub stored: u64,
    pub ram_bytes: u64,
    pub outcome: Result<(), crate::format::DecompressFault>,
}

/// Where a fault is, as far as known.
#[derive(Clone, Copy, Default)]
struct Place {
    tree: Option<u64>,
    block: Option<u64>,
    slot: Option<usize>,
    key: Option<Key>,
}

impl Place {
    fn item(loc: &Loc) -> Place {
        Place {
            tree: Some(loc.tree),
            block: Some(loc.block),
            slot: Some(loc.slot as usize),
            key: Some(loc.key),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Severity {
    Fault,
    Warning,
}

impl<'a> Checker<'a> {
    fn new(dev: &'a dyn BlockDevice, options: CheckOptions) -> Self {
        let mut report = CheckReport::default();
        report.summary.device_bytes = dev.size_bytes();
        Checker {
            dev,
            options,
            report,
            sb: None,
            readable: HashMap::new(),
            nodes: HashMap::new(),
            node_refs: HashMap::new(),
            shared_reached: HashSet::new(),
            recording_shared_copy: false,
            roots: BTreeMap::new(),
            log_roots: BTreeMap::new(),
            log_manifest: HashMap::new(),
            extents: Vec::new(),
            fs: BTreeMap::new(),
            csums: csums::CsumRecords::default(),
            subvols: subvols::SubvolRecords::default(),
            inline_decompressions: Vec::new(),
        }
    }

    /// Records a fault or warning `id` at `place`.
    fn push(&mut self, severity: Severity, id: FaultId, place: Place, reason: String) {
        if self.recording_shared_copy {
            return;
        }
        let fault = Fault {
            id,
            pass: id.pass(),
            tree: place.tree,
            block: place.block,
            slot: place.slot,
            key: place.key,
            reason,
        };
        match severity {
            Severity::Warning => {
                if self.report.warnings.len() < MAX_STORED_FAULTS {
                    self.report.warnings.push(fault);
                }
            }
            Severity::Fault => {
                if self.report.faults.len() < MAX_STORED_FAULTS {
                    self.report.faults.push(fault);
                } else {
                    self.report.faults_not_stored += 1;
                }
            }
        }
    }

    /// A fault about the item at `loc`.
    fn fault_at(&mut self, id: FaultId, loc: &Loc, reason: impl Into<String>) {
        self.push(Severity::Fault, id, Place::item(loc), reason.into());
    }

    fn warn_at(&mut self, id: FaultId, loc: &Loc, reason: impl Into<String>) {
        self.push(Severity::Warning, id, Place::item(loc), reason.into());
    }

    /// A fault about an item that should exist but does not.
    fn fault_key(&mut self, id: FaultId, tree: u64, key: Key, reason: impl Into<String>) {
        let place = Place {
            tree: Some(tree),
            key: Some(key),
            ..Place::default()
        };
        self.push(Severity::Fault, id, place, reason.into());
    }

    fn fault_block(
        &mut self,
        id: FaultId,
        tree: Option<u64>,
        block: u64,
        slot: Option<usize>,
        reason: impl Into<String>,
    ) {
        let place = Place {
            tree,
            block: Some(block),
            slot,
            key: None,
        };
        self.push(Severity::Fault, id, place, reason.into());
    }

    fn warn_block(
        &mut self,
        id: FaultId,
        tree: Option<u64>,
        block: u64,
        reason: impl Into<String>,
    ) {
        let place = Place {
            tree,
            block: Some(block),
            slot: None,
            key: None,
        };
        self.push(Severity::Warning, id, place, reason.into());
    }

    fn fault_tree(&mut self, id: FaultId, tree: Option<u64>, reason: impl Into<String>) {
        let place = Place {
            tree,
            ..Place::default()
        };
        self.push(Severity::Fault, id, place, reason.into());
    }

    fn warn_tree(&mut self, id: FaultId, tree: Option<u64>, reason: impl Into<String>) {
        let place = Place {
            tree,
            ..Place::default()
        };
        self.push(Severity::Warning, id, place, reason.into());
    }

    fn tree_readable(&self, tree: u64) -> bool {
        self.readable.get(&tree).copied().unwrap_or(false)
    }

    /// The records of subvolume tree `tree`, created empty on first use.
    fn fs_records(&mut self, tree: u64) -> &mut FsRecords {
        self.fs.entry(tree).or_insert_with(|| FsRecords {
            tree,
            ..FsRecords::default()
        })
    }

    /// The subvolume trees whose namespace, link counts and file extents
    /// are checked (docs/SNAPSHOTS.md S7): every live one whose root node
    /// could be read, 5 first. A dead root (refs 0, waiting for the
    /// cleaner) is not: its namespace is being taken apart, and only its
    /// nodes and file extents still count for the extent tree.
    fn namespace_trees(&self) -> Vec<u64> {
        self.roots
            .keys()
            .copied()
            .filter(|&id| tree_id::is_subvolume(id))
            .filter(|&id| self.subvols.is_live(id) && self.tree_readable(id))
            .collect()
    }

    /// The file extents of every subvolume tree, dead ones included, each
    /// leaf's once (a leaf shared by snapshots holds one reference).
    fn all_file_extents(&self) -> impl Iterator<Item = &FileExtentRec> + '_ {
        self.fs
            .values()
            .flat_map(|fs| &fs.file_extents)
            .filter(|fe| !fe.in_shared_copy)
    }

    fn is_log_tree(tree: u64) -> bool {
        tree == tree_id::LOG || tree == tree_id::LOG_ROOT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    #[test]
    fn zeroed_and_tiny_devices_give_faults_not_panics() {
        for size in [0u64, 1, 4096, 65536 + 100, 300 * 1024, 2 << 20] {
            let report = check_device(&MemoryDevice::new(size));
            assert!(!report.is_clean(), "size {size}");
            assert!(!report.found_filesystem());
            assert!(report.unreadable_reason().is_some());
            let _ = report.to_string();
        }
    }

    #[test]
    fn sample_fixture_is_clean() {
        let fx = fixture::sample().build();
        let report = check_device(&fx.device());
        assert!(report.is_clean(), "{report}");
        assert!(report.warnings.is_empty(), "{report}");
        assert_eq!(report.summary.inodes, 6);
    }

    #[test]
    fn deep_fixture_is_clean() {
        let mut b = fixture::sample();
        b.leaf_items_max = 3;
        b.ptrs_max = 3;
        let fx = b.build();
        let report = check_device(&fx.device());
        assert!(report.is_clean(), "{report}");
        assert!(
            report
                .summary
                .trees
                .iter()
                .any(|t| t.id == tree_id::FS && t.level >= 2),
            "{report}"
        );
    }
}
