//! POSIX behaviour over a real mount: `birch mount` serves an image and the
//! tests use the kernel's system calls on it, as any program would. Every
//! test ends (through [`common::Fixture`]'s drop) with an unmount and a
//! clean `birch check`.
//!
//! Run: `cargo test -p birch-cli --test mount_posix` as root (needs
//! /dev/fuse). docs/FUSE-TESTING.md lists what each test covers.

mod common;

use common::{birch, cstr, errno, skip_unless_root, text, Fixture};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

const NOBODY: u32 = 65534;

/// The errno of a failed std call (panics if it succeeded).
fn err_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("no errno in {e}")),
    }
}

fn errname(e: i32) -> String {
    format!("{} ({e})", std::io::Error::from_raw_os_error(e))
}

#[track_caller]
fn assert_errno<T: std::fmt::Debug>(r: std::io::Result<T>, want: i32) {
    let got = err_of(r);
    assert_eq!(got, want, "got {}, want {}", errname(got), errname(want));
}

/// Result of a libc call returning -1 on error.
fn check(rc: libc::c_int) -> std::io::Result<libc::c_int> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn check_size(rc: isize) -> std::io::Result<usize> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

fn write_file(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

fn read_file(p: &Path) -> Vec<u8> {
    fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> std::io::Result<libc::c_int> {
    let (from, to) = (cstr(from), cstr(to));
    // SAFETY: valid C strings, AT_FDCWD.
    check(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    })
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// Runs `f` in a forked child as uid/gid 65534 (no supplementary groups)
/// and returns what it returns (0 for success, otherwise an errno). `f`
/// must only make system calls (no allocation): the child of a
/// multi-threaded process may only use async-signal-safe functions.
fn as_nobody(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: fork; the child only makes system calls and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: plain system calls in the child; _exit never returns.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
            {
                libc::_exit(250);
            }
            let code = f();
            libc::_exit(code);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
    let code = libc::WEXITSTATUS(status);
    assert_ne!(code, 250, "could not switch to uid {NOBODY}");
    code
}

/// In the child of [`as_nobody`]: 0 if `rc` is not -1, else errno.
fn rc_errno(rc: libc::c_int) -> i32 {
    if rc == -1 {
        // SAFETY: reads the thread's errno.
        unsafe { *libc::__errno_location() }
    } else {
        0
    }
}

#[test]
fn rename_replaces_an_existing_file() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-rename-file");
    let (a, b) = (fx.path("a"), fx.path("b"));
    write_file(&a, b"new contents");
    write_file(&b, b"old contents");
    let b_ino = fs::metadata(&b).unwrap().ino();
    // An open handle on the replaced file keeps its data readable.
    let mut old = File::open(&b).unwrap();
    fs::rename(&a, &b).unwrap();
    assert_errno(fs::metadata(&a), libc::ENOENT);
    assert_eq!(read_file(&b), b"new contents");
    assert_ne!(fs::metadata(&b).unwrap().ino(), b_ino);
    let mut s = String::new();
    old.read_to_string(&mut s).unwrap();
    assert_eq!(s, "old contents");
    assert_eq!(old.metadata().unwrap().nlink(), 0);
    drop(old);
    // Renaming a name onto another name of the same inode does nothing.
    fs::hard_link(&b, fx.path("b2")).unwrap();
    fs::rename(&b, fx.path("b2")).unwrap();
    assert!(b.exists() && fx.path("b2").exists());
    assert_eq!(fs::metadata(&b).unwrap().nlink(), 2);
    // Across directories, with a directory's mtime moving.
    fs::create_dir(fx.path("d")).unwrap();
    write_file(&fx.path("d/c"), b"in d");
    fs::rename(fx.path("d/c"), &b).unwrap();
    assert_eq!(read_file(&b), b"in d");
    assert_eq!(fs::metadata(fx.path("b2")).unwrap().nlink(), 1);
    assert_eq!(fs::read_dir(fx.path("d")).unwrap().count(), 0);
}

#[test]
fn rename_replaces_an_empty_directory_only() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-rename-dir");
    let p = |s: &str| fx.path(s);
    fs::create_dir_all(p("src/inner")).unwrap();
    write_file(&p("src/inner/f"), b"x");
    fs::create_dir(p("empty")).unwrap();
    fs::create_dir_all(p("full/child")).unwrap();
    write_file(&p("file"), b"f");
    let root_links = fs::metadata(&fx.mnt).unwrap().nlink();
    // Directory over a non-empty directory, over a file; file over a directory.
    assert_errno(fs::rename(p("src"), p("full")), libc::ENOTEMPTY);
    assert_errno(fs::rename(p("src"), p("file")), libc::ENOTDIR);
    assert_errno(fs::rename(p("file"), p("empty")), libc::EISDIR);
    // Directory over an empty directory.
    fs::rename(p("src"), p("empty")).unwrap();
    assert_errno(fs::metadata(p("src")), libc::ENOENT);
    assert_eq!(read_file(&p("empty/inner/f")), b"x");
    assert_eq!(
        fs::metadata(&fx.mnt).unwrap().nlink(),
        root_links - 1,
        "root lost one subdirectory"
    );
    // Moving a directory between parents moves a link ("..") too.
    let full_links = fs::metadata(p("full")).unwrap().nlink();
    fs::rename(p("empty/inner"), p("full/inner")).unwrap();
    assert_eq!(fs::metadata(p("full")).unwrap().nlink(), full_links + 1);
    assert_eq!(fs::metadata(p("empty")).unwrap().nlink(), 2);
    assert_eq!(fs::canonicalize(p("full/inner/..")).unwrap(), p("full"));
    // ".." of the moved directory now leads to its new parent.
    assert_eq!(
        fs::metadata(p("full/inner/..")).unwrap().ino(),
        fs::metadata(p("full")).unwrap().ino()
    );
}

#[test]
fn rename_of_a_directory_into_its_own_subtree_is_einval() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-rename-subtree");
    fs::create_dir_all(fx.path("a/b/c")).unwrap();
    assert_errno(fs::rename(fx.path("a"), fx.path("a/b/c/a")), libc::EINVAL);
    assert_errno(fs::rename(fx.path("a"), fx.path("a/x")), libc::EINVAL);
    assert_errno(fs::rename(fx.path("a/b"), fx.path("a/b/c/d")), libc::EINVAL);
    // Over its own (non-empty) ancestor: also refused.
    assert!(matches!(
        err_of(fs::rename(fx.path("a/b/c"), fx.path("a"))),
        libc::ENOTEMPTY | libc::EINVAL
    ));
    // Nothing moved.
    assert!(fx.path("a/b/c").is_dir());
    // RENAME_EXCHANGE of a directory with something inside it.
    write_file(&fx.path("a/b/c/f"), b"");
    assert_errno(
        renameat2(&fx.path("a"), &fx.path("a/b/c/f"), libc::RENAME_EXCHANGE),
        libc::EINVAL,
    );
}

