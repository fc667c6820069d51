//! `birch receive [-f FILE] DIR` (docs/SEND.md "Receive"): applies a
//! btrfs send stream (version 1) to a birch mount the way btrfs-progs'
//! receive does, in user space: each command becomes a system call on the
//! mount, subvolumes and snapshots come from the daemon's ioctls
//! (`BTRFS_IOC_SUBVOL_CREATE`, `BIRCH_IOC_SNAP_CREATE`), CLONE is a
//! `copy_file_range` (a reflink on birch). A subvolume is received under
//! a hidden name and published at END: received uuid set, read-only, then
//! renamed to its name.

use crate::subvolume::{failure, ioctl, list_mounted, open_dir};
use crate::Failure;
use birch::format::send_stream::{Command, StreamPath, StreamReader, StreamTime};
use birch_fuse::subvol::{
    SnapArgs, BIRCH_IOC_SNAP_CREATE, BTRFS_IOC_SET_RECEIVED_SUBVOL, BTRFS_IOC_SNAP_DESTROY,
    BTRFS_IOC_SUBVOL_CREATE, BTRFS_IOC_SUBVOL_SETFLAGS, BTRFS_RECEIVED_SUBVOL_ARGS_SIZE,
    BTRFS_SUBVOL_RDONLY, BTRFS_VOL_ARGS_SIZE,
};
use clap::Args;
use std::ffi::{CString, OsStr};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ReceiveArgs {
    /// Read the stream from FILE instead of standard input
    #[arg(short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// A directory of a birch mount to create the received subvolumes in
    dir: PathBuf,
}

/// The prefix of the name a subvolume is received under until END.
const HIDDEN_PREFIX: &str = ".birch-receive.";

/// The subvolume being received.
struct Current {
    /// Its name in the stream (SUBVOL's or SNAPSHOT's PATH).
    name: Vec<u8>,
    /// DIR/.birch-receive.NAME: where the commands apply.
    root: PathBuf,
    uuid: [u8; 16],
    ctransid: u64,
}

struct Receiver {
    dir: PathBuf,
    dir_fd: File,
    /// The top of the mount DIR is on (subvolume list paths start there).
    mount_top: PathBuf,
    current: Option<Current>,
    /// The file the last WRITEs went to, kept open across a run of them.
    open_write: Option<(PathBuf, File)>,
}

