//! Python classes: `PersistentMemory` (shared U), `Drafter` (one request stream) and
//! `DraftTree` (the packed tree of one step).

use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadwriteArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use recap_core::memory::UnigramTable;
use recap_core::peers::{
    Autoregressive, PromptLookup, SamDrafter, SuffixTreeConfig, SuffixTreeDrafter, TokenRecycling,
    TR_LEVELS,
};
use recap_core::snapshot::{self, Expect};
use recap_core::token_set::TokenSet;
use recap_core::{DraftSession, RecapConfig, RecapDrafter, SharedMemory, TopKRows};

use crate::arrays::{ids_1d, ids_2d, probs_2d};
use crate::config::{nonneg, Knobs};
use crate::errors::to_py;
use crate::step;

type IdsArray<'py> = Bound<'py, PyArray1<i64>>;

/// The persistent memory U: one top-K row per token, kept across requests, shareable by
/// several drafters (and threads). Bounded by `capacity` rows with CLOCK eviction.
#[pyclass(frozen, module = "recap._core")]
pub struct PersistentMemory {
    inner: SharedMemory,
}

#[pymethods]
impl PersistentMemory {
    #[new]
    #[pyo3(signature = (vocab_size, *, k = 8, capacity = SharedMemory::DEFAULT_CAPACITY))]
    fn new(vocab_size: usize, k: usize, capacity: usize) -> PyResult<Self> {
        Ok(PersistentMemory {
            inner: SharedMemory::new(vocab_size, k, capacity).map_err(to_py)?,
        })
    }
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    #[getter]
    fn k(&self) -> usize {
        self.inner.lock().k()
    }
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.lock().capacity()
    }
    /// Rows evicted so far.
    #[getter]
    fn evictions(&self) -> u64 {
        self.inner.lock().evictions()
    }
    fn __len__(&self) -> usize {
        self.inner.lock().len()
    }
    /// Heap bytes held.
    fn bytes(&self) -> usize {
        self.inner.bytes()
    }
    fn clear(&self) {
        self.inner.lock().clear();
    }
    /// Writes a snapshot to `path` atomically (a temporary file beside it, then a rename).
    /// `fingerprint` identifies the model the rows came from (`recap.memory_fingerprint`).
    #[pyo3(signature = (path, *, fingerprint = 0))]
    fn save(&self, py: Python<'_>, path: std::path::PathBuf, fingerprint: u64) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| inner.save(&path, fingerprint)).map_err(to_py)
    }

    /// A memory read from a snapshot. Raises ValueError, naming what was expected and what
    /// was found, when the file is not a snapshot, is truncated or corrupted, has another
    /// format version, or does not match the given vocabulary size, K or fingerprint.
    #[staticmethod]
    #[pyo3(signature = (path, *, vocab_size = None, k = None, fingerprint = None))]
    fn load(
        py: Python<'_>,
        path: std::path::PathBuf,
        vocab_size: Option<usize>,
        k: Option<usize>,
        fingerprint: Option<u64>,
    ) -> PyResult<Self> {
        let expect = Expect {
            vocab_size,
            k,
            fingerprint,
        };
        let (inner, _) = py
            .detach(|| SharedMemory::load(&path, expect))
            .map_err(to_py)?;
        Ok(PersistentMemory { inner })
    }

    /// The header of a snapshot file as a dict (vocab_size, k, capacity, fingerprint, rows).
    #[staticmethod]
    fn inspect<'py>(py: Python<'py>, path: std::path::PathBuf) -> PyResult<Bound<'py, PyDict>> {
        let bytes = snapshot::read(&path).map_err(to_py)?;
        let h = snapshot::header(&bytes).map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("vocab_size", h.vocab_size)?;
        d.set_item("k", h.k)?;
        d.set_item("capacity", h.capacity)?;
        d.set_item("fingerprint", h.fingerprint)?;
        d.set_item("rows", h.rows)?;
        Ok(d)
    }

    /// The stored row of `token` as (ids, probs), or None.
    fn row<'py>(
        &self,
        py: Python<'py>,
        token: u32,
    ) -> Option<(IdsArray<'py>, Bound<'py, PyArray1<f32>>)> {
        let table: std::sync::MutexGuard<'_, UnigramTable> = self.inner.lock();
        let r = table.get(token)?;
        let ids: Vec<i64> = r.ids.iter().map(|&x| x as i64).collect();
        Some((ids.into_pyarray(py), r.probs.to_vec().into_pyarray(py)))
    }
}

