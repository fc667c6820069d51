//! Partial pages a change needs from disk, read before it without the
//! state lock (docs/SNAPSHOTS.md (f) item 5). A write that covers its
//! first or last page only in part, a truncate into a page, a reflink's
//! unaligned edges and a punch hole's or zero range's edges inside pages
//! keep the rest of the page, which may be on disk only. The change used
//! to read it under the state lock (the "partial page read under a
//! change" exemption); now the request plans
//! the page's extents under the lock ([`RootCtx::plan_prefetch`]), reads
//! them with the lock dropped ([`PrefetchPlan::execute`]), and the change
//! plans the page again and uses the bytes read only if every extent read
//! is still the one it reads now and no commit became durable since
//! ([`RootCtx::ready_pages`]); otherwise nothing is changed and the
//! request reads again, [`PAGE_REREADS`] times at most, then reads the
//! rest under the lock (counted).

use super::csum::{read_planned, ExtentRead};
use super::root::RootCtx;
use crate::alloc::{ReaderTicket, TransactionSpace};
use crate::device::BlockDevice;
use crate::error::Result;
use crate::format::SECTOR_SIZE;
use std::collections::BTreeMap;

const PAGE: u64 = SECTOR_SIZE;

/// Stale prefetches a change reads again before it reads the pages it
/// still needs under the state lock.
pub(crate) const PAGE_REREADS: u32 = 4;

/// The pages a write (or punch) of `len` bytes at `offset` covers only in
/// part (their other bytes are the file's): at most its first and last.
pub(crate) fn partial_pages(offset: u64, len: u64) -> Vec<u64> {
    let Some(end) = offset.checked_add(len).filter(|_| len > 0) else {
        return Vec::new();
    };
    let (first, last) = (offset / PAGE, (end - 1) / PAGE);
    let mut pages = Vec::new();
    if !offset.is_multiple_of(PAGE) || (first == last && !end.is_multiple_of(PAGE)) {
        pages.push(first);
    }
    if last != first && !end.is_multiple_of(PAGE) {
        pages.push(last);
    }
    pages
}

/// The pages a reflink of `len` bytes (`src_offset` and `dst_offset` at
/// the same place within a page) copies as bytes rather than sharing: of
/// the source, those of its unaligned head and tail; of the destination,
/// those the copies cover in part (as `RootCtx::clone_range` splits it).
pub(crate) fn clone_edge_pages(src_offset: u64, dst_offset: u64, len: u64) -> (Vec<u64>, Vec<u64>) {
    let Some(src_end) = src_offset.checked_add(len).filter(|_| len > 0) else {
        return (Vec::new(), Vec::new());
    };
    let share_start = src_offset.next_multiple_of(PAGE);
    let share_end = src_end / PAGE * PAGE;
    if share_start >= share_end {
        let src = (src_offset / PAGE..=(src_end - 1) / PAGE).collect();
        return (src, partial_pages(dst_offset, len));
    }
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    if src_offset < share_start {
        src.push(src_offset / PAGE);
        dst.extend(partial_pages(dst_offset, share_start - src_offset));
    }
    if share_end < src_end {
        src.push(share_end / PAGE);
        let d1 = share_end - src_offset + dst_offset;
        dst.extend(partial_pages(d1, src_end - share_end));
    }
    (src, dst)
}

/// One page planned for a read without the lock.
struct PlannedPage {
    index: u64,
    /// Inline data and holes in place.
    buf: Box<[u8]>,
    reads: Vec<ExtentRead>,
}

/// The pages of one file a change will need from disk, planned under the
/// state lock ([`RootCtx::plan_prefetch`]).
pub(crate) struct PrefetchPlan {
    ino: u64,
    pages: Vec<PlannedPage>,
    /// The allocator's reader epoch when planned.
    epoch: u64,
    /// Keeps the planned extents from reuse until they are read.
    _reader: Option<ReaderTicket>,
}

/// One page read without the lock.
struct Prefetched {
    index: u64,
    /// What was read, to compare with what the change would read.
    reads: Vec<ExtentRead>,
    /// `None`: the read failed; the change reads the page again under
    /// the lock, which returns the error (or the data, if it was passing).
    bytes: Option<Box<[u8]>>,
}

/// Pages read without the lock for a change ([`PrefetchPlan::execute`]).
pub(crate) struct PagePrefetch {
    ino: u64,
    pages: Vec<Prefetched>,
    epoch: u64,
}

impl PrefetchPlan {
    /// Reads the planned pages from `dev` (without the state lock). A
    /// page whose read fails is read again by the change, under the lock,
    /// if it still needs it: the error is the change's to return.
    pub(crate) fn execute<Dev: BlockDevice + ?Sized>(self, dev: &Dev) -> PagePrefetch {
        let ino = self.ino;
        let pages = self
            .pages
            .into_iter()
            .map(|mut p| Prefetched {
                index: p.index,
                bytes: read_planned(dev, ino, &p.reads, &mut p.buf)
                    .ok()
                    .map(|()| p.buf),
                reads: p.reads,
            })
            .collect();
        PagePrefetch {
            ino,
            pages,
            epoch: self.epoch,
        }
    }
}

impl PagePrefetch {
    /// No page read: for a change that needs none.
    pub(crate) fn nothing() -> PagePrefetch {
        PagePrefetch {
            ino: 0,
            pages: Vec::new(),
            epoch: 0,
        }
    }

