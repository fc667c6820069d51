//! Idmapped mounts of a birch mount (docs/FUSE.md, "Idmapped mounts"):
//! birch negotiates FUSE_ALLOW_IDMAP, a bind mount of it takes an idmap
//! (mount_setattr(2) with MOUNT_ATTR_IDMAP and a user namespace), and
//! owners, chown and permission checks follow each mount's view.
//!
//! Run: `BIRCH_REQUIRE_MOUNT=1 cargo test -p birch-cli --test mount_idmap` as root.

mod common;

use common::json::Value;
use common::{birch, cstr, run, skip_unless_root, stats_json, text, Fixture, BIRCH};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The idmap of the tests: filesystem ids 0..1000 are seen as 10000..11000
/// through the idmapped mount (and ids outside it have no mapping there).
const BASE: u32 = 10000;
const RANGE: u32 = 1000;

/// A user namespace whose uid and gid maps are `0 BASE RANGE`, as an open
/// fd of its /proc/PID/ns/user (the namespace lives as long as the fd).
fn mapped_user_namespace() -> OwnedFd {
    let mut child = Command::new("unshare")
        .args(["--user", "--", "sleep", "60"])
        .stdin(Stdio::null())
        .spawn()
        .expect("run unshare --user");
    let pid = child.id();
    let ours = fs::metadata("/proc/self/ns/user").unwrap().ino();
    let start = Instant::now();
    // unshare(1) enters the namespace, then execs sleep.
    while fs::metadata(format!("/proc/{pid}/ns/user"))
        .map(|m| m.ino())
        .ok()
        == Some(ours)
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "unshare --user did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let map = format!("0 {BASE} {RANGE}\n");
    fs::write(format!("/proc/{pid}/uid_map"), &map).expect("write uid_map");
    fs::write(format!("/proc/{pid}/gid_map"), &map).expect("write gid_map");
    let ns = fs::File::open(format!("/proc/{pid}/ns/user")).expect("open the user namespace");
    let _ = child.kill();
    let _ = child.wait();
    ns.into()
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// An idmapped bind mount of `source` at `target` (as `mount --bind -o
/// X-mount.idmap=...` makes one), detached on drop, also when a test
/// fails (declared after the [`Fixture`], so it goes first).
struct IdmappedMount {
    target: PathBuf,
}

impl IdmappedMount {
    fn new(source: &Path, target: &Path) -> std::io::Result<IdmappedMount> {
        let userns = mapped_user_namespace();
        let source = cstr(source);
        // SAFETY: a valid C string; the returned fd is checked.
        let tree = unsafe {
            libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                source.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
            )
        };
        if tree < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: open_tree returned this fd, owned by nobody else.
        let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: 0,
            userns_fd: userns.as_raw_fd() as u64,
        };
        let empty = c"";
        // SAFETY: valid fds, an empty C string and a mount_attr of the
        // size passed.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                empty.as_ptr(),
                libc::AT_EMPTY_PATH,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let target_c = cstr(target);
        // SAFETY: a valid fd and C strings.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tree.as_raw_fd(),
                empty.as_ptr(),
                libc::AT_FDCWD,
                target_c.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(IdmappedMount {
            target: target.to_path_buf(),
        })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.target.join(rel)
    }
}

