//! The FUSE front end: turns kernel requests into calls of the engine's
//! [`birch::fs::Filesystem`] API. It holds no filesystem state of its own
//! beyond the mapping of FUSE's root inode number; docs/FUSE.md explains
//! each kernel option chosen here and what it measured.

mod adapter;
mod attr;
mod caller;
mod fuseblk;
mod listing;
mod memory;
mod remount;
mod requests;
pub mod scrub;
pub mod send;
pub mod stats;
pub mod subvol;
mod transport;

pub use adapter::{
    supported_xattr_name, BirchFuse, FuseOptions, MountControl, NoControl, TransportChoice,
    BIRCH_IOC_STATS, BIRCH_IOC_SYNC, BIRCH_STATS_MAX, XFS_IOC_GOINGDOWN,
};
pub use scrub::{BIRCH_IOC_SCRUB, BIRCH_SCRUB_MAX};

use birch::device::BlockDevice;
use birch::fs::Filesystem;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Mounts `fs` at `mountpoint` and serves it until the filesystem is
/// unmounted; `ready` runs once the mount is live, with a note for the
/// user if the kernel offered io_uring but requests go through /dev/fuse
/// (and why); `control` hears about fsyncs and the shutdown ioctl. Returns the
/// filesystem (for the caller to close and commit).
pub fn serve<D: BlockDevice + 'static>(
    fs: Filesystem<D>,
    mountpoint: &Path,
    options: &FuseOptions,
    control: Arc<dyn MountControl>,
    ready: impl FnOnce(Option<&str>),
) -> io::Result<Filesystem<D>> {
    let fs = Arc::new(fs);
    // A mount started read-only follows `mount -o remount,rw` (remount.rs).
    // The mount point is resolved now: once mounted, resolving it would
    // ask this daemon, which is not serving yet.
    let remount = if options.read_only {
        Some(Arc::new(remount::RemountWatch::new(
            mountpoint,
            &options.fsname,
        )?))
    } else {
        None
    };
    let root = subvol::mount_root(&fs, &options.subvolume).map_err(io::Error::other)?;
    let mut adapter = BirchFuse::new(fs.clone(), options.clone(), control).with_root(root);
    if let Some(watch) = &remount {
        adapter = adapter.with_remount_watch(watch.clone());
    }
    let transport = adapter.transport_cell();
    let notifier = adapter.notifier_cell();
    let requests = adapter.request_counts();
    let config = options.session_config();
    let session = match &options.block_device {
        Some(device) => {
            let fd = fuseblk::mount(device, mountpoint, &config)?;
            fuser::Session::from_fd(adapter, fd, config.acl, config).inspect_err(|_| {
                fuseblk::detach(mountpoint);
            })?
        }
        None => fuser::Session::new(adapter, mountpoint, &config)?,
    };
    // On failure a plain fuse session's drop unmounts again; a fuseblk
    // mount was made here and is detached here.
    let detach_on_failure = |_: &io::Error| {
        if options.block_device.is_some() {
            fuseblk::detach(mountpoint);
        }
    };
    let fallback = match session.transport() {
        fuser::Transport::IoUring { .. } => None,
        fuser::Transport::DevFuse(reason) => Some((reason, transport::fallback_reason(reason))),
    };
    if let (Some((_, reason)), TransportChoice::IoUring) = (&fallback, options.transport) {
        let e = io::Error::other(format!("transport=uring: {reason}"));
        // The connection is initialized: detaching a fuseblk mount now
        // would send DESTROY and wait for this thread to answer it.
        // Closing the connection first (the session owns it) aborts it.
        drop(session);
        detach_on_failure(&e);
        return Err(e);
    }
    // Said only when io_uring was offered and still failed: a kernel that
    // does not offer it (the module parameter is off by default) is the
    // usual case, shown by `birch stats`, not worth a line at every mount.
    let fallback_note = fallback
        .filter(|(why, _)| {
            options.transport == TransportChoice::Auto
                && !matches!(why, fuser::DevFuseReason::NotOffered)
        })
        .map(|(_, reason)| format!("serving over /dev/fuse: {reason}"));
    // Set once, here: the session was built with the adapter inside it.
    let _ = transport.set(session.transport().clone());
    let _ = notifier.set(session.notifier());
    options
        .apply_mount_attributes(mountpoint)
        .inspect_err(detach_on_failure)?;
    let watcher = match remount {
        Some(watch) => {
            Some(remount::Watcher::spawn(watch, fs.clone()).inspect_err(detach_on_failure)?)
        }
        None => None,
    };
    let idle_release = match options.memory_idle {
        Some(idle) => Some(
            memory::IdleRelease::spawn(fs.clone(), requests, idle)
                .inspect_err(detach_on_failure)?,
        ),
        None => None,
    };
    ready(fallback_note.as_deref());
    if options.no_open && !options.read_only {
        let mountpoint = mountpoint.to_path_buf();
        // The open it makes is served by the session's threads, which start
        // in run() below: it must not run on this thread.
        std::thread::spawn(move || prime_no_open(&mountpoint));
    }
    let served = session.run();
    // Its reference to the filesystem must be gone before the filesystem
    // is handed back.
    if let Some(watcher) = watcher {
        watcher.stop();
    }
    if let Some(idle_release) = idle_release {
        idle_release.stop();
    }
    served?;
    Arc::try_unwrap(fs)
        .map_err(|_| io::Error::other("filesystem still referenced after the FUSE session ended"))
}

/// Teaches the kernel that birch has no open. The kernel learns it only
/// from an ENOSYS answer to a FUSE_OPEN; until the first one, every file
/// opened by CREATE is released with a RELEASE request at its last close,
/// which on fuseblk is a synchronous round trip: one per created file on
/// an untar or seed 003 (docs/FUSE.md, "Requests per operation"). No
/// regular file need exist for this: a nameless one (O_TMPFILE; the
/// engine frees it at the kernel's forget) is opened again through
/// /proc/self/fd, which is a plain open. Best effort: if any step fails
/// the mount only keeps the RELEASEs.
fn prime_no_open(mountpoint: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    const FUSE_SUPER_MAGIC: libc::c_long = 0x6573_5546;
    let Ok(root) = std::fs::File::open(mountpoint) else {
        return;
    };
    // SAFETY: all-zero bytes are a valid statfs (plain integers).
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor and a statfs for the kernel to fill.
    let rc = unsafe { libc::fstatfs(root.as_raw_fd(), &mut st) };
    // Only on our mount: if it is already gone, the directory is the one
    // underneath, which this must not touch.
    if rc != 0 || st.f_type as libc::c_long != FUSE_SUPER_MAGIC {
        return;
    }
    let Ok(nameless) = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(format!("/proc/self/fd/{}", root.as_raw_fd()))
    else {
        return;
    };
    let _ = std::fs::File::open(format!("/proc/self/fd/{}", nameless.as_raw_fd()));
}
