//! A device that fails writes under a live mount (docs/IO-ERRORS.md): the
//! image sits on a small tmpfs that fills up, so the image's writes fail
//! as a dying disk's would, through the whole stack the daemon uses (the
//! loop device of a `fuseblk` mount as root, or the file itself).
//!
//! The engine's own I/O-error tests (crates/birch/tests/io_errors.rs)
//! fail every write and flush of a commit and a log sync on a
//! `FaultyDevice`; this one checks what the operator of a mount sees: the
//! fsync that hit the fault fails, the mount turns read-only, the daemon
//! says why once on stderr, `birch stats` shows the reason, and what was
//! durable before is there at the next mount, which checks clean.
//!
//! A panic while serving a request (a bug) does the same without a fault
//! (`panic_in_a_request_turns_the_mount_read_only`): the request fails
//! with EIO and the mount keeps answering.
//!
//! Run: `cargo test -p birch-cli --test mount_failure` as root.

mod common;

use common::{cstr, errno, exclusive, skip_unless_root, stats_json, Fixture, Scratch};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// A tmpfs of a given size, unmounted on drop.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(dir: &Path, bytes: u64) -> Tmpfs {
        set_tmpfs_size(dir, bytes, false);
        Tmpfs {
            dir: dir.to_path_buf(),
        }
    }

    fn grow(&self, bytes: u64) {
        set_tmpfs_size(&self.dir, bytes, true);
    }
}

fn set_tmpfs_size(dir: &Path, bytes: u64, remount: bool) {
    let target = cstr(dir);
    let fstype = cstr(Path::new("tmpfs"));
    let data = cstr(Path::new(&format!("size={bytes}")));
    let flags = if remount { libc::MS_REMOUNT } else { 0 };
    // SAFETY: valid C strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    assert_eq!(
        rc,
        0,
        "mount tmpfs size={bytes} at {}: {}",
        dir.display(),
        std::io::Error::from_raw_os_error(errno())
    );
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let target = cstr(&self.dir);
        // SAFETY: a valid C string.
        if unsafe { libc::umount2(target.as_ptr(), 0) } != 0 {
            eprintln!(
                "umount {}: {}",
                self.dir.display(),
                std::io::Error::from_raw_os_error(errno())
            );
            // SAFETY: as above.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

const MIB: u64 = 1 << 20;

/// Writes 1 MiB chunks of `byte` to `path` until a write or the fsync
/// fails; returns the errno that stopped it.
fn write_until_failure(path: &Path, byte: u8) -> i32 {
    let mut file = File::create(path).expect("create the filler");
    let chunk = vec![byte; MIB as usize];
    for _ in 0..256 {
        if let Err(e) = file.write_all(&chunk).and_then(|()| file.sync_all()) {
            return e.raw_os_error().unwrap_or(0);
        }
    }
    panic!(
        "256 MiB written and fsynced to {} although the media was full",
        path.display()
    );
}

#[test]
fn failed_writes_turn_the_mount_read_only_and_say_why() {
    if skip_unless_root() {
        return;
    }
    let _one_at_a_time = exclusive();
    // Declared in this order so that they drop in the reverse one: the
    // birch mount and its check first, then the tmpfs under the image.
    let media_dir = Scratch::new("failure-media");
    let media: Tmpfs;
    let mut fx = Fixture::new("failure", "256M");
    let allocated = fs::metadata(&fx.image).expect("stat image").blocks() * 512;
    // Room for the image as mkfs left it and a few MiB more: the first
    // file fits, the filler does not.
    media = Tmpfs::mount(&media_dir.dir, allocated + 8 * MIB);
    let image = media.dir.join("image");
    let copied = std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(&fx.image)
        .arg(&image)
        .status()
        .expect("run cp");
    assert!(copied.success(), "cp of the image onto the tmpfs");
    fx.image = image;
    fx.mount();

    let durable = fx.path("durable");
    let content = vec![0x5a; 2 * MIB as usize];
    let mut file = File::create(&durable).expect("create durable");
    file.write_all(&content).expect("write durable");
    file.sync_all().expect("fsync durable");
    drop(file);

    let failed = write_until_failure(&fx.path("filler"), 0xa5);
    assert_eq!(
        failed,
        libc::EIO,
        "the write or fsync that met the full media"
    );

    let refused = fs::create_dir(fx.path("after")).map_err(|e| e.raw_os_error());
    assert_eq!(refused, Err(Some(libc::EROFS)), "mkdir after the failure");
    let mut append = OpenOptions::new()
        .append(true)
        .open(&durable)
        .expect("open durable for appending");
    let refused = append
        .write_all(b"more")
        .and_then(|()| append.sync_all())
        .map_err(|e| e.raw_os_error());
    assert!(
        matches!(refused, Err(Some(libc::EROFS | libc::EIO))),
        "append and fsync after the failure: {refused:?}"
    );
    drop(append);
    assert_eq!(
        fs::read(&durable).expect("read durable after the failure"),
        content,
        "a failed mount still serves what it holds"
    );

    let stats = stats_json(&fx.mnt);
    let reason = stats
        .get("failure")
        .and_then(|v| v.as_str())
        .unwrap_or_else(|| panic!("birch stats has no failure reason: {stats:?}"))
        .to_string();
    assert!(!reason.is_empty(), "empty failure reason");
    let log = fx.daemon_log();
    let reported: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("read-only from now on"))
        .collect();
    assert_eq!(
        reported.len(),
        1,
        "the daemon reports the failure exactly once:\n{log}"
    );
    assert!(
        reported[0].contains(&reason),
        "the daemon's line gives the reason {reason:?}: {}",
        reported[0]
    );

    // The daemon's last commit fails too; what the image holds is what a
    // power cut at the failure would have left.
    fx.unmount_after_failure();
    media.grow(allocated + 512 * MIB);
    fx.assert_clean();
    fx.mount();
    assert_eq!(
        fs::read(&durable).expect("read durable after the remount"),
        content,
        "what fsync made durable before the failure"
    );
    fs::create_dir(fx.path("after")).expect("the next mount is writable");
}

