//! Mount options and set-ID rules over a real mount: nosuid, nodev and
//! noexec reach the kernel; writes, truncates, fallocates and chowns drop
//! set-user-ID and set-group-ID bits by the kernel's rules, by owner and
//! non-owner; mount(8)'s generic options are accepted, `sync` and
//! `dirsync` make changes durable before they return (proved with the
//! shutdown ioctl), the atime options behave as the kernel defines them; a
//! directory listing ends while its names are renamed away and back; an
//! image on a filesystem whose O_DIRECT reads fail is served buffered; the
//! later of `ro` and `rw` wins; on root's mount another user may not shut
//! it down, scrub it or change append-only/immutable flags, but may sync
//! it and read its stats.
//!
//! Unprivileged callers are run with setpriv(1) (util-linux, see
//! scripts/install-test-tools.sh). Run: `cargo test -p birch-cli --test
//! mount_security` as root (needs /dev/fuse).

mod common;

use common::{cstr, run, run_ok, skip_unless_root, text, Fixture, Scratch};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const NOBODY: u32 = 65534;
/// An unprivileged uid/gid with no passwd entry (setpriv needs none).
const OTHER: u32 = 1234;

/// `setpriv` running `args` as `uid`/`gid` with exactly `groups` as
/// supplementary groups (and no capabilities: a uid change drops them).
fn as_user(uid: u32, gid: u32, groups: &[u32], args: &[&OsStr]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"));
    if groups.is_empty() {
        cmd.arg("--clear-groups");
    } else {
        let list: Vec<String> = groups.iter().map(u32::to_string).collect();
        cmd.arg(format!("--groups={}", list.join(",")));
    }
    cmd.arg("--");
    cmd.args(args);
    run(&mut cmd)
}

/// A shell script run by [`as_user`]; panics unless it succeeds.
fn sh_as(uid: u32, gid: u32, groups: &[u32], script: &str) {
    let out = as_user(
        uid,
        gid,
        groups,
        &["sh".as_ref(), "-ec".as_ref(), script.as_ref()],
    );
    assert!(
        out.status.success(),
        "as uid {uid}: {script}: {}\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

fn mode_of(p: &Path) -> u32 {
    fs::metadata(p).unwrap().mode() & 0o7777
}

/// The mode as the kernel has it cached: statx asking for the mode alone
/// (as `stat -c %A` does) is answered from the kernel's attributes unless
/// the mode was invalidated, and a write invalidates only size and times.
/// This is also the mode exec goes by.
fn cached_mode_of(p: &Path) -> u32 {
    let c = cstr(p);
    // SAFETY: statx fills the zeroed buffer we own; the path is a C string.
    let mut buf: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_MODE, &mut buf) };
    assert_eq!(rc, 0, "statx: {}", std::io::Error::last_os_error());
    u32::from(buf.stx_mode) & 0o7777
}

fn set_mode(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// This mount's options as /proc/self/mounts lists them.
fn mount_flags(mnt: &Path) -> Vec<String> {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let want = mnt.to_str().unwrap();
    let line = mounts
        .lines()
        .rfind(|l| l.split(' ').nth(1) == Some(want))
        .unwrap_or_else(|| panic!("{want} not in /proc/self/mounts"));
    line.split(' ')
        .nth(3)
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect()
}

/// A copy of id(1) on the mount, owned by root, set-user-ID, runnable by all.
fn setuid_id(fx: &Fixture) -> PathBuf {
    let id = fx.path("id");
    fs::copy("/usr/bin/id", &id).unwrap();
    std::os::unix::fs::chown(&id, Some(0), Some(0)).unwrap();
    set_mode(&id, 0o4755);
    id
}

/// The effective uid `id -u` reports when nobody runs `id`.
fn euid_of_run_by_nobody(id: &Path) -> String {
    let out = as_user(NOBODY, NOBODY, &[], &[id.as_os_str(), "-u".as_ref()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_string()
}

/// Opens a character device node for reading: Ok or the errno.
fn open_device(p: &Path) -> Result<(), i32> {
    File::open(p)
        .map(drop)
        .map_err(|e| e.raw_os_error().unwrap())
}

/// mknod of /dev/null's numbers.
fn make_null(p: &Path) {
    let c = cstr(p);
    // SAFETY: a valid C string path.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
}

/// Runs `prog` (as root): Ok or the errno of the exec.
fn exec(prog: &Path) -> Result<(), i32> {
    match Command::new(prog).arg("-u").output() {
        Ok(out) => {
            assert!(out.status.success());
            Ok(())
        }
        Err(e) => Err(e.raw_os_error().unwrap()),
    }
}

#[test]
fn default_mount_honours_set_id_devices_and_exec() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("sec-defaults");
    let flags = mount_flags(&fx.mnt);
    for f in ["nosuid", "nodev", "noexec"] {
        assert!(!flags.contains(&f.to_string()), "{f} in {flags:?}");
    }
    // mount(8)'s default for root is relatime.
    assert!(flags.contains(&"relatime".to_string()), "{flags:?}");
    let id = setuid_id(&fx);
    assert_eq!(euid_of_run_by_nobody(&id), "0", "set-user-ID not honoured");
    make_null(&fx.path("null"));
    assert_eq!(open_device(&fx.path("null")), Ok(()));
    assert_eq!(exec(&id), Ok(()));
}

#[test]
fn nosuid_and_nodev_reach_the_kernel() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("sec-nosuid", "256M");
    fx.options = vec!["nosuid,nodev".into()];
    fx.mount();
    let flags = mount_flags(&fx.mnt);
    assert!(flags.contains(&"nosuid".to_string()), "{flags:?}");
    assert!(flags.contains(&"nodev".to_string()), "{flags:?}");
    assert!(!flags.contains(&"noexec".to_string()), "{flags:?}");
    let id = setuid_id(&fx);
    assert_eq!(
        euid_of_run_by_nobody(&id),
        NOBODY.to_string(),
        "set-user-ID honoured on a nosuid mount"
    );
    make_null(&fx.path("null"));
    assert_eq!(open_device(&fx.path("null")), Err(libc::EACCES));
}

#[test]
fn noexec_reaches_the_kernel_and_later_options_override() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("sec-noexec", "256M");
    // "user" implies noexec,nosuid,nodev (mount(8)); "suid" and "dev"
    // after it take two of them back.
    fx.options = vec!["user,suid,dev".into()];
    fx.mount();
    let flags = mount_flags(&fx.mnt);
    assert!(flags.contains(&"noexec".to_string()), "{flags:?}");
    assert!(!flags.contains(&"nosuid".to_string()), "{flags:?}");
    assert!(!flags.contains(&"nodev".to_string()), "{flags:?}");
    let id = setuid_id(&fx);
    assert_eq!(exec(&id), Err(libc::EACCES));
    make_null(&fx.path("null"));
    assert_eq!(open_device(&fx.path("null")), Ok(()));
}

