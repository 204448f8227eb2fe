//! Typed arguments: each newtype converts one Python argument (`FromPyObject`) with npumem's
//! checks, so a binding's signature shows what it takes.
//!
//! - A newtype's messages name its argument: the name is a type parameter (`Size<name::count>`
//!   says "count"), defaulting to the usual one (`Size` says "size", `Ptr` "ptr").
//! - A value of the wrong type is a `TypeError`; a value out of range an `InvalidParamError`
//!   (AscendCL 100000) that shows the value and what is accepted.
//! - A conversion does one extraction and no more on the accepted path: `malloc`, `free` and
//!   `buffer` are hot.
//! - Arguments whose check depends on another argument (a pool attribute's value, a cost
//!   field's value, a TLB override) stay `&Bound<PyAny>` and use the functions here by name.

use std::marker::PhantomData;

use npumem_core::acl::MemPoolAttr;
use npumem_core::{AclError, MemAttr, Policy, units::parse_size};
use numpy::ndarray::Dimension;
use numpy::{Element, PyArray, PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyString};

use crate::errors::to_py;

/// An argument's name, as a type (see `name`).
pub trait ArgName {
    const NAME: &'static str;
}

/// The argument names the newtypes take, one marker type each.
#[allow(non_camel_case_types)]
pub mod name {
    macro_rules! names {
        ($($n:ident)*) => {
            $(
                pub struct $n;
                impl super::ArgName for $n {
                    const NAME: &'static str = stringify!($n);
                }
            )*
        };
    }
    names! {
        a b c addr alignment bytes capacity count device_id dst dst_max duration end event expect
        flags giant_frames handle max_entries min_block n nbytes next normal_page page_size
        offset physical_alloc map unmap ptr reads size src start stream va value writes
    }
}

macro_rules! newtypes {
    ($($(#[$doc:meta])* $ty:ident<$default:ident>($inner:ty) = $parse:path;)*) => {$(
        $(#[$doc])*
        pub struct $ty<N = name::$default>(pub $inner, PhantomData<N>);

        impl<N: ArgName> FromPyObject<'_, '_> for $ty<N> {
            type Error = PyErr;

            #[inline]
            fn extract(obj: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
                $parse(&obj, N::NAME).map(|v| $ty(v, PhantomData))
            }
        }
    )*};
}

newtypes! {
    /// A byte count: a non-negative int below 2**64, or a size string such as "2MiB".
    Size<size>(u64) = size_arg;
    /// A device or host address: a non-negative int below 2**64.
    Ptr<ptr>(u64) = uint_arg;
    /// A stream handle (0 is the default stream).
    Stream<stream>(u64) = uint_arg;
    /// An event handle.
    Event<event>(u64) = uint_arg;
    /// A handle, count or flags word: a non-negative int below 2**64.
    Uint<handle>(u64) = uint_arg;
    /// A C `int32_t` (a fill value).
    Int32<value>(i32) = i32_arg;
    /// A real number: a float, an int or anything with `__float__`.
    Real<duration>(f64) = float_arg;
    /// A sequence of device pointers (kernel arguments).
    Pointers<ptr>(Vec<u64>) = pointers_arg;
}

macro_rules! acl_enum_arg {
    ($(#[$doc:meta])* $ty:ident($enum:ty), $what:literal) => {
        $(#[$doc])*
        pub struct $ty(pub $enum);

        impl FromPyObject<'_, '_> for $ty {
            type Error = PyErr;

            #[inline]
            fn extract(obj: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
                let raw = enum_arg(&obj, $what)?;
                <$enum>::from_raw(raw).map($ty).map_err(|e| to_py(obj.py(), e))
            }
        }
    };
}

acl_enum_arg!(
    /// An allocation policy (`Policy`, or its int value).
    PolicyArg(Policy), "policy"
);
acl_enum_arg!(
    /// A memory attribute (`MemAttr`, or its int value).
    MemAttrArg(MemAttr), "attr"
);
acl_enum_arg!(
    /// A stream-ordered pool attribute (`MemPoolAttr`, or its int value).
    PoolAttrArg(MemPoolAttr), "attr"
);

/// A `MemcpyKind` as its int value; the core checks which kinds a copy accepts.
pub struct CopyKind(pub u32);

impl FromPyObject<'_, '_> for CopyKind {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        enum_arg(&obj, "kind").map(CopyKind)
    }
}

/// An allocation's tag: a str.
pub struct Tag(pub String);

impl FromPyObject<'_, '_> for Tag {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        match obj.cast::<PyString>() {
            Ok(t) => Ok(Tag(t.to_string())),
            Err(_) => {
                let got = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
                Err(PyTypeError::new_err(format!("tag must be a str, got {got}")))
            }
        }
    }
}

/// A C-contiguous buffer of plain data (bytes, bytearray, memoryview, numpy array), writable
/// when `WRITABLE`; the export is held while this lives.
pub struct Contiguous<const WRITABLE: bool>(pub PyUntypedBuffer);

/// A buffer the device reads from.
pub type Source = Contiguous<false>;
/// A buffer the device writes into.
pub type Sink = Contiguous<true>;

impl<const WRITABLE: bool> FromPyObject<'_, '_> for Contiguous<WRITABLE> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        let invalid = |message: &str| to_py(obj.py(), AclError::invalid_param(message));
        let buf = PyUntypedBuffer::get(&obj)?;
        if buf.format().to_bytes().contains(&b'O') {
            return Err(invalid(
                "the buffer holds Python object pointers, not data; convert it to a numeric dtype first",
            ));
        }
        if !buf.is_c_contiguous() {
            return Err(invalid("the buffer is not C-contiguous; pass numpy.ascontiguousarray(x)"));
        }
        if WRITABLE && buf.readonly() {
            return Err(invalid("the buffer is read-only; pass a writable one"));
        }
        Ok(Contiguous(buf))
    }
}

