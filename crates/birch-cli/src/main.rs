//! `birch`: make, mount, check and print birch filesystems.
//!
//! ```text
//! birch mkfs IMAGE [--size SIZE] [--force]
//! birch check [--verify-data] IMAGE exit 0 clean, 1 faults, 2 cannot read
//! birch dump IMAGE [super | tree [ID|NAME] | block BYTENR]
//! birch mount IMAGE MOUNTPOINT [-f] [-o OPTIONS]
//! birch sync MOUNTPOINT
//! birch stats [--json] MOUNTPOINT
//! birch subvolume create [-p] PATH | list [-pcuqRsr] MOUNTPOINT|IMAGE | show PATH
//! birch subvolume get-default MOUNTPOINT | set-default ID MOUNTPOINT
//! birch property get PATH [ro|compression] | set PATH ro true|false | set PATH compression zstd|lz4|none|""
//! ```
//! Every failure is one line on stderr naming the image and what is wrong;
//! bad arguments get clap's usage error (exit 2).

mod compression_property;
mod holders;
mod loopdev;
mod mount;
mod mount_again;
mod receive;
mod replay;
mod scrub;
mod send;
mod signature;
mod stats;
mod subvolume;

use birch::check::{
    check_device_with, newest_valid_copy, read_superblock_copies, tree_roots, CheckOptions,
    SuperblockCopy, TreeRootRef,
};
use birch::device::{BlockDevice, FileDevice};
use birch::format::{parse_tree_name, tree_name, Superblock, MIN_DEVICE_BYTES, SECTOR_SIZE};
use birch::print;
use clap::{Args, CommandFactory, Parser, Subcommand};
use std::io::{self, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Size of a new image file when --size is not given.
const DEFAULT_IMAGE_BYTES: u64 = 1 << 30;

#[derive(Parser)]
#[command(
    name = "birch",
    version,
    about = "birch: a copy-on-write B-tree filesystem in user space"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create an empty filesystem on an image file (created if missing) or block device
    Mkfs(MkfsArgs),
    /// Verify every invariant of every tree, read-only (exit 0 clean, 1 faults, 2 cannot read)
    Check(CheckArgs),
    /// Print the superblock, trees or one block (default: superblock and every tree)
    Dump(DumpArgs),
    /// Serve the filesystem through FUSE (detaches once live unless -f)
    Mount(mount::MountArgs),
    /// Commit a mounted birch filesystem now (sync(1) does not reach FUSE)
    Sync(mount::SyncArgs),
    /// List a write log, or rebuild the device as it was at a flush or mark
    Replay(replay::ReplayArgs),
    /// Print a mounted filesystem's counters by section, with rates since mount (--json for scripts)
    Stats(stats::StatsArgs),
    /// Read every copy of every tree node of an unmounted image or a mounted filesystem, rewrite bad
    /// copies from good ones, verify every data block (exit 0 clean or repaired, 1 something unrepaired)
    Scrub(ScrubArgs),
    /// Create, list and show subvolumes, get and set the default one (as btrfs-progs)
    #[command(subcommand)]
    Subvolume(subvolume::SubvolumeCommand),
    /// Apply a btrfs send stream (version 1) to a mounted birch or an unmounted image (--image):
    /// create the subvolume it carries under DIR, read-only, with the stream's uuid as its received
    /// uuid (as btrfs receive)
    Receive(receive::ReceiveArgs),
    /// Write the send stream (btrfs's format, version 1) of read-only snapshots: full, or
    /// incremental against a parent snapshot with -p (as btrfs send)
    Send(send::SendArgs),
    /// Get or set a property: `ro` (read-only) of a subvolume, `compression` of a file or directory
    #[command(subcommand)]
    Property(subvolume::PropertyCommand),
}

/// The IMAGE argument, the same in every subcommand.
#[derive(Args)]
struct ImageArg {
    /// Image file or block device
    #[arg(value_name = "IMAGE")]
    image: PathBuf,
}

