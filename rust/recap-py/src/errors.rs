//! The one mapping from core errors to Python exceptions: every error the native module
//! raises is a `recap_core::Error` first.

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::PyErr;
use recap_core::Error;

pub fn to_py(e: Error) -> PyErr {
    match e {
        Error::InvalidState(_) => PyRuntimeError::new_err(e.to_string()),
        Error::WrongType { .. } => PyTypeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}
