//! birch patch: FUSE over io_uring (Linux 6.14+, module parameter
//! `fuse.enable_uring`).
//!
//! The kernel keeps one request queue per possible CPU and hands each
//! request to a ring entry the server registered for the CPU the caller
//! runs on. An entry is a pair of buffers (`struct fuse_uring_req_header`
//! and a payload buffer) registered with `FUSE_IO_URING_CMD_REGISTER`; its
//! completion carries a request, and `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`
//! answers it and waits for the next one in the same step, one system call
//! per request instead of a read and a write on /dev/fuse.
//!
//! Every entry here has a thread and an io_uring of its own: a request that
//! blocks (birch's fsync waits for a device flush) holds up only its own
//! entry, while the other entries of the same queue go on taking the
//! queue's requests. The kernel completes an entry's command in the task
//! that submitted it, so the thread that registers an entry is the one
//! that serves it.
//!
//! Requests are rebuilt into the contiguous form /dev/fuse delivers
//! (`fuse_in_header`, the operation's header, the rest) so that fuser's
//! parser and `Filesystem` dispatch serve both transports unchanged;
//! replies are split back into the out header and the payload buffer.
//! FORGET and INTERRUPT still come through /dev/fuse (the kernel's
//! `fuse_io_uring_ops` sends them there), as do requests sent before every
//! queue has an entry, and notifications go out through /dev/fuse.

use std::io;
use std::io::IoSlice;
use std::mem::size_of;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::thread::JoinHandle;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::error;
use parking_lot::Condvar;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::ReplyEmpty;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::ll::fuse_abi as abi;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `sizeof(struct fuse_uring_req_header)`: the in or out header area, the
/// operation's header area, and `struct fuse_uring_ent_in_out`.
const HEADER_SIZE: usize = 128 + 128 + 32;
/// Offsets in `struct fuse_uring_req_header`.
const OP_IN_OFFSET: usize = 128;
const OP_IN_SIZE: usize = 128;
const COMMIT_ID_OFFSET: usize = 256 + 8;
const PAYLOAD_SIZE_OFFSET: usize = 256 + 16;
const IN_HEADER_SIZE: usize = size_of::<abi::fuse_in_header>();
const OUT_HEADER_SIZE: usize = size_of::<abi::fuse_out_header>();
/// `enum fuse_uring_cmd`.
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// The kernel's `FUSE_MIN_READ_BUFFER`: no payload buffer may be smaller.
const MIN_PAYLOAD_SIZE: usize = 8192;
/// Offset of `len` in `struct io_uring_sqe`: the io-uring crate's
/// `UringCmd80` cannot set it, and registration passes the iovec count there.
const SQE_LEN_OFFSET: usize = 24;

/// How the session's requests reach the filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// Read and write on /dev/fuse, for the reason given.
    DevFuse(DevFuseReason),
    /// io_uring queues (one per possible CPU), each with this many entries
    /// served by a thread each. FORGET and INTERRUPT still use /dev/fuse.
    IoUring {
        /// Queues: one per possible CPU.
        queues: usize,
        /// Entries (and serving threads) per queue.
        entries_per_queue: usize,
    },
}

/// Why a session serves over /dev/fuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevFuseReason {
    /// `Config::io_uring_entries_per_queue` was not set.
    NotRequested,
    /// The kernel's INIT did not offer `FUSE_OVER_IO_URING`: a kernel before
    /// 6.14, or one whose `fuse.enable_uring` is off.
    NotOffered,
    /// Creating the rings failed (io_uring disabled, out of memory, ...).
    Setup(String),
    /// The kernel refused to register ring entries.
    Registration(String),
}

/// The payload buffer every entry needs: the kernel refuses an entry whose
/// buffer could not hold its largest request or reply.
pub(crate) fn payload_size(max_write: u32, max_pages: u16) -> usize {
    MIN_PAYLOAD_SIZE
        .max(max_write as usize)
        .max(usize::from(max_pages) * page_size::get())
}

/// The number of possible CPUs, which is the number of queues the kernel
/// expects (`num_possible_cpus()`), from a list like "0-3,6".
fn possible_cpus() -> io::Result<usize> {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let invalid = || io::Error::new(io::ErrorKind::InvalidData, format!("CPU list {list:?}"));
    let mut count = 0;
    for range in list.trim().split(',') {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        let first: usize = first.parse().map_err(|_| invalid())?;
        let last: usize = last.parse().map_err(|_| invalid())?;
        count += last.checked_sub(first).ok_or_else(invalid)? + 1;
    }
    Ok(count)
}

/// Rings created before the INIT reply, so that a failure here can still
/// leave `FUSE_OVER_IO_URING` out of the reply: once the kernel has it, it
/// holds every request until the queues are registered.
pub(crate) struct PreparedRings {
    rings: Vec<(u16, IoUring<squeue::Entry128>)>,
    queues: usize,
    entries_per_queue: usize,
}

