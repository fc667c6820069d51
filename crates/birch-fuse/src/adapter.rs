//! The `fuser::Filesystem` implementation.
//!
//! Inode lifetime follows the kernel's lookup count: every reply that hands
//! the kernel an inode (lookup, create, mkdir, mknod, symlink, link,
//! readdirplus entries) takes a hold on it in the engine, and `forget`
//! drops holds. An inode whose last name is removed lives (as an orphan)
//! until its last hold goes, so open files survive unlink without the
//! kernel sending open/release at all (we answer open with ENOSYS: the
//! kernel then stops asking and keeps its page cache across opens).

use crate::attr::{from_request_time, NodeIds};
use crate::caller::{Caller, ProcessCreds};
use crate::listing::{self, Listed};
use crate::remount::RemountWatch;
use crate::requests::RequestCounts;
use crate::scrub::BIRCH_IOC_SCRUB;
use crate::send::{self, BIRCH_IOC_SEND};
use crate::stats::{self, ImageInfo, StatsReport};
use crate::subvol;
use birch::device::BlockDevice;
use birch::format::{tree_id, MAX_SUBVOL_INO, ROOT_DIR_INO, SECTOR_SIZE};
use birch::fs::{
    inode_flags, AtimeUpdates, Attr, FallocateMode, Filesystem, InoSpace, RenameFlags, SeekWhence,
    SendOptions, SetAttr, SetTime, WhiteoutOwner, XattrSetMode,
};
use fuser::{
    AccessFlags, Config, CopyFileRangeFlags, Errno, FileHandle, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyBmap,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyStatx, ReplyWrite, ReplyXattr, Request, SessionACL,
    TimeOrNow, Transport, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// `_IO('b', 1)`: commit now (what `birch sync MOUNTPOINT` sends, since the
/// kernel does not pass syncfs to a plain FUSE mount).
pub const BIRCH_IOC_SYNC: u32 = (b'b' as u32) << 8 | 1;
/// `_IOR('X', 125, __u32)`: fstests' shutdown ioctl. From then on birch
/// writes nothing to the device and every call fails with EIO.
pub const XFS_IOC_GOINGDOWN: u32 = 0x8004_587d;
/// The largest reply the stats ioctl takes: the most an ioctl number can
/// encode (14 bits). A report is about 2.7 KiB (a real mount: 2,653 bytes).
pub const BIRCH_STATS_MAX: usize = (1 << 14) - 1;
/// `_IOR('b', 2, [u8; BIRCH_STATS_MAX])`: the mount's [`StatsReport`],
/// encoded (`birch stats MOUNTPOINT`).
pub const BIRCH_IOC_STATS: u32 = 2 << 30 | (BIRCH_STATS_MAX as u32) << 16 | (b'b' as u32) << 8 | 2;
/// `FS_IOC_GETFLAGS` / `FS_IOC_SETFLAGS` (`_IOR/_IOW('f', 1/2, long)`):
/// chattr and lsattr. The kernel sends them from its fileattr code with a
/// 4-byte argument whatever the `long` in the number says.
const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
/// `FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR` (`struct fsxattr`, 28 bytes):
/// the kernel reads the old flags this way before every FS_IOC_SETFLAGS,
/// and xfs_io uses them.
const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
/// `fsx_xflags` bits of the flags birch honours, with their inode flag
/// (the kernel's fileattr_fill_xflags). `D` has no xflag: FS_IOC_FSSETXATTR
/// leaves it as it is.
const XFLAGS: [(u32, u32); 5] = [
    (0x8, inode_flags::IMMUTABLE), // FS_XFLAG_IMMUTABLE
    (0x10, inode_flags::APPEND),   // FS_XFLAG_APPEND
    (0x20, inode_flags::SYNC),     // FS_XFLAG_SYNC
    (0x40, inode_flags::NOATIME),  // FS_XFLAG_NOATIME
    (0x80, inode_flags::NODUMP),   // FS_XFLAG_NODUMP
];

/// The `fsx_xflags` of inode flags `flags`.
fn xflags_of(flags: u32) -> u32 {
    XFLAGS
        .iter()
        .filter(|&&(_, flag)| flags & flag != 0)
        .fold(0, |x, &(xflag, _)| x | xflag)
}

/// The inode flags of `fsx_xflags`, or `None` for an xflag birch does not
/// honour.
fn flags_of_xflags(xflags: u32) -> Option<u32> {
    let known = XFLAGS.iter().fold(0, |x, &(xflag, _)| x | xflag);
    (xflags & !known == 0).then(|| {
        XFLAGS
            .iter()
            .filter(|&&(xflag, _)| xflags & xflag != 0)
            .fold(0, |f, &(_, flag)| f | flag)
    })
}

/// Which way requests travel between the kernel and birch (`-o
/// transport=`; docs/FUSE.md, "Transport").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportChoice {
    /// io_uring where the kernel offers it, /dev/fuse otherwise.
    Auto,
    /// Read and write on /dev/fuse only.
    DevFuse,
    /// io_uring or no mount.
    IoUring,
}

/// How the mount talks to the kernel. docs/FUSE.md gives the reason and the
/// measured effect of each default.
#[derive(Debug, Clone)]
pub struct FuseOptions {
    /// Threads reading requests (each with its own /dev/fuse fd).
    pub threads: usize,
    /// io_uring or /dev/fuse.
    pub transport: TransportChoice,
    /// With io_uring: ring entries per CPU queue, each served by a thread
    /// of its own, so that this many requests from one CPU are served at
    /// once (an fsync waiting for the device holds only its own entry).
    pub uring_entries: usize,
    /// How long the kernel may trust a name -> inode answer, and an
    /// inode's attributes. Safe to make long: every change goes through
    /// this mount, so the kernel's caches never go stale behind its back.
    pub entry_ttl: Duration,
    pub attr_ttl: Duration,
    /// How long a "no such name" answer may be cached.
    pub negative_ttl: Duration,
    /// Let the kernel cache writes and send them in large batches. Off by
    /// default (docs/FUSE.md, "The writeback cache", has the numbers): the
    /// kernel then accepts writes before birch can reserve space for them
    /// (ENOSPC surfaces only at write-back, reported once to the next
    /// fsync or close, and the refused ranges are lost); it writes a
    /// file's cached pages back synchronously at every close; and it
    /// sends a SETATTR with its own times for every rename, link or
    /// unlink of a regular file and before many fsyncs, which costs more
    /// requests than the merged writes save outside bulk writes.
    pub writeback_cache: bool,
    /// Answer open with ENOSYS so the kernel stops sending open/release.
    pub no_open: bool,
    /// After this long without requests the daemon gives memory back
    /// (docs/MEMORY.md); `None`: never.
    pub memory_idle: Option<Duration>,
    pub allow_other: bool,
    /// Mount read-only; the engine is then switched to read-write when
    /// the mount is remounted so (remount.rs).
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
    /// mount(8)'s per-mount flags, passed to the kernel. The defaults are
    /// those of a mount by root from the command line: set-ID bits and
    /// device nodes honoured, programs may run. fusermount3 forces nosuid
    /// and nodev on for everyone else, so an unprivileged mount asks for
    /// them.
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
    /// `noatime` / `relatime` / `strictatime` (the engine applies it too:
    /// FUSE leaves atime updates to the server).
    pub atime: AtimeUpdates,
    /// `nodiratime`: listing a directory leaves its atime alone.
    pub nodiratime: bool,
    /// `sync`: every change is durable before it is answered.
    pub sync: bool,
    /// `dirsync`: every directory change is durable before it is answered.
    pub dirsync: bool,
    /// `subvol=` / `subvolid=`: the subvolume shown as the mount's root.
    pub subvolume: crate::subvol::SubvolumeChoice,
    /// `user_subvol_rm_allowed` (btrfs's option): a caller who is neither
    /// root nor the mount's owner may delete a subvolume through
    /// `BTRFS_IOC_SNAP_DESTROY` when it could rmdir the subvolume's root
    /// directory ([`may_destroy_subvolume`]).
    pub user_subvol_rm_allowed: bool,
    /// Offer idmapped mounts (FUSE_ALLOW_IDMAP) where the kernel can
    /// (Linux 6.12+; `-o idmap`). Off by default: the kernel then sends
    /// the caller's ids only with requests that create an inode, so the
    /// checks birch makes itself for a subvolume ioctl pass only
    /// administrators, and users would lose the subvolume rights btrfs
    /// gives them (docs/FUSE.md, "Idmapped mounts").
    pub idmap: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            threads: 8,
            transport: TransportChoice::Auto,
            uring_entries: 4,
            entry_ttl: Duration::from_secs(3600),
            attr_ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(3600),
            writeback_cache: false,
            no_open: true,
            memory_idle: Some(Duration::from_secs(10)),
            allow_other: true,
            read_only: false,
            fsname: "birch".into(),
            block_device: None,
            max_write: 1 << 20,
            max_background: 128,
            nosuid: false,
            nodev: false,
            noexec: false,
            atime: AtimeUpdates::Relative,
            nodiratime: false,
            sync: false,
            dirsync: false,
            subvolume: Default::default(),
            user_subvol_rm_allowed: false,
            idmap: false,
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
            // fuser's own default is nosuid,nodev; mount(8)'s, for root, is
            // suid,dev,exec: each is stated either way.
            if self.nosuid {
                MountOption::NoSuid
            } else {
                MountOption::Suid
            },
            if self.nodev {
                MountOption::NoDev
            } else {
                MountOption::Dev
            },
            if self.noexec {
                MountOption::NoExec
            } else {
                MountOption::Exec
            },
            if self.read_only {
                MountOption::RO
            } else {
                MountOption::RW
            },
        ];
        // The kernel's own atime flags matter little here (see `atime`),
        // but they show in /proc/mounts as the user asked. relatime is
        // mount(2)'s default; strictatime and nodiratime, which fuser
        // cannot pass, are set after the mount (`apply_mount_attributes`).
        if self.atime == AtimeUpdates::Never {
            options.push(MountOption::NoAtime);
        }
        // MS_SYNCHRONOUS makes the kernel send FSYNC after every write(2)
        // (and write back its cache first with `writeback_cache`); birch
        // makes the other changes durable itself (`settle`). MS_DIRSYNC
        // has no effect in FUSE's kernel side: it is shown, birch does
        // the work.
        if self.sync {
            options.push(MountOption::Sync);
        }
        if self.dirsync {
            options.push(MountOption::DirSync);
        }
        let mut config = Config::default();
        config.mount_options = options;
        config.acl = if self.allow_other {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        config.n_threads = Some(self.threads.max(1));
        config.clone_fd = true;
        config.io_uring_entries_per_queue = match self.transport {
            TransportChoice::DevFuse => None,
            TransportChoice::Auto | TransportChoice::IoUring => Some(self.uring_entries.max(1)),
        };
        config
    }
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}
const MOUNT_ATTR_ATIME_MASK: u64 = 0x70;
const MOUNT_ATTR_STRICTATIME: u64 = 0x20;
const MOUNT_ATTR_NODIRATIME: u64 = 0x80;

