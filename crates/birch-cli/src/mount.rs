//! `birch mount` and `birch sync`.
//!
//! `birch mount IMAGE MOUNTPOINT` opens the image (locked against a second
//! mount), mounts it through FUSE and, unless `-f`, detaches into the
//! background once the mount is live: the foreground process waits on a
//! pipe for the daemon's "ready" (or its error) and exits accordingly.
//! SIGINT, SIGTERM and SIGHUP unmount; any unmount (umount, fusermount3 -u,
//! a signal) ends the session, and the filesystem is committed and closed
//! before the daemon exits.

use crate::holders;
use crate::loopdev::{self, Backing, LoopDevice};
use crate::Failure;
use birch::device::{BlockDevice, FileDevice, ShutdownGate, WriteLogDevice};
use birch::fs::{AtimeUpdates, BackupRootUsed, Filesystem, MountOptions, ReplayOutcome, Rescue};
use birch_fuse::stats::ImageInfo;
use birch_fuse::{FuseOptions, MountControl, TransportChoice, BIRCH_IOC_SYNC};
use clap::Args;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Clone)]
pub struct MountArgs {
    /// Image file or block device
    #[arg(value_name = "IMAGE")]
    pub image: PathBuf,
    /// Directory to mount on
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: PathBuf,
    /// Stay in the foreground (default: detach once the mount is live)
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// Comma-separated options: ro, rw, threads=N, transport=auto|uring|devfuse,
    /// uring_entries=N (per CPU queue), commit=SECONDS,
    /// entry_ttl=SECONDS, attr_ttl=SECONDS, writeback_cache, no_writeback_cache,
    /// no_open, open, direct_io (default), buffered, allow_other, fsname=NAME,
    /// node_cache=SIZE (clean tree nodes kept, default 256M), node_cache_idle=SIZE
    /// (kept once idle, default 16M), memory_idle=SECONDS (idle time before memory
    /// is given back, default 10, 0 never), dirty_limit=SIZE (dirty file data held, default 256M),
    /// cleaner_nodes=N (nodes of a deleted subvolume dropped per commit, default 4096),
    /// rescue=usebackuproot (if the newest commit cannot be read, mount the newest older
    /// one the superblock records, read-only unless `rw` is given too); and mount(8)'s
    /// generic options: nosuid, nodev, noexec, noatime, strictatime, nodiratime, sync, dirsync, ...;
    /// subvol=PATH (from the top level) or subvolid=ID: the subvolume to show (default: the default one;
    /// on an image already mounted, a bind mount of it in the running mount, which then takes only
    /// subvol=, subvolid=, ro, rw, nosuid, nodev, noexec);
    /// user_subvol_rm_allowed (any user who could rmdir a subvolume's root directory may
    /// `birch subvolume delete` it, as btrfs)
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Record every device write and flush, and a mark at each fsync and
    /// fsyncdir reply ("fsync INO"), in FILE (dm-log-writes format; rebuild
    /// any point with `birch replay`, starting from a copy of the image
    /// taken before this mount)
    #[arg(long, value_name = "FILE")]
    pub write_log: Option<PathBuf>,
    /// File descriptor on which a detached daemon reports readiness (internal).
    #[arg(long, hide = true)]
    pub ready_fd: Option<i32>,
}

#[derive(Args)]
pub struct SyncArgs {
    /// Where a birch filesystem is mounted
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: PathBuf,
}

/// Everything `-o` can say.
struct Settings {
    fuse: FuseOptions,
    engine: MountOptions,
    direct_io: bool,
}

