//! Runs ops on the engine and the model side by side and compares them.
//!
//! Both sides run each op through the one [`Executor`]; [`Engine`] is the
//! engine's [`Backend`]. It plays the kernel's VFS for the engine: it walks
//! each path with `lookup` (ENOTDIR, ENAMETOOLONG, ENOENT as the walk meets
//! them), checks that the last directory is a directory, and then calls the
//! engine's operation on `(directory inode, name)`. The model does the same
//! walk on itself. Results are compared exactly: `Ok` values (attributes,
//! bytes read, xattr values, directory listings) and errno values.

pub use crate::exec::{errno_name, Outcome, Ret, Step};
use crate::exec::{show_outcome, Backend, Executor};
use crate::extract::engine_view;
use crate::model::{
    diff_views, AttrView, Errno, Kind, MIno, Model, Path, RenameFlags as MRenameFlags, XattrMode,
};
use crate::workload::Op;
use birch::device::BlockDevice;
use birch::fs::{
    inode_flags, FallocateMode, Filesystem, MountOptions, RenameFlags, SetAttr, WhiteoutOwner,
    XattrSetMode,
};
use std::collections::BTreeMap;
use std::sync::Arc;

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

/// Checks an image, its data too (`birch check --verify-data`):
/// `Ok(tolerated faults)` when clean (or when every fault
/// is a known engine bug and not in strict mode), else the report.
pub fn check_image<D: BlockDevice + ?Sized>(dev: &D) -> Result<Vec<String>, String> {
    check_image_summary(dev).map(|(tolerated, _)| tolerated)
}

/// [`check_image`], with what the check saw (counts of items and extents).
pub fn check_image_summary<D: BlockDevice + ?Sized>(
    dev: &D,
) -> Result<(Vec<String>, birch::check::Summary), String> {
    // With the data: every state's compressed extents decompress to
    // their recorded lengths and every block matches its checksum.
    let options = birch::check::CheckOptions { verify_data: true };
    let report = birch::check::check_device_with(dev, options);
    if report.is_clean() {
        return Ok((Vec::new(), report.summary));
    }
    let known = |f: &birch::check::Fault| {
        KNOWN_CHECK_FAULTS
            .iter()
            .any(|(sig, _)| f.reason.contains(sig))
    };
    if !strict() && report.faults_not_stored == 0 && report.faults.iter().all(known) {
        let tolerated = report
            .faults
            .iter()
            .map(|f| format!("known engine bug: {f}"))
            .collect();
        return Ok((tolerated, report.summary));
    }
    Err(format!("{report}"))
}

fn strict() -> bool {
    std::env::var("BIRCH_SIM_STRICT").is_ok_and(|v| v != "0" && !v.is_empty())
}

/// The engine as a backend: a `Filesystem` on a device, reopened on
/// remount.
pub struct Engine<D: BlockDevice + 'static> {
    fs: Option<Filesystem<Arc<D>>>,
    dev: Arc<D>,
    mount: MountOptions,
    /// `birch check` faults of known engine bugs met at remounts.
    tolerated: Vec<String>,
}

