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

/// A mount whose requests carry every caller's ids (`-o noidmap`, the
/// default, said here because the tests of what a user may do depend on
/// it: with `-o idmap` a subvolume ioctl names no caller and birch lets
/// only administrators through, which `mount_idmap` tests).
fn fixture_with_user_ids(tag: &str) -> Fixture {
    let mut fx = Fixture::new(tag, "256M");
    fx.options = vec!["commit=0".into(), "noidmap".into()];
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

/// `subvolume show -r ID` and `-u UUID`, as btrfs-progs: the subvolume
/// selected on the filesystem PATH names (any path of a mount, or an
/// unmounted image), the top level by id 5; an unknown id or uuid, a
/// malformed uuid and both options at once are refused with a message
/// naming what is wrong.
#[test]
fn subvolume_show_by_rootid_and_uuid() {
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("subvol-show-select");
    let mnt = fx.mnt.clone();
    ok(&["subvolume", "create", s(&fx.path("a"))]);
    ok(&["subvolume", "create", s(&fx.path("a/c"))]);
    fs::create_dir(fx.path("d")).unwrap();
    let line = ok(&["subvolume", "list", "-u", s(&mnt)])
        .lines()
        .find(|l| l.ends_with(" path a/c"))
        .unwrap()
        .to_string();
    let words: Vec<&str> = line.split(' ').collect();
    let c_uuid = words[words.iter().position(|w| *w == "uuid").unwrap() + 1].to_string();
    let by_path = ok(&["subvolume", "show", s(&fx.path("a/c"))]);
    // From any path of the mount, by id or by uuid: the same subvolume.
    let c_id = words[1];
    let by_id = ok(&["subvolume", "show", "-r", c_id, s(&fx.path("d"))]);
    let by_uuid = ok(&["subvolume", "show", "--uuid", &c_uuid, s(&mnt)]);
    assert_eq!(by_id, by_path);
    assert_eq!(by_uuid, by_path);
    assert!(
        by_id.contains(&format!("\tUUID: \t\t\t{c_uuid}\n")),
        "{by_id}"
    );
    let top = ok(&["subvolume", "show", "--rootid", "5", s(&fx.path("a"))]);
    assert!(
        top.starts_with("/\n") && top.contains("\tName: \t\t\t<FS_TREE>\n"),
        "{top}"
    );

    // Bad input.
    let err = fails(&["subvolume", "show", "-r", "999", s(&mnt)]);
    assert!(err.contains("can't find rootid '999'"), "{err}");
    let unknown = "01234567-89ab-cdef-0123-456789abcdef";
    let err = fails(&["subvolume", "show", "-u", unknown, s(&mnt)]);
    assert!(
        err.contains(&format!("can't find uuid '{unknown}'")),
        "{err}"
    );
    for bad in [
        "nonsense",
        "0123456789abcdef0123456789abcdef",
        "0123456g-89ab-cdef-0123-456789abcdef",
        "+1234567-89ab-cdef-0123-456789abcdef",
    ] {
        let err = fails(&["subvolume", "show", "-u", bad, s(&mnt)]);
        assert!(err.contains(&format!("invalid UUID: '{bad}'")), "{err}");
    }
    let err = fails(&["subvolume", "show", "-r", "x", s(&mnt)]);
    assert!(err.contains("'x'") && err.contains("--rootid"), "{err}");
    let err = fails(&["subvolume", "show", "-r", c_id, "-u", &c_uuid, s(&mnt)]);
    assert!(err.contains("cannot be used with"), "{err}");

    // The same from the unmounted image.
    fx.unmount();
    let image = fx.image_str().to_string();
    let field = |out: &str, name: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("\t{name}:")))
            .unwrap_or_else(|| panic!("{name} in {out}"))
            .to_string()
    };
    let from_image = ok(&["subvolume", "show", "-u", &c_uuid, &image]);
    assert!(from_image.starts_with("a/c\n"), "{from_image}");
    for name in ["Subvolume ID", "UUID", "Parent ID", "Name"] {
        assert_eq!(field(&from_image, name), field(&by_path, name));
    }
    let err = fails(&["subvolume", "show", "-r", "999", &image]);
    assert!(err.contains("can't find rootid '999'"), "{err}");
    fx.mount();
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
    let err = fails(&["property", "set", s(&a), "label", "x"]);
    assert!(err.contains("unknown property: label"), "{err}");
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
    let fx = fixture_with_user_ids("subvol-perm");
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
        "permission denied (EACCES)",
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

