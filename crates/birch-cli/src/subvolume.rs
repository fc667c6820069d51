//! `birch subvolume ...` and `birch property ...` (docs/SNAPSHOTS.md (g);
//! the compression property: compression_property.rs):
//! btrfs-progs' commands, output and messages. On a mount every command is
//! an ioctl to the daemon (birch_fuse::subvol has the numbers); `list`
//! also reads an unmounted image through the library.
//!
//! A new subcommand is a variant of [`SubvolumeCommand`], its arm in
//! [`subvolume`], and a function sending its ioctl through [`ioctl`].

use crate::{compression_property, mount, output, show, Failure};
use birch::device::FileDevice;
use birch::format::Timespec;
use birch::fs::{Filesystem, MountOptions};
use birch_fuse::subvol::{
    self, SnapArgs, SubvolEntry, BIRCH_IOC_GET_DEFAULT_SUBVOL, BIRCH_IOC_SNAP_CREATE,
    BIRCH_IOC_SUBVOL_LIST, BIRCH_IOC_SUBVOL_SYNC, BIRCH_SUBVOL_LIST_MAX,
    BTRFS_INO_LOOKUP_ARGS_SIZE, BTRFS_IOC_DEFAULT_SUBVOL, BTRFS_IOC_INO_LOOKUP,
    BTRFS_IOC_SNAP_DESTROY, BTRFS_IOC_SUBVOL_CREATE, BTRFS_IOC_SUBVOL_GETFLAGS,
    BTRFS_IOC_SUBVOL_SETFLAGS, BTRFS_SUBVOL_RDONLY, BTRFS_VOL_ARGS_SIZE,
};
use birch_fuse::BIRCH_IOC_SYNC;
use clap::{Args, Subcommand};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum SubvolumeCommand {
    /// Create a subvolume at PATH (its parent directory must exist, unless -p)
    Create {
        /// Make missing parent directories
        #[arg(short = 'p')]
        parents: bool,
        #[arg(value_name = "PATH")]
        path: PathBuf,
    },
    /// Snapshot subvolume SOURCE as DEST/NAME, or into DEST as SOURCE's name
    ///
    /// The snapshot commits before the command returns. It is a directory
    /// of the same mount: `find -xdev`, `du -x`, `tar --one-file-system`
    /// and `rsync -x` descend into it (on btrfs they stop there); exclude
    /// snapshots by path.
    Snapshot {
        /// Make the snapshot read-only
        #[arg(short = 'r')]
        readonly: bool,
        #[arg(value_name = "SOURCE")]
        source: PathBuf,
        #[arg(value_name = "DEST|DEST/NAME")]
        dest: PathBuf,
    },
    /// Delete the subvolumes at PATH...; the cleaner frees their space in the background
    Delete {
        /// Commit once, after the last deletion
        #[arg(short = 'c', long = "commit-after")]
        commit_after: bool,
        /// Commit after each deletion
        #[arg(short = 'C', long = "commit-each", conflicts_with = "commit_after")]
        commit_each: bool,
        #[arg(value_name = "PATH", required = true)]
        paths: Vec<PathBuf>,
    },
    /// Wait until the cleaner has freed every deleted subvolume (it runs now)
    Sync {
        #[arg(value_name = "MOUNTPOINT")]
        path: PathBuf,
    },
    /// List the subvolumes of a mounted filesystem or an unmounted image
    List(ListArgs),
    /// Print what is known of the subvolume PATH is in, or of the one
    /// -r or -u selects on the filesystem PATH names (a mount, or an
    /// unmounted image)
    Show {
        /// The subvolume with this id (5: the top level)
        #[arg(
            short = 'r',
            long = "rootid",
            value_name = "ID",
            conflicts_with = "uuid"
        )]
        rootid: Option<u64>,
        /// The subvolume with this uuid (as `list -u` prints it)
        #[arg(short = 'u', long = "uuid", value_name = "UUID")]
        uuid: Option<String>,
        #[arg(value_name = "PATH")]
        path: PathBuf,
    },
    /// Print the default subvolume (the one a mount without subvol= shows)
    GetDefault {
        #[arg(value_name = "MOUNTPOINT")]
        path: PathBuf,
    },
    /// Make subvolume ID (0: the top level), or the subvolume at PATH, the default
    SetDefault {
        /// ID, then a path on the mount; or only the subvolume's path
        #[arg(value_name = "ID|PATH", num_args = 1..=2, required = true)]
        args: Vec<String>,
    },
}

