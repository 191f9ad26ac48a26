//! `cargo xtask fidelity --against vllm`: lookup-sim's engine against vLLM 0.33's own
//! `Scheduler`, `KVCacheManager` and `BlockPool`, step by step.
//!
//! For each slice (a trace × a KV pressure × a connector answer × async scheduling
//! on, as vLLM 0.33 resolves it for one GPU, or off, [`scenario`]) it
//! writes the scenario file, runs the harness `scripts/vllm/fidelity/harness.py`
//! (vLLM's scheduler from its wheel, with a stand-in model runner and connector)
//! on it, runs lookup-sim's engine on the same scenario in step time
//! (`lookup_sim::engine::stepped::run_steps`), compares the two step logs
//! (`compare`), prints the first divergence with its context, and a summary per
//! slice: steps, identical steps, TTFT p50/p99 in steps on each side and their
//! ratio. Fails when a slice is below `--min-identical-pct`.
//!
//! Traces: the embedded generated one (`default`, conversation-trace shape),
//! `conversation` read from `../shared/traces/` beside the repository, and `agent`,
//! generated in the agent shape (`lookup_sim::generator::agent`: sessions of turns,
//! each prompt the previous one plus its output and a tool result; no real tool or
//! agent trace is available). `synthetic` (read beside `conversation`) is there on
//! request.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use super::compare::{self, Comparison, divergence_context, quantile};
use super::scenario::{self, Answers, Pressure, Shape};
use crate::simulate::engine::stepped::{self, Scenario, StepLine};
use crate::simulate::generator::agent::generate_agent;
use crate::simulate::trace::{TraceRequest, TraceSource};

/// Which trace a slice is cut from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceName {
    /// The embedded generator (conversation-trace shape), `--seed`.
    Default,
    /// `../shared/traces/conversation_trace.jsonl`.
    Conversation,
    /// `../shared/traces/synthetic_trace.jsonl`.
    Synthetic,
    /// The generated agent-shaped trace (`lookup_sim::generator::agent`), `--seed`.
    Agent,
}

impl TraceName {
    fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Conversation => "conversation",
            Self::Synthetic => "synthetic",
            Self::Agent => "agent",
        }
    }
}

/// Flags of `--against vllm`.
#[derive(Debug, Clone, clap::Args)]
pub struct VllmArgs {
    /// Traces to cut slices from.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "default,conversation,agent"
    )]
    pub traces: Vec<TraceName>,
    /// KV pressures.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "none,some,heavy"
    )]
    pub pressures: Vec<Pressure>,
    /// Connector answers.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ready,pending,missing,load,pending-load"
    )]
    pub answers: Vec<Answers>,
    /// vLLM's `scheduler_reserve_full_isl` per slice (true is vLLM's default; with
    /// false, admissions check the first chunk only and heavy pressure preempts
    /// often).
    #[arg(long, value_delimiter = ',', default_value = "true", action = clap::ArgAction::Set)]
    pub reserve_full_isl: Vec<bool>,
    /// vLLM's `async_scheduling` per slice: true is what vLLM 0.33 resolves it to
    /// for one GPU (vllm/config/vllm.py, `async_scheduling is None`): its
    /// `AsyncScheduler` in `EngineCore.step_with_batch_queue`, two batches in flight;
    /// false runs `Scheduler` in `EngineCore.step`. Slices at false are named
    /// `.../sync`.
    #[arg(long, value_delimiter = ',', default_value = "true,false", action = clap::ArgAction::Set)]
    pub async_scheduling: Vec<bool>,
    /// Requests per slice (the trace's first N).
    #[arg(long, value_name = "N", default_value_t = 40)]
    pub requests: usize,
    /// Trace milliseconds per scheduler step (arrivals).
    #[arg(long, value_name = "MS", default_value_t = 50)]
    pub ms_per_step: u64,
    /// Output tokens per request at most.
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub max_output: u32,
    /// Token budget per step.
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: u32,
    /// Most running requests.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: u32,
    /// Steps at most per slice.
    #[arg(long, default_value_t = 20_000)]
    pub max_steps: u64,
    /// The harness (default scripts/vllm/fidelity/harness.py).
    #[arg(long, value_name = "PATH")]
    pub harness: Option<PathBuf>,
    /// Python for the harness (default the project venv's, `.venv/bin/python`, else
    /// `python3`).
    #[arg(long, value_name = "PATH")]
    pub vllm_python: Option<PathBuf>,
    /// vLLM 0.33.0's wheel (default the one scripts/python/env.sh downloads into
    /// target/vllm-wheel).
    #[arg(long, value_name = "PATH")]
    pub wheel: Option<PathBuf>,
    /// Where scenarios and both step logs are written (default target/fidelity-vllm).
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
    /// Steps shown either side of the first divergence.
    #[arg(long, default_value_t = 3)]
    pub context: usize,
    /// Tokens under one hash of lookup-sim's prefix cache in the comparison: 16
    /// (vLLM's blocks) or 512 (the timed simulator's default groups), to measure
    /// what the coarser groups change.
    #[arg(long, value_name = "TOKENS", default_value_t = 16)]
    pub hash_tokens: u32,
    /// Fail when a slice has fewer identical steps (%).
    #[arg(long, default_value_t = 99.0)]
    pub min_identical_pct: f64,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the repository")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from)
}

