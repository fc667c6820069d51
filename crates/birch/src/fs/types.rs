//! Public value types of the filesystem API.

use crate::format::{FileType, InodeItem, Timespec, SECTOR_SIZE};
use std::time::Duration;

/// Attributes of one inode, as `stat` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// 512-byte blocks in use.
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    pub file_type: FileType,
    /// Permission bits (no file type bits).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    /// Inode generation: with `ino`, unique for the life of the filesystem.
    pub generation: u64,
}

impl Attr {
    pub(crate) fn from_item(ino: u64, item: &InodeItem, extra_bytes: u64) -> Attr {
        Attr {
            ino,
            size: item.size,
            blocks: (item.nbytes + extra_bytes).div_ceil(512),
            atime: item.atime,
            mtime: item.mtime,
            ctime: item.ctime,
            crtime: item.otime,
            file_type: item.file_type(),
            perm: (item.mode & 0o7777) as u16,
            nlink: item.nlink,
            uid: item.uid,
            gid: item.gid,
            rdev: item.rdev as u32,
            blksize: SECTOR_SIZE as u32,
            generation: item.generation,
        }
    }
}

/// A time to set: a given instant, or "now".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(Timespec),
}

/// The attributes `setattr` changes; `None` leaves one alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (and suid/sgid/sticky); the file type is kept.
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<Timespec>,
}

/// One directory entry as `readdir` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirListEntry {
    pub ino: u64,
    /// Pass this as `offset` to continue after this entry. Stable: it is
    /// the entry's dir index, which never changes while the entry exists.
    pub next_offset: u64,
    pub file_type: FileType,
    pub name: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// `renameat2` flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// RENAME_NOREPLACE: fail with EEXIST if the target exists.
    pub no_replace: bool,
    /// RENAME_EXCHANGE: atomically swap the two names.
    pub exchange: bool,
    /// RENAME_WHITEOUT: in the same change, the source's name is given to
    /// a new whiteout (a character device 0:0, mode 0) owned by this
    /// owner, as the kernel's `vfs_whiteout` and btrfs's rename make it
    /// (docs/FUSE.md "Whiteouts and overlayfs").
    pub whiteout: Option<WhiteoutOwner>,
}

/// Who owns the whiteout a RENAME_WHITEOUT leaves: the caller's fsuid, and
/// its fsgid or the directory's group where the directory is set-group-ID
/// (the kernel's `inode_init_owner`; the FUSE adapter works them out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WhiteoutOwner {
    pub uid: u32,
    pub gid: u32,
}

/// `setxattr` flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum XattrSetMode {
    #[default]
    CreateOrReplace,
    /// XATTR_CREATE: fail with EEXIST if it exists.
    Create,
    /// XATTR_REPLACE: fail with ENODATA if it does not exist.
    Replace,
}

/// How many copies of each tree node `mkfs` makes (docs/DUP.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MetadataCopies {
    /// One copy: a damaged node is lost.
    Single,
    /// Two copies far apart on the device; reads repair a bad one.
    #[default]
    Dup,
}

#[derive(Debug, Clone, Default)]
pub struct MkfsOptions {
    /// Filesystem id; random when `None`.
    pub fsid: Option<[u8; 16]>,
    /// Owner and group of the root directory (`birch mkfs` gives it to
    /// whoever runs it, so a user can write into an image they made).
    pub root_owner: (u32, u32),
    pub metadata: MetadataCopies,
    pub data_checksums: DataChecksums,
}

/// Whether `mkfs` gives data extents checksums (docs/DATA-CHECKSUMS.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DataChecksums {
    /// A crc32c per 4 KiB block, verified by every read.
    #[default]
    On,
    /// No checksum tree: data is read unverified (as images made before
    /// data checksums).
    Off,
}

