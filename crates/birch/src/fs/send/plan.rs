//! What changed between the parent and the snapshot, inode by inode, and
//! the receiver's namespace as the stream changes it (docs/SEND.md
//! "Design: send", 1 and 2): the inodes the tree comparison found, each
//! as the parent and the snapshot have it, and the model that turns an
//! inode into the path the receiver knows it by at each command.

use super::super::decode::decode_item;
use super::tree::{compare_trees, items_in, NodeReader};
use crate::btree::TreeRoot;
use crate::error::{Corruption, Error, Result};
use crate::format::{
    decode_dir_items, decode_inode_extrefs, decode_inode_refs, item_type, name_hash, DirEntry,
    FileType, InodeItem, Key, ORPHAN_OBJECTID, ROOT_DIR_INO,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// An inode of the send: its number, and whether it is the parent tree's
/// inode of a number the snapshot reuses with a new generation (a deleted
/// inode beside the created one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Ent {
    pub ino: u64,
    pub previous: bool,
}

impl Ent {
    pub(crate) const ROOT: Ent = Ent {
        ino: ROOT_DIR_INO,
        previous: false,
    };

    fn now(ino: u64) -> Ent {
        Ent {
            ino,
            previous: false,
        }
    }
}

/// An inode as one tree has it: its item and its names (parent, name).
#[derive(Debug, Clone)]
pub(crate) struct InodeState {
    pub item: InodeItem,
    pub names: Vec<(u64, Vec<u8>)>,
}

impl InodeState {
    pub(crate) fn file_type(&self) -> FileType {
        self.item.file_type()
    }
}

/// One inode the stream handles: as the parent has it (`None`: created,
/// or the root directory of a full send) and as the snapshot has it
/// (`None`: deleted).
#[derive(Debug)]
pub(crate) struct Entity {
    pub old: Option<InodeState>,
    pub new: Option<InodeState>,
}

impl Entity {
    /// Whether the receiver has it when the stream starts.
    pub(crate) fn existed(&self, ent: Ent) -> bool {
        self.old.is_some() || ent == Ent::ROOT
    }
}

/// The two trees, read through one counting reader.
pub(crate) struct Trees<'a> {
    pub reader: NodeReader<'a>,
    pub new: TreeRoot,
    pub old: Option<TreeRoot>,
}

impl Trees<'_> {
    fn tree(&self, old: bool) -> Option<TreeRoot> {
        if old {
            self.old
        } else {
            Some(self.new)
        }
    }

    /// Items of inode `ino` of type `ty` in the old or new tree.
    pub(crate) fn items(&mut self, old: bool, ino: u64, ty: u8) -> Result<Vec<(Key, Vec<u8>)>> {
        let Some(root) = self.tree(old) else {
            return Ok(Vec::new());
        };
        items_in(
            &mut self.reader,
            &root,
            Key::new(ino, ty, 0),
            Key::new(ino, ty, u64::MAX),
        )
    }

    /// Inode `ino` as the old or new tree has it; `None` when it is not
    /// there or has no name (a directory other than the root always has
    /// one; an inode kept only by an orphan item is not sent).
    pub(crate) fn inode(&mut self, old: bool, ino: u64) -> Result<Option<InodeState>> {
        let Some(root) = self.tree(old) else {
            return Ok(None);
        };
        let items = items_in(
            &mut self.reader,
            &root,
            Key::new(ino, item_type::INODE_ITEM, 0),
            Key::new(ino, item_type::INODE_EXTREF, u64::MAX),
        )?;
        let mut item = None;
        let mut names = Vec::new();
        for (key, data) in &items {
            match key.item_type {
                item_type::INODE_ITEM => item = Some(decode_item(key, InodeItem::decode(data))?),
                item_type::INODE_REF if ino != ROOT_DIR_INO => {
                    for r in decode_item(key, decode_inode_refs(data))? {
                        names.push((key.offset, r.name));
                    }
                }
                item_type::INODE_EXTREF if ino != ROOT_DIR_INO => {
                    for r in decode_item(key, decode_inode_extrefs(data))? {
                        names.push((r.parent, r.name));
                    }
                }
                _ => {}
            }
        }
        let Some(item) = item else {
            return Ok(None);
        };
        if crate::format::FileType::from_mode(item.mode).is_none() {
            return Err(Error::corrupt(Corruption::general(format!(
                "inode {ino}: mode {:o} has no file type",
                item.mode
            ))));
        }
        if names.is_empty() && ino != ROOT_DIR_INO {
            return Ok(None);
        }
        Ok(Some(InodeState { item, names }))
    }

    /// The entries of directory `dir` in the old or new tree (subvolume
    /// links left out: send skips them, as btrfs's does).
    fn dir_entries(&mut self, old: bool, dir: u64) -> Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        for (key, data) in self.items(old, dir, item_type::DIR_INDEX)? {
            let entry = decode_item(&key, DirEntry::decode(&data))?;
            if !entry.subvolume {
                out.push(entry);
            }
        }
        Ok(out)
    }

    /// The entry `name` of directory `dir` in the old or new tree.
    pub(crate) fn find_entry(
        &mut self,
        old: bool,
        dir: u64,
        name: &[u8],
    ) -> Result<Option<DirEntry>> {
        let Some(root) = self.tree(old) else {
            return Ok(None);
        };
        let key = Key::new(dir, item_type::DIR_ITEM, name_hash(name));
        for (key, data) in items_in(&mut self.reader, &root, key, key)? {
            if let Some(e) = decode_item(&key, decode_dir_items(&data))?
                .into_iter()
                .find(|e| e.name == name)
            {
                return Ok(Some(e));
            }
        }
        Ok(None)
    }

    /// Whether the root directory of the old or new tree has `name`.
    fn root_has(&mut self, old: bool, name: &[u8]) -> Result<bool> {
        Ok(self.find_entry(old, ROOT_DIR_INO, name)?.is_some())
    }
}

