//! One seeded model-comparison run: engine and model side by side on a
//! memory device, whole views compared every few ops, a remount at the end.

use crate::harness::{Ret, Sim};
use crate::workload::{Generator, Op, WorkloadConfig};
use birch::device::MemoryDevice;
use birch::fs::{Filesystem, MkfsOptions, MountOptions};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The fsid every simulated filesystem gets (images are reproducible
/// byte for byte, apart from timestamps).
pub const SIM_FSID: [u8; 16] = *b"birch-sim-fsid!!";

/// Mount options varied by seed: a tiny node cache (eviction and reload
/// paths) and a small dirty limit (commits in the middle of writes) come up
/// for some seeds.
pub fn mount_options_for(seed: u64) -> MountOptions {
    let mut m = MountOptions::deterministic();
    match seed % 4 {
        1 => m.cache_nodes = 8,
        2 => m.dirty_limit_bytes = 256 * 1024,
        3 => {
            m.cache_nodes = 64;
            m.dirty_limit_bytes = 2 << 20;
        }
        _ => {}
    }
    m
}

/// A formatted memory device.
pub fn fresh_device(bytes: u64) -> Arc<MemoryDevice> {
    let dev = Arc::new(MemoryDevice::new(bytes));
    Filesystem::<Arc<MemoryDevice>>::mkfs(
        &dev,
        &MkfsOptions {
            fsid: Some(SIM_FSID),
            ..Default::default()
        },
    )
    .expect("mkfs on a memory device");
    dev
}

/// Parameters of one run.
#[derive(Clone, Debug)]
pub struct ModelRun {
    pub seed: u64,
    pub ops: usize,
    pub cfg: WorkloadConfig,
    pub device_bytes: u64,
    /// Compare whole views every this many ops.
    pub compare_every: usize,
    pub mount: MountOptions,
}

impl ModelRun {
    pub fn new(seed: u64, ops: usize) -> ModelRun {
        ModelRun {
            seed,
            ops,
            cfg: WorkloadConfig::default(),
            device_bytes: 128 << 20,
            compare_every: 25,
            mount: mount_options_for(seed),
        }
    }
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct ModelStats {
    pub ops: usize,
    pub view_compares: usize,
    pub remounts: usize,
    pub commits: u64,
    pub tolerated: Vec<String>,
    /// Per op kind: (succeeded, failed with an errno, skipped).
    pub outcomes: BTreeMap<&'static str, (u64, u64, u64)>,
    /// Entries in the final view.
    pub final_entries: usize,
    pub elapsed: Duration,
}

impl ModelStats {
    /// One line per op kind: how often it succeeded and failed.
    pub fn outcome_table(&self) -> String {
        self.outcomes
            .iter()
            .map(|(k, (ok, err, skip))| format!("{k:12} ok {ok:6} err {err:6} skipped {skip:6}\n"))
            .collect()
    }
}

/// Formats a failure with the seed, the op index, the recent ops and the
/// command that replays it.
pub fn failure(test: &str, seed: u64, index: usize, log: &[String], msg: &str) -> String {
    // The last 40 ops; `BIRCH_FULL_LOG=1` lists them all (to find where a
    // subvolume in a late op came from).
    let shown = if std::env::var_os("BIRCH_FULL_LOG").is_some() {
        log.len()
    } else {
        40
    };
    let from = log.len().saturating_sub(shown);
    let mut s = format!("seed={seed} op #{index}: {msg}\nlast ops:\n");
    for (i, op) in log.iter().enumerate().skip(from) {
        s.push_str(&format!("  #{i}: {op}\n"));
    }
    s.push_str(&format!(
        "replay: BIRCH_SEED={seed} cargo test -p birch-sim --test {test} -- --nocapture\n"
    ));
    s
}

/// Runs `run` and returns its stats, or a failure report naming the seed.
pub fn run_model(test: &str, run: &ModelRun) -> Result<ModelStats, String> {
    let start = std::time::Instant::now();
    let dev = fresh_device(run.device_bytes);
    let mut sim = Sim::open(dev, run.mount.clone(), run.cfg.handles)
        .map_err(|e| failure(test, run.seed, 0, &[], &e))?;
    let first_generation = sim.generation();
    let mut gen = Generator::new(run.seed, run.cfg.clone());
    let mut log = Vec::new();
    let mut stats = ModelStats::default();
    for i in 0..run.ops {
        let op = gen.next_op(sim.model());
        log.push(op.to_string());
        let outcome = sim
            .step(&op)
            .map_err(|e| failure(test, run.seed, i, &log, &e))?;
        let slot = stats.outcomes.entry(op.kind_name()).or_default();
        match outcome {
            Ok(Ret::Skipped) => slot.2 += 1,
            Ok(_) => slot.0 += 1,
            Err(_) => slot.1 += 1,
        }
        if op == Op::Remount {
            stats.remounts += 1;
        }
        if (i + 1) % run.compare_every == 0 {
            sim.compare_views()
                .map_err(|e| failure(test, run.seed, i, &log, &e))?;
            stats.view_compares += 1;
        }
    }
    let n = run.ops;
    sim.compare_views()
        .map_err(|e| failure(test, run.seed, n, &log, &e))?;
    stats.final_entries = sim.model().view().len();
    sim.remount()
        .map_err(|e| failure(test, run.seed, n, &log, &format!("final remount: {e}")))?;
    stats.commits = sim.generation() - first_generation;
    stats.tolerated = std::mem::take(&mut sim.tolerated);
    let dev = sim
        .close()
        .map_err(|e| failure(test, run.seed, n, &log, &e))?;
    let tolerated = crate::harness::check_image(&*dev).map_err(|r| {
        failure(
            test,
            run.seed,
            n,
            &log,
            &format!("check after the final close is not clean:\n{r}"),
        )
    })?;
    stats.tolerated.extend(tolerated);
    stats.ops = run.ops;
    stats.view_compares += 2;
    stats.remounts += 1;
    stats.elapsed = start.elapsed();
    Ok(stats)
}