/// A packed draft tree in preorder, root (the last committed token) at index 0.
#[pyclass(frozen, module = "recap._core")]
pub struct DraftTree {
    #[pyo3(get)]
    tokens: Py<PyArray1<i64>>,
    #[pyo3(get)]
    parents: Py<PyArray1<i64>>,
    #[pyo3(get)]
    depths: Py<PyArray1<i64>>,
    #[pyo3(get)]
    scores: Py<PyArray1<f32>>,
    /// 0 root, 1 tree search, 2 suffix graft.
    #[pyo3(get)]
    sources: Py<PyArray1<u8>>,
    /// T x T ancestor-or-self mask (row i: nodes node i attends to).
    #[pyo3(get)]
    mask: Py<PyArray2<bool>>,
    len: usize,
}

#[pymethods]
impl DraftTree {
    fn __len__(&self) -> usize {
        self.len
    }
    fn __repr__(&self) -> String {
        format!("DraftTree(nodes={})", self.len)
    }
}

struct Packed {
    tokens: Vec<i64>,
    parents: Vec<i64>,
    depths: Vec<i64>,
    scores: Vec<f32>,
    sources: Vec<u8>,
    mask: Vec<bool>,
}

impl Packed {
    fn from_tree(t: &recap_core::DraftTree) -> Self {
        Packed {
            tokens: t.tokens.iter().map(|&x| x as i64).collect(),
            parents: t.parents.iter().map(|&x| x as i64).collect(),
            depths: t.depths.iter().map(|&x| x as i64).collect(),
            scores: t.scores.clone(),
            sources: t.sources.iter().map(|&s| s as u8).collect(),
            mask: t.ancestor_mask(),
        }
    }

    fn into_py(self, py: Python<'_>) -> PyResult<DraftTree> {
        let n = self.tokens.len();
        Ok(DraftTree {
            tokens: self.tokens.into_pyarray(py).unbind(),
            parents: self.parents.into_pyarray(py).unbind(),
            depths: self.depths.into_pyarray(py).unbind(),
            scores: self.scores.into_pyarray(py).unbind(),
            sources: self.sources.into_pyarray(py).unbind(),
            mask: self.mask.into_pyarray(py).reshape([n, n])?.unbind(),
            len: n,
        })
    }
}

/// One request stream: the committed history, a drafter and the accept step.
#[pyclass(module = "recap._core")]
pub struct Drafter {
    session: DraftSession,
    memory: Option<Py<PersistentMemory>>,
}

fn excluded_set(vocab_size: usize, excluded: Option<&Bound<'_, PyAny>>) -> PyResult<TokenSet> {
    let ids = match excluded {
        Some(obj) => ids_1d("excluded", obj)?,
        None => Vec::new(),
    };
    recap_core::error::check_tokens("excluded", &ids, vocab_size).map_err(to_py)?;
    Ok(TokenSet::from_ids(vocab_size, &ids))
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
    let got_k = shared.lock().k();
    if shared.vocab_size() != vocab_size || got_k != k {
        return Err(PyValueError::new_err(format!(
            "memory: expected a PersistentMemory with vocab_size {vocab_size} and k {k}, got \
             vocab_size {} and k {got_k}",
            shared.vocab_size()
        )));
    }
    Ok(memory)
}

impl Drafter {
    fn from_core(
        drafter: Box<dyn recap_core::Drafter>,
        vocab_size: usize,
        memory: Option<Py<PersistentMemory>>,
    ) -> PyResult<Self> {
        let session = DraftSession::new(drafter, vocab_size).map_err(to_py)?;
        Ok(Drafter { session, memory })
    }
}

