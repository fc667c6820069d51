//! The commands of a send, phase by phase (docs/SEND.md "Design: send",
//! 2): removals, new inodes, moves, contents, removed directories, times.

use super::super::decode::decode_item;
use super::plan::{Ent, Entity, InodeState, Model, Trees};
use super::SendStats;
use crate::error::{Corruption, Error, Result};
use crate::format::send_stream::{
    Command, StreamPath, StreamTime, MAX_PATH_LEN, MAX_WRITE_DATA, STREAM_MAGIC, STREAM_VERSION,
};
use crate::format::{decode_xattrs, item_type, FileExtent, FileType, InodeItem, Timespec};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;

/// File data of the snapshot, read through the engine's checked read
/// path (checksums verified, compressed extents decompressed).
pub(crate) trait DataSource {
    fn read_data(&self, ino: u64, offset: u64, len: usize) -> Result<Vec<u8>>;
}

/// Bytes read per data read: a few WRITE commands' worth.
const READ_CHUNK: usize = 16 * MAX_WRITE_DATA;

/// The block size CLONE ranges align to (btrfs's clone rule).
const CLONE_ALIGN: u64 = 4096;

/// The xattr set after CHOWN (which clears it on the receiver).
const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// Writes commands, counting them.
pub(crate) struct Emitter<'a> {
    out: &'a mut dyn Write,
    pub stats: SendStats,
}

impl<'a> Emitter<'a> {
    pub(crate) fn new(out: &'a mut dyn Write) -> Self {
        Emitter {
            out,
            stats: SendStats::default(),
        }
    }

    pub(crate) fn header(&mut self) -> Result<()> {
        self.out.write_all(STREAM_MAGIC)?;
        self.out.write_all(&STREAM_VERSION.to_le_bytes())?;
        self.stats.stream_bytes += (STREAM_MAGIC.len() + 4) as u64;
        Ok(())
    }

    pub(crate) fn command(&mut self, command: &Command) -> Result<()> {
        let bytes = command
            .encode()
            .ok_or(Error::InvalidArgument("send: a command larger than 64 KiB"))?;
        self.out.write_all(&bytes)?;
        self.stats.commands += 1;
        self.stats.stream_bytes += bytes.len() as u64;
        Ok(())
    }
}

/// A path as a stream attribute; longer than `PATH_MAX` is an error
/// naming the inode.
pub(crate) fn stream_path(path: &[u8], ino: u64) -> Result<StreamPath> {
    if path.len() > MAX_PATH_LEN {
        return Err(Error::PathTooLong(format!(
            "send: the path of inode {ino} is {} bytes, more than {MAX_PATH_LEN}",
            path.len()
        )));
    }
    StreamPath::new(path).map_err(|e| {
        Error::corrupt(Corruption::general(format!(
            "send: inode {ino} has a name that is no path component: {e}"
        )))
    })
}

fn stream_time(t: Timespec) -> StreamTime {
    StreamTime {
        sec: t.sec as u64,
        nsec: t.nsec,
    }
}

/// Where a disk extent's bytes were sent in this stream: to `ent` at
/// `file_offset`, from `extent_offset` of the disk extent on, `len`
/// bytes; `size` is that file's size.
#[derive(Clone, Copy)]
struct Sent {
    ent: Ent,
    file_offset: u64,
    extent_offset: u64,
    len: u64,
    size: u64,
}

/// One send in progress: the trees, the model, the output.
pub(crate) struct Sender<'a, 'o> {
    pub trees: Trees<'a>,
    pub data: &'a dyn DataSource,
    pub out: Emitter<'o>,
    pub entities: BTreeMap<Ent, Entity>,
    pub model: Model,
    /// The uuid and ctransid CLONE names (the snapshot's own).
    pub uuid: [u8; 16],
    pub ctransid: u64,
    /// Directories whose entries changed, for UTIMES.
    touched_dirs: BTreeSet<Ent>,
    created: BTreeSet<Ent>,
    sent_extents: HashMap<u64, Vec<Sent>>,
}

