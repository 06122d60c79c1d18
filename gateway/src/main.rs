//! The `prefixgate` binary.

fn main() {}
