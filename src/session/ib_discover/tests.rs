//! Discovery against a fake fabric: a subnet manager and the DM agents of target ports, answering
//! each request with the bytes the spec lays out (the same offsets the wire tests pin).

use super::*;
use crate::wire::mad::{DM_DATA, SA_DATA};

struct FakeIoc {
    slot: u8,
    guid: u64,
    io_class: u16,
    services: Vec<(&'static str, u64)>,
}

struct FakePort {
    lid: u16,
    guid: u64,
    is_dm: bool,
    pkeys: Vec<u16>,
    iocs: Vec<FakeIoc>,
    /// its DM agent does not answer
    silent: bool,
}

struct Fabric {
    local: LocalPort,
    ports: Vec<FakePort>,
    asked: Vec<(u8, u16, u16, u32)>,
}

const PREFIX: u64 = 0xfe80_0000_0000_0000;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn answer(req: &[u8; MAD_SIZE], status: u16) -> Vec<u8> {
    let mut r = req.to_vec();
    r[3] |= 0x80;
    r[4..6].copy_from_slice(&status.to_be_bytes());
    r
}

/// An SA answer holding `recs` records of `size` bytes (RMPP when it is a GetTable).
fn sa_answer(req: &[u8; MAD_SIZE], size: usize, recs: &[Vec<u8>]) -> Vec<u8> {
    let mut r = answer(req, 0);
    r.truncate(SA_DATA);
    r[44..46].copy_from_slice(&((size / 8) as u16).to_be_bytes());
    if req[3] == mad::METHOD_GET_TABLE {
        r[26] = 1;
        r[32..36].copy_from_slice(&((20 + size * recs.len()) as u32).to_be_bytes());
    }
    for rec in recs {
        let mut x = rec.clone();
        x.resize(size, 0);
        r.extend_from_slice(&x);
    }
    r.resize(r.len().max(MAD_SIZE), 0);
    r
}

impl MadPort for Fabric {
    fn local(&self) -> &LocalPort {
        &self.local
    }

