//! An image or device in use is not formatted, and what holds it is
//! named: `birch mkfs`, even with `--force`, refuses a mounted image, a
//! mounted block device and an image attached to a loop device; and after
//! a crashed daemon's mount was detached (`umount -l`) while a program
//! still had a file open in it, a new mount names that program instead of
//! "another birch process".
//!
//! Run: `cargo test -p birch-cli --test mount_in_use` as root (needs
//! /dev/fuse and loop devices).

mod common;

use common::{birch, mount_fstype, run, run_ok, skip_unless_root, text, Fixture};
use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Bound for the kernel to let go of a lazily unmounted mount (failure,
/// not measurement).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);

#[track_caller]
fn assert_refused(out: &Output, wants: &[&str]) {
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "accepted: {}{err}",
        text(&out.stdout)
    );
    for want in wants {
        assert!(err.contains(want), "stderr lacks '{want}': {err}");
    }
}

#[test]
fn mkfs_of_a_mounted_image_is_refused_even_with_force() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("inuse-mkfs", "256M");
    fx.mount();
    fs::write(fx.path("keep"), b"kept").unwrap();
    fx.sync();
    for args in [
        vec!["mkfs", fx.image_str(), "--force"],
        vec!["mkfs", fx.image_str()],
    ] {
        assert_refused(
            &birch(&args),
            &[
                "already mounted",
                &format!("pid {} (birch)", fx.pid()),
                "not formatting it",
            ],
        );
    }
    fs::write(fx.path("after"), b"still served").unwrap();
    fx.unmount();
    fx.assert_clean();
    fx.mount();
    assert_eq!(fs::read(fx.path("keep")).unwrap(), b"kept");
    assert_eq!(fs::read(fx.path("after")).unwrap(), b"still served");
}

/// A loop device attached to an image, detached on drop.
struct Loop(PathBuf);

impl Loop {
    fn attach(image: &Path) -> Loop {
        let out = run_ok(Command::new("losetup").args(["-f", "--show"]).arg(image));
        Loop(PathBuf::from(text(&out.stdout).trim()))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

/// Unmounts (lazily, as root may) whatever is left at `0` on drop.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if mount_fstype(&self.0).is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

#[test]
fn mkfs_of_an_attached_or_mounted_block_device_is_refused() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::new("inuse-loop", "256M");
    let dev = Loop::attach(&fx.image);
    // The image file is attached to a loop device (by anyone).
    assert_refused(
        &birch(&["mkfs", fx.image_str(), "--force"]),
        &[
            &format!("attached to {}", dev.0.display()),
            "not formatting it",
        ],
    );
    // The block device itself, mounted (fuseblk holds it exclusively).
    let _unmount = Unmount(fx.mnt.clone());
    run_ok(
        Command::new(common::BIRCH)
            .arg("mount")
            .arg(&dev.0)
            .arg(&fx.mnt),
    );
    assert_refused(
        &birch(&["mkfs", dev.0.to_str().unwrap(), "--force"]),
        &["is in use", "(birch) holds its lock", "not formatting it"],
    );
    fs::write(fx.path("f"), b"served").unwrap();
    run_ok(Command::new("umount").arg(&fx.mnt));
    // The daemon lets go of the device once its final commit is done.
    let start = Instant::now();
    let device = File::open(&dev.0).unwrap();
    // SAFETY: flock on an fd we own.
    while unsafe { libc::flock(device.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        assert!(start.elapsed() < RELEASE_TIMEOUT, "daemon did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(device);
    drop(dev);
    fx.assert_clean();
}

/// A child process, killed and reaped on drop.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until nothing holds the image's lock any more.
fn wait_until_unlocked(image: &Path) {
    let file = File::open(image).unwrap();
    let start = Instant::now();
    // SAFETY: flock on an fd we own.
    while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        assert!(
            start.elapsed() < RELEASE_TIMEOUT,
            "{} still locked {RELEASE_TIMEOUT:?} after the last open file was closed",
            image.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_lazily_unmounted_mount_with_open_files_is_named_as_the_holder() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("inuse-lazy", "256M");
    fx.mount();
    fs::write(fx.path("f"), b"held").unwrap();
    fx.sync();
    // A program with a file open in the mount: its stdin.
    let sleeper = Holder(
        Command::new("sleep")
            .arg("600")
            .stdin(File::open(fx.path("f")).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let sleeper_pid = sleeper.0.id();
    fx.kill_daemon();
    let held_by = format!("pid {sleeper_pid} (sleep)");
    let out = run(Command::new(common::BIRCH)
        .arg("mount")
        .arg(&fx.image)
        .arg(&fx.mnt));
    assert_refused(&out, &["umount -l", &held_by]);
    assert!(
        !text(&out.stderr).contains("another birch process"),
        "{}",
        text(&out.stderr)
    );
    assert_refused(
        &birch(&["mkfs", fx.image_str(), "--force"]),
        &["umount -l", &held_by, "not formatting it"],
    );
    drop(sleeper);
    wait_until_unlocked(&fx.image);
    fx.mount();
    assert_eq!(fs::read(fx.path("f")).unwrap(), b"held");
}
