//! `send`: the btrfs send stream (version 1) of a read-only subvolume,
//! full or incremental against a read-only parent (docs/SEND.md "Design:
//! send"). The trees are compared node by node, skipping the subtrees
//! they share ([`tree`]); the inodes that differ and the receiver's
//! namespace are in [`plan`]; the commands, phase by phase, in [`emit`].
//! `Filesystem::send` (fs/mod.rs) prepares the roots under the state lock
//! and calls [`write_stream`] without it.

mod emit;
mod plan;
mod tree;

pub(crate) use emit::DataSource;
pub(crate) use tree::NodeSource;

use crate::btree::TreeRoot;
use crate::error::Result;
use crate::format::send_stream::Command;
use emit::{stream_path, Emitter, Sender};
use plan::{changed_entities, Trees};
use std::io::Write;
use tree::NodeReader;

/// How [`Filesystem::send`](crate::fs::Filesystem::send) writes its
/// stream.
#[derive(Default, Clone, Debug)]
pub struct SendOptions {
    /// Send only what changed since this read-only subvolume (an
    /// incremental stream: SNAPSHOT instead of SUBVOL).
    pub parent: Option<u64>,
    /// No stream header (btrfs-progs' `BTRFS_SEND_FLAG_OMIT_STREAM_HEADER`,
    /// for the second and later subvolumes of one stream).
    pub omit_header: bool,
    /// No END command (`BTRFS_SEND_FLAG_OMIT_END_CMD`, for all but the last).
    pub omit_end: bool,
}

/// Running totals of a send.
#[derive(Default, Clone, Debug)]
pub struct SendStats {
    /// Commands written.
    pub commands: u64,
    /// Bytes written, the header included.
    pub stream_bytes: u64,
    /// File bytes carried by WRITE commands (zeros included).
    pub data_bytes: u64,
    /// Inodes whose contents were sent (new or changed).
    pub inodes: u64,
    /// Tree nodes the send fetched from the engine (its cache or the
    /// device), each read counted once however often it was used.
    pub nodes_read: u64,
}

/// What the stream is of: the snapshot's tree and identity, and the
/// parent's.
pub(crate) struct SendRoots {
    pub tree: TreeRoot,
    /// The snapshot's name (SUBVOL's or SNAPSHOT's path).
    pub name: Vec<u8>,
    pub uuid: [u8; 16],
    pub ctransid: u64,
    pub parent: Option<ParentRoot>,
}

pub(crate) struct ParentRoot {
    pub tree: TreeRoot,
    /// What SNAPSHOT names the parent by: its received uuid and stransid
    /// if it was received, else its own uuid and ctransid (btrfs's rule).
    pub clone_uuid: [u8; 16],
    pub clone_ctransid: u64,
}

/// Writes the stream of `roots` to `out`. The trees are read-only and
/// held for the send by the caller; nodes come from `nodes`, file data
/// from `data`.
pub(crate) fn write_stream(
    roots: &SendRoots,
    options: &SendOptions,
    nodes: &dyn NodeSource,
    data: &dyn DataSource,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(&SendStats),
) -> Result<SendStats> {
    let mut trees = Trees {
        reader: NodeReader::new(nodes),
        new: roots.tree,
        old: roots.parent.as_ref().map(|p| p.tree),
    };
    let entities = changed_entities(&mut trees)?;
    let mut emitter = Emitter::new(out);
    if !options.omit_header {
        emitter.header()?;
    }
    let path = stream_path(&roots.name, crate::format::ROOT_DIR_INO)?;
    emitter.command(&match &roots.parent {
        None => Command::Subvol {
            path,
            uuid: roots.uuid,
            ctransid: roots.ctransid,
        },
        Some(parent) => Command::Snapshot {
            path,
            uuid: roots.uuid,
            ctransid: roots.ctransid,
            clone_uuid: parent.clone_uuid,
            clone_ctransid: parent.clone_ctransid,
        },
    })?;
    let mut sender = Sender::new(trees, data, emitter, entities, roots.uuid, roots.ctransid);
    sender.run(progress)?;
    if !options.omit_end {
        sender.out.command(&Command::End)?;
    }
    sender.out.stats.nodes_read = sender.trees.reader.nodes_read;
    progress(&sender.out.stats);
    Ok(sender.out.stats.clone())
}
