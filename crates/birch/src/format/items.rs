//! Item payloads. Each type encodes to a byte vector stored as a leaf item's
//! data and decodes with full validation: a damaged item is an error that
//! says which field is wrong, never a panic.

use super::bytes::{put_i64, put_u16, put_u32, put_u64, Reader, ShortRead};
use super::compression::{Compression, MAX_COMPRESSED_RAM};
use super::{
    ItemType, CSUMS_PER_ITEM, CSUM_SIZE, MAX_INLINE_DATA, MAX_INLINE_RAM, NAME_MAX, SECTOR_SIZE,
};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemError(pub String);

impl fmt::Display for ItemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<ShortRead> for ItemError {
    fn from(e: ShortRead) -> Self {
        ItemError(e.to_string())
    }
}

fn finish(r: &Reader, what: &str) -> Result<(), ItemError> {
    if r.is_empty() {
        Ok(())
    } else {
        Err(ItemError(format!(
            "{what}: {} trailing bytes",
            r.remaining()
        )))
    }
}

fn read_name(r: &mut Reader, what: &str) -> Result<Vec<u8>, ItemError> {
    let len = r.u16()? as usize;
    if len == 0 || len > NAME_MAX {
        return Err(ItemError(format!(
            "{what}: name length {len} is not in 1..={NAME_MAX}"
        )));
    }
    Ok(r.take(len)?.to_vec())
}

/// Seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Timespec {
    pub fn now() -> Timespec {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_i64(out, self.sec);
        put_u32(out, self.nsec);
    }
    fn decode(r: &mut Reader) -> Result<Timespec, ItemError> {
        let sec = r.i64()?;
        let nsec = r.u32()?;
        if nsec >= 1_000_000_000 {
            return Err(ItemError(format!(
                "timestamp nanoseconds {nsec} out of range"
            )));
        }
        Ok(Timespec { sec, nsec })
    }
}

/// `(ino, INODE_ITEM, 0)`: an inode's attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InodeItem {
    /// Transaction that created the inode.
    pub generation: u64,
    /// Transaction that last changed the inode.
    pub transid: u64,
    pub size: u64,
    /// Bytes of data extents and inline data the file references.
    pub nbytes: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// File type and permission bits, as in `st_mode`.
    pub mode: u32,
    pub rdev: u64,
    pub flags: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub otime: Timespec,
}

impl InodeItem {
    pub const ENCODED_SIZE: usize = 8 * 4 + 4 * 4 + 8 * 2 + 12 * 4;

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::ENCODED_SIZE);
        put_u64(&mut out, self.generation);
        put_u64(&mut out, self.transid);
        put_u64(&mut out, self.size);
        put_u64(&mut out, self.nbytes);
        put_u32(&mut out, self.nlink);
        put_u32(&mut out, self.uid);
        put_u32(&mut out, self.gid);
        put_u32(&mut out, self.mode);
        put_u64(&mut out, self.rdev);
        put_u64(&mut out, self.flags);
        for t in [&self.atime, &self.mtime, &self.ctime, &self.otime] {
            t.encode(&mut out);
        }
        debug_assert_eq!(out.len(), Self::ENCODED_SIZE);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<InodeItem, ItemError> {
        let mut r = Reader::new(bytes);
        let item = InodeItem {
            generation: r.u64()?,
            transid: r.u64()?,
            size: r.u64()?,
            nbytes: r.u64()?,
            nlink: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            mode: r.u32()?,
            rdev: r.u64()?,
            flags: r.u64()?,
            atime: Timespec::decode(&mut r)?,
            mtime: Timespec::decode(&mut r)?,
            ctime: Timespec::decode(&mut r)?,
            otime: Timespec::decode(&mut r)?,
        };
        finish(&r, "inode item")?;
        if FileType::from_mode(item.mode).is_none() {
            return Err(ItemError(format!(
                "inode item: mode {:o} has no valid file type",
                item.mode
            )));
        }
        // Sizes are added to and rounded up by every reader.
        if item.size > super::MAX_FILE_SIZE || item.nbytes > super::MAX_FILE_SIZE {
            return Err(ItemError(format!(
                "inode item: size {} or nbytes {} is above the largest file size {}",
                item.size,
                item.nbytes,
                super::MAX_FILE_SIZE
            )));
        }
        Ok(item)
    }

    pub fn file_type(&self) -> FileType {
        FileType::from_mode(self.mode).expect("inode mode validated at creation and decode")
    }
}

/// File types as stored in dir entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileType {
    Regular = 1,
    Directory = 2,
    CharDevice = 3,
    BlockDevice = 4,
    Fifo = 5,
    Socket = 6,
    Symlink = 7,
}

impl FileType {
    pub fn from_code(code: u8) -> Option<FileType> {
        Some(match code {
            1 => FileType::Regular,
            2 => FileType::Directory,
            3 => FileType::CharDevice,
            4 => FileType::BlockDevice,
            5 => FileType::Fifo,
            6 => FileType::Socket,
            7 => FileType::Symlink,
            _ => return None,
        })
    }

    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileType::Regular,
            libc::S_IFDIR => FileType::Directory,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFSOCK => FileType::Socket,
            libc::S_IFLNK => FileType::Symlink,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits of this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => libc::S_IFREG,
            FileType::Directory => libc::S_IFDIR,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::BlockDevice => libc::S_IFBLK,
            FileType::Fifo => libc::S_IFIFO,
            FileType::Socket => libc::S_IFSOCK,
            FileType::Symlink => libc::S_IFLNK,
        }
    }
}

/// One name of an inode inside one parent directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeRefEntry {
    pub index: u64,
    pub name: Vec<u8>,
}

/// `(ino, INODE_REF, parent_ino)`: the names `ino` has in `parent_ino`
/// (several when hard links share a directory).
pub fn encode_inode_refs(entries: &[InodeRefEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        put_u64(&mut out, e.index);
        put_u16(&mut out, e.name.len() as u16);
        out.extend_from_slice(&e.name);
    }
    out
}

/// One name of an inode in an INODE_EXTREF item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeExtrefEntry {
    pub parent: u64,
    pub index: u64,
    pub name: Vec<u8>,
}

/// `(ino, INODE_EXTREF, extref_hash(parent, name))`: names of `ino` that
/// did not fit its INODE_REF item for `parent` (several when hashes
/// collide).
pub fn encode_inode_extrefs(entries: &[InodeExtrefEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        put_u64(&mut out, e.parent);
        put_u64(&mut out, e.index);
        put_u16(&mut out, e.name.len() as u16);
        out.extend_from_slice(&e.name);
    }
    out
}

pub fn decode_inode_extrefs(bytes: &[u8]) -> Result<Vec<InodeExtrefEntry>, ItemError> {
    let mut r = Reader::new(bytes);
    let mut out = Vec::new();
    while !r.is_empty() {
        let parent = r.u64()?;
        let index = r.u64()?;
        let name = read_name(&mut r, "inode extref")?;
        out.push(InodeExtrefEntry {
            parent,
            index,
            name,
        });
    }
    if out.is_empty() {
        return Err(ItemError("inode extref: no entries".into()));
    }
    Ok(out)
}

