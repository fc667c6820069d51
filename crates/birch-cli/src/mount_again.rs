//! `birch mount` of an image that a running birch mount already serves.
//!
//! On btrfs a second mount of a mounted device shares its filesystem
//! (`mount -o subvol=@home /dev/sdb /home` beside the root mount). A birch
//! image has one daemon, which holds the image's lock, so the second mount
//! point becomes a bind mount of the chosen subvolume's directory in the
//! running mount (docs/SNAPSHOTS.md, "A second mount of a mounted image").

use crate::loopdev;
use crate::mount::MountArgs;
use crate::subvolume;
use crate::Failure;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of /proc/self/mountinfo that mounts the image.
pub(crate) struct RunningMount {
    pub(crate) mount_point: PathBuf,
    /// The superblock is read-only (its options, after " - ").
    read_only: bool,
}

/// The options a second mount takes: what picks the subvolume and what a
/// bind mount can set per mount point.
#[derive(Default)]
struct SecondMountOptions {
    subvol: Option<String>,
    subvolid: Option<u64>,
    read_only: bool,
    nosuid: bool,
    nodev: bool,
    noexec: bool,
}

/// If a live birch mount serves `args.image`, mounts it again at
/// `args.mountpoint` as a bind mount and returns `Some(exit code)`; `None`
/// when no such mount exists (the caller starts a daemon as usual).
pub fn mount_if_served(args: &MountArgs) -> Result<Option<u8>, Failure> {
    let Some(running) = running_mount(&args.image) else {
        return Ok(None);
    };
    let image = args.image.display();
    let at = running.mount_point.display();
    let options = parse(args, &running)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failure::new(format!(
            "{image}: already mounted at {at}; only root can mount it a second time \
             (a bind mount of the running mount)"
        )));
    }
    if args.write_log.is_some() {
        return Err(Failure::new(format!(
            "--write-log: {image} is already mounted at {at}, whose daemon does every write"
        )));
    }
    if running.read_only && !options.read_only {
        return Err(Failure::new(format!(
            "{image}: mounted read-only at {at}; a second mount must be read-only too \
             (-o ro), or remount that one rw first (mount -i -o remount,rw {at})"
        )));
    }
    let source = subvolume_directory(&running, &options)?;
    bind(&source, &args.mountpoint, &options)?;
    Ok(Some(0))
}

/// The first live birch mount of `image` whose root is the filesystem's
/// root as the daemon shows it (mountinfo's root field `/`), if any.
pub(crate) fn running_mount(image: &Path) -> Option<RunningMount> {
    let canonical = image.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut sources = vec![canonical];
    sources.extend(loopdev::devices_of(image));
    info.lines().find_map(|line| {
        let (mount, sb) = line.split_once(" - ")?;
        let mount: Vec<&str> = mount.split_whitespace().collect();
        let sb: Vec<&str> = sb.split_whitespace().collect();
        let (root, mount_point) = (mount.get(3)?, unescape(mount.get(4)?));
        let (fstype, source, super_options) = (sb.first()?, sb.get(1)?, sb.get(2)?);
        let ours = fstype.starts_with("fuse")
            && *root == "/"
            && sources.iter().any(|s| Path::new(source) == s)
            // A mount whose daemon died answers ENOTCONN: not a mount to share.
            && std::fs::metadata(&mount_point).is_ok();
        ours.then(|| RunningMount {
            mount_point,
            read_only: super_options.split(',').any(|o| o == "ro"),
        })
    })
}

/// mountinfo's octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let text = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsStr::from_bytes(&out))
}

/// The `-o` options of a second mount; anything that would change the
/// running filesystem is refused, naming the running mount.
fn parse(args: &MountArgs, running: &RunningMount) -> Result<SecondMountOptions, Failure> {
    let mut o = SecondMountOptions::default();
    for opt in args
        .options
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| !o.is_empty())
    {
        let (key, value) = opt
            .split_once('=')
            .map_or((opt, None), |(k, v)| (k, Some(v)));
        match (key, value) {
            ("subvol", Some(v)) => o.subvol = Some(v.to_string()),
            ("subvolid", Some(v)) => {
                o.subvolid = Some(v.parse().map_err(|_| {
                    Failure::new(format!("-o subvolid={v}: expected a subvolume id"))
                })?)
            }
            ("ro", None) => o.read_only = true,
            ("rw", None) => o.read_only = false,
            ("nosuid", None) => o.nosuid = true,
            ("suid", None) => o.nosuid = false,
            ("nodev", None) => o.nodev = true,
            ("dev", None) => o.nodev = false,
            ("noexec", None) => o.noexec = true,
            ("exec", None) => o.noexec = false,
            // For mount(8) and fstab, not the filesystem (as in mount.rs).
            (
                "defaults" | "auto" | "noauto" | "nouser" | "_netdev" | "nofail" | "silent"
                | "loud",
                None,
            ) => {}
            ("comment", Some(_)) => {}
            (k, _) if k.starts_with("x-") => {}
            _ => {
                return Err(Failure::new(format!(
                    "-o {opt}: {} is already mounted at {}, and a second mount shares that \
                     mount's filesystem and its settings; it takes only subvol=, subvolid=, \
                     ro, rw, nosuid, nodev and noexec",
                    args.image.display(),
                    running.mount_point.display()
                )))
            }
        }
    }
    Ok(o)
}

