//! Subvolumes through the mount (docs/SNAPSHOTS.md (g); docs/FUSE.md,
//! "Subvolume ioctls"): the ioctl numbers and argument layouts, btrfs's
//! own where FUSE can carry them (a restricted FUSE ioctl moves the size
//! its number encodes), birch's for what btrfs does with a tree search;
//! the list of subvolumes with their paths, which the daemon sends and
//! `birch subvolume list IMAGE` prints without a mount; and which
//! subvolume a mount shows (`subvol=`, `subvolid=`).

use birch::device::BlockDevice;
use birch::format::{tree_id, Timespec, ROOT_DIR_INO};
use birch::fs::{Filesystem, InoSpace, SubvolInfo};
use std::collections::HashMap;

pub(crate) const fn ioc(dir: u32, kind: u8, nr: u8, size: usize) -> u32 {
    dir << 30 | (size as u32) << 16 | (kind as u32) << 8 | nr as u32
}
pub(crate) const IOC_WRITE: u32 = 1;
pub(crate) const IOC_READ: u32 = 2;
const BTRFS_IOCTL_MAGIC: u8 = 0x94;

/// `struct btrfs_ioctl_vol_args`: `__s64 fd; char name[4088]` (the name
/// NUL-terminated).
pub const BTRFS_VOL_ARGS_SIZE: usize = 4096;
/// `struct btrfs_ioctl_ino_lookup_args`: `__u64 treeid, objectid; char
/// name[4080]`.
pub const BTRFS_INO_LOOKUP_ARGS_SIZE: usize = 4096;
/// `_IOW(0x94, 14, struct btrfs_ioctl_vol_args)`, on the parent directory:
/// create subvolume `name` in it.
pub const BTRFS_IOC_SUBVOL_CREATE: u32 = ioc(IOC_WRITE, BTRFS_IOCTL_MAGIC, 14, BTRFS_VOL_ARGS_SIZE);
/// `_IOW(0x94, 15, struct btrfs_ioctl_vol_args)`, on the parent directory:
/// delete the subvolume linked as `name` in it (docs/SNAPSHOTS.md (d)).
pub const BTRFS_IOC_SNAP_DESTROY: u32 = ioc(IOC_WRITE, BTRFS_IOCTL_MAGIC, 15, BTRFS_VOL_ARGS_SIZE);
/// `_IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)`: the id of the
/// subvolume of the fd (`treeid` 0 asks for it) and the path of directory
/// `objectid` in tree `treeid`, from its root, ending in '/' ("" for 256).
pub const BTRFS_IOC_INO_LOOKUP: u32 = ioc(
    IOC_READ | IOC_WRITE,
    BTRFS_IOCTL_MAGIC,
    18,
    BTRFS_INO_LOOKUP_ARGS_SIZE,
);
/// `_IOW(0x94, 19, __u64)`: make subvolume N the default (0: tree 5).
pub const BTRFS_IOC_DEFAULT_SUBVOL: u32 = ioc(IOC_WRITE, BTRFS_IOCTL_MAGIC, 19, 8);
/// `_IOR(0x94, 25, __u64)` / `_IOW(0x94, 26, __u64)`, on a subvolume's
/// root directory: its flags, [`BTRFS_SUBVOL_RDONLY`] the only one.
pub const BTRFS_IOC_SUBVOL_GETFLAGS: u32 = ioc(IOC_READ, BTRFS_IOCTL_MAGIC, 25, 8);
pub const BTRFS_IOC_SUBVOL_SETFLAGS: u32 = ioc(IOC_WRITE, BTRFS_IOCTL_MAGIC, 26, 8);
/// btrfs's read-only bit in the GETFLAGS / SETFLAGS word.
pub const BTRFS_SUBVOL_RDONLY: u64 = 1 << 1;
/// The largest reply of [`BIRCH_IOC_SUBVOL_LIST`]: the most an ioctl
/// number can encode.
pub const BIRCH_SUBVOL_LIST_MAX: usize = (1 << 14) - 1;
/// `_IOWR('b', 4, [u8; BIRCH_SUBVOL_LIST_MAX])`: in, a `u64` cursor (the
/// lowest id wanted); out, the [`SubvolEntry`]s from there that fit
/// ([`SubvolEntry::encode_page`]). A page of none ends the list. (btrfs lists
/// with a tree search, which birch does not expose.)
pub const BIRCH_IOC_SUBVOL_LIST: u32 = ioc(IOC_READ | IOC_WRITE, b'b', 4, BIRCH_SUBVOL_LIST_MAX);
/// `_IOR('b', 5, __u64)`: the default subvolume's id (btrfs-progs reads
/// it with a tree search).
pub const BIRCH_IOC_GET_DEFAULT_SUBVOL: u32 = ioc(IOC_READ, b'b', 5, 8);

