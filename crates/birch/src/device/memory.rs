use super::{check_range, BlockDevice};
use std::io;
use std::sync::RwLock;

/// A device held in memory. Flush is a no-op: everything is "durable" for
/// as long as the process lives. Crash tests use [`super::RecordingDevice`].
pub struct MemoryDevice {
    bytes: RwLock<Vec<u8>>,
}

impl MemoryDevice {
    pub fn new(size_bytes: u64) -> Self {
        Self::from_bytes(vec![0; size_bytes as usize])
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        MemoryDevice {
            bytes: RwLock::new(bytes),
        }
    }

    /// A copy of the whole device content.
    pub fn snapshot(&self) -> Vec<u8> {
        self.bytes
            .read()
            .expect("memory device lock poisoned")
            .clone()
    }
}

impl BlockDevice for MemoryDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        crate::lock_order::assert_no_state_lock();
        let bytes = self.bytes.read().expect("memory device lock poisoned");
        check_range(buf.len(), offset, bytes.len() as u64)?;
        let start = offset as usize;
        buf.copy_from_slice(&bytes[start..start + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        crate::lock_order::assert_no_state_lock();
        let mut bytes = self.bytes.write().expect("memory device lock poisoned");
        check_range(buf.len(), offset, bytes.len() as u64)?;
        let start = offset as usize;
        bytes[start..start + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        crate::lock_order::assert_no_state_lock();
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.bytes
            .read()
            .expect("memory device lock poisoned")
            .len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock_order::{allow_io_under_state_lock, LockRank, RankedMutex};

    #[test]
    #[cfg(debug_assertions)]
    fn io_under_state_lock_panics_in_debug() {
        let dev = MemoryDevice::new(1 << 20);
        let state = RankedMutex::new(LockRank::State, ());
        let mut buf = [0u8; 512];
        dev.read_at(&mut buf, 0).expect("read without the lock");
        let held = state.lock().expect("state");
        {
            let _debt = allow_io_under_state_lock("the test's exemption");
            dev.read_at(&mut buf, 0).expect("exempted read");
        }
        let read = std::panic::catch_unwind(|| dev.read_at(&mut [0u8; 512], 0));
        drop(held);
        assert!(read.is_err(), "a read under the state lock did not panic");
        dev.write_at(&buf, 0).expect("write after the lock dropped");
    }
}
