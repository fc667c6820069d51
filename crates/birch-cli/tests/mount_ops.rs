//! Linux operations tools expect (issue 11), through a real mount:
//! O_TMPFILE and linkat, statx btime, chattr/lsattr (append-only and
//! immutable), fallocate modes, copy_file_range as a reflink. Crash cases
//! cut the power with the shutdown ioctl and kill the daemon, as
//! mount_sync does; the engine's crash-state enumeration of the same
//! cases is in crates/birch/tests/ops.rs.
//!
//! Needs root and /dev/fuse (skips otherwise, fails with
//! BIRCH_REQUIRE_MOUNT=1).

mod common;

use common::{cstr, errno, skip_unless_root, Fixture};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::process::Command;

const XFS_IOC_GOINGDOWN: libc::c_ulong = 0x8004_587d;
const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
const FS_IMMUTABLE_FL: libc::c_int = 0x10;

fn fixture(tag: &str) -> Fixture {
    let mut fx = Fixture::new(tag, "512M");
    fx.options = vec!["commit=0".into()];
    fx.mount();
    fx
}

/// Nothing more reaches the device, the daemon dies without committing.
fn power_cut(fx: &mut Fixture) {
    let dir = File::open(&fx.mnt).unwrap();
    let mut flags = 0u32;
    // SAFETY: the ioctl reads or writes one u32, which `flags` is.
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), XFS_IOC_GOINGDOWN, &mut flags) };
    assert_eq!(rc, 0, "shutdown ioctl: {}", std::io::Error::last_os_error());
    drop(dir);
    fx.kill_daemon();
    fx.assert_clean();
}

/// A power cut, then the image mounted again (replaying the log).
fn power_cut_and_remount(fx: &mut Fixture) {
    power_cut(fx);
    fx.mount();
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i >> 12) as u8 ^ (i as u8).wrapping_mul(29) ^ seed)
        .collect()
}

fn open_tmpfile(dir: &std::path::Path) -> File {
    let path = cstr(dir);
    // SAFETY: a valid C path; the new fd is owned by the File below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o640) };
    assert!(
        fd >= 0,
        "open O_TMPFILE: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: fd is a fresh descriptor nobody else owns.
    unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }
}

