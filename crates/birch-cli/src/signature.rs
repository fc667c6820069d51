//! What else an image or device holds, found by the signatures libblkid
//! knows them by, so that `birch mkfs` does not silently overwrite another
//! filesystem or a partition table (mkfs.btrfs asks libblkid the same).
//! Only the first [`PROBE_BYTES`] of the device are looked at; the bytes
//! are hostile, so every read is bounds-checked.

/// Enough to reach btrfs's magic (64 KiB + 64) and swap's at the end of a
/// 64 KiB page.
pub const PROBE_BYTES: usize = 64 * 1024 + 4096;

/// The start of the device, as much of [`PROBE_BYTES`] as it has.
struct Probe<'a>(&'a [u8]);

impl Probe<'_> {
    fn bytes(&self, at: usize, len: usize) -> Option<&[u8]> {
        self.0.get(at..at.checked_add(len)?)
    }

    fn is(&self, at: usize, want: &[u8]) -> bool {
        self.bytes(at, want.len()) == Some(want)
    }

    fn le32(&self, at: usize) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(at, 4)?.try_into().ok()?))
    }
}

/// The first foreign signature at the start of the device, named as
/// blkid names it ("an ext4 filesystem", "a GPT partition table"), or None.
/// birch's own superblock is not looked for here (mkfs reads it as birch
/// does, with its checksum).
pub fn foreign_signature(start: &[u8]) -> Option<&'static str> {
    let p = Probe(start);
    if let Some(ext) = ext_version(&p) {
        return Some(ext);
    }
    if p.is(0, b"XFSB") {
        return Some("an xfs filesystem");
    }
    if p.is(64 * 1024 + 64, b"_BHRfS_M") {
        return Some("a btrfs filesystem");
    }
    for page in [4096, 8192, 16384, 65536] {
        if p.is(page - 10, b"SWAPSPACE2") || p.is(page - 10, b"SWAP-SPACE") {
            return Some("swap space");
        }
    }
    let boot_signature = p.is(510, &[0x55, 0xaa]);
    if p.is(3, b"NTFS    ") {
        return Some("an ntfs filesystem");
    }
    if p.is(3, b"EXFAT   ") {
        return Some("an exfat filesystem");
    }
    // FAT12/16 name their type at 54, FAT32 at 82 (boot sector fields
    // `fs_type`); both end with the boot signature.
    if boot_signature && (p.is(54, b"FAT1") || p.is(82, b"FAT32   ")) {
        return Some("a vfat filesystem");
    }
    // GPT's header is in the second logical block: 512 or 4096 bytes in.
    if p.is(512, b"EFI PART") || p.is(4096, b"EFI PART") {
        return Some("a GPT partition table");
    }
    if boot_signature && has_mbr_partition(&p) {
        return Some("an MBR (dos) partition table");
    }
    None
}

/// ext2, ext3 or ext4 by blkid's rules: the superblock at 1024 has magic
/// 0xEF53 at its byte 56; ext4 if it uses a feature ext3 did not have,
/// ext3 if it has a journal, ext2 otherwise.
fn ext_version(p: &Probe) -> Option<&'static str> {
    const SB: usize = 1024;
    if !p.is(SB + 56, &0xEF53u16.to_le_bytes()) {
        return None;
    }
    let compat = p.le32(SB + 0x5c)?;
    let incompat = p.le32(SB + 0x60)?;
    let ro_compat = p.le32(SB + 0x64)?;
    // EXT3_FEATURE_{INCOMPAT,RO_COMPAT}_SUPP: filetype, recover, meta_bg;
    // sparse_super, large_file, btree_dir.
    const EXT3_INCOMPAT: u32 = 0x0002 | 0x0004 | 0x0010;
    const EXT3_RO_COMPAT: u32 = 0x0001 | 0x0002 | 0x0004;
    const HAS_JOURNAL: u32 = 0x0004;
    Some(
        if incompat & !EXT3_INCOMPAT != 0 || ro_compat & !EXT3_RO_COMPAT != 0 {
            "an ext4 filesystem"
        } else if compat & HAS_JOURNAL != 0 {
            "an ext3 filesystem"
        } else {
            "an ext2 filesystem"
        },
    )
}

