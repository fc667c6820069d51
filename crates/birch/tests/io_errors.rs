//! Bad media (docs/IO-ERRORS.md): EIO injected at every write and every
//! flush of a commit and of a log sync, EIO and flipped bytes on node
//! reads. One test per crash case of the design doc, same names.
//!
//! Each write and flush fault runs the scenario afresh on a
//! [`FaultyDevice`] over a [`RecordingDevice`]: the failed call never
//! reaches the recording, so the writes it holds after the last flush are
//! exactly those a power cut may keep or lose. A failure names the
//! scenario and the injected fault (`write #3`, `flush #1`): replay it by
//! running that scenario with `FaultPlan::fail_write(3)` or `fail_flush(1)`.

mod common;

use birch::device::{
    CrashPoint, DeviceEvent, FaultHandle, FaultPlan, FaultedOp, FaultyDevice, InjectedFault,
    IoCounts, MemoryDevice, RecordingDevice,
};
use birch::fs::{Filesystem, MetadataCopies, MountOptions, ReplayOutcome};
use birch::{Error, Result};
use common::{crash_view, ino, view, View};
use std::sync::Arc;

const IMAGE_BYTES: u64 = 16 << 20;

type Device = FaultyDevice<Arc<RecordingDevice>>;
type Fs = Filesystem<Device>;

/// An operation to break, on a filesystem that `prepare` brings to a
/// durable state (its last sync) plus changes the operation acts on.
struct Scenario {
    name: &'static str,
    /// Returns the inode the operation works on.
    prepare: fn(&Fs) -> u64,
    operation: fn(&Fs, u64) -> Result<()>,
    /// What the reason for turning read-only names besides the fault,
    /// whichever write or flush failed.
    step: &'static str,
}

