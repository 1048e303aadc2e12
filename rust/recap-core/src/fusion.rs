//! Fusion of the rows found for one context into a single proposal distribution.
//!
//! Default (prior x confidence): w_s = pi_s * exp(-H_s); q = sum_s w_s p_s / sum_s w_s,
//! truncated to its top K and renormalised. The other modes exist for ablations.

use crate::error::{Error, Result};
use crate::memory::RowView;

/// How the rows of G, C and U are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FusionMode {
    /// U only (Token Recycling's key).
    Unigram,
    /// The most specific row available (G, else C, else U).
    Backoff,
    /// Equal weights for all available rows.
    Uniform,
    /// Fixed specificity priors pi_s.
    Prior,
    /// pi_s * exp(-H_s) (the default).
    #[default]
    PriorConfidence,
}

impl FusionMode {
    pub const NAMES: [&'static str; 5] =
        ["unigram", "backoff", "uniform", "prior", "prior_confidence"];

    pub fn name(self) -> &'static str {
        match self {
            FusionMode::Unigram => "unigram",
            FusionMode::Backoff => "backoff",
            FusionMode::Uniform => "uniform",
            FusionMode::Prior => "prior",
            FusionMode::PriorConfidence => "prior_confidence",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "unigram" => FusionMode::Unigram,
            "backoff" => FusionMode::Backoff,
            "uniform" => FusionMode::Uniform,
            "prior" => FusionMode::Prior,
            "prior_confidence" => FusionMode::PriorConfidence,
            other => {
                return Err(Error::invalid(
                    "fusion",
                    format!("one of {:?}", Self::NAMES),
                    format!("{other:?}"),
                ))
            }
        })
    }
}

/// Specificity priors for (G, C, U).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Priors {
    pub g: f32,
    pub c: f32,
    pub u: f32,
}

impl Default for Priors {
    fn default() -> Self {
        Priors {
            g: 0.70,
            c: 0.20,
            u: 0.10,
        }
    }
}

/// A proposal distribution: ids sorted by probability (descending, ties by smaller id).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proposal {
    pub ids: Vec<u32>,
    pub probs: Vec<f32>,
}

