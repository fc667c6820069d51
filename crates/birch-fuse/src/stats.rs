//! What `birch stats MOUNTPOINT` reports: the engine's counters, described
//! once in [`COUNTERS`], and the mount around them ([`StatsReport`]).
//!
//! The daemon puts a report together when the stats ioctl arrives and sends
//! it as lines of text ([`StatsReport::encode`]); the CLI reads it back
//! ([`StatsReport::decode`]) and lays it out for people or as JSON. The
//! table below is the one place a counter is described: its group, unit and
//! the README's two sentences about it all come from its line, and the
//! README's counter table is checked against it (a unit test).

use crate::FuseOptions;
use birch::device::BlockDevice;
use birch::fs::{AtimeUpdates, Filesystem, FsStats, LogStats, MemoryStats, SpaceStats, SpaceUsage};
use std::fmt::Write;
use std::time::Duration;

/// The sections `birch stats` shows the engine's counters in, in display
/// order ([`Group::ALL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Transactions,
    Fsync,
    FsyncFallbacks,
    Writeback,
    Reservations,
    SpaceNow,
    MetadataCopies,
    DataChecksums,
    Scrub,
    StateLock,
    StateLockIo,
    Memory,
}

impl Group {
    pub const ALL: [Group; 12] = [
        Group::Transactions,
        Group::Fsync,
        Group::FsyncFallbacks,
        Group::Writeback,
        Group::Reservations,
        Group::SpaceNow,
        Group::MetadataCopies,
        Group::DataChecksums,
        Group::Scrub,
        Group::StateLock,
        Group::StateLockIo,
        Group::Memory,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Group::Transactions => "transactions & commits",
            Group::Fsync => "fsync / tree log",
            Group::FsyncFallbacks => "fsync fallbacks to a commit, by reason",
            Group::Writeback => "writeback",
            Group::Reservations => "space reservations",
            Group::SpaceNow => "space now",
            Group::MetadataCopies => "metadata copies (DUP read repair)",
            Group::DataChecksums => "data checksums",
            Group::Scrub => "scrub (`birch scrub MOUNTPOINT`)",
            Group::StateLock => "state lock (time each request held it)",
            Group::StateLockIo => "device reads and the state lock",
            Group::Memory => "memory (the daemon's)",
        }
    }
}

/// What one unit of a counter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Count,
    Bytes,
    /// Pages of 4 KiB.
    Pages,
    Micros,
    Nanos,
}

/// How a counter's value relates to time, which decides whether a rate
/// since mount means anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// A sum since mount: shown with its rate.
    Total,
    /// The largest single value since mount.
    Peak,
    /// A gauge: the value right now.
    Now,
}

/// One engine counter as `birch stats` and the README present it.
#[derive(Debug, PartialEq, Eq)]
pub struct Counter {
    /// Its key in `birch stats --json` (snake_case, stable).
    pub name: &'static str,
    pub group: Group,
    pub unit: Unit,
    pub measure: Measure,
    /// What it counts.
    pub counts: &'static str,
    /// Why you would look at it.
    pub why: &'static str,
}

/// Builds [`COUNTERS`] and [`read_counters`] from one list, so the two
/// cannot disagree on order or membership.
macro_rules! counter_table {
    ($( $getter:ident -> $source:ident $prefix:literal $(shown apart: $($apart:ident),*)? {
        $( $field:ident: $group:ident $unit:ident $measure:ident, $counts:literal, $why:literal; )*
    } )*) => {
        /// Every engine counter `birch stats` shows, in display order
        /// within each group.
        pub const COUNTERS: &[Counter] = &[$($(Counter {
            name: concat!($prefix, stringify!($field)),
            group: Group::$group,
            unit: Unit::$unit,
            measure: Measure::$measure,
            counts: $counts,
            why: $why,
        },)*)*];

        /// The engine's counters now, in the order of [`COUNTERS`]. Each
        /// struct is taken apart without `..`, so a counter added to the
        /// engine without its line in the table does not compile. i128
        /// holds every u64 counter and the one signed gauge losslessly.
        fn read_counters<D: BlockDevice>(fs: &Filesystem<D>) -> Vec<i128> {
            let mut values = Vec::with_capacity(COUNTERS.len());
            $(
                // An error here (rustc says "pattern requires `..`" or
                // "does not mention field") is a counter without its line.
                let $source { $($field,)* $($($apart: _),*)? } = fs.$getter();
                values.extend([$(i128::from($field)),*]);
            )*
            values
        }
    };
}

