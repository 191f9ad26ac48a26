//! The reference `LookupServer`'s endpoint handling: the ipc socket file (stale file
//! removed at bind, owner-only, gone after shutdown), TCP port 0, and the refusal of
//! non-loopback TCP binds (ZeroMQ has no authentication).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::sync::Arc;

use lookup_core::wire::Format;
use lookup_server::{Endpoint, Error, InMemoryIndex, KeyLayout, LookupServer, ServerConfig};
use lookup_tests::server::{Req, hit, lookup, store};
use tempfile::TempDir;

const B: u32 = 16;

fn config() -> ServerConfig {
    ServerConfig::new(B, KeyLayout::new("m"))
}

#[tokio::test]
async fn stale_ipc_file_is_replaced_and_removed_at_shutdown() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("lookup_rpc_port_0_host_test_dp_rank0");
    // A socket file left behind by a process that died without unlinking it.
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists());

    let index = Arc::new(InMemoryIndex::new());
    let layout = KeyLayout::new("m");
    store(&index, &layout, &[1, 2]);
    let endpoint = Endpoint::Ipc(path.clone());
    let server = LookupServer::bind(&endpoint, config(), index).unwrap();
    assert_eq!(server.local_endpoint(), &endpoint);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the socket file is owner-only");

    let mut req = Req::connect(&tmq::Context::new(), &endpoint);
    assert_eq!(
        hit(
            Format::TaggedBlob,
            &req.call(&lookup(Format::TaggedBlob, 48, B, &[1, 2])).await
        ),
        32
    );

    server.shutdown().await;
    assert!(!path.exists(), "the socket file is unlinked at shutdown");
}

#[tokio::test]
async fn vllm_ipc_path_in_a_missing_directory_is_created_owner_only() {
    let dir = TempDir::new().unwrap();
    let base = dir.path().join("rpc");
    let endpoint = Endpoint::vllm(Some(&base), 0, "node1", 2);
    let server = LookupServer::bind(&endpoint, config(), Arc::new(InMemoryIndex::new())).unwrap();
    let mode = std::fs::metadata(&base).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let path = base.join("lookup_rpc_port_0_host_node1_dp_rank2");
    assert!(path.exists());
    let mut req = Req::connect(&tmq::Context::new(), &endpoint);
    assert_eq!(
        hit(
            Format::MsgpackHex,
            &req.call(&lookup(Format::MsgpackHex, 48, B, &[1])).await
        ),
        0
    );
    server.shutdown().await;
    assert!(!path.exists());
}

