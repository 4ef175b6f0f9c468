//! The seeded hash every simulated value and id comes from: the same seed, GPU, tick and
//! channel always give the same number.

/// splitmix64 of (seed, gpu, tick, channel) mapped to [0, 1).
pub(super) fn hash(seed: u64, gpu: u32, tick: u64, channel: u64) -> f64 {
    let mut z = seed
        ^ (u64::from(gpu).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        ^ tick.wrapping_mul(0xBF58_476D_1CE4_E5B9)
        ^ channel.wrapping_mul(0x94D0_49BB_1331_11EB);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

pub(super) fn uuid(prefix: &str, seed: u64, gpu: u32, sub: u64) -> String {
    let word = |c: u64| (hash(seed, gpu, sub, 100 + c) * 4_294_967_296.0) as u64;
    let (a, b, c, d) = (word(0), word(1), word(2), word(3));
    format!(
        "{prefix}-{a:08x}-{:04x}-{:04x}-{:04x}-{:04x}{c:08x}",
        b >> 16,
        b & 0xffff,
        d >> 16,
        d & 0xffff
    )
}
