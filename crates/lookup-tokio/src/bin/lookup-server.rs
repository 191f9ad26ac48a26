//! `lookup-server`: the reference lookup server as a program.
//!
//! Binds vLLM's lookup channel (`spec/wire.md`) over ipc or tcp and answers both wire
//! formats from an in-memory index, optionally preloaded with the hashes of stored
//! blocks, so that a demo or a test of a scheduler needs no code:
//!
//! ```text
//! lookup-server --bind ipc:///tmp/lookup.sock --block-size 16 --preload hashes.txt
//! lookup-server --lookup-rpc-port 0 --hostname node1 --dp-rank 0   # vLLM's ipc path
//! ```
//!
//! Prints the bound endpoint (with the chosen port for `tcp://127.0.0.1:0`) as the
//! first line on stdout, logs to stderr (`RUST_LOG`, default `info`), and stops
//! cleanly on Ctrl-C or SIGTERM, unlinking the ipc file.
//!
//! ZeroMQ has no authentication: keep the channel on ipc or loopback. A TCP bind to
//! another address is refused unless `--allow-remote` is given.

use std::io::IsTerminal;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use lookup_tokio::{
    BlockIndex, DEFAULT_MAX_CONCURRENCY, DelayedIndex, Endpoint, InMemoryIndex, KeyLayout,
    LookupServer, RankNamespace, ServerConfig,
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
    /// Block size in tokens: the lookup alignment.
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    /// Model name in the store keys.
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
    /// File of hex block hashes of stored blocks, one a line ('#' comments and blank
    /// lines skipped); each is inserted in every namespace.
    #[arg(long, value_name = "FILE")]
    preload: Option<PathBuf>,
    /// Keys held at most, least recently used evicted first (default: unbounded).
    #[arg(long, value_name = "KEYS")]
    capacity: Option<NonZeroUsize>,
    /// Added latency of every index call, in milliseconds (models a slow store).
    #[arg(long, value_name = "MS", default_value_t = 0.0, value_parser = parse_latency_ms)]
    index_latency_ms: f64,
    /// Requests answered at once.
    #[arg(long, default_value_t = DEFAULT_MAX_CONCURRENCY)]
    max_concurrency: usize,
    /// Allow a TCP bind to a non-loopback address (the channel has no authentication).
    #[arg(long)]
    allow_remote: bool,
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

async fn run(args: Args) -> Result<(), String> {
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
    let layout = KeyLayout::new(args.model)
        .with_cache_prefix(args.cache_prefix)
        .with_namespaces(RankNamespace::grid(args.tp_size, args.pp_size))
        .map_err(|e| e.to_string())?;

    let memory = Arc::new(match args.capacity {
        Some(capacity) => InMemoryIndex::bounded(capacity),
        None => InMemoryIndex::new(),
    });
    if let Some(path) = &args.preload {
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
    let index: Arc<dyn BlockIndex> = if args.index_latency_ms > 0.0 {
        Arc::new(DelayedIndex::new(
            memory,
            Duration::from_secs_f64(args.index_latency_ms / 1000.0),
        ))
    } else {
        memory
    };

    let mut config = ServerConfig::new(args.block_size, layout);
    config.max_concurrency = args.max_concurrency;
    config.allow_remote = args.allow_remote;
    let server = LookupServer::bind(&endpoint, config, index).map_err(|e| e.to_string())?;
    println!("{}", server.local_endpoint());

    stop_signal().await;
    let stats = server.stats();
    server.shutdown().await;
    tracing::info!(?stats, "stopped");
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
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lookup-server: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
