//! Subvolume deletion and the cleaner (docs/SNAPSHOTS.md (d), step 9 of
//! (j)). Deleting a subvolume removes its link and ROOT_REF pair at once,
//! in the running transaction, and turns its root dead (refs 0, an
//! orphan-root item, `drop_progress` zero); the cleaner then drops the
//! dead tree a bounded number of nodes per state-lock hold and per
//! transaction, its progress in the root item, so that a crash resumes
//! the drop at the next mount (every orphan root is queued then).

use super::decode::decode_item;
use super::info::FsInfo;
use super::log_state::FallbackReason;
use super::root::{RootCtx, SubvolRecord};
use super::state::{DeadRoot, FsState};
use super::transaction::Shared;
use super::types::InoSpace;
use crate::btree::DropStep;
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{item_type, tree_id, Key, RootRef, SubvolRootItem, Timespec, ROOT_DIR_INO};

/// Nodes the cleaner releases per hold of the state lock: what a request
/// may wait for behind it.
const DROP_NODES_PER_HOLD: usize = 64;

impl<D: BlockDevice> FsState<D> {
    /// Deletes the subvolume linked as `name` in directory `parent` (an
    /// external number) and returns its id. Refused with EPERM for the
    /// default subvolume or an append-only or immutable parent directory,
    /// ENOTEMPTY while it holds links to other subvolumes (as btrfs),
    /// EROFS in a read-only parent, EINVAL when `name` is no subvolume
    /// link. Durable at the next commit.
    pub(super) fn delete_subvolume(&mut self, parent: u64, name: &[u8]) -> Result<u64> {
        let (parent_id, dir) = InoSpace::split(parent);
        let entry = {
            let mut ctx = self.writable(parent_id)?;
            ctx.require_dir(dir)?;
            // As for any name's removal: not from an append-only or
            // immutable directory.
            ctx.deny_if_flagged(dir, false)?;
            ctx.find_entry(dir, name)?.ok_or(Error::NotFound)?
        };
        if !entry.subvolume {
            return Err(Error::InvalidArgument("not a subvolume"));
        }
        let id = entry.ino;
        if self.default_subvolume()? == id {
            return Err(Error::NotPermitted);
        }
        self.info.refuse_during_send(id, "delete")?;
        let root_tree = &self.info.roots.root;
        let children = self.info.forest.collect_range(
            root_tree,
            Key::root_ref(id, 0),
            Key::root_ref(id, u64::MAX),
        )?;
        if !children.is_empty() {
            return Err(Error::NotEmpty);
        }
        let ref_key = Key::root_ref(parent_id, id);
        let corrupt = |why: &str| {
            Error::corrupt(Corruption::general(format!(
                "subvolume link \"{}\" in {parent_id}:{dir}: {why}",
                String::from_utf8_lossy(name)
            )))
        };
        let rr = self.info.link_root_ref(parent_id, dir, name, id)?;
        // Loads the subvolume's root item before anything changes.
        let item = self
            .ctx(id)?
            .root
            .item
            .ok_or_else(|| corrupt("a subvolume with a short root item"))?;
        self.writable(parent_id)?
            .remove_subvolume_link(dir, name, id, rr.index)?;
        let roots = &mut self.info.roots;
        for key in [ref_key, Key::root_backref(id, parent_id)] {
            self.info
                .forest
                .delete(&mut roots.root, &key)?
                .ok_or_else(|| corrupt(&format!("no {key}")))?;
        }
        self.info
            .forest
            .insert(&mut roots.root, Key::orphan_root(id), Vec::new())?;
        // Deleted from here on: the seal writes its root item with refs 0
        // whether it goes to the cleaner now or stays loaded for the
        // inodes a front end holds (btrfs orphans the root the same way
        // and adds it to the dead roots when its last inode is evicted).
        let root = self.subvols.others.get_mut(&id).ok_or(Error::NotFound)?;
        root.item = Some(SubvolRootItem {
            refs: 0,
            drop_progress: Key::MIN,
            ..item
        });
        // A log of this transaction would copy the parent directory
        // without the link while the ROOT_REF pair stayed: fsyncs commit
        // until the next commit (seed 000's snapshot-destroy rule).
        self.info.log.force_commit = Some(FallbackReason::Subvolume);
        self.retire_if_unheld(id)?;
        Ok(id)
    }

