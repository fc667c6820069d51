//! Subvolumes through the library (docs/SNAPSHOTS.md, step 6 of (j)):
//! create, list, lookup and readdir across a link, external inode
//! numbers, EXDEV across subvolumes, read-only subvolumes, `..` of a
//! subvolume's root, every call routed to the subvolume its inode is in
//! (a file's whole life, writeback of its dirty pages, orphans), and power
//! cuts.

mod common;

use birch::check::check_device;
use birch::check::fixture::{sample, Fixture, FixtureNode};
use birch::device::MemoryDevice;
use birch::error::Error;
use birch::format::{
    item_type, tree_id, FileType, Key, SubvolRootItem, ROOT_DIR_INO, SUBVOL_RDONLY,
};
use birch::fs::{
    read_superblock, AtimeUpdates, FallocateMode, Filesystem, InoSpace, MetadataCopies,
    MountOptions, RenameFlags, SeekWhence, SetAttr, XattrSetMode,
};
use common::{
    crash_points, crash_view, memory_fs, memory_fs_with, mount, recorder, view, Enumeration,
};
use std::sync::Arc;

fn assert_clean(dev: &MemoryDevice, when: &str) {
    let report = check_device(dev);
    assert!(report.is_clean(), "{when}:\n{report}");
}

#[test]
fn create_list_lookup() {
    let dev = memory_fs(32 << 20, 0x61);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let a = fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let b = fs.create_subvolume(d, b"b", 0, 0).unwrap();
    assert_eq!((a, b), (256, 257), "ids are the highest + 1, from 256");
    assert_eq!(
        fs.create_subvolume(root, b"a", 0, 0).unwrap_err().errno(),
        libc::EEXIST
    );
    let listed: Vec<(u64, u64, Vec<u8>)> = fs
        .list_subvolumes()
        .unwrap()
        .into_iter()
        .map(|i| (i.id, i.parent, i.name))
        .collect();
    assert_eq!(
        listed,
        vec![
            (tree_id::FS, 0, vec![]),
            (a, tree_id::FS, b"a".to_vec()),
            (b, tree_id::FS, b"b".to_vec())
        ]
    );
    let a_root = fs.lookup(root, b"a").unwrap();
    assert_eq!(a_root.ino, InoSpace::join(a, ROOT_DIR_INO));
    assert_eq!(a_root.file_type, FileType::Directory);
    let f = fs.mkdir(a_root.ino, b"inner", 0o755, 0, 0).unwrap();
    assert_eq!(fs.lookup(a_root.ino, b"inner").unwrap(), f);
    let names: Vec<(Vec<u8>, u64)> = fs
        .readdir(root, 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.ino))
        .collect();
    assert!(names.contains(&(b"a".to_vec(), a_root.ino)), "{names:?}");
    assert_eq!(fs.default_subvolume().unwrap(), tree_id::FS);
    fs.set_default_subvolume(a).unwrap();
    assert_eq!(fs.default_subvolume().unwrap(), a);
    assert_eq!(
        fs.set_default_subvolume(999).unwrap_err().errno(),
        libc::ENOENT
    );
    assert_eq!(
        fs.rmdir(root, b"a").unwrap_err().errno(),
        libc::ENOTEMPTY,
        "rmdir deletes only an empty subvolume"
    );
    fs.sync().unwrap();
    drop(fs);
    assert_clean(&dev, "after create");
    let fs = mount(dev);
    assert_eq!(fs.default_subvolume().unwrap(), a);
    let a_root = fs.lookup(fs.root_ino(), b"a").unwrap();
    assert_eq!(fs.lookup(a_root.ino, b"inner").unwrap(), f);
    let b_root = fs.lookup(d, b"b").unwrap();
    assert_eq!(b_root.ino, InoSpace::join(b, ROOT_DIR_INO));
}

#[test]
fn inode_numbers_are_unique_across_subvolumes() {
    let dev = memory_fs(32 << 20, 0x62);
    let fs = mount(dev);
    let root = fs.root_ino();
    let a = fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let b = fs.create_subvolume(root, b"b", 0, 0).unwrap();
    let mut seen = vec![root];
    for (id, name) in [(a, &b"a"[..]), (b, &b"b"[..])] {
        let dir = fs.lookup(root, name).unwrap().ino;
        seen.push(dir);
        for i in 0..3 {
            // Each tree numbers its inodes from 257: the same numbers
            // inside, distinct outside.
            let ino = fs
                .mkdir(dir, format!("x{i}").as_bytes(), 0o755, 0, 0)
                .unwrap()
                .ino;
            assert_eq!(InoSpace::split(ino), (id, 257 + i));
            assert_eq!(fs.getattr(ino).unwrap().ino, ino);
            seen.push(ino);
        }
    }
    for i in 0..3 {
        seen.push(
            fs.mkdir(root, format!("y{i}").as_bytes(), 0o755, 0, 0)
                .unwrap()
                .ino,
        );
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "{seen:?}");
}

#[test]
fn rename_across_subvolumes_is_exdev() {
    let dev = memory_fs(32 << 20, 0x63);
    let fs = mount(dev);
    let root = fs.root_ino();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let a = fs.lookup(root, b"a").unwrap().ino;
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    let g = fs.mkdir(a, b"g", 0o755, 0, 0).unwrap().ino;
    let exdev =
        |r: birch::error::Result<()>| assert!(matches!(r, Err(Error::CrossDevice)), "{r:?}");
    exdev(fs.rename(root, b"f", a, b"f", RenameFlags::default()));
    exdev(fs.rename(a, b"g", root, b"g", RenameFlags::default()));
    exdev(fs.link(f, a, b"f2").map(|_| ()));
    assert_eq!(fs.lookup(root, b"f").unwrap().ino, f);
    assert_eq!(fs.lookup(a, b"g").unwrap().ino, g);
}

/// Sets `SUBVOL_RDONLY` in subvolume `id`'s root item on a closed
/// image whose root tree is one leaf (single metadata copies): the
/// library has no call that makes a subvolume read-only yet.
fn make_read_only(dev: &MemoryDevice, id: u64) -> MemoryDevice {
    let superblock = read_superblock(dev).unwrap();
    assert_eq!(superblock.root_tree_level, 0, "a one-leaf root tree");
    let mut image = Fixture {
        image: dev.snapshot(),
        nodes: vec![FixtureNode {
            tree: tree_id::ROOT,
            bytenr: superblock.root_tree_bytenr,
            level: 0,
        }],
        superblock,
    };
    image.modify_item(
        tree_id::ROOT,
        Key::new(id, item_type::ROOT_ITEM, 0),
        |data| {
            let mut item = SubvolRootItem::decode(data).unwrap();
            item.flags |= SUBVOL_RDONLY;
            *data = item.encode();
        },
    );
    image.device()
}

#[test]
fn read_only_subvolume_refuses_every_change() {
    let mut b = sample();
    b.enable_subvolumes();
    let sv = b.subvolume(tree_id::FS, ROOT_DIR_INO, b"sv");
    b.subvol_item_mut(sv).flags = SUBVOL_RDONLY;
    let dev = Arc::new(b.build().device());
    let fs = Filesystem::open(dev, MountOptions::deterministic()).unwrap();
    let root = fs.root_ino();
    let sv_root = fs.lookup(root, b"sv").unwrap().ino;
    let erofs = |r: birch::error::Result<()>| assert!(matches!(r, Err(Error::ReadOnly)), "{r:?}");
    erofs(fs.create(sv_root, b"f", 0o644, 0, 0).map(|_| ()));
    erofs(fs.mkdir(sv_root, b"d", 0o755, 0, 0).map(|_| ()));
    erofs(fs.create_subvolume(sv_root, b"n", 0, 0).map(|_| ()));
    // The top level stays writable.
    fs.create(root, b"ok", 0o644, 0, 0).unwrap();
}

