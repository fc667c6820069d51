//! Seed 003's directory-logging workload through birch's library API, with
//! no FUSE in between: the bench harness's `embedded` workload, which sets
//! how much of birch's FUSE time is FUSE.
//!
//! In one directory: create `BENCH_FILES` empty files, fsyncing the
//! directory every `BENCH_FSYNC_EVERY` creations; sync (a commit); rename
//! every file in place, fsyncing the directory every `BENCH_FSYNC_EVERY`
//! renames. Phase times and fsync latencies go to `BENCH_OUT` as JSON.
//!
//! `BENCH_IMAGE=IMG BENCH_OUT=OUT.json cargo run --release -p birch --example seed003_embedded`
//! (BENCH_IMAGE: an existing image file or block device, formatted here;
//! defaults: 10,000 files, an fsync every 100).

use birch::{FileDevice, Filesystem, MkfsOptions, MountOptions, RenameFlags};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_number(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a whole number")),
        Err(_) => Ok(default),
    }
}

fn run() -> Result<(), String> {
    let image = PathBuf::from(
        std::env::var_os("BENCH_IMAGE").ok_or("BENCH_IMAGE (the image to format) is not set")?,
    );
    let out = std::env::var_os("BENCH_OUT").map(PathBuf::from);
    let files = env_number("BENCH_FILES", 10_000)?;
    let every = env_number("BENCH_FSYNC_EVERY", 100)?;
    if every == 0 {
        return Err("BENCH_FSYNC_EVERY must be at least 1".into());
    }
    let fail = |what: &str, e: birch::Error| format!("{}: {what}: {e}", image.display());

    // The same device (O_DIRECT) and mount options as `birch mount IMAGE`.
    let dev =
        Arc::new(FileDevice::open(&image, true).map_err(|e| format!("{}: {e}", image.display()))?);
    Filesystem::mkfs(dev.as_ref(), &MkfsOptions::default()).map_err(|e| fail("mkfs", e))?;
    let fs = Filesystem::open(dev, MountOptions::default()).map_err(|e| fail("mount", e))?;
    let dir = fs
        .mkdir(fs.root_ino(), b"testdir", 0o755, 0, 0)
        .map_err(|e| fail("mkdir testdir", e))?
        .ino;
    fs.sync().map_err(|e| fail("sync", e))?;

    let mut create_fsyncs = Vec::new();
    let mut rename_fsyncs = Vec::new();
    let timed_fsync = |samples: &mut Vec<Duration>| -> Result<(), String> {
        let t = Instant::now();
        fs.fsync(dir, false).map_err(|e| fail("fsync testdir", e))?;
        samples.push(t.elapsed());
        Ok(())
    };

    let start = Instant::now();
    for i in 1..=files {
        fs.create(dir, format!("file_{i}").as_bytes(), 0o644, 0, 0)
            .map_err(|e| fail(&format!("create file_{i}"), e))?;
        if i % every == 0 {
            timed_fsync(&mut create_fsyncs)?;
        }
    }
    let created = Instant::now();
    fs.sync().map_err(|e| fail("sync", e))?;
    let synced = Instant::now();
    for i in 1..=files {
        fs.rename(
            dir,
            format!("file_{i}").as_bytes(),
            dir,
            format!("file_{i}.renamed").as_bytes(),
            RenameFlags::default(),
        )
        .map_err(|e| fail(&format!("rename file_{i}"), e))?;
        if i % every == 0 {
            timed_fsync(&mut rename_fsyncs)?;
        }
    }
    let renamed = Instant::now();
    let log = fs.log_stats();
    fs.close().map_err(|e| fail("unmount", e))?;

    let secs = |d: Duration| d.as_secs_f64();
    let all: Vec<f64> = create_fsyncs
        .iter()
        .chain(&rename_fsyncs)
        .map(|d| secs(*d) * 1e3)
        .collect();
    let mean_ms = all.iter().sum::<f64>() / all.len().max(1) as f64;
    let max_ms = all.iter().copied().fold(0.0, f64::max);
    let json = format!(
        "{{\"files\": {files}, \"fsync_every\": {every}, \
         \"create_s\": {:.6}, \"sync_s\": {:.6}, \"rename_s\": {:.6}, \"total_s\": {:.6}, \
         \"create_fsync_s\": {:.6}, \"rename_fsync_s\": {:.6}, \"fsyncs\": {}, \
         \"fsync_mean_ms\": {mean_ms:.4}, \"fsync_max_ms\": {max_ms:.4}, \
         \"log_syncs\": {}, \"fast_logs\": {}, \"full_logs\": {}, \"dir_logs\": {}, \
         \"fallbacks\": {}, \"logging_ms\": {:.3}}}\n",
        secs(created - start),
        secs(synced - created),
        secs(renamed - synced),
        secs(renamed - start),
        create_fsyncs.iter().map(|d| secs(*d)).sum::<f64>(),
        rename_fsyncs.iter().map(|d| secs(*d)).sum::<f64>(),
        all.len(),
        log.log_syncs,
        log.fast_logs,
        log.full_logs,
        log.dir_logs,
        log.fallback_ancestor_chain
            + log.fallback_removed_directory
            + log.fallback_renamed_ancestor
            + log.fallback_subvolume,
        log.logging_nanos as f64 / 1e6,
    );
    print!("{json}");
    if let Some(out) = out {
        std::fs::write(&out, json).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("seed003_embedded: {e}");
            ExitCode::FAILURE
        }
    }
}
