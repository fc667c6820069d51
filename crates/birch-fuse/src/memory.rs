//! Memory an idle mount gives back (docs/MEMORY.md): once no request
//! but ioctls has arrived for `-o memory_idle=SECONDS`, the engine shrinks
//! its node cache to its idle size and frees its spare page buffers
//! ([`Filesystem::release_memory`]), and glibc returns the freed heap
//! pages to the system (malloc_trim). Once per idle spell: the next
//! request starts a new one.

use crate::requests::RequestCounts;
use birch::device::BlockDevice;
use birch::fs::Filesystem;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The thread that watches for idle spells; stopped by [`IdleRelease::stop`].
pub(crate) struct IdleRelease {
    stop: Sender<()>,
    thread: JoinHandle<()>,
}

impl IdleRelease {
    pub(crate) fn spawn<D: BlockDevice + 'static>(
        fs: Arc<Filesystem<D>>,
        requests: Arc<RequestCounts>,
        idle: Duration,
    ) -> std::io::Result<IdleRelease> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("birch-idle-release".into())
            .spawn(move || {
                let mut seen = requests.workload_requests();
                let mut last_request = Instant::now();
                let mut released = false;
                // Looks four times per idle period, so a release comes
                // between 1 and 1.25 idle periods after the last request.
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(idle / 4) {
                    let now = requests.workload_requests();
                    if now != seen {
                        seen = now;
                        last_request = Instant::now();
                        released = false;
                    } else if !released && last_request.elapsed() >= idle {
                        fs.release_memory();
                        return_free_heap();
                        released = true;
                    }
                }
            })?;
        Ok(IdleRelease { stop, thread })
    }

    /// Ends the thread (and its reference to the filesystem).
    pub(crate) fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// Hands free heap pages back to the system. glibc keeps what the engine
/// frees (the daemon has one arena: crates/birch-cli/src/mount.rs) and
/// trims only the top of the heap by itself; malloc_trim also releases
/// free pages inside it.
fn return_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes no pointers and may run at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
