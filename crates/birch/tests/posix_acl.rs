//! POSIX ACLs in the engine (docs/FUSE.md "POSIX ACLs", docs/TREE-LOG.md
//! crash cases A1 to A3): the server's share of what the kernel's
//! fs/posix_acl.c does for local filesystems.

mod common;

use birch::device::BlockDevice;
use birch::format::{
    Acl, AclEntry, ACL_ACCESS_XATTR, ACL_DEFAULT_XATTR, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER,
    ACL_USER, ACL_USER_OBJ,
};
use birch::fs::{Filesystem, SetAttr, XattrSetMode};
use common::{ino, mount, Enumeration};

const IMAGE_BYTES: u64 = 32 << 20;
const NOBODY: u32 = 65534;

fn acl(entries: &[(u16, u16, u32)]) -> Acl {
    Acl {
        entries: entries
            .iter()
            .map(|&(tag, perm, id)| AclEntry { tag, perm, id })
            .collect(),
    }
}

/// `u::rw-, u:nobody:r--, g::r--, m::<mask>, o::---`.
fn nobody_may_read(mask: u16) -> Acl {
    acl(&[
        (ACL_USER_OBJ, 6, 0),
        (ACL_USER, 4, NOBODY),
        (ACL_GROUP_OBJ, 4, 0),
        (ACL_MASK, mask, 0),
        (ACL_OTHER, 0, 0),
    ])
}

fn stored<D: BlockDevice + 'static>(fs: &Filesystem<D>, ino: u64, name: &[u8]) -> Option<Acl> {
    fs.getxattr(ino, name)
        .ok()
        .map(|v| Acl::decode(&v).expect("stored ACL is valid"))
}

fn perm_of(acl: &Acl, tag: u16) -> u16 {
    acl.entries.iter().find(|e| e.tag == tag).unwrap().perm
}

fn set(fs: &Filesystem<impl BlockDevice + 'static>, ino: u64, name: &[u8], acl: &Acl) {
    fs.setxattr(ino, name, &acl.encode(), XattrSetMode::default())
        .unwrap();
}

fn new_fs() -> Filesystem<std::sync::Arc<birch::device::MemoryDevice>> {
    mount(common::memory_fs(IMAGE_BYTES, 7))
}

#[test]
fn access_acl_round_trips_and_sets_the_group_bits_from_the_mask() {
    let fs = new_fs();
    let f = fs.create(fs.root_ino(), b"f", 0o600, 0, 0).unwrap().ino;
    let a = nobody_may_read(4);
    set(&fs, f, ACL_ACCESS_XATTR, &a);
    assert_eq!(stored(&fs, f, ACL_ACCESS_XATTR), Some(a));
    assert_eq!(fs.getattr(f).unwrap().perm & 0o777, 0o640);
    assert!(fs
        .listxattr(f)
        .unwrap()
        .contains(&ACL_ACCESS_XATTR.to_vec()));
}

#[test]
fn malformed_acl_is_refused_and_not_stored() {
    let fs = new_fs();
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o600, 0, 0).unwrap().ino;
    let no_mask = acl(&[
        (ACL_USER_OBJ, 6, 0),
        (ACL_USER, 4, NOBODY),
        (ACL_GROUP_OBJ, 4, 0),
        (ACL_OTHER, 0, 0),
    ]);
    let valid = nobody_may_read(4).encode();
    for bad in [
        no_mask.encode(),
        valid[..valid.len() - 1].to_vec(),
        b"\x02\0\0\0".to_vec(),
    ] {
        let err = fs
            .setxattr(f, ACL_ACCESS_XATTR, &bad, XattrSetMode::default())
            .unwrap_err();
        assert_eq!(err.errno(), libc::EINVAL, "{err}");
    }
    assert!(fs.getxattr(f, ACL_ACCESS_XATTR).is_err());
    assert_eq!(fs.getattr(f).unwrap().perm & 0o777, 0o600);
    // A default ACL belongs to directories only.
    let err = fs
        .setxattr(f, ACL_DEFAULT_XATTR, &valid, XattrSetMode::default())
        .unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL, "{err}");
}

