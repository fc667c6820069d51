//! `birch receive` and `birch send` (docs/SEND.md) against kernel
//! btrfs's `btrfs send` and `btrfs receive`, on a loop device this test
//! creates (and always detaches).
//!
//! Receive: streams that `btrfs send` wrote from read-only snapshots,
//! applied to a birch mount and compared with their source tree: names,
//! file types, hard links, symlinks, fifo and device nodes, sockets,
//! xattrs, owners, modes, atime and mtime, data (holes, a reflinked
//! extent); full, then incremental with renames across directories, a
//! directory renamed over a removed one, two files swapped and a clone
//! from the parent. Also a truncated stream and a hostile one: an error
//! naming the command and offset, nothing published.
//!
//! Send: the same trees built on birch, sent by `birch send` (through the
//! mount, and from the unmounted image), received by `btrfs receive` and
//! by `birch receive`, compared the same way; several snapshots in one
//! stream; the refusals.
//!
//! Needs root, /dev/fuse, btrfs-progs and a kernel with btrfs (skips
//! otherwise, fails with BIRCH_REQUIRE_MOUNT=1;
//! scripts/install-test-tools.sh installs btrfs-progs).

mod common;

use common::{birch, run, run_ok, skip_unless_root, text, Fixture, Scratch, BIRCH};
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

    /// `btrfs subvolume snapshot -r sv NAME`.
    fn snapshot(&self, name: &str) {
        self.btrfs(&[
            "subvolume",
            "snapshot",
            "-r",
            self.path("sv").to_str().unwrap(),
            self.path(name).to_str().unwrap(),
        ]);
    }

    /// `btrfs send -q [-p PARENT] -f STREAM SNAPSHOT`.
    fn send(&self, parent: Option<&str>, snapshot: &str, stream: &Path) {
        let mut args = vec!["send".to_string(), "-q".to_string()];
        if let Some(p) = parent {
            args.extend(["-p".to_string(), self.path(p).to_str().unwrap().to_string()]);
        }
        args.extend([
            "-f".to_string(),
            stream.to_str().unwrap().to_string(),
            self.path(snapshot).to_str().unwrap().to_string(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.btrfs(&args);
    }

    /// Subvolume sv with POPULATE's tree (and a socket) in it.
    fn populate(&self) {
        self.btrfs(&["subvolume", "create", self.path("sv").to_str().unwrap()]);
        std::os::unix::net::UnixListener::bind(self.path("sv/sock")).unwrap();
        sh(POPULATE, &self.path("sv"));
    }

    /// POPULATE's tree as snapshot s1, then CHANGE's and a directory
    /// renamed over a removed one as s2; returns the full stream of s1
    /// and the incremental one of s2 (written in `scratch`).
    fn full_and_incremental(&self, scratch: &Scratch) -> (PathBuf, PathBuf) {
        self.populate();
        self.snapshot("s1");
        sh(CHANGE, &self.path("sv"));
        // A directory renamed over one that was removed: d1-renamed (d3,
        // with the first reflink) goes, d1 takes its name. The stream then
        // has RENAMEs across directories, two RMDIRs, the swap and a CLONE
        // (btrfs receive --dump).
        sh("mkdir d1/inner && touch -d 2020-01-01 d1/inner; rm -r d1-renamed; mv d1 d1-renamed; touch -h -d '2022-05-06 07:08:09.987654321' . d1-renamed", &self.path("sv"));
        self.snapshot("s2");
        let full = scratch.path("full.stream");
        let incremental = scratch.path("incremental.stream");
        self.send(None, "s1", &full);
        self.send(Some("s1"), "s2", &incremental);
        (full, incremental)
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
    let (full, incremental) = lb.full_and_incremental(&fx.scratch);
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

/// Two bad copies of the stream `bytes`, written in the fixture's scratch
/// directory: one cut at two thirds, and one whose last command (END)
/// claims a length past the stream's end.
fn cut_and_hostile_streams(fx: &Fixture, bytes: &[u8]) -> (PathBuf, PathBuf) {
    let cut = fx.scratch.path("cut.stream");
    fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let hostile = fx.scratch.path("hostile.stream");
    let mut h = bytes.to_vec();
    let end = h.len() - 10;
    h[end..end + 4].copy_from_slice(&1000u32.to_le_bytes());
    fs::write(&hostile, &h).unwrap();
    (cut, hostile)
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
    lb.populate();
    lb.snapshot("s1");
    let full = fx.scratch.path("full.stream");
    lb.send(None, "s1", &full);
    let bytes = fs::read(&full).unwrap();
    let (cut, hostile) = cut_and_hostile_streams(&fx, &bytes);

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

/// `birch ARGS`, which must succeed.
fn birch_ok(args: &[&str]) -> String {
    let out = birch(args);
    assert!(
        out.status.success(),
        "birch {args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The birch twin of the btrfs trees above: POPULATE and CHANGE (a reflink
/// on birch is `copy_file_range`, which `cp --reflink=auto` uses; FUSE has
/// no FICLONE) in subvolume `sv` of the mount, read-only snapshots `s1`
/// and `s2`.
fn birch_snapshots(fx: &Fixture) {
    let sv = fx.path("sv");
    birch_ok(&["subvolume", "create", sv.to_str().unwrap()]);
    std::os::unix::net::UnixListener::bind(sv.join("sock")).unwrap();
    sh(&POPULATE.replace("--reflink=always", "--reflink=auto"), &sv);
    let snapshot = |name: &str| {
        birch_ok(&[
            "subvolume",
            "snapshot",
            "-r",
            sv.to_str().unwrap(),
            fx.path(name).to_str().unwrap(),
        ])
    };
    snapshot("s1");
    sh(&CHANGE.replace("--reflink=always", "--reflink=auto"), &sv);
    sh("mkdir d1/inner && touch -d 2020-01-01 d1/inner; rm -r d1-renamed; mv d1 d1-renamed; touch -h -d '2022-05-06 07:08:09.987654321' . d1-renamed", &sv);
    snapshot("s2");
}

/// What `birch subvolume show` prints as PATH's UUID.
fn birch_uuid(path: &Path) -> String {
    let show = birch_ok(&["subvolume", "show", path.to_str().unwrap()]);
    show.lines()
        .find_map(|l| l.trim().strip_prefix("UUID:"))
        .unwrap_or_else(|| panic!("no UUID in {show}"))
        .trim()
        .to_string()
}

/// An incremental stream names its parent by uuid and transid; a
/// subvolume received under that uuid at another transid is not the
/// parent the sender had (btrfs-progs' search matches the transid too):
/// the receive fails naming both transids and publishes nothing, and the
/// stream as sent then applies.
#[test]
fn incremental_stream_refuses_a_parent_at_another_transid() {
    if skip_unless_root() || tools_missing() {
        return;
    }
    use birch::format::send_stream::{Command as StreamCommand, StreamReader, StreamWriter};
    let mut fx = Fixture::new("receive-transid", "256M");
    let lb = LoopBtrfs::new(&fx.scratch);
    lb.btrfs(&["subvolume", "create", lb.path("sv").to_str().unwrap()]);
    sh("echo one > a", &lb.path("sv"));
    lb.snapshot("s1");
    sh("echo two >> a", &lb.path("sv"));
    lb.snapshot("s2");
    let full = fx.scratch.path("full.stream");
    let incremental = fx.scratch.path("incremental.stream");
    lb.send(None, "s1", &full);
    lb.send(Some("s1"), "s2", &incremental);
    // The same stream, its SNAPSHOT naming the parent at the next transid.
    let moved = fx.scratch.path("moved.stream");
    let mut reader = StreamReader::new(fs::File::open(&incremental).unwrap()).unwrap();
    let mut writer = StreamWriter::new(fs::File::create(&moved).unwrap()).unwrap();
    let mut wanted = None;
    while let Some((_, mut command)) = reader.next_command().unwrap() {
        if let StreamCommand::Snapshot { clone_ctransid, .. } = &mut command {
            *clone_ctransid += 1;
            wanted = Some(*clone_ctransid);
        }
        writer.write(&command).unwrap();
    }
    let wanted = wanted.expect("an incremental stream begins with SNAPSHOT");
    drop(writer);

    fx.mount();
    let dest = fx.mnt.to_str().unwrap().to_string();
    birch_ok(&["receive", "-f", full.to_str().unwrap(), &dest]);
    let out = birch(&["receive", "-f", moved.to_str().unwrap(), &dest]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        err.contains(&format!("the stream needs transid {wanted}"))
            && err.contains("parent subvolume s1")
            && err.contains("SNAPSHOT at byte"),
        "{err}"
    );
    let left: Vec<_> = fs::read_dir(&fx.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["s1"], "left behind");
    birch_ok(&["receive", "-f", incremental.to_str().unwrap(), &dest]);
    assert_same_tree(&lb.path("s2"), &fx.path("s2"));
    fx.unmount();
    fx.assert_clean();
}

/// A subvolume name of 255 bytes (the most a name may have) is received:
/// the hidden name it is built under is the stream's uuid, not NAME with
/// a prefix.
#[test]
fn a_subvolume_named_with_255_bytes_is_received() {
    if skip_unless_root() || tools_missing() {
        return;
    }
    let mut fx = Fixture::new("receive-long-name", "256M");
    let lb = LoopBtrfs::new(&fx.scratch);
    lb.btrfs(&["subvolume", "create", lb.path("sv").to_str().unwrap()]);
    sh("echo data > f && mkdir d && ln -s f d/link", &lb.path("sv"));
    let name = "n".repeat(255);
    lb.snapshot(&name);
    let stream = fx.scratch.path("long.stream");
    lb.send(None, &name, &stream);
    fx.mount();
    birch_ok(&[
        "receive",
        "-f",
        stream.to_str().unwrap(),
        fx.mnt.to_str().unwrap(),
    ]);
    assert_same_tree(&lb.path(&name), &fx.path(&name));
    fx.unmount();
    fx.assert_clean();
}

/// `birch send` of a birch tree, full and incremental, received by kernel
/// btrfs and by birch: every received tree compares equal to its
/// snapshot; btrfs records birch's uuids as received uuids; the full
/// stream clones the reflinked file instead of sending its data twice;
/// a stream of two snapshots carries both; and the unmounted image
/// sends the same trees.
#[test]
fn birch_send_full_and_incremental_received_by_btrfs() {
    if skip_unless_root() || tools_missing() {
        return;
    }
    let mut fx = Fixture::new("send-birch", "512M");
    let lb = LoopBtrfs::new(&fx.scratch);
    fx.mount();
    birch_snapshots(&fx);
    let s1 = fx.path("s1");
    let s2 = fx.path("s2");
    let full = fx.scratch.path("full.stream");
    let incremental = fx.scratch.path("incremental.stream");
    birch_ok(&[
        "send",
        "-q",
        "-f",
        full.to_str().unwrap(),
        s1.to_str().unwrap(),
    ]);
    birch_ok(&[
        "send",
        "-q",
        "-p",
        s1.to_str().unwrap(),
        "-f",
        incremental.to_str().unwrap(),
        s2.to_str().unwrap(),
    ]);
    let dump = |stream: &Path| lb.btrfs(&["receive", "--dump", "-f", stream.to_str().unwrap()]);
    let full_dump = dump(&full);
    assert!(
        full_dump.lines().any(|l| l.starts_with("clone ")),
        "no clone in the full stream: {full_dump}"
    );
    let incremental_dump = dump(&incremental);
    for command in [
        "snapshot ",
        "rename ",
        "rmdir ",
        "unlink ",
        "remove_xattr ",
        "utimes ",
    ] {
        assert!(
            incremental_dump.lines().any(|l| l.starts_with(command)),
            "no {command}in {incremental_dump}"
        );
    }
    // The 300 kB file that moved is renamed, its data not sent again.
    // (Its new reflinked copy is: a clone source outside the stream's own
    // writes would need extent back references; docs/SEND.md.)
    let written: Vec<&str> = incremental_dump
        .lines()
        .filter(|l| l.starts_with("write "))
        .collect();
    assert!(
        !written.iter().any(|l| l.contains("data-moved")),
        "{written:?}"
    );

    for stream in [&full, &incremental] {
        lb.btrfs(&[
            "receive",
            "-f",
            stream.to_str().unwrap(),
            lb.mnt.to_str().unwrap(),
        ]);
    }
    assert_same_tree(&s1, &lb.path("s1"));
    assert_same_tree(&s2, &lb.path("s2"));
    let received = lb.btrfs(&["subvolume", "show", lb.path("s2").to_str().unwrap()]);
    let received_uuid = received
        .lines()
        .find_map(|l| l.trim().strip_prefix("Received UUID:"))
        .expect("btrfs subvolume show prints a received uuid")
        .trim();
    assert_eq!(received_uuid, birch_uuid(&s2));

    // birch to birch, through a pipe.
    let copies = fx.path("copies");
    fs::create_dir(&copies).unwrap();
    for args in [
        format!("{BIRCH} send -q {}", s1.display()),
        format!("{BIRCH} send -q -p {} {}", s1.display(), s2.display()),
    ] {
        sh(
            &format!("{args} | {BIRCH} receive {}", copies.display()),
            &fx.mnt,
        );
    }
    assert_same_tree(&s1, &copies.join("s1"));
    assert_same_tree(&s2, &copies.join("s2"));
    // And on from the received copies, as a backup server passes them
    // on: they are sent as the uuid they were received as, the parent
    // named at its own ctransid, which the next copy records.
    let relayed = fx.path("relayed");
    fs::create_dir(&relayed).unwrap();
    let (c1, c2) = (copies.join("s1"), copies.join("s2"));
    for args in [
        format!("{BIRCH} send -q {}", c1.display()),
        format!("{BIRCH} send -q -p {} {}", c1.display(), c2.display()),
    ] {
        sh(
            &format!("{args} | {BIRCH} receive {}", relayed.display()),
            &fx.mnt,
        );
    }
    assert_same_tree(&s2, &relayed.join("s2"));
    let list = birch_ok(&["subvolume", "list", "-R", fx.mnt.to_str().unwrap()]);
    let received_as = |path: &str| {
        list.lines()
            .find(|l| l.ends_with(&format!("path {path}")))
            .and_then(|l| l.split("received_uuid ").nth(1))
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("{path} not listed: {list}"))
            .to_string()
    };
    assert_eq!(received_as("relayed/s2"), birch_uuid(&s2));

    // Two snapshots, one stream: one header, one END, both received.
    let both = fx.scratch.path("both.stream");
    birch_ok(&[
        "send",
        "-q",
        "-f",
        both.to_str().unwrap(),
        s1.to_str().unwrap(),
        s2.to_str().unwrap(),
    ]);
    let both_dump = dump(&both);
    assert_eq!(
        both_dump
            .lines()
            .filter(|l| l.starts_with("subvol "))
            .count(),
        2,
        "{both_dump}"
    );
    let into = lb.path("both");
    fs::create_dir(&into).unwrap();
    lb.btrfs(&[
        "receive",
        "-f",
        both.to_str().unwrap(),
        into.to_str().unwrap(),
    ]);
    assert_same_tree(&s1, &into.join("s1"));
    assert_same_tree(&s2, &into.join("s2"));
    fx.unmount();

    // The unmounted image: the same trees, paths from the top level.
    let from_image = fx.scratch.path("image-full.stream");
    let from_image_incremental = fx.scratch.path("image-incremental.stream");
    let image = fx.image.to_str().unwrap();
    birch_ok(&[
        "send",
        "-q",
        "--image",
        image,
        "-f",
        from_image.to_str().unwrap(),
        "s1",
    ]);
    birch_ok(&[
        "send",
        "-q",
        "--image",
        image,
        "-p",
        "s1",
        "-f",
        from_image_incremental.to_str().unwrap(),
        "s2",
    ]);
    let into = lb.path("image");
    fs::create_dir(&into).unwrap();
    for stream in [&from_image, &from_image_incremental] {
        lb.btrfs(&[
            "receive",
            "-f",
            stream.to_str().unwrap(),
            into.to_str().unwrap(),
        ]);
    }
    fx.mount();
    assert_same_tree(&fx.path("s1"), &into.join("s1"));
    assert_same_tree(&fx.path("s2"), &into.join("s2"));
    fx.unmount();
    fx.assert_clean();
}

/// What `birch send` refuses, each with a message naming why: a writable
/// subvolume, a directory that is no subvolume, a parent that is not on a
/// birch mount, a user who is neither root nor the mount's owner, and on
/// an image a path that names no subvolume. None leaves an output file.
#[test]
fn birch_send_refusals_name_the_reason() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("send-refusals", "256M");
    fx.mount();
    let sv = fx.path("sv");
    birch_ok(&["subvolume", "create", sv.to_str().unwrap()]);
    fs::create_dir(sv.join("dir")).unwrap();
    birch_ok(&[
        "subvolume",
        "snapshot",
        "-r",
        sv.to_str().unwrap(),
        fx.path("ro").to_str().unwrap(),
    ]);
    let out_file = fx.scratch.path("refused.stream");
    let out = out_file.to_str().unwrap();
    let refused = |args: &[&str], expect: &str| {
        let o = birch(args);
        assert!(!o.status.success(), "birch {args:?} succeeded");
        let err = text(&o.stderr);
        assert!(err.contains(expect), "birch {args:?}: {err}");
        assert!(!out_file.exists(), "birch {args:?} left {out}");
    };
    refused(
        &["send", "-f", out, sv.to_str().unwrap()],
        "is not read-only",
    );
    refused(
        &["send", "-f", out, sv.join("dir").to_str().unwrap()],
        "not a subvolume",
    );
    refused(
        &[
            "send",
            "-f",
            out,
            "-p",
            "/",
            fx.path("ro").to_str().unwrap(),
        ],
        "/: not a birch mount",
    );
    let nobody = run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(BIRCH)
        .args(["send", "-f", "/dev/null", fx.path("ro").to_str().unwrap()]));
    assert!(!nobody.status.success());
    assert!(
        text(&nobody.stderr).contains("send needs root or the mount's owner"),
        "{}",
        text(&nobody.stderr)
    );
    fx.unmount();
    let image = fx.image.to_str().unwrap();
    refused(
        &["send", "--image", image, "-f", out, "nosuch"],
        "no subvolume nosuch",
    );
    refused(
        &["send", "--image", image, "-f", out, "sv"],
        "is not read-only",
    );
    fx.assert_clean();
}

/// Subvolume PATH (from the top level) of the unmounted image as `birch
/// subvolume show` prints it: whether it is read-only, and its received
/// uuid.
fn image_subvolume(image: &Path, path: &str) -> (bool, String) {
    let image = image.to_str().unwrap();
    let list = birch_ok(&["subvolume", "list", image]);
    let id = list
        .lines()
        .find(|l| l.ends_with(&format!(" path {path}")))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("{path} not listed: {list}"))
        .to_string();
    let show = birch_ok(&["subvolume", "show", "-r", &id, image]);
    let field = |name: &str| {
        show.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {show}"))
            .trim()
            .to_string()
    };
    (field("Flags:") == "readonly", field("Received UUID:"))
}

/// The paths `birch subvolume list IMAGE` prints.
fn image_subvolume_paths(image: &Path) -> Vec<String> {
    birch_ok(&["subvolume", "list", image.to_str().unwrap()])
        .lines()
        .filter_map(|l| l.split_once(" path ").map(|(_, p)| p.to_string()))
        .collect()
}

/// `birch receive --image`: a birch image's snapshots, sent from the
/// unmounted image full and incremental, received into a directory of a
/// second unmounted image; both compare equal to their sources, are
/// read-only with the sender's uuids as received uuids, nothing hidden
/// is left, and `birch check` finds the image clean. A stream of two
/// snapshots publishes both.
#[test]
fn birch_image_sent_and_received_into_an_image() {
    if skip_unless_root() {
        return;
    }
    let mut a = Fixture::new("recv-image-a", "512M");
    a.mount();
    birch_snapshots(&a);
    let uuids = [birch_uuid(&a.path("s1")), birch_uuid(&a.path("s2"))];
    a.unmount();
    let a_image = a.image.to_str().unwrap();
    let full = a.scratch.path("full.stream");
    let incremental = a.scratch.path("incremental.stream");
    let both = a.scratch.path("both.stream");
    let (full_s, incremental_s, both_s) = (
        full.to_str().unwrap(),
        incremental.to_str().unwrap(),
        both.to_str().unwrap(),
    );
    birch_ok(&["send", "-q", "--image", a_image, "-f", full_s, "s1"]);
    birch_ok(&[
        "send",
        "-q",
        "--image",
        a_image,
        "-p",
        "s1",
        "-f",
        incremental_s,
        "s2",
    ]);
    birch_ok(&["send", "-q", "--image", a_image, "-f", both_s, "s1", "s2"]);

    let mut b = Fixture::new("recv-image-b", "512M");
    b.mount();
    fs::create_dir(b.path("backups")).unwrap();
    b.unmount();
    let b_image = b.image.to_str().unwrap();
    for stream in [full_s, incremental_s] {
        birch_ok(&["receive", "--image", b_image, "-f", stream, "backups"]);
    }
    birch_ok(&["receive", "--image", b_image, "-f", both_s, "/"]);
    b.assert_clean();
    assert_eq!(
        image_subvolume_paths(&b.image),
        ["backups/s1", "backups/s2", "s1", "s2"]
    );
    for (snap, uuid) in ["s1", "s2"].iter().zip(&uuids) {
        for path in [format!("backups/{snap}"), snap.to_string()] {
            assert_eq!(
                image_subvolume(&b.image, &path),
                (true, uuid.clone()),
                "{path}"
            );
        }
    }
    a.mount();
    b.mount();
    for snap in ["s1", "s2"] {
        assert_same_tree(&a.path(snap), &b.path(&format!("backups/{snap}")));
        assert_same_tree(&a.path(snap), &b.path(snap));
    }
    b.unmount();
    a.unmount();
    a.assert_clean();
}

/// Full and incremental `btrfs send` streams received into an unmounted
/// image compare equal to the btrfs snapshots (the same trees the mount
/// test receives), are read-only with btrfs's uuids as received uuids,
/// and the image checks clean.
#[test]
fn btrfs_send_full_and_incremental_received_into_an_image() {
    if skip_unless_root() || tools_missing() {
        return;
    }
    let mut fx = Fixture::new("recv-image-btrfs", "512M");
    let lb = LoopBtrfs::new(&fx.scratch);
    let (full, incremental) = lb.full_and_incremental(&fx.scratch);
    for stream in [&full, &incremental] {
        birch_ok(&[
            "receive",
            "--image",
            fx.image_str(),
            "-f",
            stream.to_str().unwrap(),
            "/",
        ]);
    }
    fx.assert_clean();
    assert_eq!(image_subvolume_paths(&fx.image), ["s1", "s2"]);
    for snap in ["s1", "s2"] {
        assert_eq!(image_subvolume(&fx.image, snap), (true, lb.uuid(snap)));
    }
    fx.mount();
    assert_same_tree(&lb.path("s1"), &fx.path("s1"));
    assert_same_tree(&lb.path("s2"), &fx.path("s2"));
    fx.unmount();
    fx.assert_clean();
}

/// Into an image, a stream cut short, one whose END claims bytes past
/// the stream, one with a byte flipped (a crc mismatch) and one setting
/// an xattr outside the namespaces birch stores each fail
/// naming the command and byte offset, and leave no subvolume (hidden or
/// published) in the image, which checks clean; the whole stream then
/// receives.
#[test]
fn truncated_stream_into_an_image_publishes_nothing() {
    if skip_unless_root() || tools_missing() {
        return;
    }
    let mut fx = Fixture::new("recv-image-truncated", "256M");
    let lb = LoopBtrfs::new(&fx.scratch);
    lb.populate();
    lb.snapshot("s1");
    let full = fx.scratch.path("full.stream");
    lb.send(None, "s1", &full);
    let bytes = fs::read(&full).unwrap();
    let (cut, hostile) = cut_and_hostile_streams(&fx, &bytes);
    let flipped = fx.scratch.path("flipped.stream");
    let mut f = bytes.clone();
    f[bytes.len() * 2 / 3] ^= 0x5a;
    fs::write(&flipped, &f).unwrap();
    // A well-formed stream with an xattr name no birch mount stores (the
    // mount answers EOPNOTSUPP): the image refuses it too.
    let foreign_xattr = fx.scratch.path("foreign-xattr.stream");
    {
        use birch::format::send_stream::{Command as StreamCommand, StreamReader, StreamWriter};
        let mut reader = StreamReader::new(&bytes[..]).unwrap();
        let mut writer = StreamWriter::new(fs::File::create(&foreign_xattr).unwrap()).unwrap();
        while let Some((_, mut command)) = reader.next_command().unwrap() {
            if let StreamCommand::SetXattr { name, .. } = &mut command {
                *name = b"foreign.name".to_vec();
            }
            writer.write(&command).unwrap();
        }
    }

    for (stream, expect) in [
        (&cut, "stream ends"),
        (&hostile, "END at byte"),
        (&flipped, "crc32c"),
        (&foreign_xattr, "SET_XATTR at byte"),
    ] {
        let out = birch(&[
            "receive",
            "--image",
            fx.image_str(),
            "-f",
            stream.to_str().unwrap(),
            "/",
        ]);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{}", text(&out.stdout));
        assert!(
            err.contains("send stream:") && err.contains(expect) && err.contains(" at byte "),
            "{}: {err}",
            stream.display()
        );
        assert_eq!(
            image_subvolume_paths(&fx.image),
            Vec::<String>::new(),
            "{} left a subvolume",
            stream.display()
        );
        fx.assert_clean();
    }
    birch_ok(&[
        "receive",
        "--image",
        fx.image_str(),
        "-f",
        full.to_str().unwrap(),
        "/",
    ]);
    fx.assert_clean();
    fx.mount();
    assert_same_tree(&lb.path("s1"), &fx.path("s1"));
    let names: Vec<_> = fs::read_dir(&fx.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["s1"]);
    fx.unmount();
    fx.assert_clean();
}

/// `birch receive --image` of a mounted image is refused, naming where
/// it is mounted; the mount goes on serving, and a DIR that does not
/// exist in an unmounted image is refused by name.
#[test]
fn receive_into_a_mounted_image_is_refused() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("recv-image-mounted", "256M");
    fx.mount();
    fs::write(fx.path("keep"), b"kept").unwrap();
    let out = birch(&["receive", "--image", fx.image_str(), "-f", "/dev/null", "/"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        err.contains(&format!("mounted at {}", fx.mnt.display())),
        "{err}"
    );
    assert_eq!(fs::read(fx.path("keep")).unwrap(), b"kept");
    fx.unmount();
    let out = birch(&[
        "receive",
        "--image",
        fx.image_str(),
        "-f",
        "/dev/null",
        "no/such",
    ]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no/such: no such file or directory"), "{err}");
    fx.assert_clean();
}
