//! Crash-state exploration.
//!
//! A workload runs on a [`RecordingDevice`] (engine and model side by side,
//! as in the model tests); the trace keeps every device write and flush,
//! and for every op the device position before and after it, the model's
//! view after it, and the generation the engine had made durable. Then
//! every flush point k (0..=flushes) and many subsets of the writes of the
//! window after it (all subsets of a window of at most
//! [`CrashConfig::exhaustive_max_writes`] writes, else a seeded sample that
//! includes the empty and full sets, prefixes and single-write drops) give
//! a crash image, and each one is judged by the oracles:
//!
//! 1. **mount**: `birch check` is clean on the raw image; it opens; after
//!    open + close the check is clean again;
//! 2. **generation**: the superblock generation g is exactly the newest
//!    generation among the superblock writes the media kept, and
//!    `durable(k) <= g <= issued(k)`;
//! 3. **exact state**: the recovered view equals the model's view at the
//!    commit of generation g (applies while the superblock carries no log
//!    tree to replay);
//! 4. **persistence guarantees** ([`check_guarantees`]): what each
//!    completed sync / fsync / fsync-dir promised is there. This oracle
//!    does not assume that durable states are commits, so it stays valid
//!    when fsync writes a log tree instead of committing (the tree-log
//!    issue), where oracle 3 no longer applies to states with a log;
//! 5. **nothing durable is lost** ([`check_durable`]): every inode durable
//!    before the crash (followed by inode number, not by name) is still
//!    reachable with content it had since, unless a removal of it can have
//!    reached the media.
//!
//! docs/CRASH-TESTING.md has the media model, the enumeration and the
//! oracles in prose.

