//! Listening sockets: Go's `:PORT` (every address, IPv4 and IPv6 on one socket) and systemd
//! socket activation (`--web-systemd-socket`).
//!
//! One of the three modules allowed `unsafe` (the crate documentation lists them), for one
//! block: adopting the descriptor systemd passes (fd 3), which the socket activation protocol
//! makes ours.
#![allow(unsafe_code)]

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Socket, Type};
use tokio::net::TcpListener;

/// The listen backlog asked for; the kernel caps it at `net.core.somaxconn` (4096 by default
/// since Linux 5.4). A long queue keeps a scraper's SYN from being dropped (and retried a second
/// later) while the server works through a burst of new connections.
pub const LISTEN_BACKLOG: u32 = 4096;

pub use crate::listen_on::ListenOn;

/// Errors getting a listening socket.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Binding failed.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `--web-systemd-socket` without the socket activation environment for this process.
    #[error("--web-systemd-socket: {0}")]
    Activation(String),
}

fn bind_socket(addr: SocketAddr, v6_only: Option<bool>) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    if let Some(only) = v6_only {
        socket.set_only_v6(only)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.set_cloexec(true)?;
    socket.bind(&addr.into())?;
    socket.listen(i32::try_from(LISTEN_BACKLOG).unwrap_or(i32::MAX))?;
    TcpListener::from_std(socket.into())
}

/// Binds `on` with [`LISTEN_BACKLOG`] and `SO_REUSEADDR` (as `TcpListener::bind` does): the
/// one way the exporter (and the fleet simulator) gets a TCP listener.
///
/// # Errors
/// [`ListenError::Bind`] naming the address.
pub fn bind(on: ListenOn) -> Result<TcpListener, ListenError> {
    match on {
        ListenOn::Address(addr) => bind_socket(addr, None).map_err(|source| ListenError::Bind {
            addr: addr.to_string(),
            source,
        }),
        ListenOn::AnyAddress(port) => {
            let v6 = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port);
            match bind_socket(v6, Some(false)) {
                Ok(l) => Ok(l),
                // No IPv6 on this host (disabled in the kernel, or no such address family).
                Err(e) if no_ipv6(&e) => {
                    tracing::info!("no IPv6 on this host ({e}); listening on IPv4 only");
                    let v4 = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port);
                    bind_socket(v4, None).map_err(|source| ListenError::Bind {
                        addr: format!(":{port}"),
                        source,
                    })
                }
                Err(source) => Err(ListenError::Bind {
                    addr: format!(":{port} ([::]:{port}, IPv4 and IPv6)"),
                    source,
                }),
            }
        }
    }
}

/// Whether a bind error means the host has no IPv6 (rather than, say, the port being taken).
fn no_ipv6(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(e.kind(), ErrorKind::AddrNotAvailable | ErrorKind::Unsupported)
        // EAFNOSUPPORT (97), EPROTONOSUPPORT (93): the kernel has IPv6 disabled.
        || matches!(e.raw_os_error(), Some(97 | 93))
}

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: i32 = 3;

/// Which inherited descriptor to adopt, from the socket activation environment: `LISTEN_PID`
/// must be this process and `LISTEN_FDS` at least 1. Pure, for tests.
///
/// # Errors
/// What is missing or wrong.
pub fn activation_fd(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    pid: u32,
) -> Result<i32, String> {
    let pid_given =
        listen_pid.ok_or("LISTEN_PID is not set (not started by systemd socket activation)")?;
    if pid_given.trim().parse::<u32>().ok() != Some(pid) {
        return Err(format!(
            "LISTEN_PID={pid_given} is not this process ({pid}); the sockets are another process's"
        ));
    }
    let fds = listen_fds.ok_or("LISTEN_FDS is not set")?.trim();
    let n: u32 = fds.parse().map_err(|e: std::num::ParseIntError| {
        if *e.kind() == std::num::IntErrorKind::PosOverflow {
            format!("LISTEN_FDS={fds} is too large")
        } else {
            format!("LISTEN_FDS={fds:?} is not a number")
        }
    })?;
    if n == 0 {
        return Err("LISTEN_FDS=0: systemd passed no socket".into());
    }
    if n > 1 {
        tracing::warn!(
            "--web-systemd-socket: systemd passed {n} sockets; serving on the first (fd 3)"
        );
    }
    Ok(LISTEN_FDS_START)
}

/// Adopts the listening socket systemd passed (fd 3), after checking `LISTEN_PID` and
/// `LISTEN_FDS` and that the descriptor is a listening TCP socket.
///
/// # Errors
/// [`ListenError::Activation`] saying what is wrong.
pub fn from_systemd() -> Result<TcpListener, ListenError> {
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    let fd = activation_fd(pid.as_deref(), fds.as_deref(), std::process::id())
        .map_err(ListenError::Activation)?;
    // fstat through /proc: the descriptor must exist and be a socket before it is adopted.
    let target = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .map_err(|e| ListenError::Activation(format!("fd {fd} is not open ({e})")))?;
    if !target.to_string_lossy().starts_with("socket:") {
        return Err(ListenError::Activation(format!(
            "fd {fd} is {}, not a socket",
            target.display()
        )));
    }
    use std::os::fd::FromRawFd;
    // SAFETY: LISTEN_PID names this process, so by the socket activation protocol fd 3 was
    // opened for it and nothing else in the process owns it; it is open and a socket (checked
    // above), and it is adopted once: main calls this once, before any other descriptor work.
    let socket = unsafe { Socket::from_raw_fd(fd) };
    check_inherited(&socket, fd)?;
    let bad =
        |what: &str, e: std::io::Error| ListenError::Activation(format!("fd {fd}: {what}: {e}"));
    socket
        .set_cloexec(true)
        .map_err(|e| bad("close-on-exec", e))?;
    socket
        .set_nonblocking(true)
        .map_err(|e| bad("non-blocking", e))?;
    TcpListener::from_std(socket.into()).map_err(|e| bad("registering", e))
}