#[derive(Args)]
pub struct ListArgs {
    /// Print the parent subvolume's id
    #[arg(short = 'p')]
    parent: bool,
    /// Print the generation at creation
    #[arg(short = 'c')]
    creation_generation: bool,
    /// Print the uuid
    #[arg(short = 'u')]
    uuid: bool,
    /// Print the parent's uuid (a snapshot's source)
    #[arg(short = 'q')]
    parent_uuid: bool,
    /// Print the received uuid
    #[arg(short = 'R')]
    received_uuid: bool,
    /// Only snapshots (with a parent uuid), with their creation time
    #[arg(short = 's')]
    snapshots: bool,
    /// Only read-only subvolumes
    #[arg(short = 'r')]
    readonly: bool,
    /// A path on a mounted birch filesystem, or an unmounted image
    #[arg(value_name = "MOUNTPOINT|IMAGE")]
    target: PathBuf,
}

#[derive(Subcommand)]
pub enum PropertyCommand {
    /// Print a property of PATH: `ro` of a subvolume, `compression` of a
    /// file or directory (all of them without NAME)
    Get {
        #[arg(value_name = "PATH")]
        path: PathBuf,
        #[arg(value_name = "NAME")]
        name: Option<String>,
    },
    /// Set a property of PATH: `ro true|false` of a subvolume,
    /// `compression zstd|lz4|none|no|""` of a file or directory
    Set {
        /// Make a received subvolume writable, clearing its received uuid
        /// (incremental receives can no longer use it as a parent)
        #[arg(short = 'f', long)]
        force: bool,
        #[arg(value_name = "PATH")]
        path: PathBuf,
        #[arg(value_name = "NAME")]
        name: String,
        #[arg(value_name = "VALUE")]
        value: String,
    },
}

