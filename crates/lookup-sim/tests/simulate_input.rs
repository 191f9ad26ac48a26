//! `cargo xtask simulate --trace FILE` on a file with a bad line: the error names the
//! file, the mode that read it and the line and column.

use clap::Parser;
use lookup_sim::Args;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

/// A quick run: one repeat of the sync mode, no plot, no recommendation.
const QUICK: [&str; 7] = [
    "simulate",
    "--no-plot",
    "--no-recommend",
    "--repeats",
    "1",
    "--modes",
    "sync",
];

#[test]
fn a_bad_trace_line_is_named_with_its_file_and_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("t.jsonl");
    std::fs::write(
        &path,
        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, 2]}\n{oops}\n",
    )
    .expect("write");
    let path_text = path.display().to_string();
    let cli =
        Cli::try_parse_from(QUICK.iter().copied().chain(["--trace", &path_text])).expect("flags");
    let mut out = Vec::new();
    let err = lookup_sim::run_to(&cli.args, &mut out).expect_err("a bad line");
    assert_eq!(
        format!("{err:#}"),
        format!(
            "{path_text}: sync mode: line 2, column 2: not a trace record (key must be a string)"
        )
    );
}

/// The output files' folders are made before the run (as `--plot`'s is); one that
/// cannot be made fails the run before it starts, named, with nothing printed.
#[test]
fn output_folders_are_made_before_the_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("a/b/out.json");
    let series = dir.path().join("c/series.jsonl");
    let (json_text, series_text) = (json.display().to_string(), series.display().to_string());
    let quick: Vec<&str> = QUICK
        .iter()
        .copied()
        .chain(["--gen-requests", "100"])
        .collect();
    let cli = Cli::try_parse_from(quick.iter().copied().chain([
        "--json",
        &json_text,
        "--timeseries",
        &series_text,
    ]))
    .expect("flags");
    let mut out = Vec::new();
    lookup_sim::run_to(&cli.args, &mut out).expect("a run into new folders");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON")).expect("JSON");
    assert_eq!(doc["requests"], 100);
    assert!(std::fs::metadata(&series).expect("the time series").len() > 0);

    // A file where the folder should be.
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "").expect("write");
    let inside = blocker.join("out.json");
    let inside_text = inside.display().to_string();
    let cli =
        Cli::try_parse_from(quick.iter().copied().chain(["--json", &inside_text])).expect("flags");
    let mut out = Vec::new();
    let err = lookup_sim::run_to(&cli.args, &mut out).expect_err("no folder");
    assert!(
        format!("{err:#}").starts_with(&format!(
            "creating {} for {inside_text}: ",
            blocker.display()
        )),
        "{err:#}"
    );
    assert!(out.is_empty(), "the run did not start");
}
