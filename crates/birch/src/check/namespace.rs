//! Passes `namespace` and `nlink`: names, reachability, link counts.

use super::subvols::{link_names, LinkRec};
use super::{Checker, FaultId, FsRecords, Loc, PassStatus, RefRec};
use crate::format::{item_type, name_hash, FileType, Key, ORPHAN_OBJECTID, ROOT_DIR_INO};
use crate::print::{file_type_name, name};
use std::collections::{HashMap, HashSet, VecDeque};

/// The subvolume trees to check, or why the pass is skipped.
fn fs_trees(c: &Checker<'_>) -> Result<Vec<u64>, PassStatus> {
    if c.sb.is_none() {
        return Err(PassStatus::Skipped("no valid superblock".into()));
    }
    let trees = c.namespace_trees();
    if trees.is_empty() {
        return Err(PassStatus::Skipped("the fs tree could not be read".into()));
    }
    Ok(trees)
}

/// Runs `check` on the records of each live, readable subvolume tree
/// (S7): each tree is a namespace of its own.
pub(super) fn for_each_fs_tree(
    c: &mut Checker<'_>,
    check: impl Fn(&mut Checker<'_>, &FsRecords),
) -> PassStatus {
    let trees = match fs_trees(c) {
        Ok(trees) => trees,
        Err(skip) => return skip,
    };
    for tree in trees {
        let fs = c.fs.remove(&tree).unwrap_or_else(|| FsRecords {
            tree,
            ..FsRecords::default()
        });
        check(c, &fs);
        c.fs.insert(tree, fs);
    }
    PassStatus::Ran
}

/// Is this ref the root directory's name for itself?
fn is_root_self_ref(ino: u64, parent: u64) -> bool {
    ino == ROOT_DIR_INO && parent == ROOT_DIR_INO
}

/// The file type of inode `ino`, if it exists and has a valid mode.
fn file_type(fs: &FsRecords, ino: u64) -> Option<FileType> {
    fs.inodes
        .get(&ino)
        .and_then(|r| FileType::from_mode(r.item.mode))
}

/// `(ino, parent, name) -> index` of every INODE_REF name but the root
/// directory's own.
type NamesByRef<'a> = HashMap<(u64, u64, &'a [u8]), u64>;

/// Pass `namespace`: one function per invariant, in this order.
pub(super) fn run_namespace(c: &mut Checker<'_>) -> PassStatus {
    for_each_fs_tree(c, |c, fs| {
        count_names(c, fs);
        check_root_dir(c, fs);
        let by_name = check_refs_have_entries(c, fs);
        check_entries_have_refs(c, fs, &by_name);
        check_dir_sizes(c, fs);
        check_reachable(c, fs);
        check_items_have_inodes(c, fs);
    })
}

/// The summary's inode and name counts.
fn count_names(c: &mut Checker<'_>, fs: &FsRecords) {
    {
        let s = &mut c.report.summary;
        s.inodes += fs.inodes.len() as u64;
        for r in fs.inodes.values() {
            match FileType::from_mode(r.item.mode) {
                Some(FileType::Directory) => s.directories += 1,
                Some(FileType::Regular) => s.regular_files += 1,
                Some(FileType::Symlink) => s.symlinks += 1,
                _ => s.special_files += 1,
            }
        }
        s.names += fs
            .refs
            .iter()
            .filter(|r| !is_root_self_ref(r.ino, r.parent))
            .count() as u64;
    }
}

