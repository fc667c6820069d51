//! Read-only requests read their node cache misses without the state lock
//! (docs/SNAPSHOTS.md (f), "How device I/O leaves the state lock"): the
//! miss ends the request's run, the node is read with the lock dropped and
//! the request runs again. These tests mount a tree much larger than the
//! node cache and check that no read-only request read a node under the
//! lock, that the reruns are not visible, and that a node that keeps
//! missing falls back to a read under the lock instead of looping.

mod common;

use birch::device::{DeviceEvent, MemoryDevice, RecordingDevice};
use birch::fs::{CompressOption, FallocateMode, Filesystem, MountOptions};
use birch::Error;
use common::{Enumeration, View};
use std::collections::BTreeSet;
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

const PAGE: usize = 4096;

/// Device writes recorded so far.
fn writes(rec: &RecordingDevice) -> usize {
    rec.events()
        .iter()
        .filter(|e| matches!(e, DeviceEvent::Write { .. }))
        .count()
}

/// A file `a` whose data is one inline extent of 100 bytes (committed),
/// grown by a truncate to `3 * PAGE`: a reflink, collapse or insert range
/// of it must make the inline extent regular first. Returns the
/// filesystem, `a`, an empty committed file `b`, and what `a` holds.
fn grown_inline_file(
    rec: &Arc<RecordingDevice>,
) -> (Filesystem<Arc<RecordingDevice>>, u64, u64, Vec<u8>) {
    let fs = common::mount(rec.clone());
    let a = fs.create(fs.root_ino(), b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
    let inline: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(7) | 1).collect();
    fs.write_file(a, 0, &inline).unwrap();
    fs.sync().unwrap();
    fs.truncate(a, 3 * PAGE as u64).unwrap();
    let mut want = inline;
    want.resize(3 * PAGE, 0);
    (fs, a, b, want)
}

/// docs/DELALLOC.md, "An inline extent made regular": the reflink makes
/// `a`'s inline extent a regular one without writing anything (no device
/// write during the copy; it failed before, when the extent was written
/// under the state lock), both files read its bytes from memory, and the
/// commit writes them.
#[test]
fn reflink_of_an_inline_file_writes_nothing_under_the_state_lock() {
    let rec = common::recorder(64 << 20, 0x71);
    let (fs, a, b, want) = grown_inline_file(&rec);
    let before = writes(&rec);
    let len = want.len() as u64;
    assert_eq!(fs.copy_file_range(a, 0, b, 0, len).unwrap(), len);
    assert_eq!(writes(&rec), before, "the reflink wrote to the device");
    assert_eq!(fs.stats().inline_reflink_unwritten, 1);
    assert!(fs.read_file(a, 0, 1 << 20).unwrap() == want, "a");
    assert!(fs.read_file(b, 0, 1 << 20).unwrap() == want, "b");
    fs.sync().unwrap();
    std::mem::forget(fs);
    let committed = rec.flush_count();
    common::for_every_crash_after(&rec, committed, &Enumeration::thorough(1), |v| {
        common::require_content(v, "/a", &want)?;
        common::require_content(v, "/b", &want)
    });
}

/// The states a power cut may leave of `a` (`old`: before the change;
/// `new`: after) and `b`, from flush `from` on; from flush `durable` on,
/// only the new ones.
fn crash_states(
    rec: &RecordingDevice,
    (from, durable): (usize, usize),
    a: (&[u8], &[u8]),
    b: (&[u8], &[u8]),
) {
    let either = |v: &View, path: &str, (old, new): (&[u8], &[u8])| {
        common::require_content(v, path, new).or_else(|_| common::require_content(v, path, old))
    };
    common::for_every_crash_after(rec, from, &Enumeration::sampled(from as u64), |v| {
        either(v, "/a", a)?;
        either(v, "/b", b)
    });
    common::for_every_crash_after(rec, durable, &Enumeration::thorough(durable as u64), |v| {
        common::require_content(v, "/a", a.1)?;
        common::require_content(v, "/b", b.1)
    });
}

#[test]
fn inline_extent_reflinked_then_fsync() {
    let rec = common::recorder(64 << 20, 0x72);
    let (fs, a, b, want) = grown_inline_file(&rec);
    let from = rec.flush_count();
    let len = want.len() as u64;
    fs.copy_file_range(a, 0, b, 0, len).unwrap();
    fs.fsync(b, false).unwrap();
    fs.fsync(a, false).unwrap();
    let durable = rec.flush_count();
    std::mem::forget(fs);
    let old_a = &want[..100];
    crash_states(&rec, (from, durable), (old_a, &want), (b"", &want));
}

#[test]
fn inline_extent_reflinked_then_sync() {
    let rec = common::recorder(64 << 20, 0x73);
    let (fs, a, b, want) = grown_inline_file(&rec);
    let from = rec.flush_count();
    let len = want.len() as u64;
    fs.copy_file_range(a, 0, b, 0, len).unwrap();
    fs.sync().unwrap();
    let durable = rec.flush_count();
    std::mem::forget(fs);
    crash_states(&rec, (from, durable), (&want[..100], &want), (b"", &want));
}

#[test]
fn inline_extent_collapsed_then_fsync() {
    let rec = common::recorder(64 << 20, 0x74);
    let (fs, a, _, want) = grown_inline_file(&rec);
    let from = rec.flush_count();
    fs.fallocate(a, PAGE as u64, PAGE as u64, FallocateMode::CollapseRange)
        .unwrap();
    assert_eq!(fs.stats().inline_reflink_unwritten, 1);
    let collapsed = &want[..2 * PAGE];
    assert!(fs.read_file(a, 0, 1 << 20).unwrap() == collapsed);
    fs.fsync(a, false).unwrap();
    let durable = rec.flush_count();
    std::mem::forget(fs);
    crash_states(&rec, (from, durable), (&want[..100], collapsed), (b"", b""));
}