#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Commit at least this often while there are changes; `None` disables
    /// the background worker (commits then happen only on sync, fsync,
    /// space reclaim and close — what deterministic tests want).
    pub commit_interval: Option<Duration>,
    /// Clean nodes kept in memory (16 KiB each on disk, somewhat more
    /// decoded) while the filesystem is in use.
    pub cache_nodes: usize,
    /// Clean nodes kept once [`Filesystem::release_memory`](super::Filesystem::release_memory)
    /// runs (the mount calls it when idle: docs/MEMORY.md).
    pub idle_cache_nodes: usize,
    /// Dirty file data held in memory. Above half of it the flusher writes
    /// back the oldest dirty pages; a writer that finds more than all of it
    /// waits for the flusher (or, without one, writes back itself) — it
    /// never forces a commit (docs/DELALLOC.md).
    pub dirty_limit_bytes: u64,
    /// Delayed dir-index items and inode updates held before the
    /// background worker flushes them into the tree.
    pub delayed_items_limit: usize,
    /// Run the background flusher thread (writeback under memory pressure,
    /// space reclaim for writers waiting on tickets). Without it a waiting
    /// writer reclaims space itself.
    pub background_flusher: bool,
    /// Refuse every change (EROFS) and never write to the device.
    pub read_only: bool,
    /// When a read (or a directory listing) updates the access time. FUSE
    /// leaves atime to the server: reads the kernel serves from its page
    /// cache never reach birch, and the kernel's own `noatime`/`relatime`
    /// flags are not sent with a read, so the mount passes its choice here.
    pub atime: AtimeUpdates,
    /// What to do when the newest commit's trees cannot be read.
    pub rescue: Rescue,
    /// Nodes of a deleted subvolume the cleaner releases per transaction
    /// before it commits (docs/SNAPSHOTS.md (d),
    /// `DROP_NODES_PER_TRANSACTION`): bounds each commit's delayed refs.
    /// Tests lower it to see a drop span several commits.
    pub cleaner_nodes_per_transaction: usize,
    /// Benchmark-only switches, each restoring the behaviour one seed
    /// removed (docs/ABLATION.md). All off by default; never for a
    /// filesystem anyone relies on for speed.
    pub ablation: Ablation,
    /// `compress=` / `compress-force=`: how writeback compresses file
    /// data (docs/COMPRESSION.md). Off by default, as in btrfs.
    pub compress: CompressOption,
}

/// Which seeds' mechanisms are switched off, each replaced by the
/// behaviour its change log removed (docs/ABLATION.md). A switch is a
/// branch on a bool on the path it changes: off, it costs nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ablation {
    /// Seed 000 off: a link or rename that changes a logged inode's names
    /// syncs the log before it returns (a commit if the sync fails).
    pub sync_log_on_new_name: bool,
    /// Seed 001 off: a full-sync fsync of a file first writes its delayed
    /// inode item into the fs tree.
    pub flush_delayed_inode_on_full_log: bool,
    /// Seed 002 off: an fsync waits for the whole commit in flight (its
    /// superblock written) before it logs anything.
    pub log_waits_for_commit: bool,
    /// Seed 003 off: a directory's fsync flushes its delayed dir-index
    /// items into the fs tree, then logs its entries from the tree.
    pub flush_delayed_dir_on_log: bool,
    /// Seed 004 off: space reclaim writes back whole inodes, as many as it
    /// would have written pages, instead of about as many pages as it
    /// needs.
    pub reclaim_whole_inodes: bool,
}

impl Ablation {
    /// The seed ids a switch exists for, in order.
    pub const SEEDS: [&'static str; 5] = ["000", "001", "002", "003", "004"];

    /// Every switch on.
    pub fn all() -> Ablation {
        Ablation {
            sync_log_on_new_name: true,
            flush_delayed_inode_on_full_log: true,
            log_waits_for_commit: true,
            flush_delayed_dir_on_log: true,
            reclaim_whole_inodes: true,
        }
    }

    /// The switch of seed `id` ("000" to "004").
    fn switch(&mut self, id: &str) -> Option<&mut bool> {
        Some(match id {
            "000" => &mut self.sync_log_on_new_name,
            "001" => &mut self.flush_delayed_inode_on_full_log,
            "002" => &mut self.log_waits_for_commit,
            "003" => &mut self.flush_delayed_dir_on_log,
            "004" => &mut self.reclaim_whole_inodes,
            _ => return None,
        })
    }

    /// Turns on the switches a list of seed ids names (`000+003`; the
    /// mount option `ablate=`). An unknown id is refused, naming it and
    /// the ids there are.
    pub fn enable(&mut self, list: &str) -> std::result::Result<(), String> {
        for id in list.split('+') {
            match self.switch(id) {
                Some(on) => *on = true,
                None => {
                    return Err(format!(
                        "unknown seed id '{id}' (switches exist for {})",
                        Self::SEEDS.join(", ")
                    ))
                }
            }
        }
        Ok(())
    }

    /// The seed ids switched on, in order.
    pub fn seeds(&self) -> Vec<&'static str> {
        let mut copy = *self;
        Self::SEEDS
            .into_iter()
            .filter(|id| copy.switch(id).is_some_and(|on| *on))
            .collect()
    }

