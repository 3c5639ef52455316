//! The test kit's own tests, in one test binary: the servers
//! `./scripts/test.sh` provides, the private servers a test may stop, and
//! the repository's rule against pointers outside it.

mod no_pointers;
mod private_pg;
mod private_rabbit;
mod servers;