#[pymethods]
impl Drafter {
    /// A RECAP drafter. `memory` is a PersistentMemory to share; a private one is created
    /// when it is None. Settings left as None take `recap_defaults()`.
    #[staticmethod]
    #[pyo3(signature = (vocab_size, *, k = None, budget = None, max_depth = None, eta = None,
        priors = None, fusion = None, suffix_len = None, suffix_adaptive = false,
        context_capacity = None, seed_context = false, reset_memory = false, excluded = None,
        memory = None))]
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
        }
        .build()?;
        let excluded = match excluded {
            Some(obj) => ids_1d("excluded", obj)?,
            None => Vec::new(),
        };
        let memory = memory_or_new(py, memory, vocab_size, config.k)?;
        let shared = memory.get().inner.clone();
        let drafter = RecapDrafter::new(config, shared, &excluded).map_err(to_py)?;
        Self::from_core(Box::new(drafter), vocab_size, Some(memory))
    }

    /// Plain greedy decoding through the same loop (every tree is the root alone).
    #[staticmethod]
    fn ar(vocab_size: i64) -> PyResult<Self> {
        Self::from_core(
            Box::new(Autoregressive),
            nonneg("vocab_size", vocab_size)?,
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
        let vocab_size = nonneg("vocab_size", vocab_size)?;
        let excluded = excluded_set(vocab_size, excluded)?;
        let d = PromptLookup::new(
            nonneg("max_ngram", max_ngram)?,
            nonneg("num_tokens", num_tokens)?,
            excluded,
        )
        .map_err(to_py)?;
        Self::from_core(Box::new(d), vocab_size, None)
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
        let (tr, memory) = Self::token_recycling(py, vocab_size, levels, k, excluded, memory)?;
        Self::from_core(Box::new(tr), vocab_size, Some(memory))
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
            let (tr, m) = Self::token_recycling(py, vocab_size, levels, k, excluded, memory)?;
            (Some((tr, nonneg("threshold", threshold)?)), Some(m))
        } else {
            (None, None)
        };
        let excluded = excluded_set(vocab_size, excluded)?;
        let d = SamDrafter::new(nonneg("max_len", max_len)?, excluded, fallback).map_err(to_py)?;
        Self::from_core(Box::new(d), vocab_size, memory)
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
        let excluded = excluded_set(vocab_size, excluded)?;
        let d = SuffixTreeDrafter::new(config, excluded).map_err(to_py)?;
        Self::from_core(Box::new(d), vocab_size, None)
    }

    /// Hardware-aware tree size: with `cost` (cost[n-1] = seconds of a verification pass
    /// over n tokens), every tree is cut to the prefix with the most expected committed
    /// tokens per second; None verifies whole trees.
    #[pyo3(signature = (cost))]
    fn set_cost(&mut self, cost: Option<Vec<f32>>) -> PyResult<()> {
        self.session.set_auto_budget(cost).map_err(to_py)
    }

    /// The automatic budget, sizing trees by a cost curve measured at `points` tree tokens
    /// (`seconds` per pass), which each step's timing then corrects (see observe_packed).
    fn set_cost_points(&mut self, points: Vec<usize>, seconds: Vec<f64>) -> PyResult<()> {
        self.session.set_cost_points(points, seconds).map_err(to_py)
    }

    /// The online cost curve's state as a dict (None without one): measured points and ms,
    /// per-point and global correction factors, steps observed, host ms per step.
    fn cost_state<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(c) = self.session.cost_curve() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("points", c.points().to_vec())?;
        d.set_item(
            "ms",
            c.seconds().iter().map(|s| s * 1e3).collect::<Vec<f64>>(),
        )?;
        d.set_item("online_ratio", c.ratios().to_vec())?;
        d.set_item("global_ratio", c.global_ratio())?;
        d.set_item("observed_steps", c.observed())?;
        d.set_item("host_ms", c.host_s() * 1e3)?;
        Ok(Some(d))
    }

    /// (offered nodes, kept nodes, expected accepted nodes) of the last tree cut by the
    /// hardware-aware budget, or None when it is off.
    #[getter]
    fn last_selection(&self) -> Option<(usize, usize, f32)> {
        self.session.auto_budget().map(|b| {
            let s = b.last();
            (s.offered, s.kept, s.expected)
        })
    }

    /// Acceptance calibration of the hardware-aware budget: (kind, bucket, prior, observed
    /// nodes, calibrated probability) per bucket seen so far. "score" buckets are path
    /// scores 2^(-bucket/4); "chain" buckets are depth * 4 + match-length class.
    fn calibration(&self) -> Vec<(&'static str, u32, f32, f32, f32)> {
        self.session
            .auto_budget()
            .map(|b| b.calibration())
            .unwrap_or_default()
    }

    /// The most nodes one tree can hold, root not counted.
    #[getter]
    fn max_nodes(&self) -> usize {
        self.session.drafter().max_nodes()
    }

    #[getter]
    fn method(&self) -> &'static str {
        self.session.drafter().name()
    }
    #[getter]
    fn vocab_size(&self) -> usize {
        self.session.vocab_size()
    }
    /// Draws on and writes to `memory` from the next request on (a memory scope). Raises
    /// for drafters without a persistent memory and for a memory of another vocabulary or K.
    fn set_memory(&mut self, memory: Py<PersistentMemory>) -> PyResult<()> {
        self.session
            .set_memory(memory.get().inner.clone())
            .map_err(to_py)?;
        self.memory = Some(memory);
        Ok(())
    }

    /// The shared persistent memory, if this drafter has one.
    #[getter]
    fn memory(&self, py: Python<'_>) -> Option<Py<PersistentMemory>> {
        self.memory.as_ref().map(|m| m.clone_ref(py))
    }
    /// Committed tokens of the current request (prompt + output).
    #[getter]
    fn history<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let h: Vec<i64> = self.session.history().iter().map(|&x| x as i64).collect();
        h.into_pyarray(py)
    }

    /// Starts a request from its committed tokens; the last one is the first root.
    fn begin(&mut self, py: Python<'_>, context: &Bound<'_, PyAny>) -> PyResult<()> {
        let context = ids_1d("context", context)?;
        let session = &mut self.session;
        py.detach(|| session.begin(&context)).map_err(to_py)
    }

    /// Seeds the memories from the prefill: row i ([n, k]) is the target's top-k after
    /// context token i.
    fn seed(
        &mut self,
        py: Python<'_>,
        topk_ids: &Bound<'_, PyAny>,
        topk_probs: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (ids, s1) = ids_2d("topk_ids", topk_ids)?;
        let (probs, s2) = probs_2d("topk_probs", topk_probs)?;
        check_same_shape(s1, s2)?;
        let vocab = self.session.vocab_size();
        let session = &mut self.session;
        py.detach(|| {
            let rows = TopKRows::new(&ids, &probs, s1[1], s1[0], vocab)?;
            session.seed(&rows)
        })
        .map_err(to_py)
    }

    /// Drafts the next tree.
    fn propose(&mut self, py: Python<'_>) -> PyResult<DraftTree> {
        let session = &mut self.session;
        let packed = py
            .detach(|| session.propose().map(Packed::from_tree))
            .map_err(to_py)?;
        packed.into_py(py)
    }

    /// Accepts the proposed tree against the target's per-node argmax `pred` [T] and its
    /// top-k rows [T, k]; updates the memories. Returns (accepted node indices, committed
    /// tokens) — the accepted path's tokens after the root, then the bonus token.
    fn observe<'py>(
        &mut self,
        py: Python<'py>,
        pred: &Bound<'_, PyAny>,
        topk_ids: &Bound<'_, PyAny>,
        topk_probs: &Bound<'_, PyAny>,
    ) -> PyResult<(IdsArray<'py>, IdsArray<'py>)> {
        let pred = ids_1d("pred", pred)?;
        let (ids, s1) = ids_2d("topk_ids", topk_ids)?;
        let (probs, s2) = probs_2d("topk_probs", topk_probs)?;
        check_same_shape(s1, s2)?;
        let vocab = self.session.vocab_size();
        let session = &mut self.session;
        let (path, committed) = py
            .detach(|| {
                let rows = TopKRows::new(&ids, &probs, s1[1], s1[0], vocab)?;
                let acc = session.observe(&pred, &rows)?;
                let committed: Vec<i64> = acc
                    .committed_tokens(session.tree())
                    .iter()
                    .map(|&t| t as i64)
                    .collect();
                let path: Vec<i64> = acc.path.iter().map(|&i| i as i64).collect();
                Ok((path, committed))
            })
            .map_err(to_py)?;
        Ok((path.into_pyarray(py), committed.into_pyarray(py)))
    }

    /// Drafts the next tree into the caller's buffers (allocated once per request): tokens,
    /// parents, depths and position ids (`position_base` + depth) [>= T] (int64) and the
    /// T x T additive mask block (float32, flat, >= T*T; 0 where a node sees a column,
    /// `masked` elsewhere). Returns (T, the deepest node's depth).
    #[pyo3(signature = (tokens, parents, depths, positions, block, masked, position_base = 0))]
    #[allow(clippy::too_many_arguments)]
    fn propose_into(
        &mut self,
        py: Python<'_>,
        tokens: PyReadwriteArray1<'_, i64>,
        parents: PyReadwriteArray1<'_, i64>,
        depths: PyReadwriteArray1<'_, i64>,
        positions: PyReadwriteArray1<'_, i64>,
        block: PyReadwriteArray1<'_, f32>,
        masked: f32,
        position_base: i64,
    ) -> PyResult<(usize, i64)> {
        let session = &mut self.session;
        py.detach(|| session.propose().map(|_| ())).map_err(to_py)?;
        let bufs = step::TreeBuffers {
            tokens,
            parents,
            depths,
            positions,
            block,
        };
        step::write_tree(self.session.tree(), bufs, masked, position_base)
    }

    /// `observe` on the verifier's packed output [T, 1 + 2k] as it comes from the device
    /// (column 0 the argmax, then k top ids, then k top probabilities). With the automatic
    /// budget, `forward_s` (this pass) and `host_s` (the host work of the step before) feed
    /// its cost curve.
    #[pyo3(signature = (packed, k, forward_s = None, host_s = None))]
    fn observe_packed<'py>(
        &mut self,
        py: Python<'py>,
        packed: &Bound<'_, PyAny>,
        k: usize,
        forward_s: Option<f64>,
        host_s: Option<f64>,
    ) -> PyResult<(IdsArray<'py>, IdsArray<'py>)> {
        let n = self.session.tree().len();
        let (path, committed) = step::observe_packed(&mut self.session, py, packed, k)?;
        if let Some(f) = forward_s {
            self.session.observe_timing(n, f, host_s).map_err(to_py)?;
        }
        Ok((path.into_pyarray(py), committed.into_pyarray(py)))
    }

    /// `bytes()` by structure: {"persistent U": ..., "request automaton": ..., ...}.
    fn bytes_by_part(&self) -> Vec<(&'static str, usize)> {
        self.session.drafter().parts()
    }

    /// Heap bytes held by this drafter, its share of the persistent memory included.
    fn bytes(&self) -> usize {
        self.session.drafter().bytes()
    }
}

