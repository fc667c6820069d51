//! Hand-built images for tests of the checker (and of anything else that
//! wants a small, exactly known, valid filesystem without running the
//! engine). [`FsBuilder`] keeps the namespace consistent (names, indexes,
//! link counts, sizes, extent references); [`Fixture`] then lets a test
//! damage the image in one precise way.
//!
//! Test support, not part of the engine: panics on misuse.

use crate::device::{BlockDevice, MemoryDevice};
use crate::format::node::BODY_SIZE;
use crate::format::node::{LEAF_ITEM_HEADER_SIZE, MAX_KEY_PTRS};
use crate::format::{
    decode_dir_items, decode_inode_refs, decode_xattrs, encode_dir_items, encode_inode_refs,
    encode_xattrs, item_type, name_hash, tree_id, BackupRoot, DirEntry, ExtentItem, FileExtent,
    FileType, InodeItem, InodeRefEntry, Key, KeyPtr, LeafItem, Node, NodeBody, RootItem, RootRef,
    SubvolRootItem, Superblock, Timespec, Xattr, BACKUP_ROOT_COUNT, DEFAULT_SUBVOL_NAME,
    FIRST_ALLOCATABLE_BYTE, FIRST_DIR_INDEX, FIRST_FREE_INO, MAX_SUBVOL_INO, NODE_SIZE,
    ORPHAN_OBJECTID, ROOT_DIR_INO, SECTOR_SIZE, SUPERBLOCK_OFFSETS,
};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

/// Builds a consistent filesystem, item by item.
#[derive(Debug, Clone)]
pub struct FsBuilder {
    pub total_bytes: u64,
    pub generation: u64,
    pub fsid: [u8; 16],
    /// Most items per leaf (small values force deep trees).
    pub leaf_items_max: usize,
    /// Most pointers per internal node.
    pub ptrs_max: usize,
    inodes: BTreeMap<u64, InodeItem>,
    items: BTreeMap<Key, Vec<u8>>,
    next_ino: u64,
    next_index: HashMap<u64, u64>,
    /// (bytenr, len, owner)
    data_extents: Vec<(u64, u64, u64)>,
    next_data: u64,
    /// `INCOMPAT_SUBVOLUMES`: tree 5 gets the long root item `fs_root`.
    subvolumes: bool,
    fs_root: SubvolRootItem,
    /// Subvolume trees other than 5, by id.
    subvols: BTreeMap<u64, Subvol>,
    /// Root tree items other than root items: root refs, orphan roots,
    /// the default-subvolume item.
    root_tree_items: BTreeMap<Key, Vec<u8>>,
}

/// A tree's items in key order, with their payloads.
type TreeItems = Vec<(Key, Vec<u8>)>;

/// A subvolume tree of a fixture: its root directory and raw items.
#[derive(Debug, Clone)]
struct Subvol {
    /// Its root item; the root node fields are filled in at build.
    item: SubvolRootItem,
    root_dir: InodeItem,
    items: BTreeMap<Key, Vec<u8>>,
    next_index: u64,
}

fn time() -> Timespec {
    Timespec {
        sec: 1_700_000_000,
        nsec: 0,
    }
}

impl FsBuilder {
    /// An empty filesystem (a root directory) on a device of `total_bytes`.
    /// Tree nodes are laid out from FIRST_ALLOCATABLE_BYTE, data extents
    /// from the middle of the device.
    pub fn new(total_bytes: u64) -> FsBuilder {
        assert!(
            total_bytes >= 4 * FIRST_ALLOCATABLE_BYTE && total_bytes.is_multiple_of(SECTOR_SIZE)
        );
        let mut b = FsBuilder {
            total_bytes,
            generation: 5,
            fsid: *b"birch-fixture-01",
            leaf_items_max: usize::MAX,
            ptrs_max: MAX_KEY_PTRS,
            inodes: BTreeMap::new(),
            items: BTreeMap::new(),
            next_ino: FIRST_FREE_INO,
            next_index: HashMap::new(),
            data_extents: Vec::new(),
            next_data: (total_bytes / 2) / SECTOR_SIZE * SECTOR_SIZE,
            subvolumes: false,
            fs_root: SubvolRootItem::default(),
            subvols: BTreeMap::new(),
            root_tree_items: BTreeMap::new(),
        };
        b.inodes
            .insert(ROOT_DIR_INO, b.inode_item(libc::S_IFDIR | 0o755, 2));
        b.items.insert(
            Key::new(ROOT_DIR_INO, item_type::INODE_REF, ROOT_DIR_INO),
            encode_inode_refs(&[InodeRefEntry {
                index: 0,
                name: b"..".to_vec(),
            }]),
        );
        b
    }

    fn inode_item(&self, mode: u32, nlink: u32) -> InodeItem {
        InodeItem {
            generation: 1,
            transid: self.generation,
            nlink,
            mode,
            atime: time(),
            mtime: time(),
            ctime: time(),
            otime: time(),
            ..Default::default()
        }
    }