/// Every inode whose items differ between the two trees, each with its
/// two states; an inode number reused with a new generation is two
/// entities (the old one deleted, the new one created), and every entry
/// of such a directory in either tree is an entity too (its items may be
/// the same while its parent is not).
pub(crate) fn changed_entities(trees: &mut Trees) -> Result<BTreeMap<Ent, Entity>> {
    let mut inos = BTreeSet::new();
    let (new, old) = (trees.new, trees.old);
    compare_trees(&mut trees.reader, &new, old.as_ref(), &mut |key| {
        if key.objectid >= ROOT_DIR_INO && key.objectid < ORPHAN_OBJECTID {
            inos.insert(key.objectid);
        }
        Ok(())
    })?;
    let mut work: Vec<u64> = inos.iter().rev().copied().collect();
    let mut seen: HashSet<u64> = inos.into_iter().collect();
    let mut out = BTreeMap::new();
    while let Some(ino) = work.pop() {
        let old = trees.inode(true, ino)?;
        let new = trees.inode(false, ino)?;
        let mut add_entries = |trees: &mut Trees, old_tree: bool| -> Result<()> {
            for e in trees.dir_entries(old_tree, ino)? {
                if seen.insert(e.ino) {
                    work.push(e.ino);
                }
            }
            Ok(())
        };
        match (old, new) {
            (Some(o), Some(n)) if o.item.generation != n.item.generation => {
                if o.file_type() == FileType::Directory {
                    add_entries(trees, true)?;
                }
                if n.file_type() == FileType::Directory {
                    add_entries(trees, false)?;
                }
                out.insert(
                    Ent {
                        ino,
                        previous: true,
                    },
                    Entity {
                        old: Some(o),
                        new: None,
                    },
                );
                out.insert(
                    Ent::now(ino),
                    Entity {
                        old: None,
                        new: Some(n),
                    },
                );
            }
            (None, None) => {}
            (old, new) => {
                out.insert(Ent::now(ino), Entity { old, new });
            }
        }
    }
    Ok(out)
}

/// The receiver's namespace while the stream changes it: the current
/// names of every entity the stream touches; an inode it does not touch
/// has its names of the parent tree (the same in the snapshot).
pub(crate) struct Model {
    /// Inode numbers the snapshot reuses: a parent-tree name's parent
    /// with such a number is the previous entity.
    reused: HashSet<u64>,
    current: HashMap<Ent, Vec<(Ent, Vec<u8>)>>,
    /// The parent-tree name of untouched directories, as looked up.
    untouched: HashMap<u64, (Ent, Vec<u8>)>,
    /// Orphan names in use, and the entity holding each.
    pub orphans: HashMap<Vec<u8>, Ent>,
}

impl Model {
    pub(crate) fn new(entities: &BTreeMap<Ent, Entity>) -> Model {
        let reused: HashSet<u64> = entities
            .keys()
            .filter(|e| e.previous)
            .map(|e| e.ino)
            .collect();
        let mut model = Model {
            reused,
            current: HashMap::new(),
            untouched: HashMap::new(),
            orphans: HashMap::new(),
        };
        for (&ent, entity) in entities {
            if let Some(old) = &entity.old {
                let names = old
                    .names
                    .iter()
                    .map(|(p, n)| (model.old_parent(*p), n.clone()))
                    .collect();
                model.current.insert(ent, names);
            } else {
                model.current.insert(ent, Vec::new());
            }
        }
        model
    }

    /// The entity a parent-tree name's parent number stands for.
    pub(crate) fn old_parent(&self, ino: u64) -> Ent {
        Ent {
            ino,
            previous: self.reused.contains(&ino),
        }
    }

