//! The engine's locks, each with a rank, and a check of their order in
//! debug builds (docs/ARCHITECTURE.md, "Lock order").
//!
//! A deadlock needs two threads taking two locks in opposite orders. The
//! engine's rule is that a thread holding a lock only takes locks of a
//! higher rank; [`RankedMutex`] checks it every time a thread blocks on a
//! lock, so a test that takes locks the wrong way round fails at once,
//! naming both locks, instead of hanging one run in a thousand. Release
//! builds keep only the rank (no bookkeeping on the request path).

use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{
    Condvar, LockResult, Mutex, MutexGuard, PoisonError, TryLockError, TryLockResult,
    WaitTimeoutResult,
};
use std::time::{Duration, Instant};

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
    /// The data reads in flight, by epoch (`alloc::ReaderEpochs`).
    Epochs,
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

/// One held lock in this thread's list, removed when dropped. A lock of
/// rank `State` also runs this thread's hold clock while held (see
/// [`RequestHold`]).
struct Held {
    #[cfg(debug_assertions)]
    rank: LockRank,
    /// When this thread took (or, after a condvar wait, took back) a
    /// `State` lock; `None` for other ranks and while waiting.
    held_since: Option<Instant>,
    timed: bool,
}

thread_local! {
    /// How many `State` locks this thread holds (release builds too: the
    /// counters of I/O under the state lock need it).
    static STATE_LOCKS_HELD: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread holds a lock of rank `State`: device I/O it does
/// now stalls every request (see [`assert_no_state_lock`]).
pub(crate) fn holds_state_lock() -> bool {
    STATE_LOCKS_HELD.with(|held| held.get() > 0)
}

impl Held {
    fn new(rank: LockRank) -> Held {
        #[cfg(debug_assertions)]
        HELD.with(|held| held.borrow_mut().push(rank));
        if rank == LockRank::State {
            STATE_LOCKS_HELD.with(|held| held.set(held.get() + 1));
        }
        Held {
            #[cfg(debug_assertions)]
            rank,
            held_since: (rank == LockRank::State).then(Instant::now),
            timed: rank == LockRank::State,
        }
    }

    /// Stops the hold clock: a condvar wait releases the lock.
    fn pause(&mut self) {
        if let Some(since) = self.held_since.take() {
            add_state_hold(since);
        }
    }

    /// (Re)starts the hold clock: once a blocking lock is taken, and after
    /// a [`pause`](Self::pause).
    fn resume(&mut self) {
        if self.timed {
            self.held_since = Some(Instant::now());
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.pause();
        if self.timed {
            STATE_LOCKS_HELD.with(|held| held.set(held.get().saturating_sub(1)));
        }
        #[cfg(debug_assertions)]
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            // Guards may drop out of order; remove the latest of this rank.
            if let Some(at) = held.iter().rposition(|&r| r == self.rank) {
                held.remove(at);
            }
        });
    }
}

#[cfg(debug_assertions)]
thread_local! {
    /// The named exemptions from "no device I/O under the state lock" this
    /// thread is inside ([`allow_io_under_state_lock`]), innermost last.
    static IO_EXEMPTIONS: std::cell::RefCell<Vec<&'static str>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Debug builds: panics if this thread holds the state lock, unless it is
/// inside a named exemption. The device layer calls it on every read,
/// write and flush (docs/ARCHITECTURE.md, "Lock order": device I/O under
/// the state lock stalls every request behind the device).
pub(crate) fn assert_no_state_lock() {
    #[cfg(debug_assertions)]
    HELD.with(|held| {
        if held.borrow().contains(&LockRank::State) {
            IO_EXEMPTIONS.with(|exempt| {
                assert!(
                    !exempt.borrow().is_empty(),
                    "device I/O while holding the state lock (docs/SNAPSHOTS.md (f), \
                     \"How device I/O leaves the state lock\")"
                );
            });
        }
    });
}

/// A named exemption from [`assert_no_state_lock`] (dropping it ends it).
/// Each is a path that still does device I/O under the state lock, listed
/// in docs/SNAPSHOTS.md (j) step 3 as debt.
#[must_use = "the exemption ends when the guard drops"]
pub(crate) struct IoUnderStateLock {
    _private: (),
}

/// Allows device I/O under the state lock until the guard drops, for the
/// path `why` names (one of the remaining paths listed in
/// docs/SNAPSHOTS.md (j) step 3).
pub(crate) fn allow_io_under_state_lock(why: &'static str) -> IoUnderStateLock {
    #[cfg(debug_assertions)]
    IO_EXEMPTIONS.with(|exempt| exempt.borrow_mut().push(why));
    #[cfg(not(debug_assertions))]
    let _ = why;
    IoUnderStateLock { _private: () }
}

impl Drop for IoUnderStateLock {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        IO_EXEMPTIONS.with(|exempt| {
            exempt.borrow_mut().pop();
        });
    }
}

