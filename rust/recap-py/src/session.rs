//! `Session`: one request on a shared `Drafter` (history, C/G, automaton, tree, scratch and
//! its view of the budget), and `DraftTree`, the packed tree of one step.

use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadwriteArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use recap_core::{DraftSession, TopKRows};

use crate::arrays::{ids_1d, ids_2d, probs_2d};
use crate::errors::to_py;
use crate::memory::PersistentMemory;
use crate::step;

type IdsArray<'py> = Bound<'py, PyArray1<i64>>;

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
    /// 0 root, 1 tree search, 2 suffix graft, 3 suffix graft the tree search also proposed.
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

/// One request on a drafter (`Drafter.session()`): begin -> (seed) -> loop { propose ->
/// verify -> observe } -> finish. Use one session per thread.
#[pyclass(module = "recap._core")]
pub struct Session {
    pub(crate) session: DraftSession,
    pub(crate) memory: Option<Py<PersistentMemory>>,
    /// observe_packed's parsed rows, reused step after step.
    pub(crate) scratch: step::ObserveScratch,
}

#[pymethods]
impl Session {
    /// The online cost curve's state as a dict (None without one): measured points and ms,
    /// per-point and global correction factors, the passes that corrected each point, steps
    /// observed, host ms per step.
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
        d.set_item("seen", c.seen().to_vec())?;
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
    /// scores 2^(-bucket/4); "chain" buckets are depth bucket * 6 + match-length class, and
    /// "agreed" buckets the same for chain nodes the tree search also proposed.
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
    /// The persistent memory this session drafts from and writes to, if any.
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

    /// The request may commit at most `tokens` more (its length limit): drafts deeper than
    /// that are not verified. Until the next `begin`; each step counts its tokens off.
    fn limit_new_tokens(&mut self, tokens: i64) -> PyResult<()> {
        let tokens = usize::try_from(tokens).map_err(|_| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "limit_new_tokens: expected a token count >= 0, got {tokens}"
            ))
        })?;
        self.session.limit_new_tokens(tokens);
        Ok(())
    }

    /// Seeds the memories from the prefill: row i ([n, k]) is the target's top-k after
    /// context token `start + i` (a prefill may seed only the prompt's last positions).
    #[pyo3(signature = (topk_ids, topk_probs, start = 0))]
    fn seed(
        &mut self,
        py: Python<'_>,
        topk_ids: &Bound<'_, PyAny>,
        topk_probs: &Bound<'_, PyAny>,
        start: usize,
    ) -> PyResult<()> {
        let (ids, s1) = ids_2d("topk_ids", topk_ids)?;
        let (probs, s2) = probs_2d("topk_probs", topk_probs)?;
        check_same_shape(s1, s2)?;
        let vocab = self.session.vocab_size();
        let session = &mut self.session;
        py.detach(|| {
            let rows = TopKRows::new(&ids, &probs, s1[1], s1[0], vocab)?;
            session.seed(&rows, start)
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
        self.write_tree(
            tokens,
            parents,
            depths,
            positions,
            block,
            masked,
            position_base,
        )
    }

    /// Drafts the next tree without cutting it, for a caller that sizes several sessions'
    /// trees together (a batch): returns the cumulative expected accepted nodes of its
    /// best-first prefixes, float32 [offered + 1] (`gains[m]`: m nodes kept). Needs the
    /// automatic budget (`set_cost` / `set_cost_points`). `cut_into` keeps a prefix.
    fn propose_ranked<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let session = &mut self.session;
        let gains = py
            .detach(|| session.propose_ranked().map(|g| g.to_vec()))
            .map_err(to_py)?;
        Ok(gains.into_pyarray(py))
    }

    /// Keeps the root and the first `nodes` ranked nodes of the tree `propose_ranked`
    /// drafted and writes it into the caller's buffers as `propose_into` does. Returns (T,
    /// the deepest node's depth).
    #[pyo3(signature = (nodes, tokens, parents, depths, positions, block, masked, position_base = 0))]
    #[allow(clippy::too_many_arguments)]
    fn cut_into(
        &mut self,
        py: Python<'_>,
        nodes: usize,
        tokens: PyReadwriteArray1<'_, i64>,
        parents: PyReadwriteArray1<'_, i64>,
        depths: PyReadwriteArray1<'_, i64>,
        positions: PyReadwriteArray1<'_, i64>,
        block: PyReadwriteArray1<'_, f32>,
        masked: f32,
        position_base: i64,
    ) -> PyResult<(usize, i64)> {
        let session = &mut self.session;
        py.detach(|| session.cut_ranked(nodes).map(|_| ()))
            .map_err(to_py)?;
        self.write_tree(
            tokens,
            parents,
            depths,
            positions,
            block,
            masked,
            position_base,
        )
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
        let (path, committed) =
            step::observe_packed(&mut self.session, &mut self.scratch, py, packed, k)?;
        if let Some(f) = forward_s {
            self.session.observe_timing(n, f, host_s).map_err(to_py)?;
        }
        Ok((path.into_pyarray(py), committed.into_pyarray(py)))
    }

    /// `bytes()` by structure: {"persistent U": ..., "request automaton": ..., ...}.
    fn bytes_by_part(&self) -> Vec<(&'static str, usize)> {
        self.session.drafter().parts()
    }

    /// Heap bytes held by this session, its share of the persistent memory included.
    fn bytes(&self) -> usize {
        self.session.drafter().bytes()
    }

    /// Ends the request: what outlives it (the budget's calibration, a cross-request
    /// output) goes back to the drafter. Idempotent; dropping the session does it too.
    fn finish(&mut self) {
        self.session.finish();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&mut self, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.session.finish();
        false
    }
}

impl Session {
    /// The session's current tree into the caller's buffers (`step::write_tree`).
    #[allow(clippy::too_many_arguments)]
    fn write_tree(
        &self,
        tokens: PyReadwriteArray1<'_, i64>,
        parents: PyReadwriteArray1<'_, i64>,
        depths: PyReadwriteArray1<'_, i64>,
        positions: PyReadwriteArray1<'_, i64>,
        block: PyReadwriteArray1<'_, f32>,
        masked: f32,
        position_base: i64,
    ) -> PyResult<(usize, i64)> {
        let bufs = step::TreeBuffers {
            tokens,
            parents,
            depths,
            positions,
            block,
        };
        step::write_tree(self.session.tree(), bufs, masked, position_base)
    }
}

fn check_same_shape(a: [usize; 2], b: [usize; 2]) -> PyResult<()> {
    if a != b {
        return Err(to_py(recap_core::Error::invalid(
            "topk_probs",
            format!("the shape of topk_ids {a:?}"),
            format!("{b:?}"),
        )));
    }
    Ok(())
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Session>()?;
    m.add_class::<DraftTree>()?;
    Ok(())
}