use crate::extract::engine_view_with_inos;
use crate::harness::{check_image, check_image_summary, Sim};
use crate::model::{diff_entry, diff_views, show_path, Kind, MIno, Model, Path, View};
use crate::overlay::OverlayDevice;
use crate::runner::fresh_device;
use crate::workload::{Generator, Op, Persist, Target, WorkloadConfig};
use birch::device::{BlockDevice, CrashPoint, DeviceEvent, MemoryDevice, RecordingDevice};
use birch::format::{
    Superblock, Timespec, NODE_MAGIC, NODE_SIZE, SUPERBLOCK_OFFSETS, SUPERBLOCK_SIZE,
};
use birch::fs::{CompressOption, Filesystem, MountOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Knobs of one crash exploration.
#[derive(Clone, Debug)]
pub struct CrashConfig {
    pub seed: u64,
    pub ops: usize,
    pub device_bytes: u64,
    pub workload: WorkloadConfig,
    pub mount: MountOptions,
    /// Windows with at most this many writes get every subset.
    pub exhaustive_max_writes: usize,
    /// Random subsets tried in a larger window, beyond the empty and full
    /// sets, the prefixes and the single-write drops.
    pub sample_subsets: usize,
    /// At most this many prefixes and single-write drops of a larger window
    /// (evenly thinned); `None`: every one.
    pub max_structured: Option<usize>,
    /// Compare the live engine's view with the model at every commit while
    /// recording.
    pub verify_live_views: bool,
    /// Tear writes into units of this many bytes (a multiple of 4096), each
    /// kept or lost on its own; `None` keeps or loses whole writes.
    pub split_writes: Option<usize>,
    /// Files created (in /p, with a little data each) before the random
    /// ops, so the trees have several levels and commits write scattered
    /// nodes (larger windows).
    pub prepopulate: usize,
    /// Crash states are built only at flush points `k >= first_flush` (the
    /// windows before are replayed, not judged): for workloads that share a
    /// setup whose states are checked elsewhere (the ACE workloads).
    pub first_flush: usize,
}

impl CrashConfig {
    /// The CI size. Seeds differ in how often persistence points come
    /// (every few ops: many small commits; rarely: few commits with large
    /// windows of writes).
    pub fn ci(seed: u64) -> CrashConfig {
        let mut workload = WorkloadConfig::crash();
        workload.persist_weight = [12, 5, 2][(seed % 3) as usize];
        CrashConfig {
            seed,
            ops: 40,
            device_bytes: 24 << 20,
            workload,
            mount: MountOptions {
                // Drops of deleted subvolumes span several commits on
                // some seeds, so crashes land in the middle of one.
                cleaner_nodes_per_transaction: [1, 2, 4096][(seed % 3) as usize],
                compress: compress_option_for(seed),
                ..crate::runner::mount_options_for(seed)
            },
            exhaustive_max_writes: 10,
            sample_subsets: 64,
            max_structured: Some(64),
            verify_live_views: true,
            prepopulate: [0, 0, 40, 0, 100, 200][(seed % 6) as usize],
            split_writes: (seed % 5 == 1).then_some(4096),
            first_flush: 0,
        }
    }

    /// The long mode: longer workloads, every subset of windows up to 10
    /// writes, 64 samples of larger ones.
    pub fn long(seed: u64) -> CrashConfig {
        let ci = CrashConfig::ci(seed);
        CrashConfig {
            ops: 80,
            sample_subsets: 128,
            max_structured: None,
            prepopulate: ci.prepopulate * 2,
            split_writes: (seed % 2 == 1).then_some(4096),
            ..ci
        }
    }
}

/// The compression mount option of a crash seed: `compress=zstd`,
/// `compress=lz4` or `compress-force=zstd:1` on three seeds in five, none
/// on the others (there only `chattr +c` files compress). The workloads'
/// text writes then leave compressed extents that later ops cut and
/// share (docs/COMPRESSION.md, "The explorer").
pub fn compress_option_for(seed: u64) -> CompressOption {
    let option = match (seed / 3) % 5 {
        0 => "zstd",
        1 => "lz4",
        2 => "zstd:1",
        _ => return CompressOption::default(),
    };
    CompressOption::parse(option, option == "zstd:1").expect("a valid compress option")
}

/// Counts the writes and flushes that reach the recording device, so the
/// trace can note device positions cheaply.
pub struct Counted<D> {
    inner: D,
    events: AtomicUsize,
    flushes: AtomicUsize,
}

impl<D> Counted<D> {
    pub fn new(inner: D) -> Self {
        Counted {
            inner,
            events: AtomicUsize::new(0),
            flushes: AtomicUsize::new(0),
        }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// (events so far, flushes so far).
    pub fn position(&self) -> (usize, usize) {
        (
            self.events.load(Ordering::SeqCst),
            self.flushes.load(Ordering::SeqCst),
        )
    }
}

impl<D: BlockDevice> BlockDevice for Counted<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)?;
        self.events.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()?;
        self.events.fetch_add(1, Ordering::SeqCst);
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// What a persistence op covered, noted when it ran.
#[derive(Clone, Debug)]
pub enum Covered {
    /// Everything.
    All,
    /// An inode: its paths at the time (empty if it had none).
    Inode {
        ino: MIno,
        paths: Vec<Path>,
        dir: bool,
    },
}

/// One op of a recorded workload.
#[derive(Clone, Debug)]
pub struct OpRecord {
    pub op: Op,
    /// Device events (writes + flushes) issued before the op began.
    pub events_before: usize,
    pub events_after: usize,
    pub flushes_before: usize,
    pub flushes_after: usize,
    /// Generation durable when the op returned.
    pub generation_after: u64,
    /// Whether the op succeeded.
    pub ok: bool,
    /// The model's view after the op.
    pub view_after: View,
    /// The model inode at each path of `view_after`.
    pub inos_after: BTreeMap<Path, MIno>,
    /// One path of each model inode of `view_after` (the first).
    pub path_of: HashMap<MIno, Path>,
    /// For an fsync of a directory: [`Trace::new_subtree`], computed once.
    pub subtree: Option<(usize, Vec<Path>)>,
    /// For persistence ops: what they covered.
    pub persist: Option<(Persist, Covered)>,
    /// The path of the subvolume link this op removed (a subvolume
    /// delete, or rmdir of an empty subvolume), when it succeeded.
    pub deleted_subvolume: Option<Path>,
}

/// A superblock write found in the trace.
#[derive(Clone, Debug)]
pub struct SbWrite {
    /// Index among all events.
    pub event: usize,
    /// Flushes completed before it (its window).
    pub window: usize,
    /// Position in its window.
    pub pos: usize,
    pub copy: u64,
    pub generation: u64,
    pub has_log: bool,
}

/// A recorded workload.
pub struct Trace {
    pub seed: u64,
    pub initial: Vec<u8>,
    pub events: Vec<DeviceEvent>,
    /// Event index of each flush.
    pub flush_events: Vec<usize>,
    pub ops: Vec<OpRecord>,
    /// Generation -> the model's view at that commit.
    pub snapshots: BTreeMap<u64, View>,
    pub sb_writes: Vec<SbWrite>,
    pub initial_generation: u64,
    /// Known engine bugs tolerated while recording.
    pub tolerated: Vec<String>,
    /// Engine inode number -> model inode (found by path after every op;
    /// the engine never reuses a number within one mount).
    pub engine_inos: HashMap<u64, MIno>,
    /// Writes are split into units of this many bytes, each kept or lost
    /// on its own (torn multi-sector writes); `None`: whole writes.
    pub unit: Option<usize>,
    /// The clock when the workload ended: no inode of a crash state may
    /// carry a later mtime or ctime (oracle 7).
    pub ended_at: Timespec,
    recording: Arc<Counted<RecordingDevice>>,
}

/// Where a workload comes from.
pub enum OpSource {
    /// `ops` ops from the seeded generator.
    Generated,
    /// A fixed script.
    Script(Vec<Op>),
}

fn sb_writes_of(events: &[DeviceEvent], unit: Option<usize>) -> Result<Vec<SbWrite>, String> {
    let mut out = Vec::new();
    let mut window = 0;
    let mut pos = 0;
    for (i, e) in events.iter().enumerate() {
        match e {
            DeviceEvent::Flush => {
                window += 1;
                pos = 0;
            }
            DeviceEvent::Write { offset, bytes } => {
                for copy in SUPERBLOCK_OFFSETS {
                    let end = offset + bytes.len() as u64;
                    if *offset < copy + SUPERBLOCK_SIZE as u64 && copy < end {
                        if *offset != copy || bytes.len() != SUPERBLOCK_SIZE {
                            return Err(format!("write {i} ({} bytes at {offset}) covers part of the superblock copy at {copy}", bytes.len()));
                        }
                        let sb = Superblock::decode(bytes, copy).map_err(|e| {
                            format!("write {i}: superblock copy at {copy} does not decode: {e}")
                        })?;
                        out.push(SbWrite {
                            event: i,
                            window,
                            pos,
                            copy,
                            generation: sb.generation,
                            has_log: sb.log_root_bytenr != 0,
                        });
                    }
                }
                pos += unit.map_or(1, |u| bytes.len().div_ceil(u));
            }
        }
    }
    Ok(out)
}

/// A script that creates `files` small files in /p and syncs, followed by
/// `ops` generated ops (`None` entries).
fn prepopulation(files: usize, gen: &mut Generator, ops: usize) -> Vec<Option<Op>> {
    use rand::Rng;
    let mut script = vec![Some(Op::Mkdir {
        path: vec![b"p".to_vec()],
        perm: 0o755,
    })];
    for i in 0..files {
        let path = vec![b"p".to_vec(), format!("file-{i:04}").into_bytes()];
        script.push(Some(Op::Create {
            path: path.clone(),
            perm: 0o644,
        }));
        let len = if i % 10 == 0 {
            gen.rng().gen_range(3000..20000)
        } else {
            gen.rng().gen_range(1..300)
        };
        script.push(Some(Op::Write {
            target: Target::Path(path),
            offset: 0,
            len,
            fill: gen.rng().gen(),
        }));
    }
    script.push(Some(Op::Sync));
    script.extend((0..ops).map(|_| None));
    script
}

/// Engine inode number -> model inode, from model inode -> engine inode,
/// leaving out numbers that named two model inodes: a subvolume id comes
/// back once its deleted tree is dropped entirely (docs/SNAPSHOTS.md (a)),
/// and with it the numbers of its inodes. The oracles that follow inodes
/// by number skip those inodes (their identity across the crash is not
/// known).
fn unambiguous(engine_of: HashMap<MIno, u64>) -> HashMap<u64, MIno> {
    let mut out: HashMap<u64, MIno> = HashMap::new();
    let mut reused = BTreeSet::new();
    for (m, e) in engine_of {
        if out.insert(e, m).is_some() {
            reused.insert(e);
        }
    }
    for e in reused {
        out.remove(&e);
    }
    out
}

/// Paths of model inode `ino` in `model`.
fn paths_of(model: &Model, ino: MIno) -> Vec<Path> {
    model
        .paths()
        .into_iter()
        .filter(|(_, i, _)| *i == ino)
        .map(|(p, _, _)| p)
        .collect()
}

/// The first path of each inode.
fn first_paths(inos: &BTreeMap<Path, MIno>) -> HashMap<MIno, Path> {
    let mut out = HashMap::new();
    for (path, ino) in inos {
        out.entry(*ino).or_insert_with(|| path.clone());
    }
    out
}

/// The model inode at each reachable path.
fn inos_of(model: &Model) -> BTreeMap<Path, MIno> {
    model.paths().into_iter().map(|(p, i, _)| (p, i)).collect()
}

/// Runs a workload on a recording device and returns its trace.
pub fn record(cfg: &CrashConfig, source: OpSource) -> Result<Trace, String> {
    assert!(
        cfg.split_writes.is_none_or(|u| u > 0 && u % 4096 == 0),
        "writes tear at 4 KiB sector granularity at the finest"
    );
    let mem = fresh_device(cfg.device_bytes);
    let initial = mem.snapshot();
    drop(mem);
    let initial_generation = birch::fs::read_superblock(&MemoryDevice::from_bytes(initial.clone()))
        .map_err(|e| format!("mkfs image: {e}"))?
        .generation;
    let dev = Arc::new(Counted::new(RecordingDevice::new(initial.clone())));
    let mut sim = Sim::open(dev.clone(), cfg.mount.clone(), cfg.workload.handles)?;
    let mut snapshots = BTreeMap::new();
    snapshots.insert(initial_generation, sim.model().view());
    let mut generation = sim.generation();
    if generation != initial_generation {
        return Err(format!(
            "mount changed the generation from {initial_generation} to {generation}"
        ));
    }
    // Model inode -> engine inode, for every inode that ever had a name.
    let mut engine_of = HashMap::from([(crate::model::ROOT, sim.fs().root_ino())]);
    let mut gen = Generator::new(cfg.seed, cfg.workload.clone());
    let script = match source {
        OpSource::Generated if cfg.prepopulate > 0 => {
            Some(prepopulation(cfg.prepopulate, &mut gen, cfg.ops))
        }
        OpSource::Generated => None,
        OpSource::Script(ops) => Some(ops.into_iter().map(Some).collect()),
    };
    let count = script.as_ref().map_or(cfg.ops, |s| s.len());
    let mut ops: Vec<OpRecord> = Vec::new();
    let fail = |ops: &[OpRecord], msg: String| -> String {
        let mut s = format!("seed={} while recording: {msg}\n", cfg.seed);
        for (i, r) in ops.iter().enumerate() {
            s.push_str(&format!("  #{i}: {}\n", r.op));
        }
        s
    };
    for i in 0..count {
        let op = match script.as_ref().and_then(|s| s[i].clone()) {
            Some(op) => op,
            None => gen.next_op(sim.model()),
        };
        assert!(op != Op::Remount, "crash workloads do not remount");
        let covered = match &op {
            Op::Sync | Op::CreateSubvolume { .. } | Op::Snapshot { .. } => Some(Covered::All),
            Op::Fsync { target, .. } | Op::FsyncDir { target } => {
                let ino = match target {
                    Target::Path(p) => sim.model().resolve(p).ok(),
                    Target::Handle(h) => sim.model_handle(*h),
                };
                ino.map(|ino| Covered::Inode {
                    ino,
                    paths: paths_of(sim.model(), ino),
                    dir: sim.model().inode(ino).is_some_and(|n| n.kind == Kind::Dir),
                })
            }
            _ => None,
        };
        let link = match &op {
            Op::DeleteSubvolume { path } | Op::Rmdir { path } => sim
                .model()
                .resolve(path)
                .ok()
                .filter(|&ino| !path.is_empty() && sim.model().is_subvol_root(ino))
                .map(|_| path.clone()),
            _ => None,
        };
        let (events_before, flushes_before) = dev.position();
        let outcome = sim
            .step(&op)
            .map_err(|e| fail(&ops, format!("op #{i} `{op}`: {e}")))?;
        let (events_after, flushes_after) = dev.position();
        let now = sim.generation();
        if now != generation {
            if now != generation + 1 {
                return Err(fail(
                    &ops,
                    format!("op #{i} `{op}` moved the generation from {generation} to {now}"),
                ));
            }
            generation = now;
            snapshots.insert(now, sim.model().view());
            if cfg.verify_live_views {
                sim.compare_views()
                    .map_err(|e| fail(&ops, format!("after op #{i} `{op}` (commit {now}): {e}")))?;
            }
        }
        let inos_after = inos_of(sim.model());
        for (path, ino) in &inos_after {
            if !engine_of.contains_key(ino) {
                let e = sim
                    .engine_ino(path)
                    .map_err(|e| fail(&ops, e))?
                    .ok_or_else(|| {
                        fail(
                            &ops,
                            format!("after op #{i} `{op}` the engine has no {}", show_path(path)),
                        )
                    })?;
                engine_of.insert(*ino, e);
            }
        }
        let ok = outcome.is_ok();
        let persist = op
            .persistence()
            .and_then(|p| if ok { covered.map(|c| (p, c)) } else { None });
        ops.push(OpRecord {
            op,
            events_before,
            events_after,
            flushes_before,
            flushes_after,
            generation_after: now,
            ok,
            view_after: sim.model().view(),
            path_of: first_paths(&inos_after),
            inos_after,
            persist,
            subtree: None,
            deleted_subvolume: link.filter(|_| ok),
        });
    }
    // Unmount: the final commit is part of the trace.
    let view = sim.model().view();
    let inos_after = inos_of(sim.model());
    let (events_before, flushes_before) = dev.position();
    let mut tolerated = std::mem::take(&mut sim.tolerated);
    sim.close().map_err(|e| fail(&ops, format!("close: {e}")))?;
    let (events_after, flushes_after) = dev.position();
    let final_generation = birch::fs::read_superblock(dev.as_ref())
        .map_err(|e| fail(&ops, format!("superblock after close: {e}")))?
        .generation;
    if final_generation != generation {
        snapshots.insert(final_generation, view.clone());
    }
    ops.push(OpRecord {
        op: Op::Sync,
        events_before,
        events_after,
        flushes_before,
        flushes_after,
        generation_after: final_generation,
        ok: true,
        view_after: view,
        path_of: first_paths(&inos_after),
        inos_after,
        persist: Some((Persist::Sync, Covered::All)),
        subtree: None,
        deleted_subvolume: None,
    });
    let events = dev.inner().events();
    let flush_events = events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, DeviceEvent::Flush))
        .map(|(i, _)| i)
        .collect();
    let sb_writes = sb_writes_of(&events, cfg.split_writes).map_err(|e| fail(&ops, e))?;
    tolerated.extend(
        check_image(dev.inner())
            .map_err(|r| fail(&ops, format!("check after the recorded workload:\n{r}")))?,
    );
    let mut trace = Trace {
        seed: cfg.seed,
        initial,
        events,
        flush_events,
        ops,
        snapshots,
        sb_writes,
        initial_generation,
        tolerated,
        engine_inos: unambiguous(engine_of),
        unit: cfg.split_writes,
        ended_at: Timespec::now(),
        recording: dev,
    };
    // The oracles ask for it in every crash state.
    for f in 0..trace.ops.len() {
        if matches!(
            &trace.ops[f].persist,
            Some((_, Covered::Inode { dir: true, .. }))
        ) {
            trace.ops[f].subtree = Some(trace.new_subtree(f));
        }
    }
    Ok(trace)
}

