//! Seeded random workloads over a small fixed pool of names.
//!
//! The pool is small on purpose: with five short names, two 255-byte names
//! and one 256-byte name, at most three directories deep, operations keep
//! colliding: creates hit existing names, renames land on existing files
//! and directories (and on their own ancestors), links pile up on one
//! inode, rmdir meets non-empty directories. Files are written at offsets
//! chosen around the interesting boundaries: the 2048-byte inline limit,
//! page edges, far sparse offsets. The generator looks at the model to pick
//! existing paths most of the time, so long sequences build deep trees
//! instead of failing with ENOENT; the result is deterministic per seed.
//!
//! Every op has a `Display` form that reads like a command
//! (`rename /a/f /b noreplace`), printed in failure reports.

use crate::model::{show_path, Kind, Model, Path, RenameFlags, XattrMode};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt;

/// What an inode operation applies to: a path, or an open handle slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Path(Path),
    Handle(usize),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Path(p) => f.write_str(&show_path(p)),
            Target::Handle(h) => write!(f, "fd{h}"),
        }
    }
}

/// One operation of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Create {
        path: Path,
        perm: u32,
    },
    Mkdir {
        path: Path,
        perm: u32,
    },
    Mkfifo {
        path: Path,
    },
    Symlink {
        path: Path,
        target: Vec<u8>,
    },
    Link {
        from: Path,
        to: Path,
    },
    Unlink {
        path: Path,
    },
    Rmdir {
        path: Path,
    },
    Rename {
        from: Path,
        to: Path,
        flags: RenameFlags,
    },
    /// Writes `len` bytes of the pattern `fill` at `offset`.
    Write {
        target: Target,
        offset: u64,
        len: u64,
        fill: u64,
    },
    /// Writes `len` bytes of the compressible text pattern `fill` at
    /// `offset` ([`text_pattern`]): on a compressing mount or a `+c` file
    /// its chunks become compressed extents.
    WriteText {
        target: Target,
        offset: u64,
        len: u64,
        fill: u64,
    },
    Truncate {
        target: Target,
        size: u64,
    },
    /// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`.
    PunchHole {
        target: Target,
        offset: u64,
        len: u64,
    },
    /// `fallocate(FALLOC_FL_ZERO_RANGE)`, with `FALLOC_FL_KEEP_SIZE` when
    /// `keep_size` (else the file grows to cover the range).
    ZeroRange {
        target: Target,
        offset: u64,
        len: u64,
        keep_size: bool,
    },
    /// `copy_file_range` (a reflink where both offsets sit at the same
    /// place within a page).
    CopyRange {
        src: Target,
        src_offset: u64,
        dst: Target,
        dst_offset: u64,
        len: u64,
    },
    /// `chattr -m +c` (`on`) or `chattr -c`: FS_IOC_SETFLAGS with
    /// FS_COMPR_FL set (and FS_NOCOMP_FL cleared, which writeback may have
    /// set) or cleared, the other flags kept.
    SetCompressFlag {
        target: Target,
        on: bool,
    },
    Read {
        target: Target,
        offset: u64,
        len: u64,
    },
    Chmod {
        target: Target,
        perm: u32,
    },
    Chown {
        target: Target,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    SetXattr {
        target: Target,
        name: Vec<u8>,
        value_len: usize,
        fill: u64,
        mode: XattrMode,
    },
    RemoveXattr {
        target: Target,
        name: Vec<u8>,
    },
    GetXattr {
        target: Target,
        name: Vec<u8>,
    },
    ListXattr {
        target: Target,
    },
    Stat {
        target: Target,
    },
    Readdir {
        path: Path,
    },
    Readlink {
        path: Path,
    },
    /// Opens the path into handle slot `slot` (closing what was there).
    Open {
        path: Path,
        slot: usize,
    },
    Close {
        slot: usize,
    },
    Fsync {
        target: Target,
        datasync: bool,
    },
    /// fsync of a directory.
    FsyncDir {
        target: Target,
    },
    Sync,
    /// Close and reopen the filesystem (model tests only).
    Remount,
    /// `subvolume create path` (commits before it returns).
    CreateSubvolume {
        path: Path,
    },
    /// `subvolume snapshot [-r] source dest`: `source` is the root
    /// directory of a subvolume (the empty path: the top level). Commits
    /// before it returns.
    Snapshot {
        source: Path,
        dest: Path,
        readonly: bool,
    },
    /// `subvolume delete path` (durable at the next commit).
    DeleteSubvolume {
        path: Path,
    },
    /// One transaction of the cleaner that drops deleted subvolumes.
    Cleaner,
}

/// The kind of durability an op asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persist {
    Sync,
    Fsync { datasync: bool },
    FsyncDir,
}

impl Op {
    /// Short name of the op's kind (for statistics).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Op::Create { .. } => "create",
            Op::Mkdir { .. } => "mkdir",
            Op::Mkfifo { .. } => "mkfifo",
            Op::Symlink { .. } => "symlink",
            Op::Link { .. } => "link",
            Op::Unlink { .. } => "unlink",
            Op::Rmdir { .. } => "rmdir",
            Op::Rename { .. } => "rename",
            Op::Write { .. } => "write",
            Op::WriteText { .. } => "write-text",
            Op::Truncate { .. } => "truncate",
            Op::PunchHole { .. } => "punch-hole",
            Op::ZeroRange { .. } => "zero-range",
            Op::CopyRange { .. } => "copy-range",
            Op::SetCompressFlag { .. } => "chattr-c",
            Op::Read { .. } => "read",
            Op::Chmod { .. } => "chmod",
            Op::Chown { .. } => "chown",
            Op::SetXattr { .. } => "setxattr",
            Op::RemoveXattr { .. } => "removexattr",
            Op::GetXattr { .. } => "getxattr",
            Op::ListXattr { .. } => "listxattr",
            Op::Stat { .. } => "stat",
            Op::Readdir { .. } => "readdir",
            Op::Readlink { .. } => "readlink",
            Op::Open { .. } => "open",
            Op::Close { .. } => "close",
            Op::Fsync { .. } => "fsync",
            Op::FsyncDir { .. } => "fsync-dir",
            Op::Sync => "sync",
            Op::Remount => "remount",
            Op::CreateSubvolume { .. } => "subvol-create",
            Op::Snapshot { .. } => "snapshot",
            Op::DeleteSubvolume { .. } => "subvol-delete",
            Op::Cleaner => "cleaner",
        }
    }

    /// Whether (and how) this op is a persistence point. Subvolume create
    /// and snapshot commit before they return, so they promise what a
    /// sync does.
    pub fn persistence(&self) -> Option<Persist> {
        match self {
            Op::Sync | Op::Remount | Op::CreateSubvolume { .. } | Op::Snapshot { .. } => {
                Some(Persist::Sync)
            }
            Op::Fsync { datasync, .. } => Some(Persist::Fsync {
                datasync: *datasync,
            }),
            Op::FsyncDir { .. } => Some(Persist::FsyncDir),
            _ => None,
        }
    }
}