/// An array shape: an int or a sequence of ints (their range is checked where the array is made).
pub struct Shape(pub Vec<isize>);

impl FromPyObject<'_, '_> for Shape {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        match obj.extract::<isize>() {
            Ok(d) => Ok(Shape(vec![d])),
            Err(_) => obj.extract().map(Shape).map_err(|_| {
                let shape = &*obj;
                to_py(obj.py(), AclError::invalid_param(format!("shape {shape} must be an int or a sequence of ints")))
            }),
        }
    }
}

/// A NumPy dtype: anything `np.dtype` takes but None, which an `Option<DType>` argument reads as
/// absent (float64 where NumPy's Python API defaults).
pub struct DType<'py>(pub Bound<'py, PyArrayDescr>);

impl<'py> FromPyObject<'_, 'py> for DType<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        // NumPy's own converter (what `np.dtype(obj)` runs), without a Python-level call.
        match obj.cast::<PyArrayDescr>() {
            Ok(d) => Ok(DType(d.to_owned())),
            Err(_) => PyArrayDescr::new(py, &*obj).map(DType).map_err(|e| {
                let dtype = &*obj;
                to_py(py, AclError::invalid_param(format!("dtype {dtype} is not a NumPy dtype ({e})")))
            }),
        }
    }
}

/// A C-contiguous numpy array of `T` with `D`'s number of dimensions.
pub struct Array<'py, T, D, N>(pub Bound<'py, PyArray<T, D>>, PhantomData<N>);

impl<'py, T: Element, D: Dimension, N: ArgName> FromPyObject<'_, 'py> for Array<'py, T, D, N> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        let (py, name) = (obj.py(), N::NAME);
        let ndim = D::NDIM.expect("a fixed number of dimensions");
        let expected = format!("a C-contiguous {ndim}-D numpy array of {}", numpy::dtype::<T>(py));
        let Ok(untyped) = obj.cast::<PyUntypedArray>() else {
            return Err(PyTypeError::new_err(format!("{name} must be {expected}, got {}", obj.get_type().name()?)));
        };
        if untyped.ndim() != ndim || !untyped.dtype().is_equiv_to(&numpy::dtype::<T>(py)) {
            return Err(PyTypeError::new_err(format!(
                "{name} must be {expected}, got a {}-D array of {} with shape {:?}",
                untyped.ndim(),
                untyped.dtype(),
                untyped.shape()
            )));
        }
        if !untyped.is_c_contiguous() {
            return Err(to_py(
                py,
                AclError::invalid_param(format!(
                    "{name} is not C-contiguous (shape {:?}); pass numpy.ascontiguousarray({name})",
                    untyped.shape()
                )),
            ));
        }
        Ok(Array(obj.cast::<PyArray<T, D>>()?.to_owned(), PhantomData))
    }
}

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
fn i32_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i32> {
    match obj.extract::<i32>() {
        Ok(v) => Ok(v),
        Err(_) if obj.is_instance_of::<PyInt>() => Err(to_py(
            obj.py(),
            AclError::invalid_param(format!("{what} must be a 32-bit integer (int32_t), got {obj}")),
        )),
        Err(_) => Err(PyTypeError::new_err(format!("{what} must be an int, got {}", obj.get_type().name()?))),
    }
}

/// An enum value or any int (IntEnum members are ints).
fn enum_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u32> {
    match obj.extract::<u32>() {
        Ok(v) => Ok(v),
        Err(_) => Err(to_py(obj.py(), out_of_range(obj, what)?)),
    }
}

/// A real-number argument (a float, an int or anything with `__float__`); an int too large for
/// a float is out of range (`InvalidParamError`), anything else a `TypeError`, both naming `what`.
pub fn float_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    match obj.extract::<f64>() {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Err(to_py(
            obj.py(),
            AclError::invalid_param(format!("{what} = {obj} is out of range: too large for a float")),
        )),
        Err(_) => Err(PyTypeError::new_err(format!("{what} must be a number, got {}", obj.get_type().name()?))),
    }
}

/// A sequence of device pointers, each a non-negative int below 2**64 (`what[i]` in messages).
fn pointers_arg(seq: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    if seq.is_instance_of::<PyString>() || seq.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(format!("{what} must be a sequence of pointers (ints)")));
    }
    seq.try_iter()
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "{what} must be a sequence of pointers (ints), got {}",
                seq.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))
        })?
        .enumerate()
        .map(|(i, p)| uint_arg(&p?, &format!("{what}[{i}]")))
        .collect()
}

fn out_of_range(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<AclError> {
    if obj.is_instance_of::<PyInt>() {
        Ok(AclError::invalid_param(format!("{what} must be an integer from 0 to 2**64-1, got {obj}")))
    } else {
        Err(PyTypeError::new_err(format!("{what} must be an int, got {}", obj.get_type().name()?)))
    }
}

/// The elements of a 1-D numpy array, which must be C-contiguous.
pub fn array_slice<'a, 'py, T: numpy::Element>(array: &'a numpy::PyReadonlyArray1<'py, T>) -> PyResult<&'a [T]> {
    array
        .as_slice()
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("pass a C-contiguous 1-D array ({e})")))
}
