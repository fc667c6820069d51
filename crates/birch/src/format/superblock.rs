//! Superblock layout (SUPERBLOCK_SIZE bytes, one copy at each of
//! SUPERBLOCK_OFFSETS):
//!
//! ```text
//! 0   csum              u32  crc32c of bytes 4..SUPERBLOCK_SIZE
//! 4   reserved          u32
//! 8   magic             u64  "BIRCHFS1"
//! 16  bytenr            u64  offset of this copy
//! 24  fsid              [16]
//! 40  generation        u64  last committed transaction
//! 48  root_tree_bytenr  u64
//! 56  root_tree_level   u8   (+7 pad)
//! 64  total_bytes       u64  usable size of the device
//! 72  bytes_used        u64  allocated bytes (data + metadata)
//! 80  sector_size       u32
//! 84  node_size         u32
//! 88  log_root_bytenr   u64  0 = no log to replay
//! 96  log_root_level    u8   (+7 pad)
//! 104 log_generation    u64  log transaction that wrote the log root
//! 112 incompat_flags    u64  INCOMPAT_METADATA_DUP | INCOMPAT_DATA_CSUMS
//!                            | INCOMPAT_LOG_MANIFEST | INCOMPAT_SUBVOLUMES
//!                            | INCOMPAT_COMPRESSION,
//!                            or 0
//! 120 metadata_mirror_offset u64  DUP: every node also lives this far
//!                                 above its address; single: 0
//! with INCOMPAT_LOG_MANIFEST (a one-flush log sync, docs/LOG-FLUSH.md),
//! else zeroes:
//! 128 prev_log_root_bytenr u64  the log durable before this one; 0 = none
//! 136 prev_log_root_level  u8   (+7 pad)
//! 144 prev_log_generation  u64
//! 152 log_manifest_count   u32  1..=MAX_LOG_MANIFEST_NODES
//! 156 reserved (zeroes)
//! 256 backup_roots      4 x 64 bytes, newest first (BackupRoot)
//! 512 log manifest      log_manifest_count x (bytenr u64, node csum u32)
//!     reserved (zeroes) to the end
//! ```

use super::bytes::{put_u32, put_u64, Reader};
use super::items::RootItem;
use super::{FIRST_ALLOCATABLE_BYTE, NODE_SIZE, SECTOR_SIZE, SUPERBLOCK_MAGIC, SUPERBLOCK_SIZE};
use std::fmt;

/// Incompat flag: tree nodes are stored twice (docs/DUP.md). A birch that
/// does not know it must refuse the image: it would allocate data over the
/// mirror copies.
pub const INCOMPAT_METADATA_DUP: u64 = 1;

/// Incompat flag: the image has a checksum tree and every data extent
/// written under the flag has checksums (docs/DATA-CHECKSUMS.md). A birch
/// that does not know it must refuse the image: it would write extents
/// without checksums and free extents without deleting theirs.
pub const INCOMPAT_DATA_CSUMS: u64 = 2;

/// Incompat flag: the log root was written by a one-flush log sync and
/// may not have reached the disk whole; the superblock lists the nodes
/// that sync wrote and names the log durable before it
/// (docs/LOG-FLUSH.md). A birch that does not know it must refuse the
/// image: it would replay the log without validating it. Only a
/// superblock that points at such a log has it; a commit clears it.
pub const INCOMPAT_LOG_MANIFEST: u64 = 4;

/// Incompat flag: the image may have subvolumes and snapshots
/// (docs/SNAPSHOTS.md (a)): every subvolume tree, 5 included, has the long
/// root item (`SubvolRootItem`), the root tree may hold ROOT_REF,
/// ROOT_BACKREF, orphan-root and default-subvolume items, and directories
/// may hold subvolume links. A birch that does not know it must refuse the
/// image: it would read tree 5's root item wrongly and ignore the other
/// subvolumes' trees (freeing their blocks as leaked). Set by the first
/// commit that creates a subvolume; never cleared.
pub const INCOMPAT_SUBVOLUMES: u64 = 8;

