//! The FUSE front end: turns kernel requests into calls of the engine's
//! [`birch::fs::Filesystem`] API. It holds no filesystem state of its own
//! beyond the mapping of FUSE's root inode number; docs/FUSE.md explains
//! each kernel option chosen here and what it measured.

mod adapter;
mod attr;
mod fuseblk;

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
    let adapter = BirchFuse::new(fs.clone(), options.clone(), control);
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
    options
        .apply_mount_attributes(mountpoint)
        .inspect_err(|_| {
            if options.block_device.is_some() {
                fuseblk::detach(mountpoint);
            }
        })?;
    ready();
    session.run()?;
    Arc::try_unwrap(fs)
        .map_err(|_| io::Error::other("filesystem still referenced after the FUSE session ended"))
}
