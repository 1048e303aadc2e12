//! `Drafter`: one drafter shared by every request (configuration, persistent memory,
//! cross-request structures, budget calibration), safe to use from many threads. Every
//! stream of drafts, one script's included, is a `Session` opened from it; the drafter is
//! where the budget's cost curve is set, for every session opened afterwards.

use pyo3::prelude::*;
use recap_core::peers::{SuffixTreeConfig, TR_LEVELS};
use recap_core::{DraftSource, Error, RecapConfig, SharedDrafter, SharedMemory};

use crate::arrays::ids_1d;
use crate::config::{nonneg, Knobs};
use crate::errors::to_py;
use crate::memory::{Calibration, PersistentMemory};
use crate::session::Session;

#[pyclass(frozen, module = "recap._core")]
pub struct Drafter {
    inner: SharedDrafter,
    memory: Option<Py<PersistentMemory>>,
}

/// The given memory (checked against vocab_size and k) or a new private one.
fn memory_or_new(
    py: Python<'_>,
    memory: Option<Py<PersistentMemory>>,
    vocab_size: usize,
    k: usize,
) -> PyResult<Py<PersistentMemory>> {
    let memory = match memory {
        Some(m) => m,
        None => Py::new(
            py,
            PersistentMemory::new(vocab_size, k, SharedMemory::DEFAULT_CAPACITY)?,
        )?,
    };
    let shared = &memory.get().inner;
    let got_k = shared.read().k();
    if shared.vocab_size() != vocab_size || got_k != k {
        return Err(to_py(Error::invalid(
            "memory",
            format!("a PersistentMemory with vocab_size {vocab_size} and k {k}"),
            format!("vocab_size {} and k {got_k}", shared.vocab_size()),
        )));
    }
    Ok(memory)
}

fn tr_levels(levels: Option<Vec<i64>>) -> PyResult<Vec<usize>> {
    match levels {
        Some(l) => l.into_iter().map(|v| nonneg("levels", v)).collect(),
        None => Ok(TR_LEVELS.to_vec()),
    }
}

impl Drafter {
    fn build(
        source: DraftSource,
        vocab_size: usize,
        excluded: Option<&Bound<'_, PyAny>>,
        memory: Option<Py<PersistentMemory>>,
    ) -> PyResult<Self> {
        let excluded = match excluded {
            Some(obj) => ids_1d("excluded", obj)?,
            None => Vec::new(),
        };
        let shared = memory.as_ref().map(|m| m.get().inner.clone());
        let inner = SharedDrafter::new(source, vocab_size, &excluded, shared).map_err(to_py)?;
        Ok(Drafter { inner, memory })
    }

    fn open(
        &self,
        py: Python<'_>,
        memory: Option<Py<PersistentMemory>>,
        calibration: Option<&Calibration>,
    ) -> PyResult<Session> {
        let shared = memory.as_ref().map(|m| m.get().inner.clone());
        let session = self
            .inner
            .session(shared, calibration.map(|c| c.inner.clone()))
            .map_err(to_py)?;
        let memory = memory.or_else(|| self.memory.as_ref().map(|m| m.clone_ref(py)));
        Ok(Session {
            session,
            memory,
            scratch: Default::default(),
        })
    }
}