/// A read-only subvolume holding a file, a directory, a symlink and an
/// xattr: every call that would change one of them fails with EROFS,
/// reads work and change nothing, and the image stays as it was.
#[test]
fn read_only_subvolume_refuses_changes_to_its_files() {
    let dev = memory_fs_with(32 << 20, 0x6d, MetadataCopies::Single);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let id = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv = fs.lookup(root, b"sv").unwrap().ino;
    let f = fs.create(sv, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[5u8; 9000]).unwrap();
    fs.setxattr(f, b"user.x", b"v", XattrSetMode::Create)
        .unwrap();
    let d = fs.mkdir(sv, b"d", 0o755, 0, 0).unwrap().ino;
    let l = fs.symlink(sv, b"l", b"f", 0, 0).unwrap().ino;
    let outside = fs.create(root, b"outside", 0o644, 0, 0).unwrap().ino;
    fs.write_file(outside, 0, &[6u8; 8192]).unwrap();
    fs.close().unwrap();
    let dev = Arc::new(make_read_only(&dev, id));
    let options = MountOptions {
        atime: AtimeUpdates::Always,
        ..MountOptions::deterministic()
    };
    let fs = Filesystem::open(dev.clone(), options).unwrap();
    let before = view(&fs);
    let attr = fs.getattr(f).unwrap();
    let erofs = |what: &str, r: birch::error::Result<()>| {
        assert!(matches!(r, Err(Error::ReadOnly)), "{what}: {r:?}")
    };
    erofs("write", fs.write_file(f, 0, b"x").map(|_| ()));
    erofs("empty write", fs.write_file(f, 0, b"").map(|_| ()));
    erofs("truncate", fs.truncate(f, 0).map(|_| ()));
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    erofs("chmod", fs.setattr(f, &chmod).map(|_| ()));
    erofs(
        "fallocate",
        fs.fallocate(f, 0, 65_536, FallocateMode::Allocate),
    );
    erofs("punch", fs.fallocate(f, 0, 4096, FallocateMode::PunchHole));
    erofs(
        "setxattr",
        fs.setxattr(f, b"user.y", b"w", XattrSetMode::Create),
    );
    erofs("removexattr", fs.removexattr(f, b"user.x"));
    erofs("set_flags", fs.set_flags(f, 0));
    erofs("create", fs.create(d, b"n", 0o644, 0, 0).map(|_| ()));
    erofs("mkdir", fs.mkdir(sv, b"n", 0o755, 0, 0).map(|_| ()));
    erofs("symlink", fs.symlink(d, b"n", b"t", 0, 0).map(|_| ()));
    erofs("link", fs.link(f, d, b"n").map(|_| ()));
    erofs("unlink", fs.unlink(sv, b"f"));
    erofs("unlink symlink", fs.unlink(sv, b"l"));
    erofs("rmdir", fs.rmdir(sv, b"d"));
    erofs(
        "rename",
        fs.rename(sv, b"f", d, b"f", RenameFlags::default()),
    );
    erofs("tmpfile", fs.tmpfile(d, 0o644, 0, 0, 0).map(|_| ()));
    erofs("subvolume", fs.create_subvolume(d, b"n", 0, 0).map(|_| ()));
    erofs(
        "reflink into",
        fs.copy_file_range(outside, 0, f, 0, 8192).map(|_| ()),
    );
    erofs("write open", fs.deny_open(f, libc::O_WRONLY));
    erofs(
        "truncating open",
        fs.deny_open(f, libc::O_RDONLY | libc::O_TRUNC),
    );
    // Reads work, and leave even the atime alone.
    fs.deny_open(f, libc::O_RDONLY).unwrap();
    assert_eq!(fs.read_file(f, 0, 100).unwrap(), [5u8; 100]);
    assert_eq!(fs.readlink(l).unwrap(), b"f");
    assert_eq!(fs.getxattr(f, b"user.x").unwrap(), b"v");
    fs.dir_accessed(d).unwrap();
    assert_eq!(fs.getattr(f).unwrap(), attr);
    // Copying out of it is a read.
    let copy = fs.create(root, b"copy", 0o644, 0, 0).unwrap().ino;
    assert_eq!(fs.copy_file_range(f, 0, copy, 0, 9000).unwrap(), 9000);
    assert_eq!(fs.read_file(copy, 0, 9000).unwrap(), [5u8; 9000]);
    let mut expected = before.clone();
    expected.insert("/copy".into(), vec![5u8; 9000]);
    assert_eq!(view(&fs), expected);
    drop(fs);
    assert_clean(dev.as_ref(), "after the refused changes");
}

#[test]
fn old_image_mounts_and_gets_subvolumes() {
    let dev = memory_fs(32 << 20, 0x64);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let f = fs.create(root, b"old", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, b"data before subvolumes").unwrap();
    fs.sync().unwrap();
    drop(fs);
    let fs = mount(dev.clone());
    assert_eq!(fs.list_subvolumes().unwrap().len(), 1);
    let a = fs.create_subvolume(root, b"a", 0, 0).unwrap();
    drop(fs);
    assert_clean(&dev, "after the first subvolume");
    let fs = mount(dev);
    assert_eq!(fs.read_file(f, 0, 100).unwrap(), b"data before subvolumes");
    assert_eq!(
        fs.lookup(root, b"a").unwrap().ino,
        InoSpace::join(a, ROOT_DIR_INO)
    );
}

/// Crash case (docs/SNAPSHOTS.md (i)): `subvolume create a; <cut at any
/// write or flush>` shows `a` whole (an empty subvolume linked as `/a`)
/// or not at all, and `birch check` is clean (crash_view checks it).
#[test]
fn power_cut_during_subvolume_create() {
    let rec = recorder(32 << 20, 0x65);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    fs.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    fs.sync().unwrap();
    let synced = rec.flush_count();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    drop(fs);
    let points = crash_points(&rec, synced, &Enumeration::thorough(0x65));
    let mut saw = [false; 2];
    for point in &points {
        let view = crash_view(&rec, point);
        let has = view.contains_key("/a");
        if has {
            assert_eq!(
                view.get("/a").map(Vec::as_slice),
                Some(&b"<dir>"[..]),
                "{point:?}"
            );
        }
        assert!(view.contains_key("/d"), "{point:?}: {view:?}");
        saw[has as usize] = true;
    }
    assert_eq!(
        saw,
        [true, true],
        "both outcomes among {} states",
        points.len()
    );
}

