//! Who sent a request, as far as the daemon can know (docs/FUSE.md,
//! "Idmapped mounts").
//!
//! With FUSE_ALLOW_IDMAP in force (every mount of a superblock whose INIT
//! reply set it, idmapped or not) the kernel puts the caller's ids in a
//! request only when it creates an inode (CREATE, MKNOD, MKDIR, SYMLINK,
//! TMPFILE), mapped through the mount's idmap into the filesystem's ids;
//! every other request carries `FUSE_INVALID_UIDGID`, `(u32)-1`, which is
//! no one's id. The pid is always the caller's.

use fuser::Request;

/// `FUSE_INVALID_UIDGID`: the uid and gid of a request that creates no
/// inode, once FUSE_ALLOW_IDMAP is negotiated.
pub(crate) const INVALID_ID: u32 = u32::MAX;

/// The ids a request carries: `None` where the kernel sent
/// [`INVALID_ID`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caller {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub pid: u32,
}

impl Caller {
    pub(crate) fn of(req: &Request) -> Caller {
        Caller::from_ids(req.uid(), req.gid(), req.pid())
    }

    pub(crate) fn from_ids(uid: u32, gid: u32, pid: u32) -> Caller {
        let known = |id: u32| (id != INVALID_ID).then_some(id);
        Caller {
            uid: known(uid),
            gid: known(gid),
            pid,
        }
    }

    /// Whether the caller is in group `gid`: its own group, or one of its
    /// supplementary groups (FUSE sends only the first; the rest are read
    /// from /proc). A request without ids is judged by its process's
    /// filesystem gid and groups, if it runs in the daemon's user
    /// namespace ([`ProcessCreds::of_process`]): through an idmapped
    /// mount those are its unmapped ids, the best there is. Whatever
    /// cannot be read answers no, which only ever drops a set-group-ID
    /// bit the kernel might have kept.
    pub(crate) fn in_group(&self, gid: u32) -> bool {
        match self.gid {
            Some(own) if own == gid => true,
            Some(_) => std::fs::read_to_string(format!("/proc/{}/status", self.pid))
                .is_ok_and(|status| groups(&status).contains(&gid)),
            None => ProcessCreds::of_process(self.pid)
                .is_some_and(|p| p.fsgid == gid || p.groups.contains(&gid)),
        }
    }

    /// Whether the caller has CAP_FSETID, which FUSE does not pass: uid 0
    /// stands for it; a request without ids is judged by its process
    /// ([`ProcessCreds::of_process`]; no if /proc cannot tell).
    pub(crate) fn may_keep_set_id(&self) -> bool {
        match self.uid {
            Some(uid) => uid == 0,
            None => ProcessCreds::of_process(self.pid).is_some_and(|p| p.cap_fsetid),
        }
    }
}

/// The supplementary groups in a `/proc/PID/status`.
fn groups(status: &str) -> Vec<u32> {
    status_field(status, "Groups:")
        .map(|g| {
            g.split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The value of a `/proc/PID/status` line starting with `key`.
fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(key))
}

/// CAP_FSETID's and CAP_SYS_ADMIN's bits in `CapEff`.
const CAP_FSETID: u32 = 4;
const CAP_SYS_ADMIN: u32 = 21;

/// What `/proc/PID/status` says of a process: its filesystem uid and
/// gid, supplementary groups, and whether it has CAP_SYS_ADMIN and
/// CAP_FSETID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcessCreds {
    pub fsuid: u32,
    pub fsgid: u32,
    pub groups: Vec<u32>,
    pub cap_sys_admin: bool,
    pub cap_fsetid: bool,
}

impl ProcessCreds {
    /// Parses a `/proc/PID/status`; `None` if a field is missing or
    /// malformed.
    pub(crate) fn parse(status: &str) -> Option<ProcessCreds> {
        // "Uid:\treal\teffective\tsaved\tfilesystem".
        let fs_id = |key| {
            status_field(status, key)?
                .split_whitespace()
                .nth(3)?
                .parse()
                .ok()
        };
        let cap_eff = u64::from_str_radix(status_field(status, "CapEff:")?.trim(), 16).ok()?;
        Some(ProcessCreds {
            fsuid: fs_id("Uid:")?,
            fsgid: fs_id("Gid:")?,
            groups: groups(status),
            cap_sys_admin: cap_eff & (1 << CAP_SYS_ADMIN) != 0,
            cap_fsetid: cap_eff & (1 << CAP_FSETID) != 0,
        })
    }

    /// The credentials of process (thread) `pid` if it runs in the
    /// daemon's own user namespace, where its capabilities and ids mean
    /// what they say to us; `None` otherwise, or if /proc cannot tell
    /// (the process is gone, or not ours to inspect: reading another
    /// process's namespace needs ptrace access, which root has).
    ///
    /// The caller of a request waits in the kernel until it is answered,
    /// so its pid names it while its request is served; the one window is
    /// a caller killed meanwhile whose pid a new process takes before
    /// /proc is read (the same holds for [`Caller::in_group`]).
    pub(crate) fn of_process(pid: u32) -> Option<ProcessCreds> {
        use std::os::unix::fs::MetadataExt;
        if pid == 0 {
            // The caller's pid is not visible in the mount's pid namespace.
            return None;
        }
        let ns = |path: &str| std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok();
        if ns(&format!("/proc/{pid}/ns/user"))? != ns("/proc/self/ns/user")? {
            return None;
        }
        ProcessCreds::parse(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_ids_are_nobodys() {
        let c = Caller::from_ids(INVALID_ID, INVALID_ID, 7);
        assert_eq!((c.uid, c.gid), (None, None));
        // Pid 0: no process to ask, so in no group and without CAP_FSETID.
        let c = Caller::from_ids(INVALID_ID, INVALID_ID, 0);
        assert!(!c.in_group(INVALID_ID));
        assert!(!c.in_group(0));
        assert!(!c.may_keep_set_id());
        let c = Caller::from_ids(1000, 100, 7);
        assert_eq!((c.uid, c.gid), (Some(1000), Some(100)));
        assert!(c.in_group(100));
        assert!(!c.may_keep_set_id());
        assert!(Caller::from_ids(0, 0, 7).may_keep_set_id());
    }

    #[test]
    fn process_creds_from_status() {
        let status = "Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t50\t51\t52\t53\n\
                      Groups:\t7 8 \nCapEff:\t0000000000200000\n";
        assert_eq!(
            ProcessCreds::parse(status),
            Some(ProcessCreds {
                fsuid: 1003,
                fsgid: 53,
                groups: vec![7, 8],
                cap_sys_admin: true,
                cap_fsetid: false,
            })
        );
        let status = "Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nCapEff:\t00000000001fffff\n";
        let p = ProcessCreds::parse(status).unwrap();
        assert!(!p.cap_sys_admin && p.cap_fsetid && p.groups.is_empty());
        assert_eq!(ProcessCreds::parse("Uid:\t0\t0\nGid:\t0\t0\t0\t0\n"), None);
    }

    #[test]
    fn own_process_is_in_our_namespace() {
        let pid = std::process::id();
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        assert_eq!(ProcessCreds::of_process(pid).map(|c| c.fsuid), Some(uid));
        assert_eq!(ProcessCreds::of_process(0), None);
    }
}