impl<'a, 'o> Sender<'a, 'o> {
    pub(crate) fn new(
        trees: Trees<'a>,
        data: &'a dyn DataSource,
        out: Emitter<'o>,
        entities: BTreeMap<Ent, Entity>,
        uuid: [u8; 16],
        ctransid: u64,
    ) -> Self {
        let model = Model::new(&entities);
        Sender {
            trees,
            data,
            out,
            entities,
            model,
            uuid,
            ctransid,
            touched_dirs: BTreeSet::new(),
            created: BTreeSet::new(),
            sent_extents: HashMap::new(),
        }
    }

    fn path(&mut self, ent: Ent) -> Result<StreamPath> {
        let path = self.model.path(&mut self.trees, ent)?;
        stream_path(&path, ent.ino)
    }

    fn child_path(&mut self, ent: Ent, parent: Ent, name: &[u8]) -> Result<StreamPath> {
        let path = self.model.child_path(&mut self.trees, parent, name)?;
        stream_path(&path, ent.ino)
    }

    /// The snapshot's names of `ent`, as entities.
    fn new_names(&self, ent: Ent) -> Vec<(Ent, Vec<u8>)> {
        self.entities[&ent].new.as_ref().map_or(Vec::new(), |s| {
            s.names
                .iter()
                .map(|(p, n)| (self.model.new_parent(*p), n.clone()))
                .collect()
        })
    }

    /// Phases b to g, after SUBVOL or SNAPSHOT.
    pub(crate) fn run(&mut self, progress: &mut dyn FnMut(&SendStats)) -> Result<()> {
        let ents: Vec<Ent> = self.entities.keys().copied().collect();
        for &ent in &ents {
            self.remove_names(ent)?;
        }
        for &ent in &ents {
            self.create(ent)?;
        }
        for &ent in &ents {
            self.move_names(ent)?;
        }
        for &ent in &ents {
            if self.entities[&ent].new.is_some() {
                self.contents(ent)?;
                self.out.stats.inodes += 1;
                self.out.stats.nodes_read = self.trees.reader.nodes_read;
                progress(&self.out.stats);
            }
        }
        for &ent in &ents {
            let entity = &self.entities[&ent];
            if entity.new.is_none()
                && entity
                    .old
                    .as_ref()
                    .is_some_and(|o| o.file_type() == FileType::Directory)
            {
                let path = self.path(ent)?;
                self.out.command(&Command::Rmdir { path })?;
            }
        }
        self.times()
    }

    /// Phase b: every parent-tree name of `ent` the snapshot does not
    /// have goes: a directory's, and a surviving inode's last one, to an
    /// orphan name in the root; any other is unlinked.
    fn remove_names(&mut self, ent: Ent) -> Result<()> {
        let entity = &self.entities[&ent];
        let Some(old) = &entity.old else {
            return Ok(());
        };
        let is_dir = old.file_type() == FileType::Directory;
        let generation = old.item.generation;
        let survives = entity.new.is_some();
        let keep = self.new_names(ent);
        let removed: Vec<(Ent, Vec<u8>)> = self
            .model
            .names(ent)
            .iter()
            .filter(|n| !keep.contains(n))
            .cloned()
            .collect();
        for (parent, name) in removed {
            let path = self.child_path(ent, parent, &name)?;
            self.touched_dirs.insert(parent);
            let last = self.model.names(ent).len() == 1;
            if survives && last && self.rename_in_place(ent, is_dir, &path, parent, &name)? {
                continue;
            }
            if is_dir || (survives && last) {
                let orphan = self.model.orphan_name(&mut self.trees, ent, generation)?;
                let to = stream_path(&orphan, ent.ino)?;
                self.out.command(&Command::Rename { from: path, to })?;
                self.model.remove_name(ent, parent, &name);
                self.model.add_name(ent, Ent::ROOT, orphan);
                self.touched_dirs.insert(Ent::ROOT);
            } else {
                self.out.command(&Command::Unlink { path })?;
                self.model.remove_name(ent, parent, &name);
            }
        }
        Ok(())
    }

