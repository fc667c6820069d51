//! Inode flags (`chattr` / `lsattr`: FS_IOC_GETFLAGS, FS_IOC_SETFLAGS) and
//! unnamed files (`O_TMPFILE`).
//!
//! `c` (compress) is kept and inherited by new inodes of a `+c` directory
//! (docs/COMPRESSION.md).
//!
//! Only the flags birch enforces exist: immutable and append-only, kept in
//! the inode item's `flags` (so fsync logs them with the inode). The VFS
//! enforces them for kernel filesystems from `inode->i_flags`, which FUSE
//! never sets: birch refuses the changes itself, here, for every user of
//! the engine.

use super::root::RootCtx;
use super::types::inode_flags::{APPEND, COMPR, IMMUTABLE, NOCOMP, SUPPORTED};
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::{item_type, FileType, Key, ORPHAN_OBJECTID};

impl<D: BlockDevice> RootCtx<'_, D> {
    pub(crate) fn get_flags(&mut self, ino: u64) -> Result<u32> {
        Ok(self.inode(ino)?.item.flags as u32 & SUPPORTED)
    }

    /// Sets the inode's flags. Who may is the caller's business (the
    /// kernel requires CAP_LINUX_IMMUTABLE to change these two). As
    /// btrfs (`check_fsflags`), `c` and `m` together are EINVAL, and a
    /// change of either ends the compression property unless `c` stays
    /// with an algorithm (docs/COMPRESSION.md, "The property").
    pub(crate) fn set_flags(&mut self, ino: u64, flags: u32) -> Result<()> {
        if flags & !SUPPORTED != 0 {
            return Err(Error::NotSupported("inode flag birch does not honour"));
        }
        if flags & NOCOMP != 0 && flags & COMPR != 0 {
            return Err(Error::InvalidArgument(
                "chattr +c (compress) and +m (never compress) together",
            ));
        }
        let old = self.inode(ino)?.item.flags as u32;
        if (old ^ flags) & (COMPR | NOCOMP) != 0 {
            self.compression_flags_changed(ino, flags)?;
        }
        let now = crate::format::Timespec::now();
        self.update_inode(ino, |i| {
            i.flags = u64::from(flags);
            i.ctime = now;
        })
    }

    /// The flags an inode created in directory `dir` takes from it, as
    /// btrfs's `btrfs_inherit_iflags`: `m` (FS_NOCOMP_FL) if `dir` has
    /// it, else `c` (FS_COMPR_FL) if `dir` has it.
    pub(crate) fn inherited_flags(&mut self, dir: u64) -> Result<u64> {
        let flags = self.inode(dir)?.item.flags;
        Ok(if flags & u64::from(NOCOMP) != 0 {
            u64::from(NOCOMP)
        } else {
            flags & u64::from(COMPR)
        })
    }

    /// Fails with EPERM if `ino` is immutable, or append-only and the
    /// change is not an append (`append_ok`).
    pub(crate) fn deny_if_flagged(&mut self, ino: u64, append_ok: bool) -> Result<()> {
        let flags = self.inode(ino)?.item.flags as u32;
        if flags & IMMUTABLE != 0 || (flags & APPEND != 0 && !append_ok) {
            return Err(Error::NotPermitted);
        }
        Ok(())
    }

    /// An open(2) with `flags`, as the VFS's may_open refuses it: an
    /// immutable inode opens for reading only, without O_TRUNC; an
    /// append-only one for writing only with O_APPEND, never with O_TRUNC.
    pub(crate) fn deny_open(&mut self, ino: u64, flags: i32) -> Result<()> {
        let inode_flags = self.inode(ino)?.item.flags as u32;
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let truncates = flags & libc::O_TRUNC != 0;
        let appends = flags & libc::O_APPEND != 0;
        if inode_flags & IMMUTABLE != 0 && (writes || truncates) {
            return Err(Error::NotPermitted);
        }
        if inode_flags & APPEND != 0 && ((writes && !appends) || truncates) {
            return Err(Error::NotPermitted);
        }
        Ok(())
    }

    /// A write: nothing into an immutable file, only at EOF into an
    /// append-only one.
    pub(crate) fn deny_write(&mut self, ino: u64, offset: u64) -> Result<()> {
        let at_eof = offset == self.inode(ino)?.item.size;
        self.deny_if_flagged(ino, at_eof)
    }

    /// Removing the entry `name` of `dir`: the directory may not be
    /// immutable or append-only, nor may the inode the entry names.
    pub(crate) fn deny_remove(&mut self, dir: u64, name: &[u8]) -> Result<()> {
        self.deny_if_flagged(dir, false)?;
        if let Some(entry) = self.find_entry(dir, name)? {
            // A link is removed by rmdir or `subvolume delete`
            // (cleaner.rs) and moved by `rename_subvolume_link`
            // (subvol.rs), which run before this. unlink(2) of a
            // directory is EISDIR in the VFS before it reaches birch.
            if entry.subvolume {
                return Err(Error::NotSupported(
                    "unlinking a subvolume link (rmdir or subvolume delete removes it)",
                ));
            }
            self.deny_if_flagged(entry.ino, false)?;
        }
        Ok(())
    }

    /// A new inode with no name, held once (the caller's open handle),
    /// recorded as an orphan so a crash before it is linked or released
    /// cannot leak it. `link` gives it a name (and drops the orphan item).
    pub(crate) fn tmpfile(
        &mut self,
        dir: u64,
        mode: u32,
        umask: u32,
        uid: u32,
        gid: u32,
    ) -> Result<u64> {
        if self.inode(dir)?.item.file_type() != FileType::Directory {
            return Err(Error::NotDir);
        }
        self.deny_if_flagged(dir, true)?;
        self.ensure_space(0)?;
        // As a named create: the directory's default ACL, or the umask
        // (fstests generic/389).
        let (mode, acls) = self.acl_at_create(dir, libc::S_IFREG | (mode & 0o7777), umask)?;
        let mut item = self.new_inode_item(mode, uid, gid, 0);
        item.flags |= self.inherited_flags(dir)?;
        item.nlink = 0;
        let ino = self.add_new_inode(item);
        self.store_inherited_acls(ino, acls)?;
        self.inherit_compression_property(dir, ino, FileType::Regular)?;
        self.open_inode(ino)?;
        self.inode_unlinked(ino)?;
        Ok(ino)
    }

    /// An inode without names (a tmpfile, or a file unlinked while open)
    /// got one again: it is no orphan any more.
    pub(crate) fn inode_relinked(&mut self, ino: u64) -> Result<()> {
        self.fs.forest.delete(
            &mut self.root.tree,
            &Key::new(ORPHAN_OBJECTID, item_type::ORPHAN_ITEM, ino),
        )?;
        Ok(())
    }
}
