//! The metrics CSV parser must return Ok or a file:line error for any input, never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        match gpu_exporter::catalog::parse(text, "fuzz.csv") {
            Ok((catalog, _skipped)) => {
                // Every row kept has a 1-based line inside the input.
                let lines = text.lines().count() as u64 + 1;
                for m in catalog.metrics.iter().chain(&catalog.labels) {
                    assert!(m.line >= 1 && m.line <= lines, "line {} of {lines}", m.line);
                }
            }
            Err(e) => assert!(e.to_string().starts_with("fuzz.csv:"), "{e}"),
        }
    }
});
