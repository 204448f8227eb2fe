//! The fault switch: make the Nth call of one kind from now fail, as a real driver can, so that
//! tests can drive every failure path of the code above the runtime and then prove (with the live
//! counts) that it gave back everything it took.
//!
//! Invariants: each armed countdown fires once, at its Nth call of its kind counted from when it
//! was armed, then disarms — or, armed to persist (`arm_from`), fires at that call and every
//! later one until it is disarmed; a call that fires fails before it changes anything; calls of
//! the other kinds pass through.

use parking_lot::Mutex;

/// The calls the switch can fail (the numbers are those of `npumem_fake_fail_next`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum FaultKind {
    /// A physical allocation (`aclrtMallocPhysical`, `cuMemCreate`): fails as out of memory.
    Physical = 0,
    /// A map (`aclrtMapMem`, `cuMemMap`).
    Map = 1,
    /// A VA reservation (`aclrtReserveMemAddress`, `cuMemAddressReserve`).
    Reserve = 2,
    /// An unmap (`aclrtUnmapMem`, `cuMemUnmap`).
    Unmap = 3,
    /// A copy, synchronous or queued (`aclrtMemcpy*`, `cuMemcpy*`).
    Memcpy = 4,
    /// A memset (`aclrtMemset*`, `cuMemsetD8*`).
    Memset = 5,
    /// A release of a VA reservation (`aclrtReleaseMemAddress`, `cuMemAddressFree`).
    Release = 6,
    /// A free of a physical allocation (`aclrtFreePhysical`, `cuMemRelease`).
    FreePhysical = 7,
    /// A stream creation.
    Stream = 8,
    /// An event creation.
    Event = 9,
    /// A memory-information query (`aclrtGetMemInfo`, `cuMemGetInfo`).
    MemInfo = 10,
    /// A page-locked host allocation (`aclrtMallocHost`, `cuMemAllocHost`): fails as out of
    /// memory.
    Host = 11,
}

const KINDS: usize = 12;

impl FaultKind {
    pub const ALL: [FaultKind; KINDS] = [
        FaultKind::Physical,
        FaultKind::Map,
        FaultKind::Reserve,
        FaultKind::Unmap,
        FaultKind::Memcpy,
        FaultKind::Memset,
        FaultKind::Release,
        FaultKind::FreePhysical,
        FaultKind::Stream,
        FaultKind::Event,
        FaultKind::MemInfo,
        FaultKind::Host,
    ];

    pub fn from_raw(raw: u32) -> Option<FaultKind> {
        Self::ALL.get(raw as usize).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Physical => "physical",
            FaultKind::Map => "map",
            FaultKind::Reserve => "reserve",
            FaultKind::Unmap => "unmap",
            FaultKind::Memcpy => "memcpy",
            FaultKind::Memset => "memset",
            FaultKind::Release => "release",
            FaultKind::FreePhysical => "free_physical",
            FaultKind::Stream => "stream",
            FaultKind::Event => "event",
            FaultKind::MemInfo => "mem_info",
            FaultKind::Host => "host",
        }
    }

    pub fn parse(name: &str) -> Option<FaultKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// The armed countdowns, whether each persists once it fires, and how many faults fired, by
/// kind.
#[derive(Debug, Default)]
pub struct Faults {
    state: Mutex<([u64; KINDS], [bool; KINDS], [u64; KINDS])>,
}

impl Faults {
    /// Makes the `n`th call of `kind` from now fail (1 = the next); 0 disarms.
    pub fn arm(&self, kind: FaultKind, n: u64) {
        let mut state = self.state.lock();
        state.0[kind as usize] = n;
        state.1[kind as usize] = false;
    }

    /// Makes the `n`th call of `kind` from now and every later one fail, until disarmed (`arm`
    /// with 0); `n` = 0 disarms.
    pub fn arm_from(&self, kind: FaultKind, n: u64) {
        let mut state = self.state.lock();
        state.0[kind as usize] = n;
        state.1[kind as usize] = n > 0;
    }

    /// Counts a call of `kind` down; true when it is one that fails.
    pub fn fires(&self, kind: FaultKind) -> bool {
        let mut state = self.state.lock();
        let (countdowns, persists, fired) = &mut *state;
        match countdowns[kind as usize] {
            0 => false,
            1 => {
                if !persists[kind as usize] {
                    countdowns[kind as usize] = 0;
                }
                fired[kind as usize] += 1;
                true
            }
            _ => {
                countdowns[kind as usize] -= 1;
                false
            }
        }
    }

    /// Faults fired so far, of every kind.
    pub fn fired(&self) -> u64 {
        self.state.lock().2.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_countdown_fires_once_at_its_call() {
        let f = Faults::default();
        f.arm(FaultKind::Map, 3);
        assert_eq!([f.fires(FaultKind::Map), f.fires(FaultKind::Physical), f.fires(FaultKind::Map)], [false; 3]);
        assert!(f.fires(FaultKind::Map));
        assert!(!f.fires(FaultKind::Map));
        assert_eq!(f.fired(), 1);
        assert_eq!(FaultKind::parse("free_physical"), Some(FaultKind::FreePhysical));
        assert_eq!(FaultKind::from_raw(11), Some(FaultKind::Host));
        assert_eq!(FaultKind::from_raw(12), None);
        f.arm_from(FaultKind::Unmap, 2);
        assert_eq!(
            [f.fires(FaultKind::Unmap), f.fires(FaultKind::Unmap), f.fires(FaultKind::Unmap)],
            [false, true, true]
        );
        f.arm(FaultKind::Unmap, 0);
        assert!(!f.fires(FaultKind::Unmap));
        assert_eq!(f.fired(), 3);
    }
}
