//! Runs ops on the engine and the model side by side and compares them.
//!
//! The harness plays the kernel's VFS for the engine: it walks each path
//! with `lookup` (ENOTDIR, ENAMETOOLONG, ENOENT as the walk meets them),
//! checks that the last directory is a directory, and then calls the
//! engine's operation on `(directory inode, name)`. The model does the same
//! walk on itself. Results are compared exactly: `Ok` values (attributes,
//! bytes read, xattr values, directory listings) and errno values.

use crate::extract::engine_view;
use crate::model::{
    diff_views, AttrView, Errno, Kind, MIno, Model, RenameFlags as MRenameFlags, XattrMode,
};
use crate::workload::{pattern, Op, Target};
use birch::device::BlockDevice;
use birch::fs::{Filesystem, MountOptions, RenameFlags, SetAttr, XattrSetMode};
use std::collections::BTreeMap;
use std::sync::Arc;

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

pub type Outcome = Result<Ret, Errno>;

fn show_outcome(o: &Outcome) -> String {
    match o {
        Ok(Ret::Data(d)) => format!("Ok({} bytes)", d.len()),
        Ok(r) => format!("Ok({r:?})"),
        Err(e) => format!("Err({})", errno_name(*e)),
    }
}

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
        _ => return format!("errno {e}"),
    };
    name.to_string()
}

/// Where the engine's errno differs from the kernel's only in which of two
/// applicable errors wins, and the engine is known to differ (each one is
/// reported as an engine bug, with a failing test in tests/engine_bugs.rs).
/// Both sides failed, so neither changed state; the run goes on. Set
/// `BIRCH_SIM_STRICT=1` to treat these as failures too.
pub fn known_divergence(op: &Op, model: Errno, engine: Errno) -> Option<&'static str> {
    // None open. An entry looks like:
    //   (Op::Link { .. }, libc::EEXIST, libc::EPERM) => Some("link: EPERM before EEXIST"),
    let _ = (op, model, engine);
    None
}

/// `birch check` faults that an open engine bug produces (each with a
/// failing test in tests/engine_bugs.rs). A report whose every fault is
/// one of these is tolerated unless `BIRCH_SIM_STRICT=1`.
/// Entries are (a substring of the fault's reason, the bug); none is open.
pub const KNOWN_CHECK_FAULTS: &[(&str, &str)] = &[];

/// Checks an image: `Ok(tolerated faults)` when clean (or when every fault
/// is a known engine bug and not in strict mode), else the report.
pub fn check_image<D: BlockDevice + ?Sized>(dev: &D) -> Result<Vec<String>, String> {
    let report = birch::check::check_device(dev);
    if report.is_clean() {
        return Ok(Vec::new());
    }
    let known = |f: &birch::check::Fault| {
        KNOWN_CHECK_FAULTS
            .iter()
            .any(|(sig, _)| f.reason.contains(sig))
    };
    if !strict() && report.faults_not_stored == 0 && report.faults.iter().all(known) {
        return Ok(report
            .faults
            .iter()
            .map(|f| format!("known engine bug: {f}"))
            .collect());
    }
    Err(format!("{report}"))
}

fn strict() -> bool {
    std::env::var("BIRCH_SIM_STRICT").is_ok_and(|v| v != "0" && !v.is_empty())
}

/// The engine and the model, driven together.
pub struct Sim<D: BlockDevice + 'static> {
    fs: Option<Filesystem<Arc<D>>>,
    dev: Arc<D>,
    pub model: Model,
    /// Open handle slots: (engine inode, model inode).
    handles: Vec<Option<(u64, MIno)>>,
    pub mount: MountOptions,
    /// Divergences tolerated so far (see [`known_divergence`]).
    pub tolerated: Vec<String>,
    pub ops_run: u64,
    strict: bool,
}

type Step<T> = Result<T, String>;