/// Incompat flag: file extents may be compressed (docs/COMPRESSION.md).
/// A birch that does not know it must refuse the image: it could not read
/// compressed extents. Set in memory when the first compressed extent is
/// published, so that the commit or log sync that makes the extent
/// durable writes it; never cleared.
pub const INCOMPAT_COMPRESSION: u64 = 16;

/// Every incompat flag this version knows.
const KNOWN_INCOMPAT: u64 = INCOMPAT_METADATA_DUP
    | INCOMPAT_DATA_CSUMS
    | INCOMPAT_LOG_MANIFEST
    | INCOMPAT_SUBVOLUMES
    | INCOMPAT_COMPRESSION;

/// Where the log manifest's fields start (bytes 128..256 hold them).
const LOG_MANIFEST_FIELDS_OFFSET: usize = 128;
/// Where the manifest's entries start.
const LOG_MANIFEST_ENTRIES_OFFSET: usize =
    BACKUP_ROOTS_OFFSET + BACKUP_ROOT_COUNT * BACKUP_ROOT_SIZE;
/// Bytes of one manifest entry: the node's bytenr and its checksum.
const LOG_MANIFEST_ENTRY_SIZE: usize = 12;
/// Most log nodes one one-flush log sync may write: what the superblock
/// has room to list.
pub const MAX_LOG_MANIFEST_NODES: usize =
    (SUPERBLOCK_SIZE - LOG_MANIFEST_ENTRIES_OFFSET) / LOG_MANIFEST_ENTRY_SIZE;

/// A log root as a superblock names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRootRef {
    pub bytenr: u64,
    pub level: u8,
    /// The log transaction that wrote it.
    pub log_generation: u64,
}

/// What a one-flush log sync adds to the superblock (docs/LOG-FLUSH.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogManifest {
    /// The log the superblock pointed at before this one (durable when
    /// this one was written); `None`: the last commit had no log.
    pub previous: Option<LogRootRef>,
    /// Every log node the sync wrote: (bytenr, the node's header
    /// checksum). Nodes of the log not listed were written by earlier,
    /// flushed syncs.
    pub nodes: Vec<(u64, u32)>,
}

/// How many copies of each tree node the device holds (docs/DUP.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetadataProfile {
    /// One copy (images made before DUP existed read as this).
    #[default]
    Single,
    /// Two copies: the node at `bytenr` (always below
    /// `FIRST_ALLOCATABLE_BYTE + mirror_offset`) is mirrored byte for byte
    /// at `bytenr + mirror_offset`.
    Dup { mirror_offset: u64 },
}

impl MetadataProfile {
    /// The DUP layout mkfs gives a filesystem of `total_bytes`: the
    /// allocatable space is cut in two halves; nodes live in the lower one,
    /// their mirrors at the same place in the upper one.
    pub fn dup_for(total_bytes: u64) -> MetadataProfile {
        let half = total_bytes.saturating_sub(FIRST_ALLOCATABLE_BYTE) / 2;
        MetadataProfile::Dup {
            mirror_offset: half / SECTOR_SIZE * SECTOR_SIZE,
        }
    }

    /// How far above a node its mirror lives (`None`: no mirror).
    pub fn mirror_offset(self) -> Option<u64> {
        match self {
            MetadataProfile::Single => None,
            MetadataProfile::Dup { mirror_offset } => Some(mirror_offset),
        }
    }

    /// Where the second copy of the node at `bytenr` lives. `None` also
    /// when `bytenr` comes from a damaged image and its mirror would lie
    /// past 2^64: no device holds such a node, and reading its primary
    /// copy fails as "outside the device", naming the pointer.
    pub fn mirror_of(self, bytenr: u64) -> Option<u64> {
        self.mirror_offset()
            .and_then(|offset| bytenr.checked_add(offset))
    }

