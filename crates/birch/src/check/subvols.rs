//! Pass `subvolumes`: the root tree's subvolume items against each other
//! and against the links in the subvolume trees (docs/SNAPSHOTS.md (h),
//! S5, S6, S8, S9; S10's log rules are checked while the log trees are
//! walked). The walk collects the records ([`SubvolRecords`]); this pass
//! only compares them.
//!
//! Each subvolume tree's links are compared here; its namespace, link
//! counts and file extents (S7) are checked by the `namespace`, `nlink`
//! and `file-extents` passes, one tree at a time.

use super::{Checker, FaultId, Loc, PassStatus};
use crate::format::{
    item_type, tree_id, tree_name, DirEntry, FileType, Key, RootRef, SubvolRootItem, Superblock,
    DEFAULT_SUBVOL_NAME,
};
use crate::print::name;
use std::collections::{BTreeMap, HashMap, HashSet};

/// A subvolume link: a `SUBVOL_LINK` entry of a DIR_ITEM or DIR_INDEX in
/// a subvolume tree.
#[derive(Debug, Clone)]
pub(crate) struct LinkRec {
    /// The tree holding the link (the parent subvolume).
    pub tree: u64,
    pub dir: u64,
    /// The DIR_INDEX index; None for a DIR_ITEM entry.
    pub index: Option<u64>,
    /// The subvolume it names.
    pub subvol: u64,
    pub name: Vec<u8>,
    pub loc: Loc,
}

/// What the walk keeps of the subvolume items.
#[derive(Debug, Default)]
pub(crate) struct SubvolRecords {
    /// Every ROOT_ITEM of the root tree, by id: its long form, or None
    /// for the short one.
    pub root_items: BTreeMap<u64, (Option<SubvolRootItem>, Loc)>,
    /// `(parent, child)` -> the ROOT_REF payload.
    pub refs: BTreeMap<(u64, u64), (RootRef, Loc)>,
    /// `(child, parent)` -> the ROOT_BACKREF payload.
    pub backrefs: BTreeMap<(u64, u64), (RootRef, Loc)>,
    /// Orphan-root items of the root tree: dead subvolume id -> where.
    pub orphan_roots: BTreeMap<u64, Loc>,
    /// The default-subvolume item's entries, and where.
    pub default: Option<(Vec<DirEntry>, Loc)>,
    pub links: Vec<LinkRec>,
}

impl SubvolRecords {
    /// Whether `id` is a live subvolume: 5, or a root item with refs 1
    /// (a short one, itself a fault, counts as live so that its links are
    /// not reported again).
    pub fn is_live(&self, id: u64) -> bool {
        id == tree_id::FS
            || (tree_id::is_subvolume(id)
                && match self.root_items.get(&id) {
                    Some((Some(r), _)) => r.refs == 1,
                    Some((None, _)) => true,
                    None => false,
                })
    }
}

/// `(dir, name)` of every link in `tree`, each counted once (a link has a
/// DIR_ITEM and a DIR_INDEX entry).
pub(crate) fn link_names(links: &[LinkRec], tree: u64) -> HashSet<(u64, &[u8])> {
    links
        .iter()
        .filter(|l| l.tree == tree)
        .map(|l| (l.dir, &l.name[..]))
        .collect()
}

impl Checker<'_> {
    /// A root-tree DIR_ITEM: only the default-subvolume item, one entry
    /// named `default` of type directory.
    pub(super) fn record_default_subvol(&mut self, loc: &Loc, entries: Vec<DirEntry>) {
        let well_formed = loc.key == Key::default_subvol()
            && entries.len() == 1
            && entries[0].name == DEFAULT_SUBVOL_NAME
            && entries[0].file_type == FileType::Directory
            && !entries[0].subvolume;
        if !well_formed {
            return self.fault_at(
                FaultId::DefaultSubvolMalformed,
                loc,
                format!(
                    "the root tree's only DIR_ITEM is {} with one directory entry named \"default\"",
                    Key::default_subvol()
                ),
            );
        }
        self.subvols.default = Some((entries, *loc));
    }

    /// A subvolume link entry found at `loc` (a subvolume tree's, kept
    /// for the pass; a log tree's is a fault, S10: links are never
    /// logged).
    pub(super) fn record_link(&mut self, loc: &Loc, index: Option<u64>, e: DirEntry) {
        if Self::is_log_tree(loc.tree) {
            return self.fault_at(
                FaultId::LogSubvolumeLink,
                loc,
                format!(
                    "log tree holds the subvolume link \"{}\" -> {} (links are never logged)",
                    name(&e.name),
                    tree_name(e.ino)
                ),
            );
        }
        self.subvols.links.push(LinkRec {
            tree: loc.tree,
            dir: loc.key.objectid,
            index,
            subvol: e.ino,
            name: e.name,
            loc: *loc,
        });
    }
}

