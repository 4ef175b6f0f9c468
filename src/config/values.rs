//! Parsers of single flag values: the listen address and the device selection.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::ConfigError;
use crate::snapshot::DeviceSelection;

/// Parses a Go-style listen address: `:9400` means every interface.
///
/// # Errors
/// [`ConfigError::Address`].
pub fn parse_address(s: &str) -> Result<SocketAddr, ConfigError> {
    let bad = || ConfigError::Address(s.to_owned());
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    match host {
        "localhost" => Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)),
        _ => Err(bad()),
    }
}

/// Parses `-d/--devices`.
///
/// # Errors
/// [`ConfigError::Devices`] saying what is wrong.
pub fn parse_devices(s: &str) -> Result<DeviceSelection, ConfigError> {
    let err = |reason: String| ConfigError::Devices {
        value: s.to_owned(),
        reason,
    };
    let (kind, ids) = match s.split_once(':') {
        Some((k, ids)) => (k, Some(ids)),
        None => (s, None),
    };
    let ids = ids
        .map(|list| parse_id_list(list).map_err(&err))
        .transpose()?;
    match (kind, ids) {
        ("f", None) => Ok(DeviceSelection::Flex),
        ("f", Some(_)) => Err(err("`f` takes no ids".to_owned())),
        ("g", ids) => Ok(DeviceSelection::Gpus(ids)),
        ("i", ids) => Ok(DeviceSelection::Instances(ids)),
        (other, _) => Err(err(format!(
            "unknown device type {other:?}; expected f, g[:ids] or i[:ids]"
        ))),
    }
}

fn parse_id_list(list: &str) -> Result<Vec<u32>, String> {
    let mut ids = Vec::new();
    for part in list.split(',') {
        let part = part.trim();
        let num = |x: &str| {
            x.trim()
                .parse::<u32>()
                .map_err(|_| format!("{x:?} is not a device id"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("range {part:?} is backwards"));
                }
                if b - a > 4096 {
                    return Err(format!("range {part:?} is too large"));
                }
                ids.extend(a..=b);
            }
            None => ids.push(num(part)?),
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}