    /// Device bytes one tree node takes.
    pub fn node_footprint(self) -> u64 {
        match self {
            MetadataProfile::Single => NODE_SIZE as u64,
            MetadataProfile::Dup { .. } => 2 * NODE_SIZE as u64,
        }
    }

    /// End of the range a node's own address may lie in (the start of the
    /// mirror half); `None`: anywhere.
    pub fn primary_end(self) -> Option<u64> {
        match self {
            MetadataProfile::Single => None,
            MetadataProfile::Dup { mirror_offset } => Some(FIRST_ALLOCATABLE_BYTE + mirror_offset),
        }
    }

    /// As `birch mkfs --metadata` and `birch dump super` spell it.
    pub fn name(self) -> &'static str {
        match self {
            MetadataProfile::Single => "single",
            MetadataProfile::Dup { .. } => "dup",
        }
    }
}

/// Transaction numbers (superblock generation, log generation) are below
/// this: no filesystem commits 2^63 times, and the engine adds to them.
pub const MAX_GENERATION: u64 = 1 << 63;

/// Transaction numbers count up from a superblock's (`generation + 1` is
/// the next one): a value no real filesystem reaches (2^63 commits) is
/// damage, refused before any arithmetic meets it.
fn check_generations(generation: u64, log_generation: u64) -> Result<(), SuperblockError> {
    for (name, value) in [
        ("generation", generation),
        ("log generation", log_generation),
    ] {
        if value >= MAX_GENERATION {
            return Err(SuperblockError::Unsupported(format!(
                "{name} {value} is not below 2^63"
            )));
        }
    }
    Ok(())
}

/// Where the backup-root array starts (bytes 120..256 are kept for other
/// fields).
pub const BACKUP_ROOTS_OFFSET: usize = 256;
/// Commits whose roots the superblock keeps (btrfs keeps 4 too).
pub const BACKUP_ROOT_COUNT: usize = 4;
/// Bytes of one backup-root slot.
pub const BACKUP_ROOT_SIZE: usize = 64;

/// The roots of one commit, enough to mount it without the newer ones
/// (docs/BACKUP-ROOTS.md). Layout (64 bytes):
///
/// ```text
/// 0  generation              u64  0 = empty slot
/// 8  root_tree_bytenr        u64
/// 16 extent_root_bytenr      u64
/// 24 extent_root_generation  u64
/// 32 fs_root_bytenr          u64
/// 40 fs_root_generation      u64
/// 48 bytes_used              u64
/// 56 root_tree_level         u8
/// 57 extent_root_level       u8
/// 58 fs_root_level           u8
/// 59 reserved                5 bytes
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupRoot {
    pub generation: u64,
    pub root_tree_bytenr: u64,
    pub root_tree_level: u8,
    pub extent_root: RootItem,
    pub fs_root: RootItem,
    pub bytes_used: u64,
}

impl BackupRoot {
    /// A slot no commit filled (images made before backup roots existed
    /// have only these).
    pub const EMPTY: BackupRoot = BackupRoot {
        generation: 0,
        root_tree_bytenr: 0,
        root_tree_level: 0,
        extent_root: RootItem {
            bytenr: 0,
            generation: 0,
            level: 0,
        },
        fs_root: RootItem {
            bytenr: 0,
            generation: 0,
            level: 0,
        },
        bytes_used: 0,
    };

    pub fn is_empty(&self) -> bool {
        self.generation == 0
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        put_u64(out, self.generation);
        put_u64(out, self.root_tree_bytenr);
        put_u64(out, self.extent_root.bytenr);
        put_u64(out, self.extent_root.generation);
        put_u64(out, self.fs_root.bytenr);
        put_u64(out, self.fs_root.generation);
        put_u64(out, self.bytes_used);
        out.extend_from_slice(&[
            self.root_tree_level,
            self.extent_root.level,
            self.fs_root.level,
        ]);
        out.extend_from_slice(&[0; 5]);
    }