    /// Whether any switch is on.
    pub fn any(&self) -> bool {
        *self != Ablation::default()
    }
}

/// The `compress=ALG[:LEVEL]|no` and `compress-force=...` mount options
/// (btrfs's names; lz4 stands in for btrfs's lzo).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompressOption {
    /// `None`: `compress=no`, data is stored as written.
    pub algorithm: Option<crate::format::Compression>,
    /// zstd's level (1..=15); 0 for lz4 and `no`.
    pub level: i32,
    /// `compress-force`: try every chunk, even of a file whose data did
    /// not shrink before (a chunk that does not shrink is still stored
    /// as it is).
    pub force: bool,
}

impl CompressOption {
    /// Parses the value of `compress=` (`force` false) or
    /// `compress-force=` (`force` true): `zstd`, `zstd:LEVEL` (1..=15),
    /// `lz4` or `no`. The error names what is wrong.
    pub fn parse(value: &str, force: bool) -> std::result::Result<CompressOption, String> {
        use crate::format::compression::{DEFAULT_ZSTD_LEVEL, MAX_ZSTD_LEVEL};
        use crate::format::Compression;
        let (name, level) = match value.split_once(':') {
            Some((name, level)) => (name, Some(level)),
            None => (value, None),
        };
        let option = match (name, level) {
            ("zstd", None) => CompressOption {
                algorithm: Some(Compression::Zstd),
                level: DEFAULT_ZSTD_LEVEL,
                force,
            },
            ("zstd", Some(level)) => CompressOption {
                algorithm: Some(Compression::Zstd),
                level: level
                    .parse()
                    .ok()
                    .filter(|l| (1..=MAX_ZSTD_LEVEL).contains(l))
                    .ok_or_else(|| format!("zstd level {level}: expected 1..={MAX_ZSTD_LEVEL}"))?,
                force,
            },
            ("lz4", None) => CompressOption {
                algorithm: Some(Compression::Lz4),
                level: 0,
                force,
            },
            ("no", None) => CompressOption::default(),
            _ => return Err(format!("{value}: expected zstd, zstd:LEVEL, lz4 or no")),
        };
        Ok(option)
    }
}

/// What a mount may do when the newest commit's trees cannot be read
/// (docs/BACKUP-ROOTS.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Rescue {
    /// Fail; the error says when older commits are recorded as backup roots.
    #[default]
    Off,
    /// `rescue=usebackuproot`: mount the newest older commit among the
    /// superblock's backup roots that loads. Read-only unless `writable`;
    /// a writable rollback is made durable by a commit at once (the newer
    /// commits' blocks are then free space and get reused).
    UseBackupRoot { writable: bool },
}

/// A mount that fell back to an older commit: what was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupRootUsed {
    /// The commit mounted.
    pub mounted_generation: u64,
    /// The newest commit on the device, which could not be loaded.
    pub newest_generation: u64,
    /// Commits whose changes are not in the mounted state: the newest and
    /// every recorded commit between it and the mounted one.
    pub commits_rolled_back: u64,
    /// Each newer commit that was tried, newest first, and why it failed.
    pub rejected: Vec<(u64, String)>,
}

impl std::fmt::Display for BackupRootUsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the newest commit (generation {}) could not be read; mounted the backup root of \
             generation {} instead: {} commit{} rolled back, and everything committed or \
             fsynced after generation {} is lost",
            self.newest_generation,
            self.mounted_generation,
            self.commits_rolled_back,
            if self.commits_rolled_back == 1 {
                ""
            } else {
                "s"
            },
            self.mounted_generation
        )?;
        for (generation, why) in &self.rejected {
            write!(f, "; generation {generation}: {why}")?;
        }
        Ok(())
    }
}

