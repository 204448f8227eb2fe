//! Replays fuzz inputs through a harness on stable Rust, one line per input (`ok`, or the
//! panic message), to triage what `make fuzz` found:
//! `cargo run -p npumem-fuzz --example replay -- <target> <file or directory>...`.
//! Exits 1 when any input fails.

use std::path::PathBuf;
use std::sync::Mutex;

/// The last panic's location and message (the hook's record; catch_unwind gives only the payload).
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

fn main() {
    let mut args = std::env::args().skip(1);
    let names: Vec<&str> = npumem_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
    let Some(target) = args.next() else {
        eprintln!("usage: replay <target> <file or directory>...; targets: {}", names.join(", "));
        std::process::exit(2);
    };
    let Some(&(_, harness)) = npumem_fuzz::TARGETS.iter().find(|(n, _)| *n == target) else {
        eprintln!("unknown target {target:?}; targets: {}", names.join(", "));
        std::process::exit(2);
    };
    let mut files: Vec<PathBuf> = Vec::new();
    for arg in args {
        let path = PathBuf::from(arg);
        match std::fs::read_dir(&path) {
            Ok(entries) => files.extend(entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file())),
            Err(_) => files.push(path),
        }
    }
    files.sort();
    std::panic::set_hook(Box::new(|info| {
        let at = info.location().map_or(String::new(), |l| format!("{}:{}: ", l.file(), l.line()));
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("(a panic without a message)");
        *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = format!("{at}{message}");
    }));
    let mut failed = 0;
    for path in &files {
        let data = match std::fs::read(path) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("{}: {e}", path.display());
                std::process::exit(2);
            }
        };
        match std::panic::catch_unwind(|| harness(&data)) {
            Ok(()) => println!("{}: ok", path.display()),
            Err(_) => {
                failed += 1;
                println!("{}: FAILED: {}", path.display(), LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()));
            }
        }
    }
    if failed > 0 {
        std::process::exit(1);
    }
}