/// The bytes a write or xattr with pattern `fill` carries (random:
/// incompressible, so compression's heuristic gives up on them).
pub fn pattern(fill: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    ChaCha8Rng::seed_from_u64(fill).fill_bytes(&mut out);
    out
}

/// The bytes a text write with pattern `fill` carries: words of a small
/// vocabulary, picked by a generator seeded with `fill`, so each pattern
/// differs (a wrong extent reads back wrong) yet zstd and lz4 shrink every
/// 128 KiB chunk well below its size.
pub fn text_pattern(fill: u64, len: usize) -> Vec<u8> {
    const WORDS: [&[u8]; 16] = [
        b"birch ", b"extent ", b"tree ", b"commit ", b"log ", b"inode ", b"page ", b"zstd ",
        b"lz4 ", b"the ", b"of ", b"a ", b"flush\n", b"crash ", b"data ", b"sync\n",
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(fill);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(WORDS[(rng.next_u32() % 16) as usize]);
    }
    out.truncate(len);
    out
}

fn flags_str(flags: RenameFlags) -> String {
    let names: Vec<&str> = [
        (flags.no_replace, "noreplace"),
        (flags.exchange, "exchange"),
        (flags.whiteout, "whiteout"),
    ]
    .into_iter()
    .filter_map(|(set, name)| set.then_some(name))
    .collect();
    if names.is_empty() {
        String::new()
    } else {
        format!(" {}", names.join("|"))
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Create { path, perm } => write!(f, "create {} {perm:o}", show_path(path)),
            Op::Mkdir { path, perm } => write!(f, "mkdir {} {perm:o}", show_path(path)),
            Op::Mkfifo { path } => write!(f, "mkfifo {}", show_path(path)),
            Op::Symlink { path, target } => {
                write!(f, "symlink {} -> [{} bytes]", show_path(path), target.len())
            }
            Op::Link { from, to } => write!(f, "link {} {}", show_path(from), show_path(to)),
            Op::Unlink { path } => write!(f, "unlink {}", show_path(path)),
            Op::Rmdir { path } => write!(f, "rmdir {}", show_path(path)),
            Op::Rename { from, to, flags } => write!(
                f,
                "rename {} {}{}",
                show_path(from),
                show_path(to),
                flags_str(*flags)
            ),
            Op::Write {
                target,
                offset,
                len,
                fill,
            } => write!(
                f,
                "write {target} {offset}..{} (pattern {fill})",
                offset + len
            ),
            Op::WriteText {
                target,
                offset,
                len,
                fill,
            } => write!(
                f,
                "write {target} {offset}..{} (text pattern {fill})",
                offset + len
            ),
            Op::Truncate { target, size } => write!(f, "truncate {target} {size}"),
            Op::PunchHole {
                target,
                offset,
                len,
            } => write!(f, "punch-hole {target} {offset}..{}", offset + len),
            Op::ZeroRange {
                target,
                offset,
                len,
                keep_size,
            } => write!(
                f,
                "zero-range {target} {offset}..{}{}",
                offset + len,
                if *keep_size { " keep-size" } else { "" }
            ),
            Op::CopyRange {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => write!(
                f,
                "copy-range {src} {src_offset}..{} to {dst} at {dst_offset}",
                src_offset + len
            ),
            Op::SetCompressFlag { target, on } => {
                write!(f, "chattr {} {target}", if *on { "-m +c" } else { "-c" })
            }
            Op::Read {
                target,
                offset,
                len,
            } => write!(f, "read {target} {offset}..{}", offset.saturating_add(*len)),
            Op::Chmod { target, perm } => write!(f, "chmod {target} {perm:o}"),
            Op::Chown { target, uid, gid } => write!(f, "chown {target} {uid:?}:{gid:?}"),
            Op::SetXattr {
                target,
                name,
                value_len,
                mode,
                ..
            } => write!(
                f,
                "setxattr {target} {} [{value_len} bytes] {mode:?}",
                crate::model::show_name(name)
            ),
            Op::RemoveXattr { target, name } => {
                write!(f, "removexattr {target} {}", crate::model::show_name(name))
            }
            Op::GetXattr { target, name } => {
                write!(f, "getxattr {target} {}", crate::model::show_name(name))
            }
            Op::ListXattr { target } => write!(f, "listxattr {target}"),
            Op::Stat { target } => write!(f, "stat {target}"),
            Op::Readdir { path } => write!(f, "readdir {}", show_path(path)),
            Op::Readlink { path } => write!(f, "readlink {}", show_path(path)),
            Op::Open { path, slot } => write!(f, "open {} as fd{slot}", show_path(path)),
            Op::Close { slot } => write!(f, "close fd{slot}"),
            Op::Fsync {
                target,
                datasync: false,
            } => write!(f, "fsync {target}"),
            Op::Fsync {
                target,
                datasync: true,
            } => write!(f, "fdatasync {target}"),
            Op::FsyncDir { target } => write!(f, "fsync-dir {target}"),
            Op::Sync => f.write_str("sync"),
            Op::Remount => f.write_str("remount"),
            Op::CreateSubvolume { path } => write!(f, "subvolume create {}", show_path(path)),
            Op::Snapshot {
                source,
                dest,
                readonly,
            } => write!(
                f,
                "subvolume snapshot{} {} {}",
                if *readonly { " -r" } else { "" },
                show_path(source),
                show_path(dest)
            ),
            Op::DeleteSubvolume { path } => write!(f, "subvolume delete {}", show_path(path)),
            Op::Cleaner => f.write_str("cleaner"),
        }
    }
}

