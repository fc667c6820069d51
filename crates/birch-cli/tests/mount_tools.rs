//! External tools over a real birch mount: pjdfstest, fsx, a multi-process
//! stress run, dbench, a tarball round trip, fio with verify, and SIGKILL
//! of the daemon mid-workload. Each test mounts its own image, always
//! unmounts it, and ends with a clean `birch check` ([`common::Fixture`]).
//!
//! The tools come from scripts/install-test-tools.sh (`./test` runs it).
//! The tests run one at a time (the machine has 2 cores). `BIRCH_LONG=1`
//! makes fsx, stress and the tarball longer. Each test prints one result
//! line (pjdfstest's summary, dbench's throughput, timings) straight to
//! stderr, so it shows in CI logs even when the test passes.
//!
//! Run: `cargo test -p birch-cli --test mount_tools` as root.
//! docs/FUSE-TESTING.md describes each test and the known failures.

mod common;

use common::{
    exclusive, long_mode, run, run_ok, run_with_timeout, skip_unless_root, tail, text, Fixture,
    Scratch,
};
use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Prints past the test harness's output capture, so the line shows in
/// the log of a passing run too.
fn report(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "[mount_tools] {line}");
}

/// A tool installed by scripts/install-test-tools.sh: on PATH, or in
/// ~/.cargo/bin for the cargo-installed ones.
fn tool(name: &str) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
    }
    for d in dirs {
        let p = d.join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!("{name} is not installed: run scripts/install-test-tools.sh (as root)");
}

// ----- pjdfstest -----

/// pjdfstest cases expected to fail on birch, with the reason (listed in
/// docs/FUSE-TESTING.md too). Any other failure fails the test, and so
/// does an expected failure that passes (pjdfstest counts it as failed).
const PJDFSTEST_EXPECTED_FAILURES: &[(&str, &str)] = &[];

