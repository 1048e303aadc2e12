//! `budget="auto"` for a batch: one tree width for all rows, spent where it pays.
//!
//! A batched pass verifies every row's tree padded to the step's width T (tokens per row,
//! root included), so its cost depends on B x T, not on how the nodes spread over rows. Each
//! row's session ranks its drafted nodes best-first (`DraftSession::propose_ranked`: the
//! cumulative expected accepted nodes g_b(m) of its best m nodes, from the calibrated
//! acceptance table a single request uses), and the width with the most expected committed
//! tokens per second over the batch wins:
//!
//! ```text
//! T* = argmax_T  sum_b (1 + g_b(T - 1)) / c_B(T)
//! ```
//!
//! A row deep in a verbatim copy has a steep g and earns a wide step for the batch; rows on
//! open text add little, and when no width beats T = 1 the batch drafts nothing (one token
//! per row and pass, as batched greedy decoding).
//!
//! c_B(T) starts from the decoder's measured cost curve at B x T total tokens (linear beyond
//! its last point) and is corrected online by the ratio of each step's measured pass time to
//! that prior, per batch size and width (interpolated between the widths observed at that
//! batch size, and the nearest one's beyond them).

use std::collections::BTreeMap;

use crate::cost::{interp, tail_slope};
use crate::error::{Error, Result};

/// Weight of a new observation in the online ratio.
const SMOOTHING: f64 = 0.2;

#[derive(Clone, Debug, PartialEq)]
pub struct BatchWidth {
    points: Vec<f64>,
    seconds: Vec<f64>,
    max_width: usize,
    /// Batch size -> width -> measured time over the prior.
    ratios: BTreeMap<usize, BTreeMap<usize, f64>>,
    last_width: usize,
}

