//! Linux operations tools expect (issue 11), in the engine: O_TMPFILE and
//! linking it, fallocate's zero/collapse/insert ranges, copy_file_range as
//! a reflink, inode flags. Each change fsync persists has a crash case
//! here, named as in docs/TREE-LOG.md's contract table: crash states are
//! enumerated from the moment the fsync returned (and, where the steps
//! start from a commit, from that commit: nothing committed may be lost).

mod common;

use birch::device::RecordingDevice;
use birch::format::FileType;
use birch::fs::{
    inode_flags, FallocateMode, Filesystem, RenameFlags, SetAttr, WhiteoutOwner, XattrSetMode,
};
use birch::Error;
use common::{assert_clean, ino, mount, Enumeration, View};
use std::sync::Arc;

const IMAGE_BYTES: u64 = 32 << 20;
const PAGE: usize = 4096;

fn recorder() -> Arc<RecordingDevice> {
    common::recorder(IMAGE_BYTES, 11)
}

fn for_every_crash_after(
    rec: &RecordingDevice,
    from: usize,
    property: impl Fn(&View) -> Result<(), String>,
) -> usize {
    common::for_every_crash_after(rec, from, &Enumeration::sampled(from as u64), property)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i / PAGE) as u8 ^ (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn tmpfile_linked_then_fsync() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    let t = fs.tmpfile(d, 0o600, 0, 0, 0).unwrap();
    assert_eq!(t.nlink, 0);
    let data = pattern(3 * PAGE + 77, 1);
    fs.write_file(t.ino, 0, &data).unwrap();
    // The orphan item is committed: a crash from here on must find the
    // nameless file gone, and after the link and fsync below, named.
    fs.sync().unwrap();
    let committed = rec.flush_count();
    fs.link(t.ino, d, b"f").unwrap();
    fs.fsync(t.ino, false).unwrap();
    let synced = rec.flush_count();
    fs.release(t.ino).unwrap();
    std::mem::forget(fs);
    for_every_crash_after(&rec, committed, |v| match v.get("/d/f") {
        None => Ok(()),
        Some(_) => common::require_content(v, "/d/f", &data),
    });
    for_every_crash_after(&rec, synced, |v| common::require_content(v, "/d/f", &data));
}

#[test]
fn tmpfile_without_name_is_gone_after_crash() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let t = fs.tmpfile(fs.root_ino(), 0o600, 0, 0, 0).unwrap();
    fs.write_file(t.ino, 0, &pattern(5 * PAGE, 2)).unwrap();
    fs.sync().unwrap();
    let committed = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, committed, &Enumeration::sampled(7), |_, fs, v| {
        if !v.is_empty() {
            return Err(format!("unexpected names {v:?}"));
        }
        match fs.getattr(t.ino) {
            Err(Error::NotFound) => Ok(()),
            other => Err(format!("tmpfile inode still there: {other:?}")),
        }
    });
}

/// A committed file of five pages, then `op`, then fsync: every crash
/// state after the fsync shows `want`.
fn fallocate_case(op: impl Fn(&Filesystem<Arc<RecordingDevice>>, u64), want: &[u8]) {
    let rec = recorder();
    let fs = mount(rec.clone());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &pattern(5 * PAGE, 3)).unwrap();
    fs.sync().unwrap();
    let committed = rec.flush_count();
    op(&fs, f);
    assert_eq!(
        fs.read_file(f, 0, 1 << 20).unwrap(),
        want,
        "before the crash"
    );
    fs.fsync(f, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    let old = pattern(5 * PAGE, 3);
    for_every_crash_after(&rec, committed, |v| {
        common::require_content(v, "/f", &old).or_else(|_| common::require_content(v, "/f", want))
    });
    for_every_crash_after(&rec, synced, |v| common::require_content(v, "/f", want));
}

#[test]
fn zero_range_then_fsync() {
    let mut want = pattern(5 * PAGE, 3);
    want[100..2 * PAGE + 9].fill(0);
    want.resize(6 * PAGE, 0);
    fallocate_case(
        |fs, f| {
            fs.fallocate(f, 100, 2 * PAGE as u64 - 91, FallocateMode::ZeroRange)
                .unwrap();
            // Beyond EOF, without KEEP_SIZE: the file grows.
            fs.fallocate(f, 5 * PAGE as u64, PAGE as u64, FallocateMode::ZeroRange)
                .unwrap();
        },
        &want,
    );
}

#[test]
fn punch_hole_then_fsync() {
    let mut want = pattern(5 * PAGE, 3);
    want[PAGE - 10..3 * PAGE + 10].fill(0);
    fallocate_case(
        |fs, f| {
            fs.fallocate(
                f,
                PAGE as u64 - 10,
                2 * PAGE as u64 + 20,
                FallocateMode::PunchHole,
            )
            .unwrap()
        },
        &want,
    );
}

#[test]
fn collapse_range_then_fsync() {
    let old = pattern(5 * PAGE, 3);
    let want = [&old[..PAGE], &old[3 * PAGE..]].concat();
    fallocate_case(
        |fs, f| {
            // A dirty page after the range must move with it.
            fs.write_file(f, 4 * PAGE as u64, &old[4 * PAGE..4 * PAGE + 10])
                .unwrap();
            fs.fallocate(
                f,
                PAGE as u64,
                2 * PAGE as u64,
                FallocateMode::CollapseRange,
            )
            .unwrap()
        },
        &want,
    );
}

#[test]
fn insert_range_then_fsync() {
    let old = pattern(5 * PAGE, 3);
    let want = [&old[..2 * PAGE], &[0u8; PAGE][..], &old[2 * PAGE..]].concat();
    fallocate_case(
        |fs, f| {
            fs.fallocate(f, 2 * PAGE as u64, PAGE as u64, FallocateMode::InsertRange)
                .unwrap()
        },
        &want,
    );
}