/// [`BIRCH_IOC_SNAP_CREATE`]'s argument: `__u64 source` (the source
/// subvolume's id), `__u64 flags` ([`BTRFS_SUBVOL_RDONLY`] the only one),
/// `char name[4080]` (NUL-terminated). btrfs's `BTRFS_IOC_SNAP_CREATE_V2`
/// carries the source as a file descriptor, which means nothing in the
/// daemon's process: a FUSE ioctl moves bytes, not descriptors.
pub const BIRCH_SNAP_ARGS_SIZE: usize = 4096;
/// `_IOW('b', 6, struct birch_snap_args)`, on the destination directory:
/// snapshot subvolume `source` as `name` in it.
pub const BIRCH_IOC_SNAP_CREATE: u32 = ioc(IOC_WRITE, b'b', 6, BIRCH_SNAP_ARGS_SIZE);

/// `struct btrfs_ioctl_received_subvol_args`: `char uuid[16]; __u64
/// stransid, rtransid; struct btrfs_ioctl_timespec stime, rtime` (u64
/// seconds, u32 nanoseconds, 4 bytes of padding each); `__u64 flags,
/// reserved[16]`.
pub const BTRFS_RECEIVED_SUBVOL_ARGS_SIZE: usize = 200;
/// `_IOWR(0x94, 37, struct btrfs_ioctl_received_subvol_args)`, on a
/// subvolume's root directory: record it as received (uuid, stransid,
/// stime in; rtransid, rtime out). Root or the mount's owner only
/// (docs/SEND.md).
pub const BTRFS_IOC_SET_RECEIVED_SUBVOL: u32 = ioc(
    IOC_READ | IOC_WRITE,
    BTRFS_IOCTL_MAGIC,
    37,
    BTRFS_RECEIVED_SUBVOL_ARGS_SIZE,
);

/// `_IOR('b', 7, __u64)`: returns once the cleaner has dropped every
/// deleted subvolume it may drop, with the number of those it waits for
/// because their inodes are still in use (`birch subvolume sync` asks
/// again each second until none is left; btrfs-progs polls with a tree
/// search). The cleaner runs in the caller's request, a bounded
/// transaction at a time, also on a mount without a background worker
/// (`commit=0`).
pub const BIRCH_IOC_SUBVOL_SYNC: u32 = ioc(IOC_READ, b'b', 7, 8);

/// A decoded [`BIRCH_IOC_SNAP_CREATE`] argument.
#[derive(Debug, PartialEq, Eq)]
pub struct SnapArgs<'a> {
    pub source: u64,
    pub readonly: bool,
    pub name: &'a [u8],
}

impl<'a> SnapArgs<'a> {
    /// The argument's bytes, or None when `name` does not fit with its
    /// NUL.
    pub fn encode(source: u64, readonly: bool, name: &[u8]) -> Option<Vec<u8>> {
        let mut out = vec![0u8; BIRCH_SNAP_ARGS_SIZE];
        if name.len() >= BIRCH_SNAP_ARGS_SIZE - 16 {
            return None;
        }
        out[..8].copy_from_slice(&source.to_ne_bytes());
        out[8..16].copy_from_slice(&btrfs_flags(readonly).to_ne_bytes());
        out[16..16 + name.len()].copy_from_slice(name);
        Some(out)
    }

    /// EINVAL for a short argument, a name without its NUL, empty or with
    /// a '/'; EOPNOTSUPP for a flag other than read-only (btrfs's answers).
    pub fn decode(bytes: &'a [u8]) -> Result<Self, i32> {
        let word = |at: usize| {
            bytes
                .get(at..at + 8)
                .map(|b| u64::from_ne_bytes(b.try_into().expect("eight bytes")))
                .ok_or(libc::EINVAL)
        };
        let (source, flags) = (word(0)?, word(8)?);
        if flags & !BTRFS_SUBVOL_RDONLY != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let field = bytes.get(16..BIRCH_SNAP_ARGS_SIZE).ok_or(libc::EINVAL)?;
        let len = field.iter().position(|&b| b == 0).ok_or(libc::EINVAL)?;
        let name = &field[..len];
        if name.is_empty() || name.contains(&b'/') {
            return Err(libc::EINVAL);
        }
        Ok(SnapArgs {
            source,
            readonly: flags & BTRFS_SUBVOL_RDONLY != 0,
            name,
        })
    }
}