/// Crash case: `subvolume create a; mkdir a/d; fsync a/d; <cut>` shows
/// `a/d`: the fsync logs into `a`'s own log (no fallback).
#[test]
fn fsync_in_subvolume_survives_power_cut() {
    let rec = recorder(32 << 20, 0x66);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let a = fs.lookup(root, b"a").unwrap().ino;
    let d = fs.mkdir(a, b"d", 0o755, 0, 0).unwrap().ino;
    let before = fs.log_stats();
    fs.fsync(d, false).unwrap();
    let after = fs.log_stats();
    assert_eq!(after.fallback_subvolume, before.fallback_subvolume);
    assert_eq!(after.logged_fsyncs, before.logged_fsyncs + 1);
    let synced = rec.flush_count();
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::thorough(0x66)) {
        let view = crash_view(&rec, &point);
        assert!(view.contains_key("/a/d"), "{point:?}: {view:?}");
    }
}

/// `set_received_subvolume` (what `birch receive` sends at END,
/// docs/SEND.md): durable at its return, the sender's uuid, ctransid and
/// time and this transaction recorded; refused (EROFS) on a read-only
/// subvolume, as btrfs, so receive records it before setting the flag.
#[test]
fn set_received_subvolume_commits_and_refuses_read_only() {
    let dev = memory_fs(32 << 20, 0x68);
    let fs = mount(dev.clone());
    let sv = fs.create_subvolume(fs.root_ino(), b"sv", 0, 0).unwrap();
    let stime = birch::format::Timespec {
        sec: 1_600_000_000,
        nsec: 7,
    };
    let (rtransid, _) = fs.set_received_subvolume(sv, [9; 16], 42, stime).unwrap();
    let after = Arc::new(MemoryDevice::from_bytes(dev.snapshot()));
    assert_clean(&after, "after set received");
    let copy = mount(after);
    let listed = copy.list_subvolumes().unwrap();
    let item = listed.iter().find(|i| i.id == sv).unwrap().item.unwrap();
    assert_eq!(
        (item.received_uuid, item.stransid, item.stime, item.rtransid),
        ([9; 16], 42, stime, rtransid)
    );
    assert!(rtransid > 0);
    fs.set_subvolume_readonly(sv, true).unwrap();
    assert!(matches!(
        fs.set_received_subvolume(sv, [1; 16], 1, stime),
        Err(Error::ReadOnly)
    ));
}

/// `set_subvolume_readonly` (what `birch property set PATH ro` sends):
/// durable at its return (it commits: the device copy taken right after
/// shows it), every change in the subvolume EROFS until cleared, and the
/// top level's flag works on an image that had no subvolume yet.
#[test]
fn set_subvolume_readonly_commits_and_refuses_changes() {
    let dev = memory_fs(32 << 20, 0x66);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let sv = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let sv_root = fs.lookup(root, b"sv").unwrap().ino;
    fs.set_subvolume_readonly(sv, true).unwrap();
    let after = Arc::new(MemoryDevice::from_bytes(dev.snapshot()));
    assert_clean(&after, "after set ro");
    let copy = mount(after);
    let listed = copy.list_subvolumes().unwrap();
    assert!(
        listed.iter().any(|i| i.id == sv && i.readonly),
        "{listed:?}"
    );
    let erofs = |r: birch::error::Result<()>| assert!(matches!(r, Err(Error::ReadOnly)), "{r:?}");
    erofs(copy.mkdir(sv_root, b"d", 0o755, 0, 0).map(|_| ()));
    erofs(fs.mkdir(sv_root, b"d", 0o755, 0, 0).map(|_| ()));
    fs.set_subvolume_readonly(sv, false).unwrap();
    fs.mkdir(sv_root, b"d", 0o755, 0, 0).unwrap();
    assert_eq!(
        fs.set_subvolume_readonly(4000, true).unwrap_err().errno(),
        libc::ENOENT
    );

    let dev = memory_fs(32 << 20, 0x67);
    let fs = mount(dev.clone());
    fs.set_subvolume_readonly(tree_id::FS, true).unwrap();
    erofs(fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).map(|_| ()));
    drop(fs);
    assert_clean(&dev, "top level made read-only");
    let fs = mount(dev);
    assert!(fs.list_subvolumes().unwrap()[0].readonly);
    fs.set_subvolume_readonly(tree_id::FS, false).unwrap();
    fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap();
}

/// A power cut: the image the device holds now, the mount left running.
fn power_cut(dev: &MemoryDevice) -> Arc<MemoryDevice> {
    let cut = Arc::new(MemoryDevice::from_bytes(dev.snapshot()));
    assert_clean(cut.as_ref(), "after the power cut");
    cut
}

