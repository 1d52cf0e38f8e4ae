//! `mosaic data` (the batching policies simulated), `mosaic bench data` and `mosaic compare`
//! with a data batch, as a user runs them.

use serde_json::Value;

mod common;
use common::{dir, example, json_of, mosaic, refused, s, stderr, stdout};

/// The JSON lines of a `mosaic data --json` run, one per policy.
fn rows(args: &[&str]) -> Vec<Value> {
    let o = mosaic(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

fn field(row: &Value, name: &str) -> f64 {
    row[name]
        .as_f64()
        .unwrap_or_else(|| panic!("{name} in {row}"))
}

#[test]
fn both_peers_beat_random_on_a_skewed_batch() {
    let rows = rows(&[
        "data",
        "--generate",
        "text",
        "--seed",
        "3",
        "--dp",
        "8",
        "--pp",
        "4",
        "--json",
    ]);
    let policies: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["random", "disttrain", "flowtrain"]);
    for r in &rows {
        assert_eq!(r["format"], "mosaic-data/1");
        assert_eq!(r["samples"], 1024);
        assert!(field(r, "iteration_ms") > 0.0);
        assert!((0.0..1.0).contains(&field(r, "bubble_fraction")));
        assert!(field(r, "dp_imbalance") >= 0.0);
    }
    let (random, disttrain, flowtrain) = (&rows[0], &rows[1], &rows[2]);
    for peer in [disttrain, flowtrain] {
        assert!(
            field(peer, "dp_imbalance") < field(random, "dp_imbalance"),
            "{peer}"
        );
        assert!(
            field(peer, "iteration_ms") < field(random, "iteration_ms"),
            "{peer}"
        );
    }
    assert!(field(disttrain, "bubble_fraction") < field(random, "bubble_fraction"));
}

#[test]
fn one_policy_gives_one_object_and_interleaved_1f1b_runs() {
    let rows = rows(&[
        "data",
        "--generate",
        "interleaved",
        "--count",
        "512",
        "--dp",
        "4",
        "--pp",
        "4",
        "--vpp",
        "2",
        "--policy",
        "disttrain",
        "--json",
    ]);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["policy"], "disttrain");
    assert_eq!(rows[0]["vpp"], 2);
    let table = stdout(&mosaic(&[
        "data",
        "--generate",
        "text",
        "--dp",
        "2",
        "--pp",
        "2",
    ]));
    assert!(
        table.contains("flowtrain") && table.contains("DP imbalance"),
        "{table}"
    );
}

#[test]
fn a_users_jsonl_batch_is_read() {
    let d = dir("jsonl");
    let file = d.join("batch.jsonl");
    let mut text = String::new();
    for i in 0..64 {
        text.push_str(&format!(
            "{{\"text_tokens\": {}, \"images\": [[{}, 336]], \"audio_seconds\": {}}}\n",
            20 + 37 * (i % 11),
            112 * (1 + i % 4),
            (i % 3) as f64 * 1.5
        ));
    }
    std::fs::write(&file, text).unwrap();
    let f = file.to_str().unwrap();
    let rows = rows(&["data", "--samples", f, "--dp", "4", "--pp", "2", "--json"]);
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["samples"], 64);

    let bad = d.join("bad.jsonl");
    std::fs::write(&bad, "{\"text_tokens\": 12}\n{\"text_tokens\": -4}\n").unwrap();
    let b = bad.to_str().unwrap();
    let o = mosaic(&["data", "--samples", b, "--dp", "4", "--pp", "2"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("bad.jsonl") && err.contains("text_tokens"),
        "{err}"
    );
}

#[test]
fn bad_simulations_are_refused() {
    refused(&[
        ("data --dp 8 --pp 4", "--samples"),
        ("data --generate text --dp 0 --pp 4", "--dp"),
        ("data --generate text --dp 8 --pp 0", "--pp"),
        ("data --generate text --dp 8", "--pp"),
        ("data --generate pareto --dp 8 --pp 4", "pareto"),
        ("data --generate text --count 0 --dp 8 --pp 4", "--count"),
        ("data --generate text --dp 8 --pp 4 --policy best", "best"),
        (
            "data --generate text --dp 8 --pp 4 --model clip",
            "backbone",
        ),
        ("data --generate text --dp 8 --pp 4 --device tpu", "tpu"),
        (
            "data --generate text --dp 8 --pp 3 --vpp 2 --microbatches 4",
            "microbatch",
        ),
        (
            "data --samples /nonexistent.jsonl --dp 8 --pp 4",
            "nonexistent",
        ),
        (
            "data --generate text --dp 2 --pp 2 --capacity 16 --policy flowtrain",
            "capacity",
        ),
    ]);
}

#[test]
fn bench_data_times_packing_and_reordering() {
    let v = json_of(&[
        "bench",
        "data",
        "--repeats",
        "1",
        "--samples",
        "64",
        "--reorder-samples",
        "256",
        "--json",
    ]);
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 6, "five capacities and the reordering");
    for r in rows {
        assert!(r["median_ms"].as_f64().unwrap() >= 0.0);
        assert!(r["microbatches"].as_u64().unwrap() >= 1);
    }
}

