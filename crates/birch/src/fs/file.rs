//! File data: dirty pages in memory, CoW data extents on disk.
//!
//! Writes land in per-inode dirty pages (SECTOR_SIZE each), reserved in
//! advance (fs/space.rs, docs/DELALLOC.md), and are written back as
//! contiguous extents — at commit, at fsync, or a bounded number of pages at
//! a time by reclaim, the flusher and throttled writers — always to newly
//! allocated space: an extent is never overwritten in place, so a crash
//! leaves either the old or the new data referenced.
//! Invariant: bytes of a file's last page beyond i_size are zero on disk
//! and in memory, so growing a file exposes zeros.
//! Every change of an inode's dirty page set goes through
//! `put_dirty_page` / `take_dirty_page`, which keep the space accounting
//! (dirty bytes, runs, the dirty queue) exact.

use super::csum::{plan_inline_compressed_read, read_planned, ExtentRead};
use super::decode::decode_item;
use super::in_flight::{Chunk, ChunkWrite, InFlight};
use super::page_prefetch::{partial_pages, ReadyPages};
use super::root::RootCtx;
use super::space_info::Need;
use super::state::FsState;
use super::types::{inode_flags, InoSpace};
use super::{FallocateMode, SeekWhence};
use crate::alloc::{ReaderTicket, TransactionSpace};
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::compression::DEFAULT_ZSTD_LEVEL;
use crate::format::{
    item_type, CompressedRef, Compression, CompressionProperty, DiskRef, FileExtent, FileType, Key,
    Timespec, MAX_COMPRESSED_RAM, MAX_EXTENT_BYTES, MAX_FILE_SIZE, MAX_INLINE_DATA, MAX_INLINE_RAM,
    SECTOR_SIZE,
};
use crate::lock_order::allow_io_under_state_lock;
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;

/// Contiguous pages of a file to write back: (file offset, bytes).
type Run = (u64, Vec<u8>);

