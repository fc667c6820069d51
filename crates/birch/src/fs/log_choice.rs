//! Which log a mount replays (docs/LOG-FLUSH.md): a log written by a
//! one-flush log sync may not have reached the disk whole; it is validated
//! against the superblock's manifest before replay, and the log durable
//! before it is used if it fails. `birch check` and `birch scrub` ask the
//! same question so that they look at the log the mount would replay.

use crate::btree::{read_node_copies, NodeExpectation};
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{
    decode_csums_at, item_type, tree_id, FileExtent, Key, LogRootRef, NodeBody, RootItem,
    Superblock, SECTOR_SIZE,
};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The log to replay, and how it was chosen.
#[derive(Debug, Default)]
pub struct LogChoice {
    /// The log to replay; `None`: none (the last commit mounts as it is).
    pub log: Option<LogRootRef>,
    /// The checksums the superblock's manifest lists for the nodes of the
    /// chosen log's last sync (empty unless the newest log is chosen): a
    /// copy with another checksum is not that node, whatever its header
    /// says.
    pub manifest_checksums: HashMap<u64, u32>,
    /// Why the newest log was not chosen: its sync did not reach the disk
    /// whole (a crash before its flush).
    pub newest_rejected: Option<String>,
}

/// Chooses the log a mount of `sb` replays. A superblock without a
/// manifest names its log as before (written with two flushes, it is
/// durable). With one, the newest log is validated; if it fails, the
/// previous log is validated and chosen, or none if there was none. A
/// previous log that fails too is a corruption error naming the block; a
/// read error is returned as it is (the log may be fine).
pub fn choose_log<D: BlockDevice + ?Sized>(dev: &D, sb: &Superblock) -> Result<LogChoice> {
    let Some(newest) = sb.log_root() else {
        return Ok(LogChoice::default());
    };
    let Some(manifest) = &sb.log_manifest else {
        return Ok(LogChoice {
            log: Some(newest),
            ..Default::default()
        });
    };
    let listed: HashMap<u64, u32> = manifest.nodes.iter().copied().collect();
    let why = match validate_log(dev, sb, newest, &listed) {
        Ok(()) => {
            return Ok(LogChoice {
                log: Some(newest),
                manifest_checksums: listed,
                newest_rejected: None,
            })
        }
        Err(Error::Corrupt(why)) => why.to_string(),
        Err(io) => return Err(io),
    };
    let rejected = format!(
        "the newest fsync log (log generation {}) did not reach the disk whole: {why}",
        newest.log_generation
    );
    let Some(previous) = manifest.previous else {
        return Ok(LogChoice {
            log: None,
            manifest_checksums: HashMap::new(),
            newest_rejected: Some(rejected),
        });
    };
    match validate_log(dev, sb, previous, &HashMap::new()) {
        Ok(()) => Ok(LogChoice {
            log: Some(previous),
            manifest_checksums: HashMap::new(),
            newest_rejected: Some(rejected),
        }),
        Err(Error::Corrupt(mut damage)) => {
            damage.reason = format!(
                "{rejected}; and the log before it (log generation {}), durable, is damaged: {}",
                previous.log_generation, damage.reason
            );
            Err(Error::corrupt(damage))
        }
        Err(io) => Err(io),
    }
}

fn corrupt_at(tree: u64, block: u64, reason: String) -> Error {
    Error::corrupt(Corruption::at_block(Some(tree), block, None, reason))
}

/// A logged extent whose data is wrong (the reason names the block).
fn corrupt_data(reason: String) -> Error {
    Error::corrupt(Corruption {
        tree: Some(tree_id::LOG),
        block: None,
        slot: None,
        reason,
    })
}