/// One subvolume as `birch subvolume list` and `show` print it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubvolEntry {
    pub id: u64,
    /// The subvolume holding its link (btrfs's "top level"); 0 for tree 5.
    pub parent: u64,
    /// The directory holding the link, in `parent`'s tree.
    pub dir: u64,
    pub generation: u64,
    pub readonly: bool,
    pub ctransid: u64,
    pub otransid: u64,
    /// Received: the sender's ctransid (which an incremental stream names
    /// its parent by, with the received uuid); else 0.
    pub stransid: u64,
    pub uuid: [u8; 16],
    pub parent_uuid: [u8; 16],
    pub received_uuid: [u8; 16],
    pub ctime: Timespec,
    pub otime: Timespec,
    /// From the top level, without a leading '/'; "" for tree 5.
    pub path: Vec<u8>,
}

/// The fixed part of an encoded [`SubvolEntry`]: eight u64s, three
/// uuids, two times (i64 + u32), the path's length (u16).
const ENTRY_FIXED: usize = 8 * 8 + 3 * 16 + 2 * 12 + 2;

impl SubvolEntry {
    /// Little-endian, in field order, the path last after its u16 length.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENTRY_FIXED + self.path.len());
        for v in [
            self.id,
            self.parent,
            self.dir,
            self.generation,
            u64::from(self.readonly),
            self.ctransid,
            self.otransid,
            self.stransid,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for u in [self.uuid, self.parent_uuid, self.received_uuid] {
            out.extend_from_slice(&u);
        }
        for t in [self.ctime, self.otime] {
            out.extend_from_slice(&t.sec.to_le_bytes());
            out.extend_from_slice(&t.nsec.to_le_bytes());
        }
        let len = u16::try_from(self.path.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&self.path[..usize::from(len)]);
        out
    }

    /// One reply of [`BIRCH_IOC_SUBVOL_LIST`]: a u64 count, then the
    /// entries. The count comes first because the kernel copies back only
    /// what the daemon sent: the rest of the caller's buffer keeps what it
    /// held (the cursor, zeros).
    pub fn encode_page(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out = (entries.len() as u64).to_le_bytes().to_vec();
        for e in entries {
            out.extend_from_slice(e);
        }
        out
    }

    /// Decodes a reply made by [`Self::encode_page`] (trailing bytes
    /// ignored).
    pub fn decode_page(bytes: &[u8]) -> Result<Vec<SubvolEntry>, String> {
        let count = bytes
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("eight bytes")))
            .ok_or("subvolume list reply: shorter than its count")?;
        let mut rest = &bytes[8..];
        let mut out = Vec::new();
        for i in 0..count {
            let (entry, used) = Self::decode(rest).ok_or_else(|| {
                format!("subvolume list reply: entry {i} of {count} is cut short")
            })?;
            out.push(entry);
            rest = &rest[used..];
        }
        Ok(out)
    }

    fn decode(b: &[u8]) -> Option<(SubvolEntry, usize)> {
        let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        let uuid_at = |i: usize| -> Option<[u8; 16]> { b.get(i..i + 16)?.try_into().ok() };
        let time_at = |i: usize| {
            Some(Timespec {
                sec: i64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?),
                nsec: u32::from_le_bytes(b.get(i + 8..i + 12)?.try_into().ok()?),
            })
        };
        let len = usize::from(u16::from_le_bytes(
            b.get(ENTRY_FIXED - 2..ENTRY_FIXED)?.try_into().ok()?,
        ));
        let end = ENTRY_FIXED.checked_add(len)?;
        Some((
            SubvolEntry {
                id: u64_at(0)?,
                parent: u64_at(8)?,
                dir: u64_at(16)?,
                generation: u64_at(24)?,
                readonly: u64_at(32)? != 0,
                ctransid: u64_at(40)?,
                otransid: u64_at(48)?,
                stransid: u64_at(56)?,
                uuid: uuid_at(64)?,
                parent_uuid: uuid_at(80)?,
                received_uuid: uuid_at(96)?,
                ctime: time_at(112)?,
                otime: time_at(124)?,
                path: b.get(ENTRY_FIXED..end)?.to_vec(),
            },
            end,
        ))
    }
}