#[tokio::test]
async fn a_regular_file_at_the_ipc_path_is_refused_and_kept() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("not-a-socket");
    std::fs::write(&path, b"keep me").unwrap();
    let err = LookupServer::bind(
        &Endpoint::Ipc(path.clone()),
        config(),
        Arc::new(InMemoryIndex::new()),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidServerConfig {
                key: "endpoint",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
}

#[tokio::test]
async fn dropping_the_handle_stops_the_server_and_unlinks_the_file() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("dropped.sock");
    let server = LookupServer::bind(
        &Endpoint::Ipc(path.clone()),
        config(),
        Arc::new(InMemoryIndex::new()),
    )
    .unwrap();
    assert!(path.exists());
    drop(server);
    // The task ends on its own once the handle is gone; wait for it by polling the
    // file, bounded so that a regression fails instead of hanging.
    for _ in 0..1000 {
        if !path.exists() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("the socket file outlived the dropped server by 5 s");
}

#[tokio::test]
async fn a_second_server_can_take_over_the_path() {
    let dir = TempDir::new().unwrap();
    let endpoint = Endpoint::Ipc(dir.path().join("lookup.sock"));
    let first = LookupServer::bind(&endpoint, config(), Arc::new(InMemoryIndex::new())).unwrap();
    first.shutdown().await;

    let index = Arc::new(InMemoryIndex::new());
    store(&index, &KeyLayout::new("m"), &[5]);
    let second = LookupServer::bind(&endpoint, config(), index).unwrap();
    let mut req = Req::connect(&tmq::Context::new(), &endpoint);
    assert_eq!(
        hit(
            Format::TaggedBlob,
            &req.call(&lookup(Format::TaggedBlob, 17, B, &[5])).await
        ),
        16
    );
    second.shutdown().await;
}

#[tokio::test]
async fn a_server_that_lost_its_path_leaves_the_new_file_alone() {
    let dir = TempDir::new().unwrap();
    let endpoint = Endpoint::Ipc(dir.path().join("lookup.sock"));
    let old = LookupServer::bind(&endpoint, config(), Arc::new(InMemoryIndex::new())).unwrap();
    // By default a second server refuses a path the first still listens on.
    let err = LookupServer::bind(&endpoint, config(), Arc::new(InMemoryIndex::new()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("in use by a running server"), "{err}");
    // With take_over it replaces it while the first still runs (as vLLM's bind
    // does: the file is removed and bound again).
    let index = Arc::new(InMemoryIndex::new());
    store(&index, &KeyLayout::new("m"), &[5]);
    let mut take_over = config();
    take_over.take_over = true;
    let new = LookupServer::bind(&endpoint, take_over, index).unwrap();
    old.shutdown().await;
    assert!(
        endpoint.ipc_path().unwrap().exists(),
        "the new server's file was removed"
    );
    let mut req = Req::connect(&tmq::Context::new(), &endpoint);
    assert_eq!(
        hit(
            Format::TaggedBlob,
            &req.call(&lookup(Format::TaggedBlob, 17, B, &[5])).await
        ),
        16
    );
    new.shutdown().await;
    assert!(!endpoint.ipc_path().unwrap().exists());
}

#[tokio::test]
async fn tcp_port_zero_reports_the_chosen_port() {
    let endpoint: Endpoint = "tcp://127.0.0.1:0".parse().unwrap();
    let server = LookupServer::bind(&endpoint, config(), Arc::new(InMemoryIndex::new())).unwrap();
    let Endpoint::Tcp(addr) = server.local_endpoint().clone() else {
        panic!("a tcp endpoint was bound");
    };
    let (host, port) = addr.rsplit_once(':').unwrap();
    assert_eq!(host, "127.0.0.1");
    assert_ne!(port.parse::<u16>().unwrap(), 0);
    let mut req = Req::connect(&tmq::Context::new(), server.local_endpoint());
    assert_eq!(
        hit(
            Format::TaggedBlob,
            &req.call(&lookup(Format::TaggedBlob, 32, B, &[1])).await
        ),
        0
    );
    server.shutdown().await;
}

#[tokio::test]
async fn non_loopback_tcp_binds_are_refused() {
    for url in [
        "tcp://0.0.0.0:0",
        "tcp://*:0",
        "tcp://10.1.2.3:5555",
        "tcp://eth0:5555",
        "tcp://[::]:0",
    ] {
        let endpoint: Endpoint = url.parse().unwrap();
        let err =
            LookupServer::bind(&endpoint, config(), Arc::new(InMemoryIndex::new())).unwrap_err();
        assert!(
            matches!(&err, Error::RemoteBind { endpoint } if endpoint == url),
            "{url}: {err}"
        );
    }
}

#[tokio::test]
async fn ipv6_loopback_is_allowed() {
    let endpoint: Endpoint = "tcp://[::1]:0".parse().unwrap();
    let server = LookupServer::bind(&endpoint, config(), Arc::new(InMemoryIndex::new())).unwrap();
    let mut req = Req::connect(&tmq::Context::new(), server.local_endpoint());
    assert_eq!(
        hit(
            Format::TaggedBlob,
            &req.call(&lookup(Format::TaggedBlob, 32, B, &[1])).await
        ),
        0
    );
    server.shutdown().await;
}

#[test]
fn bind_outside_a_runtime_is_an_error_not_a_panic() {
    let dir = TempDir::new().unwrap();
    let endpoint = Endpoint::Ipc(dir.path().join("lookup.sock"));
    let err = LookupServer::bind(&endpoint, config(), Arc::new(InMemoryIndex::new())).unwrap_err();
    assert!(matches!(err, Error::Io(_)), "{err}");
    assert!(!endpoint.ipc_path().unwrap().exists());
}

#[tokio::test]
async fn localhost_binds_the_loopback_address() {
    let endpoint: Endpoint = "tcp://localhost:0".parse().unwrap();
    let index = Arc::new(InMemoryIndex::new());
    store(&index, &KeyLayout::new("m"), &[5]);
    let server = LookupServer::bind(&endpoint, config(), index).unwrap();
    let Endpoint::Tcp(addr) = server.local_endpoint().clone() else {
        panic!("a tcp endpoint");
    };
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let mut req = Req::connect(&tmq::Context::new(), server.local_endpoint());
    assert_eq!(
        hit(
            Format::TaggedBlob,
            &req.call(&lookup(Format::TaggedBlob, 17, B, &[5])).await
        ),
        16
    );
    server.shutdown().await;
}
