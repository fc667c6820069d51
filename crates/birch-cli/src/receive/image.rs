//! The image backend of `birch receive --image IMAGE DIR` (docs/SEND.md
//! "Receive into an image"): each command becomes the library call the
//! daemon makes for the system call the mount backend would make, on an
//! image opened read-write under the lock a mount takes. Paths resolve
//! by lookup from the received subvolume's root; the image is committed
//! when the receive ends.

use super::{Backend, CloneArgs};
use crate::subvolume::{open_image, ImageAccess};
use crate::{show, Failure};
use birch::device::FileDevice;
use birch::format::send_stream::{Command, StreamPath, StreamTime};
use birch::format::{FileType, Timespec, ROOT_DIR_INO};
use birch::fs::{Filesystem, InoSpace, RenameFlags, SetAttr, SetTime, XattrSetMode};
use birch_fuse::subvol::SubvolEntry;
use std::path::{Path, PathBuf};

/// DIR inside an unmounted image.
pub(super) struct ImageBackend {
    fs: Filesystem<FileDevice>,
    image: PathBuf,
    /// DIR as given, for messages.
    dir_path: PathBuf,
    /// DIR's inode (external number).
    dir: u64,
    /// The subvolume being received: its id and its root's inode.
    current: Option<(u64, u64)>,
    /// Owner of what is created before the stream's CHOWN: this process,
    /// as on a mount.
    uid: u32,
    gid: u32,
    /// This process's umask, which a mount's kernel would apply to MKFILE,
    /// MKDIR and MKNOD's modes (their CHMOD follows).
    umask: u32,
}

impl ImageBackend {
    /// Opens IMAGE read-write (refused while mounted) and finds DIR, a
    /// directory path from its top level.
    pub(super) fn open(image: &Path, dir: &Path) -> Result<ImageBackend, Failure> {
        let fs = open_image(image, ImageAccess::ReadWrite)?;
        let mut ino = ROOT_DIR_INO;
        for part in dir.iter() {
            let part = std::os::unix::ffi::OsStrExt::as_bytes(part);
            match part {
                b"/" | b"." => continue,
                b".." => {
                    return Err(Failure::new(format!(
                        "{}: {}: a path from the top level has no '..'",
                        show(image),
                        dir.display()
                    )))
                }
                _ => {}
            }
            let attr = fs
                .lookup(ino, part)
                .map_err(|e| Failure::new(format!("{}: {}: {e}", show(image), dir.display())))?;
            ino = attr.ino;
        }
        let attr = fs
            .getattr(ino)
            .map_err(|e| Failure::new(format!("{}: {}: {e}", show(image), dir.display())))?;
        if attr.file_type != FileType::Directory {
            return Err(Failure::new(format!(
                "{}: {}: not a directory",
                show(image),
                dir.display()
            )));
        }
        // SAFETY: umask has no preconditions; the second call puts back
        // what the first read, before any thread of this process creates
        // a file.
        let umask = unsafe {
            let umask = libc::umask(0o022);
            libc::umask(umask);
            umask
        };
        Ok(ImageBackend {
            fs,
            image: image.to_path_buf(),
            dir_path: dir.to_path_buf(),
            dir: ino,
            current: None,
            // SAFETY: geteuid and getegid have no preconditions.
            uid: unsafe { libc::geteuid() },
            gid: unsafe { libc::getegid() },
            umask: umask as u32,
        })
    }

    fn root(&self) -> Result<u64, String> {
        self.current
            .map(|(_, root)| root)
            .ok_or_else(|| "no SUBVOL or SNAPSHOT before it".to_string())
    }

    /// The inode at `path` below directory `from` ("" is `from`). No
    /// symlink is followed: a stream's paths name no symlink but the
    /// last component (btrfs send writes real paths).
    fn at_from(&self, from: u64, path: &StreamPath) -> Result<u64, String> {
        let mut ino = from;
        for part in path
            .as_bytes()
            .split(|&b| b == b'/')
            .filter(|p| !p.is_empty())
        {
            ino = self
                .fs
                .lookup(ino, part)
                .map_err(|e| format!("{path}: {e}"))?
                .ino;
        }
        Ok(ino)
    }

    fn at(&self, path: &StreamPath) -> Result<u64, String> {
        self.at_from(self.root()?, path)
    }

