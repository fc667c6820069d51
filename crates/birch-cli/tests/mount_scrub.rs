//! `birch scrub MOUNTPOINT`: the daemon scrubs the mounted filesystem's
//! durable commit (docs/DUP.md, "Scrub"). The damage is written underneath
//! the live mount, through the device the daemon reads (the loop device of
//! a fuseblk mount, else the image) with O_DIRECT, so that no page cache
//! stands between the damage and the daemon.
//!
//! Run: `cargo test -p birch-cli --test mount_scrub` as root.

mod common;

use birch::device::{BlockDevice, FileDevice};
use birch::fs::read_superblock;
use common::{birch, exclusive, skip_unless_root, stats_json, text, Fixture};
use std::fs;
use std::path::PathBuf;

const BLOCK: usize = 4096;

/// File data whose every 4 KiB block starts with a marker naming it, so
/// the block can be found on the device.
fn marked(tag: &str, blocks: usize) -> Vec<u8> {
    let mut data = Vec::with_capacity(blocks * BLOCK);
    for i in 0..blocks {
        let mut block = format!("{tag}-block-{i:04}-").into_bytes();
        block.resize(BLOCK, b'a' + (i % 26) as u8);
        data.extend_from_slice(&block);
    }
    data
}

/// The device the daemon of `fx` reads: its loop device, or the image.
fn daemon_device(fx: &Fixture) -> FileDevice {
    let stats = stats_json(&fx.mnt);
    let path = stats
        .get("block_device")
        .and_then(|d| d.as_str())
        .map_or_else(|| fx.image.clone(), PathBuf::from);
    FileDevice::open(&path, true)
        .unwrap_or_else(|e| panic!("open {} with O_DIRECT: {e}", path.display()))
}

/// Where the block starting with `marker` lies on `dev`.
fn find_block(dev: &FileDevice, marker: &[u8]) -> u64 {
    const CHUNK: usize = 1 << 20;
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0;
    while at < dev.size_bytes() {
        let len = CHUNK.min((dev.size_bytes() - at) as usize);
        dev.read_at(&mut buf[..len], at).unwrap();
        if let Some(i) = buf[..len]
            .chunks(BLOCK)
            .position(|block| block.starts_with(marker))
        {
            return at + (i * BLOCK) as u64;
        }
        at += len as u64;
    }
    panic!("no block starts with {:?}", String::from_utf8_lossy(marker));
}

/// `birch scrub MNT`: exit code and stdout.
fn scrub(fx: &Fixture) -> (i32, String) {
    let out = birch(&["scrub", fx.mnt.to_str().unwrap()]);
    assert!(
        out.stderr.is_empty(),
        "scrub wrote to stderr (not a terminal: no progress): {}",
        text(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text(&out.stdout))
}

fn counter(fx: &Fixture, name: &str) -> u64 {
    stats_json(&fx.mnt)
        .get(name)
        .and_then(|v| v.as_u64())
        .unwrap_or_else(|| panic!("no counter {name} in birch stats --json"))
}

/// A clean mount scrubs clean (exit 0), and the scrub counters show what
/// it read.
#[test]
fn scrub_of_a_clean_mount_exits_0() {
    if skip_unless_root() {
        return;
    }
    let _one_at_a_time = exclusive();
    let fx = Fixture::mounted("scrub-clean");
    fs::create_dir(fx.path("dir")).unwrap();
    fs::write(fx.path("dir/f"), marked("clean", 8)).unwrap();
    fx.sync();
    let (code, out) = scrub(&fx);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("0 repaired, 0 unrepaired")
            && out.contains("scrubbed 1 data extents: 8 blocks verified, 0 bad"),
        "{out}"
    );
    assert!(counter(&fx, "scrub_nodes") > 0);
    assert_eq!(counter(&fx, "scrub_data_bytes"), (8 * BLOCK) as u64);
}

