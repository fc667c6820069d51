//! POSIX ACLs in the kernel's xattr form (`system.posix_acl_access`,
//! `system.posix_acl_default`): a little-endian u32 version 2, then one
//! 8-byte entry per rule, `u16 tag, u16 perm, u32 id`. birch stores the
//! value as the kernel sends it; docs/FUSE.md ("POSIX ACLs") says who
//! applies what, and the functions here are the server's share of
//! fs/posix_acl.c: validation, the mode an ACL is equivalent to, chmod,
//! and inheritance at create.

/// The xattr holding a file's access ACL.
pub const ACL_ACCESS_XATTR: &[u8] = b"system.posix_acl_access";
/// The xattr holding a directory's default ACL (inherited at create).
pub const ACL_DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";

const ACL_XATTR_VERSION: u32 = 2;
const HEADER_BYTES: usize = 4;
const ENTRY_BYTES: usize = 8;

pub const ACL_USER_OBJ: u16 = 0x01;
pub const ACL_USER: u16 = 0x02;
pub const ACL_GROUP_OBJ: u16 = 0x04;
pub const ACL_GROUP: u16 = 0x08;
pub const ACL_MASK: u16 = 0x10;
pub const ACL_OTHER: u16 = 0x20;

/// The id the kernel writes into entries that name no user or group.
const ACL_UNDEFINED_ID: u32 = u32::MAX;

/// One rule of an ACL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: u16,
    /// rwx as 4/2/1.
    pub perm: u16,
    /// The user or group of an ACL_USER or ACL_GROUP entry.
    pub id: u32,
}

/// A valid ACL: entries in the kernel's order (posix_acl_valid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    pub entries: Vec<AclEntry>,
}

/// Where the order of tags is checked: each tag's rank in the required
/// order USER_OBJ, USER..., GROUP_OBJ, GROUP..., MASK, OTHER.
fn tag_rank(tag: u16) -> Option<u8> {
    match tag {
        ACL_USER_OBJ => Some(0),
        ACL_USER => Some(1),
        ACL_GROUP_OBJ => Some(2),
        ACL_GROUP => Some(3),
        ACL_MASK => Some(4),
        ACL_OTHER => Some(5),
        _ => None,
    }
}