    /// Hands deleted subvolume `id` to the cleaner once no inode of it is
    /// held (at the delete, or at the release or forget of its last held
    /// inode; docs/SNAPSHOTS.md (d) step 3); a live or still-held root,
    /// or one no longer loaded, stays as it is. What its delayed items
    /// hold goes into its tree first, so the dead tree is whole for
    /// `birch check` until the cleaner releases it; its dirty pages and
    /// cached inodes go (nothing can reach them now, and the dead tree
    /// must not change under the cleaner).
    pub(super) fn retire_if_unheld(&mut self, id: u64) -> Result<()> {
        let Some(root) = self.subvols.others.get(&id) else {
            return Ok(());
        };
        if !root.is_deleted() || root.is_held() {
            return Ok(());
        }
        let mut child = self.ctx(id)?;
        child.flush_delayed_items()?;
        // Its dirty pages would be written into a tree being dropped, and
        // the queue would name a root that no longer resolves: they go
        // now, with their reservations (as an unlinked inode's do).
        let mut queued_inodes = child.fs.space.dirty_inodes();
        queued_inodes.extend(child.fs.writebacks.inodes());
        for queued in queued_inodes {
            let (root_id, ino) = InoSpace::split(queued);
            if root_id == id {
                child.discard_dirty_pages(ino)?;
            }
        }
        let root = self.subvols.others.remove(&id).ok_or(Error::NotFound)?;
        let item = root.item.ok_or(Error::NotFound)?;
        self.subvols.dead.insert(
            id,
            DeadRoot {
                tree: root.tree,
                item,
            },
        );
        Ok(())
    }

    /// Whether `name` in directory `parent` (external) is a subvolume link.
    pub(super) fn is_subvolume_link(&mut self, parent: u64, name: &[u8]) -> bool {
        matches!(
            self.resolve(parent).and_then(|(mut ctx, dir)| ctx.find_entry(dir, name)),
            Ok(Some(e)) if e.subvolume
        )
    }

    /// `rmdir` of a subvolume link: deletes the subvolume when its root
    /// directory is empty (ENOTEMPTY otherwise), as btrfs does since 4.18.
    pub(super) fn rmdir_subvolume(&mut self, parent: u64, name: &[u8]) -> Result<()> {
        let (parent_id, dir) = InoSpace::split(parent);
        let id = self
            .ctx(parent_id)?
            .find_entry(dir, name)?
            .ok_or(Error::NotFound)?
            .ino;
        if !self.ctx(id)?.is_dir_empty(ROOT_DIR_INO)? {
            return Err(Error::NotEmpty);
        }
        self.delete_subvolume(parent, name).map(drop)
    }

    /// Queues every subvolume with an orphan-root item for the cleaner
    /// (at mount): a deletion committed before a crash or unmount resumes
    /// at its recorded progress.
    pub(super) fn queue_orphan_roots(&mut self) -> Result<()> {
        if !self.info.superblock.subvolumes {
            return Ok(());
        }
        let root_tree = self.info.roots.root;
        let orphans = self.info.forest.collect_range(
            &root_tree,
            Key::orphan_root(0),
            Key::orphan_root(u64::MAX),
        )?;
        for (key, _) in orphans {
            let id = key.offset;
            let corrupt = |why: &str| {
                Error::corrupt(Corruption::general(format!(
                    "orphan-root item {key}: {why}"
                )))
            };
            if id == tree_id::FS || !tree_id::is_subvolume(id) {
                return Err(corrupt("names no subvolume id"));
            }
            let item_key = Key::new(id, item_type::ROOT_ITEM, 0);
            let data = self
                .info
                .forest
                .get(&root_tree, &item_key)?
                .ok_or_else(|| corrupt("its subvolume has no root item"))?;
            let record = SubvolRecord::decode(id, &data, true)?;
            let item = record
                .item
                .filter(|i| i.refs == 0)
                .ok_or_else(|| corrupt("its subvolume is live"))?;
            self.subvols.dead.insert(
                id,
                DeadRoot {
                    tree: record.tree,
                    item,
                },
            );
        }
        Ok(())
    }

    /// The deleted subvolumes the cleaner has not finished dropping,
    /// those still held by open inodes included.
    pub(super) fn dead_subvolumes(&self) -> Vec<u64> {
        let held = self.held_deleted_subvolumes();
        let mut ids: Vec<u64> = self.subvols.dead.keys().copied().chain(held).collect();
        ids.sort_unstable();
        ids
    }

    /// The deleted subvolumes still loaded for inodes a front end holds.
    pub(super) fn held_deleted_subvolumes(&self) -> Vec<u64> {
        let held = self.subvols.others.iter();
        held.filter(|(_, root)| root.is_deleted())
            .map(|(&id, _)| id)
            .collect()
    }