/// Checks that the inherited `socket` (descriptor `fd`) can serve HTTP: a stream socket, of an
/// IP family, listening (`SO_ACCEPTCONN`). A socket systemd passes with `ListenDatagram=`, or a
/// TCP socket bound but never `listen`ed, would otherwise be logged as listening while every
/// `accept` fails.
///
/// # Errors
/// [`ListenError::Activation`] naming the descriptor and what it is.
fn check_inherited(socket: &Socket, fd: i32) -> Result<(), ListenError> {
    let bad =
        |what: &str, e: std::io::Error| ListenError::Activation(format!("fd {fd}: {what}: {e}"));
    let kind = socket.r#type().map_err(|e| bad("socket type", e))?;
    if kind != Type::STREAM {
        let what = match kind {
            Type::DGRAM => "a datagram (UDP) socket",
            Type::SEQPACKET => "a seqpacket socket",
            Type::RAW => "a raw socket",
            _ => "a socket of another type",
        };
        return Err(ListenError::Activation(format!(
            "fd {fd} is {what}, not a stream (TCP) socket; the systemd socket unit needs ListenStream="
        )));
    }
    let local = socket.local_addr().map_err(|e| bad("local address", e))?;
    let Some(addr) = local.as_socket() else {
        return Err(ListenError::Activation(format!(
            "fd {fd} is not an IP socket (a unix socket cannot serve HTTP to Prometheus here)"
        )));
    };
    if !socket.is_listener().map_err(|e| bad("SO_ACCEPTCONN", e))? {
        return Err(ListenError::Activation(format!(
            "fd {fd} is a TCP socket on {addr} that is not listening (SO_ACCEPTCONN is off); systemd passes listening sockets (ListenStream= with Accept=no)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_needs_this_pid_and_a_socket() {
        assert_eq!(activation_fd(Some("42"), Some("1"), 42), Ok(3));
        assert_eq!(activation_fd(Some("42"), Some("2"), 42), Ok(3));
        assert!(activation_fd(None, Some("1"), 42)
            .unwrap_err()
            .contains("LISTEN_PID is not set"));
        assert!(activation_fd(Some("41"), Some("1"), 42)
            .unwrap_err()
            .contains("not this process"));
        assert!(activation_fd(Some("42"), None, 42)
            .unwrap_err()
            .contains("LISTEN_FDS is not set"));
        assert!(activation_fd(Some("42"), Some("0"), 42)
            .unwrap_err()
            .contains("no socket"));
        assert_eq!(
            activation_fd(Some("42"), Some("99999999999"), 42),
            Err("LISTEN_FDS=99999999999 is too large".to_owned())
        );
        assert_eq!(
            activation_fd(Some("42"), Some("x"), 42),
            Err("LISTEN_FDS=\"x\" is not a number".to_owned())
        );
    }

    #[test]
    fn an_inherited_socket_must_be_a_listening_tcp_socket() {
        let loopback: SocketAddr = (Ipv4Addr::LOCALHOST, 0).into();
        // Bound, never listened on: every accept would fail.
        let bound = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        bound.bind(&loopback.into()).unwrap();
        let at = bound.local_addr().unwrap().as_socket().unwrap();
        let e = check_inherited(&bound, 3).unwrap_err().to_string();
        assert_eq!(
            e,
            format!("--web-systemd-socket: fd 3 is a TCP socket on {at} that is not listening (SO_ACCEPTCONN is off); systemd passes listening sockets (ListenStream= with Accept=no)")
        );
        bound.listen(8).unwrap();
        check_inherited(&bound, 3).unwrap();
        let udp = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
        udp.bind(&loopback.into()).unwrap();
        let e = check_inherited(&udp, 3).unwrap_err().to_string();
        assert!(
            e.contains("fd 3 is a datagram (UDP) socket, not a stream (TCP) socket"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let unix = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
        unix.bind(&socket2::SockAddr::unix(dir.path().join("s")).unwrap())
            .unwrap();
        unix.listen(8).unwrap();
        let e = check_inherited(&unix, 3).unwrap_err().to_string();
        assert!(e.contains("fd 3 is not an IP socket"), "{e}");
    }

    #[tokio::test]
    async fn any_address_serves_ipv4_and_ipv6_on_one_socket() {
        let l = bind(ListenOn::AnyAddress(0)).unwrap();
        let port = l.local_addr().unwrap().port();
        let v4 = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port));
        let (a, b) = tokio::join!(v4, l.accept());
        a.unwrap();
        b.unwrap();
        if l.local_addr().unwrap().is_ipv6() {
            let v6 = tokio::net::TcpStream::connect((Ipv6Addr::LOCALHOST, port));
            let (a, b) = tokio::join!(v6, l.accept());
            a.unwrap();
            b.unwrap();
        }
    }
}
