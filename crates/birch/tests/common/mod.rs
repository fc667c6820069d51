//! Crash-state helpers shared by the engine's crash tests (`crash_cases`,
//! `tree_log`, `delalloc`): a recording device holding a fresh filesystem,
//! the whole-tree view the tests compare, the crash points to enumerate,
//! and the checked mount of each crash image.

// Each test binary compiles this module on its own and uses a subset of it.
#![allow(dead_code)]

pub mod send_apply;

use birch::check::{check_device, check_device_with, CheckOptions};
use birch::device::{BlockDevice, CrashPoint, MemoryDevice, RecordingDevice};
use birch::format::FileType;
use birch::fs::{Filesystem, MetadataCopies, MkfsOptions, MountOptions, ReplayOutcome};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A fresh filesystem of `bytes` on a memory device. `fsid_byte` keeps the
/// images of different test files apart in a dump.
pub fn memory_fs(bytes: u64, fsid_byte: u8) -> Arc<MemoryDevice> {
    memory_fs_with(bytes, fsid_byte, MetadataCopies::default())
}

/// [`memory_fs`] with the metadata profile chosen.
pub fn memory_fs_with(bytes: u64, fsid_byte: u8, metadata: MetadataCopies) -> Arc<MemoryDevice> {
    let dev = Arc::new(MemoryDevice::new(bytes));
    Filesystem::mkfs(
        dev.as_ref(),
        &MkfsOptions {
            fsid: Some([fsid_byte; 16]),
            metadata,
            ..Default::default()
        },
    )
    .unwrap();
    dev
}

/// A recording device whose starting image is a fresh filesystem: every
/// write and flush from the first mount on is recorded.
pub fn recorder(bytes: u64, fsid_byte: u8) -> Arc<RecordingDevice> {
    recorder_with(bytes, fsid_byte, MetadataCopies::default())
}

/// [`recorder`] with the metadata profile chosen.
pub fn recorder_with(bytes: u64, fsid_byte: u8, metadata: MetadataCopies) -> Arc<RecordingDevice> {
    let dev = memory_fs_with(bytes, fsid_byte, metadata);
    Arc::new(RecordingDevice::new(dev.snapshot()))
}

pub fn mount<D: BlockDevice + 'static>(dev: D) -> Filesystem<D> {
    Filesystem::open(dev, MountOptions::deterministic()).unwrap()
}

pub fn assert_clean<D: BlockDevice + ?Sized>(dev: &D, when: &str) {
    let report = check_device(dev);
    assert!(report.is_clean(), "{when}:\n{report}");
}

/// [`assert_clean`] with `--verify-data`: every referenced data extent
/// read, its checksums compared, compressed ones decompressed.
pub fn assert_clean_with_data<D: BlockDevice + ?Sized>(dev: &D, when: &str) {
    let report = check_device_with(dev, CheckOptions { verify_data: true });
    assert!(report.is_clean(), "{when}:\n{report}");
}

/// Path -> contents (files), "-> target" (symlinks), "<dir>", or "<Type
/// rdev>" (device nodes, fifos, sockets), for the
/// whole tree.
pub type View = BTreeMap<String, Vec<u8>>;

pub fn view<D: BlockDevice + 'static>(fs: &Filesystem<D>) -> View {
    fn walk<D: BlockDevice + 'static>(fs: &Filesystem<D>, dir: u64, prefix: &str, out: &mut View) {
        for e in fs.readdir(dir, 0, usize::MAX).unwrap() {
            let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
            match e.file_type {
                FileType::Directory => {
                    out.insert(path.clone(), b"<dir>".to_vec());
                    walk(fs, e.ino, &path, out);
                }
                // A failing read shows in the view (and so in the failing
                // test's message, with its crash point) instead of panicking.
                FileType::Symlink => {
                    let shown = match fs.readlink(e.ino) {
                        Ok(target) => [b"-> ".as_slice(), &target].concat(),
                        Err(err) => format!("<readlink failed: {err}>").into_bytes(),
                    };
                    out.insert(path, shown);
                }
                // Device nodes, fifos and sockets have no data to read:
                // their type and device number stand for it (a whiteout
                // shows as "<CharDevice 0>").
                FileType::CharDevice
                | FileType::BlockDevice
                | FileType::Fifo
                | FileType::Socket => {
                    let rdev = fs.getattr(e.ino).unwrap().rdev;
                    out.insert(path, format!("<{:?} {rdev}>", e.file_type).into_bytes());
                }
                FileType::Regular => {
                    let size = fs.getattr(e.ino).unwrap().size;
                    let data = fs.read_file(e.ino, 0, size as usize).unwrap();
                    assert_eq!(data.len() as u64, size, "{path}: short read");
                    out.insert(path, data);
                }
            }
        }
    }
    let mut out = View::new();
    walk(fs, fs.root_ino(), "", &mut out);
    out
}

