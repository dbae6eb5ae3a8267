//! Socket addresses for librdmacm: IP (`sockaddr_in`/`sockaddr_in6`) for RDMA/CM logins, and
//! `sockaddr_ib` (AF_IB, `<infiniband/ib.h>`) for the IB CM form (`dgid, pkey, service_id`), which
//! carries the full 64-byte SRP_LOGIN_REQ as private data with the RDMA_PS_IB port space.

use std::net::SocketAddr;
use zerocopy::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Linux AF_IB.
pub const AF_IB: u16 = 27;
/// librdmacm's RDMA_PS_IB port space.
pub const RDMA_PS_IB: u32 = 0x013f;
/// librdmacm's RDMA_PS_TCP port space.
pub const RDMA_PS_TCP: u32 = 0x0106;

/// `struct sockaddr_ib` (48 bytes). Multi-byte fields are big-endian except the family and scope id,
/// which are host order as in the C header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct SockaddrIb {
    /// AF_IB (host order).
    pub sib_family: u16,
    /// Partition key.
    pub sib_pkey: U16,
    /// Flow label.
    pub sib_flowinfo: U32,
    /// Destination GID.
    pub sib_addr: [u8; 16],
    /// Service id.
    pub sib_sid: U64,
    /// Service id mask.
    pub sib_sid_mask: U64,
    /// Scope id (host order).
    pub sib_scope_id: u64,
}
const _: () = assert!(core::mem::size_of::<SockaddrIb>() == 48);

/// The AF_IB address of an IB CM target: its GID, P_Key and SRP service id.
pub fn ib_sockaddr(dgid: [u8; 16], pkey: u16, service_id: u64) -> SockaddrIb {
    SockaddrIb {
        sib_family: AF_IB,
        sib_pkey: pkey.into(),
        sib_flowinfo: 0.into(),
        sib_addr: dgid,
        sib_sid: service_id.into(),
        sib_sid_mask: u64::MAX.into(),
        sib_scope_id: 0,
    }
}

/// A `sockaddr_ib` in a `sockaddr_storage`, for rdma_resolve_addr.
pub(super) fn ib_storage(sib: &SockaddrIb) -> libc::sockaddr_storage {
    let mut ss = zeroed_storage();
    store(&mut ss, sib);
    ss
}

/// The IB CM service id of an RDMA/CM connection to TCP-port-space port `port`
/// (`RDMA_PS_TCP << 16 | port`; 0x10615b3 for LIO's usual 5555).
pub fn rdma_cm_service_id(port: u16) -> u64 {
    (u64::from(RDMA_PS_TCP) << 16) | u64::from(port)
}

/// An IP socket address as `sockaddr_storage` for librdmacm.
pub(super) fn ip_sockaddr(addr: SocketAddr) -> libc::sockaddr_storage {
    // all-zero is a valid sockaddr_storage; the family and fields are set below
    let mut ss: libc::sockaddr_storage = zeroed_storage();
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            store(&mut ss, &sin);
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            store(&mut ss, &sin6);
        }
    }
    ss
}

/// A copy of the socket address at `a`, with its port (IP) or service id (AF_IB) cleared: the
/// same local address, for another id to bind to. `None` for a family librdmacm does not use.
///
/// # Safety
/// `a` points to a valid socket address of its family's length.
pub(super) unsafe fn unported(a: *const libc::sockaddr) -> Option<libc::sockaddr_storage> {
    // SAFETY: every socket address starts with its family (the caller's promise).
    let family = unsafe { (*a).sa_family };
    let len = match i32::from(family) {
        libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
        _ if family == AF_IB => std::mem::size_of::<SockaddrIb>(),
        _ => return None,
    };
    let mut ss = zeroed_storage();
    // SAFETY: `a` holds `len` bytes (its family's length, the caller's promise), and `ss` is
    // larger than any of these; the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(a as *const u8, &mut ss as *mut _ as *mut u8, len) };
    if family == AF_IB {
        let bytes = &mut ss_bytes(&mut ss)[..len];
        let mut sib = SockaddrIb::read_from_bytes(bytes).ok()?;
        (sib.sib_sid, sib.sib_sid_mask) = (0.into(), 0.into());
        bytes.copy_from_slice(sib.as_bytes());
    } else {
        // sin_port and sin6_port: the two bytes after the family
        ss_bytes(&mut ss)[2..4].fill(0);
    }
    Some(ss)
}

