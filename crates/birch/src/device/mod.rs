//! The block device seam: the only road from the engine to storage.
//!
//! Every byte birch reads or writes goes through [`BlockDevice`]. The engine is
//! generic over it, so the same code runs on an image file, a block device, an
//! in-memory buffer, a [`RecordingDevice`] that lets tests rebuild the
//! device as it would be after a power cut at any point, or a
//! [`FaultyDevice`] that fails or corrupts chosen calls.

mod faulty;
mod file;
mod gate;
mod memory;
mod recording;
mod write_log;

pub use faulty::{FaultHandle, FaultPlan, FaultedOp, FaultyDevice, InjectedFault, IoCounts};
pub use file::FileDevice;
pub use gate::ShutdownGate;
pub use memory::MemoryDevice;
pub use recording::{CrashPoint, DeviceEvent, RecordingDevice};
pub use write_log::{
    read_write_log, LogEntry, WriteLogDevice, FLAG_DISCARD, FLAG_FLUSH, FLAG_FUA, FLAG_MARK,
    FLAG_METADATA, MARK_MAX, WRITE_LOG_MAGIC, WRITE_LOG_VERSION,
};

/// The unit of device I/O birch issues (every write is a multiple of it).
pub(crate) const SECTOR: u64 = crate::format::SECTOR_SIZE;

use std::io;
use std::sync::Arc;

/// A byte-addressed device with a durability barrier.
///
/// Media model (see docs/ASSUMPTIONS.md): a write that returned may sit in a
/// volatile cache until the next `flush` returns; after a power cut, every
/// write that completed before the last completed flush is on the media, and
/// any subset of the writes issued after it may be. Writes are assumed atomic
/// at 4 KiB sector granularity (birch never relies on anything larger).
pub trait BlockDevice: Send + Sync {
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`. Not durable until [`flush`](Self::flush).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes every `(offset, bytes)` pair, in no promised order; like
    /// [`write_at`](Self::write_at), none is durable until a flush. A
    /// device may keep them all in flight at once (an O_DIRECT
    /// [`FileDevice`] does, through io_uring), so that the writes of a log
    /// sync or a commit cost about one write's latency instead of the sum.
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        for (offset, buf) in writes {
            self.write_at(buf, *offset)?;
        }
        Ok(())
    }
    /// Durability barrier: every write that returned before this call is
    /// on stable media when it returns.
    fn flush(&self) -> io::Result<()>;
    /// Device size in bytes.
    fn size_bytes(&self) -> u64;
    /// Whether writes can succeed at all: false for a device opened
    /// read-only, which a read-only mount may use and must then refuse to
    /// be switched to read-write on.
    fn writable(&self) -> bool {
        true
    }
}

impl<D: BlockDevice + ?Sized> BlockDevice for Arc<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        (**self).write_at(buf, offset)
    }
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        (**self).write_batch(writes)
    }
    fn flush(&self) -> io::Result<()> {
        (**self).flush()
    }
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }
    fn writable(&self) -> bool {
        (**self).writable()
    }
}

impl<D: BlockDevice + ?Sized> BlockDevice for Box<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        (**self).write_at(buf, offset)
    }
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        (**self).write_batch(writes)
    }
    fn flush(&self) -> io::Result<()> {
        (**self).flush()
    }
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }
    fn writable(&self) -> bool {
        (**self).writable()
    }
}

/// Rejects an access that falls outside the device, naming it.
pub(crate) fn check_range(len: usize, offset: u64, size: u64) -> io::Result<()> {
    let end = offset.checked_add(len as u64);
    match end {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "access of {len} bytes at offset {offset} is beyond the device end ({size} bytes)"
            ),
        )),
    }
}

impl<D: BlockDevice + ?Sized> BlockDevice for &D {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        (**self).write_at(buf, offset)
    }
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        (**self).write_batch(writes)
    }
    fn flush(&self) -> io::Result<()> {
        (**self).flush()
    }
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }
    fn writable(&self) -> bool {
        (**self).writable()
    }
}
