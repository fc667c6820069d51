//! The reference model: an in-memory namespace with POSIX semantics.
//!
//! The model knows nothing of blocks, trees or transactions. It holds
//! directories, regular files (sparse byte contents), symlinks, special
//! files, hard links (several names of one inode), xattrs, permission bits,
//! owners and link counts, and implements every operation of the engine's
//! API with the result a Linux kernel filesystem gives, including which
//! errno wins when several apply (the order follows fs/namei.c: path walk,
//! then the checks of `do_renameat2`/`do_linkat`/..., then `vfs_*`).
//!
//! Operations are addressed by path (a list of components) the way system
//! calls are: the model walks the path itself. The harness does the same
//! walk on the engine with `lookup`, so the two are compared on the final
//! operation. Symlinks are never followed (the walk treats a symlink as a
//! non-directory, ENOTDIR); `.` and `..` are never passed (the kernel's VFS
//! resolves them before a filesystem sees them).
//!
//! [`View`] is the canonical form both sides are compared in: one entry per
//! path, with attributes, a digest of each page of file content, symlink
//! targets, xattrs and hard-link groups. [`Model::view`] builds it from the
//! model, [`crate::extract::engine_view`] from a live `Filesystem`, and
//! [`diff_views`] names the first path where two differ.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// Longest name (bytes).
pub const NAME_MAX: usize = 255;
/// Page size the content digests use.
pub const PAGE: u64 = 4096;
/// Most links one inode may have (ext4's and birch's EXT4_LINK_MAX).
pub const LINK_MAX: u32 = 65000;
/// Largest file size (offsets must fit an i64, as on btrfs).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Longest symlink target (PATH_MAX - 1).
pub const SYMLINK_MAX: usize = 4095;

pub type Errno = i32;
pub type MResult<T> = Result<T, Errno>;

/// A path as a list of components (the empty list is the root).
pub type Path = Vec<Vec<u8>>;

/// Model inode number (the model's own numbering; never compared to the
/// engine's).
pub type MIno = u64;

/// The root directory's model inode number.
pub const ROOT: MIno = 1;

/// The top-level subvolume's id (the engine's tree 5; the model numbers
/// the subvolumes it creates from 256 on, in its own order, and never
/// compares them with the engine's ids).
pub const TOP_SUBVOL: u64 = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl Kind {
    pub fn from_engine(t: birch::format::FileType) -> Kind {
        use birch::format::FileType as T;
        match t {
            T::Regular => Kind::File,
            T::Directory => Kind::Dir,
            T::Symlink => Kind::Symlink,
            T::Fifo => Kind::Fifo,
            T::Socket => Kind::Socket,
            T::CharDevice => Kind::CharDev,
            T::BlockDevice => Kind::BlockDev,
        }
    }

    /// The S_IFMT bits of this kind.
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => libc::S_IFREG,
            Kind::Dir => libc::S_IFDIR,
            Kind::Symlink => libc::S_IFLNK,
            Kind::Fifo => libc::S_IFIFO,
            Kind::Socket => libc::S_IFSOCK,
            Kind::CharDev => libc::S_IFCHR,
            Kind::BlockDev => libc::S_IFBLK,
        }
    }
}

/// `renameat2` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub no_replace: bool,
    pub exchange: bool,
    /// RENAME_WHITEOUT: the source's name becomes a whiteout (a character
    /// device 0:0, mode 0, owned by root as the workloads run).
    pub whiteout: bool,
}

/// `setxattr` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrMode {
    #[default]
    Any,
    /// XATTR_CREATE
    Create,
    /// XATTR_REPLACE
    Replace,
}

/// Sparse file contents: pages that are absent read as zeros. Invariant:
/// bytes of the last page beyond `size` are zero, and no page lies wholly
/// beyond `size`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileData {
    pub size: u64,
    pages: BTreeMap<u64, Box<[u8]>>,
}

impl FileData {
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let end = offset + data.len() as u64;
        let mut pos = offset;
        while pos < end {
            let index = pos / PAGE;
            let in_page = (pos % PAGE) as usize;
            let n = ((PAGE as usize - in_page) as u64).min(end - pos) as usize;
            let page = self
                .pages
                .entry(index)
                .or_insert_with(|| vec![0u8; PAGE as usize].into_boxed_slice());
            let from = (pos - offset) as usize;
            page[in_page..in_page + n].copy_from_slice(&data[from..from + n]);
            pos += n as u64;
        }
        self.size = self.size.max(end);
    }

    pub fn truncate(&mut self, size: u64) {
        if size < self.size {
            let keep = size.div_ceil(PAGE);
            self.pages.split_off(&keep);
            if !size.is_multiple_of(PAGE) {
                if let Some(page) = self.pages.get_mut(&(size / PAGE)) {
                    page[(size % PAGE) as usize..].fill(0);
                }
            }
        }
        self.size = size;
    }

    /// Zeroes `[offset, offset + len)` cut at the end of the file (a
    /// punched hole: the size stays), dropping the pages it covers whole.
    pub fn punch(&mut self, offset: u64, len: u64) {
        let end = self.size.min(offset.saturating_add(len));
        let mut pos = offset;
        while pos < end {
            let index = pos / PAGE;
            let in_page = (pos % PAGE) as usize;
            let n = ((PAGE as usize - in_page) as u64).min(end - pos) as usize;
            if n == PAGE as usize {
                self.pages.remove(&index);
            } else if let Some(page) = self.pages.get_mut(&index) {
                page[in_page..in_page + n].fill(0);
            }
            pos += n as u64;
        }
    }

    /// Zeroes `[offset, offset + len)` (a zero range): with `keep_size`
    /// cut at the end of the file, else growing the file to cover it.
    /// The pages it covers hold zeros, allocated (not holes): birch
    /// preallocates them, and `allocated_bytes` counts them.
    pub fn zero(&mut self, offset: u64, len: u64, keep_size: bool) {
        let end = offset.saturating_add(len);
        let stop = if keep_size { self.size.min(end) } else { end };
        let mut pos = offset;
        while pos < stop {
            let index = pos / PAGE;
            let in_page = (pos % PAGE) as usize;
            let n = ((PAGE as usize - in_page) as u64).min(stop - pos) as usize;
            let page = (self.pages.entry(index))
                .or_insert_with(|| vec![0u8; PAGE as usize].into_boxed_slice());
            page[in_page..in_page + n].fill(0);
            pos += n as u64;
        }
        if !keep_size {
            self.size = self.size.max(end);
        }
    }

    /// Bytes at `[offset, offset + len)`, cut at the end of the file.
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        if offset >= self.size || len == 0 {
            return Vec::new();
        }
        let end = self.size.min(offset.saturating_add(len as u64));
        let mut out = vec![0u8; (end - offset) as usize];
        let first = offset / PAGE;
        let last = (end - 1) / PAGE;
        for (&index, page) in self.pages.range(first..=last) {
            let page_start = index * PAGE;
            let from = offset.max(page_start);
            let to = end.min(page_start + PAGE);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&page[(from - page_start) as usize..(to - page_start) as usize]);
        }
        out
    }

    /// Bytes held in non-hole pages (what the data would take on disk,
    /// roughly).
    pub fn allocated_bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE
    }

    /// Digest of each page of the file (the last one cut at `size`).
    pub fn page_digests(&self) -> Vec<u32> {
        let pages = self.size.div_ceil(PAGE);
        let mut out = Vec::with_capacity(pages as usize);
        for index in 0..pages {
            let len = (self.size - index * PAGE).min(PAGE) as usize;
            out.push(match self.pages.get(&index) {
                Some(p) => page_digest(&p[..len]),
                None => zero_digest(len),
            });
        }
        out
    }
}