/// Knobs of a workload.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Deepest directory nesting of generated paths.
    pub max_depth: usize,
    /// Handle slots (open files).
    pub handles: usize,
    /// Stop growing files once the model holds this many data bytes.
    pub max_live_bytes: u64,
    /// Largest ordinary write.
    pub max_write: u64,
    /// Farthest offset of a sparse write.
    pub max_sparse_offset: u64,
    /// Relative weight of persistence points (sync, fsync, fsync-dir).
    pub persist_weight: u32,
    /// Relative weight of remounts (0 in crash workloads).
    pub remount_weight: u32,
    /// Relative weight of read-only ops (stat, read, readdir, ...).
    pub read_weight: u32,
    /// Relative weight of shapes: short op sequences in which crashes lose
    /// durable data (names reused after renames, swaps through a third
    /// name, links over new directories, deep new subtrees), each ending
    /// with a persistence point. 0 keeps the op stream of a seed as it was
    /// before shapes existed (the model tests' seeds).
    pub shape_weight: u32,
    /// Relative weight of subvolume ops (create, snapshot rw and ro of the
    /// top level or of a subvolume, delete, a cleaner transaction). 0
    /// keeps the op stream of a seed as it was before they existed.
    pub subvolume_weight: u32,
    /// Among subvolume ops, the weight (against 20 for the others) of a
    /// rename of a subvolume link: to a new name, over an existing name,
    /// into another subvolume, or RENAME_EXCHANGE with another link or
    /// any entry. 0 keeps the op stream of a seed as it was before they
    /// existed.
    pub subvolume_rename_weight: u32,
    /// Of 100 generated renames, how many also carry RENAME_WHITEOUT
    /// (overlayfs's; docs/FUSE.md "Whiteouts and overlayfs"). 0 draws no
    /// number for it, keeping the op stream of a seed as it was before.
    pub whiteout_rename_percent: u32,
    /// Relative weight of the compression ops (docs/COMPRESSION.md, "The
    /// explorer"): compressible text writes (large from the start,
    /// overwrites inside a file, appends), punched holes, truncates and
    /// `copy_file_range` reflinks into them, `chattr +c`/`-c`, often
    /// followed by an fsync of the file. 0 keeps the op stream of a seed
    /// as it was before they existed.
    pub compression_weight: u32,
    /// Use setuid and sticky bits in modes.
    pub special_perms: bool,
    /// Allow truncates past the largest file size (EFBIG).
    pub huge_truncates: bool,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            max_depth: 3,
            handles: 3,
            max_live_bytes: 24 << 20,
            max_write: 300 << 10,
            max_sparse_offset: 8 << 20,
            persist_weight: 4,
            remount_weight: 1,
            read_weight: 10,
            shape_weight: 0,
            subvolume_weight: 0,
            subvolume_rename_weight: 0,
            whiteout_rename_percent: 0,
            compression_weight: 0,
            special_perms: true,
            huge_truncates: true,
        }
    }
}

impl WorkloadConfig {
    /// Small, write-heavy workloads for crash exploration: every window of
    /// every commit is enumerated, so commits are kept small.
    pub fn crash() -> Self {
        WorkloadConfig {
            max_depth: 2,
            handles: 2,
            max_live_bytes: 2 << 20,
            max_write: 64 << 10,
            max_sparse_offset: 1 << 20,
            persist_weight: 12,
            remount_weight: 0,
            read_weight: 2,
            shape_weight: 4,
            subvolume_weight: 4,
            subvolume_rename_weight: 0,
            whiteout_rename_percent: 0,
            compression_weight: 6,
            special_perms: true,
            huge_truncates: true,
        }
    }
}

/// Short names, two valid 255-byte names, and one 256-byte name (too long).
pub fn name_pool() -> Vec<Vec<u8>> {
    let mut pool: Vec<Vec<u8>> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    pool.push(vec![b'L'; 255]);
    let mut l2 = vec![b'm'; 254];
    l2.push(b'2');
    pool.push(l2);
    pool.push(vec![b'T'; 256]);
    pool
}

const XATTR_NAMES: [&str; 4] = [
    "user.a",
    "user.b",
    "user.checksum",
    "user.long-attribute-name-0123456789-0123456789-0123456789",
];

/// A seeded generator of ops. Deterministic: the same seed and the same
/// model states give the same ops.
pub struct Generator {
    rng: ChaCha8Rng,
    pub cfg: WorkloadConfig,
    pool: Vec<Vec<u8>>,
    /// The rest of a shape being emitted.
    pending: std::collections::VecDeque<Op>,
}

impl Generator {
    pub fn new(seed: u64, cfg: WorkloadConfig) -> Generator {
        Generator {
            rng: ChaCha8Rng::seed_from_u64(seed),
            cfg,
            pool: name_pool(),
            pending: Default::default(),
        }
    }

    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    fn name(&mut self) -> Vec<u8> {
        // Short names most of the time; long ones now and then.
        let i = if self.rng.gen_ratio(9, 10) {
            self.rng.gen_range(0..5)
        } else {
            self.rng.gen_range(5..self.pool.len())
        };
        self.pool[i].clone()
    }

    /// A path made of pool names, 1..=max_depth+1 components.
    fn random_path(&mut self) -> Path {
        let depth = self.rng.gen_range(0..=self.cfg.max_depth);
        (0..=depth).map(|_| self.name()).collect()
    }

    fn existing(&mut self, model: &Model, want: impl Fn(Kind) -> bool) -> Option<Path> {
        let candidates: Vec<Path> = model
            .paths()
            .into_iter()
            .filter(|(p, _, k)| !p.is_empty() && want(*k))
            .map(|(p, _, _)| p)
            .collect();
        if candidates.is_empty() {
            None
        } else {
            Some(candidates[self.rng.gen_range(0..candidates.len())].clone())
        }
    }

