//! `lookup doctor`: the checks for a user whose hit rate looks low, with the
//! client's own settings (endpoint or Mooncake master, model, rank layout, block
//! size, the lifecycle keys of `spec/behaviour.md`, and a prompt's hashes).
//!
//! Each check prints one line, `ok`, `warn` or `fail`, what it found, and for a
//! `warn` or `fail` the fix; or `not checked` and why, for a check that needs an
//! answer from a store it could not reach (`prefetch` and `ttl` when reachability
//! failed), so that a default is never printed as `ok`:
//!
//! - `reachability`: something listens (the client's own check, with the connect's
//!   round trip), or the master (through etcd for `etcd://`) accepts and answers
//!   `ServiceReady`;
//! - `wire`: one lookup answered in the configured wire format (through a server), or
//!   one `BatchExistKey` query answered (a master), with its round trip;
//! - `prefetch`: whether the settings start lookups at arrival, and whether one that
//!   did answered before the first probe (a real `LookupClient`);
//! - `ttl`: `lookup_prefetch_ttl_s` against the store's read lease: the master's
//!   own when it reports it (`GetReplicaList` of the first block's first key, when
//!   that key exists), else `--lease-ttl-s`;
//! - `keys` (a master only): whether the first block's keys exist under the
//!   configured layout, else under which common alternative (model name forms, cache
//!   prefix, rank layouts) they do: see [`keys`].
//!
//! Exits 1 when any check fails, 2 for arguments that make no sense (a malformed
//! `--mooncake-master` among them).

mod keys;
mod prefetch;

use std::time::{Duration, Instant};

use clap::Args;
use lookup_core::wire::{self, Format, WireError};
use lookup_core::{BlockHashes, Endpoint};
use lookup_server::mooncake_master::{MasterClient, MasterError, StoreErrorCode};

use crate::args::{Master, Prompt, Target};
use crate::exchange::exchange;
use crate::settings::SettingFlags;
use crate::{EXIT_FAILED, Failure, master};

/// The master's default read lease (`default_kv_lease_ttl`) in seconds
/// (`spec/mooncake-master-rpc.md`, "The call").
const DEFAULT_LEASE_S: f64 = 10.0;

#[derive(Args, Debug)]
pub(crate) struct DoctorArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    master: Master,
    #[command(flatten)]
    prompt: Prompt,
    /// Wire format: `tagged-blob` (vLLM 0.33) or `msgpack-hex` (before vLLM #45659).
    #[arg(long, default_value = "tagged-blob")]
    format: Format,
    /// The lookup settings, one flag each (`--lookup-async`, `--lookup-prefetch-ttl-s`,
    /// ...), from their one definition.
    #[command(flatten)]
    settings: SettingFlags,
    /// The store's read lease in seconds (the master's `-default_kv_lease_ttl`, in
    /// ms there), granted to every key a lookup finds. With --mooncake-master the
    /// master's own lease replaces it when the first block's first key exists.
    #[arg(long, default_value_t = DEFAULT_LEASE_S)]
    lease_ttl_s: f64,
}

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Ok,
    Warn,
    Fail,
    /// Not observed: it needs an answer from a store that could not be reached.
    NotChecked,
}

/// The lines printed so far and the count of each status.
#[derive(Default)]
pub(crate) struct Report {
    fails: usize,
    warns: usize,
    oks: usize,
    not_checked: usize,
}

impl Report {
    /// Prints `{status} {check}: {finding}`, and `; fix: {fix}` when there is one.
    pub(crate) fn line(&mut self, status: Status, check: &str, finding: &str, fix: Option<&str>) {
        let word = match status {
            Status::Ok => {
                self.oks += 1;
                "ok"
            }
            Status::Warn => {
                self.warns += 1;
                "warn"
            }
            Status::Fail => {
                self.fails += 1;
                "fail"
            }
            Status::NotChecked => {
                self.not_checked += 1;
                "not checked"
            }
        };
        match fix {
            Some(fix) => println!("{word} {check}: {finding}; fix: {fix}"),
            None => println!("{word} {check}: {finding}"),
        }
    }

