//! Reading the leader's view from etcd through its v3 JSON gateway
//! (`spec/mooncake-master-rpc.md`, "High availability"): `POST /v3/kv/range` with the
//! base64 key, answered with the key's base64 value (`host:port`) and its
//! `create_revision` (the view version).
//!
//! One short HTTP/1.1 connection per read, with a deadline for the whole exchange:
//! reads are rare (at most a few per second while the master is failing, one every
//! [`MasterConfig::view_refresh`](crate::MasterConfig::view_refresh) otherwise), so
//! there is no connection state to keep or repair. Endpoints are tried in turn,
//! starting with the last one that answered.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{Request, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::addr::{Endpoint, EtcdCluster, MasterView};

/// Largest gateway answer read, in bytes: a range of one key is ~300 bytes.
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// The etcd side of a high-availability client: where to ask and what.
#[derive(Debug)]
pub(crate) struct Gateway {
    endpoints: Vec<Endpoint>,
    key: String,
    /// The range request body, built once: `{"key":"<base64 key>"}`.
    request: Bytes,
    timeout: Duration,
    /// Index of the endpoint to try first: the last one that answered.
    preferred: AtomicUsize,
}

impl Gateway {
    pub(crate) fn new(cluster: &EtcdCluster, timeout: Duration) -> Self {
        let key = cluster.master_view_key();
        let request = serde_json::json!({ "key": BASE64.encode(&key) }).to_string();
        Self {
            endpoints: cluster.endpoints().to_vec(),
            key,
            request: Bytes::from(request),
            timeout,
            preferred: AtomicUsize::new(0),
        }
    }