impl Drop for IdmappedMount {
    fn drop(&mut self) {
        let target = cstr(&self.target);
        // SAFETY: a valid C string; a lazy unmount cannot block.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// `sh -c script` as `uid`/`gid` with no supplementary groups.
fn as_user(uid: u32, script: &str) -> Output {
    run(Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .args(["--", "sh", "-c", script]))
}

fn owner(path: &Path) -> (u32, u32) {
    let m = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.uid(), m.gid())
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn init_flags(mnt: &Path) -> Vec<String> {
    match stats_json(mnt).get("init_flags") {
        Some(Value::Array(flags)) => flags
            .iter()
            .filter_map(|f| f.as_str().map(str::to_string))
            .collect(),
        other => panic!("no init_flags in birch stats --json: {other:?}"),
    }
}

/// Files made through an idmapped bind mount of birch are stored with the
/// filesystem's ids and shown with the mount's; chown, permission checks
/// and set-ID clearing go by each mount's view; birch's own checks of the
/// subvolume ioctls refuse a caller the request no longer names.
#[test]
fn idmapped_bind_mount_maps_owners_and_permissions() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("idmap", "1G");
    fx.options = vec!["idmap".into()];
    fx.mount();
    assert!(
        init_flags(&fx.mnt).iter().any(|f| f == "ALLOW_IDMAP"),
        "FUSE_ALLOW_IDMAP not negotiated: {:?}",
        init_flags(&fx.mnt)
    );
    let shared = fx.path("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o755)).unwrap();
    let target = fx.scratch.path("idmapped");
    fs::create_dir(&target).unwrap();
    let idm = IdmappedMount::new(&fx.mnt, &target).expect("idmapped bind mount of birch");

    // Root's directory, seen through each mount.
    assert_eq!(owner(&shared), (0, 0));
    assert_eq!(owner(&idm.path("shared")), (BASE, BASE));

    // BASE + 0 owns "shared" through the idmapped mount: it may create
    // there, each kind of inode a request creates (CREATE, MKDIR,
    // SYMLINK, MKNOD), and birch stores the filesystem's ids, 0.
    let user = BASE;
    let made = as_user(
        user,
        &format!(
            "cd {} && echo data > f && mkdir d && ln -s f l && mkfifo p",
            idm.path("shared").display()
        ),
    );
    assert!(made.status.success(), "{}", text(&made.stderr));
    for name in ["f", "d", "l", "p"] {
        assert_eq!(
            owner(&shared.join(name)),
            (0, 0),
            "{name} through birch's mount"
        );
        assert_eq!(
            owner(&idm.path("shared").join(name)),
            (user, user),
            "{name} through the idmapped mount"
        );
    }
    // Through birch's own mount the same user is not the owner of
    // "shared" (mode 0755, root's), so the same create is refused there.
    let refused = as_user(user, &format!("touch {}", shared.join("g").display()));
    assert!(
        !refused.status.success(),
        "created in root's 0755 directory"
    );
    assert!(!shared.join("g").exists());

    // Another mapped user may not write the 0644 file, and may read it.
    let other = BASE + 5;
    let write = as_user(
        other,
        &format!("echo x >> {}", idm.path("shared/f").display()),
    );
    assert!(!write.status.success(), "BASE+5 wrote BASE's 0644 file");
    let read = as_user(other, &format!("cat {}", idm.path("shared/f").display()));
    assert_eq!(text(&read.stdout), "data\n", "{}", text(&read.stderr));

    // chown through the idmapped mount: mapped ids in, filesystem ids
    // stored; an id with no mapping is refused.
    std::os::unix::fs::chown(idm.path("shared/f"), Some(BASE + 7), Some(BASE + 8)).unwrap();
    assert_eq!(owner(&shared.join("f")), (7, 8));
    assert_eq!(owner(&idm.path("shared/f")), (BASE + 7, BASE + 8));
    assert!(std::os::unix::fs::chown(idm.path("shared/f"), Some(5), None).is_err());
    assert_eq!(owner(&shared.join("f")), (7, 8));
    // The owner through the idmapped mount may chmod and chgrp its file.
    let mine = idm.path("shared/d");
    let chmod = as_user(user, &format!("chmod 0700 {}", mine.display()));
    assert!(chmod.status.success(), "{}", text(&chmod.stderr));
    assert_eq!(mode(&shared.join("d")), 0o700);

    // Set-ID bits: a truncate by a mapped user without CAP_FSETID drops
    // both (the kernel flags it FATTR_KILL_SUIDGID); root's truncate
    // keeps them. The request carries no uid, so birch must not go by
    // one (it would take (u32)-1 for a user and drop root's bits too).
    let suid = shared.join("suid");
    fs::write(&suid, b"12345678").unwrap();
    fs::set_permissions(&suid, fs::Permissions::from_mode(0o6777)).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&suid)
        .unwrap()
        .set_len(4)
        .unwrap();
    assert_eq!(mode(&suid), 0o6777, "root's truncate dropped set-ID bits");
    let trunc = as_user(
        other,
        &format!("truncate -s 2 {}", idm.path("shared/suid").display()),
    );
    assert!(trunc.status.success(), "{}", text(&trunc.stderr));
    assert_eq!(mode(&suid), 0o777, "a user's truncate kept set-ID bits");
    assert_eq!(fs::metadata(&suid).unwrap().len(), 2);

    // birch's own checks: a subvolume ioctl carries no uid; root (by its
    // process) creates one through either mount, a mapped user through
    // the idmapped mount is refused (it would own its directory there,
    // but birch cannot tell who it is); the administrator ioctls too.
    let out = birch(&["subvolume", "create", shared.join("sv").to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(owner(&shared.join("sv")), (0, 0));
    fs::set_permissions(shared.join("d"), fs::Permissions::from_mode(0o777)).unwrap();
    let sv = idm.path("shared/d/usersv");
    let out = as_user(user, &format!("{BIRCH} subvolume create {}", sv.display()));
    assert!(!out.status.success(), "a mapped user created a subvolume");
    assert!(
        text(&out.stderr).contains("permission denied"),
        "{}",
        text(&out.stderr)
    );
    let out = as_user(user, &format!("{BIRCH} scrub {}", fx.mnt.display()));
    assert!(!out.status.success(), "a user scrubbed root's mount");
    let out = birch(&["sync", fx.mnt.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    drop(idm);
}

/// Without `-o idmap` (the default, or `noidmap`) birch does not offer
/// FUSE_ALLOW_IDMAP: the kernel refuses an idmap on the mount (EINVAL),
/// and requests keep the caller's ids, so a user's subvolume create is
/// checked by its permissions.
#[test]
fn without_idmap_idmapped_mounts_are_refused() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("noidmap");
    assert!(!init_flags(&fx.mnt).iter().any(|f| f == "ALLOW_IDMAP"));
    let target = fx.scratch.path("idmapped");
    fs::create_dir(&target).unwrap();
    let err = IdmappedMount::new(&fx.mnt, &target)
        .err()
        .expect("an idmap on a mount without FUSE_ALLOW_IDMAP");
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    let open = fx.path("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let out = as_user(
        65534,
        &format!("{BIRCH} subvolume create {}", open.join("mine").display()),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(owner(&open.join("mine")), (65534, 65534));
}
