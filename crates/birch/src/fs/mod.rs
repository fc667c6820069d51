//! The filesystem: transactions, delayed items, inodes, directories, files.
//!
//! [`Filesystem`] is the embeddable API (the FUSE front end is one user of
//! it). All metadata lives behind one state lock; a commit seals the running
//! transaction under that lock and then writes it without holding it, so
//! requests keep running while a commit's I/O is in flight.
//!
//! This file is the API and the state it guards; the commit coordination
//! and the background worker are in transaction.rs, an fsync's group-commit
//! log sync in log_sync.rs.

mod attr_flags;
mod cleaner;
mod commit;
mod csum;
mod decode;
mod delayed;
mod delayed_items;
mod extent_ops;
mod file;
mod in_flight;
mod info;
mod inode;
mod inode_cache;
pub(crate) mod log_choice;
mod log_state;
mod log_sync;
mod mount;
mod namespace;
mod page_prefetch;
mod replay;
mod root;
mod send;
mod space;
mod space_info;
mod spare_pages;
mod state;
mod subvol;
mod transaction;
mod tree_log;
mod types;
mod warm;
mod writeback;
mod xattr;

pub use commit::read_superblock;
pub use log_state::{FallbackReason, LogStats};
pub use send::{SendOptions, SendStats};
pub use types::SubvolInfo;
pub use types::*;

use crate::alloc::TransactionSpace;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::{Superblock, Timespec, SECTOR_SIZE};
use crate::lock_order::{
    HoldHistogram, LockRank, RankedCondvar, RankedGuard, RankedMutex, RequestHold,
};
use page_prefetch::{PagePrefetch, ReadyPages};
use root::RootCtx;
use space_info::Need;
use state::FsState;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use transaction::{background_worker, shut_down_error, Shared, SyncProgress};
use warm::WarmUp;

/// How many times fsync writes a file back without the state lock before
/// it gives up on writes racing it and commits instead (the commit writes
/// every page back): the log records only published extents.
const FSYNC_WRITEBACK_ROUNDS: u32 = 3;

/// Node cache misses one read-only request reads without the state lock
/// before it reads the rest under it ([`Filesystem::read`]). Each rerun
/// walks the request's path again, so this bounds the work (quadratic in
/// the misses) of a request whose nodes keep being evicted before it runs
/// again. A cold lookup misses about twice per tree level (the directory
/// entry, then the inode): 32 covers a cold request in trees of any height
/// a device can hold.
const READ_RERUNS: u32 = 32;

/// Writes an empty filesystem (a root directory) onto `dev`. Unlike
/// [`Filesystem::mkfs`] it takes any device, borrowed ones included.
pub fn mkfs<D: BlockDevice>(dev: &D, options: &MkfsOptions) -> Result<()> {
    mount::mkfs(dev, options)
}

/// A mounted birch filesystem.
///
/// Changes live in memory until they are made durable: `fsync` of a file
/// or directory writes the log tree (docs/TREE-LOG.md says exactly what
/// an fsync covers), `sync` commits everything. A power cut keeps what was
/// durable; the next [`open`](Self::open) replays the log.
///
/// ```
/// use birch::{Filesystem, MemoryDevice, MkfsOptions, MountOptions, RenameFlags};
/// use std::sync::Arc;
///
/// # fn main() -> birch::Result<()> {
/// let dev = Arc::new(MemoryDevice::new(64 << 20));
/// Filesystem::mkfs(dev.as_ref(), &MkfsOptions::default())?;
/// let fs = Filesystem::open(dev.clone(), MountOptions::default())?;
/// let root = fs.root_ino();
/// // The classic safe replace: write a new file, fsync it, rename it over
/// // the old one, fsync the directory.
/// let tmp = fs.create(root, b"config.tmp", 0o644, 0, 0)?;
/// fs.write_file(tmp.ino, 0, b"v2")?;
/// fs.fsync(tmp.ino, false)?;
/// fs.rename(root, b"config.tmp", root, b"config", RenameFlags::default())?;
/// fs.fsync(root, false)?;
///
/// // A power cut now: the device holds only what was written so far.
/// let after_cut = Arc::new(MemoryDevice::from_bytes(dev.snapshot()));
/// let fs = Filesystem::open(after_cut, MountOptions::default())?;
/// let config = fs.lookup(fs.root_ino(), b"config")?;
/// assert_eq!(fs.read_file(config.ino, 0, 16)?, b"v2");
/// assert!(fs.lookup(fs.root_ino(), b"config.tmp").is_err());
/// # Ok(())
/// # }
/// ```
pub struct Filesystem<D: BlockDevice + 'static> {
    shared: Arc<Shared<D>>,
    /// Behind a lock because a read-only open starts them later, from
    /// whichever request thread switches it to read-write; holding the lock
    /// also makes that switch happen once.
    threads: RankedMutex<BackgroundThreads>,
    /// `close` ran: dropping has nothing left to do.
    closed: bool,
}

/// The threads a read-write filesystem runs.
#[derive(Default)]
struct BackgroundThreads {
    worker: Option<JoinHandle<()>>,
    flusher: Option<JoinHandle<()>>,
}