/// mount(8)'s access-time options, as the kernel defines them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AtimeUpdates {
    /// `noatime`: never.
    Never,
    /// `relatime`: when the atime is not newer than mtime or ctime, or is a
    /// day old.
    #[default]
    Relative,
    /// `strictatime`: at every access.
    Always,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            commit_interval: Some(Duration::from_secs(30)),
            cache_nodes: 16 * 1024,
            idle_cache_nodes: 1024,
            dirty_limit_bytes: 256 * 1024 * 1024,
            delayed_items_limit: 16 * 1024,
            background_flusher: true,
            read_only: false,
            atime: AtimeUpdates::Relative,
            rescue: Rescue::Off,
            cleaner_nodes_per_transaction: 4096,
            ablation: Ablation::default(),
            compress: CompressOption::default(),
        }
    }
}

impl MountOptions {
    /// No background threads: every commit and every writeback is caused by
    /// an API call.
    pub fn deterministic() -> Self {
        MountOptions {
            commit_interval: None,
            background_flusher: false,
            ..Default::default()
        }
    }
}

/// What the engine holds in memory now (docs/MEMORY.md). `birch stats`
/// shows each through its line in crates/birch-fuse/src/stats.rs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Clean nodes cached.
    pub node_cache_nodes: u64,
    /// The most the cache holds (`MountOptions::cache_nodes`).
    pub node_cache_limit: u64,
    /// What [`Filesystem::release_memory`](super::Filesystem::release_memory)
    /// shrinks it to (`MountOptions::idle_cache_nodes`).
    pub node_cache_idle: u64,
    /// Page buffers kept for the next writes.
    pub spare_pages: u64,
    /// Times `release_memory` ran.
    pub releases: u64,
}

/// Counters of work done since mount. `birch stats` shows each through its
/// line in crates/birch-fuse/src/stats.rs (a new field needs one there).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsStats {
    pub commits: u64,
    pub delayed_item_flushes: u64,
    pub delayed_items_flushed: u64,
    pub data_bytes_written: u64,
    pub nodes_written: u64,
    pub fsyncs: u64,
    /// DUP metadata (docs/DUP.md): node copies found bad by reads while
    /// the other copy was good; those rewritten from the good copy (not on
    /// a read-only mount); node reads that found no good copy.
    pub metadata_bad_copies: u64,
    pub metadata_repairs: u64,
    pub metadata_unrepairable: u64,
    /// Data blocks whose checksum did not match when read (each read
    /// failed with EIO; docs/DATA-CHECKSUMS.md).
    pub data_csum_errors: u64,
    /// Compression (docs/COMPRESSION.md): file bytes that went into
    /// compressed extents, the bytes those take on disk, chunks that were
    /// tried and did not shrink (written as they are), and runs of dirty
    /// pages written uncompressed because the reservations had no room for
    /// the extra extents their 128 KiB chunks would have made; and
    /// small files stored as compressed inline extents (whose bytes in
    /// and out the first two count too).
    pub compressed_bytes_in: u64,
    pub compressed_bytes_out: u64,
    pub compress_attempts_failed: u64,
    pub compress_fallback_runs: u64,
    pub compressed_inline_extents: u64,
    /// Scrubs of the mounted filesystem (`scrub::scrub_filesystem`): tree nodes
    /// scrubbed and bytes of data extents read, counted as they go, so
    /// that another thread can show a scrub's progress.
    pub scrub_nodes: u64,
    pub scrub_data_bytes: u64,
    /// Requests (`Filesystem` calls that take the state lock; a call made
    /// inside another is part of it) and the time they held the state
    /// lock, each request's holds summed: the mean hold per request
    /// bounds the request rate on any number of cores at 1 / mean.
    pub state_hold_requests: u64,
    pub state_hold_nanos: u64,
    /// Those requests by their hold: entry `i` counts holds in
    /// `[2^i, 2^(i+1))` ns (entry 0 also 0 ns, the last one everything
    /// longer).
    pub state_hold_histogram: [u64; STATE_HOLD_BUCKETS],
    /// Tree nodes read from the device on a cache miss, by whether the
    /// reading thread held the state lock (docs/SNAPSHOTS.md (f): the
    /// "node cache miss" exemption) or not (a read-only request's miss,
    /// read between two runs of it; a commit's, scrub's).
    pub node_reads_locked: u64,
    pub node_reads_unlocked: u64,
    /// Runs of read-only requests ended by a node cache miss (each read
    /// the node without the lock and ran again), and requests that missed
    /// so often they read the rest under the lock.
    pub read_reruns: u64,
    pub read_rerun_fallbacks: u64,
    /// Runs of changes' warm-ups ended by node cache misses (read without
    /// the state lock, then the warm-up ran again), and warm-ups that
    /// missed in 32 runs, after which the change ran with misses left
    /// (docs/SNAPSHOTS.md (f) item 3).
    pub warm_up_reruns: u64,
    pub warm_up_fallbacks: u64,
    /// Partial pages a change read from disk under the state lock (the
    /// "partial page read under a change" exemption: fallbacks after
    /// `PAGE_REREADS` stale prefetches, and pages whose read ahead failed,
    /// read again for the change to return the error).
    pub partial_page_reads_locked: u64,
    /// Partial pages of writes, truncates, reflinks' edges and punch
    /// hole's and zero range's edges read without the state lock before
    /// the change and used by it (docs/SNAPSHOTS.md (f) item 5); prefetches
    /// a change found stale (the page's extents changed, or a commit became
    /// durable, since they were planned: read again); and pages read under
    /// the lock after `PAGE_REREADS` stale prefetches (also counted in
    /// `partial_page_reads_locked`).
    pub partial_page_reads_unlocked: u64,
    pub partial_page_rereads: u64,
    pub partial_page_read_fallbacks: u64,
    /// Inline extents a reflink, collapse or insert range made regular:
    /// published as unwritten extents, which the next commit or log sync
    /// writes without the state lock (docs/DELALLOC.md, "An inline
    /// extent made regular").
    pub inline_reflink_unwritten: u64,
}