// One line per counter: `field: Group Unit Measure, "what it counts", "why
// you would look at it";`. The JSON key is the prefix plus the field name.
counter_table! {
    stats -> FsStats "" shown apart: state_hold_histogram {
        commits: Transactions Count Total, "Transactions committed (a superblock written): periodic, by `birch sync`/syncfs, by space reclaim, or in place of an fsync the log could not answer.", "Each commit writes every changed tree path and the superblock; far more than uptime / commit interval means something is forcing them (see the fallbacks and `reclaim_commits`).";
        delayed_item_flushes: Transactions Count Total, "Passes that wrote the pending directory-index items and dirty inode items into the trees (at commit, or by the background worker, up to 1,024 items per pass, once `delayed_items_limit` are pending).", "Many more than `commits` means the delayed-item batching is cut short.";
        delayed_items_flushed: Transactions Count Total, "Items those passes wrote.", "Divided by `delayed_item_flushes`: how much each batch saved.";
        data_bytes_written: Transactions Bytes Total, "File data written to the device.", "The data rate the device sees; against what the workload wrote it shows write amplification.";
        nodes_written: Transactions Count Total, "Tree nodes written by commits.", "The metadata cost of commits; per commit, how much of the trees each one copies.";
        fsyncs: Fsync Count Total, "fsync and fsyncdir calls (and those a `sync` or `dirsync` mount makes for each change).", "The base the other fsync counters are shares of.";
        metadata_bad_copies: MetadataCopies Count Total, "Tree-node copies read that failed their checksum or checks (or the read failed) while the other copy was good.", "Non-zero: the device is damaging or losing writes; run `birch scrub` on the mount point (or the unmounted image) and look at the device (docs/DUP.md).";
        metadata_repairs: MetadataCopies Count Total, "Bad copies rewritten from the good one (not on a read-only mount).", "Below `metadata_bad_copies` on a read-only mount: the damage stays until a read-write mount or a scrub repairs it.";
        metadata_unrepairable: MetadataCopies Count Total, "Node reads that found no good copy (both bad, or a single-profile image).", "Non-zero: data behind those nodes is unreadable; the error names the block.";
        data_csum_errors: DataChecksums Count Total, "Data blocks read whose checksum did not match (or that had none): each such read failed with EIO, logged with inode, file offset and disk bytenr.", "Non-zero: the device returned damaged file data; `birch scrub` names every bad block by path (docs/DATA-CHECKSUMS.md).";
        compressed_bytes_in: Writeback Bytes Total, "File data written back into compressed extents (`compress=` / `compress-force=`), before compression; compressed inline extents included.", "Against `data_bytes_written`: how much of the written data compression took.";
        compressed_bytes_out: Writeback Bytes Total, "What those compressed extents take on disk (sector padded; a compressed inline extent its compressed bytes, in its tree leaf).", "Divided by `compressed_bytes_in`: the compression ratio the data gets (docs/COMPRESSION.md).";
        compress_attempts_failed: Writeback Count Total, "Chunks compression was tried on that did not save a sector: written as they are, and the file gets `m` (NOCOMP, kept in its inode): not tried again until `chattr -m` or a compression property (unless `compress-force`).", "High against the compressed extents: the data is incompressible; `compress=` costs CPU for nothing there.";
        compress_fallback_runs: Writeback Count Total, "Runs of dirty pages to compress that writeback wrote uncompressed, as one extent: their 128 KiB chunks would each have been an extent and the space reservations had no room for the extra ones (near full, or while writers wait for space).", "Non-zero only near full: what compression there would have saved stays on disk; a commit or freed space brings compression back (docs/COMPRESSION.md).";
        compressed_inline_extents: Writeback Count Total, "Small files (at most a page) written back as compressed inline extents: their data compressed into their tree leaf, fewer bytes than the data and at most 2048 (docs/COMPRESSION.md, \"Compressed inline extents\").", "Against the files written under compression: how many small files it kept out of data extents (a file of 2 to 4 KiB would otherwise take a 4 KiB block).";
        scrub_nodes: Scrub Count Total, "Tree nodes scrubbed on this mount (every copy of each read and verified), counted as a scrub goes.", "Rising: a scrub is running; `birch scrub MOUNTPOINT` shows it as progress. Commits wait for a scrub.";
        scrub_data_bytes: Scrub Bytes Total, "Bytes of data extents scrubbed on this mount (read and verified against their checksums), counted as a scrub goes.", "With `scrub_nodes`: how far a running scrub is; its rate is the scrub's read rate.";
        state_hold_requests: StateLock Count Total, "Engine requests that took the state lock (one per FUSE request the engine served; a request's holds are summed).", "The base of the hold histogram `birch stats` prints below the counters.";
        state_hold_nanos: StateLock Nanos Total, "Time those requests held the state lock, summed.", "Divided by `state_hold_requests`: the mean hold; 1 / mean hold is the most requests per second the engine can serve on any number of cores.";
        node_reads_locked: StateLockIo Count Total, "Tree nodes read from the device on a node cache miss while holding the state lock: misses of changes their warm-up did not read (evicted since, or not walked: reflink, fallocate, subvolume operations), of release/forget, and fallbacks.", "Every one stalls all requests for a device read; many against `node_reads_unlocked`: a node cache too small for the working set (`cache_nodes`).";
        node_reads_unlocked: StateLockIo Count Total, "Tree nodes read on a cache miss without the state lock: a read-only request's misses (read between two runs of it), a commit's, a scrub's.", "Cold-cache reads that no longer stall other requests.";
        read_reruns: StateLockIo Count Total, "Runs of read-only requests (lookup, getattr, readdir, read, xattrs) ended by a node cache miss: the node was read with the lock dropped and the request ran again.", "Divided by `node_reads_unlocked`: near 1; the lock time a rerun repeats is in the hold histogram.";
        read_rerun_fallbacks: StateLockIo Count Total, "Read-only requests that missed 32 times in a row and read the rest under the state lock.", "Non-zero: the node cache is smaller than one request's path or thrashes; raise `cache_nodes`.";
        warm_up_reruns: StateLockIo Count Total, "Runs of changes' warm-ups (a read-only walk of what a change will look up, run before it: create, mkdir, unlink, rmdir, rename, link, setattr, xattr set and remove, fsync's log, a writeback's publish, the commit's seal, delayed-item flushes) ended by node cache misses: the missed nodes were read without the state lock and the walk ran again.", "The cold-cache reads of changes (in `node_reads_unlocked`) no longer stall other requests; what changes still miss is in `node_reads_locked`.";
        warm_up_fallbacks: StateLockIo Count Total, "Changes whose warm-up missed in 32 runs in a row: the change ran and read what it still missed under the state lock.", "Non-zero: the node cache is smaller than one change's paths or thrashes; raise `cache_nodes`.";
        partial_page_reads_locked: StateLockIo Count Total, "Partial pages a change read from disk under the state lock: pages that changed under 4 reads ahead in a row (`partial_page_read_fallbacks`), and pages whose read ahead failed (read again for the change's error).", "Each stalls all requests for a data read; non-zero only when pages change under their reads or the device fails reads.";
        partial_page_reads_unlocked: StateLockIo Count Total, "Partial pages of changes (a write's first or last page not fully covered, a truncate's new last page, a reflink's unaligned edges, punch hole's and zero range's edges inside pages; not in memory) read from disk without the state lock before the change, and used by it.", "Reads that no longer stall other requests; against `partial_page_reads_locked`: how many partial pages are still read in place.";
        partial_page_rereads: StateLockIo Count Total, "Such pages read again: between the read and the change the page's extents changed (a writeback published it, a truncate or reflink replaced them) or a commit became durable.", "Divided by `partial_page_reads_unlocked`: near 0; high means writes race writeback or commits on the same pages.";
        partial_page_read_fallbacks: StateLockIo Count Total, "Partial pages read under the state lock after 4 reads in a row were stale (also counted in `partial_page_reads_locked`).", "Non-zero: a page changes faster than a write can read it.";
        inline_reflink_unwritten: StateLockIo Count Total, "Inline files a reflink (copy_file_range), collapse or insert range made a regular 4 KiB extent before sharing or moving their data: published unwritten, its bytes written by the next commit or log sync without the state lock.", "Rare: one per small file first reflinked; none of them stalls other requests (before, each was a write under the state lock).";
    }
    log_stats -> LogStats "" {
        logged_fsyncs: Fsync Count Total, "fsyncs that logged their inode: answered by a log sync instead of a commit.", "The fast path of fsync. An fsync of an inode logged and unchanged since is in neither this nor `noop_fsyncs`: it waits for that log.";
        noop_fsyncs: Fsync Count Total, "fsyncs of an inode unlinked, or unchanged since the last commit: nothing to write.", "Many: the workload fsyncs files that did not change.";
        full_logs: Fsync Count Total, "Files logged with all their extents: new in this transaction at their first log, or changed in a way a range log cannot express (extents dropped, inode reloaded from disk).", "Full logs copy every extent: many on large files make fsync slow.";
        fast_logs: Fsync Count Total, "Files logged with only the ranges written back since their last log.", "The cheap way to log a file; most logs of a file rewritten between fsyncs should be these.";
        dir_logs: Fsync Count Total, "Directories logged (their entries changed in this transaction).", "What directory fsyncs, and new names of fsynced files, cost.";
        log_syncs: Fsync Count Total, "Log syncs written: log nodes, then the superblock pointing to them (two device flushes).", "The device flushes fsync costs; below `logged_fsyncs` when concurrent fsyncs share a sync (group commit).";
        log_syncs_superseded: Fsync Count Total, "Log syncs whose base commit was overtaken by a newer commit: no superblock written.", "fsyncs racing commits; their work was done by the commit.";
        fallback_ancestor_chain: FsyncFallbacks Count Total, "fsyncs that committed because a chain of directories new in this transaction deeper than 64 had to be logged.", "Each fallback makes an fsync pay a full commit (docs/TREE-LOG.md, \"Fallbacks to a full commit\").";
        fallback_removed_directory: FsyncFallbacks Count Total, "fsyncs that committed because a committed directory was removed from a directory whose changes are logged.", "As above: rmdir and rename-over of directories during fsync-heavy work.";
        fallback_renamed_ancestor: FsyncFallbacks Count Total, "fsyncs that committed because a directory above the inode was renamed in this transaction.", "As above: directory renames during fsync-heavy work.";
        fallback_subvolume: FsyncFallbacks Count Total, "fsyncs that committed because a subvolume link was added or removed in this transaction, or the inode's subvolume was created after the log's base commit.", "A log never holds a subvolume link (docs/SNAPSHOTS.md (e)): fsyncs commit until the next commit.";
        name_conflict_logs: Fsync Count Total, "Inodes logged because a logged inode took a name they held at the last commit, or they took one it gave up.", "Extra log work from renames and name reuse (docs/TREE-LOG.md, \"Name conflicts\").";
        logging_nanos: Fsync Nanos Total, "Time spent logging inodes, the fsynced file's data writeback included.", "The CPU side of fsync's cost (seed 003's figure); per logged fsync, how long a log takes.";
        fsync_nanos: Fsync Nanos Total, "Time in the engine's fsync from entry to durable, waits for other syncs included.", "Divided by fsyncs: the engine's share of an fsync; the rest of what the caller sees is FUSE (docs/FUSE.md, \"Where an fsync's time goes\").";
        log_write_nanos: Fsync Nanos Total, "Log syncs: writing the sealed log's nodes (with one flush, and its superblocks: docs/LOG-FLUSH.md).", "Per log sync, the device's write latency for the log.";
        log_nodes_flush_nanos: Fsync Nanos Total, "Log syncs: the flush that makes data and log nodes (with one flush, the whole sync) durable.", "Per log sync, the device's flush latency.";
        log_base_wait_nanos: Fsync Nanos Total, "Log syncs: waiting for the commit the log is based on.", "Large: fsyncs queue behind a commit in flight (seed 002).";
        log_superblock_nanos: Fsync Nanos Total, "Log syncs written with two flushes (no data checksums, or more nodes than the superblock's manifest lists): the superblock write and its flush.", "Zero while every log sync takes one flush; else the second write + flush those need.";
    }
    space_stats -> SpaceStats "" {
        reclaim_requests: Reservations Count Total, "Times space reclaim asked the writeback for a number of pages.", "Non-zero: writers ran short of unreserved space and reclaim had to make room (docs/DELALLOC.md).";
        reclaim_pages: Reservations Pages Total, "Pages written back by reclaim requests.", "How much writeback space pressure caused.";
        reclaim_pages_max: Reservations Pages Peak, "Most pages one reclaim request wrote back.", "Large: writers waited behind a long writeback.";
        reclaim_commits: Reservations Count Total, "Commits reclaim made because page writeback could not cover the shortfall.", "Costly; frequent ones mean the filesystem is nearly full.";
        enospc_without_commit: Reservations Count Total, "Tickets failed with ENOSPC without a commit: a full reclaim cycle had found the filesystem full and too little was freed since.", "Each saved a commit that could not have helped.";
        tickets_queued: Reservations Count Total, "Writers that had to queue a ticket and wait for space.", "How often writers felt space pressure.";
        tickets_granted: Reservations Count Total, "Queued tickets that got their space.", "With `tickets_failed`: what became of the queued writers.";
        tickets_failed: Reservations Count Total, "Queued tickets that ended in ENOSPC.", "Writers that waited and still failed.";
        tickets_out_of_order: Reservations Count Total, "Tickets served (granted or failed) before an older one.", "Always 0: anything else is a fairness bug.";
        ticket_wait_total_us: Reservations Micros Total, "Time queued tickets waited, summed.", "The latency space pressure added to writes.";
        ticket_wait_max_us: Reservations Micros Peak, "Longest time one ticket waited.", "The worst write stall space pressure caused.";
        enospc: Reservations Count Total, "ENOSPC errors returned to callers.", "The filesystem is full, or its reservations estimate too much.";
        throttled_writes: Writeback Count Total, "Writes that found dirty memory over its limit and waited (or wrote back themselves, without the flusher).", "Write latency caused by the dirty-memory limit.";
        throttle_wait_max_us: Writeback Micros Peak, "Longest wait of a throttled write.", "The worst write stall the dirty-memory limit caused.";
        background_pages: Writeback Pages Total, "Pages written back by the flusher to keep dirty memory down.", "Writeback off the writers' path: the normal case.";
        throttle_pages: Writeback Pages Total, "Pages written back by throttled writers themselves.", "Writeback on the writers' path: the flusher is not keeping up.";
        commit_pages: Writeback Pages Total, "Pages written back by commits.", "Dirty data a commit had to write first: commits get slower with it.";
        fsync_pages: Writeback Pages Total, "Pages written back by fsync.", "Data fsync had to write itself.";
        range_pages: Writeback Pages Total, "Pages written back by range flushes (`Filesystem::flush_range`, like sync_file_range).", "Writeback asked for by a caller, a range at a time.";
        writeback_extents_unreserved: Reservations Count Total, "Extents writebacks made beyond the room the space reservations had, even out of the global reserve (free space so fragmented near full that runs became many extents): their items went in unreserved.", "Always 0 so far; non-zero means a commit may meet ENOSPC and turn the filesystem read-only (docs/DELALLOC.md).";
    }
    space_usage -> SpaceUsage "space_" {
        total: SpaceNow Bytes Now, "Size of the filesystem.", "The base for the other space figures.";
        free: SpaceNow Bytes Now, "Bytes in the allocator's free map.", "Free space before reservations.";
        pinned: SpaceNow Bytes Now, "Freed bytes held until the commit that freed them is durable.", "Space a commit would give back.";
        dirty_data: SpaceNow Bytes Now, "Dirty file data in memory, not yet written (a page reserved for each page).", "What the next commit or fsync has to write.";
        delalloc_metadata: SpaceNow Bytes Now, "Metadata reserved (worst case) for the extents the dirty data will become.", "Held until the data is written back; `df` counts `space_settled_metadata` instead.";
        transaction_metadata: SpaceNow Bytes Now, "Worst-case metadata the running transaction may still copy.", "Reserved until the commit; large after many small changes.";
        granted: SpaceNow Bytes Now, "Space granted to waiting writers, not used yet.", "Non-zero only under space pressure.";
        settled_metadata: SpaceNow Bytes Now, "What the metadata reservations will leave allocated once committed.", "What `df` counts instead of the worst cases above.";
        global_reserve: SpaceNow Bytes Now, "Kept back from ordinary reservations (1/32 of the size, 4 MiB to 512 MiB) so that a full filesystem can still be emptied and commit; urgent changes such as fsync's log may use it.", "Not free for `df`; `space_available` below zero means it is being used.";
        available: SpaceNow Bytes Now, "What an ordinary change may still reserve.", "Near zero, writers queue tickets and reclaim runs; negative: over-committed into the global reserve.";
        tickets_waiting: SpaceNow Count Now, "Writers waiting for space right now.", "Non-zero: writers are stalled on reclaim this moment.";
    }
    daemon_memory -> DaemonMemory "memory_" {
        rss: Memory Bytes Now, "The daemon's resident memory (VmRSS).", "What the mount costs the machine; it falls back toward its idle size once the mount has been idle for `memory_idle` (docs/MEMORY.md).";
        node_cache_nodes: Memory Count Now, "Clean tree nodes cached (16 KiB each on disk, somewhat more in memory).", "The largest share of the daemon's memory under load; at most `memory_node_cache_limit`, shrunk to `memory_node_cache_idle` when idle.";
        node_cache_limit: Memory Count Now, "The most nodes the cache holds (`-o node_cache=SIZE`).", "Raise it when metadata reads dominate, lower it to bound memory.";
        node_cache_idle: Memory Count Now, "Nodes the cache keeps when the mount is idle (`-o node_cache_idle=SIZE`).", "What the cache shrinks to once idle.";
        spare_pages: Memory Pages Now, "Page buffers kept for the next writes (at most 1024).", "Freed when idle.";
        releases: Memory Count Total, "Times the idle mount gave memory back (node cache shrunk, spare pages freed, malloc_trim).", "Zero on a busy mount; one per idle spell otherwise.";
    }
}

