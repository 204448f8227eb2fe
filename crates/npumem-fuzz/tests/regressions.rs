//! Replays every input kept under `fuzz/regressions/<target>/` (crashes found and fixed, and a
//! small coverage-rich corpus) through the same harness the cargo-fuzz target runs, on stable
//! Rust, as part of `make test`. A failing harness check fails the test and names the file.

use std::path::{Path, PathBuf};

fn regressions() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions")
}

fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = regressions().join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(target: &str) {
    let harness = npumem_fuzz::TARGETS.iter().find(|(name, _)| *name == target).expect("a target").1;
    let files = inputs(target);
    assert!(!files.is_empty(), "no regression inputs kept for {target}");
    let failed: Vec<String> = files
        .iter()
        .filter(|path| {
            let data = std::fs::read(path).expect("readable input");
            std::panic::catch_unwind(|| harness(&data)).is_err()
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(failed.is_empty(), "{target}: {} of {} inputs fail: {failed:#?}", failed.len(), files.len());
}

macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { replay(stringify!($name)); })*

        #[test]
        fn every_target_and_directory_is_replayed() {
            let tested = [$(stringify!($name)),*];
            let targets: Vec<&str> = npumem_fuzz::TARGETS.iter().map(|(name, _)| *name).collect();
            assert_eq!(targets, tested, "a target without a replay test");
            for entry in std::fs::read_dir(regressions()).expect("fuzz/regressions") {
                let name = entry.expect("directory entry").file_name().into_string().expect("a UTF-8 name");
                // A directory named for a Python target (`fuzz/NAME.py`, atheris) is that
                // target's; tests/test_fuzz_readers.py replays it.
                let python_target = regressions().parent().expect("fuzz/").join(format!("{name}.py")).is_file();
                assert!(tested.contains(&name.as_str()) || python_target, "fuzz/regressions/{name} belongs to no target");
            }
        }
    };
}

targets!(device_actions, page_table, alloc_conf, plan_problem, plan_graph, tlb_config);
