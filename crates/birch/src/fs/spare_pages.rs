//! Page buffers kept for reuse by the next writes. A leaf of the fs-wide
//! state (`FsInfo::spare_pages`).

use crate::format::SECTOR_SIZE;

const PAGE: u64 = SECTOR_SIZE;
/// Most page buffers kept for reuse (4 MiB).
const SPARE_PAGES_MAX: usize = 1024;

/// Page buffers that writeback is done with, kept for the next writes.
/// Allocating and freeing a 4 KiB buffer per written page was a tenth of
/// the daemon's CPU on dbench and untar (issue 12, docs/FUSE.md "Daemon
/// CPU per request"): pages are allocated by request threads and freed by
/// whichever thread writes them back, so glibc's per-thread heaps shrank
/// and grew again (mprotect) and every new page was zeroed and faulted in
/// by the kernel.
#[derive(Default)]
pub(crate) struct SparePages {
    free: Vec<Box<[u8]>>,
}

impl SparePages {
    /// A page buffer holding whatever it held last: only for a caller
    /// that overwrites all of it.
    pub(super) fn take_for_overwrite(&mut self) -> Box<[u8]> {
        self.free
            .pop()
            .unwrap_or_else(|| vec![0u8; PAGE as usize].into_boxed_slice())
    }

    /// A page buffer of zeros.
    pub(super) fn take_zeroed(&mut self) -> Box<[u8]> {
        match self.free.pop() {
            Some(mut page) => {
                page.fill(0);
                page
            }
            None => vec![0u8; PAGE as usize].into_boxed_slice(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.free.len()
    }

    /// Frees every kept buffer (an idle mount's memory back to the
    /// allocator).
    pub(crate) fn release(&mut self) {
        self.free = Vec::new();
    }

    /// Keeps `page` for reuse, up to `SPARE_PAGES_MAX` of them (dirty
    /// pages are all one page long; anything else is not kept).
    pub(super) fn give(&mut self, page: Box<[u8]>) {
        if page.len() == PAGE as usize && self.free.len() < SPARE_PAGES_MAX {
            self.free.push(page);
        }
    }
}