pub fn decode_inode_refs(bytes: &[u8]) -> Result<Vec<InodeRefEntry>, ItemError> {
    let mut r = Reader::new(bytes);
    let mut out = Vec::new();
    while !r.is_empty() {
        let index = r.u64()?;
        let name = read_name(&mut r, "inode ref")?;
        out.push(InodeRefEntry { index, name });
    }
    if out.is_empty() {
        return Err(ItemError("inode ref: no entries".into()));
    }
    Ok(out)
}

/// Bit 7 of a dir entry's type byte: the entry is a subvolume link
/// (docs/SNAPSHOTS.md (a)); the low bits must then say directory.
pub const SUBVOL_LINK: u8 = 0x80;

/// A directory entry: the payload of a DIR_INDEX item, and one element of a
/// DIR_ITEM item (which holds every name sharing one hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The inode named; for a subvolume link, the subvolume's id (the
    /// entry leads to inode 256 of that tree).
    pub ino: u64,
    pub file_type: FileType,
    pub name: Vec<u8>,
    /// A subvolume link (type byte `SUBVOL_LINK | 2`): it has no
    /// INODE_REF; the root tree's ROOT_REF / ROOT_BACKREF pair names it
    /// back.
    pub subvolume: bool,
}

impl DirEntry {
    fn encode_into(&self, out: &mut Vec<u8>) {
        put_u64(out, self.ino);
        let link = if self.subvolume { SUBVOL_LINK } else { 0 };
        out.push(self.file_type as u8 | link);
        put_u16(out, self.name.len() as u16);
        out.extend_from_slice(&self.name);
    }
    fn decode_from(r: &mut Reader) -> Result<DirEntry, ItemError> {
        let ino = r.u64()?;
        let code = r.u8()?;
        let subvolume = code & SUBVOL_LINK != 0;
        let file_type = FileType::from_code(code & !SUBVOL_LINK)
            .ok_or_else(|| ItemError(format!("dir entry: bad file type {code}")))?;
        if subvolume && file_type != FileType::Directory {
            return Err(ItemError(format!(
                "dir entry: type byte {code:#04x} marks a subvolume link but its low bits are not a directory (2)"
            )));
        }
        let name = read_name(r, "dir entry")?;
        Ok(DirEntry {
            ino,
            file_type,
            name,
            subvolume,
        })
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }
    pub fn decode(bytes: &[u8]) -> Result<DirEntry, ItemError> {
        let mut r = Reader::new(bytes);
        let e = Self::decode_from(&mut r)?;
        finish(&r, "dir index")?;
        Ok(e)
    }
}

/// `(dir, DIR_ITEM, name_hash)`: every entry of `dir` whose name has that hash.
pub fn encode_dir_items(entries: &[DirEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        e.encode_into(&mut out);
    }
    out
}

pub fn decode_dir_items(bytes: &[u8]) -> Result<Vec<DirEntry>, ItemError> {
    let mut r = Reader::new(bytes);
    let mut out = Vec::new();
    while !r.is_empty() {
        out.push(DirEntry::decode_from(&mut r)?);
    }
    if out.is_empty() {
        return Err(ItemError("dir item: no entries".into()));
    }
    Ok(out)
}

/// One extended attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xattr {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

/// `(ino, XATTR_ITEM, name_hash)`: every xattr of `ino` whose name has that hash.
pub fn encode_xattrs(entries: &[Xattr]) -> Vec<u8> {
    let mut out = Vec::new();
    for x in entries {
        put_u16(&mut out, x.name.len() as u16);
        put_u32(&mut out, x.value.len() as u32);
        out.extend_from_slice(&x.name);
        out.extend_from_slice(&x.value);
    }
    out
}

pub fn decode_xattrs(bytes: &[u8]) -> Result<Vec<Xattr>, ItemError> {
    let mut r = Reader::new(bytes);
    let mut out = Vec::new();
    while !r.is_empty() {
        let name_len = r.u16()? as usize;
        let value_len = r.u32()? as usize;
        if name_len == 0 || name_len > NAME_MAX {
            return Err(ItemError(format!(
                "xattr: name length {name_len} is not in 1..={NAME_MAX}"
            )));
        }
        let name = r.take(name_len)?.to_vec();
        let value = r.take(value_len)?.to_vec();
        out.push(Xattr { name, value });
    }
    if out.is_empty() {
        return Err(ItemError("xattr item: no entries".into()));
    }
    Ok(out)
}

/// `(ino, EXTENT_DATA, file_offset)`: what backs a range of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileExtent {
    /// Data kept in the item itself; only at file offset 0.
    Inline { data: Vec<u8> },
    /// Inline data kept compressed: `compressed` (at most
    /// `MAX_INLINE_DATA` bytes, fewer than `ram_bytes`) decompresses with
    /// `compression` to the file's first `ram_bytes` bytes (at most
    /// `MAX_INLINE_RAM`); only at file offset 0 (docs/COMPRESSION.md,
    /// "Compressed inline extents").
    InlineCompressed {
        compressed: Vec<u8>,
        ram_bytes: u64,
        compression: Compression,
    },
    /// `num_bytes` of the file, taken from the disk extent
    /// `[disk_bytenr, disk_bytenr + disk_num_bytes)` starting `offset` bytes in.
    /// Several items may share one disk extent (after a split); the extent
    /// item counts them.
    Regular {
        disk_bytenr: u64,
        disk_num_bytes: u64,
        offset: u64,
        num_bytes: u64,
    },
    /// Like `Regular`, but the space was reserved by fallocate and never
    /// written: it reads as zeros.
    Prealloc {
        disk_bytenr: u64,
        disk_num_bytes: u64,
        offset: u64,
        num_bytes: u64,
    },
    /// Like `Regular`, but the disk extent holds `compressed_len` bytes of
    /// `compression` data (zero padded to `disk_num_bytes`) that
    /// decompress to `ram_bytes`; `offset` and `num_bytes` are a range of
    /// the decompressed bytes (docs/COMPRESSION.md).
    Compressed {
        disk_bytenr: u64,
        disk_num_bytes: u64,
        offset: u64,
        num_bytes: u64,
        ram_bytes: u64,
        compressed_len: u64,
        compression: Compression,
    },
}

const EXTENT_INLINE: u8 = 0;
const EXTENT_REGULAR: u8 = 1;
const EXTENT_PREALLOC: u8 = 2;
const EXTENT_COMPRESSED: u8 = 3;
const EXTENT_INLINE_COMPRESSED: u8 = 4;

/// What a compressed extent records beyond its [`DiskRef`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressedRef {
    pub compression: Compression,
    /// The compressed bytes at the start of the disk extent.
    pub compressed_len: u64,
    /// What they decompress to.
    pub ram_bytes: u64,
}

