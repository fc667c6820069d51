//! mkfs and open: building an empty filesystem, and loading one.

use super::commit::{self, Roots};
use super::delayed::DelayedItems;
use super::space::SpaceInfo;
use super::tree_log::LogState;
use super::{FsState, FsStats, MetadataCopies, MkfsOptions, MountOptions};
use crate::alloc::{Allocator, FreeSpace};
use crate::btree::{Forest, NodeExpectation, NodeStore, TreeRoot};
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{
    encode_inode_refs, item_type, tree_id, ExtentItem, InodeItem, InodeRefEntry, Key,
    MetadataProfile, RootItem, Superblock, FIRST_ALLOCATABLE_BYTE, FIRST_FREE_INO,
    MIN_DEVICE_BYTES, NODE_SIZE, ORPHAN_OBJECTID, ROOT_DIR_INO, SECTOR_SIZE,
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
    );
    let mut roots = Roots {
        root: forest.create_tree(tree_id::ROOT)?,
        extent: forest.create_tree(tree_id::EXTENT)?,
        fs: forest.create_tree(tree_id::FS)?,
    };
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
        &mut roots.fs,
        Key::new(ROOT_DIR_INO, item_type::INODE_ITEM, 0),
        root_dir.encode(),
    )?;
    forest.insert(
        &mut roots.fs,
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
        metadata_profile,
    };
    let prepared = commit::seal_transaction(&mut forest, &mut roots, &template)?;
    commit::write_commit(dev, &prepared)?;
    Ok(())
}

pub(crate) fn open<D: BlockDevice>(dev: Arc<D>, options: MountOptions) -> Result<FsState<D>> {
    let superblock = commit::read_superblock(dev.as_ref())?;
    let profile = superblock.metadata_profile;
    let store = Arc::new(NodeStore::new(
        dev.clone(),
        superblock.fsid,
        profile,
        options.cache_nodes,
    ));
    // A read-write open repairs what its own reads find (the roots, the
    // extent tree scan below); a read-only one only serves the good copy.
    store.set_repair_writes(!options.read_only && dev.writable());
    let root = TreeRoot {
        id: tree_id::ROOT,
        bytenr: superblock.root_tree_bytenr,
        level: superblock.root_tree_level,
        generation: superblock.generation,
    };
    // The allocator is rebuilt below; reads need none yet.
    let mut forest = Forest::new(
        store.clone(),
        Allocator::new(FreeSpace::default(), 0, superblock.total_bytes, profile),
        superblock.generation + 1,
    );
    let load_root = |forest: &Forest<Arc<D>>, id: u64| -> Result<TreeRoot> {
        let key = Key::new(id, item_type::ROOT_ITEM, 0);
        let data = forest.get(&root, &key)?.ok_or_else(|| {
            Error::corrupt(Corruption::general(format!(
                "root tree has no root item for tree {}",
                crate::print::tree_name(id)
            )))
        })?;
        let item = RootItem::decode(&data)
            .map_err(|e| Error::corrupt(Corruption::general(format!("root item {key}: {e}"))))?;
        Ok(TreeRoot {
            id,
            bytenr: item.bytenr,
            level: item.level,
            generation: item.generation,
        })
    };
    let extent = load_root(&forest, tree_id::EXTENT)?;
    let fs = load_root(&forest, tree_id::FS)?;
    // Validate the roots now so a damaged image fails at open, naming the block.
    for r in [root, extent, fs] {
        forest.node(
            r.bytenr,
            NodeExpectation {
                tree: r.id,
                level: r.level,
                generation: r.generation,
            },
        )?;
    }
    let (free, bytes_used, metadata_bytes) =
        free_space_from_extent_tree(&forest, &extent, superblock.total_bytes, profile)?;
    if bytes_used != superblock.bytes_used {
        return Err(Error::corrupt(Corruption::general(format!(
            "extent tree records {bytes_used} bytes in use, superblock says {}",
            superblock.bytes_used
        ))));
    }
    forest.alloc = Allocator::new(free, bytes_used, superblock.total_bytes, profile);
    forest.alloc.set_metadata_bytes(metadata_bytes);
    let next_ino =
        match forest.last_at_or_before(&fs, &Key::new(ORPHAN_OBJECTID - 1, u8::MAX, u64::MAX))? {
            Some((k, _)) => (k.objectid + 1).max(FIRST_FREE_INO),
            None => FIRST_FREE_INO,
        };
    let total_bytes = superblock.total_bytes;
    let state = FsState {
        forest,
        roots: Roots { root, extent, fs },
        superblock,
        inodes: HashMap::new(),
        delayed: DelayedItems::default(),
        next_ino,
        dirty_page_bytes: 0,
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
        options,
    };
    Ok(state)
}

/// Free space is everything the extent tree does not record (and, under
/// DUP, not the mirror of a recorded node). Returns the free map, the bytes
/// in use (mirrors included), and the part of them that holds tree nodes.
fn free_space_from_extent_tree<D: BlockDevice>(
    forest: &Forest<D>,
    extent: &TreeRoot,
    total_bytes: u64,
    profile: MetadataProfile,
) -> Result<(FreeSpace, u64, u64)> {
    let mut used_ranges: Vec<(u64, u64)> = Vec::new();
    let mut metadata = 0u64;
    let mut fault = None;
    let node_len = NODE_SIZE as u64;
    forest.scan(extent, Key::MIN, Key::MAX, &mut |k, data| {
        let len = match k.item_type {
            item_type::METADATA_ITEM => node_len,
            item_type::EXTENT_ITEM => k.offset,
            _ => {
                fault = Some(format!("unexpected item {k} in the extent tree"));
                return Ok(ControlFlow::Break(()));
            }
        };
        if let Err(e) = ExtentItem::decode(data) {
            fault = Some(format!("extent item {k}: {e}"));
            return Ok(ControlFlow::Break(()));
        }
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
    Ok((free, used, metadata))
}
