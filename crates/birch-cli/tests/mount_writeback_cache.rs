//! What a full filesystem does to a writer under the opt-in
//! `-o writeback_cache` (docs/FUSE.md, "The writeback cache"): the kernel
//! accepts write(2) into its page cache, so birch's ENOSPC can only come
//! back when the kernel writes the pages back. These tests pin that it does
//! come back, at close(2) or at fsync(2), and that everything birch
//! accepted survives a remount with a clean `birch check`, the refused
//! ranges reading as holes.
//!
//! Run: `cargo test -p birch-cli --test mount_writeback_cache` as root.

mod common;

use common::{errno, skip_unless_root, Fixture};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::IntoRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

const MIB: usize = 1 << 20;
/// Image size, and what each overflowing writer writes: well past it.
const IMAGE: &str = "64M";
const OVERFLOW_MIB: usize = 100;

fn mounted_with_writeback_cache(tag: &str) -> Fixture {
    let mut fx = Fixture::new(tag, IMAGE);
    fx.options = vec!["writeback_cache".into()];
    fx.mount();
    fx
}

/// Writes `OVERFLOW_MIB` MiB of `byte` to a new file, 1 MiB per write(2),
/// and returns the open file and the first error a write returned (with the
/// cache, normally none: the pages are only written back later).
fn overflow(path: &Path, byte: u8) -> (File, Option<i32>) {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    let chunk = vec![byte; MIB];
    for _ in 0..OVERFLOW_MIB {
        if let Err(e) = f.write_all(&chunk) {
            return (f, e.raw_os_error());
        }
    }
    (f, None)
}

/// close(2) with its result (dropping a `File` ignores it).
fn close(f: File) -> Result<(), i32> {
    // SAFETY: the descriptor is ours; into_raw_fd gave up the File's claim.
    if unsafe { libc::close(f.into_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// The file holds only `byte`s and zeros, at most `OVERFLOW_MIB` MiB:
/// the ranges of an overflowing write whose write-back birch accepted, and
/// holes where it refused one (the kernel writes back out of order, and
/// space can come back between two write-backs, so the refused ranges need
/// not be the last ones), never another file's bytes. Returns how many
/// bytes survived.
fn assert_only(path: &Path, byte: u8) -> usize {
    let data = fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(
        data.len() <= OVERFLOW_MIB * MIB,
        "{}: {} bytes",
        path.display(),
        data.len()
    );
    if let Some(at) = data.iter().position(|&b| b != byte && b != 0) {
        panic!(
            "{}: byte {at} is {:#x}, neither {byte:#x} nor a hole",
            path.display(),
            data[at]
        );
    }
    data.iter().filter(|&&b| b == byte).count()
}

#[test]
fn enospc_at_write_back_fails_the_close_and_keeps_what_was_fsynced() {
    if skip_unless_root() {
        return;
    }
    let mut fx = mounted_with_writeback_cache("wbc-enospc-close");
    let kept = fx.path("kept");
    let kept_data = vec![b'k'; 4 * MIB];
    {
        let f = File::create(&kept).expect("create kept");
        f.write_all_at(&kept_data, 0).expect("write kept");
        f.sync_all().expect("fsync kept");
    }
    let big = fx.path("big");
    let (f, write_error) = overflow(&big, b'x');
    let closed = close(f);
    assert!(
        write_error == Some(libc::ENOSPC) || closed == Err(libc::ENOSPC),
        "{OVERFLOW_MIB} MiB into a {IMAGE} image: first write error {write_error:?}, \
         close {closed:?}; the loss went unreported"
    );
    fx.remount();
    assert_eq!(fs::read(&kept).expect("read kept"), kept_data);
    let survived = assert_only(&big, b'x');
    assert!(
        survived < OVERFLOW_MIB * MIB,
        "all of big fit a {IMAGE} image"
    );
    fx.unmount();
    fx.assert_clean();
}

#[test]
fn enospc_at_write_back_fails_the_fsync_once() {
    if skip_unless_root() {
        return;
    }
    let mut fx = mounted_with_writeback_cache("wbc-enospc-fsync");
    let big = fx.path("big");
    let (f, write_error) = overflow(&big, b'y');
    if write_error.is_none() {
        let first = f.sync_all().map_err(|e| e.raw_os_error());
        assert_eq!(
            first,
            Err(Some(libc::ENOSPC)),
            "first fsync after the overflow"
        );
        // errseq: a writeback error is reported once per open file; what a
        // second fsync then promises is what birch holds.
        f.sync_all().expect("second fsync");
    } else {
        assert_eq!(write_error, Some(libc::ENOSPC), "first write error");
    }
    drop(f);
    fx.remount();
    assert_only(&big, b'y');
    fx.unmount();
    fx.assert_clean();
}
