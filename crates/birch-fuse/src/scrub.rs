//! `birch scrub MOUNTPOINT`'s reply: the daemon runs
//! `scrub::scrub_filesystem` when the scrub ioctl arrives and sends its
//! [`ScrubReport`] as lines of text ([`encode`]), which the CLI reads back
//! ([`decode`]) and prints as `birch scrub IMAGE` prints its own report.
//!
//! An ioctl's reply is bounded ([`BIRCH_SCRUB_MAX`]): the counts always
//! fit, the report's lines go in while they fit (unrepaired ones first,
//! they matter more) and the rest are counted as not listed.

use birch::scrub::ScrubReport;
use std::fmt::Write;

/// The largest reply the scrub ioctl takes: the most an ioctl number can
/// encode (14 bits).
pub const BIRCH_SCRUB_MAX: usize = (1 << 14) - 1;
/// `_IOR('b', 3, [u8; BIRCH_SCRUB_MAX])`: scrub the mounted filesystem and
/// reply with the report, encoded.
pub const BIRCH_IOC_SCRUB: u32 = 2 << 30 | (BIRCH_SCRUB_MAX as u32) << 16 | (b'b' as u32) << 8 | 3;

/// Room kept for the counts (each under 40 bytes, eleven of them).
const COUNTS_BYTES: usize = 512;

const PROFILE: &str = "profile";
const NODES: &str = "nodes";
const COPIES: &str = "copies";
const DATA_EXTENTS: &str = "data_extents";
const DATA_BLOCKS_VERIFIED: &str = "data_blocks_verified";
const DATA_BLOCKS_NOT_VERIFIED: &str = "data_blocks_not_verified";
const DATA_BLOCKS_BAD: &str = "data_blocks_bad";
const REPAIRED_NOT_LISTED: &str = "repaired_not_listed";
const UNREPAIRED_NOT_LISTED: &str = "unrepaired_not_listed";
const REPAIRED: &str = "repaired";
const UNREPAIRED: &str = "unrepaired";

/// `report` as text of at most `max` bytes (at least [`COUNTS_BYTES`]).
pub fn encode(report: &ScrubReport, max: usize) -> String {
    let mut lines = String::new();
    let unrepaired_not_listed =
        report.unrepaired_not_listed + add_lines(UNREPAIRED, &report.unrepaired, max, &mut lines);
    let repaired_not_listed =
        report.repaired_not_listed + add_lines(REPAIRED, &report.repaired, max, &mut lines);
    let mut out = String::new();
    let _ = writeln!(out, "{PROFILE} {}", report.profile);
    for (key, value) in [
        (NODES, report.nodes),
        (COPIES, report.copies),
        (DATA_EXTENTS, report.data_extents),
        (DATA_BLOCKS_VERIFIED, report.data_blocks_verified),
        (DATA_BLOCKS_NOT_VERIFIED, report.data_blocks_not_verified),
        (DATA_BLOCKS_BAD, report.data_blocks_bad),
        (REPAIRED_NOT_LISTED, repaired_not_listed),
        (UNREPAIRED_NOT_LISTED, unrepaired_not_listed),
    ] {
        let _ = writeln!(out, "{key} {value}");
    }
    out.push_str(&lines);
    out
}

/// Adds `key LINE` for each line of `list` while `lines` stays within
/// `max` with room for the counts; returns how many did not fit.
fn add_lines(key: &str, list: &[String], max: usize, lines: &mut String) -> u64 {
    let mut not_listed = 0;
    for line in list {
        // A file name may hold a newline; a line of the reply may not.
        let line = format!("{key} {}\n", line.replace('\n', "\\n"));
        if lines.len() + line.len() + COUNTS_BYTES <= max {
            lines.push_str(&line);
        } else {
            not_listed += 1;
        }
    }
    not_listed
}

/// Reads [`encode`]'s text back.
pub fn decode(text: &str) -> Result<ScrubReport, String> {
    let mut report = ScrubReport::default();
    for line in text.lines() {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("unreadable scrub reply line: {line:?}"))
        };
        match key {
            PROFILE => {
                report.profile = match value {
                    "single" => "single",
                    "dup" => "dup",
                    _ => return Err(format!("unknown metadata profile in {line:?}")),
                }
            }
            NODES => report.nodes = number()?,
            COPIES => report.copies = number()?,
            DATA_EXTENTS => report.data_extents = number()?,
            DATA_BLOCKS_VERIFIED => report.data_blocks_verified = number()?,
            DATA_BLOCKS_NOT_VERIFIED => report.data_blocks_not_verified = number()?,
            DATA_BLOCKS_BAD => report.data_blocks_bad = number()?,
            REPAIRED_NOT_LISTED => report.repaired_not_listed = number()?,
            UNREPAIRED_NOT_LISTED => report.unrepaired_not_listed = number()?,
            REPAIRED => report.repaired.push(value.to_string()),
            UNREPAIRED => report.unrepaired.push(value.to_string()),
            _ => return Err(format!("unknown scrub reply line: {line:?}")),
        }
    }
    if report.profile.is_empty() {
        return Err("scrub reply without a metadata profile".to_string());
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(unrepaired: usize, repaired: usize) -> ScrubReport {
        ScrubReport {
            profile: "dup",
            nodes: 12,
            copies: 24,
            repaired: (0..repaired)
                .map(|i| format!("block {i} of tree fs(5): primary copy at {i}: checksum mismatch"))
                .collect(),
            unrepaired: (0..unrepaired)
                .map(|i| format!("data block {i}: read failed: /dir\nwith newline/f{i} offset 0"))
                .collect(),
            data_extents: 3,
            data_blocks_verified: 40,
            data_blocks_not_verified: 2,
            data_blocks_bad: unrepaired as u64,
            ..Default::default()
        }
    }

    #[test]
    fn a_short_report_comes_back_whole() {
        let sent = report(2, 3);
        let text = encode(&sent, BIRCH_SCRUB_MAX);
        let back = decode(&text).unwrap();
        assert_eq!(back.unrepaired[0], sent.unrepaired[0].replace('\n', "\\n"));
        assert_eq!(
            ScrubReport {
                unrepaired: sent
                    .unrepaired
                    .iter()
                    .map(|l| l.replace('\n', "\\n"))
                    .collect(),
                ..sent
            },
            back
        );
    }

    #[test]
    fn a_long_report_is_cut_to_the_bound_and_counts_what_it_left_out() {
        let sent = report(1000, 1000);
        let text = encode(&sent, BIRCH_SCRUB_MAX);
        assert!(text.len() <= BIRCH_SCRUB_MAX, "{} bytes", text.len());
        let back = decode(&text).unwrap();
        assert!(!back.unrepaired.is_empty(), "unrepaired lines go in first");
        assert_eq!(back.unrepaired_count(), 1000);
        assert_eq!(back.repaired_count(), 1000);
        assert!(back.unrepaired_not_listed > 0 && back.repaired_not_listed > 0);
        assert!(!back.is_clean());
        let shown = back.to_string();
        assert!(
            shown.contains(&format!("… and {} more", back.unrepaired_not_listed))
                && shown.contains("1000 repaired, 1000 unrepaired"),
            "{shown}"
        );
    }

    #[test]
    fn a_garbled_reply_is_an_error_naming_the_line() {
        let e = decode("profile dup\nnodes many\n").unwrap_err();
        assert!(e.contains("nodes many"), "{e}");
        assert!(decode("nodes 3\n").is_err());
    }
}