/// Every call on a file of a subvolume acts in that subvolume's tree: a
/// file's whole life inside subvolume `a`, committed, then changes that a
/// power cut loses. The remounted image shows the committed state and
/// `birch check` is clean.
#[test]
fn file_life_in_subvolume_survives_power_cut() {
    let dev = memory_fs(64 << 20, 0x67);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let id = fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let a = fs.lookup(root, b"a").unwrap().ino;
    let f = fs.create(a, b"f", 0o644, 0, 0).unwrap();
    assert_eq!(InoSpace::split(f.ino).0, id);
    let data: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(fs.write_file(f.ino, 0, &data).unwrap(), data.len());
    assert_eq!(fs.read_file(f.ino, 0, data.len()).unwrap(), data);
    assert!(fs.flush_range(f.ino, 0, 8192).unwrap() > 0, "pages written");
    assert_eq!(fs.seek(f.ino, 100, SeekWhence::Data).unwrap(), 100);
    fs.set_flags(f.ino, 0).unwrap();
    assert_eq!(fs.get_flags(f.ino).unwrap(), 0);
    fs.deny_open(f.ino, libc::O_WRONLY).unwrap();
    let t = fs.truncate(f.ino, 30_000).unwrap();
    assert_eq!((t.ino, t.size), (f.ino, 30_000));
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    assert_eq!(fs.setattr(f.ino, &chmod).unwrap().perm, 0o600);
    fs.setxattr(f.ino, b"user.a", b"1", XattrSetMode::Create)
        .unwrap();
    fs.setxattr(f.ino, b"user.b", b"2", XattrSetMode::Create)
        .unwrap();
    fs.removexattr(f.ino, b"user.b").unwrap();
    assert_eq!(fs.getxattr(f.ino, b"user.a").unwrap(), b"1");
    assert_eq!(fs.listxattr(f.ino).unwrap(), vec![b"user.a".to_vec()]);
    let l = fs.symlink(a, b"l", b"f", 0, 0).unwrap();
    assert_eq!(InoSpace::split(l.ino).0, id);
    assert_eq!(fs.readlink(l.ino).unwrap(), b"f");
    let d = fs.mkdir(a, b"d", 0o755, 0, 0).unwrap().ino;
    let h = fs.link(f.ino, d, b"h").unwrap();
    assert_eq!((h.ino, h.nlink), (f.ino, 2));
    fs.rename(a, b"f", d, b"g", RenameFlags::default()).unwrap();
    assert_eq!(fs.lookup(d, b"g").unwrap().ino, f.ino);
    fs.unlink(d, b"h").unwrap();
    let x = fs.mkdir(a, b"x", 0o755, 0, 0).unwrap().ino;
    let y = fs.create(a, b"y", 0o644, 0, 0).unwrap().ino;
    let exchange = RenameFlags {
        exchange: true,
        ..Default::default()
    };
    fs.rename(a, b"x", a, b"y", exchange).unwrap();
    assert_eq!(fs.lookup(a, b"x").unwrap().ino, y);
    assert_eq!(fs.lookup(a, b"y").unwrap().ino, x);
    fs.mkdir(a, b"gone", 0o755, 0, 0).unwrap();
    fs.rmdir(a, b"gone").unwrap();
    let p = fs.create(a, b"p", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(p, 0, 16_384, FallocateMode::Allocate).unwrap();
    assert_eq!(fs.getattr(p).unwrap().size, 16_384);
    let r = fs.create(a, b"r", 0o644, 0, 0).unwrap().ino;
    assert_eq!(fs.copy_file_range(f.ino, 0, r, 0, 30_000).unwrap(), 30_000);
    assert_eq!(fs.read_file(r, 0, 30_000).unwrap(), data[..30_000]);
    let tmp = fs.tmpfile(a, 0o644, 0, 0, 0).unwrap();
    assert_eq!(InoSpace::split(tmp.ino).0, id);
    fs.write_file(tmp.ino, 0, b"named later").unwrap();
    fs.link(tmp.ino, a, b"t").unwrap();
    fs.release(tmp.ino).unwrap();
    fs.sync().unwrap();
    let committed = view(&fs);
    // Changes after the commit: the power cut loses them.
    fs.write_file(f.ino, 0, b"lost").unwrap();
    fs.unlink(a, b"r").unwrap();
    fs.create(a, b"new", 0o644, 0, 0).unwrap();
    let cut = power_cut(&dev);
    drop(fs);
    let fs = mount(cut.clone());
    let after = view(&fs);
    assert_eq!(after, committed);
    assert_eq!(after["/a/d/g"], data[..30_000]);
    assert_eq!(after["/a/r"], data[..30_000]);
    assert_eq!(after["/a/t"], b"named later");
    assert_eq!(after["/a/l"], b"-> f");
    let g = fs.lookup(d, b"g").unwrap();
    assert_eq!((g.ino, g.nlink, g.perm), (f.ino, 1, 0o600));
    assert_eq!(fs.listxattr(f.ino).unwrap(), vec![b"user.a".to_vec()]);
    drop(fs);
    assert_clean(cut.as_ref(), "after the remount");
}

/// Dirty pages of a subvolume file reach the disk at a commit: written,
/// committed by `sync`, and read back after a power cut.
#[test]
fn commit_writes_back_dirty_pages_of_subvolume_file() {
    let dev = memory_fs(32 << 20, 0x68);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let a = fs.lookup(root, b"a").unwrap().ino;
    // The same inode number (257) in tree 5 and in `a`, both dirty: the
    // dirty-inode queue must keep them apart.
    let top = fs.create(root, b"top", 0o644, 0, 0).unwrap().ino;
    let f = fs.create(a, b"f", 0o644, 0, 0).unwrap().ino;
    assert_eq!(InoSpace::split(f).1, top);
    fs.write_file(top, 0, &[1u8; 20_000]).unwrap();
    fs.write_file(f, 0, &[2u8; 12_288]).unwrap();
    assert!(fs.space_usage().dirty_data > 0);
    fs.sync().unwrap();
    assert_eq!(fs.space_usage().dirty_data, 0, "every dirty page written");
    let cut = power_cut(&dev);
    drop(fs);
    let fs = mount(cut);
    assert_eq!(fs.read_file(f, 0, 1 << 20).unwrap(), [2u8; 12_288]);
    assert_eq!(fs.read_file(top, 0, 1 << 20).unwrap(), [1u8; 20_000]);
}

/// A writer over the dirty limit writes back the oldest pages itself
/// (no flusher): pages of a subvolume file go out through the same queue.
#[test]
fn throttled_writer_writes_back_subvolume_pages() {
    let dev = memory_fs(64 << 20, 0x69);
    let options = MountOptions {
        dirty_limit_bytes: 256 << 10,
        ..MountOptions::deterministic()
    };
    let fs = Filesystem::open(dev.clone(), options).unwrap();
    let root = fs.root_ino();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let a = fs.lookup(root, b"a").unwrap().ino;
    let f = fs.create(a, b"f", 0o644, 0, 0).unwrap().ino;
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 239) as u8).collect();
    for piece in data.chunks(64 << 10).enumerate() {
        let (i, chunk) = piece;
        fs.write_file(f, (i * (64 << 10)) as u64, chunk).unwrap();
    }
    assert!(
        fs.space_stats().throttle_pages > 0,
        "the writer was throttled"
    );
    assert!(fs.space_usage().dirty_data <= 256 << 10);
    assert_eq!(fs.read_file(f, 0, data.len()).unwrap(), data);
    fs.sync().unwrap();
    drop(fs);
    assert_clean(dev.as_ref(), "after the throttled writes");
    let fs = mount(dev);
    assert_eq!(fs.read_file(f, 0, data.len()).unwrap(), data);
}

/// Crash case: `subvolume create a; write a/f; fsync a/f; <cut>` shows
/// a/f's data: the fsync's commit writes its dirty pages back.
#[test]
fn fsync_of_subvolume_file_makes_its_data_durable() {
    let rec = recorder(32 << 20, 0x6a);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let a = fs.lookup(root, b"a").unwrap().ino;
    let f = fs.create(a, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[7u8; 10_000]).unwrap();
    fs.fsync(f, false).unwrap();
    let synced = rec.flush_count();
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::thorough(0x6a)) {
        let view = crash_view(&rec, &point);
        assert_eq!(
            view.get("/a/f").map(Vec::as_slice),
            Some(&[7u8; 10_000][..]),
            "{point:?}"
        );
    }
}

/// An open file unlinked in a subvolume is an orphan in that subvolume's
/// tree: after a power cut the next mount frees it.
#[test]
fn orphan_in_subvolume_is_freed_at_next_mount() {
    let dev = memory_fs(32 << 20, 0x6b);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let a = fs.lookup(root, b"a").unwrap().ino;
    let f = fs.create(a, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &[3u8; 50_000]).unwrap();
    fs.open_inode(f).unwrap();
    fs.unlink(a, b"f").unwrap();
    assert_eq!(fs.read_file(f, 0, 10).unwrap(), [3u8; 10], "still open");
    fs.sync().unwrap();
    let cut = power_cut(&dev);
    drop(fs);
    let fs = mount(cut.clone());
    assert!(
        matches!(fs.getattr(f), Err(Error::NotFound)),
        "the orphan was freed at mount"
    );
    drop(fs);
    assert_clean(cut.as_ref(), "after the orphan's removal");
}

/// `..` of a subvolume's root directory is the directory holding its
/// link, as in btrfs, not the root itself.
#[test]
fn dotdot_of_subvolume_root_is_the_link_directory() {
    let dev = memory_fs(32 << 20, 0x6c);
    let fs = mount(dev);
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    fs.create_subvolume(d.ino, b"a", 0, 0).unwrap();
    let a = fs.lookup(d.ino, b"a").unwrap().ino;
    assert_eq!(fs.lookup(a, b"..").unwrap(), fs.getattr(d.ino).unwrap());
    assert_eq!(fs.parent_of_dir(a).unwrap(), d.ino);
    let inner = fs.mkdir(a, b"inner", 0o755, 0, 0).unwrap().ino;
    assert_eq!(fs.lookup(inner, b"..").unwrap().ino, a);
    assert_eq!(fs.parent_of_dir(inner).unwrap(), a);
    fs.create_subvolume(a, b"b", 0, 0).unwrap();
    let b = fs.lookup(a, b"b").unwrap().ino;
    assert_eq!(fs.lookup(b, b"..").unwrap().ino, a);
    assert_eq!(fs.parent_of_dir(root).unwrap(), root);
}

