//! `lookup-server`: the reference lookup server as a program.
//!
//! Binds vLLM's lookup channel (`spec/wire.md`) over ipc or tcp and answers both wire
//! formats from an in-memory index, optionally preloaded with the hashes of stored
//! blocks, so that a demo or a test of a scheduler needs no code; or, with
//! `--mooncake-master`, from a real Mooncake master (`MooncakeIndex`):
//!
//! ```text
//! lookup-server --bind ipc:///tmp/lookup.sock --block-size 16 --preload hashes.txt
//! lookup-server --lookup-rpc-port 0 --hostname node1 --dp-rank 0   # vLLM's ipc path
//! lookup-server --bind ipc:///tmp/lookup.sock --mooncake-master 127.0.0.1:50051 \
//!     --model Qwen3-8B --tp-size 2
//! lookup-server --bind ipc:///tmp/lookup.sock --model Qwen3-8B \
//!     --mooncake-master 'etcd://10.0.0.1:2379;10.0.0.2:2379' --mooncake-cluster-id prod
//! ```
//!
//! With `--mooncake-master`, the master must accept a connection at start-up (else the
//! program exits with an error); afterwards a master that goes away costs lookups (0
//! hit tokens), never the server, and is reconnected in the background. An
//! `etcd://` address names a high-availability cluster: the server asks whichever
//! master etcd names leader and follows failovers (`spec/mooncake-master-rpc.md`,
//! "High availability").
//!
//! A reset request is answered `0x00` (failed) and removes nothing, unless
//! `--mooncake-reset-remove-all` is given: then it does what vLLM's reset does,
//! `RemoveAll(force)` on the master, which removes **every object of the tenant from
//! the whole store**, whichever engine or model wrote it.
//!
//! Prints the bound endpoint (with the chosen port for `tcp://127.0.0.1:0`) as the
//! first line on stdout, logs to stderr (`RUST_LOG`, default `info`), and stops
//! cleanly on Ctrl-C or SIGTERM, unlinking the ipc file.
//!
//! ZeroMQ has no authentication: keep the channel on ipc or loopback. A TCP bind to
//! another address is refused unless `--allow-remote` is given.

use std::io::IsTerminal;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use lookup_server::mooncake_master::{BatchConfig, MasterAddr, MasterConfig};
use lookup_server::{
    BlockIndex, DEFAULT_MAX_CONCURRENCY, DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_RECV_HWM, DelayedIndex, Endpoint, InMemoryIndex, KeyLayout, LookupServer,
    MooncakeIndex, RankNamespace, ResetPolicy, ServerConfig,
};
use tracing_subscriber::EnvFilter;

