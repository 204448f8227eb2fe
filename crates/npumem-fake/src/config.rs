//! The stand-in's configuration, read once from the environment when the library is first used:
//!
//! - `NPUMEM_FAKE_CAPACITY`: bytes of device memory (`64GiB`, `512MiB`, `1073741824`); the
//!   default is the flavour's (64 GiB like an Ascend 910B, 80 GiB like an H100);
//! - `NPUMEM_FAKE_GRANULARITY`: the allocation granularity of normal memory, a power of two from
//!   4 KiB to 2 MiB; the default is the flavour's (4 KiB for AscendCL's `ACL_MEM_NORMAL`, 2 MiB for
//!   CUDA, whose VMM has one granularity);
//! - `NPUMEM_FAKE_DELAY_US`: microseconds each queued stream operation waits before it runs
//!   (default 0), so that an event recorded behind it is not complete at once;
//! - `NPUMEM_FAKE_FAIL`: countdowns of the fault switch armed at start, as `kind:n` pairs
//!   separated by commas (`physical:3,map:1`; kinds in `faults.rs`);
//! - `NPUMEM_FAKE_DEVICES`: how many devices the runtime reports (default 1);
//! - `NPUMEM_FAKE_CANN`: the CANN release the AscendCL stand-in behaves as, `major.minor`
//!   (default 8.5): before 8.5, physical memory takes only the `ACL_HBM_MEM_*` attributes
//!   (`ACL_MEM_NORMAL` and the other 12–17 values first appear in CANN 8.5).
//!
//! Invariant: a value that cannot be read falls back to the default and is reported once on
//! stderr (a test library must not abort its host process over a typo).

use crate::faults::FaultKind;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Which runtime the stand-in imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// AscendCL: VA reservations in the 16–24 TiB window.
    Acl,
    /// The CUDA driver: VA reservations anywhere.
    Cuda,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub capacity: u64,
    pub granularity: u64,
    pub delay_us: u64,
    pub devices: u32,
    /// The CANN release imitated, as (major, minor).
    pub cann: (u32, u32),
    pub fail: Vec<(FaultKind, u64)>,
}

/// Reads `64GiB`, `2 MiB`, `4k`, `1073741824`.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let value: u64 = text[..digits].parse().ok()?;
    let unit = match text[digits..].trim().to_ascii_lowercase().trim_end_matches("ib").trim_end_matches('b') {
        "" => 1,
        "k" => KIB,
        "m" => MIB,
        "g" => GIB,
        "t" => GIB << 10,
        _ => return None,
    };
    value.checked_mul(unit)
}

/// Reads `8.3`, `8.5`, `9.0`.
pub fn parse_release(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn read<T>(name: &str, default: T, parse: impl Fn(&str) -> Option<T>) -> T {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => parse(&v).unwrap_or_else(|| {
            eprintln!("npumem stand-in runtime: cannot read {name}={v:?}; using the default");
            default
        }),
        _ => default,
    }
}

impl Config {
    pub fn from_env(flavor: Flavor) -> Config {
        let (capacity, granularity) = match flavor {
            Flavor::Acl => (64 * GIB, 4 * KIB),
            Flavor::Cuda => (80 * GIB, 2 * MIB),
        };
        Config {
            capacity: read("NPUMEM_FAKE_CAPACITY", capacity, |v| parse_size(v).filter(|&c| c > 0)),
            granularity: read("NPUMEM_FAKE_GRANULARITY", granularity, |v| {
                parse_size(v).filter(|g| g.is_power_of_two() && (4 * KIB..=2 * MIB).contains(g))
            }),
            delay_us: read("NPUMEM_FAKE_DELAY_US", 0, |v| v.trim().parse().ok()),
            devices: read("NPUMEM_FAKE_DEVICES", 1, |v| v.trim().parse().ok().filter(|&n| n > 0)),
            cann: read("NPUMEM_FAKE_CANN", (8, 5), parse_release),
            fail: read("NPUMEM_FAKE_FAIL", Vec::new(), |v| {
                v.split(',')
                    .map(|pair| {
                        let (kind, n) = pair.split_once(':')?;
                        Some((FaultKind::parse(kind.trim())?, n.trim().parse().ok()?))
                    })
                    .collect()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64GiB"), Some(64 * GIB));
        assert_eq!(parse_size("2 MiB"), Some(2 * MIB));
        assert_eq!(parse_size("4k"), Some(4 * KIB));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("99999999999999T"), None);
        assert_eq!(parse_release("8.3"), Some((8, 3)));
        assert_eq!(parse_release(" 9.0 "), Some((9, 0)));
        assert_eq!(parse_release("8"), None);
    }
}