/// The images these tests break are `single`: every read fault must then
/// surface. Under DUP metadata (the default) a failed read of one copy is
/// repaired from the other instead, which tests/dup_metadata.rs covers.
fn single_recorder(bytes: u64, fsid_byte: u8) -> Arc<RecordingDevice> {
    common::recorder_with(bytes, fsid_byte, MetadataCopies::Single)
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Committed: `/keep` (20 KB), `/d/old` (5 KB), `/small` (inline).
fn durable_base(fs: &Fs) {
    let root = fs.root_ino();
    let keep = fs.create(root, b"keep", 0o644, 0, 0).unwrap().ino;
    fs.write_file(keep, 0, &data(20_000, 1)).unwrap();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let old = fs.create(d, b"old", 0o644, 0, 0).unwrap().ino;
    fs.write_file(old, 0, &data(5_000, 2)).unwrap();
    let small = fs.create(root, b"small", 0o644, 0, 0).unwrap().ino;
    fs.write_file(small, 0, b"inline").unwrap();
    fs.sync().unwrap();
}

/// A commit of new files, a rename, an unlink and a rewrite.
const COMMIT: Scenario = Scenario {
    name: "commit",
    prepare: |fs| {
        durable_base(fs);
        let root = fs.root_ino();
        for i in 0..8u8 {
            let f = fs
                .create(ino(fs, "d"), format!("new{i}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino;
            fs.write_file(f, 0, &data(3_000 + 1_000 * i as usize, i))
                .unwrap();
        }
        fs.rename(root, b"small", ino(fs, "d"), b"moved", Default::default())
            .unwrap();
        fs.unlink(ino(fs, "d"), b"old").unwrap();
        fs.write_file(ino(fs, "keep"), 4096, &data(8192, 9))
            .unwrap();
        root
    },
    operation: |fs, _| fs.sync(),
    step: "commit of generation",
};

/// A log sync of a new file with data (an fsync, no commit), with an
/// unrelated change left out of it.
const FILE_FSYNC: Scenario = Scenario {
    name: "fsync of a file",
    prepare: |fs| {
        durable_base(fs);
        let f = fs.create(ino(fs, "d"), b"f", 0o644, 0, 0).unwrap().ino;
        fs.write_file(f, 0, &data(30_000, 7)).unwrap();
        fs.create(fs.root_ino(), b"unsynced", 0o644, 0, 0).unwrap();
        f
    },
    operation: |fs, f| fs.fsync(f, false),
    // The first write is the file's data, written back before the log.
    step: "",
};

/// A log sync of a directory that gained a file.
const DIR_FSYNC: Scenario = Scenario {
    name: "fsync of a directory with a new file",
    prepare: |fs| {
        durable_base(fs);
        let d = ino(fs, "d");
        let f = fs.create(d, b"added", 0o644, 0, 0).unwrap().ino;
        fs.write_file(f, 0, &data(6_000, 3)).unwrap();
        d
    },
    operation: |fs, d| fs.fsync(d, false),
    step: "log sync",
};

/// One run of a scenario with `plan` armed just before the operation.
struct Run {
    rec: Arc<RecordingDevice>,
    fs: Fs,
    faults: FaultHandle,
    /// Flushes on the recording when the durable state was reached.
    durable_flushes: usize,
    result: Result<()>,
}

fn run(scenario: &Scenario, metadata: MetadataCopies, plan: FaultPlan) -> Run {
    let rec = common::recorder_with(IMAGE_BYTES, 13, metadata);
    let dev = FaultyDevice::new(rec.clone());
    let faults = dev.faults();
    // A small node cache, so that the operation reads nodes too.
    let options = MountOptions {
        cache_nodes: 1,
        ..MountOptions::deterministic()
    };
    let fs = Filesystem::open(dev, options).unwrap();
    let target = (scenario.prepare)(&fs);
    // `prepare` ends its durable part with a sync and keeps its later
    // changes in memory: the last flush marks the durable state.
    let durable_flushes = rec.flush_count();
    faults.arm(plan);
    let result = (scenario.operation)(&fs, target);
    Run {
        rec,
        fs,
        faults,
        durable_flushes,
        result,
    }
}

/// The image with nothing after flush `flushes` (the writes pending there
/// all lost) or with them all (`keep_pending`).
fn image_point(rec: &RecordingDevice, flushes: usize, keep_pending: bool) -> CrashPoint {
    CrashPoint {
        flushes_completed: flushes,
        kept_writes: if keep_pending {
            (0..rec.writes_in_window(flushes)).collect()
        } else {
            vec![]
        },
    }
}

/// What the scenario promises: the durable state before the operation and
/// the one once it succeeded, from a fault-free run; and the writes and
/// flushes the operation issues.
struct Baseline {
    before: View,
    after: View,
    /// What the filesystem shows once the operation returned.
    live: View,
    reads: u64,
    writes: u64,
    flushes: u64,
}

fn baseline(scenario: &Scenario, metadata: MetadataCopies) -> Baseline {
    let Run {
        rec,
        fs,
        faults,
        durable_flushes,
        result,
    } = run(scenario, metadata, FaultPlan::none());
    result.unwrap_or_else(|e| panic!("{}: fault-free run failed: {e}", scenario.name));
    let counts = faults.counts();
    let live = common::view(&fs);
    let before = crash_view(&rec, &image_point(&rec, durable_flushes, false));
    let after = crash_view(&rec, &image_point(&rec, rec.flush_count(), false));
    assert_ne!(
        before, after,
        "{}: the operation made nothing durable",
        scenario.name
    );
    fs.close().unwrap();
    Baseline {
        before,
        after,
        live,
        reads: counts.reads,
        writes: counts.writes,
        flushes: counts.flushes,
    }
}

/// Breaks the operation with `plan` and asserts the contract: the
/// operation fails naming the fault, the filesystem is read-only from then
/// on and writes nothing more, and the device (as it is, and with the
/// writes since the last flush dropped) mounts clean showing the state
/// before the operation or the one after it.
fn assert_fault_contract(
    scenario: &Scenario,
    metadata: MetadataCopies,
    base: &Baseline,
    plan: FaultPlan,
) {
    let Run {
        rec,
        fs,
        faults,
        result,
        ..
    } = run(scenario, metadata, plan.clone());
    let fault = match faults.injected().as_slice() {
        [fault] => fault.clone(),
        other => panic!("{} with {plan:?}: injected {other:?}", scenario.name),
    };
    let at = format!("{} with {fault}", scenario.name);
    let err = match result {
        Ok(()) => panic!("{at}: the operation reported success"),
        Err(e) => e,
    };
    assert_eq!(err.errno(), libc::EIO, "{at}: {err}");
    assert!(
        err.to_string().contains(&fault.to_string()),
        "{at}: the error does not name the fault: {err}"
    );
    let why = fs
        .failure()
        .unwrap_or_else(|| panic!("{at}: the filesystem did not turn read-only"));
    // A read fails where the operation reads, before it writes.
    let step = if fault.op == FaultedOp::Read {
        ""
    } else {
        scenario.step
    };
    assert!(
        why.contains(&fault.to_string()) && why.contains(step),
        "{at}: failure says {why}"
    );
    let io_at_error = faults.counts();
    let shown = common::view(&fs);
    assert!(
        shown == base.live,
        "{at}: the failed filesystem shows other content than it was given: {:?}",
        differences(&shown, &base.live)
    );
    let root = fs.root_ino();
    match fs.create(root, b"after-fault", 0o644, 0, 0) {
        Err(e) if matches!(e.errno(), libc::EROFS | libc::EIO) => {}
        other => panic!("{at}: a change after the fault gave {other:?}"),
    }
    assert!(fs.sync().is_err(), "{at}: a sync after the fault succeeded");
    assert!(
        fs.fsync(root, false).is_err(),
        "{at}: an fsync after the fault succeeded"
    );
    assert!(fs.close().is_err(), "{at}: close after the fault succeeded");
    let io_at_close = faults.counts();
    assert_eq!(
        (io_at_close.writes, io_at_close.flushes),
        (io_at_error.writes, io_at_error.flushes),
        "{at}: the failed filesystem wrote on"
    );
    let flushes = rec.flush_count();
    for keep_pending in [true, false] {
        let image = if keep_pending {
            "the device as it is"
        } else {
            "the device without its unflushed writes"
        };
        let v = crash_view(&rec, &image_point(&rec, flushes, keep_pending));
        assert!(
            v == base.before || v == base.after,
            "{at}: {image} shows neither the state before the operation nor the one after; \
             paths that differ from before: {:?}, from after: {:?}",
            differences(&v, &base.before),
            differences(&v, &base.after)
        );
    }
}

/// The paths whose content differs between two views (or that only one
/// has): file contents are too long for a failure message.
fn differences(a: &View, b: &View) -> Vec<String> {
    let mut paths: Vec<&String> = a.keys().chain(b.keys()).collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter(|p| a.get(*p) != b.get(*p))
        .cloned()
        .collect()
}

/// Fails each write, then each flush, then (on a `single` image, where a
/// failed node read has no other copy) each read of the operation in turn;
/// returns how many faults were injected. Under DUP the writes include
/// every node's mirror.
fn fail_every_write_and_flush(scenario: &Scenario, metadata: MetadataCopies) -> u64 {
    let base = baseline(scenario, metadata);
    assert!(
        base.writes > 0 && base.flushes > 0,
        "{}: no I/O",
        scenario.name
    );
    for index in 0..base.writes {
        assert_fault_contract(scenario, metadata, &base, FaultPlan::fail_write(index));
    }
    for index in 0..base.flushes {
        assert_fault_contract(scenario, metadata, &base, FaultPlan::fail_flush(index));
    }
    let reads = match metadata {
        MetadataCopies::Single => base.reads,
        MetadataCopies::Dup => 0,
    };
    for index in 0..reads {
        assert_fault_contract(scenario, metadata, &base, FaultPlan::fail_read(index));
    }
    eprintln!(
        "{} ({metadata:?}): {} writes, {} flushes and {reads} node reads, each failed in turn",
        scenario.name, base.writes, base.flushes
    );
    base.writes + base.flushes + reads
}

#[test]
fn failed_commit_keeps_last_commit() {
    assert!(fail_every_write_and_flush(&COMMIT, MetadataCopies::Single) >= 4);
    assert!(fail_every_write_and_flush(&COMMIT, MetadataCopies::Dup) >= 4);
}

#[test]
fn failed_file_fsync_keeps_durable_state() {
    assert!(fail_every_write_and_flush(&FILE_FSYNC, MetadataCopies::Single) >= 4);
    assert!(fail_every_write_and_flush(&FILE_FSYNC, MetadataCopies::Dup) >= 4);
}

#[test]
fn failed_dir_fsync_keeps_durable_state() {
    assert!(fail_every_write_and_flush(&DIR_FSYNC, MetadataCopies::Single) >= 4);
    assert!(fail_every_write_and_flush(&DIR_FSYNC, MetadataCopies::Dup) >= 4);
}

// ----- reads -----

/// Files of the read tests: small enough to be inline, so that every read
/// past the superblocks is a node read.
const READ_FILES: usize = 300;

fn read_file_name(i: usize) -> Vec<u8> {
    format!("file{i:04}").into_bytes()
}

fn read_file_data(i: usize) -> Vec<u8> {
    format!("content of file {i}, kept inline").into_bytes()
}

/// An image holding [`READ_FILES`] inline files in one commit, and the
/// byte offsets of the nodes that commit wrote.
fn image_with_nodes() -> (Vec<u8>, Vec<u64>) {
    let rec = single_recorder(IMAGE_BYTES, 14);
    let fs = common::mount(rec.clone());
    let root = fs.root_ino();
    for i in 0..READ_FILES {
        let f = fs
            .create(root, &read_file_name(i), 0o644, 0, 0)
            .unwrap()
            .ino;
        fs.write_file(f, 0, &read_file_data(i)).unwrap();
    }
    fs.close().unwrap();
    let node = birch::format::NODE_SIZE as u64;
    let mut nodes: Vec<u64> = rec
        .events()
        .iter()
        .filter_map(|e| match e {
            DeviceEvent::Write { offset, bytes }
                if !birch::format::SUPERBLOCK_OFFSETS.contains(offset) =>
            {
                Some((*offset..*offset + bytes.len() as u64).step_by(node as usize))
            }
            _ => None,
        })
        .flatten()
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    (rec.snapshot(), nodes)
}

/// Reads every file; returns how many reads failed with EIO (with
/// `expect_corrupt`, each reported as corruption). Panics on a read that
/// returned wrong data or another error.
fn read_everything(
    fs: &Filesystem<Arc<FaultyDevice<MemoryDevice>>>,
    at: &str,
    expect_corrupt: bool,
) -> usize {
    let mut failed = 0;
    let mut judge = |what: String, outcome: std::result::Result<(), Error>| match outcome {
        Ok(()) => {}
        Err(e) if e.errno() == libc::EIO && matches!(e, Error::Corrupt(_)) == expect_corrupt => {
            failed += 1
        }
        Err(e) => panic!("{at}: {what}: unexpected error {e}"),
    };
    let root = fs.root_ino();
    judge(
        "readdir /".into(),
        fs.readdir(root, 0, usize::MAX).map(|entries| {
            assert_eq!(entries.len(), READ_FILES, "{at}: readdir / lost entries");
        }),
    );
    for i in 0..READ_FILES {
        let name = read_file_name(i);
        let outcome = fs.lookup(root, &name).and_then(|attr| {
            let got = fs.read_file(attr.ino, 0, 4096)?;
            assert_eq!(
                got,
                read_file_data(i),
                "{at}: file{i:04} read back wrong data"
            );
            Ok(())
        });
        judge(format!("file{i:04}"), outcome);
    }
    failed
}

/// Mounts `image` with `plan` armed from the start (the mount's own reads
/// included), reads every file, then disarms and reads them all again.
/// Returns how many reads failed while armed (the mount counts as one).
fn read_with(image: &[u8], plan: FaultPlan, at: &str, expect_corrupt: bool) -> usize {
    let dev = Arc::new(FaultyDevice::new(MemoryDevice::from_bytes(image.to_vec())));
    let faults = dev.faults();
    faults.arm(plan);
    let options = MountOptions {
        read_only: true,
        ..MountOptions::deterministic()
    };
    let fs = match Filesystem::open(dev.clone(), options) {
        Ok(fs) => fs,
        Err(e) => {
            assert_eq!(e.errno(), libc::EIO, "{at}: mount failed with {e}");
            assert_eq!(matches!(e, Error::Corrupt(_)), expect_corrupt, "{at}: {e}");
            return 1;
        }
    };
    let failed = read_everything(&fs, at, expect_corrupt);
    if failed > 0 {
        assert!(
            !faults.injected().is_empty(),
            "{at}: reads failed with no fault"
        );
    }
    faults.disarm();
    assert_eq!(
        read_everything(&fs, &format!("{at}, disarmed"), false),
        0,
        "{at}: a failed read left lasting damage"
    );
    failed
}

#[test]
fn node_read_eio_is_an_error_never_wrong_data() {
    let (image, nodes) = image_with_nodes();
    let mut failed_reads = 0;
    for &node in &nodes {
        let at = format!("read EIO on the node at {node}");
        let range = node..node + birch::format::NODE_SIZE as u64;
        failed_reads += read_with(&image, FaultPlan::fail_reads_in(range), &at, false);
    }
    eprintln!(
        "{} nodes failed in turn: {failed_reads} reads reported EIO",
        nodes.len()
    );
    assert!(nodes.len() >= 4 && failed_reads >= nodes.len());
}

#[test]
fn corrupted_node_read_is_reported_never_served() {
    let (image, nodes) = image_with_nodes();
    let mut failed_reads = 0;
    for &node in &nodes {
        let at = format!("one flipped byte in the node at {node}");
        // A byte of the item data, which fills nodes from the end.
        let byte = node + birch::format::NODE_SIZE as u64 - 1;
        failed_reads += read_with(
            &image,
            FaultPlan::corrupt_reads_in(byte..byte + 1),
            &at,
            true,
        );
    }
    eprintln!(
        "{} nodes corrupted in turn: {failed_reads} reads reported corruption",
        nodes.len()
    );
    assert!(nodes.len() >= 4 && failed_reads >= nodes.len());
}

// ----- mount with a log to replay -----

/// A device left by a power cut right after the file fsync: its
/// superblock points at a log. Mounting it replays the log and commits.
fn image_with_log() -> (Vec<u8>, View) {
    let Run {
        rec, fs, result, ..
    } = run(&FILE_FSYNC, MetadataCopies::Single, FaultPlan::none());
    result.unwrap();
    let point = image_point(&rec, rec.flush_count(), false);
    let promised = crash_view(&rec, &point);
    drop(fs);
    (rec.crash_image(&point), promised)
}

/// Mounts (read-write, so replay commits) the image with `plan` armed;
/// returns the recording of what the mount wrote, the mount's outcome, the
/// injected faults and the I/O the mount issued.
fn mount_log_image(
    image: &[u8],
    plan: FaultPlan,
) -> (
    Arc<RecordingDevice>,
    Result<Fs>,
    Vec<InjectedFault>,
    IoCounts,
) {
    let rec = Arc::new(RecordingDevice::new(image.to_vec()));
    let dev = FaultyDevice::new(rec.clone());
    let faults = dev.faults();
    faults.arm(plan);
    let fs = Filesystem::open(dev, MountOptions::deterministic());
    (rec, fs, faults.injected(), faults.counts())
}

#[test]
fn failed_io_during_replay_keeps_the_log() {
    let (image, promised) = image_with_log();
    let (_, fs, _, counts) = mount_log_image(&image, FaultPlan::none());
    let fs = fs.unwrap();
    assert!(matches!(
        fs.replay_outcome(),
        Some(ReplayOutcome::Replayed(_))
    ));
    drop(fs);
    let plans = (0..counts.reads)
        .map(FaultPlan::fail_read)
        .chain((0..counts.writes).map(FaultPlan::fail_write))
        .chain((0..counts.flushes).map(FaultPlan::fail_flush));
    let mut failed_mounts = 0;
    for plan in plans {
        let (rec, fs, injected, _) = mount_log_image(&image, plan.clone());
        let at = format!(
            "mount with {}",
            injected
                .first()
                .map_or("no fault".into(), |f| f.to_string())
        );
        match fs {
            // A fault the mount could do without (a read of one of the
            // two superblock copies, say) must leave a complete mount.
            Ok(fs) => {
                assert_eq!(
                    fs.replay_outcome()
                        .map(|o| matches!(o, ReplayOutcome::Replayed(_))),
                    Some(true),
                    "{at}: {:?}",
                    fs.replay_outcome()
                );
                let shown = view(&fs);
                assert!(
                    shown == promised,
                    "{at}: {:?}",
                    differences(&shown, &promised)
                );
                drop(fs);
            }
            Err(e) => {
                failed_mounts += 1;
                assert_eq!(e.errno(), libc::EIO, "{at}: {e}");
                let fault = injected
                    .first()
                    .unwrap_or_else(|| panic!("{at}: failed: {e}"));
                assert!(e.to_string().contains(&fault.to_string()), "{at}: {e}");
            }
        }
        let flushes = rec.flush_count();
        for keep_pending in [true, false] {
            let v = crash_view(&rec, &image_point(&rec, flushes, keep_pending));
            assert!(
                v == promised,
                "{at}: the device (pending writes kept: {keep_pending}) lost what the fsync \
                 promised: {:?}",
                differences(&v, &promised)
            );
        }
    }
    eprintln!(
        "replay: {} reads, {} writes, {} flushes failed in turn; {failed_mounts} mounts failed",
        counts.reads, counts.writes, counts.flushes
    );
    assert!(failed_mounts > 0);
}

// ----- a change outside a transaction's usual path -----

/// `/big` (open, unlinked: an orphan) with 300 extents over several
/// leaves, committed; nodes are cached two at a time so that freeing it
/// reads them from the device.
fn orphan_with_many_extents() -> (Arc<RecordingDevice>, Fs, FaultHandle, u64) {
    let rec = single_recorder(IMAGE_BYTES, 15);
    let dev = FaultyDevice::new(rec.clone());
    let faults = dev.faults();
    let options = MountOptions {
        cache_nodes: 2,
        ..MountOptions::deterministic()
    };
    let fs = Filesystem::open(dev, options).unwrap();
    let root = fs.root_ino();
    durable_base(&fs);
    let big = fs.create(root, b"big", 0o644, 0, 0).unwrap().ino;
    for page in 0..300u64 {
        // Every other page: each written page is its own extent.
        fs.write_file(big, page * 8192, &data(4096, page as u8))
            .unwrap();
    }
    fs.sync().unwrap();
    fs.open_inode(big).unwrap();
    fs.unlink(root, b"big").unwrap();
    fs.sync().unwrap();
    (rec, fs, faults, big)
}

#[test]
fn failed_read_while_freeing_an_orphan_turns_read_only() {
    let (rec, fs, faults, big) = orphan_with_many_extents();
    let durable = crash_view(&rec, &image_point(&rec, rec.flush_count(), false));
    faults.arm(FaultPlan::none());
    fs.release(big).unwrap();
    let reads = faults.counts().reads;
    assert!(reads > 0, "freeing the orphan read no node");
    fs.close().unwrap();
    for index in 0..reads {
        let (rec, fs, faults, big) = orphan_with_many_extents();
        faults.arm(FaultPlan::fail_read(index));
        let at = format!("freeing an orphan with read #{index} failing");
        let result = fs.release(big);
        if let Err(e) = &result {
            assert_eq!(e.errno(), libc::EIO, "{at}: {e}");
            let why = fs.failure().unwrap_or_else(|| {
                panic!("{at}: release failed ({e}) but the filesystem stays writable")
            });
            assert!(why.contains(&format!("read #{index}")), "{at}: {why}");
            assert!(fs.sync().is_err(), "{at}: sync after the failure succeeded");
        }
        drop(fs);
        // Failed or not, the orphan is gone at the next mount (its orphan
        // item finishes it) and the rest is as it was.
        let flushes = rec.flush_count();
        for keep_pending in [true, false] {
            let v = crash_view(&rec, &image_point(&rec, flushes, keep_pending));
            assert!(v == durable, "{at}: {:?}", differences(&v, &durable));
        }
    }
}