/// Crash case: `subvolume create a b; sync; write a/f X; write b/g Y;
/// write h Z; fsync a/f; <cut>` → `a/f` = X, and neither `b/g` nor `h`:
/// the fsync logged `a`'s changes into `a`'s log only.
#[test]
fn fsync_in_subvolume_logs_only_its_root() {
    let rec = recorder(32 << 20, 0x6a);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    fs.create_subvolume(root, b"b", 0, 0).unwrap();
    fs.sync().unwrap();
    let a = fs.lookup(root, b"a").unwrap().ino;
    let b = fs.lookup(root, b"b").unwrap().ino;
    let f = fs.create(a, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, b"X in a").unwrap();
    let g = fs.create(b, b"g", 0o644, 0, 0).unwrap().ino;
    fs.write_file(g, 0, b"Y in b").unwrap();
    let h = fs.create(root, b"h", 0o644, 0, 0).unwrap().ino;
    fs.write_file(h, 0, b"Z in 5").unwrap();
    let before = fs.log_stats();
    fs.fsync(f, false).unwrap();
    let after = fs.log_stats();
    assert_eq!(after.logged_fsyncs, before.logged_fsyncs + 1);
    assert_eq!(after.fallback_subvolume, before.fallback_subvolume);
    let synced = rec.flush_count();
    drop(fs);
    let points = crash_points(&rec, synced, &Enumeration::thorough(0x6a));
    let at_fsync: Vec<_> = points
        .iter()
        .filter(|p| p.flushes_completed == synced && p.kept_writes.is_empty())
        .collect();
    assert!(!at_fsync.is_empty());
    for point in &points {
        let view = crash_view(&rec, point);
        common::require_content(&view, "/a/f", b"X in a")
            .unwrap_or_else(|e| panic!("{point:?}: {e}: {view:?}"));
    }
    for point in at_fsync {
        let view = crash_view(&rec, point);
        assert!(!view.contains_key("/b/g"), "{point:?}: {view:?}");
        assert!(!view.contains_key("/h"), "{point:?}: {view:?}");
    }
}

/// Crash case: `subvolume create a b; sync; write a/f; write b/g; write
/// h; fsync a/f; fsync b/g; fsync h; <cut>` → all three: replay applies
/// the log of every subvolume (a, b and 5), each into its own tree.
#[test]
fn replay_logs_of_every_subvolume() {
    let rec = recorder(32 << 20, 0x6b);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    fs.create_subvolume(root, b"b", 0, 0).unwrap();
    fs.sync().unwrap();
    let a = fs.lookup(root, b"a").unwrap().ino;
    let b = fs.lookup(root, b"b").unwrap().ino;
    let start = rec.flush_count();
    let mut fsynced: Vec<(String, Vec<u8>)> = Vec::new();
    let mut after_each = Vec::new();
    for (dir, path, name, data) in [
        (a, "/a/f", &b"f"[..], vec![1u8; 6000]),
        (b, "/b/g", &b"g"[..], vec![2u8; 100]),
        (root, "/h", &b"h"[..], vec![3u8; 5000]),
    ] {
        let ino = fs.create(dir, name, 0o644, 0, 0).unwrap().ino;
        fs.write_file(ino, 0, &data).unwrap();
        let d = fs.mkdir(dir, b"d", 0o755, 0, 0).unwrap().ino;
        fs.fsync(ino, false).unwrap();
        fs.fsync(d, false).unwrap();
        fsynced.push((path.to_string(), data));
        after_each.push((rec.flush_count(), fsynced.clone()));
    }
    assert_eq!(fs.log_stats().fallback_subvolume, 0);
    drop(fs);
    for point in crash_points(&rec, start, &Enumeration::thorough(0x6b)) {
        let Some((_, durable)) = after_each
            .iter()
            .rev()
            .find(|(flushes, _)| point.flushes_completed >= *flushes)
        else {
            continue;
        };
        let view = crash_view(&rec, &point);
        for (path, data) in durable {
            common::require_content(&view, path, data)
                .unwrap_or_else(|e| panic!("{point:?}: {e}: {view:?}"));
        }
    }
}

/// A subvolume's `ctransid` is the last transaction that changed its tree
/// (btrfs updates it on every change; send/receive relies on it): it moves
/// with a change in the subvolume, stays for a subvolume nothing changed,
/// and keeps S8 (otransid <= ctransid <= generation).
#[test]
fn ctransid_moves_with_changes_of_the_subvolume() {
    let dev = memory_fs(32 << 20, 0x3c);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let a = fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let b = fs.create_subvolume(root, b"b", 0, 0).unwrap();
    let item = |fs: &Filesystem<_>, id: u64| {
        let info = fs
            .list_subvolumes()
            .unwrap()
            .into_iter()
            .find(|s| s.id == id)
            .unwrap();
        let item = info.item.unwrap();
        assert!(
            item.otransid <= item.ctransid && item.ctransid <= info.generation,
            "S8 for {id}: {item:?}, generation {}",
            info.generation
        );
        (item.ctransid, info.generation)
    };
    let (a_before, _) = item(&fs, a);
    let (b_before, _) = item(&fs, b);
    let a_dir = fs.lookup(root, b"a").unwrap().ino;
    let f = fs.create(a_dir, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, b"changed").unwrap();
    fs.sync().unwrap();
    let (a_after, a_generation) = item(&fs, a);
    assert!(a_after > a_before, "ctransid of a did not move: {a_after}");
    assert_eq!(a_after, a_generation);
    assert_eq!(item(&fs, b).0, b_before, "b did not change");
    // A change of tree 5 moves its ctransid too, and it survives a remount.
    fs.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    fs.sync().unwrap();
    let (top, top_generation) = item(&fs, tree_id::FS);
    assert_eq!(top, top_generation);
    fs.close().unwrap();
    let fs = mount(dev);
    assert_eq!(item(&fs, a).0, a_after);
    assert_eq!(item(&fs, tree_id::FS).0, top);
}

