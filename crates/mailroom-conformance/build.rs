//! Generates the list of conformance tests `suite!` expands to: every
//! `pub async fn` of the `tests` module (`src/tests.rs` and the files under
//! `src/tests/`), so a test cannot be written and left out of the suite.

#[path = "src/scan.rs"]
mod scan;

use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn Error>> {
    let src = Path::new("src");
    println!("cargo::rerun-if-changed=src/tests.rs");
    println!("cargo::rerun-if-changed=src/tests");
    println!("cargo::rerun-if-changed=src/scan.rs");

    let mut files = vec![src.join("tests.rs")];
    rust_files(&src.join("tests"), &mut files)?;
    let mut names = Vec::new();
    for file in &files {
        names.extend(scan::public_async_fns(&std::fs::read_to_string(file)?));
    }
    if names.is_empty() {
        return Err(format!("no `pub async fn` conformance test found in {files:?}").into());
    }

    let mut list = String::new();
    for name in &names {
        writeln!(list, "            {name},")?;
    }
    let generated = format!(
        "/// Expands `suite!` for a factory: one `#[test]` per conformance test,\n\
         /// listed by the build script from the `tests` module.\n\
         #[doc(hidden)]\n\
         #[macro_export]\n\
         macro_rules! __conformance_tests {{\n    \
             ($factory:expr) => {{\n        \
                 $crate::suite!(@tests $factory;\n{list}        );\n    \
             }};\n\
         }}\n"
    );
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("conformance_tests.rs");
    std::fs::write(out, generated)?;
    Ok(())
}

/// Every `.rs` file under `dir`, recursively, in a stable order.
fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), Box<dyn Error>> {
    if !dir.is_dir() {
        return Ok(());
    }
    let mut entries = std::fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, files)?;
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    Ok(())
}