    /// A surviving inode losing its last name straight to its first new
    /// one, when that is safe now: the new directory existed before the
    /// stream, the name is free, and a directory does not go below
    /// itself. Else (false) it goes through an orphan name.
    fn rename_in_place(
        &mut self,
        ent: Ent,
        is_dir: bool,
        from: &StreamPath,
        parent: Ent,
        name: &[u8],
    ) -> Result<bool> {
        let current = self.model.names(ent).to_vec();
        let Some((to_parent, to_name)) = self
            .new_names(ent)
            .into_iter()
            .find(|n| !current.contains(n))
        else {
            return Ok(false);
        };
        let existed = !to_parent.previous
            && self
                .entities
                .get(&to_parent)
                .is_none_or(|e| e.existed(to_parent) && e.new.is_some());
        if !existed
            || !self.model.is_free(&mut self.trees, to_parent, &to_name)?
            || (is_dir && self.model.is_within(&mut self.trees, to_parent, ent)?)
        {
            return Ok(false);
        }
        let to = self.child_path(ent, to_parent, &to_name)?;
        self.out.command(&Command::Rename {
            from: from.clone(),
            to,
        })?;
        self.model.remove_name(ent, parent, name);
        self.model.add_name(ent, to_parent, to_name);
        self.touched_dirs.insert(to_parent);
        Ok(true)
    }

    /// Phase c: a new inode, once the directory of its first name exists
    /// (the new directories above it first, created top down).
    fn create(&mut self, ent: Ent) -> Result<()> {
        let mut chain = vec![ent];
        let mut at = ent;
        while let Some((parent, _)) = self.new_names(at).first().cloned() {
            if !self.needs_creating(parent) {
                break;
            }
            chain.push(parent);
            at = parent;
            if chain.len() > self.entities.len() {
                return Err(Error::corrupt(Corruption::general(format!(
                    "send: the directories above inode {} form a cycle",
                    ent.ino
                ))));
            }
        }
        for e in chain.into_iter().rev() {
            if self.needs_creating(e) {
                self.create_one(e)?;
            }
        }
        Ok(())
    }

    fn needs_creating(&self, ent: Ent) -> bool {
        self.entities
            .get(&ent)
            .is_some_and(|e| e.new.is_some() && !e.existed(ent))
            && !self.created.contains(&ent)
    }

    /// Creates `ent` at its first name and links its other names.
    fn create_one(&mut self, ent: Ent) -> Result<()> {
        self.created.insert(ent);
        let state = self.entities[&ent].new.clone().expect("a new inode");
        let names = self.new_names(ent);
        let Some((parent, name)) = names.first().cloned() else {
            return Ok(());
        };
        let path = self.child_path(ent, parent, &name)?;
        // The inode's number in the sent tree, as the kernel sends it
        // (btrfs-progs requires it; no receiver uses it).
        let ino = ent.ino;
        let command = match state.file_type() {
            FileType::Regular => Command::Mkfile { path, ino },
            FileType::Directory => Command::Mkdir { path, ino },
            FileType::CharDevice | FileType::BlockDevice => Command::Mknod {
                path,
                ino,
                mode: u64::from(state.item.mode),
                rdev: state.item.rdev,
            },
            FileType::Fifo => Command::Mkfifo { path, ino },
            FileType::Socket => Command::Mksock { path, ino },
            FileType::Symlink => Command::Symlink {
                path,
                ino,
                target: self.symlink_target(ent.ino)?,
            },
        };
        self.out.command(&command)?;
        self.model.add_name(ent, parent, name);
        self.touched_dirs.insert(parent);
        for (parent, name) in names.into_iter().skip(1) {
            self.link(ent, parent, name)?;
        }
        Ok(())
    }

