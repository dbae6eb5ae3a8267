//! InfiniBand management datagrams for SRP target discovery, as srp_daemon sends them: Subnet
//! Administration queries (class 0x03, version 2) for the ports that support device management and
//! their node and path records, and Device Management gets (class 0x06, version 1) of IOUnitInfo,
//! IOControllerProfile and ServiceEntries (IBTA vol. 1, 13.4 / 15.2 / 16.3; rdma-core's
//! `srp_daemon/srp_daemon.h` and `<infiniband/umad_*.h>`).
//!
//! A MAD is 256 bytes: the common header (24), then for SA the RMPP header (12), SM_Key (8),
//! AttributeOffset (2), reserved (2), ComponentMask (8) and 200 bytes of records; for DM 40 reserved
//! bytes and 192 bytes of attribute data. Every multi-byte field is big-endian. An SA GetTable answer
//! (reassembled by the kernel's RMPP) is longer: records of `AttributeOffset * 8` bytes from offset 56.
//!
//! [`srp_daemon_line`] turns what the DM gets return into the target string `srp_daemon -o` prints.

use crate::wire::{need, WireError};
use zerocopy::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

/// A MAD without RMPP: 256 bytes.
pub const MAD_SIZE: usize = 256;
/// Where an SA MAD's records start (common + RMPP headers, SM_Key, offset, ComponentMask).
pub const SA_DATA: usize = 56;
/// Where a DM MAD's attribute data starts.
pub const DM_DATA: usize = 64;

/// Management classes.
pub const CLASS_SA: u8 = 0x03;
/// Device Management class.
pub const CLASS_DM: u8 = 0x06;
/// Class versions srp_daemon uses.
pub const SA_CLASS_VERSION: u8 = 2;
/// DM class version.
pub const DM_CLASS_VERSION: u8 = 1;

/// Methods.
pub const METHOD_GET: u8 = 0x01;
/// SubnAdmGetTable.
pub const METHOD_GET_TABLE: u8 = 0x12;
/// The response bit of the method byte.
pub const METHOD_RESP: u8 = 0x80;

/// SA attributes.
pub const ATTR_NODE_RECORD: u16 = 0x0011;
/// PortInfoRecord.
pub const ATTR_PORT_INFO_RECORD: u16 = 0x0012;
/// PathRecord.
pub const ATTR_PATH_RECORD: u16 = 0x0035;
/// DM attributes.
pub const ATTR_IO_UNIT_INFO: u16 = 0x0010;
/// IOControllerProfile (attribute modifier: the controller slot, 1-based).
pub const ATTR_IO_CONTROLLER_PROFILE: u16 = 0x0011;
/// ServiceEntries (attribute modifier: slot << 16 | last << 8 | first).
pub const ATTR_SERVICE_ENTRIES: u16 = 0x0012;

/// PortInfo CapabilityMask bit: IsDeviceManagementSupported.
pub const CAP_IS_DM: u32 = 1 << 19;
/// The SA attribute modifier asking to match the capability mask bits set (srp_daemon's
/// SRP_SM_CAP_MASK_MATCH_ATTR_MOD).
pub const SA_CAP_MASK_MATCH: u32 = 1 << 31;
/// The IO class of SRP r16a targets; anything else is printed as `io_class=` (0xff00: rev. 10).
pub const SRP_REV16A_IO_CLASS: u16 = 0x0100;

