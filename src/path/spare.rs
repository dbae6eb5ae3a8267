//! A channel a path gives back while it is up and idle ([`Path::into_channel`]): a [`Spare`],
//! which keeps the path's buffers registered on its login, so that the next path over the channel
//! ([`Path::resume`]: an NBD export's next connection) registers nothing. An export's connections
//! then register their buffers once per channel, not once per connection.

use super::{Connect, Path, PathError};
use crate::channel::{Channel, DataBuf, Login, Memory, Transport};
use crate::rdma::TagBufs;
use crate::session::rport::Rport;

/// A channel that is up and idle, with the buffers the last path over it registered (if any).
pub struct Spare<T: Transport> {
    /// Dropped before the channel (field order), as a path's registrations are: the login still
    /// holds the device while the registration lets go of it.
    kept: Option<Kept<T>>,
    ch: Channel<T>,
}

/// Buffers registered on a spare channel's login, and their descriptors.
struct Kept<T: Memory> {
    bufs: TagBufs,
    reg: T::Registered,
    data: Vec<DataBuf>,
}

impl<T: Transport> Spare<T> {
    /// A channel no path has used yet: nothing registered.
    pub fn new(ch: Channel<T>) -> Spare<T> {
        Spare { ch, kept: None }
    }

    /// The channel's transport (tests reach the fake target through it).
    #[cfg(test)]
    pub(crate) fn transport_mut(&mut self) -> &mut T {
        self.ch.transport()
    }
}

/// A channel a path gave back ([`Path::into_channel`]).
pub enum Returned<T: Transport> {
    /// Up and idle: it can serve another path, over the buffers it keeps.
    Idle(Spare<T>),
    /// Down or stuck, and stopped.
    Lost(Channel<T>),
}

impl<C: Connect> Path<C> {
    /// A path over spare channel `spare`: over the buffers it kept, registered already, or when it
    /// kept none over `fresh()`'s, registered now. A spare's buffers go back to the front end that
    /// made them, which asks for the same shape every time (an NBD export's connections have one
    /// depth and one largest I/O).
    pub fn resume(
        spare: Spare<C::T>,
        connect: C,
        rport: Rport,
        name: String,
        fresh: impl FnOnce() -> TagBufs,
    ) -> Result<Path<C>, PathError> {
        let Spare { ch, kept } = spare;
        match kept {
            Some(k) => Ok(Path::assemble(
                ch,
                connect,
                (k.bufs, Some(k.reg), k.data),
                rport,
                name,
            )),
            None => Path::new(ch, connect, fresh(), rport, name),
        }
    }

    /// Gives the channel back (to a pool) when it is up and idle, with its buffers still
    /// registered unless memory was lent to it (a loan is let go of); otherwise stops it and
    /// returns it as lost (it is closed after a later login).
    pub fn into_channel(self) -> Returned<C::T> {
        let Path {
            mut ch,
            rport,
            reg,
            loan,
            retired,
            bufs,
            data,
            ..
        } = self;
        if !(rport.is_up() && ch.down().is_none() && ch.busy() == 0) {
            ch.transport().stop();
            return Returned::Lost(ch);
        }
        // the invalidations the last completions queued go out
        ch.flush();
        let kept = match reg {
            Some(reg) if loan.is_none() && retired.is_empty() => Some(Kept { bufs, reg, data }),
            reg => {
                ch.transport().release_bufs();
                drop((reg, loan, retired));
                None
            }
        };
        Returned::Idle(Spare { ch, kept })
    }
}
