//! File handles on a real mount: name_to_handle_at(2) and
//! open_by_handle_at(2), the interface an NFS server uses to re-export a
//! filesystem. A handle must keep opening its file after the kernel has
//! dropped the inode from its caches (`drop_caches` between the two
//! calls): the kernel then asks birch for the inode by number (LOOKUP of
//! "." and, for a directory, ".." to reconnect it), which works only with
//! FUSE_EXPORT_SUPPORT (docs/FUSE.md, "File handles and NFS export").
//! A deleted file's handle is stale (ESTALE), also when its inode number
//! comes back in a later mount, and so is a handle into a deleted
//! subvolume.
//!
//! Needs root (open_by_handle_at needs CAP_DAC_READ_SEARCH, drop_caches
//! root) and /dev/fuse; skips otherwise, fails with BIRCH_REQUIRE_MOUNT=1.

mod common;

use common::{cstr, errno, skip_unless_root, Fixture};
use std::fs::{self, File};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// MAX_HANDLE_SZ in the kernel's include/linux/exportfs.h.
const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
#[derive(Clone)]
struct FileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

/// name_to_handle_at(AT_FDCWD, path, ...): the handle of `path`.
fn handle_of(path: &Path) -> FileHandle {
    let mut handle = FileHandle {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id: libc::c_int = 0;
    let name = cstr(path);
    // SAFETY: `handle` has the layout of struct file_handle with
    // handle_bytes of room; `mount_id` is an int; `name` is a C string.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            name.as_ptr(),
            &mut handle as *mut FileHandle,
            &mut mount_id as *mut libc::c_int,
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "name_to_handle_at({}): {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    handle
}

/// open_by_handle_at(mount, handle, flags): the opened file, or the errno.
fn open_by_handle(mount: &Path, handle: &FileHandle, flags: i32) -> Result<File, i32> {
    let mount_fd = File::open(mount).expect("open the mount point");
    // SAFETY: `handle` points at a valid struct file_handle; the mount fd
    // is open for the duration of the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            handle as *const FileHandle,
            flags,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: the kernel just returned this descriptor, owned by no one else.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// Makes the kernel forget every inode of the mount nobody holds: birch
/// gets FORGETs, and the next open_by_handle_at must ask birch.
fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "3").expect("write /proc/sys/vm/drop_caches");
}

fn read_all(mut f: &File) -> Vec<u8> {
    let mut out = Vec::new();
    f.read_to_end(&mut out).expect("read through the handle");
    out
}

/// Where a descriptor's dentry sits in the tree, as the kernel sees it.
fn fd_path(f: &File) -> PathBuf {
    fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).expect("readlink /proc/self/fd")
}

#[test]
fn evicted_file_opens_by_handle() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("handle-evicted");
    fs::write(fx.path("file"), b"kept across eviction").unwrap();
    let ino = fs::metadata(fx.path("file")).unwrap().ino();
    let handle = handle_of(&fx.path("file"));
    drop_caches();
    let f = open_by_handle(&fx.mnt, &handle, libc::O_RDONLY).unwrap_or_else(|e| {
        panic!(
            "open_by_handle_at after drop_caches: {}",
            std::io::Error::from_raw_os_error(e)
        )
    });
    assert_eq!(f.metadata().unwrap().ino(), ino);
    assert_eq!(read_all(&f), b"kept across eviction");
    // Twice more: the hold each lookup takes is dropped by the kernel's
    // forget, and the inode is found again each time.
    drop(f);
    for _ in 0..2 {
        drop_caches();
        let f = open_by_handle(&fx.mnt, &handle, libc::O_RDONLY).expect("reopen by handle");
        assert_eq!(read_all(&f), b"kept across eviction");
    }
}

#[test]
fn renamed_file_opens_by_handle() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("handle-renamed");
    fs::create_dir(fx.path("a")).unwrap();
    fs::create_dir(fx.path("b")).unwrap();
    fs::write(fx.path("a/old"), b"moved").unwrap();
    let handle = handle_of(&fx.path("a/old"));
    fs::rename(fx.path("a/old"), fx.path("b/new")).unwrap();
    drop_caches();
    let f = open_by_handle(&fx.mnt, &handle, libc::O_RDWR).expect("open renamed file by handle");
    assert_eq!(read_all(&f), b"moved");
    // Written through the handle, read through the new name.
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"MOVED", 0).unwrap();
    drop(f);
    assert_eq!(fs::read(fx.path("b/new")).unwrap(), b"MOVED");
}

#[test]
fn linked_file_opens_by_handle_of_either_name() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("handle-linked");
    fs::create_dir(fx.path("d")).unwrap();
    fs::write(fx.path("first"), b"two names").unwrap();
    fs::hard_link(fx.path("first"), fx.path("d/second")).unwrap();
    let by_first = handle_of(&fx.path("first"));
    let by_second = handle_of(&fx.path("d/second"));
    // The handle names the inode, not the name.
    assert_eq!(by_first.handle_bytes, by_second.handle_bytes);
    assert_eq!(
        by_first.f_handle[..by_first.handle_bytes as usize],
        by_second.f_handle[..by_second.handle_bytes as usize]
    );
    fs::remove_file(fx.path("first")).unwrap();
    drop_caches();
    let f = open_by_handle(&fx.mnt, &by_first, libc::O_RDONLY).expect("open by handle");
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    assert_eq!(read_all(&f), b"two names");
}

