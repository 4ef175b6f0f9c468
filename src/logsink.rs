//! The log's writer: stderr that can never fail the code that logs.
//!
//! A log line that cannot be written (stderr is a pipe whose reader exited: a log shipper
//! restarting, `kubectl logs -f` piped into a closed `head`) is dropped and counted, never
//! reported as an error. tracing-subscriber answers a failed write with `eprintln!`, which
//! panics when stderr is broken, killing whichever thread logged (the sampler, the signal
//! handler). With this writer no write ever fails, so that path is never taken.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tracing_subscriber::fmt::MakeWriter;

/// Makes [`SinkWriter`]s over what `open` returns (stderr in the binary), counting the writes
/// that failed in a shared counter (`gpu_exporter_log_write_errors_total`).
#[derive(Debug, Clone)]
pub struct LogSink<F> {
    open: F,
    failed: Arc<AtomicU64>,
}

impl LogSink<fn() -> io::Stderr> {
    /// Writes to the process's stderr.
    pub fn stderr() -> Self {
        Self::new(io::stderr)
    }
}

impl<F> LogSink<F> {
    /// Writes to what `open` returns for each log line.
    pub fn new(open: F) -> Self {
        Self {
            open,
            failed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The count of failed writes (log lines lost, or parts of them).
    pub fn failed(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.failed)
    }
}

impl<'a, F, W> MakeWriter<'a> for LogSink<F>
where
    F: Fn() -> W + 'a,
    W: Write,
{
    type Writer = SinkWriter<'a, W>;

    fn make_writer(&'a self) -> Self::Writer {
        SinkWriter {
            inner: (self.open)(),
            failed: &self.failed,
        }
    }
}

/// One log line's writer: passes bytes on, and swallows (and counts) every error.
#[derive(Debug)]
pub struct SinkWriter<'a, W> {
    inner: W,
    failed: &'a AtomicU64,
}

impl<W: Write> Write for SinkWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            match self.inner.write(buf) {
                // A writer that accepts nothing would make `write_all` fail: treat as lost.
                Ok(0) if !buf.is_empty() => break,
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.failed.fetch_add(1, Ordering::Relaxed);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.inner.flush().is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose reader has gone, as stderr into a closed pipe.
    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
    }

    #[test]
    fn failed_writes_are_counted_not_returned() {
        let sink = LogSink::new(|| Broken);
        let mut w = sink.make_writer();
        assert!(w.write_all(b"a log line\n").is_ok());
        assert!(w.flush().is_ok());
        assert_eq!(sink.failed().load(Ordering::Relaxed), 2);
    }

    #[test]
    fn logging_through_a_broken_writer_neither_panics_nor_fails() {
        let sink = LogSink::new(|| Broken);
        let failed = sink.failed();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(sink)
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..3 {
                tracing::error!(i, "nobody reads this");
            }
        });
        assert_eq!(failed.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn good_writes_pass_through() {
        let out = Arc::new(std::sync::Mutex::new(Vec::new()));
        struct Shared(Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let o = Arc::clone(&out);
        let sink = LogSink::new(move || Shared(Arc::clone(&o)));
        sink.make_writer().write_all(b"line\n").unwrap();
        assert_eq!(&*out.lock().unwrap(), b"line\n");
        assert_eq!(sink.failed().load(Ordering::Relaxed), 0);
    }
}
