//! Generates the *servers* of the exporter's vendored protos (src/pods/proto of the exporter), for
//! the fake kubelet and the fake container runtime. The messages are the exporter's own
//! (`extern_path`), so a reply built here is the type the exporter's clients decode.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = "../../src/pods/proto";
    let protos = [format!("{dir}/api.proto"), format!("{dir}/cri.proto")];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(&protos, [dir])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .extern_path(".v1", "::gpu_exporter::pods::proto")
        .extern_path(".runtime.v1", "::gpu_exporter::pods::cri_proto")
        .compile_fds(fds)?;
    Ok(())
}