/// Pass `subvolumes`: one function per invariant.
pub(super) fn run(c: &mut Checker<'_>) -> PassStatus {
    let Some(sb) = c.sb.clone() else {
        return PassStatus::Skipped("no valid superblock".into());
    };
    if !c.tree_readable(tree_id::ROOT) {
        return PassStatus::Skipped("the root tree could not be read".into());
    }
    let recs = std::mem::take(&mut c.subvols);
    if sb.subvolumes {
        c.report.summary.deleted_subvolumes = recs
            .root_items
            .iter()
            .filter_map(|(&id, (long, _))| {
                long.filter(|r| r.refs == 0).map(|r| (id, r.drop_progress))
            })
            .collect();
        check_root_items(c, &sb, &recs);
        check_ids_in_range(c, &recs);
        check_orphan_roots(c, &recs);
        check_root_ref_pairs(c, &recs);
        check_links(c, &recs);
        check_no_cycle(c, &recs);
        check_default(c, &recs);
    } else {
        check_without_flag(c, &recs);
    }
    c.subvols = recs;
    PassStatus::Ran
}

/// Without `INCOMPAT_SUBVOLUMES` the image is as every birch before it
/// wrote: tree 5 alone, short root items, no subvolume item.
fn check_without_flag(c: &mut Checker<'_>, recs: &SubvolRecords) {
    let mut found: Vec<(Loc, String)> = Vec::new();
    for (&id, (long, loc)) in &recs.root_items {
        if long.is_some() {
            found.push((*loc, format!("long root item of {}", tree_name(id))));
        } else if tree_id::is_subvolume(id) && id != tree_id::FS {
            found.push((*loc, format!("root item of {}", tree_name(id))));
        }
    }
    let pairs = recs.refs.values().chain(recs.backrefs.values());
    found.extend(pairs.map(|(_, loc)| (*loc, "root reference".to_string())));
    found.extend(
        recs.orphan_roots
            .values()
            .map(|loc| (*loc, "orphan-root item".to_string())),
    );
    found.extend(
        recs.default
            .iter()
            .map(|(_, loc)| (*loc, "default-subvolume item".to_string())),
    );
    found.extend(recs.links.iter().map(|l| {
        let what = format!("subvolume link \"{}\"", name(&l.name));
        (l.loc, what)
    }));
    for (loc, what) in found {
        c.fault_at(
            FaultId::SubvolWithoutFlag,
            &loc,
            format!("{what} on an image without INCOMPAT_SUBVOLUMES"),
        );
    }
}

/// S8: every subvolume's root item is long, its fields agree with each
/// other and with the superblock, uuids are unique; only subvolumes have
/// long items.
fn check_root_items(c: &mut Checker<'_>, sb: &Superblock, recs: &SubvolRecords) {
    let mut uuids: HashMap<[u8; 16], u64> = HashMap::new();
    for (&id, (long, loc)) in &recs.root_items {
        let Some(r) = long else {
            if tree_id::is_subvolume(id) {
                c.fault_at(
                    FaultId::RootItemShort,
                    loc,
                    format!(
                        "{} has the short root item; with INCOMPAT_SUBVOLUMES every subvolume has the long one",
                        tree_name(id)
                    ),
                );
            }
            continue;
        };
        if !tree_id::is_subvolume(id) {
            c.fault_at(
                FaultId::RootItemFields,
                loc,
                format!(
                    "{} is not a subvolume: its root item is the short form",
                    tree_name(id)
                ),
            );
            continue;
        }
        for problem in root_item_problems(id, r, sb) {
            c.fault_at(FaultId::RootItemFields, loc, problem);
        }
        if r.uuid != [0; 16] {
            if let Some(first) = uuids.insert(r.uuid, id) {
                c.fault_at(
                    FaultId::UuidTwice,
                    loc,
                    format!("{} has the uuid of {}", tree_name(id), tree_name(first)),
                );
            }
        }
    }
}