const PAGE: u64 = SECTOR_SIZE;
impl<D: BlockDevice> RootCtx<'_, D> {
    pub(super) fn require_regular(&mut self, ino: u64) -> Result<()> {
        match self.inode(ino)?.item.file_type() {
            FileType::Regular => Ok(()),
            FileType::Directory => Err(Error::IsDir),
            _ => Err(Error::InvalidArgument("not a regular file")),
        }
    }

    pub(crate) fn is_regular_file(&mut self, ino: u64) -> Result<bool> {
        Ok(self.inode(ino)?.item.file_type() == FileType::Regular)
    }

    /// Whether the file has data not in its extents yet: dirty pages, or a
    /// writeback in flight.
    pub(crate) fn has_unpublished_data(&mut self, ino: u64) -> Result<bool> {
        let queued = self.queued(ino);
        Ok(!self.inode(ino)?.pages.is_empty() || self.fs.writebacks.contains(queued))
    }

    /// The file extent items of `ino` that overlap `[start, end)`.
    pub(super) fn extents_overlapping(
        &self,
        ino: u64,
        start: u64,
        end: u64,
    ) -> Result<Vec<(u64, FileExtent)>> {
        let mut out = Vec::new();
        if let Some((key, data)) = self.fs.forest.last_at_or_before(
            &self.root.tree,
            &Key::new(ino, item_type::EXTENT_DATA, start),
        )? {
            if key.objectid == ino && key.item_type == item_type::EXTENT_DATA {
                let e = decode_item(&key, FileExtent::decode_at(&key, &data))?;
                if key.offset + e.len() > start {
                    out.push((key.offset, e));
                }
            }
        }
        if end > start + 1 {
            let mut err = None;
            self.fs.forest.scan(
                &self.root.tree,
                Key::new(ino, item_type::EXTENT_DATA, start + 1),
                Key::new(ino, item_type::EXTENT_DATA, end - 1),
                &mut |k, d| {
                    match FileExtent::decode_at(k, d) {
                        Ok(e) => out.push((k.offset, e)),
                        Err(e) => {
                            err = Some(decode_item::<()>(k, Err(e)).unwrap_err());
                            return Ok(ControlFlow::Break(()));
                        }
                    }
                    Ok(ControlFlow::Continue(()))
                },
            )?;
            if let Some(e) = err {
                return Err(e);
            }
        }
        Ok(out)
    }

    /// Fills `buf` (page aligned, at page-aligned `start`) with the file's
    /// on-disk content; holes and preallocated ranges read as zeros.
    pub(super) fn plan_extents(
        &mut self,
        ino: u64,
        start: u64,
        buf: &mut [u8],
    ) -> Result<Vec<ExtentRead>> {
        debug_assert!(start.is_multiple_of(PAGE) && (buf.len() as u64).is_multiple_of(PAGE));
        let end = start + buf.len() as u64;
        let mut reads = Vec::new();
        for (file_offset, extent) in self.extents_overlapping(ino, start, end)? {
            let ov_start = file_offset.max(start);
            let ov_end = (file_offset + extent.len()).min(end);
            let at = (ov_start - start) as usize;
            let dst = &mut buf[at..(ov_end - start) as usize];
            match &extent {
                FileExtent::Inline { data } => dst.copy_from_slice(
                    &data[(ov_start - file_offset) as usize..(ov_end - file_offset) as usize],
                ),
                FileExtent::InlineCompressed {
                    compressed,
                    ram_bytes,
                    compression,
                } => reads.push(plan_inline_compressed_read(
                    compressed,
                    *ram_bytes,
                    *compression,
                    ov_start - file_offset,
                    (at, dst.len()),
                )),
                FileExtent::Regular {
                    disk_bytenr,
                    offset,
                    ..
                } => reads.push(self.fs.plan_data_read(
                    ov_start,
                    disk_bytenr + offset + (ov_start - file_offset),
                    at,
                    dst.len(),
                )?),
                FileExtent::Prealloc { .. } => dst.fill(0),
                FileExtent::Compressed { .. } => {
                    let disk = extent.disk_ref().expect("compressed extent has a disk ref");
                    reads.push(self.fs.plan_compressed_read(
                        ov_start,
                        disk,
                        extent.compressed_ref().expect("compressed extent"),
                        disk.offset + (ov_start - file_offset),
                        (at, dst.len()),
                    )?)
                }
            }
        }
        Ok(reads)
    }

    /// Reads `[start, start + buf.len())` (page aligned) of the file as its
    /// extents hold it, in the change's hold: inline data, holes,
    /// preallocated space and unwritten extents (bytes in memory). A page
    /// a change loads from the device was read ahead without the state
    /// lock and checked ([`RootCtx::ready_pages`], which reads it here
    /// only as its counted fallback): every change that keeps part of a
    /// page on disk (write, truncate, reflink, punch hole, zero range)
    /// plans it ahead (docs/SNAPSHOTS.md (f) item 5).
    fn read_extents_into(&mut self, ino: u64, start: u64, buf: &mut [u8]) -> Result<()> {
        let reads = self.plan_extents(ino, start, buf)?;
        debug_assert!(
            !reads.iter().any(ExtentRead::on_device),
            "page at {start} of inode {ino}: read from the device under the state lock by a \
             change that did not read it ahead"
        );
        self.read_planned_under_lock(ino, &reads, buf)
    }

    /// Reads planned extents of `ino` into `buf` under the state lock (the
    /// `"partial page read under a change"` exemption, counted).
    pub(super) fn read_planned_under_lock(
        &mut self,
        ino: u64,
        reads: &[ExtentRead],
        buf: &mut [u8],
    ) -> Result<()> {
        if reads.iter().any(ExtentRead::on_device) {
            self.fs.stats.partial_page_reads_locked += 1;
        }
        let _debt = allow_io_under_state_lock("partial page read under a change");
        let read = read_planned(self.fs.forest.store().device(), ino, reads, buf);
        if matches!(read, Err(Error::BadData(_))) {
            self.fs.stats.data_csum_errors += 1;
        }
        read
    }

    /// One page of the file as it is now (dirty copy, the copy a writeback
    /// in flight writes, or disk content).
    pub(super) fn load_page(&mut self, ino: u64, index: u64) -> Result<Box<[u8]>> {
        self.load_page_from(ino, index, &ReadyPages::default())
    }

    /// [`load_page`](Self::load_page), taking a page's disk content from
    /// `ready` (read without the state lock and checked,
    /// [`RootCtx::ready_pages`]) when it has it.
    pub(super) fn load_page_from(
        &mut self,
        ino: u64,
        index: u64,
        ready: &ReadyPages,
    ) -> Result<Box<[u8]>> {
        let inode = self.root.inodes.get(&ino);
        if let Some(dirty) = inode.and_then(|i| i.pages.get(&index)) {
            let mut page = self.fs.spare_pages.take_for_overwrite();
            page.copy_from_slice(dirty);
            return Ok(page);
        }
        let queued = self.queued(ino);
        if let Some(written) = self
            .fs
            .writebacks
            .get(queued)
            .and_then(|w| w.page(index, PAGE))
        {
            let mut page = self.fs.spare_pages.take_for_overwrite();
            page.copy_from_slice(written);
            return Ok(page);
        }
        // A copy, not the page: a reflink within one file may copy a page
        // as its source's edge and then write into it as its
        // destination's.
        if let Some(bytes) = ready.page(ino, index) {
            let mut page = self.fs.spare_pages.take_for_overwrite();
            page.copy_from_slice(bytes);
            return Ok(page);
        }
        let mut page = self.fs.spare_pages.take_zeroed();
        if index * PAGE < self.inode(ino)?.item.size {
            self.read_extents_into(ino, index * PAGE, &mut page)?;
        }
        Ok(page)
    }

    /// Makes `page` the dirty copy of page `index`. A page not dirty before
    /// takes one page of reservation and may start (or join) a run.
    pub(super) fn put_dirty_page(&mut self, ino: u64, index: u64, page: Box<[u8]>) -> Result<()> {
        let pages = &mut self.inode(ino)?.pages;
        if let Some(old) = pages.get_mut(&index) {
            let old = std::mem::replace(old, page);
            self.fs.spare_pages.give(old);
            return Ok(());
        }
        let left = index > 0 && pages.contains_key(&(index - 1));
        let right = pages.contains_key(&(index + 1));
        pages.insert(index, page);
        self.fs.dirty_page_bytes += PAGE;
        let queued = self.queued(ino);
        self.fs.space.page_added(queued, left, right);
        self.debug_check_runs(ino);
        Ok(())
    }

    /// Removes page `index` from the dirty set (written back or dropped).
    fn take_dirty_page(&mut self, ino: u64, index: u64) -> Result<Option<Box<[u8]>>> {
        let pages = &mut self.inode(ino)?.pages;
        let Some(page) = pages.remove(&index) else {
            return Ok(None);
        };
        let left = index > 0 && pages.contains_key(&(index - 1));
        let right = pages.contains_key(&(index + 1));
        let now_clean = pages.is_empty();
        self.fs.dirty_page_bytes -= PAGE;
        let queued = self.queued(ino);
        self.fs.space.page_removed(queued, left, right, now_clean);
        Ok(Some(page))
    }

    /// Removes the dirty pages with indexes in `range`.
    pub(super) fn take_dirty_pages(
        &mut self,
        ino: u64,
        range: impl std::ops::RangeBounds<u64>,
    ) -> Result<BTreeMap<u64, Box<[u8]>>> {
        let keys: Vec<u64> = self
            .inode(ino)?
            .pages
            .range(range)
            .map(|(&k, _)| k)
            .collect();
        let mut out = BTreeMap::new();
        for k in keys {
            if let Some(page) = self.take_dirty_page(ino, k)? {
                out.insert(k, page);
            }
        }
        self.debug_check_runs(ino);
        Ok(out)
    }

    /// Drops every dirty page of an inode that is going away (and its
    /// writeback in flight).
    pub(crate) fn discard_dirty_pages(&mut self, ino: u64) -> Result<()> {
        self.cancel_writeback(ino)?;
        if self
            .root
            .inodes
            .get(&ino)
            .is_some_and(|i| !i.pages.is_empty())
        {
            self.take_dirty_pages(ino, ..)?;
        }
        debug_assert!(!self.fs.space.has_dirty(self.queued(ino)));
        Ok(())
    }

    /// Debug builds: the run count kept for `ino` equals its page map's.
    fn debug_check_runs(&self, ino: u64) {
        #[cfg(debug_assertions)]
        if let Some(inode) = self.root.inodes.get(&ino) {
            if inode.pages.len() <= 1024 {
                let mut runs = 0;
                let mut prev: Option<u64> = None;
                for &k in inode.pages.keys() {
                    if prev.is_none_or(|p| p + 1 != k) {
                        runs += 1;
                    }
                    prev = Some(k);
                }
                assert_eq!(
                    self.fs.space.runs_of(self.queued(ino)),
                    runs,
                    "run count of inode {ino}"
                );
            }
        }
        #[cfg(not(debug_assertions))]
        let _ = ino;
    }

    /// Plans a read of the file (docs/SNAPSHOTS.md (f), "How device I/O
    /// leaves the state lock"): inline data, holes and copies of the dirty
    /// pages go into the plan, the extents to read with their checksums
    /// are listed, and the read is registered in the allocator's reader
    /// epoch; [`ReadPlan::execute`] then reads without the lock.
    pub(crate) fn plan_read(&mut self, ino: u64, offset: u64, size: usize) -> Result<ReadPlan> {
        self.require_regular(ino)?;
        let file_size = self.inode(ino)?.item.size;
        if offset >= file_size || size == 0 {
            return Ok(ReadPlan::empty(ino));
        }
        let end = file_size.min(offset.saturating_add(size as u64));
        let first_page = offset / PAGE;
        let aligned_start = first_page * PAGE;
        let aligned_end = end.div_ceil(PAGE) * PAGE;
        let mut buf = vec![0u8; (aligned_end - aligned_start) as usize];
        let reads = self.plan_extents(ino, aligned_start, &mut buf)?;
        // Pages under writeback are not in the extents yet; dirty pages
        // are newer still, so they go over them.
        let mut dirty: Vec<(usize, Box<[u8]>)> = Vec::new();
        if let Some(in_flight) = self.fs.writebacks.get(self.queued(ino)) {
            dirty.extend(
                (first_page..aligned_end / PAGE)
                    .filter_map(|index| Some((index, in_flight.page(index, PAGE)?)))
                    .map(|(index, page)| (((index - first_page) * PAGE) as usize, page.into())),
            );
        }
        dirty.extend(
            self.inode(ino)?
                .pages
                .range(first_page..aligned_end / PAGE)
                .map(|(&index, page)| (((index - first_page) * PAGE) as usize, page.clone())),
        );
        let reader = (!reads.is_empty()).then(|| self.fs.forest.alloc_mut().start_read());
        self.touch_atime(ino)?;
        Ok(ReadPlan {
            ino,
            buf,
            reads,
            dirty,
            keep: (offset - aligned_start) as usize..(end - aligned_start) as usize,
            _reader: reader,
        })
    }

    /// An access to `ino` (a read, a directory listing): updates its atime
    /// as the mount's [`AtimeUpdates`](super::AtimeUpdates) says, unless the
    /// inode has chattr `A`.
    pub(crate) fn touch_atime(&mut self, ino: u64) -> Result<()> {
        // A read-only subvolume's tree must not change, atimes included
        // (btrfs leaves them too).
        if self.fs.failed.is_some() || self.fs.options.read_only || self.root.is_readonly() {
            return Ok(());
        }
        let now = Timespec::now();
        let policy = self.fs.options.atime;
        let item = &self.inode(ino)?.item;
        // chattr +A: this inode's atime stays whatever the mount says.
        if item.flags as u32 & super::types::inode_flags::NOATIME != 0 {
            return Ok(());
        }
        let update = match policy {
            super::AtimeUpdates::Never => false,
            super::AtimeUpdates::Always => true,
            super::AtimeUpdates::Relative => {
                item.atime <= item.mtime
                    || item.atime <= item.ctime
                    || now.sec - item.atime.sec >= 24 * 3600
            }
        };
        if update {
            self.update_inode(ino, |i| i.atime = now)?;
        }
        Ok(())
    }

    /// The checks a write makes before any of it is accepted: a regular
    /// file, and the whole range within the largest file size.
    pub(crate) fn check_write(&mut self, ino: u64, offset: u64, len: u64) -> Result<()> {
        self.require_regular(ino)?;
        if len > 0 {
            offset
                .checked_add(len)
                .filter(|&e| e <= MAX_FILE_SIZE)
                .ok_or(Error::FileTooBig)?;
        }
        Ok(())
    }

    /// What a write of `len` bytes at `offset` may add to the reservations:
    /// its pages not dirty yet (plus page 0 when an inline file grows out
    /// of it), one new run and the inode update.
    pub(crate) fn write_need(&mut self, ino: u64, offset: u64, len: u64) -> Result<Need> {
        self.check_write(ino, offset, len)?;
        if len == 0 {
            return Ok(Need::NONE);
        }
        let first_page = offset / PAGE;
        let last_page = (offset + len - 1) / PAGE;
        let mut new_pages = {
            let inode = self.inode(ino)?;
            (first_page..=last_page)
                .filter(|p| !inode.pages.contains_key(p))
                .count() as u64
        };
        if first_page.max(1) <= last_page && self.inline_spill_needed(ino)? {
            new_pages += 1;
        }
        Ok(Need::items(3).plus_bytes(new_pages * PAGE))
    }

    /// Whether the file keeps its data in an inline extent that is not
    /// dirty: a write beyond page 0 must then take page 0 along (an inline
    /// extent is only ever a file's one extent).
    fn inline_spill_needed(&mut self, ino: u64) -> Result<bool> {
        let inode = self.inode(ino)?;
        let nbytes = inode.item.nbytes;
        if inode.pages.contains_key(&0) || nbytes == 0 || nbytes > MAX_INLINE_RAM {
            return Ok(false);
        }
        Ok(matches!(
            self.extents_overlapping(ino, 0, 1)?.first(),
            Some((0, e)) if e.is_inline()
        ))
    }

    /// Writes `data` at `offset` into dirty pages; a partial first or last
    /// page not in memory comes from `ready` when it has it (read ahead
    /// without the state lock), else from disk under the lock.
    pub(crate) fn write_file(
        &mut self,
        ino: u64,
        offset: u64,
        data: &[u8],
        ready: &ReadyPages,
    ) -> Result<usize> {
        self.check_write(ino, offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(0);
        }
        let end = offset + data.len() as u64;
        let first_page = offset / PAGE;
        let last_page = (end - 1) / PAGE;
        if first_page.max(1) <= last_page && self.inline_spill_needed(ino)? {
            let page = self.load_page(ino, 0)?;
            self.put_dirty_page(ino, 0, page)?;
        }
        for index in first_page..=last_page {
            let page_start = index * PAGE;
            let from = offset.max(page_start);
            let to = end.min(page_start + PAGE);
            let bytes = &data[(from - offset) as usize..(to - offset) as usize];
            let within = (from - page_start) as usize..(to - page_start) as usize;
            // A page dirty already takes the bytes where it is: its place
            // in the dirty set and the space accounting stay as they are.
            if let Some(dirty) = self.inode(ino)?.pages.get_mut(&index) {
                dirty[within].copy_from_slice(bytes);
                continue;
            }
            let mut page = if from == page_start && to == page_start + PAGE {
                // Fully overwritten: no need to read the old content.
                self.fs.spare_pages.take_for_overwrite()
            } else {
                self.load_page_from(ino, index, ready)?
            };
            page[within].copy_from_slice(bytes);
            self.put_dirty_page(ino, index, page)?;
        }
        let now = Timespec::now();
        self.update_inode(ino, |i| {
            i.size = i.size.max(end);
            i.mtime = now;
            i.ctime = now;
        })?;
        Ok(data.len())
    }

    /// The page a truncate to `new_size` keeps in part and zeroes the
    /// rest of: the new last page, when the file shrinks to inside it.
    pub(crate) fn truncate_partial_page(&mut self, ino: u64, new_size: u64) -> Result<Vec<u64>> {
        let item = &self.inode(ino)?.item;
        let shrinks_into_a_page = item.file_type() == FileType::Regular
            && new_size < item.size
            && !new_size.is_multiple_of(PAGE);
        Ok(if shrinks_into_a_page {
            vec![new_size / PAGE]
        } else {
            Vec::new()
        })
    }

    /// Sets the file's size; the new last page, when not in memory, comes
    /// from `ready` if it has it (read ahead without the state lock).
    pub(crate) fn truncate_file(
        &mut self,
        ino: u64,
        new_size: u64,
        ready: &ReadyPages,
    ) -> Result<()> {
        if new_size > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        let old_size = self.inode(ino)?.item.size;
        if new_size < old_size {
            self.cancel_writeback(ino)?;
            let keep_pages = new_size.div_ceil(PAGE);
            self.take_dirty_pages(ino, keep_pages..)?;
            if !new_size.is_multiple_of(PAGE) {
                // Zero the tail of the new last page so growing the file
                // later exposes zeros, not old data.
                let index = new_size / PAGE;
                let mut page = self.load_page_from(ino, index, ready)?;
                page[(new_size % PAGE) as usize..].fill(0);
                self.put_dirty_page(ino, index, page)?;
            }
            self.drop_extents(ino, keep_pages * PAGE, u64::MAX)?;
            // Dropped extents are not a written range: the next log must
            // carry the whole extent list.
            self.inode(ino)?.log.full_sync = true;
        }
        let now = Timespec::now();
        self.update_inode(ino, |i| {
            i.size = new_size;
            i.mtime = now;
            i.ctime = now;
        })
    }

    /// Removes the file's extents from `[start, end)`, keeping the parts of
    /// extents that stick out on either side.
    pub(crate) fn drop_extents(&mut self, ino: u64, start: u64, end: u64) -> Result<()> {
        let mut nbytes_delta: i64 = 0;
        for (file_offset, extent) in self.extents_overlapping(ino, start, end)? {
            let ext_end = file_offset + extent.len();
            self.fs.forest.delete(
                &mut self.root.tree,
                &Key::new(ino, item_type::EXTENT_DATA, file_offset),
            )?;
            nbytes_delta -= extent.nbytes() as i64;
            match &extent {
                FileExtent::Inline { data } => {
                    if file_offset < start {
                        let head = data[..(start - file_offset) as usize].to_vec();
                        nbytes_delta += head.len() as i64;
                        self.fs.forest.insert(
                            &mut self.root.tree,
                            Key::new(ino, item_type::EXTENT_DATA, file_offset),
                            FileExtent::Inline { data: head }.encode(),
                        )?;
                    }
                }
                // Drops start on a page (the file's or a log item's
                // offset): past any inline extent they do not drop whole.
                FileExtent::InlineCompressed { .. } => debug_assert!(
                    file_offset >= start,
                    "drop at {start} inside the compressed inline extent of inode {ino}"
                ),
                FileExtent::Regular { .. }
                | FileExtent::Prealloc { .. }
                | FileExtent::Compressed { .. } => {
                    let disk = extent.disk_ref().expect("non-inline extent has a disk ref");
                    if file_offset < start {
                        let head = extent.with_disk(DiskRef {
                            num_bytes: start - file_offset,
                            ..disk
                        });
                        nbytes_delta += head.nbytes() as i64;
                        self.insert_file_extent(ino, file_offset, head)?;
                    }
                    if ext_end > end {
                        let tail = extent.with_disk(DiskRef {
                            offset: disk.offset + (end - file_offset),
                            num_bytes: ext_end - end,
                            ..disk
                        });
                        nbytes_delta += tail.nbytes() as i64;
                        self.insert_file_extent(ino, end, tail)?;
                    }
                    // After the head and tail took their references, so
                    // that the count reaches zero only if nothing is left.
                    self.drop_file_extent_ref(ino, disk)?;
                }
            }
        }
        if nbytes_delta != 0 {
            self.update_inode(ino, |i| i.nbytes = (i.nbytes as i64 + nbytes_delta) as u64)?;
        }
        Ok(())
    }

    /// Inserts a file extent item and counts its reference on the disk extent.
    pub(crate) fn insert_file_extent(
        &mut self,
        ino: u64,
        file_offset: u64,
        extent: FileExtent,
    ) -> Result<()> {
        if let Some(d) = extent.disk_ref() {
            self.fs
                .forest
                .alloc_mut()
                .add_data_ref(d.disk_bytenr, d.disk_num_bytes, ino, 1);
        }
        self.fs.forest.insert(
            &mut self.root.tree,
            Key::new(ino, item_type::EXTENT_DATA, file_offset),
            extent.encode(),
        )
    }

    /// Counts a file extent item deleted for good (nothing replaces it)
    /// off its disk extent. When that frees an extent written in this
    /// transaction (a file written and deleted or truncated before the
    /// commit: dbench, build trees), its space is pinned and its checksums
    /// deleted now, so the commit, which requests wait for, has nothing
    /// left to do for it.
    pub(crate) fn drop_file_extent_ref(&mut self, ino: u64, disk: DiskRef) -> Result<()> {
        let released =
            self.fs
                .forest
                .alloc_mut()
                .drop_data_ref(disk.disk_bytenr, disk.disk_num_bytes, ino);
        if let (true, Some(csum)) = (released, self.fs.roots.csum.as_mut()) {
            super::csum::delete_extents_csums(
                &mut self.fs.forest,
                csum,
                &[(disk.disk_bytenr, disk.disk_num_bytes)],
            )?;
        }
        Ok(())
    }

    /// The name of this root's inode `ino` in the dirty-inode queue
    /// (`SpaceInfo`), which spans every root: its external number.
    pub(super) fn queued(&self, ino: u64) -> u64 {
        InoSpace::join(self.root.tree.id, ino)
    }

    /// Brings one inode's dirty pages into its extents without device I/O
    /// (reflink, collapse and insert range, which move or share the
    /// extents in the same hold): its writeback in flight is cancelled
    /// first, then the pages get extents whose data the next commit or log
    /// sync writes ([`Self::write_back_unwritten`]).
    pub(crate) fn settle_dirty_pages(&mut self, ino: u64) -> Result<()> {
        self.cancel_writeback(ino)?;
        let pages = self.take_dirty_pages(ino, ..)?;
        self.write_back_unwritten(ino, pages)?;
        Ok(())
    }

    /// Records that `[start, end)` of the file got new extents, for the
    /// next fast log. Kept sorted and merged: page-bounded writeback writes
    /// a file in pieces, in any order.
    pub(super) fn note_written_range(&mut self, ino: u64, start: u64, end: u64) -> Result<()> {
        let transid = self.fs.forest.transid();
        let log = &mut self.inode(ino)?.log;
        if log.ranges_trans != transid {
            log.dirty_ranges.clear();
            log.ranges_trans = transid;
        }
        let ranges = &mut log.dirty_ranges;
        match ranges.last_mut() {
            Some(last) if last.1 == start => last.1 = end,
            Some(last) if last.1 < start => ranges.push((start, end)),
            None => ranges.push((start, end)),
            Some(_) => {
                let at = ranges.partition_point(|r| r.1 < start);
                let mut merged = (start, end);
                let mut stop = at;
                while stop < ranges.len() && ranges[stop].0 <= merged.1 {
                    merged.0 = merged.0.min(ranges[stop].0);
                    merged.1 = merged.1.max(ranges[stop].1);
                    stop += 1;
                }
                ranges.splice(at..stop, [merged]);
            }
        }
        Ok(())
    }

    /// Writes back a set of an inode's pages (already taken out of its
    /// dirty set) without device I/O (the commit's seal, reflink's settle;
    /// docs/DELALLOC.md, "The seal's writeback"): their extents are
    /// allocated and published at once (file extent items, checksums, the
    /// written range) and registered as unwritten, so that reads take the
    /// bytes from memory until the next commit or log sync has written
    /// them, before its first flush. Returns the pages written back.
    fn write_back_unwritten(&mut self, ino: u64, pages: BTreeMap<u64, Box<[u8]>>) -> Result<u64> {
        let written = pages.len() as u64;
        let Some(runs) = self.runs_to_write(ino, pages)? else {
            return Ok(written);
        };
        let chunks = self.allocate_chunks(ino, &runs, &vec![MAX_EXTENT_BYTES; runs.len()])?;
        let transid = self.fs.forest.transid();
        let mut added = 0;
        for (at, chunk) in chunks.iter().enumerate() {
            if let Err(e) = self.publish_chunk(ino, chunk, &ChunkWrite::Plain) {
                // The caller fails the filesystem, which still serves
                // reads: the pages not published are dirty again.
                self.update_inode(ino, |i| i.nbytes += added)?;
                for chunk in &chunks[at..] {
                    self.redirty_unless_dirty(ino, chunk)?;
                }
                return Err(e);
            }
            self.fs
                .unwritten
                .add(chunk.bytenr, transid, chunk.bytes.clone());
            added += chunk.bytes.len() as u64;
        }
        self.update_inode(ino, |i| i.nbytes += added)?;
        Ok(written)
    }

    /// The first step of every writeback, under the state lock: a file
    /// that lives in page 0 gets its inline extent now (no device I/O;
    /// `None` is returned), compressed when its compression says so and the
    /// result fits ([`Self::inline_extent`]); otherwise the pages become
    /// runs of contiguous bytes (file offset, bytes), page 0 taken along
    /// when an inline extent must leave the tree.
    fn runs_to_write(
        &mut self,
        ino: u64,
        mut pages: BTreeMap<u64, Box<[u8]>>,
    ) -> Result<Option<Vec<Run>>> {
        if pages.is_empty() {
            return Ok(None);
        }
        let (size, nbytes) = {
            let item = &self.inode(ino)?.item;
            (item.size, item.nbytes)
        };
        // A file of one page may go inline compressed, a file of at most
        // MAX_INLINE_DATA bytes inline either way.
        let compress = match size <= MAX_INLINE_RAM {
            true => self.compression_for(ino)?,
            false => None,
        };
        let small = size <= MAX_INLINE_DATA as u64 || compress.is_some();
        // An inline extent is only ever a file's one extent: when other
        // extents exist or are about to, page 0 goes out as a regular extent
        // (with this writeback, from its dirty copy if it has one).
        let maybe_inline = nbytes > 0 && nbytes <= MAX_INLINE_RAM;
        let others_exist = pages.keys().any(|&p| p > 0)
            || ((small || maybe_inline)
                && !self.extents_overlapping(ino, PAGE, u64::MAX)?.is_empty());
        if others_exist && maybe_inline && !pages.contains_key(&0) {
            if let Some((0, e)) = self.extents_overlapping(ino, 0, 1)?.first() {
                if e.is_inline() {
                    let page = match self.take_dirty_page(ino, 0)? {
                        Some(page) => page,
                        None => self.load_page(ino, 0)?,
                    };
                    pages.insert(0, page);
                }
            }
        }
        debug_assert!(
            pages.keys().all(|&p| p * PAGE < size),
            "dirty page beyond EOF of inode {ino}"
        );
        let inline = match small && !others_exist {
            true => self.inline_extent(&pages[&0][..size as usize], compress),
            false => None,
        };
        if let Some(extent) = inline {
            // The whole file lives in page 0: keep it in the tree.
            self.drop_extents(ino, 0, PAGE)?;
            self.fs.forest.insert(
                &mut self.root.tree,
                Key::new(ino, item_type::EXTENT_DATA, 0),
                extent.encode(),
            )?;
            self.note_written_range(ino, 0, PAGE)?;
            self.update_inode(ino, |i| i.nbytes += size)?;
            for page in pages.into_values() {
                self.fs.spare_pages.give(page);
            }
            return Ok(None);
        }
        // Runs of contiguous pages, as (first page, pages), so that each
        // run's buffer is allocated once at its size.
        let mut run_pages: Vec<(u64, u64)> = Vec::new();
        for &index in pages.keys() {
            match run_pages.last_mut() {
                Some((first, count))
                    if *first + *count == index && *count * PAGE < MAX_EXTENT_BYTES =>
                {
                    *count += 1
                }
                _ => run_pages.push((index, 1)),
            }
        }
        let mut pages = pages.into_values();
        let mut runs: Vec<Run> = Vec::with_capacity(run_pages.len());
        for (first, count) in run_pages {
            let mut bytes = Vec::with_capacity((count * PAGE) as usize);
            for page in pages.by_ref().take(count as usize) {
                bytes.extend_from_slice(&page);
                self.fs.spare_pages.give(page);
            }
            runs.push((first * PAGE, bytes));
        }
        Ok(Some(runs))
    }

    /// The inline extent of a file whose `data` (its whole content, at
    /// most a page) goes into the tree: compressed when `compress` is asked
    /// and the compressed bytes are fewer and fit `MAX_INLINE_DATA`
    /// (btrfs's `compress_file_range` trying `cow_file_range_inline`),
    /// else plain when the data fits `MAX_INLINE_DATA`, else `None` (a
    /// regular extent). The compression runs under the state lock: at most
    /// a page of CPU work (docs/COMPRESSION.md, "Compressed inline
    /// extents"). An attempt that does not fit neither marks the file `m`
    /// nor counts as a failed attempt: a single page never does.
    fn inline_extent(&mut self, data: &[u8], compress: TryCompress) -> Option<FileExtent> {
        if let Some((compression, level)) = compress.filter(|_| !data.is_empty()) {
            if let Some(packed) =
                crate::format::compression::compress_inline(compression, level, data)
            {
                self.fs.stats.compressed_bytes_in += data.len() as u64;
                self.fs.stats.compressed_bytes_out += packed.len() as u64;
                self.fs.stats.compressed_inline_extents += 1;
                // The commit or log sync that makes the item durable writes
                // the flag (docs/COMPRESSION.md, C1).
                self.fs.superblock.compression = true;
                return Some(FileExtent::InlineCompressed {
                    compressed: packed,
                    ram_bytes: data.len() as u64,
                    compression,
                });
            }
        }
        (data.len() <= MAX_INLINE_DATA).then(|| FileExtent::Inline {
            data: data.to_vec(),
        })
    }

    /// Puts pages whose writeback failed back into the dirty set.
    fn redirty(&mut self, ino: u64, file_offset: u64, bytes: &[u8]) -> Result<()> {
        for (i, page) in bytes.chunks(PAGE as usize).enumerate() {
            let index = file_offset / PAGE + i as u64;
            self.put_dirty_page(ino, index, page.into())?;
        }
        Ok(())
    }

    /// Plans a writeback of `pages` (taken out of the dirty set) for the
    /// data to be written without the state lock (docs/DELALLOC.md,
    /// "Writeback without the state lock"): the extents are allocated now
    /// and the writeback is registered as in flight, so that reads find its
    /// pages until it is published. A file that lives in page 0 gets its
    /// inline extent at once (`None`: nothing to write). The inode must
    /// have no writeback in flight. `runs_before`: the inode's runs of
    /// dirty pages before `pages` were taken out (their reservations are
    /// what the new extents take over).
    ///
    /// A run to compress becomes an extent per 128 KiB: it is compressed
    /// only when the reservations have room for the extents beyond the one
    /// its run reserved, else written as it is (docs/COMPRESSION.md,
    /// "Metadata for compressed chunks").
    pub(super) fn plan_writeback(
        &mut self,
        ino: u64,
        pages: BTreeMap<u64, Box<[u8]>>,
        runs_before: u64,
    ) -> Result<Option<PlannedWrite>> {
        let queued = self.queued(ino);
        debug_assert!(!self.fs.writebacks.contains(queued));
        let Some(runs) = self.runs_to_write(ino, pages)? else {
            return Ok(None);
        };
        // The runs of dirty pages this writeback ended (negative: it cut
        // one in two). Their reservation went back when the pages were
        // taken out: the room below counts it.
        let ended = runs_before as i64 - self.fs.space.runs_of(queued) as i64;
        let compress = self.compression_for(ino)?;
        let unallocated = runs.iter().map(|(_, bytes)| bytes.len() as u64).sum();
        let room = self.extent_room(unallocated);
        // Written as they are, the runs are an extent each; what is left
        // of the ordinary room may go to compressed chunks.
        let mut spare = room.ordinary as i64 - runs.len() as i64;
        let mut most = Vec::with_capacity(runs.len());
        let mut compressed = Vec::with_capacity(runs.len());
        let mut compress_extra = 0;
        for (_, bytes) in &runs {
            let extra = (bytes.len() as u64).div_ceil(MAX_COMPRESSED_RAM) - 1;
            // A run of one chunk costs nothing more compressed.
            let fits = extra == 0 || extra as i64 <= spare;
            if compress.is_some() && fits {
                spare -= extra as i64;
                compress_extra += extra;
                most.push(MAX_COMPRESSED_RAM);
                compressed.push(compress);
            } else {
                if compress.is_some() {
                    self.fs.stats.compress_fallback_runs += 1;
                }
                most.push(MAX_EXTENT_BYTES);
                compressed.push(None);
            }
        }
        debug_assert!(
            compress_extra == 0 || runs.len() as u64 + compress_extra <= room.ordinary,
            "compressed chunks of inode {ino} planned without room for their extents"
        );
        let chunks = self.allocate_chunks(ino, &runs, &most)?;
        // Extents without room even in the global reserve (fragmented free
        // space near full, a run cut in two): what this writeback added
        // beyond the runs it ended and beyond that room. Counted, never
        // hidden.
        let made = chunks.len() as i64;
        let unreserved = (made - ended).min(made - room.with_reserve as i64).max(0) as u64;
        self.fs.space.stats.writeback_extents_unreserved += unreserved;
        let mut run = 0;
        let writes = chunks
            .iter()
            .map(|c| {
                while c.file_offset >= runs[run].0 + runs[run].1.len() as u64 {
                    run += 1;
                }
                (c.bytenr, c.bytes.clone(), compressed[run])
            })
            .collect();
        let id = self.fs.writebacks.start(queued, chunks);
        let stop_at_incompressible = compress.is_some() && self.gives_up_on_incompressible(ino)?;
        Ok(Some(PlannedWrite {
            queued,
            id,
            writes,
            stop_at_incompressible,
        }))
    }

    /// Whether and how the writeback of `ino` compresses, as btrfs's
    /// `inode_need_compress` and `compress_file_range` choose
    /// (docs/COMPRESSION.md, "Choosing"): `compress-force` always; else
    /// never with `NOCOMP` (`m`: the property `none`, or a chunk that did
    /// not shrink); else under `compress=`, `c` or a compression property.
    /// The algorithm is the property's, else the mount's, else zstd.
    fn compression_for(&mut self, ino: u64) -> Result<Option<(Compression, i32)>> {
        let option = self.fs.options.compress;
        let flags = self.inode(ino)?.item.flags as u32;
        let forced = option.force && option.algorithm.is_some();
        let asked = option.algorithm.is_some() || flags & inode_flags::COMPR != 0;
        if !forced && (flags & inode_flags::NOCOMP != 0 || !asked) {
            return Ok(None);
        }
        let level_of = |algorithm: Compression| match option.algorithm {
            Some(mount) if mount == algorithm => option.level,
            _ if algorithm == Compression::Zstd => DEFAULT_ZSTD_LEVEL,
            _ => 0,
        };
        Ok(Some(
            match (self.compression_property(ino)?, option.algorithm) {
                (Some(CompressionProperty::Algorithm(a)), _) => (a, level_of(a)),
                (_, Some(a)) => (a, option.level),
                (_, None) => (Compression::Zstd, DEFAULT_ZSTD_LEVEL),
            },
        ))
    }

    /// Allocates the extents for `runs` (file offset, bytes): one chunk
    /// per allocation, of at most `most[i]` bytes for run `i` (fewer when
    /// free space is fragmented). On failure nothing is allocated and the
    /// runs' pages are dirty again.
    fn allocate_chunks(&mut self, ino: u64, runs: &[Run], most: &[u64]) -> Result<Vec<Chunk>> {
        debug_assert_eq!(runs.len(), most.len());
        let mut chunks = Vec::new();
        let mut failed = None;
        'runs: for ((start, bytes), &most) in runs.iter().zip(most) {
            let mut done = 0;
            while done < bytes.len() as u64 {
                let keep = self.nodes_promised();
                let want = (bytes.len() as u64 - done).min(most);
                match self.fs.forest.alloc_mut().alloc_data(want, ino, keep) {
                    Ok((bytenr, got)) => {
                        chunks.push(Chunk {
                            file_offset: start + done,
                            bytenr,
                            bytes: bytes[done as usize..(done + got) as usize].into(),
                        });
                        done += got;
                    }
                    Err(e) => {
                        failed = Some(e);
                        break 'runs;
                    }
                }
            }
        }
        if let Some(e) = failed {
            // Nothing was written: the allocations go back, the pages
            // stay dirty.
            for chunk in &chunks {
                self.free_unpublished(ino, chunk);
            }
            for (start, bytes) in runs {
                self.redirty(ino, *start, bytes)?;
            }
            return Err(e);
        }
        Ok(chunks)
    }

    /// Publishes the writeback `id` of `ino` once its data was written
    /// (`written`: how the writes went): its extents become the file's,
    /// with their checksums, and the range is noted for the next fast log.
    /// Pages dirtied again meanwhile stay dirty (their newer bytes go out
    /// with a later writeback). A writeback cancelled meanwhile has
    /// nothing left to publish. After a failed write the pages are dirty
    /// again and the extents freed. Returns the pages published.
    pub(super) fn publish_writeback(
        &mut self,
        ino: u64,
        id: u64,
        written: Result<Vec<ChunkWrite>>,
    ) -> Result<u64> {
        let Some(in_flight) = self.fs.writebacks.finish(self.queued(ino), id) else {
            return written.map(|_| 0);
        };
        let outcomes = match written {
            Ok(outcomes) => outcomes,
            Err(e) => {
                self.unwind_writeback(ino, in_flight)?;
                return Err(e);
            }
        };
        debug_assert_eq!(outcomes.len(), in_flight.chunks.len());
        let mut added = 0;
        let mut pages = 0;
        for (at, (chunk, outcome)) in in_flight.chunks.iter().zip(&outcomes).enumerate() {
            let published = self.publish_chunk(ino, chunk, outcome);
            if let Err(e) = published {
                // The caller fails the filesystem, which still serves
                // reads: the pages not published are dirty again, so that
                // reads show what the application wrote.
                self.update_inode(ino, |i| i.nbytes += added)?;
                for chunk in &in_flight.chunks[at..] {
                    self.redirty_unless_dirty(ino, chunk)?;
                }
                return Err(e);
            }
            added += published?;
            pages += chunk.bytes.len() as u64 / PAGE;
        }
        self.update_inode(ino, |i| i.nbytes += added)?;
        Ok(pages)
    }

    /// Makes one written chunk the file's extent, with its checksums (of
    /// the bytes on disk: compressed ones for a compressed extent). Returns
    /// what it adds to `nbytes`.
    fn publish_chunk(&mut self, ino: u64, chunk: &Chunk, outcome: &ChunkWrite) -> Result<u64> {
        let got = chunk.bytes.len() as u64;
        let file_offset = chunk.file_offset;
        let disk = DiskRef {
            disk_bytenr: chunk.bytenr,
            disk_num_bytes: got,
            offset: 0,
            num_bytes: got,
        };
        let extent = match outcome {
            ChunkWrite::Compressed {
                compression,
                compressed_len,
                bytes,
            } => {
                let on_disk = bytes.len() as u64;
                self.fs
                    .forest
                    .alloc_mut()
                    .shrink_new_data(chunk.bytenr, got, on_disk);
                self.fs.record_data_extent(chunk.bytenr, bytes)?;
                self.fs.stats.compressed_bytes_in += got;
                self.fs.stats.compressed_bytes_out += on_disk;
                // The commit or log sync that makes this extent durable
                // writes the flag (docs/COMPRESSION.md, C1).
                self.fs.superblock.compression = true;
                FileExtent::compressed(
                    DiskRef {
                        disk_num_bytes: on_disk,
                        ..disk
                    },
                    CompressedRef {
                        compression: *compression,
                        compressed_len: *compressed_len,
                        ram_bytes: got,
                    },
                )
            }
            ChunkWrite::DidNotShrink | ChunkWrite::Plain => {
                if matches!(outcome, ChunkWrite::DidNotShrink) {
                    self.fs.stats.compress_attempts_failed += 1;
                    self.mark_incompressible(ino)?;
                }
                self.fs.record_data_extent(chunk.bytenr, &chunk.bytes)?;
                FileExtent::regular(disk)
            }
        };
        let added = extent.nbytes();
        self.drop_extents(ino, file_offset, file_offset + got)?;
        self.insert_file_extent(ino, file_offset, extent)?;
        self.note_written_range(ino, file_offset, file_offset + got)?;
        Ok(added)
    }

    /// A chunk of `ino` did not shrink: as btrfs's `compress_file_range`,
    /// the inode gets `NOCOMP` (kept in its item, so an eviction or a
    /// remount does not forget it), unless `compress-force` is on or the
    /// file has a compression property (docs/COMPRESSION.md, "Choosing").
    fn mark_incompressible(&mut self, ino: u64) -> Result<()> {
        if !self.gives_up_on_incompressible(ino)? {
            return Ok(());
        }
        self.update_inode(ino, |i| i.flags |= u64::from(inode_flags::NOCOMP))
    }

    /// Whether a chunk of `ino` that does not shrink stops compression of
    /// the file: not under `compress-force`, nor for a file with a
    /// compression property.
    fn gives_up_on_incompressible(&mut self, ino: u64) -> Result<bool> {
        let option = self.fs.options.compress;
        if option.force && option.algorithm.is_some() {
            return Ok(false);
        }
        let property = self.compression_property(ino)?;
        Ok(!matches!(property, Some(CompressionProperty::Algorithm(_))))
    }

    /// Puts a chunk's pages back into the dirty set, but for those dirtied
    /// again since and those past the end of the file.
    fn redirty_unless_dirty(&mut self, ino: u64, chunk: &Chunk) -> Result<()> {
        let size = self.inode(ino)?.item.size;
        for (i, bytes) in chunk.bytes.chunks(PAGE as usize).enumerate() {
            let index = chunk.file_offset / PAGE + i as u64;
            if index * PAGE >= size || self.inode(ino)?.pages.contains_key(&index) {
                continue;
            }
            let mut page = self.fs.spare_pages.take_for_overwrite();
            page.copy_from_slice(bytes);
            self.put_dirty_page(ino, index, page)?;
        }
        Ok(())
    }

    /// Cancels the writeback of `ino` in flight, if any, for a change that
    /// must find the file's data in its extents and dirty pages (truncate,
    /// punch, fallocate, reflink, unlink, the commit): its pages are dirty
    /// again and its extents freed, as if it had not started. Its write
    /// may still land; the freed space is not reused before it did (the
    /// writeback holds a reader epoch).
    pub(crate) fn cancel_writeback(&mut self, ino: u64) -> Result<()> {
        match self.fs.writebacks.take(self.queued(ino)) {
            Some(in_flight) => self.unwind_writeback(ino, in_flight),
            None => Ok(()),
        }
    }

    /// Puts the pages of a writeback taken out of flight back into the
    /// dirty set (those not dirtied again since, within the file) and frees
    /// its extents.
    fn unwind_writeback(&mut self, ino: u64, in_flight: InFlight) -> Result<()> {
        for chunk in &in_flight.chunks {
            self.redirty_unless_dirty(ino, chunk)?;
            self.free_unpublished(ino, chunk);
        }
        Ok(())
    }

    /// Frees an extent allocated for a writeback that will not publish it
    /// (no item points into it, no checksum was recorded): pinned, like
    /// any extent freed in its own transaction.
    fn free_unpublished(&mut self, ino: u64, chunk: &Chunk) {
        let len = chunk.bytes.len() as u64;
        let alloc = self.fs.forest.alloc_mut();
        alloc.add_data_ref(chunk.bytenr, len, ino, 1);
        let released = alloc.drop_data_ref(chunk.bytenr, len, ino);
        debug_assert!(
            released,
            "unpublished extent {} still referenced",
            chunk.bytenr
        );
    }

    /// Runs a fallocate of `mode`. Punch hole's and zero range's partial
    /// edge pages not in memory come from `ready` when it has them (read
    /// ahead without the state lock: [`Self::fallocate_partial_pages`]).
    pub(crate) fn fallocate(
        &mut self,
        ino: u64,
        offset: u64,
        len: u64,
        mode: FallocateMode,
        ready: &ReadyPages,
    ) -> Result<()> {
        self.require_regular(ino)?;
        if len == 0 {
            return Err(Error::InvalidArgument("fallocate of zero bytes"));
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(Error::FileTooBig)?;
        // Preallocation looks for holes among the extents and dirty pages.
        self.cancel_writeback(ino)?;
        let size = self.inode(ino)?.item.size;
        let mode = match mode {
            FallocateMode::PunchHole => return self.punch_hole(ino, offset, end.min(size), ready),
            FallocateMode::CollapseRange => return self.collapse_range(ino, offset, len),
            FallocateMode::InsertRange => return self.insert_range(ino, offset, len),
            // Zeroing is a punch followed by preallocation of the range:
            // it reads as zeros and a later write into it cannot fail for
            // space (as ext4 and xfs promise).
            FallocateMode::ZeroRange => {
                self.punch_hole(ino, offset, end.min(size), ready)?;
                FallocateMode::Allocate
            }
            FallocateMode::ZeroRangeKeepSize => {
                self.punch_hole(ino, offset, end.min(size), ready)?;
                FallocateMode::AllocateKeepSize
            }
            other => other,
        };
        // Preallocated extents may not sit beside an inline extent: the
        // inline data goes out as a regular extent at the next writeback.
        if let Some((0, e)) = self.extents_overlapping(ino, 0, 1)?.first() {
            if e.is_inline() {
                let page = self.load_page(ino, 0)?;
                self.put_dirty_page(ino, 0, page)?;
            }
        }
        let holes = self.prealloc_holes(ino, offset, end)?;
        let mut added = 0;
        let filled = self.fill_holes(ino, &holes, &mut added);
        // Extents inserted before an error stay (as on ext4 and xfs, a
        // failed preallocation may leave part of the range allocated): the
        // inode counts their bytes either way.
        let now = Timespec::now();
        let grow = mode == FallocateMode::Allocate && filled.is_ok();
        self.update_inode(ino, |i| {
            i.nbytes += added;
            if grow && end > i.size {
                i.size = end;
                i.mtime = now;
            }
            i.ctime = now;
        })?;
        filled
    }

    /// Fills `holes` with preallocated extents, adding their bytes to
    /// `added` as they are inserted.
    fn fill_holes(&mut self, ino: u64, holes: &[(u64, u64)], added: &mut u64) -> Result<()> {
        for &(hole_start, hole_end) in holes {
            let mut at = hole_start;
            while at < hole_end {
                let keep = self.nodes_promised();
                let (bytenr, got) = self.fs.forest.alloc_mut().alloc_data(
                    (hole_end - at).min(MAX_EXTENT_BYTES),
                    ino,
                    keep,
                )?;
                self.insert_file_extent(
                    ino,
                    at,
                    FileExtent::prealloc(crate::format::DiskRef {
                        disk_bytenr: bytenr,
                        disk_num_bytes: got,
                        offset: 0,
                        num_bytes: got,
                    }),
                )?;
                self.note_written_range(ino, at, at + got)?;
                *added += got;
                at += got;
            }
        }
        Ok(())
    }

    /// What a fallocate may add to the reservations: preallocation
    /// allocates the holes at once (plus page 0 of an inline file), a punch
    /// only dirties its edge pages and may use the global reserve.
    pub(crate) fn fallocate_need(
        &mut self,
        ino: u64,
        offset: u64,
        len: u64,
        mode: FallocateMode,
    ) -> Result<Need> {
        self.require_regular(ino)?;
        let Some(end) = offset.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE) else {
            return Ok(Need::NONE);
        };
        if len == 0 {
            return Ok(Need::NONE);
        }
        let holes: u64 = match mode {
            FallocateMode::PunchHole => return Ok(Need::urgent_items(4).plus_bytes(2 * PAGE)),
            FallocateMode::CollapseRange | FallocateMode::InsertRange => {
                return self.shift_need(ino, offset)
            }
            // After the punch the whole range is a hole.
            FallocateMode::ZeroRange | FallocateMode::ZeroRangeKeepSize => {
                end.div_ceil(PAGE) * PAGE - offset / PAGE * PAGE + 2 * PAGE
            }
            FallocateMode::Allocate | FallocateMode::AllocateKeepSize => self
                .prealloc_holes(ino, offset, end)?
                .iter()
                .map(|(a, b)| b - a)
                .sum(),
        };
        Ok(super::space_info::prealloc_need(holes))
    }

    /// The page-aligned holes of `[offset, end)`: what preallocation fills
    /// with unwritten (prealloc) extents; data already there stays.
    fn prealloc_holes(&mut self, ino: u64, offset: u64, end: u64) -> Result<Vec<(u64, u64)>> {
        let start = offset / PAGE * PAGE;
        let aligned_end = end.div_ceil(PAGE) * PAGE;
        let mut covered: Vec<(u64, u64)> = self
            .extents_overlapping(ino, start, aligned_end)?
            .into_iter()
            .map(|(o, e)| (o, if e.is_inline() { PAGE } else { e.len() }))
            .collect();
        covered.extend(
            self.inode(ino)?
                .pages
                .range(start / PAGE..aligned_end / PAGE)
                .map(|(&p, _)| (p * PAGE, PAGE)),
        );
        covered.sort_unstable();
        let mut holes = Vec::new();
        let mut cursor = start;
        for (o, l) in covered {
            if o > cursor {
                holes.push((cursor, o.min(aligned_end)));
            }
            cursor = cursor.max(o + l);
        }
        if cursor < aligned_end {
            holes.push((cursor, aligned_end));
        }
        Ok(holes)
    }

    /// The pages a fallocate of `mode` over `len` bytes at `offset` zeroes
    /// only in part and keeps the rest of: punch hole's and zero range's
    /// partial edge pages below EOF (as [`Self::punch_hole`] takes them),
    /// none for other modes, other file types or a range it refuses.
    pub(crate) fn fallocate_partial_pages(
        &mut self,
        ino: u64,
        offset: u64,
        len: u64,
        mode: FallocateMode,
    ) -> Result<Vec<u64>> {
        if !mode.zeroes() || !self.is_regular_file(ino)? {
            return Ok(Vec::new());
        }
        let size = self.inode(ino)?.item.size;
        match offset.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE) {
            Some(end) if offset < end.min(size) => {
                Ok(partial_pages(offset, end.min(size) - offset))
            }
            _ => Ok(Vec::new()),
        }
    }

    /// Zeroes `[start, end)`: whole pages lose their extents and dirty
    /// copies; partial pages at the edges are zeroed in place, their disk
    /// content taken from `ready` when it has it.
    pub(super) fn punch_hole(
        &mut self,
        ino: u64,
        start: u64,
        end: u64,
        ready: &ReadyPages,
    ) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        self.cancel_writeback(ino)?;
        self.inode(ino)?.log.full_sync = true;
        let first_full = start.div_ceil(PAGE);
        let last_full = end / PAGE;
        for index in partial_pages(start, end - start) {
            let page_start = index * PAGE;
            let mut page = self.load_page_from(ino, index, ready)?;
            let from = start.max(page_start) - page_start;
            let to = end.min(page_start + PAGE) - page_start;
            page[from as usize..to as usize].fill(0);
            self.put_dirty_page(ino, index, page)?;
        }
        if first_full < last_full {
            self.take_dirty_pages(ino, first_full..last_full)?;
            self.drop_extents(ino, first_full * PAGE, last_full * PAGE)?;
        }
        let now = Timespec::now();
        self.update_inode(ino, |i| {
            i.mtime = now;
            i.ctime = now;
        })
    }

    /// Where the file's byte at `offset` lies on the device (FIBMAP,
    /// docs/FUSE.md "FIBMAP"): its device byte when a written extent holds
    /// it; `None` in a hole, past the end of file, in inline data, in a
    /// preallocated range, and in a dirty page not on disk yet.
    pub(crate) fn device_byte(&mut self, ino: u64, offset: u64) -> Result<Option<u64>> {
        self.require_regular(ino)?;
        if offset >= self.inode(ino)?.item.size {
            return Ok(None);
        }
        let page = offset / PAGE;
        let in_flight = self
            .fs
            .writebacks
            .get(self.queued(ino))
            .is_some_and(|f| f.page(page, PAGE).is_some());
        if in_flight || self.inode(ino)?.pages.contains_key(&page) {
            return Ok(None);
        }
        for (start, extent) in self.extents_overlapping(ino, offset, offset + 1)? {
            if let FileExtent::Regular {
                disk_bytenr,
                offset: extent_offset,
                num_bytes,
                ..
            } = extent
            {
                if let Some(within) = offset.checked_sub(start).filter(|&w| w < num_bytes) {
                    let byte = disk_bytenr
                        .checked_add(extent_offset)
                        .and_then(|b| b.checked_add(within));
                    // An unwritten extent's bytes are in memory until its
                    // commit writes them: no device block holds them yet.
                    return Ok(byte.filter(|&b| self.fs.unwritten.covering(b, 1).is_none()));
                }
            }
        }
        Ok(None)
    }

    pub(crate) fn seek(&mut self, ino: u64, offset: u64, whence: SeekWhence) -> Result<u64> {
        self.require_regular(ino)?;
        let size = self.inode(ino)?.item.size;
        if offset >= size {
            return Err(Error::NoSuchOffset);
        }
        // Data: written extents and dirty pages. Unwritten (prealloc)
        // ranges read as zeros and count as holes, as on btrfs.
        let mut data: Vec<(u64, u64)> = self
            .extents_overlapping(ino, offset, size)?
            .into_iter()
            .filter(|(_, e)| !matches!(e, FileExtent::Prealloc { .. }))
            .map(|(o, e)| (o, o + e.len()))
            .collect();
        data.extend(
            self.inode(ino)?
                .pages
                .range(offset / PAGE..)
                .map(|(&p, _)| (p * PAGE, p * PAGE + PAGE)),
        );
        if let Some(in_flight) = self.fs.writebacks.get(self.queued(ino)) {
            data.extend(
                in_flight
                    .page_indexes(PAGE)
                    .map(|p| (p * PAGE, p * PAGE + PAGE)),
            );
        }
        data.sort_unstable();
        match whence {
            SeekWhence::Data => data
                .iter()
                .find(|&&(_, e)| e > offset)
                .map(|&(s, _)| s.max(offset))
                .filter(|&o| o < size)
                .ok_or(Error::NoSuchOffset),
            SeekWhence::Hole => {
                let mut at = offset;
                for (s, e) in data {
                    if s > at {
                        break;
                    }
                    at = at.max(e);
                }
                Ok(at.min(size))
            }
        }
    }
}

