//! The measurements of `cargo xtask calibrate`: the peers it starts (master, Python
//! store client, Python lookup server), our servers in this process, and the timed
//! lookups.

use lookup_tokio::Deadline;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use lookup_core::{BlockHashes, Probe, Request, RequestId};
use lookup_server::{InMemoryIndex, LookupServer, MooncakeIndex, ServerConfig};
use lookup_tokio::mooncake_master::{MasterClient, MasterConfig};
use lookup_tokio::{ClientConfig, Endpoint, KeyLayout, LookupClient};

use super::{Measured, STORED_BLOCKS};
use crate::replay::peers::{self, Master, PutBatch, Writer};

/// The model name of the calibration's keys.
const MODEL: &str = "calibrate";
/// vLLM's block size: tokens per key.
const BLOCK_SIZE: u32 = 16;
/// Ids of absent blocks start here (present ones are 0..STORED_BLOCKS).
const ABSENT: u64 = 1 << 40;
/// Keys per call of our Mooncake index (`MasterConfig::chunk_keys`' default).
const CHUNK: u32 = 1024;
/// Unmeasured lookups before each point.
const WARMUP: usize = 20;

/// The blocks of lookup number `n` of `k` blocks: a window of the stored ones, moved
/// along with `n`, or absent ones never asked before. Every lookup asks keys the
/// master has not just answered, as a deployment's lookups do (asking the same keys
/// again and again would time a master whose entries sit in the CPU's caches).
fn ids(k: u32, present: bool, n: u64) -> Vec<u64> {
    let k = u64::from(k);
    let base = if present {
        (n * k) % (u64::from(STORED_BLOCKS) - k + 1)
    } else {
        ABSENT + n * k
    };
    (base..base + k).collect()
}

/// The Python lookup server: killed when dropped.
struct PythonServer {
    child: Child,
}

