//! The opcode scan that admits a PyTorch memory-snapshot pickle before Python's unpickler loads
//! it (`npumem._snapshot_pickle.check`).
//!
//! Rules:
//! - a pickle is admitted only when loading it cannot recurse without bound in C or hash without
//!   bound: no tuple nests deeper than [`MAX_TUPLE_DEPTH`]; every dict key and set element is a
//!   hash-safe atom (a string, bytes, `None`, a bool or an int below 2**55), and a `set(x)` /
//!   `frozenset(x)` call (REDUCE) gets a tuple of lists of hash-safe atoms;
//! - no global but `set` and `frozenset` of `builtins` (or Python 2's `__builtin__`) is named,
//!   and no opcode that builds instances, state, persistent ids, extension codes or out-of-band
//!   buffers appears;
//! - a memo index is never read before it is written nor written past the memo's end, and no
//!   length runs past the end of the data: what the unpickler allocates is in proportion to the
//!   file, not to a number the file claims;
//! - a refusal says why and at which byte; a prefix of an admissible pickle is refused only as
//!   [`Refusal::truncated`], so a reader can check the start of a large file before reading the rest.
//!
//! Note [The stack model]: the scan keeps, for each item on the unpickler's stack and in its memo,
//! only what the rules need: a hash-safe atom, another atom, a tuple (its depth, and the lists it
//! holds when it holds nothing else that is not hash-safe), or a list (one shared flag, "all
//! items hash-safe so far", so that a list reached through the memo and changed later is seen
//! changed everywhere, as in the unpickler). The scan is linear in the file: one pass, no
//! recursion, work per opcode bounded by the items it pops.

use std::fmt;
use std::rc::Rc;

/// The deepest tuple a snapshot may hold (PyTorch's hold none).
pub const MAX_TUPLE_DEPTH: u32 = 100;

/// Why a pickle is not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The data ends before the pickle does: a longer file may still be admitted.
    pub truncated: bool,
    /// The message, with the byte it refers to where there is one.
    pub message: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refusal {}

fn refuse(why: impl fmt::Display, at: usize) -> Refusal {
    Refusal { truncated: false, message: format!("{why} (at byte {at})") }
}

fn truncated(why: impl fmt::Display, at: usize) -> Refusal {
    Refusal { truncated: true, message: format!("{why} (at byte {at})") }
}

/// What the scan keeps of one stack or memo item (Note [The stack model]).
#[derive(Clone)]
enum Item {
    Safe,
    Other,
    Tuple(Rc<Tuple>),
    /// Index of the list's "all hash-safe" flag.
    List(usize),
}

struct Tuple {
    depth: u32,
    /// The lists the tuple holds, or `None` when it holds an item that is neither a list nor a
    /// hash-safe atom.
    lists: Option<Vec<usize>>,
}

/// How an opcode's argument is laid out.
#[derive(Clone, Copy, PartialEq)]
enum Arg {
    None,
    Fixed(usize),
    /// Up to a newline.
    Line,
    /// Two newline-terminated lines (GLOBAL, INST).
    TwoLines,
    /// A little-endian length of this many bytes (signed when the flag is set), then the bytes.
    Counted(usize, bool),
}

/// The argument layout of every pickle opcode of protocols 0-5 (Python's `pickletools`).
fn arg_of(op: u8) -> Option<Arg> {
    Some(match op {
        b'('
        | b'.'
        | b'0'
        | b'1'
        | b'2'
        | b'N'
        | b'Q'
        | b'R'
        | b'a'
        | b'b'
        | b'd'
        | b'}'
        | b'e'
        | b'l'
        | b']'
        | b'o'
        | b's'
        | b't'
        | b')'
        | b'u'
        | 0x81
        | 0x85..=0x89
        | 0x8a
        | 0x8f..=0x94
        | 0x97
        | 0x98 => Arg::None,
        b'F' | b'I' | b'L' | b'P' | b'S' | b'V' | b'g' | b'p' => Arg::Line,
        b'c' | b'i' => Arg::TwoLines,
        b'K' | b'h' | b'q' | 0x80 | 0x82 => Arg::Fixed(1),
        b'M' | 0x83 => Arg::Fixed(2),
        b'J' | b'j' | b'r' | 0x84 => Arg::Fixed(4),
        b'G' | 0x95 => Arg::Fixed(8),
        b'U' | b'C' | 0x8c => Arg::Counted(1, false),
        b'X' | b'B' => Arg::Counted(4, false),
        b'T' | 0x8b => Arg::Counted(4, true),
        0x8d | 0x8e | 0x96 => Arg::Counted(8, false),
        _ => return None,
    })
}