impl Trace {
    pub fn flush_count(&self) -> usize {
        self.flush_events.len()
    }

    /// The writes of window k (after the k-th flush, before the next), in
    /// issue order; split into units when the trace tears writes.
    pub fn window(&self, k: usize) -> Vec<(u64, &[u8])> {
        let start = if k == 0 {
            0
        } else {
            self.flush_events[k - 1] + 1
        };
        let end = self
            .flush_events
            .get(k)
            .copied()
            .unwrap_or(self.events.len());
        let mut out = Vec::new();
        for e in &self.events[start..end] {
            let DeviceEvent::Write { offset, bytes } = e else {
                unreachable!("no flush inside a window")
            };
            match self.unit {
                None => out.push((*offset, bytes.as_slice())),
                Some(u) => out.extend(
                    bytes
                        .chunks(u)
                        .enumerate()
                        .map(|(i, c)| (offset + (i * u) as u64, c)),
                ),
            }
        }
        out
    }

    /// Newest generation whose superblock was written before flush k (and
    /// so is durable at any crash after flush k).
    pub fn durable_generation(&self, k: usize) -> u64 {
        self.sb_writes
            .iter()
            .filter(|w| w.window < k)
            .map(|w| w.generation)
            .max()
            .unwrap_or(self.initial_generation)
            .max(self.initial_generation)
    }

    /// Newest generation whose superblock write was issued before the
    /// crash point (flush k + any write of window k).
    pub fn issued_generation(&self, k: usize) -> u64 {
        self.sb_writes
            .iter()
            .filter(|w| w.window <= k)
            .map(|w| w.generation)
            .max()
            .unwrap_or(self.initial_generation)
            .max(self.initial_generation)
    }

    /// The generation the media holds after a crash keeping `kept` of
    /// window k: the newest superblock write it kept.
    pub fn expected_generation(&self, k: usize, kept: &[usize]) -> u64 {
        let kept_gen = self
            .sb_writes
            .iter()
            .filter(|w| w.window == k && kept.contains(&w.pos))
            .map(|w| w.generation)
            .max()
            .unwrap_or(0);
        self.durable_generation(k).max(kept_gen)
    }

    /// The crash image, built from scratch ([`explore`] builds them
    /// incrementally). For whole writes it is the recording device's own
    /// `crash_image`.
    pub fn crash_image(&self, k: usize, kept: &[usize]) -> Vec<u8> {
        if self.unit.is_none() {
            return self.recording.inner().crash_image(&CrashPoint {
                flushes_completed: k,
                kept_writes: kept.to_vec(),
            });
        }
        let mut image = self.initial.clone();
        for j in 0..k {
            for (offset, bytes) in self.window(j) {
                apply(&mut image, offset, bytes);
            }
        }
        let window = self.window(k);
        for &i in kept {
            apply(&mut image, window[i].0, window[i].1);
        }
        image
    }

    /// The media with every recorded write except the events listed (a
    /// state no power cut can produce: canaries use it to prove the
    /// oracles notice lost writes).
    pub fn image_without(&self, dropped_events: &[usize]) -> Vec<u8> {
        let mut image = self.initial.clone();
        for (i, e) in self.events.iter().enumerate() {
            if let DeviceEvent::Write { offset, bytes } = e {
                if !dropped_events.contains(&i) {
                    apply(&mut image, *offset, bytes);
                }
            }
        }
        image
    }

    /// How many ops may have reached the media in a crash at flush k: those
    /// that began before the end of window k.
    pub fn reach(&self, k: usize) -> usize {
        let end = self.window_end_event(k);
        self.ops
            .iter()
            .rposition(|r| r.events_before < end)
            .map_or(0, |i| i + 1)
    }

    /// The event index of the newest write on the media after a crash at
    /// flush k keeping `kept` of window k (`None`: no write at all).
    pub fn last_write_on_media(&self, k: usize, kept: &[usize]) -> Option<usize> {
        let start = if k == 0 {
            0
        } else {
            self.flush_events[k - 1] + 1
        };
        let end = self.window_end_event(k);
        // The event of each unit of the window, in window order.
        let mut unit_event = Vec::new();
        for (i, e) in self.events[start..end].iter().enumerate() {
            if let DeviceEvent::Write { bytes, .. } = e {
                let units = self.unit.map_or(1, |u| bytes.len().div_ceil(u));
                unit_event.extend(std::iter::repeat_n(start + i, units));
            }
        }
        let in_window = kept
            .iter()
            .filter_map(|&u| unit_event.get(u).copied())
            .max();
        let before = self.events[..start.saturating_sub(1)]
            .iter()
            .rposition(|e| matches!(e, DeviceEvent::Write { .. }));
        in_window.or(before)
    }

    /// The newest op before op `p` during which a commit was made.
    fn commit_before(&self, p: usize) -> Option<usize> {
        (0..p).rev().find(|&i| {
            let before = if i == 0 {
                self.initial_generation
            } else {
                self.ops[i - 1].generation_after
            };
            self.ops[i].generation_after != before
        })
    }

