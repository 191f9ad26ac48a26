//! The pure parts of `cargo xtask bench`: percentiles and medians, ratios and goals,
//! the Python script's JSON, the payload's bytes, and the report's reduction.

use clap::Parser;
use xtask::bench::Args;
use xtask::bench::ours::{Placement, ProbeCosts};
use xtask::bench::payload::Payload;
use xtask::bench::python::PythonRun;
use xtask::bench::report::{Report, Row, parse_load_average, thousands};
use xtask::bench::stats::{
    CallCost, Goal, Summary, median, min_max, paired_ratio, paired_ratios, percentile, ratio,
};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

fn args(flags: &[&str]) -> Args {
    Cli::parse_from(std::iter::once("bench").chain(flags.iter().copied())).args
}

fn cost(n: u64, p50_ns: u64, p99_ns: u64) -> CallCost {
    CallCost { n, p50_ns, p99_ns }
}

#[test]
fn percentile_is_nearest_rank_like_the_python_script() {
    // The script's rule: index round(q * (n - 1)), halves rounded up.
    let sorted: Vec<u64> = (0..1000).map(|i| i * 10).collect();
    assert_eq!(percentile(&sorted, 0.5), Some(5000)); // round(499.5) = 500
    assert_eq!(percentile(&sorted, 0.99), Some(9890)); // round(989.01) = 989
    let odd: Vec<u64> = (0..202).collect();
    assert_eq!(percentile(&odd, 0.5), Some(101)); // round(100.5) = 101, not 100
    assert_eq!(percentile(&[7, 8, 9], 0.5), Some(8));
    assert_eq!(percentile(&[], 0.99), None);
}

#[test]
fn median_of_odd_even_and_nan() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
    assert_eq!(median(&[]), None);
}

#[test]
fn ratio_refuses_empty_denominators() {
    assert_eq!(ratio(6.0, 3.0), Some(2.0));
    assert_eq!(ratio(1.0, 0.0), None);
    assert_eq!(ratio(1.0, -2.0), None);
    assert_eq!(ratio(f64::INFINITY, 2.0), None);
    assert_eq!(ratio(1.0, f64::NAN), None);
}

#[test]
fn paired_ratio_is_the_median_of_per_run_ratios() {
    // Medians 20 and 10 would say 2.0; the runs of each repetition say 1.0, 3.0, 1.5.
    assert_eq!(
        paired_ratio(&[10.0, 30.0, 30.0], &[10.0, 10.0, 20.0]),
        Some(1.5)
    );
    // A run without a ratio is skipped.
    assert_eq!(paired_ratio(&[10.0, 30.0], &[0.0, 10.0]), Some(3.0));
    assert_eq!(paired_ratio(&[1.0], &[]), None);
    // The ratios themselves, in order, and their range.
    let ratios = paired_ratios(&[10.0, 0.5, 30.0, 30.0], &[10.0, 0.0, 10.0, 20.0]);
    assert_eq!(ratios, vec![1.0, 3.0, 1.5]);
    assert_eq!(min_max(&ratios), Some((1.0, 3.0)));
    assert_eq!(min_max(&[f64::NAN, 2.0]), Some((2.0, 2.0)));
    assert_eq!(min_max(&[]), None);
}

#[test]
fn call_cost_from_samples_and_median_of_runs() {
    let mut samples: Vec<u64> = (1..=200).rev().collect();
    // round(0.5 × 199) = 100 → 101; round(0.99 × 199) = 197 → 198.
    assert_eq!(
        CallCost::from_samples(&mut samples),
        Some(cost(200, 101, 198))
    );
    assert_eq!(CallCost::from_samples(&mut []), None);
    // p50 and p99 are reduced separately; counts add up.
    let runs = [
        cost(10, 100, 900),
        cost(10, 300, 500),
        cost(12, 200, 10_000),
    ];
    assert_eq!(CallCost::median_of(&runs), Some(cost(32, 200, 900)));
    assert_eq!(CallCost::median_of(&[]), None);
}

#[test]
fn summary_keeps_every_run() {
    let s = Summary::of(&[10.0, 30.0, 20.0, 40.0]).unwrap();
    assert_eq!((s.median, s.min, s.max), (25.0, 10.0, 40.0));
    assert_eq!(s.runs, vec![10.0, 30.0, 20.0, 40.0]);
    assert_eq!(Summary::of(&[]), None);
}

#[test]
fn goal_is_met_at_the_target_and_not_without_a_value() {
    let goal = |value| Goal {
        name: "x".into(),
        source: "goal: throughput",
        value,
        target: 0.85,
    };
    assert!(goal(Some(0.85)).met());
    assert!(!goal(Some(0.849)).met());
    assert!(!goal(None).met());
}

