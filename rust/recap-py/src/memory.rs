//! `PersistentMemory` (the shared U / Token Recycling rows) and `Calibration` (where the
//! automatic budget's learned state lives between requests, per drafter or per scope).

use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use recap_core::SharedMemory;
use recap_core::SnapshotExpect as Expect;

use crate::errors::to_py;

type IdsArray<'py> = Bound<'py, PyArray1<i64>>;

/// The persistent memory U: one top-K row per token, kept across requests, shareable by
/// several drafters (and threads). Bounded by `capacity` rows with CLOCK eviction.
#[pyclass(frozen, module = "recap._core")]
pub struct PersistentMemory {
    pub(crate) inner: SharedMemory,
}

#[pymethods]
impl PersistentMemory {
    #[new]
    #[pyo3(signature = (vocab_size, *, k = 8, capacity = SharedMemory::DEFAULT_CAPACITY))]
    pub(crate) fn new(vocab_size: usize, k: usize, capacity: usize) -> PyResult<Self> {
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
        self.inner.read().k()
    }
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.read().capacity()
    }
    /// Rows evicted so far.
    #[getter]
    fn evictions(&self) -> u64 {
        self.inner.read().evictions()
    }
    fn __len__(&self) -> usize {
        self.inner.read().len()
    }
    /// Heap bytes held.
    fn bytes(&self) -> usize {
        self.inner.bytes()
    }
    fn clear(&self) {
        self.inner.write().clear();
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
        let h = recap_core::snapshot_header(&path).map_err(to_py)?;
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
        let table = self.inner.read();
        let r = table.get(token)?;
        let ids: Vec<i64> = r.ids.iter().map(|&x| x as i64).collect();
        Some((ids.into_pyarray(py), r.probs.to_vec().into_pyarray(py)))
    }
}

/// The automatic budget's learned state (acceptance table, online cost curve) for the
/// sessions opened with it: `Drafter.session(calibration=...)`. Empty until a session with
/// a budget finishes or the drafter's own state is copied in.
#[pyclass(frozen, module = "recap._core")]
#[derive(Default)]
pub struct Calibration {
    pub(crate) inner: recap_core::Calibration,
}

#[pymethods]
impl Calibration {
    #[new]
    fn new() -> Self {
        Calibration::default()
    }
    /// Whether it holds a budget state yet.
    #[getter]
    fn is_set(&self) -> bool {
        self.inner.is_set()
    }
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PersistentMemory>()?;
    m.add_class::<Calibration>()?;
    Ok(())
}
