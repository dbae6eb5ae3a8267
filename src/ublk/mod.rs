//! The ublk driver's I/O commands: FETCH, COMMIT_AND_FETCH and NEED_GET_DATA on an io_uring a
//! queue thread owns ([`Ring`]), and the request descriptors the driver writes ([`Iod`]).
//!
//! A ring serves the queues of any number of devices: the ring keeps a descriptor of each
//! device's char device and each command's user data names its device, so one thread can serve queue
//! q of several devices (libublk 0.4's `UblkQueue` cannot: it keeps one io_uring per thread and
//! encodes every command with fixed file 0 and no device). What the driver may copy a request's
//! data into or out of is memory lent to the ring ([`crate::rdma::Lent`], kept alive as long as
//! the ring): every address a command names is checked against it. Device control (ADD, START,
//! STOP, user recovery) stays libublk's `UblkCtrl`.
//!
//! Like `src/rdma/`, this module speaks a kernel ABI directly and is one of the two places with
//! `unsafe`: pushing SQEs that name memory, and the descriptors' mapping.

mod descs;
mod ring;

pub use descs::Iod;
pub use ring::{Cqe, Dev, QueueSpec, Ring};

/// What the ublk I/O layer can fail on.
#[derive(Debug, thiserror::Error)]
pub enum UblkIoError {
    /// An io_uring system call failed.
    #[error("{what}")]
    Ring {
        /// What the ring was doing.
        what: &'static str,
        /// The system call's error.
        #[source]
        source: std::io::Error,
    },
    /// Mapping a queue's request descriptors from the char device failed.
    #[error("mapping queue {qid}'s request descriptors from the ublk char device")]
    MapDescs {
        /// The queue.
        qid: u16,
        /// The system call's error.
        #[source]
        source: std::io::Error,
    },
    /// The ring serves as many device queues as it was made for.
    #[error("the queue's io_uring already serves {devices} devices")]
    Full {
        /// Its capacity.
        devices: usize,
    },
    /// A command named a device the ring does not serve.
    #[error("no device {dev} on this queue's io_uring")]
    NoDevice {
        /// The index named.
        dev: u16,
    },
    /// A device queue was to leave the ring while the driver still holds its commands.
    #[error("device {dev} on this queue's io_uring has not stopped")]
    Busy {
        /// The index named.
        dev: u16,
    },
    /// A command named a tag past the queue's depth.
    #[error("tag {tag} is past the queue's depth {depth}")]
    NoTag {
        /// The tag named.
        tag: u16,
        /// The depth.
        depth: u16,
    },
    /// A command named data outside the memory lent to the ring.
    #[error("tag {tag}'s data ({len} bytes at {addr:#x}) is not in the queue's buffers")]
    NotLent {
        /// The tag.
        tag: u16,
        /// The address named.
        addr: u64,
        /// Its length.
        len: u32,
    },
}
