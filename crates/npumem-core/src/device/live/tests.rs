//! The live table against an ordered map, with its invariants checked after every step.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

#[test]
fn cells_are_a_permutation_that_packs_4k_apart_slots() {
    let mut seen = vec![false; SLOTS];
    for s in 0..SLOTS {
        assert!(!std::mem::replace(&mut seen[cell(s)], true), "slot {s} shares its cell");
    }
    // Four records a 64-byte line: slots 8 apart (4 KiB apart) share one.
    for s in (0..SLOTS - 8).step_by(8) {
        assert_eq!(cell(s + 8), cell(s) + 1);
    }
}

#[test]
fn records_keep_every_policy_and_page_size() {
    // `unpack` masks the indexes with 7 and 3.
    assert_eq!((Policy::ALL.len(), PAGE_SIZES.len()), (8, 4));
    for (i, &policy) in Policy::ALL.iter().enumerate() {
        assert_eq!((policy as usize, policy_of(i as u8)), (i, policy));
    }
    for (i, &page) in PAGE_SIZES.iter().enumerate() {
        assert_eq!((page as usize, page_of(i as u8)), (i, page));
    }
}

/// Pointers over a few 2 MiB pages far apart in the 48-bit space (the host backend's are
/// real process addresses): on the grain, off it, at a page's first and last grain, and
/// spread over 64 KiB grains (several in one, at any 512-byte offset) and 256 MiB pages.
fn pointer() -> impl Strategy<Value = u64> {
    let page = prop_oneof![
        Just(1u64 << 20),
        Just(5 << 20),
        Just(6 << 20),
        Just(255 << 20),
        Just(0x7fff_ffe0_0000 >> 21 << 21)
    ];
    let offset = prop_oneof![
        4 => (0u64..24).prop_map(|g| g << BLOCK_SHIFT),
        1 => Just((SLOTS as u64 - 1) << BLOCK_SHIFT),
        1 => (0u64..24).prop_map(|g| (g << BLOCK_SHIFT) + 64),
        3 => (0u64..40, 0u64..3).prop_map(|(g, o)| (g << 16) + o * 0x5e00),
    ];
    (page, offset).prop_map(|(p, o)| (p >> 21 << 21) + o)
}

/// A level's invariants: its budget holds (leaves are kept after frees: it bounds them by
/// the peak), the cached budget check agrees with the budget's formula, and the page
/// indexes and counts agree.
fn check_level<const G: u32, L: Loose>(
    t: &Paged<G, L>,
    peak: usize,
    slots_per_live: usize,
    free_leaves: usize,
) -> Result<(), TestCaseError> {
    prop_assert!(t.leaves.len() * SLOTS <= peak * slots_per_live + free_leaves * SLOTS);
    let room = (t.in_leaves + 1) * slots_per_live + free_leaves * SLOTS;
    prop_assert_eq!(t.within_budget(), (t.leaves.len() + 1) * SLOTS <= room);
    prop_assert_eq!(t.pages.len(), t.leaves.len());
    prop_assert_eq!(t.ordered.len(), t.leaves.len());
    prop_assert_eq!(t.in_leaves, t.leaves.iter().map(|l| l.live as usize).sum::<usize>());
    for leaf in &t.leaves {
        prop_assert_eq!(leaf.live as usize, leaf.records.iter().filter(|r| r.live()).count());
    }
    Ok(())
}

proptest! {
    /// Against a BTreeMap: the same answer for every lookup, containment query and listing
    /// after any mix of inserts and removes — with fine and coarse leaves, with their
    /// budgets spent (pages going to the next level, emptied leaves taken over by new
    /// pages), with several allocations starting in one coarse grain, with large
    /// allocations (given to the coarse level first), and with fields too wide for a record.
    #[test]
    fn answers_like_an_ordered_map(
        ops in proptest::collection::vec((0u8..3, pointer(), 1u64..5000), 1..300),
        fine in (prop_oneof![Just(0usize), Just(SLOTS_PER_LIVE), Just(SLOTS)], 0usize..3),
        coarse in (prop_oneof![Just(0usize), Just(SLOTS_PER_LIVE), Just(SLOTS)], 0usize..3),
    ) {
        // Budgets that let no or a few leaves exist beyond the live allocations' share.
        let mut table = LiveTable::with_budget(
            fine.0,
            fine.1,
            Paged::with_budget(coarse.0, coarse.1, Hashed::with_slack(3)),
        );
        let mut model: BTreeMap<u64, Allocation> = BTreeMap::new();
        let mut peak = 0;
        for (op, ptr, x) in ops {
            match op {
                0 if !model.contains_key(&ptr) => {
                    let size = match x % 5 {
                        0 => 64 << 10,
                        1 => (64 << 10) + x * 1000,
                        _ => 1 + x % 64,
                    };
                    let mut a = Allocation {
                        ptr,
                        size,
                        booked: size + x % 40,
                        granted: size + 64,
                        policy: Policy::ALL[(x % 8) as usize],
                        page: PAGE_SIZES[(x % 4) as usize],
                        stream: x % 3,
                    };
                    match x % 11 {
                        0 => a.stream = 1 << 40,
                        1 => a.booked = a.size + 300,
                        2 => a.size = 5 << 30,
                        _ => {}
                    }
                    a.granted = a.granted.max(a.size);
                    table.insert(a);
                    model.insert(ptr, a);
                }
                1 => prop_assert_eq!(table.remove(ptr), model.remove(&ptr)),
                _ => {
                    for addr in [ptr + x % 700, ptr + x * 37, ptr.saturating_sub(x * 13)] {
                        for extent in [|a: &Allocation| a.size, |a: &Allocation| a.granted] {
                            let want = model
                                .range(..=addr)
                                .next_back()
                                .map(|(_, a)| a)
                                .filter(|a| addr - a.ptr < extent(a));
                            prop_assert_eq!(table.containing(addr, extent), want.copied());
                        }
                        prop_assert_eq!(table.contains(addr), model.contains_key(&addr));
                    }
                    prop_assert_eq!(table.get(ptr), model.get(&ptr).copied());
                }
            }
            prop_assert_eq!(table.len(), model.len());
            peak = peak.max(model.len());
            check_level(&table, peak, fine.0, fine.1)?;
            check_level(&table.loose, peak, coarse.0, coarse.1)?;
            table.check_invariants();
        }
        prop_assert_eq!(table.sorted(), model.values().copied().collect::<Vec<_>>());
    }
}
