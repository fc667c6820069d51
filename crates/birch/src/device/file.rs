use super::{check_range, BlockDevice};
use io_uring::{opcode, types, IoUring};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;

/// An image file or a block device, accessed with pread/pwrite; flush is
/// fdatasync. With `direct_io`, the file is opened O_DIRECT and every access
/// goes through a 4 KiB-aligned bounce buffer.
pub struct FileDevice {
    file: File,
    size_bytes: u64,
    direct_io: bool,
    /// Opened for writing (not by [`FileDevice::open_read_only`]).
    writable: bool,
    /// Puts the writes of a batch in flight together (O_DIRECT only:
    /// buffered writes are memory copies that gain nothing from it).
    /// `None` where io_uring is unavailable (an older kernel, a sandbox):
    /// batches are then written one after another.
    write_ring: Option<Mutex<IoUring>>,
}

const DIRECT_IO_ALIGN: usize = 4096;

/// Writes one io_uring submission carries at most.
const WRITE_RING_ENTRIES: u32 = 64;

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
        let write_ring = direct_io
            .then(|| IoUring::new(WRITE_RING_ENTRIES).ok().map(Mutex::new))
            .flatten();
        let dev = FileDevice {
            file,
            size_bytes,
            direct_io,
            writable: true,
            write_ring,
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
            write_ring: None,
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

    fn check_direct_io(offset: u64, len: usize, what: &str) -> io::Result<()> {
        if Self::aligned(offset, len) {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("O_DIRECT {what} of {len} bytes at {offset} is not 4 KiB aligned"),
        ))
    }

    /// Submits up to [`WRITE_RING_ENTRIES`] writes of aligned buffers at
    /// once and waits for all of them. A write the kernel completed short
    /// is written again, whole, with pwrite (rewriting is harmless).
    fn write_ring_chunk(
        &self,
        ring: &mut IoUring,
        chunk: &mut [(u64, AlignedBuffer)],
    ) -> io::Result<()> {
        let fd = types::Fd(self.file.as_raw_fd());
        for (index, (offset, buffer)) in chunk.iter_mut().enumerate() {
            let bytes = buffer.as_mut();
            let len = u32::try_from(bytes.len())
                .map_err(|_| io::Error::other("batched write over 4 GiB"))?;
            let entry = opcode::Write::new(fd, bytes.as_ptr(), len)
                .offset(*offset)
                .build()
                .user_data(index as u64);
            // SAFETY: the buffer lives in `chunk`, which outlives the
            // submission: this function waits for every completion before
            // it returns, and leaks the buffers if it cannot.
            unsafe { ring.submission().push(&entry) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        let mut pending = chunk.len();
        let mut failed: Option<io::Error> = None;
        let mut short = Vec::new();
        while pending > 0 {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Writes may still be in flight into these buffers:
                    // never free them.
                    for (_, buffer) in chunk.iter_mut() {
                        std::mem::forget(std::mem::replace(buffer, AlignedBuffer::new(0)));
                    }
                    return Err(e);
                }
            }
            for completion in ring.completion() {
                pending -= 1;
                let index = completion.user_data() as usize;
                let result = completion.result();
                if result < 0 {
                    failed.get_or_insert(io::Error::from_raw_os_error(-result));
                } else if result as usize != chunk[index].1.len {
                    short.push(index);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        for index in short {
            let (offset, buffer) = &mut chunk[index];
            self.file.write_all_at(buffer.as_mut(), *offset)?;
        }
        Ok(())
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
    /// An aligned copy of `data`, written once: a write's bounce buffer
    /// needs no zero fill before the copy (zeroing a buffer per device
    /// write was half of this function's cost in the daemon's profile).
    fn copy_of(data: &[u8]) -> Self {
        let mut bytes: Vec<u8> = Vec::with_capacity(data.len() + DIRECT_IO_ALIGN);
        // The capacity is allocated and never reallocated below, so the
        // offset found now stays the data's alignment.
        let start = bytes.as_ptr().align_offset(DIRECT_IO_ALIGN);
        bytes.resize(start, 0);
        bytes.extend_from_slice(data);
        AlignedBuffer {
            bytes,
            start,
            len: data.len(),
        }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        crate::lock_order::assert_no_state_lock();
        check_range(buf.len(), offset, self.size_bytes)?;
        if self.direct_io {
            Self::check_direct_io(offset, buf.len(), "read")?;
            let mut bounce = AlignedBuffer::new(buf.len());
            self.file.read_exact_at(bounce.as_mut(), offset)?;
            buf.copy_from_slice(bounce.as_mut());
            return Ok(());
        }
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        crate::lock_order::assert_no_state_lock();
        check_range(buf.len(), offset, self.size_bytes)?;
        if self.direct_io {
            Self::check_direct_io(offset, buf.len(), "write")?;
            let mut bounce = AlignedBuffer::copy_of(buf);
            return self.file.write_all_at(bounce.as_mut(), offset);
        }
        self.file.write_all_at(buf, offset)
    }

    fn write_batch(&self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        crate::lock_order::assert_no_state_lock();
        let ring = match &self.write_ring {
            Some(ring) if writes.len() > 1 => ring,
            _ => {
                for (offset, buf) in writes {
                    self.write_at(buf, *offset)?;
                }
                return Ok(());
            }
        };
        let mut aligned = Vec::with_capacity(writes.len());
        for (offset, buf) in writes {
            check_range(buf.len(), *offset, self.size_bytes)?;
            Self::check_direct_io(*offset, buf.len(), "write")?;
            aligned.push((*offset, AlignedBuffer::copy_of(buf)));
        }
        let mut ring = ring.lock().expect("io_uring lock poisoned");
        for chunk in aligned.chunks_mut(WRITE_RING_ENTRIES as usize) {
            self.write_ring_chunk(&mut ring, chunk)?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        crate::lock_order::assert_no_state_lock();
        self.file.sync_data()
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch image in the temporary directory (where that refuses
    /// O_DIRECT, e.g. tmpfs, the test opens it buffered and still checks
    /// the batch).
    fn scratch_image(name: &str, bytes: u64) -> std::path::PathBuf {
        let path =
            std::env::temp_dir().join(format!("file-device-{name}-{}.img", std::process::id()));
        let file = File::create(&path).expect("create scratch image");
        file.set_len(bytes).expect("size scratch image");
        path
    }

    #[test]
    fn a_copy_for_a_write_is_aligned_and_holds_the_data() {
        for len in [0, 1, 4096, 3 * 4096, 65536 + 4096] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut copy = AlignedBuffer::copy_of(&data);
            let bytes = copy.as_mut();
            assert_eq!(bytes.as_ptr() as usize % DIRECT_IO_ALIGN, 0, "len {len}");
            assert_eq!(bytes, &data[..], "len {len}");
        }
    }

    #[test]
    fn batched_writes_land_where_they_were_aimed() {
        let path = scratch_image("batch", 8 << 20);
        let dev = FileDevice::open(&path, true)
            .or_else(|_| FileDevice::open(&path, false))
            .expect("open scratch image");
        // More writes than one ring submission holds, of mixed sizes,
        // far apart and adjacent.
        let writes: Vec<(u64, Vec<u8>)> = (0..150u64)
            .map(|i| {
                let len = 4096 * (1 + (i % 3) as usize);
                (i * 3 * 4096 + (i % 2) * (4 << 20), vec![i as u8 + 1; len])
            })
            .collect();
        let batch: Vec<(u64, &[u8])> = writes.iter().map(|(o, b)| (*o, b.as_slice())).collect();
        dev.write_batch(&batch).expect("batched write");
        dev.flush().expect("flush");
        for (offset, expected) in &writes {
            let mut got = vec![0u8; expected.len()];
            dev.read_at(&mut got, *offset).expect("read back");
            assert_eq!(&got, expected, "write at {offset}");
        }
        let beyond = [(dev.size_bytes(), &[0u8; 4096][..]), (0, &[0u8; 4096][..])];
        assert!(
            dev.write_batch(&beyond).is_err(),
            "a write beyond the end is refused"
        );
        std::fs::remove_file(&path).expect("remove scratch image");
    }
}