    fn new_inode(&mut self, mode: u32, nlink: u32) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        let item = self.inode_item(mode, nlink);
        self.inodes.insert(ino, item);
        ino
    }

    pub fn inode_mut(&mut self, ino: u64) -> &mut InodeItem {
        self.inodes.get_mut(&ino).expect("no such inode")
    }

    /// Raw access to non-inode items (for building deliberately wrong images).
    pub fn items_mut(&mut self) -> &mut BTreeMap<Key, Vec<u8>> {
        &mut self.items
    }

    /// Removes an inode item (its other items stay).
    pub fn remove_inode(&mut self, ino: u64) -> Option<InodeItem> {
        self.inodes.remove(&ino)
    }

    /// Gives `ino` the name `name` in directory `parent`, with every item
    /// and count a name implies.
    pub fn add_name(&mut self, parent: u64, ino: u64, name: &[u8]) {
        let file_type = self.inodes[&ino].file_type();
        let index = self.next_index.entry(parent).or_insert(FIRST_DIR_INDEX);
        let this_index = *index;
        *index += 1;
        let entry = DirEntry {
            ino,
            file_type,
            name: name.to_vec(),
            subvolume: false,
        };
        let dkey = Key::new(parent, item_type::DIR_ITEM, name_hash(name));
        let mut entries = self
            .items
            .get(&dkey)
            .map(|d| decode_dir_items(d).expect("fixture dir item"))
            .unwrap_or_default();
        entries.push(entry.clone());
        self.items.insert(dkey, encode_dir_items(&entries));
        self.items.insert(
            Key::new(parent, item_type::DIR_INDEX, this_index),
            entry.encode(),
        );
        let rkey = Key::new(ino, item_type::INODE_REF, parent);
        let mut refs = self
            .items
            .get(&rkey)
            .map(|d| decode_inode_refs(d).expect("fixture inode ref"))
            .unwrap_or_default();
        refs.push(InodeRefEntry {
            index: this_index,
            name: name.to_vec(),
        });
        self.items.insert(rkey, encode_inode_refs(&refs));
        let p = self.inodes.get_mut(&parent).expect("no such parent");
        p.size += name.len() as u64;
        if file_type == FileType::Directory {
            p.nlink += 1;
        } else {
            self.inodes.get_mut(&ino).expect("inode").nlink += 1;
        }
    }

    pub fn mkdir(&mut self, parent: u64, name: &[u8]) -> u64 {
        let ino = self.new_inode(libc::S_IFDIR | 0o755, 2);
        self.add_name(parent, ino, name);
        ino
    }

    pub fn create(&mut self, parent: u64, name: &[u8]) -> u64 {
        let ino = self.new_inode(libc::S_IFREG | 0o644, 0);
        self.add_name(parent, ino, name);
        ino
    }

    pub fn mknod(&mut self, parent: u64, name: &[u8], mode: u32) -> u64 {
        let ino = self.new_inode(mode, 0);
        self.add_name(parent, ino, name);
        ino
    }

    pub fn symlink(&mut self, parent: u64, name: &[u8], target: &[u8]) -> u64 {
        let ino = self.new_inode(libc::S_IFLNK | 0o777, 0);
        self.add_name(parent, ino, name);
        self.write_inline(ino, target);
        ino
    }

    pub fn link(&mut self, ino: u64, parent: u64, name: &[u8]) {
        self.add_name(parent, ino, name);
    }

    /// An inode with no name and an orphan item (unlinked while open).
    pub fn orphan(&mut self, mode: u32) -> u64 {
        let ino = self.new_inode(mode, 0);
        self.items.insert(
            Key::new(ORPHAN_OBJECTID, item_type::ORPHAN_ITEM, ino),
            Vec::new(),
        );
        ino
    }

    pub fn write_inline(&mut self, ino: u64, data: &[u8]) {
        self.items.insert(
            Key::new(ino, item_type::EXTENT_DATA, 0),
            FileExtent::Inline {
                data: data.to_vec(),
            }
            .encode(),
        );
        let i = self.inode_mut(ino);
        i.size = data.len() as u64;
        i.nbytes += data.len() as u64;
    }

    /// A compressed inline extent of `data` (docs/COMPRESSION.md,
    /// "Compressed inline extents"), zstd at level 3; `data` must shrink
    /// into the inline limit. The superblock's compression flag is the
    /// test's to set.
    pub fn write_inline_compressed(&mut self, ino: u64, data: &[u8]) {
        let compression = crate::format::Compression::Zstd;
        let compressed = crate::format::compression::compress_inline(
            compression,
            crate::format::compression::DEFAULT_ZSTD_LEVEL,
            data,
        )
        .expect("fixture inline data compresses");
        self.items.insert(
            Key::new(ino, item_type::EXTENT_DATA, 0),
            FileExtent::InlineCompressed {
                compressed,
                ram_bytes: data.len() as u64,
                compression,
            }
            .encode(),
        );
        let i = self.inode_mut(ino);
        i.size = data.len() as u64;
        i.nbytes += data.len() as u64;
    }

    fn alloc_data(&mut self, len: u64, owner: u64) -> u64 {
        assert!(len > 0 && len.is_multiple_of(SECTOR_SIZE));
        let bytenr = self.next_data;
        self.next_data += len;
        assert!(
            self.next_data <= self.total_bytes,
            "fixture data does not fit"
        );
        self.data_extents.push((bytenr, len, owner));
        bytenr
    }

    fn put_extent(&mut self, ino: u64, file_offset: u64, extent: FileExtent) {
        let len = extent.len();
        let prealloc = matches!(extent, FileExtent::Prealloc { .. });
        self.items.insert(
            Key::new(ino, item_type::EXTENT_DATA, file_offset),
            extent.encode(),
        );
        let i = self.inode_mut(ino);
        i.nbytes += len;
        if !prealloc {
            i.size = i.size.max(file_offset + len);
        }
    }

    /// A regular extent of `len` bytes at `file_offset`, in a new disk extent.
    pub fn write_extent(&mut self, ino: u64, file_offset: u64, len: u64) -> u64 {
        let disk = self.alloc_data(len, ino);
        self.put_extent(
            ino,
            file_offset,
            FileExtent::Regular {
                disk_bytenr: disk,
                disk_num_bytes: len,
                offset: 0,
                num_bytes: len,
            },
        );
        disk
    }

    /// One disk extent of `len` bytes referenced by two file extent items
    /// (as after a split at `split`).
    pub fn write_split_extent(&mut self, ino: u64, file_offset: u64, len: u64, split: u64) -> u64 {
        assert!(split > 0 && split < len && split.is_multiple_of(SECTOR_SIZE));
        let disk = self.alloc_data(len, ino);
        self.put_extent(
            ino,
            file_offset,
            FileExtent::Regular {
                disk_bytenr: disk,
                disk_num_bytes: len,
                offset: 0,
                num_bytes: split,
            },
        );
        self.put_extent(
            ino,
            file_offset + split,
            FileExtent::Regular {
                disk_bytenr: disk,
                disk_num_bytes: len,
                offset: split,
                num_bytes: len - split,
            },
        );
        disk
    }

    /// A preallocated extent (size unchanged).
    pub fn prealloc(&mut self, ino: u64, file_offset: u64, len: u64) -> u64 {
        let disk = self.alloc_data(len, ino);
        self.put_extent(
            ino,
            file_offset,
            FileExtent::Prealloc {
                disk_bytenr: disk,
                disk_num_bytes: len,
                offset: 0,
                num_bytes: len,
            },
        );
        disk
    }

    /// A data extent item that no file extent references.
    pub fn leak_data_extent(&mut self, len: u64) -> u64 {
        self.alloc_data(len, ROOT_DIR_INO)
    }

    pub fn xattr(&mut self, ino: u64, name: &[u8], value: &[u8]) {
        let key = Key::new(ino, item_type::XATTR_ITEM, name_hash(name));
        let mut xs = self
            .items
            .get(&key)
            .map(|d| decode_xattrs(d).expect("fixture xattr"))
            .unwrap_or_default();
        xs.push(Xattr {
            name: name.to_vec(),
            value: value.to_vec(),
        });
        self.items.insert(key, encode_xattrs(&xs));
    }

    /// Sets `INCOMPAT_SUBVOLUMES`: tree 5 gets its long root item (as the
    /// first subvolume creation makes it, docs/SNAPSHOTS.md (a)).
    pub fn enable_subvolumes(&mut self) {
        self.subvolumes = true;
        self.fs_root = self.subvol_root_item(tree_id::FS, 1);
        self.fs_root.otransid = 0;
    }

    fn subvol_root_item(&self, id: u64, refs: u32) -> SubvolRootItem {
        let mut uuid = [0xb1; 16];
        uuid[..8].copy_from_slice(&id.to_le_bytes());
        SubvolRootItem {
            refs,
            uuid,
            ctransid: self.generation,
            otransid: self.generation,
            ctime: time(),
            otime: time(),
            ..Default::default()
        }
    }

    /// A new subvolume tree (an empty root directory), not linked
    /// anywhere; `refs` as its root item should say. Returns its id (the
    /// highest so far + 1, from 256).
    pub fn new_subvolume(&mut self, refs: u32) -> u64 {
        assert!(self.subvolumes, "enable_subvolumes first");
        let id = self
            .subvols
            .keys()
            .next_back()
            .map_or(tree_id::FIRST_SUBVOL, |&id| id + 1);
        let mut items = BTreeMap::new();
        items.insert(
            Key::new(ROOT_DIR_INO, item_type::INODE_REF, ROOT_DIR_INO),
            encode_inode_refs(&[InodeRefEntry {
                index: 0,
                name: b"..".to_vec(),
            }]),
        );
        let subvol = Subvol {
            item: self.subvol_root_item(id, refs),
            root_dir: self.inode_item(libc::S_IFDIR | 0o755, 2),
            items,
            next_index: FIRST_DIR_INDEX,
        };
        self.subvols.insert(id, subvol);
        id
    }

    /// Links subvolume `child` as `name` in directory `dir` of subvolume
    /// `parent` (for a parent other than 5, only its root directory):
    /// the DIR_ITEM and DIR_INDEX link, the directory's size and nlink,
    /// and the ROOT_REF / ROOT_BACKREF pair.
    pub fn link_subvolume(&mut self, parent: u64, dir: u64, name: &[u8], child: u64) {
        let entry = DirEntry {
            ino: child,
            file_type: FileType::Directory,
            name: name.to_vec(),
            subvolume: true,
        };
        let (items, dir_inode, index) = if parent == tree_id::FS {
            let next = self.next_index.entry(dir).or_insert(FIRST_DIR_INDEX);
            let index = *next;
            *next += 1;
            let inode = self.inodes.get_mut(&dir).expect("no such directory");
            (&mut self.items, inode, index)
        } else {
            assert_eq!(
                dir, ROOT_DIR_INO,
                "links below a subvolume's root directory"
            );
            let s = self.subvols.get_mut(&parent).expect("no such subvolume");
            let index = s.next_index;
            s.next_index += 1;
            (&mut s.items, &mut s.root_dir, index)
        };
        let dkey = Key::new(dir, item_type::DIR_ITEM, name_hash(name));
        let mut entries = items
            .get(&dkey)
            .map(|d| decode_dir_items(d).expect("fixture dir item"))
            .unwrap_or_default();
        entries.push(entry.clone());
        items.insert(dkey, encode_dir_items(&entries));
        items.insert(Key::new(dir, item_type::DIR_INDEX, index), entry.encode());
        dir_inode.size += name.len() as u64;
        dir_inode.nlink += 1;
        let rr = RootRef {
            dirid: dir,
            index,
            name: name.to_vec(),
        };
        self.root_tree_items
            .insert(Key::root_ref(parent, child), rr.encode());
        self.root_tree_items
            .insert(Key::root_backref(child, parent), rr.encode());
    }

    /// A new subvolume linked as `name` in `dir` of `parent`.
    pub fn subvolume(&mut self, parent: u64, dir: u64, name: &[u8]) -> u64 {
        let id = self.new_subvolume(1);
        self.link_subvolume(parent, dir, name, id);
        id
    }

    /// A regular file `name` (nlink 1, empty) in the root directory of
    /// subvolume `id` (other than 5): its INODE_ITEM, INODE_REF, DIR_ITEM
    /// and DIR_INDEX, and the directory's size. Inode numbers count from
    /// 257 in each subvolume tree. Returns the inode number.
    pub fn subvol_create(&mut self, id: u64, name: &[u8]) -> u64 {
        let inode = self.inode_item(libc::S_IFREG | 0o644, 1);
        let s = self.subvols.get_mut(&id).expect("no such subvolume");
        let ino = s
            .items
            .keys()
            .map(|k| k.objectid)
            .filter(|&o| o < MAX_SUBVOL_INO)
            .max()
            .map_or(ROOT_DIR_INO + 1, |o| (o + 1).max(ROOT_DIR_INO + 1));
        let index = s.next_index;
        s.next_index += 1;
        let entry = DirEntry {
            ino,
            file_type: FileType::Regular,
            name: name.to_vec(),
            subvolume: false,
        };
        let dkey = Key::new(ROOT_DIR_INO, item_type::DIR_ITEM, name_hash(name));
        let mut entries = s
            .items
            .get(&dkey)
            .map(|d| decode_dir_items(d).expect("fixture dir item"))
            .unwrap_or_default();
        entries.push(entry.clone());
        s.items.insert(dkey, encode_dir_items(&entries));
        s.items.insert(
            Key::new(ROOT_DIR_INO, item_type::DIR_INDEX, index),
            entry.encode(),
        );
        s.items.insert(
            Key::new(ino, item_type::INODE_REF, ROOT_DIR_INO),
            encode_inode_refs(&[InodeRefEntry {
                index,
                name: name.to_vec(),
            }]),
        );
        s.items
            .insert(Key::new(ino, item_type::INODE_ITEM, 0), inode.encode());
        s.root_dir.size += name.len() as u64;
        ino
    }

    /// A dead subvolume: refs 0, an orphan-root item, no link (deleted,
    /// waiting for the cleaner).
    pub fn dead_subvolume(&mut self) -> u64 {
        let id = self.new_subvolume(0);
        self.root_tree_items
            .insert(Key::orphan_root(id), Vec::new());
        id
    }

    /// The default-subvolume item naming `id`.
    pub fn set_default_subvolume(&mut self, id: u64) {
        let entry = DirEntry {
            ino: id,
            file_type: FileType::Directory,
            name: DEFAULT_SUBVOL_NAME.to_vec(),
            subvolume: false,
        };
        self.root_tree_items
            .insert(Key::default_subvol(), encode_dir_items(&[entry]));
    }

    /// Raw access to the root tree's items other than root items.
    pub fn root_tree_items_mut(&mut self) -> &mut BTreeMap<Key, Vec<u8>> {
        &mut self.root_tree_items
    }

    /// The long root item of subvolume `id` (5 included); its root node
    /// fields are overwritten at build.
    pub fn subvol_item_mut(&mut self, id: u64) -> &mut SubvolRootItem {
        if id == tree_id::FS {
            return &mut self.fs_root;
        }
        &mut self.subvols.get_mut(&id).expect("no such subvolume").item
    }

    /// Raw access to the items of subvolume tree `id` (other than 5).
    pub fn subvol_items_mut(&mut self, id: u64) -> &mut BTreeMap<Key, Vec<u8>> {
        &mut self.subvols.get_mut(&id).expect("no such subvolume").items
    }

    /// The root tree's items: the root items (from where each tree's root
    /// node is, `(bytenr, level)` by tree id) and the other items.
    fn root_tree(&self, gen: u64, roots: &BTreeMap<u64, (u64, u8)>) -> Vec<(Key, Vec<u8>)> {
        let mut items = self.root_tree_items.clone();
        for (&id, &(bytenr, level)) in roots {
            let root = RootItem {
                bytenr,
                generation: gen,
                level,
            };
            let long = match id {
                tree_id::FS if self.subvolumes => Some(self.fs_root),
                tree_id::EXTENT | tree_id::FS => None,
                _ => Some(self.subvols[&id].item),
            };
            let data = match long {
                Some(item) => SubvolRootItem { root, ..item }.encode(),
                None => root.encode(),
            };
            items.insert(Key::new(id, item_type::ROOT_ITEM, 0), data);
        }
        items.into_iter().collect()
    }

    /// Lays out the trees and writes the image. Long because it is
    /// test-support code that lays out every tree of an image in one
    /// reading order (fs items, extent items, nodes, root items,
    /// superblock), and the phases share the layout state.
    pub fn build(&self) -> Fixture {
        let gen = self.generation;
        let mut fs_items: BTreeMap<Key, Vec<u8>> = self.items.clone();
        for (&ino, inode) in &self.inodes {
            fs_items.insert(Key::new(ino, item_type::INODE_ITEM, 0), inode.encode());
        }
        // Every subvolume tree, 5 first: its items in key order.
        let mut subvol_trees: Vec<(u64, TreeItems)> =
            vec![(tree_id::FS, fs_items.into_iter().collect())];
        for (&id, sv) in &self.subvols {
            let mut items = sv.items.clone();
            items.insert(
                Key::new(ROOT_DIR_INO, item_type::INODE_ITEM, 0),
                sv.root_dir.encode(),
            );
            subvol_trees.push((id, items.into_iter().collect()));
        }
        let mut refs: HashMap<u64, u64> = HashMap::new();
        for (key, data) in subvol_trees.iter().flat_map(|(_, items)| items) {
            if key.item_type == item_type::EXTENT_DATA {
                if let Some(d) = FileExtent::decode(data).ok().and_then(|e| e.disk_ref()) {
                    *refs.entry(d.disk_bytenr).or_default() += 1;
                }
            }
        }

        let sizes =
            |items: &[(Key, Vec<u8>)]| items.iter().map(|(_, d)| d.len()).collect::<Vec<_>>();
        let shape_of =
            |items: &[(Key, Vec<u8>)]| shape(&sizes(items), self.leaf_items_max, self.ptrs_max);
        let subvol_shapes: Vec<Vec<Vec<Range<usize>>>> = subvol_trees
            .iter()
            .map(|(_, items)| shape_of(items))
            .collect();
        // The root tree's item sizes do not depend on where the roots are.
        let mut placeholder: BTreeMap<u64, (u64, u8)> =
            subvol_trees.iter().map(|&(id, _)| (id, (0, 0))).collect();
        placeholder.insert(tree_id::EXTENT, (0, 0));
        let root_shape = shape_of(&self.root_tree(gen, &placeholder));
        let count = |s: &Vec<Vec<Range<usize>>>| s.iter().map(Vec::len).sum::<usize>();
        let subvol_nodes: usize = subvol_shapes.iter().map(count).sum();
        let mut ext_nodes = 1;
        let ext_shape = loop {
            let n_items = subvol_nodes + count(&root_shape) + ext_nodes + self.data_extents.len();
            let s = shape(&vec![24; n_items], self.leaf_items_max, self.ptrs_max);
            if count(&s) == ext_nodes {
                break s;
            }
            ext_nodes = count(&s);
        };

        // Block numbers: root tree, extent tree, subvolume trees, leaves first.
        let mut cursor = FIRST_ALLOCATABLE_BYTE;
        let mut assign = |s: &Vec<Vec<Range<usize>>>| -> Vec<Vec<u64>> {
            s.iter()
                .map(|level| {
                    level
                        .iter()
                        .map(|_| {
                            let b = cursor;
                            cursor += NODE_SIZE as u64;
                            b
                        })
                        .collect()
                })
                .collect()
        };
        let root_blocks = assign(&root_shape);
        let ext_blocks = assign(&ext_shape);
        let subvol_blocks: Vec<Vec<Vec<u64>>> = subvol_shapes.iter().map(&mut assign).collect();
        assert!(
            cursor <= self.total_bytes / 2,
            "fixture metadata does not fit below the data"
        );

        let mut ext_items: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
        let trees = [
            (tree_id::ROOT, &root_blocks),
            (tree_id::EXTENT, &ext_blocks),
        ]
        .into_iter()
        .chain(subvol_trees.iter().map(|(id, _)| *id).zip(&subvol_blocks));
        for (tree, blocks) in trees {
            for (level, bs) in blocks.iter().enumerate() {
                for &b in bs {
                    ext_items.insert(
                        Key::new(b, item_type::METADATA_ITEM, level as u64),
                        ExtentItem {
                            refs: 1,
                            generation: gen,
                            owner: tree,
                        }
                        .encode(),
                    );
                }
            }
        }
        for &(b, len, owner) in &self.data_extents {
            let r = refs.get(&b).copied().unwrap_or(1);
            ext_items.insert(
                Key::new(b, item_type::EXTENT_ITEM, len),
                ExtentItem {
                    refs: r,
                    generation: gen,
                    owner,
                }
                .encode(),
            );
        }
        let ext_items: Vec<(Key, Vec<u8>)> = ext_items.into_iter().collect();
        assert_eq!(
            ext_items.len(),
            subvol_nodes + count(&root_shape) + count(&ext_shape) + self.data_extents.len()
        );

        let root_of = |blocks: &Vec<Vec<u64>>| {
            (
                *blocks.last().expect("levels").first().expect("root"),
                (blocks.len() - 1) as u8,
            )
        };
        let mut roots: BTreeMap<u64, (u64, u8)> = BTreeMap::new();
        roots.insert(tree_id::EXTENT, root_of(&ext_blocks));
        for ((id, _), blocks) in subvol_trees.iter().zip(&subvol_blocks) {
            roots.insert(*id, root_of(blocks));
        }
        let root_items = self.root_tree(gen, &roots);

        let mut nodes = Vec::new();
        nodes.extend(materialize(
            tree_id::ROOT,
            gen,
            &root_items,
            &root_shape,
            &root_blocks,
        ));
        nodes.extend(materialize(
            tree_id::EXTENT,
            gen,
            &ext_items,
            &ext_shape,
            &ext_blocks,
        ));
        for (((id, items), s), blocks) in
            subvol_trees.iter().zip(&subvol_shapes).zip(&subvol_blocks)
        {
            nodes.extend(materialize(*id, gen, items, s, blocks));
        }

        let (root_root, root_level) = root_of(&root_blocks);
        let bytes_used = nodes.len() as u64 * NODE_SIZE as u64
            + self.data_extents.iter().map(|&(_, l, _)| l).sum::<u64>();
        let superblock = Superblock {
            fsid: self.fsid,
            generation: gen,
            root_tree_bytenr: root_root,
            root_tree_level: root_level,
            total_bytes: self.total_bytes,
            bytes_used,
            log_root_bytenr: 0,
            log_root_level: 0,
            log_generation: 0,
            backup_roots: [BackupRoot::EMPTY; BACKUP_ROOT_COUNT],
            metadata_profile: crate::format::MetadataProfile::Single,
            data_checksums: false,
            log_manifest: None,
            subvolumes: self.subvolumes,
            compression: false,
        };
        let mut fx = Fixture {
            image: vec![0; self.total_bytes as usize],
            superblock: superblock.clone(),
            nodes: Vec::new(),
        };
        for n in &nodes {
            fx.write_node(n);
            fx.nodes.push(FixtureNode {
                tree: n.owner,
                bytenr: n.bytenr,
                level: n.level,
            });
        }
        fx.write_superblock(&superblock);
        fx
    }
}