pub fn subvolume(command: &SubvolumeCommand) -> Result<u8, Failure> {
    match command {
        SubvolumeCommand::Create { parents, path } => create(path, *parents),
        SubvolumeCommand::Snapshot {
            readonly,
            source,
            dest,
        } => snapshot(source, dest, *readonly),
        SubvolumeCommand::Delete {
            commit_after,
            commit_each,
            paths,
        } => delete(paths, *commit_after, *commit_each),
        SubvolumeCommand::Sync { path } => {
            let dir = open_dir(path)?;
            // As btrfs-progs: every deleted subvolume, also one whose
            // files are still open (the cleaner drops it after their last
            // close), asking once a second.
            loop {
                let mut held = 0u64;
                ioctl(&dir, path, BIRCH_IOC_SUBVOL_SYNC, &mut held)
                    .map_err(|e| failure(path, e, ""))?;
                if held == 0 {
                    return Ok(0);
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
        SubvolumeCommand::List(args) => list(args),
        SubvolumeCommand::Show { rootid, uuid, path } => {
            let selector = match (rootid, uuid) {
                (Some(id), _) => Some(Selector::Id(*id)),
                (None, Some(text)) => Some(Selector::Uuid(parse_uuid(text)?)),
                (None, None) => None,
            };
            show_subvolume(path, selector)
        }
        SubvolumeCommand::GetDefault { path } => get_default(path),
        SubvolumeCommand::SetDefault { args } => set_default(args),
    }
}

pub fn property(command: &PropertyCommand) -> Result<u8, Failure> {
    match command {
        PropertyCommand::Get { path, name } => {
            match name.as_deref() {
                Some("compression") => compression_property::get(path)?,
                Some(name) => {
                    known_property(name)?;
                    let readonly = readonly_flag(path)?;
                    writeln!(io::stdout(), "ro={readonly}").map_err(output)?;
                }
                // Every property PATH has, as btrfs-progs: `ro` only for
                // a subvolume's root directory.
                None => {
                    if let Ok(readonly) = readonly_flag(path) {
                        writeln!(io::stdout(), "ro={readonly}").map_err(output)?;
                    }
                    compression_property::get(path)?;
                }
            }
            Ok(0)
        }
        PropertyCommand::Set {
            force,
            path,
            name,
            value,
        } => {
            known_property(name)?;
            if name == "compression" {
                compression_property::set(path, value)?;
                return Ok(0);
            }
            let readonly = match value.as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(Failure::new(format!(
                        "invalid value for property ro: {value} (expected true or false)"
                    )))
                }
            };
            let dir = open_dir(path)?;
            // As btrfs-progs: a received subvolume made writable no longer
            // holds what was received, so its received uuid must go, and
            // only when asked with -f.
            let clear_received = !readonly && readonly_flag(path)? && is_received(&dir, path)?;
            if clear_received && !force {
                return Err(Failure::new(format!(
                    "{}: cannot flip ro->rw with received_uuid set: incremental receives \
                     match it; use -f to make it writable and clear it (or snapshot it instead)",
                    path.display()
                )));
            }
            let mut flags = subvol::btrfs_flags(readonly);
            ioctl(&dir, path, BTRFS_IOC_SUBVOL_SETFLAGS, &mut flags)
                .map_err(|e| failure(path, e, "setting ro needs root or the subvolume's owner"))?;
            if clear_received {
                // A zero uuid and stransid: what btrfs-progs sends to forget it.
                let mut args = vec![0u8; subvol::BTRFS_RECEIVED_SUBVOL_ARGS_SIZE];
                ioctl(
                    &dir,
                    path,
                    subvol::BTRFS_IOC_SET_RECEIVED_SUBVOL,
                    args.as_mut_slice(),
                )
                .map_err(|e| failure(path, e, "clearing received_uuid needs root"))?;
            }
            Ok(0)
        }
    }
}

/// Whether the subvolume whose root is `dir` has a received uuid.
fn is_received(dir: &File, path: &Path) -> Result<bool, Failure> {
    let id = subvolume_id(dir, path)?;
    let listed = list_mounted(path)?;
    let entry = listed
        .iter()
        .find(|e| e.id == id)
        .ok_or_else(|| Failure::new(format!("{}: subvolume {id} is not listed", path.display())))?;
    Ok(entry.received_uuid != [0; 16])
}

fn known_property(name: &str) -> Result<(), Failure> {
    if name == "ro" || name == "compression" {
        Ok(())
    } else {
        Err(Failure::new(format!(
            "unknown property: {name} (birch has ro and compression)"
        )))
    }
}

/// `BTRFS_IOC_SUBVOL_GETFLAGS` on PATH: EINVAL means PATH is not a
/// subvolume's root directory.
fn readonly_flag(path: &Path) -> Result<bool, Failure> {
    let dir = open_dir(path)?;
    let mut flags = 0u64;
    ioctl(&dir, path, BTRFS_IOC_SUBVOL_GETFLAGS, &mut flags).map_err(|e| failure(path, e, ""))?;
    Ok(flags & BTRFS_SUBVOL_RDONLY != 0)
}

fn create(path: &Path, parents: bool) -> Result<u8, Failure> {
    let (parent, name) = split_path(path)?;
    if std::fs::symlink_metadata(path).is_ok() {
        return Err(Failure::new(format!(
            "target path already exists: {}",
            path.display()
        )));
    }
    if parents {
        std::fs::create_dir_all(&parent).map_err(|e| {
            Failure::new(format!(
                "cannot create parent directories of {}: {e}",
                path.display()
            ))
        })?;
    }
    let dir = open_dir(&parent)?;
    let mut args = vec![0u8; BTRFS_VOL_ARGS_SIZE];
    if name.len() >= BTRFS_VOL_ARGS_SIZE - 8 {
        return Err(Failure::new(format!("name too long: {}", path.display())));
    }
    args[8..8 + name.len()].copy_from_slice(name);
    ioctl(&dir, &parent, BTRFS_IOC_SUBVOL_CREATE, args.as_mut_slice()).map_err(|e| {
        failure(
            path,
            e,
            "creating a subvolume needs write permission on its parent directory",
        )
    })?;
    writeln!(
        io::stdout(),
        "Create subvolume '{}/{}'",
        parent.display(),
        String::from_utf8_lossy(name)
    )
    .map_err(output)?;
    Ok(0)
}

/// `snapshot [-r] SOURCE DEST|DEST/NAME`, btrfs-progs' rules: an existing
/// directory DEST receives the snapshot under SOURCE's name; otherwise
/// DEST's parent must exist and DEST's last component names it. The
/// source travels as its subvolume id (BIRCH_IOC_SNAP_CREATE).
fn snapshot(source: &Path, dest: &Path, readonly: bool) -> Result<u8, Failure> {
    let src_dir = open_dir(source)?;
    if !is_subvolume_root(&src_dir, source)? {
        return Err(Failure::new(format!(
            "not a subvolume: {}",
            source.display()
        )));
    }
    let id = subvolume_id(&src_dir, source)?;
    let (parent, name) = if dest.is_dir() {
        let canonical = source
            .canonicalize()
            .map_err(|e| Failure::new(format!("cannot access {}: {e}", source.display())))?;
        let name = canonical
            .file_name()
            .map(|n| n.as_bytes().to_vec())
            .ok_or_else(|| {
                Failure::new(format!(
                    "{}: has no name to give the snapshot: name it, as DEST/NAME",
                    source.display()
                ))
            })?;
        (dest.to_path_buf(), name)
    } else if std::fs::symlink_metadata(dest).is_ok() {
        return Err(Failure::new(format!(
            "'{}' exists and it is not a directory",
            dest.display()
        )));
    } else {
        let (parent, name) = split_path(dest)?;
        (parent, name.to_vec())
    };
    let target = format!("{}/{}", parent.display(), String::from_utf8_lossy(&name));
    if std::fs::symlink_metadata(parent.join(std::ffi::OsStr::from_bytes(&name))).is_ok() {
        return Err(Failure::new(format!(
            "target path already exists: {target}"
        )));
    }
    let dest_dir = open_dir(&parent)?;
    let device = |f: &File, p: &Path| {
        f.metadata()
            .map(|m| m.dev())
            .map_err(|e| Failure::new(format!("cannot access {}: {e}", p.display())))
    };
    // The id means a subvolume of the mount the ioctl goes to.
    if device(&src_dir, source)? != device(&dest_dir, &parent)? {
        return Err(Failure::new(format!(
            "cannot snapshot '{}' into '{}': not on the same mount",
            source.display(),
            parent.display()
        )));
    }
    let mut args = SnapArgs::encode(id, readonly, &name)
        .ok_or_else(|| Failure::new(format!("name too long: {target}")))?;
    writeln!(
        io::stdout(),
        "Create a {}snapshot of '{}' in '{target}'",
        if readonly { "readonly " } else { "" },
        source.display()
    )
    .map_err(output)?;
    ioctl(
        &dest_dir,
        &parent,
        BIRCH_IOC_SNAP_CREATE,
        args.as_mut_slice(),
    )
    .map_err(|e| {
        failure(
            Path::new(&target),
            e,
            "a snapshot needs write permission on the destination directory, \
             and to own the source subvolume (or root)",
        )
    })?;
    Ok(0)
}

/// `delete [-c|-C] PATH...`: each PATH must be a subvolume's root
/// directory (not the default subvolume, holding no other subvolume);
/// the name goes at once, durably at the next commit, which -c (after the
/// last) or -C (after each) makes with BIRCH_IOC_SYNC.
fn delete(paths: &[PathBuf], commit_after: bool, commit_each: bool) -> Result<u8, Failure> {
    let mut status = 0;
    let mut to_commit: Vec<(u64, File, PathBuf)> = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let commit_now = commit_each || (commit_after && i + 1 == paths.len());
        match delete_one(path, commit_now) {
            Ok(parent) => {
                let dev = parent.0.metadata().map(|m| m.dev()).unwrap_or_default();
                if commit_after && !to_commit.iter().any(|(d, ..)| *d == dev) {
                    to_commit.push((dev, parent.0, parent.1));
                }
            }
            Err(e) => {
                writeln!(io::stderr(), "birch subvolume: {}", e.message).map_err(output)?;
                status = 1;
            }
        }
    }
    for (_, dir, path) in to_commit {
        commit(&dir, &path)?;
    }
    Ok(status)
}