/// Where a non-inline file extent points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskRef {
    pub disk_bytenr: u64,
    pub disk_num_bytes: u64,
    pub offset: u64,
    pub num_bytes: u64,
}

impl FileExtent {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            FileExtent::Inline { data } => {
                out.push(EXTENT_INLINE);
                out.extend_from_slice(data);
            }
            FileExtent::InlineCompressed {
                compressed,
                ram_bytes,
                compression,
            } => {
                out.push(EXTENT_INLINE_COMPRESSED);
                put_u64(&mut out, *ram_bytes);
                out.push(compression.to_byte());
                out.extend_from_slice(compressed);
            }
            FileExtent::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
            }
            | FileExtent::Prealloc {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
            } => {
                out.push(if matches!(self, FileExtent::Regular { .. }) {
                    EXTENT_REGULAR
                } else {
                    EXTENT_PREALLOC
                });
                put_u64(&mut out, *disk_bytenr);
                put_u64(&mut out, *disk_num_bytes);
                put_u64(&mut out, *offset);
                put_u64(&mut out, *num_bytes);
            }
            FileExtent::Compressed {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
                ram_bytes,
                compressed_len,
                compression,
            } => {
                out.push(EXTENT_COMPRESSED);
                put_u64(&mut out, *disk_bytenr);
                put_u64(&mut out, *disk_num_bytes);
                put_u64(&mut out, *offset);
                put_u64(&mut out, *num_bytes);
                put_u64(&mut out, *ram_bytes);
                put_u64(&mut out, *compressed_len);
                out.push(compression.to_byte());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<FileExtent, ItemError> {
        let mut r = Reader::new(bytes);
        let kind = r.u8()?;
        if kind == EXTENT_INLINE {
            let data = r.take(r.remaining())?.to_vec();
            if data.is_empty() {
                return Err(ItemError("inline extent: no data".into()));
            }
            return Ok(FileExtent::Inline { data });
        }
        if kind == EXTENT_INLINE_COMPRESSED {
            return decode_inline_compressed(&mut r);
        }
        let disk = DiskRef {
            disk_bytenr: r.u64()?,
            disk_num_bytes: r.u64()?,
            offset: r.u64()?,
            num_bytes: r.u64()?,
        };
        let compressed = if kind == EXTENT_COMPRESSED {
            let ram_bytes = r.u64()?;
            let compressed_len = r.u64()?;
            let algorithm = r.u8()?;
            let compression = Compression::from_byte(algorithm).ok_or_else(|| {
                ItemError(format!(
                    "compressed file extent at disk bytenr {}: unknown algorithm {algorithm}",
                    disk.disk_bytenr
                ))
            })?;
            Some(CompressedRef {
                compression,
                compressed_len,
                ram_bytes,
            })
        } else {
            None
        };
        finish(&r, "file extent")?;
        // The range is one of the decompressed bytes for a compressed
        // extent, of the disk extent's otherwise.
        let range_limit = compressed.map_or(disk.disk_num_bytes, |c| c.ram_bytes);
        let aligned = |v: u64| v.is_multiple_of(SECTOR_SIZE);
        if disk.num_bytes == 0
            || !aligned(disk.disk_bytenr)
            || !aligned(disk.disk_num_bytes)
            || !aligned(disk.offset)
            || !aligned(disk.num_bytes)
            || disk
                .offset
                .checked_add(disk.num_bytes)
                .is_none_or(|end| end > range_limit)
            || disk.disk_bytenr.checked_add(disk.disk_num_bytes).is_none()
        {
            return Err(ItemError(format!(
                "file extent: range offset {} + {} does not fit its extent ({} bytes; disk extent {}+{}), the disk extent ends past the address space, or it is not sector aligned",
                disk.offset, disk.num_bytes, range_limit, disk.disk_bytenr, disk.disk_num_bytes
            )));
        }
        match (kind, compressed) {
            (EXTENT_REGULAR, None) => Ok(FileExtent::regular(disk)),
            (EXTENT_PREALLOC, None) => Ok(FileExtent::prealloc(disk)),
            (EXTENT_COMPRESSED, Some(c)) => {
                validate_compressed(&disk, &c)?;
                Ok(FileExtent::compressed(disk, c))
            }
            _ => Err(ItemError(format!("file extent: unknown type {kind}"))),
        }
    }

    /// [`decode`](Self::decode) of the item at `key`, which must also lie
    /// where the format allows (inline at file offset 0, others on a block:
    /// readers index blocks by file offset) and end within the last block
    /// of the largest file (`key.offset + len <= MAX_FILE_EXTENT_END`:
    /// every reader adds the two).
    pub fn decode_at(key: &super::Key, bytes: &[u8]) -> Result<FileExtent, ItemError> {
        let extent = FileExtent::decode(bytes)?;
        let placed = match extent.is_inline() {
            true => key.offset == 0,
            false => key.offset.is_multiple_of(SECTOR_SIZE),
        };
        if !placed {
            return Err(ItemError(format!(
                "file extent at file offset {}: inline extents lie at 0, others on a block",
                key.offset
            )));
        }
        if key
            .offset
            .checked_add(extent.len())
            .is_none_or(|end| end > super::MAX_FILE_EXTENT_END)
        {
            return Err(ItemError(format!(
                "file extent at file offset {} of {} bytes ends past the largest file's last block (at {})",
                key.offset,
                extent.len(),
                super::MAX_FILE_EXTENT_END
            )));
        }
        Ok(extent)
    }

    pub fn regular(d: DiskRef) -> FileExtent {
        FileExtent::Regular {
            disk_bytenr: d.disk_bytenr,
            disk_num_bytes: d.disk_num_bytes,
            offset: d.offset,
            num_bytes: d.num_bytes,
        }
    }

    pub fn prealloc(d: DiskRef) -> FileExtent {
        FileExtent::Prealloc {
            disk_bytenr: d.disk_bytenr,
            disk_num_bytes: d.disk_num_bytes,
            offset: d.offset,
            num_bytes: d.num_bytes,
        }
    }

    pub fn compressed(d: DiskRef, c: CompressedRef) -> FileExtent {
        FileExtent::Compressed {
            disk_bytenr: d.disk_bytenr,
            disk_num_bytes: d.disk_num_bytes,
            offset: d.offset,
            num_bytes: d.num_bytes,
            ram_bytes: c.ram_bytes,
            compressed_len: c.compressed_len,
            compression: c.compression,
        }
    }

    /// The compression of a compressed extent.
    pub fn compressed_ref(&self) -> Option<CompressedRef> {
        match *self {
            FileExtent::Compressed {
                ram_bytes,
                compressed_len,
                compression,
                ..
            } => Some(CompressedRef {
                compression,
                compressed_len,
                ram_bytes,
            }),
            _ => None,
        }
    }

    /// The same kind of extent (regular, preallocated or compressed, with
    /// its compression) over another range `d` of the same disk extent:
    /// the pieces a split, punch, truncate or reflink leaves.
    pub fn with_disk(&self, d: DiskRef) -> FileExtent {
        match self {
            FileExtent::Prealloc { .. } => FileExtent::prealloc(d),
            FileExtent::Compressed { .. } => {
                FileExtent::compressed(d, self.compressed_ref().expect("compressed"))
            }
            // An inline extent has no disk range; a caller that has one
            // made it regular.
            FileExtent::Regular { .. }
            | FileExtent::Inline { .. }
            | FileExtent::InlineCompressed { .. } => FileExtent::regular(d),
        }
    }

    /// Whether the data is in the item (plain or compressed): the file's
    /// only extent, at offset 0, of at most a page.
    pub fn is_inline(&self) -> bool {
        matches!(
            self,
            FileExtent::Inline { .. } | FileExtent::InlineCompressed { .. }
        )
    }

    /// What the item adds to its inode's `nbytes` (what `stat` reports as
    /// blocks): its length, but for a compressed extent its share of the
    /// disk extent, `num_bytes / ram_bytes` of it rounded up to a sector
    /// (the whole extent: `disk_num_bytes`), so that `du` shows what
    /// compression saved (docs/COMPRESSION.md).
    pub fn nbytes(&self) -> u64 {
        match *self {
            FileExtent::Compressed {
                disk_num_bytes,
                num_bytes,
                ram_bytes,
                ..
            } => compressed_share(disk_num_bytes, num_bytes, ram_bytes),
            _ => self.len(),
        }
    }

    /// The disk extent behind this file extent, if any.
    pub fn disk_ref(&self) -> Option<DiskRef> {
        match *self {
            FileExtent::Inline { .. } | FileExtent::InlineCompressed { .. } => None,
            FileExtent::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
            }
            | FileExtent::Prealloc {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
            }
            | FileExtent::Compressed {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
                ..
            } => Some(DiskRef {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
            }),
        }
    }

    /// Bytes of the file this extent covers.
    pub fn len(&self) -> u64 {
        match self {
            FileExtent::Inline { data } => data.len() as u64,
            FileExtent::InlineCompressed { ram_bytes, .. } => *ram_bytes,
            FileExtent::Regular { num_bytes, .. }
            | FileExtent::Prealloc { num_bytes, .. }
            | FileExtent::Compressed { num_bytes, .. } => *num_bytes,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The rest of a compressed inline extent (type 4), after its type byte:
/// `ram_bytes u64 | algorithm u8 | compressed bytes`. A known algorithm,
/// `1..=MAX_INLINE_RAM` bytes of file data, and `1..=MAX_INLINE_DATA`
/// compressed bytes, fewer than the data (else it is stored plain).
fn decode_inline_compressed(r: &mut Reader) -> Result<FileExtent, ItemError> {
    let ram_bytes = r.u64()?;
    let algorithm = r.u8()?;
    let compression = Compression::from_byte(algorithm).ok_or_else(|| {
        ItemError(format!(
            "compressed inline extent: unknown algorithm {algorithm}"
        ))
    })?;
    let compressed = r.take(r.remaining())?.to_vec();
    let stored = compressed.len() as u64;
    if ram_bytes == 0
        || ram_bytes > MAX_INLINE_RAM
        || stored == 0
        || stored > MAX_INLINE_DATA as u64
        || stored >= ram_bytes
    {
        return Err(ItemError(format!(
            "compressed inline extent: {stored} bytes of {compression} decompressing to {ram_bytes} (at most {MAX_INLINE_DATA} bytes, fewer than the data, which is 1..={MAX_INLINE_RAM} bytes)"
        )));
    }
    Ok(FileExtent::InlineCompressed {
        compressed,
        ram_bytes,
        compression,
    })
}

/// A compressed extent's own rules (its range is checked by the caller):
/// a known algorithm (decoded already), at most [`MAX_COMPRESSED_RAM`]
/// sector-aligned bytes of file data, compressed bytes that fill the disk
/// extent but for its last sector's padding, and a disk extent at least a
/// sector smaller than the data (else it would be stored uncompressed).
fn validate_compressed(disk: &DiskRef, c: &CompressedRef) -> Result<(), ItemError> {
    let padded = c.compressed_len.checked_next_multiple_of(SECTOR_SIZE);
    let saves_a_sector = disk
        .disk_num_bytes
        .checked_add(SECTOR_SIZE)
        .is_some_and(|v| v <= c.ram_bytes);
    if c.ram_bytes == 0
        || c.ram_bytes > MAX_COMPRESSED_RAM
        || !c.ram_bytes.is_multiple_of(SECTOR_SIZE)
        || c.compressed_len == 0
        || padded != Some(disk.disk_num_bytes)
        || !saves_a_sector
    {
        return Err(ItemError(format!(
            "compressed file extent at disk bytenr {}: {} bytes of {} on a disk extent of {} decompressing to {} (at most {MAX_COMPRESSED_RAM}, sector aligned, the disk extent the compressed bytes rounded up to a sector and at least a sector smaller)",
            disk.disk_bytenr, c.compressed_len, c.compression, disk.disk_num_bytes, c.ram_bytes
        )));
    }
    Ok(())
}

/// A compressed item's share of its disk extent for `nbytes`
/// ([`FileExtent::nbytes`]); the arguments are a decoded item's, so the
/// product fits (both at most `MAX_COMPRESSED_RAM`).
pub fn compressed_share(disk_num_bytes: u64, num_bytes: u64, ram_bytes: u64) -> u64 {
    debug_assert!(ram_bytes > 0 && ram_bytes <= MAX_COMPRESSED_RAM);
    (disk_num_bytes * num_bytes)
        .div_ceil(ram_bytes)
        .next_multiple_of(SECTOR_SIZE)
}

/// `(tree_id, ROOT_ITEM, 0)` in the root tree: where a tree's root node is.
/// The short form (`ROOT_ITEM_SIZE` bytes); a subvolume's long form
/// ([`SubvolRootItem`]) starts with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RootItem {
    pub bytenr: u64,
    pub generation: u64,
    pub level: u8,
}

/// Bytes of the short root item.
pub const ROOT_ITEM_SIZE: usize = 17;

impl RootItem {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }
    fn encode_into(&self, out: &mut Vec<u8>) {
        put_u64(out, self.bytenr);
        put_u64(out, self.generation);
        out.push(self.level);
    }
    fn decode_from(r: &mut Reader) -> Result<RootItem, ItemError> {
        Ok(RootItem {
            bytenr: r.u64()?,
            generation: r.u64()?,
            level: r.u8()?,
        })
    }
    /// The short form only: code that keeps the item it read (the engine's
    /// trees, backup roots, log trees) must not read a long item as short
    /// and write it back so.
    pub fn decode(bytes: &[u8]) -> Result<RootItem, ItemError> {
        if bytes.len() == SUBVOL_ROOT_ITEM_SIZE {
            return Err(ItemError(format!(
                "root item of {SUBVOL_ROOT_ITEM_SIZE} bytes is a subvolume's long root item (INCOMPAT_SUBVOLUMES), not the short form of {ROOT_ITEM_SIZE}"
            )));
        }
        let mut r = Reader::new(bytes);
        let item = Self::decode_from(&mut r)?;
        finish(&r, "root item")?;
        Ok(item)
    }
    /// Where the root node is, from either form (validated whole): for
    /// tools that only follow the tree (dump, scrub, tree listings).
    pub fn decode_either(bytes: &[u8]) -> Result<RootItem, ItemError> {
        match bytes.len() {
            SUBVOL_ROOT_ITEM_SIZE => Ok(SubvolRootItem::decode(bytes)?.root),
            _ => RootItem::decode(bytes),
        }
    }
}

