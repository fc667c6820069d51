//! Engine micro-benchmarks on an image file, through the public API only:
//! the create rate (the B-tree's insert path) and the
//! latency of committing a small transaction and of an fsync answered by
//! the log tree, beside the device's own write+flush latency (the floor
//! any commit or log sync pays twice).
//!
//! `cargo run --release -p birch --example engine_bench [IMAGE]`
//! (default IMAGE: ./engine-bench.img, created and removed).

use birch::{BlockDevice, FileDevice, Filesystem, MkfsOptions, MountOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const IMAGE_BYTES: u64 = 1 << 30;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{name:<34} n={:<5} p50={:>9.1}us p99={:>9.1}us max={:>9.1}us",
        samples.len(),
        us(percentile(&samples, 0.5)),
        us(percentile(&samples, 0.99)),
        us(*samples.last().unwrap())
    );
}

/// Creates `count` empty files in one directory of a fresh filesystem on
/// `dev` (each create inserts four items: inode, inode ref, dir item, dir
/// index) and commits every 10,000. Returns creates per second: the
/// B-tree's insert path as the public API reaches it.
fn creates(dev: Arc<FileDevice>, count: u64, random: bool) -> f64 {
    Filesystem::mkfs(dev.as_ref(), &MkfsOptions::default()).unwrap();
    let fs = Filesystem::open(dev, MountOptions::deterministic()).unwrap();
    let dir = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let start = Instant::now();
    for i in 0..count {
        let name = if random {
            // xorshift: a cheap deterministic shuffle of the name space
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        } else {
            i
        };
        fs.create(dir, format!("{name:016x}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        if i % 10_000 == 9_999 {
            fs.commit().unwrap();
        }
    }
    fs.commit().unwrap();
    let rate = count as f64 / start.elapsed().as_secs_f64();
    fs.close().unwrap();
    rate
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("engine-bench.img"));
    let created = !path.exists();
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(IMAGE_BYTES))
        .expect("create image");
    let dev = Arc::new(FileDevice::open(&path, false).expect("open image"));

    for (name, random) in [("sequential", false), ("random", true)] {
        let rate = creates(dev.clone(), 200_000, random);
        println!("creates ({name} names, one directory): {rate:>12.0} /s");
    }

    let mut raw = Vec::new();
    let block = vec![0xA5u8; 4096];
    for i in 0..200u64 {
        let t = Instant::now();
        dev.write_at(&block, (512 << 20) + i * 4096).unwrap();
        dev.flush().unwrap();
        raw.push(t.elapsed());
    }
    report("device 4 KiB write + fdatasync", raw);

    Filesystem::mkfs(dev.as_ref(), &MkfsOptions::default()).unwrap();
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let root = fs.root_ino();
    let mut commits = Vec::new();
    for i in 0..200 {
        let f = fs
            .create(root, format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.write_file(f.ino, 0, &block).unwrap();
        let t = Instant::now();
        fs.commit().unwrap();
        commits.push(t.elapsed());
    }
    report("commit: create + 4 KiB write", commits);
    let mut empty_dir_commits = Vec::new();
    for i in 0..200 {
        fs.mkdir(root, format!("d{i}").as_bytes(), 0o755, 0, 0)
            .unwrap();
        let t = Instant::now();
        fs.commit().unwrap();
        empty_dir_commits.push(t.elapsed());
    }
    report("commit: mkdir", empty_dir_commits);
    let mut fsyncs = Vec::new();
    for i in 0..200 {
        let f = fs
            .create(root, format!("g{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.write_file(f.ino, 0, &block).unwrap();
        let t = Instant::now();
        fs.fsync(f.ino, false).unwrap();
        fsyncs.push(t.elapsed());
    }
    report("fsync (log tree): create + 4 KiB", fsyncs);
    println!("{:?}", fs.log_stats());
    println!("{:?}", fs.stats());
    fs.close().unwrap();
    drop(dev);
    if created {
        let _ = std::fs::remove_file(&path);
    }
}
