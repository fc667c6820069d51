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

use birch_sim::harness::{errno_name, Outcome, Ret};
use birch_sim::model::{
    diff_views, page_digest, show_path, AttrView, Entry, Kind, MIno, Model, View, XattrMode,
};
use birch_sim::workload::{pattern, seed_override, Generator, Op, Target, WorkloadConfig};
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
    handles: Vec<Option<(i32, MIno)>>,
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
    fn fd(&self, target: &Target, flags: i32) -> Result<(i32, bool), i32> {
        match target {
            Target::Handle(h) => Ok((self.handles[*h].expect("skipped when empty").0, false)),
            Target::Path(p) => self.open(p, flags).map(|fd| (fd, true)),
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
fn skip(model: &Model, host: &Host, op: &Op) -> bool {
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
        Target::Handle(h) => host.handles[*h].map(|(_, i)| model.inode(i).unwrap().kind),
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
        | Op::Open { path, .. } => vec![path],
        Op::Link { from, to } | Op::Rename { from, to, .. } => vec![from, to],
        Op::Write { target, .. }
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
            Target::Handle(h) if host.handles[*h].is_none() => return true,
            Target::Handle(_) => vec![],
        },
        Op::Close { .. } | Op::Sync | Op::Remount => vec![],
    };
    if paths.iter().any(|p| crosses_symlink(p)) {
        return true;
    }
    let special = |k: Option<Kind>| matches!(k, Some(Kind::Symlink | Kind::Fifo));
    match op {
        // These open or follow their final component.
        Op::Readdir { path } | Op::Open { path, .. } => special(kind_at(path)),
        Op::Write { target, .. }
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
                    && matches!(op, Op::Write { .. } | Op::Truncate { .. }))
        }
        // The VFS allows user xattrs on regular files and directories only.
        Op::SetXattr { target, .. }
        | Op::RemoveXattr { target, .. }
        | Op::GetXattr { target, .. }
        | Op::ListXattr { target } => special(target_kind(target)),
        _ => false,
    }
}

fn run_model(model: &mut Model, host: &Host, op: &Op) -> Outcome {
    let target = |t: &Target| -> Result<MIno, i32> {
        match t {
            Target::Path(p) => model.resolve(p),
            Target::Handle(h) => Ok(host.handles[*h].expect("skipped when empty").1),
        }
    };
    match op {
        Op::Create { path, perm } => model
            .create(path, *perm, 0, 0)
            .map(|i| Ret::Attr(model.getattr(i))),
        Op::Mkdir { path, perm } => model
            .mkdir(path, *perm, 0, 0)
            .map(|i| Ret::Attr(model.getattr(i))),
        Op::Mkfifo { path } => model
            .mknod(path, Kind::Fifo, 0o644, 0, 0)
            .map(|i| Ret::Attr(model.getattr(i))),
        Op::Symlink { path, target } => model
            .symlink(path, target, 0, 0)
            .map(|i| Ret::Attr(model.getattr(i))),
        Op::Link { from, to } => model.link(from, to).map(|i| Ret::Attr(model.getattr(i))),
        Op::Unlink { path } => model.unlink(path).map(|_| Ret::Unit),
        Op::Rmdir { path } => model.rmdir(path).map(|_| Ret::Unit),
        Op::Rename { from, to, flags } => model.rename(from, to, *flags).map(|_| Ret::Unit),
        Op::Write {
            target: t,
            offset,
            len,
            fill,
        } => target(t)
            .and_then(|i| model.write(i, *offset, &pattern(*fill, *len as usize)))
            .map(Ret::Len),
        Op::Truncate { target: t, size } => target(t)
            .and_then(|i| model.truncate(i, *size))
            .map(|_| Ret::Unit),
        Op::Read {
            target: t,
            offset,
            len,
        } => target(t)
            .and_then(|i| model.read(i, *offset, *len as usize))
            .map(Ret::Data),
        Op::Chmod { target: t, perm } => target(t).map(|i| {
            model.chmod(i, *perm);
            Ret::Attr(model.getattr(i))
        }),
        Op::Chown {
            target: t,
            uid,
            gid,
        } => target(t).map(|i| {
            model.chown(i, *uid, *gid);
            Ret::Attr(model.getattr(i))
        }),
        Op::SetXattr {
            target: t,
            name,
            value_len,
            fill,
            mode,
        } => target(t)
            .and_then(|i| model.setxattr(i, name, &pattern(*fill, *value_len), *mode))
            .map(|_| Ret::Unit),
        Op::RemoveXattr { target: t, name } => target(t)
            .and_then(|i| model.removexattr(i, name))
            .map(|_| Ret::Unit),
        Op::GetXattr { target: t, name } => target(t)
            .and_then(|i| model.getxattr(i, name))
            .map(Ret::Data),
        Op::ListXattr { target: t } => target(t).map(|i| Ret::Names(model.listxattr(i))),
        Op::Stat { target: t } => target(t).map(|i| Ret::Attr(model.getattr(i))),
        Op::Readdir { path } => model
            .resolve(path)
            .and_then(|i| model.readdir(i))
            .map(Ret::Dir),
        Op::Readlink { path } => model
            .resolve(path)
            .and_then(|i| model.readlink(i))
            .map(Ret::Data),
        Op::Open { path, .. } => model.resolve(path).map(|_| Ret::Unit),
        Op::Fsync { target: t, .. } | Op::FsyncDir { target: t } => target(t).map(|_| Ret::Unit),
        Op::Close { .. } | Op::Sync | Op::Remount => Ok(Ret::Unit),
    }
}

