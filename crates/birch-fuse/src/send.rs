//! `birch send` through the mount (docs/SEND.md, "Send through the
//! mount"): the ioctl's number and layout, and how the daemon reaches the
//! caller's pipe. btrfs's `BTRFS_IOC_SEND` carries the stream's file
//! descriptor and an array of clone sources behind a pointer; a FUSE
//! ioctl moves a fixed number of bytes and no descriptors, so birch's
//! carries the descriptor's number and the daemon opens it through
//! `/proc/PID/fd` of the calling process, which is blocked in the ioctl
//! until the stream ends.

use crate::subvol::{ioc, IOC_READ, IOC_WRITE};
use birch::fs::SendStats;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileTypeExt;

/// [`BIRCH_IOC_SEND`]'s argument. In: `__u64 send_fd` (the write end of a
/// pipe in the caller's process), `__u64 parent` (the parent snapshot's
/// subvolume id; 0: a full stream), `__u64 flags` (`BTRFS_SEND_FLAG_*`).
/// Out: the stream's totals, five `__u64` ([`encode_totals`]).
pub const BIRCH_SEND_ARGS_SIZE: usize = 64;
/// `_IOWR('b', 8, struct birch_send_args)`, on the root directory of the
/// read-only subvolume to send.
pub const BIRCH_IOC_SEND: u32 = ioc(IOC_READ | IOC_WRITE, b'b', 8, BIRCH_SEND_ARGS_SIZE);
/// btrfs's flags (`include/uapi/linux/btrfs.h`). NO_FILE_DATA is refused
/// (EOPNOTSUPP): birch does not write UPDATE_EXTENT streams.
pub const BTRFS_SEND_FLAG_NO_FILE_DATA: u64 = 0x1;
/// Leave out the stream header: a snapshot after the first of one stream.
pub const BTRFS_SEND_FLAG_OMIT_STREAM_HEADER: u64 = 0x2;
/// Leave out END: a snapshot before the last of one stream.
pub const BTRFS_SEND_FLAG_OMIT_END_CMD: u64 = 0x4;
const KNOWN_FLAGS: u64 = BTRFS_SEND_FLAG_NO_FILE_DATA
    | BTRFS_SEND_FLAG_OMIT_STREAM_HEADER
    | BTRFS_SEND_FLAG_OMIT_END_CMD;

/// A decoded [`BIRCH_IOC_SEND`] argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendArgs {
    pub send_fd: u64,
    pub parent: u64,
    pub flags: u64,
}

impl SendArgs {
    pub fn encode(&self) -> [u8; BIRCH_SEND_ARGS_SIZE] {
        let mut out = [0u8; BIRCH_SEND_ARGS_SIZE];
        for (i, word) in [self.send_fd, self.parent, self.flags].iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&word.to_ne_bytes());
        }
        out
    }

    /// EINVAL for a short argument or an unknown flag, EOPNOTSUPP for
    /// NO_FILE_DATA.
    pub fn decode(bytes: &[u8]) -> Result<SendArgs, i32> {
        let word = |i: usize| {
            bytes
                .get(i * 8..i * 8 + 8)
                .map(|b| u64::from_ne_bytes(b.try_into().expect("eight bytes")))
                .ok_or(libc::EINVAL)
        };
        let args = SendArgs {
            send_fd: word(0)?,
            parent: word(1)?,
            flags: word(2)?,
        };
        if args.flags & !KNOWN_FLAGS != 0 {
            return Err(libc::EINVAL);
        }
        if args.flags & BTRFS_SEND_FLAG_NO_FILE_DATA != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        Ok(args)
    }
}

/// The reply: commands, stream bytes, data bytes, inodes, tree nodes read.
pub fn encode_totals(stats: &SendStats) -> [u8; BIRCH_SEND_ARGS_SIZE] {
    let mut out = [0u8; BIRCH_SEND_ARGS_SIZE];
    let words = [
        stats.commands,
        stats.stream_bytes,
        stats.data_bytes,
        stats.inodes,
        stats.nodes_read,
    ];
    for (i, word) in words.iter().enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&word.to_ne_bytes());
    }
    out
}

/// The inverse of [`encode_totals`]; None for a reply cut short.
pub fn decode_totals(bytes: &[u8]) -> Option<SendStats> {
    let word = |i: usize| {
        bytes
            .get(i * 8..i * 8 + 8)
            .map(|b| u64::from_ne_bytes(b.try_into().expect("eight bytes")))
    };
    Some(SendStats {
        commands: word(0)?,
        stream_bytes: word(1)?,
        data_bytes: word(2)?,
        inodes: word(3)?,
        nodes_read: word(4)?,
    })
}

/// The pipe `fd` of process `pid`, opened for writing: EBADF when it
/// cannot be opened, EINVAL when it is not a pipe. Only a pipe is taken:
/// reopening a regular file through /proc would start at offset 0, not
/// where the caller's descriptor is, and the daemon has no business
/// writing anywhere but into a stream the caller reads.
pub fn open_caller_pipe(pid: u32, fd: u64) -> Result<File, i32> {
    let path = format!("/proc/{pid}/fd/{fd}");
    let file = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|_| libc::EBADF)?;
    let is_pipe = file
        .metadata()
        .map(|m| m.file_type().is_fifo())
        .unwrap_or(false);
    if !is_pipe {
        return Err(libc::EINVAL);
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_round_trip_and_bad_flags_are_refused() {
        let args = SendArgs {
            send_fd: 7,
            parent: 257,
            flags: BTRFS_SEND_FLAG_OMIT_END_CMD,
        };
        assert_eq!(SendArgs::decode(&args.encode()), Ok(args));
        let mut bad = args;
        bad.flags = 0x80;
        assert_eq!(SendArgs::decode(&bad.encode()), Err(libc::EINVAL));
        bad.flags = BTRFS_SEND_FLAG_NO_FILE_DATA;
        assert_eq!(SendArgs::decode(&bad.encode()), Err(libc::EOPNOTSUPP));
        assert_eq!(SendArgs::decode(&[0u8; 16]), Err(libc::EINVAL));
        let stats = SendStats {
            commands: 1,
            stream_bytes: 2,
            data_bytes: 3,
            inodes: 4,
            nodes_read: 5,
        };
        let back = decode_totals(&encode_totals(&stats)).unwrap();
        assert_eq!(
            (
                back.commands,
                back.stream_bytes,
                back.data_bytes,
                back.inodes,
                back.nodes_read
            ),
            (1, 2, 3, 4, 5)
        );
        assert!(decode_totals(&[0u8; 20]).is_none());
    }

    #[test]
    fn only_a_pipe_of_the_caller_is_opened() {
        let pid = std::process::id();
        let mut fds = [0; 2];
        // SAFETY: pipe fills the two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        assert!(open_caller_pipe(pid, fds[1] as u64).is_ok());
        let file = tempfile_in_tmp();
        use std::os::fd::AsRawFd;
        assert_eq!(
            open_caller_pipe(pid, file.as_raw_fd() as u64).err(),
            Some(libc::EINVAL)
        );
        assert_eq!(open_caller_pipe(pid, 1 << 30).err(), Some(libc::EBADF));
        // SAFETY: closing the descriptors pipe made.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }

    fn tempfile_in_tmp() -> File {
        let path = std::env::temp_dir().join(format!("birch-send-test-{}", std::process::id()));
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }
}