/// Packs items (by payload size) into leaves and leaves into internal
/// levels: `levels[0]` are leaves as item ranges, `levels[k]` ranges of
/// level k-1 nodes; the last level holds the root alone.
fn shape(sizes: &[usize], leaf_items_max: usize, ptrs_max: usize) -> Vec<Vec<Range<usize>>> {
    let mut leaves = Vec::new();
    let mut start = 0;
    let mut used = 0;
    for (i, size) in sizes.iter().enumerate() {
        let need = LEAF_ITEM_HEADER_SIZE + size;
        assert!(need <= BODY_SIZE, "fixture item too large");
        if i > start && (used + need > BODY_SIZE || i - start >= leaf_items_max) {
            leaves.push(start..i);
            start = i;
            used = 0;
        }
        used += need;
    }
    leaves.push(start..sizes.len());
    let ptrs_max = ptrs_max.clamp(2, MAX_KEY_PTRS);
    let mut levels = vec![leaves];
    while levels.last().expect("levels").len() > 1 {
        let below = levels.last().expect("levels").len();
        let level = (0..below)
            .step_by(ptrs_max)
            .map(|s| s..(s + ptrs_max).min(below))
            .collect();
        levels.push(level);
    }
    levels
}

fn materialize(
    tree: u64,
    gen: u64,
    items: &[(Key, Vec<u8>)],
    shape: &[Vec<Range<usize>>],
    blocks: &[Vec<u64>],
) -> Vec<Node> {
    let mut out = Vec::new();
    let mut first_keys: Vec<Key> = Vec::new();
    for (i, r) in shape[0].iter().enumerate() {
        let leaf_items: Vec<LeafItem> = items[r.clone()]
            .iter()
            .map(|(k, d)| LeafItem {
                key: *k,
                data: d.clone(),
            })
            .collect();
        first_keys.push(leaf_items.first().map(|i| i.key).unwrap_or_default());
        out.push(Node {
            bytenr: blocks[0][i],
            generation: gen,
            owner: tree,
            level: 0,
            body: NodeBody::Leaf(leaf_items),
        });
    }
    for level in 1..shape.len() {
        let mut next_keys = Vec::new();
        for (i, r) in shape[level].iter().enumerate() {
            let ptrs: Vec<KeyPtr> = r
                .clone()
                .map(|c| KeyPtr {
                    key: first_keys[c],
                    blockptr: blocks[level - 1][c],
                    generation: gen,
                })
                .collect();
            next_keys.push(ptrs[0].key);
            out.push(Node {
                bytenr: blocks[level][i],
                generation: gen,
                owner: tree,
                level: level as u8,
                body: NodeBody::Internal(ptrs),
            });
        }
        first_keys = next_keys;
    }
    out
}

