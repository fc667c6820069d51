//! mkfs and open: building an empty filesystem, and loading one.

use super::commit;
use super::info::{FsInfo, Roots};
use super::log_state::LogState;
use super::root::{next_free_ino, Root, SubvolRecord};
use super::space_info::SpaceInfo;
use super::state::FsState;
use super::tree_log;
use super::{
    BackupRootUsed, DataChecksums, FsStats, MetadataCopies, MkfsOptions, MountOptions, Rescue,
};
use crate::alloc::{Allocator, FreeSpace};
use crate::btree::{Forest, NodeExpectation, NodeStore, TreeRoot};
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{
    encode_inode_refs, item_type, tree_id, BackupRoot, ExtentItem, InodeItem, InodeRefEntry,
    ItemType, Key, MetadataProfile, NodeBody, RootItem, Superblock, BACKUP_ROOT_COUNT,
    FIRST_ALLOCATABLE_BYTE, MIN_DEVICE_BYTES, NODE_SIZE, ROOT_DIR_INO, SECTOR_SIZE,
};
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

fn random_fsid() -> [u8; 16] {
    let mut fsid = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut fsid))
        .is_err()
    {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        fsid[..16].copy_from_slice(&nanos.to_le_bytes());
        fsid[0] ^= std::process::id() as u8;
    }
    fsid
}

pub(crate) fn mkfs<D: BlockDevice>(dev: &D, options: &MkfsOptions) -> Result<()> {
    let total_bytes = dev.size_bytes() / SECTOR_SIZE * SECTOR_SIZE;
    if total_bytes < MIN_DEVICE_BYTES {
        return Err(Error::InvalidArgument(
            "device is smaller than the 16 MiB minimum",
        ));
    }
    let fsid = options.fsid.unwrap_or_else(random_fsid);
    let metadata_profile = match options.metadata {
        MetadataCopies::Single => MetadataProfile::Single,
        MetadataCopies::Dup => MetadataProfile::dup_for(total_bytes),
    };
    let mut free = FreeSpace::default();
    free.add(FIRST_ALLOCATABLE_BYTE, total_bytes - FIRST_ALLOCATABLE_BYTE);
    let store = Arc::new(NodeStore::new(dev, fsid, metadata_profile, 64));
    let transid = 1;
    let mut forest = Forest::new(
        store,
        Allocator::new(free, 0, total_bytes, metadata_profile),
        transid,
    )
    .with_tree_kinds(tree_log::tree_kind)
    .with_leaf_refs(tree_log::leaf_data_ref);
    let mut roots = Roots {
        root: forest.create_tree(tree_id::ROOT)?,
        extent: forest.create_tree(tree_id::EXTENT)?,
        csum: match options.data_checksums {
            DataChecksums::On => Some(forest.create_tree(tree_id::CSUM)?),
            DataChecksums::Off => None,
        },
    };
    let mut top = forest.create_tree(tree_id::FS)?;
    let now = crate::format::Timespec::now();
    let root_dir = InodeItem {
        generation: transid,
        transid,
        nlink: 2,
        mode: libc::S_IFDIR | 0o755,
        uid: options.root_owner.0,
        gid: options.root_owner.1,
        atime: now,
        mtime: now,
        ctime: now,
        otime: now,
        ..Default::default()
    };
    forest.insert(
        &mut top,
        Key::new(ROOT_DIR_INO, item_type::INODE_ITEM, 0),
        root_dir.encode(),
    )?;
    forest.insert(
        &mut top,
        Key::new(ROOT_DIR_INO, item_type::INODE_REF, ROOT_DIR_INO),
        encode_inode_refs(&[InodeRefEntry {
            index: 0,
            name: b"..".to_vec(),
        }]),
    )?;
    let template = Superblock {
        fsid,
        generation: 0,
        root_tree_bytenr: 0,
        root_tree_level: 0,
        total_bytes,
        bytes_used: 0,
        log_root_bytenr: 0,
        log_root_level: 0,
        log_generation: 0,
        backup_roots: [BackupRoot::EMPTY; BACKUP_ROOT_COUNT],
        metadata_profile,
        data_checksums: roots.csum.is_some(),
        log_manifest: None,
        subvolumes: false,
        compression: false,
    };
    let top = SubvolRecord {
        tree: top,
        item: None,
    };
    let prepared = commit::seal_transaction(&mut forest, &mut roots, &[top], &template)?;
    commit::write_commit(dev, &prepared)?;
    Ok(())
}

