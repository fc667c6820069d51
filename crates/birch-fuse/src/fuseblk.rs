//! Mounting as `fuseblk`: the kernel forwards syncfs(2) (so `sync(1)`,
//! `sync -f` and a remount's sync) only to FUSE connections whose
//! superblock sits on a block device. fuser mounts only the plain `fuse`
//! type, so birch does the mount(2) itself, the way libfuse does for
//! ntfs-3g's `blkdev` option, and hands the /dev/fuse descriptor to
//! `fuser::Session::from_fd`. Needs CAP_SYS_ADMIN (fusermount3 refuses
//! `blkdev` to unprivileged users too).

use fuser::{Config, MountOption, SessionACL};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The block size the kernel's superblock gets: birch's node and sector
/// size, at least any device's logical block size.
const BLKSIZE: u32 = 4096;

/// Mounts a fuseblk filesystem on `device` at `mountpoint` with `config`'s
/// options and returns the connection's /dev/fuse descriptor.
pub(crate) fn mount(device: &Path, mountpoint: &Path, config: &Config) -> io::Result<OwnedFd> {
    let fuse = File::options().read(true).write(true).open("/dev/fuse")?;
    let root_mode = File::open(mountpoint)?.metadata()?.permissions().mode();
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={root_mode:o},user_id={uid},group_id={gid},blksize={BLKSIZE}",
        fuse.as_raw_fd()
    );
    // fuser's own mount(2) defaults to nodev and nosuid unless told
    // otherwise; keep its meaning of the same option list.
    let mut flags = libc::MS_NODEV | libc::MS_NOSUID;
    for option in &config.mount_options {
        match option {
            // The source of a fuseblk mount is the device itself.
            MountOption::FSName(_) => {}
            MountOption::Subtype(s) => data.push_str(&format!(",subtype={s}")),
            MountOption::CUSTOM(s) => data.push_str(&format!(",{s}")),
            MountOption::DefaultPermissions => data.push_str(",default_permissions"),
            MountOption::AutoUnmount => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "auto_unmount needs fusermount3, which cannot mount fuseblk",
                ))
            }
            MountOption::Dev => flags &= !libc::MS_NODEV,
            MountOption::Suid => flags &= !libc::MS_NOSUID,
            MountOption::NoDev => flags |= libc::MS_NODEV,
            MountOption::NoSuid => flags |= libc::MS_NOSUID,
            MountOption::RO => flags |= libc::MS_RDONLY,
            MountOption::NoExec => flags |= libc::MS_NOEXEC,
            MountOption::NoAtime => flags |= libc::MS_NOATIME,
            MountOption::DirSync => flags |= libc::MS_DIRSYNC,
            MountOption::Sync => flags |= libc::MS_SYNCHRONOUS,
            MountOption::RW | MountOption::Exec | MountOption::Atime | MountOption::Async => {}
        }
    }
    if config.acl == SessionACL::All {
        data.push_str(",allow_other");
    }
    let source = c_path(device)?;
    let target = c_path(mountpoint)?;
    let fstype = c"fuseblk";
    let data = CString::new(data).map_err(io::Error::other)?;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives
    // the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fuse.into())
}

/// Detaches a mount whose session never started, so a failed mount does
/// not leave a dead mount point behind.
pub(crate) fn detach(mountpoint: &Path) {
    if let Ok(target) = c_path(mountpoint) {
        // SAFETY: a valid C string path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}