impl<D: BlockDevice + 'static> Filesystem<D> {
    /// Writes an empty filesystem (a root directory) onto `dev`.
    pub fn mkfs(dev: &D, options: &MkfsOptions) -> Result<()> {
        mount::mkfs(dev, options)
    }

    /// Opens the filesystem on `dev`, recovering to its last durable state.
    ///
    /// A log is replayed whole or not at all: if replay fails (a bug, or a
    /// damaged log), the state it half built is thrown away and the last
    /// commit mounts; [`Self::replay_outcome`] says which happened. A read
    /// error (EIO) during replay fails the open instead: the log stays. A
    /// read-only mount replays into memory only and writes nothing until
    /// [`Self::remount_read_write`]. If the newest commit's roots cannot be
    /// read, `options.rescue` decides whether an older commit recorded in
    /// the superblock is mounted instead ([`Self::backup_root_used`]).
    pub fn open(dev: D, options: MountOptions) -> Result<Self> {
        let dev = Arc::new(dev);
        let mut state = mount::open(dev.clone(), options.clone())?;
        // A rescue mount that fell back to an older commit may have made
        // itself read-only.
        let read_only = state.info.options.read_only;
        let has_log = state.info.superblock.log_root_bytenr != 0;
        if has_log {
            // Replay only changes memory (and reserves space in the
            // in-memory allocator): a fresh open forgets it entirely.
            let outcome = match state.replay_log() {
                Ok(report) => ReplayOutcome::Replayed(report),
                // The device failed to read, the log itself may be fine:
                // discarding it (and committing without it) would turn a
                // read error into the loss of what fsync made durable.
                Err(Error::Io(e)) => {
                    return Err(Error::Io(std::io::Error::new(
                        e.kind(),
                        format!("replaying the fsync log: {e}; the log is kept, mount again once the device reads"),
                    )))
                }
                Err(e) => {
                    state = mount::open(dev, options.clone())?;
                    ReplayOutcome::Discarded(e.to_string())
                }
            };
            state.info.replay = Some(outcome);
        }
        let store = state.info.forest.store().clone();
        let sync = SyncProgress {
            durable_generation: state.info.superblock.generation,
            ..Default::default()
        };
        let shared = Arc::new(Shared {
            state: RankedMutex::new(LockRank::State, state),
            commit_lock: RankedMutex::new(LockRank::Commit, ()),
            sync: RankedMutex::new(LockRank::Sync, sync),
            sync_changed: RankedCondvar::new(),
            superblock_lock: RankedMutex::new(LockRank::Superblock, ()),
            store,
            worker_stop: RankedMutex::new(LockRank::WorkerStop, false),
            worker_wake: RankedCondvar::new(),
            space_cv: RankedCondvar::new(),
            flusher_wake: RankedCondvar::new(),
            writeback_done: RankedCondvar::new(),
            reclaim_lock: RankedMutex::new(LockRank::Reclaim, ()),
            state_hold: HoldHistogram::new(),
        });
        let fs = Filesystem {
            shared,
            threads: RankedMutex::new(LockRank::Threads, BackgroundThreads::default()),
            closed: false,
        };
        if !read_only {
            fs.start_writing(&mut fs.lock_threads())?;
        }
        Ok(fs)
    }

    /// Whether changes are refused: opened read-only and not switched since.
    pub fn is_read_only(&self) -> bool {
        self.lock().info.options.read_only
    }

    /// Why the filesystem turned read-only, if a write, flush or read
    /// while changing it failed (docs/IO-ERRORS.md): changes fail with
    /// EROFS and commits and fsyncs with EIO from then on.
    pub fn failure(&self) -> Option<String> {
        self.lock().info.failed.clone()
    }

    /// Turns a read-only open into a read-write one, as if it had been
    /// opened read-write: the log found at open (replayed into memory
    /// only) is committed, orphans are freed, the background commit worker
    /// and flusher start. For `mount -o remount,rw` of a mount started
    /// read-only. Nothing happens if the filesystem is writable already;
    /// on a device opened read-only it fails with
    /// [`Error::DeviceReadOnly`] and stays read-only.
    pub fn remount_read_write(&self) -> Result<()> {
        self.shared.check_not_poisoned()?;
        let mut threads = self.lock_threads();
        {
            let state = self.lock();
            if state.info.shut_down {
                return Err(shut_down_error());
            }
            if !state.info.options.read_only {
                return Ok(());
            }
        }
        if !self.shared.store.device().writable() {
            return Err(Error::DeviceReadOnly);
        }
        self.start_writing(&mut threads)
    }

    fn lock_threads(&self) -> RankedGuard<'_, BackgroundThreads> {
        self.threads
            .lock()
            .expect("background threads lock poisoned")
    }

    /// What a read-write open does once the state is loaded, and what
    /// [`Self::remount_read_write`] does later: one path for both, so a
    /// switched mount is the same as one opened read-write.
    fn start_writing(&self, threads: &mut BackgroundThreads) -> Result<()> {
        {
            let mut state = self.lock();
            state.info.options.read_only = false;
            self.shared.store.set_repair_writes(true);
            // Under the same hold of the state lock that allows changes:
            // a change that slipped in between could create an O_TMPFILE
            // inode (an orphan by design) that this would free while held.
            if let Err(e) = remove_orphans_of_every_subvolume(&mut state) {
                if matches!(e, Error::Io(_) | Error::Corrupt(_)) {
                    state.info.failed = Some(e.to_string());
                }
                return Err(e);
            }
        }
        // Supersedes the log found at open (replayed or discarded) and
        // makes the orphans' removal durable; nothing is written if there
        // was neither.
        self.commit()?;
        let options = self.lock().info.options.clone();
        if options.commit_interval.is_some() {
            let shared = self.shared.clone();
            threads.worker = Some(
                std::thread::Builder::new()
                    .name("birch-commit".into())
                    .spawn(move || background_worker(shared))
                    .map_err(Error::Io)?,
            );
        }
        if options.background_flusher {
            self.lock().info.space.flusher_running = true;
            let shared = self.shared.clone();
            match std::thread::Builder::new()
                .name("birch-flusher".into())
                .spawn(move || space::flusher(shared))
            {
                Ok(handle) => threads.flusher = Some(handle),
                Err(e) => {
                    self.lock().info.space.flusher_running = false;
                    return Err(Error::Io(e));
                }
            }
        }
        Ok(())
    }

    fn lock(&self) -> RankedGuard<'_, FsState<D>> {
        self.shared.lock_state()
    }

    /// Times the request this call is (`FsStats::state_hold_histogram`):
    /// the first line of every public call that serves a file request.
    fn request(&self) -> RequestHold<'_> {
        self.shared.state_hold.request()
    }

    /// Runs a read-only operation. Also after a panic failed the
    /// filesystem: reads are served from what is in memory.
    ///
    /// A tree node `f` needs and the cache lacks is read without the state
    /// lock (docs/SNAPSHOTS.md (f)): the miss ends the run, the node is
    /// read into the cache with the lock dropped, and `f` runs again. So
    /// `f` may run more than once: it must change nothing (but caches)
    /// before its last tree lookup. After [`READ_RERUNS`] misses in one
    /// request (nodes evicted again before the rerun, a cache smaller
    /// than the request's path) `f` runs once more reading its misses
    /// under the lock.
    fn read<T>(&self, mut f: impl FnMut(&mut FsState<D>) -> Result<T>) -> Result<T> {
        let mut misses = 0;
        loop {
            let mut state = self.lock();
            if state.info.shut_down {
                return Err(shut_down_error());
            }
            if misses == READ_RERUNS {
                state.info.stats.read_rerun_fallbacks += 1;
                return f(&mut state);
            }
            let (result, miss) = crate::btree::deferring_misses(|| f(&mut state));
            let Some(miss) = miss else {
                debug_assert!(!matches!(result, Err(Error::NodeNotCached)));
                return result;
            };
            drop(result);
            misses += 1;
            state.info.stats.read_reruns += 1;
            // The node was in the tree just now: until the ticket drops, a
            // commit that frees it cannot hand its block to new data.
            let _reader = state.info.forest.alloc_mut().start_read();
            drop(state);
            self.shared.store.load_missed(miss)?;
        }
    }

    /// Runs a read request that changes in-memory state before its last
    /// tree lookup (release and forget drop holds, and the last one frees
    /// an orphan): once, with any node miss read under the state lock (the
    /// "node cache miss" exemption).
    fn read_once<T>(&self, f: impl FnOnce(&mut FsState<D>) -> Result<T>) -> Result<T> {
        let mut state = self.lock();
        if state.info.shut_down {
            return Err(shut_down_error());
        }
        f(&mut state)
    }

    /// Turns the filesystem read-only after a panic inside the engine
    /// (`what`: where, and the panic's message), as after an I/O error:
    /// nothing more is written, changes fail with EROFS, reads go on
    /// (docs/IO-ERRORS.md, "Panics"). Returns the failure reason kept: an
    /// earlier failure's stays, but the general one a poisoned lock left
    /// gets these details.
    pub fn fail_after_panic(&self, what: &str) -> String {
        let mut state = self.lock();
        match &state.info.failed {
            Some(reason) if reason != transaction::PANIC_FAILURE => reason.clone(),
            _ => {
                let reason = format!("{}: {what}", transaction::PANIC_FAILURE);
                state.info.failed = Some(reason.clone());
                reason
            }
        }
    }

    /// Shuts the filesystem down, as a power cut would (fstests' shutdown
    /// ioctl): nothing in memory is written any more, and every later call
    /// fails with EIO. The caller stops the device itself (see
    /// [`crate::device::ShutdownGate`]); the next mount recovers from what
    /// the device holds.
    pub fn shut_down(&self) {
        let mut state = self.lock();
        state.info.shut_down = true;
        state.info.failed.get_or_insert_with(|| "shut down".into());
    }

    /// Runs an operation that changes the filesystem and reserves nothing
    /// up front (see [`change_with`](Self::change_with)).
    fn change<T>(&self, f: impl Fn(&mut FsState<D>) -> Result<T>) -> Result<T> {
        self.change_with(|_| Ok(Need::NONE), f)
    }

    /// Runs an operation that changes the filesystem once what it may add
    /// to the space reservations (`need`, computed under the state lock)
    /// fits, waiting on a ticket while it does not (docs/DELALLOC.md). An
    /// operation that still meets ENOSPC is retried once after a commit. An
    /// I/O error or corruption met while changing the trees leaves the
    /// filesystem read-only: what is in memory may be half-changed and must
    /// never be committed. A writer that leaves dirty memory above its
    /// limit is throttled afterwards (never a commit).
    fn change_with<T>(
        &self,
        need: impl Fn(&mut FsState<D>) -> Result<Need>,
        f: impl Fn(&mut FsState<D>) -> Result<T>,
    ) -> Result<T> {
        self.change_warmed(&warm::nothing::<D>, need, f)
    }

    /// [`change_with`](Self::change_with) after a warm-up: `warm` walks the
    /// lookups `f` will make, reading its node cache misses without the
    /// state lock, and `f` runs in the hold where `warm` ran without one
    /// (`Shared::lock_warmed`, docs/SNAPSHOTS.md (f) item 3). A node
    /// evicted between the two, or one `warm` does not walk, `f` reads
    /// under the lock.
    fn change_warmed<T>(
        &self,
        warm: WarmUp<'_, D>,
        need: impl Fn(&mut FsState<D>) -> Result<Need>,
        f: impl Fn(&mut FsState<D>) -> Result<T>,
    ) -> Result<T> {
        let result = self.change_reserving(warm, need, f);
        if matches!(result, Err(Error::NoSpace)) {
            self.lock().info.space.stats.enospc += 1;
        }
        result
    }

    /// [`change_with`](Self::change_with) without counting an ENOSPC it
    /// returns (the caller may still succeed in part).
    fn change_reserving<T>(
        &self,
        warm: WarmUp<'_, D>,
        need: impl Fn(&mut FsState<D>) -> Result<Need>,
        f: impl Fn(&mut FsState<D>) -> Result<T>,
    ) -> Result<T> {
        let mut retried = false;
        self.shared.check_not_poisoned()?;
        loop {
            let (result, over_limit) = {
                let (mut state, warmed) = self.shared.lock_warmed(warm);
                if warmed.is_err() {
                    state.fail_on_device_error(&warmed);
                    return warmed.map(|()| unreachable!("checked to be an error"));
                }
                let mut state = self.shared.reserve(state, &need)?;
                let result = f(&mut state);
                state.fail_on_device_error(&result);
                self.shared.space_changed(&mut state);
                (
                    result,
                    state.info.dirty_page_bytes > state.info.options.dirty_limit_bytes,
                )
            };
            if matches!(result, Err(Error::NoSpace)) && !retried {
                retried = true;
                self.shared.commit_for_space()?;
                continue;
            }
            if over_limit {
                self.shared.balance_dirty();
            }
            return result;
        }
    }

    // ----- namespace -----

    pub fn root_ino(&self) -> u64 {
        crate::format::ROOT_DIR_INO
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let _request = self.request();
        self.read(|s| s.lookup_across(parent, name))
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let _request = self.request();
        self.read(|s| s.getattr_across(ino))
    }

    /// Changes attributes. A truncate into a page keeps part of it: the
    /// page is read without the state lock first and checked by the
    /// change (docs/SNAPSHOTS.md (f) item 5); when it changed since, the
    /// change changes nothing and it is read again
    /// (4 times, then under the lock).
    pub fn setattr(&self, ino: u64, changes: &SetAttr) -> Result<Attr> {
        let _request = self.request();
        let mut rereads = 0;
        loop {
            let prefetch = match changes.size {
                Some(size) => {
                    self.read_ahead(ino, |root, ino| root.truncate_partial_page(ino, size))
                }
                None => PagePrefetch::nothing(),
            };
            if let Some(attr) = self.setattr_with(ino, changes, &prefetch, rereads)? {
                return Ok(attr);
            }
            rereads += 1;
        }
    }

    /// One try of [`setattr`](Self::setattr): `None` when a page read
    /// ahead was stale.
    fn setattr_with(
        &self,
        ino: u64,
        changes: &SetAttr,
        prefetch: &PagePrefetch,
        rereads: u32,
    ) -> Result<Option<Attr>> {
        // A truncate frees space: it may use the global reserve.
        let attr = self.change_warmed(
            &|s| s.warm_setattr(ino, changes.mode.is_some(), changes.size),
            |_| Ok(Need::urgent_items(4).plus_bytes(SECTOR_SIZE)),
            |s| {
                // Append-only files keep everything but their times set to
                // "now" (touch); immutable ones keep everything.
                let only_now = changes.mode.is_none()
                    && changes.uid.is_none()
                    && changes.gid.is_none()
                    && changes.size.is_none()
                    && !matches!(changes.atime, Some(SetTime::At(_)))
                    && !matches!(changes.mtime, Some(SetTime::At(_)));
                let (mut root, ino) = s.resolve_writable(ino)?;
                root.deny_if_flagged(ino, only_now)?;
                // The page for the size the file has now, which may not be
                // the one read ahead.
                let partial = match changes.size {
                    Some(size) => root.truncate_partial_page(ino, size)?,
                    None => Vec::new(),
                };
                let under_lock = rereads == page_prefetch::PAGE_REREADS;
                let Some(ready) = root.ready_pages(ino, &partial, prefetch, under_lock)? else {
                    return Ok(None);
                };
                let attr = root.setattr(ino, changes, &ready)?;
                Ok(Some(root.external(attr)))
            },
        )?;
        if attr.is_some() {
            self.sync_flagged(Some(ino), &[])?;
        }
        Ok(attr)
    }

    /// Creates a regular file, device node, fifo or socket (per `mode`'s
    /// file type bits).
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
    ) -> Result<Attr> {
        self.make_node(parent, name, mode, 0, uid, gid, rdev)
    }

    /// Creates an inode of any type but symlink (per `mode`'s file type
    /// bits) as the kernel asks a FUSE server with FUSE_DONT_MASK: the
    /// parent's default ACL, if it has one, is inherited and masks `mode`;
    /// otherwise `umask` does (docs/FUSE.md, "POSIX ACLs"). The inode and
    /// its ACLs are one change.
    #[allow(clippy::too_many_arguments)]
    pub fn make_node(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
    ) -> Result<Attr> {
        let _request = self.request();
        let attr = self.change_warmed(
            &|s| s.warm_create(parent, name),
            // The inode, its names, the parent, and two inherited ACLs.
            |_| Ok(Need::items(8)),
            |s| {
                let (mut root, dir) = s.resolve_writable(parent)?;
                root.deny_if_flagged(dir, true)?;
                root.create_node(dir, name, mode, umask, uid, gid, rdev)
                    .map(|a| root.external(a))
            },
        )?;
        self.sync_flagged(None, &[parent])?;
        Ok(attr)
    }

    /// Creates a regular file (`mode` holds permission bits).
    pub fn create(&self, parent: u64, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        let _request = self.request();
        self.mknod(parent, name, libc::S_IFREG | (mode & 0o7777), uid, gid, 0)
    }

    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.make_node(
            parent,
            name,
            libc::S_IFDIR | (mode & 0o7777),
            0,
            uid,
            gid,
            0,
        )
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        let _request = self.request();
        let attr = self.change_warmed(
            &|s| s.warm_create(parent, name),
            |_| Ok(Need::items(7)),
            |s| {
                let (mut root, dir) = s.resolve_writable(parent)?;
                root.deny_if_flagged(dir, true)?;
                root.symlink(dir, name, target, uid, gid)
                    .map(|a| root.external(a))
            },
        )?;
        self.sync_flagged(None, &[parent])?;
        Ok(attr)
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let _request = self.request();
        self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            root.readlink(ino)
        })
    }

    pub fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Attr> {
        let _request = self.request();
        let attr = self.change_warmed(
            &|s| s.warm_link(ino, new_parent, new_name),
            |_| Ok(Need::items(5)),
            |s| {
                InoSpace::same_subvolume(ino, new_parent)?;
                let (_, dir) = InoSpace::split(new_parent);
                let (mut root, ino) = s.resolve_writable(ino)?;
                root.deny_if_flagged(ino, false)?;
                root.deny_if_flagged(dir, true)?;
                // Only this link's own new name counts (an unlink leaves
                // one behind that nobody waits for).
                root.fs.log.new_name_sync = None;
                let attr = root.link(ino, dir, new_name).map(|a| root.external(a))?;
                Ok((attr, root.fs.log.new_name_sync.take()))
            },
        )?;
        let (attr, new_name_sync) = attr;
        self.sync_new_name(new_name_sync)?;
        self.sync_flagged(Some(ino), &[new_parent])?;
        Ok(attr)
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        let _request = self.request();
        self.change_warmed(
            &|s| s.warm_remove(parent, name),
            |_| Ok(Need::urgent_items(6)),
            |s| {
                let (mut root, dir) = s.resolve_writable(parent)?;
                root.deny_remove(dir, name)?;
                root.unlink(dir, name)
            },
        )?;
        self.sync_flagged(None, &[parent])
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        let _request = self.request();
        self.change_warmed(
            &|s| s.warm_remove(parent, name),
            |_| Ok(Need::urgent_items(6)),
            |s| {
                if s.is_subvolume_link(parent, name) {
                    return s.rmdir_subvolume(parent, name);
                }
                let (mut root, dir) = s.resolve_writable(parent)?;
                root.deny_remove(dir, name)?;
                root.rmdir(dir, name)
            },
        )?;
        self.sync_flagged(None, &[parent])
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        let _request = self.request();
        // A whiteout is a new inode with a name: five more items.
        let items = if flags.whiteout.is_some() { 15 } else { 10 };
        let new_name_sync = self.change_warmed(
            &|s| s.warm_rename(parent, name, new_parent, new_name),
            |_| Ok(Need::items(items)),
            |s| {
                // A subvolume link may move (and be exchanged) across
                // subvolumes; any other inode is EXDEV there.
                if s.rename_subvolume_link(parent, name, new_parent, new_name, flags)? {
                    return Ok(None);
                }
                InoSpace::same_subvolume(parent, new_parent)?;
                let (_, new_dir) = InoSpace::split(new_parent);
                let (mut root, dir) = s.resolve_writable(parent)?;
                // The source leaves its directory, a replaced target
                // leaves the other; an exchange does both. A malformed
                // name or a missing source is left to `rename`, which
                // reports it in the kernel's order (a missing source before
                // a long target, both before a flag).
                let well_formed = namespace::validate_name(name).is_ok()
                    && namespace::validate_name(new_name).is_ok();
                if well_formed && root.find_entry(dir, name)?.is_some() {
                    root.deny_remove(dir, name)?;
                    if flags.exchange || root.find_entry(new_dir, new_name)?.is_some() {
                        root.deny_remove(new_dir, new_name)?;
                    } else {
                        root.deny_if_flagged(new_dir, true)?;
                    }
                }
                root.fs.log.new_name_sync = None;
                root.rename(dir, name, new_dir, new_name, flags)?;
                Ok(root.fs.log.new_name_sync.take())
            },
        )?;
        self.sync_new_name(new_name_sync)?;
        self.sync_flagged(None, &[parent, new_parent])
    }

    /// Seed 000 switched off (`Ablation::sync_log_on_new_name`,
    /// docs/ABLATION.md): a link or rename that changed a logged inode's
    /// names syncs the log before it returns, or commits when the log
    /// cannot be synced as it is. `None` (the switch off, or no logged
    /// inode involved) does nothing.
    fn sync_new_name(&self, sync: Option<log_state::NewNameSync>) -> Result<()> {
        match sync {
            None => Ok(()),
            Some(log_state::NewNameSync::Log(id)) => self.shared.wait_log(id),
            Some(log_state::NewNameSync::Commit) => self.commit(),
        }
    }

    /// Entries of a directory after `offset` (0 starts at the beginning;
    /// "." and ".." are not included), at most `limit` of them.
    pub fn readdir(&self, ino: u64, offset: u64, limit: usize) -> Result<Vec<DirListEntry>> {
        let _request = self.request();
        self.read(|s| s.readdir_across(ino, offset, limit))
    }

    /// The dir index the next name added to `ino` will get: a listing that
    /// stops before it ends even while names are renamed in and out behind
    /// it (each gets a new, higher index), as btrfs ends a listing at the
    /// last index that existed when it began.
    pub fn dir_index_end(&self, ino: u64) -> Result<u64> {
        let _request = self.request();
        self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            root.require_dir(ino)?;
            root.peek_dir_index(ino)
        })
    }

    /// A listing of directory `ino` began: updates its atime as the
    /// mount's [`AtimeUpdates`] says.
    pub fn dir_accessed(&self, ino: u64) -> Result<()> {
        let _request = self.request();
        self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            root.touch_atime(ino)
        })
    }

    /// The parent of a directory: for a subvolume's root directory, the
    /// directory holding its link (the top-level root is its own parent).
    pub fn parent_of_dir(&self, ino: u64) -> Result<u64> {
        let _request = self.request();
        self.read(|s| s.parent_across(ino))
    }

    // ----- open files -----

    /// Notes an open handle: an inode whose last name is removed while open
    /// lives on (as an orphan) until the last [`release`](Self::release).
    pub fn open_inode(&self, ino: u64) -> Result<()> {
        let _request = self.request();
        self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            root.open_inode(ino)
        })
    }

    /// Drops a hold taken with [`open_inode`](Self::open_inode). The
    /// last hold of an unlinked inode destroys it; the last hold of any
    /// inode of a deleted subvolume hands its tree to the cleaner
    /// (docs/SNAPSHOTS.md (d) step 3).
    pub fn release(&self, ino: u64) -> Result<()> {
        self.forget(ino, 1)
    }

    /// Drops `count` holds taken with [`open_inode`](Self::open_inode)
    /// (FUSE's forget: the kernel's lookup count), as
    /// [`release`](Self::release) drops one.
    pub fn forget(&self, ino: u64, count: u64) -> Result<()> {
        let _request = self.request();
        self.read_once(|s| {
            let mut r = Ok(());
            for _ in 0..count {
                r = s
                    .resolve(ino)
                    .and_then(|(mut root, ino)| root.release_inode(ino));
                if r.is_err() {
                    break;
                }
            }
            if r.is_ok() {
                r = s.retire_if_unheld(InoSpace::split(ino).0);
            }
            s.fail_on_device_error(&r);
            self.shared.space_changed(s);
            r
        })
    }

    // ----- data -----

    pub fn read_file(&self, ino: u64, offset: u64, size: usize) -> Result<Vec<u8>> {
        let _request = self.request();
        let plan = self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            root.plan_read(ino, offset, size)
        })?;
        let read = plan.execute(self.shared.store.device());
        if matches!(read, Err(Error::BadData(_))) {
            self.lock().info.stats.data_csum_errors += 1;
        }
        read
    }

    /// Writes `data` at `offset` into dirty pages, each piece (up to 1 MiB)
    /// accepted once its space is reserved. Returns the bytes accepted:
    /// fewer than `data.len()` when the filesystem filled up part-way
    /// (ENOSPC only when nothing could be accepted), as write(2) does.
    pub fn write_file(&self, ino: u64, offset: u64, data: &[u8]) -> Result<usize> {
        match self.write_accepting(ino, offset, data)? {
            (0, Some(refused)) => {
                self.count_refusal(&refused);
                Err(refused)
            }
            (accepted, _) => Ok(accepted),
        }
    }

    /// Writes all of `data` at `offset`, or returns the error that refused
    /// the rest; the pieces accepted before it stay written. For a caller
    /// that cannot take a short count: the kernel's write-back of cached
    /// pages (`-o writeback_cache`) ignores the count in the reply and
    /// looks only at the error, so a short count would lose the rest of
    /// its pages without a word to anyone.
    pub fn write_file_whole(&self, ino: u64, offset: u64, data: &[u8]) -> Result<()> {
        match self.write_accepting(ino, offset, data)? {
            (_, Some(refused)) => {
                self.count_refusal(&refused);
                Err(refused)
            }
            (_, None) => Ok(()),
        }
    }

    fn count_refusal(&self, refused: &Error) {
        if matches!(refused, Error::NoSpace) {
            self.lock().info.space.stats.enospc += 1;
        }
    }

    /// [`write_file`](Self::write_file)'s work: the bytes accepted, and
    /// the error that refused the rest (`None`: all of `data` accepted).
    /// An error before the first piece (a bad inode, a read-only root) is
    /// the `Err`.
    fn write_accepting(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<(usize, Option<Error>)> {
        let _request = self.request();
        // The partial first and last pages not in memory are read here,
        // without the state lock (docs/SNAPSHOTS.md (f) item 5).
        let partial = page_prefetch::partial_pages(offset, data.len() as u64);
        let (sync, prefetch) = self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            root.check_write(ino, offset, data.len() as u64)?;
            let sync = root.get_flags(ino)? & inode_flags::SYNC != 0;
            Ok((sync, root.plan_prefetch(ino, &partial)?))
        })?;
        let prefetch = prefetch.execute(self.shared.store.device());
        let (accepted, refused) = self.write_pieces(ino, offset, data, prefetch);
        // chattr +S: durable before write(2) returns, as
        // generic_write_sync makes it for IS_SYNC inodes.
        if sync && accepted > 0 {
            self.fsync(ino, false)?;
        }
        Ok((accepted, refused))
    }

    /// Reads ahead, without the state lock, the pages of `ino` a change
    /// will load from disk: `pages` chooses them under the lock, for the
    /// file as it is then (docs/SNAPSHOTS.md (f) item 5). A plan that
    /// fails reads nothing: the change returns the error in its own order
    /// of checks (or, passing them, finds its pages not read and reads
    /// again, at most [`page_prefetch::PAGE_REREADS`] times).
    fn read_ahead(
        &self,
        ino: u64,
        pages: impl Fn(&mut RootCtx<'_, D>, u64) -> Result<Vec<u64>>,
    ) -> PagePrefetch {
        let plan = self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            let pages = pages(&mut root, ino)?;
            root.plan_prefetch(ino, &pages)
        });
        match plan {
            Ok(plan) => plan.execute(self.shared.store.device()),
            Err(_) => PagePrefetch::nothing(),
        }
    }

    /// [`write_file`](Self::write_file)'s pieces: the bytes accepted and
    /// the error that stopped the rest. A piece whose partial
    /// page changed on disk since `prefetch` read it changes nothing and
    /// reads it again ([`page_prefetch::PAGE_REREADS`] times, then under
    /// the lock).
    fn write_pieces(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        mut prefetch: PagePrefetch,
    ) -> (usize, Option<Error>) {
        if data.is_empty() {
            let empty = self.change(|s| {
                let (mut root, ino) = s.resolve_writable(ino)?;
                root.write_file(ino, offset, data, &ReadyPages::default())
            });
            return (0, empty.err());
        }
        let mut done = 0usize;
        let mut chunk_limit = space_info::WRITE_CHUNK;
        let mut rereads = 0;
        while done < data.len() {
            let at = offset + done as u64;
            let piece = ((chunk_limit - at % chunk_limit) as usize).min(data.len() - done);
            let chunk = &data[done..done + piece];
            let partial = page_prefetch::partial_pages(at, piece as u64);
            match self.change_reserving(
                &warm::nothing::<D>,
                |s| {
                    let (mut root, ino) = s.resolve_writable(ino)?;
                    root.write_need(ino, at, chunk.len() as u64)
                },
                |s| {
                    let (mut root, ino) = s.resolve_writable(ino)?;
                    root.deny_write(ino, at)?;
                    let under_lock = rereads == page_prefetch::PAGE_REREADS;
                    let Some(ready) = root.ready_pages(ino, &partial, &prefetch, under_lock)?
                    else {
                        return Ok(None);
                    };
                    root.write_file(ino, at, chunk, &ready).map(Some)
                },
            ) {
                Ok(Some(n)) => done += n,
                Ok(None) => {
                    rereads += 1;
                    prefetch = self.read_ahead(ino, |_, _| Ok(partial.clone()));
                }
                // A piece that does not fit may fit in part: ENOSPC only
                // once not even one page of it does.
                Err(Error::NoSpace) if piece as u64 > SECTOR_SIZE => {
                    chunk_limit = (piece as u64 / 2).next_power_of_two().max(SECTOR_SIZE);
                    if chunk_limit >= piece as u64 {
                        chunk_limit = (chunk_limit / 2).max(SECTOR_SIZE);
                    }
                }
                Err(e) => return (done, Some(e)),
            }
        }
        (done, None)
    }

    /// Writes back (without making durable) the dirty pages of `ino` that
    /// overlap `[offset, offset + len)`, like
    /// `sync_file_range(SYNC_FILE_RANGE_WRITE)`. Returns the pages written.
    pub fn flush_range(&self, ino: u64, offset: u64, len: u64) -> Result<u64> {
        let _request = self.request();
        self.shared.check_not_poisoned()?;
        if len == 0 {
            return self.read(|s| {
                let (mut root, ino) = s.resolve(ino)?;
                root.require_regular(ino).map(|()| 0)
            });
        }
        let first = offset / SECTOR_SIZE;
        let last = offset.saturating_add(len - 1) / SECTOR_SIZE;
        let written = self.shared.writeback_inode(
            ino,
            (
                std::ops::Bound::Included(first),
                std::ops::Bound::Included(last),
            ),
        )?;
        self.lock().info.space.stats.range_pages += written;
        Ok(written)
    }

    /// Preallocates (reads as zeros until written) or punches a hole.
    /// Punch hole's and zero range's partial edge pages are read without
    /// the state lock first and checked by the change, as a write's
    /// (docs/SNAPSHOTS.md (f) item 5): when one changed since, the change
    /// changes nothing and they are read again
    /// (4 times, then under the lock).
    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: FallocateMode) -> Result<()> {
        let _request = self.request();
        let grows_only = matches!(
            mode,
            FallocateMode::Allocate | FallocateMode::AllocateKeepSize
        );
        let mut rereads = 0;
        loop {
            let prefetch = if mode.zeroes() {
                self.read_ahead(ino, |root, ino| {
                    root.fallocate_partial_pages(ino, offset, len, mode)
                })
            } else {
                PagePrefetch::nothing()
            };
            let done = self.change_with(
                |s| {
                    let (mut root, ino) = s.resolve_writable(ino)?;
                    root.fallocate_need(ino, offset, len, mode)
                },
                |s| {
                    let (mut root, ino) = s.resolve_writable(ino)?;
                    root.deny_if_flagged(ino, grows_only)?;
                    let pages = root.fallocate_partial_pages(ino, offset, len, mode)?;
                    let under_lock = rereads == page_prefetch::PAGE_REREADS;
                    let Some(ready) = root.ready_pages(ino, &pages, &prefetch, under_lock)? else {
                        return Ok(false);
                    };
                    root.fallocate(ino, offset, len, mode, &ready)?;
                    Ok(true)
                },
            )?;
            if done {
                return self.sync_flagged(Some(ino), &[]);
            }
            rereads += 1;
        }
    }

    /// SEEK_DATA / SEEK_HOLE: the next offset at or after `offset` that
    /// holds data (or is a hole; the end of file counts as a hole).
    pub fn seek(&self, ino: u64, offset: u64, whence: SeekWhence) -> Result<u64> {
        let _request = self.request();
        self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            root.seek(ino, offset, whence)
        })
    }

    /// FIBMAP (FUSE_BMAP): the device byte holding the file's byte at
    /// `offset`, or `None` where no written extent holds it (a hole, past
    /// the end, inline data, a preallocated range). As ext4 does for
    /// delayed allocation, the page is written back first, so a file
    /// written and not yet synced maps too (docs/FUSE.md, "FIBMAP").
    pub fn device_byte(&self, ino: u64, offset: u64) -> Result<Option<u64>> {
        let _request = self.request();
        self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            root.require_regular(ino)
        })?;
        self.flush_range(ino, offset, 1)?;
        self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            root.device_byte(ino, offset)
        })
    }

    pub fn truncate(&self, ino: u64, size: u64) -> Result<Attr> {
        let _request = self.request();
        self.setattr(
            ino,
            &SetAttr {
                size: Some(size),
                ..Default::default()
            },
        )
    }

    /// `copy_file_range`: copies up to `len` bytes (fewer at the source's
    /// EOF) and returns how many. Where both offsets lie at the same place
    /// within a block and both files are in one subvolume, whole blocks
    /// are shared with the source (a reflink: the destination's extents
    /// point at the source's data, copy on write); otherwise, and at
    /// partial blocks, bytes are copied. Across subvolumes the extent
    /// counts would allow sharing (they count file extent items of every
    /// tree), but a reflink first settles the source's inline and dirty
    /// data into its own tree, a change a read-only source (a snapshot,
    /// the usual source) must not get: bytes are copied instead.
    pub fn copy_file_range(
        &self,
        src: u64,
        src_offset: u64,
        dst: u64,
        dst_offset: u64,
        len: u64,
    ) -> Result<u64> {
        let _request = self.request();
        let one_subvolume = InoSpace::same_subvolume(src, dst).is_ok();
        let len = self.read(|s| {
            if one_subvolume {
                let (mut root, src) = s.resolve(src)?;
                let (_, dst) = InoSpace::split(dst);
                root.deny_if_flagged(dst, false)?;
                return root.check_copy(src, src_offset, dst, dst_offset, len);
            }
            let (mut from, src) = s.resolve(src)?;
            from.require_regular(src)?;
            let len = len.min(from.inode(src)?.item.size.saturating_sub(src_offset));
            let (mut to, dst) = s.resolve(dst)?;
            to.require_regular(dst)?;
            to.deny_if_flagged(dst, false)?;
            if len > 0 {
                to.check_write(dst, dst_offset, len)?;
            }
            Ok(len)
        })?;
        if len == 0 {
            return Ok(0);
        }
        if one_subvolume && src_offset % SECTOR_SIZE == dst_offset % SECTOR_SIZE {
            // The source's dirty pages go to its extents without the state
            // lock first, as fsync's do; the clone then settles under the
            // lock only what was dirtied since, without device I/O (their
            // data goes out with the next commit or log sync).
            self.shared.check_not_poisoned()?;
            self.shared.writeback_inode(
                src,
                (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded),
            )?;
            let cloned = self.clone_reading((src, src_offset), (dst, dst_offset), len)?;
            self.sync_flagged(Some(dst), &[])?;
            return Ok(cloned);
        }
        let mut done = 0;
        while done < len {
            let piece = (len - done).min(space_info::WRITE_CHUNK);
            let data = self.read_file(src, src_offset + done, piece as usize)?;
            if data.is_empty() {
                break;
            }
            let n = self.write_file(dst, dst_offset + done, &data)? as u64;
            done += n;
            if n < data.len() as u64 {
                break;
            }
        }
        Ok(done)
    }

    /// `copy_file_range`'s reflink within one subvolume: the pages it
    /// copies as bytes (its unaligned edges) are read without the state
    /// lock first and checked by the change, as a write's partial pages
    /// (docs/SNAPSHOTS.md (f) item 5). The edges are those of the length
    /// the source's size allows when they are chosen, under the lock: a
    /// source that shrank since the length was taken moves the tail.
    fn clone_reading(&self, src: (u64, u64), dst: (u64, u64), len: u64) -> Result<u64> {
        let (src_ino, dst_ino) = (InoSpace::split(src.0).1, InoSpace::split(dst.0).1);
        let (src_at, dst_at) = ((src_ino, src.1), (dst_ino, dst.1));
        let mut rereads = 0;
        loop {
            let src_prefetch = self.read_ahead(src.0, |root, _| {
                Ok(root.clone_edges(src_at, dst_at, len)?.0)
            });
            let dst_prefetch = self.read_ahead(dst.0, |root, _| {
                Ok(root.clone_edges(src_at, dst_at, len)?.1)
            });
            let cloned = self.change_with(
                |s| {
                    let (mut root, src_ino) = s.resolve_writable(src.0)?;
                    root.clone_need(src_ino, src.1, len)
                },
                |s| {
                    let (mut root, _) = s.resolve_writable(src.0)?;
                    root.deny_if_flagged(dst_ino, false)?;
                    let (src_pages, dst_pages) = root.clone_edges(src_at, dst_at, len)?;
                    let under_lock = rereads == page_prefetch::PAGE_REREADS;
                    let Some(mut ready) =
                        root.ready_pages(src_ino, &src_pages, &src_prefetch, under_lock)?
                    else {
                        return Ok(None);
                    };
                    let Some(dst_ready) =
                        root.ready_pages(dst_ino, &dst_pages, &dst_prefetch, under_lock)?
                    else {
                        return Ok(None);
                    };
                    ready.extend(dst_ready);
                    root.clone_range(src_at, dst_at, len, &ready).map(Some)
                },
            )?;
            if let Some(cloned) = cloned {
                return Ok(cloned);
            }
            rereads += 1;
        }
    }

    // ----- inode flags, unnamed files -----

    /// The inode's flags as FS_IOC_GETFLAGS reports them
    /// ([`inode_flags`]).
    pub fn get_flags(&self, ino: u64) -> Result<u32> {
        let _request = self.request();
        self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            root.get_flags(ino)
        })
    }

    /// Whether an open(2) of `ino` with `flags` (O_ACCMODE, O_APPEND,
    /// O_TRUNC) is allowed by its inode flags: EPERM for a write or
    /// truncating open of an immutable inode, and for a write open without
    /// O_APPEND or a truncating open of an append-only one (the VFS's
    /// may_open). For a front end that sees opens; writes are refused
    /// anyway.
    pub fn deny_open(&self, ino: u64, flags: i32) -> Result<()> {
        let _request = self.request();
        self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
            if writes && root.root.is_readonly() {
                return Err(Error::ReadOnly);
            }
            root.deny_open(ino, flags)
        })
    }

    /// FS_IOC_SETFLAGS: only [`inode_flags::SUPPORTED`] may be set
    /// (EOPNOTSUPP otherwise). Permission is the caller's to check.
    pub fn set_flags(&self, ino: u64, flags: u32) -> Result<()> {
        let _request = self.request();
        self.change_with(
            // The inode, and the compression property's xattr it may drop.
            |_| Ok(Need::items(3)),
            |s| {
                let (mut root, ino) = s.resolve_writable(ino)?;
                root.set_flags(ino, flags)
            },
        )?;
        self.sync_flagged(Some(ino), &[])
    }

    /// `open(dir, O_TMPFILE)`: a regular file with no name, held once
    /// (drop the hold with [`release`](Self::release) or
    /// [`forget`](Self::forget); it is then freed unless
    /// [`link`](Self::link) gave it a name). A crash before either leaves
    /// nothing behind. Like [`make_node`](Self::make_node), `dir`'s
    /// default ACL, if it has one, is inherited and masks `mode`;
    /// otherwise `umask` does.
    pub fn tmpfile(&self, dir: u64, mode: u32, umask: u32, uid: u32, gid: u32) -> Result<Attr> {
        let _request = self.request();
        self.change_with(
            // The inode, its orphan item, and an inherited access ACL.
            |_| Ok(Need::items(5)),
            |s| {
                let (mut root, dir) = s.resolve_writable(dir)?;
                let ino = root.tmpfile(dir, mode, umask, uid, gid)?;
                root.getattr(ino).map(|a| root.external(a))
            },
        )
    }

    // ----- xattrs -----

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let _request = self.request();
        self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            root.getxattr(ino, name)
        })
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrSetMode) -> Result<()> {
        self.setxattr_kill_sgid(ino, name, value, mode, false)
    }

    /// `setxattr`, and with `kill_sgid` an access ACL
    /// (`system.posix_acl_access`) also clears the set-group-ID bit in the
    /// same change, as the kernel's posix_acl_update_mode does when the
    /// caller is neither in the file's group nor has CAP_FSETID. FUSE
    /// leaves that decision to the kernel, which passes it as
    /// FUSE_SETXATTR_ACL_KILL_SGID (docs/FUSE.md, "POSIX ACLs"); other
    /// names, the default ACL included, ignore it, as local filesystems
    /// do.
    pub fn setxattr_kill_sgid(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrSetMode,
        kill_sgid: bool,
    ) -> Result<()> {
        let _request = self.request();
        self.change_warmed(
            &|s| s.warm_xattr(ino, name),
            |_| Ok(Need::items(3)),
            |s| {
                let (mut root, ino) = s.resolve_writable(ino)?;
                root.deny_if_flagged(ino, false)?;
                root.setxattr(ino, name, value, mode, kill_sgid)
            },
        )?;
        self.sync_flagged(Some(ino), &[])
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let _request = self.request();
        self.read(|s| {
            let (mut root, ino) = s.resolve(ino)?;
            root.listxattr(ino)
        })
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        let _request = self.request();
        self.change_warmed(
            &|s| s.warm_xattr(ino, name),
            |_| Ok(Need::urgent_items(2)),
            |s| {
                let (mut root, ino) = s.resolve_writable(ino)?;
                root.deny_if_flagged(ino, false)?;
                root.removexattr(ino, name)
            },
        )?;
        self.sync_flagged(Some(ino), &[])
    }

    /// After a change that succeeded, makes it durable before the call
    /// returns where chattr asks for that (docs/TREE-LOG.md, "chattr S and
    /// D"): `S` on `ino` fsyncs it (the VFS's IS_SYNC); `S` or `D` on any
    /// directory in `dirs` (IS_DIRSYNC) fsyncs each of them, whose log
    /// then holds their entry changes. As with ext4's synchronous handles,
    /// that fsync's error is the call's: the change happened, but may not
    /// be durable.
    fn sync_flagged(&self, ino: Option<u64>, dirs: &[u64]) -> Result<()> {
        if let Some(ino) = ino {
            if self.get_flags(ino)? & inode_flags::SYNC != 0 {
                self.fsync(ino, false)?;
            }
        }
        let mut dirsync = false;
        for &dir in dirs {
            dirsync |= self.get_flags(dir)? & (inode_flags::SYNC | inode_flags::DIRSYNC) != 0;
        }
        if dirsync {
            for (i, &dir) in dirs.iter().enumerate() {
                if !dirs[..i].contains(&dir) {
                    self.fsync(dir, false)?;
                }
            }
        }
        Ok(())
    }

    // ----- whole filesystem -----

    pub fn statfs(&self) -> Result<StatFs> {
        let _request = self.request();
        self.read(|s| Ok(s.statfs()))
    }

    /// Generation of the last durable commit.
    pub fn generation(&self) -> u64 {
        self.lock().info.superblock.generation
    }

    pub fn stats(&self) -> FsStats {
        let repairs = self.shared.store.repair_stats();
        let node_reads = self.shared.store.read_stats();
        let hold = self.shared.state_hold.counts();
        FsStats {
            state_hold_requests: hold.requests,
            state_hold_nanos: hold.nanos,
            state_hold_histogram: hold.buckets,
            metadata_bad_copies: repairs.metadata_bad_copies,
            metadata_repairs: repairs.metadata_repairs,
            metadata_unrepairable: repairs.metadata_unrepairable,
            node_reads_locked: node_reads.locked,
            node_reads_unlocked: node_reads.unlocked,
            ..self.lock().info.stats
        }
    }

    /// Counters of delayed allocation, reservation and reclaim.
    pub fn space_stats(&self) -> SpaceStats {
        self.lock().info.space.stats
    }

    /// The space accounting right now (docs/DELALLOC.md).
    pub fn space_usage(&self) -> SpaceUsage {
        self.lock().space_usage()
    }

    /// Makes `ino`'s data, size and a name (a directory: its entries)
    /// durable, through the log tree: no transaction commit unless the log
    /// cannot express what changed (docs/TREE-LOG.md).
    pub fn fsync(&self, ino: u64, _datasync: bool) -> Result<()> {
        let _request = self.request();
        // The log's nodes: fsync must not fail for space, it may use the
        // global reserve (a reclaim commit makes it durable anyway).
        let started = Instant::now();
        let mut rounds = 0;
        if self.lock().info.options.ablation.log_waits_for_commit {
            self.wait_for_commit_in_flight()?;
        }
        let outcome = loop {
            // The file's data first, written without the state lock; the
            // log then records the extents it published.
            let regular = self.read(|s| {
                let (mut root, ino) = s.resolve(ino)?;
                root.is_regular_file(ino)
            })?;
            if regular {
                self.shared.check_not_poisoned()?;
                let written = self.shared.writeback_inode(
                    ino,
                    (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded),
                )?;
                self.lock().info.space.stats.fsync_pages += written;
            }
            rounds += 1;
            let outcome = self.change_warmed(
                &|s| s.warm_fsync(ino),
                |_| Ok(Need::urgent_items(8)),
                |s| {
                    let (mut root, ino) = s.resolve(ino)?;
                    if rounds <= FSYNC_WRITEBACK_ROUNDS && root.has_unpublished_data(ino)? {
                        return Ok(None);
                    }
                    root.fs.stats.fsyncs += 1;
                    // The last sealed commit: it may still be writing.
                    let sealed = root.fs.forest.transid() - 1;
                    root.log_for_fsync(ino).map(|o| Some((o, sealed)))
                },
            )?;
            if let Some(outcome) = outcome {
                break outcome;
            }
        };
        let (outcome, sealed) = outcome;
        let durable = match outcome {
            // Committed already: durable once that commit is (a commit
            // sealed between this fsync's writeback and its log check
            // holds the data).
            tree_log::LogOutcome::Nothing => self.shared.wait_commit(sealed),
            tree_log::LogOutcome::Logged(id) => self.shared.wait_log(id),
            tree_log::LogOutcome::NeedCommit => self.commit(),
        };
        self.lock().info.log_stats.fsync_nanos += started.elapsed().as_nanos() as u64;
        durable
    }

    /// Seed 002 switched off (`Ablation::log_waits_for_commit`,
    /// docs/ABLATION.md): before it logs anything, an fsync waits until
    /// the commit in flight has written its superblock, as btrfs's
    /// `start_log_trans` waited on the committing transaction's
    /// `tree_log_mutex`. The wait is added to `log_base_wait_nanos`.
    fn wait_for_commit_in_flight(&self) -> Result<()> {
        let started = Instant::now();
        let sealed = self.lock().info.forest.transid() - 1;
        self.shared.wait_commit(sealed)?;
        self.lock().info.log_stats.log_base_wait_nanos += started.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// What this mount did with the log the device held: `None` when
    /// there was none.
    pub fn replay_outcome(&self) -> Option<ReplayOutcome> {
        self.lock().info.replay.clone()
    }

    /// Set when the newest commit could not be read and the mount fell
    /// back to an older one (`Rescue::UseBackupRoot`): which, and what was
    /// lost.
    pub fn backup_root_used(&self) -> Option<BackupRootUsed> {
        self.lock().info.backup_root_used.clone()
    }

    /// Counters of the fsync path.
    pub fn log_stats(&self) -> LogStats {
        self.lock().info.log_stats
    }

    /// What the engine holds in memory now (docs/MEMORY.md).
    pub fn memory_stats(&self) -> MemoryStats {
        let (nodes, limit) = self.shared.store.cache_size();
        let state = self.lock();
        MemoryStats {
            node_cache_nodes: nodes as u64,
            node_cache_limit: limit as u64,
            node_cache_idle: state.info.idle_cache_nodes as u64,
            spare_pages: state.info.spare_pages.len() as u64,
            releases: state.info.memory_releases,
        }
    }

    /// Gives back memory an idle filesystem does not need: shrinks the
    /// node cache to `MountOptions::idle_cache_nodes`, frees the spare page
    /// buffers and the spare room of the inode table. Everything comes
    /// back on use (from disk, or newly allocated), so this only costs the
    /// next requests some reads; the mount calls it once it has been idle
    /// a while (docs/MEMORY.md). Returning freed memory to the system is
    /// the caller's (glibc's malloc_trim).
    pub fn release_memory(&self) {
        let target = {
            let mut state = self.lock();
            state.info.spare_pages.release();
            for root in state.subvols.iter_mut() {
                root.inodes.shrink_to_fit();
            }
            state.info.memory_releases += 1;
            state.info.idle_cache_nodes
        };
        self.shared.store.shrink_cache(target);
    }

    /// Makes everything durable.
    pub fn sync(&self) -> Result<()> {
        let _request = self.request();
        self.commit()
    }

    /// Runs `f` on the durable commit with commits held (docs/DUP.md,
    /// "Scrub"): `f` gets the device, the durable superblock, and why the
    /// commit's blocks may not be rewritten now (`None` if they may). For
    /// `scrub::scrub_filesystem`, which lives above this layer.
    ///
    /// Holds the commit lock throughout: with no commit, nothing the
    /// durable commit uses can be freed and reused (what the running
    /// transaction frees stays pinned until its commit), so a rewrite of
    /// one of its blocks cannot land on a block in new use. Requests,
    /// writeback and fsyncs through the log go on; commits (periodic,
    /// `sync`, fsync fallbacks, reclaim) wait until `f` returns. The node
    /// cache holds only nodes decoded from a good copy, so rewriting a bad
    /// copy with the good bytes leaves it right.
    pub fn with_durable_commit<R>(
        &self,
        f: impl FnOnce(&D, &Superblock, Option<&str>) -> R,
    ) -> Result<R> {
        self.shared.check_not_poisoned()?;
        let _commit = self
            .shared
            .commit_lock
            .lock()
            .expect("commit lock poisoned");
        let (superblock, no_rewrite) = {
            let state = self.lock();
            if state.info.shut_down {
                return Err(shut_down_error());
            }
            let no_rewrite = if let Some(why) = &state.info.failed {
                Some(format!(
                    "the filesystem is read-only after an earlier failure: {why}"
                ))
            } else if state.info.options.read_only {
                Some("the filesystem is mounted read-only".to_string())
            } else {
                None
            };
            (state.info.superblock.clone(), no_rewrite)
        };
        Ok(f(
            self.shared.store.device().as_ref(),
            &superblock,
            no_rewrite.as_deref(),
        ))
    }

    /// Creates subvolume `name` in directory `parent` and commits
    /// (docs/SNAPSHOTS.md, step 6): returns its id. A log never holds the
    /// link, so the create is durable only through this commit.
    pub fn create_subvolume(&self, parent: u64, name: &[u8], uid: u32, gid: u32) -> Result<u64> {
        let _request = self.request();
        let id = self.change_with(
            |_| Ok(Need::items(10)),
            |s| s.create_subvolume(parent, name, uid, gid),
        )?;
        self.commit()?;
        Ok(id)
    }

    /// Snapshots subvolume `source` as `name` in directory `dest_dir` (an
    /// external inode number), read-only if asked, and returns the new
    /// subvolume's id once the commit that made it is durable: every
    /// snapshot commits, as btrfs's does (docs/SNAPSHOTS.md (c)). The
    /// snapshot is the source as that commit's seal found it, with every
    /// write that completed before this call.
    pub fn create_snapshot(
        &self,
        source: u64,
        dest_dir: u64,
        name: &[u8],
        readonly: bool,
    ) -> Result<u64> {
        let _request = self.request();
        let id = self.change_with(
            |s| s.snapshot_need(source),
            |s| s.queue_snapshot(source, dest_dir, name, readonly),
        )?;
        self.commit()?;
        match self.lock().info.refused_snapshots.remove(&id) {
            Some(refused) => Err(refused),
            None => Ok(id),
        }
    }

    /// Deletes the subvolume linked as `name` in directory `parent`
    /// (docs/SNAPSHOTS.md (d)) and returns its id: the name is gone at
    /// once, durably at the next commit (`delete -c` commits after); the
    /// cleaner frees its tree in the background. EPERM for the default
    /// subvolume, ENOTEMPTY while it holds other subvolumes' links, EINVAL
    /// for a name that is no subvolume. Permissions are the caller's to
    /// check (as for every call of this API).
    pub fn delete_subvolume(&self, parent: u64, name: &[u8]) -> Result<u64> {
        let _request = self.request();
        // It frees space in the end: it may use the global reserve.
        self.change_with(
            |_| Ok(Need::urgent_items(8)),
            |s| s.delete_subvolume(parent, name),
        )
    }

    /// Runs the cleaner for one transaction (a bounded part of the drop of
    /// deleted subvolumes, then a commit), as the background worker does;
    /// returns whether deleted subvolumes remain that it may drop (not
    /// those whose inodes are held: [`held_deleted_subvolumes`](Self::held_deleted_subvolumes)).
    pub fn run_cleaner(&self) -> Result<bool> {
        self.shared.check_not_poisoned()?;
        self.shared.clean_one_transaction()
    }

    /// The deleted subvolumes whose trees the cleaner has not finished
    /// dropping, by id: those it may drop, and those it waits for because
    /// inodes of them are held ([`open_inode`](Self::open_inode)).
    pub fn deleted_subvolumes(&self) -> Vec<u64> {
        self.lock().dead_subvolumes()
    }

    /// The deleted subvolumes the cleaner waits for: inodes of them are
    /// held, and keep working until their last
    /// [`release`](Self::release) or [`forget`](Self::forget)
    /// (docs/SNAPSHOTS.md (d) step 3).
    pub fn held_deleted_subvolumes(&self) -> Vec<u64> {
        self.lock().held_deleted_subvolumes()
    }

    /// The names (directory, name) of the held inodes of deleted
    /// subvolume `id`, its root directory left out; empty for any other
    /// subvolume. The FUSE adapter makes the kernel drop its entries of
    /// them after a delete, so that the kernel forgets each inode at its
    /// last close, as btrfs drops a deleted subvolume's dentries then
    /// (`btrfs_dentry_delete`).
    pub fn held_names_in_deleted_subvolume(&self, id: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        let _request = self.request();
        self.read(|s| s.held_names_in_deleted(id))
    }

    /// The live subvolumes, tree 5 first.
    pub fn list_subvolumes(&self) -> Result<Vec<SubvolInfo>> {
        let _request = self.request();
        self.read(|s| s.list_subvolumes())
    }

    /// The subvolume a mount without `subvol=` shows (5 unless set).
    pub fn default_subvolume(&self) -> Result<u64> {
        let _request = self.request();
        self.read(|s| s.default_subvolume())
    }

    pub fn set_default_subvolume(&self, id: u64) -> Result<()> {
        let _request = self.request();
        self.change(|s| s.set_default_subvolume(id))
    }

    /// Makes subvolume `id` read-only or read-write and commits, as
    /// btrfs's `BTRFS_IOC_SUBVOL_SETFLAGS` does: from the return on, every
    /// change in it is EROFS (or allowed again).
    pub fn set_subvolume_readonly(&self, id: u64, readonly: bool) -> Result<()> {
        let _request = self.request();
        self.change_with(
            |_| Ok(Need::items(1)),
            |s| s.set_subvolume_readonly(id, readonly),
        )?;
        self.commit()
    }

    /// Records that subvolume `id` was received from a send stream
    /// (btrfs's `BTRFS_IOC_SET_RECEIVED_SUBVOL`, docs/SEND.md): its
    /// `received_uuid`, `stransid` and `stime` become the sender's, its
    /// `rtransid` and `rtime` this transaction and now; then commits.
    /// EROFS on a read-only subvolume (receive sets the flag after this).
    /// Returns the rtransid and rtime.
    pub fn set_received_subvolume(
        &self,
        id: u64,
        received_uuid: [u8; 16],
        stransid: u64,
        stime: Timespec,
    ) -> Result<(u64, Timespec)> {
        let _request = self.request();
        let now = Timespec::now();
        let rtransid = self.change_with(
            |_| Ok(Need::items(1)),
            |s| s.set_received_subvolume(id, received_uuid, stransid, stime, now),
        )?;
        self.commit()?;
        Ok((rtransid, now))
    }

    /// Writes the send stream (btrfs's version 1, docs/SEND.md "Design:
    /// send") of read-only subvolume `snapshot` to `out`: full, or
    /// incremental against read-only subvolume `options.parent`.
    /// `progress` is called after each inode with the running totals.
    /// EPERM ([`Error::Refused`]) for a subvolume that is not read-only,
    /// NotFound for an unknown id, `Error::Io` for a failed write to
    /// `out`. While it runs, neither subvolume can be deleted or made
    /// writable (EPERM, as btrfs). The trees are read without the state
    /// lock; file data through the checked read path, as `read_file`.
    pub fn send(
        &self,
        snapshot: u64,
        options: &SendOptions,
        out: &mut dyn std::io::Write,
        progress: &mut dyn FnMut(&SendStats),
    ) -> Result<SendStats> {
        let _request = self.request();
        let (roots, _hold) = self.hold_for_send(snapshot, options.parent)?;
        let source = SendSource {
            fs: self,
            subvol: snapshot,
        };
        send::write_stream(&roots, options, &source, &source, out, progress)
    }

    /// The roots a send reads, held against delete and `ro=false` until
    /// the hold drops; commits first when either tree has changes not yet
    /// on disk (their nodes must be readable without the state lock).
    fn hold_for_send(
        &self,
        snapshot: u64,
        parent: Option<u64>,
    ) -> Result<(send::SendRoots, SendHold<'_, D>)> {
        for attempt in 0..2 {
            let mut state = self.lock();
            let (roots, durable) = state.send_roots(snapshot, parent)?;
            if durable {
                let ids: Vec<u64> = std::iter::once(snapshot).chain(parent).collect();
                for id in &ids {
                    *state.info.sending.entry(*id).or_default() += 1;
                }
                return Ok((roots, SendHold { fs: self, ids }));
            }
            drop(state);
            if attempt == 0 {
                self.commit()?;
            }
        }
        Err(Error::Refused(format!(
            "subvolume {snapshot} or its parent has changes that are not committed (a read-only mount cannot commit them)"
        )))
    }

    /// Adds a scrub's progress to the `scrub_nodes` and `scrub_data_bytes`
    /// counters, which [`Self::stats`] shows while it runs.
    pub fn count_scrub_progress(&self, nodes: u64, data_bytes: u64) {
        let mut state = self.lock();
        state.info.stats.scrub_nodes += nodes;
        state.info.stats.scrub_data_bytes += data_bytes;
    }

    /// Commits the running transaction (no-op when nothing changed).
    pub fn commit(&self) -> Result<()> {
        self.shared.check_not_poisoned()?;
        self.shared.commit()
    }

    /// Commits and closes. Inodes left without names (orphans kept for
    /// holders that are now gone) are freed first. Dropping a `Filesystem`
    /// does the same but can only log a failure; `close` reports it.
    pub fn close(mut self) -> Result<()> {
        self.close_inner()
    }

    fn close_inner(&mut self) -> Result<()> {
        self.closed = true;
        // After a panic inside the engine, what is in memory may be half
        // changed: write nothing (the next mount recovers from the disk).
        self.shared.check_not_poisoned()?;
        self.stop_worker();
        self.stop_flusher();
        let read_only = self.lock().info.options.read_only;
        if !read_only && self.lock().info.failed.is_none() {
            // Only a loaded root can have gained orphans since the mount
            // removed every subvolume's.
            self.change(|s| {
                s.for_each_root(|mut root| {
                    if !root.root.is_readonly() {
                        root.remove_orphans()?;
                    }
                    Ok(())
                })
            })?;
        }
        self.commit()
    }

    fn stop_worker(&mut self) {
        let worker = self
            .threads
            .get_mut()
            .expect("background threads lock poisoned")
            .worker
            .take();
        if let Some(worker) = worker {
            *self
                .shared
                .worker_stop
                .lock()
                .expect("worker lock poisoned") = true;
            self.shared.worker_wake.notify_all();
            let _ = worker.join();
        }
    }

    fn stop_flusher(&mut self) {
        let flusher = self
            .threads
            .get_mut()
            .expect("background threads lock poisoned")
            .flusher
            .take();
        if let Some(flusher) = flusher {
            self.lock().info.space.flusher_stop = true;
            self.shared.flusher_wake.notify_all();
            let _ = flusher.join();
        }
    }
}