    /// The bytes read for page `index` of `ino`, if its reads were
    /// `reads` and the reader epoch is still `epoch`.
    fn matching(
        &self,
        ino: u64,
        index: u64,
        reads: &[ExtentRead],
        epoch: u64,
    ) -> Option<Option<&[u8]>> {
        if self.ino != ino || self.epoch != epoch {
            return None;
        }
        let page = self.pages.iter().find(|p| p.index == index)?;
        let same = page.reads.len() == reads.len()
            && page.reads.iter().zip(reads).all(|(a, b)| a.same_source(b));
        same.then_some(page.bytes.as_deref())
    }
}

/// Pages of a file as its extents hold them now, checked in the change's
/// hold ([`RootCtx::ready_pages`]), for `load_page_from` to copy.
#[derive(Default)]
pub(crate) struct ReadyPages {
    pages: BTreeMap<(u64, u64), Box<[u8]>>,
}

impl ReadyPages {
    /// Adds `other`'s pages (another file's).
    pub(crate) fn extend(&mut self, other: ReadyPages) {
        self.pages.extend(other.pages);
    }

    /// Page `index` of `ino`, if it was made ready. It stays ready: within
    /// the change's hold it is the page's disk content until the change
    /// drops the page's extents, which it does only after loading it.
    pub(crate) fn page(&self, ino: u64, index: u64) -> Option<&[u8]> {
        self.pages.get(&(ino, index)).map(|p| &p[..])
    }
}

impl<D: BlockDevice> RootCtx<'_, D> {
    /// Whether `load_page` would read page `index` of `ino` from the
    /// file's extents: not dirty, not under writeback, below EOF.
    fn page_in_extents(&mut self, ino: u64, index: u64) -> Result<bool> {
        let queued = self.queued(ino);
        if self
            .fs
            .writebacks
            .get(queued)
            .is_some_and(|w| w.page(index, PAGE).is_some())
        {
            return Ok(false);
        }
        let inode = self.inode(ino)?;
        Ok(!inode.pages.contains_key(&index) && index.saturating_mul(PAGE) < inode.item.size)
    }

    /// Plans the reads of the `pages` of `ino` a change will load from
    /// disk (under the state lock; the read is [`PrefetchPlan::execute`]).
    /// Pages in memory, past EOF, or without an extent to read (holes,
    /// inline data, preallocated space) are left out.
    pub(crate) fn plan_prefetch(&mut self, ino: u64, pages: &[u64]) -> Result<PrefetchPlan> {
        let mut planned = Vec::new();
        for &index in pages {
            if !self.page_in_extents(ino, index)? {
                continue;
            }
            let mut buf = self.fs.spare_pages.take_zeroed();
            let reads = self.plan_extents(ino, index * PAGE, &mut buf)?;
            if !reads.iter().any(ExtentRead::on_device) {
                self.fs.spare_pages.give(buf);
                continue;
            }
            planned.push(PlannedPage { index, buf, reads });
        }
        let reader = (!planned.is_empty()).then(|| self.fs.forest.alloc_mut().start_read());
        Ok(PrefetchPlan {
            ino,
            pages: planned,
            epoch: self.fs.forest.alloc().read_epoch(),
            _reader: reader,
        })
    }

    /// In the change's hold, before it changes anything: the `pages` of
    /// `ino` it will load from disk, as the file's extents hold them now.
    /// Each is planned again; the bytes `prefetch` read are used when every
    /// read is the one planned now and no commit became durable since the
    /// prefetch was planned (so the extents were not freed and reused in
    /// between: freed space stays pinned until a commit is durable). A page
    /// without a match is read under the lock when `under_lock` (the
    /// fallback after [`PAGE_REREADS`] prefetches); otherwise `None`: the
    /// caller changes nothing and prefetches again.
    pub(crate) fn ready_pages(
        &mut self,
        ino: u64,
        pages: &[u64],
        prefetch: &PagePrefetch,
        under_lock: bool,
    ) -> Result<Option<ReadyPages>> {
        let mut ready = ReadyPages::default();
        let epoch = self.fs.forest.alloc().read_epoch();
        for &index in pages {
            if !self.page_in_extents(ino, index)? {
                continue;
            }
            let mut page = self.fs.spare_pages.take_zeroed();
            let reads = self.plan_extents(ino, index * PAGE, &mut page)?;
            if !reads.iter().any(ExtentRead::on_device) {
                // Unwritten extents' bytes are in memory: no device read.
                self.read_planned_under_lock(ino, &reads, &mut page)?;
            } else {
                match prefetch.matching(ino, index, &reads, epoch) {
                    Some(Some(bytes)) => {
                        for read in &reads {
                            page[read.span()].copy_from_slice(&bytes[read.span()]);
                        }
                        self.fs.stats.partial_page_reads_unlocked += 1;
                    }
                    Some(None) => self.read_planned_under_lock(ino, &reads, &mut page)?,
                    None if under_lock => {
                        self.fs.stats.partial_page_read_fallbacks += 1;
                        self.read_planned_under_lock(ino, &reads, &mut page)?;
                    }
                    None => {
                        self.fs.stats.partial_page_rereads += 1;
                        return Ok(None);
                    }
                }
            }
            ready.pages.insert((ino, index), page);
        }
        Ok(Some(ready))
    }
}
