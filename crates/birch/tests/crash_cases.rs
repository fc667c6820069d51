//! The crash cases of docs/TRANSACTIONS.md, docs/ALLOCATION.md and
//! docs/BTREE.md, one test each, named as there. Each runs a workload on a
//! RecordingDevice, builds the device as a power cut would leave it, mounts
//! it, runs `birch check`, and compares what is visible with the states the
//! workload made durable.

mod common;

use birch::device::{CrashPoint, RecordingDevice};
use birch::fs::{Filesystem, RenameFlags};
use common::{crash_points, crash_view, mount, view, Enumeration, View};
use std::sync::Arc;

const IMAGE_BYTES: u64 = 32 << 20;

fn recorder() -> Arc<RecordingDevice> {
    common::recorder(IMAGE_BYTES, 4)
}

fn file(fs: &Filesystem<Arc<RecordingDevice>>, name: &str, data: &[u8]) -> u64 {
    let root = fs.root_ino();
    let ino = match fs.lookup(root, name.as_bytes()) {
        Ok(a) => a.ino,
        Err(_) => fs.create(root, name.as_bytes(), 0o644, 0, 0).unwrap().ino,
    };
    fs.truncate(ino, 0).unwrap();
    fs.write_file(ino, 0, data).unwrap();
    ino
}

#[test]
fn crash_before_superblock_keeps_previous_commit() {
    let rec = recorder();
    let fs = mount(rec.clone());
    file(&fs, "a", b"one");
    fs.sync().unwrap();
    let first = view(&fs);
    let synced = rec.flush_count();
    file(&fs, "b", b"");
    file(&fs, "a", b"two");
    fs.sync().unwrap();
    drop(fs);
    // Flush `synced + 1` ends the node writes; the superblocks follow it.
    let got = crash_view(
        &rec,
        &CrashPoint {
            flushes_completed: synced + 1,
            kept_writes: vec![],
        },
    );
    assert_eq!(got, first);
}

#[test]
fn crash_during_superblock_writes_picks_valid_newest_copy() {
    let rec = recorder();
    let fs = mount(rec.clone());
    file(&fs, "a", b"");
    fs.sync().unwrap();
    let first = view(&fs);
    let synced = rec.flush_count();
    file(&fs, "b", b"");
    fs.sync().unwrap();
    let second = view(&fs);
    drop(fs);
    assert_eq!(
        rec.writes_in_window(synced + 1),
        2,
        "the superblock window holds the two copies"
    );
    for kept in [vec![0], vec![1]] {
        assert_eq!(
            crash_view(
                &rec,
                &CrashPoint {
                    flushes_completed: synced + 1,
                    kept_writes: kept
                }
            ),
            second
        );
    }
    assert_eq!(
        crash_view(
            &rec,
            &CrashPoint {
                flushes_completed: synced + 1,
                kept_writes: vec![]
            }
        ),
        first
    );
}

/// Runs `second` after a sync of `first`'s changes and checks that every
/// crash point during the second sync shows exactly one of the two states.
fn assert_atomic(
    first: impl FnOnce(&Filesystem<Arc<RecordingDevice>>),
    second: impl FnOnce(&Filesystem<Arc<RecordingDevice>>),
    seed: u64,
) -> usize {
    let rec = recorder();
    let fs = mount(rec.clone());
    first(&fs);
    fs.sync().unwrap();
    let before = view(&fs);
    let synced = rec.flush_count();
    second(&fs);
    fs.sync().unwrap();
    let after = view(&fs);
    drop(fs);
    assert_ne!(before, after, "the workload must change something");
    let points = crash_points(&rec, synced, &Enumeration::thorough(seed));
    for point in &points {
        let got = crash_view(&rec, point);
        assert!(
            got == before || got == after,
            "crash point {point:?} shows a state that was never committed (seed {seed})"
        );
    }
    points.len()
}

#[test]
fn crash_at_every_point_of_a_commit_is_atomic() {
    let states = assert_atomic(
        |fs| {
            for i in 0..200 {
                file(fs, &format!("f{i}"), &vec![i as u8; 100 + i * 97]);
            }
        },
        |fs| {
            let root = fs.root_ino();
            for i in 0..200 {
                let name = format!("f{i}");
                match i % 4 {
                    0 | 1 => fs
                        .rename(
                            root,
                            name.as_bytes(),
                            root,
                            format!("r{i}").as_bytes(),
                            RenameFlags::default(),
                        )
                        .unwrap(),
                    2 => fs.unlink(root, name.as_bytes()).unwrap(),
                    _ => drop(file(fs, &name, &vec![0xEE; 5000])),
                }
            }
        },
        1,
    );
    assert!(states > 100, "only {states} crash states");
}

#[test]
fn unsynced_changes_vanish_cleanly() {
    let rec = recorder();
    let fs = mount(rec.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap();
    fs.sync().unwrap();
    let synced = rec.flush_count();
    let x = fs.create(d.ino, b"x", 0o644, 0, 0).unwrap();
    fs.write_file(x.ino, 0, &[1; 10000]).unwrap();
    let got = crash_view(
        &rec,
        &CrashPoint {
            flushes_completed: synced,
            kept_writes: vec![],
        },
    );
    let want: View = [("/d".to_string(), b"<dir>".to_vec())]
        .into_iter()
        .collect();
    assert_eq!(got, want);
    drop(fs);
}

#[test]
fn cow_never_overwrites_durable_nodes() {
    assert_atomic(
        |fs| {
            for i in 0..300 {
                fs.create(
                    fs.root_ino(),
                    format!("file-{i:04}").as_bytes(),
                    0o644,
                    0,
                    0,
                )
                .unwrap();
            }
        },
        |fs| {
            let root = fs.root_ino();
            for i in 0..300 {
                let name = format!("file-{i:04}");
                if i % 2 == 0 {
                    fs.unlink(root, name.as_bytes()).unwrap();
                } else {
                    fs.rename(
                        root,
                        name.as_bytes(),
                        root,
                        format!("renamed-{i:04}").as_bytes(),
                        RenameFlags::default(),
                    )
                    .unwrap();
                }
            }
        },
        2,
    );
}

#[test]
fn freed_blocks_are_not_reused_before_commit() {
    let rec = recorder();
    let fs = mount(rec.clone());
    file(&fs, "f", &vec![1; 65536]);
    fs.sync().unwrap();
    file(&fs, "f", &vec![2; 65536]);
    fs.sync().unwrap();
    let second = view(&fs);
    let synced = rec.flush_count();
    file(&fs, "f", &vec![3; 65536]);
    fs.sync().unwrap();
    let third = view(&fs);
    drop(fs);
    for point in crash_points(&rec, synced, &Enumeration::thorough(3)) {
        let got = crash_view(&rec, &point);
        assert!(
            got == second || got == third,
            "crash point {point:?}: f is neither the second nor the third version"
        );
    }
}

#[test]
fn delete_then_create_reuses_space_only_after_commit() {
    assert_atomic(
        |fs| {
            for i in 0..50 {
                file(fs, &format!("old{i}"), &vec![i as u8; 65536]);
            }
        },
        |fs| {
            for i in 0..50 {
                fs.unlink(fs.root_ino(), format!("old{i}").as_bytes())
                    .unwrap();
            }
            for i in 0..50 {
                file(fs, &format!("new{i}"), &vec![100 + i as u8; 65536]);
            }
        },
        4,
    );
}