/// A device that, once armed with a device offset, stops the first read
/// there until released: a write's read of its partial page paused
/// between its plan (under the state lock) and the change.
struct PauseReadAt {
    inner: Arc<RecordingDevice>,
    armed: std::sync::Mutex<Option<u64>>,
    paused: std::sync::mpsc::SyncSender<()>,
    resume: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl birch::device::BlockDevice for PauseReadAt {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let pause = {
            let mut armed = self.armed.lock().unwrap();
            let hit = *armed == Some(offset);
            if hit {
                *armed = None;
            }
            hit
        };
        if pause {
            self.paused.send(()).unwrap();
            self.resume.lock().unwrap().recv().unwrap();
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// A committed file `f` of 8 pages of `pattern(_, 1)`, none in memory,
/// on a recording device that pauses reads when armed; with the channels
/// that announce a pause and end it.
struct CommittedFile {
    fs: Filesystem<Arc<PauseReadAt>>,
    f: u64,
    dev: Arc<PauseReadAt>,
    paused: std::sync::mpsc::Receiver<()>,
    resume: std::sync::mpsc::Sender<()>,
}

fn committed_file() -> CommittedFile {
    let (paused_tx, paused) = std::sync::mpsc::sync_channel(1);
    let (resume, resume_rx) = std::sync::mpsc::channel();
    let dev = Arc::new(PauseReadAt {
        inner: common::recorder(64 << 20, 0x75),
        armed: std::sync::Mutex::new(None),
        paused: paused_tx,
        resume: std::sync::Mutex::new(resume_rx),
    });
    let fs = common::mount(dev.clone());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_file(f, 0, &pattern(8 * PAGE, 1)).unwrap();
    fs.sync().unwrap();
    CommittedFile {
        fs,
        f,
        dev,
        paused,
        resume,
    }
}

/// docs/SNAPSHOTS.md (f) item 5: writes that cover their first or last
/// page in part, to a file whose pages are on disk only, read those pages
/// without the state lock (none under it: this failed before, every such
/// page was read under the lock) and keep the rest of each page.
#[test]
fn unaligned_writes_read_partial_pages_without_the_state_lock() {
    let CommittedFile { fs, f, .. } = committed_file();
    let before = fs.stats();
    let mut want = pattern(8 * PAGE, 1);
    // Inside one page; across pages 3..5 with both ends partial; the
    // last page's tail.
    for (at, len, seed) in [
        (2 * PAGE + 10, 100, 2),
        (3 * PAGE + 7, 2 * PAGE, 3),
        (8 * PAGE - 5, 5, 4),
    ] {
        let data = pattern(len, seed);
        assert_eq!(fs.write_file(f, at as u64, &data).unwrap(), len);
        want[at..at + len].copy_from_slice(&data);
    }
    let after = fs.stats();
    assert_eq!(
        after.partial_page_reads_locked, before.partial_page_reads_locked,
        "{after:?}"
    );
    // Pages 2, 3, 5 and 7 (page 2 once: dirty after the first write).
    assert_eq!(
        after.partial_page_reads_unlocked - before.partial_page_reads_unlocked,
        4,
        "{after:?}"
    );
    assert_eq!(after.partial_page_rereads, 0, "{after:?}");
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
    fs.sync().unwrap();
    assert!(
        fs.read_file(f, 0, 1 << 20).unwrap() == want,
        "after the commit"
    );
}

/// Runs `write 100 bytes at 2p+10` of `f` on its own thread with the read
/// of page 2 paused `rounds` times; each time, while it is paused,
/// `meanwhile` changes page 2 (the round number given) and the read is
/// released. Returns the write's bytes.
fn write_racing_page_changes(
    rounds: u8,
    meanwhile: impl Fn(&Filesystem<Arc<PauseReadAt>>, u64, u8),
) -> (Filesystem<Arc<PauseReadAt>>, u64, Vec<u8>) {
    let data = pattern(100, 9);
    let (fs, f, _) = racing_page_changes(
        2,
        rounds,
        |fs, f| {
            assert_eq!(
                fs.write_file(f, 2 * PAGE as u64 + 10, &data).unwrap(),
                data.len()
            )
        },
        meanwhile,
    );
    (fs, f, data)
}

/// Runs `change` of the committed file `f` on its own thread with its
/// read of page `index` paused `rounds` times; each time, while it is
/// paused, `meanwhile` changes the page (the round number given) and the
/// read is released.
fn racing_page_changes(
    index: u64,
    rounds: u8,
    change: impl FnOnce(&Filesystem<Arc<PauseReadAt>>, u64) + Send,
    meanwhile: impl Fn(&Filesystem<Arc<PauseReadAt>>, u64, u8),
) -> (Filesystem<Arc<PauseReadAt>>, u64, Arc<PauseReadAt>) {
    let CommittedFile {
        fs,
        f,
        dev,
        paused: paused_rx,
        resume: resume_tx,
    } = committed_file();
    let arm = |fs: &Filesystem<Arc<PauseReadAt>>| {
        let at = fs.device_byte(f, index * PAGE as u64).unwrap();
        *dev.armed.lock().unwrap() = Some(at.expect("the page is on disk"));
    };
    arm(&fs);
    let fs_ref = &fs;
    std::thread::scope(|scope| {
        let changing = scope.spawn(move || change(fs_ref, f));
        for round in 0..rounds {
            // Not a synchronisation: a guard against hanging should the
            // change not read the page where it was armed.
            paused_rx
                .recv_timeout(std::time::Duration::from_secs(120))
                .expect("the change never read its partial page");
            meanwhile(fs_ref, f, round);
            if round + 1 < rounds {
                arm(fs_ref);
            }
            resume_tx.send(()).unwrap();
        }
        changing.join().unwrap();
    });
    (fs, f, dev)
}

/// Page 2 rewritten whole and written back to a new extent while the
/// write's read of it is paused: the change sees other extents than the
/// ones read, reads again, and writes over the new bytes.
#[test]
fn a_page_rewritten_between_the_read_and_the_change_is_read_again() {
    let (fs, f, data) = write_racing_page_changes(1, |fs, f, _| {
        fs.write_file(f, 2 * PAGE as u64, &pattern(PAGE, 5))
            .unwrap();
        fs.fsync(f, false).unwrap();
    });
    let mut want = pattern(8 * PAGE, 1);
    want[2 * PAGE..3 * PAGE].copy_from_slice(&pattern(PAGE, 5));
    want[2 * PAGE + 10..2 * PAGE + 110].copy_from_slice(&data);
    let stats = fs.stats();
    assert_eq!(stats.partial_page_rereads, 1, "{stats:?}");
    assert_eq!(stats.partial_page_reads_unlocked, 1, "{stats:?}");
    assert_eq!(stats.partial_page_reads_locked, 0, "{stats:?}");
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
}

/// The file truncated to 2 pages and committed (twice: its extent freed
/// and free again) while the write's read of page 2 is paused: the page
/// is past EOF at the change, so it reads as zeros, not as the old bytes.
#[test]
fn a_page_truncated_between_the_read_and_the_change_reads_as_zeros() {
    let (fs, f, data) = write_racing_page_changes(1, |fs, f, _| {
        fs.truncate(f, 2 * PAGE as u64).unwrap();
        fs.sync().unwrap();
        fs.sync().unwrap();
    });
    let mut want = pattern(2 * PAGE, 1);
    want.resize(2 * PAGE + 10, 0);
    want.extend_from_slice(&data);
    let stats = fs.stats();
    assert_eq!(stats.partial_page_reads_unlocked, 0, "{stats:?}");
    assert_eq!(stats.partial_page_reads_locked, 0, "{stats:?}");
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
}

/// A commit made durable while the read is paused, the page's extent
/// unchanged: the change cannot tell the extent was not freed and reused
/// meanwhile, so it reads again.
#[test]
fn a_commit_between_the_read_and_the_change_reads_again() {
    let (fs, f, data) = write_racing_page_changes(1, |fs, _, _| {
        // Something to commit: a sync with nothing changed writes nothing.
        fs.create(fs.root_ino(), b"g", 0o644, 0, 0).unwrap();
        fs.sync().unwrap();
    });
    let mut want = pattern(8 * PAGE, 1);
    want[2 * PAGE + 10..2 * PAGE + 110].copy_from_slice(&data);
    let stats = fs.stats();
    assert_eq!(stats.partial_page_rereads, 1, "{stats:?}");
    assert_eq!(stats.partial_page_reads_locked, 0, "{stats:?}");
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
}

/// A page rewritten before every one of the write's reads: after
/// `PAGE_REREADS` (4) stale reads the change reads it under the lock,
/// counted, and the bytes are still right.
#[test]
fn a_page_that_keeps_changing_is_read_under_the_lock() {
    let (fs, f, data) = write_racing_page_changes(5, |fs, f, round| {
        fs.write_file(f, 2 * PAGE as u64, &pattern(PAGE, 20 + round))
            .unwrap();
        fs.fsync(f, false).unwrap();
    });
    let mut want = pattern(8 * PAGE, 1);
    want[2 * PAGE..3 * PAGE].copy_from_slice(&pattern(PAGE, 24));
    want[2 * PAGE + 10..2 * PAGE + 110].copy_from_slice(&data);
    let stats = fs.stats();
    assert_eq!(stats.partial_page_rereads, 4, "{stats:?}");
    assert_eq!(stats.partial_page_read_fallbacks, 1, "{stats:?}");
    assert_eq!(stats.partial_page_reads_locked, 1, "{stats:?}");
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
}

/// A truncate into page 3 of a file on disk only reads the page without
/// the state lock (this failed before: it was read under the lock) and
/// keeps its bytes below the new size.
#[test]
fn truncate_into_a_page_reads_it_without_the_state_lock() {
    let CommittedFile { fs, f, .. } = committed_file();
    fs.truncate(f, 3 * PAGE as u64 + 100).unwrap();
    let stats = fs.stats();
    assert_eq!(stats.partial_page_reads_locked, 0, "{stats:?}");
    assert_eq!(stats.partial_page_reads_unlocked, 1, "{stats:?}");
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == pattern(8 * PAGE, 1)[..3 * PAGE + 100]);
    // Grown again: the rest of page 3 reads as zeros.
    fs.truncate(f, 4 * PAGE as u64).unwrap();
    let mut want = pattern(3 * PAGE + 100, 1);
    want.resize(4 * PAGE, 0);
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
}

/// Page 3 rewritten and written back while the truncate's read of it is
/// paused: the truncate reads it again and keeps the new bytes.
#[test]
fn a_page_rewritten_while_a_truncate_reads_it_is_read_again() {
    let (fs, f, _) = racing_page_changes(
        3,
        1,
        |fs, f| {
            fs.truncate(f, 3 * PAGE as u64 + 100).unwrap();
        },
        |fs, f, _| {
            fs.write_file(f, 3 * PAGE as u64, &pattern(PAGE, 6))
                .unwrap();
            fs.fsync(f, false).unwrap();
        },
    );
    let mut want = pattern(3 * PAGE, 1);
    want.extend_from_slice(&pattern(100, 6));
    let stats = fs.stats();
    assert_eq!(stats.partial_page_rereads, 1, "{stats:?}");
    assert_eq!(stats.partial_page_reads_locked, 0, "{stats:?}");
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
}

/// Crash cases of docs/SNAPSHOTS.md (f) item 5: the change's partial page
/// read without the lock while the page is rewritten and fsynced; then
/// `fsync f; <power cut at every point from there>` → `f` is `want`.
fn racing_change_survives_power_cut(
    index: u64,
    change: impl FnOnce(&Filesystem<Arc<PauseReadAt>>, u64) + Send,
    want: &[u8],
) {
    let (fs, f, dev) = racing_page_changes(index, 1, change, |fs, f, _| {
        fs.write_file(f, index * PAGE as u64, &pattern(PAGE, 6))
            .unwrap();
        fs.fsync(f, false).unwrap();
    });
    assert_eq!(fs.stats().partial_page_rereads, 1);
    fs.fsync(f, false).unwrap();
    let synced = dev.inner.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_after(&dev.inner, synced, &Enumeration::thorough(3), |v| {
        common::require_content(v, "/f", want)
    });
}

#[test]
fn partial_page_write_racing_a_rewrite_then_fsync() {
    let data = pattern(100, 9);
    let mut want = pattern(8 * PAGE, 1);
    want[2 * PAGE..3 * PAGE].copy_from_slice(&pattern(PAGE, 6));
    want[2 * PAGE + 10..2 * PAGE + 110].copy_from_slice(&data);
    racing_change_survives_power_cut(
        2,
        |fs, f| {
            fs.write_file(f, 2 * PAGE as u64 + 10, &data).unwrap();
        },
        &want,
    );
}

#[test]
fn truncate_racing_a_rewrite_then_fsync() {
    let mut want = pattern(3 * PAGE, 1);
    want.extend_from_slice(&pattern(100, 6));
    racing_change_survives_power_cut(
        3,
        |fs, f| {
            fs.truncate(f, 3 * PAGE as u64 + 100).unwrap();
        },
        &want,
    );
}

/// A reflink at an unaligned offset copies its edges as bytes: the
/// source's head and tail pages and the destination's pages it covers in
/// part are read without the state lock (this failed before: each was
/// read under it), and the destination keeps its bytes around them.
#[test]
fn reflink_edges_read_without_the_state_lock() {
    let CommittedFile { fs, f: a, .. } = committed_file();
    let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
    fs.write_file(b, 0, &pattern(8 * PAGE, 2)).unwrap();
    fs.sync().unwrap();
    let before = fs.stats();
    let len = 5 * PAGE;
    assert_eq!(
        fs.copy_file_range(a, 100, b, 100, len as u64).unwrap(),
        len as u64
    );
    let after = fs.stats();
    assert_eq!(
        after.partial_page_reads_locked, before.partial_page_reads_locked,
        "{after:?}"
    );
    // a's pages 0 and 5, b's pages 0 and 5.
    assert_eq!(
        after.partial_page_reads_unlocked - before.partial_page_reads_unlocked,
        4,
        "{after:?}"
    );
    let mut want = pattern(8 * PAGE, 2);
    want[100..100 + len].copy_from_slice(&pattern(8 * PAGE, 1)[100..100 + len]);
    assert!(fs.read_file(b, 0, 1 << 20).unwrap() == want);
    fs.sync().unwrap();
    assert!(
        fs.read_file(b, 0, 1 << 20).unwrap() == want,
        "after the commit"
    );
}

/// The source's head page rewritten and written back while the reflink's
/// read of it is paused: the clone reads it again and copies the new
/// bytes.
#[test]
fn a_page_rewritten_while_a_reflink_copies_it_is_read_again() {
    let len = 3 * PAGE;
    let (fs, a, _) = racing_page_changes(
        0,
        1,
        |fs, a| {
            let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
            assert_eq!(
                fs.copy_file_range(a, 100, b, 100, len as u64).unwrap(),
                len as u64
            );
        },
        |fs, f, _| {
            fs.write_file(f, 0, &pattern(PAGE, 6)).unwrap();
            fs.fsync(f, false).unwrap();
        },
    );
    let b = fs.lookup(fs.root_ino(), b"b").unwrap().ino;
    let mut source = pattern(8 * PAGE, 1);
    source[..PAGE].copy_from_slice(&pattern(PAGE, 6));
    let mut want = vec![0u8; 100];
    want.extend_from_slice(&source[100..100 + len]);
    let stats = fs.stats();
    assert_eq!(stats.partial_page_rereads, 1, "{stats:?}");
    assert_eq!(stats.partial_page_reads_locked, 0, "{stats:?}");
    assert!(fs.read_file(b, 0, 1 << 20).unwrap() == want);
    assert!(fs.read_file(a, 0, 1 << 20).unwrap() == source);
}

/// `want` with `[at, at + len)` zeroed (a punch or zero range of it).
fn zeroed(mut want: Vec<u8>, at: usize, len: usize) -> Vec<u8> {
    want[at..at + len].fill(0);
    want
}

/// Punch hole's and zero range's edges inside pages, of a file whose
/// pages are on disk only, are read without the state lock (none under
/// it: this failed before, every such page was read under the lock), and
/// the rest of each page is kept.
#[test]
fn unaligned_punch_holes_read_partial_pages_without_the_state_lock() {
    let CommittedFile { fs, f, dev, .. } = committed_file();
    let before = fs.stats();
    let mut want = pattern(8 * PAGE, 1);
    // Inside page 2; across pages 3..5 (page 4 whole); inside page 6
    // (zero range, keeping the size); from 8p - 5 to past EOF (zero
    // range: page 7's tail, then the file grows).
    for (at, len, mode) in [
        (2 * PAGE + 10, 100, FallocateMode::PunchHole),
        (3 * PAGE + 7, 2 * PAGE, FallocateMode::PunchHole),
        (6 * PAGE + 100, 100, FallocateMode::ZeroRangeKeepSize),
        (8 * PAGE - 5, 100, FallocateMode::ZeroRange),
    ] {
        fs.fallocate(f, at as u64, len as u64, mode).unwrap();
        want.resize(want.len().max(at + len), 0);
        want = zeroed(want, at, len);
    }
    let after = fs.stats();
    assert_eq!(
        after.partial_page_reads_locked, before.partial_page_reads_locked,
        "{after:?}"
    );
    // Pages 2, 3, 5, 6 and 7.
    assert_eq!(
        after.partial_page_reads_unlocked - before.partial_page_reads_unlocked,
        5,
        "{after:?}"
    );
    assert_eq!(after.partial_page_rereads, 0, "{after:?}");
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
    fs.sync().unwrap();
    assert!(
        fs.read_file(f, 0, 1 << 20).unwrap() == want,
        "after the commit"
    );
    fs.close().unwrap();
    common::assert_clean_with_data(dev.inner.as_ref(), "after the punches");
}

/// Punches into the middle of a compressed extent: each edge page is read
/// (decompressed) without the state lock, the rest of the extent keeps
/// its bytes, and the image checks clean with its data.
#[test]
fn unaligned_punch_holes_in_a_compressed_file_read_without_the_state_lock() {
    let dev = common::memory_fs(64 << 20, 0x76);
    let options = MountOptions {
        compress: CompressOption::parse("zstd", false).unwrap(),
        ..MountOptions::deterministic()
    };
    let fs = Filesystem::open(dev.clone(), options).unwrap();
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    let mut want = common::compressible_text(3, 16 * PAGE);
    fs.write_file(f, 0, &want).unwrap();
    fs.sync().unwrap();
    let before = fs.stats();
    assert!(before.compressed_bytes_in > 0, "not compressed: {before:?}");
    for (at, len, mode) in [
        (PAGE + 100, 3 * PAGE, FallocateMode::PunchHole),
        (9 * PAGE + 5, 10, FallocateMode::ZeroRangeKeepSize),
    ] {
        fs.fallocate(f, at as u64, len as u64, mode).unwrap();
        want = zeroed(want, at, len);
    }
    let after = fs.stats();
    assert_eq!(
        after.partial_page_reads_locked, before.partial_page_reads_locked,
        "{after:?}"
    );
    // Pages 1, 4 and 9.
    assert_eq!(
        after.partial_page_reads_unlocked - before.partial_page_reads_unlocked,
        3,
        "{after:?}"
    );
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
    fs.close().unwrap();
    let fs = common::mount(dev.clone());
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want, "remounted");
    fs.close().unwrap();
    common::assert_clean_with_data(dev.as_ref(), "after the punches");
}

/// Punches into a reflinked copy whose extents are shared with the
/// source: the edges are read from the shared extents without the state
/// lock, the copy gets its holes and the source keeps every byte.
#[test]
fn unaligned_punch_holes_in_shared_extents_read_without_the_state_lock() {
    let CommittedFile { fs, f: a, dev, .. } = committed_file();
    let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
    let len = 8 * PAGE as u64;
    assert_eq!(fs.copy_file_range(a, 0, b, 0, len).unwrap(), len);
    fs.sync().unwrap();
    let before = fs.stats();
    let mut want = pattern(8 * PAGE, 1);
    for (at, len, mode) in [
        (2 * PAGE + 10, 100, FallocateMode::PunchHole),
        (5 * PAGE + 4000, 200, FallocateMode::ZeroRangeKeepSize),
    ] {
        fs.fallocate(b, at as u64, len as u64, mode).unwrap();
        want = zeroed(want, at, len);
    }
    let after = fs.stats();
    assert_eq!(
        after.partial_page_reads_locked, before.partial_page_reads_locked,
        "{after:?}"
    );
    // b's pages 2, 5 and 6.
    assert_eq!(
        after.partial_page_reads_unlocked - before.partial_page_reads_unlocked,
        3,
        "{after:?}"
    );
    assert!(fs.read_file(b, 0, 1 << 20).unwrap() == want, "b");
    assert!(
        fs.read_file(a, 0, 1 << 20).unwrap() == pattern(8 * PAGE, 1),
        "a"
    );
    fs.sync().unwrap();
    assert!(fs.read_file(b, 0, 1 << 20).unwrap() == want, "b, committed");
    assert!(
        fs.read_file(a, 0, 1 << 20).unwrap() == pattern(8 * PAGE, 1),
        "a, committed"
    );
    fs.close().unwrap();
    common::assert_clean_with_data(dev.inner.as_ref(), "after the punches");
}

/// A reflink within one file whose source's head page is also its
/// destination's tail page: the page is read ahead once for both and
/// copied, then written, without a read under the state lock (before, the
/// source's copy used the page up and the destination read it again
/// under the lock).
#[test]
fn a_reflink_within_one_file_reads_a_shared_edge_page_without_the_state_lock() {
    let CommittedFile { fs, f, .. } = committed_file();
    let before = fs.stats();
    // Source [2p+100, 4p+100), destination [100, 2p+100): the source's
    // head and the destination's tail are both page 2.
    let len = 2 * PAGE;
    assert_eq!(
        fs.copy_file_range(f, 2 * PAGE as u64 + 100, f, 100, len as u64)
            .unwrap(),
        len as u64
    );
    let after = fs.stats();
    assert_eq!(
        after.partial_page_reads_locked, before.partial_page_reads_locked,
        "{after:?}"
    );
    let old = pattern(8 * PAGE, 1);
    let mut want = old.clone();
    want[100..100 + len].copy_from_slice(&old[2 * PAGE + 100..2 * PAGE + 100 + len]);
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
}

/// The source truncated and committed while a reflink's read of its head
/// page is paused: the copy is shorter now, its tail is another page,
/// which the change finds not read ahead and reads again without the
/// lock (before, the edges were chosen once and the new tail page was
/// read under the lock).
#[test]
fn a_reflink_whose_source_shrinks_while_it_reads_is_read_again() {
    let (fs, a, _) = racing_page_changes(
        0,
        1,
        |fs, a| {
            let b = fs.create(fs.root_ino(), b"b", 0o644, 0, 0).unwrap().ino;
            let copied = fs.copy_file_range(a, 100, b, 100, 5 * PAGE as u64).unwrap();
            assert_eq!(copied, 3 * PAGE as u64 - 50);
        },
        |fs, a, _| {
            fs.truncate(a, 3 * PAGE as u64 + 50).unwrap();
            fs.sync().unwrap();
        },
    );
    let b = fs.lookup(fs.root_ino(), b"b").unwrap().ino;
    let source = pattern(3 * PAGE + 50, 1);
    let mut want = vec![0u8; 100];
    want.extend_from_slice(&source[100..]);
    let stats = fs.stats();
    assert!(stats.partial_page_rereads >= 1, "{stats:?}");
    assert_eq!(stats.partial_page_reads_locked, 0, "{stats:?}");
    assert!(fs.read_file(b, 0, 1 << 20).unwrap() == want);
    assert!(fs.read_file(a, 0, 1 << 20).unwrap() == source);
}

/// Page 2 rewritten and written back while the punch's read of it is
/// paused: the punch reads it again and zeroes its range in the new bytes.
#[test]
fn a_page_rewritten_while_a_punch_reads_it_is_read_again() {
    let (fs, f, _) = racing_page_changes(
        2,
        1,
        |fs, f| {
            fs.fallocate(f, 2 * PAGE as u64 + 10, 100, FallocateMode::PunchHole)
                .unwrap();
        },
        |fs, f, _| {
            fs.write_file(f, 2 * PAGE as u64, &pattern(PAGE, 6))
                .unwrap();
            fs.fsync(f, false).unwrap();
        },
    );
    let mut want = pattern(8 * PAGE, 1);
    want[2 * PAGE..3 * PAGE].copy_from_slice(&pattern(PAGE, 6));
    let want = zeroed(want, 2 * PAGE + 10, 100);
    let stats = fs.stats();
    assert_eq!(stats.partial_page_rereads, 1, "{stats:?}");
    assert_eq!(stats.partial_page_reads_unlocked, 1, "{stats:?}");
    assert_eq!(stats.partial_page_reads_locked, 0, "{stats:?}");
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
}

/// The file truncated into the punched page and committed while the
/// punch's read of it is paused: the punch, bounded by the size it finds,
/// reads the new last page again and zeroes only up to the new EOF.
#[test]
fn a_file_truncated_while_a_punch_reads_its_edge_is_read_again() {
    let (fs, f, _) = racing_page_changes(
        5,
        1,
        |fs, f| {
            fs.fallocate(f, 5 * PAGE as u64 + 10, 100, FallocateMode::PunchHole)
                .unwrap();
        },
        |fs, f, _| {
            fs.truncate(f, 5 * PAGE as u64 + 50).unwrap();
            fs.sync().unwrap();
        },
    );
    let want = zeroed(pattern(5 * PAGE + 50, 1), 5 * PAGE + 10, 40);
    let stats = fs.stats();
    assert_eq!(stats.partial_page_rereads, 1, "{stats:?}");
    assert_eq!(stats.partial_page_reads_locked, 0, "{stats:?}");
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
}

/// A page rewritten before every one of a zero range's reads: after
/// `PAGE_REREADS` (4) stale reads the change reads it under the lock,
/// counted, and the bytes are still right.
#[test]
fn a_page_that_keeps_changing_under_a_zero_range_is_read_under_the_lock() {
    let (fs, f, _) = racing_page_changes(
        3,
        5,
        |fs, f| {
            fs.fallocate(
                f,
                3 * PAGE as u64 + 1000,
                50,
                FallocateMode::ZeroRangeKeepSize,
            )
            .unwrap();
        },
        |fs, f, round| {
            fs.write_file(f, 3 * PAGE as u64, &pattern(PAGE, 20 + round))
                .unwrap();
            fs.fsync(f, false).unwrap();
        },
    );
    let mut want = pattern(8 * PAGE, 1);
    want[3 * PAGE..4 * PAGE].copy_from_slice(&pattern(PAGE, 24));
    let want = zeroed(want, 3 * PAGE + 1000, 50);
    let stats = fs.stats();
    assert_eq!(stats.partial_page_rereads, 4, "{stats:?}");
    assert_eq!(stats.partial_page_read_fallbacks, 1, "{stats:?}");
    assert_eq!(stats.partial_page_reads_locked, 1, "{stats:?}");
    assert!(fs.read_file(f, 0, 1 << 20).unwrap() == want);
}

#[test]
fn punch_hole_racing_a_rewrite_then_fsync() {
    let mut want = pattern(8 * PAGE, 1);
    want[2 * PAGE..3 * PAGE].copy_from_slice(&pattern(PAGE, 6));
    racing_change_survives_power_cut(
        2,
        |fs, f| {
            fs.fallocate(f, 2 * PAGE as u64 + 10, 100, FallocateMode::PunchHole)
                .unwrap();
        },
        &zeroed(want, 2 * PAGE + 10, 100),
    );
}

#[test]
fn zero_range_racing_a_rewrite_then_fsync() {
    let mut want = pattern(8 * PAGE, 1);
    want[7 * PAGE..8 * PAGE].copy_from_slice(&pattern(PAGE, 6));
    want.resize(9 * PAGE + 100, 0);
    racing_change_survives_power_cut(
        7,
        |fs, f| {
            fs.fallocate(
                f,
                7 * PAGE as u64 + 100,
                2 * PAGE as u64,
                FallocateMode::ZeroRange,
            )
            .unwrap();
        },
        &zeroed(want, 7 * PAGE + 100, 2 * PAGE),
    );
}

/// The inode numbers of `big_tree`'s files, `[dir][file]`, read on a mount
/// of its own: the cold mount after it starts with nothing cached.
fn file_inos(dev: &Arc<MemoryDevice>) -> Vec<Vec<u64>> {
    let fs = common::mount(dev.clone());
    let inos = (0..DIRS)
        .map(|d| {
            let dir = fs.lookup(fs.root_ino(), format!("dir{d}").as_bytes());
            let dir = dir.unwrap().ino;
            (0..FILES_PER_DIR)
                .map(|f| fs.lookup(dir, format!("file{f:04}").as_bytes()))
                .map(|attr| attr.unwrap().ino)
                .collect()
        })
        .collect();
    fs.close().unwrap();
    inos
}

fn name(f: usize) -> Vec<u8> {
    format!("file{f:04}").into_bytes()
}

/// docs/SNAPSHOTS.md (f) item 3, "Changes' misses": changes on a cold node
/// cache (unlink, rename within and across directories, link, chmod,
/// truncate, xattr set and remove, create, mkdir, symlink, rmdir, fsync)
/// read the nodes they miss in their warm-up, without the state lock:
/// none under it. This failed before the warm-ups: every miss of a change
/// was read under the lock.
#[test]
fn cold_changes_read_no_node_under_the_state_lock() {
    let dev = big_tree();
    let inos = file_inos(&dev);
    let fs = mount_cold(&dev, 64);
    let root = fs.root_ino();
    let dirs: Vec<u64> = (0..DIRS)
        .map(|d| fs.lookup(root, format!("dir{d}").as_bytes()).unwrap().ino)
        .collect();
    let before = fs.stats();
    for (d, &dir) in dirs.iter().enumerate() {
        let next = dirs[(d + 1) % DIRS];
        for f in 0..5 {
            fs.unlink(dir, &name(f)).unwrap();
        }
        for f in 5..10 {
            let to = format!("moved{f}");
            fs.rename(dir, &name(f), dir, to.as_bytes(), Default::default())
                .unwrap();
        }
        for f in 10..12 {
            let to = format!("from{d}-{f}");
            fs.rename(dir, &name(f), next, to.as_bytes(), Default::default())
                .unwrap();
        }
        let ino = |f: usize| inos[d][f];
        fs.link(ino(12), dir, b"link12").unwrap();
        fs.setattr(
            ino(13),
            &birch::fs::SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
        fs.truncate(ino(14), 1).unwrap();
        fs.setxattr(ino(15), b"user.x", b"1", Default::default())
            .unwrap();
        fs.setxattr(ino(16), b"user.y", b"2", Default::default())
            .unwrap();
        fs.removexattr(ino(16), b"user.y").unwrap();
        fs.create(dir, b"new", 0o644, 0, 0).unwrap();
        let sub = fs.mkdir(dir, b"sub", 0o755, 0, 0).unwrap().ino;
        fs.symlink(sub, b"sym", b"target", 0, 0).unwrap();
        fs.unlink(sub, b"sym").unwrap();
        fs.rmdir(dir, b"sub").unwrap();
        fs.fsync(ino(17), false).unwrap();
    }
    let after = fs.stats();
    assert_eq!(
        after.node_reads_locked, before.node_reads_locked,
        "changes read nodes under the state lock: {after:?}"
    );
    assert!(
        after.warm_up_reruns > before.warm_up_reruns + DIRS as u64,
        "the changes should have missed the 64-node cache: {after:?}"
    );
    assert_eq!(after.warm_up_fallbacks, 0, "{after:?}");
    for (d, &dir) in dirs.iter().enumerate() {
        let prev = (d + DIRS - 1) % DIRS;
        let listed: BTreeSet<Vec<u8>> = (fs.readdir(dir, 0, usize::MAX).unwrap().into_iter())
            .map(|e| e.name)
            .collect();
        let mut want: BTreeSet<Vec<u8>> = (12..FILES_PER_DIR).map(name).collect();
        want.extend((5..10).map(|f| format!("moved{f}").into_bytes()));
        want.extend((10..12).map(|f| format!("from{prev}-{f}").into_bytes()));
        want.extend([b"link12".to_vec(), b"new".to_vec()]);
        assert_eq!(listed, want, "dir{d}");
        let moved = fs.lookup(dir, b"moved7").unwrap();
        assert_eq!(moved.ino, inos[d][7]);
        assert_eq!(fs.getattr(inos[d][12]).unwrap().nlink, 2);
        assert_eq!(fs.getattr(inos[d][13]).unwrap().perm & 0o7777, 0o600);
        let first_byte = format!("{d}").as_bytes()[..1].to_vec();
        assert_eq!(fs.read_file(inos[d][14], 0, 100).unwrap(), first_byte);
        assert_eq!(fs.getxattr(inos[d][15], b"user.x").unwrap(), b"1");
        assert!(matches!(
            fs.getxattr(inos[d][16], b"user.y"),
            Err(Error::NoData)
        ));
    }
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the changes");
}

#[test]
fn a_cache_smaller_than_a_change_falls_back_to_reading_under_the_lock() {
    let dev = big_tree();
    let inos = file_inos(&dev);
    // Two nodes cannot hold a change's paths: every run of its warm-up
    // evicts what the last one read, and the change reads its misses
    // under the lock, as it did before the warm-ups.
    let fs = mount_cold(&dev, 2);
    let dir = fs.lookup(fs.root_ino(), b"dir13").unwrap().ino;
    let locked = fs.stats().node_reads_locked;
    fs.rename(dir, &name(0), dir, b"moved", Default::default())
        .unwrap();
    fs.unlink(dir, &name(1)).unwrap();
    let new = fs.create(dir, b"new", 0o644, 0, 0).unwrap().ino;
    let stats = fs.stats();
    assert!(stats.warm_up_fallbacks > 0, "{stats:?}");
    assert!(stats.node_reads_locked > locked, "{stats:?}");
    assert_eq!(fs.lookup(dir, b"moved").unwrap().ino, inos[13][0]);
    assert_eq!(fs.read_file(inos[13][0], 0, 100).unwrap(), b"13/0");
    for gone in [name(0), name(1)] {
        assert!(matches!(fs.lookup(dir, &gone), Err(Error::NotFound)));
    }
    assert_eq!(fs.lookup(dir, b"new").unwrap().ino, new);
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the changes");
}

/// A device that stops the first read after it is armed until released.
struct PauseNextRead {
    inner: Arc<MemoryDevice>,
    armed: std::sync::atomic::AtomicBool,
    paused: std::sync::mpsc::SyncSender<()>,
    resume: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl birch::device::BlockDevice for PauseNextRead {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.paused.send(()).unwrap();
            self.resume.lock().unwrap().recv().unwrap();
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// docs/SNAPSHOTS.md (f) item 3: a change's warm-up reads a cold node
/// without the state lock. While an unlink is stopped in that read, other
/// changes run (before the warm-ups they waited: the unlink read under
/// the lock) and replace the nodes it is reading: a rename and a create
/// in the same directory, then two commits, which free the old blocks
/// (kept from reuse by the unlink's reader ticket). Released, the unlink
/// walks the trees as they are now: every change is there and the check
/// is clean.
#[test]
fn a_change_reading_a_cold_node_lets_other_changes_replace_it() {
    let dev = big_tree();
    let inos = file_inos(&dev);
    let (paused_tx, paused) = std::sync::mpsc::sync_channel(1);
    let (resume, resume_rx) = std::sync::mpsc::channel();
    let pause = Arc::new(PauseNextRead {
        inner: dev.clone(),
        armed: std::sync::atomic::AtomicBool::new(false),
        paused: paused_tx,
        resume: std::sync::Mutex::new(resume_rx),
    });
    let options = MountOptions {
        cache_nodes: 16,
        idle_cache_nodes: 16,
        ..MountOptions::deterministic()
    };
    let fs = Filesystem::open(pause.clone(), options).unwrap();
    let dir = fs.lookup(fs.root_ino(), b"dir4").unwrap().ino;
    let timeout = std::time::Duration::from_secs(20);
    let others_ran = std::thread::scope(|scope| {
        pause.armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let unlinking = scope.spawn(|| fs.unlink(dir, &name(10)));
        if paused.recv_timeout(timeout).is_err() {
            pause
                .armed
                .store(false, std::sync::atomic::Ordering::SeqCst);
            unlinking.join().unwrap().unwrap();
            panic!("the unlink read nothing: its nodes were cached");
        }
        let (done, others) = std::sync::mpsc::channel();
        let fs = &fs;
        let other = scope.spawn(move || {
            fs.rename(dir, &name(11), dir, b"renamed", Default::default())
                .unwrap();
            fs.create(dir, b"new", 0o644, 0, 0).unwrap();
            fs.commit().unwrap();
            fs.commit().unwrap();
            done.send(()).unwrap();
        });
        let ran = others.recv_timeout(timeout).is_ok();
        resume.send(()).unwrap();
        unlinking.join().unwrap().unwrap();
        other.join().unwrap();
        ran
    });
    assert!(
        others_ran,
        "the other changes waited for the unlink's node read: it held the state lock"
    );
    assert!(matches!(fs.lookup(dir, &name(10)), Err(Error::NotFound)));
    assert_eq!(fs.lookup(dir, b"renamed").unwrap().ino, inos[4][11]);
    assert!(fs.lookup(dir, b"new").is_ok());
    assert_eq!(fs.readdir(dir, 0, usize::MAX).unwrap().len(), FILES_PER_DIR);
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the racing changes");
}

/// Changes racing evictions of the node cache: another thread empties it
/// in a loop (as `release_memory` shrinks an idle mount's), also between
/// a change's warm-up and the change. What the change then misses it
/// reads under the lock (`node_reads_locked`): every result is right.
#[test]
fn changes_racing_cache_evictions_stay_right() {
    let dev = big_tree();
    let options = MountOptions {
        cache_nodes: 64,
        idle_cache_nodes: 0,
        ..MountOptions::deterministic()
    };
    let fs = Filesystem::open(dev.clone(), options).unwrap();
    let dirs: Vec<u64> = (0..4)
        .map(|d| fs.lookup(fs.root_ino(), format!("dir{d}").as_bytes()))
        .map(|attr| attr.unwrap().ino)
        .collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                fs.release_memory();
            }
        });
        for &dir in &dirs {
            for f in 0..50 {
                let to = format!("r{f}");
                fs.rename(dir, &name(f), dir, to.as_bytes(), Default::default())
                    .unwrap();
            }
            for f in 50..100 {
                fs.unlink(dir, &name(f)).unwrap();
            }
            for f in 100..FILES_PER_DIR {
                let ino = fs.lookup(dir, &name(f)).unwrap().ino;
                let chmod = birch::fs::SetAttr {
                    mode: Some(0o600),
                    ..Default::default()
                };
                fs.setattr(ino, &chmod).unwrap();
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let stats = fs.stats();
    eprintln!(
        "warm-up runs that missed {}, fallbacks {}, node reads under the lock {}, without {}",
        stats.warm_up_reruns,
        stats.warm_up_fallbacks,
        stats.node_reads_locked,
        stats.node_reads_unlocked
    );
    for &dir in &dirs {
        let listed: BTreeSet<Vec<u8>> = (fs.readdir(dir, 0, usize::MAX).unwrap().into_iter())
            .map(|e| e.name)
            .collect();
        let mut want: BTreeSet<Vec<u8>> = (0..50).map(|f| format!("r{f}").into_bytes()).collect();
        want.extend((100..FILES_PER_DIR).map(name));
        assert_eq!(listed, want);
        for f in 100..FILES_PER_DIR {
            let attr = fs.lookup(dir, &name(f)).unwrap();
            assert_eq!(attr.perm & 0o7777, 0o600);
        }
    }
    fs.close().unwrap();
    common::assert_clean(dev.as_ref(), "after the changes");
}
