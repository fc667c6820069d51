//! The engine's locks, each with a rank, and a check of their order in
//! debug builds (docs/ARCHITECTURE.md, "Lock order").
//!
//! A deadlock needs two threads taking two locks in opposite orders. The
//! engine's rule is that a thread holding a lock only takes locks of a
//! higher rank; [`RankedMutex`] checks it every time a thread blocks on a
//! lock, so a test that takes locks the wrong way round fails at once,
//! naming both locks, instead of hanging one run in a thousand. Release
//! builds keep only the rank (no bookkeeping on the request path).

use std::ops::{Deref, DerefMut};
use std::sync::{
    Condvar, LockResult, Mutex, MutexGuard, PoisonError, TryLockError, TryLockResult,
    WaitTimeoutResult,
};
use std::time::Duration;

/// The engine's locks, lowest rank first: the order of the table in
/// docs/ARCHITECTURE.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum LockRank {
    /// Starting and stopping the background threads.
    Threads,
    /// One space reclaim at a time.
    Reclaim,
    /// One commit at a time.
    Commit,
    /// Superblock writes, a commit's and a log sync's.
    Superblock,
    /// Log-sync and commit progress (group commit).
    Sync,
    /// The filesystem state: trees, inodes, dirty pages, reservations.
    State,
    /// The clean-node cache.
    NodeCache,
    /// The commit worker's stop flag: taken with nothing else held, and
    /// nothing taken under it.
    WorkerStop,
}

#[cfg(debug_assertions)]
impl LockRank {
    /// Whether the lock must be taken with no other engine lock held.
    fn alone(self) -> bool {
        self == LockRank::WorkerStop
    }
}

#[cfg(debug_assertions)]
thread_local! {
    /// Ranks of the engine locks this thread holds, in the order taken.
    static HELD: std::cell::RefCell<Vec<LockRank>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Panics if this thread may not block on a lock of `rank` now.
#[cfg(debug_assertions)]
fn check_may_take(rank: LockRank) {
    HELD.with(|held| {
        let held = held.borrow();
        if let Some(&highest) = held.iter().max() {
            assert!(
                highest < rank && !rank.alone() && !highest.alone(),
                "lock order: taking {rank:?} while holding {held:?} (docs/ARCHITECTURE.md, \
                 \"Lock order\": a thread takes only locks of a higher rank)"
            );
        }
    });
}

/// One held lock in this thread's list, removed when dropped.
struct Held {
    #[cfg(debug_assertions)]
    rank: LockRank,
}

impl Held {
    fn new(rank: LockRank) -> Held {
        #[cfg(debug_assertions)]
        HELD.with(|held| held.borrow_mut().push(rank));
        #[cfg(not(debug_assertions))]
        let _ = rank;
        Held {
            #[cfg(debug_assertions)]
            rank,
        }
    }
}

#[cfg(debug_assertions)]
impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            // Guards may drop out of order; remove the latest of this rank.
            if let Some(at) = held.iter().rposition(|&r| r == self.rank) {
                held.remove(at);
            }
        });
    }
}

/// A mutex with a rank (see the module comment).
pub(crate) struct RankedMutex<T> {
    rank: LockRank,
    inner: Mutex<T>,
}

/// A held [`RankedMutex`].
pub(crate) struct RankedGuard<'a, T> {
    inner: MutexGuard<'a, T>,
    _held: Held,
}

impl<T> RankedMutex<T> {
    pub(crate) fn new(rank: LockRank, value: T) -> RankedMutex<T> {
        RankedMutex {
            rank,
            inner: Mutex::new(value),
        }
    }

    /// As [`Mutex::lock`]; in debug builds, panics first if this thread
    /// holds a lock it may not hold while blocking on this one.
    pub(crate) fn lock(&self) -> LockResult<RankedGuard<'_, T>> {
        #[cfg(debug_assertions)]
        check_may_take(self.rank);
        let held = Held::new(self.rank);
        match self.inner.lock() {
            Ok(inner) => Ok(RankedGuard { inner, _held: held }),
            Err(poisoned) => Err(PoisonError::new(RankedGuard {
                inner: poisoned.into_inner(),
                _held: held,
            })),
        }
    }

    /// As [`Mutex::try_lock`]. Not checked: a thread that does not block
    /// cannot take part in a deadlock.
    pub(crate) fn try_lock(&self) -> TryLockResult<RankedGuard<'_, T>> {
        match self.inner.try_lock() {
            Ok(inner) => Ok(RankedGuard {
                inner,
                _held: Held::new(self.rank),
            }),
            Err(TryLockError::WouldBlock) => Err(TryLockError::WouldBlock),
            Err(TryLockError::Poisoned(poisoned)) => {
                Err(TryLockError::Poisoned(PoisonError::new(RankedGuard {
                    inner: poisoned.into_inner(),
                    _held: Held::new(self.rank),
                })))
            }
        }
    }

    /// As [`Mutex::get_mut`]: exclusive access needs no lock.
    pub(crate) fn get_mut(&mut self) -> LockResult<&mut T> {
        self.inner.get_mut()
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.inner.is_poisoned()
    }

    /// As [`Mutex::clear_poison`]: for a lock whose holder has dealt with
    /// the panic that poisoned it (the state lock, docs/IO-ERRORS.md).
    pub(crate) fn clear_poison(&self) {
        self.inner.clear_poison();
    }
}

