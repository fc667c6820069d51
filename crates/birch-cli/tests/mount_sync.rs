//! sync(1), `sync -f`, syncfs(2) and `mount -o remount` on a real mount.
//!
//! The kernel forwards syncfs to a FUSE server only on `fuseblk` mounts, so
//! as root `birch mount` mounts an image through a loop device it attaches
//! (auto-clearing) and a block device directly (docs/FUSE.md). Each
//! durability test mounts with `commit=0` (no periodic commit), makes
//! changes, syncs the way under test, then cuts the power: the shutdown
//! ioctl stops every device write and the daemon is SIGKILLed, so only what
//! the sync made durable can be there at the next mount.
//!
//! Needs root and /dev/fuse (skips otherwise, fails with
//! BIRCH_REQUIRE_MOUNT=1).

mod common;

use common::{skip_unless_root, Fixture};
use std::ffi::CString;
use std::fs::{self, File};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long a loop device may take to go away once its last user is gone
/// (a bound for a hung test, not a performance claim).
const DETACH_TIMEOUT: Duration = Duration::from_secs(60);

/// A mounted fixture that only syncs and fsyncs make durable.
fn unsynced_fixture(tag: &str) -> Fixture {
    let mut fx = Fixture::new(tag, "512M");
    fx.options = vec!["commit=0".into()];
    fx.mount();
    fx
}

/// Names, data, a directory, a rename, a link and a symlink: the changes
/// a sync must make durable.
fn make_changes(fx: &Fixture) {
    fs::write(fx.path("file"), b"synced data").unwrap();
    fs::create_dir(fx.path("dir")).unwrap();
    fs::write(fx.path("dir/inner"), vec![7u8; 200_000]).unwrap();
    fs::write(fx.path("old-name"), b"renamed").unwrap();
    fs::rename(fx.path("old-name"), fx.path("dir/new-name")).unwrap();
    fs::hard_link(fx.path("file"), fx.path("dir/link")).unwrap();
    std::os::unix::fs::symlink("dir/inner", fx.path("symlink")).unwrap();
}

fn assert_changes_present(fx: &Fixture) {
    assert_eq!(fs::read(fx.path("file")).unwrap(), b"synced data");
    assert_eq!(fs::read(fx.path("dir/inner")).unwrap(), vec![7u8; 200_000]);
    assert_eq!(fs::read(fx.path("dir/new-name")).unwrap(), b"renamed");
    assert!(!fx.path("old-name").exists());
    assert_eq!(fs::read(fx.path("dir/link")).unwrap(), b"synced data");
    assert_eq!(
        fs::read_link(fx.path("symlink")).unwrap(),
        Path::new("dir/inner")
    );
}

/// Power cut through the mount (`Fixture::power_cut`: the shutdown ioctl,
/// proof that it took, unmount); the image must be clean as the cut left it.
fn power_cut(fx: &mut Fixture) {
    fx.power_cut();
    fx.assert_clean();
}

fn run_ok(program: &str, args: &[&str]) {
    common::run_ok(Command::new(program).args(args));
}

/// The source of the mount at `mnt` (from /proc/self/mountinfo).
fn mount_source(mnt: &Path) -> String {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = mnt.to_str().unwrap();
    info.lines()
        .filter(|l| l.split(' ').nth(4) == Some(want))
        .filter_map(|l| l.split_once(" - "))
        .filter_map(|(_, rest)| rest.split(' ').nth(1).map(str::to_string))
        .next_back()
        .unwrap_or_else(|| panic!("{want} is not mounted"))
}

