//! The reference model against this machine's kernel: the same seeded
//! workloads run on the model and, through system calls, on a directory of
//! the host filesystem; every op's result (errno for errno) and the final
//! tree are compared. This is what makes "the model has kernel semantics"
//! a tested claim rather than a belief.
//!
//! The host walk follows symlinks and the model's does not, and the kernel
//! refuses some things before a filesystem sees them (user xattrs on
//! symlinks, writes through a read-only descriptor), so ops whose path
//! crosses a symlink, or that would open a symlink or fifo, are skipped on
//! both sides. Needs root (ownership and xattrs); skipped otherwise.

use birch_sim::exec::{show_outcome, Backend, Executor, Outcome, Ret, Step};
use birch_sim::model::{
    diff_views, page_digest, show_path, AttrView, Entry, Kind, Model, Path, RenameFlags, View,
    XattrMode,
};
use birch_sim::workload::{seed_override, Generator, Op, Target, WorkloadConfig};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn check(r: i64) -> Result<i64, i32> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

struct Host {
    root: PathBuf,
}

/// A resolved target on the host: a path (each op opens it the way its
/// system call needs), or an open descriptor from a handle slot.
#[derive(Clone, Debug)]
enum HostRef {
    Path(Path),
    Fd(i32),
}

impl Host {
    fn c(&self, p: &[Vec<u8>]) -> CString {
        let mut bytes = self.root.as_os_str().as_bytes().to_vec();
        for c in p {
            bytes.push(b'/');
            bytes.extend_from_slice(c);
        }
        CString::new(bytes).unwrap()
    }

    fn lstat(&self, p: &[Vec<u8>]) -> Result<AttrView, i32> {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        check(unsafe { libc::lstat(self.c(p).as_ptr(), &mut st) }.into())?;
        Ok(attr(&st))
    }

    fn open(&self, p: &[Vec<u8>], flags: i32) -> Result<i32, i32> {
        check(
            unsafe {
                libc::open(
                    self.c(p).as_ptr(),
                    flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    0,
                )
            }
            .into(),
        )
        .map(|fd| fd as i32)
    }

    /// An fd for `target` and whether it must be closed afterwards.
    fn fd(&self, target: &HostRef, flags: i32) -> Result<(i32, bool), i32> {
        match target {
            HostRef::Fd(fd) => Ok((*fd, false)),
            HostRef::Path(p) => self.open(p, flags).map(|fd| (fd, true)),
        }
    }
}

fn kind_of(mode: u32) -> Kind {
    match mode & libc::S_IFMT {
        libc::S_IFREG => Kind::File,
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
        libc::S_IFIFO => Kind::Fifo,
        libc::S_IFSOCK => Kind::Socket,
        libc::S_IFCHR => Kind::CharDev,
        _ => Kind::BlockDev,
    }
}

fn attr(st: &libc::stat) -> AttrView {
    let kind = kind_of(st.st_mode);
    AttrView {
        kind,
        perm: (st.st_mode & 0o7777) as u16,
        uid: st.st_uid,
        gid: st.st_gid,
        nlink: st.st_nlink as u32,
        size: (kind != Kind::Dir).then_some(st.st_size as u64),
    }
}

fn unit(r: Result<i64, i32>) -> Outcome {
    r.map(|_| Ret::Unit)
}