    /// LINK of a new name of `ent` (its parent created first if new).
    fn link(&mut self, ent: Ent, parent: Ent, name: Vec<u8>) -> Result<()> {
        self.create(parent)?;
        let path = self.child_path(ent, parent, &name)?;
        let existing = self.path(ent)?;
        self.out.command(&Command::Link { path, existing })?;
        self.model.add_name(ent, parent, name);
        self.touched_dirs.insert(parent);
        Ok(())
    }

    fn symlink_target(&mut self, ino: u64) -> Result<Vec<u8>> {
        for (key, data) in self.trees.items(false, ino, item_type::EXTENT_DATA)? {
            if let FileExtent::Inline { data } =
                decode_item(&key, FileExtent::decode_at(&key, &data))?
            {
                return Ok(data);
            }
        }
        Err(Error::corrupt(Corruption::general(format!(
            "send: symlink {ino} has no inline target"
        ))))
    }

    /// Phase d: a surviving inode's new names: from its orphan name by
    /// RENAME to the first, LINK for the rest.
    fn move_names(&mut self, ent: Ent) -> Result<()> {
        let entity = &self.entities[&ent];
        if entity.new.is_none() || !entity.existed(ent) {
            return Ok(());
        }
        let current = self.model.names(ent).to_vec();
        let missing: Vec<(Ent, Vec<u8>)> = self
            .new_names(ent)
            .into_iter()
            .filter(|n| !current.contains(n))
            .collect();
        let orphan = current
            .iter()
            .find(|(p, n)| *p == Ent::ROOT && self.model.orphans.get(n) == Some(&ent))
            .cloned();
        let mut missing = missing.into_iter();
        if let Some((_, orphan)) = orphan {
            let Some((parent, name)) = missing.next() else {
                return Err(Error::corrupt(Corruption::general(format!(
                    "send: inode {} was given an orphan name and has no new one",
                    ent.ino
                ))));
            };
            let from = self.path(ent)?;
            let to = self.child_path(ent, parent, &name)?;
            self.out.command(&Command::Rename { from, to })?;
            self.model.remove_name(ent, Ent::ROOT, &orphan);
            self.model.orphans.remove(&orphan);
            self.model.add_name(ent, parent, name);
            self.touched_dirs.insert(parent);
        }
        for (parent, name) in missing {
            self.link(ent, parent, name)?;
        }
        Ok(())
    }

    /// Phase e: xattrs, data, size, owner and mode of a new or changed
    /// inode.
    fn contents(&mut self, ent: Ent) -> Result<()> {
        let entity = &self.entities[&ent];
        let new = entity.new.clone().expect("checked by the caller");
        let old = entity.old.clone();
        let path = self.path(ent)?;
        let xattrs_changed = self.xattrs(ent, old.is_some(), &path)?;
        if new.file_type() == FileType::Regular {
            self.data(ent, old.as_ref(), &new, &path)?;
        }
        let (n, o) = (&new.item, old.as_ref().map(|o| &o.item));
        let chown = o.is_none_or(|o| o.uid != n.uid || o.gid != n.gid);
        let chmod =
            new.file_type() != FileType::Symlink && (chown || o.is_none_or(|o| o.mode != n.mode));
        if chown {
            self.out.command(&Command::Chown {
                path: path.clone(),
                uid: u64::from(n.uid),
                gid: u64::from(n.gid),
            })?;
        }
        if chmod {
            self.out.command(&Command::Chmod {
                path: path.clone(),
                mode: u64::from(n.mode & 0o7777),
            })?;
        }
        if chown || xattrs_changed.contains(CAPABILITY_XATTR) {
            self.capability(ent, &path)?;
        }
        Ok(())
    }