/// The wheel: `--wheel`, else the first vllm-0.33.0 wheel in the target dirs.
fn find_wheel(args: &VllmArgs) -> anyhow::Result<PathBuf> {
    if let Some(w) = &args.wheel {
        return Ok(w.clone());
    }
    for dir in [
        target_dir().join("vllm-wheel"),
        root().join("target/vllm-wheel"),
    ] {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("vllm-0.33.0-") && name.ends_with(".whl") {
                    return Ok(e.path());
                }
            }
        }
    }
    bail!(
        "vLLM 0.33.0's wheel is not in target/vllm-wheel: run `bash scripts/python/test.sh` once \
         (it downloads it through scripts/python/env.sh) or pass --wheel"
    )
}

fn python(args: &VllmArgs) -> PathBuf {
    if let Some(p) = &args.vllm_python {
        return p.clone();
    }
    let venv = root().join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// The first `n` requests of `trace`.
fn slice(trace: TraceName, n: usize, seed: u64) -> anyhow::Result<Vec<TraceRequest>> {
    let source = match trace {
        TraceName::Default => TraceSource::Generated { seed, requests: n },
        TraceName::Agent => return Ok(generate_agent(seed, n)),
        TraceName::Conversation | TraceName::Synthetic => {
            let file = format!("{}_trace.jsonl", trace.name());
            let path = root().join("..").join("shared/traces").join(&file);
            if !path.exists() {
                bail!(
                    "{} not found: the real traces are read from ../shared/traces/ beside the repository",
                    path.display()
                );
            }
            TraceSource::File(path)
        }
    };
    let reqs: Result<Vec<_>, _> = source.open(Some(n))?.collect();
    Ok(reqs?)
}

fn write_lines(path: &Path, lines: &[StepLine], end: &stepped::EndLine) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for l in lines {
        serde_json::to_writer(&mut f, l)?;
        f.write_all(b"\n")?;
    }
    serde_json::to_writer(&mut f, end)?;
    f.write_all(b"\n")?;
    Ok(())
}

/// Reads a step log (the last line is the end line).
fn read_lines(path: &Path) -> anyhow::Result<Vec<StepLine>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() || l.contains("\"end\"") {
            continue;
        }
        out.push(
            serde_json::from_str(l)
                .with_context(|| format!("{} line {}: not a step line", path.display(), i + 1))?,
        );
    }
    Ok(out)
}

/// Runs the harness on `scenario_path`, writing `out`.
fn run_harness(
    args: &VllmArgs,
    wheel: &Path,
    scenario_path: &Path,
    out: &Path,
) -> anyhow::Result<()> {
    let harness = args
        .harness
        .clone()
        .unwrap_or_else(|| root().join("scripts/vllm/fidelity/harness.py"));
    if !harness.exists() {
        bail!("the vLLM harness {} is missing", harness.display());
    }
    let py = python(args);
    let status = Command::new(&py)
        .arg(&harness)
        .arg("--wheel")
        .arg(wheel)
        .arg("--scenario")
        .arg(scenario_path)
        .arg("--out")
        .arg(out)
        .status()
        .with_context(|| format!("starting {} {}", py.display(), harness.display()))?;
    if !status.success() {
        bail!(
            "the vLLM harness failed ({status}) on {}",
            scenario_path.display()
        );
    }
    Ok(())
}

/// One slice's outcome.
struct SliceResult {
    name: String,
    c: Comparison,
}

