//! The verification cost curve c(n) behind the automatic budget, kept online.
//!
//! The caller measures pass times at a few small sizes once per model (`points`, `seconds`);
//! every step then reports the size and time of its verification pass and the host time of
//! the step before. Each measured point gets a correction factor once real passes of about its
//! size were seen (MIN_OBSERVATIONS), the others share a global one (the cost drifts with the
//! context length for every size alike); each factor is the mean of its first passes' ratios,
//! then an average with weight EMA, so a measurement far off is replaced within a few passes.
//! c(n) is the corrected measurement, made non-decreasing in n, plus the host time. Between
//! two points a size is priced at the next point's time (a step, not a line): on a CPU the
//! sizes between measured ones can cost more than the next point (SmolLM2 on a 2-core VM, the
//! transposed layout: 3 tokens 82-101 ms against 4 tokens' 70-87, 9 tokens 134-142 against
//! 16 tokens' 121), which no interpolation shows; priced at the next point's time a tree of
//! that size buys nothing a tree of the point's size would not, so the budget fills trees
//! to the measured sizes and verifies what it has measured. Past the points measured at
//! first use (the points the curve grew online are far apart) sizes are interpolated, and
//! past the last point extrapolated along its last segment.
//!
//! The curve grows online: a pass well past the last point (EXTEND_FACTOR) becomes a new
//! point, in the measurement's units (its time over the global correction). So first use
//! measures only the small trees every step needs, and the sizes the controller later asks
//! for (from the extrapolation, or exploring) are priced by real passes from then on.

use crate::error::{Error, Result};

const EMA: f64 = 0.1;
const HOST_EMA: f64 = 0.05;
const MIN_OBSERVATIONS: u32 = 3;
/// A pass over at least this many times the last point's tokens extends the curve.
const EXTEND_FACTOR: f64 = 1.5;
/// The curve never holds more points than this (doublings from 1 reach 4096 in 13).
const MAX_POINTS: usize = 24;

#[derive(Clone, Debug, PartialEq)]
pub struct CostCurve {
    points: Vec<usize>,
    seconds: Vec<f64>,
    ratio: Vec<f64>,
    seen: Vec<u32>,
    global_ratio: f64,
    host_s: f64,
    observed: u64,
    /// Passes that corrected the global ratio.
    timed: u64,
    /// The last point measured at first use: sizes up to it are priced as steps.
    stepped: usize,
}

/// The slope a curve is extrapolated with past its last point: over its upper half, from
/// the last point at or below half the last point's tokens (the last segment alone where
/// there is none). One segment is not enough: two points close together can take equal
/// times (on a CPU 12 and 16 tokens can cost the same, and a non-decreasing curve makes a
/// noisy 12 equal to 16), and a zero slope priced every bigger pass at 16 tokens' time.
pub(crate) fn tail_slope(xs: &[f64], ys: &[f64]) -> f64 {
    let last = xs.len() - 1;
    if last == 0 {
        return 0.0;
    }
    let from = (0..last)
        .rev()
        .find(|&i| xs[i] <= xs[last] / 2.0)
        .unwrap_or(last - 1);
    ((ys[last] - ys[from]) / (xs[last] - xs[from])).max(0.0)
}

/// np.interp on sorted xs: clamped at both ends.
pub(crate) fn interp(x: f64, xs: &[f64], ys: &[f64]) -> f64 {
    if x <= xs[0] {
        return ys[0];
    }
    for i in 1..xs.len() {
        if x <= xs[i] {
            let t = (x - xs[i - 1]) / (xs[i] - xs[i - 1]);
            return ys[i - 1] + t * (ys[i] - ys[i - 1]);
        }
    }
    ys[ys.len() - 1]
}