/// The reference lookup server of vLLM's Mooncake store connector lookup channel.
#[derive(Debug, Parser)]
#[command(name = "lookup-server", version)]
struct Args {
    /// Endpoint to bind: ipc://PATH or tcp://HOST:PORT (port 0 picks a free port).
    #[arg(long, value_name = "URL")]
    bind: Option<Endpoint>,
    /// vLLM's VLLM_RPC_BASE_PATH for the ipc path (default: the temp dir).
    #[arg(long, value_name = "DIR", conflicts_with = "bind")]
    base_path: Option<PathBuf>,
    /// vLLM's `lookup_rpc_port` (kv_connector_extra_config): part of the ipc file name.
    #[arg(long, default_value_t = 0, conflicts_with = "bind")]
    lookup_rpc_port: u32,
    /// Host name in vLLM's ipc file name; required unless --bind is given.
    #[arg(long, required_unless_present = "bind", conflicts_with = "bind")]
    hostname: Option<String>,
    /// Data-parallel rank in vLLM's ipc file name.
    #[arg(long, default_value_t = 0, conflicts_with = "bind")]
    dp_rank: u32,
    /// Block size in tokens: the lookup alignment (at least 1).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    block_size: u32,
    /// Model name in the store keys, verbatim. vLLM's worker keys by the last path
    /// component of its --model (Qwen3-8B for --model Qwen/Qwen3-8B); a name with a
    /// `/` is warned about at start.
    #[arg(long, default_value = "model")]
    model: String,
    /// Optional cache prefix in front of every store key.
    #[arg(long)]
    cache_prefix: Option<String>,
    /// Tensor-parallel ranks: one key namespace each.
    #[arg(long, default_value_t = 1)]
    tp_size: u32,
    /// Pipeline-parallel ranks: one key namespace each (times --tp-size).
    #[arg(long, default_value_t = 1)]
    pp_size: u32,
    /// Decode context-parallel size (vLLM's --decode-context-parallel-size): it
    /// subdivides TP, so it must divide --tp-size; TP rank t's keys carry `dcp{t % size}`.
    #[arg(long, default_value_t = 1)]
    dcp_size: u32,
    /// Prefill context-parallel ranks: one key namespace each (times --tp-size and
    /// --pp-size).
    #[arg(long, default_value_t = 1)]
    pcp_size: u32,
    /// File of hex block hashes of stored blocks, one a line ('#' comments and blank
    /// lines skipped); each is inserted in every namespace.
    #[arg(long, value_name = "FILE", conflicts_with = "mooncake_master")]
    preload: Option<PathBuf>,
    /// Keys held at most, least recently used evicted first (default: unbounded).
    #[arg(long, value_name = "KEYS", conflicts_with = "mooncake_master")]
    capacity: Option<NonZeroUsize>,
    /// Answer from the Mooncake master at HOST:PORT (its --rpc_port, default 50051),
    /// or from the leader of a high-availability cluster at etcd://H1:P1;H2:P2,
    /// instead of the in-memory index. Every present key a lookup finds gets a read
    /// lease on the master (10 s by default), as with vLLM's own worker.
    #[arg(long, value_name = "HOST:PORT|etcd://H:P;...")]
    mooncake_master: Option<String>,
    /// Cluster id of an etcd:// master address (the masters' -cluster_id); default
    /// $MC_STORE_CLUSTER_ID, else mooncake_cluster.
    #[arg(long, value_name = "ID", requires = "mooncake_master")]
    mooncake_cluster_id: Option<String>,
    /// Answer a reset request as vLLM does: RemoveAll(force) on the master. This
    /// removes every object of the tenant (--tenant-id) from the whole store, for
    /// every engine and model that shares it, leased objects included. Without this
    /// flag a reset is refused (answered 0x00) and removes nothing.
    #[arg(long, requires = "mooncake_master")]
    mooncake_reset_remove_all: bool,
    /// Most keys per BatchExistKey call to the master; longer lookups are split, and
    /// stop after the call that ends the leading run.
    #[arg(
        long,
        value_name = "KEYS",
        default_value_t = 1024,
        requires = "mooncake_master"
    )]
    mooncake_chunk_keys: usize,
    /// Longest wait for one master call (and for the connect, and for one etcd read
    /// of an etcd:// address), in milliseconds; a lookup whose call times out answers
    /// 0 hit tokens.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 1000,
        requires = "mooncake_master",
        value_parser = clap::value_parser!(u64).range(1..=3_600_000)
    )]
    mooncake_timeout_ms: u64,
    /// The master's read lease (its -default_kv_lease_ttl), in seconds, used until
    /// the master reports its own (read once per connection to it, at the first hit) and when it
    /// cannot.
    #[arg(
        long,
        value_name = "S",
        default_value_t = 10.0,
        requires = "mooncake_master"
    )]
    mooncake_lease_ttl_s: f64,
    /// Keep the master's positive answers in the lease-backed presence cache and
    /// answer later lookups from it while the lease lasts (`true` or `false`; on by
    /// default, as `PresenceCacheConfig`), instead of asking the master about every
    /// key.
    #[arg(
        long,
        value_name = "BOOL",
        default_value_t = lookup_server::mooncake_master::PresenceCacheConfig::default().enabled,
        action = clap::ArgAction::Set,
        requires = "mooncake_master"
    )]
    mooncake_presence_cache: bool,
    /// The lookup_prefetch_ttl_s of the clients in front of this server, in seconds
    /// (vLLM's default 2): warned about when it is not below the master's read lease,
    /// which vLLM's wire cannot carry to them.
    #[arg(
        long,
        value_name = "S",
        default_value_t = 2.0,
        requires = "mooncake_master"
    )]
    client_ttl_s: f64,
    /// The tenant_id argument of the master's existence calls (masters >= 0.3.12;
    /// older ones are detected and called without it).
    #[arg(long, default_value = "default", requires = "mooncake_master")]
    tenant_id: String,
    /// Added latency of every index call, in milliseconds (models a slow store).
    #[arg(long, value_name = "MS", default_value_t = 0.0, value_parser = parse_latency_ms)]
    index_latency_ms: f64,
    /// Added latency of every index call, in microseconds, waited on a thread
    /// (`DelayedIndex::precise`: within tens of µs, where `--index-latency-ms` rounds
    /// up to whole milliseconds); for benchmarks at a master call's 0.1-0.5 ms.
    #[arg(
        long,
        value_name = "US",
        default_value_t = 0,
        conflicts_with = "index_latency_ms"
    )]
    index_delay_us: u64,
    /// Requests answered at once.
    #[arg(long, default_value_t = DEFAULT_MAX_CONCURRENCY)]
    max_concurrency: usize,
    /// Largest frame accepted, in bytes (ZeroMQ's ZMQ_MAXMSGSIZE): a peer that sends
    /// a bigger one is disconnected at its header. The default holds 16,384 sha256
    /// block hashes in msgpack-hex (262,144 tokens at block size 16); raise it for
    /// longer prompts.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_FRAME_BYTES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_frame_bytes: usize,
    /// Bytes held for requests read and not yet answered, across all peers (their
    /// frames and the store keys built from them): at the cap the server stops
    /// reading until replies go out.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_PENDING_BYTES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_pending_bytes: usize,
    /// Complete messages ZeroMQ queues per peer before the server reads them
    /// (ZMQ_RCVHWM; ZeroMQ's own default is 1000).
    #[arg(long, value_name = "MESSAGES", default_value_t = DEFAULT_RECV_HWM,
          value_parser = clap::value_parser!(u32).range(1..=2_147_483_647))]
    recv_hwm: u32,
    /// Allow a TCP bind to a non-loopback address (the channel has no authentication).
    #[arg(long)]
    allow_remote: bool,
    /// Take over an ipc path a running server still listens on (vLLM's behaviour),
    /// instead of refusing to start.
    #[arg(long)]
    take_over: bool,
    /// Serve Prometheus metrics (`lookup_server_*`, see `lookup_server::metrics`) over
    /// HTTP at this address, e.g. 127.0.0.1:9464. Needs the `prometheus` feature of
    /// lookup-cli (on by default).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
}