    /// A path for a new name: in an existing directory most of the time.
    fn new_path(&mut self, model: &Model) -> Path {
        if self.rng.gen_ratio(1, 8) {
            return self.random_path();
        }
        let dirs: Vec<Path> = model
            .paths()
            .into_iter()
            .filter(|(p, _, k)| *k == Kind::Dir && p.len() <= self.cfg.max_depth)
            .map(|(p, _, _)| p)
            .collect();
        let mut p = dirs[self.rng.gen_range(0..dirs.len())].clone();
        p.push(self.name());
        p
    }

    /// A path to something that exists (mostly of the wanted kind).
    fn old_path(&mut self, model: &Model, want: impl Fn(Kind) -> bool) -> Path {
        if self.rng.gen_ratio(1, 10) {
            return self.random_path();
        }
        if self.rng.gen_ratio(4, 5) {
            if let Some(p) = self.existing(model, want) {
                return p;
            }
        }
        self.existing(model, |_| true)
            .unwrap_or_else(|| self.random_path())
    }

    fn target(&mut self, model: &Model, want: impl Fn(Kind) -> bool) -> Target {
        if self.rng.gen_ratio(1, 6) {
            Target::Handle(self.rng.gen_range(0..self.cfg.handles))
        } else {
            Target::Path(self.old_path(model, want))
        }
    }

    fn size_near_boundary(&mut self) -> u64 {
        const B: [u64; 14] = [
            0,
            1,
            100,
            2047,
            2048,
            2049,
            4095,
            4096,
            4097,
            8191,
            8192,
            12289,
            65536 + 3,
            131072,
        ];
        match self.rng.gen_range(0..4) {
            0 | 1 => B[self.rng.gen_range(0..B.len())],
            2 => self.rng.gen_range(0..3 * 4096),
            _ => self.rng.gen_range(0..=self.cfg.max_write),
        }
    }

    fn write_op(&mut self, model: &Model) -> Op {
        let target = self.target(model, |k| k == Kind::File);
        let full = model.allocated_bytes() >= self.cfg.max_live_bytes;
        let (offset, len) = match self.rng.gen_range(0..10) {
            // Tiny write somewhere in the first pages (inline territory).
            0 | 1 => (self.rng.gen_range(0..3000), self.rng.gen_range(1..200)),
            // Straddling a page boundary.
            2 | 3 => {
                let page = self.rng.gen_range(0..8u64) + 1;
                let before = self.rng.gen_range(1..600);
                (page * 4096 - before, before + self.rng.gen_range(1..5000))
            }
            // Around the inline limit: grow past it, or stay just below.
            4 => (0, [2040, 2048, 2049, 2100, 4096][self.rng.gen_range(0..5)]),
            // Appending-ish, medium.
            5 | 6 => (
                self.rng.gen_range(0..64 * 1024),
                self.rng.gen_range(1..16 * 1024),
            ),
            // Sparse, far.
            7 => (
                self.rng.gen_range(0..=self.cfg.max_sparse_offset),
                self.rng.gen_range(1..9000),
            ),
            // Large.
            _ => (
                self.rng.gen_range(0..128 * 1024),
                self.rng.gen_range(1..=self.cfg.max_write),
            ),
        };
        let len = if full { len.min(512) } else { len };
        Op::Write {
            target,
            offset,
            len,
            fill: self.rng.gen(),
        }
    }