/// `len` bytes that differ for each `seed`.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// The names in `dir`, sorted (what `ls` shows).
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[track_caller]
fn assert_erofs<T: std::fmt::Debug>(r: std::io::Result<T>) {
    assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
}

/// Free blocks of the filesystem at `p` (statvfs `f_bfree`, in `f_frsize`
/// units).
fn free_blocks(p: &Path) -> u64 {
    let c = std::ffi::CString::new(s(p)).unwrap();
    // SAFETY: statvfs fills the zeroed struct it is given.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bfree
}

/// Snapshots of the top level and of a subvolume holding files with data
/// (docs/SNAPSHOTS.md (c), (g)): each reads back identical to its source;
/// later changes on either side do not reach the other; `-r` makes one
/// that refuses every change with EROFS; what is wrong is named.
#[test]
fn subvolume_snapshot_copies_data_and_keeps_it_apart() {
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("subvol-snapshot");
    let mnt = fx.mnt.clone();
    let top_file = pattern(300_000, 1);
    fs::write(fx.path("top"), &top_file).unwrap();
    fs::create_dir(fx.path("d")).unwrap();
    fs::write(fx.path("d/small"), b"inline").unwrap();
    let sv = fx.path("sv");
    ok(&["subvolume", "create", s(&sv)]);
    let (big, small) = (pattern(1 << 20, 2), pattern(5000, 3));
    fs::write(sv.join("big"), &big).unwrap();
    fs::write(sv.join("small"), &small).unwrap();
    fs::create_dir(sv.join("dir")).unwrap();

    // The top level, into itself: the nested subvolume is left out.
    assert_eq!(
        ok(&["subvolume", "snapshot", s(&mnt), s(&fx.path("top-snap"))]),
        format!(
            "Create a snapshot of '{}' in '{}/top-snap'\n",
            mnt.display(),
            mnt.display()
        )
    );
    assert_eq!(names(&fx.path("top-snap")), ["d", "top"]);
    assert!(fs::read(fx.path("top-snap/top")).unwrap() == top_file);
    assert_eq!(fs::read(fx.path("top-snap/d/small")).unwrap(), b"inline");
    let meta = fs::metadata(fx.path("top-snap")).unwrap();
    assert_eq!(meta.ino(), 257 << INO_BITS | 256, "a subvolume's root");

    // A subvolume, into an existing directory: under the source's name.
    fs::create_dir(fx.path("snaps")).unwrap();
    assert_eq!(
        ok(&["subvolume", "snapshot", s(&sv), s(&fx.path("snaps"))]),
        format!(
            "Create a snapshot of '{}' in '{}/snaps/sv'\n",
            sv.display(),
            mnt.display()
        )
    );
    let snap = fx.path("snaps/sv");
    assert_eq!(names(&snap), ["big", "dir", "small"]);
    assert!(fs::read(snap.join("big")).unwrap() == big);
    assert!(fs::read(snap.join("small")).unwrap() == small);

    // Changes on either side stay there.
    fs::write(sv.join("big"), pattern(1 << 20, 4)).unwrap();
    fs::remove_file(sv.join("small")).unwrap();
    fs::write(snap.join("only-in-snap"), b"x").unwrap();
    assert!(fs::read(snap.join("big")).unwrap() == big);
    assert!(fs::read(snap.join("small")).unwrap() == small);
    assert!(!sv.join("only-in-snap").exists());
    fs::write(fx.path("top"), b"changed").unwrap();
    assert!(fs::read(fx.path("top-snap/top")).unwrap() == top_file);

    // Read-only: every change refused, reads as the source.
    let ro = fx.path("ro");
    assert_eq!(
        ok(&["subvolume", "snapshot", "-r", s(&snap), s(&ro)]),
        format!(
            "Create a readonly snapshot of '{}' in '{}/ro'\n",
            snap.display(),
            mnt.display()
        )
    );
    assert!(fs::read(ro.join("big")).unwrap() == big);
    assert_eq!(ok(&["property", "get", s(&ro), "ro"]), "ro=true\n");
    // The open itself succeeds in the no-open mode (the kernel sends no
    // OPEN); the write is refused.
    assert_erofs(
        fs::OpenOptions::new()
            .write(true)
            .open(ro.join("big"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"x")),
    );
    assert_erofs(fs::File::create(ro.join("big")));
    assert_erofs(fs::File::create(ro.join("new")));
    assert_erofs(fs::create_dir(ro.join("dir/new")));
    assert_erofs(fs::remove_file(ro.join("small")));
    let err = fails(&["subvolume", "snapshot", s(&sv), s(&ro.join("in-ro"))]);
    assert!(err.contains("read-only"), "{err}");
    // A snapshot of the read-only one is writable.
    ok(&["subvolume", "snapshot", s(&ro), s(&fx.path("rw"))]);
    fs::write(fx.path("rw/new"), b"ok").unwrap();

    // The list knows them as snapshots (a parent uuid).
    let snapshots = ok(&["subvolume", "list", "-s", s(&mnt)]);
    let paths: Vec<&str> = snapshots
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(paths, ["top-snap", "snaps/sv", "ro", "rw"], "{snapshots}");

    // What is wrong, named.
    let err = fails(&["subvolume", "snapshot", s(&fx.path("d")), s(&fx.path("x"))]);
    assert!(
        err.contains(&format!("not a subvolume: {}", fx.path("d").display())),
        "{err}"
    );
    let err = fails(&["subvolume", "snapshot", s(&sv), s(&fx.path("snaps"))]);
    assert!(err.contains("target path already exists"), "{err}");
    let err = fails(&["subvolume", "snapshot", s(&sv), s(&fx.path("top"))]);
    assert!(err.contains("exists and it is not a directory"), "{err}");
    let err = fails(&["subvolume", "snapshot", s(&sv), s(&fx.path("missing/x"))]);
    assert!(err.contains("cannot access"), "{err}");

    // Durable: a snapshot commits before the command returns.
    fx.unmount();
    fx.assert_clean();
    fx.mount();
    assert!(fs::read(fx.path("snaps/sv/big")).unwrap() == big);
    assert!(fs::read(fx.path("top-snap/top")).unwrap() == top_file);
    assert_erofs(fs::File::create(ro.join("new")));
}