#[test]
fn renameat2_noreplace_and_exchange() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-renameat2");
    let p = |s: &str| fx.path(s);
    write_file(&p("a"), b"A");
    write_file(&p("b"), b"B");
    assert_errno(
        renameat2(&p("a"), &p("b"), libc::RENAME_NOREPLACE),
        libc::EEXIST,
    );
    assert_eq!(read_file(&p("a")), b"A");
    renameat2(&p("a"), &p("c"), libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(read_file(&p("c")), b"A");
    assert_errno(fs::metadata(p("a")), libc::ENOENT);

    // Exchange two files.
    renameat2(&p("b"), &p("c"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(read_file(&p("b")), b"A");
    assert_eq!(read_file(&p("c")), b"B");
    // Exchange with a missing name: ENOENT; both flags together: EINVAL.
    assert_errno(
        renameat2(&p("b"), &p("missing"), libc::RENAME_EXCHANGE),
        libc::ENOENT,
    );
    assert_errno(
        renameat2(
            &p("b"),
            &p("c"),
            libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE,
        ),
        libc::EINVAL,
    );

    // Exchange a file and a directory in different parents: link counts
    // of both parents follow the directory.
    fs::create_dir_all(p("d1/sub")).unwrap();
    write_file(&p("d1/sub/inside"), b"i");
    fs::create_dir(p("d2")).unwrap();
    write_file(&p("d2/file"), b"F");
    let (l1, l2) = (
        fs::metadata(p("d1")).unwrap().nlink(),
        fs::metadata(p("d2")).unwrap().nlink(),
    );
    renameat2(&p("d1/sub"), &p("d2/file"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(read_file(&p("d1/sub")), b"F");
    assert_eq!(read_file(&p("d2/file/inside")), b"i");
    assert_eq!(fs::metadata(p("d1")).unwrap().nlink(), l1 - 1);
    assert_eq!(fs::metadata(p("d2")).unwrap().nlink(), l2 + 1);
    assert_eq!(
        fs::metadata(p("d2/file/..")).unwrap().ino(),
        fs::metadata(p("d2")).unwrap().ino()
    );
    // Exchange two directories.
    fs::create_dir(p("x")).unwrap();
    write_file(&p("x/xf"), b"");
    renameat2(&p("x"), &p("d2/file"), libc::RENAME_EXCHANGE).unwrap();
    assert!(p("x/inside").exists() && p("d2/file/xf").exists());
    // Unknown flags.
    let e = err_of(renameat2(&p("b"), &p("z"), 1 << 7));
    assert_eq!(e, libc::EINVAL, "got {}", errname(e));
}

/// RENAME_WHITEOUT (overlayfs's, docs/FUSE.md "Whiteouts and overlayfs"):
/// the source's name becomes a whiteout (character device 0:0, mode 0,
/// the caller's owner, the set-group-ID directory's group), for a file and
/// a directory, with RENAME_NOREPLACE too; with RENAME_EXCHANGE it is
/// EINVAL (the kernel's check).
#[test]
fn renameat2_whiteout_leaves_a_whiteout() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("whiteout");
    let p = |rel: &str| fx.path(rel);
    let assert_whiteout = |rel: &str, gid: u32| {
        let m = fs::symlink_metadata(p(rel)).unwrap();
        assert!(m.file_type().is_char_device(), "{rel}: {m:?}");
        assert_eq!((m.rdev(), m.mode() & 0o7777, m.nlink()), (0, 0, 1), "{rel}");
        assert_eq!((m.uid(), m.gid()), (0, gid), "{rel}");
    };
    write_file(&p("a"), b"A");
    renameat2(&p("a"), &p("b"), libc::RENAME_WHITEOUT).unwrap();
    assert_eq!(read_file(&p("b")), b"A");
    assert_whiteout("a", 0);
    // A directory, into a set-group-ID directory with RENAME_NOREPLACE;
    // the whiteout stays in the source directory, group and all.
    fs::create_dir(p("sgid")).unwrap();
    fs::set_permissions(p("sgid"), fs::Permissions::from_mode(0o2775)).unwrap();
    std::os::unix::fs::chown(p("sgid"), None, Some(NOBODY)).unwrap();
    fs::create_dir_all(p("sgid/d/sub")).unwrap();
    renameat2(
        &p("sgid/d"),
        &p("moved"),
        libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE,
    )
    .unwrap();
    assert!(p("moved/sub").is_dir());
    assert_whiteout("sgid/d", NOBODY);
    assert_eq!(
        err_of(renameat2(
            &p("b"),
            &p("moved"),
            libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE
        )),
        libc::EEXIST
    );
    assert_eq!(
        err_of(renameat2(
            &p("b"),
            &p("moved"),
            libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE
        )),
        libc::EINVAL
    );
    assert_eq!(read_file(&p("b")), b"A");
}

/// Thousands of names of one file in one directory (extended refs past
/// the first item's worth): all listed, counted, removable, and the image
/// checks clean after unmount.
#[test]
fn thousands_of_hard_links_in_one_directory() {
    if skip_unless_root() {
        return;
    }
    const LINKS: usize = 5000;
    let mut fx = Fixture::mounted("posix-many-links");
    let p = |s: &str| fx.path(s);
    write_file(&p("f"), b"one inode");
    fs::create_dir(p("d")).unwrap();
    for i in 0..LINKS {
        fs::hard_link(p("f"), p(&format!("d/link_{i}"))).unwrap();
    }
    assert_eq!(fs::metadata(p("f")).unwrap().nlink() as usize, LINKS + 1);
    assert_eq!(fs::read_dir(p("d")).unwrap().count(), LINKS);
    assert_eq!(read_file(&p("d/link_4999")), b"one inode");
    for i in (0..LINKS).step_by(2) {
        fs::remove_file(p(&format!("d/link_{i}"))).unwrap();
    }
    fs::rename(p("d/link_4001"), p("moved")).unwrap();
    assert_eq!(
        fs::metadata(p("moved")).unwrap().nlink() as usize,
        LINKS / 2 + 1
    );
    fx.unmount();
    let out = birch(&["check", fx.image_str()]);
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[test]
fn hard_link_counts() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-links");
    let p = |s: &str| fx.path(s);
    write_file(&p("f"), b"shared");
    assert_eq!(fs::metadata(p("f")).unwrap().nlink(), 1);
    fs::hard_link(p("f"), p("g")).unwrap();
    fs::create_dir(p("dir")).unwrap();
    fs::hard_link(p("f"), p("dir/h")).unwrap();
    for name in ["f", "g", "dir/h"] {
        let m = fs::metadata(p(name)).unwrap();
        assert_eq!(m.nlink(), 3, "{name}");
        assert_eq!(m.ino(), fs::metadata(p("f")).unwrap().ino());
    }
    // One inode: a write through one name shows through the others.
    OpenOptions::new()
        .append(true)
        .open(p("g"))
        .unwrap()
        .write_all(b"+more")
        .unwrap();
    assert_eq!(read_file(&p("dir/h")), b"shared+more");
    assert_errno(fs::hard_link(p("f"), p("g")), libc::EEXIST);
    assert_errno(fs::hard_link(p("dir"), p("dirlink")), libc::EPERM);
    assert_errno(fs::hard_link(p("missing"), p("x")), libc::ENOENT);
    fs::remove_file(p("f")).unwrap();
    assert_eq!(fs::metadata(p("g")).unwrap().nlink(), 2);
    fs::remove_file(p("dir/h")).unwrap();
    assert_eq!(fs::metadata(p("g")).unwrap().nlink(), 1);
    assert_eq!(read_file(&p("g")), b"shared+more");

    // Directories: 2 + one per subdirectory; files do not count.
    fs::create_dir(p("top")).unwrap();
    assert_eq!(fs::metadata(p("top")).unwrap().nlink(), 2);
    for i in 0..5 {
        fs::create_dir(p(&format!("top/sub{i}"))).unwrap();
        write_file(&p(&format!("top/file{i}")), b"");
    }
    assert_eq!(fs::metadata(p("top")).unwrap().nlink(), 7);
    fs::remove_dir(p("top/sub0")).unwrap();
    fs::rename(p("top/sub1"), p("sub1")).unwrap();
    assert_eq!(fs::metadata(p("top")).unwrap().nlink(), 5);
    let root_before = fs::metadata(&fx.mnt).unwrap().nlink();
    fs::create_dir(p("another")).unwrap();
    assert_eq!(fs::metadata(&fx.mnt).unwrap().nlink(), root_before + 1);
    // Link counts survive a remount (read back from the image).
    let mut fx = fx;
    fx.remount();
    assert_eq!(fs::metadata(fx.path("top")).unwrap().nlink(), 5);
    assert_eq!(fs::metadata(fx.path("g")).unwrap().nlink(), 1);
}

#[test]
fn unlinked_open_file_lives_until_close() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("posix-unlink-open");
    let p = fx.path("doomed");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    let data = pattern(300_000, 7);
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    let ino = f.metadata().unwrap().ino();
    fs::remove_file(&p).unwrap();
    assert_errno(fs::metadata(&p), libc::ENOENT);
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    // Read and write through the handle.
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert!(back == data, "data of the unlinked file changed");
    f.write_all(b"tail written after unlink").unwrap();
    f.sync_all().unwrap();
    f.seek(SeekFrom::Start(data.len() as u64)).unwrap();
    let mut tail = String::new();
    f.read_to_string(&mut tail).unwrap();
    assert_eq!(tail, "tail written after unlink");
    // A new file may reuse the name; it is another inode.
    write_file(&p, b"new");
    assert_ne!(fs::metadata(&p).unwrap().ino(), ino);
    drop(f);
    assert_eq!(read_file(&p), b"new");
    // Unmount (the kernel forgets the inode) and check: no orphan left,
    // its space freed.
    fx.remount();
    assert_eq!(fs::read_dir(&fx.mnt).unwrap().count(), 1);
    fx.unmount();
    let report = fx.check().unwrap_or_else(|e| panic!("{e}"));
    assert!(report.contains(" 0 orphans"), "{report}");
}

#[test]
fn open_flags_excl_append_trunc() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-open-flags");
    let p = fx.path("f");
    // O_EXCL
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap()
        .write_all(b"first")
        .unwrap();
    assert_errno(
        OpenOptions::new().write(true).create_new(true).open(&p),
        libc::EEXIST,
    );
    symlink("dangling-target", fx.path("link")).unwrap();
    assert_errno(
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(fx.path("link")),
        libc::EEXIST,
    );
    assert!(
        !fx.path("dangling-target").exists(),
        "O_EXCL followed a symlink"
    );
    // Without O_EXCL, O_CREAT through a dangling symlink creates its target.
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(fx.path("link"))
        .unwrap();
    assert!(fx.path("dangling-target").is_file());

    // O_APPEND: every write lands at the end, whatever the offset, from
    // two handles at once.
    let mut a1 = OpenOptions::new().append(true).open(&p).unwrap();
    let mut a2 = OpenOptions::new().append(true).open(&p).unwrap();
    a1.write_all(b"-one").unwrap();
    a2.write_all(b"-two").unwrap();
    a1.write_all(b"-three").unwrap();
    // pwrite on an O_APPEND fd appends too (Linux).
    // SAFETY: a valid buffer and fd.
    let n = unsafe { libc::pwrite(a2.as_raw_fd(), b"-four".as_ptr().cast(), 5, 0) };
    assert_eq!(n, 5);
    drop((a1, a2));
    assert_eq!(read_file(&p), b"first-one-two-three-four");

    // O_TRUNC
    let size_before = fs::metadata(&p).unwrap().len();
    assert!(size_before > 0);
    let mut t = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
    t.write_all(b"x").unwrap();
    drop(t);
    assert_eq!(read_file(&p), b"x");
    // O_TRUNC on a big file drops its blocks.
    write_file(&p, &pattern(2 << 20, 1));
    File::open(&p).unwrap().sync_all().unwrap();
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap()
        .sync_all()
        .unwrap();
    let m = fs::metadata(&p).unwrap();
    assert_eq!((m.len(), m.blocks()), (0, 0));
    // O_DIRECTORY on a file, O_WRONLY on a directory.
    assert_errno(
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&p),
        libc::ENOTDIR,
    );
    assert_errno(OpenOptions::new().write(true).open(&fx.mnt), libc::EISDIR);
}

