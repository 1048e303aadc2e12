//! `BatchWidth`: the automatic budget of a batch (one tree width per step from every row's
//! ranked gains), shared by the decoder's batched requests.

use std::sync::{Mutex, MutexGuard};

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use crate::errors::to_py;

/// One tree width per batched step: argmax_T sum_b (1 + g_b(T - 1)) / c_B(T), c_B from the
/// measured curve at B x T tokens, corrected online per batch size and width.
#[pyclass(frozen, module = "recap._core")]
pub struct BatchWidth {
    inner: Mutex<recap_core::BatchWidth>,
}

impl BatchWidth {
    fn inner(&self) -> MutexGuard<'_, recap_core::BatchWidth> {
        // A panic cannot leave the controller half-updated (each method is one assignment).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl BatchWidth {
    /// `points` (rising token counts from 1) and `seconds`: the measured cost curve;
    /// `max_width`: the widest tree a row drafts, root included.
    #[new]
    fn new(points: Vec<f64>, seconds: Vec<f64>, max_width: usize) -> PyResult<Self> {
        let inner = recap_core::BatchWidth::new(points, seconds, max_width).map_err(to_py)?;
        Ok(BatchWidth {
            inner: Mutex::new(inner),
        })
    }

    /// The step's width from each row's ranked gains (`Session.propose_ranked`, float32).
    fn width(&self, py: Python<'_>, gains: Vec<PyReadonlyArray1<'_, f32>>) -> PyResult<usize> {
        let rows: Vec<Vec<f32>> = gains.iter().map(|g| g.as_array().to_vec()).collect();
        let views: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        Ok(py.detach(|| self.inner().width(&views)))
    }

    /// A pass over `rows` rows of `width` tokens took `seconds`.
    fn observe(&self, rows: usize, width: usize, seconds: f64) {
        self.inner().observe(rows, width, seconds)
    }

    /// c_B(T) for T = 1 .. max_width at `rows` rows.
    fn costs<'py>(&self, py: Python<'py>, rows: usize) -> Bound<'py, PyArray1<f64>> {
        self.inner().costs(rows).into_pyarray(py)
    }

    /// The measured curve at `tokens` total tokens per pass (linear beyond its last point).
    fn prior(&self, tokens: f64) -> f64 {
        self.inner().prior(tokens)
    }

    #[getter]
    fn last_width(&self) -> usize {
        self.inner().last_width()
    }

    #[getter]
    fn max_width(&self) -> usize {
        self.inner().max_width()
    }

    fn __repr__(&self) -> String {
        format!("BatchWidth(max_width={})", self.inner().max_width())
    }
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BatchWidth>()
}