#[test]
fn tmpfile_linkat_then_fsync_survives_power_cut() {
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("ops-tmpfile");
    fs::create_dir(fx.path("d")).unwrap();
    fx.sync();
    let data = pattern(70_000, 1);
    let f = open_tmpfile(&fx.path("d"));
    f.write_all_at(&data, 0).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    // linkat(fd, "", ..., AT_EMPTY_PATH), as root.
    let name = cstr(&fx.path("d/f"));
    let empty = c"";
    // SAFETY: valid fd and C strings.
    let rc = unsafe {
        libc::linkat(
            f.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            name.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    assert_eq!(
        rc,
        0,
        "linkat AT_EMPTY_PATH: {}",
        std::io::Error::last_os_error()
    );
    // And the /proc/self/fd way, which needs no privilege.
    let proc_path = cstr(std::path::Path::new(&format!(
        "/proc/self/fd/{}",
        f.as_raw_fd()
    )));
    let second = cstr(&fx.path("d/g"));
    // SAFETY: valid C strings.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path.as_ptr(),
            libc::AT_FDCWD,
            second.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    assert_eq!(
        rc,
        0,
        "linkat /proc/self/fd: {}",
        std::io::Error::last_os_error()
    );
    assert_eq!(f.metadata().unwrap().nlink(), 2);
    f.sync_all().unwrap();
    drop(f);
    // A tmpfile never linked: gone with its last close, and after a crash.
    let lost = open_tmpfile(&fx.path("d"));
    lost.write_all_at(&pattern(50_000, 2), 0).unwrap();
    lost.sync_all().unwrap();
    power_cut(&mut fx);
    // Closed only now: the dead mount (and the image's lock) stays while
    // it is open.
    drop(lost);
    fx.mount();
    assert_eq!(fs::read(fx.path("d/f")).unwrap(), data);
    assert_eq!(fs::read(fx.path("d/g")).unwrap(), data);
    let names: Vec<_> = fs::read_dir(fx.path("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn statx_reports_btime() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("ops-statx");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    fs::write(fx.path("f"), b"x").unwrap();
    let statx = |path: &std::path::Path| {
        let c = cstr(path);
        // SAFETY: statx fills the zeroed struct we pass.
        let mut st: libc::statx = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::statx(
                libc::AT_FDCWD,
                c.as_ptr(),
                0,
                libc::STATX_BASIC_STATS | libc::STATX_BTIME,
                &mut st,
            )
        };
        assert_eq!(rc, 0, "statx: {}", std::io::Error::last_os_error());
        st
    };
    let st = statx(&fx.path("f"));
    assert_ne!(st.stx_mask & libc::STATX_BTIME, 0, "no btime in the mask");
    assert!(
        st.stx_btime.tv_sec >= before,
        "btime {} before creation",
        st.stx_btime.tv_sec
    );
    assert!(st.stx_btime.tv_sec <= st.stx_mtime.tv_sec);
    let btime = (st.stx_btime.tv_sec, st.stx_btime.tv_nsec);
    // A later change moves ctime and mtime, never btime.
    fs::write(fx.path("f"), b"changed").unwrap();
    let after = statx(&fx.path("f"));
    assert_eq!((after.stx_btime.tv_sec, after.stx_btime.tv_nsec), btime);
    assert_eq!(after.stx_size, 7);
}

fn chattr(args: &[&str]) -> std::process::Output {
    Command::new("chattr")
        .args(args)
        .output()
        .expect("run chattr (e2fsprogs)")
}

#[test]
fn chattr_append_only_and_immutable() {
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("ops-chattr");
    fs::create_dir(fx.path("d")).unwrap();
    fs::write(fx.path("d/f"), b"log:").unwrap();
    let f = fx.path("d/f");
    let fs_ = f.to_str().unwrap();

    assert!(chattr(&["+a", fs_]).status.success());
    let lsattr = Command::new("lsattr").arg(fs_).output().unwrap();
    let flags = String::from_utf8_lossy(&lsattr.stdout)
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    assert!(
        flags.contains('a') && !flags.contains('i'),
        "lsattr: {flags}"
    );
    OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(b" one")
        .unwrap();
    let perm = |r: std::io::Result<()>| {
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EPERM));
    };
    perm(
        OpenOptions::new()
            .write(true)
            .open(&f)
            .and_then(|mut w| w.write_all(b"X")),
    );
    perm(
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&f)
            .map(|_| ()),
    );
    perm(fs::remove_file(&f));
    perm(fs::rename(&f, fx.path("g")));
    perm(fs::hard_link(&f, fx.path("g")));

    assert!(chattr(&["-a", "+i", fs_]).status.success());
    let file = File::open(&f).unwrap();
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int.
    assert_eq!(
        unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_GETFLAGS, &mut flags) },
        0
    );
    assert_eq!(flags, FS_IMMUTABLE_FL);
    perm(
        OpenOptions::new()
            .append(true)
            .open(&f)
            .and_then(|mut w| w.write_all(b"X")),
    );
    perm(fs::set_permissions(
        &f,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    ));
    perm(fs::remove_file(&f));
    let name = cstr(&f);
    // SAFETY: valid C strings.
    let rc = unsafe {
        libc::setxattr(
            name.as_ptr(),
            c"user.k".as_ptr(),
            b"v".as_ptr().cast(),
            1,
            0,
        )
    };
    assert_eq!((rc, errno()), (-1, libc::EPERM));
    // A flag birch does not honour is refused, not ignored.
    let out = chattr(&["+C", fs_]);
    assert!(!out.status.success(), "chattr +C succeeded");
    let mut nocow: libc::c_int = FS_IMMUTABLE_FL | 0x0080_0000;
    // SAFETY: FS_IOC_SETFLAGS reads one int.
    assert_eq!(
        unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_SETFLAGS, &mut nocow) },
        -1
    );
    assert_eq!(errno(), libc::EOPNOTSUPP);
    drop(file);

    // The flag is in the inode: it survives an fsync and a power cut.
    File::open(&f).unwrap().sync_all().unwrap();
    power_cut_and_remount(&mut fx);
    perm(fs::remove_file(&f));
    assert!(chattr(&["-i", fs_]).status.success());
    assert_eq!(fs::read(&f).unwrap(), b"log: one");
    fs::remove_file(&f).unwrap();

    // Only root may set them (the kernel checks CAP_LINUX_IMMUTABLE).
    fs::write(fx.path("d/mine"), b"").unwrap();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "chattr",
            "+i",
        ])
        .arg(fx.path("d/mine"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "an unprivileged chattr +i succeeded");
}