/// Bytes of the long root item of a subvolume ([`SubvolRootItem`]).
pub const SUBVOL_ROOT_ITEM_SIZE: usize = 192;
/// [`SubvolRootItem::flags`]: the subvolume refuses every change.
pub const SUBVOL_RDONLY: u64 = 1;

/// `(id, ROOT_ITEM, 0)` of a subvolume tree (5 and 256..) on an image
/// with `INCOMPAT_SUBVOLUMES`: the short item and what btrfs's
/// `btrfs_root_item` keeps for snapshots and send/receive. Layout in
/// docs/SNAPSHOTS.md (a) and docs/FORMAT.md; `SUBVOL_ROOT_ITEM_SIZE` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubvolRootItem {
    /// Bytes 0..17: the short item (root node, its generation, level).
    pub root: RootItem,
    /// 1: linked by a ROOT_REF (or tree 5); 0: dead, being dropped, or not
    /// yet linked.
    pub refs: u32,
    /// `SUBVOL_RDONLY` or 0.
    pub flags: u64,
    /// The last transaction in which this tree was the source or the
    /// result of a snapshot; 0 = never.
    pub last_snapshot: u64,
    /// A dead root's drop: keys up to here are released (all zero: the
    /// drop has not started).
    pub drop_progress: super::Key,
    pub uuid: [u8; 16],
    /// A snapshot: its source's uuid; else zero.
    pub parent_uuid: [u8; 16],
    /// Set by receive; else zero.
    pub received_uuid: [u8; 16],
    /// Last transaction that changed the tree.
    pub ctransid: u64,
    /// Transaction that created it.
    pub otransid: u64,
    /// Received: the sender's ctransid; else 0.
    pub stransid: u64,
    /// Received: the local transaction that received it; else 0.
    pub rtransid: u64,
    pub ctime: Timespec,
    pub otime: Timespec,
    pub stime: Timespec,
    pub rtime: Timespec,
}

