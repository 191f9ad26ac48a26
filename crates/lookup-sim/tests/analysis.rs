//! Tests of `cargo xtask simulate` above the engine: the stability verdict over
//! reruns, sweeps, the flags, and the default run's report.

mod common;

use std::sync::Arc;

use clap::Parser;
use common::{req, run, tiny_params};
use lookup_sim::engine::{SimParams, simulate};
use lookup_sim::mode::Mode;
use lookup_sim::trace::{TraceRequest, TraceSource};
use lookup_sim::{Args, generator, report};

/// The verdict over reruns: p99 11 s, 12 s and 30 s is a 2.73x spread, so unstable,
/// with what moved beside it.
#[test]
fn reruns_that_differ_more_than_2x_at_p99_are_flagged_unstable() {
    use lookup_sim::stability::{Verdict, describe};
    let trace = vec![req(0, 600, 1, &[9]), req(100, 600, 1, &[9])];
    let base = report::summarise(&run(&trace, Mode::Async, &tiny_params(1)), 100);
    let runs: Vec<_> = [
        (11_000.0, 40, 0.7),
        (12_000.0, 45, 0.72),
        (30_000.0, 2_900, 0.98),
    ]
    .into_iter()
    .map(|(p99, preemptions, kv)| {
        let mut s = base.clone();
        s.ttft_ms.p99 = p99;
        s.preemptions = preemptions;
        s.kv_occupancy_mean = kv;
        s.kv_occupancy_peak = 1.0;
        s
    })
    .collect();
    let v = Verdict::of(Mode::Async, &runs);
    assert!(!v.stable);
    assert_eq!(v.spread, 30.0 / 11.0);
    assert_eq!(
        v.cause(),
        "preemptions 40-2900, KV occupancy mean 70-98 % (peak 100 %), waiting queue peak 1-1: \
         the long-tailed reruns preempt far more (over-admission thrashes the KV cache)"
    );
    let stable = Verdict::of(Mode::Sync, &runs[..2]);
    assert!(stable.stable);
    assert_eq!(stable.spread, 12.0 / 11.0);
    let text = describe(&[stable, v]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "stability: UNSTABLE (async): TTFT p99 moves more than 2x, or a run collapses \
         (overload detector), over 3 perturbed reruns (seed, arrival rate +-1 %, order within \
         bursts, routing offset); one run of this setting is not a measurement"
    );
    assert_eq!(
        lines[1],
        "  sync           p99 11000.0-12000.0 ms (1.09x), collapsed 0/2 (95 % 0-66 %) stable"
    );
    assert!(lines[2].starts_with(
        "  async          p99 11000.0-30000.0 ms (2.73x), collapsed 0/3 (95 % 0-56 %) UNSTABLE: \
         preemptions 40-2900"
    ));
    // A collapsed run makes a setting unstable however close its p99s are.
    let mut flat = runs[..2].to_vec();
    flat[1].health.collapsed = true;
    flat[1].health.signs = vec!["drains 900 s after the last arrival".to_owned()];
    let collapsed = Verdict::of(Mode::Async, &flat);
    assert_eq!(collapsed.spread, 12.0 / 11.0);
    assert_eq!(collapsed.collapsed_runs, 1);
    assert_eq!(collapsed.collapse_rate, 0.5);
    assert!(!collapsed.stable);
    assert_eq!(collapsed.reruns.len(), 2);
    assert!(collapsed.cause().contains(
        "; collapsed in 1 of 2 runs (rate 50 %, 95 % interval 9-91 %), e.g. drains 900 s after the last arrival"
    ));
    // One run: nothing to compare.
    assert_eq!(
        describe(&[Verdict::of(Mode::Sync, &runs[..1])]),
        "stability: not checked (--repeats 1)\n"
    );
}

/// A sweep's grid, run on every core: two points x two modes x two reruns, each cell
/// the verdict of its reruns, in grid order.
#[test]
fn a_tiny_sweep_runs_every_point_mode_and_rerun() {
    use lookup_sim::runner::{Job, perturbed, run_jobs};
    use lookup_sim::sweep::{Axis, cell, grid, label};
    let trace: Arc<[TraceRequest]> = generator::generate(5, 60).into();
    let source = TraceSource::Memory(trace);
    let axes = [Axis::parse("server-concurrency=1,4").unwrap()];
    let points = grid(&axes, &SimParams::default(), (0.5, 10.0)).unwrap();
    let modes = [Mode::Sync, Mode::Prefetch];
    let jobs: Vec<Job> = points
        .iter()
        .flat_map(|pt| {
            modes.iter().flat_map(move |&mode| {
                (0..2).map(move |i| Job {
                    params: perturbed(&pt.params, i),
                    mode,
                })
            })
        })
        .collect();
    let results = run_jobs(&source, None, &jobs, &|_, _| {}).unwrap();
    assert_eq!(results.len(), 8);
    let summaries: Vec<_> = results.iter().map(|r| report::summarise(r, 832)).collect();
    let cells: Vec<_> = points
        .iter()
        .zip(summaries.chunks(4))
        .flat_map(|(pt, runs)| {
            modes
                .iter()
                .zip(runs.chunks(2))
                .map(|(&m, r)| cell(label(&axes, &pt.at), m, r))
                .collect::<Vec<_>>()
        })
        .collect();
    let names: Vec<(String, Mode)> = cells.iter().map(|c| (c.point.clone(), c.mode)).collect();
    assert_eq!(
        names,
        [
            ("server-concurrency=1".to_owned(), Mode::Sync),
            ("server-concurrency=1".to_owned(), Mode::Prefetch),
            ("server-concurrency=4".to_owned(), Mode::Sync),
            ("server-concurrency=4".to_owned(), Mode::Prefetch),
        ]
    );
    for (c, runs) in cells.iter().zip(summaries.chunks(2)) {
        assert_eq!(c.p99_ms, [runs[0].ttft_ms.p99, runs[1].ttft_ms.p99]);
        assert_eq!(c.verdict.runs, 2);
    }
    // Every run served every request, and the rerun is another run (rate +1 %).
    assert!(results.iter().all(|r| r.requests == 60));
    assert_eq!(jobs[1].params.rate_scale, 1.01);
}

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

