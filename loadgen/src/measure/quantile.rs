//! Quantiles by linear interpolation between order statistics (numpy's default, used by
//! vLLM's and SGLang's benchmarks): for sorted `x[0..n]` and `q` in [0, 1], the value at
//! rank `h = (n − 1)·q` is `x[⌊h⌋] + (h − ⌊h⌋)·(x[⌊h⌋+1] − x[⌊h⌋])`.

/// The `q`-quantile of `values` (any order; NaNs are ignored), `None` when there are none.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    Some(quantile_sorted(&sorted, q))
}

/// [`quantile`] over values already sorted ascending and non-empty.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    let last = sorted.len() - 1;
    let rank = q.clamp(0.0, 1.0) * last as f64;
    let lower = rank.floor() as usize;
    let upper = (lower + 1).min(last);
    let frac = rank - lower as f64;
    sorted[lower] + frac * (sorted[upper] - sorted[lower])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_numpy_linear() {
        // numpy.percentile([1, 2, 3, 4], [50, 95, 99]) = 2.5, 3.85, 3.97
        let v = [4.0, 1.0, 3.0, 2.0];
        assert_eq!(quantile(&v, 0.5), Some(2.5));
        assert!((quantile(&v, 0.95).unwrap() - 3.85).abs() < 1e-12);
        assert!((quantile(&v, 0.99).unwrap() - 3.97).abs() < 1e-12);
        // 96 values 0..95: p99 lies between the 95th and 96th order statistics.
        let w: Vec<f64> = (0..96).map(f64::from).collect();
        assert!((quantile(&w, 0.99).unwrap() - 94.05).abs() < 1e-9);
        assert_eq!(quantile(&[7.0], 0.95), Some(7.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[f64::NAN, 1.0], 0.5), Some(1.0));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Quantiles stay within the data and never decrease as q grows.
        #[test]
        fn bounded_and_monotone(values in proptest::collection::vec(-1e6f64..1e6, 1..200), a in 0.0f64..=1.0, b in 0.0f64..=1.0) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let min = values.iter().copied().fold(f64::INFINITY, f64::min);
            let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let ql = quantile(&values, lo).unwrap();
            let qh = quantile(&values, hi).unwrap();
            prop_assert!(min <= ql && qh <= max);
            prop_assert!(ql <= qh + 1e-9);
            prop_assert_eq!(quantile(&values, 0.0), Some(min));
            prop_assert_eq!(quantile(&values, 1.0), Some(max));
        }
    }
}