fn seek(fd: &File, off: i64, whence: libc::c_int) -> std::io::Result<i64> {
    // SAFETY: lseek on an open fd.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), off, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

#[test]
fn sparse_files_read_zeros_and_seek_data_hole() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("posix-sparse");
    let p = fx.path("sparse");
    const MIB: u64 = 1 << 20;
    {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&[0xAA; 4096], 0).unwrap();
        f.write_all_at(&[0xBB; 8192], 4 * MIB).unwrap();
        f.set_len(10 * MIB).unwrap();
        // Before any sync: the kernel writes back before it asks for lseek.
        assert_eq!(seek(&f, 0, libc::SEEK_DATA).unwrap(), 0);
        assert_eq!(seek(&f, 0, libc::SEEK_HOLE).unwrap(), 4096);
        assert_eq!(seek(&f, 4096, libc::SEEK_DATA).unwrap(), 4 * MIB as i64);
        assert_eq!(
            seek(&f, 4 * MIB as i64, libc::SEEK_HOLE).unwrap(),
            4 * MIB as i64 + 8192
        );
        assert_errno(
            seek(&f, 4 * MIB as i64 + 8192, libc::SEEK_DATA),
            libc::ENXIO,
        );
        assert_eq!(
            seek(&f, 5 * MIB as i64, libc::SEEK_HOLE).unwrap(),
            5 * MIB as i64
        );
        assert_errno(seek(&f, 10 * MIB as i64, libc::SEEK_HOLE), libc::ENXIO);
        assert_errno(seek(&f, 10 * MIB as i64, libc::SEEK_DATA), libc::ENXIO);
        let mut buf = vec![1u8; 8192];
        f.read_exact_at(&mut buf, 4096).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "hole does not read as zeros");
        f.read_exact_at(&mut buf, 9 * MIB).unwrap();
        assert!(
            buf.iter().all(|&b| b == 0),
            "tail hole does not read as zeros"
        );
        f.sync_all().unwrap();
        let m = f.metadata().unwrap();
        assert_eq!(m.len(), 10 * MIB);
        assert!(
            m.blocks() * 512 <= 64 * 1024,
            "a sparse file uses {} bytes",
            m.blocks() * 512
        );
        assert!(
            m.blocks() * 512 >= 12 * 1024,
            "blocks must count the data: {}",
            m.blocks()
        );
    }
    // Same answers from the image after a remount.
    fx.remount();
    let f = File::open(fx.path("sparse")).unwrap();
    assert_eq!(seek(&f, 0, libc::SEEK_HOLE).unwrap(), 4096);
    assert_eq!(seek(&f, 4096, libc::SEEK_DATA).unwrap(), 4 * MIB as i64);
    let data = read_file(&fx.path("sparse"));
    assert_eq!(data.len() as u64, 10 * MIB);
    assert!(data[..4096].iter().all(|&b| b == 0xAA));
    assert!(data[4096..4 * MIB as usize].iter().all(|&b| b == 0));
    assert!(data[4 * MIB as usize..4 * MIB as usize + 8192]
        .iter()
        .all(|&b| b == 0xBB));
    assert!(data[4 * MIB as usize + 8192..].iter().all(|&b| b == 0));
}

#[test]
fn large_sparse_file_beyond_4_gib() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("posix-large");
    let p = fx.path("big");
    const GIB: u64 = 1 << 30;
    let spots = [
        (4 * GIB - 3000, pattern(6000, 1)),
        (5 * GIB + 12345, pattern(70_000, 2)),
        (17 * GIB, pattern(4096, 3)),
    ];
    {
        use std::os::unix::fs::FileExt;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        for (off, data) in &spots {
            f.write_all_at(data, *off).unwrap();
        }
        assert_eq!(f.metadata().unwrap().len(), 17 * GIB + 4096);
        f.sync_all().unwrap();
        let mut buf = vec![0u8; 70_000];
        f.read_exact_at(&mut buf, 5 * GIB + 12345).unwrap();
        assert!(buf == spots[1].1);
        assert_eq!(
            seek(&f, 4 * GIB as i64 + 8192, libc::SEEK_DATA).unwrap(),
            ((5 * GIB + 12345) / 4096 * 4096) as i64
        );
    }
    fx.remount();
    {
        use std::os::unix::fs::FileExt;
        let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        for (off, data) in &spots {
            let mut buf = vec![0u8; data.len()];
            f.read_exact_at(&mut buf, *off).unwrap();
            assert!(&buf == data, "data at {off:#x} differs after remount");
        }
        let mut zero = vec![1u8; 4096];
        f.read_exact_at(&mut zero, 10 * GIB).unwrap();
        assert!(zero.iter().all(|&b| b == 0));
        // Shrink across the 4 GiB boundary and grow again: zeros after the cut.
        f.set_len(4 * GIB).unwrap();
        f.set_len(6 * GIB).unwrap();
        let mut buf = vec![1u8; 3000];
        f.read_exact_at(&mut buf, 4 * GIB).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        f.read_exact_at(&mut buf, 4 * GIB - 3000).unwrap();
        assert!(buf == spots[0].1[..3000]);
        assert!(f.metadata().unwrap().blocks() * 512 < 1 << 20);
    }
}

#[test]
fn names_of_255_bytes_work_and_256_are_too_long() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-names");
    let ok = "n".repeat(255);
    let long = "l".repeat(256);
    write_file(&fx.path(&ok), b"max");
    assert_eq!(read_file(&fx.path(&ok)), b"max");
    fs::create_dir(fx.path(&format!("{}d", "d".repeat(254)))).unwrap();
    let names: BTreeSet<_> = fs::read_dir(&fx.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().len())
        .collect();
    assert_eq!(names, BTreeSet::from([255]));
    assert_errno(File::create(fx.path(&long)), libc::ENAMETOOLONG);
    assert_errno(fs::create_dir(fx.path(&long)), libc::ENAMETOOLONG);
    assert_errno(fs::metadata(fx.path(&long)), libc::ENAMETOOLONG);
    assert_errno(symlink("t", fx.path(&long)), libc::ENAMETOOLONG);
    assert_errno(
        fs::hard_link(fx.path(&ok), fx.path(&long)),
        libc::ENAMETOOLONG,
    );
    assert_errno(fs::rename(fx.path(&ok), fx.path(&long)), libc::ENAMETOOLONG);
    // Multi-byte UTF-8: 85 three-byte characters are 255 bytes.
    let utf8 = "€".repeat(85);
    write_file(&fx.path(&utf8), b"euro");
    assert_errno(
        File::create(fx.path(&format!("{utf8}x"))),
        libc::ENAMETOOLONG,
    );
    fs::rename(fx.path(&ok), fx.path("short")).unwrap();
    fs::rename(fx.path("short"), fx.path(&ok)).unwrap();
    assert_eq!(read_file(&fx.path(&ok)), b"max");
    // A symlink target of PATH_MAX - 1 bytes is kept whole.
    let target = format!("/{}", "t/".repeat(2047));
    symlink(&target, fx.path("longlink")).unwrap();
    assert_eq!(
        fs::read_link(fx.path("longlink"))
            .unwrap()
            .as_os_str()
            .len(),
        4095
    );
    assert_eq!(
        fs::read_link(fx.path("longlink"))
            .unwrap()
            .to_str()
            .unwrap(),
        target
    );
}

#[test]
fn symlink_loops_are_eloop() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-eloop");
    symlink("b", fx.path("a")).unwrap();
    symlink("a", fx.path("b")).unwrap();
    symlink("self", fx.path("self")).unwrap();
    for name in ["a", "b", "self"] {
        assert_errno(File::open(fx.path(name)), libc::ELOOP);
        assert_errno(fs::metadata(fx.path(name)), libc::ELOOP);
        assert!(fs::symlink_metadata(fx.path(name))
            .unwrap()
            .file_type()
            .is_symlink());
    }
    assert_errno(File::open(fx.path("a/x")), libc::ELOOP);
    assert_eq!(fs::read_link(fx.path("a")).unwrap(), Path::new("b"));
    // O_NOFOLLOW on a symlink: ELOOP.
    write_file(&fx.path("real"), b"r");
    symlink("real", fx.path("to-real")).unwrap();
    assert_errno(
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(fx.path("to-real")),
        libc::ELOOP,
    );
    assert_eq!(read_file(&fx.path("to-real")), b"r");
    // A chain of 40 links resolves; 41 is too many for Linux.
    let mut prev = "real".to_string();
    for i in 0..41 {
        let name = format!("chain{i}");
        symlink(&prev, fx.path(&name)).unwrap();
        prev = name;
    }
    assert_eq!(read_file(&fx.path("chain39")), b"r");
    assert_errno(File::open(fx.path("chain40")), libc::ELOOP);
    let m = fs::symlink_metadata(fx.path("to-real")).unwrap();
    assert_eq!(m.len(), 4);
    assert_eq!(m.permissions().mode() & 0o777, 0o777);
}

fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> std::io::Result<libc::c_int> {
    let (p, n) = (cstr(p), CString::new(name).unwrap());
    // SAFETY: valid C strings and a buffer of the given length.
    check(unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
}

fn getxattr(p: &Path, name: &str, size: usize) -> std::io::Result<Vec<u8>> {
    let (p, n) = (cstr(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; size];
    // SAFETY: buffer of `size` bytes (null when 0: a size query).
    let r = check_size(unsafe {
        libc::getxattr(
            p.as_ptr(),
            n.as_ptr(),
            if size == 0 {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            },
            size,
        )
    })?;
    buf.truncate(if size == 0 { 0 } else { r });
    if size == 0 {
        buf = vec![0; r];
    }
    Ok(buf)
}

fn listxattr(p: &Path, size: usize) -> std::io::Result<(usize, Vec<String>)> {
    let p = cstr(p);
    let mut buf = vec![0u8; size];
    // SAFETY: as getxattr.
    let r = check_size(unsafe {
        libc::listxattr(
            p.as_ptr(),
            if size == 0 {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            },
            size,
        )
    })?;
    let names = if size == 0 {
        Vec::new()
    } else {
        buf[..r]
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8(s.to_vec()).unwrap())
            .collect()
    };
    Ok((r, names))
}

fn removexattr(p: &Path, name: &str) -> std::io::Result<libc::c_int> {
    let (p, n) = (cstr(p), CString::new(name).unwrap());
    // SAFETY: valid C strings.
    check(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) })
}

#[test]
fn user_xattrs() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("posix-xattr");
    let f = fx.path("f");
    write_file(&f, b"");
    fs::create_dir(fx.path("d")).unwrap();
    assert_eq!(listxattr(&f, 0).unwrap().0, 0);
    assert_errno(getxattr(&f, "user.missing", 64), libc::ENODATA);
    setxattr(&f, "user.a", b"alpha", 0).unwrap();
    setxattr(&f, "user.empty", b"", 0).unwrap();
    let big = pattern(3000, 9);
    setxattr(&f, "user.big", &big, 0).unwrap();
    assert_eq!(getxattr(&f, "user.a", 64).unwrap(), b"alpha");
    assert_eq!(getxattr(&f, "user.empty", 64).unwrap(), b"");
    assert_eq!(
        getxattr(&f, "user.big", 0).unwrap().len(),
        3000,
        "size query"
    );
    assert_eq!(getxattr(&f, "user.big", 4096).unwrap(), big);
    // Buffers too small: ERANGE.
    assert_errno(getxattr(&f, "user.a", 3), libc::ERANGE);
    let (len, _) = listxattr(&f, 0).unwrap();
    assert_eq!(len, "user.a\0user.empty\0user.big\0".len());
    assert_errno(listxattr(&f, len - 1), libc::ERANGE);
    let names: BTreeSet<String> = listxattr(&f, len).unwrap().1.into_iter().collect();
    assert_eq!(
        names,
        BTreeSet::from(["user.a".into(), "user.empty".into(), "user.big".into()])
    );
    // XATTR_CREATE / XATTR_REPLACE
    assert_errno(
        setxattr(&f, "user.a", b"x", libc::XATTR_CREATE),
        libc::EEXIST,
    );
    assert_errno(
        setxattr(&f, "user.new", b"x", libc::XATTR_REPLACE),
        libc::ENODATA,
    );
    setxattr(&f, "user.a", b"replaced", libc::XATTR_REPLACE).unwrap();
    setxattr(&f, "user.new", b"created", libc::XATTR_CREATE).unwrap();
    assert_eq!(getxattr(&f, "user.a", 64).unwrap(), b"replaced");
    // Remove.
    removexattr(&f, "user.new").unwrap();
    assert_errno(removexattr(&f, "user.new"), libc::ENODATA);
    assert_errno(getxattr(&f, "user.new", 64), libc::ENODATA);
    // Names: too long, and namespaces the kernel refuses for user files.
    assert_errno(
        setxattr(&f, &format!("user.{}", "n".repeat(251)), b"", 0),
        libc::ERANGE,
    );
    assert_errno(setxattr(&f, "nonamespace", b"", 0), libc::EOPNOTSUPP);
    // Values over the VFS limit: E2BIG.
    assert_errno(setxattr(&f, "user.huge", &vec![0u8; 65537], 0), libc::E2BIG);
    // Directories carry xattrs too; symlinks may not carry user.* ones.
    setxattr(&fx.path("d"), "user.dir", b"on a dir", 0).unwrap();
    symlink("f", fx.path("l")).unwrap();
    let (l, n) = (cstr(&fx.path("l")), CString::new("user.x").unwrap());
    // SAFETY: valid C strings and buffer.
    let rc = unsafe { libc::lsetxattr(l.as_ptr(), n.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!((rc, errno()), (-1, libc::EPERM));
    // trusted.* as root works.
    setxattr(&f, "trusted.t", b"root only", 0).unwrap();
    // Many attributes on one inode.
    for i in 0..200 {
        setxattr(
            &fx.path("d"),
            &format!("user.many{i}"),
            format!("value {i}").as_bytes(),
            0,
        )
        .unwrap();
    }
    fx.remount();
    let f = fx.path("f");
    assert_eq!(getxattr(&f, "user.a", 64).unwrap(), b"replaced");
    assert_eq!(getxattr(&f, "user.big", 4096).unwrap(), big);
    assert_eq!(getxattr(&f, "trusted.t", 64).unwrap(), b"root only");
    assert_eq!(
        getxattr(&fx.path("d"), "user.many123", 64).unwrap(),
        b"value 123"
    );
    assert_eq!(listxattr(&fx.path("d"), 65536).unwrap().1.len(), 201);
}

fn fallocate(f: &File, mode: i32, off: i64, len: i64) -> std::io::Result<libc::c_int> {
    // SAFETY: fallocate on an open fd.
    check(unsafe { libc::fallocate(f.as_raw_fd(), mode, off, len) })
}

#[test]
fn fallocate_modes() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("posix-fallocate");
    let p = fx.path("f");
    const MIB: i64 = 1 << 20;
    {
        use std::os::unix::fs::FileExt;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        // Mode 0: the file grows, reads zeros, and has blocks.
        fallocate(&f, 0, 0, 2 * MIB).unwrap();
        let m = f.metadata().unwrap();
        assert_eq!(m.len(), 2 * MIB as u64);
        assert!(m.blocks() * 512 >= 2 * MIB as u64, "blocks {}", m.blocks());
        let mut buf = vec![1u8; 65536];
        f.read_exact_at(&mut buf, MIB as u64).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        // KEEP_SIZE: blocks, no size change.
        fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 2 * MIB, 2 * MIB).unwrap();
        let m = f.metadata().unwrap();
        assert_eq!(m.len(), 2 * MIB as u64);
        assert!(m.blocks() * 512 >= 4 * MIB as u64, "blocks {}", m.blocks());
        // Writing into preallocated space, then punching a hole in it.
        f.write_all_at(&[0x55; 3 * 65536], 0).unwrap();
        fallocate(
            &f,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            1000,
            65536,
        )
        .unwrap();
        let mut back = vec![0u8; 3 * 65536];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back[..1000].iter().all(|&b| b == 0x55));
        assert!(
            back[1000..66536].iter().all(|&b| b == 0),
            "punched range not zero"
        );
        assert!(back[66536..].iter().all(|&b| b == 0x55));
        assert_eq!(f.metadata().unwrap().len(), 2 * MIB as u64);
        // PUNCH_HOLE without KEEP_SIZE is invalid (the VFS says so).
        assert_errno(
            fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE, 0, 4096),
            libc::EOPNOTSUPP,
        );
        // ZERO_RANGE: the range reads as zeros, the size stays.
        fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 2 * MIB - 4096, 4096).unwrap();
        let mut zeroed = vec![0xffu8; 4096];
        f.read_exact_at(&mut zeroed, (2 * MIB - 4096) as u64)
            .unwrap();
        assert!(zeroed.iter().all(|&b| b == 0));
        assert_eq!(f.metadata().unwrap().len(), 2 * MIB as u64);
        // posix_fallocate beyond EOF grows the file.
        // SAFETY: on an open fd.
        assert_eq!(
            unsafe { libc::posix_fallocate(f.as_raw_fd(), 3 * MIB, MIB) },
            0
        );
        assert_eq!(f.metadata().unwrap().len(), 4 * MIB as u64);
        f.sync_all().unwrap();
    }
    fx.remount();
    let data = read_file(&p);
    assert_eq!(data.len() as i64, 4 * MIB);
    assert!(data[1000..66536].iter().all(|&b| b == 0));
    assert!(data[66536..3 * 65536].iter().all(|&b| b == 0x55));
    assert!(data[3 * 65536..].iter().all(|&b| b == 0));
}

