//! The programs against a real high-availability Mooncake cluster through `etcd://`
//! (a real etcd, two real `mooncake_master` processes, blocks written by the real
//! Python client): `lookup-server --mooncake-master etcd://...` answers from the
//! leader etcd names, refuses a reset by default (removing nothing) and, with
//! `--mooncake-reset-remove-all`, removes every key of the tenant as vLLM's
//! `remove_all(force=True)` does; the direct transport, `lookup probe
//! --mooncake-master etcd://...` and `lookup doctor` ask the same leader. Needs
//! `scripts/mooncake/install.sh` (etcd-server and the pinned wheel).

use lookup_tokio::Deadline;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use lookup_core::wire::{self, Format};
use lookup_core::{BlockHashes, Probe, Request, RequestId};
use lookup_tests::KilledOnDrop;
use lookup_tests::mooncake::Writer;
use lookup_tests::mooncake::ha::HaCluster;
use lookup_tests::server::{Req, hit, lookup as lookup_frames};
use lookup_tokio::mooncake_master::MasterConfig;
use lookup_tokio::{
    ClientConfig, DirectConfig, Endpoint, KeyLayout, LookupClient, MasterAddr, RankNamespace,
};
use tempfile::TempDir;

use super::master::lookup;

/// Block size in tokens (vLLM's default).
const B: u32 = 16;
const MODEL: &str = "Qwen/Qwen3-8B";
const TB: Format = Format::TaggedBlob;

fn layout() -> KeyLayout {
    KeyLayout::new(MODEL)
        .with_cache_prefix(Some("vllm".to_owned()))
        .with_namespaces(RankNamespace::grid(2, 1))
        .expect("namespaces")
}

fn keys_of(layout: &KeyLayout, ids: &[u64]) -> Vec<String> {
    layout.chain_keys(&BlockHashes::from_u64s(ids), ids.len())
}