fn parse_options(args: &MountArgs) -> Result<Settings, Failure> {
    let mut s = Settings {
        fuse: FuseOptions {
            fsname: args
                .image
                .canonicalize()
                .unwrap_or_else(|_| args.image.clone())
                .display()
                .to_string(),
            ..Default::default()
        },
        engine: MountOptions::default(),
        // O_DIRECT by default: buffered, every log sync's fdatasync also
        // has to write out the host page cache's backlog of earlier data
        // writes, so fsyncs stall (dbench, 8 clients: max latency 432-556
        // ms buffered, 89-103 ms direct, for 15-20% less throughput;
        // docs/FUSE.md).
        direct_io: true,
    };
    // Whether `rw` was asked for (after any `ro`): it makes a rescue
    // mount's rollback writable.
    let mut asked_rw = false;
    let mut use_backup_root = false;
    let seconds = |key: &str, v: &str| {
        v.parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| Failure::new(format!("-o {key}={v}: expected whole seconds")))
    };
    for opt in args
        .options
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| !o.is_empty())
    {
        let (key, value) = opt
            .split_once('=')
            .map_or((opt, None), |(k, v)| (k, Some(v)));
        match (key, value) {
            ("ro", None) => {
                s.fuse.read_only = true;
                s.engine.read_only = true;
                asked_rw = false;
            }
            // The later of ro and rw wins, as in mount(8).
            ("rw", None) => {
                s.fuse.read_only = false;
                s.engine.read_only = false;
                asked_rw = true;
            }
            ("rescue", Some("usebackuproot")) => use_backup_root = true,
            ("rescue", Some(v)) => {
                return Err(Failure::new(format!(
                    "-o rescue={v}: the only rescue birch has is usebackuproot"
                )))
            }
            ("threads", Some(v)) => {
                s.fuse.threads = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0 && n <= 256)
                    .ok_or_else(|| Failure::new(format!("-o threads={v}: expected 1..=256")))?
            }
            ("transport", Some(v)) => {
                s.fuse.transport = match v {
                    "auto" => TransportChoice::Auto,
                    "devfuse" => TransportChoice::DevFuse,
                    "uring" => TransportChoice::IoUring,
                    _ => {
                        return Err(Failure::new(format!(
                            "-o transport={v}: expected devfuse, uring or auto"
                        )))
                    }
                }
            }
            ("uring_entries", Some(v)) => {
                s.fuse.uring_entries = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0 && n <= 64)
                    .ok_or_else(|| Failure::new(format!("-o uring_entries={v}: expected 1..=64")))?
            }
            ("commit", Some(v)) => {
                s.engine.commit_interval = Some(seconds(key, v)?).filter(|d| !d.is_zero())
            }
            ("entry_ttl", Some(v)) => {
                s.fuse.entry_ttl = seconds(key, v)?;
                s.fuse.negative_ttl = s.fuse.entry_ttl;
            }
            ("attr_ttl", Some(v)) => s.fuse.attr_ttl = seconds(key, v)?,
            ("writeback_cache", None) => s.fuse.writeback_cache = true,
            ("no_writeback_cache", None) => s.fuse.writeback_cache = false,
            ("node_cache", Some(v)) => s.engine.cache_nodes = cache_nodes(key, v)?,
            ("node_cache_idle", Some(v)) => s.engine.idle_cache_nodes = cache_nodes(key, v)?,
            ("dirty_limit", Some(v)) => {
                s.engine.dirty_limit_bytes = crate::parse_bytes(v)
                    .ok()
                    .filter(|&b| b >= 1 << 20)
                    .ok_or_else(|| {
                        Failure::new(format!("-o dirty_limit={v}: expected 1M or more"))
                    })?
            }
            // btrfs's names; lz4 stands in for lzo (docs/COMPRESSION.md).
            ("compress", Some(v)) | ("compress-force", Some(v)) => {
                s.engine.compress = birch::CompressOption::parse(v, key == "compress-force")
                    .map_err(|e| Failure::new(format!("-o {key}={v}: {e}")))?
            }
            ("compress", None) | ("compress-force", None) => {
                s.engine.compress = birch::CompressOption::parse("zstd", key == "compress-force")
                    .map_err(|e| Failure::new(format!("-o {key}: {e}")))?
            }
            ("cleaner_nodes", Some(v)) => {
                s.engine.cleaner_nodes_per_transaction =
                    v.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                        Failure::new(format!("-o cleaner_nodes={v}: expected 1 or more"))
                    })?
            }
            // Benchmark-only, left out of --help: restores what a seed
            // removed (docs/ABLATION.md); ids joined by '+', repeatable.
            ("ablate", Some(v)) => s
                .engine
                .ablation
                .enable(v)
                .map_err(|e| Failure::new(format!("-o ablate={v}: {e}")))?,
            ("memory_idle", Some(v)) => {
                s.fuse.memory_idle = Some(seconds(key, v)?).filter(|d| !d.is_zero())
            }
            ("no_open", None) => s.fuse.no_open = true,
            ("open", None) => s.fuse.no_open = false,
            ("direct_io", None) => s.direct_io = true,
            ("buffered", None) => s.direct_io = false,
            ("allow_other", None) => s.fuse.allow_other = true,
            ("fsname", Some(v)) => s.fuse.fsname = v.to_string(),
            // mount(8)'s generic options, in order: a later one overrides
            // an earlier one, as in mount(8).
            ("suid", None) => s.fuse.nosuid = false,
            ("nosuid", None) => s.fuse.nosuid = true,
            ("dev", None) => s.fuse.nodev = false,
            ("nodev", None) => s.fuse.nodev = true,
            ("exec", None) => s.fuse.noexec = false,
            ("noexec", None) => s.fuse.noexec = true,
            // fstab's "may be mounted by a user" options imply what a user
            // mount gets (mount(8)); later options may undo it.
            ("user" | "users", None) => {
                s.fuse.nosuid = true;
                s.fuse.nodev = true;
                s.fuse.noexec = true;
            }
            ("owner" | "group", None) => {
                s.fuse.nosuid = true;
                s.fuse.nodev = true;
            }
            // As for mount(2): relatime unless noatime or strictatime.
            ("atime" | "relatime" | "norelatime" | "nostrictatime", None) => {
                s.fuse.atime = AtimeUpdates::Relative
            }
            ("noatime", None) => s.fuse.atime = AtimeUpdates::Never,
            ("strictatime", None) => s.fuse.atime = AtimeUpdates::Always,
            ("diratime", None) => s.fuse.nodiratime = false,
            ("nodiratime", None) => s.fuse.nodiratime = true,
            ("sync", None) => s.fuse.sync = true,
            ("async", None) => s.fuse.sync = false,
            ("dirsync", None) => s.fuse.dirsync = true,
            ("subvol", Some(v)) => s.fuse.subvolume.path = Some(v.to_string()),
            ("user_subvol_rm_allowed", None) => s.fuse.user_subvol_rm_allowed = true,
            ("idmap", None) => s.fuse.idmap = true,
            ("noidmap", None) => s.fuse.idmap = false,
            ("subvolid", Some(v)) => {
                s.fuse.subvolume.id = Some(v.parse().map_err(|_| {
                    Failure::new(format!("-o subvolid={v}: expected a subvolume id"))
                })?)
            }
            // No effect here. lazytime: birch keeps atime updates in memory
            // until the next commit or fsync anyway. silent/loud: the
            // kernel's messages at mount, which FUSE does not print. The
            // rest are for mount(8) and fstab, not the filesystem.
            (
                "defaults"
                | "auto"
                | "noauto"
                | "nouser"
                | "_netdev"
                | "nofail"
                | "lazytime"
                | "nolazytime"
                | "silent"
                | "loud"
                | "default_permissions",
                None,
            ) => {}
            ("comment", Some(_)) => {}
            (k, _) if k.starts_with("x-") => {}
            _ => return Err(Failure::new(format!("unknown mount option '{opt}'"))),
        }
    }
    if s.engine.idle_cache_nodes > s.engine.cache_nodes {
        return Err(Failure::new(format!(
            "-o node_cache_idle ({} nodes) is larger than node_cache ({} nodes)",
            s.engine.idle_cache_nodes, s.engine.cache_nodes
        )));
    }
    s.engine.atime = s.fuse.atime;
    if use_backup_root {
        s.engine.rescue = Rescue::UseBackupRoot { writable: asked_rw };
    }
    Ok(s)
}

