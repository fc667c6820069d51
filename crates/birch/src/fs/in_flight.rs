//! Writebacks in flight: pages taken out of an inode's dirty set, their
//! extents allocated, whose data is being written without the state lock
//! (docs/DELALLOC.md, "Writeback without the state lock"). btrfs's ordered
//! extents: until the writeback is published, reads find the pages here,
//! and a change that must see the file's extents whole cancels it.

use std::collections::BTreeMap;
use std::sync::Arc;

/// A piece of a writeback: `bytes` go to `bytenr`, then become the file's
/// extent at `file_offset` (one allocation, one extent item).
pub(crate) struct Chunk {
    pub(crate) file_offset: u64,
    pub(crate) bytenr: u64,
    pub(crate) bytes: Arc<[u8]>,
}

/// How a chunk's write went without the state lock: as planned, or
/// compressed (docs/COMPRESSION.md). Its publish makes the extent of it.
pub(crate) enum ChunkWrite {
    /// Written as it is (compression off, or a single page, which cannot
    /// save a sector).
    Plain,
    /// Compression was tried and did not save a sector: written as it is,
    /// and the inode stops trying.
    DidNotShrink,
    /// `bytes` (the compressed data, zero padded to a sector) went to the
    /// chunk's address; the rest of its allocation goes back at publish.
    Compressed {
        compression: crate::format::Compression,
        compressed_len: u64,
        bytes: Arc<[u8]>,
    },
}

/// One inode's writeback in flight.
pub(crate) struct InFlight {
    /// Tells this writeback from a later one of the same inode: a publish
    /// whose id is no longer here was cancelled.
    pub(crate) id: u64,
    /// In file order, not overlapping.
    pub(crate) chunks: Vec<Chunk>,
}

impl InFlight {
    /// The bytes of page `index` (`page` bytes long) this writeback
    /// writes, if any.
    pub(crate) fn page(&self, index: u64, page: u64) -> Option<&[u8]> {
        let at = index.checked_mul(page)?;
        let at_chunk = self.chunks.partition_point(|c| c.file_offset <= at);
        let chunk = &self.chunks[..at_chunk].last()?;
        let within = usize::try_from(at - chunk.file_offset).ok()?;
        chunk.bytes.get(within..within + page as usize)
    }

    /// The page indexes this writeback writes.
    pub(crate) fn page_indexes(&self, page: u64) -> impl Iterator<Item = u64> + '_ {
        self.chunks.iter().flat_map(move |c| {
            let first = c.file_offset / page;
            first..first + c.bytes.len() as u64 / page
        })
    }
}

/// The writebacks in flight, at most one per inode, by the inode's
/// external number (as the dirty-inode queue names it).
#[derive(Default)]
pub(crate) struct Writebacks {
    next_id: u64,
    by_inode: BTreeMap<u64, InFlight>,
}

impl Writebacks {
    pub(crate) fn get(&self, queued: u64) -> Option<&InFlight> {
        self.by_inode.get(&queued)
    }

    pub(crate) fn contains(&self, queued: u64) -> bool {
        self.by_inode.contains_key(&queued)
    }

    /// Registers a writeback of `queued`, which has none in flight; returns
    /// its id.
    pub(crate) fn start(&mut self, queued: u64, chunks: Vec<Chunk>) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let before = self.by_inode.insert(queued, InFlight { id, chunks });
        debug_assert!(
            before.is_none(),
            "two writebacks of inode {queued} in flight"
        );
        id
    }

    /// Removes the writeback of `queued`, whatever its id (a cancel).
    pub(crate) fn take(&mut self, queued: u64) -> Option<InFlight> {
        self.by_inode.remove(&queued)
    }

    /// Removes the writeback `id` of `queued` if it is still in flight (a
    /// publish; `None`: it was cancelled).
    pub(crate) fn finish(&mut self, queued: u64, id: u64) -> Option<InFlight> {
        match self.by_inode.get(&queued) {
            Some(w) if w.id == id => self.by_inode.remove(&queued),
            _ => None,
        }
    }

    /// The inodes with a writeback in flight.
    pub(crate) fn inodes(&self) -> Vec<u64> {
        self.by_inode.keys().copied().collect()
    }

    /// Extents allocated and not yet published: each will be a file
    /// extent item and an extent item, counted in the delalloc metadata.
    pub(crate) fn extents(&self) -> u64 {
        self.by_inode.values().map(|w| w.chunks.len() as u64).sum()
    }
}

/// Data extents already in the trees (file extent items, checksums) whose
/// bytes are not on the device yet: the commit's seal and reflink's
/// settle plan them under the state lock and the next durability point
/// writes them without it, before its first flush (docs/DELALLOC.md,
/// "The seal's writeback"). Until written they are read from here, by
/// disk address: whichever file extent item points into them (a reflink's
/// copy, what a truncate left) reads the bytes, never the unwritten disk.
#[derive(Default)]
pub(crate) struct Unwritten {
    /// By disk address: the transaction that put the extent in the trees,
    /// and its bytes (the whole extent).
    by_bytenr: BTreeMap<u64, (u64, Arc<[u8]>)>,
}

/// Extent writes a durability point issues: (disk address, bytes).
pub(crate) type DataWrites = Vec<(u64, Arc<[u8]>)>;

impl Unwritten {
    /// Registers the extent at `bytenr` (just allocated, its items just
    /// inserted in transaction `transid`).
    pub(crate) fn add(&mut self, bytenr: u64, transid: u64, bytes: Arc<[u8]>) {
        debug_assert!(
            self.covering(bytenr, 1).is_none(),
            "unwritten extents overlap at {bytenr}"
        );
        self.by_bytenr.insert(bytenr, (transid, bytes));
    }

    /// The unwritten bytes of `[bytenr, bytenr + len)`, if an unwritten
    /// extent holds that range (a file extent item never spans extents).
    pub(crate) fn covering(&self, bytenr: u64, len: usize) -> Option<(Arc<[u8]>, usize)> {
        let (&start, (_, bytes)) = self.by_bytenr.range(..=bytenr).next_back()?;
        let at = usize::try_from(bytenr - start).ok()?;
        (at.checked_add(len)? <= bytes.len()).then(|| (bytes.clone(), at))
    }

    /// The extents put in the trees by transactions `from..=to`: what a
    /// commit (all up to its own) or a log sync (its running transaction's
    /// only: the commit it is based on writes the older ones before the
    /// log's superblock may be written) must write before its flush.
    pub(crate) fn writes(&self, from: u64, to: u64) -> DataWrites {
        self.by_bytenr
            .iter()
            .filter(|(_, (t, _))| (from..=to).contains(t))
            .map(|(&bytenr, (_, bytes))| (bytenr, bytes.clone()))
            .collect()
    }

    /// Forgets `written` extents once their writes completed: from now
    /// on reads find their bytes on the device.
    pub(crate) fn written(&mut self, written: &DataWrites) {
        for (bytenr, bytes) in written {
            if self
                .by_bytenr
                .get(bytenr)
                .is_some_and(|(_, b)| Arc::ptr_eq(b, bytes))
            {
                self.by_bytenr.remove(bytenr);
            }
        }
    }
}