#[test]
fn collapse_and_insert_refuse_what_ext4_refuses() {
    let fs = mount(common::memory_fs(IMAGE_BYTES, 12));
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &pattern(4 * PAGE, 4)).unwrap();
    let p = PAGE as u64;
    for (offset, len, mode) in [
        (1, p, FallocateMode::CollapseRange),
        (p, 100, FallocateMode::CollapseRange),
        (2 * p, 2 * p, FallocateMode::CollapseRange), // reaches EOF
        (p, 1, FallocateMode::InsertRange),
        (4 * p, p, FallocateMode::InsertRange), // at EOF
    ] {
        assert!(
            matches!(
                fs.fallocate(f, offset, len, mode),
                Err(Error::InvalidArgument(_))
            ),
            "{mode:?} {offset}+{len}"
        );
    }
    assert_eq!(fs.read_file(f, 0, 1 << 20).unwrap(), pattern(4 * PAGE, 4));
}

#[test]
fn copy_file_range_then_fsync() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let a = fs.create(fs.root_ino(), b"a", 0o644, 0, 0).unwrap().ino;
    let data = pattern(8 * PAGE + 300, 5);
    fs.write_file(a, 0, &data).unwrap();
    fs.sync().unwrap();
    // A second source not yet committed: its extents are new in this
    // transaction when b shares them.
    let c = fs.create(fs.root_ino(), b"c", 0o644, 0, 0).unwrap().ino;
    let cdata = pattern(3 * PAGE, 6);
    fs.write_file(c, 0, &cdata).unwrap();
    let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
    assert_eq!(
        fs.copy_file_range(a, 0, b, 0, 1 << 30).unwrap(),
        data.len() as u64
    );
    assert_eq!(
        fs.copy_file_range(c, 0, b, data.len() as u64 + 10, cdata.len() as u64)
            .unwrap(),
        cdata.len() as u64
    );
    let mut want = data.clone();
    want.resize(data.len() + 10, 0);
    want.extend_from_slice(&cdata);
    assert_eq!(fs.read_file(b, 0, 1 << 20).unwrap(), want);
    fs.fsync(b, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(
        &rec,
        synced,
        &Enumeration::sampled(synced as u64),
        |_, fs, v| {
            common::require_content(v, "/b", &want)?;
            common::require_content(v, "/a", &data)?;
            // Copy on write: b's new data leaves a as it was.
            let b = fs
                .lookup(fs.root_ino(), b"b")
                .map_err(|e| e.to_string())?
                .ino;
            fs.write_file(b, 10, &[0xee; 2 * PAGE])
                .map_err(|e| e.to_string())?;
            fs.sync().map_err(|e| e.to_string())?;
            let a = fs
                .lookup(fs.root_ino(), b"a")
                .map_err(|e| e.to_string())?
                .ino;
            if fs.read_file(a, 0, 1 << 20).map_err(|e| e.to_string())? != data {
                return Err("writing b changed a".into());
            }
            Ok(())
        },
    );
}

#[test]
fn copy_file_range_shares_extents_and_copies_edges() {
    let dev = common::memory_fs(IMAGE_BYTES, 13);
    let fs = mount(dev.clone());
    let a = fs.create(fs.root_ino(), b"a", 0o644, 0, 0).unwrap().ino;
    let data = pattern(64 * PAGE, 7);
    fs.write_file(a, 0, &data).unwrap();
    fs.sync().unwrap();
    let used = fs.statfs().unwrap().blocks_free;
    let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
    // Same place within a page: shared; the ragged ends are copied.
    assert_eq!(
        fs.copy_file_range(a, 100, b, 100, 60 * PAGE as u64)
            .unwrap(),
        60 * PAGE as u64
    );
    fs.sync().unwrap();
    let shared_cost = used - fs.statfs().unwrap().blocks_free;
    assert!(
        shared_cost < 16,
        "a 60-page reflink took {shared_cost} blocks: not shared"
    );
    let mut want = vec![0u8; 100];
    want.extend_from_slice(&data[100..100 + 60 * PAGE]);
    assert_eq!(fs.read_file(b, 0, 1 << 20).unwrap(), want);
    // Different places within a page: bytes are copied.
    let c = fs.create(fs.root_ino(), b"c", 0o644, 0, 0).unwrap().ino;
    assert_eq!(
        fs.copy_file_range(a, 5, c, 0, 3 * PAGE as u64).unwrap(),
        3 * PAGE as u64
    );
    assert_eq!(fs.read_file(c, 0, 1 << 20).unwrap(), &data[5..5 + 3 * PAGE]);
    // Overlapping ranges of one file are refused, as the kernel does.
    assert!(matches!(
        fs.copy_file_range(a, 0, a, PAGE as u64, 2 * PAGE as u64),
        Err(Error::InvalidArgument(_))
    ));
    // Removing the source keeps b's data, and the checker accepts both
    // the shared and the orphaned-by-source extents.
    fs.sync().unwrap();
    assert_clean(dev.as_ref(), "shared extents");
    fs.unlink(fs.root_ino(), b"a").unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.read_file(b, 0, 1 << 20).unwrap(), want);
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "source removed");
}

#[test]
fn inode_flags_then_fsync() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    fs.set_flags(f, inode_flags::IMMUTABLE).unwrap();
    fs.fsync(f, false).unwrap();
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(
        &rec,
        synced,
        &Enumeration::sampled(synced as u64),
        |_, fs, _| {
            let f = fs
                .lookup(fs.root_ino(), b"f")
                .map_err(|e| e.to_string())?
                .ino;
            match fs.get_flags(f) {
                Ok(inode_flags::IMMUTABLE) => Ok(()),
                other => Err(format!("flags {other:?}")),
            }
        },
    );
}