/// Checks a whole log: every node of the log root tree and of every
/// subvolume's log tree decodes, checksums and is what its parent (or the
/// superblock) promises, a node the manifest lists has exactly the listed
/// checksum (in some copy), and every data block of the log's new extents
/// matches its logged checksum.
fn validate_log<D: BlockDevice + ?Sized>(
    dev: &D,
    sb: &Superblock,
    log: LogRootRef,
    listed: &HashMap<u64, u32>,
) -> Result<()> {
    // Every node of a log carries the transaction after its base commit.
    let generation = sb.generation + 1;
    let root_tree = NodeExpectation {
        tree: tree_id::LOG_ROOT,
        level: log.level,
        generation,
    };
    let mut subvolume_logs = Vec::new();
    walk(
        dev,
        sb,
        log.bytenr,
        root_tree,
        listed,
        &mut |block, key, data| {
            if key.objectid == tree_id::LOG && key.item_type == item_type::ROOT_ITEM {
                let item = RootItem::decode(data).map_err(|e| {
                    corrupt_at(
                        tree_id::LOG_ROOT,
                        block,
                        format!("log root item {key}: {e}"),
                    )
                })?;
                subvolume_logs.push(item);
            }
            Ok(())
        },
    )?;
    if subvolume_logs.is_empty() {
        return Err(corrupt_at(
            tree_id::LOG_ROOT,
            log.bytenr,
            "log root tree holds no log tree".into(),
        ));
    }
    for subvolume_log in subvolume_logs {
        validate_log_tree(dev, sb, subvolume_log, listed)?;
    }
    Ok(())
}

/// Checks one subvolume's log tree: its nodes, and the data blocks of its
/// new extents against its logged checksums.
fn validate_log_tree<D: BlockDevice + ?Sized>(
    dev: &D,
    sb: &Superblock,
    fs_log: RootItem,
    listed: &HashMap<u64, u32>,
) -> Result<()> {
    let mut extents = Vec::new();
    let mut csums = BTreeMap::new();
    let log_tree = NodeExpectation {
        tree: tree_id::LOG,
        level: fs_log.level,
        generation: fs_log.generation,
    };
    walk(
        dev,
        sb,
        fs_log.bytenr,
        log_tree,
        listed,
        &mut |block, key, data| {
            let bad = |what: String| corrupt_at(tree_id::LOG, block, format!("{key}: {what}"));
            match key.item_type {
                item_type::EXTENT_DATA => {
                    match FileExtent::decode_at(key, data).map_err(|e| bad(e.to_string()))? {
                        FileExtent::Regular {
                            disk_bytenr,
                            disk_num_bytes,
                            offset,
                            num_bytes,
                        } => extents.push((*key, disk_bytenr, disk_num_bytes, offset, num_bytes)),
                        // Its checksums cover the compressed bytes: the
                        // whole disk extent is validated.
                        FileExtent::Compressed {
                            disk_bytenr,
                            disk_num_bytes,
                            ..
                        } => extents.push((*key, disk_bytenr, disk_num_bytes, 0, disk_num_bytes)),
                        FileExtent::Inline { .. }
                        | FileExtent::InlineCompressed { .. }
                        | FileExtent::Prealloc { .. } => {}
                    }
                }
                item_type::EXTENT_CSUM => {
                    for (i, csum) in decode_csums_at(key, data)
                        .map_err(|e| bad(e.to_string()))?
                        .into_iter()
                        .enumerate()
                    {
                        csums.insert(key.offset + i as u64 * SECTOR_SIZE, csum);
                    }
                }
                _ => {}
            }
            Ok(())
        },
    )?;
    for (key, disk_bytenr, disk_num_bytes, offset, num_bytes) in extents {
        let start = offset / SECTOR_SIZE * SECTOR_SIZE;
        let end = offset
            .saturating_add(num_bytes)
            .div_ceil(SECTOR_SIZE)
            .saturating_mul(SECTOR_SIZE)
            .min(disk_num_bytes);
        validate_extent_blocks(
            dev,
            &csums,
            key,
            disk_bytenr.saturating_add(start),
            end.saturating_sub(start),
        )?;
    }
    Ok(())
}