/// Opcodes refused wherever they appear, with what they would build.
fn refused(op: u8) -> Option<&'static str> {
    Some(match op {
        0x97 | 0x98 => "out-of-band buffers",
        b'P' | b'Q' => "persistent ids",
        0x82..=0x84 => "extension codes",
        b'b' => "object state (BUILD)",
        b'i' => "instances (INST)",
        b'o' => "instances (OBJ)",
        0x81 => "instances (NEWOBJ)",
        0x92 => "instances (NEWOBJ_EX)",
        _ => return None,
    })
}

const NOT_HASH_SAFE: &str = "a dict key or set element that is not a string, bytes, None, a bool or an int below 2**55";

/// `n` with thousands separators, as Python's `{n:,}` writes it.
fn grouped(n: i128) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A little-endian integer of the bytes of `data` from `pos`, at most `k` of them (fewer where
/// the data ends first, as Python's `int.from_bytes` of a short slice reads).
fn le(data: &[u8], pos: usize, k: usize, signed: bool) -> i128 {
    let bytes = data.get(pos..).map_or(&[][..], |rest| &rest[..rest.len().min(k)]);
    let mut v: i128 = 0;
    for (i, b) in bytes.iter().enumerate() {
        v |= (*b as i128) << (8 * i);
    }
    if signed && !bytes.is_empty() && bytes[bytes.len() - 1] & 0x80 != 0 {
        v -= 1i128 << (8 * bytes.len());
    }
    v
}

/// A decimal memo index of a text opcode (GET, PUT): surrounding whitespace, a sign, digits.
fn decimal(arg: &[u8]) -> Option<i128> {
    let text = std::str::from_utf8(arg).ok()?.trim();
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    if digits.is_empty() || digits.len() > 30 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

struct Scan<'a> {
    data: &'a [u8],
    stack: Vec<Item>,
    marks: Vec<usize>,
    memo: Vec<Item>,
    /// The "all items hash-safe so far" flag of every list seen.
    lists: Vec<bool>,
}

/// Checks `data` against the rules of the module doc: `Ok` when it is an admissible pickle.
pub fn check(data: &[u8]) -> Result<(), Refusal> {
    let mut scan = Scan { data, stack: Vec::new(), marks: Vec::new(), memo: Vec::new(), lists: Vec::new() };
    let mut pos = 0;
    match scan.run(&mut pos) {
        Err(Step::Refused(r)) => Err(r),
        // An item or mark popped from an empty stack: past the end, the data was cut short.
        Err(Step::Underflow) if pos >= data.len() => Err(truncated("the pickle ends inside an opcode's argument", pos)),
        Err(Step::Underflow) => Err(refuse("an opcode takes more items than the pickle's stack holds", pos)),
        Err(Step::Malformed) => Err(refuse("a malformed opcode argument", pos)),
        Ok(()) => Ok(()),
    }
}

enum Step {
    Refused(Refusal),
    Underflow,
    Malformed,
}

impl From<Refusal> for Step {
    fn from(r: Refusal) -> Self {
        Step::Refused(r)
    }
}

type Scanned<T = ()> = std::result::Result<T, Step>;

impl Scan<'_> {
    fn pop(&mut self) -> Scanned<Item> {
        self.stack.pop().ok_or(Step::Underflow)
    }

    fn top(&self) -> Scanned<&Item> {
        self.stack.last().ok_or(Step::Underflow)
    }

    /// The items above the last mark, taken off the stack.
    fn pop_mark(&mut self) -> Scanned<Vec<Item>> {
        let m = self.marks.pop().ok_or(Step::Underflow)?;
        Ok(self.stack.split_off(m.min(self.stack.len())))
    }

    fn new_list(&mut self, safe: bool) -> Item {
        self.lists.push(safe);
        Item::List(self.lists.len() - 1)
    }

    /// `items` appended to the list `target` (when it is one).
    fn extend(&mut self, target: &Item, items: &[Item]) {
        if let Item::List(i) = *target {
            if self.lists[i] {
                self.lists[i] = items.iter().all(|r| matches!(r, Item::Safe));
            }
        }
    }

    fn run(&mut self, pos: &mut usize) -> Scanned {
        let data = self.data;
        let n = data.len();
        loop {
            if *pos >= n {
                return Err(truncated("the pickle ends before its STOP opcode", *pos).into());
            }
            let op = data[*pos];
            let at = *pos;
            *pos += 1;
            if op == 0x8a {
                // LONG1: a one-byte length, then the bytes; an int of up to 7 bytes is hash-safe.
                // A cut-short one is caught by the next opcode's check.
                let length = data.get(*pos).map_or(0, |&b| b as usize);
                *pos += 1 + length;
                self.stack.push(if length <= 7 { Item::Safe } else { Item::Other });
                continue;
            }
            let Some(layout) = arg_of(op) else {
                return Err(refuse(format!("byte {op:#04x} is not a pickle opcode"), at).into());
            };
            let mut arg: &[u8] = &[];
            match layout {
                Arg::None => {}
                Arg::Fixed(k) => {
                    arg = &data[(*pos).min(n)..(*pos + k).min(n)];
                    *pos += k;
                }
                Arg::Line | Arg::TwoLines => {
                    let mut lines: [&[u8]; 2] = [&[], &[]];
                    let count = if layout == Arg::Line { 1 } else { 2 };
                    for line in lines.iter_mut().take(count) {
                        let Some(nl) = data[*pos..].iter().position(|&b| b == b'\n') else {
                            return Err(truncated("the pickle ends inside an opcode's argument", at).into());
                        };
                        *line = &data[*pos..*pos + nl];
                        *pos += nl + 1;
                    }
                    arg = lines[count - 1];
                    if op == b'c' {
                        let (module, name) = (String::from_utf8_lossy(lines[0]), String::from_utf8_lossy(lines[1]));
                        let plain =
                            matches!(&*module, "builtins" | "__builtin__") && matches!(&*name, "set" | "frozenset");
                        if !plain {
                            return Err(Step::Refused(Refusal {
                                truncated: false,
                                message: format!(
                                    "it refers to {module}.{name}; a memory snapshot holds only dicts, lists, tuples, \
                                     sets, strings, numbers, booleans and None, and npumem loads nothing else"
                                ),
                            }));
                        }
                    }
                }
                Arg::Counted(k, signed) => {
                    let length = le(data, *pos, k, signed);
                    *pos += k;
                    if length < 0 {
                        return Err(refuse(format!("a length of {} bytes", grouped(length)), at).into());
                    }
                    if (*pos as i128) + length > n as i128 {
                        let why = format!("a length of {} bytes runs past the end of the file", grouped(length));
                        return Err(truncated(why, at).into());
                    }
                    arg = &data[*pos..*pos + length as usize];
                    *pos += length as usize;
                }
            }
            if *pos > n {
                // A fixed-size argument cut short: the fast atoms are caught by the next
                // opcode's check instead, as the unpickler would read them.
                if matches!(op, b'K' | b'M' | b'J') {
                    self.stack.push(Item::Safe);
                    continue;
                }
                if op == b'h' {
                    *pos = at + 1;
                    return Err(Step::Underflow);
                }
                if op == b'j' {
                    let idx = le(data, at + 1, 4, false);
                    let item = self.memo.get(idx as usize).cloned();
                    let item =
                        item.ok_or_else(|| refuse(format!("memo index {idx} is read before it is written"), at))?;
                    self.stack.push(item);
                    continue;
                }
                if op == 0x95 {
                    continue;
                }
                return Err(truncated("the pickle ends inside an opcode's argument", at).into());
            }
            self.apply(op, arg, at)?;
            if op == b'.' {
                return Ok(());
            }
        }
    }

    fn apply(&mut self, op: u8, arg: &[u8], at: usize) -> Scanned {
        match op {
            // Hash-safe atoms: ints of at most 4 bytes, None, bools, strings and bytes.
            b'J' | b'K' | b'M' | b'N' | 0x88 | 0x89 | b'U' | b'T' | b'X' | b'C' | b'B' | 0x8c | 0x8d | 0x8e => {
                self.stack.push(Item::Safe)
            }
            b'S' | b'V' => self.stack.push(Item::Safe),
            b'I' => self.stack.push(if arg.len() <= 16 { Item::Safe } else { Item::Other }),
            b'L' | 0x8b | b'F' | b'G' | 0x96 | b'c' | b'}' | 0x8f => self.stack.push(Item::Other),
            b'h' | b'j' | b'g' => {
                let idx = if op == b'g' { decimal(arg).ok_or(Step::Malformed)? } else { le(arg, 0, 4, false) };
                let item = usize::try_from(idx).ok().and_then(|i| self.memo.get(i)).cloned();
                let item = item.ok_or_else(|| refuse(format!("memo index {idx} is read before it is written"), at))?;
                self.stack.push(item);
            }
            b'q' | b'r' | b'p' => {
                let idx = if op == b'p' { decimal(arg).ok_or(Step::Malformed)? } else { le(arg, 0, 4, false) };
                let len = self.memo.len();
                if idx < 0 || idx > len as i128 {
                    let why = format!("memo index {idx} is written with {len} entries in the memo");
                    return Err(refuse(why, at).into());
                }
                let top = self.top()?.clone();
                if idx as usize == len {
                    self.memo.push(top);
                } else {
                    self.memo[idx as usize] = top;
                }
            }
            0x94 => {
                let top = self.top()?.clone();
                self.memo.push(top);
            }
            b'(' => self.marks.push(self.stack.len()),
            0x95 | 0x80 => {}
            b'u' | b'd' => {
                let items = self.pop_mark()?;
                if items.len() % 2 == 1 {
                    return Err(refuse("a dict's items are not key-value pairs", at).into());
                }
                hashed(items.iter().step_by(2), at)?;
                if op == b'd' {
                    self.stack.push(Item::Other);
                }
            }
            b's' => {
                let len = self.stack.len();
                if len >= 2 {
                    hashed(std::iter::once(&self.stack[len - 2]), at)?;
                }
                self.stack.truncate(len.saturating_sub(2));
            }
            b']' => {
                let list = self.new_list(true);
                self.stack.push(list);
            }
            b'l' => {
                let items = self.pop_mark()?;
                let list = self.new_list(items.iter().all(|r| matches!(r, Item::Safe)));
                self.stack.push(list);
            }
            b'e' => {
                let items = self.pop_mark()?;
                let target = self.top()?.clone();
                self.extend(&target, &items);
            }
            b'a' => {
                let item = self.pop()?;
                let target = self.top()?.clone();
                self.extend(&target, &[item]);
            }
            0x85..=0x87 => {
                let k = (op - 0x84) as usize;
                if self.stack.len() < k {
                    return Err(refuse("a tuple of more items than the stack holds", at).into());
                }
                let items = self.stack.split_off(self.stack.len() - k);
                self.stack.push(tuple(&items, at)?);
            }
            b't' => {
                let items = self.pop_mark()?;
                self.stack.push(tuple(&items, at)?);
            }
            b')' => self.stack.push(Item::Tuple(Rc::new(Tuple { depth: 1, lists: Some(Vec::new()) }))),
            0x91 | 0x90 => {
                let items = self.pop_mark()?;
                hashed(items.iter(), at)?;
                if op == 0x91 {
                    self.stack.push(Item::Other);
                }
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'R' => {
                let args = self.pop()?;
                self.pop()?;
                // set(x) / frozenset(x) hash the items of x: a tuple of hash-safe atoms or lists.
                let ok = match &args {
                    Item::Tuple(t) => t.lists.as_ref().is_some_and(|ls| ls.iter().all(|&i| self.lists[i])),
                    _ => false,
                };
                if !ok {
                    let why = "a set (a call of set or frozenset) of items that are not all hash-safe";
                    return Err(refuse(why, at).into());
                }
                self.stack.push(Item::Other);
            }
            0x93 => {
                let len = self.stack.len();
                self.stack.truncate(len.saturating_sub(2));
                self.stack.push(Item::Other);
            }
            b'0' => {
                if !self.stack.is_empty() && self.marks.last().is_none_or(|&m| m < self.stack.len()) {
                    self.stack.pop();
                } else {
                    self.marks.pop().ok_or(Step::Underflow)?;
                }
            }
            b'2' => {
                let top = self.top()?.clone();
                self.stack.push(top);
            }
            b'.' => {
                if self.stack.len() != 1 || !self.marks.is_empty() {
                    return Err(refuse("the pickle stops with a malformed stack", at).into());
                }
            }
            _ => {
                let what = refused(op).unwrap_or("an opcode a memory snapshot does not hold");
                return Err(refuse(format!("it holds {what}; a memory snapshot has none"), at).into());
            }
        }
        Ok(())
    }
}

fn hashed<'a>(mut items: impl Iterator<Item = &'a Item>, at: usize) -> Scanned {
    if items.all(|r| matches!(r, Item::Safe)) { Ok(()) } else { Err(refuse(NOT_HASH_SAFE, at).into()) }
}

