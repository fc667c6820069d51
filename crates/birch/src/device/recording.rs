use super::{check_range, BlockDevice, MemoryDevice};
use std::io;
use std::sync::Mutex;

/// One thing that happened on a [`RecordingDevice`], in issue order.
#[derive(Clone, Debug)]
pub enum DeviceEvent {
    Write { offset: u64, bytes: Vec<u8> },
    Flush,
}

/// A power cut: every write issued before the `flushes_completed`-th flush
/// returned is kept; of the writes issued after it (and before the next
/// flush), exactly those whose position in that window is listed in
/// `kept_writes` are kept, the rest are lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashPoint {
    pub flushes_completed: usize,
    pub kept_writes: Vec<usize>,
}

/// An in-memory device that records every write and flush, so that a test
/// can rebuild the media as a power cut at any point would leave it.
///
/// Reads see every write (as a real device's cache would); only
/// [`crash_image`](Self::crash_image) applies the media model.
pub struct RecordingDevice {
    current: MemoryDevice,
    initial_image: Vec<u8>,
    events: Mutex<Vec<DeviceEvent>>,
}

impl RecordingDevice {
    /// Starts recording on top of `initial_image` (e.g. a freshly made
    /// filesystem, or zeroes).
    pub fn new(initial_image: Vec<u8>) -> Self {
        RecordingDevice {
            current: MemoryDevice::from_bytes(initial_image.clone()),
            initial_image,
            events: Mutex::new(Vec::new()),
        }
    }

    pub fn events(&self) -> Vec<DeviceEvent> {
        self.events.lock().expect("recording lock poisoned").clone()
    }

    pub fn flush_count(&self) -> usize {
        self.events
            .lock()
            .expect("recording lock poisoned")
            .iter()
            .filter(|e| matches!(e, DeviceEvent::Flush))
            .count()
    }

    /// Number of writes issued after the `flushes_completed`-th flush and
    /// before the next one: the writes a power cut there may keep or lose.
    pub fn writes_in_window(&self, flushes_completed: usize) -> usize {
        let events = self.events.lock().expect("recording lock poisoned");
        window(&events, flushes_completed).len()
    }

    /// The media after a power cut at `point`.
    pub fn crash_image(&self, point: &CrashPoint) -> Vec<u8> {
        let events = self.events.lock().expect("recording lock poisoned");
        let mut image = self.initial_image.clone();
        let mut flushes = 0;
        for event in events.iter() {
            if flushes == point.flushes_completed {
                break;
            }
            match event {
                DeviceEvent::Write { offset, bytes } => apply(&mut image, *offset, bytes),
                DeviceEvent::Flush => flushes += 1,
            }
        }
        assert_eq!(
            flushes, point.flushes_completed,
            "crash point names flush {} but only {flushes} happened",
            point.flushes_completed
        );
        let pending = window(&events, point.flushes_completed);
        for &kept in &point.kept_writes {
            let (offset, bytes) = pending.get(kept).unwrap_or_else(|| {
                panic!(
                    "crash point keeps write {kept} of a window of {}",
                    pending.len()
                )
            });
            apply(&mut image, *offset, bytes);
        }
        image
    }

    /// The current content, as if every write had reached the media.
    pub fn snapshot(&self) -> Vec<u8> {
        self.current.snapshot()
    }
}

fn window(events: &[DeviceEvent], flushes_completed: usize) -> Vec<(u64, &Vec<u8>)> {
    let mut flushes = 0;
    let mut pending = Vec::new();
    for event in events {
        match event {
            DeviceEvent::Flush => {
                if flushes == flushes_completed {
                    break;
                }
                flushes += 1;
            }
            DeviceEvent::Write { offset, bytes } => {
                if flushes == flushes_completed {
                    pending.push((*offset, bytes));
                }
            }
        }
    }
    pending
}

fn apply(image: &mut [u8], offset: u64, bytes: &[u8]) {
    let start = offset as usize;
    image[start..start + bytes.len()].copy_from_slice(bytes);
}

impl BlockDevice for RecordingDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.current.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(buf.len(), offset, self.current.size_bytes())?;
        // Record and apply under one lock so the event order is the order
        // in which the writes became visible.
        let mut events = self.events.lock().expect("recording lock poisoned");
        self.current.write_at(buf, offset)?;
        events.push(DeviceEvent::Write {
            offset,
            bytes: buf.to_vec(),
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.events
            .lock()
            .expect("recording lock poisoned")
            .push(DeviceEvent::Flush);
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.current.size_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_image_keeps_flushed_writes_and_chosen_pending_ones() {
        let dev = RecordingDevice::new(vec![0; 16]);
        dev.write_at(&[1], 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&[2], 1).unwrap();
        dev.write_at(&[3], 2).unwrap();
        dev.flush().unwrap();
        assert_eq!(dev.writes_in_window(0), 1);
        assert_eq!(dev.writes_in_window(1), 2);
        assert_eq!(dev.writes_in_window(2), 0);
        let none = dev.crash_image(&CrashPoint {
            flushes_completed: 1,
            kept_writes: vec![],
        });
        assert_eq!(&none[..3], &[1, 0, 0]);
        let second = dev.crash_image(&CrashPoint {
            flushes_completed: 1,
            kept_writes: vec![1],
        });
        assert_eq!(&second[..3], &[1, 0, 3]);
        let all = dev.crash_image(&CrashPoint {
            flushes_completed: 2,
            kept_writes: vec![],
        });
        assert_eq!(&all[..3], &[1, 2, 3]);
        let before_any = dev.crash_image(&CrashPoint {
            flushes_completed: 0,
            kept_writes: vec![],
        });
        assert_eq!(&before_any[..3], &[0, 0, 0]);
    }
}
