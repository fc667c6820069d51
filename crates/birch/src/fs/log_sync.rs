//! Log sync: an fsync's logged changes reach the disk in a group commit
//! (docs/TREE-LOG.md "Log sync"). One log sync writes at a time; fsyncs
//! that logged into the same log transaction wait for it instead of
//! writing their own. The logging itself is in tree_log.rs.

use super::commit;
use super::in_flight::DataWrites;
use super::transaction::{io_step, Shared};
use super::tree_log::SealedLog;
use super::LogStats;
use crate::alloc::TransactionSpace;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::{LogManifest, Superblock, MAX_LOG_MANIFEST_NODES};
use std::time::{Duration, Instant};

impl<D: BlockDevice> Shared<D> {
    /// Waits until log transaction `id` is durable, writing it (and
    /// everything logged with it) if no one else is (group commit).
    pub(super) fn wait_log(&self, id: u64) -> Result<()> {
        let mut sync = self.lock_sync();
        loop {
            if let Some(why) = &sync.failed {
                return Err(Error::Io(std::io::Error::other(format!(
                    "log sync failed earlier: {why}"
                ))));
            }
            if sync.durable_log >= id {
                return Ok(());
            }
            let covered = sync.commit_covering.is_some_and(|c| id <= c);
            if !covered && !sync.log_writing && !sync.commit_sealing {
                sync.log_writing = true;
                drop(sync);
                let result = self.write_log();
                sync = self.lock_sync();
                sync.log_writing = false;
                match result {
                    Ok(written) => sync.durable_log = sync.durable_log.max(written),
                    Err(e) => {
                        self.lock_state()
                            .info
                            .failed
                            .get_or_insert_with(|| e.to_string());
                        sync.failed = Some(e.to_string());
                    }
                }
                self.sync_changed.notify_all();
                continue;
            }
            sync = self
                .sync_changed
                .wait(sync)
                .expect("sync progress lock poisoned");
        }
    }

    /// Seals the filling log transaction and writes it: nodes and (once its
    /// base commit is durable) the superblock, then one FLUSH, where the
    /// mount can validate the log (docs/LOG-FLUSH.md); else nodes, FLUSH,
    /// superblock, FLUSH. Returns the log transaction now durable.
    fn write_log(&self) -> Result<u64> {
        let (sealed, data_checksums, data) = match self.seal_log_to_write()? {
            Ok(sealed) => sealed,
            // Nothing logged since the last sync: it is all durable.
            Err(filling) => return Ok(filling),
        };
        let dev = self.store.device().as_ref();
        let fsid = *self.store.fsid();
        let profile = self.store.profile();
        let mut phases = LogSyncPhases::start();
        let step = format!(
            "log sync {} (on generation {})",
            sealed.id, sealed.base_generation
        );
        commit::write_data(dev, &data).map_err(|e| io_step(e, &step))?;
        let encoded = commit::EncodedNodes::new(&sealed.nodes, &fsid);
        phases.lap(|p| &mut p.write);
        // Logged data can be validated at mount only against its logged
        // checksums, and the manifest has room for so many nodes.
        let one_flush = data_checksums && encoded.checksums.len() <= MAX_LOG_MANIFEST_NODES;
        let base_durable = self.lock_sync().durable_generation >= sealed.base_generation;
        // Seed 002: the nodes do not wait for the commit the log is based
        // on; only the superblock does. When the base is durable already
        // (the usual case) the nodes go with the superblocks.
        let nodes_written = !(one_flush && base_durable);
        if nodes_written {
            dev.write_batch(&encoded.writes(profile))
                .map_err(|e| io_step(e.into(), &step))?;
            phases.lap(|p| &mut p.write);
        }
        if !one_flush {
            dev.flush().map_err(|e| io_step(e.into(), &step))?;
            phases.lap(|p| &mut p.nodes_flush);
        }
        self.wait_for_base(sealed.base_generation);
        let _superblock = self
            .superblock_lock
            .lock()
            .expect("superblock lock poisoned");
        let manifest = one_flush.then_some(&encoded.checksums[..]);
        let superblock = self.log_superblock(&sealed, manifest);
        phases.lap(|p| &mut p.base_wait);
        if one_flush {
            let copies = superblock.as_ref().map(commit::superblock_copies);
            let mut writes = if nodes_written {
                Vec::new()
            } else {
                encoded.writes(profile)
            };
            writes.extend(
                copies
                    .iter()
                    .flatten()
                    .map(|(offset, bytes)| (*offset, bytes.as_slice())),
            );
            // Empty when the nodes went ahead and a commit superseded the log.
            if !writes.is_empty() {
                dev.write_batch(&writes)
                    .map_err(|e| io_step(e.into(), &step))?;
                phases.lap(|p| &mut p.write);
            }
            dev.flush().map_err(|e| io_step(e.into(), &step))?;
            phases.lap(|p| &mut p.nodes_flush);
        } else if let Some(sb) = &superblock {
            commit::write_superblocks(dev, sb).map_err(|e| io_step(e, &step))?;
            phases.lap(|p| &mut p.superblock);
        }
        let mut state = self.lock_state();
        state.info.unwritten.written(&data);
        phases.add_to(&mut state.info.log_stats);
        state.info.forest.end_log_write();
        state.info.forest.alloc_mut().unpin(sealed.released);
        match superblock {
            Some(sb) => {
                state.info.superblock = sb;
                state.info.log_stats.log_syncs += 1;
            }
            None => state.info.log_stats.log_syncs_superseded += 1,
        }
        Ok(sealed.id)
    }
}