/// Whether the host would treat `op` differently for reasons outside a
/// filesystem's semantics (see the module doc).
fn skip(model: &Executor<Model>, op: &Op) -> bool {
    let handle = |h: usize| model.handle(h).copied();
    let model = &model.backend;
    let crosses_symlink = |p: &[Vec<u8>]| {
        (1..p.len()).any(|n| {
            model
                .resolve(&p[..n])
                .is_ok_and(|i| model.inode(i).unwrap().kind == Kind::Symlink)
        })
    };
    let kind_at = |p: &[Vec<u8>]| model.resolve(p).ok().map(|i| model.inode(i).unwrap().kind);
    let target_kind = |t: &Target| match t {
        Target::Path(p) => kind_at(p),
        Target::Handle(h) => handle(*h).map(|i| model.inode(i).unwrap().kind),
    };
    let paths: Vec<&[Vec<u8>]> = match op {
        Op::Create { path, .. }
        | Op::Mkdir { path, .. }
        | Op::Mkfifo { path }
        | Op::Symlink { path, .. }
        | Op::Unlink { path }
        | Op::Rmdir { path }
        | Op::Readdir { path }
        | Op::Readlink { path }
        | Op::Open { path, .. }
        | Op::CreateSubvolume { path }
        | Op::DeleteSubvolume { path } => vec![path],
        Op::Link { from, to } | Op::Rename { from, to, .. } => vec![from, to],
        Op::Snapshot { source, dest, .. } => vec![source, dest],
        // Compression workloads only (`compression_weight` is 0 here).
        Op::PunchHole { .. }
        | Op::ZeroRange { .. }
        | Op::CopyRange { .. }
        | Op::SetCompressFlag { .. } => return true,
        Op::Write { target, .. }
        | Op::WriteText { target, .. }
        | Op::Truncate { target, .. }
        | Op::Read { target, .. }
        | Op::Chmod { target, .. }
        | Op::Chown { target, .. }
        | Op::SetXattr { target, .. }
        | Op::RemoveXattr { target, .. }
        | Op::GetXattr { target, .. }
        | Op::ListXattr { target }
        | Op::Stat { target }
        | Op::Fsync { target, .. }
        | Op::FsyncDir { target } => match target {
            Target::Path(p) => vec![p],
            Target::Handle(h) if handle(*h).is_none() => return true,
            Target::Handle(_) => vec![],
        },
        Op::Close { .. } | Op::Sync | Op::Remount | Op::Cleaner => vec![],
    };
    if paths.iter().any(|p| crosses_symlink(p)) {
        return true;
    }
    let special = |k: Option<Kind>| matches!(k, Some(Kind::Symlink | Kind::Fifo));
    match op {
        // These open or follow their final component.
        Op::Readdir { path } | Op::Open { path, .. } => special(kind_at(path)),
        Op::Write { target, .. }
        | Op::WriteText { target, .. }
        | Op::Truncate { target, .. }
        | Op::Read { target, .. }
        | Op::Chmod { target, .. }
        | Op::Fsync { target, .. }
        | Op::FsyncDir { target } => {
            let k = target_kind(target);
            // Through a handle the fd's access mode decides first.
            special(k)
                || (matches!(target, Target::Handle(_))
                    && k == Some(Kind::Dir)
                    && matches!(
                        op,
                        Op::Write { .. } | Op::WriteText { .. } | Op::Truncate { .. }
                    ))
        }
        // The VFS allows user xattrs on regular files and directories only.
        Op::SetXattr { target, .. }
        | Op::RemoveXattr { target, .. }
        | Op::GetXattr { target, .. }
        | Op::ListXattr { target } => special(target_kind(target)),
        _ => false,
    }
}

fn fstat(fd: i32) -> Outcome {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstat(fd, &mut st) }.into())?;
    Ok(Ret::Attr(attr(&st)))
}

/// Runs `call` on the descriptor of `target`, closing it afterwards when
/// it was opened for the call.
fn with_fd(
    host: &Host,
    target: &HostRef,
    flags: i32,
    call: impl FnOnce(i32) -> Outcome,
) -> Outcome {
    let (fd, close) = host.fd(target, flags)?;
    let r = call(fd);
    if close {
        unsafe { libc::close(fd) };
    }
    r
}

/// Calls the path form of a system call (`l*`, not following a final
/// symlink) or its descriptor form (`f*`).
fn by_path_or_fd(
    host: &Host,
    target: &HostRef,
    by_path: impl FnOnce(*const libc::c_char) -> i64,
    by_fd: impl FnOnce(i32) -> i64,
) -> Result<i64, i32> {
    match target {
        HostRef::Path(p) => check(by_path(host.c(p).as_ptr())),
        HostRef::Fd(fd) => check(by_fd(*fd)),
    }
}

