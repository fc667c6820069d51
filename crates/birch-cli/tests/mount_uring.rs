//! FUSE over io_uring (docs/FUSE.md, "Transport"): with the kernel's
//! `fuse.enable_uring` on, a mount serves its requests through io_uring
//! queues, and with it off falls back to /dev/fuse and says why. Each test
//! sets the module parameter and puts back what it found; they hold the
//! suite's lock so that neither mounts under the other's setting. No
//! timings here: docs/FUSE.md has the measurements.
//!
//! Run: `cargo test -p birch-cli --test mount_uring` as root.

mod common;

use common::json::Value;
use common::{birch, exclusive, mount_fstype, skip_unless_root, text, Fixture};
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::Write;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// The module parameter, set for as long as this lives and then restored.
struct EnableUring {
    found: String,
}

impl EnableUring {
    /// None (after saying why) on a kernel without FUSE over io_uring.
    fn set(value: &str) -> Option<EnableUring> {
        let Ok(found) = fs::read_to_string(ENABLE_URING) else {
            eprintln!("skipped: {ENABLE_URING} is missing (FUSE over io_uring needs Linux 6.14+)");
            return None;
        };
        fs::write(ENABLE_URING, value).expect("set fuse.enable_uring");
        Some(EnableUring {
            found: found.trim().to_string(),
        })
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        let _ = fs::write(ENABLE_URING, &self.found);
    }
}

/// The transport `birch stats --json` reports.
fn transport(fx: &Fixture) -> String {
    let out = birch(&["stats", "--json", fx.mnt.to_str().unwrap()]);
    assert!(out.status.success(), "birch stats: {}", text(&out.stderr));
    let stats = text(&out.stdout);
    match common::json::parse(&stats)
        .unwrap_or_else(|e| panic!("birch stats --json: {e}:\n{stats}"))
        .get("transport")
    {
        Some(Value::String(transport)) => transport.clone(),
        other => panic!("no transport in birch stats: {other:?}\n{stats}"),
    }
}

fn names(fx: &Fixture, dir: &str) -> BTreeSet<String> {
    fs::read_dir(fx.path(dir))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().into_string().expect("name"))
        .collect()
}

fn content(i: usize) -> Vec<u8> {
    format!("file {i}\n").repeat(i + 1).into_bytes()
}

#[test]
fn serves_a_workload_over_io_uring() {
    if skip_unless_root() {
        return;
    }
    let _lock = exclusive();
    let Some(_param) = EnableUring::set("Y") else {
        return;
    };
    let mut fx = Fixture::mounted("uring-workload");
    let served_by = transport(&fx);
    assert!(
        served_by.starts_with("io_uring (") && served_by.ends_with(" entries)"),
        "{served_by}\n{}",
        fx.daemon_log()
    );
    assert!(
        !fx.daemon_log().contains("/dev/fuse"),
        "{}",
        fx.daemon_log()
    );

    fs::create_dir(fx.path("d")).unwrap();
    for i in 0..40 {
        let mut f = File::create(fx.path(&format!("d/f{i}"))).unwrap();
        f.write_all(&content(i)).unwrap();
        if i % 8 == 0 {
            f.sync_all().unwrap();
        }
    }
    // Larger than one ring payload buffer holds a page of: a multi-page
    // write and read through the entries' payload buffers.
    let big: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut f = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(fx.path("big"))
        .unwrap();
    f.write_all(&big).unwrap();
    f.sync_all().unwrap();
    drop(f);
    File::open(fx.path("d")).unwrap().sync_all().unwrap();
    for i in (0..40).step_by(2) {
        fs::rename(fx.path(&format!("d/f{i}")), fx.path(&format!("d/r{i}"))).unwrap();
    }
    for i in (0..40).step_by(5) {
        let name = if i % 2 == 0 { "r" } else { "f" };
        fs::remove_file(fx.path(&format!("d/{name}{i}"))).unwrap();
    }
    let want: BTreeSet<String> = (0..40)
        .filter(|i| i % 5 != 0)
        .map(|i| format!("{}{i}", if i % 2 == 0 { "r" } else { "f" }))
        .collect();
    let check = |fx: &Fixture| {
        assert_eq!(names(fx, "d"), want);
        for name in &want {
            let i: usize = name[1..].parse().unwrap();
            assert_eq!(fs::read(fx.path(&format!("d/{name}"))).unwrap(), content(i));
        }
        assert!(fs::read(fx.path("big")).unwrap() == big, "big differs");
    };
    check(&fx);

    // The extended SETXATTR (fuser patch 0007) through a ring entry: a
    // setfacl by the owner outside the group clears set-group-ID.
    {
        use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
        use std::os::unix::process::CommandExt;
        const NOBODY: u32 = 65534;
        let sgid = fx.path("sgid");
        File::create(&sgid).unwrap();
        chown(&sgid, Some(NOBODY), Some(0)).unwrap();
        fs::set_permissions(&sgid, fs::Permissions::from_mode(0o2755)).unwrap();
        common::run_ok(
            std::process::Command::new("setfacl")
                .args(["-m", "u:root:r"])
                .arg(&sgid)
                .uid(NOBODY)
                .gid(NOBODY),
        );
        assert_eq!(fs::metadata(&sgid).unwrap().mode() & 0o7777, 0o755);
    }

    fx.unmount();
    fx.mount();
    assert!(transport(&fx).starts_with("io_uring ("));
    check(&fx);
    fx.unmount();
}

#[test]
fn falls_back_to_dev_fuse_when_the_parameter_is_off() {
    if skip_unless_root() {
        return;
    }
    let _lock = exclusive();
    let Some(_param) = EnableUring::set("N") else {
        return;
    };
    let mut fx = Fixture::mounted("uring-fallback");
    let served_by = transport(&fx);
    assert_eq!(
        served_by,
        format!("/dev/fuse (io_uring is off: {ENABLE_URING} is N)")
    );
    // The usual case (the kernel does not offer io_uring) is not worth a
    // line at every mount: `birch stats` says it.
    let log = fx.daemon_log();
    assert!(
        !log.contains("serving over /dev/fuse"),
        "daemon log:\n{log}"
    );
    fs::write(fx.path("a"), b"over /dev/fuse").unwrap();
    File::open(fx.path("a")).unwrap().sync_all().unwrap();
    assert_eq!(fs::read(fx.path("a")).unwrap(), b"over /dev/fuse");
    fx.unmount();

    // Asked for by name, /dev/fuse serves without a note.
    fx.options = vec!["transport=devfuse".into()];
    fx.mount();
    assert_eq!(transport(&fx), "/dev/fuse (transport=devfuse)");
    assert!(!fx.daemon_log().contains("serving over"));
    assert_eq!(fs::read(fx.path("a")).unwrap(), b"over /dev/fuse");
    fx.unmount();

    // io_uring demanded where there is none: no mount, and the reason.
    let out = birch(&[
        "mount",
        fx.image_str(),
        fx.mnt.to_str().unwrap(),
        "-o",
        "transport=uring",
    ]);
    assert!(!out.status.success(), "mounted without io_uring");
    let err = text(&out.stderr);
    assert!(
        err.contains("transport=uring: io_uring is off"),
        "stderr: {err}"
    );
    assert_eq!(mount_fstype(&fx.mnt), None);
}