impl PreparedRings {
    pub(crate) fn create(entries_per_queue: usize) -> io::Result<PreparedRings> {
        let queues = possible_cpus()?;
        let mut rings = Vec::with_capacity(queues * entries_per_queue);
        for qid in 0..queues {
            let qid = u16::try_from(qid).map_err(io::Error::other)?;
            for _ in 0..entries_per_queue {
                // One command in flight per ring: its entry's.
                rings.push((qid, IoUring::builder().build(2)?));
            }
        }
        Ok(PreparedRings {
            rings,
            queues,
            entries_per_queue,
        })
    }

    pub(crate) fn transport(&self) -> Transport {
        Transport::IoUring {
            queues: self.queues,
            entries_per_queue: self.entries_per_queue,
        }
    }

    /// Registers every entry, each from the thread that will serve it, and
    /// returns those threads; they wait for [`RingThread::start`]. Fails
    /// if any registration failed (the kernel then falls back to
    /// /dev/fuse); the entries that did register are served all the same.
    pub(crate) fn register<FS: Filesystem>(
        self,
        fuse_fd: RawFd,
        payload_size: usize,
        threads: &mut Vec<RingThread<FS>>,
    ) -> Result<(), String> {
        let total = self.rings.len();
        let (registered_tx, registered_rx) = mpsc::channel();
        for (i, (qid, ring)) in self.rings.into_iter().enumerate() {
            let (start_tx, start_rx) = mpsc::channel::<SessionEventLoop<FS>>();
            let registered_tx = registered_tx.clone();
            let handle = thread::Builder::new()
                .name(format!("fuser-uring-{qid}-{i}"))
                .spawn(move || {
                    let mut entry = ServedEntry::new(ring, fuse_fd, qid, payload_size);
                    let registered = entry.register();
                    let ok = registered.is_ok();
                    let _ = registered_tx.send(registered);
                    drop(registered_tx);
                    if !ok {
                        return Ok(());
                    }
                    // The session dropped without running: nothing to serve.
                    let Ok(event_loop) = start_rx.recv() else {
                        return Ok(());
                    };
                    entry.serve(&event_loop)
                })
                .map_err(|e| e.to_string())?;
            threads.push(RingThread {
                handle,
                start: start_tx,
            });
        }
        drop(registered_tx);
        // One answer per thread (a thread that could not answer has ended,
        // and with it its sender).
        let failures: Vec<io::Error> = registered_rx
            .iter()
            .take(total)
            .filter_map(Result::err)
            .collect();
        match failures.first() {
            None => Ok(()),
            Some(first) => Err(format!(
                "{} of {total} ring entries failed to register: {first}",
                failures.len()
            )),
        }
    }
}

/// A thread serving one registered entry, waiting to be started.
#[derive(Debug)]
pub(crate) struct RingThread<FS: Filesystem> {
    handle: JoinHandle<io::Result<()>>,
    start: mpsc::Sender<SessionEventLoop<FS>>,
}

impl<FS: Filesystem> RingThread<FS> {
    pub(crate) fn start(self, event_loop: SessionEventLoop<FS>) -> JoinHandle<io::Result<()>> {
        // A thread whose registration failed has ended and dropped its
        // receiver; its join reports nothing.
        let _ = self.start.send(event_loop);
        self.handle
    }
}

/// An entry's buffers as the kernel sees them: they are registered once by
/// address, so they never move. The kernel writes a request into them only
/// while this side waits in io_uring_enter, and reads the reply only after
/// the commit is submitted; in between this side has them to itself,
/// through the mutex.
struct EntryBuffers {
    header: Box<[u8]>,
    payload: Box<[u8]>,
    /// Set when the reply for the request in the buffers is written.
    replied: bool,
}

/// An entry shared by its serving thread and the request's reply object,
/// which the filesystem may send from any thread.
pub(crate) struct RingEntry {
    buffers: Mutex<EntryBuffers>,
    reply_written: Condvar,
}

impl std::fmt::Debug for RingEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingEntry").finish_non_exhaustive()
    }
}

/// Where a request served over io_uring sends its reply.
#[derive(Debug, Clone)]
pub(crate) struct RingReply {
    entry: Arc<RingEntry>,
    /// For what only /dev/fuse does (passthrough backing files).
    pub(crate) channel: ChannelSender,
}

