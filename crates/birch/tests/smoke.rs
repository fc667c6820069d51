use birch::device::MemoryDevice;
use birch::fs::{Filesystem, MkfsOptions, MountOptions, RenameFlags};
use std::sync::Arc;

#[test]
fn mkfs_write_close_reopen_reads_back() {
    let dev = Arc::new(MemoryDevice::new(64 << 20));
    Filesystem::mkfs(&dev, &MkfsOptions::default()).unwrap();
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"dir", 0o755, 0, 0).unwrap();
    let f = fs.create(d.ino, b"file", 0o644, 0, 0).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    fs.write_file(f.ino, 0, &data).unwrap();
    fs.write_file(f.ino, 5000, b"hello").unwrap();
    let small = fs.create(root, b"small", 0o644, 0, 0).unwrap();
    fs.write_file(small.ino, 0, b"tiny").unwrap();
    fs.symlink(root, b"link", b"dir/file", 0, 0).unwrap();
    fs.rename(d.ino, b"file", root, b"moved", RenameFlags::default())
        .unwrap();
    for i in 0..500 {
        fs.create(d.ino, format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
    }
    fs.sync().unwrap();
    for i in 0..500 {
        if i % 3 == 0 {
            fs.unlink(d.ino, format!("f{i}").as_bytes()).unwrap();
        }
    }
    fs.close().unwrap();

    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let moved = fs.lookup(root, b"moved").unwrap();
    let mut expect = data.clone();
    expect[5000..5005].copy_from_slice(b"hello");
    assert_eq!(fs.read_file(moved.ino, 0, 200_000).unwrap(), expect);
    assert_eq!(fs.read_file(small.ino, 0, 100).unwrap(), b"tiny");
    assert_eq!(
        fs.readlink(fs.lookup(root, b"link").unwrap().ino).unwrap(),
        b"dir/file"
    );
    let entries = fs.readdir(d.ino, 0, usize::MAX).unwrap();
    assert_eq!(entries.len(), 500 - 167);
    assert_eq!(fs.getattr(root).unwrap().nlink, 3);
    fs.close().unwrap();
}

/// generic/676 in the engine: a listing continued from any offset starts
/// at the first entry whose dir index is at least that offset, whether
/// the offset is one handed out (`next_offset`), between two of them,
/// below the first or past the last; committed entries and ones still in
/// the delayed dir-index items alike.
#[test]
fn readdir_from_any_offset_continues_with_the_next_entry() {
    let dev = Arc::new(MemoryDevice::new(64 << 20));
    Filesystem::mkfs(&dev, &MkfsOptions::default()).unwrap();
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    for i in 0..60 {
        fs.create(d, format!("f{i:02}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        if i == 30 {
            // The first half committed, the rest delayed items.
            fs.sync().unwrap();
        }
    }
    // Gaps between the indexes left, committed and delayed.
    for i in (0..60).step_by(7) {
        fs.unlink(d, format!("f{i:02}").as_bytes()).unwrap();
    }
    let all = fs.readdir(d, 0, usize::MAX).unwrap();
    assert_eq!(all.len(), 60 - 9);
    let last = all.last().unwrap().next_offset;
    for offset in 0..last + 100 {
        let expected: Vec<_> = all
            .iter()
            .filter(|e| e.next_offset > offset)
            .take(3)
            .collect();
        let got = fs.readdir(d, offset, 3).unwrap();
        assert_eq!(got.iter().collect::<Vec<_>>(), expected, "from {offset}");
    }
    for offset in [last, last + 1, 1 << 40, u64::MAX] {
        assert!(
            fs.readdir(d, offset, 3).unwrap().is_empty(),
            "from {offset}"
        );
    }
    fs.close().unwrap();
}

/// docs/MEMORY.md: `release_memory` shrinks the node cache to its idle
/// size and frees the spare page buffers; the filesystem reads on as
/// before (the nodes come back from disk).
#[test]
fn release_memory_shrinks_the_node_cache_to_its_idle_size() {
    let dev = Arc::new(MemoryDevice::new(64 << 20));
    Filesystem::mkfs(&dev, &MkfsOptions::default()).unwrap();
    let options = MountOptions {
        idle_cache_nodes: 2,
        ..MountOptions::deterministic()
    };
    let fs = Filesystem::open(dev.clone(), options.clone()).unwrap();
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    for i in 0..2000 {
        let f = fs
            .create(d, format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.write_file(f.ino, 0, &[i as u8; 5000]).unwrap();
    }
    fs.close().unwrap();
    // Read back from disk: the nodes go through the cache.
    let fs = Filesystem::open(dev.clone(), options).unwrap();
    let d = fs.lookup(fs.root_ino(), b"d").unwrap().ino;
    let read_all = || {
        for i in (0..2000).step_by(7) {
            let f = fs.lookup(d, format!("f{i}").as_bytes()).unwrap().ino;
            assert_eq!(fs.read_file(f, 0, 5000).unwrap(), vec![i as u8; 5000]);
        }
    };
    read_all();
    let busy = fs.memory_stats();
    assert!(busy.node_cache_nodes > 2, "{busy:?}");
    assert_eq!(busy.node_cache_idle, 2);
    assert_eq!(busy.releases, 0);
    fs.release_memory();
    let idle = fs.memory_stats();
    assert_eq!(idle.node_cache_nodes, 2, "{idle:?}");
    assert_eq!(idle.spare_pages, 0);
    assert_eq!(idle.releases, 1);
    assert_eq!(idle.node_cache_limit, busy.node_cache_limit);
    read_all();
    fs.close().unwrap();
}