/// One set-ID case: a file with `owner`, `group` and `mode`, changed by
/// `script` run as `caller` (uid, gid, supplementary groups), must end
/// with `want`.
struct Case {
    name: &'static str,
    owner: (u32, u32),
    mode: u32,
    caller: (u32, u32, &'static [u32]),
    /// `{f}` is the file's path.
    script: &'static str,
    want: u32,
}

const APPEND: &str = "printf x >> {f}";
const DIRECT: &str = "dd if=/dev/zero of={f} bs=4096 count=1 oflag=direct conv=notrunc status=none";
const TRUNCATE: &str = "truncate -s 100 {f}";
const FALLOCATE: &str = "fallocate -l 65536 {f}";
const CHGRP_NOBODY: &str = "chgrp 65534 {f}";
const CHOWN_SELF: &str = "chown $(id -u):$(id -g) {f}";

fn cases() -> Vec<Case> {
    let me = (NOBODY, NOBODY, &[][..]);
    let root = (0, 0, &[][..]);
    let other = (OTHER, OTHER, &[][..]);
    let other_in_root_group = (OTHER, OTHER, &[0u32][..]);
    vec![
        // Owner: set-user-ID goes; set-group-ID without group-execute
        // stays (the owner is in the group), with it goes.
        Case {
            name: "owner write, no exec",
            owner: (NOBODY, NOBODY),
            mode: 0o6644,
            caller: me,
            script: APPEND,
            want: 0o2644,
        },
        Case {
            name: "owner write, exec",
            owner: (NOBODY, NOBODY),
            mode: 0o6754,
            caller: me,
            script: APPEND,
            want: 0o0754,
        },
        Case {
            name: "owner O_DIRECT write",
            owner: (NOBODY, NOBODY),
            mode: 0o6644,
            caller: me,
            script: DIRECT,
            want: 0o2644,
        },
        Case {
            name: "owner O_DIRECT write, exec",
            owner: (NOBODY, NOBODY),
            mode: 0o6755,
            caller: me,
            script: DIRECT,
            want: 0o0755,
        },
        Case {
            name: "owner truncate",
            owner: (NOBODY, NOBODY),
            mode: 0o6744,
            caller: me,
            script: TRUNCATE,
            want: 0o2744,
        },
        Case {
            name: "owner truncate, exec",
            owner: (NOBODY, NOBODY),
            mode: 0o6754,
            caller: me,
            script: TRUNCATE,
            want: 0o0754,
        },
        Case {
            name: "owner fallocate",
            owner: (NOBODY, NOBODY),
            mode: 0o6644,
            caller: me,
            script: FALLOCATE,
            want: 0o2644,
        },
        Case {
            name: "owner fallocate, exec",
            owner: (NOBODY, NOBODY),
            mode: 0o6770,
            caller: me,
            script: FALLOCATE,
            want: 0o0770,
        },
        Case {
            name: "owner chgrp",
            owner: (NOBODY, NOBODY),
            mode: 0o6644,
            caller: me,
            script: CHGRP_NOBODY,
            want: 0o2644,
        },
        Case {
            name: "owner chown to itself, exec",
            owner: (NOBODY, NOBODY),
            mode: 0o6755,
            caller: me,
            script: CHOWN_SELF,
            want: 0o0755,
        },
        // Non-owner outside the file's group: both go, exec bits or not.
        Case {
            name: "other write",
            owner: (0, 0),
            mode: 0o6666,
            caller: other,
            script: APPEND,
            want: 0o0666,
        },
        Case {
            name: "other write, exec",
            owner: (0, 0),
            mode: 0o6777,
            caller: other,
            script: APPEND,
            want: 0o0777,
        },
        Case {
            name: "other O_DIRECT write",
            owner: (0, 0),
            mode: 0o6666,
            caller: other,
            script: DIRECT,
            want: 0o0666,
        },
        Case {
            name: "other truncate",
            owner: (0, 0),
            mode: 0o6666,
            caller: other,
            script: TRUNCATE,
            want: 0o0666,
        },
        Case {
            name: "other fallocate",
            owner: (0, 0),
            mode: 0o6666,
            caller: other,
            script: FALLOCATE,
            want: 0o0666,
        },
        // Non-owner in the file's group through a supplementary group:
        // set-group-ID without group-execute stays.
        Case {
            name: "group member write",
            owner: (0, 0),
            mode: 0o6666,
            caller: other_in_root_group,
            script: APPEND,
            want: 0o2666,
        },
        Case {
            name: "group member truncate",
            owner: (0, 0),
            mode: 0o6666,
            caller: other_in_root_group,
            script: TRUNCATE,
            want: 0o2666,
        },
        // Root (CAP_FSETID) keeps both on write and truncate; chown drops
        // set-user-ID even for root, set-group-ID only when group-executable.
        Case {
            name: "root write",
            owner: (NOBODY, NOBODY),
            mode: 0o6755,
            caller: root,
            script: APPEND,
            want: 0o6755,
        },
        Case {
            name: "root truncate",
            owner: (NOBODY, NOBODY),
            mode: 0o6755,
            caller: root,
            script: TRUNCATE,
            want: 0o6755,
        },
        Case {
            name: "root fallocate",
            owner: (NOBODY, NOBODY),
            mode: 0o6755,
            caller: root,
            script: FALLOCATE,
            want: 0o6755,
        },
        Case {
            name: "root chown",
            owner: (NOBODY, NOBODY),
            mode: 0o6755,
            caller: root,
            script: "chown 0:0 {f}",
            want: 0o0755,
        },
        Case {
            name: "root chown, no group exec",
            owner: (NOBODY, NOBODY),
            mode: 0o6744,
            caller: root,
            script: "chown 0:0 {f}",
            want: 0o2744,
        },
    ]
}

/// Runs every [`cases`] case on `fx`, checking the mode the kernel shows
/// right after the change and, after a remount, the one birch stored.
fn check_set_id_cases(fx: &mut Fixture) {
    let dir = fx.path("setid");
    fs::create_dir(&dir).unwrap();
    set_mode(&dir, 0o777);
    let mut stored = Vec::new();
    let mut wrong = Vec::new();
    for (i, case) in cases().iter().enumerate() {
        let f = dir.join(format!("f{i}"));
        fs::write(&f, b"0123456789").unwrap();
        std::os::unix::fs::chown(&f, Some(case.owner.0), Some(case.owner.1)).unwrap();
        set_mode(&f, case.mode);
        assert_eq!(mode_of(&f), case.mode, "{}: setup", case.name);
        let script = case.script.replace("{f}", f.to_str().unwrap());
        let (uid, gid, groups) = case.caller;
        sh_as(uid, gid, groups, &script);
        let cached = cached_mode_of(&f);
        let fetched = mode_of(&f);
        if (cached, fetched) != (case.want, case.want) {
            wrong.push(format!(
                "{}: mode {:04o} became {cached:04o} in the kernel's cache, {fetched:04o} \
                 from birch, want {:04o}",
                case.name, case.mode, case.want
            ));
        }
        stored.push((case.name, f, case.want));
    }
    fx.remount();
    for (name, f, want) in stored {
        let got = mode_of(&f);
        if got != want {
            wrong.push(format!("{name}: after remount {got:04o}, want {want:04o}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn set_id_bits_drop_by_the_kernels_rules() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("sec-setid");
    check_set_id_cases(&mut fx);
}

#[test]
fn set_id_bits_drop_with_the_writeback_cache() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("sec-setid-wb", "1G");
    fx.options = vec!["writeback_cache".into()];
    fx.mount();
    check_set_id_cases(&mut fx);
}

#[test]
fn a_set_user_id_program_written_by_another_user_loses_the_bit_before_it_runs() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("sec-setid-exec");
    let id = setuid_id(&fx);
    // World-writable set-user-ID root program: the classic hole.
    set_mode(&id, 0o4777);
    // A NUL appended to an ELF file leaves it runnable.
    sh_as(
        NOBODY,
        NOBODY,
        &[],
        &format!("printf '\\0' >> {}", id.display()),
    );
    // What the kernel decides at exec comes from its cached mode: that
    // must already be the cleared one.
    assert_eq!(euid_of_run_by_nobody(&id), NOBODY.to_string());
    assert_eq!(cached_mode_of(&id), 0o777);
    assert_eq!(mode_of(&id), 0o777);
}

/// `ro` and `rw` in either order: the later one wins (mount(8)).
#[test]
fn the_later_of_ro_and_rw_wins() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("sec-ro-rw", "256M");
    fx.options = vec!["ro,rw".into()];
    fx.mount();
    assert!(mount_flags(&fx.mnt).contains(&"rw".to_string()));
    fs::write(fx.path("f"), b"written").unwrap();
    fx.unmount();
    fx.options = vec!["rw".into(), "ro".into()];
    fx.mount();
    assert!(mount_flags(&fx.mnt).contains(&"ro".to_string()));
    assert_eq!(
        fs::write(fx.path("g"), b"").map_err(|e| e.raw_os_error()),
        Err(Some(libc::EROFS))
    );
    assert_eq!(fs::read(fx.path("f")).unwrap(), b"written");
}

/// Sends ioctl `cmd` on the directory `dir` from a child running as
/// `uid`/`gid` with no supplementary groups (and so no capabilities),
/// with a zeroed buffer as argument big enough for any birch reply.
/// Returns 0 or the errno.
fn ioctl_as(uid: u32, dir: &Path, cmd: u32) -> i32 {
    let path = cstr(dir);
    let mut buf = vec![0u8; 1 << 14];
    // SAFETY: the child calls only async-signal-safe functions on memory
    // allocated before the fork, then _exit; the parent reaps it.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
            {
                libc::_exit(200);
            }
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
            if fd < 0 {
                libc::_exit(201);
            }
            let rc = libc::ioctl(fd, cmd as libc::c_ulong, buf.as_mut_ptr());
            libc::_exit(if rc == 0 {
                0
            } else {
                *libc::__errno_location()
            });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status), "ioctl child died: {status:#x}");
        let code = libc::WEXITSTATUS(status);
        assert!(code < 200, "ioctl child could not become uid {uid}: {code}");
        code
    }
}

