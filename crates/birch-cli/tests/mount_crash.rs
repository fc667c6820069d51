//! Power cuts through the real mount. Each test builds a committed starting
//! state on a `birch mount` (`birch sync`), runs a sequence of system calls
//! with the fsyncs it names, cuts the power the way fstests does with
//! dm-flakey (the shutdown ioctl on the mount point, then the unmount),
//! requires `birch check` to pass on the image as the cut left it, mounts
//! again (the log is replayed) and verifies exactly what btrfs guarantees
//! after that sequence: contents, names, link counts. The replayed image
//! must check clean again once unmounted.
//!
//! The engine's own crash tests (crates/birch/tests/tree_log.rs) explore
//! every crash state of such sequences on a recording device, calling the
//! engine directly; these run them through the kernel's FUSE path instead
//! (lookups and the dentry cache, the no-open mode, long cache timeouts),
//! which decides what the engine is actually asked to log. Each test is
//! named after its crash case, so that docs/TREE-LOG.md can cite it.
//!
//! Run: `cargo test -p birch-cli --test mount_crash` as root (needs
//! /dev/fuse). docs/FUSE-TESTING.md describes the suite.

mod common;

use birch::check::fixture::corrupt_node;
use birch::device::FileDevice;
use birch::fs::read_superblock;
use common::{cstr, exclusive, skip_unless_root, Fixture};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::MutexGuard;

/// One test's mount, from the starting state to the check after replay.
struct CrashRun {
    fx: Fixture,
    /// Declared after the fixture, so released only after its teardown
    /// (unmount, check) is over: the suite's mounts run one at a time.
    _one_at_a_time: MutexGuard<'static, ()>,
}

impl CrashRun {
    /// A fresh image, mounted; None (the test passes) when this machine
    /// cannot mount.
    fn start(tag: &str) -> Option<CrashRun> {
        if skip_unless_root() {
            return None;
        }
        let one_at_a_time = exclusive();
        let mut fx = Fixture::new(&format!("crash-{tag}"), "256M");
        // No periodic commit: only the starting state's `birch sync` and the
        // sequence's fsyncs may make anything durable, so the cut always
        // lands on the log the fsyncs wrote.
        fx.options = vec!["commit=0".into()];
        fx.mount();
        Some(CrashRun {
            fx,
            _one_at_a_time: one_at_a_time,
        })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.fx.path(rel)
    }

    /// The mount point: the filesystem's root directory.
    fn root(&self) -> &Path {
        &self.fx.mnt
    }

    /// Commits the starting state (`birch sync MNT`).
    fn commit(&self) {
        self.fx.sync();
    }

    /// Power cut, clean check of the image as the cut left it, and a mount
    /// that replays the log.
    fn cut_and_remount(&mut self) {
        self.cut_and_remount_then(|| {});
    }

    /// [`Self::cut_and_remount`], running `before_unmount` once the cut
    /// took (closing a file held open across the cut).
    fn cut_and_remount_then(&mut self, before_unmount: impl FnOnce()) {
        self.fx.power_cut_then(before_unmount);
        if let Err(report) = self.fx.check() {
            panic!("image as the power cut left it is not clean: {report}");
        }
        self.fx.mount();
        // A log replay cannot apply is discarded and the last commit mounts
        // (docs/TREE-LOG.md, "Replay is total"), with a warning; the
        // checks below could then pass only by accident, so the warning
        // itself fails the test.
        let log = self.fx.daemon_log();
        assert!(
            !log.contains("WARNING"),
            "the mount after the cut did not replay cleanly:\n{log}"
        );
    }

    /// Unmounts the replayed filesystem and checks the image.
    fn finish(mut self) {
        self.fx.unmount();
        if let Err(report) = self.fx.check() {
            panic!("image after replay and unmount is not clean: {report}");
        }
        // Checked just now; the fixture's drop need not do it again.
        self.fx.check_at_drop = false;
    }
}

/// `len` bytes that differ for each `seed`, so that a file holding another
/// file's (or an older version's) data is caught.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn write_file(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