    /// The next op, chosen with `model` as it is now.
    pub fn next_op(&mut self, model: &Model) -> Op {
        if let Some(op) = self.pending.pop_front() {
            return op;
        }
        let c = &self.cfg;
        let weights: [(u32, u8); 29] = [
            (10, 0),                            // create
            (6, 1),                             // mkdir
            (1, 2),                             // mkfifo
            (2, 3),                             // symlink
            (4, 4),                             // link
            (5, 5),                             // unlink
            (4, 6),                             // rmdir
            (9, 7),                             // rename
            (16, 8),                            // write
            (6, 9),                             // truncate
            (c.read_weight / 2, 10),            // read
            (2, 11),                            // chmod
            (1, 12),                            // chown
            (5, 13),                            // setxattr
            (2, 14),                            // removexattr
            (c.read_weight / 4, 15),            // getxattr
            (c.read_weight / 5, 16),            // listxattr
            (c.read_weight / 3, 17),            // stat
            (c.read_weight / 4, 18),            // readdir
            (c.read_weight / 10, 19),           // readlink
            (3, 20),                            // open
            (2, 21),                            // close
            (c.persist_weight.div_ceil(2), 22), // fsync
            (c.persist_weight.div_ceil(4), 23), // fsync dir
            (c.persist_weight.div_ceil(4), 24), // sync
            (c.remount_weight, 25),             // remount
            (c.shape_weight, 26),               // a shape
            (c.subvolume_weight, 27),           // a subvolume op
            (c.compression_weight, 28),         // a compression op
        ];
        let total: u32 = weights.iter().map(|w| w.0).sum();
        let mut pick = self.rng.gen_range(0..total);
        let mut which = 0;
        for (w, id) in weights {
            if pick < w {
                which = id;
                break;
            }
            pick -= w;
        }
        let perms: &[u32] = if self.cfg.special_perms {
            &[0o644, 0o600, 0o755, 0o4755, 0o1777]
        } else {
            &[0o644, 0o600, 0o755]
        };
        let perm = perms[self.rng.gen_range(0..perms.len())];
        match which {
            0 => Op::Create {
                path: self.new_path(model),
                perm,
            },
            1 => Op::Mkdir {
                path: self.new_path(model),
                perm: perm | 0o700,
            },
            2 => Op::Mkfifo {
                path: self.new_path(model),
            },
            3 => {
                let len = [1, 5, 60, 255, 1000, 4095][self.rng.gen_range(0..6)];
                let target = (0..len)
                    .map(|i| b'a' + ((i * 7 + len) % 26) as u8)
                    .collect();
                Op::Symlink {
                    path: self.new_path(model),
                    target,
                }
            }
            4 => Op::Link {
                from: self.old_path(model, |k| k != Kind::Dir),
                to: self.new_path(model),
            },
            5 => Op::Unlink {
                path: self.old_path(model, |k| k != Kind::Dir),
            },
            6 => Op::Rmdir {
                path: self.old_path(model, |k| k == Kind::Dir),
            },
            7 => {
                let flags = match self.rng.gen_range(0..10) {
                    0 | 1 => RenameFlags {
                        no_replace: true,
                        exchange: false,
                        whiteout: false,
                    },
                    2 | 3 => RenameFlags {
                        no_replace: false,
                        exchange: true,
                        whiteout: false,
                    },
                    _ => RenameFlags::default(),
                };
                let from = self.old_path(model, |_| true);
                let to = if self.rng.gen_ratio(1, 2) {
                    self.old_path(model, |_| true)
                } else {
                    self.new_path(model)
                };
                let percent = self.cfg.whiteout_rename_percent;
                // With exchange too now and then: EINVAL, as the kernel.
                let whiteout = percent > 0 && self.rng.gen_range(0..100) < percent;
                let flags = RenameFlags { whiteout, ..flags };
                Op::Rename { from, to, flags }
            }
            8 => self.write_op(model),
            9 => {
                let target = self.target(model, |k| k == Kind::File);
                let size = if self.cfg.huge_truncates && self.rng.gen_ratio(1, 40) {
                    (i64::MAX as u64) + 1
                } else {
                    self.size_near_boundary()
                };
                let size = if model.allocated_bytes() >= self.cfg.max_live_bytes {
                    size.min(4096)
                } else {
                    size
                };
                Op::Truncate { target, size }
            }
            10 => {
                let target = self.target(model, |k| k == Kind::File);
                let offset = self.size_near_boundary();
                Op::Read {
                    target,
                    offset,
                    len: self.rng.gen_range(0..20000),
                }
            }
            11 => Op::Chmod {
                target: self.target(model, |_| true),
                perm,
            },
            12 => {
                let uid = self
                    .rng
                    .gen_ratio(2, 3)
                    .then(|| self.rng.gen_range(0..3) * 1000);
                let gid = self
                    .rng
                    .gen_ratio(2, 3)
                    .then(|| self.rng.gen_range(0..3) * 1000);
                Op::Chown {
                    target: self.target(model, |_| true),
                    uid,
                    gid,
                }
            }
            13 => {
                let mode = [
                    XattrMode::Any,
                    XattrMode::Any,
                    XattrMode::Create,
                    XattrMode::Replace,
                ][self.rng.gen_range(0..4)];
                let value_len = [0, 1, 17, 200, 1000][self.rng.gen_range(0..5)];
                Op::SetXattr {
                    target: self.xattr_target(model),
                    name: self.xattr_name(),
                    value_len,
                    fill: self.rng.gen(),
                    mode,
                }
            }
            14 => Op::RemoveXattr {
                target: self.xattr_target(model),
                name: self.xattr_name(),
            },
            15 => Op::GetXattr {
                target: self.xattr_target(model),
                name: self.xattr_name(),
            },
            16 => Op::ListXattr {
                target: self.xattr_target(model),
            },
            17 => Op::Stat {
                target: self.target(model, |_| true),
            },
            18 => Op::Readdir {
                path: if self.rng.gen_ratio(1, 4) {
                    Vec::new()
                } else {
                    self.old_path(model, |k| k == Kind::Dir)
                },
            },
            19 => Op::Readlink {
                path: self.old_path(model, |k| k == Kind::Symlink),
            },
            20 => Op::Open {
                path: self.old_path(model, |k| k == Kind::File),
                slot: self.rng.gen_range(0..self.cfg.handles),
            },
            21 => Op::Close {
                slot: self.rng.gen_range(0..self.cfg.handles),
            },
            22 => Op::Fsync {
                target: self.target(model, |k| k == Kind::File),
                datasync: self.rng.gen_ratio(1, 3),
            },
            23 => {
                let target = if self.rng.gen_ratio(1, 3) {
                    Target::Path(Vec::new())
                } else {
                    Target::Path(self.old_path(model, |k| k == Kind::Dir))
                };
                Op::FsyncDir { target }
            }
            24 => Op::Sync,
            25 => Op::Remount,
            27 => self.subvolume_op(model),
            28 => {
                self.pending = self.compression_ops(model).into();
                self.pending
                    .pop_front()
                    .expect("compression ops are not empty")
            }
            _ => {
                self.pending = self.shape(model).into();
                self.pending.pop_front().expect("a shape has ops")
            }
        }
    }

    /// A subvolume op: mostly a create or a snapshot (read-only one time
    /// in three) of a live subvolume into any directory, sometimes a
    /// delete (of a subvolume's link mostly, else of a directory: EINVAL)
    /// or a cleaner transaction, and with `subvolume_rename_weight` a
    /// rename of a link. File ops reach into subvolumes and snapshots
    /// through the model's paths, which cross their links.
    fn subvolume_op(&mut self, model: &Model) -> Op {
        let subvolumes = model.subvolume_paths();
        let links: Vec<&Path> = subvolumes.iter().filter(|p| !p.is_empty()).collect();
        match self.rng.gen_range(0..20 + self.cfg.subvolume_rename_weight) {
            20.. if !links.is_empty() => {
                let from = links[self.rng.gen_range(0..links.len())].clone();
                // An exchange with any entry, another link most often (in
                // its own or another subvolume), or a move anywhere,
                // into other subvolumes too.
                let exchange = self.rng.gen_ratio(1, 4);
                let to = if exchange && self.rng.gen_ratio(1, 2) {
                    links[self.rng.gen_range(0..links.len())].clone()
                } else if exchange || self.rng.gen_ratio(1, 4) {
                    self.old_path(model, |k| exchange || k == Kind::Dir)
                } else {
                    self.new_path(model)
                };
                let flags = RenameFlags {
                    no_replace: !exchange && self.rng.gen_ratio(1, 8),
                    exchange,
                    ..RenameFlags::default()
                };
                Op::Rename { from, to, flags }
            }
            0..=6 => Op::CreateSubvolume {
                path: self.new_path(model),
            },
            7..=14 => Op::Snapshot {
                source: subvolumes[self.rng.gen_range(0..subvolumes.len())].clone(),
                dest: self.new_path(model),
                readonly: self.rng.gen_ratio(1, 3),
            },
            15..=17 => Op::DeleteSubvolume {
                path: match links.len() {
                    0 => self.existing_dir(model),
                    n if self.rng.gen_ratio(5, 6) => links[self.rng.gen_range(0..n)].clone(),
                    _ => self.existing_dir(model),
                },
            },
            _ => Op::Cleaner,
        }
    }

