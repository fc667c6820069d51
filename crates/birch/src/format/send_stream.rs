//! btrfs's send stream, version 1 (docs/SEND.md): what `btrfs send`
//! writes and `btrfs receive` reads, so birch and kernel btrfs can
//! replicate snapshots both ways.
//!
//! A stream is a 17-byte header (`b"btrfs-stream\0"`, u32 version 1) and
//! then commands: `len u32 | cmd u16 | crc u32` (little-endian), then
//! `len` bytes of TLV attributes `type u16 | len u16 | value`. The crc is
//! crc32c (seed 0, no final inversion: btrfs-progs' `crc32c(0, ...)`)
//! over the header with the crc field zero and the attributes.
//!
//! [`StreamReader`] validates everything it reads: every bad input is a
//! [`StreamError`] naming the command, its byte offset in the stream and
//! what is wrong, never a panic. [`StreamWriter`] encodes [`Command`]s.

use std::fmt;
use std::io::{self, Read, Write};

/// The stream's first 13 bytes.
pub const STREAM_MAGIC: &[u8; 13] = b"btrfs-stream\0";
/// The only version birch reads and writes.
pub const STREAM_VERSION: u32 = 1;
/// Magic and version.
pub const STREAM_HEADER_SIZE: usize = 17;
/// `len u32 | cmd u16 | crc u32`.
pub const COMMAND_HEADER_SIZE: usize = 10;
/// The largest command, header included: version 1's send buffer
/// (`BTRFS_SEND_BUF_SIZE_V1`, 64 KiB). A larger length is refused before
/// anything is allocated for it.
pub const MAX_COMMAND_SIZE: usize = 64 * 1024;
/// The most data one WRITE carries as `btrfs send` emits it
/// (`BTRFS_SEND_READ_SIZE`, 48 KiB); [`StreamWriter`] callers split at it.
pub const MAX_WRITE_DATA: usize = 48 * 1024;
/// Longest path attribute (`PATH_MAX`, without its NUL).
pub const MAX_PATH_LEN: usize = 4095;
/// Longest xattr name (`XATTR_NAME_MAX`).
pub const MAX_XATTR_NAME_LEN: usize = 255;

/// Command codes (`enum btrfs_send_cmd`, version 1).
pub mod cmd {
    pub const SUBVOL: u16 = 1;
    pub const SNAPSHOT: u16 = 2;
    pub const MKFILE: u16 = 3;
    pub const MKDIR: u16 = 4;
    pub const MKNOD: u16 = 5;
    pub const MKFIFO: u16 = 6;
    pub const MKSOCK: u16 = 7;
    pub const SYMLINK: u16 = 8;
    pub const RENAME: u16 = 9;
    pub const LINK: u16 = 10;
    pub const UNLINK: u16 = 11;
    pub const RMDIR: u16 = 12;
    pub const SET_XATTR: u16 = 13;
    pub const REMOVE_XATTR: u16 = 14;
    pub const WRITE: u16 = 15;
    pub const CLONE: u16 = 16;
    pub const TRUNCATE: u16 = 17;
    pub const CHMOD: u16 = 18;
    pub const CHOWN: u16 = 19;
    pub const UTIMES: u16 = 20;
    pub const END: u16 = 21;
    pub const UPDATE_EXTENT: u16 = 22;
}

/// Attribute codes (`enum btrfs_send_attr`, version 1).
pub mod attr {
    pub const UUID: u16 = 1;
    pub const CTRANSID: u16 = 2;
    pub const INO: u16 = 3;
    pub const SIZE: u16 = 4;
    pub const MODE: u16 = 5;
    pub const UID: u16 = 6;
    pub const GID: u16 = 7;
    pub const RDEV: u16 = 8;
    pub const CTIME: u16 = 9;
    pub const MTIME: u16 = 10;
    pub const ATIME: u16 = 11;
    pub const OTIME: u16 = 12;
    pub const XATTR_NAME: u16 = 13;
    pub const XATTR_DATA: u16 = 14;
    pub const PATH: u16 = 15;
    pub const PATH_TO: u16 = 16;
    pub const PATH_LINK: u16 = 17;
    pub const FILE_OFFSET: u16 = 18;
    pub const DATA: u16 = 19;
    pub const CLONE_UUID: u16 = 20;
    pub const CLONE_CTRANSID: u16 = 21;
    pub const CLONE_PATH: u16 = 22;
    pub const CLONE_OFFSET: u16 = 23;
    pub const CLONE_LEN: u16 = 24;
    /// The highest code of version 1.
    pub const MAX: u16 = CLONE_LEN;
}

