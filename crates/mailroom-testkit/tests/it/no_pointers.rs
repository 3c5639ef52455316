//! The repository is its own reference: no tracked file points at a
//! contract kept outside it (its section numbers, its file, the folder
//! beside the checkout) or at tracker issue numbers. Code comments say
//! what a rule is; user-facing text points at the book in `docs/`.
//!
//! The patterns are assembled from pieces, so this file never matches
//! itself.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root: two levels above this crate.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file git tracks, relative to the root.
fn tracked(root: &Path) -> Vec<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output()
        .expect("git runs (the check needs the repository's file list)");
    assert!(
        out.status.success(),
        "git ls-files failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Why `line` points outside the repository, if it does.
fn pointer(line: &str) -> Option<&'static str> {
    const SECTION: &str = concat!("SP", "EC ", "\u{a7}");
    const FILE: &str = concat!("SP", "EC.md");
    const SHARED: &str = concat!("..", "/shared");
    const WORK_SHARED: &str = concat!("/work", "/shared");
    if line.contains(SECTION) {
        return Some("a section number of the contract kept outside the repository");
    }
    if line.contains(FILE) || line.contains(SHARED) || line.contains(WORK_SHARED) {
        return Some("a file outside the repository");
    }
    if issue_number(line) {
        return Some("a tracker issue number");
    }
    None
}

/// Whether `line` holds the word "issue" followed by a number (after a
/// space or a `#`), in any case.
fn issue_number(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    lower.match_indices(concat!("iss", "ue")).any(|(at, word)| {
        let rest = lower[at + word.len()..].trim_start_matches([' ', '#']);
        let spaced = rest.len() < lower.len() - at - word.len();
        spaced && rest.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// No tracked file cites the outside contract, its section numbers or
/// tracker issues; a failure names every file:line that does.
#[test]
fn no_tracked_file_points_outside_the_repository() {
    let root = root();
    let files = tracked(&root);
    assert!(
        files.iter().any(|f| f == "Cargo.toml"),
        "git ls-files listed the workspace"
    );
    let mut found = Vec::new();
    for file in &files {
        let Ok(bytes) = std::fs::read(root.join(file)) else {
            continue; // deleted in the work tree, not yet committed
        };
        let text = String::from_utf8_lossy(&bytes);
        for (n, line) in text.lines().enumerate() {
            if let Some(why) = pointer(line) {
                found.push(format!("{file}:{}: {why}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "{} line(s) point outside the repository; say what the rule is, or \
         point at the book in docs/:\n{}",
        found.len(),
        found.join("\n")
    );
}

/// The patterns catch what they are meant to and leave alone what only
/// looks alike (RFC sections, upstream issue links, `issues` in prose).
#[test]
fn the_patterns_match_pointers_and_nothing_else() {
    let section = format!("see {}EC \u{a7}6", "SP");
    let file = format!("the contract is {}/shared/{}EC.md", "..", "SP");
    assert!(pointer(&section).is_some());
    assert!(pointer(&file).is_some());
    assert!(pointer(&format!("{}ue 13's benchmark", "Iss")).is_some());
    assert!(pointer(&format!("({}ue #14)", "iss")).is_some());
    for fine in [
        "RFC 3986 \u{a7}3.1: the scheme",
        "its open issue amqp-rs/lapin#450",
        "login issues a fresh id",
        "no issue here, 13 events",
        "Ipv6Addr::UNSPECIFIED",
    ] {
        assert_eq!(pointer(fine), None, "{fine}");
    }
}
