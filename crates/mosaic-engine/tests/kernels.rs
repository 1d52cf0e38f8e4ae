//! The engine's CUDA kernels run on the CPU: `kernels/emulated/` emulates the CUDA and tensor-core
//! features they use (a std::thread per CUDA thread, barriers for `__syncthreads` and
//! `__syncwarp`), so that their source is checked here, where no GPU is. A GPU runs the same
//! source in `mosaic check gpu`.

use std::path::Path;
use std::process::Command;

/// Compiles `kernels/emulated/<harness>.cpp` with g++ and runs it; its lines are printed and
/// it must exit 0.
fn run_harness(harness: &str) {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/emulated");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(harness);
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let built = Command::new(&cxx)
        .args([
            "-std=c++20",
            "-O2",
            "-pthread",
            "-fno-strict-aliasing",
            "-I",
        ])
        .arg(&here)
        .arg(here.join(format!("{harness}.cpp")))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("could not run {cxx} (a C++20 compiler): {e}"));
    assert!(
        built.status.success(),
        "{cxx} could not build {harness}:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let ran = Command::new(&exe).output().expect("the harness runs");
    let out = String::from_utf8_lossy(&ran.stdout);
    println!("{out}");
    assert!(ran.status.success(), "{harness} failed:\n{out}");
    assert!(out.lines().count() > 1 && !out.contains("FAIL"));
}

#[test]
fn the_fused_attention_kernels_match_attention_computed_directly() {
    run_harness("check_attention");
}

#[test]
fn the_layer_norm_and_gelu_backward_kernels_match_their_mathematics() {
    run_harness("check_elementwise");
}