/// Whether the four MBR entries (16 bytes each from 446) describe at least
/// one partition: a boot flag of 0 or 0x80 on every entry, and one with a
/// type and a size.
fn has_mbr_partition(p: &Probe) -> bool {
    let mut any = false;
    for i in 0..4 {
        let entry = 446 + 16 * i;
        let (Some(flag), Some(kind), Some(sectors)) =
            (p.bytes(entry, 1), p.bytes(entry + 4, 1), p.le32(entry + 12))
        else {
            return false;
        };
        if flag[0] != 0 && flag[0] != 0x80 {
            return false;
        }
        any |= kind[0] != 0 && sectors != 0;
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank() -> Vec<u8> {
        vec![0; PROBE_BYTES]
    }

    fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
    }

    #[test]
    fn zeros_and_short_devices_hold_nothing() {
        assert_eq!(foreign_signature(&blank()), None);
        assert_eq!(foreign_signature(&[]), None);
        // A magic cut off by the end of what was read is not a match.
        let mut short = vec![0; 1081];
        put(&mut short, 1080, &[0x53]);
        assert_eq!(foreign_signature(&short), None);
    }

    #[test]
    fn ext_versions_follow_their_features() {
        let mut b = blank();
        put(&mut b, 1080, &0xEF53u16.to_le_bytes());
        assert_eq!(foreign_signature(&b), Some("an ext2 filesystem"));
        put(&mut b, 1024 + 0x5c, &4u32.to_le_bytes());
        assert_eq!(foreign_signature(&b), Some("an ext3 filesystem"));
        // extents
        put(&mut b, 1024 + 0x60, &0x40u32.to_le_bytes());
        assert_eq!(foreign_signature(&b), Some("an ext4 filesystem"));
    }

    /// Bytes written at an offset into a blank start of device.
    type Fields = &'static [(usize, &'static [u8])];

    #[test]
    fn each_other_signature_is_named() {
        let cases: [(&str, Fields); 10] = [
            ("an xfs filesystem", &[(0, b"XFSB")]),
            ("a btrfs filesystem", &[(65600, b"_BHRfS_M")]),
            ("swap space", &[(4086, b"SWAPSPACE2")]),
            ("swap space", &[(65526, b"SWAP-SPACE")]),
            ("an ntfs filesystem", &[(3, b"NTFS    ")]),
            ("an exfat filesystem", &[(3, b"EXFAT   ")]),
            (
                "a vfat filesystem",
                &[(54, b"FAT16   "), (510, &[0x55, 0xaa])],
            ),
            (
                "a vfat filesystem",
                &[(82, b"FAT32   "), (510, &[0x55, 0xaa])],
            ),
            ("a GPT partition table", &[(512, b"EFI PART")]),
            (
                "an MBR (dos) partition table",
                // One Linux partition (type 0x83) of 2048 sectors.
                &[
                    (446 + 4, &[0x83]),
                    (446 + 12, &[0x00, 0x08, 0, 0]),
                    (510, &[0x55, 0xaa]),
                ],
            ),
        ];
        for (want, fields) in cases {
            let mut b = blank();
            for (at, bytes) in fields {
                put(&mut b, *at, bytes);
            }
            assert_eq!(foreign_signature(&b), Some(want), "{fields:?}");
        }
    }

    #[test]
    fn a_boot_signature_alone_is_no_partition_table() {
        let mut b = blank();
        put(&mut b, 510, &[0x55, 0xaa]);
        assert_eq!(foreign_signature(&b), None);
        // A bad boot flag: not a partition table either.
        put(&mut b, 446, &[0x12]);
        put(&mut b, 446 + 4, &[0x83]);
        put(&mut b, 446 + 12, &[1, 0, 0, 0]);
        assert_eq!(foreign_signature(&b), None);
    }
}