/// chattr `S`, `A`, `d`, `D`, `c` and `m` are stored and read back (lsattr),
/// alone and together with `i` / `a`; `c` with `m` (EINVAL, as btrfs's
/// `check_fsflags`) and a flag birch does not honour are refused.
#[test]
fn sync_noatime_nodump_dirsync_are_stored() {
    let fs = mount(common::memory_fs(IMAGE_BYTES, 16));
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    for flags in [
        inode_flags::SYNC,
        inode_flags::NOATIME,
        inode_flags::NODUMP,
        inode_flags::DIRSYNC,
        inode_flags::SUPPORTED & !inode_flags::NOCOMP,
        inode_flags::SUPPORTED & !inode_flags::COMPR,
        0,
    ] {
        fs.set_flags(d, flags).unwrap();
        assert_eq!(fs.get_flags(d).unwrap(), flags);
    }
    // `c` (compress) and `m` (never compress) together: EINVAL, nothing
    // changed; `chattr -m +c` (one call without `m`) turns `m` into `c`.
    fs.set_flags(d, inode_flags::NOCOMP).unwrap();
    assert!(matches!(
        fs.set_flags(d, inode_flags::COMPR | inode_flags::NOCOMP),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(fs.get_flags(d).unwrap(), inode_flags::NOCOMP);
    fs.set_flags(d, inode_flags::COMPR).unwrap();
    assert_eq!(fs.get_flags(d).unwrap(), inode_flags::COMPR);
    fs.set_flags(d, 0).unwrap();
    assert!(matches!(
        fs.set_flags(d, inode_flags::NODUMP | 0x0080_0000), // FS_NOCOW_FL
        Err(Error::NotSupported(_))
    ));
    assert_eq!(fs.get_flags(d).unwrap(), 0);
}

/// chattr `A`: reads and listings leave the atime alone even where the
/// mount's policy (strictatime here) updates it at every access; without
/// the flag the same accesses update it.
#[test]
fn noatime_flag_keeps_atime() {
    let options = birch::fs::MountOptions {
        atime: birch::fs::AtimeUpdates::Always,
        ..Default::default()
    };
    let fs = Filesystem::open(common::memory_fs(IMAGE_BYTES, 17), options).unwrap();
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, b"data").unwrap();
    let past = birch::format::Timespec { sec: 1, nsec: 0 };
    for ino in [d, f] {
        fs.setattr(
            ino,
            &SetAttr {
                atime: Some(birch::fs::SetTime::At(past)),
                ..Default::default()
            },
        )
        .unwrap();
        fs.set_flags(ino, inode_flags::NOATIME).unwrap();
    }
    fs.read_file(f, 0, 4).unwrap();
    fs.dir_accessed(d).unwrap();
    assert_eq!(fs.getattr(f).unwrap().atime, past);
    assert_eq!(fs.getattr(d).unwrap().atime, past);
    for ino in [d, f] {
        fs.set_flags(ino, 0).unwrap();
    }
    fs.read_file(f, 0, 4).unwrap();
    fs.dir_accessed(d).unwrap();
    assert_ne!(fs.getattr(f).unwrap().atime, past);
    assert_ne!(fs.getattr(d).unwrap().atime, past);
}

/// `create f; sync; chattr +S f; write f; <cut>`: the data is there in
/// every crash state after write returned, with no fsync.
#[test]
fn sync_flag_write_survives_power_cut() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    fs.set_flags(f, inode_flags::SYNC).unwrap();
    let data = pattern(2 * PAGE + 5, 3);
    fs.write_file(f, 0, &data).unwrap();
    let written = rec.flush_count();
    std::mem::forget(fs);
    for_every_crash_after(&rec, written, |v| common::require_content(v, "/f", &data));
}

/// `create f; sync; chattr +S f; chmod 600 f; setfattr -n user.a f; <cut>`:
/// both metadata changes are there with no fsync.
#[test]
fn sync_flag_metadata_change_survives_power_cut() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    fs.set_flags(f, inode_flags::SYNC).unwrap();
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    fs.setattr(f, &chmod).unwrap();
    fs.setxattr(f, b"user.a", b"1", XattrSetMode::CreateOrReplace)
        .unwrap();
    let changed = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(
        &rec,
        changed,
        &Enumeration::sampled(changed as u64),
        |_, fs, _| {
            let f = fs.lookup(fs.root_ino(), b"f").map_err(|e| e.to_string())?;
            let xattr = fs.getxattr(f.ino, b"user.a").map_err(|e| e.to_string())?;
            match (f.perm & 0o7777, xattr.as_slice(), fs.get_flags(f.ino)) {
                (0o600, b"1", Ok(inode_flags::SYNC)) => Ok(()),
                other => Err(format!("mode, xattr, flags: {other:?}")),
            }
        },
    );
}

/// `mkdir d; sync; chattr +D d; touch d/a; mkdir d/s; <cut>`: both are there
/// in every crash state after the calls returned, with no fsync.
#[test]
fn dirsync_create_survives_power_cut() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    fs.set_flags(d, inode_flags::DIRSYNC).unwrap();
    fs.create(d, b"a", 0o644, 0, 0).unwrap();
    fs.mkdir(d, b"s", 0o755, 0, 0).unwrap();
    let created = rec.flush_count();
    std::mem::forget(fs);
    for_every_crash_after(&rec, created, |v| {
        match (v.get("/d/a").is_some(), v.get("/d/s").is_some()) {
            (true, true) => Ok(()),
            other => Err(format!("d/a, d/s exist: {other:?}")),
        }
    });
}