impl BatchWidth {
    /// `points` (rising token counts from 1) and `seconds` (a pass over that many tokens):
    /// the decoder's measured curve; `max_width`: the widest tree a row drafts, root included.
    pub fn new(points: Vec<f64>, seconds: Vec<f64>, max_width: usize) -> Result<Self> {
        let rising = points.windows(2).all(|w| w[0] < w[1]);
        if points.is_empty() || points.len() != seconds.len() || !rising || points[0] < 1.0 {
            return Err(Error::invalid(
                "points, seconds",
                "as many rising token counts from 1 as pass times",
                format!(
                    "{} points {:?}, {} times",
                    points.len(),
                    points.first(),
                    seconds.len()
                ),
            ));
        }
        if seconds.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(Error::invalid(
                "seconds",
                "finite pass times > 0",
                format!("min {:?}", seconds.iter().copied().reduce(f64::min)),
            ));
        }
        if max_width == 0 {
            return Err(Error::invalid("max_width", "at least 1 (the root)", "0"));
        }
        Ok(BatchWidth {
            points,
            seconds,
            max_width,
            ratios: BTreeMap::new(),
            last_width: 1,
        })
    }

    pub fn max_width(&self) -> usize {
        self.max_width
    }

    /// The width of the last `width` call.
    pub fn last_width(&self) -> usize {
        self.last_width
    }

    /// The measured curve at `tokens` total tokens per pass (linear beyond its last point,
    /// never falling).
    pub fn prior(&self, tokens: f64) -> f64 {
        let (p, s) = (&self.points, &self.seconds);
        let m = p.len();
        if m >= 2 && tokens > p[m - 1] {
            return s[m - 1] + tail_slope(p, s) * (tokens - p[m - 1]);
        }
        interp(tokens, p, s)
    }

    /// c_B(T) for T = 1 ..= max_width at `rows` rows.
    pub fn costs(&self, rows: usize) -> Vec<f64> {
        let seen = self.ratios.get(&rows).filter(|s| !s.is_empty());
        let (widths, ratios): (Vec<f64>, Vec<f64>) = seen
            .map(|s| s.iter().map(|(&w, &r)| (w as f64, r)).unzip())
            .unwrap_or_default();
        (1..=self.max_width)
            .map(|t| {
                let c = self.prior((rows * t) as f64);
                if widths.is_empty() {
                    c
                } else {
                    c * interp(t as f64, &widths, &ratios)
                }
            })
            .collect()
    }

    /// The step's width T from each row's ranked gains (`gains[b][m]`: expected accepted
    /// nodes of its best m nodes, `gains[b][0] = 0`); a row's gains beyond its last entry
    /// stay at that entry.
    pub fn width(&mut self, gains: &[&[f32]]) -> usize {
        let rows = gains.len();
        let costs = self.costs(rows.max(1));
        let mut best = (f64::NEG_INFINITY, 1usize);
        for (i, cost) in costs.iter().enumerate() {
            let expected: f64 = rows as f64
                + gains
                    .iter()
                    .map(|g| g.get(i).or(g.last()).copied().unwrap_or(0.0) as f64)
                    .sum::<f64>();
            let rate = expected / cost;
            if rate > best.0 {
                best = (rate, i + 1);
            }
        }
        self.last_width = best.1;
        best.1
    }

    /// A pass over `rows` rows of `width` tokens took `seconds`.
    pub fn observe(&mut self, rows: usize, width: usize, seconds: f64) {
        let prior = self.prior((rows * width) as f64);
        if !(seconds.is_finite() && seconds > 0.0 && prior > 0.0) {
            return;
        }
        let r = seconds / prior;
        let seen = self.ratios.entry(rows).or_default();
        seen.entry(width)
            .and_modify(|old| *old = (1.0 - SMOOTHING) * *old + SMOOTHING * r)
            .or_insert(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POINTS: [f64; 7] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

    fn curve(f: impl Fn(f64) -> f64) -> BatchWidth {
        BatchWidth::new(POINTS.to_vec(), POINTS.iter().map(|&p| f(p)).collect(), 17).unwrap()
    }

    fn copying() -> Vec<f32> {
        (0..17).map(|m| 0.95 * m as f32).collect() // a long verbatim copy
    }

    const OPEN_TEXT: [f32; 3] = [0.0, 0.2, 0.25];

    #[test]
    fn free_nodes_are_all_taken_and_a_pass_per_token_never_drafts() {
        let copy = copying();
        assert_eq!(curve(|_| 1.0).width(&[&copy, &OPEN_TEXT]), 17);
        assert_eq!(curve(|p| p).width(&[&OPEN_TEXT, &OPEN_TEXT]), 1);
    }

    #[test]
    fn a_copying_row_earns_the_batch_a_wider_step_and_slow_wide_passes_narrow_it() {
        let copy = copying();
        let mut mid = curve(|p| 1.0 + 0.05 * p);
        let wide = mid.width(&[&copy, &OPEN_TEXT]);
        let narrow = mid.width(&[&OPEN_TEXT, &OPEN_TEXT]);
        assert!(wide > narrow && narrow >= 1, "{wide} {narrow}");
        for _ in 0..20 {
            mid.observe(2, 1, mid.prior(2.0));
            mid.observe(2, wide, 10.0);
        }
        assert!(mid.width(&[&copy, &OPEN_TEXT]) < wide);
        // Corrections are per batch size: another size still prices by the prior.
        assert_eq!(mid.costs(3), curve(|p| 1.0 + 0.05 * p).costs(3));
    }

    #[test]
    fn the_prior_interpolates_and_extends_the_curve_without_falling() {
        let b = BatchWidth::new(vec![1.0, 4.0, 8.0], vec![1.0, 2.0, 1.5], 4).unwrap();
        assert_eq!(b.prior(0.5), 1.0);
        assert_eq!(b.prior(2.5), 1.5);
        assert_eq!(b.prior(100.0), 1.5); // a falling last segment extends flat
        let b = BatchWidth::new(vec![1.0, 2.0], vec![1.0, 3.0], 4).unwrap();
        assert_eq!(b.prior(4.0), 7.0);
    }

    #[test]
    fn bad_curves_are_refused_with_what_was_expected() {
        for (p, s, w) in [
            (vec![], vec![], 4),
            (vec![2.0, 1.0], vec![1.0, 1.0], 4),
            (vec![1.0], vec![0.0], 4),
            (vec![1.0, 2.0], vec![1.0], 4),
            (vec![1.0], vec![1.0], 0),
        ] {
            assert!(BatchWidth::new(p, s, w).is_err());
        }
    }
}