    /// Compression ops (`compression_weight`): on a compressing mount, or
    /// on a file made `+c` here, text writes become compressed extents;
    /// the punches, truncates, overwrites and reflinks that follow cut
    /// and share them, and an fsync of the file now and then logs them.
    /// Random-pattern writes (the ordinary ones) meet the heuristic that
    /// stops compressing a file whose data does not shrink.
    fn compression_ops(&mut self, model: &Model) -> Vec<Op> {
        let target = self.target(model, |k| k == Kind::File);
        let size = match &target {
            Target::Path(p) => model.resolve(p).ok().and_then(|i| model.getattr(i).size),
            Target::Handle(_) => None,
        }
        .unwrap_or(0);
        let pick = self.rng.gen_range(0..14);
        let mut ops = match pick {
            // The file made a small text file: on its writeback it goes
            // inline, compressed when the text shrinks into the inline
            // limit (docs/COMPRESSION.md, "Compressed inline extents").
            12 | 13 => vec![
                Op::Truncate {
                    target: target.clone(),
                    size: 0,
                },
                Op::WriteText {
                    target: target.clone(),
                    offset: 0,
                    len: self.rng.gen_range(1..=4096),
                    fill: self.rng.gen(),
                },
            ],
            _ => vec![self.compression_op(model, &target, size, pick)],
        };
        if self.rng.gen_ratio(1, 3) {
            ops.push(Op::Fsync {
                target,
                datasync: self.rng.gen_ratio(1, 3),
            });
        }
        ops
    }

    /// One of [`Self::compression_ops`]'s single ops (`pick` in `0..12`)
    /// on `target` (of `size` bytes).
    fn compression_op(&mut self, model: &Model, target: &Target, size: u64, pick: u32) -> Op {
        let full = model.allocated_bytes() >= self.cfg.max_live_bytes;
        let within = |rng: &mut ChaCha8Rng| rng.gen_range(0..=size.max(1));
        match pick {
            // A large text write from the start (compressed chunks of
            // 128 KiB and a shorter tail), an overwrite inside the file,
            // an append.
            0..=2 => Op::WriteText {
                target: target.clone(),
                offset: 0,
                len: if full {
                    512
                } else {
                    self.rng.gen_range(8192..=200 << 10)
                },
                fill: self.rng.gen(),
            },
            3 | 4 => Op::WriteText {
                target: target.clone(),
                offset: within(&mut self.rng),
                len: self.rng.gen_range(1..=if full { 512 } else { 40 << 10 }),
                fill: self.rng.gen(),
            },
            5 => Op::WriteText {
                target: target.clone(),
                offset: size,
                len: self.rng.gen_range(1..=if full { 512 } else { 64 << 10 }),
                fill: self.rng.gen(),
            },
            // A hole punched into (or across the edge of) the data, or
            // the range zeroed (allocated), growing the file past its end
            // unless it keeps the size.
            6 => Op::PunchHole {
                target: target.clone(),
                offset: within(&mut self.rng),
                len: self.rng.gen_range(1..=64 << 10),
            },
            7 => Op::ZeroRange {
                target: target.clone(),
                offset: within(&mut self.rng),
                len: self.rng.gen_range(1..=if full { 4096 } else { 64 << 10 }),
                keep_size: self.rng.gen(),
            },
            // A truncate into the middle of a compressed extent.
            8 => Op::Truncate {
                target: target.clone(),
                size: within(&mut self.rng),
            },
            // A reflink from this file into another (or itself), mostly
            // at the same place within a page (shared extents), else
            // copied bytes.
            9 | 10 => {
                let dst = self.target(model, |k| k == Kind::File);
                let src_offset = within(&mut self.rng);
                let dst_offset = if self.rng.gen_ratio(3, 4) {
                    self.rng.gen_range(0..64u64) * 4096 + src_offset % 4096
                } else {
                    self.rng.gen_range(0..256 << 10)
                };
                Op::CopyRange {
                    src: target.clone(),
                    src_offset,
                    dst,
                    dst_offset,
                    len: self.rng.gen_range(1..=if full { 4096 } else { 160 << 10 }),
                }
            }
            // chattr +c on a file or a directory (new files inherit it),
            // now and then -c.
            _ => Op::SetCompressFlag {
                target: if self.rng.gen_ratio(1, 3) {
                    Target::Path(self.existing_dir(model))
                } else {
                    target.clone()
                },
                on: self.rng.gen_ratio(4, 5),
            },
        }
    }

    /// A name in directory `dir` that is free there (a short pool name),
    /// or a taken one when all are (the op then fails alike on both sides).
    fn free_name(&mut self, model: &Model, dir: &[Vec<u8>]) -> Path {
        let taken = |n: &[u8]| {
            let mut p = dir.to_vec();
            p.push(n.to_vec());
            model.resolve(&p).is_ok()
        };
        let free: Vec<Vec<u8>> = self.pool[..5]
            .iter()
            .filter(|n| !taken(n))
            .cloned()
            .collect();
        let mut p = dir.to_vec();
        p.push(if free.is_empty() {
            self.pool[self.rng.gen_range(0..5)].clone()
        } else {
            free[self.rng.gen_range(0..free.len())].clone()
        });
        p
    }

    fn existing_dir(&mut self, model: &Model) -> Path {
        self.existing(model, |k| k == Kind::Dir).unwrap_or_default()
    }

    /// A persistence point over `files` and `dirs`: fsync or fdatasync of
    /// one of the files, fsync of one of the directories, or sync.
    fn shape_persist(&mut self, files: &[Path], dirs: &[Path]) -> Op {
        let n = files.len() + dirs.len();
        let i = self.rng.gen_range(0..=n);
        if i < files.len() {
            Op::Fsync {
                target: Target::Path(files[i].clone()),
                datasync: self.rng.gen_ratio(1, 4),
            }
        } else if i < n {
            Op::FsyncDir {
                target: Target::Path(dirs[i - files.len()].clone()),
            }
        } else {
            Op::Sync
        }
    }