#[test]
fn flags_parse_and_nonsense_is_refused() {
    let cli = Cli::try_parse_from([
        "simulate",
        "--modes",
        "sync,prefetch+",
        "--rate-scale",
        "2",
        "--limit",
        "9",
    ])
    .unwrap();
    assert_eq!(cli.args.modes, vec![Mode::Sync, Mode::PrefetchPlus]);
    let p = cli.args.params().unwrap();
    assert_eq!(p.rate_scale, 2.0);
    assert_eq!(cli.args.limit, Some(9));
    let d = SimParams::default();
    assert_eq!(p.engine.engines, d.engine.engines);
    assert_eq!(p.engine.router, d.engine.router);
    assert_eq!(p.engine.gpu_kv_blocks, d.engine.gpu_kv_blocks);
    assert_eq!(
        p.engine.max_num_batched_tokens,
        d.engine.max_num_batched_tokens
    );
    assert_eq!(p.store.capacity_blocks, d.store.capacity_blocks);
    assert_eq!(p.server.concurrency, d.server.concurrency);
    assert_eq!(p.lookup, d.lookup);
    assert_eq!(p.engine.step_fixed_s, d.engine.step_fixed_s);
    assert_eq!(p.server.fixed_s, d.server.fixed_s);
    assert!(Cli::try_parse_from(["simulate", "--modes", "fast"]).is_err());
    let err = |flags: &[&str]| {
        let mut argv = vec!["simulate"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv)
            .unwrap()
            .args
            .params()
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(&["--rate-scale", "0"]),
        "--rate-scale must be a finite number > 0, got 0"
    );
    assert_eq!(
        err(&["--server-fixed-ms=-1"]),
        "--server-fixed-ms must be a finite number >= 0, got -1"
    );
    assert_eq!(err(&["--engines", "0"]), "--engines must be at least 1");
}

#[test]
fn a_request_larger_than_the_gpu_is_refused_with_its_line() {
    let trace = vec![req(0, 600, 1, &[1]), req(0, 60_000, 1, &[])];
    let err = simulate(
        trace.into_iter().map(Ok),
        Mode::Sync,
        &tiny_params(1),
        &|_| {},
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "request 2 (60000 input + 1 output tokens) needs 3750 KV blocks of 16 tokens; a GPU has 3200 (--gpu-kv-blocks)"
    );
}