/// Deletes one subvolume; returns its parent directory (opened) for -c.
fn delete_one(path: &Path, commit_each: bool) -> Result<(File, PathBuf), Failure> {
    let (parent, name) = split_path(path)?;
    let shown = format!("{}/{}", parent.display(), String::from_utf8_lossy(name));
    let (id, default, dev) = {
        let dir = open_dir(path)?;
        if !is_subvolume_root(&dir, path)? {
            return Err(Failure::new(format!("not a subvolume: {}", path.display())));
        }
        let mut default = 0u64;
        ioctl(&dir, path, BIRCH_IOC_GET_DEFAULT_SUBVOL, &mut default)
            .map_err(|e| failure(path, e, ""))?;
        let dev = dir.metadata().map(|m| m.dev()).ok();
        (subvolume_id(&dir, path)?, default, dev)
        // The subvolume's descriptor closes here: nothing of it stays
        // open through the deletion.
    };
    if id == default {
        return Err(Failure::new(format!(
            "cannot delete '{shown}': it is the default subvolume \
             (make another one the default first: set-default)"
        )));
    }
    let parent_dir = open_dir(&parent)?;
    if parent_dir.metadata().map(|m| m.dev()).ok() != dev {
        return Err(Failure::new(format!(
            "cannot delete '{shown}': it is the root of its mount"
        )));
    }
    writeln!(
        io::stdout(),
        "Delete subvolume {id} ({}): '{shown}'",
        if commit_each { "commit" } else { "no-commit" }
    )
    .map_err(output)?;
    let mut args = vec![0u8; BTRFS_VOL_ARGS_SIZE];
    if name.len() >= BTRFS_VOL_ARGS_SIZE - 8 {
        return Err(Failure::new(format!("name too long: {shown}")));
    }
    args[8..8 + name.len()].copy_from_slice(name);
    ioctl(
        &parent_dir,
        &parent,
        BTRFS_IOC_SNAP_DESTROY,
        args.as_mut_slice(),
    )
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTEMPTY) => Failure::new(format!(
            "cannot delete '{shown}': it holds other subvolumes (delete them first)"
        )),
        Some(libc::EPERM) if id == default => Failure::new(format!(
            "cannot delete '{shown}': it is the default subvolume"
        )),
        _ => failure(
            Path::new(&shown),
            e,
            "deleting a subvolume needs root or the mount's owner, or a mount with \
             user_subvol_rm_allowed and write and search permission on the subvolume \
             and its directory",
        ),
    })?;
    if commit_each {
        commit(&parent_dir, &parent)?;
    }
    Ok((parent_dir, parent))
}