#[derive(Args)]
struct MkfsArgs {
    #[command(flatten)]
    image: ImageArg,
    /// Size of a new image file: bytes, or with a K/M/G/T suffix (binary units: 1G = 1 GiB) [default: 1G].
    /// An existing file or block device keeps its own size.
    #[arg(long, short = 's', value_name = "SIZE", value_parser = parse_size)]
    size: Option<u64>,
    /// Overwrite an existing filesystem (birch, ext2/3/4, xfs, btrfs, vfat, ntfs, exfat), swap space or
    /// partition table. Never an image or device in use (mounted, or held by another process)
    #[arg(long, short = 'f')]
    force: bool,
    /// Record mkfs's writes and flushes in FILE (dm-log-writes format); a
    /// later `birch mount --write-log` can continue the record
    #[arg(long, value_name = "FILE")]
    write_log: Option<PathBuf>,
    /// Copies of each tree node: `dup` keeps a second copy half the device
    /// away, so a damaged node is read (and repaired) from the other one
    #[arg(long, value_enum, default_value_t = MetadataArg::Dup)]
    metadata: MetadataArg,
    /// A crc32c of every 4 KiB data block, verified by every read and by
    /// `birch scrub` (docs/DATA-CHECKSUMS.md)
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    data_checksums: OnOff,
}

/// `birch mkfs --data-checksums`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

/// `birch mkfs --metadata`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum MetadataArg {
    Single,
    Dup,
}

#[derive(Args)]
struct ScrubArgs {
    /// An unmounted image file or block device, or where a birch filesystem is mounted
    #[arg(value_name = "IMAGE|MOUNTPOINT")]
    target: PathBuf,
}

#[derive(Args)]
struct CheckArgs {
    #[command(flatten)]
    image: ImageArg,
    /// Also read every data extent once: its blocks against their
    /// checksums, a compressed extent decompressed to its recorded length
    #[arg(long, visible_alias = "check-data-csum")]
    verify_data: bool,
}

#[derive(Args)]
struct DumpArgs {
    #[command(flatten)]
    image: ImageArg,
    #[command(subcommand)]
    what: Option<DumpWhat>,
}

#[derive(Subcommand)]
enum DumpWhat {
    /// Both superblock copies
    Super,
    /// One tree by id or name (root, extent, fs, log-root, log), or every tree
    Tree {
        #[arg(value_name = "ID|NAME", value_parser = parse_tree)]
        tree: Option<u64>,
    },
    /// One block, decoded (its raw header when it does not decode)
    Block {
        #[arg(value_name = "BYTENR", value_parser = parse_bytenr)]
        bytenr: u64,
    },
}

/// A failure: the message (one line) and the exit code.
struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    fn new(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: 1,
        }
    }
    /// The image cannot be read at all (exit 2).
    fn unreadable(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: 2,
        }
    }
}

/// Output errors: a closed pipe (`birch dump | head`) ends quietly.
fn output(e: io::Error) -> Failure {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Failure {
            message: String::new(),
            code: 0,
        }
    } else {
        Failure::new(format!("cannot write output: {e}"))
    }
}

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "birch: internal error (a bug in birch): {}{at}",
            msg.replace('\n', " ")
        );
    }));
    let cli = Cli::parse_from(mount_helper_args(std::env::args_os().collect()));
    let (name, result) = match cli.command {
        Command::Mkfs(args) => ("mkfs", mkfs(&args)),
        Command::Check(args) => ("check", check(&args)),
        Command::Dump(args) => ("dump", dump(&args)),
        Command::Mount(args) => ("mount", mount::mount(&args)),
        Command::Sync(args) => ("sync", mount::sync(&args)),
        Command::Replay(args) => ("replay", replay::replay(&args)),
        Command::Stats(args) => ("stats", stats::stats(&args)),
        Command::Scrub(args) => ("scrub", scrub(&args)),
        Command::Subvolume(command) => ("subvolume", subvolume::subvolume(&command)),
        Command::Property(command) => ("property", subvolume::property(&command)),
        Command::Receive(args) => ("receive", receive::receive(&args)),
        Command::Send(args) => ("send", send::send(&args)),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            if !f.message.is_empty() {
                eprintln!("birch {name}: {}", f.message.replace('\n', " "));
            }
            ExitCode::from(f.code)
        }
    }
}

