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

#[test]
fn bandwidth_heavy_modules_slow_each_other_down_compute_bound_ones_barely() {
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
    // Qwen3-VL's LLM and ViT are matmul-bound.
    let light = slowdown("qwen3-vl", "llm", "vision");
    assert!(heavy > 0.2, "bandwidth-heavy pair: +{:.1}%", 100.0 * heavy);
    assert!(light < 0.06, "compute-bound pair: +{:.1}%", 100.0 * light);
    assert!(heavy > 4.0 * light);
    // A purely memory-bound embedding next to itself: exactly half the bandwidth each.
    let twin = slowdown("qwen3-vl", "text", "text");
    assert!((twin - 1.0).abs() < 0.02, "{twin}");
}

#[test]
fn launch_bound_modules_take_their_launch_floor() {
    let (m, c) = zoo("ofasys", "h100x8");
    let i = index(&m, "box");
    let e = Calibration::default().estimate(&m, i, &c, 1, 0.1);
    assert!(e.launch_ms > e.gemm_ms + e.memory_ms);
    let t = colocate(&m, &c, &[(i, 1, 0.1)])[0];
    assert!((t - e.launch_ms).abs() < 1e-6, "{t} vs {}", e.launch_ms);
}

#[test]
#[should_panic(expected = "quotas add up")]
fn colocate_refuses_more_than_a_gpu() {
    let (m, c) = zoo("clip", "h100x8");
    colocate(&m, &c, &[(0, 1, 0.7), (1, 1, 0.7)]);
}