macro_rules! wire_struct {
    ($(#[$m:meta])* $name:ident, $size:expr, { $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
        pub(crate) struct $name { $($(#[$fm])* pub(crate) $field: $ty),* }
        const _: () = assert!(core::mem::size_of::<$name>() == $size);
    };
}

wire_struct!(
    /// The common MAD header (13.4.3), 24 bytes.
    RawMadHdr, 24, {
    base_version: u8, mgmt_class: u8, class_version: u8, method: u8, status: U16,
    class_specific: U16, tid: U64, attr_id: U16, reserved: U16, attr_mod: U32,
});

wire_struct!(
    /// The SA header after the common one: RMPP header, SM_Key, AttributeOffset, ComponentMask.
    RawSaHdr, 32, {
    rmpp_version: u8, rmpp_type: u8, rmpp_rtime_flags: u8, rmpp_status: u8, seg_num: U32,
    paylen_newwin: U32, sm_key: U64, attr_offset: U16, reserved: U16, comp_mask: U64,
});

wire_struct!(
    /// PortInfoRecord (15.2.5.3): the record header and PortInfo, 58 bytes (srp_sa_port_info_rec).
    RawPortInfoRecord, 58, {
    endport_lid: U16, port_num: u8, reserved: u8, m_key: U64, subnet_prefix: U64, base_lid: U16,
    master_sm_base_lid: U16, capability_mask: U32, rest: [u8; 30],
});

wire_struct!(
    /// NodeRecord (15.2.5.2), 108 bytes (srp_sa_node_rec).
    RawNodeRecord, 108, {
    lid: U16, reserved: U16, base_version: u8, class_version: u8, node_type: u8, num_ports: u8,
    sys_guid: U64, node_guid: U64, port_guid: U64, partition_cap: U16, device_id: U16,
    revision: U32, port_num_vendor_id: U32, description: [u8; 64],
});

wire_struct!(
    /// PathRecord (15.2.5.16), 64 bytes (ib_path_rec).
    RawPathRecord, 64, {
    service_id: U64, dgid: [u8; 16], sgid: [u8; 16], dlid: U16, slid: U16, hop_flow_raw: U32,
    tclass: u8, num_path: u8, pkey: U16, qos_sl: U16, mtu: u8, rate: u8, pkt_life: u8,
    preference: u8, reserved: [u8; 6],
});

wire_struct!(
    /// IOUnitInfo (16.3.3.3), 132 bytes (srp_dm_iou_info).
    RawIouInfo, 132, {
    change_id: U16, max_controllers: u8, diagid_optionrom: u8, controller_list: [u8; 128],
});

wire_struct!(
    /// IOControllerProfile (16.3.3.4), 128 bytes (srp_dm_ioc_prof).
    RawIocProfile, 128, {
    guid: U64, vendor_id: U32, device_id: U32, device_version: U16, reserved1: U16,
    subsys_vendor_id: U32, subsys_device_id: U32, io_class: U16, io_subclass: U16, protocol: U16,
    protocol_version: U16, reserved2: U32, send_queue_depth: U16, reserved3: u8,
    rdma_read_depth: u8, send_size: U32, rdma_size: U32, cap_mask: u8, reserved4: u8,
    service_entries: u8, reserved5: [u8; 9], id: [u8; 64],
});

wire_struct!(
    /// One ServiceEntry (16.3.3.5): a 40-byte name and a service id, 48 bytes.
    RawServiceEntry, 48, { name: [u8; 40], id: U64 });

/// A request MAD: the common header of a Get or GetTable, 256 bytes with zeros after it.
fn request(
    class: u8,
    version: u8,
    method: u8,
    tid: u64,
    attr_id: u16,
    attr_mod: u32,
) -> [u8; MAD_SIZE] {
    let mut m = [0u8; MAD_SIZE];
    let mut h = RawMadHdr::new_zeroed();
    (h.base_version, h.mgmt_class, h.class_version, h.method) = (1, class, version, method);
    (h.tid, h.attr_id, h.attr_mod) = (tid.into(), attr_id.into(), attr_mod.into());
    m[..24].copy_from_slice(h.as_bytes());
    m
}

/// An SA request with its ComponentMask and, for GetTable, the RMPP header srp_daemon sets
/// (version 1, type DATA).
fn sa_request(method: u8, tid: u64, attr_id: u16, attr_mod: u32, comp_mask: u64) -> [u8; MAD_SIZE] {
    let mut m = request(CLASS_SA, SA_CLASS_VERSION, method, tid, attr_id, attr_mod);
    let mut s = RawSaHdr::new_zeroed();
    s.rmpp_version = u8::from(method == METHOD_GET_TABLE);
    s.rmpp_type = u8::from(method == METHOD_GET_TABLE);
    s.comp_mask = comp_mask.into();
    m[24..SA_DATA].copy_from_slice(s.as_bytes());
    m
}

/// SubnAdmGetTable(PortInfoRecord) for the ports whose CapabilityMask has IsDM (srp_daemon's
/// do_dm_port_list): ComponentMask bit 7 (CapabilityMask), attribute modifier "match the set bits".
pub fn query_dm_ports(tid: u64) -> [u8; MAD_SIZE] {
    let mut m = sa_request(
        METHOD_GET_TABLE,
        tid,
        ATTR_PORT_INFO_RECORD,
        SA_CAP_MASK_MATCH,
        1 << 7,
    );
    let mut rec = RawPortInfoRecord::new_zeroed();
    rec.capability_mask = CAP_IS_DM.into();
    m[SA_DATA..SA_DATA + 58].copy_from_slice(rec.as_bytes());
    m
}

/// SubnAdmGet(NodeRecord) of the node behind `lid` (ComponentMask bit 0, LID): its port GUID.
pub fn query_node(tid: u64, lid: u16) -> [u8; MAD_SIZE] {
    let mut m = sa_request(METHOD_GET, tid, ATTR_NODE_RECORD, 0, 1);
    m[SA_DATA..SA_DATA + 2].copy_from_slice(&lid.to_be_bytes());
    m
}

/// SubnAdmGetTable(PathRecord) from `slid` to `dlid` in partition `pkey` (ComponentMask DLID, SLID,
/// P_Key: bits 4, 5, 13): answered only when the two ports share the partition.
pub fn query_path(tid: u64, slid: u16, dlid: u16, pkey: u16) -> [u8; MAD_SIZE] {
    let mut m = sa_request(
        METHOD_GET_TABLE,
        tid,
        ATTR_PATH_RECORD,
        0,
        1 << 4 | 1 << 5 | 1 << 13,
    );
    let mut rec = RawPathRecord::new_zeroed();
    (rec.dlid, rec.slid, rec.pkey) = (dlid.into(), slid.into(), pkey.into());
    m[SA_DATA..SA_DATA + 64].copy_from_slice(rec.as_bytes());
    m
}

/// DevMgtGet of `attr_id` with `attr_mod`.
pub fn dm_get(tid: u64, attr_id: u16, attr_mod: u32) -> [u8; MAD_SIZE] {
    request(
        CLASS_DM,
        DM_CLASS_VERSION,
        METHOD_GET,
        tid,
        attr_id,
        attr_mod,
    )
}

/// The ServiceEntries attribute modifier for entries `first..=last` of controller `slot`.
pub fn service_entries_mod(slot: u8, first: u8, last: u8) -> u32 {
    u32::from(slot) << 16 | u32::from(last) << 8 | u32::from(first)
}

/// The common header of a received MAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadHdr {
    /// Management class.
    pub mgmt_class: u8,
    /// Method (a response has [`METHOD_RESP`] set).
    pub method: u8,
    /// MAD status (0: success; bits 2-4 an invalid-field code, 8-14 class specific).
    pub status: u16,
    /// Transaction id.
    pub tid: u64,
    /// Attribute id.
    pub attr_id: u16,
}

/// Parses the common header of a response and checks it answers `class`/`attr_id` with status 0.
pub fn parse_response(buf: &[u8], class: u8, attr_id: u16) -> Result<MadHdr, WireError> {
    need("MAD", buf, 24)?;
    let (h, _) = RawMadHdr::read_from_prefix(buf).map_err(|_| WireError::Truncated {
        what: "MAD",
        need: 24,
        got: buf.len(),
    })?;
    let hdr = MadHdr {
        mgmt_class: h.mgmt_class,
        method: h.method,
        status: h.status.get(),
        tid: h.tid.get(),
        attr_id: h.attr_id.get(),
    };
    let invalid = |field, value: u64, rule| WireError::Invalid {
        what: "MAD response",
        field,
        value,
        rule,
    };
    if hdr.mgmt_class != class {
        return Err(invalid(
            "mgmt_class",
            hdr.mgmt_class.into(),
            "another class than asked",
        ));
    }
    if hdr.method & METHOD_RESP == 0 {
        return Err(invalid("method", hdr.method.into(), "not a response"));
    }
    if hdr.attr_id != attr_id {
        return Err(invalid(
            "attr_id",
            hdr.attr_id.into(),
            "another attribute than asked",
        ));
    }
    if hdr.status != 0 {
        return Err(invalid(
            "status",
            hdr.status.into(),
            "the agent refused the request",
        ));
    }
    Ok(hdr)
}

/// The records of an SA response (a GetResp's one record, or a GetTableResp's table): slices of
/// `AttributeOffset * 8` bytes after the SA header. With RMPP active, the first segment's
/// PayloadLength (the SA header's 20 bytes after the RMPP header, then the records) says how many
/// there are; without it, as many as `buf` holds whole.
pub fn sa_records(buf: &[u8]) -> Result<impl Iterator<Item = &[u8]>, WireError> {
    need("SA MAD", buf, SA_DATA)?;
    let (s, _) = RawSaHdr::read_from_prefix(&buf[24..]).map_err(|_| WireError::Truncated {
        what: "SA MAD",
        need: SA_DATA,
        got: buf.len(),
    })?;
    let size = usize::from(s.attr_offset.get()) * 8;
    let mut data = &buf[SA_DATA..];
    if s.rmpp_rtime_flags & 1 != 0 && s.rmpp_type == 1 {
        let payload = (s.paylen_newwin.get() as usize).saturating_sub(20);
        data = &data[..payload.min(data.len())];
    }
    let n = data.len().checked_div(size).unwrap_or(0);
    Ok((0..n).map(move |i| &data[i * size..(i + 1) * size]))
}

/// What discovery needs of a PortInfoRecord.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// The port's LID.
    pub lid: u16,
    /// Its GID prefix.
    pub subnet_prefix: u64,
    /// Its CapabilityMask.
    pub capability_mask: u32,
}

/// Decodes a PortInfoRecord.
pub fn port_info(rec: &[u8]) -> Result<PortInfo, WireError> {
    let r = read::<RawPortInfoRecord>("PortInfoRecord", rec)?;
    Ok(PortInfo {
        lid: r.endport_lid.get(),
        subnet_prefix: r.subnet_prefix.get(),
        capability_mask: r.capability_mask.get(),
    })
}

/// The port GUID of a NodeRecord.
pub fn node_port_guid(rec: &[u8]) -> Result<u64, WireError> {
    Ok(read::<RawNodeRecord>("NodeRecord", rec)?.port_guid.get())
}

/// The P_Key of a PathRecord.
pub fn path_pkey(rec: &[u8]) -> Result<u16, WireError> {
    Ok(read::<RawPathRecord>("PathRecord", rec)?.pkey.get())
}

/// A controller slot's state in IOUnitInfo's ControllerList.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// 0: not installed.
    NotInstalled,
    /// 1: an IO controller is present.
    Present,
    /// 0xf: no slot.
    NoSlot,
    /// Another (reserved) value.
    Other(u8),
}

/// IOUnitInfo: the change id and every controller slot's state (slot 1 first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IouInfo {
    /// ChangeID.
    pub change_id: u16,
    /// Slots 1..=MaxControllers.
    pub slots: Vec<Slot>,
}