/// btrfs-progs' name of a command code (`btrfs receive --dump`'s, upper
/// case), or "UNKNOWN".
pub fn command_name(code: u16) -> &'static str {
    const NAMES: [&str; 23] = [
        "UNSPEC",
        "SUBVOL",
        "SNAPSHOT",
        "MKFILE",
        "MKDIR",
        "MKNOD",
        "MKFIFO",
        "MKSOCK",
        "SYMLINK",
        "RENAME",
        "LINK",
        "UNLINK",
        "RMDIR",
        "SET_XATTR",
        "REMOVE_XATTR",
        "WRITE",
        "CLONE",
        "TRUNCATE",
        "CHMOD",
        "CHOWN",
        "UTIMES",
        "END",
        "UPDATE_EXTENT",
    ];
    NAMES.get(usize::from(code)).copied().unwrap_or("UNKNOWN")
}

/// An attribute code's name, or "UNKNOWN".
pub fn attr_name(code: u16) -> &'static str {
    const NAMES: [&str; 25] = [
        "UNSPEC",
        "UUID",
        "CTRANSID",
        "INO",
        "SIZE",
        "MODE",
        "UID",
        "GID",
        "RDEV",
        "CTIME",
        "MTIME",
        "ATIME",
        "OTIME",
        "XATTR_NAME",
        "XATTR_DATA",
        "PATH",
        "PATH_TO",
        "PATH_LINK",
        "FILE_OFFSET",
        "DATA",
        "CLONE_UUID",
        "CLONE_CTRANSID",
        "CLONE_PATH",
        "CLONE_OFFSET",
        "CLONE_LEN",
    ];
    NAMES.get(usize::from(code)).copied().unwrap_or("UNKNOWN")
}

/// `struct btrfs_timespec`: u64 seconds, u32 nanoseconds (< 10^9).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamTime {
    pub sec: u64,
    pub nsec: u32,
}

/// A path inside the subvolume being received, relative to its root
/// ("" is the root itself): no leading '/', no `..` or `.` component, no
/// empty component, no NUL, at most [`MAX_PATH_LEN`] bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamPath(Vec<u8>);

impl StreamPath {
    /// Validates `bytes` as a stream path; the error says what is wrong.
    pub fn new(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() > MAX_PATH_LEN {
            return Err(format!(
                "path of {} bytes, more than {MAX_PATH_LEN}",
                bytes.len()
            ));
        }
        if bytes.contains(&0) {
            return Err("path holds a NUL byte".into());
        }
        if bytes.first() == Some(&b'/') {
            return Err(format!(
                "absolute path {:?}",
                String::from_utf8_lossy(bytes)
            ));
        }
        if !bytes.is_empty() {
            for part in bytes.split(|&b| b == b'/') {
                if part.is_empty() || part == b"." || part == b".." {
                    return Err(format!(
                        "path {:?} has a {:?} component",
                        String::from_utf8_lossy(bytes),
                        String::from_utf8_lossy(part)
                    ));
                }
            }
        }
        Ok(StreamPath(bytes.to_vec()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Display for StreamPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", String::from_utf8_lossy(&self.0))
    }
}

/// One command of a stream, with the attributes btrfs-progs' receive
/// requires of it (`common/send-stream.c`; so the INO of the six
/// commands that create an inode, which receive itself does not use:
/// btrfs-progs refuses a creation without it). Attributes it does not
/// read are accepted and not kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// A full stream: a new subvolume named `path`.
    Subvol {
        path: StreamPath,
        uuid: [u8; 16],
        ctransid: u64,
    },
    /// An incremental stream: a snapshot of the subvolume received (or
    /// sent) as `clone_uuid` at `clone_ctransid`, named `path`.
    Snapshot {
        path: StreamPath,
        uuid: [u8; 16],
        ctransid: u64,
        clone_uuid: [u8; 16],
        clone_ctransid: u64,
    },
    Mkfile {
        path: StreamPath,
        ino: u64,
    },
    Mkdir {
        path: StreamPath,
        ino: u64,
    },
    Mknod {
        path: StreamPath,
        ino: u64,
        mode: u64,
        rdev: u64,
    },
    Mkfifo {
        path: StreamPath,
        ino: u64,
    },
    Mksock {
        path: StreamPath,
        ino: u64,
    },
    /// `target` is the link's content: any bytes but NUL.
    Symlink {
        path: StreamPath,
        ino: u64,
        target: Vec<u8>,
    },
    Rename {
        from: StreamPath,
        to: StreamPath,
    },
    /// A new name `path` for the existing file `existing`.
    Link {
        path: StreamPath,
        existing: StreamPath,
    },
    Unlink {
        path: StreamPath,
    },
    Rmdir {
        path: StreamPath,
    },
    SetXattr {
        path: StreamPath,
        name: Vec<u8>,
        data: Vec<u8>,
    },
    RemoveXattr {
        path: StreamPath,
        name: Vec<u8>,
    },
    Write {
        path: StreamPath,
        offset: u64,
        data: Vec<u8>,
    },
    /// Copy (reflink) `len` bytes at `clone_offset` of `clone_path` in the
    /// subvolume `clone_uuid` to `offset` of `path`.
    Clone {
        path: StreamPath,
        offset: u64,
        len: u64,
        clone_uuid: [u8; 16],
        clone_ctransid: u64,
        clone_path: StreamPath,
        clone_offset: u64,
    },
    Truncate {
        path: StreamPath,
        size: u64,
    },
    Chmod {
        path: StreamPath,
        mode: u64,
    },
    Chown {
        path: StreamPath,
        uid: u64,
        gid: u64,
    },
    Utimes {
        path: StreamPath,
        atime: StreamTime,
        mtime: StreamTime,
        ctime: StreamTime,
    },
    /// A `--no-data` stream's note that `size` bytes at `offset` changed.
    UpdateExtent {
        path: StreamPath,
        offset: u64,
        size: u64,
    },
    End,
}

/// An attribute's value, for encoding.
enum Value<'a> {
    U64(u64),
    Bytes(&'a [u8]),
    Time(StreamTime),
}

impl Command {
    /// The command's code.
    pub fn code(&self) -> u16 {
        match self {
            Command::Subvol { .. } => cmd::SUBVOL,
            Command::Snapshot { .. } => cmd::SNAPSHOT,
            Command::Mkfile { .. } => cmd::MKFILE,
            Command::Mkdir { .. } => cmd::MKDIR,
            Command::Mknod { .. } => cmd::MKNOD,
            Command::Mkfifo { .. } => cmd::MKFIFO,
            Command::Mksock { .. } => cmd::MKSOCK,
            Command::Symlink { .. } => cmd::SYMLINK,
            Command::Rename { .. } => cmd::RENAME,
            Command::Link { .. } => cmd::LINK,
            Command::Unlink { .. } => cmd::UNLINK,
            Command::Rmdir { .. } => cmd::RMDIR,
            Command::SetXattr { .. } => cmd::SET_XATTR,
            Command::RemoveXattr { .. } => cmd::REMOVE_XATTR,
            Command::Write { .. } => cmd::WRITE,
            Command::Clone { .. } => cmd::CLONE,
            Command::Truncate { .. } => cmd::TRUNCATE,
            Command::Chmod { .. } => cmd::CHMOD,
            Command::Chown { .. } => cmd::CHOWN,
            Command::Utimes { .. } => cmd::UTIMES,
            Command::UpdateExtent { .. } => cmd::UPDATE_EXTENT,
            Command::End => cmd::END,
        }
    }