/// A node of a fixture image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixtureNode {
    pub tree: u64,
    pub bytenr: u64,
    pub level: u8,
}

/// A built image and where its nodes are.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub image: Vec<u8>,
    pub superblock: Superblock,
    pub nodes: Vec<FixtureNode>,
}

impl Fixture {
    pub fn device(&self) -> MemoryDevice {
        MemoryDevice::from_bytes(self.image.clone())
    }

    pub fn fsid(&self) -> [u8; 16] {
        self.superblock.fsid
    }

    /// Decodes the (valid) node at `bytenr`.
    pub fn node(&self, bytenr: u64) -> Node {
        let b = bytenr as usize;
        Node::decode(&self.image[b..b + NODE_SIZE], bytenr, &self.superblock.fsid)
            .expect("fixture node")
    }

    /// Encodes `node` (with a valid checksum) at its bytenr.
    pub fn write_node(&mut self, node: &Node) {
        let bytes = node.encode(&self.superblock.fsid);
        let b = node.bytenr as usize;
        self.image[b..b + NODE_SIZE].copy_from_slice(&bytes);
    }

    /// Decodes, changes and re-encodes (re-checksums) the node at `bytenr`.
    pub fn modify_node(&mut self, bytenr: u64, f: impl FnOnce(&mut Node)) {
        let mut n = self.node(bytenr);
        f(&mut n);
        self.write_node(&n);
    }