/// The engine's memory figures and the daemon's resident size, for
/// `birch stats` (the daemon's own process: this runs in it).
pub struct DaemonMemory {
    rss: u64,
    node_cache_nodes: u64,
    node_cache_limit: u64,
    node_cache_idle: u64,
    spare_pages: u64,
    releases: u64,
}

trait DaemonMemoryOf {
    fn daemon_memory(&self) -> DaemonMemory;
}

impl<D: BlockDevice> DaemonMemoryOf for Filesystem<D> {
    fn daemon_memory(&self) -> DaemonMemory {
        let MemoryStats {
            node_cache_nodes,
            node_cache_limit,
            node_cache_idle,
            spare_pages,
            releases,
        } = self.memory_stats();
        DaemonMemory {
            rss: resident_bytes().unwrap_or(0),
            node_cache_nodes,
            node_cache_limit,
            node_cache_idle,
            spare_pages,
            releases,
        }
    }
}

/// This process's resident set (VmRSS in /proc/self/status).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The image a mount serves, as its owner describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    pub path: String,
    /// Whether birch reads and writes it with O_DIRECT.
    pub direct_io: bool,
}

/// Everything `birch stats` shows about one mount.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsReport {
    /// Since the kernel's INIT (the mount went live).
    pub uptime: Duration,
    pub image: Option<ImageInfo>,
    /// The block device of a `fuseblk` mount; `None` for plain `fuse`.
    pub block_device: Option<String>,
    /// How requests arrive: "io_uring (N queues x M entries)" or
    /// "/dev/fuse (why not io_uring)" (docs/FUSE.md, "Transport").
    pub transport: String,
    /// Whether the engine is read-only now (it follows `remount,rw`).
    pub read_only: bool,
    /// Why the engine turned read-only, if a write or flush failed
    /// (docs/IO-ERRORS.md); `read_only` is then true as well.
    pub failure: Option<String>,
    /// The FUSE-side mount options, as `-o` would say them.
    pub options: String,
    /// The INIT capabilities really in force (asked for and offered by the
    /// kernel), without their `FUSE_` prefix.
    pub init_flags: Vec<String>,
    /// The last durable commit.
    pub generation: u64,
    pub counters: Vec<(&'static Counter, i128)>,
    /// FUSE requests received, by opcode name: every opcode (zeros too),
    /// in opcode order, then "other".
    pub requests: Vec<(String, u64)>,
    /// `FsStats::state_hold_histogram`: engine requests by the time they
    /// held the state lock, entry `i` for `[2^i, 2^(i+1))` ns.
    pub state_hold_histogram: Vec<u64>,
}

