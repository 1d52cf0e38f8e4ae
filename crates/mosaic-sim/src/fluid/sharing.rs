//! Max-min fair sharing of capacities (progressive filling): how the segments on one GPU share
//! its HBM bandwidth and how all-reduce rings share NVLink and InfiniBand.

/// Max-min fair allocation (progressive filling): flow `i` gets at most `caps[i]`, the flows
/// using resource `r` together at most `capacity[r]`, and no flow can grow without shrinking
/// a flow that has no more.
pub(crate) fn max_min(caps: &[f64], uses: &[&[usize]], capacity: &[f64]) -> Vec<f64> {
    let mut alloc = vec![0.0; caps.len()];
    let mut frozen: Vec<bool> = caps.iter().map(|&c| c <= 0.0).collect();
    let mut left = capacity.to_vec();
    loop {
        let mut users = vec![0usize; capacity.len()];
        for (i, u) in uses.iter().enumerate() {
            if !frozen[i] {
                for &r in u.iter() {
                    users[r] += 1;
                }
            }
        }
        let mut delta = f64::INFINITY;
        for (i, &c) in caps.iter().enumerate() {
            if !frozen[i] {
                delta = delta.min(c - alloc[i]);
            }
        }
        if delta == f64::INFINITY && frozen.iter().all(|&f| f) {
            return alloc;
        }
        for (r, &n) in users.iter().enumerate() {
            if n > 0 {
                delta = delta.min(left[r] / n as f64);
            }
        }
        let delta = delta.max(0.0);
        for (i, u) in uses.iter().enumerate() {
            if !frozen[i] {
                alloc[i] += delta;
                for &r in u.iter() {
                    left[r] -= delta;
                }
            }
        }
        let full: Vec<bool> = left
            .iter()
            .zip(capacity)
            .map(|(&l, &c)| l <= 1e-12 * c)
            .collect();
        let mut any = false;
        for (i, u) in uses.iter().enumerate() {
            if !frozen[i] && (caps[i] - alloc[i] <= 1e-12 * caps[i] || u.iter().any(|&r| full[r])) {
                frozen[i] = true;
                any = true;
            }
        }
        if !any || frozen.iter().all(|&f| f) {
            return alloc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::max_min;

    #[test]
    fn max_min_is_water_filling() {
        // One resource of 10: demands 2, 5, 8 -> 2, 4, 4.
        let one: &[usize] = &[0];
        let a = max_min(&[2.0, 5.0, 8.0], &[one, one, one], &[10.0]);
        assert!(
            (a[0] - 2.0).abs() < 1e-9 && (a[1] - 4.0).abs() < 1e-9 && (a[2] - 4.0).abs() < 1e-9
        );
        // Enough for everyone: each gets its demand.
        let a = max_min(&[2.0, 3.0], &[one, one], &[10.0]);
        assert_eq!(a, vec![2.0, 3.0]);
        // Two resources: flow 0 uses both, flows 1 and 2 one each.
        let a = max_min(&[100.0, 100.0, 100.0], &[&[0, 1], &[0], &[1]], &[10.0, 4.0]);
        assert!(
            (a[0] - 2.0).abs() < 1e-9 && (a[2] - 2.0).abs() < 1e-9 && (a[1] - 8.0).abs() < 1e-9,
            "{a:?}"
        );
        // No demand, no share.
        assert_eq!(max_min(&[0.0, 1.0], &[one, one], &[10.0]), vec![0.0, 1.0]);
        assert!(max_min(&[], &[], &[1.0]).is_empty());
    }

    proptest::proptest! {
        /// Max-min fairness on random flows over up to three resources: no flow above its
        /// demand, no resource above its capacity, and every flow short of its demand is held
        /// by a full resource on which it has the largest share (the definition: it cannot grow
        /// without shrinking a flow that has no more).
        #[test]
        fn max_min_is_fair(
            flows in proptest::collection::vec(
                (0.0f64..10.0, proptest::collection::btree_set(0usize..3, 1..=3)),
                1..8,
            ),
            capacity in proptest::collection::vec(0.5f64..20.0, 3),
        ) {
            let caps: Vec<f64> = flows.iter().map(|f| f.0).collect();
            let uses: Vec<Vec<usize>> = flows.iter().map(|f| f.1.iter().copied().collect()).collect();
            let refs: Vec<&[usize]> = uses.iter().map(|u| u.as_slice()).collect();
            let alloc = max_min(&caps, &refs, &capacity);
            let tol = 1e-9;
            let mut load = [0.0f64; 3];
            for (i, u) in uses.iter().enumerate() {
                proptest::prop_assert!(alloc[i] >= 0.0 && alloc[i] <= caps[i] + tol);
                for &r in u {
                    load[r] += alloc[i];
                }
            }
            for r in 0..3 {
                proptest::prop_assert!(load[r] <= capacity[r] * (1.0 + tol), "{load:?} {capacity:?}");
            }
            for (i, u) in uses.iter().enumerate() {
                if alloc[i] < caps[i] - 1e-6 {
                    let bottleneck = u.iter().any(|&r| {
                        load[r] >= capacity[r] * (1.0 - 1e-6)
                            && uses.iter().enumerate().all(|(j, v)| {
                                !v.contains(&r) || alloc[j] <= alloc[i] + 1e-6
                            })
                    });
                    proptest::prop_assert!(bottleneck, "flow {i} {alloc:?} {caps:?} {capacity:?}");
                }
            }
        }
    }
}