#[test]
fn mknod_fifo_and_devices() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("posix-mknod");
    let fifo = cstr(&fx.path("fifo"));
    // SAFETY: a valid C string.
    assert_eq!(
        unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) },
        0,
        "mkfifo: {}",
        std::io::Error::last_os_error()
    );
    let m = fs::symlink_metadata(fx.path("fifo")).unwrap();
    assert!(m.file_type().is_fifo());
    assert_eq!(m.permissions().mode() & 0o777, 0o640);
    // A fifo on the mount is a real pipe (the kernel's).
    let mut rw = OpenOptions::new()
        .read(true)
        .write(true)
        .open(fx.path("fifo"))
        .unwrap();
    rw.write_all(b"through the pipe").unwrap();
    let mut buf = [0u8; 16];
    rw.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"through the pipe");
    drop(rw);
    // A character device node (root may make one).
    let dev = cstr(&fx.path("null"));
    // SAFETY: a valid C string.
    assert_eq!(
        unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) },
        0,
        "mknod: {}",
        std::io::Error::last_os_error()
    );
    let sock = cstr(&fx.path("sock"));
    // SAFETY: a valid C string.
    assert_eq!(
        unsafe { libc::mknod(sock.as_ptr(), libc::S_IFSOCK | 0o600, 0) },
        0
    );
    fx.remount();
    assert!(fs::symlink_metadata(fx.path("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    let m = fs::symlink_metadata(fx.path("null")).unwrap();
    assert!(m.file_type().is_char_device());
    assert_eq!(m.rdev(), libc::makedev(1, 3));
    // The node opens the device it names (the mount allows devices).
    write_file(&fx.path("null"), b"discarded");
    assert!(fs::symlink_metadata(fx.path("sock"))
        .unwrap()
        .file_type()
        .is_socket());
}

fn utimens(
    p: &Path,
    atime: libc::timespec,
    mtime: libc::timespec,
    flags: i32,
) -> std::io::Result<libc::c_int> {
    let p = cstr(p);
    let times = [atime, mtime];
    // SAFETY: a valid C string and two timespecs.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), flags) })
}

fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

#[test]
fn chmod_chown_utimensat_with_nanoseconds() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("posix-attrs");
    let p = fx.path("f");
    write_file(&p, b"attrs");
    let ctime0 = fs::metadata(&p).unwrap().ctime_nsec() as i128
        + fs::metadata(&p).unwrap().ctime() as i128 * 1_000_000_000;
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::set_permissions(&p, fs::Permissions::from_mode(0o4751)).unwrap();
    let m = fs::metadata(&p).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o4751);
    assert!(
        m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128 > ctime0,
        "chmod did not move ctime"
    );
    std::os::unix::fs::chown(&p, Some(1234), Some(5678)).unwrap();
    let m = fs::metadata(&p).unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 5678));
    // chown of a set-user-ID file clears the bit (as the kernel's filesystems do).
    assert_eq!(
        m.permissions().mode() & 0o7777,
        0o751,
        "chown kept set-user-ID"
    );
    // Nanosecond timestamps, before the epoch and far after 2038 too.
    utimens(
        &p,
        ts(1_234_567_890, 123_456_789),
        ts(1_600_000_000, 987_654_321),
        0,
    )
    .unwrap();
    let m = fs::metadata(&p).unwrap();
    assert_eq!((m.atime(), m.atime_nsec()), (1_234_567_890, 123_456_789));
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_600_000_000, 987_654_321));
    utimens(&fx.path("f"), ts(0, libc::UTIME_OMIT), ts(-1_000, 1), 0).unwrap();
    let m = fs::metadata(&p).unwrap();
    assert_eq!(
        (m.atime(), m.atime_nsec()),
        (1_234_567_890, 123_456_789),
        "UTIME_OMIT changed atime"
    );
    assert_eq!((m.mtime(), m.mtime_nsec()), (-1_000, 1));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    utimens(&p, ts(0, libc::UTIME_NOW), ts(4_102_444_800, 5), 0).unwrap();
    let m = fs::metadata(&p).unwrap();
    assert!((m.atime() - now).abs() < 60, "UTIME_NOW gave {}", m.atime());
    assert_eq!((m.mtime(), m.mtime_nsec()), (4_102_444_800, 5));
    // On a symlink itself (AT_SYMLINK_NOFOLLOW).
    symlink("f", fx.path("l")).unwrap();
    utimens(
        &fx.path("l"),
        ts(100, 1),
        ts(200, 2),
        libc::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    let lm = fs::symlink_metadata(fx.path("l")).unwrap();
    assert_eq!((lm.mtime(), lm.mtime_nsec()), (200, 2));
    assert_eq!(
        fs::metadata(&p).unwrap().mtime(),
        4_102_444_800,
        "followed the symlink"
    );
    // lchown.
    std::os::unix::fs::lchown(fx.path("l"), Some(42), Some(43)).unwrap();
    assert_eq!(fs::symlink_metadata(fx.path("l")).unwrap().uid(), 42);
    // A directory keeps set-group-ID through chown; new entries inherit its group.
    fs::create_dir(fx.path("sgid")).unwrap();
    std::os::unix::fs::chown(fx.path("sgid"), None, Some(777)).unwrap();
    fs::set_permissions(fx.path("sgid"), fs::Permissions::from_mode(0o2775)).unwrap();
    write_file(&fx.path("sgid/child"), b"");
    fs::create_dir(fx.path("sgid/subdir")).unwrap();
    assert_eq!(fs::metadata(fx.path("sgid/child")).unwrap().gid(), 777);
    assert_eq!(fs::metadata(fx.path("sgid/subdir")).unwrap().gid(), 777);
    assert_eq!(
        fs::metadata(fx.path("sgid/subdir"))
            .unwrap()
            .permissions()
            .mode()
            & 0o2000,
        0o2000
    );
    let before: Vec<_> = ["f", "l", "sgid/child"]
        .iter()
        .map(|n| stat_tuple(&fx.path(n)))
        .collect();
    fx.remount();
    let after: Vec<_> = ["f", "l", "sgid/child"]
        .iter()
        .map(|n| stat_tuple(&fx.path(n)))
        .collect();
    assert_eq!(before, after, "attributes changed across a remount");
}

/// Everything `stat` says that a remount must keep.
fn stat_tuple(p: &Path) -> (u32, u32, u32, u64, i64, i64, i64, i64, i64, i64, u64) {
    let m = fs::symlink_metadata(p).unwrap();
    (
        m.mode(),
        m.uid(),
        m.gid(),
        m.size(),
        m.atime(),
        m.atime_nsec(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
        m.nlink(),
    )
}

/// Regression: with the writeback cache the kernel stamps mtime at
/// write(2) time; the engine stamped its own "now" when the cached pages
/// reached it, so after a remount (the kernel's cached inode gone) stat
/// showed a different mtime than before.
#[test]
fn mtime_of_a_cached_write_survives_a_remount() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("posix-mtime");
    let mut seen = Vec::new();
    for i in 0..20 {
        let p = fx.path(&format!("f{i}"));
        write_file(&p, b"first");
        // O_TRUNC then a write: the truncate's SETATTR carries the
        // kernel's time; the write's page reaches birch later.
        let mut f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        f.write_all(&pattern(10_000 * i + 1, 3)).unwrap();
        drop(f);
        seen.push(stat_tuple(&p));
    }
    fx.remount();
    for (i, before) in seen.iter().enumerate() {
        assert_eq!(
            &stat_tuple(&fx.path(&format!("f{i}"))),
            before,
            "f{i} changed across a remount"
        );
    }
}

#[test]
fn truncate_grows_and_shrinks() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("posix-truncate");
    let p = fx.path("f");
    let data = pattern(100_000, 4);
    write_file(&p, &data);
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    f.set_len(5_000).unwrap();
    assert_eq!(read_file(&p), &data[..5_000]);
    f.set_len(20_001).unwrap();
    let back = read_file(&p);
    assert_eq!(back.len(), 20_001);
    assert_eq!(&back[..5_000], &data[..5_000]);
    assert!(
        back[5_000..].iter().all(|&b| b == 0),
        "grown part is not zero"
    );
    f.sync_all().unwrap();
    // Shrink inside a page after the data reached the disk, then grow.
    f.set_len(4_097).unwrap();
    f.set_len(8_192).unwrap();
    let back = read_file(&p);
    assert_eq!(&back[..4_097], &data[..4_097]);
    assert!(back[4_097..].iter().all(|&b| b == 0));
    // truncate(2) by path, to zero and to a small inline size.
    fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(0)
        .unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
    let pc = cstr(&p);
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::truncate(pc.as_ptr(), 300) }, 0);
    assert_eq!(read_file(&p), vec![0u8; 300]);
    // Negative and directory truncates fail.
    // SAFETY: as above.
    assert_eq!(
        (unsafe { libc::truncate(pc.as_ptr(), -1) }, errno()),
        (-1, libc::EINVAL)
    );
    let dc = cstr(&fx.mnt);
    // SAFETY: as above.
    assert_eq!(
        (unsafe { libc::truncate(dc.as_ptr(), 0) }, errno()),
        (-1, libc::EISDIR)
    );
    drop(f);
    // A small file, grown by truncate and written at the end.
    write_file(&fx.path("small"), b"abc");
    let s = OpenOptions::new()
        .write(true)
        .open(fx.path("small"))
        .unwrap();
    s.set_len(10_000).unwrap();
    use std::os::unix::fs::FileExt;
    s.write_all_at(b"end", 9_997).unwrap();
    drop(s);
    fx.remount();
    let back = read_file(&fx.path("small"));
    assert_eq!(back.len(), 10_000);
    assert_eq!(&back[..3], b"abc");
    assert!(back[3..9_997].iter().all(|&b| b == 0));
    assert_eq!(&back[9_997..], b"end");
    assert_eq!(read_file(&fx.path("f")), vec![0u8; 300]);
}