/// Digest of one page of content (crc32c).
pub fn page_digest(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

fn zero_digest(len: usize) -> u32 {
    static ZEROS: [u8; PAGE as usize] = [0; PAGE as usize];
    page_digest(&ZEROS[..len])
}

#[derive(Clone, Debug)]
pub enum Body {
    File(FileData),
    Dir {
        entries: BTreeMap<Vec<u8>, MIno>,
        parent: MIno,
    },
    Symlink(Vec<u8>),
    Special,
}

#[derive(Clone, Debug)]
pub struct Inode {
    pub kind: Kind,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub body: Body,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Open handles; an inode with no names lives while this is non-zero.
    pub open: u32,
    /// The subvolume the inode belongs to. An entry whose inode is in
    /// another subvolume than its directory is a subvolume link, and that
    /// inode is the subvolume's root directory.
    pub subvol: u64,
}

impl Inode {
    fn entries(&self) -> &BTreeMap<Vec<u8>, MIno> {
        match &self.body {
            Body::Dir { entries, .. } => entries,
            _ => panic!("not a directory"),
        }
    }

    fn entries_mut(&mut self) -> &mut BTreeMap<Vec<u8>, MIno> {
        match &mut self.body {
            Body::Dir { entries, .. } => entries,
            _ => panic!("not a directory"),
        }
    }

    pub fn file(&self) -> Option<&FileData> {
        match &self.body {
            Body::File(f) => Some(f),
            _ => None,
        }
    }
}

/// Attributes an operation returns (what `stat` shows that the model knows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttrView {
    pub kind: Kind,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    /// `None` for directories (their size is the engine's own business).
    pub size: Option<u64>,
}

impl AttrView {
    pub fn from_engine(a: &birch::fs::Attr) -> AttrView {
        let kind = Kind::from_engine(a.file_type);
        AttrView {
            kind,
            perm: a.perm,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            size: (kind != Kind::Dir).then_some(a.size),
        }
    }
}

/// A subvolume of the model (docs/SNAPSHOTS.md): its root directory and
/// whether it refuses changes.
#[derive(Clone, Debug)]
pub struct Subvol {
    pub root: MIno,
    pub readonly: bool,
}

/// The reference filesystem.
#[derive(Clone, Debug)]
pub struct Model {
    inodes: HashMap<MIno, Inode>,
    next: MIno,
    /// Live subvolumes by model id, the top level (5) included.
    subvols: BTreeMap<u64, Subvol>,
    next_subvol: u64,
    /// Inodes of deleted subvolumes: an open handle on one gets ENOENT,
    /// as the engine's do (docs/SNAPSHOTS.md, step 9).
    dead: HashSet<MIno>,
    /// Deleted subvolumes with inodes open: all their inodes stay
    /// (unreachable) and work through the handles until the last release,
    /// but the root directory lists nothing (ENOENT), as the engine's
    /// (docs/SNAPSHOTS.md (d) step 3).
    held_deleted: BTreeMap<u64, Subvol>,
}

impl Default for Model {
    fn default() -> Self {
        Self::new()
    }
}

fn check_name_len(name: &[u8]) -> MResult<()> {
    if name.len() > NAME_MAX {
        Err(libc::ENAMETOOLONG)
    } else {
        Ok(())
    }
}

impl Model {
    /// An empty filesystem: a root directory with mode 0755 owned by 0:0.
    pub fn new() -> Model {
        let root = Inode {
            kind: Kind::Dir,
            perm: 0o755,
            uid: 0,
            gid: 0,
            nlink: 2,
            body: Body::Dir {
                entries: BTreeMap::new(),
                parent: ROOT,
            },
            xattrs: BTreeMap::new(),
            open: 0,
            subvol: TOP_SUBVOL,
        };
        Model {
            inodes: HashMap::from([(ROOT, root)]),
            next: ROOT + 1,
            subvols: BTreeMap::from([(
                TOP_SUBVOL,
                Subvol {
                    root: ROOT,
                    readonly: false,
                },
            )]),
            next_subvol: 256,
            dead: HashSet::new(),
            held_deleted: BTreeMap::new(),
        }
    }

    // ----- subvolumes -----

    /// Whether `ino` belongs to a deleted subvolume (its handles get
    /// ENOENT).
    pub fn is_dead(&self, ino: MIno) -> bool {
        self.dead.contains(&ino)
    }

    /// EROFS when `ino`'s subvolume is read-only.
    pub fn check_writable(&self, ino: MIno) -> MResult<()> {
        if self.subvol_of(ino).readonly {
            Err(libc::EROFS)
        } else {
            Ok(())
        }
    }

    /// Whether `ino` is the root directory of a subvolume.
    pub fn is_subvol_root(&self, ino: MIno) -> bool {
        self.subvol_of(ino).root == ino
    }

    /// `ino`'s subvolume: a live one, or a deleted one still held.
    fn subvol_of(&self, ino: MIno) -> &Subvol {
        let id = self.node(ino).subvol;
        self.subvols
            .get(&id)
            .or_else(|| self.held_deleted.get(&id))
            .unwrap_or_else(|| panic!("model inode {ino}: subvolume {id} is gone"))
    }

    /// Whether entry `name` of `dir` is a subvolume link (a valid name
    /// that exists and leads into another subvolume).
    fn is_link(&self, dir: MIno, name: &[u8]) -> bool {
        name.len() <= NAME_MAX
            && self
                .node(dir)
                .entries()
                .get(name)
                .is_some_and(|&c| self.node(c).subvol != self.node(dir).subvol)
    }

    /// The paths of every subvolume's root directory (the top level's is
    /// the empty path).
    pub fn subvolume_paths(&self) -> Vec<Path> {
        self.paths()
            .into_iter()
            .filter(|(_, ino, _)| self.is_subvol_root(*ino))
            .map(|(p, _, _)| p)
            .collect()
    }

    /// `subvolume create`: an empty subvolume linked as `path`, its root
    /// directory 0755 owned by 0:0 (what `create_subvolume` with uid and
    /// gid 0 makes). The engine's order: the parent's subvolume writable,
    /// the name, free.
    pub fn create_subvolume(&mut self, path: &[Vec<u8>]) -> MResult<MIno> {
        let (dir, name) = self.parent(path)?;
        self.check_writable(dir)?;
        check_name_len(name)?;
        if self.node(dir).entries().contains_key(name) {
            return Err(libc::EEXIST);
        }
        let id = self.next_subvol;
        self.next_subvol += 1;
        let ino = self.new_inode(
            Kind::Dir,
            0o755,
            0,
            0,
            Body::Dir {
                entries: BTreeMap::new(),
                parent: dir,
            },
        );
        self.node_mut(ino).subvol = id;
        self.subvols.insert(
            id,
            Subvol {
                root: ino,
                readonly: false,
            },
        );
        self.insert_entry(dir, name, ino);
        self.node_mut(dir).nlink += 1;
        Ok(ino)
    }