#[pymethods]
impl Drafter {
    /// A RECAP drafter. `memory` is a PersistentMemory to share; a private one is created
    /// when it is None. Settings left as None take `recap_defaults()`.
    #[staticmethod]
    #[pyo3(signature = (vocab_size, *, k = None, budget = None, max_depth = None, eta = None,
        priors = None, fusion = None, suffix_len = None, suffix_adaptive = false,
        context_capacity = None, seed_context = false, reset_memory = false, frequency = false,
        frequency_floor = false, excluded = None, memory = None))]
    #[allow(clippy::too_many_arguments)]
    fn recap(
        py: Python<'_>,
        vocab_size: i64,
        k: Option<i64>,
        budget: Option<i64>,
        max_depth: Option<i64>,
        eta: Option<Vec<f32>>,
        priors: Option<(f32, f32, f32)>,
        fusion: Option<&str>,
        suffix_len: Option<i64>,
        suffix_adaptive: bool,
        context_capacity: Option<i64>,
        seed_context: bool,
        reset_memory: bool,
        frequency: bool,
        frequency_floor: bool,
        excluded: Option<&Bound<'_, PyAny>>,
        memory: Option<Py<PersistentMemory>>,
    ) -> PyResult<Self> {
        let vocab_size = nonneg("vocab_size", vocab_size)?;
        let d = RecapConfig::default();
        let config = Knobs {
            k: k.unwrap_or(d.k as i64),
            budget: budget.unwrap_or(d.search.budget as i64),
            max_depth: max_depth.unwrap_or(i64::from(d.search.max_depth)),
            eta,
            priors: priors.unwrap_or((d.priors.g, d.priors.c, d.priors.u)),
            fusion: fusion.unwrap_or(d.fusion.name()),
            suffix_len: suffix_len.unwrap_or(d.suffix_len as i64),
            suffix_adaptive,
            context_capacity: context_capacity.unwrap_or(d.context_capacity as i64),
            seed_context,
            reset_memory,
            frequency,
            frequency_floor,
        }
        .build()?;
        let memory = memory_or_new(py, memory, vocab_size, config.k)?;
        Self::build(
            DraftSource::Recap(config),
            vocab_size,
            excluded,
            Some(memory),
        )
    }

    /// Plain greedy decoding through the same loop (every tree is the root alone).
    #[staticmethod]
    fn ar(vocab_size: i64) -> PyResult<Self> {
        Self::build(
            DraftSource::Ar,
            nonneg("vocab_size", vocab_size)?,
            None,
            None,
        )
    }

    /// Prompt lookup with transformers' semantics: the earliest earlier occurrence of the
    /// last n-gram (n = max_ngram .. 1), then up to num_tokens tokens as a chain.
    #[staticmethod]
    #[pyo3(signature = (vocab_size, *, max_ngram = 2, num_tokens = 10, excluded = None))]
    fn pld(
        vocab_size: i64,
        max_ngram: i64,
        num_tokens: i64,
        excluded: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let source = DraftSource::Pld {
            max_ngram: nonneg("max_ngram", max_ngram)?,
            num_tokens: nonneg("num_tokens", num_tokens)?,
        };
        Self::build(source, nonneg("vocab_size", vocab_size)?, excluded, None)
    }

    /// Token Recycling: adjacency rows in `memory` (kept across requests), static tree
    /// template with `levels` nodes per level (default 8/21/25/15/8/3, 80 nodes).
    #[staticmethod]
    #[pyo3(signature = (vocab_size, *, levels = None, k = 8, excluded = None, memory = None))]
    fn tr(
        py: Python<'_>,
        vocab_size: i64,
        levels: Option<Vec<i64>>,
        k: i64,
        excluded: Option<&Bound<'_, PyAny>>,
        memory: Option<Py<PersistentMemory>>,
    ) -> PyResult<Self> {
        let vocab_size = nonneg("vocab_size", vocab_size)?;
        let (levels, k) = (tr_levels(levels)?, nonneg("k", k)?);
        let memory = memory_or_new(py, memory, vocab_size, k)?;
        Self::build(
            DraftSource::Tr { levels, k },
            vocab_size,
            excluded,
            Some(memory),
        )
    }

    /// SAM-Decoding: suffix-automaton chains of min(max_len, 1 + 4 * match) tokens. With
    /// `fallback_tr=True` (SAM[TR]) a Token Recycling tree is drafted when the match is
    /// shorter than `threshold`.
    #[staticmethod]
    #[pyo3(signature = (vocab_size, *, max_len = 60, fallback_tr = false, threshold = 5,
        levels = None, k = 8, excluded = None, memory = None))]
    #[allow(clippy::too_many_arguments)]
    fn sam(
        py: Python<'_>,
        vocab_size: i64,
        max_len: i64,
        fallback_tr: bool,
        threshold: i64,
        levels: Option<Vec<i64>>,
        k: i64,
        excluded: Option<&Bound<'_, PyAny>>,
        memory: Option<Py<PersistentMemory>>,
    ) -> PyResult<Self> {
        let vocab_size = nonneg("vocab_size", vocab_size)?;
        let (fallback, memory) = if fallback_tr {
            let k = nonneg("k", k)?;
            let m = memory_or_new(py, memory, vocab_size, k)?;
            (
                Some((tr_levels(levels)?, k, nonneg("threshold", threshold)?)),
                Some(m),
            )
        } else {
            (None, None)
        };
        let source = DraftSource::Sam {
            max_len: nonneg("max_len", max_len)?,
            fallback,
        };
        Self::build(source, vocab_size, excluded, memory)
    }

    /// SuffixDecoding-style suffix trees with counts over this request (and, with
    /// `cross_request=True`, earlier outputs of this drafter).
    #[staticmethod]
    #[pyo3(signature = (vocab_size, *, max_depth = 64, max_spec = 16, factor = 1.0,
        min_prob = 0.1, cross_request = false, excluded = None))]
    #[allow(clippy::too_many_arguments)]
    fn suffix(
        vocab_size: i64,
        max_depth: i64,
        max_spec: i64,
        factor: f32,
        min_prob: f32,
        cross_request: bool,
        excluded: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let vocab_size = nonneg("vocab_size", vocab_size)?;
        let config = SuffixTreeConfig {
            max_depth: nonneg("max_depth", max_depth)?,
            max_spec: nonneg("max_spec", max_spec)?,
            factor,
            min_prob,
            cross_request,
            ..Default::default()
        };
        Self::build(DraftSource::Suffix(config), vocab_size, excluded, None)
    }

    /// Opens one request. `memory` (a scope's PersistentMemory) replaces the drafter's own
    /// for this session; `calibration` (a scope's) replaces the drafter's budget state.
    /// Raises for a memory of another vocabulary or K, or on a drafter without one.
    #[pyo3(signature = (*, memory = None, calibration = None))]
    fn session(
        &self,
        py: Python<'_>,
        memory: Option<Py<PersistentMemory>>,
        calibration: Option<Py<Calibration>>,
    ) -> PyResult<Session> {
        self.open(py, memory, calibration.as_ref().map(|c| c.get()))
    }

    /// Hardware-aware tree size for every session opened from now on: with `cost`
    /// (cost[n-1] = seconds of a verification pass over n tokens), every tree is cut to the
    /// prefix with the most expected committed tokens per second; None verifies whole trees.
    #[pyo3(signature = (cost))]
    fn set_cost(&self, cost: Option<Vec<f32>>) -> PyResult<()> {
        self.inner.set_cost(cost).map_err(to_py)
    }

    /// The automatic budget for every session opened from now on, sizing trees by a cost
    /// curve measured at `points` tree tokens (`seconds` per pass), which each session's step
    /// timings then correct.
    fn set_cost_points(&self, points: Vec<usize>, seconds: Vec<f64>) -> PyResult<()> {
        self.inner.set_cost_points(points, seconds).map_err(to_py)
    }

    /// The most nodes one tree can hold, root not counted.
    #[getter]
    fn max_nodes(&self) -> usize {
        self.inner.max_nodes()
    }
    #[getter]
    fn method(&self) -> &'static str {
        self.inner.name()
    }
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    /// The drafter's own persistent memory, if it has one (sessions opened without a
    /// memory draw on it).
    #[getter]
    fn memory(&self, py: Python<'_>) -> Option<Py<PersistentMemory>> {
        self.memory.as_ref().map(|m| m.clone_ref(py))
    }
    /// The drafter's own budget calibration (sessions opened without one use it).
    #[getter]
    fn own_calibration(&self) -> Calibration {
        Calibration {
            inner: self.inner.calibration().clone(),
        }
    }
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Drafter>()?;
    Ok(())
}
