//! The `birch` binary end to end: exit codes, one-line errors, output.

use birch::check::fixture::corrupt_node;
use birch::check::{newest_valid_copy, read_superblock_copies, tree_roots};
use birch::device::FileDevice;
use birch::format::tree_id;
use birch::fs::{read_superblock, Filesystem, MountOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

fn birch(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_birch"))
        .args(args)
        .output()
        .expect("run birch")
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "birch-cli-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit code `code`, and stderr exactly one line (no panic, no backtrace).
fn assert_one_line_error(o: &Output, code: i32, contains: &[&str]) {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout: {}\nstderr: {err}",
        stdout(o)
    );
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    for c in contains {
        assert!(err.contains(c), "stderr lacks '{c}': {err}");
    }
}

fn mkfs(img: &str, size: &str) {
    let o = birch(&["mkfs", img, "--size", size]);
    assert!(o.status.success(), "mkfs failed: {}", stderr(&o));
}

fn fs_root_block(img: &str) -> u64 {
    let dev = FileDevice::open_read_only(Path::new(img)).unwrap();
    let copies = read_superblock_copies(&dev);
    let sb = newest_valid_copy(&copies)
        .unwrap()
        .superblock
        .clone()
        .unwrap();
    let (roots, problems) = tree_roots(&dev, &sb);
    assert!(problems.is_empty(), "{problems:?}");
    roots.iter().find(|r| r.tree == tree_id::FS).unwrap().bytenr
}

#[test]
fn mkfs_creates_a_sized_image_that_checks_clean() {
    let s = Scratch::new();
    let img = s.path("a.img");
    let o = birch(&["mkfs", &img, "--size", "32M"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("formatted"), "{}", stdout(&o));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 32 << 20);
    let o = birch(&["check", &img]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("result: clean"), "{}", stdout(&o));
    assert!(!stdout(&o).contains("data: read"), "{}", stdout(&o));
    // With the data (btrfs-progs' spelling too): pass `data` runs and
    // says what it read, here nothing.
    for flag in ["--verify-data", "--check-data-csum"] {
        let o = birch(&["check", flag, &img]);
        assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
        let out = stdout(&o);
        assert!(
            out.contains("data: read 0 extents (0 bytes), decompressed 0 compressed extents")
                && out.contains("  data            ok")
                && out.contains("result: clean"),
            "{out}"
        );
    }
}

#[test]
fn mkfs_default_size_is_one_gib() {
    let s = Scratch::new();
    let img = s.path("big.img");
    let o = birch(&["mkfs", &img]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 1 << 30);
}

#[test]
fn mkfs_refuses_to_overwrite_without_force() {
    let s = Scratch::new();
    let img = s.path("a.img");
    mkfs(&img, "16M");
    let o = birch(&["mkfs", &img]);
    assert_one_line_error(
        &o,
        1,
        &["already holds a birch filesystem", "--force", "65536"],
    );
    let o = birch(&["mkfs", &img, "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // One copy damaged is still a filesystem.
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[65536 + 8] ^= 0xff;
    std::fs::write(&img, &bytes).unwrap();
    let o = birch(&["mkfs", &img]);
    assert_one_line_error(&o, 1, &["already holds a birch filesystem", "262144"]);
}

/// A real ext4 image (mkfs.ext4 on a file): refused without --force,
/// naming what is there; with --force formatted, and no longer ext4 to
/// blkid (mkfs clears the old signatures).
#[test]
fn mkfs_refuses_to_overwrite_an_ext4_image_without_force() {
    let s = Scratch::new();
    let img = s.path("ext4.img");
    std::fs::write(&img, vec![0u8; 32 << 20]).unwrap();
    let made = Command::new("mkfs.ext4")
        .args(["-q", "-F", &img])
        .output()
        .expect("mkfs.ext4 (e2fsprogs) is needed for this test");
    assert!(made.status.success(), "mkfs.ext4: {}", stderr(&made));
    let o = birch(&["mkfs", &img]);
    assert_one_line_error(&o, 1, &["holds an ext4 filesystem", "--force"]);
    let o = birch(&["mkfs", &img, "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = birch(&["check", &img]);
    assert!(stdout(&o).contains("result: clean"), "{}", stdout(&o));
    // Formatted over, it is birch's: refused as birch, not as ext4.
    let o = birch(&["mkfs", &img]);
    assert_one_line_error(&o, 1, &["already holds a birch filesystem"]);
    if let Ok(probe) = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE", &img])
        .output()
    {
        assert_eq!(stdout(&probe).trim(), "", "blkid still finds a filesystem");
    }
}

#[test]
fn mkfs_uses_an_existing_file_size_and_rejects_a_conflicting_one() {
    let s = Scratch::new();
    let img = s.path("plain.img");
    std::fs::write(&img, vec![0u8; 20 << 20]).unwrap();
    let o = birch(&["mkfs", &img]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 20 << 20);
    let o = birch(&["mkfs", &img, "--force", "--size", "64M"]);
    assert_one_line_error(&o, 1, &["exists with 20971520 bytes"]);
    // An empty (touched) file is sized.
    let empty = s.path("empty.img");
    std::fs::write(&empty, b"").unwrap();
    let o = birch(&["mkfs", &empty, "-s", "16M"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 16 << 20);
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        vec!["mkfs", "x.img", "--size", "12Q"],
        vec!["mkfs", "x.img", "--size", "1M"],
        vec!["mkfs"],
        vec!["dump", "x.img", "tree", "bogus"],
        vec!["dump", "x.img", "block", "nope"],
        vec!["frobnicate"],
    ] {
        let o = birch(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("error:") && !stderr(&o).contains("panicked"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn check_exit_codes() {
    let s = Scratch::new();
    // Cannot read at all: 2, one line naming the path.
    let missing = s.path("missing.img");
    assert_one_line_error(&birch(&["check", &missing]), 2, &[&missing, "cannot open"]);
    let garbage = s.path("garbage.img");
    std::fs::write(&garbage, vec![0x5au8; 1 << 20]).unwrap();
    assert_one_line_error(
        &birch(&["check", &garbage]),
        2,
        &[&garbage, "no birch magic"],
    );
    let short = s.path("short.img");
    std::fs::write(&short, b"tiny").unwrap();
    assert_one_line_error(&birch(&["check", &short]), 2, &[&short, "device ends"]);

    // Faults: 1, with the report on stdout.
    let img = s.path("a.img");
    mkfs(&img, "16M");
    let root = fs_root_block(&img);
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[root as usize + 3000] ^= 1;
    std::fs::write(&img, &bytes).unwrap();
    let o = birch(&["check", &img]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains(&format!("corrupt node: tree=fs(5) block={root}"))
            && out.contains("checksum mismatch"),
        "{out}"
    );

    // Truncated: the superblocks survive, the trees do not.
    let trunc = s.path("trunc.img");
    std::fs::write(&trunc, &bytes[..600 * 1024]).unwrap();
    let o = birch(&["check", &trunc]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("truncated"), "{}", stdout(&o));
}

/// `birch mkfs --metadata`: dup by default, recorded in the superblock
/// and shown by `dump super`; `single` keeps one copy (docs/DUP.md).
#[test]
fn mkfs_metadata_profile_shows_in_dump_super() {
    let s = Scratch::new();
    for (i, (args, want)) in [
        (&[][..], "metadata dup mirror_offset 7864320"),
        (
            &["--metadata", "dup"][..],
            "metadata dup mirror_offset 7864320",
        ),
        (&["--metadata", "single"][..], "metadata single"),
    ]
    .into_iter()
    .enumerate()
    {
        let img = s.path(&format!("{i}.img"));
        let o = birch(&[&["mkfs", &img, "--size", "16M"][..], args].concat());
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let o = birch(&["dump", &img, "super"]);
        assert!(stdout(&o).contains(want), "{args:?}: {}", stdout(&o));
        let o = birch(&["check", &img]);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stdout(&o));
    }
}

/// `birch scrub IMAGE`: exit 0 on a clean (or repaired) image, 1 when a
/// node has no good copy left.
#[test]
fn scrub_repairs_a_damaged_copy_and_fails_on_two() {
    let s = Scratch::new();
    let img = s.path("s.img");
    mkfs(&img, "16M");
    let root = fs_root_block(&img);
    let mirror = root + 7864320;
    let damage = |at: u64| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(&[0x77; 64], at + 200).unwrap();
    };
    damage(root);
    let o = birch(&["scrub", &img]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains(&format!(
            "repaired: block {root} of tree fs(5): primary copy at {root}"
        )) && stdout(&o).contains("1 repaired, 0 unrepaired")
            && stdout(&o).contains("scrubbed 0 data extents: 0 blocks verified, 0 bad"),
        "{}",
        stdout(&o)
    );
    let o = birch(&["check", &img]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    damage(root);
    damage(mirror);
    let o = birch(&["scrub", &img]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains(&format!(
            "unrepaired: block {root} of tree fs(5): no good copy"
        )),
        "{}",
        stdout(&o)
    );
}

#[test]
fn dump_prints_super_trees_and_blocks() {
    let s = Scratch::new();
    let img = s.path("a.img");
    mkfs(&img, "16M");
    let o = birch(&["dump", &img]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for want in [
        "superblock at 65536 (current)",
        "superblock at 262144",
        "tree root(1)",
        "tree extent(2)",
        "tree fs(5)",
        "key (256 INODE_ITEM 0)",
        "mode 40755",
        "inode ref index 0 namelen 2 name: ..",
    ] {
        assert!(out.contains(want), "dump lacks '{want}':\n{out}");
    }
    let o = birch(&["dump", &img, "super"]);
    assert!(
        stdout(&o).contains("generation 1") && !stdout(&o).contains("tree "),
        "{}",
        stdout(&o)
    );
    for name in ["fs", "5", "fs(5)"] {
        let o = birch(&["dump", &img, "tree", name]);
        let out = stdout(&o);
        assert!(
            o.status.success() && out.starts_with("tree fs(5)") && !out.contains("tree extent"),
            "{name}: {out}"
        );
    }
    let root = fs_root_block(&img);
    for arg in [root.to_string(), format!("{root:#x}")] {
        let o = birch(&["dump", &img, "block", &arg]);
        assert!(
            o.status.success() && stdout(&o).starts_with(&format!("leaf {root} ")),
            "{}",
            stdout(&o)
        );
    }
    // A block that is not a node: its raw header on stdout, the reason on
    // stderr, and a failure.
    let o = birch(&["dump", &img, "block", "8388608"]);
    assert!(
        stdout(&o).starts_with("block 8388608: raw header"),
        "{}",
        stdout(&o)
    );
    assert_one_line_error(&o, 1, &["block 8388608 is not a node", "checksum mismatch"]);
    // Blocks that cannot be read at all: past the end, or no block number.
    for far in ["16777216", "18446744073709551615"] {
        let o = birch(&["dump", &img, "block", far]);
        assert_eq!(stdout(&o), "");
        assert_one_line_error(
            &o,
            1,
            &[&format!("block {far} is not a node"), "outside the device"],
        );
    }
    // A tree the filesystem does not have, and an unreadable image.
    assert_one_line_error(&birch(&["dump", &img, "tree", "log"]), 1, &["no tree log"]);
    let missing = s.path("missing.img");
    assert_one_line_error(&birch(&["dump", &missing]), 2, &[&missing]);
}

/// An image with three commits whose newest root tree root is damaged:
/// the superblock records two older commits.
fn image_with_damaged_newest_root(img: &str) {
    mkfs(img, "16M");
    let dev = FileDevice::open(Path::new(img), false).unwrap();
    let fs = Filesystem::open(dev, MountOptions::deterministic()).unwrap();
    for name in ["one", "two"] {
        fs.create(fs.root_ino(), name.as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.sync().unwrap();
    }
    fs.close().unwrap();
    let dev = FileDevice::open(Path::new(img), false).unwrap();
    let sb = read_superblock(&dev).unwrap();
    corrupt_node(&dev, sb.root_tree_bytenr);
}

#[test]
fn dump_super_lists_backup_roots() {
    let s = Scratch::new();
    let img = s.path("a.img");
    image_with_damaged_newest_root(&img);
    let out = stdout(&birch(&["dump", &img, "super"]));
    for want in [
        "backup_root 0: generation 3 root_tree_bytenr",
        "backup_root 1: generation 2 root_tree_bytenr",
        "backup_root 2: generation 1 root_tree_bytenr",
        "backup_root 3: empty",
    ] {
        assert!(out.contains(want), "dump lacks '{want}':\n{out}");
    }
}

#[test]
fn mount_of_an_unreadable_root_suggests_the_backup_root_rescue() {
    let s = Scratch::new();
    let img = s.path("a.img");
    let mnt = s.path("mnt");
    std::fs::create_dir(&mnt).unwrap();
    image_with_damaged_newest_root(&img);
    let o = birch(&["mount", &img, &mnt, "-f", "-o", "rescue=bogus"]);
    assert_one_line_error(&o, 1, &["rescue=bogus", "usebackuproot"]);
    let o = birch(&["mount", &img, &mnt, "-f"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("corrupt node: tree=root(1)")
            && err.contains("2 older commits as backup roots")
            && err.contains("-o rescue=usebackuproot"),
        "{err}"
    );
}

#[test]
fn mount_refuses_an_unknown_ablation_seed() {
    let s = Scratch::new();
    let img = s.path("a.img");
    let mnt = s.path("mnt");
    std::fs::create_dir(&mnt).unwrap();
    mkfs(&img, "64M");
    // Refused while the options are parsed: nothing is mounted.
    let o = birch(&["mount", &img, &mnt, "-f", "-o", "ablate=000+007"]);
    assert_one_line_error(
        &o,
        1,
        &["ablate=000+007", "'007'", "000, 001, 002, 003, 004"],
    );
    let o = birch(&["mount", &img, &mnt, "-f", "-o", "ablate="]);
    assert_one_line_error(&o, 1, &["ablate=", "unknown seed id ''"]);
}
