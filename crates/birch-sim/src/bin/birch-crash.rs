//! birch-crash: crash-state exploration from the command line.
//!
//! ```text
//! birch-crash [--seeds N] [--first-seed S] [--seed S] [--ops N] [--long]
//!             [--exhaustive N] [--samples N] [--quiet] [--keep-going]
//! birch-crash --ace seq1|seq2|fixed [--exhaustive N] [--samples N] [--quiet] [--keep-going]
//! birch-crash --ace-workload ID
//! ```
//! Records N seeded workloads (or the one `--seed`) on a recording device
//! and checks every chosen crash state of each (see docs/CRASH-TESTING.md).
//! Prints how many workloads and crash states were checked and how long it
//! took; exits 1 on the first failure (after printing it with its seed), 2
//! on bad arguments.
//!
//! `--ace seq1|seq2` runs every CrashMonkey/ACE-style workload of one or
//! two ops instead (`birch_sim::ace`), `--ace fixed` the fixed workloads of
//! the fsync contract; `--ace-workload seq2:123` (or a fixed workload's
//! name) replays one of them (as printed by a failure).

use birch_sim::ace;
use birch_sim::crash::{run_seed, CrashConfig, CrashStats};
use std::process::ExitCode;
use std::time::Instant;

struct Args {
    seeds: u64,
    first_seed: u64,
    one_seed: Option<u64>,
    ops: Option<usize>,
    long: bool,
    exhaustive: Option<usize>,
    samples: Option<usize>,
    quiet: bool,
    keep_going: bool,
    ace: Option<String>,
    ace_workload: Option<String>,
}

