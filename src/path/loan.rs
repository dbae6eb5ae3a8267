//! Memory a front end lends the path (a guest's RAM, for the vhost-user front end's zero-copy
//! commands): registered on the channel's device as the path's own buffers are, adopted by every
//! later login on the same device and registered again on another. A loan replaced (a guest's
//! memory table changed) keeps its registration until no command is outstanding, since commands
//! in flight may still name it.

use super::{Connect, Path, PathError};
use crate::channel::{DataBuf, Login, Memory};
use crate::rdma::Lent;

/// A new login's registration of the loan, and its descriptors.
pub(super) type Fresh<C> = (<<C as Connect>::T as Memory>::Registered, Vec<DataBuf>);

/// The memory lent, its registration on the current login's device, and a descriptor per region.
pub(super) struct Loan<R> {
    mem: Lent,
    reg: Option<R>,
    descs: Vec<DataBuf>,
}

impl<C: Connect> Path<C> {
    /// Lends `mem` to the path: registered now when the channel is up, else by its next login.
    /// What was lent before stays registered until no command is outstanding.
    pub fn lend(&mut self, mem: Lent) -> Result<(), PathError> {
        let (reg, descs) = if self.ch.transport().is_stopped() {
            (None, Vec::new())
        } else {
            let (r, d) = self
                .ch
                .transport()
                .register(&mem)
                .map_err(PathError::Register)?;
            (Some(r), d)
        };
        if let Some(old) = self.loan.take().and_then(|l| l.reg) {
            self.retired.push(old);
        }
        self.loan = Some(Loan { mem, reg, descs });
        self.loan_gen = self.loan_gen.wrapping_add(1);
        Ok(())
    }

    /// The lent memory's descriptors (a region's [`DataBuf::spans`], in [`Lent::regions`] order), once a login
    /// registered it: they change only when [`Path::loan_gen`] does.
    pub fn loan(&self) -> Option<(&Lent, &[DataBuf])> {
        let l = self.loan.as_ref()?;
        l.reg.as_ref()?;
        Some((&l.mem, &l.descs))
    }

    /// Bumped whenever the lent memory's descriptors change (a new loan, or a login on another
    /// device).
    pub fn loan_gen(&self) -> u32 {
        self.loan_gen
    }

    /// On a new login: the loan's registration if the login must make one (the old one serves
    /// it when it is on the same device). Err: why it could not register.
    pub(super) fn loan_for(
        &self,
        t: &mut C::T,
    ) -> Result<Option<Fresh<C>>, crate::channel::TransportError> {
        let Some(l) = &self.loan else {
            return Ok(None);
        };
        if l.reg.as_ref().is_some_and(|r| t.adopt(r)) {
            return Ok(None);
        }
        t.register(&l.mem).map(Some)
    }

    /// For a new login's registration of the loan: each old descriptor's local key with its new
    /// descriptor (empty when the old registration serves the new login).
    pub(super) fn loan_rekeys(&self, fresh: &Option<Fresh<C>>) -> Vec<(u32, DataBuf)> {
        let (Some(l), Some((_, new))) = (&self.loan, fresh) else {
            return Vec::new();
        };
        l.descs.iter().zip(new).map(|(o, n)| (o.lkey, *n)).collect()
    }

    /// After a new login: its registration of the loan replaces the old one (which goes after
    /// the old login).
    pub(super) fn loan_registered(&mut self, fresh: Option<Fresh<C>>) {
        if let (Some(l), Some((reg, descs))) = (&mut self.loan, fresh) {
            l.reg = Some(reg);
            l.descs = descs;
            self.loan_gen = self.loan_gen.wrapping_add(1);
        }
    }

    /// The device went away: nothing of the loan stays registered on it.
    pub(super) fn loan_released(&mut self) {
        if let Some(l) = &mut self.loan {
            l.reg = None;
        }
        self.retired.clear();
    }

    /// Registrations of replaced loans go once nothing is outstanding.
    pub(super) fn drop_retired(&mut self) {
        if !self.retired.is_empty() && self.ch.busy() == 0 {
            self.retired.clear();
        }
    }
}