/// On root's mount (allow_other: every user reaches it) the shutdown and
/// scrub ioctls are root's alone: another user's get EPERM and change
/// nothing; sync and stats are anyone's (docs/FUSE.md, "Who may send
/// which ioctl").
#[test]
fn only_root_may_shut_down_or_scrub_roots_mount() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("sec-ioctl", "256M");
    fx.mount();
    fs::write(fx.path("before"), b"not yet durable").unwrap();
    let mnt = fx.mnt.clone();
    assert_eq!(
        ioctl_as(NOBODY, &mnt, birch_fuse::XFS_IOC_GOINGDOWN),
        libc::EPERM,
        "nobody's shutdown"
    );
    assert_eq!(
        ioctl_as(NOBODY, &mnt, birch_fuse::BIRCH_IOC_SCRUB),
        libc::EPERM,
        "nobody's scrub"
    );
    let scrub = as_user(
        NOBODY,
        NOBODY,
        &[],
        &[common::BIRCH.as_ref(), "scrub".as_ref(), mnt.as_os_str()],
    );
    assert!(
        !scrub.status.success() && text(&scrub.stderr).contains("Operation not permitted"),
        "birch scrub as nobody: {}{}",
        text(&scrub.stdout),
        text(&scrub.stderr)
    );
    // Root's next write still works, and the mount is not failed.
    fs::write(fx.path("after"), b"written").unwrap();
    File::open(fx.path("after")).unwrap().sync_all().unwrap();
    let stats = text(&common::birch(&["stats", mnt.to_str().unwrap()]).stdout);
    assert!(!stats.contains("read-only after"), "{stats}");
    // Anyone may commit and read the counters.
    assert_eq!(ioctl_as(NOBODY, &mnt, birch_fuse::BIRCH_IOC_SYNC), 0);
    assert_eq!(ioctl_as(NOBODY, &mnt, birch_fuse::BIRCH_IOC_STATS), 0);
    // Root's scrub and shutdown go through.
    assert_eq!(ioctl_as(0, &mnt, birch_fuse::BIRCH_IOC_SCRUB), 0);
    shut_down(&fx);
    assert_eq!(
        fs::write(fx.path("late"), b"").map_err(|e| e.raw_os_error()),
        Err(Some(libc::EIO)),
        "a write after root's shutdown"
    );
    if let Err(e) = fx.try_unmount() {
        assert!(e.contains("shut down"), "unexpected unmount failure: {e}");
    }
    fx.mount();
    // The sync nobody asked for made both files durable before the cut.
    assert_eq!(fs::read(fx.path("before")).unwrap(), b"not yet durable");
    assert_eq!(fs::read(fx.path("after")).unwrap(), b"written");
}

