//! Decoding an attacker-controlled `Authorization` header must never panic, and whatever
//! decodes must have come from valid base64 of `user:password`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((user, _password)) = gpu_exporter::web::auth::decode_basic(data) {
        assert!(!user.contains(':'));
    }
});