    /// Writes both superblock copies.
    pub fn write_superblock(&mut self, sb: &Superblock) {
        for off in SUPERBLOCK_OFFSETS {
            let bytes = sb.encode(off);
            self.image[off as usize..off as usize + bytes.len()].copy_from_slice(&bytes);
        }
        self.superblock = sb.clone();
    }

    /// The root block of a tree.
    pub fn root_of(&self, tree: u64) -> FixtureNode {
        *self
            .nodes
            .iter()
            .filter(|n| n.tree == tree)
            .max_by_key(|n| n.level)
            .expect("no such tree")
    }

    /// (block, slot) of the item with `key` in `tree`.
    pub fn find_item(&self, tree: u64, key: Key) -> Option<(u64, usize)> {
        for n in self.nodes.iter().filter(|n| n.tree == tree && n.level == 0) {
            let node = self.node(n.bytenr);
            if let NodeBody::Leaf(items) = &node.body {
                if let Some(slot) = items.iter().position(|i| i.key == key) {
                    return Some((n.bytenr, slot));
                }
            }
        }
        None
    }

    /// Inserts an item into the leaf of `tree` whose range holds `key`
    /// (the tree's shape is not changed: the leaf must have room, and a
    /// key below the tree's first one is not supported).
    pub fn insert_item(&mut self, tree: u64, key: Key, data: Vec<u8>) {
        let leaf = self
            .nodes
            .iter()
            .filter(|n| n.tree == tree && n.level == 0)
            .map(|n| (self.node(n.bytenr).first_key(), n.bytenr))
            .filter(|(first, _)| first.is_some_and(|f| f <= key))
            .max()
            .map(|(_, bytenr)| bytenr)
            .unwrap_or_else(|| panic!("no leaf of tree {tree} for {key}"));
        self.modify_node(leaf, |n| {
            let items = n.leaf_items_mut();
            let slot = items.partition_point(|i| i.key < key);
            items.insert(slot, LeafItem { key, data });
        });
    }

