//! What the benchmarks share with the fault matrix (`mailroom-faults`):
//! the store a run works on (`--store sqlite|postgres://...`, a fresh
//! database per run) and readers of `/proc`.

pub mod backend;
pub mod procfs;