const PROBE_JSON: &str = r#"{"mode": "probe", "count": 500, "elapsed_s": 0.75, "lookups_per_s": 666.5, "wrong": 0, "timer_ns": 40, "calls": {"submit": {"n": 500, "p50_ns": 2233, "p99_ns": 11428}, "pending": {"n": 229, "p50_ns": 691, "p99_ns": 2914}, "ready": {"n": 500, "p50_ns": 1342, "p99_ns": 6730}, "all": {"n": 1229, "p50_ns": 2053, "p99_ns": 10206}}}"#;

#[test]
fn python_output_probe_mode() {
    // Whatever the script logged before, the last non-empty line is the JSON.
    let run = PythonRun::parse(&format!("a warning\n{PROBE_JSON}\n\n")).unwrap();
    assert_eq!(run.mode, "probe");
    assert_eq!(run.count, 500);
    assert_eq!(run.lookups_per_s, 666.5);
    assert_eq!(run.timer_ns, 40);
    let costs = run.probe_costs();
    assert_eq!(costs.submit, Some(cost(500, 2233, 11428)));
    assert_eq!(costs.pending, Some(cost(229, 691, 2914)));
    assert_eq!(costs.ready, Some(cost(500, 1342, 6730)));
    assert_eq!(costs.all, Some(cost(1229, 2053, 10206)));
    assert_eq!(costs.cached, None);
    assert_eq!(costs.timer_ns, 40);
}

#[test]
fn python_output_batch_mode_has_no_calls() {
    let run = PythonRun::parse(
        r#"{"mode": "batch", "count": 5000, "elapsed_s": 0.5, "lookups_per_s": 10000.0, "wrong": 0, "timer_ns": 41, "calls": {}}"#,
    )
    .unwrap();
    assert_eq!(run.lookups_per_s, 10000.0);
    assert!(run.calls.is_empty());
    // A kind with no calls (no lookup was ever pending) is absent, not zero.
    let costs = run.probe_costs();
    assert_eq!((costs.submit, costs.pending, costs.all), (None, None, None));
}

