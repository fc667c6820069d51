//! Reading the canonical [`View`] out of a live engine.
//!
//! The walk uses only the public API, the way a user would: `readdir` (in
//! small pages, to exercise offsets), `lookup` of every name, `getattr`,
//! `read_file`, `readlink`, `listxattr` and `getxattr`. Along the way it
//! checks what the API promises about itself: `readdir` and `lookup` agree
//! on the inode and its type, no name is listed twice, a directory's `..`
//! is the directory it was found in, and no directory is reached twice.

use crate::model::{page_digest, show_path, Entry, Kind, Path, View, PAGE};
use birch::device::BlockDevice;
use birch::fs::Filesystem;
use std::collections::{BTreeMap, HashSet};

/// Entries fetched per `readdir` call.
const READDIR_PAGE: usize = 7;
/// Bytes fetched per `read_file` call.
const READ_CHUNK: usize = 1 << 20;

/// The canonical view of a live filesystem, or what is inconsistent in it.
pub fn engine_view<D: BlockDevice + 'static>(fs: &Filesystem<D>) -> Result<View, String> {
    engine_view_with_inos(fs).map(|(view, _)| view)
}

/// [`engine_view`], and the engine's inode number at each path (the crash
/// oracles follow inodes, not names, across a crash: replay keeps inode
/// numbers).
pub fn engine_view_with_inos<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
) -> Result<(View, BTreeMap<Path, u64>), String> {
    let mut raw = BTreeMap::new();
    let mut dirs_seen = HashSet::new();
    let root = fs.root_ino();
    let mut stack: Vec<(Path, u64)> = vec![(Vec::new(), root)];
    while let Some((path, ino)) = stack.pop() {
        let attr = fs
            .getattr(ino)
            .map_err(|e| format!("{}: getattr({ino}): {e}", show_path(&path)))?;
        let kind = Kind::from_engine(attr.file_type);
        let mut entry = Entry {
            kind,
            perm: attr.perm,
            uid: attr.uid,
            gid: attr.gid,
            nlink: attr.nlink,
            size: (kind != Kind::Dir).then_some(attr.size),
            content: Vec::new(),
            target: Vec::new(),
            xattrs: BTreeMap::new(),
            link_group: Vec::new(),
        };
        match kind {
            Kind::File => {
                entry.content = file_digests(fs, ino, attr.size)
                    .map_err(|e| format!("{}: {e}", show_path(&path)))?
            }
            Kind::Symlink => {
                entry.target = fs
                    .readlink(ino)
                    .map_err(|e| format!("{}: readlink: {e}", show_path(&path)))?;
                if entry.target.len() as u64 != attr.size {
                    return Err(format!(
                        "{}: symlink size {} but target is {} bytes",
                        show_path(&path),
                        attr.size,
                        entry.target.len()
                    ));
                }
            }
            Kind::Dir => {
                if !dirs_seen.insert(ino) {
                    return Err(format!(
                        "{}: directory inode {ino} reached twice",
                        show_path(&path)
                    ));
                }
                let children =
                    list_dir(fs, ino).map_err(|e| format!("{}: {e}", show_path(&path)))?;
                for (name, child) in children.into_iter().rev() {
                    let mut p = path.clone();
                    p.push(name);
                    stack.push((p, child));
                }
            }
            _ => {}
        }
        let names = fs
            .listxattr(ino)
            .map_err(|e| format!("{}: listxattr: {e}", show_path(&path)))?;
        for name in names {
            let value = fs.getxattr(ino, &name).map_err(|e| {
                format!(
                    "{}: getxattr({:?}) of a listed name: {e}",
                    show_path(&path),
                    String::from_utf8_lossy(&name)
                )
            })?;
            if entry.xattrs.insert(name.clone(), value).is_some() {
                return Err(format!(
                    "{}: listxattr names {:?} twice",
                    show_path(&path),
                    String::from_utf8_lossy(&name)
                ));
            }
        }
        raw.insert(path, (ino, entry));
    }
    let inos = raw.iter().map(|(p, (ino, _))| (p.clone(), *ino)).collect();
    Ok((View::from_raw(raw), inos))
}

/// The entries of a directory (name, inode), checked against `lookup` and
/// `..`.
fn list_dir<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    dir: u64,
) -> Result<Vec<(Vec<u8>, u64)>, String> {
    let mut out = Vec::new();
    let mut names = HashSet::new();
    let mut offset = 0;
    loop {
        let page = fs
            .readdir(dir, offset, READDIR_PAGE)
            .map_err(|e| format!("readdir({dir}, {offset}): {e}"))?;
        if page.is_empty() {
            break;
        }
        for e in page {
            if e.next_offset <= offset {
                return Err(format!(
                    "readdir offsets go backwards: {} after {offset}",
                    e.next_offset
                ));
            }
            offset = e.next_offset;
            if !names.insert(e.name.clone()) {
                return Err(format!(
                    "readdir lists {:?} twice",
                    String::from_utf8_lossy(&e.name)
                ));
            }
            let attr = fs.lookup(dir, &e.name).map_err(|err| {
                format!(
                    "lookup of listed name {:?}: {err}",
                    String::from_utf8_lossy(&e.name)
                )
            })?;
            if attr.ino != e.ino || attr.file_type != e.file_type {
                return Err(format!(
                    "readdir says {:?} is inode {} ({:?}), lookup says inode {} ({:?})",
                    String::from_utf8_lossy(&e.name),
                    e.ino,
                    e.file_type,
                    attr.ino,
                    attr.file_type
                ));
            }
            if Kind::from_engine(attr.file_type) == Kind::Dir {
                let dotdot = fs.lookup(e.ino, b"..").map_err(|err| {
                    format!("lookup of {:?}/..: {err}", String::from_utf8_lossy(&e.name))
                })?;
                if dotdot.ino != dir {
                    return Err(format!(
                        "{:?}/.. is inode {}, not its directory {dir}",
                        String::from_utf8_lossy(&e.name),
                        dotdot.ino
                    ));
                }
            }
            out.push((e.name, e.ino));
        }
    }
    out.sort();
    Ok(out)
}

/// Page digests of a file read through `read_file`.
pub fn file_digests<D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    ino: u64,
    size: u64,
) -> Result<Vec<u32>, String> {
    let mut out = Vec::with_capacity(size.div_ceil(PAGE) as usize);
    let mut offset = 0u64;
    while offset < size {
        let want = (size - offset).min(READ_CHUNK as u64) as usize;
        let data = fs
            .read_file(ino, offset, want)
            .map_err(|e| format!("read_file({ino}, {offset}, {want}): {e}"))?;
        if data.len() != want {
            return Err(format!(
                "read_file({ino}, {offset}, {want}) returned {} bytes below i_size {size}",
                data.len()
            ));
        }
        for chunk in data.chunks(PAGE as usize) {
            out.push(page_digest(chunk));
        }
        offset += want as u64;
    }
    // Reading at or past the end returns nothing.
    let past = fs
        .read_file(ino, size, 16)
        .map_err(|e| format!("read_file at EOF: {e}"))?;
    if !past.is_empty() {
        return Err(format!(
            "read_file at EOF ({size}) returned {} bytes",
            past.len()
        ));
    }
    Ok(out)
}