/// chattr: the kernel checks, before FUSE sends the request, that the
/// caller owns the file and, for `a` and `i`, has CAP_LINUX_IMMUTABLE.
#[test]
fn only_root_may_change_append_only_and_immutable() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("sec-chattr");
    let mine = fx.path("mine");
    let roots = fx.path("roots");
    fs::write(&mine, b"").unwrap();
    fs::write(&roots, b"").unwrap();
    std::os::unix::fs::chown(&mine, Some(NOBODY), Some(NOBODY)).unwrap();
    let chattr = |flag: &str, file: &Path| {
        as_user(
            NOBODY,
            NOBODY,
            &[],
            &["chattr".as_ref(), flag.as_ref(), file.as_os_str()],
        )
    };
    for (flag, file) in [("+i", &mine), ("+a", &mine), ("+a", &roots)] {
        let out = chattr(flag, file);
        assert!(
            !out.status.success() && text(&out.stderr).contains("Operation not permitted"),
            "nobody's chattr {flag} {}: {}",
            file.display(),
            text(&out.stderr)
        );
    }
    run_ok(Command::new("chattr").arg("+a").arg(&mine));
    let out = chattr("-a", &mine);
    assert!(!out.status.success(), "nobody cleared root's +a");
    // lsattr is anyone's.
    let out = as_user(NOBODY, NOBODY, &[], &["lsattr".as_ref(), mine.as_os_str()]);
    assert!(
        out.status.success() && text(&out.stdout).starts_with("-----a"),
        "lsattr as nobody: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    run_ok(Command::new("chattr").arg("-a").arg(&mine));
}

