//! The identifiers udev gives an srp-ublk device (`srp-ublk udev-id`, imported by
//! udev/60-srp-ublk.rules): the same ID_SERIAL / ID_WWN* values udev's scsi_id gives an sd disk of
//! the same LUN (so dm-multipath WWIDs and `/dev/disk/by-id/wwn-*` agree across initiators), vendor
//! and model, and ID_PATH naming the target and LUN for `/dev/disk/by-path/`.

use super::state::DeviceState;
use crate::wire::target::{hex16, TargetSpec, Transport};

/// What udev's scsi_id does to every identifier a target sends (`udev_util_replace_whitespace`,
/// then `udev_util_replace_chars`): trimmed, inner runs of whitespace become one `_`, and anything
/// but `0-9A-Za-z#+-.:=@_` and non-ASCII letters becomes `_`. A target's bytes can then neither add
/// a property line (IMPORT{program} reads `KEY=value` lines) nor leave `/dev/disk/by-id/`.
fn udev_safe(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join("_")
        .chars()
        .map(|c| {
            let ok = c.is_ascii_alphanumeric()
                || "#+-.:=@_".contains(c)
                || (!c.is_ascii() && !c.is_control());
            if ok {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The `KEY=value` lines for `d`, in the order udev imports them.
pub fn udev_properties(d: &DeviceState) -> Vec<(&'static str, String)> {
    let mut p = vec![
        ("ID_TYPE", "disk".to_string()),
        ("ID_VENDOR", udev_safe(&d.vendor)),
        ("ID_MODEL", udev_safe(&d.product)),
    ];
    let wwid = d.wwid.as_deref().map(udev_safe);
    if let Some(w) = wwid
        .as_deref()
        .filter(|w| w.len() > 1 && w.is_char_boundary(1))
    {
        p.push(("ID_SERIAL", w.to_string()));
        p.push(("ID_SERIAL_SHORT", w[1..].to_string()));
        // NAA designators (type 3) are the WWN: 8 bytes, or 16 with the vendor extension
        if let Some(naa) = w.strip_prefix('3') {
            let (wwn, ext) = naa.split_at(naa.len().min(16));
            p.push(("ID_WWN", format!("0x{wwn}")));
            if !ext.is_empty() {
                p.push(("ID_WWN_VENDOR_EXTENSION", format!("0x{ext}")));
            }
            p.push(("ID_WWN_WITH_EXTENSION", format!("0x{naa}")));
        }
    }
    if let Some(s) = d.serial.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        p.push(("ID_SCSI_SERIAL", udev_safe(s)));
    }
    if let Ok(t) = TargetSpec::parse(&d.target) {
        let path = id_path(&t, d.lun);
        p.push(("ID_PATH_TAG", path.replace([':', '.', '[', ']'], "_")));
        p.push(("ID_PATH", path));
        p.push(("ID_SRP_TARGET", TargetSpec { lun: None, ..t }.to_string()));
    }
    p.push(("ID_SRP_LUN", d.lun.to_string()));
    p
}

/// `srp-<id_ext>-<dest IP:port | dgid>-lun-<N>`: what `/dev/disk/by-path/` names the device by.
pub fn id_path(t: &TargetSpec, lun: u64) -> String {
    format!("{}-lun-{lun}", port_path(t))
}

/// `srp-<id_ext>-<dest IP:port | dgid>`: the target port, as [`id_path`] names it (a port
/// daemon's log lines start with it).
pub fn port_path(t: &TargetSpec) -> String {
    let via = match t.transport {
        Transport::RdmaCm { dest, .. } => dest.to_string(),
        Transport::IbCm { dgid, .. } => hex16(&dgid),
    };
    format!("srp-{:016x}-{via}", t.id_ext)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lio_lun() -> DeviceState {
        DeviceState {
            dev_id: 0,
            target: "id_ext=000000fffe770001,ioc_guid=000000fffe770001,dest=10.77.0.1:5555".into(),
            lun: 2,
            vendor: "LIO-ORG ".into(),
            product: "RAMDISK-MCP     ".into(),
            serial: Some("e4ad4d3c-5a1d-4c2b-9c0e-1f0e2d3c4b5a".into()),
            wwid: Some("36001405e4ad4d3c5a1d4c2b9c0e1f0e2".into()),
            ..Default::default()
        }
    }

    #[test]
    fn scsi_id_compatible_properties() {
        let p = udev_properties(&lio_lun());
        let get = |k: &str| p.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("ID_VENDOR"), Some("LIO-ORG"));
        assert_eq!(get("ID_MODEL"), Some("RAMDISK-MCP"));
        assert_eq!(get("ID_SERIAL"), Some("36001405e4ad4d3c5a1d4c2b9c0e1f0e2"));
        assert_eq!(
            get("ID_SERIAL_SHORT"),
            Some("6001405e4ad4d3c5a1d4c2b9c0e1f0e2")
        );
        assert_eq!(get("ID_WWN"), Some("0x6001405e4ad4d3c5"));
        assert_eq!(get("ID_WWN_VENDOR_EXTENSION"), Some("0xa1d4c2b9c0e1f0e2"));
        assert_eq!(
            get("ID_WWN_WITH_EXTENSION"),
            Some("0x6001405e4ad4d3c5a1d4c2b9c0e1f0e2")
        );
        assert_eq!(
            get("ID_PATH"),
            Some("srp-000000fffe770001-10.77.0.1:5555-lun-2")
        );
        assert_eq!(
            get("ID_PATH_TAG"),
            Some("srp-000000fffe770001-10_77_0_1_5555-lun-2")
        );
        assert_eq!(get("ID_SRP_LUN"), Some("2"));
    }

    #[test]
    fn identifiers_a_target_sends_are_sanitised_as_scsi_id_does() {
        let d = DeviceState {
            vendor: " EVIL\tCO ".into(),
            product: "disk/../../x\nID_FS_TYPE=ext4".into(),
            serial: Some("a b/c\n".into()),
            wwid: Some("8iqn.x/../y\nDEVLINKS=/dev/sda".into()),
            ..lio_lun()
        };
        let p = udev_properties(&d);
        let get = |k: &str| p.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("ID_VENDOR"), Some("EVIL_CO"));
        assert_eq!(get("ID_MODEL"), Some("disk_.._.._x_ID_FS_TYPE=ext4"));
        assert_eq!(get("ID_SCSI_SERIAL"), Some("a_b_c"));
        assert_eq!(get("ID_SERIAL"), Some("8iqn.x_.._y_DEVLINKS=_dev_sda"));
        for (k, v) in &p {
            assert!(!v.contains(['/', '\n', ' ']), "{k}={v}");
        }
    }

    #[test]
    fn no_wwid_no_wwn() {
        let d = DeviceState {
            wwid: None,
            serial: None,
            ..lio_lun()
        };
        let p = udev_properties(&d);
        assert!(p
            .iter()
            .all(|(k, _)| !k.starts_with("ID_WWN") && *k != "ID_SERIAL"));
    }
}
