//! The simulator's scenario (TOML timeline) parser must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = gpu_exporter::gpu::sim::scenario::parse(text, "fuzz.toml");
    }
});
