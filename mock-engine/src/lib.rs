//! mock-engine: a faithful, clocked stand-in for a vLLM replica.