/// Entries of [`FsStats::state_hold_histogram`].
pub const STATE_HOLD_BUCKETS: usize = crate::lock_order::HOLD_BUCKETS;

/// Counters of delayed allocation and space reservation since mount
/// (docs/DELALLOC.md). `birch stats` shows each through its line in
/// crates/birch-fuse/src/stats.rs (a new field needs one there).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpaceStats {
    /// Times reclaim asked the writeback for a number of pages.
    pub reclaim_requests: u64,
    /// Pages written back by those requests, in total and the most one
    /// request wrote.
    pub reclaim_pages: u64,
    pub reclaim_pages_max: u64,
    /// Commits reclaim made (page writeback could not cover the shortfall).
    pub reclaim_commits: u64,
    /// Tickets failed with ENOSPC without a commit: a full reclaim cycle
    /// had found the filesystem full and not enough was freed since.
    pub enospc_without_commit: u64,
    /// Writers that had to queue a ticket, and what became of the tickets.
    pub tickets_queued: u64,
    pub tickets_granted: u64,
    pub tickets_failed: u64,
    /// Tickets served (granted or failed) before an older one: always 0.
    pub tickets_out_of_order: u64,
    /// Time tickets waited, in total and the worst, in microseconds.
    pub ticket_wait_total_us: u64,
    pub ticket_wait_max_us: u64,
    /// ENOSPC returned to callers.
    pub enospc: u64,
    /// Writes that found dirty memory over the limit and waited (or wrote
    /// back, without the flusher), and the worst such wait.
    pub throttled_writes: u64,
    pub throttle_wait_max_us: u64,
    /// Pages written back by the flusher to keep dirty memory down, by
    /// throttled writers themselves, by commits, by fsync, by `flush_range`.
    pub background_pages: u64,
    pub throttle_pages: u64,
    pub commit_pages: u64,
    pub fsync_pages: u64,
    pub range_pages: u64,
    /// Extents writebacks made beyond what the reservations had room for,
    /// even out of the global reserve (fragmented free space near full):
    /// their items were inserted unreserved. Expected 0.
    pub writeback_extents_unreserved: u64,
}