    fn query(
        &mut self,
        agent: Agent,
        lid: u16,
        _pkey_index: u16,
        req: &[u8; MAD_SIZE],
        what: &'static str,
    ) -> Result<Vec<u8>, UmadError> {
        let (class, attr) = (req[1], be16(req, 16));
        let attr_mod = u32::from_be_bytes(req[20..24].try_into().unwrap());
        self.asked.push((class, lid, attr, attr_mod));
        let timeout = || UmadError::Timeout {
            what,
            lid,
            ms: 5000,
            tries: 3,
        };
        match agent {
            Agent::Sa => {
                assert_eq!((class, lid), (mad::CLASS_SA, self.local.sm_lid));
                match attr {
                    mad::ATTR_PORT_INFO_RECORD => {
                        assert_eq!(
                            u32::from_be_bytes(req[80..84].try_into().unwrap()),
                            mad::CAP_IS_DM
                        );
                        let recs: Vec<Vec<u8>> = self
                            .ports
                            .iter()
                            .map(|p| {
                                let mut r = vec![0u8; 58];
                                r[..2].copy_from_slice(&p.lid.to_be_bytes());
                                r[12..20].copy_from_slice(&PREFIX.to_be_bytes());
                                let cap: u32 = if p.is_dm { mad::CAP_IS_DM } else { 0 };
                                r[24..28].copy_from_slice(&cap.to_be_bytes());
                                r
                            })
                            .collect();
                        Ok(sa_answer(req, 64, &recs))
                    }
                    mad::ATTR_NODE_RECORD => {
                        let want = be16(req, SA_DATA);
                        let p = self
                            .ports
                            .iter()
                            .find(|p| p.lid == want)
                            .ok_or_else(timeout)?;
                        let mut r = vec![0u8; 108];
                        r[..2].copy_from_slice(&p.lid.to_be_bytes());
                        r[24..32].copy_from_slice(&p.guid.to_be_bytes());
                        Ok(sa_answer(req, 112, &[r]))
                    }
                    mad::ATTR_PATH_RECORD => {
                        assert_eq!(be16(req, SA_DATA + 42), self.local.lid, "SLID");
                        let (dlid, pkey) = (be16(req, SA_DATA + 40), be16(req, SA_DATA + 50));
                        let p = self
                            .ports
                            .iter()
                            .find(|p| p.lid == dlid)
                            .ok_or_else(timeout)?;
                        if !p.pkeys.contains(&pkey) {
                            return Ok(answer(req, 0x0300)); // ERR_NO_RECORDS
                        }
                        let mut r = vec![0u8; 64];
                        r[50..52].copy_from_slice(&pkey.to_be_bytes());
                        Ok(sa_answer(req, 64, &[r]))
                    }
                    a => panic!("unexpected SA attribute {a:#x}"),
                }
            }
            Agent::Dm => {
                assert_eq!(class, mad::CLASS_DM);
                let p = self
                    .ports
                    .iter()
                    .find(|p| p.lid == lid)
                    .ok_or_else(timeout)?;
                if p.silent {
                    return Err(UmadError::Timeout {
                        what,
                        lid,
                        ms: 5000,
                        tries: 3,
                    });
                }
                let mut r = answer(req, 0);
                let d = DM_DATA;
                match attr {
                    mad::ATTR_IO_UNIT_INFO => {
                        let max = p.iocs.iter().map(|i| i.slot).max().unwrap_or(0);
                        r[d + 2] = max;
                        for i in &p.iocs {
                            let s = usize::from(i.slot - 1);
                            r[d + 4 + s / 2] |= 1 << (4 * (1 - s % 2));
                        }
                    }
                    mad::ATTR_IO_CONTROLLER_PROFILE => {
                        let i = p
                            .iocs
                            .iter()
                            .find(|i| u32::from(i.slot) == attr_mod)
                            .ok_or_else(timeout)?;
                        r[d..d + 8].copy_from_slice(&i.guid.to_be_bytes());
                        r[d + 28..d + 30].copy_from_slice(&i.io_class.to_be_bytes());
                        r[d + 44..d + 48].copy_from_slice(&8276u32.to_be_bytes());
                        r[d + 54] = i.services.len() as u8;
                    }
                    mad::ATTR_SERVICE_ENTRIES => {
                        let (slot, last, first) =
                            (attr_mod >> 16, (attr_mod >> 8) & 0xff, attr_mod & 0xff);
                        let i = p
                            .iocs
                            .iter()
                            .find(|i| u32::from(i.slot) == slot)
                            .ok_or_else(timeout)?;
                        assert!(last - first < 4 && (last as usize) < i.services.len());
                        for (k, (name, id)) in i.services[first as usize..=last as usize]
                            .iter()
                            .enumerate()
                        {
                            let o = d + k * 48;
                            r[o..o + name.len()].copy_from_slice(name.as_bytes());
                            r[o + 40..o + 48].copy_from_slice(&id.to_be_bytes());
                        }
                    }
                    a => panic!("unexpected DM attribute {a:#x}"),
                }
                Ok(r)
            }
        }
    }
}

fn fabric() -> Fabric {
    Fabric {
        local: LocalPort {
            device: "mlx5_0".into(),
            port: 1,
            lid: 1,
            sm_lid: 2,
            pkeys: vec![(0, 0xffff), (1, 0x8001)],
        },
        ports: vec![
            // a target with two controllers; five services on the first (two ServiceEntries
            // MADs), one of them not SRP
            FakePort {
                lid: 0x10,
                guid: 0x0002_c903_0000_0011,
                is_dm: true,
                pkeys: vec![0xffff],
                iocs: vec![
                    FakeIoc {
                        slot: 1,
                        guid: 0x0002_c903_0000_0010,
                        io_class: 0x0100,
                        services: vec![
                            ("SRP.T10:0002c90300000010", 0x0002_c903_0000_0010),
                            ("NFS/RDMA", 0x1234),
                            ("SRP.T10:0002c90300000020", 0x0002_c903_0000_0020),
                            ("SRP.T10:0002c90300000030", 0x0002_c903_0000_0030),
                            ("SRP.T10:0002c90300000040", 0x0002_c903_0000_0040),
                        ],
                    },
                    FakeIoc {
                        slot: 3,
                        guid: 0x0002_c903_0000_0310,
                        io_class: 0xff00,
                        services: vec![("SRP.T10:0002c90300000310", 0x0002_c903_0000_0310)],
                    },
                ],
                silent: false,
            },
            // a switch or host without device management: never asked
            FakePort {
                lid: 0x20,
                guid: 0x20,
                is_dm: false,
                pkeys: vec![0xffff],
                iocs: vec![],
                silent: false,
            },
            // a target port in partition 0x8001 only
            FakePort {
                lid: 0x30,
                guid: 0x0002_c903_0000_0031,
                is_dm: true,
                pkeys: vec![0x8001],
                iocs: vec![FakeIoc {
                    slot: 1,
                    guid: 0x0002_c903_0000_0030,
                    io_class: 0x0100,
                    services: vec![("SRP.T10:0002C90300000030", 0x0002_c903_0000_0030)],
                }],
                silent: false,
            },
            // a target port whose DM agent does not answer: skipped, the others still found
            FakePort {
                lid: 0x40,
                guid: 0x41,
                is_dm: true,
                pkeys: vec![0xffff],
                iocs: vec![],
                silent: true,
            },
        ],
        asked: Vec::new(),
    }
}

#[test]
fn finds_every_srp_service_as_srp_daemon_prints_it() {
    let mut f = fabric();
    let found = discover(&mut f).unwrap();
    let lines: Vec<&str> = found.targets.iter().map(|t| t.line.as_str()).collect();
    assert_eq!(
        lines,
        [
            "id_ext=0002c90300000010,ioc_guid=0002c90300000010,dgid=fe800000000000000002c90300000011,pkey=ffff,service_id=0002c90300000010",
            "id_ext=0002c90300000020,ioc_guid=0002c90300000010,dgid=fe800000000000000002c90300000011,pkey=ffff,service_id=0002c90300000020",
            "id_ext=0002c90300000030,ioc_guid=0002c90300000010,dgid=fe800000000000000002c90300000011,pkey=ffff,service_id=0002c90300000030",
            "id_ext=0002c90300000040,ioc_guid=0002c90300000010,dgid=fe800000000000000002c90300000011,pkey=ffff,service_id=0002c90300000040",
            "id_ext=0002c90300000310,ioc_guid=0002c90300000310,dgid=fe800000000000000002c90300000011,pkey=ffff,service_id=0002c90300000310,io_class=ff00",
            "id_ext=0002C90300000030,ioc_guid=0002c90300000030,dgid=fe800000000000000002c90300000031,pkey=8001,service_id=0002c90300000030",
        ]
    );
    // every line is a target string srp-ublk takes
    for l in &lines {
        crate::wire::target::TargetSpec::parse(l).unwrap();
    }
    assert_eq!(found.skipped.len(), 1, "{:?}", found.skipped);
    assert!(found.skipped[0].contains("LID 0x40") && found.skipped[0].contains("no answer"));
    // the port without device management: its DM agent never asked
    assert!(!f.asked.iter().any(|&(_, lid, _, _)| lid == 0x20));
    assert!(f.asked.iter().any(|&(_, lid, _, _)| lid == 0x10));
    // five services: entries 0-3, then 4-4, of controller 1
    let svc: Vec<u32> = f
        .asked
        .iter()
        .filter(|&&(c, lid, a, _)| {
            c == mad::CLASS_DM && lid == 0x10 && a == mad::ATTR_SERVICE_ENTRIES
        })
        .map(|&(_, _, _, m)| m)
        .collect();
    assert_eq!(svc, [0x0001_0300, 0x0001_0404, 0x0003_0000]);
}

#[test]
fn a_refused_port_table_is_an_error() {
    struct Refusing(LocalPort);
    impl MadPort for Refusing {
        fn local(&self) -> &LocalPort {
            &self.0
        }
        fn query(
            &mut self,
            _: Agent,
            _: u16,
            _: u16,
            req: &[u8; MAD_SIZE],
            _: &'static str,
        ) -> Result<Vec<u8>, UmadError> {
            Ok(answer(req, 0x0004)) // invalid field
        }
    }
    let e = discover(&mut Refusing(fabric().local)).unwrap_err();
    let e = crate::Chain(&e).to_string();
    assert!(e.contains("status"), "{e}");
}

#[test]
fn a_bare_guid_names_a_target() {
    let t = find_guid(&mut fabric(), 0x0002_c903_0000_0310)
        .unwrap()
        .unwrap();
    assert!(
        t.line
            .starts_with("id_ext=0002c90300000310,ioc_guid=0002c90300000310,"),
        "{}",
        t.line
    );
    // by id_ext (a service of controller 1)
    let t = find_guid(&mut fabric(), 0x0002_c903_0000_0040)
        .unwrap()
        .unwrap();
    assert!(t.line.contains("service_id=0002c90300000040"), "{}", t.line);
    let none = find_guid(&mut fabric(), 0xdead).unwrap().unwrap_err();
    assert_eq!(none.targets.len(), 6);
}
