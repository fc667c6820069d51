//! Delayed allocation and space reservation (docs/DELALLOC.md): filling a
//! filesystem until ENOSPC loses nothing acknowledged, a full filesystem can
//! be emptied, reclaim writes back a bounded number of pages, writers are
//! throttled instead of forcing commits, racing writers neither deadlock nor
//! lose data — and the crash cases of docs/DELALLOC.md, one test each, named
//! as there.

mod common;

use birch::device::{BlockDevice, CrashPoint, RecordingDevice};
use birch::fs::{FallocateMode, Filesystem, MountOptions};
use birch::Error;
use common::{assert_clean, crash_points, crash_view, mount, view, Enumeration, View};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn memory_fs(bytes: u64) -> Arc<birch::device::MemoryDevice> {
    common::memory_fs(bytes, 7)
}

fn recorder(bytes: u64) -> Arc<RecordingDevice> {
    common::recorder(bytes, 8)
}

/// The byte every test writes at `offset` of file number `id`: distinct per
/// file and per position, so a byte of another file or a stale block shows.
fn pattern(id: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let o = offset + i;
            (o.wrapping_mul(31) ^ id.wrapping_mul(0x9E37_79B9) ^ (o >> 12)) as u8 | 1
        })
        .collect()
}

/// Stops the process if a test hangs (a deadlock is a failure, not a
/// timeout of the whole suite).
struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    fn new(name: &'static str, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while !flag.load(Ordering::SeqCst) {
                if start.elapsed() > limit {
                    eprintln!("{name}: no progress after {limit:?} (deadlock?)");
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What a fill acknowledged: file name -> (file id, bytes acknowledged).
type Acked = BTreeMap<String, (u64, u64)>;

/// Creates files of mixed sizes in `dir` and writes them (in pieces of up
/// to 128 KiB) until the filesystem says ENOSPC (a short write is retried
/// for the rest: only an error ends the fill). Returns what was
/// acknowledged.
fn fill_until_enospc<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    dir: u64,
    prefix: &str,
    first_id: u64,
    seed: u64,
) -> Acked {
    let sizes = [
        100, 1500, 2048, 3000, 4096, 5000, 20_000, 65_536, 300_000, 1_048_699,
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut acked = Acked::new();
    for n in 0.. {
        let id = first_id + n;
        let name = format!("{prefix}{n}");
        let ino = match fs.create(dir, name.as_bytes(), 0o644, 0, 0) {
            Ok(a) => a.ino,
            Err(Error::NoSpace) => return acked,
            Err(e) => panic!("create {name}: {e}"),
        };
        acked.insert(name.clone(), (id, 0));
        let size = sizes[rng.gen_range(0..sizes.len())];
        let mut off = 0u64;
        while off < size {
            let len = (size - off).min(128 * 1024) as usize;
            match fs.write_file(ino, off, &pattern(id, off, len)) {
                Ok(0) => return acked,
                Ok(n) => {
                    off += n as u64;
                    acked.get_mut(&name).unwrap().1 = off;
                }
                Err(Error::NoSpace) => return acked,
                Err(e) => panic!("write {name}: {e}"),
            }
        }
    }
    unreachable!()
}

/// Every acknowledged byte reads back (and nothing more is there).
fn verify_acked<D: BlockDevice + 'static>(fs: &Filesystem<D>, dir: u64, acked: &Acked) {
    for (name, &(id, len)) in acked {
        let ino = fs
            .lookup(dir, name.as_bytes())
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .ino;
        let size = fs.getattr(ino).unwrap().size;
        assert_eq!(size, len, "{name}: size");
        let data = fs.read_file(ino, 0, len as usize).unwrap();
        assert!(data == pattern(id, 0, len as usize), "{name}: content");
    }
}

fn total(acked: &Acked) -> u64 {
    acked.values().map(|&(_, l)| l).sum()
}

// ----------------------------------------------------------------------
// Filling, emptying, statfs
// ----------------------------------------------------------------------

#[test]
fn fill_until_enospc_loses_nothing_acknowledged() {
    let _w = Watchdog::new("fill", Duration::from_secs(120));
    let dev = memory_fs(64 * MIB);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let acked = fill_until_enospc(&fs, root, "f", 0, 1);
    let stats = fs.space_stats();
    let usage = fs.space_usage();
    let data = total(&acked);
    eprintln!(
        "accepted {} files, {:.1} MiB before ENOSPC; {stats:?}; {usage:?}",
        acked.len(),
        data as f64 / MIB as f64
    );
    assert!(stats.enospc >= 1);
    assert!(
        stats.tickets_queued > 0,
        "a full filesystem queued no ticket"
    );
    assert_eq!(stats.tickets_out_of_order, 0);
    // Truly full: what statfs still offers is a small remainder.
    let st = fs.statfs().unwrap();
    assert!(
        st.blocks_available * 4096 < 2 * MIB,
        "ENOSPC with {} KiB available",
        st.blocks_available * 4
    );
    assert!(data > 40 * MIB, "only {data} bytes fit in 64 MiB");
    verify_acked(&fs, root, &acked);
    // fsync still works on a full filesystem (it may use the global reserve).
    let last = acked.keys().last().unwrap();
    let ino = fs.lookup(root, last.as_bytes()).unwrap().ino;
    fs.fsync(ino, false).unwrap();
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after the fill");

    let fs = mount(dev.clone());
    verify_acked(&fs, root, &acked);
    // Deleting files gives the space back: writes succeed again.
    let doomed: Vec<String> = acked.keys().step_by(2).cloned().collect();
    for name in &doomed {
        fs.unlink(root, name.as_bytes()).unwrap();
    }
    let mut kept = acked.clone();
    for name in &doomed {
        kept.remove(name);
    }
    let more = fill_until_enospc(&fs, root, "g", 1_000_000, 2);
    assert!(
        total(&more) > total(&acked) - total(&kept) - 8 * MIB,
        "after freeing {} bytes only {} could be written again",
        total(&acked) - total(&kept),
        total(&more)
    );
    verify_acked(&fs, root, &kept);
    verify_acked(&fs, root, &more);
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after emptying and refilling");
    let fs = mount(dev.clone());
    verify_acked(&fs, root, &kept);
    verify_acked(&fs, root, &more);
    fs.close().unwrap();
}

#[test]
fn full_filesystem_can_be_emptied() {
    let _w = Watchdog::new("empty", Duration::from_secs(60));
    let dev = memory_fs(32 * MIB);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let sub = fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap().ino;
    let acked = fill_until_enospc(&fs, d, "f", 0, 3);
    // Nothing ordinary fits any more ...
    assert!(matches!(
        fs.create(root, b"late", 0o644, 0, 0),
        Err(Error::NoSpace)
    ));
    // ... but truncate, unlink and rmdir use the global reserve.
    let names: Vec<&String> = acked.keys().collect();
    let t = fs.lookup(d, names[0].as_bytes()).unwrap().ino;
    fs.truncate(t, 10).unwrap();
    for name in &names[1..] {
        fs.unlink(d, name.as_bytes()).unwrap();
    }
    fs.rmdir(d, b"sub").unwrap();
    let _ = sub;
    // The space is back (once a reclaim commit has unpinned it: as on
    // btrfs, statfs sees space freed by deletes after the next commit): a
    // large write succeeds.
    let commits = fs.stats().commits;
    let big = fs.create(root, b"big", 0o644, 0, 0).unwrap().ino;
    let data = pattern(99, 0, (12 * MIB) as usize);
    assert_eq!(fs.write_file(big, 0, &data).unwrap(), data.len());
    assert!(
        fs.stats().commits > commits,
        "the write needed a reclaim commit"
    );
    assert!(fs.statfs().unwrap().blocks_available * 4096 > 2 * MIB);
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after emptying");
    let fs = mount(dev.clone());
    assert_eq!(fs.read_file(big, 0, data.len()).unwrap(), data);
    fs.close().unwrap();
}

#[test]
fn statfs_agrees_with_what_can_be_written() {
    let dev = memory_fs(64 * MIB);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let st = fs.statfs().unwrap();
    let offered = st.blocks_available * st.block_size as u64;
    let ino = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    let chunk = pattern(5, 0, MIB as usize);
    let mut written = 0u64;
    loop {
        match fs.write_file(ino, written, &chunk) {
            Ok(n) => {
                written += n as u64;
                if n < chunk.len() {
                    break;
                }
            }
            Err(Error::NoSpace) => break,
            Err(e) => panic!("{e}"),
        }
    }
    eprintln!("statfs offered {offered}, {written} written");
    // Within the metadata of the file itself and the global reserve.
    assert!(
        written + 2 * MIB >= offered,
        "df offered {offered}, only {written} fit"
    );
    assert!(
        written <= offered + 4 * MIB,
        "df offered {offered}, {written} fit"
    );
    // After a commit the remainder is honest too.
    fs.sync().unwrap();
    let st = fs.statfs().unwrap();
    assert!(st.blocks_available * 4096 < 2 * MIB);
    assert!(st.blocks_free >= st.blocks_available);
    fs.close().unwrap();
}

// ----------------------------------------------------------------------
// Reclaim, throttling
// ----------------------------------------------------------------------

/// Seed 004: reclaim asks the writeback for about as many pages as it
/// needs, oldest first — a big file dirtied last is not written back to
/// satisfy small writers, and no request writes more than its bound.
#[test]
fn reclaim_writes_back_pages_not_whole_inodes() {
    let _w = Watchdog::new("reclaim", Duration::from_secs(60));
    let dev = memory_fs(48 * MIB);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    // Many small files, dirty (no commit): each holds a run's worth of
    // delalloc metadata, which is what reclaim gives back.
    let mut small = Vec::new();
    for i in 0..200u64 {
        let ino = fs
            .create(root, format!("s{i}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        fs.write_file(ino, 0, &pattern(i, 0, 6000)).unwrap();
        small.push(ino);
    }
    // Then a big file, dirtied last.
    let big = fs.create(root, b"big", 0o644, 0, 0).unwrap().ino;
    let big_data = pattern(1000, 0, (8 * MIB) as usize);
    fs.write_file(big, 0, &big_data).unwrap();
    let big_pages = 8 * MIB / 4096;
    // Now writers that need more than is available: tickets, reclaim.
    let mut n = 0;
    while fs.space_stats().reclaim_requests == 0 {
        let ino = fs
            .create(root, format!("w{n}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        fs.write_file(ino, 0, &pattern(2000 + n, 0, 256 * 1024))
            .unwrap();
        n += 1;
        assert!(n < 1000, "no reclaim happened");
    }
    let stats = fs.space_stats();
    eprintln!("{stats:?}");
    assert!(stats.reclaim_pages > 0);
    assert!(stats.reclaim_pages_max <= 4096);
    // The small, old files went first; the big file kept its dirty pages.
    assert!(
        fs.space_usage().dirty_data >= big_pages * 4096,
        "the newest big file was written back to satisfy a small shortfall"
    );
    assert!(stats.reclaim_pages_max < big_pages);
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after reclaim");
    let fs = mount(dev.clone());
    assert_eq!(fs.read_file(big, 0, big_data.len()).unwrap(), big_data);
    for (i, &ino) in small.iter().enumerate() {
        assert_eq!(
            fs.read_file(ino, 0, 6000).unwrap(),
            pattern(i as u64, 0, 6000)
        );
    }
    fs.close().unwrap();
}

/// Page-bounded writeback of one inode goes on where it stopped and
/// leaves the rest dirty; reads see both.
#[test]
fn flush_range_and_bounded_writeback_of_one_inode() {
    let dev = memory_fs(32 * MIB);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    let mut want = pattern(1, 0, 3 * MIB as usize);
    fs.write_file(f, 0, &want).unwrap();
    assert_eq!(fs.flush_range(f, MIB, MIB).unwrap(), 256);
    assert_eq!(fs.space_usage().dirty_data, 2 * MIB);
    // Overwrite across the written and the dirty part.
    let patch = pattern(2, 0, 300_000);
    fs.write_file(f, MIB + MIB / 2 - 150_000, &patch).unwrap();
    let at = (MIB + MIB / 2 - 150_000) as usize;
    want[at..at + patch.len()].copy_from_slice(&patch);
    assert_eq!(fs.read_file(f, 0, want.len()).unwrap(), want);
    // An inline file that grows past page 0 through a range flush.
    let g = fs.create(root, b"g", 0o644, 0, 0).unwrap().ino;
    fs.write_file(g, 0, b"tiny").unwrap();
    fs.sync().unwrap();
    fs.write_file(g, 9000, b"far").unwrap();
    fs.flush_range(g, 8192, 4096).unwrap();
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after range flushes");
    let fs = mount(dev.clone());
    assert_eq!(fs.read_file(f, 0, want.len()).unwrap(), want);
    let mut g_want = vec![0u8; 9003];
    g_want[..4].copy_from_slice(b"tiny");
    g_want[9000..].copy_from_slice(b"far");
    assert_eq!(fs.read_file(g, 0, 10_000).unwrap(), g_want);
    fs.close().unwrap();
}

#[test]
fn throttled_writers_write_back_instead_of_committing() {
    let _w = Watchdog::new("throttle", Duration::from_secs(60));
    for flusher in [false, true] {
        let dev = memory_fs(64 * MIB);
        let options = MountOptions {
            dirty_limit_bytes: MIB,
            background_flusher: flusher,
            ..MountOptions::deterministic()
        };
        let fs = Filesystem::open(dev.clone(), options).unwrap();
        let root = fs.root_ino();
        let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
        let data = pattern(3, 0, (16 * MIB) as usize);
        for (i, piece) in data.chunks(64 * 1024).enumerate() {
            fs.write_file(f, (i * 64 * 1024) as u64, piece).unwrap();
            let dirty = fs.space_usage().dirty_data;
            assert!(
                dirty <= MIB + 64 * 1024,
                "dirty memory {dirty} over the limit"
            );
        }
        assert_eq!(fs.stats().commits, 0, "dirty memory forced a commit");
        let stats = fs.space_stats();
        assert!(stats.throttled_writes > 0);
        if flusher {
            assert!(stats.background_pages > 0);
        } else {
            assert!(stats.throttle_pages > 0);
        }
        fs.close().unwrap();
        assert_clean(dev.as_ref(), "after throttled writes");
        let fs = mount(dev.clone());
        assert_eq!(fs.read_file(f, 0, data.len()).unwrap(), data);
        fs.close().unwrap();
    }
}

/// fallocate reserves what it allocates; writes into preallocated ranges,
/// truncates and punches keep the accounting straight.
#[test]
fn prealloc_punch_truncate_keep_accounting() {
    let dev = memory_fs(32 * MIB);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(f, 0, 4 * MIB, FallocateMode::Allocate)
        .unwrap();
    fs.write_file(f, 100_000, &pattern(4, 0, 500_000)).unwrap();
    fs.fallocate(f, 200_000, 100_000, FallocateMode::PunchHole)
        .unwrap();
    fs.truncate(f, 350_000).unwrap();
    let u = fs.space_usage();
    // Pages 0..=85 were dirtied by the write; punch and truncate dropped some.
    assert!(u.dirty_data <= 86 * 4096, "{u:?}");
    // A prealloc as big as the filesystem fails cleanly.
    assert!(matches!(
        fs.fallocate(f, 0, 64 * MIB, FallocateMode::AllocateKeepSize),
        Err(Error::NoSpace)
    ));
    fs.sync().unwrap();
    assert_eq!(fs.space_usage().dirty_data, 0);
    assert_eq!(fs.space_usage().delalloc_metadata, 0);
    let mut want = vec![0u8; 350_000];
    want[100_000..200_000].copy_from_slice(&pattern(4, 0, 100_000));
    want[300_000..350_000].copy_from_slice(&pattern(4, 0, 500_000)[200_000..250_000]);
    assert_eq!(fs.read_file(f, 0, 350_000).unwrap(), want);
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after prealloc, punch, truncate");
}

// ----------------------------------------------------------------------
// Racing writers
// ----------------------------------------------------------------------

fn race_for_the_last_space(options: MountOptions, threads: u64, seed: u64) {
    let dev = memory_fs(32 * MIB);
    let fs = Arc::new(Filesystem::open(dev.clone(), options).unwrap());
    let root = fs.root_ino();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let dir = fs
                    .mkdir(root, format!("t{t}").as_bytes(), 0o755, 0, 0)
                    .unwrap()
                    .ino;
                let mut rng = ChaCha8Rng::seed_from_u64(seed * 100 + t);
                let mut acked = Acked::new();
                let mut refusals = 0;
                for n in 0.. {
                    let id = t * 1_000_000 + n;
                    let name = format!("f{n}");
                    let ino = match fs.create(dir, name.as_bytes(), 0o644, 0, 0) {
                        Ok(a) => a.ino,
                        Err(Error::NoSpace) => {
                            refusals += 1;
                            if refusals >= 3 {
                                break;
                            }
                            continue;
                        }
                        Err(e) => panic!("create: {e}"),
                    };
                    acked.insert(name.clone(), (id, 0));
                    let size = rng.gen_range(1..400_000u64);
                    let mut off = 0;
                    while off < size {
                        let len = (size - off).min(64 * 1024) as usize;
                        match fs.write_file(ino, off, &pattern(id, off, len)) {
                            Ok(n) => {
                                off += n as u64;
                                acked.get_mut(&name).unwrap().1 = off;
                                if n < len {
                                    break;
                                }
                            }
                            Err(Error::NoSpace) => break,
                            Err(e) => panic!("write: {e}"),
                        }
                    }
                    if off < size {
                        refusals += 1;
                        if refusals >= 3 {
                            break;
                        }
                    }
                }
                (dir, acked)
            })
        })
        .collect();
    let results: Vec<(u64, Acked)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let stats = fs.space_stats();
    eprintln!("{stats:?}");
    assert_eq!(stats.tickets_out_of_order, 0, "tickets served out of order");
    assert!(stats.tickets_queued > 0, "no writer had to wait");
    assert_eq!(
        stats.tickets_queued,
        stats.tickets_granted + stats.tickets_failed,
        "a ticket was never served"
    );
    for (dir, acked) in &results {
        verify_acked(&fs, *dir, acked);
    }
    let fs = Arc::into_inner(fs).unwrap();
    fs.close().unwrap();
    assert_clean(dev.as_ref(), "after the race");
    let fs = mount(dev.clone());
    for (dir, acked) in &results {
        verify_acked(&fs, *dir, acked);
    }
    fs.close().unwrap();
}

#[test]
fn writers_racing_for_the_last_space_with_the_flusher() {
    let _w = Watchdog::new("race-flusher", Duration::from_secs(120));
    race_for_the_last_space(
        MountOptions {
            commit_interval: Some(Duration::from_millis(200)),
            dirty_limit_bytes: 4 * MIB,
            ..MountOptions::default()
        },
        8,
        1,
    );
}

#[test]
fn writers_racing_for_the_last_space_reclaim_themselves() {
    let _w = Watchdog::new("race-inline", Duration::from_secs(120));
    race_for_the_last_space(MountOptions::deterministic(), 6, 2);
}

// ----------------------------------------------------------------------
// Crash cases (docs/DELALLOC.md)
// ----------------------------------------------------------------------

/// About `budget` crash points from flush `from` on, seeded by `seed`.
fn budgeted_points(
    rec: &RecordingDevice,
    from: usize,
    budget: usize,
    seed: u64,
) -> Vec<CrashPoint> {
    crash_points(rec, from, &Enumeration::budgeted(budget, seed))
}

#[test]
fn partial_writeback_without_commit_is_invisible() {
    let rec = recorder(16 * MIB);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let a = fs.create(root, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write_file(a, 0, &[b'A'; 65536]).unwrap();
    fs.sync().unwrap();
    let synced = rec.flush_count();
    fs.write_file(a, 0, &[b'B'; 65536]).unwrap();
    let b = fs.create(root, b"b", 0o644, 0, 0).unwrap().ino;
    fs.write_file(b, 0, &pattern(1, 0, 256 * 1024)).unwrap();
    assert_eq!(fs.flush_range(a, 0, 16 * 1024).unwrap(), 4);
    assert_eq!(fs.flush_range(b, 0, u64::MAX).unwrap(), 64);
    assert_eq!(
        rec.flush_count(),
        synced,
        "a range flush made something durable"
    );
    let n = rec.writes_in_window(synced);
    assert!(n >= 2, "the data writes are pending");
    std::mem::forget(fs);
    let want: View = [("/a".to_string(), vec![b'A'; 65536])]
        .into_iter()
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut points: Vec<CrashPoint> = (0..=n)
        .map(|k| CrashPoint {
            flushes_completed: synced,
            kept_writes: (0..k).collect(),
        })
        .collect();
    points.extend((0..16).map(|_| CrashPoint {
        flushes_completed: synced,
        kept_writes: (0..n).filter(|_| rng.gen_bool(0.5)).collect(),
    }));
    for point in points {
        assert_eq!(crash_view(&rec, &point), want, "{point:?}");
    }
}

#[test]
fn fsync_after_page_bounded_writeback_survives() {
    let rec = recorder(16 * MIB);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    fs.sync().unwrap();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    let mut want = pattern(2, 0, MIB as usize);
    fs.write_file(f, 0, &want).unwrap();
    fs.flush_range(f, 256 * 1024, 256 * 1024).unwrap();
    fs.write_file(f, 300 * 1024, &[b'X'; 10 * 1024]).unwrap();
    want[300 * 1024..310 * 1024].fill(b'X');
    let tail = pattern(3, MIB, 5000);
    fs.write_file(f, MIB, &tail).unwrap();
    want.extend_from_slice(&tail);
    fs.fsync(f, false).unwrap();
    assert_eq!(fs.stats().commits, 0, "the fsync was answered by the log");
    let from = rec.flush_count();
    // Later unsynced work, including page-bounded writeback of another file.
    let g = fs.create(root, b"g", 0o644, 0, 0).unwrap().ino;
    fs.write_file(g, 0, &pattern(4, 0, 200_000)).unwrap();
    fs.flush_range(g, 0, 100_000).unwrap();
    std::mem::forget(fs);
    for point in budgeted_points(&rec, from, 24, 12) {
        let v = crash_view(&rec, &point);
        assert!(v.get("/f") == Some(&want), "{point:?}: f lost or wrong");
    }
}

/// Checks that every file of a crash view is one the workload made and
/// holds a prefix of what was written to it.
fn assert_prefixes(v: &View, written: &BTreeMap<String, (u64, usize)>, point: &CrashPoint) {
    for (path, data) in v {
        let Some(&(id, len)) = written.get(path) else {
            panic!("{point:?}: unexpected {path}");
        };
        assert!(data.len() <= len, "{point:?}: {path} longer than written");
        assert!(
            *data == pattern(id, 0, data.len()),
            "{point:?}: {path} holds bytes never written to it"
        );
    }
}

#[test]
fn reclaim_under_pressure_keeps_fsynced_files() {
    let _w = Watchdog::new("reclaim-crash", Duration::from_secs(120));
    let rec = recorder(24 * MIB);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let mut written: BTreeMap<String, (u64, usize)> = BTreeMap::new();
    for i in 0..4u64 {
        let name = format!("s{i}");
        let ino = fs.create(root, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        let len = 40_000 + i as usize * 30_000;
        fs.write_file(ino, 0, &pattern(i, 0, len)).unwrap();
        fs.fsync(ino, false).unwrap();
        written.insert(format!("/{name}"), (i, len));
    }
    let from = rec.flush_count();
    let acked = fill_until_enospc(&fs, root, "w", 100, 5);
    for (name, &(id, len)) in &acked {
        written.insert(format!("/{name}"), (id, len as usize));
    }
    let stats = fs.space_stats();
    assert!(
        stats.reclaim_commits > 0 && stats.tickets_queued > 0,
        "{stats:?}"
    );
    std::mem::forget(fs);
    for point in budgeted_points(&rec, from, 40, 13) {
        let v = crash_view(&rec, &point);
        for i in 0..4u64 {
            let (id, len) = written[&format!("/s{i}")];
            assert!(
                v.get(&format!("/s{i}")) == Some(&pattern(id, 0, len)),
                "{point:?}: fsynced s{i} lost"
            );
        }
        assert_prefixes(&v, &written, &point);
    }
}

#[test]
fn acknowledged_writes_survive_sync_after_enospc() {
    let rec = recorder(20 * MIB);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let acked = fill_until_enospc(&fs, root, "f", 0, 6);
    fs.sync().unwrap();
    let from = rec.flush_count();
    std::mem::forget(fs);
    let want: View = acked
        .iter()
        .map(|(name, &(id, len))| (format!("/{name}"), pattern(id, 0, len as usize)))
        .collect();
    for point in budgeted_points(&rec, from, 4, 14) {
        assert!(crash_view(&rec, &point) == want, "{point:?}");
    }
}

/// A write that fits in part: `write_file` returns the short count, as
/// write(2) does; `write_file_whole` keeps the part that fit and returns
/// the error for the rest, for a caller that cannot take a short count
/// (the FUSE write-back of cached pages, docs/FUSE.md).
#[test]
fn write_file_whole_refuses_the_rest_where_write_file_returns_a_short_count() {
    let _w = Watchdog::new("whole", Duration::from_secs(120));
    let fs = mount(memory_fs(20 * MIB));
    let root = fs.root_ino();
    // Created first: a full filesystem has no room for a new inode.
    let short = fs.create(root, b"short", 0o644, 0, 0).unwrap().ino;
    let whole = fs.create(root, b"whole", 0o644, 0, 0).unwrap().ino;
    let acked = fill_until_enospc(&fs, root, "f", 0, 9);
    let want = 4 * MIB as usize;
    let mut freed = 0;
    for (name, &(_, len)) in &acked {
        if freed >= 512 * 1024 {
            break;
        }
        fs.unlink(root, name.as_bytes()).unwrap();
        freed += len;
    }
    // What the unlinks freed is free once a commit made them durable.
    fs.sync().unwrap();
    let accepted = fs.write_file(short, 0, &pattern(1, 0, want)).unwrap();
    assert!(
        accepted > 0 && accepted < want,
        "{freed} bytes freed, {accepted} of {want} accepted"
    );
    fs.unlink(root, b"short").unwrap();
    fs.sync().unwrap();
    let enospc = fs.space_stats().enospc;
    assert!(matches!(
        fs.write_file_whole(whole, 0, &pattern(2, 0, want)),
        Err(Error::NoSpace)
    ));
    assert_eq!(
        fs.space_stats().enospc,
        enospc + 1,
        "the refusal is counted"
    );
    let kept = fs.getattr(whole).unwrap().size as usize;
    assert!(kept > 0 && kept < want, "{kept} of {want} bytes kept");
    assert!(fs.read_file(whole, 0, kept).unwrap() == pattern(2, 0, kept));
}

#[test]
fn unlink_on_full_filesystem_then_refill_is_atomic() {
    let _w = Watchdog::new("unlink-refill", Duration::from_secs(120));
    let rec = recorder(20 * MIB);
    let fs = mount(rec.clone());
    let root = fs.root_ino();
    let acked = fill_until_enospc(&fs, root, "f", 0, 7);
    fs.sync().unwrap();
    let before = view(&fs);
    for name in acked.keys().step_by(2) {
        fs.unlink(root, name.as_bytes()).unwrap();
    }
    // The new data needs the space the unlinks pinned: a reclaim commit.
    let commits = fs.stats().commits;
    let more = fill_until_enospc(&fs, root, "g", 500, 8);
    assert!(total(&more) > 0);
    assert!(
        fs.stats().commits > commits,
        "no reclaim commit unpinned the space"
    );
    let synced = rec.flush_count();
    fs.sync().unwrap();
    let after = view(&fs);
    drop(fs);
    assert_ne!(before, after);
    let mut written: BTreeMap<String, (u64, usize)> = BTreeMap::new();
    for (name, &(id, len)) in acked.iter().chain(more.iter()) {
        written.insert(format!("/{name}"), (id, len as usize));
    }
    // What was durable when the last sync began (the reclaim commits made
    // the unlinks and part of the refill durable).
    let start = CrashPoint {
        flushes_completed: synced,
        kept_writes: vec![],
    };
    let durable = crash_view(&rec, &start);
    assert_prefixes(&durable, &written, &start);
    for point in budgeted_points(&rec, synced, 20, 15) {
        let v = crash_view(&rec, &point);
        assert!(
            v == durable || v == after,
            "{point:?}: neither the state before the sync nor after it"
        );
    }
}

/// Written-back page buffers are reused for later writes (file.rs,
/// `SparePages`): a reused buffer must not show its old bytes. Pages full
/// of 0xAA are written back by fsync, then partial pages of another file
/// and of the same file past its end are written: everything around the
/// written bytes reads as zeros, before and after their own writeback.
#[test]
fn reused_page_buffers_show_no_old_bytes() {
    let fs = mount(memory_fs(16 * MIB));
    let root = fs.root_ino();
    let old = fs.create(root, b"old", 0o644, 0, 0).unwrap().ino;
    fs.write_file(old, 0, &vec![0xAA; 64 * 4096]).unwrap();
    fs.fsync(old, false).unwrap();
    let new = fs.create(root, b"new", 0o644, 0, 0).unwrap().ino;
    fs.write_file(new, 100, b"0123456789").unwrap();
    fs.write_file(new, 3 * 4096 + 5, b"x").unwrap();
    fs.write_file(old, 70 * 4096 + 10, b"y").unwrap();
    let check = |when: &str| {
        let mut want = vec![0u8; 3 * 4096 + 6];
        want[100..110].copy_from_slice(b"0123456789");
        want[3 * 4096 + 5] = b'x';
        assert_eq!(fs.read_file(new, 0, 4 * 4096).unwrap(), want, "{when}");
        let tail = fs.read_file(old, 64 * 4096, 8 * 4096).unwrap();
        let mut want = vec![0u8; 6 * 4096 + 11];
        want[6 * 4096 + 10] = b'y';
        assert_eq!(tail, want, "{when}");
    };
    check("dirty");
    fs.sync().unwrap();
    check("written back");
}
