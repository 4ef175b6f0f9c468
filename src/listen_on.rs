//! [`ListenOn`]: where the exporter listens, as plain data. The configuration decides it from
//! `-a` and [`crate::http::listen`] binds it; it sits here, below both.

use std::net::SocketAddr;

/// Where to listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenOn {
    /// `:PORT`: every address of both families, on one dual-stack socket (`[::]` with
    /// `IPV6_V6ONLY` off), or IPv4 alone where the host has no IPv6.
    AnyAddress(u16),
    /// An explicit address, as given.
    Address(SocketAddr),
}
