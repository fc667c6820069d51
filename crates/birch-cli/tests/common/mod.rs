//! Shared by the `mount_*` suites: a scratch directory with an image, the
//! real `birch` binary serving it through FUSE (`birch mount -f`, a child
//! of the test), a simulated power cut (the shutdown ioctl), and a guard
//! that always unmounts.
//!
//! [`Fixture`]'s drop unmounts (plain umount, then a lazy one if something
//! still sits in the mount, then aborting the FUSE connection as a last
//! resort), waits for the daemon to exit, runs `birch check` on the image
//! and removes the scratch directory. It does so on panic too; a failure
//! there panics unless the test is already panicking (then it is printed).
//!
//! These suites mount for real: they need root and /dev/fuse. Without
//! them each test prints why and returns (see [`skip_unless_root`]).
#![allow(dead_code)] // each suite uses a different subset

pub mod json;

use std::ffi::CString;
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub const BIRCH: &str = env!("CARGO_BIN_EXE_birch");

/// How long a mount may take to come up, and a daemon to exit after its
/// unmount (the final commit may write a lot of dirty data).
const MOUNT_TIMEOUT: Duration = Duration::from_secs(30);
const EXIT_TIMEOUT: Duration = Duration::from_secs(120);

/// `BIRCH_LONG=1`: longer fsx and stress runs.
pub fn long_mode() -> bool {
    std::env::var("BIRCH_LONG").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Mounting needs root and /dev/fuse. Returns false (after saying why)
/// when they are missing, so a developer's unprivileged `cargo test` does
/// not fail for want of them; CI runs as root. `BIRCH_REQUIRE_MOUNT=1`
/// turns the skip into a failure.
pub fn skip_unless_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let fuse = Path::new("/dev/fuse").exists();
    if root && fuse {
        return false;
    }
    let why = if root {
        "/dev/fuse is missing"
    } else {
        "not running as root"
    };
    if std::env::var("BIRCH_REQUIRE_MOUNT").is_ok_and(|v| v == "1") {
        panic!("cannot mount: {why}");
    }
    eprintln!("skipped: {why} (mount tests need root and /dev/fuse)");
    true
}

/// Serializes the heavy tests of one suite (the machine has 2 cores; two
/// dbench runs at once prove nothing). Poisoning is ignored: one failed
/// test must not fail the others.
pub fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn birch(args: &[&str]) -> Output {
    Command::new(BIRCH).args(args).output().expect("run birch")
}

/// `birch stats --json MOUNTPOINT`, parsed.
pub fn stats_json(mnt: &Path) -> json::Value {
    let out = birch(&[
        "stats",
        "--json",
        mnt.to_str().expect("mount point is UTF-8"),
    ]);
    assert!(
        out.status.success(),
        "birch stats --json: {}",
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    json::parse(&stdout).unwrap_or_else(|e| panic!("birch stats --json: {e}:\n{stdout}"))
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs a command, returning its output; panics if it cannot start.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs a command and panics (with its output) unless it exits 0.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

/// Runs `cmd` with its output sent to `log`, killing it (and failing) if
/// it outlives `limit`: a deadlocked filesystem must fail the test, not
/// hang CI.
pub fn run_with_timeout(
    cmd: &mut Command,
    log: &Path,
    limit: Duration,
) -> std::process::ExitStatus {
    let out = File::create(log).expect("create log");
    let err = out.try_clone().expect("dup log");
    let mut child = cmd
        .stdout(out)
        .stderr(err)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    match wait_timeout(&mut child, limit) {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} did not finish within {limit:?} (deadlock?); log {}:\n{}",
                log.display(),
                tail(log, 40)
            );
        }
    }
}

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> String {
    let s = fs::read(path).map(|b| text(&b)).unwrap_or_default();
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            return Some(status);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

/// The errno of the last failed libc call.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A directory removed (if nothing is mounted in it) on drop.
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let base = std::env::var_os("BIRCH_TEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!(
            "birch-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create scratch dir");
        let dir = dir.canonicalize().expect("canonical scratch dir");
        Scratch { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Never recurse into a live mount (that would delete the
        // filesystem's contents, or hang on a dead one).
        if mount_fstype(&self.dir.join("mnt")).is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        } else {
            eprintln!(
                "leaving {} in place: something is still mounted there",
                self.dir.display()
            );
        }
    }
}

