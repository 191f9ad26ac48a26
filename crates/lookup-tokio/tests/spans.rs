//! The client's tracing (CONTRIBUTING.md rule 11), in a process of its own: tracing's
//! level filter is process-wide, so other tests' clients must not share it.

use std::io;
use std::sync::{Arc, Mutex};

use lookup_core::BlockHashes;
use tracing_subscriber::fmt::format::FmtSpan;

use std::time::{Duration, Instant};

use lookup_core::{Probe, Request, RequestId};
use lookup_server::{InMemoryIndex, KeyLayout, LookupServer, ServerConfig};
use lookup_tokio::{ClientConfig, LookupClient};

/// A log sink the test reads back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// CONTRIBUTING.md rule 11: the lookup's span names the request, its origin and prompt,
/// and when it ends the outcome and hit; the I/O task's `rpc` span is its child.
#[tokio::test(flavor = "current_thread")]
async fn lookup_span_carries_request_and_outcome() {
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_span_events(FmtSpan::CLOSE)
        .with_writer(move || sink.clone())
        .finish();
    // This thread runs the test, the server and the I/O task.
    let _default = tracing::subscriber::set_default(subscriber);

    let layout = KeyLayout::default();
    let index = Arc::new(InMemoryIndex::new());
    let block_hashes = BlockHashes::from_u64s(&[1, 2, 3]);
    index.insert_chain(&layout, &block_hashes, 2);
    let server = LookupServer::bind(
        &"tcp://127.0.0.1:0".parse().expect("endpoint"),
        ServerConfig::new(16, layout),
        index,
    )
    .expect("bind");
    let mut config = ClientConfig::zmq(server.local_endpoint().clone(), 16);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = 4;
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    let req = Request {
        request_id: RequestId(7),
        num_tokens: 50,
        block_hashes,
        skip_reading_external_kv: false,
    };
    client.on_new_request_with_id(&req, "cmpl-42");
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = loop {
        match client.probe(&req, 0) {
            Probe::Pending => {
                assert!(Instant::now() < deadline, "no answer");
                client.wait_progress(Duration::from_millis(20)).await;
            }
            answer => break answer,
        }
    };
    assert_eq!(
        answer,
        Probe::Ready {
            external_tokens: 32,
            load_async: true
        }
    );
    client.on_finished(req.request_id);
    client.shutdown().await;
    server.shutdown().await;

    let text = String::from_utf8(logs.0.lock().expect("log lock").clone()).expect("utf-8");
    let closed = text
        .lines()
        .find(|l| l.contains(" lookup{") && l.contains("}: lookup_tokio::client: close "))
        .unwrap_or_else(|| panic!("no closed lookup span in:\n{text}"));
    for field in [
        "request_id=7",
        "caller_request_id=\"cmpl-42\"",
        "rpc_id=1",
        "origin=\"arrival\"",
        "num_tokens=50",
        "blocks=3",
        "outcome=\"hit\"",
        "hit_tokens=32",
        "requests=1",
        "queue_wait_us=",
        "latency_us=",
    ] {
        assert!(closed.contains(field), "{field} missing from: {closed}");
    }
    assert!(
        text.lines()
            .any(|l| l.contains("lookup{request_id=7") && l.contains("}:rpc{rpc_id=1")),
        "no rpc span under the lookup span in:\n{text}"
    );
}