impl SubvolRootItem {
    pub fn is_readonly(&self) -> bool {
        self.flags & SUBVOL_RDONLY != 0
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SUBVOL_ROOT_ITEM_SIZE);
        self.root.encode_into(&mut out);
        out.extend_from_slice(&[0; 3]);
        put_u32(&mut out, self.refs);
        put_u64(&mut out, self.flags);
        put_u64(&mut out, self.last_snapshot);
        self.drop_progress.encode(&mut out);
        out.extend_from_slice(&[0; 7]);
        for uuid in [&self.uuid, &self.parent_uuid, &self.received_uuid] {
            out.extend_from_slice(uuid);
        }
        for transid in [self.ctransid, self.otransid, self.stransid, self.rtransid] {
            put_u64(&mut out, transid);
        }
        for t in [&self.ctime, &self.otime, &self.stime, &self.rtime] {
            t.encode(&mut out);
        }
        debug_assert_eq!(out.len(), SUBVOL_ROOT_ITEM_SIZE);
        out
    }

    /// Decodes the long form: exactly `SUBVOL_ROOT_ITEM_SIZE` bytes,
    /// reserved bytes zero, refs 0 or 1, no flag but `SUBVOL_RDONLY`,
    /// valid timestamps. The rules between fields and against the
    /// superblock are `birch check`'s (S8).
    pub fn decode(bytes: &[u8]) -> Result<SubvolRootItem, ItemError> {
        if bytes.len() != SUBVOL_ROOT_ITEM_SIZE {
            return Err(ItemError(format!(
                "subvolume root item of {} bytes: the long form is {SUBVOL_ROOT_ITEM_SIZE}",
                bytes.len()
            )));
        }
        let mut r = Reader::new(bytes);
        let root = RootItem::decode_from(&mut r)?;
        reserved_zero(&mut r, 3, "bytes 17..20")?;
        let refs = r.u32()?;
        let flags = r.u64()?;
        let last_snapshot = r.u64()?;
        let drop_progress = super::Key::decode(&mut r)?;
        reserved_zero(&mut r, 7, "bytes 57..64")?;
        let mut uuid =
            || -> Result<[u8; 16], ItemError> { Ok(r.take(16)?.try_into().expect("16 bytes")) };
        let (uuid, parent_uuid, received_uuid) = (uuid()?, uuid()?, uuid()?);
        let item = SubvolRootItem {
            root,
            refs,
            flags,
            last_snapshot,
            drop_progress,
            uuid,
            parent_uuid,
            received_uuid,
            ctransid: r.u64()?,
            otransid: r.u64()?,
            stransid: r.u64()?,
            rtransid: r.u64()?,
            ctime: Timespec::decode(&mut r)?,
            otime: Timespec::decode(&mut r)?,
            stime: Timespec::decode(&mut r)?,
            rtime: Timespec::decode(&mut r)?,
        };
        finish(&r, "subvolume root item")?;
        if item.refs > 1 {
            return Err(ItemError(format!(
                "subvolume root item: refs {} (a subvolume has one link or none)",
                item.refs
            )));
        }
        if item.flags & !SUBVOL_RDONLY != 0 {
            return Err(ItemError(format!(
                "subvolume root item: unknown flags {:#x} (only SUBVOL_RDONLY = {SUBVOL_RDONLY})",
                item.flags & !SUBVOL_RDONLY
            )));
        }
        Ok(item)
    }
}

/// Reads `n` reserved bytes, which must be zero.
fn reserved_zero(r: &mut Reader, n: usize, which: &str) -> Result<(), ItemError> {
    let bytes = r.take(n)?;
    if bytes.iter().any(|&b| b != 0) {
        return Err(ItemError(format!(
            "subvolume root item: reserved {which} are not zero"
        )));
    }
    Ok(())
}

/// The payload of `(parent, ROOT_REF, child)` and `(child, ROOT_BACKREF,
/// parent)`: where subvolume `child` is linked in `parent`'s tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootRef {
    /// The directory of `parent`'s tree holding the link.
    pub dirid: u64,
    /// The link's DIR_INDEX index.
    pub index: u64,
    /// The link's name.
    pub name: Vec<u8>,
}

