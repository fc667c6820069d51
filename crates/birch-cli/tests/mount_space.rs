//! Space through a real mount (issue 21, "Space"): fstests generic/371's
//! shape — on a 256 MiB filesystem one loop writes 80 MiB and removes the
//! file while another preallocates 80 MiB and removes it — gets ENOSPC at
//! worst, never EIO, and the filesystem stays writable. The engine's
//! deterministic and threaded versions are in crates/birch/tests/enospc.rs.
//!
//! Needs root and /dev/fuse (skips otherwise, fails with
//! BIRCH_REQUIRE_MOUNT=1).

mod common;

use common::{skip_unless_root, Fixture};
use std::fs::{self, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

const MIB: u64 = 1 << 20;
const FILE_BYTES: u64 = 80 * MIB;
/// Whole files the writer writes and removes, and the preallocator
/// preallocates and removes: counts, not times (main at 0b215d1 turned
/// read-only during the writer's first file).
const WRITER_ROUNDS: usize = 8;
const PREALLOCATOR_ROUNDS: usize = 40;
/// xfs_io's pwrite buffer: 4 KiB writes are what the failure took.
const WRITE_BYTES: usize = 4096;

/// One loop of generic/371. Returns the ENOSPC errors it met; any other
/// error fails the test, naming the call.
fn run_loop(path: PathBuf, prealloc: bool, rounds: usize) -> u64 {
    let mut enospc = 0;
    let buf = vec![0x5au8; WRITE_BYTES];
    for _ in 0..rounds {
        let f = match OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                enospc += 1;
                continue;
            }
            Err(e) => panic!("open {}: {e}", path.display()),
        };
        if prealloc {
            // SAFETY: fallocate on an fd we own.
            let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, FILE_BYTES as libc::off_t) };
            if r != 0 {
                let e = std::io::Error::last_os_error();
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "fallocate: {e}");
                enospc += 1;
            }
        } else {
            let mut at = 0;
            while at < FILE_BYTES {
                match f.write_at(&buf, at) {
                    Ok(n) => at += n as u64,
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                        enospc += 1;
                        break;
                    }
                    Err(e) => panic!("pwrite at {at}: {e}"),
                }
            }
        }
        drop(f);
        fs::remove_file(&path).unwrap_or_else(|e| panic!("rm {}: {e}", path.display()));
    }
    enospc
}

#[test]
fn pwrite_and_fallocate_race_near_full_gives_enospc_not_eio() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("space-371", "256M");
    fx.mount();
    let handles: Vec<_> = [
        ("f1", false, WRITER_ROUNDS),
        ("f2", true, PREALLOCATOR_ROUNDS),
    ]
    .into_iter()
    .map(|(name, prealloc, rounds)| {
        let path = fx.path(name);
        std::thread::spawn(move || run_loop(path, prealloc, rounds))
    })
    .collect();
    let enospc: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    eprintln!("ENOSPC per loop (pwrite, fallocate): {enospc:?}");
    // Still writable: a new file is written and made durable.
    fs::write(fx.path("after"), vec![7u8; 100_000]).unwrap();
    let f = fs::File::open(fx.path("after")).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert!(
        !fx.daemon_log().contains("read-only"),
        "the daemon turned read-only:\n{}",
        fx.daemon_log()
    );
    fx.try_unmount().unwrap();
}