impl<T> Deref for RankedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for RankedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

/// A condition variable used with [`RankedMutex`]es. While a thread waits
/// its lock counts as held: it takes no other lock until it wakes.
pub(crate) struct RankedCondvar(Condvar);

impl RankedCondvar {
    pub(crate) fn new() -> RankedCondvar {
        RankedCondvar(Condvar::new())
    }

    pub(crate) fn wait<'a, T>(&self, guard: RankedGuard<'a, T>) -> LockResult<RankedGuard<'a, T>> {
        let RankedGuard { inner, _held: held } = guard;
        match self.0.wait(inner) {
            Ok(inner) => Ok(RankedGuard { inner, _held: held }),
            Err(poisoned) => Err(PoisonError::new(RankedGuard {
                inner: poisoned.into_inner(),
                _held: held,
            })),
        }
    }

    pub(crate) fn wait_timeout<'a, T>(
        &self,
        guard: RankedGuard<'a, T>,
        timeout: Duration,
    ) -> LockResult<(RankedGuard<'a, T>, WaitTimeoutResult)> {
        let RankedGuard { inner, _held: held } = guard;
        match self.0.wait_timeout(inner, timeout) {
            Ok((inner, timed_out)) => Ok((RankedGuard { inner, _held: held }, timed_out)),
            Err(poisoned) => {
                let (inner, timed_out) = poisoned.into_inner();
                Err(PoisonError::new((
                    RankedGuard { inner, _held: held },
                    timed_out,
                )))
            }
        }
    }

    pub(crate) fn notify_all(&self) {
        self.0.notify_all();
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_upward_pass_and_release_in_any_order() {
        let commit = RankedMutex::new(LockRank::Commit, ());
        let state = RankedMutex::new(LockRank::State, 0);
        let cache = RankedMutex::new(LockRank::NodeCache, ());
        let c = commit.lock().expect("commit");
        let s = state.lock().expect("state");
        let n = cache.lock().expect("cache");
        drop(s);
        drop(n);
        // With only the commit lock held, the state lock may be taken again.
        *state.lock().expect("state again") += 1;
        drop(c);
        let _s = state.lock().expect("state alone");
    }

    #[test]
    #[should_panic(expected = "lock order: taking Sync while holding [State]")]
    fn taking_a_lower_rank_under_a_higher_one_panics() {
        let sync = RankedMutex::new(LockRank::Sync, ());
        let state = RankedMutex::new(LockRank::State, ());
        let _s = state.lock().expect("state");
        let _ = sync.lock();
    }

    #[test]
    #[should_panic(expected = "lock order: taking State while holding [State]")]
    fn taking_the_same_rank_twice_panics() {
        let a = RankedMutex::new(LockRank::State, ());
        let b = RankedMutex::new(LockRank::State, ());
        let _a = a.lock().expect("a");
        let _ = b.lock();
    }

    #[test]
    #[should_panic(expected = "lock order: taking WorkerStop while holding [Commit]")]
    fn a_lock_taken_alone_panics_under_another() {
        let commit = RankedMutex::new(LockRank::Commit, ());
        let stop = RankedMutex::new(LockRank::WorkerStop, false);
        let _c = commit.lock().expect("commit");
        let _ = stop.lock();
    }

    #[test]
    fn a_waiting_thread_keeps_its_lock_counted_and_try_lock_is_unchecked() {
        let sync = RankedMutex::new(LockRank::Sync, ());
        let state = RankedMutex::new(LockRank::State, ());
        let cv = RankedCondvar::new();
        let s = state.lock().expect("state");
        let (s, timed_out) = cv.wait_timeout(s, Duration::from_millis(1)).expect("wait");
        assert!(timed_out.timed_out());
        // A try_lock of a lower rank cannot deadlock: allowed.
        assert!(sync.try_lock().is_ok());
        drop(s);
        HELD.with(|held| assert!(held.borrow().is_empty(), "{:?}", held.borrow()));
    }
}