/// `mkdir d e; touch d/x d/y; sync; chattr +D e; chattr +S d; mv d/x e/x;
/// rm d/y; <cut>`: `e/x` and no `d/x`, no `d/y` in every crash state after
/// the calls returned (`S` on a directory counts as `D`, as IS_DIRSYNC).
#[test]
fn dirsync_rename_and_unlink_survive_power_cut() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let e = fs.mkdir(root, b"e", 0o755, 0, 0).unwrap().ino;
    fs.create(d, b"x", 0o644, 0, 0).unwrap();
    fs.create(d, b"y", 0o644, 0, 0).unwrap();
    fs.sync().unwrap();
    fs.set_flags(e, inode_flags::DIRSYNC).unwrap();
    fs.set_flags(d, inode_flags::SYNC).unwrap();
    fs.rename(d, b"x", e, b"x", Default::default()).unwrap();
    fs.unlink(d, b"y").unwrap();
    let changed = rec.flush_count();
    std::mem::forget(fs);
    for_every_crash_after(&rec, changed, |v| {
        let seen = (
            v.get("/e/x").is_some(),
            v.get("/d/x").is_some(),
            v.get("/d/y").is_some(),
        );
        match seen {
            (true, false, false) => Ok(()),
            other => Err(format!("e/x, d/x, d/y exist: {other:?}")),
        }
    });
}

#[test]
fn immutable_and_append_only_are_enforced() {
    let fs = mount(common::memory_fs(IMAGE_BYTES, 14));
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, b"hello").unwrap();
    fs.setxattr(f, b"user.x", b"1", XattrSetMode::CreateOrReplace)
        .unwrap();
    assert!(matches!(
        fs.set_flags(f, 0x0080_0000), // FS_NOCOW_FL: not honoured, refused
        Err(Error::NotSupported(_))
    ));
    let perm = |r: birch::Result<_>| assert!(matches!(r, Err(Error::NotPermitted)), "{r:?}");

    fs.set_flags(f, inode_flags::APPEND).unwrap();
    assert_eq!(fs.write_file(f, 5, b" world").unwrap(), 6);
    perm(fs.write_file(f, 0, b"J").map(|_| ()));
    perm(fs.truncate(f, 0).map(|_| ()));
    perm(fs.unlink(d, b"f"));
    perm(fs.rename(d, b"f", root, b"g", Default::default()));
    perm(fs.link(f, root, b"g").map(|_| ()));
    perm(fs.setxattr(f, b"user.x", b"2", XattrSetMode::CreateOrReplace));
    perm(fs.removexattr(f, b"user.x"));
    perm(fs.fallocate(f, 0, 4096, FallocateMode::PunchHole));
    perm(
        fs.setattr(
            f,
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .map(|_| ()),
    );

    fs.set_flags(f, inode_flags::IMMUTABLE).unwrap();
    perm(fs.write_file(f, 11, b"!").map(|_| ()));
    perm(fs.fallocate(f, 0, 8192, FallocateMode::AllocateKeepSize));
    perm(
        fs.setattr(
            f,
            &SetAttr {
                atime: Some(birch::fs::SetTime::Now),
                ..Default::default()
            },
        )
        .map(|_| ()),
    );
    let g = fs.create(root, b"g", 0o644, 0, 0).unwrap().ino;
    perm(fs.copy_file_range(g, 0, f, 0, 1).map(|_| ()));

    // An immutable directory: no entry comes or goes.
    fs.set_flags(f, 0).unwrap();
    fs.set_flags(d, inode_flags::IMMUTABLE).unwrap();
    perm(fs.create(d, b"new", 0o644, 0, 0).map(|_| ()));
    perm(fs.unlink(d, b"f"));
    perm(fs.rename(root, b"g", d, b"g", Default::default()));
    // An append-only directory: entries come, none go.
    fs.set_flags(d, inode_flags::APPEND).unwrap();
    fs.create(d, b"new", 0o644, 0, 0).unwrap();
    perm(fs.unlink(d, b"new"));
    fs.set_flags(d, 0).unwrap();
    fs.unlink(d, b"new").unwrap();
    assert_eq!(fs.read_file(f, 0, 100).unwrap(), b"hello world");
    assert_eq!(ino(&fs, "d/f"), f);
}

/// generic/079 in the engine: `deny_open` refuses what the VFS's may_open
/// refuses for immutable and append-only inodes, and nothing else.
#[test]
fn opens_of_immutable_and_append_only_files() {
    let fs = mount(common::memory_fs(IMAGE_BYTES, 15));
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    let (rd, wr, rdwr) = (libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR);
    let (append, trunc) = (libc::O_APPEND, libc::O_TRUNC);
    let every = [
        rd,
        wr,
        rdwr,
        wr | append,
        rdwr | append,
        rd | trunc,
        wr | trunc,
        wr | append | trunc,
    ];
    let allowed = |flags: i32| match fs.deny_open(f, flags) {
        Ok(()) => true,
        Err(Error::NotPermitted) => false,
        Err(e) => panic!("open {flags:#o}: {e:?}"),
    };
    for flags in every {
        assert!(allowed(flags), "no flags, open {flags:#o} refused");
    }
    fs.set_flags(f, inode_flags::IMMUTABLE).unwrap();
    for flags in every {
        assert_eq!(allowed(flags), flags == rd, "immutable, open {flags:#o}");
    }
    fs.set_flags(f, inode_flags::APPEND).unwrap();
    for flags in every {
        let expected = flags == rd || flags == wr | append || flags == rdwr | append;
        assert_eq!(allowed(flags), expected, "append-only, open {flags:#o}");
    }
}