pub fn receive(args: &ReceiveArgs) -> Result<u8, Failure> {
    let input: Box<dyn Read> = match &args.file {
        Some(path) => {
            Box::new(io::BufReader::new(File::open(path).map_err(|e| {
                Failure::new(format!("cannot open {}: {e}", path.display()))
            })?))
        }
        None => Box::new(io::BufReader::new(io::stdin().lock())),
    };
    let dir_fd = open_dir(&args.dir)?;
    let mut receiver = Receiver {
        dir: args.dir.clone(),
        mount_top: mount_top(&args.dir)?,
        dir_fd,
        current: None,
        open_write: None,
    };
    let result = receiver.run(input);
    if result.is_err() {
        receiver.abandon();
    }
    result.map(|()| 0)
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

impl Receiver {
    fn run(&mut self, input: Box<dyn Read>) -> Result<(), Failure> {
        let mut reader = StreamReader::new(input).map_err(|e| Failure::new(e.to_string()))?;
        while let Some((offset, command)) = reader
            .next_command()
            .map_err(|e| Failure::new(e.to_string()))?
        {
            let name = birch::format::send_stream::command_name(command.code());
            self.apply(command)
                .map_err(|e| Failure::new(format!("send stream: {name} at byte {offset}: {e}")))?;
        }
        if let Some(current) = &self.current {
            return Err(Failure::new(format!(
                "send stream: ends at byte {} before the END of subvolume {:?}",
                reader.offset(),
                String::from_utf8_lossy(&current.name)
            )));
        }
        Ok(())
    }

    /// Deletes a subvolume left half-received by a failed stream.
    fn abandon(&mut self) {
        self.open_write = None;
        if let Some(current) = self.current.take() {
            let hidden = hidden_name(&current.uuid);
            if let Err(e) = self.vol_ioctl(BTRFS_IOC_SNAP_DESTROY, &hidden) {
                eprintln!(
                    "birch receive: could not delete the partly received {}: {e}",
                    current.root.display()
                );
            }
        }
    }

    fn vol_ioctl(&self, cmd: u32, name: &[u8]) -> Result<(), String> {
        let mut args = vec![0u8; BTRFS_VOL_ARGS_SIZE];
        if name.len() >= BTRFS_VOL_ARGS_SIZE - 8 {
            return Err("name too long".into());
        }
        args[8..8 + name.len()].copy_from_slice(name);
        ioctl(&self.dir_fd, &self.dir, cmd, args.as_mut_slice())
            .map_err(|e| failure(&self.dir, e, "receive needs root").message)
    }

    fn current(&self) -> Result<&Current, String> {
        self.current
            .as_ref()
            .ok_or_else(|| "no SUBVOL or SNAPSHOT before it".to_string())
    }

    fn at(&self, path: &StreamPath) -> Result<PathBuf, String> {
        let root = &self.current()?.root;
        Ok(if path.as_bytes().is_empty() {
            root.clone()
        } else {
            root.join(OsStr::from_bytes(path.as_bytes()))
        })
    }

    /// Starts receiving subvolume `name` under its hidden name.
    /// A stream of several subvolumes (`send A B`) has one END, after
    /// the last: a SUBVOL or SNAPSHOT publishes the subvolume before it,
    /// as btrfs-progs does (its parent may be that one).
    fn finish_previous(&mut self) -> Result<(), String> {
        if self.current.is_some() {
            self.finish()?;
        }
        Ok(())
    }

    fn begin(&mut self, name: &StreamPath, uuid: [u8; 16], ctransid: u64) -> Result<(), String> {
        let final_path = self.dir.join(OsStr::from_bytes(name.as_bytes()));
        if std::fs::symlink_metadata(&final_path).is_ok() {
            return Err(format!(
                "target path already exists: {}",
                final_path.display()
            ));
        }
        let hidden = hidden_name(&uuid);
        let root = self.dir.join(OsStr::from_bytes(&hidden));
        if std::fs::symlink_metadata(&root).is_ok() {
            return Err(format!(
                "{} exists: left by a receive that did not finish; delete it first",
                root.display()
            ));
        }
        self.current = Some(Current {
            name: name.as_bytes().to_vec(),
            root,
            uuid,
            ctransid,
        });
        Ok(())
    }

    /// Long because it is one table: an arm per command, each one or two
    /// system calls.
    fn apply(&mut self, command: Command) -> Result<(), String> {
        if !matches!(command, Command::Write { .. }) {
            self.open_write = None;
        }
        match command {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            } => {
                self.finish_previous()?;
                self.begin(&path, uuid, ctransid)?;
                let hidden = hidden_name(&uuid);
                if let Err(e) = self.vol_ioctl(BTRFS_IOC_SUBVOL_CREATE, &hidden) {
                    self.current = None;
                    return Err(e);
                }
                writeln!(io::stdout(), "At subvol {path}").map_err(|e| e.to_string())?;
            }
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            } => {
                self.finish_previous()?;
                let source = self.find_subvolume(&clone_uuid, clone_ctransid)?;
                self.begin(&path, uuid, ctransid)?;
                let hidden = hidden_name(&uuid);
                let mut args = SnapArgs::encode(source.0, false, &hidden)
                    .ok_or_else(|| "name too long".to_string())?;
                if let Err(e) = ioctl(
                    &self.dir_fd,
                    &self.dir,
                    BIRCH_IOC_SNAP_CREATE,
                    args.as_mut_slice(),
                ) {
                    self.current = None;
                    return Err(failure(&self.dir, e, "receive needs root").message);
                }
                writeln!(io::stdout(), "At snapshot {path}").map_err(|e| e.to_string())?;
            }
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
            Command::Write { path, offset, data } => {
                let target = self.at(&path)?;
                if self.open_write.as_ref().map(|(p, _)| p) != Some(&target) {
                    let file = OpenOptions::new()
                        .write(true)
                        .open(&target)
                        .map_err(|e| e.to_string())?;
                    self.open_write = Some((target, file));
                }
                let (_, file) = self.open_write.as_ref().expect("opened above");
                file.write_all_at(&data, offset)
                    .map_err(|e| e.to_string())?;
            }
            Command::Clone {
                path,
                offset,
                len,
                clone_uuid,
                clone_ctransid,
                clone_path,
                clone_offset,
            } => self.clone_range(
                &path,
                offset,
                len,
                &clone_uuid,
                clone_ctransid,
                &clone_path,
                clone_offset,
            )?,
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
            Command::End => self.finish()?,
        }
        Ok(())
    }

    /// The subvolume id and root path of the subvolume received as (or,
    /// failing that, sent with) `uuid` at `ctransid`: btrfs-progs' search
    /// by received uuid (matching its stransid), then by uuid (matching its
    /// ctransid). A subvolume with that uuid whose transid differs has
    /// changed since the stream's sender saw it (made writable and written,
    /// or another one received under the same uuid): applying a stream on
    /// top of it would build something the sender never had, so it is
    /// refused by name.
    fn find_subvolume(&self, uuid: &[u8; 16], ctransid: u64) -> Result<(u64, PathBuf), String> {
        let all = list_mounted(&self.dir).map_err(|f| f.message)?;
        let by_received = || all.iter().filter(|e| &e.received_uuid == uuid);
        let by_uuid = || all.iter().filter(|e| &e.uuid == uuid);
        let found = by_received()
            .find(|e| e.stransid == ctransid)
            .or_else(|| by_uuid().find(|e| e.ctransid == ctransid));
        let Some(found) = found else {
            let changed = by_received()
                .map(|e| (e, e.stransid))
                .chain(by_uuid().map(|e| (e, e.ctransid)))
                .next();
            return Err(match changed {
                Some((e, transid)) => format!(
                    "parent subvolume {} is {} at transid {transid}, the stream needs transid {ctransid}: it changed since it was sent",
                    String::from_utf8_lossy(&e.path),
                    crate::subvolume::uuid(uuid)
                ),
                None => format!(
                    "cannot find the parent subvolume: no subvolume of this mount was received as (or is) {}",
                    crate::subvolume::uuid(uuid)
                ),
            });
        };
        Ok((
            found.id,
            self.mount_top.join(OsStr::from_bytes(&found.path)),
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn clone_range(
        &mut self,
        path: &StreamPath,
        offset: u64,
        len: u64,
        clone_uuid: &[u8; 16],
        clone_ctransid: u64,
        clone_path: &StreamPath,
        clone_offset: u64,
    ) -> Result<(), String> {
        let current = self.current()?;
        let source_root = if &current.uuid == clone_uuid {
            current.root.clone()
        } else {
            self.find_subvolume(clone_uuid, clone_ctransid)?.1
        };
        let source_path = source_root.join(OsStr::from_bytes(clone_path.as_bytes()));
        let source = File::open(&source_path)
            .map_err(|e| format!("clone source {}: {e}", source_path.display()))?;
        // copy_file_range reads the source as far as the kernel is
        // concerned, and birch's reflink stamps its atime; btrfs's clone
        // ioctl does not. The source's atime was already received.
        let source_atime = source.metadata().map_err(|e| e.to_string())?;
        let target = OpenOptions::new()
            .write(true)
            .open(self.at(path)?)
            .map_err(|e| e.to_string())?;
        let mut from = i64::try_from(clone_offset).map_err(|_| "clone offset past i64")?;
        let mut to = i64::try_from(offset).map_err(|_| "file offset past i64")?;
        let mut left = len;
        while left > 0 {
            let chunk = usize::try_from(left.min(1 << 30)).expect("under 2^30");
            // SAFETY: two open descriptors and offsets we own.
            let n = unsafe {
                libc::copy_file_range(
                    source.as_raw_fd(),
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
        if self.current()?.root == source_root {
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
            check(unsafe { libc::futimens(source.as_raw_fd(), times.as_ptr()) })
                .map_err(|e| format!("restoring the clone source's atime: {e}"))?;
        }
        Ok(())
    }

    /// END: records the stream's uuid and ctransid as received, makes the
    /// subvolume read-only and publishes it under its name.
    fn finish(&mut self) -> Result<(), String> {
        let current = self
            .current
            .as_ref()
            .ok_or_else(|| "END without a SUBVOL or SNAPSHOT".to_string())?;
        let root_fd = open_dir(&current.root).map_err(|f| f.message)?;
        let mut args = vec![0u8; BTRFS_RECEIVED_SUBVOL_ARGS_SIZE];
        args[..16].copy_from_slice(&current.uuid);
        args[16..24].copy_from_slice(&current.ctransid.to_ne_bytes());
        ioctl(
            &root_fd,
            &current.root,
            BTRFS_IOC_SET_RECEIVED_SUBVOL,
            args.as_mut_slice(),
        )
        .map_err(|e| failure(&current.root, e, "receive needs root").message)?;
        let mut flags = BTRFS_SUBVOL_RDONLY;
        ioctl(
            &root_fd,
            &current.root,
            BTRFS_IOC_SUBVOL_SETFLAGS,
            &mut flags,
        )
        .map_err(|e| failure(&current.root, e, "receive needs root").message)?;
        let final_path = self.dir.join(OsStr::from_bytes(&current.name));
        std::fs::rename(&current.root, &final_path)
            .map_err(|e| format!("publishing {}: {e}", final_path.display()))?;
        self.current = None;
        Ok(())
    }
}

/// `.birch-receive.UUID` (32 hex digits of the stream's uuid): named by
/// the stream, not by NAME, so that any NAME up to 255 bytes can be
/// received and a retry of the same stream finds what a killed receive
/// left.
fn hidden_name(uuid: &[u8; 16]) -> Vec<u8> {
    let mut hidden = HIDDEN_PREFIX.as_bytes().to_vec();
    for b in uuid {
        hidden.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    hidden
}
