//! Writeback without the state lock (docs/DELALLOC.md, "Writeback without
//! the state lock"): a batch is planned under the lock (pages taken out of
//! the dirty set and kept readable as in flight, extents allocated),
//! written with the lock released, and published under it again (file
//! extent items, checksums, the written range for the tree-log). fsync's,
//! `sync_file_range`'s, reclaim's, the flusher's, throttled writers' and
//! the commit's early batches go this way. The commit's seal and reflink's
//! settle publish at once and leave the write to the next commit or log
//! sync (`Unwritten`, in_flight.rs; docs/DELALLOC.md, "The seal's
//! writeback").

use super::file::WritebackBatch;
use super::state::FsState;
use super::transaction::{shut_down_error, Shared};
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::lock_order::RankedGuard;

impl<D: BlockDevice> Shared<D> {
    /// Writes a planned batch with the state lock released, then publishes
    /// it under the lock again, which it returns. A device error fails the
    /// filesystem (the pages not written stay dirty, for reads).
    pub(super) fn write_and_publish<'a>(
        &'a self,
        state: RankedGuard<'a, FsState<D>>,
        batch: WritebackBatch,
    ) -> (RankedGuard<'a, FsState<D>>, Result<u64>) {
        if batch.is_empty() {
            return (state, Ok(batch.pages));
        }
        drop(state);
        let written = batch.write(self.store.device());
        // What the publish looks up is read first, without the lock.
        let (mut state, warmed) = self.lock_warmed(&|s| s.warm_publish(&batch));
        // The batch's in-flight pages are settled either way; a node the
        // warm-up failed to read is the publish's error (and turns the
        // filesystem read-only below) even if the publish's own read of it
        // then succeeded.
        let published = state.publish_batch(batch, written);
        let published = warmed.and(published);
        state.fail_on_device_error(&published);
        self.space_changed(&mut state);
        // fsyncs waiting for this batch's inodes.
        self.writeback_done.notify_all();
        (state, published)
    }

    /// Page-bounded writeback of about `budget` pages, oldest dirty inode
    /// first (`FsState::plan_writeback_oldest`), written without the state
    /// lock. Returns the lock and the pages written.
    pub(super) fn writeback_oldest<'a>(
        &'a self,
        mut state: RankedGuard<'a, FsState<D>>,
        budget: u64,
    ) -> (RankedGuard<'a, FsState<D>>, Result<u64>) {
        let planned = state.plan_writeback_oldest(budget, false);
        state.fail_on_device_error(&planned);
        match planned {
            Ok(batch) => self.write_and_publish(state, batch),
            Err(e) => (state, Err(e)),
        }
    }

    /// Seed 004 switched off (`Ablation::reclaim_whole_inodes`,
    /// docs/ABLATION.md): every dirty page of the `inodes` oldest dirty
    /// inodes, as reclaim wrote before seed 004. Returns the lock and the
    /// pages written.
    pub(super) fn writeback_oldest_inodes<'a>(
        &'a self,
        mut state: RankedGuard<'a, FsState<D>>,
        inodes: u64,
    ) -> (RankedGuard<'a, FsState<D>>, Result<u64>) {
        let planned = state.plan_writeback_oldest(inodes, true);
        state.fail_on_device_error(&planned);
        match planned {
            Ok(batch) => self.write_and_publish(state, batch),
            Err(e) => (state, Err(e)),
        }
    }

    /// Writes back the dirty pages of inode `ino` (external number) with
    /// indexes in `range`, after waiting for its writeback in flight (a
    /// flusher batch): fsync's first step and `sync_file_range`. Returns
    /// the pages written.
    pub(super) fn writeback_inode(
        &self,
        ino: u64,
        range: (std::ops::Bound<u64>, std::ops::Bound<u64>),
    ) -> Result<u64> {
        let mut state = self.lock_state();
        loop {
            if state.info.shut_down {
                return Err(shut_down_error());
            }
            if state.info.failed.is_some() || state.info.options.read_only {
                return Err(Error::ReadOnly);
            }
            if !state.info.writebacks.contains(ino) {
                break;
            }
            state = self.recover_state(self.writeback_done.wait(state));
        }
        let planned = state.plan_writeback_inode(ino, range);
        state.fail_on_device_error(&planned);
        self.write_and_publish(state, planned?).1
    }
}
