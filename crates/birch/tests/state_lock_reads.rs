//! Read-only requests read their node cache misses without the state lock
//! (docs/SNAPSHOTS.md (f), "How device I/O leaves the state lock"): the
//! miss ends the request's run, the node is read with the lock dropped and
//! the request runs again. These tests mount a tree much larger than the
//! node cache and check that no read-only request read a node under the
//! lock, that the reruns are not visible, and that a node that keeps
//! missing falls back to a read under the lock instead of looping.

mod common;

use birch::device::MemoryDevice;
use birch::fs::{Filesystem, MountOptions};
use birch::Error;
use std::sync::Arc;

const DIRS: usize = 20;
const FILES_PER_DIR: usize = 150;

/// A filesystem holding `DIRS` directories of `FILES_PER_DIR` small files
/// (about a hundred nodes), committed and closed: the next mount starts with
/// a cold node cache.
fn big_tree() -> Arc<MemoryDevice> {
    let dev = common::memory_fs(256 << 20, 0x5e);
    let fs = common::mount(dev.clone());
    for d in 0..DIRS {
        let dir = fs
            .mkdir(fs.root_ino(), format!("dir{d}").as_bytes(), 0o755, 0, 0)
            .unwrap();
        for f in 0..FILES_PER_DIR {
            let file = fs
                .create(dir.ino, format!("file{f:04}").as_bytes(), 0o644, 0, 0)
                .unwrap();
            fs.write_file(file.ino, 0, format!("{d}/{f}").as_bytes())
                .unwrap();
        }
    }
    fs.close().unwrap();
    dev
}

/// Mounts `dev` with a node cache of `cache_nodes`.
fn mount_cold(dev: &Arc<MemoryDevice>, cache_nodes: usize) -> Filesystem<Arc<MemoryDevice>> {
    Filesystem::open(
        dev.clone(),
        MountOptions {
            cache_nodes,
            idle_cache_nodes: cache_nodes,
            ..MountOptions::deterministic()
        },
    )
    .unwrap()
}

/// Lists, looks up, stats and reads every file: the read-only requests a
/// `find`, `du` and `cat` of the tree make.
fn walk(fs: &Filesystem<Arc<MemoryDevice>>) -> usize {
    let mut files = 0;
    for top in fs.readdir(fs.root_ino(), 0, usize::MAX).unwrap() {
        let dir = fs.lookup(fs.root_ino(), &top.name).unwrap();
        let mut offset = 0;
        loop {
            let page = fs.readdir(dir.ino, offset, 32).unwrap();
            let Some(last) = page.last() else { break };
            offset = last.next_offset;
            for entry in &page {
                let attr = fs.lookup(dir.ino, &entry.name).unwrap();
                assert_eq!(fs.getattr(entry.ino).unwrap().size, attr.size);
                let data = fs.read_file(attr.ino, 0, 4096).unwrap();
                let name = String::from_utf8(entry.name.clone()).unwrap();
                let dir_name = String::from_utf8(top.name.clone()).unwrap();
                let want = format!(
                    "{}/{}",
                    &dir_name["dir".len()..],
                    name["file".len()..].parse::<usize>().unwrap()
                );
                assert_eq!(data, want.as_bytes(), "{dir_name}/{name}");
                files += 1;
            }
        }
    }
    files
}

#[test]
fn cold_read_only_requests_read_no_node_under_the_state_lock() {
    let dev = big_tree();
    let fs = mount_cold(&dev, 16);
    let before = fs.stats();
    assert_eq!(walk(&fs), DIRS * FILES_PER_DIR);
    let after = fs.stats();
    assert_eq!(
        after.node_reads_locked, before.node_reads_locked,
        "read-only requests read nodes under the state lock: {after:?}"
    );
    assert!(
        after.node_reads_unlocked > before.node_reads_unlocked + 50,
        "the walk should miss the 16-node cache once per leaf at least: {after:?}"
    );
    assert!(after.read_reruns > 50, "{after:?}");
    assert_eq!(after.read_rerun_fallbacks, 0, "{after:?}");
    fs.close().unwrap();
}

#[test]
fn a_rerun_open_takes_one_hold() {
    let dev = big_tree();
    let (ino, dir) = {
        let fs = common::mount(dev.clone());
        let dir = fs.lookup(fs.root_ino(), b"dir7").unwrap().ino;
        let ino = fs.lookup(dir, b"file0099").unwrap().ino;
        fs.close().unwrap();
        (ino, dir)
    };
    let fs = mount_cold(&dev, 16);
    let reruns = fs.stats().read_reruns;
    // Cold: the inode's leaf is not cached, so the open runs again after
    // reading it; the hold it takes must be one.
    fs.open_inode(ino).unwrap();
    assert!(fs.stats().read_reruns > reruns, "the open did not miss");
    fs.unlink(dir, b"file0099").unwrap();
    assert_eq!(fs.getattr(ino).unwrap().nlink, 0, "open: it lives on");
    fs.release(ino).unwrap();
    assert!(
        matches!(fs.getattr(ino), Err(Error::NotFound)),
        "the one release should free the orphan"
    );
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the orphan's release");
}

#[test]
fn a_cache_smaller_than_a_path_falls_back_to_reading_under_the_lock() {
    let dev = big_tree();
    // Two nodes cannot hold a lookup's path (root tree, fs tree root,
    // leaves): every rerun evicts what the last one read.
    let fs = mount_cold(&dev, 2);
    let dir = fs.lookup(fs.root_ino(), b"dir13").unwrap();
    for f in [0, 75, 149] {
        let file = fs
            .lookup(dir.ino, format!("file{f:04}").as_bytes())
            .unwrap();
        assert_eq!(
            fs.read_file(file.ino, 0, 100).unwrap(),
            format!("13/{f}").as_bytes()
        );
    }
    let stats = fs.stats();
    assert!(stats.read_rerun_fallbacks > 0, "{stats:?}");
    assert!(stats.node_reads_locked > 0, "{stats:?}");
    fs.close().unwrap();
}