#[test]
fn permission_checks_as_an_unprivileged_user() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-perms");
    let p = |s: &str| fx.path(s);
    // Root's private directory and file; a public directory; a sticky one.
    fs::create_dir(p("private")).unwrap();
    fs::set_permissions(p("private"), fs::Permissions::from_mode(0o700)).unwrap();
    write_file(&p("private/secret"), b"s");
    write_file(&p("rootfile"), b"r");
    fs::set_permissions(p("rootfile"), fs::Permissions::from_mode(0o600)).unwrap();
    write_file(&p("readable"), b"public");
    fs::set_permissions(p("readable"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::create_dir(p("public")).unwrap();
    fs::set_permissions(p("public"), fs::Permissions::from_mode(0o777)).unwrap();
    fs::create_dir(p("sticky")).unwrap();
    fs::set_permissions(p("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    write_file(&p("sticky/roots"), b"");
    fs::set_permissions(p("sticky/roots"), fs::Permissions::from_mode(0o666)).unwrap();
    fs::create_dir(p("readonly-dir")).unwrap();
    fs::set_permissions(p("readonly-dir"), fs::Permissions::from_mode(0o755)).unwrap();

    let c = |s: &str| cstr(&p(s));
    let (private, secret, rootfile, readable) = (
        c("private"),
        c("private/secret"),
        c("rootfile"),
        c("readable"),
    );
    let (mine, mine_dir, sticky_roots, in_ro) = (
        c("public/mine"),
        c("public/mydir"),
        c("sticky/roots"),
        c("readonly-dir/new"),
    );
    // SAFETY (all closures): system calls on valid C strings in the child.
    let open = |path: &CString, flags: i32| {
        let path = path.as_ptr();
        move || unsafe {
            let fd = libc::open(path, flags | libc::O_CLOEXEC, 0o644);
            let e = rc_errno(fd);
            if fd >= 0 {
                libc::close(fd);
            }
            e
        }
    };
    // Denied.
    assert_eq!(
        as_nobody(open(&secret, libc::O_RDONLY)),
        libc::EACCES,
        "file in a 0700 dir"
    );
    assert_eq!(
        as_nobody(open(&rootfile, libc::O_RDONLY)),
        libc::EACCES,
        "0600 file"
    );
    assert_eq!(
        as_nobody(open(&readable, libc::O_WRONLY)),
        libc::EACCES,
        "write to a 0644 file"
    );
    assert_eq!(
        as_nobody(open(&in_ro, libc::O_CREAT | libc::O_WRONLY)),
        libc::EACCES,
        "create in a 0755 dir"
    );
    assert_eq!(
        as_nobody(open(&private, libc::O_RDONLY | libc::O_DIRECTORY)),
        libc::EACCES,
        "list a 0700 dir"
    );
    let secret_ptr = secret.as_ptr();
    assert_eq!(
        as_nobody(|| unsafe { rc_errno(libc::access(secret_ptr, libc::F_OK)) }),
        libc::EACCES,
        "search a 0700 dir"
    );
    let root_ptr = rootfile.as_ptr();
    assert_eq!(
        as_nobody(|| unsafe { rc_errno(libc::chmod(root_ptr, 0o777)) }),
        libc::EPERM,
        "chmod of root's file"
    );
    assert_eq!(
        as_nobody(|| unsafe { rc_errno(libc::chown(root_ptr, NOBODY, NOBODY)) }),
        libc::EPERM,
        "chown of root's file"
    );
    assert_eq!(
        as_nobody(|| unsafe { rc_errno(libc::unlink(root_ptr)) }),
        libc::EACCES,
        "unlink in root's 0755 dir"
    );
    let sticky_ptr = sticky_roots.as_ptr();
    assert_eq!(
        as_nobody(|| unsafe { rc_errno(libc::unlink(sticky_ptr)) }),
        libc::EPERM,
        "unlink of root's file in a sticky dir"
    );
    let times_ptr = readable.as_ptr();
    let set_times = [ts(1, 0), ts(1, 0)];
    let times = set_times.as_ptr();
    assert_eq!(
        as_nobody(|| unsafe { rc_errno(libc::utimensat(libc::AT_FDCWD, times_ptr, times, 0)) }),
        libc::EPERM,
        "set times of root's file"
    );
    // Allowed.
    assert_eq!(
        as_nobody(open(&readable, libc::O_RDONLY)),
        0,
        "read a 0644 file"
    );
    assert_eq!(
        as_nobody(open(&mine, libc::O_CREAT | libc::O_WRONLY)),
        0,
        "create in a 0777 dir"
    );
    let mine_dir_ptr = mine_dir.as_ptr();
    assert_eq!(
        as_nobody(|| unsafe { rc_errno(libc::mkdir(mine_dir_ptr, 0o700)) }),
        0,
        "mkdir in a 0777 dir"
    );
    let mine_ptr = mine.as_ptr();
    assert_eq!(
        as_nobody(|| unsafe { rc_errno(libc::chmod(mine_ptr, 0o600)) }),
        0,
        "chmod of one's own file"
    );
    assert_eq!(
        as_nobody(open(&sticky_roots, libc::O_WRONLY)),
        0,
        "write a 0666 file"
    );
    let m = fs::metadata(p("public/mine")).unwrap();
    assert_eq!(
        (m.uid(), m.gid(), m.mode() & 0o777),
        (NOBODY, NOBODY, 0o600),
        "owner of a file created by nobody"
    );
    assert_eq!(fs::metadata(p("public/mydir")).unwrap().uid(), NOBODY);
    // Root is not held back by mode bits.
    assert_eq!(read_file(&p("public/mine")), b"");
    // The unprivileged owner cannot give the file away, nor set a group it is not in.
    assert_eq!(
        as_nobody(|| unsafe { rc_errno(libc::chown(mine_ptr, 0, u32::MAX)) }),
        libc::EPERM
    );
    assert_eq!(
        as_nobody(|| unsafe { rc_errno(libc::chown(mine_ptr, u32::MAX, 0)) }),
        libc::EPERM
    );
    // A write by a non-owner clears set-user-ID.
    write_file(&p("public/suid"), b"x");
    fs::set_permissions(p("public/suid"), fs::Permissions::from_mode(0o4777)).unwrap();
    let suid = c("public/suid");
    let suid_ptr = suid.as_ptr();
    assert_eq!(
        as_nobody(|| unsafe {
            let fd = libc::open(suid_ptr, libc::O_WRONLY | libc::O_APPEND);
            if fd < 0 {
                return rc_errno(fd);
            }
            let r = libc::write(fd, b"y".as_ptr().cast(), 1);
            let e = if r == 1 { 0 } else { rc_errno(-1) };
            libc::fsync(fd);
            libc::close(fd);
            e
        }),
        0
    );
    assert_eq!(
        fs::metadata(p("public/suid")).unwrap().permissions().mode() & 0o7777,
        0o777,
        "write by another user kept set-user-ID"
    );
}

#[test]
fn readdir_while_the_directory_changes() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-readdir");
    let dir = fx.path("d");
    fs::create_dir(&dir).unwrap();
    // Interleaved: names that stay, names removed during the listing.
    const N: usize = 3000;
    for i in 0..N {
        write_file(
            &dir.join(format!("keep-{i:05}-{}", "k".repeat(i % 40))),
            b"",
        );
    }
    for round in 0..3 {
        // Names interleaved with the unchanged ones, removed during the
        // listing in an order unrelated to the listing's.
        let mut to_remove = Vec::new();
        for i in (0..N).step_by(3) {
            let name = format!("gone-{round}-{i:05}");
            write_file(&dir.join(&name), b"");
            to_remove.push(name);
        }
        to_remove.reverse();
        let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut it = fs::read_dir(&dir).unwrap();
        let mut count = 0;
        let mut added = 0;
        let mut removed = BTreeSet::new();
        for e in it.by_ref() {
            let name = e.unwrap().file_name().as_bytes().to_vec();
            *seen.entry(name).or_default() += 1;
            count += 1;
            if count % 50 == 0 {
                // Add and remove entries while the listing is under way.
                for _ in 0..10 {
                    write_file(&dir.join(format!("new-{round}-{added:05}")), b"");
                    added += 1;
                }
                for _ in 0..7 {
                    if let Some(g) = to_remove.pop() {
                        fs::remove_file(dir.join(&g)).unwrap();
                        removed.insert(g.into_bytes());
                    }
                }
            }
        }
        let dups: Vec<_> = seen
            .iter()
            .filter(|(_, &n)| n > 1)
            .map(|(k, n)| (String::from_utf8_lossy(k).into_owned(), *n))
            .collect();
        assert!(dups.is_empty(), "round {round}: duplicates {dups:?}");
        for i in 0..N {
            let name = format!("keep-{i:05}-{}", "k".repeat(i % 40));
            assert!(
                seen.contains_key(name.as_bytes()),
                "round {round}: unchanged entry {name} missing from the listing"
            );
        }
        assert!(!removed.is_empty() && added > 0);
        // A fresh listing is exact.
        let now: BTreeSet<Vec<u8>> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        for r in &removed {
            assert!(!now.contains(r), "removed entry still listed");
        }
        assert_eq!(now.iter().filter(|n| n.starts_with(b"keep-")).count(), N);
        assert_eq!(
            now.iter()
                .filter(|n| n.starts_with(format!("new-{round}-").as_bytes()))
                .count(),
            added
        );
    }
    // "." and ".." come first, once each.
    let names = raw_listing(&dir);
    assert_eq!(names.iter().filter(|n| *n == ".").count(), 1);
    assert_eq!(names.iter().filter(|n| *n == "..").count(), 1);
}

/// generic/676: telldir's values grow along a listing, and seekdir to
/// any value continues with the first entry whose telldir value is at
/// least that value (btrfs's semantics: an entry sits at its DIR_INDEX, a
/// seek continues from the next index at or above it); below the first
/// entry's value comes "..", past the last entry the end of the directory.
#[test]
fn seekdir_to_any_position_continues_with_the_next_entry() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-seekdir");
    let dir = fx.path("d");
    fs::create_dir(&dir).unwrap();
    for i in 0..60 {
        write_file(&dir.join(format!("f{i:02}")), b"");
    }
    // Gaps between the dir indexes that are left.
    for i in (0..60).step_by(6) {
        fs::remove_file(dir.join(format!("f{i:02}"))).unwrap();
    }
    let d = DirStream::open(&dir);
    // (telldir before the entry, the entry), then the value at the end.
    let mut listing: Vec<(i64, String)> = Vec::new();
    loop {
        let at = d.tell();
        match d.read() {
            Some(name) => listing.push((at, name)),
            None => {
                listing.push((at, String::new()));
                break;
            }
        }
    }
    assert_eq!(listing.len(), 50 + 2 + 1, "{listing:?}");
    assert_eq!(listing[0], (0, ".".to_string()));
    assert_eq!(listing[1].1, "..");
    for w in listing.windows(2) {
        assert!(w[0].0 < w[1].0, "telldir does not grow: {listing:?}");
    }
    for w in listing.windows(2) {
        let ((low, _), (high, entry)) = (&w[0], &w[1]);
        let expected = (!entry.is_empty()).then(|| entry.clone());
        for to in [low + 1, low + (high - low) / 2, high - 1, *high] {
            if to > *low {
                d.seek(to);
                assert_eq!(d.read(), expected, "seekdir({to}) between {low} and {high}");
            }
        }
    }
    for (at, entry) in &listing[..listing.len() - 1] {
        d.seek(*at);
        assert_eq!(d.read().as_ref(), Some(entry), "seekdir({at})");
    }
    let end = listing.last().unwrap().0;
    for to in [end + 1, end + 12345, i64::MAX] {
        d.seek(to);
        assert_eq!(d.read(), None, "seekdir({to}) past the end");
    }
    // Below every value but 0 (generic/676 seeks to random values this
    // small): "..", then the rest in order.
    for to in [1, 2, 12345, 1 << 40] {
        d.seek(to);
        assert_eq!(d.read().as_deref(), Some(".."), "seekdir({to})");
        let rest: Vec<String> = std::iter::from_fn(|| d.read()).collect();
        assert_eq!(rest.len(), 50, "seekdir({to}) then the rest");
    }
}

/// A libc directory stream (opendir, readdir, telldir, seekdir), closed
/// when dropped, also by a failed assertion (an open stream would keep the
/// mount busy at teardown).
struct DirStream(*mut libc::DIR);

impl DirStream {
    fn open(dir: &Path) -> DirStream {
        let c = cstr(dir);
        // SAFETY: a valid C string.
        let d = unsafe { libc::opendir(c.as_ptr()) };
        assert!(!d.is_null(), "opendir {}", dir.display());
        DirStream(d)
    }

    /// The next name, None at the end of the directory.
    fn read(&self) -> Option<String> {
        // SAFETY: an open stream; the entry is copied before the next
        // readdir can overwrite it.
        unsafe {
            *libc::__errno_location() = 0;
            let e = libc::readdir(self.0);
            if e.is_null() {
                assert_eq!(errno(), 0, "readdir failed");
                return None;
            }
            Some(
                std::ffi::CStr::from_ptr((*e).d_name.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
            )
        }
    }

    fn tell(&self) -> i64 {
        // SAFETY: an open stream.
        unsafe { libc::telldir(self.0) }
    }

    fn seek(&self, to: i64) {
        // SAFETY: an open stream.
        unsafe { libc::seekdir(self.0, to) }
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        // SAFETY: opened by DirStream::open, closed only here.
        unsafe { libc::closedir(self.0) };
    }
}

/// Every name `readdir(3)` returns, "." and ".." included.
fn raw_listing(dir: &Path) -> Vec<String> {
    let c = cstr(dir);
    let mut out = Vec::new();
    // SAFETY: opendir/readdir/closedir on a valid path; entries are read
    // before the next readdir call.
    unsafe {
        let d = libc::opendir(c.as_ptr());
        assert!(!d.is_null());
        loop {
            let e = libc::readdir(d);
            if e.is_null() {
                break;
            }
            out.push(
                std::ffi::CStr::from_ptr((*e).d_name.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        libc::closedir(d);
    }
    out
}

fn statvfs(p: &Path) -> libc::statvfs {
    let c = cstr(p);
    // SAFETY: a valid C string and an out struct.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(c.as_ptr(), &mut s), 0);
        s
    }
}

#[test]
fn statfs_reports_real_counts() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-statfs");
    let s = statvfs(&fx.mnt);
    let total = s.f_blocks * s.f_frsize;
    assert!(total > 900 << 20 && total <= 1 << 30, "size {total}");
    assert!(s.f_bfree > 0 && s.f_bavail > 0 && s.f_bavail <= s.f_bfree && s.f_bfree <= s.f_blocks);
    assert_eq!(s.f_namemax, 255);
    assert!(s.f_files > 0 && s.f_ffree > 0);
    let free_before = s.f_bfree * s.f_frsize;
    let mut f = File::create(fx.path("fill")).unwrap();
    for _ in 0..64 {
        f.write_all(&[7u8; 1 << 20]).unwrap();
    }
    f.sync_all().unwrap();
    let s = statvfs(&fx.mnt);
    let free_after = s.f_bfree * s.f_frsize;
    assert!(
        free_before - free_after >= 60 << 20,
        "64 MiB written, free went from {free_before} to {free_after}"
    );
    drop(f);
    // df shows it with a real size.
    let out = common::run_ok(
        std::process::Command::new("df")
            .arg("-P")
            .arg("-B1")
            .arg(&fx.mnt),
    );
    let text = common::text(&out.stdout);
    let line = text
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("df printed {text}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert!(
        cols[1].parse::<u64>().unwrap() > 0 && cols[2].parse::<u64>().unwrap() >= 60 << 20,
        "df: {line}"
    );
    assert_eq!(cols[5], fx.mnt.to_str().unwrap());
    // Space comes back when the file goes (after the commit that frees it).
    fs::remove_file(fx.path("fill")).unwrap();
    fx.sync();
    let s = statvfs(&fx.mnt);
    assert!(
        s.f_bfree * s.f_frsize >= free_before - (4 << 20),
        "space not returned: {} < {free_before}",
        s.f_bfree * s.f_frsize
    );
}

/// A description of a tree that a remount must reproduce exactly: per path
/// its type, mode, owner, size, times, link count, content digest, link
/// target and xattrs; and which paths share an inode.
fn manifest(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, String> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let m = fs::symlink_metadata(&path).unwrap();
            let mut d = format!(
                "mode {:o} uid {} gid {} nlink {} mtime {}.{:09} ",
                m.mode(),
                m.uid(),
                m.gid(),
                m.nlink(),
                m.mtime(),
                m.mtime_nsec()
            );
            if m.is_file() {
                let data = read_file(&path);
                d += &format!("size {} digest {:016x}", data.len(), fnv(&data));
            } else if m.file_type().is_symlink() {
                d += &format!("-> {}", fs::read_link(&path).unwrap().display());
            } else if m.is_dir() {
                stack.push(path.clone());
            }
            if !m.file_type().is_symlink() {
                let (len, mut names) = listxattr(&path, 65536).unwrap();
                names.sort();
                if len > 0 {
                    for n in names {
                        d += &format!(
                            " xattr {n}={:016x}",
                            fnv(&getxattr(&path, &n, 65536).unwrap())
                        );
                    }
                }
            }
            if !m.is_dir() && m.nlink() > 1 {
                let first = inodes.entry(m.ino()).or_insert_with(|| rel.clone());
                d += &format!(" same-inode-as {first}");
            }
            out.insert(rel, d);
        }
    }
    out
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

#[test]
fn remount_keeps_everything() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("posix-remount");
    let mnt = fx.mnt.clone();
    let p = |s: &str| mnt.join(s);
    for d in ["a", "a/b", "a/b/c", "empty", "many"] {
        fs::create_dir(p(d)).unwrap();
    }
    write_file(&p("tiny"), b"x");
    write_file(&p("a/inline"), &pattern(2000, 1));
    write_file(&p("a/b/page"), &pattern(4096, 2));
    write_file(&p("a/b/c/big"), &pattern(3 << 20, 3));
    write_file(&p("a/odd"), &pattern(123_457, 4));
    File::create(p("zero")).unwrap();
    fs::hard_link(p("a/odd"), p("a/b/odd-link")).unwrap();
    symlink("a/b/c/big", p("sym")).unwrap();
    symlink("/nowhere", p("dangling")).unwrap();
    setxattr(&p("a/odd"), "user.k", b"v", 0).unwrap();
    setxattr(&p("a"), "user.dir", b"d", 0).unwrap();
    for i in 0..500 {
        write_file(&p(&format!("many/f{i}")), format!("file {i}").as_bytes());
    }
    let fifo = cstr(&p("fifo"));
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::chown(p("tiny"), Some(1000), Some(1001)).unwrap();
    fs::set_permissions(p("tiny"), fs::Permissions::from_mode(0o640)).unwrap();
    utimens(&p("a/inline"), ts(1000, 1), ts(2000, 2), 0).unwrap();
    // Removed things stay removed.
    write_file(&p("removed"), b"gone");
    fs::remove_file(p("removed")).unwrap();
    fs::create_dir(p("removed-dir")).unwrap();
    fs::remove_dir(p("removed-dir")).unwrap();
    let before = manifest(&fx.mnt);
    let root_before = stat_tuple(&fx.mnt);
    fx.unmount();
    fx.assert_clean();
    fx.mount();
    let after = manifest(&fx.mnt);
    for (k, v) in &before {
        assert_eq!(after.get(k), Some(v), "{k} differs after remount");
    }
    assert_eq!(
        before.len(),
        after.len(),
        "entries appeared: {:?}",
        after
            .keys()
            .filter(|k| !before.contains_key(*k))
            .collect::<Vec<_>>()
    );
    assert_eq!(root_before, stat_tuple(&fx.mnt));
    // And once more, after changes made on the remounted filesystem.
    fs::remove_dir_all(p("many")).unwrap();
    write_file(&p("a/odd"), b"rewritten");
    let before = manifest(&fx.mnt);
    fx.remount();
    assert_eq!(before, manifest(&fx.mnt));
}

/// Regression: fuser's own mount(2) dropped the subtype, so the mount
/// showed up as plain "fuse" (and `findmnt -t fuse.birch` found nothing).
/// As root the mount is fuseblk, over the loop device the image is
/// attached to (mount_sync has the reasons).
#[test]
fn mount_is_listed_as_fuse_birch() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-fstype");
    assert_eq!(
        common::mount_fstype(&fx.mnt).as_deref(),
        Some("fuseblk.birch")
    );
    let out = common::run_ok(
        std::process::Command::new("findmnt")
            .args(["-n", "-o", "SOURCE", "-t", "fuseblk.birch"])
            .arg(&fx.mnt),
    );
    let source = common::text(&out.stdout).trim().to_string();
    assert!(source.starts_with("/dev/loop"), "{source}");
    let loop_name = source.trim_start_matches("/dev/");
    let backing = std::fs::read_to_string(format!("/sys/block/{loop_name}/loop/backing_file"))
        .expect("loop backing file");
    assert_eq!(backing.trim(), fx.image_str());
}