#[test]
fn generic_mount_options_are_accepted() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("sec-generic", "256M");
    fx.options = vec![[
        "defaults",
        "auto",
        "noauto",
        "nouser",
        "_netdev",
        "nofail",
        "atime",
        "diratime",
        "norelatime",
        "relatime",
        "lazytime",
        "nolazytime",
        "async",
        "silent",
        "loud",
        "suid",
        "dev",
        "exec",
        "x-systemd.automount",
        "x-mount.mkdir=0755",
        "comment=birch",
        "rw",
    ]
    .join(",")];
    fx.mount();
    fs::write(fx.path("f"), b"ok").unwrap();
    let flags = mount_flags(&fx.mnt);
    assert!(flags.contains(&"relatime".to_string()), "{flags:?}");
    fx.unmount();
    fx.options = vec!["noatime,nodiratime,sync,dirsync".into()];
    fx.mount();
    let flags = mount_flags(&fx.mnt);
    for f in ["noatime", "sync", "dirsync"] {
        assert!(flags.contains(&f.to_string()), "{f} missing: {flags:?}");
    }
    fx.unmount();
    fx.options = vec!["strictatime,nodiratime".into()];
    fx.mount();
    let flags = mount_flags(&fx.mnt);
    assert!(flags.contains(&"nodiratime".to_string()), "{flags:?}");
    // strictatime shows as the absence of relatime and noatime.
    assert!(
        !flags.iter().any(|f| f == "relatime" || f == "noatime"),
        "{flags:?}"
    );
    assert_eq!(fs::read(fx.path("f")).unwrap(), b"ok");
}

/// The shutdown ioctl: birch writes nothing more, as if the power went.
fn shut_down(fx: &Fixture) {
    let dir = File::open(&fx.mnt).unwrap();
    let mut flags: u32 = 0;
    // SAFETY: _IOR with a u32 the kernel may write.
    let rc = unsafe {
        libc::ioctl(
            dir.as_raw_fd(),
            birch_fuse::XFS_IOC_GOINGDOWN as libc::c_ulong,
            &mut flags,
        )
    };
    assert_eq!(rc, 0, "shutdown ioctl: {}", std::io::Error::last_os_error());
}

/// Shuts `fx` down, unmounts (the daemon's final commit fails, as it
/// must), and mounts again with `options`.
fn crash_and_remount(fx: &mut Fixture, options: &str) {
    shut_down(fx);
    if let Err(e) = fx.try_unmount() {
        assert!(e.contains("shut down"), "unexpected unmount failure: {e}");
    }
    fx.options = vec![options.into()];
    fx.mount();
}

fn remount_with(fx: &mut Fixture, options: &str) {
    fx.unmount();
    fx.options = vec![options.into()];
    fx.mount();
}

