//! A panic inside an engine operation (a bug) fails the filesystem as an
//! I/O error does (docs/IO-ERRORS.md, "Panics"): the state lock it
//! poisoned is recovered, changes are EROFS, reads go on, nothing more is
//! written, and the next mount finds what was durable before.
//!
//! The panic comes from the debug-build hook `BIRCH_TEST_PANIC_ON_CREATE`
//! (a create of the name it gives panics with the state lock held). The
//! variable is read once per process: this test binary holds this one
//! test, which sets it before any create.

use birch::device::MemoryDevice;
use birch::fs::{Filesystem, MkfsOptions, MountOptions};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

#[test]
fn panic_in_an_operation_turns_the_filesystem_read_only() {
    std::env::set_var("BIRCH_TEST_PANIC_ON_CREATE", "boom");
    let dev = Arc::new(MemoryDevice::new(32 << 20));
    Filesystem::mkfs(dev.as_ref(), &MkfsOptions::default()).unwrap();
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let root = fs.root_ino();
    let kept = fs.create(root, b"kept", 0o644, 0, 0).unwrap().ino;
    fs.write_file(kept, 0, b"intact").unwrap();
    fs.sync().unwrap();
    let logged = fs.create(root, b"logged", 0o644, 0, 0).unwrap().ino;
    fs.fsync(logged, false).unwrap();
    let before = dev.snapshot();

    let panicked = catch_unwind(AssertUnwindSafe(|| fs.create(root, b"boom", 0o644, 0, 0)));
    assert!(panicked.is_err(), "the hook did not panic: {panicked:?}");

    // Reads are served; the failure says what happened.
    assert_eq!(fs.lookup(root, b"kept").unwrap().ino, kept);
    assert_eq!(fs.read_file(kept, 0, 100).unwrap(), b"intact");
    let names: Vec<Vec<u8>> = fs
        .readdir(root, 0, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&b"kept".to_vec()), "{names:?}");
    let failure = fs.failure().expect("the filesystem failed");
    assert!(failure.contains("panicked inside birch"), "{failure}");
    // The mount adds where it happened to the general reason.
    let reason = fs.fail_after_panic("CREATE request: boom");
    assert!(reason.ends_with("CREATE request: boom"), "{reason}");
    assert_eq!(fs.failure().as_deref(), Some(reason.as_str()));

    // Changes are refused; commits and fsyncs fail; nothing is written.
    let refused = fs.create(root, b"after", 0o644, 0, 0).map(|a| a.ino);
    assert_eq!(refused.map_err(|e| e.errno()), Err(libc::EROFS));
    assert_eq!(
        fs.write_file(kept, 0, b"x").map_err(|e| e.errno()),
        Err(libc::EROFS)
    );
    assert!(fs.fsync(kept, false).is_err());
    assert!(fs.sync().is_err());
    assert!(fs.close().is_err(), "close commits nothing after a failure");
    assert!(
        dev.snapshot() == before,
        "a failed filesystem wrote to the device"
    );

    // The next mount has what was durable: the commit and the fsync log.
    let fs = Filesystem::open(dev, MountOptions::deterministic()).unwrap();
    assert_eq!(fs.read_file(kept, 0, 100).unwrap(), b"intact");
    assert_eq!(fs.lookup(root, b"logged").unwrap().ino, logged);
    assert!(fs.lookup(root, b"boom").is_err());
}
