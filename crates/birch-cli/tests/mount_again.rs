//! A second `birch mount` of an image a running mount serves: a bind mount
//! of the chosen subvolume in the running mount, as btrfs shares one
//! filesystem between mounts of one device (docs/SNAPSHOTS.md, "A second
//! mount of a mounted image"; fstests generic/732).
//!
//! Needs root and /dev/fuse (skips otherwise, fails with
//! BIRCH_REQUIRE_MOUNT=1).

mod common;

use common::{birch, cstr, mount_fstype, skip_unless_root, text, Fixture};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

const NOBODY: u32 = 65534;

/// Mount points of second mounts, unmounted when the test ends (first,
/// so that the fixture's daemon can exit when its own mount goes).
struct SecondMounts(Vec<PathBuf>);

impl SecondMounts {
    /// `birch mount [-o OPTIONS] IMAGE <scratch>/NAME`, which must succeed.
    fn mount(&mut self, fx: &Fixture, name: &str, options: &str) -> PathBuf {
        let at = fx.scratch.path(name);
        fs::create_dir_all(&at).unwrap();
        let out = second_mount(fx, &at, options);
        assert!(
            out.status.success(),
            "second mount -o '{options}' failed: {}",
            text(&out.stderr)
        );
        self.0.push(at.clone());
        at
    }
}

