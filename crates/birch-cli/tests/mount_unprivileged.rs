//! `birch mkfs` and `birch mount` by an ordinary user, with no options:
//! the mount goes through the setuid fusermount3, which grants users
//! neither `dev`, `suid` nor (without `user_allow_other` in
//! /etc/fuse.conf) `allow_other`, so birch must not ask for them, and says
//! in one line what it left out.
//!
//! The test runs as root (as CI does) and drops to `nobody` for every
//! command of the user's: the child processes get uid/gid 65534 and no
//! supplementary groups. It needs fusermount3 setuid root and a /dev/fuse
//! that users may open (udev's rule makes it 0666; scripts/install-deps.sh
//! does the same where there is no udev). Skips without root, fails with
//! BIRCH_REQUIRE_MOUNT=1.

mod common;

use common::{mount_fstype, run, skip_unless_root, text, wait_timeout, Scratch, BIRCH};
use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;
const NOGROUP: u32 = 65534;
/// A second unprivileged uid/gid with no passwd entry.
const OTHER: u32 = 1234;

/// Bounds for a hung mount or daemon (failure, not measurement).
const TIMEOUT: Duration = Duration::from_secs(60);

/// `program args` as the unprivileged user, in `dir`.
fn as_user(dir: &Path, program: &str, args: &[&str]) -> Output {
    run(Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .uid(NOBODY)
        .gid(NOGROUP))
}

#[track_caller]
fn assert_ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} as uid {NOBODY} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// What the machine must provide for any user to mount FUSE.
fn assert_users_may_mount() {
    let fusermount = std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join("fusermount3"))
                .find(|p| p.exists())
        })
        .expect("fusermount3 is not installed (scripts/install-deps.sh installs fuse3)");
    let meta = fs::metadata(&fusermount).unwrap();
    assert!(
        meta.uid() == 0 && meta.permissions().mode() & 0o4000 != 0,
        "{} is not setuid root",
        fusermount.display()
    );
    let dev_fuse = fs::metadata("/dev/fuse").unwrap().permissions().mode();
    assert!(
        dev_fuse & 0o006 == 0o006,
        "/dev/fuse is mode {:o}: users cannot open it (fusermount3 opens it as the \
         user); udev's rule makes it 0666, scripts/install-deps.sh does where there is no udev",
        dev_fuse & 0o777
    );
}

fn user_allow_other() -> bool {
    fs::read_to_string("/etc/fuse.conf")
        .is_ok_and(|c| c.lines().any(|l| l.trim() == "user_allow_other"))
}

/// The super options and mount flags of the mount at `path` (the top one
/// of a stack: the last line).
fn mount_options(path: &Path) -> String {
    let want = path.to_str().unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .rev()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let dash = f.iter().position(|x| *x == "-")?;
            let superopts = f.get(dash + 3)?;
            (f.get(4) == Some(&want)).then(|| format!("{},{superopts}", f[5]))
        })
        .unwrap_or_default()
}