#[test]
fn equivalent_access_acl_collapses_into_the_mode() {
    let fs = new_fs();
    let f = fs.create(fs.root_ino(), b"f", 0o600, 0, 0).unwrap().ino;
    set(&fs, f, ACL_ACCESS_XATTR, &nobody_may_read(4));
    set(&fs, f, ACL_ACCESS_XATTR, &Acl::from_mode(0o754));
    assert_eq!(
        stored(&fs, f, ACL_ACCESS_XATTR),
        None,
        "the mode carries it"
    );
    assert_eq!(fs.getattr(f).unwrap().perm & 0o777, 0o754);
}

/// FUSE_SETXATTR_ACL_KILL_SGID (fstests generic/375): an access ACL set
/// with `kill_sgid` clears set-group-ID, stored or folded into the mode,
/// and leaves set-user-ID and sticky; a default ACL and any other name
/// ignore it, and without it the bit stays.
#[test]
fn access_acl_with_kill_sgid_clears_set_group_id_only() {
    let fs = new_fs();
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o6750, 0, 0).unwrap().ino;
    let d = fs.mkdir(root, b"d", 0o3755, 0, 0).unwrap().ino;
    let mode_of = |ino| u32::from(fs.getattr(ino).unwrap().perm);
    let kill = |ino, name: &[u8], value: &[u8], kill_sgid| {
        fs.setxattr_kill_sgid(ino, name, value, XattrSetMode::default(), kill_sgid)
            .unwrap()
    };
    kill(f, ACL_ACCESS_XATTR, &nobody_may_read(4).encode(), false);
    assert_eq!(mode_of(f), 0o6640, "no kill: the bit stays");
    kill(f, b"user.x", b"v", true);
    assert_eq!(mode_of(f), 0o6640, "not an ACL");
    kill(f, ACL_ACCESS_XATTR, &nobody_may_read(4).encode(), true);
    assert_eq!(mode_of(f), 0o4640, "stored ACL");
    assert!(stored(&fs, f, ACL_ACCESS_XATTR).is_some());
    kill(d, ACL_DEFAULT_XATTR, &nobody_may_read(7).encode(), true);
    assert_eq!(mode_of(d), 0o3755, "a default ACL changes no mode");
    kill(d, ACL_ACCESS_XATTR, &Acl::from_mode(0o777).encode(), true);
    assert_eq!(mode_of(d), 0o1777, "folded into the mode");
    assert_eq!(stored(&fs, d, ACL_ACCESS_XATTR), None);
}

#[test]
fn chmod_updates_the_mask_and_without_one_the_group_entry() {
    let fs = new_fs();
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o600, 0, 0).unwrap().ino;
    set(&fs, f, ACL_ACCESS_XATTR, &nobody_may_read(4));
    let chmod = |ino, mode| {
        let changes = SetAttr {
            mode: Some(mode),
            ..Default::default()
        };
        fs.setattr(ino, &changes).unwrap();
    };
    chmod(f, 0o705);
    let a = stored(&fs, f, ACL_ACCESS_XATTR).unwrap();
    assert_eq!(
        (
            perm_of(&a, ACL_USER_OBJ),
            perm_of(&a, ACL_MASK),
            perm_of(&a, ACL_OTHER)
        ),
        (7, 0, 5)
    );
    assert_eq!(perm_of(&a, ACL_USER), 4, "named entries keep their bits");
    assert_eq!(
        perm_of(&a, ACL_GROUP_OBJ),
        4,
        "the mask stands for the group class"
    );
    // A directory's default ACL has no mask here: chmod leaves it alone.
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let minimal = Acl::from_mode(0o750);
    set(&fs, d, ACL_DEFAULT_XATTR, &minimal);
    chmod(d, 0o700);
    assert_eq!(stored(&fs, d, ACL_DEFAULT_XATTR), Some(minimal));
}