/// Installs the Prometheus exporter when `--metrics-addr` is given; before the server
/// binds, which takes its metric handles from the recorder installed then.
fn install_metrics(addr: Option<std::net::SocketAddr>) -> Result<(), String> {
    let Some(addr) = addr else {
        return Ok(());
    };
    #[cfg(feature = "prometheus")]
    {
        lookup_server::metrics::install_prometheus(addr)
            .map(drop)
            .map_err(|e| format!("--metrics-addr {addr}: {e}"))
    }
    #[cfg(not(feature = "prometheus"))]
    {
        Err(format!(
            "--metrics-addr {addr}: built without the `prometheus` feature \
             (cargo build -p lookup-cli --features prometheus)"
        ))
    }
}

/// A latency in milliseconds: finite and not negative.
fn parse_latency_ms(s: &str) -> Result<f64, String> {
    let ms: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..3.6e6).contains(&ms) {
        Ok(ms)
    } else {
        Err("expected milliseconds, at least 0 and below one hour".to_owned())
    }
}

/// The block hashes of a preload file: one hex hash a line, either case; blank lines
/// and lines starting with '#' are skipped.
fn parse_preload(text: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut hashes = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let hash = decode_hex(line)
            .ok_or_else(|| format!("line {}: `{line}` is not hex of even length", number + 1))?;
        hashes.push(hash);
    }
    Ok(hashes)
}

