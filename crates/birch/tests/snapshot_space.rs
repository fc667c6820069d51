//! ENOSPC with snapshots (docs/SNAPSHOTS.md (b) "Space", docs/DELALLOC.md
//! "Shared nodes"): after a snapshot, the first change of a shared node in
//! either tree copies it for good (the old node lives on in the other
//! tree), so a nearly full filesystem with snapshots must still answer
//! ENOSPC to the request, never fail inside a commit (EIO, read-only).
//! `BIRCH_SEED=N` replays a seed; every failure names it.

mod common;

use birch::device::BlockDevice;
use birch::format::tree_id;
use birch::fs::{Filesystem, XattrSetMode};
use birch::Error;
use common::{assert_clean, memory_fs, mount};
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;

/// Directories the source holds, so that every tree has several leaves
/// and internal nodes to share.
const DIRS: usize = 6;
/// Free blocks the fill leaves for the snapshots and the changes after
/// them (of 4096 in the image).
const LEFT_FREE_BLOCKS: u64 = 1100;

fn seeds() -> Vec<u64> {
    match std::env::var("BIRCH_SEED") {
        Ok(s) => vec![s.trim().parse().expect("BIRCH_SEED is a u64")],
        Err(_) => vec![0x5ace_0001, 0x5ace_0002, 0x5ace_0003],
    }
}

/// Inline contents: every rewrite changes the leaf that holds them.
fn content(len: usize, byte: u8) -> Vec<u8> {
    (0..len).map(|i| byte.wrapping_add(i as u8)).collect()
}

/// Fails the test unless `r` is Ok or ENOSPC and the filesystem is not
/// failed; returns whether it was Ok.
fn answered<T, D: BlockDevice + 'static>(
    fs: &Filesystem<D>,
    r: birch::error::Result<T>,
    when: &str,
) -> Option<T> {
    if let Some(why) = fs.failure() {
        panic!("{when}: the filesystem failed: {why}");
    }
    match r {
        Ok(v) => Some(v),
        Err(Error::NoSpace) => None,
        Err(e) => panic!("{when}: {e:?} instead of Ok or ENOSPC"),
    }
}

/// One tree's view for the random changes: its root directory, the
/// directories under it and the names each holds.
struct Tree {
    dirs: Vec<(u64, BTreeSet<String>)>,
}

impl Tree {
    fn of<D: BlockDevice + 'static>(
        fs: &Filesystem<D>,
        top: u64,
        names: &[BTreeSet<String>],
    ) -> Tree {
        let dirs = names
            .iter()
            .enumerate()
            .map(|(d, set)| {
                (
                    fs.lookup(top, format!("d{d}").as_bytes()).unwrap().ino,
                    set.clone(),
                )
            })
            .collect();
        Tree { dirs }
    }
}

/// Fills a 16 MiB image with small files until little is left, takes a
/// few snapshots, then rewrites, unlinks, creates and sets
/// xattrs at random in the source and every snapshot (many shared-node
/// copies per transaction) until ENOSPC keeps coming: every call answers
/// Ok or ENOSPC, the filesystem never fails, the image is check-clean
/// after a remount, and deleting the snapshots gives the space back.
#[test]
fn snapshots_near_full_answer_enospc_never_eio() {
    for seed in seeds() {
        run(
            seed,
            &Shape {
                files: usize::MAX,
                snapshots: 3,
                ballast: false,
            },
        );
    }
}

/// The harsher shape: a small tree shared by many snapshots, the rest of
/// the image filled with file data, so that nearly all the room left is
/// what copies of shared nodes take.
#[test]
fn many_snapshots_of_a_small_tree_answer_enospc_never_eio() {
    for seed in seeds() {
        run(
            seed,
            &Shape {
                files: 600,
                snapshots: 10,
                ballast: true,
            },
        );
    }
}

/// What `run` builds before the random changes.
struct Shape {
    /// Most files the fill creates (it also stops when little is left).
    files: usize,
    /// Snapshots taken: of the source, every third of the first snapshot.
    snapshots: usize,
    /// After the snapshots, one file in the source takes the free space.
    ballast: bool,
}