/// Waits until no process holds `image`'s lock: the daemon has committed,
/// closed the image and exited.
fn wait_for_daemon_exit(image: &Path) {
    let file = File::open(image).unwrap();
    let start = Instant::now();
    // SAFETY: flock on an fd we own.
    while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        assert!(
            start.elapsed() < TIMEOUT,
            "the daemon still holds {} {TIMEOUT:?} after unmount",
            image.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Takes down whatever is still mounted at the mount point (as root, who
/// may unmount anyone's mount) if the test fails part-way.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if mount_fstype(&self.0).is_some() {
            let target = common::cstr(&self.0);
            // SAFETY: a valid C string.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

#[test]
fn user_mounts_own_image_with_no_options() {
    if skip_unless_root() {
        return;
    }
    assert_users_may_mount();
    let scratch = Scratch::new("unprivileged");
    let dir = scratch.dir.clone();
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOGROUP)).unwrap();
    let mnt = scratch.path("mnt");
    let image = scratch.path("u.img");
    let _unmount = Unmount(mnt.clone());
    assert_ok("mkdir", &as_user(&dir, "mkdir", &["mnt"]));
    assert_ok(
        "birch mkfs",
        &as_user(&dir, BIRCH, &["mkfs", "u.img", "--size", "256M"]),
    );
    assert_eq!(fs::metadata(&image).unwrap().uid(), NOBODY);

    // Detached, as a user types it.
    let out = as_user(&dir, BIRCH, &["mount", "u.img", "mnt"]);
    assert_ok("birch mount", &out);
    let note = text(&out.stderr);
    assert_eq!(note.lines().count(), 1, "one line of notes, got:\n{note}");
    assert!(note.starts_with("birch: not root:"), "{note}");
    assert!(note.contains("nosuid,nodev"), "{note}");
    assert_eq!(
        note.contains("without allow_other"),
        !user_allow_other(),
        "{note}"
    );
    assert_eq!(mount_fstype(&mnt).as_deref(), Some("fuse.birch"));
    let options = mount_options(&mnt);
    for want in ["nosuid", "nodev", "user_id=65534", "default_permissions"] {
        assert!(
            options.split(',').any(|o| o == want),
            "{want} missing: {options}"
        );
    }
    // The root directory is the user's (mkfs gave it to its caller).
    assert_ok(
        // The mount's owner may scrub it (docs/FUSE.md, "Who may send
        // which ioctl"), and set and inherit POSIX ACLs.
        "write, read, sync, scrub and ACLs",
        &as_user(
            &dir,
            "sh",
            &[
                "-c",
                &format!(
                    "set -e; mkdir mnt/d; echo data > mnt/d/f; test \"$(cat mnt/d/f)\" = data; \
                     test \"$(stat -c %u mnt)\" = {NOBODY}; {BIRCH} sync mnt; \
                     {BIRCH} scrub mnt > /dev/null; \
                     setfacl -m u:{OTHER}:r mnt/d/f; getfacl -cE mnt/d/f | grep -qx user:{OTHER}:r--; \
                     setfacl -d -m u:{OTHER}:rwx mnt/d; touch mnt/d/g; \
                     getfacl -cE mnt/d/g | grep -qx user:{OTHER}:rwx"
                ),
            ],
        ),
    );
    // Another user gains nothing over the user's mount: with allow_other
    // it reaches the mount but may not scrub it (nor shut it down: the
    // same rule, tested on root's mount in mount_security.rs); without,
    // it cannot even open it.
    let other = run(Command::new(BIRCH)
        .args(["scrub", "mnt"])
        .current_dir(&dir)
        .uid(OTHER)
        .gid(OTHER));
    let refusal = if user_allow_other() {
        "Operation not permitted"
    } else {
        "Permission denied"
    };
    assert!(
        !other.status.success() && text(&other.stderr).contains(refusal),
        "scrub of uid {NOBODY}'s mount by uid {OTHER}: {}{}",
        text(&other.stdout),
        text(&other.stderr)
    );
    assert_ok(
        "fusermount3 -u",
        &as_user(&dir, "fusermount3", &["-u", "mnt"]),
    );
    wait_for_daemon_exit(&image);
    assert_eq!(mount_fstype(&mnt), None);

    // In the foreground, ended by SIGTERM: the daemon may not umount(2),
    // so it goes through fusermount3, and commits what was written.
    let mut daemon = Command::new(BIRCH)
        .args(["mount", "-f", "u.img", "mnt"])
        .current_dir(&dir)
        .uid(NOBODY)
        .gid(NOGROUP)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while mount_fstype(&mnt).is_none() {
        assert!(start.elapsed() < TIMEOUT, "foreground mount not live");
        assert!(daemon.try_wait().unwrap().is_none(), "daemon exited");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_ok(
        "write",
        &as_user(&dir, "sh", &["-c", "echo more > mnt/d/g"]),
    );
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let status = wait_timeout(&mut daemon, TIMEOUT).expect("daemon did not exit after SIGTERM");
    assert!(status.success(), "daemon exited with {status}");
    assert_eq!(mount_fstype(&mnt), None);

    let out = run(Command::new(BIRCH).args(["check", image.to_str().unwrap()]));
    assert!(
        out.status.success() && text(&out.stdout).contains("result: clean"),
        "birch check: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // What both mounts wrote reached the image.
    let dump = text(
        &run(Command::new(BIRCH).args(["dump", image.to_str().unwrap(), "tree", "fs"])).stdout,
    );
    for name in ["f", "g"] {
        assert!(
            dump.lines()
                .any(|l| l.trim_end().ends_with(&format!("name: {name}"))),
            "{name} not in the fs tree:\n{dump}"
        );
    }
}