impl RingReply {
    /// Writes the reply (out header, then the reply's data) into the entry:
    /// the header into the header area, the data into the payload buffer.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut buffers = self.entry.buffers.lock();
        let buffers = &mut *buffers;
        let total: usize = data.iter().map(|slice| slice.len()).sum();
        if total < OUT_HEADER_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "reply shorter than its header",
            ));
        }
        let payload_len = total - OUT_HEADER_SIZE;
        // `offset` runs over the reply as one stream: its first bytes are
        // the out header, the rest the payload (dropped if it does not fit,
        // which is answered EIO below).
        let mut offset = 0;
        for slice in data {
            let mut bytes: &[u8] = slice;
            if offset < OUT_HEADER_SIZE {
                let n = (OUT_HEADER_SIZE - offset).min(bytes.len());
                buffers.header[offset..offset + n].copy_from_slice(&bytes[..n]);
                offset += n;
                bytes = &bytes[n..];
            }
            let at = offset - OUT_HEADER_SIZE;
            if let Some(dest) = buffers.payload.get_mut(at..at + bytes.len()) {
                dest.copy_from_slice(bytes);
            }
            offset += bytes.len();
        }
        let payload_len = if payload_len > buffers.payload.len() {
            error!(
                "reply of {payload_len} bytes exceeds the {} byte ring buffer",
                buffers.payload.len()
            );
            let eio = -libc::EIO;
            buffers.header[4..8].copy_from_slice(&eio.to_ne_bytes());
            0
        } else {
            payload_len
        };
        let payload_len = u32::try_from(payload_len).map_err(io::Error::other)?;
        buffers.header[PAYLOAD_SIZE_OFFSET..PAYLOAD_SIZE_OFFSET + 4]
            .copy_from_slice(&payload_len.to_ne_bytes());
        buffers.replied = true;
        self.entry.reply_written.notify_one();
        Ok(())
    }
}

/// One registered entry and the ring it is served through.
struct ServedEntry {
    ring: IoUring<squeue::Entry128>,
    fuse_fd: RawFd,
    qid: u16,
    entry: Arc<RingEntry>,
    /// The two buffers' addresses, which registration passes by pointer.
    iovecs: Box<[libc::iovec; 2]>,
    /// The request rebuilt in /dev/fuse's layout; u64 for the alignment
    /// fuser's parser needs.
    request: Vec<u64>,
    /// A completion that arrived with the registration.
    first_completion: Option<cqueue::Entry>,
}

impl ServedEntry {
    fn new(
        ring: IoUring<squeue::Entry128>,
        fuse_fd: RawFd,
        qid: u16,
        payload_size: usize,
    ) -> ServedEntry {
        let mut header = vec![0u8; HEADER_SIZE].into_boxed_slice();
        let mut payload = vec![0u8; payload_size].into_boxed_slice();
        let iovecs = Box::new([
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: header.len(),
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ]);
        ServedEntry {
            ring,
            fuse_fd,
            qid,
            entry: Arc::new(RingEntry {
                buffers: Mutex::new(EntryBuffers {
                    header,
                    payload,
                    replied: false,
                }),
                reply_written: Condvar::new(),
            }),
            iovecs,
            request: vec![0; (IN_HEADER_SIZE + OP_IN_SIZE + payload_size).div_ceil(8)],
            first_completion: None,
        }
    }

    /// `struct fuse_uring_cmd_req` in the SQE's command area.
    fn command(&self, commit_id: u64) -> [u8; 80] {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        cmd
    }

    fn push(&mut self, sqe: squeue::Entry128) -> io::Result<()> {
        // SAFETY: the SQE's pointers (the iovecs of a registration, which
        // point at the entry's buffers) are owned by `self` and live as
        // long as the ring.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))
    }