    /// What an fsync of a directory (op f) persists below its entries, as
    /// btrfs does: the entries of every subdirectory new since the last
    /// commit, recursively (a new subtree is logged whole). Returns the op
    /// whose state that is, and the paths (two or more levels below the
    /// directory, through new directories only).
    ///
    /// btrfs logs a directory only if it changed since it was last logged
    /// in the transaction; otherwise the fsync returns at once and the
    /// subtree stays as an earlier fsync logged it: one of the directory,
    /// or of a directory above it whose new subtree held it. So the state
    /// is that of the earliest such fsync in this transaction after which
    /// the directory (its path and its entries) stayed the same up to op
    /// f.
    pub fn new_subtree(&self, f: usize) -> (usize, Vec<Path>) {
        let Some((_, Covered::Inode { ino, dir: true, .. })) = &self.ops[f].persist else {
            return (f, Vec::new());
        };
        let ino = *ino;
        let commit = self.commit_before(f);
        // The directory's path and entries after op i.
        let dir_state = |i: usize| -> Option<(Path, Vec<(Path, MIno)>)> {
            let inos = &self.ops[i].inos_after;
            let (path, _) = inos.iter().find(|(_, m)| **m == ino)?;
            let entries = inos
                .iter()
                .filter(|(q, _)| q.len() == path.len() + 1 && q.starts_with(path))
                .map(|(q, m)| (q.clone(), *m))
                .collect();
            Some((path.clone(), entries))
        };
        let committed: BTreeSet<MIno> = match commit {
            Some(c) => self.ops[c].inos_after.values().copied().collect(),
            None => BTreeSet::from([crate::model::ROOT]),
        };
        // Whether op i's fsync logged the directory: an fsync of it, or
        // of a directory above it whose new subtree it was in (btrfs's
        // `log_new_dir_dentries` logs it then, and a later fsync of it
        // returns at once while it stays the same).
        let logged_by = |i: usize| -> bool {
            let Some((
                _,
                Covered::Inode {
                    ino: m, dir: true, ..
                },
            )) = &self.ops[i].persist
            else {
                return false;
            };
            if *m == ino {
                return true;
            }
            let inos = &self.ops[i].inos_after;
            let (Some((top, _)), Some((path, _))) = (
                inos.iter().find(|(_, x)| *x == m),
                inos.iter().find(|(_, x)| **x == ino),
            ) else {
                return false;
            };
            path.len() > top.len()
                && path.starts_with(top)
                && (top.len() + 1..=path.len())
                    .all(|n| inos.get(&path[..n]).is_some_and(|x| !committed.contains(x)))
        };
        let mut at = f;
        let first = commit.map_or(0, |c| c + 1);
        while let Some(prev) = (first..at).rev().find(|&i| logged_by(i)) {
            let now = dir_state(at);
            if (prev..at).all(|i| dir_state(i) == now) {
                at = prev;
            } else {
                break;
            }
        }
        let inos = &self.ops[at].inos_after;
        let Some((dir, _)) = dir_state(at) else {
            return (at, Vec::new());
        };
        let below = inos
            .keys()
            .filter(|q| q.len() > dir.len() + 1 && q.starts_with(&dir))
            .filter(|q| {
                (dir.len() + 1..q.len())
                    .all(|n| inos.get(&q[..n]).is_some_and(|i| !committed.contains(i)))
            })
            .cloned()
            .collect();
        (at, below)
    }

    /// The op during which flush `k` (1-based count) happened, if any.
    pub fn op_of_flush(&self, flushes: usize) -> Option<usize> {
        self.ops
            .iter()
            .position(|r| r.flushes_before < flushes && flushes <= r.flushes_after)
    }

    /// Event index at which window k ends (the (k+1)-th flush, or the end).
    fn window_end_event(&self, k: usize) -> usize {
        self.flush_events
            .get(k)
            .copied()
            .unwrap_or(self.events.len())
    }

    /// The workload as a listing, with the flushes each op issued.
    pub fn listing(&self) -> String {
        let mut s = String::new();
        let last = self.ops.len() - 1;
        for (i, r) in self.ops.iter().enumerate() {
            let name = if i == last {
                "close (unmount)".to_string()
            } else {
                r.op.to_string()
            };
            let err = if r.ok { "" } else { " (failed)" };
            if r.flushes_after > r.flushes_before {
                s.push_str(&format!(
                    "  #{i}: {name}{err}   [flushes {}..={}, generation {}]\n",
                    r.flushes_before + 1,
                    r.flushes_after,
                    r.generation_after
                ));
            } else {
                s.push_str(&format!("  #{i}: {name}{err}\n"));
            }
        }
        s
    }

    /// What the writes of window k are.
    pub fn describe_window(&self, k: usize) -> String {
        let mut s = String::new();
        for (i, (offset, bytes)) in self.window(k).into_iter().enumerate() {
            let what = if let Some(w) = self.sb_writes.iter().find(|w| w.window == k && w.pos == i)
            {
                format!(
                    "superblock copy at {} (generation {})",
                    w.copy, w.generation
                )
            } else if bytes.len() % NODE_SIZE == 0
                && bytes.len() >= 8
                && bytes[4..8] == NODE_MAGIC.to_le_bytes()
            {
                format!("{} node(s) at {offset}", bytes.len() / NODE_SIZE)
            } else {
                format!("{} data bytes at {offset}", bytes.len())
            };
            s.push_str(&format!("    w{i}: {what}\n"));
        }
        s
    }
}

/// A crash state that failed an oracle.
#[derive(Clone, Debug)]
pub struct CrashFailure {
    pub seed: u64,
    pub flush: usize,
    pub kept: Vec<usize>,
    pub window_len: usize,
    pub message: String,
    pub context: String,
}

impl fmt::Display for CrashFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed={} crash after flush {} keeping writes {:?} of the {} in its window: {}",
            self.seed, self.flush, self.kept, self.window_len, self.message
        )?;
        f.write_str(&self.context)?;
        writeln!(
            f,
            "replay: BIRCH_SEED={} cargo test -p birch-sim --test crash -- --nocapture",
            self.seed
        )?;
        writeln!(
            f,
            "    or: cargo run -p birch-sim --bin birch-crash -- --seed {}",
            self.seed
        )
    }
}

/// What judging one crash state found (when it passed).
#[derive(Clone, Debug)]
pub struct StateReport {
    pub generation: u64,
    pub view: View,
    pub has_log: bool,
    /// Facts the persistence-guarantee oracle checked.
    pub guarantees: usize,
    /// Durable inodes the no-loss oracle followed.
    pub durable_inodes: usize,
    /// Compressed file extent items in the crash image (`birch check`'s
    /// count, logs included).
    pub compressed_extents: u64,
    /// Of the inline ones, compressed (`birch check`'s count).
    pub compressed_inline: u64,
    pub tolerated: Vec<String>,
}

/// Judges one crash image (the media after a crash at flush k keeping
/// `kept` of window k) with every oracle.
pub fn check_state(
    trace: &Trace,
    k: usize,
    kept: &[usize],
    image: Vec<u8>,
) -> Result<StateReport, String> {
    check_state_on(
        trace,
        k,
        kept,
        Arc::new(OverlayDevice::new(Arc::new(image))),
    )
}

/// [`check_state`] on a device that already holds the crash image.
pub fn check_state_on(
    trace: &Trace,
    k: usize,
    kept: &[usize],
    dev: Arc<OverlayDevice>,
) -> Result<StateReport, String> {
    // 1. The raw image passes the checker.
    let (mut tolerated, summary) = check_image_summary(&*dev)
        .map_err(|r| format!("birch check on the crash image is not clean:\n{r}"))?;
    // 2. Its generation is the newest kept superblock, within the bounds.
    let sb = birch::fs::read_superblock(&*dev).map_err(|e| format!("no superblock: {e}"))?;
    let g = sb.generation;
    let (durable, issued, expected) = (
        trace.durable_generation(k),
        trace.issued_generation(k),
        trace.expected_generation(k, kept),
    );
    if g < durable {
        return Err(format!("generation {g} is older than generation {durable}, durable since flush {k}: a flushed commit was lost"));
    }
    if g > issued {
        return Err(format!(
            "generation {g} is newer than any superblock issued before the crash (newest {issued})"
        ));
    }
    if g != expected {
        return Err(format!(
            "generation {g}, but the newest superblock the media kept is generation {expected}"
        ));
    }
    let has_log = sb.log_root_bytenr != 0;
    // 1. It mounts.
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic())
        .map_err(|e| format!("mount failed: {e}"))?;
    let (view, inos) = engine_view_with_inos(&fs)
        .map_err(|e| format!("recovered filesystem is inconsistent: {e}"))?;
    // 3. Exactly the state of commit g.
    if !has_log {
        let snapshot = trace
            .snapshots
            .get(&g)
            .ok_or_else(|| format!("no model snapshot for generation {g}"))?;
        if let Some(d) = diff_views(snapshot, &view) {
            return Err(format!(
                "recovered state differs from the model at generation {g}: {d}"
            ));
        }
    }
    // 4. Every completed persistence point's promise holds.
    let guarantees = check_guarantees(trace, k, &view)?;
    // 5. Nothing durable is lost.
    let durable_inodes = check_durable(trace, k, kept, &view, &inos)?;
    // 6. What an fsync promises about a file's changed names.
    let guarantees = guarantees + check_name_changes(trace, k, &view, &inos)?;
    if !has_log {
        check_nothing_invented(trace, k, &view)?;
    }
    check_deletions_stay(trace, k, &view)?;
    check_no_time_after_the_crash(trace, &fs, &inos)?;
    finish_deletions(&fs, &view)?;
    fs.close().map_err(|e| format!("close after mount: {e}"))?;
    tolerated.extend(
        check_image(&*dev)
            .map_err(|r| format!("birch check after mount + close is not clean:\n{r}"))?,
    );
    Ok(StateReport {
        generation: g,
        view,
        has_log,
        guarantees,
        durable_inodes,
        compressed_extents: summary.compressed_extent_items,
        compressed_inline: summary.compressed_inline_items,
        tolerated,
    })
}