/// The image the loop device `dev` (/dev/loopN) is bound to, if any.
fn loop_backing(dev: &str) -> Option<String> {
    let name = dev.strip_prefix("/dev/")?;
    fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Waits until the loop device `dev` is no longer bound to `image`.
fn wait_detached(dev: &str, image: &Path) {
    let start = Instant::now();
    let image = image.to_str().unwrap();
    while loop_backing(dev).as_deref() == Some(image) {
        assert!(
            start.elapsed() < DETACH_TIMEOUT,
            "{dev} still bound to {image} {DETACH_TIMEOUT:?} after its last user went"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The loop device an image mount sits on, checked to be bound to the image.
fn image_loop_device(fx: &Fixture) -> String {
    let source = mount_source(&fx.mnt);
    assert!(source.starts_with("/dev/loop"), "mount source {source}");
    assert_eq!(loop_backing(&source).as_deref(), Some(fx.image_str()));
    source
}

#[test]
fn sync_command_makes_everything_durable() {
    if skip_unless_root() {
        return;
    }
    let mut fx = unsynced_fixture("sync-cmd");
    make_changes(&fx);
    run_ok("sync", &[]);
    power_cut(&mut fx);
    fx.mount();
    assert_changes_present(&fx);
}

#[test]
fn sync_f_of_the_mount_makes_everything_durable() {
    if skip_unless_root() {
        return;
    }
    let mut fx = unsynced_fixture("sync-f");
    make_changes(&fx);
    run_ok("sync", &["-f", fx.mnt.to_str().unwrap()]);
    power_cut(&mut fx);
    fx.mount();
    assert_changes_present(&fx);
}

#[test]
fn syncfs_makes_everything_durable() {
    if skip_unless_root() {
        return;
    }
    let mut fx = unsynced_fixture("syncfs");
    make_changes(&fx);
    // syncfs on any file of the filesystem, here one deep inside it.
    let f = File::open(fx.path("dir/inner")).unwrap();
    // SAFETY: syncfs on an fd we own.
    assert_eq!(
        unsafe { libc::syncfs(f.as_raw_fd()) },
        0,
        "syncfs: {}",
        std::io::Error::last_os_error()
    );
    drop(f);
    power_cut(&mut fx);
    fx.mount();
    assert_changes_present(&fx);
}

/// Without a sync, the power cut loses the changes: the tests above prove
/// the sync, not some other commit.
#[test]
fn without_sync_a_power_cut_loses_the_changes() {
    if skip_unless_root() {
        return;
    }
    let mut fx = unsynced_fixture("nosync");
    make_changes(&fx);
    power_cut(&mut fx);
    fx.mount();
    assert!(!fx.path("file").exists());
    assert!(!fx.path("dir").exists());
}

/// A loop device created with losetup (no auto-clear), detached at drop.
struct TestLoop(String);

impl TestLoop {
    fn attach(image: &Path) -> TestLoop {
        let out = common::run_ok(
            Command::new("losetup")
                .args(["--find", "--show"])
                .arg(image),
        );
        TestLoop(common::text(&out.stdout).trim().to_string())
    }
}

impl Drop for TestLoop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[test]
fn block_device_mounts_as_fuseblk_and_sync_reaches_it() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::new("sync-blkdev", "512M");
    let dev = TestLoop::attach(&fx.image);
    // Moved into a binding declared after the loop device, so that on any
    // exit the fixture (unmount) drops before the device is detached.
    let mut fx = fx;
    fx.image = PathBuf::from(&dev.0);
    fx.options = vec!["commit=0".into()];
    fx.mount();
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == fx.mnt.to_str())
        .expect("mount listed in /proc/mounts");
    let fields: Vec<&str> = line.split(' ').collect();
    assert_eq!(fields[0], dev.0, "{line}");
    assert_eq!(fields[2], "fuseblk.birch", "{line}");
    // A second mount of the device shares the running one (a bind mount,
    // mount_again.rs), as btrfs mounts one device twice.
    let other = fx.scratch.path("other");
    fs::create_dir(&other).unwrap();
    let out = common::birch(&["mount", &dev.0, other.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let same_fs = fs::metadata(&other).unwrap().dev() == fs::metadata(&fx.mnt).unwrap().dev();
    // SAFETY: a valid C string.
    let rc = unsafe { libc::umount2(common::cstr(&other).as_ptr(), 0) };
    assert!(
        same_fs && rc == 0,
        "second mount of {}: same filesystem {same_fs}, umount {rc}",
        dev.0
    );
    make_changes(&fx);
    run_ok("sync", &["-f", fx.mnt.to_str().unwrap()]);
    power_cut(&mut fx);
    fx.mount();
    assert_changes_present(&fx);
}

#[test]
fn image_mount_loop_device_goes_away_after_unmount_and_after_sigkill() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("sync-loop", "512M");
    fx.mount();
    let dev = image_loop_device(&fx);
    fs::write(fx.path("f"), b"x").unwrap();
    fx.unmount();
    wait_detached(&dev, &fx.image);

    fx.mount();
    let dev = image_loop_device(&fx);
    fx.kill_daemon();
    wait_detached(&dev, &fx.image);
    fx.assert_clean();
    fx.mount();
    assert_eq!(fs::read(fx.path("f")).unwrap(), b"x");
}

/// `mount -o remount,MODE MNT`. A remount read-only fails with EBUSY while
/// any file of the mount is open for writing, and a child that another
/// test thread forks holds a copy of this thread's just-closed descriptors
/// until it execs: so "busy" is retried for a while.
fn remount(fx: &Fixture, mode: &str) {
    let mut cmd = Command::new("mount");
    cmd.args(["-o", &format!("remount,{mode}")]).arg(&fx.mnt);
    for _ in 0..100 {
        let out = common::run(&mut cmd);
        if out.status.success() {
            return;
        }
        let err = common::text(&out.stderr);
        assert!(err.contains("busy"), "{cmd:?} failed: {err}");
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{cmd:?}: still busy after 100 attempts");
}

fn errno_of<T: std::fmt::Debug>(result: std::io::Result<T>) -> i32 {
    result
        .expect_err("a change succeeded on a read-only mount")
        .raw_os_error()
        .unwrap_or(0)
}

fn setxattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: valid C strings and a buffer of `value.len()` bytes.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn remount_ro_commits_and_refuses_every_change() {
    if skip_unless_root() {
        return;
    }
    let mut fx = unsynced_fixture("remount-ro");
    make_changes(&fx);
    remount(&fx, "ro");
    let erofs = libc::EROFS;
    assert_eq!(errno_of(fs::write(fx.path("new"), b"x")), erofs);
    assert_eq!(
        errno_of(File::options().write(true).open(fx.path("file"))),
        erofs
    );
    assert_eq!(errno_of(fs::create_dir(fx.path("newdir"))), erofs);
    assert_eq!(errno_of(fs::remove_file(fx.path("file"))), erofs);
    assert_eq!(
        errno_of(fs::rename(fx.path("file"), fx.path("renamed"))),
        erofs
    );
    assert_eq!(
        errno_of(fs::hard_link(fx.path("file"), fx.path("link2"))),
        erofs
    );
    assert_eq!(errno_of(setxattr(&fx.path("file"), "user.k", b"v")), erofs);
    assert_eq!(
        errno_of(fs::set_permissions(
            fx.path("file"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600)
        )),
        erofs
    );
    // Reads still work.
    assert_changes_present(&fx);
    // The remount itself made everything durable.
    power_cut(&mut fx);
    fx.mount();
    assert_changes_present(&fx);
}

#[test]
fn remount_rw_allows_changes_again() {
    if skip_unless_root() {
        return;
    }
    let mut fx = unsynced_fixture("remount-rw");
    fs::write(fx.path("before"), b"1").unwrap();
    remount(&fx, "ro");
    assert_eq!(errno_of(fs::write(fx.path("during"), b"2")), libc::EROFS);
    remount(&fx, "rw");
    let mut f = File::create(fx.path("after")).unwrap();
    f.write_all(b"3").unwrap();
    drop(f);
    fs::write(fx.path("before"), b"1 and more").unwrap();
    run_ok("sync", &["-f", fx.mnt.to_str().unwrap()]);
    power_cut(&mut fx);
    fx.mount();
    assert_eq!(fs::read(fx.path("before")).unwrap(), b"1 and more");
    assert_eq!(fs::read(fx.path("after")).unwrap(), b"3");
    assert!(!fx.path("during").exists());
}

/// Mounts `fx` read-only (`-o ro`, no periodic commit) over the image it
/// has, checked to be read-only in the kernel and refusing a change.
fn mount_ro(fx: &mut Fixture) {
    fx.options = vec!["ro".into(), "commit=0".into()];
    fx.mount();
    assert_eq!(errno_of(fs::write(fx.path("refused"), b"x")), libc::EROFS);
}

/// The log root the image's superblock points at (0: none), read from the
/// image with `birch dump` while nothing writes to it.
fn log_root(fx: &Fixture) -> u64 {
    let out = common::run_ok(Command::new(common::BIRCH).args(["dump", fx.image_str(), "super"]));
    common::text(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("log_root_bytenr "))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("dump super shows log_root_bytenr")
}

/// `birch mount -o ro` then `mount -o remount,rw`: birch's engine, opened
/// read-only, switches to read-write and what is written then is as
/// durable as on any mount.
#[test]
fn ro_mount_remounted_rw_accepts_changes_and_they_are_durable() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("ro-then-rw", "512M");
    fx.mount();
    fs::write(fx.path("before"), b"committed").unwrap();
    fx.unmount();
    mount_ro(&mut fx);
    // Through a loop device attached read-write (the image is writable),
    // so the kernel allows remount,rw.
    image_loop_device(&fx);
    assert_eq!(fs::read(fx.path("before")).unwrap(), b"committed");
    remount(&fx, "rw");
    make_changes(&fx);
    fs::write(fx.path("before"), b"changed").unwrap();
    run_ok("sync", &["-f", fx.mnt.to_str().unwrap()]);
    power_cut(&mut fx);
    fx.options = vec!["commit=0".into()];
    fx.mount();
    assert_changes_present(&fx);
    assert_eq!(fs::read(fx.path("before")).unwrap(), b"changed");
}

/// A log found by a read-only mount is replayed into memory only (the
/// fsynced file is visible, nothing is written); `remount,rw` commits it,
/// as a read-write mount would have at mount time.
#[test]
fn ro_mount_with_a_log_replays_it_at_remount_rw() {
    if skip_unless_root() {
        return;
    }
    let mut fx = unsynced_fixture("ro-log");
    fs::write(fx.path("kept"), b"committed").unwrap();
    run_ok("sync", &["-f", fx.mnt.to_str().unwrap()]);
    let mut f = File::create(fx.path("logged")).unwrap();
    f.write_all(b"fsynced only").unwrap();
    f.sync_all().unwrap();
    drop(f);
    power_cut(&mut fx);
    let log = log_root(&fx);
    assert_ne!(log, 0, "the fsync left a log");

    mount_ro(&mut fx);
    assert_eq!(fs::read(fx.path("logged")).unwrap(), b"fsynced only");
    assert_eq!(log_root(&fx), log, "a read-only mount writes nothing");
    remount(&fx, "rw");
    // The switch happens at the remount or, at the latest, before birch
    // answers this sync: either way the log is committed by now.
    run_ok("sync", &["-f", fx.mnt.to_str().unwrap()]);
    power_cut(&mut fx);
    assert_eq!(log_root(&fx), 0, "remount,rw committed the log");

    fx.options = vec!["commit=0".into()];
    fx.mount();
    assert_eq!(fs::read(fx.path("logged")).unwrap(), b"fsynced only");
    assert_eq!(fs::read(fx.path("kept")).unwrap(), b"committed");
    fx.unmount();
    fx.assert_clean();
}

/// ro → rw → ro → rw on a mount started read-only: the second `remount,ro`
/// commits (its syncfs reaches the now read-write engine) and the kernel
/// refuses changes again; the last `remount,rw` allows them again.
#[test]
fn remount_ro_after_rw_again() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("ro-rw-ro", "512M");
    mount_ro(&mut fx);
    remount(&fx, "rw");
    fs::write(fx.path("while-rw"), b"1").unwrap();
    remount(&fx, "ro");
    assert_eq!(errno_of(fs::write(fx.path("while-ro"), b"2")), libc::EROFS);
    assert_eq!(fs::read(fx.path("while-rw")).unwrap(), b"1");
    remount(&fx, "rw");
    fs::write(fx.path("rw-again"), b"3").unwrap();
    // Only what the second remount,ro made durable survives this cut.
    power_cut(&mut fx);
    fx.options = vec!["commit=0".into()];
    fx.mount();
    assert_eq!(fs::read(fx.path("while-rw")).unwrap(), b"1");
    assert!(!fx.path("while-ro").exists());
    assert!(!fx.path("rw-again").exists());
}
