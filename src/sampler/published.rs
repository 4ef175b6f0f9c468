//! What the sampler publishes and `/metrics` serves: the rendered body and the same body
//! gzip-compressed, both made by the sampler before the sample is published.

use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;

use crate::gzip::{self, Part};

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
    /// The body gzip-compressed, made with it.
    gzip: Bytes,
}

impl Published {
    /// A published sample; compresses `body` (on the caller's thread: the sampler's), so that
    /// no scrape compresses it or waits for another scrape to.
    pub fn new(body: Bytes, at: Instant, series: usize, not_ready: Option<String>) -> Self {
        let gzip = gzip::gzip(&body, None);
        Self {
            body,
            at,
            series,
            not_ready,
            gzip,
        }
    }

    /// A published sample whose body is `head` (rendered for this sample) followed by `tail`
    /// (kept from an earlier one, already compressed: only `head` is compressed here).
    pub fn with_tail(
        head: String,
        tail: Option<Arc<Part>>,
        at: Instant,
        series: usize,
        not_ready: Option<String>,
    ) -> Self {
        let gzip = gzip::gzip(head.as_bytes(), tail.as_deref());
        let mut body = head.into_bytes();
        if let Some(t) = &tail {
            body.extend_from_slice(t.text());
        }
        Self {
            body: Bytes::from(body),
            at,
            series,
            not_ready,
            gzip,
        }
    }

    /// The body, gzip-compressed (made by [`Published::new`]); every scrape that accepts gzip
    /// (Prometheus always does) gets the same bytes.
    pub fn gzip_body(&self) -> &Bytes {
        &self.gzip
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    #[test]
    fn the_gzip_body_is_made_when_the_sample_is_published() {
        // Issue 35 item 13: the first scrape of a sample compressed it, inside a OnceLock that
        // blocked the scrapes beside it. Now the compressed bytes exist before any scrape.
        let body = Bytes::from("# TYPE x gauge\nx 1\n".repeat(100));
        let p = Published::new(body.clone(), Instant::now(), 1, None);
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(&p.gzip[..])
            .read_to_end(&mut text)
            .expect("a gzip member");
        assert_eq!(text, body);
        assert!(p.gzip.len() < body.len() / 4);
        assert_eq!(p.gzip_body().as_ptr(), p.gzip.as_ptr(), "the same bytes");
    }
}