fn tuple(items: &[Item], at: usize) -> Scanned<Item> {
    let mut depth = 1;
    let mut lists = Some(Vec::new());
    for r in items {
        match r {
            Item::Tuple(t) => {
                depth = depth.max(t.depth + 1);
                lists = None;
            }
            Item::List(i) => {
                if let Some(ls) = lists.as_mut() {
                    ls.push(*i);
                }
            }
            Item::Safe => {}
            Item::Other => lists = None,
        }
    }
    if depth > MAX_TUPLE_DEPTH {
        return Err(refuse(format!("a tuple nested more than {MAX_TUPLE_DEPTH} deep"), at).into());
    }
    Ok(Item::Tuple(Rc::new(Tuple { depth, lists })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_plain_data_and_refuses_what_hurts() {
        // {"a": [1, 2], "b": frozenset({1})} at protocol 4, by Python's pickle.
        assert_eq!(check(b"\x80\x04\x95\x1a\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01K\x02e\x8c\x01b\x94(K\x01\x91\x94u."), Ok(()));
        let deep = [&b"\x80\x04}K\x01"[..], &[0x85u8; 200][..], &b"K\x02s."[..]].concat();
        assert_eq!(check(&deep).unwrap_err().message, "a tuple nested more than 100 deep (at byte 105)");
        let claim = [&b"\x80\x04\x8d"[..], &(1u64 << 60).to_le_bytes()[..], &b"x."[..]].concat();
        let r = check(&claim).unwrap_err();
        assert!(r.truncated && r.message.starts_with("a length of 1,152,921,504,606,846,976 bytes"), "{r}");
        let r = check(b"\x80\x04K\x01r\xff\xff\xff\xff.").unwrap_err();
        assert_eq!(r.message, "memo index 4294967295 is written with 0 entries in the memo (at byte 4)");
        assert!(check(b"\x80\x02cos\nsystem\n.").unwrap_err().message.starts_with("it refers to os.system"));
        assert_eq!(check(&[0u8; 16]).unwrap_err().message, "byte 0x00 is not a pickle opcode (at byte 0)");
    }

    #[test]
    fn a_prefix_is_truncated_only() {
        let whole = b"\x80\x04\x95\x1a\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01K\x02e\x8c\x01b\x94(K\x01\x91\x94u.";
        for cut in 0..whole.len() {
            let r = check(&whole[..cut]).unwrap_err();
            assert!(r.truncated, "cut at {cut}: {r}");
        }
    }

    #[test]
    fn grouped_matches_python() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(-1234567), "-1,234,567");
    }
}
