//! The `mock-engine` binary: one or more simulated vLLM replicas on loopback.

fn main() {}
