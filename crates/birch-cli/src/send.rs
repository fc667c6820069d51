//! `birch send [-p PARENT] [-f FILE] [-q] SNAPSHOT...` (docs/SEND.md,
//! "Send"): btrfs-progs' command. On a mount the daemon writes the
//! stream (`BIRCH_IOC_SEND`) into a pipe this process reads and copies to
//! the output, as btrfs-progs copies the kernel's stream; with `--image`
//! the library reads an unmounted image and writes the stream itself.
//! Several snapshots make one stream: the header before the first, END
//! after the last (btrfs-progs' OMIT flags).

use crate::subvolume::{
    failure, ioctl, is_subvolume_root, open_dir, open_image, subvolume_id, ImageAccess,
};
use crate::{show, Failure};
use birch::fs::{SendOptions, SendStats};
use birch_fuse::send::{
    decode_totals, SendArgs as IoctlArgs, BIRCH_IOC_SEND, BIRCH_SEND_ARGS_SIZE,
    BTRFS_SEND_FLAG_OMIT_END_CMD, BTRFS_SEND_FLAG_OMIT_STREAM_HEADER,
};
use birch_fuse::subvol::{self, BTRFS_IOC_SUBVOL_GETFLAGS, BTRFS_SUBVOL_RDONLY};
use clap::Args;
use std::fs::{File, OpenOptions};
use std::io::{self, IsTerminal, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct SendArgs {
    /// Send an incremental stream against PARENT, a read-only snapshot of
    /// the same filesystem that the receiver already has
    #[arg(short = 'p', value_name = "PARENT")]
    parent: Option<PathBuf>,
    /// Write the stream to FILE instead of standard output
    #[arg(short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// Print neither "At subvol" lines nor progress
    #[arg(short = 'q', long = "quiet")]
    quiet: bool,
    /// Read the unmounted image IMAGE; SNAPSHOT and PARENT are then paths
    /// from its top level, as `birch subvolume list` prints them
    #[arg(long = "image", value_name = "IMAGE")]
    image: Option<PathBuf>,
    /// Read-only subvolumes to send, in this order, into one stream
    #[arg(value_name = "SNAPSHOT", required = true)]
    snapshots: Vec<PathBuf>,
}

pub fn send(args: &SendArgs) -> Result<u8, Failure> {
    // A stream cut short is worse than none: a FILE this command created
    // goes again on failure (never one that was there: /dev/null, a
    // device, a named pipe).
    let created = args
        .file
        .as_deref()
        .filter(|f| std::fs::symlink_metadata(f).is_err());
    let output = open_output(args.file.as_deref())?;
    let mut progress = Progress::new(args.quiet);
    let sent = match &args.image {
        Some(image) => send_from_image(image, args, output, &mut progress),
        None => send_from_mount(args, output, &mut progress),
    };
    progress.finish();
    if let (Err(_), Some(file)) = (&sent, created) {
        let _ = std::fs::remove_file(file);
    }
    sent.map(|()| 0)
}

/// FILE (created or truncated, 0600 as btrfs-progs), or standard output,
/// which must not be a terminal (btrfs-progs' refusal).
fn open_output(file: Option<&Path>) -> Result<Box<dyn Write + Send>, Failure> {
    match file {
        Some(path) => {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| Failure::new(format!("cannot create {}: {e}", show(path))))?;
            Ok(Box::new(io::BufWriter::with_capacity(1 << 17, f)))
        }
        None => {
            if io::stdout().is_terminal() {
                return Err(Failure::new(
                    "not writing a send stream to a terminal: redirect it into a file or a pipe, or use -f FILE",
                ));
            }
            Ok(Box::new(io::BufWriter::with_capacity(
                1 << 17,
                io::stdout(),
            )))
        }
    }
}

/// btrfs-progs' flags for snapshot `index` of `count` in one stream.
fn stream_flags(index: usize, count: usize) -> (bool, bool) {
    (index > 0, index + 1 < count)
}

// ----- through the mount -----

/// A read-only subvolume root on a birch mount: its open directory, id and
/// device number.
struct MountedSnapshot {
    dir: File,
    id: u64,
    dev: u64,
}

fn mounted_snapshot(path: &Path) -> Result<MountedSnapshot, Failure> {
    let dir = open_dir(path)?;
    if !is_subvolume_root(&dir, path)? {
        return Err(Failure::new(format!("not a subvolume: {}", path.display())));
    }
    let mut flags = 0u64;
    ioctl(&dir, path, BTRFS_IOC_SUBVOL_GETFLAGS, &mut flags).map_err(|e| failure(path, e, ""))?;
    if flags & BTRFS_SUBVOL_RDONLY == 0 {
        return Err(Failure::new(format!(
            "subvolume {} is not read-only (`birch subvolume snapshot -r` makes a read-only snapshot)",
            path.display()
        )));
    }
    let id = subvolume_id(&dir, path)?;
    let dev = dir
        .metadata()
        .map_err(|e| Failure::new(format!("cannot access {}: {e}", path.display())))?
        .dev();
    Ok(MountedSnapshot { dir, id, dev })
}

