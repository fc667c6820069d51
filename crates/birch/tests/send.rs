//! `Filesystem::send` (docs/SEND.md "Design: send"): streams of
//! read-only snapshots, full and incremental, applied to a second birch
//! filesystem through the library (tests/common/send_apply.rs) and
//! compared with the snapshot sent; the tree comparison's node count;
//! the refusals. `BIRCH_SEED=N` replays a seed of the random test,
//! `BIRCH_LONG=1` runs more seeds.

mod common;

use birch::device::MemoryDevice;
use birch::error::Error;
use birch::format::send_stream::Command;
use birch::format::ROOT_DIR_INO;
use birch::fs::{
    CompressOption, Filesystem, InoSpace, MountOptions, RenameFlags, SendOptions, SendStats,
    SetAttr, XattrSetMode,
};
use common::memory_fs;
use common::send_apply::{decode, describe, Applier};
use rand::Rng;
use std::sync::Arc;

type Fs = Filesystem<Arc<MemoryDevice>>;

fn open(options: MountOptions) -> Fs {
    Filesystem::open(memory_fs(256 << 20, 0x5e), options).unwrap()
}

/// A filesystem with subvolume "vol"; returns it and its root directory.
fn source() -> (Fs, u64, u64) {
    source_with(MountOptions::deterministic())
}

fn source_with(options: MountOptions) -> (Fs, u64, u64) {
    let fs = open(options);
    let id = fs.create_subvolume(ROOT_DIR_INO, b"vol", 0, 0).unwrap();
    (fs, id, InoSpace::join(id, ROOT_DIR_INO))
}

fn snapshot(fs: &Fs, id: u64, name: &str) -> u64 {
    fs.create_snapshot(id, ROOT_DIR_INO, name.as_bytes(), true)
        .unwrap()
}

fn send(fs: &Fs, snap: u64, parent: Option<u64>) -> (Vec<u8>, SendStats) {
    let mut out = Vec::new();
    let options = SendOptions {
        parent,
        ..Default::default()
    };
    let stats = fs.send(snap, &options, &mut out, &mut |_| {}).unwrap();
    assert_eq!(stats.stream_bytes, out.len() as u64);
    (out, stats)
}

fn root_of(id: u64) -> u64 {
    InoSpace::join(id, ROOT_DIR_INO)
}

/// Applies `stream` to `dst` and checks the received subvolume is `snap`
/// of `src`, named `name`.
fn receive_and_compare(src: &Fs, snap: u64, dst: &Fs, stream: &[u8]) -> u64 {
    let mut applier = Applier::new(dst);
    applier.apply_all(stream);
    let received = applier.last.expect("an END");
    let want = describe(src, root_of(snap));
    let got = describe(dst, root_of(received));
    if want != got {
        let mut diff = String::new();
        for (k, v) in &want {
            if got.get(k) != Some(v) {
                diff += &format!("  {k}\n    sent     {v}\n    received {:?}\n", got.get(k));
            }
        }
        for k in got.keys().filter(|k| !want.contains_key(*k)) {
            diff += &format!("  {k} only received: {}\n", got[k]);
        }
        panic!("received tree differs:\n{diff}");
    }
    received
}

fn create(fs: &Fs, dir: u64, name: &str, data: &[u8]) -> u64 {
    let ino = fs
        .create(dir, name.as_bytes(), 0o644, 1000, 100)
        .unwrap()
        .ino;
    if !data.is_empty() {
        fs.write_file(ino, 0, data).unwrap();
    }
    ino
}