impl CostCurve {
    pub fn new(points: Vec<usize>, seconds: Vec<f64>) -> Result<Self> {
        let sorted = points.windows(2).all(|w| w[0] < w[1]);
        if points.is_empty() || points.len() != seconds.len() || !sorted || points[0] == 0 {
            return Err(Error::invalid(
                "cost points",
                "increasing token counts >= 1, one time each",
                format!(
                    "{} points {:?}, {} times",
                    points.len(),
                    points,
                    seconds.len()
                ),
            ));
        }
        if let Some(bad) = seconds.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(Error::invalid("cost seconds", "finite times > 0", bad));
        }
        let n = points.len();
        let stepped = points[n - 1];
        Ok(CostCurve {
            stepped,
            points,
            seconds,
            ratio: vec![1.0; n],
            seen: vec![0; n],
            global_ratio: 1.0,
            host_s: 0.0,
            observed: 0,
            timed: 0,
        })
    }

    pub fn points(&self) -> &[usize] {
        &self.points
    }
    pub fn seconds(&self) -> &[f64] {
        &self.seconds
    }
    pub fn ratios(&self) -> &[f64] {
        &self.ratio
    }
    pub fn global_ratio(&self) -> f64 {
        self.global_ratio
    }
    pub fn host_s(&self) -> f64 {
        self.host_s
    }
    pub fn observed(&self) -> u64 {
        self.observed
    }
    /// Real passes that corrected each point so far.
    pub fn seen(&self) -> &[u32] {
        &self.seen
    }

    /// One step: a verification pass over `tokens` took `forward_s`; the host work of the
    /// step before took `host_s` (None: not known).
    pub fn observe(&mut self, tokens: usize, forward_s: f64, host_s: Option<f64>) {
        if let Some(h) = host_s.filter(|h| h.is_finite() && *h >= 0.0) {
            self.host_s += HOST_EMA * (h - self.host_s);
        }
        self.observed += 1;
        if !(forward_s.is_finite() && forward_s > 0.0) {
            return;
        }
        let last = self.points[self.points.len() - 1];
        if tokens as f64 >= EXTEND_FACTOR * last as f64 && self.points.len() < MAX_POINTS {
            self.points.push(tokens);
            self.seconds.push(forward_s / self.global_ratio);
            self.ratio.push(self.global_ratio);
            self.seen.push(1);
            return;
        }
        let xs: Vec<f64> = self.points.iter().map(|&p| p as f64).collect();
        let base = interp(tokens as f64, &xs, &self.seconds);
        let r = forward_s / base;
        // The mean of the first observations, then an average that follows drift: a
        // correction starts from what real passes took, however far off the measurement
        // was (one taken while the machine was busy, or kept from another process), instead
        // of forgetting it at EMA per pass. A point is corrected by passes of its own size
        // only (a size between points need not cost what an interpolation says); every
        // pass corrects the global ratio.
        if let Some(i) = self.points.iter().position(|&p| p == tokens) {
            self.seen[i] += 1;
            self.ratio[i] += EMA.max(1.0 / self.seen[i] as f64) * (r - self.ratio[i]);
        }
        self.timed += 1;
        self.global_ratio += EMA.max(1.0 / self.timed as f64) * (r - self.global_ratio);
    }

    /// c(1), ..., c(max_tokens) in seconds, host time included.
    pub fn curve(&self, max_tokens: usize) -> Vec<f32> {
        let xs: Vec<f64> = self.points.iter().map(|&p| p as f64).collect();
        let mut ys: Vec<f64> = (0..xs.len())
            .map(|i| {
                let r = if self.seen[i] >= MIN_OBSERVATIONS {
                    self.ratio[i]
                } else {
                    self.global_ratio
                };
                self.seconds[i] * r
            })
            .collect();
        // Non-decreasing: timing noise only adds time, so a value above a bigger pass's is
        // pulled down to it.
        for i in (0..ys.len().saturating_sub(1)).rev() {
            ys[i] = ys[i].min(ys[i + 1]);
        }
        let last = xs.len() - 1;
        let slope = tail_slope(&xs, &ys);
        (1..=max_tokens)
            .map(|n| {
                let n = n as f64;
                let c = if n > xs[last] {
                    ys[last] + slope * (n - xs[last])
                } else if n <= self.stepped as f64 {
                    ys[xs.partition_point(|&x| x < n)] // the next point's time
                } else {
                    interp(n, &xs, &ys)
                };
                (c + self.host_s) as f32
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_extrapolates_and_stays_monotone() {
        let c = CostCurve::new(vec![1, 2, 4, 8], vec![0.010, 0.030, 0.014, 0.018]).unwrap();
        let v = c.curve(10);
        assert!((v[0] - 0.010).abs() < 1e-6);
        assert!((v[1] - 0.014).abs() < 1e-6); // the noisy 2-token point is pulled down
        assert!(v.windows(2).all(|w| w[0] <= w[1] + 1e-9));
        // Between points, the next point's time: 3 tokens cost what 4 do, 5-7 what 8 do.
        assert!((v[2] - 0.014).abs() < 1e-6 && (v[4] - 0.018).abs() < 1e-6);
        assert!((v[9] - 0.020).abs() < 1e-6); // slope of the last segment: 0.001 per token
    }

    #[test]
    fn a_measurement_far_off_is_replaced_by_the_first_real_passes() {
        // Kept from a busy machine: 50x what passes really take.
        let mut c = CostCurve::new(vec![1, 4, 12], vec![0.5, 1.0, 1.5]).unwrap();
        for _ in 0..3 {
            c.observe(1, 0.010, None);
            c.observe(4, 0.020, None);
        }
        let v = c.curve(12);
        assert!((v[0] - 0.010).abs() < 1e-6, "{}", v[0]);
        assert!((v[3] - 0.020).abs() < 1e-6, "{}", v[3]);
        assert!((c.global_ratio() - 0.02).abs() < 1e-9); // 12 is priced by the global one
        assert!((v[11] - 0.030).abs() < 1e-6, "{}", v[11]);
        assert_eq!(c.seen(), &[3, 3, 0]);
    }

    #[test]
    fn learns_per_point_and_global_corrections_and_host_time() {
        let mut c = CostCurve::new(vec![1, 8, 64], vec![0.010, 0.020, 0.040]).unwrap();
        for _ in 0..200 {
            c.observe(1, 0.020, Some(0.001));
        }
        let v = c.curve(64);
        assert!((v[0] - 0.021).abs() < 1e-4, "{}", v[0]); // its own correction, plus host
        assert!((v[63] - 0.081).abs() < 1e-3, "{}", v[63]); // the global one elsewhere
        assert!((c.host_s() - 0.001).abs() < 1e-6);
    }

    #[test]
    fn a_pass_past_the_last_point_becomes_a_point() {
        let mut c = CostCurve::new(
            vec![1, 2, 4, 8, 16],
            vec![0.010, 0.011, 0.012, 0.014, 0.018],
        )
        .unwrap();
        for _ in 0..50 {
            c.observe(1, 0.020, None); // everything runs at twice the measured time
        }
        let before = c.curve(64)[63]; // extrapolated: 0.018 + 48 * 0.0005, doubled
        assert!((before - 0.084).abs() < 2e-3, "{before}");
        c.observe(64, 0.200, None); // the real pass over 64 tokens is much dearer
        assert_eq!(c.points(), &[1, 2, 4, 8, 16, 64]);
        let after = c.curve(64);
        assert!((after[63] - 0.200).abs() < 1e-2, "{}", after[63]);
        assert!(after[39] > before * 0.9 && after[39] < 0.2); // interpolated towards it
        c.observe(80, 0.25, None); // not far enough past 64: corrects, does not extend
        assert_eq!(c.points().len(), 6);
    }

    #[test]
    fn only_passes_of_a_points_own_size_correct_it() {
        // 3-token passes cost 3x the measurement: they move the global ratio, not 2's or 4's.
        let mut c = CostCurve::new(vec![1, 2, 4, 16], vec![0.010, 0.011, 0.012, 0.020]).unwrap();
        for _ in 0..10 {
            c.observe(3, 0.036, None);
            c.observe(4, 0.012, None);
        }
        assert_eq!(c.seen(), &[0, 0, 10, 0]);
        assert!((c.ratios()[2] - 1.0).abs() < 1e-9);
        assert!(c.global_ratio() > 1.5);
        let v = c.curve(24);
        assert!((v[3] - 0.012).abs() < 1e-6, "{}", v[3]); // 4 tokens: their own passes
        assert_eq!(v[2], v[3]); // 3 tokens are priced as 4
        assert!(v[16] > v[15]); // past the first-use points: extrapolated
    }

    #[test]
    fn past_the_last_point_the_upper_half_sets_the_slope() {
        // 12 and 16 took the same time: the slope comes from 8 -> 16, not 12 -> 16.
        let c = CostCurve::new(
            vec![1, 2, 4, 8, 12, 16],
            vec![0.06, 0.08, 0.09, 0.10, 0.12, 0.12],
        )
        .unwrap();
        let v = c.curve(32);
        assert!((v[31] - (0.12 + 16.0 * 0.0025)).abs() < 1e-6, "{}", v[31]);
    }

    #[test]
    fn rejects_bad_measurements() {
        assert!(CostCurve::new(vec![], vec![]).is_err());
        assert!(CostCurve::new(vec![2, 1], vec![0.1, 0.2]).is_err());
        assert!(CostCurve::new(vec![1, 2], vec![0.1, f64::NAN]).is_err());
        assert!(CostCurve::new(vec![1], vec![0.1, 0.2]).is_err());
    }
}