#[test]
fn compare_with_a_batch_slows_every_row_and_says_why() {
    let path = example();
    let p = path.to_str().unwrap();
    let base = json_of(&["compare", "--profiles", p, "--gpus", "8", "--json"]);
    let data = json_of(&[
        "compare",
        "--profiles",
        p,
        "--gpus",
        "8",
        "--generate",
        "interleaved",
        "--seed",
        "2",
        "--json",
    ]);
    let notes = data["notes"].to_string();
    assert!(notes.contains("data heterogeneity"), "{notes}");
    for (b, d) in base["rows"]
        .as_array()
        .unwrap()
        .iter()
        .zip(data["rows"].as_array().unwrap())
    {
        let (tb, td) = (field(b, "iteration_ms"), field(d, "iteration_ms"));
        assert!(td >= tb * (1.0 - 1e-2), "{}: {td} < {tb}", d["name"]);
        assert!(
            d["note"].as_str().unwrap().contains("data heterogeneity ×"),
            "{d}"
        );
    }
}

/// A sample of no tokens (`{}`, zeros) is refused with exit 2 by `mosaic data` and by
/// `mosaic compare --samples`, naming the file and the line, alone or among others; before,
/// a batch of them gave every policy 0 ms and `compare` NaN× slowdowns with exit 0.
#[test]
fn samples_of_no_tokens_are_refused_naming_file_and_line() {
    let d = dir("empty-samples");
    for (name, text, line) in [
        ("z.jsonl", "{}\n", 1),
        ("zero.jsonl", "{\"text_tokens\": 0}\n", 1),
        (
            "mixed.jsonl",
            "{\"text_tokens\": 300}\n{\"text_tokens\": 0, \"images\": []}\n{\"text_tokens\": 5}\n",
            2,
        ),
    ] {
        let file = d.join(name);
        std::fs::write(&file, text).unwrap();
        let f = s(&file);
        let says = format!("{name}, line {line}: ");
        refused(&[
            (format!("data --samples {f} --dp 2 --pp 2"), says.as_str()),
            (
                format!("compare --model qwen3-vl --cluster h100x8 --samples {f}"),
                says.as_str(),
            ),
            (
                format!("compare --model qwen3-vl --cluster h100x8 --samples {f} --json"),
                "no tokens",
            ),
        ]);
    }
}

/// A sample too large for any microbatch is refused naming the file (and the line).
#[test]
fn an_oversized_sample_names_its_file() {
    let d = dir("oversized");
    for (name, line) in [
        ("text.jsonl", "{\"text_tokens\": 16777216}"),
        ("image.jsonl", "{\"images\": [[65536, 65536]]}"),
    ] {
        let file = d.join(name);
        std::fs::write(&file, format!("{{\"text_tokens\": 9}}\n{line}\n")).unwrap();
        let f = s(&file);
        let says = format!("{name}, line 2: sample 1 has ");
        refused(&[
            (format!("data --samples {f} --dp 2 --pp 2"), says.as_str()),
            (
                format!("compare --model qwen3-vl --cluster h100x8 --samples {f}"),
                says.as_str(),
            ),
        ]);
    }
}

/// FlowTrain runs on plain 1F1B only: asking for it under `--vpp 2` is refused whatever the
/// seed (before, seed 1 ran and seed 2 was refused), and without `--policy` a `--vpp` above 1
/// runs the other policies.
#[test]
fn flowtrain_under_vpp_is_refused_whatever_the_seed() {
    for seed in ["1", "2", "3"] {
        refused(&[(
            format!(
                "data --generate interleaved --seed {seed} --dp 8 --pp 4 --vpp 2 --policy flowtrain"
            ),
            "FlowTrain runs on plain 1F1B only",
        )]);
    }
    refused(&[(
        "data --generate text --dp 2 --pp 2 --vpp 2 --policy random,flowtrain",
        "--vpp 1",
    )]);
    let rows = rows(&[
        "data",
        "--generate",
        "text",
        "--dp",
        "2",
        "--pp",
        "2",
        "--vpp",
        "2",
        "--json",
    ]);
    let policies: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["random", "disttrain"]);
    assert!(rows.iter().all(|r| r["vpp"] == 2));
}

/// Flags that would be ignored are refused: `--count` with `--samples` (the file sets the
/// count), `--capacity` without flowtrain among the policies (the only one it sizes).
#[test]
fn conflicting_flags_are_refused() {
    let d = dir("conflicts");
    let file = d.join("f.jsonl");
    std::fs::write(&file, "{\"text_tokens\": 5}\n{\"text_tokens\": 7}\n").unwrap();
    let f = s(&file);
    refused(&[
        (
            format!("data --samples {f} --count 5 --dp 1 --pp 1"),
            "--count",
        ),
        (
            format!("data --count 5 --samples {f} --dp 1 --pp 1"),
            "--samples",
        ),
        (
            "data --generate text --dp 2 --pp 2 --policy random,disttrain --capacity 4096"
                .to_string(),
            "--capacity",
        ),
        (
            "data --generate text --dp 2 --pp 2 --vpp 2 --capacity 4096".to_string(),
            "flowtrain",
        ),
    ]);
    // With flowtrain, --capacity is its own.
    let rows = rows(&[
        "data",
        "--generate",
        "text",
        "--dp",
        "2",
        "--pp",
        "2",
        "--policy",
        "flowtrain",
        "--capacity",
        "65536",
        "--json",
    ]);
    assert_eq!(rows.len(), 1);
}