/// The space accounting right now, in bytes (docs/DELALLOC.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpaceUsage {
    pub total: u64,
    /// In the allocator's free map.
    pub free: u64,
    /// Freed but not reusable yet: pinned until the commit that freed it
    /// is durable, then held until the next one is (the previous commit,
    /// the newest backup root, still uses it).
    pub pinned: u64,
    /// Dirty page data (one page reserved per dirty page).
    pub dirty_data: u64,
    /// Metadata reserved for the extents dirty data will become.
    pub delalloc_metadata: u64,
    /// Worst-case metadata the running transaction may still copy.
    pub transaction_metadata: u64,
    /// Granted to waiting writers, not used yet.
    pub granted: u64,
    /// What the metadata reservations will leave allocated once committed
    /// (new items; statfs counts this instead of the worst cases above).
    pub settled_metadata: u64,
    pub global_reserve: u64,
    /// What an ordinary change may still reserve (negative: over-committed
    /// into the global reserve).
    pub available: i64,
    pub tickets_waiting: u64,
}

/// `fallocate` modes birch implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallocateMode {
    /// Mode 0: reserve space and grow the file to cover the range.
    Allocate,
    /// FALLOC_FL_KEEP_SIZE: reserve space, leave the size alone.
    AllocateKeepSize,
    /// FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE: drop the range's data.
    PunchHole,
    /// FALLOC_FL_ZERO_RANGE: the range reads as zeros and is allocated;
    /// the file grows to cover it.
    ZeroRange,
    /// FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE.
    ZeroRangeKeepSize,
    /// FALLOC_FL_COLLAPSE_RANGE: remove the (block-aligned) range, moving
    /// the data after it down; the file shrinks by its length.
    CollapseRange,
    /// FALLOC_FL_INSERT_RANGE: insert a (block-aligned) hole, moving the
    /// data from the offset up; the file grows by its length.
    InsertRange,
}

impl FallocateMode {
    /// Whether the mode zeroes its range in place (punch hole, zero
    /// range): pages it covers in part keep the rest of their bytes.
    pub(crate) fn zeroes(self) -> bool {
        matches!(
            self,
            FallocateMode::PunchHole | FallocateMode::ZeroRange | FallocateMode::ZeroRangeKeepSize
        )
    }
}

/// Inode flags birch honours (`FS_IOC_GETFLAGS` / `FS_IOC_SETFLAGS`, the
/// `chattr` letters `a` and `i`); kept in the inode item's `flags`.
pub mod inode_flags {
    /// FS_SYNC_FL (`S`): every change of the inode is durable before the
    /// call returns; on a directory also every change of its entries
    /// (the VFS's IS_DIRSYNC counts both flags).
    pub const SYNC: u32 = 0x8;
    /// FS_COMPR_FL (`c`): writeback compresses the file's data (with the
    /// `compress=` algorithm, zstd when the mount has none), as btrfs's
    /// `chattr +c`; a directory passes it to every inode created in it
    /// (docs/COMPRESSION.md).
    pub const COMPR: u32 = 0x4;
    /// FS_NOCOMP_FL (`m`, btrfs's NOCOMPRESS): writeback never compresses
    /// the file, whatever `compress=`, `c` or the property say; only
    /// `compress-force` does. Set by `chattr +m`, by the property value
    /// `none`, and by writeback when a chunk of the file did not shrink
    /// (unless the file has a compression property); inherited like `c`
    /// (docs/COMPRESSION.md, "Choosing").
    pub const NOCOMP: u32 = 0x400;
    /// FS_IMMUTABLE_FL: no change at all (data, attributes, names, xattrs).
    pub const IMMUTABLE: u32 = 0x10;
    /// FS_APPEND_FL: data may only be appended; no other change.
    pub const APPEND: u32 = 0x20;
    /// FS_NODUMP_FL (`d`): for dump(8) to skip the file; birch only keeps
    /// it.
    pub const NODUMP: u32 = 0x40;
    /// FS_NOATIME_FL (`A`): reads and listings leave the atime alone.
    pub const NOATIME: u32 = 0x80;
    /// FS_DIRSYNC_FL (`D`): on a directory, every change of its entries
    /// (create, link, unlink, rename, mkdir, rmdir) is durable before the
    /// call returns.
    pub const DIRSYNC: u32 = 0x1_0000;
    /// Every flag birch honours; setting any other fails (EOPNOTSUPP), and
    /// `birch check` reports any other bit in an inode item.
    pub const SUPPORTED: u32 =
        SYNC | IMMUTABLE | APPEND | NODUMP | NOATIME | DIRSYNC | COMPR | NOCOMP;
}