    /// Registers the entry; Ok once the kernel has taken it.
    fn register(&mut self) -> io::Result<()> {
        let sqe = opcode::UringCmd80::new(types::Fd(self.fuse_fd), FUSE_IO_URING_CMD_REGISTER)
            .cmd(self.command(0))
            .addr(Some(self.iovecs.as_ptr() as u64))
            .build();
        // SAFETY: Entry128 is a repr(C) pair of plain-data arrays making up
        // the 128-byte SQE, so it can be viewed as bytes and back; `len`
        // (u32 at byte 24 of `struct io_uring_sqe`) is the iovec count the
        // kernel requires, which UringCmd80 has no setter for.
        let sqe = unsafe {
            let mut bytes: [u8; 128] = std::mem::transmute(sqe);
            bytes[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4].copy_from_slice(&2u32.to_ne_bytes());
            std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes)
        };
        self.push(sqe)?;
        self.ring.submit()?;
        // A refused registration completes within the submit; an accepted
        // one completes only when a request arrives, which it may already
        // have (the last entry registered makes the ring ready, and the
        // requests the kernel held go out at once): that completion is
        // kept for the serving loop.
        match self.ring.completion().next() {
            Some(cqe) if cqe.result() < 0 => Err(io::Error::from_raw_os_error(-cqe.result())),
            first_request => {
                self.first_completion = first_request;
                Ok(())
            }
        }
    }

    /// Waits for the entry's next completion: Ok(true) when it holds a
    /// request, Ok(false) when the connection is gone.
    fn next_request(&mut self) -> io::Result<bool> {
        loop {
            let completion = self
                .first_completion
                .take()
                .or_else(|| self.ring.completion().next());
            if let Some(cqe) = completion {
                let result = cqe.result();
                if result >= 0 {
                    return Ok(true);
                }
                return match -result {
                    // Unmount, abort or the daemon's own exit.
                    libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {
                        Ok(false)
                    }
                    errno => Err(io::Error::from_raw_os_error(errno)),
                };
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn serve<FS: Filesystem>(&mut self, event_loop: &SessionEventLoop<FS>) -> io::Result<()> {
        let reply = RingReply {
            entry: self.entry.clone(),
            channel: event_loop.ch.sender(),
        };
        while self.next_request()? {
            let (commit_id, len) = self.rebuild_request();
            let request_bytes = zerocopy::IntoBytes::as_bytes(self.request.as_slice());
            let parsed = len.and_then(|len| {
                RequestWithSender::with_ring_reply(
                    event_loop.ch.sender(),
                    reply.clone(),
                    &request_bytes[..len],
                    event_loop.setxattr_ext,
                )
            });
            match parsed {
                Some(req) => {
                    if let Ok(Operation::Destroy(_)) = req.request.operation() {
                        // The unmount's last request; the kernel then tears
                        // the queues down, which ends this loop.
                        req.reply::<ReplyEmpty>().ok();
                    } else {
                        req.dispatch(event_loop);
                    }
                }
                None => {
                    self.reply_error(commit_id, libc::EIO);
                }
            }
            let mut buffers = self.entry.buffers.lock();
            while !buffers.replied {
                self.entry.reply_written.wait(&mut buffers);
            }
            buffers.replied = false;
            drop(buffers);
            let sqe = opcode::UringCmd80::new(
                types::Fd(self.fuse_fd),
                FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
            )
            .cmd(self.command(commit_id))
            .build();
            self.push(sqe)?;
        }
        Ok(())
    }

    /// Copies the request in the entry into `self.request` in /dev/fuse's
    /// layout; returns its commit id and its length (None if the sizes the
    /// kernel gave do not add up: the request is then answered EIO).
    fn rebuild_request(&mut self) -> (u64, Option<usize>) {
        let buffers = self.entry.buffers.lock();
        let header = &buffers.header;
        let read_u32 = |at: usize| {
            u32::from_ne_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
        };
        let mut commit_id = [0u8; 8];
        commit_id.copy_from_slice(&header[COMMIT_ID_OFFSET..COMMIT_ID_OFFSET + 8]);
        let commit_id = u64::from_ne_bytes(commit_id);
        // fuse_in_header.len counts all of the request: the op header went
        // to its own area and the rest (payload_sz bytes) to the payload.
        let len = read_u32(0) as usize;
        let payload_len = read_u32(PAYLOAD_SIZE_OFFSET) as usize;
        let Some(op_in_len) = len
            .checked_sub(IN_HEADER_SIZE + payload_len)
            .filter(|&n| n <= OP_IN_SIZE && payload_len <= buffers.payload.len())
        else {
            error!("ring request of {len} bytes with {payload_len} in the payload");
            return (commit_id, None);
        };
        let request = zerocopy::IntoBytes::as_mut_bytes(self.request.as_mut_slice());
        request[..IN_HEADER_SIZE].copy_from_slice(&header[..IN_HEADER_SIZE]);
        let op_end = IN_HEADER_SIZE + op_in_len;
        request[IN_HEADER_SIZE..op_end]
            .copy_from_slice(&header[OP_IN_OFFSET..OP_IN_OFFSET + op_in_len]);
        request[op_end..len].copy_from_slice(&buffers.payload[..payload_len]);
        (commit_id, Some(len))
    }

    /// Answers the request in the entry with an error, for one fuser
    /// cannot parse.
    fn reply_error(&self, commit_id: u64, errno: i32) {
        let mut buffers = self.entry.buffers.lock();
        let header = abi::fuse_out_header {
            len: OUT_HEADER_SIZE as u32,
            error: -errno,
            unique: commit_id,
        };
        buffers.header[..OUT_HEADER_SIZE].copy_from_slice(zerocopy::IntoBytes::as_bytes(&header));
        buffers.header[PAYLOAD_SIZE_OFFSET..PAYLOAD_SIZE_OFFSET + 4]
            .copy_from_slice(&0u32.to_ne_bytes());
        buffers.replied = true;
    }
}