impl FuseOptions {
    /// Sets the per-mount flags fuser's mount cannot pass (`strictatime`,
    /// `nodiratime`) on the live mount at `mountpoint`, as mount(8) does.
    pub(crate) fn apply_mount_attributes(&self, mountpoint: &Path) -> std::io::Result<()> {
        let mut attr = MountAttr {
            attr_set: 0,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        if self.atime == AtimeUpdates::Always {
            attr.attr_clr |= MOUNT_ATTR_ATIME_MASK;
            attr.attr_set |= MOUNT_ATTR_STRICTATIME;
        }
        if self.nodiratime {
            attr.attr_set |= MOUNT_ATTR_NODIRATIME;
        }
        if attr.attr_set == 0 {
            return Ok(());
        }
        let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a valid C string and a mount_attr of the size passed.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                path.as_ptr(),
                0,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// What the mount's owner is told, or asked to do, beyond the engine.
pub trait MountControl: Send + Sync {
    /// An fsync or fsyncdir of `ino` succeeded and is about to be answered
    /// (`birch mount --write-log` records a mark here).
    fn fsync_answered(&self, _ino: u64) {}
    /// The shutdown ioctl: stop every write to the device, now.
    fn stop_device(&self) {}
    /// The image being served, for `birch stats`.
    fn image(&self) -> Option<ImageInfo> {
        None
    }
}

/// A mount nobody watches.
pub struct NoControl;
impl MountControl for NoControl {}

pub struct BirchFuse<D: BlockDevice + 'static> {
    fs: Arc<Filesystem<D>>,
    options: FuseOptions,
    control: Arc<dyn MountControl>,
    /// Requests received, by opcode (`birch stats`).
    requests: Arc<RequestCounts>,
    /// When the kernel's INIT arrived: the mount went live (`birch stats`'
    /// uptime and rates).
    mounted_at: Instant,
    /// The capabilities both we and the kernel wanted at INIT: what is
    /// really in force, as opposed to what we asked for.
    negotiated: InitFlags,
    /// Set for a mount started read-only: switches the engine to
    /// read-write once the kernel's mount is remounted so.
    remount: Option<Arc<RemountWatch>>,
    /// How requests arrive, known once the session's INIT is done (after
    /// this adapter was handed to the session); shown by `birch stats`.
    transport: Arc<OnceLock<Transport>>,
    /// Tells the kernel to drop what it caches of an inode; set by
    /// [`serve`](crate::serve) once the session exists (after this adapter
    /// was handed to it).
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// Set once the engine's failure (docs/IO-ERRORS.md) has been written
    /// to the daemon's stderr: the operator hears of it once, not at every
    /// refused request.
    failure_reported: AtomicBool,
    /// The uid that serves the mount (the kernel's `user_id=`): root for
    /// root's mounts, the user for an unprivileged one. It may shut down
    /// and scrub its own mount ([`may_administer`]).
    owner: u32,
    /// Node id 1 is the mounted subvolume's root directory.
    ids: NodeIds,
}

/// Who may send an ioctl (docs/FUSE.md, "Who may send which ioctl").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IoctlAccess {
    /// Anyone who can open a file of the mount: as syncfs(2), statfs(2)
    /// and lsattr are on kernel filesystems.
    Anyone,
    /// Changes an inode's flags: the kernel checks ownership and
    /// CAP_LINUX_IMMUTABLE before it sends the request.
    CheckedByKernel,
    /// CAP_SYS_ADMIN on xfs, ext4 and btrfs: here root or the mount's
    /// owner ([`may_administer`]).
    Administrator,
    /// The handler checks the caller against the inode, as btrfs does:
    /// subvolume create needs write and search permission on the
    /// directory, a snapshot that and ownership of the source's root
    /// directory, setting the read-only flag ownership of the subvolume's
    /// root directory, a directory's path from INO_LOOKUP CAP_SYS_ADMIN,
    /// deleting a subvolume root or the mount's owner, or with
    /// `user_subvol_rm_allowed` btrfs's checks.
    CheckedByBirch,
}

fn ioctl_access(cmd: u32) -> IoctlAccess {
    match cmd {
        XFS_IOC_GOINGDOWN
        | BIRCH_IOC_SCRUB
        | BIRCH_IOC_SEND
        | subvol::BTRFS_IOC_DEFAULT_SUBVOL
        | subvol::BTRFS_IOC_SET_RECEIVED_SUBVOL => IoctlAccess::Administrator,
        FS_IOC_SETFLAGS | FS_IOC_FSSETXATTR => IoctlAccess::CheckedByKernel,
        subvol::BTRFS_IOC_SUBVOL_CREATE
        | subvol::BIRCH_IOC_SNAP_CREATE
        | subvol::BTRFS_IOC_SUBVOL_SETFLAGS
        | subvol::BTRFS_IOC_INO_LOOKUP
        | subvol::BTRFS_IOC_SNAP_DESTROY => IoctlAccess::CheckedByBirch,
        _ => IoctlAccess::Anyone,
    }
}

/// The name in a `struct btrfs_ioctl_vol_args` (after its 8-byte fd),
/// up to its NUL: EINVAL without one, or with a '/' in it (btrfs's rules;
/// the engine refuses "." and ".." as existing names).
fn vol_args_name(in_data: &[u8]) -> Result<&[u8], Errno> {
    let field = in_data
        .get(8..subvol::BTRFS_VOL_ARGS_SIZE)
        .ok_or(Errno::EINVAL)?;
    let len = field.iter().position(|&b| b == 0).ok_or(Errno::EINVAL)?;
    let name = &field[..len];
    if name.is_empty() || name.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    Ok(name)
}

/// Whether `caller` may add a name to directory `dir`: write and
/// search permission by its mode bits, for the owner, the group or
/// others, as mkdir(2) asks (btrfs's `btrfs_may_create`); root always.
/// The kernel checks mkdir itself (default_permissions) but passes an
/// ioctl on unchecked. ACL entries beyond the mode bits are not read.
/// `None` for a caller whose ids the request does not carry
/// (FUSE_ALLOW_IDMAP): its ids through the mount it used are unknown, so
/// no owner, group or other class can be chosen.
fn may_write_and_search(caller: &Caller, dir: &Attr) -> Option<bool> {
    let uid = caller.uid?;
    let perm = u32::from(dir.perm);
    let class = if uid == 0 {
        return Some(true);
    } else if uid == dir.uid {
        perm >> 6
    } else if caller.in_group(dir.gid) {
        perm >> 3
    } else {
        perm
    };
    Some(class & 0o3 == 0o3)
}

/// Whether `req`'s caller, neither root nor the mount's owner, may delete
/// subvolume `victim` (its root directory's attributes) from directory
/// `parent` on a mount with `user_subvol_rm_allowed`: btrfs's
/// `btrfs_ioctl_snap_destroy` for a caller without CAP_SYS_ADMIN, in its
/// order. Without the option EPERM; write and search permission on the
/// subvolume's root directory and on `parent` (EACCES); in a sticky
/// `parent`, the caller must own `parent` or the subvolume
/// (`btrfs_check_sticky`, EPERM). btrfs checks neither that the
/// subvolume is empty nor what the caller could delete inside it.
/// A caller whose ids the request does not carry gets EPERM: none of
/// these checks can be made for it.
fn may_destroy_subvolume(
    caller: &Caller,
    allowed: bool,
    parent: &Attr,
    victim: &Attr,
) -> Result<(), Errno> {
    let Some(uid) = caller.uid.filter(|_| allowed) else {
        return Err(Errno::EPERM);
    };
    if may_write_and_search(caller, victim) != Some(true)
        || may_write_and_search(caller, parent) != Some(true)
    {
        return Err(Errno::EACCES);
    }
    let sticky = u32::from(parent.perm) & libc::S_ISVTX != 0;
    if sticky && uid != parent.uid && uid != victim.uid {
        return Err(Errno::EPERM);
    }
    Ok(())
}

/// Whether `caller` may shut down or scrub a mount served by `owner`.
/// FUSE passes no capabilities, so uid 0 stands for CAP_SYS_ADMIN (as it
/// stands for CAP_FSETID in [`dropped_mode`]). The owner of an
/// unprivileged mount may stop or scrub what it serves anyway (it can kill
/// its daemon), and gains nothing over anyone else's mount: each daemon
/// knows only its own owner.
///
/// A request without the caller's ids (FUSE_ALLOW_IDMAP) is judged by
/// its process instead: CAP_SYS_ADMIN, or a filesystem uid of root or
/// the owner, read from /proc if the process runs in the daemon's user
/// namespace, where those mean what they say (CAP_SYS_ADMIN is not
/// mapped by a mount's idmap: btrfs asks `capable()` too). Anything /proc
/// cannot tell is refused.
fn may_administer(caller: &Caller, owner: u32) -> bool {
    match caller.uid {
        Some(uid) => uid == 0 || uid == owner,
        None => ProcessCreds::of_process(caller.pid)
            .is_some_and(|p| p.cap_sys_admin || p.fsuid == 0 || p.fsuid == owner),
    }
}

/// The owner and group of an inode a request creates: the ids the kernel
/// sent, mapped through the mount's idmap when FUSE_ALLOW_IDMAP is in
/// force. The kernel fills them in every creating request (and refuses
/// the creation itself when the caller's ids have no mapping), so an
/// invalid one is refused here rather than stored as an owner.
fn creator(req: &Request) -> birch::Result<(u32, u32)> {
    let caller = Caller::of(req);
    match (caller.uid, caller.gid) {
        (Some(uid), Some(gid)) => Ok((uid, gid)),
        _ => Err(birch::Error::InvalidArgument(
            "a creating request without the caller's uid and gid",
        )),
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(from_request_time(t)),
    }
}

/// The handle of a write-only open replied with FOPEN_DIRECT_IO
/// (`BirchFuse::open_reply`); every other open gets handle 0.
const DIRECT_WRITE_HANDLE: FileHandle = FileHandle(1);

/// The file capability xattr the kernel removes on a write.
const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// The owner and group of the whiteout a RENAME_WHITEOUT leaves, before a
/// set-group-ID directory's group: the caller's, as a MKNOD of the
/// request would be. With FUSE_ALLOW_IDMAP a rename carries no ids; the
/// kernel let it through only for a caller with CAP_MKNOD (checked with
/// `capable()`, in the initial user namespace), so root's ids stand in.
fn whiteout_ids(req: &Request) -> (u32, u32) {
    let caller = Caller::of(req);
    (caller.uid.unwrap_or(0), caller.gid.unwrap_or(0))
}

/// The mode left when a change by `caller` drops set-ID bits from a
/// file with `attr`, by the kernel's rules (`setattr_should_drop_suidgid`,
/// `setattr_should_drop_sgid`): set-user-ID always goes; set-group-ID goes
/// when the file is group-executable, or when the caller is neither in the
/// file's group nor privileged (without group-execute the bit would let the
/// caller keep a group it does not have). `privileged` stands for
/// CAP_FSETID ([`Caller::may_keep_set_id`]). For a caller whose ids the
/// request does not carry (FUSE_ALLOW_IDMAP), group membership is its
/// process's ([`Caller::in_group`]). None if nothing changes.
fn dropped_mode(attr: &Attr, caller: &Caller, privileged: bool) -> Option<u32> {
    let perm = u32::from(attr.perm);
    let mut kill = libc::S_ISUID;
    let may_keep_group = privileged || caller.in_group(attr.gid);
    if perm & libc::S_ISGID != 0 && (perm & libc::S_IXGRP != 0 || !may_keep_group) {
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
            requests: Arc::default(),
            mounted_at: Instant::now(),
            negotiated: InitFlags::empty(),
            remount: None,
            transport: Arc::new(OnceLock::new()),
            notifier: Arc::new(OnceLock::new()),
            failure_reported: AtomicBool::new(false),
            // SAFETY: getuid has no preconditions.
            owner: unsafe { libc::getuid() },
            ids: NodeIds::new(ROOT_DIR_INO),
        }
    }

