//! Subvolumes (docs/SNAPSHOTS.md (a), (g); step 6 of (j)): creating one
//! (its root item, ROOT_REF / ROOT_BACKREF pair, the link in its parent
//! directory and an empty root directory in a new tree, all in one
//! transaction), lookup and listing across a link, external inode numbers
//! (`InoSpace`), the list of subvolumes and the default subvolume; and
//! snapshots, queued by a request and made by the commit's seal (step 8).

use super::decode::decode_item;
use super::info::PendingSnapshot;
use super::log_state::FallbackReason;
use super::namespace::validate_name;
use super::root::{Root, RootCtx, SubvolRecord};
use super::send::{ParentRoot, SendRoots};
use super::space_info::Need;
use super::state::FsState;
use super::{Attr, DirListEntry, InoSpace, RenameFlags, SubvolInfo};
use crate::btree::TreeRoot;
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::node::NodeBody;
use crate::format::{
    decode_dir_items, encode_dir_items, encode_inode_refs, item_type, name_hash, tree_id, DirEntry,
    FileType, InodeItem, InodeRefEntry, Key, RootRef, SubvolRootItem, Timespec,
    DEFAULT_SUBVOL_NAME, FIRST_FREE_INO, ROOT_DIR_INO, SUBVOL_RDONLY,
};

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
        self.check_new_link(parent_id, dir, name)?;
        let now = Timespec::now();
        let transid = self.info.forest.transid();
        let top_item = self.fresh_root_item(tree_id::FS, now);
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
        self.subvols.others.insert(
            id,
            Root::new(tree, Some(self.fresh_root_item(id, now)), FIRST_FREE_INO),
        );
        let index = self
            .writable(parent_id)?
            .add_subvolume_link(dir, name, id)?;
        // A log of this transaction would copy the link with its
        // directory: fsyncs commit until the next commit.
        self.info.log.force_commit = Some(FallbackReason::Subvolume);
        self.insert_root_refs(parent_id, id, dir, index, name)?;
        Ok(id)
    }

    /// Whether a link `name` may be added to directory `dir` of subvolume
    /// `parent_id`: a writable subvolume, a directory, a valid name not
    /// taken (nor by a snapshot waiting for the seal), space and a dir
    /// index for it.
    fn check_new_link(&mut self, parent_id: u64, dir: u64, name: &[u8]) -> Result<()> {
        let mut ctx = self.writable(parent_id)?;
        // Nothing new links into a deleted subvolume, still loaded for
        // its open inodes (btrfs_mksubvol: ENOENT); its tree is dropped.
        if ctx.root.is_deleted() {
            return Err(Error::NotFound);
        }
        super::namespace::validate_name(name)?;
        if matches!(name, b"." | b"..") {
            return Err(Error::Exists);
        }
        ctx.require_dir(dir)?;
        if ctx.find_entry(dir, name)?.is_some()
            || ctx
                .fs
                .pending_snapshots
                .iter()
                .any(|p| p.dest_root == parent_id && p.dest_dir == dir && p.name == name)
        {
            return Err(Error::Exists);
        }
        ctx.ensure_space(0)?;
        ctx.require_dir_indexes(dir, 1)
    }

    /// rename(2) when the source or the target is a subvolume link
    /// (docs/SNAPSHOTS.md (g), "Renaming a subvolume link"; btrfs's
    /// `btrfs_rename` and `btrfs_rename_exchange`). Returns false, having
    /// changed nothing, when neither name is a link (or a name is
    /// malformed, the flags contradict each other or the source is
    /// missing: the plain rename reports those in the kernel's order).
    /// As btrfs, a link may move into a directory of another subvolume
    /// (only other inodes are EXDEV across subvolumes), and
    /// RENAME_EXCHANGE swaps a link with any entry of its own subvolume,
    /// across subvolumes only with another link. A link moves: its
    /// DIR_ITEM and DIR_INDEX leave `dir`, new ones (a new dir index) go
    /// into `new_dir`, and its ROOT_REF / ROOT_BACKREF pair is rewritten
    /// with the new parent subvolume, directory, index and name. It may
    /// replace an empty plain directory; renaming anything over a link is
    /// ENOTEMPTY, as btrfs. Not logged: fsyncs commit until the next
    /// commit, as after a create or a delete.
    pub(super) fn rename_subvolume_link(
        &mut self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<bool> {
        let (parent_id, dir) = InoSpace::split(parent);
        let (new_parent_id, new_dir) = InoSpace::split(new_parent);
        let mut ctx = self.writable(parent_id)?;
        let well_formed = validate_name(name).is_ok()
            && validate_name(new_name).is_ok()
            && !matches!(new_name, b"." | b"..");
        if !well_formed || (flags.exchange && (flags.no_replace || flags.whiteout.is_some())) {
            return Ok(false);
        }
        let Some(source) = ctx.find_entry(dir, name)? else {
            return Ok(false);
        };
        let target = self.ctx(new_parent_id)?.find_entry(new_dir, new_name)?;
        let target_is_link = target.as_ref().is_some_and(|t| t.subvolume);
        if !source.subvolume && !target_is_link {
            return Ok(false);
        }
        // A deleted subvolume holds no link (delete refuses one holding
        // any), so this is a link moving into one: ENOENT, as btrfs
        // refuses a new link there.
        if self.ctx(new_parent_id)?.root.is_deleted() {
            return Err(Error::NotFound);
        }
        let across = parent_id != new_parent_id;
        // btrfs: across subvolumes only a link moves, and an exchange
        // needs a link on both sides.
        if across && (!source.subvolume || (flags.exchange && !target_is_link)) {
            return Err(Error::CrossDevice);
        }
        if flags.whiteout.is_some() {
            return Err(Error::NotSupported("RENAME_WHITEOUT of a subvolume link"));
        }
        let source_ext = entry_ext(parent_id, &source);
        if flags.exchange {
            let target = target.ok_or(Error::NotFound)?;
            // The VFS's traps (lock_rename), across subvolume links.
            let target_ext = entry_ext(new_parent_id, &target);
            if (source.file_type == FileType::Directory
                && self.is_within_across(new_parent, source_ext)?)
                || (target.file_type == FileType::Directory
                    && self.is_within_across(parent, target_ext)?)
            {
                return Err(Error::InvalidArgument(
                    "directory exchanged with its own ancestor",
                ));
            }
            let ends = [
                LinkEnd {
                    subvol: parent_id,
                    dir,
                    name,
                    entry: source,
                },
                LinkEnd {
                    subvol: new_parent_id,
                    dir: new_dir,
                    name: new_name,
                    entry: target,
                },
            ];
            self.exchange_with_link(ends)?;
        } else {
            if source.file_type == FileType::Directory
                && self.is_within_across(new_parent, source_ext)?
            {
                return Err(Error::InvalidArgument(
                    "directory moved into its own subtree",
                ));
            }
            let from = LinkEnd {
                subvol: parent_id,
                dir,
                name,
                entry: source,
            };
            if !self.move_subvolume_link(from, new_parent, new_name, target, flags)? {
                return Ok(true);
            }
        }
        // A log of this transaction would copy either directory without
        // the link while the ROOT_REF pair names it: fsyncs commit until
        // the next commit (counted as `fallback_subvolume`).
        self.info.log.force_commit = Some(FallbackReason::Subvolume);
        Ok(true)
    }

    /// The non-exchange half of
    /// [`rename_subvolume_link`](Self::rename_subvolume_link): `from`
    /// moves to `new_name` in directory `new_parent` (external), over
    /// `target` if there is one. Returns false when nothing changed (the
    /// link renamed onto itself).
    fn move_subvolume_link(
        &mut self,
        from: LinkEnd<'_>,
        new_parent: u64,
        new_name: &[u8],
        target: Option<DirEntry>,
        flags: RenameFlags,
    ) -> Result<bool> {
        let (new_parent_id, new_dir) = InoSpace::split(new_parent);
        let source = &from.entry;
        if let Some(target) = &target {
            if flags.no_replace {
                return Err(Error::Exists);
            }
            if target.subvolume && source.subvolume && target.ino == source.ino {
                // The same link under the same name: nothing to do.
                return Ok(false);
            }
            // The VFS's type checks come first (a link is a directory),
            // then btrfs's: nothing replaces a subvolume, and a directory
            // replaces only an empty one.
            match (source.file_type, target.file_type) {
                (FileType::Directory, FileType::Directory) => {}
                (FileType::Directory, _) => return Err(Error::NotDir),
                (_, _) => return Err(Error::IsDir),
            }
            if target.subvolume || !self.ctx(new_parent_id)?.is_dir_empty(target.ino)? {
                return Err(Error::NotEmpty);
            }
        }
        self.writable(from.subvol)?
            .deny_if_flagged(from.dir, false)?;
        let mut ctx = self.writable(new_parent_id)?;
        ctx.deny_if_flagged(new_dir, target.is_none())?;
        ctx.require_dir(new_dir)?;
        ctx.ensure_space(0)?;
        ctx.require_dir_indexes(new_dir, 1)?;
        if let Some(target) = &target {
            ctx.deny_if_flagged(target.ino, false)?;
            ctx.rmdir(new_dir, new_name)?;
        }
        self.unlink_end(&from)?;
        self.link_end(new_parent_id, new_dir, new_name, &from.entry)?;
        Ok(true)
    }

    /// The exchange half of
    /// [`rename_subvolume_link`](Self::rename_subvolume_link): the two
    /// entries (one of them at least a link; across subvolumes both)
    /// swap names, as `btrfs_rename_exchange`.
    fn exchange_with_link(&mut self, ends: [LinkEnd<'_>; 2]) -> Result<()> {
        let [a, b] = &ends;
        if a.entry.ino == b.entry.ino && a.entry.subvolume == b.entry.subvolume {
            // One link (or inode) under both names: nothing to do.
            return Ok(());
        }
        for end in &ends {
            let mut ctx = self.writable(end.subvol)?;
            ctx.deny_if_flagged(end.dir, false)?;
            if !end.entry.subvolume {
                ctx.deny_if_flagged(end.entry.ino, false)?;
            }
        }
        let same_dir = a.subvol == b.subvol && a.dir == b.dir;
        for end in &ends {
            let mut ctx = self.writable(end.subvol)?;
            ctx.ensure_space(0)?;
            ctx.require_dir_indexes(end.dir, if same_dir { 2 } else { 1 })?;
        }
        for end in &ends {
            self.unlink_end(end)?;
        }
        self.link_end(b.subvol, b.dir, b.name, &a.entry)?;
        self.link_end(a.subvol, a.dir, a.name, &b.entry)?;
        Ok(())
    }

    /// Takes `end`'s name away: a link's entry and ROOT_REF pair, or a
    /// plain inode's name (and a directory's share of its parent's
    /// link count).
    fn unlink_end(&mut self, end: &LinkEnd<'_>) -> Result<()> {
        let entry = &end.entry;
        if !entry.subvolume {
            let mut ctx = self.writable(end.subvol)?;
            ctx.remove_name(end.dir, end.name, entry.ino)?;
            if entry.file_type == FileType::Directory {
                ctx.update_inode(end.dir, |d| d.nlink = d.nlink.saturating_sub(1))?;
            }
            return Ok(());
        }
        let old = self
            .info
            .link_root_ref(end.subvol, end.dir, end.name, entry.ino)?;
        self.writable(end.subvol)?
            .remove_subvolume_link(end.dir, end.name, entry.ino, old.index)?;
        let corrupt = |key: Key| {
            Error::corrupt(Corruption::general(format!(
                "subvolume link \"{}\" in {}:{}: no {key}",
                String::from_utf8_lossy(end.name),
                end.subvol,
                end.dir
            )))
        };
        let roots = &mut self.info.roots;
        for key in [
            Key::root_ref(end.subvol, entry.ino),
            Key::root_backref(entry.ino, end.subvol),
        ] {
            self.info
                .forest
                .delete(&mut roots.root, &key)?
                .ok_or_else(|| corrupt(key))?;
        }
        Ok(())
    }

    /// Gives `entry` the name `name` in directory `dir` of subvolume
    /// `subvol`: a link's entry and ROOT_REF pair, or a plain inode's
    /// name, its ctime and (a directory) its parent's link count.
    fn link_end(&mut self, subvol: u64, dir: u64, name: &[u8], entry: &DirEntry) -> Result<()> {
        if entry.subvolume {
            let index = self
                .writable(subvol)?
                .add_subvolume_link(dir, name, entry.ino)?;
            return self.insert_root_refs(subvol, entry.ino, dir, index, name);
        }
        let mut ctx = self.writable(subvol)?;
        ctx.add_name(dir, name, entry.ino, entry.file_type)?;
        if entry.file_type == FileType::Directory {
            ctx.update_inode(dir, |d| d.nlink = d.nlink.saturating_add(1))?;
        }
        let now = Timespec::now();
        ctx.update_inode(entry.ino, |i| i.ctime = now)?;
        let transid = ctx.fs.forest.transid();
        ctx.inode(entry.ino)?.log.renamed_trans = transid;
        Ok(())
    }

    /// Whether directory `dir` (external) is `ancestor` or below it,
    /// following `..` across subvolume links as the VFS's dentries do.
    fn is_within_across(&mut self, dir: u64, ancestor: u64) -> Result<bool> {
        let mut cur = dir;
        for _ in 0..=u16::MAX {
            if cur == ancestor {
                return Ok(true);
            }
            let up = self.parent_across(cur)?;
            if up == cur {
                return Ok(false);
            }
            cur = up;
        }
        Err(Error::corrupt(Corruption::general(format!(
            "directory {dir}: parent chain across subvolumes does not reach the top level"
        ))))
    }

    /// The ROOT_REF / ROOT_BACKREF pair linking subvolume `child` as entry
    /// `index` (`name`) of directory `dir` of subvolume `parent`.
    fn insert_root_refs(
        &mut self,
        parent: u64,
        child: u64,
        dir: u64,
        index: u64,
        name: &[u8],
    ) -> Result<()> {
        let rr = RootRef {
            dirid: dir,
            index,
            name: name.to_vec(),
        }
        .encode();
        let roots = &mut self.info.roots;
        self.info
            .forest
            .insert(&mut roots.root, Key::root_ref(parent, child), rr.clone())?;
        self.info
            .forest
            .insert(&mut roots.root, Key::root_backref(child, parent), rr)?;
        Ok(())
    }

    /// Asks for a snapshot of subvolume `source` as `name` in directory
    /// `dest_dir` (an external number), read-only if asked: checks it now
    /// and queues it for the running transaction's seal, which makes it
    /// ([`make_pending_snapshots`](Self::make_pending_snapshots);
    /// docs/SNAPSHOTS.md (c)). Returns the id it gets, reserved now so
    /// that two pending snapshots get different ones.
    pub(super) fn queue_snapshot(
        &mut self,
        source: u64,
        dest_dir: u64,
        name: &[u8],
        readonly: bool,
    ) -> Result<u64> {
        // A deleted subvolume (refs 0, waiting for the cleaner or for its
        // open inodes' release) cannot be a source, as in btrfs.
        if self.ctx(source)?.root.is_deleted() {
            return Err(Error::NotFound);
        }
        let (dest_root, dir) = InoSpace::split(dest_dir);
        self.check_new_link(dest_root, dir, name)?;
        let id = self.next_subvolume_id()?;
        self.info.pending_snapshots.push(PendingSnapshot {
            id,
            source,
            dest_root,
            dest_dir: dir,
            name: name.to_vec(),
            readonly,
        });
        Ok(id)
    }

    /// The long root item of a subvolume made (or, for tree 5, first
    /// given the long form) in this transaction at `now`.
    fn fresh_root_item(&self, id: u64, now: Timespec) -> SubvolRootItem {
        new_root_item(
            self.info.superblock.fsid,
            id,
            self.info.forest.transid(),
            now,
        )
    }

    /// Sets or clears subvolume `id`'s `SUBVOL_RDONLY` flag (`birch
    /// property set PATH ro`).
    pub(super) fn set_subvolume_readonly(&mut self, id: u64, readonly: bool) -> Result<()> {
        if !readonly {
            self.info.refuse_during_send(id, "make writable")?;
        }
        self.edit_root_item(id, |item| {
            if readonly {
                item.flags |= SUBVOL_RDONLY;
            } else {
                item.flags &= !SUBVOL_RDONLY;
            }
            Ok(())
        })
    }

    /// Records that subvolume `id` was received (btrfs's
    /// `BTRFS_IOC_SET_RECEIVED_SUBVOL`, docs/SEND.md): the sender's uuid,
    /// ctransid and time, this transaction and `now` as when. A read-only
    /// subvolume is refused (EROFS), as btrfs does: receive records this
    /// before it sets the flag. Returns the rtransid.
    pub(super) fn set_received_subvolume(
        &mut self,
        id: u64,
        received_uuid: [u8; 16],
        stransid: u64,
        stime: Timespec,
        now: Timespec,
    ) -> Result<u64> {
        let rtransid = self.info.forest.transid();
        self.edit_root_item(id, |item| {
            if item.flags & SUBVOL_RDONLY != 0 {
                return Err(Error::ReadOnly);
            }
            item.received_uuid = received_uuid;
            item.stransid = stransid;
            item.stime = stime;
            item.rtransid = rtransid;
            item.rtime = now;
            Ok(())
        })?;
        Ok(rtransid)
    }

    /// Changes subvolume `id`'s long root item with `edit`. Tree 5 on an
    /// image without subvolumes gets its long root item here, as in
    /// [`create_subvolume`](Self::create_subvolume). The item is written
    /// into the root tree now (the seal writes it again) so that the
    /// commit that follows has a change to write.
    fn edit_root_item(
        &mut self,
        id: u64,
        edit: impl FnOnce(&mut SubvolRootItem) -> Result<()>,
    ) -> Result<()> {
        if !tree_id::is_subvolume(id) {
            return Err(Error::NotFound);
        }
        let fresh = self.fresh_root_item(id, Timespec::now());
        let ctx = self.ctx(id)?;
        // Only tree 5 can lack the long item. Its tree may be unchanged in
        // this transaction: the last change is its root node's generation
        // (S8: ctransid <= generation); otransid 0, as btrfs shows for its
        // top level.
        let last_change = ctx.root.tree.generation;
        let item = ctx.root.item.get_or_insert(SubvolRootItem {
            ctransid: last_change,
            otransid: 0,
            otime: Timespec::default(),
            ..fresh
        });
        edit(item)?;
        let record = ctx.root.record();
        let roots = &mut self.info.roots;
        self.info.forest.put(
            &mut roots.root,
            Key::new(id, item_type::ROOT_ITEM, 0),
            record.encode(),
        )?;
        Ok(())
    }

    /// The roots a send of `snapshot` (incremental against `parent`)
    /// reads, and whether both trees are on disk as they are (no change
    /// since the last commit). EPERM for a subvolume that is not
    /// read-only, NotFound for an unknown one; the top level (5) has no
    /// name to be sent as (btrfs's send refuses it too: it has no
    /// ROOT_BACKREF).
    pub(super) fn send_roots(
        &mut self,
        snapshot: u64,
        parent: Option<u64>,
    ) -> Result<(SendRoots, bool)> {
        let durable = self.info.superblock.generation;
        let (tree, item) = self.read_only_root(snapshot)?;
        let mut on_disk = tree.generation <= durable;
        let backrefs = self.info.forest.collect_range(
            &self.info.roots.root,
            Key::new(snapshot, item_type::ROOT_BACKREF, 0),
            Key::new(snapshot, item_type::ROOT_BACKREF, u64::MAX),
        )?;
        let Some((key, data)) = backrefs.first() else {
            return Err(Error::InvalidArgument(
                "the top-level subvolume has no name to send it as",
            ));
        };
        let name = decode_item(key, RootRef::decode(data))?.name;
        let parent = match parent {
            None => None,
            Some(id) => {
                let (tree, item) = self.read_only_root(id)?;
                on_disk &= tree.generation <= durable;
                Some(ParentRoot {
                    tree,
                    clone_uuid: stream_uuid(&item),
                    clone_ctransid: item.ctransid,
                })
            }
        };
        Ok((
            SendRoots {
                tree,
                name,
                uuid: stream_uuid(&item),
                ctransid: item.ctransid,
                parent,
            },
            on_disk,
        ))
    }

    /// Subvolume `id`'s tree and root item; EPERM unless it is read-only.
    fn read_only_root(&mut self, id: u64) -> Result<(TreeRoot, SubvolRootItem)> {
        let ctx = self.ctx(id)?;
        match ctx.root.item {
            Some(item) if item.is_readonly() && !ctx.root.is_deleted() => Ok((ctx.root.tree, item)),
            _ => Err(Error::Refused(format!(
                "subvolume {id} is not read-only: only a read-only subvolume can be sent"
            ))),
        }
    }

    /// What a snapshot of `source` may add to the running transaction:
    /// its root items, link and ROOT_REF pair, and one count change per
    /// pointer (or item, for a leaf) of the source's root node.
    pub(super) fn snapshot_need(&mut self, source: u64) -> Result<Need> {
        let ctx = self.ctx(source)?;
        let tree = ctx.root.tree;
        let pointers = match ctx.fs.forest.node(tree.bytenr, tree.expectation())?.body {
            NodeBody::Internal(ref ptrs) => ptrs.len(),
            NodeBody::Leaf(ref items) => items.len(),
        };
        Ok(Need::items(8 + pointers as u64))
    }

    /// Makes the snapshots queued in the running transaction, in queue
    /// order: the seal's step between the delayed-item flush and the
    /// log's drop (docs/SNAPSHOTS.md (c)). The caller flushes the delayed
    /// items again afterwards (the links' DIR_INDEX items, the destination
    /// directories' inode items).
    pub(super) fn make_pending_snapshots(&mut self) -> Result<()> {
        for pending in std::mem::take(&mut self.info.pending_snapshots) {
            self.make_snapshot(&pending)?;
        }
        Ok(())
    }

    /// One pending snapshot: the source's tree made whole (its delayed
    /// items flushed), its root copied (`Forest::copy_root`: one node,
    /// every child one reference more, both trees' `last_snapshot` = T),
    /// the new root item, then the link and its ROOT_REF pair. The link
    /// goes in after the copy, so a snapshot placed inside its source does
    /// not contain itself. A destination that changed since the snapshot
    /// was asked for (directory removed, name taken) refuses it: the
    /// reason waits in `refused_snapshots` for the caller.
    fn make_snapshot(&mut self, pending: &PendingSnapshot) -> Result<()> {
        {
            // A destination subvolume deleted since (dropped, or loaded
            // only for its open inodes) refuses it too.
            let mut dest = match self.ctx(pending.dest_root) {
                Ok(dest) if !dest.root.is_deleted() => dest,
                Ok(_) | Err(Error::NotFound) => {
                    self.info
                        .refused_snapshots
                        .insert(pending.id, Error::NotFound);
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            let refusal = match dest.require_dir(pending.dest_dir) {
                Err(e @ (Error::Io(_) | Error::Corrupt(_))) => return Err(e),
                Err(e) => Some(e),
                Ok(()) => dest
                    .find_entry(pending.dest_dir, &pending.name)?
                    .map(|_| Error::Exists),
            };
            if let Some(e) = refusal {
                self.info.refused_snapshots.insert(pending.id, e);
                return Ok(());
            }
        }
        // A source deleted since the snapshot was asked for refuses it.
        match self.ctx(pending.source) {
            Ok(source) if !source.root.is_deleted() => {}
            Ok(_) | Err(Error::NotFound) => {
                self.info
                    .refused_snapshots
                    .insert(pending.id, Error::NotFound);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        // A no-op unless an earlier snapshot of this seal linked into it.
        self.ctx(pending.source)?.flush_delayed_items()?;
        let now = Timespec::now();
        let transid = self.info.forest.transid();
        let fsid = self.info.superblock.fsid;
        let source = self
            .subvols
            .get_mut(pending.source)
            .ok_or(Error::NotFound)?;
        // Tree 5 of an image without subvolumes gets its long item (and
        // uuid) now, as for the first subvolume created.
        let source_uuid = source
            .item
            .get_or_insert_with(|| new_root_item(fsid, pending.source, transid, now))
            .uuid;
        let next_ino = source.next_ino;
        let tree = self.info.forest.copy_root(&mut source.tree, pending.id)?;
        let item = SubvolRootItem {
            flags: if pending.readonly { SUBVOL_RDONLY } else { 0 },
            parent_uuid: source_uuid,
            ..new_root_item(fsid, pending.id, transid, now)
        };
        self.subvols
            .others
            .insert(pending.id, Root::new(tree, Some(item), next_ino));
        // The subvolumes linked inside the source are not part of the
        // snapshot: their links in the copy would have no ROOT_REF pair
        // (a fault, S5). btrfs shows an empty directory in their place;
        // birch removes the copied link. The source's ROOT_REFs list them,
        // so this costs one change per nested subvolume.
        let nested = self.info.forest.collect_range(
            &self.info.roots.root,
            Key::root_ref(pending.source, 0),
            Key::root_ref(pending.source, u64::MAX),
        )?;
        let mut snapshot = self.ctx(pending.id)?;
        for (key, data) in &nested {
            let link = decode_item(key, RootRef::decode(data))?;
            snapshot.remove_copied_link(&link)?;
        }
        // The source's open unlinked files are copied as orphans, which
        // nothing in the snapshot holds open: they go now (their data
        // stays for the source), rather than at the snapshot's first
        // read-write load, which a read-only snapshot never has.
        snapshot.remove_orphans()?;
        let index = self.ctx(pending.dest_root)?.add_subvolume_link(
            pending.dest_dir,
            &pending.name,
            pending.id,
        )?;
        self.insert_root_refs(
            pending.dest_root,
            pending.id,
            pending.dest_dir,
            index,
            &pending.name,
        )
    }

    /// The highest subvolume id with a root item, created or reserved by
    /// a snapshot in this transaction (the seal writes their items), + 1
    /// (256 for the first). Every root-tree key with an objectid in the subvolume range
    /// belongs to a subvolume that has a root item.
    fn next_subvolume_id(&mut self) -> Result<u64> {
        let last = self.info.forest.last_at_or_before(
            &self.info.roots.root,
            &Key::new(tree_id::LAST_SUBVOL, item_type::ROOT_ITEM, u64::MAX),
        )?;
        let highest = last
            .map(|(k, _)| k.objectid)
            .filter(|&id| id >= tree_id::FIRST_SUBVOL)
            .max(self.subvols.others.keys().next_back().copied())
            .max(self.info.pending_snapshots.iter().map(|p| p.id).max())
            .max(self.info.refused_snapshots.keys().next_back().copied());
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
                        generation: record.tree.generation,
                        item: record.item,
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

/// A new subvolume's root item (the seal fills in its root node and
/// `last_snapshot`): linked, created and changed in `transid`, and a uuid
/// unique among the image's root items (the fsid with the id mixed in).
fn new_root_item(fsid: [u8; 16], id: u64, transid: u64, now: Timespec) -> SubvolRootItem {
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
        self.update_link_counts(dir, name, true, Some(Timespec::now()))?;
        Ok(index)
    }

    /// Removes the link `link` names from this snapshot's copy of its
    /// source's tree (`FsState::make_snapshot`): its DIR_ITEM entry, its
    /// DIR_INDEX and its share of the directory's size and nlink.
    fn remove_copied_link(&mut self, link: &RootRef) -> Result<()> {
        let tree = self.root.tree.id;
        let missing = |what: &str| {
            Error::corrupt(Corruption::general(format!(
                "subvolume link {:?} of directory {} in tree {tree}: no {what}",
                String::from_utf8_lossy(&link.name),
                link.dirid,
            )))
        };
        match self.remove_dir_item(link.dirid, &link.name)? {
            Some(entry) if entry.subvolume => {}
            _ => return Err(missing("DIR_ITEM entry")),
        }
        let index_key = Key::new(link.dirid, item_type::DIR_INDEX, link.index);
        if self
            .fs
            .forest
            .delete(&mut self.root.tree, &index_key)?
            .is_none()
        {
            return Err(missing("DIR_INDEX"));
        }
        // The copy keeps its directory's times: it is the source as of T.
        self.update_link_counts(link.dirid, &link.name, false, None)
    }

    /// A subvolume link's share of directory `dir`'s size and link count,
    /// added or taken away, and its times set to `now` if given. The counts come
    /// from disk: one that would overflow or go below zero is corruption.
    pub(super) fn update_link_counts(
        &mut self,
        dir: u64,
        name: &[u8],
        add: bool,
        now: Option<Timespec>,
    ) -> Result<()> {
        let name_len = name.len() as u64;
        let mut counts_ok = true;
        self.update_inode(dir, |d| {
            let counts = if add {
                (d.size.checked_add(name_len), d.nlink.checked_add(1))
            } else {
                (d.size.checked_sub(name_len), d.nlink.checked_sub(1))
            };
            match counts {
                (Some(size), Some(nlink)) => (d.size, d.nlink) = (size, nlink),
                _ => counts_ok = false,
            }
            if let Some(now) = now {
                (d.mtime, d.ctime) = (now, now);
            }
        })?;
        if !counts_ok {
            return Err(Error::corrupt(Corruption::general(format!(
                "directory {dir} in tree {}: size or link count out of range for the subvolume link {:?}",
                self.root.tree.id,
                String::from_utf8_lossy(name)
            ))));
        }
        Ok(())
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

/// One side of a rename that involves a subvolume link: the entry `name`
/// of directory `dir` of subvolume `subvol`.
struct LinkEnd<'a> {
    subvol: u64,
    dir: u64,
    name: &'a [u8],
    entry: DirEntry,
}

/// The external number of the inode `entry` (of subvolume `subvol`)
/// leads to: a link's subvolume's root directory.
fn entry_ext(subvol: u64, entry: &DirEntry) -> u64 {
    if entry.subvolume {
        InoSpace::join(entry.ino, ROOT_DIR_INO)
    } else {
        InoSpace::join(subvol, entry.ino)
    }
}

/// The uuid a stream names a subvolume by: the one it was received as, if
/// it was received (so that a copy sent on names what its receivers
/// know), else its own; with its own ctransid either way (the kernel's
/// `send_subvol_begin`). A receiver's copy records that ctransid as its
/// stransid, which is what an incremental stream's parent is matched by.
fn stream_uuid(item: &SubvolRootItem) -> [u8; 16] {
    if item.received_uuid != [0; 16] {
        item.received_uuid
    } else {
        item.uuid
    }
}

#[cfg(test)]
mod tests {
    use crate::device::MemoryDevice;
    use crate::error::Error;
    use crate::format::{item_type, tree_id, FileType, Key, ORPHAN_OBJECTID};
    use crate::fs::{mkfs, Filesystem, MkfsOptions, MountOptions};
    use std::sync::Arc;

    /// A snapshot's destination can change between the request and the
    /// seal (btrfs holds the directory's lock across the commit; birch
    /// does not): the seal refuses it, with the reason the caller gets,
    /// and makes the rest. Threads make that race; this takes its steps
    /// in order.
    #[test]
    fn a_destination_changed_before_the_seal_refuses_the_snapshot() {
        let dev = Arc::new(MemoryDevice::new(16 << 20));
        mkfs(dev.as_ref(), &MkfsOptions::default()).unwrap();
        let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
        let root = fs.root_ino();
        let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
        let queue = |dir, name: &[u8]| {
            fs.lock()
                .queue_snapshot(tree_id::FS, dir, name, false)
                .unwrap()
        };
        let taken = queue(root, b"s");
        let gone = queue(d, b"t");
        let made = queue(root, b"u");
        fs.create(root, b"s", 0o644, 0, 0).unwrap();
        fs.rmdir(root, b"d").unwrap();
        fs.commit().unwrap();
        {
            let mut state = fs.lock();
            let refused = &mut state.info.refused_snapshots;
            assert!(matches!(refused.remove(&taken), Some(Error::Exists)));
            assert!(matches!(refused.remove(&gone), Some(Error::NotFound)));
            assert!(refused.is_empty());
        }
        let ids: Vec<u64> = fs.list_subvolumes().unwrap().iter().map(|i| i.id).collect();
        assert_eq!(ids, vec![tree_id::FS, made]);
        assert_eq!(fs.lookup(root, b"s").unwrap().file_type, FileType::Regular);
        fs.close().unwrap();
        // (`birch check` of such images: tests/snapshots.rs; fs may not
        // import check, tests/layers.rs.)
        let fs = Filesystem::open(dev, MountOptions::deterministic()).unwrap();
        let ids: Vec<u64> = fs.list_subvolumes().unwrap().iter().map(|i| i.id).collect();
        assert_eq!(ids, vec![tree_id::FS, made]);
    }

    /// A file open and unlinked in the source is an orphan there; the
    /// snapshot does not keep it (nothing holds it open in the snapshot),
    /// and once the source's holder closes it, nothing is left of it.
    #[test]
    fn a_snapshot_leaves_out_the_open_unlinked_files_of_its_source() {
        let dev = Arc::new(MemoryDevice::new(16 << 20));
        mkfs(dev.as_ref(), &MkfsOptions::default()).unwrap();
        let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
        let root = fs.root_ino();
        let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
        fs.write_file(f, 0, &[7; 20_000]).unwrap();
        fs.sync().unwrap();
        fs.open_inode(f).unwrap();
        fs.unlink(root, b"f").unwrap();
        let id = fs
            .create_snapshot(tree_id::FS, root, b"snap", true)
            .unwrap();
        let orphans_in = |id: u64| {
            let mut state = fs.lock();
            let ctx = state.ctx(id).unwrap();
            ctx.fs
                .forest
                .collect_range(
                    &ctx.root.tree,
                    Key::new(ORPHAN_OBJECTID, item_type::ORPHAN_ITEM, 0),
                    Key::new(ORPHAN_OBJECTID, item_type::ORPHAN_ITEM, u64::MAX),
                )
                .unwrap()
                .len()
        };
        assert_eq!((orphans_in(tree_id::FS), orphans_in(id)), (1, 0));
        assert_eq!(fs.read_file(f, 0, 10).unwrap(), [7; 10]);
        fs.release(f).unwrap();
        assert_eq!((orphans_in(tree_id::FS), orphans_in(id)), (0, 0));
        fs.close().unwrap();
    }
}
