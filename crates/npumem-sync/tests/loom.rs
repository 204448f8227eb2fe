//! Model checks of `TaggedStack` with loom: every interleaving of small concurrent scenarios
//! keeps each index exactly once. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p npumem-sync --release --test loom`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU32, Ordering};
use npumem_sync::{Batches, Links, NIL, TaggedStack};

struct Arr(Vec<AtomicU32>);

impl Links for Arr {
    fn next(&self, i: u32) -> u32 {
        self.0[i as usize].load(Ordering::Relaxed)
    }
    fn set_next(&self, i: u32, n: u32) {
        self.0[i as usize].store(n, Ordering::Relaxed)
    }
}

fn setup(n: u32, pushed: &[u32]) -> Arc<(TaggedStack, Arr)> {
    let links = Arr((0..n).map(|_| AtomicU32::new(NIL)).collect());
    let s = TaggedStack::new();
    for &i in pushed {
        s.push(i, &links);
    }
    Arc::new((s, links))
}

fn drain(st: &(TaggedStack, Arr)) -> Vec<u32> {
    let mut out = Vec::new();
    let mut i = st.0.take_all();
    while i != NIL {
        out.push(i);
        i = st.1.next(i);
    }
    out
}

#[test]
fn concurrent_pops_take_distinct_indices() {
    loom::model(|| {
        let st = setup(3, &[0, 1, 2]);
        let a = {
            let st = st.clone();
            loom::thread::spawn(move || st.0.pop(&st.1))
        };
        let b = st.0.pop(&st.1);
        let a = a.join().unwrap();
        let mut all = drain(&st);
        all.extend(a);
        all.extend(b);
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2]);
    });
}

#[test]
fn aba_two_pops_and_a_push_against_a_pop_keep_the_list_whole() {
    // The classic ABA: A reads top=2 and its next=1, then B pops 2 and 1 and pushes 2 back;
    // without the tag, A's exchange would succeed and put 1 back on the stack while B holds it.
    loom::model(|| {
        let st = setup(3, &[0, 1, 2]);
        let a = {
            let st = st.clone();
            loom::thread::spawn(move || st.0.pop(&st.1))
        };
        let first = st.0.pop(&st.1);
        let second = st.0.pop(&st.1);
        if let Some(i) = first {
            st.0.push(i, &st.1);
        }
        let a = a.join().unwrap();
        let mut all = drain(&st);
        all.extend(a);
        all.extend(second);
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2]);
    });
}

#[test]
fn chain_push_and_take_all_race() {
    loom::model(|| {
        let st = setup(4, &[0]);
        let a = {
            let st = st.clone();
            loom::thread::spawn(move || {
                st.1.set_next(2, 3);
                st.0.push_chain(2, 3, &st.1);
            })
        };
        let taken = drain(&st);
        a.join().unwrap();
        let mut all = taken;
        all.extend(drain(&st));
        all.sort_unstable();
        assert_eq!(all, vec![0, 2, 3]);
    });
}

#[test]
fn batches_handed_between_threads_arrive_whole() {
    // One thread gives a batch while another gives one and takes whatever is there: every
    // index given is taken exactly once, with its batch's contents intact.
    loom::model(|| {
        let b = Arc::new(Batches::new(2, 1));
        let giver = {
            let b = b.clone();
            loom::thread::spawn(move || b.give(0, &[1, 2]).is_ok())
        };
        assert!(b.give(0, &[7]).is_ok());
        let mut got = Vec::new();
        b.take(0, &mut got);
        assert!(giver.join().unwrap());
        while b.take(0, &mut got) > 0 {}
        got.sort_unstable();
        assert_eq!(got, vec![1, 2, 7]);
    });
}
