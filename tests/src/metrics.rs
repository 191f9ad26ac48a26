//! Reading a Prometheus exposition the way a scraper does (plain HTTP on loopback),
//! its samples checked exactly, and one raw exchange with a lookup server: what the
//! metrics tests of the client, the server and the `lookup-server` program share.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use lookup_core::Endpoint;

/// How long [`call`] waits for its reply.
const LIMIT: Duration = Duration::from_secs(20);

/// A loopback address whose port was free a moment ago.
pub fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr")
}

/// `GET /metrics` over a plain TCP stream; the body of a 200 answer.
pub fn scrape_blocking(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to the exporter");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    // HTTP/1.0: the answer is the whole body up to EOF, never chunked.
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send the request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .expect("an HTTP header and body");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "scrape answered {head}"
    );
    body.to_owned()
}

/// [`scrape_blocking`] off the runtime's threads.
pub async fn scrape(addr: SocketAddr) -> String {
    tokio::task::spawn_blocking(move || scrape_blocking(addr))
        .await
        .expect("join")
}

/// The value of the sample `series` (name and labels as the exposition writes them).
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().expect("a number"))
    })
}

/// Asserts exact sample values.
pub fn expect(text: &str, samples: &[(&str, f64)]) {
    let wrong: Vec<String> = samples
        .iter()
        .filter(|(series, want)| value(text, series) != Some(*want))
        .map(|(series, want)| format!("{series}: want {want}, got {:?}", value(text, series)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{}\n--- exposition:\n{text}",
        wrong.join("\n")
    );
}

/// One request/reply exchange with a lookup server over a DEALER socket: the reply's
/// frames after the envelope.
pub async fn call(endpoint: &Endpoint, frames: &[&[u8]]) -> Vec<Bytes> {
    let mut socket = tmq::dealer(&tmq::Context::new())
        .set_linger(0)
        .connect(&endpoint.url())
        .expect("connect a dealer");
    let mut message: Vec<tmq::Message> = vec![
        tmq::Message::from(&7u64.to_be_bytes()[..]),
        tmq::Message::new(),
    ];
    message.extend(frames.iter().map(|f| tmq::Message::from(*f)));
    socket.send(message).await.expect("send");
    let reply = tokio::time::timeout(LIMIT, socket.next())
        .await
        .expect("a reply in time")
        .expect("a message")
        .expect("no socket error");
    reply
        .into_iter()
        .skip(2)
        .map(|m| Bytes::copy_from_slice(&m))
        .collect()
}