/// The line keys of the encoded report.
const UPTIME_US: &str = "uptime_us";
const IMAGE: &str = "image";
const IMAGE_DIRECT_IO: &str = "image_direct_io";
const BLOCK_DEVICE: &str = "block_device";
const TRANSPORT: &str = "transport";
const READ_ONLY: &str = "read_only";
const FAILURE: &str = "failure";
const OPTIONS: &str = "options";
const INIT_FLAGS: &str = "init_flags";
const GENERATION: &str = "generation";
const COUNTER: &str = "counter";
const REQUEST: &str = "request";
const STATE_HOLD_HISTOGRAM: &str = "state_hold_histogram";

impl StatsReport {
    /// The engine's side of the report; the caller fills in the mount's.
    pub(crate) fn of_engine<D: BlockDevice>(fs: &Filesystem<D>) -> StatsReport {
        StatsReport {
            uptime: Duration::ZERO,
            image: None,
            block_device: None,
            transport: String::new(),
            failure: fs.failure(),
            read_only: fs.is_read_only(),
            options: String::new(),
            init_flags: Vec::new(),
            generation: fs.generation(),
            counters: COUNTERS.iter().zip(read_counters(fs)).collect(),
            requests: Vec::new(),
            state_hold_histogram: fs.stats().state_hold_histogram.to_vec(),
        }
    }