fn hex_of(ids: &[u64]) -> String {
    ids.iter()
        .map(|id| format!("{id:016x}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `lookup-server --mooncake-master etcd://...` on an ipc endpoint in `dir`, with
/// `extra` flags; returns once it printed its endpoint.
async fn lookup_server(
    cluster: &HaCluster,
    dir: &TempDir,
    extra: &[&str],
) -> (KilledOnDrop, Endpoint) {
    let endpoint = Endpoint::Ipc(dir.path().join(format!("lookup-{}.sock", extra.len())));
    let mut child = KilledOnDrop(
        Command::new(env!("CARGO_BIN_EXE_lookup-server"))
            .args(["--bind", &endpoint.url()])
            .args(["--mooncake-master", &cluster.addr()])
            .args(["--mooncake-cluster-id", &cluster.cluster_id])
            .args(["--model", MODEL, "--cache-prefix", "vllm", "--tp-size", "2"])
            .args(["--block-size", &B.to_string()])
            .args(extra)
            // The cluster id comes from the flag, not from the environment.
            .env("MC_STORE_CLUSTER_ID", "not-this-one")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run lookup-server"),
    );
    let stdout = child.0.stdout.take().expect("piped stdout");
    let first_line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    });
    let line = tokio::time::timeout(Duration::from_secs(30), first_line)
        .await
        .expect("lookup-server printed no endpoint within 30 s")
        .expect("join")
        .expect("read stdout");
    assert_eq!(line.trim_end(), endpoint.url());
    (child, endpoint)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_ha_programs_through_etcd_and_reset_by_opt_in_only() {
    let cluster = tokio::task::spawn_blocking(|| HaCluster::start(false))
        .await
        .expect("join");
    let mut writer = Writer::start_at(
        &cluster.addr(),
        &[("MC_STORE_CLUSTER_ID", cluster.cluster_id.as_str())],
    );
    let layout = layout();
    let ids: Vec<u64> = (901..905).collect();
    let keys = keys_of(&layout, &ids);
    writer.put(&keys[..6]);
    let ctx = tmq::Context::new();
    let dir = TempDir::new().expect("temp dir");
    let leader = cluster.masters[cluster.leader().expect("a leader")].addr();

    // The direct transport: the scheduler's process asks the leader itself.
    // The cluster id travels with the address (`MasterAddr`), as the programs' flag does.
    let master =
        MasterAddr::parse(&cluster.addr(), Some(&cluster.cluster_id)).expect("master address");
    let mut direct = DirectConfig::new(master, layout.clone());
    direct.master_config = MasterConfig::default();
    let mut client = LookupClient::connect_lazy(ClientConfig::new(direct, B)).expect("client");
    let req = Request {
        request_id: RequestId(1),
        num_tokens: 65,
        block_hashes: BlockHashes::from_u64s(&ids),
        skip_reading_external_kv: false,
    };
    assert_eq!(
        client.probe_until(&req, 0, Deadline::Answer).await,
        Probe::Ready {
            external_tokens: 48,
            load_async: true
        }
    );
    client.on_finished(req.request_id);
    client.shutdown().await;

    // `lookup probe` and `lookup doctor` through etcd, the cluster id from the flag.
    let through_etcd = |verb: &str| {
        let mut words: Vec<String> = [
            verb,
            "--mooncake-master",
            &cluster.addr(),
            "--mooncake-cluster-id",
            &cluster.cluster_id,
            "--model",
            MODEL,
            "--cache-prefix",
            "vllm",
            "--tp-size",
            "2",
            "--num-tokens",
            "65",
            "--hashes",
            &hex_of(&ids),
        ]
        .iter()
        .map(|w| (*w).to_owned())
        .collect();
        words.push("--timeout-s".to_owned());
        words.push("5".to_owned());
        words
    };
    let out = lookup(through_etcd("probe")).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[..3],
        ["hit_tokens: 48", "outcome: hit", "keys_asked: 8"],
        "{stdout}"
    );
    assert!(
        lines[3].starts_with(&format!("leader: {leader} (view ")),
        "{stdout}"
    );
    assert!(lines[4].starts_with("round_trip_ms: "), "{stdout}");
    let out = lookup(through_etcd("doctor")).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with(&format!(
            "ok reachability: the Mooncake master at {} (leader {leader}, view ",
            cluster.addr()
        )),
        "{stdout}"
    );
    assert!(
        lines.contains(
            &"ok keys: the first block is stored under the configured layout (2 of 2 \
              namespace keys, prefix vllm@Qwen/Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@)"
        ),
        "{stdout}"
    );
    assert_eq!(lines.last(), Some(&"doctor: 5 ok, 0 warn, 0 fail"));

    // Without the flag a reset is refused and every key stays.
    let (server, endpoint) = lookup_server(&cluster, &dir, &[]).await;
    let mut req = Req::connect(&ctx, &endpoint);
    assert_eq!(
        hit(TB, &req.call(&lookup_frames(TB, 65, B, &ids)).await),
        48
    );
    let reply = req.call(&wire::encode_reset(TB).expect("reset")).await;
    assert_eq!(wire::decode_reset_reply(&reply), Ok(false));
    assert_eq!(writer.exist(&keys), [1, 1, 1, 1, 1, 1, 0, 0]);
    assert_eq!(
        hit(TB, &req.call(&lookup_frames(TB, 65, B, &ids)).await),
        48
    );
    drop(req);
    drop(server);

    // With it, a reset removes every key of the tenant, as vLLM's does.
    let (server, endpoint) = lookup_server(&cluster, &dir, &["--mooncake-reset-remove-all"]).await;
    let mut req = Req::connect(&ctx, &endpoint);
    assert_eq!(
        hit(TB, &req.call(&lookup_frames(TB, 65, B, &ids)).await),
        48
    );
    let reply = req.call(&wire::encode_reset(TB).expect("reset")).await;
    assert_eq!(wire::decode_reset_reply(&reply), Ok(true));
    assert_eq!(
        writer.exist(&keys),
        [0; 8],
        "the reference client sees them gone"
    );
    assert_eq!(hit(TB, &req.call(&lookup_frames(TB, 65, B, &ids)).await), 0);
    drop(server);
}