    /// `subvolume snapshot [-r] source dest`: a new subvolume holding a
    /// copy of `source`'s subvolume as it is now (the model has no
    /// commits: the snapshot's commit sees every completed change), less
    /// the links to subvolumes nested in it (the engine leaves them out,
    /// docs/SNAPSHOTS.md step 8), linked at `dest` after the copy (so a
    /// snapshot into its own source does not contain itself). EINVAL when
    /// `source` is no subvolume's root directory.
    pub fn snapshot(
        &mut self,
        source: &[Vec<u8>],
        dest: &[Vec<u8>],
        readonly: bool,
    ) -> MResult<MIno> {
        let src = self.resolve(source)?;
        if !self.is_subvol_root(src) {
            return Err(libc::EINVAL);
        }
        let (dir, name) = self.parent(dest)?;
        self.check_writable(dir)?;
        check_name_len(name)?;
        if self.node(dir).entries().contains_key(name) {
            return Err(libc::EEXIST);
        }
        let id = self.next_subvol;
        self.next_subvol += 1;
        let src_subvol = self.node(src).subvol;
        let mut copied: HashMap<MIno, MIno> = HashMap::new();
        let root = self.copy_inode(src, id, &mut copied);
        let mut stack = vec![(src, root)];
        while let Some((from, to)) = stack.pop() {
            let entries = self.node(from).entries().clone();
            for (entry, child) in entries {
                if self.node(child).subvol != src_subvol {
                    // A nested subvolume's link: left out of the copy.
                    self.node_mut(to).nlink -= 1;
                    continue;
                }
                let (new, fresh) = match copied.get(&child) {
                    Some(&n) => (n, false),
                    None => (self.copy_inode(child, id, &mut copied), true),
                };
                self.insert_entry(to, &entry, new);
                if fresh && self.node(child).kind == Kind::Dir {
                    self.set_parent(new, to);
                    stack.push((child, new));
                }
            }
        }
        self.set_parent(root, dir);
        self.subvols.insert(id, Subvol { root, readonly });
        self.insert_entry(dir, name, root);
        self.node_mut(dir).nlink += 1;
        Ok(root)
    }

    /// A copy of inode `from` in subvolume `subvol` (a directory without
    /// its entries), noted in `copied`.
    fn copy_inode(&mut self, from: MIno, subvol: u64, copied: &mut HashMap<MIno, MIno>) -> MIno {
        let mut node = self.node(from).clone();
        if let Body::Dir { entries, .. } = &mut node.body {
            entries.clear();
        }
        node.open = 0;
        node.subvol = subvol;
        let ino = self.next;
        self.next += 1;
        self.inodes.insert(ino, node);
        copied.insert(from, ino);
        ino
    }

    /// `subvolume delete path`, in the engine's order: the parent's
    /// subvolume writable, the name exists, it is a link (EINVAL), the
    /// subvolume holds no other subvolume's link (ENOTEMPTY). Its inodes
    /// are gone at once; open handles on them get ENOENT.
    pub fn delete_subvolume(&mut self, path: &[Vec<u8>]) -> MResult<()> {
        if path.is_empty() {
            return Err(libc::EBUSY);
        }
        let (dir, name) = self.parent(path)?;
        self.check_writable(dir)?;
        let child = self.lookup(dir, name)?;
        if !self.is_link(dir, name) {
            return Err(libc::EINVAL);
        }
        self.remove_subvolume(dir, name, child)
    }

    /// Unlinks subvolume root `root` (entry `name` of `dir`) and drops
    /// every inode of its subvolume.
    fn remove_subvolume(&mut self, dir: MIno, name: &[u8], root: MIno) -> MResult<()> {
        let id = self.node(root).subvol;
        let nested = self
            .inodes
            .values()
            .filter(|n| n.subvol == id)
            .any(|n| match &n.body {
                Body::Dir { entries, .. } => entries.values().any(|c| self.node(*c).subvol != id),
                _ => false,
            });
        if nested {
            return Err(libc::ENOTEMPTY);
        }
        self.node_mut(dir).entries_mut().remove(name);
        self.node_mut(dir).nlink -= 1;
        let subvol = self.subvols.remove(&id).expect("a live subvolume");
        self.held_deleted.insert(id, subvol);
        self.drop_unheld_subvolume(id);
        Ok(())
    }

    /// Drops every inode of deleted subvolume `id` once none is open.
    fn drop_unheld_subvolume(&mut self, id: u64) {
        if !self.held_deleted.contains_key(&id)
            || self.inodes.values().any(|n| n.subvol == id && n.open > 0)
        {
            return;
        }
        self.held_deleted.remove(&id);
        let gone: Vec<MIno> = self
            .inodes
            .iter()
            .filter(|(_, n)| n.subvol == id)
            .map(|(&i, _)| i)
            .collect();
        for ino in gone {
            self.inodes.remove(&ino);
            self.dead.insert(ino);
        }
    }

    pub fn inode(&self, ino: MIno) -> Option<&Inode> {
        self.inodes.get(&ino)
    }

    fn node(&self, ino: MIno) -> &Inode {
        self.inodes
            .get(&ino)
            .unwrap_or_else(|| panic!("model inode {ino} does not exist"))
    }

    fn node_mut(&mut self, ino: MIno) -> &mut Inode {
        self.inodes
            .get_mut(&ino)
            .unwrap_or_else(|| panic!("model inode {ino} does not exist"))
    }

    /// Number of inodes (reachable or open).
    pub fn inode_count(&self) -> usize {
        self.inodes.len()
    }

    /// Sum of non-hole file pages over all inodes.
    pub fn allocated_bytes(&self) -> u64 {
        self.inodes
            .values()
            .filter_map(|i| i.file())
            .map(|f| f.allocated_bytes())
            .sum()
    }

    // ----- path walk -----

    /// Looks `name` up in directory `dir`, as a filesystem's `lookup`.
    pub fn lookup(&self, dir: MIno, name: &[u8]) -> MResult<MIno> {
        let d = self.node(dir);
        if d.kind != Kind::Dir {
            return Err(libc::ENOTDIR);
        }
        check_name_len(name)?;
        d.entries().get(name).copied().ok_or(libc::ENOENT)
    }

    /// The inode a path names (no symlink is followed).
    pub fn resolve(&self, path: &[Vec<u8>]) -> MResult<MIno> {
        let mut cur = ROOT;
        for c in path {
            cur = self.lookup(cur, c)?;
        }
        Ok(cur)
    }

