//! The `fuser::Filesystem` implementation.
//!
//! Inode lifetime follows the kernel's lookup count: every reply that hands
//! the kernel an inode (lookup, create, mkdir, mknod, symlink, link,
//! readdirplus entries) takes a hold on it in the engine, and `forget`
//! drops holds. An inode whose last name is removed lives (as an orphan)
//! until its last hold goes, so open files survive unlink without the
//! kernel sending open/release at all (we answer open with ENOSYS: the
//! kernel then stops asking and keeps its page cache across opens).

use crate::attr::{from_request_time, to_engine_ino, to_fuse_attr, to_fuse_ino};
use birch::device::BlockDevice;
use birch::fs::{
    Attr, FallocateMode, Filesystem, RenameFlags, SeekWhence, SetAttr, SetTime, XattrSetMode,
};
use fuser::{
    AccessFlags, Config, CopyFileRangeFlags, Errno, FileHandle, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, SessionACL, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// `_IO('b', 1)`: commit now (what `birch sync MOUNTPOINT` sends, since the
/// kernel does not pass syncfs to a plain FUSE mount).
pub const BIRCH_IOC_SYNC: u32 = (b'b' as u32) << 8 | 1;
/// `_IOR('X', 125, __u32)`: fstests' shutdown ioctl. From then on birch
/// writes nothing to the device and every call fails with EIO.
pub const XFS_IOC_GOINGDOWN: u32 = 0x8004_587d;
/// `_IOR('b', 2, [u8; 4096])`: the filesystem's counters as text
/// (`birch stats MOUNTPOINT`).
pub const BIRCH_IOC_STATS: u32 = 2 << 30 | 4096 << 16 | (b'b' as u32) << 8 | 2;

/// How the mount talks to the kernel. docs/FUSE.md gives the reason and the
/// measured effect of each default.
#[derive(Debug, Clone)]
pub struct FuseOptions {
    /// Threads reading requests (each with its own /dev/fuse fd).
    pub threads: usize,
    /// How long the kernel may trust a name -> inode answer, and an
    /// inode's attributes. Safe to make long: every change goes through
    /// this mount, so the kernel's caches never go stale behind its back.
    pub entry_ttl: Duration,
    pub attr_ttl: Duration,
    /// How long a "no such name" answer may be cached.
    pub negative_ttl: Duration,
    /// Let the kernel cache writes and send them in large batches. Off by
    /// default: the kernel then accepts writes before birch can reserve
    /// space for them (ENOSPC would surface only at write-back, after the
    /// write returned), and it writes a file's cached pages back
    /// synchronously at every close (docs/FUSE.md has the numbers).
    pub writeback_cache: bool,
    /// Answer open with ENOSYS so the kernel stops sending open/release.
    pub no_open: bool,
    pub allow_other: bool,
    pub read_only: bool,
    /// Shown as the mount's source in /proc/mounts.
    pub fsname: String,
    /// Mount as `fuseblk` on this block device (needs root): only then
    /// does the kernel pass syncfs(2) and sync(1) on to birch. `None`
    /// mounts plain `fuse`.
    pub block_device: Option<PathBuf>,
    /// Largest write request (bytes).
    pub max_write: u32,
    /// Background (readahead, writeback) requests the kernel may have queued.
    pub max_background: u16,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            threads: 8,
            entry_ttl: Duration::from_secs(3600),
            attr_ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(3600),
            writeback_cache: false,
            no_open: true,
            allow_other: true,
            read_only: false,
            fsname: "birch".into(),
            block_device: None,
            max_write: 1 << 20,
            max_background: 128,
        }
    }
}

impl FuseOptions {
    pub(crate) fn session_config(&self) -> Config {
        let mut options = vec![
            MountOption::FSName(self.fsname.clone()),
            // As a kernel option, not MountOption::Subtype: fuser's direct
            // mount(2) (as root) drops Subtype and the mount showed up as
            // plain "fuse" in /proc/mounts instead of "fuse.birch".
            // fusermount3 (unprivileged) takes "subtype=" the same way.
            MountOption::CUSTOM("subtype=birch".into()),
            MountOption::DefaultPermissions,
            MountOption::Dev,
            MountOption::Suid,
        ];
        options.push(if self.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        });
        let mut config = Config::default();
        config.mount_options = options;
        config.acl = if self.allow_other {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        config.n_threads = Some(self.threads.max(1));
        config.clone_fd = true;
        config
    }
}