/// The first word of `lsattr`'s line for `path` (`-d`: a directory itself).
fn lsattr(path: &std::path::Path) -> String {
    let out = Command::new("lsattr").arg("-d").arg(path).output().unwrap();
    assert!(out.status.success(), "lsattr: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split(' ')
        .next()
        .unwrap()
        .to_string()
}

/// chattr `S`, `A`, `d`, `D` through the mount: lsattr shows them; `A`
/// keeps the atime through a read; a write to an `S` file and a create in
/// a `D` directory survive a power cut with no fsync (the same cases as
/// the engine's `sync_flag_write_survives_power_cut` and
/// `dirsync_create_survives_power_cut`).
#[test]
fn chattr_sync_noatime_nodump_dirsync() {
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("ops-chattr-sync");
    fs::create_dir(fx.path("d")).unwrap();
    fs::write(fx.path("f"), b"").unwrap();
    let (d, f) = (fx.path("d"), fx.path("f"));
    let ctime = |p: &std::path::Path| {
        let m = fs::metadata(p).unwrap();
        (m.ctime(), m.ctime_nsec())
    };
    let before = ctime(&f);
    assert!(chattr(&["+D", "+d", d.to_str().unwrap()]).status.success());
    assert!(chattr(&["+S", "+A", "+d", f.to_str().unwrap()])
        .status
        .success());
    // chattr sets ctime, and stat sees it at once: the kernel's cached
    // attributes are dropped (fstests generic/277).
    assert_ne!(ctime(&f), before, "ctime after chattr, as stat sees it");
    let (dflags, fflags) = (lsattr(&d), lsattr(&f));
    assert!(
        dflags.contains('D') && dflags.contains('d'),
        "lsattr d: {dflags}"
    );
    for flag in ['S', 'A', 'd'] {
        assert!(fflags.contains(flag), "lsattr f: {fflags} lacks {flag}");
    }
    // A flag birch does not honour is still refused.
    assert!(!chattr(&["+C", f.to_str().unwrap()]).status.success());

    let data = pattern(3 * 4096 + 11, 7);
    OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .write_all(&data)
        .unwrap();
    fs::write(fx.path("d/new"), b"").unwrap();
    fs::create_dir(fx.path("d/sub")).unwrap();
    power_cut_and_remount(&mut fx);
    assert_eq!(fs::read(&f).unwrap(), data);
    assert!(fx.path("d/new").exists() && fx.path("d/sub").is_dir());

    // `A`: a read leaves an old atime alone (relatime would update it).
    let old = libc::timespec {
        tv_sec: 1_000_000,
        tv_nsec: 0,
    };
    let omit = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_OMIT,
    };
    let name = cstr(&f);
    // SAFETY: a valid C path and two timespecs.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, name.as_ptr(), [old, omit].as_ptr(), 0) };
    assert_eq!(rc, 0);
    fs::read(&f).unwrap();
    fx.remount();
    assert_eq!(fs::metadata(&f).unwrap().atime(), 1_000_000);
    assert!(chattr(&["-A", f.to_str().unwrap()]).status.success());
    fs::read(&f).unwrap();
    fx.remount();
    assert_ne!(fs::metadata(&f).unwrap().atime(), 1_000_000);
}