/// The root directory exists, is a directory, and its only name is index
/// 0 `..` in itself.
fn check_root_dir(c: &mut Checker<'_>, fs: &FsRecords) {
    let ftype = |ino: u64| file_type(fs, ino);
    match fs.inodes.get(&ROOT_DIR_INO) {
        None => c.fault_key(
            FaultId::RootDirMissing,
            fs.tree,
            Key::new(ROOT_DIR_INO, item_type::INODE_ITEM, 0),
            "the root directory inode is missing",
        ),
        Some(r) if ftype(ROOT_DIR_INO) != Some(FileType::Directory) => {
            let loc = r.loc;
            c.fault_at(
                FaultId::RootDirNotDirectory,
                &loc,
                format!(
                    "the root directory is a {}, not a directory",
                    ftype(ROOT_DIR_INO).map_or("?", file_type_name)
                ),
            );
        }
        Some(_) => {}
    }
    let root_refs: Vec<_> = fs.refs.iter().filter(|r| r.ino == ROOT_DIR_INO).collect();
    let self_ref_ok = root_refs.len() == 1
        && root_refs[0].parent == ROOT_DIR_INO
        && root_refs[0].index == 0
        && root_refs[0].name == b"..";
    if !self_ref_ok {
        if root_refs.is_empty() {
            c.fault_key(
                FaultId::RootDirWithoutRef,
                fs.tree,
                Key::new(ROOT_DIR_INO, item_type::INODE_REF, ROOT_DIR_INO),
                "the root directory has no INODE_REF (index 0 name \"..\")",
            );
        }
        for r in root_refs {
            let loc = r.loc;
            c.fault_at(FaultId::RootDirName, &loc, format!("the root directory's only name must be index 0 \"..\" in itself, found index {} \"{}\" in {}", r.index, name(&r.name), r.parent));
        }
    }
}

/// Every INODE_REF name is unique, in an existing directory, and listed by
/// a matching DIR_ITEM and DIR_INDEX. Returns the names, for the other
/// direction.
fn check_refs_have_entries<'a>(c: &mut Checker<'_>, fs: &'a FsRecords) -> NamesByRef<'a> {
    let mut by_name: NamesByRef<'a> = HashMap::new();
    for r in &fs.refs {
        if r.ino == ROOT_DIR_INO {
            continue;
        }
        if by_name
            .insert((r.ino, r.parent, &r.name), r.index)
            .is_some()
        {
            let loc = r.loc;
            c.fault_at(
                FaultId::NameTwice,
                &loc,
                format!("name \"{}\" listed twice", name(&r.name)),
            );
            continue;
        }
        if !check_ref_parent(c, fs, r) {
            continue;
        }
        check_dir_item_for_ref(c, fs, r);
        check_dir_index_for_ref(c, fs, r);
    }
    by_name
}

/// The parent of an INODE_REF name is an existing directory other than
/// the inode itself.
fn check_ref_parent(c: &mut Checker<'_>, fs: &FsRecords, r: &RefRec) -> bool {
    let ftype = |ino: u64| file_type(fs, ino);
    if r.parent == r.ino {
        let loc = r.loc;
        c.fault_at(
            FaultId::NameInItself,
            &loc,
            format!(
                "inode {} is named \"{}\" inside itself",
                r.ino,
                name(&r.name)
            ),
        );
        return false;
    }
    match ftype(r.parent) {
        Some(FileType::Directory) => {}
        Some(t) => {
            let loc = r.loc;
            c.fault_at(
                FaultId::ParentNotDirectory,
                &loc,
                format!(
                    "parent {} of name \"{}\" is a {}, not a directory",
                    r.parent,
                    name(&r.name),
                    file_type_name(t)
                ),
            );
            return false;
        }
        None => {
            let loc = r.loc;
            c.fault_at(
                FaultId::ParentMissing,
                &loc,
                format!(
                    "parent directory {} of name \"{}\" does not exist",
                    r.parent,
                    name(&r.name)
                ),
            );
            return false;
        }
    }
    true
}

/// Where an INODE_REF is, for faults about the entries it should have.
fn where_ref(r: &RefRec) -> String {
    format!(
        "named by INODE_REF ({} INODE_REF {}) in block {} slot {}",
        r.ino, r.parent, r.loc.block, r.loc.slot
    )
}