/// `cargo xtask simulate` with its defaults (here on 300 generated requests): the
/// table's lookup latency row holds each shown mode's figures, the stability verdict
/// is that of the ten perturbed reruns, and the run ends with a recommendation.
#[test]
fn the_default_run_prints_lookup_latency_stability_and_a_recommendation() {
    use lookup_sim::runner::{Job, perturbed, run_jobs};
    use lookup_sim::stability::{Verdict, describe};
    let cli = Cli::try_parse_from(["simulate", "--no-plot", "--gen-requests", "300"]).unwrap();
    let mut out = Vec::new();
    lookup_sim::run_to(&cli.args, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();

    // The same runs, made here: the default modes x 10 perturbed reruns.
    let params = cli.args.params().unwrap();
    assert_eq!(cli.args.repeats, 10);
    let modes = cli.args.modes.clone();
    assert_eq!(modes, Mode::ALL.to_vec());
    let jobs: Vec<Job> = (0..10)
        .flat_map(|i| {
            let p = perturbed(&params, i);
            modes.iter().map(move |&mode| Job {
                params: p.clone(),
                mode,
            })
        })
        .collect();
    let results = run_jobs(&cli.args.source(), None, &jobs, &|_, _| {}).unwrap();
    let kv = params.engine.gpu_kv_blocks;
    let summaries: Vec<_> = results.iter().map(|r| report::summarise(r, kv)).collect();
    assert_eq!(summaries[0].requests, 300);

    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("trace: generated"), "{}", lines[0]);
    let at = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting {prefix:?} in\n{text}"))
    };
    let cells = |line: &str, label: &str| -> Vec<String> {
        line[label.len()..]
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    };
    // The table's columns: every mode, or prefetch+ merged into prefetch(+).
    let requests_row = at("requests ");
    let labels: Vec<&str> = lines[requests_row - 1].split_whitespace().collect();
    let shown: Vec<Mode> = labels
        .iter()
        .map(|l| match *l {
            "prefetch(+)" => Mode::Prefetch,
            l => *Mode::ALL.iter().find(|m| m.name() == l).expect(l),
        })
        .collect();
    assert!(shown.len() == 5 || (shown.len() == 4 && labels.contains(&"prefetch(+)")));
    let base = |m: Mode| &summaries[modes.iter().position(|&x| x == m).unwrap()];
    let label = "lookup p50 / p99 (ms)";
    let expected: Vec<String> = shown
        .iter()
        .map(|&m| {
            let l = &base(m).lookups.total_ms;
            format!("{:.2} / {:.2}", l.p50, l.p99)
        })
        .collect();
    assert_eq!(cells(lines[at(label)], label), expected);
    let label = "  on the wire p50 / p99 (ms)";
    let expected: Vec<String> = shown
        .iter()
        .map(|&m| {
            let l = &base(m).lookups.on_wire_ms;
            format!("{:.2} / {:.2}", l.p50, l.p99)
        })
        .collect();
    assert_eq!(cells(lines[at(label)], label), expected);
    // Some lookups were made and took time.
    assert!(base(Mode::Async).lookups.total_ms.p99 > 0.0);

    // Each mode's reruns, a rerun's p99 over twice the best mode's median unhealthy.
    let of_mode = |i: usize| -> Vec<report::ModeSummary> {
        summaries
            .iter()
            .skip(i)
            .step_by(modes.len())
            .cloned()
            .collect()
    };
    let best_median = (0..modes.len())
        .map(|i| {
            let p99: Vec<f64> = of_mode(i).iter().map(|s| s.ttft_ms.p99).collect();
            lookup_sim::margin::median(&p99)
        })
        .fold(f64::INFINITY, f64::min);
    let verdicts: Vec<Verdict> = modes
        .iter()
        .enumerate()
        .map(|(i, &m)| {
            let mut runs = of_mode(i);
            for s in &mut runs {
                s.health.judge_tail(s.ttft_ms.p99, best_median);
            }
            Verdict::of(m, &runs)
        })
        .collect();
    let stability = describe(&verdicts);
    assert!(stability.starts_with("stability: "));
    assert!(text.contains(&stability), "{stability}\nnot in\n{text}");

    // The headline names a lookup setting (or says none is told apart and names the
    // cheapest), then how it was chosen, on which reruns.
    let r = at("recommendation: ");
    let head = lines[r];
    assert!(
        Mode::ALL
            .iter()
            .any(|m| head.contains(&format!(" {m}, server concurrency "))),
        "{head}"
    );
    assert!(
        !head.contains("GPU KV") && !head.contains("max_num_seqs"),
        "{head}"
    );
    assert!(
        lines[r + 1].starts_with("  chosen on reruns 0-9 among "),
        "{}",
        lines[r + 1]
    );
    assert!(
        lines[r + 1].contains(
            "margins measured on 10 fresh reruns (10-19), which took no part in the choice"
        ),
        "{}",
        lines[r + 1]
    );
    assert!(lines[r + 2].starts_with("  TTFT p99 "), "{}", lines[r + 2]);
    let capacity = at("  capacity, not lookup settings (");
    // 2x GPU KV, half and twice max_num_seqs.
    for (i, lever) in ["2x GPU KV (", "max_num_seqs 128 (", "max_num_seqs 512 ("]
        .iter()
        .enumerate()
    {
        assert!(
            lines[capacity + 1 + i].starts_with(&format!("    {lever}")),
            "{}",
            lines[capacity + 1 + i]
        );
    }
    // Why each other mode lost, two lines each: the modes searched (4: prefetch+
    // merged into prefetch, or 5) but the best tried and the recommended one, which
    // the headline names (one mode or two).
    let why = at("  why the other modes lost (each at its best setting, selection reruns):");
    let searched = at("  (searched in ");
    let losers = (searched - why - 1) / 2;
    assert_eq!(searched - why, 1 + 2 * losers, "{text}");
    assert!((2..=4).contains(&losers), "{text}");
    for l in lines[why + 1..searched].iter().step_by(2) {
        let mode = l.trim_start().split(':').next().unwrap_or_default();
        assert!(l.starts_with("    ") && !mode.is_empty(), "{l}");
        assert!(
            !head.contains(&format!("{mode}, server concurrency")),
            "{mode} lost but the headline names it: {head}"
        );
    }
    assert!(
        lines[why + 1..searched]
            .iter()
            .all(|l| l.starts_with("    "))
    );
}