/// Changes made with `options` and no fsync, then a crash (commit=0: no
/// periodic commit either). Returns what survives: data of `d/file`,
/// whether `d/new` and `d/dir` exist, whether `d/old` was renamed to
/// `d/renamed`, whether `d/file`'s chmod to 0600 was kept.
fn survivors(tag: &str, options: &str) -> (Option<Vec<u8>>, bool, bool, bool, bool) {
    let mut fx = Fixture::new(tag, "256M");
    fx.options = vec!["commit=0".into()];
    fx.mount();
    fs::create_dir(fx.path("d")).unwrap();
    fs::write(fx.path("d/file"), b"").unwrap();
    fs::write(fx.path("d/old"), b"").unwrap();
    fx.sync();
    assert_ne!(mode_of(&fx.path("d/file")), 0o600);
    remount_with(&mut fx, &format!("commit=0,{options}"));
    let mut f = OpenOptions::new()
        .write(true)
        .open(fx.path("d/file"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"durable").unwrap();
    drop(f);
    set_mode(&fx.path("d/file"), 0o600);
    fs::write(fx.path("d/new"), b"").unwrap();
    fs::create_dir(fx.path("d/dir")).unwrap();
    fs::rename(fx.path("d/old"), fx.path("d/renamed")).unwrap();
    crash_and_remount(&mut fx, "commit=0");
    let data = fs::read(fx.path("d/file")).ok();
    (
        data,
        fx.path("d/new").exists(),
        fx.path("d/dir").is_dir(),
        fx.path("d/renamed").exists() && !fx.path("d/old").exists(),
        mode_of(&fx.path("d/file")) == 0o600,
    )
}

#[test]
fn sync_makes_every_change_durable_before_it_returns() {
    if skip_unless_root() {
        return;
    }
    let (data, new, dir, renamed, chmod) = survivors("sec-sync", "sync");
    assert_eq!(data.as_deref(), Some(&b"durable"[..]), "write lost");
    assert!(new && dir && renamed, "namespace change lost");
    assert!(chmod, "chmod lost");
}

#[test]
fn dirsync_makes_every_directory_change_durable_before_it_returns() {
    if skip_unless_root() {
        return;
    }
    let (_, new, dir, renamed, _) = survivors("sec-dirsync", "dirsync");
    assert!(new, "create lost");
    assert!(dir, "mkdir lost");
    assert!(renamed, "rename lost");
}

#[test]
fn without_sync_the_same_changes_are_lost_in_the_crash() {
    if skip_unless_root() {
        return;
    }
    // The control for the two tests above: the shutdown really drops
    // what was not made durable.
    let (data, new, dir, renamed, chmod) = survivors("sec-async", "async");
    assert_eq!(data.as_deref(), Some(&b""[..]));
    assert!(!new && !dir && !renamed && !chmod);
}

fn set_atime(p: &Path, t: SystemTime) {
    let f = File::open(p).unwrap();
    f.set_times(fs::FileTimes::new().set_accessed(t)).unwrap();
}

fn atime_of(p: &Path) -> SystemTime {
    fs::metadata(p).unwrap().accessed().unwrap()
}

/// Reads `p` past the page cache, so the read reaches birch.
fn direct_read(p: &Path) {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(p)
        .unwrap();
    let mut buf = vec![0u8; 8192];
    let aligned = buf.as_ptr().align_offset(4096);
    f.read_at(&mut buf[aligned..aligned + 4096], 0).unwrap();
}

/// (file read with an old atime updated, file read with an atime newer
/// than mtime and ctime updated, directory listed with an old atime
/// updated) on a mount with `options`.
fn atime_behaviour(tag: &str, options: &str) -> (bool, bool, bool) {
    let mut fx = Fixture::new(tag, "256M");
    fx.options = vec![options.into()];
    fx.mount();
    let f = fx.path("f");
    fs::write(&f, vec![7u8; 4096]).unwrap();
    let d = fx.path("d");
    fs::create_dir(&d).unwrap();
    let old = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let future = SystemTime::now() + Duration::from_secs(3600);
    set_atime(&f, old);
    direct_read(&f);
    let old_file = atime_of(&f) != old;
    set_atime(&f, future);
    direct_read(&f);
    let recent_file = atime_of(&f) != future;
    set_atime(&d, old);
    fs::read_dir(&d).unwrap().for_each(drop);
    let old_dir = atime_of(&d) != old;
    (old_file, recent_file, old_dir)
}

#[test]
fn atime_options_behave_as_the_kernel_defines_them() {
    if skip_unless_root() {
        return;
    }
    assert_eq!(
        atime_behaviour("sec-relatime", "relatime"),
        (true, false, true),
        "relatime"
    );
    assert_eq!(
        atime_behaviour("sec-strictatime", "strictatime"),
        (true, true, true),
        "strictatime"
    );
    assert_eq!(
        atime_behaviour("sec-noatime", "noatime"),
        (false, false, false),
        "noatime"
    );
    assert_eq!(
        atime_behaviour("sec-nodiratime", "strictatime,nodiratime"),
        (true, true, false),
        "nodiratime"
    );
}

#[test]
fn a_listing_ends_while_its_names_are_renamed_away_and_back() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("sec-readdir");
    let dir = fx.path("d");
    fs::create_dir(&dir).unwrap();
    const N: usize = 5000;
    for i in 0..N {
        File::create(dir.join(format!("f{i:05}"))).unwrap();
    }
    let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut listed = 0;
    for e in fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name();
        *seen.entry(name.as_bytes().to_vec()).or_default() += 1;
        listed += 1;
        assert!(listed <= N, "listing passed {N} entries without ending");
        // Away and back: each rename gives the name a new, higher index.
        let away = dir.join("renamed-away");
        fs::rename(dir.join(&name), &away).unwrap();
        fs::rename(&away, dir.join(&name)).unwrap();
    }
    let twice: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "{} names listed twice", twice.len());
    assert_eq!(seen.len(), N, "names missing from the listing");
    // A new listing sees every name, once.
    assert_eq!(fs::read_dir(&dir).unwrap().count(), N);
}