    /// SET_XATTR / REMOVE_XATTR for the xattrs that differ, but
    /// `security.capability`, which CHOWN would clear: it goes after.
    /// Returns the names that differ.
    fn xattrs(&mut self, ent: Ent, had_old: bool, path: &StreamPath) -> Result<BTreeSet<Vec<u8>>> {
        let new = self.xattr_map(false, ent.ino)?;
        let old = if had_old {
            self.xattr_map(true, ent.ino)?
        } else {
            BTreeMap::new()
        };
        let mut changed = BTreeSet::new();
        for (name, value) in &new {
            if old.get(name) != Some(value) {
                changed.insert(name.clone());
                if name != CAPABILITY_XATTR {
                    self.out.command(&Command::SetXattr {
                        path: path.clone(),
                        name: name.clone(),
                        data: value.clone(),
                    })?;
                }
            }
        }
        for name in old.keys().filter(|n| !new.contains_key(*n)) {
            changed.insert(name.clone());
            self.out.command(&Command::RemoveXattr {
                path: path.clone(),
                name: name.clone(),
            })?;
        }
        Ok(changed)
    }

    fn xattr_map(&mut self, old: bool, ino: u64) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
        let mut out = BTreeMap::new();
        for (key, data) in self.trees.items(old, ino, item_type::XATTR_ITEM)? {
            for x in decode_item(&key, decode_xattrs(&data))? {
                out.insert(x.name, x.value);
            }
        }
        Ok(out)
    }

    fn capability(&mut self, ent: Ent, path: &StreamPath) -> Result<()> {
        if let Some(value) = self.xattr_map(false, ent.ino)?.remove(CAPABILITY_XATTR) {
            self.out.command(&Command::SetXattr {
                path: path.clone(),
                name: CAPABILITY_XATTR.to_vec(),
                data: value,
            })?;
        }
        Ok(())
    }

    /// A file's extents in the old or new tree, by file offset.
    fn extents(&mut self, old: bool, ino: u64) -> Result<Extents> {
        let mut out = BTreeMap::new();
        for (key, data) in self.trees.items(old, ino, item_type::EXTENT_DATA)? {
            let extent = decode_item(&key, FileExtent::decode_at(&key, &data))?;
            out.insert(key.offset, (extent, data));
        }
        Ok(out)
    }

    /// The data of a new or changed regular file: every range of the
    /// snapshot's data extents that the parent does not map to the same
    /// bytes of the same disk extent is written (or cloned); what the
    /// parent had as data and the snapshot as a hole (or preallocated)
    /// is written as zeros, within both sizes; then TRUNCATE if the size
    /// at the receiver still differs.
    fn data(
        &mut self,
        ent: Ent,
        old: Option<&InodeState>,
        new: &InodeState,
        path: &StreamPath,
    ) -> Result<()> {
        let new_size = new.item.size;
        let old_size = old.map_or(0, |o| o.item.size);
        let new_extents = self.extents(false, ent.ino)?;
        let old_extents = match old {
            Some(_) => self.extents(true, ent.ino)?,
            None => Extents::new(),
        };
        let keep_end = old_size.min(new_size);
        let mut zero = data_ranges(&old_extents, keep_end);
        for (start, end) in data_ranges(&new_extents, u64::MAX) {
            zero = subtract(&zero, start, end);
        }
        for (start, end) in zero {
            self.write_zeros(path, start, end)?;
        }
        let mut size_now = old_size;
        for (&key, (extent, raw)) in &new_extents {
            if matches!(extent, FileExtent::Prealloc { .. }) {
                continue;
            }
            let item_end = key.saturating_add(extent.len()).min(new_size);
            for (off, end) in changed_ranges(&old_extents, key, extent, raw, item_end) {
                let unaligned_ok = old.is_none() || old_size <= end;
                self.send_extent(ent, path, key, (off, end), extent, new_size, unaligned_ok)?;
                size_now = size_now.max(end);
            }
        }
        if size_now != new_size {
            self.out.command(&Command::Truncate {
                path: path.clone(),
                size: new_size,
            })?;
        }
        Ok(())
    }

    fn write_zeros(&mut self, path: &StreamPath, start: u64, end: u64) -> Result<()> {
        let mut at = start;
        while at < end {
            let len = (end - at).min(MAX_WRITE_DATA as u64);
            self.out.command(&Command::Write {
                path: path.clone(),
                offset: at,
                data: vec![0; len as usize],
            })?;
            self.out.stats.data_bytes += len;
            at += len;
        }
        Ok(())
    }

    /// `[off, end)` of the file, backed by `extent`: a CLONE when the
    /// same bytes of its disk extent went to another file earlier in
    /// this stream and the range may be cloned, else WRITEs of the data
    /// read through the engine.
    #[allow(clippy::too_many_arguments)]
    fn send_extent(
        &mut self,
        ent: Ent,
        path: &StreamPath,
        key: u64,
        (off, end): (u64, u64),
        extent: &FileExtent,
        size: u64,
        may_end_unaligned: bool,
    ) -> Result<()> {
        let len = end - off;
        let regular = match extent {
            FileExtent::Regular {
                disk_bytenr,
                offset,
                ..
            } => Some((*disk_bytenr, offset + (off - key))),
            _ => None,
        };
        if let Some((bytenr, extent_offset)) = regular {
            if let Some(source) = self.clone_source(
                ent,
                bytenr,
                extent_offset,
                len,
                off,
                end,
                size,
                may_end_unaligned,
            ) {
                let clone_offset = source.file_offset + (extent_offset - source.extent_offset);
                let clone_path = self.path(source.ent)?;
                self.out.command(&Command::Clone {
                    path: path.clone(),
                    offset: off,
                    len,
                    clone_uuid: self.uuid,
                    clone_ctransid: self.ctransid,
                    clone_path,
                    clone_offset,
                })?;
                return Ok(());
            }
        }
        let mut at = off;
        while at < end {
            let want = (end - at).min(READ_CHUNK as u64) as usize;
            let data = self.data.read_data(ent.ino, at, want)?;
            if data.len() != want {
                return Err(Error::corrupt(Corruption::general(format!(
                    "send: inode {} read {} bytes at {at}, its extents promise {want}",
                    ent.ino,
                    data.len()
                ))));
            }
            for (i, piece) in data.chunks(MAX_WRITE_DATA).enumerate() {
                self.out.command(&Command::Write {
                    path: path.clone(),
                    offset: at + (i * MAX_WRITE_DATA) as u64,
                    data: piece.to_vec(),
                })?;
                self.out.stats.data_bytes += piece.len() as u64;
            }
            at += want as u64;
        }
        if let Some((bytenr, extent_offset)) = regular {
            self.sent_extents.entry(bytenr).or_default().push(Sent {
                ent,
                file_offset: off,
                extent_offset,
                len,
                size,
            });
        }
        Ok(())
    }

    /// An earlier file of this stream holding bytes `extent_offset..+len`
    /// of disk extent `bytenr`, if cloning them to `[off, end)` is
    /// allowed: block-aligned, or ending at both files' ends (and past
    /// the target's size at the receiver).
    #[allow(clippy::too_many_arguments)]
    fn clone_source(
        &self,
        ent: Ent,
        bytenr: u64,
        extent_offset: u64,
        len: u64,
        off: u64,
        end: u64,
        size: u64,
        may_end_unaligned: bool,
    ) -> Option<Sent> {
        self.sent_extents.get(&bytenr)?.iter().copied().find(|s| {
            let inside = s.ent != ent
                && s.extent_offset <= extent_offset
                && extent_offset + len <= s.extent_offset + s.len;
            if !inside {
                return false;
            }
            let clone_offset = s.file_offset + (extent_offset - s.extent_offset);
            let aligned_start =
                off.is_multiple_of(CLONE_ALIGN) && clone_offset.is_multiple_of(CLONE_ALIGN);
            let aligned_len = len.is_multiple_of(CLONE_ALIGN)
                || (may_end_unaligned && end == size && clone_offset + len == s.size);
            aligned_start && aligned_len
        })
    }

    /// Phase g: UTIMES of every inode sent, of every directory whose
    /// entries changed, and of the root if an orphan passed through it.
    fn times(&mut self) -> Result<()> {
        let mut ents: BTreeSet<Ent> = self
            .entities
            .iter()
            .filter(|(_, e)| e.new.is_some())
            .map(|(&k, _)| k)
            .collect();
        ents.extend(
            self.touched_dirs
                .iter()
                .copied()
                .filter(|d| self.entities.get(d).is_none_or(|e| e.new.is_some())),
        );
        for ent in ents {
            let item = match self.entities.get(&ent).and_then(|e| e.new.as_ref()) {
                Some(state) => state.item.clone(),
                None => self.untouched_item(ent.ino)?,
            };
            let path = self.path(ent)?;
            self.out.command(&Command::Utimes {
                path,
                atime: stream_time(item.atime),
                mtime: stream_time(item.mtime),
                ctime: stream_time(item.ctime),
            })?;
        }
        Ok(())
    }

    fn untouched_item(&mut self, ino: u64) -> Result<InodeItem> {
        Ok(self
            .trees
            .inode(false, ino)?
            .ok_or_else(|| {
                Error::corrupt(Corruption::general(format!(
                    "send: directory {ino} is not in the snapshot"
                )))
            })?
            .item)
    }
}

