//! The one executor of workload ops.
//!
//! Every place that runs an [`Op`] (the model in the model tests and the
//! crash recorder, the engine beside it, the ACE enumeration's validity
//! check on the model, and the host kernel in `tests/model_vs_kernel.rs`)
//! goes through [`Executor::apply`]. It decodes the op once: resolves a
//! target (a path, or an open handle slot: an empty slot skips the op on
//! every backend alike), expands write and xattr patterns into bytes, keeps
//! the handle table, and turns each op into one call of the [`Backend`]
//! trait. A backend only says how it does that call. So the three sides
//! cannot drift apart in how they read an op, and a new op kind is added in
//! one place.

use crate::model::{AttrView, Errno, Kind, MIno, Model, Path, RenameFlags, XattrMode};
use crate::workload::{pattern, text_pattern, Op, Target};
use std::collections::BTreeMap;

/// What an op returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ret {
    Unit,
    /// The op did nothing on either side (an empty handle slot).
    Skipped,
    Attr(AttrView),
    Data(Vec<u8>),
    Len(usize),
    Names(Vec<Vec<u8>>),
    Dir(BTreeMap<Vec<u8>, Kind>),
}

/// An op's result as a system call gives it: a value or an errno.
pub type Outcome = Result<Ret, Errno>;

/// A backend failure that is not an errno the kernel could return (the
/// engine reporting EIO, a failed close): the run stops with this message.
pub type Step<T> = Result<T, String>;

/// The symbolic name of an errno.
pub fn errno_name(e: Errno) -> String {
    let name = match e {
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::EINVAL => "EINVAL",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::EPERM => "EPERM",
        libc::EMLINK => "EMLINK",
        libc::ENODATA => "ENODATA",
        libc::ERANGE => "ERANGE",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EBUSY => "EBUSY",
        libc::EIO => "EIO",
        libc::EROFS => "EROFS",
        libc::EXDEV => "EXDEV",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESPIPE => "ESPIPE",
        libc::ENODEV => "ENODEV",
        libc::ENOTTY => "ENOTTY",
        _ => return format!("errno {e}"),
    };
    name.to_string()
}

/// An outcome for a failure report (file contents are shown by length).
pub fn show_outcome(o: &Outcome) -> String {
    match o {
        Ok(Ret::Data(d)) => format!("Ok({} bytes)", d.len()),
        Ok(r) => format!("Ok({r:?})"),
        Err(e) => format!("Err({})", errno_name(*e)),
    }
}

/// How one filesystem carries out the decoded ops. Namespace ops take
/// paths (each backend walks them its own way, as its kernel interface
/// does); inode ops take what [`Backend::resolve`] or [`Backend::open`]
/// returned.
pub trait Backend {
    /// A resolved target: an inode number, or a path or descriptor.
    type Ino: Clone;