#[test]
fn pjdfstest_suite() {
    if skip_unless_root() {
        return;
    }
    let _serial = exclusive();
    let pjdfstest = tool("pjdfstest");
    let start = Instant::now();
    assert!(
        run(Command::new("id").arg("tests")).status.success(),
        "pjdfstest needs a user 'tests': run scripts/install-test-tools.sh"
    );
    let fx = Fixture::mounted("tools-pjdfstest");
    // EXDEV cases need a second filesystem: the scratch dir's (the host's).
    let secondary = fx.scratch.path("secondary");
    fs::create_dir(&secondary).unwrap();
    // The EROFS cases remount with `mount -o remount,ro MNT`. mount(8)
    // hands a fuse.* mount to a helper (mount.fuse3, which would run
    // `birch` to mount again); -i makes it call mount(2) itself, which
    // FUSE supports for ro/rw remounts.
    let bin = fx.scratch.path("bin");
    fs::create_dir(&bin).unwrap();
    fs::write(
        bin.join("mount"),
        "#!/bin/sh\nexec /usr/bin/mount -i \"$@\"\n",
    )
    .unwrap();
    run_ok(Command::new("chmod").arg("+x").arg(bin.join("mount")));
    // Two passes. posix_fallocate::affected_only_create_flags leaks a
    // file descriptor open for writing (pjdfstest 0.2.2 keeps the raw fd
    // of nix's open), after which every remount to read-only fails with
    // EBUSY, on any filesystem (tmpfs too). So the whole suite runs
    // without remounts (EROFS cases skipped), then the EROFS cases alone.
    let passes = [
        ("all but EROFS", false, None),
        ("EROFS cases", true, Some("erofs")),
    ];
    let mut summaries = Vec::new();
    let mut problems = Vec::new();
    for (i, (what, remount, pattern)) in passes.into_iter().enumerate() {
        let config = fx.scratch.path(&format!("pjdfstest-{i}.toml"));
        fs::write(&config, pjdfstest_config(remount)).unwrap();
        let log = fx.scratch.path(&format!("pjdfstest-{i}.log"));
        let mut cmd = Command::new(&pjdfstest);
        cmd.arg("-c")
            .arg(&config)
            .arg("-p")
            .arg(&fx.mnt)
            .arg("-s")
            .arg(&secondary);
        cmd.args(pattern);
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.env("PATH", path)
            .env("NO_COLOR", "1")
            .current_dir(&fx.mnt);
        let status = run_with_timeout(&mut cmd, &log, Duration::from_secs(900));
        let output = fs::read_to_string(&log).unwrap_or_default();
        let summary = output
            .lines()
            .find(|l| l.starts_with("Summary:"))
            .unwrap_or("no summary line")
            .to_string();
        let failures: Vec<&str> = output
            .lines()
            .filter(|l| l.trim_end().ends_with("FAILED"))
            .collect();
        if !status.success() || !failures.is_empty() || !summary.contains(" 0 failed") {
            problems.push(format!(
                "pjdfstest ({what}) failed ({status}): {summary}\n{}\n\nfailing cases:\n{}",
                tail(&log, 200),
                failures.join("\n")
            ));
        }
        summaries.push(format!("{what}: {summary}"));
    }
    report(&format!(
        "pjdfstest: {} ({:.0} s)",
        summaries.join("; "),
        start.elapsed().as_secs_f64()
    ));
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

fn pjdfstest_config(allow_remount: bool) -> String {
    let expected: Vec<String> = PJDFSTEST_EXPECTED_FAILURES
        .iter()
        .map(|(name, _)| format!("{name:?}"))
        .collect();
    format!(
        r#"[features]
posix_fallocate = {{}}
rename_ctime = {{}}
utime_now = {{}}
utimensat = {{}}

[settings]
naptime = 0.01
allow_remount = {allow_remount}
expected_failures = [{}]

[dummy_auth]
entries = [["nobody", "nogroup"], ["tests", "tests"]]
"#,
        expected.join(", ")
    )
}

// ----- fsx -----

/// fsx's configuration: every operation it has, files up to 1 MiB.
fn fsx_config(msync_after_mapwrite: bool) -> String {
    format!(
        r#"flen = 1048576
nomsyncafterwrite = {}
[opsize]
max = 131072
[weights]
close_open = 1
read = 10
write = 10
mapread = 10
mapwrite = 10
invalidate = 1
truncate = 2
fsync = 1
fdatasync = 1
posix_fallocate = 1
punch_hole = 1
sendfile = 1
posix_fadvise = 1
copy_file_range = 1
"#,
        !msync_after_mapwrite
    )
}

#[test]
fn fsx_random_operations_with_fixed_seeds() {
    if skip_unless_root() {
        return;
    }
    let _serial = exclusive();
    let fsx = tool("fsx");
    let start = Instant::now();
    let fx = Fixture::mounted("tools-fsx");
    // Runs at once on separate files: some msync after every mmap write
    // (each msync is an fsync: slower), the others do not.
    // fsx 0.3.2 never unmaps what its mapread maps, so one run must stay
    // below vm.max_map_count (65530) mapreads (about a fifth of its
    // operations, with these weights): at most 250,000 operations a run.
    // Long mode runs more seeds instead.
    let runs: &[(u64, bool, u64)] = if long_mode() {
        &[
            (1, true, 100_000),
            (2, false, 250_000),
            (3, true, 100_000),
            (4, false, 250_000),
        ]
    } else {
        &[(1, true, 15_000), (2, false, 45_000)]
    };
    let mut children = Vec::new();
    for &(seed, msync, ops) in runs {
        let config = fx.scratch.path(&format!("fsx-{seed}.toml"));
        fs::write(&config, fsx_config(msync)).unwrap();
        let artifacts = fx.scratch.path(&format!("fsx-{seed}"));
        fs::create_dir(&artifacts).unwrap();
        let log = fx.scratch.path(&format!("fsx-{seed}.log"));
        let out = File::create(&log).unwrap();
        let child = Command::new(&fsx)
            .arg("-N")
            .arg(ops.to_string())
            .arg("-S")
            .arg(seed.to_string())
            .arg("-f")
            .arg(&config)
            .arg("-P")
            .arg(&artifacts)
            .arg(fx.path(&format!("fsx-{seed}.file")))
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .current_dir(&fx.scratch.dir)
            .spawn()
            .expect("start fsx");
        children.push((seed, ops, log, child));
    }
    let limit = Duration::from_secs(if long_mode() { 7200 } else { 600 });
    let mut failed = Vec::new();
    for (seed, ops, log, mut child) in children {
        match common::wait_timeout(&mut child, limit) {
            Some(status) if status.success() => {}
            Some(status) => failed.push(format!(
                "fsx -S {seed} -N {ops}: {status}\n{}",
                tail(&log, 60)
            )),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                failed.push(format!(
                    "fsx -S {seed} -N {ops}: no end after {limit:?} (deadlock?)\n{}",
                    tail(&log, 30)
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    let total: u64 = runs.iter().map(|r| r.2).sum();
    report(&format!(
        "fsx: {total} operations in {} runs (seeds 1..={}) A-OK ({:.0} s)",
        runs.len(),
        runs.len(),
        start.elapsed().as_secs_f64()
    ));
}

// ----- concurrent stress -----

/// A small deterministic generator (xorshift64*), so a failing run can be
/// replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let seed = self.next();
        (0..len)
            .map(|i| {
                (seed
                    .wrapping_add(i as u64)
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    >> 56) as u8
            })
            .collect()
    }
}

fn digest(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// What one stress worker knows about its own files: names (relative to
/// the mount) -> inode number in the model, and each inode's content.
#[derive(Default)]
struct Model {
    names: BTreeMap<String, u64>,
    data: HashMap<u64, Vec<u8>>,
    next: u64,
}

impl Model {
    fn links(&self, id: u64) -> usize {
        self.names.values().filter(|&&i| i == id).count()
    }
    fn pick(&self, rng: &mut Rng) -> Option<(String, u64)> {
        if self.names.is_empty() {
            return None;
        }
        let i = rng.below(self.names.len() as u64) as usize;
        self.names.iter().nth(i).map(|(n, &id)| (n.clone(), id))
    }
    fn remove_name(&mut self, name: &str) {
        if let Some(id) = self.names.remove(name) {
            if self.links(id) == 0 {
                self.data.remove(&id);
            }
        }
    }
}

/// Errors that races between workers in the shared directory may cause.
fn racy(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::EEXIST | libc::ENOTEMPTY | libc::EISDIR | libc::ENOTDIR)
    )
}

/// Names one stress worker keeps at most (files of up to 300 KB).
const MAX_NAMES: usize = 150;

/// One stress worker process: runs `secs` seconds of random operations on
/// its own files (checked against its model) and on a shared directory
/// that every worker changes at once (only race errors allowed there),
/// then checks its files and writes their digests to `manifest`.
fn stress_worker(id: u64, root: &Path, secs: u64, seed: u64, manifest: &Path) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let own = format!("w{id}");
    fs::create_dir(root.join(&own)).unwrap();
    let shared = root.join("shared");
    let mut m = Model::default();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut ops = 0u64;
    let fail = |what: String| -> ! { panic!("worker {id} (seed {seed}): {what}") };
    while Instant::now() < deadline {
        ops += 1;
        match rng.below(16) {
            // Create a file (sometimes fsynced) in the worker's dir or, as
            // a private name, in the shared dir.
            // (At most MAX_NAMES names: past that, unlink instead, so a
            // long run does not fill the filesystem.)
            0 | 1 if m.names.len() < MAX_NAMES => {
                let dir = if rng.below(4) == 0 {
                    "shared".to_string()
                } else {
                    own.clone()
                };
                let name = format!("{dir}/f{id}-{ops}");
                let len = [0, 100, 3000, 4096, 70_000, 300_000][rng.below(6) as usize];
                let data = rng.bytes(len);
                let mut f = File::create(root.join(&name))
                    .unwrap_or_else(|e| fail(format!("create {name}: {e}")));
                f.write_all(&data)
                    .unwrap_or_else(|e| fail(format!("write {name}: {e}")));
                if rng.below(4) == 0 {
                    f.sync_all()
                        .unwrap_or_else(|e| fail(format!("fsync {name}: {e}")));
                }
                m.next += 1;
                m.names.insert(name, m.next);
                m.data.insert(m.next, data);
            }
            // Overwrite a range, or append.
            2 | 3 => {
                let Some((name, id_)) = m.pick(&mut rng) else {
                    continue;
                };
                let content = m.data.get_mut(&id_).unwrap();
                let at = if rng.below(2) == 0 {
                    content.len()
                } else {
                    rng.below(content.len() as u64 + 1) as usize
                };
                let patch_len = rng.below(20_000) as usize + 1;
                let patch = rng.bytes(patch_len);
                let f = OpenOptions::new()
                    .write(true)
                    .open(root.join(&name))
                    .unwrap_or_else(|e| fail(format!("open {name}: {e}")));
                f.write_all_at(&patch, at as u64)
                    .unwrap_or_else(|e| fail(format!("pwrite {name}: {e}")));
                if content.len() < at + patch.len() {
                    content.resize(at + patch.len(), 0);
                }
                content[at..at + patch.len()].copy_from_slice(&patch);
                if rng.below(8) == 0 {
                    f.sync_data()
                        .unwrap_or_else(|e| fail(format!("fdatasync {name}: {e}")));
                }
            }
            // Truncate.
            4 => {
                let Some((name, id_)) = m.pick(&mut rng) else {
                    continue;
                };
                let content = m.data.get_mut(&id_).unwrap();
                let len = rng.below(content.len() as u64 + 10_000) as usize;
                let f = OpenOptions::new()
                    .write(true)
                    .open(root.join(&name))
                    .unwrap_or_else(|e| fail(format!("open {name}: {e}")));
                f.set_len(len as u64)
                    .unwrap_or_else(|e| fail(format!("truncate {name}: {e}")));
                content.resize(len, 0);
            }
            // Rename one of its names (sometimes over another of its names).
            5 | 6 => {
                let Some((from, _)) = m.pick(&mut rng) else {
                    continue;
                };
                let to = match m.pick(&mut rng) {
                    Some((to, _)) if rng.below(3) == 0 && to != from => to,
                    _ => format!(
                        "{}/r{id}-{ops}",
                        if rng.below(3) == 0 {
                            "shared"
                        } else {
                            own.as_str()
                        }
                    ),
                };
                fs::rename(root.join(&from), root.join(&to))
                    .unwrap_or_else(|e| fail(format!("rename {from} -> {to}: {e}")));
                // POSIX: renaming onto another name of the same inode does nothing.
                if m.names.get(&to) != m.names.get(&from) {
                    let id_ = m.names[&from];
                    m.remove_name(&to);
                    m.names.remove(&from);
                    m.names.insert(to, id_);
                }
            }
            // Hard link.
            7 => {
                let Some((from, id_)) = m.pick(&mut rng) else {
                    continue;
                };
                let to = format!(
                    "{}/h{id}-{ops}",
                    if rng.below(2) == 0 {
                        "shared"
                    } else {
                        own.as_str()
                    }
                );
                fs::hard_link(root.join(&from), root.join(&to))
                    .unwrap_or_else(|e| fail(format!("link {from} -> {to}: {e}")));
                m.names.insert(to.clone(), id_);
                let nlink = fs::metadata(root.join(&to))
                    .unwrap_or_else(|e| fail(format!("stat {to}: {e}")))
                    .nlink();
                if nlink as usize != m.links(id_) {
                    fail(format!("{to}: nlink {nlink}, model {}", m.links(id_)));
                }
            }
            // Unlink.
            0 | 1 | 8 => {
                let Some((name, _)) = m.pick(&mut rng) else {
                    continue;
                };
                fs::remove_file(root.join(&name))
                    .unwrap_or_else(|e| fail(format!("unlink {name}: {e}")));
                m.remove_name(&name);
            }
            // Read back and compare.
            9 | 10 => {
                let Some((name, id_)) = m.pick(&mut rng) else {
                    continue;
                };
                let got = fs::read(root.join(&name))
                    .unwrap_or_else(|e| fail(format!("read {name}: {e}")));
                if got != m.data[&id_] {
                    fail(format!(
                        "{name}: content differs (len {} vs model {})",
                        got.len(),
                        m.data[&id_].len()
                    ));
                }
            }
            // Shared names every worker fights over.
            11 | 12 => {
                let a = shared.join(format!("s{}", rng.below(32)));
                let b = shared.join(format!("s{}", rng.below(32)));
                let d = shared.join(format!("d{}", rng.below(16)));
                let d2 = shared.join(format!("d{}", rng.below(16)));
                let r = match rng.below(7) {
                    0 => File::create(&a).and_then(|mut f| f.write_all(&[id as u8; 5000])),
                    1 => fs::rename(&a, &b),
                    2 => fs::remove_file(&a),
                    3 => fs::create_dir(&d),
                    4 => fs::remove_dir(&d),
                    5 => fs::rename(&d, &d2),
                    _ => File::create(d.join(format!("in{id}"))).map(drop),
                };
                if let Err(e) = r {
                    if !racy(&e) {
                        fail(format!("shared operation: {e}"));
                    }
                }
            }
            // Listings and directory fsyncs.
            13 => {
                for e in
                    fs::read_dir(&shared).unwrap_or_else(|e| fail(format!("readdir shared: {e}")))
                {
                    if let Err(e) = e {
                        fail(format!("readdir entry: {e}"));
                    }
                }
            }
            14 => {
                let dir = if rng.below(2) == 0 {
                    shared.clone()
                } else {
                    root.join(&own)
                };
                File::open(&dir)
                    .and_then(|d| d.sync_all())
                    .unwrap_or_else(|e| fail(format!("fsync dir {}: {e}", dir.display())));
            }
            _ => {
                let Some((name, id_)) = m.pick(&mut rng) else {
                    continue;
                };
                let meta = fs::metadata(root.join(&name))
                    .unwrap_or_else(|e| fail(format!("stat {name}: {e}")));
                if meta.len() != m.data[&id_].len() as u64 {
                    fail(format!(
                        "{name}: size {} vs model {}",
                        meta.len(),
                        m.data[&id_].len()
                    ));
                }
            }
        }
    }
    // Final check, and the manifest the parent compares after a remount.
    let mut out = String::new();
    for (name, id_) in &m.names {
        let got =
            fs::read(root.join(name)).unwrap_or_else(|e| fail(format!("final read {name}: {e}")));
        if got != m.data[id_] {
            fail(format!("{name}: content differs at the end"));
        }
        out += &format!("{name} {} {:016x}\n", got.len(), digest(&got));
    }
    fs::write(manifest, out).unwrap();
    let _ = writeln!(
        std::io::stderr(),
        "worker {id}: {ops} operations, {} names",
        m.names.len()
    );
}

/// Entry point of a stress worker process: the test binary runs itself
/// with BIRCH_STRESS_WORKER set ("id,root,secs,seed,manifest"). Without
/// it this test does nothing.
#[test]
fn stress_worker_entry() {
    let Ok(spec) = std::env::var("BIRCH_STRESS_WORKER") else {
        return;
    };
    let parts: Vec<&str> = spec.splitn(5, ',').collect();
    assert_eq!(parts.len(), 5, "bad BIRCH_STRESS_WORKER: {spec}");
    stress_worker(
        parts[0].parse().unwrap(),
        Path::new(parts[1]),
        parts[2].parse().unwrap(),
        parts[3].parse().unwrap(),
        Path::new(parts[4]),
    );
}

#[test]
fn concurrent_stress_of_many_processes() {
    if skip_unless_root() {
        return;
    }
    let _serial = exclusive();
    let start = Instant::now();
    let mut fx = Fixture::new("tools-stress", "2G");
    // Frequent periodic commits, so commits run under the load too.
    fx.options = vec!["commit=1".into()];
    fx.mount();
    fs::create_dir(fx.path("shared")).unwrap();
    let (workers, secs) = if long_mode() { (16, 300) } else { (8, 25) };
    let seed0: u64 = std::env::var("BIRCH_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_251_121);
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<(u64, PathBuf, PathBuf, Child)> = Vec::new();
    for id in 0..workers {
        let manifest = fx.scratch.path(&format!("manifest-{id}"));
        let log = fx.scratch.path(&format!("worker-{id}.log"));
        let out = File::create(&log).unwrap();
        let child = Command::new(&exe)
            .args([
                "stress_worker_entry",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            // Short logs: the failure message, not a backtrace.
            .env("RUST_BACKTRACE", "0")
            .env(
                "BIRCH_STRESS_WORKER",
                format!(
                    "{id},{},{secs},{},{}",
                    fx.mnt.display(),
                    seed0 + id,
                    manifest.display()
                ),
            )
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("start a stress worker");
        children.push((id, manifest, log, child));
    }
    // Generous: a deadlock shows as a worker that never ends.
    let limit = Duration::from_secs(secs + 180);
    let mut failed = Vec::new();
    for (id, _, log, child) in &mut children {
        match common::wait_timeout(child, limit.saturating_sub(start.elapsed())) {
            Some(status) if status.success() => {}
            Some(status) => failed.push(format!(
                "worker {id} (seed {}): {status}\n{}",
                seed0 + *id,
                tail(log, 30)
            )),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                failed.push(format!(
                    "worker {id}: still running after {limit:?} (deadlock?)\n{}",
                    tail(log, 10)
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    // Each worker's last words: "worker N: OPS operations, NAMES names".
    let ops: u64 = children
        .iter()
        .filter_map(|(_, _, log, _)| {
            let log = fs::read_to_string(log).ok()?;
            // (libtest may have printed "test ... " on the same line first)
            let line = log
                .lines()
                .find_map(|l| l.split_once("worker ").map(|(_, w)| w.to_string()))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum();
    // Everything each worker had at the end is there after a remount.
    fx.unmount();
    fx.assert_clean();
    fx.mount();
    let mut files = 0;
    for (_, manifest, _, _) in &children {
        for line in fs::read_to_string(manifest).unwrap().lines() {
            let mut f = line.split(' ');
            let (name, len, sum) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
            let got =
                fs::read(fx.path(name)).unwrap_or_else(|e| panic!("after remount, {name}: {e}"));
            assert_eq!(
                (got.len().to_string(), format!("{:016x}", digest(&got))),
                (len.to_string(), sum.to_string()),
                "{name} after remount"
            );
            files += 1;
        }
    }
    report(&format!("stress: {workers} processes x {secs} s, {ops} operations, {files} files verified after remount ({:.0} s)", start.elapsed().as_secs_f64()));
}

// ----- dbench -----

fn dbench_loadfile() -> PathBuf {
    let listed = run(Command::new("dpkg").args(["-L", "dbench"]));
    text(&listed.stdout)
        .lines()
        .find(|l| l.ends_with("/client.txt"))
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/usr/share/dbench/client.txt")).filter(|p| p.exists()))
        .expect("dbench's client.txt not found: run scripts/install-test-tools.sh")
}

/// dbench 4.0 treats semaphore id 0 as a failure of `semget` and prints
/// "failed to create barrier semaphore", then runs normally without the
/// barrier. A freshly booted machine hands out id 0 to the first semaphore
/// set, so that line says nothing about the filesystem under test.
fn is_harmless_dbench_line(line: &str) -> bool {
    line.trim() == "failed to create barrier semaphore"
}

#[test]
fn dbench_harmless_semaphore_line_is_not_an_error() {
    assert!(is_harmless_dbench_line(
        "failed to create barrier semaphore"
    ));
    assert!(!is_harmless_dbench_line(
        "[1234] open ./clients/client0 failed for handle 9999 (No such file or directory)"
    ));
    assert!(!is_harmless_dbench_line(
        "ERROR: child 3 failed at line 120"
    ));
}

#[test]
fn dbench_8_clients() {
    if skip_unless_root() {
        return;
    }
    let _serial = exclusive();
    // 20 s already runs each client through the load file several times; the
    // long mode keeps the hour-style minute.
    let seconds = if long_mode() { "60" } else { "20" };
    let dbench = tool("dbench");
    let loadfile = dbench_loadfile();
    let start = Instant::now();
    let fx = Fixture::new("tools-dbench", "4G");
    let mut fx = fx;
    fx.mount();
    let log = fx.scratch.path("dbench.log");
    let status = run_with_timeout(
        Command::new(dbench)
            .arg("-D")
            .arg(&fx.mnt)
            .arg("-c")
            .arg(&loadfile)
            .arg("-t")
            .arg(seconds)
            .arg("8")
            .current_dir(&fx.scratch.dir),
        &log,
        Duration::from_secs(600),
    );
    let output = fs::read_to_string(&log).unwrap_or_default();
    let throughput = output
        .lines()
        .find(|l| l.trim_start().starts_with("Throughput"))
        .map(|l| l.trim().to_string());
    report(&format!(
        "dbench: {} ({:.0} s)",
        throughput.as_deref().unwrap_or("no Throughput line"),
        start.elapsed().as_secs_f64()
    ));
    let errors: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("ERROR") || l.contains("failed") || l.contains("error"))
        .filter(|l| !is_harmless_dbench_line(l))
        .collect();
    assert!(
        status.success(),
        "dbench exited {status}:\n{}",
        tail(&log, 60)
    );
    assert!(
        errors.is_empty(),
        "dbench reported errors:\n{}",
        errors
            .iter()
            .take(40)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let throughput =
        throughput.unwrap_or_else(|| panic!("no Throughput line:\n{}", tail(&log, 40)));
    assert!(throughput.contains("8 clients"), "{throughput}");
    // Every client ran: dbench lists each operation of the loadfile with a count.
    assert!(
        output
            .lines()
            .any(|l| l.trim_start().starts_with("NTCreateX")),
        "no operation table:\n{}",
        tail(&log, 40)
    );
}

// ----- tarball round trip -----

/// A real tree on the host: documentation and kernel headers (in long
/// mode all of /usr/include), plus hard links, a fifo, sub-second mtimes
/// and an xattr, packed as a POSIX tar (which keeps nanoseconds).
fn source_tree(scratch: &Scratch) -> (PathBuf, PathBuf) {
    let src = scratch.path("src");
    fs::create_dir(&src).unwrap();
    let sources: &[&str] = if long_mode() {
        &["/usr/share/doc", "/usr/include"]
    } else {
        &[
            "/usr/share/doc",
            "/usr/include/linux",
            "/usr/include/asm-generic",
        ]
    };
    for s in sources {
        if Path::new(s).exists() {
            let dest = src.join(s.trim_start_matches('/').replace('/', "_"));
            run_ok(Command::new("cp").arg("-a").arg(s).arg(&dest));
        }
    }
    // Hard links: a second name for every 25th regular file.
    let listed = run_ok(Command::new("find").arg(&src).args(["-type", "f"]));
    let files: Vec<String> = text(&listed.stdout).lines().map(str::to_string).collect();
    assert!(
        files.len() > 1000,
        "only {} files under {sources:?}",
        files.len()
    );
    for f in files.iter().step_by(25) {
        fs::hard_link(f, format!("{f}.hardlink")).unwrap();
    }
    let extra = src.join("extra");
    fs::create_dir(&extra).unwrap();
    let fifo = common::cstr(&extra.join("fifo"));
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    fs::write(extra.join("with-xattr"), b"x").unwrap();
    run_ok(
        Command::new("setfattr")
            .args(["-n", "user.birch", "-v", "round-trip"])
            .arg(extra.join("with-xattr")),
    );
    std::os::unix::fs::symlink("../extra/with-xattr", extra.join("symlink")).unwrap();
    fs::write(extra.join("owned"), b"o").unwrap();
    std::os::unix::fs::chown(extra.join("owned"), Some(4321), Some(8765)).unwrap();
    let tarball = scratch.path("tree.tar");
    run_ok(
        Command::new("tar")
            .args([
                "--format=posix",
                "--xattrs",
                "--xattrs-include=user.*",
                "-C",
            ])
            .arg(&src)
            .arg("-cf")
            .arg(&tarball)
            .arg("."),
    );
    (src, tarball)
}

#[test]
fn tarball_round_trip_through_a_remount() {
    if skip_unless_root() {
        return;
    }
    let _serial = exclusive();
    let start = Instant::now();
    let mut fx = Fixture::new("tools-tar", "4G");
    let (src, tarball) = source_tree(&fx.scratch);
    fx.mount();
    let tree = fx.path("tree");
    fs::create_dir(&tree).unwrap();
    let log = fx.scratch.path("tar.log");
    let unpack_start = Instant::now();
    let status = run_with_timeout(
        Command::new("tar")
            .args(["--xattrs", "--xattrs-include=user.*", "-xpf"])
            .arg(&tarball)
            .arg("-C")
            .arg(&tree),
        &log,
        Duration::from_secs(900),
    );
    assert!(status.success(), "tar -x: {status}\n{}", tail(&log, 40));
    let unpacked = unpack_start.elapsed();
    fx.unmount();
    fx.assert_clean();
    fx.mount();
    // tar compares content, size, mode, owner, mtime, link targets and
    // hard links of every member with what is on the mount.
    let out = run(Command::new("tar")
        .args(["--xattrs", "--xattrs-include=user.*", "--compare", "-f"])
        .arg(&tarball)
        .arg("-C")
        .arg(&tree));
    assert!(
        out.status.success(),
        "tar --compare found differences:\n{}{}",
        text(&out.stdout)
            .lines()
            .take(60)
            .collect::<Vec<_>>()
            .join("\n"),
        text(&out.stderr)
    );
    let out = run(Command::new("diff")
        // diff cannot compare fifos (tar --compare and the listing below do).
        .args(["-r", "--no-dereference", "-x", "fifo"])
        .arg(&src)
        .arg(&tree));
    assert!(
        out.status.success(),
        "diff -r:\n{}{}",
        text(&out.stdout)
            .lines()
            .take(60)
            .collect::<Vec<_>>()
            .join("\n"),
        text(&out.stderr)
    );
    // And every inode's metadata, with nanoseconds.
    let (a, b) = (metadata_listing(&src), metadata_listing(&tree));
    assert_eq!(a.len(), b.len(), "entry counts differ");
    let mut differ = Vec::new();
    for (k, v) in &a {
        if b.get(k) != Some(v) {
            differ.push(format!(
                "{k}:\n  host  {v}\n  birch {}",
                b.get(k).map_or("missing", String::as_str)
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "{} entries differ, first ones:\n{}",
        differ.len(),
        differ
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let xattr = run_ok(
        Command::new("getfattr")
            .args(["--only-values", "-n", "user.birch"])
            .arg(tree.join("extra/with-xattr")),
    );
    assert_eq!(text(&xattr.stdout), "round-trip");
    report(&format!(
        "tarball: {} entries unpacked in {:.0} s, compared after remount ({:.0} s in all)",
        a.len(),
        unpacked.as_secs_f64(),
        start.elapsed().as_secs_f64()
    ));
}

/// path -> "type mode uid gid size nlink mtime.nsec [target] [hard link group]".
fn metadata_listing(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut first_name: HashMap<u64, String> = HashMap::new();
    let mut stack = vec![root.to_path_buf()];
    let mut all = Vec::new();
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let m = fs::symlink_metadata(&path).unwrap();
            if m.is_dir() {
                stack.push(path.clone());
            }
            all.push((
                path.strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
                path,
                m,
            ));
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    for (rel, path, m) in all {
        let mut d = format!(
            "mode {:o} uid {} gid {} nlink {} mtime {}.{:09}",
            m.mode(),
            m.uid(),
            m.gid(),
            m.nlink(),
            m.mtime(),
            m.mtime_nsec()
        );
        if !m.is_dir() {
            d += &format!(" size {}", m.size());
        }
        if m.file_type().is_symlink() {
            d += &format!(" -> {}", fs::read_link(&path).unwrap().display());
        }
        if !m.is_dir() && m.nlink() > 1 {
            d += &format!(
                " linked-with {}",
                first_name.entry(m.ino()).or_insert_with(|| rel.clone())
            );
        }
        out.insert(rel, d);
    }
    out
}

// ----- fio -----

const FIO_JOBS: &str = r#"[global]
directory=${DIR}
ioengine=psync
verify=crc32c
verify_fatal=1
do_verify=1
randrepeat=1
fsync_on_close=1

[seq-1m]
rw=write
bs=1M
size=192M

[rand-4k]
rw=randwrite
bs=4k
size=48M

[rand-mixed-sizes]
rw=randwrite
bsrange=512-64k
size=32M

[direct-64k]
rw=randwrite
bs=64k
size=32M
direct=1
"#;

#[test]
fn fio_write_and_verify_before_and_after_remount() {
    if skip_unless_root() {
        return;
    }
    let _serial = exclusive();
    let fio = tool("fio");
    let start = Instant::now();
    let mut fx = Fixture::new("tools-fio", "2G");
    fx.mount();
    let jobs = fx.scratch.path("verify.fio");
    fs::write(&jobs, FIO_JOBS).unwrap();
    let dir = fx.path("fio");
    fs::create_dir(&dir).unwrap();
    // Write every pattern and read it back (in the page cache and through
    // direct I/O) ...
    let log = fx.scratch.path("fio-write.log");
    let status = run_with_timeout(
        // (fio leaves *-verify.state files in its working directory.)
        Command::new(&fio)
            .arg(&jobs)
            .env("DIR", &dir)
            .current_dir(&fx.scratch.dir),
        &log,
        Duration::from_secs(600),
    );
    assert!(
        status.success(),
        "fio (write + verify) failed: {status}\n{}",
        tail(&log, 60)
    );
    check_fio_log(&log);
    // ... then verify it again from the image after a remount.
    fx.unmount();
    fx.assert_clean();
    fx.mount();
    let log2 = fx.scratch.path("fio-verify.log");
    let status = run_with_timeout(
        Command::new(&fio)
            .arg("--verify_only")
            .arg(&jobs)
            .env("DIR", &dir)
            .current_dir(&fx.scratch.dir),
        &log2,
        Duration::from_secs(600),
    );
    assert!(
        status.success(),
        "fio --verify_only after remount failed: {status}\n{}",
        tail(&log2, 60)
    );
    check_fio_log(&log2);
    let bw: Vec<String> = fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.trim_start().starts_with("WRITE:"))
        .map(|l| l.trim().to_string())
        .collect();
    report(&format!(
        "fio: 4 jobs written and verified, verified again after remount; {} ({:.0} s)",
        bw.join(" "),
        start.elapsed().as_secs_f64()
    ));
}

fn check_fio_log(log: &Path) {
    let s = fs::read_to_string(log).unwrap();
    let jobs = s
        .lines()
        .filter(|l| l.contains(": (groupid="))
        .collect::<Vec<_>>();
    assert_eq!(
        jobs.len(),
        4,
        "fio ran {} jobs:\n{}",
        jobs.len(),
        tail(log, 60)
    );
    for j in jobs {
        assert!(
            j.contains("err= 0"),
            "fio job failed: {j}\n{}",
            tail(log, 60)
        );
    }
    assert!(
        !s.contains("verify: bad"),
        "fio found bad data:\n{}",
        tail(log, 60)
    );
}

// ----- SIGKILL mid-workload -----

#[test]
fn sigkill_of_the_daemon_mid_workload_leaves_a_clean_image() {
    if skip_unless_root() {
        return;
    }
    let _serial = exclusive();
    let start = Instant::now();
    let mut fx = Fixture::new("tools-sigkill", "2G");
    // Commit every second so kills land before, during and after commits.
    fx.options = vec!["commit=1".into()];
    let rounds: &[u64] = if long_mode() {
        &[300, 900, 1500, 2500, 4000, 6000]
    } else {
        &[500, 1500, 3000, 6000]
    };
    let mut survivors = 0;
    for (round, &delay_ms) in rounds.iter().enumerate() {
        fx.mount();
        let dest = fx.path(&format!("copy{round}"));
        // Workload 1: copy a tree of real files (many creates and writes).
        let cp = Command::new("cp")
            .arg("-a")
            .arg("/usr/share/doc")
            .arg(&dest)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start cp");
        // Workload 2: files fsynced one after another; every fsync that
        // returned must survive the kill.
        let dir = fx.path(&format!("fsynced{round}"));
        fs::create_dir(&dir).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut done = Vec::new();
                for i in 0u64.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let data =
                        format!("file {i} of round {round}\n").repeat(1 + (i as usize % 200));
                    let ok = File::create(dir.join(format!("f{i}")))
                        .and_then(|mut f| f.write_all(data.as_bytes()).and_then(|()| f.sync_all()));
                    match ok {
                        // The directory entry is part of what fsync of a new file makes durable.
                        Ok(()) => done.push((i, data)),
                        Err(_) => break,
                    }
                }
                done
            })
        };
        std::thread::sleep(Duration::from_millis(delay_ms));
        let mut cp = cp;
        // The workloads end (the dead mount answers ENOTCONN) before the
        // mount is detached, so nothing of theirs lands in the directory
        // under it.
        let durable = fx.kill_daemon_then(|| {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = cp.kill();
            let _ = cp.wait();
            writer.join().unwrap()
        });
        // The image, as the kill left it, is consistent.
        fx.check()
            .unwrap_or_else(|e| panic!("after SIGKILL at {delay_ms} ms (round {round}): {e}"));
        fx.mount();
        for (i, data) in &durable {
            let got = fs::read(dir.join(format!("f{i}"))).unwrap_or_else(|e| {
                panic!("round {round}: f{i} was fsynced before the kill but is gone: {e}")
            });
            assert_eq!(
                got,
                data.as_bytes(),
                "round {round}: f{i} was fsynced but its data changed"
            );
        }
        survivors += durable.len();
        // Whatever else is there reads without error.
        read_everything(&fx.mnt);
        fx.unmount();
        fx.assert_clean();
    }
    report(&format!("sigkill: {} kills mid-workload, image clean each time, {survivors} fsynced files all present ({:.0} s)", rounds.len(), start.elapsed().as_secs_f64()));
}

/// Reads every file and link and lists every directory under `root`,
/// panicking on any error.
fn read_everything(root: &Path) {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("list {}: {e}", dir.display())) {
            let path = e
                .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
                .path();
            let m = fs::symlink_metadata(&path)
                .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
            if m.is_dir() {
                stack.push(path);
            } else if m.is_file() {
                let data =
                    fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                assert_eq!(
                    data.len() as u64,
                    m.len(),
                    "{}: read {} bytes of {}",
                    path.display(),
                    data.len(),
                    m.len()
                );
            } else if m.file_type().is_symlink() {
                fs::read_link(&path).unwrap_or_else(|e| panic!("readlink {}: {e}", path.display()));
            }
        }
    }
}