/// `lseek` whence values that look at the file's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekWhence {
    Data,
    Hole,
}

/// What a replay did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReplayReport {
    pub inodes: u64,
    pub names_added: u64,
    pub names_removed: u64,
    pub extents: u64,
    pub inodes_deleted: u64,
    /// Logged names left out because their directory did not exist at
    /// replay. The logging side logs every new ancestor, so this should
    /// stay 0; it is counted to make a slip visible.
    pub names_without_parent: u64,
    /// The newest log's one-flush sync had not reached the disk whole (a
    /// crash before its flush): the log durable before it was replayed,
    /// or none if the last commit had none (docs/LOG-FLUSH.md).
    pub newest_log_incomplete: bool,
}

impl ReplayReport {
    /// Adds the counts of one subvolume's replay.
    pub(crate) fn add(&mut self, other: &ReplayReport) {
        self.inodes = self.inodes.saturating_add(other.inodes);
        self.names_added = self.names_added.saturating_add(other.names_added);
        self.names_removed = self.names_removed.saturating_add(other.names_removed);
        self.extents = self.extents.saturating_add(other.extents);
        self.inodes_deleted = self.inodes_deleted.saturating_add(other.inodes_deleted);
        self.names_without_parent = self
            .names_without_parent
            .saturating_add(other.names_without_parent);
    }
}

/// What a mount did with the log it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// The whole log was applied.
    Replayed(ReplayReport),
    /// Replay failed and none of the log was applied: the last commit was
    /// mounted. The text says why.
    Discarded(String),
}

/// External inode numbers, unique across subvolumes (docs/SNAPSHOTS.md
/// (a), "Inode numbers"): tree 5's inodes keep their numbers, subvolume
/// `id >= 256`'s inode `ino` is `id << 40 | ino`. One FUSE mount has one
/// st_dev, so this is what keeps `(st_dev, st_ino)` unique.
pub struct InoSpace;

impl InoSpace {
    /// Bits of an inode number inside its tree.
    const INO_BITS: u32 = 40;

    pub fn join(subvol: u64, ino: u64) -> u64 {
        if subvol == crate::format::tree_id::FS {
            ino
        } else {
            subvol << Self::INO_BITS | ino
        }
    }

    /// EXDEV unless `a` and `b` are in one subvolume: a rename or link
    /// cannot cross subvolumes.
    pub fn same_subvolume(a: u64, b: u64) -> crate::error::Result<()> {
        if Self::split(a).0 == Self::split(b).0 {
            Ok(())
        } else {
            Err(crate::error::Error::CrossDevice)
        }
    }

    /// `(subvolume id, inode number in its tree)`. The id may name no
    /// subvolume: `FsState::ctx` refuses it.
    pub fn split(ext: u64) -> (u64, u64) {
        match ext >> Self::INO_BITS {
            0 => (crate::format::tree_id::FS, ext),
            subvol => (subvol, ext & (crate::format::MAX_SUBVOL_INO - 1)),
        }
    }
}

/// One subvolume, as `list` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubvolInfo {
    pub id: u64,
    /// The subvolume whose directory holds its link (0 for tree 5).
    pub parent: u64,
    /// The directory (in `parent`'s tree) holding the link, and its name.
    pub dir: u64,
    pub name: Vec<u8>,
    pub readonly: bool,
    /// The generation of its tree's root node (btrfs-progs' `gen`).
    pub generation: u64,
    /// The long root item (uuids, transids, times); `None` for tree 5 on
    /// an image without subvolumes.
    pub item: Option<crate::format::SubvolRootItem>,
}