fn run(seed: u64, shape: &Shape) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let dev = memory_fs(16 << 20, 0x5a);
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    let at = |what: &str| format!("BIRCH_SEED={seed} {what}");

    // 1. Fill with small inline files until little is left.
    let mut names: Vec<BTreeSet<String>> = Vec::new();
    for d in 0..DIRS {
        fs.mkdir(root, format!("d{d}").as_bytes(), 0o755, 0, 0)
            .unwrap();
        names.push(BTreeSet::new());
    }
    let dirs: Vec<u64> = (0..DIRS)
        .map(|d| fs.lookup(root, format!("d{d}").as_bytes()).unwrap().ino)
        .collect();
    'fill: for n in 0..shape.files {
        if n % 64 == 0 && fs.statfs().unwrap().blocks_available < LEFT_FREE_BLOCKS {
            break 'fill;
        }
        let d = n % DIRS;
        let name = format!("file-{n:06}");
        let when = at(&format!("fill {n}"));
        let Some(attr) = answered(&fs, fs.create(dirs[d], name.as_bytes(), 0o644, 0, 0), &when)
        else {
            break 'fill;
        };
        names[d].insert(name);
        let data = content(rng.gen_range(100..900), n as u8);
        if answered(&fs, fs.write_file(attr.ino, 0, &data), &when).is_none() {
            break 'fill;
        }
        if n % 64 == 0 && answered(&fs, fs.sync(), &when).is_none() {
            break 'fill;
        }
    }
    answered(&fs, fs.sync(), &at("sync after fill")).expect("sync after fill");

    // 3. Snapshots of the source (one of a snapshot): each shares every
    //    node of the tree it copies.
    let mut trees = vec![Tree::of(&fs, root, &names)];
    let mut snapshots = Vec::new();
    for s in 0..shape.snapshots {
        let name = format!("snap{s}");
        let source = match snapshots.first() {
            Some(&first) if s % 3 == 2 => first,
            _ => tree_id::FS,
        };
        let made = fs.create_snapshot(source, root, name.as_bytes(), false);
        let Some(id) = answered(&fs, made, &at(&format!("snapshot {s}"))) else {
            continue;
        };
        snapshots.push(id);
        let top = fs.lookup(root, name.as_bytes()).unwrap().ino;
        trees.push(Tree::of(&fs, top, &names));
    }
    assert!(
        !snapshots.is_empty(),
        "{}: no snapshot fit",
        at("snapshots")
    );
    if shape.ballast {
        let f = fs.create(root, b"ballast", 0o644, 0, 0).unwrap().ino;
        let chunk = content(256 << 10, 7);
        let mut offset = 0;
        while answered(&fs, fs.write_file(f, offset, &chunk), &at("ballast")).is_some() {
            offset += chunk.len() as u64;
        }
        answered(&fs, fs.sync(), &at("sync after ballast")).expect("sync after ballast");
    }
    println!("{}: {:?}", at("before the changes"), fs.space_usage());

    // 4. Random changes in every tree until ENOSPC keeps coming.
    let mut enospc = 0;
    let mut ok = 0;
    for step in 0..6000 {
        if enospc >= 60 {
            break;
        }
        let when = at(&format!("step {step}"));
        let t = rng.gen_range(0..trees.len());
        let d = rng.gen_range(0..DIRS);
        let (dir, set) = &mut trees[t].dirs[d];
        let dir = *dir;
        let existing = (!set.is_empty()).then(|| {
            let i = rng.gen_range(0..set.len());
            set.iter().nth(i).unwrap().clone()
        });
        // With ballast, mostly unlinks: they may use the global reserve,
        // so the shared copies they make eat into it.
        let op = if shape.ballast && rng.gen_bool(0.6) {
            4
        } else {
            rng.gen_range(0..10)
        };
        let answer = match (op, existing) {
            (0..=3, Some(name)) => {
                let f = fs.lookup(dir, name.as_bytes()).unwrap().ino;
                let data = content(rng.gen_range(100..1500), step as u8);
                answered(&fs, fs.write_file(f, 0, &data).map(|_| ()), &when)
            }
            (4..=5, Some(name)) => {
                let r = answered(&fs, fs.unlink(dir, name.as_bytes()), &when);
                if r.is_some() {
                    set.remove(&name);
                }
                r
            }
            (6, Some(name)) => {
                let f = fs.lookup(dir, name.as_bytes()).unwrap().ino;
                let value = content(rng.gen_range(10..200), step as u8);
                answered(
                    &fs,
                    fs.setxattr(f, b"user.x", &value, XattrSetMode::CreateOrReplace),
                    &when,
                )
            }
            _ => {
                let name = format!("new-{step:06}");
                let r = answered(&fs, fs.create(dir, name.as_bytes(), 0o644, 0, 0), &when);
                r.map(|attr| {
                    set.insert(name);
                    let data = content(rng.gen_range(50..600), step as u8);
                    answered(&fs, fs.write_file(attr.ino, 0, &data).map(|_| ()), &when);
                })
            }
        };
        match answer {
            Some(()) => ok += 1,
            None => enospc += 1,
        }
    }
    println!("{}: {ok} changes, {enospc} ENOSPC", at("random changes"));
    assert!(enospc > 0, "{}: never reached ENOSPC", at("random changes"));
    answered(&fs, fs.sync(), &at("sync after changes")).expect("sync after changes");
    fs.close().unwrap();
    assert_clean(dev.as_ref(), &at("after the changes"));

    // 5. Deleting the snapshots gives their space back.
    let fs = mount(dev.clone());
    let root = fs.root_ino();
    for s in 0..snapshots.len() {
        fs.delete_subvolume(root, format!("snap{s}").as_bytes())
            .unwrap_or_else(|e| panic!("{}: {e:?}", at("delete")));
    }
    while fs.run_cleaner().unwrap() {}
    fs.sync().unwrap();
    fs.sync().unwrap();
    for n in 0..40 {
        let name = format!("after-{n}");
        let f = fs
            .create(root, name.as_bytes(), 0o644, 0, 0)
            .unwrap_or_else(|e| panic!("{}: {e:?}", at("create after delete")))
            .ino;
        fs.write_file(f, 0, &content(800, n as u8))
            .unwrap_or_else(|e| panic!("{}: {e:?}", at("write after delete")));
    }
    fs.close().unwrap();
    assert_clean(dev.as_ref(), &at("after the delete"));
}