impl<D: BlockDevice> Shared<D> {
    /// Seals the filling log transaction for [`Self::write_log`]: the
    /// sealed log, whether the image has data checksums, and the
    /// unwritten extents it must write first; `Err(filling)` when nothing
    /// was logged since the last sync.
    #[allow(clippy::type_complexity)]
    fn seal_log_to_write(&self) -> Result<std::result::Result<(SealedLog, bool, DataWrites), u64>> {
        let mut state = self.lock_state();
        // A change that failed since this log was filled may have left
        // it half changed (logged names are kept current in it).
        if let Some(why) = &state.info.failed {
            return Err(Error::Io(std::io::Error::other(format!(
                "filesystem is read-only after an earlier failure: {why}"
            ))));
        }
        let filling = state.info.log.filling;
        Ok(match state.seal_log()? {
            // Extents the log may point at whose data is not written
            // yet (reflink's settle since the last commit; the older
            // ones the base commit writes, and the log's superblock
            // waits for it).
            Some(s) => {
                let data = state
                    .info
                    .unwritten
                    .writes(s.base_generation.saturating_add(1), u64::MAX);
                Ok((s, state.info.superblock.data_checksums, data))
            }
            None => Err(filling),
        })
    }

    /// The superblock that points at `sealed` (with `manifest`, the
    /// checksums of its nodes, when it is written with one flush), or
    /// `None` when a commit after its base made the log's content durable:
    /// a superblock pointing at this log would roll the disk back.
    fn log_superblock(
        &self,
        sealed: &SealedLog,
        manifest: Option<&[(u64, u32)]>,
    ) -> Option<Superblock> {
        let state = self.lock_state();
        (state.info.superblock.generation == sealed.base_generation).then(|| Superblock {
            log_root_bytenr: sealed.root.bytenr,
            log_root_level: sealed.root.level,
            log_generation: sealed.id,
            // The log the superblock names now is durable: a log sync
            // replaces it only once its flush returned (LOG-FLUSH.md, F2).
            log_manifest: manifest.map(|nodes| LogManifest {
                previous: state.info.superblock.log_root(),
                nodes: nodes.to_vec(),
            }),
            ..state.info.superblock.clone()
        })
    }

    /// Waits until commit `generation` is durable: an fsync whose inode
    /// was last changed in a commit sealed but still being written has
    /// nothing to log, but may return only once that commit is on disk.
    pub(super) fn wait_commit(&self, generation: u64) -> Result<()> {
        self.wait_for_base(generation);
        match &self.lock_sync().failed {
            Some(why) => Err(Error::Io(std::io::Error::other(format!(
                "commit failed earlier: {why}"
            )))),
            None => Ok(()),
        }
    }

