//! One replay: per (mode, transport) a fresh master, writer, transport and engines,
//! run in real time; the master's counters scraped around it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lookup_server::{LookupServer, MooncakeIndex, ServerConfig};
use lookup_tokio::mooncake_master::MasterConfig;
use lookup_tokio::{ClientConfig, DirectConfig, Endpoint, KeyLayout, LookupClient, RankNamespace};

use super::engine::{BlockSink, Engine, EngineResult, Prepared};
use super::peers::{self, Master, Writer};
use super::report::{RunSummary, summarise};
use super::{MasterSource, ReplayParams, ReplayReport, Transport};
use crate::simulate::mode::Mode;
use crate::simulate::store::{KV_BLOCK_TOKENS, blocks_for};
use crate::simulate::trace::TraceRequest;

/// Replays `trace` once per mode and transport (modes outer, transports inner).
///
/// # Errors
/// Invalid parameters; the master or the Python writer cannot be started (naming
/// `scripts/mooncake/install.sh` when missing) or the writer fails mid-run; the
/// lookup server or a client cannot be set up; an empty trace.
pub fn replay(trace: &[TraceRequest], params: &ReplayParams) -> anyhow::Result<ReplayReport> {
    params.validate()?;
    if trace.is_empty() {
        bail!("the trace has no requests");
    }
    let m = &params.engine;
    for (i, r) in trace.iter().enumerate() {
        let outputs = r.output_length.min(m.max_output_tokens.max(1)).max(1);
        let need = blocks_for(r.input_length + outputs);
        if need > m.gpu_kv_blocks {
            bail!(
                "request {} ({} input + {outputs} output tokens) needs {need} KV blocks of \
                 {KV_BLOCK_TOKENS} tokens; the GPU has {} (--gpu-kv-blocks)",
                i + 1,
                r.input_length,
                m.gpu_kv_blocks
            );
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let mut runs = Vec::new();
    for &mode in &params.modes {
        for &transport in &params.transports {
            let run = runtime.block_on(run_one(trace, params, mode, transport, runs.len()))?;
            runs.push(run);
        }
    }
    Ok(ReplayReport {
        requests: trace.len(),
        rate_scale: params.rate_scale,
        engines: params.engines,
        runs,
    })
}

/// One run of `mode` over `transport`.
/// The lookup core's configuration of every client of a run: `mode`'s settings
/// (shared with the simulator) at the run's vLLM block size.
///
/// The simulator counts in the trace's 512-token blocks, and `Mode::config` says so;
/// a replay hashes prompts and writes store keys at `params.block_size` (16 by
/// default), and the lookup server, the direct transport and the core's reply guard
/// (`spec/behaviour.md` rule 11: a hit must be whole blocks) must count in the same
/// blocks. With 512 here, a 16-token-aligned hit from the server (16, 32 tokens)
/// failed the guard and ended as malformed, and the direct transport asked for one
/// key per 512 tokens while each key stood for 16, claiming 32 times the tokens it
/// had found.
pub(crate) fn client_core(mode: Mode, params: &ReplayParams) -> lookup_core::Config {
    let mut core = mode.config(&params.lookup, params.max_in_flight);
    core.block_size = params.block_size;
    core
}

async fn run_one(
    trace: &[TraceRequest],
    params: &ReplayParams,
    mode: Mode,
    transport: Transport,
    run_no: usize,
) -> anyhow::Result<RunSummary> {
    let dir = tempfile::Builder::new()
        .prefix("xtask-replay-")
        .tempdir()
        .context("creating a temp dir")?;
    let master = match &params.master {
        MasterSource::Start(bin) => Master::start(bin, dir.path())?,
        MasterSource::External { addr, metrics } => Master::external(addr.clone(), metrics.clone()),
    };
    let python = params.python.clone();
    let (addr, log_dir) = (master.addr.clone(), dir.path().to_path_buf());
    let writer = tokio::task::spawn_blocking(move || Writer::start(&python, &addr, &log_dir))
        .await
        .context("joining the writer's start")??;
    // A model name of the run's own: blocks of earlier runs (on a shared master) never
    // answer this run's lookups.
    let model = format!(
        "replay-{}-{run_no}-{}-{}",
        std::process::id(),
        mode,
        transport.name()
    );
    let layout = KeyLayout::new(model)
        .with_namespaces(RankNamespace::grid(params.tp_size, 1))
        .context("rank namespaces")?;
    // The transport's server side: our lookup server for `zmq`, nothing for `direct`.
    let mut server: Option<LookupServer> = None;
    let mut index: Option<Arc<MooncakeIndex>> = None;
    let mut configs = Vec::with_capacity(params.engines as usize);
    let core = client_core(mode, params);
    match transport {
        Transport::Zmq => {
            let mooncake = Arc::new(
                MooncakeIndex::connect(&master.addr, MasterConfig::default())
                    .await
                    .with_context(|| format!("connecting the index to {}", master.addr))?,
            );
            let endpoint = Endpoint::Ipc(dir.path().join("lookup.sock"));
            let bound = LookupServer::bind(
                &endpoint,
                ServerConfig::new(params.block_size, layout.clone()),
                mooncake.clone(),
            )
            .context("binding the lookup server")?;
            for _ in 0..params.engines {
                let mut config =
                    ClientConfig::zmq(bound.local_endpoint().clone(), params.block_size);
                config.core = core.clone();
                configs.push(config);
            }
            server = Some(bound);
            index = Some(mooncake);
        }
        Transport::Direct => {
            for _ in 0..params.engines {
                let direct = DirectConfig::parse(&master.addr, layout.clone())?;
                let mut config = ClientConfig::new(direct, params.block_size);
                config.core = core.clone();
                configs.push(config);
            }
        }
    }
    let before = scrape(&master).await;

    let label = format!("{}/{}", mode.name(), transport.name());
    let bar = progress_bar(params.progress, trace.len() as u64, &label)?;
    let on_finished = || bar.inc(1);
    // Clients connect before the clock starts, so that the first arrivals do not pay
    // for it.
    let mut clients = Vec::with_capacity(configs.len());
    for config in configs {
        clients.push(LookupClient::connect_lazy(config).context("connecting a lookup client")?);
    }
    let t0 = Instant::now() + Duration::from_millis(200);
    let reqs = Prepared::from_trace(
        trace,
        t0,
        params.rate_scale,
        params.engine.max_output_tokens,
        params.block_size,
    );
    let sink = BlockSink {
        tx: writer.sender().context("the writer's queue")?,
        written: Arc::new(Mutex::new(Default::default())),
        layout: layout.clone(),
    };
    let n = params.engines as usize;
    let engines: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(e, client)| {
            let arrivals: VecDeque<usize> = (e..reqs.len()).step_by(n).collect();
            Engine::new(
                &params.engine,
                mode,
                params.lookup.wait_budget,
                &reqs,
                arrivals,
                client,
                sink.clone(),
                &on_finished,
                params.block_size,
                t0,
            )
            .run()
        })
        .collect();
    let results = join_all(engines).await;
    drop(sink);
    bar.finish_and_clear();
    let writer = tokio::task::spawn_blocking(move || writer.finish())
        .await
        .context("joining the writer")??;
    if let Some(failure) = &writer.failure {
        bail!("the Python store client failed during {label}: {failure}");
    }
    let after = scrape(&master).await;
    let batch_exist_calls = match &index {
        Some(index) => index.stats().master.batch_exist_calls,
        None => results
            .iter()
            .filter_map(|r| r.stats.master.map(|m| m.batch_exist_calls))
            .sum(),
    };
    if let Some(server) = server.take() {
        server.shutdown().await;
    }
    drop(master);
    Ok(summarise(
        mode,
        transport,
        trace.len(),
        t0,
        &results,
        &writer,
        batch_exist_calls,
        master_figures(before.as_ref(), after.as_ref()),
    ))
}

/// Runs every engine to its end, concurrently, as futures of the calling task (they
/// borrow the run's requests, so they are not spawned); results in engine order.
async fn join_all<F: Future<Output = EngineResult>>(engines: Vec<F>) -> Vec<EngineResult> {
    let mut engines: Vec<Pin<Box<F>>> = engines.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<EngineResult>> = engines.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, engine) in done.iter_mut().zip(engines.iter_mut()) {
            if slot.is_none() {
                match engine.as_mut().poll(cx) {
                    Poll::Ready(result) => *slot = Some(result),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

/// The master's series, or nothing (with a warning) when its metrics cannot be read.
async fn scrape(master: &Master) -> Option<HashMap<String, f64>> {
    let metrics = master.metrics.clone()?;
    match tokio::task::spawn_blocking(move || peers::scrape(&metrics)).await {
        Ok(Ok(found)) => Some(found),
        Ok(Err(e)) => {
            eprintln!("warning: master metrics not read: {e:#}");
            None
        }
        Err(e) => {
            eprintln!("warning: master metrics not read: {e}");
            None
        }
    }
}

/// Counters as differences over the run, gauges as read at its end.
fn master_figures(
    before: Option<&HashMap<String, f64>>,
    after: Option<&HashMap<String, f64>>,
) -> BTreeMap<String, f64> {
    let Some(after) = after else {
        return BTreeMap::new();
    };
    after
        .iter()
        .map(|(name, &v)| {
            let was = if name.ends_with("_total") {
                before.and_then(|b| b.get(name)).copied().unwrap_or(0.0)
            } else {
                0.0
            };
            (name.clone(), v - was)
        })
        .collect()
}

fn progress_bar(show: bool, total: u64, label: &str) -> anyhow::Result<ProgressBar> {
    let target = if show {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{label} {{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} requests"
        ))
        .context("progress template")?
        .progress_chars("=> "),
    );
    Ok(bar)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_counters_are_differences_and_gauges_are_read_at_the_end() {
        let before: HashMap<String, f64> = [
            ("master_batch_exist_key_requests_total".to_owned(), 10.0),
            ("master_key_count".to_owned(), 5.0),
        ]
        .into();
        let after: HashMap<String, f64> = [
            ("master_batch_exist_key_requests_total".to_owned(), 35.0),
            ("master_key_count".to_owned(), 9.0),
            ("master_put_start_requests_total".to_owned(), 4.0),
        ]
        .into();
        let figures = master_figures(Some(&before), Some(&after));
        assert_eq!(
            figures.into_iter().collect::<Vec<_>>(),
            [
                ("master_batch_exist_key_requests_total".to_owned(), 25.0),
                ("master_key_count".to_owned(), 9.0),
                ("master_put_start_requests_total".to_owned(), 4.0),
            ]
        );
        assert!(master_figures(Some(&before), None).is_empty());
    }
}

#[cfg(test)]
mod block_size_tests {
    use super::*;

    #[test]
    fn replay_clients_count_in_the_vllm_block_size_not_the_traces() {
        let params = ReplayParams::default();
        assert_eq!(params.block_size, 16);
        for mode in [Mode::Sync, Mode::Prefetch, Mode::PrefetchPlus] {
            let core = client_core(mode, &params);
            assert_eq!(core.block_size, 16, "{mode}");
            // The server's and the direct transport's block size is the same one.
            assert_eq!(core.block_size, params.block_size, "{mode}");
            // Every other setting is the mode's.
            let mut expected = mode.config(&params.lookup, params.max_in_flight);
            expected.block_size = 16;
            assert_eq!(core, expected, "{mode}");
        }
        let coarse = ReplayParams {
            block_size: 32,
            ..ReplayParams::default()
        };
        assert_eq!(client_core(Mode::Prefetch, &coarse).block_size, 32);
    }
}
