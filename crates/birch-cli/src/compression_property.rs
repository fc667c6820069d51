//! `birch property get|set PATH compression` (docs/COMPRESSION.md, "The
//! property"): the `btrfs.compression` xattr of a file or directory on a
//! mounted birch, read and written as btrfs-progs does. The engine checks
//! the value and keeps the inode's `c` and `m` flags in step with it.

use crate::{output, Failure};
use birch::format::COMPRESSION_PROPERTY_XATTR;
use std::ffi::CString;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn c_path(path: &Path) -> Result<CString, Failure> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Failure::new(format!("{}: path holds a NUL", path.display())))
}

fn xattr_name() -> CString {
    CString::new(COMPRESSION_PROPERTY_XATTR).expect("the property's name holds no NUL")
}

/// An errno as `%m` prints it (`Invalid argument`), without Rust's
/// `(os error N)`.
fn describe(e: &io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Prints `compression=VALUE`; nothing when the property is not set (as
/// btrfs-progs).
pub fn get(path: &Path) -> Result<(), Failure> {
    let (p, name) = (c_path(path)?, xattr_name());
    let mut value = vec![0u8; 256];
    // SAFETY: both strings are NUL terminated and `value` is writable for
    // its length, which is what getxattr(2) writes at most.
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENODATA) {
            return Ok(());
        }
        return Err(Failure::new(format!(
            "failed to get compression for {}: {}",
            path.display(),
            describe(&e)
        )));
    }
    value.truncate(n as usize);
    writeln!(
        io::stdout(),
        "compression={}",
        String::from_utf8_lossy(&value)
    )
    .map_err(output)
}

/// Sets the property: `zstd`, `lz4`, `none` / `no` (never compress), or
/// `""` (remove it: the mount's `compress=` applies again). A value birch
/// refuses (EINVAL: btrfs's `lzo` and `zlib` among them) fails naming
/// what it takes.
pub fn set(path: &Path, value: &str) -> Result<(), Failure> {
    let (p, name) = (c_path(path)?, xattr_name());
    // SAFETY: both strings are NUL terminated and `value` is readable for
    // its length.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    let hint = match e.raw_os_error() {
        Some(libc::EINVAL) => {
            " (birch takes zstd, lz4, none or no, or \"\" to remove the property; it has no lzo or zlib)"
        }
        Some(libc::EOPNOTSUPP) => " (not a birch mount?)",
        _ => "",
    };
    Err(Failure::new(format!(
        "failed to set compression for {}: {}{hint}",
        path.display(),
        describe(&e)
    )))
}