/// The background worker's delayed-item limit counts the items pending
/// in every loaded root and flushes them all, not only tree 5's: items
/// created in a subvolume are flushed before any commit (the interval is
/// an hour here, so no commit runs). The wait is bounded only so that a
/// failure ends; the worker checks twice a second.
#[test]
fn worker_flushes_delayed_items_of_every_subvolume() {
    let dev = memory_fs(32 << 20, 0x3d);
    let fs = Filesystem::open(
        dev,
        MountOptions {
            commit_interval: Some(std::time::Duration::from_secs(3600)),
            background_flusher: false,
            delayed_items_limit: 8,
            ..MountOptions::default()
        },
    )
    .unwrap();
    let root = fs.root_ino();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let a_dir = fs.lookup(root, b"a").unwrap().ino;
    let before = fs.stats();
    for n in 0..40 {
        fs.create(a_dir, format!("f{n}").as_bytes(), 0o644, 0, 0)
            .unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while fs.stats().delayed_item_flushes == before.delayed_item_flushes
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let after = fs.stats();
    assert_eq!(after.commits, before.commits, "no commit ran");
    assert!(
        after.delayed_item_flushes > before.delayed_item_flushes,
        "the worker never flushed the subvolume's 40 delayed items"
    );
}

/// Renaming a subvolume link (docs/SNAPSHOTS.md (g), "Renaming a
/// subvolume link"; btrfs's `btrfs_rename`): it moves within its parent
/// subvolume, keeping its id, contents and root directory, with its
/// ROOT_REF pair rewritten (list and `..` follow it); it may replace an
/// empty directory; everything else is refused as btrfs refuses it.
#[test]
fn rename_of_subvolume_link_moves_it() {
    let dev = memory_fs(32 << 20, 0x68);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let sv = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    fs.create_subvolume(root, b"other", 0, 0).unwrap();
    let sv_root = InoSpace::join(sv, ROOT_DIR_INO);
    let inner = fs.mkdir(sv_root, b"inner", 0o755, 0, 0).unwrap().ino;
    let nlink = |ino| fs.getattr(ino).unwrap().nlink;
    let (root_nlink, d_nlink) = (nlink(root), nlink(d));
    let plain = RenameFlags::default();

    fs.rename(root, b"sv", root, b"sw", plain).unwrap();
    assert_eq!(fs.lookup(root, b"sw").unwrap().ino, sv_root);
    assert_eq!(fs.lookup(root, b"sv").unwrap_err().errno(), libc::ENOENT);
    fs.rename(root, b"sw", d, b"moved", plain).unwrap();
    assert_eq!(fs.lookup(d, b"moved").unwrap().ino, sv_root);
    assert_eq!(fs.lookup(sv_root, b"inner").unwrap().ino, inner);
    assert_eq!(fs.lookup(sv_root, b"..").unwrap().ino, d);
    assert_eq!((nlink(root), nlink(d)), (root_nlink - 1, d_nlink + 1));
    let listed = fs.list_subvolumes().unwrap();
    let entry = listed.iter().find(|i| i.id == sv).unwrap();
    assert_eq!(
        (entry.parent, entry.name.as_slice()),
        (tree_id::FS, &b"moved"[..])
    );
    let names: Vec<Vec<u8>> = fs
        .readdir(d, 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, [b"moved".to_vec()]);

    // Refused, nothing changed: into its own subvolume, over another
    // link, over a non-empty directory or a file, a file over a link,
    // with RENAME_NOREPLACE.
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    let full = fs.mkdir(root, b"full", 0o755, 0, 0).unwrap().ino;
    fs.mkdir(full, b"x", 0o755, 0, 0).unwrap();
    let errno = |r: birch::error::Result<()>| r.unwrap_err().errno();
    assert_eq!(
        errno(fs.rename(d, b"moved", inner, b"m", plain)),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs.rename(d, b"moved", root, b"other", plain)),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno(fs.rename(d, b"moved", root, b"full", plain)),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno(fs.rename(d, b"moved", root, b"f", plain)),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(fs.rename(root, b"f", root, b"other", plain)),
        libc::EISDIR
    );
    assert_eq!(
        errno(fs.rename(root, b"full", root, b"other", plain)),
        libc::ENOTEMPTY
    );
    let no_replace = RenameFlags {
        no_replace: true,
        ..plain
    };
    assert_eq!(
        errno(fs.rename(d, b"moved", root, b"full", no_replace)),
        libc::EEXIST
    );
    assert_eq!(errno(fs.unlink(d, b"moved")), libc::EOPNOTSUPP);
    assert_eq!(fs.lookup(d, b"moved").unwrap().ino, sv_root);
    assert_eq!(fs.lookup(root, b"f").unwrap().ino, f);
    // Onto itself: nothing happens.
    fs.rename(d, b"moved", d, b"moved", plain).unwrap();

    // Over an empty directory: it goes.
    let empty = fs.mkdir(root, b"empty", 0o755, 0, 0).unwrap().ino;
    let before = nlink(root);
    fs.rename(d, b"moved", root, b"empty", plain).unwrap();
    assert_eq!(fs.lookup(root, b"empty").unwrap().ino, sv_root);
    assert_eq!(fs.getattr(empty).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(nlink(root), before);
    // A read-only subvolume's link moves (the change is its parent's).
    fs.set_subvolume_readonly(sv, true).unwrap();
    fs.rename(root, b"empty", root, b"ro", plain).unwrap();
    fs.sync().unwrap();
    drop(fs);
    assert_clean(&dev, "after the renames");
    let fs = mount(dev);
    let root = fs.root_ino();
    assert_eq!(fs.lookup(root, b"ro").unwrap().ino, sv_root);
    assert_eq!(fs.lookup(sv_root, b"inner").unwrap().ino, inner);
    assert_eq!(fs.lookup(sv_root, b"..").unwrap().ino, root);
    assert!(fs.lookup(d, b"moved").is_err());
    // rmdir of the moved link deletes it once empty.
    fs.set_subvolume_readonly(sv, false).unwrap();
    fs.rmdir(sv_root, b"inner").unwrap();
    fs.rmdir(root, b"ro").unwrap();
    assert_eq!(fs.deleted_subvolumes(), [sv]);
}

/// Crash case (docs/SNAPSHOTS.md (i)): `subvolume create sv; sync; mv sv
/// sw; fsync .; <cut>` shows `sw`: the fsync committed (counted as
/// `fallback_subvolume`), since a log never copies a link.
#[test]
fn rename_of_subvolume_link_then_fsync_commits() {
    let rec = recorder(32 << 20, 0x69);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let sv = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    fs.mkdir(InoSpace::join(sv, ROOT_DIR_INO), b"inner", 0o755, 0, 0)
        .unwrap();
    fs.sync().unwrap();
    fs.rename(root, b"sv", root, b"sw", RenameFlags::default())
        .unwrap();
    let before = fs.log_stats();
    fs.fsync(root, false).unwrap();
    let after = fs.log_stats();
    assert_eq!(after.fallback_subvolume, before.fallback_subvolume + 1);
    let synced = rec.flush_count();
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::thorough(0x69)) {
        let view = crash_view(&rec, &point);
        assert!(view.contains_key("/sw/inner"), "{point:?}: {view:?}");
        assert!(!view.contains_key("/sv"), "{point:?}: {view:?}");
    }
}

/// Crash case: `subvolume create sv; mkdir d; sync; mv sv d/sw; <cut
/// anywhere in the next commit>` shows the link at exactly one of its
/// names, with its contents, and `birch check` clean (crash_view checks):
/// the DIR_ITEM / DIR_INDEX pair and the ROOT_REF pair move in one
/// transaction.
#[test]
fn power_cut_during_subvolume_rename() {
    let rec = recorder(32 << 20, 0x6a);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let sv = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    fs.mkdir(InoSpace::join(sv, ROOT_DIR_INO), b"inner", 0o755, 0, 0)
        .unwrap();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let synced = rec.flush_count();
    fs.rename(root, b"sv", d, b"sw", RenameFlags::default())
        .unwrap();
    fs.sync().unwrap();
    drop(fs);
    let points = crash_points(&rec, synced, &Enumeration::thorough(0x6a));
    let mut saw = [false; 2];
    for point in &points {
        let view = crash_view(&rec, point);
        let old = view.contains_key("/sv/inner");
        let new = view.contains_key("/d/sw/inner");
        assert!(old != new, "{point:?}: {view:?}");
        saw[new as usize] = true;
    }
    assert_eq!(
        saw,
        [true, true],
        "both outcomes among {} states",
        points.len()
    );
}