#[test]
fn a_directory_offset_stays_valid_across_inserts_and_deletes() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("sec-telldir");
    let dir = fx.path("d");
    fs::create_dir(&dir).unwrap();
    for i in 0..300 {
        File::create(dir.join(format!("f{i:03}"))).unwrap();
    }
    let c = cstr(&dir);
    // SAFETY: libc's directory stream over a valid path; every pointer is
    // checked before use and the stream is closed at the end.
    unsafe {
        let d = libc::opendir(c.as_ptr());
        assert!(!d.is_null());
        let next = |d: *mut libc::DIR| -> Option<Vec<u8>> {
            let e = libc::readdir(d);
            (!e.is_null()).then(|| {
                std::ffi::CStr::from_ptr((*e).d_name.as_ptr())
                    .to_bytes()
                    .to_vec()
            })
        };
        for _ in 0..100 {
            next(d).unwrap();
        }
        let mark = libc::telldir(d);
        let at_mark = next(d).unwrap();
        let rest: Vec<Vec<u8>> = std::iter::from_fn(|| next(d)).collect();
        // Entries before and after the mark come and go...
        for i in (0..300).step_by(7) {
            let name = format!("f{i:03}");
            if name.as_bytes() != at_mark.as_slice() {
                fs::remove_file(dir.join(name)).unwrap();
            }
        }
        for i in 0..50 {
            File::create(dir.join(format!("g{i:03}"))).unwrap();
        }
        // ...and the mark still leads to the same entry.
        libc::seekdir(d, mark);
        assert_eq!(next(d).unwrap(), at_mark);
        let again: Vec<Vec<u8>> = std::iter::from_fn(|| next(d)).collect();
        for name in &again {
            assert!(
                rest.contains(name),
                "{:?} appeared after the mark",
                String::from_utf8_lossy(name)
            );
        }
        libc::closedir(d);
    }
}

/// A FUSE filesystem with one file, `image`, kept in a real file; like
/// FUSE servers without direct I/O support and some network filesystems,
/// it accepts O_DIRECT at open and fails every O_DIRECT read and write
/// with EINVAL.
struct NoDirectIo {
    backing: File,
}

const IMAGE_INO: u64 = 2;

