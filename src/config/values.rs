//! Parsers of single flag values: the listen address and the device selection.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, ToSocketAddrs};
use std::num::IntErrorKind;

use super::ConfigError;
use crate::snapshot::DeviceSelection;

/// Parses a Go-style listen address, as Go's `net.Listen("tcp", s)` takes it: `:PORT` means
/// every interface; `HOST:PORT` with an IP address or a name (resolved now; the first IPv4
/// address, as Go listens on, else the first); `[IPv6]:PORT`, with a zone
/// (`[fe80::1%eth0]:9400`, by interface name or index).
///
/// # Errors
/// [`ConfigError::Address`] for a malformed address, [`ConfigError::AddressValue`] for a port
/// out of range, an unknown zone or a name that does not resolve.
pub fn parse_address(s: &str) -> Result<SocketAddr, ConfigError> {
    let bad = || ConfigError::Address(s.to_owned());
    let invalid = |reason: String| ConfigError::AddressValue {
        value: s.to_owned(),
        reason,
    };
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = match port.parse::<u64>() {
        Ok(p) => u16::try_from(p)
            .map_err(|_| invalid(format!("port {p} is too large (at most 65535)")))?,
        Err(e) if *e.kind() == IntErrorKind::PosOverflow => {
            return Err(invalid(format!("port {port} is too large (at most 65535)")))
        }
        Err(_) => return Err(bad()),
    };
    if host.is_empty() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or_else(bad)?;
        let (ip, zone) = match inner.split_once('%') {
            Some((ip, zone)) => (ip, Some(zone)),
            None => (inner, None),
        };
        let ip: Ipv6Addr = ip.parse().map_err(|_| bad())?;
        let scope = match zone {
            None => 0,
            Some(zone) => zone_index(zone).map_err(invalid)?,
        };
        return Ok(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope)));
    }
    if host.contains([':', '[', ']', '%']) {
        return Err(bad());
    }
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok(SocketAddr::new(IpAddr::V4(ip), port));
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| invalid(format!("cannot resolve {host:?}: {e}")))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| invalid(format!("{host:?} resolves to no address")))
}

/// The interface index of an IPv6 zone: a number, or an interface's name.
fn zone_index(zone: &str) -> Result<u32, String> {
    if zone.is_empty() {
        return Err("empty IPv6 zone after '%'".to_owned());
    }
    if zone.bytes().all(|b| b.is_ascii_digit()) {
        return zone
            .parse()
            .map_err(|_| format!("IPv6 zone {zone} is too large (at most 4294967295)"));
    }
    let no_such =
        |e: std::io::Error| format!("IPv6 zone {zone:?}: no such network interface ({e})");
    // SIOCGIFINDEX needs a socket to ask through; any will do.
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).map_err(no_such)?;
    rustix::net::netdevice::name_to_index(&socket, zone).map_err(|e| no_such(e.into()))
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
            x.trim().parse::<u32>().map_err(|e| {
                if *e.kind() == IntErrorKind::PosOverflow {
                    format!("{x:?} is too large for a device id (at most 4294967295)")
                } else {
                    format!("{x:?} is not a device id")
                }
            })
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