    /// Waits until the commit a log is based on is durable (or the
    /// filesystem failed): seed 002, only a log's superblock waits for it.
    fn wait_for_base(&self, base_generation: u64) {
        let mut sync = self.lock_sync();
        while sync.durable_generation < base_generation && sync.failed.is_none() {
            sync = self
                .sync_changed
                .wait(sync)
                .expect("sync progress lock poisoned");
        }
    }
}

/// Where a log sync's time went, added to [`LogStats`] once it is done.
struct LogSyncPhases {
    lap_started: Instant,
    write: Duration,
    nodes_flush: Duration,
    base_wait: Duration,
    superblock: Duration,
}

impl LogSyncPhases {
    fn start() -> Self {
        LogSyncPhases {
            lap_started: Instant::now(),
            write: Duration::ZERO,
            nodes_flush: Duration::ZERO,
            base_wait: Duration::ZERO,
            superblock: Duration::ZERO,
        }
    }

    /// Charges the time since the previous lap to one phase.
    fn lap(&mut self, phase: impl FnOnce(&mut Self) -> &mut Duration) {
        let now = Instant::now();
        let since = now - self.lap_started;
        self.lap_started = now;
        *phase(self) += since;
    }

    fn add_to(&self, stats: &mut LogStats) {
        stats.log_write_nanos += self.write.as_nanos() as u64;
        stats.log_nodes_flush_nanos += self.nodes_flush.as_nanos() as u64;
        stats.log_base_wait_nanos += self.base_wait.as_nanos() as u64;
        stats.log_superblock_nanos += self.superblock.as_nanos() as u64;
    }
}

#[cfg(test)]
mod tests {
    use crate::device::{BlockDevice, FaultPlan, FaultyDevice, MemoryDevice};
    use crate::fs::tree_log::LogOutcome;
    use crate::fs::{mkfs, Filesystem, MkfsOptions, MountOptions, ReplayOutcome};
    use std::sync::Arc;

    /// fsync's first step: the file's data written back.
    fn write_back<D: BlockDevice>(fs: &Filesystem<D>, ino: u64) {
        let all = (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded);
        fs.shared.writeback_inode(ino, all).unwrap();
    }

    /// Logs `ino` (external) as an fsync does, without waiting for the
    /// log sync.
    fn log_only<D: BlockDevice>(fs: &Filesystem<D>, ino: u64) -> LogOutcome {
        write_back(fs, ino);
        let mut state = fs.lock();
        let (mut root, ino) = state.resolve(ino).unwrap();
        root.log_for_fsync(ino).unwrap()
    }