/// Oracle 7: mounting a crash state changes no inode's times, every mtime
/// and ctime is one the workload made, so none is later than its end. Replay
/// re-adds and removes names; doing so must not stamp a directory with the
/// mount's time (fstests generic/547 caught that).
fn check_no_time_after_the_crash<D: BlockDevice + 'static>(
    trace: &Trace,
    fs: &Filesystem<D>,
    inos: &BTreeMap<Path, u64>,
) -> Result<(), String> {
    for (path, &ino) in inos {
        let attr = fs
            .getattr(ino)
            .map_err(|e| format!("{}: getattr({ino}): {e}", show_path(path)))?;
        for (what, time) in [("mtime", attr.mtime), ("ctime", attr.ctime)] {
            if time > trace.ended_at {
                return Err(format!(
                    "{}: {what} {time:?} is later than the workload's end {:?}: the mount stamped it",
                    show_path(path),
                    trace.ended_at
                ));
            }
        }
    }
    Ok(())
}

/// An interrupted subvolume drop resumes: the mount queued every deleted
/// subvolume whose drop had not finished; the cleaner runs to completion
/// (each transaction bounded, so a few rounds per dead tree), nothing is
/// left, and the namespace is what it was (the caller then checks the
/// image after close).
fn finish_deletions(fs: &Filesystem<Arc<OverlayDevice>>, view: &View) -> Result<(), String> {
    if fs.deleted_subvolumes().is_empty() {
        return Ok(());
    }
    const MAX_ROUNDS: usize = 10_000;
    let mut rounds = 0;
    while fs
        .run_cleaner()
        .map_err(|e| format!("the cleaner failed after the mount: {e}"))?
    {
        rounds += 1;
        if rounds == MAX_ROUNDS {
            return Err(format!(
                "the cleaner still has deleted subvolumes {:?} after {MAX_ROUNDS} transactions",
                fs.deleted_subvolumes()
            ));
        }
    }
    if !fs.deleted_subvolumes().is_empty() {
        return Err(format!(
            "the cleaner says it is done, but subvolumes {:?} are still deleted and not dropped",
            fs.deleted_subvolumes()
        ));
    }
    let after =
        crate::extract::engine_view(fs).map_err(|e| format!("after the cleaner finished: {e}"))?;
    match diff_views(view, &after) {
        None => Ok(()),
        Some(d) => Err(format!("the cleaner changed the namespace: {d}")),
    }
}

/// A deleted subvolume stays gone: for every subvolume delete (or rmdir
/// of a subvolume link) followed by a completed commit-making op (sync,
/// subvolume create, snapshot) before the crash, its path is absent,
/// unless a later op that may have reached the media had a name there
/// again. Holds with or without a log to replay: no log carries a
/// subvolume link (docs/SNAPSHOTS.md (e)). Returns the facts checked.
pub fn check_deletions_stay(trace: &Trace, k: usize, recovered: &View) -> Result<usize, String> {
    let reach = trace.reach(k);
    let mut facts = 0;
    for (d, rec) in trace.ops.iter().enumerate().take(reach) {
        let Some(path) = &rec.deleted_subvolume else {
            continue;
        };
        let committed = trace.ops[d + 1..reach.max(d + 1)]
            .iter()
            .any(|r| r.flushes_after <= k && matches!(r.persist, Some((Persist::Sync, _))));
        let named_again = trace.ops[d + 1..reach.max(d + 1)]
            .iter()
            .any(|r| r.view_after.entries.contains_key(path));
        if !committed || named_again {
            continue;
        }
        facts += 1;
        if recovered.entries.contains_key(path) {
            return Err(format!(
                "`{}` (op #{d}) was committed, but {} is back",
                rec.op,
                show_path(path)
            ));
        }
    }
    Ok(facts)
}

/// Oracle 4: the promises of every persistence op that completed before a
/// crash at flush k, judged against the recovered view.
///
/// An op p completed if all its flushes are among the first k. Its promise
/// is checked only on facts that no later op that could have reached the
/// media changed: a later op can have reached the media if it began before
/// the end of window k. For each such p:
/// - sync: every path whose entry is unchanged from p to the crash has that
///   entry; and every recovered path existed at p or after it;
/// - fsync(file): if its content and names are unchanged since, at least
///   one of its names holds that content (kind, size, pages);
/// - fsync(dir): the directory is at its path, and each entry is there,
///   for those unchanged since (same kind).
pub fn check_guarantees(trace: &Trace, k: usize, recovered: &View) -> Result<usize, String> {
    let mut facts = 0;
    let end = trace.window_end_event(k);
    // Ops that may have reached the media: began before the window's end.
    let reach = trace
        .ops
        .iter()
        .rposition(|r| r.events_before < end)
        .map_or(0, |i| i + 1);
    for (p, rec) in trace.ops.iter().enumerate() {
        let Some((persist, covered)) = &rec.persist else {
            continue;
        };
        if rec.flushes_after > k {
            continue;
        }
        let later = &trace.ops[p + 1..reach.max(p + 1)];
        let stable = |path: &Path, entry: &crate::model::Entry| {
            later
                .iter()
                .all(|r| r.view_after.entries.get(path) == Some(entry))
        };
        match (persist, covered) {
            (Persist::Sync, _) => {
                for (path, entry) in &rec.view_after.entries {
                    if !stable(path, entry) {
                        continue;
                    }
                    facts += 1;
                    match recovered.entries.get(path) {
                        None => {
                            return Err(format!(
                                "{} existed unchanged since `{}` (op #{p}) but is gone",
                                show_path(path),
                                rec.op
                            ))
                        }
                        Some(found) => {
                            if let Some(d) = diff_entry(entry, found) {
                                return Err(format!(
                                    "{} unchanged since `{}` (op #{p}) differs: {d}",
                                    show_path(path),
                                    rec.op
                                ));
                            }
                        }
                    }
                }
            }
            (
                Persist::Fsync { .. } | Persist::FsyncDir,
                Covered::Inode {
                    paths, dir: false, ..
                },
            ) => {
                let Some(first) = paths.first() else { continue };
                let entry = &rec.view_after.entries[first];
                let same_data = |a: &crate::model::Entry, b: &crate::model::Entry| {
                    a.kind == b.kind
                        && a.size == b.size
                        && a.content == b.content
                        && a.target == b.target
                };
                let all_stable = paths.iter().all(|path| {
                    later.iter().all(|r| {
                        r.view_after
                            .entries
                            .get(path)
                            .is_some_and(|e| same_data(e, entry))
                    })
                });
                if !all_stable {
                    continue;
                }
                facts += 1;
                if !paths.iter().any(|path| {
                    recovered
                        .entries
                        .get(path)
                        .is_some_and(|e| same_data(e, entry))
                }) {
                    let names: Vec<String> = paths.iter().map(|p| show_path(p)).collect();
                    return Err(format!(
                        "`{}` (op #{p}) completed, but none of {names:?} holds its data and size",
                        rec.op
                    ));
                }
            }
            (
                Persist::Fsync { .. } | Persist::FsyncDir,
                Covered::Inode {
                    paths, dir: true, ..
                },
            ) => {
                let Some(dir) = paths.first() else { continue };
                // The directory itself, where it was, if it stayed there.
                let dir_stable = later.iter().all(|r| {
                    r.view_after
                        .entries
                        .get(dir)
                        .is_some_and(|e| e.kind == Kind::Dir)
                });
                facts += usize::from(dir_stable);
                if dir_stable
                    && recovered
                        .entries
                        .get(dir)
                        .is_none_or(|e| e.kind != Kind::Dir)
                {
                    return Err(format!(
                        "`{}` (op #{p}) completed, but the directory {} is not there",
                        rec.op,
                        show_path(dir)
                    ));
                }
                // Its entries, from its own state; and, as btrfs logs
                // them, the entries below its new subdirectories, from the
                // state `new_subtree` names.
                let (at, below) = rec.subtree.clone().unwrap_or_default();
                let direct = rec
                    .view_after
                    .entries
                    .iter()
                    .filter(|(path, _)| path.len() == dir.len() + 1 && path.starts_with(dir))
                    .map(|(path, entry)| (p, path, entry));
                let deeper = below
                    .iter()
                    .map(|path| (at, path, &trace.ops[at].view_after.entries[path]));
                for (from, path, entry) in direct.chain(deeper) {
                    let kind_stable = trace.ops[from + 1..reach.max(from + 1)].iter().all(|r| {
                        r.view_after
                            .entries
                            .get(path)
                            .is_some_and(|e| e.kind == entry.kind)
                    });
                    facts += usize::from(kind_stable);
                    if kind_stable
                        && recovered
                            .entries
                            .get(path)
                            .is_none_or(|e| e.kind != entry.kind)
                    {
                        return Err(format!(
                            "`{}` (op #{p}) completed, but its entry {} ({:?}) is missing",
                            rec.op,
                            show_path(path),
                            entry.kind
                        ));
                    }
                }
            }
            (_, Covered::All) => {}
        }
    }
    Ok(facts)
}

