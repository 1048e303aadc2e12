//! Extraction of token ids and probabilities from numpy arrays (or sequences), with
//! messages that name the argument, the expected dtype/shape and what was given.

use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use recap_core::Error;

use crate::errors::to_py;
use pyo3::prelude::*;

pub fn describe(obj: &Bound<'_, PyAny>) -> String {
    match (obj.getattr("dtype"), obj.getattr("shape")) {
        (Ok(d), Ok(s)) => format!("an array of dtype {} and shape {}", d, s),
        _ => format!(
            "an object of type {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ),
    }
}

fn to_ids(name: &'static str, vals: impl Iterator<Item = i64>) -> PyResult<Vec<u32>> {
    vals.map(|v| {
        u32::try_from(v).map_err(|_| {
            to_py(Error::invalid(
                name,
                "token ids that must be >= 0 and < 2**32",
                v,
            ))
        })
    })
    .collect()
}

/// A 1-D integer array (int64, int32, uint32) or a sequence of ints.
pub fn ids_1d(name: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if let Ok(a) = obj.extract::<PyReadonlyArray1<'_, i64>>() {
        return to_ids(name, a.as_array().iter().copied());
    }
    if let Ok(a) = obj.extract::<PyReadonlyArray1<'_, i32>>() {
        return to_ids(name, a.as_array().iter().map(|&v| v as i64));
    }
    if let Ok(a) = obj.extract::<PyReadonlyArray1<'_, u32>>() {
        return Ok(a.as_array().iter().copied().collect());
    }
    if obj.hasattr("dtype")? {
        return Err(to_py(Error::wrong_type(
            name,
            "a 1-D integer array (int64, int32 or uint32)",
            describe(obj),
        )));
    }
    match obj.extract::<Vec<i64>>() {
        Ok(v) => to_ids(name, v.into_iter()),
        Err(_) => Err(to_py(Error::wrong_type(
            name,
            "a 1-D integer array or a sequence of ints",
            describe(obj),
        ))),
    }
}

/// A 2-D integer array [rows, k]; returns the flat row-major ids and the shape.
pub fn ids_2d(name: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<(Vec<u32>, [usize; 2])> {
    if let Ok(a) = obj.extract::<PyReadonlyArray2<'_, i64>>() {
        let s = a.shape();
        return Ok((to_ids(name, a.as_array().iter().copied())?, [s[0], s[1]]));
    }
    if let Ok(a) = obj.extract::<PyReadonlyArray2<'_, i32>>() {
        let s = a.shape();
        return Ok((
            to_ids(name, a.as_array().iter().map(|&v| v as i64))?,
            [s[0], s[1]],
        ));
    }
    Err(to_py(Error::wrong_type(
        name,
        "a 2-D numpy array of int64 or int32 shaped [rows, k]",
        describe(obj),
    )))
}

/// A 2-D float array [rows, k] (float32 or float64).
pub fn probs_2d(name: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<(Vec<f32>, [usize; 2])> {
    if let Ok(a) = obj.extract::<PyReadonlyArray2<'_, f32>>() {
        let s = a.shape();
        return Ok((a.as_array().iter().copied().collect(), [s[0], s[1]]));
    }
    if let Ok(a) = obj.extract::<PyReadonlyArray2<'_, f64>>() {
        let s = a.shape();
        return Ok((
            a.as_array().iter().map(|&v| v as f32).collect(),
            [s[0], s[1]],
        ));
    }
    Err(to_py(Error::wrong_type(
        name,
        "a 2-D numpy array of float32 or float64 shaped [rows, k]",
        describe(obj),
    )))
}
