//! A device that can be shut down: from the moment [`ShutdownGate::trip`]
//! is called, every write and flush fails with EIO and nothing more reaches
//! the device. This is how birch answers fstests' shutdown ioctl
//! (XFS_IOC_GOINGDOWN): the image is left exactly as a power cut there
//! would leave it (as far as the device's own cache allows), and the next
//! mount recovers from it.

use super::BlockDevice;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

pub struct ShutdownGate<D> {
    inner: D,
    shut: AtomicBool,
    /// Writers hold it shared; `trip` takes it exclusively, so when `trip`
    /// returns no write is still in flight.
    in_flight: RwLock<()>,
}

impl<D: BlockDevice> ShutdownGate<D> {
    pub fn new(inner: D) -> Self {
        ShutdownGate {
            inner,
            shut: AtomicBool::new(false),
            in_flight: RwLock::new(()),
        }
    }

    /// Stops all writes; returns once none is in flight.
    pub fn trip(&self) {
        self.shut.store(true, Ordering::SeqCst);
        drop(self.in_flight.write().expect("gate lock poisoned"));
    }

    pub fn is_shut(&self) -> bool {
        self.shut.load(Ordering::SeqCst)
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn refuse(&self) -> io::Result<()> {
        if self.is_shut() {
            Err(io::Error::from_raw_os_error(libc::EIO))
        } else {
            Ok(())
        }
    }
}

impl<D: BlockDevice> BlockDevice for ShutdownGate<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let _guard = self.in_flight.read().expect("gate lock poisoned");
        self.refuse()?;
        self.inner.write_at(buf, offset)
    }

    /// Passed on whole, so the device below can keep the writes in flight
    /// together (`FileDevice`'s io_uring); the gate's default would split
    /// the batch into single writes.
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        let _guard = self.in_flight.read().expect("gate lock poisoned");
        self.refuse()?;
        self.inner.write_batch(writes)
    }

    fn flush(&self) -> io::Result<()> {
        let _guard = self.in_flight.read().expect("gate lock poisoned");
        self.refuse()?;
        self.inner.flush()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn writable(&self) -> bool {
        self.inner.writable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;
    use std::sync::atomic::AtomicUsize;

    /// Counts the batches that reach it whole.
    struct BatchCounter {
        inner: MemoryDevice,
        batches: AtomicUsize,
    }

    impl BlockDevice for BatchCounter {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.inner.write_at(buf, offset)
        }
        fn write_batch(&self, writes: &[(u64, &[u8])]) -> io::Result<()> {
            self.batches.fetch_add(1, Ordering::SeqCst);
            self.inner.write_batch(writes)
        }
        fn flush(&self) -> io::Result<()> {
            self.inner.flush()
        }
        fn size_bytes(&self) -> u64 {
            self.inner.size_bytes()
        }
    }

    /// A batch stays one batch through the gate, so the device below can
    /// keep its writes in flight together.
    #[test]
    fn a_batch_reaches_the_device_whole() {
        let gate = ShutdownGate::new(BatchCounter {
            inner: MemoryDevice::new(65536),
            batches: AtomicUsize::new(0),
        });
        let batch = [(0, &[3u8; 4096][..]), (8192, &[4u8; 4096][..])];
        gate.write_batch(&batch).unwrap();
        assert_eq!(gate.inner().batches.load(Ordering::SeqCst), 1);
        let mut buf = [0u8; 4096];
        gate.read_at(&mut buf, 8192).unwrap();
        assert_eq!(buf, [4; 4096]);
    }

    #[test]
    fn after_trip_nothing_reaches_the_device() {
        let gate = ShutdownGate::new(MemoryDevice::new(65536));
        gate.write_at(&[1; 4096], 0).unwrap();
        gate.trip();
        assert_eq!(
            gate.write_at(&[2; 4096], 0).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        assert!(gate.flush().is_err());
        let batch = [(0, &[3u8; 4096][..]), (8192, &[3u8; 4096][..])];
        assert!(gate.write_batch(&batch).is_err());
        let mut buf = [0u8; 4096];
        gate.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [1; 4096]);
    }
}