/// Oracle 5, nothing durable is lost: every inode that was durable before a
/// crash at flush k (keeping `kept` of window k) is still reachable by some
/// path, with content it had since it was made durable, unless the
/// workload removed it in a way that may have reached the media.
///
/// Inodes are followed by identity (the engine's inode number, mapped to
/// the model's), never by name, so a name taken over by another inode
/// (renamed away and reused) does not hide a loss. An inode I is
/// *durable* when
/// - it had a name at the last sync that completed (all its flushes
///   among the first k): its names, data and xattrs are durable from
///   there;
/// - or a later fsync / fdatasync of it completed while it had a name:
///   durable from that op, its data too (and its xattrs, for fsync);
/// - or a later fsync of a directory completed while I was an entry of
///   it (or, for a subtree new since the last commit, below it): I is
///   durable from that op, its content not (btrfs logs such an entry's
///   inode as existing, not its data).
///
/// Then, for each durable I:
/// - **reachable**: some recovered path names I; or else I lost its
///   last name at some op j after it became durable, and some write the
///   engine issued after op j began is on the media (only such a write
///   can carry the removal; without one, the removal cannot have reached
///   the media and the loss is a bug);
/// - **content**: where its data is durable from op d, the recovered
///   size and pages are those I had after some op in d..reach (reach:
///   the ops that began before the end of window k); likewise its
///   xattrs where they are durable. Any state in that range is allowed,
///   because a later commit or log may have made any of them durable.
///
/// The path where I is found is not judged (a log replay may put an
/// fsync'd inode under a parent's committed name); the rename oracle and
/// the persistence guarantees judge names. Returns the inodes checked.
pub fn check_durable(
    trace: &Trace,
    k: usize,
    kept: &[usize],
    recovered: &View,
    recovered_inos: &BTreeMap<Path, u64>,
) -> Result<usize, String> {
    #[derive(Default)]
    struct Durable {
        /// The op from which it is durable.
        since: usize,
        /// The op from which its data (and xattrs) are durable.
        data: Option<usize>,
        xattrs: Option<usize>,
        /// The op that made it durable (for the report).
        by: usize,
    }
    let reach = trace.reach(k);
    let completed = |r: &OpRecord| r.ok && r.flushes_after <= k;
    let sync = trace
        .ops
        .iter()
        .rposition(|r| completed(r) && matches!(r.persist, Some((Persist::Sync, _))));
    let mut durable: BTreeMap<MIno, Durable> = BTreeMap::new();
    let mut make = |ino: MIno, at: usize, data: bool, xattrs: bool| {
        let d = durable.entry(ino).or_insert(Durable {
            since: at,
            by: at,
            ..Default::default()
        });
        if data {
            d.data = Some(at);
        }
        if xattrs {
            d.xattrs = Some(at);
        }
    };
    if let Some(b) = sync {
        for ino in trace.ops[b].inos_after.values() {
            make(*ino, b, true, true);
        }
    }
    let first = sync.map_or(0, |b| b + 1);
    for (f, rec) in trace.ops.iter().enumerate().skip(first) {
        if !completed(rec) {
            continue;
        }
        match &rec.persist {
            // An fsync of an inode with no name (open, unlinked) makes
            // nothing durable that a path could reach.
            Some((Persist::Fsync { datasync }, Covered::Inode { ino, paths, dir }))
                if !paths.is_empty() =>
            {
                make(*ino, f, !dir, !dir && !datasync);
            }
            Some((
                Persist::FsyncDir,
                Covered::Inode {
                    ino,
                    paths,
                    dir: true,
                },
            )) => {
                let Some(dir) = paths.first() else { continue };
                make(*ino, f, false, false);
                for (path, child) in &rec.inos_after {
                    if path.len() == dir.len() + 1 && path.starts_with(dir) {
                        make(*child, f, false, false);
                    }
                }
                let (at, below) = rec.subtree.clone().unwrap_or_default();
                for path in &below {
                    make(trace.ops[at].inos_after[path], at, false, false);
                }
            }
            _ => {}
        }
    }
    // Where each model inode is after the crash.
    let mut found: HashMap<MIno, &Path> = HashMap::new();
    for (path, e) in recovered_inos {
        if let Some(m) = trace.engine_inos.get(e) {
            found.entry(*m).or_insert(path);
        }
    }
    let last_on_media = trace.last_write_on_media(k, kept);
    let names_of = |ino: MIno, at: usize| -> Vec<String> {
        trace.ops[at]
            .inos_after
            .iter()
            .filter(|(_, i)| **i == ino)
            .map(|(p, _)| show_path(p))
            .collect()
    };
    let followed: BTreeSet<MIno> = trace.engine_inos.values().copied().collect();
    let mut checked = 0;
    for (&ino, d) in &durable {
        if ino == crate::model::ROOT || !followed.contains(&ino) {
            continue;
        }
        checked += 1;
        let Some(path) = found.get(&ino) else {
            let removed = trace.ops[d.since + 1..reach.max(d.since + 1)]
                .iter()
                .any(|r| {
                    !r.path_of.contains_key(&ino)
                        && last_on_media.is_some_and(|w| w >= r.events_before)
                });
            if removed {
                continue;
            }
            return Err(format!(
                "an inode durable since `{}` (op #{}), named {:?} then and {:?} at the crash, is lost: no path reaches it, and no removal of it can have reached the media",
                trace.ops[d.by].op,
                d.by,
                names_of(ino, d.by),
                names_of(ino, reach.max(1) - 1)
            ));
        };
        let entry = &recovered.entries[*path];
        // The states I had from op `from` on (where it had a name).
        let states = |from: usize| {
            trace.ops[from..reach.max(from + 1)]
                .iter()
                .filter_map(move |r| r.view_after.entries.get(r.path_of.get(&ino)?))
        };
        if let Some(from) = d.data {
            if entry.kind == Kind::File
                && !states(from).any(|s| s.size == entry.size && s.content == entry.content)
            {
                return Err(format!(
                    "{} (an inode whose data is durable since `{}`, op #{from}) holds {} bytes that it never held since",
                    show_path(path),
                    trace.ops[from].op,
                    entry.size.unwrap_or(0)
                ));
            }
            if entry.kind == Kind::Symlink && !states(from).any(|s| s.target == entry.target) {
                return Err(format!(
                    "{}: symlink target differs from the durable one",
                    show_path(path)
                ));
            }
        }
        if let Some(from) = d.xattrs {
            if !states(from).any(|s| s.xattrs == entry.xattrs) {
                return Err(format!(
                    "{} (an inode whose xattrs are durable since `{}`, op #{from}) has xattrs {:?} that it never had since",
                    show_path(path),
                    trace.ops[from].op,
                    entry.xattrs.keys().map(|n| crate::model::show_name(n)).collect::<Vec<_>>()
                ));
            }
        }
    }
    Ok(checked)
}

