//! A device that fails on purpose, for tests of bad media (docs/IO-ERRORS.md).
//!
//! [`FaultyDevice`] passes every call to the device it wraps, counts the
//! reads, writes and flushes it sees, and injects the faults of the
//! [`FaultPlan`] armed through its [`FaultHandle`]: EIO on the Nth read,
//! write or flush, EIO on reads or writes touching a byte range, flipped bytes in
//! what reads of a range return. The handle is shared, so a test arms a plan
//! while the filesystem owns the device: first with no fault to learn how
//! many writes and flushes an operation issues, then failing each in turn.
//!
//! A `write_batch` is taken write by write (the trait's default), so each
//! write of a batch is counted and can fail on its own; the writes before
//! it reached the device, those after it are not issued.
//!
//! A failed write or flush does not reach the wrapped device at all: over a
//! [`super::RecordingDevice`], the writes issued since the last flush that
//! reached it are exactly the ones a failed flush may or may not have made
//! durable.

use super::BlockDevice;
use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

/// The faults to inject, counted from the moment the plan is armed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// The read with this index (0 = the first read after arming) fails.
    pub fail_read: Option<u64>,
    /// The write with this index (0 = the first write after arming) fails.
    pub fail_write: Option<u64>,
    /// The flush with this index fails.
    pub fail_flush: Option<u64>,
    /// Every write overlapping one of these byte ranges fails.
    pub fail_writes_in: Vec<Range<u64>>,
    /// Every read overlapping one of these byte ranges fails.
    pub fail_reads_in: Vec<Range<u64>>,
    /// Reads return the bytes of these ranges inverted (the media keeps
    /// them intact).
    pub corrupt_reads_in: Vec<Range<u64>>,
}

impl FaultPlan {
    /// A plan that injects nothing: arm it to count an operation's I/O.
    pub fn none() -> Self {
        FaultPlan::default()
    }

    pub fn fail_read(index: u64) -> Self {
        FaultPlan {
            fail_read: Some(index),
            ..FaultPlan::default()
        }
    }

    pub fn fail_write(index: u64) -> Self {
        FaultPlan {
            fail_write: Some(index),
            ..FaultPlan::default()
        }
    }

    pub fn fail_flush(index: u64) -> Self {
        FaultPlan {
            fail_flush: Some(index),
            ..FaultPlan::default()
        }
    }

    pub fn fail_writes_in(range: Range<u64>) -> Self {
        FaultPlan {
            fail_writes_in: vec![range],
            ..FaultPlan::default()
        }
    }

    pub fn fail_reads_in(range: Range<u64>) -> Self {
        FaultPlan {
            fail_reads_in: vec![range],
            ..FaultPlan::default()
        }
    }

    pub fn corrupt_reads_in(range: Range<u64>) -> Self {
        FaultPlan {
            corrupt_reads_in: vec![range],
            ..FaultPlan::default()
        }
    }
}

/// The I/O a [`FaultyDevice`] has seen since its plan was armed, faulty
/// calls included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounts {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
}

/// Which call a fault hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultedOp {
    Read,
    Write,
    Flush,
    /// A read that succeeded with flipped bytes.
    CorruptedRead,
}

/// One fault the device injected: the call (its index among calls of its
/// kind since arming) and the bytes it touched (none for a flush).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectedFault {
    pub op: FaultedOp,
    pub index: u64,
    pub bytes: Range<u64>,
}

impl fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.op {
            FaultedOp::Read => "read",
            FaultedOp::Write => "write",
            FaultedOp::Flush => "flush",
            FaultedOp::CorruptedRead => "corrupted read",
        };
        write!(f, "injected fault: {what} #{}", self.index)?;
        if self.op != FaultedOp::Flush {
            write!(f, " of bytes {}..{}", self.bytes.start, self.bytes.end)?;
        }
        Ok(())
    }
}

#[derive(Default)]
struct FaultState {
    plan: FaultPlan,
    counts: IoCounts,
    injected: Vec<InjectedFault>,
}

/// Arms plans on a [`FaultyDevice`] and reads its counts; cheap to clone,
/// usable from any thread while the filesystem owns the device.
#[derive(Clone, Default)]
pub struct FaultHandle {
    state: Arc<Mutex<FaultState>>,
}

impl FaultHandle {
    /// Replaces the plan and restarts every count (and the list of
    /// injected faults) from zero.
    pub fn arm(&self, plan: FaultPlan) {
        *self.lock() = FaultState {
            plan,
            ..FaultState::default()
        };
    }

    /// Stops injecting; the counts go on.
    pub fn disarm(&self) {
        self.lock().plan = FaultPlan::none();
    }

    pub fn counts(&self) -> IoCounts {
        self.lock().counts
    }

    /// The faults injected since the plan was armed, in order.
    pub fn injected(&self) -> Vec<InjectedFault> {
        self.lock().injected.clone()
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        self.state.lock().expect("fault plan lock poisoned")
    }
}

/// A [`BlockDevice`] that injects the faults of the armed [`FaultPlan`].
pub struct FaultyDevice<D> {
    inner: D,
    faults: FaultHandle,
}