    /// Serves the subvolume whose root directory is engine inode `root`
    /// as the mount's root ([`crate::subvol::mount_root`] finds it).
    pub fn with_root(mut self, root: u64) -> Self {
        self.ids = NodeIds::new(root);
        self
    }

    /// The errno a request fails with. An EIO or EROFS may be the first
    /// sign, at the mount, that the engine turned read-only after a failed
    /// write or flush (a request's own, or the background commit's): then
    /// the reason goes to stderr once, as the kernel's filesystems log
    /// "forced readonly", and `birch stats` shows it from then on.
    fn errno(&self, e: &birch::Error) -> Errno {
        let errno = e.errno();
        if matches!(errno, libc::EIO | libc::EROFS)
            && !self.failure_reported.load(Ordering::Relaxed)
        {
            if let Some(reason) = self.fs.failure() {
                if !self.failure_reported.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "birch: {}: read-only from now on after an I/O error: {reason}",
                        self.options.fsname
                    );
                }
            }
        }
        Errno::from_i32(errno)
    }

    /// The request counts, for [`serve`](crate::serve)'s idle memory
    /// release (memory.rs).
    pub(crate) fn request_counts(&self) -> Arc<RequestCounts> {
        self.requests.clone()
    }

    /// Where [`serve`](crate::serve) records the session's transport.
    pub(crate) fn transport_cell(&self) -> Arc<OnceLock<Transport>> {
        self.transport.clone()
    }

    /// Where [`serve`](crate::serve) records the session's notifier.
    pub(crate) fn notifier_cell(&self) -> Arc<OnceLock<fuser::Notifier>> {
        self.notifier.clone()
    }

    /// Follows `remount,rw` of a mount started read-only (remount.rs).
    pub(crate) fn with_remount_watch(mut self, watch: Arc<RemountWatch>) -> Self {
        self.remount = Some(watch);
        self
    }

    /// Before a change or a sync reaches the engine: a read-only engine
    /// serving a mount the kernel now allows changes on (the only way a
    /// change gets here) is switched to read-write first.
    fn follow_remount(&self) {
        if let Some(watch) = &self.remount {
            watch.follow(&self.fs);
        }
    }

    fn reply_fsync(&self, ino: u64, result: birch::Result<()>, reply: ReplyEmpty) {
        if result.is_ok() {
            self.control.fsync_answered(ino);
        }
        self.reply_empty(result, reply);
    }

    /// `sync` and `dirsync` mounts: makes a change durable before it is
    /// answered, through fsync's log rather than a commit: the directories
    /// whose entries changed (`dirsync`, and `sync` which implies it), and
    /// the inode changed (`sync`).
    fn settle(&self, dirs: &[u64], ino: Option<u64>) -> birch::Result<()> {
        if let (true, Some(ino)) = (self.options.sync, ino) {
            self.fs.fsync(ino, false)?;
        }
        if self.options.sync || self.options.dirsync {
            for &dir in dirs {
                self.fs.fsync(dir, false)?;
            }
        }
        Ok(())
    }

    /// [`settle`](Self::settle) after a change that gave `parent` a new
    /// entry, for the inode it names.
    fn settle_entry(&self, parent: u64, result: birch::Result<Attr>) -> birch::Result<Attr> {
        let attr = result?;
        self.settle(&[parent], Some(attr.ino))?;
        Ok(attr)
    }

    /// What `birch stats` shows.
    fn stats_report(&self) -> StatsReport {
        StatsReport {
            uptime: self.mounted_at.elapsed(),
            image: self.control.image(),
            block_device: self
                .options
                .block_device
                .as_ref()
                .map(|d| d.display().to_string()),
            transport: self
                .transport
                .get()
                .map_or_else(|| "/dev/fuse".to_string(), crate::transport::describe),
            options: stats::describe_options(&self.options),
            init_flags: self
                .negotiated
                .iter_names()
                .map(|(name, _)| name.trim_start_matches("FUSE_").to_string())
                .collect(),
            requests: self
                .requests
                .by_opcode()
                .into_iter()
                .map(|(name, n)| (name.to_string(), n))
                .collect(),
            ..StatsReport::of_engine(&self.fs)
        }
    }

    /// Replies with an inode handed to the kernel, taking the hold that the
    /// kernel's matching forget will drop. The root is never forgotten
    /// (`forget` ignores it), so it takes none: a ".." lookup can return it.
    fn reply_entry(&self, result: birch::Result<Attr>, reply: ReplyEntry) {
        let held = result.and_then(|attr| {
            if attr.ino != self.ids.root() {
                self.fs.open_inode(attr.ino)?;
            }
            Ok(attr)
        });
        match held {
            Ok(attr) => reply.entry(
                &self.options.entry_ttl,
                &self.ids.attr(&attr),
                self.ids.generation(&attr),
            ),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    /// The lookups only the kernel's export operations send (a path walk
    /// resolves "." and ".." itself), with FUSE_EXPORT_SUPPORT: "." with
    /// the node id of a file handle whose inode the kernel has forgotten
    /// (`open_by_handle_at`, an NFS client's handle), for any file type;
    /// ".." of a directory, to reconnect a directory handle to the tree.
    /// The engine finds either by number whether or not the kernel still
    /// holds it. `None` for every other name.
    fn export_lookup(&self, ino: u64, name: &[u8]) -> Option<birch::Result<Attr>> {
        // A handle into a deleted subvolume is stale, as btrfs's export
        // code refuses a root without references, also while open files
        // keep its tree loaded (their own inodes the kernel resolves from
        // its inode cache without asking).
        if matches!(name, b"." | b"..")
            && self
                .fs
                .deleted_subvolumes()
                .contains(&InoSpace::split(ino).0)
        {
            return Some(Err(birch::Error::NotFound));
        }
        match name {
            b"." => Some(self.fs.getattr(ino)),
            // The mount's root is its own parent, as `..` of a mount's
            // root is on any filesystem.
            b".." if ino == self.ids.root() => Some(self.fs.getattr(ino)),
            b".." => Some(self.fs.parent_of_dir(ino).and_then(|p| self.fs.getattr(p))),
            _ => None,
        }
    }

    fn reply_empty(&self, result: birch::Result<()>, reply: ReplyEmpty) {
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    /// Owner and group of a new inode in `parent`: the caller's, except
    /// that a set-group-ID directory passes on its group (and, to new
    /// directories, the set-group-ID bit).
    fn new_owner(
        &self,
        (uid, gid): (u32, u32),
        parent: u64,
        mode: u32,
    ) -> birch::Result<(u32, u32, u32)> {
        let dir = self.fs.getattr(parent)?;
        if u32::from(dir.perm) & libc::S_ISGID != 0 {
            let mode = if mode & libc::S_IFMT == libc::S_IFDIR {
                mode | libc::S_ISGID
            } else {
                mode
            };
            Ok((uid, dir.gid, mode))
        } else {
            Ok((uid, gid, mode))
        }
    }

    /// The handle and flags of an OPEN or CREATE reply for open flags
    /// `flags`. A write-only open without the writeback cache gets
    /// FOPEN_DIRECT_IO: its writes then skip the kernel's
    /// file_remove_privs(), which otherwise asks for
    /// `security.capability` (a GETXATTR) before every write that follows
    /// a reply carrying attributes (docs/FUSE.md "Direct I/O for
    /// write-only opens"). The kernel flags such writes
    /// FUSE_WRITE_KILL_SUIDGID instead, and the write handler drops the
    /// set-ID bits and, on DIRECT_WRITE_HANDLE, the capability. A
    /// write-only descriptor cannot be mmapped or read, so only its
    /// writes change; readers through other descriptors keep the page
    /// cache, which the kernel invalidates over the range a direct write
    /// covers.
    fn open_reply(&self, flags: i32) -> (FileHandle, FopenFlags) {
        if !self.options.writeback_cache && flags & libc::O_ACCMODE == libc::O_WRONLY {
            (
                DIRECT_WRITE_HANDLE,
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_DIRECT_IO,
            )
        } else {
            (FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE)
        }
    }

    /// Makes the kernel drop its cached attributes of `ino` before the
    /// request that changed them is answered. A WRITE's reply carries no
    /// attributes and the kernel invalidates only size and times after a
    /// write, so without this a mode changed by a write (set-ID bits
    /// dropped) would stay stale in its cache, and exec goes by the cached
    /// mode. ENOENT means the kernel holds nothing of the inode; any other
    /// failure is reported, since the stale mode is then the kernel's to
    /// keep until it next fetches attributes.
    fn forget_cached_attributes(&self, ino: u64) {
        let Some(notifier) = self.notifier.get() else {
            return;
        };
        // A negative offset: attributes only, no page cache.
        match notifier.inval_inode(self.ids.to_fuse(ino), -1, 0) {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => eprintln!(
                "birch: {}: inode {ino}: cannot invalidate the kernel's cached attributes: {e}",
                self.options.fsname
            ),
            _ => {}
        }
    }

    /// Makes the kernel drop its dentry of `name` in directory `dir`
    /// (FUSE_NOTIFY_INVAL_ENTRY) after a subvolume ioctl added or removed
    /// that name behind its back.
    fn forget_cached_entry(&self, dir: u64, name: &[u8]) {
        self.forget_cached_entries(vec![(dir, name.to_vec())]);
    }

    /// [`forget_cached_entry`](Self::forget_cached_entry) for each
    /// (directory, name), in order. The kernel takes the directory's
    /// inode lock to do it. The ioctl's caller does not hold it
    /// (vfs_ioctl takes no inode lock), but another caller may, in a
    /// request on that directory (a mkdir, a lookup) waiting for a daemon
    /// thread: with every thread here waiting on the lock, nothing would
    /// answer it. So the notifications go from a thread of their own, and
    /// the reply waits for them at most a second: normally the names are
    /// gone from the kernel's cache before the caller's next `ls`.
    fn forget_cached_entries(&self, entries: Vec<(u64, Vec<u8>)>) {
        let Some(notifier) = self.notifier.get().cloned() else {
            return;
        };
        let entries: Vec<(u64, INodeNo, Vec<u8>)> = entries
            .into_iter()
            .map(|(dir, name)| (dir, self.ids.to_fuse(dir), name))
            .collect();
        let fsname = self.options.fsname.clone();
        let (done, sent) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for (dir, parent, name) in entries {
                match notifier.inval_entry(parent, OsStr::from_bytes(&name)) {
                    // ENOENT: the kernel holds nothing of the name.
                    Err(e) if e.raw_os_error() != Some(libc::ENOENT) => eprintln!(
                        "birch: {fsname}: \"{}\" in directory {dir}: cannot invalidate the kernel's cached entry: {e}",
                        String::from_utf8_lossy(&name)
                    ),
                    _ => {}
                }
            }
            let _ = done.send(());
        });
        let _ = sent.recv_timeout(Duration::from_secs(1));
    }

    /// A write removes `security.capability`, as the kernel's
    /// file_remove_privs() does for any writer, privileged or not
    /// (cap_inode_killpriv): a file changed by someone else must not keep
    /// the capabilities granted to what it held.
    fn drop_capability(&self, ino: u64) -> birch::Result<()> {
        match self.fs.getxattr(ino, CAPABILITY_XATTR) {
            Ok(_) => self.fs.removexattr(ino, CAPABILITY_XATTR),
            Err(birch::Error::NoData) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `BIRCH_IOC_SEND` on the root directory `ino` of a subvolume: its
    /// send stream (full, or against the parent the argument names) into
    /// the caller's pipe. The stream is written on a thread of its own, not
    /// a request thread: a send runs as long as the subvolume is large,
    /// and the caller may be storing the stream in this same mount, whose
    /// writes need request threads (with `threads=1` that would deadlock).
    fn send_stream(&self, req: &Request, ino: u64, in_data: &[u8], reply: ReplyIoctl) {
        let (tree, dir) = InoSpace::split(ino);
        if dir != ROOT_DIR_INO {
            return reply.error(Errno::EINVAL);
        }
        let args = match send::SendArgs::decode(in_data) {
            Ok(args) => args,
            Err(code) => return reply.error(Errno::from_i32(code)),
        };
        let parent = match args.parent {
            0 => None,
            id if id == tree_id::FS || tree_id::is_subvolume(id) => Some(id),
            _ => return reply.error(Errno::ENOENT),
        };
        let pipe = match send::open_caller_pipe(req.pid(), args.send_fd) {
            Ok(pipe) => pipe,
            Err(code) => return reply.error(Errno::from_i32(code)),
        };
        let options = SendOptions {
            parent,
            omit_header: args.flags & send::BTRFS_SEND_FLAG_OMIT_STREAM_HEADER != 0,
            omit_end: args.flags & send::BTRFS_SEND_FLAG_OMIT_END_CMD != 0,
        };
        let fs = self.fs.clone();
        let spawned = std::thread::Builder::new()
            .name("birch-send".into())
            .spawn(move || {
                let mut out = std::io::BufWriter::with_capacity(1 << 18, pipe);
                let sent = fs
                    .send(tree, &options, &mut out, &mut |_| {})
                    .and_then(|stats| Ok(std::io::Write::flush(&mut out).map(|()| stats)?));
                match sent {
                    Ok(stats) => reply.ioctl(0, &send::encode_totals(&stats)),
                    // The reader went away (EPIPE) or another write error:
                    // the caller sees that errno, not a generic EIO.
                    Err(birch::Error::Io(e)) if e.raw_os_error().is_some() => {
                        reply.error(Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO)))
                    }
                    Err(e) => reply.error(Errno::from_i32(e.errno())),
                }
            });
        if let Err(e) = spawned {
            eprintln!("birch: cannot start a send thread: {e}");
        }
    }

    /// The subvolume ioctls (crate::subvol; docs/FUSE.md, "Subvolume
    /// ioctls"), sent on `ino`: the reply's bytes. `None`: `cmd` is not
    /// one of them.
    fn subvolume_ioctl(
        &self,
        req: &Request,
        ino: u64,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
    ) -> Option<Result<Vec<u8>, Errno>> {
        let errno = |e: birch::Error| self.errno(&e);
        let caller = Caller::of(req);
        let word = || {
            in_data
                .get(..8)
                .map(|b| u64::from_ne_bytes(b.try_into().expect("eight bytes")))
                .ok_or(Errno::EINVAL)
        };
        let (tree, dir) = InoSpace::split(ino);
        // GETFLAGS and SETFLAGS act on a subvolume's root directory only.
        let subvolume_root = || {
            if dir == ROOT_DIR_INO {
                Ok(tree)
            } else {
                Err(Errno::EINVAL)
            }
        };
        Some(match cmd {
            subvol::BTRFS_IOC_SUBVOL_CREATE => (|| {
                let name = vol_args_name(in_data)?;
                self.follow_remount();
                let parent = self.fs.getattr(ino).map_err(errno)?;
                // A caller without ids in the request (FUSE_ALLOW_IDMAP)
                // creates only as an administrator, and its subvolume is
                // owned by its process's filesystem ids: what it would
                // get through a mount without an idmap.
                let ids = match (caller.uid, caller.gid) {
                    (Some(uid), Some(gid)) => {
                        if may_write_and_search(&caller, &parent) != Some(true) {
                            return Err(Errno::EACCES);
                        }
                        (uid, gid)
                    }
                    _ => match ProcessCreds::of_process(caller.pid) {
                        Some(p) if may_administer(&caller, self.owner) => (p.fsuid, p.fsgid),
                        _ => return Err(Errno::EACCES),
                    },
                };
                let (uid, gid, _) = self
                    .new_owner(ids, ino, libc::S_IFDIR | 0o755)
                    .map_err(errno)?;
                self.fs
                    .create_subvolume(ino, name, uid, gid)
                    .map_err(errno)?;
                // The kernel may hold "no such name" for it, and the
                // parent's old size, nlink and times.
                self.forget_cached_entry(ino, name);
                self.forget_cached_attributes(ino);
                Ok(Vec::new())
            })(),
            subvol::BIRCH_IOC_SNAP_CREATE => (|| {
                let args = subvol::SnapArgs::decode(in_data).map_err(Errno::from_i32)?;
                // An id past the subvolume range would alias another
                // subvolume's root in the external number.
                if !tree_id::is_subvolume(args.source) {
                    return Err(Errno::ENOENT);
                }
                self.follow_remount();
                let dest = self.fs.getattr(ino).map_err(errno)?;
                let may_write = may_write_and_search(&caller, &dest)
                    .unwrap_or_else(|| may_administer(&caller, self.owner));
                if !may_write {
                    return Err(Errno::EACCES);
                }
                // btrfs: inode_owner_or_capable on the source's root
                // directory (its caller holds an fd of it; here the id
                // stands for the fd, so ownership is all that is checked).
                let source_root = InoSpace::join(args.source, ROOT_DIR_INO);
                let owner = self.fs.getattr(source_root).map_err(errno)?.uid;
                if caller.uid != Some(owner) && !may_administer(&caller, self.owner) {
                    return Err(Errno::EPERM);
                }
                self.fs
                    .create_snapshot(args.source, ino, args.name, args.readonly)
                    .map_err(errno)?;
                self.forget_cached_entry(ino, args.name);
                self.forget_cached_attributes(ino);
                Ok(Vec::new())
            })(),
            subvol::BTRFS_IOC_SNAP_DESTROY => (|| {
                let name = vol_args_name(in_data)?;
                self.follow_remount();
                if !may_administer(&caller, self.owner) {
                    let parent = self.fs.getattr(ino).map_err(errno)?;
                    let victim = self.fs.lookup(ino, name).map_err(errno)?;
                    // btrfs: EINVAL when the name is not a subvolume's
                    // root (the engine says so too, after the checks).
                    let (victim_tree, victim_dir) = InoSpace::split(victim.ino);
                    if victim_dir != ROOT_DIR_INO || victim_tree == tree {
                        return Err(Errno::EINVAL);
                    }
                    may_destroy_subvolume(
                        &caller,
                        self.options.user_subvol_rm_allowed,
                        &parent,
                        &victim,
                    )?;
                }
                let id = self.fs.delete_subvolume(ino, name).map_err(errno)?;
                // The kernel's dentry would keep showing the name (and
                // its cached inodes answer stat) until it expires. The
                // entries of the subvolume's inodes still in use go too:
                // unhashed, each is forgotten at its last close, and the
                // last forget hands the tree to the cleaner (btrfs drops
                // a deleted subvolume's dentries at their last use).
                let mut entries = vec![(ino, name.to_vec())];
                match self.fs.held_names_in_deleted_subvolume(id) {
                    Ok(held) => entries.extend(held),
                    Err(e) => eprintln!(
                        "birch: {}: deleted subvolume {id}: its open files' names: {e}",
                        self.options.fsname
                    ),
                }
                self.forget_cached_entries(entries);
                self.forget_cached_attributes(ino);
                Ok(Vec::new())
            })(),
            subvol::BIRCH_IOC_SUBVOL_SYNC => (|| {
                self.follow_remount();
                while self.fs.run_cleaner().map_err(errno)? {}
                let held = self.fs.held_deleted_subvolumes().len() as u64;
                Ok(held.to_ne_bytes().to_vec())
            })(),
            subvol::BTRFS_IOC_SUBVOL_GETFLAGS => (|| {
                let id = subvolume_root()?;
                let listed = self.fs.list_subvolumes().map_err(errno)?;
                let info = listed.iter().find(|i| i.id == id).ok_or(Errno::ENOENT)?;
                Ok(subvol::btrfs_flags(info.readonly).to_ne_bytes().to_vec())
            })(),
            subvol::BTRFS_IOC_SUBVOL_SETFLAGS => (|| {
                let id = subvolume_root()?;
                let flags = word()?;
                if flags & !subvol::BTRFS_SUBVOL_RDONLY != 0 {
                    return Err(Errno::EOPNOTSUPP);
                }
                // btrfs: the owner of the subvolume's root directory, or
                // CAP_FOWNER.
                let owner = self.fs.getattr(ino).map_err(errno)?.uid;
                if caller.uid != Some(owner) && !may_administer(&caller, self.owner) {
                    return Err(Errno::EPERM);
                }
                self.follow_remount();
                self.fs
                    .set_subvolume_readonly(id, flags & subvol::BTRFS_SUBVOL_RDONLY != 0)
                    .map_err(errno)?;
                Ok(Vec::new())
            })(),
            subvol::BTRFS_IOC_SET_RECEIVED_SUBVOL => (|| {
                let id = subvolume_root()?;
                let args = in_data
                    .get(..subvol::BTRFS_RECEIVED_SUBVOL_ARGS_SIZE)
                    .ok_or(Errno::EINVAL)?;
                let u64_at =
                    |at: usize| u64::from_ne_bytes(args[at..at + 8].try_into().expect("8"));
                let uuid: [u8; 16] = args[..16].try_into().expect("sixteen bytes");
                let stransid = u64_at(16);
                let stime = birch::format::Timespec {
                    sec: i64::try_from(u64_at(32)).map_err(|_| Errno::EINVAL)?,
                    nsec: u32::from_ne_bytes(args[40..44].try_into().expect("4")),
                };
                if stime.nsec >= 1_000_000_000 {
                    return Err(Errno::EINVAL);
                }
                self.follow_remount();
                let (rtransid, rtime) = self
                    .fs
                    .set_received_subvolume(id, uuid, stransid, stime)
                    .map_err(errno)?;
                let mut out = args.to_vec();
                out[24..32].copy_from_slice(&rtransid.to_ne_bytes());
                out[48..56].copy_from_slice(&(rtime.sec as u64).to_ne_bytes());
                out[56..60].copy_from_slice(&rtime.nsec.to_ne_bytes());
                Ok(out)
            })(),
            subvol::BTRFS_IOC_DEFAULT_SUBVOL => (|| {
                let id = match word()? {
                    0 => tree_id::FS,
                    id => id,
                };
                self.follow_remount();
                self.fs.set_default_subvolume(id).map_err(errno)?;
                Ok(Vec::new())
            })(),
            subvol::BIRCH_IOC_GET_DEFAULT_SUBVOL => self
                .fs
                .default_subvolume()
                .map(|id| id.to_ne_bytes().to_vec())
                .map_err(errno),
            subvol::BTRFS_IOC_INO_LOOKUP => (|| {
                let lookup_tree = match word()? {
                    0 => tree,
                    t => t,
                };
                let objectid = in_data
                    .get(8..16)
                    .map(|b| u64::from_ne_bytes(b.try_into().expect("eight bytes")))
                    .ok_or(Errno::EINVAL)?;
                // Numbers past either field would alias another
                // subvolume's inode in the external number.
                if !tree_id::is_subvolume(lookup_tree) {
                    return Err(Errno::ENOENT);
                }
                if objectid >= MAX_SUBVOL_INO {
                    return Err(Errno::EINVAL);
                }
                // btrfs answers "which subvolume is this" to anyone, a
                // directory's path only to CAP_SYS_ADMIN.
                if objectid != ROOT_DIR_INO && !may_administer(&caller, self.owner) {
                    return Err(Errno::EPERM);
                }
                let path = subvol::dir_path(&self.fs, lookup_tree, objectid).map_err(errno)?;
                let mut out = vec![0u8; subvol::BTRFS_INO_LOOKUP_ARGS_SIZE];
                if path.len() >= out.len() - 16 {
                    return Err(Errno::ENAMETOOLONG);
                }
                out[..8].copy_from_slice(&lookup_tree.to_ne_bytes());
                out[8..16].copy_from_slice(&objectid.to_ne_bytes());
                out[16..16 + path.len()].copy_from_slice(&path);
                Ok(out)
            })(),
            subvol::BIRCH_IOC_SUBVOL_LIST => (|| {
                let cursor = word()?;
                let mut page = Vec::new();
                let mut len = 8;
                for entry in subvol::list(&self.fs).map_err(errno)? {
                    if entry.id < cursor {
                        continue;
                    }
                    let bytes = entry.encode();
                    len += bytes.len();
                    if len > out_size as usize {
                        // Not even one entry fits: say so rather than end
                        // the list early.
                        if page.is_empty() {
                            return Err(Errno::EOVERFLOW);
                        }
                        break;
                    }
                    page.push(bytes);
                }
                Ok(subvol::SubvolEntry::encode_page(&page))
            })(),
            _ => return None,
        })
    }

    fn readdir_common(
        &self,
        ino: INodeNo,
        offset: u64,
        add: impl FnMut(&Listed, u64, Option<&Attr>) -> bool,
        plus: bool,
    ) -> birch::Result<()> {
        let dir = self.ids.to_engine(ino.0);
        let started = || {
            if self.options.nodiratime {
                Ok(())
            } else {
                self.fs.dir_accessed(dir)
            }
        };
        listing::list(&self.fs, dir, offset, plus, started, add)
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
            | InitFlags::FUSE_NO_OPENDIR_SUPPORT
            // Lets the kernel resolve a file handle whose inode it has
            // dropped by asking us (LOOKUP of "." and ".."), so that
            // open_by_handle_at and an NFS re-export keep working.
            | InitFlags::FUSE_EXPORT_SUPPORT
            // The kernel checks access and default ACLs (read as the
            // system.posix_acl_* xattrs) in its permission checks, and
            // sends the umask instead of applying it, since a default ACL
            // replaces it: the engine applies one or the other at create
            // (docs/FUSE.md, "POSIX ACLs").
            | InitFlags::FUSE_POSIX_ACL
            | InitFlags::FUSE_DONT_MASK
            // The extended SETXATTR, whose FUSE_SETXATTR_ACL_KILL_SGID
            // asks to clear set-group-ID with an access ACL set by a
            // caller outside the file's group (the kernel's
            // posix_acl_update_mode; fstests generic/375).
            | InitFlags::FUSE_SETXATTR_EXT;
        if self.options.writeback_cache {
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        if self.options.no_open {
            wanted |= InitFlags::FUSE_NO_OPEN_SUPPORT;
        }
        let offered = config.capabilities();
        // Idmapped mounts (docs/FUSE.md, "Idmapped mounts"). The kernel
        // also needs default_permissions, which every birch mount has.
        if self.options.idmap {
            wanted |= InitFlags::FUSE_ALLOW_IDMAP;
            if !offered.contains(InitFlags::FUSE_ALLOW_IDMAP) {
                eprintln!(
                    "birch: {}: idmapped mounts are off: this kernel does not offer \
                     FUSE_ALLOW_IDMAP (Linux 6.12 and later do)",
                    self.options.fsname
                );
            }
        }
        self.negotiated = wanted & offered;
        self.mounted_at = Instant::now();
        let _ = config.add_capabilities(self.negotiated);
        let _ = config.set_max_write(self.options.max_write);
        let _ = config.set_max_readahead(self.options.max_write);
        let _ = config.set_max_background(self.options.max_background);
        Ok(())
    }

    fn request_received(&self, opcode: u32) {
        self.requests.record(opcode);
    }

    /// A bug met while serving a request (fuser has answered it EIO): the
    /// engine turns read-only, as after an I/O error, and the mount goes
    /// on answering (docs/IO-ERRORS.md, "Panics").
    fn request_panicked(&self, opcode: u32, message: &str) {
        let op = crate::requests::opcode_name(opcode as usize).unwrap_or("unknown");
        let reason = self
            .fs
            .fail_after_panic(&format!("{op} request: {message}"));
        if !self.failure_reported.swap(true, Ordering::Relaxed) {
            eprintln!(
                "birch: {}: read-only from now on: {reason}",
                self.options.fsname
            );
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let parent = self.ids.to_engine(parent.0);
        if let Some(result) = self.export_lookup(parent, name.as_bytes()) {
            return match result {
                // A number with no live inode behind it: the handle names
                // a file that is gone (its number may come back, but with
                // another generation, which the kernel then refuses).
                Err(birch::Error::NotFound) => reply.error(Errno::ESTALE),
                Ok(attr) if attr.nlink == 0 => reply.error(Errno::ESTALE),
                other => self.reply_entry(other, reply),
            };
        }
        match self.fs.lookup(parent, name.as_bytes()) {
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
        match self.fs.getattr(self.ids.to_engine(ino.0)) {
            Ok(a) => reply.attr(&self.options.attr_ttl, &self.ids.attr(&a)),
            Err(e) => reply.error(self.errno(&e)),
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
        kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        self.follow_remount();
        let ino = self.ids.to_engine(ino.0);
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
            // to us (docs/FUSE.md). It asks in three shapes: a chown of a
            // non-directory; a truncate by a caller without CAP_FSETID
            // (flagged FATTR_KILL_SUIDGID); and a SETATTR that changes
            // nothing, which is the kernel's file_remove_privs() (before a
            // write, a fallocate, a write into the writeback cache) or a
            // chown(-1, -1), both of which drop the bits. Clearing them in
            // that SETATTR also hands the kernel the new mode in the reply,
            // so its cached attributes never keep a stale set-user-ID bit.
            let nothing = mode.is_none()
                && uid.is_none()
                && gid.is_none()
                && size.is_none()
                && atime.is_none()
                && mtime.is_none()
                && ctime.is_none();
            let chown = uid.is_some() || gid.is_some() || nothing;
            if mode.is_none() && (chown || (size.is_some() && kill_suidgid)) {
                let current = self.fs.getattr(ino)?;
                let applies = match current.file_type {
                    birch::format::FileType::Regular => true,
                    birch::format::FileType::Directory => false,
                    _ => !nothing,
                };
                if applies {
                    let caller = Caller::of(req);
                    changes.mode =
                        dropped_mode(&current, &caller, chown && caller.may_keep_set_id());
                }
            }
            let attr = self.fs.setattr(ino, &changes)?;
            self.settle(&[], Some(ino))?;
            Ok(attr)
        })();
        match result {
            Ok(a) => reply.attr(&self.options.attr_ttl, &self.ids.attr(&a)),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    /// statx(2) wanting btime: the inode's creation time (`otime`).
    fn statx(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        _mask: u32,
        reply: ReplyStatx,
    ) {
        match self.fs.getattr(self.ids.to_engine(ino.0)) {
            Ok(a) => reply.statx(&self.options.attr_ttl, &self.ids.attr(&a)),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(self.ids.to_engine(ino.0)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.follow_remount();
        let parent = self.ids.to_engine(parent.0);
        let result = creator(req)
            .and_then(|ids| self.new_owner(ids, parent, mode))
            .and_then(|(uid, gid, mode)| {
                let rdev = u64::from(rdev);
                self.fs
                    .make_node(parent, name.as_bytes(), mode, umask, uid, gid, rdev)
            });
        self.reply_entry(self.settle_entry(parent, result), reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.follow_remount();
        let parent = self.ids.to_engine(parent.0);
        let result = creator(req)
            .and_then(|ids| self.new_owner(ids, parent, libc::S_IFDIR | mode))
            .and_then(|(uid, gid, mode)| {
                self.fs
                    .make_node(parent, name.as_bytes(), mode, umask, uid, gid, 0)
            });
        self.reply_entry(self.settle_entry(parent, result), reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.follow_remount();
        let parent = self.ids.to_engine(parent.0);
        self.reply_empty(
            self.fs
                .unlink(parent, name.as_bytes())
                .and_then(|()| self.settle(&[parent], None)),
            reply,
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.follow_remount();
        let parent = self.ids.to_engine(parent.0);
        self.reply_empty(
            self.fs
                .rmdir(parent, name.as_bytes())
                .and_then(|()| self.settle(&[parent], None)),
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
        self.follow_remount();
        let parent = self.ids.to_engine(parent.0);
        let result = creator(req)
            .and_then(|ids| self.new_owner(ids, parent, libc::S_IFLNK))
            .and_then(|(uid, gid, _)| {
                self.fs.symlink(
                    parent,
                    link_name.as_bytes(),
                    target.as_os_str().as_bytes(),
                    uid,
                    gid,
                )
            });
        self.reply_entry(self.settle_entry(parent, result), reply);
    }

    /// RENAME_WHITEOUT: the kernel checked CAP_MKNOD in the caller's
    /// namespace and refused it with RENAME_EXCHANGE before forwarding
    /// (`do_renameat2`); the whiteout is owned as a MKNOD from this
    /// request would be (docs/FUSE.md "Whiteouts and overlayfs").
    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.follow_remount();
        let known = fuser::RenameFlags::RENAME_NOREPLACE
            | fuser::RenameFlags::RENAME_EXCHANGE
            | fuser::RenameFlags::RENAME_WHITEOUT;
        if !known.contains(flags) {
            // Anything newer.
            return reply.error(Errno::EINVAL);
        }
        let (parent, newparent) = (
            self.ids.to_engine(parent.0),
            self.ids.to_engine(newparent.0),
        );
        let whiteout = flags
            .contains(fuser::RenameFlags::RENAME_WHITEOUT)
            .then(|| {
                self.new_owner(whiteout_ids(req), parent, libc::S_IFCHR)
                    .map(|(uid, gid, _)| WhiteoutOwner { uid, gid })
            })
            .transpose();
        let no_replace = flags.contains(fuser::RenameFlags::RENAME_NOREPLACE);
        let exchange = flags.contains(fuser::RenameFlags::RENAME_EXCHANGE);
        let dirs: &[u64] = if parent == newparent {
            &[parent]
        } else {
            &[parent, newparent]
        };
        self.reply_empty(
            whiteout
                .and_then(|whiteout| {
                    let flags = RenameFlags {
                        no_replace,
                        exchange,
                        whiteout,
                    };
                    self.fs.rename(
                        parent,
                        name.as_bytes(),
                        newparent,
                        newname.as_bytes(),
                        flags,
                    )
                })
                .and_then(|()| self.settle(dirs, None)),
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
        self.follow_remount();
        let newparent = self.ids.to_engine(newparent.0);
        let result = self
            .fs
            .link(self.ids.to_engine(ino.0), newparent, newname.as_bytes());
        self.reply_entry(self.settle_entry(newparent, result), reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.options.no_open {
            reply.error(Errno::ENOSYS);
            return;
        }
        // The VFS checks immutable and append-only at open only from
        // inode->i_flags, which FUSE never sets (generic/079). O_TRUNC
        // arrives as a SETATTR of the size, which the engine refuses.
        match self.fs.deny_open(self.ids.to_engine(ino.0), flags.0) {
            Ok(()) => {
                let (fh, fopen) = self.open_reply(flags.0);
                reply.opened(fh, fopen)
            }
            Err(e) => reply.error(self.errno(&e)),
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
            .read_file(self.ids.to_engine(ino.0), offset, size as usize)
        {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.follow_remount();
        let ino = self.ids.to_engine(ino.0);
        let result = (|| {
            // The kernel sets KILL_SUIDGID for a caller without CAP_FSETID.
            // It has normally dropped the bits already (the empty SETATTR
            // of file_remove_privs, see setattr); this covers a write that
            // reaches birch without one.
            // Writes through a direct-I/O handle (see open_reply) always
            // arrive so, with no SETATTR before them.
            if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
                if let Some(mode) = dropped_mode(&self.fs.getattr(ino)?, &Caller::of(req), false) {
                    self.fs.setattr(
                        ino,
                        &SetAttr {
                            mode: Some(mode),
                            ..Default::default()
                        },
                    )?;
                    self.forget_cached_attributes(ino);
                }
            }
            if fh == DIRECT_WRITE_HANDLE {
                self.drop_capability(ino)?;
            }
            // A write-back of cached pages: with the writeback cache the
            // kernel owns mtime and ctime (it set them at write(2) time and
            // sends them in a SETATTR when they changed), so the engine's
            // "now" at write-back must not replace them: it would surface
            // once the kernel drops the inode (after a remount, say) as an
            // mtime other than the one stat(2) showed.
            let cached_pages = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
            let kernel_times = self.options.writeback_cache && cached_pages;
            let before = if kernel_times {
                Some(self.fs.getattr(ino)?)
            } else {
                None
            };
            // The kernel takes a write-back's reply as all or nothing
            // (fuse_writepage_end reads only the error): a short count
            // would lose the rest of the pages unreported, so a write-back
            // is written whole or answered with the error that refused
            // the rest, which the kernel reports to the next fsync or close.
            let written = if cached_pages {
                self.fs
                    .write_file_whole(ino, offset, data)
                    .map(|()| data.len())
            } else {
                self.fs.write_file(ino, offset, data)
            };
            if let Some(before) = before {
                let times = SetAttr {
                    mtime: Some(SetTime::At(before.mtime)),
                    ctime: Some(before.ctime),
                    ..Default::default()
                };
                self.fs.setattr(ino, &times)?;
            }
            written
        })();
        match result {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(self.errno(&e)),
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
        self.follow_remount();
        let ino = self.ids.to_engine(ino.0);
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
            |entry, next, _| {
                reply.add(
                    self.ids.to_fuse(entry.ino),
                    next,
                    entry.kind,
                    OsStr::from_bytes(&entry.name),
                )
            },
            false,
        );
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.errno(&e)),
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
            |entry, next, attr| {
                let attr = attr.expect("readdirplus passes attributes");
                let full = reply.add(
                    self.ids.to_fuse(entry.ino),
                    next,
                    OsStr::from_bytes(&entry.name),
                    &ttl,
                    &self.ids.attr(attr),
                    self.ids.generation(attr),
                );
                // The kernel counts a lookup for each entry it accepted,
                // except "." and "..".
                if !full && entry.name != b"." && entry.name != b".." {
                    let _ = fs.open_inode(entry.ino);
                }
                full
            },
            true,
        );
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.errno(&e)),
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
        self.follow_remount();
        let ino = self.ids.to_engine(ino.0);
        self.reply_fsync(ino, self.fs.fsync(ino, datasync), reply);
    }

    /// syncfs(2), sync(1), and the sync a remount does before it changes
    /// the mount's flags: commit, and answer once the commit is durable.
    /// Only fuseblk connections get this (docs/FUSE.md).
    fn syncfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyEmpty) {
        self.follow_remount();
        self.reply_empty(self.fs.sync(), reply);
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
            Err(e) => reply.error(self.errno(&e)),
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
        acl_kill_sgid: bool,
        reply: ReplyEmpty,
    ) {
        self.follow_remount();
        if let Err(e) = supported_xattr_namespace(name) {
            return reply.error(e);
        }
        let mode = match flags {
            0 => XattrSetMode::CreateOrReplace,
            libc::XATTR_CREATE => XattrSetMode::Create,
            libc::XATTR_REPLACE => XattrSetMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        let ino = self.ids.to_engine(ino.0);
        self.reply_empty(
            self.fs
                .setxattr_kill_sgid(ino, name.as_bytes(), value, mode, acl_kill_sgid)
                .and_then(|()| self.settle(&[], Some(ino))),
            reply,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if let Err(e) = supported_xattr_namespace(name) {
            return reply.error(e);
        }
        match self.fs.getxattr(self.ids.to_engine(ino.0), name.as_bytes()) {
            Ok(value) if size == 0 => reply.size(value.len() as u32),
            Ok(value) if value.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(value) => reply.data(&value),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(self.ids.to_engine(ino.0)) {
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
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.follow_remount();
        if let Err(e) = supported_xattr_namespace(name) {
            return reply.error(e);
        }
        let ino = self.ids.to_engine(ino.0);
        self.reply_empty(
            self.fs
                .removexattr(ino, name.as_bytes())
                .and_then(|()| self.settle(&[], Some(ino))),
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
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.follow_remount();
        let parent = self.ids.to_engine(parent.0);
        let result = creator(req)
            .and_then(|ids| self.new_owner(ids, parent, mode))
            .and_then(|(uid, gid, mode)| {
                let name = name.as_bytes();
                let created = self.fs.make_node(parent, name, mode, umask, uid, gid, 0);
                self.settle_entry(parent, created)
            })
            .and_then(|attr| self.fs.open_inode(attr.ino).map(|()| attr));
        match result {
            Ok(attr) => {
                let (fh, fopen) = self.open_reply(flags);
                reply.created(
                    &self.options.entry_ttl,
                    &self.ids.attr(&attr),
                    self.ids.generation(&attr),
                    fh,
                    fopen,
                )
            }
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    /// `open(O_TMPFILE)`: the engine's tmpfile holds the inode once, the
    /// hold the kernel's lookup count (and its forget) stands for.
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        self.follow_remount();
        let parent = self.ids.to_engine(parent.0);
        // With FUSE_DONT_MASK the umask is ours to apply, or the
        // directory's default ACL instead, as at a named create.
        let result = creator(req)
            .and_then(|ids| self.new_owner(ids, parent, mode))
            .and_then(|(uid, gid, mode)| self.fs.tmpfile(parent, mode, umask, uid, gid));
        match result {
            Ok(attr) => reply.created(
                &self.options.entry_ttl,
                &self.ids.attr(&attr),
                self.ids.generation(&attr),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        // Any user who can open a file of the mount (root's mounts are
        // allow_other) can send any ioctl number: the kernel passes FUSE
        // the ones it does not handle itself unchecked.
        if ioctl_access(cmd) == IoctlAccess::Administrator
            && !may_administer(&Caller::of(req), self.owner)
        {
            return reply.error(Errno::EPERM);
        }
        if matches!(
            cmd,
            FS_IOC_SETFLAGS | FS_IOC_FSSETXATTR | BIRCH_IOC_SYNC | BIRCH_IOC_SCRUB
        ) {
            self.follow_remount();
        }
        let ino = self.ids.to_engine(ino.0);
        if cmd == BIRCH_IOC_SEND {
            return self.send_stream(req, ino, in_data, reply);
        }
        if let Some(result) = self.subvolume_ioctl(req, ino, cmd, in_data, out_size) {
            return match result {
                Ok(bytes) => reply.ioctl(0, &bytes),
                Err(e) => reply.error(e),
            };
        }
        match cmd {
            FS_IOC_GETFLAGS => match self.fs.get_flags(ino) {
                Ok(flags) => reply.ioctl(0, &flags.to_ne_bytes()),
                Err(e) => reply.error(self.errno(&e)),
            },
            FS_IOC_FSGETXATTR => match self.fs.get_flags(ino) {
                Ok(flags) => {
                    let mut fsxattr = [0u8; 28];
                    fsxattr[..4].copy_from_slice(&xflags_of(flags).to_ne_bytes());
                    reply.ioctl(0, &fsxattr);
                }
                Err(e) => reply.error(self.errno(&e)),
            },
            // The kernel's fileattr code (vfs_fileattr_set) sends this and
            // FS_IOC_SETFLAGS only after its checks: the caller owns the
            // inode or has CAP_FOWNER, and a change of `a` or `i` needs
            // CAP_LINUX_IMMUTABLE. User space cannot send either number
            // past it (do_vfs_ioctl takes them first).
            FS_IOC_FSSETXATTR => {
                let word = |i: usize| {
                    in_data
                        .get(i * 4..i * 4 + 4)
                        .map(|b| u32::from_ne_bytes(b.try_into().expect("four bytes")))
                };
                // xflags, extsize, nextents, projid, cowextsize: only the
                // flags in XFLAGS may be set, nothing else birch has.
                match (word(0), word(1), word(3), word(4)) {
                    (Some(xflags), Some(0), Some(0), Some(0)) => match flags_of_xflags(xflags) {
                        Some(flags) => {
                            let result = self.fs.get_flags(ino).and_then(|old| {
                                self.fs.set_flags(ino, (old & inode_flags::DIRSYNC) | flags)
                            });
                            match result {
                                Ok(()) => {
                                    self.forget_cached_attributes(ino);
                                    reply.ioctl(0, &[]);
                                }
                                Err(e) => reply.error(self.errno(&e)),
                            }
                        }
                        None => reply.error(Errno::EOPNOTSUPP),
                    },
                    (Some(_), Some(_), Some(_), Some(_)) => reply.error(Errno::EOPNOTSUPP),
                    _ => reply.error(Errno::EINVAL),
                }
            }
            FS_IOC_SETFLAGS => match in_data.get(..4) {
                Some(bytes) => {
                    let flags = u32::from_ne_bytes(bytes.try_into().expect("four bytes"));
                    match self.fs.set_flags(ino, flags) {
                        // The change set ctime: the kernel's cached
                        // attributes are stale (fstests generic/277).
                        Ok(()) => {
                            self.forget_cached_attributes(ino);
                            reply.ioctl(0, &[]);
                        }
                        Err(e) => reply.error(self.errno(&e)),
                    }
                }
                None => reply.error(Errno::EINVAL),
            },
            BIRCH_IOC_SYNC => match self.fs.sync() {
                Ok(()) => reply.ioctl(0, &[]),
                Err(e) => reply.error(self.errno(&e)),
            },
            BIRCH_IOC_STATS => {
                let text = self.stats_report().encode();
                // Cut short, the last counter would read as a wrong number.
                if text.len() > out_size as usize {
                    reply.error(Errno::EOVERFLOW);
                } else {
                    reply.ioctl(0, text.as_bytes());
                }
            }
            // Runs in this request thread (the others keep serving, the
            // CLI's progress polls among them) until the scrub is done.
            BIRCH_IOC_SCRUB => match birch::scrub::scrub_filesystem(&self.fs) {
                Ok(report) => {
                    let text = crate::scrub::encode(&report, out_size as usize);
                    reply.ioctl(0, text.as_bytes());
                }
                Err(e) => reply.error(self.errno(&e)),
            },
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
        self.follow_remount();
        let mode = match mode {
            0 => FallocateMode::Allocate,
            libc::FALLOC_FL_KEEP_SIZE => FallocateMode::AllocateKeepSize,
            m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => {
                FallocateMode::PunchHole
            }
            libc::FALLOC_FL_ZERO_RANGE => FallocateMode::ZeroRange,
            m if m == libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE => {
                FallocateMode::ZeroRangeKeepSize
            }
            // The kernel's FUSE fallocate refuses these two itself
            // (EOPNOTSUPP) today; served here for when it passes them on.
            libc::FALLOC_FL_COLLAPSE_RANGE => FallocateMode::CollapseRange,
            libc::FALLOC_FL_INSERT_RANGE => FallocateMode::InsertRange,
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        let ino = self.ids.to_engine(ino.0);
        self.reply_empty(
            self.fs
                .fallocate(ino, offset, length, mode)
                .and_then(|()| self.settle(&[], Some(ino))),
            reply,
        );
    }

    /// FIBMAP on a fuseblk mount (the kernel sends BMAP only when the
    /// superblock has a block device): the device block, in units of
    /// `blocksize` (the superblock's), of file block `idx`; 0 where no
    /// written extent holds it (docs/FUSE.md, "FIBMAP"). A data extent's
    /// disk byte is its byte on the device birch was mounted from, which
    /// is the fuseblk device.
    fn bmap(&self, _req: &Request, ino: INodeNo, blocksize: u32, idx: u64, reply: ReplyBmap) {
        let ino = self.ids.to_engine(ino.0);
        let size = u64::from(blocksize);
        let valid = blocksize.is_power_of_two() && (512..=SECTOR_SIZE).contains(&size);
        let Some(offset) = idx.checked_mul(size).filter(|_| valid) else {
            return reply.error(Errno::EINVAL);
        };
        match self.fs.device_byte(ino, offset) {
            Ok(byte) => reply.bmap(byte.map_or(0, |b| b / size)),
            Err(e) => reply.error(self.errno(&e)),
        }
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
        match self.fs.seek(self.ids.to_engine(ino.0), offset, whence) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    /// A reflink where the offsets allow it (the engine's
    /// `copy_file_range`). The reply counts bytes in 32 bits: a longer
    /// copy is cut at a block boundary and the caller asks for the rest.
    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.follow_remount();
        const MAX_REPLY: u64 = u32::MAX as u64 / 4096 * 4096;
        match self.fs.copy_file_range(
            self.ids.to_engine(ino_in.0),
            offset_in,
            self.ids.to_engine(ino_out.0),
            offset_out,
            len.min(MAX_REPLY),
        ) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(self.errno(&e)),
        }
    }
}

/// FUSE passes every xattr name through, where a kernel filesystem
/// answers EOPNOTSUPP for a name outside the namespaces it implements
/// ([`supported_xattr_name`]).
fn supported_xattr_namespace(name: &OsStr) -> Result<(), Errno> {
    if supported_xattr_name(name.as_bytes()) {
        Ok(())
    } else {
        Err(Errno::EOPNOTSUPP)
    }
}

/// Whether birch stores an xattr of this name: user., trusted. and
/// security. attributes, the POSIX ACLs (which it enforces), and of
/// btrfs.* the compression property (docs/COMPRESSION.md, "The
/// property"), as btrfs. `birch receive --image` refuses the rest as the
/// mount does.
pub fn supported_xattr_name(name: &[u8]) -> bool {
    const NAMESPACES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];
    const NAMES: [&[u8]; 3] = [
        birch::format::ACL_ACCESS_XATTR,
        birch::format::ACL_DEFAULT_XATTR,
        birch::format::COMPRESSION_PROPERTY_XATTR,
    ];
    NAMESPACES.iter().any(|ns| name.starts_with(ns)) || NAMES.contains(&name)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_or_the_owner_may_shut_down_or_scrub() {
        for cmd in [
            XFS_IOC_GOINGDOWN,
            BIRCH_IOC_SCRUB,
            subvol::BTRFS_IOC_DEFAULT_SUBVOL,
            subvol::BTRFS_IOC_SET_RECEIVED_SUBVOL,
        ] {
            assert_eq!(ioctl_access(cmd), IoctlAccess::Administrator);
        }
        // Root, the mount's owner, or with `user_subvol_rm_allowed` the
        // checks btrfs runs (`may_destroy_subvolume`).
        assert_eq!(
            ioctl_access(subvol::BTRFS_IOC_SNAP_DESTROY),
            IoctlAccess::CheckedByBirch
        );
        for cmd in [
            BIRCH_IOC_SYNC,
            BIRCH_IOC_STATS,
            FS_IOC_GETFLAGS,
            FS_IOC_FSGETXATTR,
            subvol::BIRCH_IOC_SUBVOL_LIST,
            subvol::BIRCH_IOC_GET_DEFAULT_SUBVOL,
            subvol::BIRCH_IOC_SUBVOL_SYNC,
            subvol::BTRFS_IOC_SUBVOL_GETFLAGS,
        ] {
            assert_eq!(ioctl_access(cmd), IoctlAccess::Anyone);
        }
        for cmd in [FS_IOC_SETFLAGS, FS_IOC_FSSETXATTR] {
            assert_eq!(ioctl_access(cmd), IoctlAccess::CheckedByKernel);
        }
        let by = |uid| Caller::from_ids(uid, uid, 0);
        // Root's mount: root only.
        assert!(may_administer(&by(0), 0));
        assert!(!may_administer(&by(65534), 0));
        // A user's mount: the user and root, nobody else.
        assert!(may_administer(&by(1000), 1000));
        assert!(may_administer(&by(0), 1000));
        assert!(!may_administer(&by(1001), 1000));
    }

    fn test_attr() -> Attr {
        let t = birch::format::Timespec { sec: 0, nsec: 0 };
        Attr {
            ino: 257,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            file_type: birch::format::FileType::Directory,
            perm: 0o755,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            generation: 1,
        }
    }

    /// With FUSE_ALLOW_IDMAP a request that creates nothing carries uid and
    /// gid (u32)-1: never anyone's id, never root's.
    #[test]
    fn unknown_ids_are_no_ones() {
        use crate::caller::INVALID_ID;
        // A pid /proc cannot resolve: refused, whoever the owner is.
        let unknown = Caller::from_ids(INVALID_ID, INVALID_ID, 0);
        assert!(!may_administer(&unknown, 0));
        assert!(!may_administer(&unknown, INVALID_ID));
        let dir = |uid, gid, perm| Attr {
            uid,
            gid,
            perm,
            ..test_attr()
        };
        // A directory owned by "uid -1" with write for its owner only.
        assert_eq!(
            may_write_and_search(&unknown, &dir(INVALID_ID, INVALID_ID, 0o700)),
            None
        );
        assert_eq!(
            may_destroy_subvolume(
                &unknown,
                true,
                &dir(INVALID_ID, INVALID_ID, 0o1777),
                &dir(INVALID_ID, INVALID_ID, 0o777)
            ),
            Err(Errno::EPERM)
        );
        // Set-ID bits: an unknown caller's group membership is no, even
        // in a group "-1": both go.
        assert_eq!(
            dropped_mode(&dir(1, INVALID_ID, 0o6745), &unknown, false),
            Some(0o745)
        );
        assert_eq!(
            dropped_mode(&dir(1, INVALID_ID, 0o6745), &unknown, true),
            Some(0o2745)
        );
        // A known caller outside the file's group loses both.
        let other = Caller::from_ids(1000, 1000, 0);
        assert_eq!(dropped_mode(&dir(1, 5, 0o6745), &other, false), Some(0o745));
    }
}