fn send_from_mount(
    args: &SendArgs,
    mut output: Box<dyn Write + Send>,
    progress: &mut Progress,
) -> Result<(), Failure> {
    let parent = match &args.parent {
        Some(path) => Some((path, mounted_snapshot(path)?)),
        None => None,
    };
    let count = args.snapshots.len();
    for (index, path) in args.snapshots.iter().enumerate() {
        let snapshot = mounted_snapshot(path)?;
        if let Some((parent_path, p)) = &parent {
            if p.dev != snapshot.dev {
                return Err(Failure::new(format!(
                    "parent {} is not on the filesystem of {}",
                    parent_path.display(),
                    path.display()
                )));
            }
        }
        progress.at_subvol(path);
        let (omit_header, omit_end) = stream_flags(index, count);
        let mut flags = 0;
        if omit_header {
            flags |= BTRFS_SEND_FLAG_OMIT_STREAM_HEADER;
        }
        if omit_end {
            flags |= BTRFS_SEND_FLAG_OMIT_END_CMD;
        }
        output = send_one_mounted(
            path,
            &snapshot,
            parent.as_ref().map(|p| p.1.id),
            flags,
            output,
            progress,
        )?;
    }
    output
        .flush()
        .map_err(|e| Failure::new(format!("cannot write the stream: {e}")))
}

/// One snapshot through the daemon: a thread copies the pipe to `output`
/// while this one waits in the ioctl (the daemon writes until the stream
/// of this snapshot is done). Returns `output` for the next snapshot.
fn send_one_mounted(
    path: &Path,
    snapshot: &MountedSnapshot,
    parent: Option<u64>,
    flags: u64,
    output: Box<dyn Write + Send>,
    progress: &mut Progress,
) -> Result<Box<dyn Write + Send>, Failure> {
    let (reader, writer) = pipe()?;
    let counted = progress.counter();
    let arg = IoctlArgs {
        send_fd: writer.as_raw_fd() as u64,
        parent: parent.unwrap_or(0),
        flags,
    }
    .encode();
    let (asked, copied) = std::thread::scope(|s| {
        let copier = s.spawn(move || copy_stream(reader, output, counted));
        let asker = s.spawn(move || {
            let mut arg = arg;
            let asked = ioctl(&snapshot.dir, path, BIRCH_IOC_SEND, &mut arg).map(|()| arg);
            // The copier sees the end of the stream once both write ends
            // are closed: the daemon's (closed when its send returned)
            // and this one.
            drop(writer);
            asked
        });
        while !asker.is_finished() {
            std::thread::sleep(Duration::from_millis(100));
            progress.poll();
        }
        (asker.join(), copier.join())
    });
    let asked = asked.map_err(|_| Failure::new("the send request thread panicked"))?;
    let copied = copied.map_err(|_| Failure::new("the stream copier panicked"))?;
    let arg = asked.map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) => failure(path, e, "send needs root or the mount's owner"),
        Some(libc::ENOTTY) => Failure::new(format!(
            "{}: not a birch mount, or its daemon predates `birch send` (send an unmounted image with --image)",
            path.display()
        )),
        Some(libc::EPIPE) => Failure::new(format!(
            "{}: the stream's reader went away",
            path.display()
        )),
        _ => Failure::new(format!("{}: send failed: {e}", path.display())),
    })?;
    let (output, totals) = copied?;
    if let Some(stats) = decode_totals(&arg[..BIRCH_SEND_ARGS_SIZE]) {
        progress.sent(&stats, totals);
    }
    Ok(output)
}

fn pipe() -> Result<(File, File), Failure> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills both descriptors on success; each is then owned
    // by exactly one File.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Failure::new(format!(
            "pipe: {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: as above.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

/// Copies the pipe to `output` until its end; returns `output` and the
/// bytes copied.
fn copy_stream(
    mut reader: File,
    mut output: Box<dyn Write + Send>,
    counted: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Result<(Box<dyn Write + Send>, u64), Failure> {
    let mut buf = vec![0u8; 1 << 17];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok((output, total)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failure::new(format!("reading the stream: {e}"))),
        };
        output
            .write_all(&buf[..n])
            .map_err(|e| Failure::new(format!("cannot write the stream: {e}")))?;
        total += n as u64;
        counted.store(total, std::sync::atomic::Ordering::Relaxed);
    }
}

