//! The kernels' block geometry as their launches need it, each figure the value of a macro of
//! `kernels/attention.cu`: a test compiles the source (with the CPU emulation's headers) to
//! print the macros and holds these against them, since a launch that asks for less shared
//! memory than the kernel uses writes past its block's.
#![cfg_attr(not(mosaic_gpu), allow(dead_code))] // the GPU build's launches

/// Rows of queries (forward) or keys (backward) a block takes: `TILE`.
pub(super) const TILE: usize = 64;
/// Threads a block: `THREADS` (four warps).
pub(super) const THREADS: u32 = 128;
/// The head dimensions compiled (`FLASH_KERNELS`).
pub(super) const HEAD_DIMS: [usize; 8] = [16, 32, 48, 64, 80, 96, 112, 128];
/// Elements a shared-memory tile's rows are padded by: `PAD`.
const PAD: usize = 8;

/// Dynamic shared memory of the forward kernel for head dimension `d` (a Q tile and two stages
/// of K and V tiles): `FWD_SMEM`.
pub(super) fn forward_smem(d: usize) -> u32 {
    (5 * TILE * (d + PAD) * 2) as u32
}

/// Dynamic shared memory of the backward kernel for head dimension `d` (K, V, Q and dO tiles,
/// dSᵀ, a query tile's lse and row dots): `BWD_SMEM`.
pub(super) fn backward_smem(d: usize) -> u32 {
    (4 * TILE * (d + PAD) * 2 + TILE * (TILE + PAD) * 2 + 2 * TILE * 4) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulated;

    /// The figures above are the kernel source's, at every head dimension compiled.
    #[test]
    fn launches_ask_for_what_the_kernels_use() {
        let dir = emulated::scratch("flash-geometry");
        let (program, exe) = (dir.join("geometry.cpp"), dir.join("geometry"));
        let dims = HEAD_DIMS.map(|d| d.to_string()).join(", ");
        std::fs::write(
            &program,
            format!(
                "#include \"attention.cu\"\n#include <cstdio>\nint main() {{\n    \
                 std::printf(\"%d %d %d\\n\", TILE, THREADS, PAD);\n    \
                 for (int d : {{{dims}}}) std::printf(\"%d %d\\n\", (int)(FWD_SMEM(d)), \
                 (int)(BWD_SMEM(d)));\n}}\n"
            ),
        )
        .unwrap();
        emulated::build(&program, &exe);
        let out = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let out = String::from_utf8(out.stdout).unwrap();
        let mut lines = out.lines();
        assert_eq!(
            lines.next(),
            Some(format!("{TILE} {THREADS} {PAD}").as_str())
        );
        let sizes: Vec<String> = HEAD_DIMS
            .iter()
            .map(|&d| format!("{} {}", forward_smem(d), backward_smem(d)))
            .collect();
        assert_eq!(lines.collect::<Vec<_>>(), sizes);
    }
}
