//! `birch stats [--json] MOUNTPOINT`: asks the mount's daemon for its
//! [`StatsReport`] (an ioctl on the mount point) and lays it out: for
//! people, in sections with units and rates since mount; for scripts, as
//! one JSON object. Which counters there are, their sections and units come
//! from `birch_fuse::stats::COUNTERS`; nothing here names a counter.

use crate::Failure;
use birch_fuse::stats::{Counter, Group, Measure, StatsReport, Unit};
use birch_fuse::{BIRCH_IOC_STATS, BIRCH_STATS_MAX};
use clap::Args;
use std::fmt::Write;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args)]
pub struct StatsArgs {
    /// One JSON object (stable snake_case keys, numbers as numbers) instead
    /// of the sections for people
    #[arg(long)]
    pub json: bool,
    /// Where a birch filesystem is mounted
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: PathBuf,
}

pub fn stats(args: &StatsArgs) -> Result<u8, Failure> {
    let report = fetch(&args.mountpoint)?;
    if args.json {
        let mut out = String::new();
        report_json(&report).write(&mut out, 0);
        println!("{out}");
    } else {
        print!("{}", report_text(&report));
    }
    Ok(0)
}

pub(crate) fn fetch(mountpoint: &Path) -> Result<StatsReport, Failure> {
    let dir = File::open(mountpoint)
        .map_err(|e| Failure::new(format!("{}: {e}", mountpoint.display())))?;
    let mut buf = vec![0u8; BIRCH_STATS_MAX];
    // SAFETY: the kernel writes at most BIRCH_STATS_MAX bytes (the size
    // encoded in the command) into `buf`, which is that long.
    let rc = unsafe {
        libc::ioctl(
            dir.as_raw_fd(),
            BIRCH_IOC_STATS as libc::c_ulong,
            buf.as_mut_ptr(),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        // A daemon of a birch from before this report answers ENOTTY too:
        // the command number holds the reply size, which grew.
        let why = if e.raw_os_error() == Some(libc::ENOTTY) {
            "not a birch mount, or one mounted by an older birch".to_string()
        } else {
            e.to_string()
        };
        return Err(Failure::new(format!("{}: {why}", mountpoint.display())));
    }
    // The reply is text, shorter than the buffer, whose rest stays zero.
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    StatsReport::decode(&String::from_utf8_lossy(&buf[..end]))
        .map_err(|e| Failure::new(format!("{}: {e}", mountpoint.display())))
}

// ----- for people -----

/// Where the counters' values start: past the longest counter name.
fn name_width(report: &StatsReport) -> usize {
    report
        .counters
        .iter()
        .map(|(c, _)| c.name.len())
        .chain(report.requests.iter().map(|(name, _)| name.len()))
        .max()
        .unwrap_or(0)
        + 2
}

fn report_text(report: &StatsReport) -> String {
    let secs = report.uptime.as_secs_f64();
    let mut out = String::from("mount\n");
    let mut fact = |label: &str, value: &str| {
        let _ = writeln!(out, "  {label:<12}{value}");
    };
    if let Some(image) = &report.image {
        let io = if image.direct_io {
            "O_DIRECT"
        } else {
            "buffered"
        };
        fact("image", &format!("{} ({io})", image.path));
    }
    fact("uptime", &duration_text(report.uptime));
    let mount_type = match &report.block_device {
        Some(device) => format!("fuseblk on {device}"),
        None => "fuse".to_string(),
    };
    let mode = if report.read_only { "ro" } else { "rw" };
    fact(
        "transport",
        &format!("{}, {mount_type}, {mode}", report.transport),
    );
    if let Some(reason) = &report.failure {
        fact("failed", &format!("read-only after an I/O error: {reason}"));
    }
    fact("options", &report.options);
    fact("init flags", &report.init_flags.join(" "));
    fact(
        "generation",
        &format!("{} (last durable commit)", report.generation),
    );

    let width = name_width(report);
    for group in Group::ALL {
        let counters: Vec<_> = report
            .counters
            .iter()
            .filter(|(c, _)| c.group == group)
            .collect();
        if counters.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{}", group.title());
        let mut zeros = Vec::new();
        for (counter, value) in counters {
            if *value == 0 {
                zeros.push(counter.name);
                continue;
            }
            let rate = rate_text(counter, *value, secs).unwrap_or_default();
            let line = format!(
                "  {:<width$}{:>14}  {rate}",
                counter.name,
                value_text(counter.unit, *value)
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
        if !zeros.is_empty() {
            out.push_str(&wrapped("  zero: ", &zeros));
        }
    }

    out.push_str(&state_hold_text(report));

    let total: u64 = report.requests.iter().map(|(_, n)| n).sum();
    let _ = writeln!(
        out,
        "\nFUSE requests: {}{}",
        count_text(i128::from(total)),
        per_second(total as f64, secs)
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    );
    let mut requests: Vec<_> = report.requests.iter().filter(|(_, n)| *n > 0).collect();
    requests.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for (opcode, n) in requests {
        let share = 100.0 * *n as f64 / total as f64;
        let line = format!(
            "  {opcode:<width$}{:>14}  {share:5.1}%  {}",
            count_text(i128::from(*n)),
            per_second(*n as f64, secs).unwrap_or_default()
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// The mean state-lock hold per request, the request rate it caps the
/// engine at, and the histogram's non-empty buckets.
fn state_hold_text(report: &StatsReport) -> String {
    let Some((mean, ceiling)) = report.state_hold_mean() else {
        return String::new();
    };
    let mut out = format!(
        "\nstate lock hold per request: mean {}, ceiling {} requests/s on any number of cores\n",
        nanos_text(mean.as_nanos()),
        count_text(ceiling.min(u64::MAX as f64) as i128)
    );
    let total: u64 = report.state_hold_histogram.iter().sum();
    for (i, &n) in report.state_hold_histogram.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let from = 1u128 << i;
        let range = if i + 1 == report.state_hold_histogram.len() {
            format!(">= {}", nanos_text(from))
        } else {
            format!("{} - {}", nanos_text(from), nanos_text(from << 1))
        };
        let share = 100.0 * n as f64 / total.max(1) as f64;
        let _ = writeln!(
            out,
            "  {range:<22}{:>14}  {share:5.1}%",
            count_text(i128::from(n))
        );
    }
    out
}

/// "640 ns", "12.3 µs", "4.1 ms", "2.15 s": a hold's length.
fn nanos_text(nanos: u128) -> String {
    let n = nanos as f64;
    if nanos < 1_000 {
        format!("{nanos} ns")
    } else if nanos < 1_000_000 {
        format!("{:.1} µs", n / 1e3)
    } else if nanos < 1_000_000_000 {
        format!("{:.1} ms", n / 1e6)
    } else {
        format!("{:.2} s", n / 1e9)
    }
}

/// `names` after `prefix`, comma-separated, wrapped at 80 columns.
fn wrapped(prefix: &str, names: &[&str]) -> String {
    let indent = " ".repeat(prefix.len());
    let mut out = String::new();
    let mut line = prefix.to_string();
    for (i, name) in names.iter().enumerate() {
        let item = if i + 1 < names.len() {
            format!("{name}, ")
        } else {
            name.to_string()
        };
        if line.len() + item.trim_end().len() > 80 && line.len() > indent.len() {
            out.push_str(line.trim_end());
            out.push('\n');
            line = indent.clone();
        }
        line.push_str(&item);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

fn value_text(unit: Unit, value: i128) -> String {
    match unit {
        Unit::Count => count_text(value),
        Unit::Bytes => bytes_text(value as f64),
        Unit::Pages => format!("{} pages", count_text(value)),
        Unit::Micros => duration_text(Duration::from_micros(clamp_u64(value))),
        Unit::Nanos => duration_text(Duration::from_nanos(clamp_u64(value))),
    }
}

/// Per second since mount, for sums of events or bytes; a peak, a gauge
/// or a sum of waits (several writers wait at once) has no meaningful rate.
fn rate_text(counter: &Counter, value: i128, secs: f64) -> Option<String> {
    if counter.measure != Measure::Total {
        return None;
    }
    match counter.unit {
        Unit::Count | Unit::Pages => per_second(value as f64, secs),
        Unit::Bytes => (secs > 0.0).then(|| format!("{}/s", bytes_text(value as f64 / secs))),
        Unit::Micros | Unit::Nanos => None,
    }
}

fn per_second(n: f64, secs: f64) -> Option<String> {
    if secs <= 0.0 {
        return None;
    }
    let rate = n / secs;
    Some(if rate >= 100.0 {
        format!("{rate:.0}/s")
    } else if rate >= 10.0 {
        format!("{rate:.1}/s")
    } else {
        format!("{rate:.2}/s")
    })
}

fn clamp_u64(value: i128) -> u64 {
    u64::try_from(value.max(0)).unwrap_or(u64::MAX)
}

/// 1234567 -> "1,234,567".
fn count_text(value: i128) -> String {
    let digits = value.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    if value < 0 {
        out.insert(0, '-');
    }
    out
}

/// Binary units: "512 B", "1.5 KiB", "12.3 MiB".
fn bytes_text(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes.abs() < 1024.0 {
        return format!("{bytes:.0} B");
    }
    let mut scaled = bytes / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if scaled.abs() < 1024.0 {
            break;
        }
        scaled /= 1024.0;
        unit = next;
    }
    format!("{scaled:.1} {unit}")
}

/// "850 µs", "12.3 ms", "4.56 s", "2m 03s", "5h 02m 03s".
fn duration_text(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 3600 {
        format!("{}h {:02}m {:02}s", secs / 3600, secs / 60 % 60, secs % 60)
    } else if secs >= 60 {
        format!("{}m {:02}s", secs / 60, secs % 60)
    } else if d >= Duration::from_secs(1) {
        format!("{:.2} s", d.as_secs_f64())
    } else if d >= Duration::from_millis(1) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{} µs", d.as_micros())
    }
}

// ----- for scripts -----

/// Just enough JSON to write the report.
enum Json {
    Number(String),
    String(String),
    Bool(bool),
    Null,
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn string(s: &str) -> Json {
        Json::String(s.to_string())
    }

    /// Objects one member per line (indented by `depth`), arrays on one line.
    fn write(&self, out: &mut String, depth: usize) {
        match self {
            Json::Number(n) => out.push_str(n),
            Json::String(s) => write_json_string(out, s),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Null => out.push_str("null"),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write(out, depth);
                }
                out.push(']');
            }
            Json::Object(members) => {
                out.push('{');
                for (i, (key, value)) in members.iter().enumerate() {
                    out.push_str(if i > 0 { ",\n" } else { "\n" });
                    out.push_str(&"  ".repeat(depth + 1));
                    write_json_string(out, key);
                    out.push_str(": ");
                    value.write(out, depth + 1);
                }
                out.push('\n');
                out.push_str(&"  ".repeat(depth));
                out.push('}');
            }
        }
    }
}

fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The report as one flat object: the mount's facts, every counter under
/// its table name (in its table unit), then the FUSE requests by opcode.
fn report_json(report: &StatsReport) -> Json {
    let number = |n: &dyn std::fmt::Display| Json::Number(n.to_string());
    let optional = |s: Option<&str>| s.map_or(Json::Null, Json::string);
    let mut members = vec![
        (
            "uptime_seconds".to_string(),
            Json::Number(format!("{:.3}", report.uptime.as_secs_f64())),
        ),
        (
            "image".to_string(),
            optional(report.image.as_ref().map(|i| i.path.as_str())),
        ),
        (
            "image_direct_io".to_string(),
            report
                .image
                .as_ref()
                .map_or(Json::Null, |i| Json::Bool(i.direct_io)),
        ),
        ("transport".to_string(), Json::string(&report.transport)),
        (
            "mount_type".to_string(),
            Json::string(if report.block_device.is_some() {
                "fuseblk"
            } else {
                "fuse"
            }),
        ),
        (
            "block_device".to_string(),
            optional(report.block_device.as_deref()),
        ),
        ("read_only".to_string(), Json::Bool(report.read_only)),
        ("failure".to_string(), optional(report.failure.as_deref())),
        ("options".to_string(), Json::string(&report.options)),
        (
            "init_flags".to_string(),
            Json::Array(report.init_flags.iter().map(|f| Json::string(f)).collect()),
        ),
        ("generation".to_string(), number(&report.generation)),
    ];
    members.extend(
        report
            .counters
            .iter()
            .map(|(c, value)| (c.name.to_string(), number(value))),
    );
    if let Some((mean, ceiling)) = report.state_hold_mean() {
        members.push((
            "state_hold_mean_nanos".to_string(),
            number(&mean.as_nanos()),
        ));
        members.push((
            "state_hold_ceiling_per_second".to_string(),
            Json::Number(format!("{ceiling:.0}")),
        ));
    }
    members.push((
        "state_hold_histogram".to_string(),
        Json::Array(
            report
                .state_hold_histogram
                .iter()
                .map(|n| number(n))
                .collect(),
        ),
    ));
    let total: u64 = report.requests.iter().map(|(_, n)| n).sum();
    members.push(("fuse_requests_total".to_string(), number(&total)));
    members.push((
        "fuse_requests".to_string(),
        Json::Object(
            report
                .requests
                .iter()
                .map(|(opcode, n)| (opcode.clone(), number(n)))
                .collect(),
        ),
    ));
    Json::Object(members)
}

#[cfg(test)]
mod tests {
    use super::*;
    use birch_fuse::stats::{ImageInfo, COUNTERS};

    fn sample() -> StatsReport {
        StatsReport {
            uptime: Duration::from_secs(100),
            image: Some(ImageInfo {
                path: "/var/tmp/\"odd\"\nimage".into(),
                direct_io: true,
            }),
            block_device: None,
            transport: "/dev/fuse (transport=devfuse)".into(),
            read_only: false,
            failure: None,
            options: "threads=8".into(),
            init_flags: vec!["ASYNC_READ".into()],
            generation: 7,
            counters: COUNTERS
                .iter()
                .map(|c| {
                    let value = match c.name {
                        "commits" => 250,
                        "state_hold_requests" => 4,
                        "state_hold_nanos" => 8_000,
                        _ => 0,
                    };
                    (c, value)
                })
                .collect(),
            requests: vec![
                ("LOOKUP".into(), 30),
                ("GETATTR".into(), 70),
                ("READ".into(), 0),
            ],
            state_hold_histogram: vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 3],
        }
    }

    #[test]
    fn units_read_like_units() {
        assert_eq!(count_text(1_234_567), "1,234,567");
        assert_eq!(count_text(-1000), "-1,000");
        assert_eq!(bytes_text(512.0), "512 B");
        assert_eq!(bytes_text(3.5 * 1024.0 * 1024.0), "3.5 MiB");
        assert_eq!(bytes_text(-2048.0), "-2.0 KiB");
        assert_eq!(duration_text(Duration::from_micros(850)), "850 µs");
        assert_eq!(duration_text(Duration::from_micros(12_345)), "12.3 ms");
        assert_eq!(duration_text(Duration::from_secs(123)), "2m 03s");
        assert_eq!(duration_text(Duration::from_secs(3723)), "1h 02m 03s");
    }

    #[test]
    fn human_layout_has_sections_rates_and_compact_zeros() {
        let text = report_text(&sample());
        for group in Group::ALL {
            assert!(text.contains(&format!("\n{}\n", group.title())), "{text}");
        }
        assert!(text.contains("2.50/s"), "commits' rate: {text}");
        assert!(text.contains("  zero: delayed_item_flushes, "), "{text}");
        // Requests: most frequent first, with their share; zeros left out.
        let getattr = text.find("GETATTR").expect("GETATTR");
        assert!(getattr < text.find("LOOKUP").expect("LOOKUP"), "{text}");
        assert!(text.contains(" 70.0%"), "{text}");
        assert!(!text.contains("READ "), "{text}");
        assert!(text.lines().all(|l| l == l.trim_end()), "{text}");
        // 8 µs held by 4 requests: 2 µs each, at most 500,000 a second.
        assert!(
            text.contains("mean 2.0 µs, ceiling 500,000 requests/s"),
            "{text}"
        );
        assert!(text.contains("  1.0 µs - 2.0 µs"), "{text}");
        assert!(text.contains(" 75.0%"), "{text}");
    }

    #[test]
    fn json_keys_are_unique_and_strings_escaped() {
        let Json::Object(members) = report_json(&sample()) else {
            panic!("not an object");
        };
        for (i, (key, _)) in members.iter().enumerate() {
            assert!(members[..i].iter().all(|(k, _)| k != key), "{key} twice");
        }
        let mut out = String::new();
        report_json(&sample()).write(&mut out, 0);
        assert!(
            out.contains(r#""image": "/var/tmp/\"odd\"\nimage","#),
            "{out}"
        );
        assert!(out.contains("\"uptime_seconds\": 100.000,"), "{out}");
        assert!(out.contains("\"commits\": 250,"), "{out}");
        assert!(out.contains("\"fuse_requests_total\": 100,"), "{out}");
        assert!(
            out.contains("\"state_hold_ceiling_per_second\": 500000,"),
            "{out}"
        );
    }
}
