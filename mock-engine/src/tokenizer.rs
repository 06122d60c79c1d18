//! The mock's deterministic tokenizer (placeholder until the mock-engine model lands).