    /// Makes tree `id` a snapshot of the fs tree as birch makes one
    /// (docs/SNAPSHOTS.md (b)): a copy of the fs tree's root node, owned
    /// by `id` and named by a root item, sharing every child, each child's
    /// metadata item counting one more reference. Returns the new root's
    /// block. The fs tree's root must be an internal node, and the image
    /// must have been built with [`FsBuilder::enable_subvolumes`]. The
    /// snapshot is left unlinked, as a deleted snapshot waiting for the
    /// cleaner (root item refs 0 and an orphan-root item, invariant S6):
    /// linking it would change tree 5's shared nodes.
    pub fn snapshot_fs_tree(&mut self, id: u64) -> u64 {
        let source = self.root_of(tree_id::FS);
        assert!(source.level > 0, "the fs tree must have children to share");
        let end = self.nodes.iter().map(|n| n.bytenr).max().expect("nodes") + NODE_SIZE as u64;
        let mut copy = self.node(source.bytenr);
        copy.bytenr = end;
        copy.owner = id;
        self.write_node(&copy);
        self.nodes.push(FixtureNode {
            tree: id,
            bytenr: end,
            level: copy.level,
        });
        let generation = copy.generation;
        assert!(self.superblock.subvolumes, "enable_subvolumes first");
        let mut uuid = [0x5a; 16];
        uuid[..8].copy_from_slice(&id.to_le_bytes());
        let root_item = SubvolRootItem {
            root: RootItem {
                bytenr: end,
                generation,
                level: copy.level,
            },
            refs: 0,
            last_snapshot: generation,
            uuid,
            ctransid: generation,
            otransid: generation,
            ctime: time(),
            otime: time(),
            ..Default::default()
        };
        self.insert_item(
            tree_id::ROOT,
            Key::new(id, item_type::ROOT_ITEM, 0),
            root_item.encode(),
        );
        self.insert_item(tree_id::ROOT, Key::orphan_root(id), Vec::new());
        // The source's nodes are shared now: its CoW must copy them (S3).
        self.modify_item(
            tree_id::ROOT,
            Key::new(tree_id::FS, item_type::ROOT_ITEM, 0),
            |d| {
                let mut item = SubvolRootItem::decode(d).expect("fixture subvolume root item");
                item.last_snapshot = generation;
                *d = item.encode();
            },
        );
        let metadata =
            |level: u8, bytenr: u64| Key::new(bytenr, item_type::METADATA_ITEM, u64::from(level));
        let item = ExtentItem {
            refs: 1,
            generation,
            owner: id,
        };
        self.insert_item(tree_id::EXTENT, metadata(copy.level, end), item.encode());
        for p in copy.key_ptrs() {
            self.modify_item(tree_id::EXTENT, metadata(copy.level - 1, p.blockptr), |d| {
                let mut item = ExtentItem::decode(d).expect("fixture metadata item");
                item.refs += 1;
                *d = item.encode();
            });
        }
        let mut sb = self.superblock.clone();
        sb.bytes_used += NODE_SIZE as u64;
        self.write_superblock(&sb);
        end
    }