pub(crate) fn open<D: BlockDevice>(dev: Arc<D>, options: MountOptions) -> Result<FsState<D>> {
    let newest = commit::read_superblock(dev.as_ref())?;
    let profile = newest.metadata_profile;
    let store = Arc::new(NodeStore::new(
        dev.clone(),
        newest.fsid,
        profile,
        options.cache_nodes,
    ));
    // A read-write open repairs what its own reads find (the roots, the
    // extent tree scan below); a read-only one only serves the good copy.
    store.set_repair_writes(!options.read_only && dev.writable());
    // The allocator is rebuilt below; reads need none yet. Transactions
    // continue after the newest commit even when an older one is mounted:
    // a generation is never used twice, so a torn superblock write can
    // never leave an abandoned commit and its replacement tied.
    let mut forest = Forest::new(
        store.clone(),
        Allocator::new(FreeSpace::default(), 0, newest.total_bytes, profile),
        newest.generation + 1,
    )
    .with_tree_kinds(tree_log::tree_kind)
    .with_leaf_refs(tree_log::leaf_data_ref);
    let mut options = options;
    let (loaded, superblock, rescue) =
        match load_commit(&forest, &CommitToLoad::newest(&newest), newest.total_bytes) {
            Ok(loaded) => (loaded, newest.clone(), None),
            Err(e) => {
                let Rescue::UseBackupRoot { writable } = options.rescue else {
                    return Err(with_backup_hint(e, &newest));
                };
                let (loaded, superblock, used) = load_backup_root(&forest, &newest, e)?;
                if !writable {
                    options.read_only = true;
                }
                (loaded, superblock, Some(used))
            }
        };
    let mut alloc = Allocator::new(
        loaded.free,
        loaded.bytes_used,
        superblock.total_bytes,
        profile,
    );
    alloc.set_metadata_bytes(loaded.metadata_bytes);
    if let Some(previous) = superblock.older_backup_roots().next() {
        hold_previous_commit(&forest, &mut alloc, &loaded.extent_nodes, previous, profile);
    }
    forest.set_alloc(alloc);
    forest.set_refs_root(loaded.roots.extent);
    let roots = loaded.roots;
    let top = loaded.top;
    let next_ino = next_free_ino(&forest, &top.tree)?;
    let total_bytes = superblock.total_bytes;
    let info = FsInfo {
        forest,
        roots,
        superblock,
        dirty_page_bytes: 0,
        writebacks: Default::default(),
        unwritten: Default::default(),
        spare_pages: Default::default(),
        idle_cache_nodes: options.idle_cache_nodes,
        memory_releases: 0,
        space: SpaceInfo::new(total_bytes, profile),
        stats: FsStats::default(),
        log: LogState {
            filling: 1,
            ..Default::default()
        },
        log_stats: Default::default(),
        failed: None,
        shut_down: false,
        replay: None,
        backup_root_used: rescue,
        options,
        pending_snapshots: Vec::new(),
        refused_snapshots: Default::default(),
        replaying_log: false,
        sending: Default::default(),
    };
    let mut state = FsState::new(info, Root::new(top.tree, top.item, next_ino));
    state.queue_orphan_roots()?;
    Ok(state)
}

/// Where one commit's trees are, as the superblock or a backup root says.
struct CommitToLoad {
    root_tree: TreeRoot,
    bytes_used: u64,
    /// For a backup root: the extent and fs roots its slot records, which
    /// the root tree's items must match.
    recorded: Option<BackupRoot>,
    /// The image has data checksums: the root tree names a checksum tree.
    data_checksums: bool,
    /// The image has subvolumes: their root items are in the long form.
    subvolumes: bool,
}

impl CommitToLoad {
    fn newest(superblock: &Superblock) -> CommitToLoad {
        CommitToLoad {
            root_tree: TreeRoot {
                id: tree_id::ROOT,
                bytenr: superblock.root_tree_bytenr,
                level: superblock.root_tree_level,
                generation: superblock.generation,
                last_snapshot: 0,
            },
            bytes_used: superblock.bytes_used,
            recorded: None,
            data_checksums: superblock.data_checksums,
            subvolumes: superblock.subvolumes,
        }
    }

    fn backup(backup: &BackupRoot, newest: &Superblock) -> CommitToLoad {
        CommitToLoad {
            root_tree: TreeRoot {
                id: tree_id::ROOT,
                bytenr: backup.root_tree_bytenr,
                level: backup.root_tree_level,
                generation: backup.generation,
                last_snapshot: 0,
            },
            bytes_used: backup.bytes_used,
            recorded: Some(*backup),
            data_checksums: newest.data_checksums,
            subvolumes: newest.subvolumes,
        }
    }
}