/// Every live subvolume with its path from the top level, tree 5 first,
/// then by id.
pub fn list<D: BlockDevice + 'static>(fs: &Filesystem<D>) -> birch::Result<Vec<SubvolEntry>> {
    let infos = fs.list_subvolumes()?;
    let by_id: HashMap<u64, &SubvolInfo> = infos.iter().map(|i| (i.id, i)).collect();
    let mut paths = HashMap::from([(tree_id::FS, Vec::new())]);
    let mut out = Vec::with_capacity(infos.len());
    for info in &infos {
        let path = subvolume_path(fs, info.id, &by_id, &mut paths)?;
        let item = info.item.unwrap_or_default();
        out.push(SubvolEntry {
            id: info.id,
            parent: info.parent,
            dir: info.dir,
            generation: info.generation,
            readonly: info.readonly,
            ctransid: item.ctransid,
            otransid: item.otransid,
            stransid: item.stransid,
            uuid: item.uuid,
            parent_uuid: item.parent_uuid,
            received_uuid: item.received_uuid,
            ctime: item.ctime,
            otime: item.otime,
            path,
        });
    }
    Ok(out)
}

/// Subvolume `id`'s path from the top level: its parent's path, the
/// directory holding its link, its name. `paths` memoizes; a chain of
/// parents longer than there are subvolumes is a cycle, a corruption.
fn subvolume_path<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    id: u64,
    by_id: &HashMap<u64, &SubvolInfo>,
    paths: &mut HashMap<u64, Vec<u8>>,
) -> birch::Result<Vec<u8>> {
    let mut chain = Vec::new();
    let mut at = id;
    while !paths.contains_key(&at) {
        if chain.len() > by_id.len() {
            return Err(corrupt(format!(
                "subvolume {id}: its chain of parent subvolumes loops"
            )));
        }
        let info = by_id.get(&at).ok_or_else(|| {
            corrupt(format!(
                "subvolume {}: its parent subvolume {at} is not live",
                chain.last().copied().unwrap_or(id)
            ))
        })?;
        chain.push(at);
        at = info.parent;
    }
    for &sub in chain.iter().rev() {
        let info = by_id[&sub];
        let mut path = paths[&info.parent].clone();
        let dir = dir_path(fs, info.parent, info.dir)?;
        for part in [&dir[..], &info.name[..]] {
            if !path.is_empty() && !part.is_empty() && path.last() != Some(&b'/') {
                path.push(b'/');
            }
            path.extend_from_slice(part);
        }
        paths.insert(sub, path);
    }
    Ok(paths[&id].clone())
}

/// The path of directory `dir` of subvolume `tree` from that
/// subvolume's root directory, ending in '/' unless empty (`dir` is the
/// root), as BTRFS_IOC_INO_LOOKUP answers: each step up takes the
/// directory's `..` and finds its name in the parent's listing.
pub fn dir_path<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    tree: u64,
    dir: u64,
) -> birch::Result<Vec<u8>> {
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut at = InoSpace::join(tree, dir);
    let root = InoSpace::join(tree, ROOT_DIR_INO);
    while at != root {
        if parts.len() > 4096 {
            return Err(corrupt(format!(
                "directory {dir} of subvolume {tree}: more than 4096 parents"
            )));
        }
        let parent = fs.lookup(at, b"..")?.ino;
        parts.push(name_in(fs, parent, at)?);
        at = parent;
    }
    let mut path = Vec::new();
    for part in parts.iter().rev() {
        path.extend_from_slice(part);
        path.push(b'/');
    }
    Ok(path)
}

/// The name of `child` in directory `dir` (external numbers).
fn name_in<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    dir: u64,
    child: u64,
) -> birch::Result<Vec<u8>> {
    let mut offset = 0;
    loop {
        let page = fs.readdir(dir, offset, 256)?;
        let Some(last) = page.last() else {
            return Err(corrupt(format!(
                "directory {child}: its parent {dir} has no entry for it"
            )));
        };
        offset = last.next_offset;
        if let Some(e) = page.into_iter().find(|e| e.ino == child) {
            return Ok(e.name);
        }
    }
}

fn corrupt(message: String) -> birch::Error {
    birch::Error::Corrupt(birch::Corruption::general(message))
}

/// Which subvolume a mount shows: `subvol=PATH` (from the top level),
/// `subvolid=N`, or neither (the default subvolume). btrfs: when both are
/// given they must name the same subvolume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubvolumeChoice {
    pub path: Option<String>,
    pub id: Option<u64>,
}

/// The engine number of the root directory the mount shows, or a message
/// naming what is wrong with the choice.
pub fn mount_root<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    choice: &SubvolumeChoice,
) -> Result<u64, String> {
    let by_path = match &choice.path {
        None => None,
        Some(path) => Some(subvolume_at(fs, path)?),
    };
    let id = match (by_path, choice.id) {
        (Some(a), Some(b)) if a != b => {
            return Err(format!(
                "subvol={} is subvolume {a}, but subvolid={b} was given",
                choice.path.as_deref().unwrap_or_default()
            ))
        }
        (Some(id), _) => id,
        (None, Some(id)) => {
            let listed = fs
                .list_subvolumes()
                .map_err(|e| format!("listing subvolumes: {e}"))?;
            if !listed.iter().any(|i| i.id == id) {
                return Err(format!("subvolid={id}: no such subvolume"));
            }
            id
        }
        (None, None) => fs
            .default_subvolume()
            .map_err(|e| format!("reading the default subvolume: {e}"))?,
    };
    Ok(InoSpace::join(id, ROOT_DIR_INO))
}

