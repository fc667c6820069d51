//! Counts of the FUSE requests the kernel sent this mount, by opcode.
//!
//! Every round trip through /dev/fuse costs tens of microseconds, so the
//! mix of requests a workload causes is the first thing to look at when a
//! mount is slow (docs/FUSE.md, "Requests per operation"). The kernel's
//! `fuse:fuse_request_send` tracepoint shows the same mix, but for every
//! FUSE connection on the machine and only for root; these counters are
//! per mount and shown by `birch stats`. One relaxed atomic add per
//! request.

use std::sync::atomic::{AtomicU64, Ordering};

/// One past the highest opcode counted (FUSE_STATX = 52); higher ones
/// (none on Linux today) are counted together as "other".
const SLOTS: usize = 53;
const FUSE_IOCTL: usize = 39;

pub struct RequestCounts {
    by_opcode: [AtomicU64; SLOTS],
    other: AtomicU64,
}

impl Default for RequestCounts {
    fn default() -> Self {
        RequestCounts {
            by_opcode: std::array::from_fn(|_| AtomicU64::new(0)),
            other: AtomicU64::new(0),
        }
    }
}

/// The kernel's names (`enum fuse_opcode` in linux/fuse.h, without the
/// `FUSE_` prefix), so the counts read like the tracepoint's.
pub(crate) fn opcode_name(opcode: usize) -> Option<&'static str> {
    Some(match opcode {
        1 => "LOOKUP",
        2 => "FORGET",
        3 => "GETATTR",
        4 => "SETATTR",
        5 => "READLINK",
        6 => "SYMLINK",
        8 => "MKNOD",
        9 => "MKDIR",
        10 => "UNLINK",
        11 => "RMDIR",
        12 => "RENAME",
        13 => "LINK",
        14 => "OPEN",
        15 => "READ",
        16 => "WRITE",
        17 => "STATFS",
        18 => "RELEASE",
        20 => "FSYNC",
        21 => "SETXATTR",
        22 => "GETXATTR",
        23 => "LISTXATTR",
        24 => "REMOVEXATTR",
        25 => "FLUSH",
        26 => "INIT",
        27 => "OPENDIR",
        28 => "READDIR",
        29 => "RELEASEDIR",
        30 => "FSYNCDIR",
        31 => "GETLK",
        32 => "SETLK",
        33 => "SETLKW",
        34 => "ACCESS",
        35 => "CREATE",
        36 => "INTERRUPT",
        37 => "BMAP",
        38 => "DESTROY",
        39 => "IOCTL",
        40 => "POLL",
        41 => "NOTIFY_REPLY",
        42 => "BATCH_FORGET",
        43 => "FALLOCATE",
        44 => "READDIRPLUS",
        45 => "RENAME2",
        46 => "LSEEK",
        47 => "COPY_FILE_RANGE",
        48 => "SETUPMAPPING",
        49 => "REMOVEMAPPING",
        50 => "SYNCFS",
        51 => "TMPFILE",
        52 => "STATX",
        _ => return None,
    })
}

impl RequestCounts {
    pub fn record(&self, opcode: u32) {
        let slot = self.by_opcode.get(opcode as usize).unwrap_or(&self.other);
        slot.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests the workload sent: every one but IOCTL (`birch stats` and
    /// `birch sync` are ioctls, and watching a mount must not keep it from
    /// counting as idle: docs/MEMORY.md).
    pub fn workload_requests(&self) -> u64 {
        let ioctl = self.by_opcode[FUSE_IOCTL].load(Ordering::Relaxed);
        let all: u64 = self
            .by_opcode
            .iter()
            .chain([&self.other])
            .map(|n| n.load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add);
        all.wrapping_sub(ioctl)
    }

    /// Every named opcode's count, zeros included, in opcode order, then
    /// "other" (the opcodes without a name, summed).
    pub fn by_opcode(&self) -> Vec<(&'static str, u64)> {
        let mut other = self.other.load(Ordering::Relaxed);
        let mut counts = Vec::new();
        for (op, n) in self.by_opcode.iter().enumerate() {
            let n = n.load(Ordering::Relaxed);
            match opcode_name(op) {
                Some(name) => counts.push((name, n)),
                None => other += n,
            }
        }
        counts.push(("other", other));
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::RequestCounts;

    #[test]
    fn counts_every_opcode_in_order() {
        let counts = RequestCounts::default();
        for op in [1, 3, 3, 35, 3, 1, 99, 7] {
            counts.record(op);
        }
        // 7 has no name (CUSE's unused slot) and 99 is beyond the table.
        let by_opcode = counts.by_opcode();
        let nonzero: Vec<_> = by_opcode.iter().filter(|c| c.1 > 0).collect();
        assert_eq!(
            nonzero,
            [
                &("LOOKUP", 2),
                &("GETATTR", 3),
                &("CREATE", 1),
                &("other", 2)
            ]
        );
        assert_eq!(by_opcode.len(), 51, "50 named opcodes and other");
        counts.record(39);
        assert_eq!(counts.workload_requests(), 8, "IOCTL is not workload");
    }
}