    fn decode(bytes: &[u8]) -> Result<BackupRoot, SuperblockError> {
        let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let level = |at: usize| {
            Some(bytes[at])
                .filter(|&l| l <= super::node::MAX_LEVEL)
                .ok_or_else(|| {
                    SuperblockError::Unsupported(format!("backup root level {}", bytes[at]))
                })
        };
        Ok(BackupRoot {
            generation: field(0),
            root_tree_bytenr: field(8),
            extent_root: RootItem {
                bytenr: field(16),
                generation: field(24),
                level: level(57)?,
            },
            fs_root: RootItem {
                bytenr: field(32),
                generation: field(40),
                level: level(58)?,
            },
            bytes_used: field(48),
            root_tree_level: level(56)?,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub fsid: [u8; 16],
    pub generation: u64,
    pub root_tree_bytenr: u64,
    pub root_tree_level: u8,
    pub total_bytes: u64,
    pub bytes_used: u64,
    pub log_root_bytenr: u64,
    pub log_root_level: u8,
    pub log_generation: u64,
    /// The roots of the last commits, newest first; slot 0 is this
    /// superblock's own commit once written by a birch that keeps them.
    pub backup_roots: [BackupRoot; BACKUP_ROOT_COUNT],
    pub metadata_profile: MetadataProfile,
    /// `INCOMPAT_DATA_CSUMS`: data extents have checksums in the checksum
    /// tree.
    pub data_checksums: bool,
    /// `INCOMPAT_LOG_MANIFEST`: the log was written with one flush; the
    /// mount validates it and may fall back to the previous log.
    pub log_manifest: Option<LogManifest>,
    /// `INCOMPAT_SUBVOLUMES`: subvolume items may exist (docs/SNAPSHOTS.md).
    pub subvolumes: bool,
    /// `INCOMPAT_COMPRESSION`: file extents may be compressed
    /// (docs/COMPRESSION.md).
    pub compression: bool,
}

impl Superblock {
    /// The log root this superblock points at, if any.
    pub fn log_root(&self) -> Option<LogRootRef> {
        (self.log_root_bytenr != 0).then_some(LogRootRef {
            bytenr: self.log_root_bytenr,
            level: self.log_root_level,
            log_generation: self.log_generation,
        })
    }

    /// This superblock pointing at `log` (none: no log), with no manifest.
    pub fn with_log(&self, log: Option<LogRootRef>) -> Superblock {
        let log = log.unwrap_or(LogRootRef {
            bytenr: 0,
            level: 0,
            log_generation: 0,
        });
        Superblock {
            log_root_bytenr: log.bytenr,
            log_root_level: log.level,
            log_generation: log.log_generation,
            log_manifest: None,
            ..self.clone()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuperblockError {
    BadMagic,
    BadChecksum { stored: u32, computed: u32 },
    WrongBytenr { found: u64 },
    Unsupported(String),
}

impl fmt::Display for SuperblockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SuperblockError::BadMagic => write!(f, "no birch magic (not a birch filesystem)"),
            SuperblockError::BadChecksum { stored, computed } => write!(
                f,
                "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ),
            SuperblockError::WrongBytenr { found } => {
                write!(f, "superblock copy claims to live at {found}")
            }
            SuperblockError::Unsupported(what) => write!(f, "unsupported: {what}"),
        }
    }
}

impl Superblock {
    pub fn encode(&self, copy_bytenr: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(SUPERBLOCK_SIZE);
        put_u32(&mut out, 0);
        put_u32(&mut out, 0);
        put_u64(&mut out, SUPERBLOCK_MAGIC);
        put_u64(&mut out, copy_bytenr);
        out.extend_from_slice(&self.fsid);
        put_u64(&mut out, self.generation);
        put_u64(&mut out, self.root_tree_bytenr);
        put_u64(&mut out, u64::from(self.root_tree_level));
        put_u64(&mut out, self.total_bytes);
        put_u64(&mut out, self.bytes_used);
        put_u32(&mut out, SECTOR_SIZE as u32);
        put_u32(&mut out, NODE_SIZE as u32);
        put_u64(&mut out, self.log_root_bytenr);
        put_u64(&mut out, u64::from(self.log_root_level));
        put_u64(&mut out, self.log_generation);
        let flags = if self.data_checksums {
            INCOMPAT_DATA_CSUMS
        } else {
            0
        } | if self.log_manifest.is_some() {
            INCOMPAT_LOG_MANIFEST
        } else {
            0
        } | if self.subvolumes {
            INCOMPAT_SUBVOLUMES
        } else {
            0
        } | if self.compression {
            INCOMPAT_COMPRESSION
        } else {
            0
        };
        match self.metadata_profile {
            MetadataProfile::Single => {
                put_u64(&mut out, flags);
                put_u64(&mut out, 0);
            }
            MetadataProfile::Dup { mirror_offset } => {
                put_u64(&mut out, INCOMPAT_METADATA_DUP | flags);
                put_u64(&mut out, mirror_offset);
            }
        }
        if let Some(manifest) = &self.log_manifest {
            assert!(
                !manifest.nodes.is_empty() && manifest.nodes.len() <= MAX_LOG_MANIFEST_NODES,
                "log manifest of {} nodes",
                manifest.nodes.len()
            );
            let previous = manifest.previous.unwrap_or(LogRootRef {
                bytenr: 0,
                level: 0,
                log_generation: 0,
            });
            put_u64(&mut out, previous.bytenr);
            put_u64(&mut out, u64::from(previous.level));
            put_u64(&mut out, previous.log_generation);
            put_u32(&mut out, manifest.nodes.len() as u32);
        }
        out.resize(BACKUP_ROOTS_OFFSET, 0);
        for backup in &self.backup_roots {
            backup.encode_into(&mut out);
        }
        for &(bytenr, csum) in self.log_manifest.iter().flat_map(|m| &m.nodes) {
            put_u64(&mut out, bytenr);
            put_u32(&mut out, csum);
        }
        out.resize(SUPERBLOCK_SIZE, 0);
        let csum = crc32c::crc32c(&out[4..]);
        out[0..4].copy_from_slice(&csum.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8], copy_bytenr: u64) -> Result<Superblock, SuperblockError> {
        assert_eq!(bytes.len(), SUPERBLOCK_SIZE);
        let field = |range: std::ops::Range<usize>| {
            u64::from_le_bytes(bytes[range].try_into().expect("8 bytes"))
        };
        if field(8..16) != SUPERBLOCK_MAGIC {
            return Err(SuperblockError::BadMagic);
        }
        let stored = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        let computed = crc32c::crc32c(&bytes[4..]);
        if stored != computed {
            return Err(SuperblockError::BadChecksum { stored, computed });
        }
        let mut r = Reader::new(&bytes[16..]);
        let short = |e: super::bytes::ShortRead| SuperblockError::Unsupported(e.to_string());
        let found = r.u64().map_err(short)?;
        if found != copy_bytenr {
            return Err(SuperblockError::WrongBytenr { found });
        }
        let fsid: [u8; 16] = r.take(16).map_err(short)?.try_into().expect("16 bytes");
        let generation = r.u64().map_err(short)?;
        let root_tree_bytenr = r.u64().map_err(short)?;
        let root_tree_level = r.u64().map_err(short)?;
        let total_bytes = r.u64().map_err(short)?;
        let bytes_used = r.u64().map_err(short)?;
        let sector_size = r.u32().map_err(short)?;
        let node_size = r.u32().map_err(short)?;
        let log_root_bytenr = r.u64().map_err(short)?;
        let log_root_level = r.u64().map_err(short)?;
        let log_generation = r.u64().map_err(short)?;
        let incompat = r.u64().map_err(short)?;
        let mirror_offset = r.u64().map_err(short)?;
        if u64::from(sector_size) != SECTOR_SIZE || node_size as usize != NODE_SIZE {
            return Err(SuperblockError::Unsupported(format!(
                "sector size {sector_size} / node size {node_size}"
            )));
        }
        check_generations(generation, log_generation)?;
        if incompat & !KNOWN_INCOMPAT != 0 {
            return Err(SuperblockError::Unsupported(format!(
                "incompat flags {incompat:#x}"
            )));
        }
        let metadata_profile = if incompat & INCOMPAT_METADATA_DUP != 0 {
            let fits = FIRST_ALLOCATABLE_BYTE
                .checked_add(mirror_offset.saturating_mul(2))
                .is_some_and(|end| end <= total_bytes);
            if mirror_offset < NODE_SIZE as u64
                || !mirror_offset.is_multiple_of(SECTOR_SIZE)
                || !fits
            {
                return Err(SuperblockError::Unsupported(format!(
                    "DUP metadata mirror offset {mirror_offset} (must be a sector multiple of at least one node, and both halves must fit in {total_bytes} bytes)"
                )));
            }
            MetadataProfile::Dup { mirror_offset }
        } else if mirror_offset != 0 {
            return Err(SuperblockError::Unsupported(format!(
                "metadata mirror offset {mirror_offset} without the DUP incompat flag"
            )));
        } else {
            MetadataProfile::Single
        };
        let level = |v: u64| {
            u8::try_from(v)
                .ok()
                .filter(|&l| l <= super::node::MAX_LEVEL)
        };
        let root_tree_level = level(root_tree_level).ok_or_else(|| {
            SuperblockError::Unsupported(format!("root tree level {root_tree_level}"))
        })?;
        let log_root_level = level(log_root_level).ok_or_else(|| {
            SuperblockError::Unsupported(format!("log root level {log_root_level}"))
        })?;
        let mut backup_roots = [BackupRoot::EMPTY; BACKUP_ROOT_COUNT];
        for (i, slot) in backup_roots.iter_mut().enumerate() {
            let at = BACKUP_ROOTS_OFFSET + i * BACKUP_ROOT_SIZE;
            *slot = BackupRoot::decode(&bytes[at..at + BACKUP_ROOT_SIZE])?;
        }
        let log_manifest = (incompat & INCOMPAT_LOG_MANIFEST != 0)
            .then(|| decode_log_manifest(bytes, log_root_bytenr))
            .transpose()?;
        Ok(Superblock {
            fsid,
            generation,
            root_tree_bytenr,
            root_tree_level,
            total_bytes,
            bytes_used,
            log_root_bytenr,
            log_root_level,
            log_generation,
            backup_roots,
            metadata_profile,
            data_checksums: incompat & INCOMPAT_DATA_CSUMS != 0,
            log_manifest,
            subvolumes: incompat & INCOMPAT_SUBVOLUMES != 0,
            compression: incompat & INCOMPAT_COMPRESSION != 0,
        })
    }

    /// The filled backup slots of commits older than this superblock's,
    /// newest first: what a rescue mount may fall back to.
    pub fn older_backup_roots(&self) -> impl Iterator<Item = &BackupRoot> + '_ {
        self.backup_roots
            .iter()
            .filter(move |b| !b.is_empty() && b.generation < self.generation)
    }
}

/// The manifest fields and entries of a superblock with
/// `INCOMPAT_LOG_MANIFEST` (whose log root is at `log_root_bytenr`).
fn decode_log_manifest(bytes: &[u8], log_root_bytenr: u64) -> Result<LogManifest, SuperblockError> {
    if log_root_bytenr == 0 {
        return Err(SuperblockError::Unsupported(
            "a log manifest without a log root".into(),
        ));
    }
    let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let at = LOG_MANIFEST_FIELDS_OFFSET;
    let previous_level = field(at + 8);
    let count = u32::from_le_bytes(bytes[at + 24..at + 28].try_into().expect("4 bytes")) as usize;
    if count == 0 || count > MAX_LOG_MANIFEST_NODES {
        return Err(SuperblockError::Unsupported(format!(
            "log manifest of {count} nodes (1..={MAX_LOG_MANIFEST_NODES})"
        )));
    }
    let previous_level = u8::try_from(previous_level)
        .ok()
        .filter(|&l| l <= super::node::MAX_LEVEL)
        .ok_or_else(|| {
            SuperblockError::Unsupported(format!("previous log root level {previous_level}"))
        })?;
    let previous = Some(LogRootRef {
        bytenr: field(at),
        level: previous_level,
        log_generation: field(at + 16),
    })
    .filter(|p| p.bytenr != 0);
    let nodes = (0..count)
        .map(|i| {
            let at = LOG_MANIFEST_ENTRIES_OFFSET + i * LOG_MANIFEST_ENTRY_SIZE;
            let csum = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().expect("4 bytes"));
            (field(at), csum)
        })
        .collect();
    Ok(LogManifest { previous, nodes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trips_and_rejects_damage() {
        let sb = Superblock {
            fsid: [3; 16],
            generation: 9,
            root_tree_bytenr: 1 << 20,
            root_tree_level: 1,
            total_bytes: 1 << 30,
            bytes_used: 65536,
            log_root_bytenr: 0,
            log_root_level: 0,
            log_generation: 0,
            backup_roots: [
                BackupRoot {
                    generation: 9,
                    root_tree_bytenr: 1 << 20,
                    root_tree_level: 1,
                    extent_root: RootItem {
                        bytenr: 2 << 20,
                        generation: 8,
                        level: 2,
                    },
                    fs_root: RootItem {
                        bytenr: 3 << 20,
                        generation: 9,
                        level: 3,
                    },
                    bytes_used: 65536,
                },
                BackupRoot::EMPTY,
                BackupRoot::EMPTY,
                BackupRoot::EMPTY,
            ],
            metadata_profile: MetadataProfile::Single,
            data_checksums: false,
            log_manifest: None,
            subvolumes: false,
            compression: false,
        };
        let bytes = sb.encode(65536);
        assert!(bytes[120..BACKUP_ROOTS_OFFSET].iter().all(|&b| b == 0));
        assert_eq!(Superblock::decode(&bytes, 65536).unwrap(), sb);
        assert_eq!(
            Superblock::decode(&bytes, 262144),
            Err(SuperblockError::WrongBytenr { found: 65536 })
        );
        let mut bad = bytes.clone();
        bad[200] = 1;
        assert!(matches!(
            Superblock::decode(&bad, 65536),
            Err(SuperblockError::BadChecksum { .. })
        ));
        assert_eq!(
            Superblock::decode(&[0; SUPERBLOCK_SIZE], 65536),
            Err(SuperblockError::BadMagic)
        );
        let dup = Superblock {
            metadata_profile: MetadataProfile::dup_for(1 << 30),
            ..sb.clone()
        };
        let bytes = dup.encode(65536);
        assert_eq!(bytes[112], INCOMPAT_METADATA_DUP as u8);
        assert_eq!(Superblock::decode(&bytes, 65536).unwrap(), dup);
        let csums = Superblock {
            data_checksums: true,
            ..dup
        };
        let bytes = csums.encode(65536);
        assert_eq!(
            bytes[112],
            (INCOMPAT_METADATA_DUP | INCOMPAT_DATA_CSUMS) as u8
        );
        assert_eq!(Superblock::decode(&bytes, 65536).unwrap(), csums);
        let single_csums = Superblock {
            data_checksums: true,
            ..sb
        };
        let bytes = single_csums.encode(65536);
        assert_eq!(Superblock::decode(&bytes, 65536).unwrap(), single_csums);
    }

    #[test]
    fn log_manifest_round_trips_and_sets_its_incompat_bit() {
        let plain = Superblock::decode(&sample().encode(65536), 65536).unwrap();
        let full: Vec<(u64, u32)> = (0..MAX_LOG_MANIFEST_NODES as u64)
            .map(|i| ((1 << 20) + i * NODE_SIZE as u64, i as u32 ^ 0xdead_beef))
            .collect();
        for (previous, nodes) in [
            (None, vec![(1 << 20, 7)]),
            (
                Some(LogRootRef {
                    bytenr: 5 << 20,
                    level: 1,
                    log_generation: 3,
                }),
                full,
            ),
        ] {
            let sb = Superblock {
                log_root_bytenr: 4 << 20,
                log_root_level: 0,
                log_generation: 4,
                log_manifest: Some(LogManifest { previous, nodes }),
                ..plain.clone()
            };
            let bytes = sb.encode(65536);
            assert_eq!(
                bytes[112],
                (INCOMPAT_LOG_MANIFEST | INCOMPAT_DATA_CSUMS) as u8
            );
            assert_eq!(Superblock::decode(&bytes, 65536).unwrap(), sb);
            // Without its log it is no manifest: the superblock is refused.
            let mut orphan = bytes.clone();
            orphan[88..96].fill(0);
            let csum = crc32c::crc32c(&orphan[4..]);
            orphan[0..4].copy_from_slice(&csum.to_le_bytes());
            assert!(matches!(
                Superblock::decode(&orphan, 65536),
                Err(SuperblockError::Unsupported(_))
            ));
        }
        // A superblock without the bit (as every birch before it wrote)
        // decodes with no manifest, whatever its reserved bytes.
        assert_eq!(plain.log_manifest, None);
        assert_eq!(plain.encode(65536)[112] & INCOMPAT_LOG_MANIFEST as u8, 0);
    }

    fn sample() -> Superblock {
        Superblock {
            fsid: [3; 16],
            generation: 9,
            root_tree_bytenr: 1 << 20,
            root_tree_level: 1,
            total_bytes: 1 << 30,
            bytes_used: 65536,
            log_root_bytenr: 0,
            log_root_level: 0,
            log_generation: 0,
            backup_roots: [BackupRoot::EMPTY; BACKUP_ROOT_COUNT],
            metadata_profile: MetadataProfile::Single,
            data_checksums: true,
            log_manifest: None,
            subvolumes: false,
            compression: false,
        }
    }

    #[test]
    fn subvolumes_bit_round_trips() {
        let plain = sample();
        assert_eq!(plain.encode(65536)[112] & INCOMPAT_SUBVOLUMES as u8, 0);
        let sb = Superblock {
            subvolumes: true,
            ..plain
        };
        let bytes = sb.encode(65536);
        assert_eq!(
            bytes[112],
            (INCOMPAT_SUBVOLUMES | INCOMPAT_DATA_CSUMS) as u8
        );
        assert_eq!(Superblock::decode(&bytes, 65536).unwrap(), sb);
        let compressed = Superblock {
            compression: true,
            ..sb.clone()
        };
        let bytes_c = compressed.encode(65536);
        assert_eq!(bytes_c[112] & INCOMPAT_COMPRESSION as u8, 16);
        assert_eq!(Superblock::decode(&bytes_c, 65536).unwrap(), compressed);
        // The next bit is still unknown: refused, named.
        let mut unknown = bytes.clone();
        unknown[112] |= 32;
        let csum = crc32c::crc32c(&unknown[4..]);
        unknown[0..4].copy_from_slice(&csum.to_le_bytes());
        assert!(matches!(
            Superblock::decode(&unknown, 65536),
            Err(SuperblockError::Unsupported(m)) if m.contains("incompat")
        ));
    }
}
