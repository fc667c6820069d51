//! Following `mount -o remount,rw` of a mount started with `-o ro`.
//!
//! FUSE has no remount request, and for `remount,rw` the kernel sends
//! nothing at all: `fuse_reconfigure` calls `sync_filesystem`, which skips
//! a superblock that is still read-only, and the flag changes after that
//! (docs/FUSE.md has what was observed). So the daemon reads the kernel's
//! read-only flag of its superblock from /proc/self/mountinfo, never from
//! a path on the mount (a stat there would be a request to this daemon,
//! possibly from the thread that must answer it), at three moments: when
//! the mount table changes (a watcher thread polls mountinfo, so the
//! switch, with the commit of a log found at mount, happens at the
//! remount), and before a change or a syncfs reaches a read-only engine
//! (which only happens once the kernel allows changes again, and does not
//! depend on the watcher's timing).

use birch::device::BlockDevice;
use birch::fs::Filesystem;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

const MOUNTINFO: &str = "/proc/self/mountinfo";

/// The kernel's read-only flag of one mount, as mountinfo shows it.
pub(crate) struct RemountWatch {
    /// Canonical, resolved before the mount exists (resolving it after
    /// would stat the mount's root: a request to this daemon).
    mountpoint: PathBuf,
    /// Shown in /proc/mounts as the mount's source.
    image: String,
    /// The superblock's device number ("major:minor", mountinfo's third
    /// field), found once by the mount point: it names the superblock
    /// wherever it is mounted, moved or bind-mounted, and whatever is
    /// mounted over it later.
    dev: OnceLock<String>,
    /// The engine is read-write, or can never be: nothing left to follow.
    settled: AtomicBool,
}

impl RemountWatch {
    /// For a mount about to be made at `mountpoint`.
    pub(crate) fn new(mountpoint: &Path, image: &str) -> io::Result<Self> {
        Ok(RemountWatch {
            mountpoint: mountpoint.canonicalize()?,
            image: image.to_string(),
            dev: OnceLock::new(),
            settled: AtomicBool::new(false),
        })
    }

    fn settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// Switches `fs` to read-write once the kernel's superblock is. Cheap
    /// after the switch (one atomic load).
    pub(crate) fn follow<D: BlockDevice + 'static>(&self, fs: &Filesystem<D>) {
        if self.settled() || self.kernel_read_write() != Some(true) {
            return;
        }
        let result = fs.remount_read_write();
        // Said once, whichever thread gets here first: the mount stays
        // read-only in birch and every change is answered EROFS.
        if !self.settled.swap(true, Ordering::AcqRel) {
            if let Err(e) = result {
                eprintln!(
                    "birch: {}: remounted read-write, but birch cannot write: {e}; \
                     changes are refused (EROFS); unmount and mount it read-write",
                    self.image
                );
            }
        }
    }

    /// Whether the kernel's superblock is read-write; None when the mount
    /// is not listed (not yet, or no longer).
    fn kernel_read_write(&self) -> Option<bool> {
        let info = std::fs::read_to_string(MOUNTINFO).ok()?;
        let dev = match self.dev.get() {
            Some(dev) => dev,
            None => {
                let found = superblock_dev(&info, &self.mountpoint)?;
                self.dev.get_or_init(|| found)
            }
        };
        read_write(&info, dev)
    }
}

/// Fields of a mountinfo line: `id parent major:minor root mountpoint
/// options [optional...] - fstype source super-options`.
struct MountLine<'a> {
    dev: &'a str,
    mountpoint: &'a str,
    fstype: &'a str,
    super_options: &'a str,
}

fn parse(line: &str) -> Option<MountLine<'_>> {
    let (mount, superblock) = line.split_once(" - ")?;
    let mut mount = mount.split(' ');
    let dev = mount.nth(2)?;
    let mountpoint = mount.nth(1)?;
    let mut superblock = superblock.split(' ');
    let fstype = superblock.next()?;
    let super_options = superblock.nth(1)?;
    Some(MountLine {
        dev,
        mountpoint,
        fstype,
        super_options,
    })
}

