//! `mosaic report` as a user runs it.

mod common;
use common::{dir, mosaic, s, stderr};

#[test]
fn report_writes_the_table_the_charts_and_the_data() {
    let out = dir("report");
    let o = mosaic(&["report", "--out", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = std::fs::read_to_string(out.join("table.md")).unwrap();
    for model in [
        "clip",
        "qwen3-vl",
        "unified-io-2",
        "imagebind",
        "ofasys",
        "ctvlm",
    ] {
        assert_eq!(
            table.matches(&format!("| {model} |")).count(),
            2,
            "{model} on 8 and 32 GPUs"
        );
    }
    for chart in ["iteration.svg", "utilisation.svg", "scale.svg"] {
        let svg = std::fs::read_to_string(out.join(chart)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{chart}"
        );
    }
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let cases = data["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 12);
    for case in cases {
        let time = |id: &str| {
            case["rows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["strategy"] == id)
                .unwrap()["iteration_ms"]
                .as_f64()
                .unwrap()
        };
        // Mosaic contains Megatron-LM's and DistMM's plans as special cases.
        assert!(
            time("mosaic-exact") <= time("megatron-lm") + 1e-6,
            "{}",
            case["model"]
        );
        assert!(
            time("mosaic-exact") <= time("distmm") + 1e-6,
            "{}",
            case["model"]
        );
    }
    assert_eq!(data["sweep"].as_array().unwrap().len(), 3);
}