impl Drop for SecondMounts {
    fn drop(&mut self) {
        for at in &self.0 {
            if mount_fstype(at).is_some() {
                // SAFETY: a valid C string.
                unsafe { libc::umount2(cstr(at).as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

fn second_mount(fx: &Fixture, at: &Path, options: &str) -> std::process::Output {
    let mut args = vec!["mount", fx.image_str(), at.to_str().unwrap()];
    if !options.is_empty() {
        args.extend(["-o", options]);
    }
    birch(&args)
}

/// A second mount that must fail; returns its message.
fn refused(fx: &Fixture, options: &str) -> String {
    let at = fx.scratch.path("refused");
    fs::create_dir_all(&at).unwrap();
    let out = second_mount(fx, &at, options);
    assert!(
        !out.status.success(),
        "second mount -o '{options}' succeeded"
    );
    assert_eq!(
        mount_fstype(&at),
        None,
        "a refused mount left {at:?} mounted"
    );
    text(&out.stderr)
}

fn umount(at: &Path) {
    // SAFETY: a valid C string.
    let rc = unsafe { libc::umount2(cstr(at).as_ptr(), 0) };
    assert_eq!(rc, 0, "umount {at:?}: {}", std::io::Error::last_os_error());
}

fn subvolume_create(path: &Path) {
    let out = birch(&["subvolume", "create", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// fstests generic/732's moves between two mount points, then the first
/// mount point goes and the second keeps serving until it goes too.
#[test]
fn second_mount_shares_the_filesystem() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("again-share");
    let mut second = SecondMounts(Vec::new());
    let m2 = second.mount(&fx, "m2", "");
    let m1 = fx.mnt.clone();
    assert_eq!(
        fs::metadata(&m1).unwrap().dev(),
        fs::metadata(&m2).unwrap().dev(),
        "one filesystem behind both mount points"
    );
    fs::create_dir(m1.join("A")).unwrap();
    fs::create_dir(m1.join("B")).unwrap();
    fs::write(m1.join("A/f"), b"moved").unwrap();
    fs::rename(m1.join("A/f"), m1.join("B/f")).unwrap();
    assert_eq!(fs::read(m2.join("B/f")).unwrap(), b"moved");
    fs::rename(m2.join("B/f"), m2.join("A/f")).unwrap();
    assert_eq!(fs::read(m1.join("A/f")).unwrap(), b"moved");
    assert!(!m1.join("B/f").exists());

    umount(&m1);
    fs::write(m2.join("after"), b"first mount point gone").unwrap();
    assert_eq!(fs::read(m2.join("A/f")).unwrap(), b"moved");
    umount(&m2);
    // The daemon ends with its last mount point; the image checks clean
    // (the fixture's teardown) and mounts again with everything in it.
    fx.unmount();
    fx.mount();
    assert_eq!(
        fs::read(fx.path("after")).unwrap(),
        b"first mount point gone"
    );
}

/// subvol=, subvolid= and ro on a second mount, and the options it refuses.
#[test]
fn second_mount_of_a_subvolume() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("again-subvol");
    subvolume_create(&fx.path("sv"));
    fs::write(fx.path("sv/f"), b"in sv").unwrap();
    fs::create_dir(fx.path("plain")).unwrap();
    let sv_id = fs::metadata(fx.path("sv")).unwrap().ino() >> 40;
    let mut second = SecondMounts(Vec::new());

    let by_path = second.mount(&fx, "by-path", "subvol=/sv");
    assert_eq!(fs::read(by_path.join("f")).unwrap(), b"in sv");
    let by_id = second.mount(&fx, "by-id", &format!("subvolid={sv_id}"));
    assert_eq!(fs::read(by_id.join("f")).unwrap(), b"in sv");
    let both = second.mount(&fx, "both", &format!("subvol=sv,subvolid={sv_id}"));
    assert_eq!(fs::read(both.join("f")).unwrap(), b"in sv");

    let read_only = second.mount(&fx, "ro", "ro,nosuid,nodev");
    let e = fs::write(read_only.join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_eq!(fs::read(read_only.join("sv/f")).unwrap(), b"in sv");
    // Per mount point: the first stays writable.
    fs::write(fx.path("new"), b"x").unwrap();

    let message = refused(&fx, "subvol=sv,subvolid=5");
    assert!(message.contains("was given"), "{message}");
    let message = refused(&fx, "subvol=plain");
    assert!(message.contains("not a subvolume"), "{message}");
    let message = refused(&fx, "subvol=nowhere");
    assert!(message.contains("nowhere"), "{message}");
    let message = refused(&fx, "subvolid=999");
    assert!(message.contains("no such subvolume"), "{message}");
    let message = refused(&fx, "subvol=sv/../..");
    assert!(message.contains("'..'"), "{message}");
    let message = refused(&fx, "commit=5");
    assert!(
        message.contains("commit=5") && message.contains("already mounted at"),
        "{message}"
    );
}

/// A running `subvol=` mount shows only its subvolume: a second mount can
/// show that one or a subvolume below it, nothing else.
#[test]
fn second_mount_outside_the_running_subvolume_is_refused() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("again-outside");
    subvolume_create(&fx.path("sv"));
    subvolume_create(&fx.path("sv/inner"));
    subvolume_create(&fx.path("other"));
    fs::write(fx.path("sv/inner/f"), b"inner").unwrap();
    fx.unmount();
    fx.options = vec!["subvol=sv".into()];
    fx.mount();
    let mut second = SecondMounts(Vec::new());
    let same = second.mount(&fx, "same", "subvol=sv");
    assert!(same.join("inner").is_dir());
    let inner = second.mount(&fx, "inner", "subvol=sv/inner");
    assert_eq!(fs::read(inner.join("f")).unwrap(), b"inner");
    for options in ["subvol=other", "subvolid=5", ""] {
        let message = refused(&fx, options);
        assert!(
            message.contains("mount the top level"),
            "-o '{options}': {message}"
        );
    }
}

/// Over a read-only running mount, a second mount must be read-only too.
#[test]
fn second_mount_of_a_read_only_mount() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("again-ro", "256M");
    fx.options = vec!["ro".into()];
    fx.mount();
    let message = refused(&fx, "");
    assert!(message.contains("read-only"), "{message}");
    let mut second = SecondMounts(Vec::new());
    let at = second.mount(&fx, "ro2", "ro");
    assert!(at.is_dir());
}

/// Only root may mount a mounted image again (a bind mount needs
/// CAP_SYS_ADMIN); a user is told so in one line, detached or `-f`.
#[test]
fn second_mount_by_a_user_is_refused() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("again-user");
    fs::write(fx.path("f"), b"first mount").unwrap();
    let at = fx.scratch.path("user");
    fs::create_dir_all(&at).unwrap();
    for extra in [&[][..], &["-f"][..]] {
        let out = std::process::Command::new(common::BIRCH)
            .args(["mount", fx.image_str(), at.to_str().unwrap()])
            .args(extra)
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .unwrap();
        let message = text(&out.stderr);
        assert!(!out.status.success(), "as nobody {extra:?}: succeeded");
        assert!(
            message.contains("already mounted at") && message.contains("only root"),
            "{message}"
        );
        assert_eq!(mount_fstype(&at), None);
    }
    assert_eq!(fs::read(fx.path("f")).unwrap(), b"first mount");
}