impl Drafter {
    fn token_recycling(
        py: Python<'_>,
        vocab_size: usize,
        levels: Option<Vec<i64>>,
        k: i64,
        excluded: Option<&Bound<'_, PyAny>>,
        memory: Option<Py<PersistentMemory>>,
    ) -> PyResult<(TokenRecycling, Py<PersistentMemory>)> {
        let k = nonneg("k", k)?;
        let levels = match levels {
            Some(l) => l
                .into_iter()
                .map(|v| nonneg("levels", v))
                .collect::<PyResult<Vec<_>>>()?,
            None => TR_LEVELS.to_vec(),
        };
        let memory = memory_or_new(py, memory, vocab_size, k)?;
        let excluded = excluded_set(vocab_size, excluded)?;
        let tr =
            TokenRecycling::new(memory.get().inner.clone(), &levels, excluded).map_err(to_py)?;
        Ok((tr, memory))
    }
}

fn check_same_shape(a: [usize; 2], b: [usize; 2]) -> PyResult<()> {
    if a != b {
        return Err(PyValueError::new_err(format!(
            "topk_probs: expected the shape of topk_ids {:?}, got {:?}",
            a, b
        )));
    }
    Ok(())
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PersistentMemory>()?;
    m.add_class::<Drafter>()?;
    m.add_class::<DraftTree>()?;
    Ok(())
}
