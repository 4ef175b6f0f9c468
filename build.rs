//! Compiles the kubelet pod-resources proto with protox (pure Rust; no `protoc` needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "src/pods/proto/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["src/pods/proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