/// What the mount's owner is told, or asked to do, beyond the engine.
pub trait MountControl: Send + Sync {
    /// An fsync or fsyncdir of `ino` succeeded and is about to be answered
    /// (`birch mount --write-log` records a mark here).
    fn fsync_answered(&self, _ino: u64) {}
    /// The shutdown ioctl: stop every write to the device, now.
    fn stop_device(&self) {}
}

/// A mount nobody watches.
pub struct NoControl;
impl MountControl for NoControl {}

pub struct BirchFuse<D: BlockDevice + 'static> {
    fs: Arc<Filesystem<D>>,
    options: FuseOptions,
    control: Arc<dyn MountControl>,
}

fn errno(e: &birch::Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(from_request_time(t)),
    }
}

/// Mode bits a write or truncate by an unprivileged user must clear:
/// set-user-ID always, set-group-ID when group-executable (otherwise it
/// marks mandatory locking, not privilege).
fn killed_mode(perm: u16) -> Option<u32> {
    let perm = u32::from(perm);
    let mut kill = libc::S_ISUID;
    if perm & libc::S_IXGRP != 0 {
        kill |= libc::S_ISGID;
    }
    (perm & kill != 0).then_some(perm & !kill)
}

impl<D: BlockDevice + 'static> BirchFuse<D> {
    pub fn new(
        fs: Arc<Filesystem<D>>,
        options: FuseOptions,
        control: Arc<dyn MountControl>,
    ) -> Self {
        BirchFuse {
            fs,
            options,
            control,
        }
    }

    fn reply_fsync(&self, ino: u64, result: birch::Result<()>, reply: ReplyEmpty) {
        if result.is_ok() {
            self.control.fsync_answered(ino);
        }
        Self::reply_empty(result, reply);
    }

    /// The counters `birch stats` prints, as text.
    fn stats_text(&self) -> String {
        format!(
            "{:#?}\n{:#?}\n{:#?}\n",
            self.fs.stats(),
            self.fs.log_stats(),
            self.fs.space_stats()
        )
    }

    /// Replies with an inode handed to the kernel, taking the hold that the
    /// kernel's matching forget will drop.
    fn reply_entry(&self, result: birch::Result<Attr>, reply: ReplyEntry) {
        match result.and_then(|attr| self.fs.open_inode(attr.ino).map(|()| attr)) {
            Ok(attr) => reply.entry(
                &self.options.entry_ttl,
                &to_fuse_attr(&attr),
                Generation(attr.generation),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn reply_empty(result: birch::Result<()>, reply: ReplyEmpty) {
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Owner and group of a new inode in `parent`: the caller's, except
    /// that a set-group-ID directory passes on its group (and, to new
    /// directories, the set-group-ID bit).
    fn new_owner(&self, req: &Request, parent: u64, mode: u32) -> birch::Result<(u32, u32, u32)> {
        let dir = self.fs.getattr(parent)?;
        if u32::from(dir.perm) & libc::S_ISGID != 0 {
            let mode = if mode & libc::S_IFMT == libc::S_IFDIR {
                mode | libc::S_ISGID
            } else {
                mode
            };
            Ok((req.uid(), dir.gid, mode))
        } else {
            Ok((req.uid(), req.gid(), mode))
        }
    }

    fn readdir_common(
        &self,
        ino: INodeNo,
        offset: u64,
        mut add: impl FnMut(u64, u64, fuser::FileType, &[u8], Option<&Attr>) -> bool,
        plus: bool,
    ) -> birch::Result<()> {
        let dir = to_engine_ino(ino.0);
        // Offsets: "." is entry 0 -> next 1, ".." is 1 -> next 2, then each
        // entry's next offset is its dir index + 1 (indexes start at 2).
        if offset < 1 {
            let attr = if plus {
                Some(self.fs.getattr(dir)?)
            } else {
                None
            };
            if add(dir, 1, fuser::FileType::Directory, b".", attr.as_ref()) {
                return Ok(());
            }
        }
        if offset < 2 {
            let parent = self.fs.parent_of_dir(dir)?;
            let attr = if plus {
                Some(self.fs.getattr(parent)?)
            } else {
                None
            };
            if add(parent, 2, fuser::FileType::Directory, b"..", attr.as_ref()) {
                return Ok(());
            }
        }
        let mut next = offset.max(2);
        loop {
            let batch = self.fs.readdir(dir, next, 128)?;
            if batch.is_empty() {
                return Ok(());
            }
            for e in batch {
                next = e.next_offset;
                let kind = crate::attr::to_fuse_type(e.file_type);
                if plus {
                    // The entry may vanish between listing and stat (a
                    // concurrent unlink): skip it rather than fail the listing.
                    let attr = match self.fs.getattr(e.ino) {
                        Ok(a) => a,
                        Err(birch::Error::NotFound) => continue,
                        Err(err) => return Err(err),
                    };
                    if add(e.ino, e.next_offset, kind, &e.name, Some(&attr)) {
                        return Ok(());
                    }
                } else if add(e.ino, e.next_offset, kind, &e.name, None) {
                    return Ok(());
                }
            }
        }
    }
}

impl<D: BlockDevice + 'static> fuser::Filesystem for BirchFuse<D> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let mut wanted = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_HAS_IOCTL_DIR
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_NO_OPENDIR_SUPPORT;
        if self.options.writeback_cache {
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        if self.options.no_open {
            wanted |= InitFlags::FUSE_NO_OPEN_SUPPORT;
        }
        let offered = config.capabilities();
        let _ = config.add_capabilities(wanted & offered);
        let _ = config.set_max_write(self.options.max_write);
        let _ = config.set_max_readahead(self.options.max_write);
        let _ = config.set_max_background(self.options.max_background);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(to_engine_ino(parent.0), name.as_bytes()) {
            // A zero inode with a timeout is a cacheable "no such name".
            Err(birch::Error::NotFound) => {
                reply.entry(&self.options.negative_ttl, &negative_entry(), Generation(0))
            }
            other => self.reply_entry(other, reply),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if ino != INodeNo::ROOT {
            let _ = self.fs.forget(ino.0, nlookup);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(to_engine_ino(ino.0)) {
            Ok(a) => reply.attr(&self.options.attr_ttl, &to_fuse_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let ino = to_engine_ino(ino.0);
        let result = (|| {
            let mut changes = SetAttr {
                mode,
                uid,
                gid,
                size,
                atime: atime.map(set_time),
                mtime: mtime.map(set_time),
                ctime: ctime.map(from_request_time),
            };
            // With HANDLE_KILLPRIV_V2 the kernel leaves clearing set-ID bits
            // to us: chown of a non-directory always clears them, truncate
            // by an unprivileged caller does.
            if changes.mode.is_none()
                && (uid.is_some() || gid.is_some() || (size.is_some() && req.uid() != 0))
            {
                let current = self.fs.getattr(ino)?;
                if current.file_type != birch::format::FileType::Directory {
                    changes.mode = killed_mode(current.perm);
                }
            }
            self.fs.setattr(ino, &changes)
        })();
        match result {
            Ok(a) => reply.attr(&self.options.attr_ttl, &to_fuse_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(to_engine_ino(ino.0)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let parent = to_engine_ino(parent.0);
        let result = self
            .new_owner(req, parent, mode)
            .and_then(|(uid, gid, mode)| {
                self.fs
                    .mknod(parent, name.as_bytes(), mode, uid, gid, u64::from(rdev))
            });
        self.reply_entry(result, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let parent = to_engine_ino(parent.0);
        let result = self
            .new_owner(req, parent, libc::S_IFDIR | mode)
            .and_then(|(uid, gid, mode)| self.fs.mkdir(parent, name.as_bytes(), mode, uid, gid));
        self.reply_entry(result, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::reply_empty(
            self.fs.unlink(to_engine_ino(parent.0), name.as_bytes()),
            reply,
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::reply_empty(
            self.fs.rmdir(to_engine_ino(parent.0), name.as_bytes()),
            reply,
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let parent = to_engine_ino(parent.0);
        let result = self
            .new_owner(req, parent, libc::S_IFLNK)
            .and_then(|(uid, gid, _)| {
                self.fs.symlink(
                    parent,
                    link_name.as_bytes(),
                    target.as_os_str().as_bytes(),
                    uid,
                    gid,
                )
            });
        self.reply_entry(result, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let known = fuser::RenameFlags::RENAME_NOREPLACE | fuser::RenameFlags::RENAME_EXCHANGE;
        if !known.contains(flags) {
            // RENAME_WHITEOUT and anything newer.
            return reply.error(Errno::EINVAL);
        }
        let flags = RenameFlags {
            no_replace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
        };
        Self::reply_empty(
            self.fs.rename(
                to_engine_ino(parent.0),
                name.as_bytes(),
                to_engine_ino(newparent.0),
                newname.as_bytes(),
                flags,
            ),
            reply,
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.reply_entry(
            self.fs.link(
                to_engine_ino(ino.0),
                to_engine_ino(newparent.0),
                newname.as_bytes(),
            ),
            reply,
        );
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.options.no_open {
            reply.error(Errno::ENOSYS);
        } else {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self
            .fs
            .read_file(to_engine_ino(ino.0), offset, size as usize)
        {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let ino = to_engine_ino(ino.0);
        let result = (|| {
            if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) && req.uid() != 0 {
                if let Some(mode) = killed_mode(self.fs.getattr(ino)?.perm) {
                    self.fs.setattr(
                        ino,
                        &SetAttr {
                            mode: Some(mode),
                            ..Default::default()
                        },
                    )?;
                }
            }
            // A write-back of cached pages: with the writeback cache the
            // kernel owns mtime and ctime (it set them at write(2) time and
            // sends them in a SETATTR when they changed), so the engine's
            // "now" at write-back must not replace them: it would surface
            // once the kernel drops the inode (after a remount, say) as an
            // mtime other than the one stat(2) showed.
            let kernel_times =
                self.options.writeback_cache && write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
            let before = if kernel_times {
                Some(self.fs.getattr(ino)?)
            } else {
                None
            };
            let written = self.fs.write_file(ino, offset, data)?;
            if let Some(before) = before {
                let times = SetAttr {
                    mtime: Some(SetTime::At(before.mtime)),
                    ctime: Some(before.ctime),
                    ..Default::default()
                };
                self.fs.setattr(ino, &times)?;
            }
            Ok(written)
        })();
        match result {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to do at close: durability is fsync's job. ENOSYS makes
        // the kernel stop sending flush on every close.
        reply.error(Errno::ENOSYS);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let ino = to_engine_ino(ino.0);
        self.reply_fsync(ino, self.fs.fsync(ino, datasync), reply);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let result = self.readdir_common(
            ino,
            offset,
            |entry_ino, next, kind, name, _| {
                reply.add(to_fuse_ino(entry_ino), next, kind, OsStr::from_bytes(name))
            },
            false,
        );
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let ttl = self.options.entry_ttl;
        let fs = &self.fs;
        let result = self.readdir_common(
            ino,
            offset,
            |entry_ino, next, _kind, name, attr| {
                let attr = attr.expect("readdirplus passes attributes");
                let full = reply.add(
                    to_fuse_ino(entry_ino),
                    next,
                    OsStr::from_bytes(name),
                    &ttl,
                    &to_fuse_attr(attr),
                    Generation(attr.generation),
                );
                // The kernel counts a lookup for each entry it accepted,
                // except "." and "..".
                if !full && name != b"." && name != b".." {
                    let _ = fs.open_inode(entry_ino);
                }
                full
            },
            true,
        );
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let ino = to_engine_ino(ino.0);
        self.reply_fsync(ino, self.fs.fsync(ino, datasync), reply);
    }

    /// syncfs(2), sync(1), and the sync a remount does before it changes
    /// the mount's flags: commit, and answer once the commit is durable.
    /// Only fuseblk connections get this (docs/FUSE.md).
    fn syncfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyEmpty) {
        Self::reply_empty(self.fs.sync(), reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_available,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if let Err(e) = supported_xattr_namespace(name) {
            return reply.error(e);
        }
        let mode = match flags {
            0 => XattrSetMode::CreateOrReplace,
            libc::XATTR_CREATE => XattrSetMode::Create,
            libc::XATTR_REPLACE => XattrSetMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        Self::reply_empty(
            self.fs
                .setxattr(to_engine_ino(ino.0), name.as_bytes(), value, mode),
            reply,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if let Err(e) = supported_xattr_namespace(name) {
            return reply.error(e);
        }
        match self.fs.getxattr(to_engine_ino(ino.0), name.as_bytes()) {
            Ok(value) if size == 0 => reply.size(value.len() as u32),
            Ok(value) if value.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(value) => reply.data(&value),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(to_engine_ino(ino.0)) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                if size == 0 {
                    reply.size(buf.len() as u32);
                } else if buf.len() > size as usize {
                    reply.error(Errno::ERANGE);
                } else {
                    reply.data(&buf);
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if let Err(e) = supported_xattr_namespace(name) {
            return reply.error(e);
        }
        Self::reply_empty(
            self.fs.removexattr(to_engine_ino(ino.0), name.as_bytes()),
            reply,
        );
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel checks permissions itself.
        reply.error(Errno::ENOSYS);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let parent = to_engine_ino(parent.0);
        let result = self
            .new_owner(req, parent, mode)
            .and_then(|(uid, gid, mode)| self.fs.mknod(parent, name.as_bytes(), mode, uid, gid, 0))
            .and_then(|attr| self.fs.open_inode(attr.ino).map(|()| attr));
        match result {
            Ok(attr) => reply.created(
                &self.options.entry_ttl,
                &to_fuse_attr(&attr),
                Generation(attr.generation),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        match cmd {
            BIRCH_IOC_SYNC => match self.fs.sync() {
                Ok(()) => reply.ioctl(0, &[]),
                Err(e) => reply.error(errno(&e)),
            },
            BIRCH_IOC_STATS => {
                let text = self.stats_text();
                let n = text.len().min(out_size as usize);
                reply.ioctl(0, &text.as_bytes()[..n]);
            }
            XFS_IOC_GOINGDOWN => {
                // Whatever the flags (FUSE passes none for this _IOR
                // command), nothing more reaches the device: the next mount
                // sees what a power cut here would leave.
                self.control.stop_device();
                self.fs.shut_down();
                reply.ioctl(0, &[]);
            }
            _ => reply.error(Errno::ENOTTY),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mode = match mode {
            0 => FallocateMode::Allocate,
            libc::FALLOC_FL_KEEP_SIZE => FallocateMode::AllocateKeepSize,
            m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => {
                FallocateMode::PunchHole
            }
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        Self::reply_empty(
            self.fs
                .fallocate(to_engine_ino(ino.0), offset, length, mode),
            reply,
        );
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let whence = match whence {
            libc::SEEK_DATA => SeekWhence::Data,
            libc::SEEK_HOLE => SeekWhence::Hole,
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        match self.fs.seek(to_engine_ino(ino.0), offset, whence) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // The kernel falls back to read + write.
        reply.error(Errno::ENOSYS);
    }
}

/// FUSE passes every xattr name through, where a kernel filesystem
/// answers EOPNOTSUPP for a name outside the namespaces it implements.
/// birch stores user., trusted. and security. attributes; system.* would
/// be POSIX ACLs, which birch does not implement (stored as plain values
/// they would let setfacl succeed with no effect on permissions).
fn supported_xattr_namespace(name: &OsStr) -> Result<(), Errno> {
    const NAMESPACES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];
    if NAMESPACES.iter().any(|ns| name.as_bytes().starts_with(ns)) {
        Ok(())
    } else {
        Err(Errno::EOPNOTSUPP)
    }
}

/// The attributes of a negative entry: only `ino == 0` matters.
fn negative_entry() -> fuser::FileAttr {
    let epoch = std::time::UNIX_EPOCH;
    fuser::FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: epoch,
        mtime: epoch,
        ctime: epoch,
        crtime: epoch,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}