/// Writeback over the dirty-inode queue, which spans roots: it names
/// inodes by their external numbers (`RootCtx::queued`).
impl<D: BlockDevice> FsState<D> {
    /// Writes back every dirty page of every file of every root (the
    /// commit's seal) without device I/O: the pages get published extents
    /// whose data the commit writes once the state lock is released
    /// ([`RootCtx::write_back_unwritten`]). The writebacks in flight are
    /// cancelled first, as nothing allocated may stay unpublished across
    /// the seal (the commit would free it).
    pub(crate) fn writeback_all(&mut self) -> Result<()> {
        for queued in self.info.writebacks.inodes() {
            match self.resolve(queued) {
                Ok((mut root, ino)) => root.cancel_writeback(ino)?,
                // Its root is gone (deletion cancels, so this is only a
                // guard): nothing points at its extents, which this
                // commit frees as allocated and never referenced.
                Err(Error::NotFound) => drop(self.info.writebacks.take(queued)),
                Err(e) => return Err(e),
            }
        }
        for queued in self.info.space.dirty_inodes() {
            let (mut root, ino) = self.resolve(queued)?;
            let pages = root.take_dirty_pages(ino, ..)?;
            let n = root.write_back_unwritten(ino, pages)?;
            root.fs.space.stats.commit_pages += n;
        }
        debug_assert_eq!(self.info.dirty_page_bytes, 0);
        Ok(())
    }

