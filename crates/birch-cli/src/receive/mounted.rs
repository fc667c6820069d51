//! The mount backend of `birch receive` (docs/SEND.md "Design:
//! receive"): each command becomes a system call on the mount, as
//! btrfs-progs' receive does; subvolumes and snapshots come from the
//! daemon's ioctls (`BTRFS_IOC_SUBVOL_CREATE`, `BIRCH_IOC_SNAP_CREATE`),
//! CLONE is a `copy_file_range` (a reflink on birch).

use super::{Backend, CloneArgs};
use crate::subvolume::{failure, ioctl, list_mounted, open_dir};
use crate::Failure;
use birch::format::send_stream::{Command, StreamPath, StreamTime};
use birch_fuse::subvol::{
    SnapArgs, SubvolEntry, BIRCH_IOC_SNAP_CREATE, BTRFS_IOC_SET_RECEIVED_SUBVOL,
    BTRFS_IOC_SNAP_DESTROY, BTRFS_IOC_SUBVOL_CREATE, BTRFS_IOC_SUBVOL_SETFLAGS,
    BTRFS_RECEIVED_SUBVOL_ARGS_SIZE, BTRFS_SUBVOL_RDONLY, BTRFS_VOL_ARGS_SIZE,
};
use std::ffi::{CString, OsStr};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// DIR on a birch mount.
pub(super) struct MountBackend {
    dir: PathBuf,
    dir_fd: File,
    /// The top of the mount DIR is on (subvolume list paths start there).
    mount_top: PathBuf,
    /// DIR/HIDDEN of the subvolume being received: where commands apply.
    root: Option<PathBuf>,
    /// The file the last WRITEs went to, kept open across a run of them.
    open_write: Option<(PathBuf, File)>,
}

impl MountBackend {
    pub(super) fn open(dir: &Path) -> Result<MountBackend, Failure> {
        Ok(MountBackend {
            dir: dir.to_path_buf(),
            dir_fd: open_dir(dir)?,
            mount_top: mount_top(dir)?,
            root: None,
            open_write: None,
        })
    }
}

/// The topmost directory above `dir` on the same device: the mount's root.
fn mount_top(dir: &Path) -> Result<PathBuf, Failure> {
    let dir = dir
        .canonicalize()
        .map_err(|e| Failure::new(format!("cannot access {}: {e}", dir.display())))?;
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    let here = dev(&dir);
    let mut top = dir.clone();
    while let Some(parent) = top.parent() {
        if dev(parent) != here {
            break;
        }
        top = parent.to_path_buf();
    }
    Ok(top)
}

fn cstring(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| "path holds a NUL".to_string())
}

/// The result of a libc call returning 0 or -1.
fn check(rc: libc::c_int) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error().to_string())
    }
}

fn timespec(t: StreamTime) -> Result<libc::timespec, String> {
    Ok(libc::timespec {
        tv_sec: libc::time_t::try_from(t.sec)
            .map_err(|_| format!("time {} out of range", t.sec))?,
        tv_nsec: libc::c_long::from(t.nsec),
    })
}

impl MountBackend {
    fn vol_ioctl(&self, cmd: u32, name: &[u8]) -> Result<(), String> {
        let mut args = vec![0u8; BTRFS_VOL_ARGS_SIZE];
        if name.len() >= BTRFS_VOL_ARGS_SIZE - 8 {
            return Err("name too long".into());
        }
        args[8..8 + name.len()].copy_from_slice(name);
        ioctl(&self.dir_fd, &self.dir, cmd, args.as_mut_slice())
            .map_err(|e| failure(&self.dir, e, "receive needs root").message)
    }

    fn root(&self) -> Result<&PathBuf, String> {
        self.root
            .as_ref()
            .ok_or_else(|| "no SUBVOL or SNAPSHOT before it".to_string())
    }

    fn at(&self, path: &StreamPath) -> Result<PathBuf, String> {
        let root = self.root()?;
        Ok(if path.as_bytes().is_empty() {
            root.clone()
        } else {
            root.join(OsStr::from_bytes(path.as_bytes()))
        })
    }

    fn write(&mut self, path: &StreamPath, offset: u64, data: &[u8]) -> Result<(), String> {
        let target = self.at(path)?;
        if self.open_write.as_ref().map(|(p, _)| p) != Some(&target) {
            let file = OpenOptions::new()
                .write(true)
                .open(&target)
                .map_err(|e| e.to_string())?;
            self.open_write = Some((target, file));
        }
        let (_, file) = self.open_write.as_ref().expect("opened above");
        file.write_all_at(data, offset).map_err(|e| e.to_string())
    }
}

impl Backend for MountBackend {
    fn show(&self, name: &[u8]) -> String {
        self.dir.join(OsStr::from_bytes(name)).display().to_string()
    }

    fn exists(&self, name: &[u8]) -> Result<bool, String> {
        Ok(std::fs::symlink_metadata(self.dir.join(OsStr::from_bytes(name))).is_ok())
    }

