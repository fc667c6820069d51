//! The FUSE round trips birch saves (docs/FUSE.md, "Requests per
//! operation"), and the behaviour each saving relies on, over a real mount.
//! The request counts come from `birch stats` and are exact: these tests
//! assert counts, never timings.
//!
//! Also what `birch stats` shows, for people and as JSON.
//!
//! Run: `cargo test -p birch-cli --test mount_requests` as root.

mod common;

use birch_fuse::stats::{Group, COUNTERS};
use common::json::Value;
use common::{birch, skip_unless_root, stats_json, text, Fixture};
use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::process::Command;
use std::time::{Duration, Instant};

/// `birch stats --json`'s fuse_requests: requests received so far, by
/// opcode.
fn requests(fx: &Fixture) -> BTreeMap<String, u64> {
    let stats = stats_json(&fx.mnt);
    let Some(Value::Object(by_opcode)) = stats.get("fuse_requests") else {
        panic!("no fuse_requests in birch stats --json: {stats:?}");
    };
    by_opcode
        .iter()
        .map(|(opcode, n)| {
            let n = n.as_u64().unwrap_or_else(|| panic!("{opcode}: {n:?}"));
            (opcode.clone(), n)
        })
        .filter(|&(_, n)| n > 0)
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

/// Writes through a file created write-only send no GETXATTR: the create
/// is answered with FOPEN_DIRECT_IO, so the kernel's file_remove_privs(),
/// which asks for `security.capability` before a buffered write whenever
/// a reply with attributes (the CREATE's, a SETATTR's) came in since, is
/// not called (docs/FUSE.md "Direct I/O for write-only creates"). The
/// behaviour that relies on is tested in mount_security.rs
/// (a_write_only_create_*); here, what it saves: tar's pattern of create,
/// write, fchmod, write.
#[test]
fn writes_through_a_write_only_create_ask_for_no_capability() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("requests-direct-create");
    let before = requests(&fx);
    for i in 0..20 {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(fx.path(&format!("f{i}")))
            .expect("create");
        f.write_all(&[b'a'; 5000]).unwrap();
        f.set_permissions(fs::Permissions::from_mode(0o600))
            .unwrap();
        f.write_all(&[b'b'; 5000]).unwrap();
    }
    let after = requests(&fx);
    assert_eq!(
        sent(&before, &after, "GETXATTR"),
        0,
        "no GETXATTR for 40 writes: {after:?}"
    );
    assert_eq!(sent(&before, &after, "WRITE"), 40, "{after:?}");
    for i in 0..20 {
        let data = fs::read(fx.path(&format!("f{i}"))).unwrap();
        assert_eq!(data.len(), 10_000);
        assert!(data[..5000].iter().all(|&b| b == b'a') && data[5000..].iter().all(|&b| b == b'b'));
    }
}