/// Crash case: `subvolume create sv; sync; mkdir x; fsync .; mv sv sw;
/// <cut>`: the fsync's log holds the top directory without any link (a
/// log never holds one); replaying it must neither lose `sv` nor leave
/// its ROOT_REF pair dangling: every state shows `sv` whole (the rename
/// was not durable), `x` after the fsync, and checks clean.
#[test]
fn fsync_before_subvolume_rename_keeps_the_link() {
    let rec = recorder(32 << 20, 0x6b);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let sv = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    fs.mkdir(InoSpace::join(sv, ROOT_DIR_INO), b"inner", 0o755, 0, 0)
        .unwrap();
    fs.sync().unwrap();
    fs.mkdir(root, b"x", 0o755, 0, 0).unwrap();
    fs.fsync(root, false).unwrap();
    let synced = rec.flush_count();
    fs.rename(root, b"sv", root, b"sw", RenameFlags::default())
        .unwrap();
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::thorough(0x6b)) {
        let view = crash_view(&rec, &point);
        assert!(view.contains_key("/x"), "{point:?}: {view:?}");
        let old = view.contains_key("/sv/inner");
        let new = view.contains_key("/sw/inner");
        assert!(old != new, "{point:?}: {view:?}");
    }
}

/// A subvolume link moves into a directory of another subvolume, as in
/// btrfs (`btrfs_rename` refuses only other inodes across roots): its
/// ROOT_REF pair names the new parent subvolume, `..` and the list
/// follow it, nested links come along, and the parent it left may be
/// deleted while the one it joined may not. Into its own subtree is
/// EINVAL (the VFS's trap, across links), into a read-only subvolume
/// EROFS, a plain file over a link across subvolumes EXDEV.
#[test]
fn rename_of_subvolume_link_across_subvolumes() {
    let dev = memory_fs(32 << 20, 0x6c);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let sv = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let other = fs.create_subvolume(root, b"other", 0, 0).unwrap();
    let ro = fs.create_subvolume(root, b"ro", 0, 0).unwrap();
    let [sv_root, other_root, ro_root] = [sv, other, ro].map(|id| InoSpace::join(id, ROOT_DIR_INO));
    let inner = fs.mkdir(sv_root, b"inner", 0o755, 0, 0).unwrap().ino;
    let nested = fs.create_subvolume(sv_root, b"nested", 0, 0).unwrap();
    let nested_root = InoSpace::join(nested, ROOT_DIR_INO);
    let dir = fs.mkdir(other_root, b"dir", 0o755, 0, 0).unwrap().ino;
    fs.create(root, b"f", 0o644, 0, 0).unwrap();
    fs.mkdir(dir, b"link_here", 0o755, 0, 0).unwrap();
    fs.set_subvolume_readonly(ro, true).unwrap();
    let nlink = |ino| fs.getattr(ino).unwrap().nlink;
    let (root_nlink, dir_nlink) = (nlink(root), nlink(dir));
    let plain = RenameFlags::default();
    let errno = |r: birch::error::Result<()>| r.unwrap_err().errno();

    // Over an empty directory of the other subvolume.
    fs.rename(root, b"sv", dir, b"link_here", plain).unwrap();
    assert_eq!(fs.lookup(dir, b"link_here").unwrap().ino, sv_root);
    assert_eq!(fs.lookup(root, b"sv").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(fs.lookup(sv_root, b"..").unwrap().ino, dir);
    assert_eq!(fs.lookup(sv_root, b"inner").unwrap().ino, inner);
    assert_eq!(fs.lookup(sv_root, b"nested").unwrap().ino, nested_root);
    assert_eq!((nlink(root), nlink(dir)), (root_nlink - 1, dir_nlink));
    let listed = fs.list_subvolumes().unwrap();
    let entry = listed.iter().find(|i| i.id == sv).unwrap();
    assert_eq!(
        (entry.parent, entry.dir, entry.name.as_slice()),
        (other, InoSpace::split(dir).1, &b"link_here"[..])
    );
    // `other` holds a link now: not deletable (btrfs's ENOTEMPTY).
    assert_eq!(
        fs.delete_subvolume(root, b"other").unwrap_err().errno(),
        libc::ENOTEMPTY
    );

    // Refused, nothing changed.
    assert_eq!(
        errno(fs.rename(dir, b"link_here", inner, b"x", plain)),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs.rename(dir, b"link_here", nested_root, b"x", plain)),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs.rename(dir, b"link_here", ro_root, b"x", plain)),
        libc::EROFS
    );
    assert_eq!(
        errno(fs.rename(root, b"f", dir, b"link_here", plain)),
        libc::EXDEV
    );
    assert_eq!(fs.lookup(dir, b"link_here").unwrap().ino, sv_root);

    // And back to the top level, under a new name.
    fs.rename(dir, b"link_here", root, b"back", plain).unwrap();
    assert_eq!(fs.lookup(sv_root, b"..").unwrap().ino, root);
    assert_eq!(nlink(root), root_nlink);
    assert_eq!(nlink(dir), dir_nlink - 1);
    fs.sync().unwrap();
    drop(fs);
    assert_clean(&dev, "after the moves");
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    assert_eq!(fs.lookup(root, b"back").unwrap().ino, sv_root);
    assert_eq!(fs.lookup(sv_root, b"nested").unwrap().ino, nested_root);
    assert_eq!(fs.delete_subvolume(root, b"other").unwrap(), other);
}

