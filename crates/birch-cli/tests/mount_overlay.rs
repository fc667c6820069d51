//! overlayfs with its upper and work directories on birch, as a container
//! engine puts them (docs/FUSE.md, "Whiteouts and overlayfs"): copy-up,
//! whiteouts, a directory renamed with `redirect_dir`, O_TMPFILE, and the
//! merged view after both mounts are taken down and put back.
//!
//! Run: `cargo test -p birch-cli --test mount_overlay` as root.

mod common;

use common::json::Value;
use common::{cstr, run, skip_unless_root, stats_json, text, Fixture};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

/// An overlay mount, unmounted on drop (also when a test fails; declared
/// after the [`Fixture`] it lies on, so it goes first).
struct Overlay {
    merged: PathBuf,
    mounted: bool,
}

impl Overlay {
    /// `mount -t overlay` of `lower` under `upper` and `work` (on birch),
    /// at `merged`, with redirect_dir=on.
    fn mount(lower: &Path, upper: &Path, work: &Path, merged: &Path) -> Overlay {
        let options = format!(
            "lowerdir={},upperdir={},workdir={},redirect_dir=on",
            lower.display(),
            upper.display(),
            work.display()
        );
        let out = run(Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &options])
            .arg(merged));
        assert!(
            out.status.success(),
            "mount -t overlay -o {options} failed: {}\nkernel log: {}",
            text(&out.stderr),
            kernel_log_tail()
        );
        Overlay {
            merged: merged.to_path_buf(),
            mounted: true,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.merged.join(rel)
    }

    fn unmount(&mut self) {
        let target = cstr(&self.merged);
        // SAFETY: a valid C string.
        let rc = unsafe { libc::umount2(target.as_ptr(), 0) };
        assert_eq!(rc, 0, "umount overlay: {}", std::io::Error::last_os_error());
        self.mounted = false;
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        if self.mounted {
            let target = cstr(&self.merged);
            // SAFETY: a valid C string; a lazy unmount cannot block.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// The overlayfs lines at the end of the kernel log: why a mount failed.
fn kernel_log_tail() -> String {
    let out = run(&mut Command::new("dmesg"));
    let log = text(&out.stdout);
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("overlay")).collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Whether `path` is a whiteout: a character device 0:0 (overlayfs's
/// `ovl_is_whiteout`), with no permission bits as the kernel makes it.
fn assert_whiteout(path: &Path) {
    let m = fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: no whiteout: {e}", path.display()));
    assert!(
        m.file_type().is_char_device() && m.rdev() == 0 && m.mode() & 0o7777 == 0,
        "{}: not a whiteout (mode {:o}, rdev {})",
        path.display(),
        m.mode(),
        m.rdev()
    );
}

/// The value of xattr `name` of `path` (not following a symlink).
fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let (p, n) = (cstr(path), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of the length given.
    let len =
        unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| {
        buf.truncate(len as usize);
        buf
    })
}

/// TMPFILE requests birch received so far.
fn tmpfile_requests(fx: &Fixture) -> u64 {
    let stats = stats_json(&fx.mnt);
    let Some(Value::Object(by_opcode)) = stats.get("fuse_requests") else {
        panic!("no fuse_requests in birch stats --json: {stats:?}");
    };
    by_opcode
        .iter()
        .find(|(opcode, _)| opcode.as_str() == "TMPFILE")
        .and_then(|(_, n)| n.as_u64())
        .unwrap_or(0)
}

/// The merged view the sequence leaves, as the overlay shows it.
fn assert_merged_view(ovl: &Overlay) {
    assert_eq!(fs::read(ovl.path("a")).unwrap(), b"lower a\ncopied up\n");
    for gone in ["b", "empty", "ren"] {
        assert!(
            fs::symlink_metadata(ovl.path(gone)).is_err(),
            "{gone} is back in the merged view"
        );
    }
    assert_eq!(fs::read(ovl.path("ren2/f")).unwrap(), b"lower ren/f\n");
    assert_eq!(fs::read(ovl.path("ren2/new")).unwrap(), b"new in ren2\n");
    assert_eq!(fs::read(ovl.path("tmp")).unwrap(), b"from O_TMPFILE\n");
    assert_eq!(fs::read(ovl.path("keep")).unwrap(), b"lower keep\n");
}

/// A container's writes to an overlay whose upper and work directories
/// are on birch: overlayfs mounts it (birch answers RENAME_WHITEOUT,
/// O_TMPFILE, trusted.* xattrs and d_type), copies up a written lower file
/// through O_TMPFILE, leaves 0:0 whiteouts for a deleted file and a
/// removed directory, renames a lower directory with a
/// `trusted.overlay.redirect` xattr, links an O_TMPFILE file; after the
/// overlay and birch are unmounted and mounted again the merged view is
/// the same, and `birch check` is clean.
#[test]
fn overlay_upper_and_work_on_birch() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("overlay");
    let lower = fx.scratch.path("lower");
    let merged = fx.scratch.path("merged");
    for dir in [&lower, &lower.join("empty"), &lower.join("ren"), &merged] {
        fs::create_dir(dir).unwrap();
    }
    for (name, data) in [
        ("a", "lower a\n"),
        ("b", "lower b\n"),
        ("keep", "lower keep\n"),
        ("ren/f", "lower ren/f\n"),
    ] {
        fs::write(lower.join(name), data).unwrap();
    }
    let (upper, work) = (fx.path("upper"), fx.path("work"));
    fs::create_dir(&upper).unwrap();
    fs::create_dir(&work).unwrap();
    let mut ovl = Overlay::mount(&lower, &upper, &work, &merged);

    // Copy-up of a lower file by writing it: overlayfs copies into an
    // O_TMPFILE file in the work directory and links it into upper.
    let tmpfiles = tmpfile_requests(&fx);
    fs::OpenOptions::new()
        .append(true)
        .open(ovl.path("a"))
        .and_then(|mut f| f.write_all(b"copied up\n"))
        .unwrap();
    assert_eq!(fs::read(upper.join("a")).unwrap(), b"lower a\ncopied up\n");
    assert!(
        tmpfile_requests(&fx) > tmpfiles,
        "the copy-up did not go through O_TMPFILE"
    );
    // Delete and rmdir of lower entries: whiteouts in upper.
    fs::remove_file(ovl.path("b")).unwrap();
    assert_whiteout(&upper.join("b"));
    fs::remove_dir(ovl.path("empty")).unwrap();
    assert_whiteout(&upper.join("empty"));
    // A lower directory renamed (redirect_dir=on): the new upper directory
    // says where its lower one is; the old name is a whiteout.
    fs::rename(ovl.path("ren"), ovl.path("ren2")).unwrap();
    assert_eq!(
        xattr(&upper.join("ren2"), "trusted.overlay.redirect").as_deref(),
        Some(b"ren".as_slice()),
        "no redirect xattr on the renamed directory"
    );
    assert_whiteout(&upper.join("ren"));
    fs::write(ovl.path("ren2/new"), "new in ren2\n").unwrap();
    // O_TMPFILE in the merged directory, then linked in.
    let tmp = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(&merged)
        .unwrap();
    (&tmp).write_all(b"from O_TMPFILE\n").unwrap();
    let proc_path = cstr(Path::new(&format!("/proc/self/fd/{}", tmp.as_raw_fd())));
    let linked = cstr(&ovl.path("tmp"));
    // SAFETY: valid C strings; AT_SYMLINK_FOLLOW links the open file.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path.as_ptr(),
            libc::AT_FDCWD,
            linked.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    assert_eq!(
        rc,
        0,
        "linkat of the O_TMPFILE file: {}",
        std::io::Error::last_os_error()
    );
    drop(tmp);
    assert_eq!(fs::read(upper.join("tmp")).unwrap(), b"from O_TMPFILE\n");
    assert_merged_view(&ovl);

    ovl.unmount();
    fx.unmount();
    fx.assert_clean();
    fx.mount();
    let mut ovl = Overlay::mount(&lower, &upper, &work, &merged);
    assert_merged_view(&ovl);
    assert_whiteout(&upper.join("b"));
    ovl.unmount();
}
