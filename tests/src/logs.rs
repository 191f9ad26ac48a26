//! Log lines captured from this thread: the warnings and notices a user reads, for
//! tests that assert them word for word. Captures what runs on the test's thread, so
//! use it with a current-thread runtime (`#[tokio::test]`), whose spawned tasks (the
//! client's I/O task, the batcher's calls) run there too.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::subscriber::DefaultGuard;
use tracing_subscriber::fmt::MakeWriter;

/// The lines logged at `INFO` and above on this thread while it lives, without
/// timestamps or colours: `LEVEL target: message key=value...`.
pub struct Logs {
    buf: Arc<Mutex<Vec<u8>>>,
    _guard: DefaultGuard,
}

#[derive(Clone)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Buffer {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Logs {
    /// Starts capturing on this thread.
    #[must_use]
    pub fn capture() -> Self {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::fmt()
            .with_writer(Buffer(buf.clone()))
            .with_ansi(false)
            .without_time()
            .with_max_level(tracing::Level::INFO)
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        Self { buf, _guard: guard }
    }

    /// Every line so far.
    #[must_use]
    pub fn lines(&self) -> Vec<String> {
        let bytes = self.buf.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The lines that contain `needle`.
    #[must_use]
    pub fn containing(&self, needle: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|line| line.contains(needle))
            .collect()
    }
}