/// `subvolume delete` (docs/SNAPSHOTS.md (d)): the name vanishes at once
/// from what the kernel shows (its cached dentry is invalidated); after a
/// remount it stays gone, the deleted tree is reported by check as a
/// deletion in progress, and once the cleaner is done (`subvolume sync`)
/// the snapshot's own blocks are free again.
#[test]
fn subvolume_delete_removes_the_name_and_frees_the_space() {
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("subvol-delete");
    let mnt = fx.mnt.clone();
    let sv = fx.path("sv");
    ok(&["subvolume", "create", s(&sv)]);
    let data = pattern(4 << 20, 5);
    fs::write(sv.join("f"), &data).unwrap();
    fx.sync();
    ok(&["subvolume", "snapshot", s(&sv), s(&fx.path("s"))]);
    // The snapshot's own 8 MiB: its copy of f rewritten, and a new file.
    fs::write(fx.path("s/f"), pattern(4 << 20, 6)).unwrap();
    fs::write(fx.path("s/g"), pattern(4 << 20, 7)).unwrap();
    fx.sync();
    let before = free_blocks(&mnt);
    // The kernel has the name and its inode cached.
    assert_eq!(names(&mnt), ["s", "sv"]);
    assert!(fx.path("s/f").is_file());

    let s_path = fx.path("s");
    assert_eq!(
        ok(&["subvolume", "delete", s(&s_path)]),
        format!("Delete subvolume 257 (no-commit): '{}/s'\n", mnt.display())
    );
    assert_eq!(names(&mnt), ["sv"]);
    assert_eq!(
        fs::symlink_metadata(&s_path).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    assert!(
        fs::read(sv.join("f")).unwrap() == data,
        "the source is intact"
    );
    fx.sync();

    // Gone after a remount; the drop is a deletion in progress, not a fault
    // (commit=0: no background worker ran the cleaner).
    fx.unmount();
    let report = fx.check().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        report.contains("deleted subvolume 257: being dropped"),
        "{report}"
    );
    fx.mount();
    assert_eq!(names(&mnt), ["sv"]);
    ok(&["subvolume", "sync", s(&mnt)]);
    // What the cleaner freed is pinned until two commits are durable.
    fx.sync();
    fx.sync();
    let after = free_blocks(&mnt);
    let freed = after.saturating_sub(before) * 4096;
    assert!(
        freed >= 8 << 20,
        "{freed} bytes freed by the deletion of 8 MiB ({before} -> {after} free blocks)"
    );
    assert!(fs::read(sv.join("f")).unwrap() == data);
    let listed = ok(&["subvolume", "list", s(&mnt)]);
    assert_eq!(listed.lines().count(), 1, "{listed}");
}