    /// The attributes in the order `btrfs send` writes them.
    ///
    /// Long because it is one table: an arm per command, listing its
    /// attributes.
    fn attributes(&self) -> Vec<(u16, Value<'_>)> {
        use Value::{Bytes, Time, U64};
        fn p(path: &StreamPath) -> (u16, Value<'_>) {
            (attr::PATH, Value::Bytes(path.as_bytes()))
        }
        match self {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            } => vec![
                p(path),
                (attr::UUID, Bytes(uuid)),
                (attr::CTRANSID, U64(*ctransid)),
            ],
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            } => vec![
                p(path),
                (attr::UUID, Bytes(uuid)),
                (attr::CTRANSID, U64(*ctransid)),
                (attr::CLONE_UUID, Bytes(clone_uuid)),
                (attr::CLONE_CTRANSID, U64(*clone_ctransid)),
            ],
            Command::Mkfile { path, ino }
            | Command::Mkdir { path, ino }
            | Command::Mkfifo { path, ino }
            | Command::Mksock { path, ino } => vec![p(path), (attr::INO, U64(*ino))],
            Command::Unlink { path } | Command::Rmdir { path } => vec![p(path)],
            Command::Mknod {
                path,
                ino,
                mode,
                rdev,
            } => vec![
                p(path),
                (attr::INO, U64(*ino)),
                (attr::MODE, U64(*mode)),
                (attr::RDEV, U64(*rdev)),
            ],
            Command::Symlink { path, ino, target } => vec![
                p(path),
                (attr::INO, U64(*ino)),
                (attr::PATH_LINK, Bytes(target)),
            ],
            Command::Rename { from, to } => vec![p(from), (attr::PATH_TO, Bytes(to.as_bytes()))],
            Command::Link { path, existing } => {
                vec![p(path), (attr::PATH_LINK, Bytes(existing.as_bytes()))]
            }
            Command::SetXattr { path, name, data } => vec![
                p(path),
                (attr::XATTR_NAME, Bytes(name)),
                (attr::XATTR_DATA, Bytes(data)),
            ],
            Command::RemoveXattr { path, name } => vec![p(path), (attr::XATTR_NAME, Bytes(name))],
            Command::Write { path, offset, data } => vec![
                p(path),
                (attr::FILE_OFFSET, U64(*offset)),
                (attr::DATA, Bytes(data)),
            ],
            Command::Clone {
                path,
                offset,
                len,
                clone_uuid,
                clone_ctransid,
                clone_path,
                clone_offset,
            } => vec![
                p(path),
                (attr::FILE_OFFSET, U64(*offset)),
                (attr::CLONE_LEN, U64(*len)),
                (attr::CLONE_UUID, Bytes(clone_uuid)),
                (attr::CLONE_CTRANSID, U64(*clone_ctransid)),
                (attr::CLONE_PATH, Bytes(clone_path.as_bytes())),
                (attr::CLONE_OFFSET, U64(*clone_offset)),
            ],
            Command::Truncate { path, size } => vec![p(path), (attr::SIZE, U64(*size))],
            Command::Chmod { path, mode } => vec![p(path), (attr::MODE, U64(*mode))],
            Command::Chown { path, uid, gid } => {
                vec![p(path), (attr::UID, U64(*uid)), (attr::GID, U64(*gid))]
            }
            Command::Utimes {
                path,
                atime,
                mtime,
                ctime,
            } => vec![
                p(path),
                (attr::ATIME, Time(*atime)),
                (attr::MTIME, Time(*mtime)),
                (attr::CTIME, Time(*ctime)),
            ],
            Command::UpdateExtent { path, offset, size } => vec![
                p(path),
                (attr::FILE_OFFSET, U64(*offset)),
                (attr::SIZE, U64(*size)),
            ],
            Command::End => vec![],
        }
    }

    /// The command's bytes: header (crc filled in) and attributes. None
    /// when it would exceed [`MAX_COMMAND_SIZE`] or an attribute 65535
    /// bytes.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let mut out = vec![0u8; COMMAND_HEADER_SIZE];
        for (code, value) in self.attributes() {
            let time;
            let u;
            let bytes: &[u8] = match value {
                Value::U64(v) => {
                    u = v.to_le_bytes();
                    &u
                }
                Value::Bytes(b) => b,
                Value::Time(t) => {
                    let mut b = [0u8; 12];
                    b[..8].copy_from_slice(&t.sec.to_le_bytes());
                    b[8..].copy_from_slice(&t.nsec.to_le_bytes());
                    time = b;
                    &time
                }
            };
            out.extend_from_slice(&code.to_le_bytes());
            out.extend_from_slice(&u16::try_from(bytes.len()).ok()?.to_le_bytes());
            out.extend_from_slice(bytes);
        }
        if out.len() > MAX_COMMAND_SIZE {
            return None;
        }
        let len = u32::try_from(out.len() - COMMAND_HEADER_SIZE).ok()?;
        out[0..4].copy_from_slice(&len.to_le_bytes());
        out[4..6].copy_from_slice(&self.code().to_le_bytes());
        let crc = stream_crc(&out);
        out[6..10].copy_from_slice(&crc.to_le_bytes());
        Some(out)
    }
}

