//! Attaching an image file to a loop device, so that `birch mount` of an
//! image can mount as `fuseblk` (the only FUSE mount type the kernel sends
//! syncfs to). The device is attached with LO_FLAGS_AUTOCLEAR: it detaches
//! itself when its last opener closes it, which is when both the mount is
//! gone and the daemon has exited, however it exited (SIGKILL included).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

// <linux/loop.h>
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;
const LO_NAME_SIZE: usize = 64;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A loop device bound to an image. Holding it keeps the device open (so
/// it cannot auto-clear before the mount holds it too); dropping it closes
/// that descriptor, and the device detaches once nothing else has it open.
pub struct LoopDevice {
    path: PathBuf,
    _open: File,
}

/// How the loop device reads and writes the image.
pub enum Backing {
    /// O_DIRECT on the image: data is not cached twice (once for birch's
    /// device, once for the image file) and a flush has no page-cache
    /// backlog to write out first.
    Direct,
    /// Through the host page cache (`-o buffered`, or an image on a
    /// filesystem without O_DIRECT).
    Buffered,
}

impl LoopDevice {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Binds a free loop device to `image` (opened read-only or
    /// read-write to match `read_only`).
    pub fn attach(image: &File, read_only: bool, backing: Backing) -> io::Result<LoopDevice> {
        let control = File::options()
            .read(true)
            .write(true)
            .open("/dev/loop-control")?;
        let mut flags = LO_FLAGS_AUTOCLEAR;
        if read_only {
            flags |= LO_FLAGS_READ_ONLY;
        }
        if matches!(backing, Backing::Direct) {
            flags |= LO_FLAGS_DIRECT_IO;
        }
        // Another process may take the free device between GET_FREE and
        // CONFIGURE (EBUSY): ask again.
        for _ in 0..100 {
            // SAFETY: an ioctl without argument on an fd we own.
            let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let path = PathBuf::from(format!("/dev/loop{n}"));
            let dev = File::options().read(true).write(!read_only).open(&path)?;
            // SAFETY: all-zero is a valid loop_config (plain integers and
            // byte arrays).
            let mut config: LoopConfig = unsafe { std::mem::zeroed() };
            config.fd = image.as_raw_fd() as u32;
            config.info.lo_flags = flags;
            let name = std::fs::read_link(format!("/proc/self/fd/{}", image.as_raw_fd()))
                .unwrap_or_default();
            let name = name.as_os_str().as_bytes();
            let n = name.len().min(LO_NAME_SIZE - 1);
            config.info.lo_file_name[..n].copy_from_slice(&name[..n]);
            // SAFETY: LOOP_CONFIGURE reads a loop_config, which `config` is.
            let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &config) };
            if rc == 0 {
                return Ok(LoopDevice { path, _open: dev });
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EBUSY) => continue,
                // The image's filesystem has no O_DIRECT (tmpfs).
                Some(libc::EINVAL) if flags & LO_FLAGS_DIRECT_IO != 0 => {
                    eprintln!(
                        "birch: O_DIRECT is not supported for the image; the loop device uses buffered I/O"
                    );
                    flags &= !LO_FLAGS_DIRECT_IO;
                }
                _ => return Err(e),
            }
        }
        Err(io::Error::other("no free loop device stayed free"))
    }
}

/// The loop devices bound to `image` (by the backing file's path the
/// kernel reports), so a mount through one of them counts as a mount of
/// the image.
pub fn devices_of(image: &Path) -> Vec<PathBuf> {
    let Ok(canonical) = image.canonicalize() else {
        return Vec::new();
    };
    let wanted = canonical.as_os_str().as_bytes();
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().as_bytes().starts_with(b"loop"))
        .filter(|e| {
            std::fs::read(e.path().join("loop/backing_file"))
                .is_ok_and(|b| b.strip_suffix(b"\n").unwrap_or(&b) == wanted)
        })
        .map(|e| Path::new("/dev").join(e.file_name()))
        .collect()
}
