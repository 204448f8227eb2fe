//! The library's configuration, read once from the environment at first use:
//! `NPUMEM_BACKEND` (`host`, the default, `sim`, or `acl` / `cuda`: AscendCL or the CUDA driver
//! loaded at run time, found through `NPUMEM_ACL_LIB` / `NPUMEM_CUDA_LIB` as in npumem-core),
//! `NPUMEM_ALLOCATOR` (`npumem`, the default, `pytorch`, `torch_npu`, `direct`),
//! `NPUMEM_ALLOC_CONF` (the `PYTORCH_NPU_ALLOC_CONF` grammar) and `NPUMEM_CAPACITY` (a size such
//! as `8GiB`; for the host backend the default is the memory available now, for the simulator
//! 32 GiB, for an accelerator its whole memory). An empty variable counts as unset.
//!
//! Invariant: a `Config` names a valid backend, allocator and non-zero capacity; the allocator
//! settings are checked when a device is built from it (the error then names the variable).

use npumem_core::backend::SimConfig;
use npumem_core::backend::host::default_capacity;
use npumem_core::units::{format_size, parse_size};
use npumem_core::{AclError, AllocatorKind, BackendKind, DeviceConfig, Result};

pub const BACKEND: &str = "NPUMEM_BACKEND";
pub const ALLOCATOR: &str = "NPUMEM_ALLOCATOR";
pub const ALLOC_CONF: &str = "NPUMEM_ALLOC_CONF";
pub const CAPACITY: &str = "NPUMEM_CAPACITY";

/// Prefixes an error about `value` with the variable it came from.
fn named<'a>(name: &'static str, value: &'a str) -> impl FnOnce(AclError) -> AclError + 'a {
    move |e| AclError::new(e.code, format!("{name}={value:?}: {}", e.message))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub backend: BackendKind,
    pub allocator: AllocatorKind,
    pub alloc_conf: String,
    /// Bytes each device may hold.
    pub capacity: u64,
}

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Config> {
        Self::from_lookup(|name| match std::env::var(name) {
            Ok(value) => Ok(Some(value)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(raw)) => {
                Err(AclError::invalid_param(format!("{name}={raw:?} is not valid UTF-8")))
            }
        })
    }

    /// Reads the configuration through `get` (the value of a variable, `None` when unset).
    pub fn from_lookup(get: impl Fn(&str) -> Result<Option<String>>) -> Result<Config> {
        let var = |name: &str| -> Result<Option<String>> {
            Ok(get(name)?.map(|v| v.trim().to_string()).filter(|v| !v.is_empty()))
        };
        let backend = match var(BACKEND)? {
            None => BackendKind::Host,
            Some(v) => BackendKind::parse(&v).map_err(named(BACKEND, &v))?,
        };
        let allocator = match var(ALLOCATOR)? {
            None => AllocatorKind::Npumem,
            Some(v) => AllocatorKind::parse(&v).map_err(named(ALLOCATOR, &v))?,
        };
        let capacity = match var(CAPACITY)? {
            None if backend == BackendKind::Host => default_capacity(),
            None if backend == BackendKind::Sim => SimConfig::default().capacity,
            // An accelerator's whole memory (its runtime is loaded to ask).
            None => backend.defaults(0).map_err(named(BACKEND, backend.name()))?.0,
            Some(v) => match parse_size(&v).map_err(named(CAPACITY, &v))? {
                0 => return Err(AclError::invalid_param(format!("{CAPACITY}={v:?}: the capacity must be above 0"))),
                bytes => bytes,
            },
        };
        Ok(Config { backend, allocator, alloc_conf: var(ALLOC_CONF)?.unwrap_or_default(), capacity })
    }

    /// The configuration of device `ordinal`; `normal_page` is the backend's own for a real
    /// backend.
    pub fn device_config(&self, normal_page: npumem_core::vm::PageSize, ordinal: i32) -> DeviceConfig {
        let sim = SimConfig { capacity: self.capacity, normal_page, ..SimConfig::default() };
        DeviceConfig {
            sim,
            backend: self.backend,
            ordinal,
            allocator: self.allocator,
            alloc_conf: self.alloc_conf.clone(),
            faults: false,
            va_slice: None,
        }
    }

    /// The settings as the environment would spell them (for error messages).
    pub fn describe(&self) -> String {
        let backend = self.backend.name();
        format!(
            "{BACKEND}={backend} {ALLOCATOR}={allocator} {ALLOC_CONF}={conf:?} {CAPACITY}={capacity}",
            allocator = match self.allocator {
                AllocatorKind::Npumem => "npumem",
                AllocatorKind::Direct => "direct",
                AllocatorKind::PyTorch => "pytorch",
                AllocatorKind::TorchNpu => "torch_npu",
            },
            conf = self.alloc_conf,
            capacity = format_size(self.capacity).replace(' ', ""),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use npumem_core::units::GIB;

    fn config(vars: &[(&str, &str)]) -> Result<Config> {
        Config::from_lookup(|name| Ok(vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())))
    }

    #[test]
    fn defaults_are_npumem_on_host_memory() {
        let c = config(&[]).unwrap();
        assert_eq!((c.backend, c.allocator, c.alloc_conf.as_str()), (BackendKind::Host, AllocatorKind::Npumem, ""));
        assert!(c.capacity >= 64 << 20);
        assert_eq!(config(&[(BACKEND, "sim")]).unwrap().capacity, SimConfig::default().capacity);
        assert_eq!(config(&[(BACKEND, " "), (CAPACITY, "")]).unwrap().backend, BackendKind::Host);
    }

    #[test]
    fn every_variable_is_read() {
        let c = config(&[
            (BACKEND, "sim"),
            (ALLOCATOR, "torch_npu"),
            (ALLOC_CONF, "max_split_size_mb:64"),
            (CAPACITY, "8GiB"),
        ])
        .unwrap();
        assert_eq!(c.backend, BackendKind::Sim);
        assert_eq!(c.allocator, AllocatorKind::TorchNpu);
        assert_eq!(c.alloc_conf, "max_split_size_mb:64");
        assert_eq!(c.capacity, 8 * GIB);
        assert_eq!(
            c.describe(),
            "NPUMEM_BACKEND=sim NPUMEM_ALLOCATOR=torch_npu NPUMEM_ALLOC_CONF=\"max_split_size_mb:64\" \
             NPUMEM_CAPACITY=8GiB"
        );
    }

    #[test]
    fn a_bad_value_names_its_variable() {
        for (vars, needle) in [
            (&[(BACKEND, "gpu")][..], "NPUMEM_BACKEND=\"gpu\": unknown backend"),
            (&[(ALLOCATOR, "jemalloc")][..], "NPUMEM_ALLOCATOR=\"jemalloc\": unknown allocator"),
            (&[(CAPACITY, "lots")][..], "NPUMEM_CAPACITY=\"lots\": cannot read"),
            (&[(CAPACITY, "0")][..], "NPUMEM_CAPACITY=\"0\": the capacity must be above 0"),
            (&[(CAPACITY, "99999999TiB")][..], "NPUMEM_CAPACITY=\"99999999TiB\""),
        ] {
            let e = config(vars).unwrap_err();
            assert_eq!(e.code.value(), 100_000);
            assert!(e.message.starts_with(needle), "{}", e.message);
        }
    }
}