    pub(crate) fn ok(&mut self, check: &str, finding: &str) {
        self.line(Status::Ok, check, finding, None);
    }

    pub(crate) fn warn(&mut self, check: &str, finding: &str, fix: &str) {
        self.line(Status::Warn, check, finding, Some(fix));
    }

    pub(crate) fn fail(&mut self, check: &str, finding: &str, fix: &str) {
        self.line(Status::Fail, check, finding, Some(fix));
    }

    /// `not checked {check}: {why}`: the check needs what could not be observed.
    pub(crate) fn not_checked(&mut self, check: &str, why: &str) {
        self.line(Status::NotChecked, check, why, None);
    }

    /// `doctor: N ok, N warn, N fail`, and `, N not checked` when any was not.
    fn summary(&self) -> String {
        let mut line = format!(
            "doctor: {} ok, {} warn, {} fail",
            self.oks, self.warns, self.fails
        );
        if self.not_checked > 0 {
            line.push_str(&format!(", {} not checked", self.not_checked));
        }
        line
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// Runs every check and prints the summary; fails (exit 1) when any check failed.
pub(crate) async fn run(args: DoctorArgs) -> Result<(), Failure> {
    let block_hashes = args.prompt.block_hashes()?;
    let timeout = args.target.timeout()?;
    let layout = args.master.layout()?;
    if let Some(addr) = &args.master.mooncake_master {
        args.master.parse_addr(addr)?;
    }
    if !(args.lease_ttl_s.is_finite() && args.lease_ttl_s > 0.0) {
        return Err(Failure::usage("--lease-ttl-s must be above 0"));
    }
    let mut report = Report::default();
    let mut reported_lease: Result<Duration, String> = Err(
        "--lease-ttl-s; through a lookup server the master's own lease is not known here: \
         the server logs it and exports lookup_server_mooncake_lease_seconds"
            .to_owned(),
    );
    let reachable = match &args.master.mooncake_master {
        Some(addr) => {
            let checked = check_master(&mut report, addr, &args, &block_hashes, timeout).await;
            if let Some((master, version)) = &checked {
                keys::check(&mut report, master, &layout, &block_hashes).await;
                let first_key = block_hashes
                    .get(0)
                    .and_then(|first| layout.block_keys(first).into_iter().next());
                reported_lease = match first_key {
                    None => Err(
                        "--lease-ttl-s; no block hash was given to read the master's \
                                 lease with"
                            .to_owned(),
                    ),
                    Some(key) => master
                        .read_lease(&key)
                        .await
                        .map_err(|e| lease_unread(&e, version.as_deref())),
                };
            }
            checked.is_some()
        }
        None => {
            let endpoint = args.target.endpoint()?;
            check_server(&mut report, &endpoint, &args, &block_hashes, timeout).await
        }
    };
    prefetch::check(&mut report, &args, &block_hashes, reachable, timeout).await;
    check_ttl(&mut report, &args, reported_lease, reachable);
    println!("{}", report.summary());
    if report.fails > 0 {
        return Err(Failure {
            code: EXIT_FAILED,
            message: format!("{} check(s) failed", report.fails),
        });
    }
    Ok(())
}

/// `reachability` and `wire` through a lookup server; whether the rest can be asked.
async fn check_server(
    report: &mut Report,
    endpoint: &Endpoint,
    args: &DoctorArgs,
    block_hashes: &BlockHashes,
    timeout: Duration,
) -> bool {
    let started = Instant::now();
    if let Err(why) = lookup_tokio::check_reachable(endpoint).await {
        report.fail(
            "reachability",
            &format!("{endpoint}: {why}"),
            "start the lookup server, or give the endpoint it binds (--endpoint, or vLLM's \
             --base-path/--lookup-rpc-port/--hostname/--dp-rank)",
        );
        return false;
    }
    report.ok(
        "reachability",
        &format!("{endpoint} accepts connections ({})", ms(started.elapsed())),
    );
    let (num_tokens, block_size) = (args.prompt.num_tokens, args.prompt.block_size);
    let frames = wire::encode_lookup(args.format, num_tokens, block_size, block_hashes);
    let format = args.format;
    let other = match format {
        Format::TaggedBlob => "msgpack-hex",
        Format::MsgpackHex => "tagged-blob",
    };
    match exchange(endpoint, frames, timeout).await {
        Err(failure) => report.fail(
            "wire",
            &failure.message,
            &format!(
                "check that the server speaks {format} (--format {other} for an older vLLM) \
                 and is not stuck on another request"
            ),
        ),
        Ok((reply, round_trip)) => match wire::decode_lookup_reply(format, &reply) {
            Ok(reply) if reply.hit_tokens <= num_tokens && reply.hit_tokens % block_size == 0 => {
                report.ok(
                    "wire",
                    &format!(
                        "{format} reply in {}: hit_tokens {} of {num_tokens}",
                        ms(round_trip),
                        reply.hit_tokens
                    ),
                );
                if reply.hit_tokens == 0 && num_tokens > block_size {
                    report.warn(
                        "keys",
                        "the server answered 0 hit tokens: a cold cache, or a key layout \
                         (model, cache prefix, ranks) that differs from the writers'; through a \
                         lookup server the store's keys are not checked",
                        "run lookup doctor --mooncake-master ADDR with the server's --model, \
                         --cache-prefix, --tp-size and --pp-size",
                    );
                }
            }
            Ok(reply) => report.fail(
                "wire",
                &format!(
                    "the reply's hit_tokens {} breaks the guards (num_tokens {num_tokens}, \
                     block size {block_size}): the client answers it as 0",
                    reply.hit_tokens
                ),
                "give the block size the server uses (--block-size)",
            ),
            Err(WireError::StoreUnavailable) => report.fail(
                "wire",
                "the server answered that it could not ask its store (the store-unavailable \
                 error reply): the lookup channel works, the store behind it does not",
                "check the server's log and its Mooncake master (lookup doctor \
                 --mooncake-master ADDR)",
            ),
            Err(e) => report.fail(
                "wire",
                &format!("the reply does not decode as {format}: {e}"),
                &format!("check --format (the server may speak {other})"),
            ),
        },
    }
    true
}

/// Why the master's own lease is not used, after `GetReplicaList` of the first block's
/// first key failed with `error` (`spec/mooncake-master-rpc.md`, "Where the lease can
/// be read"): that key is not stored (`-704`), or the master did not report it in a
/// form this client reads, which names the version `ServiceReady` gave.
fn lease_unread(error: &MasterError, version: Option<&str>) -> String {
    match error {
        MasterError::Store { code, .. } if *code == StoreErrorCode::OBJECT_NOT_FOUND => {
            "--lease-ttl-s; the master reports its lease only for a key that exists, and \
             the first block's first key is not stored"
                .to_owned()
        }
        error => {
            let version = version.map_or_else(
                || "of unknown version (ServiceReady failed)".to_owned(),
                |v| format!("version {v}"),
            );
            format!(
                "--lease-ttl-s; the master's lease is unreadable: the master ({version}) \
                 did not report it: {error}"
            )
        }
    }
}

/// `reachability` and `wire` against a master; the connected client and the version
/// its `ServiceReady` reported, if any.
async fn check_master(
    report: &mut Report,
    addr: &str,
    args: &DoctorArgs,
    block_hashes: &BlockHashes,
    timeout: Duration,
) -> Option<(MasterClient, Option<String>)> {
    let (client, connect_time) = match master::connect(addr, &args.master, timeout).await {
        Ok(connected) => connected,
        Err(e) => {
            report.fail(
                "reachability",
                &format!("the Mooncake master at {addr}: {e}"),
                "start the master, or give its -rpc_address:-rpc_port (etcd://H:P;... and \
                 --mooncake-cluster-id for a high-availability cluster)",
            );
            return None;
        }
    };
    let leader = client
        .leader()
        .map(|l| format!(" (leader {}, view {})", l.leader, l.version))
        .unwrap_or_default();
    let started = Instant::now();
    let ready = client.service_ready().await;
    let version = ready.as_ref().ok().cloned();
    match ready {
        Ok(version) => report.ok(
            "reachability",
            &format!(
                "the Mooncake master at {addr}{leader} serves, version {version} (connect {}, \
                 ServiceReady {})",
                ms(connect_time),
                ms(started.elapsed())
            ),
        ),
        Err(e) => report.warn(
            "reachability",
            &format!("the Mooncake master at {addr}{leader} accepts but ServiceReady failed: {e}"),
            "an older master lacks ServiceReady; otherwise check the master's log",
        ),
    }
    let started = Instant::now();
    let layout = match args.master.layout() {
        Ok(layout) => layout,
        Err(_) => return Some((client, version)),
    };
    match master::ask(&client, &layout, &args.prompt, block_hashes).await {
        Ok(found) => report.ok(
            "wire",
            &format!(
                "BatchExistKey answered in {}: hit_tokens {} of {} ({})",
                ms(started.elapsed()),
                found.hit_tokens(),
                args.prompt.num_tokens,
                found.outcome()
            ),
        ),
        Err(e) => report.fail(
            "wire",
            &format!("the existence query failed: {e}"),
            "check the master's version (0.3.5 or later) and --tenant-id",
        ),
    }
    Some((client, version))
}

/// `ttl`: a cached result must not outlive the read lease that keeps its blocks
/// (`spec/mooncake-master-rpc.md`, "Where the lease can be read").
/// `reported` is the lease the master reported, which takes the place of
/// `--lease-ttl-s`, or why there is none. With the store unreachable and a TTL below
/// `--lease-ttl-s`, nothing was observed: `not checked`.
fn check_ttl(
    report: &mut Report,
    args: &DoctorArgs,
    reported: Result<Duration, String>,
    reachable: bool,
) {
    let ttl = args.settings.core.lookup_prefetch_ttl.as_secs_f64();
    let (lease, source) = match reported {
        Ok(lease) => (lease.as_secs_f64(), " (reported by the master)".to_owned()),
        Err(why) => (args.lease_ttl_s, format!(" (from {why})")),
    };
    if ttl < lease && !reachable {
        report.not_checked(
            "ttl",
            &format!(
                "the store is unreachable, so its read lease is not known (lookup_prefetch_ttl_s \
                 {ttl} s is below --lease-ttl-s {lease} s)"
            ),
        );
    } else if ttl >= lease {
        report.warn(
            "ttl",
            &format!(
                "lookup_prefetch_ttl_s {ttl} s is at or above the store's read lease {lease} \
                 s{source}: a cached hit may name blocks evicted since"
            ),
            "keep lookup_prefetch_ttl_s below the lease (--lookup-prefetch-ttl-s)",
        );
    } else {
        report.ok(
            "ttl",
            &format!(
                "lookup_prefetch_ttl_s {ttl} s is below the store's read lease {lease} s{source}"
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use lookup_server::mooncake_master::codec::{CodecError, FunctionId};

    use super::*;

    #[test]
    fn an_unread_lease_is_not_stored_or_unreadable_with_the_version() {
        let absent = MasterError::Store {
            code: StoreErrorCode::OBJECT_NOT_FOUND,
            key_index: Some(0),
        };
        assert_eq!(
            lease_unread(&absent, Some("2.0.0")),
            "--lease-ttl-s; the master reports its lease only for a key that exists, and \
             the first block's first key is not stored"
        );
        let other_layout = MasterError::MalformedReply {
            function: FunctionId::GET_REPLICA_LIST,
            source: CodecError::TypeHashMismatch {
                expected: 0x88c6_276c,
                got: 0x1234_5678,
            },
        };
        assert_eq!(
            lease_unread(&other_layout, Some("2.0.0")),
            format!(
                "--lease-ttl-s; the master's lease is unreadable: the master (version 2.0.0) \
                 did not report it: {other_layout}"
            )
        );
        assert!(
            lease_unread(&other_layout, None)
                .contains("the master (of unknown version (ServiceReady failed))")
        );
    }
}
