use birch::device::MemoryDevice;
use birch::fs::{Filesystem, MkfsOptions, MountOptions, RenameFlags};
use std::sync::Arc;

#[test]
fn mkfs_write_close_reopen_reads_back() {
    let dev = Arc::new(MemoryDevice::new(64 << 20));
    Filesystem::mkfs(&dev, &MkfsOptions::default()).unwrap();
    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"dir", 0o755, 0, 0).unwrap();
    let f = fs.create(d.ino, b"file", 0o644, 0, 0).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    fs.write_file(f.ino, 0, &data).unwrap();
    fs.write_file(f.ino, 5000, b"hello").unwrap();
    let small = fs.create(root, b"small", 0o644, 0, 0).unwrap();
    fs.write_file(small.ino, 0, b"tiny").unwrap();
    fs.symlink(root, b"link", b"dir/file", 0, 0).unwrap();
    fs.rename(d.ino, b"file", root, b"moved", RenameFlags::default())
        .unwrap();
    for i in 0..500 {
        fs.create(d.ino, format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
    }
    fs.sync().unwrap();
    for i in 0..500 {
        if i % 3 == 0 {
            fs.unlink(d.ino, format!("f{i}").as_bytes()).unwrap();
        }
    }
    fs.close().unwrap();

    let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
    let moved = fs.lookup(root, b"moved").unwrap();
    let mut expect = data.clone();
    expect[5000..5005].copy_from_slice(b"hello");
    assert_eq!(fs.read_file(moved.ino, 0, 200_000).unwrap(), expect);
    assert_eq!(fs.read_file(small.ino, 0, 100).unwrap(), b"tiny");
    assert_eq!(
        fs.readlink(fs.lookup(root, b"link").unwrap().ino).unwrap(),
        b"dir/file"
    );
    let entries = fs.readdir(d.ino, 0, usize::MAX).unwrap();
    assert_eq!(entries.len(), 500 - 167);
    assert_eq!(fs.getattr(root).unwrap().nlink, 3);
    fs.close().unwrap();
}