impl Drop for PythonServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl PythonServer {
    fn start(python: &Path, master: &str, endpoint: &str, log: &Path) -> anyhow::Result<Self> {
        let script = peers::workspace_root().join("scripts/mooncake/vllm_lookup_server.py");
        if !python.is_file() {
            bail!(
                "the Mooncake Python client's interpreter not found at {}: install it with \
                 `bash scripts/mooncake/install.sh` (it installs pyzmq 27.3.0 too)",
                python.display()
            );
        }
        let log_file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = Command::new(python)
            .arg(&script)
            .args(["--master", master, "--endpoint", endpoint, "--model", MODEL])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("cannot run {}", script.display()))?;
        let stdout = child.stdout.take().context("server stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let server = Self { child };
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line.trim() == "ready" => Ok(server),
            other => {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(10).collect();
                bail!(
                    "vllm_lookup_server.py did not start ({other:?}; needs pyzmq in the same \
                     interpreter: `.venv/bin/python -m pip install pyzmq==27.3.0`); its log ends:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            }
        }
    }
}

/// Times `samples` lookups of `k` blocks through `client` (sync probe, one at a time),
/// checking each answer (all present: `k × 16`; all absent: 0) and that none failed.
async fn time_client(
    client: &mut LookupClient,
    next_id: &mut u64,
    k: u32,
    present: bool,
    samples: usize,
) -> anyhow::Result<Vec<f64>> {
    let want = if present { k * BLOCK_SIZE } else { 0 };
    let mut out = Vec::with_capacity(samples);
    for i in 0..WARMUP.min(samples) + samples {
        *next_id += 1;
        let req = Request {
            request_id: RequestId(*next_id),
            num_tokens: k * BLOCK_SIZE + 1,
            block_hashes: BlockHashes::from_u64s(&ids(k, present, *next_id)),
            skip_reading_external_kv: false,
        };
        let start = Instant::now();
        let answer = client.probe_until(&req, 0, Deadline::Answer).await;
        let took = start.elapsed();
        client.on_allocated(req.request_id);
        let Probe::Ready {
            external_tokens, ..
        } = answer
        else {
            bail!("a sync probe answered {answer:?}");
        };
        ensure!(
            external_tokens == want,
            "a lookup of {k} {} blocks answered {external_tokens} tokens, not {want}",
            if present { "stored" } else { "absent" }
        );
        if i >= WARMUP.min(samples) {
            out.push(took.as_secs_f64() * 1e6);
        }
    }
    let core = client.stats().core;
    let failed = core.failed_timed_out
        + core.failed_malformed
        + core.failed_transport
        + core.failed_store_unavailable;
    ensure!(
        failed == 0,
        "{failed} lookups failed (a failure is not a miss)"
    );
    Ok(out)
}

/// Samples per round: four rounds (fewer for fewer samples).
fn rounds(samples: usize) -> Vec<usize> {
    let n = samples.clamp(1, 4);
    (0..n)
        .map(|i| samples / n + usize::from(i < samples % n))
        .collect()
}

/// Every point of a profile measured through a client at `endpoint`; `calls(k,
/// present)` gives the store calls of each; `max_absent` bounds the absent sizes.
async fn through_client(
    endpoint: Endpoint,
    keys: &[u32],
    samples: usize,
    calls: fn(u32, bool) -> u32,
    max_absent: u32,
) -> anyhow::Result<Vec<(u32, bool, u32, Vec<f64>)>> {
    let mut config = ClientConfig::zmq(endpoint, BLOCK_SIZE);
    config.core.lookup_async = false;
    config.core.lookup_share = false;
    config.core.max_in_flight = 1;
    let mut client = LookupClient::connect_lazy(config).context("connecting the lookup client")?;
    let mut next_id = 0;
    let mut points: Vec<(u32, bool, u32, Vec<f64>)> = [true, false]
        .into_iter()
        .flat_map(|present| {
            keys.iter()
                .filter(move |&&k| present || k <= max_absent)
                .map(move |&k| (k, present, calls(k, present), Vec::new()))
        })
        .collect();
    for round in rounds(samples) {
        for (k, present, _, t) in &mut points {
            t.extend(time_client(&mut client, &mut next_id, *k, *present, round).await?);
        }
    }
    client.shutdown().await;
    for p in &mut points {
        p.3.sort_by(f64::total_cmp);
    }
    Ok(points)
}

/// Measures every profile (see the module docs of `calibrate`).
///
/// # Errors
/// A peer cannot start, the keys never appear, a lookup answers wrongly or fails.
pub(super) fn all(
    master_bin: &Path,
    python: &Path,
    keys: &[u32],
    samples: usize,
) -> anyhow::Result<Vec<Measured>> {
    let dir = tempfile::Builder::new()
        .prefix("xtask-calibrate-")
        .tempdir()
        .context("creating a temp dir")?;
    let master = Master::start(master_bin, dir.path())?;
    let writer = Writer::start(python, &master.addr, dir.path())?;
    let layout = KeyLayout::new(MODEL);
    let stored = BlockHashes::from_u64s(&ids(STORED_BLOCKS, true, 0));
    let stored_keys = layout.chain_keys(&stored, STORED_BLOCKS as usize);
    writer
        .sender()
        .context("the writer's queue")?
        .send(PutBatch {
            keys: stored_keys.clone(),
            at: Instant::now(),
        })
        .map_err(|_| anyhow::anyhow!("the Python store client stopped"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let out = runtime.block_on(async {
        let mut one_call = MasterConfig::default();
        one_call.chunk_keys = 1 << 20;
        // The check that every stored key is there asks all of them in one call: on a
        // loaded machine that takes longer than the default 1 s (the timed lookups, of
        // 4,096 keys at most, take milliseconds).
        one_call.call_timeout = Duration::from_secs(30);
        let master_client = MasterClient::connect(&master.addr, one_call)
            .await
            .with_context(|| format!("connecting to the master at {}", master.addr))?;
        // The writer puts in the background: wait until every key is there.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let found = master_client.batch_exist(&stored_keys).await?;
            if found.iter().all(|&f| f) {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "the Python store client stored {} of {} keys in 120 s",
                found.iter().filter(|&&f| f).count(),
                found.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!("== master: BatchExistKey through MasterClient");
        let mut points: Vec<(u32, bool, u32, Vec<f64>)> = [true, false]
            .into_iter()
            .flat_map(|present| keys.iter().map(move |&k| (k, present, 1, Vec::new())))
            .collect();
        let mut asked_n = 0;
        for round in rounds(samples) {
            for (k, present, _, t) in &mut points {
                for i in 0..WARMUP.min(round) + round {
                    asked_n += 1;
                    let asked = layout.chain_keys(
                        &BlockHashes::from_u64s(&ids(*k, *present, asked_n)),
                        *k as usize,
                    );
                    let start = Instant::now();
                    let found = master_client.batch_exist(&asked).await?;
                    let took = start.elapsed();
                    ensure!(
                        found.iter().all(|&f| f == *present),
                        "the master answered a {} key otherwise",
                        if *present { "stored" } else { "absent" }
                    );
                    if i >= WARMUP.min(round) {
                        t.push(took.as_secs_f64() * 1e6);
                    }
                }
            }
        }
        for p in &mut points {
            p.3.sort_by(f64::total_cmp);
        }
        let master_points = points;

        eprintln!("== lookup-server with the in-memory index");
        let memory = Arc::new(InMemoryIndex::new());
        memory.insert_chain(&layout, &stored, STORED_BLOCKS as usize);
        let endpoint = Endpoint::Ipc(dir.path().join("memory.sock"));
        let server = LookupServer::bind(
            &endpoint,
            ServerConfig::new(BLOCK_SIZE, layout.clone()),
            memory,
        )?;
        let memory_points =
            through_client(server.local_endpoint().clone(), keys, samples, |_, _| 0, u32::MAX)
                .await?;
        server.shutdown().await;

        eprintln!("== lookup-server --mooncake-master");
        let index = Arc::new(
            MooncakeIndex::connect(&master.addr, MasterConfig::default())
                .await
                .with_context(|| format!("connecting the index to {}", master.addr))?,
        );
        let endpoint = Endpoint::Ipc(dir.path().join("mooncake.sock"));
        let server =
            LookupServer::bind(&endpoint, ServerConfig::new(BLOCK_SIZE, layout.clone()), index)?;
        let mooncake_points = through_client(
            server.local_endpoint().clone(),
            keys,
            samples,
            |k, present| if present { k.div_ceil(CHUNK) } else { 1 },
            CHUNK,
        )
        .await?;
        server.shutdown().await;

        eprintln!("== vllm_lookup_server.py (Python keys, one batch_is_exist)");
        let path = dir.path().join("python.sock");
        let endpoint = format!("ipc://{}", path.display());
        let python_server = PythonServer::start(
            python,
            &master.addr,
            &endpoint,
            &dir.path().join("python-server.log"),
        )?;
        let python_points = through_client(
            Endpoint::Ipc(path),
            keys,
            samples,
            |_, _| 1,
            u32::MAX,
        )
        .await?;
        drop(python_server);
        anyhow::Ok(vec![
            Measured {
                name: "master",
                what: "the real Mooncake master's BatchExistKey, asked by this project's MasterClient over loopback TCP, one call per lookup: the direct transport's cost (scheduler to master, no lookup server)",
                chunk_keys: CHUNK,
                intercept_is_call: true,
                fit_calls: false,
                known_per_call: None,
                points: master_points,
            },
            Measured {
                name: "lookup-server-memory",
                what: "this project's lookup-server with its in-memory index, over ZeroMQ ipc, asked by LookupClient (sync probe): the ZeroMQ hop and the server's own work",
                chunk_keys: 0,
                intercept_is_call: false,
                fit_calls: false,
                known_per_call: None,
                points: memory_points,
            },
            Measured {
                name: "lookup-server-mooncake",
                what: "this project's lookup-server --mooncake-master (calls of 1,024 keys, early stop) on the real master, over ZeroMQ ipc, asked by LookupClient (sync probe)",
                chunk_keys: CHUNK,
                intercept_is_call: false,
                fit_calls: true,
                known_per_call: None,
                points: mooncake_points,
            },
            Measured {
                name: "vllm-python",
                what: "scripts/mooncake/vllm_lookup_server.py: a pyzmq REP server that builds every key in Python and asks the real master once per lookup with the C++ client's batch_is_exist, as vLLM's worker does; asked by LookupClient (sync probe)",
                chunk_keys: 0,
                intercept_is_call: false,
                fit_calls: false,
                known_per_call: None,
                points: python_points,
            },
        ])
    })?;
    drop(writer);
    drop(master);
    Ok(out)
}
