//! Building a device: the backend and allocator families, the settings they take, and the
//! factory (`Device::new`, `Device::with_parts`).
//!
//! Rules:
//! - The family names `parse` takes are the public ones; an unknown name's error lists them.
//! - `Device::new` opens the backend, then builds the allocator for the backend's capacity.
//! - A setting the chosen backend cannot honour (`va_slice` off the simulator, `giant_frames`
//!   on a real backend, a `normal_page` other than the backend's) is an error, never ignored.

use super::*;

/// Which allocator family a device uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocatorKind {
    /// npumem's VMM pool (the default).
    Npumem,
    /// No cache: every malloc maps fresh frames, every free unmaps them.
    Direct,
    /// PyTorch's caching allocator rules.
    PyTorch,
    /// torch_npu's caching allocator rules.
    TorchNpu,
}

impl AllocatorKind {
    pub const NAMES: &'static str = "\"npumem\", \"direct\", \"pytorch\", \"torch_npu\"";

    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "npumem" => Ok(AllocatorKind::Npumem),
            "direct" => Ok(AllocatorKind::Direct),
            "pytorch" => Ok(AllocatorKind::PyTorch),
            "torch_npu" => Ok(AllocatorKind::TorchNpu),
            other => Err(AclError::invalid_param(format!("unknown allocator {other:?}; available: {}", Self::NAMES))),
        }
    }

    /// Builds the allocator, tuned by `alloc_conf` (PYTORCH_NPU_ALLOC_CONF grammar).
    fn build(self, alloc_conf: &str, capacity: u64) -> Result<Box<dyn Allocator>> {
        let family = match self {
            AllocatorKind::Npumem => {
                return Ok(Box::new(VmmAllocator::new(VmmConfig::parse(alloc_conf)?, capacity)));
            }
            AllocatorKind::Direct if alloc_conf.trim().is_empty() => return Ok(Box::new(DirectAllocator::new())),
            AllocatorKind::Direct => {
                return Err(AclError::invalid_param(
                    "the direct allocator has no settings; pass alloc_conf only with a caching allocator",
                ));
            }
            AllocatorKind::PyTorch => Family::PyTorch,
            AllocatorKind::TorchNpu => Family::TorchNpu,
        };
        Ok(Box::new(CachingAllocator::new(CachingConfig::parse(family, alloc_conf)?, capacity)))
    }
}

/// The memory a device's allocators run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The simulated device (frames, page table and bytes in the simulator).
    Sim,
    /// Real host memory through the VMM calls (`HostBackend`): pointers can be dereferenced.
    Host,
    /// AscendCL's VMM calls, the library loaded at run time (`AclBackend`).
    Acl,
    /// The CUDA driver's VMM calls, the library loaded at run time (`CudaBackend`).
    Cuda,
}

impl BackendKind {
    pub const NAMES: &'static str = "\"sim\" (the simulated device), \"host\" (real host memory), \"acl\" (AscendCL, \
                                     loaded at run time), \"cuda\" (the CUDA driver, loaded at run time)";

    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "sim" => Ok(BackendKind::Sim),
            "host" => Ok(BackendKind::Host),
            "acl" => Ok(BackendKind::Acl),
            "cuda" => Ok(BackendKind::Cuda),
            other => Err(AclError::invalid_param(format!("unknown backend {other:?}; available: {}", Self::NAMES))),
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Sim => "sim",
            BackendKind::Host => "host",
            BackendKind::Acl => "acl",
            BackendKind::Cuda => "cuda",
        }
    }

    /// The capacity and normal page of a device of this kind (on the runtime's device
    /// `ordinal`) unless told otherwise: the
    /// simulator's 32 GiB of 4 KiB pages, the memory the host could take now in its system
    /// pages, an accelerator's whole memory in its runtime's normal granularity.
    pub fn defaults(self, ordinal: i32) -> Result<(u64, PageSize)> {
        let normal = |b: &dyn Backend| b.page_size(crate::vm::PageKind::Normal);
        Ok(match self {
            BackendKind::Sim => (SimConfig::default().capacity, SimConfig::default().normal_page),
            BackendKind::Host => {
                let probe = HostBackend::new(HostConfig { capacity: 64 << 20 })?;
                (crate::backend::host::default_capacity(), normal(&probe))
            }
            BackendKind::Acl => AclBackend::open(ordinal, None).map(|b| (b.capacity(), normal(&b)))?,
            BackendKind::Cuda => CudaBackend::open(ordinal, None).map(|b| (b.capacity(), normal(&b)))?,
        })
    }

    /// A backend of this kind for a device of `config` (the simulator's giant frames and
    /// normal page are checked against what a real backend has); `va_slice` cuts the
    /// simulator's window (see [`DeviceConfig::va_slice`]).
    fn open(self, config: SimConfig, ordinal: i32, va_slice: Option<(u32, u32)>) -> Result<Box<dyn Backend>> {
        let name = self.name();
        if let (Some((index, count)), false) = (va_slice, self == BackendKind::Sim) {
            return Err(AclError::invalid_param(format!(
                "va_slice=({index}, {count}) cuts the simulator's window; {name}-backend devices get distinct \
                 address windows from their memory's owner"
            )));
        }
        if self != BackendKind::Sim && config.giant_frames > 0 {
            return Err(AclError::invalid_param(format!(
                "giant_frames={} sets 1 GiB frames aside in the simulator; the {name} backend takes 1 GiB pages \
                 from its memory (the host's hugetlb pool: /sys/kernel/mm/hugepages/hugepages-1048576kB)",
                config.giant_frames
            )));
        }
        let backend: Box<dyn Backend> = match self {
            BackendKind::Sim => {
                let (start, end) = match va_slice {
                    Some((index, count)) => crate::vm::va_slice(index, count)?,
                    None => (crate::vm::VA_WINDOW_START, crate::vm::VA_WINDOW_END),
                };
                return Ok(Box::new(SimBackend::with_window(config, crate::vm::VaSpace::new(start, end))?));
            }
            BackendKind::Host => Box::new(HostBackend::new(HostConfig { capacity: config.capacity })?),
            BackendKind::Acl => Box::new(AclBackend::open(ordinal, Some(config.capacity))?),
            BackendKind::Cuda => Box::new(CudaBackend::open(ordinal, Some(config.capacity))?),
        };
        let normal = backend.page_size(crate::vm::PageKind::Normal);
        if config.normal_page != normal {
            return Err(AclError::invalid_param(format!(
                "normal_page={} but the {name} backend's normal pages are {}; it uses its own",
                config.normal_page.label(),
                normal.label()
            )));
        }
        Ok(backend)
    }
}

