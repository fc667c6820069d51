use super::{check_range, BlockDevice};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// An image file or a block device, accessed with pread/pwrite; flush is
/// fdatasync. With `direct_io`, the file is opened O_DIRECT and every access
/// goes through a 4 KiB-aligned bounce buffer.
pub struct FileDevice {
    file: File,
    size_bytes: u64,
    direct_io: bool,
    /// Opened for writing (not by [`FileDevice::open_read_only`]).
    writable: bool,
}

const DIRECT_IO_ALIGN: usize = 4096;

impl FileDevice {
    /// Opens an existing image file or block device read-write.
    pub fn open(path: &Path, direct_io: bool) -> io::Result<Self> {
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if direct_io {
            options.custom_flags(libc::O_DIRECT);
        }
        let file = options.open(path)?;
        let size_bytes = device_size(&file)?;
        let dev = FileDevice {
            file,
            size_bytes,
            direct_io,
            writable: true,
        };
        if direct_io {
            dev.probe_direct_io()?;
        }
        Ok(dev)
    }

    /// Some filesystems accept O_DIRECT at open and then fail every such
    /// read or write with EINVAL (FUSE without direct I/O support, some
    /// network filesystems). One aligned read of the first block finds out
    /// now, with the same EINVAL an open refusing O_DIRECT gives, so the
    /// caller can fall back to buffered I/O before the filesystem trusts
    /// the device.
    fn probe_direct_io(&self) -> io::Result<()> {
        if self.size_bytes < DIRECT_IO_ALIGN as u64 {
            // Too small for an aligned read; mounting fails on it anyway.
            return Ok(());
        }
        let mut bounce = AlignedBuffer::new(DIRECT_IO_ALIGN);
        self.file.read_exact_at(bounce.as_mut(), 0)
    }

    /// Opens read-only (for `check` and `dump`, which must never write, and
    /// a read-only mount of an image its user cannot write).
    pub fn open_read_only(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        let size_bytes = device_size(&file)?;
        Ok(FileDevice {
            file,
            size_bytes,
            direct_io: false,
            writable: false,
        })
    }

    /// The open file, e.g. for taking an advisory lock.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether accesses bypass the page cache (O_DIRECT), as opened.
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    fn aligned(offset: u64, len: usize) -> bool {
        offset.is_multiple_of(DIRECT_IO_ALIGN as u64) && len.is_multiple_of(DIRECT_IO_ALIGN)
    }
}

/// Size of a regular file or a block device (whose metadata length is 0).
fn device_size(file: &File) -> io::Result<u64> {
    let meta = file.metadata()?;
    if meta.file_type().is_block_device() {
        let mut size: u64 = 0;
        // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
        const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
        // SAFETY: the fd is open for the lifetime of `file`, and `size` is a
        // valid u64 the ioctl writes into.
        let rc = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(file),
                BLKGETSIZE64,
                &mut size,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(size)
    } else {
        Ok(meta.len())
    }
}

/// A heap buffer aligned for O_DIRECT.
struct AlignedBuffer {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuffer {
    fn new(len: usize) -> Self {
        let bytes = vec![0u8; len + DIRECT_IO_ALIGN];
        let start = bytes.as_ptr().align_offset(DIRECT_IO_ALIGN);
        AlignedBuffer { bytes, start, len }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(buf.len(), offset, self.size_bytes)?;
        if self.direct_io {
            if !Self::aligned(offset, buf.len()) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "O_DIRECT read of {} bytes at {offset} is not 4 KiB aligned",
                        buf.len()
                    ),
                ));
            }
            let mut bounce = AlignedBuffer::new(buf.len());
            self.file.read_exact_at(bounce.as_mut(), offset)?;
            buf.copy_from_slice(bounce.as_mut());
            return Ok(());
        }
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(buf.len(), offset, self.size_bytes)?;
        if self.direct_io {
            if !Self::aligned(offset, buf.len()) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "O_DIRECT write of {} bytes at {offset} is not 4 KiB aligned",
                        buf.len()
                    ),
                ));
            }
            let mut bounce = AlignedBuffer::new(buf.len());
            bounce.as_mut().copy_from_slice(buf);
            return self.file.write_all_at(bounce.as_mut(), offset);
        }
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
}