/// One commit, read and validated: its trees and the free space its
/// extent tree leaves.
struct LoadedCommit {
    roots: Roots,
    /// The top-level subvolume's fs tree and root item.
    top: SubvolRecord,
    free: FreeSpace,
    bytes_used: u64,
    metadata_bytes: u64,
    /// The extent tree's own nodes, bytenr -> generation: the subtrees an
    /// older extent tree shares with it.
    extent_nodes: HashMap<u64, u64>,
}

/// Reads one commit's root nodes and extent tree, failing on the first
/// block that does not validate (checksum, owner, level, generation).
fn load_commit<D: BlockDevice>(
    forest: &Forest<Arc<D>>,
    commit: &CommitToLoad,
    total_bytes: u64,
) -> Result<LoadedCommit> {
    let root = commit.root_tree;
    let load_root = |id: u64| -> Result<TreeRoot> {
        let key = Key::new(id, item_type::ROOT_ITEM, 0);
        let data = forest.get(&root, &key)?.ok_or_else(|| {
            Error::corrupt(Corruption::general(format!(
                "root tree has no root item for tree {}",
                crate::format::tree_name(id)
            )))
        })?;
        let item = RootItem::decode(&data)
            .map_err(|e| Error::corrupt(Corruption::general(format!("root item {key}: {e}"))))?;
        Ok(TreeRoot {
            id,
            bytenr: item.bytenr,
            level: item.level,
            generation: item.generation,
            last_snapshot: 0,
        })
    };
    let extent = load_root(tree_id::EXTENT)?;
    let top_key = Key::new(tree_id::FS, item_type::ROOT_ITEM, 0);
    let top_data = forest.get(&root, &top_key)?.ok_or_else(|| {
        Error::corrupt(Corruption::general(
            "root tree has no root item for tree fs".to_string(),
        ))
    })?;
    let top = SubvolRecord::decode(tree_id::FS, &top_data, commit.subvolumes)?;
    let fs = top.tree;
    let csum = if commit.data_checksums {
        Some(load_root(tree_id::CSUM)?)
    } else {
        None
    };
    if let Some(recorded) = &commit.recorded {
        for (tree, slot) in [(&extent, &recorded.extent_root), (&fs, &recorded.fs_root)] {
            if (tree.bytenr, tree.level, tree.generation)
                != (slot.bytenr, slot.level, slot.generation)
            {
                return Err(Error::corrupt(Corruption::general(format!(
                    "the root item of tree {} ({} level {} generation {}) is not the one the \
                     backup root records ({} level {} generation {})",
                    crate::format::tree_name(tree.id),
                    tree.bytenr,
                    tree.level,
                    tree.generation,
                    slot.bytenr,
                    slot.level,
                    slot.generation
                ))));
            }
        }
    }
    // Validate the roots now so a damaged image fails at open, naming the block.
    for r in [root, extent, fs].into_iter().chain(csum) {
        forest.node(
            r.bytenr,
            NodeExpectation {
                tree: r.id,
                level: r.level,
                generation: r.generation,
            },
        )?;
    }
    let profile = forest.store().profile();
    let scanned = free_space_from_extent_tree(forest, &extent, total_bytes, profile)?;
    if scanned.bytes_used != commit.bytes_used {
        return Err(Error::corrupt(Corruption::general(format!(
            "extent tree records {} bytes in use, {} says {}",
            scanned.bytes_used,
            if commit.recorded.is_some() {
                "the backup root"
            } else {
                "superblock"
            },
            commit.bytes_used
        ))));
    }
    Ok(LoadedCommit {
        roots: Roots { root, extent, csum },
        top,
        free: scanned.free,
        bytes_used: scanned.bytes_used,
        metadata_bytes: scanned.metadata_bytes,
        extent_nodes: scanned.extent_nodes,
    })
}

