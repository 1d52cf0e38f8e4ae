//! The simulated timeline as a Chrome Trace Event file, which Perfetto (ui.perfetto.dev) and
//! chrome://tracing open as is.

use serde_json::{json, Value};

use crate::report::{SimReport, Slice};

/// Microseconds from milliseconds, to the nanosecond.
fn us(ms: f64) -> f64 {
    (ms * 1e6).round() / 1e3
}

/// The report's timeline in the Chrome Trace Event format: `{"traceEvents": [...],
/// "displayTimeUnit": "ms"}`.
///
/// - one process per node (`pid` = node, named `node 0`, …);
/// - one thread per GPU (`tid`, named `GPU 3`). Co-located modules run at the same time on a
///   GPU, and the format requires the complete events of one thread to nest, so a GPU with
///   several modules in a stage gets one thread per module slot: `GPU 3` for the first and
///   `GPU 3 · slot 2`, … for the others, sorted together;
/// - one `"X"` complete event per slice, named after the module, `cat` = its phase, with
///   `ts`/`dur` in µs and `args` = quota, stage (1-based, as the tables print it), phase and
///   GPU;
/// - a global instant event at every stage start, and a `"C"` counter track with the pool's
///   mean utilisation and occupancy over time.
pub fn chrome_trace(report: &SimReport) -> Value {
    let lanes = report.slices.iter().map(|s| s.lane).max().unwrap_or(0) + 1;
    let tid = |gpu: u32, lane: usize| gpu as usize * lanes + lane;
    let mut events = track_names(report, tid);
    events.extend(report.stages.iter().map(|st| {
        json!({"name": format!("stage {}", st.index + 1), "ph": "i", "s": "g",
               "ts": us(st.start_ms), "pid": 0, "tid": 0,
               "args": {"simulated_ms": st.time_ms, "predicted_ms": st.predicted_ms}})
    }));
    events.extend(
        report
            .slices
            .iter()
            .map(|s| slice_event(s, tid(s.gpu, s.lane))),
    );
    events.extend(counters(report));
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "plan": report.plan,
            "model": report.model,
            "cluster": report.cluster,
            "iteration_ms": report.iteration_ms,
            "predicted_ms": report.predicted_ms,
        },
    })
}

/// The metadata events naming and ordering the processes (nodes) and threads (GPU slots, at
/// `tid(gpu, lane)`): every GPU of the pool gets its track, busy or not.
fn track_names(report: &SimReport, tid: impl Fn(u32, usize) -> usize) -> Vec<Value> {
    let mut events = Vec::new();
    let mut nodes: Vec<u32> = report.slices.iter().map(|s| s.node).collect();
    let mut threads: Vec<(u32, u32, usize)> = report
        .slices
        .iter()
        .map(|s| (s.node, s.gpu, s.lane))
        .collect();
    let gpn = report.gpus_per_node.max(1);
    for gpu in 0..report.gpus {
        nodes.push(gpu / gpn);
        threads.push((gpu / gpn, gpu, 0));
    }
    nodes.sort_unstable();
    nodes.dedup();
    threads.sort_unstable();
    threads.dedup();
    for &node in &nodes {
        events.push(
            json!({"name": "process_name", "ph": "M", "pid": node, "tid": 0,
                           "args": {"name": format!("node {node}")}}),
        );
        events.push(
            json!({"name": "process_sort_index", "ph": "M", "pid": node, "tid": 0,
                           "args": {"sort_index": node}}),
        );
    }
    for &(node, gpu, lane) in &threads {
        let name = if lane == 0 {
            format!("GPU {gpu}")
        } else {
            format!("GPU {gpu} · slot {}", lane + 1)
        };
        events.push(
            json!({"name": "thread_name", "ph": "M", "pid": node, "tid": tid(gpu, lane),
                           "args": {"name": name}}),
        );
        events.push(json!({"name": "thread_sort_index", "ph": "M", "pid": node,
                           "tid": tid(gpu, lane), "args": {"sort_index": tid(gpu, lane)}}));
    }
    events
}

/// The complete event of slice `s` on thread `tid`.
fn slice_event(s: &Slice, tid: usize) -> Value {
    json!({
        "name": s.module,
        "cat": s.phase.as_str(),
        "ph": "X",
        "ts": us(s.start_ms),
        // From the rounded ends, so that back-to-back slices stay back to back.
        "dur": us(s.end_ms) - us(s.start_ms),
        "pid": s.node,
        "tid": tid,
        "args": {"quota": s.quota, "stage": s.stage + 1, "phase": s.phase.as_str(),
                 "gpu": s.gpu},
    })
}

/// The pool's utilisation and occupancy counter, back to 0 at the end of the iteration.
fn counters(report: &SimReport) -> Vec<Value> {
    let mut events: Vec<Value> = report
        .timeline
        .iter()
        .map(|p| {
            json!({"name": "pool", "ph": "C", "ts": us(p.start_ms), "pid": 0,
                   "args": {"utilisation": p.utilisation, "occupancy": p.occupancy}})
        })
        .collect();
    if !report.timeline.is_empty() {
        events.push(
            json!({"name": "pool", "ph": "C", "ts": us(report.iteration_ms), "pid": 0,
                           "args": {"utilisation": 0.0, "occupancy": 0.0}}),
        );
    }
    events
}
