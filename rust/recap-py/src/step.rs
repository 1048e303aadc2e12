//! The lean step boundary: one call writes the next tree into buffers the decoder allocated
//! once, one call takes the verifier's packed array as it comes back from the device.

use numpy::{PyReadonlyArray2, PyReadwriteArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use recap_core::{DraftSession, DraftTree, Error, TopKRows};

use crate::errors::to_py;

/// The caller's buffers for one tree: tokens, parents, depths and position ids [>= T]
/// (int64) and the additive mask block [>= T*T] (float32).
pub struct TreeBuffers<'py> {
    pub tokens: PyReadwriteArray1<'py, i64>,
    pub parents: PyReadwriteArray1<'py, i64>,
    pub depths: PyReadwriteArray1<'py, i64>,
    pub positions: PyReadwriteArray1<'py, i64>,
    pub block: PyReadwriteArray1<'py, f32>,
}

/// Writes `tree` into the buffers: position ids are `position_base + depth`; the block is
/// row-major, 0 where row i may attend to column j (its ancestors and itself), `masked`
/// elsewhere. Returns (T, deepest depth).
pub fn write_tree(
    tree: &DraftTree,
    bufs: TreeBuffers<'_>,
    masked: f32,
    position_base: i64,
) -> PyResult<(usize, i64)> {
    let TreeBuffers {
        mut tokens,
        mut parents,
        mut depths,
        mut positions,
        mut block,
    } = bufs;
    let n = tree.len();
    for (name, have, need) in [
        ("tokens", tokens.len(), n),
        ("parents", parents.len(), n),
        ("depths", depths.len(), n),
        ("positions", positions.len(), n),
        ("block", block.len(), n * n),
    ] {
        if have < need {
            return Err(to_py(Error::invalid(
                name,
                format!("a buffer of at least {need} entries for a {n}-node tree"),
                format!("{have}"),
            )));
        }
    }
    fill(
        "tokens",
        &mut tokens,
        tree.tokens.iter().map(|&v| i64::from(v)),
    )?;
    fill(
        "parents",
        &mut parents,
        tree.parents.iter().map(|&v| i64::from(v)),
    )?;
    fill(
        "depths",
        &mut depths,
        tree.depths.iter().map(|&v| i64::from(v)),
    )?;
    fill(
        "positions",
        &mut positions,
        tree.depths.iter().map(|&v| position_base + i64::from(v)),
    )?;
    let b = block.as_slice_mut().map_err(|_| {
        to_py(Error::wrong_type(
            "block",
            "a contiguous writable buffer",
            "a non-contiguous or read-only array",
        ))
    })?;
    tree.write_additive_mask(&mut b[..n * n], masked);
    let deepest = tree.depths.iter().copied().max().unwrap_or(0);
    Ok((n, i64::from(deepest)))
}

fn fill(
    name: &'static str,
    buf: &mut PyReadwriteArray1<'_, i64>,
    values: impl Iterator<Item = i64>,
) -> PyResult<()> {
    let out = buf.as_slice_mut().map_err(|_| {
        to_py(Error::wrong_type(
            name,
            "a contiguous writable buffer",
            "a non-contiguous or read-only array",
        ))
    })?;
    for (dst, v) in out.iter_mut().zip(values) {
        *dst = v;
    }
    Ok(())
}

/// The verifier rows of one step, parsed: kept by the session and reused, so a step's
/// observe allocates nothing for them.
#[derive(Default)]
pub struct ObserveScratch {
    pred: Vec<u32>,
    ids: Vec<u32>,
    probs: Vec<f32>,
}

impl ObserveScratch {
    /// Parses the packed rows [T, 1 + 2k] in place (any strides) into the scratch; returns T.
    fn parse<T: Copy + Into<f64>>(
        &mut self,
        a: numpy::ndarray::ArrayView2<'_, T>,
        k: usize,
    ) -> PyResult<usize> {
        let (rows, width) = a.dim();
        if width != 1 + 2 * k {
            return Err(to_py(Error::invalid(
                "packed",
                format!("{} columns (argmax, {k} ids, {k} probabilities)", 1 + 2 * k),
                format!("{width}"),
            )));
        }
        let id = |v: f64| -> PyResult<u32> {
            if v.fract() == 0.0 && (0.0..f64::from(u32::MAX)).contains(&v) {
                Ok(v as u32)
            } else {
                Err(to_py(Error::invalid(
                    "packed",
                    "token ids that are whole numbers >= 0",
                    v,
                )))
            }
        };
        self.pred.clear();
        self.ids.clear();
        self.probs.clear();
        for row in a.rows() {
            self.pred.push(id(row[0].into())?);
            for c in 1..1 + k {
                self.ids.push(id(row[c].into())?);
            }
            for c in 1 + k..1 + 2 * k {
                self.probs.push(row[c].into() as f32);
            }
        }
        Ok(rows)
    }
}

/// Accepts the tree against the packed verifier output [T, 1 + 2k] (argmax, top-k ids, top-k
/// probabilities per node, float32 or float64), read where it lies; returns (path, committed
/// tokens).
pub fn observe_packed(
    session: &mut DraftSession,
    scratch: &mut ObserveScratch,
    py: Python<'_>,
    packed: &Bound<'_, PyAny>,
    k: usize,
) -> PyResult<(Vec<i64>, Vec<i64>)> {
    let rows = if let Ok(a) = packed.extract::<PyReadonlyArray2<'_, f32>>() {
        scratch.parse(a.as_array(), k)?
    } else if let Ok(a) = packed.extract::<PyReadonlyArray2<'_, f64>>() {
        scratch.parse(a.as_array(), k)?
    } else {
        return Err(to_py(Error::wrong_type(
            "packed",
            "a 2-D float32 or float64 array [nodes, 1 + 2k]",
            crate::arrays::describe(packed),
        )));
    };
    let vocab = session.vocab_size();
    let ObserveScratch { pred, ids, probs } = scratch;
    py.detach(|| {
        let rows = TopKRows::new(ids, probs, k, rows, vocab)?;
        let acc = session.observe(pred, &rows)?;
        let committed = acc
            .committed_tokens(session.tree())
            .iter()
            .map(|&t| i64::from(t))
            .collect();
        Ok((acc.path.iter().map(|&i| i as i64).collect(), committed))
    })
    .map_err(to_py)
}