    /// Changes the payload of one item in place (re-checksummed); returns
    /// where it is.
    pub fn modify_item(
        &mut self,
        tree: u64,
        key: Key,
        f: impl FnOnce(&mut Vec<u8>),
    ) -> (u64, usize) {
        let (block, slot) = self
            .find_item(tree, key)
            .unwrap_or_else(|| panic!("no item {key} in tree {tree}"));
        self.modify_node(block, |n| {
            if let NodeBody::Leaf(items) = &mut n.body {
                f(&mut items[slot].data);
            }
        });
        (block, slot)
    }
}

/// A small filesystem with one of everything (16 MiB device):
///
/// ```text
/// 256 /            dir    names a, d, l
/// 257 /a, /d/a2    file   8 KiB + 4 KiB from one split disk extent, xattr
/// 258 /d           dir    names b, a2
/// 259 /d/b         file   inline "hello"
/// 260 /l           symlink -> "a"
/// 261 (orphan)     file   a preallocated 4 KiB extent, nlink 0
/// ```
pub fn sample() -> FsBuilder {
    let mut b = FsBuilder::new(16 << 20);
    let a = b.create(ROOT_DIR_INO, b"a");
    let d = b.mkdir(ROOT_DIR_INO, b"d");
    b.write_split_extent(a, 0, 12288, 8192);
    b.inode_mut(a).size = 10000;
    b.xattr(a, b"user.note", b"value");
    let f = b.create(d, b"b");
    b.write_inline(f, b"hello");
    b.symlink(ROOT_DIR_INO, b"l", b"a");
    b.link(a, d, b"a2");
    let o = b.orphan(libc::S_IFREG | 0o600);
    b.prealloc(o, 0, 4096);
    b
}

/// Damages the tree node at `bytenr` on `dev` so that it fails validation
/// (its checksum), as a bad sector or a lost write would. Every test that
/// damages a node of a real image goes through here: when metadata has
/// two copies (DUP), it damages both.
pub fn corrupt_node(dev: &dyn BlockDevice, bytenr: u64) {
    let profile = crate::fs::read_superblock(dev)
        .expect("superblock of the image to damage")
        .metadata_profile;
    let copies = std::iter::once(bytenr).chain(profile.mirror_of(bytenr));
    for at in copies {
        let mut node = vec![0u8; NODE_SIZE];
        dev.read_at(&mut node, at)
            .expect("read of the node to damage");
        for byte in &mut node[200..264] {
            *byte ^= 0xa5;
        }
        dev.write_at(&node, at).expect("write of the damaged node");
    }
}