    /// The mean time an engine request held the state lock, and the
    /// ceiling it implies: the request rate at which the lock would be
    /// held all the time, whatever the number of cores (1 / mean hold).
    /// `None` before the first request.
    pub fn state_hold_mean(&self) -> Option<(Duration, f64)> {
        let value = |name: &str| {
            self.counters
                .iter()
                .find(|(c, _)| c.name == name)
                .and_then(|(_, v)| u64::try_from(*v).ok())
        };
        let requests = value("state_hold_requests").filter(|&n| n > 0)?;
        let nanos = value("state_hold_nanos")?;
        let mean = nanos as f64 / requests as f64;
        let ceiling = if mean > 0.0 {
            1e9 / mean
        } else {
            f64::INFINITY
        };
        Some((Duration::from_nanos(nanos / requests), ceiling))
    }

    /// One `key value` line per fact. Values are single-line: a newline in
    /// a path is sent as `\n` (shown, not parsed).
    pub fn encode(&self) -> String {
        let one_line = |s: &str| s.replace('\n', "\\n");
        let mut out = String::new();
        let _ = writeln!(out, "{UPTIME_US} {}", self.uptime.as_micros());
        if let Some(image) = &self.image {
            let _ = writeln!(out, "{IMAGE} {}", one_line(&image.path));
            let _ = writeln!(out, "{IMAGE_DIRECT_IO} {}", u8::from(image.direct_io));
        }
        if let Some(device) = &self.block_device {
            let _ = writeln!(out, "{BLOCK_DEVICE} {}", one_line(device));
        }
        let _ = writeln!(out, "{TRANSPORT} {}", one_line(&self.transport));
        let _ = writeln!(out, "{READ_ONLY} {}", u8::from(self.read_only));
        if let Some(reason) = &self.failure {
            let _ = writeln!(out, "{FAILURE} {}", one_line(reason));
        }
        let _ = writeln!(out, "{OPTIONS} {}", one_line(&self.options));
        let _ = writeln!(out, "{INIT_FLAGS} {}", self.init_flags.join(" "));
        let _ = writeln!(out, "{GENERATION} {}", self.generation);
        for (counter, value) in &self.counters {
            let _ = writeln!(out, "{COUNTER} {} {value}", counter.name);
        }
        for (opcode, n) in &self.requests {
            let _ = writeln!(out, "{REQUEST} {opcode} {n}");
        }
        let histogram: Vec<String> = self
            .state_hold_histogram
            .iter()
            .map(u64::to_string)
            .collect();
        let _ = writeln!(out, "{STATE_HOLD_HISTOGRAM} {}", histogram.join(" "));
        out
    }