impl Proposal {
    pub fn clear(&mut self) {
        self.ids.clear();
        self.probs.clear();
    }
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Reusable scratch for `fuse` so the hot path does not allocate.
#[derive(Clone, Debug, Default)]
pub struct Fuser {
    ids: Vec<u32>,
    mass: Vec<f32>,
    order: Vec<u32>,
}

impl Fuser {
    /// Fuses the rows (G, C, U order; any may be missing) into `out` (top `k`, renormalised).
    pub fn fuse(
        &mut self,
        rows: [Option<RowView<'_>>; 3],
        mode: FusionMode,
        priors: Priors,
        k: usize,
        out: &mut Proposal,
    ) {
        out.clear();
        self.ids.clear();
        self.mass.clear();
        let pis = [priors.g, priors.c, priors.u];
        let mut weights = [0.0f32; 3];
        match mode {
            FusionMode::Unigram => weights[2] = rows[2].map_or(0.0, |_| 1.0),
            FusionMode::Backoff => {
                if let Some(i) = rows.iter().position(|r| r.is_some()) {
                    weights[i] = 1.0;
                }
            }
            FusionMode::Uniform | FusionMode::Prior | FusionMode::PriorConfidence => {
                for (i, row) in rows.iter().enumerate() {
                    if let Some(r) = row {
                        weights[i] = match mode {
                            FusionMode::Uniform => 1.0,
                            FusionMode::Prior => pis[i],
                            _ => pis[i] * r.confidence,
                        };
                    }
                }
            }
        }
        let total: f32 = weights.iter().sum();
        if total <= 0.0 || !total.is_finite() {
            return;
        }
        for (row, &w) in rows.iter().zip(weights.iter()) {
            let Some(r) = row else { continue };
            if w <= 0.0 || r.inv_mass <= 0.0 {
                continue;
            }
            let scale = w / total * r.inv_mass;
            for (&id, &p) in r.ids.iter().zip(r.probs.iter()) {
                let add = p * scale;
                match self.ids.iter().position(|&x| x == id) {
                    Some(j) => self.mass[j] += add,
                    None => {
                        self.ids.push(id);
                        self.mass.push(add);
                    }
                }
            }
        }
        self.order.clear();
        self.order.extend(0..self.ids.len() as u32);
        let (ids, mass) = (&self.ids, &self.mass);
        self.order.sort_unstable_by(|&a, &b| {
            let (a, b) = (a as usize, b as usize);
            mass[b].total_cmp(&mass[a]).then(ids[a].cmp(&ids[b]))
        });
        let keep = self.order.len().min(k);
        let kept: f32 = self.order[..keep].iter().map(|&j| mass[j as usize]).sum();
        if kept <= 0.0 {
            return;
        }
        for &j in &self.order[..keep] {
            let p = mass[j as usize] / kept;
            if p > 0.0 {
                out.ids.push(ids[j as usize]);
                out.probs.push(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::row_stats;
    use proptest::prelude::*;

    fn view<'a>(ids: &'a [u32], probs: &'a [f32]) -> RowView<'a> {
        let (inv_mass, confidence) = row_stats(probs);
        RowView {
            ids,
            probs,
            inv_mass,
            confidence,
        }
    }

    #[test]
    fn single_source_is_the_normalised_row() {
        let (ids, probs) = ([5u32, 9, 2], [0.4f32, 0.2, 0.1]);
        let mut f = Fuser::default();
        let mut out = Proposal::default();
        f.fuse(
            [None, None, Some(view(&ids, &probs))],
            FusionMode::PriorConfidence,
            Priors::default(),
            8,
            &mut out,
        );
        assert_eq!(out.ids, vec![5, 9, 2]);
        for (p, want) in out.probs.iter().zip([4.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0]) {
            assert!((p - want).abs() < 1e-6);
        }
    }

    #[test]
    fn backoff_uses_the_most_specific_row_and_unigram_only_u() {
        let g = ([1u32], [1.0f32]);
        let u = ([2u32], [1.0f32]);
        let rows = [Some(view(&g.0, &g.1)), None, Some(view(&u.0, &u.1))];
        let mut f = Fuser::default();
        let mut out = Proposal::default();
        f.fuse(rows, FusionMode::Backoff, Priors::default(), 8, &mut out);
        assert_eq!(out.ids, vec![1]);
        f.fuse(rows, FusionMode::Unigram, Priors::default(), 8, &mut out);
        assert_eq!(out.ids, vec![2]);
    }

    #[test]
    fn prior_mode_weighs_rows_by_their_priors() {
        let g = ([1u32], [1.0f32]);
        let u = ([2u32], [1.0f32]);
        let rows = [Some(view(&g.0, &g.1)), None, Some(view(&u.0, &u.1))];
        let mut f = Fuser::default();
        let mut out = Proposal::default();
        f.fuse(rows, FusionMode::Prior, Priors::default(), 8, &mut out);
        assert_eq!(out.ids, vec![1, 2]);
        assert!((out.probs[0] - 0.7 / 0.8).abs() < 1e-6);
    }

    #[test]
    fn unknown_mode_names_are_rejected_with_the_choices() {
        let e = FusionMode::parse("nope").unwrap_err().to_string();
        assert!(e.contains("prior_confidence") && e.contains("nope"), "{e}");
    }

    fn arb_row() -> impl Strategy<Value = (Vec<u32>, Vec<f32>)> {
        proptest::collection::btree_set(0u32..20, 1..8).prop_flat_map(|ids| {
            let n = ids.len();
            (
                Just(ids.into_iter().collect::<Vec<_>>()),
                proptest::collection::vec(0.001f32..1.0, n),
            )
        })
    }

    proptest! {
        #[test]
        fn fused_distribution_sums_to_one_with_at_most_k_sorted_unique_entries(
            g in proptest::option::of(arb_row()),
            c in proptest::option::of(arb_row()),
            u in proptest::option::of(arb_row()),
            k in 1usize..10,
            mode in 0usize..5,
        ) {
            let mode = FusionMode::parse(FusionMode::NAMES[mode]).unwrap();
            let rows = [
                g.as_ref().map(|r| view(&r.0, &r.1)),
                c.as_ref().map(|r| view(&r.0, &r.1)),
                u.as_ref().map(|r| view(&r.0, &r.1)),
            ];
            let mut f = Fuser::default();
            let mut out = Proposal::default();
            f.fuse(rows, mode, Priors::default(), k, &mut out);
            prop_assert!(out.len() <= k);
            let mut seen = out.ids.clone();
            seen.sort();
            seen.dedup();
            prop_assert_eq!(seen.len(), out.len());
            for w in out.probs.windows(2) {
                prop_assert!(w[0] >= w[1]);
            }
            if !out.is_empty() {
                let s: f32 = out.probs.iter().sum();
                prop_assert!((s - 1.0).abs() < 1e-5, "sum {}", s);
            }
            let usable = match mode {
                FusionMode::Unigram => u.is_some(),
                _ => g.is_some() || c.is_some() || u.is_some(),
            };
            prop_assert_eq!(out.is_empty(), !usable);
        }
    }
}