#[test]
fn default_acl_is_inherited_at_create_and_mkdir_with_mode_masking() {
    let fs = new_fs();
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let default = acl(&[
        (ACL_USER_OBJ, 7, 0),
        (ACL_USER, 7, NOBODY),
        (ACL_GROUP_OBJ, 5, 0),
        (ACL_MASK, 7, 0),
        (ACL_OTHER, 5, 0),
    ]);
    set(&fs, d, ACL_DEFAULT_XATTR, &default);
    // The default ACL replaces the umask (077 here would leave 0600).
    let f = fs
        .make_node(d, b"f", libc::S_IFREG | 0o666, 0o077, 0, 0, 0)
        .unwrap();
    assert_eq!(f.perm & 0o777, 0o664);
    let fa = stored(&fs, f.ino, ACL_ACCESS_XATTR).unwrap();
    assert_eq!(perm_of(&fa, ACL_MASK), 6, "the create mode masks the mask");
    assert_eq!(perm_of(&fa, ACL_USER), 7);
    assert_eq!(stored(&fs, f.ino, ACL_DEFAULT_XATTR), None);
    let sub = fs
        .make_node(d, b"sub", libc::S_IFDIR | 0o750, 0o077, 0, 0, 0)
        .unwrap();
    assert_eq!(sub.perm & 0o777, 0o750);
    let sa = stored(&fs, sub.ino, ACL_ACCESS_XATTR).unwrap();
    assert_eq!((perm_of(&sa, ACL_MASK), perm_of(&sa, ACL_OTHER)), (5, 0));
    assert_eq!(stored(&fs, sub.ino, ACL_DEFAULT_XATTR), Some(default));
    // A symlink takes no ACL.
    let l = fs.symlink(d, b"l", b"f", 0, 0).unwrap().ino;
    assert_eq!(stored(&fs, l, ACL_ACCESS_XATTR), None);
    // Without a default ACL the umask applies and nothing is inherited.
    let g = fs
        .make_node(root, b"g", libc::S_IFREG | 0o666, 0o027, 0, 0, 0)
        .unwrap();
    assert_eq!(g.perm & 0o777, 0o640);
    assert_eq!(stored(&fs, g.ino, ACL_ACCESS_XATTR), None);
}

/// An O_TMPFILE inode inherits its directory's default ACL as a named
/// create does, and keeps it when linked in (fstests generic/389); the
/// umask applies only without one.
#[test]
fn tmpfile_inherits_the_default_acl() {
    let fs = new_fs();
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    set(&fs, d, ACL_DEFAULT_XATTR, &nobody_may_read(7));
    let t = fs.tmpfile(d, 0o666, 0o022, 0, 0).unwrap();
    assert_eq!(t.perm & 0o777, 0o660, "the default ACL, not the umask");
    let ta = stored(&fs, t.ino, ACL_ACCESS_XATTR).unwrap();
    assert_eq!(perm_of(&ta, ACL_USER), 4);
    fs.link(t.ino, d, b"linked").unwrap();
    let linked = ino(&fs, "/d/linked");
    assert_eq!(fs.getattr(linked).unwrap().perm & 0o777, 0o660);
    assert!(stored(&fs, linked, ACL_ACCESS_XATTR).is_some());
    let u = fs.tmpfile(root, 0o666, 0o022, 0, 0).unwrap();
    assert_eq!(u.perm & 0o777, 0o644);
    assert_eq!(stored(&fs, u.ino, ACL_ACCESS_XATTR), None);
}

/// A minimal default ACL passes on no access ACL: the new inode's mode
/// says everything (posix_acl_create stores none then).
#[test]
fn minimal_default_acl_leaves_only_a_mode() {
    let fs = new_fs();
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    set(&fs, d, ACL_DEFAULT_XATTR, &Acl::from_mode(0o750));
    let f = fs
        .make_node(d, b"f", libc::S_IFREG | 0o666, 0o022, 0, 0, 0)
        .unwrap();
    assert_eq!(f.perm & 0o777, 0o640);
    assert_eq!(stored(&fs, f.ino, ACL_ACCESS_XATTR), None);
}

