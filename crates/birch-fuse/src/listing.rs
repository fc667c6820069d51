//! Directory listings as the kernel sees them: the offsets handed out with
//! each entry (what telldir returns and seekdir and the next getdents take)
//! and the entries a listing continues with from any offset.
//!
//! Every entry has a position: "." is 0, ".." is 1, every other name its
//! dir index (2 and up, never reused while the name exists). An entry's
//! offset is the position of the entry after it, as btrfs hands out the
//! next DIR_INDEX, and a listing started at offset `v` continues with the
//! first entry whose position is at least `v`. So offsets grow along a
//! listing, and a seek to any value between two offsets handed out (a
//! telldir result, or anything else) continues with the later one's
//! entry: nothing is skipped and end-of-directory comes only past the
//! last entry (generic/676).

use birch::device::BlockDevice;
use birch::fs::{Attr, DirListEntry, Filesystem};
use std::collections::VecDeque;

/// The offset of a directory entry as the kernel keeps it: the position a
/// listing continues from, and where the listing it belongs to ends.
/// Every rename gives the entry a new, higher dir index, so a listing that
/// renames each name it reads away and back would otherwise never end;
/// like btrfs, a listing stops at the first index that did not exist when
/// it began (offset 0). With no opendir round trip (NO_OPENDIR_SUPPORT) the
/// offset is the only state a listing has, so the end travels in it: bit
/// 62 set, the end in bits 31..=61, the position in bits 0..=30 (positions
/// never exceed the end). One listing's offsets share their high bits, so
/// they order as their positions do, and so does every value between
/// them.
///
/// Offsets below bit 62 are never handed out for a directory whose
/// indexes are below 2^31: such a value lies between 0 (where every
/// listing starts) and the offset of "." and continues with "..". A
/// directory whose indexes have passed 2^31 gets plain positions and
/// unbounded listings. Offsets stay valid across inserts and deletes:
/// positions are dir indexes, which never move.
struct ListingCookie;

impl ListingCookie {
    const BOUNDED: u64 = 1 << 62;
    const SHIFT: u32 = 31;
    const MAX: u64 = (1 << Self::SHIFT) - 1;

    fn encode(position: u64, end: Option<u64>) -> u64 {
        match end {
            Some(end) => Self::BOUNDED | end << Self::SHIFT | position,
            None => position,
        }
    }

    /// (position, end) of an offset with bit 62 set; None for the others.
    fn decode_bounded(offset: u64) -> Option<(u64, u64)> {
        (offset & Self::BOUNDED != 0)
            .then_some((offset & Self::MAX, (offset & !Self::BOUNDED) >> Self::SHIFT))
    }
}

/// One entry of a listing.
pub(crate) struct Listed {
    /// "." 0, ".." 1, any other name its dir index.
    position: u64,
    pub ino: u64,
    pub kind: fuser::FileType,
    pub name: Vec<u8>,
}

/// The entries of directory `dir` from a position on, read from the engine
/// in batches, ending at the listing's end.
struct Entries<'a, D: BlockDevice + 'static> {
    fs: &'a Filesystem<D>,
    dir: u64,
    /// The position the next entry is read from.
    next: u64,
    end: Option<u64>,
    batch: VecDeque<DirListEntry>,
    done: bool,
}

impl<D: BlockDevice + 'static> Entries<'_, D> {
    const BATCH: usize = 128;

