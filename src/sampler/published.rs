//! What the sampler publishes and `/metrics` serves: the rendered body, gzip-compressed at
//! most once per sample.

use std::io::Write as _;
use std::sync::OnceLock;

use bytes::Bytes;
use tokio::time::Instant;

/// A rendered sample, as served by `/metrics`.
#[derive(Debug, Clone)]
pub struct Published {
    /// The exposition body.
    pub body: Bytes,
    /// When it was taken (monotonic).
    pub at: Instant,
    /// GPU series in it.
    pub series: usize,
    /// Why the GPU source is not ready (device discovery failing, e.g. NVML not loaded yet);
    /// `None` once a discovery has succeeded. `/ready` answers 503 with this text.
    pub not_ready: Option<String>,
    /// The body gzip-compressed, made by the first scrape that asks for it.
    gzip: OnceLock<Bytes>,
}

impl Published {
    /// A published sample.
    pub fn new(body: Bytes, at: Instant, series: usize, not_ready: Option<String>) -> Self {
        Self {
            body,
            at,
            series,
            not_ready,
            gzip: OnceLock::new(),
        }
    }

    /// The body, gzip-compressed. Compressed once per sample, by the first scrape that accepts
    /// gzip (Prometheus always does); later scrapes of the same sample get the same bytes. The
    /// fast level: exposition text shrinks about tenfold at a fraction of the default's cost.
    pub fn gzip_body(&self) -> &Bytes {
        self.gzip.get_or_init(|| {
            let mut enc = flate2::write::GzEncoder::new(
                Vec::with_capacity(self.body.len() / 8 + 64),
                flate2::Compression::fast(),
            );
            let compressed = enc
                .write_all(&self.body)
                .and_then(|()| enc.finish())
                .expect("gzip into a Vec: writing to memory cannot fail");
            Bytes::from(compressed)
        })
    }
}