/// A file's extent items by file offset, decoded and as stored.
type Extents = BTreeMap<u64, (FileExtent, Vec<u8>)>;

/// The file ranges `extents` back with data (not preallocated), below
/// `limit`, merged.
fn data_ranges(extents: &Extents, limit: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (&key, (extent, _)) in extents {
        let end = key.saturating_add(extent.len()).min(limit);
        if matches!(extent, FileExtent::Prealloc { .. }) || key >= end {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.1 == key => last.1 = end,
            _ => out.push((key, end)),
        }
    }
    out
}

/// The parts of `[key, end)` (the snapshot's item `extent`, stored as
/// `raw`) that the parent does not map to the same bytes: an inline item
/// is the same only as the same item; a disk-backed one where a parent
/// item of the same kind maps the same file offsets to the same offsets
/// of the same disk extent (after a split, a punch or a write into the
/// middle, most of a file's extents are such).
fn changed_ranges(
    old: &Extents,
    key: u64,
    extent: &FileExtent,
    raw: &[u8],
    end: u64,
) -> Vec<(u64, u64)> {
    if key >= end {
        return Vec::new();
    }
    let mut out = vec![(key, end)];
    if old.get(&key).is_some_and(|(_, other)| other == raw) {
        return Vec::new();
    }
    let Some(disk) = extent.disk_ref() else {
        return out;
    };
    for (&okey, (oextent, _)) in old.range(..end).rev() {
        let oend = okey.saturating_add(oextent.len());
        if oend <= key {
            break;
        }
        let Some(odisk) = oextent.disk_ref() else {
            continue;
        };
        let same_kind = std::mem::discriminant(extent) == std::mem::discriminant(oextent)
            && extent.compressed_ref() == oextent.compressed_ref();
        // Same disk extent, and file offset minus extent offset agrees.
        let same_mapping = odisk.disk_bytenr == disk.disk_bytenr
            && key.wrapping_sub(disk.offset) == okey.wrapping_sub(odisk.offset);
        if same_kind && same_mapping {
            out = subtract(&out, okey.max(key), oend.min(end));
        }
    }
    out
}

/// `ranges` (sorted, disjoint) without `[start, end)`.
fn subtract(ranges: &[(u64, u64)], start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(a, b) in ranges {
        if b <= start || a >= end {
            out.push((a, b));
            continue;
        }
        if a < start {
            out.push((a, start));
        }
        if b > end {
            out.push((end, b));
        }
    }
    out
}