/// `birch stats` lays the counters out in their sections, with the mount's
/// facts first and the requests last; `--json` is one JSON object with
/// every counter of the table under its name, the mount's facts and the
/// request counts, and its numbers follow what was done.
#[test]
fn stats_shows_every_section_and_json_every_counter() {
    if skip_unless_root() {
        return;
    }
    let fx = Fixture::mounted("requests-stats");
    let mut f = fs::File::create(fx.path("f")).expect("create");
    f.write_all(b"data").expect("write");
    f.sync_all().expect("fsync");

    let out = birch(&["stats", fx.mnt.to_str().unwrap()]);
    assert!(out.status.success(), "birch stats: {}", text(&out.stderr));
    let human = text(&out.stdout);
    let mut headings = vec!["mount", "FUSE requests:"];
    headings.extend(Group::ALL.map(Group::title));
    for heading in headings {
        assert!(
            human.lines().any(|l| l.starts_with(heading)),
            "no section {heading:?} in birch stats:\n{human}"
        );
    }
    let image = fx.image.canonicalize().expect("image path");
    assert!(
        human.contains(&format!("  image       {} (", image.display())),
        "{human}"
    );
    assert!(
        human
            .lines()
            .any(|l| l.trim_start().starts_with("fsyncs ") && l.ends_with("/s")),
        "fsyncs with a rate: {human}"
    );

    let stats = stats_json(&fx.mnt);
    for counter in COUNTERS {
        assert!(
            matches!(stats.get(counter.name), Some(Value::Number(_))),
            "{} is not a number in birch stats --json: {stats:?}",
            counter.name
        );
    }
    let number = |key: &str| {
        stats
            .get(key)
            .and_then(Value::as_u64)
            .unwrap_or_else(|| panic!("{key}: {stats:?}"))
    };
    assert!(matches!(stats.get("uptime_seconds"), Some(Value::Number(s)) if *s > 0.0));
    assert_eq!(
        stats.get("image"),
        Some(&Value::String(image.display().to_string()))
    );
    assert!(matches!(stats.get("init_flags"), Some(Value::Array(flags)) if !flags.is_empty()));
    assert_eq!(stats.get("read_only"), Some(&Value::Bool(false)));
    assert!(number("fsyncs") >= 1 && number("logged_fsyncs") >= 1);
    assert!(number("space_total") >= 1 << 30);
    let Some(Value::Object(by_opcode)) = stats.get("fuse_requests") else {
        panic!("no fuse_requests: {stats:?}");
    };
    let sent = |op: &str| stats.get("fuse_requests").and_then(|r| r.get(op));
    assert!(
        sent("FSYNC").and_then(Value::as_u64) >= Some(1),
        "{by_opcode:?}"
    );
    assert_eq!(
        number("fuse_requests_total"),
        by_opcode
            .iter()
            .filter_map(|(_, n)| n.as_u64())
            .sum::<u64>()
    );
}

/// docs/MEMORY.md: once no request but `birch stats`' ioctls has arrived
/// for `memory_idle`, the daemon shrinks its node cache to
/// `node_cache_idle` and frees its spare page buffers; `birch stats` shows
/// the daemon's RSS and the cache's sizes. The wait is for an event (the
/// release counted), bounded only to fail rather than hang.
#[test]
fn an_idle_mount_gives_memory_back() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("requests-memory", "1G");
    fx.options = vec![
        "memory_idle=1".into(),
        "node_cache=32M".into(),
        "node_cache_idle=32K".into(),
    ];
    fx.mount();
    let dir = fx.path("d");
    fs::create_dir(&dir).unwrap();
    for i in 0..3000 {
        fs::write(dir.join(format!("f{i}")), [i as u8; 3000]).unwrap();
    }
    let out = birch(&["sync", fx.mnt.to_str().unwrap()]);
    assert!(out.status.success(), "birch sync: {}", text(&out.stderr));
    // Forget the kernel's inodes, so that the lookups below reach birch
    // and read the committed nodes from disk, through the cache.
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let memory = |key: &str| {
        stats_json(&fx.mnt)
            .get(key)
            .and_then(Value::as_u64)
            .unwrap_or_else(|| panic!("no {key} in birch stats --json"))
    };
    let releases = memory("memory_releases");
    for i in 0..3000 {
        assert_eq!(
            fs::read(dir.join(format!("f{i}"))).unwrap(),
            [i as u8; 3000]
        );
    }
    let (nodes, limit, idle) = (
        memory("memory_node_cache_nodes"),
        memory("memory_node_cache_limit"),
        memory("memory_node_cache_idle"),
    );
    assert_eq!((limit, idle), (2048, 2), "32M and 32K in 16 KiB nodes");
    assert!(nodes > idle, "the reads cached only {nodes} nodes");
    assert!(memory("memory_rss") > 0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while memory("memory_releases") == releases {
        assert!(Instant::now() < deadline, "no release after 120 s idle");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(memory("memory_node_cache_nodes") <= idle);
    assert_eq!(memory("memory_spare_pages"), 0);
    let human = text(&birch(&["stats", fx.mnt.to_str().unwrap()]).stdout);
    assert!(
        human
            .lines()
            .any(|l| l.trim_start().starts_with("memory_rss ")),
        "{human}"
    );
}
