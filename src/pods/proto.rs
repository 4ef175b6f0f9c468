//! Generated code for the kubelet pod-resources v1 API (`src/pods/proto/api.proto`, compiled by
//! `build.rs`). Only the kubelet client, the fake kubelet and tests use it directly; the rest
//! of the crate sees [`crate::pods::Attribution`].
#![allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations
)]

tonic::include_proto!("v1");