/// The host kernel as a backend of the shared executor: each op is the
/// system call a program would make.
impl Backend for Host {
    type Ino = HostRef;

    /// The kernel resolves the path in the op's own system call (and
    /// reports its errno there).
    fn resolve(&mut self, path: &Path) -> Step<Result<HostRef, i32>> {
        Ok(Ok(HostRef::Path(path.clone())))
    }
    fn create(&mut self, path: &Path, perm: u32) -> Step<Outcome> {
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC;
        Ok((|| {
            let fd = check(unsafe { libc::open(self.c(path).as_ptr(), flags, perm) }.into())?;
            unsafe { libc::close(fd as i32) };
            self.lstat(path).map(Ret::Attr)
        })())
    }
    fn mkdir(&mut self, path: &Path, perm: u32) -> Step<Outcome> {
        Ok(
            check(unsafe { libc::mkdir(self.c(path).as_ptr(), perm) }.into())
                .and_then(|_| self.lstat(path).map(Ret::Attr)),
        )
    }
    fn mkfifo(&mut self, path: &Path) -> Step<Outcome> {
        Ok(
            check(unsafe { libc::mkfifo(self.c(path).as_ptr(), 0o644) }.into())
                .and_then(|_| self.lstat(path).map(Ret::Attr)),
        )
    }
    fn symlink(&mut self, path: &Path, target: &[u8]) -> Step<Outcome> {
        let t = CString::new(target).unwrap();
        Ok(
            check(unsafe { libc::symlink(t.as_ptr(), self.c(path).as_ptr()) }.into())
                .and_then(|_| self.lstat(path).map(Ret::Attr)),
        )
    }
    fn link(&mut self, from: &Path, to: &Path) -> Step<Outcome> {
        Ok(
            check(unsafe { libc::link(self.c(from).as_ptr(), self.c(to).as_ptr()) }.into())
                .and_then(|_| self.lstat(to).map(Ret::Attr)),
        )
    }
    fn unlink(&mut self, path: &Path) -> Step<Outcome> {
        Ok(unit(check(
            unsafe { libc::unlink(self.c(path).as_ptr()) }.into(),
        )))
    }
    fn rmdir(&mut self, path: &Path) -> Step<Outcome> {
        Ok(unit(check(
            unsafe { libc::rmdir(self.c(path).as_ptr()) }.into(),
        )))
    }
    fn rename(&mut self, from: &Path, to: &Path, flags: RenameFlags) -> Step<Outcome> {
        let f = (if flags.no_replace {
            libc::RENAME_NOREPLACE
        } else {
            0
        }) | (if flags.exchange {
            libc::RENAME_EXCHANGE
        } else {
            0
        }) | (if flags.whiteout {
            libc::RENAME_WHITEOUT
        } else {
            0
        });
        Ok(unit(check(
            unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    self.c(from).as_ptr(),
                    libc::AT_FDCWD,
                    self.c(to).as_ptr(),
                    f,
                )
            }
            .into(),
        )))
    }
    fn write(&mut self, ino: &HostRef, offset: u64, data: &[u8]) -> Step<Outcome> {
        Ok(with_fd(self, ino, libc::O_WRONLY, |fd| {
            check(
                unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), offset as i64) } as i64,
            )
            .map(|n| Ret::Len(n as usize))
        }))
    }
    fn truncate(&mut self, ino: &HostRef, size: u64) -> Step<Outcome> {
        Ok(unit(by_path_or_fd(
            self,
            ino,
            |p| unsafe { libc::truncate(p, size as i64) }.into(),
            |fd| unsafe { libc::ftruncate(fd, size as i64) }.into(),
        )))
    }
    fn read(&mut self, ino: &HostRef, offset: u64, len: usize) -> Step<Outcome> {
        Ok(with_fd(self, ino, libc::O_RDONLY, |fd| {
            let mut buf = vec![0u8; len];
            let mut got = 0;
            while got < buf.len() {
                let n = check(unsafe {
                    libc::pread(
                        fd,
                        buf[got..].as_mut_ptr().cast(),
                        buf.len() - got,
                        (offset + got as u64) as i64,
                    )
                } as i64)?;
                if n == 0 {
                    break;
                }
                got += n as usize;
            }
            buf.truncate(got);
            Ok(Ret::Data(buf))
        }))
    }
    fn chmod(&mut self, ino: &HostRef, perm: u32) -> Step<Outcome> {
        Ok(match ino {
            HostRef::Path(p) => check(unsafe { libc::chmod(self.c(p).as_ptr(), perm) }.into())
                .and_then(|_| self.lstat(p).map(Ret::Attr)),
            HostRef::Fd(fd) => {
                check(unsafe { libc::fchmod(*fd, perm) }.into()).and_then(|_| fstat(*fd))
            }
        })
    }
    fn chown(&mut self, ino: &HostRef, uid: Option<u32>, gid: Option<u32>) -> Step<Outcome> {
        let (uid, gid) = (uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX));
        Ok(match ino {
            HostRef::Path(p) => check(unsafe { libc::lchown(self.c(p).as_ptr(), uid, gid) }.into())
                .and_then(|_| self.lstat(p).map(Ret::Attr)),
            HostRef::Fd(fd) => {
                check(unsafe { libc::fchown(*fd, uid, gid) }.into()).and_then(|_| fstat(*fd))
            }
        })
    }
    fn setxattr(
        &mut self,
        ino: &HostRef,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Step<Outcome> {
        let n = CString::new(name).unwrap();
        let flags = match mode {
            XattrMode::Any => 0,
            XattrMode::Create => libc::XATTR_CREATE,
            XattrMode::Replace => libc::XATTR_REPLACE,
        };
        Ok(unit(by_path_or_fd(
            self,
            ino,
            |p| unsafe { libc::lsetxattr(p, n.as_ptr(), value.as_ptr().cast(), value.len(), flags) }
                as i64,
            |fd| unsafe {
                libc::fsetxattr(fd, n.as_ptr(), value.as_ptr().cast(), value.len(), flags)
            } as i64,
        )))
    }
    fn removexattr(&mut self, ino: &HostRef, name: &[u8]) -> Step<Outcome> {
        let n = CString::new(name).unwrap();
        Ok(unit(by_path_or_fd(
            self,
            ino,
            |p| unsafe { libc::lremovexattr(p, n.as_ptr()) } as i64,
            |fd| unsafe { libc::fremovexattr(fd, n.as_ptr()) } as i64,
        )))
    }
    fn getxattr(&mut self, ino: &HostRef, name: &[u8]) -> Step<Outcome> {
        let n = CString::new(name).unwrap();
        let mut buf = vec![0u8; 65536];
        let ptr: *mut libc::c_void = buf.as_mut_ptr().cast();
        Ok(by_path_or_fd(
            self,
            ino,
            |p| unsafe { libc::lgetxattr(p, n.as_ptr(), ptr, 65536) } as i64,
            |fd| unsafe { libc::fgetxattr(fd, n.as_ptr(), ptr, 65536) } as i64,
        )
        .map(|len| {
            buf.truncate(len as usize);
            Ret::Data(buf)
        }))
    }
    fn listxattr(&mut self, ino: &HostRef) -> Step<Outcome> {
        let mut buf = vec![0u8; 65536];
        let ptr: *mut libc::c_char = buf.as_mut_ptr().cast();
        Ok(by_path_or_fd(
            self,
            ino,
            |p| unsafe { libc::llistxattr(p, ptr, 65536) } as i64,
            |fd| unsafe { libc::flistxattr(fd, ptr, 65536) } as i64,
        )
        .map(|len| Ret::Names(user_xattrs(&buf[..len as usize]))))
    }
    fn stat(&mut self, ino: &HostRef) -> Step<Outcome> {
        Ok(match ino {
            HostRef::Path(p) => self.lstat(p).map(Ret::Attr),
            HostRef::Fd(fd) => fstat(*fd),
        })
    }
    fn readdir(&mut self, ino: &HostRef) -> Step<Outcome> {
        let HostRef::Path(path) = ino else {
            unreachable!("readdir names a path")
        };
        let c = self.c(path);
        let dir = std::path::Path::new(std::ffi::OsStr::from_bytes(c.as_bytes()));
        Ok((|| {
            let entries = std::fs::read_dir(dir).map_err(|e| e.raw_os_error().unwrap_or(0))?;
            let mut out = BTreeMap::new();
            for e in entries {
                let e = e.map_err(|e| e.raw_os_error().unwrap_or(0))?;
                let t = e.file_type().unwrap();
                let kind = if t.is_dir() {
                    Kind::Dir
                } else if t.is_symlink() {
                    Kind::Symlink
                } else if t.is_file() {
                    Kind::File
                } else {
                    Kind::Fifo
                };
                out.insert(e.file_name().as_bytes().to_vec(), kind);
            }
            Ok(Ret::Dir(out))
        })())
    }
    fn readlink(&mut self, ino: &HostRef) -> Step<Outcome> {
        let HostRef::Path(path) = ino else {
            unreachable!("readlink names a path")
        };
        let mut buf = vec![0u8; 8192];
        Ok(check(unsafe {
            libc::readlink(self.c(path).as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        } as i64)
        .map(|n| {
            buf.truncate(n as usize);
            Ret::Data(buf)
        }))
    }
    /// Directories open read-only (the kernel refuses to open them for
    /// writing), everything else read-write.
    fn open(&mut self, ino: &HostRef) -> Step<Result<HostRef, i32>> {
        let HostRef::Path(path) = ino else {
            unreachable!("open names a path")
        };
        let flags = match self.lstat(path) {
            Ok(a) if a.kind == Kind::Dir => libc::O_RDONLY | libc::O_DIRECTORY,
            Ok(_) => libc::O_RDWR,
            Err(e) => return Ok(Err(e)),
        };
        Ok(Host::open(self, path, flags).map(HostRef::Fd))
    }
    fn release(&mut self, handle: &HostRef) -> Step<()> {
        if let HostRef::Fd(fd) = handle {
            unsafe { libc::close(*fd) };
        }
        Ok(())
    }
    fn fsync(&mut self, ino: &HostRef, _: bool) -> Step<Outcome> {
        Ok(with_fd(self, ino, libc::O_RDONLY, |fd| {
            unit(check(unsafe { libc::fsync(fd) }.into()))
        }))
    }
    /// The host's durability is not what this test compares: sync only has
    /// to succeed, as it does on the model.
    fn sync(&mut self) -> Step<Outcome> {
        Ok(Ok(Ret::Unit))
    }
    fn remount(&mut self) -> Step<()> {
        Err("the host directory is never remounted (remount weight 0)".into())
    }
}

fn user_xattrs(list: &[u8]) -> Vec<Vec<u8>> {
    let mut names: Vec<Vec<u8>> = list
        .split(|&b| b == 0)
        .filter(|n| n.starts_with(b"user."))
        .map(|n| n.to_vec())
        .collect();
    names.sort();
    names
}

/// The host tree as a canonical view.
fn host_view(host: &Host) -> View {
    let mut raw = BTreeMap::new();
    let mut stack = vec![Vec::new()];
    while let Some(path) = stack.pop() {
        let c = host.c(&path);
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::lstat(c.as_ptr(), &mut st) }, 0);
        let a = attr(&st);
        let mut e = Entry {
            kind: a.kind,
            perm: a.perm,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            size: a.size,
            content: Vec::new(),
            target: Vec::new(),
            xattrs: BTreeMap::new(),
            link_group: Vec::new(),
        };
        let fs_path = std::path::Path::new(std::ffi::OsStr::from_bytes(c.as_bytes()));
        match a.kind {
            Kind::File => {
                e.content = std::fs::read(fs_path)
                    .unwrap()
                    .chunks(4096)
                    .map(page_digest)
                    .collect()
            }
            Kind::Symlink => {
                e.target = std::fs::read_link(fs_path)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec()
            }
            Kind::Dir => {
                for entry in std::fs::read_dir(fs_path).unwrap() {
                    let mut p = path.clone();
                    p.push(entry.unwrap().file_name().as_bytes().to_vec());
                    stack.push(p);
                }
            }
            _ => {}
        }
        if matches!(a.kind, Kind::File | Kind::Dir) {
            let mut buf = vec![0u8; 65536];
            let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            for name in user_xattrs(&buf[..n.max(0) as usize]) {
                let cn = CString::new(name.clone()).unwrap();
                let mut v = vec![0u8; 65536];
                let len = unsafe {
                    libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len())
                };
                v.truncate(len as usize);
                e.xattrs.insert(name, v);
            }
        }
        raw.insert(path, (st.st_ino, e));
    }
    // The test's root directory itself is not part of the comparison.
    let root = raw.get_mut(&Vec::new()).unwrap();
    root.1.perm = 0o755;
    root.1.uid = 0;
    root.1.gid = 0;
    View::from_raw(raw)
}