/// The inode at `path` (components separated by '/').
pub fn ino<D: BlockDevice + 'static>(fs: &Filesystem<D>, path: &str) -> u64 {
    let mut cur = fs.root_ino();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        cur = fs.lookup(cur, part.as_bytes()).unwrap().ino;
    }
    cur
}

/// Mounts the image a power cut at `point` leaves (replaying a log if it
/// has one), requires `birch check` to pass before and after the mount
/// (which may replay and clean up orphans), and returns what it shows.
pub fn crash_view(rec: &RecordingDevice, point: &CrashPoint) -> View {
    crash_mount(rec, point, view)
}

/// The checked mount of [`crash_view`], handing the mounted filesystem to
/// `inspect`. A log that replay had to throw away fails the test: replay
/// is total, and discarding a log is a bug's last line of defence.
pub fn crash_mount<R>(
    rec: &RecordingDevice,
    point: &CrashPoint,
    inspect: impl FnOnce(&Filesystem<Arc<MemoryDevice>>) -> R,
) -> R {
    let dev = Arc::new(MemoryDevice::from_bytes(rec.crash_image(point)));
    assert_clean(
        dev.as_ref(),
        &format!("{point:?}: check of the crashed image"),
    );
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic())
        .unwrap_or_else(|e| panic!("{point:?}: mount failed: {e}"));
    match fs.replay_outcome() {
        Some(ReplayOutcome::Discarded(why)) => {
            panic!("{point:?}: replay discarded the log: {why}")
        }
        Some(ReplayOutcome::Replayed(report)) => assert_eq!(
            report.names_without_parent, 0,
            "{point:?}: replay dropped logged names: {report:?}"
        ),
        None => {}
    }
    let result = inspect(&fs);
    fs.close().unwrap();
    assert_clean(dev.as_ref(), &format!("{point:?}: check after mount"));
    result
}

/// Which crash states to take at each flush point of a recording.
pub struct Enumeration {
    /// A window of at most this many pending writes gets every subset.
    pub every_subset_up_to: usize,
    /// A larger window gets, besides the empty and the full set, every
    /// prefix and every set that drops a single write.
    pub prefixes_and_drops: bool,
    /// A larger window also gets this many seeded random subsets.
    pub random_subsets: usize,
    /// At most about this many points in all: with a budget, flushes are
    /// stepped over (the last one is always taken) and each flush gets at
    /// most its share.
    pub budget: Option<usize>,
    /// Seed of the random subsets; a failure names it with the point.
    pub seed: u64,
}

impl Enumeration {
    /// Every subset of windows up to 10 writes; larger windows get every
    /// prefix, every single drop and 64 random subsets.
    pub fn thorough(seed: u64) -> Self {
        Enumeration {
            every_subset_up_to: 10,
            prefixes_and_drops: true,
            random_subsets: 64,
            budget: None,
            seed,
        }
    }

    /// Every subset of windows up to 8 writes; larger windows get the
    /// empty set, the full set and 48 random subsets.
    pub fn sampled(seed: u64) -> Self {
        Enumeration {
            every_subset_up_to: 8,
            prefixes_and_drops: false,
            random_subsets: 48,
            budget: None,
            seed,
        }
    }

    /// About `budget` points spread over all flushes, for recordings with
    /// too many flushes to visit each one thoroughly.
    pub fn budgeted(budget: usize, seed: u64) -> Self {
        Enumeration {
            every_subset_up_to: 3,
            prefixes_and_drops: false,
            random_subsets: usize::MAX,
            budget: Some(budget),
            seed,
        }
    }
}