/// Everything needed to build a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The device's shape: capacity (for the host backend, the most it may hold), normal page
    /// and giant frames (the simulator's; the host backend takes its pages from the kernel).
    pub sim: SimConfig,
    pub backend: BackendKind,
    /// The runtime's device the `acl` and `cuda` backends use (`aclrtSetDevice`, `cuDeviceGet`).
    pub ordinal: i32,
    pub allocator: AllocatorKind,
    /// Settings of the allocator, in the PYTORCH_NPU_ALLOC_CONF grammar.
    pub alloc_conf: String,
    /// Wraps the backend in a [`FaultyBackend`], so that `inject_faults` can make driver calls
    /// fail.
    pub faults: bool,
    /// `(index, count)`: the simulated device hands out addresses only from slice `index` of
    /// the device window cut in `count` ([`crate::vm::va_slice`]), so that `count` devices share
    /// one address space without overlapping; `None`: the whole window.
    pub va_slice: Option<(u32, u32)>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            sim: SimConfig::default(),
            backend: BackendKind::Sim,
            ordinal: 0,
            allocator: AllocatorKind::Npumem,
            alloc_conf: String::new(),
            faults: false,
            va_slice: None,
        }
    }
}

/// The stream-ordered reuse rules (`aclrtMemPoolAttr` / cudaMallocAsync's pool attributes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReusePolicy {
    /// A malloc on a stream that (through events) follows a free's point may reuse the block.
    pub follow_event_dependencies: bool,
    /// A freed block whose streams have completed is reusable by any stream, without the host
    /// having synchronised with them.
    pub allow_opportunistic: bool,
    /// When memory runs out, a malloc may take a pending block by making its stream wait for
    /// the free's point.
    pub allow_internal_dependencies: bool,
    /// Reserved bytes the allocator keeps when the host synchronises; above it, the coldest
    /// cached memory is returned to the device (`u64::MAX`: keep everything).
    pub release_threshold: u64,
}

impl Default for ReusePolicy {
    fn default() -> Self {
        ReusePolicy {
            follow_event_dependencies: true,
            allow_opportunistic: true,
            allow_internal_dependencies: true,
            release_threshold: u64::MAX,
        }
    }
}

impl Device {
    /// A device on the simulator, real host memory or an accelerator runtime.
    pub fn new(config: DeviceConfig) -> Result<Self> {
        let backend = config.backend.open(config.sim, config.ordinal, config.va_slice)?;
        let (_, capacity) = backend.mem_info(crate::acl::MemScope::All);
        let allocator = config.allocator.build(&config.alloc_conf, capacity)?;
        if !config.faults {
            return Ok(Self::with_parts(backend, allocator));
        }
        let faulty = FaultyBackend::new(backend);
        let injector = faulty.injector();
        Ok(Self::with_parts(Box::new(faulty), allocator).with_fault_injector(injector))
    }

    /// A device over any backend and allocator (one that holds no blocks yet: the device's
    /// live table keeps the one record of each block it grants).
    pub fn with_parts(backend: Box<dyn Backend>, allocator: Box<dyn Allocator>) -> Self {
        Device {
            backend,
            allocator,
            fault_injector: None,
            pool_requested: FxHashMap::default(),
            live: LiveTable::default(),
            free_scratch: Vec::new(),
            free_run: Vec::new(),
            recently_freed: FreedRing::default(),
            host: HostHeap::default(),
            stats: DeviceStats::default(),
            recording: Recording::default(),
            sched: Scheduler::new(CostModel::ascend910b()),
            uses: BlockUses::default(),
            pending: PendingFrees::default(),
            sanitizer: Sanitizer::new(SanitizerMode::Collect),
            reuse: ReusePolicy::default(),
            charge: DriverCharge::default(),
            tags: FxHashMap::default(),
            pins: Pins::default(),
            user_vmm: vmm::UserVmm::default(),
            rt: RuntimeHandles::default(),
        }
    }
}
