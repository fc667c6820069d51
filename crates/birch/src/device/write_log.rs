//! A write log in the dm-log-writes format: birch's own stand-in for the
//! kernel's dm-log-writes target (this machine has no device-mapper).
//!
//! [`WriteLogDevice`] passes every call through to the device it wraps and
//! appends each write (with its data), each completed flush, and each mark
//! to a log file laid out exactly as dm-log-writes lays out its log device,
//! so fstests' `replay-log` and `birch replay` can rebuild the device as it
//! was at any flush or mark.
//!
//! ```text
//! sector 0        super: magic u64, version u64 = 1, nr_entries u64, sectorsize u32
//! then per entry  one sector: sector u64, nr_sectors u64, flags u64, data_len u64,
//!                 then (marks only) the mark's name, zero padded;
//!                 followed by nr_sectors sectors of written data
//! ```
//! Sectors are `SECTOR_SIZE` bytes; `sector` and `nr_sectors` count them.

use super::{BlockDevice, SECTOR};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

pub const WRITE_LOG_MAGIC: u64 = 0x006a_7366_7773_6872;
pub const WRITE_LOG_VERSION: u64 = 1;
pub const FLAG_FLUSH: u64 = 1;
pub const FLAG_FUA: u64 = 2;
pub const FLAG_DISCARD: u64 = 4;
pub const FLAG_MARK: u64 = 8;
pub const FLAG_METADATA: u64 = 16;
/// Longest mark name that fits the entry sector after its header.
pub const MARK_MAX: usize = SECTOR as usize - 32;

struct LogFile {
    file: File,
    /// Where the next entry goes.
    end: u64,
    entries: u64,
}

impl LogFile {
    fn append(
        &mut self,
        sector: u64,
        nr_sectors: u64,
        flags: u64,
        inline: &[u8],
        data: &[u8],
    ) -> io::Result<()> {
        let mut block = vec![0u8; SECTOR as usize];
        block[0..8].copy_from_slice(&sector.to_le_bytes());
        block[8..16].copy_from_slice(&nr_sectors.to_le_bytes());
        block[16..24].copy_from_slice(&flags.to_le_bytes());
        block[24..32].copy_from_slice(&(inline.len() as u64).to_le_bytes());
        block[32..32 + inline.len()].copy_from_slice(inline);
        self.file.write_all_at(&block, self.end)?;
        self.file.write_all_at(data, self.end + SECTOR)?;
        self.end += SECTOR + data.len() as u64;
        self.entries += 1;
        Ok(())
    }

    /// Rewrites the super with the current entry count.
    fn write_super(&self) -> io::Result<()> {
        let mut block = vec![0u8; SECTOR as usize];
        block[0..8].copy_from_slice(&WRITE_LOG_MAGIC.to_le_bytes());
        block[8..16].copy_from_slice(&WRITE_LOG_VERSION.to_le_bytes());
        block[16..24].copy_from_slice(&self.entries.to_le_bytes());
        block[24..28].copy_from_slice(&(SECTOR as u32).to_le_bytes());
        self.file.write_all_at(&block, 0)
    }
}

/// A device that logs what is done to it.
pub struct WriteLogDevice<D> {
    inner: D,
    log: Mutex<LogFile>,
}

impl<D: BlockDevice> WriteLogDevice<D> {
    /// Starts a new log in `file` (truncated) in front of `inner`.
    pub fn new(inner: D, file: File) -> io::Result<Self> {
        file.set_len(0)?;
        let log = LogFile {
            file,
            end: SECTOR,
            entries: 0,
        };
        log.write_super()?;
        Ok(WriteLogDevice {
            inner,
            log: Mutex::new(log),
        })
    }

    /// Records a mark (e.g. "fsync 257") at this point of the log.
    pub fn mark(&self, name: &str) -> io::Result<()> {
        let name = name.as_bytes();
        if name.is_empty() || name.len() > MARK_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a mark name must be 1 to {MARK_MAX} bytes"),
            ));
        }
        let mut log = self.log.lock().expect("write log lock poisoned");
        log.append(0, 0, FLAG_MARK, name, &[])?;
        log.write_super()
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }
}

impl<D: BlockDevice> BlockDevice for WriteLogDevice<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !offset.is_multiple_of(SECTOR) || !(buf.len() as u64).is_multiple_of(SECTOR) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "write log: write of {} bytes at {offset} is not sector aligned",
                    buf.len()
                ),
            ));
        }
        // Logged under the lock, in the order the writes reach the device.
        let mut log = self.log.lock().expect("write log lock poisoned");
        self.inner.write_at(buf, offset)?;
        log.append(offset / SECTOR, buf.len() as u64 / SECTOR, 0, &[], buf)
    }

    fn flush(&self) -> io::Result<()> {
        self.inner.flush()?;
        // The flush entry follows every write that completed before it.
        let mut log = self.log.lock().expect("write log lock poisoned");
        log.append(0, 0, FLAG_FLUSH, &[], &[])?;
        log.write_super()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn writable(&self) -> bool {
        self.inner.writable()
    }
}

impl<D> Drop for WriteLogDevice<D> {
    fn drop(&mut self) {
        if let Ok(log) = self.log.lock() {
            let _ = log.write_super();
            let _ = log.file.sync_all();
        }
    }
}