impl<D: BlockDevice> FaultyDevice<D> {
    /// Wraps `inner` with nothing armed.
    pub fn new(inner: D) -> Self {
        FaultyDevice {
            inner,
            faults: FaultHandle::default(),
        }
    }

    /// The handle that arms this device's plans.
    pub fn faults(&self) -> FaultHandle {
        self.faults.clone()
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }
}

fn overlaps(ranges: &[Range<u64>], bytes: &Range<u64>) -> bool {
    ranges
        .iter()
        .any(|r| r.start < bytes.end && bytes.start < r.end)
}

fn eio(fault: &InjectedFault) -> io::Error {
    // Same errno as a real media error, with a text that says it was
    // injected and which call it was (so a test failure can be replayed).
    io::Error::other(format!("{fault} (EIO)"))
}

impl<D: BlockDevice> BlockDevice for FaultyDevice<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bytes = offset..offset.saturating_add(buf.len() as u64);
        let (index, fail, corrupt) = {
            let mut state = self.faults.lock();
            let index = state.counts.reads;
            state.counts.reads += 1;
            let fail =
                state.plan.fail_read == Some(index) || overlaps(&state.plan.fail_reads_in, &bytes);
            (index, fail, state.plan.corrupt_reads_in.clone())
        };
        if fail {
            let fault = InjectedFault {
                op: FaultedOp::Read,
                index,
                bytes,
            };
            let err = eio(&fault);
            self.faults.lock().injected.push(fault);
            return Err(err);
        }
        self.inner.read_at(buf, offset)?;
        let mut flipped = false;
        for range in corrupt {
            let start = range.start.max(bytes.start);
            let end = range.end.min(bytes.end);
            if start < end {
                for byte in &mut buf[(start - offset) as usize..(end - offset) as usize] {
                    *byte = !*byte;
                }
                flipped = true;
            }
        }
        if flipped {
            self.faults.lock().injected.push(InjectedFault {
                op: FaultedOp::CorruptedRead,
                index,
                bytes,
            });
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let bytes = offset..offset.saturating_add(buf.len() as u64);
        {
            let mut state = self.faults.lock();
            let index = state.counts.writes;
            state.counts.writes += 1;
            if state.plan.fail_write == Some(index) || overlaps(&state.plan.fail_writes_in, &bytes)
            {
                let fault = InjectedFault {
                    op: FaultedOp::Write,
                    index,
                    bytes,
                };
                let err = eio(&fault);
                state.injected.push(fault);
                return Err(err);
            }
        }
        self.inner.write_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        {
            let mut state = self.faults.lock();
            let index = state.counts.flushes;
            state.counts.flushes += 1;
            if state.plan.fail_flush == Some(index) {
                let fault = InjectedFault {
                    op: FaultedOp::Flush,
                    index,
                    bytes: 0..0,
                };
                let err = eio(&fault);
                state.injected.push(fault);
                return Err(err);
            }
        }
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

    #[test]
    fn nth_write_and_flush_fail_once_and_nothing_reaches_the_device() {
        let dev = FaultyDevice::new(MemoryDevice::new(16));
        let faults = dev.faults();
        dev.write_at(&[9], 0).unwrap();
        faults.arm(FaultPlan {
            fail_write: Some(1),
            fail_flush: Some(0),
            ..FaultPlan::none()
        });
        dev.write_at(&[1], 0).unwrap();
        let err = dev.write_at(&[2], 1).unwrap_err();
        assert!(err.to_string().contains("write #1 of bytes 1..2"), "{err}");
        dev.write_at(&[3], 2).unwrap();
        assert!(dev.flush().is_err());
        dev.flush().unwrap();
        let mut buf = [0u8; 3];
        dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [1, 0, 3]);
        assert_eq!(
            faults.counts(),
            IoCounts {
                reads: 1,
                writes: 3,
                flushes: 2
            }
        );
        let injected = faults.injected();
        assert_eq!(injected.len(), 2);
        assert_eq!(injected[1].op, FaultedOp::Flush);
        assert_eq!(injected[1].to_string(), "injected fault: flush #0");
    }

    #[test]
    fn ranges_fail_or_corrupt_only_the_calls_touching_them() {
        let dev = FaultyDevice::new(MemoryDevice::new(16));
        dev.write_at(&[7; 16], 0).unwrap();
        let faults = dev.faults();
        let mut plan = FaultPlan::fail_writes_in(4..6);
        plan.fail_reads_in.push(12..13);
        plan.corrupt_reads_in.push(2..4);
        plan.fail_read = Some(2);
        faults.arm(plan);
        assert!(dev.write_at(&[1; 2], 5).is_err());
        dev.write_at(&[1; 2], 6).unwrap();
        assert!(dev.read_at(&mut [0u8; 4], 10).is_err());
        let mut buf = [0u8; 4];
        dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [7, 7, !7, !7]);
        assert!(dev.read_at(&mut buf, 0).is_err());
        faults.disarm();
        let mut buf = [0u8; 8];
        dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [7, 7, 7, 7, 7, 7, 1, 1]);
        let ops: Vec<FaultedOp> = faults.injected().iter().map(|f| f.op).collect();
        assert_eq!(
            ops,
            [
                FaultedOp::Write,
                FaultedOp::Read,
                FaultedOp::CorruptedRead,
                FaultedOp::Read
            ]
        );
    }
}
