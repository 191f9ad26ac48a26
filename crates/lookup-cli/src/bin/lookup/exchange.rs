//! One DEALER exchange with a lookup server, after checking that something listens.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use lookup_core::Endpoint;

use crate::{EXIT_FAILED, EXIT_UNREACHABLE, Failure, RPC_ID};

/// Fails with [`EXIT_UNREACHABLE`] when nothing listens at `endpoint`: a missing ipc
/// socket file or a refused tcp port, named in the message
/// ([`lookup_tokio::check_reachable`], the client's own check). ZeroMQ would queue the
/// request and wait the whole timeout instead.
pub(crate) async fn ensure_reachable(endpoint: &Endpoint) -> Result<(), Failure> {
    lookup_tokio::check_reachable(endpoint)
        .await
        .map_err(|why| {
            let hint = match why {
                lookup_tokio::EndpointUnreachable::NoSocketFile(_) => {
                    " (is the lookup server running, and is the path the one it binds?)"
                }
                lookup_tokio::EndpointUnreachable::Refused(_) => {
                    " (is the lookup server running, and is the port the one it binds?)"
                }
                _ => "",
            };
            Failure {
                code: EXIT_UNREACHABLE,
                message: format!("{endpoint} is unreachable: {why}{hint}"),
            }
        })
}

/// Sends `frames` in one `[id, "", frames...]` message over a fresh DEALER (linger 0)
/// and returns the reply's frames after the envelope, with the round-trip time.
pub(crate) async fn exchange(
    endpoint: &Endpoint,
    frames: Vec<Bytes>,
    timeout: Duration,
) -> Result<(Vec<Bytes>, Duration), Failure> {
    let io = |what: &str, e: &dyn std::fmt::Display| Failure {
        code: EXIT_FAILED,
        message: format!("{what} {endpoint}: {e}"),
    };
    let context = tmq::Context::new();
    let mut socket = tmq::dealer(&context)
        .set_linger(0)
        .connect(&endpoint.url())
        .map_err(|e| io("cannot connect to", &e))?;
    let mut message: Vec<tmq::Message> = vec![
        tmq::Message::from(&RPC_ID.to_be_bytes()[..]),
        tmq::Message::new(),
    ];
    message.extend(frames.iter().map(|f| tmq::Message::from(&f[..])));
    let started = Instant::now();
    let exchange = async {
        socket
            .send(message)
            .await
            .map_err(|e| io("cannot send to", &e))?;
        loop {
            let Some(reply) = socket.next().await else {
                return Err(io("connection lost to", &"socket closed"));
            };
            let reply: Vec<Bytes> = reply
                .map_err(|e| io("cannot receive from", &e))?
                .into_iter()
                .map(|m| Bytes::copy_from_slice(&m))
                .collect();
            match reply.as_slice() {
                [id, delimiter, rest @ ..]
                    if id.as_ref() == RPC_ID.to_be_bytes() && delimiter.is_empty() =>
                {
                    return Ok(rest.to_vec());
                }
                // Not ours (cannot happen on a fresh socket): keep waiting.
                _ => tracing::warn!(
                    frames = reply.len(),
                    "dropped a message without our envelope"
                ),
            }
        }
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(reply)) => Ok((reply, started.elapsed())),
        Ok(Err(failure)) => Err(failure),
        Err(_) => Err(Failure {
            code: EXIT_FAILED,
            message: format!(
                "no reply from {endpoint} within {} s",
                timeout.as_secs_f64()
            ),
        }),
    }
}
