//! Variable-length samples, padded or packed (FlowTrain §3.4).
//!
//! A batch of token sequences `[N, len]` with per-sample lengths can run two ways, with the
//! same mathematics:
//!
//! - **padded**: one sample per row; keys past a sample's length are masked
//!   ([`key_mask`]), so padding is computed but never read;
//! - **packed**: [`Packing`] places the samples by `mosaic_data::pack` (FlowTrain's best fit)
//!   into rows of `capacity` tokens, one after the other; positions restart at 0 for each
//!   sample and a block-diagonal mask ([`Packing::mask`]) keeps a sample from attending to the
//!   others in its row. Fewer rows, less compute.
//!
//! `tests/packing.rs` checks that the two give the same loss and gradients.

use candle_core::{Device, Result, Tensor};

use super::nn::MASKED;

/// Checks per-sample `lengths` against the sequence width: each `1..=width`.
pub fn check_lengths(lengths: &[u32], width: usize) -> Result<()> {
    match lengths
        .iter()
        .enumerate()
        .find(|(_, &l)| l == 0 || l as usize > width)
    {
        Some((i, l)) => Err(candle_core::Error::Msg(format!(
            "sample {i} has length {l}; a length must be 1 to {width}"
        ))),
        None => Ok(()),
    }
}

/// The additive key-padding mask of padded rows, `[N, 1, 1, width]`: sample `i`'s queries may
/// read keys `0..lengths[i]`.
pub fn key_mask(lengths: &[u32], width: usize, device: &Device) -> Result<Tensor> {
    let values: Vec<f32> = lengths
        .iter()
        .flat_map(|&l| (0..width).map(move |j| if j < l as usize { 0.0 } else { MASKED }))
        .collect();
    Tensor::from_vec(values, (lengths.len(), 1, 1, width), device)
}

/// Where every sample of a batch sits once packed into rows of `capacity` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packing {
    capacity: usize,
    lengths: Vec<usize>,
    rows: Vec<Vec<usize>>,
    /// `(row, offset)` of each sample, in the batch's order.
    place: Vec<(usize, usize)>,
}

impl Packing {
    /// Packs samples of `lengths` tokens into rows of `capacity` tokens by FlowTrain's best fit
    /// (`mosaic_data::pack`); a sample longer than `capacity`, or of length 0, is refused.
    pub fn new(lengths: &[u32], capacity: usize) -> Result<Packing> {
        check_lengths(lengths, capacity)?;
        let cap = u32::try_from(capacity).map_err(|_| {
            candle_core::Error::Msg(format!("packing capacity {capacity} is too large"))
        })?;
        let rows =
            mosaic_data::pack(lengths, cap).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok(Packing::from_rows(lengths, capacity, rows))
    }

    /// One sample per row, in order: the padded layout, as a packing.
    pub fn one_per_row(lengths: &[u32], capacity: usize) -> Result<Packing> {
        check_lengths(lengths, capacity)?;
        let rows = (0..lengths.len()).map(|i| vec![i]).collect();
        Ok(Packing::from_rows(lengths, capacity, rows))
    }

    fn from_rows(lengths: &[u32], capacity: usize, rows: Vec<Vec<usize>>) -> Packing {
        let lengths: Vec<usize> = lengths.iter().map(|&l| l as usize).collect();
        let mut place = vec![(0, 0); lengths.len()];
        for (r, row) in rows.iter().enumerate() {
            let mut offset = 0;
            for &s in row {
                place[s] = (r, offset);
                offset += lengths[s];
            }
        }
        Packing {
            capacity,
            lengths,
            rows,
            place,
        }
    }

    /// Tokens per row.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The samples of each row, in the order they sit in it.
    pub fn rows(&self) -> &[Vec<usize>] {
        &self.rows
    }

    /// `(row, offset)` of sample `s`: its token `p` is at slot `row · capacity + offset + p`.
    pub fn place(&self, s: usize) -> (usize, usize) {
        self.place[s]
    }

