//! `birch receive` (docs/SEND.md "Receive"): streams that kernel btrfs's
//! `btrfs send` wrote, from read-only snapshots on a loop device this test
//! creates (and always detaches), applied to a birch mount and compared
//! with their source tree: names, file types, hard links, symlinks, fifo
//! and device nodes, sockets, xattrs, owners, modes, atime and mtime,
//! data (holes, a reflinked extent); full, then incremental with renames
//! across directories, a directory renamed over a removed one, two files
//! swapped and a clone from the parent. Also a truncated stream and a
//! hostile one: an error naming the command and offset, nothing published.
//!
//! Needs root, /dev/fuse, btrfs-progs and a kernel with btrfs (skips
//! otherwise, fails with BIRCH_REQUIRE_MOUNT=1;
//! scripts/install-test-tools.sh installs btrfs-progs).

mod common;

use common::{birch, run, run_ok, skip_unless_root, text, Fixture, Scratch};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A kernel btrfs on a loop device over a file in `scratch`; unmounted and
/// detached on drop, also when the test fails.
struct LoopBtrfs {
    device: String,
    mnt: PathBuf,
    mounted: bool,
}

impl LoopBtrfs {
    fn new(scratch: &Scratch) -> LoopBtrfs {
        let image = scratch.path("btrfs.img");
        fs::File::create(&image)
            .and_then(|f| f.set_len(300 << 20))
            .expect("btrfs image");
        run_ok(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&image));
        let out = run_ok(Command::new("losetup").args(["-f", "--show"]).arg(&image));
        let device = text(&out.stdout).trim().to_string();
        let mnt = scratch.path("btrfs");
        fs::create_dir(&mnt).expect("btrfs mount point");
        let mut lb = LoopBtrfs {
            device,
            mnt,
            mounted: false,
        };
        run_ok(Command::new("mount").arg(&lb.device).arg(&lb.mnt));
        lb.mounted = true;
        lb
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    fn btrfs(&self, args: &[&str]) -> String {
        text(&run_ok(Command::new("btrfs").args(args)).stdout)
    }

    fn uuid(&self, rel: &str) -> String {
        let show = self.btrfs(&["subvolume", "show", self.path(rel).to_str().unwrap()]);
        show.lines()
            .find_map(|l| l.trim().strip_prefix("UUID:"))
            .expect("btrfs subvolume show prints a UUID")
            .trim()
            .to_string()
    }
}

impl Drop for LoopBtrfs {
    fn drop(&mut self) {
        if self.mounted {
            run(Command::new("umount").arg(&self.mnt));
        }
        run(Command::new("losetup").args(["-d", &self.device]));
    }
}

fn tools_missing() -> bool {
    let missing = ["btrfs", "mkfs.btrfs", "losetup"].iter().any(|t| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .map_or(true, |o| !o.status.success())
    }) || !fs::read_to_string("/proc/filesystems").is_ok_and(|f| f.contains("btrfs"));
    if missing {
        if std::env::var("BIRCH_REQUIRE_MOUNT").is_ok_and(|v| v == "1") {
            panic!("btrfs-progs or kernel btrfs missing (scripts/install-test-tools.sh)");
        }
        eprintln!("skipped: btrfs-progs or kernel btrfs missing");
    }
    missing
}

fn sh(script: &str, dir: &Path) {
    run_ok(Command::new("sh").args(["-euc", script]).current_dir(dir));
}

/// What the comparison sees of one name: type and permission bits,
/// owner, size (not of directories: btrfs counts names twice), link
/// count (not of directories: btrfs says 1), device number, atime and
/// mtime to the nanosecond, symlink target, xattrs, the data's bytes
/// and which other names are the same inode.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    mode: u32,
    uid: u32,
    gid: u32,
    size: Option<u64>,
    nlink: Option<u64>,
    rdev: u64,
    atime: (i64, i64),
    mtime: (i64, i64),
    target: Option<PathBuf>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Length and a hash of the data (a failure prints this, not megabytes).
    data: Option<(usize, u64)>,
    /// The first name (in walk order) of the same inode.
    same_as: String,
}

fn xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let out = run_ok(
        Command::new("getfattr")
            .args(["-h", "-d", "-m", "-", "-e", "hex", "--absolute-names"])
            .arg(path),
    );
    text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

