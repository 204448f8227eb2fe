//! The layering rules of `lib.rs` hold inside the crate: each module names, through `crate::`,
//! only the modules its rule allows.
//!
//! Rules:
//! - the crates below this one (npumem-base, -plan, -hostpool, -tlb) cannot name it at all:
//!   Cargo refuses the cycle. This test holds the arrows between the modules of this crate,
//!   which the compiler does not;
//! - `ALLOWED` is the table of `lib.rs` and of docs/architecture.md ("Modules of npumem-core");
//!   a change to one changes all three;
//! - a module names another by `crate::` (or a crate-root re-export such as `crate::Device`),
//!   never by a `super::` chain out of its own tree; lines that are comments do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the modules it may use (`error` and `units` are npumem-base's,
/// re-exported at the crate root; `plan` and `hostpool`, which no module may use, are absent).
const ALLOWED: &[(&str, &[&str])] = &[
    ("prefetch", &[]),
    ("snapshot_pickle", &[]),
    ("acl", &["error"]),
    ("stream", &["error"]),
    ("kernels", &["error"]),
    ("vm", &["error", "units"]),
    ("policy", &["error", "acl", "units", "vm"]),
    ("sanitizer", &["error", "stream"]),
    ("backend", &["error", "acl", "stream", "units", "vm"]),
    ("host", &["error", "backend", "units"]),
    ("pool", &["error", "acl", "backend", "policy", "prefetch", "units", "vm"]),
    (
        "device",
        &["error", "acl", "backend", "host", "policy", "pool", "prefetch", "sanitizer", "stream", "units", "vm"],
    ),
];

/// The module behind each name the crate root re-exports (`crate::Device` is `device`'s).
fn module_of(root_name: &str) -> &str {
    match root_name {
        "AclError" | "ErrorCode" | "Result" => "error",
        "MemAttr" | "MemcpyKind" | "Policy" => "acl",
        "Allocation" | "AllocatorKind" | "BackendKind" | "Device" | "DeviceConfig" | "DeviceStats" | "ReusePolicy" => {
            "device"
        }
        other => other,
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The first segment of every path after `crate::` in `code`, including each item of a
/// `crate::{a, b::c}` group.
fn crate_names(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut item_start) = (0usize, true);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        names.push(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            names.push(ident(rest));
        }
    }
    names
}

#[test]
fn every_module_uses_only_what_its_layering_rule_allows() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: BTreeMap<&str, BTreeSet<&str>> =
        ALLOWED.iter().map(|(m, deps)| (*m, deps.iter().copied().collect())).collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules_seen = BTreeSet::new();
    let mut broken = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let top = relative.components().next().unwrap().as_os_str().to_str().unwrap();
        let top = top.strip_suffix(".rs").unwrap_or(top);
        if top == "lib" {
            continue;
        }
        let rule = allowed.get(top).unwrap_or_else(|| panic!("module `{top}` has no layering rule in ALLOWED"));
        modules_seen.insert(top.to_string());
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for name in crate_names(line) {
                let used = module_of(&name);
                if used != top && !rule.contains(used) {
                    broken.push(format!("{}:{}: `{top}` uses `{used}`", relative.display(), n + 1));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "arrows the layering rules forbid (remove them, or change the rule here, in lib.rs and in \
         docs/architecture.md together):\n{}",
        broken.join("\n")
    );
    let ruled: BTreeSet<String> = allowed.keys().map(|m| m.to_string()).collect();
    assert_eq!(modules_seen, ruled, "ALLOWED names exactly the crate's modules");
}

#[test]
fn the_path_reader_sees_groups_and_nested_groups() {
    assert_eq!(crate_names("use crate::vm::PageSize;"), ["vm"]);
    assert_eq!(crate_names("use crate::{acl::Policy, units::{KIB, MIB}, Device};"), ["acl", "units", "Device"]);
    assert_eq!(crate_names("$crate::error::AclError::internal(x)"), ["error"]);
    assert!(crate_names("use super::Plan;").is_empty());
}
