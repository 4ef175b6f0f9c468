//! Compiles the vendored protos with protox (pure Rust; no `protoc` needed): the kubelet
//! pod-resources v1 API and the read-only part of the CRI runtime v1 API. Clients only: the
//! fake servers the tests use are generated in crates/gpu-exporter-testing.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["src/pods/proto/api.proto", "src/pods/proto/cri.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, ["src/pods/proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