/// The newest commit failed to load with `newest_error`: loads the newest
/// older commit the superblock records that does load. Returns it, the
/// superblock it stands for, and what was lost.
fn load_backup_root<D: BlockDevice>(
    forest: &Forest<Arc<D>>,
    newest: &Superblock,
    newest_error: Error,
) -> Result<(LoadedCommit, Superblock, BackupRootUsed)> {
    let mut rejected = vec![(newest.generation, newest_error.to_string())];
    let older = newest
        .backup_roots
        .iter()
        .enumerate()
        .filter(|(_, b)| !b.is_empty() && b.generation < newest.generation);
    for (rolled_back, (slot, backup)) in (1..).zip(older) {
        match load_commit(
            forest,
            &CommitToLoad::backup(backup, newest),
            newest.total_bytes,
        ) {
            Ok(loaded) => {
                // The slots from the mounted commit on, as the superblock
                // that commit wrote had them (older ones fell off).
                let mut backup_roots = [BackupRoot::EMPTY; BACKUP_ROOT_COUNT];
                backup_roots[..BACKUP_ROOT_COUNT - slot]
                    .copy_from_slice(&newest.backup_roots[slot..]);
                let superblock = Superblock {
                    generation: backup.generation,
                    root_tree_bytenr: backup.root_tree_bytenr,
                    root_tree_level: backup.root_tree_level,
                    bytes_used: backup.bytes_used,
                    // The log belongs to the abandoned newest commit: it
                    // must never be replayed onto an older one.
                    log_root_bytenr: 0,
                    log_root_level: 0,
                    log_generation: 0,
                    log_manifest: None,
                    backup_roots,
                    ..newest.clone()
                };
                let used = BackupRootUsed {
                    mounted_generation: backup.generation,
                    newest_generation: newest.generation,
                    commits_rolled_back: rolled_back,
                    rejected,
                };
                return Ok((loaded, superblock, used));
            }
            Err(e) => rejected.push((backup.generation, e.to_string())),
        }
    }
    let tried: Vec<String> = rejected[1..]
        .iter()
        .map(|(generation, why)| format!("generation {generation}: {why}"))
        .collect();
    let note = if tried.is_empty() {
        " (rescue=usebackuproot: the superblock records no older commit to fall back to)"
            .to_string()
    } else {
        format!(
            " (rescue=usebackuproot: no older commit loads either: {})",
            tried.join("; ")
        )
    };
    Err(annotate(newest_error, &note))
}

/// Adds to a mount error that the superblock records older commits a
/// rescue mount could fall back to.
fn with_backup_hint(e: Error, newest: &Superblock) -> Error {
    let older: Vec<u64> = newest.older_backup_roots().map(|b| b.generation).collect();
    match older.first() {
        None => e,
        Some(newest_backup) => annotate(
            e,
            &format!(
                " (the superblock records {} older commit{} as backup roots, the newest of \
                 generation {newest_backup}: mount with -o rescue=usebackuproot to mount the \
                 newest that is readable, read-only, losing what was committed after it)",
                older.len(),
                if older.len() == 1 { "" } else { "s" }
            ),
        ),
    }
}

/// Appends `note` to an error's text, keeping its kind.
fn annotate(e: Error, note: &str) -> Error {
    match e {
        Error::Corrupt(mut c) => {
            c.reason.push_str(note);
            Error::Corrupt(c)
        }
        Error::Io(io) => Error::Io(std::io::Error::new(io.kind(), format!("{io}{note}"))),
        other => other,
    }
}

/// Holds the space the mounted commit does not use but the commit before
/// it (its first older backup root) does, so that commit stays intact
/// until the next commit is durable, as it would have had this mount
/// written the mounted commit itself (docs/BACKUP-ROOTS.md). Walks the
/// previous extent tree, skipping the subtrees it shares with the mounted
/// one. A previous commit that cannot be read is already lost: what was
/// found up to then is held, and the mount goes on.
fn hold_previous_commit<D: BlockDevice>(
    forest: &Forest<Arc<D>>,
    alloc: &mut Allocator,
    mounted_extent_nodes: &HashMap<u64, u64>,
    previous: &BackupRoot,
    profile: MetadataProfile,
) {
    let mut stack = vec![(
        previous.extent_root.bytenr,
        NodeExpectation {
            tree: tree_id::EXTENT,
            level: previous.extent_root.level,
            generation: previous.extent_root.generation,
        },
    )];
    while let Some((bytenr, expect)) = stack.pop() {
        // A node with the same block and generation is the same node (a
        // block is written once per generation): all it holds is shared.
        if mounted_extent_nodes.get(&bytenr) == Some(&expect.generation) {
            continue;
        }
        let Ok(node) = forest.node(bytenr, expect) else {
            return;
        };
        match &node.body {
            NodeBody::Leaf(items) => {
                for item in items {
                    // Not an extent item: nothing the commit uses (an
                    // unknown type is the check's to report).
                    let Some(len) = ItemType::of(&item.key)
                        .ok()
                        .and_then(|t| t.extent_len(&item.key))
                    else {
                        continue;
                    };
                    // Anything the mounted commit still uses is not free.
                    alloc.hold_free_range(item.key.objectid, len);
                    if item.key.item_type == item_type::METADATA_ITEM {
                        if let Some(mirror) = profile.mirror_of(item.key.objectid) {
                            alloc.hold_free_range(mirror, len);
                        }
                    }
                }
            }
            NodeBody::Internal(ptrs) => {
                for p in ptrs {
                    stack.push((
                        p.blockptr,
                        NodeExpectation {
                            tree: tree_id::EXTENT,
                            level: expect.level - 1,
                            generation: p.generation,
                        },
                    ));
                }
            }
        }
    }
}

