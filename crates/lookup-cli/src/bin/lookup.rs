//! `lookup`: a command-line client of the lookup channel, for operators and scripts.
//!
//! ```text
//! lookup probe --endpoint ipc:///tmp/lookup.sock --num-tokens 48 --hashes 00..01,00..02
//! lookup probe --lookup-rpc-port 0 --dp-rank 0 --num-tokens 48 --hashes-file hashes.txt
//! lookup reset --endpoint tcp://127.0.0.1:5555
//! ```
//!
//! `probe` sends one lookup (`spec/wire.md`, either format) and prints the hit tokens,
//! the tail-key boundaries and the round-trip time; `reset` sends one reset and prints
//! `ok` or `failed`. It uses one DEALER exchange `[id, "", frames...]`, which any
//! REP or ROUTER server answers, and prints the raw reply's content.
//!
//! Exit status: 0 success; 1 no reply within `--timeout-s`, or a reset that failed;
//! 2 bad arguments; 3 a malformed reply (wrong length, a hit above `--num-tokens` or
//! not a multiple of `--block-size`: `spec/wire.md`, "Client-side guards").

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use futures::{SinkExt, StreamExt};
use lookup_core::wire::{self, Format, LookupReply};
use lookup_core::{BlockHashes, Endpoint};

/// Exit status for a reply that did not come in time, or a reset the server refused.
const EXIT_FAILED: u8 = 1;
/// Exit status for arguments that do not make sense (clap uses it too).
const EXIT_USAGE: u8 = 2;
/// Exit status for a reply that breaks `spec/wire.md`.
const EXIT_MALFORMED: u8 = 3;
/// The RPC id put in the envelope of the one request.
const RPC_ID: u64 = 1;

#[derive(Parser, Debug)]
#[command(
    name = "lookup",
    version,
    about = "Ask a prefix-cache lookup server (vLLM's lookup channel) directly"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Look up how many leading tokens of a prompt are stored.
    Probe(ProbeArgs),
    /// Ask the server to wipe its store (`tagged-blob` only).
    Reset(ResetArgs),
}

/// Where the server is: a URL, or vLLM's ipc path from its parts (`spec/wire.md`).
#[derive(Args, Debug)]
struct Target {
    /// `ipc://PATH` or `tcp://HOST:PORT`.
    #[arg(long, conflicts_with_all = ["base_path", "lookup_rpc_port", "hostname", "dp_rank"])]
    endpoint: Option<String>,
    /// vLLM's `VLLM_RPC_BASE_PATH` (default: the temp dir).
    #[arg(long)]
    base_path: Option<PathBuf>,
    /// `lookup_rpc_port` of `kv_connector_extra_config` (a name, not a TCP port).
    #[arg(long)]
    lookup_rpc_port: Option<u32>,
    /// Host name in the path (default: this machine's).
    #[arg(long)]
    hostname: Option<String>,
    /// Data-parallel rank.
    #[arg(long)]
    dp_rank: Option<u32>,
    /// Seconds to wait for the reply.
    #[arg(long, default_value_t = 5.0)]
    timeout_s: f64,
}

#[derive(Args, Debug)]
struct ProbeArgs {
    #[command(flatten)]
    target: Target,
    /// The prompt's token count (unaligned).
    #[arg(long)]
    num_tokens: u32,
    /// Block hashes in order, hex, comma-separated (all of one length).
    #[arg(long, value_delimiter = ',', conflicts_with = "hashes_file")]
    hashes: Vec<String>,
    /// A file of block hashes, one hex hash a line (blank lines and `#` comments skipped).
    #[arg(long)]
    hashes_file: Option<PathBuf>,
    /// Wire format: `tagged-blob` (vLLM 0.33) or `msgpack-hex` (before vLLM #45659).
    #[arg(long, default_value = "tagged-blob")]
    format: Format,
    /// Lookup alignment in tokens (`msgpack-hex` floors the token count to it; the
    /// reply's hit must be a multiple of it).
    #[arg(long, default_value_t = 16)]
    block_size: u32,
}

#[derive(Args, Debug)]
struct ResetArgs {
    #[command(flatten)]
    target: Target,
}

/// A failure with its exit status.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let result = match cli.command {
        Cmd::Probe(args) => runtime.block_on(probe(args)),
        Cmd::Reset(args) => runtime.block_on(reset(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

async fn probe(args: ProbeArgs) -> Result<(), Failure> {
    if args.block_size == 0 {
        return Err(Failure::usage("--block-size must be at least 1"));
    }
    let hashes = match &args.hashes_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::usage(format!("cannot read {}: {e}", path.display())))?;
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        }
        None => args.hashes.clone(),
    };
    let block_hashes = parse_hashes(&hashes)?;
    let endpoint = args.target.endpoint()?;
    let frames = wire::encode_lookup(args.format, args.num_tokens, args.block_size, &block_hashes);
    let (reply, round_trip) = exchange(&endpoint, frames, args.target.timeout()?).await?;
    let malformed = |why: String| Failure {
        code: EXIT_MALFORMED,
        message: format!("malformed reply from {endpoint}: {why}"),
    };
    let LookupReply {
        hit_tokens,
        boundaries,
    } = wire::decode_lookup_reply(args.format, &reply).map_err(|e| malformed(e.to_string()))?;
    if hit_tokens > args.num_tokens {
        return Err(malformed(format!(
            "hit_tokens {hit_tokens} is above num_tokens {}",
            args.num_tokens
        )));
    }
    if hit_tokens % args.block_size != 0 {
        return Err(malformed(format!(
            "hit_tokens {hit_tokens} is not a multiple of the block size {}",
            args.block_size
        )));
    }
    println!("hit_tokens: {hit_tokens}");
    if boundaries.is_empty() {
        println!("boundaries: none");
    } else {
        let list: Vec<String> = boundaries
            .iter()
            .map(|b| format!("group {} at {} tokens", b.group_id, b.boundary_tokens))
            .collect();
        println!("boundaries: {}", list.join(", "));
    }
    println!("round_trip_ms: {:.3}", round_trip.as_secs_f64() * 1e3);
    Ok(())
}

