//! A copy-on-write device over a shared image: crash states share the
//! image of everything before their flush point and keep only their own
//! writes (and what mount and close write) in a per-state overlay, so no
//! state copies the whole device.

use birch::device::BlockDevice;
use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, RwLock};

const SECTOR: u64 = 4096;

/// Reads fall through to `base` where the overlay has no sector.
pub struct OverlayDevice {
    base: Arc<Vec<u8>>,
    overlay: RwLock<BTreeMap<u64, Box<[u8]>>>,
}

impl OverlayDevice {
    pub fn new(base: Arc<Vec<u8>>) -> Self {
        OverlayDevice {
            base,
            overlay: RwLock::new(BTreeMap::new()),
        }
    }

    /// Sectors written on top of the base.
    pub fn overlay_sectors(&self) -> usize {
        self.overlay.read().expect("overlay lock").len()
    }

    /// The whole content (base with the overlay applied).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = self.base.as_ref().clone();
        for (&s, data) in self.overlay.read().expect("overlay lock").iter() {
            let at = (s * SECTOR) as usize;
            out[at..at + data.len()].copy_from_slice(data);
        }
        out
    }

    fn check(&self, len: usize, offset: u64) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.base.len() as u64 => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "access of {len} bytes at {offset} is beyond the device end ({} bytes)",
                    self.base.len()
                ),
            )),
        }
    }
}

impl BlockDevice for OverlayDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(buf.len(), offset)?;
        let overlay = self.overlay.read().expect("overlay lock");
        let mut pos = offset;
        let end = offset + buf.len() as u64;
        while pos < end {
            let sector = pos / SECTOR;
            let in_sector = (pos % SECTOR) as usize;
            let n = ((SECTOR as usize - in_sector) as u64).min(end - pos) as usize;
            let dst = &mut buf[(pos - offset) as usize..(pos - offset) as usize + n];
            match overlay.get(&sector) {
                Some(data) => dst.copy_from_slice(&data[in_sector..in_sector + n]),
                None => dst.copy_from_slice(&self.base[pos as usize..pos as usize + n]),
            }
            pos += n as u64;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(buf.len(), offset)?;
        let mut overlay = self.overlay.write().expect("overlay lock");
        let mut pos = offset;
        let end = offset + buf.len() as u64;
        while pos < end {
            let sector = pos / SECTOR;
            let in_sector = (pos % SECTOR) as usize;
            let n = ((SECTOR as usize - in_sector) as u64).min(end - pos) as usize;
            let start = (sector * SECTOR) as usize;
            let data = overlay.entry(sector).or_insert_with(|| {
                self.base[start..start + SECTOR as usize]
                    .to_vec()
                    .into_boxed_slice()
            });
            data[in_sector..in_sector + n]
                .copy_from_slice(&buf[(pos - offset) as usize..(pos - offset) as usize + n]);
            pos += n as u64;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.base.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_reads_its_writes_and_the_base_elsewhere() {
        let base = Arc::new((0..3 * SECTOR).map(|i| i as u8).collect::<Vec<u8>>());
        let dev = OverlayDevice::new(base.clone());
        dev.write_at(&[0xAA; 10], 4090).unwrap();
        let mut buf = vec![0u8; 20];
        dev.read_at(&mut buf, 4085).unwrap();
        let mut want = base[4085..4105].to_vec();
        want[5..15].fill(0xAA);
        assert_eq!(buf, want);
        assert_eq!(dev.overlay_sectors(), 2);
        let mut whole = base.as_ref().clone();
        whole[4090..4100].fill(0xAA);
        assert_eq!(dev.to_vec(), whole);
        assert!(dev.read_at(&mut buf, 3 * SECTOR - 10).is_err());
    }
}