impl<D: BlockDevice + 'static> Engine<D> {
    fn fs(&self) -> &Filesystem<Arc<D>> {
        self.fs.as_ref().expect("filesystem is open")
    }

    /// An engine error as the errno a system call returns; EIO is a
    /// failure of the run, never an expected result. (EROFS is expected
    /// in a read-only snapshot; the model says where.)
    fn errno(&self, e: birch::Error) -> Step<Errno> {
        match e.errno() {
            libc::EIO => Err(format!("engine failed: {e}")),
            n => Ok(n),
        }
    }

    fn result<T>(&self, r: birch::Result<T>, f: impl FnOnce(T) -> Ret) -> Step<Outcome> {
        match r {
            Ok(v) => Ok(Ok(f(v))),
            Err(e) => Ok(Err(self.errno(e)?)),
        }
    }

    fn attr(&self, r: birch::Result<birch::fs::Attr>) -> Step<Outcome> {
        self.result(r, |a| Ret::Attr(AttrView::from_engine(&a)))
    }

    fn walk(&self, path: &[Vec<u8>]) -> Step<Result<u64, Errno>> {
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

    /// The directory a new or removed name lives in, as the VFS resolves
    /// it before calling the filesystem.
    fn parent<'p>(&self, path: &'p [Vec<u8>]) -> Step<Result<(u64, &'p [u8]), Errno>> {
        let (name, dirs) = path.split_last().expect("a path with a last component");
        let dir = match self.walk(dirs)? {
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

    fn setattr(&self, ino: u64, set: &SetAttr) -> Step<Outcome> {
        self.attr(self.fs().setattr(ino, set))
    }

    /// The kind of an inode, as the VFS knows it from the open file.
    fn kind(&self, ino: u64) -> Step<Result<Kind, Errno>> {
        match self.fs().getattr(ino) {
            Ok(a) => Ok(Ok(Kind::from_engine(a.file_type))),
            Err(e) => Ok(Err(self.errno(e)?)),
        }
    }
}

/// The VFS's checks before a call reaches the filesystem: the errno
/// of `check` on the inode's kind, if any.
macro_rules! vfs_kind {
    ($self:ident, $ino:expr, $check:expr) => {
        match $self.kind($ino)? {
            Ok(kind) => {
                if let Err(e) = $check(kind) {
                    return Ok(Err(e));
                }
            }
            Err(e) => return Ok(Err(e)),
        }
    };
}

macro_rules! parent {
    ($self:ident, $path:expr) => {
        match $self.parent($path)? {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        }
    };
}

impl<D: BlockDevice + 'static> Backend for Engine<D> {
    type Ino = u64;

    fn resolve(&mut self, path: &Path) -> Step<Result<u64, Errno>> {
        self.walk(path)
    }
    fn create(&mut self, path: &Path, perm: u32) -> Step<Outcome> {
        let (dir, name) = parent!(self, path);
        self.attr(self.fs().create(dir, name, perm, 0, 0))
    }
    fn mkdir(&mut self, path: &Path, perm: u32) -> Step<Outcome> {
        let (dir, name) = parent!(self, path);
        self.attr(self.fs().mkdir(dir, name, perm, 0, 0))
    }
    fn mkfifo(&mut self, path: &Path) -> Step<Outcome> {
        let (dir, name) = parent!(self, path);
        self.attr(self.fs().mknod(dir, name, libc::S_IFIFO | 0o644, 0, 0, 0))
    }
    fn symlink(&mut self, path: &Path, target: &[u8]) -> Step<Outcome> {
        let (dir, name) = parent!(self, path);
        self.attr(self.fs().symlink(dir, name, target, 0, 0))
    }
    fn link(&mut self, from: &Path, to: &Path) -> Step<Outcome> {
        let ino = match self.walk(from)? {
            Ok(i) => i,
            Err(e) => return Ok(Err(e)),
        };
        let (dir, name) = parent!(self, to);
        self.attr(self.fs().link(ino, dir, name))
    }
    fn unlink(&mut self, path: &Path) -> Step<Outcome> {
        let (dir, name) = parent!(self, path);
        self.result(self.fs().unlink(dir, name), |_| Ret::Unit)
    }
    fn rmdir(&mut self, path: &Path) -> Step<Outcome> {
        // The VFS refuses to remove the root before a filesystem sees it.
        if path.is_empty() {
            return Ok(Err(libc::EBUSY));
        }
        let (dir, name) = parent!(self, path);
        self.result(self.fs().rmdir(dir, name), |_| Ret::Unit)
    }
    fn rename(&mut self, from: &Path, to: &Path, flags: MRenameFlags) -> Step<Outcome> {
        // The kernel refuses bad flag combinations before it looks up a
        // path (`do_renameat2`); the engine sees them only once both
        // parents are found.
        if flags.exchange && (flags.no_replace || flags.whiteout) {
            return Ok(Err(libc::EINVAL));
        }
        if from.is_empty() || to.is_empty() {
            return Ok(Err(libc::EBUSY));
        }
        let (od, on) = parent!(self, from);
        let (nd, nn) = parent!(self, to);
        let MRenameFlags {
            no_replace,
            exchange,
            whiteout,
        } = flags;
        let flags = RenameFlags {
            no_replace,
            exchange,
            // Root's, as the model's (workloads run as root).
            whiteout: whiteout.then_some(WhiteoutOwner { uid: 0, gid: 0 }),
        };
        self.result(self.fs().rename(od, on, nd, nn, flags), |_| Ret::Unit)
    }
    fn write(&mut self, ino: &u64, offset: u64, data: &[u8]) -> Step<Outcome> {
        self.result(self.fs().write_file(*ino, offset, data), Ret::Len)
    }
    fn truncate(&mut self, ino: &u64, size: u64) -> Step<Outcome> {
        self.result(self.fs().truncate(*ino, size), |_| Ret::Unit)
    }
    fn read(&mut self, ino: &u64, offset: u64, len: usize) -> Step<Outcome> {
        self.result(self.fs().read_file(*ino, offset, len), Ret::Data)
    }
    fn chmod(&mut self, ino: &u64, perm: u32) -> Step<Outcome> {
        self.setattr(
            *ino,
            &SetAttr {
                mode: Some(perm),
                ..Default::default()
            },
        )
    }
    fn chown(&mut self, ino: &u64, uid: Option<u32>, gid: Option<u32>) -> Step<Outcome> {
        self.setattr(
            *ino,
            &SetAttr {
                uid,
                gid,
                ..Default::default()
            },
        )
    }
    fn setxattr(&mut self, ino: &u64, name: &[u8], value: &[u8], mode: XattrMode) -> Step<Outcome> {
        let mode = match mode {
            XattrMode::Any => XattrSetMode::CreateOrReplace,
            XattrMode::Create => XattrSetMode::Create,
            XattrMode::Replace => XattrSetMode::Replace,
        };
        self.result(self.fs().setxattr(*ino, name, value, mode), |_| Ret::Unit)
    }
    fn removexattr(&mut self, ino: &u64, name: &[u8]) -> Step<Outcome> {
        self.result(self.fs().removexattr(*ino, name), |_| Ret::Unit)
    }
    fn getxattr(&mut self, ino: &u64, name: &[u8]) -> Step<Outcome> {
        self.result(self.fs().getxattr(*ino, name), Ret::Data)
    }
    fn listxattr(&mut self, ino: &u64) -> Step<Outcome> {
        self.result(self.fs().listxattr(*ino), |mut names| {
            names.sort();
            Ret::Names(names)
        })
    }
    fn stat(&mut self, ino: &u64) -> Step<Outcome> {
        self.attr(self.fs().getattr(*ino))
    }
    /// Reads the directory three entries at a time (exercising offsets).
    fn readdir(&mut self, ino: &u64) -> Step<Outcome> {
        let mut out = BTreeMap::new();
        let mut offset = 0;
        loop {
            let page = match self.fs().readdir(*ino, offset, 3) {
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
    fn readlink(&mut self, ino: &u64) -> Step<Outcome> {
        self.result(self.fs().readlink(*ino), Ret::Data)
    }
    fn open(&mut self, ino: &u64) -> Step<Result<u64, Errno>> {
        self.fs()
            .open_inode(*ino)
            .map_err(|e| format!("open_inode({ino}): {e}"))?;
        Ok(Ok(*ino))
    }
    /// A handle keeps its deleted subvolume loaded until released
    /// (docs/SNAPSHOTS.md (d) step 3); ENOENT (a handle whose subvolume
    /// the engine already dropped) would be no failure of the release.
    fn release(&mut self, handle: &u64) -> Step<()> {
        match self.fs().release(*handle) {
            Err(e) if e.errno() == libc::ENOENT => Ok(()),
            r => r.map_err(|e| format!("release({handle}): {e}")),
        }
    }
    fn fsync(&mut self, ino: &u64, datasync: bool) -> Step<Outcome> {
        self.result(self.fs().fsync(*ino, datasync), |_| Ret::Unit)
    }
    fn sync(&mut self) -> Step<Outcome> {
        self.result(self.fs().sync(), |_| Ret::Unit)
    }
    /// Closes the filesystem (open handles stay open: their inodes become
    /// orphans), requires `birch check` to be clean, and reopens it.
    fn remount(&mut self) -> Step<()> {
        let fs = self.fs.take().expect("filesystem is open");
        fs.close().map_err(|e| format!("close: {e}"))?;
        let tolerated =
            check_image(&*self.dev).map_err(|r| format!("check after close is not clean:\n{r}"))?;
        self.tolerated.extend(tolerated);
        self.fs = Some(
            Filesystem::open(self.dev.clone(), self.mount.clone())
                .map_err(|e| format!("reopen: {e}"))?,
        );
        Ok(())
    }
    fn create_subvolume(&mut self, path: &Path) -> Step<Outcome> {
        let (dir, name) = parent!(self, path);
        self.result(self.fs().create_subvolume(dir, name, 0, 0), |_| Ret::Unit)
    }
    /// The source is named by its root directory's path, as the CLI
    /// `stat`s it: the subvolume of an external number whose inode part
    /// is the root directory (256); EINVAL for anything else.
    fn snapshot(&mut self, source: &Path, dest: &Path, readonly: bool) -> Step<Outcome> {
        let ino = match self.walk(source)? {
            Ok(i) => i,
            Err(e) => return Ok(Err(e)),
        };
        let (id, inner) = (ino >> SUBVOL_SHIFT, ino & ((1 << SUBVOL_SHIFT) - 1));
        let id = if id == 0 { TOP_LEVEL } else { id };
        if inner != self.fs().root_ino() {
            return Ok(Err(libc::EINVAL));
        }
        let (dir, name) = parent!(self, dest);
        self.result(self.fs().create_snapshot(id, dir, name, readonly), |_| {
            Ret::Unit
        })
    }
    fn delete_subvolume(&mut self, path: &Path) -> Step<Outcome> {
        if path.is_empty() {
            return Ok(Err(libc::EBUSY));
        }
        let (dir, name) = parent!(self, path);
        self.result(self.fs().delete_subvolume(dir, name), |_| Ret::Unit)
    }
    fn cleaner(&mut self) -> Step<Outcome> {
        self.result(self.fs().run_cleaner(), |_| Ret::Unit)
    }
    /// `vfs_fallocate`'s kind checks (ESPIPE, EISDIR, ENODEV) and its
    /// EINVAL for an empty range, then the engine.
    fn punch_hole(&mut self, ino: &u64, offset: u64, len: u64) -> Step<Outcome> {
        vfs_kind!(self, *ino, |k| match k {
            Kind::File => Ok(()),
            Kind::Fifo => Err(libc::ESPIPE),
            Kind::Dir => Err(libc::EISDIR),
            _ => Err(libc::ENODEV),
        });
        if len == 0 {
            return Ok(Err(libc::EINVAL));
        }
        let mode = FallocateMode::PunchHole;
        self.result(self.fs().fallocate(*ino, offset, len, mode), |_| Ret::Unit)
    }
    /// As [`punch_hole`](Self::punch_hole): the VFS's checks, then the
    /// engine.
    fn zero_range(&mut self, ino: &u64, offset: u64, len: u64, keep_size: bool) -> Step<Outcome> {
        vfs_kind!(self, *ino, |k| match k {
            Kind::File => Ok(()),
            Kind::Fifo => Err(libc::ESPIPE),
            Kind::Dir => Err(libc::EISDIR),
            _ => Err(libc::ENODEV),
        });
        if len == 0 {
            return Ok(Err(libc::EINVAL));
        }
        let mode = if keep_size {
            FallocateMode::ZeroRangeKeepSize
        } else {
            FallocateMode::ZeroRange
        };
        self.result(self.fs().fallocate(*ino, offset, len, mode), |_| Ret::Unit)
    }
    /// `generic_copy_file_checks`' kind checks (EISDIR if either side is
    /// a directory, then EINVAL if either is not a regular file), then
    /// the engine.
    fn copy_range(
        &mut self,
        src: &u64,
        src_offset: u64,
        dst: &u64,
        dst_offset: u64,
        len: u64,
    ) -> Step<Outcome> {
        let mut kinds = Vec::new();
        for ino in [*src, *dst] {
            vfs_kind!(self, ino, |k| {
                kinds.push(k);
                Ok::<(), Errno>(())
            });
        }
        if kinds.contains(&Kind::Dir) {
            return Ok(Err(libc::EISDIR));
        }
        if kinds.iter().any(|k| *k != Kind::File) {
            return Ok(Err(libc::EINVAL));
        }
        let copied = self
            .fs()
            .copy_file_range(*src, src_offset, *dst, dst_offset, len);
        self.result(copied, |n| Ret::Len(n as usize))
    }
    /// FS_IOC_GETFLAGS, then FS_IOC_SETFLAGS with FS_COMPR_FL set or
    /// cleared; ENOTTY on what is neither a file nor a directory (the
    /// ioctl on a fifo).
    fn set_compress_flag(&mut self, ino: &u64, on: bool) -> Step<Outcome> {
        vfs_kind!(self, *ino, |k| match k {
            Kind::File | Kind::Dir => Ok(()),
            _ => Err(libc::ENOTTY),
        });
        let flags = match self.fs().get_flags(*ino) {
            Ok(f) => f,
            Err(e) => return Ok(Err(self.errno(e)?)),
        };
        // `chattr -m +c`: the heuristic may have marked the file `m`,
        // and `c` with `m` is EINVAL (btrfs's `check_fsflags`).
        let flags = if on {
            (flags | inode_flags::COMPR) & !inode_flags::NOCOMP
        } else {
            flags & !inode_flags::COMPR
        };
        self.result(self.fs().set_flags(*ino, flags), |_| Ret::Unit)
    }
}

/// The external inode number carries the subvolume id above this bit
/// (docs/SNAPSHOTS.md (a), "Inode numbers"); tree 5's numbers have none.
const SUBVOL_SHIFT: u32 = 40;
/// The top-level subvolume's tree id.
const TOP_LEVEL: u64 = 5;

/// The engine and the model, driven together.
pub struct Sim<D: BlockDevice + 'static> {
    model: Executor<Model>,
    engine: Executor<Engine<D>>,
    /// Divergences tolerated so far (see [`known_divergence`]).
    pub tolerated: Vec<String>,
    pub ops_run: u64,
    strict: bool,
}

impl<D: BlockDevice + 'static> Sim<D> {
    /// Opens the (already formatted) device and starts from an empty model.
    pub fn open(dev: Arc<D>, mount: MountOptions, handles: usize) -> Step<Sim<D>> {
        let fs = Filesystem::open(dev.clone(), mount.clone()).map_err(|e| format!("open: {e}"))?;
        let engine = Engine {
            fs: Some(fs),
            dev,
            mount,
            tolerated: Vec::new(),
        };
        Ok(Sim {
            model: Executor::new(Model::new(), handles),
            engine: Executor::new(engine, handles),
            tolerated: Vec::new(),
            ops_run: 0,
            strict: strict(),
        })
    }

    pub fn fs(&self) -> &Filesystem<Arc<D>> {
        self.engine.backend.fs()
    }

    pub fn device(&self) -> &Arc<D> {
        &self.engine.backend.dev
    }

    pub fn model(&self) -> &Model {
        &self.model.backend
    }

    /// The model behind the engine's back (canaries change it to prove the
    /// comparisons notice).
    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model.backend
    }

    /// The model inode open in handle slot `h`.
    pub fn model_handle(&self, h: usize) -> Option<MIno> {
        self.model.handle(h).copied()
    }

    /// The engine's inode at `path`, if the engine resolves it.
    pub fn engine_ino(&self, path: &[Vec<u8>]) -> Step<Option<u64>> {
        Ok(self.engine.backend.walk(path)?.ok())
    }

    /// Generation of the engine's last durable commit.
    pub fn generation(&self) -> u64 {
        self.fs().generation()
    }

    /// Compares the whole canonical view of engine and model.
    pub fn compare_views(&self) -> Step<()> {
        let engine =
            engine_view(self.fs()).map_err(|e| format!("engine view is inconsistent: {e}"))?;
        let model = self.model().view();
        match diff_views(&model, &engine) {
            None => Ok(()),
            Some(d) => Err(format!("engine differs from the model at {d}")),
        }
    }

    /// Closes the filesystem (handles stay open: their inodes become
    /// orphans), checks the image, reopens it and compares the views.
    pub fn remount(&mut self) -> Step<()> {
        self.step(&Op::Remount).map(|_| ())
    }

    /// Closes the filesystem and returns the device.
    pub fn close(mut self) -> Step<Arc<D>> {
        let fs = self.engine.backend.fs.take().expect("filesystem is open");
        fs.close().map_err(|e| format!("close: {e}"))?;
        Ok(self.engine.backend.dev.clone())
    }

    /// Runs one op on both sides and compares the results; returns the
    /// (agreed) outcome.
    pub fn step(&mut self, op: &Op) -> Step<Outcome> {
        self.ops_run += 1;
        let m = self.model.apply(op)?;
        let e = self.engine.apply(op)?;
        self.tolerated.append(&mut self.engine.backend.tolerated);
        if *op == Op::Remount {
            self.compare_views()
                .map_err(|e| format!("after remount: {e}"))?;
        }
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
}