/// `ioctl(FIBMAP)`: the device block of file block `block`.
fn fibmap(file: &File, block: libc::c_int) -> libc::c_int {
    const FIBMAP: libc::c_ulong = 1;
    let mut arg = block;
    // SAFETY: FIBMAP reads and writes one int.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), FIBMAP, &mut arg) };
    assert_eq!(rc, 0, "FIBMAP {block}: {}", std::io::Error::last_os_error());
    arg
}

/// FIBMAP on the fuseblk mount (FUSE_BMAP): each written block of a file,
/// synced or still dirty, maps to the block of the loop device (the
/// image) that holds its bytes; holes, inline data and preallocated
/// ranges map to 0; filefrag finds the extents.
#[test]
fn fibmap_maps_file_blocks_to_device_blocks() {
    if skip_unless_root() {
        return;
    }
    let fx = fixture("ops-fibmap");
    const BLOCK: usize = 4096;
    let data = pattern(6 * BLOCK, 9);
    let f = fx.path("f");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&f)
        .unwrap();
    // Blocks 0-1 and 4-5 written, 2-3 a hole; 0-1 committed, 4-5 dirty.
    file.write_all_at(&data[..2 * BLOCK], 0).unwrap();
    fx.sync();
    file.write_all_at(&data[4 * BLOCK..], 4 * BLOCK as u64)
        .unwrap();
    // SAFETY: fallocate on an open descriptor.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 6 * BLOCK as i64, BLOCK as i64) };
    assert_eq!(rc, 0);
    let image = File::open(fx.image_str()).unwrap();
    for block in 0..7 {
        let device_block = fibmap(&file, block);
        let written = matches!(block, 0 | 1 | 4 | 5);
        assert_eq!(
            device_block != 0,
            written,
            "block {block} -> {device_block}"
        );
        if written {
            let mut on_disk = vec![0u8; BLOCK];
            image
                .read_exact_at(&mut on_disk, device_block as u64 * BLOCK as u64)
                .unwrap();
            let want = &data[block as usize * BLOCK..][..BLOCK];
            assert!(
                on_disk == want,
                "block {block}: device block {device_block} holds other bytes"
            );
        }
    }
    // Inline data has no block of its own.
    fs::write(fx.path("small"), b"inline").unwrap();
    assert_eq!(fibmap(&File::open(fx.path("small")).unwrap(), 0), 0);
    let out = Command::new("filefrag").arg(&f).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("2 extents found"),
        "filefrag: {text}"
    );
}

/// generic/079: with `-o open` birch sees opens and refuses them as the
/// VFS does for kernel filesystems: EPERM at open(2) for a write or
/// truncating open of an immutable file, and for a write open without
/// O_APPEND or a truncating one of an append-only file.
#[test]
fn open_refuses_writes_to_immutable_and_append_only_files() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("ops-open-flags", "512M");
    fx.options = vec!["open".into()];
    fx.mount();
    let f = fx.path("f");
    fs::write(&f, b"log:").unwrap();
    let open = |flags: libc::c_int| -> Result<(), i32> {
        let c = cstr(&f);
        // SAFETY: a valid C string; the descriptor is closed at once.
        let fd = unsafe { libc::open(c.as_ptr(), flags) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: the descriptor just opened.
        unsafe { libc::close(fd) };
        Ok(())
    };
    let (rd, wr, rdwr) = (libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR);
    let (append, trunc) = (libc::O_APPEND, libc::O_TRUNC);
    let f_ = f.to_str().unwrap();

    assert!(chattr(&["+i", f_]).status.success());
    for flags in [wr, rdwr, wr | append, rd | trunc, wr | trunc] {
        assert_eq!(open(flags), Err(libc::EPERM), "immutable, open {flags:#o}");
    }
    assert_eq!(open(rd), Ok(()));

    assert!(chattr(&["-i", "+a", f_]).status.success());
    for flags in [wr, rdwr, wr | trunc, wr | append | trunc] {
        assert_eq!(
            open(flags),
            Err(libc::EPERM),
            "append-only, open {flags:#o}"
        );
    }
    assert_eq!(open(rd), Ok(()));
    assert_eq!(open(rdwr | append), Ok(()));
    OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(b" one")
        .unwrap();
    let truncate = |len: i64| -> Result<(), i32> {
        let c = cstr(&f);
        // SAFETY: a valid C string.
        let rc = unsafe { libc::truncate(c.as_ptr(), len) };
        if rc == 0 {
            Ok(())
        } else {
            Err(errno())
        }
    };
    assert_eq!(truncate(0), Err(libc::EPERM));
    assert!(chattr(&["-a", f_]).status.success());
    assert_eq!(fs::read(&f).unwrap(), b"log: one");
    assert_eq!(open(wr | trunc), Ok(()));
}