/// btrfs-progs' `crc32c(0, bytes)`: the raw CRC-32C register, seed 0,
/// neither inverted on the way in nor on the way out. The `crc32c` crate
/// inverts both, so invert around it.
pub fn stream_crc(bytes: &[u8]) -> u32 {
    !crc32c::crc32c_append(!0, bytes)
}

/// What is wrong with a stream, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamError {
    /// Byte offset of the command (or of the stream header) in the stream.
    pub offset: u64,
    /// The command's name, or "stream header" / "command header".
    pub command: String,
    pub what: String,
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "send stream: {} at byte {}: {}",
            self.command, self.offset, self.what
        )
    }
}

impl std::error::Error for StreamError {}

/// Reads and validates a stream's commands. Several streams written one
/// after another (each with its header, as `btrfs send A B` may) read as
/// one: a header may follow an END.
pub struct StreamReader<R> {
    input: R,
    /// Bytes consumed so far.
    offset: u64,
    /// Whether the last command was END (a new header may follow).
    after_end: bool,
}

/// How [`StreamReader::fill`] ended.
enum Fill {
    Full,
    /// Clean end of input before the first byte.
    Empty,
    /// Input ended after this many bytes.
    Short(usize),
}

impl<R: Read> StreamReader<R> {
    /// Reads and checks the stream header.
    pub fn new(input: R) -> Result<Self, StreamError> {
        let mut reader = StreamReader {
            input,
            offset: 0,
            after_end: false,
        };
        let mut header = [0u8; STREAM_HEADER_SIZE];
        reader.read_header(0, &mut header, 0)?;
        Ok(reader)
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn error(&self, offset: u64, command: &str, what: impl Into<String>) -> StreamError {
        StreamError {
            offset,
            command: command.to_string(),
            what: what.into(),
        }
    }

    fn fill(&mut self, buf: &mut [u8]) -> Result<Fill, StreamError> {
        let mut got = 0;
        while got < buf.len() {
            match self.input.read(&mut buf[got..]) {
                Ok(0) => {
                    return Ok(if got == 0 {
                        Fill::Empty
                    } else {
                        Fill::Short(got)
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(self.error(self.offset, "input", format!("read failed: {e}")))
                }
            }
        }
        Ok(Fill::Full)
    }

    /// Reads the rest of a stream header starting at byte `start`, whose
    /// first bytes are already in `header[..have]`, and checks it.
    fn read_header(
        &mut self,
        start: u64,
        header: &mut [u8; STREAM_HEADER_SIZE],
        have: usize,
    ) -> Result<(), StreamError> {
        match self.fill(&mut header[have..])? {
            Fill::Full => {}
            Fill::Empty | Fill::Short(_) => {
                return Err(self.error(start, "stream header", "stream ends inside its header"))
            }
        }
        self.offset = start + STREAM_HEADER_SIZE as u64;
        if &header[..13] != STREAM_MAGIC {
            return Err(self.error(start, "stream header", "no \"btrfs-stream\" magic"));
        }
        let version = u32::from_le_bytes(header[13..17].try_into().expect("four bytes"));
        if version != STREAM_VERSION {
            return Err(self.error(
                start,
                "stream header",
                format!("version {version}; birch reads version {STREAM_VERSION} only"),
            ));
        }
        Ok(())
    }

    /// The next command and its byte offset; `None` at a clean end of the
    /// input (between commands).
    pub fn next_command(&mut self) -> Result<Option<(u64, Command)>, StreamError> {
        let start = self.offset;
        let mut header = [0u8; COMMAND_HEADER_SIZE];
        match self.fill(&mut header)? {
            Fill::Full => {}
            Fill::Empty => return Ok(None),
            Fill::Short(n) => {
                return Err(self.error(
                    start,
                    "command header",
                    format!("stream ends {n} bytes into a command header"),
                ))
            }
        }
        self.offset += COMMAND_HEADER_SIZE as u64;
        if self.after_end && header[..4] == STREAM_MAGIC[..4] {
            // A second stream's header (no command is that long).
            let mut full = [0u8; STREAM_HEADER_SIZE];
            full[..COMMAND_HEADER_SIZE].copy_from_slice(&header);
            self.read_header(start, &mut full, COMMAND_HEADER_SIZE)?;
            self.after_end = false;
            return self.next_command();
        }
        let len = u32::from_le_bytes(header[0..4].try_into().expect("four bytes")) as usize;
        let code = u16::from_le_bytes(header[4..6].try_into().expect("two bytes"));
        let crc = u32::from_le_bytes(header[6..10].try_into().expect("four bytes"));
        let name = command_name(code);
        if code == 0 || code > cmd::UPDATE_EXTENT {
            return Err(self.error(start, name, format!("unknown command {code}")));
        }
        if len > MAX_COMMAND_SIZE - COMMAND_HEADER_SIZE {
            return Err(self.error(
                start,
                name,
                format!(
                    "length {len} is more than a command may hold ({})",
                    MAX_COMMAND_SIZE - COMMAND_HEADER_SIZE
                ),
            ));
        }
        let mut buf = vec![0u8; COMMAND_HEADER_SIZE + len];
        buf[..COMMAND_HEADER_SIZE].copy_from_slice(&header);
        match self.fill(&mut buf[COMMAND_HEADER_SIZE..])? {
            Fill::Full => {}
            Fill::Empty => {
                return Err(self.error(
                    start,
                    name,
                    format!("stream ends before its {len} bytes of attributes"),
                ))
            }
            Fill::Short(n) => {
                return Err(self.error(
                    start,
                    name,
                    format!("stream ends {n} bytes into its {len} bytes of attributes"),
                ))
            }
        }
        self.offset += len as u64;
        buf[6..10].fill(0);
        let computed = stream_crc(&buf);
        if computed != crc {
            return Err(self.error(
                start,
                name,
                format!("crc32c {computed:#010x}, header says {crc:#010x}"),
            ));
        }
        let attrs = Attrs::parse(&buf[COMMAND_HEADER_SIZE..])
            .map_err(|what| self.error(start, name, what))?;
        let command = attrs
            .command(code)
            .map_err(|what| self.error(start, name, what))?;
        self.after_end = command == Command::End;
        Ok(Some((start, command)))
    }
}

/// A command's attributes by code (index = code), each at most once.
struct Attrs<'a> {
    values: [Option<&'a [u8]>; attr::MAX as usize + 1],
}

impl<'a> Attrs<'a> {
    fn parse(mut bytes: &'a [u8]) -> Result<Self, String> {
        let mut values = [None; attr::MAX as usize + 1];
        let total = bytes.len();
        while !bytes.is_empty() {
            let at = total - bytes.len();
            let Some(head) = bytes.get(..4) else {
                return Err(format!(
                    "attribute header at byte {at} of the command's attributes is cut short"
                ));
            };
            let code = u16::from_le_bytes([head[0], head[1]]);
            let len = usize::from(u16::from_le_bytes([head[2], head[3]]));
            let Some(value) = bytes.get(4..4 + len) else {
                return Err(format!(
                    "attribute {} ({code}) of {len} bytes runs past the command's end",
                    attr_name(code)
                ));
            };
            let slot = values
                .get_mut(usize::from(code))
                .filter(|_| code != 0)
                .ok_or_else(|| format!("unknown attribute {code}"))?;
            if slot.is_some() {
                return Err(format!("attribute {} appears twice", attr_name(code)));
            }
            *slot = Some(value);
            bytes = &bytes[4 + len..];
        }
        Ok(Attrs { values })
    }

    fn raw(&self, code: u16) -> Result<&'a [u8], String> {
        self.values[usize::from(code)]
            .ok_or_else(|| format!("missing attribute {}", attr_name(code)))
    }

    fn u64(&self, code: u16) -> Result<u64, String> {
        let v = self.raw(code)?;
        let b: [u8; 8] = v
            .try_into()
            .map_err(|_| format!("attribute {} has {} bytes, not 8", attr_name(code), v.len()))?;
        Ok(u64::from_le_bytes(b))
    }

    fn uuid(&self, code: u16) -> Result<[u8; 16], String> {
        let v = self.raw(code)?;
        v.try_into().map_err(|_| {
            format!(
                "attribute {} has {} bytes, not 16",
                attr_name(code),
                v.len()
            )
        })
    }

    fn time(&self, code: u16) -> Result<StreamTime, String> {
        let v = self.raw(code)?;
        if v.len() != 12 {
            return Err(format!(
                "attribute {} has {} bytes, not 12",
                attr_name(code),
                v.len()
            ));
        }
        let sec = u64::from_le_bytes(v[..8].try_into().expect("eight bytes"));
        let nsec = u32::from_le_bytes(v[8..].try_into().expect("four bytes"));
        if nsec >= 1_000_000_000 {
            return Err(format!(
                "attribute {} has {nsec} nanoseconds",
                attr_name(code)
            ));
        }
        Ok(StreamTime { sec, nsec })
    }

    fn path(&self, code: u16) -> Result<StreamPath, String> {
        StreamPath::new(self.raw(code)?).map_err(|e| format!("attribute {}: {e}", attr_name(code)))
    }

    /// A name that is one path component's worth of bytes: nonempty, no
    /// NUL, at most `max`.
    fn name(&self, code: u16, max: usize) -> Result<Vec<u8>, String> {
        let v = self.raw(code)?;
        if v.is_empty() || v.len() > max || v.contains(&0) {
            return Err(format!(
                "attribute {} is {} bytes (1..={max}, no NUL)",
                attr_name(code),
                v.len()
            ));
        }
        Ok(v.to_vec())
    }

    /// The typed command `code` from these attributes.
    ///
    /// Long because it is one table: an arm per command of version 1,
    /// naming the attributes it requires.
    fn command(&self, code: u16) -> Result<Command, String> {
        use attr::*;
        Ok(match code {
            cmd::SUBVOL => Command::Subvol {
                path: self.subvolume_name()?,
                uuid: self.uuid(UUID)?,
                ctransid: self.u64(CTRANSID)?,
            },
            cmd::SNAPSHOT => Command::Snapshot {
                path: self.subvolume_name()?,
                uuid: self.uuid(UUID)?,
                ctransid: self.u64(CTRANSID)?,
                clone_uuid: self.uuid(CLONE_UUID)?,
                clone_ctransid: self.u64(CLONE_CTRANSID)?,
            },
            cmd::MKFILE => Command::Mkfile {
                path: self.path(PATH)?,
                ino: self.u64(INO)?,
            },
            cmd::MKDIR => Command::Mkdir {
                path: self.path(PATH)?,
                ino: self.u64(INO)?,
            },
            cmd::MKNOD => Command::Mknod {
                path: self.path(PATH)?,
                ino: self.u64(INO)?,
                mode: self.u64(MODE)?,
                rdev: self.u64(RDEV)?,
            },
            cmd::MKFIFO => Command::Mkfifo {
                path: self.path(PATH)?,
                ino: self.u64(INO)?,
            },
            cmd::MKSOCK => Command::Mksock {
                path: self.path(PATH)?,
                ino: self.u64(INO)?,
            },
            cmd::SYMLINK => Command::Symlink {
                path: self.path(PATH)?,
                ino: self.u64(INO)?,
                target: self.name(PATH_LINK, MAX_PATH_LEN)?,
            },
            cmd::RENAME => Command::Rename {
                from: self.path(PATH)?,
                to: self.path(PATH_TO)?,
            },
            cmd::LINK => Command::Link {
                path: self.path(PATH)?,
                existing: self.path(PATH_LINK)?,
            },
            cmd::UNLINK => Command::Unlink {
                path: self.path(PATH)?,
            },
            cmd::RMDIR => Command::Rmdir {
                path: self.path(PATH)?,
            },
            cmd::SET_XATTR => Command::SetXattr {
                path: self.path(PATH)?,
                name: self.name(XATTR_NAME, MAX_XATTR_NAME_LEN)?,
                data: self.raw(XATTR_DATA)?.to_vec(),
            },
            cmd::REMOVE_XATTR => Command::RemoveXattr {
                path: self.path(PATH)?,
                name: self.name(XATTR_NAME, MAX_XATTR_NAME_LEN)?,
            },
            cmd::WRITE => Command::Write {
                path: self.path(PATH)?,
                offset: self.u64(FILE_OFFSET)?,
                data: self.raw(DATA)?.to_vec(),
            },
            cmd::CLONE => Command::Clone {
                path: self.path(PATH)?,
                offset: self.u64(FILE_OFFSET)?,
                len: self.u64(CLONE_LEN)?,
                clone_uuid: self.uuid(CLONE_UUID)?,
                clone_ctransid: self.u64(CLONE_CTRANSID)?,
                clone_path: self.path(CLONE_PATH)?,
                clone_offset: self.u64(CLONE_OFFSET)?,
            },
            cmd::TRUNCATE => Command::Truncate {
                path: self.path(PATH)?,
                size: self.u64(SIZE)?,
            },
            cmd::CHMOD => Command::Chmod {
                path: self.path(PATH)?,
                mode: self.u64(MODE)?,
            },
            cmd::CHOWN => Command::Chown {
                path: self.path(PATH)?,
                uid: self.u64(UID)?,
                gid: self.u64(GID)?,
            },
            cmd::UTIMES => Command::Utimes {
                path: self.path(PATH)?,
                atime: self.time(ATIME)?,
                mtime: self.time(MTIME)?,
                ctime: self.time(CTIME)?,
            },
            cmd::UPDATE_EXTENT => Command::UpdateExtent {
                path: self.path(PATH)?,
                offset: self.u64(FILE_OFFSET)?,
                size: self.u64(SIZE)?,
            },
            cmd::END => Command::End,
            other => return Err(format!("unknown command {other}")),
        })
    }

    /// SUBVOL's and SNAPSHOT's PATH: the new subvolume's name, one
    /// nonempty component.
    fn subvolume_name(&self) -> Result<StreamPath, String> {
        let path = self.path(attr::PATH)?;
        if path.as_bytes().is_empty() || path.as_bytes().contains(&b'/') {
            return Err(format!(
                "attribute PATH: subvolume name {:?} is not one nonempty component",
                path.to_string()
            ));
        }
        Ok(path)
    }
}

/// Writes a stream: the header at [`StreamWriter::new`], then commands.
pub struct StreamWriter<W> {
    output: W,
    /// Bytes written so far.
    written: u64,
}

impl<W: Write> StreamWriter<W> {
    pub fn new(mut output: W) -> io::Result<Self> {
        output.write_all(STREAM_MAGIC)?;
        output.write_all(&STREAM_VERSION.to_le_bytes())?;
        Ok(StreamWriter {
            output,
            written: STREAM_HEADER_SIZE as u64,
        })
    }

    /// Encodes and writes one command; InvalidInput if it is too large
    /// for a command (a WRITE of more than [`MAX_WRITE_DATA`] may be).
    pub fn write(&mut self, command: &Command) -> io::Result<()> {
        let bytes = command.encode().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "send stream: {} is larger than a command may be",
                    command_name(command.code())
                ),
            )
        })?;
        self.output.write_all(&bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn into_inner(self) -> W {
        self.output
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(s: &str) -> StreamPath {
        StreamPath::new(s.as_bytes()).unwrap()
    }

    fn stream(commands: &[Command]) -> Vec<u8> {
        let mut w = StreamWriter::new(Vec::new()).unwrap();
        for c in commands {
            w.write(c).unwrap();
        }
        w.into_inner()
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<Command>, StreamError> {
        let mut r = StreamReader::new(bytes)?;
        let mut out = Vec::new();
        while let Some((_, c)) = r.next_command()? {
            out.push(c);
        }
        Ok(out)
    }

    #[test]
    fn commands_round_trip() {
        let commands = vec![
            Command::Subvol {
                path: path("snap"),
                uuid: [7; 16],
                ctransid: 9,
            },
            Command::Mkfile {
                path: path("o257-7-0"),
                ino: 257,
            },
            Command::Rename {
                from: path("o257-7-0"),
                to: path("d/a"),
            },
            Command::Symlink {
                path: path("l"),
                ino: 258,
                target: b"../../etc".to_vec(),
            },
            Command::Write {
                path: path("d/a"),
                offset: 4096,
                data: vec![0xab; MAX_WRITE_DATA],
            },
            Command::Utimes {
                path: path(""),
                atime: StreamTime { sec: 1, nsec: 2 },
                mtime: StreamTime { sec: 3, nsec: 4 },
                ctime: StreamTime {
                    sec: 5,
                    nsec: 999_999_999,
                },
            },
            Command::End,
        ];
        assert_eq!(read_all(&stream(&commands)).unwrap(), commands);
    }

    /// The crc of a command `btrfs send` (kernel 6.1) wrote: SUBVOL "s1".
    #[test]
    fn crc_matches_a_kernel_stream() {
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&[
            0xd8, 0xa3, 0x85, 0x1a, 0xfb, 0x91, 0x60, 0x46, 0xab, 0x8e, 0x5c, 0x7f, 0x07, 0x23,
            0x7c, 0xb0,
        ]);
        let bytes = Command::Subvol {
            path: path("s1"),
            uuid,
            ctransid: 7,
        }
        .encode()
        .unwrap();
        assert_eq!(&bytes[..10], &[0x26, 0, 0, 0, 1, 0, 0x00, 0xdb, 0x05, 0x5d]);
    }

    #[test]
    fn bad_paths_are_refused() {
        for bad in ["/etc", "a/../b", "..", "a//b", "a/", "./a", "a\0b"] {
            assert!(StreamPath::new(bad.as_bytes()).is_err(), "{bad:?}");
        }
        for good in ["", "a", "a/b", "..a", "a.."] {
            assert!(StreamPath::new(good.as_bytes()).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn errors_name_command_offset_and_fault() {
        let good = stream(&[
            Command::Mkdir {
                path: path("d"),
                ino: 259,
            },
            Command::Unlink { path: path("d/x") },
        ]);
        let second = STREAM_HEADER_SIZE
            + Command::Mkdir {
                path: path("d"),
                ino: 259,
            }
            .encode()
            .unwrap()
            .len();
        // Truncated inside the second command.
        let e = read_all(&good[..good.len() - 1]).unwrap_err();
        assert_eq!((e.offset, e.command.as_str()), (second as u64, "UNLINK"));
        assert!(e.what.contains("stream ends"), "{e}");
        // Bad crc.
        let mut bad = good.clone();
        *bad.last_mut().unwrap() ^= 1;
        let e = read_all(&bad).unwrap_err();
        assert!(e.what.contains("crc32c"), "{e}");
        assert_eq!(e.offset, second as u64);
        // Unknown command.
        let mut bad = good.clone();
        bad[second + 4] = 99;
        let e = read_all(&bad).unwrap_err();
        assert!(e.what.contains("unknown command 99"), "{e}");
        // `..` in a path, with a good crc.
        let mut cmd = Command::Unlink { path: path("d/xx") }.encode().unwrap();
        let at = cmd.len() - 2;
        cmd[at..].copy_from_slice(b"..");
        cmd[6..10].fill(0);
        let crc = stream_crc(&cmd);
        cmd[6..10].copy_from_slice(&crc.to_le_bytes());
        let mut bad = stream(&[]);
        bad.extend_from_slice(&cmd);
        let e = read_all(&bad).unwrap_err();
        assert_eq!(
            e.to_string(),
            "send stream: UNLINK at byte 17: attribute PATH: path \"d/..\" has a \"..\" component"
        );
        // Oversize length.
        let mut bad = stream(&[]);
        bad.extend_from_slice(&[0xff, 0xff, 0xff, 0x00, 3, 0, 0, 0, 0, 0]);
        let e = read_all(&bad).unwrap_err();
        assert!(e.what.contains("more than a command may hold"), "{e}");
        // Not a stream.
        let e = read_all(b"btrfs-strean\0\x01\0\0\0").unwrap_err();
        assert_eq!(e.command, "stream header");
    }

    #[test]
    fn a_second_stream_may_follow_end() {
        let one = stream(&[
            Command::Mkdir {
                path: path("d"),
                ino: 259,
            },
            Command::End,
        ]);
        let mut two = one.clone();
        two.extend_from_slice(&one);
        assert_eq!(read_all(&two).unwrap().len(), 4);
        // But not in the middle of one.
        let mut bad = stream(&[Command::Mkdir {
            path: path("d"),
            ino: 259,
        }]);
        bad.extend_from_slice(&one);
        assert!(read_all(&bad).is_err());
    }
}