/// The subvolume `path` (from the top level) names: its last component
/// must be a subvolume link (or the path empty or "/": tree 5).
fn subvolume_at<D: BlockDevice + 'static>(fs: &Filesystem<D>, path: &str) -> Result<u64, String> {
    let mut at = fs.root_ino();
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        at = fs
            .lookup(at, part.as_bytes())
            .map_err(|e| format!("subvol={path}: {part}: {e}"))?
            .ino;
    }
    let (id, ino) = InoSpace::split(at);
    if ino != ROOT_DIR_INO {
        return Err(format!("subvol={path}: not a subvolume"));
    }
    Ok(id)
}

/// The flags word of GETFLAGS for a subvolume of these flags.
pub fn btrfs_flags(readonly: bool) -> u64 {
    if readonly {
        BTRFS_SUBVOL_RDONLY
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers btrfs-progs sends (include/uapi/linux/btrfs.h).
    #[test]
    fn ioctl_numbers_match_btrfs() {
        assert_eq!(BTRFS_IOC_SUBVOL_CREATE, 0x5000_940e);
        assert_eq!(BTRFS_IOC_INO_LOOKUP, 0xd000_9412);
        assert_eq!(BTRFS_IOC_DEFAULT_SUBVOL, 0x4008_9413);
        assert_eq!(BTRFS_IOC_SUBVOL_GETFLAGS, 0x8008_9419);
        assert_eq!(BTRFS_IOC_SUBVOL_SETFLAGS, 0x4008_941a);
        assert_eq!(BTRFS_IOC_SNAP_DESTROY, 0x5000_940f);
        assert_eq!(BTRFS_IOC_SET_RECEIVED_SUBVOL, 0xc0c8_9425);
    }

    #[test]
    fn snapshot_arguments_round_trip_and_refuse_bad_input() {
        let bytes = SnapArgs::encode(257, true, b"snap").unwrap();
        let expected = SnapArgs {
            source: 257,
            readonly: true,
            name: b"snap",
        };
        assert_eq!(SnapArgs::decode(&bytes), Ok(expected));
        assert_eq!(SnapArgs::decode(&bytes[..100]), Err(libc::EINVAL));
        let mut flags = bytes.clone();
        flags[8] |= 1;
        assert_eq!(SnapArgs::decode(&flags), Err(libc::EOPNOTSUPP));
        for name in [&b""[..], b"a/b"] {
            let bytes = SnapArgs::encode(5, false, name).unwrap();
            assert_eq!(SnapArgs::decode(&bytes), Err(libc::EINVAL));
        }
        let mut no_nul = vec![b'x'; BIRCH_SNAP_ARGS_SIZE];
        no_nul[..16].fill(0);
        assert_eq!(SnapArgs::decode(&no_nul), Err(libc::EINVAL));
        assert!(SnapArgs::encode(5, false, &[b'x'; BIRCH_SNAP_ARGS_SIZE - 16]).is_none());
    }

    #[test]
    fn entries_round_trip_and_refuse_short_input() {
        let e = SubvolEntry {
            id: 257,
            parent: 5,
            dir: 300,
            generation: 9,
            readonly: true,
            ctransid: 8,
            otransid: 7,
            stransid: 6,
            uuid: [1; 16],
            parent_uuid: [2; 16],
            received_uuid: [0; 16],
            ctime: Timespec { sec: 5, nsec: 6 },
            otime: Timespec { sec: -1, nsec: 2 },
            path: b"a/b".to_vec(),
        };
        let mut page = SubvolEntry::encode_page(&[e.encode(), e.encode()]);
        let whole = page.len();
        // What the kernel leaves after the reply in the caller's buffer.
        page.extend([0u8; 64]);
        assert_eq!(SubvolEntry::decode_page(&page).unwrap(), vec![e.clone(), e]);
        for cut in [1, 8 + ENTRY_FIXED - 1, whole - 1] {
            assert!(SubvolEntry::decode_page(&page[..cut]).is_err(), "{cut}");
        }
        assert_eq!(SubvolEntry::decode_page(&[0; 8]).unwrap(), vec![]);
    }
}
