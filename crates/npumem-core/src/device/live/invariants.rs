//! `Paged::check_invariants`: the rules of the live table's module docs, asserted over a level
//! and the levels below it (test builds only; the property tests call it after every step).

use std::collections::BTreeSet;

use super::*;

impl<const GRAIN_SHIFT: u32, L: Loose> Paged<GRAIN_SHIFT, L> {
    /// Asserts every invariant of a level (and, through `Loose`, of the next ones) against an
    /// independent recount; the budget's bound, which depends on the peak, is the tests'.
    pub(super) fn check_invariants(&self) {
        // `pages`, `ordered` and the leaves' `page` fields name the same pages, each marked.
        assert_eq!(self.pages.len(), self.leaves.len(), "every leaf has exactly one page in `pages`");
        assert!(
            self.ordered.iter().eq(self.pages.keys().collect::<BTreeSet<_>>()),
            "`ordered` is the pages of `pages`"
        );
        for (&page, &i) in &self.pages {
            assert_eq!(self.leaves[i as usize].page, page, "leaf {i} is the leaf of page {page:#x}");
            assert!(self.may_have_leaf(page), "page {page:#x} has its bit in `marked`");
        }
        // `last` and the memo name a page and its leaf, or no page.
        for (what, (page, leaf)) in std::iter::once(("last", self.last)).chain(self.memo.iter().map(|&m| ("memo", m))) {
            assert!(
                page == NO_PAGE || self.pages.get(&page) == Some(&leaf),
                "`{what}` names page {page:#x} and its leaf"
            );
        }
        // Each live allocation is held once: in its leaf (`at` = 1 + its offset in the grain),
        // never also in `loose`; the live counts and group bits agree with the records.
        let mut in_leaves = 0;
        for (i, leaf) in self.leaves.iter().enumerate() {
            let mut live = 0;
            for s in 0..SLOTS {
                let r = &leaf.records[cell(s)];
                if !r.live() {
                    continue;
                }
                live += 1;
                assert!((r.at as u64) <= 1 << (GRAIN_SHIFT - BLOCK_SHIFT), "record `at` inside its grain");
                let ptr = Self::ptr_of(leaf.page, s, r.at);
                assert_eq!(Self::at(ptr), r.at, "record of {ptr:#x} at its offset");
                assert!(self.loose.get(ptr).is_none(), "{ptr:#x} is held by a leaf and by `loose`");
                assert!(leaf.groups & (1 << (s / GROUP)) != 0, "leaf {i}: group bit of live slot {s}");
            }
            assert_eq!(leaf.live as usize, live, "leaf {i} counts its live records");
            in_leaves += live;
            // A leaf with no live record is in `emptied`, once, exactly while `listed`.
            let listed = self.emptied.iter().filter(|&&e| e as usize == i).count();
            assert_eq!(listed, leaf.listed as usize, "leaf {i} is in `emptied` exactly while `listed`");
            assert!(leaf.live > 0 || leaf.listed, "empty leaf {i} is in `emptied`");
        }
        assert_eq!(self.in_leaves, in_leaves, "`in_leaves` sums the leaves' live records");
        assert_eq!(self.grow_at, self.grow_at(), "`grow_at` is the budget's least `in_leaves` for one more leaf");
        self.loose.check_invariants();
    }
}