/// A node cache size given in bytes (`-o node_cache=256M`), in nodes of
/// 16 KiB: at least one.
fn cache_nodes(key: &str, v: &str) -> Result<usize, Failure> {
    let bytes = crate::parse_bytes(v).map_err(|e| Failure::new(format!("-o {key}: {e}")))?;
    usize::try_from(bytes / birch::format::NODE_SIZE as u64)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| Failure::new(format!("-o {key}={v}: expected 16K or more")))
}

/// Takes an exclusive advisory lock on the image so a second `birch mount`
/// of it (or a scrub or mkfs) fails instead of corrupting it. A daemon
/// that was just unmounted still holds the lock while it commits and
/// exits, so the lock is awaited for a while when a running process holds
/// it and the image is not listed as mounted. A lock no running process
/// holds is awaited briefly (the loop device of a daemon that just exited
/// lets go of the image as it detaches itself) and then refused, saying
/// what holds it (holders.rs); so is a mounted image, at once.
pub(crate) fn lock_image(file: &File, image: &Path) -> Result<(), Failure> {
    let start = std::time::Instant::now();
    loop {
        // SAFETY: flock on an fd we own; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(Failure::new(format!(
                "{}: cannot lock: {e}",
                image.display()
            )));
        }
        let mounted = is_mounted(image);
        let patience = if holders::lock_holder(file).is_some() {
            Duration::from_secs(20)
        } else {
            Duration::from_secs(1)
        };
        if mounted || start.elapsed() >= patience {
            return Err(Failure::new(format!(
                "{}: {}",
                image.display(),
                holders::why_locked(image, file, mounted)
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether /proc/self/mountinfo lists `image`, or a loop device bound to
/// it, as a mount's source.
pub(crate) fn is_mounted(image: &Path) -> bool {
    let Ok(canonical) = image.canonicalize() else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let mut wanted = vec![canonical];
    wanted.extend(loopdev::devices_of(image));
    // Fields after " - " are: fstype, source, super options.
    info.lines()
        .filter_map(|l| l.split_once(" - "))
        .filter_map(|(_, rest)| rest.split_whitespace().nth(1))
        .any(|source| wanted.iter().any(|w| Path::new(source) == w))
}

/// Blocks the termination signals in this thread (and every thread it
/// starts later) and returns a thread that waits for one and unmounts.
fn unmount_on_signal(mountpoint: PathBuf) {
    // SAFETY: plain sigset manipulation on a local, then pthread_sigmask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: `set` is a valid signal set; `sig` receives the number.
        unsafe { libc::sigwait(&set, &mut sig) };
        let path = CString::new(mountpoint.as_os_str().as_bytes()).expect("mount point has no NUL");
        // SAFETY: a valid C string path.
        if unsafe { libc::umount2(path.as_ptr(), 0) } == 0 {
            return;
        }
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) {
            // An unprivileged mount: only the setuid fusermount3 may take
            // it down (lazily, for the reason below).
            let _ = std::process::Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&mountpoint)
                .status();
        } else {
            // Busy (a process sits in it): detach, so the session ends now
            // and the commit below still runs.
            // SAFETY: as above.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    });
}

pub fn mount(args: &MountArgs) -> Result<u8, Failure> {
    let mut settings = parse_options(args)?;
    if !args.mountpoint.is_dir() {
        return Err(Failure::new(format!(
            "{}: not a directory",
            args.mountpoint.display()
        )));
    }
    // A detached daemon (ready_fd) was started after this check.
    if args.ready_fd.is_none() {
        if let Some(code) = crate::mount_again::mount_if_served(args)? {
            return Ok(code);
        }
    }
    if settings.engine.ablation.any() && args.ready_fd.is_none() {
        // Said once, before detaching: this mount is slower on purpose.
        eprintln!(
            "birch: ablate={}: seed mechanisms switched off for a benchmark (docs/ABLATION.md)",
            settings.engine.ablation.seeds().join("+")
        );
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Said here, before detaching: a detached daemon's stderr goes nowhere.
        eprintln!("birch: {}", limit_to_caller(args, &mut settings)?);
    }
    if !args.foreground {
        return detach(args);
    }
    let mut ready_pipe = args.ready_fd.map(|fd| {
        // SAFETY: the parent passed us this fd, open for writing, and no
        // one else in this process owns it.
        unsafe { File::from_raw_fd(fd) }
    });
    let report = |pipe: &mut Option<File>, message: &str| {
        if let Some(p) = pipe.as_mut() {
            let _ = p.write_all(message.as_bytes());
        }
    };
    let result = serve(args, settings, &mut |warnings: &str| {
        report(&mut ready_pipe, &format!("ready\n{warnings}"));
        ready_pipe = None;
    });
    if let Err(f) = &result {
        report(&mut ready_pipe, &f.message);
    }
    result
}

/// Leaves out of an unprivileged mount what fusermount3 grants only to
/// root, so that a user can mount an image they own with no options, and
/// says in one line what was left out and why. Fails only if the caller
/// asked for `allow_other` explicitly and may not have it.
fn limit_to_caller(args: &MountArgs, settings: &mut Settings) -> Result<String, Failure> {
    // fusermount3 forces these on for users; asked for, they show in
    // /proc/mounts as what they are, not as a silently dropped request.
    settings.fuse.nosuid = true;
    settings.fuse.nodev = true;
    let mut note = "not root: a plain FUSE mount with nosuid,nodev (set-ID bits and device \
                    nodes are honoured only on root's mounts)"
        .to_string();
    if !user_allow_other() {
        let asked = args
            .options
            .iter()
            .flat_map(|o| o.split(','))
            .any(|o| o == "allow_other");
        if asked {
            return Err(Failure::new(
                "-o allow_other: only root may have it unless /etc/fuse.conf says user_allow_other",
            ));
        }
        settings.fuse.allow_other = false;
        note.push_str(
            ", without allow_other (only you can enter it: /etc/fuse.conf has no user_allow_other)",
        );
    }
    note.push_str(
        "; sync(1) and syncfs(2) will not reach birch (use fsync or `birch sync MOUNTPOINT`)",
    );
    Ok(note)
}

/// Whether fusermount3 lets users ask for allow_other: a line
/// `user_allow_other` in /etc/fuse.conf.
fn user_allow_other() -> bool {
    std::fs::read_to_string("/etc/fuse.conf")
        .is_ok_and(|conf| conf.lines().any(|l| l.trim() == "user_allow_other"))
}

/// The device stack of a mount: the image, optionally logged, behind the
/// gate the shutdown ioctl closes.
type MountDevice = Arc<ShutdownGate<Box<dyn BlockDevice>>>;

/// Tells the write log about fsync replies, closes the gate on shutdown
/// and names the image for `birch stats`.
struct Control {
    gate: MountDevice,
    write_log: Option<Arc<WriteLogDevice<FileDevice>>>,
    image: ImageInfo,
}

impl MountControl for Control {
    fn fsync_answered(&self, ino: u64) {
        if let Some(log) = &self.write_log {
            // A log that cannot take a mark is a broken test record, not a
            // broken filesystem: the mount goes on.
            let _ = log.mark(&format!("fsync {ino}"));
        }
    }

    fn stop_device(&self) {
        self.gate.trip();
    }

    fn image(&self) -> Option<ImageInfo> {
        Some(self.image.clone())
    }
}

/// Opens the image for the engine, as the device the mount sits on:
/// read-write also for `-o ro` (the engine writes nothing while read-only,
/// and `mount -o remount,rw` can then switch it), read-only only for `-o
/// ro` of an image that cannot be written here.
fn open_device(image: &Path, settings: &Settings) -> Result<FileDevice, Failure> {
    match FileDevice::open(image, settings.direct_io) {
        // The filesystem holding the image has no O_DIRECT: it refuses
        // the open (tmpfs) or fails the first read (FileDevice::open
        // probes one). Buffered I/O is as safe, only slower to fsync.
        Err(e) if settings.direct_io && e.raw_os_error() == Some(libc::EINVAL) => {
            eprintln!(
                "birch: {}: O_DIRECT is not supported there ({e}); using buffered I/O",
                image.display()
            );
            FileDevice::open(image, false)
        }
        other => other,
    }
    .or_else(|e| {
        if settings.engine.read_only && cannot_write(&e) {
            FileDevice::open_read_only(image)
        } else {
            Err(e)
        }
    })
    .map_err(|e| Failure::new(format!("{}: cannot open: {e}", image.display())))
}

/// An open for writing failed for want of permission (a mode, a read-only
/// filesystem or device, an immutable file), not because the path is bad.
fn cannot_write(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EROFS | libc::EPERM)
    )
}

/// What the mount holds on to besides the engine's device: the locked
/// image file and the loop device it is attached to.
struct Attached {
    _image: File,
    _loop: LoopDevice,
}

/// Opens and locks the image, and decides the mount type. As root the
/// mount is `fuseblk`, the only FUSE type the kernel sends syncfs(2) to
/// (so sync(1) and `sync -f` commit birch): a block device is mounted as
/// it is (birch opens it by path without O_EXCL; the kernel's mount holds
/// it exclusively), an image file through a loop device attached here.
/// Unprivileged, it is a plain `fuse` mount (`mount` says so).
fn open_and_lock(
    image: &Path,
    settings: &mut Settings,
) -> Result<(FileDevice, Option<Attached>), Failure> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let block_device = std::fs::metadata(image).is_ok_and(|m| m.file_type().is_block_device());
    if root && !block_device {
        // Read-write also for `-o ro`, so that the loop device is: the
        // kernel's mount is read-only by its flag, and `remount,rw` is
        // allowed. A read-only loop device makes the kernel refuse it
        // ("write-protected"), which is right for an image that cannot be
        // written.
        let (file, writable) = match File::options().read(true).write(true).open(image) {
            Ok(file) => Ok((file, true)),
            Err(e) if settings.engine.read_only && cannot_write(&e) => {
                File::open(image).map(|file| (file, false))
            }
            Err(e) => Err(e),
        }
        .map_err(|e| Failure::new(format!("{}: cannot open: {e}", image.display())))?;
        // Locked before the loop device exists, so a second mount of the
        // image fails here instead of mounting the same filesystem twice.
        lock_image(&file, image)?;
        let backing = if settings.direct_io {
            Backing::Direct
        } else {
            Backing::Buffered
        };
        match LoopDevice::attach(&file, !writable, backing) {
            Ok(loop_dev) => {
                // O_DIRECT on the loop device: the image's data is cached
                // at most once, in the image file's page cache (-o buffered).
                let dev = if writable {
                    FileDevice::open(loop_dev.path(), true)
                } else {
                    FileDevice::open_read_only(loop_dev.path())
                }
                .map_err(|e| {
                    Failure::new(format!("{}: cannot open: {e}", loop_dev.path().display()))
                })?;
                settings.fuse.block_device = Some(loop_dev.path().to_path_buf());
                settings.fuse.fsname = loop_dev.path().display().to_string();
                let attached = Attached {
                    _image: file,
                    _loop: loop_dev,
                };
                return Ok((dev, Some(attached)));
            }
            Err(e) => {
                eprintln!(
                    "birch: {}: no loop device ({e}): mounting as plain FUSE; sync(1) and syncfs(2) will not reach birch",
                    image.display()
                );
                drop(file);
            }
        }
    }
    let dev = open_device(image, settings)?;
    lock_image(dev.file(), image)?;
    if root && block_device {
        settings.fuse.block_device = image.canonicalize().ok();
    }
    Ok((dev, None))
}

