//! What `birch stats` and the mount say about the transport: io_uring
//! (Linux 6.14+, `fuse.enable_uring`) or /dev/fuse, and why the latter
//! (docs/FUSE.md, "Transport").

use fuser::{DevFuseReason, Transport};

/// The module parameter that lets FUSE connections use io_uring.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// "io_uring (N queues x M entries)" or "/dev/fuse (why)".
pub(crate) fn describe(transport: &Transport) -> String {
    match transport {
        Transport::IoUring {
            queues,
            entries_per_queue,
        } => format!("io_uring ({queues} queues x {entries_per_queue} entries)"),
        Transport::DevFuse(reason) => format!("/dev/fuse ({})", fallback_reason(reason)),
    }
}

/// Why requests go through /dev/fuse, in words a user can act on.
pub(crate) fn fallback_reason(reason: &DevFuseReason) -> String {
    match reason {
        DevFuseReason::NotRequested => "transport=devfuse".into(),
        // The kernel offers io_uring at INIT only with the parameter on;
        // without the parameter the kernel has no FUSE over io_uring.
        DevFuseReason::NotOffered => match std::fs::read_to_string(ENABLE_URING) {
            Ok(value) if value.trim() == "N" => format!("io_uring is off: {ENABLE_URING} is N"),
            Ok(_) => "the kernel did not offer io_uring at INIT".into(),
            Err(_) => {
                "this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)".into()
            }
        },
        DevFuseReason::Setup(e) => format!("io_uring setup failed: {e}"),
        DevFuseReason::Registration(e) => format!("io_uring registration failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::describe;
    use fuser::{DevFuseReason, Transport};

    #[test]
    fn describes_both_transports() {
        assert_eq!(
            describe(&Transport::IoUring {
                queues: 2,
                entries_per_queue: 4
            }),
            "io_uring (2 queues x 4 entries)"
        );
        assert_eq!(
            describe(&Transport::DevFuse(DevFuseReason::Registration(
                "1 of 8 ring entries failed to register: Invalid argument".into()
            ))),
            "/dev/fuse (io_uring registration failed: 1 of 8 ring entries failed to register: \
             Invalid argument)"
        );
        assert_eq!(
            describe(&Transport::DevFuse(DevFuseReason::NotRequested)),
            "/dev/fuse (transport=devfuse)"
        );
    }
}
