//! For the send tests: a small receive through the library API (each
//! command applied to a second birch filesystem, paths resolved by
//! lookup from the received subvolume's root), and a whole-tree
//! description to compare a received subvolume with the one sent.

use birch::device::BlockDevice;
use birch::format::send_stream::{Command, StreamPath, StreamReader, StreamTime};
use birch::format::{FileType, Timespec, ROOT_DIR_INO};
use birch::fs::{Filesystem, InoSpace, RenameFlags, SetAttr, SetTime, XattrSetMode};
use std::collections::BTreeMap;

/// Decodes a whole stream.
pub fn decode(stream: &[u8]) -> Vec<Command> {
    let mut reader = StreamReader::new(stream).expect("stream header");
    let mut out = Vec::new();
    while let Some((_, c)) = reader.next_command().expect("a valid stream") {
        out.push(c);
    }
    out
}

/// Applies decoded streams to `fs`, receiving subvolumes in its top
/// level; returns the id of the last subvolume received.
pub struct Applier<'a, D: BlockDevice + 'static> {
    pub fs: &'a Filesystem<D>,
    current: Option<(u64, [u8; 16], u64)>,
    pub last: Option<u64>,
}

fn time(t: StreamTime) -> SetTime {
    SetTime::At(Timespec {
        sec: t.sec as i64,
        nsec: t.nsec,
    })
}

impl<'a, D: BlockDevice + 'static> Applier<'a, D> {
    pub fn new(fs: &'a Filesystem<D>) -> Self {
        Applier {
            fs,
            current: None,
            last: None,
        }
    }

    fn root(&self) -> u64 {
        InoSpace::join(self.current.expect("inside a subvolume").0, ROOT_DIR_INO)
    }

    /// The inode at `path` (the subvolume's root for "").
    fn at(&self, path: &StreamPath) -> u64 {
        let mut ino = self.root();
        for part in path
            .as_bytes()
            .split(|&b| b == b'/')
            .filter(|p| !p.is_empty())
        {
            ino = self
                .fs
                .lookup(ino, part)
                .unwrap_or_else(|e| panic!("receive: lookup of {path}: {e}"))
                .ino;
        }
        ino
    }

    /// The directory holding `path`'s last component, and the component.
    fn parent_of(&self, path: &StreamPath) -> (u64, Vec<u8>) {
        let bytes = path.as_bytes();
        match bytes.iter().rposition(|&b| b == b'/') {
            Some(i) => (
                self.at(&StreamPath::new(&bytes[..i]).unwrap()),
                bytes[i + 1..].to_vec(),
            ),
            None => (self.root(), bytes.to_vec()),
        }
    }

    fn find_subvolume(&self, uuid: &[u8; 16]) -> u64 {
        let all = self.fs.list_subvolumes().unwrap();
        all.iter()
            .find(|s| s.item.is_some_and(|i| &i.received_uuid == uuid))
            .or_else(|| all.iter().find(|s| s.item.is_some_and(|i| &i.uuid == uuid)))
            .expect("the parent subvolume was received")
            .id
    }

    pub fn apply_all(&mut self, stream: &[u8]) {
        for c in decode(stream) {
            let shown = format!("{c:?}");
            let shown: String = shown.chars().take(200).collect();
            self.apply(c)
                .unwrap_or_else(|e| panic!("receive: {shown}: {e}"));
        }
    }

    /// Long because it is one table: an arm per command, each one call.
    pub fn apply(&mut self, command: Command) -> birch::Result<()> {
        let fs = self.fs;
        match command {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            } => {
                let id = fs.create_subvolume(ROOT_DIR_INO, path.as_bytes(), 0, 0)?;
                self.current = Some((id, uuid, ctransid));
            }
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                ..
            } => {
                let source = self.find_subvolume(&clone_uuid);
                let id = fs.create_snapshot(source, ROOT_DIR_INO, path.as_bytes(), false)?;
                self.current = Some((id, uuid, ctransid));
            }
            Command::Mkfile { path, .. } => {
                let (dir, name) = self.parent_of(&path);
                fs.create(dir, &name, 0o600, 0, 0)?;
            }
            Command::Mkdir { path, .. } => {
                let (dir, name) = self.parent_of(&path);
                fs.mkdir(dir, &name, 0o700, 0, 0)?;
            }
            Command::Mknod {
                path, mode, rdev, ..
            } => {
                let (dir, name) = self.parent_of(&path);
                fs.mknod(dir, &name, mode as u32, 0, 0, rdev)?;
            }
            Command::Mkfifo { path, .. } => {
                let (dir, name) = self.parent_of(&path);
                fs.mknod(dir, &name, libc::S_IFIFO | 0o600, 0, 0, 0)?;
            }
            Command::Mksock { path, .. } => {
                let (dir, name) = self.parent_of(&path);
                fs.mknod(dir, &name, libc::S_IFSOCK | 0o600, 0, 0, 0)?;
            }
            Command::Symlink { path, target, .. } => {
                let (dir, name) = self.parent_of(&path);
                fs.symlink(dir, &name, &target, 0, 0)?;
            }
            Command::Rename { from, to } => {
                let (d1, n1) = self.parent_of(&from);
                let (d2, n2) = self.parent_of(&to);
                fs.rename(d1, &n1, d2, &n2, RenameFlags::default())?;
            }
            Command::Link { path, existing } => {
                let ino = self.at(&existing);
                let (dir, name) = self.parent_of(&path);
                fs.link(ino, dir, &name)?;
            }
            Command::Unlink { path } => {
                let (dir, name) = self.parent_of(&path);
                fs.unlink(dir, &name)?;
            }
            Command::Rmdir { path } => {
                let (dir, name) = self.parent_of(&path);
                fs.rmdir(dir, &name)?;
            }
            Command::SetXattr { path, name, data } => {
                fs.setxattr(self.at(&path), &name, &data, XattrSetMode::CreateOrReplace)?;
            }
            Command::RemoveXattr { path, name } => fs.removexattr(self.at(&path), &name)?,
            Command::Write { path, offset, data } => {
                assert_eq!(fs.write_file(self.at(&path), offset, &data)?, data.len());
            }
            Command::Clone {
                path,
                offset,
                len,
                clone_uuid,
                clone_path,
                clone_offset,
                ..
            } => {
                assert_eq!(
                    clone_uuid,
                    self.current.unwrap().1,
                    "clones from this subvolume"
                );
                let src = self.at(&clone_path);
                let dst = self.at(&path);
                assert_eq!(
                    fs.copy_file_range(src, clone_offset, dst, offset, len)?,
                    len
                );
            }
            Command::Truncate { path, size } => {
                fs.truncate(self.at(&path), size)?;
            }
            Command::Chmod { path, mode } => {
                let changes = SetAttr {
                    mode: Some(mode as u32),
                    ..Default::default()
                };
                fs.setattr(self.at(&path), &changes)?;
            }
            Command::Chown { path, uid, gid } => {
                let changes = SetAttr {
                    uid: Some(uid as u32),
                    gid: Some(gid as u32),
                    ..Default::default()
                };
                fs.setattr(self.at(&path), &changes)?;
            }
            Command::Utimes {
                path, atime, mtime, ..
            } => {
                let changes = SetAttr {
                    atime: Some(time(atime)),
                    mtime: Some(time(mtime)),
                    ..Default::default()
                };
                fs.setattr(self.at(&path), &changes)?;
            }
            Command::UpdateExtent { .. } => {}
            Command::End => {
                let (id, uuid, ctransid) = self.current.take().expect("END inside a subvolume");
                fs.set_received_subvolume(id, uuid, ctransid, Timespec::default())?;
                fs.set_subvolume_readonly(id, true)?;
                self.last = Some(id);
            }
        }
        Ok(())
    }
}

