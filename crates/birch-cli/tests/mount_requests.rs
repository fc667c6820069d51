//! The FUSE round trips birch saves (docs/FUSE.md, "Requests per
//! operation"), and the behaviour each saving relies on, over a real mount.
//! The request counts come from `birch stats` and are exact: these tests
//! assert counts, never timings.
//!
//! Run: `cargo test -p birch-cli --test mount_requests` as root.

mod common;

use common::{birch, skip_unless_root, text, Fixture};
use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

/// `birch stats`' FuseRequests: requests received so far, by opcode.
fn requests(fx: &Fixture) -> BTreeMap<String, u64> {
    let out = birch(&["stats", fx.mnt.to_str().unwrap()]);
    assert!(out.status.success(), "birch stats: {}", text(&out.stderr));
    let stats = text(&out.stdout);
    let block = stats
        .split("FuseRequests {")
        .nth(1)
        .and_then(|rest| rest.split('}').next())
        .unwrap_or_else(|| panic!("no FuseRequests in birch stats:\n{stats}"));
    block
        .lines()
        .filter_map(|l| {
            let (name, n) = l.trim().trim_end_matches(',').split_once(": ")?;
            Some((name.to_string(), n.parse().ok()?))
        })
        .collect()
}

/// How many `op` requests arrived between two snapshots.
fn sent(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, op: &str) -> u64 {
    after.get(op).copied().unwrap_or(0) - before.get(op).copied().unwrap_or(0)
}

/// Waits for the mount's own first open (`prime_no_open` in birch-fuse),
/// after which the kernel knows birch has no open.
fn wait_for_primed_open(fx: &Fixture) {
    let start = Instant::now();
    while requests(fx).get("OPEN").copied().unwrap_or(0) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the mount never sent its priming OPEN: {:?}",
            requests(fx)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Files created with O_CREAT are closed with neither RELEASE nor FLUSH
/// (the kernel learned at mount that birch has no open, and at the
/// priming close that it has no flush). What that relies on: nothing
/// happens at close that durability needs; fsync alone makes a file's
/// data durable, and a power cut keeps it.
#[test]
fn created_files_close_without_release_and_fsync_keeps_them() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::mounted("requests-close");
    wait_for_primed_open(&fx);
    let before = requests(&fx);
    for i in 0..20 {
        // A read-only mode: the creator's descriptor is writable all the
        // same (the create is atomic, however the kernel sends it).
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(fx.path(&format!("f{i}")))
            .expect("create");
        f.write_all(format!("data of f{i}").as_bytes())
            .expect("write");
        if i == 7 {
            f.sync_all().expect("fsync");
        }
    }
    let after = requests(&fx);
    assert_eq!(sent(&before, &after, "CREATE"), 20, "{after:?}");
    assert_eq!(sent(&before, &after, "RELEASE"), 0, "{after:?}");
    assert_eq!(sent(&before, &after, "FLUSH"), 0, "{after:?}");
    assert_eq!(sent(&before, &after, "FSYNC"), 1, "{after:?}");

    fx.power_cut();
    fx.mount();
    assert_eq!(
        fs::read(fx.path("f7")).expect("f7 after the cut"),
        b"data of f7"
    );
}

/// A lookup of a missing name is answered with a negative entry the kernel
/// caches (a second stat sends nothing), and every way of creating that
/// name through the mount, from any process, replaces it at once.
#[test]
fn negative_entries_are_cached_and_replaced_by_creates() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("requests-negative");
    fs::write(fx.path("source"), b"s").unwrap();
    fs::create_dir(fx.path("d")).unwrap();
    let names = ["created", "made", "linked", "symlinked", "renamed", "shell"];
    let before = requests(&fx);
    for _ in 0..3 {
        for name in names {
            assert!(fs::metadata(fx.path(name)).is_err(), "{name} exists");
        }
    }
    let after = requests(&fx);
    assert_eq!(
        sent(&before, &after, "LOOKUP"),
        names.len() as u64,
        "one LOOKUP per missing name, then the cached negative entry: {after:?}"
    );

    fs::write(fx.path("created"), b"c").unwrap();
    fs::create_dir(fx.path("made")).unwrap();
    fs::hard_link(fx.path("source"), fx.path("linked")).unwrap();
    std::os::unix::fs::symlink("source", fx.path("symlinked")).unwrap();
    fs::write(fx.path("d/tmp"), b"r").unwrap();
    fs::rename(fx.path("d/tmp"), fx.path("renamed")).unwrap();
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("echo x > {}", fx.path("shell").display()))
        .status()
        .unwrap();
    assert!(status.success());

    assert_eq!(fs::read(fx.path("created")).unwrap(), b"c");
    assert!(fs::metadata(fx.path("made")).unwrap().is_dir());
    assert_eq!(fs::read(fx.path("linked")).unwrap(), b"s");
    assert_eq!(fs::read(fx.path("symlinked")).unwrap(), b"s");
    assert_eq!(fs::read(fx.path("renamed")).unwrap(), b"r");
    assert_eq!(fs::read(fx.path("shell")).unwrap(), b"x\n");
    let mut listed: Vec<String> = fs::read_dir(&fx.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort();
    let mut want: Vec<&str> = names.iter().copied().chain(["d", "source"]).collect();
    want.sort();
    assert_eq!(listed, want);
}