/// Rewrites the calling conventions of mount helpers into `birch mount`:
/// mount(8) runs `mount.fuse.birch IMAGE DIR [-o OPTS] [-n -s -v]` for
/// `mount -t fuse.birch` and fstab lines, and fuse3's generic `mount.fuse3`
/// runs `birch IMAGE DIR [-o OPTS]` for the `fuse.birch` type.
fn mount_helper_args(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let program = args
        .first()
        .map(Path::new)
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let as_helper = program == "mount.fuse.birch";
    let first = args
        .get(1)
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    let is_subcommand = Cli::command()
        .get_subcommands()
        .any(|c| c.get_name() == first)
        || first.starts_with('-')
        || first == "help";
    if !as_helper && (is_subcommand || !Path::new(&first).exists()) {
        return args;
    }
    // mount(8)'s -n (no mtab), -s (sloppy) and -v (verbose) mean nothing here.
    args.retain(|a| !matches!(a.to_str(), Some("-n" | "-s" | "-v")));
    args[0] = "birch".into();
    args.insert(1, "mount".into());
    args
}

/// A device size: `1G`, `512M`, `64MiB`, `16777216`: binary units, at
/// least the minimum device, whole sectors.
fn parse_size(s: &str) -> Result<u64, String> {
    let bytes = parse_bytes(s)?;
    if bytes < MIN_DEVICE_BYTES {
        return Err(format!(
            "{bytes} bytes is below the {} MiB minimum",
            MIN_DEVICE_BYTES >> 20
        ));
    }
    if !bytes.is_multiple_of(SECTOR_SIZE) {
        return Err(format!(
            "{bytes} bytes is not a multiple of the {SECTOR_SIZE}-byte sector"
        ));
    }
    Ok(bytes)
}

/// `1G`, `512M`, `64MiB`, `4096`, `16k`: binary units.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    if num.is_empty() {
        return Err(format!(
            "'{s}' is not a size (examples: 1G, 512M, 67108864)"
        ));
    }
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is too large"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("'{s}': unknown unit '{unit}' (use K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))
}

fn parse_tree(s: &str) -> Result<u64, String> {
    parse_tree_name(s).ok_or_else(|| {
        format!("'{s}' is not a tree (use root, extent, fs, log-root, log or a tree id)")
    })
}

fn parse_bytenr(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    v.map_err(|_| format!("'{s}' is not a block number (decimal or 0x hex)"))
}

fn show(path: &Path) -> String {
    path.display().to_string()
}

// ----- mkfs -----

fn mkfs(args: &MkfsArgs) -> Result<u8, Failure> {
    let path = &args.image.image;
    let p = show(path);
    let created = match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Err(Failure::new(format!("{p}: is a directory"))),
        Ok(meta) if meta.file_type().is_block_device() => {
            if args.size.is_some() {
                return Err(Failure::new(format!(
                    "{p}: --size does not apply to a block device (it keeps its own size)"
                )));
            }
            false
        }
        Ok(meta) if meta.len() == 0 => {
            // An empty file (e.g. just touched): give it the size asked for.
            let size = args.size.unwrap_or(DEFAULT_IMAGE_BYTES);
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| Failure::new(format!("{p}: cannot open: {e}")))?;
            f.set_len(size).map_err(|e| {
                Failure::new(format!("{p}: cannot size the image to {size} bytes: {e}"))
            })?;
            false
        }
        Ok(meta) => {
            if let Some(size) = args.size {
                if size != meta.len() {
                    return Err(Failure::new(format!("{p} exists with {} bytes; --size {size} would change it (delete the file or leave out --size)", meta.len())));
                }
            }
            false
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let size = args.size.unwrap_or(DEFAULT_IMAGE_BYTES);
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(|e| Failure::new(format!("{p}: cannot create: {e}")))?;
            if let Err(e) = f.set_len(size) {
                let _ = std::fs::remove_file(path);
                return Err(Failure::new(format!(
                    "{p}: cannot size the image to {size} bytes: {e}"
                )));
            }
            true
        }
        Err(e) => return Err(Failure::new(format!("{p}: {e}"))),
    };
    let cleanup = |f: Failure| {
        if created {
            let _ = std::fs::remove_file(path);
        }
        f
    };
    let dev = FileDevice::open(path, false)
        .map_err(|e| cleanup(Failure::new(format!("{p}: cannot open read-write: {e}"))))?;
    // Held until mkfs is done, so nothing mounts the image meanwhile.
    let _exclusive = claim_unused(path, &dev).map_err(cleanup)?;
    if !args.force {
        refuse_existing_filesystem(path, &dev)?;
    }
    wipe_foreign_signatures(&dev).map_err(|e| {
        cleanup(Failure::new(format!(
            "{p}: cannot clear the old signatures: {e}"
        )))
    })?;
    let options = birch::fs::MkfsOptions {
        // SAFETY: getuid and getgid have no preconditions.
        root_owner: unsafe { (libc::getuid(), libc::getgid()) },
        metadata: match args.metadata {
            MetadataArg::Single => birch::fs::MetadataCopies::Single,
            MetadataArg::Dup => birch::fs::MetadataCopies::Dup,
        },
        data_checksums: match args.data_checksums {
            OnOff::On => birch::fs::DataChecksums::On,
            OnOff::Off => birch::fs::DataChecksums::Off,
        },
        ..Default::default()
    };
    match &args.write_log {
        Some(log) => {
            let file = std::fs::File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(log)
                .map_err(|e| {
                    cleanup(Failure::new(format!(
                        "{}: cannot create the write log: {e}",
                        show(log)
                    )))
                })?;
            let logged = birch::device::WriteLogDevice::new(&dev, file)
                .map_err(|e| cleanup(Failure::new(format!("{}: {e}", show(log)))))?;
            birch::fs::mkfs(&logged, &options)
        }
        None => birch::fs::Filesystem::<FileDevice>::mkfs(&dev, &options),
    }
    .map_err(|e| cleanup(Failure::new(format!("{p}: {e}"))))?;
    let copies = read_superblock_copies(&dev);
    let sb = newest_valid_copy(&copies)
        .and_then(|c| c.superblock.as_ref().ok())
        .ok_or_else(|| Failure::new(format!("{p}: mkfs wrote no readable superblock")))?;
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "formatted {p}: {} bytes, fsid {}",
        sb.total_bytes,
        print::fsid(&sb.fsid)
    )
    .map_err(output)?;
    Ok(0)
}