/// What the mount learns from an extent tree.
struct ExtentScan {
    free: FreeSpace,
    bytes_used: u64,
    /// The part of `bytes_used` that holds tree nodes.
    metadata_bytes: u64,
    /// The extent tree's own nodes, bytenr -> generation.
    extent_nodes: HashMap<u64, u64>,
}

/// Free space is everything the extent tree does not record (and, under
/// DUP, not the mirror of a recorded node). Returns the free map, the bytes
/// in use (mirrors included), the part of them that holds tree nodes, and
/// the extent tree's own nodes.
fn free_space_from_extent_tree<D: BlockDevice>(
    forest: &Forest<D>,
    extent: &TreeRoot,
    total_bytes: u64,
    profile: MetadataProfile,
) -> Result<ExtentScan> {
    let mut used_ranges: Vec<(u64, u64)> = Vec::new();
    let mut metadata = 0u64;
    let mut extent_nodes = HashMap::new();
    let mut fault = None;
    let node_len = NODE_SIZE as u64;
    forest.scan(extent, Key::MIN, Key::MAX, &mut |k, data| {
        let Some(len) = ItemType::of(k).ok().and_then(|t| t.extent_len(k)) else {
            fault = Some(format!("unexpected item {k} in the extent tree"));
            return Ok(ControlFlow::Break(()));
        };
        let item = match ExtentItem::decode(data) {
            Ok(item) => item,
            Err(e) => {
                fault = Some(format!("extent item {k}: {e}"));
                return Ok(ControlFlow::Break(()));
            }
        };
        used_ranges.push((k.objectid, len));
        if k.item_type == item_type::METADATA_ITEM {
            if profile
                .primary_end()
                .is_some_and(|limit| k.objectid.saturating_add(node_len) > limit)
            {
                fault = Some(format!(
                    "node {k} lies in the DUP mirror half (from {})",
                    profile.primary_end().unwrap_or_default()
                ));
                return Ok(ControlFlow::Break(()));
            }
            if let Some(mirror) = profile.mirror_of(k.objectid) {
                used_ranges.push((mirror, node_len));
            }
            metadata += profile.node_footprint();
            if item.owner == tree_id::EXTENT {
                extent_nodes.insert(k.objectid, item.generation);
            }
        }
        Ok(ControlFlow::Continue(()))
    })?;
    let corrupt = |reason: String| {
        Error::corrupt(Corruption {
            tree: Some(tree_id::EXTENT),
            block: None,
            slot: None,
            reason,
        })
    };
    if let Some(reason) = fault {
        return Err(corrupt(reason));
    }
    used_ranges.sort_unstable();
    let mut free = FreeSpace::default();
    let mut cursor = FIRST_ALLOCATABLE_BYTE;
    let mut used = 0u64;
    for (start, len) in used_ranges {
        let end = start.checked_add(len);
        if start < cursor
            || len == 0
            || len % SECTOR_SIZE != 0
            || start % SECTOR_SIZE != 0
            || end.is_none_or(|e| e > total_bytes)
        {
            return Err(corrupt(format!(
                "extent {start}+{len} (or a node mirror) overlaps another, lies outside \
                 [{FIRST_ALLOCATABLE_BYTE}, {total_bytes}) or is unaligned"
            )));
        }
        if start > cursor {
            free.add(cursor, start - cursor);
        }
        cursor = start + len;
        used += len;
    }
    if cursor < total_bytes {
        free.add(cursor, total_bytes - cursor);
    }
    Ok(ExtentScan {
        free,
        bytes_used: used,
        metadata_bytes: metadata,
        extent_nodes,
    })
}