/// fstests generic/525: a byte written at 2^63 - 2, the next-to-last
/// offset a file may have, lives in a block that ends at 2^63, one past
/// the largest file size. Its extent must read back after a commit and
/// after a log replay (a decode that bounded extents by the largest file
/// size refused it as corruption: EIO).
#[test]
fn last_block_of_the_largest_file_reads_back() {
    let offset = (1u64 << 63) - 2;
    for durable_by_commit in [true, false] {
        let rec = recorder();
        let fs = mount(rec.clone());
        let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
        fs.write_file(f, offset, b"a").unwrap();
        if durable_by_commit {
            fs.sync().unwrap();
        } else {
            fs.fsync(f, false).unwrap();
        }
        std::mem::forget(fs);
        assert_clean(&*rec, &format!("commit: {durable_by_commit}"));
        let dev = birch::MemoryDevice::from_bytes(rec.snapshot());
        let fs = mount(dev);
        let f = fs.lookup(fs.root_ino(), b"f").unwrap();
        assert_eq!(f.size, offset + 1, "commit: {durable_by_commit}");
        assert_eq!(
            fs.read_file(f.ino, offset, 2).unwrap(),
            b"a",
            "commit: {durable_by_commit}"
        );
    }
}

/// Every request that takes the state lock is counted once in the hold
/// histogram (a call made inside another, `create` → `mknod`, is part of
/// it; a failed request counts too), and reading the statistics is not a
/// request. Counts only: the times themselves depend on the machine.
#[test]
fn state_hold_histogram_counts_requests() {
    let fs = mount(common::memory_fs(IMAGE_BYTES, 12));
    let before = fs.stats();
    assert_eq!(
        before.state_hold_histogram.iter().sum::<u64>(),
        before.state_hold_requests
    );
    let root = fs.root_ino();
    fs.getattr(root).unwrap();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, b"hello").unwrap();
    assert_eq!(fs.read_file(f, 0, 5).unwrap(), b"hello");
    assert!(fs.lookup(root, b"missing").is_err());
    let _ = (fs.log_stats(), fs.space_stats(), fs.memory_stats());
    let after = fs.stats();
    assert_eq!(after.state_hold_requests - before.state_hold_requests, 5);
    assert_eq!(
        after.state_hold_histogram.iter().sum::<u64>(),
        after.state_hold_requests
    );
    assert!(after.state_hold_nanos >= before.state_hold_nanos);
}

/// A device that, once armed, stops the first read of `len` bytes until
/// released: a file read paused between its plan (made under the state
/// lock) and its device read.
/// Armed for a write (`armed_write_len`), it stops the first write of
/// that length instead: a data writeback paused between its plan and its
/// publish.
struct PausingDevice {
    inner: Arc<birch::device::MemoryDevice>,
    armed_len: std::sync::Mutex<Option<usize>>,
    armed_write_len: std::sync::Mutex<Option<usize>>,
    paused: std::sync::mpsc::SyncSender<()>,
    resume: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl PausingDevice {
    /// A fresh image (fsid byte `fsid`) behind a device that pauses nothing
    /// until armed; with the channel its pauses are announced on and the
    /// one that resumes them.
    fn new(
        fsid: u8,
    ) -> (
        Arc<Self>,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (paused_tx, paused_rx) = std::sync::mpsc::sync_channel(1);
        let (resume_tx, resume_rx) = std::sync::mpsc::channel();
        let dev = Arc::new(PausingDevice {
            inner: common::memory_fs(IMAGE_BYTES, fsid),
            armed_len: std::sync::Mutex::new(None),
            armed_write_len: std::sync::Mutex::new(None),
            paused: paused_tx,
            resume: std::sync::Mutex::new(resume_rx),
        });
        (dev, paused_rx, resume_tx)
    }

    fn pause_if_armed(&self, armed: &std::sync::Mutex<Option<usize>>, len: usize) {
        let pause = {
            let mut armed = armed.lock().unwrap();
            let hit = *armed == Some(len);
            if hit {
                *armed = None;
            }
            hit
        };
        if pause {
            self.paused.send(()).unwrap();
            self.resume.lock().unwrap().recv().unwrap();
        }
    }
}

impl birch::device::BlockDevice for PausingDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.pause_if_armed(&self.armed_len, buf.len());
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.pause_if_armed(&self.armed_write_len, buf.len());
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// docs/SNAPSHOTS.md (f): a read plans its extents under the state lock and
/// reads them after dropping it. Meanwhile the file is truncated, the
/// extent freed, committed past its backup-root hold, and the whole free
/// space rewritten with other data: the read still returns the bytes the
/// file held when it was planned, because the reader epoch keeps the
/// extent out of the free map until the read is done.
#[test]
fn read_racing_free_and_reuse_returns_the_old_data() {
    const READ: usize = 48 * PAGE;
    let (dev, paused_rx, resume_tx) = PausingDevice::new(12);
    let fs = mount(dev.clone());
    let a = fs.create(fs.root_ino(), b"a", 0o644, 0, 0).unwrap().ino;
    let old = pattern(READ, 1);
    fs.write_file(a, 0, &old).unwrap();
    fs.sync().unwrap();
    *dev.armed_len.lock().unwrap() = Some(READ);
    let fs = &fs;
    std::thread::scope(|scope| {
        let reader = scope.spawn(move || fs.read_file(a, 0, READ));
        // Not a synchronisation: a guard against hanging should the read
        // not reach the device as the one read of its one extent.
        paused_rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("the file read never reached the device");
        fs.truncate(a, 0).unwrap();
        for _ in 0..3 {
            fs.sync().unwrap();
        }
        let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
        let filler = pattern(1 << 20, 2);
        let mut at = 0u64;
        loop {
            match fs.write_file(b, at, &filler) {
                Ok(n) if n == filler.len() => at += n as u64,
                Ok(_) | Err(Error::NoSpace) => break,
                Err(e) => panic!("filling the free space: {e}"),
            }
        }
        fs.sync().unwrap();
        resume_tx.send(()).unwrap();
        let read = reader.join().unwrap().expect("the paused read");
        assert!(
            read == old,
            "the paused read returned other bytes than the file held"
        );
    });
}

/// Pages of the file whose fsync's data write is paused in the
/// `writeback_paused_*` tests (a length no other write of theirs has).
const PAUSED_PAGES: usize = 13;

/// The `writeback_paused_*` tests (docs/DELALLOC.md, "Writeback without
/// the state lock"): `a` holds `PAUSED_PAGES` dirty pages of `pattern(_, 1)`
/// and `b` 3 dirty pages of `pattern(_, 7)`; an fsync of `a` runs until its
/// data write reaches the device, where it stops. `during` runs then, with
/// the state lock free (a request it makes that waited for the paused
/// write would hang: each is run on its own thread, and a guard that is
/// not a synchronisation fails the test after two minutes instead). The
/// write is released, the fsync of `a` must succeed, and `a` is synced
/// again; `after` gets the image a power cut right then leaves, mounted
/// and checked.
fn writeback_paused(
    during: impl FnOnce(&Filesystem<Arc<PausingDevice>>, u64, u64, &Arc<PausingDevice>, &Release),
    after: impl FnOnce(&Filesystem<Arc<birch::device::MemoryDevice>>),
) {
    let (dev, paused_rx, resume_tx) = PausingDevice::new(13);
    let fs = mount(dev.clone());
    let a = fs.create(fs.root_ino(), b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    fs.write_file(a, 0, &pattern(PAUSED_PAGES * PAGE, 1))
        .unwrap();
    fs.write_file(b, 0, &pattern(3 * PAGE, 7)).unwrap();
    *dev.armed_write_len.lock().unwrap() = Some(PAUSED_PAGES * PAGE);
    let fs = &fs;
    std::thread::scope(|scope| {
        let fsync = scope.spawn(move || fs.fsync(a, false));
        paused_rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("the fsync's data write never reached the device");
        let release = Release(resume_tx);
        during(fs, a, b, &dev, &release);
        release.release();
        fsync
            .join()
            .unwrap()
            .expect("the fsync whose write was paused");
    });
    fs.fsync(a, false).unwrap();
    let crashed = Arc::new(birch::device::MemoryDevice::from_bytes(
        dev.inner.snapshot(),
    ));
    assert_clean(crashed.as_ref(), "power cut after the writeback");
    let remounted = mount(crashed);
    after(&remounted);
}

/// Lets the paused data write go on.
struct Release(std::sync::mpsc::Sender<()>);

impl Release {
    fn release(&self) {
        // A second release (after a request that waited) finds nobody.
        let _ = self.0.send(());
    }
}

/// Runs `request` on a thread of its own and returns its result, failing
/// the test if it does not finish while the writeback is paused (the
/// write is released first, so that the request and the test end).
fn without_waiting<T: Send>(what: &str, paused: &Release, request: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        scope.spawn(move || done_tx.send(request()).unwrap());
        match done_rx.recv_timeout(std::time::Duration::from_secs(120)) {
            Ok(done) => done,
            Err(_) => {
                paused.release();
                let _ = done_rx.recv();
                panic!("{what} waited for the paused data write");
            }
        }
    })
}

