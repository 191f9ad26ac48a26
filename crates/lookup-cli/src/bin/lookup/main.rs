//! `lookup`: a command-line client of the lookup channel, for operators and scripts.
//!
//! ```text
//! lookup probe --endpoint ipc:///tmp/lookup.sock --num-tokens 48 --hashes 00..01,00..02
//! lookup probe --lookup-rpc-port 0 --dp-rank 0 --num-tokens 48 --hashes-file hashes.txt
//! lookup probe --mooncake-master 127.0.0.1:50051 --model Qwen3-8B --num-tokens 48 --hashes ...
//! lookup probe --mooncake-master 'etcd://10.0.0.1:2379;10.0.0.2:2379' --mooncake-cluster-id prod ...
//! lookup reset --endpoint tcp://127.0.0.1:5555
//! lookup doctor --endpoint ipc:///tmp/lookup.sock --num-tokens 48 --hashes-file hashes.txt
//! lookup hash --block-size 16 --tokens-file prompt-tokens.txt --out hashes.txt
//! ```
//!
//! `hash` turns token ids into the block hashes vLLM 0.33's engine computes
//! (`sha256` or `sha256_cbor`, with the engines' PYTHONHASHSEED and an optional
//! `cache_salt`), one hex hash a line: the file `--hashes-file` reads.
//!
//! `probe` sends one lookup (`spec/wire.md`, either format) and prints the hit tokens,
//! the tail-key boundaries and the round-trip time; `reset` sends one reset and prints
//! `ok` or `failed`. It uses one DEALER exchange `[id, "", frames...]`, which any
//! REP or ROUTER server answers, and prints the raw reply's content. Before sending it
//! checks that something listens (a missing ipc socket file or a refused tcp port
//! is named at once, instead of waiting `--timeout-s`).
//!
//! `probe --mooncake-master ADDR` asks the Mooncake master itself, as the client's
//! direct transport does (`spec/wire.md`, "What the server computes";
//! `spec/mooncake-master-rpc.md`), and prints the hit tokens and the outcome: `hit`,
//! `miss`, `not needed` (no full block), or `unavailable` with its cause (and then no
//! hit tokens).
//!
//! `doctor` runs the checks a user whose hit rate looks low needs (reachability, the
//! wire format, prefetch activity, the TTL against the store's lease, and against a
//! master whether any key of the configured layout exists), each `ok`, `warn` or
//! `fail` with the fix.
//!
//! Exit status: 0 success; 1 no reply within `--timeout-s`, a reset that failed, or
//! an unavailable master (which prints no `hit_tokens` line); 2 bad arguments (a
//! malformed `--mooncake-master` among them); 3 a malformed reply (wrong length, a hit
//! above `--num-tokens` or not a multiple of `--block-size`: `spec/wire.md`,
//! "Client-side guards"); 4 nothing listens at the endpoint (no socket file at the
//! ipc path, or the tcp port refused); `doctor`: 1 when any check fails.

mod args;
mod doctor;
mod exchange;
mod hash;
mod master;
mod settings;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lookup_core::wire::{self, Format, LookupReply, WireError};

use crate::args::{Master, Prompt, Target};
use crate::exchange::{ensure_reachable, exchange};

/// Exit status for a reply that did not come in time, a reset the server refused, an
/// unavailable master (asked directly, or the server's store-unavailable reply), or a
/// doctor's failed check.
pub(crate) const EXIT_FAILED: u8 = 1;
/// Exit status for arguments that do not make sense (clap uses it too).
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit status for a reply that breaks `spec/wire.md`.
pub(crate) const EXIT_MALFORMED: u8 = 3;
/// Exit status when nothing listens at the endpoint (no socket file, port refused).
pub(crate) const EXIT_UNREACHABLE: u8 = 4;
/// The RPC id put in the envelope of the one request.
pub(crate) const RPC_ID: u64 = 1;

#[derive(Parser, Debug)]
#[command(
    name = "lookup",
    version,
    about = "Ask a prefix-cache lookup server (vLLM's lookup channel) or a Mooncake master directly"
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
    /// Check why hits may be lost: reachability, wire format, prefetch, TTL against
    /// the lease, and whether the store holds any key of the configured layout.
    Doctor(doctor::DoctorArgs),
    /// Turn token ids into the block-hash file `--hashes-file` reads (vLLM's sha256
    /// or sha256_cbor block hashes, one hex hash a line).
    Hash(hash::HashArgs),
}

#[derive(clap::Args, Debug)]
struct ProbeArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    master: Master,
    #[command(flatten)]
    prompt: Prompt,
    /// Wire format: `tagged-blob` (vLLM 0.33) or `msgpack-hex` (before vLLM #45659).
    #[arg(long, default_value = "tagged-blob")]
    format: Format,
}

#[derive(clap::Args, Debug)]
struct ResetArgs {
    #[command(flatten)]
    target: Target,
}

/// A failure with its exit status.
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn usage(message: impl Into<String>) -> Self {
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
        Cmd::Doctor(args) => runtime.block_on(doctor::run(args)),
        Cmd::Hash(args) => hash::run(&args),
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
    let block_hashes = args.prompt.block_hashes()?;
    if let Some(addr) = &args.master.mooncake_master {
        return master::probe(
            addr,
            &args.master,
            &args.prompt,
            &block_hashes,
            &args.target,
        )
        .await;
    }
    let endpoint = args.target.endpoint()?;
    let timeout = args.target.timeout()?;
    let (num_tokens, block_size) = (args.prompt.num_tokens, args.prompt.block_size);
    let frames = wire::encode_lookup(args.format, num_tokens, block_size, &block_hashes);
    ensure_reachable(&endpoint).await?;
    let (reply, round_trip) = exchange(&endpoint, frames, timeout).await?;
    let malformed = |why: String| Failure {
        code: EXIT_MALFORMED,
        message: format!("malformed reply from {endpoint}: {why}"),
    };
    let LookupReply {
        hit_tokens,
        boundaries,
    } = wire::decode_lookup_reply(args.format, &reply).map_err(|e| match e {
        // `spec/wire.md`, "Store unavailable": the server is up, its store is not.
        WireError::StoreUnavailable => Failure {
            code: EXIT_FAILED,
            message: format!("{endpoint} could not ask its store: the answer is unavailable"),
        },
        e => malformed(e.to_string()),
    })?;
    if hit_tokens > num_tokens {
        return Err(malformed(format!(
            "hit_tokens {hit_tokens} is above num_tokens {num_tokens}"
        )));
    }
    if hit_tokens % block_size != 0 {
        return Err(malformed(format!(
            "hit_tokens {hit_tokens} is not a multiple of the block size {block_size}"
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
    let timeout = args.target.timeout()?;
    let frames =
        wire::encode_reset(Format::TaggedBlob).map_err(|e| Failure::usage(e.to_string()))?;
    ensure_reachable(&endpoint).await?;
    let (reply, round_trip) = exchange(&endpoint, frames, timeout).await?;
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