/// Makes every thread of the daemon allocate from glibc's main arena
/// (before any request thread exists). A thread's own arena grows its heap
/// with one mprotect(2) per allocation past its top, page by page, and
/// gives memory back when its top is free: dirty file pages (4 KiB each,
/// allocated by request threads, freed by whichever thread writes them
/// back) made that a tenth of the daemon's CPU on an untar (issue 12,
/// docs/FUSE.md "Daemon CPU per request"). The main arena grows with
/// brk(2) in 128 KiB steps. Nearly all of the engine's work runs under its
/// state lock anyway: the shared arena's lock was not seen contended.
fn share_one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes glibc's allocator parameters; it is
    // called before the daemon starts other threads.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// `ready` runs once the mount is live, with the warnings the mount
/// printed that a detached daemon's parent must print in its place.
fn serve(
    args: &MountArgs,
    mut settings: Settings,
    ready: &mut dyn FnMut(&str),
) -> Result<u8, Failure> {
    share_one_malloc_arena();
    let image = &args.image;
    let (dev, _attached) = open_and_lock(image, &mut settings)?;
    let image_info = ImageInfo {
        path: image
            .canonicalize()
            .unwrap_or_else(|_| image.clone())
            .display()
            .to_string(),
        direct_io: dev.direct_io(),
    };
    let (inner, write_log): (Box<dyn BlockDevice>, _) = match &args.write_log {
        Some(path) => {
            let file = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)
                .map_err(|e| {
                    Failure::new(format!(
                        "{}: cannot create the write log: {e}",
                        path.display()
                    ))
                })?;
            let logged = Arc::new(
                WriteLogDevice::new(dev, file)
                    .map_err(|e| Failure::new(format!("{}: {e}", path.display())))?,
            );
            (Box::new(logged.clone()), Some(logged))
        }
        None => (Box::new(dev), None),
    };
    let gate: MountDevice = Arc::new(ShutdownGate::new(inner));
    let control = Arc::new(Control {
        gate: gate.clone(),
        write_log,
        image: image_info,
    });
    unmount_on_signal(args.mountpoint.clone());
    let fs = Filesystem::open(gate, settings.engine)
        .map_err(|e| Failure::new(format!("{}: {e}", image.display())))?;
    report_replay(image, fs.replay_outcome());
    let warnings = match fs.backup_root_used() {
        Some(used) => {
            let warning = backup_root_warning(image, &used, fs.is_read_only());
            eprintln!("{warning}");
            format!("{warning}\n")
        }
        None => String::new(),
    };
    // A rollback mounted read-only is read-only for the kernel too.
    settings.fuse.read_only |= fs.is_read_only();
    // `serve` resolves it again; here a bad subvol= fails the mount
    // with its own message, not as a FUSE session failure.
    birch_fuse::subvol::mount_root(&fs, &settings.fuse.subvolume)
        .map_err(|e| Failure::new(format!("{}: {e}", image.display())))?;
    let fs = birch_fuse::serve(
        fs,
        &args.mountpoint,
        &settings.fuse,
        control,
        |transport_note| {
            // The transport note (why not io_uring) is said once, here and
            // by a detached daemon's parent, like the warnings above.
            let transport_note = transport_note
                .map(|note| {
                    eprintln!("birch: {note}");
                    format!("birch: {note}\n")
                })
                .unwrap_or_default();
            ready(&format!("{warnings}{transport_note}"))
        },
    )
    .map_err(|e| {
        Failure::new(format!(
            "{}: FUSE session failed: {e}",
            args.mountpoint.display()
        ))
    })?;
    fs.close().map_err(|e| {
        Failure::new(format!(
            "{}: commit at unmount failed: {e}",
            image.display()
        ))
    })?;
    Ok(0)
}

