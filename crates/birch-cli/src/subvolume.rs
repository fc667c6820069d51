//! `birch subvolume ...` and `birch property ...` (docs/SNAPSHOTS.md (g)):
//! btrfs-progs' commands, output and messages. On a mount every command is
//! an ioctl to the daemon (birch_fuse::subvol has the numbers); `list`
//! also reads an unmounted image through the library.
//!
//! A new subcommand is a variant of [`SubvolumeCommand`], its arm in
//! [`subvolume`], and a function sending its ioctl through [`ioctl`].

use crate::{mount, output, show, Failure};
use birch::device::FileDevice;
use birch::format::Timespec;
use birch::fs::{Filesystem, MountOptions};
use birch_fuse::subvol::{
    self, SubvolEntry, BIRCH_IOC_GET_DEFAULT_SUBVOL, BIRCH_IOC_SUBVOL_LIST, BIRCH_SUBVOL_LIST_MAX,
    BTRFS_INO_LOOKUP_ARGS_SIZE, BTRFS_IOC_DEFAULT_SUBVOL, BTRFS_IOC_INO_LOOKUP,
    BTRFS_IOC_SUBVOL_CREATE, BTRFS_IOC_SUBVOL_GETFLAGS, BTRFS_IOC_SUBVOL_SETFLAGS,
    BTRFS_SUBVOL_RDONLY, BTRFS_VOL_ARGS_SIZE,
};
use clap::{Args, Subcommand};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
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
    /// List the subvolumes of a mounted filesystem or an unmounted image
    List(ListArgs),
    /// Print what is known of the subvolume whose root directory is PATH
    Show {
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
    /// Print a property of the subvolume at PATH (all of them without NAME)
    Get {
        #[arg(value_name = "PATH")]
        path: PathBuf,
        #[arg(value_name = "NAME")]
        name: Option<String>,
    },
    /// Set a property of the subvolume at PATH: `ro true|false`
    Set {
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
        SubvolumeCommand::List(args) => list(args),
        SubvolumeCommand::Show { path } => show_subvolume(path),
        SubvolumeCommand::GetDefault { path } => get_default(path),
        SubvolumeCommand::SetDefault { args } => set_default(args),
    }
}

pub fn property(command: &PropertyCommand) -> Result<u8, Failure> {
    match command {
        PropertyCommand::Get { path, name } => {
            if let Some(name) = name {
                known_property(name)?;
            }
            let readonly = readonly_flag(path)?;
            writeln!(io::stdout(), "ro={readonly}").map_err(output)?;
            Ok(0)
        }
        PropertyCommand::Set { path, name, value } => {
            known_property(name)?;
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
            let mut flags = subvol::btrfs_flags(readonly);
            ioctl(&dir, path, BTRFS_IOC_SUBVOL_SETFLAGS, &mut flags)
                .map_err(|e| failure(path, e, "setting ro needs root or the subvolume's owner"))?;
            Ok(0)
        }
    }
}

fn known_property(name: &str) -> Result<(), Failure> {
    if name == "ro" {
        Ok(())
    } else {
        Err(Failure::new(format!(
            "unknown property: {name} (a birch subvolume has only ro)"
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
fn list_mounted(path: &Path) -> Result<Vec<SubvolEntry>, Failure> {
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
    let dev = FileDevice::open_read_only(image).map_err(|e| {
        Failure::unreadable(format!(
            "{}: not a birch mount, and cannot open as an image: {e}",
            show(image)
        ))
    })?;
    mount::lock_image(dev.file(), image)?;
    let fs = Filesystem::open(
        dev,
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .map_err(|e| Failure::unreadable(format!("{}: {e}", show(image))))?;
    subvol::list(&fs).map_err(|e| Failure::new(format!("{}: {e}", show(image))))
}

fn show_subvolume(path: &Path) -> Result<u8, Failure> {
    let readonly = readonly_flag(path)?;
    let dir = open_dir(path)?;
    let id = subvolume_id(&dir, path)?;
    let all = list_mounted(path)?;
    let e = all
        .iter()
        .find(|e| e.id == id)
        .ok_or_else(|| Failure::new(format!("{}: subvolume {id} is not listed", path.display())))?;
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
fn subvolume_id(dir: &File, path: &Path) -> Result<u64, Failure> {
    let mut args = vec![0u8; BTRFS_INO_LOOKUP_ARGS_SIZE];
    args[8..16].copy_from_slice(&birch::format::ROOT_DIR_INO.to_ne_bytes());
    ioctl(dir, path, BTRFS_IOC_INO_LOOKUP, args.as_mut_slice())
        .map_err(|e| failure(path, e, ""))?;
    Ok(u64::from_ne_bytes(
        args[..8].try_into().expect("eight bytes"),
    ))
}

fn get_default(path: &Path) -> Result<u8, Failure> {
    let dir = open_dir(path)?;
    let mut id = 0u64;
    ioctl(&dir, path, BIRCH_IOC_GET_DEFAULT_SUBVOL, &mut id).map_err(|e| failure(path, e, ""))?;
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

fn open_dir(path: &Path) -> Result<File, Failure> {
    File::open(path).map_err(|e| Failure::new(format!("cannot access {}: {e}", path.display())))
}

/// Sends `cmd` on `dir` with `arg`, which must be as long as the size the
/// command encodes (the kernel copies that many bytes each way).
fn ioctl<T: ?Sized>(dir: &File, path: &Path, cmd: u32, arg: &mut T) -> io::Result<()> {
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
fn failure(path: &Path, e: io::Error, permission: &str) -> Failure {
    let p = path.display();
    Failure::new(match e.raw_os_error() {
        Some(libc::ENOTTY) => format!("{p}: not a birch mount (or a birch without subvolumes)"),
        Some(libc::EEXIST) => format!("target path already exists: {p}"),
        Some(libc::EINVAL) => format!("{p}: not a subvolume (or an invalid name)"),
        Some(libc::EROFS) => format!("{p}: read-only subvolume or filesystem"),
        Some(libc::EPERM | libc::EACCES) if !permission.is_empty() => {
            format!("{p}: permission denied: {permission}")
        }
        _ => format!("{p}: {e}"),
    })
}

/// A uuid as btrfs-progs prints it, "-" when zero.
fn uuid(u: &[u8; 16]) -> String {
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