/// The crash points of `rec` from flush `from` on, as `how` says.
pub fn crash_points(rec: &RecordingDevice, from: usize, how: &Enumeration) -> Vec<CrashPoint> {
    let mut rng = ChaCha8Rng::seed_from_u64(how.seed);
    let mut flushes: Vec<usize> = (from..=rec.flush_count()).collect();
    let mut per_flush = usize::MAX;
    if let Some(budget) = how.budget {
        per_flush = (budget / flushes.len().max(1)).max(2);
        if per_flush == 2 {
            let step = flushes.len().div_ceil(budget / 2).max(1);
            let last = flushes.last().copied();
            flushes = flushes.into_iter().step_by(step).collect();
            if let Some(last) = last.filter(|l| flushes.last() != Some(l)) {
                flushes.push(last);
            }
        }
    }
    let mut points = Vec::new();
    for k in flushes {
        let n = rec.writes_in_window(k);
        let mut add = |kept_writes: Vec<usize>| {
            points.push(CrashPoint {
                flushes_completed: k,
                kept_writes,
            })
        };
        if n <= how.every_subset_up_to && (1usize << n) <= per_flush {
            for mask in 0u64..(1 << n) {
                add((0..n).filter(|i| mask & (1 << i) != 0).collect());
            }
            continue;
        }
        add(vec![]);
        add((0..n).collect());
        if how.prefixes_and_drops {
            for prefix in 1..n {
                add((0..prefix).collect());
            }
            for drop in 0..n {
                add((0..n).filter(|&i| i != drop).collect());
            }
        }
        for _ in 0..how.random_subsets.min(per_flush.saturating_sub(2)) {
            add((0..n).filter(|_| rng.gen_bool(0.5)).collect());
        }
    }
    points
}

/// Asserts `property` of every crash state `how` enumerates from flush
/// `from` on; returns how many states were checked.
pub fn for_every_crash_after(
    rec: &RecordingDevice,
    from: usize,
    how: &Enumeration,
    property: impl Fn(&View) -> Result<(), String>,
) -> usize {
    let points = crash_points(rec, from, how);
    for point in &points {
        let v = crash_view(rec, point);
        if let Err(why) = property(&v) {
            panic!(
                "crash at {point:?} (seed {}): {why}\nstate: {:?}",
                how.seed,
                v.keys().collect::<Vec<_>>()
            );
        }
    }
    points.len()
}

/// Like [`for_every_crash_after`], with the mounted filesystem and the
/// crash point at hand: a property can look at link counts, and can tell
/// states before an fsync returned from those after it.
pub fn for_every_crash_mount_after(
    rec: &RecordingDevice,
    from: usize,
    how: &Enumeration,
    property: impl Fn(&CrashPoint, &Filesystem<Arc<MemoryDevice>>, &View) -> Result<(), String>,
) -> usize {
    let points = crash_points(rec, from, how);
    for point in &points {
        let (outcome, v) = crash_mount(rec, point, |fs| {
            let v = view(fs);
            (property(point, fs, &v), v)
        });
        if let Err(why) = outcome {
            // The first paths are enough to see the shape of a large tree.
            panic!(
                "crash at {point:?} (seed {}): {why}\nstate ({} paths): {:?}",
                how.seed,
                v.len(),
                v.keys().take(40).collect::<Vec<_>>()
            );
        }
    }
    points.len()
}

/// `path` in the view holds exactly `data` (for a directory: `<dir>`).
pub fn require_content(v: &View, path: &str, data: &[u8]) -> Result<(), String> {
    match v.get(path) {
        Some(d) if d.as_slice() == data => Ok(()),
        Some(d) => Err(format!(
            "{path}: {} bytes, not the expected {}",
            d.len(),
            data.len()
        )),
        None => Err(format!("{path} missing")),
    }
}

/// A device whose next flush, once armed, blocks until released, counting
/// the log-tree nodes written meanwhile: a commit held in its node flush
/// while an fsync runs (seed 002's tests).
pub struct GatedDevice {
    pub inner: Arc<RecordingDevice>,
    pub armed: std::sync::atomic::AtomicBool,
    pub held: std::sync::Mutex<bool>,
    pub released: std::sync::Condvar,
    pub log_node_writes_while_held: std::sync::atomic::AtomicUsize,
}