fn read_file(p: &Path) -> Vec<u8> {
    fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

fn mkdir(p: &Path) {
    fs::create_dir(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
}

fn rename(from: &Path, to: &Path) {
    fs::rename(from, to)
        .unwrap_or_else(|e| panic!("rename {} -> {}: {e}", from.display(), to.display()));
}

fn link(existing: &Path, new: &Path) {
    fs::hard_link(existing, new)
        .unwrap_or_else(|e| panic!("link {} -> {}: {e}", existing.display(), new.display()));
}

fn unlink(p: &Path) {
    fs::remove_file(p).unwrap_or_else(|e| panic!("unlink {}: {e}", p.display()));
}

/// fsync(2) of a file, or (for a directory) what the kernel sends as
/// fsyncdir.
fn fsync(p: &Path) {
    File::open(p)
        .and_then(|f| f.sync_all())
        .unwrap_or_else(|e| panic!("fsync {}: {e}", p.display()));
}

fn lstat(p: &Path) -> fs::Metadata {
    fs::symlink_metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
}

/// The directory's entries, sorted, without `.` and `..`.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()))
        .map(|e| {
            e.expect("directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[track_caller]
fn assert_entries(dir: &Path, want: &[&str]) {
    assert_eq!(entries(dir), want, "entries of {}", dir.display());
}

/// A regular file with exactly this content and link count.
#[track_caller]
fn assert_file(p: &Path, data: &[u8], nlink: u64) {
    let meta = lstat(p);
    assert!(meta.is_file(), "{} is not a regular file", p.display());
    assert_eq!(meta.len(), data.len() as u64, "size of {}", p.display());
    assert!(read_file(p) == data, "content of {} differs", p.display());
    assert_eq!(meta.nlink(), nlink, "link count of {}", p.display());
}

/// Every path names one inode.
#[track_caller]
fn assert_same_inode(paths: &[&Path]) {
    let inos: Vec<u64> = paths.iter().map(|p| lstat(p).ino()).collect();
    assert!(
        inos.windows(2).all(|w| w[0] == w[1]),
        "not one inode: {:?}",
        paths.iter().zip(&inos).collect::<Vec<_>>()
    );
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    let (path, name_c) = (cstr(p), CString::new(name).expect("xattr name without NUL"));
    // SAFETY: valid C strings and a buffer of the length passed.
    let rc = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            name_c.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "setxattr {} {name}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

fn remove_xattr(p: &Path, name: &str) {
    let (path, name_c) = (cstr(p), CString::new(name).expect("xattr name without NUL"));
    // SAFETY: valid C strings.
    let rc = unsafe { libc::lremovexattr(path.as_ptr(), name_c.as_ptr()) };
    assert_eq!(
        rc,
        0,
        "removexattr {} {name}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

/// Every xattr of `p`, name -> value.
fn xattrs(p: &Path) -> BTreeMap<String, Vec<u8>> {
    let path = cstr(p);
    // SAFETY: a valid C string; size 0 asks for the length only.
    let needed = unsafe { libc::llistxattr(path.as_ptr(), std::ptr::null_mut(), 0) };
    let mut list = vec![0u8; needed.max(0) as usize];
    // SAFETY: a valid C string and a buffer of the length passed.
    let n = unsafe { libc::llistxattr(path.as_ptr(), list.as_mut_ptr().cast(), list.len()) };
    assert!(
        n >= 0,
        "listxattr {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    list.truncate(n as usize);
    let mut out = BTreeMap::new();
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        let name_c = CString::new(name.as_str()).expect("xattr name without NUL");
        let mut value = vec![0u8; 4096];
        // SAFETY: valid C strings and a buffer of the length passed.
        let len = unsafe {
            libc::lgetxattr(
                path.as_ptr(),
                name_c.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        assert!(
            len >= 0,
            "getxattr {} {name}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
        value.truncate(len as usize);
        out.insert(name, value);
    }
    out
}

// ---- the sequences of issue 10 ----

/// `a/foo` renamed away and the name reused by a new file, which is
/// fsynced: the new file must not take the old one's place or its data.
#[test]
fn rename_away_then_reuse_name() {
    let Some(mut run) = CrashRun::start("reuse-name") else {
        return;
    };
    let old = pattern(16 << 10, 1);
    let new = pattern(5000, 2);
    mkdir(&run.path("a"));
    write_file(&run.path("a/foo"), &old);
    run.commit();

    rename(&run.path("a/foo"), &run.path("a/bar"));
    write_file(&run.path("a/foo"), &new);
    fsync(&run.path("a/foo"));
    run.cut_and_remount();

    assert_entries(&run.path("a"), &["bar", "foo"]);
    assert_file(&run.path("a/bar"), &old, 1);
    assert_file(&run.path("a/foo"), &new, 1);
    run.finish();
}

/// A committed directory renamed away and a new one made under its old
/// name, then fsynced: the log must not give the old name (or the old
/// directory's entries) to the new directory, and the image must mount.
#[test]
fn rename_dir_away_then_mkdir_same_name() {
    let Some(mut run) = CrashRun::start("dir-reuse-name") else {
        return;
    };
    mkdir(&run.path("a"));
    mkdir(&run.path("a/x"));
    write_file(&run.path("a/x/one"), &pattern(3000, 1));
    write_file(&run.path("a/x/two"), &pattern(9000, 2));
    run.commit();

    rename(&run.path("a/x"), &run.path("a/y"));
    mkdir(&run.path("a/x"));
    fsync(&run.path("a/x"));
    run.cut_and_remount();

    assert_entries(&run.path("a"), &["x", "y"]);
    assert_entries(&run.path("a/y"), &["one", "two"]);
    assert_file(&run.path("a/y/one"), &pattern(3000, 1), 1);
    assert_file(&run.path("a/y/two"), &pattern(9000, 2), 1);
    assert_entries(&run.path("a/x"), &[]);
    assert_eq!(lstat(&run.path("a")).nlink(), 4, "link count of a/");
    assert_eq!(lstat(&run.path("a/x")).nlink(), 2, "link count of a/x/");
    run.finish();
}

/// Two files swap names by way of renames and a hard link, and a new file
/// takes the first name: every name must end up on the right inode.
#[test]
fn swap_names_through_links() {
    let Some(mut run) = CrashRun::start("swap-names") else {
        return;
    };
    mkdir(&run.path("t"));
    write_file(&run.path("t/f1"), b"foo");
    write_file(&run.path("t/f2"), b"hello");
    run.commit();

    rename(&run.path("t/f1"), &run.path("t/f3"));
    rename(&run.path("t/f2"), &run.path("t/f4"));
    link(&run.path("t/f3"), &run.path("t/f2"));
    write_file(&run.path("t/f1"), b"the new f1");
    fsync(&run.path("t/f1"));
    run.cut_and_remount();

    assert_entries(&run.path("t"), &["f1", "f2", "f3", "f4"]);
    assert_file(&run.path("t/f1"), b"the new f1", 1);
    assert_file(&run.path("t/f2"), b"foo", 2);
    assert_file(&run.path("t/f3"), b"foo", 2);
    assert_same_inode(&[&run.path("t/f2"), &run.path("t/f3")]);
    assert_file(&run.path("t/f4"), b"hello", 1);
    run.finish();
}

/// An inode with two names is renamed along a chain (foo -> qwerty,
/// bar -> foo) and a new file takes the freed name bar.
#[test]
fn rename_chain_over_hard_link() {
    let Some(mut run) = CrashRun::start("rename-chain") else {
        return;
    };
    let data = pattern(7000, 3);
    let new = pattern(1200, 4);
    mkdir(&run.path("t"));
    write_file(&run.path("t/foo"), &data);
    link(&run.path("t/foo"), &run.path("t/bar"));
    run.commit();

    rename(&run.path("t/foo"), &run.path("t/qwerty"));
    rename(&run.path("t/bar"), &run.path("t/foo"));
    write_file(&run.path("t/bar"), &new);
    fsync(&run.path("t/bar"));
    run.cut_and_remount();

    assert_entries(&run.path("t"), &["bar", "foo", "qwerty"]);
    assert_file(&run.path("t/qwerty"), &data, 2);
    assert_file(&run.path("t/foo"), &data, 2);
    assert_same_inode(&[&run.path("t/qwerty"), &run.path("t/foo")]);
    assert_file(&run.path("t/bar"), &new, 1);
    run.finish();
}

/// The renamed file is the one fsynced; the new owner of its old name was
/// never fsynced but must not be lost by replaying the rename.
#[test]
fn fsync_renamed_keeps_new_owner_of_old_name() {
    let Some(mut run) = CrashRun::start("new-owner") else {
        return;
    };
    let data = pattern(6000, 5);
    mkdir(&run.path("dir"));
    write_file(&run.path("dir/foo"), &data);
    run.commit();

    rename(&run.path("dir/foo"), &run.path("dir/bar"));
    write_file(&run.path("dir/foo"), b"");
    fsync(&run.path("dir/bar"));
    run.cut_and_remount();

    assert_entries(&run.path("dir"), &["bar", "foo"]);
    assert_file(&run.path("dir/bar"), &data, 1);
    assert_file(&run.path("dir/foo"), b"", 1);
    run.finish();
}

/// fsync of a directory persists a whole new subtree under it, including
/// hard links of a committed file spread over the new directories.
#[test]
fn dir_fsync_logs_new_subdirectory_tree() {
    let Some(mut run) = CrashRun::start("new-subtree") else {
        return;
    };
    let data = pattern(8 << 10, 6);
    write_file(&run.path("foo"), &data);
    mkdir(&run.path("d"));
    run.commit();

    link(&run.path("foo"), &run.path("d/foo_link1"));
    link(&run.path("foo"), &run.path("d/foo_link2"));
    fs::create_dir_all(run.path("d/x/y/z")).expect("mkdir -p d/x/y/z");
    link(&run.path("foo"), &run.path("d/x/y/foo_link3"));
    link(&run.path("foo"), &run.path("d/x/y/z/foo_link4"));
    write_file(&run.path("d/x/y/z/qwerty"), b"");
    fsync(&run.path("d"));
    run.cut_and_remount();

    assert_entries(&run.path("d"), &["foo_link1", "foo_link2", "x"]);
    assert_entries(&run.path("d/x"), &["y"]);
    assert_entries(&run.path("d/x/y"), &["foo_link3", "z"]);
    assert_entries(&run.path("d/x/y/z"), &["foo_link4", "qwerty"]);
    let names = [
        run.path("foo"),
        run.path("d/foo_link1"),
        run.path("d/foo_link2"),
        run.path("d/x/y/foo_link3"),
        run.path("d/x/y/z/foo_link4"),
    ];
    for name in &names {
        assert_file(name, &data, 5);
    }
    assert_same_inode(&names.iter().map(PathBuf::as_path).collect::<Vec<_>>());
    assert_file(&run.path("d/x/y/z/qwerty"), b"", 1);
    run.finish();
}

// ---- the classics ----

/// A new file in a new directory, fsynced: the file (and so the directory
/// that gives it a name) survives.
#[test]
fn fsync_new_file_in_new_dir_survives() {
    let Some(mut run) = CrashRun::start("new-file-new-dir") else {
        return;
    };
    run.commit();

    let data = pattern(20_000, 7);
    mkdir(&run.path("d"));
    write_file(&run.path("d/f"), &data);
    fsync(&run.path("d/f"));
    run.cut_and_remount();

    assert_entries(run.root(), &["d"]);
    assert_entries(&run.path("d"), &["f"]);
    assert_file(&run.path("d/f"), &data, 1);
    run.finish();
}

/// An fsynced file renamed, then another file fsynced: the renamed file is
/// under exactly one of its names, never neither, never both.
#[test]
fn rename_of_logged_file_is_atomic() {
    let Some(mut run) = CrashRun::start("rename-atomic") else {
        return;
    };
    run.commit();

    let data = pattern(10_000, 8);
    write_file(&run.path("a"), &data);
    fsync(&run.path("a"));
    rename(&run.path("a"), &run.path("b"));
    write_file(&run.path("c"), b"c");
    fsync(&run.path("c"));
    run.cut_and_remount();

    let names = entries(run.root());
    assert!(
        names == ["a", "c"] || names == ["b", "c"],
        "want c and exactly one of a, b; found {names:?}"
    );
    assert_file(&run.path(&names[0]), &data, 1);
    assert_file(&run.path("c"), b"c", 1);
    run.finish();
}

/// Files unlinked after being made durable (one committed, one fsynced),
/// then their directory fsynced: both names are gone for good.
#[test]
fn unlink_after_fsync_then_fsync_dir() {
    let Some(mut run) = CrashRun::start("unlink-after-fsync") else {
        return;
    };
    mkdir(&run.path("d"));
    write_file(&run.path("d/committed"), &pattern(9000, 9));
    write_file(&run.path("d/kept"), b"kept");
    run.commit();

    write_file(&run.path("d/fsynced"), &pattern(5000, 10));
    fsync(&run.path("d/fsynced"));
    unlink(&run.path("d/fsynced"));
    unlink(&run.path("d/committed"));
    fsync(&run.path("d"));
    run.cut_and_remount();

    assert_entries(&run.path("d"), &["kept"]);
    assert_file(&run.path("d/kept"), b"kept", 1);
    run.finish();
}

/// A file written and fsynced after its committed parent directory was
/// renamed: the data survives under exactly one of the directory's names
/// (a directory with two names would be a directory hard link).
#[test]
fn fsync_file_after_parent_dir_rename() {
    let Some(mut run) = CrashRun::start("parent-renamed") else {
        return;
    };
    mkdir(&run.path("d"));
    write_file(&run.path("d/f"), b"committed");
    run.commit();

    rename(&run.path("d"), &run.path("e"));
    let data = pattern(12_000, 11);
    write_file(&run.path("e/f"), &data);
    fsync(&run.path("e/f"));
    run.cut_and_remount();

    let names = entries(run.root());
    assert!(
        names == ["d"] || names == ["e"],
        "want exactly one of d, e; found {names:?}"
    );
    let dir = run.path(&names[0]);
    assert_entries(&dir, &["f"]);
    assert_file(&dir.join("f"), &data, 1);
    run.finish();
}

/// An overwrite inside a committed file and an append, then fdatasync:
/// the new bytes and the new size survive.
#[test]
fn fdatasync_keeps_written_data() {
    let Some(mut run) = CrashRun::start("fdatasync") else {
        return;
    };
    let mut want = pattern(64 << 10, 12);
    write_file(&run.path("f"), &want);
    run.commit();

    let file = OpenOptions::new()
        .write(true)
        .open(run.path("f"))
        .expect("open f");
    let overwrite = pattern(4096, 13);
    file.write_all_at(&overwrite, 10_000).expect("overwrite");
    want[10_000..10_000 + 4096].copy_from_slice(&overwrite);
    let tail = pattern(3000, 14);
    file.write_all_at(&tail, want.len() as u64).expect("append");
    want.extend_from_slice(&tail);
    file.sync_data().expect("fdatasync f");
    drop(file);
    run.cut_and_remount();

    assert_file(&run.path("f"), &want, 1);
    run.finish();
}

// ---- neighbours ----

/// A rename over an existing file, then fsync of the renamed file: the
/// name holds the renamed file's data, the source name is gone, and the
/// replaced inode is freed (the check finds no leftover).
#[test]
fn rename_over_existing_then_fsync() {
    let Some(mut run) = CrashRun::start("rename-over") else {
        return;
    };
    let source = pattern(9000, 15);
    mkdir(&run.path("dir"));
    write_file(&run.path("dir/a"), &source);
    write_file(&run.path("dir/b"), &pattern(11_000, 16));
    run.commit();

    rename(&run.path("dir/a"), &run.path("dir/b"));
    fsync(&run.path("dir/b"));
    run.cut_and_remount();

    assert_entries(&run.path("dir"), &["b"]);
    assert_file(&run.path("dir/b"), &source, 1);
    run.finish();
}

/// xattrs added, replaced and removed on a committed file, then fsync:
/// the file's xattrs are exactly the new set.
#[test]
fn xattr_set_and_remove_then_fsync() {
    let Some(mut run) = CrashRun::start("xattrs") else {
        return;
    };
    let f = run.path("f");
    write_file(&f, b"has xattrs");
    set_xattr(&f, "user.kept", b"unchanged");
    set_xattr(&f, "user.replaced", b"old value");
    set_xattr(&f, "user.removed", b"goes away");
    run.commit();

    set_xattr(&f, "user.replaced", b"new value");
    remove_xattr(&f, "user.removed");
    set_xattr(&f, "user.added", &pattern(300, 17));
    fsync(&f);
    run.cut_and_remount();

    let want: BTreeMap<String, Vec<u8>> = [
        ("user.added", pattern(300, 17)),
        ("user.kept", b"unchanged".to_vec()),
        ("user.replaced", b"new value".to_vec()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(xattrs(&f), want, "xattrs of f");
    assert_file(&f, b"has xattrs", 1);
    run.finish();
}

/// More than a thousand xattrs on one committed file, half removed and
/// hundreds added, then fsync: after the cut the file has exactly the new
/// set (names, values).
#[test]
fn many_xattrs_then_fsync() {
    let Some(mut run) = CrashRun::start("many-xattrs") else {
        return;
    };
    let f = run.path("f");
    write_file(&f, b"has many xattrs");
    let mut want = BTreeMap::new();
    for i in 0..1200 {
        let (name, value) = (
            format!("user.attr_{i:05}"),
            format!("value {i}").into_bytes(),
        );
        set_xattr(&f, &name, &value);
        want.insert(name, value);
    }
    run.commit();

    for i in (0..1200).step_by(2) {
        let name = format!("user.attr_{i:05}");
        remove_xattr(&f, &name);
        want.remove(&name);
    }
    for i in 0..500 {
        let (name, value) = (format!("user.new_{i:04}"), pattern(i % 100 + 1, 23));
        set_xattr(&f, &name, &value);
        want.insert(name, value);
    }
    fsync(&f);
    run.cut_and_remount();

    assert_eq!(xattrs(&f), want, "xattrs of f");
    run.finish();
}

/// fstests generic/498 (seed 000): a link of an already logged file into a
/// new directory, then fsync of an ancestor of that directory: the new
/// name survives with the old one.
#[test]
fn link_of_logged_file_then_fsync_parent() {
    let Some(mut run) = CrashRun::start("generic-498") else {
        return;
    };
    mkdir(&run.path("A"));
    mkdir(&run.path("B"));
    run.commit();

    let mut foo = File::create(run.path("B/foo")).expect("create B/foo");
    foo.write_all(b"foo").expect("write B/foo");
    foo.sync_all().expect("fsync B/foo");
    drop(foo);
    mkdir(&run.path("A/C"));
    link(&run.path("B/foo"), &run.path("A/C/foo"));
    fsync(&run.path("A"));
    run.cut_and_remount();

    assert_entries(&run.path("A/C"), &["foo"]);
    assert_file(&run.path("A/C/foo"), b"foo", 2);
    assert_file(&run.path("B/foo"), b"foo", 2);
    assert_same_inode(&[&run.path("A/C/foo"), &run.path("B/foo")]);
    run.finish();
}

/// renameat2(RENAME_EXCHANGE) of two committed files, then fsync of one of
/// them: each name holds the other's old data, and neither inode is left
/// without a name by replaying the fsynced one's names.
#[test]
fn rename_exchange_then_fsync() {
    let Some(mut run) = CrashRun::start("exchange") else {
        return;
    };
    let (first, second) = (pattern(4000, 18), pattern(7000, 19));
    mkdir(&run.path("t"));
    write_file(&run.path("t/a"), &first);
    write_file(&run.path("t/b"), &second);
    run.commit();

    let (a, b) = (cstr(&run.path("t/a")), cstr(&run.path("t/b")));
    // SAFETY: valid C strings, AT_FDCWD.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(rc, 0, "exchange: {}", std::io::Error::last_os_error());
    fsync(&run.path("t/a"));
    run.cut_and_remount();

    assert_entries(&run.path("t"), &["a", "b"]);
    assert_file(&run.path("t/a"), &second, 1);
    assert_file(&run.path("t/b"), &first, 1);
    run.finish();
}

/// A committed file truncated (its extents dropped), then written past
/// the new end, then fsynced: the log must replace the file's extents,
/// not add to them, so the hole reads as zeros and the size is the new one.
#[test]
fn truncate_then_write_then_fsync() {
    let Some(mut run) = CrashRun::start("truncate") else {
        return;
    };
    write_file(&run.path("f"), &pattern(64 << 10, 20));
    run.commit();

    let file = OpenOptions::new()
        .write(true)
        .open(run.path("f"))
        .expect("open f");
    file.set_len(5000).expect("truncate f");
    let tail = pattern(3000, 21);
    file.write_all_at(&tail, 20_000)
        .expect("write past the end");
    file.sync_all().expect("fsync f");
    drop(file);
    let mut want = pattern(5000, 20);
    want.resize(20_000, 0);
    want.extend_from_slice(&tail);
    run.cut_and_remount();

    assert_file(&run.path("f"), &want, 1);
    run.finish();
}

/// Unmounts a mount whose daemon this test did not start (a detached
/// `birch mount`), waiting out a busy mount briefly.
fn unmount_detached(mnt: &Path) {
    let target = cstr(mnt);
    for _ in 0..100 {
        // SAFETY: a valid C string.
        if unsafe { libc::umount2(target.as_ptr(), 0) } == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{} stayed mounted", mnt.display());
}

/// docs/BACKUP-ROOTS.md through the real mount: with the newest commit's
/// root tree root unreadable, a plain mount fails suggesting the rescue;
/// `-o rescue=usebackuproot` mounts the previous commit read-only, says so
/// (a detached mount through its caller) and writes nothing;
/// `rescue=usebackuproot,rw` makes the rollback durable, and it checks
/// clean and mounts plainly afterwards.
#[test]
fn rescue_usebackuproot_mounts_the_previous_commit() {
    if skip_unless_root() {
        return;
    }
    let _one_at_a_time = exclusive();
    let mut fx = Fixture::new("rescue", "64M");
    fx.mount();
    write_file(&fx.path("a"), b"committed first");
    fx.sync();
    write_file(&fx.path("b"), b"committed second");
    fx.sync();
    fx.unmount();
    {
        let dev = FileDevice::open(&fx.image, false).unwrap();
        let sb = read_superblock(&dev).unwrap();
        corrupt_node(&dev, sb.root_tree_bytenr);
    }
    fx.check_at_drop = false;
    let damaged = fs::read(&fx.image).unwrap();
    let mnt = fx.mnt.to_str().unwrap().to_string();

    let out = common::birch(&["mount", fx.image_str(), &mnt, "-f"]);
    let err = common::text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("-o rescue=usebackuproot"), "{err}");

    let out = common::birch(&["mount", fx.image_str(), &mnt, "-o", "rescue=usebackuproot"]);
    let err = common::text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("WARNING") && err.contains("rolled back") && err.contains("read-only"),
        "{err}"
    );
    assert_eq!(read_file(&fx.path("a")), b"committed first");
    let refused = File::create(fx.path("new")).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    unmount_detached(&fx.mnt);
    assert!(
        fs::read(&fx.image).unwrap() == damaged,
        "a read-only rescue wrote to the image"
    );

    fx.options = vec!["rescue=usebackuproot,rw".into()];
    fx.mount();
    let log = fx.daemon_log();
    assert!(
        log.contains("WARNING") && log.contains("read-write"),
        "{log}"
    );
    assert_eq!(read_file(&fx.path("a")), b"committed first");
    write_file(&fx.path("c"), b"after the rollback");
    fx.unmount();
    fx.options.clear();
    fx.assert_clean();
    fx.check_at_drop = true;
    fx.mount();
    assert_eq!(read_file(&fx.path("a")), b"committed first");
    assert_eq!(read_file(&fx.path("c")), b"after the rollback");
}

// ---- the fsync cases fstests caught (issue 21) ----

/// fstests generic/066: after an fsync of `f`, its xattr removed and a
/// link made, an fsync of another file: the link may persist only with the
/// removal.
#[test]
fn generic_066_xattr_removal_persists_with_link() {
    let Some(mut run) = CrashRun::start("generic-066") else {
        return;
    };
    let f = run.path("f");
    write_file(&f, b"");
    set_xattr(&f, "user.a", b"1");
    run.commit();

    OpenOptions::new()
        .append(true)
        .open(&f)
        .and_then(|mut h| h.write_all(b"x\n"))
        .unwrap_or_else(|e| panic!("append to f: {e}"));
    fsync(&f);
    remove_xattr(&f, "user.a");
    link(&f, &run.path("f_link"));
    write_file(&run.path("g"), b"");
    fsync(&run.path("g"));
    run.cut_and_remount();

    assert_entries(run.root(), &["f", "f_link", "g"]);
    assert_file(&f, b"x\n", 2);
    assert_same_inode(&[&f, &run.path("f_link")]);
    assert_eq!(xattrs(&f), BTreeMap::new(), "xattrs of f");
    run.finish();
}

/// fstests generic/104: two files of one directory each get a new link;
/// an fsync of one of them persists the other's link too.
#[test]
fn generic_104_fsync_logs_other_new_links_in_the_directory() {
    let Some(mut run) = CrashRun::start("generic-104") else {
        return;
    };
    mkdir(&run.path("d"));
    write_file(&run.path("d/foo"), b"");
    write_file(&run.path("d/bar"), b"");
    run.commit();

    link(&run.path("d/bar"), &run.path("d/bar_link"));
    link(&run.path("d/foo"), &run.path("d/foo_link"));
    fsync(&run.path("d/bar"));
    run.cut_and_remount();

    assert_entries(&run.path("d"), &["bar", "bar_link", "foo", "foo_link"]);
    assert_file(&run.path("d/foo"), b"", 2);
    assert_same_inode(&[&run.path("d/foo"), &run.path("d/foo_link")]);
    assert_same_inode(&[&run.path("d/bar"), &run.path("d/bar_link")]);
    run.finish();
}

/// fstests generic/336: a file loses its link in `b`, and another file
/// moves out of `b`; an fsync of the first persists the move too.
#[test]
fn generic_336_move_out_of_old_parent_persists() {
    let Some(mut run) = CrashRun::start("generic-336") else {
        return;
    };
    let bar = pattern(3000, 21);
    for d in ["a", "b", "c"] {
        mkdir(&run.path(d));
    }
    write_file(&run.path("a/foo"), b"");
    link(&run.path("a/foo"), &run.path("b/foo_link"));
    write_file(&run.path("b/bar"), &bar);
    run.commit();

    unlink(&run.path("b/foo_link"));
    rename(&run.path("b/bar"), &run.path("c/bar"));
    fsync(&run.path("a/foo"));
    run.cut_and_remount();

    assert_entries(&run.path("a"), &["foo"]);
    assert_entries(&run.path("b"), &[]);
    assert_entries(&run.path("c"), &["bar"]);
    assert_file(&run.path("a/foo"), b"", 1);
    assert_file(&run.path("c/bar"), &bar, 1);
    run.finish();
}

/// fstests generic/343: a new link of `x/foo`, a directory and a file
/// moved from `y` into `x`; an fsync of the new link persists the moves.
#[test]
fn generic_343_moves_into_dir_of_new_link_persist() {
    let Some(mut run) = CrashRun::start("generic-343") else {
        return;
    };
    let foo2 = pattern(2000, 22);
    mkdir(&run.path("x"));
    mkdir(&run.path("y"));
    mkdir(&run.path("y/z"));
    write_file(&run.path("x/foo"), b"");
    write_file(&run.path("y/foo2"), &foo2);
    run.commit();

    link(&run.path("x/foo"), &run.path("x/bar"));
    rename(&run.path("y/z"), &run.path("x/z"));
    rename(&run.path("y/foo2"), &run.path("x/foo2"));
    fsync(&run.path("x/bar"));
    run.cut_and_remount();

    assert_entries(&run.path("x"), &["bar", "foo", "foo2", "z"]);
    assert_entries(&run.path("y"), &[]);
    assert_file(&run.path("x/foo2"), &foo2, 1);
    assert_file(&run.path("x/bar"), b"", 2);
    assert!(lstat(&run.path("x/z")).is_dir(), "x/z is not a directory");
    run.finish();
}

/// fstests generic/764: `open(d/foo, O_CREAT); syncfs; unlink d/foo;
/// fsync(fd)`, cut with the file still open and after closing it: the
/// deletion persists.
#[test]
fn generic_764_fsync_of_unlinked_open_file_persists_deletion() {
    for close_before_cut in [false, true] {
        let tag = format!(
            "generic-764-{}",
            if close_before_cut { "closed" } else { "open" }
        );
        let Some(mut run) = CrashRun::start(&tag) else {
            return;
        };
        mkdir(&run.path("d"));
        let foo = run.path("d/foo");
        let handle = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&foo)
            .unwrap_or_else(|e| panic!("open {}: {e}", foo.display()));
        // SAFETY: a valid open descriptor.
        let rc = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&handle)) };
        assert_eq!(rc, 0, "syncfs: {}", std::io::Error::last_os_error());
        unlink(&foo);
        handle
            .sync_all()
            .unwrap_or_else(|e| panic!("fsync of the unlinked d/foo: {e}"));
        if close_before_cut {
            drop(handle);
            run.cut_and_remount();
        } else {
            run.cut_and_remount_then(|| drop(handle));
        }
        assert_entries(&run.path("d"), &[]);
        run.finish();
    }
}

/// `birch subvolume ARGS...`, which must succeed.
fn subvolume(args: &[&str]) {
    let mut all = vec!["subvolume"];
    all.extend_from_slice(args);
    let out = common::birch(&all);
    assert!(
        out.status.success(),
        "birch {all:?}: {}",
        common::text(&out.stderr)
    );
}

fn p(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// The files of directory `dir` (no subdirectories), by name.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    entries(dir)
        .into_iter()
        .map(|name| {
            let data = read_file(&dir.join(&name));
            (name, data)
        })
        .collect()
}

/// docs/SNAPSHOTS.md (i) `power_cut_right_after_snapshot`, through the
/// mount: `subvolume create sv; write 100 files in sv; sync; write 20
/// more; subvolume snapshot sv snap; subvolume snapshot -r sv snap-ro;
/// <cut>` → `snap` and `snap-ro` each equal to `sv` as it was (a snapshot
/// commits its source first, so the files written after the sync are in
/// both), `snap-ro` refuses changes, check clean. 100 files make `sv`'s
/// tree several levels deep: every node of the copies is shared.
#[test]
fn power_cut_right_after_snapshot() {
    let Some(mut run) = CrashRun::start("snapshot") else {
        return;
    };
    let sv = run.path("sv");
    subvolume(&["create", p(&sv)]);
    for d in 0..4 {
        let dir = sv.join(format!("dir{d}"));
        mkdir(&dir);
        for i in 0..25u8 {
            write_file(
                &dir.join(format!("file-with-a-long-name-{i:03}")),
                &pattern(1000 + usize::from(i) * 517, i ^ d),
            );
        }
    }
    run.commit();
    for i in 0..20u8 {
        write_file(&sv.join(format!("late{i:02}")), &pattern(3000, i));
    }
    let want = tree_files(&sv);
    assert_eq!(want.len(), 120);
    subvolume(&["snapshot", p(&sv), p(&run.path("snap"))]);
    subvolume(&["snapshot", "-r", p(&sv), p(&run.path("snap-ro"))]);
    run.cut_and_remount();

    assert_entries(run.root(), &["snap", "snap-ro", "sv"]);
    assert!(
        tree_files(&run.path("snap")) == want,
        "snap differs from sv"
    );
    assert!(
        tree_files(&run.path("snap-ro")) == want,
        "snap-ro differs from sv"
    );
    assert!(tree_files(&sv) == want, "sv changed");
    let refused = fs::write(run.path("snap-ro/late00"), b"x").map_err(|e| e.raw_os_error());
    assert_eq!(refused, Err(Some(libc::EROFS)), "write into snap-ro");
    write_file(&run.path("snap/late00"), b"a writable snapshot");
    run.finish();
}

/// Every regular file below `dir`, by path relative to it.
fn tree_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut pending = vec![(dir.to_path_buf(), String::new())];
    while let Some((at, prefix)) = pending.pop() {
        for name in entries(&at) {
            let (path, rel) = (at.join(&name), format!("{prefix}/{name}"));
            if lstat(&path).is_dir() {
                pending.push((path, rel));
            } else {
                out.insert(rel, read_file(&path));
            }
        }
    }
    out
}

/// The same as a daemon killed with SIGKILL right after the snapshot
/// (nothing written after it, no unmount): snap present and equal.
#[test]
fn snapshot_survives_daemon_kill() {
    let Some(mut run) = CrashRun::start("snapshot-kill") else {
        return;
    };
    let sv = run.path("sv");
    subvolume(&["create", p(&sv)]);
    write_file(&sv.join("f"), &pattern(200_000, 9));
    let want = files(&sv);
    subvolume(&["snapshot", "-r", p(&sv), p(&run.path("snap"))]);
    write_file(&sv.join("after"), b"not in the snapshot");
    run.fx.kill_daemon();
    if let Err(report) = run.fx.check() {
        panic!("image as the kill left it is not clean: {report}");
    }
    run.fx.mount();
    assert!(files(&run.path("snap")) == want, "snap differs from sv");
    run.finish();
}

/// docs/SNAPSHOTS.md (i) `fsync_inside_snapshot_survives`, through the
/// mount: `snapshot sv s; write s/f X; fsync s/f; write s/g Y; fsync s/g;
/// <cut>` → `s/f` = X, `s/g` = Y, `sv/f` unchanged, no `sv/g`. Both
/// fsyncs are answered by a log sync of `s`'s own log (docs/SNAPSHOTS.md
/// (e)), not by a commit: `birch stats` counts two logged fsyncs and no
/// commit, so the cut lands on the log and the mount replays it.
#[test]
fn fsync_inside_snapshot_survives() {
    let Some(mut run) = CrashRun::start("fsync-in-snapshot") else {
        return;
    };
    let sv = run.path("sv");
    subvolume(&["create", p(&sv)]);
    let old = pattern(50_000, 1);
    write_file(&sv.join("f"), &old);
    run.commit();
    subvolume(&["snapshot", p(&sv), p(&run.path("s"))]);
    let counters = |run: &CrashRun| {
        let stats = common::stats_json(run.root());
        ["commits", "logged_fsyncs", "log_syncs"].map(|name| {
            stats
                .get(name)
                .and_then(|v| v.as_u64())
                .unwrap_or_else(|| panic!("no counter {name} in birch stats --json"))
        })
    };
    let before = counters(&run);
    let new = pattern(70_000, 2);
    write_file(&run.path("s/f"), &new);
    fsync(&run.path("s/f"));
    let created = pattern(9_000, 3);
    write_file(&run.path("s/g"), &created);
    fsync(&run.path("s/g"));
    let after = counters(&run);
    assert_eq!(
        (after[0] - before[0], after[1] - before[1]),
        (0, 2),
        "commits and logged fsyncs by the two fsyncs in the snapshot"
    );
    assert!(after[2] > before[2], "no log sync");
    run.cut_and_remount();

    assert_file(&run.path("s/f"), &new, 1);
    assert_file(&run.path("s/g"), &created, 1);
    assert_file(&sv.join("f"), &old, 1);
    assert_entries(&sv, &["f"]);
    run.finish();
}

/// docs/SNAPSHOTS.md (i) `delete_then_crash_before_commit_keeps_subvolume`,
/// through the mount: `delete sv` without -c, `<cut>` → `sv` back with
/// its files (the deletion was in no commit); then `delete -c sv; <cut>`
/// → gone, and the cleaner drops it after the mount.
#[test]
fn delete_then_crash_before_commit_keeps_subvolume() {
    let Some(mut run) = CrashRun::start("delete-uncommitted") else {
        return;
    };
    let sv = run.path("sv");
    subvolume(&["create", p(&sv)]);
    let data = pattern(100_000, 3);
    write_file(&sv.join("f"), &data);
    run.commit();
    subvolume(&["delete", p(&sv)]);
    assert_entries(run.root(), &[]);
    run.cut_and_remount();
    assert_entries(run.root(), &["sv"]);
    assert_file(&sv.join("f"), &data, 1);

    subvolume(&["delete", "-c", p(&sv)]);
    run.cut_and_remount();
    assert_entries(run.root(), &[]);
    subvolume(&["sync", p(run.root())]);
    run.finish();
}

/// Free blocks of the mounted filesystem (statvfs), once the space the
/// last commits freed is back: freed space is held until the commit after
/// the one that freed it is durable.
fn settled_free_blocks(fx: &Fixture) -> u64 {
    fx.sync();
    fx.sync();
    let path = cstr(&fx.mnt);
    // SAFETY: a valid C string and a zeroed statvfs for the call to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statvfs: {}", std::io::Error::last_os_error());
    st.f_bfree
}

/// docs/SNAPSHOTS.md (i) `crash_mid_deletion_resumes`, through the
/// mount: `subvolume create sv` (2,000 files in 20 directories; the
/// case's 20,000 would take minutes to create through FUSE) `; sync;
/// subvolume delete -c sv; subvolume sync` on a mount that records its
/// device writes (`--write-log`) with `cleaner_nodes=2`, so that the drop
/// takes many commits. Each state a power cut at a flush of the
/// cleaner's first commits (and one halfway) leaves is rebuilt with
/// `birch replay --flush N`: `birch check` is clean (a deletion in
/// progress is reported, not a fault); a mount shows `sv` gone, `birch
/// subvolume sync` finishes the drop, the free blocks are back to what
/// they were before `sv` was created, and the image checks clean with no
/// deletion left.
#[test]
fn crash_mid_deletion_resumes() {
    if skip_unless_root() {
        return;
    }
    let _one_at_a_time = exclusive();
    let mut fx = Fixture::new("crash-mid-deletion", "64M");
    fx.options = vec!["commit=0".into(), "cleaner_nodes=2".into()];
    fx.mount();
    let free_before = settled_free_blocks(&fx);
    let sv = fx.path("sv");
    subvolume(&["create", p(&sv)]);
    for d in 0..20 {
        let dir = sv.join(format!("dir{d}"));
        mkdir(&dir);
        for f in 0..100 {
            File::create(dir.join(format!("file-with-a-longer-name-{f}")))
                .unwrap_or_else(|e| panic!("create in {}: {e}", dir.display()));
        }
    }
    fx.sync();
    fx.unmount();
    let base = fx.scratch.path("before-the-deletion");
    common::run_ok(
        std::process::Command::new("cp")
            .arg("--sparse=always")
            .arg(&fx.image)
            .arg(&base),
    );
    let log = fx.scratch.path("device-writes");
    fx.write_log = Some(log.clone());
    fx.mount();
    fx.write_log = None;
    subvolume(&["delete", "-c", p(&sv)]);
    // An fsync's mark in the log: every flush after it is the cleaner's.
    write_file(&fx.path("mark"), b"the deletion is committed");
    fsync(&fx.path("mark"));
    subvolume(&["sync", p(&fx.mnt)]);
    fx.unmount();

    let listing = common::run_ok(
        std::process::Command::new(common::BIRCH)
            .arg("replay")
            .arg(&log)
            .arg("--list"),
    );
    let (mut flushes, mut marked) = (0u64, None);
    for line in common::text(&listing.stdout).lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.get(1..3) {
            Some(["flush", _]) => flushes += 1,
            Some(["mark", name]) if name.starts_with("fsync") => marked = Some(flushes),
            _ => {}
        }
    }
    let marked = marked.expect("the fsync's mark in the write log");
    assert!(
        flushes > marked + 20,
        "the drop takes many commits: {flushes} flushes, the mark after {marked}"
    );
    let mut points: Vec<u64> = (marked + 1..=marked + 8).collect();
    points.push(marked + (flushes - marked) / 2);
    let mut mid_drop = 0;
    for flush in points {
        common::run_ok(
            std::process::Command::new(common::BIRCH)
                .arg("replay")
                .arg(&log)
                .arg("--flush")
                .arg(flush.to_string())
                .arg("--from")
                .arg(&base)
                .arg("--out")
                .arg(&fx.image),
        );
        let report = fx
            .check()
            .unwrap_or_else(|e| panic!("power cut at flush {flush}: {e}"));
        // "(0 UNKNOWN 0)" would be a drop not started yet.
        if report
            .lines()
            .any(|l| l.starts_with("deleted subvolume 256: being dropped") && !l.contains("(0 "))
        {
            mid_drop += 1;
        }
        fx.mount();
        assert_entries(&fx.mnt, &["mark"]);
        subvolume(&["sync", p(&fx.mnt)]);
        let free = settled_free_blocks(&fx);
        assert!(
            free + 8 >= free_before && free <= free_before,
            "power cut at flush {flush}: {free} free blocks after the drop, {free_before} before sv"
        );
        fx.unmount();
        let report = fx
            .check()
            .unwrap_or_else(|e| panic!("power cut at flush {flush}, drop finished: {e}"));
        assert!(
            !report.contains("deleted subvolume"),
            "power cut at flush {flush}: the drop did not finish:\n{report}"
        );
    }
    assert!(mid_drop > 0, "no state had a drop in progress");
    fx.check_at_drop = false;
}
