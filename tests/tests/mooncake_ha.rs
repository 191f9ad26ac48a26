//! Failover of a real high-availability Mooncake cluster under a run of lookups: a
//! real etcd, two real `mooncake_master` processes electing their leader in it, keys
//! written by the real Python client through `etcd://`, and our client following the
//! leader (`spec/mooncake-master-rpc.md`, "High availability"). The leader is killed
//! with SIGKILL in the middle of the run. Needs `scripts/mooncake/install.sh`.

use std::time::{Duration, Instant};

use lookup_tests::mooncake::Writer;
use lookup_tests::mooncake::ha::HaCluster;
use mooncake_master::{MasterClient, MasterConfig, MasterError};

/// Keys stored: the true hit of every lookup.
const PRESENT: usize = 40;
/// Keys each lookup asks about (one call: the last 8 are absent).
const ASKED: usize = 48;
/// `lookup_timeout_s` of the lookups: the client's call timeout.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);
/// Scheduling slack on a loaded 2-core machine before a lookup counts as blocked.
const SLACK: Duration = Duration::from_millis(200);
/// Pause between lookups.
const EVERY: Duration = Duration::from_millis(20);

struct Sample {
    /// Seconds since the kill (negative before it).
    at: f64,
    took: Duration,
    answer: Result<usize, MasterError>,
}

fn keys() -> Vec<String> {
    (0..ASKED).map(|i| format!("ha-block-{i:03}")).collect()
}

/// What the failover looked like, printed for the record.
struct Figures {
    gap: Option<f64>,
    fast_unavailable: usize,
    timed_out: usize,
    zero_answers: usize,
    lookups_after_kill: usize,
    /// The slowest failed lookup.
    slowest_failure: Duration,
}

/// Runs lookups every [`EVERY`], kills the leader after 1 s, and stops when `done`
/// says so (given the samples since the kill) or 25 s after the kill.
async fn failover_run(
    cluster: &mut HaCluster,
    client: &MasterClient,
    done: impl Fn(&[Sample]) -> bool,
) -> (Vec<Sample>, Vec<Sample>) {
    let keys = keys();
    let mut before = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        let t = Instant::now();
        let answer = client.leading_run(&keys).await;
        before.push(Sample {
            at: -(start.elapsed().as_secs_f64()),
            took: t.elapsed(),
            answer,
        });
        tokio::time::sleep(EVERY).await;
    }
    let leader = cluster.leader().expect("a leader before the kill");
    assert_eq!(leader, 0);
    cluster.kill(leader);
    let killed = Instant::now();
    let mut after = Vec::new();
    while !done(&after) && killed.elapsed() < Duration::from_secs(25) {
        let t = Instant::now();
        let answer = client.leading_run(&keys).await;
        after.push(Sample {
            at: t.duration_since(killed).as_secs_f64(),
            took: t.elapsed(),
            answer,
        });
        tokio::time::sleep(EVERY).await;
    }
    (before, after)
}

/// The checks every run must pass: no lookup past the timeout, every answer the true
/// hit, a typed unavailable error, or (when `allow_zero`) 0 from the new leader: it
/// is empty without oplog, and with oplog it reports the replicas unreadable (answers
/// `false`) until their owner has re-mounted its segment on it, ~0.5 s after it opens
/// its port.
fn check_samples(before: &[Sample], after: &[Sample], allow_zero: bool) -> Figures {
    for s in before {
        assert_eq!(
            s.answer.as_ref().ok(),
            Some(&PRESENT),
            "before the kill at {:.3} s",
            s.at
        );
    }
    let mut figures = Figures {
        gap: None,
        fast_unavailable: 0,
        timed_out: 0,
        zero_answers: 0,
        lookups_after_kill: after.len(),
        slowest_failure: Duration::ZERO,
    };
    for s in before.iter().chain(after) {
        assert!(
            s.took <= LOOKUP_TIMEOUT + SLACK,
            "a lookup at {:.3} s took {:?}: {:?}",
            s.at,
            s.took,
            s.answer
        );
        if s.answer.is_err() {
            figures.slowest_failure = figures.slowest_failure.max(s.took);
        }
        match &s.answer {
            Ok(hit) if *hit == PRESENT => {
                if s.at >= 0.0 && figures.gap.is_none() {
                    figures.gap = Some(s.at);
                }
            }
            Ok(0) if allow_zero => figures.zero_answers += 1,
            Ok(hit) => panic!("a lookup at {:.3} s answered {hit} hit keys", s.at),
            Err(e @ MasterError::Timeout { .. }) => {
                figures.timed_out += 1;
                assert!(e.is_unavailable());
            }
            Err(e) => {
                assert!(e.is_unavailable(), "at {:.3} s: {e}", s.at);
                figures.fast_unavailable += 1;
            }
        }
    }
    figures
}