/// BIRCH_IOC_SYNC on `dir`: commits its filesystem.
fn commit(dir: &File, path: &Path) -> Result<(), Failure> {
    // SAFETY: an ioctl without argument data on an fd we own.
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), BIRCH_IOC_SYNC as libc::c_ulong) };
    if rc == 0 {
        Ok(())
    } else {
        Err(failure(path, io::Error::last_os_error(), ""))
    }
}

/// Whether `dir` is a subvolume's root directory: GETFLAGS answers EINVAL
/// anywhere else.
pub(crate) fn is_subvolume_root(dir: &File, path: &Path) -> Result<bool, Failure> {
    let mut flags = 0u64;
    match ioctl(dir, path, BTRFS_IOC_SUBVOL_GETFLAGS, &mut flags) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(failure(path, e, "")),
    }
}

/// PATH's parent directory ("." for a bare name) and last component.
fn split_path(path: &Path) -> Result<(PathBuf, &[u8]), Failure> {
    let name = path
        .file_name()
        .map(|n| n.as_bytes())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Failure::new(format!("invalid subvolume name: {}", path.display())))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

fn list(args: &ListArgs) -> Result<u8, Failure> {
    let target = &args.target;
    let entries = if target.is_dir() {
        list_mounted(target)?
    } else {
        list_image(target)?
    };
    let mut out = io::stdout().lock();
    for e in entries
        .iter()
        .filter(|e| e.id != birch::format::tree_id::FS)
    {
        if args.snapshots && e.parent_uuid == [0; 16] {
            continue;
        }
        if args.readonly && !e.readonly {
            continue;
        }
        // btrfs-progs' column order.
        let mut line = format!("ID {} gen {}", e.id, e.generation);
        if args.creation_generation {
            line += &format!(" cgen {}", e.otransid);
        }
        if args.parent {
            line += &format!(" parent {}", e.parent);
        }
        line += &format!(" top level {}", e.parent);
        if args.snapshots {
            line += &format!(" otime {}", local_time(e.otime, false));
        }
        if args.parent_uuid {
            line += &format!(" parent_uuid {}", uuid(&e.parent_uuid));
        }
        if args.received_uuid {
            line += &format!(" received_uuid {}", uuid(&e.received_uuid));
        }
        if args.uuid {
            line += &format!(" uuid {}", uuid(&e.uuid));
        }
        writeln!(out, "{line} path {}", String::from_utf8_lossy(&e.path)).map_err(output)?;
    }
    Ok(0)
}