    fn next(&mut self) -> birch::Result<Option<Listed>> {
        if self.next < 2 {
            let (ino, name) = if self.next == 0 {
                (self.dir, b".".to_vec())
            } else {
                (self.fs.parent_of_dir(self.dir)?, b"..".to_vec())
            };
            let position = self.next;
            self.next += 1;
            return Ok(Some(Listed {
                position,
                ino,
                kind: fuser::FileType::Directory,
                name,
            }));
        }
        if self.done {
            return Ok(None);
        }
        if self.batch.is_empty() {
            self.batch = self.fs.readdir(self.dir, self.next, Self::BATCH)?.into();
        }
        let Some(e) = self.batch.pop_front() else {
            self.done = true;
            return Ok(None);
        };
        if self.end.is_some_and(|end| e.next_offset > end) {
            // Added (or renamed in) since the listing began.
            self.done = true;
            return Ok(None);
        }
        self.next = e.next_offset;
        Ok(Some(Listed {
            // The engine hands out the index + 1 (at least 3).
            position: e.next_offset - 1,
            ino: e.ino,
            kind: crate::attr::to_fuse_type(e.file_type),
            name: e.name,
        }))
    }
}

/// Lists directory `dir` from the kernel's `offset` (0 starts a listing),
/// handing each entry, with its offset and, if `plus`, its attributes, to
/// `add` until it says the reply is full. `started` runs when a new
/// listing begins (the directory's atime).
pub(crate) fn list<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    dir: u64,
    offset: u64,
    plus: bool,
    started: impl FnOnce() -> birch::Result<()>,
    mut add: impl FnMut(&Listed, u64, Option<&Attr>) -> bool,
) -> birch::Result<()> {
    let bounded_end = || -> birch::Result<Option<u64>> {
        Ok(Some(fs.dir_index_end(dir)?).filter(|&e| e <= ListingCookie::MAX))
    };
    let (position, end) = if offset == 0 {
        started()?;
        (0, bounded_end()?)
    } else if let Some((position, end)) = ListingCookie::decode_bounded(offset) {
        // Only offset 0 is at ".": anything above it is past ".".
        (position.max(1), Some(end))
    } else {
        match bounded_end()? {
            // Below every offset this directory hands out: between the
            // start and ".."'s offset.
            Some(end) => (1, Some(end)),
            None => (offset, None),
        }
    };
    let mut entries = Entries {
        fs,
        dir,
        next: position,
        end,
        batch: VecDeque::new(),
        done: false,
    };
    let mut current = entries.next()?;
    while let Some(entry) = current {
        let after = entries.next()?;
        // Offsets are positions of the next entry, so a seek between two
        // offsets lands on the later one's entry; past the last entry, any
        // position ends the listing.
        let offset = ListingCookie::encode(
            after.as_ref().map_or(entry.position + 1, |a| a.position),
            end,
        );
        let attr = if plus {
            match fs.getattr(entry.ino) {
                Ok(a) => Some(a),
                // The entry may vanish between listing and stat (a
                // concurrent unlink): skip it rather than fail the listing.
                Err(birch::Error::NotFound) if entry.position >= 2 => {
                    current = after;
                    continue;
                }
                Err(err) => return Err(err),
            }
        } else {
            None
        };
        if add(&entry, offset, attr.as_ref()) {
            return Ok(());
        }
        current = after;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ListingCookie;

    #[test]
    fn listing_cookies_carry_position_and_end() {
        for (position, end) in [
            (0, 2),
            (1, 2),
            (2, 2),
            (7, 9000),
            (ListingCookie::MAX, ListingCookie::MAX),
        ] {
            let offset = ListingCookie::encode(position, Some(end));
            // The kernel keeps offsets in a signed 64-bit file position.
            assert!(i64::try_from(offset).is_ok());
            assert_ne!(offset, 0, "0 starts a new listing");
            assert_eq!(ListingCookie::decode_bounded(offset), Some((position, end)));
        }
        // Unbounded listings (huge directories) use plain positions.
        let huge = 1 << 40;
        assert_eq!(ListingCookie::encode(huge, None), huge);
        assert_eq!(ListingCookie::decode_bounded(huge), None);
    }

    #[test]
    fn one_listings_offsets_order_as_their_positions() {
        let end = 9000;
        let mut last = 0;
        for position in [1, 2, 3, 17, 8999, 9000] {
            let offset = ListingCookie::encode(position, Some(end));
            assert!(
                offset > last,
                "offset of {position} not above the one before"
            );
            last = offset;
        }
    }
}
