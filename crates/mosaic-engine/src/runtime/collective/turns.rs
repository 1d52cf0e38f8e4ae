//! One order, on every rank, for the gradient sums a stage's modules start.
//!
//! A stage's modules sum their gradients from their own threads, each on its own
//! communicator. NCCL's kernels wait on the GPU for their peers, so where two modules' groups
//! share ranks, a rank that launches module a's sum before b's while another launches b's
//! before a's can leave each GPU running a kernel that waits for one the other GPU queued
//! behind its own; NCCL's guide asks that operations on several communicators be issued in
//! the same order on every rank ("Using multiple NCCL communicators concurrently"). [`Turns`]
//! gives that order: the plan's order of the stage, which every rank reads alike. A module's
//! sum starts once every module before it in the stage has started its own on this rank, or
//! ended its job without one. Every rank issuing its sums in the order of one list, no rank
//! waits on a sum that waits on it.

use std::sync::{Condvar, Mutex, PoisonError};

/// The order in which the listed modules' sums start on this rank, for one stage.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    /// The modules that sum across ranks, in the order their sums start.
    order: Vec<usize>,
    /// Whether each of `order`'s turns is over (its sum started, or its job ended).
    over: Mutex<Vec<bool>>,
    changed: Condvar,
}

/// A module's place in [`Turns`]; its turn is over when it is dropped.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    turns: &'a Turns,
    /// The module's index in the order; `None` for a module that takes no turn.
    at: Option<usize>,
}

impl Turns {
    /// Turns for `order`'s modules, in that order (modules listed twice take the first place).
    pub(crate) fn new(order: Vec<usize>) -> Turns {
        let over = Mutex::new(vec![false; order.len()]);
        Turns {
            order,
            over,
            changed: Condvar::new(),
        }
    }

    /// `module`'s turn: taken by a module listed in the order, a formality for any other.
    pub(crate) fn turn(&self, module: usize) -> Turn<'_> {
        Turn {
            turns: self,
            at: self.order.iter().position(|&m| m == module),
        }
    }
}

#[cfg(test)]
impl Turns {
    /// The modules that take turns, in order.
    pub(crate) fn order(&self) -> &[usize] {
        &self.order
    }
}

impl Turn<'_> {
    /// Blocks until the turn of every module before this one is over.
    pub(crate) fn wait(&self) {
        let Some(at) = self.at else {
            return;
        };
        let turns = self.turns;
        let over = turns.over.lock().unwrap_or_else(PoisonError::into_inner);
        let _over = (turns.changed)
            .wait_while(over, |over| !over[..at].iter().all(|&o| o))
            .unwrap_or_else(PoisonError::into_inner);
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let Some(at) = self.at else {
            return;
        };
        let turns = self.turns;
        turns.over.lock().unwrap_or_else(PoisonError::into_inner)[at] = true;
        turns.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    /// The modules whose sums start, in the order they start, when module `m` of
    /// `arrivals` comes to its sum after `delay_us` µs, or leaves without one where `fails`.
    fn started(order: &[usize], arrivals: &[(usize, u64, bool)]) -> Vec<usize> {
        let turns = Turns::new(order.to_vec());
        let log = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for &(m, delay_us, fails) in arrivals {
                let (turns, log) = (&turns, &log);
                s.spawn(move || {
                    let turn = turns.turn(m);
                    std::thread::sleep(Duration::from_micros(delay_us));
                    if fails {
                        return;
                    }
                    turn.wait();
                    log.lock().unwrap().push(m);
                });
            }
        });
        log.into_inner().unwrap()
    }

    #[test]
    fn a_late_module_holds_back_the_ones_after_it() {
        // Module 7 comes last but is first in the order; 3 takes no turn and goes at once.
        let log = started(
            &[7, 2, 5],
            &[
                (5, 0, false),
                (2, 0, false),
                (3, 0, false),
                (7, 20_000, false),
            ],
        );
        assert_eq!(log.first(), Some(&3));
        assert_eq!(log[1..], [7, 2, 5]);
    }

    #[test]
    fn a_module_that_fails_before_its_sum_passes_its_turn() {
        assert_eq!(started(&[1, 0], &[(0, 0, false), (1, 5_000, true)]), [0]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever order the modules reach their sums in, and whichever fail first, the sums
        /// start in the stage's order.
        #[test]
        fn sums_start_in_the_stages_order(
            arrivals in (1usize..6).prop_flat_map(|n| (
                Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
                proptest::collection::vec((0u64..2_000, proptest::bool::weighted(0.2)), n),
            )),
        ) {
            let (order, timing) = arrivals;
            let arrivals: Vec<(usize, u64, bool)> = (0..order.len())
                .map(|m| (m, timing[m].0, timing[m].1))
                .collect();
            let expected: Vec<usize> =
                order.iter().copied().filter(|&m| !timing[m].1).collect();
            prop_assert_eq!(started(&order, &arrivals), expected);
        }
    }
}