    /// Plans a page-bounded writeback (reclaim, the flusher, throttled
    /// writers, the commit's early batches): about `budget` pages, oldest
    /// dirty inode first, as many inodes as it takes — never "all pages
    /// of N inodes" — skipping inodes with a writeback in flight. Within
    /// an inode it goes on from where the last page-bounded writeback
    /// stopped, in file order, so a large file still gets long extents.
    ///
    /// With `whole_inodes` (seed 004 switched off, docs/ABLATION.md)
    /// `budget` counts inodes instead, each written back whole: reclaim's
    /// behaviour before seed 004.
    pub(crate) fn plan_writeback_oldest(
        &mut self,
        budget: u64,
        whole_inodes: bool,
    ) -> Result<WritebackBatch> {
        let mut batch = WritebackBatch::default();
        let mut inodes = 0u64;
        while if whole_inodes {
            inodes < budget
        } else {
            batch.pages < budget
        } {
            let writebacks = &self.info.writebacks;
            let Some(queued) = self
                .info
                .space
                .oldest_dirty_inode_except(|q| writebacks.contains(q))
            else {
                break;
            };
            inodes += 1;
            let want = if whole_inodes {
                usize::MAX
            } else {
                (budget - batch.pages) as usize
            };
            let cursor = self.info.space.cursor(queued);
            let runs_before = self.info.space.runs_of(queued);
            let (mut root, ino) = self.resolve(queued)?;
            let keys: Vec<u64> = {
                let pages = &root.inode(ino)?.pages;
                pages
                    .range(cursor..)
                    .chain(pages.range(..cursor))
                    .take(want)
                    .map(|(&k, _)| k)
                    .collect()
            };
            let mut pages = BTreeMap::new();
            for &k in &keys {
                if let Some(page) = root.take_dirty_page(ino, k)? {
                    pages.insert(k, page);
                }
            }
            root.debug_check_runs(ino);
            if let Some(&last) = keys.last() {
                root.fs.space.set_cursor(queued, last + 1);
            }
            batch.pages += pages.len() as u64;
            if let Some(planned) = root.plan_writeback(ino, pages, runs_before)? {
                batch.writes.push(planned);
            }
        }
        batch.start_reading(self);
        Ok(batch)
    }