/// Path -> everything a receive must reproduce of it: type, mode,
/// owner, size (not for directories), rdev, atime and mtime, symlink
/// target, xattrs, data, and which earlier path it shares its inode with.
pub type Description = BTreeMap<String, String>;

/// Describes the tree below directory `dir` (an external inode number).
/// Both trees compared must be read-only: reading data would stamp
/// atimes otherwise.
pub fn describe<D: BlockDevice + 'static>(fs: &Filesystem<D>, dir: u64) -> Description {
    let mut out = Description::new();
    let mut inodes: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    out.insert("/".into(), attrs(fs, dir));
    walk(fs, dir, "", &mut out, &mut inodes);
    for paths in inodes.values().filter(|p| p.len() > 1) {
        for p in paths {
            let s = out.get_mut(p).unwrap();
            *s += &format!(" links {paths:?}");
        }
    }
    out
}

fn attrs<D: BlockDevice + 'static>(fs: &Filesystem<D>, ino: u64) -> String {
    let a = fs.getattr(ino).unwrap();
    let mut s = format!(
        "{:?} perm {:o} uid {} gid {} rdev {} atime {:?} mtime {:?}",
        a.file_type, a.perm, a.uid, a.gid, a.rdev, a.atime, a.mtime
    );
    if a.file_type != FileType::Directory {
        s += &format!(" size {} nlink {}", a.size, a.nlink);
    }
    let mut names = fs.listxattr(ino).unwrap();
    names.sort();
    for name in names {
        let value = fs.getxattr(ino, &name).unwrap();
        s += &format!(
            " xattr {}={:?}",
            String::from_utf8_lossy(&name),
            String::from_utf8_lossy(&value)
        );
    }
    match a.file_type {
        FileType::Symlink => {
            s += &format!(
                " -> {}",
                String::from_utf8_lossy(&fs.readlink(ino).unwrap())
            );
        }
        FileType::Regular => {
            let data = fs.read_file(ino, 0, a.size as usize).unwrap();
            s += &format!(" data {:016x}", fnv(&data));
        }
        _ => {}
    }
    s
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn walk<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    dir: u64,
    prefix: &str,
    out: &mut Description,
    inodes: &mut BTreeMap<u64, Vec<String>>,
) {
    for e in fs.readdir(dir, 0, usize::MAX).unwrap() {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
        out.insert(path.clone(), attrs(fs, e.ino));
        let paths = inodes.entry(e.ino).or_default();
        paths.push(path.clone());
        paths.sort();
        if e.file_type == FileType::Directory {
            walk(fs, e.ino, &path, out, inodes);
        }
    }
}