/// Says on stderr what the mount did with a log it found: nothing when it
/// replayed cleanly, loudly when it had to throw the log away.
fn report_replay(image: &Path, outcome: Option<ReplayOutcome>) {
    match outcome {
        Some(ReplayOutcome::Discarded(why)) => eprintln!(
            "birch: {}: WARNING: the fsync log could not be replayed and was discarded; \
             the last commit is mounted and what was fsynced after it is lost: {why}",
            image.display()
        ),
        Some(ReplayOutcome::Replayed(report)) if report.names_without_parent > 0 => eprintln!(
            "birch: {}: WARNING: log replay left out {} logged names whose directory \
             did not exist",
            image.display(),
            report.names_without_parent
        ),
        _ => {}
    }
}

/// Says that the mount fell back to an older commit, and what that lost.
fn backup_root_warning(image: &Path, used: &BackupRootUsed, read_only: bool) -> String {
    format!(
        "birch: {}: WARNING: {}; {}",
        image.display(),
        used,
        if read_only {
            "mounted read-only (unmounting leaves the image as it was; `-o \
             rescue=usebackuproot,rw` makes the rollback permanent)"
        } else {
            "mounted read-write: the rollback is committed, the newer commits are gone"
        }
    )
}

/// Starts this command again in the foreground as a daemon in its own
/// session and waits until it reports the mount live (exit 0) or fails.
fn detach(args: &MountArgs) -> Result<u8, Failure> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills `fds`; the read end is close-on-exec, the write
    // end is inherited by the daemon.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), 0) } != 0 {
        return Err(Failure::new(format!(
            "cannot create a pipe: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: both fds were just created and are owned here.
    let (mut read_end, write_end) =
        unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    // SAFETY: FD_CLOEXEC on our read end only.
    unsafe { libc::fcntl(read_end.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    let exe = std::env::current_exe()
        .map_err(|e| Failure::new(format!("cannot find the birch executable: {e}")))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("mount")
        .arg(&args.image)
        .arg(&args.mountpoint)
        .arg("--foreground")
        .arg("--ready-fd")
        .arg(write_end.as_raw_fd().to_string());
    if let Some(log) = &args.write_log {
        cmd.arg("--write-log").arg(log);
    }
    for o in &args.options {
        cmd.arg("-o").arg(o);
    }
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from the
    // terminal's session so the shell's signals do not reach it.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    // The daemon reports through the pipe, never the terminal.
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = cmd
        .spawn()
        .map_err(|e| Failure::new(format!("cannot start the mount daemon: {e}")))?;
    drop(write_end);
    let mut message = String::new();
    let _ = read_end.read_to_string(&mut message);
    if let Some(warnings) = message.strip_prefix("ready\n") {
        // The daemon's stderr goes nowhere: its warnings are said here.
        eprint!("{warnings}");
        return Ok(0);
    }
    let status = child.wait().ok();
    Err(Failure::new(if message.is_empty() {
        format!("mount daemon exited ({status:?}) before the mount was live")
    } else {
        message
    }))
}

pub fn sync(args: &SyncArgs) -> Result<u8, Failure> {
    let dir = File::open(&args.mountpoint)
        .map_err(|e| Failure::new(format!("{}: {e}", args.mountpoint.display())))?;
    // First make the kernel hand over the pages it caches (the writeback
    // cache): syncfs writes them back to birch, which the commit then
    // makes durable.
    // SAFETY: syncfs on an fd we own.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(Failure::new(format!(
            "{}: syncfs: {}",
            args.mountpoint.display(),
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: an ioctl without argument data on an fd we own.
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), BIRCH_IOC_SYNC as libc::c_ulong) };
    if rc != 0 {
        return Err(ioctl_failure(&args.mountpoint));
    }
    Ok(0)
}

/// The failure of a birch ioctl just issued on `mountpoint`: ENOTTY means
/// the path is not on a birch mount.
fn ioctl_failure(mountpoint: &Path) -> Failure {
    let e = std::io::Error::last_os_error();
    let why = if e.raw_os_error() == Some(libc::ENOTTY) {
        "not a birch mount".to_string()
    } else {
        e.to_string()
    };
    Failure::new(format!("{}: {why}", mountpoint.display()))
}