    /// Plans a writeback of the dirty pages of one inode (external number
    /// `queued`) with indexes in `range` (fsync: all of them;
    /// `sync_file_range`). Its writeback in flight must have been waited
    /// for.
    pub(crate) fn plan_writeback_inode(
        &mut self,
        queued: u64,
        range: impl std::ops::RangeBounds<u64>,
    ) -> Result<WritebackBatch> {
        let mut batch = WritebackBatch::default();
        let runs_before = self.info.space.runs_of(queued);
        let (mut root, ino) = self.resolve(queued)?;
        root.require_regular(ino)?;
        let pages = root.take_dirty_pages(ino, range)?;
        batch.pages = pages.len() as u64;
        if let Some(planned) = root.plan_writeback(ino, pages, runs_before)? {
            batch.writes.push(planned);
        }
        batch.start_reading(self);
        Ok(batch)
    }

    /// Publishes a batch after its writes (`written`, one per planned
    /// inode write, in order). Every write is published (or unwound); the
    /// first error is returned. Returns the batch's pages.
    pub(crate) fn publish_batch(
        &mut self,
        batch: WritebackBatch,
        written: Vec<Result<Vec<ChunkWrite>>>,
    ) -> Result<u64> {
        let mut first_error = None;
        for (planned, written) in batch.writes.into_iter().zip(written) {
            let still_in_flight = self
                .info
                .writebacks
                .get(planned.queued)
                .is_some_and(|w| w.id == planned.id);
            let published = if still_in_flight {
                match self.resolve(planned.queued) {
                    Ok((mut root, ino)) => root.publish_writeback(ino, planned.id, written),
                    Err(e) => {
                        // Its root is gone: nothing points at its extents,
                        // which the commit frees (allocated, never
                        // referenced). Out of flight, so nothing waits.
                        self.info.writebacks.take(planned.queued);
                        Err(e)
                    }
                }
            } else {
                // Cancelled (its pages dirty again, its extents freed):
                // only an error is left to report.
                written.map(|_| 0)
            };
            if let Err(e) = published {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(batch.pages),
        }
    }
}

/// The compression (algorithm, level) a chunk's write tries, if any.
type TryCompress = Option<(Compression, i32)>;

/// One inode's planned writeback: where each chunk's bytes go, and the
/// compression to try on it, without the state lock.
pub(crate) struct PlannedWrite {
    queued: u64,
    id: u64,
    writes: Vec<(u64, Arc<[u8]>, TryCompress)>,
    /// A chunk that does not shrink ends the tries for the rest of this
    /// write: its publish marks the file `NOCOMP`, so compressing the
    /// later chunks of a large incompressible write would be CPU spent on
    /// data the file gives up on (btrfs stops at the first such range).
    stop_at_incompressible: bool,
}

/// Writebacks planned under the state lock, to be written without it
/// ([`WritebackBatch::write`]) and then published under it
/// ([`FsState::publish_batch`]).
#[derive(Default)]
pub(crate) struct WritebackBatch {
    writes: Vec<PlannedWrite>,
    /// Pages taken out of the dirty set (those that went inline too).
    pub(crate) pages: u64,
    /// Keeps space freed while the writes are in flight (a cancel frees
    /// their extents) from reuse until they landed.
    reader: Option<ReaderTicket>,
}

impl WritebackBatch {
    fn start_reading<D: BlockDevice>(&mut self, state: &mut FsState<D>) {
        if !self.writes.is_empty() {
            self.reader = Some(state.info.forest.alloc_mut().start_read());
        }
    }