async fn reset(args: ResetArgs) -> Result<(), Failure> {
    let endpoint = args.target.endpoint()?;
    let frames =
        wire::encode_reset(Format::TaggedBlob).map_err(|e| Failure::usage(e.to_string()))?;
    let (reply, round_trip) = exchange(&endpoint, frames, args.target.timeout()?).await?;
    let ok = wire::decode_reset_reply(&reply).map_err(|e| Failure {
        code: EXIT_MALFORMED,
        message: format!("malformed reply from {endpoint}: {e}"),
    })?;
    println!("{}", if ok { "ok" } else { "failed" });
    println!("round_trip_ms: {:.3}", round_trip.as_secs_f64() * 1e3);
    if ok {
        Ok(())
    } else {
        Err(Failure {
            code: EXIT_FAILED,
            message: format!("{endpoint} could not reset its store"),
        })
    }
}

impl Target {
    fn endpoint(&self) -> Result<Endpoint, Failure> {
        if let Some(url) = &self.endpoint {
            return url
                .parse()
                .map_err(|e: lookup_core::Error| Failure::usage(e.to_string()));
        }
        let Some(port) = self.lookup_rpc_port else {
            return Err(Failure::usage(
                "give --endpoint URL, or vLLM's parts (--lookup-rpc-port, and optionally --base-path, --hostname, --dp-rank)",
            ));
        };
        let hostname = match &self.hostname {
            Some(h) => h.clone(),
            None => local_hostname().ok_or_else(|| {
                Failure::usage("cannot read this machine's host name; give --hostname")
            })?,
        };
        Ok(Endpoint::vllm(
            self.base_path.as_deref(),
            port,
            &hostname,
            self.dp_rank.unwrap_or(0),
        ))
    }

    fn timeout(&self) -> Result<Duration, Failure> {
        if self.timeout_s.is_finite() && self.timeout_s > 0.0 {
            Ok(Duration::from_secs_f64(self.timeout_s))
        } else {
            Err(Failure::usage(format!(
                "--timeout-s {} is not a positive number of seconds",
                self.timeout_s
            )))
        }
    }
}

/// This machine's host name, as Python's `socket.gethostname()` gives it to vLLM.
fn local_hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// Hex hashes, all of one length, to [`BlockHashes`].
fn parse_hashes(hashes: &[String]) -> Result<BlockHashes, Failure> {
    let decoded = hashes
        .iter()
        .enumerate()
        .map(|(i, h)| {
            decode_hex(h.trim())
                .ok_or_else(|| Failure::usage(format!("hash {i} `{h}` is not hex of even length")))
        })
        .collect::<Result<Vec<Vec<u8>>, Failure>>()?;
    BlockHashes::from_hashes(&decoded).map_err(|e| Failure::usage(format!("bad hashes: {e}")))
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let s = s.strip_prefix("0x").unwrap_or(s);
    if s.is_empty() || s.len() % 2 != 0 {
        return None;
    }
    s.as_bytes()
        .chunks_exact(2)
        .map(|pair| {
            let digit = |c: u8| char::from(c).to_digit(16);
            u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()
        })
        .collect()
}

/// Sends `frames` in one `[id, "", frames...]` message over a fresh DEALER (linger 0)
/// and returns the reply's frames after the envelope, with the round-trip time.
async fn exchange(
    endpoint: &Endpoint,
    frames: Vec<Bytes>,
    timeout: Duration,
) -> Result<(Vec<Bytes>, Duration), Failure> {
    let io = |what: &str, e: &dyn std::fmt::Display| Failure {
        code: EXIT_FAILED,
        message: format!("{what} {endpoint}: {e}"),
    };
    let context = tmq::Context::new();
    let mut socket = tmq::dealer(&context)
        .set_linger(0)
        .connect(&endpoint.url())
        .map_err(|e| io("cannot connect to", &e))?;
    let mut message: Vec<tmq::Message> = vec![
        tmq::Message::from(&RPC_ID.to_be_bytes()[..]),
        tmq::Message::new(),
    ];
    message.extend(frames.iter().map(|f| tmq::Message::from(&f[..])));
    let started = Instant::now();
    let exchange = async {
        socket
            .send(message)
            .await
            .map_err(|e| io("cannot send to", &e))?;
        loop {
            let Some(reply) = socket.next().await else {
                return Err(io("connection lost to", &"socket closed"));
            };
            let reply: Vec<Bytes> = reply
                .map_err(|e| io("cannot receive from", &e))?
                .into_iter()
                .map(|m| Bytes::copy_from_slice(&m))
                .collect();
            match reply.as_slice() {
                [id, delimiter, rest @ ..]
                    if id.as_ref() == RPC_ID.to_be_bytes() && delimiter.is_empty() =>
                {
                    return Ok(rest.to_vec());
                }
                // Not ours (cannot happen on a fresh socket): keep waiting.
                _ => tracing::warn!(
                    frames = reply.len(),
                    "dropped a message without our envelope"
                ),
            }
        }
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(reply)) => Ok((reply, started.elapsed())),
        Ok(Err(failure)) => Err(failure),
        Err(_) => Err(Failure {
            code: EXIT_FAILED,
            message: format!(
                "no reply from {endpoint} within {} s",
                timeout.as_secs_f64()
            ),
        }),
    }
}