    /// Crash case: `subvolume create a b; sync; write a/f; write b/g;
    /// fsync a/f & fsync b/g; <cut>` → both files, from one log sync: the
    /// two fsyncs log into their roots' logs in the same log transaction,
    /// and the first sync seals and writes both (group commit across
    /// roots). Threads make the two fsyncs meet; this takes their steps in
    /// order.
    #[test]
    fn fsyncs_in_two_subvolumes_share_one_log_sync() {
        let dev = Arc::new(MemoryDevice::new(32 << 20));
        mkfs(dev.as_ref(), &MkfsOptions::default()).unwrap();
        let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
        let root = fs.root_ino();
        fs.create_subvolume(root, b"a", 0, 0).unwrap();
        fs.create_subvolume(root, b"b", 0, 0).unwrap();
        let a = fs.lookup(root, b"a").unwrap().ino;
        let b = fs.lookup(root, b"b").unwrap().ino;
        let f = fs.create(a, b"f", 0o644, 0, 0).unwrap().ino;
        let g = fs.create(b, b"g", 0o644, 0, 0).unwrap().ino;
        fs.write_file(f, 0, &[7; 9000]).unwrap();
        fs.write_file(g, 0, b"in b").unwrap();
        let before = fs.log_stats();
        let (LogOutcome::Logged(in_a), LogOutcome::Logged(in_b)) =
            (log_only(&fs, f), log_only(&fs, g))
        else {
            panic!("an fsync in a subvolume did not log");
        };
        assert_eq!(in_a, in_b, "both logged into one log transaction");
        fs.shared.wait_log(in_a).unwrap();
        fs.shared.wait_log(in_b).unwrap();
        let after = fs.log_stats();
        assert_eq!(after.log_syncs, before.log_syncs + 1);
        assert_eq!(after.fallback_subvolume, before.fallback_subvolume);
        // The power cut: the device as the log sync left it.
        let crashed = Arc::new(MemoryDevice::from_bytes(dev.snapshot()));
        drop(fs);
        // `birch check` of an image whose log holds several subvolumes'
        // logs: tests/subvolumes.rs `replay_logs_of_every_subvolume` (fs
        // may not import check).
        let fs = Filesystem::open(crashed, MountOptions::deterministic()).unwrap();
        let Some(ReplayOutcome::Replayed(replayed)) = fs.replay_outcome() else {
            panic!("no log replayed: {:?}", fs.replay_outcome());
        };
        assert!(replayed.inodes >= 2, "{replayed:?}");
        let root = fs.root_ino();
        let a = fs.lookup(root, b"a").unwrap().ino;
        let b = fs.lookup(root, b"b").unwrap().ino;
        let f = fs.lookup(a, b"f").unwrap().ino;
        let g = fs.lookup(b, b"g").unwrap().ino;
        assert_eq!(fs.read_file(f, 0, 1 << 20).unwrap(), vec![7; 9000]);
        assert_eq!(fs.read_file(g, 0, 100).unwrap(), b"in b");
    }

    /// Crash case: `subvolume create a (not committed yet); touch a/f;
    /// fsync a/f` commits: `a`'s root item is not in the log's base
    /// commit, so replay could not apply its log. Both rules hold it: the
    /// link's `force_commit`, and, alone, the root's `otransid`.
    #[test]
    fn fsync_in_new_subvolume_commits() {
        let dev = MemoryDevice::new(32 << 20);
        mkfs(&dev, &MkfsOptions::default()).unwrap();
        let fs = Filesystem::open(dev, MountOptions::deterministic()).unwrap();
        let root = fs.root_ino();
        let mut state = fs.lock();
        let id = state.create_subvolume(root, b"a", 0, 0).unwrap();
        let (mut new_root, dir) = state
            .resolve(crate::fs::InoSpace::join(id, crate::format::ROOT_DIR_INO))
            .unwrap();
        assert!(matches!(
            new_root.log_for_fsync(dir).unwrap(),
            LogOutcome::NeedCommit
        ));
        new_root.fs.log.force_commit = None;
        assert!(matches!(
            new_root.log_for_fsync(dir).unwrap(),
            LogOutcome::NeedCommit
        ));
        assert_eq!(state.info.log_stats.fallback_subvolume, 2);
        assert_eq!(state.info.log_stats.logged_fsyncs, 0);
    }

    /// A change running while an fsync waits for its log sync can fail
    /// part-way, leaving the log half changed (logged inodes' names are
    /// kept current in it): the log sync must then write nothing. Threads
    /// make that race; this takes its steps in order.
    #[test]
    fn log_sync_after_a_failed_change_writes_nothing() {
        let dev = MemoryDevice::new(16 << 20);
        mkfs(&dev, &MkfsOptions::default()).unwrap();
        let dev = FaultyDevice::new(dev);
        let faults = dev.faults();
        let fs = Filesystem::open(dev, MountOptions::deterministic()).unwrap();
        let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
        fs.write_file(f, 0, b"logged").unwrap();
        write_back(&fs, f);
        let logged = fs.lock().top().log_for_fsync(f).unwrap();
        let LogOutcome::Logged(id) = logged else {
            panic!("fsync of a new file did not log it");
        };
        fs.lock().info.failed = Some("a concurrent change failed part-way".into());
        faults.arm(FaultPlan::none());
        let err = fs.shared.wait_log(id).unwrap_err();
        assert!(err.to_string().contains("failed part-way"), "{err}");
        let io = faults.counts();
        assert_eq!((io.writes, io.flushes), (0, 0), "the log sync wrote");
    }
}
