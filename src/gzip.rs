//! Gzip bodies made of parts compressed at different times.
//!
//! A body is compressed once per sample, before it is published. Some of it changes less often
//! than the sample (the accounting families are published on their own interval), and that part
//! should not be compressed again at every sample. Deflate allows it (RFC 1951): a stream is a
//! sequence of blocks, and a block may start at any byte boundary with no reference to what came
//! before it if the part was compressed on its own. So a body is the sample's own text,
//! compressed now and ended with a sync flush (an empty stored block that aligns to a byte and
//! is not final), followed by the kept part's blocks as they were compressed (ending with the
//! final block), in one gzip member (RFC 1952) whose CRC-32 and size cover both texts: the CRC
//! of the whole is combined from the two, without reading the kept text again.
//!
//! The result is one ordinary gzip member: any decoder reads it, not only those that accept
//! several members.

use std::sync::Arc;

use bytes::Bytes;
use flate2::{Compress, Compression, FlushCompress, Status};

/// The gzip member header: deflate, no name or comment, no time, "unknown" OS.
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// Text kept across samples with its compressed form: raw deflate blocks, the last one final,
/// that can follow any stream ended with a sync flush.
#[derive(Debug)]
pub struct Part {
    text: Bytes,
    blocks: Vec<u8>,
    crc: crc32fast::Hasher,
}

impl Part {
    /// `text`, compressed now (at the fast level, as the bodies are).
    pub fn new(text: impl Into<Bytes>) -> Arc<Self> {
        let text = text.into();
        let mut blocks = Vec::with_capacity(text.len() / 8 + 64);
        deflate(&text, FlushCompress::Finish, &mut blocks);
        let mut crc = crc32fast::Hasher::new();
        crc.update(&text);
        Arc::new(Self { text, blocks, crc })
    }

    /// The text.
    pub fn text(&self) -> &[u8] {
        &self.text
    }

    /// Its compressed size, bytes.
    pub fn compressed_len(&self) -> usize {
        self.blocks.len()
    }
}

/// `head` followed by `tail`'s text, as one gzip member: `head` is compressed now, `tail`'s
/// blocks are copied as they are.
pub fn gzip(head: &[u8], tail: Option<&Part>) -> Bytes {
    let tail_len = tail.map_or(0, |t| t.blocks.len());
    let mut out = Vec::with_capacity(HEADER.len() + head.len() / 8 + tail_len + 64);
    out.extend_from_slice(&HEADER);
    let mut crc = crc32fast::Hasher::new();
    crc.update(head);
    match tail {
        None => deflate(head, FlushCompress::Finish, &mut out),
        Some(t) => {
            deflate(head, FlushCompress::Sync, &mut out);
            out.extend_from_slice(&t.blocks);
            crc.combine(&t.crc);
        }
    }
    let size = head.len() + tail.map_or(0, |t| t.text.len());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    // ISIZE is the size modulo 2^32 (RFC 1952 §2.3.1).
    #[allow(clippy::cast_possible_truncation)]
    out.extend_from_slice(&(size as u32).to_le_bytes());
    Bytes::from(out)
}

/// Appends `input` to `out` as raw deflate blocks at the fast level: ended with the final
/// block (`Finish`), or with a sync flush (`Sync`: byte-aligned, not final, so that more
/// blocks may follow).
fn deflate(input: &[u8], flush: FlushCompress, out: &mut Vec<u8>) {
    let mut c = Compress::new(Compression::fast(), false);
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(input.len() / 8 + 1024);
        }
        let read = usize::try_from(c.total_in()).unwrap_or(input.len());
        let status = c
            .compress_vec(&input[read..], out, flush)
            .expect("deflate into memory: the stream is well formed and cannot fail");
        let all_read = usize::try_from(c.total_in()).is_ok_and(|n| n == input.len());
        // Done when all is read and the flush is complete: the final block written, or (for a
        // sync flush) output room left over, which zlib's contract says means nothing is
        // pending.
        let done = match flush {
            FlushCompress::Finish => status == Status::StreamEnd,
            _ => all_read && out.len() < out.capacity(),
        };
        if done {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    fn gunzip(b: &[u8]) -> Vec<u8> {
        // One member only: a decoder that stops at the first member's end must read it all.
        let mut d = flate2::read::GzDecoder::new(b);
        let mut text = Vec::new();
        d.read_to_end(&mut text).expect("a valid gzip member");
        text
    }

    fn sample_text(lines: usize, seed: u64) -> String {
        (0..lines)
            .map(|i| {
                format!(
                    "gpu_exporter_container_energy_joules_total{{gpu=\"{}\",pod=\"p-{i}\"}} {}\n",
                    i % 8,
                    seed.wrapping_mul(i as u64 + 7) % 100_000
                )
            })
            .collect()
    }

    #[test]
    fn a_body_with_a_kept_part_is_one_gzip_member_of_both_texts() {
        for (head_lines, tail_lines) in
            [(0, 0), (0, 5), (5, 0), (300, 3), (3, 2_000), (4_000, 4_000)]
        {
            let head = sample_text(head_lines, 3);
            let tail = Part::new(sample_text(tail_lines, 11));
            let body = gzip(head.as_bytes(), Some(&tail));
            let mut want = head.clone().into_bytes();
            want.extend_from_slice(tail.text());
            assert_eq!(gunzip(&body), want, "{head_lines} + {tail_lines} lines");
            // The kept part's blocks are in the body as they were compressed.
            assert!(body
                .windows(tail.compressed_len())
                .any(|w| w == &tail.blocks[..]));
        }
    }

    #[test]
    fn the_same_part_follows_different_heads_and_shrinks_like_a_whole_body() {
        let tail = Part::new(sample_text(1_000, 5));
        for seed in [1, 2, 3] {
            let head = sample_text(2_000, seed);
            let body = gzip(head.as_bytes(), Some(&tail));
            assert_eq!(gunzip(&body).len(), head.len() + tail.text().len());
            let whole = gzip([head.as_bytes(), tail.text()].concat().as_slice(), None);
            // Compressed apart, the part loses only the matches it could have made into the
            // head: well within a quarter more bytes.
            assert!(
                body.len() < whole.len() * 5 / 4,
                "{} vs {}",
                body.len(),
                whole.len()
            );
        }
    }

    #[test]
    fn a_body_without_a_kept_part_is_plain_gzip() {
        let head = sample_text(500, 9);
        let body = gzip(head.as_bytes(), None);
        assert_eq!(gunzip(&body), head.as_bytes());
        assert!(body.len() < head.len() / 4);
    }
}
