//! The engine's CUDA kernels (`kernels/*.cu`) run on the CPU, in tests: `kernels/emulated/` emulates the CUDA and tensor-core features
//! they use (a std::thread per CUDA thread, barriers for `__syncthreads` and `__syncwarp`), so
//! that their source is checked here, where no GPU is. A GPU runs the same source in `mosaic
//! check gpu`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `kernels/`, the kernel sources.
pub(crate) fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels")
}

/// `program` (C++ that includes kernel sources by name, their CUDA from the emulation) built
/// by g++ (or `$CXX`) into `exe`.
pub(crate) fn build(program: &Path, exe: &Path) {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let built = Command::new(&cxx)
        .args([
            "-std=c++20",
            "-O2",
            "-pthread",
            "-fno-strict-aliasing",
            "-I",
        ])
        .arg(sources())
        .arg("-I")
        .arg(sources().join("emulated"))
        .arg(program)
        .arg("-o")
        .arg(exe)
        .output()
        .unwrap_or_else(|e| panic!("could not run {cxx} (a C++20 compiler): {e}"));
    assert!(
        built.status.success(),
        "{cxx} could not build {}:\n{}",
        program.display(),
        String::from_utf8_lossy(&built.stderr)
    );
}

/// A folder of this test process's own under the system's temporary one.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mosaic-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Builds `kernels/emulated/<harness>.cpp` and runs it; its lines are printed and it must exit
/// 0.
fn run_harness(harness: &str) {
    let dir = scratch(harness);
    let exe = dir.join(harness);
    build(&sources().join(format!("emulated/{harness}.cpp")), &exe);
    let ran = Command::new(&exe).output().expect("the harness runs");
    let _ = std::fs::remove_dir_all(&dir);
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
