//! `birch replay`: reads a write log (dm-log-writes format, from
//! `birch mount --write-log` or `birch mkfs --write-log`) and lists it, or
//! rebuilds the device as a power cut at a chosen point would have left it
//! (every write before that point kept, nothing after).

use crate::Failure;
use birch::device::{read_write_log, LogEntry};
use clap::Args;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

#[derive(Args)]
pub struct ReplayArgs {
    /// The write log
    #[arg(value_name = "LOG")]
    log: PathBuf,
    /// Print every entry (writes, flushes, marks) and stop
    #[arg(long, conflicts_with_all = ["to_mark", "flush", "out"])]
    list: bool,
    /// Rebuild the device as it was when the first mark named NAME was made
    #[arg(long, value_name = "NAME", conflicts_with = "flush")]
    to_mark: Option<String>,
    /// Rebuild the device as it was when the N-th flush (1-based) completed
    #[arg(long, value_name = "N")]
    flush: Option<u64>,
    /// The image to write (created or overwritten)
    #[arg(long, value_name = "IMAGE", required_unless_present = "list")]
    out: Option<PathBuf>,
    /// Start from a copy of this image (taken before the logged mount);
    /// without it, from zeroes (a log that began at `birch mkfs --write-log`)
    #[arg(long, value_name = "IMAGE")]
    from: Option<PathBuf>,
}

pub fn replay(args: &ReplayArgs) -> Result<u8, Failure> {
    let shown = args.log.display();
    let file =
        std::fs::File::open(&args.log).map_err(|e| Failure::unreadable(format!("{shown}: {e}")))?;
    let entries =
        read_write_log(&file).map_err(|e| Failure::unreadable(format!("{shown}: {e}")))?;
    if args.list {
        let mut out = std::io::stdout().lock();
        let mut flushes = 0;
        for (i, e) in entries.iter().enumerate() {
            let line = match e {
                LogEntry::Write { offset, data } => {
                    format!("{i:>8}  write  offset {offset} length {}", data.len())
                }
                LogEntry::Flush => {
                    flushes += 1;
                    format!("{i:>8}  flush  #{flushes}")
                }
                LogEntry::Mark(name) => format!("{i:>8}  mark   {name}"),
                LogEntry::Other {
                    flags,
                    sector,
                    nr_sectors,
                } => {
                    format!("{i:>8}  other  flags {flags:#x} sector {sector} sectors {nr_sectors}")
                }
            };
            writeln!(out, "{line}").map_err(crate::output)?;
        }
        return Ok(0);
    }
    let stop = match (&args.to_mark, args.flush) {
        (Some(name), None) => entries
            .iter()
            .position(|e| matches!(e, LogEntry::Mark(m) if m == name))
            .ok_or_else(|| Failure::new(format!("{shown}: no mark named {name:?}")))?,
        (None, Some(n)) if n > 0 => {
            let mut seen = 0;
            entries
                .iter()
                .position(|e| {
                    seen += u64::from(matches!(e, LogEntry::Flush));
                    seen == n
                })
                .map(|i| i + 1)
                .ok_or_else(|| {
                    Failure::new(format!("{shown}: the log has fewer than {n} flushes"))
                })?
        }
        _ => {
            return Err(Failure::new(
                "say where to stop: --to-mark NAME or --flush N (N >= 1)",
            ))
        }
    };
    let out_path = args
        .out
        .as_ref()
        .expect("clap requires --out without --list");
    match &args.from {
        Some(from) => {
            std::fs::copy(from, out_path).map_err(|e| {
                Failure::new(format!(
                    "copying {} to {}: {e}",
                    from.display(),
                    out_path.display()
                ))
            })?;
        }
        None => {
            // dm-log-writes does not record the device size; birch's
            // superblocks in the log do.
            let written_end = entries
                .iter()
                .filter_map(|e| {
                    if let LogEntry::Write { offset, data } = e {
                        Some(offset + data.len() as u64)
                    } else {
                        None
                    }
                })
                .max()
                .unwrap_or(0);
            let fs_size = entries
                .iter()
                .filter_map(|e| match e {
                    LogEntry::Write { offset, data }
                        if birch::format::SUPERBLOCK_OFFSETS.contains(offset)
                            && data.len() >= birch::format::SUPERBLOCK_SIZE =>
                    {
                        birch::format::Superblock::decode(
                            &data[..birch::format::SUPERBLOCK_SIZE],
                            *offset,
                        )
                        .ok()
                        .map(|sb| sb.total_bytes)
                    }
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            let size = written_end.max(fs_size);
            let f = std::fs::File::create(out_path)
                .map_err(|e| Failure::new(format!("{}: {e}", out_path.display())))?;
            f.set_len(size)
                .map_err(|e| Failure::new(format!("{}: {e}", out_path.display())))?;
        }
    }
    let out = std::fs::File::options()
        .write(true)
        .open(out_path)
        .map_err(|e| Failure::new(format!("{}: {e}", out_path.display())))?;
    let mut writes = 0;
    for e in &entries[..stop] {
        if let LogEntry::Write { offset, data } = e {
            out.write_all_at(data, *offset)
                .map_err(|e| Failure::new(format!("{}: {e}", out_path.display())))?;
            writes += 1;
        }
    }
    out.sync_all()
        .map_err(|e| Failure::new(format!("{}: {e}", out_path.display())))?;
    println!(
        "{}: {writes} writes of {} entries replayed (stopped before entry {stop})",
        out_path.display(),
        entries.len()
    );
    Ok(0)
}
