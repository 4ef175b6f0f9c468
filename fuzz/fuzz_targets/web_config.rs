//! The `--web-config-file` parser must return Ok or an error naming the file for any input.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = gpu_exporter::web::config::parse(text, "fuzz.yml") {
            assert!(e.to_string().starts_with("fuzz.yml: "), "{e}");
        }
    }
});