const USAGE: &str = "usage: birch-crash [--seeds N] [--first-seed S] [--seed S] [--ops N] [--long] [--exhaustive N] [--samples N] [--quiet] [--keep-going]
  --seeds N        number of seeded workloads (default 20; 200 with --long)
  --first-seed S   first seed of the range (default 0)
  --seed S         run only this seed (replays a failure)
  --ops N          generated ops per workload (default 40; 80 with --long)
  --long           long mode: longer workloads, more prepopulated files,
                   torn writes on every other seed, every prefix and
                   single-write drop of windows over 10 writes + 128 random
                   subsets (CI size: <= 64 of those + 64 random)
  --exhaustive N   windows of at most N writes get every subset
  --samples N      random subsets tried in a window over --exhaustive writes
  --quiet          print only the summary
  --keep-going     go on after a failing seed; list the failing seeds at the end
  --ace seq1|seq2|fixed  run every ACE-style workload of 1 or 2 ops, or the
                   fixed workloads of the fsync contract (every subset of
                   windows up to --exhaustive writes, default 10; else
                   --samples structured + random subsets, default 64)
  --ace-workload ID  run one ACE workload (seq1:N, seq2:N, setup, or a fixed
                   workload's name)";

fn parse_num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse().map_err(|_| format!("{flag}: not a number: {v}"))
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seeds: 0,
        first_seed: 0,
        one_seed: None,
        ops: None,
        long: false,
        exhaustive: None,
        samples: None,
        quiet: false,
        keep_going: false,
        ace: None,
        ace_workload: None,
    };
    let mut seeds = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--seeds" => seeds = Some(parse_num(&flag, it.next())?),
            "--first-seed" => a.first_seed = parse_num(&flag, it.next())?,
            "--seed" => a.one_seed = Some(parse_num(&flag, it.next())?),
            "--ops" => a.ops = Some(parse_num(&flag, it.next())?),
            "--exhaustive" => a.exhaustive = Some(parse_num(&flag, it.next())?),
            "--samples" => a.samples = Some(parse_num(&flag, it.next())?),
            "--ace" => {
                let v = it.next().ok_or("--ace needs seq1, seq2 or fixed")?;
                if !["seq1", "seq2", "fixed"].contains(&v.as_str()) {
                    return Err(format!("--ace: {v} is not seq1, seq2 or fixed"));
                }
                a.ace = Some(v);
            }
            "--ace-workload" => {
                a.ace_workload = Some(it.next().ok_or("--ace-workload needs an id")?)
            }
            "--long" => a.long = true,
            "--quiet" => a.quiet = true,
            "--keep-going" => a.keep_going = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    a.seeds = seeds.unwrap_or(if a.long { 200 } else { 20 });
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("birch-crash: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    if args.ace.is_some() || args.ace_workload.is_some() {
        return run_ace(&args);
    }
    let seeds: Vec<u64> = match args.one_seed {
        Some(s) => vec![s],
        None => (args.first_seed..args.first_seed + args.seeds).collect(),
    };
    let start = Instant::now();
    let mut total = CrashStats::default();
    let mut failed = Vec::new();
    for &seed in &seeds {
        let mut cfg = if args.long {
            CrashConfig::long(seed)
        } else {
            CrashConfig::ci(seed)
        };
        if let Some(ops) = args.ops {
            cfg.ops = ops;
        }
        if let Some(n) = args.exhaustive {
            cfg.exhaustive_max_writes = n;
        }
        if let Some(n) = args.samples {
            cfg.sample_subsets = n;
        }
        match run_seed(&cfg) {
            Ok(stats) => {
                if !args.quiet {
                    println!(
                        "seed {seed}: {} ops, {} flush points, {} crash states ({} at an older generation, {} with compressed extents), largest window {} writes, {:.2?}",
                        stats.ops, stats.flush_points, stats.crash_states, stats.states_at_older_generation, stats.states_with_compressed_extents, stats.largest_window, stats.elapsed
                    );
                }
                total.add(&stats);
            }
            Err(e) if args.keep_going => {
                println!("FAILED\n{e}");
                failed.push(seed);
            }
            Err(e) => {
                println!("FAILED\n{e}");
                println!(
                    "{} workloads and {} crash states passed before this one ({:.2?})",
                    total.workloads,
                    total.crash_states,
                    start.elapsed()
                );
                return ExitCode::from(1);
            }
        }
    }
    let mut tolerated = total.tolerated.clone();
    tolerated.sort();
    tolerated.dedup();
    for t in &tolerated {
        println!("tolerated {t}");
    }
    println!(
        "checked {} workloads ({} ops), {} flush points, {} crash states ({} with compressed extents), {} guarantee facts, {} durable inodes followed in {:.2?} (largest window {} writes)",
        total.workloads,
        total.ops,
        total.flush_points,
        total.crash_states,
        total.states_with_compressed_extents,
        total.guarantee_facts,
        total.durable_inodes,
        start.elapsed(),
        total.largest_window
    );
    if !failed.is_empty() {
        println!(
            "{} of {} seeds FAILED: {failed:?}",
            failed.len(),
            seeds.len()
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

fn run_ace(args: &Args) -> ExitCode {
    let workloads = match (&args.ace_workload, args.ace.as_deref()) {
        (Some(id), _) => match ace::by_id(id) {
            Some(w) => vec![w],
            None => {
                eprintln!("birch-crash: no ACE workload {id}");
                return ExitCode::from(2);
            }
        },
        (None, Some("seq1")) => ace::enumerate(1),
        (None, Some("fixed")) => ace::fixed(),
        (None, _) => ace::enumerate(2),
    };
    let cfg = ace::config(args.exhaustive.unwrap_or(10), args.samples.unwrap_or(64));
    let start = Instant::now();
    let mut total = CrashStats::default();
    let (mut renames, mut with_log) = (0, 0);
    let mut failed = Vec::new();
    let n = workloads.len();
    for (i, w) in workloads.iter().enumerate() {
        match ace::run(w, &cfg) {
            Ok(stats) => {
                if !args.quiet {
                    println!(
                        "{} ({}/{n}): {} flush points, {} crash states, {:.2?}",
                        w.describe(),
                        i + 1,
                        stats.crash.flush_points,
                        stats.crash.crash_states,
                        stats.crash.elapsed
                    );
                }
                renames += stats.renames_judged;
                with_log += stats.states_with_log;
                total.add(&stats.crash);
            }
            Err(e) => {
                println!("FAILED\n{e}");
                failed.push(w.id.clone());
                if !args.keep_going {
                    println!(
                        "{} workloads and {} crash states passed before this one ({:.2?})",
                        total.workloads,
                        total.crash_states,
                        start.elapsed()
                    );
                    return ExitCode::from(1);
                }
            }
        }
    }
    println!(
        "checked {} ACE workloads, {} flush points, {} crash states ({with_log} replaying a log), {} guarantee facts, {} durable inodes followed, {renames} rename judgements in {:.2?} (largest window {} writes)",
        total.workloads,
        total.flush_points,
        total.crash_states,
        total.guarantee_facts,
        total.durable_inodes,
        start.elapsed(),
        total.largest_window
    );
    if !failed.is_empty() {
        println!("{} of {n} workloads FAILED: {failed:?}", failed.len());
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