fn ss_bytes(ss: &mut libc::sockaddr_storage) -> &mut [u8] {
    // SAFETY: sockaddr_storage is plain bytes (integers only); the slice borrows it mutably.
    unsafe {
        std::slice::from_raw_parts_mut(
            ss as *mut _ as *mut u8,
            std::mem::size_of::<libc::sockaddr_storage>(),
        )
    }
}

fn zeroed_storage() -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is a plain C struct of integers; all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

fn store<T: Copy>(ss: &mut libc::sockaddr_storage, v: &T) {
    const { assert!(std::mem::size_of::<T>() <= std::mem::size_of::<libc::sockaddr_storage>()) };
    // SAFETY: T (sockaddr_in / sockaddr_in6) fits in sockaddr_storage (asserted above), which is
    // designed to hold any socket address; both are plain C structs and the write is unaligned-safe.
    unsafe { std::ptr::write_unaligned(ss as *mut libc::sockaddr_storage as *mut T, *v) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn sockaddr_ib_layout_and_bytes() {
        assert_eq!(offset_of!(SockaddrIb, sib_pkey), 2);
        assert_eq!(offset_of!(SockaddrIb, sib_flowinfo), 4);
        assert_eq!(offset_of!(SockaddrIb, sib_addr), 8);
        assert_eq!(offset_of!(SockaddrIb, sib_sid), 24);
        assert_eq!(offset_of!(SockaddrIb, sib_sid_mask), 32);
        assert_eq!(offset_of!(SockaddrIb, sib_scope_id), 40);
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[15] = 0xd5;
        let s = ib_sockaddr(gid, 0xffff, 0x2001_00a0_b811_46a1);
        let b = s.as_bytes();
        assert_eq!(&b[0..2], &27u16.to_ne_bytes());
        assert_eq!(&b[2..4], &[0xff, 0xff]);
        assert_eq!(&b[8..24], &gid);
        assert_eq!(
            &b[24..32],
            &[0x20, 0x01, 0x00, 0xa0, 0xb8, 0x11, 0x46, 0xa1]
        );
        assert_eq!(&b[32..40], &[0xff; 8]);
    }

    /// The service id seen on the wire for LIO's port 5555 (REPORT.md section 6).
    #[test]
    fn rdma_cm_service_id_matches_capture() {
        assert_eq!(rdma_cm_service_id(5555), 0x0000_0000_0106_15b3);
    }

    #[test]
    fn an_unported_address_keeps_the_host_and_drops_the_port() {
        for a in ["10.0.0.2:5555", "[fe80::1%2]:5555"] {
            let a: SocketAddr = a.parse().unwrap();
            let ss = ip_sockaddr(a);
            // SAFETY: ss holds a valid address of its family.
            let mut u = unsafe { unported(&ss as *const _ as *const libc::sockaddr) }.unwrap();
            let mut want = ip_sockaddr(SocketAddr::new(a.ip(), 0));
            if let SocketAddr::V6(mut v6) = a {
                v6.set_port(0);
                want = ip_sockaddr(SocketAddr::V6(v6));
            }
            assert_eq!(ss_bytes(&mut u), ss_bytes(&mut want), "{a}");
        }
        let ib = ib_storage(&ib_sockaddr([7; 16], 0xffff, 0x0a));
        // SAFETY: ib holds a valid sockaddr_ib.
        let mut u = unsafe { unported(&ib as *const _ as *const libc::sockaddr) }.unwrap();
        let sib = SockaddrIb::read_from_bytes(&ss_bytes(&mut u)[..48]).unwrap();
        assert_eq!(
            (sib.sib_addr, sib.sib_sid.get(), sib.sib_sid_mask.get()),
            ([7; 16], 0, 0)
        );
    }

    #[test]
    fn ip_sockaddr_v4_and_v6() {
        let ss = ip_sockaddr("10.77.0.1:5555".parse().unwrap());
        assert_eq!(ss.ss_family, libc::AF_INET as libc::sa_family_t);
        let ss6 = ip_sockaddr("[fe80::1]:5555".parse().unwrap());
        assert_eq!(ss6.ss_family, libc::AF_INET6 as libc::sa_family_t);
    }
}