/// The DIR_ITEM of an INODE_REF name exists and agrees on inode and type.
fn check_dir_item_for_ref(c: &mut Checker<'_>, fs: &FsRecords, r: &RefRec) {
    let where_ref = where_ref(r);
    let want_type = file_type(fs, r.ino);
    let item_key = Key::new(r.parent, item_type::DIR_ITEM, name_hash(&r.name));
    match fs.dir_items.get(&(r.parent, r.name.clone())) {
        None => c.fault_key(
            FaultId::DirItemMissing,
            fs.tree,
            item_key,
            format!(
                "missing DIR_ITEM for \"{}\" -> inode {} ({where_ref})",
                name(&r.name),
                r.ino
            ),
        ),
        Some(d) => {
            if d.ino != r.ino {
                let loc = d.loc;
                c.fault_at(
                    FaultId::DirItemWrongInode,
                    &loc,
                    format!(
                        "DIR_ITEM \"{}\" names inode {} but inode {} holds that name ({where_ref})",
                        name(&d.name),
                        d.ino,
                        r.ino
                    ),
                );
            } else if want_type.is_some_and(|t| t != d.file_type) {
                let loc = d.loc;
                c.fault_at(
                    FaultId::DirItemWrongType,
                    &loc,
                    format!(
                        "DIR_ITEM \"{}\" says type {} but inode {} is a {}",
                        name(&d.name),
                        file_type_name(d.file_type),
                        r.ino,
                        want_type.map_or("?", file_type_name)
                    ),
                );
            }
        }
    }
}

/// The DIR_INDEX of an INODE_REF name exists and agrees on name, inode and
/// type.
fn check_dir_index_for_ref(c: &mut Checker<'_>, fs: &FsRecords, r: &RefRec) {
    let where_ref = where_ref(r);
    let want_type = file_type(fs, r.ino);
    let index_key = Key::new(r.parent, item_type::DIR_INDEX, r.index);
    match fs.dir_index.get(&(r.parent, r.index)) {
        None => c.fault_key(
            FaultId::DirIndexMissing,
            fs.tree,
            index_key,
            format!(
                "missing DIR_INDEX for \"{}\" -> inode {} ({where_ref})",
                name(&r.name),
                r.ino
            ),
        ),
        Some(d) => {
            if d.ino != r.ino || d.name != r.name {
                let loc = d.loc;
                c.fault_at(FaultId::DirIndexWrongName, &loc, format!("DIR_INDEX names \"{}\" -> inode {} but the INODE_REF says \"{}\" -> inode {} ({where_ref})", name(&d.name), d.ino, name(&r.name), r.ino));
            } else if want_type.is_some_and(|t| t != d.file_type) {
                let loc = d.loc;
                c.fault_at(
                    FaultId::DirIndexWrongType,
                    &loc,
                    format!(
                        "DIR_INDEX \"{}\" says type {} but inode {} is a {}",
                        name(&d.name),
                        file_type_name(d.file_type),
                        r.ino,
                        want_type.map_or("?", file_type_name)
                    ),
                );
            }
        }
    }
}