fn client_config(cluster: &HaCluster) -> MasterConfig {
    let mut config = MasterConfig::default();
    config.cluster_id = Some(cluster.cluster_id.clone());
    config.call_timeout = LOOKUP_TIMEOUT;
    // For measuring only: a lower reconnect backoff cap reaches the new leader sooner.
    if let Ok(ms) = std::env::var("HA_BACKOFF_MAX_MS") {
        config.backoff_max = Duration::from_millis(ms.parse().unwrap());
    }
    config
}

fn start_with_keys(oplog: bool) -> (HaCluster, Writer) {
    let cluster = HaCluster::start(oplog);
    let mut writer = Writer::start_at(
        &cluster.addr(),
        &[("MC_STORE_CLUSTER_ID", cluster.cluster_id.as_str())],
    );
    let keys = keys();
    writer.put(&keys[..PRESENT]);
    let mut expected = vec![1; PRESENT];
    expected.resize(ASKED, 0);
    assert_eq!(
        writer.exist(&keys),
        expected,
        "the Python client through etcd://"
    );
    (cluster, writer)
}

#[test]
fn with_oplog_lookups_are_correct_again_within_15_s_of_killing_the_leader() {
    let (mut cluster, _writer) = start_with_keys(true);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = MasterClient::connect(cluster.addr(), client_config(&cluster))
            .await
            .unwrap();
        let leader = client.leader().unwrap();
        assert_eq!(leader.leader.to_string(), cluster.masters[0].addr());
        // Stop after 1 s of correct answers.
        let (before, after) = failover_run(&mut cluster, &client, |after| {
            let Some(first) = after.iter().position(|s| s.answer.as_ref().ok() == Some(&PRESENT)) else {
                return false;
            };
            after.last().unwrap().at - after[first].at > 1.0
        })
        .await;
        let figures = check_samples(&before, &after, true);
        let gap = figures.gap.expect("a correct answer after the kill");
        eprintln!(
            "oplog failover: first correct answer {gap:.3} s after the kill; of {} lookups after it, \
             {} failed fast as unavailable (slowest {:?}), {} timed out, {} answered 0",
            figures.lookups_after_kill,
            figures.fast_unavailable,
            figures.slowest_failure,
            figures.timed_out,
            figures.zero_answers
        );
        assert!(gap < 15.0, "correct again only {gap:.3} s after the kill");
        // Once correct, correct: the new leader has the keys.
        let first = after.iter().position(|s| s.answer.as_ref().ok() == Some(&PRESENT)).unwrap();
        for s in &after[first..] {
            assert_eq!(s.answer.as_ref().ok(), Some(&PRESENT), "at {:.3} s", s.at);
        }
        assert_eq!(cluster.leader(), Some(1));
        assert_eq!(client.leader().unwrap().leader.to_string(), cluster.masters[1].addr());
        assert!(client.leader().unwrap().version > leader.version);
        assert_eq!(client.stats().leader_changes, 1);
    });
}

#[test]
fn without_oplog_the_new_leader_is_empty_and_lookups_say_so() {
    let (mut cluster, mut writer) = start_with_keys(false);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let zeros = rt.block_on(async {
        let client = MasterClient::connect(cluster.addr(), client_config(&cluster))
            .await
            .unwrap();
        // Stop after 1 s of answers from the new leader.
        let (before, after) = failover_run(&mut cluster, &client, |after| {
            let Some(first) = after.iter().position(|s| s.answer.is_ok()) else {
                return false;
            };
            after.last().unwrap().at - after[first].at > 1.0
        })
        .await;
        let figures = check_samples(&before, &after, true);
        assert_eq!(figures.gap, None, "the new leader has no keys");
        let first = after.iter().position(|s| s.answer.is_ok()).unwrap();
        eprintln!(
            "no-oplog failover: the new leader answered {:.3} s after the kill; of {} lookups after \
             it, {} failed fast as unavailable (slowest {:?}), {} timed out",
            after[first].at,
            figures.lookups_after_kill,
            figures.fast_unavailable,
            figures.slowest_failure,
            figures.timed_out
        );
        for s in &after[first..] {
            assert_eq!(s.answer.as_ref().ok(), Some(&0), "at {:.3} s", s.at);
        }
        assert_eq!(client.stats().leader_changes, 1);
        assert_eq!(client.leader().unwrap().leader.to_string(), cluster.masters[1].addr());
        client.leading_run(&keys()).await.unwrap()
    });
    assert_eq!(zeros, 0);
    // The reference client agrees: the keys are gone with the old leader.
    assert_eq!(writer.exist(&keys()), vec![0; ASKED]);
}
