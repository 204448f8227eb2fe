//! `TlbConfig::from_cpuid`: the TLB geometry of the machine the model runs on, read from its
//! CPUID leaves (through the raw-cpuid crate), with the source of every number in `source`.
//!
//! Rules:
//! - AMD: the L1 data TLB from leaf 0x8000_0005 (EBX 4 KiB, EAX 2 MiB), the L2 from leaf
//!   0x8000_0006 (EBX 4 KiB, EAX 2 MiB), 1 GiB entries from leaf 0x8000_0019 (AMD64 Architecture
//!   Programmer's Manual vol. 3, appendix E.4). Page sizes a level reports with equal entry
//!   counts share one array (AMD's data TLBs hold every size in one structure; its ways are the
//!   4 KiB field's); unequal counts make one array per size.
//! - Intel: the data, load and unified TLBs of leaf 0x18's sub-leaves, one array each, by level
//!   (Intel SDM vol. 2A, CPUID leaf 18H); a store-only array is left out (a chase only loads).
//! - 64 KiB pages (an Arm size) go with 4 KiB ones. What CPUID does not give — hit latency,
//!   walk caches, walk-step cycles — comes from the vendor's preset (`zen4`, `skylake`) and is
//!   labelled a guess; so is replacement: LRU at L1, tree pseudo-LRU in a set-associative level
//!   beyond it with power-of-two ways (vendors publish neither; on this project's Zen 4 guests a
//!   chase 12% past the L2's reach keeps about a third of its hits, as PLRU does and LRU does not).
//! - Under a hypervisor (leaf 1 ECX bit 31) the caller's host page makes the host dimension:
//!   CPUID cannot see the host's pages.

use raw_cpuid::{Associativity, CpuId, CpuIdReader, DatType};

use crate::config::limits::PLRU_WAYS;
use crate::config::{ArrayConfig, HostConfig, Replacement, TlbConfig};
use npumem_base::PageSize;
use npumem_base::error::{AclError, ErrorCode, Result};

/// One (entries, ways) a CPUID field reports for a page size, at one level.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Field {
    entries: usize,
    ways: usize,
}

/// A field of `entries` with AMD's associativity code; none when absent or disabled.
fn amd_field(entries: u64, assoc: Associativity) -> Option<Field> {
    let entries = entries as usize;
    let ways = match assoc {
        Associativity::Disabled | Associativity::Unknown => return None,
        Associativity::DirectMapped => 1,
        Associativity::NWay(n) => usize::from(n),
        Associativity::FullyAssociative => entries,
    };
    (entries > 0 && ways > 0).then_some(Field { entries, ways })
}

/// The arrays of one level from its per-size fields: equal entry counts share an array (the
/// first size's ways), others get their own.
fn level_arrays(level: usize, fields: &[(PageSize, Option<Field>)], hit_cycles: u64) -> (Vec<ArrayConfig>, String) {
    let mut groups: Vec<(Field, Vec<PageSize>)> = Vec::new();
    for &(page, field) in fields {
        let Some(f) = field else { continue };
        match groups.iter_mut().find(|(g, _)| g.entries == f.entries) {
            Some((_, sizes)) => sizes.push(page),
            None => groups.push((f, vec![page])),
        }
    }
    let mut notes = Vec::new();
    let arrays = groups
        .into_iter()
        .map(|(f, mut sizes)| {
            if sizes.contains(&PageSize::Size4K) {
                sizes.push(PageSize::Size64K);
            }
            sizes.sort();
            let labels: Vec<&str> = sizes.iter().map(|p| p.label()).collect();
            notes.push(format!("L{} {} entries {}-way for {}", level + 1, f.entries, f.ways, labels.join("/")));
            let all = sizes.len() == PageSize::ALL.len();
            let name = format!("L{} {}", level + 1, if all { "all" } else { labels[0] });
            let plru =
                level > 0 && f.ways < f.entries && f.ways.is_power_of_two() && PLRU_WAYS.contains(&(f.ways as u64));
            let replacement = if plru { Replacement::Plru } else { Replacement::Lru };
            ArrayConfig::new(&name, f.entries, f.ways, if all { &[] } else { &sizes }, replacement, hit_cycles)
        })
        .collect();
    (arrays, notes.join(", "))
}