    /// The names (directory, name; external numbers) of the held inodes
    /// of deleted subvolume `id`, its root directory left out (its link
    /// is gone already); empty for any other subvolume.
    pub(super) fn held_names_in_deleted(&mut self, id: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        let held: Vec<u64> = match self.subvols.others.get(&id) {
            Some(root) if root.is_deleted() => root
                .inodes
                .iter()
                .filter(|&(&ino, inode)| inode.open_count > 0 && ino != ROOT_DIR_INO)
                .map(|(&ino, _)| ino)
                .collect(),
            _ => return Ok(Vec::new()),
        };
        let ctx = self.ctx(id)?;
        let mut names = Vec::new();
        for ino in held {
            for (dir, name) in ctx.names_of(ino)? {
                names.push((InoSpace::join(id, dir), name));
            }
        }
        Ok(names)
    }

    /// Releases up to `budget` nodes of the front dead root: its progress
    /// moves in its root item, or, when its last node is freed, its root
    /// item and orphan-root item are deleted (in this transaction, with
    /// the frees). Returns the root worked on; None when none is left.
    fn clean_step(&mut self, budget: usize) -> Result<Option<u64>> {
        let Some((&id, dead)) = self.subvols.dead.iter_mut().next() else {
            return Ok(None);
        };
        let step = self
            .info
            .forest
            .drop_tree_step(&dead.tree, dead.item.drop_progress, budget)?;
        match step {
            DropStep::Paused(progress) => dead.item.drop_progress = progress,
            DropStep::Done => {
                self.subvols.dead.remove(&id);
                let roots = &mut self.info.roots;
                for key in [Key::new(id, item_type::ROOT_ITEM, 0), Key::orphan_root(id)] {
                    // A subvolume created and deleted in this transaction
                    // has no root item in the tree yet.
                    self.info.forest.delete(&mut roots.root, &key)?;
                }
            }
        }
        Ok(Some(id))
    }
}

impl<D: BlockDevice> FsInfo<D> {
    /// The ROOT_REF of the link `name` to subvolume `id` in directory
    /// `dir` of subvolume `parent_id`: missing, undecodable or naming
    /// another link, it is corruption (the directory entry says the link
    /// is there).
    pub(super) fn link_root_ref(
        &self,
        parent_id: u64,
        dir: u64,
        name: &[u8],
        id: u64,
    ) -> Result<RootRef> {
        let ref_key = Key::root_ref(parent_id, id);
        let corrupt = |why: String| {
            Error::corrupt(Corruption::general(format!(
                "subvolume link \"{}\" in {parent_id}:{dir}: {why}",
                String::from_utf8_lossy(name)
            )))
        };
        let data = self
            .forest
            .get(&self.roots.root, &ref_key)?
            .ok_or_else(|| corrupt(format!("no {ref_key}")))?;
        let rr = decode_item(&ref_key, RootRef::decode(&data))?;
        if rr.dirid != dir || rr.name != name {
            return Err(corrupt(format!("{ref_key} names another link")));
        }
        Ok(rr)
    }
}

impl<D: BlockDevice> Shared<D> {
    /// Runs the cleaner for one transaction: steps of at most
    /// `DROP_NODES_PER_HOLD` nodes, each in its own hold of the state lock
    /// (requests and commits wait for one step at most), until
    /// `cleaner_nodes_per_transaction` are spent or no dead root is left;
    /// then commits, which makes the frees and the progress durable
    /// together. Returns whether dead roots remain. Does nothing on a
    /// read-only or failed filesystem.
    pub(super) fn clean_one_transaction(&self) -> Result<bool> {
        let mut left = self
            .lock_state()
            .info
            .options
            .cleaner_nodes_per_transaction
            .max(1);
        let mut worked = false;
        while left > 0 {
            let budget = left.min(DROP_NODES_PER_HOLD);
            {
                let mut state = self.lock_state();
                if state.info.failed.is_some() || state.info.options.read_only {
                    return Ok(false);
                }
                let step = state.clean_step(budget);
                state.fail_on_device_error(&step);
                if step?.is_none() {
                    break;
                }
                self.space_changed(&mut state);
            }
            worked = true;
            left -= budget;
            std::thread::yield_now();
        }
        if worked {
            self.commit()?;
        }
        Ok(!self.lock_state().subvols.dead.is_empty())
    }
}

impl<D: BlockDevice> RootCtx<'_, D> {
    /// Removes the link entry of subvolume `child` (dir index `index`)
    /// from directory `dir`: the DIR_ITEM now, the DIR_INDEX delayed, the
    /// directory's size and link count. Not logged (a log never holds a
    /// link; the caller forces fsyncs to commit).
    pub(super) fn remove_subvolume_link(
        &mut self,
        dir: u64,
        name: &[u8],
        child: u64,
        index: u64,
    ) -> Result<()> {
        self.remove_dir_item(dir, name)?.ok_or(Error::NotFound)?;
        self.root.delayed.delete_index(dir, index, child, name);
        let now = Timespec::now();
        self.update_link_counts(dir, name, false, Some(now))
    }
}