/// RENAME_EXCHANGE with a subvolume link, as `btrfs_rename_exchange`:
/// within one subvolume a link swaps with any entry (a file, a
/// directory, another link); across subvolumes only two links swap
/// (anything else EXDEV); a directory exchanged with its own ancestor is
/// EINVAL, a missing target ENOENT.
#[test]
fn exchange_with_subvolume_link() {
    let dev = memory_fs(32 << 20, 0x6d);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let a = fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let b = fs.create_subvolume(root, b"b", 0, 0).unwrap();
    let [a_root, b_root] = [a, b].map(|id| InoSpace::join(id, ROOT_DIR_INO));
    let c = fs.create_subvolume(b_root, b"c", 0, 0).unwrap();
    let c_root = InoSpace::join(c, ROOT_DIR_INO);
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    let e = fs.mkdir(d, b"e", 0o755, 0, 0).unwrap().ino;
    fs.create(e, b"in_e", 0o644, 0, 0).unwrap();
    let g = fs.create(b_root, b"g", 0o644, 0, 0).unwrap().ino;
    let exchange = RenameFlags {
        exchange: true,
        ..RenameFlags::default()
    };
    let errno = |r: birch::error::Result<()>| r.unwrap_err().errno();
    let nlink = |ino| fs.getattr(ino).unwrap().nlink;
    let (root_nlink, d_nlink) = (nlink(root), nlink(d));

    // A link and a file of one subvolume, in two directories.
    fs.rename(root, b"a", d, b"f", exchange).unwrap();
    assert_eq!(fs.lookup(root, b"a").unwrap().ino, f);
    assert_eq!(fs.lookup(d, b"f").unwrap().ino, a_root);
    assert_eq!(fs.lookup(a_root, b"..").unwrap().ino, d);
    assert_eq!((nlink(root), nlink(d)), (root_nlink - 1, d_nlink + 1));
    // A link and a non-empty directory: both move, contents and all.
    fs.rename(d, b"f", d, b"e", exchange).unwrap();
    assert_eq!(fs.lookup(d, b"e").unwrap().ino, a_root);
    assert_eq!(fs.lookup(d, b"f").unwrap().ino, e);
    assert!(fs.lookup(e, b"in_e").is_ok());
    assert_eq!(nlink(d), d_nlink + 1);
    // Two links of two subvolumes: `a` (in the top level) and `c` (in b).
    fs.rename(d, b"e", b_root, b"c", exchange).unwrap();
    assert_eq!(fs.lookup(d, b"e").unwrap().ino, c_root);
    assert_eq!(fs.lookup(b_root, b"c").unwrap().ino, a_root);
    assert_eq!(fs.lookup(a_root, b"..").unwrap().ino, b_root);
    assert_eq!(fs.lookup(c_root, b"..").unwrap().ino, d);
    let listed = fs.list_subvolumes().unwrap();
    let parent_of = |id| listed.iter().find(|i| i.id == id).unwrap().parent;
    assert_eq!((parent_of(a), parent_of(c)), (b, tree_id::FS));

    // Refused, nothing changed: a link and a file (either way round)
    // across subvolumes, `b` with the link inside it (its own
    // descendant), a missing target.
    assert_eq!(
        errno(fs.rename(d, b"e", b_root, b"g", exchange)),
        libc::EXDEV
    );
    assert_eq!(
        errno(fs.rename(b_root, b"g", d, b"e", exchange)),
        libc::EXDEV
    );
    assert_eq!(
        errno(fs.rename(root, b"b", b_root, b"c", exchange)),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs.rename(b_root, b"c", root, b"b", exchange)),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs.rename(d, b"e", d, b"none", exchange)),
        libc::ENOENT
    );
    assert_eq!(fs.lookup(b_root, b"g").unwrap().ino, g);
    // Onto itself: nothing happens.
    fs.rename(d, b"e", d, b"e", exchange).unwrap();
    fs.sync().unwrap();
    drop(fs);
    assert_clean(&dev, "after the exchanges");
    let fs = mount(dev);
    assert_eq!(fs.lookup(d, b"e").unwrap().ino, c_root);
    assert_eq!(fs.lookup(b_root, b"c").unwrap().ino, a_root);
    assert_eq!(fs.lookup(d, b"f").unwrap().ino, e);
    assert_eq!(fs.lookup(fs.root_ino(), b"a").unwrap().ino, f);
}

/// Crash case: `subvolume create sv; subvolume create other; mkdir
/// sv/inner; sync; mv sv other/sw; sync <cut anywhere in that commit>`
/// shows the link at exactly one of its names, in one of the two
/// subvolumes, with its contents, and checks clean: both directories'
/// entries and the ROOT_REF pair (now keyed by the other parent) change
/// in one transaction.
#[test]
fn power_cut_during_cross_subvolume_move() {
    let rec = recorder(32 << 20, 0x6e);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let sv = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let other = fs.create_subvolume(root, b"other", 0, 0).unwrap();
    fs.mkdir(InoSpace::join(sv, ROOT_DIR_INO), b"inner", 0o755, 0, 0)
        .unwrap();
    fs.sync().unwrap();
    let synced = rec.flush_count();
    let other_root = InoSpace::join(other, ROOT_DIR_INO);
    fs.rename(root, b"sv", other_root, b"sw", RenameFlags::default())
        .unwrap();
    fs.sync().unwrap();
    drop(fs);
    let points = crash_points(&rec, synced, &Enumeration::thorough(0x6e));
    let mut saw = [false; 2];
    for point in &points {
        let view = crash_view(&rec, point);
        let old = view.contains_key("/sv/inner");
        let new = view.contains_key("/other/sw/inner");
        assert!(old != new, "{point:?}: {view:?}");
        saw[new as usize] = true;
    }
    assert_eq!(
        saw,
        [true, true],
        "both outcomes among {} states",
        points.len()
    );
}

/// Crash case: `subvolume create sv; subvolume create other; sync; mkdir
/// other/x; fsync other; mv sv other/sw; fsync other; <cut>`: the first
/// fsync logs `other`'s root directory; the second commits (counted as
/// `fallback_subvolume`: a log never holds a link, nor may a replayed
/// log of `other` drop the link the commit put there). Every state after
/// it shows `/other/x` and `/other/sw` whole, and no `/sv`.
#[test]
fn fsync_after_cross_subvolume_move_commits() {
    let rec = recorder(32 << 20, 0x6f);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let sv = fs.create_subvolume(root, b"sv", 0, 0).unwrap();
    let other = fs.create_subvolume(root, b"other", 0, 0).unwrap();
    let other_root = InoSpace::join(other, ROOT_DIR_INO);
    fs.mkdir(InoSpace::join(sv, ROOT_DIR_INO), b"inner", 0o755, 0, 0)
        .unwrap();
    fs.sync().unwrap();
    fs.mkdir(other_root, b"x", 0o755, 0, 0).unwrap();
    fs.fsync(other_root, false).unwrap();
    fs.rename(root, b"sv", other_root, b"sw", RenameFlags::default())
        .unwrap();
    let before = fs.log_stats();
    fs.fsync(other_root, false).unwrap();
    assert_eq!(
        fs.log_stats().fallback_subvolume,
        before.fallback_subvolume + 1
    );
    let synced = rec.flush_count();
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::thorough(0x6f)) {
        let view = crash_view(&rec, &point);
        assert!(view.contains_key("/other/x"), "{point:?}: {view:?}");
        assert!(view.contains_key("/other/sw/inner"), "{point:?}: {view:?}");
        assert!(!view.contains_key("/sv"), "{point:?}: {view:?}");
    }
}

/// Crash case: `subvolume create a; subvolume create b; subvolume create
/// b/c; mkdir a/in_a c/in_c; sync; mv --exchange a b/c; sync <cut
/// anywhere in that commit>`: every state shows both links swapped or
/// neither (never one subvolume at two names or none), and checks clean.
#[test]
fn power_cut_during_subvolume_exchange() {
    let rec = recorder(32 << 20, 0x70);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let a = fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let b = fs.create_subvolume(root, b"b", 0, 0).unwrap();
    let b_root = InoSpace::join(b, ROOT_DIR_INO);
    let c = fs.create_subvolume(b_root, b"c", 0, 0).unwrap();
    for (id, name) in [(a, b"in_a"), (c, b"in_c")] {
        fs.mkdir(InoSpace::join(id, ROOT_DIR_INO), name, 0o755, 0, 0)
            .unwrap();
    }
    fs.sync().unwrap();
    let synced = rec.flush_count();
    let exchange = RenameFlags {
        exchange: true,
        ..RenameFlags::default()
    };
    fs.rename(root, b"a", b_root, b"c", exchange).unwrap();
    fs.sync().unwrap();
    drop(fs);
    let points = crash_points(&rec, synced, &Enumeration::thorough(0x70));
    let mut saw = [false; 2];
    for point in &points {
        let view = crash_view(&rec, point);
        let before = view.contains_key("/a/in_a") && view.contains_key("/b/c/in_c");
        let after = view.contains_key("/a/in_c") && view.contains_key("/b/c/in_a");
        assert!(before != after, "{point:?}: {view:?}");
        saw[after as usize] = true;
    }
    assert_eq!(
        saw,
        [true, true],
        "both outcomes among {} states",
        points.len()
    );
}