/// The device number of the birch superblock mounted at `mountpoint` (the
/// last such line: the top of a stack of mounts there).
fn superblock_dev(info: &str, mountpoint: &Path) -> Option<String> {
    let want = mountpoint.to_str()?;
    info.lines()
        .filter_map(parse)
        .filter(|m| m.fstype.ends_with(".birch") && unescape(m.mountpoint) == want)
        .map(|m| m.dev.to_string())
        .next_back()
}

/// Whether the superblock `dev` is read-write: the super options start
/// with the superblock's own flag, `ro` or `rw` (the per-mount flag before
/// " - " can differ, e.g. for a read-only bind mount).
fn read_write(info: &str, dev: &str) -> Option<bool> {
    info.lines()
        .filter_map(parse)
        .find(|m| m.dev == dev)
        .map(|m| m.super_options.split(',').next() == Some("rw"))
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The thread that follows mount-table changes until the engine is
/// read-write. Stopping it (before the session's filesystem is handed
/// back) drops its reference to the filesystem.
pub(crate) struct Watcher {
    /// Closed to stop the thread: its end of the pipe then reports a hang-up.
    stop: OwnedFd,
    thread: JoinHandle<()>,
}

impl Watcher {
    pub(crate) fn spawn<D: BlockDevice + 'static>(
        watch: Arc<RemountWatch>,
        fs: Arc<Filesystem<D>>,
    ) -> io::Result<Watcher> {
        let mountinfo = File::open(MOUNTINFO)?;
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills `fds` with two new descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both were just created and are owned here only.
        let (stopped, stop) = unsafe {
            use std::os::fd::FromRawFd;
            (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
        };
        let thread = std::thread::Builder::new()
            .name("birch-remount".into())
            .spawn(move || watch_mounts(&watch, &fs, &mountinfo, &stopped))?;
        Ok(Watcher { stop, thread })
    }

    pub(crate) fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

fn watch_mounts<D: BlockDevice + 'static>(
    watch: &RemountWatch,
    fs: &Filesystem<D>,
    mountinfo: &File,
    stopped: &impl AsFd,
) {
    // A remount may have happened between the mount and this thread's
    // first poll (which only reports later changes).
    watch.follow(fs);
    while !watch.settled() {
        let mut fds = [
            libc::pollfd {
                fd: mountinfo.as_raw_fd(),
                events: libc::POLLPRI,
                revents: 0,
            },
            libc::pollfd {
                fd: stopped.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfd entries; no timeout.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        // POLLPRI: the mount table changed since the last poll (the poll
        // itself takes the event in).
        if fds[0].revents & libc::POLLPRI != 0 {
            watch.follow(fs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
42 22 7:0 / /tmp/a\\040b ro,relatime shared:5 - fuseblk.birch /dev/loop0 rw,user_id=0,blksize=4096
43 22 7:0 / /srv/view ro,relatime - fuseblk.birch /dev/loop0 rw,user_id=0,blksize=4096
44 22 0:55 / /tmp/c rw,nosuid - fuse.birch birch ro,user_id=0
";

    #[test]
    fn finds_the_superblock_flag_of_the_mount() {
        let dev = superblock_dev(INFO, Path::new("/tmp/a b")).unwrap();
        assert_eq!(dev, "7:0");
        // The per-mount flag says ro; the superblock is read-write.
        assert_eq!(read_write(INFO, &dev), Some(true));
        let dev = superblock_dev(INFO, Path::new("/tmp/c")).unwrap();
        assert_eq!(read_write(INFO, &dev), Some(false));
        assert_eq!(superblock_dev(INFO, Path::new("/")), None, "not birch");
        assert_eq!(read_write(INFO, "9:9"), None);
    }
}