/// The geometry `cpuid` reports, over `host_page` host pages when it reports a hypervisor.
pub fn from_reader<R: CpuIdReader>(cpuid: &CpuId<R>, host_page: Option<PageSize>) -> Result<TlbConfig> {
    let unsupported =
        |why: &str| AclError::new(ErrorCode::FeatureUnsupported, format!("TLB geometry from CPUID: {why}"));
    let vendor = cpuid.get_vendor_info().ok_or_else(|| unsupported("no vendor leaf"))?;
    let features = cpuid.get_feature_info().ok_or_else(|| unsupported("no leaf 1"))?;
    let ident = format!("{} family {:#x} model {:#x}", vendor.as_str(), features.family_id(), features.model_id());
    let (l1, l2, preset, leaves) = match vendor.as_str() {
        "AuthenticAMD" | "HygonGenuine" => {
            let a = cpuid.get_l1_cache_and_tlb_info().ok_or_else(|| unsupported("no leaf 0x80000005"))?;
            let b = cpuid.get_l2_l3_cache_and_tlb_info().ok_or_else(|| unsupported("no leaf 0x80000006"))?;
            let g = cpuid.get_tlb_1gb_page_info();
            let l1 = [
                (PageSize::Size4K, amd_field(a.dtlb_4k_size().into(), a.dtlb_4k_associativity())),
                (PageSize::Size2M, amd_field(a.dtlb_2m_4m_size().into(), a.dtlb_2m_4m_associativity())),
                (
                    PageSize::Size1G,
                    g.as_ref().and_then(|g| amd_field(g.dtlb_l1_1gb_size().into(), g.dtlb_l1_1gb_associativity())),
                ),
            ];
            let l2 = [
                (PageSize::Size4K, amd_field(b.dtlb_4k_size().into(), b.dtlb_4k_associativity())),
                (PageSize::Size2M, amd_field(b.dtlb_2m_4m_size().into(), b.dtlb_2m_4m_associativity())),
                (
                    PageSize::Size1G,
                    g.as_ref().and_then(|g| amd_field(g.dtlb_l2_1gb_size().into(), g.dtlb_l2_1gb_associativity())),
                ),
            ];
            (l1.to_vec(), l2.to_vec(), "zen4", "leaves 0x80000005/6/19")
        }
        "GenuineIntel" => {
            let dat = cpuid.get_deterministic_address_translation_info().ok_or_else(|| unsupported("no leaf 0x18"))?;
            let (mut l1, mut l2) = (Vec::new(), Vec::new());
            for d in dat {
                if !matches!(d.cache_type(), DatType::DataTLB | DatType::UnifiedTLB | DatType::LoadOnly) {
                    continue;
                }
                let entries = usize::from(d.ways()) * d.sets() as usize;
                let ways = if d.is_fully_associative() { entries } else { usize::from(d.ways()) };
                let field = (entries > 0).then_some(Field { entries, ways });
                let level = if d.cache_level() <= 1 { &mut l1 } else { &mut l2 };
                for (has, page) in [
                    (d.has_4k_entries(), PageSize::Size4K),
                    (d.has_2mb_entries(), PageSize::Size2M),
                    (d.has_1gb_entries(), PageSize::Size1G),
                ] {
                    if has && !level.iter().any(|(p, _)| *p == page) {
                        level.push((page, field));
                    }
                }
            }
            (l1, l2, "skylake", "leaf 0x18")
        }
        other => return Err(unsupported(&format!("vendor {other:?} has no TLB leaves this model reads"))),
    };
    let base = TlbConfig::preset(preset)?;
    let l2_hit = base.levels.get(1).and_then(|l| l.first()).map_or(0, |a| a.hit_cycles);
    let (a1, n1) = level_arrays(0, &l1, 0);
    let (a2, n2) = level_arrays(1, &l2, l2_hit);
    if a1.is_empty() {
        return Err(unsupported(&format!("{ident} reports no L1 data TLB in {leaves}")));
    }
    let mut levels = vec![a1];
    if !a2.is_empty() {
        levels.push(a2);
    }
    let guest = features.has_hypervisor();
    let host = match (guest, host_page) {
        (true, Some(p)) => Some(HostConfig::with_page(p)),
        _ => None,
    };
    let hv = if guest {
        match host_page {
            Some(p) => format!("; a guest (hypervisor bit): host {} pages given by the caller", p.label()),
            None => "; a guest (hypervisor bit), modelled native: no host page given".to_string(),
        }
    } else {
        String::new()
    };
    let source = format!(
        "CPUID of {ident} ({leaves}): {n1}; {n2}; L2 hit {l2_hit} cycles, walk caches {:?}, walk step {} cycles: guesses from the {preset} preset; LRU at L1, tree-PLRU in set-associative L2 arrays: guesses{hv}",
        base.walk_cache_entries, base.walk_step_cycles
    );
    let config = TlbConfig {
        name: "cpuid".into(),
        levels,
        walk_cache_entries: base.walk_cache_entries,
        walk_step_cycles: base.walk_step_cycles,
        source,
        coalesce: 1,
        source_kind: "CPUID".into(),
        host,
    };
    config.validate()?;
    Ok(config)
}

impl TlbConfig {
    /// The geometry of the machine this runs on, from its CPUID leaves ([`from_reader`]); a guest
    /// of a hypervisor gets a host dimension of `host_page` pages when one is given.
    pub fn from_cpuid(host_page: Option<PageSize>) -> Result<TlbConfig> {
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        return from_reader(&CpuId::new(), host_page);
        #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
        {
            let _ = host_page;
            Err(AclError::new(
                ErrorCode::FeatureUnsupported,
                "TLB geometry from CPUID: this machine is not x86".to_string(),
            ))
        }
    }
}