impl GatedDevice {
    pub fn new(inner: Arc<RecordingDevice>) -> GatedDevice {
        GatedDevice {
            inner,
            armed: Default::default(),
            held: Default::default(),
            released: Default::default(),
            log_node_writes_while_held: Default::default(),
        }
    }
}

impl BlockDevice for GatedDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        // A node of a log tree (header: magic at 4, owner at 24).
        let owner = buf
            .get(24..32)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
        let log_node = buf.get(4..8) == Some(&birch::format::NODE_MAGIC.to_le_bytes()[..])
            && matches!(
                owner,
                Some(birch::format::tree_id::LOG | birch::format::tree_id::LOG_ROOT)
            );
        if log_node && *self.held.lock().unwrap() {
            self.log_node_writes_while_held
                .fetch_add(1, Ordering::SeqCst);
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let mut held = self.held.lock().unwrap();
            *held = true;
            while *held {
                held = self.released.wait(held).unwrap();
            }
        }
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// Text-like bytes that compress well, different for each `seed`.
pub fn compressible_text(seed: u8, len: usize) -> Vec<u8> {
    let words: [&[u8]; 6] = [
        b"birch ", b"extent ", b"tree ", b"node ", b"commit ", b"log\n",
    ];
    let mut out = Vec::with_capacity(len);
    let mut i = seed as usize;
    while out.len() < len {
        out.extend_from_slice(words[i % words.len()]);
        out.push(b'0' + (i % 10) as u8);
        i = i.wrapping_mul(7).wrapping_add(3 + seed as usize);
    }
    out.truncate(len);
    out
}

/// Bytes that do not compress (xorshift), different for each `seed`.
pub fn incompressible_noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Where a leaf's item headers start, and their size (docs/FORMAT.md).
const NODE_BODY: usize = 64;
const LEAF_ITEM_HEADER: usize = 17 + 8;

/// The leaf of tree `tree` holding `key`, and the key's slot.
pub fn leaf_with(dev: &MemoryDevice, tree: u64, key: birch::format::Key) -> (u64, usize, Vec<u8>) {
    let sb = birch::fs::read_superblock(dev).unwrap();
    let (roots, _) = birch::check::tree_roots(dev, &sb);
    let root = roots.into_iter().find(|r| r.tree == tree).unwrap();
    let (nodes, problems) = birch::check::tree_nodes(dev, &sb.fsid, root);
    assert!(problems.is_empty(), "{problems:?}");
    nodes
        .into_iter()
        .find_map(|(bytenr, node)| match node.body {
            birch::format::NodeBody::Leaf(items) => items
                .iter()
                .position(|i| i.key == key)
                .map(|slot| (bytenr, slot, items[slot].data.clone())),
            birch::format::NodeBody::Internal(_) => None,
        })
        .unwrap_or_else(|| panic!("no item {key} in tree {tree}"))
}

/// Changes the body of item `slot` of the node at `bytenr` with `change`
/// and reseals the node and its DUP mirror.
pub fn patch_item(dev: &MemoryDevice, bytenr: u64, slot: usize, change: impl Fn(&mut [u8])) {
    let sb = birch::fs::read_superblock(dev).unwrap();
    let copies =
        std::iter::once(bytenr).chain(sb.metadata_profile.mirror_offset().map(|off| bytenr + off));
    for at in copies {
        let mut node = vec![0u8; birch::format::NODE_SIZE];
        dev.read_at(&mut node, at).unwrap();
        let header = NODE_BODY + slot * LEAF_ITEM_HEADER + 17;
        let offset = u32::from_le_bytes(node[header..header + 4].try_into().unwrap()) as usize;
        let size = u32::from_le_bytes(node[header + 4..header + 8].try_into().unwrap()) as usize;
        change(&mut node[NODE_BODY + offset..NODE_BODY + offset + size]);
        let crc = crc32c::crc32c(&node[4..]);
        node[0..4].copy_from_slice(&crc.to_le_bytes());
        dev.write_at(&node, at).unwrap();
    }
}
