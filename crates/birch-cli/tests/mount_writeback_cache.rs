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
use std::os::fd::{AsRawFd, IntoRawFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

const MIB: usize = 1 << 20;
const PAGE: i64 = 4096;
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

/// Preallocates `path` until not one more page fits, so that only space
/// freed afterwards is free.
fn fill(path: &Path) -> File {
    let f = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    let (mut len, mut step) = (0i64, 16 * MIB as i64);
    while step >= PAGE {
        // SAFETY: a plain system call on a descriptor we own.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, len, step) } == 0 {
            len += step;
        } else {
            assert_eq!(errno(), libc::ENOSPC, "fallocate {step} bytes at {len}");
            step /= 2;
        }
    }
    f
}

/// A write-back that fits only in part. The kernel reads a write-back's
/// reply for its error alone, not for the count (fuse_writepage_end): a
/// short count would tell it the whole request was written and lose the
/// rest unreported. Here one write-back request holds the whole write, and
/// the free space is half of it.
#[test]
fn write_back_that_fits_in_part_fails_the_close() {
    if skip_unless_root() {
        return;
    }
    let mut fx = mounted_with_writeback_cache("wbc-enospc-part");
    // Created first: a full filesystem has no room for a new inode either.
    let part = fx.path("part");
    let f = File::create(&part).expect("create part");
    let filler = fill(&fx.path("filler"));
    let freed = 64 * 1024;
    // SAFETY: a plain system call on a descriptor we own.
    let punched = unsafe {
        libc::fallocate(
            filler.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            freed,
        )
    };
    assert_eq!(punched, 0, "punch {freed} bytes: errno {}", errno());
    drop(filler);
    // The punched extent is free for reuse once a commit made it durable.
    fx.sync();
    let written = f
        .write_all_at(&vec![b'p'; 2 * freed as usize], 0)
        .map_err(|e| e.raw_os_error());
    let closed = close(f);
    assert!(
        written == Err(Some(libc::ENOSPC)) || closed == Err(libc::ENOSPC),
        "{} KiB with {} KiB free: write {written:?}, close {closed:?}; the loss went unreported",
        2 * freed / 1024,
        freed / 1024
    );
    fx.remount();
    let survived = assert_only(&part, b'p');
    assert!(
        survived < 2 * freed as usize,
        "all of part fit in {freed} bytes"
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