/// What is wrong with the fields of subvolume `id`'s long root item.
fn root_item_problems(id: u64, r: &SubvolRootItem, sb: &Superblock) -> Vec<String> {
    let mut out = Vec::new();
    let g = r.root.generation;
    if !(r.otransid <= r.ctransid && r.ctransid <= g) {
        out.push(format!(
            "otransid {} <= ctransid {} <= generation {g} does not hold",
            r.otransid, r.ctransid
        ));
    }
    if r.last_snapshot > sb.generation {
        out.push(format!(
            "last_snapshot {} is newer than the superblock generation {}",
            r.last_snapshot, sb.generation
        ));
    }
    if r.uuid == [0; 16] {
        out.push("uuid is zero".into());
    }
    if id == tree_id::FS && r.refs != 1 {
        out.push(format!(
            "the top-level subvolume has refs {} (always 1)",
            r.refs
        ));
    }
    if r.refs == 1 && r.drop_progress != Key::MIN {
        out.push(format!(
            "drop progress {} on a live subvolume",
            r.drop_progress
        ));
    }
    out
}

/// S8: every id a subvolume item names is a subvolume id (children,
/// orphans and links: 256..; parents and the default: 5 too).
fn check_ids_in_range(c: &mut Checker<'_>, recs: &SubvolRecords) {
    let child = |id: u64| id != tree_id::FS && tree_id::is_subvolume(id);
    let mut bad: Vec<(Loc, String)> = Vec::new();
    for (&(parent, kid), (_, loc)) in &recs.refs {
        if !tree_id::is_subvolume(parent) || !child(kid) {
            bad.push((*loc, format!("root ref from {parent} to {kid}")));
        }
    }
    for (&(kid, parent), (_, loc)) in &recs.backrefs {
        if !tree_id::is_subvolume(parent) || !child(kid) {
            bad.push((*loc, format!("root backref of {kid} to {parent}")));
        }
    }
    for (&id, loc) in &recs.orphan_roots {
        if !child(id) {
            bad.push((*loc, format!("orphan-root item for {id}")));
        }
    }
    for l in recs.links.iter().filter(|l| !child(l.subvol)) {
        bad.push((
            l.loc,
            format!("subvolume link \"{}\" to {}", name(&l.name), l.subvol),
        ));
    }
    if let Some((entries, loc)) = &recs.default {
        if !tree_id::is_subvolume(entries[0].ino) {
            bad.push((*loc, format!("default subvolume {}", entries[0].ino)));
        }
    }
    for (loc, what) in bad {
        c.fault_at(
            FaultId::SubvolIdOutOfRange,
            &loc,
            format!(
                "{what}: subvolume ids are 5 and {}..={} (256.. for a linked or dead one)",
                tree_id::FIRST_SUBVOL,
                tree_id::LAST_SUBVOL
            ),
        );
    }
}

/// S6: a subvolume is dead (refs 0) exactly when an orphan-root item
/// names it.
fn check_orphan_roots(c: &mut Checker<'_>, recs: &SubvolRecords) {
    for (&id, (long, loc)) in &recs.root_items {
        let Some(r) = long else { continue };
        if id == tree_id::FS || !tree_id::is_subvolume(id) {
            continue;
        }
        match (r.refs, recs.orphan_roots.get(&id)) {
            (0, None) => c.fault_at(
                FaultId::DeadRootWithoutOrphan,
                loc,
                format!(
                    "{} is dead (refs 0) but has no orphan-root item {}",
                    tree_name(id),
                    Key::orphan_root(id)
                ),
            ),
            (_, Some(orphan)) if r.refs > 0 => {
                let orphan = *orphan;
                c.fault_at(
                    FaultId::OrphanRootLive,
                    &orphan,
                    format!(
                        "orphan-root item for {}, which is live (refs {})",
                        tree_name(id),
                        r.refs
                    ),
                )
            }
            _ => {}
        }
    }
    for (&id, loc) in &recs.orphan_roots {
        if !recs.root_items.contains_key(&id) {
            c.fault_at(
                FaultId::OrphanRootDangling,
                loc,
                format!("orphan-root item for {id}, which has no root item"),
            );
        }
    }
}

