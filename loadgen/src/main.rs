//! The `loadgen` binary.

fn main() {}