fn mkdir(fs: &Fs, dir: u64, name: &str) -> u64 {
    fs.mkdir(dir, name.as_bytes(), 0o755, 1000, 100)
        .unwrap()
        .ino
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

fn count(commands: &[Command], pred: impl Fn(&Command) -> bool) -> usize {
    commands.iter().filter(|c| pred(c)).count()
}

/// Everything the full send carries: data and holes, hard links,
/// symlinks, a fifo, a device, a socket, xattrs, owners and modes.
fn populate(fs: &Fs, root: u64) {
    let d = mkdir(fs, root, "d");
    let sub = mkdir(fs, d, "sub");
    create(fs, root, "small", b"hello");
    create(fs, d, "big", &bytes(300_000, 1));
    let holey = create(fs, sub, "holey", b"");
    fs.write_file(holey, 0, &bytes(5000, 2)).unwrap();
    fs.write_file(holey, 1 << 20, &bytes(7000, 3)).unwrap();
    fs.truncate(holey, 3 << 20).unwrap();
    let linked = create(fs, root, "linked", b"shared inode");
    fs.link(linked, sub, b"second name").unwrap();
    fs.link(linked, root, b"third").unwrap();
    fs.symlink(root, b"sym", b"d/big", 1000, 100).unwrap();
    fs.symlink(sub, b"dangling", b"/nowhere/at/all", 0, 0)
        .unwrap();
    fs.mknod(root, b"fifo", libc::S_IFIFO | 0o640, 1000, 100, 0)
        .unwrap();
    fs.mknod(root, b"dev", libc::S_IFCHR | 0o600, 0, 0, 0x0103)
        .unwrap();
    fs.mknod(d, b"sock", libc::S_IFSOCK | 0o755, 7, 8, 0)
        .unwrap();
    let x = create(fs, root, "xattrs", b"x");
    fs.setxattr(x, b"user.one", b"1", XattrSetMode::Create)
        .unwrap();
    fs.setxattr(x, b"trusted.two", &bytes(300, 4), XattrSetMode::Create)
        .unwrap();
    fs.setxattr(d, b"user.dir", b"on a directory", XattrSetMode::Create)
        .unwrap();
    let setuid = create(fs, root, "setuid", b"#!");
    fs.setattr(
        setuid,
        &SetAttr {
            mode: Some(0o4755),
            ..Default::default()
        },
    )
    .unwrap();
    fs.setattr(
        d,
        &SetAttr {
            mode: Some(0o1777),
            uid: Some(5),
            gid: Some(6),
            ..Default::default()
        },
    )
    .unwrap();
}

#[test]
fn full_send_of_a_tree_with_every_kind_of_inode() {
    let (src, id, root) = source();
    populate(&src, root);
    let s1 = snapshot(&src, id, "s1");
    let (stream, stats) = send(&src, s1, None);
    let commands = decode(&stream);
    assert!(matches!(commands[0], Command::Subvol { .. }));
    assert!(matches!(commands.last(), Some(Command::End)));
    for kind in [
        |c: &Command| matches!(c, Command::Mknod { .. }),
        |c: &Command| matches!(c, Command::Mkfifo { .. }),
        |c: &Command| matches!(c, Command::Mksock { .. }),
        |c: &Command| matches!(c, Command::Symlink { .. }),
        |c: &Command| matches!(c, Command::Link { .. }),
        |c: &Command| matches!(c, Command::SetXattr { .. }),
    ] {
        assert!(count(&commands, kind) > 0);
    }
    // The holes of the sparse file are not written.
    assert!(
        stats.data_bytes < 300_000 + 5000 + 7000 + 200_000,
        "{stats:?}"
    );
    assert_eq!(stats.commands, commands.len() as u64);
    let dst = open(MountOptions::deterministic());
    receive_and_compare(&src, s1, &dst, &stream);
}

#[test]
fn full_send_clones_a_reflinked_file() {
    let (src, id, root) = source();
    let a = create(&src, root, "a", &bytes(256 << 10, 9));
    src.sync().unwrap();
    let b = create(&src, root, "b", b"");
    assert_eq!(
        src.copy_file_range(a, 0, b, 0, 256 << 10).unwrap(),
        256 << 10
    );
    // A part of it, at another offset, too.
    let c = create(&src, root, "c", &bytes(8192, 1));
    assert_eq!(
        src.copy_file_range(a, 64 << 10, c, 8192, 32 << 10).unwrap(),
        32 << 10
    );
    let s1 = snapshot(&src, id, "s1");
    let (stream, stats) = send(&src, s1, None);
    let commands = decode(&stream);
    let clones = count(&commands, |c| matches!(c, Command::Clone { .. }));
    assert_eq!(clones, 2, "{commands:?}");
    assert!(stats.data_bytes < (256 << 10) + 8192 + 4096, "{stats:?}");
    let dst = open(MountOptions::deterministic());
    receive_and_compare(&src, s1, &dst, &stream);
}

#[test]
fn full_send_of_compressed_files_sends_their_data() {
    let options = MountOptions {
        compress: CompressOption::parse("zstd", false).unwrap(),
        ..MountOptions::deterministic()
    };
    let (src, id, root) = source_with(options);
    let text: Vec<u8> = b"compressible text "
        .iter()
        .cycle()
        .take(500_000)
        .copied()
        .collect();
    create(&src, root, "text", &text);
    // A small file: a compressed inline extent (docs/COMPRESSION.md).
    let small = create(&src, root, "small", &text[..3000]);
    src.sync().unwrap();
    assert!(
        src.stats().compressed_bytes_out > 0,
        "the data was compressed"
    );
    assert_eq!(src.stats().compressed_inline_extents, 1);
    let s1 = snapshot(&src, id, "s1");
    let (stream, stats) = send(&src, s1, None);
    assert_eq!(stats.data_bytes, 503_000);
    let dst = open(MountOptions::deterministic());
    receive_and_compare(&src, s1, &dst, &stream);
    // Incremental: the small file rewritten (another compressed inline
    // item) is sent whole.
    src.write_file(small, 100, b"changed").unwrap();
    src.sync().unwrap();
    assert_eq!(src.stats().compressed_inline_extents, 2);
    let s2 = snapshot(&src, id, "s2");
    let (stream, stats) = send(&src, s2, Some(s1));
    assert_eq!(stats.data_bytes, 3000);
    receive_and_compare(&src, s2, &dst, &stream);
}

#[test]
fn send_refuses_a_subvolume_that_is_not_read_only() {
    let (src, id, root) = source();
    create(&src, root, "f", b"data");
    let mut out = Vec::new();
    let err = src
        .send(id, &SendOptions::default(), &mut out, &mut |_| {})
        .unwrap_err();
    assert!(matches!(err, Error::Refused(_)), "{err}");
    assert_eq!(err.errno(), libc::EPERM);
    let s1 = snapshot(&src, id, "s1");
    let err = src
        .send(
            s1,
            &SendOptions {
                parent: Some(id),
                ..Default::default()
            },
            &mut out,
            &mut |_| {},
        )
        .unwrap_err();
    assert!(matches!(err, Error::Refused(_)), "a writable parent: {err}");
    let err = src
        .send(999, &SendOptions::default(), &mut out, &mut |_| {})
        .unwrap_err();
    assert!(matches!(err, Error::NotFound), "{err}");
}

#[test]
fn send_reports_a_failed_write_of_its_output() {
    struct Failing;
    impl std::io::Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let (src, id, root) = source();
    create(&src, root, "f", b"data");
    let s1 = snapshot(&src, id, "s1");
    let err = src
        .send(s1, &SendOptions::default(), &mut Failing, &mut |_| {})
        .unwrap_err();
    assert!(matches!(err, Error::Io(_)), "{err}");
    // The hold is gone with the failed send.
    src.delete_subvolume(ROOT_DIR_INO, b"s1").unwrap();
}

/// A writer that announces its first write and then waits until told to
/// go on: a send blocked half-way.
struct Gate {
    started: std::sync::mpsc::Sender<()>,
    go: std::sync::mpsc::Receiver<()>,
    first: bool,
}

impl std::io::Write for Gate {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.first {
            self.first = false;
            self.started.send(()).unwrap();
            // Told to go on, or the test failed and dropped the sender.
            let _ = self.go.recv();
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_subvolume_cannot_be_deleted_while_a_send_reads_it() {
    let (src, id, root) = source();
    populate(&src, root);
    let s1 = snapshot(&src, id, "s1");
    create(&src, root, "more", b"more");
    let s2 = snapshot(&src, id, "s2");
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        // Dropped by a failing assertion too: the send then goes on.
        let go = go_tx;
        let sending = scope.spawn(|| {
            let mut gate = Gate {
                started: started_tx,
                go: go_rx,
                first: true,
            };
            let options = SendOptions {
                parent: Some(s1),
                ..Default::default()
            };
            src.send(s2, &options, &mut gate, &mut |_| {})
        });
        started.recv().unwrap();
        for (name, snap) in [("s1", s1), ("s2", s2)] {
            let err = src
                .delete_subvolume(ROOT_DIR_INO, name.as_bytes())
                .unwrap_err();
            assert!(matches!(err, Error::Refused(_)), "delete {name}: {err}");
            assert_eq!(err.errno(), libc::EPERM);
            assert!(err.to_string().contains("during send"), "{err}");
            let err = src.set_subvolume_readonly(snap, false).unwrap_err();
            assert!(matches!(err, Error::Refused(_)), "ro=false {name}: {err}");
        }
        go.send(()).unwrap();
        sending.join().unwrap().unwrap();
    });
    src.set_subvolume_readonly(s2, false).unwrap();
    src.delete_subvolume(ROOT_DIR_INO, b"s1").unwrap();
}

/// The tree incremental tests start from.
fn base(fs: &Fs, root: u64) {
    populate(fs, root);
    let a = mkdir(fs, root, "a");
    let b = mkdir(fs, a, "b");
    create(fs, b, "in_b", b"in b");
    let other = mkdir(fs, root, "other");
    create(fs, other, "o1", b"o1");
    create(fs, root, "x", b"content of x");
    create(fs, root, "y", b"content of y");
    create(fs, root, "f", &bytes(10_000, 5));
}

/// Full send of the base (S1), `change`, incremental S1 -> S2, each
/// received and compared; then `change2` and S2 -> S3 likewise when
/// given. Returns the incremental streams' commands.
/// A change made to the source between two snapshots: (fs, vol's root).
type Change<'a> = &'a dyn Fn(&Fs, u64);

fn incremental(change: impl Fn(&Fs, u64), change2: Option<Change>) -> Vec<Vec<Command>> {
    let (src, id, root) = source();
    base(&src, root);
    let s1 = snapshot(&src, id, "s1");
    let dst = open(MountOptions::deterministic());
    let (stream, _) = send(&src, s1, None);
    receive_and_compare(&src, s1, &dst, &stream);
    let mut out = Vec::new();
    let mut parent = s1;
    let changes: Vec<Change> = std::iter::once(&change as Change).chain(change2).collect();
    for (i, change) in changes.into_iter().enumerate() {
        change(&src, root);
        let snap = snapshot(&src, id, &format!("s{}", i + 2));
        let (stream, _) = send(&src, snap, Some(parent));
        let commands = decode(&stream);
        assert!(
            matches!(commands[0], Command::Snapshot { .. }),
            "{:?}",
            commands[0]
        );
        receive_and_compare(&src, snap, &dst, &stream);
        out.push(commands);
        parent = snap;
    }
    out
}

fn renames(commands: &[Command]) -> usize {
    count(commands, |c| matches!(c, Command::Rename { .. }))
}

#[test]
fn incremental_renames_across_directories() {
    let c = incremental(
        |fs, root| {
            let d = lookup(fs, root, "d");
            let other = lookup(fs, root, "other");
            fs.rename(d, b"big", root, b"moved", RenameFlags::default())
                .unwrap();
            fs.rename(d, b"sub", other, b"sub2", RenameFlags::default())
                .unwrap();
        },
        None,
    );
    assert_eq!(renames(&c[0]), 2, "{:?}", c[0]);
    assert_eq!(count(&c[0], |c| matches!(c, Command::Write { .. })), 0);
}

#[test]
fn incremental_directory_renamed_over_a_removed_one() {
    incremental(
        |fs, root| {
            let other = lookup(fs, root, "other");
            fs.unlink(other, b"o1").unwrap();
            fs.rmdir(root, b"other").unwrap();
            fs.rename(root, b"a", root, b"other", RenameFlags::default())
                .unwrap();
        },
        None,
    );
}

#[test]
fn incremental_files_swapped() {
    let c = incremental(
        |fs, root| {
            let flags = RenameFlags {
                exchange: true,
                ..Default::default()
            };
            fs.rename(root, b"x", root, b"y", flags).unwrap();
        },
        None,
    );
    assert_eq!(count(&c[0], |c| matches!(c, Command::Write { .. })), 0);
}

#[test]
fn incremental_directory_moved_under_its_former_child() {
    incremental(
        |fs, root| {
            let a = lookup(fs, root, "a");
            fs.rename(a, b"b", root, b"b", RenameFlags::default())
                .unwrap();
            let b = lookup(fs, root, "b");
            fs.rename(root, b"a", b, b"a", RenameFlags::default())
                .unwrap();
        },
        None,
    );
}

#[test]
fn incremental_hard_links_added_and_removed() {
    incremental(
        |fs, root| {
            fs.unlink(root, b"third").unwrap();
            let x = lookup(fs, root, "x");
            let other = lookup(fs, root, "other");
            fs.link(x, other, b"x again").unwrap();
            // The last name of one, a new name elsewhere.
            let sub = lookup(fs, lookup(fs, root, "d"), "sub");
            fs.unlink(sub, b"second name").unwrap();
            fs.rename(root, b"linked", other, b"linked", RenameFlags::default())
                .unwrap();
        },
        None,
    );
}

#[test]
fn incremental_file_replaced_by_a_directory_and_back() {
    incremental(
        |fs, root| {
            fs.unlink(root, b"f").unwrap();
            let f = mkdir(fs, root, "f");
            create(fs, f, "inside", b"inside the new directory");
        },
        Some(&|fs, root| {
            let f = lookup(fs, root, "f");
            fs.unlink(f, b"inside").unwrap();
            fs.rmdir(root, b"f").unwrap();
            create(fs, root, "f", b"a file again");
        }),
    );
}

#[test]
fn incremental_truncate_extend_and_write_into_a_hole() {
    let c = incremental(
        |fs, root| {
            let f = lookup(fs, root, "f");
            // Down and up again: 3000..8000 must read as zeros.
            fs.truncate(f, 3000).unwrap();
            fs.truncate(f, 8000).unwrap();
            let holey = lookup(fs, lookup(fs, lookup(fs, root, "d"), "sub"), "holey");
            fs.write_file(holey, 2 << 20, b"into the hole").unwrap();
            let big = lookup(fs, lookup(fs, root, "d"), "big");
            fs.truncate(big, 500_000).unwrap();
            fs.write_file(big, 100_000, &bytes(5000, 7)).unwrap();
        },
        None,
    );
    let data: u64 = c[0]
        .iter()
        .map(|c| match c {
            Command::Write { data, .. } => data.len() as u64,
            _ => 0,
        })
        .sum();
    assert!(
        data < 64 << 10,
        "only the changed blocks are written: {data}"
    );
    assert!(count(&c[0], |c| matches!(c, Command::Truncate { .. })) >= 2);
}

#[test]
fn incremental_xattrs_set_and_removed() {
    let c = incremental(
        |fs, root| {
            let x = lookup(fs, root, "xattrs");
            fs.removexattr(x, b"user.one").unwrap();
            fs.setxattr(x, b"user.three", b"3", XattrSetMode::Create)
                .unwrap();
            fs.setxattr(x, b"trusted.two", b"changed", XattrSetMode::Replace)
                .unwrap();
        },
        None,
    );
    assert_eq!(
        count(&c[0], |c| matches!(c, Command::RemoveXattr { .. })),
        1
    );
    assert_eq!(count(&c[0], |c| matches!(c, Command::SetXattr { .. })), 2);
}

#[test]
fn incremental_chmod_and_chown() {
    let c = incremental(
        |fs, root| {
            let x = lookup(fs, root, "x");
            let chmod = SetAttr {
                mode: Some(0o600),
                ..Default::default()
            };
            fs.setattr(x, &chmod).unwrap();
            let chown = SetAttr {
                uid: Some(4242),
                gid: Some(4343),
                ..Default::default()
            };
            fs.setattr(lookup(fs, root, "setuid"), &chown).unwrap();
        },
        None,
    );
    assert_eq!(count(&c[0], |c| matches!(c, Command::Chown { .. })), 1);
    assert_eq!(count(&c[0], |c| matches!(c, Command::Chmod { .. })), 2);
}

fn lookup(fs: &Fs, dir: u64, name: &str) -> u64 {
    fs.lookup(dir, name.as_bytes()).unwrap().ino
}

#[test]
fn incremental_send_reads_nodes_in_proportion_to_the_change() {
    let (src, id, root) = source();
    let mut files = Vec::new();
    for d in 0..40 {
        let dir = mkdir(&src, root, &format!("dir{d:02}"));
        for f in 0..100 {
            files.push(create(
                &src,
                dir,
                &format!("file{f:03}"),
                &bytes(100, f as u8),
            ));
        }
    }
    let s1 = snapshot(&src, id, "s1");
    src.write_file(files[2345], 10, b"changed").unwrap();
    let s2 = snapshot(&src, id, "s2");
    let (_, full) = send(&src, s2, None);
    let (stream, incremental) = send(&src, s2, Some(s1));
    // 4000 files of five items each fill hundreds of leaves; the change
    // is one leaf (and the directory's inode, maybe another), reached by
    // a path of at most three levels in each tree.
    assert!(full.nodes_read >= 200, "full send: {full:?}");
    assert!(
        incremental.nodes_read <= 4 * 3 + 4,
        "incremental send: {incremental:?} (full: {full:?})"
    );
    let commands = decode(&stream);
    assert_eq!(count(&commands, |c| matches!(c, Command::Write { .. })), 1);
    assert_eq!(incremental.inodes, 1, "{commands:?}");
}

fn seeds() -> Vec<u64> {
    match std::env::var("BIRCH_SEED") {
        Ok(s) => vec![s.trim().parse().expect("BIRCH_SEED is a u64")],
        Err(_) if std::env::var("BIRCH_LONG").is_ok() => (0..60).map(|i| 0x5e4d_0000 + i).collect(),
        Err(_) => (0..4).map(|i| 0x5e4d_0000 + i).collect(),
    }
}

/// Every entry below `dir`: (directory, name, inode, is a directory).
fn entries(fs: &Fs, dir: u64, out: &mut Vec<(u64, Vec<u8>, u64, bool)>) {
    for e in fs.readdir(dir, 0, usize::MAX).unwrap() {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let is_dir = e.file_type == birch::format::FileType::Directory;
        out.push((dir, e.name.clone(), e.ino, is_dir));
        if is_dir {
            entries(fs, e.ino, out);
        }
    }
}

/// One random change of any kind below `root`; failures (a name taken,
/// a directory not empty, a move into itself) are part of the game.
fn random_op(fs: &Fs, root: u64, rng: &mut impl rand::Rng) {
    let mut all = Vec::new();
    entries(fs, root, &mut all);
    let dirs: Vec<u64> = std::iter::once(root)
        .chain(all.iter().filter(|e| e.3).map(|e| e.2))
        .collect();
    let files: Vec<u64> = all
        .iter()
        .filter(|e| {
            !e.3 && fs
                .getattr(e.2)
                .is_ok_and(|a| a.file_type == birch::format::FileType::Regular)
        })
        .map(|e| e.2)
        .collect();
    let dir = dirs[rng.gen_range(0..dirs.len())];
    let name = format!("n{}", rng.gen_range(0..12)).into_bytes();
    let any = (!all.is_empty()).then(|| all[rng.gen_range(0..all.len())].clone());
    let file = (!files.is_empty()).then(|| files[rng.gen_range(0..files.len())]);
    let uid = rng.gen_range(0..3) * 1000;
    match rng.gen_range(0..17) {
        0 | 1 => {
            if let Ok(a) = fs.create(dir, &name, 0o644, uid, 100) {
                let len = rng.gen_range(0..200_000);
                let _ = fs.write_file(a.ino, rng.gen_range(0..100_000), &bytes(len, rng.gen()));
            }
        }
        2 => {
            let _ = fs.mkdir(dir, &name, 0o755, uid, 100);
        }
        3 => {
            let target = format!("target-{}", rng.gen::<u16>());
            let _ = fs.symlink(dir, &name, target.as_bytes(), uid, 100);
        }
        4 => {
            let mode =
                [libc::S_IFIFO, libc::S_IFCHR, libc::S_IFBLK, libc::S_IFSOCK][rng.gen_range(0..4)];
            // Only devices have a number (the kernel keeps none for the others).
            let rdev = match mode {
                libc::S_IFCHR | libc::S_IFBLK => rng.gen_range(0..0x10000),
                _ => 0,
            };
            let _ = fs.mknod(dir, &name, mode | 0o640, uid, 100, rdev);
        }
        5 => {
            if let Some(e) = any.filter(|e| !e.3) {
                let _ = fs.link(e.2, dir, &name);
            }
        }
        6 => {
            if let Some(e) = any {
                let _ = if e.3 {
                    fs.rmdir(e.0, &e.1)
                } else {
                    fs.unlink(e.0, &e.1)
                };
            }
        }
        7 | 8 => {
            if let Some(e) = any {
                let exchange = rng.gen_bool(0.3);
                let flags = RenameFlags {
                    exchange,
                    ..Default::default()
                };
                let _ = fs.rename(e.0, &e.1, dir, &name, flags);
            }
        }
        9 | 10 => {
            if let Some(f) = file {
                let len = rng.gen_range(1..70_000);
                let _ = fs.write_file(f, rng.gen_range(0..400_000), &bytes(len, rng.gen()));
            }
        }
        11 => {
            if let Some(f) = file {
                let _ = fs.truncate(f, rng.gen_range(0..400_000));
            }
        }
        12 => {
            if let (Some(a), Some(b)) = (file, files.get(rng.gen_range(0..files.len().max(1)))) {
                let _ = fs.sync();
                let block = 4096;
                let len = rng.gen_range(1..40) * block;
                let _ = fs.copy_file_range(
                    a,
                    rng.gen_range(0..20) * block,
                    *b,
                    rng.gen_range(0..40) * block,
                    len,
                );
            }
        }
        13 => {
            if let Some(e) = any {
                let xname = format!("user.x{}", rng.gen_range(0..3));
                let _ = if rng.gen_bool(0.6) {
                    let value = bytes(rng.gen_range(0..100), rng.gen());
                    fs.setxattr(e.2, xname.as_bytes(), &value, XattrSetMode::CreateOrReplace)
                } else {
                    fs.removexattr(e.2, xname.as_bytes())
                };
            }
        }
        14 => {
            if let Some(e) = any {
                let mode = [0o600, 0o755, 0o4755, 0o1777, 0o2750][rng.gen_range(0..5)];
                // Linux has no chmod of a symlink (send never sends one).
                let symlink = fs
                    .getattr(e.2)
                    .is_ok_and(|a| a.file_type == birch::format::FileType::Symlink);
                if !symlink {
                    let changes = SetAttr {
                        mode: Some(mode),
                        ..Default::default()
                    };
                    let _ = fs.setattr(e.2, &changes);
                }
            }
        }
        15 => {
            if let Some(e) = any {
                let changes = SetAttr {
                    uid: Some(rng.gen_range(0..4)),
                    gid: Some(rng.gen_range(0..4)),
                    ..Default::default()
                };
                let _ = fs.setattr(e.2, &changes);
            }
        }
        _ => {
            if let Some(e) = any {
                let t = birch::format::Timespec {
                    sec: rng.gen_range(0..2_000_000_000),
                    nsec: rng.gen_range(0..1_000_000_000),
                };
                let changes = SetAttr {
                    atime: Some(birch::fs::SetTime::At(t)),
                    mtime: Some(birch::fs::SetTime::At(t)),
                    ..Default::default()
                };
                let _ = fs.setattr(e.2, &changes);
            }
        }
    }
}

/// A random tree, S1; random changes (sometimes across a remount, which
/// reuses the inode numbers of the newest files deleted), S2; random
/// changes, S3: the full send of S1 and the incremental ones S1 -> S2 ->
/// S3, each applied to a second filesystem, compare equal to what was
/// sent.
#[test]
fn random_trees_round_trip_through_full_and_incremental_sends() {
    use rand::SeedableRng;
    for seed in seeds() {
        eprintln!(
            "seed {seed}: replay with BIRCH_SEED={seed} cargo test -p birch --test send random"
        );
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let dev = memory_fs(256 << 20, 0x5f);
        let mut fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
        let id = fs.create_subvolume(ROOT_DIR_INO, b"vol", 0, 0).unwrap();
        let root = root_of(id);
        let dst = open(MountOptions::deterministic());
        let mut parent = None;
        for round in 0..3 {
            let ops = if round == 0 { 120 } else { 60 };
            for _ in 0..ops {
                random_op(&fs, root, &mut rng);
            }
            if rng.gen_bool(0.5) {
                fs.close().unwrap();
                fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
            }
            let snap = snapshot(&fs, id, &format!("s{round}"));
            let (stream, _) = send(&fs, snap, parent);
            receive_and_compare(&fs, snap, &dst, &stream);
            parent = Some(snap);
        }
    }
}

/// The newest inode deleted, a remount (which numbers new inodes from the
/// highest one left + 1), and a directory and a file created: they get
/// the deleted inodes' numbers with new generations. The stream must
/// delete the old inodes and create new ones.
#[test]
fn incremental_inode_numbers_reused_with_new_generations() {
    let dev = memory_fs(256 << 20, 0x60);
    let mut src = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let id = src.create_subvolume(ROOT_DIR_INO, b"vol", 0, 0).unwrap();
    let root = root_of(id);
    let keep = mkdir(&src, root, "keep");
    let old_dir = mkdir(&src, root, "old_dir");
    create(&src, old_dir, "child", b"child of the old directory");
    let old_file = create(&src, keep, "old_file", b"old file");
    let s1 = snapshot(&src, id, "s1");
    let dst = open(MountOptions::deterministic());
    receive_and_compare(&src, s1, &dst, &send(&src, s1, None).0);
    src.unlink(keep, b"old_file").unwrap();
    src.unlink(old_dir, b"child").unwrap();
    src.rmdir(root, b"old_dir").unwrap();
    src.close().unwrap();
    src = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    // The three numbers come back, each with another type: a file where
    // a directory was (under the same name), a directory where a file was.
    let new_file = create(&src, root, "old_dir", b"a file where a directory was");
    let new_dir = mkdir(&src, root, "old_file");
    let under = create(&src, new_dir, "under", b"a file with a reused number");
    assert_eq!(
        [new_file, new_dir, under],
        [old_dir, old_dir + 1, old_file],
        "the remount reuses the inode numbers"
    );
    let s2 = snapshot(&src, id, "s2");
    receive_and_compare(&src, s2, &dst, &send(&src, s2, Some(s1)).0);
}