impl NoDirectIo {
    fn attr(&self, ino: u64) -> fuser::FileAttr {
        let (kind, perm, size) = if ino == 1 {
            (fuser::FileType::Directory, 0o755, 0)
        } else {
            (
                fuser::FileType::RegularFile,
                0o644,
                self.backing.metadata().unwrap().len(),
            )
        };
        fuser::FileAttr {
            ino: fuser::INodeNo(ino),
            size,
            blocks: size / 512,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

impl fuser::Filesystem for NoDirectIo {
    fn lookup(
        &self,
        _req: &fuser::Request,
        parent: fuser::INodeNo,
        name: &OsStr,
        reply: fuser::ReplyEntry,
    ) {
        if parent == fuser::INodeNo::ROOT && name == "image" {
            reply.entry(&Duration::ZERO, &self.attr(IMAGE_INO), fuser::Generation(0));
        } else {
            reply.error(fuser::Errno::ENOENT);
        }
    }

    fn getattr(
        &self,
        _req: &fuser::Request,
        ino: fuser::INodeNo,
        _fh: Option<fuser::FileHandle>,
        reply: fuser::ReplyAttr,
    ) {
        reply.attr(&Duration::ZERO, &self.attr(ino.0));
    }

    fn read(
        &self,
        _req: &fuser::Request,
        _ino: fuser::INodeNo,
        _fh: fuser::FileHandle,
        offset: u64,
        size: u32,
        flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: fuser::ReplyData,
    ) {
        if flags.0 & libc::O_DIRECT != 0 {
            return reply.error(fuser::Errno::EINVAL);
        }
        let mut buf = vec![0u8; size as usize];
        let n = self.backing.read_at(&mut buf, offset).unwrap();
        reply.data(&buf[..n]);
    }

    fn write(
        &self,
        _req: &fuser::Request,
        _ino: fuser::INodeNo,
        _fh: fuser::FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        if flags.0 & libc::O_DIRECT != 0 {
            return reply.error(fuser::Errno::EINVAL);
        }
        self.backing.write_all_at(data, offset).unwrap();
        reply.written(data.len() as u32);
    }

    fn fsync(
        &self,
        _req: &fuser::Request,
        _ino: fuser::INodeNo,
        _fh: fuser::FileHandle,
        _datasync: bool,
        reply: fuser::ReplyEmpty,
    ) {
        match self.backing.sync_data() {
            Ok(()) => reply.ok(),
            Err(_) => reply.error(fuser::Errno::EIO),
        }
    }
}

/// Unmounts the [`NoDirectIo`] filesystem on drop.
struct ServedImage(Option<fuser::BackgroundSession>);

impl Drop for ServedImage {
    fn drop(&mut self) {
        if let Some(session) = self.0.take() {
            if let Err(e) = session.umount_and_join() {
                eprintln!("unmount of the test FUSE filesystem: {e}");
            }
        }
    }
}

#[test]
fn an_image_whose_filesystem_fails_o_direct_reads_is_served_buffered() {
    if skip_unless_root() {
        return;
    }
    let host = Scratch::new("sec-nodio-host");
    let backing = host.path("backing.img");
    run_ok(Command::new(common::BIRCH).args(["mkfs", backing.to_str().unwrap(), "--size", "128M"]));
    let served = host.path("served");
    fs::create_dir(&served).unwrap();
    let fs_impl = NoDirectIo {
        backing: OpenOptions::new()
            .read(true)
            .write(true)
            .open(&backing)
            .unwrap(),
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::FSName("nodio".into())];
    config.acl = fuser::SessionACL::All;
    // Declared before the fixture: dropped after it, once birch is gone.
    let _server = ServedImage(Some(fuser::spawn_mount(fs_impl, &served, &config).unwrap()));
    let image = served.join("image");
    // The setting this test is about: O_DIRECT opens, then fails reads.
    let direct = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&image)
        .expect("O_DIRECT open accepted");
    let mut buf = vec![0u8; 8192];
    let aligned = buf.as_ptr().align_offset(4096);
    let e = direct
        .read_at(&mut buf[aligned..aligned + 4096], 0)
        .expect_err("O_DIRECT read must fail here");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    drop(direct);
    // birch's own open of such an image (an unprivileged mount, or any
    // mount without a loop device) finds out at open, where the mount
    // falls back to buffered I/O with a message; buffered opens work.
    let probed = birch::device::FileDevice::open(&image, true)
        .err()
        .and_then(|e| e.raw_os_error());
    assert_eq!(probed, Some(libc::EINVAL), "the O_DIRECT probe read");
    birch::device::FileDevice::open(&image, false).expect("buffered open");

    // As root the image is served through a loop device, whose direct I/O
    // on the image works here; either way the image mounts and serves.
    let mut fx = Fixture::new("sec-nodio", "64M");
    fx.image = image;
    fx.mount();
    fs::write(fx.path("f"), b"served buffered").unwrap();
    fx.remount();
    assert_eq!(fs::read(fx.path("f")).unwrap(), b"served buffered");
    fx.unmount();
    fx.assert_clean();
    fx.check_at_drop = false;
}

/// A file created write-only is written through direct I/O
/// (docs/FUSE.md "Direct I/O for write-only creates"), so the kernel no
/// longer drops set-ID bits before each write itself: it flags the write
/// FUSE_WRITE_KILL_SUIDGID and birch drops them. The owner (no
/// CAP_FSETID) makes its file set-user-ID and set-group-ID through the
/// descriptor it created it with, then writes: both bits go (group-execute
/// is set), in the kernel's cache, from birch and after a remount. A
/// reader that opened the file and read it before the write reads the new
/// data: the direct write invalidates the reader's cached pages.
#[test]
fn a_write_only_create_drops_set_id_on_write_and_readers_see_the_data() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("sec-direct-create");
    let dir = fx.path("d");
    fs::create_dir(&dir).unwrap();
    set_mode(&dir, 0o777);
    let f = dir.join("f");
    let script = format!(
        "import os\n\
         fd = os.open('{f}', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)\n\
         os.write(fd, b'old data')\n\
         os.fchmod(fd, 0o6755)\n\
         r = os.open('{f}', os.O_RDONLY)\n\
         assert os.read(r, 8) == b'old data'\n\
         print(oct(os.fstat(fd).st_mode & 0o7777))\n\
         os.pwrite(fd, b'new', 0)\n\
         print(os.pread(r, 8, 0).decode())\n",
        f = f.display()
    );
    let out = as_user(
        NOBODY,
        NOBODY,
        &[],
        &["/usr/bin/python3".as_ref(), "-c".as_ref(), script.as_ref()],
    );
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        text(&out.stdout),
        "0o6755\nnew data\n",
        "before the write, after it"
    );
    assert_eq!(cached_mode_of(&f), 0o755, "the kernel's cached mode");
    assert_eq!(mode_of(&f), 0o755, "birch's mode");
    fx.remount();
    assert_eq!(mode_of(&f), 0o755, "after a remount");
    assert_eq!(fs::read(&f).unwrap(), b"new data");
}

/// `security.capability` goes on a write, by any writer (the kernel's
/// cap_inode_killpriv, which a direct-I/O write skips): root creates a
/// file write-only, gives it a file capability, writes through the same
/// descriptor, and the capability is gone, also after a remount.
#[test]
fn a_write_only_create_loses_its_file_capability_on_write() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("sec-direct-cap");
    let f = fx.path("f");
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .open(&f)
        .unwrap();
    file.write_all(b"first").unwrap();
    // VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE, permitted CAP_NET_RAW.
    let mut cap = Vec::new();
    for word in [0x0200_0001u32, 1 << 13, 0, 0, 0] {
        cap.extend_from_slice(&word.to_le_bytes());
    }
    let name = c"security.capability";
    let path = cstr(&f);
    // SAFETY: C strings we own and a buffer of the given length.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            cap.as_ptr().cast(),
            cap.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
    let capability_len = || {
        // SAFETY: a size query (null buffer, length 0) on C strings we own.
        let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        (n >= 0).then_some(n)
    };
    assert_eq!(capability_len(), Some(20), "the capability is set");
    file.write_all(b" second").unwrap();
    assert_eq!(
        capability_len(),
        None,
        "a write removes security.capability"
    );
    drop(file);
    fx.remount();
    assert_eq!(capability_len(), None, "after a remount");
    assert_eq!(fs::read(&f).unwrap(), b"first second");
}
