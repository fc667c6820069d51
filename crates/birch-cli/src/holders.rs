//! Who holds an image that birch cannot lock: the process named in
//! /proc/locks for the image's lock, and, when that process is gone but a
//! loop device still keeps the image (and its lock) open, the processes
//! with files open on that loop device's filesystem. The usual case: a
//! crashed daemon's mount was detached with `umount -l` while a program
//! still had a file open in it; the kernel keeps the mount's superblock,
//! its loop device and the loop device's reference to the locked image
//! until the last such file is closed.

use crate::loopdev;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// A running process.
pub struct Process {
    pub pid: u32,
    pub command: String,
}

impl std::fmt::Display for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({})", self.pid, self.command)
    }
}

fn process(pid: u32) -> Option<Process> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(Process {
        pid,
        command: comm.trim_end().to_string(),
    })
}

/// The running process that holds the flock on `file` (by /proc/locks)
/// and still has the file open, if any. /proc/locks names the process
/// that took the lock, as pid 0 once it has exited; a lock outliving its
/// process is held by whatever still refers to the open file (a loop
/// device, a child that inherited it).
pub fn lock_holder(file: &File) -> Option<Process> {
    let meta = file.metadata().ok()?;
    let (dev, ino) = (meta.dev(), meta.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let pid = locks.lines().find_map(|line| {
        // "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF"; waiters
        // have "->" before the type and are skipped.
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&"FLOCK") {
            return None;
        }
        let pid: u32 = fields.get(4)?.parse().ok()?;
        let mut id = fields.get(5)?.split(':');
        let major = u32::from_str_radix(id.next()?, 16).ok()?;
        let minor = u32::from_str_radix(id.next()?, 16).ok()?;
        let inode: u64 = id.next()?.parse().ok()?;
        (libc::makedev(major, minor) == dev && inode == ino && pid != 0).then_some(pid)
    })?;
    has_open(pid, |d, i| d == dev && i == ino)
        .then(|| process(pid))
        .flatten()
}

/// Whether process `pid` has a file open (or its working directory)
/// whose (st_dev, st_ino) `wanted` accepts. Asked with
/// AT_STATX_DONT_SYNC so that a file on a FUSE mount, live or dead, is
/// answered from the kernel's cache rather than sent to its server.
fn has_open(pid: u32, wanted: impl Fn(u64, u64) -> bool) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let cwd = std::path::PathBuf::from(format!("/proc/{pid}/cwd"));
    fds.flatten()
        .map(|e| e.path())
        .chain(std::iter::once(cwd))
        .any(|p| stat_cached(&p).is_some_and(|(d, i)| wanted(d, i)))
}

fn stat_cached(path: &Path) -> Option<(u64, u64)> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statx fills the zeroed buffer we own; the path is a C string.
    let mut buf: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_INO,
            &mut buf,
        )
    };
    (rc == 0).then(|| {
        (
            libc::makedev(buf.stx_dev_major, buf.stx_dev_minor),
            buf.stx_ino,
        )
    })
}

/// Every running process with a file open (or its working directory) on
/// the filesystem whose device number is `dev`.
fn processes_using(dev: u64) -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<Process> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| has_open(pid, |d, _| d == dev))
        .filter_map(process)
        .collect();
    found.sort_by_key(|p| p.pid);
    found
}

/// Why `image` (opened as `file`) cannot be locked, once no running
/// process is waiting to release it: who holds its lock, or what keeps it
/// held. `mounted`: the mount table lists the image (or its loop device).
pub fn why_locked(image: &Path, file: &File, mounted: bool) -> String {
    if let Some(holder) = lock_holder(file) {
        return if mounted {
            format!("already mounted ({holder} holds its lock)")
        } else {
            format!("in use: {holder} holds its lock")
        };
    }
    if mounted {
        return "already mounted (held through its loop device)".to_string();
    }
    let loops = loopdev::devices_of(image);
    let Some(loop_dev) = loops.first() else {
        return "in use: its lock is held, but by no running process (by an open file \
                another process was handed, or by the kernel)"
            .to_string();
    };
    let users = std::fs::metadata(loop_dev)
        .map(|m| processes_using(m.rdev()))
        .unwrap_or_default();
    let open_by = if users.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = users.iter().map(ToString::to_string).collect();
        format!("; files open there: {}", list.join(", "))
    };
    format!(
        "in use: still attached to {}, which keeps its lock; no birch process holds it, \
         so this is most likely a mount that was detached (umount -l) while files in it \
         were open: the kernel keeps it, and the image, until they are closed{open_by}",
        loop_dev.display()
    )
}
