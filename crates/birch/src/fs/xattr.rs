//! Extended attributes: `(ino, XATTR_ITEM, name_hash)` items, each holding
//! every attribute of the inode whose name has that hash.

use super::decode::decode_item;
use super::root::RootCtx;
use super::types::inode_flags::{COMPR, NOCOMP};
use super::XattrSetMode;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::node::MAX_ITEM_DATA;
use crate::format::{
    decode_xattrs, encode_xattrs, item_type, name_hash, Acl, CompressionProperty, FileType, Key,
    Timespec, Xattr, ACL_ACCESS_XATTR, ACL_DEFAULT_XATTR, COMPRESSION_PROPERTY_XATTR, NAME_MAX,
};
use std::ops::ControlFlow;

fn validate_xattr_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidArgument("empty xattr name"));
    }
    if name.len() > NAME_MAX {
        return Err(Error::Range);
    }
    if name.contains(&0) {
        return Err(Error::InvalidArgument("xattr name contains NUL"));
    }
    Ok(())
}

impl<D: BlockDevice> RootCtx<'_, D> {
    fn xattr_bucket(&mut self, ino: u64, name: &[u8]) -> Result<(Key, Vec<Xattr>)> {
        self.inode(ino)?;
        let key = Key::new(ino, item_type::XATTR_ITEM, name_hash(name));
        let bucket = match self.fs.forest.get(&self.root.tree, &key)? {
            Some(data) => decode_item(&key, decode_xattrs(&data))?,
            None => Vec::new(),
        };
        Ok((key, bucket))
    }

    pub(crate) fn getxattr(&mut self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        validate_xattr_name(name)?;
        let (_, bucket) = self.xattr_bucket(ino, name)?;
        bucket
            .into_iter()
            .find(|x| x.name == name)
            .map(|x| x.value)
            .ok_or(Error::NoData)
    }

    pub(crate) fn setxattr(
        &mut self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrSetMode,
        kill_sgid: bool,
    ) -> Result<()> {
        validate_xattr_name(name)?;
        if name == ACL_ACCESS_XATTR || name == ACL_DEFAULT_XATTR {
            return self.set_acl(ino, name, value, kill_sgid);
        }
        if name == COMPRESSION_PROPERTY_XATTR {
            return self.set_compression_property(ino, value, mode);
        }
        self.store_xattr(ino, name, value, mode)
    }

    /// Sets the compression property as btrfs's `prop_compression_apply`
    /// (docs/COMPRESSION.md, "The property"): `zstd` / `lz4` is kept and
    /// sets `c` (clearing `m`); `none` / `no` is kept and sets `m`
    /// (clearing `c`); an empty value removes the property (if any) and
    /// clears both; anything else is EINVAL and changes nothing.
    fn set_compression_property(
        &mut self,
        ino: u64,
        value: &[u8],
        mode: XattrSetMode,
    ) -> Result<()> {
        if value.is_empty() {
            match self.remove_xattr_item(ino, COMPRESSION_PROPERTY_XATTR) {
                Ok(()) | Err(Error::NoData) => {}
                Err(e) => return Err(e),
            }
            return self.set_compression_flags(ino, 0);
        }
        let bits = match CompressionProperty::parse(value).map_err(Error::InvalidArgument)? {
            CompressionProperty::Algorithm(_) => COMPR,
            CompressionProperty::Never => NOCOMP,
        };
        self.store_xattr(ino, COMPRESSION_PROPERTY_XATTR, value, mode)?;
        self.set_compression_flags(ino, bits)
    }

    /// Replaces the inode's `c` and `m` flags with `bits`.
    fn set_compression_flags(&mut self, ino: u64, bits: u32) -> Result<()> {
        let both = u64::from(COMPR | NOCOMP);
        self.update_inode(ino, |i| i.flags = (i.flags & !both) | u64::from(bits))
    }

    /// The inode's compression property; `None` without one, or with a
    /// value that does not parse (a damaged item must not stop writeback:
    /// the mount's choice applies then).
    pub(crate) fn compression_property(&mut self, ino: u64) -> Result<Option<CompressionProperty>> {
        if self.inode(ino)?.item.flags & u64::from(COMPR | NOCOMP) == 0 {
            // Setting the property sets one of them; clearing both
            // removes it (`set_flags`), so there is nothing to look up.
            return Ok(None);
        }
        match self.getxattr(ino, COMPRESSION_PROPERTY_XATTR) {
            Ok(value) => Ok(CompressionProperty::parse(&value).ok()),
            Err(Error::NoData) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `chattr` changed `c` or `m` (btrfs's `fileattr_set` then rewrites
    /// or removes the property): the property goes, unless the inode
    /// keeps `c` and the property names an algorithm.
    pub(crate) fn compression_flags_changed(&mut self, ino: u64, flags: u32) -> Result<()> {
        let keep = flags & COMPR != 0
            && matches!(
                self.compression_property(ino)?,
                Some(CompressionProperty::Algorithm(_))
            );
        if keep {
            return Ok(());
        }
        match self.remove_xattr_item(ino, COMPRESSION_PROPERTY_XATTR) {
            Ok(()) | Err(Error::NoData) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A new inode of `file_type` in `dir` takes `dir`'s compression
    /// property when it names an algorithm, as btrfs's
    /// `btrfs_inode_inherit_props` (regular files and directories only;
    /// `none` passes on as the `m` flag, `inherited_flags`).
    pub(crate) fn inherit_compression_property(
        &mut self,
        dir: u64,
        ino: u64,
        file_type: FileType,
    ) -> Result<()> {
        if !matches!(file_type, FileType::Regular | FileType::Directory) {
            return Ok(());
        }
        if let Some(CompressionProperty::Algorithm(a)) = self.compression_property(dir)? {
            let value = a.name().as_bytes();
            self.store_xattr(ino, COMPRESSION_PROPERTY_XATTR, value, XattrSetMode::Create)?;
        }
        Ok(())
    }

    fn store_xattr(
        &mut self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrSetMode,
    ) -> Result<()> {
        let (key, mut bucket) = self.xattr_bucket(ino, name)?;
        let existing = bucket.iter().position(|x| x.name == name);
        match (mode, existing) {
            (XattrSetMode::Create, Some(_)) => return Err(Error::Exists),
            (XattrSetMode::Replace, None) => return Err(Error::NoData),
            _ => {}
        }
        match existing {
            Some(i) => bucket[i].value = value.to_vec(),
            None => bucket.push(Xattr {
                name: name.to_vec(),
                value: value.to_vec(),
            }),
        }
        self.ensure_space(0)?;
        let encoded = encode_xattrs(&bucket);
        if encoded.len() > MAX_ITEM_DATA {
            return Err(Error::NoSpace);
        }
        self.fs.forest.put(&mut self.root.tree, key, encoded)?;
        let now = Timespec::now();
        self.update_inode(ino, |i| i.ctime = now)
    }

    pub(crate) fn listxattr(&mut self, ino: u64) -> Result<Vec<Vec<u8>>> {
        self.inode(ino)?;
        let mut names = Vec::new();
        let mut err = None;
        self.fs.forest.scan(
            &self.root.tree,
            Key::new(ino, item_type::XATTR_ITEM, 0),
            Key::new(ino, item_type::XATTR_ITEM, u64::MAX),
            &mut |k, d| {
                match decode_item(k, decode_xattrs(d)) {
                    Ok(xs) => names.extend(xs.into_iter().map(|x| x.name)),
                    Err(e) => {
                        err = Some(e);
                        return Ok(ControlFlow::Break(()));
                    }
                }
                Ok(ControlFlow::Continue(()))
            },
        )?;
        match err {
            Some(e) => Err(e),
            None => Ok(names),
        }
    }

    pub(crate) fn removexattr(&mut self, ino: u64, name: &[u8]) -> Result<()> {
        validate_xattr_name(name)?;
        self.remove_xattr_item(ino, name)?;
        if name == COMPRESSION_PROPERTY_XATTR {
            // As an empty value: back to the mount's choice.
            self.set_compression_flags(ino, 0)?;
        }
        Ok(())
    }

    /// Removes the xattr `name` (ENODATA if there is none).
    fn remove_xattr_item(&mut self, ino: u64, name: &[u8]) -> Result<()> {
        let (key, mut bucket) = self.xattr_bucket(ino, name)?;
        let before = bucket.len();
        bucket.retain(|x| x.name != name);
        if bucket.len() == before {
            return Err(Error::NoData);
        }
        if bucket.is_empty() {
            self.fs.forest.delete(&mut self.root.tree, &key)?;
        } else {
            self.fs
                .forest
                .put(&mut self.root.tree, key, encode_xattrs(&bucket))?;
        }
        let now = Timespec::now();
        self.update_inode(ino, |i| i.ctime = now)
    }

    /// Sets an ACL xattr after validating it (a malformed one is EINVAL
    /// and never stored). As the kernel's posix_acl_update_mode, an access
    /// ACL sets the mode's rwx bits, and one that says no more than they
    /// can is not stored at all: the mode carries it. With `kill_sgid`
    /// an access ACL also clears set-group-ID (whether or not the ACL is
    /// stored, as posix_acl_update_mode); a default ACL changes no mode.
    /// The VFS ignores XATTR_CREATE and XATTR_REPLACE for ACLs, and so
    /// does this.
    fn set_acl(&mut self, ino: u64, name: &[u8], value: &[u8], kill_sgid: bool) -> Result<()> {
        let acl = Acl::decode(value).map_err(|_| Error::InvalidArgument("malformed POSIX ACL"))?;
        let item = self.inode_item(ino)?;
        if name == ACL_DEFAULT_XATTR {
            if item.file_type() != FileType::Directory {
                return Err(Error::InvalidArgument("default ACL on a non-directory"));
            }
            return self.store_xattr(ino, name, value, XattrSetMode::CreateOrReplace);
        }
        let (mut mode, extended) = acl.equiv_mode(item.mode);
        if kill_sgid {
            mode &= !libc::S_ISGID;
        }
        if extended {
            self.store_xattr(ino, name, value, XattrSetMode::CreateOrReplace)?;
        } else {
            match self.removexattr(ino, name) {
                Ok(()) | Err(Error::NoData) => {}
                Err(e) => return Err(e),
            }
        }
        let now = Timespec::now();
        self.update_inode(ino, |i| {
            i.mode = mode;
            i.ctime = now;
        })
    }

    /// The stored ACL `name` of `ino`, if any; a damaged one is corruption.
    fn stored_acl(&mut self, ino: u64, name: &[u8]) -> Result<Option<Acl>> {
        let value = match self.getxattr(ino, name) {
            Ok(v) => v,
            Err(Error::NoData) => return Ok(None),
            Err(e) => return Err(e),
        };
        Acl::decode(&value).map(Some).map_err(|why| {
            Error::corrupt(crate::Corruption::general(format!(
                "inode {ino}: {}: {why}",
                String::from_utf8_lossy(name)
            )))
        })
    }

    /// A chmod to `mode` keeps the access ACL in step (posix_acl_chmod):
    /// the kernel leaves this to the FUSE server.
    pub(crate) fn chmod_acl(&mut self, ino: u64, mode: u32) -> Result<()> {
        if let Some(mut acl) = self.stored_acl(ino, ACL_ACCESS_XATTR)? {
            acl.chmod(mode);
            self.store_xattr(ino, ACL_ACCESS_XATTR, &acl.encode(), XattrSetMode::Replace)?;
        }
        Ok(())
    }

    /// The mode a new inode of `mode` in `parent` gets, and the ACLs it
    /// inherits (posix_acl_create): with a default ACL on the parent the
    /// ACL replaces the umask; without one the umask applies. Symlinks
    /// take neither.
    pub(crate) fn acl_at_create(
        &mut self,
        parent: u64,
        mode: u32,
        umask: u32,
    ) -> Result<(u32, InheritedAcls)> {
        let file_type = FileType::from_mode(mode);
        if file_type == Some(FileType::Symlink) {
            return Ok((mode, InheritedAcls::default()));
        }
        let Some(default) = self.stored_acl(parent, ACL_DEFAULT_XATTR)? else {
            return Ok((mode & !(umask & 0o777), InheritedAcls::default()));
        };
        let (access, mode, extended) = default.inherit(mode);
        let inherited = InheritedAcls {
            access: extended.then_some(access),
            default: (file_type == Some(FileType::Directory)).then_some(default),
        };
        Ok((mode, inherited))
    }

    /// Stores what [`acl_at_create`](Self::acl_at_create) chose on the new
    /// inode, in the same transaction as the inode itself.
    pub(crate) fn store_inherited_acls(&mut self, ino: u64, acls: InheritedAcls) -> Result<()> {
        if let Some(access) = acls.access {
            self.store_xattr(
                ino,
                ACL_ACCESS_XATTR,
                &access.encode(),
                XattrSetMode::Create,
            )?;
        }
        if let Some(default) = acls.default {
            self.store_xattr(
                ino,
                ACL_DEFAULT_XATTR,
                &default.encode(),
                XattrSetMode::Create,
            )?;
        }
        Ok(())
    }
}

/// The ACLs a new inode takes from its directory's default ACL.
#[derive(Default)]
pub(crate) struct InheritedAcls {
    access: Option<Acl>,
    /// A new directory passes the default ACL on to what it will hold.
    default: Option<Acl>,
}
