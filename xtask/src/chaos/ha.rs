//! The high-availability world of a chaos run: an etcd and two masters electing
//! their leader in it (no oplog: a new leader starts empty), and its faults in
//! order: `leader-kill` (the leader killed; the standby takes over after the etcd
//! lease and its warm-up, ~10 s; every block put again once it serves) and
//! `etcd-down` (etcd killed for `--etcd-down-s`, then started again on its ports and
//! data).
//!
//! What etcd-down does to the store (0.3.13.post1, Debian etcd 3.4.23): the leader
//! keeps its process but closes its RPC port ~5 s into the outage, when its etcd
//! lease can no longer be kept alive; after etcd is back, a master is elected again
//! and serves empty after its warm-up. So the store is lost when the leader stops
//! accepting connections: the judge records the loss at the first failed connect of
//! a poll every 50 ms (the latest the loss can have happened).

use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use mooncake_peers::Writer;
use mooncake_peers::ha::HaCluster;
use tokio::runtime::Runtime;

use super::load::Answer;
use super::server;
use super::truth::Loss;
use super::{Fault, Fleet, Run, pause};

/// Longest wait for the standby to serve after the leader is killed (etcd lease
/// ~4-4.6 s, warm-up 5 s).
const TAKE_OVER: Duration = Duration::from_secs(25);
/// How often the leader's RPC port is tried during an etcd outage.
const POLL: Duration = Duration::from_millis(50);

/// Whether a master accepts connections on `port`.
fn serves(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

/// The Python writer of the cluster.
fn writer(cluster: &HaCluster) -> Writer {
    Writer::start_at(
        &cluster.addr(),
        &[("MC_STORE_CLUSTER_ID", cluster.cluster_id.as_str())],
    )
}

/// Starts the world, runs the selected faults of `faults` in order (`down`: how long
/// etcd stays down), and returns the clients' answers.
///
/// # Errors
/// A server or client that cannot start.
pub fn run(
    runtime: &Runtime,
    run: &mut Run,
    faults: &[Fault],
    down: Duration,
    server_bin: &Path,
    logs: &Path,
) -> anyhow::Result<Vec<Answer>> {
    let flags = [format!(
        "-default_kv_lease_ttl={}",
        run.settings.lease.as_millis()
    )];
    let mut cluster = HaCluster::start_with(false, &flags);
    let addr = cluster.addr();
    let id = cluster.cluster_id.clone();
    let mut store = writer(&cluster);
    let all = run.prompts.all_keys();
    // A store that held something before is not this one: start from nothing.
    run.truth.remove_all(run.now(), Loss::Lost);
    run.put(&mut store, &all);
    let (servers, endpoints) = server::pair(
        server_bin,
        &addr,
        Some(&id),
        run.settings.lease.as_secs_f64(),
        run.settings.ttl.as_secs_f64(),
        logs,
    )?;
    let fleet = Fleet::start(runtime, run, &addr, Some(&id), &endpoints)?;
    run.phase(Fault::SteadyHa);
    pause(run.steady);
    let mut leader = cluster.leader().unwrap_or(0);

    if faults.contains(&Fault::LeaderKill) {
        run.phase(Fault::LeaderKill);
        cluster.kill(leader);
        let at = run.now();
        run.truth.remove_all(at, Loss::Lost);
        // The old writer's segment went with the old leader. Kill the writer now:
        // alive, it would mount its segment again on the new leader, and once killed
        // there its dead segment would take replicas of the new writer's puts
        // (TRANSFER_FAIL) until the master's client lease ran out.
        drop(store);
        let standby = 1 - leader;
        let port = cluster.masters[standby].rpc_port();
        let deadline = Instant::now() + TAKE_OVER;
        while !serves(port) && Instant::now() < deadline {
            pause(POLL);
        }
        leader = standby;
        // A new writer puts every block again on the new leader.
        store = writer(&cluster);
        run.put(&mut store, &all);
        pause(run.window);
    }
    if faults.contains(&Fault::EtcdDown) {
        run.phase(Fault::EtcdDown);
        let port = cluster.masters[leader].rpc_port();
        cluster.etcd.stop();
        let mut lost = false;
        let mut watch = |run: &mut Run, until: Instant| {
            while Instant::now() < until {
                if !lost && !serves(port) {
                    lost = true;
                    let at = run.now();
                    run.truth.remove_all(at, Loss::Lost);
                }
                pause(POLL);
            }
        };
        let window = run.window;
        watch(run, Instant::now() + down);
        cluster.etcd.restart();
        watch(run, Instant::now() + window);
    }
    run.end_phase();
    let answers = fleet.stop(runtime)?;
    drop(servers);
    drop(store);
    drop(cluster);
    Ok(answers)
}
