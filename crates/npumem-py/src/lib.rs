//! `npumem._native`: the PyO3 bindings of npumem-core. Conversions, GIL handling and error
//! mapping only; every rule lives in the core crate.

mod acl;
mod args;
mod buffer;
mod device;
mod dispatch;
mod errors;
mod export;
mod fastcall;
mod hostpool;
mod kernels;
mod plan;
mod shared;
mod tlb;
mod view;

use pyo3::prelude::*;

#[pymodule(gil_used = false)]
mod _native {
    use super::*;

    #[pymodule_export]
    use crate::device::PyDevice;

    #[pymodule_export]
    use crate::tlb::PyTlb;

    #[pymodule_export]
    use crate::acl::{AclAlloc, AclHostBlock, AclTables, ReentrantLock};

    #[pymodule_export]
    use crate::view::DeviceView;

    #[pymodule_export]
    use crate::hostpool::{HostBlock, PyHostPool};

    #[pymodule_export]
    use crate::plan::{
        plan_graph, plan_lower_bound, plan_offsets, plan_positional_bound, plan_schedulers, plan_strategies,
        plan_validate,
    };

    #[pymodule_export]
    use crate::device::cost_preset;

    #[pymodule_export]
    use crate::dispatch::_bind_methods;

    #[pymodule_export]
    use crate::kernels::{chase, gemm_tiled};

    /// Parses a size such as "32GiB", "64KiB" or 4096 into bytes.
    #[pyfunction]
    fn parse_size(text: crate::args::Size) -> u64 {
        text.0
    }

    /// Formats a byte count ("1.50 GiB").
    #[pyfunction]
    fn format_size(bytes: crate::args::Size<crate::args::name::bytes>) -> String {
        npumem_core::units::format_size(bytes.0)
    }

    /// `npumem_core::snapshot_pickle::check` of a snapshot pickle's bytes: None when admitted,
    /// else (whether the bytes end before the pickle does, why). The GIL is released: the bytes
    /// object is immutable and held for the call.
    #[pyfunction]
    fn scan_snapshot_pickle(py: Python<'_>, data: &[u8]) -> Option<(bool, String)> {
        py.detach(|| npumem_core::snapshot_pickle::check(data)).err().map(|r| (r.truncated, r.message))
    }

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("VA_WINDOW_START", npumem_core::vm::VA_WINDOW_START)?;
        m.add("VA_WINDOW_END", npumem_core::vm::VA_WINDOW_END)?;
        m.add("ACL_FREED_SITES", crate::acl::FREED_SITES)?;
        m.add("HOST_POOL_HANDLER_NAME", crate::hostpool::HANDLER_NAME)?;
        m.add("DeviceBuffer", crate::buffer::create_type(m.py())?)?;
        crate::device::fast::install(&m.py().get_type::<crate::device::PyDevice>())?;
        crate::acl::install(&m.py().get_type::<crate::acl::AclTables>())?;
        crate::hostpool::install_fast(&m.py().get_type::<crate::hostpool::PyHostPool>())?;
        Ok(())
    }
}