/// The filesystem type mounted exactly at `path` (from /proc/self/mountinfo),
/// if anything is mounted there.
pub fn mount_fstype(path: &Path) -> Option<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.to_str()?;
    let mut found = None;
    for line in info.lines() {
        // id parent major:minor root mountpoint opts [optional...] - fstype source superopts
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() > dash + 1
            && fields.get(4).map(|m| unescape_mountinfo(m)) == Some(want.to_string())
        {
            // The last match is the top of a stack of mounts.
            found = Some(fields[dash + 1].to_string());
        }
    }
    found
}

fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Lazily unmounts whatever is mounted at `path` (cleanup after a failure).
fn detach_mount(path: &Path) {
    if mount_fstype(path).is_some() {
        let target = cstr(path);
        // SAFETY: a valid C string.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// fstests' shutdown ioctl, `_IOR('X', 125, __u32)`, written out here
/// rather than taken from birch-fuse so that the test sends what fstests
/// sends even if birch's own constant were wrong.
const XFS_IOC_GOINGDOWN: u32 = 2 << 30 | 4 << 16 | (b'X' as u32) << 8 | 125;
const XFS_FSOP_GOING_FLAGS_NOLOGFLUSH: u32 = 2;

/// Whether a daemon's exit status after the unmount is a verdict.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DaemonExit {
    MustSucceed,
    /// After a shutdown its final commit fails by design.
    MayFail,
}

/// The running daemon of one mount.
struct Daemon {
    child: Child,
    /// The FUSE connection number (the mount's st_dev in the kernel's
    /// encoding: a fuseblk mount's is its block device's), for
    /// /sys/fs/fuse/connections/N/abort.
    connection: u64,
}

/// An image in a scratch directory, optionally mounted at `<scratch>/mnt`.
pub struct Fixture {
    pub scratch: Scratch,
    pub image: PathBuf,
    pub mnt: PathBuf,
    /// `-o` options for every mount of this fixture.
    pub options: Vec<String>,
    /// Environment variables for the daemon of every mount.
    pub daemon_env: Vec<(String, String)>,
    /// `birch mount --write-log FILE`: the next mounts record every device
    /// write, flush and fsync mark there (`birch replay` rebuilds any
    /// point).
    pub write_log: Option<PathBuf>,
    daemon: Option<Daemon>,
    mounts: usize,
    /// Skip the final `birch check` (a test that checks on its own terms).
    pub check_at_drop: bool,
}

impl Fixture {
    /// A fresh image of `size` (`birch mkfs --size`), not mounted.
    pub fn new(tag: &str, size: &str) -> Fixture {
        let scratch = Scratch::new(tag);
        let image = scratch.path("image");
        let mnt = scratch.path("mnt");
        fs::create_dir(&mnt).expect("create mount point");
        let out = birch(&["mkfs", image.to_str().unwrap(), "--size", size]);
        assert!(out.status.success(), "mkfs failed: {}", text(&out.stderr));
        Fixture {
            scratch,
            image,
            mnt,
            options: Vec::new(),
            daemon_env: Vec::new(),
            write_log: None,
            daemon: None,
            mounts: 0,
            check_at_drop: true,
        }
    }

    /// A fresh 1 GiB image, mounted with the default options.
    pub fn mounted(tag: &str) -> Fixture {
        let mut f = Fixture::new(tag, "1G");
        f.mount();
        f
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn image_str(&self) -> &str {
        self.image.to_str().unwrap()
    }

    pub fn is_mounted(&self) -> bool {
        self.daemon.is_some()
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.daemon.as_ref().expect("mounted").child.id()
    }

    fn log_path(&self) -> PathBuf {
        self.scratch.path(&format!("daemon-{}.log", self.mounts))
    }

    /// What the daemon of the latest mount has printed so far.
    pub fn daemon_log(&self) -> String {
        fs::read(self.log_path())
            .map(|b| text(&b))
            .unwrap_or_default()
    }

    /// Starts `birch mount -f IMAGE MNT` and waits until the mount is live.
    pub fn mount(&mut self) {
        assert!(self.daemon.is_none(), "already mounted");
        assert_eq!(
            mount_fstype(&self.mnt),
            None,
            "{} is already a mount point",
            self.mnt.display()
        );
        self.mounts += 1;
        let log = self.log_path();
        let out = File::create(&log).expect("create daemon log");
        let err = out.try_clone().expect("dup daemon log");
        let mut cmd = Command::new(BIRCH);
        cmd.arg("mount").arg(&self.image).arg(&self.mnt).arg("-f");
        if !self.options.is_empty() {
            cmd.arg("-o").arg(self.options.join(","));
        }
        if let Some(log) = &self.write_log {
            cmd.arg("--write-log").arg(log);
        }
        cmd.envs(self.daemon_env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start birch mount");
        let start = Instant::now();
        loop {
            // "fuseblk.birch" (as root) or "fuse.birch", or plain "fuse"
            // where the subtype is not passed.
            if mount_fstype(&self.mnt).is_some_and(|t| t.starts_with("fuse")) {
                break;
            }
            if let Some(status) = child.try_wait().expect("wait for daemon") {
                detach_mount(&self.mnt);
                panic!(
                    "birch mount exited ({status}) before the mount was live:\n{}",
                    tail(&log, 40)
                );
            }
            if start.elapsed() > MOUNT_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                detach_mount(&self.mnt);
                panic!(
                    "mount not live after {MOUNT_TIMEOUT:?}:\n{}",
                    tail(&log, 40)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let dev = fs::metadata(&self.mnt).expect("stat mount point").dev();
        // SAFETY: major() and minor() only do arithmetic on the number.
        let connection = (u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev));
        self.daemon = Some(Daemon { child, connection });
    }

    /// Unmounts and waits for the daemon to exit. Errors (busy mount, a
    /// daemon that fails or hangs) are returned after the mount is gone
    /// by whatever means it takes.
    pub fn try_unmount(&mut self) -> Result<(), String> {
        self.unmount_and_reap(DaemonExit::MustSucceed)
    }

    fn unmount_and_reap(&mut self, exit: DaemonExit) -> Result<(), String> {
        let Some(mut daemon) = self.daemon.take() else {
            return Ok(());
        };
        let mut problems = Vec::new();
        let target = cstr(&self.mnt);
        let mut unmounted = false;
        for _ in 0..100 {
            // SAFETY: a valid C string.
            if unsafe { libc::umount2(target.as_ptr(), 0) } == 0 {
                unmounted = true;
                break;
            }
            let e = errno();
            if e == libc::EINVAL || e == libc::ENOENT {
                // Not mounted any more (the daemon is gone).
                unmounted = true;
                break;
            }
            if e != libc::EBUSY {
                problems.push(format!("umount: {}", std::io::Error::from_raw_os_error(e)));
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !unmounted {
            problems.push("mount stayed busy: detached it (umount -l)".into());
            // SAFETY: as above.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
        let log = self.log_path();
        match wait_timeout(&mut daemon.child, EXIT_TIMEOUT) {
            Some(status) if status.success() || exit == DaemonExit::MayFail => {}
            Some(status) => {
                problems.push(format!("daemon exited with {status}:\n{}", tail(&log, 40)))
            }
            None => {
                problems.push(format!(
                    "daemon still running {EXIT_TIMEOUT:?} after unmount (killed it):\n{}",
                    tail(&log, 40)
                ));
                let _ = fs::write(
                    format!("/sys/fs/fuse/connections/{}/abort", daemon.connection),
                    "1",
                );
                let _ = daemon.child.kill();
                let _ = daemon.child.wait();
            }
        }
        if mount_fstype(&self.mnt).is_some() {
            // SAFETY: as above.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            problems.push("still mounted after the daemon exited".into());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }

    pub fn unmount(&mut self) {
        if let Err(e) = self.try_unmount() {
            panic!("unmount of {} failed: {e}", self.mnt.display());
        }
    }

    /// A power cut through the real mount, as fstests does it: the
    /// shutdown ioctl on the mount point (from then on birch writes
    /// nothing to the image and answers every request with EIO), then the
    /// unmount. The daemon's final commit cannot be written, so its exit
    /// status says nothing; the image holds what a power cut at the ioctl
    /// would have left.
    pub fn power_cut(&mut self) {
        self.power_cut_then(|| {});
    }

    /// [`Self::power_cut`], running `before_unmount` after the shutdown
    /// took: a test holding a file open in the mount closes it there (the
    /// unmount waits for no open file), so its release comes after the cut.
    pub fn power_cut_then(&mut self, before_unmount: impl FnOnce()) {
        let mnt = File::open(&self.mnt).expect("open the mount point");
        // xfs_io's `shutdown` without -f: no log flush first.
        let mut flags: u32 = XFS_FSOP_GOING_FLAGS_NOLOGFLUSH;
        // SAFETY: an fd we own and a pointer to a live u32, the ioctl's argument.
        let rc = unsafe {
            libc::ioctl(
                mnt.as_raw_fd(),
                XFS_IOC_GOINGDOWN as libc::c_ulong,
                &mut flags as *mut u32,
            )
        };
        assert_eq!(
            rc,
            0,
            "shutdown ioctl on {}: {}",
            self.mnt.display(),
            std::io::Error::last_os_error()
        );
        drop(mnt);
        // Proof that the cut took: a change now is refused, not half made.
        let late = self.mnt.join("created-after-the-cut");
        let refused = fs::create_dir(&late).map_err(|e| e.raw_os_error());
        assert_eq!(
            refused,
            Err(Some(libc::EIO)),
            "mkdir {} after the shutdown",
            late.display()
        );
        before_unmount();
        if let Err(e) = self.unmount_and_reap(DaemonExit::MayFail) {
            panic!(
                "unmount of {} after the shutdown failed: {e}",
                self.mnt.display()
            );
        }
    }

    /// Unmounts a mount whose engine has failed (docs/IO-ERRORS.md): its
    /// final commit fails, so the daemon's exit status says nothing.
    pub fn unmount_after_failure(&mut self) {
        if let Err(e) = self.unmount_and_reap(DaemonExit::MayFail) {
            panic!(
                "unmount of {} after the failure failed: {e}",
                self.mnt.display()
            );
        }
    }

    pub fn remount(&mut self) {
        self.unmount();
        self.mount();
    }

    /// SIGKILLs the daemon (no commit, no unmount) and clears the dead
    /// mount the way an administrator would (`umount -l`).
    pub fn kill_daemon(&mut self) {
        self.kill_daemon_then(|| ());
    }

    /// As [`kill_daemon`](Self::kill_daemon), running `f` after the kill
    /// and before the dead mount is detached (to stop workloads, which
    /// then see ENOTCONN rather than the directory under the mount).
    pub fn kill_daemon_then<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let mut daemon = self.daemon.take().expect("mounted");
        daemon.child.kill().expect("SIGKILL the daemon");
        daemon.child.wait().expect("reap the daemon");
        let result = f();
        let target = cstr(&self.mnt);
        // SAFETY: a valid C string.
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
            let e = errno();
            assert!(
                e == libc::EINVAL || e == libc::ENOENT,
                "umount -l of the dead mount: {}",
                std::io::Error::from_raw_os_error(e)
            );
        }
        assert_eq!(mount_fstype(&self.mnt), None, "dead mount still there");
        result
    }

    /// `birch check IMAGE` (the image must not be mounted): Ok(report) if
    /// clean, Err(report) otherwise.
    pub fn check(&self) -> Result<String, String> {
        assert!(self.daemon.is_none(), "check of a mounted image");
        let out = birch(&["check", self.image_str()]);
        let report = format!("{}{}", text(&out.stdout), text(&out.stderr));
        if out.status.success() && report.contains("result: clean") {
            Ok(report)
        } else {
            Err(format!(
                "birch check {} ({}):\n{report}",
                self.image.display(),
                out.status
            ))
        }
    }

    pub fn assert_clean(&self) {
        if let Err(e) = self.check() {
            panic!("{e}");
        }
    }

    /// The generation of the current superblock, from `birch dump IMAGE super`.
    pub fn generation(&self) -> u64 {
        let out = birch(&["dump", self.image_str(), "super"]);
        assert!(out.status.success(), "dump failed: {}", text(&out.stderr));
        let s = text(&out.stdout);
        let current = s
            .split("superblock at ")
            .find(|block| {
                block
                    .lines()
                    .next()
                    .is_some_and(|l| l.contains("(current)"))
            })
            .unwrap_or_else(|| panic!("no current superblock in dump:\n{s}"));
        current
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("generation ")
                    .and_then(|g| g.trim().parse().ok())
            })
            .unwrap_or_else(|| panic!("no generation in dump:\n{s}"))
    }

    /// `birch sync MNT`.
    pub fn sync(&self) {
        let out = birch(&["sync", self.mnt.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "birch sync failed: {}",
            text(&out.stderr)
        );
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let mut problems = Vec::new();
        if let Err(e) = self.try_unmount() {
            problems.push(e);
        }
        if self.check_at_drop {
            if let Err(e) = self.check() {
                problems.push(e);
            }
        }
        if problems.is_empty() {
            return;
        }
        let message = format!(
            "at teardown of {}:\n{}",
            self.mnt.display(),
            problems.join("\n")
        );
        if std::thread::panicking() {
            eprintln!("{message}");
        } else {
            panic!("{message}");
        }
    }
}
