//! Where the `fake-kubelet` binary is. It belongs to the test-doubles crate
//! (crates/gpu-exporter-testing), and cargo gives a test `CARGO_BIN_EXE_<name>` only for the
//! binaries of its own package, so the tests look for it next to `gpu-exporter` (the same
//! profile of the same target directory). scripts/test-all.sh builds it before the tests.

use std::path::PathBuf;

/// The `fake-kubelet` binary next to this package's `gpu-exporter`.
///
/// # Panics
/// If it is not there, saying how to build it.
pub fn fake_kubelet_bin() -> PathBuf {
    let exporter = PathBuf::from(env!("CARGO_BIN_EXE_gpu-exporter"));
    let path = exporter.with_file_name(format!("fake-kubelet{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "{} is missing: this test runs the fake-kubelet binary of crates/gpu-exporter-testing; \
         build it first with `cargo build -p gpu-exporter-testing --bin fake-kubelet` (the same \
         profile and CARGO_TARGET_DIR as the tests; scripts/test-all.sh does)",
        path.display()
    );
    path
}
