//! `-o compress=zstd` through a real mount (docs/COMPRESSION.md): a
//! compressible and an incompressible file written, synced, read back
//! after a remount; `du`'s blocks show what compression saved; `chattr
//! +c` on a directory compresses what is created in it; many small
//! text files go inline compressed and take less space than without the
//! option; `birch check` (at drop), `birch check --verify-data` and
//! `birch scrub` of the image are clean.
//!
//! Run: `cargo test -p birch-cli --test mount_compress` as root
//! (BIRCH_REQUIRE_MOUNT=1 makes a missing mount a failure).

mod common;

use common::{birch, exclusive, skip_unless_root, stats_json, text, Fixture};
use std::fs;
use std::os::unix::fs::MetadataExt;

const MIB: usize = 1 << 20;

/// Log-like text: compresses to a fraction.
fn compressible(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 64);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(
            format!(
                "2026-11-28 05:{:02}:{:02} birch: commit {i} wrote {} nodes\n",
                i % 60,
                i % 7,
                i % 13
            )
            .as_bytes(),
        );
        i += 1;
    }
    out.truncate(len);
    out
}

/// xorshift bytes: do not compress.
fn incompressible(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn counter(fx: &Fixture, name: &str) -> u64 {
    stats_json(&fx.mnt)
        .get(name)
        .and_then(|v| v.as_u64())
        .unwrap_or_else(|| panic!("no counter {name} in birch stats --json"))
}

#[test]
fn compress_zstd_shrinks_text_keeps_noise_and_reads_back_after_remount() {
    if skip_unless_root() {
        return;
    }
    let _serial = exclusive();
    let mut fx = Fixture::new("compress", "256M");
    fx.options = vec!["compress=zstd".into()];
    fx.mount();
    let text_data = compressible(8 * MIB);
    let noise_data = incompressible(8 * MIB);
    fs::write(fx.path("text"), &text_data).unwrap();
    fs::write(fx.path("noise"), &noise_data).unwrap();
    let out = birch(&["sync", fx.mnt.to_str().unwrap()]);
    assert!(out.status.success(), "birch sync: {}", text(&out.stderr));
    let bytes_in = counter(&fx, "compressed_bytes_in");
    let bytes_out = counter(&fx, "compressed_bytes_out");
    assert!(bytes_in >= 8 * MIB as u64, "compressed_bytes_in {bytes_in}");
    assert!(bytes_out < bytes_in / 4, "{bytes_out} of {bytes_in}");
    assert!(counter(&fx, "compress_attempts_failed") > 0);
    fx.unmount();

    // Remounted without the option: reading needs none.
    fx.options.clear();
    fx.mount();
    assert!(
        fs::read(fx.path("text")).unwrap() == text_data,
        "text differs"
    );
    assert!(
        fs::read(fx.path("noise")).unwrap() == noise_data,
        "noise differs"
    );
    let text_blocks = fs::metadata(fx.path("text")).unwrap().blocks();
    let noise_blocks = fs::metadata(fx.path("noise")).unwrap().blocks();
    assert!(
        text_blocks * 512 < (text_data.len() / 4) as u64,
        "du of the compressible file: {text_blocks} blocks of 512"
    );
    assert!(
        noise_blocks * 512 >= noise_data.len() as u64,
        "du of the incompressible file: {noise_blocks} blocks of 512"
    );
    let du = common::run_ok(
        std::process::Command::new("du")
            .arg("-k")
            .arg(fx.path("text")),
    );
    let du_kib: u64 = text(&du.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        du_kib * 1024 < (text_data.len() / 4) as u64,
        "du -k: {du_kib}"
    );
    // chattr +c on a directory of this mount (no compress= now): files
    // created in it inherit the flag and are compressed.
    fs::create_dir(fx.path("c")).unwrap();
    common::run_ok(
        std::process::Command::new("chattr")
            .arg("+c")
            .arg(fx.path("c")),
    );
    fs::write(fx.path("c/f"), &text_data).unwrap();
    let lsattr = common::run_ok(std::process::Command::new("lsattr").arg(fx.path("c/f")));
    let shown = text(&lsattr.stdout);
    assert!(
        shown.split_whitespace().next().unwrap().contains('c'),
        "lsattr: {shown}"
    );
    let out = birch(&["sync", fx.mnt.to_str().unwrap()]);
    assert!(out.status.success(), "birch sync: {}", text(&out.stderr));
    assert!(counter(&fx, "compressed_bytes_in") >= 8 * MIB as u64);
    assert!(
        fs::read(fx.path("c/f")).unwrap() == text_data,
        "c/f differs"
    );
    fx.unmount();

    let out = birch(&["scrub", fx.image_str()]);
    assert!(
        out.status.success(),
        "birch scrub: {}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // Every compressed extent decompresses to its recorded length, every
    // block matches its checksum (btrfs-progs' spelling is an alias).
    for flag in ["--verify-data", "--check-data-csum"] {
        let out = birch(&["check", flag, fx.image_str()]);
        let report = text(&out.stdout);
        assert!(
            out.status.success() && report.contains("result: clean"),
            "birch check {flag}: {report}{}",
            text(&out.stderr)
        );
        let decompressed: u64 = report
            .split("decompressed ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no data line: {report}"));
        assert!(decompressed > 0, "{report}");
    }
    let out = birch(&["dump", fx.image_str(), "super"]);
    assert!(
        text(&out.stdout).contains("compression on"),
        "{}",
        text(&out.stdout)
    );
}

/// Bytes the mounted filesystem uses (statvfs), after two syncs (space
/// freed by a commit is back after the next).
fn used_bytes(fx: &Fixture) -> u64 {
    fx.sync();
    fx.sync();
    let path = common::cstr(&fx.mnt);
    // SAFETY: a valid C string and a zeroed statvfs for the call to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statvfs: {}", std::io::Error::last_os_error());
    (st.f_blocks - st.f_bfree) * st.f_frsize
}

/// Many small text files (docs/COMPRESSION.md, "Compressed inline
/// extents"): under `-o compress=zstd` each goes inline compressed (a
/// file of 2 to 4 KiB takes no data block) and the space they take is
/// less than half of what `compress=no` takes; every file reads back
/// after a remount without the option; the image checks clean with
/// `--verify-data`, which decompresses each of them.
#[test]
fn small_text_files_go_inline_compressed_and_take_less_space() {
    if skip_unless_root() {
        return;
    }
    let _serial = exclusive();
    const FILES: usize = 1500;
    let content = |i: usize| {
        let mut data = compressible(2000 + (i * 37) % 2000);
        data.extend_from_slice(format!("file {i}\n").as_bytes());
        data
    };
    let mut used = Vec::new();
    for option in ["compress=no", "compress=zstd"] {
        let mut fx = Fixture::new("compress-inline", "256M");
        fx.options = vec![option.into()];
        fx.mount();
        let before = used_bytes(&fx);
        fs::create_dir(fx.path("d")).unwrap();
        for i in 0..FILES {
            fs::write(fx.path(&format!("d/{i}")), content(i)).unwrap();
        }
        let after = used_bytes(&fx);
        let inline = counter(&fx, "compressed_inline_extents");
        used.push((option, after - before));
        fx.unmount();
        fx.options.clear();
        fx.mount();
        for i in 0..FILES {
            assert!(
                fs::read(fx.path(&format!("d/{i}"))).unwrap() == content(i),
                "{option}: d/{i} differs"
            );
        }
        fx.unmount();
        match option {
            "compress=zstd" => assert_eq!(inline, FILES as u64, "{option}"),
            _ => assert_eq!(inline, 0, "{option}"),
        }
        let out = birch(&["check", "--verify-data", fx.image_str()]);
        let report = text(&out.stdout);
        assert!(
            out.status.success() && report.contains("result: clean"),
            "birch check --verify-data ({option}): {report}{}",
            text(&out.stderr)
        );
        if option == "compress=zstd" {
            assert!(
                report.contains(&format!("and {FILES} compressed inline extents")),
                "{report}"
            );
        }
    }
    eprintln!("space used by {FILES} small files: {used:?}");
    assert!(
        used[1].1 * 2 < used[0].1,
        "compress=zstd should take less than half: {used:?}"
    );
}

fn property(args: &[&str]) -> std::process::Output {
    let mut all = vec!["property"];
    all.extend_from_slice(args);
    birch(&all)
}

/// `birch property get PATH compression`'s output (empty without one).
fn compression_of(path: &std::path::Path) -> String {
    let out = property(&["get", path.to_str().unwrap(), "compression"]);
    assert!(out.status.success(), "property get: {}", text(&out.stderr));
    text(&out.stdout).trim().to_string()
}

/// The flags lsattr shows (`--------c--...`).
fn lsattr_flags(path: &std::path::Path) -> String {
    let out = common::run_ok(std::process::Command::new("lsattr").arg("-d").arg(path));
    text(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The compression property (docs/COMPRESSION.md, "The property") on a
/// `compress=zstd` mount: `property set` of lz4 on a directory (its `c`
/// flag set, inherited by a new file with the property, whose extents are
/// then lz4: the property beats the mount option); `none` on another
/// (`m`, inherited as the flag, its file stored uncompressed although the
/// mount says zstd); btrfs's `zlib` refused with a message naming what
/// birch takes; the xattr path (`setfattr -n btrfs.compression`, read
/// back by `property get` and `getfattr`); `""` removing it; and all of
/// it still there after a remount.
#[test]
fn compression_property_get_set_inherit_none_and_the_xattr() {
    if skip_unless_root() {
        return;
    }
    let _serial = exclusive();
    let mut fx = Fixture::new("compress-prop", "256M");
    fx.options = vec!["compress=zstd".into()];
    fx.mount();
    let data = compressible(2 * MIB);

    fs::create_dir(fx.path("fast")).unwrap();
    let out = property(&[
        "set",
        fx.path("fast").to_str().unwrap(),
        "compression",
        "lz4",
    ]);
    assert!(out.status.success(), "property set: {}", text(&out.stderr));
    assert_eq!(compression_of(&fx.path("fast")), "compression=lz4");
    assert!(lsattr_flags(&fx.path("fast")).contains('c'));
    fs::write(fx.path("fast/f"), &data).unwrap();
    assert_eq!(compression_of(&fx.path("fast/f")), "compression=lz4");

    fs::create_dir(fx.path("never")).unwrap();
    let out = property(&[
        "set",
        fx.path("never").to_str().unwrap(),
        "compression",
        "none",
    ]);
    assert!(
        out.status.success(),
        "property set none: {}",
        text(&out.stderr)
    );
    assert_eq!(compression_of(&fx.path("never")), "compression=none");
    let flags = lsattr_flags(&fx.path("never"));
    assert!(
        flags.contains('m') && !flags.contains('c'),
        "lsattr: {flags}"
    );
    fs::write(fx.path("never/g"), &data).unwrap();
    // `none` passes on as the flag, not as a property (btrfs's rule).
    assert_eq!(compression_of(&fx.path("never/g")), "");
    assert!(lsattr_flags(&fx.path("never/g")).contains('m'));

    let out = property(&[
        "set",
        fx.path("fast").to_str().unwrap(),
        "compression",
        "zlib",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("failed to set compression for")
            && err.contains("Invalid argument")
            && err.contains("zstd, lz4"),
        "{err}"
    );
    assert_eq!(compression_of(&fx.path("fast")), "compression=lz4");

    // The xattr path, as on btrfs.
    fs::write(fx.path("x"), b"x").unwrap();
    common::run_ok(
        std::process::Command::new("setfattr")
            .args(["-n", "btrfs.compression", "-v", "zstd"])
            .arg(fx.path("x")),
    );
    assert_eq!(compression_of(&fx.path("x")), "compression=zstd");
    let got = common::run_ok(
        std::process::Command::new("getfattr")
            .args(["--only-values", "-n", "btrfs.compression"])
            .arg(fx.path("x")),
    );
    assert_eq!(text(&got.stdout), "zstd");
    let out = property(&["set", fx.path("x").to_str().unwrap(), "compression", ""]);
    assert!(
        out.status.success(),
        "property set \"\": {}",
        text(&out.stderr)
    );
    assert_eq!(compression_of(&fx.path("x")), "");
    assert!(!lsattr_flags(&fx.path("x")).contains('c'));

    let out = birch(&["sync", fx.mnt.to_str().unwrap()]);
    assert!(out.status.success(), "birch sync: {}", text(&out.stderr));
    let never_blocks = fs::metadata(fx.path("never/g")).unwrap().blocks();
    assert!(
        never_blocks * 512 >= data.len() as u64,
        "never/g was compressed: {never_blocks} blocks of 512"
    );
    fx.unmount();

    let dump = birch(&["dump", fx.image_str(), "tree", "fs"]);
    let dumped = text(&dump.stdout);
    assert!(dumped.contains("extent compressed lz4"), "no lz4 extent");

    fx.mount();
    assert_eq!(compression_of(&fx.path("fast/f")), "compression=lz4");
    assert_eq!(compression_of(&fx.path("never")), "compression=none");
    assert!(lsattr_flags(&fx.path("never/g")).contains('m'));
    assert!(
        fs::read(fx.path("fast/f")).unwrap() == data,
        "fast/f differs"
    );
    fx.unmount();
}