    /// A shape: a short sequence of ops in which a crash loses what was
    /// durable if the engine gets a reused name, a link or a new subtree
    /// wrong, ending with a persistence point (docs/CRASH-TESTING.md).
    fn shape(&mut self, model: &Model) -> Vec<Op> {
        let parent = |p: &Path| p[..p.len().saturating_sub(1)].to_vec();
        let rename = |from: &Path, to: &Path| Op::Rename {
            from: from.clone(),
            to: to.clone(),
            flags: RenameFlags::default(),
        };
        let create = |p: &Path| Op::Create {
            path: p.clone(),
            perm: 0o644,
        };
        let mkdir = |p: &Path| Op::Mkdir {
            path: p.clone(),
            perm: 0o755,
        };
        let link = |from: &Path, to: &Path| Op::Link {
            from: from.clone(),
            to: to.clone(),
        };
        let file = self.existing(model, |k| k == Kind::File);
        match (self.rng.gen_range(0..13), file) {
            // The fsync cases fstests caught (issue 21, docs/TREE-LOG.md).
            (8..=12, Some(f)) => self.fsync_case_shape(model, f),
            // A file's name reused after a rename (to a new name, or over
            // an existing file), the new file maybe written.
            (0 | 1, Some(f)) => {
                let to = if self.rng.gen_ratio(1, 3) {
                    self.existing(model, |k| k == Kind::File)
                        .unwrap_or_else(|| self.free_name(model, &parent(&f)))
                } else {
                    let dir = if self.rng.gen_ratio(3, 4) {
                        parent(&f)
                    } else {
                        self.existing_dir(model)
                    };
                    self.free_name(model, &dir)
                };
                let mut ops = vec![rename(&f, &to), create(&f)];
                if self.rng.gen_ratio(1, 2) {
                    ops.push(Op::Write {
                        target: Target::Path(f.clone()),
                        offset: 0,
                        len: self.rng.gen_range(1..20000),
                        fill: self.rng.gen(),
                    });
                }
                ops.push(self.shape_persist(&[f.clone(), to.clone()], &[parent(&f), parent(&to)]));
                ops
            }
            // A directory's name reused after a rename.
            (2, _) => {
                let d = self.existing_dir(model);
                if d.is_empty() {
                    return vec![self.shape_persist(&[], &[d])];
                }
                let to = self.free_name(model, &parent(&d));
                let mut ops = vec![rename(&d, &to), mkdir(&d)];
                if self.rng.gen_ratio(1, 2) {
                    let mut f = d.clone();
                    f.push(b"n".to_vec());
                    ops.push(create(&f));
                }
                ops.push(self.shape_persist(&[], &[d.clone(), to, parent(&d)]));
                ops
            }
            // Two names swapped through a third.
            (3, Some(a)) => {
                let b = self
                    .existing(model, |k| k != Kind::Dir)
                    .unwrap_or_else(|| a.clone());
                let t = self.free_name(model, &parent(&a));
                vec![
                    rename(&a, &t),
                    rename(&b, &a),
                    rename(&t, &b),
                    self.shape_persist(&[a.clone(), b.clone()], &[parent(&a), parent(&b)]),
                ]
            }
            // Swapped through new names and a hard link, a name reused.
            (4, Some(f1)) => {
                let f2 = self
                    .existing(model, |k| k == Kind::File)
                    .unwrap_or_else(|| f1.clone());
                let f3 = self.free_name(model, &parent(&f1));
                let f4 = self.free_name(model, &parent(&f2));
                vec![
                    rename(&f1, &f3),
                    rename(&f2, &f4),
                    link(&f3, &f2),
                    create(&f1),
                    self.shape_persist(&[f1.clone(), f3.clone(), f4.clone()], &[parent(&f1)]),
                ]
            }
            // A rename chain over a hard link: f -> q, its second name
            // l -> f, and l reused.
            (5, Some(f)) => {
                let l = self.free_name(model, &parent(&f));
                let q = self.free_name(model, &parent(&f));
                let mut ops = vec![link(&f, &l)];
                if self.rng.gen_ratio(1, 2) {
                    ops.push(Op::Sync);
                }
                ops.extend([rename(&f, &q), rename(&l, &f), create(&l)]);
                ops.push(self.shape_persist(&[l.clone(), q.clone()], &[parent(&f)]));
                ops
            }
            // Hard links over a new and an old directory.
            (6, Some(f)) => {
                let base = self.existing_dir(model);
                let n = self.free_name(model, &base);
                let old = self.existing_dir(model);
                let l1 = self.free_name(model, &n);
                let l2 = self.free_name(model, &old);
                vec![
                    mkdir(&n),
                    link(&f, &l1),
                    link(&f, &l2),
                    self.shape_persist(std::slice::from_ref(&f), &[n.clone(), old, base]),
                ]
            }
            // A deep new subtree with links of an old file and a new file;
            // then an fsync of the directory above it, mostly.
            (_, Some(f)) => {
                let top = self.existing_dir(model);
                let mut ops = vec![link(&f, &self.free_name(model, &top))];
                let mut dir = top.clone();
                for depth in 0..3 {
                    dir.push([b"x", b"y", b"z"][depth].to_vec());
                    ops.push(mkdir(&dir));
                    if self.rng.gen_ratio(1, 2) {
                        let mut l = dir.clone();
                        l.push(b"l".to_vec());
                        ops.push(link(&f, &l));
                    }
                }
                dir.push(b"q".to_vec());
                ops.push(create(&dir));
                if self.rng.gen_ratio(1, 3) {
                    ops.push(Op::SetXattr {
                        target: Target::Path(dir.clone()),
                        name: self.xattr_name(),
                        value_len: 30,
                        fill: self.rng.gen(),
                        mode: XattrMode::Any,
                    });
                }
                ops.push(if self.rng.gen_ratio(3, 4) {
                    Op::FsyncDir {
                        target: Target::Path(top),
                    }
                } else {
                    self.shape_persist(&[f.clone(), dir], &[])
                });
                ops
            }
            // No file yet: an xattr set and removed on a directory.
            (_, None) => {
                let d = self.existing_dir(model);
                let name = self.xattr_name();
                vec![
                    Op::SetXattr {
                        target: Target::Path(d.clone()),
                        name: name.clone(),
                        value_len: 20,
                        fill: self.rng.gen(),
                        mode: XattrMode::Any,
                    },
                    Op::RemoveXattr {
                        target: Target::Path(d.clone()),
                        name,
                    },
                    Op::FsyncDir {
                        target: Target::Path(d),
                    },
                ]
            }
        }
    }