/// One bad copy of a committed node and one bad data block, damaged under
/// the live mount: the scrub repairs the node, names the data block by
/// path and offset, exits 1; a second scrub finds the metadata clean and
/// the data block still bad; after unmounting, check finds the metadata
/// clean.
#[test]
fn scrub_of_a_mount_repairs_a_node_and_names_a_bad_data_block() {
    if skip_unless_root() {
        return;
    }
    let _one_at_a_time = exclusive();
    let mut fx = Fixture::mounted("scrub-damage");
    fs::create_dir(fx.path("dir")).unwrap();
    fs::write(fx.path("dir/victim"), marked("victim", 8)).unwrap();
    fs::write(fx.path("other"), marked("other", 4)).unwrap();
    fx.sync();

    let dev = daemon_device(&fx);
    let sb = read_superblock(&dev).unwrap();
    let node = sb.root_tree_bytenr;
    let mirror = sb
        .metadata_profile
        .mirror_of(node)
        .expect("a dup image (the default)");
    let mut good = vec![0u8; 16384];
    dev.read_at(&mut good, node).unwrap();
    let mut damaged = good.clone();
    for byte in &mut damaged[200..264] {
        *byte ^= 0xa5;
    }
    dev.write_at(&damaged, node).unwrap();
    let data_block = find_block(&dev, b"victim-block-0003-");
    let mut block = vec![0u8; BLOCK];
    dev.read_at(&mut block, data_block).unwrap();
    block[100] ^= 0xff;
    dev.write_at(&block, data_block).unwrap();
    dev.flush().unwrap();

    let (code, out) = scrub(&fx);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "repaired: block {node} of tree root(1): primary copy at {node}"
        )) && out.contains("1 repaired, 1 unrepaired"),
        "{out}"
    );
    assert!(
        out.contains(&format!("unrepaired: data block {data_block}: checksum"))
            && out.contains("/dir/victim offset 12288")
            && out.contains("1 bad (not repairable: one copy)"),
        "{out}"
    );
    let mut now = vec![0u8; 16384];
    dev.read_at(&mut now, node).unwrap();
    assert!(now == good, "the primary copy was not rewritten");
    dev.read_at(&mut now, mirror).unwrap();
    assert!(now == good, "the mirror copy changed");

    let (code, out) = scrub(&fx);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("0 repaired, 1 unrepaired")
            && out.contains(&format!("unrepaired: data block {data_block}: checksum")),
        "{out}"
    );
    fx.unmount();
    fx.assert_clean();
}

/// `birch subvolume ARGS...`, which must succeed.
fn subvolume(args: &[&str]) {
    let mut all = vec!["subvolume"];
    all.extend_from_slice(args);
    let out = birch(&all);
    assert!(out.status.success(), "birch {all:?}: {}", text(&out.stderr));
}

/// A mount with a subvolume and a read-only snapshot of it scrubs clean
/// (every subvolume's root item is read: before, their long form was
/// reported unrepaired and their trees left out, exit 1), each shared
/// node once; a bad data block the two share is named in both, by
/// subvolume id and path. The image scrubs the same way unmounted.
#[test]
fn scrub_of_a_mount_with_snapshots_covers_every_subvolume() {
    if skip_unless_root() {
        return;
    }
    let _one_at_a_time = exclusive();
    let mut fx = Fixture::mounted("scrub-snapshots");
    let (sv, snap) = (fx.path("sv"), fx.path("snap"));
    subvolume(&["create", sv.to_str().unwrap()]);
    for i in 0..60 {
        fs::write(sv.join(format!("file-{i:03}")), marked(&format!("f{i}"), 1)).unwrap();
    }
    fs::write(sv.join("shared"), marked("shared", 4)).unwrap();
    fx.sync();
    subvolume(&[
        "snapshot",
        "-r",
        sv.to_str().unwrap(),
        snap.to_str().unwrap(),
    ]);
    let (code, out) = scrub(&fx);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("0 repaired, 0 unrepaired"), "{out}");
    assert!(
        out.contains("scrubbed 61 data extents: 64 blocks verified, 0 bad"),
        "each shared data extent once: {out}"
    );

    let dev = daemon_device(&fx);
    let data_block = find_block(&dev, b"shared-block-0002-");
    let mut block = vec![0u8; BLOCK];
    dev.read_at(&mut block, data_block).unwrap();
    block[100] ^= 0xff;
    dev.write_at(&block, data_block).unwrap();
    dev.flush().unwrap();
    // Closed, so that the loop device lets go of the image at the unmount.
    drop(dev);
    let (code, out) = scrub(&fx);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("unrepaired: data block {data_block}: checksum"))
            && out.contains("subvolume 256 /shared offset 8192")
            && out.contains("subvolume 257 /shared offset 8192")
            && out.contains("0 repaired, 1 unrepaired"),
        "{out}"
    );
    fx.unmount();
    let out = birch(&["scrub", fx.image_str()]);
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}{}", text(&out.stderr));
    assert!(
        report.contains("0 repaired, 1 unrepaired")
            && report.contains("subvolume 257 /shared offset 8192"),
        "{report}{}",
        text(&out.stderr)
    );
    fx.assert_clean();
}