fn run_host(host: &Host, op: &Op) -> Outcome {
    let cpath = |p: &[Vec<u8>]| host.c(p);
    match op {
        Op::Create { path, perm } => {
            let fd = check(
                unsafe {
                    libc::open(
                        cpath(path).as_ptr(),
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                        *perm,
                    )
                }
                .into(),
            )?;
            unsafe { libc::close(fd as i32) };
            host.lstat(path).map(Ret::Attr)
        }
        Op::Mkdir { path, perm } => {
            check(unsafe { libc::mkdir(cpath(path).as_ptr(), *perm) }.into())?;
            host.lstat(path).map(Ret::Attr)
        }
        Op::Mkfifo { path } => {
            check(unsafe { libc::mkfifo(cpath(path).as_ptr(), 0o644) }.into())?;
            host.lstat(path).map(Ret::Attr)
        }
        Op::Symlink { path, target } => {
            let t = CString::new(target.clone()).unwrap();
            check(unsafe { libc::symlink(t.as_ptr(), cpath(path).as_ptr()) }.into())?;
            host.lstat(path).map(Ret::Attr)
        }
        Op::Link { from, to } => {
            check(unsafe { libc::link(cpath(from).as_ptr(), cpath(to).as_ptr()) }.into())?;
            host.lstat(to).map(Ret::Attr)
        }
        Op::Unlink { path } => unit(check(unsafe { libc::unlink(cpath(path).as_ptr()) }.into())),
        Op::Rmdir { path } => unit(check(unsafe { libc::rmdir(cpath(path).as_ptr()) }.into())),
        Op::Rename { from, to, flags } => {
            let f = (if flags.no_replace {
                libc::RENAME_NOREPLACE
            } else {
                0
            }) | (if flags.exchange {
                libc::RENAME_EXCHANGE
            } else {
                0
            });
            unit(check(
                unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        cpath(from).as_ptr(),
                        libc::AT_FDCWD,
                        cpath(to).as_ptr(),
                        f,
                    )
                }
                .into(),
            ))
        }
        Op::Write {
            target,
            offset,
            len,
            fill,
        } => {
            let (fd, close) = host.fd(target, libc::O_WRONLY)?;
            let data = pattern(*fill, *len as usize);
            let r =
                check(
                    unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), *offset as i64) }
                        as i64,
                );
            if close {
                unsafe { libc::close(fd) };
            }
            r.map(|n| Ret::Len(n as usize))
        }
        Op::Truncate { target, size } => match target {
            Target::Path(p) => unit(check(
                unsafe { libc::truncate(cpath(p).as_ptr(), *size as i64) }.into(),
            )),
            Target::Handle(_) => {
                let (fd, _) = host.fd(target, 0)?;
                unit(check(unsafe { libc::ftruncate(fd, *size as i64) }.into()))
            }
        },
        Op::Read {
            target,
            offset,
            len,
        } => {
            let (fd, close) = host.fd(target, libc::O_RDONLY)?;
            let mut buf = vec![0u8; *len as usize];
            let mut got = 0;
            let r = loop {
                if got == buf.len() {
                    break Ok(());
                }
                match check(unsafe {
                    libc::pread(
                        fd,
                        buf[got..].as_mut_ptr().cast(),
                        buf.len() - got,
                        (*offset + got as u64) as i64,
                    )
                } as i64)
                {
                    Ok(0) => break Ok(()),
                    Ok(n) => got += n as usize,
                    Err(e) => break Err(e),
                }
            };
            if close {
                unsafe { libc::close(fd) };
            }
            buf.truncate(got);
            r.map(|_| Ret::Data(buf))
        }
        Op::Chmod {
            target: Target::Path(p),
            perm,
        } => {
            check(unsafe { libc::chmod(cpath(p).as_ptr(), *perm) }.into())?;
            host.lstat(p).map(Ret::Attr)
        }
        Op::Chown {
            target: Target::Path(p),
            uid,
            gid,
        } => {
            check(
                unsafe {
                    libc::lchown(
                        cpath(p).as_ptr(),
                        uid.unwrap_or(u32::MAX),
                        gid.unwrap_or(u32::MAX),
                    )
                }
                .into(),
            )?;
            host.lstat(p).map(Ret::Attr)
        }
        Op::Chmod { target, perm } => {
            let (fd, _) = host.fd(target, 0)?;
            check(unsafe { libc::fchmod(fd, *perm) }.into())?;
            fstat(fd)
        }
        Op::Chown { target, uid, gid } => {
            let (fd, _) = host.fd(target, 0)?;
            check(
                unsafe { libc::fchown(fd, uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX)) }
                    .into(),
            )?;
            fstat(fd)
        }
        Op::SetXattr {
            target,
            name,
            value_len,
            fill,
            mode,
        } => {
            let value = pattern(*fill, *value_len);
            let n = CString::new(name.clone()).unwrap();
            let flags = match mode {
                XattrMode::Any => 0,
                XattrMode::Create => libc::XATTR_CREATE,
                XattrMode::Replace => libc::XATTR_REPLACE,
            };
            unit(with_target(
                host,
                target,
                |p| unsafe {
                    libc::lsetxattr(p, n.as_ptr(), value.as_ptr().cast(), value.len(), flags)
                } as i64,
                |fd| unsafe {
                    libc::fsetxattr(fd, n.as_ptr(), value.as_ptr().cast(), value.len(), flags)
                } as i64,
            ))
        }
        Op::RemoveXattr { target, name } => {
            let n = CString::new(name.clone()).unwrap();
            unit(with_target(
                host,
                target,
                |p| unsafe { libc::lremovexattr(p, n.as_ptr()) } as i64,
                |fd| unsafe { libc::fremovexattr(fd, n.as_ptr()) } as i64,
            ))
        }
        Op::GetXattr { target, name } => {
            let n = CString::new(name.clone()).unwrap();
            let mut buf = vec![0u8; 65536];
            let ptr: *mut libc::c_void = buf.as_mut_ptr().cast();
            let len = with_target(
                host,
                target,
                |p| unsafe { libc::lgetxattr(p, n.as_ptr(), ptr, 65536) } as i64,
                |fd| unsafe { libc::fgetxattr(fd, n.as_ptr(), ptr, 65536) } as i64,
            )?;
            buf.truncate(len as usize);
            Ok(Ret::Data(buf))
        }
        Op::ListXattr { target } => {
            let mut buf = vec![0u8; 65536];
            let ptr: *mut libc::c_char = buf.as_mut_ptr().cast();
            let len = with_target(
                host,
                target,
                |p| unsafe { libc::llistxattr(p, ptr, 65536) } as i64,
                |fd| unsafe { libc::flistxattr(fd, ptr, 65536) } as i64,
            )?;
            Ok(Ret::Names(user_xattrs(&buf[..len as usize])))
        }
        Op::Stat {
            target: Target::Path(p),
        } => host.lstat(p).map(Ret::Attr),
        Op::Stat { target } => fstat(host.fd(target, 0)?.0),
        Op::Readdir { path } => {
            let c = cpath(path);
            let dir = std::path::Path::new(std::ffi::OsStr::from_bytes(c.as_bytes()));
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
        }
        Op::Readlink { path } => {
            let mut buf = vec![0u8; 8192];
            let n = check(unsafe {
                libc::readlink(cpath(path).as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            } as i64)?;
            buf.truncate(n as usize);
            Ok(Ret::Data(buf))
        }
        Op::Fsync { target, .. } | Op::FsyncDir { target } => {
            let (fd, close) = host.fd(target, libc::O_RDONLY)?;
            let r = check(unsafe { libc::fsync(fd) }.into());
            if close {
                unsafe { libc::close(fd) };
            }
            unit(r)
        }
        Op::Open { .. } | Op::Close { .. } | Op::Sync | Op::Remount => {
            unreachable!("handled by the caller")
        }
    }
}