/// S5: each ROOT_REF has its ROOT_BACKREF with the same payload, both
/// between live subvolumes; each live subvolume but 5 has exactly one
/// pair.
fn check_root_ref_pairs(c: &mut Checker<'_>, recs: &SubvolRecords) {
    for (&(parent, kid), (rr, loc)) in &recs.refs {
        match recs.backrefs.get(&(kid, parent)) {
            None => c.fault_key(
                FaultId::RootBackrefMissing,
                tree_id::ROOT,
                Key::root_backref(kid, parent),
                format!(
                    "ROOT_REF {} has no ROOT_BACKREF (found at block {} slot {})",
                    loc.key, loc.block, loc.slot
                ),
            ),
            Some((back, back_loc)) if back != rr => c.fault_at(
                FaultId::RootRefMismatch,
                back_loc,
                format!(
                    "ROOT_BACKREF says dirid {} index {} \"{}\" but its ROOT_REF says dirid {} index {} \"{}\"",
                    back.dirid,
                    back.index,
                    name(&back.name),
                    rr.dirid,
                    rr.index,
                    name(&rr.name)
                ),
            ),
            Some(_) => {}
        }
    }
    for (&(kid, parent), (_, loc)) in &recs.backrefs {
        if !recs.refs.contains_key(&(parent, kid)) {
            c.fault_key(
                FaultId::RootRefMissing,
                tree_id::ROOT,
                Key::root_ref(parent, kid),
                format!(
                    "ROOT_BACKREF {} has no ROOT_REF (found at block {} slot {})",
                    loc.key, loc.block, loc.slot
                ),
            );
        }
    }
    let pairs = recs.refs.iter().map(|(&(p, k), (_, loc))| (p, k, loc));
    let backs = recs.backrefs.iter().map(|(&(k, p), (_, loc))| (p, k, loc));
    let mut dangling: Vec<(Loc, String)> = Vec::new();
    for (parent, kid, loc) in pairs.chain(backs) {
        for (role, id) in [("child", kid), ("parent", parent)] {
            if !recs.is_live(id) {
                let state = if recs.root_items.contains_key(&id) {
                    "is dead"
                } else {
                    "has no root item"
                };
                dangling.push((*loc, format!("root reference whose {role} {id} {state}")));
            }
        }
    }
    for (loc, why) in dangling {
        c.fault_at(FaultId::RootRefDangling, &loc, why);
    }
    let mut parents: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(kid, parent) in recs.backrefs.keys() {
        parents.entry(kid).or_default().push(parent);
    }
    let referenced: HashSet<u64> = recs.refs.keys().map(|&(_, kid)| kid).collect();
    for (&id, (_, loc)) in &recs.root_items {
        if id == tree_id::FS || !recs.is_live(id) {
            continue;
        }
        match parents.get(&id).map_or(0, Vec::len) {
            0 if !referenced.contains(&id) => c.fault_at(
                FaultId::RootRefMissing,
                loc,
                format!(
                    "live {} has no ROOT_REF / ROOT_BACKREF pair: it is linked nowhere",
                    tree_name(id)
                ),
            ),
            n if n > 1 => c.fault_at(
                FaultId::RootRefMismatch,
                loc,
                format!(
                    "{} has {n} ROOT_BACKREFs (a subvolume has one link)",
                    tree_name(id)
                ),
            ),
            _ => {}
        }
    }
}

