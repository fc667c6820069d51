//! Subvolumes through the library (docs/SNAPSHOTS.md, step 6 of (j)):
//! create, list, lookup and readdir across a link, external inode
//! numbers, EXDEV across subvolumes, read-only subvolumes, and a power
//! cut during a create.

mod common;

use birch::check::check_device;
use birch::check::fixture::sample;
use birch::device::MemoryDevice;
use birch::error::Error;
use birch::format::{tree_id, FileType, ROOT_DIR_INO, SUBVOL_RDONLY};
use birch::fs::{Filesystem, InoSpace, MountOptions, RenameFlags};
use common::{crash_points, crash_view, memory_fs, mount, recorder, Enumeration};
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

/// Crash case: `subvolume create a; write a/f; fsync a/f; <cut>` shows
/// `a/f`. Until each subvolume has its own log (step 7) the fsync commits
/// (a counted fallback).
#[test]
fn fsync_in_subvolume_survives_power_cut() {
    let rec = recorder(32 << 20, 0x66);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    fs.create_subvolume(root, b"a", 0, 0).unwrap();
    let a = fs.lookup(root, b"a").unwrap().ino;
    let d = fs.mkdir(a, b"d", 0o755, 0, 0).unwrap().ino;
    let before = fs.log_stats().fallback_subvolume;
    fs.fsync(d, false).unwrap();
    assert_eq!(fs.log_stats().fallback_subvolume, before + 1);
    let synced = rec.flush_count();
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::thorough(0x66)) {
        let view = crash_view(&rec, &point);
        assert!(view.contains_key("/a/d"), "{point:?}: {view:?}");
    }
}