thread_local! {
    /// This thread's open [`RequestHold`]s and the time it held `State`
    /// locks since the outermost one began.
    static STATE_HOLD: Cell<(u32, u64)> = const { Cell::new((0, 0)) };
}

fn add_state_hold(since: Instant) {
    let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
    STATE_HOLD.with(|hold| {
        let (open, total) = hold.get();
        hold.set((open, total.saturating_add(nanos)));
    });
}

/// Buckets of [`HoldHistogram`]: bucket `i` counts requests that held the
/// state lock for `[2^i, 2^(i+1))` ns in total (bucket 0 also 0 ns; the
/// last one everything from 2^31 ns, about 2.1 s, up).
pub(crate) const HOLD_BUCKETS: usize = 32;

/// The bucket of a hold of `nanos`.
fn hold_bucket(nanos: u64) -> usize {
    let log2 = (u64::BITS - 1).saturating_sub(nanos.max(1).leading_zeros()) as usize;
    log2.min(HOLD_BUCKETS - 1)
}

/// How long requests held the state lock, each request's holds summed:
/// a log2 histogram, updated without any lock (docs/ARCHITECTURE.md,
/// "Lock order": the mean hold bounds the request rate on any number of
/// cores).
pub(crate) struct HoldHistogram {
    buckets: [AtomicU64; HOLD_BUCKETS],
    requests: AtomicU64,
    nanos: AtomicU64,
}

/// A copy of a [`HoldHistogram`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HoldCounts {
    pub(crate) buckets: [u64; HOLD_BUCKETS],
    pub(crate) requests: u64,
    pub(crate) nanos: u64,
}

impl HoldHistogram {
    pub(crate) fn new() -> HoldHistogram {
        HoldHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            requests: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
        }
    }

    fn record(&self, nanos: u64) {
        self.buckets[hold_bucket(nanos)].fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub(crate) fn counts(&self) -> HoldCounts {
        HoldCounts {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            requests: self.requests.load(Ordering::Relaxed),
            nanos: self.nanos.load(Ordering::Relaxed),
        }
    }

    /// Starts timing one request on this thread: until the returned guard
    /// drops, the time this thread holds `State` locks is summed, and the
    /// sum is recorded here when it drops. A request made inside another
    /// (`create` calls `mknod`) is part of the outer one.
    pub(crate) fn request(&self) -> RequestHold<'_> {
        let outermost = STATE_HOLD.with(|hold| {
            let (open, total) = hold.get();
            hold.set((open + 1, if open == 0 { 0 } else { total }));
            open == 0
        });
        RequestHold {
            histogram: self,
            outermost,
        }
    }
}

/// One request being timed ([`HoldHistogram::request`]).
pub(crate) struct RequestHold<'a> {
    histogram: &'a HoldHistogram,
    outermost: bool,
}

impl Drop for RequestHold<'_> {
    fn drop(&mut self) {
        let total = STATE_HOLD.with(|hold| {
            let (open, total) = hold.get();
            hold.set((open.saturating_sub(1), total));
            total
        });
        if self.outermost {
            self.histogram.record(total);
        }
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
        let mut held = Held::new(self.rank);
        let locked = self.inner.lock();
        // The hold starts once the lock is taken, not while waiting for it.
        held.resume();
        match locked {
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
        let RankedGuard {
            inner,
            _held: mut held,
        } = guard;
        held.pause();
        let woken = self.0.wait(inner);
        held.resume();
        match woken {
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
        let RankedGuard {
            inner,
            _held: mut held,
        } = guard;
        held.pause();
        let woken = self.0.wait_timeout(inner, timeout);
        held.resume();
        match woken {
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
    fn holds_land_in_their_log2_bucket() {
        assert_eq!(hold_bucket(0), 0);
        assert_eq!(hold_bucket(1), 0);
        assert_eq!(hold_bucket(2), 1);
        assert_eq!(hold_bucket(1023), 9);
        assert_eq!(hold_bucket(1024), 10);
        assert_eq!(hold_bucket(u64::MAX), HOLD_BUCKETS - 1);
    }

    #[test]
    fn a_request_inside_another_is_recorded_once_with_both_holds() {
        let histogram = HoldHistogram::new();
        let state = RankedMutex::new(LockRank::State, ());
        let other = RankedMutex::new(LockRank::Commit, ());
        {
            let _outer = histogram.request();
            drop(state.lock().expect("state"));
            {
                let _inner = histogram.request();
                drop(state.lock().expect("state again"));
            }
            drop(other.lock().expect("not timed"));
        }
        let counts = histogram.counts();
        assert_eq!(counts.requests, 1);
        assert_eq!(counts.buckets.iter().sum::<u64>(), 1);
        // Outside a request, holds are not recorded.
        drop(state.lock().expect("state outside"));
        assert_eq!(histogram.counts().requests, 1);
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