/// Every DIR_ITEM and DIR_INDEX is named back by an INODE_REF (with the
/// same index) and names an existing inode.
fn check_entries_have_refs(c: &mut Checker<'_>, fs: &FsRecords, by_name: &NamesByRef<'_>) {
    let mut entry_faults: Vec<(Loc, FaultId, String)> = Vec::new();
    for ((parent, _), d) in &fs.dir_items {
        if d.ino == ROOT_DIR_INO || !by_name.contains_key(&(d.ino, *parent, &d.name[..])) {
            entry_faults.push((
                d.loc,
                FaultId::DirItemWithoutRef,
                format!(
                    "DIR_ITEM \"{}\" -> inode {} has no matching INODE_REF ({} INODE_REF {parent})",
                    name(&d.name),
                    d.ino,
                    d.ino
                ),
            ));
        }
        if !fs.inodes.contains_key(&d.ino) {
            entry_faults.push((
                d.loc,
                FaultId::DirItemDangling,
                format!(
                    "DIR_ITEM \"{}\" names inode {}, which does not exist",
                    name(&d.name),
                    d.ino
                ),
            ));
        }
    }
    for ((parent, index), d) in &fs.dir_index {
        match by_name.get(&(d.ino, *parent, &d.name[..])) {
            Some(i) if i == index => {}
            Some(i) => entry_faults.push((d.loc, FaultId::DirIndexWrongIndex, format!("DIR_INDEX \"{}\" -> inode {} but the INODE_REF gives index {i}", name(&d.name), d.ino))),
            None => entry_faults.push((d.loc, FaultId::DirIndexWithoutRef, format!("DIR_INDEX \"{}\" -> inode {} has no matching INODE_REF ({} INODE_REF {parent})", name(&d.name), d.ino, d.ino))),
        }
        if !fs.inodes.contains_key(&d.ino) {
            entry_faults.push((
                d.loc,
                FaultId::DirIndexDangling,
                format!(
                    "DIR_INDEX \"{}\" names inode {}, which does not exist",
                    name(&d.name),
                    d.ino
                ),
            ));
        }
    }
    entry_faults.sort_by_key(|(loc, _, _)| (loc.key, loc.block, loc.slot));
    for (loc, id, reason) in entry_faults {
        c.fault_at(id, &loc, reason);
    }
}

/// Directory sizes: the byte lengths of the names it holds (every name
/// any of INODE_REF, DIR_ITEM, DIR_INDEX or a subvolume link gives it,
/// counted once).
fn check_dir_sizes(c: &mut Checker<'_>, fs: &FsRecords) {
    let links = std::mem::take(&mut c.subvols.links);
    check_dir_sizes_with(c, fs, &links);
    c.subvols.links = links;
}

fn check_dir_sizes_with(c: &mut Checker<'_>, fs: &FsRecords, links: &[LinkRec]) {
    let mut names: HashSet<(u64, &[u8])> = HashSet::new();
    for r in fs
        .refs
        .iter()
        .filter(|r| !is_root_self_ref(r.ino, r.parent))
    {
        names.insert((r.parent, &r.name));
    }
    for (parent, n) in fs.dir_items.keys() {
        names.insert((*parent, n));
    }
    for ((parent, _), d) in &fs.dir_index {
        names.insert((*parent, &d.name));
    }
    // A subvolume link is a name of its directory like any other.
    names.extend(link_names(links, fs.tree));
    let mut dir_bytes: HashMap<u64, u64> = HashMap::new();
    for (parent, n) in names {
        *dir_bytes.entry(parent).or_default() += n.len() as u64;
    }
    for (&ino, r) in &fs.inodes {
        if FileType::from_mode(r.item.mode) == Some(FileType::Directory) {
            let want = dir_bytes.get(&ino).copied().unwrap_or(0);
            if r.item.size != want {
                let loc = r.loc;
                c.fault_at(
                    FaultId::DirSize,
                    &loc,
                    format!(
                        "directory size {} but its names total {want} bytes",
                        r.item.size
                    ),
                );
            }
        }
    }
}

/// Every inode with a link is reachable from the root directory along
/// INODE_REFs (or has an orphan item).
fn check_reachable(c: &mut Checker<'_>, fs: &FsRecords) {
    let ftype = |ino: u64| file_type(fs, ino);
    let mut children: HashMap<u64, Vec<u64>> = HashMap::new();
    for r in fs
        .refs
        .iter()
        .filter(|r| !is_root_self_ref(r.ino, r.parent))
    {
        children.entry(r.parent).or_default().push(r.ino);
    }
    let mut reached: HashSet<u64> = HashSet::new();
    let mut queue = VecDeque::new();
    if fs.inodes.contains_key(&ROOT_DIR_INO) {
        reached.insert(ROOT_DIR_INO);
        queue.push_back(ROOT_DIR_INO);
    }
    while let Some(dir) = queue.pop_front() {
        if ftype(dir) != Some(FileType::Directory) {
            continue;
        }
        for &child in children.get(&dir).map(Vec::as_slice).unwrap_or(&[]) {
            if reached.insert(child) {
                queue.push_back(child);
            }
        }
    }
    let orphaned: HashSet<u64> = fs.orphans.iter().map(|&(ino, _)| ino).collect();
    for (&ino, r) in &fs.inodes {
        if !reached.contains(&ino) && r.item.nlink > 0 && !orphaned.contains(&ino) {
            let loc = r.loc;
            c.fault_at(
                FaultId::InodeUnreachable,
                &loc,
                format!("inode {ino} is not reachable from the root directory"),
            );
        }
    }
}