fn fstat(fd: i32) -> Outcome {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstat(fd, &mut st) }.into())?;
    Ok(Ret::Attr(attr(&st)))
}

fn with_target(
    host: &Host,
    target: &Target,
    by_path: impl FnOnce(*const libc::c_char) -> i64,
    by_fd: impl FnOnce(i32) -> i64,
) -> Result<i64, i32> {
    match target {
        Target::Path(p) => check(by_path(host.c(p).as_ptr())),
        Target::Handle(h) => check(by_fd(host.handles[*h].expect("skipped when empty").0)),
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

fn show(o: &Outcome) -> String {
    match o {
        Ok(Ret::Data(d)) => format!("Ok({} bytes)", d.len()),
        Ok(r) => format!("Ok({r:?})"),
        Err(e) => format!("Err({})", errno_name(*e)),
    }
}

fn run_seed(seed: u64, ops: usize, base: &std::path::Path) -> Result<usize, String> {
    let root = base.join(format!("seed-{seed}"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut host = Host {
        root: root.clone(),
        handles: vec![None; 3],
    };
    let mut model = Model::new();
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
        let op = gen.next_op(&model);
        log.push(format!("#{i}: {op}"));
        // Large xattr values exceed ext4's per-inode xattr space.
        if skip(&model, &host, &op)
            || matches!(&op, Op::SetXattr { value_len, .. } if *value_len > 300)
        {
            continue;
        }
        let fail = |msg: String| {
            format!("seed={seed} op #{i} `{op}`: {msg}\n{}\nreplay: BIRCH_SEED={seed} cargo test -p birch-sim --test model_vs_kernel", log[log.len().saturating_sub(30)..].join("\n"))
        };
        match &op {
            Op::Open { path, slot } => {
                let m = model.resolve(path);
                let kind = m.ok().map(|i| model.inode(i).unwrap().kind);
                let flags = if kind == Some(Kind::Dir) {
                    libc::O_RDONLY | libc::O_DIRECTORY
                } else {
                    libc::O_RDWR
                };
                let h = host.open(path, flags);
                match (m, h) {
                    (Ok(mi), Ok(fd)) => {
                        if let Some((old_fd, old)) = host.handles[*slot].take() {
                            unsafe { libc::close(old_fd) };
                            model.release(old);
                        }
                        model.open(mi);
                        host.handles[*slot] = Some((fd, mi));
                    }
                    (Err(a), Err(b)) if a == b => {}
                    (m, h) => return Err(fail(format!("open: model {m:?}, kernel {h:?}"))),
                }
            }
            Op::Close { slot } => {
                if let Some((fd, mi)) = host.handles[*slot].take() {
                    unsafe { libc::close(fd) };
                    model.release(mi);
                }
            }
            Op::Sync | Op::Remount => {}
            _ => {
                let m = run_model(&mut model, &host, &op);
                let k = run_host(&host, &op);
                if m != k {
                    return Err(fail(format!(
                        "model returned {}, kernel returned {}",
                        show(&m),
                        show(&k)
                    )));
                }
                compared += 1;
            }
        }
    }
    if let Some(d) = diff_views(&model.view(), &host_view(&host)) {
        return Err(format!("seed={seed}: final trees differ at {d}"));
    }
    for (fd, _) in host.handles.iter().flatten() {
        unsafe { libc::close(*fd) };
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
