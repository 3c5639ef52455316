//! mailroom-conformance (under construction)
