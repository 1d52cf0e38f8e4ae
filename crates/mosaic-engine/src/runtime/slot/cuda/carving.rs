//! How a slot's SMs were carved from its device: a name for each way, in every build (a
//! build without CUDA has no slots to carve, but reports name it).

/// How a slot's SMs were carved from its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carving {
    /// Every SM: a module alone on its GPU.
    Whole,
    /// One split of the whole device into equal groups (the stage's largest common group
    /// size, or else the smallest partition the device grants), each slot a green context of as many groups as its SMs need. Every group is an
    /// output of the split, so each is "structured": its SMs are co-scheduled, as thread-block
    /// clusters need (cuBLAS's GEMMs use them on Hopper). CUDA 13.0's `cuda.h` documents
    /// `cuDevResourceGenerateDesc` over several SM resources "from the same split API instance".
    OneSplit,
    /// One slot split off at a time, smallest first (ties in the stage's order): what is left
    /// becomes a scaffolding green context whose SMs are split for the next slot. Each later
    /// split takes its SMs from an earlier split's remainder, which "does not have the same
    /// functional or performance guarantees as the groups" and whose "future partitions … are
    /// discouraged" (CUDA 13.0's `cuda.h`, `cuDevSmResourceSplitByCount`). What ran on the
    /// H100 and the H200; now only where [`Carving::OneSplit`] is refused.
    InTurn,
}

impl Carving {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Carving::Whole => "whole GPU",
            Carving::OneSplit => "one split",
            Carving::InTurn => "split in turn",
        }
    }
}
