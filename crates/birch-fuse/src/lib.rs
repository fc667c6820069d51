//! The FUSE front end: turns kernel requests into calls of the engine's
//! [`birch::fs::Filesystem`] API. It holds no filesystem state of its own
//! beyond the mapping of FUSE's root inode number; docs/FUSE.md explains
//! each kernel option chosen here and what it measured.

mod adapter;
mod attr;
mod fuseblk;
mod remount;

pub use adapter::{
    BirchFuse, FuseOptions, MountControl, NoControl, BIRCH_IOC_STATS, BIRCH_IOC_SYNC,
    XFS_IOC_GOINGDOWN,
};

use birch::device::BlockDevice;
use birch::fs::Filesystem;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Mounts `fs` at `mountpoint` and serves it until the filesystem is
/// unmounted; `ready` runs once the mount is live, `control` hears about
/// fsyncs and the shutdown ioctl. Returns the filesystem
/// (for the caller to close and commit).
pub fn serve<D: BlockDevice + 'static>(
    fs: Filesystem<D>,
    mountpoint: &Path,
    options: &FuseOptions,
    control: Arc<dyn MountControl>,
    ready: impl FnOnce(),
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
    let mut adapter = BirchFuse::new(fs.clone(), options.clone(), control);
    if let Some(watch) = &remount {
        adapter = adapter.with_remount_watch(watch.clone());
    }
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
    options
        .apply_mount_attributes(mountpoint)
        .inspect_err(detach_on_failure)?;
    let watcher = match remount {
        Some(watch) => {
            Some(remount::Watcher::spawn(watch, fs.clone()).inspect_err(detach_on_failure)?)
        }
        None => None,
    };
    ready();
    let served = session.run();
    // Its reference to the filesystem must be gone before the filesystem
    // is handed back.
    if let Some(watcher) = watcher {
        watcher.stop();
    }
    served?;
    Arc::try_unwrap(fs)
        .map_err(|_| io::Error::other("filesystem still referenced after the FUSE session ended"))
}