#[test]
fn birch_sync_commits_and_fsync_is_durable() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("posix-sync", "1G");
    // No periodic commit: only sync and fsync make things durable here.
    fx.options = vec!["commit=0".into()];
    fx.mount();
    let g0 = fx.generation();
    write_file(&fx.path("synced"), &pattern(50_000, 5));
    fx.sync();
    let g1 = fx.generation();
    assert!(
        g1 > g0,
        "birch sync did not commit: generation {g0} -> {g1}"
    );
    // fsync of a file and of a directory.
    let mut f = File::create(fx.path("fsynced")).unwrap();
    f.write_all(b"fsync makes this durable").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::create_dir(fx.path("dir")).unwrap();
    write_file(&fx.path("dir/entry"), b"e");
    File::open(fx.path("dir/entry"))
        .unwrap()
        .sync_all()
        .unwrap();
    File::open(fx.path("dir")).unwrap().sync_all().unwrap();
    // A change nobody synced.
    write_file(&fx.path("unsynced"), b"may be lost");
    // Power cut: kill the daemon. What was synced is there, the image is clean.
    fx.kill_daemon();
    fx.assert_clean();
    fx.mount();
    assert_eq!(read_file(&fx.path("synced")), pattern(50_000, 5));
    assert_eq!(read_file(&fx.path("fsynced")), b"fsync makes this durable");
    assert_eq!(read_file(&fx.path("dir/entry")), b"e");
    // birch sync on a non-birch path fails.
    let out = common::birch(&["sync", "/tmp"]);
    assert!(!out.status.success());
}