impl IouInfo {
    /// The 1-based numbers of the slots with a controller.
    pub fn present(&self) -> impl Iterator<Item = u8> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| **s == Slot::Present)
            .map(|(i, _)| (i + 1) as u8)
    }
}

/// Decodes IOUnitInfo from a DM response (the whole MAD).
pub fn iou_info(mad: &[u8]) -> Result<IouInfo, WireError> {
    let r = read::<RawIouInfo>("IOUnitInfo", dm_data(mad)?)?;
    let slots = (0..usize::from(r.max_controllers))
        .map(
            |i| match (r.controller_list[i / 2] >> (4 * (1 - i % 2))) & 0xf {
                0 => Slot::NotInstalled,
                1 => Slot::Present,
                0xf => Slot::NoSlot,
                v => Slot::Other(v),
            },
        )
        .collect();
    Ok(IouInfo {
        change_id: r.change_id.get(),
        slots,
    })
}

/// What discovery needs of an IOControllerProfile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IocProfile {
    /// The controller's GUID (`ioc_guid=`).
    pub guid: u64,
    /// IEEE vendor id (24 bits).
    pub vendor_id: u32,
    /// Device id.
    pub device_id: u32,
    /// IO class (0x0100 SRP r16a, 0xff00 SRP rev. 10).
    pub io_class: u16,
    /// Largest send message (the target's max_it_iu_len).
    pub send_size: u32,
    /// Number of service entries.
    pub service_entries: u8,
    /// The controller's id string.
    pub id: String,
}

