//! Subvolumes through a real mount (docs/SNAPSHOTS.md (g), step 10 of
//! (j)): `birch subvolume` and `birch property` against the daemon's
//! ioctls, `list` of an unmounted image, `subvol=` / `subvolid=` mounts
//! and the default subvolume, the read-only property, and who may do
//! what. Only names and directories are used inside subvolumes: file
//! data in subvolumes is routed by another step.
//!
//! Needs root and /dev/fuse (skips otherwise, fails with
//! BIRCH_REQUIRE_MOUNT=1).

mod common;

use common::{birch, run, skip_unless_root, text, Fixture, BIRCH};
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

const NOBODY: u32 = 65534;
/// Bits of an inode number inside its subvolume (docs/SNAPSHOTS.md (a)).
const INO_BITS: u32 = 40;

fn fixture(tag: &str) -> Fixture {
    let mut fx = Fixture::new(tag, "256M");
    fx.options = vec!["commit=0".into()];
    fx.mount();
    fx
}

fn ok(args: &[&str]) -> String {
    let out = birch(args);
    assert!(
        out.status.success(),
        "birch {args:?} failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs `birch args` expecting failure; returns its stderr.
fn fails(args: &[&str]) -> String {
    let out = birch(args);
    assert!(
        !out.status.success(),
        "birch {args:?} succeeded:\n{}",
        text(&out.stdout)
    );
    text(&out.stderr)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `birch args` as uid and gid `NOBODY`, no supplementary groups.
fn as_nobody(args: &[&str]) -> Output {
    run(Command::new("setpriv")
        .arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .arg("--clear-groups")
        .arg("--")
        .arg(BIRCH)
        .args(args))
}

/// `BTRFS_IOC_INO_LOOKUP` (`_IOWR(0x94, 18, 4096 bytes)`) on `dir`: the
/// tree id it answers, or the errno.
fn ino_lookup(dir: &Path, tree: u64, objectid: u64) -> Result<u64, i32> {
    let f = fs::File::open(dir).unwrap();
    let mut args = [0u8; 4096];
    args[..8].copy_from_slice(&tree.to_ne_bytes());
    args[8..16].copy_from_slice(&objectid.to_ne_bytes());
    // SAFETY: the kernel reads and writes the 4096 bytes the command
    // encodes, which `args` is.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), 0xd000_9412, args.as_mut_ptr()) };
    if rc == 0 {
        Ok(u64::from_ne_bytes(args[..8].try_into().unwrap()))
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

/// `(id, top level, path)` of every line of `birch subvolume list`.
fn listed(out: &str) -> Vec<(u64, u64, String)> {
    out.lines()
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            assert_eq!(
                (w[0], w[2], w[4], w[5], w[7]),
                ("ID", "gen", "top", "level", "path"),
                "{l}"
            );
            (
                w[1].parse().unwrap(),
                w[6].parse().unwrap(),
                w[8].to_string(),
            )
        })
        .collect()
}

#[test]
fn subvolume_create_list_show() {
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("subvol-create");
    let mnt = fx.mnt.clone();
    let a = fx.path("a");
    assert_eq!(
        ok(&["subvolume", "create", s(&a)]),
        format!("Create subvolume '{}/a'\n", mnt.display())
    );
    fs::create_dir(fx.path("d")).unwrap();
    ok(&["subvolume", "create", s(&fx.path("d/b"))]);
    ok(&["subvolume", "create", s(&fx.path("a/c"))]);
    ok(&["subvolume", "create", "-p", s(&fx.path("e/f/g"))]);
    let expected = vec![
        (256, 5, "a".to_string()),
        (257, 5, "d/b".to_string()),
        (258, 256, "a/c".to_string()),
        (259, 5, "e/f/g".to_string()),
    ];
    let mounted = ok(&["subvolume", "list", s(&mnt)]);
    assert_eq!(listed(&mounted), expected, "{mounted}");

    // A subvolume is a directory whose inode numbers carry its id.
    let meta = fs::metadata(&a).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.ino(), 256 << INO_BITS | 256);
    fs::create_dir(a.join("inner")).unwrap();
    assert_eq!(
        fs::metadata(a.join("inner")).unwrap().ino() >> INO_BITS,
        256
    );
    let mut names: Vec<String> = fs::read_dir(&a)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["c", "inner"]);

    // btrfs-progs' extra columns, in its order.
    let line = ok(&["subvolume", "list", "-p", "-c", "-u", "-q", s(&mnt)]);
    let first = line.lines().next().unwrap();
    assert!(
        first.starts_with("ID 256 gen ") && first.contains(" cgen "),
        "{first}"
    );
    let words: Vec<&str> = first.split(' ').collect();
    let at = |w: &str| words.iter().position(|x| *x == w).unwrap();
    assert!(at("cgen") < at("parent") && at("parent") < at("top"));
    assert!(at("parent_uuid") < at("uuid") && at("uuid") < at("path"));
    assert_eq!(words[at("parent_uuid") + 1], "-");

    let show = ok(&["subvolume", "show", s(&fx.path("a/c"))]);
    assert!(show.starts_with("a/c\n"), "{show}");
    for field in [
        "\tName: \t\t\tc\n",
        "\tSubvolume ID: \t\t258\n",
        "\tParent ID: \t\t256\n",
    ] {
        assert!(show.contains(field), "{field:?} in:\n{show}");
    }

    // Bad input, each with a message naming what is wrong.
    assert!(fails(&["subvolume", "create", s(&a)]).contains("target path already exists"));
    let outside = fx.scratch.path("not-birch");
    fs::create_dir(&outside).unwrap();
    let err = fails(&["subvolume", "create", s(&outside.join("x"))]);
    assert!(err.contains("not a birch mount"), "{err}");
    let err = fails(&["subvolume", "show", s(&fx.path("d"))]);
    assert!(err.contains("not a subvolume"), "{err}");
    let err = fails(&["subvolume", "create", s(&fx.path("missing/x"))]);
    assert!(err.contains("cannot access"), "{err}");
    // INO_LOOKUP of a tree id or inode number past their fields would
    // alias subvolume 256's root in the external number.
    for (tree, objectid, errno) in [
        ((1u64 << 24) + 256, 256u64, libc::ENOENT),
        (256, (1 << 40) + 256, libc::EINVAL),
    ] {
        assert_eq!(
            ino_lookup(&mnt, tree, objectid),
            Err(errno),
            "{tree} {objectid}"
        );
    }
    assert_eq!(ino_lookup(&a, 0, 256), Ok(256));

    fx.unmount();
    // The same list from the image, without a mount.
    let unmounted = ok(&["subvolume", "list", fx.image_str()]);
    assert_eq!(listed(&unmounted), expected, "{unmounted}");
    fx.mount();
    assert!(fx.path("a/inner").is_dir());
    assert!(fx.path("a/c").is_dir());
}

#[test]
fn subvolume_default_and_subvol_mounts() {
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("subvol-default");
    let mnt = fx.mnt.clone();
    ok(&["subvolume", "create", s(&fx.path("a"))]);
    fs::create_dir(fx.path("a/in-a")).unwrap();
    fs::create_dir(fx.path("d")).unwrap();
    ok(&["subvolume", "create", s(&fx.path("d/b"))]);
    fs::create_dir(fx.path("d/b/in-b")).unwrap();
    assert_eq!(
        ok(&["subvolume", "get-default", s(&mnt)]),
        "ID 5 (FS_TREE)\n"
    );
    ok(&["subvolume", "set-default", "256", s(&mnt)]);
    let shown = ok(&["subvolume", "get-default", s(&mnt)]);
    assert!(
        shown.starts_with("ID 256 gen ") && shown.ends_with(" top level 5 path a\n"),
        "{shown}"
    );
    let err = fails(&["subvolume", "set-default", "4000", s(&mnt)]);
    assert!(err.contains("subvolume 4000 not found"), "{err}");

    // Without subvol= the default subvolume is the mount's root.
    fx.unmount();
    fx.mount();
    assert!(fx.path("in-a").is_dir());
    assert!(!fx.path("d").exists());
    assert_eq!(
        fs::metadata(&mnt).unwrap().ino(),
        1,
        "node id 1 is the root"
    );
    fx.unmount();

    fx.options = vec!["commit=0".into(), "subvol=d/b".into()];
    fx.mount();
    assert!(fx.path("in-b").is_dir());
    fs::create_dir(fx.path("made-through-subvol-mount")).unwrap();
    fx.unmount();

    fx.options = vec!["commit=0".into(), "subvolid=5".into()];
    fx.mount();
    assert!(fx.path("d/b/made-through-subvol-mount").is_dir());
    // set-default PATH: the subvolume at PATH; 0 is the top level.
    ok(&["subvolume", "set-default", s(&fx.path("d/b"))]);
    assert!(ok(&["subvolume", "get-default", s(&mnt)]).ends_with("path d/b\n"));
    ok(&["subvolume", "set-default", "0", s(&mnt)]);
    assert_eq!(
        ok(&["subvolume", "get-default", s(&mnt)]),
        "ID 5 (FS_TREE)\n"
    );
    fx.unmount();

    for (option, message) in [
        ("subvol=d", "subvol=d: not a subvolume"),
        ("subvol=nope", "subvol=nope: nope"),
        ("subvolid=99", "subvolid=99: no such subvolume"),
        ("subvolid=x", "-o subvolid=x: expected a subvolume id"),
        (
            "subvol=a,subvolid=5",
            "subvol=a is subvolume 256, but subvolid=5",
        ),
    ] {
        let err = fails(&["mount", fx.image_str(), s(&mnt), "-o", option]);
        assert!(err.contains(message), "-o {option}: {err}");
        assert!(!fx.is_mounted());
    }
}

#[test]
fn subvolume_readonly_property_refuses_changes() {
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("subvol-ro");
    let a = fx.path("a");
    ok(&["subvolume", "create", s(&a)]);
    fs::create_dir(a.join("before")).unwrap();
    assert_eq!(ok(&["property", "get", s(&a), "ro"]), "ro=false\n");
    ok(&["property", "set", s(&a), "ro", "true"]);
    assert_eq!(ok(&["property", "get", s(&a)]), "ro=true\n");
    let erofs = |r: std::io::Result<()>| {
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
    };
    erofs(fs::create_dir(a.join("new")));
    erofs(fs::create_dir(a.join("before/new")));
    erofs(fs::File::create(a.join("f")).map(drop));
    let err = fails(&["subvolume", "create", s(&a.join("sub"))]);
    assert!(err.contains("read-only"), "{err}");
    // The top level stays writable; the list marks it.
    fs::create_dir(fx.path("top-ok")).unwrap();
    let ro_only = ok(&["subvolume", "list", "-r", s(&fx.mnt)]);
    assert_eq!(listed(&ro_only), vec![(256, 5, "a".to_string())]);

    // Durable: property set commits.
    fx.unmount();
    fx.mount();
    assert_eq!(ok(&["property", "get", s(&a), "ro"]), "ro=true\n");
    erofs(fs::create_dir(a.join("new")));
    ok(&["property", "set", s(&a), "ro", "false"]);
    fs::create_dir(a.join("new")).unwrap();

    let err = fails(&["property", "get", s(&a.join("before")), "ro"]);
    assert!(err.contains("not a subvolume"), "{err}");
    let err = fails(&["property", "set", s(&a), "compression", "zstd"]);
    assert!(err.contains("unknown property: compression"), "{err}");
    let err = fails(&["property", "set", s(&a), "ro", "maybe"]);
    assert!(
        err.contains("invalid value for property ro: maybe"),
        "{err}"
    );
}

/// Who may do what (docs/SNAPSHOTS.md (g)): create needs write and search
/// permission on the parent, as mkdir; the default needs root (or the
/// mount's owner); the read-only flag its subvolume's owner; list, show
/// and get-default anyone.
#[test]
fn subvolume_unprivileged_caller_refused() {
    if skip_unless_root() {
        return;
    }
    let fx = fixture("subvol-perm");
    let mnt = fx.mnt.clone();
    fs::set_permissions(&mnt, fs::Permissions::from_mode(0o755)).unwrap();
    ok(&["subvolume", "create", s(&fx.path("roots"))]);
    let open = fx.path("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();

    let refused = |args: &[&str], message: &str| {
        let out = as_nobody(args);
        assert!(!out.status.success(), "{args:?} succeeded as nobody");
        let err = text(&out.stderr);
        assert!(err.contains(message), "{args:?}: {err}");
    };
    refused(
        &["subvolume", "create", s(&fx.path("theirs"))],
        "permission denied",
    );
    refused(
        &["subvolume", "set-default", "256", s(&mnt)],
        "permission denied",
    );
    refused(
        &["property", "set", s(&fx.path("roots")), "ro", "true"],
        "permission denied",
    );
    assert_eq!(ok(&["property", "get", s(&fx.path("roots"))]), "ro=false\n");

    // Anyone may read; a writable directory takes anyone's subvolume,
    // owned by its creator, who may then make it read-only.
    let out = as_nobody(&["subvolume", "list", s(&mnt)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(listed(&text(&out.stdout)).len(), 1);
    let out = as_nobody(&["subvolume", "create", s(&open.join("mine"))]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let meta = fs::metadata(open.join("mine")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (NOBODY, NOBODY));
    let out = as_nobody(&["property", "set", s(&open.join("mine")), "ro", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(ok(&["property", "get", s(&open.join("mine"))]), "ro=true\n");
    let out = as_nobody(&["subvolume", "get-default", s(&mnt)]);
    assert_eq!(text(&out.stdout), "ID 5 (FS_TREE)\n");
}
