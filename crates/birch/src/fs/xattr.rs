//! Extended attributes: `(ino, XATTR_ITEM, name_hash)` items, each holding
//! every attribute of the inode whose name has that hash.

use super::decode::decode_item;
use super::root::RootCtx;
use super::XattrSetMode;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::node::MAX_ITEM_DATA;
use crate::format::{
    decode_xattrs, encode_xattrs, item_type, name_hash, Key, Timespec, Xattr, NAME_MAX,
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
    ) -> Result<()> {
        validate_xattr_name(name)?;
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
}