/// `setfacl`/`getfacl` on the mount, as `args` in `dir`; fails the test if
/// the tool does.
fn acl_tool(dir: &Path, program: &str, args: &[&str]) -> String {
    let out = common::run_ok(
        std::process::Command::new(program)
            .args(args)
            .current_dir(dir),
    );
    text(&out.stdout)
}

/// Whether nobody may open `path` for reading: 0, or the errno.
fn nobody_opens(path: &Path) -> i32 {
    let c = cstr(path);
    as_nobody(|| {
        // SAFETY: a valid C string; the descriptor dies with the child.
        rc_errno(unsafe { libc::open(c.as_ptr(), libc::O_RDONLY) })
    })
}

/// POSIX ACLs are enforced by the kernel (FUSE_POSIX_ACL): a named user
/// entry grants nobody a 0600 file, the mask takes it back, and chmod
/// rewrites the mask (docs/FUSE.md, "POSIX ACLs").
#[test]
fn posix_acl_grants_access_and_the_mask_limits_it() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-acl-access");
    let dir = fx.path("");
    write_file(&fx.path("f"), b"secret");
    fs::set_permissions(fx.path("f"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(nobody_opens(&fx.path("f")), libc::EACCES);
    acl_tool(&dir, "setfacl", &["-m", "u:nobody:r", "f"]);
    assert_eq!(nobody_opens(&fx.path("f")), 0, "granted by the ACL");
    assert_eq!(fs::metadata(fx.path("f")).unwrap().mode() & 0o777, 0o640);
    acl_tool(&dir, "setfacl", &["-m", "m::-", "f"]);
    assert_eq!(nobody_opens(&fx.path("f")), libc::EACCES, "masked off");
    fs::set_permissions(fx.path("f"), fs::Permissions::from_mode(0o640)).unwrap();
    let listed = acl_tool(&dir, "getfacl", &["-c", "f"]);
    assert!(
        listed.contains("mask::r--"),
        "chmod sets the mask:\n{listed}"
    );
    assert_eq!(nobody_opens(&fx.path("f")), 0);
    // Removing the named entry leaves an ACL the mode says all of.
    acl_tool(&dir, "setfacl", &["-b", "f"]);
    let names = acl_tool(&dir, "getfattr", &["-d", "-m", "-", "f"]);
    assert!(!names.contains("posix_acl_access"), "{names}");
    assert_eq!(nobody_opens(&fx.path("f")), libc::EACCES);
}

/// `setfacl ARGS PATH` as uid 65534 with primary group `gid` and no
/// supplementary groups; fails the test if setfacl does.
fn setfacl_as_nobody(path: &Path, gid: u32, args: &[&str]) {
    use std::os::unix::process::CommandExt;
    common::run_ok(
        std::process::Command::new("setfacl")
            .args(args)
            .arg(path)
            .uid(NOBODY)
            .gid(gid),
    );
}

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path).unwrap().mode() & 0o7777
}

/// fstests generic/375: an access ACL set by a caller outside the file's
/// group and without CAP_FSETID clears set-group-ID, as the kernel's
/// posix_acl_update_mode does for a local filesystem; FUSE passes that as
/// FUSE_SETXATTR_ACL_KILL_SGID (docs/FUSE.md, "POSIX ACLs"). The owner in
/// the group, and root outside it, keep the bit; a default ACL changes no
/// mode.
#[test]
fn posix_acl_set_outside_the_group_clears_set_group_id() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("posix-acl-sgid");
    write_file(&fx.path("f"), b"x");
    fs::create_dir(fx.path("d")).unwrap();
    for name in ["f", "d"] {
        let path = fx.path(name);
        // Owned by nobody, group nogroup: nobody is in the group.
        std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o2755)).unwrap();
        setfacl_as_nobody(&path, NOBODY, &["-m", "u::rwx,g::rwx,o::rwx"]);
        assert_eq!(mode_of(&path), 0o2777, "{name}: owner in the group");
        // Group root: nobody is outside it.
        std::os::unix::fs::chown(&path, None, Some(0)).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o2755)).unwrap();
        setfacl_as_nobody(&path, NOBODY, &["-m", "u::rwx,g::rwx,o::rwx"]);
        assert_eq!(mode_of(&path), 0o777, "{name}: owner outside the group");
        // An ACL with a named entry (stored, not folded into the mode).
        fs::set_permissions(&path, fs::Permissions::from_mode(0o2750)).unwrap();
        setfacl_as_nobody(&path, NOBODY, &["-m", "u:root:r"]);
        assert_eq!(mode_of(&path), 0o750, "{name}: named entry, outside");
        // Root is outside the group nogroup but has CAP_FSETID.
        std::os::unix::fs::chown(&path, None, Some(NOBODY)).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o2750)).unwrap();
        acl_tool(&fx.path(""), "setfacl", &["-m", "u:root:rw", name]);
        assert_eq!(mode_of(&path), 0o2770, "{name}: root");
    }
    // A default ACL set from outside the group leaves the mode alone.
    let d = fx.path("d");
    std::os::unix::fs::chown(&d, None, Some(0)).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o2755)).unwrap();
    setfacl_as_nobody(&d, NOBODY, &["-d", "-m", "u:root:rwx"]);
    assert_eq!(mode_of(&d), 0o2755, "default ACL");
    // The cleared bit is on disk, not just in the kernel's cache.
    std::os::unix::fs::chown(fx.path("f"), None, Some(0)).unwrap();
    fs::set_permissions(fx.path("f"), fs::Permissions::from_mode(0o2755)).unwrap();
    setfacl_as_nobody(&fx.path("f"), NOBODY, &["-m", "u:root:r"]);
    fx.remount();
    assert_eq!(mode_of(&fx.path("f")), 0o755, "after a remount");
}

/// A default ACL is inherited through the mount, replacing the umask
/// (which the server applies with FUSE_DONT_MASK when there is none).
#[test]
fn posix_acl_default_is_inherited_at_create_and_mkdir() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("posix-acl-default");
    let dir = fx.path("");
    fs::create_dir(fx.path("d")).unwrap();
    acl_tool(&dir, "setfacl", &["-d", "-m", "u:nobody:rwx", "d"]);
    common::run_ok(std::process::Command::new("sh").current_dir(&dir).args([
        "-c",
        "umask 077; echo new > d/f; mkdir d/sub; echo plain > g",
    ]));
    assert_eq!(fs::metadata(fx.path("d/f")).unwrap().mode() & 0o777, 0o664);
    let f_acl = acl_tool(&dir, "getfacl", &["-c", "d/f"]);
    assert!(f_acl.contains("user:nobody:rwx"), "{f_acl}");
    assert!(f_acl.contains("mask::rw-"), "{f_acl}");
    let sub_acl = acl_tool(&dir, "getfacl", &["-c", "d/sub"]);
    assert!(sub_acl.contains("default:user:nobody:rwx"), "{sub_acl}");
    assert_eq!(nobody_opens(&fx.path("d/f")), 0);
    // No default ACL: the umask applies.
    assert_eq!(fs::metadata(fx.path("g")).unwrap().mode() & 0o777, 0o600);
}
