//! A request's own correction of each node source's calibrated price.
//!
//! The calibration table is shared by every request of a scope, and one request's evidence
//! can mean another thing in the next: after a copy prompt a depth-1 chain behind a 20-token
//! match holds 95% of the time, while in a summary of the same article the same evidence
//! holds almost never (SmolLM2, enwiki/Albedo after copy/repeat-lincoln: 37 nodes expected
//! by the table, none accepted). Per request and per source kind, the nodes kept are
//! expected (by the table, before this correction) and their acceptances counted; the ratio
//! of the two, shrunk toward 1 by a prior and fading with the steps, scales the kind's
//! prices for the rest of the request. A source that fails here is priced down within a few
//! steps while the others keep drafting; one that does better than the table says is priced
//! up.

/// Search nodes, chains copied alone, chains the memory also proposed, frequency-tree
/// nodes alone and agreed.
pub(crate) const KINDS: usize = 5;
/// Pseudo-observations at ratio 1: expected nodes the prior is worth.
const PRIOR: f32 = 2.0;
/// Weight kept per step: the correction follows the last few dozen steps.
const FADE: f32 = 0.97;
/// The correction's range.
const LOW: f32 = 0.1;
const HIGH: f32 = 3.0;

#[derive(Clone, Debug, Default)]
pub(crate) struct SourceScale {
    expected: [f32; KINDS],
    accepted: [f32; KINDS],
    /// Tests of the mechanisms this correction would mask (the backoff) turn it off.
    off: bool,
}

impl SourceScale {
    /// A new request starts uncorrected.
    pub fn reset(&mut self) {
        *self = Self {
            off: self.off,
            ..Self::default()
        };
    }

    #[cfg(test)]
    pub fn turn_off(&mut self) {
        self.off = true;
    }

    /// The factor on the table's price of a `kind` node in this request.
    pub fn factor(&self, kind: usize) -> f32 {
        if self.off {
            return 1.0;
        }
        ((self.accepted[kind] + PRIOR) / (self.expected[kind] + PRIOR)).clamp(LOW, HIGH)
    }

    /// A kept node of `kind` the table expected to be accepted with probability `p`.
    pub fn expect(&mut self, kind: usize, p: f32) {
        self.expected[kind] += p;
    }

    /// One verified step: what was accepted, per kind; older steps fade.
    pub fn observe(&mut self, accepted: &[f32; KINDS]) {
        for (e, (a, &now)) in self
            .expected
            .iter_mut()
            .zip(self.accepted.iter_mut().zip(accepted))
        {
            *e *= FADE;
            *a = *a * FADE + now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_source_is_priced_down_and_the_others_are_not() {
        let mut s = SourceScale::default();
        assert_eq!(s.factor(1), 1.0);
        for _ in 0..10 {
            s.expect(1, 0.8); // chains expected often, never accepted
            s.expect(0, 0.3);
            s.observe(&[0.3, 0.0, 0.0, 0.0, 0.0]);
        }
        assert!(s.factor(1) < 0.3, "{}", s.factor(1));
        assert!((s.factor(0) - 1.0).abs() < 0.05, "{}", s.factor(0));
        assert_eq!(s.factor(3), 1.0);
        s.reset();
        assert_eq!(s.factor(1), 1.0);
    }

    #[test]
    fn a_source_doing_better_than_the_table_is_priced_up_within_bounds() {
        let mut s = SourceScale::default();
        for _ in 0..200 {
            s.expect(2, 0.2);
            s.observe(&[0.0, 0.0, 1.0, 0.0, 0.0]);
        }
        assert_eq!(s.factor(2), HIGH);
    }

    #[test]
    fn old_steps_fade() {
        let mut s = SourceScale::default();
        for _ in 0..20 {
            s.expect(0, 1.0);
            s.observe(&[0.0; KINDS]);
        }
        let low = s.factor(0);
        for _ in 0..60 {
            s.expect(0, 1.0);
            s.observe(&[1.0, 0.0, 0.0, 0.0, 0.0]);
        }
        assert!(low < 0.2 && s.factor(0) > 0.9, "{low} then {}", s.factor(0));
    }
}