/// What delete refuses, as btrfs: a subvolume holding other subvolumes
/// (ENOTEMPTY), the default subvolume (EPERM), one in a read-only parent
/// (EROFS), a directory that is no subvolume; -C commits each, and one
/// refused path does not stop the others.
#[test]
fn subvolume_delete_refuses_what_btrfs_refuses() {
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("subvol-delete-refused");
    let mnt = fx.mnt.clone();
    let a = fx.path("a");
    ok(&["subvolume", "create", s(&a)]);
    ok(&["subvolume", "create", s(&a.join("inner"))]);
    let err = fails(&["subvolume", "delete", s(&a)]);
    assert!(
        err.contains(&format!(
            "cannot delete '{}': it holds other subvolumes",
            a.display()
        )),
        "{err}"
    );
    ok(&["subvolume", "set-default", s(&a.join("inner"))]);
    let err = fails(&["subvolume", "delete", s(&a.join("inner"))]);
    assert!(err.contains("it is the default subvolume"), "{err}");
    ok(&["subvolume", "set-default", "0", s(&mnt)]);
    ok(&["property", "set", s(&a), "ro", "true"]);
    let err = fails(&["subvolume", "delete", s(&a.join("inner"))]);
    assert!(err.contains("read-only"), "{err}");
    ok(&["property", "set", s(&a), "ro", "false"]);
    fs::create_dir(fx.path("plain")).unwrap();
    let err = fails(&["subvolume", "delete", s(&fx.path("plain"))]);
    assert!(
        err.contains(&format!("not a subvolume: {}", fx.path("plain").display())),
        "{err}"
    );
    assert!(fails(&["subvolume", "delete", s(&fx.path("nope"))]).contains("cannot access"));
    assert!(fx.path("a/inner").is_dir() && fx.path("plain").is_dir());

    // -C: each deletion committed; the refused middle path is reported
    // and the last is still deleted.
    ok(&["subvolume", "create", s(&fx.path("b"))]);
    let out = birch(&[
        "subvolume",
        "delete",
        "-C",
        s(&a.join("inner")),
        s(&fx.path("plain")),
        s(&fx.path("b")),
    ]);
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stdout),
        format!(
            "Delete subvolume 257 (commit): '{}/inner'\n\
             Delete subvolume 258 (commit): '{}/b'\n",
            a.display(),
            mnt.display()
        )
    );
    assert!(text(&out.stderr).contains("not a subvolume"));
    assert_eq!(names(&mnt), ["a", "plain"]);
    ok(&["subvolume", "delete", "-c", s(&a)]);
    assert_eq!(names(&mnt), ["plain"]);
    // Committed: a power cut now keeps them deleted.
    fx.power_cut();
    fx.mount();
    assert_eq!(names(&mnt), ["plain"]);
    ok(&["subvolume", "sync", s(&mnt)]);
}