/// The first op of the transaction op `f` ran in: no commit completed
/// during the ops from there to `f` (the op during which one completed
/// may have changed things on either side of it, so it is not counted).
fn transaction_start(trace: &Trace, f: usize) -> usize {
    let before = |i: usize| {
        i.checked_sub(1)
            .map_or(trace.initial_generation, |j| trace.ops[j].generation_after)
    };
    let generation = before(f);
    let mut s = f;
    while s > 0 && before(s - 1) == generation {
        s -= 1;
    }
    s
}

/// The model inode at each path at the start of the transaction beginning
/// at op `s`: present before and after the op that committed (so in the
/// commit, whichever side of the op it was taken on).
fn committed_names(trace: &Trace, s: usize) -> BTreeMap<Path, MIno> {
    let Some(after) = s.checked_sub(1) else {
        return BTreeMap::new();
    };
    let mut names = trace.ops[after].inos_after.clone();
    if let Some(before) = after.checked_sub(1) {
        let earlier = &trace.ops[before].inos_after;
        names.retain(|path, ino| earlier.get(path) == Some(ino));
    }
    names
}

/// Oracle 6, the fsync cases fstests caught (issue 21, docs/TREE-LOG.md):
/// what a completed fsync of a file promises beyond its own data and
/// names, judged on facts no op that can have reached the media changed.
/// For an fsync at op F of file X in a transaction that began at op s:
/// - X gained a name by a link in s..F (generic/104, 343): each entry of
///   each directory X has a name in at F is there;
/// - X lost a name the commit before s had (generic/336): each entry of
///   that directory at F is there, and each entry it had at that commit
///   that is gone at F is gone;
/// - X had no name at F (generic/764): no path reaches X;
/// - X was linked at op j after F, in F's transaction, and the new name
///   reaches X (generic/066): X's xattrs are as at some op from j on.
///
/// Returns the facts checked.
pub fn check_name_changes(
    trace: &Trace,
    k: usize,
    recovered: &View,
    recovered_inos: &BTreeMap<Path, u64>,
) -> Result<usize, String> {
    let reach = trace.reach(k);
    let mut facts = 0;
    let found = |ino: MIno| {
        recovered_inos
            .iter()
            .find(|(_, e)| trace.engine_inos.get(e) == Some(&ino))
            .map(|(path, _)| path)
    };
    // An entry at `path` as op `from` had it: still there (same kind) if
    // no later op that can have reached the media changed its kind.
    let present = |from: usize, path: &Path, facts: &mut usize| -> Result<(), String> {
        let Some(entry) = trace.ops[from].view_after.entries.get(path) else {
            return Ok(());
        };
        let stable = trace.ops[from + 1..reach.max(from + 1)].iter().all(|r| {
            r.view_after
                .entries
                .get(path)
                .is_some_and(|e| e.kind == entry.kind)
        });
        *facts += usize::from(stable);
        if stable
            && recovered
                .entries
                .get(path)
                .is_none_or(|e| e.kind != entry.kind)
        {
            return Err(format!(
                "`{}` (op #{from}) completed, but {} ({:?}) is missing",
                trace.ops[from].op,
                show_path(path),
                entry.kind
            ));
        }
        Ok(())
    };
    let entries_of = |at: usize, dir: &Path| -> Vec<Path> {
        trace.ops[at]
            .view_after
            .entries
            .keys()
            .filter(|path| path.len() == dir.len() + 1 && path.starts_with(dir))
            .cloned()
            .collect()
    };
    for (f, rec) in trace.ops.iter().enumerate().take(reach) {
        let Some((
            Persist::Fsync { .. },
            Covered::Inode {
                ino,
                paths,
                dir: false,
            },
        )) = &rec.persist
        else {
            continue;
        };
        if rec.flushes_after > k {
            continue;
        }
        let x = *ino;
        let s = transaction_start(trace, f);
        let linked_to_x = |j: usize| {
            let r = &trace.ops[j];
            match &r.op {
                Op::Link { to, .. } if r.ok => r.inos_after.get(to) == Some(&x),
                _ => false,
            }
        };
        // A file with no name left: its deletion.
        if paths.is_empty() {
            let named_again = trace.ops[f + 1..reach.max(f + 1)]
                .iter()
                .any(|r| r.path_of.contains_key(&x));
            if !named_again {
                facts += 1;
                if let Some(path) = found(x) {
                    return Err(format!(
                        "`{}` (op #{f}) of a file with no name completed, but {} reaches it",
                        rec.op,
                        show_path(path)
                    ));
                }
            }
            continue;
        }
        // The directories of its new links.
        if (s..f).any(linked_to_x) {
            for path in paths {
                let dir = path[..path.len() - 1].to_vec();
                for entry in entries_of(f, &dir) {
                    present(f, &entry, &mut facts)?;
                }
            }
        }
        // The directories of the committed names it lost.
        let committed = committed_names(trace, s);
        for (old, _) in committed
            .iter()
            .filter(|(path, i)| **i == x && rec.inos_after.get(*path) != Some(&x))
        {
            let old_dir = old[..old.len() - 1].to_vec();
            let Some(dir_ino) = (if old_dir.is_empty() {
                Some(crate::model::ROOT)
            } else {
                committed.get(&old_dir).copied()
            }) else {
                continue;
            };
            let dir = if dir_ino == crate::model::ROOT {
                Vec::new()
            } else {
                match rec.path_of.get(&dir_ino) {
                    Some(d) => d.clone(),
                    None => continue,
                }
            };
            for entry in entries_of(f, &dir) {
                present(f, &entry, &mut facts)?;
            }
            // Its committed entries gone at F, and gone since.
            for gone in entries_of(s - 1, &old_dir) {
                let name = gone.last().expect("an entry has a name");
                let mut now = dir.clone();
                now.push(name.clone());
                let stays_gone = trace.ops[f..reach.max(f + 1)]
                    .iter()
                    .all(|r| !r.view_after.entries.contains_key(&now));
                if !stays_gone {
                    continue;
                }
                facts += 1;
                if recovered.entries.contains_key(&now) {
                    return Err(format!(
                        "`{}` (op #{f}) completed, but {}, gone since the last commit, is back",
                        rec.op,
                        show_path(&now)
                    ));
                }
            }
        }
        // Its xattrs with a later new name in the same transaction.
        let same_transaction = |j: usize| transaction_start(trace, j) <= f;
        for j in (f + 1..reach).filter(|&j| linked_to_x(j) && same_transaction(j)) {
            let Op::Link { to, .. } = &trace.ops[j].op else {
                continue;
            };
            let reaches_x = recovered_inos
                .get(to)
                .and_then(|e| trace.engine_inos.get(e))
                == Some(&x);
            if !reaches_x {
                continue;
            }
            facts += 1;
            let xattrs = &recovered.entries[to].xattrs;
            let had = trace.ops[j..reach].iter().any(|r| {
                r.path_of
                    .get(&x)
                    .and_then(|p| r.view_after.entries.get(p))
                    .is_some_and(|e| &e.xattrs == xattrs)
            });
            if !had {
                return Err(format!(
                    "{} (linked by `{}`, op #{j}, after `{}`, op #{f}) has xattrs {:?} that the file never had since the link",
                    show_path(to),
                    trace.ops[j].op,
                    rec.op,
                    xattrs.keys().map(|n| crate::model::show_name(n)).collect::<Vec<_>>()
                ));
            }
        }
    }
    Ok(facts)
}

/// Nothing appears that no state since the last completed sync had: every
/// recovered path existed in the model at or after the last sync that
/// completed before a crash at flush k (and before the end of window k).
///
/// This holds when every durable state is a commit (it is implied by the
/// exact-state oracle, and checks it independently). It is not required of
/// states recovered from a log tree: replaying an fsync'd new directory
/// whose parent was renamed in the same transaction (and not logged) puts
/// it under the parent's committed name, a path that never existed — the
/// brief asks that fsync'd things and renames survive, not that recovery be
/// a prefix of history.
pub fn check_nothing_invented(trace: &Trace, k: usize, recovered: &View) -> Result<(), String> {
    let end = trace.window_end_event(k);
    let reach = trace
        .ops
        .iter()
        .rposition(|r| r.events_before < end)
        .map_or(0, |i| i + 1);
    let last_sync = trace
        .ops
        .iter()
        .enumerate()
        .filter(|(_, r)| r.flushes_after <= k && matches!(r.persist, Some((Persist::Sync, _))))
        .map(|(p, _)| p)
        .next_back();
    let candidates = match last_sync {
        Some(p) => &trace.ops[p..reach.max(p + 1)],
        None => &trace.ops[..reach],
    };
    for path in recovered.entries.keys() {
        if !path.is_empty()
            && !candidates
                .iter()
                .any(|r| r.view_after.entries.contains_key(path))
        {
            return Err(format!(
                "{} exists, but no state since the last completed sync had it",
                show_path(path)
            ));
        }
    }
    Ok(())
}