/// A request that panics inside birch (the debug-build hook
/// `BIRCH_TEST_PANIC_ON_CREATE`: a create of that name panics with the
/// state lock held) is answered EIO; the daemon says once that the mount
/// is read-only and why, `birch stats` shows it, the mount keeps serving
/// reads and refuses changes (EROFS) until unmounted, and the next mount
/// has what was durable. Before, the panic ended the FUSE event loop
/// ("event loop thread panicked") and every later call found the state
/// lock poisoned.
#[test]
fn panic_in_a_request_turns_the_mount_read_only() {
    if skip_unless_root() {
        return;
    }
    let _one_at_a_time = exclusive();
    let mut fx = Fixture::new("panic", "256M");
    // One request thread: a panic that ended it (as before) would end the
    // mount, not one of eight threads.
    fx.options = vec!["threads=1".into(), "transport=devfuse".into()];
    fx.daemon_env
        .push(("BIRCH_TEST_PANIC_ON_CREATE".into(), "boom".into()));
    fx.mount();
    let kept = fx.path("kept");
    let content = b"intact before the panic".to_vec();
    let mut file = File::create(&kept).expect("create kept");
    file.write_all(&content).expect("write kept");
    file.sync_all().expect("fsync kept");
    drop(file);

    let panicked = File::create(fx.path("boom")).map_err(|e| e.raw_os_error());
    assert_eq!(
        panicked.err(),
        Some(Some(libc::EIO)),
        "the create that panicked"
    );

    let listed: Vec<String> = fs::read_dir(&fx.mnt)
        .expect("list the mount after the panic")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(listed.contains(&"kept".to_string()), "{listed:?}");
    assert_eq!(fs::read(&kept).expect("read kept"), content);
    let refused = fs::create_dir(fx.path("after")).map_err(|e| e.raw_os_error());
    assert_eq!(refused, Err(Some(libc::EROFS)), "mkdir after the panic");
    let refused = File::create(fx.path("after-file")).map_err(|e| e.raw_os_error());
    assert_eq!(
        refused.err(),
        Some(Some(libc::EROFS)),
        "create after the panic"
    );

    let stats = stats_json(&fx.mnt);
    let reason = stats
        .get("failure")
        .and_then(|v| v.as_str())
        .unwrap_or_else(|| panic!("birch stats has no failure reason: {stats:?}"))
        .to_string();
    assert!(
        reason.contains("panicked inside birch") && reason.contains("CREATE request"),
        "{reason}"
    );
    let log = fx.daemon_log();
    let reported: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("read-only from now on"))
        .collect();
    assert_eq!(reported.len(), 1, "reported once:\n{log}");
    assert!(reported[0].contains(&reason), "{}", reported[0]);
    assert!(!log.contains("poisoned"), "{log}");

    fx.unmount_after_failure();
    fx.assert_clean();
    fx.daemon_env.clear();
    fx.mount();
    assert_eq!(
        fs::read(&kept).expect("read kept after the remount"),
        content
    );
    assert!(
        !fx.path("boom").exists(),
        "the create that panicked left nothing"
    );
    fs::create_dir(fx.path("after")).expect("the next mount is writable");
}