/// Refuses a device or image in use, whatever `--force` says: a mkfs
/// under a live filesystem destroys both (the mount's next commit writes
/// its trees over the new ones). A block device is opened O_EXCL, as the
/// kernel's mounts and other mkfs programs claim it (the descriptor
/// returned holds that claim); an image file must not be attached to a
/// loop device, and must take the lock birch's mounts and scrub take.
fn claim_unused(path: &Path, dev: &FileDevice) -> Result<Option<std::fs::File>, Failure> {
    let p = show(path);
    let refuse = |why: String| Failure::new(format!("{why}; not formatting it"));
    let block_device = dev
        .file()
        .metadata()
        .is_ok_and(|m| m.file_type().is_block_device());
    let exclusive = if block_device {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(path)
        {
            Ok(file) => Some(file),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                let holder = holders::lock_holder(dev.file())
                    .map(|h| format!(": {h} holds its lock"))
                    .unwrap_or_default();
                return Err(refuse(format!(
                    "{p} is in use (mounted, or claimed by another program){holder}"
                )));
            }
            Err(e) => return Err(Failure::new(format!("{p}: cannot open exclusively: {e}"))),
        }
    } else {
        None
    };
    mount::lock_image(dev.file(), path).map_err(|f| refuse(f.message))?;
    if let Some(loop_dev) = loopdev::devices_of(path).first() {
        return Err(refuse(format!(
            "{p} is in use: attached to {} (losetup -d it once nothing uses it)",
            loop_dev.display()
        )));
    }
    Ok(exclusive)
}

/// Without `--force`, refuses an image or device that already holds a
/// filesystem, swap space or a partition table, naming what it found.
fn refuse_existing_filesystem(path: &Path, dev: &FileDevice) -> Result<(), Failure> {
    let p = show(path);
    let copies = read_superblock_copies(dev);
    if let Some(found) = newest_valid_copy(&copies) {
        let sb = found.superblock.as_ref().expect("valid copy");
        return Err(Failure::new(format!(
            "{p} already holds a birch filesystem (superblock at {}: fsid {}, generation {}, {} bytes); use --force to overwrite it",
            found.bytenr,
            print::fsid(&sb.fsid),
            sb.generation,
            sb.total_bytes
        )));
    }
    let start = read_start(dev).map_err(|e| Failure::new(format!("{p}: cannot read: {e}")))?;
    match signature::foreign_signature(&start) {
        Some(what) => Err(Failure::new(format!(
            "{p} holds {what}; use --force to overwrite it"
        ))),
        None => Ok(()),
    }
}