    /// A shape of one of the fsync cases fstests caught in birch (issue
    /// 21), around the existing file `f`:
    /// - an xattr removed and a link made after an fsync of `f`, then an
    ///   fsync of another file (generic/066);
    /// - new links of `f` and of another file in one directory, an fsync
    ///   of `f` (generic/104);
    /// - a committed second name of `f` unlinked, another entry of its
    ///   directory moved out, an fsync of `f` (generic/336);
    /// - a new link of `f`, other entries moved into its directory, an
    ///   fsync of the new link (generic/343);
    /// - `f` opened, unlinked, fsynced through the handle (generic/764).
    fn fsync_case_shape(&mut self, model: &Model, f: Path) -> Vec<Op> {
        let parent = |p: &Path| p[..p.len().saturating_sub(1)].to_vec();
        let link = |from: &Path, to: &Path| Op::Link {
            from: from.clone(),
            to: to.clone(),
        };
        let rename = |from: &Path, to: &Path| Op::Rename {
            from: from.clone(),
            to: to.clone(),
            flags: RenameFlags::default(),
        };
        let fsync = |p: &Path| Op::Fsync {
            target: Target::Path(p.clone()),
            datasync: false,
        };
        let dir = parent(&f);
        match self.rng.gen_range(0..5) {
            0 => {
                let name = self.xattr_name();
                let target = Target::Path(f.clone());
                let l = self.free_name(model, &dir);
                let mut g = self.existing_dir(model);
                g.push(b"g".to_vec());
                vec![
                    Op::SetXattr {
                        target: target.clone(),
                        name: name.clone(),
                        value_len: 1 + self.rng.gen_range(0..40),
                        fill: self.rng.gen(),
                        mode: XattrMode::Any,
                    },
                    Op::Sync,
                    Op::Write {
                        target: target.clone(),
                        offset: 0,
                        len: self.rng.gen_range(1..5000),
                        fill: self.rng.gen(),
                    },
                    fsync(&f),
                    Op::RemoveXattr { target, name },
                    link(&f, &l),
                    Op::Create {
                        path: g.clone(),
                        perm: 0o644,
                    },
                    fsync(&g),
                ]
            }
            1 => {
                let other = self
                    .existing(model, |k| k == Kind::File)
                    .unwrap_or_else(|| f.clone());
                let l1 = self.free_name(model, &dir);
                let mut ops = Vec::new();
                if self.rng.gen_ratio(1, 2) {
                    ops.push(Op::Sync);
                }
                ops.push(link(&f, &l1));
                // Another free name: l1 is not in the model yet.
                let mut l2 = l1.clone();
                l2.last_mut().expect("a name").push(b'2');
                ops.push(link(&other, &l2));
                ops.push(fsync(if self.rng.gen_ratio(1, 2) { &f } else { &l1 }));
                ops
            }
            2 => {
                let b = self.existing_dir(model);
                let c = self.existing_dir(model);
                let l = self.free_name(model, &b);
                let mut m = l.clone();
                m.last_mut().expect("a name").push(b'm');
                let moved = self.free_name(model, &c);
                vec![
                    link(&f, &l),
                    Op::Create {
                        path: m.clone(),
                        perm: 0o644,
                    },
                    Op::Sync,
                    Op::Unlink { path: l },
                    rename(&m, &moved),
                    fsync(&f),
                ]
            }
            3 => {
                let l = self.free_name(model, &dir);
                let mut ops = Vec::new();
                if self.rng.gen_ratio(1, 2) {
                    ops.push(Op::Sync);
                }
                ops.push(link(&f, &l));
                for i in 0..self.rng.gen_range(1..=2u8) {
                    let Some(e) = self.existing(model, |_| true) else {
                        break;
                    };
                    let mut to = self.free_name(model, &dir);
                    to.last_mut().expect("a name").push(b'0' + i);
                    ops.push(rename(&e, &to));
                }
                ops.push(fsync(&l));
                ops
            }
            _ => {
                let slot = self.rng.gen_range(0..self.cfg.handles);
                let mut ops = vec![Op::Open {
                    path: f.clone(),
                    slot,
                }];
                if self.rng.gen_ratio(2, 3) {
                    ops.push(Op::Sync);
                }
                ops.push(Op::Unlink { path: f });
                ops.push(Op::Fsync {
                    target: Target::Handle(slot),
                    datasync: self.rng.gen_ratio(1, 4),
                });
                if self.rng.gen_ratio(1, 2) {
                    ops.push(Op::Close { slot });
                }
                ops
            }
        }
    }

    /// Xattrs go on regular files and directories (the kernel refuses
    /// `user.` xattrs on other kinds before a filesystem sees them).
    fn xattr_target(&mut self, model: &Model) -> Target {
        if self.rng.gen_ratio(1, 6) {
            return Target::Handle(self.rng.gen_range(0..self.cfg.handles));
        }
        match self.existing(model, |k| k == Kind::File || k == Kind::Dir) {
            Some(p) if self.rng.gen_ratio(9, 10) => Target::Path(p),
            _ => Target::Path(Vec::new()),
        }
    }

    fn xattr_name(&mut self) -> Vec<u8> {
        XATTR_NAMES[self.rng.gen_range(0..XATTR_NAMES.len())]
            .as_bytes()
            .to_vec()
    }
}

/// The seed to use: `BIRCH_SEED` when set (replaying one failure), else
/// `default`.
pub fn seed_override() -> Option<u64> {
    std::env::var("BIRCH_SEED").ok().map(|s| {
        let s = s.trim();
        if let Some(hex) = s.strip_prefix("0x") {
            u64::from_str_radix(hex, 16).expect("BIRCH_SEED must be a number")
        } else {
            s.parse().expect("BIRCH_SEED must be a number")
        }
    })
}