/// Subsets of a window of `n` writes to try.
pub fn choose_subsets(n: usize, cfg: &CrashConfig, rng: &mut ChaCha8Rng) -> Vec<Vec<usize>> {
    if n <= cfg.exhaustive_max_writes {
        return (0..1u64 << n)
            .map(|mask| (0..n).filter(|i| mask & (1 << i) != 0).collect())
            .collect();
    }
    let mut set: BTreeSet<Vec<usize>> = BTreeSet::new();
    set.insert(Vec::new());
    set.insert((0..n).collect());
    // Prefixes (a crash part-way through issuing the window in order) and
    // single-write drops: all of them, or evenly thinned to the cap.
    let structured: Vec<Vec<usize>> = (1..n)
        .map(|len| (0..len).collect())
        .chain((0..n).map(|drop| (0..n).filter(|&i| i != drop).collect()))
        .collect();
    let stride = cfg
        .max_structured
        .map_or(1, |cap| structured.len().div_ceil(cap.max(1)).max(1));
    for s in structured.into_iter().step_by(stride) {
        set.insert(s);
    }
    // And `sample_subsets` random ones.
    let target = set.len() + cfg.sample_subsets;
    let mut tries = 0;
    while set.len() < target && tries < cfg.sample_subsets * 20 {
        tries += 1;
        let p: f64 = [0.5, 0.2, 0.8][tries % 3];
        set.insert((0..n).filter(|_| rng.gen_bool(p)).collect());
    }
    set.into_iter().collect()
}

/// What an exploration checked.
#[derive(Clone, Debug, Default)]
pub struct CrashStats {
    pub workloads: u64,
    pub ops: u64,
    pub flush_points: u64,
    pub crash_states: u64,
    /// Crash states per recovered generation relation: (older than the
    /// newest issued, equal to it).
    pub states_at_older_generation: u64,
    pub largest_window: usize,
    /// Facts checked by the persistence-guarantee oracle, over all states.
    pub guarantee_facts: u64,
    /// Durable inodes followed by the no-loss oracle, over all states.
    pub durable_inodes: u64,
    /// Crash states whose image holds compressed file extent items.
    pub states_with_compressed_extents: u64,
    /// Crash states whose image holds compressed inline extents.
    pub states_with_compressed_inline: u64,
    pub tolerated: Vec<String>,
    pub elapsed: Duration,
}

impl CrashStats {
    pub fn add(&mut self, o: &CrashStats) {
        self.workloads += o.workloads;
        self.ops += o.ops;
        self.flush_points += o.flush_points;
        self.crash_states += o.crash_states;
        self.states_at_older_generation += o.states_at_older_generation;
        self.largest_window = self.largest_window.max(o.largest_window);
        self.guarantee_facts += o.guarantee_facts;
        self.durable_inodes += o.durable_inodes;
        self.states_with_compressed_extents += o.states_with_compressed_extents;
        self.states_with_compressed_inline += o.states_with_compressed_inline;
        self.tolerated.extend(o.tolerated.iter().cloned());
        self.elapsed += o.elapsed;
    }
}

fn apply(image: &mut [u8], offset: u64, bytes: &[u8]) {
    image[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
}

thread_local! {
    /// The crash state being judged, for the panic hook.
    static CURRENT_STATE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    /// The workload listing of the trace being explored.
    static CURRENT_TRACE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Notes the state being judged; a panic while it is set prints it first
/// (a panic inside the engine can turn into an abort through a panicking
/// `Drop`, and then the seed would be lost).
fn set_current_state(state: Option<String>) {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(s) = CURRENT_STATE.with(|c| c.borrow_mut().take()) {
                let listing = CURRENT_TRACE
                    .with(|c| c.borrow().clone())
                    .unwrap_or_default();
                eprintln!("panic while judging {s}\nworkload:\n{listing}");
            }
            previous(info);
        }));
    });
    CURRENT_STATE.with(|c| *c.borrow_mut() = state);
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

/// A test's extra assertion on a crash state that passed the oracles:
/// `(flush point, kept writes, report)`.
pub type StateHook<'a> = dyn FnMut(usize, &[usize], &StateReport) -> Result<(), String> + 'a;

/// Checks every chosen crash state of a trace.
pub fn explore(trace: &Trace, cfg: &CrashConfig) -> Result<CrashStats, CrashFailure> {
    explore_each(trace, cfg, &mut |_, _, _| Ok(()))
}

/// [`explore`], calling `also` on every state that passed the oracles (for
/// tests that assert more about particular states).
pub fn explore_each(
    trace: &Trace,
    cfg: &CrashConfig,
    also: &mut StateHook<'_>,
) -> Result<CrashStats, CrashFailure> {
    let start = Instant::now();
    let mut stats = CrashStats {
        workloads: 1,
        ops: trace.ops.len() as u64,
        tolerated: trace.tolerated.clone(),
        ..Default::default()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(trace.seed ^ 0x6372_6173_6821);
    CURRENT_TRACE.with(|c| *c.borrow_mut() = Some(trace.listing()));
    // The media before flush k, shared by every state of window k.
    let mut shared = Arc::new(trace.initial.clone());
    for k in 0..=trace.flush_count() {
        let window = trace.window(k);
        let subsets = if k < cfg.first_flush {
            Vec::new()
        } else {
            stats.flush_points += 1;
            stats.largest_window = stats.largest_window.max(window.len());
            choose_subsets(window.len(), cfg, &mut rng)
        };
        for kept in subsets {
            let dev = Arc::new(OverlayDevice::new(shared.clone()));
            for &i in &kept {
                dev.write_at(window[i].1, window[i].0)
                    .expect("a recorded write fits the device");
            }
            let fail = |message: String| {
                let op = trace
                    .op_of_flush(k + 1)
                    .map(|i| {
                        format!(
                            "the window ends at flush {} (during op #{i} `{}`)",
                            k + 1,
                            trace.ops[i].op
                        )
                    })
                    .unwrap_or_else(|| "the window is the last".into());
                CrashFailure {
                    seed: trace.seed,
                    flush: k,
                    kept: kept.clone(),
                    window_len: window.len(),
                    message,
                    context: format!(
                        "workload (durable generation at flush {k}: {}, newest issued: {}); {op}:\n{}window {k}:\n{}",
                        trace.durable_generation(k),
                        trace.issued_generation(k),
                        trace.listing(),
                        trace.describe_window(k)
                    ),
                }
            };
            set_current_state(Some(format!(
                "seed={} crash after flush {k} keeping writes {kept:?} of the {} in its window",
                trace.seed,
                window.len()
            )));
            let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check_state_on(trace, k, &kept, dev)
            }));
            set_current_state(None);
            let report = match checked {
                Ok(r) => r.map_err(&fail)?,
                Err(panic) => {
                    return Err(fail(format!(
                        "the engine panicked: {}",
                        panic_message(&panic)
                    )))
                }
            };
            also(k, &kept, &report).map_err(&fail)?;
            stats.crash_states += 1;
            stats.guarantee_facts += report.guarantees as u64;
            stats.durable_inodes += report.durable_inodes as u64;
            if report.compressed_extents > 0 {
                stats.states_with_compressed_extents += 1;
            }
            if report.compressed_inline > 0 {
                stats.states_with_compressed_inline += 1;
            }
            if report.generation < trace.issued_generation(k) {
                stats.states_at_older_generation += 1;
            }
            stats.tolerated.extend(report.tolerated);
        }
        // Every state of window k is gone, so this does not copy.
        let base = Arc::make_mut(&mut shared);
        for (offset, bytes) in window {
            apply(base, offset, bytes);
        }
    }
    // The incremental images agree with the recording device's own.
    if trace.recording.inner().snapshot() != *shared {
        return Err(CrashFailure {
            seed: trace.seed,
            flush: trace.flush_count(),
            kept: Vec::new(),
            window_len: 0,
            message: "replaying every event does not give the device's final content".into(),
            context: String::new(),
        });
    }
    stats.elapsed = start.elapsed();
    Ok(stats)
}

/// Records and explores one seeded workload.
pub fn run_seed(cfg: &CrashConfig) -> Result<CrashStats, String> {
    let start = Instant::now();
    let trace = record(cfg, OpSource::Generated)?;
    let mut stats = explore(&trace, cfg).map_err(|f| f.to_string())?;
    stats.elapsed = start.elapsed();
    Ok(stats)
}
