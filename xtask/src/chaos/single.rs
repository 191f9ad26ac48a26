//! The single-master world of a chaos run: one `mooncake_master` at a fixed loopback
//! port, and its faults in order: `remove` (half of every prompt removed behind the
//! caches, then put back), `wipe` (`RemoveAll(force)` by another client, then all put
//! back) and `restart` (the master killed and started again, empty, at the same
//! address).

use std::path::Path;

use lookup_tokio::mooncake_master::{MasterClient, MasterConfig};
use mooncake_peers::{Master, Writer, free_port};
use tokio::runtime::Runtime;

use super::load::Answer;
use super::server;
use super::truth::Loss;
use super::{Fault, Fleet, Run, pause};

/// Longest wait for a master to listen, seconds.
const MASTER_START_SECS: u64 = 15;

/// The master's flags: its read lease.
fn master_flags(run: &Run) -> Vec<String> {
    vec![format!(
        "-default_kv_lease_ttl={}",
        run.settings.lease.as_millis()
    )]
}

/// Starts the world, runs the selected faults of `faults` in order, and returns the
/// clients' answers.
///
/// # Errors
/// A server or client that cannot start, a wipe the master refuses.
pub fn run(
    runtime: &Runtime,
    run: &mut Run,
    faults: &[Fault],
    server_bin: &Path,
    logs: &Path,
) -> anyhow::Result<Vec<Answer>> {
    let port = free_port();
    let mut master = Master::spawn(port, &master_flags(run));
    master.wait_ready(MASTER_START_SECS);
    let addr = master.addr();
    let mut writer = Writer::start(&master);
    let all = run.prompts.all_keys();
    run.put(&mut writer, &all);
    let (servers, endpoints) = server::pair(
        server_bin,
        &addr,
        None,
        run.settings.lease.as_secs_f64(),
        run.settings.ttl.as_secs_f64(),
        logs,
    )?;
    let fleet = Fleet::start(runtime, run, &addr, None, &endpoints)?;
    run.phase(Fault::Steady);
    pause(run.steady);

    if faults.contains(&Fault::Remove) {
        run.phase(Fault::Remove);
        let tail = run.prompts.tail_keys();
        writer.remove(&tail);
        let at = run.now();
        run.truth.remove(&tail, at, Loss::Removed);
        pause(run.window);
        run.put(&mut writer, &tail);
        // Load on the full store again, so the next fault finds the caches full.
        pause(run.steady);
    }
    if faults.contains(&Fault::Wipe) {
        run.phase(Fault::Wipe);
        // The count it answers says nothing the truth needs: every key goes.
        let _removed = runtime.block_on(async {
            let other = MasterClient::connect(&addr, MasterConfig::default()).await?;
            other.remove_all(true).await
        })?;
        let at = run.now();
        run.truth.remove_all(at, Loss::Removed);
        pause(run.window);
        run.put(&mut writer, &all);
        pause(run.steady);
    }
    if faults.contains(&Fault::Restart) {
        run.phase(Fault::Restart);
        master.stop();
        let at = run.now();
        run.truth.remove_all(at, Loss::Lost);
        pause(run.window / 10);
        master = Master::spawn(port, &master_flags(run));
        master.wait_ready(MASTER_START_SECS);
        // The old writer's client lost its segment with the master: a new one (its
        // keys are gone either way) stays ready for a later put.
        drop(writer);
        writer = Writer::start(&master);
        let since = run.now() - at;
        pause(run.window.saturating_sub(since));
    }
    run.end_phase();
    let answers = fleet.stop(runtime)?;
    drop(servers);
    drop(writer);
    drop(master);
    Ok(answers)
}
