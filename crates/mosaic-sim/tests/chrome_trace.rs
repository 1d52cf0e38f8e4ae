//! `chrome_trace`: the Chrome Trace Event format of simulated timelines.

use std::collections::HashMap;

use mosaic_sim::{chrome_trace, simulate, SimReport};
use serde_json::Value;

mod common;
use common::{clip_plan, planned, zoo};

#[test]
fn chrome_trace_has_the_event_format() {
    let (plan, m, c) = clip_plan();
    check_trace(&simulate(&plan, "clip.json", &m, &c).unwrap());
    let (m, c) = zoo("ofasys", "h100x32");
    check_trace(&simulate(&planned(&m, &c), "plan.json", &m, &c).unwrap());
}

fn check_trace(r: &SimReport) {
    let t = chrome_trace(r);
    assert_eq!(t["displayTimeUnit"], "ms");
    let events = t["traceEvents"].as_array().unwrap();
    let mut names = HashMap::new();
    let mut busy: HashMap<(u64, u64), Vec<(f64, f64)>> = HashMap::new();
    let mut complete = 0;
    for e in events {
        let ph = e["ph"].as_str().unwrap();
        assert!(e["name"].is_string() && e["pid"].is_u64());
        match ph {
            "M" => {
                if e["name"] == "thread_name" {
                    names.insert(
                        e["tid"].as_u64().unwrap(),
                        e["args"]["name"].as_str().unwrap().to_string(),
                    );
                }
            }
            "X" => {
                complete += 1;
                let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
                assert!(ts >= 0.0 && dur >= 0.0);
                // Viewers keep integer nanoseconds: compare there.
                let (ts, dur) = ((ts * 1e3).round(), (dur * 1e3).round());
                assert!(e["args"]["quota"].is_f64() && e["args"]["stage"].is_u64());
                let phase = e["args"]["phase"].as_str().unwrap();
                assert!(phase == "compute" || phase == "allreduce");
                let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
                busy.entry(key).or_default().push((ts, ts + dur));
            }
            "C" | "i" => assert!(e["ts"].is_f64() || e["ts"].is_u64()),
            other => panic!("unexpected phase {other}"),
        }
    }
    assert_eq!(complete, r.slices.len());
    // One named track per GPU; complete events on a track never overlap (the format
    // requires them to nest).
    for g in 0..r.gpus {
        assert!(names.values().any(|n| n == &format!("GPU {g}")), "GPU {g}");
    }
    for ((_, tid), v) in busy.iter_mut() {
        assert!(names.contains_key(tid));
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in v.windows(2) {
            assert!(w[0].1 <= w[1].0, "{w:?}");
        }
    }
    // ts in µs: the iteration's last event ends at iteration_ms × 1000 (here in ns).
    let end = busy.values().flatten().map(|x| x.1).fold(0.0, f64::max);
    assert!((end - r.iteration_ms * 1e6).abs() <= 1.0);
    let text = serde_json::to_string(&t).unwrap();
    let _: Value = serde_json::from_str(&text).unwrap();
}