/// The bytes of a non-empty hex string of even length.
fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if hex.is_empty() || hex.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    hex.as_bytes()
        .chunks_exact(2)
        .map(|pair| Some((digit(pair[0])? << 4) | digit(pair[1])?))
        .collect()
}

async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

/// The in-memory index, bounded to `capacity` keys and preloaded from `preload`.
fn in_memory(
    layout: &KeyLayout,
    capacity: Option<NonZeroUsize>,
    preload: Option<&Path>,
) -> Result<Arc<dyn BlockIndex>, String> {
    let memory = Arc::new(match capacity {
        Some(capacity) => InMemoryIndex::bounded(capacity),
        None => InMemoryIndex::new(),
    });
    if let Some(path) = preload {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--preload {}: {e}", path.display()))?;
        let hashes =
            parse_preload(&text).map_err(|e| format!("--preload {}: {e}", path.display()))?;
        for hash in &hashes {
            for key in layout.block_keys(hash) {
                memory.insert(&key);
            }
        }
        tracing::info!(blocks = hashes.len(), keys = memory.len(), "preloaded");
    }
    Ok(memory)
}

/// A `--model` that vLLM's worker would not put in its keys (it keys by the last path
/// component, `vllm_block_hash::model_name`): every lookup would miss in silence.
fn warn_if_not_vllms_key_name(model: &str) {
    let key_name = vllm_block_hash::model_name(model);
    if key_name != model {
        tracing::warn!(
            model,
            "store keys carry --model verbatim ({model}), while vLLM's worker keys by the last \
             path component of its --model ({key_name}): give --model {key_name} if the \
             writers are vLLM engines"
        );
    }
}

/// A duration flag in seconds (vLLM's float seconds, huge values saturate).
fn seconds(flag: &str, value: f64) -> Result<Duration, String> {
    lookup_core::duration_from_secs(value).map_err(|e| format!("{flag}: {e}"))
}

/// Connects the Mooncake index and asks the master whether it serves (`ServiceReady`),
/// logging its version.
async fn connect_mooncake(args: &Args, addr: &str) -> Result<MooncakeIndex, String> {
    let mut config = MasterConfig::default();
    config.chunk_keys = args.mooncake_chunk_keys;
    config.call_timeout = Duration::from_millis(args.mooncake_timeout_ms);
    config.connect_timeout = Duration::from_millis(args.mooncake_timeout_ms);
    config.etcd_timeout = Duration::from_millis(args.mooncake_timeout_ms);
    config.tenant_id.clone_from(&args.tenant_id);
    config.cluster_id.clone_from(&args.mooncake_cluster_id);
    let reset = if args.mooncake_reset_remove_all {
        ResetPolicy::RemoveAll
    } else {
        ResetPolicy::Refuse
    };
    let mut batch = BatchConfig::default();
    batch.presence.enabled = args.mooncake_presence_cache;
    let index = MooncakeIndex::connect(addr, config)
        .await
        .map_err(|e| format!("--mooncake-master {addr}: {e}"))?
        .with_batching(batch)
        .map_err(|e| format!("--mooncake-presence-cache: {e}"))?
        .with_reset(reset)
        .with_lease_ttl(seconds(
            "--mooncake-lease-ttl-s",
            args.mooncake_lease_ttl_s,
        )?)
        .check_client_ttl(seconds("--client-ttl-s", args.client_ttl_s)?);
    if let Some(leader) = index.master().leader() {
        tracing::info!(%addr, leader = %leader.leader, view = leader.version, "Mooncake leader found in etcd");
    }
    if reset == ResetPolicy::RemoveAll {
        tracing::warn!(tenant = %args.tenant_id, "resets remove every object of the tenant from the Mooncake store (--mooncake-reset-remove-all)");
    }
    // ServiceReady names the master's version and proves a master (the HA leader)
    // answers; an older master may lack it, so a refusal is only a warning.
    match index.master().service_ready().await {
        Ok(version) => tracing::info!(%addr, %version, "Mooncake master ready"),
        Err(e) => tracing::warn!(%addr, error = %e, "Mooncake master did not answer ServiceReady"),
    }
    Ok(index)
}