/// Reads the node at `bytenr` of the image.
fn read_node(image: &File, bytenr: u64, fsid: &[u8; 16]) -> (Vec<u8>, birch::format::Node) {
    let mut bytes = vec![0u8; birch::format::NODE_SIZE];
    image.read_exact_at(&mut bytes, bytenr).expect("read node");
    let node = birch::format::Node::decode(&bytes, bytenr, fsid).expect("decode node");
    (bytes, node)
}

/// Sets the offset of the last DIR_INDEX key of directory `dir` to
/// `offset` in the image's fs tree, resealing the leaf and its DUP mirror.
fn set_last_dir_index(path: &Path, dir: u64, offset: u64) {
    use birch::format::{item_type, tree_id, NodeBody, RootItem};
    let image = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open image");
    let dev = birch::device::FileDevice::open(path, false).expect("open image as a device");
    let sb = birch::fs::read_superblock(&dev).expect("superblock");
    let find = |bytenr: u64, pred: &dyn Fn(&birch::format::Key) -> bool| -> (u64, usize, Vec<u8>) {
        let mut at = bytenr;
        loop {
            let (_, node) = read_node(&image, at, &sb.fsid);
            match node.body {
                NodeBody::Leaf(items) => {
                    let slot = items
                        .iter()
                        .rposition(|i| pred(&i.key))
                        .expect("the item is in the leaf");
                    return (at, slot, items[slot].data.clone());
                }
                // Small trees: the last child whose key is not past the item.
                NodeBody::Internal(ptrs) => {
                    at = ptrs
                        .iter()
                        .rfind(|p| p.key.objectid <= dir)
                        .unwrap_or(&ptrs[0])
                        .blockptr
                }
            }
        }
    };
    let (_, _, fs_root) = find(sb.root_tree_bytenr, &|k| {
        k.objectid == tree_id::FS && k.item_type == item_type::ROOT_ITEM
    });
    let fs_root = RootItem::decode(&fs_root).expect("fs root item").bytenr;
    let (leaf, slot, _) = find(fs_root, &|k| {
        k.objectid == dir && k.item_type == item_type::DIR_INDEX
    });
    let (mut bytes, _) = read_node(&image, leaf, &sb.fsid);
    let key_offset = 64 + slot * 25 + 9;
    bytes[key_offset..key_offset + 8].copy_from_slice(&offset.to_le_bytes());
    let crc = crc32c(&bytes[4..]);
    bytes[0..4].copy_from_slice(&crc.to_le_bytes());
    let copies = std::iter::once(leaf).chain(sb.metadata_profile.mirror_of(leaf));
    for at in copies {
        image
            .write_all_at(&bytes, at)
            .expect("write the crafted leaf");
    }
    image.sync_all().expect("sync image");
}

/// crc32c (Castagnoli), bit by bit: what birch seals nodes with.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A directory whose last DIR_INDEX is 2^64 - 1 (a crafted image): a
/// create in it is EOVERFLOW, and the mount goes on serving and taking
/// changes elsewhere. Before, that create panicked in the daemon
/// (`peek_dir_index`: `k.offset + 1`), which left the state lock poisoned.
#[test]
fn directory_with_no_index_left_refuses_create_and_keeps_serving() {
    if skip_unless_root() {
        return;
    }
    let _one_at_a_time = exclusive();
    let mut fx = Fixture::new("dir-index", "256M");
    // The crafted index disagrees with its INODE_REF: check faults it.
    fx.check_at_drop = false;
    fx.mount();
    fs::create_dir(fx.path("d")).expect("mkdir d");
    File::create(fx.path("d/f")).expect("create d/f");
    let dir = fs::metadata(fx.path("d")).expect("stat d").ino();
    fx.unmount();
    set_last_dir_index(&fx.image, dir, u64::MAX);
    fx.mount();

    let refused = File::create(fx.path("d/new")).map_err(|e| e.raw_os_error());
    assert_eq!(refused.err(), Some(Some(libc::EOVERFLOW)), "create in d");
    let refused = fs::create_dir(fx.path("d/sub")).map_err(|e| e.raw_os_error());
    assert_eq!(refused, Err(Some(libc::EOVERFLOW)), "mkdir in d");
    let mut file = File::create(fx.path("elsewhere")).expect("create elsewhere");
    file.write_all(b"served").expect("write elsewhere");
    file.sync_all().expect("fsync elsewhere");
    drop(file);
    assert!(fx.path("d/f").exists(), "d/f is still there");
    let stats = stats_json(&fx.mnt);
    assert!(
        matches!(stats.get("failure"), Some(common::json::Value::Null)),
        "the mount did not fail: {stats:?}"
    );
    fx.unmount();
    fx.mount();
    assert_eq!(
        fs::read(fx.path("elsewhere")).expect("read elsewhere"),
        b"served"
    );
    fx.unmount();
}