/// S5: the link entries agree with the pairs: each complete pair has its
/// DIR_ITEM and DIR_INDEX link in the parent, and each link entry is one
/// of a live subvolume's pair.
fn check_links(c: &mut Checker<'_>, recs: &SubvolRecords) {
    let mut dir_items: HashSet<(u64, u64, &[u8], u64)> = HashSet::new();
    let mut dir_index: HashSet<(u64, u64, u64, &[u8], u64)> = HashSet::new();
    for l in &recs.links {
        match l.index {
            None => dir_items.insert((l.tree, l.dir, &l.name, l.subvol)),
            Some(index) => dir_index.insert((l.tree, l.dir, index, &l.name, l.subvol)),
        };
    }
    for (&(parent, kid), (rr, loc)) in &recs.refs {
        let complete = recs
            .backrefs
            .get(&(kid, parent))
            .is_some_and(|(b, _)| b == rr);
        if !complete || !recs.is_live(kid) || !recs.is_live(parent) {
            continue;
        }
        let missing = [
            (
                !dir_items.contains(&(parent, rr.dirid, &rr.name[..], kid)),
                Key::new(
                    rr.dirid,
                    item_type::DIR_ITEM,
                    crate::format::name_hash(&rr.name),
                ),
            ),
            (
                !dir_index.contains(&(parent, rr.dirid, rr.index, &rr.name[..], kid)),
                Key::new(rr.dirid, item_type::DIR_INDEX, rr.index),
            ),
        ];
        for (_, key) in missing.into_iter().filter(|(m, _)| *m) {
            c.fault_key(
                FaultId::SubvolLinkMissing,
                parent,
                key,
                format!(
                    "no link \"{}\" -> {} in directory {} of {} ({} at block {} slot {})",
                    name(&rr.name),
                    tree_name(kid),
                    rr.dirid,
                    tree_name(parent),
                    loc.key,
                    loc.block,
                    loc.slot
                ),
            );
        }
    }
    for l in &recs.links {
        // Either half names it: a missing or different other half is
        // reported as such, not as a dangling link.
        let names_it = |rr: &RootRef| {
            rr.dirid == l.dir && rr.name == l.name && l.index.is_none_or(|i| i == rr.index)
        };
        let pair = recs
            .refs
            .get(&(l.tree, l.subvol))
            .or_else(|| recs.backrefs.get(&(l.subvol, l.tree)))
            .filter(|(rr, _)| names_it(rr));
        if pair.is_none() || !recs.is_live(l.subvol) {
            c.fault_at(
                FaultId::SubvolLinkDangling,
                &l.loc,
                format!(
                    "subvolume link \"{}\" -> {} is not the link of a live subvolume's ROOT_REF / ROOT_BACKREF pair",
                    name(&l.name),
                    tree_name(l.subvol)
                ),
            );
        }
    }
}

/// S5: following each live subvolume's one back reference leads to 5.
/// Each subvolume is visited once: a walk up stops at one already
/// settled, and the members of a cycle it closes are reported.
fn check_no_cycle(c: &mut Checker<'_>, recs: &SubvolRecords) {
    let mut parent_of: HashMap<u64, Option<u64>> = HashMap::new();
    for &(kid, parent) in recs.backrefs.keys() {
        // Two back references: reported as a mismatch; not followed.
        let entry = parent_of.entry(kid).or_insert(Some(parent));
        if *entry != Some(parent) {
            *entry = None;
        }
    }
    let mut settled: HashSet<u64> = HashSet::new();
    let mut in_cycle: Vec<u64> = Vec::new();
    for &id in recs.root_items.keys() {
        let mut path: Vec<u64> = Vec::new();
        let mut on_path: HashSet<u64> = HashSet::new();
        let mut at = id;
        while !settled.contains(&at) {
            if !on_path.insert(at) {
                let pos = path.iter().position(|&p| p == at).unwrap_or(0);
                in_cycle.extend_from_slice(&path[pos..]);
                break;
            }
            path.push(at);
            match parent_of.get(&at).copied().flatten() {
                Some(p) if p != tree_id::FS => at = p,
                _ => break,
            }
        }
        settled.extend(path);
    }
    in_cycle.sort_unstable();
    for id in in_cycle {
        let Some((_, loc)) = recs.root_items.get(&id) else {
            continue;
        };
        c.fault_at(
            FaultId::SubvolLinkCycle,
            loc,
            format!(
                "{} is its own ancestor through its links: it is not reachable from the top level",
                tree_name(id)
            ),
        );
    }
}

/// S9: the default subvolume is live.
fn check_default(c: &mut Checker<'_>, recs: &SubvolRecords) {
    if let Some((entries, loc)) = &recs.default {
        let id = entries[0].ino;
        if tree_id::is_subvolume(id) && !recs.is_live(id) {
            c.fault_at(
                FaultId::DefaultSubvolDangling,
                loc,
                format!("the default subvolume {id} is not a live subvolume"),
            );
        }
    }
}