    /// The entity a snapshot name's parent number stands for.
    pub(crate) fn new_parent(&self, ino: u64) -> Ent {
        Ent::now(ino)
    }

    /// The current names of a touched entity.
    pub(crate) fn names(&self, ent: Ent) -> &[(Ent, Vec<u8>)] {
        self.current.get(&ent).map_or(&[], |v| v.as_slice())
    }

    pub(crate) fn add_name(&mut self, ent: Ent, parent: Ent, name: Vec<u8>) {
        self.current.entry(ent).or_default().push((parent, name));
    }

    pub(crate) fn remove_name(&mut self, ent: Ent, parent: Ent, name: &[u8]) {
        if let Some(names) = self.current.get_mut(&ent) {
            names.retain(|(p, n)| !(*p == parent && n == name));
        }
    }

    /// One current name of `ent` (its first).
    fn first_name(&mut self, trees: &mut Trees, ent: Ent) -> Result<(Ent, Vec<u8>)> {
        if let Some(names) = self.current.get(&ent) {
            return names.first().cloned().ok_or_else(|| {
                Error::corrupt(Corruption::general(format!(
                    "send: inode {} has no name at this point of the stream",
                    ent.ino
                )))
            });
        }
        if let Some(found) = self.untouched.get(&ent.ino) {
            return Ok(found.clone());
        }
        let state = trees.inode(true, ent.ino)?.ok_or_else(|| {
            Error::corrupt(Corruption::general(format!(
                "send: inode {} is named by a path but is in neither tree",
                ent.ino
            )))
        })?;
        let (parent, name) = state.names[0].clone();
        let found = (self.old_parent(parent), name);
        self.untouched.insert(ent.ino, found.clone());
        Ok(found)
    }

    /// Whether `ent` is `ancestor` or below it at the receiver now.
    pub(crate) fn is_within(&mut self, trees: &mut Trees, ent: Ent, ancestor: Ent) -> Result<bool> {
        let mut at = ent;
        for _ in 0..=crate::format::send_stream::MAX_PATH_LEN {
            if at == ancestor {
                return Ok(true);
            }
            if at == Ent::ROOT {
                return Ok(false);
            }
            at = self.first_name(trees, at)?.0;
        }
        Err(Error::corrupt(Corruption::general(format!(
            "send: the names above inode {} form a cycle",
            ent.ino
        ))))
    }

    /// Whether `(parent, name)` is free at the receiver now: a directory
    /// of the parent tree whose entry `name` is gone or was never there.
    /// Only asked for a parent that existed (not a previous entity).
    pub(crate) fn is_free(&mut self, trees: &mut Trees, parent: Ent, name: &[u8]) -> Result<bool> {
        let Some(entry) = trees.find_entry(true, parent.ino, name)? else {
            return Ok(true);
        };
        if entry.subvolume {
            // Send skips links: the receiver never had it.
            return Ok(true);
        }
        let holder = self.old_parent(entry.ino);
        Ok(self
            .current
            .get(&holder)
            .is_some_and(|names| !names.iter().any(|(p, n)| *p == parent && n == name)))
    }

    /// The path of `ent` at the receiver now ("" for the root).
    pub(crate) fn path(&mut self, trees: &mut Trees, ent: Ent) -> Result<Vec<u8>> {
        let mut parts = Vec::new();
        let mut at = ent;
        while at != Ent::ROOT {
            let (parent, name) = self.first_name(trees, at)?;
            parts.push(name);
            at = parent;
            if parts.len() > crate::format::send_stream::MAX_PATH_LEN {
                return Err(Error::corrupt(Corruption::general(format!(
                    "send: the names above inode {} form a cycle",
                    ent.ino
                ))));
            }
        }
        parts.reverse();
        Ok(parts.join(&b'/'))
    }

    /// `path(parent)/name`.
    pub(crate) fn child_path(
        &mut self,
        trees: &mut Trees,
        parent: Ent,
        name: &[u8],
    ) -> Result<Vec<u8>> {
        let mut path = self.path(trees, parent)?;
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(name);
        Ok(path)
    }

    /// A name `o<ino>-<gen>-<n>` for `ent` in the root directory that
    /// neither tree's root has and no other orphan holds.
    pub(crate) fn orphan_name(
        &mut self,
        trees: &mut Trees,
        ent: Ent,
        generation: u64,
    ) -> Result<Vec<u8>> {
        for n in 0u64.. {
            let name = format!("o{}-{}-{n}", ent.ino, generation).into_bytes();
            if !self.orphans.contains_key(&name)
                && !trees.root_has(true, &name)?
                && !trees.root_has(false, &name)?
            {
                self.orphans.insert(name.clone(), ent);
                return Ok(name);
            }
        }
        unreachable!("u64 orphan counters run out")
    }
}
