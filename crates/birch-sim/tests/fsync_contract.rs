//! Issue 10, "fsync contract": the six sequences in which a power cut lost
//! what was durable before (a name reused after a rename, a directory's
//! name reused, swaps through hard links, a rename chain over a hard link,
//! an fsync of the renamed inode, a directory fsync after a new subtree
//! with links). Each is a fixed workload of `birch_sim::ace::fixed`: its
//! setup ends with a sync, and every crash state after it is judged by
//! every oracle (mount, `birch check`, generation, persistence guarantees,
//! nothing durable lost, renames) plus the workload's own promise: once
//! its last fsync completed, the named subtrees are exactly the model's.
//!
//! Issue 21 adds the five fsync cases fstests caught (generic/066, 104,
//! 336, 343, 764), named as their crash cases in docs/TREE-LOG.md.
//!
//! Replay one: `cargo run --release -p birch-sim --bin birch-crash --
//! --ace-workload rename_away_then_reuse_name`.

use birch_sim::ace;

fn run(id: &str) {
    let w = ace::by_id(id).unwrap_or_else(|| panic!("no fixed workload {id}"));
    let stats = ace::run(&w, &ace::config(12, 64)).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{}: {} crash states ({} replaying a log), {} paths judged by its promise",
        w.describe(),
        stats.crash.crash_states,
        stats.states_with_log,
        stats.expected_judged
    );
    assert!(stats.expected_judged > 0, "no state after the last fsync");
}

/// `a/foo` (16 KiB, synced); mv a/foo a/bar; new a/foo; fsync a/foo →
/// a/bar keeps the old data.
#[test]
fn rename_away_then_reuse_name() {
    run("rename_away_then_reuse_name");
}

/// `a/x/{f1,f2}` (synced); mv a/x a/y; mkdir a/x; fsync a/x → mounts; a/y
/// with both files; a/x empty.
#[test]
fn rename_dir_away_then_mkdir_same_name() {
    run("rename_dir_away_then_mkdir_same_name");
}

/// `t/f1` ("foo"), `t/f2` ("hello") synced; mv f1 f3; mv f2 f4; ln f3 f2;
/// new f1; fsync f1 → f1 new, f2 and f3 "foo", f4 "hello".
#[test]
fn swap_names_through_links() {
    run("swap_names_through_links");
}

/// `t/foo` = `t/bar` (synced); mv foo qwerty; mv bar foo; new bar; fsync
/// bar → qwerty and foo (one inode, two links), new bar.
#[test]
fn rename_chain_over_hard_link() {
    run("rename_chain_over_hard_link");
}

/// `dir/foo` (synced); mv foo bar; new empty foo; fsync dir/bar → bar
/// and the new foo.
#[test]
fn fsync_renamed_keeps_new_owner_of_old_name() {
    run("fsync_renamed_keeps_new_owner_of_old_name");
}

/// `foo` (8 KiB), empty `d/` (synced); links of foo in d, d/x/y/z/ made,
/// links in d/x/y and d/x/y/z, new d/x/y/z/qwerty; fsync d → the whole
/// subtree, foo with 5 links.
#[test]
fn dir_fsync_logs_new_subdirectory_tree() {
    run("dir_fsync_logs_new_subdirectory_tree");
}

/// Found by the explorer (crash seeds 15, 28, 44) after the six passed:
/// `d/` (synced); create d/f; fsync d; mkdir d/x; create d/x/q; fsync d →
/// d/x/q (the new subtree is logged whole on the second fsync too).
#[test]
fn dir_fsync_after_earlier_log_keeps_new_subtree() {
    run("dir_fsync_after_earlier_log_keeps_new_subtree");
}

/// fstests generic/066: `f` with `user.a` (synced); append; fsync f;
/// remove `user.a`; ln f f_link; new g; fsync g → `f_link` only with the
/// removal.
#[test]
fn generic_066_xattr_removal_persists_with_link() {
    run("generic_066_xattr_removal_persists_with_link");
}

/// fstests generic/104: `d/{foo,bar}` (synced); ln bar bar_link; ln foo
/// foo_link; fsync d/bar → both links.
#[test]
fn generic_104_fsync_logs_other_new_links_in_the_directory() {
    run("generic_104_fsync_logs_other_new_links_in_the_directory");
}

/// fstests generic/336: `a/foo` = `b/foo_link`, `b/bar` (synced); unlink
/// b/foo_link; mv b/bar c/; fsync a/foo → `c/bar`, `b` empty.
#[test]
fn generic_336_move_out_of_old_parent_persists() {
    run("generic_336_move_out_of_old_parent_persists");
}

/// fstests generic/343: `x/foo`, `y/z/`, `y/foo2` (synced); ln x/foo x/bar;
/// mv y/z x/; mv y/foo2 x/; fsync x/bar → `x/z`, `x/foo2`, `y` empty.
#[test]
fn generic_343_moves_into_dir_of_new_link_persist() {
    run("generic_343_moves_into_dir_of_new_link_persist");
}

/// fstests generic/764: `d/foo` open as fd0 (synced); unlink d/foo; fsync
/// fd0 → no `d/foo`.
#[test]
fn generic_764_fsync_of_unlinked_open_file_persists_deletion() {
    run("generic_764_fsync_of_unlinked_open_file_persists_deletion");
}
