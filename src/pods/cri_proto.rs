//! Generated code for the read-only CRI runtime v1 subset (`src/pods/proto/cri.proto`, compiled
//! by `build.rs`). Only the CRI client, the fake CRI server and tests use it directly; the rest
//! of the crate sees [`crate::pods::directory::PodDirectory`].
#![allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations
)]

tonic::include_proto!("runtime.v1");