    /// The etcd key read.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The current view: `Ok(None)` when no leader is elected (the key is absent).
    ///
    /// # Errors
    /// Every endpoint failed (unreachable, no answer within the timeout, an HTTP error
    /// or an answer that does not decode): one reason per endpoint, `; `-separated.
    pub(crate) async fn read_view(&self) -> Result<Option<MasterView>, String> {
        let count = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed);
        let mut reasons = Vec::new();
        for i in 0..count {
            let index = (first + i) % count;
            let endpoint = &self.endpoints[index];
            let answer = match tokio::time::timeout(self.timeout, self.range(endpoint)).await {
                Ok(Ok(answer)) => decode_range(&answer),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(format!("no answer within {:?}", self.timeout)),
            };
            match answer {
                Ok(view) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return Ok(view);
                }
                Err(e) => reasons.push(format!("etcd {endpoint}: {e}")),
            }
        }
        Err(reasons.join("; "))
    }

    /// One `POST /v3/kv/range` exchange; the answer's body when the status is 2xx.
    async fn range(&self, endpoint: &Endpoint) -> Result<Bytes, String> {
        let authority = endpoint.to_string();
        let stream = TcpStream::connect(authority.as_str())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| format!("connect: {e}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        // The connection task ends with this exchange, also when the deadline drops it.
        let _connection = AbortOnDrop(tokio::spawn(connection));
        let request = Request::post("/v3/kv/range")
            .header(header::HOST, authority)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(self.request.clone()))
            .map_err(|e| format!("request: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            return Err(format!("HTTP {status}: {text}"));
        }
        Ok(body)
    }
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Decodes a range answer for the view key: `None` without `kvs` (etcd leaves empty
/// fields out), else the first key's value as the leader's `host:port` and its
/// `create_revision` (a decimal string, as the gateway writes 64-bit integers; a
/// number is accepted too) as the version.
///
/// # Errors
/// Not JSON, a value that is not base64 of a valid `host:port`, or a missing or
/// non-positive `create_revision`.
pub(crate) fn decode_range(answer: &[u8]) -> Result<Option<MasterView>, String> {
    let json: serde_json::Value =
        serde_json::from_slice(answer).map_err(|e| format!("answer is not JSON: {e}"))?;
    let Some(kv) = json
        .get("kvs")
        .and_then(serde_json::Value::as_array)
        .and_then(|kvs| kvs.first())
    else {
        return Ok(None);
    };
    let value = kv
        .get("value")
        .and_then(serde_json::Value::as_str)
        .ok_or("the view has no value")?;
    let value = BASE64
        .decode(value)
        .map_err(|e| format!("the view's value is not base64: {e}"))?;
    let value = String::from_utf8(value).map_err(|_| "the view's value is not UTF-8".to_owned())?;
    let leader = Endpoint::parse(&value).map_err(|e| format!("the view names {value:?}: {e}"))?;
    let version = match kv.get("create_revision") {
        Some(serde_json::Value::String(s)) => s.parse::<i64>().ok(),
        Some(serde_json::Value::Number(n)) => n.as_i64(),
        _ => None,
    }
    .filter(|&v| v > 0)
    .ok_or("the view has no positive create_revision")?;
    Ok(Some(MasterView { leader, version }))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Answers of etcd 3.4.23 (Debian) to the range of `mooncake-store/c1/master_view`,
    // while a 0.3.13.post1 master led and before any was elected.
    const PRESENT: &str = r#"{"header":{"cluster_id":"15118495548433857066","member_id":"13668033151171901709","revision":"2","raft_term":"2"},"kvs":[{"key":"bW9vbmNha2Utc3RvcmUvYzEvbWFzdGVyX3ZpZXc=","create_revision":"2","mod_revision":"2","version":"1","value":"MTI3LjAuMC4xOjI1MDUx","lease":"4111120365460641800"}],"count":"1"}"#;
    const ABSENT: &str = r#"{"header":{"cluster_id":"15118495548433857066","member_id":"13668033151171901709","revision":"1","raft_term":"2"}}"#;

    #[test]
    fn decodes_the_real_gateway_answers() {
        let view = decode_range(PRESENT.as_bytes()).unwrap().unwrap();
        assert_eq!(view.leader.to_string(), "127.0.0.1:25051");
        assert_eq!(view.version, 2);
        assert_eq!(decode_range(ABSENT.as_bytes()).unwrap(), None);
        assert_eq!(decode_range(br#"{"kvs":[]}"#).unwrap(), None);
    }

    #[test]
    fn the_request_names_the_key_in_base64() {
        let cluster = match crate::MasterAddr::parse("etcd://127.0.0.1:1", Some("c1")).unwrap() {
            crate::MasterAddr::Etcd(cluster) => cluster,
            other => panic!("{other:?}"),
        };
        let gateway = Gateway::new(&cluster, Duration::from_secs(1));
        assert_eq!(gateway.key(), "mooncake-store/c1/master_view");
        assert_eq!(
            &gateway.request[..],
            br#"{"key":"bW9vbmNha2Utc3RvcmUvYzEvbWFzdGVyX3ZpZXc="}"#
        );
    }

    #[test]
    fn bad_answers_are_errors_not_absent_leaders() {
        let kv = |fields: &str| format!(r#"{{"kvs":[{{{fields}}}]}}"#);
        let cases = [
            (
                "nope".to_owned(),
                "answer is not JSON: expected ident at line 1 column 2",
            ),
            (kv(r#""create_revision":"2""#), "the view has no value"),
            (
                kv(r#""value":"!!","create_revision":"2""#),
                "the view's value is not base64: Invalid symbol 33, offset 0.",
            ),
            (
                kv(r#""value":"/w==","create_revision":"2""#),
                "the view's value is not UTF-8",
            ),
            (
                kv(r#""value":"aG9zdA==","create_revision":"2""#),
                "the view names \"host\": invalid Mooncake master address host: expected host:port",
            ),
            (
                kv(r#""value":"aDox""#),
                "the view has no positive create_revision",
            ),
            (
                kv(r#""value":"aDox","create_revision":"0""#),
                "the view has no positive create_revision",
            ),
        ];
        for (answer, why) in cases {
            assert_eq!(
                decode_range(answer.as_bytes()),
                Err(why.to_owned()),
                "{answer}"
            );
        }
        let number = kv(r#""value":"aDox","create_revision":7"#);
        let view = decode_range(number.as_bytes()).unwrap().unwrap();
        assert_eq!(
            (view.leader.to_string(), view.version),
            ("h:1".to_owned(), 7)
        );
    }
}
