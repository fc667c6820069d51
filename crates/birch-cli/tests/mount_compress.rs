//! `-o compress=zstd` through a real mount (docs/COMPRESSION.md): a
//! compressible and an incompressible file written, synced, read back
//! after a remount; `du`'s blocks show what compression saved; `chattr
//! +c` on a directory compresses what is created in it; `birch
//! check` (at drop) and `birch scrub` of the image are clean.
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
    let out = birch(&["dump", fx.image_str(), "super"]);
    assert!(
        text(&out.stdout).contains("compression on"),
        "{}",
        text(&out.stdout)
    );
}