/// Runs every slice and prints the summary.
///
/// # Errors
/// A trace that cannot be read, the harness missing or failing, or a slice below
/// `--min-identical-pct`.
pub fn run(args: &VllmArgs, seed: u64) -> anyhow::Result<()> {
    if args.requests == 0 {
        bail!("--requests must be at least 1");
    }
    let wheel = find_wheel(args)?;
    let dir = args
        .out_dir
        .clone()
        .unwrap_or_else(|| target_dir().join("fidelity-vllm"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut results = Vec::new();
    for &trace in &args.traces {
        let reqs = slice(trace, args.requests, seed)?;
        for (&pressure, &gate, &overlap) in args.pressures.iter().flat_map(|p| {
            args.reserve_full_isl
                .iter()
                .flat_map(move |g| args.async_scheduling.iter().map(move |a| (p, g, a)))
        }) {
            let shape = Shape {
                ms_per_step: args.ms_per_step,
                max_output: args.max_output,
                max_num_batched_tokens: args.max_num_batched_tokens,
                max_num_seqs: args.max_num_seqs,
                max_steps: args.max_steps,
                reserve_full_isl: gate,
                async_scheduling: overlap,
            };
            for &answers in &args.answers {
                let gate_name = if gate { "" } else { "/no-gate" };
                let sync_name = if overlap { "" } else { "/sync" };
                let name = format!(
                    "{}/{}{gate_name}/{}{sync_name}",
                    trace.name(),
                    pressure.name(),
                    answers.name()
                );
                let sc = scenario::build(&reqs, pressure, answers, &shape)?;
                let base = dir.join(name.replace('/', "-"));
                let sc_path = base.with_extension("scenario.json");
                std::fs::write(&sc_path, serde_json::to_vec(&sc)?)?;
                let (sim, end) = stepped::run_steps(&sc, args.hash_tokens)
                    .with_context(|| format!("lookup-sim on {name}"))?;
                write_lines(&base.with_extension("lookup-sim.jsonl"), &sim, &end)?;
                let vllm_path = base.with_extension("vllm.jsonl");
                run_harness(args, &wheel, &sc_path, &vllm_path)?;
                let vllm = read_lines(&vllm_path)?;
                let c = compare::compare(&sc, &sim, &vllm);
                report_slice(&name, &sc, &c, &sim, &vllm, args.context);
                results.push(SliceResult { name, c });
            }
        }
    }
    print!("{}", summary(&results));
    let low: Vec<&str> = results
        .iter()
        .filter(|r| r.c.identical_pct() < args.min_identical_pct)
        .map(|r| r.name.as_str())
        .collect();
    if !low.is_empty() {
        bail!(
            "{} of {} slices below {} % identical steps: {}",
            low.len(),
            results.len(),
            args.min_identical_pct,
            low.join(", ")
        );
    }
    Ok(())
}

fn report_slice(
    name: &str,
    sc: &Scenario,
    c: &Comparison,
    sim: &[StepLine],
    vllm: &[StepLine],
    context: usize,
) {
    eprintln!(
        "{name}: {} requests, {} KV blocks, {} steps, {:.1} % identical",
        sc.requests.len(),
        sc.settings.num_gpu_blocks,
        c.steps,
        c.identical_pct()
    );
    if let Some(at) = c.first_divergence {
        let fields: Vec<String> = c.by_field.iter().map(|(f, n)| format!("{f} {n}")).collect();
        eprintln!(
            "  first divergence at step {at} (steps differing by field: {})",
            fields.join(", ")
        );
        eprint!("{}", divergence_context(sim, vllm, at, context));
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        f64::NAN
    } else {
        a as f64 / b as f64
    }
}

fn summary(results: &[SliceResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<34} {:>6} {:>10} {:>8} {:>15} {:>7} {:>15} {:>7}",
        "slice",
        "steps",
        "identical",
        "first",
        "TTFT p50 sim/v",
        "ratio",
        "TTFT p99 sim/v",
        "ratio"
    );
    for r in results {
        let c = &r.c;
        let (s50, v50) = (quantile(&c.ttft_sim, 0.5), quantile(&c.ttft_vllm, 0.5));
        let (s99, v99) = (quantile(&c.ttft_sim, 0.99), quantile(&c.ttft_vllm, 0.99));
        let _ = writeln!(
            out,
            "{:<34} {:>6} {:>9.1}% {:>8} {:>15} {:>7.3} {:>15} {:>7.3}",
            r.name,
            c.steps,
            c.identical_pct(),
            c.first_divergence.map_or("-".to_owned(), |s| s.to_string()),
            format!("{s50}/{v50}"),
            ratio(s50, v50),
            format!("{s99}/{v99}"),
            ratio(s99, v99),
        );
    }
    out
}