#[test]
fn python_output_errors_are_clear() {
    let err = |s: &str| format!("{:#}", PythonRun::parse(s).unwrap_err());
    assert_eq!(err("\n  \n"), "the Python script printed nothing");
    assert!(
        err("Traceback (most recent call last)")
            .starts_with("cannot read the Python script's output")
    );
    assert!(err(r#"{"mode": "batch", "count": 1}"#).contains("missing field `elapsed_s`"));
    assert_eq!(
        err(
            r#"{"mode": "batch", "count": 10, "elapsed_s": 1, "lookups_per_s": 10, "wrong": 3, "timer_ns": 40}"#
        ),
        "3 of 10 Python lookups answered a wrong hit"
    );
    assert_eq!(
        err(
            r#"{"mode": "batch", "count": 10, "elapsed_s": 1, "lookups_per_s": 0, "wrong": 0, "timer_ns": 40}"#
        ),
        "the Python script reported 0 lookups per second"
    );
}

#[test]
fn payload_frames_are_tagged_blob() {
    let p = Payload::new(64, 32, 16).unwrap();
    assert_eq!(p.num_tokens, 1025);
    assert_eq!(p.hit_tokens, 1024);
    assert_eq!(p.frames.len(), 4);
    assert_eq!(&p.frames[0][..], b"lookup");
    assert_eq!(&p.frames[1][..], &1025_u32.to_be_bytes());
    assert_eq!(&p.frames[2][..], &32_u16.to_be_bytes());
    assert_eq!(p.frames[3].len(), 64 * 32);
    // Hash i is 32 bytes of i, as the Python script builds it.
    assert_eq!(&p.frames[3][32 * 5..32 * 6], &[5_u8; 32]);
    assert_eq!(p.request_bytes(), 6 + 4 + 2 + 2048);
    assert_eq!(&p.reply[..], &[0, 0, 4, 0]);
    let req = p.request(9);
    assert_eq!((req.request_id.0, req.num_tokens), (9, 1025));
    assert!(Payload::new(64, 0, 16).is_err());
    assert!(Payload::new(64, 32, 0).is_err());
}

#[test]
fn quick_shrinks_counts_and_reps() {
    let full = args(&[]).settings().unwrap();
    assert_eq!(
        (
            full.reps,
            full.count,
            full.slow_count,
            full.probe_count,
            full.warmup
        ),
        (9, 5_000, 600, 400, 100)
    );
    let quick = args(&["--quick"]).settings().unwrap();
    assert_eq!(
        (
            quick.reps,
            quick.count,
            quick.slow_count,
            quick.probe_count,
            quick.warmup
        ),
        (2, 500, 60, 40, 20)
    );
    let err = |flags: &[&str]| args(flags).settings().unwrap_err().to_string();
    assert_eq!(err(&["--reps", "0"]), "--reps must be at least 1");
    assert_eq!(
        err(&["--index-ms", "0"]),
        "--index-ms must be a positive number of milliseconds"
    );
}

fn costs(pending: CallCost, cached: CallCost, all: CallCost) -> ProbeCosts {
    ProbeCosts {
        pending: Some(pending),
        cached: Some(cached),
        ready: Some(cached),
        all: Some(all),
        ..ProbeCosts::default()
    }
}

#[test]
fn report_ratios_and_goals() {
    let settings = args(&["--reps", "3"]).settings().unwrap();
    let mut report = Report::new(settings, Some("27.3.0".into()));
    for (bare, ours) in [(10_000.0, 9_000.0), (11_000.0, 8_000.0), (9_000.0, 9_500.0)] {
        report.add_throughput(Row::Bare, bare);
        report.add_throughput(Row::OursSync, ours);
    }
    for (n1, n4, python) in [(800.0, 3_200.0, 700.0), (820.0, 3_100.0, 800.0)] {
        report.add_throughput(Row::SlowOursBatch1, n1);
        report.add_throughput(Row::SlowOursBatch4, n4);
        report.add_throughput(Row::SlowPythonBatch, python);
    }
    report.add_probe_costs(
        Placement::OneThread,
        costs(cost(10, 100, 200), cost(5, 50, 100), cost(20, 100, 400)),
    );
    report.add_probe_costs(
        Placement::TwoThreads,
        costs(cost(10, 125, 250), cost(5, 40, 100), cost(20, 100, 400)),
    );
    report.add_python_probe_costs(costs(
        cost(10, 2_500, 4_000),
        cost(5, 1_500, 3_000),
        cost(20, 2_000, 8_000),
    ));
    let done = report.finish();
    let by_row = |row: Row| done.rows.iter().find(|r| r.row == row).unwrap();
    assert_eq!(by_row(Row::Bare).summary.median, 10_000.0);
    assert_eq!(by_row(Row::OursSync).summary.median, 9_000.0);
    // Per repetition 0.9, 0.727 and 1.056: the median is 0.9.
    assert_eq!(by_row(Row::OursSync).vs_bare, Some(0.9));
    // Ratios pair the runs of one repetition: medians of 3,200 / 800 and 3,100 / 820.
    let vs_n1 = f64::midpoint(3_200.0 / 800.0, 3_100.0 / 820.0);
    let vs_python = f64::midpoint(3_200.0 / 700.0, 3_100.0 / 800.0);
    assert_eq!(by_row(Row::SlowOursBatch4).vs_n1, Some(vs_n1));
    assert_eq!(by_row(Row::SlowOursBatch4).vs_python, Some(vs_python));
    assert!(done.rows.iter().all(|r| r.row != Row::PythonBatch));

    let goal = |name: &str| {
        let g = done.goals.iter().find(|g| g.name == name).unwrap();
        (g.value, g.met())
    };
    // The worse placement decides: pending 2,500 / 125 (two threads) = 20.
    assert_eq!(
        goal("caller cost, pending probe p50: Python / ours"),
        (Some(20.0), true)
    );
    assert_eq!(
        goal("caller cost, pending probe p99: Python / ours"),
        (Some(16.0), false)
    );
    // Cached probes are held against the Python call that reads the result.
    assert_eq!(
        goal("caller cost, cached probe (Py: result read) p50: Python / ours"),
        (Some(30.0), true)
    );
    assert_eq!(
        goal("caller cost, all calls p99: Python / ours"),
        (Some(20.0), true)
    );
    assert_eq!(
        goal("N=1 sync / bare REQ-REP, in-memory index"),
        (Some(0.9), true)
    );
    assert_eq!(goal("N=4 / N=1 (async), slow index"), (Some(vs_n1), true));
    assert_eq!(
        goal("N=4 / Python design, slow index"),
        (Some(vs_python), true)
    );

    let table = done.table();
    let bare_line = format!("{:<46} {:>9}", Row::Bare.label(), "10,000");
    assert!(table.contains(&bare_line), "{table}");
    assert!(table.contains("[not met] caller cost, pending probe p99"));
}

#[test]
fn thousands_and_load_average() {
    assert_eq!(thousands(1_234_567.8), "1,234,568");
    assert_eq!(thousands(999.4), "999");
    assert_eq!(thousands(-1_000.0), "-1,000");
    assert_eq!(thousands(f64::NAN), "-");
    assert_eq!(
        parse_load_average("2.92 2.51 2.03 3/412 26941\n"),
        Some([2.92, 2.51, 2.03])
    );
    assert_eq!(parse_load_average("2.92 x"), None);
}
