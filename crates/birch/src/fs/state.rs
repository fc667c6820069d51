//! The state the state lock guards: the fs-wide `FsInfo` and the loaded
//! subvolume roots (docs/SNAPSHOTS.md, "The engine split").

use super::info::FsInfo;
use super::root::{Root, RootCtx};

/// Everything the running transaction knows, behind the state lock.
/// Operations that span roots (commit, replay, writeback over the dirty
/// queue) are its methods; the rest take an `FsInfo` or a `RootCtx`.
pub(crate) struct FsState<D> {
    pub(super) info: FsInfo<D>,
    pub(super) subvols: Subvols,
}

/// The loaded subvolume roots. Only the top-level subvolume (id 5) exists
/// until subvolumes do; it is a field rather than a map entry so that code
/// can borrow its parts and the fs-wide state's at once. With subvolumes
/// it becomes a map by id behind `FsState::ctx(id)`.
pub(crate) struct Subvols {
    pub(super) top: Root,
}

impl<D> FsState<D> {
    pub(super) fn new(info: FsInfo<D>, top: Root) -> FsState<D> {
        FsState {
            info,
            subvols: Subvols { top },
        }
    }

    /// The top-level subvolume beside the fs-wide state.
    pub(super) fn top(&mut self) -> RootCtx<'_, D> {
        RootCtx {
            fs: &mut self.info,
            root: &mut self.subvols.top,
        }
    }
}