/// The exit status for arguments that make no sense (clap's own, for the flags it
/// refuses).
const EXIT_USAGE: u8 = 2;

/// The checks of the arguments that clap cannot make, before anything is started:
/// where to bind, the master's address, the rank layout, the durations. A refusal
/// exits [`EXIT_USAGE`], as clap's do; what fails later (a master that does not
/// answer, a socket that cannot bind) exits 1.
fn check_arguments(args: &Args) -> Result<(), String> {
    if args.bind.is_none() && args.hostname.is_none() {
        return Err("give --bind URL or --hostname (vLLM's ipc path)".to_owned());
    }
    if let Some(addr) = &args.mooncake_master {
        MasterAddr::parse(addr, args.mooncake_cluster_id.as_deref())
            .map_err(|e| format!("--mooncake-master {addr}: {e}"))?;
        seconds("--mooncake-lease-ttl-s", args.mooncake_lease_ttl_s)?;
        seconds("--client-ttl-s", args.client_ttl_s)?;
    }
    let namespaces = namespaces(args.tp_size, args.pp_size, args.dcp_size, args.pcp_size)?;
    KeyLayout::new(args.model.clone())
        .with_cache_prefix(args.cache_prefix.clone())
        .with_namespaces(namespaces)
        .map_err(|e| e.to_string())?;
    Ok(())
}