/// Decodes IOControllerProfile from a DM response.
pub fn ioc_profile(mad: &[u8]) -> Result<IocProfile, WireError> {
    let r = read::<RawIocProfile>("IOControllerProfile", dm_data(mad)?)?;
    Ok(IocProfile {
        guid: r.guid.get(),
        vendor_id: r.vendor_id.get() >> 8,
        device_id: r.device_id.get(),
        io_class: r.io_class.get(),
        send_size: r.send_size.get(),
        service_entries: r.service_entries,
        id: c_string(&r.id),
    })
}

/// One service entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceEntry {
    /// Its name ("SRP.T10:<id_ext as 16 hex digits>" for an SRP target port).
    pub name: String,
    /// Its service id (`service_id=`).
    pub id: u64,
}

impl ServiceEntry {
    /// The id_ext an SRP service names ("SRP.T10:" and 16 hex digits), as srp_daemon reads it.
    pub fn srp_id_ext(&self) -> Option<&str> {
        let hex = self.name.strip_prefix("SRP.T10:")?;
        let hex = hex.get(..16).unwrap_or(hex);
        (!hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
    }
}

/// Decodes `count` (1-4) ServiceEntries from a DM response.
pub fn service_entries(mad: &[u8], count: usize) -> Result<Vec<ServiceEntry>, WireError> {
    let data = dm_data(mad)?;
    need("ServiceEntries", data, count.min(4) * 48)?;
    Ok((0..count.min(4))
        .map(|i| {
            let r = RawServiceEntry::read_from_bytes(&data[i * 48..(i + 1) * 48])
                .expect("48 bytes checked above");
            ServiceEntry {
                name: c_string(&r.name),
                id: r.id.get(),
            }
        })
        .collect())
}

/// The target string `srp_daemon -o` prints for one SRP service of a controller reached through
/// port `port_gid` (subnet prefix, port GUID) in partition `pkey`.
pub fn srp_daemon_line(
    id_ext: &str,
    ioc: &IocProfile,
    subnet_prefix: u64,
    port_guid: u64,
    pkey: u16,
    service_id: u64,
) -> String {
    let mut s = format!(
        "id_ext={id_ext},ioc_guid={:016x},dgid={subnet_prefix:016x}{port_guid:016x},pkey={pkey:04x},\
         service_id={service_id:016x}",
        ioc.guid
    );
    if ioc.io_class != SRP_REV16A_IO_CLASS {
        s += &format!(",io_class={:04x}", ioc.io_class);
    }
    s
}

fn dm_data(mad: &[u8]) -> Result<&[u8], WireError> {
    need("DM MAD", mad, DM_DATA)?;
    Ok(&mad[DM_DATA..])
}

fn read<T: FromBytes + KnownLayout + Immutable>(
    what: &'static str,
    b: &[u8],
) -> Result<T, WireError> {
    need(what, b, core::mem::size_of::<T>())?;
    Ok(T::read_from_prefix(b).expect("length checked above").0)
}

/// A NUL-terminated (or full-length) byte string, lossily as UTF-8.
fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

#[cfg(test)]
mod tests;
