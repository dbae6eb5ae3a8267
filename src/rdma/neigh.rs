//! What the host's network knows about an IP peer: its link-layer (MAC) address, from the local
//! interfaces (a target on this host) or the kernel's neighbour table (`/proc/net/arp`), and the
//! EUI-64 GUID derived from it. Over RoCE there is no subnet administrator to ask for a target's
//! port GUID; LIO's ib_srpt uses its first HCA's node GUID as the target port id by default, and
//! soft-RoCE (and many RoCE HCAs) derive the node GUID from the netdev's MAC like this, so it is
//! the best first guess for `id_ext` / `ioc_guid` (a wrong guess is rejected at login and says so).

use std::net::IpAddr;
use std::path::Path;

/// The modified EUI-64 of a 48-bit MAC (RFC 4291 appendix A): ff:fe in the middle, the
/// universal/local bit flipped.
pub fn eui64(mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}

/// Parses "aa:bb:cc:dd:ee:ff".
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The MAC of `ip`'s owner: a local interface holding `ip`, else a complete neighbour entry.
pub fn mac_of(ip: IpAddr) -> Option<[u8; 6]> {
    local_mac(ip).or_else(|| neighbour_mac(ip, Path::new("/proc/net/arp")))
}

fn local_mac(ip: IpAddr) -> Option<[u8; 6]> {
    let addrs = nix::ifaddrs::getifaddrs().ok()?;
    let ifname = addrs
        .filter(|a| {
            a.address.as_ref().is_some_and(|s| {
                s.as_sockaddr_in().map(|i| IpAddr::V4(i.ip())) == Some(ip)
                    || s.as_sockaddr_in6().map(|i| IpAddr::V6(i.ip())) == Some(ip)
            })
        })
        .map(|a| a.interface_name)
        .next()?;
    let s = std::fs::read_to_string(format!("/sys/class/net/{ifname}/address")).ok()?;
    parse_mac(&s).filter(|m| *m != [0; 6])
}

/// A complete (flags 0x2) entry for `ip` in an ARP table in `/proc/net/arp`'s format.
pub fn neighbour_mac(ip: IpAddr, table: &Path) -> Option<[u8; 6]> {
    let text = std::fs::read_to_string(table).ok()?;
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let complete = f
            .get(2)
            .and_then(|x| u32::from_str_radix(x.trim_start_matches("0x"), 16).ok())
            .is_some_and(|flags| flags & 0x2 != 0);
        (f.first()?.parse::<IpAddr>().ok()? == ip && complete)
            .then(|| parse_mac(f.get(3)?))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eui64_of_the_lab_mac_is_the_lab_service_guid() {
        // dummy0's MAC in the lab and LIO's srpt_service_guid for the rxe0 on it
        assert_eq!(
            eui64(parse_mac("02:00:00:77:00:01").unwrap()),
            0x0000_00ff_fe77_0001
        );
        assert_eq!(parse_mac("02:00:00:77:00"), None);
        assert_eq!(parse_mac("02:00:00:77:00:01:02"), None);
        assert_eq!(parse_mac("zz:00:00:77:00:01"), None);
    }

    #[test]
    fn arp_table_lookup_wants_a_complete_entry() {
        let dir = std::env::temp_dir().join(format!("srp-ublk-arp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = dir.join("arp");
        std::fs::write(
            &t,
            "IP address       HW type     Flags       HW address            Mask     Device\n\
             10.0.0.7         0x1         0x2         52:54:00:12:34:56     *        eth0\n\
             10.0.0.8         0x1         0x0         00:00:00:00:00:00     *        eth0\n",
        )
        .unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            neighbour_mac(ip("10.0.0.7"), &t),
            Some([0x52, 0x54, 0, 0x12, 0x34, 0x56])
        );
        assert_eq!(neighbour_mac(ip("10.0.0.8"), &t), None, "incomplete entry");
        assert_eq!(neighbour_mac(ip("10.0.0.9"), &t), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