/// Every name under `root` with what [`Entry`] holds. Metadata first,
/// data after (reading a file must not move the times compared).
fn tree(root: &Path) -> BTreeMap<String, Entry> {
    let mut names = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut children: Vec<_> = fs::read_dir(root.join(&rel))
            .unwrap()
            .map(|e| rel.join(e.unwrap().file_name()))
            .collect();
        children.sort();
        for c in children {
            if fs::symlink_metadata(root.join(&c)).unwrap().is_dir() {
                stack.push(c.clone());
            }
            names.push(c);
        }
    }
    names.sort();
    let mut first_of_inode: BTreeMap<u64, String> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for rel in &names {
        let path = root.join(rel);
        let m = fs::symlink_metadata(&path).unwrap();
        let name = rel.to_string_lossy().to_string();
        let same_as = first_of_inode
            .entry(m.ino())
            .or_insert(name.clone())
            .clone();
        let dir = m.is_dir();
        out.insert(
            name,
            Entry {
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                size: (!dir).then_some(m.size()),
                nlink: (!dir).then_some(m.nlink()),
                rdev: m.rdev(),
                atime: (m.atime(), m.atime_nsec()),
                mtime: (m.mtime(), m.mtime_nsec()),
                target: m
                    .file_type()
                    .is_symlink()
                    .then(|| fs::read_link(&path).unwrap()),
                xattrs: BTreeMap::new(),
                data: None,
                same_as,
            },
        );
    }
    for (name, e) in out.iter_mut() {
        let path = root.join(name);
        e.xattrs = xattrs(&path);
        if e.mode & libc::S_IFMT == libc::S_IFREG {
            let bytes = fs::read(&path).unwrap();
            let mut h = std::collections::hash_map::DefaultHasher::new();
            std::hash::Hash::hash(&bytes, &mut h);
            e.data = Some((bytes.len(), std::hash::Hasher::finish(&h)));
        }
    }
    out
}

fn assert_same_tree(source: &Path, received: &Path) {
    let a = tree(source);
    let b = tree(received);
    let names_a: Vec<_> = a.keys().collect();
    let names_b: Vec<_> = b.keys().collect();
    assert_eq!(
        names_a,
        names_b,
        "names differ: {} vs {}",
        source.display(),
        received.display()
    );
    for (name, ea) in &a {
        assert_eq!(
            ea,
            &b[name],
            "{name} differs ({} vs {})",
            source.display(),
            received.display()
        );
    }
    // The subvolume roots too (not in the walk): owner, mode, times.
    let (ra, rb) = (
        fs::metadata(source).unwrap(),
        fs::metadata(received).unwrap(),
    );
    assert_eq!(
        (ra.mode(), ra.uid(), ra.gid(), ra.mtime(), ra.mtime_nsec()),
        (rb.mode(), rb.uid(), rb.gid(), rb.mtime(), rb.mtime_nsec()),
        "subvolume roots differ"
    );
}

/// The first snapshot's tree: data with holes, hard links, symlinks,
/// a fifo, device nodes, a socket, xattrs, owners, modes (setuid too),
/// and a file reflinked from another; fixed times everywhere.
const POPULATE: &str = r#"
mkdir -p d1/sub d2 d3
head -c 300000 /dev/urandom > d1/data
dd if=/dev/urandom of=holes bs=4096 count=3 seek=100 conv=notrunc status=none
truncate -s 2M holes
cp --reflink=always d1/data d3/reflinked
echo small > small
ln small d2/small-link
ln small d1/sub/small-link2
ln -s ../small d2/sym
ln -s /absolute/elsewhere dangling
mkfifo fifo
mknod chr c 1 3
mknod blk b 7 200
setfattr -n user.color -v blue small
setfattr -n user.empty d1
setfattr -n user.bin -v 0x00ff00 d2/sym
setfattr -n trusted.x -v 1 holes
echo a > swap-a
echo bbbb > swap-b
echo gone > d1/sub/gone
chown 1234:5678 small d1/data
chown -h 42:43 d2/sym
chmod 4755 d1/data
chmod 640 holes
chmod 1777 d3
find . -exec touch -h -d '2021-03-04 05:06:07.123456789' {} +
"#;

/// The changes the incremental stream carries.
const CHANGE: &str = r#"
mv d1/data d2/data-moved
rm -r d1/sub
mv d3 d1-renamed
mv swap-a tmp && mv swap-b swap-a && mv tmp swap-b
dd if=/dev/urandom of=holes bs=4096 count=1 seek=200 conv=notrunc status=none
cp --reflink=always d2/data-moved d2/second-reflink
setfattr -x user.color small
setfattr -n user.new -v new small
chmod 600 small
chown 7:8 holes
echo appended >> d2/small-link
find . -exec touch -h -d '2022-05-06 07:08:09.987654321' {} +
"#;

