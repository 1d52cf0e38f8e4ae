//! What runs a plan: the [`schedule`] a plan becomes, the execution [`slot`]s its modules run
//! in, the [`trainer`] that iterates stage by stage, the [`collective`]s that carry tensors
//! between processes, the [`optim`]izer, atomic [`checkpoint`]s, the next batch drawn
//! while a step trains ([`prefetch`]), and passes replayed from CUDA graphs ([`graphed`]).

pub mod checkpoint;
pub mod collective;
pub mod feed;
pub mod graphed;
pub mod memory;
pub(crate) mod on_gpu;
pub mod optim;
pub mod prefetch;
pub mod schedule;
pub mod slot;
pub mod trainer;
