//! `transpose_into(src, dst, threads)`: the blocked transpose behind the CPU linear layout's
//! weight copies (`recap.linear_layout`). The caller passes the weights' bits as unsigned
//! integers of the element's size, so one kernel serves every dtype.
//!
//! `skinny_matmul(w, x, y, threads)`: the layout's "skinny" product, y = x W^T for the few
//! rows of a verification pass (float32).

use numpy::{PyReadonlyArray2, PyReadwriteArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use recap_core::Error;

use crate::arrays::describe;
use crate::errors::to_py;

fn run<T: numpy::Element + Copy + Send + Sync>(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    dst: &Bound<'_, PyAny>,
    threads: usize,
) -> Option<PyResult<()>> {
    let src = src.extract::<PyReadonlyArray2<'_, T>>().ok()?;
    let mut dst = match dst.extract::<PyReadwriteArray2<'_, T>>() {
        Ok(d) => d,
        Err(_) => {
            return Some(Err(to_py(Error::wrong_type(
                "dst",
                "a writable 2-D array of the same dtype as src",
                describe(dst),
            ))))
        }
    };
    let [rows, cols] = [src.shape()[0], src.shape()[1]];
    if dst.shape() != [cols, rows] {
        return Some(Err(to_py(Error::shape(
            "dst",
            format!("[{cols}, {rows}] (src transposed)"),
            format!("{:?}", dst.shape()),
        ))));
    }
    // as_slice also takes Fortran order, whose bits are laid out transposed already.
    let c_order = src.is_c_contiguous() && dst.is_c_contiguous();
    let (true, Ok(s), Ok(d)) = (c_order, src.as_slice(), dst.as_slice_mut()) else {
        return Some(Err(to_py(Error::invalid(
            "src, dst",
            "C-contiguous arrays",
            "a strided view",
        ))));
    };
    Some(
        py.detach(|| recap_core::transpose_into(s, rows, cols, d, threads))
            .map_err(to_py),
    )
}

/// Writes src's transpose into dst: src [rows, cols], dst [cols, rows], both C-contiguous
/// numpy arrays of uint16, uint32 or uint64 (a weight's bits), on up to `threads` threads.
#[pyfunction]
#[pyo3(signature = (src, dst, threads = 1))]
fn transpose_into(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    dst: &Bound<'_, PyAny>,
    threads: usize,
) -> PyResult<()> {
    run::<u32>(py, src, dst, threads)
        .or_else(|| run::<u16>(py, src, dst, threads))
        .or_else(|| run::<u64>(py, src, dst, threads))
        .unwrap_or_else(|| {
            Err(to_py(Error::wrong_type(
                "src",
                "a 2-D numpy array of uint16, uint32 or uint64",
                describe(src),
            )))
        })
}

/// Writes y = x w^T: w [rows, cols], x [n, cols], y [n, rows], C-contiguous float32 numpy
/// arrays, with the weight rows split over up to `threads` threads (the GIL released).
#[pyfunction]
#[pyo3(signature = (w, x, y, threads = 1))]
fn skinny_matmul(
    py: Python<'_>,
    w: &Bound<'_, PyAny>,
    x: &Bound<'_, PyAny>,
    y: &Bound<'_, PyAny>,
    threads: usize,
) -> PyResult<()> {
    let expected = "a C-contiguous 2-D float32 numpy array";
    let w = w
        .extract::<PyReadonlyArray2<'_, f32>>()
        .map_err(|_| to_py(Error::wrong_type("w", expected, describe(w))))?;
    let x = x
        .extract::<PyReadonlyArray2<'_, f32>>()
        .map_err(|_| to_py(Error::wrong_type("x", expected, describe(x))))?;
    let mut y = y.extract::<PyReadwriteArray2<'_, f32>>().map_err(|_| {
        to_py(Error::wrong_type(
            "y",
            "a writable C-contiguous 2-D float32 numpy array",
            describe(y),
        ))
    })?;
    let [rows, cols] = [w.shape()[0], w.shape()[1]];
    let n = x.shape()[0];
    if x.shape()[1] != cols {
        return Err(to_py(Error::shape(
            "x",
            format!("[n, {cols}] (w's columns)"),
            format!("{:?}", x.shape()),
        )));
    }
    if y.shape() != [n, rows] {
        return Err(to_py(Error::shape(
            "y",
            format!("[{n}, {rows}]"),
            format!("{:?}", y.shape()),
        )));
    }
    let c_order = w.is_c_contiguous() && x.is_c_contiguous() && y.is_c_contiguous();
    let (true, Ok(ws), Ok(xs), Ok(ys)) = (c_order, w.as_slice(), x.as_slice(), y.as_slice_mut())
    else {
        return Err(to_py(Error::invalid(
            "w, x, y",
            "C-contiguous arrays",
            "a strided view",
        )));
    };
    py.detach(|| recap_core::skinny_matmul(ws, rows, cols, xs, n, ys, threads))
        .map_err(to_py)
}

/// Runs `skinny_matmul`'s threads on the process's OpenMP runtime (torch's) from now on:
/// the addresses of its `GOMP_parallel`, `omp_get_thread_num` and `omp_get_num_threads`, as
/// `ctypes` resolves them. Returns whether it now does. Internal: wrong addresses crash.
#[pyfunction]
fn _use_openmp(parallel: usize, thread_num: usize, num_threads: usize) -> bool {
    // SAFETY: the caller (recap.verify.linear_layout) resolves the addresses from the loaded
    // runtime, which stays loaded as long as torch does.
    unsafe { recap_core::use_openmp(parallel, thread_num, num_threads) };
    recap_core::uses_openmp()
}

/// Whether `skinny_matmul` runs its vectorised kernel on this CPU (else a portable loop).
#[pyfunction]
fn skinny_is_vectorised() -> bool {
    recap_core::skinny_is_vectorised()
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(transpose_into, m)?)?;
    m.add_function(wrap_pyfunction!(skinny_is_vectorised, m)?)?;
    m.add_function(wrap_pyfunction!(_use_openmp, m)?)?;
    m.add_function(wrap_pyfunction!(skinny_matmul, m)?)
}
