//! Subvolumes (docs/SNAPSHOTS.md (a), (g); step 6 of (j)): creating one
//! (its root item, ROOT_REF / ROOT_BACKREF pair, the link in its parent
//! directory and an empty root directory in a new tree, all in one
//! transaction), lookup and listing across a link, external inode numbers
//! (`InoSpace`), the list of subvolumes and the default subvolume.

use super::decode::decode_item;
use super::log_state::FallbackReason;
use super::root::{Root, RootCtx, SubvolRecord};
use super::state::FsState;
use super::{Attr, DirListEntry, InoSpace};
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{
    decode_dir_items, encode_dir_items, encode_inode_refs, item_type, name_hash, tree_id, DirEntry,
    FileType, InodeItem, InodeRefEntry, Key, RootRef, SubvolRootItem, Timespec,
    DEFAULT_SUBVOL_NAME, FIRST_FREE_INO, ROOT_DIR_INO, SUBVOL_RDONLY,
};

/// One subvolume, as `list` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubvolInfo {
    pub id: u64,
    /// The subvolume whose directory holds its link (0 for tree 5).
    pub parent: u64,
    /// The directory (in `parent`'s tree) holding the link, and its name.
    pub dir: u64,
    pub name: Vec<u8>,
    pub readonly: bool,
}

impl<D: BlockDevice> FsState<D> {
    /// The directory or file `ext` names, resolved to its subvolume.
    pub(super) fn resolve(&mut self, ext: u64) -> Result<(RootCtx<'_, D>, u64)> {
        let (id, ino) = InoSpace::split(ext);
        if !tree_id::is_subvolume(id) {
            return Err(Error::NotFound);
        }
        Ok((self.ctx(id)?, ino))
    }

    /// [`resolve`](Self::resolve) for a change: EROFS in a read-only
    /// subvolume.
    pub(super) fn resolve_writable(&mut self, ext: u64) -> Result<(RootCtx<'_, D>, u64)> {
        let (id, ino) = InoSpace::split(ext);
        if !tree_id::is_subvolume(id) {
            return Err(Error::NotFound);
        }
        Ok((self.writable(id)?, ino))
    }

    /// Looks `name` up in directory `parent` (external numbers): a
    /// subvolume link leads to that subvolume's root directory.
    pub(super) fn lookup_across(&mut self, parent: u64, name: &[u8]) -> Result<Attr> {
        let (mut ctx, dir) = self.resolve(parent)?;
        let id = ctx.root.tree.id;
        let entry = match name {
            b".." if dir == ROOT_DIR_INO && id != tree_id::FS => {
                let parent = self.parent_across(parent)?;
                return self.getattr_across(parent);
            }
            b"." | b".." => None,
            _ => ctx.find_entry(dir, name)?,
        };
        let mut attr = match entry {
            Some(e) if e.subvolume => {
                let mut child = self.ctx(e.ino)?;
                let mut attr = child.getattr(ROOT_DIR_INO)?;
                attr.ino = InoSpace::join(e.ino, ROOT_DIR_INO);
                return Ok(attr);
            }
            Some(e) => ctx.getattr(e.ino)?,
            None => ctx.lookup(dir, name)?,
        };
        attr.ino = InoSpace::join(id, attr.ino);
        Ok(attr)
    }

    /// The parent of directory `ext` (external numbers). A subvolume's
    /// root directory's is the directory holding its link (from its
    /// ROOT_BACKREF), as `..` in btrfs; the top level's root is its own.
    pub(super) fn parent_across(&mut self, ext: u64) -> Result<u64> {
        let (mut ctx, dir) = self.resolve(ext)?;
        let id = ctx.root.tree.id;
        if dir != ROOT_DIR_INO || id == tree_id::FS {
            return Ok(InoSpace::join(id, ctx.dir_parent(dir)?));
        }
        let backrefs = self.info.forest.collect_range(
            &self.info.roots.root,
            Key::new(id, item_type::ROOT_BACKREF, 0),
            Key::new(id, item_type::ROOT_BACKREF, u64::MAX),
        )?;
        // A subvolume without a link (deleted, waiting for the cleaner)
        // has no parent to show: its root stands for itself.
        let Some((key, data)) = backrefs.first() else {
            return Ok(ext);
        };
        let rr = decode_item(key, RootRef::decode(data))?;
        Ok(InoSpace::join(key.offset, rr.dirid))
    }

    pub(super) fn getattr_across(&mut self, ext: u64) -> Result<Attr> {
        let (mut ctx, ino) = self.resolve(ext)?;
        let mut attr = ctx.getattr(ino)?;
        attr.ino = ext;
        Ok(attr)
    }