#[test]
fn fallocate_modes() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("ops-fallocate");
    let data = pattern(5 * 4096, 3);
    fs::write(fx.path("f"), &data).unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(fx.path("f"))
        .unwrap();
    let fd = f.as_raw_fd();
    // SAFETY: fallocate on an fd we own.
    let falloc = |mode, off, len| unsafe { libc::fallocate(fd, mode, off, len) };
    assert_eq!(
        falloc(libc::FALLOC_FL_ZERO_RANGE, 100, 5000),
        0,
        "{}",
        std::io::Error::last_os_error()
    );
    assert_eq!(
        falloc(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            3 * 4096,
            4096
        ),
        0
    );
    assert_eq!(falloc(libc::FALLOC_FL_ZERO_RANGE, 5 * 4096, 4096), 0);
    let mut want = data.clone();
    want[100..5100].fill(0);
    want[3 * 4096..4 * 4096].fill(0);
    want.resize(6 * 4096, 0);
    assert_eq!(fs::read(fx.path("f")).unwrap(), want);
    // The kernel's FUSE fallocate refuses these itself (the engine has
    // them: crates/birch/tests/ops.rs).
    for mode in [libc::FALLOC_FL_COLLAPSE_RANGE, libc::FALLOC_FL_INSERT_RANGE] {
        assert_eq!((falloc(mode, 4096, 4096), errno()), (-1, libc::EOPNOTSUPP));
    }
}

#[test]
fn copy_file_range_is_a_reflink_and_survives_power_cut() {
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("ops-reflink");
    let data = pattern(8 << 20, 4);
    fs::write(fx.path("a"), &data).unwrap();
    fx.sync();
    let free = |fx: &Fixture| {
        let c = cstr(&fx.mnt);
        // SAFETY: statvfs fills the zeroed struct.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_bfree * st.f_frsize
    };
    let before = free(&fx);
    let a = File::open(fx.path("a")).unwrap();
    let b = File::create(fx.path("b")).unwrap();
    let mut left = data.len();
    while left > 0 {
        // SAFETY: copy_file_range between fds we own, at their offsets.
        let n = unsafe {
            libc::copy_file_range(
                a.as_raw_fd(),
                std::ptr::null_mut(),
                b.as_raw_fd(),
                std::ptr::null_mut(),
                left,
                0,
            )
        };
        assert!(
            n > 0,
            "copy_file_range: {}",
            std::io::Error::last_os_error()
        );
        left -= n as usize;
    }
    b.sync_all().unwrap();
    drop((a, b));
    let used = before.saturating_sub(free(&fx));
    assert!(used < 1 << 20, "an 8 MiB reflink used {used} bytes");
    power_cut_and_remount(&mut fx);
    assert_eq!(fs::read(fx.path("b")).unwrap(), data);
    // Copy on write: changing b leaves a alone.
    OpenOptions::new()
        .write(true)
        .open(fx.path("b"))
        .unwrap()
        .write_all_at(&[0xee; 10_000], 4000)
        .unwrap();
    fx.sync();
    assert_eq!(fs::read(fx.path("a")).unwrap(), data);
}