#[test]
fn evicted_directory_reconnects_by_handle() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("handle-dir");
    fs::create_dir_all(fx.path("a/b/c")).unwrap();
    fs::write(fx.path("a/b/c/inside"), b"x").unwrap();
    let handle = handle_of(&fx.path("a/b/c"));
    // Moved under another parent: reconnecting walks up with ".." lookups
    // from the directory, then finds each name in its parent's listing.
    fs::create_dir(fx.path("z")).unwrap();
    fs::rename(fx.path("a/b"), fx.path("z/y")).unwrap();
    drop_caches();
    let dir =
        open_by_handle(&fx.mnt, &handle, libc::O_RDONLY | libc::O_DIRECTORY).unwrap_or_else(|e| {
            panic!(
                "open_by_handle_at of a directory after drop_caches: {}",
                std::io::Error::from_raw_os_error(e)
            )
        });
    assert_eq!(fd_path(&dir), fx.path("z/y/c"));
    let names: Vec<_> = fs::read_dir(fd_path(&dir))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["inside"]);
}

#[test]
fn deleted_file_handle_is_stale() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("handle-deleted");
    fs::write(fx.path("gone"), b"soon deleted").unwrap();
    fs::create_dir(fx.path("gone-dir")).unwrap();
    let file = handle_of(&fx.path("gone"));
    let dir = handle_of(&fx.path("gone-dir"));
    fs::remove_file(fx.path("gone")).unwrap();
    fs::remove_dir(fx.path("gone-dir")).unwrap();
    drop_caches();
    assert_eq!(
        open_by_handle(&fx.mnt, &file, libc::O_RDONLY).err(),
        Some(libc::ESTALE)
    );
    assert_eq!(
        open_by_handle(&fx.mnt, &dir, libc::O_RDONLY | libc::O_DIRECTORY).err(),
        Some(libc::ESTALE)
    );
}

/// A handle of a file in a subvolume that was deleted is stale, also
/// while another file of it is still open (which keeps the subvolume's
/// tree loaded for that file: docs/SNAPSHOTS.md (d) step 3), as on btrfs.
/// (The open file's own handle, and its directory's, the kernel resolves
/// from its inode cache without asking birch: they still open, which
/// btrfs refuses. docs/SNAPSHOTS.md (d), "File handles".)
#[test]
fn handle_into_a_deleted_subvolume_is_stale() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("handle-deleted-subvolume");
    let sv = fx.path("sv");
    let out = common::birch(&["subvolume", "create", sv.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    fs::write(sv.join("held"), b"kept open").unwrap();
    fs::write(sv.join("other"), b"not open").unwrap();
    let other = handle_of(&sv.join("other"));
    let held = File::open(sv.join("held")).unwrap();
    drop_caches();
    let out = common::birch(&["subvolume", "delete", sv.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    assert_eq!(
        open_by_handle(&fx.mnt, &other, libc::O_RDONLY).err(),
        Some(libc::ESTALE)
    );
    assert_eq!(read_all(&held), b"kept open");
}

/// Waits until the mount's own nameless file (made once per mount, at a
/// moment of the daemon's choosing: docs/FUSE.md, "Requests per
/// operation") has taken its inode number, so the numbers this test's
/// files get do not depend on that timing.
fn settle_mount_file(fx: &Fixture) {
    for _ in 0..200 {
        let stats = common::stats_json(&fx.mnt);
        let tmpfiles = stats.get("fuse_requests").and_then(|r| r.get("TMPFILE"));
        if tmpfiles.and_then(common::json::Value::as_u64) > Some(0) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the mount's nameless file was not made within 10 s");
}

/// birch never reuses an inode number within a mount, but a later mount
/// starts after the highest number on disk: deleting the newest inode
/// frees its number. The generation (the creating transaction) tells the
/// two apart, so the old handle is stale, not a way into the new file.
#[test]
fn reused_number_in_a_later_mount_is_stale() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("handle-reuse");
    settle_mount_file(&fx);
    fs::write(fx.path("old"), b"old file").unwrap();
    let old_ino = fs::metadata(fx.path("old")).unwrap().ino();
    let old = handle_of(&fx.path("old"));
    fs::remove_file(fx.path("old")).unwrap();
    fx.remount();
    settle_mount_file(&fx);
    fs::write(fx.path("new"), b"new file").unwrap();
    let new_ino = fs::metadata(fx.path("new")).unwrap().ino();
    assert_eq!(new_ino, old_ino, "the later mount did not reuse the number");
    let new = handle_of(&fx.path("new"));
    drop_caches();
    assert_eq!(
        open_by_handle(&fx.mnt, &old, libc::O_RDONLY).err(),
        Some(libc::ESTALE)
    );
    let f = open_by_handle(&fx.mnt, &new, libc::O_RDONLY).expect("open the new file by handle");
    assert_eq!(read_all(&f), b"new file");
    drop(f);
    // And a handle from before a remount still opens a file that lives on.
    fs::write(fx.path("lasting"), b"survives remount").unwrap();
    let lasting = handle_of(&fx.path("lasting"));
    fx.remount();
    let f = open_by_handle(&fx.mnt, &lasting, libc::O_RDONLY).expect("open after remount");
    assert_eq!(read_all(&f), b"survives remount");
}