#[test]
fn writeback_paused_read_sees_the_pages_being_written() {
    writeback_paused(
        |fs, a, _, _, paused| {
            let read =
                without_waiting("a read", paused, || fs.read_file(a, 0, PAUSED_PAGES * PAGE));
            assert!(
                read.unwrap() == pattern(PAUSED_PAGES * PAGE, 1),
                "a read during the writeback returned other bytes than were written"
            );
        },
        |fs| {
            let a = ino(fs, "a");
            assert!(fs.read_file(a, 0, 1 << 20).unwrap() == pattern(PAUSED_PAGES * PAGE, 1));
        },
    );
}

#[test]
fn writeback_paused_overwrite_stays_dirty_and_wins() {
    let mut expected = pattern(PAUSED_PAGES * PAGE, 1);
    let new = pattern(PAGE + 100, 9);
    expected[3 * PAGE + 50..4 * PAGE + 150].copy_from_slice(&new);
    let wanted = expected.clone();
    writeback_paused(
        |fs, a, _, _, paused| {
            let n = without_waiting("an overwrite", paused, || {
                fs.write_file(a, 3 * PAGE as u64 + 50, &new)
            });
            assert_eq!(n.unwrap(), new.len());
            let read = fs.read_file(a, 0, PAUSED_PAGES * PAGE).unwrap();
            assert!(read == wanted, "a read after the overwrite lost it");
        },
        |fs| {
            let a = ino(fs, "a");
            assert!(
                fs.read_file(a, 0, 1 << 20).unwrap() == expected,
                "the overwrite made during the writeback was lost or reordered"
            );
        },
    );
}

#[test]
fn writeback_paused_truncate_frees_what_it_cut() {
    let keep = 5 * PAGE + 100;
    writeback_paused(
        |fs, a, _, _, paused| {
            without_waiting("a truncate", paused, || fs.truncate(a, keep as u64)).unwrap();
            assert!(
                fs.read_file(a, 0, 1 << 20).unwrap() == pattern(PAUSED_PAGES * PAGE, 1)[..keep]
            );
        },
        |fs| {
            let a = ino(fs, "a");
            assert!(
                fs.read_file(a, 0, 1 << 20).unwrap() == pattern(PAUSED_PAGES * PAGE, 1)[..keep],
                "the truncate made during the writeback was lost"
            );
            // `birch check` (in `writeback_paused`) found no extent
            // leaked; grown again, the file shows zeros past the cut,
            // not the bytes the paused write carried there.
            fs.truncate(a, (PAUSED_PAGES * PAGE) as u64).unwrap();
            let mut grown = pattern(PAUSED_PAGES * PAGE, 1);
            grown[keep..].fill(0);
            assert!(
                fs.read_file(a, 0, 1 << 20).unwrap() == grown,
                "the writeback published data past the truncate"
            );
        },
    );
}