/// Crash case A1 (docs/TREE-LOG.md): `mkdir d; setfacl -d -m u:nobody:rwx
/// d; sync; touch d/f; fsync d/f; <cut>` → once `d/f` exists it has the
/// inherited ACL and the mode that goes with it; after the fsync it
/// exists.
#[test]
fn inherited_acl_survives_fsync_and_power_cut() {
    let rec = common::recorder(IMAGE_BYTES, 5);
    let fs = mount(rec.clone());
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    set(&fs, d, ACL_DEFAULT_XATTR, &nobody_may_read(7));
    fs.sync().unwrap();
    let start = rec.flush_count();
    let f = fs
        .make_node(d, b"f", libc::S_IFREG | 0o666, 0o077, 0, 0, 0)
        .unwrap()
        .ino;
    fs.fsync(f, false).unwrap();
    assert_eq!(fs.stats().commits, 1, "answered by the log");
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(31), |p, fs, v| {
        if !v.contains_key("/d/f") {
            return if p.flushes_completed >= synced {
                Err("d/f is gone after its fsync".into())
            } else {
                Ok(())
            };
        }
        let f = ino(fs, "d/f");
        let a = stored(fs, f, ACL_ACCESS_XATTR).ok_or("d/f lost its inherited ACL")?;
        let mode = fs.getattr(f).unwrap().perm & 0o777;
        if a != nobody_may_read(6) || mode != 0o660 {
            return Err(format!("d/f has mode {mode:o} and ACL {a:?}"));
        }
        Ok(())
    });
}

/// Crash case A2 (docs/TREE-LOG.md): `touch f; setfacl -m u:nobody:r f;
/// sync; chmod 600 f; fsync f; <cut>` → the mode and the ACL's mask agree
/// in every state (both old or both new), and after the fsync both are
/// new: nobody's entry is masked off.
#[test]
fn chmod_mask_survives_fsync_and_power_cut() {
    let rec = common::recorder(IMAGE_BYTES, 5);
    let fs = mount(rec.clone());
    let f = fs.create(fs.root_ino(), b"f", 0o640, 0, 0).unwrap().ino;
    set(&fs, f, ACL_ACCESS_XATTR, &nobody_may_read(4));
    fs.sync().unwrap();
    let start = rec.flush_count();
    let changes = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    fs.setattr(f, &changes).unwrap();
    fs.fsync(f, false).unwrap();
    assert_eq!(fs.stats().commits, 1, "answered by the log");
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(37), |p, fs, _| {
        let f = ino(fs, "f");
        let mask = perm_of(
            &stored(fs, f, ACL_ACCESS_XATTR).ok_or("f lost its ACL")?,
            ACL_MASK,
        );
        let mode = fs.getattr(f).unwrap().perm & 0o777;
        match (mode, mask) {
            (0o600, 0) => Ok(()),
            (0o640, 4) if p.flushes_completed < synced => Ok(()),
            _ => Err(format!("mode {mode:o} with mask {mask}")),
        }
    });
}

/// Crash case A3 (docs/TREE-LOG.md): `chmod 2750 f; sync; setfacl -m
/// u:nobody:r f` by the owner outside f's group (KILL_SGID); `fsync f;
/// <cut>` → in every state f is 02750 without an ACL or 0750 with it,
/// never one change without the other; after the fsync, the second.
#[test]
fn acl_kill_sgid_survives_fsync_and_power_cut() {
    let rec = common::recorder(IMAGE_BYTES, 5);
    let fs = mount(rec.clone());
    let f = fs.create(fs.root_ino(), b"f", 0o2750, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let start = rec.flush_count();
    // What `setfacl -m u:nobody:r` makes of mode 0750.
    let value = acl(&[
        (ACL_USER_OBJ, 7, 0),
        (ACL_USER, 4, NOBODY),
        (ACL_GROUP_OBJ, 5, 0),
        (ACL_MASK, 5, 0),
        (ACL_OTHER, 0, 0),
    ])
    .encode();
    fs.setxattr_kill_sgid(f, ACL_ACCESS_XATTR, &value, XattrSetMode::default(), true)
        .unwrap();
    fs.fsync(f, false).unwrap();
    assert_eq!(fs.stats().commits, 1, "answered by the log");
    let synced = rec.flush_count();
    std::mem::forget(fs);
    common::for_every_crash_mount_after(&rec, start, &Enumeration::sampled(41), |p, fs, _| {
        let f = ino(fs, "f");
        let mode = u32::from(fs.getattr(f).unwrap().perm);
        match (mode, stored(fs, f, ACL_ACCESS_XATTR)) {
            (0o750, Some(_)) => Ok(()),
            (0o2750, None) if p.flushes_completed < synced => Ok(()),
            (mode, acl) => Err(format!("mode {mode:o} with ACL {acl:?}")),
        }
    });
}