    fn resolve(&mut self, path: &Path) -> Step<Result<Self::Ino, Errno>>;
    fn create(&mut self, path: &Path, perm: u32) -> Step<Outcome>;
    fn mkdir(&mut self, path: &Path, perm: u32) -> Step<Outcome>;
    fn mkfifo(&mut self, path: &Path) -> Step<Outcome>;
    fn symlink(&mut self, path: &Path, target: &[u8]) -> Step<Outcome>;
    fn link(&mut self, from: &Path, to: &Path) -> Step<Outcome>;
    fn unlink(&mut self, path: &Path) -> Step<Outcome>;
    fn rmdir(&mut self, path: &Path) -> Step<Outcome>;
    fn rename(&mut self, from: &Path, to: &Path, flags: RenameFlags) -> Step<Outcome>;
    fn write(&mut self, ino: &Self::Ino, offset: u64, data: &[u8]) -> Step<Outcome>;
    fn truncate(&mut self, ino: &Self::Ino, size: u64) -> Step<Outcome>;
    fn read(&mut self, ino: &Self::Ino, offset: u64, len: usize) -> Step<Outcome>;
    fn chmod(&mut self, ino: &Self::Ino, perm: u32) -> Step<Outcome>;
    fn chown(&mut self, ino: &Self::Ino, uid: Option<u32>, gid: Option<u32>) -> Step<Outcome>;
    fn setxattr(
        &mut self,
        ino: &Self::Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Step<Outcome>;
    fn removexattr(&mut self, ino: &Self::Ino, name: &[u8]) -> Step<Outcome>;
    fn getxattr(&mut self, ino: &Self::Ino, name: &[u8]) -> Step<Outcome>;
    fn listxattr(&mut self, ino: &Self::Ino) -> Step<Outcome>;
    fn stat(&mut self, ino: &Self::Ino) -> Step<Outcome>;
    fn readdir(&mut self, ino: &Self::Ino) -> Step<Outcome>;
    fn readlink(&mut self, ino: &Self::Ino) -> Step<Outcome>;
    /// Opens a handle on a resolved path (what the handle slot keeps).
    fn open(&mut self, ino: &Self::Ino) -> Step<Result<Self::Ino, Errno>>;
    fn release(&mut self, handle: &Self::Ino) -> Step<()>;
    /// fsync (or fdatasync) of a file, or fsync of a directory.
    fn fsync(&mut self, ino: &Self::Ino, datasync: bool) -> Step<Outcome>;
    fn sync(&mut self) -> Step<Outcome>;
    /// Close and reopen; open handles are dropped without a release (their
    /// unlinked inodes become orphans the reopen cleans up).
    fn remount(&mut self) -> Step<()>;
    /// Subvolume ops (docs/SNAPSHOTS.md): a backend without subvolumes
    /// (the host kernel's tmpfs) stops the run if a workload asks.
    fn create_subvolume(&mut self, path: &Path) -> Step<Outcome> {
        Err(format!("no subvolumes here: subvolume create {path:?}"))
    }
    fn snapshot(&mut self, source: &Path, dest: &Path, readonly: bool) -> Step<Outcome> {
        Err(format!(
            "no subvolumes here: snapshot {source:?} {dest:?} (read-only {readonly})"
        ))
    }
    fn delete_subvolume(&mut self, path: &Path) -> Step<Outcome> {
        Err(format!("no subvolumes here: subvolume delete {path:?}"))
    }
    fn cleaner(&mut self) -> Step<Outcome> {
        Err("no subvolumes here: cleaner".into())
    }
    /// Data ops of the compression workloads (`compression_weight`): a
    /// backend without them (the host kernel's tmpfs) stops the run if a
    /// workload asks.
    fn punch_hole(&mut self, ino: &Self::Ino, offset: u64, len: u64) -> Step<Outcome> {
        let _ = ino;
        Err(format!("no punch hole here: {offset}+{len}"))
    }
    /// `fallocate(FALLOC_FL_ZERO_RANGE)`, `keep_size` adding
    /// `FALLOC_FL_KEEP_SIZE`.
    fn zero_range(
        &mut self,
        ino: &Self::Ino,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Step<Outcome> {
        let _ = (ino, keep_size);
        Err(format!("no zero range here: {offset}+{len}"))
    }
    /// `copy_file_range`; returns `Ret::Len` of the bytes copied.
    fn copy_range(
        &mut self,
        src: &Self::Ino,
        src_offset: u64,
        dst: &Self::Ino,
        dst_offset: u64,
        len: u64,
    ) -> Step<Outcome> {
        let _ = (src, dst);
        Err(format!(
            "no copy_file_range here: {src_offset}+{len} to {dst_offset}"
        ))
    }
    fn set_compress_flag(&mut self, ino: &Self::Ino, on: bool) -> Step<Outcome> {
        let _ = ino;
        Err(format!("no chattr here: compress {on}"))
    }
}

/// A backend and its open handle slots.
pub struct Executor<B: Backend> {
    pub backend: B,
    handles: Vec<Option<B::Ino>>,
}

impl<B: Backend> Executor<B> {
    pub fn new(backend: B, handles: usize) -> Executor<B> {
        Executor {
            backend,
            handles: vec![None; handles],
        }
    }

    /// What handle slot `h` holds.
    pub fn handle(&self, h: usize) -> Option<&B::Ino> {
        self.handles.get(h).and_then(|s| s.as_ref())
    }

    /// The target resolved: `Ok(None)` for an empty handle slot.
    fn target(&mut self, t: &Target) -> Step<Result<Option<B::Ino>, Errno>> {
        match t {
            Target::Handle(h) => Ok(Ok(self.handles[*h].clone())),
            Target::Path(p) => Ok(self.backend.resolve(p)?.map(Some)),
        }
    }

    /// Runs one op.
    pub fn apply(&mut self, op: &Op) -> Step<Outcome> {
        macro_rules! target {
            ($t:expr) => {
                match self.target($t)? {
                    Ok(Some(ino)) => ino,
                    Ok(None) => return Ok(Ok(Ret::Skipped)),
                    Err(e) => return Ok(Err(e)),
                }
            };
        }
        let b = &mut self.backend;
        match op {
            Op::Create { path, perm } => b.create(path, *perm),
            Op::Mkdir { path, perm } => b.mkdir(path, *perm),
            Op::Mkfifo { path } => b.mkfifo(path),
            Op::Symlink { path, target } => b.symlink(path, target),
            Op::Link { from, to } => b.link(from, to),
            Op::Unlink { path } => b.unlink(path),
            Op::Rmdir { path } => b.rmdir(path),
            Op::Rename { from, to, flags } => b.rename(from, to, *flags),
            Op::Write {
                target,
                offset,
                len,
                fill,
            } => {
                let ino = target!(target);
                let data = pattern(*fill, *len as usize);
                self.backend.write(&ino, *offset, &data)
            }
            Op::WriteText {
                target,
                offset,
                len,
                fill,
            } => {
                let ino = target!(target);
                let data = text_pattern(*fill, *len as usize);
                self.backend.write(&ino, *offset, &data)
            }
            Op::Truncate { target, size } => {
                let ino = target!(target);
                self.backend.truncate(&ino, *size)
            }
            Op::PunchHole {
                target,
                offset,
                len,
            } => {
                let ino = target!(target);
                self.backend.punch_hole(&ino, *offset, *len)
            }
            Op::ZeroRange {
                target,
                offset,
                len,
                keep_size,
            } => {
                let ino = target!(target);
                self.backend.zero_range(&ino, *offset, *len, *keep_size)
            }
            Op::CopyRange {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => {
                let src = target!(src);
                let dst = target!(dst);
                self.backend
                    .copy_range(&src, *src_offset, &dst, *dst_offset, *len)
            }
            Op::SetCompressFlag { target, on } => {
                let ino = target!(target);
                self.backend.set_compress_flag(&ino, *on)
            }
            Op::Read {
                target,
                offset,
                len,
            } => {
                let ino = target!(target);
                self.backend.read(&ino, *offset, *len as usize)
            }
            Op::Chmod { target, perm } => {
                let ino = target!(target);
                self.backend.chmod(&ino, *perm)
            }
            Op::Chown { target, uid, gid } => {
                let ino = target!(target);
                self.backend.chown(&ino, *uid, *gid)
            }
            Op::SetXattr {
                target,
                name,
                value_len,
                fill,
                mode,
            } => {
                let ino = target!(target);
                let value = pattern(*fill, *value_len);
                self.backend.setxattr(&ino, name, &value, *mode)
            }
            Op::RemoveXattr { target, name } => {
                let ino = target!(target);
                self.backend.removexattr(&ino, name)
            }
            Op::GetXattr { target, name } => {
                let ino = target!(target);
                self.backend.getxattr(&ino, name)
            }
            Op::ListXattr { target } => {
                let ino = target!(target);
                self.backend.listxattr(&ino)
            }
            Op::Stat { target } => {
                let ino = target!(target);
                self.backend.stat(&ino)
            }
            Op::Readdir { path } => {
                let ino = target!(&Target::Path(path.clone()));
                self.backend.readdir(&ino)
            }
            Op::Readlink { path } => {
                let ino = target!(&Target::Path(path.clone()));
                self.backend.readlink(&ino)
            }
            Op::Open { path, slot } => {
                let ino = target!(&Target::Path(path.clone()));
                let handle = match self.backend.open(&ino)? {
                    Ok(h) => h,
                    Err(e) => return Ok(Err(e)),
                };
                // Open the new handle before releasing the slot's old one,
                // as a process reusing a descriptor number does.
                if let Some(old) = self.handles[*slot].replace(handle) {
                    self.backend.release(&old)?;
                }
                Ok(Ok(Ret::Unit))
            }
            Op::Close { slot } => match self.handles[*slot].take() {
                Some(old) => {
                    self.backend.release(&old)?;
                    Ok(Ok(Ret::Unit))
                }
                None => Ok(Ok(Ret::Skipped)),
            },
            Op::Fsync { target, datasync } => {
                let ino = target!(target);
                self.backend.fsync(&ino, *datasync)
            }
            Op::FsyncDir { target } => {
                let ino = target!(target);
                self.backend.fsync(&ino, false)
            }
            Op::Sync => b.sync(),
            Op::CreateSubvolume { path } => b.create_subvolume(path),
            Op::Snapshot {
                source,
                dest,
                readonly,
            } => b.snapshot(source, dest, *readonly),
            Op::DeleteSubvolume { path } => b.delete_subvolume(path),
            Op::Cleaner => b.cleaner(),
            Op::Remount => {
                b.remount()?;
                self.handles.iter_mut().for_each(|h| *h = None);
                Ok(Ok(Ret::Unit))
            }
        }
    }
}

/// ENOENT for an inode of a deleted subvolume (an open handle into it),
/// then EROFS in a read-only subvolume when the op changes it: the
/// engine resolves an inode's subvolume before anything else.
macro_rules! live {
    ($model:ident, $ino:expr) => {
        if $model.is_dead(*$ino) {
            return Ok(Err(libc::ENOENT));
        }
    };
    ($model:ident, $ino:expr, change) => {
        live!($model, $ino);
        if let Err(e) = $model.check_writable(*$ino) {
            return Ok(Err(e));
        }
    };
}

/// The reference model as a backend: it walks paths itself, and its
/// persistence ops succeed without doing anything (the model has no
/// media).
impl Backend for Model {
    type Ino = MIno;

    fn resolve(&mut self, path: &Path) -> Step<Result<MIno, Errno>> {
        Ok(Model::resolve(self, path))
    }
    fn create(&mut self, path: &Path, perm: u32) -> Step<Outcome> {
        Ok(Model::create(self, path, perm, 0, 0).map(|i| Ret::Attr(self.getattr(i))))
    }
    fn mkdir(&mut self, path: &Path, perm: u32) -> Step<Outcome> {
        Ok(Model::mkdir(self, path, perm, 0, 0).map(|i| Ret::Attr(self.getattr(i))))
    }
    fn mkfifo(&mut self, path: &Path) -> Step<Outcome> {
        Ok(self
            .mknod(path, Kind::Fifo, 0o644, 0, 0)
            .map(|i| Ret::Attr(self.getattr(i))))
    }
    fn symlink(&mut self, path: &Path, target: &[u8]) -> Step<Outcome> {
        Ok(Model::symlink(self, path, target, 0, 0).map(|i| Ret::Attr(self.getattr(i))))
    }
    fn link(&mut self, from: &Path, to: &Path) -> Step<Outcome> {
        Ok(Model::link(self, from, to).map(|i| Ret::Attr(self.getattr(i))))
    }
    fn unlink(&mut self, path: &Path) -> Step<Outcome> {
        Ok(Model::unlink(self, path).map(|_| Ret::Unit))
    }
    fn rmdir(&mut self, path: &Path) -> Step<Outcome> {
        Ok(Model::rmdir(self, path).map(|_| Ret::Unit))
    }
    fn rename(&mut self, from: &Path, to: &Path, flags: RenameFlags) -> Step<Outcome> {
        Ok(Model::rename(self, from, to, flags).map(|_| Ret::Unit))
    }
    fn write(&mut self, ino: &MIno, offset: u64, data: &[u8]) -> Step<Outcome> {
        live!(self, ino);
        Ok(Model::write(self, *ino, offset, data).map(Ret::Len))
    }
    fn truncate(&mut self, ino: &MIno, size: u64) -> Step<Outcome> {
        live!(self, ino, change);
        Ok(Model::truncate(self, *ino, size).map(|_| Ret::Unit))
    }
    fn read(&mut self, ino: &MIno, offset: u64, len: usize) -> Step<Outcome> {
        live!(self, ino);
        Ok(Model::read(self, *ino, offset, len).map(Ret::Data))
    }
    fn chmod(&mut self, ino: &MIno, perm: u32) -> Step<Outcome> {
        live!(self, ino, change);
        Model::chmod(self, *ino, perm);
        Ok(Ok(Ret::Attr(self.getattr(*ino))))
    }
    fn chown(&mut self, ino: &MIno, uid: Option<u32>, gid: Option<u32>) -> Step<Outcome> {
        live!(self, ino, change);
        Model::chown(self, *ino, uid, gid);
        Ok(Ok(Ret::Attr(self.getattr(*ino))))
    }
    fn setxattr(
        &mut self,
        ino: &MIno,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Step<Outcome> {
        live!(self, ino, change);
        Ok(Model::setxattr(self, *ino, name, value, mode).map(|_| Ret::Unit))
    }
    fn removexattr(&mut self, ino: &MIno, name: &[u8]) -> Step<Outcome> {
        live!(self, ino, change);
        Ok(Model::removexattr(self, *ino, name).map(|_| Ret::Unit))
    }
    fn getxattr(&mut self, ino: &MIno, name: &[u8]) -> Step<Outcome> {
        live!(self, ino);
        Ok(Model::getxattr(self, *ino, name).map(Ret::Data))
    }
    fn listxattr(&mut self, ino: &MIno) -> Step<Outcome> {
        live!(self, ino);
        Ok(Ok(Ret::Names(Model::listxattr(self, *ino))))
    }
    fn stat(&mut self, ino: &MIno) -> Step<Outcome> {
        live!(self, ino);
        Ok(Ok(Ret::Attr(self.getattr(*ino))))
    }
    fn readdir(&mut self, ino: &MIno) -> Step<Outcome> {
        live!(self, ino);
        Ok(Model::readdir(self, *ino).map(Ret::Dir))
    }
    fn readlink(&mut self, ino: &MIno) -> Step<Outcome> {
        live!(self, ino);
        Ok(Model::readlink(self, *ino).map(Ret::Data))
    }
    fn open(&mut self, ino: &MIno) -> Step<Result<MIno, Errno>> {
        Model::open(self, *ino);
        Ok(Ok(*ino))
    }
    fn release(&mut self, handle: &MIno) -> Step<()> {
        if !self.is_dead(*handle) {
            Model::release(self, *handle);
        }
        Ok(())
    }
    fn fsync(&mut self, ino: &MIno, _: bool) -> Step<Outcome> {
        live!(self, ino);
        Ok(Ok(Ret::Unit))
    }
    fn sync(&mut self) -> Step<Outcome> {
        Ok(Ok(Ret::Unit))
    }
    fn remount(&mut self) -> Step<()> {
        self.release_all();
        Ok(())
    }
    fn create_subvolume(&mut self, path: &Path) -> Step<Outcome> {
        Ok(Model::create_subvolume(self, path).map(|_| Ret::Unit))
    }
    fn snapshot(&mut self, source: &Path, dest: &Path, readonly: bool) -> Step<Outcome> {
        Ok(Model::snapshot(self, source, dest, readonly).map(|_| Ret::Unit))
    }
    fn delete_subvolume(&mut self, path: &Path) -> Step<Outcome> {
        Ok(Model::delete_subvolume(self, path).map(|_| Ret::Unit))
    }
    fn cleaner(&mut self) -> Step<Outcome> {
        Ok(Ok(Ret::Unit))
    }
    fn punch_hole(&mut self, ino: &MIno, offset: u64, len: u64) -> Step<Outcome> {
        live!(self, ino);
        Ok(Model::punch_hole(self, *ino, offset, len).map(|_| Ret::Unit))
    }
    fn zero_range(&mut self, ino: &MIno, offset: u64, len: u64, keep_size: bool) -> Step<Outcome> {
        live!(self, ino);
        Ok(Model::zero_range(self, *ino, offset, len, keep_size).map(|_| Ret::Unit))
    }
    fn copy_range(
        &mut self,
        src: &MIno,
        src_offset: u64,
        dst: &MIno,
        dst_offset: u64,
        len: u64,
    ) -> Step<Outcome> {
        live!(self, src);
        live!(self, dst);
        Ok(Model::copy_range(self, *src, src_offset, *dst, dst_offset, len).map(Ret::Len))
    }
    fn set_compress_flag(&mut self, ino: &MIno, _: bool) -> Step<Outcome> {
        live!(self, ino);
        Ok(Model::set_compress_flag(self, *ino).map(|_| Ret::Unit))
    }
}