#[test]
fn writeback_paused_fsync_of_another_file_completes() {
    writeback_paused(
        |fs, _, b, dev, paused| {
            without_waiting("fsync of another file", paused, || fs.fsync(b, false)).unwrap();
            // A power cut now: b is durable, whatever a's writeback does.
            let crashed = Arc::new(birch::device::MemoryDevice::from_bytes(
                dev.inner.snapshot(),
            ));
            assert_clean(crashed.as_ref(), "power cut during the paused writeback");
            let remounted = mount(crashed);
            let b = ino(&remounted, "b");
            assert!(remounted.read_file(b, 0, 1 << 20).unwrap() == pattern(3 * PAGE, 7));
        },
        |fs| {
            let (a, b) = (ino(fs, "a"), ino(fs, "b"));
            assert!(fs.read_file(a, 0, 1 << 20).unwrap() == pattern(PAUSED_PAGES * PAGE, 1));
            assert!(fs.read_file(b, 0, 1 << 20).unwrap() == pattern(3 * PAGE, 7));
        },
    );
}

/// docs/DELALLOC.md, "The seal's writeback": the commit's seal gives the
/// pages dirty at its start extents under the state lock and writes their
/// data after releasing it. `b`'s early batch (3 pages) is paused, `a` is
/// written meanwhile (so the seal, not an early batch, writes it back),
/// then the seal's data write of `a` is paused: a getattr, a read of `a`
/// (its bytes come from memory: the extent is not written yet) and a
/// write must not wait for it. Released, the commit completes; a power
/// cut then leaves `a` whole and `birch check` clean.
#[test]
fn commit_paused_in_its_data_write_serves_requests() {
    let (dev, paused_rx, resume_tx) = PausingDevice::new(15);
    let fs = mount(dev.clone());
    let a = fs.create(fs.root_ino(), b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    fs.write_file(b, 0, &pattern(3 * PAGE, 7)).unwrap();
    *dev.armed_write_len.lock().unwrap() = Some(3 * PAGE);
    let fs = &fs;
    let wait = std::time::Duration::from_secs(120);
    std::thread::scope(|scope| {
        let commit = scope.spawn(move || fs.sync());
        paused_rx
            .recv_timeout(wait)
            .expect("the commit's early batch never reached the device");
        fs.write_file(a, 0, &pattern(PAUSED_PAGES * PAGE, 1))
            .unwrap();
        *dev.armed_write_len.lock().unwrap() = Some(PAUSED_PAGES * PAGE);
        resume_tx.send(()).unwrap();
        paused_rx
            .recv_timeout(wait)
            .expect("the seal's data write never reached the device");
        let release = Release(resume_tx);
        let attr = without_waiting("a getattr", &release, || fs.getattr(a)).unwrap();
        assert_eq!(attr.size, (PAUSED_PAGES * PAGE) as u64);
        let read = without_waiting("a read", &release, || {
            fs.read_file(a, 0, PAUSED_PAGES * PAGE)
        });
        assert!(
            read.unwrap() == pattern(PAUSED_PAGES * PAGE, 1),
            "a read during the commit's data write returned other bytes than were written"
        );
        // FIBMAP's answer: a block whose bytes are not on the device yet
        // has no device block to give.
        let mapped = without_waiting("a block map", &release, || fs.device_byte(a, 0));
        assert_eq!(mapped.unwrap(), None, "a block of an unwritten extent");
        let n = without_waiting("a write", &release, || fs.write_file(b, 0, b"new"));
        assert_eq!(n.unwrap(), 3);
        release.release();
        commit
            .join()
            .unwrap()
            .expect("the commit whose data write was paused");
    });
    let crashed = Arc::new(birch::device::MemoryDevice::from_bytes(
        dev.inner.snapshot(),
    ));
    assert_clean(crashed.as_ref(), "power cut after the commit");
    let remounted = mount(crashed);
    let a = ino(&remounted, "a");
    assert!(
        remounted.read_file(a, 0, 1 << 20).unwrap() == pattern(PAUSED_PAGES * PAGE, 1),
        "the commit lost the data its seal wrote back"
    );
}

/// docs/DELALLOC.md, "The seal's writeback": `write a 0..8p; collapse a
/// 2p..3p` settles a's dirty pages into an extent not written yet;
/// `copy_file_range a → b` shares it. Reads of either file take its bytes
/// from memory (found by disk address, whichever file points at it), and
/// the commit writes it: `sync; <power cut>; mount` → both files whole.
#[test]
fn reflink_of_an_unwritten_extent_reads_its_bytes() {
    let dev = common::memory_fs(IMAGE_BYTES, 16);
    let fs = mount(dev.clone());
    let a = fs.create(fs.root_ino(), b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let old = pattern(8 * PAGE, 5);
    let want = [&old[..2 * PAGE], &old[3 * PAGE..]].concat();
    fs.write_file(a, 0, &old).unwrap();
    fs.fallocate(
        a,
        2 * PAGE as u64,
        PAGE as u64,
        FallocateMode::CollapseRange,
    )
    .unwrap();
    let len = want.len() as u64;
    assert_eq!(fs.copy_file_range(a, 0, b, 0, len).unwrap(), len);
    assert!(
        fs.read_file(a, 0, 1 << 20).unwrap() == want,
        "a before the commit"
    );
    assert!(
        fs.read_file(b, 0, 1 << 20).unwrap() == want,
        "b before the commit"
    );
    fs.sync().unwrap();
    let crashed = Arc::new(birch::device::MemoryDevice::from_bytes(dev.snapshot()));
    assert_clean(crashed.as_ref(), "power cut after the commit");
    let remounted = mount(crashed);
    for name in ["a", "b"] {
        let f = ino(&remounted, name);
        assert!(
            remounted.read_file(f, 0, 1 << 20).unwrap() == want,
            "{name} after the power cut"
        );
    }
}

/// The whiteout RENAME_WHITEOUT leaves at `dir/name`: a character device
/// 0:0 with no permission bits, owned by `owner`, with one link.
fn assert_whiteout<D: birch::BlockDevice + 'static>(
    fs: &Filesystem<D>,
    dir: u64,
    name: &[u8],
    owner: WhiteoutOwner,
) {
    let w = fs.lookup(dir, name).unwrap();
    let shown = String::from_utf8_lossy(name);
    assert_eq!(w.file_type, FileType::CharDevice, "{shown}: {w:?}");
    assert_eq!((w.rdev, w.perm, w.nlink), (0, 0, 1), "{shown}: {w:?}");
    assert_eq!((w.uid, w.gid), (owner.uid, owner.gid), "{shown}: {w:?}");
}

/// renameat2(RENAME_WHITEOUT) as the kernel and btrfs do it: the source's
/// name becomes a new whiteout in the same change, for files and
/// directories, within and across directories, over a target and with
/// RENAME_NOREPLACE; with RENAME_EXCHANGE it is EINVAL; a rename between
/// two names of one inode does nothing. A remount shows the same and
/// `birch check` accepts the whiteouts.
#[test]
fn rename_whiteout_leaves_a_whiteout_at_the_source() {
    let dev = common::memory_fs(IMAGE_BYTES, 15);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let owner = WhiteoutOwner {
        uid: 1000,
        gid: 100,
    };
    let whiteout = RenameFlags {
        whiteout: Some(owner),
        ..RenameFlags::default()
    };
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let e = fs.mkdir(root, b"e", 0o755, 0, 0).unwrap().ino;
    let a = fs.create(d, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write_file(a, 0, b"lower a").unwrap();
    let sub = fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap().ino;
    fs.create(sub, b"x", 0o644, 0, 0).unwrap();
    let replaced = fs.create(e, b"replaced", 0o644, 0, 0).unwrap().ino;

    fs.rename(d, b"a", d, b"b", whiteout).unwrap();
    assert_eq!(fs.lookup(d, b"b").unwrap().ino, a);
    assert_whiteout(&fs, d, b"a", owner);
    // A directory, into another directory (overlayfs's redirect_dir).
    let nlinks = |ino| fs.getattr(ino).unwrap().nlink;
    let (d_links, e_links) = (nlinks(d), nlinks(e));
    fs.rename(d, b"sub", e, b"sub2", whiteout).unwrap();
    assert_eq!(fs.lookup(e, b"sub2").unwrap().ino, sub);
    assert_whiteout(&fs, d, b"sub", owner);
    assert_eq!((nlinks(d), nlinks(e)), (d_links - 1, e_links + 1));
    // Over a target, which goes.
    fs.rename(d, b"b", e, b"replaced", whiteout).unwrap();
    assert_eq!(fs.lookup(e, b"replaced").unwrap().ino, a);
    assert!(matches!(fs.getattr(replaced), Err(Error::NotFound)));
    assert_whiteout(&fs, d, b"b", owner);
    // RENAME_NOREPLACE with it: allowed, and EEXIST over a name.
    let no_replace = RenameFlags {
        no_replace: true,
        ..whiteout
    };
    let c = fs.create(d, b"c", 0o644, 0, 0).unwrap().ino;
    assert!(matches!(
        fs.rename(d, b"c", e, b"replaced", no_replace),
        Err(Error::Exists)
    ));
    fs.rename(d, b"c", e, b"c", no_replace).unwrap();
    assert_eq!(fs.lookup(e, b"c").unwrap().ino, c);
    assert_whiteout(&fs, d, b"c", owner);
    // RENAME_EXCHANGE with it: EINVAL, nothing changes.
    let exchange = RenameFlags {
        exchange: true,
        ..whiteout
    };
    assert!(matches!(
        fs.rename(e, b"c", e, b"replaced", exchange),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(fs.lookup(e, b"c").unwrap().ino, c);
    // Two names of one inode: nothing happens, no whiteout.
    fs.link(c, e, b"c_link").unwrap();
    fs.rename(e, b"c", e, b"c_link", whiteout).unwrap();
    assert_eq!(fs.lookup(e, b"c").unwrap().ino, c);
    assert_eq!(fs.getattr(c).unwrap().nlink, 2);
    // A whiteout is an inode like any: it can be renamed over with one.
    fs.rename(e, b"c_link", d, b"a", whiteout).unwrap();
    assert_eq!(fs.lookup(d, b"a").unwrap().ino, c);
    assert_whiteout(&fs, e, b"c_link", owner);

    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after whiteout renames");
    let fs = mount(dev.clone());
    for (dir, name) in [("d", "b"), ("d", "sub"), ("d", "c"), ("e", "c_link")] {
        assert_whiteout(&fs, ino(&fs, dir), name.as_bytes(), owner);
    }
    assert_eq!(
        fs.read_file(ino(&fs, "e/replaced"), 0, 100).unwrap(),
        b"lower a"
    );
    assert_eq!(ino(&fs, "e/sub2/x"), fs.lookup(sub, b"x").unwrap().ino);
    fs.close().unwrap();
}