impl RootRef {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(18 + self.name.len());
        put_u64(&mut out, self.dirid);
        put_u64(&mut out, self.index);
        put_u16(&mut out, self.name.len() as u16);
        out.extend_from_slice(&self.name);
        out
    }
    pub fn decode(bytes: &[u8]) -> Result<RootRef, ItemError> {
        let mut r = Reader::new(bytes);
        let dirid = r.u64()?;
        let index = r.u64()?;
        let name = read_name(&mut r, "root ref")?;
        finish(&r, "root ref")?;
        Ok(RootRef { dirid, index, name })
    }
}

/// Extent tree item: `(bytenr, EXTENT_ITEM, num_bytes)` for a data extent,
/// `(bytenr, METADATA_ITEM, level)` for a tree node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentItem {
    /// Data: how many file extent items point into this extent.
    /// Metadata: always 1 (birch has no shared tree blocks).
    pub refs: u64,
    pub generation: u64,
    /// Data: the inode whose file extents reference it. Metadata: the tree id.
    pub owner: u64,
}

impl ExtentItem {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_u64(&mut out, self.refs);
        put_u64(&mut out, self.generation);
        put_u64(&mut out, self.owner);
        out
    }
    pub fn decode(bytes: &[u8]) -> Result<ExtentItem, ItemError> {
        let mut r = Reader::new(bytes);
        let item = ExtentItem {
            refs: r.u64()?,
            generation: r.u64()?,
            owner: r.u64()?,
        };
        finish(&r, "extent item")?;
        if item.refs == 0 {
            return Err(ItemError("extent item: zero references".into()));
        }
        Ok(item)
    }
}

/// A leaf item's payload, decoded by its key's type: the one place that
/// knows which decoder (and so which validation) each type gets. Printers
/// and checks match on this without a default arm, so a new type does not
/// compile until each says what to do with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Inode(InodeItem),
    InodeRefs(Vec<InodeRefEntry>),
    InodeExtrefs(Vec<InodeExtrefEntry>),
    Xattrs(Vec<Xattr>),
    /// The key names the orphan inode; the payload is not read.
    Orphan,
    /// The key names the removed entry; the payload is not read.
    DirLogIndex,
    /// A marker: the payload is not read.
    LogFullExtents,
    /// A marker: the payload is not read.
    LogUnlinked,
    DirItems(Vec<DirEntry>),
    DirIndex(DirEntry),
    FileExtent(FileExtent),
    /// One crc32c per 4 KiB block from the key offset on.
    Csums(Vec<u32>),
    /// A short root item.
    Root(RootItem),
    /// A subvolume's long root item (chosen by length).
    SubvolRoot(SubvolRootItem),
    /// `(child, ROOT_BACKREF, parent)`.
    RootBackref(RootRef),
    /// `(parent, ROOT_REF, child)`.
    RootRef(RootRef),
    DataExtent(ExtentItem),
    MetadataExtent(ExtentItem),
}

/// The checksums of a checksum item's payload, validating its shape.
pub fn decode_csums(bytes: &[u8]) -> Result<Vec<u32>, ItemError> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(CSUM_SIZE) {
        return Err(ItemError(format!(
            "checksum item of {} bytes: must be a nonzero multiple of {CSUM_SIZE}",
            bytes.len()
        )));
    }
    if bytes.len() as u64 / CSUM_SIZE as u64 > CSUMS_PER_ITEM {
        return Err(ItemError(format!(
            "checksum item of {} checksums: at most {CSUMS_PER_ITEM}",
            bytes.len() / CSUM_SIZE
        )));
    }
    Ok(bytes
        .chunks_exact(CSUM_SIZE)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect())
}

/// [`decode_csums`] of the item at `key`, which must also start on a
/// block (readers index blocks by `(bytenr - start) / 4096`) and end below
/// 2^64 (`key.offset + n × 4096`: every reader adds the two).
pub fn decode_csums_at(key: &super::Key, bytes: &[u8]) -> Result<Vec<u32>, ItemError> {
    let sums = decode_csums(bytes)?;
    let span = sums.len() as u64 * SECTOR_SIZE;
    if !key.offset.is_multiple_of(SECTOR_SIZE) || key.offset.checked_add(span).is_none() {
        return Err(ItemError(format!(
            "checksum item at {} covering {span} bytes is not block aligned or ends past 2^64",
            key.offset
        )));
    }
    Ok(sums)
}