    /// Reads [`encode`](Self::encode)'s text. Counters this build does not
    /// know (a daemon from a newer birch) are left out.
    pub fn decode(text: &str) -> Result<StatsReport, String> {
        let number = |line: &str, s: &str| {
            s.parse::<i128>()
                .map_err(|_| format!("unreadable stats line: {line:?}"))
        };
        let mut report = StatsReport {
            uptime: Duration::ZERO,
            image: None,
            block_device: None,
            transport: String::new(),
            read_only: false,
            failure: None,
            options: String::new(),
            init_flags: Vec::new(),
            generation: 0,
            counters: Vec::new(),
            requests: Vec::new(),
            state_hold_histogram: Vec::new(),
        };
        let mut image_direct_io = false;
        for line in text.lines() {
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                UPTIME_US => {
                    let us = u64::try_from(number(line, value)?).unwrap_or(0);
                    report.uptime = Duration::from_micros(us);
                }
                IMAGE => {
                    report.image = Some(ImageInfo {
                        path: value.to_string(),
                        direct_io: false,
                    })
                }
                IMAGE_DIRECT_IO => image_direct_io = value == "1",
                BLOCK_DEVICE => report.block_device = Some(value.to_string()),
                TRANSPORT => report.transport = value.to_string(),
                READ_ONLY => report.read_only = value == "1",
                FAILURE => report.failure = Some(value.to_string()),
                OPTIONS => report.options = value.to_string(),
                INIT_FLAGS => {
                    report.init_flags = value.split_whitespace().map(str::to_string).collect()
                }
                GENERATION => report.generation = u64::try_from(number(line, value)?).unwrap_or(0),
                STATE_HOLD_HISTOGRAM => {
                    report.state_hold_histogram = value
                        .split_whitespace()
                        .map(|n| n.parse::<u64>())
                        .collect::<Result<_, _>>()
                        .map_err(|_| format!("unreadable stats line: {line:?}"))?
                }
                COUNTER | REQUEST => {
                    let (name, n) = value
                        .split_once(' ')
                        .ok_or_else(|| format!("unreadable stats line: {line:?}"))?;
                    let n = number(line, n)?;
                    if key == REQUEST {
                        report
                            .requests
                            .push((name.to_string(), u64::try_from(n).unwrap_or(0)));
                    } else if let Some(counter) = COUNTERS.iter().find(|c| c.name == name) {
                        report.counters.push((counter, n));
                    }
                }
                _ => {}
            }
        }
        if let Some(image) = &mut report.image {
            image.direct_io = image_direct_io;
        }
        Ok(report)
    }
}