impl Acl {
    /// Parses and validates an xattr value by the kernel's rules
    /// (posix_acl_from_xattr + posix_acl_valid). The error names what is
    /// wrong, for EINVAL at setxattr and for `birch check`.
    pub fn decode(value: &[u8]) -> Result<Acl, String> {
        let body = value
            .get(HEADER_BYTES..)
            .ok_or_else(|| format!("ACL of {} bytes has no version header", value.len()))?;
        let version = u32::from_le_bytes(value[..HEADER_BYTES].try_into().expect("4 bytes"));
        if version != ACL_XATTR_VERSION {
            return Err(format!("ACL version {version}, not {ACL_XATTR_VERSION}"));
        }
        if body.is_empty() || body.len() % ENTRY_BYTES != 0 {
            return Err(format!(
                "ACL body of {} bytes is not a positive number of {ENTRY_BYTES}-byte entries",
                body.len()
            ));
        }
        let entries: Vec<AclEntry> = body
            .chunks_exact(ENTRY_BYTES)
            .map(|e| AclEntry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        let mut previous: Option<(u8, u32)> = None;
        let mut named = false;
        let mut counts = [0u32; 6];
        for (i, e) in entries.iter().enumerate() {
            let rank = tag_rank(e.tag)
                .ok_or_else(|| format!("ACL entry {i}: unknown tag {:#x}", e.tag))?;
            if e.perm & !7 != 0 {
                return Err(format!(
                    "ACL entry {i}: permission bits {:#o} beyond rwx",
                    e.perm
                ));
            }
            let is_named = matches!(e.tag, ACL_USER | ACL_GROUP);
            named |= is_named;
            counts[usize::from(rank)] += 1;
            if let Some((prev_rank, prev_id)) = previous {
                let in_order =
                    rank > prev_rank || (is_named && rank == prev_rank && e.id > prev_id);
                if !in_order {
                    return Err(format!(
                        "ACL entry {i} (tag {:#x}, id {}) is out of order",
                        e.tag, e.id
                    ));
                }
            }
            previous = Some((rank, e.id));
        }
        let [user_obj, _, group_obj, _, mask, other] = counts;
        if user_obj != 1 || group_obj != 1 || other != 1 {
            return Err("ACL lacks a user, group or other entry".to_string());
        }
        if named && mask == 0 {
            return Err("ACL names users or groups but has no mask entry".to_string());
        }
        Ok(Acl { entries })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + ENTRY_BYTES * self.entries.len());
        out.extend_from_slice(&ACL_XATTR_VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    /// The minimal ACL of mode bits `mode` (three entries).
    pub fn from_mode(mode: u32) -> Acl {
        let entry = |tag, shift: u32| AclEntry {
            tag,
            perm: ((mode >> shift) & 7) as u16,
            id: ACL_UNDEFINED_ID,
        };
        Acl {
            entries: vec![
                entry(ACL_USER_OBJ, 6),
                entry(ACL_GROUP_OBJ, 3),
                entry(ACL_OTHER, 0),
            ],
        }
    }

    /// posix_acl_equiv_mode: `mode` with its rwx bits replaced by what the
    /// ACL grants the owner, the group class (the mask if there is one)
    /// and others, and whether the ACL says more than those bits can
    /// (named entries or a mask): then it must be kept.
    pub fn equiv_mode(&self, mode: u32) -> (u32, bool) {
        let mut bits = 0;
        let mut extended = false;
        for e in &self.entries {
            let perm = u32::from(e.perm);
            match e.tag {
                ACL_USER_OBJ => bits |= perm << 6,
                ACL_GROUP_OBJ => bits |= perm << 3,
                ACL_OTHER => bits |= perm,
                ACL_MASK => {
                    bits = (bits & !0o070) | (perm << 3);
                    extended = true;
                }
                _ => extended = true,
            }
        }
        ((mode & !0o777) | bits, extended)
    }

    /// posix_acl_chmod: a chmod to `mode` rewrites the owner and other
    /// entries, and the mask (or, without one, the group entry) to the
    /// group bits, so that the ACL and the mode keep agreeing.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.entries.iter().any(|e| e.tag == ACL_MASK);
        let class = if has_mask { ACL_MASK } else { ACL_GROUP_OBJ };
        for e in &mut self.entries {
            let shift = match e.tag {
                ACL_USER_OBJ => 6,
                ACL_OTHER => 0,
                t if t == class => 3,
                _ => continue,
            };
            e.perm = ((mode >> shift) & 7) as u16;
        }
    }

    /// posix_acl_create_masq: the access ACL a new inode created with
    /// `mode` inherits from its directory's default ACL (`self`), and the
    /// mode it gets: each class keeps only what both grant. The second
    /// value says whether the result says more than the mode bits (then
    /// it is stored; otherwise the mode alone carries it).
    pub fn inherit(&self, mode: u32) -> (Acl, u32, bool) {
        let mut acl = self.clone();
        let mut bits = mode & 0o777;
        let mut extended = false;
        let has_mask = acl.entries.iter().any(|e| e.tag == ACL_MASK);
        for e in &mut acl.entries {
            let shift = match e.tag {
                ACL_USER_OBJ => 6,
                ACL_OTHER => 0,
                ACL_MASK => 3,
                ACL_GROUP_OBJ if !has_mask => 3,
                _ => {
                    extended = true;
                    continue;
                }
            };
            let granted = ((bits >> shift) & 7) as u16;
            e.perm &= granted;
            bits = (bits & !(7 << shift)) | (u32::from(e.perm) << shift);
            if e.tag == ACL_MASK {
                extended = true;
            }
        }
        let mode = (mode & !0o777) | bits;
        (acl, mode, extended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        Acl {
            entries: entries
                .iter()
                .map(|&(tag, perm, id)| AclEntry { tag, perm, id })
                .collect(),
        }
        .encode()
    }

    #[test]
    fn named_entry_without_mask_is_invalid() {
        let value = acl(&[
            (ACL_USER_OBJ, 6, 0),
            (ACL_USER, 4, 65534),
            (ACL_GROUP_OBJ, 4, 0),
            (ACL_OTHER, 0, 0),
        ]);
        assert!(Acl::decode(&value).unwrap_err().contains("mask"));
    }

    #[test]
    fn entries_out_of_order_are_invalid() {
        let value = acl(&[
            (ACL_GROUP_OBJ, 4, 0),
            (ACL_USER_OBJ, 6, 0),
            (ACL_OTHER, 0, 0),
        ]);
        assert!(Acl::decode(&value).unwrap_err().contains("out of order"));
        let value = acl(&[
            (ACL_USER_OBJ, 6, 0),
            (ACL_USER, 4, 7),
            (ACL_USER, 4, 7),
            (ACL_GROUP_OBJ, 4, 0),
            (ACL_MASK, 4, 0),
            (ACL_OTHER, 0, 0),
        ]);
        assert!(Acl::decode(&value).unwrap_err().contains("out of order"));
    }

    #[test]
    fn truncated_or_wrong_version_is_invalid() {
        let value = acl(&[
            (ACL_USER_OBJ, 6, 0),
            (ACL_GROUP_OBJ, 4, 0),
            (ACL_OTHER, 0, 0),
        ]);
        assert!(Acl::decode(&value[..value.len() - 1]).is_err());
        assert!(Acl::decode(&value[..2]).is_err());
        let mut v1 = value.clone();
        v1[0] = 1;
        assert!(Acl::decode(&v1).is_err());
        assert!(Acl::decode(&value).is_ok());
    }

    #[test]
    fn inherit_masks_the_group_class_by_the_create_mode() {
        let default = Acl::decode(&acl(&[
            (ACL_USER_OBJ, 7, 0),
            (ACL_USER, 7, 1000),
            (ACL_GROUP_OBJ, 5, 0),
            (ACL_MASK, 7, 0),
            (ACL_OTHER, 5, 0),
        ]))
        .unwrap();
        let (inherited, mode, extended) = default.inherit(libc::S_IFREG | 0o640);
        assert!(extended);
        assert_eq!(mode, libc::S_IFREG | 0o640);
        let mask = inherited
            .entries
            .iter()
            .find(|e| e.tag == ACL_MASK)
            .unwrap();
        assert_eq!(mask.perm, 4);
        let user = inherited
            .entries
            .iter()
            .find(|e| e.tag == ACL_USER)
            .unwrap();
        assert_eq!(
            user.perm, 7,
            "named entries keep their bits; the mask limits them"
        );
    }
}