    /// A directory's entries with external inode numbers: a subvolume
    /// link lists as its subvolume's root directory.
    pub(super) fn readdir_across(
        &mut self,
        ext: u64,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<DirListEntry>> {
        let (mut ctx, dir) = self.resolve(ext)?;
        let id = ctx.root.tree.id;
        let links = ctx.subvolume_links(dir)?;
        let mut entries = ctx.readdir(dir, offset, limit)?;
        for e in &mut entries {
            e.ino = match links.iter().find(|(name, _)| *name == e.name) {
                Some(&(_, child)) => InoSpace::join(child, ROOT_DIR_INO),
                None => InoSpace::join(id, e.ino),
            };
        }
        Ok(entries)
    }

    /// Creates subvolume `name` in directory `parent` (an external number)
    /// and returns its id: the highest subvolume id + 1 (from 256). The
    /// first one sets `INCOMPAT_SUBVOLUMES` (the seal writes it, and tree
    /// 5's root item in the long form, in this transaction's commit).
    pub(super) fn create_subvolume(
        &mut self,
        parent: u64,
        name: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<u64> {
        let (parent_id, dir) = InoSpace::split(parent);
        let id = self.next_subvolume_id()?;
        {
            let mut ctx = self.writable(parent_id)?;
            super::namespace::validate_name(name)?;
            if matches!(name, b"." | b"..") {
                return Err(Error::Exists);
            }
            ctx.require_dir(dir)?;
            if ctx.find_entry(dir, name)?.is_some() {
                return Err(Error::Exists);
            }
            ctx.ensure_space(0)?;
            ctx.require_dir_indexes(dir, 1)?;
        }
        let now = Timespec::now();
        let transid = self.info.forest.transid();
        let fsid = self.info.superblock.fsid;
        let long_item = |id: u64| {
            let mut uuid = fsid;
            for (b, x) in uuid.iter_mut().zip(id.to_le_bytes()) {
                *b ^= x;
            }
            SubvolRootItem {
                refs: 1,
                uuid,
                ctransid: transid,
                otransid: transid,
                ctime: now,
                otime: now,
                ..Default::default()
            }
        };
        let top_item = long_item(tree_id::FS);
        self.subvols.top.item.get_or_insert(top_item);
        let mut tree = self.info.forest.create_tree(id)?;
        let root_dir = InodeItem {
            generation: transid,
            transid,
            nlink: 2,
            mode: libc::S_IFDIR | 0o755,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
            otime: now,
            ..Default::default()
        };
        self.info.forest.insert(
            &mut tree,
            Key::new(ROOT_DIR_INO, item_type::INODE_ITEM, 0),
            root_dir.encode(),
        )?;
        self.info.forest.insert(
            &mut tree,
            Key::new(ROOT_DIR_INO, item_type::INODE_REF, ROOT_DIR_INO),
            encode_inode_refs(&[InodeRefEntry {
                index: 0,
                name: b"..".to_vec(),
            }]),
        )?;
        self.subvols
            .others
            .insert(id, Root::new(tree, Some(long_item(id)), FIRST_FREE_INO));
        let index = self
            .writable(parent_id)?
            .add_subvolume_link(dir, name, id)?;
        // A log of this transaction would copy the link with its
        // directory: fsyncs commit until the next commit.
        self.info.log.force_commit = Some(FallbackReason::Subvolume);
        let rr = RootRef {
            dirid: dir,
            index,
            name: name.to_vec(),
        }
        .encode();
        let roots = &mut self.info.roots;
        self.info
            .forest
            .insert(&mut roots.root, Key::root_ref(parent_id, id), rr.clone())?;
        self.info
            .forest
            .insert(&mut roots.root, Key::root_backref(id, parent_id), rr)?;
        Ok(id)
    }

    /// The highest subvolume id with a root item or created in this
    /// transaction (its item is written by the seal), + 1 (256 for the
    /// first). Every root-tree key with an objectid in the subvolume range
    /// belongs to a subvolume that has a root item.
    fn next_subvolume_id(&mut self) -> Result<u64> {
        let last = self.info.forest.last_at_or_before(
            &self.info.roots.root,
            &Key::new(tree_id::LAST_SUBVOL, item_type::ROOT_ITEM, u64::MAX),
        )?;
        let highest = last
            .map(|(k, _)| k.objectid)
            .filter(|&id| id >= tree_id::FIRST_SUBVOL)
            .max(self.subvols.others.keys().next_back().copied());
        let next = highest.map_or(tree_id::FIRST_SUBVOL, |id| id + 1);
        if next > tree_id::LAST_SUBVOL {
            return Err(Error::NoSpace);
        }
        Ok(next)
    }

    /// Every subvolume whose root item is in the root tree, from its
    /// ROOT_BACKREF (tree 5 first, with parent 0).
    pub(super) fn list_subvolumes(&mut self) -> Result<Vec<SubvolInfo>> {
        let items = self.info.forest.collect_range(
            &self.info.roots.root,
            Key::new(tree_id::FS, item_type::ROOT_ITEM, 0),
            Key::new(tree_id::LAST_SUBVOL, item_type::ROOT_BACKREF, u64::MAX),
        )?;
        let mut out = Vec::new();
        for (key, data) in &items {
            if !tree_id::is_subvolume(key.objectid) {
                continue;
            }
            match key.item_type {
                item_type::ROOT_ITEM => {
                    let record =
                        SubvolRecord::decode(key.objectid, data, self.info.superblock.subvolumes)?;
                    out.push(SubvolInfo {
                        id: key.objectid,
                        parent: 0,
                        dir: 0,
                        name: Vec::new(),
                        readonly: record.item.is_some_and(|i| i.flags & SUBVOL_RDONLY != 0),
                    });
                }
                item_type::ROOT_BACKREF => {
                    let rr = decode_item(key, RootRef::decode(data))?;
                    if let Some(info) = out.iter_mut().find(|i| i.id == key.objectid) {
                        info.parent = key.offset;
                        info.dir = rr.dirid;
                        info.name = rr.name;
                    }
                }
                _ => {}
            }
        }
        // Dead subvolumes (no link, waiting for the cleaner) are not listed.
        out.retain(|i| i.id == tree_id::FS || i.parent != 0);
        Ok(out)
    }

    /// The default subvolume (5 when none is set).
    pub(super) fn default_subvolume(&mut self) -> Result<u64> {
        let key = Key::default_subvol();
        let Some(data) = self.info.forest.get(&self.info.roots.root, &key)? else {
            return Ok(tree_id::FS);
        };
        let entries = decode_item(&key, decode_dir_items(&data))?;
        entries
            .iter()
            .find(|e| e.name == DEFAULT_SUBVOL_NAME)
            .map(|e| e.ino)
            .ok_or_else(|| {
                Error::corrupt(Corruption::general(format!(
                    "default subvolume item {key} names no \"default\" entry"
                )))
            })
    }

    /// Makes `id` (a live subvolume) the default.
    pub(super) fn set_default_subvolume(&mut self, id: u64) -> Result<()> {
        if !self.list_subvolumes()?.iter().any(|i| i.id == id) {
            return Err(Error::NotFound);
        }
        let entry = DirEntry {
            ino: id,
            file_type: FileType::Directory,
            name: DEFAULT_SUBVOL_NAME.to_vec(),
            subvolume: false,
        };
        let roots = &mut self.info.roots;
        self.info.forest.put(
            &mut roots.root,
            Key::default_subvol(),
            encode_dir_items(&[entry]),
        )?;
        Ok(())
    }
}

impl<D: BlockDevice> RootCtx<'_, D> {
    /// `attr` of an inode of this root, with its external number.
    pub(super) fn external(&self, mut attr: Attr) -> Attr {
        attr.ino = InoSpace::join(self.root.tree.id, attr.ino);
        attr
    }

    /// Adds the link entry for subvolume `child` to directory `dir`: a
    /// DIR_ITEM / DIR_INDEX pair with no INODE_REF (the target is in
    /// another tree; the ROOT_REF pair stands for it). It is not logged:
    /// a log never holds a link (docs/SNAPSHOTS.md (a)); the create
    /// commits. Returns the link's dir index.
    fn add_subvolume_link(&mut self, dir: u64, name: &[u8], child: u64) -> Result<u64> {
        let index = self.next_dir_index(dir)?;
        let dir_key = Key::new(dir, item_type::DIR_ITEM, name_hash(name));
        let mut entries = match self.fs.forest.get(&self.root.tree, &dir_key)? {
            Some(data) => decode_item(&dir_key, decode_dir_items(&data))?,
            None => Vec::new(),
        };
        let entry = DirEntry {
            ino: child,
            file_type: FileType::Directory,
            name: name.to_vec(),
            subvolume: true,
        };
        entries.push(entry.clone());
        let encoded = encode_dir_items(&entries);
        if encoded.len() > crate::format::node::MAX_ITEM_DATA {
            return Err(Error::TooManyLinks);
        }
        self.fs.forest.put(&mut self.root.tree, dir_key, encoded)?;
        self.root.delayed.insert_index(dir, index, entry);
        let now = Timespec::now();
        self.update_inode(dir, |p| {
            p.size += name.len() as u64;
            p.nlink += 1;
            p.mtime = now;
            p.ctime = now;
        })?;
        Ok(index)
    }

    /// The subvolume links in directory `dir`: (name, subvolume id).
    fn subvolume_links(&mut self, dir: u64) -> Result<Vec<(Vec<u8>, u64)>> {
        let mut links = Vec::new();
        for (key, data) in self.fs.forest.collect_range(
            &self.root.tree,
            Key::new(dir, item_type::DIR_ITEM, 0),
            Key::new(dir, item_type::DIR_ITEM, u64::MAX),
        )? {
            for e in decode_item(&key, decode_dir_items(&data))? {
                if e.subvolume {
                    links.push((e.name, e.ino));
                }
            }
        }
        Ok(links)
    }
}