impl Item {
    /// Decodes and validates the payload of an item of type `item_type`.
    pub fn decode(item_type: ItemType, data: &[u8]) -> Result<Item, ItemError> {
        Ok(match item_type {
            ItemType::InodeItem => Item::Inode(InodeItem::decode(data)?),
            ItemType::InodeRef => Item::InodeRefs(decode_inode_refs(data)?),
            ItemType::InodeExtref => Item::InodeExtrefs(decode_inode_extrefs(data)?),
            ItemType::XattrItem => Item::Xattrs(decode_xattrs(data)?),
            ItemType::OrphanItem => Item::Orphan,
            ItemType::DirLogIndex => Item::DirLogIndex,
            ItemType::LogFullExtents => Item::LogFullExtents,
            ItemType::LogUnlinked => Item::LogUnlinked,
            ItemType::DirItem => Item::DirItems(decode_dir_items(data)?),
            ItemType::DirIndex => Item::DirIndex(DirEntry::decode(data)?),
            ItemType::ExtentData => Item::FileExtent(FileExtent::decode(data)?),
            ItemType::ExtentCsum => Item::Csums(decode_csums(data)?),
            ItemType::RootItem => match data.len() {
                ROOT_ITEM_SIZE => Item::Root(RootItem::decode(data)?),
                SUBVOL_ROOT_ITEM_SIZE => Item::SubvolRoot(SubvolRootItem::decode(data)?),
                n => {
                    return Err(ItemError(format!(
                        "root item of {n} bytes: neither the short form ({ROOT_ITEM_SIZE}) nor a subvolume's long form ({SUBVOL_ROOT_ITEM_SIZE})"
                    )))
                }
            },
            ItemType::RootBackref => Item::RootBackref(RootRef::decode(data)?),
            ItemType::RootRef => Item::RootRef(RootRef::decode(data)?),
            ItemType::ExtentItem => Item::DataExtent(ExtentItem::decode(data)?),
            ItemType::MetadataItem => Item::MetadataExtent(ExtentItem::decode(data)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{block_csum, csum_item_span, encode_csums};

    #[test]
    fn csum_items_round_trip_and_reject_bad_shapes() {
        let data: Vec<u8> = (0..3 * SECTOR_SIZE).map(|i| (i % 251) as u8).collect();
        let payload = encode_csums(&data);
        assert_eq!(payload.len(), 3 * CSUM_SIZE);
        let sums = decode_csums(&payload).unwrap();
        assert_eq!(sums[1], block_csum(&data[4096..8192]));
        assert_eq!(csum_item_span(payload.len()), 3 * SECTOR_SIZE);
        assert!(decode_csums(&[]).is_err());
        assert!(decode_csums(&payload[..5]).is_err());
        assert!(decode_csums(&vec![0; (CSUMS_PER_ITEM as usize + 1) * CSUM_SIZE]).is_err());
    }

    #[test]
    fn items_round_trip() {
        let inode = InodeItem {
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            size: 5,
            atime: Timespec { sec: -3, nsec: 7 },
            ..Default::default()
        };
        assert_eq!(InodeItem::decode(&inode.encode()).unwrap(), inode);
        let refs = vec![
            InodeRefEntry {
                index: 2,
                name: b"a".to_vec(),
            },
            InodeRefEntry {
                index: 9,
                name: b"bb".to_vec(),
            },
        ];
        assert_eq!(decode_inode_refs(&encode_inode_refs(&refs)).unwrap(), refs);
        let dirs = vec![
            DirEntry {
                ino: 300,
                file_type: FileType::Symlink,
                name: b"x".to_vec(),
                subvolume: false,
            },
            DirEntry {
                ino: 257,
                file_type: FileType::Directory,
                name: b"snap".to_vec(),
                subvolume: true,
            },
        ];
        assert_eq!(decode_dir_items(&encode_dir_items(&dirs)).unwrap(), dirs);
        let x = vec![Xattr {
            name: b"user.a".to_vec(),
            value: vec![],
        }];
        assert_eq!(decode_xattrs(&encode_xattrs(&x)).unwrap(), x);
        let e = FileExtent::Regular {
            disk_bytenr: 1 << 20,
            disk_num_bytes: 8192,
            offset: 4096,
            num_bytes: 4096,
        };
        assert_eq!(FileExtent::decode(&e.encode()).unwrap(), e);
        let i = FileExtent::Inline {
            data: b"hi".to_vec(),
        };
        assert_eq!(FileExtent::decode(&i.encode()).unwrap(), i);
    }

    #[test]
    fn compressed_inline_extents_round_trip_and_refuse_damaged_fields() {
        let ci = FileExtent::InlineCompressed {
            compressed: vec![7; 100],
            ram_bytes: 3000,
            compression: Compression::Zstd,
        };
        let bytes = ci.encode();
        assert_eq!(bytes.len(), 1 + 8 + 1 + 100);
        assert_eq!(bytes[0], EXTENT_INLINE_COMPRESSED);
        assert_eq!(FileExtent::decode(&bytes).unwrap(), ci);
        assert!(ci.is_inline() && ci.disk_ref().is_none());
        assert_eq!((ci.len(), ci.nbytes()), (3000, 3000));
        let at =
            |offset| crate::format::Key::new(257, crate::format::item_type::EXTENT_DATA, offset);
        assert!(FileExtent::decode_at(&at(0), &bytes).is_ok());
        assert!(FileExtent::decode_at(&at(4096), &bytes).is_err());
        let with = |ram: u64, algorithm: u8, stored: usize| {
            let mut b = vec![EXTENT_INLINE_COMPRESSED];
            b.extend_from_slice(&ram.to_le_bytes());
            b.push(algorithm);
            b.extend(vec![1u8; stored]);
            FileExtent::decode(&b)
        };
        assert!(with(4096, 2, MAX_INLINE_DATA).is_ok());
        for (ram, algorithm, stored) in [
            (3000, 0, 100),                 // unknown algorithm
            (3000, 9, 100),                 // unknown algorithm
            (0, 1, 100),                    // no data
            (4097, 1, 100),                 // more than a sector
            (u64::MAX, 1, 100),             // absurd length
            (3000, 1, 0),                   // no compressed bytes
            (100, 1, 100),                  // not smaller than the data
            (4096, 1, MAX_INLINE_DATA + 1), // over the inline limit
        ] {
            assert!(
                with(ram, algorithm, stored).is_err(),
                "{ram} {algorithm} {stored}"
            );
        }
        assert!(FileExtent::decode(&bytes[..5]).is_err());
    }

    #[test]
    fn damaged_items_are_errors() {
        assert!(InodeItem::decode(&[0; 3]).is_err());
        let mut bad_mode = InodeItem::default().encode();
        bad_mode[44..48].copy_from_slice(&0u32.to_le_bytes());
        assert!(InodeItem::decode(&bad_mode).is_err());
        assert!(decode_inode_refs(&[]).is_err());
        assert!(decode_inode_extrefs(&[]).is_err());
        let extrefs = vec![
            InodeExtrefEntry {
                parent: 300,
                index: 4,
                name: b"x".to_vec(),
            },
            InodeExtrefEntry {
                parent: 301,
                index: 70,
                name: b"yz".to_vec(),
            },
        ];
        assert_eq!(
            decode_inode_extrefs(&encode_inode_extrefs(&extrefs)).unwrap(),
            extrefs
        );
        let e = FileExtent::Regular {
            disk_bytenr: 4096,
            disk_num_bytes: 4096,
            offset: 4096,
            num_bytes: 4096,
        };
        assert!(FileExtent::decode(&e.encode()).is_err());
        // A hostile disk extent ending past u64::MAX: refused at decode,
        // before any range arithmetic on it.
        let past_the_end = FileExtent::Regular {
            disk_bytenr: u64::MAX - 4095,
            disk_num_bytes: 8192,
            offset: 0,
            num_bytes: 4096,
        };
        assert!(FileExtent::decode(&past_the_end.encode()).is_err());
    }

    #[test]
    fn compressed_extent_round_trips_and_refuses_bad_lengths() {
        let good = FileExtent::Compressed {
            disk_bytenr: 1 << 20,
            disk_num_bytes: 8192,
            offset: 4096,
            num_bytes: 64 << 10,
            ram_bytes: 128 << 10,
            compressed_len: 5000,
            compression: Compression::Zstd,
        };
        assert_eq!(good.encode().len(), 50);
        assert_eq!(FileExtent::decode(&good.encode()).unwrap(), good);
        // Half the data: half the disk extent, rounded up to a sector.
        assert_eq!(good.nbytes(), 4096);
        let bad = |f: &dyn Fn(&mut FileExtent)| {
            let mut e = good.clone();
            f(&mut e);
            FileExtent::decode(&e.encode()).unwrap_err().to_string()
        };
        let set = |e: &mut FileExtent, field: &str, v: u64| {
            let FileExtent::Compressed {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
                ram_bytes,
                compressed_len,
                ..
            } = e
            else {
                unreachable!()
            };
            *match field {
                "disk_bytenr" => disk_bytenr,
                "disk_num_bytes" => disk_num_bytes,
                "offset" => offset,
                "num_bytes" => num_bytes,
                "ram_bytes" => ram_bytes,
                _ => compressed_len,
            } = v;
        };
        for (field, v) in [
            ("ram_bytes", 0),
            ("ram_bytes", 256 << 10),
            ("ram_bytes", u64::MAX - 4095),
            ("compressed_len", 0),
            ("compressed_len", 4096),
            ("compressed_len", 8193),
            ("compressed_len", u64::MAX),
            ("disk_num_bytes", 128 << 10),
            ("disk_num_bytes", u64::MAX - 4095),
            ("offset", u64::MAX - 4095),
            ("num_bytes", 128 << 10),
            ("disk_bytenr", u64::MAX - 4095),
        ] {
            let why = bad(&|e| set(e, field, v));
            assert!(why.contains("extent"), "{field} = {v}: {why}");
        }
        let mut unknown = good.encode();
        *unknown.last_mut().unwrap() = 9;
        assert!(FileExtent::decode(&unknown)
            .unwrap_err()
            .to_string()
            .contains("unknown algorithm 9"));
        // A regular item's length with the compressed type: too short.
        let mut short = FileExtent::regular(good.disk_ref().unwrap()).encode();
        short[0] = EXTENT_COMPRESSED;
        assert!(FileExtent::decode(&short).is_err());
        // Pieces keep the compression.
        let piece = good.with_disk(DiskRef {
            offset: 0,
            num_bytes: 4096,
            ..good.disk_ref().unwrap()
        });
        assert_eq!(piece.compressed_ref(), good.compressed_ref());
        assert_eq!(piece.nbytes(), 4096);
    }

    #[test]
    fn item_decodes_by_type() {
        let dir = DirEntry {
            ino: 257,
            file_type: FileType::Regular,
            name: b"a".to_vec(),
            subvolume: false,
        };
        assert_eq!(
            Item::decode(ItemType::DirIndex, &dir.encode()),
            Ok(Item::DirIndex(dir.clone()))
        );
        assert_eq!(
            Item::decode(ItemType::DirItem, &dir.encode()),
            Ok(Item::DirItems(vec![dir.clone()]))
        );
        // The same bytes are not an inode item.
        assert!(Item::decode(ItemType::InodeItem, &dir.encode()).is_err());
        assert_eq!(
            Item::decode(ItemType::LogUnlinked, &[]),
            Ok(Item::LogUnlinked)
        );
    }

    fn sample_subvol_root() -> SubvolRootItem {
        SubvolRootItem {
            root: RootItem {
                bytenr: 1 << 20,
                generation: 9,
                level: 2,
            },
            refs: 1,
            flags: SUBVOL_RDONLY,
            last_snapshot: 8,
            drop_progress: crate::format::Key::new(300, 1, 0),
            uuid: [1; 16],
            parent_uuid: [2; 16],
            received_uuid: [3; 16],
            ctransid: 9,
            otransid: 4,
            stransid: 77,
            rtransid: 6,
            ctime: Timespec { sec: 10, nsec: 1 },
            otime: Timespec { sec: -20, nsec: 2 },
            stime: Timespec { sec: 30, nsec: 3 },
            rtime: Timespec {
                sec: 40,
                nsec: 999_999_999,
            },
        }
    }

    #[test]
    fn subvolume_items_round_trip() {
        let r = sample_subvol_root();
        let bytes = r.encode();
        assert_eq!(bytes.len(), SUBVOL_ROOT_ITEM_SIZE);
        // The layout of docs/SNAPSHOTS.md (a): the short item first.
        assert_eq!(&bytes[..ROOT_ITEM_SIZE], &r.root.encode()[..]);
        assert_eq!(&bytes[20..24], &1u32.to_le_bytes());
        assert_eq!(&bytes[64..80], &[1; 16]);
        assert_eq!(&bytes[128..136], &77u64.to_le_bytes());
        assert_eq!(&bytes[180..188], &40i64.to_le_bytes());
        assert_eq!(SubvolRootItem::decode(&bytes), Ok(r));
        assert!(r.is_readonly());
        assert_eq!(
            Item::decode(ItemType::RootItem, &bytes),
            Ok(Item::SubvolRoot(r))
        );
        assert_eq!(RootItem::decode_either(&bytes), Ok(r.root));
        assert_eq!(RootItem::decode_either(&r.root.encode()), Ok(r.root));
        assert_eq!(
            Item::decode(ItemType::RootItem, &r.root.encode()),
            Ok(Item::Root(r.root))
        );
        let rr = RootRef {
            dirid: 256,
            index: 7,
            name: b"snap".to_vec(),
        };
        assert_eq!(RootRef::decode(&rr.encode()), Ok(rr.clone()));
        assert_eq!(
            Item::decode(ItemType::RootRef, &rr.encode()),
            Ok(Item::RootRef(rr.clone()))
        );
        assert_eq!(
            Item::decode(ItemType::RootBackref, &rr.encode()),
            Ok(Item::RootBackref(rr))
        );
        let link = DirEntry {
            ino: 256,
            file_type: FileType::Directory,
            name: b"sv".to_vec(),
            subvolume: true,
        };
        assert_eq!(link.encode()[8], SUBVOL_LINK | 2);
        assert_eq!(DirEntry::decode(&link.encode()), Ok(link));
    }

    /// Hostile bytes: each damaged field is an error naming it.
    #[test]
    fn damaged_subvolume_items_are_errors_naming_the_field() {
        let good = sample_subvol_root().encode();
        let damaged = |at: usize, v: u8| {
            let mut b = good.clone();
            b[at] = v;
            SubvolRootItem::decode(&b).unwrap_err().0
        };
        assert!(damaged(18, 1).contains("reserved bytes 17..20"));
        assert!(damaged(60, 1).contains("reserved bytes 57..64"));
        assert!(damaged(20, 2).contains("refs 2"));
        assert!(damaged(24, 3).contains("unknown flags 0x2"));
        // rtime's nanoseconds (offset 188) out of range.
        assert!(damaged(191, 0xff).contains("nanoseconds"));
        for len in [0, 16, 18, 191, 193] {
            let e = Item::decode(ItemType::RootItem, &vec![0; len]).unwrap_err();
            assert!(e.0.contains("root item"), "{len}: {e}");
            assert!(SubvolRootItem::decode(&vec![0; len]).is_err());
            assert!(RootItem::decode_either(&vec![0; len]).is_err());
        }
        // The engine's decoder refuses the long form by name.
        assert!(RootItem::decode(&good)
            .unwrap_err()
            .0
            .contains("long root item"));
        let rr = RootRef {
            dirid: 256,
            index: 2,
            name: b"x".to_vec(),
        }
        .encode();
        assert!(RootRef::decode(&rr[..17]).is_err());
        let mut no_name = rr.clone();
        no_name[16] = 0;
        assert!(RootRef::decode(&no_name[..18])
            .unwrap_err()
            .0
            .contains("root ref: name length 0"));
        let mut trailing = rr.clone();
        trailing.push(0);
        assert!(RootRef::decode(&trailing)
            .unwrap_err()
            .0
            .contains("trailing"));
        // A link whose low bits are not a directory.
        let mut link = DirEntry {
            ino: 256,
            file_type: FileType::Directory,
            name: b"sv".to_vec(),
            subvolume: true,
        }
        .encode();
        link[8] = SUBVOL_LINK | 1;
        assert!(DirEntry::decode(&link)
            .unwrap_err()
            .0
            .contains("subvolume link"));
        link[8] = SUBVOL_LINK;
        assert!(DirEntry::decode(&link).is_err());
    }
}