/// Finishes the inodes a crash or an unclean stop left as orphans, in
/// every live subvolume (an open unlinked file's orphan item is in its own
/// subvolume's tree): loads each subvolume's root, one root-item read
/// each. A read-only subvolume never gains orphans; a deleted one's go
/// with its tree.
fn remove_orphans_of_every_subvolume<D: BlockDevice>(state: &mut FsState<D>) -> Result<()> {
    let ids: Vec<u64> = state.list_subvolumes()?.iter().map(|i| i.id).collect();
    for id in ids {
        let mut root = state.ctx(id)?;
        if !root.root.is_readonly() {
            root.remove_orphans()?;
        }
    }
    Ok(())
}

impl<D: BlockDevice + 'static> Drop for Filesystem<D> {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        if let Err(e) = self.close_inner() {
            eprintln!("birch: commit at close failed: {e}");
        }
    }
}

/// A send's hold on its subvolumes ([`Filesystem::send`]): released when
/// the send ends, also by an error or a panic.
struct SendHold<'a, D: BlockDevice + 'static> {
    fs: &'a Filesystem<D>,
    ids: Vec<u64>,
}

impl<D: BlockDevice + 'static> Drop for SendHold<'_, D> {
    fn drop(&mut self) {
        let mut state = self.fs.lock();
        for id in &self.ids {
            if let Some(n) = state.info.sending.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    state.info.sending.remove(id);
                }
            }
        }
    }
}

/// Where a send's nodes and data come from: the node store without the
/// state lock, and `read_file`'s checked path.
struct SendSource<'a, D: BlockDevice + 'static> {
    fs: &'a Filesystem<D>,
    subvol: u64,
}

impl<D: BlockDevice + 'static> send::NodeSource for SendSource<'_, D> {
    fn read_node(
        &self,
        bytenr: u64,
        expect: crate::btree::NodeExpectation,
    ) -> Result<Arc<crate::format::Node>> {
        self.fs.shared.store.read(bytenr, expect)
    }
}

impl<D: BlockDevice + 'static> send::DataSource for SendSource<'_, D> {
    fn read_data(&self, ino: u64, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.fs
            .read_file(InoSpace::join(self.subvol, ino), offset, len)
    }
}
