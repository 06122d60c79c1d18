//! The engine model (placeholder until the mock-engine model lands).
