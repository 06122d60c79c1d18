//! The engine's HTTP server (placeholder until the mock-engine server lands).