/// Who may snapshot and delete (docs/SNAPSHOTS.md (g), as btrfs): a
/// snapshot needs write and search permission on the destination and
/// ownership of the source subvolume (root may always); delete needs root
/// or the mount's owner (btrfs without `user_subvol_rm_allowed`).
#[test]
fn subvolume_snapshot_and_delete_unprivileged_refused() {
    if skip_unless_root() {
        return;
    }
    let fx = fixture_with_user_ids("subvol-snap-perm");
    let mnt = fx.mnt.clone();
    fs::set_permissions(&mnt, fs::Permissions::from_mode(0o755)).unwrap();
    let roots = fx.path("roots");
    ok(&["subvolume", "create", s(&roots)]);
    let open = fx.path("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let refused = |args: &[&str], message: &str| {
        let out = as_nobody(args);
        assert!(!out.status.success(), "{args:?} succeeded as nobody");
        let err = text(&out.stderr);
        assert!(err.contains(message), "{args:?}: {err}");
    };
    // Root's subvolumes, even into a directory anyone may write.
    refused(
        &["subvolume", "snapshot", s(&roots), s(&open.join("x"))],
        "permission denied",
    );
    refused(
        &["subvolume", "snapshot", s(&mnt), s(&open.join("y"))],
        "permission denied",
    );
    // Its own subvolume: into a writable directory, not into root's.
    let out = as_nobody(&["subvolume", "create", s(&open.join("mine"))]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = as_nobody(&[
        "subvolume",
        "snapshot",
        s(&open.join("mine")),
        s(&open.join("mine-snap")),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let meta = fs::metadata(open.join("mine-snap")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (NOBODY, NOBODY));
    refused(
        &[
            "subvolume",
            "snapshot",
            s(&open.join("mine")),
            s(&fx.path("z")),
        ],
        "permission denied",
    );
    // Delete: root only, even of its own subvolume.
    refused(
        &["subvolume", "delete", s(&open.join("mine-snap"))],
        "permission denied (EPERM)",
    );
    assert!(open.join("mine-snap").is_dir());
    ok(&["subvolume", "delete", s(&open.join("mine-snap"))]);
    assert_eq!(names(&open), ["mine"]);
}

/// `-o user_subvol_rm_allowed` (docs/FUSE.md, "Who may send which
/// ioctl"; btrfs's `btrfs_ioctl_snap_destroy`): a user may delete a
/// subvolume whose root directory and parent directory it may write and
/// search, and in a sticky parent only one it or the parent's owner owns.
#[test]
fn subvolume_delete_user_subvol_rm_allowed() {
    if skip_unless_root() {
        return;
    }
    let mut fx = Fixture::new("subvol-user-rm", "256M");
    fx.options = vec![
        "commit=0".into(),
        "user_subvol_rm_allowed".into(),
        // User checks need the caller's ids (`fixture_with_user_ids`).
        "noidmap".into(),
    ];
    fx.mount();
    let mnt = fx.mnt.clone();
    fs::set_permissions(&mnt, fs::Permissions::from_mode(0o755)).unwrap();
    let open = fx.path("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let sticky = fx.path("sticky");
    fs::create_dir(&sticky).unwrap();
    fs::set_permissions(&sticky, fs::Permissions::from_mode(0o1777)).unwrap();
    let refused = |args: &[&str], message: &str| {
        let out = as_nobody(args);
        assert!(!out.status.success(), "{args:?} succeeded as nobody");
        let err = text(&out.stderr);
        assert!(err.contains(message), "{args:?}: {err}");
    };
    let allowed = |args: &[&str]| {
        let out = as_nobody(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    };

    // Its own subvolume, in a directory it may write: deleted.
    allowed(&["subvolume", "create", s(&open.join("mine"))]);
    allowed(&["subvolume", "delete", s(&open.join("mine"))]);
    assert!(names(&open).is_empty());
    // Root's subvolume (root directory 0755): no write permission on it.
    ok(&["subvolume", "create", s(&open.join("roots"))]);
    refused(
        &["subvolume", "delete", s(&open.join("roots"))],
        "permission denied (EACCES)",
    );
    // Its own subvolume in root's directory: no write permission there.
    let given = fx.path("given");
    ok(&["subvolume", "create", s(&given)]);
    std::os::unix::fs::chown(&given, Some(NOBODY), Some(NOBODY)).unwrap();
    refused(
        &["subvolume", "delete", s(&given)],
        "permission denied (EACCES)",
    );
    // A sticky directory: root's subvolume, even one anyone may write,
    // is not nobody's to delete; its own is.
    ok(&["subvolume", "create", s(&sticky.join("roots"))]);
    fs::set_permissions(sticky.join("roots"), fs::Permissions::from_mode(0o777)).unwrap();
    refused(
        &["subvolume", "delete", s(&sticky.join("roots"))],
        "permission denied (EPERM)",
    );
    allowed(&["subvolume", "create", s(&sticky.join("mine"))]);
    allowed(&["subvolume", "delete", s(&sticky.join("mine"))]);
    assert_eq!(names(&open), ["roots"]);
    assert_eq!(names(&sticky), ["roots"]);
    assert!(given.is_dir());
    // A name that is not a subvolume: EINVAL, as for root.
    fs::create_dir(open.join("plain")).unwrap();
    refused(
        &["subvolume", "delete", s(&open.join("plain"))],
        "not a subvolume",
    );
    ok(&["subvolume", "sync", s(&mnt)]);
}

/// `mv` of a subvolume (docs/SNAPSHOTS.md (g), "Renaming a subvolume
/// link", as btrfs): renamed and moved to another directory of its parent
/// subvolume and into another subvolume, keeping its contents and id,
/// listed at its new path; a plain file into another subvolume is EXDEV,
/// the link over a non-empty directory ENOTEMPTY; renameat2's
/// RENAME_EXCHANGE swaps it with a file of its parent subvolume and with
/// a link in another subvolume; the names survive a power cut after the
/// commit.
#[test]
fn subvolume_rename_moves_the_link() {
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("subvol-rename");
    let mnt = fx.mnt.clone();
    ok(&["subvolume", "create", s(&fx.path("sv"))]);
    ok(&["subvolume", "create", s(&fx.path("other"))]);
    fs::write(fx.path("sv/f"), b"kept").unwrap();
    fs::create_dir(fx.path("d")).unwrap();
    fs::create_dir_all(fx.path("full/x")).unwrap();
    let ino = fs::metadata(fx.path("sv")).unwrap().ino();

    fs::rename(fx.path("sv"), fx.path("sw")).unwrap();
    fs::rename(fx.path("sw"), fx.path("d/moved")).unwrap();
    assert_eq!(fs::metadata(fx.path("d/moved")).unwrap().ino(), ino);
    assert_eq!(fs::read(fx.path("d/moved/f")).unwrap(), b"kept");
    assert_eq!(names(&mnt), ["d", "full", "other"]);
    let errno = |r: std::io::Result<()>| r.unwrap_err().raw_os_error();
    assert_eq!(
        errno(fs::rename(fx.path("d/moved"), fx.path("full"))),
        Some(libc::ENOTEMPTY)
    );
    fs::write(fx.path("plain"), b"p").unwrap();
    assert_eq!(
        errno(fs::rename(fx.path("plain"), fx.path("other/plain"))),
        Some(libc::EXDEV)
    );
    fs::rename(fx.path("d/moved"), fx.path("other/m")).unwrap();
    assert_eq!(fs::metadata(fx.path("other/m")).unwrap().ino(), ino);
    assert_eq!(fs::read(fx.path("other/m/f")).unwrap(), b"kept");
    let paths = || -> Vec<String> {
        listed(&ok(&["subvolume", "list", s(&mnt)]))
            .into_iter()
            .map(|(_, _, path)| path)
            .collect()
    };
    assert_eq!(paths(), ["other/m", "other"]);
    // Exchanged with a file of its parent subvolume, then with a link of
    // another subvolume (`top`, whose link is in the top level).
    fs::write(fx.path("other/file"), b"file").unwrap();
    renameat2_exchange(&fx.path("other/m"), &fx.path("other/file")).unwrap();
    assert_eq!(fs::read(fx.path("other/file/f")).unwrap(), b"kept");
    assert_eq!(fs::read(fx.path("other/m")).unwrap(), b"file");
    ok(&["subvolume", "create", s(&fx.path("top"))]);
    fs::write(fx.path("top/t"), b"top").unwrap();
    renameat2_exchange(&fx.path("other/file"), &fx.path("top")).unwrap();
    assert_eq!(fs::read(fx.path("top/f")).unwrap(), b"kept");
    assert_eq!(fs::read(fx.path("other/file/t")).unwrap(), b"top");
    assert_eq!(
        renameat2_exchange(&fx.path("other/m"), &fx.path("top"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EXDEV)
    );
    assert_eq!(paths(), ["top", "other", "other/file"]);
    fx.sync();
    fx.power_cut();
    fx.mount();
    assert_eq!(fs::read(fx.path("top/f")).unwrap(), b"kept");
    assert_eq!(fs::read(fx.path("other/file/t")).unwrap(), b"top");
    assert!(!fx.path("sv").exists() && !fx.path("d/moved").exists());
}

/// renameat2(from, to, RENAME_EXCHANGE).
fn renameat2_exchange(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let (from, to) = (c(from), c(to));
    // SAFETY: two valid C strings, AT_FDCWD for both directories.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A subvolume deleted while a file in it is open keeps that file usable
/// until it is closed, as btrfs (docs/SNAPSHOTS.md (d) step 3): reads,
/// writes, fstat and fsync through the descriptor work while the path is
/// gone; `subvolume sync` waits for the close (the daemon made the kernel
/// drop the file's entry, so the close ends the kernel's hold), then the
/// cleaner drops the tree and its space comes back; `birch check` is
/// clean after the unmount, with no deleted subvolume left.
#[test]
fn subvolume_delete_keeps_open_files_usable() {
    use std::os::unix::fs::FileExt;
    if skip_unless_root() {
        return;
    }
    let mut fx = fixture("subvol-delete-open");
    let mnt = fx.mnt.clone();
    let sv = fx.path("sv");
    ok(&["subvolume", "create", s(&sv)]);
    let data = pattern(4 << 20, 9);
    fs::write(sv.join("f"), &data).unwrap();
    fs::create_dir(sv.join("d")).unwrap();
    fs::write(sv.join("d/g"), pattern(1 << 20, 3)).unwrap();
    fx.sync();
    let before = free_blocks(&mnt);
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(sv.join("f"))
        .unwrap();
    ok(&["subvolume", "delete", s(&sv)]);
    assert_eq!(
        fs::symlink_metadata(&sv).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    let mut read = vec![0; data.len()];
    file.read_exact_at(&mut read, 0).unwrap();
    assert!(read == data, "the open file reads its data");
    file.write_all_at(b"written after the delete", 4096)
        .unwrap();
    file.sync_all().unwrap();
    let mut back = [0u8; 24];
    file.read_exact_at(&mut back, 4096).unwrap();
    assert_eq!(&back, b"written after the delete");
    assert_eq!(file.metadata().unwrap().len(), data.len() as u64);

    // `subvolume sync` waits while the file is open, and returns after
    // the close.
    let mut sync = Command::new(BIRCH)
        .args(["subvolume", "sync", s(&mnt)])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let waiting = sync.try_wait().unwrap();
    drop(file);
    let status = match waiting {
        Some(status) => status,
        None => wait_at_most(&mut sync, 60),
    };
    assert!(status.success(), "subvolume sync: {status}");
    assert!(
        waiting.is_none(),
        "subvolume sync returned while f was open"
    );
    // What the cleaner freed is pinned until two commits are durable.
    fx.sync();
    fx.sync();
    let after = free_blocks(&mnt);
    let freed = after.saturating_sub(before) * 4096;
    assert!(
        freed >= 5 << 20,
        "{freed} bytes freed by the deletion of 5 MiB ({before} -> {after} free blocks)"
    );
    fx.unmount();
    let report = fx.check().unwrap_or_else(|e| panic!("{e}"));
    assert!(!report.contains("deleted subvolume"), "{report}");
}

/// Waits for `child`, killing it after `seconds` (a hung test would
/// otherwise keep the mount busy).
fn wait_at_most(child: &mut std::process::Child, seconds: u64) -> std::process::ExitStatus {
    for _ in 0..seconds * 10 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    panic!("still running after {seconds} s");
}

/// `property set ro false` on a received subvolume is refused unless
/// forced; with -f the subvolume becomes writable and its received uuid
/// goes (btrfs-progs' rule: incremental receives match that uuid).
#[test]
fn property_set_rw_of_a_received_subvolume_needs_force() {
    if skip_unless_root() {
        return;
    }
    let fx = fixture("subvol-received");
    let a = fx.path("a");
    ok(&["subvolume", "create", s(&a)]);
    // What `birch receive` does at END: BTRFS_IOC_SET_RECEIVED_SUBVOL.
    let mut args = vec![0u8; birch_fuse::subvol::BTRFS_RECEIVED_SUBVOL_ARGS_SIZE];
    args[..16].copy_from_slice(&[0x5a; 16]);
    args[16..24].copy_from_slice(&7u64.to_ne_bytes());
    let dir = fs::File::open(&a).unwrap();
    // SAFETY: `args` is as long as the command's size.
    let rc = unsafe {
        libc::ioctl(
            dir.as_raw_fd(),
            birch_fuse::subvol::BTRFS_IOC_SET_RECEIVED_SUBVOL as libc::c_ulong,
            args.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    ok(&["property", "set", s(&a), "ro", "true"]);
    let received = |fx: &Fixture| {
        ok(&["subvolume", "show", s(&fx.path("a"))])
            .lines()
            .find(|l| l.contains("Received UUID"))
            .map(|l| l.split_whitespace().last().unwrap_or("").to_string())
            .unwrap()
    };
    assert_eq!(received(&fx), "5a5a5a5a-5a5a-5a5a-5a5a-5a5a5a5a5a5a");

    let err = fails(&["property", "set", s(&a), "ro", "false"]);
    assert!(err.contains("received_uuid") && err.contains("-f"), "{err}");
    assert_eq!(ok(&["property", "get", s(&a), "ro"]), "ro=true\n");
    assert_eq!(received(&fx), "5a5a5a5a-5a5a-5a5a-5a5a-5a5a5a5a5a5a");

    ok(&["property", "set", "-f", s(&a), "ro", "false"]);
    assert_eq!(ok(&["property", "get", s(&a), "ro"]), "ro=false\n");
    assert_eq!(received(&fx), "-");
    fs::create_dir(a.join("writable")).unwrap();
}