/// The mount options that change how the mount behaves, as `-o` says them
/// (ro/rw is shown apart: it can change after mount).
pub(crate) fn describe_options(o: &FuseOptions) -> String {
    let mut parts = vec![
        format!("threads={}", o.threads),
        format!("entry_ttl={}", o.entry_ttl.as_secs()),
        format!("attr_ttl={}", o.attr_ttl.as_secs()),
    ];
    let flags = [
        (o.writeback_cache, "writeback_cache"),
        (o.no_open, "no_open"),
        (o.allow_other, "allow_other"),
        (o.nosuid, "nosuid"),
        (o.nodev, "nodev"),
        (o.noexec, "noexec"),
        (o.nodiratime, "nodiratime"),
        (o.sync, "sync"),
        (o.dirsync, "dirsync"),
        (o.user_subvol_rm_allowed, "user_subvol_rm_allowed"),
        (o.idmap, "idmap"),
    ];
    parts.extend(flags.iter().filter(|f| f.0).map(|f| f.1.to_string()));
    parts.push(
        match o.atime {
            AtimeUpdates::Never => "noatime",
            AtimeUpdates::Relative => "relatime",
            AtimeUpdates::Always => "strictatime",
        }
        .to_string(),
    );
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON keys: snake_case, unique.
    #[test]
    fn counter_names_are_unique_snake_case() {
        for (i, c) in COUNTERS.iter().enumerate() {
            assert!(
                c.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{} is not snake_case",
                c.name
            );
            assert!(
                COUNTERS[..i].iter().all(|d| d.name != c.name),
                "{} twice",
                c.name
            );
        }
    }

    #[test]
    fn report_survives_encoding() {
        let report = StatsReport {
            uptime: Duration::from_micros(83_214_567),
            image: Some(ImageInfo {
                path: "/var/tmp/an image".into(),
                direct_io: true,
            }),
            block_device: Some("/dev/loop3".into()),
            transport: "io_uring (2 queues x 4 entries)".into(),
            read_only: true,
            failure: Some("commit of generation 7: injected fault: flush #0 (EIO)".into()),
            options: "threads=8,no_open".into(),
            init_flags: vec!["ASYNC_READ".into(), "BIG_WRITES".into()],
            generation: 17,
            counters: COUNTERS.iter().zip((0..).map(|n| n - 3)).collect(),
            requests: vec![("LOOKUP".into(), 3), ("other".into(), 0)],
            state_hold_histogram: vec![0, 0, 4, 0, 9],
        };
        assert_eq!(StatsReport::decode(&report.encode()), Ok(report));
        assert!(StatsReport::decode("counter commits many\n").is_err());
    }

    /// The README's counter table is this table, rendered: a counter added
    /// here fails this test until the README documents it. The expected
    /// text is printed, ready to paste between the markers.
    #[test]
    fn readme_documents_every_counter() {
        let readme = include_str!("../../../README.md");
        let table = readme_table();
        let section = readme
            .split_once(README_BEGIN)
            .and_then(|(_, rest)| rest.split_once(README_END))
            .map(|(inside, _)| inside);
        assert!(
            section == Some(table.as_str()),
            "README.md's counter table (between {README_BEGIN} and {README_END}) \
             does not match crates/birch-fuse/src/stats.rs; it should read:\n{table}"
        );
    }

    const README_BEGIN: &str =
        "<!-- birch stats counters: generated from crates/birch-fuse/src/stats.rs -->";
    const README_END: &str = "<!-- end of birch stats counters -->";

    fn readme_table() -> String {
        let mut out = String::from("\n");
        for group in Group::ALL {
            let _ = writeln!(out, "\n**{}**\n", group.title());
            out.push_str("| counter | unit | what it counts | why you would look at it |\n");
            out.push_str("|---|---|---|---|\n");
            for c in COUNTERS.iter().filter(|c| c.group == group) {
                let unit = match c.unit {
                    Unit::Count => "count",
                    Unit::Bytes => "bytes",
                    Unit::Pages => "4 KiB pages",
                    Unit::Micros => "µs",
                    Unit::Nanos => "ns",
                };
                let measure = match c.measure {
                    Measure::Total => "",
                    Measure::Peak => ", largest",
                    Measure::Now => ", now",
                };
                let _ = writeln!(
                    out,
                    "| `{}` | {unit}{measure} | {} | {} |",
                    c.name, c.counts, c.why
                );
            }
        }
        out.push('\n');
        out
    }
}