async fn run(args: Args) -> Result<(), String> {
    install_metrics(args.metrics_addr)?;
    // After the recorder (the index takes its metric handles now), before `args` is
    // taken apart.
    let mooncake = match &args.mooncake_master {
        Some(addr) => Some(Arc::new(connect_mooncake(&args, addr).await?)),
        None => None,
    };
    let endpoint = match (args.bind, args.hostname) {
        (Some(endpoint), _) => endpoint,
        (None, Some(hostname)) => Endpoint::vllm(
            args.base_path.as_deref(),
            args.lookup_rpc_port,
            &hostname,
            args.dp_rank,
        ),
        (None, None) => return Err("give --bind URL or --hostname (vLLM's ipc path)".to_owned()),
    };
    warn_if_not_vllms_key_name(&args.model);
    let layout = KeyLayout::new(args.model)
        .with_cache_prefix(args.cache_prefix)
        .with_namespaces(namespaces(
            args.tp_size,
            args.pp_size,
            args.dcp_size,
            args.pcp_size,
        )?)
        .map_err(|e| e.to_string())?;

    let store: Arc<dyn BlockIndex> = match &mooncake {
        Some(index) => Arc::clone(index) as Arc<dyn BlockIndex>,
        None => in_memory(&layout, args.capacity, args.preload.as_deref())?,
    };
    let index: Arc<dyn BlockIndex> = if args.index_delay_us > 0 {
        Arc::new(DelayedIndex::precise(
            store,
            Duration::from_micros(args.index_delay_us),
        ))
    } else if args.index_latency_ms > 0.0 {
        Arc::new(DelayedIndex::new(
            store,
            Duration::from_secs_f64(args.index_latency_ms / 1000.0),
        ))
    } else {
        store
    };

    let mut config = ServerConfig::new(args.block_size, layout);
    config.max_concurrency = args.max_concurrency;
    config.max_frame_bytes = args.max_frame_bytes;
    config.max_pending_bytes = args.max_pending_bytes;
    config.recv_hwm = args.recv_hwm;
    config.allow_remote = args.allow_remote;
    config.take_over = args.take_over;
    let server = LookupServer::bind(&endpoint, config, index).map_err(|e| e.to_string())?;
    println!("{}", server.local_endpoint());

    stop_signal().await;
    let stats = server.stats();
    server.shutdown().await;
    tracing::info!(?stats, "stopped");
    if let Some(index) = mooncake {
        tracing::info!(stats = ?index.stats(), "Mooncake index");
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    if let Err(e) = check_arguments(&args) {
        eprintln!("lookup-server: {e}");
        return ExitCode::from(EXIT_USAGE);
    }
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lookup-server: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The namespaces vLLM 0.33's lookup asks for a full-attention model whose TP ranks
/// each hold distinct heads (`_init_lookup_key_prefixes`): pcp-major, then tp, then
/// pp; with DCP each TP rank's `dcp_rank` is `tp_rank % dcp_size`.
fn namespaces(tp: u32, pp: u32, dcp: u32, pcp: u32) -> Result<Vec<RankNamespace>, String> {
    for (flag, size) in [
        ("--tp-size", tp),
        ("--pp-size", pp),
        ("--dcp-size", dcp),
        ("--pcp-size", pcp),
    ] {
        if size == 0 {
            return Err(format!("{flag} must be at least 1"));
        }
    }
    if tp % dcp != 0 {
        return Err(format!("--dcp-size {dcp} does not divide --tp-size {tp}"));
    }
    let mut out = Vec::new();
    for pcp_rank in 0..pcp {
        for tp_rank in 0..tp {
            for pp_rank in 0..pp {
                out.push(RankNamespace {
                    tp_rank,
                    pcp_rank,
                    dcp_rank: tp_rank % dcp,
                    pp_rank,
                    group: 0,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dcp_ranks_follow_the_tp_rank() {
        let keys: Vec<(u32, u32, u32)> = namespaces(2, 1, 2, 1)
            .unwrap()
            .iter()
            .map(|ns| (ns.tp_rank, ns.dcp_rank, ns.pcp_rank))
            .collect();
        assert_eq!(keys, [(0, 0, 0), (1, 1, 0)]);
        assert_eq!(namespaces(1, 1, 1, 2).unwrap().len(), 2);
        assert_eq!(
            namespaces(2, 1, 4, 1).unwrap_err(),
            "--dcp-size 4 does not divide --tp-size 2"
        );
        assert_eq!(
            namespaces(0, 1, 1, 1).unwrap_err(),
            "--tp-size must be at least 1"
        );
    }

    #[test]
    fn preload_file_parses_hex_lines() {
        let text = "# stored blocks\n00ff\n\n  AB01 \n";
        assert_eq!(
            parse_preload(text).unwrap(),
            vec![vec![0x00, 0xff], vec![0xab, 0x01]]
        );
    }

    #[test]
    fn preload_file_names_the_bad_line() {
        assert_eq!(
            parse_preload("00\nabc\n").unwrap_err(),
            "line 2: `abc` is not hex of even length"
        );
        assert_eq!(
            parse_preload("zz\n").unwrap_err(),
            "line 1: `zz` is not hex of even length"
        );
    }

    #[test]
    fn latency_must_be_finite_and_not_negative() {
        assert_eq!(parse_latency_ms("1.5"), Ok(1.5));
        assert!(parse_latency_ms("-1").is_err());
        assert!(parse_latency_ms("NaN").is_err());
        assert!(parse_latency_ms("inf").is_err());
    }
}