    /// Whether there is anything to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// The inodes (external numbers) whose writebacks this batch holds.
    pub(crate) fn inodes(&self) -> impl Iterator<Item = u64> + '_ {
        self.writes.iter().map(|w| w.queued)
    }

    /// Compresses (when planned so) and writes the planned data to `dev`,
    /// without the state lock: one outcome per inode, how each chunk went
    /// or the error that ended that inode's writes.
    pub(crate) fn write<Dev: BlockDevice + ?Sized>(
        &self,
        dev: &Dev,
    ) -> Vec<Result<Vec<ChunkWrite>>> {
        self.writes
            .iter()
            .map(|planned| {
                let mut gave_up = false;
                planned
                    .writes
                    .iter()
                    .map(|(bytenr, bytes, compress)| {
                        let outcome = if gave_up {
                            ChunkWrite::Plain
                        } else {
                            compress_chunk(*compress, bytes)
                        };
                        gave_up |= planned.stop_at_incompressible
                            && matches!(outcome, ChunkWrite::DidNotShrink);
                        let on_disk = match &outcome {
                            ChunkWrite::Compressed { bytes, .. } => bytes,
                            ChunkWrite::Plain | ChunkWrite::DidNotShrink => bytes,
                        };
                        dev.write_at(on_disk, *bytenr)?;
                        Ok(outcome)
                    })
                    .collect()
            })
            .collect()
    }
}