/// The first [`signature::PROBE_BYTES`] of the device, or all of a
/// shorter one.
fn read_start(dev: &FileDevice) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; signature::PROBE_BYTES];
    let mut filled = 0;
    while filled < buf.len() {
        match dev.file().read_at(&mut buf[filled..], filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// Zeroes what birch never uses below its first superblock, where the
/// other filesystems' and the partition tables' signatures live, and the
/// device's last 64 KiB (GPT's backup header), as mkfs.btrfs does: a
/// device formatted over must not still look like what it was to blkid
/// and mount(8). Nothing is allocated yet, so the end holds nothing of
/// the new filesystem.
fn wipe_foreign_signatures(dev: &FileDevice) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let size = dev.size_bytes();
    let zeros = vec![0u8; birch::format::SUPERBLOCK_OFFSETS[0] as usize];
    dev.file().write_all_at(&zeros, 0)?;
    let tail = size.saturating_sub(zeros.len() as u64);
    if tail >= birch::format::FIRST_ALLOCATABLE_BYTE {
        dev.file().write_all_at(&zeros, tail)?;
    }
    Ok(())
}

// ----- check -----

fn open_read_only(path: &Path) -> Result<FileDevice, Failure> {
    if path.is_dir() {
        return Err(Failure::unreadable(format!(
            "{}: is a directory",
            show(path)
        )));
    }
    FileDevice::open_read_only(path)
        .map_err(|e| Failure::unreadable(format!("{}: cannot open: {e}", show(path))))
}

fn check(args: &CheckArgs) -> Result<u8, Failure> {
    let path = &args.image.image;
    let dev = open_read_only(path)?;
    let options = CheckOptions {
        verify_data: args.verify_data,
    };
    let report = check_device_with(&dev, options);
    if let Some(why) = report.unreadable_reason() {
        return Err(Failure::unreadable(format!("{}: {why}", show(path))));
    }
    let mut out = io::stdout().lock();
    writeln!(out, "checking {}", show(path)).map_err(output)?;
    write!(out, "{report}").map_err(output)?;
    Ok(if report.is_clean() { 0 } else { 1 })
}

// ----- scrub -----

/// Scrubs a mounted filesystem through its daemon, or an image under the
/// lock a mount takes, so no mounted filesystem can reuse a block while
/// scrub rewrites it.
fn scrub(args: &ScrubArgs) -> Result<u8, Failure> {
    let path = &args.target;
    if path.is_dir() {
        return scrub::scrub_mounted(path);
    }
    let dev = FileDevice::open(path, false)
        .map_err(|e| Failure::unreadable(format!("{}: cannot open read-write: {e}", show(path))))?;
    mount::lock_image(dev.file(), path)?;
    let report = birch::scrub::scrub_device_with_progress(&dev, &mut scrub_progress())
        .map_err(|e| Failure::unreadable(format!("{}: {e}", show(path))))?;
    finish_progress(report.data_extents > 0);
    dev.flush()
        .map_err(|e| Failure::new(format!("{}: flush after the repairs: {e}", show(path))))?;
    let mut out = io::stdout().lock();
    writeln!(out, "scrubbing {}", show(path)).map_err(output)?;
    write!(out, "{report}").map_err(output)?;
    Ok(if report.is_clean() { 0 } else { 1 })
}

/// Scrub progress on stderr when it is a terminal (at most a line per
/// percent); nothing otherwise, so scripts get only the summary.
fn scrub_progress() -> impl FnMut(birch::scrub::ScrubProgress) {
    let tty = io::IsTerminal::is_terminal(&io::stderr());
    let mut shown = None;
    move |p: birch::scrub::ScrubProgress| {
        if !tty || p.data_bytes_total == 0 {
            return;
        }
        let percent = p.data_bytes_done * 100 / p.data_bytes_total;
        if shown != Some(percent) {
            shown = Some(percent);
            eprint!(
                "\rscrubbing data: {percent:3}% ({} of {} MiB)",
                p.data_bytes_done >> 20,
                p.data_bytes_total >> 20
            );
        }
    }
}

/// Ends the progress line, if one was drawn (`drawn`: there was data).
fn finish_progress(drawn: bool) {
    if drawn && io::IsTerminal::is_terminal(&io::stderr()) {
        eprintln!();
    }
}

// ----- dump -----

fn current_superblock(path: &Path, copies: &[SuperblockCopy]) -> Result<Superblock, Failure> {
    match newest_valid_copy(copies) {
        Some(c) => Ok(c.superblock.clone().expect("valid copy")),
        None => {
            let why: Vec<String> = copies
                .iter()
                .map(|c| {
                    format!(
                        "copy at {}: {}",
                        c.bytenr,
                        c.superblock
                            .as_ref()
                            .err()
                            .map(ToString::to_string)
                            .unwrap_or_default()
                    )
                })
                .collect();
            Err(Failure::unreadable(format!(
                "{}: no valid superblock: {}",
                show(path),
                why.join("; ")
            )))
        }
    }
}

fn dump_super(out: &mut dyn Write, copies: &[SuperblockCopy]) -> io::Result<()> {
    let current = newest_valid_copy(copies).map(|c| c.bytenr);
    for c in copies {
        match &c.superblock {
            Ok(sb) => {
                let text = print::superblock(sb, c.bytenr);
                let mut lines = text.lines();
                if let Some(first) = lines.next() {
                    writeln!(
                        out,
                        "{first}{}",
                        if Some(c.bytenr) == current {
                            " (current)"
                        } else {
                            ""
                        }
                    )?;
                }
                for l in lines {
                    writeln!(out, "{l}")?;
                }
            }
            Err(why) => writeln!(out, "superblock at {}: invalid: {why}", c.bytenr)?,
        }
    }
    Ok(())
}

fn dump_trees<D: BlockDevice + ?Sized>(
    out: &mut dyn Write,
    dev: &D,
    sb: &Superblock,
    only: Option<u64>,
) -> Result<(), Failure> {
    let (roots, problems) = tree_roots(dev, sb);
    for p in &problems {
        writeln!(out, "warning: {p}").map_err(output)?;
    }
    let chosen: Vec<&TreeRootRef> = roots
        .iter()
        .filter(|r| only.is_none_or(|id| r.tree == id))
        .collect();
    if chosen.is_empty() {
        let id = only.unwrap_or_default();
        let known: Vec<String> = roots.iter().map(|r| tree_name(r.tree)).collect();
        return Err(Failure::new(format!(
            "no tree {} in this filesystem (it has {})",
            tree_name(id),
            known.join(", ")
        )));
    }
    for r in chosen {
        if let Some(sub) = r.subvolume {
            writeln!(out, "log of {}:", tree_name(sub)).map_err(output)?;
        }
        print::tree(out, dev, &sb.fsid, r.tree, r.bytenr, r.level, r.generation).map_err(output)?;
    }
    Ok(())
}

fn dump(args: &DumpArgs) -> Result<u8, Failure> {
    let path = &args.image.image;
    let dev = open_read_only(path)?;
    let copies = read_superblock_copies(&dev);
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    match &args.what {
        None => {
            let sb = current_superblock(path, &copies)?;
            dump_super(&mut out, &copies).map_err(output)?;
            dump_trees(&mut out, &dev, &sb, None)?;
        }
        Some(DumpWhat::Super) => {
            if newest_valid_copy(&copies).is_none() {
                current_superblock(path, &copies)?;
            }
            dump_super(&mut out, &copies).map_err(output)?;
        }
        Some(DumpWhat::Tree { tree }) => {
            let sb = current_superblock(path, &copies)?;
            dump_trees(&mut out, &dev, &sb, *tree)?;
        }
        Some(DumpWhat::Block { bytenr }) => {
            // Without a valid superblock there is no fsid to validate
            // against: the block still prints its raw header.
            let fsid = newest_valid_copy(&copies)
                .and_then(|c| c.superblock.as_ref().ok())
                .map(|sb| sb.fsid)
                .unwrap_or_default();
            if let Err(why) = print::block(&mut out, &dev, &fsid, *bytenr).map_err(output)? {
                out.flush().map_err(output)?;
                return Err(Failure::new(format!(
                    "{}: block {bytenr} is not a node of this filesystem: {why}",
                    show(path)
                )));
            }
        }
    }
    out.flush().map_err(output)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("16777216"), Ok(16 << 20));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
        for bad in [
            "",
            "G",
            "1.5G",
            "12Q",
            "1M",
            "99999999999999999999",
            "16777217",
            "99999999T",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_bytenr("0x100000"), Ok(1 << 20));
        assert!(parse_bytenr("-1").is_err());
    }
}
