//! `birch scrub MOUNTPOINT`: asks the mount's daemon to scrub the mounted
//! filesystem (an ioctl on the mount point that returns once the scrub is
//! done, with its report) and prints the report as `birch scrub IMAGE`
//! prints its own. While the ioctl blocks, another thread polls the mount's
//! `scrub_nodes` and `scrub_data_bytes` counters through the stats ioctl
//! and draws a progress line on stderr, when stderr is a terminal.

use crate::{output, stats, Failure};
use birch_fuse::{BIRCH_IOC_SCRUB, BIRCH_SCRUB_MAX};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// How often the progress line is redrawn.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// Exit status: 0 nothing left unrepaired, 1 something was, 2 the scrub
/// could not run (not a birch mount, the filesystem was shut down, a read
/// of the device failed outright).
pub fn scrub_mounted(mountpoint: &Path) -> Result<u8, Failure> {
    let dir = File::open(mountpoint)
        .map_err(|e| Failure::unreadable(format!("{}: {e}", mountpoint.display())))?;
    let progress = io::IsTerminal::is_terminal(&io::stderr()).then(|| start_progress(mountpoint));
    let mut buf = vec![0u8; BIRCH_SCRUB_MAX];
    // SAFETY: the kernel writes at most BIRCH_SCRUB_MAX bytes (the size
    // encoded in the command) into `buf`, which is that long.
    let rc = unsafe {
        libc::ioctl(
            dir.as_raw_fd(),
            BIRCH_IOC_SCRUB as libc::c_ulong,
            buf.as_mut_ptr(),
        )
    };
    let ioctl_error = (rc != 0).then(io::Error::last_os_error);
    if let Some((stop, thread)) = progress {
        drop(stop);
        // The thread only draws; its failure loses nothing.
        let _ = thread.join();
    }
    if let Some(e) = ioctl_error {
        let why = if e.raw_os_error() == Some(libc::ENOTTY) {
            "not a birch mount, or one mounted by a birch without mounted scrub".to_string()
        } else {
            e.to_string()
        };
        return Err(Failure::unreadable(format!(
            "{}: {why}",
            mountpoint.display()
        )));
    }
    // The reply is text, shorter than the buffer, whose rest stays zero.
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let report = birch_fuse::scrub::decode(&String::from_utf8_lossy(&buf[..end]))
        .map_err(|e| Failure::unreadable(format!("{}: {e}", mountpoint.display())))?;
    let mut out = io::stdout().lock();
    writeln!(out, "scrubbing {} (mounted)", mountpoint.display()).map_err(output)?;
    write!(out, "{report}").map_err(output)?;
    Ok(if report.is_clean() { 0 } else { 1 })
}

/// Starts the thread that draws the progress line until the returned
/// sender is dropped.
fn start_progress(mountpoint: &Path) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (stop, stopped) = mpsc::channel::<()>();
    let mountpoint = mountpoint.to_path_buf();
    let thread = std::thread::spawn(move || {
        // The counters count every scrub since mount: this one's progress
        // is what they gained since it started.
        let Some(start) = scrub_counters(&mountpoint) else {
            return;
        };
        let mut drawn = false;
        while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(PROGRESS_INTERVAL) {
            let Some(now) = scrub_counters(&mountpoint) else {
                break;
            };
            eprint!(
                "\rscrubbing: {} tree nodes, {} MiB of data",
                now.0 - start.0,
                (now.1 - start.1) >> 20
            );
            drawn = true;
        }
        if drawn {
            eprintln!();
        }
    });
    (stop, thread)
}

/// The mount's `scrub_nodes` and `scrub_data_bytes`; `None` if the stats
/// ioctl fails or lacks them.
fn scrub_counters(mountpoint: &Path) -> Option<(i128, i128)> {
    let report = stats::fetch(mountpoint).ok()?;
    let value = |name: &str| {
        report
            .counters
            .iter()
            .find(|(c, _)| c.name == name)
            .map(|&(_, v)| v)
    };
    Some((value("scrub_nodes")?, value("scrub_data_bytes")?))
}