    /// The directory holding a path's last component, and that component.
    pub fn parent<'p>(&self, path: &'p [Vec<u8>]) -> MResult<(MIno, &'p [u8])> {
        let (name, dirs) = path.split_last().expect("a path with a last component");
        let dir = self.resolve(dirs)?;
        if self.node(dir).kind != Kind::Dir {
            return Err(libc::ENOTDIR);
        }
        Ok((dir, name))
    }

    /// Every path of every reachable inode, parents before children.
    pub fn paths(&self) -> Vec<(Path, MIno, Kind)> {
        let mut out = Vec::new();
        let mut stack = vec![(Vec::new(), ROOT)];
        while let Some((path, ino)) = stack.pop() {
            let node = self.node(ino);
            out.push((path.clone(), ino, node.kind));
            if let Body::Dir { entries, .. } = &node.body {
                for (name, &child) in entries.iter().rev() {
                    let mut p = path.clone();
                    p.push(name.clone());
                    stack.push((p, child));
                }
            }
        }
        out
    }

    /// If `top` is a strict ancestor of `dir`, the child of `top` on the way
    /// down to `dir` (the kernel's `d_ancestor`).
    fn child_toward(&self, top: MIno, mut dir: MIno) -> Option<MIno> {
        loop {
            if dir == ROOT {
                return None;
            }
            let parent = match &self.node(dir).body {
                Body::Dir { parent, .. } => *parent,
                _ => unreachable!(),
            };
            if parent == top {
                return Some(dir);
            }
            dir = parent;
        }
    }

    /// The dentry `lock_rename(new_dir, old_dir)` returns as its trap.
    fn rename_trap(&self, old_dir: MIno, new_dir: MIno) -> Option<MIno> {
        if old_dir == new_dir {
            return None;
        }
        self.child_toward(old_dir, new_dir)
            .or_else(|| self.child_toward(new_dir, old_dir))
    }

    // ----- creating names -----

    fn new_inode(&mut self, kind: Kind, perm: u32, uid: u32, gid: u32, body: Body) -> MIno {
        let ino = self.next;
        self.next += 1;
        let nlink = if kind == Kind::Dir { 2 } else { 1 };
        self.inodes.insert(
            ino,
            Inode {
                kind,
                perm: (perm & 0o7777) as u16,
                uid,
                gid,
                nlink,
                body,
                xattrs: BTreeMap::new(),
                open: 0,
                subvol: TOP_SUBVOL,
            },
        );
        ino
    }

    fn insert_entry(&mut self, dir: MIno, name: &[u8], ino: MIno) {
        let prev = self.node_mut(dir).entries_mut().insert(name.to_vec(), ino);
        assert!(prev.is_none());
    }

    /// Links a new inode as `name` in `dir`, in `dir`'s subvolume.
    fn insert_new(&mut self, dir: MIno, name: &[u8], ino: MIno) {
        self.node_mut(ino).subvol = self.node(dir).subvol;
        self.insert_entry(dir, name, ino);
    }

    /// Common front of every call that makes a new name.
    fn new_name<'p>(&self, path: &'p [Vec<u8>]) -> MResult<(MIno, &'p [u8])> {
        let (dir, name) = self.parent(path)?;
        self.check_writable(dir)?;
        check_name_len(name)?;
        if self.node(dir).entries().contains_key(name) {
            return Err(libc::EEXIST);
        }
        Ok((dir, name))
    }

    /// `mknod`/`open(O_CREAT|O_EXCL)`: a regular file or special file.
    pub fn mknod(
        &mut self,
        path: &[Vec<u8>],
        kind: Kind,
        perm: u32,
        uid: u32,
        gid: u32,
    ) -> MResult<MIno> {
        assert!(kind != Kind::Dir && kind != Kind::Symlink);
        let (dir, name) = self.new_name(path)?;
        let body = if kind == Kind::File {
            Body::File(FileData::default())
        } else {
            Body::Special
        };
        let ino = self.new_inode(kind, perm, uid, gid, body);
        self.insert_new(dir, name, ino);
        Ok(ino)
    }

    pub fn create(&mut self, path: &[Vec<u8>], perm: u32, uid: u32, gid: u32) -> MResult<MIno> {
        self.mknod(path, Kind::File, perm, uid, gid)
    }

    pub fn mkdir(&mut self, path: &[Vec<u8>], perm: u32, uid: u32, gid: u32) -> MResult<MIno> {
        let (dir, name) = self.new_name(path)?;
        if self.node(dir).nlink >= LINK_MAX {
            return Err(libc::EMLINK);
        }
        let ino = self.new_inode(
            Kind::Dir,
            perm,
            uid,
            gid,
            Body::Dir {
                entries: BTreeMap::new(),
                parent: dir,
            },
        );
        self.insert_new(dir, name, ino);
        self.node_mut(dir).nlink += 1;
        Ok(ino)
    }

    pub fn symlink(
        &mut self,
        path: &[Vec<u8>],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> MResult<MIno> {
        // getname() checks the target before the path is walked.
        if target.is_empty() {
            return Err(libc::ENOENT);
        }
        if target.len() > SYMLINK_MAX {
            return Err(libc::ENAMETOOLONG);
        }
        let (dir, name) = self.new_name(path)?;
        let ino = self.new_inode(
            Kind::Symlink,
            0o777,
            uid,
            gid,
            Body::Symlink(target.to_vec()),
        );
        self.insert_new(dir, name, ino);
        Ok(ino)
    }

    /// `link(old, new)` in `do_linkat` order: old walk, new walk, EXDEV
    /// across subvolumes, EROFS, EEXIST,
    /// then `vfs_link`'s EPERM for directories and EMLINK.
    pub fn link(&mut self, old: &[Vec<u8>], new: &[Vec<u8>]) -> MResult<MIno> {
        let ino = self.resolve(old)?;
        // The engine refuses a link across subvolumes first (EXDEV, as
        // btrfs), then a change in a read-only one.
        let (dir, _) = self.parent(new)?;
        if self.node(dir).subvol != self.node(ino).subvol {
            return Err(libc::EXDEV);
        }
        let (dir, name) = self.new_name(new)?;
        let node = self.node(ino);
        if node.kind == Kind::Dir {
            return Err(libc::EPERM);
        }
        if node.nlink >= LINK_MAX {
            return Err(libc::EMLINK);
        }
        self.insert_entry(dir, name, ino);
        self.node_mut(ino).nlink += 1;
        Ok(ino)
    }

    // ----- removing names -----

    /// Drops one link of `ino` whose name is already gone; frees it when
    /// nothing refers to it any more.
    fn drop_link(&mut self, ino: MIno) {
        let node = self.node_mut(ino);
        node.nlink = if node.kind == Kind::Dir {
            0
        } else {
            node.nlink - 1
        };
        if node.nlink == 0 && node.open == 0 {
            self.inodes.remove(&ino);
        }
    }

    /// `unlink`; a subvolume link is EOPNOTSUPP (birch removes one only
    /// by rmdir or `subvolume delete`).
    pub fn unlink(&mut self, path: &[Vec<u8>]) -> MResult<()> {
        let (dir, name) = self.parent(path)?;
        self.check_writable(dir)?;
        if self.is_link(dir, name) {
            return Err(libc::EOPNOTSUPP);
        }
        let ino = self.lookup(dir, name)?;
        if self.node(ino).kind == Kind::Dir {
            return Err(libc::EISDIR);
        }
        self.node_mut(dir).entries_mut().remove(name);
        self.drop_link(ino);
        Ok(())
    }

    pub fn rmdir(&mut self, path: &[Vec<u8>]) -> MResult<()> {
        if path.is_empty() {
            return Err(libc::EBUSY);
        }
        let (dir, name) = self.parent(path)?;
        if self.is_link(dir, name) {
            // rmdir of a subvolume link deletes an empty subvolume (btrfs
            // since 4.18): its root directory's emptiness first.
            let root = self.lookup(dir, name)?;
            if !self.node(root).entries().is_empty() {
                return Err(libc::ENOTEMPTY);
            }
            self.check_writable(dir)?;
            return self.remove_subvolume(dir, name, root);
        }
        self.check_writable(dir)?;
        let ino = self.lookup(dir, name)?;
        let node = self.node(ino);
        if node.kind != Kind::Dir {
            return Err(libc::ENOTDIR);
        }
        if !node.entries().is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        self.node_mut(dir).entries_mut().remove(name);
        self.node_mut(dir).nlink -= 1;
        self.drop_link(ino);
        Ok(())
    }

    /// `renameat2` with the kernel's order of checks (see the module doc).
    pub fn rename(&mut self, old: &[Vec<u8>], new: &[Vec<u8>], flags: RenameFlags) -> MResult<()> {
        if flags.exchange && (flags.no_replace || flags.whiteout) {
            return Err(libc::EINVAL);
        }
        if old.is_empty() || new.is_empty() {
            return Err(libc::EBUSY);
        }
        let (old_dir, old_name) = self.parent(old)?;
        let (new_dir, new_name) = self.parent(new)?;
        // birch's order: EROFS, then a subvolume link as source or
        // target (`rename_link`, which may cross subvolumes), then EXDEV
        // across subvolumes, then the kernel's checks.
        self.check_writable(old_dir)?;
        let well_formed = !old_name.is_empty()
            && old_name.len() <= NAME_MAX
            && !new_name.is_empty()
            && new_name.len() <= NAME_MAX;
        if well_formed
            && self.node(old_dir).entries().contains_key(old_name)
            && (self.is_link(old_dir, old_name) || self.is_link(new_dir, new_name))
        {
            return self.rename_link(old_dir, old_name, new_dir, new_name, flags);
        }
        if self.node(old_dir).subvol != self.node(new_dir).subvol {
            return Err(libc::EXDEV);
        }
        let source = self.lookup(old_dir, old_name)?;
        check_name_len(new_name)?;
        let target = self.node(new_dir).entries().get(new_name).copied();
        if flags.no_replace && target.is_some() {
            return Err(libc::EEXIST);
        }
        if flags.exchange && target.is_none() {
            return Err(libc::ENOENT);
        }
        let trap = self.rename_trap(old_dir, new_dir);
        if trap == Some(source) {
            return Err(libc::EINVAL);
        }
        if target.is_some() && trap == target {
            return Err(if flags.exchange {
                libc::EINVAL
            } else {
                libc::ENOTEMPTY
            });
        }
        if target == Some(source) {
            return Ok(());
        }
        let source_is_dir = self.node(source).kind == Kind::Dir;
        if flags.exchange {
            self.exchange_entries(old_dir, old_name, new_dir, new_name);
            return Ok(());
        }
        if let Some(target) = target {
            let target_node = self.node(target);
            let target_is_dir = target_node.kind == Kind::Dir;
            match (source_is_dir, target_is_dir) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if !target_node.entries().is_empty() => return Err(libc::ENOTEMPTY),
                _ => {}
            }
            self.node_mut(new_dir).entries_mut().remove(new_name);
            if target_is_dir {
                self.node_mut(new_dir).nlink -= 1;
            }
            self.drop_link(target);
        }
        self.node_mut(old_dir).entries_mut().remove(old_name);
        self.insert_entry(new_dir, new_name, source);
        if source_is_dir && old_dir != new_dir {
            self.node_mut(old_dir).nlink -= 1;
            self.node_mut(new_dir).nlink += 1;
        }
        self.set_parent(source, new_dir);
        if flags.whiteout {
            let whiteout = self.new_inode(Kind::CharDev, 0, 0, 0, Body::Special);
            self.insert_new(old_dir, old_name, whiteout);
        }
        Ok(())
    }

    /// RENAME_EXCHANGE once checked: the entries `old_name` of `old_dir`
    /// and `new_name` of `new_dir` swap, with their parents' link counts.
    fn exchange_entries(&mut self, old_dir: MIno, old_name: &[u8], new_dir: MIno, new_name: &[u8]) {
        let source = self.node(old_dir).entries()[old_name];
        let target = self.node(new_dir).entries()[new_name];
        let is_dir = |m: &Self, ino| i64::from(m.node(ino).kind == Kind::Dir);
        let shift = is_dir(self, source) - is_dir(self, target);
        *self
            .node_mut(old_dir)
            .entries_mut()
            .get_mut(old_name)
            .expect("source entry") = target;
        *self
            .node_mut(new_dir)
            .entries_mut()
            .get_mut(new_name)
            .expect("target entry") = source;
        if old_dir != new_dir {
            let od = self.node_mut(old_dir);
            od.nlink = (i64::from(od.nlink) - shift) as u32;
            let nd = self.node_mut(new_dir);
            nd.nlink = (i64::from(nd.nlink) + shift) as u32;
        }
        self.set_parent(source, new_dir);
        self.set_parent(target, old_dir);
    }

    /// `rename` when the source or the target is a subvolume link, in the
    /// engine's order (`rename_subvolume_link`, as btrfs): across
    /// subvolumes EXDEV unless the source is a link (and, for
    /// RENAME_EXCHANGE, the target too); then the VFS's traps, across
    /// links (EINVAL; a missing exchange target ENOENT first). An
    /// exchange swaps the two entries (EROFS in a read-only target
    /// subvolume). A move: over an existing name EEXIST with NOREPLACE,
    /// nothing for the link itself, the kernel's type checks, then
    /// ENOTEMPTY over a link or a non-empty directory, then EROFS; an
    /// empty directory is replaced. The link moves with its subvolume
    /// whole.
    fn rename_link(
        &mut self,
        old_dir: MIno,
        old_name: &[u8],
        new_dir: MIno,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> MResult<()> {
        let source = self.lookup(old_dir, old_name)?;
        let source_is_dir = self.node(source).kind == Kind::Dir;
        let target = self.node(new_dir).entries().get(new_name).copied();
        let across = self.node(old_dir).subvol != self.node(new_dir).subvol;
        if across
            && (!self.is_link(old_dir, old_name)
                || (flags.exchange && !self.is_link(new_dir, new_name)))
        {
            return Err(libc::EXDEV);
        }
        if flags.whiteout {
            return Err(libc::EOPNOTSUPP);
        }
        let trap = self.rename_trap(old_dir, new_dir);
        if flags.exchange {
            let target = target.ok_or(libc::ENOENT)?;
            if trap.is_some() && (trap == Some(source) || trap == Some(target)) {
                return Err(libc::EINVAL);
            }
            if old_dir == new_dir && old_name == new_name {
                return Ok(());
            }
            self.check_writable(new_dir)?;
            self.exchange_entries(old_dir, old_name, new_dir, new_name);
            return Ok(());
        }
        if source_is_dir && trap == Some(source) {
            return Err(libc::EINVAL);
        }
        if let Some(target) = target {
            if flags.no_replace {
                return Err(libc::EEXIST);
            }
            if target == source {
                return Ok(());
            }
            let target_node = self.node(target);
            match (source_is_dir, target_node.kind == Kind::Dir) {
                (true, true) => {}
                (true, false) => return Err(libc::ENOTDIR),
                (false, _) => return Err(libc::EISDIR),
            }
            if self.is_link(new_dir, new_name) || !target_node.entries().is_empty() {
                return Err(libc::ENOTEMPTY);
            }
            self.check_writable(new_dir)?;
            self.node_mut(new_dir).entries_mut().remove(new_name);
            self.node_mut(new_dir).nlink -= 1;
            self.drop_link(target);
        } else {
            self.check_writable(new_dir)?;
        }
        self.node_mut(old_dir).entries_mut().remove(old_name);
        self.node_mut(old_dir).nlink -= 1;
        self.insert_entry(new_dir, new_name, source);
        self.node_mut(new_dir).nlink += 1;
        self.set_parent(source, new_dir);
        Ok(())
    }

    fn set_parent(&mut self, ino: MIno, dir: MIno) {
        if let Body::Dir { parent, .. } = &mut self.node_mut(ino).body {
            *parent = dir;
        }
    }

    // ----- inode operations (on a resolved inode) -----

    pub fn getattr(&self, ino: MIno) -> AttrView {
        let n = self.node(ino);
        let size = match &n.body {
            Body::File(f) => Some(f.size),
            Body::Dir { .. } => None,
            Body::Symlink(t) => Some(t.len() as u64),
            Body::Special => Some(0),
        };
        AttrView {
            kind: n.kind,
            perm: n.perm,
            uid: n.uid,
            gid: n.gid,
            nlink: n.nlink,
            size,
        }
    }

    pub fn readlink(&self, ino: MIno) -> MResult<Vec<u8>> {
        match &self.node(ino).body {
            Body::Symlink(t) => Ok(t.clone()),
            _ => Err(libc::EINVAL),
        }
    }

    /// Names in a directory with their kinds.
    pub fn readdir(&self, ino: MIno) -> MResult<BTreeMap<Vec<u8>, Kind>> {
        let n = self.node(ino);
        if n.kind != Kind::Dir {
            return Err(libc::ENOTDIR);
        }
        // A deleted subvolume's root directory is a removed directory.
        if self
            .held_deleted
            .get(&n.subvol)
            .is_some_and(|s| s.root == ino)
        {
            return Err(libc::ENOENT);
        }
        Ok(n.entries()
            .iter()
            .map(|(name, &child)| (name.clone(), self.node(child).kind))
            .collect())
    }

    fn regular_mut(&mut self, ino: MIno) -> MResult<&mut FileData> {
        match &mut self.node_mut(ino).body {
            Body::File(f) => Ok(f),
            Body::Dir { .. } => Err(libc::EISDIR),
            _ => Err(libc::EINVAL),
        }
    }

    /// `write`: the file's kind and the end offset first, then EROFS in a
    /// read-only subvolume (the engine's order).
    pub fn write(&mut self, ino: MIno, offset: u64, data: &[u8]) -> MResult<usize> {
        self.regular_mut(ino)?;
        match offset.checked_add(data.len() as u64) {
            Some(end) if end <= MAX_FILE_SIZE || data.is_empty() => {}
            _ => return Err(libc::EFBIG),
        }
        self.check_writable(ino)?;
        if data.is_empty() {
            return Ok(0);
        }
        self.regular_mut(ino)?.write(offset, data);
        Ok(data.len())
    }

    pub fn read(&mut self, ino: MIno, offset: u64, len: usize) -> MResult<Vec<u8>> {
        let f = self.regular_mut(ino)?;
        Ok(f.read(offset, len))
    }

    pub fn truncate(&mut self, ino: MIno, size: u64) -> MResult<()> {
        let f = self.regular_mut(ino)?;
        if size > MAX_FILE_SIZE {
            return Err(libc::EFBIG);
        }
        f.truncate(size);
        Ok(())
    }

    /// The VFS's kind checks of `fallocate` (`vfs_fallocate`): ESPIPE for
    /// a fifo, EISDIR for a directory, ENODEV for anything else that is
    /// not a regular file.
    fn fallocate_kind(&self, ino: MIno) -> MResult<()> {
        match self.node(ino).kind {
            Kind::File => Ok(()),
            Kind::Fifo => Err(libc::ESPIPE),
            Kind::Dir => Err(libc::EISDIR),
            _ => Err(libc::ENODEV),
        }
    }

    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)`: the kind checks, then EROFS in
    /// a read-only subvolume; the range reads as zeros, the size stays.
    pub fn punch_hole(&mut self, ino: MIno, offset: u64, len: u64) -> MResult<()> {
        self.fallocate_kind(ino)?;
        if len == 0 {
            return Err(libc::EINVAL);
        }
        self.check_writable(ino)?;
        self.regular_mut(ino)?.punch(offset, len);
        Ok(())
    }

    /// `fallocate(ZERO_RANGE)` (`keep_size`: `| KEEP_SIZE`): the kind
    /// checks, EINVAL for an empty range, EROFS in a read-only subvolume,
    /// EFBIG past the largest file; the range reads as zeros.
    pub fn zero_range(&mut self, ino: MIno, offset: u64, len: u64, keep_size: bool) -> MResult<()> {
        self.fallocate_kind(ino)?;
        if len == 0 {
            return Err(libc::EINVAL);
        }
        self.check_writable(ino)?;
        if offset
            .checked_add(len)
            .is_none_or(|end| end > MAX_FILE_SIZE)
        {
            return Err(libc::EFBIG);
        }
        self.regular_mut(ino)?.zero(offset, len, keep_size);
        Ok(())
    }

    /// `copy_file_range` (`generic_copy_file_checks`): EISDIR if either
    /// side is a directory, EINVAL if either is not a regular file; the
    /// length cut at the source's end; nothing to copy returns 0; EINVAL
    /// for overlapping ranges of one file; then EROFS for a read-only
    /// destination. Returns the bytes copied.
    pub fn copy_range(
        &mut self,
        src: MIno,
        src_offset: u64,
        dst: MIno,
        dst_offset: u64,
        len: u64,
    ) -> MResult<usize> {
        let kinds = [self.node(src).kind, self.node(dst).kind];
        if kinds.contains(&Kind::Dir) {
            return Err(libc::EISDIR);
        }
        if kinds.iter().any(|k| *k != Kind::File) {
            return Err(libc::EINVAL);
        }
        let size = self.regular_mut(src)?.size;
        let len = len.min(size.saturating_sub(src_offset));
        if len == 0 {
            return Ok(0);
        }
        if src == dst && src_offset < dst_offset + len && dst_offset < src_offset + len {
            return Err(libc::EINVAL);
        }
        self.check_writable(dst)?;
        let data = self.regular_mut(src)?.read(src_offset, len as usize);
        self.regular_mut(dst)?.write(dst_offset, &data);
        Ok(data.len())
    }

    /// `chattr +c` / `-c` (FS_IOC_SETFLAGS): ENOTTY on what is neither a
    /// regular file nor a directory, EROFS in a read-only subvolume. The
    /// flag changes how data is stored, not what it reads as: the model
    /// keeps nothing.
    pub fn set_compress_flag(&mut self, ino: MIno) -> MResult<()> {
        if !matches!(self.node(ino).kind, Kind::File | Kind::Dir) {
            return Err(libc::ENOTTY);
        }
        self.check_writable(ino)
    }

    pub fn chmod(&mut self, ino: MIno, perm: u32) {
        self.node_mut(ino).perm = (perm & 0o7777) as u16;
    }

    pub fn chown(&mut self, ino: MIno, uid: Option<u32>, gid: Option<u32>) {
        let n = self.node_mut(ino);
        if let Some(uid) = uid {
            n.uid = uid;
        }
        if let Some(gid) = gid {
            n.gid = gid;
        }
    }

    fn check_xattr_name(name: &[u8]) -> MResult<()> {
        if name.is_empty() || name.len() > NAME_MAX {
            return Err(libc::ERANGE);
        }
        Ok(())
    }

    pub fn setxattr(
        &mut self,
        ino: MIno,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> MResult<()> {
        Self::check_xattr_name(name)?;
        let n = self.node_mut(ino);
        let exists = n.xattrs.contains_key(name);
        match (mode, exists) {
            (XattrMode::Create, true) => return Err(libc::EEXIST),
            (XattrMode::Replace, false) => return Err(libc::ENODATA),
            _ => {}
        }
        n.xattrs.insert(name.to_vec(), value.to_vec());
        Ok(())
    }

    pub fn getxattr(&self, ino: MIno, name: &[u8]) -> MResult<Vec<u8>> {
        Self::check_xattr_name(name)?;
        self.node(ino)
            .xattrs
            .get(name)
            .cloned()
            .ok_or(libc::ENODATA)
    }

    pub fn listxattr(&self, ino: MIno) -> Vec<Vec<u8>> {
        self.node(ino).xattrs.keys().cloned().collect()
    }

    pub fn removexattr(&mut self, ino: MIno, name: &[u8]) -> MResult<()> {
        Self::check_xattr_name(name)?;
        self.node_mut(ino)
            .xattrs
            .remove(name)
            .map(|_| ())
            .ok_or(libc::ENODATA)
    }

    // ----- open handles -----

    pub fn open(&mut self, ino: MIno) {
        self.node_mut(ino).open += 1;
    }

    pub fn release(&mut self, ino: MIno) {
        let n = self.node_mut(ino);
        assert!(n.open > 0, "release of model inode {ino} that is not open");
        n.open -= 1;
        let id = n.subvol;
        if n.open == 0 && n.nlink == 0 {
            self.inodes.remove(&ino);
        }
        self.drop_unheld_subvolume(id);
    }

    /// What a remount or crash leaves: every handle closed.
    pub fn release_all(&mut self) {
        let open: Vec<MIno> = self
            .inodes
            .iter()
            .filter(|(_, n)| n.open > 0)
            .map(|(&i, _)| i)
            .collect();
        for ino in open {
            while self.inodes.get(&ino).is_some_and(|n| n.open > 0) {
                self.release(ino);
            }
        }
    }

    /// Whether the inode still exists (reachable or open).
    pub fn exists(&self, ino: MIno) -> bool {
        self.inodes.contains_key(&ino)
    }

    // ----- canonical view -----

    /// The canonical view of everything reachable from the root.
    pub fn view(&self) -> View {
        let mut raw = BTreeMap::new();
        for (path, ino, _) in self.paths() {
            let n = self.node(ino);
            let (size, content, target) = match &n.body {
                Body::File(f) => (Some(f.size), f.page_digests(), Vec::new()),
                Body::Dir { .. } => (None, Vec::new(), Vec::new()),
                Body::Symlink(t) => (Some(t.len() as u64), Vec::new(), t.clone()),
                Body::Special => (Some(0), Vec::new(), Vec::new()),
            };
            let entry = Entry {
                kind: n.kind,
                perm: n.perm,
                uid: n.uid,
                gid: n.gid,
                nlink: n.nlink,
                size,
                content,
                target,
                xattrs: n.xattrs.clone(),
                link_group: Vec::new(),
            };
            raw.insert(path, (ino, entry));
        }
        View::from_raw(raw)
    }
}

// ----- the canonical view -----

/// One path of the canonical view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    /// `None` for directories.
    pub size: Option<u64>,
    /// Regular files: digest of each page.
    pub content: Vec<u32>,
    /// Symlinks: the target.
    pub target: Vec<u8>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The first path (in view order) naming the same inode: equal for
    /// every name of a hard-linked inode.
    pub link_group: Path,
}

/// A whole namespace in canonical form: path -> entry (parents before
/// children; the root is the empty path).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    pub entries: BTreeMap<Path, Entry>,
}

impl View {
    /// Builds a view from entries tagged with an inode identity (any
    /// numbering): fills in each entry's `link_group`.
    pub fn from_raw(raw: BTreeMap<Path, (u64, Entry)>) -> View {
        let mut first: HashMap<u64, Path> = HashMap::new();
        let entries = raw
            .into_iter()
            .map(|(path, (id, mut entry))| {
                entry.link_group = first.entry(id).or_insert_with(|| path.clone()).clone();
                (path, entry)
            })
            .collect();
        View { entries }
    }

    /// Total entries (the root included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A path for people: `/a/b`, long components abbreviated.
pub fn show_path(path: &[Vec<u8>]) -> String {
    if path.is_empty() {
        return "/".to_string();
    }
    let mut s = String::new();
    for c in path {
        s.push('/');
        s.push_str(&show_name(c));
    }
    s
}

/// A name for people; names longer than 24 bytes are shortened with their
/// length.
pub fn show_name(name: &[u8]) -> String {
    if name.len() > 24 {
        format!(
            "{}…[{} bytes]",
            String::from_utf8_lossy(&name[..8]),
            name.len()
        )
    } else {
        String::from_utf8_lossy(name).into_owned()
    }
}

fn show_bytes(b: &[u8]) -> String {
    if b.len() > 32 {
        format!(
            "{:?}…[{} bytes]",
            String::from_utf8_lossy(&b[..32]),
            b.len()
        )
    } else {
        format!("{:?}", String::from_utf8_lossy(b))
    }
}

/// How one entry differs from the expected one, or `None`.
pub fn diff_entry(expected: &Entry, actual: &Entry) -> Option<String> {
    if expected.kind != actual.kind {
        return Some(format!(
            "kind: expected {:?}, found {:?}",
            expected.kind, actual.kind
        ));
    }
    if expected.size != actual.size {
        return Some(format!(
            "size: expected {:?}, found {:?}",
            expected.size, actual.size
        ));
    }
    if expected.content != actual.content {
        let page = expected
            .content
            .iter()
            .zip(&actual.content)
            .position(|(a, b)| a != b)
            .unwrap_or(expected.content.len().min(actual.content.len()));
        return Some(format!(
            "content: first differing page {page} (bytes {}..{})",
            page as u64 * PAGE,
            (page as u64 + 1) * PAGE
        ));
    }
    if expected.target != actual.target {
        return Some(format!(
            "symlink target: expected {}, found {}",
            show_bytes(&expected.target),
            show_bytes(&actual.target)
        ));
    }
    if expected.nlink != actual.nlink {
        return Some(format!(
            "nlink: expected {}, found {}",
            expected.nlink, actual.nlink
        ));
    }
    if expected.link_group != actual.link_group {
        return Some(format!(
            "hard links: expected the inode of {}, found the inode of {}",
            show_path(&expected.link_group),
            show_path(&actual.link_group)
        ));
    }
    if (expected.perm, expected.uid, expected.gid) != (actual.perm, actual.uid, actual.gid) {
        return Some(format!(
            "mode/owner: expected {:o} {}:{}, found {:o} {}:{}",
            expected.perm, expected.uid, expected.gid, actual.perm, actual.uid, actual.gid
        ));
    }
    if expected.xattrs != actual.xattrs {
        for (name, value) in &expected.xattrs {
            match actual.xattrs.get(name) {
                None => return Some(format!("xattr {}: missing", show_name(name))),
                Some(v) if v != value => {
                    return Some(format!(
                        "xattr {}: expected {}, found {}",
                        show_name(name),
                        show_bytes(value),
                        show_bytes(v)
                    ))
                }
                _ => {}
            }
        }
        let extra = actual
            .xattrs
            .keys()
            .find(|k| !expected.xattrs.contains_key(*k))
            .expect("xattrs differ");
        return Some(format!("xattr {}: unexpected", show_name(extra)));
    }
    None
}

/// The first path (in view order) where `actual` differs from `expected`,
/// and how; `None` when they are equal.
pub fn diff_views(expected: &View, actual: &View) -> Option<String> {
    let mut e = expected.entries.iter().peekable();
    let mut a = actual.entries.iter().peekable();
    loop {
        match (e.peek(), a.peek()) {
            (None, None) => return None,
            (Some((p, _)), None) => {
                return Some(format!(
                    "{}: missing ({} entries expected, {} found)",
                    show_path(p),
                    expected.len(),
                    actual.len()
                ))
            }
            (None, Some((p, _))) => {
                return Some(format!(
                    "{}: unexpected entry ({} entries expected, {} found)",
                    show_path(p),
                    expected.len(),
                    actual.len()
                ))
            }
            (Some((pe, ee)), Some((pa, ea))) => match pe.cmp(pa) {
                std::cmp::Ordering::Less => return Some(format!("{}: missing", show_path(pe))),
                std::cmp::Ordering::Greater => {
                    return Some(format!(
                        "{}: unexpected entry ({:?})",
                        show_path(pa),
                        ea.kind
                    ))
                }
                std::cmp::Ordering::Equal => {
                    if let Some(d) = diff_entry(ee, ea) {
                        return Some(format!("{}: {d}", show_path(pe)));
                    }
                    e.next();
                    a.next();
                }
            },
        }
    }
}

impl fmt::Display for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (path, e) in &self.entries {
            write!(
                f,
                "{} {:?} {:o} {}:{} nlink={}",
                show_path(path),
                e.kind,
                e.perm,
                e.uid,
                e.gid,
                e.nlink
            )?;
            if let Some(size) = e.size {
                write!(f, " size={size}")?;
            }
            if !e.target.is_empty() {
                write!(f, " -> {}", show_bytes(&e.target))?;
            }
            if e.link_group != *path {
                write!(f, " (link of {})", show_path(&e.link_group))?;
            }
            for (k, v) in &e.xattrs {
                write!(f, " [{}={}]", show_name(k), show_bytes(v))?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Path {
        s.split('/')
            .filter(|c| !c.is_empty())
            .map(|c| c.as_bytes().to_vec())
            .collect()
    }

    #[test]
    fn file_data_sparse_write_truncate() {
        let mut f = FileData::default();
        f.write(5000, b"hello");
        assert_eq!(f.size, 5005);
        assert_eq!(f.read(4998, 10), b"\0\0hello");
        f.truncate(5002);
        assert_eq!(f.read(4998, 10), b"\0\0he");
        f.truncate(9000);
        assert_eq!(f.read(4998, 10), b"\0\0he\0\0\0\0\0\0");
        f.truncate(0);
        assert_eq!(f.allocated_bytes(), 0);
    }

    /// A zero range keeps the bytes around it, allocates the pages it
    /// covers, and grows the file only without `keep_size`.
    #[test]
    fn file_data_zero_range() {
        let mut f = FileData::default();
        f.write(0, &[7u8; 6000]);
        f.zero(100, 50, true);
        assert_eq!(f.read(98, 4), [7, 7, 0, 0]);
        assert_eq!(f.read(148, 4), [0, 0, 7, 7]);
        // Past the end with keep_size: the size stays.
        f.zero(5990, 20_000, true);
        assert_eq!(f.size, 6000);
        assert_eq!(f.read(5988, 20), [7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(f.allocated_bytes(), 2 * PAGE);
        // Without it the file grows to the range's end, all zeros there,
        // its pages allocated.
        f.zero(5000, 10_000, false);
        assert_eq!(f.size, 15_000);
        assert_eq!(f.read(4998, 4), [7, 7, 0, 0]);
        assert!(f.read(5000, 10_000).iter().all(|&b| b == 0));
        assert_eq!(f.allocated_bytes(), 4 * PAGE);
    }

    #[test]
    fn rename_errno_order_follows_the_kernel() {
        let mut m = Model::new();
        m.mkdir(&p("a"), 0o755, 0, 0).unwrap();
        m.mkdir(&p("a/b"), 0o755, 0, 0).unwrap();
        m.create(&p("a/f"), 0o644, 0, 0).unwrap();
        m.create(&p("g"), 0o644, 0, 0).unwrap();
        // Directory into its own subtree.
        assert_eq!(
            m.rename(&p("a"), &p("a/b/c"), RenameFlags::default()),
            Err(libc::EINVAL)
        );
        assert_eq!(
            m.rename(&p("a"), &p("a/x"), RenameFlags::default()),
            Err(libc::EINVAL)
        );
        // Onto an ancestor of the source: ENOTEMPTY, even for a file.
        assert_eq!(
            m.rename(&p("a/f"), &p("a"), RenameFlags::default()),
            Err(libc::ENOTEMPTY)
        );
        assert_eq!(
            m.rename(
                &p("a/b"),
                &p("a"),
                RenameFlags {
                    exchange: true,
                    no_replace: false,
                    whiteout: false,
                }
            ),
            Err(libc::EINVAL)
        );
        // NOREPLACE wins over the subtree check.
        assert_eq!(
            m.rename(
                &p("a"),
                &p("a/b"),
                RenameFlags {
                    no_replace: true,
                    exchange: false,
                    whiteout: false,
                }
            ),
            Err(libc::EEXIST)
        );
        assert_eq!(
            m.rename(&p("g"), &p("a/b"), RenameFlags::default()),
            Err(libc::EISDIR)
        );
        assert_eq!(
            m.rename(&p("a/b"), &p("g"), RenameFlags::default()),
            Err(libc::ENOTDIR)
        );
        assert_eq!(m.rename(&p("a"), &p("a"), RenameFlags::default()), Ok(()));
        m.rename(&p("a/b"), &p("b"), RenameFlags::default())
            .unwrap();
        assert_eq!(m.getattr(ROOT).nlink, 4);
        assert_eq!(m.getattr(m.resolve(&p("a")).unwrap()).nlink, 2);
        m.rename(
            &p("b"),
            &p("g"),
            RenameFlags {
                exchange: true,
                no_replace: false,
                whiteout: false,
            },
        )
        .unwrap();
        assert_eq!(m.getattr(m.resolve(&p("g")).unwrap()).kind, Kind::Dir);
        assert_eq!(m.getattr(ROOT).nlink, 4);
    }

    #[test]
    fn link_and_unlink_open_file() {
        let mut m = Model::new();
        let f = m.create(&p("f"), 0o644, 0, 0).unwrap();
        m.link(&p("f"), &p("g")).unwrap();
        assert_eq!(m.getattr(f).nlink, 2);
        m.mkdir(&p("d"), 0o755, 0, 0).unwrap();
        assert_eq!(m.link(&p("d"), &p("f")), Err(libc::EEXIST));
        assert_eq!(m.link(&p("d"), &p("e")), Err(libc::EPERM));
        m.open(f);
        m.unlink(&p("f")).unwrap();
        m.unlink(&p("g")).unwrap();
        assert!(m.exists(f));
        m.write(f, 0, b"x").unwrap();
        m.release(f);
        assert!(!m.exists(f));
    }

    #[test]
    fn diff_names_first_difference() {
        let mut m = Model::new();
        let f = m.create(&p("f"), 0o644, 0, 0).unwrap();
        let before = m.view();
        m.write(f, 8192, b"x").unwrap();
        let d = diff_views(&before, &m.view()).unwrap();
        assert!(d.starts_with("/f: size"), "{d}");
        let mut other = m.clone();
        other.write(f, 8192, b"y").unwrap();
        let d = diff_views(&m.view(), &other.view()).unwrap();
        assert!(d.contains("first differing page 2"), "{d}");
    }
}