/// Every item, orphan items included, names an existing inode.
fn check_items_have_inodes(c: &mut Checker<'_>, fs: &FsRecords) {
    for (&objectid, loc) in &fs.objectids {
        if objectid != ORPHAN_OBJECTID && !fs.inodes.contains_key(&objectid) {
            c.fault_at(
                FaultId::ItemsWithoutInode,
                loc,
                format!("items of inode {objectid}, which has no INODE_ITEM"),
            );
        }
    }
    for (ino, loc) in &fs.orphans {
        if !fs.inodes.contains_key(ino) {
            c.fault_at(
                FaultId::OrphanDangling,
                loc,
                format!("orphan item for inode {ino}, which does not exist"),
            );
        }
    }
}

pub(super) fn run_nlink(c: &mut Checker<'_>) -> PassStatus {
    for_each_fs_tree(c, check_nlink)
}

/// Link counts of one subvolume tree's inodes.
fn check_nlink(c: &mut Checker<'_>, fs: &FsRecords) {
    let mut names: HashMap<u64, u64> = HashMap::new();
    let mut subdirs: HashMap<u64, u64> = HashMap::new();
    for r in fs
        .refs
        .iter()
        .filter(|r| !is_root_self_ref(r.ino, r.parent))
    {
        *names.entry(r.ino).or_default() += 1;
        if fs
            .inodes
            .get(&r.ino)
            .and_then(|i| FileType::from_mode(i.item.mode))
            == Some(FileType::Directory)
        {
            *subdirs.entry(r.parent).or_default() += 1;
        }
    }
    // A subvolume link counts as a subdirectory of its directory.
    for (dir, _) in link_names(&c.subvols.links, fs.tree) {
        *subdirs.entry(dir).or_default() += 1;
    }
    let orphaned: HashSet<u64> = fs.orphans.iter().map(|&(ino, _)| ino).collect();
    for (&ino, r) in &fs.inodes {
        let n = names.get(&ino).copied().unwrap_or(0);
        let nlink = u64::from(r.item.nlink);
        let loc = r.loc;
        let is_dir = FileType::from_mode(r.item.mode) == Some(FileType::Directory);
        if is_dir {
            if ino != ROOT_DIR_INO && n > 1 {
                c.fault_at(
                    FaultId::DirNames,
                    &loc,
                    format!("directory has {n} names (a directory has exactly one)"),
                );
            }
            let subs = subdirs.get(&ino).copied().unwrap_or(0);
            let has_name = n > 0 || ino == ROOT_DIR_INO;
            let want = if has_name { 2 + subs } else { 0 };
            if nlink != want {
                c.fault_at(FaultId::DirNlink, &loc, format!("directory nlink {nlink} but it has {} and {subs} subdirector{} (expected {want})", if has_name { "a name" } else { "no name" }, if subs == 1 { "y" } else { "ies" }));
            }
        } else if nlink != n {
            c.fault_at(
                FaultId::Nlink,
                &loc,
                format!(
                    "nlink {nlink} but the inode has {n} name{}",
                    if n == 1 { "" } else { "s" }
                ),
            );
        }
        if nlink == 0 && !orphaned.contains(&ino) {
            c.fault_at(
                FaultId::UnlinkedWithoutOrphan,
                &loc,
                "inode with nlink 0 has no orphan item",
            );
        }
    }
}
