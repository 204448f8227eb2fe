//! Argument conversions: sizes and pointers from Python ints (or size strings), enums from ints.

use npumem_core::{AclError, units::parse_size};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyString};

use crate::errors::to_py;

/// A byte count: a non-negative int below 2**64, or a size string such as "2MiB".
pub fn size_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if let Ok(v) = obj.extract::<u64>() {
        return Ok(v);
    }
    let py = obj.py();
    if let Ok(s) = obj.cast::<PyString>() {
        return parse_size(&s.to_cow()?).map_err(|e| to_py(py, e));
    }
    Err(to_py(py, out_of_range(obj, what)?))
}

/// An address, handle or count: a non-negative int below 2**64.
pub fn uint_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    match obj.extract::<u64>() {
        Ok(v) => Ok(v),
        Err(_) => Err(to_py(obj.py(), out_of_range(obj, what)?)),
    }
}

/// A C `int32_t` argument.
pub fn i32_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i32> {
    match obj.extract::<i32>() {
        Ok(v) => Ok(v),
        Err(_) if obj.is_instance_of::<PyInt>() => Err(to_py(
            obj.py(),
            AclError::invalid_param(format!("{what} must be a 32-bit integer (int32_t), got {obj}")),
        )),
        Err(_) => Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "{what} must be an int, got {}",
            obj.get_type().name()?
        ))),
    }
}

/// An enum value or any int (IntEnum members are ints).
pub fn enum_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u32> {
    match obj.extract::<u32>() {
        Ok(v) => Ok(v),
        Err(_) => Err(to_py(obj.py(), out_of_range(obj, what)?)),
    }
}

fn out_of_range(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<AclError> {
    if obj.is_instance_of::<PyInt>() {
        Ok(AclError::invalid_param(format!("{what} must be an integer from 0 to 2**64-1, got {obj}")))
    } else {
        Err(pyo3::exceptions::PyTypeError::new_err(format!("{what} must be an int, got {}", obj.get_type().name()?)))
    }
}

/// The elements of a 1-D numpy array, which must be C-contiguous.
pub fn array_slice<'a, 'py, T: numpy::Element>(array: &'a numpy::PyReadonlyArray1<'py, T>) -> PyResult<&'a [T]> {
    array
        .as_slice()
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("pass a C-contiguous 1-D array ({e})")))
}