/// Compresses one chunk of a writeback as planned (docs/COMPRESSION.md):
/// CPU work, done without the state lock. A single page cannot save a
/// sector and is not tried (nor held against the file).
fn compress_chunk(compress: Option<(Compression, i32)>, bytes: &[u8]) -> ChunkWrite {
    let Some((compression, level)) = compress else {
        return ChunkWrite::Plain;
    };
    if bytes.len() as u64 <= PAGE {
        return ChunkWrite::Plain;
    }
    match crate::format::compression::compress(compression, level, bytes) {
        Some(mut packed) => {
            let compressed_len = packed.len() as u64;
            packed.resize(compressed_len.next_multiple_of(PAGE) as usize, 0);
            ChunkWrite::Compressed {
                compression,
                compressed_len,
                bytes: packed.into(),
            }
        }
        None => ChunkWrite::DidNotShrink,
    }
}

/// A file read planned under the state lock ([`RootCtx::plan_read`]) and
/// done without it.
pub(crate) struct ReadPlan {
    ino: u64,
    /// The read's pages, inline data and holes already in place.
    buf: Vec<u8>,
    reads: Vec<ExtentRead>,
    /// Copies of the dirty pages, by their place in `buf`: laid over the
    /// extents' older bytes once those are read.
    dirty: Vec<(usize, Box<[u8]>)>,
    /// The bytes asked for, within `buf`.
    keep: std::ops::Range<usize>,
    /// Keeps the planned extents from reuse until the read is done.
    _reader: Option<ReaderTicket>,
}

impl ReadPlan {
    fn empty(ino: u64) -> ReadPlan {
        ReadPlan {
            ino,
            buf: Vec::new(),
            reads: Vec::new(),
            dirty: Vec::new(),
            keep: 0..0,
            _reader: None,
        }
    }

    /// Reads and verifies the planned extents from `dev` and returns the
    /// bytes asked for. A checksum failure is [`Error::BadData`], for the
    /// caller to count.
    pub(crate) fn execute<Dev: BlockDevice + ?Sized>(mut self, dev: &Dev) -> Result<Vec<u8>> {
        read_planned(dev, self.ino, &self.reads, &mut self.buf)?;
        for (at, page) in &self.dirty {
            self.buf[*at..*at + page.len()].copy_from_slice(page);
        }
        self.buf.truncate(self.keep.end);
        self.buf.drain(..self.keep.start);
        Ok(self.buf)
    }
}