    /// The flat slot (over `rows × capacity`) of sample `s`'s token `p`.
    pub fn slot(&self, s: usize, p: usize) -> usize {
        let (r, o) = self.place[s];
        r * self.capacity + o + p
    }

    /// Slots in all: `rows × capacity`.
    pub fn slots(&self) -> usize {
        self.rows.len() * self.capacity
    }

    /// The `(sample, position)` each slot holds, `None` for the unused end of a row.
    pub fn occupants(&self) -> Vec<Option<(usize, usize)>> {
        let mut slots = vec![None; self.slots()];
        for (s, &l) in self.lengths.iter().enumerate() {
            for p in 0..l {
                slots[self.slot(s, p)] = Some((s, p));
            }
        }
        slots
    }

    /// For each slot, the flat index of its token in the batch's `[N, width]` ids (0 for an
    /// unused slot) and its position in its sample (0 for an unused slot).
    pub fn gather(&self, width: usize) -> (Vec<u32>, Vec<u32>) {
        self.occupants()
            .into_iter()
            .map(|o| match o {
                Some((s, p)) => ((s * width + p) as u32, p as u32),
                None => (0, 0),
            })
            .unzip()
    }

    /// The additive block-diagonal mask `[rows, 1, capacity, capacity]`: a slot may read the
    /// slots of its own sample only; an unused slot reads only itself (so no row is empty).
    /// Causality, where wanted, is the attention layer's own mask on top.
    pub fn mask(&self, device: &Device) -> Result<Tensor> {
        let c = self.capacity;
        let owners: Vec<Option<usize>> = self.occupants().iter().map(|o| o.map(|x| x.0)).collect();
        let mut values = vec![MASKED; self.slots() * c];
        for (r, row) in owners.chunks(c.max(1)).enumerate() {
            for (i, qi) in row.iter().enumerate() {
                for (j, kj) in row.iter().enumerate() {
                    let same = match (qi, kj) {
                        (Some(a), Some(b)) => a == b,
                        (None, None) => i == j,
                        _ => false,
                    };
                    if same {
                        values[(r * c + i) * c + j] = 0.0;
                    }
                }
            }
        }
        Tensor::from_vec(values, (self.rows.len(), 1, c, c), device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_sit_in_their_rows_without_overlap() {
        let lengths = [5, 1, 3, 8, 2, 2, 7];
        let p = Packing::new(&lengths, 8).unwrap();
        assert!(p.rows().len() < lengths.len());
        let occupants = p.occupants();
        for (s, &l) in lengths.iter().enumerate() {
            let (r, o) = p.place(s);
            assert!(o + l as usize <= 8);
            assert!(p.rows()[r].contains(&s));
            for q in 0..l as usize {
                assert_eq!(occupants[p.slot(s, q)], Some((s, q)));
            }
        }
        let used = occupants.iter().filter(|o| o.is_some()).count();
        assert_eq!(used, lengths.iter().sum::<u32>() as usize);
        let (ids, pos) = p.gather(8);
        assert_eq!(ids[p.slot(3, 7)], 3 * 8 + 7);
        assert_eq!(pos[p.slot(6, 4)], 4);
    }

    #[test]
    fn the_mask_is_block_diagonal() {
        let p = Packing::new(&[2, 1, 1], 4).unwrap();
        assert_eq!(p.rows().len(), 1);
        let m: Vec<f32> = p
            .mask(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let allowed: Vec<bool> = m.iter().map(|&v| v == 0.0).collect();
        #[rustfmt::skip]
        let want = [
            true, true, false, false,
            true, true, false, false,
            false, false, true, false,
            false, false, false, true,
        ];
        assert_eq!(allowed, want);
    }

    #[test]
    fn bad_lengths_are_errors() {
        assert!(Packing::new(&[3, 0], 4).is_err());
        assert!(Packing::new(&[5], 4).is_err());
        assert!(Packing::one_per_row(&[5], 4).is_err());
        assert!(check_lengths(&[1, 4], 4).is_ok());
    }
}