/// The directory in the running mount that is the root of the subvolume
/// `options` choose (as a first mount would choose it), checked to be that
/// subvolume's root.
fn subvolume_directory(
    running: &RunningMount,
    options: &SecondMountOptions,
) -> Result<PathBuf, Failure> {
    let at = &running.mount_point;
    let dir = subvolume::open_dir(at)?;
    let listed = subvolume::list_mounted(at)?;
    let path_of = |id: u64| -> Result<String, Failure> {
        listed
            .iter()
            .find(|e| e.id == id)
            .map(|e| String::from_utf8_lossy(&e.path).into_owned())
            .ok_or_else(|| Failure::new(format!("subvolid={id}: no such subvolume")))
    };
    let wanted_path = match (&options.subvol, options.subvolid) {
        (Some(path), _) => path.clone(),
        (None, Some(id)) => path_of(id)?,
        (None, None) => path_of(subvolume::default_id(&dir, at)?)?,
    };
    let wanted =
        components(&wanted_path).map_err(|e| Failure::new(format!("subvol={wanted_path}: {e}")))?;
    let served_path = path_of(subvolume::subvolume_id(&dir, at)?)?;
    let served = components(&served_path)
        .map_err(|e| Failure::new(format!("{}: served subvolume {e}", at.display())))?;
    let below = wanted.strip_prefix(served.as_slice()).ok_or_else(|| {
        Failure::new(format!(
            "subvol={wanted_path}: the running mount at {} shows subvolume '{served_path}', \
             and a second mount can only show it or what lies below it; mount the top \
             level (subvolid=5) first",
            at.display()
        ))
    })?;
    let source = below.iter().fold(at.clone(), |p, c| p.join(c));
    let source_dir = subvolume::open_dir(&source)?;
    if !subvolume::is_subvolume_root(&source_dir, &source)? {
        return Err(Failure::new(format!(
            "subvol={wanted_path}: not a subvolume"
        )));
    }
    if let Some(id) = options.subvolid {
        let found = subvolume::subvolume_id(&source_dir, &source)?;
        if found != id {
            return Err(Failure::new(format!(
                "subvol={wanted_path} is subvolume {found}, but subvolid={id} was given"
            )));
        }
    }
    Ok(source)
}

/// A path from the top level as its components; `..` could leave the
/// mount, so it is refused.
fn components(path: &str) -> Result<Vec<&str>, String> {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err("'..' is not allowed in a subvolume path".to_string());
    }
    Ok(parts)
}

/// Bind-mounts `source` on `target`, then sets the per-mount-point flags
/// (a bind mount takes them only from a remount of itself).
fn bind(source: &Path, target: &Path, options: &SecondMountOptions) -> Result<(), Failure> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| Failure::new(format!("{}: path has a NUL byte", p.display())))
    };
    let (src, dst) = (c(source)?, c(target)?);
    let fail = |what: &str| {
        Failure::new(format!(
            "{what} {} on {}: {}",
            source.display(),
            target.display(),
            std::io::Error::last_os_error()
        ))
    };
    // SAFETY: valid C strings; no filesystem type or data for a bind.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(fail("bind mount of"));
    }
    let flags = [
        (options.read_only, libc::MS_RDONLY),
        (options.nosuid, libc::MS_NOSUID),
        (options.nodev, libc::MS_NODEV),
        (options.noexec, libc::MS_NOEXEC),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .fold(0, |all, (_, flag)| all | flag);
    if flags == 0 {
        return Ok(());
    }
    // SAFETY: as above; the remount changes only the new mount point.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = fail("setting ro/nosuid/nodev/noexec on the bind mount of");
        // SAFETY: a valid C string; undoes the bind made above.
        unsafe { libc::umount2(dst.as_ptr(), 0) };
        return Err(err);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/mnt/a\040b\134c"), PathBuf::from(r"/mnt/a b\c"));
        assert_eq!(unescape(r"/plain"), PathBuf::from("/plain"));
        // A backslash not followed by three octal digits stays as it is.
        assert_eq!(unescape(r"/x\9"), PathBuf::from(r"/x\9"));
    }

    #[test]
    fn subvolume_paths_refuse_dot_dot() {
        assert_eq!(components("/a/./b/").unwrap(), vec!["a", "b"]);
        assert!(components("").unwrap().is_empty());
        assert!(components("a/../b").is_err());
    }
}
