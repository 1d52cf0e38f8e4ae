//! `colocate`: modules side by side on one GPU, alone and together, against the device model.

use mosaic_sim::colocate;
use mosaic_zoo::Calibration;

mod common;
use common::{index, zoo};

#[test]
fn a_module_alone_takes_the_device_models_time() {
    let (m, c) = zoo("ofasys", "h100x8");
    let cal = Calibration::default();
    for i in 0..m.modules.len() {
        for sm in [0.1, 0.3, 0.5, 1.0] {
            // One replica: no all-reduce, the device model's time exactly.
            let e = cal.estimate(&m, i, &c, 1, sm);
            let got = colocate(&m, &c, &[(i, 1, sm)])[0];
            assert!(
                (got - e.time_ms).abs() <= 0.01 * e.time_ms,
                "{} at {sm}: simulated {got} vs estimate {}",
                m.modules[i].name,
                e.time_ms
            );
            // Eight replicas: the same step, then the whole ring (the device model hides half
            // of it behind the backward pass).
            let e = cal.estimate(&m, i, &c, 8, sm);
            let got = colocate(&m, &c, &[(i, 8, sm)])[0];
            let compute = e.time_ms - e.comm_ms;
            let ring = if m.modules[i].trainable {
                let bytes = 2.0 * 7.0 / 8.0 * 2.0 * m.modules[i].params as f64;
                let bus = c.nvlink_gbps / 2.0 * 1e9 * cal.link_efficiency;
                (bytes / bus + 14.0 * cal.nvlink_hop_us * 1e-6) * 1e3
            } else {
                0.0
            };
            assert!(
                (got - compute - ring).abs() <= 0.01 * (compute + ring),
                "{} dp 8 at {sm}: {got} vs {compute} + {ring}",
                m.modules[i].name
            );
            assert!(e.comm_ms <= ring + 1e-9);
        }
    }
}

/// Both kinds of co-location slow modules down: bandwidth-heavy ones share HBM, compute-bound
/// ones the clocks and L2 (the compute contention measured on an H100: +27 % for two GEMM
/// loops at half a GPU each, `docs/reference.md`).
#[test]
fn bandwidth_heavy_and_compute_bound_modules_slow_each_other_down() {
    let slowdown = |model: &str, a: &str, b: &str| {
        let (m, c) = zoo(model, "h100x8");
        let (a, b) = (index(&m, a), index(&m, b));
        let both = colocate(&m, &c, &[(a, 1, 0.5), (b, 1, 0.5)]);
        let alone = [
            colocate(&m, &c, &[(a, 1, 0.5)])[0],
            colocate(&m, &c, &[(b, 1, 0.5)])[0],
        ];
        assert!(both[0] >= alone[0] * (1.0 - 1e-9) && both[1] >= alone[1] * (1.0 - 1e-9));
        (both[0] / alone[0] - 1.0).max(both[1] / alone[1] - 1.0)
    };
    // OFASys' video and text encoders spend half their time in memory-bound kernels.
    let heavy = slowdown("ofasys", "video", "text");
    // Qwen3-VL's LLM and ViT are matmul-bound: they slow each other by at most the +27 % of
    // two GEMM loops (the matmul part of their step, while both compute), little more.
    let compute = slowdown("qwen3-vl", "llm", "vision");
    let gemm = mosaic_sim::COMPUTE_CONTENTION * 0.5;
    assert!(heavy > 0.2, "bandwidth-heavy pair: +{:.1}%", 100.0 * heavy);
    assert!(
        compute > 0.5 * gemm && compute < gemm + 0.03,
        "compute-bound pair: +{:.1}%",
        100.0 * compute
    );
    // A purely memory-bound embedding next to itself: exactly half the bandwidth each.
    let twin = slowdown("qwen3-vl", "text", "text");
    assert!((twin - 1.0).abs() < 0.02, "{twin}");
}

#[test]
fn launch_bound_modules_take_their_hosts_floor() {
    let (m, c) = zoo("ofasys", "h100x8");
    let cal = Calibration::default();
    // The first (module, quota) the device model puts at its launch floor, whatever the
    // calibration: OFASys' small heads and encoders are launch-bound at some quota. The host
    // paces it: the simulator finishes it at the device model's time exactly, which is above
    // the launch time where host and GPU overlap imperfectly.
    let (i, sm, e) = (0..m.modules.len())
        .flat_map(|i| [0.1, 0.3, 0.5, 1.0].map(|sm| (i, sm)))
        .map(|(i, sm)| (i, sm, cal.estimate(&m, i, &c, 1, sm)))
        .find(|(_, _, e)| e.launch_ms > e.gemm_ms + e.memory_ms)
        .expect("some OFASys module is launch-bound");
    let t = colocate(&m, &c, &[(i, 1, sm)])[0];
    assert!(
        (t - e.time_ms).abs() < 1e-6 && e.time_ms >= e.launch_ms,
        "{} at {sm}: {t} vs {} (launch {})",
        m.modules[i].name,
        e.time_ms,
        e.launch_ms
    );
}