impl<D: BlockDevice + 'static> Sim<D> {
    /// Opens the (already formatted) device and starts from an empty model.
    pub fn open(dev: Arc<D>, mount: MountOptions, handles: usize) -> Step<Sim<D>> {
        let fs = Filesystem::open(dev.clone(), mount.clone()).map_err(|e| format!("open: {e}"))?;
        Ok(Sim {
            fs: Some(fs),
            dev,
            model: Model::new(),
            handles: vec![None; handles],
            mount,
            tolerated: Vec::new(),
            ops_run: 0,
            strict: strict(),
        })
    }

    pub fn fs(&self) -> &Filesystem<Arc<D>> {
        self.fs.as_ref().expect("filesystem is open")
    }

    pub fn device(&self) -> &Arc<D> {
        &self.dev
    }

    /// The (engine, model) inodes open in handle slot `h`.
    pub fn handle(&self, h: usize) -> Option<(u64, MIno)> {
        self.handles.get(h).copied().flatten()
    }

    /// Generation of the engine's last durable commit.
    pub fn generation(&self) -> u64 {
        self.fs().generation()
    }

    /// Compares the whole canonical view of engine and model.
    pub fn compare_views(&self) -> Step<()> {
        let engine =
            engine_view(self.fs()).map_err(|e| format!("engine view is inconsistent: {e}"))?;
        let model = self.model.view();
        match diff_views(&model, &engine) {
            None => Ok(()),
            Some(d) => Err(format!("engine differs from the model at {d}")),
        }
    }

    /// Closes the filesystem (handles stay open: their inodes become
    /// orphans), checks the image, reopens it and compares the views.
    pub fn remount(&mut self) -> Step<()> {
        let fs = self.fs.take().expect("filesystem is open");
        fs.close().map_err(|e| format!("close: {e}"))?;
        let tolerated =
            check_image(&*self.dev).map_err(|r| format!("check after close is not clean:\n{r}"))?;
        self.tolerated.extend(tolerated);
        self.fs = Some(
            Filesystem::open(self.dev.clone(), self.mount.clone())
                .map_err(|e| format!("reopen: {e}"))?,
        );
        self.model.release_all();
        self.handles.iter_mut().for_each(|h| *h = None);
        self.compare_views()
            .map_err(|e| format!("after remount: {e}"))
    }

    /// Closes the filesystem and returns the device.
    pub fn close(mut self) -> Step<Arc<D>> {
        let fs = self.fs.take().expect("filesystem is open");
        fs.close().map_err(|e| format!("close: {e}"))?;
        Ok(self.dev.clone())
    }

    // ----- the engine side, with the VFS's path walk -----

    fn errno(&self, e: birch::Error) -> Step<Errno> {
        match e.errno() {
            libc::EIO | libc::EROFS => Err(format!("engine failed: {e}")),
            n => Ok(n),
        }
    }

    fn e_walk(&self, path: &[Vec<u8>]) -> Step<Result<u64, Errno>> {
        let fs = self.fs();
        let mut cur = fs.root_ino();
        for c in path {
            match fs.lookup(cur, c) {
                Ok(a) => cur = a.ino,
                Err(e) => return Ok(Err(self.errno(e)?)),
            }
        }
        Ok(Ok(cur))
    }

    fn e_parent<'p>(&self, path: &'p [Vec<u8>]) -> Step<Result<(u64, &'p [u8]), Errno>> {
        let (name, dirs) = path.split_last().expect("a path with a last component");
        let dir = match self.e_walk(dirs)? {
            Ok(d) => d,
            Err(e) => return Ok(Err(e)),
        };
        let attr = self
            .fs()
            .getattr(dir)
            .map_err(|e| format!("getattr of a resolved directory: {e}"))?;
        if Kind::from_engine(attr.file_type) != Kind::Dir {
            return Ok(Err(libc::ENOTDIR));
        }
        Ok(Ok((dir, name)))
    }

    /// Resolves a target on both sides: `Ok(None)` for an empty slot.
    #[allow(clippy::type_complexity)]
    fn targets(&self, t: &Target) -> Step<Result<Option<(u64, MIno)>, (Errno, Errno)>> {
        match t {
            Target::Handle(h) => Ok(Ok(self.handles[*h])),
            Target::Path(p) => {
                let m = self.model.resolve(p);
                let e = self.e_walk(p)?;
                match (m, e) {
                    (Ok(m), Ok(e)) => Ok(Ok(Some((e, m)))),
                    (Err(m), Err(e)) => Ok(Err((m, e))),
                    (m, e) => Err(format!(
                        "resolving {}: model {}, engine {}",
                        crate::model::show_path(p),
                        m.map_or_else(errno_name, |_| "finds it".into()),
                        e.map_or_else(errno_name, |i| format!("finds inode {i}"))
                    )),
                }
            }
        }
    }

    fn e_result<T>(&self, r: birch::Result<T>, f: impl FnOnce(T) -> Ret) -> Step<Outcome> {
        match r {
            Ok(v) => Ok(Ok(f(v))),
            Err(e) => Ok(Err(self.errno(e)?)),
        }
    }

    /// Runs one op on both sides and compares the results; returns the
    /// (agreed) outcome.
    pub fn step(&mut self, op: &Op) -> Step<Outcome> {
        self.ops_run += 1;
        let (m, e) = self.run(op)?;
        if m == e {
            return Ok(m);
        }
        if let (Err(me), Err(ee)) = (&m, &e) {
            if !self.strict {
                if let Some(why) = known_divergence(op, *me, *ee) {
                    self.tolerated.push(format!(
                        "{op}: kernel {} engine {} ({why})",
                        errno_name(*me),
                        errno_name(*ee)
                    ));
                    return Ok(m);
                }
            }
        }
        Err(format!(
            "`{op}`: model (kernel semantics) returned {}, engine returned {}",
            show_outcome(&m),
            show_outcome(&e)
        ))
    }

    fn run(&mut self, op: &Op) -> Step<(Outcome, Outcome)> {
        macro_rules! parent {
            ($m:ident, $path:expr) => {
                match self.e_parent($path)? {
                    Ok(p) => p,
                    Err(e) => return Ok(($m, Err(e))),
                }
            };
        }
        macro_rules! target {
            ($t:expr) => {
                match self.targets($t)? {
                    Ok(Some(pair)) => pair,
                    Ok(None) => return Ok((Ok(Ret::Skipped), Ok(Ret::Skipped))),
                    Err((m, e)) => return Ok((Err(m), Err(e))),
                }
            };
        }
        let attr = |a: birch::fs::Attr| Ret::Attr(AttrView::from_engine(&a));
        match op {
            Op::Create { path, perm } => {
                let m = self
                    .model
                    .create(path, *perm, 0, 0)
                    .map(|i| Ret::Attr(self.model.getattr(i)));
                let (dir, name) = parent!(m, path);
                let e = self.e_result(self.fs().create(dir, name, *perm, 0, 0), attr)?;
                Ok((m, e))
            }
            Op::Mkdir { path, perm } => {
                let m = self
                    .model
                    .mkdir(path, *perm, 0, 0)
                    .map(|i| Ret::Attr(self.model.getattr(i)));
                let (dir, name) = parent!(m, path);
                let e = self.e_result(self.fs().mkdir(dir, name, *perm, 0, 0), attr)?;
                Ok((m, e))
            }
            Op::Mkfifo { path } => {
                let m = self
                    .model
                    .mknod(path, Kind::Fifo, 0o644, 0, 0)
                    .map(|i| Ret::Attr(self.model.getattr(i)));
                let (dir, name) = parent!(m, path);
                let e = self.e_result(
                    self.fs().mknod(dir, name, libc::S_IFIFO | 0o644, 0, 0, 0),
                    attr,
                )?;
                Ok((m, e))
            }
            Op::Symlink { path, target } => {
                let m = self
                    .model
                    .symlink(path, target, 0, 0)
                    .map(|i| Ret::Attr(self.model.getattr(i)));
                let (dir, name) = parent!(m, path);
                let e = self.e_result(self.fs().symlink(dir, name, target, 0, 0), attr)?;
                Ok((m, e))
            }
            Op::Link { from, to } => {
                let m = self
                    .model
                    .link(from, to)
                    .map(|i| Ret::Attr(self.model.getattr(i)));
                let ino = match self.e_walk(from)? {
                    Ok(i) => i,
                    Err(e) => return Ok((m, Err(e))),
                };
                let (dir, name) = parent!(m, to);
                let e = self.e_result(self.fs().link(ino, dir, name), attr)?;
                Ok((m, e))
            }
            Op::Unlink { path } => {
                let m = self.model.unlink(path).map(|_| Ret::Unit);
                let (dir, name) = parent!(m, path);
                let e = self.e_result(self.fs().unlink(dir, name), |_| Ret::Unit)?;
                Ok((m, e))
            }
            Op::Rmdir { path } => {
                let m = self.model.rmdir(path).map(|_| Ret::Unit);
                if path.is_empty() {
                    return Ok((m, Err(libc::EBUSY)));
                }
                let (dir, name) = parent!(m, path);
                let e = self.e_result(self.fs().rmdir(dir, name), |_| Ret::Unit)?;
                Ok((m, e))
            }
            Op::Rename { from, to, flags } => {
                let m = self.model.rename(from, to, *flags).map(|_| Ret::Unit);
                if from.is_empty() || to.is_empty() {
                    return Ok((m, Err(libc::EBUSY)));
                }
                let (od, on) = parent!(m, from);
                let (nd, nn) = parent!(m, to);
                let MRenameFlags {
                    no_replace,
                    exchange,
                } = *flags;
                let e = self.e_result(
                    self.fs().rename(
                        od,
                        on,
                        nd,
                        nn,
                        RenameFlags {
                            no_replace,
                            exchange,
                        },
                    ),
                    |_| Ret::Unit,
                )?;
                Ok((m, e))
            }
            Op::Write {
                target,
                offset,
                len,
                fill,
            } => {
                let (ei, mi) = target!(target);
                let data = pattern(*fill, *len as usize);
                let m = self.model.write(mi, *offset, &data).map(Ret::Len);
                let e = self.e_result(self.fs().write_file(ei, *offset, &data), Ret::Len)?;
                Ok((m, e))
            }
            Op::Truncate { target, size } => {
                let (ei, mi) = target!(target);
                let m = self.model.truncate(mi, *size).map(|_| Ret::Unit);
                let e = self.e_result(self.fs().truncate(ei, *size), |_| Ret::Unit)?;
                Ok((m, e))
            }
            Op::Read {
                target,
                offset,
                len,
            } => {
                let (ei, mi) = target!(target);
                let m = self.model.read(mi, *offset, *len as usize).map(Ret::Data);
                let e =
                    self.e_result(self.fs().read_file(ei, *offset, *len as usize), Ret::Data)?;
                Ok((m, e))
            }
            Op::Chmod { target, perm } => {
                let (ei, mi) = target!(target);
                self.model.chmod(mi, *perm);
                let m = Ok(Ret::Attr(self.model.getattr(mi)));
                let e = self.e_result(
                    self.fs().setattr(
                        ei,
                        &SetAttr {
                            mode: Some(*perm),
                            ..Default::default()
                        },
                    ),
                    attr,
                )?;
                Ok((m, e))
            }
            Op::Chown { target, uid, gid } => {
                let (ei, mi) = target!(target);
                self.model.chown(mi, *uid, *gid);
                let m = Ok(Ret::Attr(self.model.getattr(mi)));
                let e = self.e_result(
                    self.fs().setattr(
                        ei,
                        &SetAttr {
                            uid: *uid,
                            gid: *gid,
                            ..Default::default()
                        },
                    ),
                    attr,
                )?;
                Ok((m, e))
            }
            Op::SetXattr {
                target,
                name,
                value_len,
                fill,
                mode,
            } => {
                let (ei, mi) = target!(target);
                let value = pattern(*fill, *value_len);
                let m = self
                    .model
                    .setxattr(mi, name, &value, *mode)
                    .map(|_| Ret::Unit);
                let mode = match mode {
                    XattrMode::Any => XattrSetMode::CreateOrReplace,
                    XattrMode::Create => XattrSetMode::Create,
                    XattrMode::Replace => XattrSetMode::Replace,
                };
                let e = self.e_result(self.fs().setxattr(ei, name, &value, mode), |_| Ret::Unit)?;
                Ok((m, e))
            }
            Op::RemoveXattr { target, name } => {
                let (ei, mi) = target!(target);
                let m = self.model.removexattr(mi, name).map(|_| Ret::Unit);
                let e = self.e_result(self.fs().removexattr(ei, name), |_| Ret::Unit)?;
                Ok((m, e))
            }
            Op::GetXattr { target, name } => {
                let (ei, mi) = target!(target);
                let m = self.model.getxattr(mi, name).map(Ret::Data);
                let e = self.e_result(self.fs().getxattr(ei, name), Ret::Data)?;
                Ok((m, e))
            }
            Op::ListXattr { target } => {
                let (ei, mi) = target!(target);
                let m = Ok(Ret::Names(self.model.listxattr(mi)));
                let e = self.e_result(self.fs().listxattr(ei), |mut names| {
                    names.sort();
                    Ret::Names(names)
                })?;
                Ok((m, e))
            }
            Op::Stat { target } => {
                let (ei, mi) = target!(target);
                let m = Ok(Ret::Attr(self.model.getattr(mi)));
                let e = self.e_result(self.fs().getattr(ei), attr)?;
                Ok((m, e))
            }
            Op::Readdir { path } => {
                let (ei, mi) = target!(&Target::Path(path.clone()));
                let m = self.model.readdir(mi).map(Ret::Dir);
                let e = self.e_readdir(ei)?;
                Ok((m, e))
            }
            Op::Readlink { path } => {
                let (ei, mi) = target!(&Target::Path(path.clone()));
                let m = self.model.readlink(mi).map(Ret::Data);
                let e = self.e_result(self.fs().readlink(ei), Ret::Data)?;
                Ok((m, e))
            }
            Op::Open { path, slot } => {
                let (ei, mi) = target!(&Target::Path(path.clone()));
                self.close_slot(*slot)?;
                self.model.open(mi);
                self.fs()
                    .open_inode(ei)
                    .map_err(|e| format!("open_inode({ei}): {e}"))?;
                self.handles[*slot] = Some((ei, mi));
                Ok((Ok(Ret::Unit), Ok(Ret::Unit)))
            }
            Op::Close { slot } => {
                let r = if self.handles[*slot].is_some() {
                    Ret::Unit
                } else {
                    Ret::Skipped
                };
                self.close_slot(*slot)?;
                Ok((Ok(r.clone()), Ok(r)))
            }
            Op::Fsync { target, datasync } => {
                let (ei, _) = target!(target);
                let e = self.e_result(self.fs().fsync(ei, *datasync), |_| Ret::Unit)?;
                Ok((Ok(Ret::Unit), e))
            }
            Op::FsyncDir { target } => {
                let (ei, _) = target!(target);
                let e = self.e_result(self.fs().fsync(ei, false), |_| Ret::Unit)?;
                Ok((Ok(Ret::Unit), e))
            }
            Op::Sync => {
                let e = self.e_result(self.fs().sync(), |_| Ret::Unit)?;
                Ok((Ok(Ret::Unit), e))
            }
            Op::Remount => {
                self.remount()?;
                Ok((Ok(Ret::Unit), Ok(Ret::Unit)))
            }
        }
    }

    fn close_slot(&mut self, slot: usize) -> Step<()> {
        if let Some((ei, mi)) = self.handles[slot].take() {
            self.model.release(mi);
            self.fs()
                .release(ei)
                .map_err(|e| format!("release({ei}): {e}"))?;
        }
        Ok(())
    }

    fn e_readdir(&self, dir: u64) -> Step<Outcome> {
        let mut out = BTreeMap::new();
        let mut offset = 0;
        loop {
            let page = match self.fs().readdir(dir, offset, 3) {
                Ok(p) => p,
                Err(e) => return Ok(Err(self.errno(e)?)),
            };
            if page.is_empty() {
                return Ok(Ok(Ret::Dir(out)));
            }
            for e in page {
                offset = e.next_offset;
                if out
                    .insert(e.name.clone(), Kind::from_engine(e.file_type))
                    .is_some()
                {
                    return Err(format!(
                        "readdir lists {:?} twice",
                        String::from_utf8_lossy(&e.name)
                    ));
                }
            }
        }
    }
}