    /// The directory holding `path`'s last component, and the component.
    fn parent_of<'p>(&self, path: &'p StreamPath) -> Result<(u64, &'p [u8]), String> {
        let bytes = path.as_bytes();
        match bytes.iter().rposition(|&b| b == b'/') {
            Some(i) => {
                let parent = StreamPath::new(&bytes[..i])?;
                Ok((self.at(&parent)?, &bytes[i + 1..]))
            }
            None if bytes.is_empty() => Err("the subvolume's root has no name here".into()),
            None => Ok((self.root()?, bytes)),
        }
    }

    fn make_node(&self, path: &StreamPath, mode: u32, rdev: u64) -> Result<(), String> {
        let (dir, name) = self.parent_of(path)?;
        self.fs
            .make_node(dir, name, mode, self.umask, self.uid, self.gid, rdev)
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    fn set(&self, path: &StreamPath, changes: SetAttr) -> Result<(), String> {
        self.fs
            .setattr(self.at(path)?, &changes)
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// A stream time as the engine takes it; nanoseconds past a second are
/// refused, as utimensat refuses them on a mount.
fn set_time(t: StreamTime) -> Result<SetTime, String> {
    let sec = i64::try_from(t.sec).map_err(|_| format!("time {} out of range", t.sec))?;
    if t.nsec >= 1_000_000_000 {
        return Err(format!(
            "time {sec}.{} has nanoseconds past a second",
            t.nsec
        ));
    }
    Ok(SetTime::At(Timespec { sec, nsec: t.nsec }))
}

impl Backend for ImageBackend {
    fn show(&self, name: &[u8]) -> String {
        format!(
            "{}:{}",
            show(&self.image),
            self.dir_path
                .join(String::from_utf8_lossy(name).as_ref())
                .display()
        )
    }

    fn exists(&self, name: &[u8]) -> Result<bool, String> {
        match self.fs.lookup(self.dir, name) {
            Ok(_) => Ok(true),
            Err(birch::Error::NotFound) => Ok(false),
            Err(e) => Err(format!("{}: {e}", self.show(name))),
        }
    }

    fn subvolumes(&self) -> Result<Vec<SubvolEntry>, String> {
        birch_fuse::subvol::list(&self.fs).map_err(|e| format!("{}: {e}", show(&self.image)))
    }

    fn create_subvolume(&mut self, hidden: &[u8]) -> Result<(), String> {
        let id = self
            .fs
            .create_subvolume(self.dir, hidden, self.uid, self.gid)
            .map_err(|e| format!("{}: {e}", self.show(hidden)))?;
        self.current = Some((id, InoSpace::join(id, ROOT_DIR_INO)));
        Ok(())
    }

    fn create_snapshot(&mut self, source: &SubvolEntry, hidden: &[u8]) -> Result<(), String> {
        let id = self
            .fs
            .create_snapshot(source.id, self.dir, hidden, false)
            .map_err(|e| format!("{}: {e}", self.show(hidden)))?;
        self.current = Some((id, InoSpace::join(id, ROOT_DIR_INO)));
        Ok(())
    }

    /// Long because it is one table: an arm per command, each one
    /// library call.
    fn apply(&mut self, command: Command) -> Result<(), String> {
        let fs = &self.fs;
        let failed = |e: birch::Error| e.to_string();
        match command {
            Command::Mkfile { path, .. } => self.make_node(&path, libc::S_IFREG | 0o600, 0)?,
            Command::Mkdir { path, .. } => self.make_node(&path, libc::S_IFDIR | 0o777, 0)?,
            Command::Mknod {
                path, mode, rdev, ..
            } => {
                let mode = u32::try_from(mode).map_err(|_| format!("mode {mode:#o}"))?;
                // mknod(2) takes a 32-bit device number.
                let rdev =
                    u32::try_from(rdev).map_err(|_| format!("rdev {rdev:#x} past 32 bits"))?;
                self.make_node(&path, mode, u64::from(rdev))?;
            }
            Command::Mkfifo { path, .. } => self.make_node(&path, libc::S_IFIFO | 0o600, 0)?,
            Command::Mksock { path, .. } => self.make_node(&path, libc::S_IFSOCK | 0o600, 0)?,
            Command::Symlink { path, target, .. } => {
                let (dir, name) = self.parent_of(&path)?;
                fs.symlink(dir, name, &target, self.uid, self.gid)
                    .map_err(failed)?;
            }
            Command::Rename { from, to } => {
                let (d1, n1) = self.parent_of(&from)?;
                let (d2, n2) = self.parent_of(&to)?;
                fs.rename(d1, n1, d2, n2, RenameFlags::default())
                    .map_err(failed)?;
            }
            Command::Link { path, existing } => {
                let ino = self.at(&existing)?;
                let (dir, name) = self.parent_of(&path)?;
                fs.link(ino, dir, name).map_err(failed)?;
            }
            Command::Unlink { path } => {
                let (dir, name) = self.parent_of(&path)?;
                fs.unlink(dir, name).map_err(failed)?;
            }
            Command::Rmdir { path } => {
                let (dir, name) = self.parent_of(&path)?;
                fs.rmdir(dir, name).map_err(failed)?;
            }
            Command::SetXattr { path, name, data } => {
                if !birch_fuse::supported_xattr_name(&name) {
                    // The mount's answer (its daemon's, or the kernel's).
                    return Err(format!(
                        "{path}: xattr {:?}: {}",
                        String::from_utf8_lossy(&name),
                        std::io::Error::from_raw_os_error(libc::EOPNOTSUPP)
                    ));
                }
                fs.setxattr(self.at(&path)?, &name, &data, XattrSetMode::CreateOrReplace)
                    .map_err(failed)?;
            }
            Command::RemoveXattr { path, name } => {
                fs.removexattr(self.at(&path)?, &name).map_err(failed)?;
            }
            Command::Write { path, offset, data } => {
                let ino = self.at(&path)?;
                let mut done = 0;
                while done < data.len() {
                    let at = offset.checked_add(done as u64).ok_or("offset past 2^64")?;
                    let n = fs.write_file(ino, at, &data[done..]).map_err(failed)?;
                    if n == 0 {
                        return Err(format!("{path}: nothing written at {at}"));
                    }
                    done += n;
                }
            }
            Command::Truncate { path, size } => {
                fs.truncate(self.at(&path)?, size).map_err(failed)?;
            }
            Command::Chmod { path, mode } => {
                let mode = u32::try_from(mode & 0o7777).expect("12 bits");
                self.set(
                    &path,
                    SetAttr {
                        mode: Some(mode),
                        ..Default::default()
                    },
                )?;
            }
            Command::Chown { path, uid, gid } => {
                let uid = u32::try_from(uid).map_err(|_| format!("uid {uid}"))?;
                let gid = u32::try_from(gid).map_err(|_| format!("gid {gid}"))?;
                self.set(
                    &path,
                    SetAttr {
                        uid: Some(uid),
                        gid: Some(gid),
                        ..Default::default()
                    },
                )?;
            }
            Command::Utimes {
                path, atime, mtime, ..
            } => {
                // ctime cannot be set: it becomes now, as on a mount.
                self.set(
                    &path,
                    SetAttr {
                        atime: Some(set_time(atime)?),
                        mtime: Some(set_time(mtime)?),
                        ..Default::default()
                    },
                )?;
            }
            // As on a mount: nothing (a `--no-data` stream's ranges).
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
        let source_root = match source {
            None => self.root()?,
            Some(entry) => InoSpace::join(entry.id, ROOT_DIR_INO),
        };
        let src = self
            .at_from(source_root, &clone.source_path)
            .map_err(|e| format!("clone source {e}"))?;
        let dst = self.at(&clone.path)?;
        // The engine's copy stamps the source's atime (its reflink
        // settles the source's data; a copied tail is read); btrfs's clone
        // does not, and the source's atime was already received.
        let source_atime = self.fs.getattr(src).map_err(|e| e.to_string())?.atime;
        let mut done = 0u64;
        while done < clone.len {
            let (from, to) = clone
                .source_offset
                .checked_add(done)
                .zip(clone.offset.checked_add(done))
                .ok_or("clone range past 2^64")?;
            let n = self
                .fs
                .copy_file_range(src, from, dst, to, clone.len - done)
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!(
                    "clone source {} ends {} bytes before the range",
                    clone.source_path,
                    clone.len - done
                ));
            }
            done += n;
        }
        if source.is_none() {
            self.fs
                .setattr(
                    src,
                    &SetAttr {
                        atime: Some(SetTime::At(source_atime)),
                        ..Default::default()
                    },
                )
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
        let (id, _) = self
            .current
            .ok_or_else(|| "END without a SUBVOL or SNAPSHOT".to_string())?;
        let at = |e: birch::Error| format!("{}: {e}", self.show(hidden));
        // The sender's time is not in the stream: zero, as btrfs-progs
        // and the mount backend pass it.
        self.fs
            .set_received_subvolume(id, *uuid, ctransid, Timespec::default())
            .map_err(at)?;
        self.fs.set_subvolume_readonly(id, true).map_err(at)?;
        self.fs
            .rename(self.dir, hidden, self.dir, name, RenameFlags::default())
            .map_err(|e| format!("publishing {}: {e}", self.show(name)))?;
        self.current = None;
        Ok(())
    }

    fn delete(&mut self, hidden: &[u8]) -> Result<(), String> {
        self.current = None;
        self.fs
            .delete_subvolume(self.dir, hidden)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Commits: what was published (and a failed subvolume's deletion)
    /// is on the image when the command returns.
    fn finish(self) -> Result<(), String> {
        let image = self.image.clone();
        self.fs
            .close()
            .map_err(|e| format!("{}: commit: {e}", show(&image)))
    }
}