/// Full and incremental `btrfs send` streams of a kernel btrfs, received
/// by birch: both trees compare equal to their sources, are read-only,
/// carry the sender's uuid as received uuid, and the incremental one
/// found its parent by received uuid.
#[test]
fn btrfs_send_full_and_incremental_received_by_birch() {
    if skip_unless_root() || tools_missing() {
        return;
    }
    let mut fx = Fixture::new("receive-btrfs", "512M");
    let lb = LoopBtrfs::new(&fx.scratch);
    lb.btrfs(&["subvolume", "create", lb.path("sv").to_str().unwrap()]);
    std::os::unix::net::UnixListener::bind(lb.path("sv/sock")).unwrap();
    sh(POPULATE, &lb.path("sv"));
    lb.btrfs(&[
        "subvolume",
        "snapshot",
        "-r",
        lb.path("sv").to_str().unwrap(),
        lb.path("s1").to_str().unwrap(),
    ]);
    sh(CHANGE, &lb.path("sv"));
    // A directory renamed over one that was removed: d1-renamed (d3,
    // with the first reflink) goes, d1 takes its name. The stream then
    // has RENAMEs across directories, two RMDIRs, the swap and a CLONE
    // (btrfs receive --dump).
    sh("mkdir d1/inner && touch -d 2020-01-01 d1/inner; rm -r d1-renamed; mv d1 d1-renamed; touch -h -d '2022-05-06 07:08:09.987654321' . d1-renamed", &lb.path("sv"));
    lb.btrfs(&[
        "subvolume",
        "snapshot",
        "-r",
        lb.path("sv").to_str().unwrap(),
        lb.path("s2").to_str().unwrap(),
    ]);
    let full = fx.scratch.path("full.stream");
    let incremental = fx.scratch.path("incremental.stream");
    lb.btrfs(&[
        "send",
        "-q",
        "-f",
        full.to_str().unwrap(),
        lb.path("s1").to_str().unwrap(),
    ]);
    lb.btrfs(&[
        "send",
        "-q",
        "-p",
        lb.path("s1").to_str().unwrap(),
        "-f",
        incremental.to_str().unwrap(),
        lb.path("s2").to_str().unwrap(),
    ]);
    let dump = lb.btrfs(&["receive", "--dump", "-f", incremental.to_str().unwrap()]);
    for command in ["clone ", "rename ", "rmdir ", "link ", "remove_xattr "] {
        assert!(
            dump.lines().any(|l| l.starts_with(command)),
            "no {command}in {dump}"
        );
    }

    fx.mount();
    let into = fx.path("backups");
    fs::create_dir(&into).unwrap();
    let dest = into.to_str().unwrap();
    for stream in [&full, &incremental] {
        let out = birch(&["receive", "-f", stream.to_str().unwrap(), dest]);
        assert!(
            out.status.success(),
            "receive {}: {}{}",
            stream.display(),
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    assert_same_tree(&lb.path("s1"), &fx.path("backups/s1"));
    assert_same_tree(&lb.path("s2"), &fx.path("backups/s2"));
    // Nothing hidden is left.
    let names: Vec<_> = fs::read_dir(&into)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");

    let list = text(&birch(&["subvolume", "list", "-R", fx.mnt.to_str().unwrap()]).stdout);
    for snap in ["s1", "s2"] {
        let line = list
            .lines()
            .find(|l| l.ends_with(&format!("path backups/{snap}")))
            .unwrap_or_else(|| panic!("{snap} not listed: {list}"));
        assert!(
            line.contains(&format!("received_uuid {}", lb.uuid(snap))),
            "{line}"
        );
        let ro = text(
            &birch(&[
                "property",
                "get",
                fx.path(&format!("backups/{snap}")).to_str().unwrap(),
                "ro",
            ])
            .stdout,
        );
        assert_eq!(ro.trim(), "ro=true", "{snap}");
    }
    fx.unmount();
    fx.assert_clean();
}

/// A stream cut short, or one with a hostile path, fails with the
/// command and byte offset named, and leaves neither the subvolume nor
/// its hidden name behind.
#[test]
fn truncated_stream_publishes_nothing() {
    if skip_unless_root() || tools_missing() {
        return;
    }
    let mut fx = Fixture::new("receive-truncated", "256M");
    let lb = LoopBtrfs::new(&fx.scratch);
    lb.btrfs(&["subvolume", "create", lb.path("sv").to_str().unwrap()]);
    std::os::unix::net::UnixListener::bind(lb.path("sv/sock")).unwrap();
    sh(POPULATE, &lb.path("sv"));
    lb.btrfs(&[
        "subvolume",
        "snapshot",
        "-r",
        lb.path("sv").to_str().unwrap(),
        lb.path("s1").to_str().unwrap(),
    ]);
    let full = fx.scratch.path("full.stream");
    lb.btrfs(&[
        "send",
        "-q",
        "-f",
        full.to_str().unwrap(),
        lb.path("s1").to_str().unwrap(),
    ]);
    let bytes = fs::read(&full).unwrap();
    let cut = fx.scratch.path("cut.stream");
    fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    // The last command (END) with its length grown past the stream.
    let hostile = fx.scratch.path("hostile.stream");
    let mut h = bytes.clone();
    let end = h.len() - 10;
    h[end..end + 4].copy_from_slice(&1000u32.to_le_bytes());
    fs::write(&hostile, &h).unwrap();

    fx.mount();
    let dest = fx.mnt.to_str().unwrap().to_string();
    for (stream, expect) in [(&cut, "stream ends"), (&hostile, "END at byte")] {
        let out = birch(&["receive", "-f", stream.to_str().unwrap(), &dest]);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{}", text(&out.stdout));
        assert!(
            err.contains("send stream:") && err.contains(expect),
            "{err}"
        );
        assert!(err.contains(" at byte "), "{err}");
        let left: Vec<_> = fs::read_dir(&fx.mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    // The whole stream still goes in after the failures.
    let out = birch(&["receive", "-f", full.to_str().unwrap(), &dest]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_same_tree(&lb.path("s1"), &fx.path("s1"));
    fx.unmount();
    fx.assert_clean();
}