/// One entry of a write log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEntry {
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    Flush,
    Mark(String),
    /// A discard or any other entry birch does not produce; replaying skips it.
    Other {
        flags: u64,
        sector: u64,
        nr_sectors: u64,
    },
}

/// Reads a whole write log, validating it; errors name the entry and what
/// is wrong.
pub fn read_write_log(file: &File) -> io::Result<Vec<LogEntry>> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let mut header = [0u8; 28];
    file.read_exact_at(&mut header, 0)
        .map_err(|e| bad(format!("cannot read the write log's super: {e}")))?;
    let field = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    if field(&header, 0) != WRITE_LOG_MAGIC {
        return Err(bad("not a write log (bad magic)".into()));
    }
    if field(&header, 8) != WRITE_LOG_VERSION {
        return Err(bad(format!(
            "write log version {} (only {WRITE_LOG_VERSION} is known)",
            field(&header, 8)
        )));
    }
    let entries = field(&header, 16);
    let sectorsize = u64::from(u32::from_le_bytes(
        header[24..28].try_into().expect("4 bytes"),
    ));
    if sectorsize < 512 || !sectorsize.is_power_of_two() {
        return Err(bad(format!(
            "write log sector size {sectorsize} is invalid"
        )));
    }
    let len = file.metadata()?.len();
    let mut pos = sectorsize;
    let mut out = Vec::new();
    for index in 0..entries {
        if pos + sectorsize > len {
            return Err(bad(format!(
                "entry {index}: the log ends at byte {len}, before the entry"
            )));
        }
        let mut block = vec![0u8; sectorsize as usize];
        file.read_exact_at(&mut block, pos)?;
        let (sector, nr_sectors, flags, data_len) = (
            field(&block, 0),
            field(&block, 8),
            field(&block, 16),
            field(&block, 24),
        );
        pos += sectorsize;
        let entry = if flags & FLAG_MARK != 0 {
            if data_len as usize > block.len() - 32 {
                return Err(bad(format!(
                    "entry {index}: mark of {data_len} bytes does not fit its sector"
                )));
            }
            LogEntry::Mark(String::from_utf8_lossy(&block[32..32 + data_len as usize]).into_owned())
        } else if flags & FLAG_DISCARD != 0 {
            LogEntry::Other {
                flags,
                sector,
                nr_sectors,
            }
        } else if nr_sectors > 0 {
            let bytes = nr_sectors
                .checked_mul(sectorsize)
                .filter(|&b| pos + b <= len)
                .ok_or_else(|| {
                    bad(format!(
                        "entry {index}: {nr_sectors} sectors of data run past the end of the log"
                    ))
                })?;
            let mut data = vec![0u8; bytes as usize];
            file.read_exact_at(&mut data, pos)?;
            pos += bytes;
            LogEntry::Write {
                offset: sector * sectorsize,
                data,
            }
        } else if flags & FLAG_FLUSH != 0 {
            LogEntry::Flush
        } else {
            LogEntry::Other {
                flags,
                sector,
                nr_sectors,
            }
        };
        out.push(entry);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    #[test]
    fn a_logged_device_replays_to_any_flush_or_mark() {
        let dir = std::env::temp_dir().join(format!("birch-wl-{}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&dir)
            .unwrap();
        let dev =
            WriteLogDevice::new(MemoryDevice::new(1 << 20), file.try_clone().unwrap()).unwrap();
        dev.write_at(&[1; 4096], 8192).unwrap();
        dev.flush().unwrap();
        dev.mark("after-first").unwrap();
        dev.write_at(&[2; 8192], 8192).unwrap();
        drop(dev);
        let entries = read_write_log(&file).unwrap();
        assert_eq!(entries.len(), 4);
        assert_eq!(
            entries[0],
            LogEntry::Write {
                offset: 8192,
                data: vec![1; 4096]
            }
        );
        assert_eq!(entries[1], LogEntry::Flush);
        assert_eq!(entries[2], LogEntry::Mark("after-first".into()));
        assert!(
            matches!(&entries[3], LogEntry::Write { offset: 8192, data } if data.len() == 8192)
        );
        std::fs::remove_file(&dir).unwrap();
    }

    #[test]
    fn damaged_logs_are_errors_not_panics() {
        let path = std::env::temp_dir().join(format!("birch-wl-bad-{}", std::process::id()));
        std::fs::write(&path, [0u8; 100]).unwrap();
        let err = read_write_log(&File::open(&path).unwrap()).unwrap_err();
        assert!(err.to_string().contains("magic"), "{err}");
        let file = File::options().read(true).write(true).open(&path).unwrap();
        let dev =
            WriteLogDevice::new(MemoryDevice::new(1 << 20), file.try_clone().unwrap()).unwrap();
        dev.write_at(&[3; 4096], 0).unwrap();
        dev.flush().unwrap();
        drop(dev);
        file.set_len(4096 * 2 + 100).unwrap();
        let err = read_write_log(&file).unwrap_err();
        assert!(err.to_string().contains("entry 0"), "{err}");
        std::fs::remove_file(&path).unwrap();
    }
}