/// Pages through `BIRCH_IOC_SUBVOL_LIST` from id 0.
pub(crate) fn list_mounted(path: &Path) -> Result<Vec<SubvolEntry>, Failure> {
    let dir = open_dir(path)?;
    let mut all: Vec<SubvolEntry> = Vec::new();
    let mut cursor = 0u64;
    loop {
        let mut buf = vec![0u8; BIRCH_SUBVOL_LIST_MAX];
        buf[..8].copy_from_slice(&cursor.to_ne_bytes());
        ioctl(&dir, path, BIRCH_IOC_SUBVOL_LIST, buf.as_mut_slice())
            .map_err(|e| failure(path, e, ""))?;
        let page = SubvolEntry::decode_page(&buf)
            .map_err(|e| Failure::new(format!("{}: {e}", path.display())))?;
        let Some(last) = page.last() else {
            return Ok(all);
        };
        cursor = last.id.checked_add(1).ok_or_else(|| {
            Failure::new(format!(
                "{}: subvolume list reply: id past u64",
                path.display()
            ))
        })?;
        if all.last().is_some_and(|prev| prev.id >= page[0].id) {
            return Err(Failure::new(format!(
                "{}: subvolume list reply goes backwards at id {}",
                path.display(),
                page[0].id
            )));
        }
        all.extend(page);
    }
}

/// `birch subvolume list IMAGE`: the image opened read-only under the
/// lock a mount takes (a mounted image is listed through its mount).
fn list_image(image: &Path) -> Result<Vec<SubvolEntry>, Failure> {
    let fs = open_image(image, ImageAccess::ReadOnly)?;
    subvol::list(&fs).map_err(|e| Failure::new(format!("{}: {e}", show(image))))
}

/// How an image command opens its image.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ImageAccess {
    /// list, show, send: nothing written.
    ReadOnly,
    /// receive: changes, committed when the filesystem is closed.
    ReadWrite,
}

/// The unmounted image IMAGE through the library, under the lock a mount
/// takes: a mounted image is refused (its daemon's commits would move
/// the trees under a second reader, and two writers would reuse each
/// other's blocks), naming where it is mounted.
pub(crate) fn open_image(
    image: &Path,
    access: ImageAccess,
) -> Result<Filesystem<FileDevice>, Failure> {
    let dev = match access {
        ImageAccess::ReadOnly => FileDevice::open_read_only(image),
        ImageAccess::ReadWrite => FileDevice::open(image, false),
    }
    .map_err(|e| {
        Failure::unreadable(format!(
            "{}: not a birch mount, and cannot open as an image{}: {e}",
            show(image),
            if access == ImageAccess::ReadWrite {
                " read-write"
            } else {
                ""
            }
        ))
    })?;
    if let Some(running) = crate::mount_again::running_mount(image) {
        let at = running.mount_point;
        return Err(Failure::new(format!(
            "{}: mounted at {}: use the mount instead of the image",
            show(image),
            at.display()
        )));
    }
    mount::lock_image(dev.file(), image)?;
    Filesystem::open(
        dev,
        MountOptions {
            read_only: access == ImageAccess::ReadOnly,
            ..Default::default()
        },
    )
    .map_err(|e| Failure::unreadable(format!("{}: {e}", show(image))))
}

/// How `subvolume show -r|-u` names a subvolume.
#[derive(Clone, Copy)]
enum Selector {
    Id(u64),
    Uuid([u8; 16]),
}