/// The data blocks `[from, from + len)` a logged file extent (at `key`)
/// references: all of them have a logged checksum and match it, or none
/// has one (an extent of the committed trees, whose checksums the log does
/// not carry: DATA-CHECKSUMS.md, invariant 5).
fn validate_extent_blocks<D: BlockDevice + ?Sized>(
    dev: &D,
    csums: &BTreeMap<u64, u32>,
    key: Key,
    from: u64,
    len: u64,
) -> Result<()> {
    let Some(until) = from.checked_add(len) else {
        return Err(corrupt_data(format!(
            "logged extent {key} at {from} ends past the address space"
        )));
    };
    let covered = csums.range(from..until).count() as u64;
    if covered == 0 {
        return Ok(());
    }
    if covered != len / SECTOR_SIZE || until > dev.size_bytes() {
        return Err(corrupt_data(format!(
            "logged extent {key} at {from}: {covered} of its {} data blocks have logged \
             checksums",
            len / SECTOR_SIZE
        )));
    }
    const CHUNK: u64 = 1 << 20;
    let mut at = from;
    while at < until {
        let mut buf = vec![0u8; (until - at).min(CHUNK) as usize];
        dev.read_at(&mut buf, at)?;
        for (i, block) in buf.chunks(SECTOR_SIZE as usize).enumerate() {
            let bytenr = at + i as u64 * SECTOR_SIZE;
            // Counted above, but the count does not say which blocks.
            let Some(&logged) = csums.get(&bytenr) else {
                return Err(corrupt_data(format!(
                    "data block {bytenr} of logged extent {key} has no logged checksum"
                )));
            };
            let found = crate::format::block_csum(block);
            if found != logged {
                return Err(corrupt_data(format!(
                    "data block {bytenr} of logged extent {key} has checksum {found:#010x}, \
                     the log says {logged:#010x}"
                )));
            }
        }
        at += buf.len() as u64;
    }
    Ok(())
}

/// Called by [`walk`] on each leaf item: the leaf's block, the key, the
/// payload.
type LeafVisitor<'a> = dyn FnMut(u64, &Key, &[u8]) -> Result<()> + 'a;

/// Visits every leaf item of the tree whose root is at `root`, each node
/// read from a good copy: one that validates as what its parent promises
/// and, if `listed` names its block, has the listed checksum.
fn walk<D: BlockDevice + ?Sized>(
    dev: &D,
    sb: &Superblock,
    root: u64,
    expect: NodeExpectation,
    listed: &HashMap<u64, u32>,
    visit: &mut LeafVisitor<'_>,
) -> Result<()> {
    let mut stack = vec![(root, expect)];
    let mut seen = HashSet::new();
    while let Some((bytenr, expect)) = stack.pop() {
        if !seen.insert(bytenr) {
            return Err(corrupt_at(
                expect.tree,
                bytenr,
                "log node reached twice (a cycle or a shared child)".into(),
            ));
        }
        let node = read_good_copy(dev, sb, bytenr, expect, listed.get(&bytenr).copied())?;
        match &node.body {
            NodeBody::Leaf(items) => {
                for item in items {
                    visit(bytenr, &item.key, &item.data)?;
                }
            }
            NodeBody::Internal(ptrs) => {
                for p in ptrs {
                    stack.push((
                        p.blockptr,
                        NodeExpectation {
                            tree: expect.tree,
                            level: node.level - 1,
                            generation: p.generation,
                        },
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The first copy of the node at `bytenr` that is good (see [`walk`]), or
/// an error naming the block and what is wrong with each copy; a read
/// error is returned as such when no copy is good.
fn read_good_copy<D: BlockDevice + ?Sized>(
    dev: &D,
    sb: &Superblock,
    bytenr: u64,
    expect: NodeExpectation,
    listed: Option<u32>,
) -> Result<crate::format::Node> {
    let mut problems = Vec::new();
    let mut io = None;
    for copy in read_node_copies(dev, &sb.fsid, sb.metadata_profile, bytenr, Some(expect)) {
        match copy.result {
            Ok((node, raw)) => {
                let stored = u32::from_le_bytes(raw[0..4].try_into().expect("4 bytes"));
                match listed {
                    Some(want) if stored != want => problems.push(format!(
                        "{} at {}: checksum {stored:#010x}, the superblock's log manifest \
                         lists {want:#010x} (a write of the last log sync that did not reach \
                         the disk)",
                        crate::btree::copy_name(copy.index),
                        copy.offset
                    )),
                    _ => return Ok(node),
                }
            }
            Err(Error::Corrupt(c)) => problems.push(c.reason),
            Err(e) => {
                problems.push(e.to_string());
                io = Some(e);
            }
        }
    }
    match io {
        Some(e) => Err(e),
        None => Err(corrupt_at(expect.tree, bytenr, problems.join("; "))),
    }
}