    fn subvolumes(&self) -> Result<Vec<SubvolEntry>, String> {
        list_mounted(&self.dir).map_err(|f| f.message)
    }

    fn create_subvolume(&mut self, hidden: &[u8]) -> Result<(), String> {
        self.vol_ioctl(BTRFS_IOC_SUBVOL_CREATE, hidden)?;
        self.root = Some(self.dir.join(OsStr::from_bytes(hidden)));
        Ok(())
    }

    fn create_snapshot(&mut self, source: &SubvolEntry, hidden: &[u8]) -> Result<(), String> {
        let mut args = SnapArgs::encode(source.id, false, hidden)
            .ok_or_else(|| "name too long".to_string())?;
        ioctl(
            &self.dir_fd,
            &self.dir,
            BIRCH_IOC_SNAP_CREATE,
            args.as_mut_slice(),
        )
        .map_err(|e| failure(&self.dir, e, "receive needs root").message)?;
        self.root = Some(self.dir.join(OsStr::from_bytes(hidden)));
        Ok(())
    }

    /// Long because it is one table: an arm per command, each one or two
    /// system calls.
    fn apply(&mut self, command: Command) -> Result<(), String> {
        if !matches!(command, Command::Write { .. }) {
            self.open_write = None;
        }
        match command {
            Command::Mkfile { path, .. } => {
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(self.at(&path)?)
                    .map_err(|e| e.to_string())?;
            }
            Command::Mkdir { path, .. } => {
                std::fs::create_dir(self.at(&path)?).map_err(|e| e.to_string())?;
            }
            Command::Mknod {
                path, mode, rdev, ..
            } => {
                let mode = libc::mode_t::try_from(mode).map_err(|_| format!("mode {mode:#o}"))?;
                // SAFETY: a NUL-terminated path.
                check(unsafe { libc::mknod(cstring(&self.at(&path)?)?.as_ptr(), mode, rdev) })?;
            }
            Command::Mkfifo { path, .. } => {
                // SAFETY: a NUL-terminated path.
                check(unsafe { libc::mkfifo(cstring(&self.at(&path)?)?.as_ptr(), 0o600) })?;
            }
            Command::Mksock { path, .. } => {
                let p = cstring(&self.at(&path)?)?;
                // SAFETY: a NUL-terminated path.
                check(unsafe { libc::mknod(p.as_ptr(), libc::S_IFSOCK | 0o600, 0) })?;
            }
            Command::Symlink { path, target, .. } => {
                std::os::unix::fs::symlink(OsStr::from_bytes(&target), self.at(&path)?)
                    .map_err(|e| e.to_string())?;
            }
            Command::Rename { from, to } => {
                std::fs::rename(self.at(&from)?, self.at(&to)?).map_err(|e| e.to_string())?;
            }
            Command::Link { path, existing } => {
                std::fs::hard_link(self.at(&existing)?, self.at(&path)?)
                    .map_err(|e| e.to_string())?;
            }
            Command::Unlink { path } => {
                std::fs::remove_file(self.at(&path)?).map_err(|e| e.to_string())?;
            }
            Command::Rmdir { path } => {
                std::fs::remove_dir(self.at(&path)?).map_err(|e| e.to_string())?;
            }
            Command::SetXattr { path, name, data } => {
                let p = cstring(&self.at(&path)?)?;
                let n = CString::new(name).map_err(|_| "xattr name holds a NUL".to_string())?;
                // SAFETY: NUL-terminated path and name; data and its length.
                check(unsafe {
                    libc::lsetxattr(p.as_ptr(), n.as_ptr(), data.as_ptr().cast(), data.len(), 0)
                })?;
            }
            Command::RemoveXattr { path, name } => {
                let p = cstring(&self.at(&path)?)?;
                let n = CString::new(name).map_err(|_| "xattr name holds a NUL".to_string())?;
                // SAFETY: NUL-terminated path and name.
                check(unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) })?;
            }
            Command::Write { path, offset, data } => self.write(&path, offset, &data)?,
            Command::Truncate { path, size } => {
                OpenOptions::new()
                    .write(true)
                    .open(self.at(&path)?)
                    .and_then(|f| f.set_len(size))
                    .map_err(|e| e.to_string())?;
            }
            Command::Chmod { path, mode } => {
                let mode = libc::mode_t::try_from(mode & 0o7777).expect("12 bits");
                let p = cstring(&self.at(&path)?)?;
                // SAFETY: a NUL-terminated path.
                check(unsafe { libc::chmod(p.as_ptr(), mode) })?;
            }
            Command::Chown { path, uid, gid } => {
                let uid = libc::uid_t::try_from(uid).map_err(|_| format!("uid {uid}"))?;
                let gid = libc::gid_t::try_from(gid).map_err(|_| format!("gid {gid}"))?;
                let p = cstring(&self.at(&path)?)?;
                // SAFETY: a NUL-terminated path.
                check(unsafe { libc::lchown(p.as_ptr(), uid, gid) })?;
            }
            Command::Utimes {
                path, atime, mtime, ..
            } => {
                // ctime cannot be set: it becomes now, as with btrfs-progs.
                let times = [timespec(atime)?, timespec(mtime)?];
                let p = cstring(&self.at(&path)?)?;
                // SAFETY: a NUL-terminated path and two timespecs.
                check(unsafe {
                    libc::utimensat(
                        libc::AT_FDCWD,
                        p.as_ptr(),
                        times.as_ptr(),
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                })?;
            }
            // Only a `--no-data` stream has these: it names changed
            // ranges without their bytes; btrfs-progs' receive too
            // applies nothing for them.
            Command::UpdateExtent { .. } => {}
            Command::Subvol { .. }
            | Command::Snapshot { .. }
            | Command::Clone { .. }
            | Command::End => {
                unreachable!("the receiver applies SUBVOL, SNAPSHOT, CLONE and END")
            }
        }
        Ok(())
    }

    fn clone_range(
        &mut self,
        clone: &CloneArgs,
        source: Option<&SubvolEntry>,
    ) -> Result<(), String> {
        self.open_write = None;
        let source_root = match source {
            None => self.root()?.clone(),
            Some(entry) => self.mount_top.join(OsStr::from_bytes(&entry.path)),
        };
        let source_path = source_root.join(OsStr::from_bytes(clone.source_path.as_bytes()));
        let source_file = File::open(&source_path)
            .map_err(|e| format!("clone source {}: {e}", source_path.display()))?;
        // copy_file_range reads the source as far as the kernel is
        // concerned, and birch's reflink stamps its atime; btrfs's clone
        // ioctl does not. The source's atime was already received.
        let source_atime = source_file.metadata().map_err(|e| e.to_string())?;
        let target = OpenOptions::new()
            .write(true)
            .open(self.at(&clone.path)?)
            .map_err(|e| e.to_string())?;
        let mut from = i64::try_from(clone.source_offset).map_err(|_| "clone offset past i64")?;
        let mut to = i64::try_from(clone.offset).map_err(|_| "file offset past i64")?;
        let mut left = clone.len;
        while left > 0 {
            let chunk = usize::try_from(left.min(1 << 30)).expect("under 2^30");
            // SAFETY: two open descriptors and offsets we own.
            let n = unsafe {
                libc::copy_file_range(
                    source_file.as_raw_fd(),
                    &mut from,
                    target.as_raw_fd(),
                    &mut to,
                    chunk,
                    0,
                )
            };
            if n < 0 {
                return Err(format!("copy_file_range: {}", io::Error::last_os_error()));
            }
            if n == 0 {
                return Err(format!(
                    "clone source {} ends {left} bytes before the range",
                    source_path.display()
                ));
            }
            left -= n as u64;
        }
        if source.is_none() {
            let atime = libc::timespec {
                tv_sec: source_atime.atime(),
                tv_nsec: source_atime.atime_nsec(),
            };
            let keep_mtime = libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            };
            let times = [atime, keep_mtime];
            // SAFETY: an open descriptor and two timespecs.
            check(unsafe { libc::futimens(source_file.as_raw_fd(), times.as_ptr()) })
                .map_err(|e| format!("restoring the clone source's atime: {e}"))?;
        }
        Ok(())
    }

    fn publish(
        &mut self,
        hidden: &[u8],
        name: &[u8],
        uuid: &[u8; 16],
        ctransid: u64,
    ) -> Result<(), String> {
        self.open_write = None;
        let root = self.dir.join(OsStr::from_bytes(hidden));
        let root_fd = open_dir(&root).map_err(|f| f.message)?;
        let mut args = vec![0u8; BTRFS_RECEIVED_SUBVOL_ARGS_SIZE];
        args[..16].copy_from_slice(uuid);
        args[16..24].copy_from_slice(&ctransid.to_ne_bytes());
        ioctl(
            &root_fd,
            &root,
            BTRFS_IOC_SET_RECEIVED_SUBVOL,
            args.as_mut_slice(),
        )
        .map_err(|e| failure(&root, e, "receive needs root").message)?;
        let mut flags = BTRFS_SUBVOL_RDONLY;
        ioctl(&root_fd, &root, BTRFS_IOC_SUBVOL_SETFLAGS, &mut flags)
            .map_err(|e| failure(&root, e, "receive needs root").message)?;
        let final_path = self.dir.join(OsStr::from_bytes(name));
        std::fs::rename(&root, &final_path)
            .map_err(|e| format!("publishing {}: {e}", final_path.display()))?;
        self.root = None;
        Ok(())
    }

    fn delete(&mut self, hidden: &[u8]) -> Result<(), String> {
        self.open_write = None;
        self.root = None;
        self.vol_ioctl(BTRFS_IOC_SNAP_DESTROY, hidden)
    }

    /// The daemon commits what the ioctls changed (SET_RECEIVED_SUBVOL
    /// commits); the files' changes go with its next commit, as any
    /// write to a mount.
    fn finish(self) -> Result<(), String> {
        Ok(())
    }
}