/// A uuid as `list -u` prints it (36 characters, dashes after the 8th,
/// 12th, 16th and 20th hex digit), or a failure naming it.
fn parse_uuid(text: &str) -> Result<[u8; 16], Failure> {
    let bad = || {
        Failure::new(format!(
            "invalid UUID: '{text}' (expected 36 characters as \
             xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, x a hex digit)"
        ))
    };
    let bytes = text.as_bytes();
    if bytes.len() != 36 || [8, 13, 18, 23].iter().any(|&i| bytes[i] != b'-') {
        return Err(bad());
    }
    let hex: Vec<u8> = bytes.iter().copied().filter(|&b| b != b'-').collect();
    if hex.len() != 32 || !hex.iter().all(u8::is_ascii_hexdigit) {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let digits = std::str::from_utf8(pair).map_err(|_| bad())?;
        out[i] = u8::from_str_radix(digits, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// `birch subvolume show`: the subvolume PATH is in (a mount only), or
/// the one `selector` names among those of the mount or image PATH.
fn show_subvolume(path: &Path, selector: Option<Selector>) -> Result<u8, Failure> {
    let (all, id, path_readonly) = match selector {
        None => {
            // GETFLAGS first: it names a path that is no subvolume's root.
            let readonly = readonly_flag(path)?;
            let dir = open_dir(path)?;
            let id = subvolume_id(&dir, path)?;
            (list_mounted(path)?, id, Some(readonly))
        }
        Some(selector) => {
            let all = if path.is_dir() {
                list_mounted(path)?
            } else {
                list_image(path)?
            };
            let found = all.iter().find(|e| match selector {
                Selector::Id(id) => e.id == id,
                Selector::Uuid(u) => e.uuid == u,
            });
            let Some(found) = found else {
                return Err(Failure::new(match selector {
                    Selector::Id(id) => {
                        format!("can't find rootid '{id}' on '{}'", path.display())
                    }
                    Selector::Uuid(u) => {
                        format!("can't find uuid '{}' on '{}'", uuid(&u), path.display())
                    }
                }));
            };
            let id = found.id;
            (all, id, None)
        }
    };
    let e = all
        .iter()
        .find(|e| e.id == id)
        .ok_or_else(|| Failure::new(format!("{}: subvolume {id} is not listed", path.display())))?;
    // A path's own subvolume: its flag as the ioctl answered it; a
    // selected one (perhaps on an image): its list entry's.
    let readonly = path_readonly.unwrap_or(e.readonly);
    let name = if e.id == birch::format::tree_id::FS {
        "<FS_TREE>".to_string()
    } else {
        String::from_utf8_lossy(e.path.rsplit(|&b| b == b'/').next().unwrap_or(&e.path))
            .into_owned()
    };
    let mut out = io::stdout().lock();
    let shown = if e.path.is_empty() {
        "/".to_string()
    } else {
        String::from_utf8_lossy(&e.path).into_owned()
    };
    let snapshots: Vec<&SubvolEntry> = all
        .iter()
        .filter(|s| e.uuid != [0; 16] && s.parent_uuid == e.uuid)
        .collect();
    let mut text = format!(
        "{shown}\n\
         \tName: \t\t\t{name}\n\
         \tUUID: \t\t\t{}\n\
         \tParent UUID: \t\t{}\n\
         \tReceived UUID: \t\t{}\n\
         \tCreation time: \t\t{}\n\
         \tSubvolume ID: \t\t{}\n\
         \tGeneration: \t\t{}\n\
         \tGen at creation: \t{}\n\
         \tParent ID: \t\t{}\n\
         \tTop level ID: \t\t{}\n\
         \tFlags: \t\t\t{}\n\
         \tSnapshot(s):\n",
        uuid(&e.uuid),
        uuid(&e.parent_uuid),
        uuid(&e.received_uuid),
        local_time(e.otime, true),
        e.id,
        e.generation,
        e.otransid,
        e.parent,
        e.parent,
        if readonly { "readonly" } else { "-" },
    );
    for s in snapshots {
        text += &format!("\t\t\t\t{}\n", String::from_utf8_lossy(&s.path));
    }
    out.write_all(text.as_bytes()).map_err(output)?;
    Ok(0)
}

/// The id of the subvolume `dir` is in (`BTRFS_IOC_INO_LOOKUP` with tree 0
/// and the root directory's number, as btrfs-progs asks).
pub(crate) fn subvolume_id(dir: &File, path: &Path) -> Result<u64, Failure> {
    let mut args = vec![0u8; BTRFS_INO_LOOKUP_ARGS_SIZE];
    args[8..16].copy_from_slice(&birch::format::ROOT_DIR_INO.to_ne_bytes());
    ioctl(dir, path, BTRFS_IOC_INO_LOOKUP, args.as_mut_slice())
        .map_err(|e| failure(path, e, ""))?;
    Ok(u64::from_ne_bytes(
        args[..8].try_into().expect("eight bytes"),
    ))
}

/// The id of the mount's default subvolume (what a mount without
/// `subvol=` shows).
pub(crate) fn default_id(dir: &File, path: &Path) -> Result<u64, Failure> {
    let mut id = 0u64;
    ioctl(dir, path, BIRCH_IOC_GET_DEFAULT_SUBVOL, &mut id).map_err(|e| failure(path, e, ""))?;
    Ok(id)
}

fn get_default(path: &Path) -> Result<u8, Failure> {
    let id = default_id(&open_dir(path)?, path)?;
    let mut out = io::stdout().lock();
    if id == birch::format::tree_id::FS {
        writeln!(out, "ID 5 (FS_TREE)").map_err(output)?;
        return Ok(0);
    }
    let all = list_mounted(path)?;
    let e = all.iter().find(|e| e.id == id).ok_or_else(|| {
        Failure::new(format!(
            "{}: the default subvolume {id} is not listed",
            path.display()
        ))
    })?;
    writeln!(
        out,
        "ID {} gen {} top level {} path {}",
        e.id,
        e.generation,
        e.parent,
        String::from_utf8_lossy(&e.path)
    )
    .map_err(output)?;
    Ok(0)
}

/// `set-default ID PATH`, or `set-default PATH` (the subvolume at PATH).
fn set_default(args: &[String]) -> Result<u8, Failure> {
    let (mut id, path) = match args {
        [id, path] => {
            let id = id.parse::<u64>().map_err(|_| {
                Failure::new(format!("invalid subvolume id: {id} (expected a number)"))
            })?;
            (id, PathBuf::from(path))
        }
        [path] => {
            let path = PathBuf::from(path);
            readonly_flag(&path)?;
            let id = subvolume_id(&open_dir(&path)?, &path)?;
            (id, path)
        }
        _ => return Err(Failure::new("expected ID PATH or PATH")),
    };
    let dir = open_dir(&path)?;
    ioctl(&dir, &path, BTRFS_IOC_DEFAULT_SUBVOL, &mut id).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => Failure::new(format!("subvolume {id} not found")),
        _ => failure(
            &path,
            e,
            "setting the default subvolume needs root or the mount's owner",
        ),
    })?;
    Ok(0)
}

pub(crate) fn open_dir(path: &Path) -> Result<File, Failure> {
    File::open(path).map_err(|e| Failure::new(format!("cannot access {}: {e}", path.display())))
}

/// Sends `cmd` on `dir` with `arg`, which must be as long as the size the
/// command encodes (the kernel copies that many bytes each way).
pub(crate) fn ioctl<T: ?Sized>(dir: &File, path: &Path, cmd: u32, arg: &mut T) -> io::Result<()> {
    let size = ((cmd >> 16) & 0x3fff) as usize;
    assert_eq!(
        std::mem::size_of_val(arg),
        size,
        "ioctl {cmd:#x} on {}: argument size",
        path.display()
    );
    // SAFETY: `arg` is `size` bytes long, the size the command encodes,
    // which is all the kernel reads or writes.
    let rc = unsafe {
        libc::ioctl(
            dir.as_raw_fd(),
            cmd as libc::c_ulong,
            arg as *mut T as *mut u8,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The message for a subvolume ioctl that failed on `path`. `permission`
/// says who may, for EPERM and EACCES.
pub(crate) fn failure(path: &Path, e: io::Error, permission: &str) -> Failure {
    let p = path.display();
    Failure::new(match e.raw_os_error() {
        Some(libc::ENOTTY) => format!("{p}: not a birch mount (or a birch without subvolumes)"),
        Some(libc::EEXIST) => format!("target path already exists: {p}"),
        Some(libc::EINVAL) => format!("{p}: not a subvolume (or an invalid name)"),
        Some(libc::EROFS) => format!("{p}: read-only subvolume or filesystem"),
        Some(code @ (libc::EPERM | libc::EACCES)) if !permission.is_empty() => {
            let name = if code == libc::EPERM {
                "EPERM"
            } else {
                "EACCES"
            };
            format!("{p}: permission denied ({name}): {permission}")
        }
        _ => format!("{p}: {e}"),
    })
}

/// A uuid as btrfs-progs prints it, "-" when zero.
pub(crate) fn uuid(u: &[u8; 16]) -> String {
    if *u == [0; 16] {
        return "-".to_string();
    }
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// `YYYY-MM-DD HH:MM:SS` in local time (`with_zone`: and ` +ZZZZ`), as
/// btrfs-progs prints times; "-" for a zero time.
fn local_time(t: Timespec, with_zone: bool) -> String {
    if t.sec == 0 && t.nsec == 0 {
        return "-".to_string();
    }
    let secs = t.sec as libc::time_t;
    // SAFETY: localtime_r and strftime write only into the local `tm` and
    // `buf`, whose size is passed.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&secs, &mut tm).is_null() {
            return t.sec.to_string();
        }
        let mut buf = [0u8; 64];
        let format: &[u8] = if with_zone {
            b"%Y-%m-%d %H:%M:%S %z\0"
        } else {
            b"%Y-%m-%d %H:%M:%S\0"
        };
        let n = libc::strftime(
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
            format.as_ptr() as *const libc::c_char,
            &tm,
        );
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}