// ----- from an unmounted image -----

fn send_from_image(
    image: &Path,
    args: &SendArgs,
    mut output: Box<dyn Write + Send>,
    progress: &mut Progress,
) -> Result<(), Failure> {
    let fs = open_image(image, ImageAccess::ReadOnly)?;
    let entries = subvol::list(&fs).map_err(|e| Failure::new(format!("{}: {e}", show(image))))?;
    let find = |path: &Path| -> Result<u64, Failure> {
        let wanted = path.as_os_str().as_bytes();
        let wanted = wanted.strip_prefix(b"/").unwrap_or(wanted);
        let wanted = wanted.strip_suffix(b"/").unwrap_or(wanted);
        let e = entries.iter().find(|e| e.path == wanted).ok_or_else(|| {
            Failure::new(format!(
                "{}: no subvolume {} (paths from the top level, as `birch subvolume list {}` prints)",
                show(image),
                path.display(),
                show(image)
            ))
        })?;
        if !e.readonly {
            return Err(Failure::new(format!(
                "subvolume {} is not read-only",
                path.display()
            )));
        }
        Ok(e.id)
    };
    let parent = args.parent.as_deref().map(find).transpose()?;
    let count = args.snapshots.len();
    for (index, path) in args.snapshots.iter().enumerate() {
        let id = find(path)?;
        progress.at_subvol(path);
        let (omit_header, omit_end) = stream_flags(index, count);
        let options = SendOptions {
            parent,
            omit_header,
            omit_end,
        };
        let mut counting = CountingWriter {
            inner: &mut output,
            bytes: 0,
        };
        let stats = fs
            .send(id, &options, &mut counting, &mut |s| progress.engine(s))
            .map_err(|e| {
                Failure::new(format!("{}: send of {}: {e}", show(image), path.display()))
            })?;
        let bytes = counting.bytes;
        progress.sent(&stats, bytes);
    }
    output
        .flush()
        .map_err(|e| Failure::new(format!("cannot write the stream: {e}")))
}

struct CountingWriter<'a> {
    inner: &'a mut Box<dyn Write + Send>,
    bytes: u64,
}

impl Write for CountingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

// ----- what the user sees -----

/// "At subvol PATH" on standard error for each snapshot (btrfs-progs'
/// line) and its totals after it, and on a terminal a progress line
/// redrawn at most twice a second: bytes of stream and, from an image,
/// inodes.
struct Progress {
    quiet: bool,
    terminal: bool,
    bytes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    inodes: u64,
    last_drawn: Option<Instant>,
    drawn: bool,
}

impl Progress {
    fn new(quiet: bool) -> Progress {
        Progress {
            quiet,
            terminal: !quiet && io::stderr().is_terminal(),
            bytes: Default::default(),
            inodes: 0,
            last_drawn: None,
            drawn: false,
        }
    }

    fn at_subvol(&mut self, path: &Path) {
        self.clear();
        if !self.quiet {
            eprintln!("At subvol {}", path.display());
        }
        self.bytes.store(0, std::sync::atomic::Ordering::Relaxed);
        self.inodes = 0;
    }

    fn counter(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.bytes.clone()
    }

    fn engine(&mut self, stats: &SendStats) {
        self.bytes
            .store(stats.stream_bytes, std::sync::atomic::Ordering::Relaxed);
        self.inodes = stats.inodes;
        self.poll();
    }

    fn poll(&mut self) {
        if !self.terminal
            || self
                .last_drawn
                .is_some_and(|t| t.elapsed() < Duration::from_millis(500))
        {
            return;
        }
        self.last_drawn = Some(Instant::now());
        let bytes = self.bytes.load(std::sync::atomic::Ordering::Relaxed);
        let mut line = format!("\r{:.1} MiB", bytes as f64 / (1 << 20) as f64);
        if self.inodes > 0 {
            line += &format!(", {} inodes", self.inodes);
        }
        eprint!("{line}\x1b[K");
        self.drawn = true;
    }

    /// The totals of one snapshot's stream, unless quiet (btrfs-progs has
    /// no such line; scripts and bench/run read the tree nodes read).
    fn sent(&mut self, stats: &SendStats, bytes: u64) {
        if self.quiet {
            return;
        }
        self.clear();
        eprintln!(
            "{:.1} MiB, {} inodes, {} commands, {} tree nodes read",
            bytes as f64 / (1 << 20) as f64,
            stats.inodes,
            stats.commands,
            stats.nodes_read
        );
    }

    fn clear(&mut self) {
        if self.drawn {
            eprint!("\r\x1b[K");
            self.drawn = false;
        }
    }

    fn finish(&mut self) {
        self.clear();
    }
}