fn run_seed(seed: u64, ops: usize, base: &std::path::Path) -> Result<usize, String> {
    let root = base.join(format!("seed-{seed}"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut host = Executor::new(Host { root: root.clone() }, 3);
    let mut model = Executor::new(Model::new(), 3);
    let cfg = WorkloadConfig {
        max_live_bytes: 4 << 20,
        max_write: 64 << 10,
        special_perms: false,
        huge_truncates: false,
        remount_weight: 0,
        ..WorkloadConfig::default()
    };
    let mut gen = Generator::new(seed, cfg);
    let mut log = Vec::new();
    let mut compared = 0;
    for i in 0..ops {
        let op = gen.next_op(&model.backend);
        log.push(format!("#{i}: {op}"));
        // Large xattr values exceed ext4's per-inode xattr space.
        if skip(&model, &op) || matches!(&op, Op::SetXattr { value_len, .. } if *value_len > 300) {
            continue;
        }
        let fail = |msg: String| {
            format!("seed={seed} op #{i} `{op}`: {msg}\n{}\nreplay: BIRCH_SEED={seed} cargo test -p birch-sim --test model_vs_kernel", log[log.len().saturating_sub(30)..].join("\n"))
        };
        let m = model.apply(&op).map_err(&fail)?;
        let k = host.apply(&op).map_err(&fail)?;
        if m != k {
            return Err(fail(format!(
                "model returned {}, kernel returned {}",
                show_outcome(&m),
                show_outcome(&k)
            )));
        }
        compared += 1;
    }
    if let Some(d) = diff_views(&model.backend.view(), &host_view(&host.backend)) {
        return Err(format!("seed={seed}: final trees differ at {d}"));
    }
    for slot in 0..3 {
        if let Some(fd) = host.handle(slot).cloned() {
            host.backend.release(&fd)?;
        }
    }
    std::fs::remove_dir_all(&root).unwrap();
    Ok(compared)
}

#[test]
fn model_agrees_with_the_host_kernel() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (chown, user xattrs everywhere)");
        return;
    }
    unsafe { libc::umask(0) };
    let base = std::env::temp_dir().join(format!("birch-sim-kernel-{}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    // Does this filesystem take user xattrs at all?
    let probe = CString::new(base.as_os_str().as_bytes()).unwrap();
    if unsafe {
        libc::lsetxattr(
            probe.as_ptr(),
            c"user.probe".as_ptr(),
            [1u8].as_ptr().cast(),
            1,
            0,
        )
    } != 0
    {
        eprintln!("skipped: {} takes no user xattrs", base.display());
        std::fs::remove_dir_all(&base).unwrap();
        return;
    }
    let seeds: Vec<u64> = seed_override()
        .map(|s| vec![s])
        .unwrap_or_else(|| (0..200).collect());
    let mut compared = 0;
    for seed in seeds {
        compared += run_seed(seed, 400, &base).unwrap_or_else(|e| panic!("{e}"));
    }
    std::fs::remove_dir_all(&base).unwrap();
    eprintln!(
        "{compared} ops compared with the kernel ({})",
        show_path(&[])
    );
}
